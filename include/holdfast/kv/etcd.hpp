// holdfast/kv/etcd.hpp — a kv_store on etcd v3, through its JSON gateway (etcd 3.4+).
//
// Each operation is one HTTP POST to one of the configured endpoints (detail/http.hpp); keys
// and values travel base64-encoded in JSON, as the gateway requires. A job's keys live under
// `<prefix>/<run id>/<incarnation>/` in etcd.
//
// Security: `basic_etcd_kv<Io, Transport>` makes every connection through its Transport
// (detail/http.hpp's seam; plain_transport<Io> by default). With a TLS transport (such as
// examples/tls/openssl_transport.hpp) the endpoints are https:// and `etcd_options::tls` names
// the CA, the client certificate and key and the server name; with `user` and a password file or
// environment variable the client authenticates (/v3/auth/authenticate) and sends the token on
// every request and watch.
//
// Guarantees:
//   - insert is one txn comparing the key's create_revision with 0: exactly one of any number of
//     concurrent inserters (threads, processes, hosts) gets true.
//   - get is a range, then a watch starting at the range's revision + 1: no polling, and no put
//     between the two is missed. A watch lasts at most `request_timeout`; then get ranges again
//     (which checks the endpoint's health) and watches on from the new revision, so a get whose
//     member freezes under it moves to another within about 2 x request_timeout. It returns
//     std::nullopt at its deadline.
//   - watch(prefix) (kv.hpp, "Waiting on a store"; the handler keeps one for its life): a
//     range of the keys below `prefix + "/"` learns revision R and what they hold, then ONE
//     streaming /v3/watch from R + 1 on a connection of its own serves the watch for its whole
//     life. take() reads what arrived without blocking and returns each put (its value) and erase
//     (nullopt) below the prefix, in revision order, exactly once (events at or below the last
//     delivered revision are dropped); the first take() is complete: it starts with the range's
//     snapshot, so the caller knows every key without a read.
//   - Resume: when the stream ends or breaks (server restart, reset, etcd's "unavailable"), its
//     endpoint becomes suspect and the watch reopens from the last delivered revision + 1 on
//     the endpoint failover picks (the same one when it is the only one): nothing is lost or
//     repeated. One attempt per take(); while disconnected fd() is -1 and due() is the next
//     attempt: at once while endpoints remain untried, then 50 ms doubling up to the probe
//     interval. A resume older than etcd's last compaction is cancelled with compact_revision:
//     the watch ranges again, reopens, and its take() is complete again (a new snapshot).
//   - Health probe: a frozen member keeps a watch open and silent. So after every probe
//     interval, max(1 s, request_timeout / 2, 1.5 x the lease keep-alive period), in which the
//     stream's endpoint answered nothing (a message on the stream, or any request of this client
//     to that endpoint — a lease keep-alive included — postpones it), take() sends one
//     linearizable count-only range of a single key to that endpoint on a pooled keep-alive
//     connection, within request_timeout; it also fails on a member cut off from its quorum. A
//     failed probe marks the endpoint suspect and moves the watch (resuming), so a watch on a
//     frozen member delivers again within about 2 probe intervals + request_timeout. An idle
//     watch costs one probe per interval and nothing else; with a lease, the keep-alives (one
//     per TTL / 3, on the endpoint that last answered: the watch's) are the probes, and it costs
//     nothing more.
//   - stats(): requests sent (unary calls, authentication, keep-alives, watch opens and
//     probes), connections made, watch opens and probes, counted with relaxed atomics shared
//     by every handle on the client.
//   - Failover: a request goes to the first endpoint that is not suspect, going round from the
//     last one that answered. An endpoint becomes suspect for `suspect_for` when connecting to it
//     fails, a request to it times out, loses its connection (reset, or closed before the reply
//     was complete) or gets etcd's "unavailable" answer; it is healthy again once it answers.
//     Suspects are tried only when every endpoint is suspect. Within one call each endpoint is
//     tried at most once, and a failed request moves on to the next endpoint:
//       * for every request when nothing was sent (connecting, or the TLS handshake, failed);
//       * for reads (try_get, list, get's ranges and watches, lease keep-alives) also after a
//         timeout, a lost connection or an "unavailable" answer;
//       * never for writes that were sent (put, insert, erase, erase_prefix, lease grant and
//         revoke): their outcome is unknown, so they throw that transient error at once and the
//         caller's retry goes to another endpoint.
//     Connecting (with a TLS handshake) is bounded by `connect_timeout`, a request by
//     `request_timeout`. The suspect marks are shared by every handle on the client and updated
//     lock-free.
//   - Every failure throws holdfast::error naming the operation and the key, with the
//     endpoint's own error inside: ECONNREFUSED/ETIMEDOUT/ECONNRESET/... when no endpoint answered
//     in time (a connection closed before the reply is ECONNRESET), EAGAIN for etcd's
//     "unavailable" answers (gRPC code 14: leader changed, no leader, request timed out, server
//     stopped, transport closing), ETIMEDOUT for its deadline-exceeded ones, EPROTO for a
//     malformed HTTP or JSON reply, EIO for any other error etcd reported. is_transient_kv_error
//     is true for the first three kinds.
//   - With `lease_ttl` > 0, the store grants a lease, attaches it to every key it writes and
//     keeps it alive from one background thread (a keep-alive every ttl/3). When the process
//     dies the keep-alives stop and etcd deletes its keys after the TTL. The thread is stopped
//     and joined when the last handle is destroyed, within ~20 ms even with a keep-alive in
//     flight to a hung server (the request is cancelled).
//   - Copies (and with_namespace views) are cheap handles sharing endpoints and lease; every
//     operation is safe to call from several threads at once.
//   - Connections are reused (HTTP/1.1 keep-alive): up to `idle_connections` idle ones per
//     client, so a TLS handshake is paid per connection, not per request. A suspect endpoint's
//     idle connections are closed; a get's watch, and each watch object, has a connection of
//     its own.
//   - Authentication: the token is fetched on first use and shared by the client's threads; an
//     "invalid auth token" answer (gRPC code 16: the token expired, see etcd's
//     --auth-token-ttl) makes the client authenticate again and retry the request once, as does
//     a watch the server cancels for that reason. Neither the password nor the token appears in
//     an error message. A wrong password or user is EACCES.
// Caveats:
//   - Without a TLS transport the traffic, and a password, cross the network in clear text: use
//     https:// endpoints on any network that is not trusted.
//   - etcd's gateway cannot authenticate a user by client-certificate name: with --client-cert-auth
//     and auth enabled it ignores the certificate's CommonName ("CommonName of client sending a
//     request against gateway will be ignored"). Client certificates authenticate the host to
//     the TLS layer; authenticate the user with a password.
//   - A write that failed with a transient error may have been applied (a frozen member may even
//     apply it when it resumes): read the key before retrying. An insert retried after its
//     first attempt was applied returns false; values that name their writer tell the two apart.
//   - get's own timeout bounds the wait for the key, not a request: against hung servers its
//     range fails with ETIMEDOUT after request_timeout per endpoint, even when the get's timeout
//     is shorter. While it waits, a get makes one range and one watch per request_timeout.
//   - A watch's take() may block on its own network work: a probe up to request_timeout, a
//     reconnection up to connect_timeout + request_timeout (after a compaction, plus a range
//     that fails over like list()). A watch cancelled for another reason (permission denied)
//     makes take() throw; the watch retries later.
//   - After a compaction past a disconnected watch's revision, the changes in between are not
//     replayed: take() reports a complete snapshot instead (what the keys hold now).
//   - The snapshot lists every key below the prefix: watch prefixes that stay small (the
//     handler's control keys: one round's, the rest are erased).
//   - Suspect marks belong to one client (one etcd_kv and its copies), not to the process.
//   - The lease is not revoked on destruction (other workers may still need the keys); call
//     revoke_lease() to delete this client's keys at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>    // getenv: etcd_options::password_env
#include <exception>  // exception_ptr: a watch reports a stream failure after its events
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../detail/base64.hpp"
#include "../detail/http.hpp"
#include "../detail/json.hpp"
#include "../kv.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// How to reach etcd.
struct etcd_options {
  /// Client URLs, `http://host:port` or (with a TLS transport) `https://host:port`, all of one
  /// scheme; failover goes round them in order (see the header).
  std::vector<std::string> endpoints{"http://127.0.0.1:2379"};
  /// Time allowed to connect to one endpoint.
  std::chrono::milliseconds connect_timeout{1000};
  /// Time allowed for one request after connecting, and the longest a get's watch stays open
  /// before get ranges again; a quiet watch() is probed every max(1 s, request_timeout / 2).
  std::chrono::milliseconds request_timeout{5000};
  /// How long an endpoint that failed to connect, timed out, lost its connection or answered
  /// "unavailable" is skipped while others are not suspect; 0 never skips one.
  std::chrono::milliseconds suspect_for{10000};
  /// The longest watch message (one JSON line of the stream) accepted; a longer one is an
  /// EMSGSIZE error naming the endpoint.
  std::size_t max_message = std::size_t{64} << 20;
  /// Lease time-to-live; 0 means no lease (keys stay until erased).
  std::chrono::seconds lease_ttl{0};
  /// The first segment of every key holdfast writes in etcd.
  std::string prefix = "holdfast";
  /// For https:// endpoints: CA file, client certificate and key, server name (read by the
  /// TLS transport; setting any of them with http:// endpoints is refused).
  tls_options tls;
  /// The etcd user to authenticate as; empty: no authentication.
  std::string user;
  /// A file holding the user's password (one line; a final newline is dropped)...
  std::string password_file;
  /// ...or the name of an environment variable holding it. Exactly one of the two with a user.
  std::string password_env;
  /// Idle connections kept for reuse by one client (all endpoints together); 0: one
  /// connection per request.
  std::size_t idle_connections = 4;
};

/// Counters of one etcd client, shared by every handle on it (copies, with_namespace views) and
/// by its watches; relaxed atomics, read together by etcd_kv::stats().
struct etcd_stats {
  /// HTTP requests sent: every unary call (a resend on a stale keep-alive connection,
  /// authentication and lease keep-alives included), every watch opened, every probe.
  std::uint64_t requests = 0;
  /// Connections made (TCP, with a TLS handshake for https://): pooled ones and watch streams.
  std::uint64_t connections = 0;
  /// Watch streams opened: a get's windows, a watch object's first open and its resumes.
  std::uint64_t watch_opens = 0;
  /// Health probes sent by watch objects (counted in `requests` too).
  std::uint64_t probes = 0;
  /// Response body bytes received: unary answers, watch streams (the HTTP heads aside).
  std::uint64_t bytes_read = 0;
};

namespace detail {

/// Cuts the complete lines (LF-terminated) off the front of `pending` and passes each one that
/// is not blank to `on_line(const std::string&) -> bool` until it returns false; returns false
/// then (the lines after it stay in `pending`), true otherwise.
template <class OnLine>
bool etcd_take_lines(std::string& pending, OnLine&& on_line) {
  for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
    const std::string line = pending.substr(0, nl);
    pending.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") != std::string::npos && !on_line(line)) return false;
  }
  return true;
}

/// The etcd range_end that covers every key starting with `prefix`: the prefix with its last
/// byte below 0xff incremented and what follows dropped; "\0" (everything) for an all-0xff one.
inline std::string etcd_prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto last = static_cast<unsigned char>(prefix.back());
    if (last < 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

/// An int64 the gateway sends as a JSON string ("42") or a number; `fallback` when absent.
inline std::int64_t etcd_int(const json_value* v, std::int64_t fallback = 0) {
  if (!v) return fallback;
  if (v->is_number()) return v->as_int64();
  const std::string& s = v->as_string();
  std::int64_t out = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size())
    throw error(EPROTO, "etcd", "", "expected an integer, got '" + s + "'");
  return out;
}

/// The errno for a gateway error with gRPC status `code` and message `text`: EAGAIN for 14
/// (unavailable), ETIMEDOUT for 4 (deadline exceeded) and for etcd's own request deadline
/// (code 2, "context deadline exceeded"), EACCES for 16 (unauthenticated) and 7 (permission
/// denied) and for a failed authentication, EIO for the rest.
inline int etcd_errno(std::int64_t code, const std::string& text) noexcept {
  if (code == 14) return EAGAIN;
  if (code == 4 || (code == 2 && text == "context deadline exceeded")) return ETIMEDOUT;
  if (code == 16 || code == 7 || text.find("authentication failed") != std::string::npos)
    return EACCES;
  return EIO;
}

/// etcd refused the request's token (gRPC code 16, "invalid auth token": expired or unknown), or
/// the request carried none while authentication is on: the client authenticates again and
/// retries once.
class etcd_unauthenticated : public error {
 public:
  using error::error;
};

/// True for an answer that a fresh token may cure: "invalid auth token" (code 16) and "user name
/// is empty" (code 3: no token, as when authentication was enabled after the client started).
inline bool etcd_token_problem(std::int64_t code, const std::string& text) noexcept {
  return code == 16 || text.find("invalid auth token") != std::string::npos ||
         text.find("user name is empty") != std::string::npos;
}

/// Whether a request may go to another endpoint after it was sent: reads may, writes (whose
/// outcome is then unknown) may not.
enum class etcd_request { read, write };

/// The connection to an etcd cluster, shared by every handle: endpoints, failover, connections,
/// the token, the lease.
template <class Io, class Transport = plain_transport<Io>>
class etcd_client {
  static_assert(check_transport<Transport>());

 public:
  /// Parses the endpoints, checks the TLS and authentication options, reads the password and,
  /// with a lease TTL, grants the lease and starts the keep-alives.
  explicit etcd_client(etcd_options opts)
      : opts_(checked(std::move(opts))),
        endpoints_(parse_endpoints(opts_)),
        password_(read_password(opts_)),
        pool_(Transport(opts_.tls), opts_.idle_connections) {
    suspect_until_ = std::make_unique<std::atomic<clock::rep>[]>(endpoints_.size());
    answered_at_ = std::make_unique<std::atomic<clock::rep>[]>(endpoints_.size());
    for (std::size_t k = 0; k < endpoints_.size(); ++k) {
      suspect_until_[k].store(0);
      answered_at_[k].store(0);
    }
    if (opts_.lease_ttl.count() > 0) start_lease();
  }
  etcd_client(const etcd_client&) = delete;
  etcd_client& operator=(const etcd_client&) = delete;
  ~etcd_client() { stop_keepalive(); }

  /// The options it was made with.
  const etcd_options& options() const noexcept { return opts_; }
  /// The lease attached to writes, or 0.
  std::int64_t lease_id() const noexcept { return lease_id_.load(); }
  /// False once the lease expired or was revoked.
  bool lease_alive() const noexcept { return lease_alive_.load(); }

  /// POSTs `body` to `target` and returns the parsed JSON reply, failing over as `kind` allows;
  /// `op` and `key` name the operation in errors.
  json_value call(etcd_request kind, const char* target, const std::string& body,
                  const std::string& op, const std::string& key,
                  const std::atomic<bool>* cancel = nullptr) const {
    json_value out;
    with_endpoint(kind, op, key, [&](const http_endpoint& ep) {
      authorized(ep, op, key, cancel, [&](http_headers headers) {
        const http_request req{"POST", target, std::move(headers), body};
        http_response resp = pool_.call(ep, req, timeouts(), cancel);
        bytes_read_.fetch_add(resp.body.size(), std::memory_order_relaxed);
        out = reply(resp.status, resp.body, ep.url() + target, op, key);
      });
    });
    return out;
  }

  /// Streams the response to `body` at `target` into `on_line` (one JSON message per call)
  /// until `on_line` returns false, the stream ends, or `deadline`; fails over as a read.
  template <class OnLine>
  void stream(const char* target, const std::string& body, const std::string& op,
              const std::string& key, std::chrono::steady_clock::time_point deadline,
              OnLine on_line) const {
    with_endpoint(etcd_request::read, op, key, [&](const http_endpoint& ep) {
      authorized(ep, op, key, nullptr, [&](http_headers headers) {
        const http_request req{"POST", target, std::move(headers), body};
        const std::string url = ep.url() + target;
        std::string pending;
        bool go = true;
        auto emit = [&](std::size_t end) {
          std::string line = pending.substr(0, end);
          pending.erase(0, end == std::string::npos ? end : end + 1);
          if (line.find_first_not_of(" \r\t") != std::string::npos)
            go = on_line(reply(200, line, url, op, key));
        };
        auto on_data = [&](std::string_view bytes) {
          bytes_read_.fetch_add(bytes.size(), std::memory_order_relaxed);
          pending.append(bytes.data(), bytes.size());
          for (std::size_t nl; go && (nl = pending.find('\n')) != std::string::npos;) emit(nl);
          if (pending.size() > opts_.max_message)  // a watch message may not grow unbounded
            throw error(EMSGSIZE, op, key,
                        "a watch message from " + url + " is longer than " +
                            std::to_string(opts_.max_message) + " bytes");
          return go;
        };
        watch_opens_.fetch_add(1, std::memory_order_relaxed);
        pool_.stream(ep, req, timeouts(), deadline, on_data);
        if (go) emit(std::string::npos);
      });
    });
  }

  /// Counters of requests, connections, watch opens and probes (see etcd_stats).
  etcd_stats stats() const noexcept {
    etcd_stats s;
    s.requests = pool_.requests();
    s.connections = pool_.connections();
    s.watch_opens = watch_opens_.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    s.probes = probes_.load(std::memory_order_relaxed);
    return s;
  }

  /// The number of endpoints.
  std::size_t endpoint_count() const noexcept { return endpoints_.size(); }
  /// Endpoint `k`'s URL.
  std::string endpoint_url(std::size_t k) const { return endpoints_.at(k).url(); }
  /// The endpoint a new request goes to first: round from the last one that answered, those
  /// not suspect first.
  std::size_t preferred_endpoint() const { return try_order().front(); }
  /// When endpoint `k` last answered a request of this client (any kind: keep-alives too).
  std::chrono::steady_clock::time_point last_answer(std::size_t k) const noexcept {
    using c = std::chrono::steady_clock;
    return c::time_point(c::duration(answered_at_[k].load(std::memory_order_relaxed)));
  }
  /// The lease keep-alive period (TTL / 3), or zero without a lease.
  std::chrono::milliseconds keepalive_period() const noexcept {
    if (opts_.lease_ttl.count() <= 0) return std::chrono::milliseconds(0);
    return std::max<std::chrono::milliseconds>(std::chrono::milliseconds(100),
                                               std::chrono::milliseconds(opts_.lease_ttl) / 3);
  }
  /// Marks endpoint `k` suspect (a watch lost its stream there) and closes its idle connections.
  void suspect(std::size_t k) const { mark_suspect(k); }
  /// True when `e` means the endpoint may be down or busy (another one may do better).
  static bool transient(const error& e) { return transient_errno(e) != 0; }

  /// POSTs `body` to `target` on endpoint `k` only, as a read (no failover): the parsed reply.
  /// A transient failure marks `k` suspect; an answer marks it good. With `probe`, counted as a
  /// watch's health probe.
  json_value call_at(std::size_t k, const char* target, const std::string& body,
                     const std::string& op, const std::string& key, bool probe = false) const {
    json_value out;
    at_endpoint(k, op, key, [&](const http_endpoint& ep) {
      authorized(ep, op, key, nullptr, [&](http_headers headers) {
        const http_request req{"POST", target, std::move(headers), body};
        if (probe) probes_.fetch_add(1, std::memory_order_relaxed);
        http_response resp = pool_.call(ep, req, timeouts(), nullptr);
        bytes_read_.fetch_add(resp.body.size(), std::memory_order_relaxed);
        out = reply(resp.status, resp.body, ep.url() + target, op, key);
      });
    });
    return out;
  }

  /// Opens a streaming request (a watch) on endpoint `k` only, on a connection of its own, and
  /// reads until its first message arrived (all within request_timeout): each complete message
  /// received goes to `on_message(const json_value&) -> bool` (false: stop reading), the rest
  /// stays in `pending`. Failures mark `k` as call_at does; an etcd error message throws.
  template <class OnMessage>
  http_open_stream<Io, Transport> open_stream_at(std::size_t k, const char* target,
                                                 const std::string& body, const std::string& op,
                                                 const std::string& key, std::string& pending,
                                                 OnMessage&& on_message) const {
    http_open_stream<Io, Transport> out;
    at_endpoint(k, op, key, [&](const http_endpoint& ep) {
      authorized(ep, op, key, nullptr, [&](http_headers headers) {
        const http_request req{"POST", target, std::move(headers), body};
        const std::string url = ep.url() + target;
        const auto deadline = clock::now() + opts_.request_timeout;
        pending.clear();
        watch_opens_.fetch_add(1, std::memory_order_relaxed);
        auto s = pool_.open_stream(ep, req, timeouts());
        bool got = false, go = true;
        auto on_line = [&](const std::string& line) {
          got = true;
          return go = on_message(stream_message(line, url, op, key));
        };
        while (!got) {
          const auto st = s.read(
              [&](std::string_view b) { append_message(pending, b, url, op, key); }, deadline);
          etcd_take_lines(pending, on_line);
          if (got) break;
          if (st == http_open_stream<Io, Transport>::status::ended)
            throw http_connection_closed(EPROTO, "http", url,
                                         "the watch stream ended before its first message");
          if (clock::now() >= deadline)
            throw error(
                ETIMEDOUT, "recv", url,
                "no watch message within " + std::to_string(opts_.request_timeout.count()) + " ms");
        }
        if (!go) pending.clear();
        out = std::move(s);
      });
    });
    return out;
  }

  /// Appends `bytes` of a stream to `pending`; EMSGSIZE when an unfinished message grows past
  /// max_message.
  void append_message(std::string& pending, std::string_view bytes, const std::string& url,
                      const std::string& op, const std::string& key) const {
    bytes_read_.fetch_add(bytes.size(), std::memory_order_relaxed);
    pending.append(bytes.data(), bytes.size());
    if (pending.size() > opts_.max_message && pending.find('\n') == std::string::npos)
      throw error(EMSGSIZE, op, key,
                  "a watch message from " + url + " is longer than " +
                      std::to_string(opts_.max_message) + " bytes");
  }

  /// Parses one message of a stream from `url`, throwing etcd's error when it is one (an
  /// etcd_unauthenticated for a token problem).
  static json_value stream_message(const std::string& line, const std::string& url,
                                   const std::string& op, const std::string& key) {
    return reply(200, line, url, op, key);
  }

  /// Drops the current token (a watch was cancelled for it): the next request authenticates.
  void forget_token() const {
    std::lock_guard<std::mutex> lock(auth_mutex_);
    if (token_ && !token_->empty()) token_.reset();
  }

  /// How many tokens the client fetched so far (for tests and diagnostics).
  std::size_t authentications() const noexcept { return authentications_.load(); }

  /// Idle pooled connections (to endpoint `k` when given), for tests.
  std::size_t idle_connections(std::optional<std::size_t> k = std::nullopt) const {
    return k ? pool_.idle(&endpoints_.at(*k)) : pool_.idle();
  }

  /// Revokes the lease now (etcd deletes every key attached to it) and stops the keep-alives;
  /// later writes carry no lease. Does nothing without a lease or when already revoked.
  void revoke_lease() {
    const std::int64_t id = lease_id_.load();
    if (id == 0) return;
    stop_keepalive();
    call(etcd_request::write, "/v3/lease/revoke", "{\"ID\":\"" + std::to_string(id) + "\"}",
         "etcd lease revoke", "");
    lease_alive_ = false;
    lease_id_ = 0;
  }

 private:
  using clock = std::chrono::steady_clock;

  http_timeouts timeouts() const {
    return http_timeouts{opts_.connect_timeout, opts_.request_timeout};
  }

  // Nothing was sent: connecting, or the TLS handshake, failed.
  static bool is_connection_failure(const error& e) {
    const std::string& op = e.operation();
    return op == "connect" || op == "resolve" || op == "socket" || op == "tls handshake";
  }

  static etcd_options checked(etcd_options o) {
    if (o.endpoints.empty()) throw error(EINVAL, "etcd connect", "", "no endpoints configured");
    if (!o.user.empty() && o.password_file.empty() == o.password_env.empty())
      throw error(EINVAL, "etcd auth", o.user,
                  "a user needs exactly one of password_file and password_env");
    if (o.user.empty() && (!o.password_file.empty() || !o.password_env.empty()))
      throw error(EINVAL, "etcd auth", "", "a password source without a user");
    return o;
  }

  static std::vector<http_endpoint> parse_endpoints(const etcd_options& o) {
    std::vector<http_endpoint> out;
    for (const auto& url : o.endpoints) out.push_back(parse_endpoint_url(url));
    for (const auto& ep : out) {
      if (ep.tls != out.front().tls)
        throw error(EINVAL, "etcd connect", ep.url(), "the endpoints mix http:// and https://");
      if (ep.tls && !transport_speaks_tls_v<Transport>)
        throw error(EINVAL, "etcd connect", ep.url(),
                    "an https:// endpoint needs a TLS transport: basic_etcd_kv<Io, Transport> "
                    "with one such as examples/tls/openssl_transport.hpp");
    }
    if (!out.front().tls && !o.tls.empty())
      throw error(EINVAL, "etcd connect", out.front().url(),
                  "TLS options are set but the endpoints are http://: use https://");
    return out;
  }

  // The password, from its file (one line; a final newline dropped) or environment variable.
  static std::string read_password(const etcd_options& o) {
    if (o.user.empty()) return {};
    std::string pw;
    if (!o.password_file.empty()) {
      auto fd = open_file<Io>(o.password_file, O_RDONLY);
      pw = read_all(fd);
      if (!pw.empty() && pw.back() == '\n') pw.pop_back();
      if (!pw.empty() && pw.back() == '\r') pw.pop_back();
      if (pw.empty()) throw error(EINVAL, "etcd auth", o.password_file, "empty password file");
    } else {
      const char* v = std::getenv(o.password_env.c_str());
      if (!v || !*v)
        throw error(EINVAL, "etcd auth", o.password_env,
                    "the password environment variable is not set or empty");
      pw = v;
    }
    return pw;
  }

  // The headers of a request: the content type, and the token when authenticating.
  static http_headers headers_with(const std::string* token) {
    http_headers h{{"Content-Type", "application/json"}};
    if (token && !token->empty()) h.emplace_back("Authorization", *token);
    return h;
  }

  // Runs `fn(headers)` with the current token (authenticating first when there is none); when
  // etcd refuses the token, authenticates again and runs it once more.
  template <class Fn>
  void authorized(const http_endpoint& ep, const std::string& op, const std::string& key,
                  const std::atomic<bool>* cancel, Fn&& fn) const {
    if (opts_.user.empty()) return fn(headers_with(nullptr));
    for (int attempt = 0;; ++attempt) {
      const std::string tok = token(ep, op, key, cancel);
      try {
        return fn(headers_with(&tok));
      } catch (const etcd_unauthenticated&) {
        if (attempt > 0) throw;
        std::lock_guard<std::mutex> lock(auth_mutex_);
        if (token_ && *token_ == tok) token_.reset();
      } catch (const error& e) {
        const std::string what = e.what();
        if (tok.empty() || what.find(tok) == std::string::npos) throw;
        throw error(e.errnum(), e.operation(), e.path(),
                    scrubbed(what, tok));  // a server echoed it
      }
    }
  }

  // `text` with every occurrence of `secret` replaced by "***".
  static std::string scrubbed(std::string text, const std::string& secret) {
    for (std::size_t at; (at = text.find(secret)) != std::string::npos;)
      text.replace(at, secret.size(), "***");
    return text;
  }

  // The token to send ("" when the cluster has authentication off), authenticating on `ep`
  // when the client has none yet.
  std::string token(const http_endpoint& ep, const std::string& op, const std::string& key,
                    const std::atomic<bool>* cancel) const {
    {
      std::lock_guard<std::mutex> lock(auth_mutex_);
      if (token_) return *token_;
    }
    std::string fresh = authenticate(ep, op, key, cancel);
    std::lock_guard<std::mutex> lock(auth_mutex_);
    token_ = fresh;
    return fresh;
  }

  // POST /v3/auth/authenticate; never puts the password or the token in an error.
  std::string authenticate(const http_endpoint& ep, const std::string& op, const std::string& key,
                           const std::atomic<bool>* cancel) const {
    const std::string target = "/v3/auth/authenticate";
    const std::string url = ep.url() + target;
    const http_request req{
        "POST", target, headers_with(nullptr),
        "{\"name\":" + json_quote(opts_.user) + ",\"password\":" + json_quote(password_) + "}"};
    http_response resp = pool_.call(ep, req, timeouts(), cancel);
    bytes_read_.fetch_add(resp.body.size(), std::memory_order_relaxed);
    const std::string who = "authenticating as user '" + opts_.user + "' at " + url;
    json_value v;
    try {
      v = parse_json(resp.body, url);
    } catch (const error&) {
      throw error(EPROTO, op, key,
                  who + ": malformed reply (status " + std::to_string(resp.status) + ")");
    }
    if (const json_value* err = v.is_object() ? v.find("error") : nullptr) {
      const json_value* code = v.find("code");
      const std::string text = err->is_string() ? err->as_string() : "error";
      const std::int64_t c = code && code->is_integer() ? code->as_int64() : -1;
      if (text.find("authentication is not enabled") != std::string::npos) return {};
      const int errnum = etcd_errno(c, text);
      throw error(errnum == EIO ? EACCES : errnum, op, key,
                  who + ": " + text + " (gRPC code " + std::to_string(c) + ")");
    }
    const json_value* tok = v.is_object() ? v.find("token") : nullptr;
    if (resp.status != 200 || !tok || !tok->is_string() || tok->as_string().empty())
      throw error(EPROTO, op, key,
                  who + ": no token in the reply (status " + std::to_string(resp.status) + ")");
    authentications_.fetch_add(1);
    return tok->as_string();
  }

  // The errno to report when `e` means this endpoint may be down or busy (the next may do
  // better), 0 when it is an answer or a local failure that another endpoint would not change.
  static int transient_errno(const error& e) {
    if (dynamic_cast<const http_connection_closed*>(&e)) return ECONNRESET;
    if (is_connection_failure(e) || is_transient_kv_error(e)) return e.errnum();
    return 0;
  }

  // The order in which one call tries the endpoints: round from the last good one, those not
  // suspect first, then the suspects.
  std::vector<std::size_t> try_order() const {
    const std::size_t n = endpoints_.size(), first = current_.load();
    const clock::rep now = clock::now().time_since_epoch().count();
    std::vector<std::size_t> order, suspects;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = (first + i) % n;
      (suspect_until_[k].load() > now ? suspects : order).push_back(k);
    }
    order.insert(order.end(), suspects.begin(), suspects.end());
    return order;
  }

  void mark_suspect(std::size_t k) const {
    const auto until =
        clock::now() + std::chrono::duration_cast<clock::duration>(opts_.suspect_for);
    suspect_until_[k].store(until.time_since_epoch().count());
    pool_.drop(endpoints_[k]);  // its idle connections may be as dead as the one that failed
  }

  void mark_good(std::size_t k) const {
    if (suspect_until_[k].load() != 0) suspect_until_[k].store(0);
    answered_at_[k].store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    current_.store(k);
  }

  // Runs `fn(endpoint)` on the endpoints in try_order() until one succeeds; see the header for
  // which failures move on to the next endpoint.
  template <class Fn>
  void with_endpoint(etcd_request kind, const std::string& op, const std::string& key,
                     Fn&& fn) const {
    std::string failures;
    int last_errno = 0;
    for (std::size_t k : try_order()) {
      try {
        fn(endpoints_[k]);
        mark_good(k);
        return;
      } catch (const error& e) {
        last_errno = transient_errno(e);
        if (last_errno != 0) mark_suspect(k);
        if (last_errno == 0 || (kind == etcd_request::write && !is_connection_failure(e)))
          rethrow(e, last_errno, op, key);
        failures += (failures.empty() ? "" : "; ") + std::string(e.what());
      }
    }
    throw error(last_errno, op, key, "no etcd endpoint reachable: " + failures);
  }

  // Runs `fn(endpoint k)`: marks k good when it returns, suspect when it throws a transient
  // error; the error is reported as a failure of `op` on `key`.
  template <class Fn>
  void at_endpoint(std::size_t k, const std::string& op, const std::string& key, Fn&& fn) const {
    try {
      fn(endpoints_.at(k));
    } catch (const error& e) {
      const int n = transient_errno(e);
      if (n != 0) mark_suspect(k);
      if (e.operation().rfind("etcd", 0) == 0) throw;
      throw error(n != 0 ? n : e.errnum(), op, key, e.what());
    }
    mark_good(k);
  }

  // Reports `e` (being handled) as a failure of `op` on `key` (etcd's own errors already are),
  // with `errnum` when it is not 0: a transient failure of a write that was sent.
  [[noreturn]] static void rethrow(const error& e, int errnum, const std::string& op,
                                   const std::string& key) {
    if (e.operation().rfind("etcd", 0) == 0) throw;
    if (errnum == 0) throw error(e.errnum(), op, key, e.what());
    throw error(errnum, op, key, std::string("sent, outcome unknown: ") + e.what());
  }

  // Checks the status, parses the JSON and surfaces etcd's own errors.
  static json_value reply(int status, const std::string& body, const std::string& url,
                          const std::string& op, const std::string& key) {
    if (status == 400 && body.find("HTTP request to an HTTPS server") != std::string::npos)
      throw error(EPROTO, op, key,
                  "the etcd endpoint speaks TLS: use https:// (etcds:// in a store URL) and a TLS "
                  "transport (" +
                      url + ")");
    json_value v;
    try {
      v = parse_json(body, url);
    } catch (const error& e) {
      if (status != 200)
        throw error(EIO, op, key,
                    "etcd answered status " + std::to_string(status) + ": " + body.substr(0, 200));
      throw error(EPROTO, op, key, "malformed reply from etcd: " + std::string(e.what()));
    }
    if (const json_value* err = v.is_object() ? v.find("error") : nullptr)
      throw_gateway_error(v, *err, url, op, key);
    if (status != 200 || !v.is_object())
      throw error(EIO, op, key, "etcd answered status " + std::to_string(status) + ": " + body);
    return v;
  }

  // A gateway error: {"error":"msg","code":N,"message":"msg"} for a call, or
  // {"error":{"grpc_code":N,"message":"msg",...}} inside a stream. A token problem throws
  // etcd_unauthenticated (the caller authenticates again).
  [[noreturn]] static void throw_gateway_error(const json_value& v, const json_value& err,
                                               const std::string& url, const std::string& op,
                                               const std::string& key) {
    const bool nested = err.is_object();
    const json_value* code = nested ? err.find("grpc_code") : v.find("code");
    const json_value* msg = nested ? err.find("message") : &err;
    const std::string text = msg && msg->is_string() ? msg->as_string() : to_json(err);
    const std::int64_t c = code && code->is_integer() ? code->as_int64() : -1;
    std::string detail =
        "etcd error: " + text + " (gRPC code " + std::to_string(c) + ", " + url + ")";
    if (text.find("user name is empty") != std::string::npos)
      detail +=
          "; the cluster requires authentication: set a user and a password file or "
          "variable (user=...&password_file=... in an etcds:// URL)";
    if (etcd_token_problem(c, text)) throw etcd_unauthenticated(EACCES, op, key, detail);
    throw error(etcd_errno(c, text), op, key, detail);
  }

  void start_lease() {
    json_value r =
        call(etcd_request::write, "/v3/lease/grant",
             "{\"TTL\":" + std::to_string(opts_.lease_ttl.count()) + "}", "etcd lease grant", "");
    lease_id_ = etcd_int(r.find("ID"));
    if (lease_id_.load() == 0)
      throw error(EPROTO, "etcd lease grant", "", "reply without a lease ID");
    lease_alive_ = true;
    keepalive_ = std::thread([this] { keepalive_loop(); });
  }

  void keepalive_loop() {
    const auto period = keepalive_period();
    const std::string body = "{\"ID\":\"" + std::to_string(lease_id_.load()) + "\"}";
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (stop_cv_.wait_for(lock, period, [this] { return stopping_; })) return;
      lock.unlock();
      try {
        json_value r = call(etcd_request::read, "/v3/lease/keepalive", body, "etcd lease keepalive",
                            "", &cancel_);
        const json_value* result = r.find("result");
        // TTL 0 (or absent) in the answer: etcd no longer knows the lease; it expired.
        if (result && etcd_int(result->find("TTL")) <= 0) lease_alive_ = false;
      } catch (const error&) {
        // Unreachable for now: try again next period; the lease lives until its TTL runs out.
      }
      lock.lock();
    }
  }

  void stop_keepalive() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cancel_ = true;  // cuts a keep-alive in flight within ~20 ms
    stop_cv_.notify_all();
    if (keepalive_.joinable()) keepalive_.join();
  }

  etcd_options opts_;
  std::vector<http_endpoint> endpoints_;
  std::string password_;                   // never in a message
  mutable http_pool<Io, Transport> pool_;  // idle connections, for keep-alive
  mutable std::mutex auth_mutex_;
  mutable std::optional<std::string> token_;  // none yet; "" when authentication is off
  mutable std::atomic<std::size_t> authentications_{0};
  std::unique_ptr<std::atomic<clock::rep>[]> suspect_until_;  // steady_clock ticks; 0: healthy
  std::unique_ptr<std::atomic<clock::rep>[]> answered_at_;    // the last answer, steady ticks
  mutable std::atomic<std::size_t> current_{0};               // the last endpoint that answered
  mutable std::atomic<std::uint64_t> watch_opens_{0};
  mutable std::atomic<std::uint64_t> bytes_read_{0};
  mutable std::atomic<std::uint64_t> probes_{0};
  std::atomic<std::int64_t> lease_id_{0};
  std::atomic<bool> lease_alive_{false};
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::atomic<bool> cancel_{false};
  std::thread keepalive_;
};

}  // namespace detail

/// A kv_store on etcd v3 (see the header comment); `Io` carries the socket calls, `Transport`
/// makes the connections (plain TCP by default; a TLS transport for https:// endpoints).
template <class Io = posix_io, class Transport = plain_transport<Io>>
class basic_etcd_kv {
  static_assert(check_transport<Transport>());

 public:
  using client_type = detail::etcd_client<Io, Transport>;

  /// Connects lazily (no request is made unless a lease is wanted); throws holdfast::error on a
  /// malformed endpoint URL, an invalid prefix, or a lease that cannot be granted.
  basic_etcd_kv(etcd_options options, kv_namespace ns)
      : basic_etcd_kv(std::make_shared<client_type>(checked(std::move(options))), std::move(ns)) {}

  /// Another handle on the same client and lease, scoped to namespace `ns`.
  basic_etcd_kv with_namespace(kv_namespace ns) const { return basic_etcd_kv(client_, ns); }
  /// This handle's namespace.
  const kv_namespace& ns() const noexcept { return ns_; }
  /// The lease attached to every write, or 0 without one.
  std::int64_t lease_id() const noexcept { return client_->lease_id(); }
  /// False once etcd reported the lease gone (expired); true while kept alive.
  bool lease_alive() const noexcept { return client_->lease_alive(); }
  /// Revokes the lease: etcd deletes every key this client wrote, at once; later writes carry
  /// no lease. Idempotent.
  void revoke_lease() { client_->revoke_lease(); }
  /// How many times the client authenticated (fetched a token) so far; 0 without a user.
  std::size_t authentications() const noexcept { return client_->authentications(); }
  /// Idle connections the client keeps for reuse now (for tests and diagnostics).
  std::size_t idle_connections() const { return client_->idle_connections(); }
  /// The client's counters (requests, connections, watch opens, probes), shared by every
  /// handle on it and its watches; see etcd_stats.
  etcd_stats stats() const noexcept { return client_->stats(); }
  /// The full etcd key of `key`: "<prefix>/<run>/<incarnation>/<key>".
  std::string etcd_key(const std::string& key) const { return root_ + key; }

  /// Stores `value` under `key` unless the key exists (a txn on create_revision == 0).
  bool insert(const std::string& key, std::string_view value) {
    validate_key(key, "kv insert");
    const std::string k = detail::json_quote(detail::base64_encode(root_ + key));
    const std::string body =
        "{\"compare\":[{\"target\":\"CREATE\",\"key\":" + k +
        ",\"createRevision\":\"0\"}],\"success\":[{\"requestPut\":" + put_body(k, value) + "}]}";
    auto r = client_->call(detail::etcd_request::write, "/v3/kv/txn", body, "etcd insert", key);
    const detail::json_value* ok = r.find("succeeded");
    return ok && ok->is_bool() && ok->as_bool();
  }

  /// Stores `value` under `key`, replacing any previous value.
  void put(const std::string& key, std::string_view value) {
    validate_key(key, "kv put");
    client_->call(detail::etcd_request::write, "/v3/kv/put",
                  put_body(detail::json_quote(detail::base64_encode(root_ + key)), value),
                  "etcd put", key);
  }

  /// The value of `key`, or std::nullopt.
  std::optional<std::string> try_get(const std::string& key) const {
    validate_key(key, "kv try_get");
    return range_one(key, "etcd try_get").value;
  }

  /// Waits (a watch, no polling) until `key` exists or `timeout` passes.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) const {
    validate_key(key, "kv get");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto found = range_one(key, "etcd get");
      if (found.value || std::chrono::steady_clock::now() >= deadline) return found.value;
      if (auto value = watch(key, found.revision + 1, deadline)) return value;
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      // The watch window ended (or the server closed the watch, or cancelled it after a
      // compaction): range again, which also tells whether the endpoint still answers.
    }
  }

  /// Every key strictly below `prefix + "/"` (all keys for ""), sorted, with its value.
  kv_pairs list(const std::string& prefix) const {
    const std::string start = scope(prefix, "kv list");
    auto r = client_->call(detail::etcd_request::read, "/v3/kv/range", range_body(start),
                           "etcd list", prefix);
    kv_pairs out;
    if (const auto* kvs = r.find("kvs"))
      for (const auto& kv : kvs->as_array()) {
        std::string full = detail::base64_decode(string_of(kv, "key", prefix), "etcd list reply");
        if (full.compare(0, start.size(), start) != 0) continue;
        out.emplace_back(full.substr(root_.size()), value_of(kv, prefix));
      }
    std::sort(out.begin(), out.end());
    return out;
  }

  class watcher;

  /// Starts one long-lived watch on every key strictly below `prefix + "/"` (all keys for ""),
  /// as list() scopes them: a range learns the revision, then one streaming request follows
  /// every change after it (see watcher and the header). Throws as list() does when no endpoint
  /// answers the range; a stream that cannot be opened yet is retried by take().
  watcher watch(const std::string& prefix) const {
    return watcher(client_, root_, scope(prefix, "kv watch"), prefix);
  }

  /// Removes `key`; true when it existed.
  bool erase(const std::string& key) {
    validate_key(key, "kv erase");
    auto r =
        client_->call(detail::etcd_request::write, "/v3/kv/deleterange",
                      "{\"key\":" + detail::json_quote(detail::base64_encode(root_ + key)) + "}",
                      "etcd erase", key);
    return detail::etcd_int(r.find("deleted")) > 0;
  }

  /// Removes every key strictly below `prefix + "/"` (all keys for ""); returns how many.
  std::size_t erase_prefix(const std::string& prefix) {
    const std::string start = scope(prefix, "kv erase_prefix");
    auto r = client_->call(detail::etcd_request::write, "/v3/kv/deleterange", range_body(start),
                           "etcd erase_prefix", prefix);
    return static_cast<std::size_t>(detail::etcd_int(r.find("deleted")));
  }

 private:
  struct found_value {
    std::optional<std::string> value;
    std::int64_t revision = 0;
  };

  basic_etcd_kv(std::shared_ptr<client_type> client, kv_namespace ns)
      : client_(std::move(client)),
        ns_(std::move(ns)),
        root_(client_->options().prefix + "/" + ns_.path() + "/") {}

  static etcd_options checked(etcd_options o) {
    std::string why = detail::key_problem(o.prefix);
    if (!why.empty()) throw error(EINVAL, "etcd prefix", o.prefix, "invalid prefix: " + why);
    return o;
  }

  std::string put_body(const std::string& quoted_key, std::string_view value) const {
    std::string body =
        "{\"key\":" + quoted_key + ",\"value\":" + detail::json_quote(detail::base64_encode(value));
    if (const std::int64_t lease = client_->lease_id(); lease != 0)
      body += ",\"lease\":\"" + std::to_string(lease) + "\"";
    return body + "}";
  }

  static std::string range_body(const std::string& start) {
    return "{\"key\":" + detail::json_quote(detail::base64_encode(start)) + ",\"range_end\":" +
           detail::json_quote(detail::base64_encode(detail::etcd_prefix_end(start))) + "}";
  }

  std::string scope(const std::string& prefix, const char* op) const {
    std::string p = normalize_prefix(prefix, op);
    return p.empty() ? root_ : root_ + p + "/";
  }

  found_value range_one(const std::string& key, const char* op) const {
    auto r = client_->call(
        detail::etcd_request::read, "/v3/kv/range",
        "{\"key\":" + detail::json_quote(detail::base64_encode(root_ + key)) + "}", op, key);
    found_value out;
    const detail::json_value* header = r.find("header");
    out.revision = detail::etcd_int(header ? header->find("revision") : nullptr);
    if (const auto* kvs = r.find("kvs"))
      if (!kvs->as_array().empty()) out.value = value_of(kvs->as_array().front(), key);
    return out;
  }

  // Watches `key` from `revision` for at most request_timeout (and not past `deadline`): the
  // value of the first put, or std::nullopt when the window ends or the watch is closed.
  std::optional<std::string> watch(const std::string& key, std::int64_t revision,
                                   std::chrono::steady_clock::time_point deadline) const {
    const auto window =
        std::min(deadline, std::chrono::steady_clock::now() + client_->options().request_timeout);
    const std::string body =
        "{\"create_request\":{\"key\":" + detail::json_quote(detail::base64_encode(root_ + key)) +
        ",\"start_revision\":\"" + std::to_string(revision) + "\"}}";
    bool created = false;
    std::optional<std::string> value;
    client_->stream("/v3/watch", body, "etcd get", key, window, [&](const detail::json_value& msg) {
      const bool was_created = created;
      if (!on_watch(msg, key, created, value)) return false;
      // Created from a revision the store has passed already (a write since our range): etcd
      // catches such a watch up only every 100 ms, so range again instead of waiting for it.
      if (created && !was_created) {
        const detail::json_value* header = msg.find("result");
        header = header ? header->find("header") : nullptr;
        if (detail::etcd_int(header ? header->find("revision") : nullptr) >= revision) return false;
      }
      return true;
    });
    if (!value && !created && std::chrono::steady_clock::now() < window)
      throw error(EPROTO, "etcd get", key, "the watch stream ended before it was created");
    return value;
  }

  // One watch message: notes `created`, takes the first put's value; false to stop watching.
  // A cancelled watch ranges again (compacted, or no reason given); one cancelled for its token
  // throws etcd_unauthenticated (the client authenticates again and watches once more), one
  // cancelled for another reason (permission denied) throws that reason.
  static bool on_watch(const detail::json_value& msg, const std::string& key, bool& created,
                       std::optional<std::string>& value) {
    const detail::json_value* result = msg.find("result");
    if (!result) return true;
    if (const auto* c = result->find("created"); c && c->is_bool())
      created = created || c->as_bool();
    if (const auto* c = result->find("canceled"); c && c->is_bool() && c->as_bool()) {
      const auto* why = result->find("cancel_reason");
      const std::string reason = why && why->is_string() ? why->as_string() : std::string();
      if (detail::etcd_int(result->find("compact_revision")) != 0 || reason.empty()) return false;
      const std::string text = "etcd cancelled the watch: " + reason;
      if (detail::etcd_token_problem(0, reason))
        throw detail::etcd_unauthenticated(EACCES, "etcd get", key, text);
      throw error(reason.find("permission denied") != std::string::npos ? EACCES : EIO, "etcd get",
                  key, text);
    }
    if (const auto* events = result->find("events"))
      for (const auto& ev : events->as_array()) {
        const auto* type = ev.find("type");
        if (type && type->is_string() && type->as_string() == "DELETE") continue;
        if (const auto* kv = ev.find("kv")) {
          value = value_of(*kv, key);
          return false;
        }
      }
    return true;
  }

  // The gateway omits empty fields: an absent "value" is the empty value.
  static std::string value_of(const detail::json_value& kv, const std::string& key) {
    const auto* v = kv.find("value");
    return v ? detail::base64_decode(v->as_string(), "etcd value of '" + key + "'") : std::string();
  }
  static std::string string_of(const detail::json_value& kv, const char* field,
                               const std::string& key) {
    const auto* v = kv.find(field);
    if (!v || !v->is_string())
      throw error(EPROTO, "etcd", key, std::string("reply without a string '") + field + "'");
    return v->as_string();
  }

  std::shared_ptr<client_type> client_;
  kv_namespace ns_;
  std::string root_;
};

/// A long-lived etcd watch (see "Waiting on a store" in kv.hpp and the header): one streaming
/// POST /v3/watch on a connection of its own, read without blocking by take(), resumed from the
/// last revision seen when the stream is lost, and probed for health every probe_interval().
/// Movable, not copyable; one thread at a time (the store may be used by others meanwhile).
template <class Io, class Transport>
class basic_etcd_kv<Io, Transport>::watcher {
 public:
  using clock = std::chrono::steady_clock;

  watcher(watcher&&) = default;
  watcher& operator=(watcher&&) = default;
  watcher(const watcher&) = delete;
  watcher& operator=(const watcher&) = delete;
  ~watcher() = default;

  /// The watch stream's socket, to poll for POLLIN; -1 while disconnected (sleep until due()).
  int fd() const noexcept { return stream_.fd(); }
  /// True when take() has something without waiting: a snapshot, events already decoded,
  /// a complete message buffered, or bytes a TLS layer holds.
  bool buffered() const noexcept {
    return complete_ || !events_.empty() || pending_.find('\n') != std::string::npos ||
           stream_.pending();
  }
  /// When take() must be called even if fd() stays quiet: the next health probe while
  /// connected, the next reconnection attempt while not.
  clock::time_point due() const noexcept { return stream_.is_open() ? probe_at_ : retry_at_; }

  /// What changed since the last take(), in revision order, each event once: reads what the
  /// stream holds without waiting; when due, probes the endpoint or reconnects (each bounded by
  /// connect_timeout + request_timeout). Throws holdfast::error for what a retry will not cure
  /// (a malformed stream, a refused permission); the watch then stays usable and retries.
  kv_changes take() {
    if (stream_.is_open()) read_stream();
    if (stream_.is_open() && clock::now() >= probe_at_) probe();
    if (!stream_.is_open() && clock::now() >= retry_at_) {
      reconnect();
      // Compacted past our revision: range again and reopen at once (one round more).
      if (!stream_.is_open() && need_range_ && clock::now() >= retry_at_) reconnect();
    }
    kv_changes out;
    out.events = std::move(events_);
    events_.clear();
    out.complete = std::exchange(complete_, false);
    return out;
  }

  /// The revision of the last event delivered (or of the range that started or re-ranged the
  /// watch): a resume starts right after it.
  std::int64_t revision() const noexcept { return revision_; }
  /// The URL of the endpoint the stream is on; "" while disconnected.
  std::string endpoint() const {
    return stream_.is_open() ? client_->endpoint_url(endpoint_) : std::string();
  }
  /// How often a quiet stream is probed: max(1 s, request_timeout / 2, 1.5 x keep-alive period).
  std::chrono::milliseconds probe_interval() const noexcept { return interval_; }

 private:
  friend class basic_etcd_kv;

  watcher(std::shared_ptr<client_type> client, std::string root, std::string start,
          std::string prefix)
      : client_(std::move(client)),
        root_(std::move(root)),
        start_(std::move(start)),
        prefix_(std::move(prefix)),
        interval_(std::max({std::chrono::milliseconds(std::chrono::seconds(1)),
                            client_->options().request_timeout / 2,
                            client_->keepalive_period() * 3 / 2})) {
    range();
    reconnect();  // a transient failure leaves it disconnected, retried by take()
  }

  // Learns the revision to watch from, and what the prefix holds at it: the snapshot the next
  // take() reports (complete) before the events that follow.
  void range() {
    const std::string body =
        "{\"key\":" + detail::json_quote(detail::base64_encode(start_)) + ",\"range_end\":" +
        detail::json_quote(detail::base64_encode(detail::etcd_prefix_end(start_))) + "}";
    auto r = client_->call(detail::etcd_request::read, "/v3/kv/range", body, "etcd watch", prefix_);
    const detail::json_value* header = r.find("header");
    revision_ = detail::etcd_int(header ? header->find("revision") : nullptr);
    events_.clear();
    if (const auto* kvs = r.find("kvs"))
      for (const auto& kv : kvs->as_array()) {
        const std::string full =
            detail::base64_decode(string_of(kv, "key", prefix_), "etcd watch range");
        if (full.compare(0, start_.size(), start_) == 0)
          events_.push_back(kv_event{full.substr(root_.size()), value_of(kv, prefix_)});
      }
    complete_ = true;
  }

  std::string create_body() const {
    return "{\"create_request\":{\"key\":" + detail::json_quote(detail::base64_encode(start_)) +
           ",\"range_end\":" +
           detail::json_quote(detail::base64_encode(detail::etcd_prefix_end(start_))) +
           ",\"start_revision\":\"" + std::to_string(revision_ + 1) + "\"}}";
  }

  // One attempt on the preferred endpoint (after re-ranging when compacted); on failure the
  // watch stays disconnected until retry_at_.
  void reconnect() {
    stream_.close();
    try {
      if (need_range_) {
        range();
        need_range_ = false;
      }
      const std::size_t k = client_->preferred_endpoint();
      bool go = true;
      auto s = client_->open_stream_at(
          k, "/v3/watch", create_body(), "etcd watch", prefix_, pending_,
          [&](const detail::json_value& msg) { return go = on_message(msg); });
      if (!go) {  // cancelled at once: compacted (range again now) or another reason (back off)
        pending_.clear();
        retry_at_ = need_range_ ? clock::now() : clock::now() + backoff(++failures_);
        return;
      }
      failures_ = 0;
      stream_ = std::move(s);
      endpoint_ = k;
      probe_at_ = clock::now() + interval_;
      read_lines();  // what arrived with the first message
    } catch (const error& e) {
      stream_.close();
      pending_.clear();
      retry_at_ = clock::now() + backoff(++failures_);
      if (!client_type::transient(e)) throw;
    }
  }

  // No delay while other endpoints are untried, then 50 ms doubling up to the probe interval.
  std::chrono::milliseconds backoff(unsigned failures) const {
    const std::size_t n = client_->endpoint_count();
    if (failures < n) return std::chrono::milliseconds(0);
    const auto doublings = std::min<std::size_t>(failures - n, 10);
    return std::min<std::chrono::milliseconds>(interval_,
                                               std::chrono::milliseconds(50) * (1 << doublings));
  }

  // Reads what the stream holds (no wait) and turns its messages into events.
  void read_stream() {
    using status = typename detail::http_open_stream<Io, Transport>::status;
    const std::string url = stream_.where();
    bool got = false;
    status st = status::open;
    std::exception_ptr failure;
    try {
      st = stream_.read(
          [&](std::string_view b) {
            got = true;
            client_->append_message(pending_, b, url, "etcd watch", prefix_);
          },
          clock::time_point());
    } catch (const error& e) {
      if (!client_type::transient(e)) failure = std::current_exception();
      st = status::ended;
    }
    if (got) probe_at_ = clock::now() + interval_;  // any message proves the endpoint alive
    if (read_lines() && st == status::ended) lost();
    if (failure) std::rethrow_exception(failure);
  }

  // Handles the complete messages buffered; false when one ended the stream (now closed).
  bool read_lines() {
    const std::string url = client_->endpoint_url(endpoint_) + "/v3/watch";
    bool go = true;
    try {
      go = detail::etcd_take_lines(pending_, [&](const std::string& line) {
        return on_message(client_type::stream_message(line, url, "etcd watch", prefix_));
      });
    } catch (const detail::etcd_unauthenticated&) {
      client_->forget_token();  // the next open authenticates again
      go = false;
    } catch (const error& e) {
      lost();
      if (client_type::transient(e)) return false;  // etcd's "unavailable": resume elsewhere
      retry_at_ = clock::now() + backoff(++failures_);
      throw;
    }
    if (!go) {
      stream_.close();
      pending_.clear();
      retry_at_ = clock::now();
    }
    return go;
  }

  // The stream was lost: the endpoint is suspect; reconnect at once (resuming).
  void lost() {
    client_->suspect(endpoint_);
    stream_.close();
    pending_.clear();
    retry_at_ = clock::now();
  }

  // One watch message: events after revision_ become events_; false when the watch was
  // cancelled (need_range_ set when compacted). A cancel for another reason than compaction,
  // none or the token throws it.
  bool on_message(const detail::json_value& msg) {
    const detail::json_value* result = msg.find("result");
    if (!result) return true;
    if (const auto* c = result->find("canceled"); c && c->is_bool() && c->as_bool()) {
      const auto* why = result->find("cancel_reason");
      const std::string reason = why && why->is_string() ? why->as_string() : std::string();
      if (detail::etcd_int(result->find("compact_revision")) != 0) {
        need_range_ = true;
        return false;
      }
      if (reason.empty()) return false;
      if (detail::etcd_token_problem(0, reason)) {
        client_->forget_token();
        return false;
      }
      throw error(reason.find("permission denied") != std::string::npos ? EACCES : EIO,
                  "etcd watch", prefix_, "etcd cancelled the watch: " + reason);
    }
    if (const auto* events = result->find("events"))
      for (const auto& ev : events->as_array()) {
        const auto* kv = ev.find("kv");
        if (!kv) continue;
        const std::int64_t rev = detail::etcd_int(kv->find("mod_revision"));
        if (rev <= revision_) continue;  // delivered already (a resume overlaps): once only
        const std::string full =
            detail::base64_decode(string_of(*kv, "key", prefix_), "etcd watch event");
        revision_ = rev;
        if (full.compare(0, start_.size(), start_) != 0) continue;
        const auto* type = ev.find("type");
        const bool erased = type && type->is_string() && type->as_string() == "DELETE";
        events_.push_back(
            kv_event{full.substr(root_.size()),
                     erased ? std::nullopt : std::optional<std::string>(value_of(*kv, prefix_))});
      }
    return true;
  }

  // Sends the health probe on the stream's endpoint (see the header); a transient failure
  // (the endpoint is then suspect) moves the watch.
  void probe() {
    // Any answer from the endpoint since the last look (a lease keep-alive, another request of
    // this client) proves it alive: no probe of our own.
    const auto answered = client_->last_answer(endpoint_);
    if (answered + interval_ > clock::now()) {
      probe_at_ = answered + interval_;
      return;
    }
    const std::string body =
        "{\"key\":" + detail::json_quote(detail::base64_encode(start_)) + ",\"count_only\":true}";
    try {
      client_->call_at(endpoint_, "/v3/kv/range", body, "etcd watch probe", prefix_, true);
      probe_at_ = clock::now() + interval_;
    } catch (const error& e) {
      if (!client_type::transient(e)) {
        probe_at_ = clock::now() + interval_;
        throw;
      }
      stream_.close();  // call_at marked the endpoint suspect; resume on another one
      pending_.clear();
      retry_at_ = clock::now();
    }
  }

  std::shared_ptr<client_type> client_;
  std::string root_, start_, prefix_;
  std::chrono::milliseconds interval_;
  detail::http_open_stream<Io, Transport> stream_;
  std::size_t endpoint_ = 0;
  std::string pending_;           // stream bytes not yet a complete message
  std::vector<kv_event> events_;  // decoded, not yet taken
  std::int64_t revision_ = 0;     // events are delivered up to here
  bool complete_ = false;         // events_ starts with a range's snapshot (first, compacted)
  bool need_range_ = false;       // compacted past revision_: range before reopening
  unsigned failures_ = 0;         // reconnection attempts failed in a row
  clock::time_point probe_at_{}, retry_at_{};
};

/// The etcd store with the default (POSIX) Io policy.
using etcd_kv = basic_etcd_kv<>;

HOLDFAST_NAMESPACE_END
