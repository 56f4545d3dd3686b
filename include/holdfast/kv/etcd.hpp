// holdfast/kv/etcd.hpp — a kv_store on etcd v3, through its JSON gateway (etcd 3.4+).
//
// Each operation is one HTTP POST to one of the configured endpoints (detail/http.hpp); keys
// and values travel base64-encoded in JSON, as the gateway requires. A job's keys live under
// `<prefix>/<run id>/<incarnation>/` in etcd.
//
// Guarantees:
//   - insert is one txn comparing the key's create_revision with 0: exactly one of any number of
//     concurrent inserters (threads, processes, hosts) gets true.
//   - get is a range, then a watch starting at the range's revision + 1: no polling, and no put
//     between the two is missed. A watch lasts at most `request_timeout`; then get ranges again
//     (which checks the endpoint's health) and watches on from the new revision, so a get whose
//     member freezes under it moves to another within about 2 x request_timeout. It returns
//     std::nullopt at its deadline.
//   - Failover: a request goes to the first endpoint that is not suspect, going round from the
//     last one that answered. An endpoint becomes suspect for `suspect_for` when connecting to it
//     fails, a request to it times out, loses its connection (reset, or closed before the reply
//     was complete) or gets etcd's "unavailable" answer; it is healthy again once it answers.
//     Suspects are tried only when every endpoint is suspect. Within one call each endpoint is
//     tried at most once, and a failed request moves on to the next endpoint:
//       * for every request when nothing was sent (connecting failed);
//       * for reads (try_get, list, get's ranges and watches, lease keep-alives) also after a
//         timeout, a lost connection or an "unavailable" answer;
//       * never for writes that were sent (put, insert, erase, erase_prefix, lease grant and
//         revoke): their outcome is unknown, so they throw that transient error at once and the
//         caller's retry goes to another endpoint.
//     Connecting is bounded by `connect_timeout`, a request by `request_timeout`. The suspect
//     marks are shared by every handle on the client and updated lock-free.
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
// Caveats:
//   - Plain http:// only (no TLS, no auth): run it on a trusted network or through a local
//     proxy.
//   - A write that failed with a transient error may have been applied (a frozen member may even
//     apply it when it resumes): read the key before retrying. An insert retried after its
//     first attempt was applied returns false; values that name their writer tell the two apart.
//   - get's own timeout bounds the wait for the key, not a request: against hung servers its
//     range fails with ETIMEDOUT after request_timeout per endpoint, even when the get's timeout
//     is shorter. While it waits, a get makes one range and one watch per request_timeout.
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
  /// Client URLs, `http://host:port`; failover goes round them in order (see the header).
  std::vector<std::string> endpoints{"http://127.0.0.1:2379"};
  /// Time allowed to connect to one endpoint.
  std::chrono::milliseconds connect_timeout{1000};
  /// Time allowed for one request after connecting, and the longest a get's watch stays open
  /// before get ranges again.
  std::chrono::milliseconds request_timeout{5000};
  /// How long an endpoint that failed to connect, timed out, lost its connection or answered
  /// "unavailable" is skipped while others are not suspect; 0 never skips one.
  std::chrono::milliseconds suspect_for{10000};
  /// Lease time-to-live; 0 means no lease (keys stay until erased).
  std::chrono::seconds lease_ttl{0};
  /// The first segment of every key holdfast writes in etcd.
  std::string prefix = "holdfast";
};

namespace detail {

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
/// (code 2, "context deadline exceeded"), EIO for the rest.
inline int etcd_errno(std::int64_t code, const std::string& text) noexcept {
  if (code == 14) return EAGAIN;
  if (code == 4 || (code == 2 && text == "context deadline exceeded")) return ETIMEDOUT;
  return EIO;
}

/// Whether a request may go to another endpoint after it was sent: reads may, writes (whose
/// outcome is then unknown) may not.
enum class etcd_request { read, write };

/// The connection to an etcd cluster, shared by every handle: endpoints, failover, the lease.
template <class Io>
class etcd_client {
 public:
  /// Parses the endpoints and, with a lease TTL, grants the lease and starts the keep-alives.
  explicit etcd_client(etcd_options opts) : opts_(std::move(opts)) {
    if (opts_.endpoints.empty()) throw error(EINVAL, "etcd connect", "", "no endpoints configured");
    for (const auto& url : opts_.endpoints) endpoints_.push_back(parse_http_url(url));
    suspect_until_ = std::make_unique<std::atomic<clock::rep>[]>(endpoints_.size());
    for (std::size_t k = 0; k < endpoints_.size(); ++k) suspect_until_[k].store(0);
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
    const http_request req{"POST", target, {{"Content-Type", "application/json"}}, body};
    json_value out;
    with_endpoint(kind, op, key, [&](const http_endpoint& ep) {
      http_response resp = http_call<Io>(ep, req, timeouts(), cancel);
      out = reply(resp.status, resp.body, ep.url() + target, op, key);
    });
    return out;
  }

  /// Streams the response to `body` at `target` into `on_line` (one JSON message per call)
  /// until `on_line` returns false, the stream ends, or `deadline`; fails over as a read.
  template <class OnLine>
  void stream(const char* target, const std::string& body, const std::string& op,
              const std::string& key, std::chrono::steady_clock::time_point deadline,
              OnLine on_line) const {
    const http_request req{"POST", target, {{"Content-Type", "application/json"}}, body};
    with_endpoint(etcd_request::read, op, key, [&](const http_endpoint& ep) {
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
        pending.append(bytes.data(), bytes.size());
        for (std::size_t nl; go && (nl = pending.find('\n')) != std::string::npos;) emit(nl);
        return go;
      };
      http_stream<Io>(ep, req, timeouts(), deadline, on_data);
      if (go) emit(std::string::npos);
    });
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

  static bool is_connection_failure(const error& e) {
    const std::string& op = e.operation();
    return op == "connect" || op == "resolve" || op == "socket";
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
  }

  void mark_good(std::size_t k) const {
    if (suspect_until_[k].load() != 0) suspect_until_[k].store(0);
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
    json_value v;
    try {
      v = parse_json(body, url);
    } catch (const error& e) {
      throw error(EPROTO, op, key, "malformed reply from etcd: " + std::string(e.what()));
    }
    if (const json_value* err = v.is_object() ? v.find("error") : nullptr)
      throw gateway_error(v, *err, url, op, key);
    if (status != 200 || !v.is_object())
      throw error(EIO, op, key, "etcd answered status " + std::to_string(status) + ": " + body);
    return v;
  }

  // A gateway error: {"error":"msg","code":N,"message":"msg"} for a call, or
  // {"error":{"grpc_code":N,"message":"msg",...}} inside a stream.
  static error gateway_error(const json_value& v, const json_value& err, const std::string& url,
                             const std::string& op, const std::string& key) {
    const bool nested = err.is_object();
    const json_value* code = nested ? err.find("grpc_code") : v.find("code");
    const json_value* msg = nested ? err.find("message") : &err;
    const std::string text = msg && msg->is_string() ? msg->as_string() : to_json(err);
    const std::int64_t c = code && code->is_integer() ? code->as_int64() : -1;
    return error(etcd_errno(c, text), op, key,
                 "etcd error: " + text + " (gRPC code " + std::to_string(c) + ", " + url + ")");
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
    const auto period = std::max<std::chrono::milliseconds>(
        std::chrono::milliseconds(100), std::chrono::milliseconds(opts_.lease_ttl) / 3);
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
  std::unique_ptr<std::atomic<clock::rep>[]> suspect_until_;  // steady_clock ticks; 0: healthy
  mutable std::atomic<std::size_t> current_{0};               // the last endpoint that answered
  std::atomic<std::int64_t> lease_id_{0};
  std::atomic<bool> lease_alive_{false};
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::atomic<bool> cancel_{false};
  std::thread keepalive_;
};

}  // namespace detail

/// A kv_store on etcd v3 (see the header comment); `Io` carries the socket calls.
template <class Io = posix_io>
class basic_etcd_kv {
 public:
  /// Connects lazily (no request is made unless a lease is wanted); throws holdfast::error on a
  /// malformed endpoint URL, an invalid prefix, or a lease that cannot be granted.
  basic_etcd_kv(etcd_options options, kv_namespace ns)
      : basic_etcd_kv(std::make_shared<detail::etcd_client<Io>>(checked(std::move(options))),
                      std::move(ns)) {}

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

  basic_etcd_kv(std::shared_ptr<detail::etcd_client<Io>> client, kv_namespace ns)
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
      return on_watch(msg, key, created, value);
    });
    if (!value && !created && std::chrono::steady_clock::now() < window)
      throw error(EPROTO, "etcd get", key, "the watch stream ended before it was created");
    return value;
  }

  // One watch message: notes `created`, takes the first put's value; false to stop watching.
  static bool on_watch(const detail::json_value& msg, const std::string& key, bool& created,
                       std::optional<std::string>& value) {
    const detail::json_value* result = msg.find("result");
    if (!result) return true;
    if (const auto* c = result->find("created"); c && c->is_bool())
      created = created || c->as_bool();
    if (const auto* c = result->find("canceled"); c && c->is_bool() && c->as_bool())
      return false;  // e.g. compacted: range again
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

  std::shared_ptr<detail::etcd_client<Io>> client_;
  kv_namespace ns_;
  std::string root_;
};

/// The etcd store with the default (POSIX) Io policy.
using etcd_kv = basic_etcd_kv<>;

HOLDFAST_NAMESPACE_END
