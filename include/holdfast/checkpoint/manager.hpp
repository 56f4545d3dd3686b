// holdfast/checkpoint/manager.hpp — checkpoint_manager: saves a run's checkpoints as whole
// directories, names the latest in the pointer, applies retention, restores; one writer and any
// number of read_only readers side by side. The Checkpointer preemption_handler uses by default.
//
// Protocol of save(step, writer):
//   1. rename mode: mkdir a staging directory, writer fills it (in the caller's thread), the
//      metadata file is added (with each file's size and CRC32C), publish_directory syncs every
//      file and renames it to the checkpoint's name, syncing the parent; marker mode
//      (mounted_remote): mkdir the checkpoint in place, writer fills it, commit_directory syncs it
//      and writes commit_success.txt last, then the parent directory is synced (so the new entry is
//      durable before the pointer);
//   2. the pointer is published atomically naming the new latest, the retained list, and the
//      checkpoints about to be deleted (those the retention policy drops: never the latest,
//      never one of the pinned step);
//   3. the deletions: each checkpoint is locked exclusively (flock LOCK_EX|LOCK_NB on its
//      directory), then renamed aside (or its marker removed) and removed; one a reader holds
//      is left, still listed as "delete", for the next save;
//   4. the pointer is published again without the deletions that were done.
//   With checkpoint_options::async_save, step 1's writer runs in the caller's thread and the
//   rest (a deferred write the writer returned, the syncs, the rename, steps 2-4) on one
//   background thread.
//
// Guarantees:
//   - A writing manager holds the writer lock (writer_lock.hpp) for its whole life and sweeps
//     what crashed saves left when it opens (maintenance.hpp). A read_only manager never
//     creates, sweeps, deletes or publishes anything, and save() refuses (EROFS).
//   - restore()/restore_step() hold LOCK_SH on the checkpoint while the reader runs
//     (reader_lock.hpp); deletions need LOCK_EX|LOCK_NB.
//   - latest() names a complete checkpoint whenever the writer was killed: before step 2 the
//     previous pointer still names the previous checkpoint, which retention never deletes. A bad
//     pointer is recovered from, never thrown for (pointer.hpp).
//   - A writer that throws leaves no trace: the staging (or in-place) directory is removed and
//     the pointer is unchanged. So does a failed background save; its error is rethrown by
//     wait_until_finished() and by the next save(), restore() or restore_step().
//   - Async saves: at most one in flight (the next save() waits for it); restore(),
//     restore_step(), repair(), wait_until_finished() and destruction wait for it.
//   - Only checkpoints that count are listed, restored and counted by retention (listing.hpp):
//     holdfast's metadata of the step, and every file it records there with its recorded size
//     (one read and one lstat per file, no byte summed); an empty or hand-made directory, or one
//     whose metadata is damaged or whose recorded file is gone, is skipped with one log line
//     per process. all_steps() lists a step exactly when restore_step() of it finds a complete
//     retained checkpoint that counts; latest_step() never throws. all_identities() gives the
//     same checkpoints' identities (step and history, metadata.hpp), never throwing for a
//     damaged file (it is not listed); every save records the history begin_history() set last
//     (the handler's restore agreement sets the launch's, so checkpoints of one step from different
//     launches never match), or none (unknown) before it is called.
//   - Retention (retention.hpp) never deletes the latest nor a checkpoint of the pinned step.
//   - Every save records in its metadata the hang bounds set_hang_bounds() set last (sync and
//     async saves alike: they are taken in save()'s thread, before it returns), or none before
//     it is called. restored_hang_bounds() is the bounds the metadata of the checkpoint the last
//     restore()/restore_step() loaded records: none when that restore found no checkpoint,
//     threw, or the checkpoint records none (saved without them, by an older holdfast, or a
//     malformed or unreadable metadata file: the bounds never fail a restore).
//   - Integrity (integrity.hpp): with checksums on (the default), the metadata records every
//     file's size and CRC32C, summed after the writer and its deferred part ran and before the
//     syncs, in the thread that commits (one read of what was just written); where the store
//     syncs files, each file's writeback is started as it is summed (Io::start_writeback, a
//     hint), so the disk writes while the CPU sums and the syncs after wait for less. restore() and
//     restore_step() check them under the same LOCK_SH before the reader runs: restore_step()
//     of a corrupt checkpoint throws checkpoint_corrupt naming it and its first bad file;
//     restore() logs the corrupt latest and loads the newest older step that is not corrupt,
//     and throws checkpoint_corrupt (the latest's) when none is. A checkpoint without recorded
//     sums (older, or checksums off) is unverified and restores. Listing (all_steps,
//     all_identities, latest_step) sums nothing: it stats the recorded files (above), so a
//     missing or resized file takes its step out of the listings and out of restore()'s
//     choice; a flipped byte (same size) is found by restore()/restore_step() only.
//   - Retention's candidates are the checkpoints that count: one that does not is neither
//     counted among the kept nor deleted (repair() deletes it); a recovered pointer holds only
//     those that count. Each kept checkpoint is judged once per manager (those it saved or
//     listed at open are known to count), so a save judges nothing again.
// Caveats:
//   - flock belongs to the open file description: a child forked while a manager lives shares
//     its writer lock (exec drops it, descriptors are O_CLOEXEC). Do not fork while an async
//     save is in flight.
//   - The pin lives in the manager only, not in the pointer: a restarted process pins again.
//   - latest_step() is the largest retained step, latest() the checkpoint saved last: they
//     differ after an older step is saved again (a job restored at an older step re-saves it).
//   - A second writing manager in the same process is a second writer: it waits, then throws
//     checkpoint_locked. Share one manager, or open the others read_only.
//   - A writer that lost its lease (paused longer than lease_stale_after) throws
//     checkpoint_locked from its saves; the checkpoint it was committing stays unnamed.
//   - A step whose async save fails counts for should_save() until the failure is rethrown.
//   - A checkpoint corrupt only in its bytes (same sizes: listing does not read them) still
//     counts: it is listed, counts for should_save() and retention removes it in time; one that
//     does not count stays where it is until repair(), and checkpoints() still names it (every
//     complete retained directory). A read_only reader changes nothing.
//   - With checksums off, restores do not check recorded sums either; verify_step() always does.
//   - An async save writes the metadata on the background thread: a writer that creates
//     holdfast-metadata.json itself fails there (EEXIST, rethrown later), not in save().
//   - A manager is not thread-safe: one thread at a time calls it (its background save and the
//     lease heartbeat are its own). The log hook may be called from the background thread. A
//     moved-from manager may only be destroyed or assigned to.
#pragma once

#include <fcntl.h>     // O_WRONLY: the new checkpoint's directory
#include <sys/stat.h>  // struct stat: mtimes of checkpoints without metadata

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>  // std::invalid_argument: a bad history id
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../publish.hpp"   // basic_publisher: publish_directory, commit_directory
#include "../store.hpp"     // store, directory_commit, detail::store_make_dirs
#include "integrity.hpp"    // checkpoint_integrity: each file's size and CRC32C
#include "maintenance.hpp"  // detail::checkpoint_maintenance: sweep, deletions, verify, repair
#include "metadata.hpp"     // checkpoint_metrics, checkpoint_metadata, the metadata file
#include "names.hpp"        // checkpoint_info, detail::checkpoint_name
#include "options.hpp"      // checkpoint_options
#include "pointer.hpp"      // detail::checkpoint_pointer
#include "reader_lock.hpp"  // detail::checkpoint_read_locked: restores under LOCK_SH
#include "retention.hpp"    // retention_policy, retention_candidate, metric_order
#include "writer_lock.hpp"  // detail::checkpoint_writer_lock

HOLDFAST_NAMESPACE_BEGIN

/// Tag: open a checkpoint directory for reading only (no sweep, no mkdir, no pointer write).
struct read_only_t {
  explicit read_only_t() = default;
};
/// The read_only_t value.
inline constexpr read_only_t read_only{};

namespace detail {

// Calls f(dir, step) or f(dir), whichever it accepts.
template <class F>
void checkpoint_call(F& f, const std::string& dir, std::int64_t step) {
  if constexpr (std::is_invocable_v<F&, const std::string&, std::int64_t>)
    f(dir, step);
  else
    f(dir);
}

// Wraps what a writer returned: nothing, or a callable that finishes the write later.
template <class R>
std::function<void()> checkpoint_deferred(R&& r) {
  using D = std::decay_t<R>;
  static_assert(std::is_invocable_v<D&>,
                "holdfast: a checkpoint writer returns void, or a callable that finishes the "
                "write (it runs on the background thread of an async save)");
  auto held = std::make_shared<D>(std::forward<R>(r));  // a move-only callable is fine too
  return [held] { (*held)(); };
}

// A stored writer's result is already the deferred part (empty when it has none).
inline std::function<void()> checkpoint_deferred(std::function<void()> f) { return f; }

// Calls a writer as f(dir, step) or f(dir); returns its deferred part (empty when it has none).
template <class F>
std::function<void()> checkpoint_call_writer(F& f, const std::string& dir, std::int64_t step) {
  if constexpr (std::is_invocable_v<F&, const std::string&, std::int64_t>) {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, const std::string&, std::int64_t>>) {
      f(dir, step);
      return {};
    } else {
      return checkpoint_deferred(f(dir, step));
    }
  } else {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, const std::string&>>) {
      f(dir);
      return {};
    } else {
      return checkpoint_deferred(f(dir));
    }
  }
}

}  // namespace detail

/// Checkpoints of one run: save, retention, latest, restore; one writer, any number of
/// read_only readers. Store: a basic_store (its Filesystem policy gives the Io, the
/// Durability and the commit mode).
template <class Store = store>
class checkpoint_manager {
 public:
  using store_type = Store;                                          ///< the store
  using io_type = typename Store::io_type;                           ///< its syscall policy
  using durability_type = typename Store::durability_type;           ///< its publishing durability
  using publisher_type = basic_publisher<durability_type, io_type>;  ///< publishes dirs and pointer
  /// Fills a checkpoint directory; may also take the step as a second argument, and may return
  /// a callable that finishes the write (on the background thread of an async save).
  using writer_type = std::function<void(const std::string& dir, std::int64_t step)>;
  /// Loads a checkpoint directory; may also take the step as a second argument.
  using reader_type = std::function<void(const std::string& dir, std::int64_t step)>;
  /// The metadata file in each checkpoint.
  static constexpr std::string_view metadata_file_name = detail::checkpoint_metadata_file_name;

  /// Writes <store>/runs/<run_id>/checkpoint: creates it, takes the writer lock (waiting up to
  /// writer_lock_timeout), then sweeps what crashed saves left.
  checkpoint_manager(const Store& s, std::string_view run_id, checkpoint_options options = {})
      : checkpoint_manager(s.checkpoint_path(run_id), s.commit_mode(), std::move(options)) {}

  /// Writes the checkpoint directory `dir` directly, committing by `mode`.
  checkpoint_manager(std::string dir, directory_commit mode, checkpoint_options options = {})
      : s_(std::make_unique<impl>(std::move(dir), mode, std::move(options), false)) {
    s_->open_writer();
  }

  /// Reads <store>/runs/<run_id>/checkpoint without modifying anything.
  checkpoint_manager(read_only_t, const Store& s, std::string_view run_id,
                     checkpoint_options options = {})
      : checkpoint_manager(read_only, s.checkpoint_path(run_id), s.commit_mode(),
                           std::move(options)) {}

  /// Reads the checkpoint directory `dir` (committed by `mode`) without modifying anything.
  checkpoint_manager(read_only_t, std::string dir, directory_commit mode,
                     checkpoint_options options = {})
      : s_(std::make_unique<impl>(std::move(dir), mode, std::move(options), true)) {}

  checkpoint_manager(checkpoint_manager&&) noexcept = default;
  /// Finishes this manager's save in flight and releases its lock, then takes `o`'s state.
  checkpoint_manager& operator=(checkpoint_manager&& o) noexcept {
    if (this != &o) {
      s_.reset();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  checkpoint_manager(const checkpoint_manager&) = delete;
  checkpoint_manager& operator=(const checkpoint_manager&) = delete;
  /// Waits for a save in flight (its failure is logged), then releases the writer lock.
  ~checkpoint_manager() = default;

  /// The checkpoint directory.
  const std::string& directory() const noexcept { return s_->dir; }
  /// The pointer file: <directory>/latest.
  std::string pointer_path() const { return s_->pointer_path(); }
  /// How checkpoints are committed (rename, or a marker on mounts).
  directory_commit commit_mode() const noexcept { return s_->mode; }
  /// The options given at construction.
  const checkpoint_options& options() const noexcept { return s_->options; }
  /// True when opened with read_only.
  bool is_read_only() const noexcept { return s_->read_only; }
  /// A writer: true when its writer lock is a flock, false when it is the lease.
  bool uses_flock() const noexcept { return s_->lock.uses_flock(); }

  /// Sets the writer save(step) uses.
  template <class Writer>
  void set_writer(Writer writer) {
    s_->default_writer = [w = std::move(writer)](const std::string& d, std::int64_t st) mutable {
      return detail::checkpoint_call_writer(w, d, st);
    };
  }
  /// Sets the reader restore() uses.
  template <class Reader>
  void set_reader(Reader reader) {
    s_->default_reader = [r = std::move(reader)](const std::string& d, std::int64_t st) mutable {
      detail::checkpoint_call(r, d, st);
    };
  }
  /// Sets the log hook (empty: log_to_stderr).
  void set_log(log_fn log) {
    std::lock_guard<std::mutex> l(s_->mutex);
    s_->options.log = std::move(log);
  }

  /// Saves a checkpoint of `step` with the writer given to set_writer (the Checkpointer call
  /// preemption_handler makes). Throws holdfast::error (EINVAL) when no writer was set.
  checkpoint_info save(std::int64_t step) {
    if (!s_->default_writer)
      throw error(EINVAL, "checkpoint save", s_->dir,
                  "no writer: call set_writer() first, or save(step, writer)");
    return s_->save(step, s_->default_writer, nullptr);
  }

  /// As save(step), recording `metrics` in the checkpoint's metadata.
  checkpoint_info save(std::int64_t step, const checkpoint_metrics& metrics) {
    if (!s_->default_writer)
      throw error(EINVAL, "checkpoint save", s_->dir,
                  "no writer: call set_writer() first, or save(step, writer)");
    return s_->save(step, s_->default_writer, &metrics);
  }

  /// Saves a checkpoint of `step`: `writer(dir[, step])` fills a fresh directory, which is
  /// committed whole, then the pointer names it and retention runs. Returns the checkpoint
  /// (with async_save, the one being committed). Throws holdfast::error (EROFS) when read_only.
  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer&& writer) {
    return s_->save(step, writer, nullptr);
  }

  /// As save(step, writer), recording `metrics` in the checkpoint's metadata.
  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer&& writer, const checkpoint_metrics& metrics) {
    return s_->save(step, writer, &metrics);
  }

  /// Waits for the save in flight (async_save), and rethrows its failure, once.
  void wait_until_finished() { s_->finish_and_rethrow(); }

  /// True when a save of `step` is due: a writer, a step newer than every saved (or in-flight)
  /// one, and a multiple of save_interval_steps or save_interval elapsed since the last save.
  bool should_save(std::int64_t step) const { return s_->should_save(step); }

  /// The latest checkpoint that counts (the pointer's, else the newest that counts; recovered
  /// from disk when the pointer is bad), or nothing.
  std::optional<checkpoint_info> latest() const { return s_->latest(); }

  /// Every complete retained checkpoint, oldest first (the latest last), counting as a checkpoint
  /// or not: what is on disk (verify() names those that do not count; the listings that choose
  /// a restore, all_steps() and latest(), leave them out).
  std::vector<checkpoint_info> checkpoints() const { return s_->complete_list(); }

  /// Loads the latest checkpoint with the reader given to set_reader (when one is set), holding
  /// LOCK_SH on it, and returns its step, or nothing when there is no checkpoint yet. A corrupt
  /// latest is logged and the newest older step that is not corrupt is loaded instead
  /// (checkpoint_corrupt when there is none).
  std::optional<std::int64_t> restore() {
    s_->finish_and_rethrow();
    return s_->read_latest(s_->default_reader);
  }

  /// Loads the latest checkpoint with `reader(dir[, step])` and returns its step, or nothing.
  template <class Reader>
  std::optional<std::int64_t> restore(Reader&& reader) {
    s_->finish_and_rethrow();
    reader_type r = [&reader](const std::string& d, std::int64_t st) {
      detail::checkpoint_call(reader, d, st);
    };
    return s_->read_latest(r);
  }

  /// Steps of every complete retained checkpoint that counts (holdfast's metadata, every
  /// recorded file there with its size; one read and one stat per file), ascending, each once.
  std::vector<std::int64_t> all_steps() const { return s_->all_steps(); }

  /// The identity (step and history, metadata.hpp) of each checkpoint all_steps() lists, in the
  /// same order: of each step the one restore_step() loads (a damaged metadata file is not
  /// listed, so it never throws for one).
  std::vector<checkpoint_identity> all_identities() const { return s_->all_identities(); }

  /// Starts a history: every checkpoint saved from now on records `history` (the handler gives
  /// the restore agreement's; until then saves record none, an unknown history).
  /// Throws std::invalid_argument when `history` is not a history id.
  void begin_history(std::string history) {
    if (!checkpoint_history_ok(history))
      throw std::invalid_argument("checkpoint_manager: bad history id '" + history + "'");
    s_->history = std::move(history);
  }

  /// The history the next save records ("" before begin_history: unknown).
  const std::string& history() const noexcept { return s_->history; }

  /// Sets the hang bounds every later save records in its metadata, until set again (the
  /// handler gives its learner's before each save, so the next start begins with them).
  void set_hang_bounds(const hang_bounds& bounds) { s_->hang = bounds; }

  /// The hang bounds recorded in the checkpoint the last restore()/restore_step() loaded;
  /// nothing when none was restored or it records none.
  std::optional<hang_bounds> restored_hang_bounds() const noexcept { return s_->restored_hang; }

  /// The hang bounds the newest retained checkpoint records, read without restoring it (the
  /// handler holds its restore to the restore bound they carry); nothing when there is no
  /// checkpoint, it records none, or its metadata cannot be read.
  std::optional<hang_bounds> newest_hang_bounds() const noexcept {
    try {
      auto list = s_->listed();
      return list.empty() ? std::nullopt : s_->hang_bounds_at(list.back().path);
    } catch (...) {
      return std::nullopt;
    }
  }

  /// The newest step of all_steps(), or nothing when there is none or it cannot be read.
  std::optional<std::int64_t> latest_step() const noexcept {
    try {
      auto steps = all_steps();
      if (steps.empty()) return std::nullopt;
      return steps.back();
    } catch (...) {
      return std::nullopt;
    }
  }

  /// Checks the checkpoint restore_step(step) would load against the sizes and CRC32Cs its
  /// metadata records (under LOCK_SH): ok, unverified (none recorded) or the first bad file and
  /// why. Throws holdfast::error (ENOENT) when there is no such checkpoint.
  checkpoint_integrity verify_step(std::int64_t step) const { return s_->verify_step(step); }

  /// Loads the checkpoint of exactly `step` with the reader given to set_reader (when one is
  /// set), once its files are checked. Throws holdfast::error (ENOENT) naming the directory and
  /// the step when it has none, checkpoint_corrupt naming the checkpoint and the file when a
  /// file does not match what its save recorded.
  void restore_step(std::int64_t step) {
    s_->finish_and_rethrow();
    s_->read_step(step, s_->default_reader);
  }

  /// Loads the checkpoint of exactly `step` with `reader(dir[, step])`; ENOENT as above.
  template <class Reader>
  void restore_step(std::int64_t step, Reader&& reader) {
    s_->finish_and_rethrow();
    reader_type r = [&reader](const std::string& d, std::int64_t st) {
      detail::checkpoint_call(reader, d, st);
    };
    s_->read_step(step, r);
  }

  /// Pins `step` (nullopt unpins): retention never deletes a checkpoint of the pinned step.
  void pin(std::optional<std::int64_t> step) noexcept {
    s_->pinned.store(step ? *step : impl::no_pin);
  }
  /// The pinned step, if any.
  std::optional<std::int64_t> pinned() const noexcept {
    std::int64_t p = s_->pinned.load();
    if (p == impl::no_pin) return std::nullopt;
    return p;
  }

  /// The metadata of the checkpoint restore_step(step) would load; nothing when there is none
  /// or it has no (readable) metadata file.
  std::optional<checkpoint_metadata> metadata(std::int64_t step) const {
    auto c = s_->find_step(step);
    if (!c) return std::nullopt;
    return s_->load_metadata(c->name);
  }

  /// The retained step whose metadata has the best `metric` (ties: the newer), or nothing.
  std::optional<std::int64_t> best_step(std::string_view metric, metric_order order) const {
    std::optional<std::int64_t> best;
    double best_value = 0;
    for (std::int64_t st : all_steps()) {
      auto m = metadata(st);
      auto v = m ? m->metric(metric) : std::nullopt;
      if (!v) continue;
      bool better = !best || (order == metric_order::max ? *v >= best_value : *v <= best_value);
      if (better) {
        best = st;
        best_value = *v;
      }
    }
    return best;
  }

  /// What is on disk: the pointer's state, the checkpoints used, and what is wrong or left
  /// over. Logs nothing, changes nothing.
  checkpoint_report verify() const { return s_->verify(); }

  /// Writer only: waits for a save in flight, sweeps leftovers, finishes listed deletions and
  /// rewrites the pointer from what verify() reports as used. Returns the report afterwards.
  checkpoint_report repair() { return s_->repair(); }

 private:
  class impl;
  std::unique_ptr<impl> s_;
};

// All of a manager's state, on the heap so that a background save and the lease heartbeat
// keep working while the manager object itself is moved (preemption_handler takes it by value).
// It builds on checkpoint_maintenance (maintenance.hpp), itself built on checkpoint_directory
// (pointer.hpp); the writer lock (writer_lock.hpp) is a member.
template <class Store>
class checkpoint_manager<Store>::impl
    : public detail::checkpoint_maintenance<typename Store::io_type,
                                            typename Store::durability_type> {
  using base = detail::checkpoint_maintenance<io_type, durability_type>;

 public:
  using base::complete_list;
  using base::counted_list;
  using base::dir;
  using base::find_step;
  using base::latest;
  using base::log;
  using base::mode;
  using base::mutex;
  using base::options;
  using base::parse;
  using base::path_of;
  using base::pointer_path;
  using base::read_only;
  using base::read_view;
  using base::remove_checkpoint;
  using base::scratch_name;
  using base::step_of;
  using base::sweep;
  using base::verify;
  using base::write_pointer;
  using typename base::counted;
  using typename base::view;

  static constexpr std::int64_t no_pin = std::numeric_limits<std::int64_t>::min();
  using writer_fn = std::function<std::function<void()>(const std::string&, std::int64_t)>;

  impl(std::string d, directory_commit m, checkpoint_options o, bool ro)
      : base(std::move(d), m, std::move(o), ro),
        lock(dir, options.lock, options.writer_lock_timeout, options.lease_stale_after,
             [this](std::string_view line) { log(std::string(line)); }) {}
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  ~impl() {
    finish();
    std::exception_ptr f = std::exchange(failure, nullptr);
    if (f) {
      try {
        std::rethrow_exception(f);
      } catch (const std::exception& e) {
        log("checkpoint: the background save of step " + std::to_string(failed_step) + " in '" +
            dir + "' failed and nobody waited for it: " + e.what());
      } catch (...) {
        log("checkpoint: the background save of step " + std::to_string(failed_step) +
            " failed with a non-standard exception");
      }
    }
    lock.release();
  }

  // --- construction of a writer ----------------------------------------------------------------

  void open_writer() {
    auto created = detail::store_make_dirs<io_type>(dir);
    if (!created.empty())
      detail::store_sync_dir<durability_type, io_type>(detail::store_parent(created[0]));
    for (std::size_t i = 0; i + 1 < created.size(); ++i)
      detail::store_sync_dir<durability_type, io_type>(created[i]);
    lock.acquire();
    sweep();
    auto list = counted_list();  // every retained checkpoint that counts, for should_save()
    for (const auto& c : list) {
      known.insert(c.info.name);
      if (!last_step || c.info.step > *last_step) last_step = c.info.step;
    }
  }

  std::chrono::system_clock::time_point now() const {
    return options.clock ? options.clock() : std::chrono::system_clock::now();
  }

  // --- reading under LOCK_SH ---------------------------------------------------------------------

  template <class Resolve, class Use>
  bool read_locked(Resolve resolve, Use use) const {
    return detail::checkpoint_read_locked<io_type, publisher_type>(dir, mode, options.lock, resolve,
                                                                   use);
  }

  // The latest checkpoint, or after a corrupt one (of step `below`) the newest older step.
  std::optional<std::int64_t> read_latest(const reader_type& reader) {
    restored_hang.reset();
    std::optional<std::int64_t> step, below;
    std::optional<checkpoint_integrity> first_bad;
    for (;;) {  // `below` falls with each corrupt checkpoint: bounded by the steps retained
      std::optional<checkpoint_integrity> bad;
      bool found = read_locked([&] { return below ? newest_below(*below) : latest(); },
                               [&](const checkpoint_info& c) {
                                 if (options.checksums) {
                                   checkpoint_integrity r = check(c);
                                   if (r.corrupt()) {
                                     bad = std::move(r);
                                     return;
                                   }
                                 }
                                 if (reader) reader(c.path, c.step);
                                 step = c.step;
                                 restored_hang = hang_bounds_at(c.path);
                               });
      if (bad) {
        log("checkpoint restore: '" + bad->path + "' (step " + std::to_string(bad->step) +
            ") is corrupt: " + to_string(bad->status) + " of '" + bad->file + "' (" + bad->detail +
            "); trying the next older complete checkpoint");
        if (!first_bad) first_bad = bad;
        below = bad->step;
        continue;
      }
      if (!found && first_bad) {
        log("checkpoint restore: no older checkpoint in '" + dir + "' is intact");
        throw corrupt(*first_bad);
      }
      if (!found) return std::nullopt;
      if (first_bad)
        log("checkpoint restore: restored step " + std::to_string(*step) +
            " instead of the corrupt step " + std::to_string(first_bad->step) + " ('" +
            first_bad->path + "')");
      return step;
    }
  }

  // The checkpoint restore_step() loads of the newest retained step below `step`.
  std::optional<checkpoint_info> newest_below(std::int64_t step) const {
    auto list = listed();
    for (auto c = list.rbegin(); c != list.rend(); ++c)
      if (c->step < step) return *c;
    return std::nullopt;
  }

  void read_step(std::int64_t step, const reader_type& reader) {
    restored_hang.reset();
    refuse_uncounted(step);
    bool found = read_locked([&] { return find_step(step); },
                             [&](const checkpoint_info& c) {
                               if (options.checksums) {
                                 checkpoint_integrity r = check(c);
                                 if (r.corrupt()) throw corrupt(r);
                               }
                               if (reader) reader(c.path, c.step);
                               restored_hang = hang_bounds_at(c.path);
                             });
    if (!found)
      throw error(ENOENT, "checkpoint restore", dir,
                  "no complete retained checkpoint of step " + std::to_string(step));
  }

  // restore_step() of a step only a checkpoint that does not count holds (listing.hpp) throws
  // checkpoint_corrupt naming it and why, rather than ENOENT.
  void refuse_uncounted(std::int64_t step) const {
    if (find_step(step)) return;
    auto c = base::find_retained(step);
    if (!c) return;  // none at all: ENOENT below
    checkpoint_integrity r = detail::checkpoint_verify_files<io_type>(
        c->path, step, detail::checkpoint_check_depth::sizes);
    if (!r.corrupt()) {  // no metadata file: not a checkpoint holdfast saved
      r.status = integrity_status::bad_metadata;
      r.file = std::string(metadata_file_name);
      r.detail = "missing: not a checkpoint holdfast saved";
    }
    throw corrupt(r);
  }

  checkpoint_integrity verify_step(std::int64_t step) const {
    checkpoint_integrity r;
    bool found = read_locked([&] { return base::find_retained(step); },
                             [&](const checkpoint_info& c) { r = check(c); });
    if (!found)
      throw error(ENOENT, "checkpoint verify", dir,
                  "no complete retained checkpoint of step " + std::to_string(step));
    return r;
  }

  // Checks `c` against its recorded sums; the caller holds LOCK_SH on it.
  checkpoint_integrity check(const checkpoint_info& c) const {
    return detail::checkpoint_verify_files<io_type>(c.path, c.step);
  }

  static checkpoint_corrupt corrupt(const checkpoint_integrity& r) {
    return checkpoint_corrupt(r.path, r.step, r.file,
                              std::string(to_string(r.status)) + ": " + r.detail);
  }

  std::optional<checkpoint_metadata> load_metadata(const std::string& name) const {
    return detail::checkpoint_load_metadata<io_type>(path_of(name));
  }

  // The hang bounds the checkpoint at `path` records; nothing when it records none or its
  // metadata cannot be read (a hint for the hang detector, never a reason to fail a restore).
  std::optional<hang_bounds> hang_bounds_at(const std::string& path) const noexcept {
    try {
      auto m = detail::checkpoint_load_metadata<io_type>(path);
      if (!m) return std::nullopt;
      return m->hang;
    } catch (...) {
      return std::nullopt;
    }
  }

  // Of each retained step, the checkpoint restore_step() loads (find_step's: listed last),
  // ascending by step, of those that count (listing.hpp: holdfast's metadata of the step and
  // every file it records there with its size; one read and one stat per recorded file, no byte
  // summed), with its identity from the same read.
  std::vector<counted> listed_counted() const {
    auto list = counted_list();
    std::vector<counted> out;
    for (auto c = list.rbegin(); c != list.rend(); ++c)
      if (std::none_of(out.begin(), out.end(),
                       [&](const counted& x) { return x.info.step == c->info.step; }))
        out.push_back(std::move(*c));
    std::sort(out.begin(), out.end(),
              [](const counted& a, const counted& b) { return a.info.step < b.info.step; });
    return out;
  }

  std::vector<checkpoint_info> listed() const {
    std::vector<checkpoint_info> out;
    for (auto& c : listed_counted()) out.push_back(std::move(c.info));
    return out;
  }

  std::vector<std::int64_t> all_steps() const {
    std::vector<std::int64_t> out;
    for (const auto& c : listed_counted()) out.push_back(c.info.step);
    return out;
  }

  std::vector<checkpoint_identity> all_identities() const {
    std::vector<checkpoint_identity> out;
    for (auto& c : listed_counted()) out.push_back(std::move(c.identity));
    return out;
  }

  // --- saving ------------------------------------------------------------------------------------

  struct job {
    std::int64_t step = -1;
    std::string name, target, work;  // work: the staging dir (rename) or the target (marker)
    std::function<void()> deferred;
    detail::checkpoint_pointer old;
    std::vector<std::string> named;  // what the pointer file keeps (when well-formed)
    bool repairs = false;            // the old pointer was bad: this save rewrites it
    std::chrono::system_clock::time_point time;
    std::optional<detail::json_value> metrics;
    std::optional<detail::json_value> metadata;  // written by commit(), with the files' sums
  };

  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer& writer, const checkpoint_metrics* metrics) {
    if (read_only)
      throw error(EROFS, "checkpoint save", dir,
                  "opened read_only: only the writer's manager saves");
    if (step < 0)
      throw error(EINVAL, "checkpoint save", dir, "negative step " + std::to_string(step));
    finish_and_rethrow();
    lock.check();
    job j;
    j.step = step;
    j.time = now();
    if (metrics) j.metrics = detail::json_value(*metrics);
    view v = read_view(true);
    j.repairs = v.recovered;  // garbled, dangling, or missing with checkpoints on disk
    if (v.parsed) j.named = v.file.keep;
    j.old = std::move(v.p);
    j.name = fresh_name(step, j.old);
    j.target = path_of(j.name);
    j.work =
        mode == directory_commit::rename ? path_of(scratch_name(".staging-", j.name)) : j.target;
    if (io_type::mkdir(j.work.c_str(), 0755) != 0) throw error(errno, "mkdir", j.work);
    try {
      j.deferred = detail::checkpoint_call_writer(writer, j.work, step);
      if (options.write_metadata)
        j.metadata = detail::checkpoint_metadata_json(step, j.time, metrics, history,
                                                      hang ? &*hang : nullptr);
    } catch (...) {
      discard(j.work);
      throw;
    }
    checkpoint_info info{step, j.name, j.target};
    const std::string work = j.work;
    prev_last_step = last_step;
    last_step = last_step ? std::max(*last_step, step) : step;
    last_save_time = j.time;
    if (!options.async_save) {
      try {
        commit(j);
      } catch (...) {
        last_step = prev_last_step;
        throw;
      }
      return info;
    }
    try {
      inflight = std::thread([this, jb = std::move(j)]() mutable {
        try {
          commit(jb);
        } catch (...) {
          std::lock_guard<std::mutex> l(mutex);
          failure = std::current_exception();
          failed_step = jb.step;
        }
      });
    } catch (...) {  // no thread: nothing was committed
      discard(work);
      last_step = prev_last_step;
      throw;
    }
    return info;
  }

  // Removes a directory a failed save made; the first error is the one reported.
  void discard(const std::string& work) const noexcept {
    try {
      detail::store_remove_tree<io_type>(work);
    } catch (...) {  // the next writer's sweep removes the rest
    }
  }

  // The committing half of a save: deferred write, syncs, rename or marker, pointer, retention.
  void commit(job& j) {
    try {
      if (j.deferred) j.deferred();
      if (j.metadata) write_metadata(j);
      if (mode == directory_commit::rename) {
        if (!publisher_type().publish_directory(j.work, j.target))
          throw error(EEXIST, "checkpoint save", j.target, "created concurrently");
      } else {
        publisher_type().commit_directory(j.target);
        // The new directory's entry is durable before the pointer names it.
        detail::store_sync_dir<durability_type, io_type>(dir);
      }
    } catch (...) {
      discard(j.work);
      throw;
    }
    lock.check();  // a writer that lost its lease leaves the new checkpoint unnamed

    detail::checkpoint_pointer next;
    next.latest = j.name;
    next.remove = j.old.remove;  // deletions not done yet: retried below
    for (const auto& k : j.old.keep) {
      if (step_of(k) == j.step)
        next.remove.push_back(k);  // superseded by this save
      else
        next.keep.push_back(k);
    }
    next.keep.push_back(j.name);
    known.insert(j.name);
    apply_retention(next, j);
    write_pointer(next);  // before the deletions: a valid latest whatever happens next
    if (j.repairs)
      log("checkpoint pointer '" + pointer_path() + "' rewritten by the save of '" + j.name + "'");
    if (!next.remove.empty()) {
      std::vector<std::string> left;
      for (const auto& r : next.remove)
        if (!remove_checkpoint(r))
          left.push_back(r);
        else
          known.erase(r);
      if (left != next.remove) {
        next.remove = std::move(left);
        write_pointer(next);  // after the deletions
      }
    }
  }

  // The metadata file, with each file's size and CRC32C (checksums on): after the writer and
  // its deferred part, before the syncs; in the committing thread. Each file's writeback
  // starts as it is summed when the save syncs files: the disk writes while the CPU sums.
  void write_metadata(job& j) const {
    constexpr bool syncs = durability_type::file != file_sync::none;
    if (options.checksums)
      j.metadata->set("files", detail::checkpoint_files_json(
                                   detail::checkpoint_sum_files<io_type>(j.work, syncs)));
    detail::checkpoint_write_metadata_text<io_type>(j.work, detail::to_json(*j.metadata, 2));
  }

  // The retention policy in force.
  retention_policy policy() const {
    if (options.retention) return *options.retention;
    if (options.max_to_keep == 0) return retention_policy::keep_all();
    return retention_policy::keep_last(options.max_to_keep);
  }

  // How retention treats the kept checkpoint `k`: a candidate when it counts (listing.hpp),
  // dropped from the pointer when it is gone, else left as it is. Judged once per manager: the
  // checkpoints it saved or found counting are remembered in `known`. One that does not count
  // is logged once per process.
  enum class retention_role { candidate, gone, left };
  retention_role role_in_retention(const std::string& k, const job& j) {
    if (k == j.name || known.count(k) != 0) return retention_role::candidate;
    const bool bare =
        !options.write_metadata || std::find(j.named.begin(), j.named.end(), k) != j.named.end();
    detail::checkpoint_judgement r = this->assess(k, bare, true);
    if (r.gone) return retention_role::gone;
    if (!r.counts) return retention_role::left;
    known.insert(k);
    return retention_role::candidate;
  }

  // Moves the kept checkpoints the policy drops to the removal list, except the latest and
  // those of the pinned step. Only the checkpoints that count are its candidates: one that does
  // not (no or damaged metadata, a recorded file missing) is neither counted nor deleted; one
  // that is gone (deleted by hand, or uncommitted) leaves the pointer.
  void apply_retention(detail::checkpoint_pointer& p, const job& j) {
    retention_policy rp = policy();
    std::vector<retention_candidate> cands;
    std::vector<std::size_t> at;  // index in p.keep of each candidate
    std::vector<bool> drop(p.keep.size(), false);
    for (std::size_t i = 0; i < p.keep.size(); ++i) {
      const std::string& k = p.keep[i];
      const retention_role role = role_in_retention(k, j);
      drop[i] = role == retention_role::gone;
      if (role != retention_role::candidate) continue;
      at.push_back(i);
      retention_candidate c;
      c.step = step_of(k);
      c.name = k;
      if (k == j.name) {
        c.time = j.time;
        c.metrics = j.metrics;
      } else if (rp.needs_metadata()) {
        auto m = load_metadata(k);
        if (m) {
          c.time = m->time;
          if (m->metrics.is_object()) c.metrics = m->metrics;
        } else {
          struct stat st {};
          if (detail::store_lstat<io_type>(path_of(k), st))
            c.time = std::chrono::system_clock::time_point(
                std::chrono::duration_cast<std::chrono::system_clock::duration>(
                    std::chrono::seconds(st.st_mtim.tv_sec) +
                    std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
        }
      }
      cands.push_back(std::move(c));
    }
    std::vector<bool> keep = rp.keeps(cands);
    const std::int64_t pin = pinned.load();
    for (std::size_t c = 0; c < cands.size(); ++c) {
      const std::size_t i = at[c];
      drop[i] = !((c < keep.size() && keep[c]) || p.keep[i] == j.name || cands[c].step == pin);
    }
    std::vector<std::string> kept;
    for (std::size_t i = 0; i < p.keep.size(); ++i) {
      if (drop[i]) {
        known.erase(p.keep[i]);
        p.remove.push_back(std::move(p.keep[i]));
      } else {
        kept.push_back(std::move(p.keep[i]));
      }
    }
    p.keep = std::move(kept);
  }

  // "<prefix><N>", or "<prefix><N>.<G>" with the first G neither listed nor on disk.
  std::string fresh_name(std::int64_t step, const detail::checkpoint_pointer& p) const {
    auto used = [&](const std::string& n) {
      if (std::find(p.keep.begin(), p.keep.end(), n) != p.keep.end() ||
          std::find(p.remove.begin(), p.remove.end(), n) != p.remove.end())
        return true;
      struct stat st {};
      return detail::store_lstat<io_type>(path_of(n), st);  // a leftover a reader holds
    };
    for (std::int64_t g = 0;; ++g) {
      std::string n =
          detail::checkpoint_name(options.step_prefix, options.step_format_fixed_length, step, g);
      if (!used(n)) return n;
    }
  }

  // --- async -------------------------------------------------------------------------------------

  void finish() noexcept {
    if (inflight.joinable()) inflight.join();
  }

  void finish_and_rethrow() {
    finish();
    std::exception_ptr f;
    {
      std::lock_guard<std::mutex> l(mutex);
      f = std::exchange(failure, nullptr);
    }
    if (f) {
      last_step = prev_last_step;
      std::rethrow_exception(f);
    }
  }

  bool should_save(std::int64_t step) const {
    if (read_only || step < 0) return false;
    if (last_step && step <= *last_step) return false;
    if (options.save_interval_steps > 0 && step % options.save_interval_steps == 0) return true;
    if (options.save_interval.count() > 0)
      return !last_save_time || now() - *last_save_time >= options.save_interval;
    return false;
  }

  checkpoint_report repair() {
    if (read_only)
      throw error(EROFS, "checkpoint repair", dir, "opened read_only: only the writer repairs");
    finish_and_rethrow();
    lock.check();
    return this->repair_unchecked();
  }

  // --- state -----------------------------------------------------------------------------------

  writer_fn default_writer;    // set_writer's
  reader_type default_reader;  // set_reader's
  std::atomic<std::int64_t> pinned{no_pin};
  std::string history;                       // what saves record ("": unknown); caller's thread
  std::optional<hang_bounds> hang;           // what saves record (set_hang_bounds); caller's thread
  std::optional<hang_bounds> restored_hang;  // what the last restore's checkpoint records

  // should_save's memory (caller's thread only)
  std::optional<std::int64_t> last_step, prev_last_step;
  std::optional<std::chrono::system_clock::time_point> last_save_time;

  // the save in flight
  std::thread inflight;
  std::exception_ptr failure;  // guarded by mutex
  std::int64_t failed_step = -1;

  // The kept checkpoints known to count (saved by this manager, or judged so): retention
  // judges each one once. Used by open_writer and commit only (one at a time).
  std::set<std::string> known;

  detail::checkpoint_writer_lock<io_type> lock;  // the writer's; never taken when read_only
};

HOLDFAST_NAMESPACE_END
