// holdfast_torch — holdfast's preemption handler, checkpoint manager and multiprocess file cache
// for PyTorch training scripts: the package's compiled part, holdfast_torch._C (built at install by
// setup.py beside this file, with torch's BuildExtension; holdfast_torch/__init__.py imports it and
// adds the Python-side defaults).
//
//   Handler            preemption_handler<Config, any_kv, py_checkpointer, steady_clock, Hang>:
//                      one Config (py_config) whose notice is any preset's sources behind
//                      any_notice (SIGTERM; SIGUSR1+SIGTERM; GCE; AWS; or a notice file) and
//                      whose Exit policy throws instead of exiting, so Python sees
//                      holdfast.Preempted (a SystemExit carrying the preset's exit code) and runs
//                      its finally blocks; one Hang per hang_policy ("report": hang_report,
//                      "restart": hang_restart, "none": hang_none), chosen at construction.
//   torch_kv           a holdfast coordination store over c10d::Store (the job's own TCPStore
//                      or PrefixStore), waited on without polling: its watch is a helper
//                      thread blocked in c10d's wait on a clone of the store (an idle worker
//                      sends two requests per 30 s slice), and the claimant collects the acks
//                      with one wait + multiGet (get_many). file:// and etcd:// URLs go through
//                      holdfast::make_kv.
//   CheckpointManager  holdfast::checkpoint_manager with Python save/restore callables, and the
//                      members the handler's restore agreement uses (all_steps, restore_step,
//                      pin, wait_until_finished); with local_dir, two_tier_checkpoints (local
//                      first, a background copy to the directory; docs/two-tiers.md).
//   _SavePolicy        save_interval_policy and its run history (CheckpointManager's
//                      save_policy="auto"; docs/save-policy.md).
//   Cache              holdfast::multiprocess_file_cache: get(i) -> bytes | None, put(i, bytes).
//   _TorchKV           torch_kv and its watch (_TorchWatch) as they are, for the tests and the
//                      benchmark (tests/pytorch/test_torch_store.py, torch_store_bench.py).
//
// The GIL: released while holdfast blocks or does I/O (the agreement, store calls, a save's
// fsyncs, a cache put, the restore agreement at construction), taken back for every Python
// callback (the step function, the save and restore callables). The handler's watcher thread
// and torch_kv's watch threads never touch Python (unless the store is a Python Store subclass),
// but for on_hang: the watcher starts a thread that takes the GIL and calls it, and waits for it
// at most 5 s (make_on_hang), so a training thread holding the GIL forever delays a verdict's
// action by 5 s at most and never blocks it.
//
// Guarantees (hang detection, handler/hang.hpp for the detector itself):
//   - hang_policy="restart": once a verdict is recorded every worker that learns it calls
//     on_hang (if any), then _exits with hang_exit_code, whatever its training thread is doing
//     (a step asleep, a collective blocked, the GIL held).
//   - on_hang never lets a Python exception into C++ (sys.unraisablehook prints it), and its
//     callable is released with the GIL held.
//   - hang_timeout sets the step's floor, twice it the warm-up's; saves and restores keep their
//     own floors unless hang_timeout is longer.
//
// Two tiers: the copier thread never touches Python (it streams the local files); the save
// callable runs on the caller's thread, into the local tier. Caveat: dropping the last reference
// to a CheckpointManager waits for a copy in flight (at most durable_wait) with the GIL held, as
// it waits for an async save with one tier.
//
// save_policy="auto" (__init__.py): task 0 asks _SavePolicy and broadcasts the answer with
// torch.distributed, so every rank saves the same step; _SavePolicy reads no clock but
// steady_clock's now and writes only its run history.
#include <Python.h>
#include <sys/eventfd.h>  // the log queue's wake-up
#include <unistd.h>       // write
// pybind11 with torch's holder types (c10::intrusive_ptr), the c10d Store: not
// <torch/extension.h>, which adds all of ATen and the C++ frontend (a third of the parse).
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>  // torch_watch's spawn_fn
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <holdfast/detail/waker.hpp>  // the eventfd a torch_watch rings
#include <holdfast/holdfast.hpp>

namespace py = pybind11;
using namespace std::chrono_literals;

namespace holdfast_torch {

// ---------------------------------------------------------------------------------------------
// torch_kv: the coordination store the handler needs (insert, put, try_get, get; erase), a
// batched get and a watch, on a c10d::Store.
//
// What torch 2.15's TCPStore does, measured (libuv and classic servers alike):
//   - A wait(keys, timeout) that times out sends CANCEL_WAIT and reads the server's answer (and
//     a STOP_WAITING that crossed it) before it throws DistStoreError: no late reply is left on
//     the socket (200 timed-out waits, each followed by the key's set from another client and
//     get/check/add/compareSet/multiGet on the same client: no misread). Torch 1.13 left one
//     there, which is why this file used to poll check() instead.
//   - wait() and multiGet() hold the client's lock while they block: a blocking wait on the
//     job's own client would stall every other user of it (the process group, the handler's
//     puts). So every blocking wait here runs on a clone() of the store (its own connection).
//   - A wait cannot be interrupted: it returns when the keys exist, the connection fails, or
//     its timeout passes. Each timed-out wait costs two requests (WAIT, CANCEL_WAIT) and logs
//     two c10d warnings ("waitForInput ... timed out").
//   - Each new connection costs a reverse DNS lookup of the peer's address on both ends (c10d
//     names its sockets in messages; ::ffff:127.0.0.1 is not in /etc/hosts): where the
//     resolver drops a query, a connect takes 5 s (one in ten on this machine). So torch_kv
//     makes its clones at construction (the blocking client, and one per key a watch follows at
//     once: three), none while an agreement is under way. Measured: a handler whose second
//     watch thread connected at its first idle wait had a notice reach the claim 4.7 s late.
//   - The classic (non-libuv) server does not wake waiters on compareSet, only on set, add,
//     append and multiSet; the libuv server wakes them on all of these, and on every
//     compareSet of the key, even one that writes nothing (so try_get is never a compareSet).

/// The value a watch's thread read for the key it followed, for the next try_get of that key:
/// taken by it, dropped by the watch's next follow(). So the read after a wake-up costs the
/// waiting thread one request on its own connection, not the caller three on the job's.
class torch_handoff {
 public:
  void offer(std::string key, std::string value) {
    std::lock_guard<std::mutex> lock(mutex_);
    key_ = std::move(key);
    value_ = std::move(value);
  }
  std::optional<std::string> take(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (key_.empty() || key_ != key) return std::nullopt;
    key_.clear();
    return std::move(value_);
  }
  void drop(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (key_ == key) key_.clear();
  }

 private:
  std::mutex mutex_;
  std::string key_;  // a full c10d key; empty: nothing offered
  std::string value_;
};

/// One followed key's state, shared by the torch_watch and the helper thread that waits for the
/// key, which may outlive the watch. A watch has one such slot per key it follows at once.
struct torch_watch_state {
  std::shared_ptr<torch_handoff> handoff;  // torch_kv's: where the thread leaves what it read
  std::mutex mutex;
  std::condition_variable cv;                     // follow() and the watch's end wake the thread
  std::shared_ptr<holdfast::detail::waker> bell;  // the watch's fd(), shared by its slots
  std::string followed;                           // the full c10d key to wait for; empty: none
  std::uint64_t generation = 0;  // counts follow() calls that changed or re-armed it
  std::uint64_t rung = 0;        // the generation whose key was seen (the bell rung)
  std::string waiting_on;        // the key of the wait in progress; empty: none
  bool failing = false;          // the last wait failed (the watch falls back to polling)
  bool stop = false;             // the watch is gone: exit after the current wait
};

/// The watch of torch_kv::watch (kv.hpp, "Waiting on a store"; see torch_kv): one helper thread
/// per key followed at once (c10d's wait(keys) waits for all of its keys, the handler needs any),
/// all ringing one eventfd.
class torch_watch {
 public:
  using clock = std::chrono::steady_clock;
  /// Starts the helper thread of a new slot (torch_kv's: its own connection, made by the thread).
  using spawn_fn = std::function<void(std::shared_ptr<torch_watch_state>)>;

  torch_watch(std::shared_ptr<torch_watch_state> first, spawn_fn spawn, std::string key_prefix,
              std::string prefix, std::chrono::milliseconds poll)
      : bell_(first->bell),
        spawn_(std::move(spawn)),
        key_prefix_(std::move(key_prefix)),
        prefix_(std::move(prefix)),
        poll_(poll),
        last_take_(clock::now()) {
    slots_.push_back(std::move(first));
  }
  torch_watch(torch_watch&&) noexcept = default;
  torch_watch& operator=(torch_watch&& o) noexcept {
    if (this != &o) {
      end();
      slots_ = std::move(o.slots_);
      bell_ = std::move(o.bell_);
      spawn_ = std::move(o.spawn_);
      key_prefix_ = std::move(o.key_prefix_);
      prefix_ = std::move(o.prefix_);
      poll_ = o.poll_;
      first_ = o.first_;
      last_take_ = o.last_take_;
    }
    return *this;
  }
  /// Tells the threads to exit; each does so after its current wait (at most one slice), alone.
  ~torch_watch() { end(); }

  /// An eventfd, readable once a followed key exists (or a thread's wait failed).
  int fd() const noexcept { return bell_->fd(); }
  /// True until the first take(), whose resync is known already.
  bool buffered() const noexcept { return first_; }
  /// Now before the first take(); time_point::max() while the threads wait for the followed
  /// keys; the last take() plus the poll interval while one cannot (its wait failed, or it is
  /// still in a wait for a key that follow() replaced, which lasts at most one slice). A slot
  /// that follows nothing now (a follow() of fewer keys: a round's wait names one) is no reason
  /// to poll, whatever its thread is still waiting for.
  clock::time_point due() const noexcept {
    if (first_) return last_take_;  // the watch's creation
    for (const auto& s : slots_) {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (s->followed.empty()) continue;
      const bool stale = !s->waiting_on.empty() && s->waiting_on != s->followed;
      if (s->failing || stale) return last_take_ + poll_;
    }
    return clock::time_point::max();
  }
  /// Never blocks: resync on the first take, when the bell rang, and when due() has passed
  /// (the caller re-reads the followed keys with try_get); never events.
  holdfast::kv_changes take() {
    holdfast::kv_changes c;
    c.resync = std::exchange(first_, false);
    if (bell_->drain()) c.resync = true;
    const auto now = clock::now();
    if (now >= due()) c.resync = true;
    last_take_ = now;
    return c;
  }
  /// The keys (below the watched prefix) to wait for now; the bell rings once one exists (at
  /// once when one exists already), then the watch is quiet until the next follow().
  void follow(const std::vector<std::string>& keys) {
    std::vector<std::string> full;
    for (const auto& key : keys) {
      holdfast::validate_key(key, "torch store watch");
      if (key.compare(0, prefix_.size(), prefix_) != 0)
        throw holdfast::error(EINVAL, "torch store watch", key, "not below the watched prefix");
      full.push_back(key_prefix_ + key);
    }
    while (slots_.size() < full.size()) {  // a thread (and a connection) per key, kept
      auto s = std::make_shared<torch_watch_state>();
      s->handoff = slots_.front()->handoff;
      s->bell = bell_;
      spawn_(s);
      slots_.push_back(std::move(s));
    }
    for (std::size_t i = 0; i < slots_.size(); ++i)
      follow_in(*slots_[i], i < full.size() ? std::move(full[i]) : std::string());
  }

 private:
  // Slot `s` waits for `full` from now on ("": for nothing).
  static void follow_in(torch_watch_state& s, std::string full) {
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (full == s.followed && (full.empty() || s.rung != s.generation)) return;  // as it is
      s.handoff->drop(s.followed);  // what the last wake-up read: not for this wait
      s.followed = std::move(full);
      ++s.generation;
    }
    s.cv.notify_all();
  }

  void end() noexcept {
    for (const auto& s : slots_) {
      {
        std::lock_guard<std::mutex> lock(s->mutex);
        s->stop = true;
      }
      s->cv.notify_all();
    }
    slots_.clear();
  }

  std::vector<std::shared_ptr<torch_watch_state>> slots_;  // one per key followed at once
  std::shared_ptr<holdfast::detail::waker> bell_;
  spawn_fn spawn_;
  std::string key_prefix_;  // torch_kv's namespace ("holdfast-kv/<run>/<restart>/")
  std::string prefix_;      // the watched prefix, as the caller names keys
  std::chrono::milliseconds poll_;
  bool first_ = true;
  clock::time_point last_take_;
};

/// A holdfast coordination store over a c10d store, keys under "holdfast-kv/<run>/<restart>/".
///
/// - insert: compareSet(key, "", value); created iff the answer is our value (holdfast's values
///   name their writer, so an equal value is ours). A created key is then set() to the same
///   value once more, which wakes waiters on servers that do not wake them on compareSet.
/// - try_get: check, then compareSet(key, x, x) (two requests, neither a wait), unless a
///   watch's thread has just read the key (below). x is a value holdfast never stores: on a
///   present key the answer is its value and nothing is written; on a key erased since the
///   check the answer is x, read as missing. Not get(), a wait for the key and then a read,
///   which blocks until the store's timeout (300 s by default) on a key erased in between. Not
///   the compareSet alone, which answers a missing key's x on every c10d store: the libuv
///   server wakes the key's waiters on it, key or not (a spurious wake of every watch on it);
///   after the check, that happens only for a key erased between the two requests (a watch
///   following it rings once, and its caller's try_get finds the key missing). put: set.
///   erase: deleteKey.
/// - get(key, timeout) and get_many(keys, timeout): wait(keys, timeout) on a clone of the store,
///   then get / one multiGet there; at a get_many's timeout each key is checked alone and the
///   present ones read with one multiGet (nullopt names exactly the missing ones).
/// - watch(prefix): a helper thread per key followed at once, each on a clone of its own (the
///   first watch's three made at construction, for the up to three keys the handler's idle
///   watcher follows: the claim, the next periodic decision and the hang verdict; a later
///   watch's by its threads) blocks in wait({its key}, slice); when the key
///   exists it reads the value (one compareSet, safe on a present key) for the caller's next
///   try_get of it, then rings the watch's one eventfd; follow(keys) hands each its next key.
///   An idle watch costs two requests (WAIT, CANCEL_WAIT) per followed key and slice (default
///   30 s). The thread cannot be interrupted
///   inside c10d's wait, so a watch's end does not join it: the thread owns its state and its
///   clone (shared_ptr, intrusive_ptr) and exits by itself after its current wait, at most one
///   slice later.
/// - A store without clone() (a Python Store subclass that does not implement it) has no
///   watch (supports(kv_op::watch) is false: the handler waits in slices of get), and its get
///   and get_many poll check() every poll interval on the store itself.
/// - Failures of the store (c10::Error, socket errors) become holdfast::error(ECONNRESET), which
///   the handler retries as transient until the round's deadline.
class torch_kv {
 public:
  /// `poll`: the check() interval where there is no clone, and a watch's fallback poll;
  /// `slice`: the longest single wait of a watch's thread.
  torch_kv(c10::intrusive_ptr<c10d::Store> store, const holdfast::kv_namespace& ns,
           std::chrono::milliseconds poll = 10ms, std::chrono::milliseconds slice = 30s)
      : store_(std::move(store)),
        prefix_("holdfast-kv/" + ns.path() + "/"),
        poll_(std::max(poll, std::chrono::milliseconds(1))),
        slice_(std::max(slice, std::chrono::milliseconds(1))) {
    if (!store_) throw holdfast::error(EINVAL, "torch store", "", "no store");
    blocking_ = try_clone(store_);
    if (blocking_) {
      spare_->client = try_clone(store_);
      for (int i = 0; i < extra_followed_keys; ++i)
        if (auto c = try_clone(store_)) spare_->slots.push_back(std::move(c));
    }
  }

  /// Insert-once: true when this call created the key.
  bool insert(const std::string& key, std::string_view value) {
    const std::string k = full(key, "torch store insert");
    const std::vector<std::uint8_t> v = to_bytes(value);
    if (guarded("compareSet", key, [&] { return store_->compareSet(k, {}, v); }) != v) return false;
    guarded("set", key, [&] {  // the same value again: wakes waiters of any server
      store_->set(k, v);
      return 0;
    });
    return true;
  }
  /// Sets the key.
  void put(const std::string& key, std::string_view value) {
    const std::string k = full(key, "torch store put");
    const std::vector<std::uint8_t> v = to_bytes(value);
    guarded("set", key, [&] {
      store_->set(k, v);
      return 0;
    });
  }
  /// The value, or nothing when the key does not exist; never waits: check, then a
  /// compareSet that writes nothing (see the class comment); or what a watch's thread read for
  /// this key at its last wake-up, if no follow() came since (torch_handoff).
  std::optional<std::string> try_get(const std::string& key) {
    const std::string k = full(key, "torch store try_get");
    if (auto v = handoff_->take(k)) return v;  // a watch's thread just read it
    if (!guarded("check", key, [&] { return store_->check({k}); })) return std::nullopt;
    const auto& x = never_stored();
    auto v = guarded("compareSet", key, [&] { return store_->compareSet(k, x, x); });
    if (v == x) return std::nullopt;  // erased since the check
    return text(v);
  }
  /// Waits up to `timeout` for the key; nothing when it did not appear.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) {
    auto v = get_many({key}, timeout);
    return std::move(v.front());
  }
  /// Waits up to `timeout` until every key exists; each key's value in order, nullopt for the
  /// keys still missing then. A timeout of 0 reads what exists now.
  std::vector<std::optional<std::string>> get_many(const std::vector<std::string>& keys,
                                                   std::chrono::milliseconds timeout) {
    std::vector<std::string> ks;
    ks.reserve(keys.size());
    for (const auto& key : keys) ks.push_back(full(key, "torch store get"));
    if (ks.empty()) return {};
    const std::string& name = keys.front();
    if (!blocking_) {  // check() every poll interval, on the store itself
      const bool all = poll_all(ks, timeout, name);
      return read_present(*store_, keys, ks, all);
    }
    const bool all = wait_all(*blocking_, ks, timeout, name);
    return read_present(*blocking_, keys, ks, all);
  }
  /// Deletes the key; true when it existed.
  bool erase(const std::string& key) {
    const std::string k = full(key, "torch store erase");
    return guarded("deleteKey", key, [&] { return store_->deleteKey(k); });
  }

  /// Follows keys below `prefix` (see the class comment and kv.hpp, "Waiting on a store").
  torch_watch watch(const std::string& prefix) {
    if (!blocking_)
      throw holdfast::error(ENOTSUP, "torch store watch", prefix, "the store has no clone()");
    std::string p = prefix;
    if (!p.empty() && p.back() != '/') p += '/';
    auto state = std::make_shared<torch_watch_state>();
    state->handoff = handoff_;
    state->bell = std::make_shared<holdfast::detail::waker>();
    c10::intrusive_ptr<c10d::Store> client;
    {
      std::lock_guard<std::mutex> lock(spare_->mutex);
      client = std::move(spare_->client);
    }
    std::thread(follow_keys, state, std::move(client), store_, slice_).detach();
    // A slot for a second or third key followed at once: a connection made at construction
    // (a new one costs the server a reverse DNS lookup, seconds where the resolver drops it,
    // during which it answers nobody: never while the handler may be agreeing), else its own.
    auto spawn = [source = store_, slice = slice_,
                  spare = spare_](std::shared_ptr<torch_watch_state> s) {
      c10::intrusive_ptr<c10d::Store> client;
      {
        std::lock_guard<std::mutex> lock(spare->mutex);
        if (!spare->slots.empty()) {
          client = std::move(spare->slots.back());
          spare->slots.pop_back();
        }
      }
      std::thread(follow_keys, std::move(s), std::move(client), source, slice).detach();
    };
    return torch_watch(std::move(state), std::move(spawn), prefix_, std::move(p), poll_);
  }

  /// Every operation, but watch only where the store can be cloned.
  bool supports(holdfast::kv_op op) const noexcept {
    return op != holdfast::kv_op::watch || blocking_;
  }

 private:
  using clock = std::chrono::steady_clock;

  std::string full(const std::string& key, const char* op) const {
    holdfast::validate_key(key, op);
    return prefix_ + key;
  }

  // A clone of `store` (its own connection), or nothing when the store has no clone().
  static c10::intrusive_ptr<c10d::Store> try_clone(const c10::intrusive_ptr<c10d::Store>& store) {
    try {
      return store->clone();
    } catch (const std::exception&) {  // NotImplementedError, pybind11's "pure virtual"
      return {};
    }
  }

  // get_many's answer where `all` says whether every key exists: one multiGet of the keys
  // that do (each checked alone unless `all`), nullopt for the others.
  static std::vector<std::optional<std::string>> read_present(c10d::Store& s,
                                                              const std::vector<std::string>& keys,
                                                              const std::vector<std::string>& ks,
                                                              bool all) {
    std::vector<std::size_t> at;
    std::vector<std::string> read;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      if (!all && !guarded("check", keys[i], [&] { return s.check({ks[i]}); })) continue;
      at.push_back(i);
      read.push_back(ks[i]);
    }
    std::vector<std::vector<std::uint8_t>> values;
    if (!read.empty()) values = guarded("multiGet", keys.front(), [&] { return s.multiGet(read); });
    return fill(keys.size(), at, values, keys.front());
  }

  // n answers: values[j] for key at[j], nullopt for the others.
  static std::vector<std::optional<std::string>> fill(
      std::size_t n, const std::vector<std::size_t>& at,
      const std::vector<std::vector<std::uint8_t>>& values, const std::string& name) {
    if (values.size() != at.size())
      throw holdfast::error(EPROTO, "torch store multiGet", name, "wrong number of values");
    std::vector<std::optional<std::string>> out(n);
    for (std::size_t j = 0; j < at.size(); ++j) out[at[j]] = text(values[j]);
    return out;
  }

  // wait(keys, timeout) on `s`: false when it timed out (DistStoreError once the timeout
  // passed); any other failure, or a DistStoreError before the timeout, throws.
  static bool wait_all(c10d::Store& s, const std::vector<std::string>& keys,
                       std::chrono::milliseconds timeout, const std::string& name) {
    if (timeout <= std::chrono::milliseconds::zero())
      return guarded("check", name, [&] { return s.check(keys); });
    const auto start = clock::now();
    return guarded("wait", name, [&] {
      try {
        s.wait(keys, timeout);
        return true;
      } catch (const c10::DistStoreError&) {
        if (clock::now() - start < timeout) throw;
        return false;
      }
    });
  }

  // Whether every key exists within `timeout`, for a store without a clone: check() every poll
  // interval on the store itself.
  bool poll_all(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                const std::string& name) const {
    const auto deadline = clock::now() + timeout;
    for (;;) {
      if (guarded("check", name, [&] { return store_->check(keys); })) return true;
      const auto left = deadline - clock::now();
      if (left <= clock::duration::zero()) return false;
      std::this_thread::sleep_for(std::min<clock::duration>(poll_, left));
    }
  }

  // The watch's helper thread: waits in slices for the followed key on `client` (a clone of
  // `source`, made now if null or after a failure), rings the bell when the key exists or a
  // wait fails (the caller then finds out with try_get), and exits when the watch is gone.
  // Never throws.
  static void follow_keys(std::shared_ptr<torch_watch_state> s,
                          c10::intrusive_ptr<c10d::Store> client,
                          c10::intrusive_ptr<c10d::Store> source,
                          std::chrono::milliseconds slice) noexcept {
    std::unique_lock<std::mutex> lock(s->mutex);
    for (;;) {
      s->cv.wait(lock,
                 [&] { return s->stop || (!s->followed.empty() && s->rung != s->generation); });
      if (s->stop) return;
      const std::string key = s->followed;
      const std::uint64_t generation = s->generation;
      s->waiting_on = key;
      lock.unlock();
      enum { present, timed_out, failed } result = failed;
      std::optional<std::string> value;
      const auto start = clock::now();
      try {
        if (!client) client = source->clone();
        client->wait({key}, slice);
        result = present;
        value = read_present_key(*client, key);
      } catch (const c10::DistStoreError&) {  // the slice passed (or a store error: below)
        result = clock::now() - start >= slice ? timed_out : failed;
      } catch (...) {
      }
      if (result == failed) client.reset();  // a fresh connection next time
      lock.lock();
      s->waiting_on.clear();
      s->failing = result == failed;
      if (result == present && generation == s->generation) {
        s->rung = generation;
        if (value) s->handoff->offer(key, std::move(*value));
      }
      if (result != timed_out) s->bell->notify();
      if (result == failed)  // the caller polls meanwhile (due())
        s->cv.wait_for(lock, std::chrono::seconds(1), [&] { return s->stop; });
    }
  }

  // A value holdfast never stores (NUL bytes): compareSet(key, x, x) answers a present key's
  // value and writes nothing.
  static const std::vector<std::uint8_t>& never_stored() {
    static const std::vector<std::uint8_t> x = to_bytes(std::string_view("\0holdfast\0", 10));
    return x;
  }

  // The value of `key`, which exists, in one request: compareSet(key, x, x) with x never_stored();
  // nothing when the answer is x (the key erased since, or holding x) or the request failed:
  // the caller reads. Not for a key that may be missing: the libuv server wakes the key's
  // waiters on any compareSet.
  static std::optional<std::string> read_present_key(c10d::Store& s, const std::string& key) {
    const auto& x = never_stored();
    try {
      auto v = s.compareSet(key, x, x);
      if (v != x) return text(v);
    } catch (const std::exception&) {  // the next wait finds out whether the store failed
    }
    return std::nullopt;
  }

  static std::string text(const std::vector<std::uint8_t>& v) {
    return std::string(v.begin(), v.end());
  }
  static std::vector<std::uint8_t> to_bytes(std::string_view s) {
    return std::vector<std::uint8_t>(s.begin(), s.end());
  }
  template <class F>
  static auto guarded(const char* op, const std::string& key, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const holdfast::error&) {
      throw;
    } catch (const c10::Error& e) {
      throw holdfast::error(ECONNRESET, std::string("torch store ") + op, key,
                            e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw holdfast::error(ECONNRESET, std::string("torch store ") + op, key, e.what());
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;     // the job's own client: the quick operations
  c10::intrusive_ptr<c10d::Store> blocking_;  // a clone: get and get_many wait here (or null)
  // The handler's idle watcher follows up to three keys (the claim, the next periodic
  // decision, the hang verdict): a watch's first slot and two more.
  static constexpr int extra_followed_keys = 2;
  struct spare_clone {
    std::mutex mutex;
    c10::intrusive_ptr<c10d::Store> client;              // the first watch's connection
    std::vector<c10::intrusive_ptr<c10d::Store>> slots;  // its second and third keys'
  };
  std::shared_ptr<spare_clone> spare_ = std::make_shared<spare_clone>();  // copies share it
  std::shared_ptr<torch_handoff> handoff_ = std::make_shared<torch_handoff>();
  std::string prefix_;
  std::chrono::milliseconds poll_;
  std::chrono::milliseconds slice_;
};

/// torch_kv for Python (the extension's _TorchKV, for tests and benchmarks): every blocking
/// call releases the GIL.
class py_torch_kv {
 public:
  py_torch_kv(c10::intrusive_ptr<c10d::Store> store, const std::string& run_id,
              std::uint64_t restart, double poll, double slice)
      : kv_(std::move(store), holdfast::kv_namespace(run_id, restart), seconds(poll),
            seconds(slice)) {}
  torch_kv& kv() noexcept { return kv_; }
  static std::chrono::milliseconds seconds(double s) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
  }

 private:
  torch_kv kv_;
};

/// A torch_watch for Python (_TorchWatch); close() ends it.
class py_torch_watch {
 public:
  explicit py_torch_watch(torch_watch w) : w_(std::move(w)) {}
  torch_watch& live() {
    if (!w_) throw holdfast::error(EBADF, "torch store watch", "", "closed");
    return *w_;
  }
  /// Seconds until due(), 0 when past, None for never.
  std::optional<double> due_in() {
    const auto due = live().due();
    if (due == torch_watch::clock::time_point::max()) return std::nullopt;
    return std::max(0.0, std::chrono::duration<double>(due - torch_watch::clock::now()).count());
  }
  void close() { w_.reset(); }

 private:
  std::optional<torch_watch> w_;
};

// ---------------------------------------------------------------------------------------------
// Log lines for Python's logging.getLogger("holdfast").
//
// The library's lines (the handler's, the checkpoints') come from any thread, the watcher's
// and the async saver's among them, some holding holdfast's locks: none takes the GIL for a
// line. Each is queued here with its level (holdfast's info and warning are logging's INFO and
// WARNING, 20 and 30), and __init__.py hands them to the logger in order: from a thread
// of its own woken by each line (the queue's eventfd), at each Handler start and close, and at
// exit. A verdict's line is handed over before on_hang runs (make_on_hang), so
// hang_policy="restart", which _exits, logs it too. At most max_lines wait: past that the oldest
// go, and the next line handed over says how many.

class log_queue {
 public:
  static constexpr std::size_t max_lines = 10000;

  log_queue() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "holdfast: eventfd");
  }
  log_queue(const log_queue&) = delete;
  log_queue& operator=(const log_queue&) = delete;

  void push(holdfast::log_level level, std::string_view line) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (lines_.size() >= max_lines) {
        lines_.pop_front();
        ++dropped_;
      }
      lines_.emplace_back(static_cast<int>(level), std::string(line));
    }
    const std::uint64_t one = 1;
    (void)!::write(fd_, &one, sizeof one);  // wakes the log thread; never blocks
  }
  /// Readable once a line was pushed (an eventfd): what the log thread waits on, in select(),
  /// with no C++ frame under it (a daemon thread that Python ends at exit must not be inside
  /// one: the unwinding of its end through a noexcept frame is std::terminate).
  int fd() const noexcept { return fd_; }
  /// Every waiting line, oldest first (a note of the dropped ones first).
  std::vector<std::pair<int, std::string>> take() {
    std::vector<std::pair<int, std::string>> out;
    std::lock_guard<std::mutex> lock(mutex_);
    if (dropped_ > 0) {
      out.emplace_back(static_cast<int>(holdfast::log_level::warning),
                       std::to_string(std::exchange(dropped_, 0)) +
                           " log lines dropped: more than " + std::to_string(max_lines) +
                           " waited for logging");
    }
    out.insert(out.end(), std::make_move_iterator(lines_.begin()),
               std::make_move_iterator(lines_.end()));
    lines_.clear();
    return out;
  }

 private:
  std::mutex mutex_;
  std::deque<std::pair<int, std::string>> lines_;
  std::uint64_t dropped_ = 0;
  int fd_;
};

/// The process's queue. Never destroyed: a background thread may log while the interpreter
/// and the statics go. A forked child starts a fresh one (the parent's log thread may have
/// held its mutex at the fork): _log_after_fork.
inline log_queue*& python_log_queue_ptr() {
  static log_queue* q = new log_queue;
  return q;
}
inline log_queue& python_log_queue() { return *python_log_queue_ptr(); }

/// The log hook every Python handler and checkpoint manager gets: every level, queued.
inline holdfast::log_fn python_log() {
  return [](holdfast::log_level level, std::string_view line) {
    python_log_queue().push(level, line);
  };
}

/// __init__.py's function that hands the queued lines to logging (_set_log_emitter), or
/// a null handle before it is set. Read and called with the GIL held.
inline py::object& python_log_emitter() {
  static py::object* f = new py::object();  // never destroyed, as the queue
  return *f;
}

// ---------------------------------------------------------------------------------------------
// Exit: a C++ exception that the translator turns into holdfast.Preempted(code).

/// Thrown by the Exit policy after the agreed save; becomes Python's holdfast.Preempted.
struct preempted_exit {
  int code;
};

/// The Exit policy of every Python handler: throws preempted_exit with the preset's code.
struct throw_preempted {
  int exit_status = 42;
  /// The handler must not re-arm after it: the exception ends the training loop.
  static constexpr bool returns = false;
  [[noreturn]] void operator()(const holdfast::exit_context& = {}) const {
    throw preempted_exit{exit_status};
  }
};

/// Any waking notice source behind one type: every preset (with or without a notice file) is
/// then one Config, so the extension compiles one handler per hang policy instead of one per
/// preset, notice file and policy (30 handler types took ~3 minutes to build). The cost is a
/// virtual call per look at the notice, on the watcher thread.
class any_notice {
 public:
  template <class Notice>
  explicit any_notice(Notice n) : p_(std::make_unique<holder<Notice>>(std::move(n))) {
    static_assert(holdfast::has_notice_waker_v<Notice>,
                  "any_notice declares wakes_on_notice: every source it holds must wake");
  }
  /// Every source it holds wakes the watcher (the constructor checks it).
  static constexpr bool wakes_on_notice = true;
  void start() { p_->start(); }
  void stop() noexcept { p_->stop(); }
  bool noticed() const noexcept { return p_->noticed(); }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    return p_->noticed_at();
  }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    return p_->deadline();
  }
  void set_waker(const holdfast::detail::waker* w) noexcept { p_->set_waker(w); }
  /// What fired ("signal SIGTERM", "file '...'"), for the log.
  std::string source() const { return p_->source(); }

 private:
  struct base {
    virtual ~base() = default;
    virtual void start() = 0;
    virtual void stop() noexcept = 0;
    virtual bool noticed() const noexcept = 0;
    virtual std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept = 0;
    virtual std::optional<std::chrono::system_clock::time_point> deadline() const noexcept = 0;
    virtual void set_waker(const holdfast::detail::waker* w) noexcept = 0;
    virtual std::string source() const = 0;
  };
  template <class Notice>
  struct holder final : base {
    explicit holder(Notice notice) : n(std::move(notice)) {}
    void start() override { n.start(); }
    void stop() noexcept override { n.stop(); }
    bool noticed() const noexcept override { return n.noticed(); }
    std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept override {
      return n.noticed_at();
    }
    std::optional<std::chrono::system_clock::time_point> deadline() const noexcept override {
      return n.deadline();
    }
    void set_waker(const holdfast::detail::waker* w) noexcept override { n.set_waker(w); }
    std::string source() const override { return holdfast::detail::notice_source_of(n); }
    Notice n;
  };
  std::unique_ptr<base> p_;
};

/// The one Config of every Python handler: a preset's notices (any_notice), grace and save
/// override, with the throwing Exit.
using py_config = holdfast::termination_config<any_notice, throw_preempted>;

/// `preset` as a py_config, its exit code kept for holdfast.Preempted.
template <class Preset>
py_config python_config(Preset preset) {
  auto c = holdfast::with_exit(std::move(preset), throw_preempted{holdfast::exit_code_v<Preset>});
  return py_config(any_notice(std::move(c.notice())), c.exit_policy(), c.grace_period(),
                   c.save_override());
}

// ---------------------------------------------------------------------------------------------
// The Checkpointer: a checkpoint_manager whose writer and reader are Python callables.

/// The CheckpointManager's checkpoints: one tier (checkpoint_manager on `directory`) or two
/// (two_tier_checkpoints: local_dir first, copied to `directory` in the background), with the
/// members of checkpoint_manager the bindings and py_checkpointer use.
class py_checkpoints {
 public:
  using one_tier = holdfast::checkpoint_manager<>;
  using two_tiers = holdfast::two_tier_checkpoints<>;
  explicit py_checkpoints(one_tier m) : one_(std::move(m)) {}
  explicit py_checkpoints(two_tiers t) : two_(std::move(t)) {}

  template <class Writer>
  void set_writer(Writer w) {
    one_ ? one_->set_writer(std::move(w)) : two_->set_writer(std::move(w));
  }
  template <class Reader>
  void set_reader(Reader r) {
    one_ ? one_->set_reader(std::move(r)) : two_->set_reader(std::move(r));
  }
  /// The local checkpoint with two tiers (its copy to `directory` follows in the background).
  holdfast::checkpoint_info save(std::int64_t step) {
    return one_ ? one_->save(step) : two_->save(step);
  }
  std::optional<std::int64_t> restore() { return one_ ? one_->restore() : two_->restore(); }
  void restore_step(std::int64_t step) {
    one_ ? one_->restore_step(step) : two_->restore_step(step);
  }
  std::vector<std::int64_t> all_steps() const {
    return one_ ? one_->all_steps() : two_->all_steps();
  }
  void pin(std::optional<std::int64_t> step) noexcept { one_ ? one_->pin(step) : two_->pin(step); }
  /// The identities (step and history) of all_steps(): the restore agreement compares these.
  std::vector<holdfast::checkpoint_identity> all_identities() const {
    return one_ ? one_->all_identities() : two_->all_identities();
  }
  void begin_history(const std::string& id) {
    one_ ? one_->begin_history(id) : two_->begin_history(id);
  }
  /// The hang detector's learned bounds, recorded in each save's metadata (handler/hang.hpp).
  void set_hang_bounds(const holdfast::hang_bounds& b) {
    one_ ? one_->set_hang_bounds(b) : two_->set_hang_bounds(b);
  }
  std::optional<holdfast::hang_bounds> restored_hang_bounds() const {
    return one_ ? one_->restored_hang_bounds() : two_->restored_hang_bounds();
  }
  std::optional<std::int64_t> pinned() const noexcept {
    return one_ ? one_->pinned() : two_->local().pinned();
  }
  std::optional<std::int64_t> latest_step() const noexcept {
    return one_ ? one_->latest_step() : two_->latest_step();
  }
  /// Waits for a staged (or async) save's commit; two tiers: then for the copier at most
  /// durable_wait after the last save.
  void wait_until_finished() { one_ ? one_->wait_until_finished() : two_->wait_until_finished(); }
  /// True while a staged (or async) save's local commit has not been waited for.
  bool save_in_flight() const noexcept {
    return one_ ? one_->save_in_flight() : two_->local().save_in_flight();
  }
  /// Bytes the (local tier's) staging area holds mapped.
  std::size_t staging_capacity() const noexcept {
    return one_ ? one_->staging_capacity() : two_->local().staging_capacity();
  }
  /// The durable directory (the only one with one tier).
  const std::string& directory() const noexcept {
    return one_ ? one_->directory() : two_->durable_directory();
  }
  /// The local tier's directory; empty with one tier.
  std::string local_directory() const { return two_ ? two_->local().directory() : std::string(); }
  /// Two tiers: the newest step committed to the durable tier; one tier: the latest.
  std::optional<std::int64_t> durable_step() const {
    return one_ ? one_->latest_step() : two_->durable_step();
  }
  /// Two tiers: what the last wait_until_finished() did not copy.
  std::vector<std::int64_t> unfinished() const {
    return two_ ? two_->unfinished() : std::vector<std::int64_t>{};
  }

 private:
  std::optional<one_tier> one_;
  mutable std::optional<two_tiers> two_;  // mutable: its local() (pinned, directory) is non-const
};

/// Copies what stage_fn(step) returned into a staged save (checkpoint/staging.hpp): the
/// storages' bytes into tensors.bin at their offsets, then objects.pkl and index.json
/// (holdfast_torch/state.py's format). stage_fn runs with the GIL; the copy runs without it,
/// the tensors held alive by `keep` (released with the GIL), so the training thread's other
/// Python threads run during the copy and the background write never touches Python.
inline void stage_state(const py::object& stage_fn, holdfast::checkpoint_stage& stage,
                        std::int64_t step) {
  struct segment {
    std::uintptr_t ptr;
    std::size_t bytes;
    std::uint64_t offset;
  };
  std::vector<segment> segments;
  std::string objects, index;
  std::optional<py::object> keep;
  {
    py::gil_scoped_acquire gil;
    py::tuple r = stage_fn(step);
    for (auto item : r[0].cast<py::list>()) {
      auto t = item.cast<py::tuple>();
      segments.push_back(
          {t[0].cast<std::uintptr_t>(), t[1].cast<std::size_t>(), t[2].cast<std::uint64_t>()});
    }
    objects = r[1].cast<std::string>();
    index = r[2].cast<std::string>();
    keep.emplace(r[3]);
  }
  auto release = [&keep] {
    py::gil_scoped_acquire gil;
    keep.reset();
  };
  try {
    static const unsigned char zeros[64] = {};
    std::uint64_t at = 0;
    for (const auto& s : segments) {
      while (at < s.offset) {  // the alignment between storages (less than 64 bytes)
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(s.offset - at, 64));
        stage.write("tensors.bin", zeros, n);
        at += n;
      }
      stage.write("tensors.bin", reinterpret_cast<const void*>(s.ptr), s.bytes);
      at += s.bytes;
    }
    if (segments.empty()) stage.write("tensors.bin", zeros, 0);
    stage.write("objects.pkl", objects.data(), objects.size());
    stage.write("index.json", index.data(), index.size());
  } catch (...) {
    release();
    throw;
  }
  release();
}

/// State shared by the Python CheckpointManager object and every handler holding it.
struct checkpoint_state {
  py::object save_fn;     // save(directory, step): fills the checkpoint directory
  py::object restore_fn;  // restore(directory, step): loads it
  py::object stage_fn;    // state=: stage(step) -> (segments, objects, index, keep), or None
  // Destroyed first (members are destroyed in reverse order): its callbacks use the above.
  py_checkpoints manager;

  checkpoint_state(py::object save, py::object restore, py::object stage, py_checkpoints m)
      : save_fn(std::move(save)),
        restore_fn(std::move(restore)),
        stage_fn(std::move(stage)),
        manager(std::move(m)) {
    if (!stage_fn.is_none())
      manager.set_writer([this](holdfast::checkpoint_stage& st, std::int64_t step) {
        stage_state(stage_fn, st, step);
      });
    else
      manager.set_writer([this](const std::string& d, std::int64_t step) {
        py::gil_scoped_acquire gil;
        save_fn(d, step);
      });
    manager.set_reader([this](const std::string& d, std::int64_t step) {
      py::gil_scoped_acquire gil;
      restore_fn(d, step);
    });
  }
};

/// The handler's Checkpointer: a handle on checkpoint_state (copies share it). Called without
/// the GIL; the callbacks take it.
class py_checkpointer {
 public:
  explicit py_checkpointer(std::shared_ptr<checkpoint_state> s) : s_(std::move(s)) {}
  holdfast::checkpoint_info save(std::int64_t step) { return s_->manager.save(step); }
  std::optional<std::int64_t> restore() { return s_->manager.restore(); }
  std::vector<std::int64_t> all_steps() const { return s_->manager.all_steps(); }
  void restore_step(std::int64_t step) { s_->manager.restore_step(step); }
  void pin(std::optional<std::int64_t> step) noexcept { s_->manager.pin(step); }
  std::vector<holdfast::checkpoint_identity> all_identities() const {
    return s_->manager.all_identities();
  }
  void begin_history(const std::string& id) { s_->manager.begin_history(id); }
  void set_hang_bounds(const holdfast::hang_bounds& b) { s_->manager.set_hang_bounds(b); }
  std::optional<holdfast::hang_bounds> restored_hang_bounds() const {
    return s_->manager.restored_hang_bounds();
  }
  void wait_until_finished() { s_->manager.wait_until_finished(); }
  checkpoint_state& state() const noexcept { return *s_; }

 private:
  std::shared_ptr<checkpoint_state> s_;
};

// A deleter that takes the GIL: the state holds Python objects, and the last reference may be
// dropped by a handler destroyed without the GIL.
inline std::shared_ptr<checkpoint_state> make_checkpoint_state(py::object save, py::object restore,
                                                               py::object stage,
                                                               py_checkpoints manager) {
  return std::shared_ptr<checkpoint_state>(
      new checkpoint_state(std::move(save), std::move(restore), std::move(stage),
                           std::move(manager)),
      [](checkpoint_state* p) {
        py::gil_scoped_acquire gil;
        delete p;
      });
}

/// The Python CheckpointManager.
class py_checkpoint_manager {
 public:
  /// One tier in `directory`; with a non-empty `local_dir`, two tiers (local_dir first, each
  /// save copied to `directory` in the background; local_max_to_keep and max_to_keep per tier,
  /// durable_wait seconds for the copy at the preemption save).
  py_checkpoint_manager(const std::string& directory, py::object save, py::object restore,
                        std::size_t max_to_keep, bool async_save, const std::string& local_dir,
                        std::size_t local_max_to_keep, double durable_wait,
                        const std::string& owner, py::object stage) {
    holdfast::checkpoint_options o;
    o.max_to_keep = max_to_keep;
    o.async_save = async_save;
    o.owner = owner;  // "task <rank>": another rank's directory fails at once, naming both
    o.log = python_log();
    std::optional<py_checkpoints> m;
    {
      py::gil_scoped_release nogil;  // the writer lock may be held by a dying predecessor
      if (local_dir.empty())
        m.emplace(py_checkpoints::one_tier(directory, holdfast::directory_commit::rename, o));
      else
        m.emplace(two_tiers(directory, local_dir, o, local_max_to_keep, durable_wait));
    }
    s_ =
        make_checkpoint_state(std::move(save), std::move(restore), std::move(stage), std::move(*m));
  }
  py_checkpointer checkpointer() const { return py_checkpointer(s_); }
  py_checkpoints& manager() const { return s_->manager; }
  std::shared_ptr<checkpoint_state> shared() const { return s_; }

 private:
  static py_checkpoints::two_tiers two_tiers(const std::string& durable_dir,
                                             const std::string& local_dir,
                                             holdfast::checkpoint_options durable,
                                             std::size_t local_max_to_keep, double durable_wait) {
    holdfast::two_tier_options t;
    t.durable = std::move(durable);
    t.local.max_to_keep = local_max_to_keep;
    t.local.log = t.log = python_log();
    t.durable_wait = std::chrono::milliseconds(static_cast<std::int64_t>(durable_wait * 1000));
    return py_checkpoints::two_tiers(local_dir, holdfast::directory_commit::rename, durable_dir,
                                     holdfast::directory_commit::rename, std::move(t));
  }

  std::shared_ptr<checkpoint_state> s_;
};

// ---------------------------------------------------------------------------------------------
// The save interval policy (save_policy="auto").

/// holdfast::save_interval_policy and, where a directory is given, the run history it learns M
/// from (<directory>/holdfast-run-history.json, begun at construction): what
/// CheckpointManager(save_policy="auto") consults on the task that decides (task 0).
class py_save_policy {
 public:
  py_save_policy(const std::string& history_dir, double mtbi_prior, double min_interval,
                 double max_interval, double prior_weight)
      : policy_(options(mtbi_prior, min_interval, max_interval, prior_weight)) {
    py::gil_scoped_release nogil;  // the history's read and atomic write
    if (!history_dir.empty()) {
      history_.emplace(history_dir);
      history_->begin(std::chrono::system_clock::now());
      policy_.observe(*history_);
    }
    policy_.start(std::chrono::steady_clock::now());
  }
  /// True when the interval has passed since the last save (or the start).
  bool should_save() const { return policy_.should_save(std::chrono::steady_clock::now()); }
  /// A save that blocked the training for `cost` seconds finished now (noted in the history).
  void record_save(double cost) {
    policy_.record_save(holdfast::save_seconds(cost), std::chrono::steady_clock::now());
    py::gil_scoped_release nogil;
    if (history_) history_->note_save(std::chrono::system_clock::now(), policy_.save_cost());
  }
  /// This incarnation ends after its preemption save committed.
  void note_notice() {
    py::gil_scoped_release nogil;
    if (history_) history_->note_notice(std::chrono::system_clock::now());
  }
  /// This incarnation ends on purpose (the training finished).
  void note_clean_end() {
    py::gil_scoped_release nogil;
    if (history_) history_->note_clean_end(std::chrono::system_clock::now());
  }
  double interval() const { return policy_.interval(std::chrono::steady_clock::now()).count(); }
  double mtbi() const { return policy_.mtbi(std::chrono::steady_clock::now()).count(); }
  double save_cost() const { return policy_.save_cost().count(); }
  std::int64_t unnoticed() const { return history_ ? history_->counters().unnoticed : 0; }

 private:
  static holdfast::save_interval_options options(double mtbi_prior, double min_interval,
                                                 double max_interval, double prior_weight) {
    holdfast::save_interval_options o;
    o.mtbi_prior = holdfast::save_seconds(mtbi_prior);
    o.min_interval = holdfast::save_seconds(min_interval);
    o.max_interval = holdfast::save_seconds(max_interval);
    o.prior_weight = prior_weight;
    return o;
  }

  holdfast::save_interval_policy policy_;
  std::optional<holdfast::run_history> history_;
};

// ---------------------------------------------------------------------------------------------
// The handler.

/// A step callable without allocation: the handler invokes it in place.
struct step_ref {
  void* ctx;
  void (*fn)(void*);
  void operator()() const { fn(ctx); }
};

/// A step's Python exception, as a C++ exception the handler can publish to its peers (type
/// name holdfast_torch::python_step_error, message "PythonType: str(exception)").
struct python_step_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What the Python binding needs of a handler, whatever its Config.
class handler_iface {
 public:
  virtual ~handler_iface() = default;
  virtual holdfast::run_status run(step_ref step) = 0;
  virtual holdfast::run_status save_checkpoint_if_preempted() = 0;
  virtual std::int64_t total_run_calls() const noexcept = 0;
  virtual std::optional<std::int64_t> restored_step() const noexcept = 0;
  virtual holdfast::agreement_state state() const = 0;
  virtual double mean_step_time() const noexcept = 0;
  virtual double grace_period() const noexcept = 0;
  virtual int exit_code() const noexcept = 0;
  virtual const std::string& key_scope() const noexcept = 0;
  virtual const holdfast::cluster_info& cluster() const noexcept = 0;
  virtual void shutdown(bool failed) noexcept = 0;
  virtual holdfast::any_kv& kv() noexcept = 0;
  virtual void pause_hang_detection() noexcept = 0;
  virtual holdfast::hang_bounds learned_hang_bounds() const noexcept = 0;
  virtual std::chrono::nanoseconds hang_bound(holdfast::hang_phase p) const noexcept = 0;
};

template <class Config, class Hang>
class handler_impl final : public handler_iface {
 public:
  handler_impl(Config config, holdfast::any_kv kv, holdfast::cluster_info cluster,
               py_checkpointer ckpt, holdfast::handler_options o)
      : exit_code_(config.exit_policy().exit_status),
        grace_(std::chrono::duration<double>(config.grace_period()).count()),
        kv_(kv),
        h_(std::move(config), std::move(kv), std::move(cluster), std::move(ckpt), o) {}
  holdfast::run_status run(step_ref step) override { return h_.run(step); }
  holdfast::run_status save_checkpoint_if_preempted() override {
    return h_.save_checkpoint_if_preempted();
  }
  std::int64_t total_run_calls() const noexcept override { return h_.total_run_calls(); }
  std::optional<std::int64_t> restored_step() const noexcept override { return h_.restored_step(); }
  holdfast::agreement_state state() const override { return h_.state(); }
  double mean_step_time() const noexcept override {
    return std::chrono::duration<double>(h_.mean_step_time()).count();
  }
  double grace_period() const noexcept override { return grace_; }
  int exit_code() const noexcept override { return exit_code_; }
  const std::string& key_scope() const noexcept override { return h_.key_scope(); }
  const holdfast::cluster_info& cluster() const noexcept override { return h_.cluster(); }
  void shutdown(bool failed) noexcept override { h_.shutdown(failed); }
  holdfast::any_kv& kv() noexcept override { return kv_; }
  void pause_hang_detection() noexcept override { h_.pause_hang_detection(); }
  holdfast::hang_bounds learned_hang_bounds() const noexcept override {
    return h_.learned_hang_bounds();
  }
  std::chrono::nanoseconds hang_bound(holdfast::hang_phase p) const noexcept override {
    if constexpr (!Hang::detects) return std::chrono::nanoseconds::max();  // none: no bound
    return h_.hang_bound(p);
  }

 private:
  using handler_type = holdfast::preemption_handler<Config, holdfast::any_kv, py_checkpointer,
                                                    std::chrono::steady_clock, Hang>;
  int exit_code_;
  double grace_;         // seconds
  holdfast::any_kv kv_;  // a copy sharing the handler's store: round_summary reads it
  handler_type h_;
};

/// How often a notice file is looked for (one stat each).
constexpr std::chrono::milliseconds notice_file_interval{250};

/// The hang policies the extension offers (Handler(hang_policy=...)): each is a handler type.
enum class hang_choice { none, report, restart };

inline hang_choice parse_hang_choice(const std::string& s) {
  if (s == "none") return hang_choice::none;
  if (s == "report") return hang_choice::report;
  if (s == "restart") return hang_choice::restart;
  throw std::invalid_argument("holdfast: unknown hang_policy '" + s + "' (none, report, restart)");
}

// The handler with the hang policy `hang`: the extension's three handler types.
inline std::unique_ptr<handler_iface> make_hang_handler(hang_choice hang, py_config config,
                                                        holdfast::any_kv kv,
                                                        holdfast::cluster_info cluster,
                                                        py_checkpointer ckpt,
                                                        holdfast::handler_options o) {
  auto make = [&](auto policy) -> std::unique_ptr<handler_iface> {
    return std::make_unique<handler_impl<py_config, decltype(policy)>>(
        std::move(config), std::move(kv), std::move(cluster), std::move(ckpt), std::move(o));
  };
  switch (hang) {
    case hang_choice::none:
      return make(holdfast::hang_none{});
    case hang_choice::restart:
      return make(holdfast::hang_restart{});
    case hang_choice::report:
      break;
  }
  return make(holdfast::hang_report{});
}

inline std::unique_ptr<handler_iface> make_handler(
    const std::string& preset, std::optional<double> grace, const std::string& notice_file,
    hang_choice hang, holdfast::any_kv kv, holdfast::cluster_info cluster, py_checkpointer ckpt,
    holdfast::handler_options o) {
  namespace p = holdfast::presets;
  auto config = [&]() -> py_config {
    std::string name = preset;
    if (name == "detect") name = holdfast::to_string(holdfast::detect_platform());
    if (name == "generic") return python_config(p::generic());
    if (name == "k8s" || name == "kubernetes") return python_config(p::kubernetes());
    if (name == "slurm") return python_config(p::slurm());
    if (name == "gce") return python_config(p::gce_cpu());
    if (name == "aws") return python_config(p::aws_spot());
    throw std::invalid_argument("holdfast: unknown preset '" + preset +
                                "' (generic, k8s, kubernetes, slurm, gce, aws, detect)");
  }();
  if (grace)
    config.set_grace_period(std::chrono::milliseconds(static_cast<std::int64_t>(*grace * 1000)));
  if (!notice_file.empty()) {  // the preset's notices, or the file appearing (a Slurm trap)
    using either = holdfast::any_of<any_notice, holdfast::file_notice>;
    config = py_config(
        any_notice(either(std::move(config.notice()),
                          holdfast::file_notice(notice_file, notice_file_interval, python_log()))),
        config.exit_policy(), config.grace_period(), config.save_override());
  }
  return make_hang_handler(hang, std::move(config), std::move(kv), std::move(cluster),
                           std::move(ckpt), std::move(o));
}

const char* state_name(holdfast::agreement_state s) {
  using st = holdfast::agreement_state;
  switch (s) {
    case st::idle:
      return "idle";
    case st::noticed:
      return "noticed";
    case st::claimed:
      return "claimed";
    case st::acked:
      return "acked";
    case st::step_published:
      return "step_published";
    case st::grace:
      return "grace";
    case st::final_noticed:
      return "final_noticed";
    case st::final_claimed:
      return "final_claimed";
    case st::final_acked:
      return "final_acked";
    case st::final_published:
      return "final_published";
    case st::exiting:
      return "exiting";
    case st::failed:
      return "failed";
    case st::stopped:
      return "stopped";
  }
  return "unknown";
}

const char* status_name(holdfast::run_status s) {
  switch (s) {
    case holdfast::run_status::ran:
      return "ran";
    case holdfast::run_status::saved:
      return "saved";
    case holdfast::run_status::stopped:
      return "stopped";
  }
  return "unknown";
}

/// The longest the handler's watcher waits for on_hang before it goes on (the report's log
/// line; hang_restart's exit). The call goes on meanwhile, on a thread of its own. Without an
/// on_hang, the wait for the verdict's line to reach logging (log_only_wait).
constexpr std::chrono::seconds on_hang_wait{5};
constexpr std::chrono::milliseconds log_only_wait{200};

/// The lines still queued, on stderr ("holdfast: <line>"), without the GIL: where a verdict's
/// line cannot reach logging before hang_policy="restart" exits (a step holding the GIL).
inline void log_queue_to_stderr() noexcept {
  try {
    for (const auto& entry : python_log_queue().take()) holdfast::log_to_stderr(entry.second);
  } catch (...) {
  }
}

/// A verdict as Python sees it: {task, phase, step (None: unknown), elapsed_s, bound_s,
/// recorder}. Needs the GIL.
inline py::dict verdict_dict(const holdfast::hang_verdict& v) {
  py::dict d;
  d["task"] = v.task;
  d["phase"] = holdfast::hang_phase_name(v.phase);
  d["step"] = v.step < 0 ? py::object(py::none()) : py::object(py::int_(v.step));
  d["elapsed_s"] = std::chrono::duration<double>(v.elapsed).count();
  d["bound_s"] = std::chrono::duration<double>(v.bound).count();
  d["recorder"] = v.recorder;
  return d;
}

/// hang_options::on_hang for a Python callable (None: none, but the verdict's log line is still
/// handed to logging first). The watcher thread calls it; the Python calls run on a thread of
/// its own, which takes the GIL, and the watcher waits for it at most on_hang_wait: a training
/// thread that never releases the GIL (stuck in a C extension that holds it) cannot keep the
/// restart policy from ending the process. A Python exception goes to sys.unraisablehook
/// (printed), never into C++. The callable is released with the GIL held, by whichever thread
/// drops it last.
inline std::function<void(const holdfast::hang_verdict&)> make_on_hang(py::object fn) {
  std::shared_ptr<py::object> f(new py::object(std::move(fn)), [](py::object* o) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak it
    py::gil_scoped_acquire gil;
    delete o;
  });
  struct call_done {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  return [f](const holdfast::hang_verdict& v) {
    auto d = std::make_shared<call_done>();
    try {
      std::thread([f, v, d] {
        if (Py_IsInitialized()) {
          py::gil_scoped_acquire gil;
          try {
            if (python_log_emitter()) python_log_emitter()();  // the verdict's line first
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("holdfast_torch: logging");
          } catch (...) {
          }
          try {
            if (!f->is_none()) (*f)(verdict_dict(v));
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("holdfast_torch: on_hang");
          } catch (...) {
          }
        }
        std::lock_guard<std::mutex> lock(d->mutex);
        d->done = true;
        d->cv.notify_all();
      }).detach();
    } catch (const std::system_error&) {  // no thread: the report goes on without the callback
      log_queue_to_stderr();
      return;
    }
    std::unique_lock<std::mutex> lock(d->mutex);
    // Without a callable only the line waits for the GIL: briefly (the log thread takes it as
    // well), not the 5 s a callable gets.
    if (!d->cv.wait_for(lock, f->is_none() ? log_only_wait : on_hang_wait,
                        [&] { return d->done; })) {
      lock.unlock();
      log_queue_to_stderr();  // the GIL is held elsewhere: the lines still get out before an exit
    }
  };
}

/// The Python Handler (the Python subclass in __init__.py resolves the defaults).
class py_handler {
 public:
  py_handler(const std::string& preset, const std::string& store,
             std::optional<c10::intrusive_ptr<c10d::Store>> torch_store, int task, int num_tasks,
             const std::string& run_id, std::uint64_t restart,
             const py_checkpoint_manager& checkpoints, double ack_timeout,
             std::optional<double> grace, double grace_margin, double watch_interval,
             double store_poll, const std::string& notice_file, const std::string& hang_policy,
             std::optional<double> hang_timeout, double hang_multiplier,
             std::uint32_t hang_warmup_steps, double hang_period, int hang_exit_code,
             py::object on_hang, double start_timeout, double restore_timeout) {
    auto ms = [](double s) {
      return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
    };
    const holdfast::kv_namespace ns(run_id, restart);
    c10::intrusive_ptr<c10d::Store> job_store;
    if (store == "torch") {
      if (!torch_store || !*torch_store)
        throw std::invalid_argument("holdfast: store='torch' needs a torch_store");
      job_store = std::move(*torch_store);
    }
    holdfast::handler_options o;
    o.ack_timeout = ms(ack_timeout);
    o.start_timeout = ms(start_timeout);
    o.restore_timeout = ms(restore_timeout);
    o.grace_margin = ms(grace_margin);
    o.watch_interval = ms(watch_interval);
    const hang_choice hang = parse_hang_choice(hang_policy);
    if (!(hang_multiplier > 0) || !(hang_period > 0) || (hang_timeout && !(*hang_timeout > 0)))
      throw std::invalid_argument(
          "holdfast: hang_multiplier, hang_period and hang_timeout must be positive");
    o.hang.multiplier = hang_multiplier;
    o.hang.warmup_steps = hang_warmup_steps;
    o.hang.period = std::max(ms(hang_period), std::chrono::milliseconds(1));
    o.hang.exit_code = hang_exit_code;
    if (hang_timeout) {  // the step's floor; the warm-up's twice it; saves and restores: at least
      const auto t = ms(*hang_timeout);
      o.hang.step_floor = t;
      o.hang.warmup_floor = 2 * t;
      o.hang.save_floor = std::max(o.hang.save_floor, t);
      o.hang.restore_floor = std::max(o.hang.restore_floor, t);
    }
    o.hang.on_hang = make_on_hang(std::move(on_hang));
    o.log = python_log();
    holdfast::cluster_info cluster{task, num_tasks, run_id};
    py_checkpointer ckpt = checkpoints.checkpointer();
    py::gil_scoped_release nogil;  // the restore agreement waits for every task
    std::optional<holdfast::any_kv> kv;
    if (job_store)  // torch_kv connects a clone of the store: not with the GIL held
      kv.emplace(torch_kv(std::move(job_store), ns, ms(store_poll)));
    else
      kv.emplace(holdfast::make_kv(store, ns));
    h_ = make_handler(preset, grace, notice_file, hang, std::move(*kv), std::move(cluster),
                      std::move(ckpt), std::move(o));
  }
  py_handler(const py_handler&) = delete;
  py_handler& operator=(const py_handler&) = delete;
  ~py_handler() { close(); }

  /// Stops the watcher and the notice (without the GIL), then frees the handler. Idempotent;
  /// total_run_calls, restored_step, exit_code and the rest stay readable. `failed`: the job
  /// ends with an exception (no liveness "done": the peers are not told it finished cleanly).
  void close(bool failed = false) {
    if (!h_) return;
    final_.total = h_->total_run_calls();
    final_.restored = h_->restored_step();
    final_.exit_code = h_->exit_code();
    final_.grace = h_->grace_period();
    final_.task = h_->cluster().task;
    final_.num_tasks = h_->cluster().num_tasks;
    final_.scope = h_->key_scope();
    py::gil_scoped_release nogil;
    h_->shutdown(failed);
    h_.reset();
  }

  /// run(step_fn, *args, **kwargs): the handler's run() around a Python call; returns what
  /// step_fn returned. The GIL is released around the handler and taken for step_fn.
  py::object run(py::handle fn, py::args args, py::kwargs kwargs) {
    handler_iface& h = live();
    call_ctx c{fn.ptr(), args.ptr(), kwargs.size() ? kwargs.ptr() : nullptr};
    c.ts = PyEval_SaveThread();
    holdfast::run_status st;
    try {
      st = h.run(step_ref{&c, &call_ctx::invoke});
    } catch (...) {
      PyEval_RestoreThread(c.ts);
      if (c.error) throw *c.error;  // the step's own Python exception, unchanged
      throw;                        // translated: Preempted, AgreementTimeout, PeerError, ...
    }
    PyEval_RestoreThread(c.ts);
    last_status_ = st;
    if (!c.result) return py::none();
    return py::reinterpret_steal<py::object>(c.result);
  }

  /// For loops that run several steps per call (see handler.hpp).
  std::string save_checkpoint_if_preempted() {
    handler_iface& h = live();
    holdfast::run_status st;
    {
      py::gil_scoped_release nogil;
      st = h.save_checkpoint_if_preempted();
    }
    last_status_ = st;
    return status_name(st);
  }

  std::int64_t total_run_calls() const { return h_ ? h_->total_run_calls() : final_.total; }
  std::optional<std::int64_t> restored_step() const {
    return h_ ? h_->restored_step() : final_.restored;
  }
  std::string last_status() const { return status_name(last_status_); }
  std::string state() const {
    if (!h_) return "closed";
    py::gil_scoped_release nogil;  // the handler's mutex: never wait for it holding the GIL
    return state_name(h_->state());
  }
  double mean_step_time() const { return h_ ? h_->mean_step_time() : 0.0; }
  double grace_period() const { return h_ ? h_->grace_period() : final_.grace; }
  int exit_code() const { return h_ ? h_->exit_code() : final_.exit_code; }
  int task() const { return h_ ? h_->cluster().task : final_.task; }
  int num_tasks() const { return h_ ? h_->cluster().num_tasks : final_.num_tasks; }
  std::string key_scope() const { return h_ ? h_->key_scope() : final_.scope; }

  /// Until the next run(): no hang bound (work between steps that no bound covers).
  void pause_hang_detection() { live().pause_hang_detection(); }
  /// What the detector learned (seconds, and the steps timed) and the bounds in force now.
  py::dict learned_hang_bounds() const {
    handler_iface& h = live();
    const holdfast::hang_bounds b = h.learned_hang_bounds();
    auto s = [](std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); };
    auto bound = [&](holdfast::hang_phase p) -> py::object {
      const auto d = h.hang_bound(p);
      if (d == std::chrono::nanoseconds::max()) return py::none();  // hang_policy="none"
      return py::float_(s(d));
    };
    py::dict d;
    d["step_s"] = s(b.step);
    d["save_s"] = s(b.save);
    d["restore_s"] = s(b.restore);
    d["steps"] = b.steps;
    d["step_bound_s"] = bound(holdfast::hang_phase::step);
    d["save_bound_s"] = bound(holdfast::hang_phase::save);
    d["restore_bound_s"] = bound(holdfast::hang_phase::restore);
    return d;
  }

  /// What the coordination store holds for round `round` (claim, acks, outcome) and the error
  /// key, read now: for timelines and post-mortems.
  py::dict round_summary(std::uint64_t round) {
    handler_iface& h = live();
    using k = holdfast::agreement_key;
    std::optional<std::string> claim, outcome, final_claim, final_outcome, err;
    std::vector<std::pair<int, std::string>> acks, final_acks;
    {
      py::gil_scoped_release nogil;
      holdfast::any_kv& kv = h.kv();
      const std::string& scope = h.key_scope();
      auto get = [&](k key, int task = -1) {
        return kv.try_get(holdfast::agreement_key_name(scope, key, round, task));
      };
      claim = get(k::claim);
      outcome = get(k::step);
      final_claim = get(k::final_claim);
      final_outcome = get(k::final_step);
      err = get(k::error);
      for (int t = 0; t < h.cluster().num_tasks; ++t) {
        if (auto v = get(k::ack, t)) acks.emplace_back(t, *v);
        if (auto v = get(k::final_ack, t)) final_acks.emplace_back(t, *v);
      }
    }
    py::dict d;
    d["round"] = round;
    d["claim"] = describe(claim);
    d["acks"] = counters(acks);
    d["outcome"] = describe(outcome);
    d["final_claim"] = describe(final_claim);
    d["final_acks"] = counters(final_acks);
    d["final_outcome"] = describe(final_outcome);
    if (err) {
      py::dict e;
      auto nl = err->find('\n');
      e["task"] = err->substr(0, nl);
      e["text"] = *err;
      d["error"] = e;
    } else {
      d["error"] = py::none();
    }
    return d;
  }

 private:
  struct call_ctx {
    PyObject* fn;
    PyObject* args;    // a tuple (maybe empty)
    PyObject* kwargs;  // a dict or nullptr
    PyThreadState* ts = nullptr;
    PyObject* result = nullptr;
    std::optional<py::error_already_set> error;

    static void invoke(void* p) {
      auto& c = *static_cast<call_ctx*>(p);
      PyEval_RestoreThread(c.ts);
      Py_XDECREF(c.result);  // a previous attempt's (never: the handler calls once)
      c.result = PyTuple_GET_SIZE(c.args) == 0 && !c.kwargs ? PyObject_CallNoArgs(c.fn)
                                                            : PyObject_Call(c.fn, c.args, c.kwargs);
      if (c.result) {
        c.ts = PyEval_SaveThread();
        return;
      }
      std::string message;
      {
        c.error.emplace();  // fetches the Python error
        message = describe_python_error(*c.error);
      }
      c.ts = PyEval_SaveThread();
      throw python_step_error(message);
    }
  };

  static std::string describe_python_error(const py::error_already_set& e) {
    try {
      std::string type = py::str(e.type().attr("__name__"));
      std::string text = py::str(e.value());
      return text.empty() ? type : type + ": " + text;
    } catch (...) {
      return "Python exception";
    }
  }

  static py::object describe(const std::optional<std::string>& v) {
    if (!v) return py::none();
    py::dict d;
    d["text"] = *v;
    auto parsed = holdfast::parse_agreement_value(*v);
    if (!parsed) return std::move(d);
    using kind = holdfast::agreement_value::kind;
    const char* what = "claim";
    switch (parsed->what) {
      case kind::claim:
        what = "claim";
        break;
      case kind::step:
        what = "step";
        break;
      case kind::timeout:
        what = "timeout";
        break;
      case kind::abort:
        what = "abort";
        break;
      case kind::hang:
        what = "hang";
        break;
      case kind::none:
        what = "none";
        break;
    }
    d["kind"] = what;
    d["by"] = parsed->writer;
    if (parsed->what == kind::step) d["step"] = parsed->step;
    if (parsed->what == kind::timeout) d["missing"] = parsed->tasks;
    if (auto hv = holdfast::hang_verdict_of(*parsed)) d["verdict"] = verdict_dict(*hv);
    return std::move(d);
  }
  static py::dict counters(const std::vector<std::pair<int, std::string>>& acks) {
    py::dict d;
    for (const auto& [t, v] : acks) d[py::int_(t)] = v;
    return d;
  }

  handler_iface& live() const {
    if (!h_) throw holdfast::error(EBADF, "holdfast handler", "", "closed");
    return *h_;
  }

  std::unique_ptr<handler_iface> h_;
  holdfast::run_status last_status_ = holdfast::run_status::ran;
  struct {  // what the properties report after close()
    std::int64_t total = 0;
    std::optional<std::int64_t> restored;
    int exit_code = -1;
    double grace = 0;
    int task = 0, num_tasks = 1;
    std::string scope;
  } final_;
};

// ---------------------------------------------------------------------------------------------
// The cache.

/// The Python Cache: index-addressed, shared by the creating process, its forked children (e.g.
/// DataLoader workers) and processes that attach by path.
class py_cache {
 public:
  py_cache(std::uint64_t length, const std::string& dir, std::uint64_t size_limit) {
    holdfast::cache_options o;
    o.dir = dir;
    o.size_limit = size_limit;
    c_.emplace(holdfast::create_cache, length, o);
  }
  py_cache(holdfast::attach_cache_t, const std::string& path, std::uint64_t length) {
    c_.emplace(holdfast::attach_cache, path, length);
  }
  /// The item in slot i, or None (a lock-free read of the shared mapping).
  py::object get(std::uint64_t i) const {
    auto v = c_->get(i);
    if (!v) return py::none();
    return py::bytes(v->data(), v->size());
  }
  /// Stores bytes in slot i once; False when filled, frozen or full.
  bool put(std::uint64_t i, py::bytes b) {
    char* data = nullptr;
    Py_ssize_t n = 0;
    if (PyBytes_AsStringAndSize(b.ptr(), &data, &n) != 0) throw py::error_already_set();
    std::string_view view(data, static_cast<std::size_t>(n));
    py::gil_scoped_release nogil;  // another process may hold the lock
    return c_->put(i, view);
  }
  bool contains(std::uint64_t i) const { return c_->contains(i); }
  std::uint64_t length() const { return c_->length(); }
  const std::string& path() const { return c_->path(); }
  std::uint64_t filled() const { return c_->filled(); }

 private:
  std::optional<holdfast::multiprocess_file_cache> c_;
};

// ---------------------------------------------------------------------------------------------
// Exceptions: the classes are defined in __init__.py and handed over at import.

struct exception_classes {
  py::handle error, agreement_timeout, agreement_unreachable, peer_error, corrupt_cache,
      format_error, preempted, hang_detected;
};
exception_classes g_exc;  // strong references, never released (live until the process ends)

void set_exception_classes(py::dict d) {
  auto take = [&](const char* name) {
    py::object o = d[name];
    return o.release();  // keep the reference for the life of the process
  };
  g_exc.error = take("Error");
  g_exc.agreement_timeout = take("AgreementTimeout");
  g_exc.agreement_unreachable = take("AgreementUnreachable");
  g_exc.peer_error = take("PeerError");
  g_exc.corrupt_cache = take("CorruptCache");
  g_exc.format_error = take("FormatError");
  g_exc.preempted = take("Preempted");
  g_exc.hang_detected = take("HangDetected");
}

void raise_holdfast(py::handle cls, const holdfast::error& e, py::dict extra) {
  if (!cls) cls = g_exc.error ? g_exc.error : py::handle(PyExc_RuntimeError);
  py::object inst = cls(e.what());
  try {
    inst.attr("errno") = e.errnum();
    inst.attr("operation") = e.operation();
    inst.attr("path") = e.path();
    for (auto item : extra) inst.attr(item.first) = item.second;
  } catch (py::error_already_set&) {  // a class without settable attributes: the message only
  }
  PyErr_SetObject(cls.ptr(), inst.ptr());
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const preempted_exit& e) {
    py::handle cls = g_exc.preempted ? g_exc.preempted : py::handle(PyExc_SystemExit);
    py::object inst = cls(e.code);
    PyErr_SetObject(cls.ptr(), inst.ptr());
  } catch (const holdfast::peer_error& e) {
    py::dict x;
    x["origin_task"] = e.origin_task();
    x["type_name"] = e.type_name();
    x["message"] = e.message();
    raise_holdfast(g_exc.peer_error, e, x);
  } catch (const holdfast::agreement_timeout& e) {
    py::dict x;
    x["missing_tasks"] = e.missing_tasks();
    raise_holdfast(g_exc.agreement_timeout, e, x);
  } catch (const holdfast::hang_detected& e) {
    py::dict x;
    x["task"] = e.hung_task();
    x["phase"] = e.phase();
    x["step"] = e.step() < 0 ? py::object(py::none()) : py::object(py::int_(e.step()));
    x["elapsed_s"] = static_cast<double>(e.elapsed_ms()) / 1000.0;
    x["bound_s"] = static_cast<double>(e.bound_ms()) / 1000.0;
    raise_holdfast(g_exc.hang_detected, e, x);
  } catch (const holdfast::agreement_unreachable& e) {
    raise_holdfast(g_exc.agreement_unreachable, e, py::dict());
  } catch (const holdfast::corrupt_cache& e) {
    py::dict x;
    x["slot"] = e.slot();
    raise_holdfast(g_exc.corrupt_cache, e, x);
  } catch (const holdfast::format_error& e) {
    raise_holdfast(g_exc.format_error, e, py::dict());
  } catch (const holdfast::error& e) {
    raise_holdfast(g_exc.error, e, py::dict());
  }
}

}  // namespace holdfast_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace ht = holdfast_torch;
  m.doc() = "holdfast for PyTorch: preemption handler, checkpoints, multiprocess file cache";
  m.attr("holdfast_version") = holdfast::version.string;
  m.def("_set_exception_classes", &ht::set_exception_classes);
  // The log lines' queue (log_queue, above), for __init__.py's hand-over to logging.
  m.def("_set_log_emitter", [](py::object f) { ht::python_log_emitter() = std::move(f); });
  m.def("_log_after_fork", [] { ht::python_log_queue_ptr() = new ht::log_queue; });
  m.def("_log_fd", [] { return ht::python_log_queue().fd(); });
  m.def("_log_take", [] {
    py::list out;
    for (auto& [level, line] : ht::python_log_queue().take()) {
      // A path's bytes need not be UTF-8: undecodable ones as \xNN escapes, never an error.
      py::object text = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
          line.data(), static_cast<Py_ssize_t>(line.size()), "backslashreplace"));
      if (!text) throw py::error_already_set();
      out.append(py::make_tuple(level, text));
    }
    return out;
  });
  m.def(
      "take_incarnation",
      [](const std::string& url, const std::string& run_id, const std::string& taker) {
        py::gil_scoped_release nogil;
        holdfast::any_kv kv = holdfast::make_kv(url, holdfast::incarnation_namespace(run_id));
        return holdfast::take_incarnation(kv, taker);
      },
      py::arg("url"), py::arg("run_id"), py::arg("taker"),
      "A fresh incarnation number for this launch of run_id, from the store at url "
      "(holdfast/kv/incarnation.hpp).");
  py::register_exception_translator(&ht::translate);

  py::class_<ht::py_checkpoint_manager>(m, "CheckpointManager")
      .def(py::init<const std::string&, py::object, py::object, std::size_t, bool,
                    const std::string&, std::size_t, double, const std::string&, py::object>(),
           py::arg("directory"), py::arg("save"), py::arg("restore"), py::arg("max_to_keep") = 3,
           py::arg("async_save") = false, py::arg("local_dir") = "",
           py::arg("local_max_to_keep") = 2, py::arg("durable_wait") = 20.0, py::arg("owner") = "",
           py::arg("stage") = py::none())
      .def(
          "save",
          [](ht::py_checkpoint_manager& self, std::int64_t step) {
            py::gil_scoped_release nogil;
            return self.manager().save(step).path;
          },
          py::arg("step"),
          "Saves a checkpoint of `step` through the save callable, or (stage=) stages it and "
          "returns once its bytes are copied; its path.")
      .def_property_readonly(
          "save_in_flight",
          [](ht::py_checkpoint_manager& self) { return self.manager().save_in_flight(); })
      .def_property_readonly(
          "staging_capacity",
          [](ht::py_checkpoint_manager& self) { return self.manager().staging_capacity(); })
      .def(
          "restore",
          [](ht::py_checkpoint_manager& self) {
            py::gil_scoped_release nogil;
            return self.manager().restore();
          },
          "Loads the latest checkpoint through the restore callable; its step, or None.")
      .def(
          "restore_step",
          [](ht::py_checkpoint_manager& self, std::int64_t step) {
            py::gil_scoped_release nogil;
            self.manager().restore_step(step);
          },
          py::arg("step"))
      .def("all_steps",
           [](ht::py_checkpoint_manager& self) {
             py::gil_scoped_release nogil;
             return self.manager().all_steps();
           })
      .def(
          "pin",
          [](ht::py_checkpoint_manager& self, std::optional<std::int64_t> step) {
            self.manager().pin(step);
          },
          py::arg("step"))
      .def_property_readonly(
          "pinned", [](ht::py_checkpoint_manager& self) { return self.manager().pinned(); })
      .def_property_readonly(
          "latest_step",
          [](ht::py_checkpoint_manager& self) { return self.manager().latest_step(); })
      .def("wait_until_finished",
           [](ht::py_checkpoint_manager& self) {
             py::gil_scoped_release nogil;
             self.manager().wait_until_finished();
           })
      .def_property_readonly(
          "directory", [](ht::py_checkpoint_manager& self) { return self.manager().directory(); })
      .def_property_readonly(
          "local_directory",
          [](ht::py_checkpoint_manager& self) { return self.manager().local_directory(); })
      .def_property_readonly("durable_step",
                             [](ht::py_checkpoint_manager& self) {
                               py::gil_scoped_release nogil;
                               return self.manager().durable_step();
                             })
      .def_property_readonly("unfinished", [](ht::py_checkpoint_manager& self) {
        return self.manager().unfinished();
      });

  py::class_<ht::py_save_policy>(m, "_SavePolicy", "save_interval_policy and its run history")
      .def(py::init<const std::string&, double, double, double, double>(), py::arg("history_dir"),
           py::arg("mtbi_prior_s"), py::arg("min_interval_s"), py::arg("max_interval_s"),
           py::arg("prior_weight") = 1.0)
      .def("should_save", &ht::py_save_policy::should_save)
      .def("record_save", &ht::py_save_policy::record_save, py::arg("cost_s"))
      .def("note_notice", &ht::py_save_policy::note_notice)
      .def("note_clean_end", &ht::py_save_policy::note_clean_end)
      .def_property_readonly("interval", &ht::py_save_policy::interval)
      .def_property_readonly("mtbi", &ht::py_save_policy::mtbi)
      .def_property_readonly("save_cost", &ht::py_save_policy::save_cost)
      .def_property_readonly("unnoticed", &ht::py_save_policy::unnoticed);

  py::class_<ht::py_torch_kv>(m, "_TorchKV", "torch_kv on a c10d store (tests, benchmarks)")
      .def(py::init<c10::intrusive_ptr<c10d::Store>, const std::string&, std::uint64_t, double,
                    double>(),
           py::arg("store"), py::arg("run_id"), py::arg("restart") = 0, py::arg("poll") = 0.01,
           py::arg("slice") = 30.0, py::call_guard<py::gil_scoped_release>())
      .def("insert",
           [](ht::py_torch_kv& self, const std::string& key, const std::string& value) {
             py::gil_scoped_release nogil;
             return self.kv().insert(key, value);
           })
      .def("put",
           [](ht::py_torch_kv& self, const std::string& key, const std::string& value) {
             py::gil_scoped_release nogil;
             self.kv().put(key, value);
           })
      .def("try_get",
           [](ht::py_torch_kv& self, const std::string& key) {
             py::gil_scoped_release nogil;
             return self.kv().try_get(key);
           })
      .def("get",
           [](ht::py_torch_kv& self, const std::string& key, double timeout) {
             py::gil_scoped_release nogil;
             return self.kv().get(key, ht::py_torch_kv::seconds(timeout));
           })
      .def("get_many",
           [](ht::py_torch_kv& self, const std::vector<std::string>& keys, double timeout) {
             py::gil_scoped_release nogil;
             return self.kv().get_many(keys, ht::py_torch_kv::seconds(timeout));
           })
      .def("erase",
           [](ht::py_torch_kv& self, const std::string& key) {
             py::gil_scoped_release nogil;
             return self.kv().erase(key);
           })
      .def_property_readonly(
          "can_watch",
          [](ht::py_torch_kv& self) { return self.kv().supports(holdfast::kv_op::watch); })
      .def("watch", [](ht::py_torch_kv& self, const std::string& prefix) {
        return ht::py_torch_watch(self.kv().watch(prefix));
      });
  py::class_<ht::py_torch_watch>(m, "_TorchWatch")
      .def("fd", [](ht::py_torch_watch& self) { return self.live().fd(); })
      .def("buffered", [](ht::py_torch_watch& self) { return self.live().buffered(); })
      .def("due_in", &ht::py_torch_watch::due_in)
      .def("take", [](ht::py_torch_watch& self) { return self.live().take().resync; })
      .def("follow",
           [](ht::py_torch_watch& self, const std::string& key) { self.live().follow({key}); })
      .def("follow", [](ht::py_torch_watch& self,
                        const std::vector<std::string>& keys) { self.live().follow(keys); })
      .def("close", &ht::py_torch_watch::close);

  py::class_<ht::py_handler>(m, "Handler")
      .def(py::init<const std::string&, const std::string&,
                    std::optional<c10::intrusive_ptr<c10d::Store>>, int, int, const std::string&,
                    std::uint64_t, const ht::py_checkpoint_manager&, double, std::optional<double>,
                    double, double, double, const std::string&, const std::string&,
                    std::optional<double>, double, std::uint32_t, double, int, py::object, double,
                    double>(),
           py::arg("preset"), py::arg("store"), py::arg("torch_store"), py::arg("task"),
           py::arg("num_tasks"), py::arg("run_id"), py::arg("restart"), py::arg("checkpoints"),
           py::arg("ack_timeout"), py::arg("grace"), py::arg("grace_margin"),
           py::arg("watch_interval"), py::arg("store_poll"), py::arg("notice_file"),
           py::arg("hang_policy"), py::arg("hang_timeout"), py::arg("hang_multiplier"),
           py::arg("hang_warmup_steps"), py::arg("hang_period"), py::arg("hang_exit_code"),
           py::arg("on_hang"), py::arg("start_timeout"), py::arg("restore_timeout"))
      .def("run", &ht::py_handler::run, py::arg("step_fn"))
      .def("save_checkpoint_if_preempted", &ht::py_handler::save_checkpoint_if_preempted)
      .def_property_readonly("total_run_calls", &ht::py_handler::total_run_calls)
      .def_property_readonly("restored_step", &ht::py_handler::restored_step)
      .def_property_readonly("last_status", &ht::py_handler::last_status)
      .def_property_readonly("state", &ht::py_handler::state)
      .def_property_readonly("mean_step_time", &ht::py_handler::mean_step_time)
      .def_property_readonly("grace_period", &ht::py_handler::grace_period)
      .def_property_readonly("exit_code", &ht::py_handler::exit_code)
      .def_property_readonly("task", &ht::py_handler::task)
      .def_property_readonly("num_tasks", &ht::py_handler::num_tasks)
      .def_property_readonly("key_scope", &ht::py_handler::key_scope)
      .def("round_summary", &ht::py_handler::round_summary, py::arg("round") = 0)
      .def("pause_hang_detection", &ht::py_handler::pause_hang_detection,
           "No hang bound until the next run() (work between steps: an evaluation, an export).")
      .def("learned_hang_bounds", &ht::py_handler::learned_hang_bounds,
           "What the hang detector learned: {step_s, save_s, restore_s, steps} and the bounds "
           "in force now: {step_bound_s, save_bound_s, restore_bound_s} (None: hang_policy "
           "'none').")
      .def("close", &ht::py_handler::close, py::arg("failed") = false);

  py::class_<ht::py_cache>(m, "Cache")
      .def(py::init<std::uint64_t, const std::string&, std::uint64_t>(), py::arg("length"),
           py::arg("dir") = "", py::arg("size_limit") = 0)
      .def_static(
          "attach",
          [](const std::string& path, std::uint64_t length) {
            return std::make_unique<ht::py_cache>(holdfast::attach_cache, path, length);
          },
          py::arg("path"), py::arg("length") = 0)
      .def("get", &ht::py_cache::get, py::arg("i"))
      .def("put", &ht::py_cache::put, py::arg("i"), py::arg("data"))
      .def("__contains__", &ht::py_cache::contains)
      .def("__len__", &ht::py_cache::length)
      .def_property_readonly("path", &ht::py_cache::path)
      .def("filled", &ht::py_cache::filled)
      .def(py::pickle(  // a spawned process attaches to the same file by path
          [](const ht::py_cache& c) { return py::make_tuple(c.path(), c.length()); },
          [](py::tuple t) {
            return std::make_unique<ht::py_cache>(holdfast::attach_cache, t[0].cast<std::string>(),
                                                  t[1].cast<std::uint64_t>());
          }));
}
