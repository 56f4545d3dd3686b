// holdfast/kv/in_process.hpp — a kv_store for the threads of one process.
//
// A std::map behind one mutex, with a condition variable that wakes blocked `get`s. The store
// itself is shared: copies of an `in_process_kv` (and `with_namespace` views) are cheap handles
// onto the same map, so each thread can hold its own handle.
//
// Guarantees:
//   - Every operation is atomic with respect to the others (one mutex); insert-once is exact.
//   - A blocked `get` wakes as soon as the key is inserted or put (no polling), and returns
//     std::nullopt no later than its timeout (plus scheduling delay).
//   - Key validation and namespacing as described in holdfast/kv.hpp.
// Caveats:
//   - Not visible to other processes; use filesystem_kv or etcd_kv for those.
//   - Every write wakes every blocked get (one condition variable); fine for the handful of
//     waiters a step agreement has.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "../kv.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// A kv_store shared by the threads of one process; copies are handles onto the same store.
class in_process_kv {
 public:
  /// A new, empty store, seen through namespace `ns`.
  explicit in_process_kv(kv_namespace ns)
      : state_(std::make_shared<state>()), ns_(std::move(ns)), root_(ns_.path() + "/") {}

  /// Another handle on the same store, scoped to namespace `ns`.
  in_process_kv with_namespace(kv_namespace ns) const { return in_process_kv(state_, ns); }
  /// This handle's namespace.
  const kv_namespace& ns() const noexcept { return ns_; }

  /// Stores `value` under `key` unless the key exists; true when it was stored.
  bool insert(const std::string& key, std::string_view value) {
    validate_key(key, "kv insert");
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!state_->data.emplace(root_ + key, std::string(value)).second) return false;
    }
    state_->changed.notify_all();
    return true;
  }

  /// Stores `value` under `key`, replacing any previous value.
  void put(const std::string& key, std::string_view value) {
    validate_key(key, "kv put");
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->data[root_ + key] = std::string(value);
    }
    state_->changed.notify_all();
  }

  /// The value of `key`, or std::nullopt when it does not exist.
  std::optional<std::string> try_get(const std::string& key) const {
    validate_key(key, "kv try_get");
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->data.find(root_ + key);
    if (it == state_->data.end()) return std::nullopt;
    return it->second;
  }

  /// Waits until `key` exists and returns its value, or std::nullopt after `timeout`.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) const {
    validate_key(key, "kv get");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::string full = root_ + key;
    std::unique_lock<std::mutex> lock(state_->mutex);
    for (;;) {
      auto it = state_->data.find(full);
      if (it != state_->data.end()) return it->second;
      if (state_->changed.wait_until(lock, deadline) == std::cv_status::timeout) {
        it = state_->data.find(full);
        if (it != state_->data.end()) return it->second;
        return std::nullopt;
      }
    }
  }

  /// Every key strictly below `prefix + "/"` (all keys for ""), sorted, with its value.
  kv_pairs list(const std::string& prefix) const {
    const std::string start = scope(prefix, "kv list");
    kv_pairs out;
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (auto it = state_->data.lower_bound(start);
         it != state_->data.end() && it->first.compare(0, start.size(), start) == 0; ++it)
      out.emplace_back(it->first.substr(root_.size()), it->second);
    return out;
  }

  /// Removes `key`; true when it existed.
  bool erase(const std::string& key) {
    validate_key(key, "kv erase");
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->data.erase(root_ + key) > 0;
  }

  /// Removes every key strictly below `prefix + "/"` (all keys for ""); returns how many.
  std::size_t erase_prefix(const std::string& prefix) {
    const std::string start = scope(prefix, "kv erase_prefix");
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto first = state_->data.lower_bound(start);
    auto last = first;
    std::size_t n = 0;
    while (last != state_->data.end() && last->first.compare(0, start.size(), start) == 0) {
      ++last;
      ++n;
    }
    state_->data.erase(first, last);
    return n;
  }

 private:
  struct state {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::string, std::string> data;  // full key ("run/incarnation/key") -> value
  };

  in_process_kv(std::shared_ptr<state> s, kv_namespace ns)
      : state_(std::move(s)), ns_(std::move(ns)), root_(ns_.path() + "/") {}

  // The full-key prefix that `prefix` covers: "run/inc/" or "run/inc/prefix/".
  std::string scope(const std::string& prefix, const char* op) const {
    std::string p = normalize_prefix(prefix, op);
    return p.empty() ? root_ : root_ + p + "/";
  }

  std::shared_ptr<state> state_;
  kv_namespace ns_;
  std::string root_;
};

HOLDFAST_NAMESPACE_END
