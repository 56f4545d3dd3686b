// holdfast/kv/any.hpp — any_kv: one type that holds any coordination store.
//
// The handler is a template over its store; a host that chooses the store at run time (from a
// URL, from a Python argument) would otherwise compile one handler per store. any_kv erases the
// store's type: it holds any type with the four operations the handler needs (insert, put,
// try_get, get; see is_coordination_store_v) and forwards the optional ones (list, erase,
// erase_prefix, get_many, watch) when the held store has them, so a handler over an any_kv takes
// the same path as over the concrete type (over etcd and a directory: the event-driven watch).
//
//   holdfast::any_kv kv = holdfast::make_kv("etcd://10.0.0.5:2379/jobs", {"run-7", 0});
//   holdfast::preemption_handler<holdfast::presets::generic, holdfast::any_kv> h(...);
//
// Guarantees:
//   - Every call forwards to the held store unchanged (same errors, same values); one virtual
//     call per operation, and one per call on a watch.
//   - supports(kv_op) says which optional operations the held store has (kv_supports: a held
//     store that answers at run time is asked in turn); calling one it lacks throws
//     holdfast::error(ENOTSUP) naming the operation and the key or prefix. The handler asks
//     (kv_supports) and falls back: it reads each task's key instead of listing, and waits in
//     blocking gets where there is no watch.
//   - watch(prefix) returns an any_kv_watch that forwards fd(), buffered(), due() and take() to
//     the held store's watch, and follow(keys) where that watch has it (ignored otherwise);
//     watch(prefix, kv_watch_events::writes) asks the held store for a writes-only watch where
//     it has one (filesystem_kv), else for its plain watch.
//   - leases(key) and lease_ttl() answer for the held store (has_kv_leases_v: etcd_kv), false
//     and 0 s for a store without leases; so kv_lease_ttl(any_kv, key) is the held store's.
//   - stats_as<T>() returns the held store's stats() when they are a T (etcd_kv: etcd_stats),
//     else nullopt.
//   - Copies share the held store (as the backends' own handles do).
// Caveats:
//   - any_kv itself satisfies kv_store and has_kv_watch_v / has_kv_get_many_v (every member
//     exists); use supports() or kv_supports() rather than the compile-time traits to learn what
//     it can do.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>  // stats_as: the held store's stats type
#include <utility>
#include <vector>

#include "../kv.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {
template <class T>
using kv_erase_bool = decltype(bool(std::declval<T&>().erase(std::declval<const std::string&>())));
template <class T>
using kv_erase_prefix_count =
    decltype(std::size_t(std::declval<T&>().erase_prefix(std::declval<const std::string&>())));
template <class T>
using kv_stats = decltype(std::declval<const T&>().stats());

[[noreturn]] inline void kv_unsupported(const char* op, const std::string& key) {
  throw error(ENOTSUP, op, key, "the store behind this any_kv has no such operation");
}
}  // namespace detail

/// A watch of any store's type (kv.hpp, "Waiting on a store"), as any_kv::watch returns it.
/// Move-only; follow(keys) reaches the held watch where it has follow (has_kv_watch_follow_v).
class any_kv_watch {
 public:
  /// Holds `w` (moved in): a watch object with fd(), buffered(), due() and take().
  template <class W, class = std::enable_if_t<!std::is_same_v<std::decay_t<W>, any_kv_watch>>>
  explicit any_kv_watch(W w) : impl_(std::make_unique<model<W>>(std::move(w))) {
    static_assert(detail::detect<detail::kv_watch_members, W>::value,
                  "holdfast: a watch needs fd(), buffered(), due() and take()");
  }

  /// The held watch's descriptor (-1 when it has none now).
  int fd() const noexcept { return impl_->fd(); }
  /// Whether the held watch has changes in memory already.
  bool buffered() const noexcept { return impl_->buffered(); }
  /// When take() must be called although fd() is quiet.
  std::chrono::steady_clock::time_point due() const noexcept { return impl_->due(); }
  /// What changed since the last take().
  kv_changes take() { return impl_->take(); }
  /// Forwards follow(keys) where the held watch waits on named keys; otherwise nothing to do.
  void follow(const std::vector<std::string>& keys) { impl_->follow(keys); }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual int fd() const noexcept = 0;
    virtual bool buffered() const noexcept = 0;
    virtual std::chrono::steady_clock::time_point due() const noexcept = 0;
    virtual kv_changes take() = 0;
    virtual void follow(const std::vector<std::string>&) = 0;
  };

  template <class W>
  struct model final : concept_t {
    explicit model(W watch) : w(std::move(watch)) {}
    int fd() const noexcept override { return w.fd(); }
    bool buffered() const noexcept override { return w.buffered(); }
    std::chrono::steady_clock::time_point due() const noexcept override { return w.due(); }
    kv_changes take() override { return w.take(); }
    void follow(const std::vector<std::string>& keys) override {
      if constexpr (has_kv_watch_follow_v<W>)
        w.follow(keys);
      else
        static_cast<void>(keys);
    }
    W w;
  };

  std::unique_ptr<concept_t> impl_;
};

/// A coordination store of any type, chosen at run time (see the top of kv/any.hpp).
class any_kv {
 public:
  /// Holds `kv` (moved in); it must have insert, put, try_get and get.
  template <class Kv, class = std::enable_if_t<!std::is_same_v<std::decay_t<Kv>, any_kv>>>
  explicit any_kv(Kv kv) : impl_(std::make_shared<model<Kv>>(std::move(kv))) {
    static_assert(check_coordination_store<Kv>());
  }

  /// Forwards insert (insert-once): true when this call created the key.
  bool insert(const std::string& key, std::string_view value) { return impl_->insert(key, value); }
  /// Forwards put.
  void put(const std::string& key, std::string_view value) { impl_->put(key, value); }
  /// Forwards try_get.
  std::optional<std::string> try_get(const std::string& key) { return impl_->try_get(key); }
  /// Forwards the blocking get.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) {
    return impl_->get(key, timeout);
  }
  /// Forwards list; holdfast::error(ENOTSUP) when the held store cannot list.
  kv_pairs list(const std::string& prefix) { return impl_->list(prefix); }
  /// Forwards erase; holdfast::error(ENOTSUP) when the held store cannot erase.
  bool erase(const std::string& key) { return impl_->erase(key); }
  /// Forwards erase_prefix; holdfast::error(ENOTSUP) when the held store has none.
  std::size_t erase_prefix(const std::string& prefix) { return impl_->erase_prefix(prefix); }
  /// Forwards the batched get; holdfast::error(ENOTSUP), naming the first key, when the held
  /// store has none (the free holdfast::get_many falls back to single gets instead).
  std::vector<std::optional<std::string>> get_many(const std::vector<std::string>& keys,
                                                   std::chrono::milliseconds timeout) {
    return impl_->get_many(keys, timeout);
  }
  /// Forwards watch(prefix, events) (a held store without the events overload gets
  /// watch(prefix): waking for erases too is always allowed); holdfast::error(ENOTSUP) when the
  /// held store cannot be waited on.
  any_kv_watch watch(const std::string& prefix, kv_watch_events events = kv_watch_events::all) {
    return impl_->watch(prefix, events);
  }

  /// True when the held store has `op` (insert, put, try_get and get always).
  bool supports(kv_op op) const noexcept { return impl_->supports(op); }
  /// True when the held store puts `key` with a lease (has_kv_leases_v: etcd_kv with a
  /// leased_prefix covering it); false for a store without leases.
  bool leases(std::string_view key) const noexcept { return impl_->lease_ttl(key).count() > 0; }
  /// The held store's lease TTL (has_kv_leases_v), or 0 s.
  std::chrono::seconds lease_ttl() const noexcept { return impl_->lease_ttl({}); }

  /// The held store's stats() when it has them and they are a T (etcd_kv: etcd_stats), else
  /// nullopt.
  template <class T>
  std::optional<T> stats_as() const {
    std::optional<T> out;
    impl_->stats(typeid(T), &out);
    return out;
  }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual bool insert(const std::string&, std::string_view) = 0;
    virtual void put(const std::string&, std::string_view) = 0;
    virtual std::optional<std::string> try_get(const std::string&) = 0;
    virtual std::optional<std::string> get(const std::string&, std::chrono::milliseconds) = 0;
    virtual kv_pairs list(const std::string&) = 0;
    virtual bool erase(const std::string&) = 0;
    virtual std::size_t erase_prefix(const std::string&) = 0;
    virtual std::vector<std::optional<std::string>> get_many(const std::vector<std::string>&,
                                                             std::chrono::milliseconds) = 0;
    virtual any_kv_watch watch(const std::string&, kv_watch_events) = 0;
    virtual bool supports(kv_op) const noexcept = 0;
    // kv_lease_ttl of `key`; for an empty key, the held store's lease_ttl() itself.
    virtual std::chrono::seconds lease_ttl(std::string_view key) const noexcept = 0;
    // Emplaces the held store's stats into `out` (a std::optional<S>*) when S is `type`.
    virtual void stats(const std::type_info& type, void* out) const = 0;
  };

  template <class Kv>
  struct model final : concept_t {
    static constexpr bool can_erase = detail::detect<detail::kv_erase_bool, Kv>::value;
    static constexpr bool can_erase_prefix =
        detail::detect<detail::kv_erase_prefix_count, Kv>::value;

    explicit model(Kv k) : kv(std::move(k)) {}
    bool insert(const std::string& k, std::string_view v) override { return kv.insert(k, v); }
    void put(const std::string& k, std::string_view v) override { kv.put(k, v); }
    std::optional<std::string> try_get(const std::string& k) override { return kv.try_get(k); }
    std::optional<std::string> get(const std::string& k, std::chrono::milliseconds t) override {
      return kv.get(k, t);
    }
    kv_pairs list(const std::string& p) override {
      if constexpr (has_kv_list_v<Kv>) return kv.list(p);
      detail::kv_unsupported("kv list", p);
    }
    bool erase(const std::string& k) override {
      if constexpr (can_erase) return kv.erase(k);
      detail::kv_unsupported("kv erase", k);
    }
    std::size_t erase_prefix(const std::string& p) override {
      if constexpr (can_erase_prefix) return kv.erase_prefix(p);
      detail::kv_unsupported("kv erase_prefix", p);
    }
    std::vector<std::optional<std::string>> get_many(const std::vector<std::string>& keys,
                                                     std::chrono::milliseconds t) override {
      if constexpr (has_kv_get_many_v<Kv>) return kv.get_many(keys, t);
      detail::kv_unsupported("kv get_many", keys.empty() ? std::string() : keys.front());
    }
    any_kv_watch watch(const std::string& p, kv_watch_events events) override {
      if constexpr (has_kv_watch_events_v<Kv>) return any_kv_watch(kv.watch(p, events));
      static_cast<void>(events);
      if constexpr (has_kv_watch_v<Kv>) return any_kv_watch(kv.watch(p));
      detail::kv_unsupported("kv watch", p);
    }
    bool supports(kv_op op) const noexcept override {
      switch (op) {
        case kv_op::erase:
          return can_erase && kv_supports(kv, op);
        case kv_op::erase_prefix:
          return can_erase_prefix && kv_supports(kv, op);
        default:
          return kv_supports(kv, op);
      }
    }
    std::chrono::seconds lease_ttl(std::string_view key) const noexcept override {
      if constexpr (has_kv_leases_v<Kv>) {
        if (key.empty()) return std::chrono::seconds(kv.lease_ttl());
      }
      return kv_lease_ttl(kv, key);
    }
    void stats(const std::type_info& type, void* out) const override {
      if constexpr (detail::detect<detail::kv_stats, Kv>::value) {
        using stats_type = std::decay_t<detail::kv_stats<Kv>>;
        if (type == typeid(stats_type))
          static_cast<std::optional<stats_type>*>(out)->emplace(kv.stats());
      } else {
        static_cast<void>(type);
        static_cast<void>(out);
      }
    }
    Kv kv;
  };

  std::shared_ptr<concept_t> impl_;
};

HOLDFAST_NAMESPACE_END
