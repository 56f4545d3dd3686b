// holdfast/checkpoint/manager/saving.hpp — the save path of checkpoint_manager (manager.hpp):
// opening a writer, save(step, writer), its commit (in save() or on one background thread),
// the metadata each save records, should_save() and repair().
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
//      never one of the pinned step; retaining.hpp);
//   3. the deletions: each checkpoint is locked exclusively (flock LOCK_EX|LOCK_NB on its
//      directory), then renamed aside (or its marker removed) and removed; one a reader holds
//      is left, still listed as "delete", for the next save;
//   4. the pointer is published again without the deletions that were done.
//   With checkpoint_options::async_save, step 1's writer runs in the caller's thread and the
//   rest (a deferred write the writer returned, the syncs, the rename, steps 2-4) on one
//   background thread. A staged writer (staging.hpp: called with a checkpoint_stage) always
//   saves so, async_save or not: in the caller's thread it only copies the state into the
//   staging area; the background thread writes the staged files into the staging directory
//   (summing them as it writes), then steps 1's metadata and commit and 2-4 follow.
//
// Guarantees:
//   - open_writer() creates the checkpoint directory (syncing the parent of each directory it
//     created) before it takes the writer lock (writer_lock.hpp) and sweeps (maintenance.hpp);
//     save() and repair() check the lock first, and the commit again before the pointer names
//     the new checkpoint.
//   - latest() names a complete checkpoint whenever the writer was killed: before step 2 the
//     previous pointer still names the previous checkpoint, which retention never deletes.
//   - A writer that throws leaves no trace: the staging (or in-place) directory is removed and
//     the pointer is unchanged. So does a failed background save; its error is rethrown by
//     wait_until_finished() and by the next save(), restore() or restore_step(), and logged by
//     the destruction when nobody waited for it.
//   - Async saves: at most one in flight (the next save() waits for it, staged or not: the
//     staging area is the in-flight save's until it committed); restore(), restore_step(),
//     repair(), wait_until_finished() and destruction wait for it.
//   - on_commit's hook is called with each checkpoint once its pointer names it (before the
//     deletions), on the thread that committed it; what it throws is logged and ignored.
//   - Every save records the history begin_history() set last (the handler's restore agreement
//     sets the launch's, so checkpoints of one step from different launches never match), or
//     none (unknown) before it is called; and the hang bounds set_hang_bounds() set last, or none
//     before it is called. Both are taken in save()'s thread, before it returns (sync and async
//     saves alike).
//   - Integrity (integrity.hpp): with checksums on (the default), the metadata records every
//     file's size and CRC32C, summed after the writer and its deferred part ran and before the
//     syncs, in the thread that commits (one read of what was just written; a staged save's
//     sums are taken over the staged bytes as they are written, with no read); where the store
//     syncs files, each file's writeback is started as it is summed (Io::start_writeback, a
//     hint), so the disk writes while the CPU sums and the syncs after wait for less.
// Caveats:
//   - A writer that lost its lease (paused longer than lease_stale_after) throws
//     checkpoint_locked from its saves; the checkpoint it was committing stays unnamed.
//   - A step whose async save fails counts for should_save() until the failure is rethrown.
//   - An async save writes the metadata on the background thread: a writer that creates
//     holdfast-metadata.json itself fails there (EEXIST, rethrown later), not in save().
#pragma once

#include <sys/stat.h>  // struct stat: is a fresh name taken on disk

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../../detail/hang_bounds.hpp"  // hang_bounds: what each save records
#include "../../detail/json.hpp"         // the metadata document
#include "../../error.hpp"
#include "../../publish.hpp"   // file_sync; basic_publisher: publish_directory, commit_directory
#include "../../store.hpp"     // directory_commit, detail::store_make_dirs, store_sync_dir
#include "../integrity.hpp"    // checkpoint_sum_files: each file's size and CRC32C
#include "../maintenance.hpp"  // checkpoint_report: what repair() returns
#include "../metadata.hpp"     // checkpoint_metrics, the metadata file
#include "../names.hpp"        // checkpoint_info, detail::checkpoint_name
#include "../options.hpp"      // checkpoint_options
#include "../pointer.hpp"      // detail::checkpoint_pointer
#include "../staging.hpp"      // basic_staging_area, checkpoint_stage: staged saves
#include "../writer_lock.hpp"  // detail::checkpoint_writer_lock
#include "callables.hpp"       // detail::checkpoint_call_writer: the writer and its deferred part
#include "retaining.hpp"       // detail::checkpoint_retaining: what this builds on

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// All of a manager's state but its public face: the save path, on top of retention and the
// reading side. On the heap (manager.hpp's impl) so that a background save and the lease
// heartbeat keep working while the manager object itself is moved.
template <class Io, class Durability>
class checkpoint_saving : public checkpoint_retaining<Io, Durability> {
  using base = checkpoint_retaining<Io, Durability>;

 public:
  using base::apply_retention;
  using base::counted_list;
  using base::delete_dropped;
  using base::dir;
  using base::known;
  using base::log;
  using base::mode;
  using base::mutex;
  using base::options;
  using base::path_of;
  using base::pointer_path;
  using base::read_only;
  using base::read_view;
  using base::scratch_name;
  using base::step_of;
  using base::sweep;
  using base::write_pointer;
  using typename base::durability_type;
  using typename base::io_type;
  using typename base::publisher_type;
  using typename base::view;

  using writer_fn = std::function<std::function<void()>(const std::string&, std::int64_t)>;
  using stager_fn = std::function<void(checkpoint_stage&, std::int64_t)>;

  checkpoint_saving(std::string d, directory_commit m, checkpoint_options o, bool ro)
      : base(std::move(d), m, std::move(o), ro),
        lock(
            dir, options.lock, options.writer_lock_timeout, options.lease_stale_after,
            [this](std::string_view line) { log(std::string(line)); }, options.owner) {}
  checkpoint_saving(const checkpoint_saving&) = delete;
  checkpoint_saving& operator=(const checkpoint_saving&) = delete;

  ~checkpoint_saving() {
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
      detail::store_sync_dir<durability_type, io_type>(detail::parent_directory(created[0]));
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

  // --- saving ------------------------------------------------------------------------------------

  // One save: the new checkpoint as retention sees it (name, named, time, metrics) and the rest.
  struct job : checkpoint_added {
    std::int64_t step = -1;
    std::string target, work;  // work: the staging dir (rename) or the target (marker)
    std::function<void()> deferred;
    detail::checkpoint_pointer old;
    bool repairs = false;                        // the old pointer was bad: this save rewrites it
    std::optional<detail::json_value> metadata;  // written by commit(), with the files' sums
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    std::optional<std::uint64_t> bytes;      // the files' sizes summed (checksums on, or staged)
    std::optional<checkpoint_stage> staged;  // a staged save's files
    std::optional<detail::checkpoint_file_sums> sums;  // taken as the staged files were written
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
      if constexpr (detail::checkpoint_stages_v<Writer>) {
        staging.begin();
        j.staged.emplace(staging);
        detail::checkpoint_call_stager(writer, *j.staged, step);
      } else {
        j.deferred = detail::checkpoint_call_writer(writer, j.work, step);
      }
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
    if (!options.async_save && !j.staged) {
      try {
        commit(j);
      } catch (...) {
        last_step = prev_last_step;
        throw;
      }
      return info;
    }
    try {
      const bool staged = j.staged.has_value();
      inflight = std::thread([this, jb = std::move(j), staged]() mutable {
        try {
          commit(jb);
        } catch (...) {
          std::lock_guard<std::mutex> l(mutex);
          failure = std::current_exception();
          failed_step = jb.step;
        }
        if (staged) settle_staging();
      });
    } catch (...) {  // no thread: nothing was committed
      discard(work);
      last_step = prev_last_step;
      throw;
    }
    return info;
  }

  // After a staged save's background part: the area reshaped to that save's size, off the
  // caller's thread (staging.hpp). Memory not given is logged: the next save maps its own.
  void settle_staging() noexcept {
    try {
      staging.settle();
    } catch (const std::exception& e) {
      log(std::string("checkpoint: the staging area was not resized: ") + e.what());
    }
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
      if (j.staged) {
        constexpr bool syncs = durability_type::file != file_sync::none;
        j.sums =
            detail::checkpoint_write_stage<io_type>(*j.staged, j.work, options.checksums, syncs);
        j.bytes = j.staged->bytes();
        j.staged.reset();  // the staged bytes are in the files
      }
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
    log_committed(j);
    if (on_commit) {
      try {
        on_commit(checkpoint_info{j.step, j.name, j.target});
      } catch (const std::exception& e) {
        log("checkpoint: the on_commit hook of step " + std::to_string(j.step) +
            " threw: " + e.what());
      } catch (...) {
        log("checkpoint: the on_commit hook of step " + std::to_string(j.step) + " threw");
      }
    }
    delete_dropped(next);
  }

  // "checkpoint step 57 committed: '<dir>/step_57', 268435456 bytes in 1.20 s" (info; the bytes
  // where checksums summed them).
  void log_committed(const job& j) const {
    log("checkpoint step " + std::to_string(j.step) + " committed: '" + j.target + "'" +
            (j.bytes ? ", " + std::to_string(*j.bytes) + " bytes" : std::string()) + " in " +
            detail::seconds_text(std::chrono::steady_clock::now() - j.started),
        log_level::info);
  }

  // The metadata file, with each file's size and CRC32C (checksums on): after the writer and
  // its deferred part, before the syncs; in the committing thread. Each file's writeback
  // starts as it is summed when the save syncs files: the disk writes while the CPU sums.
  void write_metadata(job& j) const {
    constexpr bool syncs = durability_type::file != file_sync::none;
    if (options.checksums) {
      const auto sums =
          j.sums ? std::move(*j.sums) : detail::checkpoint_sum_files<io_type>(j.work, syncs);
      std::uint64_t bytes = 0;
      for (const auto& f : sums) bytes += f.second.size;
      j.bytes = bytes;
      j.metadata->set("files", detail::checkpoint_files_json(sums));
    }
    detail::checkpoint_write_metadata_text<io_type>(j.work, detail::to_json(*j.metadata, 2));
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

  // Sizes the staging area for a save as large as the checkpoint of `step` (its files' sizes,
  // a stat each), when the writer is a staged one: the first staged save after a restore then
  // copies into memory already faulted in. A failure is logged: the save maps what it needs.
  void prepare_staging(std::int64_t step) noexcept {
    if (!default_stager) return;
    try {
      if (auto c = this->find_step(step)) prepare_staging_at(c->path);
    } catch (const std::exception& e) {
      log(std::string("checkpoint: the staging area was not sized at restore: ") + e.what());
    }
  }

  // As prepare_staging, from the checkpoint directory `path` (of this tier or another).
  void prepare_staging_at(const std::string& path) noexcept {
    if (!default_stager) return;
    try {
      std::uint64_t bytes = 0;
      for (const auto& name : detail::store_list_dir<io_type>(path)) {
        struct stat st {};
        if (name != detail::checkpoint_metadata_file_name &&
            detail::store_lstat<io_type>(detail::store_join(path, name), st) && S_ISREG(st.st_mode))
          bytes += static_cast<std::uint64_t>(st.st_size);
      }
      staging.reserve(static_cast<std::size_t>(bytes));
    } catch (const std::exception& e) {
      log(std::string("checkpoint: the staging area was not sized at restore: ") + e.what());
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

  writer_fn default_writer;  // set_writer's (a writer of files)
  stager_fn default_stager;  // set_writer's (a staged writer); one of the two is set
  std::function<void(const checkpoint_info&)> on_commit;  // called as each save committed
  basic_staging_area<io_type> staging;                    // staged saves copy into it
  std::string history;              // what saves record ("": unknown); caller's thread
  std::optional<hang_bounds> hang;  // what saves record (set_hang_bounds); caller's thread

  // should_save's memory (caller's thread only)
  std::optional<std::int64_t> last_step, prev_last_step;
  std::optional<std::chrono::system_clock::time_point> last_save_time;

  // the save in flight
  std::thread inflight;
  std::exception_ptr failure;  // guarded by mutex
  std::int64_t failed_step = -1;

  detail::checkpoint_writer_lock<io_type> lock;  // the writer's; never taken when read_only
};

}  // namespace detail

HOLDFAST_NAMESPACE_END
