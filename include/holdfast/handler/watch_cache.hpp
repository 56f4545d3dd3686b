// holdfast/handler/watch_cache.hpp — a watch on the keys below one prefix and the values it
// brought: what the handler's watcher knows of the control keys (ctl/) and of one round's acks
// without asking the store.
//
// Guarantees:
//   - lookup(kv, key) answers from the values the watch brought (nullopt: erased or read
//     absent); a key not among them is read once with try_get, unless the watch gave a complete
//     snapshot (etcd): then it is absent, no read. A key a lost insert proved present (mark_stale)
//     is read again even then.
//   - A resync (a store that only knows something changed, a watch that follows named keys, a
//     resumed watch that may have missed events) forgets every value, so each is read again; so
//     does holding more than 256 (a bound: forgetting costs reads, never correctness).
//   - Its watch wakes for writes only where the store can be told so (has_kv_watch_events_v):
//     the handler erases a key only once no cache reads it any more (a worker's own ack after
//     its round's step, a round's control keys after the next round's step; a worker that
//     lists the acks later reads the store, not a cache), so an erase is no news to a watcher;
//     a key erased since may still be answered as last seen, until the next resync.
//   - follow(keys) tells a watch that waits on named keys (a c10d-like store's wait) which keys
//     matter now; other watches ignore it.
// Caveats:
//   - Not thread-safe: one thread (the watcher) owns each cache.
//   - For a Kv without a watch (has_kv_watch_v false) the watch type is a placeholder and open()
//     must not be called; the handler never does.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../kv.hpp"  // has_kv_watch_v, kv_changes, the watch's follow(): the store contract
#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The watch type of Kv, or a placeholder where Kv has no watch.
template <class K, bool = has_kv_watch_v<K>>
struct kv_watch_of {
  using type = char;
};
template <class K>
struct kv_watch_of<K, true> {
  using type = kv_watch_t<K>;
};

/// A watch on the keys below `prefix` and the values it brought (see the top of this file).
template <class Kv>
struct watch_cache {
  using watch_type = typename kv_watch_of<Kv>::type;
  std::string prefix;
  std::optional<watch_type> watch;
  std::map<std::string, std::optional<std::string>> seen;
  std::set<std::string> stale;  // keys a lost insert proved present, not yet read
  bool complete = false;        // `seen` holds every key (the watch's snapshot)

  bool covers(const std::string& key) const {
    return key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 &&
           key[prefix.size()] == '/';
  }
  void open(Kv& kv, const std::string& p) {
    close();
    if constexpr (has_kv_watch_events_v<Kv>)
      watch.emplace(kv.watch(p, kv_watch_events::writes));  // erases are cleanup: sleep on
    else
      watch.emplace(kv.watch(p));
    prefix = p;
  }
  void close() {
    watch.reset();
    forget(false);
  }
  // The keys whose appearance matters now: a watch that waits on named keys wakes on any.
  void follow(const std::vector<std::string>& keys) {
    if constexpr (has_kv_watch_follow_v<watch_type>) {
      if (watch) watch->follow(keys);
    } else {
      static_cast<void>(keys);
    }
  }
  void forget(bool now_complete) {
    seen.clear();
    stale.clear();
    complete = now_complete;
  }
  void apply(kv_changes changes) {
    if (changes.complete || changes.resync || seen.size() > 256)
      forget(changes.complete);  // 256: a bound; forgetting costs reads, never correctness
    if (!changes.resync)
      for (auto& e : changes.events) seen[e.key] = std::move(e.value);
  }

  // What this worker wrote itself: `key` holds `value`.
  void note_written(const std::string& key, const std::string& value) { seen[key] = value; }
  // `key` exists (a lost insert), and its event may not have come yet: read it again.
  void mark_stale(const std::string& key) {
    seen.erase(key);
    stale.insert(key);
  }

  // What the watch knows of `key`, else one try_get (see the top of this file).
  std::optional<std::string> lookup(Kv& kv, const std::string& key) {
    if (auto it = seen.find(key); it != seen.end()) return it->second;
    if (complete && !stale.count(key)) return std::nullopt;  // absent, the watch says
    stale.erase(key);
    auto v = kv.try_get(key);
    seen[key] = v;
    return v;
  }
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
