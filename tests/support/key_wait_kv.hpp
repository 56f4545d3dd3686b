// tests/support/key_wait_kv.hpp — a store that can wait only for named keys to exist, as
// PyTorch's c10d store can (wait(keys, timeout)): its watch cannot follow a prefix, only the
// keys its caller names with follow(keys) (kv.hpp, "Waiting on a store"). It may also read many
// keys in one wait (get_many), which supports(kv_op::get_many) turns on or off at run time.
#pragma once

#include <algorithm>
#include <chrono>
#include <holdfast/detail/waker.hpp>
#include <holdfast/kv/in_process.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace holdfast_test {

/// in_process_kv seen as a key-wait store: the seven operations; watch(prefix), whose watch wakes
/// its eventfd once any key named by its last follow() exists and whose take() then reports
/// resync; and get_many, which supports() reports only when `batched`. Copies share the store
/// and its watches: a write through any copy wakes every watch following that key (writes made
/// through `inner()` directly wake none).
class key_wait_kv {
  struct follower {
    holdfast::detail::waker waker;
    std::set<std::string> keys;  // followed, none seen yet (empty: none)
  };
  struct hub {
    std::mutex mutex;
    std::set<follower*> followers;  // of every open watch
  };

 public:
  /// A watch that follows named keys (see the top of this file).
  class watcher {
   public:
    watcher(watcher&&) noexcept = default;
    watcher& operator=(watcher&&) = delete;
    ~watcher() {
      if (!me_) return;
      std::lock_guard<std::mutex> lock(hub_->mutex);
      hub_->followers.erase(me_.get());
    }
    /// The eventfd, readable once a followed key exists.
    int fd() const noexcept { return me_->waker.fd(); }
    /// True until the first take() (its resync is known already).
    bool buffered() const noexcept { return first_; }
    /// Never: the eventfd is all there is to wait on.
    std::chrono::steady_clock::time_point due() const noexcept {
      return std::chrono::steady_clock::time_point::max();
    }
    /// resync on the first take and after a wake-up; never events.
    holdfast::kv_changes take() {
      holdfast::kv_changes c;
      c.resync = std::exchange(first_, false);
      if (me_->waker.drain()) c.resync = true;
      return c;
    }
    /// Wakes fd() once one of `keys` exists (at once when one exists already); replaces the
    /// keys before.
    void follow(const std::vector<std::string>& keys) {
      std::lock_guard<std::mutex> lock(hub_->mutex);
      me_->keys = std::set<std::string>(keys.begin(), keys.end());
      for (const auto& k : keys)
        if (kv_.try_get(k)) return wake(*me_);
    }

   private:
    friend class key_wait_kv;
    watcher(std::shared_ptr<hub> h, holdfast::in_process_kv kv)
        : hub_(std::move(h)), kv_(std::move(kv)), me_(std::make_unique<follower>()) {
      std::lock_guard<std::mutex> lock(hub_->mutex);
      hub_->followers.insert(me_.get());
    }
    std::shared_ptr<hub> hub_;
    holdfast::in_process_kv kv_;
    std::unique_ptr<follower> me_;
    bool first_ = true;
  };

  /// Over `inner`; with get_many when `batched`.
  explicit key_wait_kv(holdfast::in_process_kv inner, bool batched = true)
      : inner_(std::move(inner)), hub_(std::make_shared<hub>()), batched_(batched) {}

  bool insert(const std::string& k, std::string_view v) {
    const bool created = inner_.insert(k, v);
    if (created) written(k);
    return created;
  }
  void put(const std::string& k, std::string_view v) {
    inner_.put(k, v);
    written(k);
  }
  std::optional<std::string> try_get(const std::string& k) { return inner_.try_get(k); }
  std::optional<std::string> get(const std::string& k, std::chrono::milliseconds t) {
    return inner_.get(k, t);
  }
  holdfast::kv_pairs list(const std::string& p) { return inner_.list(p); }
  bool erase(const std::string& k) { return inner_.erase(k); }
  std::size_t erase_prefix(const std::string& p) { return inner_.erase_prefix(p); }

  /// Waits until every key exists or `timeout` passed (each a wait on the in-process store's
  /// condition); nullopt for the keys still missing.
  std::vector<std::optional<std::string>> get_many(const std::vector<std::string>& keys,
                                                   std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(deadline - std::chrono::steady_clock::now(),
                   std::chrono::steady_clock::duration::zero()));
      out.push_back(inner_.get(k, left));
    }
    return out;
  }

  /// A watch below `prefix` that wakes only for the key it follows.
  watcher watch(const std::string& prefix) {
    holdfast::normalize_prefix(prefix, "kv watch");
    return watcher(hub_, inner_);
  }

  /// get_many only when batched; everything else always.
  bool supports(holdfast::kv_op op) const noexcept {
    return op != holdfast::kv_op::get_many || batched_;
  }

  /// The store underneath (its writes wake no watch).
  holdfast::in_process_kv& inner() noexcept { return inner_; }

 private:
  static void wake(follower& f) {
    f.keys.clear();
    f.waker.notify();
  }
  // Wakes the watches following `key` (it exists now).
  void written(const std::string& key) {
    std::lock_guard<std::mutex> lock(hub_->mutex);
    for (follower* f : hub_->followers)
      if (f->keys.count(key)) wake(*f);
  }

  holdfast::in_process_kv inner_;
  std::shared_ptr<hub> hub_;
  bool batched_;
};

}  // namespace holdfast_test
