// holdfast/kv/any.hpp — any_kv: one type that holds any coordination store.
//
// The handler is a template over its store; a host that chooses the store at run time (from a
// URL, from a Python argument) would otherwise compile one handler per store. any_kv erases the
// store's type: it holds any type with the four operations the handler needs (insert, put,
// try_get, get; see is_coordination_store_v) and forwards the optional ones (list, erase,
// erase_prefix) when the held store has them.
//
//   holdfast::any_kv kv = holdfast::make_kv("etcd://10.0.0.5:2379/jobs", {"run-7", 0});
//   holdfast::preemption_handler<holdfast::presets::generic, holdfast::any_kv> h(...);
//
// Guarantees:
//   - Every call forwards to the held store unchanged (same errors, same values); one virtual
//     call per operation.
//   - supports(kv_op) says which optional operations the held store has; calling one it lacks
//     throws holdfast::error(ENOTSUP) naming the operation and the key. The handler asks
//     supports() and falls back (it reads each task's key instead of listing).
//   - Copies share the held store (as the backends' own handles do).
// Caveats:
//   - any_kv itself satisfies kv_store (all seven members exist); use supports() rather than the
//     compile-time traits to learn what it can do.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "../kv.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {
template <class T>
using kv_erase_bool = decltype(bool(std::declval<T&>().erase(std::declval<const std::string&>())));
template <class T>
using kv_erase_prefix_count =
    decltype(std::size_t(std::declval<T&>().erase_prefix(std::declval<const std::string&>())));
}  // namespace detail

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

  /// True when the held store has `op` (insert, put, try_get and get always).
  bool supports(kv_op op) const noexcept { return impl_->supports(op); }

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
    virtual bool supports(kv_op) const noexcept = 0;
  };

  template <class Kv>
  struct model final : concept_t {
    static constexpr bool can_list = detail::detect<detail::kv_list, Kv>::value;
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
      if constexpr (can_list) return kv.list(p);
      unsupported("kv list", p);
    }
    bool erase(const std::string& k) override {
      if constexpr (can_erase) return kv.erase(k);
      unsupported("kv erase", k);
    }
    std::size_t erase_prefix(const std::string& p) override {
      if constexpr (can_erase_prefix) return kv.erase_prefix(p);
      unsupported("kv erase_prefix", p);
    }
    bool supports(kv_op op) const noexcept override {
      switch (op) {
        case kv_op::list:
          return can_list;
        case kv_op::erase:
          return can_erase;
        case kv_op::erase_prefix:
          return can_erase_prefix;
        default:
          return true;
      }
    }
    Kv kv;
  };

  [[noreturn]] static void unsupported(const char* op, const std::string& key) {
    throw error(ENOTSUP, op, key, "the store behind this any_kv has no such operation");
  }

  std::shared_ptr<concept_t> impl_;
};

HOLDFAST_NAMESPACE_END
