// holdfast/kv/etcd/kv.hpp — basic_etcd_kv: the kv_store operations on etcd v3, through its JSON
// gateway (etcd 3.4+): insert, put, try_get, get (waiting), list, erase, erase_prefix, and
// watch(prefix), on a client (kv/etcd/client.hpp) shared by every copy.
//
// A job's keys live under `<prefix>/<run id>/<incarnation>/` in etcd; keys and values travel
// base64-encoded in JSON, as the gateway requires.
//
// Guarantees:
//   - insert is one txn comparing the key's create_revision with 0: exactly one of any number of
//     concurrent inserters (threads, processes, hosts) gets true.
//   - get is a range, then a watch starting at the range's revision + 1: no polling, and no put
//     between the two is missed. A watch lasts at most `request_timeout`; then get ranges again
//     (which checks the endpoint's health) and watches on from the new revision, so a get whose
//     member freezes under it moves to another within about 2 x request_timeout. It returns
//     std::nullopt at its deadline.
//   - list and erase_prefix cover the keys strictly below `prefix + "/"` (all keys for ""), one
//     range or deleterange each; list is sorted.
//   - Failover, errors, the lease, connection reuse and authentication are the client's
//     (kv/etcd/client.hpp, kv/etcd/lease.hpp): reads move on to another endpoint, sent writes
//     never do; a lease etcd lost is granted again and the leased keys put back.
//   - The lease goes on the puts and inserts of keys below etcd_options::leased_prefix only
//     (liveness keys); every other key stays until erased, whoever wrote it and whenever its
//     writer dies, so a value that records a decision is never deleted by a lease expiry.
//     leases(key) and lease_ttl() say which keys carry it and for how long (has_kv_leases_v:
//     the liveness monitor, handler/liveness.hpp, starts only where its keys are leased).
//   - Copies (and with_namespace views) are cheap handles sharing endpoints and lease; every
//     operation is safe to call from several threads at once.
// Caveats:
//   - A write that failed with a transient error may have been applied: read the key before
//     retrying. An insert retried after its first attempt was applied returns false; values that
//     name their writer tell the two apart.
//   - get's own timeout bounds the wait for the key, not a request: against hung servers its
//     range fails with ETIMEDOUT after request_timeout per endpoint, even when the get's timeout
//     is shorter (a kv_call_deadline, kv/call_deadline.hpp, bounds both). While it waits, a get
//     makes one range and one watch per request_timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "../../detail/base64.hpp"
#include "../../detail/json.hpp"
#include "../../error.hpp"
#include "../../io.hpp"  // posix_io
#include "../../kv.hpp"  // kv_namespace, kv_pairs, validate_key, normalize_prefix
#include "client.hpp"    // etcd_client, plain_transport
#include "gateway.hpp"   // etcd_decoded_value, etcd_string_field, etcd_range_json, etcd_int
#include "options.hpp"   // etcd_options, etcd_stats
#include "watch.hpp"     // etcd_watcher: basic_etcd_kv::watcher

HOLDFAST_NAMESPACE_BEGIN

/// A kv_store on etcd v3 (see the header comment); `Io` carries the socket calls, `Transport`
/// makes the connections (plain TCP by default; a TLS transport for https:// endpoints).
template <class Io = posix_io, class Transport = plain_transport<Io>>
class basic_etcd_kv {
  static_assert(check_transport<Transport>());

 public:
  using client_type = detail::etcd_client<Io, Transport>;

  /// Connects lazily (no request is made unless a lease is wanted); throws holdfast::error on a
  /// malformed endpoint URL, an invalid prefix or leased_prefix, a lease_ttl and a leased_prefix
  /// without each other, or a lease that cannot be granted.
  basic_etcd_kv(etcd_options options, kv_namespace ns)
      : basic_etcd_kv(std::make_shared<client_type>(checked(std::move(options))), std::move(ns)) {}

  /// Another handle on the same client and lease, scoped to namespace `ns`.
  basic_etcd_kv with_namespace(kv_namespace ns) const { return basic_etcd_kv(client_, ns); }
  /// This handle's namespace.
  const kv_namespace& ns() const noexcept { return ns_; }
  /// The lease attached to writes of keys below leased_prefix, or 0 without one; a new ID once
  /// a lost lease was granted again.
  std::int64_t lease_id() const noexcept { return client_->lease_id(); }
  /// True only while etcd holds the lease as far as the client knows (a keep-alive found it, a
  /// TTL has not passed since); false while a lost lease is granted again, and once revoked.
  bool lease_alive() const noexcept { return client_->lease_alive(); }
  /// True when puts and inserts of `key` carry the lease (a lease_ttl is set and `key` lies
  /// strictly below leased_prefix + "/"), alive or not: what liveness keys need
  /// (handler/liveness.hpp).
  bool leases(std::string_view key) const noexcept { return client_->leases(key); }
  /// The lease's time-to-live (etcd_options::lease_ttl); 0 without a lease.
  std::chrono::seconds lease_ttl() const noexcept { return client_->options().lease_ttl; }
  /// Revokes the lease: etcd deletes every leased key (below leased_prefix) this client wrote,
  /// at once; later writes carry no lease and nothing is granted again. Idempotent.
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
    return client_->insert(root_ + key, key, value);
  }

  /// Stores `value` under `key`, replacing any previous value.
  void put(const std::string& key, std::string_view value) {
    validate_key(key, "kv put");
    client_->put(root_ + key, key, value);
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
    auto r = client_->call(detail::etcd_request::read, "/v3/kv/range",
                           detail::etcd_range_json(start), "etcd list", prefix);
    kv_pairs out;
    if (const auto* kvs = r.find("kvs"))
      for (const auto& kv : kvs->as_array()) {
        std::string full =
            detail::base64_decode(detail::etcd_string_field(kv, "key", prefix), "etcd list reply");
        if (full.compare(0, start.size(), start) != 0) continue;
        out.emplace_back(full.substr(root_.size()), detail::etcd_decoded_value(kv, prefix));
      }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// What watch(prefix) returns: a long-lived watch (kv/etcd/watch.hpp).
  using watcher = detail::etcd_watcher<Io, Transport>;

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
    return client_->erase(root_ + key, key, false, "etcd erase") > 0;
  }

  /// Removes every key strictly below `prefix + "/"` (all keys for ""); returns how many.
  std::size_t erase_prefix(const std::string& prefix) {
    const std::string start = scope(prefix, "kv erase_prefix");
    return static_cast<std::size_t>(client_->erase(start, prefix, true, "etcd erase_prefix"));
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
      if (!kvs->as_array().empty())
        out.value = detail::etcd_decoded_value(kvs->as_array().front(), key);
    return out;
  }

  // Watches `key` from `revision` for at most request_timeout (and not past `deadline`): the
  // value of the first put, or std::nullopt when the window ends or the watch is closed.
  std::optional<std::string> watch(const std::string& key, std::int64_t revision,
                                   std::chrono::steady_clock::time_point deadline) const {
    auto window =
        std::min(deadline, std::chrono::steady_clock::now() + client_->options().request_timeout);
    if (const auto bound = kv_call_deadline::current()) window = std::min(window, *bound);
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
      const std::string text = "etcd cancelled the watch: " + detail::http_body_excerpt(reason);
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
          value = detail::etcd_decoded_value(*kv, key);
          return false;
        }
      }
    return true;
  }

  std::shared_ptr<client_type> client_;
  kv_namespace ns_;
  std::string root_;
};

/// The etcd store with the default (POSIX) Io policy.
using etcd_kv = basic_etcd_kv<>;

HOLDFAST_NAMESPACE_END
