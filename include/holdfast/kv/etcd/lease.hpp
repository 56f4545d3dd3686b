// holdfast/kv/etcd/lease.hpp — the lease of one etcd client (kv/etcd/client.hpp): granted when
// the client is made, kept alive from one background thread, granted again when etcd no longer
// holds it, with the leased keys the client wrote put back under the new one.
//
// Guarantees:
//   - Keep-alives: one round every TTL / 3 (period()). In a round each endpoint is tried for at
//     most TTL / 6 (timeout(): connecting and the answer together) and the next at once (the
//     client's failover; the one that did not answer becomes suspect), so a member that accepts
//     connections and never answers (SIGSTOP, a frozen VM) costs a round TTL / 6 and the lease
//     is renewed by another member within the same period: it lives while a quorum answers. A
//     round in which no endpoint answered is tried again TTL / 6 later, not a period later.
//   - A lease lost anyway (etcd answers a keep-alive with TTL 0 or "requested lease not found":
//     the process was paused, or cut off, past the TTL; the lease was revoked by someone else)
//     is granted again in the same round, and each leased key the client wrote is put back with
//     the new lease and the value it last wrote there, where the key does not exist (an insert:
//     a key someone wrote meanwhile stays theirs). A leased write that etcd refuses for the lost
//     lease fails as before ("requested lease not found", EIO) and wakes the thread at once; the
//     key comes back with the others.
//   - alive() is true only while etcd holds the lease as far as the client can know: false from a
//     keep-alive answer that says it is gone, and once TTL has passed since the last renewal was
//     sent (no answer since: cut off), until a new lease is granted.
//   - Leased writes (put, insert; erases, which forget what they delete) are serialized with the
//     re-grant: a key put back is never older than a write that returned before it.
//   - stop() ends the thread within ~20 ms, even with a request in flight (it is cancelled).
// Caveats:
//   - A new lease has a new ID (id() changes); a key put back is a new write (a watch sees it).
//   - The client remembers the last value of each leased key it wrote until it erases it: keep
//     leased keys few and small (one liveness key per worker).
//   - A grant sent to a member that then hangs may be applied when it resumes: that lease holds
//     no key and expires after its TTL.
//   - A lease revoked by another client reads alive() until the next round (TTL / 3 at most).
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "../../detail/json.hpp"
#include "../../error.hpp"
#include "gateway.hpp"  // etcd_request, etcd_int, etcd_put_json, etcd_insert_json, ...

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The lease of one etcd client (see the header). `Client` is the etcd_client that owns it: its
/// `call(kind, target, body, op, key, cancel, attempt)` sends each request.
template <class Client>
class etcd_lease {
 public:
  using clock = std::chrono::steady_clock;

  /// A lease of `ttl` (0 s: none) for `client`; nothing is granted before start().
  etcd_lease(const Client& client, std::chrono::seconds ttl) noexcept
      : client_(client), ttl_(ttl) {}
  etcd_lease(const etcd_lease&) = delete;
  etcd_lease& operator=(const etcd_lease&) = delete;
  /// Stops the keep-alives; the lease is not revoked.
  ~etcd_lease() { stop(); }

  /// Grants the lease (with the client's own timeouts) and starts the keep-alives; throws as
  /// the grant does.
  void start() {
    grant(std::chrono::milliseconds(0), nullptr);
    thread_ = std::thread([this] { loop(); });
  }

  /// The lease ID writes of leased keys carry now; 0 without a lease or once revoked.
  std::int64_t id() const noexcept { return id_.load(); }
  /// True while etcd holds the lease as far as the client knows (see the header).
  bool alive() const noexcept {
    return held_.load() && clock::now().time_since_epoch().count() < expires_.load();
  }
  /// The keep-alive period: TTL / 3 (at least 100 ms); zero without a lease.
  std::chrono::milliseconds period() const noexcept {
    if (ttl_.count() <= 0) return std::chrono::milliseconds(0);
    return std::max<std::chrono::milliseconds>(std::chrono::milliseconds(100),
                                               std::chrono::milliseconds(ttl_) / 3);
  }
  /// The longest one endpoint's attempt in a keep-alive round may take (TTL / 6); zero without
  /// a lease.
  std::chrono::milliseconds timeout() const noexcept { return std::chrono::milliseconds(ttl_) / 6; }

  /// Puts `value` under the full etcd key `full` with the lease (`key`, in its handle's
  /// namespace, names it in errors) and remembers it, to put it back under a new lease.
  void put(const std::string& full, const std::string& key, std::string_view value) {
    std::lock_guard<std::mutex> lock(writes_);
    const std::int64_t lease = id_.load();
    if (lease != 0) keys_[full] = std::string(value);
    noticing_loss([&] {
      client_.call(etcd_request::write, "/v3/kv/put", etcd_put_json(full, value, lease), "etcd put",
                   key);
    });
  }

  /// Inserts `value` under `full` with the lease unless the key exists; remembers it when it
  /// did. True when it did.
  bool insert(const std::string& full, const std::string& key, std::string_view value) {
    std::lock_guard<std::mutex> lock(writes_);
    const std::int64_t lease = id_.load();
    const bool done = noticing_loss([&] {
      return etcd_txn_succeeded(client_.call(etcd_request::write, "/v3/kv/txn",
                                             etcd_insert_json(full, value, lease), "etcd insert",
                                             key));
    });
    if (done && lease != 0) keys_[full] = std::string(value);
    return done;
  }

  /// Runs `erase()`, which deletes the etcd key `full` (with `prefix`: every key starting with
  /// it), after forgetting the remembered keys it deletes: they are not put back.
  template <class Erase>
  auto erasing(const std::string& full, bool prefix, Erase&& erase) {
    std::lock_guard<std::mutex> lock(writes_);
    if (!prefix)
      keys_.erase(full);
    else
      for (auto it = keys_.lower_bound(full); it != keys_.end() && it->first.rfind(full, 0) == 0;)
        it = keys_.erase(it);
    return erase();
  }

  /// Stops the keep-alives and revokes the lease (etcd deletes its keys at once); later writes
  /// carry none. Does nothing without a lease or when revoked already.
  void revoke() {
    const std::int64_t id = id_.load();
    if (id == 0) return;
    stop();
    std::lock_guard<std::mutex> lock(writes_);
    client_.call(etcd_request::write, "/v3/lease/revoke", "{\"ID\":\"" + std::to_string(id) + "\"}",
                 "etcd lease revoke", "");
    held_ = false;
    id_ = 0;
    keys_.clear();
  }

  /// Stops and joins the keep-alive thread (a request in flight is cancelled). Idempotent.
  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cancel_ = true;
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    clock::time_point next = clock::now() + period();
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait_until(lock, next, [this] { return stopping_ || woken_; });
      if (stopping_) return;
      woken_ = false;
      lock.unlock();
      next = round();
      lock.lock();
    }
  }

  // One round: a keep-alive, then (when etcd lost the lease) a new lease and the remembered
  // keys put back. Returns when the next round is due: a period after the renewal was sent (or
  // after a new lease), timeout() after a round in which no endpoint answered in time.
  clock::time_point round() {
    const auto sent = clock::now();
    try {
      const bool renewed = held_.load() && renew(sent);
      restore();
      return (renewed ? sent : clock::now()) + period();
    } catch (const std::exception&) {  // the next round tries again, soon
      return clock::now() + timeout();
    }
  }

  // One keep-alive, each endpoint tried for timeout(): true when etcd renewed the lease; false
  // (and held_ cleared) when etcd says the lease is gone. Throws when no endpoint answered.
  bool renew(clock::time_point sent) {
    json_value r;
    try {
      r = client_.call(etcd_request::read, "/v3/lease/keepalive",
                       "{\"ID\":\"" + std::to_string(id_.load()) + "\"}", "etcd lease keepalive",
                       "", &cancel_, timeout());
    } catch (const error& e) {
      if (!etcd_lease_not_found(e)) throw;
      held_ = false;
      return false;
    }
    const json_value* result = r.find("result");
    if (!result) throw error(EPROTO, "etcd lease keepalive", "", "reply without a result");
    const std::int64_t ttl = etcd_int(result->find("TTL"));
    if (ttl <= 0) {  // TTL 0 (or absent) in the answer: etcd no longer holds the lease
      held_ = false;
      return false;
    }
    expires_ = (sent + std::chrono::seconds(ttl)).time_since_epoch().count();
    return true;
  }

  // When etcd lost the lease: grants a new one, then puts each remembered key back with it
  // where the key does not exist. Throws as a request does; the next round goes on from there.
  // With the lease held and nothing left to put back it takes no lock, so a leased write in
  // flight (to a member that stalls) never holds up the next keep-alive.
  void restore() {
    if (held_.load() && !restoring_.load()) return;
    std::lock_guard<std::mutex> lock(writes_);
    if (!held_.load()) {
      grant(timeout(), &cancel_);
      restoring_ = true;
    }
    if (!restoring_) return;
    for (const auto& kv : keys_)
      client_.call(etcd_request::write, "/v3/kv/txn",
                   etcd_insert_json(kv.first, kv.second, id_.load()), "etcd lease restore",
                   kv.first, &cancel_, timeout());
    restoring_ = false;
  }

  // Grants a lease of ttl_ (each endpoint tried for `attempt`; 0: the client's timeouts).
  void grant(std::chrono::milliseconds attempt, const std::atomic<bool>* cancel) {
    const auto sent = clock::now();
    json_value r = client_.call(etcd_request::write, "/v3/lease/grant",
                                "{\"TTL\":" + std::to_string(ttl_.count()) + "}",
                                "etcd lease grant", "", cancel, attempt);
    const std::int64_t id = etcd_int(r.find("ID"));
    if (id == 0) throw error(EPROTO, "etcd lease grant", "", "reply without a lease ID");
    const std::int64_t granted = etcd_int(r.find("TTL"), ttl_.count());
    expires_ = (sent + std::chrono::seconds(granted)).time_since_epoch().count();
    id_ = id;
    held_ = true;
  }

  // Runs `write()`; when etcd refuses it for a lease it no longer holds, wakes the thread (a
  // round now: a new lease, the keys put back) and rethrows.
  template <class Write>
  auto noticing_loss(Write&& write) {
    try {
      return write();
    } catch (const error& e) {
      if (etcd_lease_not_found(e)) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          woken_ = true;
        }
        cv_.notify_all();
      }
      throw;
    }
  }

  const Client& client_;
  const std::chrono::seconds ttl_;
  std::atomic<std::int64_t> id_{0};
  std::atomic<bool> held_{false};       // etcd holds it, as far as the last answer said
  std::atomic<clock::rep> expires_{0};  // the last renewal's send time + TTL, steady ticks
  std::mutex writes_;                   // leased writes, the re-grant; guards keys_; restoring_
                                        // changes under it
  std::map<std::string, std::string> keys_;  // remembered leased keys (full etcd key -> value)
  std::atomic<bool> restoring_{false};       // a new lease; keys_ not all put back yet
  std::mutex mutex_;                         // the thread's wait: stopping_, woken_
  std::condition_variable cv_;
  bool stopping_ = false;
  bool woken_ = false;
  std::atomic<bool> cancel_{false};  // cuts a request in flight (stop)
  std::thread thread_;
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
