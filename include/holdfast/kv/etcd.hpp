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
//     between the two is missed. It returns std::nullopt at its deadline; the watch is cut then.
//   - Endpoints are tried in turn, starting from the last one that answered, when connecting
//     fails (refused, unreachable, connect timeout); any other failure is reported at once.
//     Connecting is bounded by `connect_timeout`, a whole request by `request_timeout`.
//   - Every failure throws holdfast::error naming the operation and the key, with the
//     endpoint's own error inside: ECONNREFUSED/ETIMEDOUT/... when no endpoint answered, EPROTO
//     for a malformed HTTP or JSON reply, EIO for an error etcd reported.
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
//   - An insert that times out after etcd applied it is not retried; the key then exists and a
//     retry returns false. Requests are not retried on other endpoints after they were sent.
//   - get's own timeout bounds the wait for the key, not a request: against a hung server its
//     range fails with ETIMEDOUT after request_timeout, even when the get's timeout is shorter.
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
  /// Client URLs, `http://host:port`, tried in order on connection failure.
  std::vector<std::string> endpoints{"http://127.0.0.1:2379"};
  /// Time allowed to connect to one endpoint.
  std::chrono::milliseconds connect_timeout{1000};
  /// Time allowed for one request after connecting (a watch's head; its body runs to the get's
  /// deadline).
  std::chrono::milliseconds request_timeout{5000};
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

/// The connection to an etcd cluster, shared by every handle: endpoints, failover, the lease.
template <class Io>
class etcd_client {
 public:
  /// Parses the endpoints and, with a lease TTL, grants the lease and starts the keep-alives.
  explicit etcd_client(etcd_options opts) : opts_(std::move(opts)) {
    if (opts_.endpoints.empty()) throw error(EINVAL, "etcd connect", "", "no endpoints configured");
    for (const auto& url : opts_.endpoints) endpoints_.push_back(parse_http_url(url));
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

  /// POSTs `body` to `target` and returns the parsed JSON reply; `op` and `key` name the
  /// operation in errors.
  json_value call(const char* target, const std::string& body, const std::string& op,
                  const std::string& key, const std::atomic<bool>* cancel = nullptr) const {
    http_request req{"POST", target, {{"Content-Type", "application/json"}}, body};
    http_response resp;
    std::string url;
    with_endpoint(op, key, [&](const http_endpoint& ep) {
      url = ep.url() + target;
      resp = http_call<Io>(ep, req, http_timeouts{opts_.connect_timeout, opts_.request_timeout},
                           cancel);
    });
    return reply(resp.status, resp.body, url, op, key);
  }

  /// Streams the response to `body` at `target` into `on_line` (one JSON message per call)
  /// until `on_line` returns false, the stream ends, or `deadline`.
  template <class OnLine>
  void stream(const char* target, const std::string& body, const std::string& op,
              const std::string& key, std::chrono::steady_clock::time_point deadline,
              OnLine on_line) const {
    http_request req{"POST", target, {{"Content-Type", "application/json"}}, body};
    with_endpoint(op, key, [&](const http_endpoint& ep) {
      const std::string url = ep.url() + target;
      std::string pending;
      auto on_data = [&](std::string_view bytes) {
        pending.append(bytes.data(), bytes.size());
        std::size_t nl;
        while ((nl = pending.find('\n')) != std::string::npos) {
          std::string line = pending.substr(0, nl);
          pending.erase(0, nl + 1);
          if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
          if (!on_line(reply(200, line, url, op, key))) return false;
        }
        return true;
      };
      http_stream<Io>(ep, req, http_timeouts{opts_.connect_timeout, opts_.request_timeout},
                      deadline, on_data);
      if (pending.find_first_not_of(" \r\t") != std::string::npos)
        on_line(reply(200, pending, url, op, key));
    });
  }

  /// Revokes the lease now (etcd deletes every key attached to it) and stops the keep-alives;
  /// later writes carry no lease. Does nothing without a lease or when already revoked.
  void revoke_lease() {
    const std::int64_t id = lease_id_.load();
    if (id == 0) return;
    stop_keepalive();
    call("/v3/lease/revoke", "{\"ID\":\"" + std::to_string(id) + "\"}", "etcd lease revoke", "");
    lease_alive_ = false;
    lease_id_ = 0;
  }

 private:
  static bool is_connection_failure(const error& e) {
    const std::string& op = e.operation();
    return op == "connect" || op == "resolve" || op == "socket";
  }

  // Runs `fn(endpoint)` on the current endpoint, moving to the next on connection failures.
  template <class Fn>
  void with_endpoint(const std::string& op, const std::string& key, Fn&& fn) const {
    const std::size_t n = endpoints_.size();
    const std::size_t first = current_.load();
    std::string failures;
    int last_errno = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = (first + i) % n;
      try {
        fn(endpoints_[k]);
        if (k != first) current_.store(k);
        return;
      } catch (const error& e) {
        if (!is_connection_failure(e)) {
          if (e.operation().rfind("etcd", 0) == 0) throw;
          throw error(e.errnum(), op, key, e.what());
        }
        last_errno = e.errnum();
        failures += (failures.empty() ? "" : "; ") + std::string(e.what());
      }
    }
    throw error(last_errno, op, key, "no etcd endpoint reachable: " + failures);
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
    if (status != 200 || !v.is_object())
      throw error(EIO, op, key, "etcd answered status " + std::to_string(status) + ": " + body);
    const json_value* err = v.find("error");
    if (err) {  // a gateway error: {"error":"...","code":N,"message":"..."} or {"error":{...}}
      std::string msg = err->is_string() ? err->as_string() : to_json(*err);
      throw error(EIO, op, key, "etcd error: " + msg);
    }
    return v;
  }

  void start_lease() {
    json_value r =
        call("/v3/lease/grant", "{\"TTL\":" + std::to_string(opts_.lease_ttl.count()) + "}",
             "etcd lease grant", "");
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
        json_value r = call("/v3/lease/keepalive", body, "etcd lease keepalive", "", &cancel_);
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
  mutable std::atomic<std::size_t> current_{0};
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
    auto r = client_->call("/v3/kv/txn", body, "etcd insert", key);
    const detail::json_value* ok = r.find("succeeded");
    return ok && ok->is_bool() && ok->as_bool();
  }

  /// Stores `value` under `key`, replacing any previous value.
  void put(const std::string& key, std::string_view value) {
    validate_key(key, "kv put");
    client_->call("/v3/kv/put",
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
      bool created = false;
      std::optional<std::string> value;
      const std::string body =
          "{\"create_request\":{\"key\":" + detail::json_quote(detail::base64_encode(root_ + key)) +
          ",\"start_revision\":\"" + std::to_string(found.revision + 1) + "\"}}";
      client_->stream("/v3/watch", body, "etcd get", key, deadline,
                      [&](const detail::json_value& msg) {
                        const detail::json_value* result = msg.find("result");
                        if (!result) return true;
                        if (const auto* c = result->find("created"); c && c->is_bool())
                          created = created || c->as_bool();
                        if (const auto* c = result->find("canceled"); c && c->as_bool())
                          return false;  // e.g. compacted: range again
                        if (const auto* events = result->find("events"))
                          for (const auto& ev : events->as_array()) {
                            const auto* type = ev.find("type");
                            if (type && type->is_string() && type->as_string() == "DELETE")
                              continue;
                            if (const auto* kv = ev.find("kv")) {
                              value = value_of(*kv, key);
                              return false;
                            }
                          }
                        return true;
                      });
      if (value) return value;
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      if (!created)
        throw error(EPROTO, "etcd get", key, "the watch stream ended before it was created");
      // The server closed a created watch (shutting down, compaction): range again.
    }
  }

  /// Every key strictly below `prefix + "/"` (all keys for ""), sorted, with its value.
  kv_pairs list(const std::string& prefix) const {
    const std::string start = scope(prefix, "kv list");
    auto r = client_->call("/v3/kv/range", range_body(start), "etcd list", prefix);
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
        client_->call("/v3/kv/deleterange",
                      "{\"key\":" + detail::json_quote(detail::base64_encode(root_ + key)) + "}",
                      "etcd erase", key);
    return detail::etcd_int(r.find("deleted")) > 0;
  }

  /// Removes every key strictly below `prefix + "/"` (all keys for ""); returns how many.
  std::size_t erase_prefix(const std::string& prefix) {
    const std::string start = scope(prefix, "kv erase_prefix");
    auto r = client_->call("/v3/kv/deleterange", range_body(start), "etcd erase_prefix", prefix);
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
        "/v3/kv/range", "{\"key\":" + detail::json_quote(detail::base64_encode(root_ + key)) + "}",
        op, key);
    found_value out;
    const detail::json_value* header = r.find("header");
    out.revision = detail::etcd_int(header ? header->find("revision") : nullptr);
    if (const auto* kvs = r.find("kvs"))
      if (!kvs->as_array().empty()) out.value = value_of(kvs->as_array().front(), key);
    return out;
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
