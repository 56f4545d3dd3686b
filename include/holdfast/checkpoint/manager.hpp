// holdfast/checkpoint/manager.hpp — checkpoint_manager: saves a run's checkpoints as whole
// directories, names the latest in the pointer, applies retention, restores; one writer and any
// number of read_only readers side by side. The Checkpointer preemption_handler uses by default.
//
// This header holds the manager's public face (read_only, checkpoint_manager<Store>). Its state
// is built in layers, each a part in checkpoint/manager/ that opens with its own guarantees:
//   manager/saving.hpp     the save protocol: opening a writer, save(), its commit (in save() or
//                          on one background thread; a staged save's files written there from
//                          the staging area, staging.hpp), what each save records,
//                          should_save(), repair()
//   manager/retaining.hpp  retention in each save: the policy's drops, the pin, the deletions
//   manager/reading.hpp    the listings, restore()/restore_step() under LOCK_SH with their
//                          integrity checks, verify_step(), the hang bounds checkpoints record
//   manager/callables.hpp  writers and readers called as f(dir, step) or f(dir); deferred writes
// on checkpoint_maintenance (maintenance.hpp: the sweep, deletions, verify, repair) and
// checkpoint_directory (pointer.hpp: the effective pointer, what counts as a checkpoint).
//
// Guarantees:
//   - A writing manager holds the writer lock (writer_lock.hpp) for its whole life and sweeps
//     what crashed saves left when it opens (maintenance.hpp). A read_only manager never
//     creates, sweeps, deletes or publishes anything, and save() refuses (EROFS).
//   - latest() names a complete checkpoint whenever the writer was killed (manager/saving.hpp).
//     A bad pointer is recovered from, never thrown for (pointer.hpp).
//   - Retention never deletes the latest nor a checkpoint of the pinned step
//     (manager/retaining.hpp); with checksums on (the default) a restore never loads a
//     checkpoint whose files do not match what its save recorded (manager/reading.hpp).
// Caveats:
//   - flock belongs to the open file description: a child forked while a manager lives shares
//     its writer lock (exec drops it, descriptors are O_CLOEXEC). Do not fork while an async
//     save is in flight.
//   - A second writing manager in the same process is a second writer: it waits, then throws
//     checkpoint_locked. Share one manager, or open the others read_only.
//   - A manager is not thread-safe: one thread at a time calls it (its background save and the
//     lease heartbeat are its own). The log hook may be called from the background thread. A
//     moved-from manager may only be destroyed or assigned to.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>  // std::invalid_argument: a bad history id
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/hang_bounds.hpp"  // hang_bounds: what saves record and restores give back
#include "../error.hpp"
#include "../log.hpp"             // log_fn
#include "../publish.hpp"         // basic_publisher: the publisher_type
#include "../store.hpp"           // store, directory_commit
#include "integrity.hpp"          // checkpoint_integrity: what verify_step() reports
#include "maintenance.hpp"        // checkpoint_report: what verify() and repair() report
#include "manager/callables.hpp"  // detail::checkpoint_call(_writer): readers and writers
#include "manager/saving.hpp"     // detail::checkpoint_saving: the state, in its layers
#include "metadata.hpp"           // checkpoint_metrics, checkpoint_metadata, checkpoint_identity
#include "names.hpp"              // checkpoint_info
#include "options.hpp"            // checkpoint_options
#include "retention.hpp"          // metric_order
#include "staging.hpp"            // checkpoint_stage: staged writers

HOLDFAST_NAMESPACE_BEGIN

/// Tag: open a checkpoint directory for reading only (no sweep, no mkdir, no pointer write).
struct read_only_t {
  explicit read_only_t() = default;
};
/// The read_only_t value.
inline constexpr read_only_t read_only{};

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

  /// Sets the writer save(step) uses: a writer of files, called as writer(dir[, step]), or a
  /// staged writer, called as writer(stage[, step]) with a checkpoint_stage (staging.hpp).
  template <class Writer>
  void set_writer(Writer writer) {
    if constexpr (detail::checkpoint_stages_v<Writer>) {
      s_->default_writer = nullptr;
      s_->default_stager = [w = std::move(writer)](checkpoint_stage& stage,
                                                   std::int64_t st) mutable {
        detail::checkpoint_call_stager(w, stage, st);
      };
    } else {
      s_->default_stager = nullptr;
      s_->default_writer = [w = std::move(writer)](const std::string& d, std::int64_t st) mutable {
        return detail::checkpoint_call_writer(w, d, st);
      };
    }
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
  checkpoint_info save(std::int64_t step) { return save_default(step, nullptr); }

  /// As save(step), recording `metrics` in the checkpoint's metadata.
  checkpoint_info save(std::int64_t step, const checkpoint_metrics& metrics) {
    return save_default(step, &metrics);
  }

  /// Saves a checkpoint of `step`: `writer(dir[, step])` fills a fresh directory, which is
  /// committed whole, then the pointer names it and retention runs. Returns the checkpoint
  /// (with async_save, the one being committed). A staged writer, `writer(stage[, step])`,
  /// copies the state into the staging area instead: save() returns once it did, and the files
  /// are written and committed on the background thread (always; wait_until_finished() waits
  /// for the commit). Throws holdfast::error (EROFS) when read_only.
  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer&& writer) {
    return s_->save(step, writer, nullptr);
  }

  /// As save(step, writer), recording `metrics` in the checkpoint's metadata.
  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer&& writer, const checkpoint_metrics& metrics) {
    return s_->save(step, writer, &metrics);
  }

  /// Waits for the save in flight (async_save, or a staged save), and rethrows its failure, once.
  void wait_until_finished() { s_->finish_and_rethrow(); }

  /// True while a save's background part (async_save, or a staged save) has not been waited for.
  bool save_in_flight() const noexcept { return s_->inflight.joinable(); }

  /// Calls `hook(checkpoint)` after each save committed (its pointer names it), on the thread
  /// that committed it (save()'s, or the background save's); empty: none. It must be quick and
  /// never call this manager; what it throws is logged and ignored. Set it while no save is in
  /// flight.
  void on_commit(std::function<void(const checkpoint_info&)> hook) {
    s_->finish();
    s_->on_commit = std::move(hook);
  }

  /// Maps and faults in a staging area for staged saves of `bytes` ahead of the first one
  /// (restore() does it from the restored checkpoint's size when the writer is a staged one).
  /// Waits for a save in flight first. Throws holdfast::error (ENOMEM) when the memory is not
  /// given.
  void reserve_staging(std::size_t bytes) {
    s_->finish();
    s_->staging.reserve(bytes);
  }

  /// With a staged writer set: sizes the staging area for a save as large as the checkpoint
  /// directory `dir` (its files' sizes), as restore() does (two_tier_checkpoints gives the
  /// durable copy it restored). Without one, does nothing. A failure is logged, never thrown.
  void prepare_staging(const std::string& dir) noexcept { s_->prepare_staging_at(dir); }

  /// Bytes the staging area holds mapped (0 before a staged save or reserve_staging()).
  std::size_t staging_capacity() const noexcept { return s_->staging.capacity(); }

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
    auto step = s_->read_latest(s_->default_reader);
    if (step) s_->prepare_staging(*step);
    return step;
  }

  /// Loads the latest checkpoint with `reader(dir[, step])` and returns its step, or nothing.
  template <class Reader>
  std::optional<std::int64_t> restore(Reader&& reader) {
    s_->finish_and_rethrow();
    reader_type r = [&reader](const std::string& d, std::int64_t st) {
      detail::checkpoint_call(reader, d, st);
    };
    auto step = s_->read_latest(r);
    if (step) s_->prepare_staging(*step);
    return step;
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
    return s_->newest_hang_bounds();
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
    s_->prepare_staging(step);
  }

  /// Loads the checkpoint of exactly `step` with `reader(dir[, step])`; ENOENT as above.
  template <class Reader>
  void restore_step(std::int64_t step, Reader&& reader) {
    s_->finish_and_rethrow();
    reader_type r = [&reader](const std::string& d, std::int64_t st) {
      detail::checkpoint_call(reader, d, st);
    };
    s_->read_step(step, r);
    s_->prepare_staging(step);
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
  checkpoint_info save_default(std::int64_t step, const checkpoint_metrics* metrics) {
    if (s_->default_stager) return s_->save(step, s_->default_stager, metrics);
    if (!s_->default_writer)
      throw error(EINVAL, "checkpoint save", s_->dir,
                  "no writer: call set_writer() first, or save(step, writer)");
    return s_->save(step, s_->default_writer, metrics);
  }

  class impl;
  std::unique_ptr<impl> s_;
};

// All of a manager's state, on the heap so that a background save and the lease heartbeat
// keep working while the manager object itself is moved (preemption_handler takes it by value):
// the save path (manager/saving.hpp, the writer lock a member) on retention
// (manager/retaining.hpp) on the reading side (manager/reading.hpp) on checkpoint_maintenance
// (maintenance.hpp) on checkpoint_directory (pointer.hpp).
template <class Store>
class checkpoint_manager<Store>::impl
    : public detail::checkpoint_saving<typename Store::io_type, typename Store::durability_type> {
 public:
  using detail::checkpoint_saving<typename Store::io_type,
                                  typename Store::durability_type>::checkpoint_saving;
};

HOLDFAST_NAMESPACE_END
