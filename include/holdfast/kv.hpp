// holdfast/kv.hpp — the coordination key-value store contract shared by every backend.
//
// The step agreement talks to its peers through a small key-value store with the semantics of
// TensorFlow's coordination service: insert-once, a blocking get with a deadline, try-get,
// listing by directory prefix and deletion. Three backends implement it: `in_process_kv`
// (threads of one process), `filesystem_kv` (a shared directory) and `etcd_kv` (etcd v3).
// The handler itself needs only four of the operations (a coordination store: insert, put,
// try_get, get — what PyTorch's c10d store has); listing, erasing, waiting on a store (watch)
// and a batched get (get_many) are used where a store offers them. `any_kv` (kv/any.hpp) holds
// any of them behind one type; `make_kv` (kv/url.hpp) opens one from a URL.
//
// Guarantees:
//   - `kv_store<T>` (C++20) and `is_kv_store_v<T>` / `check_kv_store<T>()` (C++17) check the
//     seven operations; check_kv_store's static_asserts name the first missing member.
//     `check_coordination_store<T>()` checks the four the handler needs.
//   - `kv_supports(kv, op)` says at run time whether a store has an operation: a store with a
//     `supports(kv_op)` member (any_kv, counting_kv) is asked; any other is answered from the
//     compile-time traits (has_kv_list_v, has_kv_watch_v, has_kv_get_many_v, ...).
//   - `get_many(kv, keys, timeout)` reads several keys in one wait: the store's own get_many
//     where kv_supports says it has one, else one get per key (try_get once the timeout passed).
//   - Keys are `/`-separated paths of non-empty segments. A key that is empty, has an empty
//     segment (a leading, trailing or doubled `/`), a `.` or `..` segment, or a NUL byte is
//     rejected with holdfast::error(EINVAL, op, key, why) before any I/O.
//   - Every backend scopes its keys under a `kv_namespace` (run id + incarnation), so a
//     restarted job never reads the keys of its previous incarnation, and two namespaces never
//     see each other's keys (neither part may contain `/`, so no key of one namespace can spell
//     a key of another).
//   - `list(prefix)` and `erase_prefix(prefix)` use directory semantics: they cover every key
//     strictly below `prefix + "/"` (so "acks" covers "acks/0" but neither "acks" itself nor
//     "acks2/0"); an empty prefix covers the whole namespace. A trailing `/` is accepted.
//     Results are sorted by key, bytewise (unsigned), like etcd.
//   - A thread bounds its own store calls with a `kv_call_deadline` scope (kv/call_deadline.hpp):
//     etcd_kv's calls end by it (failing with ETIMEDOUT), whatever their own timeouts.
//   - `kv_lease_ttl(kv, key)` says whether a put of `key` carries a lease (etcd_kv with
//     lease_ttl and a leased_prefix covering it, or an any_kv or counting_kv holding one:
//     has_kv_leases_v) and its TTL; 0 s elsewhere. Liveness keys need one (handler/liveness.hpp).
//   - `counting_kv<Kv>` counts the operations of any backend per kind, thread-safely (get_many
//     included; watches are not store operations and are not counted).
// Caveats:
//   - Values are opaque bytes (they may contain NUL); keys are compared bytewise, not
//     normalized beyond the checks above.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/detect.hpp"  // detail::detect: the contract's traits
#include "error.hpp"
#include "kv/call_deadline.hpp"  // kv_call_deadline: a thread's bound on its store calls

HOLDFAST_NAMESPACE_BEGIN

/// A sorted list of key/value pairs, as returned by `list`.
using kv_pairs = std::vector<std::pair<std::string, std::string>>;

namespace detail {

/// Why `key` is not a valid key, or an empty string when it is.
inline std::string key_problem(std::string_view key) {
  if (key.empty()) return "empty key";
  if (key.find('\0') != std::string_view::npos) return "key contains a NUL byte";
  std::size_t start = 0;
  for (;;) {
    std::size_t end = key.find('/', start);
    std::string_view seg = key.substr(start, end == std::string_view::npos ? end : end - start);
    if (seg.empty()) return "empty path segment (leading, trailing or doubled '/')";
    if (seg == "..") return "'..' segment";
    if (seg == ".") return "'.' segment";
    if (end == std::string_view::npos) return {};
    start = end + 1;
  }
}

}  // namespace detail

/// Throws holdfast::error(EINVAL, op, key, why) unless `key` is a valid key.
inline void validate_key(std::string_view key, const char* op = "kv key") {
  std::string why = detail::key_problem(key);
  if (!why.empty()) throw error(EINVAL, op, std::string(key), "invalid key: " + why);
}

/// True when `key` is a valid key.
inline bool is_valid_key(std::string_view key) noexcept {
  try {
    return detail::key_problem(key).empty();
  } catch (...) {
    return false;
  }
}

/// True when a store call that threw `e` may succeed if made again: the store could not be
/// reached or was busy for a moment (connection refused, reset or aborted, a network that is
/// down or unreachable, a request that timed out, EAGAIN/EBUSY, and etcd's "unavailable"
/// answers, which etcd_kv reports as EAGAIN). A timed-out write has an unknown outcome: read
/// before retrying it. Anything else (a bad key, EACCES, a malformed reply) is not transient.
inline bool is_transient_kv_error(const std::exception& e) noexcept {
  const auto* err = dynamic_cast<const std::system_error*>(&e);
  if (!err) return false;
  switch (err->code().value()) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ENETDOWN:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ETIMEDOUT:
    case EPIPE:
    case EAGAIN:
    case EBUSY:
    case EINTR:
      return true;
    default:
      return false;
  }
}

/// Normalizes a list/erase prefix: "" stays "" (the whole namespace), one trailing '/' is
/// dropped, and the rest must be a valid key; throws holdfast::error(EINVAL, op, prefix) if not.
inline std::string normalize_prefix(std::string_view prefix, const char* op = "kv prefix") {
  if (prefix.empty()) return {};
  std::string_view p = prefix;
  if (p.back() == '/') p.remove_suffix(1);
  std::string why = detail::key_problem(p);
  if (!why.empty()) throw error(EINVAL, op, std::string(prefix), "invalid prefix: " + why);
  return std::string(p);
}

/// The scope of a job's keys: its run id and its incarnation (restart count or attempt id).
/// Each part is one non-empty key segment (no '/', no NUL, not "." or "..").
class kv_namespace {
 public:
  /// Throws holdfast::error(EINVAL, "kv namespace", part) when a part is not one valid segment.
  kv_namespace(std::string run_id, std::string incarnation)
      : run_(std::move(run_id)), incarnation_(std::move(incarnation)) {
    check(run_, "run id");
    check(incarnation_, "incarnation");
  }
  /// As above, with a numeric incarnation (a restart counter).
  kv_namespace(std::string run_id, std::uint64_t incarnation)
      : kv_namespace(std::move(run_id), std::to_string(incarnation)) {}

  /// The run id.
  const std::string& run_id() const noexcept { return run_; }
  /// The incarnation.
  const std::string& incarnation() const noexcept { return incarnation_; }
  /// "run/incarnation": the path every key of this namespace lives under.
  std::string path() const { return run_ + "/" + incarnation_; }

  /// Same run id and incarnation.
  friend bool operator==(const kv_namespace& a, const kv_namespace& b) {
    return a.run_ == b.run_ && a.incarnation_ == b.incarnation_;
  }
  /// Not the same namespace.
  friend bool operator!=(const kv_namespace& a, const kv_namespace& b) { return !(a == b); }

 private:
  static void check(const std::string& part, const char* what) {
    std::string why = detail::key_problem(part);
    if (why.empty() && part.find('/') != std::string::npos) why = "contains '/'";
    if (!why.empty())
      throw error(EINVAL, "kv namespace", part, std::string("invalid ") + what + ": " + why);
  }

  std::string run_;
  std::string incarnation_;
};

// ---------------------------------------------------------------------------------------------
// Waiting on a store (optional).
//
// A store that can be waited on has `W watch(const std::string& prefix)`: it starts following
// every key strictly below `prefix + "/"` (directory semantics, like list) and returns a movable
// watch object W with:
//   int fd() const noexcept;     a descriptor to poll() for POLLIN; -1 when there is none now
//                                (reconnecting): the caller then sleeps until due() only
//   bool buffered() const noexcept;  changes already read into memory: call take() at once
//   std::chrono::steady_clock::time_point due() const noexcept;  when take() must be called
//                                even if fd() stays quiet (health probes, re-checks,
//                                reconnects); time_point::max() for never
//   kv_changes take();           what changed since the last take(); never blocks on the
//                                store's data, only on its own probe or reconnect, each bounded
//                                by the store's request timeout
//   void follow(const std::vector<std::string>& keys);  OPTIONAL (has_kv_watch_follow_v): the
//                                keys whose appearance matters to the caller now (one to a
//                                few: the handler names at most three). A store that can only
//                                wait on named keys (PyTorch's c10d store: wait(keys, timeout)
//                                waits for all of them) wakes fd() once ANY of them exists (at
//                                once when one exists already); a later follow() replaces them,
//                                and after that one wake-up the watch stays quiet until the
//                                next follow(). Its take() reports resync (the caller re-reads
//                                with try_get). Stores that watch the whole prefix need not
//                                have it: a caller calls it where it exists, before every
//                                blocking wait.
// A store may also have `W watch(const std::string& prefix, kv_watch_events events)`
// (OPTIONAL, has_kv_watch_events_v): with kv_watch_events::writes the watch need not wake for a
// key erased or renamed away (etcd's NODELETE filter): a caller whose keys are erased only once
// nobody reads them (the handler's round keys) sleeps through the cleanup. A key the watch
// brought may then still be known after its erase, until the next resync.
// The first take() after watch() reports resync (the caller reads what it needs once), or,
// from a store that can list the prefix as it starts the watch (etcd_kv), complete: a snapshot
// of every key, so the caller needs no read at all. A watch is used by one thread at a time;
// the store may be used by others meanwhile.
//
// A batched get (optional, has_kv_get_many_v): `std::vector<std::optional<std::string>>
// get_many(const std::vector<std::string>& keys, std::chrono::milliseconds timeout)` waits up
// to `timeout` until every key exists and returns each key's value in order (nullopt for a key
// still missing at the timeout); a timeout of 0 is a batched try_get. The free get_many() below
// uses it where a store has it, and single gets elsewhere.

/// One change seen by a watch: the key (full, as passed to the store) and its new value, or
/// nullopt when it was erased.
struct kv_event {
  std::string key;                   ///< the changed key
  std::optional<std::string> value;  ///< its new value; nullopt: erased
};

/// What a watch must wake for (see "Waiting on a store"): every change, or writes only.
enum class kv_watch_events : unsigned char {
  all,     ///< keys written and keys erased
  writes,  ///< keys written (created or replaced); an erase need not wake it
};

/// What a watch's take() returns.
struct kv_changes {
  std::vector<kv_event> events;  ///< changes in the order the store applied them
  /// Changes may have been missed (the first take, a resume after compaction, a store that
  /// only knows that something changed): re-read every key of interest.
  bool resync = false;
  /// The events start with a snapshot of every key below the prefix (the first take, a resume
  /// after compaction): forget what was known; a key the snapshot and the events after it do
  /// not name is absent, until an event says otherwise.
  bool complete = false;
  /// Nothing happened.
  bool empty() const noexcept { return events.empty() && !resync && !complete; }
};

// ---------------------------------------------------------------------------------------------
// The operations, by name.

/// The operations of the contract: the seven data operations of a kv_store, then the optional
/// watch (waiting on a store) and batched get. counting_kv counts them by kind (watch aside);
/// kv_supports and any_kv::supports answer for each.
enum class kv_op : unsigned {
  insert,
  put,
  try_get,
  get,
  list,
  erase,
  erase_prefix,
  watch,
  get_many
};

/// How many kinds kv_op has.
inline constexpr unsigned kv_op_count = static_cast<unsigned>(kv_op::get_many) + 1;

/// The name of a kv_op ("insert", "try_get", ...).
constexpr const char* kv_op_name(kv_op op) noexcept {
  constexpr const char* names[kv_op_count] = {
      "insert", "put", "try_get", "get", "list", "erase", "erase_prefix", "watch", "get_many"};
  return names[static_cast<unsigned>(op)];
}

// ---------------------------------------------------------------------------------------------
// The contract, checked at compile time.

namespace detail {
template <class T>
using kv_insert = decltype(bool(std::declval<T&>().insert(std::declval<const std::string&>(),
                                                          std::declval<const std::string&>())));
template <class T>
using kv_put = decltype(std::declval<T&>().put(std::declval<const std::string&>(),
                                               std::declval<const std::string&>()));
template <class T>
using kv_try_get = std::enable_if_t<
    std::is_convertible_v<decltype(std::declval<T&>().try_get(std::declval<const std::string&>())),
                          std::optional<std::string>>>;
template <class T>
using kv_get = std::enable_if_t<
    std::is_convertible_v<decltype(std::declval<T&>().get(std::declval<const std::string&>(),
                                                          std::chrono::milliseconds{})),
                          std::optional<std::string>>>;
template <class T>
using kv_list = std::enable_if_t<std::is_convertible_v<
    decltype(std::declval<T&>().list(std::declval<const std::string&>())), kv_pairs>>;
template <class T>
using kv_watch_t = decltype(std::declval<T&>().watch(std::declval<const std::string&>()));
template <class W>
using kv_watch_members =
    std::enable_if_t<std::is_convertible_v<decltype(std::declval<const W&>().fd()), int> &&
                     std::is_convertible_v<decltype(std::declval<const W&>().buffered()), bool> &&
                     std::is_convertible_v<decltype(std::declval<const W&>().due()),
                                           std::chrono::steady_clock::time_point> &&
                     std::is_convertible_v<decltype(std::declval<W&>().take()), kv_changes>>;
template <class T, class = void>
struct has_kv_watch : std::false_type {};
template <class T>
struct has_kv_watch<T, std::enable_if_t<detect<kv_watch_members, kv_watch_t<T>>::value>>
    : std::true_type {};
template <class T>
using kv_watch_events_t =
    decltype(std::declval<T&>().watch(std::declval<const std::string&>(), kv_watch_events::writes));
template <class T, class = void>
struct has_kv_watch_events : std::false_type {};
template <class T>  // the overload returns the same watch type as watch(prefix)
struct has_kv_watch_events<T, std::enable_if_t<has_kv_watch<T>::value &&
                                               std::is_same_v<kv_watch_events_t<T>, kv_watch_t<T>>>>
    : std::true_type {};
template <class W>
using kv_watch_follow =
    decltype(std::declval<W&>().follow(std::declval<const std::vector<std::string>&>()));
template <class T>
using kv_get_many =
    std::enable_if_t<std::is_convertible_v<decltype(std::declval<T&>().get_many(
                                               std::declval<const std::vector<std::string>&>(),
                                               std::chrono::milliseconds{})),
                                           std::vector<std::optional<std::string>>>>;
template <class T>
using kv_supports_member = decltype(bool(std::declval<const T&>().supports(kv_op::list)));
template <class T>
using kv_erase = decltype(std::declval<T&>().erase(std::declval<const std::string&>()));
template <class T>
using kv_erase_prefix =
    decltype(std::declval<T&>().erase_prefix(std::declval<const std::string&>()));
}  // namespace detail

/// True when T has the four operations the preemption handler needs: insert, put, try_get and
/// a blocking get — what PyTorch's c10d store offers too (compareSet, set, check + get, wait).
/// Listing and erasing are optional there (detected: has_kv_list_v).
template <class T>
inline constexpr bool is_coordination_store_v =
    detail::detect<detail::kv_insert, T>::value&& detail::detect<detail::kv_put, T>::value&&
        detail::detect<detail::kv_try_get, T>::value&& detail::detect<detail::kv_get, T>::value;

/// True when T can list a prefix (kv_pairs list(prefix)).
template <class T>
inline constexpr bool has_kv_list_v = detail::detect<detail::kv_list, T>::value;

/// True when T can erase one key (erase(key)): the handler then cleans up each round's keys.
template <class T>
inline constexpr bool has_kv_erase_v = detail::detect<detail::kv_erase, T>::value;

/// True when T can be waited on: `watch(prefix)` returns an object with fd(), buffered(), due()
/// and take() (see "Waiting on a store" above).
template <class T>
inline constexpr bool has_kv_watch_v = detail::has_kv_watch<T>::value;

/// True when T's watch can be told to wake for writes only: `watch(prefix, kv_watch_events)`
/// (see "Waiting on a store").
template <class T>
inline constexpr bool has_kv_watch_events_v = detail::has_kv_watch_events<T>::value;

/// True when watch object W may be told which keys matter now (`follow(keys)`, see "Waiting on
/// a store"): a store that waits on named keys only.
template <class W>
inline constexpr bool has_kv_watch_follow_v = detail::detect<detail::kv_watch_follow, W>::value;

/// True when T has a batched get: get_many(keys, timeout) (see "Waiting on a store").
template <class T>
inline constexpr bool has_kv_get_many_v = detail::detect<detail::kv_get_many, T>::value;

namespace detail {
template <class T>
using kv_leases = decltype(bool(std::declval<const T&>().leases(std::string_view{})));
template <class T>
using kv_lease_ttl = decltype(std::chrono::seconds(std::declval<const T&>().lease_ttl()));
}  // namespace detail

/// True when T says which of its keys carry a lease: `bool leases(std::string_view key) const`
/// and `std::chrono::seconds lease_ttl() const` (etcd_kv, any_kv).
template <class T>
inline constexpr bool has_kv_leases_v =
    detail::detect<detail::kv_leases, T>::value&& detail::detect<detail::kv_lease_ttl, T>::value;

/// The time-to-live of the lease a put of `key` carries in `kv` (it vanishes that long after
/// its writer stops renewing), or 0 s when it carries none (a store without leases).
template <class Kv>
std::chrono::seconds kv_lease_ttl(const Kv& kv, std::string_view key) noexcept {
  if constexpr (has_kv_leases_v<Kv>) {
    return kv.leases(key) ? std::chrono::seconds(kv.lease_ttl()) : std::chrono::seconds(0);
  } else {
    static_cast<void>(kv);
    static_cast<void>(key);
    return std::chrono::seconds(0);
  }
}

/// True when T has every kv_store operation with the expected signature.
template <class T>
inline constexpr bool is_kv_store_v = is_coordination_store_v<T>&& has_kv_list_v<T>&&
    detail::detect<detail::kv_erase, T>::value&& detail::detect<detail::kv_erase_prefix, T>::value;

/// Checks a store for the handler at compile time; each static_assert names the missing member.
template <class Kv>
constexpr bool check_coordination_store() {
  using namespace detail;
  static_assert(detect<kv_insert, Kv>::value,
                "holdfast: a store needs bool insert(const std::string& key, value) "
                "(false when the key exists)");
  static_assert(detect<kv_put, Kv>::value,
                "holdfast: a store needs void put(const std::string& key, value)");
  static_assert(detect<kv_try_get, Kv>::value,
                "holdfast: a store needs std::optional<std::string> try_get(const "
                "std::string& key)");
  static_assert(detect<kv_get, Kv>::value,
                "holdfast: a store needs std::optional<std::string> get(const std::string& "
                "key, std::chrono::milliseconds timeout)");
  return true;
}

/// Checks a key-value backend (all seven operations) at compile time; each static_assert names
/// the missing member.
template <class Kv>
constexpr bool check_kv_store() {
  using namespace detail;
  static_assert(check_coordination_store<Kv>());
  static_assert(detect<kv_list, Kv>::value,
                "holdfast: a kv_store needs kv_pairs list(const std::string& prefix)");
  static_assert(detect<kv_erase, Kv>::value,
                "holdfast: a kv_store needs erase(const std::string& key)");
  static_assert(detect<kv_erase_prefix, Kv>::value,
                "holdfast: a kv_store needs erase_prefix(const std::string& prefix)");
  return true;
}

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_kv_store_v.
template <class T>
concept kv_store = is_kv_store_v<T>;
#endif

/// Whether T has operation `op` at compile time (its member exists with the expected signature).
template <class T>
constexpr bool kv_has_op(kv_op op) noexcept {
  using namespace detail;
  switch (op) {
    case kv_op::insert:
      return detect<kv_insert, T>::value;
    case kv_op::put:
      return detect<kv_put, T>::value;
    case kv_op::try_get:
      return detect<kv_try_get, T>::value;
    case kv_op::get:
      return detect<kv_get, T>::value;
    case kv_op::list:
      return has_kv_list_v<T>;
    case kv_op::erase:
      return has_kv_erase_v<T>;
    case kv_op::erase_prefix:
      return detect<kv_erase_prefix, T>::value;
    case kv_op::watch:
      return has_kv_watch_v<T>;
    case kv_op::get_many:
      return has_kv_get_many_v<T>;
  }
  return false;
}

/// Whether `kv` can do `op` now: T has the member (kv_has_op) and, when T answers at run time
/// (a `bool supports(kv_op) const` member: any_kv, counting_kv), it says yes.
template <class Kv>
bool kv_supports(const Kv& kv, kv_op op) noexcept {
  if constexpr (detail::detect<detail::kv_supports_member, Kv>::value) {
    return kv_has_op<Kv>(op) && kv.supports(op);
  } else {
    static_cast<void>(kv);
    return kv_has_op<Kv>(op);
  }
}

/// Reads `keys` in one wait: each key's value in order, waiting up to `timeout` until every key
/// exists (nullopt for a key still missing then; a timeout of 0 reads without waiting). Uses
/// the store's own get_many where kv_supports(kv, kv_op::get_many), else one blocking get per
/// key within the common deadline (try_get once it passed). Store errors propagate.
template <class Kv>
std::vector<std::optional<std::string>> get_many(Kv& kv, const std::vector<std::string>& keys,
                                                 std::chrono::milliseconds timeout) {
  if constexpr (has_kv_get_many_v<Kv>) {
    if (kv_supports(kv, kv_op::get_many)) return kv.get_many(keys, timeout);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(std::max(
        deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero()));
    out.push_back(left.count() > 0 ? kv.get(key, left) : kv.try_get(key));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// counting_kv

/// A snapshot of counting_kv's counters, one field per kind of operation.
struct kv_counts {
  std::uint64_t insert = 0;        ///< insert calls (successful or not)
  std::uint64_t put = 0;           ///< put calls
  std::uint64_t try_get = 0;       ///< try_get calls
  std::uint64_t get = 0;           ///< blocking get calls
  std::uint64_t list = 0;          ///< list calls
  std::uint64_t erase = 0;         ///< erase calls
  std::uint64_t erase_prefix = 0;  ///< erase_prefix calls
  std::uint64_t get_many = 0;      ///< batched get calls
  std::uint64_t failed = 0;        ///< calls of any kind that threw

  /// The counter of one kind.
  std::uint64_t operator[](kv_op op) const noexcept {
    switch (op) {
      case kv_op::insert:
        return insert;
      case kv_op::put:
        return put;
      case kv_op::try_get:
        return try_get;
      case kv_op::get:
        return get;
      case kv_op::list:
        return list;
      case kv_op::erase:
        return erase;
      case kv_op::erase_prefix:
        return erase_prefix;
      case kv_op::get_many:
        return get_many;
      case kv_op::watch:  // not a store operation: never counted
        break;
    }
    return 0;
  }
  /// Every call, of every kind (`failed` is already included in the kinds).
  std::uint64_t total() const noexcept { return reads() + writes(); }
  /// Reads: try_get + get + list + get_many.
  std::uint64_t reads() const noexcept { return try_get + get + list + get_many; }
  /// Writes: insert + put + erase + erase_prefix.
  std::uint64_t writes() const noexcept { return insert + put + erase + erase_prefix; }
  /// "insert=2 put=0 try_get=1 get=3 list=0 erase=0 erase_prefix=0 get_many=0 failed=0
  /// total=6": every counted kind (all but watch).
  std::string to_string() const {
    std::string s;
    for (unsigned i = 0; i < kv_op_count; ++i) {
      auto op = static_cast<kv_op>(i);
      if (op != kv_op::watch)
        s += std::string(kv_op_name(op)) + "=" + std::to_string((*this)[op]) + " ";
    }
    return s + "failed=" + std::to_string(failed) + " total=" + std::to_string(total());
  }
  /// Every counter equal.
  friend bool operator==(const kv_counts& a, const kv_counts& b) {
    return a.insert == b.insert && a.put == b.put && a.try_get == b.try_get && a.get == b.get &&
           a.list == b.list && a.erase == b.erase && a.erase_prefix == b.erase_prefix &&
           a.get_many == b.get_many && a.failed == b.failed;
  }
  /// Some counter differs.
  friend bool operator!=(const kv_counts& a, const kv_counts& b) { return !(a == b); }
};

/// A kv_store that forwards to `Kv` and counts each call by kind. Copies share the counters
/// (and copy the inner handle), so one counter set can be handed to several threads.
template <class Kv>
class counting_kv {
  static_assert(check_kv_store<Kv>());

 public:
  /// Wraps `inner` (moved in).
  explicit counting_kv(Kv inner) : inner_(std::move(inner)), counters_(new counters) {}
  /// Constructs the inner store in place from `args`.
  template <class... Args, class = std::enable_if_t<std::is_constructible_v<Kv, Args&&...>>>
  explicit counting_kv(std::in_place_t, Args&&... args)
      : inner_(std::forward<Args>(args)...), counters_(new counters) {}

  /// Counts then forwards.
  bool insert(const std::string& key, std::string_view value) {
    return call(kv_op::insert, [&] { return inner_.insert(key, value); });
  }
  /// Counts then forwards.
  void put(const std::string& key, std::string_view value) {
    call(kv_op::put, [&] { inner_.put(key, value); });
  }
  /// Counts then forwards.
  std::optional<std::string> try_get(const std::string& key) {
    return call(kv_op::try_get, [&] { return inner_.try_get(key); });
  }
  /// Counts then forwards.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) {
    return call(kv_op::get, [&] { return inner_.get(key, timeout); });
  }
  /// Counts then forwards.
  kv_pairs list(const std::string& prefix) {
    return call(kv_op::list, [&] { return inner_.list(prefix); });
  }
  /// Counts then forwards.
  auto erase(const std::string& key) {
    return call(kv_op::erase, [&] { return inner_.erase(key); });
  }
  /// Counts then forwards.
  auto erase_prefix(const std::string& prefix) {
    return call(kv_op::erase_prefix, [&] { return inner_.erase_prefix(prefix); });
  }

  /// Counts then forwards, where the wrapped store has a batched get (has_kv_get_many_v).
  template <class K = Kv, class = std::enable_if_t<has_kv_get_many_v<K>>>
  std::vector<std::optional<std::string>> get_many(const std::vector<std::string>& keys,
                                                   std::chrono::milliseconds timeout) {
    return call(kv_op::get_many, [&] { return inner_.get_many(keys, timeout); });
  }

  /// Forwards watch(prefix) where the wrapped store can be waited on (has_kv_watch_v), so that
  /// wrapping a store never changes the path the handler takes. A watch is not counted: its
  /// take() calls are not store operations (the store's own stats() counts its requests).
  template <class K = Kv, class = std::enable_if_t<has_kv_watch_v<K>>>
  auto watch(const std::string& prefix) {
    return inner_.watch(prefix);
  }
  /// Forwards watch(prefix, events) where the wrapped store has it (has_kv_watch_events_v).
  template <class K = Kv, class = std::enable_if_t<has_kv_watch_events_v<K>>>
  auto watch(const std::string& prefix, kv_watch_events events) {
    return inner_.watch(prefix, events);
  }
  /// What the wrapped store can do (kv_supports: an any_kv inside is asked).
  bool supports(kv_op op) const noexcept { return kv_supports(inner_, op); }
  /// Forwards leases(key) where the wrapped store says which keys carry a lease
  /// (has_kv_leases_v), so a counted store keeps its liveness signal (handler/liveness.hpp).
  template <class K = Kv, class = std::enable_if_t<has_kv_leases_v<K>>>
  bool leases(std::string_view key) const noexcept {
    return inner_.leases(key);
  }
  /// Forwards lease_ttl() (has_kv_leases_v).
  template <class K = Kv, class = std::enable_if_t<has_kv_leases_v<K>>>
  std::chrono::seconds lease_ttl() const noexcept {
    return std::chrono::seconds(inner_.lease_ttl());
  }
  /// Forwards the wrapped store's own stats() (etcd_kv: the HTTP requests it sent), if it has it.
  template <class K = Kv>
  auto stats() const -> decltype(std::declval<const K&>().stats()) {
    return inner_.stats();
  }

  /// A snapshot of the counters.
  kv_counts counts() const noexcept {
    kv_counts c;
    c.insert = load(kv_op::insert);
    c.put = load(kv_op::put);
    c.try_get = load(kv_op::try_get);
    c.get = load(kv_op::get);
    c.list = load(kv_op::list);
    c.erase = load(kv_op::erase);
    c.erase_prefix = load(kv_op::erase_prefix);
    c.get_many = load(kv_op::get_many);
    c.failed = counters_->failed.load(std::memory_order_relaxed);
    return c;
  }
  /// The counter of one kind.
  std::uint64_t count(kv_op op) const noexcept { return load(op); }
  /// Sets every counter to zero.
  void reset_counts() noexcept {
    for (auto& c : counters_->by_kind) c.store(0, std::memory_order_relaxed);
    counters_->failed.store(0, std::memory_order_relaxed);
  }
  /// The wrapped store.
  Kv& inner() noexcept { return inner_; }
  /// The wrapped store.
  const Kv& inner() const noexcept { return inner_; }

 private:
  struct counters {
    std::atomic<std::uint64_t> by_kind[kv_op_count] = {};  // indexed by kv_op
    std::atomic<std::uint64_t> failed{0};
  };

  std::uint64_t load(kv_op op) const noexcept {
    return counters_->by_kind[static_cast<unsigned>(op)].load(std::memory_order_relaxed);
  }
  template <class F>
  decltype(auto) call(kv_op op, F&& f) {
    counters_->by_kind[static_cast<unsigned>(op)].fetch_add(1, std::memory_order_relaxed);
    try {
      return f();
    } catch (...) {
      counters_->failed.fetch_add(1, std::memory_order_relaxed);
      throw;
    }
  }

  Kv inner_;
  std::shared_ptr<counters> counters_;
};

HOLDFAST_NAMESPACE_END
