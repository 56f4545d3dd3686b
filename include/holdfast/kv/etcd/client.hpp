// holdfast/kv/etcd/client.hpp — the connection to an etcd cluster that every etcd_kv handle and
// watch shares: endpoint failover, connection reuse, authentication, and the writes that go
// through the lease (kv/etcd/lease.hpp).
//
// Each operation is one HTTP POST to one of the configured endpoints (detail/http.hpp). Every
// connection is made through the client's Transport (detail/http/transport.hpp;
// plain_transport<Io> by default). With a TLS transport (such as
// examples/tls/openssl_transport.hpp) the endpoints are https:// and `etcd_options::tls` names
// the CA, the client certificate and key and the server name; with `user` and a password file or
// environment variable the client authenticates (/v3/auth/authenticate) and sends the token on
// every request and watch.
//
// Guarantees:
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
//         revoke): their outcome is unknown, so they throw that transient error at once ("sent,
//         outcome unknown") and the caller's retry goes to another endpoint. Nor does the
//         connection pool send a write again when its reused connection closes before any byte
//         of the reply (etcd may have applied it): only reads (etcd_request::read) are resent
//         there, once, on a fresh connection.
//     Connecting (with a TLS handshake) is bounded by `connect_timeout`, a request by
//     `request_timeout`, both cut to the time left before the calling thread's
//     kv_call_deadline (kv/call_deadline.hpp), after which no further endpoint is tried (the
//     call fails with ETIMEDOUT, naming the endpoints tried; an endpoint that did not answer
//     within what was left is marked suspect as for its own timeout: a hung member is left
//     behind by short-budget callers too). The suspect marks are shared by every
//     handle on the client and updated lock-free.
//   - Every failure throws holdfast::error naming the operation and the key, with the
//     endpoint's own error inside: ECONNREFUSED/ETIMEDOUT/ECONNRESET/... when no endpoint answered
//     in time (a connection closed before the reply is ECONNRESET), EAGAIN for etcd's
//     "unavailable" answers, ETIMEDOUT for its deadline-exceeded ones, EPROTO for a malformed
//     HTTP or JSON reply, EIO for any other error etcd reported (gateway.hpp).
//     is_transient_kv_error is true for the first three kinds. A reply body, or etcd's error
//     text, shows in a message as its first 200 bytes and its length (http_body_excerpt), never
//     whole (a reply may be 64 MiB).
//   - With `lease_ttl` > 0 (and a `leased_prefix`), the client grants a lease and keeps it alive
//     from one background thread (kv/etcd/lease.hpp: a round every TTL / 3, each endpoint tried
//     for at most TTL / 6 and the next at once, so a member that never answers does not cost
//     the lease; a lease etcd lost anyway is granted again and the leased keys put back); the
//     puts and inserts of keys below leased_prefix carry it (lease_for(key); leases(key) says so
//     from the options alone), no other key does. When the process dies the keep-alives stop
//     and etcd deletes its leased keys after the TTL; what it wrote elsewhere (a recorded
//     outcome) stays. The thread is stopped and joined when the client is destroyed (with its
//     last handle), within ~20 ms even with a keep-alive in flight to a hung server (the
//     request is cancelled).
//   - Connections are reused (HTTP/1.1 keep-alive, detail/http/pool.hpp): up to
//     `idle_connections` idle ones per client, so a TLS handshake is paid per connection, not
//     per request. A suspect endpoint's idle connections are closed; streams (a get's watch, each
//     watch object) have a connection of their own.
//   - stats(): requests, connections, watch opens, probes and bytes read, counted with relaxed
//     atomics (etcd_stats).
//   - Authentication: the token is fetched on first use and shared by the client's threads; an
//     "invalid auth token" answer (gRPC code 16: the token expired, see etcd's
//     --auth-token-ttl) makes the client authenticate again and retry the request once. Neither
//     the password nor the token appears in an error message. A wrong password or user is
//     EACCES.
//   - A user (a password) with http:// endpoints is refused (EINVAL, when the client is made,
//     before anything is read or sent) unless every endpoint is loopback (127.0.0.0/8, ::1,
//     localhost) or `allow_plaintext_auth` is set: the password would cross the network in
//     clear text.
//   - Every member is safe to call from several threads at once.
// Caveats:
//   - Without a TLS transport the traffic crosses the network in clear text (and, with
//     `allow_plaintext_auth`, the password too): use https:// on any network that is not trusted.
//   - etcd's gateway cannot authenticate a user by client-certificate name: with --client-cert-auth
//     and auth enabled it ignores the certificate's CommonName ("CommonName of client sending a
//     request against gateway will be ignored"). Client certificates authenticate the host to
//     the TLS layer; authenticate the user with a password.
//   - A write that failed with a transient error may have been applied (a frozen member may even
//     apply it when it resumes): read the key before retrying.
//   - Suspect marks belong to one client (one etcd_kv and its copies), not to the process.
//   - The lease is not revoked on destruction (other workers may still need the keys); call
//     revoke_lease() to delete this client's leased keys at once.
//   - Once the lease expired (the process was paused, or cut off, longer than the TTL), writes
//     of leased keys fail with EIO ("requested lease not found") until the keep-alive thread
//     has granted a new lease (its next round, at once after such a write) and put the leased
//     keys back; lease_id() then changes. Other keys are written as before.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // getenv: etcd_options::password_env
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../detail/base64.hpp"  // a key in an erase body
#include "../../detail/http.hpp"    // http_pool, http_open_stream, parse_endpoint_url, transports
#include "../../detail/json.hpp"
#include "../../error.hpp"
#include "../../io.hpp"          // open_file, read_all: the password file
#include "../../kv.hpp"          // is_transient_kv_error
#include "../call_deadline.hpp"  // kv_call_deadline: the caller's bound on a call
#include "gateway.hpp"  // etcd_request, etcd_errno, etcd_int, etcd_unauthenticated, request bodies
#include "lease.hpp"    // etcd_lease: the lease, its keep-alives and the leased writes
#include "options.hpp"  // etcd_options, etcd_stats

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

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
        pool_(Transport(opts_.tls), opts_.idle_connections),
        lease_(*this, opts_.lease_ttl) {
    suspect_until_ = std::make_unique<std::atomic<clock::rep>[]>(endpoints_.size());
    answered_at_ = std::make_unique<std::atomic<clock::rep>[]>(endpoints_.size());
    for (std::size_t k = 0; k < endpoints_.size(); ++k) {
      suspect_until_[k].store(0);
      answered_at_[k].store(0);
    }
    if (opts_.lease_ttl.count() > 0) lease_.start();
  }
  etcd_client(const etcd_client&) = delete;
  etcd_client& operator=(const etcd_client&) = delete;
  ~etcd_client() { lease_.stop(); }

  /// The options it was made with.
  const etcd_options& options() const noexcept { return opts_; }
  /// The lease attached to writes of leased keys (lease_for()), or 0; a new one after a
  /// re-grant.
  std::int64_t lease_id() const noexcept { return lease_.id(); }
  /// The lease a write of `key` (relative to a handle's namespace) carries: lease_id() when
  /// `key` is strictly below `leased_prefix + "/"`, else 0 (no lease).
  std::int64_t lease_for(std::string_view key) const noexcept {
    return leases(key) ? lease_.id() : 0;
  }
  /// True only while etcd holds the lease as far as the client knows: false from a keep-alive
  /// that found it gone, or once a TTL passed without a renewal, until a new one is granted;
  /// false once revoked.
  bool lease_alive() const noexcept { return lease_.alive(); }
  /// True when writes of `key` (relative to a handle's namespace) are configured to carry the
  /// lease: a lease_ttl is set and `key` is strictly below `leased_prefix + "/"`, whether or
  /// not the lease is still alive.
  bool leases(std::string_view key) const noexcept {
    const std::string& p = opts_.leased_prefix;
    return opts_.lease_ttl.count() > 0 && !p.empty() && key.size() > p.size() &&
           key.compare(0, p.size(), p) == 0 && key[p.size()] == '/';
  }

  /// POSTs `body` to `target` and returns the parsed JSON reply, failing over as `kind` allows.
  /// `op` and `key` name the operation in errors; `cancel` cuts a request in flight; a non-zero
  /// `attempt` bounds each endpoint's try (connecting and the answer) below the options'
  /// timeouts (the lease's keep-alives: TTL / 6).
  json_value call(etcd_request kind, const char* target, const std::string& body,
                  const std::string& op, const std::string& key,
                  const std::atomic<bool>* cancel = nullptr,
                  std::chrono::milliseconds attempt = std::chrono::milliseconds(0)) const {
    json_value out;
    with_endpoint(kind, op, key, [&](const http_endpoint& ep) {
      authorized(ep, op, key, cancel, attempt, [&](http_headers headers) {
        const http_request req{"POST", target, std::move(headers), body};
        http_response resp = pool_.call(ep, req, timeouts(attempt), resend_for(kind), cancel);
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
      authorized(ep, op, key, nullptr, {}, [&](http_headers headers) {
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
        const auto bound = kv_call_deadline::current();
        pool_.stream(ep, req, timeouts(), bound && *bound < deadline ? *bound : deadline, on_data);
        if (go) emit(std::string::npos);
      });
    });
  }

  /// Puts `value` under the etcd key `full`, written for `key` of a handle's namespace (it names
  /// the key in errors, and leases(key) says whether the lease goes on it: then through the
  /// lease, which puts it back under a new one).
  void put(const std::string& full, const std::string& key, std::string_view value) const {
    if (leases(key)) return lease_.put(full, key, value);
    call(etcd_request::write, "/v3/kv/put", etcd_put_json(full, value, 0), "etcd put", key);
  }
  /// Puts `value` under `full` unless the key exists (a txn on create_revision 0), as put();
  /// true when it did.
  bool insert(const std::string& full, const std::string& key, std::string_view value) const {
    if (leases(key)) return lease_.insert(full, key, value);
    return etcd_txn_succeeded(call(etcd_request::write, "/v3/kv/txn",
                                   etcd_insert_json(full, value, 0), "etcd insert", key));
  }
  /// Deletes the etcd key `full` (with `prefix`: every key starting with it) for `key` of a
  /// handle's namespace, as operation `op`; how many keys it deleted. A leased key deleted is
  /// not put back under a new lease.
  std::int64_t erase(const std::string& full, const std::string& key, bool prefix,
                     const char* op) const {
    const std::string body =
        prefix ? etcd_range_json(full) : "{\"key\":" + json_quote(base64_encode(full)) + "}";
    auto send = [&] {
      return etcd_int(
          call(etcd_request::write, "/v3/kv/deleterange", body, op, key).find("deleted"));
    };
    if (prefix ? opts_.lease_ttl.count() > 0 : leases(key))
      return lease_.erasing(full, prefix, send);
    return send();
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
  std::chrono::milliseconds keepalive_period() const noexcept { return lease_.period(); }
  /// The longest one endpoint's try in a keep-alive round may take (TTL / 6), or zero.
  std::chrono::milliseconds keepalive_timeout() const noexcept { return lease_.timeout(); }
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
      authorized(ep, op, key, nullptr, {}, [&](http_headers headers) {
        const http_request req{"POST", target, std::move(headers), body};
        if (probe) probes_.fetch_add(1, std::memory_order_relaxed);
        http_response resp = pool_.call(ep, req, timeouts(), http_resend::on_stale, nullptr);
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
      authorized(ep, op, key, nullptr, {}, [&](http_headers headers) {
        const http_request req{"POST", target, std::move(headers), body};
        const std::string url = ep.url() + target;
        const auto window = kv_call_deadline::cap(opts_.request_timeout);
        const auto deadline = clock::now() + window;
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
            throw error(ETIMEDOUT, "recv", url,
                        "no watch message within " + std::to_string(window.count()) + " ms");
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

  /// Revokes the lease now (etcd deletes every key attached to it: the leased keys) and stops
  /// the keep-alives; later writes carry no lease. Does nothing without a lease or when already
  /// revoked.
  void revoke_lease() { lease_.revoke(); }

 private:
  using clock = std::chrono::steady_clock;

  // Whether the pool may resend a request whose reused connection closed unanswered: a read
  // may; a write, which etcd may have applied before the connection dropped, may not.
  static http_resend resend_for(etcd_request kind) noexcept {
    return kind == etcd_request::read ? http_resend::on_stale : http_resend::never;
  }

  // The options' timeouts, cut to the time left before the caller's kv_call_deadline.
  // The whole call (connect, then the exchange) ends by that deadline: `until`. A non-zero
  // `attempt` cuts both, and the whole try on this endpoint, to that much from now.
  http_timeouts timeouts(std::chrono::milliseconds attempt = std::chrono::milliseconds(0)) const {
    auto connect = opts_.connect_timeout, request = opts_.request_timeout;
    std::optional<clock::time_point> until = kv_call_deadline::current();
    if (attempt.count() > 0) {
      connect = std::min(connect, attempt);
      request = std::min(request, attempt);
      const auto end = clock::now() + attempt;
      if (!until || end < *until) until = end;
    }
    return http_timeouts{kv_call_deadline::cap(connect), kv_call_deadline::cap(request), until};
  }

  // Throws ETIMEDOUT (transient) once the caller's kv_call_deadline has passed: no endpoint is
  // tried after it. `failures` are those of the endpoints tried before.
  static void check_call_deadline(const std::string& op, const std::string& key,
                                  const std::string& failures = {}) {
    if (kv_call_deadline::passed())
      throw error(ETIMEDOUT, op, key,
                  "the caller's deadline (kv_call_deadline) passed" +
                      (failures.empty() ? std::string() : " after: " + failures));
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
    o.leased_prefix = normalize_prefix(o.leased_prefix, "etcd leased_prefix");
    if (o.lease_ttl.count() > 0 && o.leased_prefix.empty())
      throw error(EINVAL, "etcd lease", "",
                  "lease_ttl without leased_prefix: the lease goes only on keys below "
                  "leased_prefix (liveness keys), never on keys that record decisions");
    if (o.lease_ttl.count() <= 0 && !o.leased_prefix.empty())
      throw error(EINVAL, "etcd lease", o.leased_prefix, "leased_prefix without a lease_ttl");
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
    if (!out.front().tls && !o.user.empty() && !o.allow_plaintext_auth)
      for (const auto& ep : out)
        if (!http_loopback_host(ep.host))
          throw error(EINVAL, "etcd auth", ep.url(),
                      "user '" + o.user +
                          "' would send its password in clear text to an http:// endpoint that "
                          "is not loopback: use https:// (etcds:// in a store URL), or set "
                          "etcd_options::allow_plaintext_auth on a trusted network");
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
  // `attempt` bounds an authentication as timeouts(attempt) does.
  template <class Fn>
  void authorized(const http_endpoint& ep, const std::string& op, const std::string& key,
                  const std::atomic<bool>* cancel, std::chrono::milliseconds attempt,
                  Fn&& fn) const {
    if (opts_.user.empty()) return fn(headers_with(nullptr));
    for (int round = 0;; ++round) {
      const std::string tok = token(ep, op, key, cancel, attempt);
      try {
        return fn(headers_with(&tok));
      } catch (const etcd_unauthenticated&) {
        if (round > 0) throw;
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
                    const std::atomic<bool>* cancel, std::chrono::milliseconds attempt) const {
    {
      std::lock_guard<std::mutex> lock(auth_mutex_);
      if (token_) return *token_;
    }
    std::string fresh = authenticate(ep, op, key, cancel, attempt);
    std::lock_guard<std::mutex> lock(auth_mutex_);
    token_ = fresh;
    return fresh;
  }

  // POST /v3/auth/authenticate; never puts the password or the token in an error.
  std::string authenticate(const http_endpoint& ep, const std::string& op, const std::string& key,
                           const std::atomic<bool>* cancel,
                           std::chrono::milliseconds attempt) const {
    const std::string target = "/v3/auth/authenticate";
    const std::string url = ep.url() + target;
    const http_request req{
        "POST", target, headers_with(nullptr),
        "{\"name\":" + json_quote(opts_.user) + ",\"password\":" + json_quote(password_) + "}"};
    // a token request changes nothing etcd keeps: safe to send again
    http_response resp = pool_.call(ep, req, timeouts(attempt), http_resend::on_stale, cancel);
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
                  who + ": " + http_body_excerpt(text) + " (gRPC code " + std::to_string(c) + ")");
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
      check_call_deadline(op, key, failures);
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
    check_call_deadline(op, key);
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
        throw error(
            EIO, op, key,
            "etcd answered status " + std::to_string(status) + ": " + http_body_excerpt(body));
      throw error(EPROTO, op, key, "malformed reply from etcd: " + std::string(e.what()));
    }
    if (const json_value* err = v.is_object() ? v.find("error") : nullptr)
      throw_gateway_error(v, *err, url, op, key);
    if (status != 200 || !v.is_object())
      throw error(
          EIO, op, key,
          "etcd answered status " + std::to_string(status) + ": " + http_body_excerpt(body));
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
    std::string detail = "etcd error: " + http_body_excerpt(text) + " (gRPC code " +
                         std::to_string(c) + ", " + url + ")";
    if (text.find("user name is empty") != std::string::npos)
      detail +=
          "; the cluster requires authentication: set a user and a password file or "
          "variable (user=...&password_file=... in an etcds:// URL)";
    if (etcd_token_problem(c, text)) throw etcd_unauthenticated(EACCES, op, key, detail);
    throw error(etcd_errno(c, text), op, key, detail);
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
  // declared last: its thread uses everything above, and is stopped before any of it goes
  mutable etcd_lease<etcd_client> lease_;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
