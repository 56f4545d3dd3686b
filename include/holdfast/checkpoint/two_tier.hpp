// holdfast/checkpoint/two_tier.hpp — two_tier_checkpoints: a Checkpointer that saves to a fast
// node-local tier first (a RAM disk or a local disk) and copies each checkpoint to a durable
// tier (the run's shared or mirrored directory) on one background thread. It composes two
// checkpoint_managers, each with its own options (retention per tier), and restores from
// whichever tier holds a readable copy. docs/two-tiers.md tells the design.
//
// Protocol:
//   1. save(step): the local manager's save (the user's writer, crash-safe as manager.hpp
//      says; synchronous, but for a staged writer's, which commits on the local manager's
//      background thread: staging.hpp). Once the local tier committed it (the local manager's
//      on_commit hook, on the thread that committed), the step becomes the copier's one
//      pending request: a newer
//      request replaces one not yet started (it is never copied), so the newest step's copy is
//      the next to start. A preemption save (one after set_durable_deadline(t)) also abandons
//      the copy in flight of another step when its own copy, at the copies' mean time, ends by
//      t: the copier stops streaming it, the durable save removes its staging directory, and
//      the preemption step's copy starts.
//   2. The copier takes the request, holds LOCK_SH on the local checkpoint (reader_lock.hpp:
//      local retention cannot delete it while it is copied) and saves it in the durable tier
//      with the durable manager's own crash-safe save: a writer that streams the local files
//      (all but holdfast-metadata.json, which the durable save writes with the local copy's
//      step, history, save time and metrics).
// Guarantees:
//   - save() returns once the local tier committed (a staged save: once the state is staged;
//     wait_until_finished() then waits for the local commit first, and throws its failure, as
//     does the next save()): a durable copy that hangs (a dead mount)
//     or fails never blocks or fails a save; a new request while a copy hangs replaces the
//     pending one. Copies run in the order of the saves; at most one runs; a request replaced
//     or a copy abandoned is logged, never reported as failed.
//   - An abandoned copy leaves the durable tier as it was (the durable save's own cleanup of a
//     writer that throws); it is abandoned only between files and 1 MiB chunks of the stream,
//     so a copy stuck in the durable save's syncs (a dead mount) is not, and without a measured
//     copy (the object's first) none is.
//   - on_copy(hook) / feed_copy_costs(policy): after each durable copy committed, the hook is
//     called on the copier's thread with the step and the time the copy took (from taking the
//     request to the durable save's return: the local read, the writes, the syncs), under the
//     copier's lock; never after this object's destruction began. feed_copy_costs gives it to a
//     save_interval_policy's record_copy, so the learned interval is never shorter than a copy.
//   - durable_step() is the step of the last durable copy this object committed (or, before
//     one, the durable tier's latest at start); after a restore_step()/restore() of step s it
//     is the newest durable step not above s (nothing when there is none): the steps above s
//     are of the line the restore left, and neither durable_step(), the local retention's
//     extra rule nor unfinished() names them (a failed copy above s is forgotten).
//   - The local tier never deletes a step whose copy is pending or in flight, nor
//     durable_step() (its retention keeps them on top of the user's local policy), and the
//     durable manager never deletes its latest: the newest step complete in both tiers is
//     deleted by neither.
//   - The durable copy of a step has the local checkpoint's identity (step and history), save
//     time, metrics and hang bounds (set_hang_bounds() reaches the local tier's saves; the copier
//     gives the durable save the bounds the local copy's metadata records).
//   - restored_hang_bounds() is the bounds the copy the last restore()/restore_step() loaded
//     records, from whichever tier it came (a new node: the durable copy's); none when that
//     restore loaded nothing or the copy records none.
//   - wait_for_durable(deadline) waits for the copier at most until `deadline` and returns the
//     steps it did not copy (pending, in flight, or failed and not yet superseded). The
//     handler's wait_until_finished() waits until durable_wait after the last save() returned,
//     logs what did not finish and keeps it for unfinished(); it never throws for the copy.
//     After set_durable_deadline(t) (the handler's, before a preemption save: the grace
//     period's end) it waits until no later than t.
//   - all_steps() / all_identities(): the union over both tiers of the complete checkpoints
//     whose metadata reads (a damaged one is logged and left out of its tier's view) and that
//     their tier's all_steps() lists (every recorded file there with its size; a local copy
//     without sums of its own, against the sizes its durable copy of the same identity
//     recorded, when there is one): a step is
//     listed while at least one tier holds it whole; of a step both tiers hold, the local
//     copy's identity. restore_step() then reads the tier that lists it (the durable copy when
//     only it does).
//   - restore_step(step): the local copy; when it is missing or its load throws holdfast::error
//     (a reader reports a corrupt copy that way, e.g. format_error), the durable copy of the
//     same identity, with a log line. restore(): the newest step that loads from either tier;
//     a new node (empty local tier) restores from the durable tier.
//   - Integrity: with local_sums off (the default) the local save sums nothing (the local
//     manager's checksums are off: the save is the writer, the fsyncs and the rename). A restore
//     of a local copy whose durable copy of the same identity (step and history) is listed
//     checks every file the durable save recorded (size and CRC32C, integrity.hpp) in the local
//     copy, under the local copy's LOCK_SH, before the reader runs: the copier read those very
//     bytes to copy them. A mismatch throws checkpoint_corrupt inside restore_step, so the
//     durable copy is read instead, with a log line. With local_sums on, the local tier records
//     and checks its own sums (checkpoint_manager's checksums), as a single tier does.
//   - copier_nice N > 0: the copier thread sets its own nice value to N when it starts (Linux
//     nice values are per thread): the caller's threads keep theirs, so a copy yields the CPU
//     to the training step (holdfast_two_tier_bench's step rows); a failure is logged, never
//     thrown. A priority is only ever lowered.
//   - Destruction waits for the copier at most durable_wait; a copy still hanging then is left
//     to its thread (detached, logged), which owns what it uses.
// Caveats:
//   - Both managers' saves are synchronous here (async_save is turned off): the copier is the
//     background part; a staged writer's local saves alone commit on the local manager's
//     background thread.
//   - The handler tells set_durable_deadline() the end of a noticed worker's grace period and
//     then does not wait for the copier before its preemption save; without a notice of its own
//     (a peer's claim) only durable_wait bounds the wait after the save.
//   - The local tier goes with its node: a lost node's steps not yet copied are lost; replicating
//     the local tier to a peer is not done here.
//   - Opening, and reading the durable tier (all_steps, restore), on a dead mount block as the
//     mount does; saving does not.
//   - The copier uses the durable manager alone; pin() reaches both managers (an atomic).
//   - The local manager's on_commit hook is this object's (it requests each copy): replacing it
//     through local() stops the durable copies.
//   - Abandoning trades the copy in flight for the preemption step's: when the mean
//     underestimates the preemption step's copy and it misses the deadline, the durable tier
//     keeps neither (it keeps the step before).
//   - A checkpoint holding anything but regular files and directories fails its copy (EINVAL).
//   - With local_sums off, a local copy with no durable copy of its identity yet (the copier is
//     behind, the copy failed or was superseded), or whose durable copy records no sums
//     (durable.checksums off), restores unverified, with a log line. Damage done before the
//     copier read the bytes is in both copies and their sums agree: only the reader can tell.
#pragma once

#include <fcntl.h>     // O_CREAT, O_EXCL, O_NOFOLLOW: the copy's files
#include <sys/stat.h>  // S_ISDIR, S_ISREG: what a checkpoint holds

#include <algorithm>
#include <atomic>  // the copier's abandon flag
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>  // std::function: on_copy's hook
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../detail/hang_bounds.hpp"  // hang_bounds: forwarded to both tiers' metadata
#include "../error.hpp"
#include "../io.hpp"  // basic_fd, open_file_if_exists, read_full, write_all
#include "../log.hpp"
#include "../store.hpp"         // store, detail::store_list_dir, store_lstat, store_join
#include "integrity.hpp"        // checkpoint_verify_files: the local copy against the durable sums
#include "manager.hpp"          // checkpoint_manager, read_only
#include "metadata.hpp"         // checkpoint_load_metadata, checkpoint_load_identity
#include "two_tier/copier.hpp"  // detail::two_tier_copy_tree, two_tier_lower_priority

HOLDFAST_NAMESPACE_BEGIN

/// Options of two_tier_checkpoints: each tier's manager options, and the durable wait.
struct two_tier_options {
  /// The local tier's options (its retention: e.g. max_to_keep 2). async_save is ignored.
  checkpoint_options local{};
  /// The durable tier's options (e.g. keep_last(N) | every_n_hours(h)). async_save is ignored.
  checkpoint_options durable{};
  /// How long wait_until_finished() waits for the copier after the last save (and destruction
  /// for a copy in flight): what the grace period leaves after the local save.
  std::chrono::milliseconds durable_wait{20000};
  /// Where copies, fallbacks and unfinished copies are reported (empty: log_to_stderr).
  log_fn log{};
  /// The copier thread's nice value (Linux: per thread), e.g. 19 so a copy yields the CPU to
  /// the training thread; 0 (the default) leaves it at the process's. Can only lower priority.
  int copier_nice = 0;
  /// True: the local tier sums its own files (local.checksums on; each local save reads its
  /// bytes back). False (the default): the local save sums nothing (local.checksums is ignored)
  /// and a restore checks the local copy against its durable copy's sums.
  bool local_sums = false;
};

/// A Checkpointer with a fast local tier and a durable tier copied to in the background.
/// LocalStore / DurableStore: basic_stores whose Filesystem policies give each tier its Io.
template <class LocalStore = store, class DurableStore = store>
class two_tier_checkpoints {
 public:
  using local_manager_type = checkpoint_manager<LocalStore>;      ///< the local tier
  using durable_manager_type = checkpoint_manager<DurableStore>;  ///< the durable tier
  using reader_type = typename local_manager_type::reader_type;   ///< loads a checkpoint

  /// Checkpoints of `run_id` in both stores' checkpoint paths.
  two_tier_checkpoints(const LocalStore& local, const DurableStore& durable,
                       std::string_view run_id, two_tier_options options = {})
      : two_tier_checkpoints(local.checkpoint_path(run_id), local.commit_mode(),
                             durable.checkpoint_path(run_id), durable.commit_mode(),
                             std::move(options)) {}

  /// Checkpoints in the directories `local_dir` and `durable_dir`, committed by the modes.
  two_tier_checkpoints(std::string local_dir, directory_commit local_mode, std::string durable_dir,
                       directory_commit durable_mode, two_tier_options options = {})
      : s_(std::make_unique<impl>(std::move(local_dir), local_mode, std::move(durable_dir),
                                  durable_mode, std::move(options))) {}

  two_tier_checkpoints(two_tier_checkpoints&&) noexcept = default;
  two_tier_checkpoints& operator=(two_tier_checkpoints&&) noexcept = default;
  two_tier_checkpoints(const two_tier_checkpoints&) = delete;
  two_tier_checkpoints& operator=(const two_tier_checkpoints&) = delete;
  /// Waits for the copier at most durable_wait, then leaves a hanging copy to its thread.
  ~two_tier_checkpoints() = default;

  /// Sets the writer save(step) uses (the local tier's).
  template <class Writer>
  void set_writer(Writer writer) {
    s_->local.set_writer(std::move(writer));
  }
  /// Sets the reader restore() and restore_step() use, whichever tier they read.
  template <class Reader>
  void set_reader(Reader reader) {
    s_->reader = [r = std::move(reader)](const std::string& d, std::int64_t st) mutable {
      detail::checkpoint_call(r, d, st);
    };
  }

  /// Saves `step` in the local tier, then asks the copier for its durable copy. Returns the
  /// local checkpoint.
  checkpoint_info save(std::int64_t step) {
    return s_->save([&] { return s_->local.save(step); });
  }
  /// As save(step), with `writer(dir[, step])` or a staged `writer(stage[, step])`.
  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer&& writer) {
    return s_->save([&] { return s_->local.save(step, std::forward<Writer>(writer)); });
  }
  /// True when a save of `step` is due (the local tier's cadence).
  bool should_save(std::int64_t step) const { return s_->local.should_save(step); }

  /// Waits for the copier until `deadline`; returns the steps not copied (ascending).
  std::vector<std::int64_t> wait_for_durable(std::chrono::steady_clock::time_point deadline) {
    return s_->sh->wait_until(deadline);
  }
  /// Waits for the copier until durable_wait after the last save() returned; logs and keeps
  /// (unfinished()) what it did not copy. Never throws for a durable copy.
  void wait_until_finished() {
    s_->local.wait_until_finished();  // a staged save's local commit; its failure is thrown
    s_->wait_bounded();
  }
  /// Bounds the next wait_until_finished() calls by `deadline` too (the grace period's end).
  void set_durable_deadline(std::chrono::steady_clock::time_point deadline) {
    s_->durable_deadline = deadline;
  }
  /// What the last wait_until_finished() did not copy.
  const std::vector<std::int64_t>& unfinished() const noexcept { return s_->unfinished; }
  /// The step of the last durable copy this object committed (or the durable tier's latest at
  /// start); after a restore of step s, the newest durable step not above s.
  std::optional<std::int64_t> durable_step() const { return s_->sh->durable_newest(); }

  /// Calls `hook(step, took)` on the copier's thread after each durable copy committed, `took`
  /// being how long the copy took; under the copier's lock (quick, and never into this object;
  /// what it throws is logged and ignored). Empty: none. Never called once this object's
  /// destruction began. A preemption_handler with periodic saves sets it on task 0 (to the
  /// policy's record_copy), replacing a hook set before.
  void on_copy(std::function<void(std::int64_t, std::chrono::duration<double>)> hook) {
    std::lock_guard<std::mutex> l(s_->sh->m);
    s_->sh->on_copy = std::move(hook);
  }
  /// Feeds each durable copy's time to `policy.record_copy` (a save_interval_policy, which takes
  /// it from the copier's thread): its interval is then never shorter than a copy. `policy`
  /// must outlive this object, or on_copy({}) must come first.
  template <class Policy>
  void feed_copy_costs(Policy& policy) {
    on_copy(
        [&policy](std::int64_t, std::chrono::duration<double> took) { policy.record_copy(took); });
  }

  /// Steps complete and readable in either tier, ascending, each once.
  std::vector<std::int64_t> all_steps() const {
    std::vector<std::int64_t> out;
    for (const auto& id : all_identities()) out.push_back(id.step);
    return out;
  }
  /// The identity of each step all_steps() lists (the local copy's where both hold it).
  std::vector<checkpoint_identity> all_identities() const {
    std::vector<checkpoint_identity> out;
    for (auto& [step, id] : s_->merged()) out.push_back(std::move(id));
    return out;
  }
  /// The newest step of all_steps(), or nothing.
  std::optional<std::int64_t> latest_step() const noexcept {
    try {
      auto steps = all_steps();
      if (steps.empty()) return std::nullopt;
      return steps.back();
    } catch (...) {
      return std::nullopt;
    }
  }
  /// Starts a history: the local tier's next saves record it, and their durable copies too.
  void begin_history(std::string history) { s_->local.begin_history(std::move(history)); }
  /// Sets the hang bounds the local tier's next saves record; their durable copies record the
  /// same (the copier takes them from the local copy's metadata).
  void set_hang_bounds(const hang_bounds& bounds) { s_->local.set_hang_bounds(bounds); }
  /// The hang bounds recorded in the copy the last restore()/restore_step() loaded, whichever
  /// tier it came from; nothing when none loaded or it records none.
  std::optional<hang_bounds> restored_hang_bounds() const noexcept { return s_->restored_hang; }
  /// The hang bounds the newest checkpoint of the local tier records, else the durable tier's.
  std::optional<hang_bounds> newest_hang_bounds() const noexcept {
    if (auto b = s_->local.newest_hang_bounds()) return b;
    return s_->sh->durable.newest_hang_bounds();
  }
  /// Pins `step` in both tiers (nullopt unpins).
  void pin(std::optional<std::int64_t> step) noexcept {
    s_->local.pin(step);
    s_->sh->durable.pin(step);
  }

  /// Loads `step` from the local tier, else (missing, or holdfast::error) from the durable
  /// copy of the same identity. Throws holdfast::error (ENOENT) when neither tier has it.
  void restore_step(std::int64_t step) { s_->restore_step(step); }
  /// Loads the newest step that loads from either tier; nothing when none does.
  std::optional<std::int64_t> restore() {
    auto steps = all_steps();
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      try {
        s_->restore_step(*it);
        return *it;
      } catch (const error& e) {
        s_->log("two-tier: step " + std::to_string(*it) +
                " did not load from either tier, trying the next older: " + e.what());
      }
    }
    return std::nullopt;
  }

  /// The local tier's manager.
  local_manager_type& local() noexcept { return s_->local; }
  /// The durable tier's directory.
  const std::string& durable_directory() const noexcept { return s_->sh->durable.directory(); }

 private:
  // What the caller's thread and the copier share; the copier thread co-owns it.
  struct shared {
    shared(std::string dir, directory_commit mode, checkpoint_options o, std::string local_dir,
           directory_commit local_mode, checkpoint_options lo, log_fn lg)
        : log(std::move(lg)),
          durable(std::move(dir), mode, with_copy_clock(std::move(o))),
          local_reader(read_only, std::move(local_dir), local_mode, std::move(lo)) {
      try {
        if (auto c = durable.latest()) newest = c->step;  // saved last (latest_step: largest)
      } catch (const error&) {  // unreadable: nothing known durable until a copy commits
      }
    }

    // The durable save's clock reads the local checkpoint's save time while it copies.
    checkpoint_options with_copy_clock(checkpoint_options o) {
      o.async_save = false;
      o.clock = [this, user = std::move(o.clock)] {
        std::lock_guard<std::mutex> l(m);
        if (copy_time) return *copy_time;
        return user ? user() : std::chrono::system_clock::now();
      };
      return o;
    }

    std::optional<std::int64_t> durable_newest() {
      std::lock_guard<std::mutex> l(m);
      return newest;
    }

    // Local retention's extra rule: the pending, in-flight and newest durable steps.
    bool protects(std::int64_t step) {
      std::lock_guard<std::mutex> l(m);
      return step == pending || step == in_flight || step == newest;
    }

    std::vector<std::int64_t> unfinished_locked() const {
      std::vector<std::int64_t> out;
      for (auto s : {failed, in_flight, pending})
        if (s && (!newest || *s != *newest) && std::find(out.begin(), out.end(), *s) == out.end())
          out.push_back(*s);
      std::sort(out.begin(), out.end());
      return out;
    }

    std::vector<std::int64_t> wait_until(std::chrono::steady_clock::time_point deadline) {
      std::unique_lock<std::mutex> l(m);
      cv.wait_until(l, deadline, [&] { return !pending && !in_flight; });
      return unfinished_locked();
    }

    // A request for `step`'s copy: it replaces one not yet started (returned, for a log); with
    // `deadline` (a preemption save's), the copy in flight of another step is abandoned when
    // this one's, at the copies' mean time, ends by then.
    std::optional<std::int64_t> request(
        std::int64_t step, std::optional<std::chrono::steady_clock::time_point> deadline) {
      std::lock_guard<std::mutex> l(m);
      std::optional<std::int64_t> replaced = std::exchange(pending, step);
      if (replaced == step) replaced.reset();
      if (deadline && in_flight && *in_flight != step && copy_mean &&
          std::chrono::steady_clock::now() + *copy_mean <= *deadline)
        abandon.store(true);
      return replaced;
    }

    // After a restore of `step`: the durable steps above it are of the line the restore left.
    void restored(std::int64_t step, std::optional<std::int64_t> durable_at_or_below) {
      std::lock_guard<std::mutex> l(m);
      newest = durable_at_or_below;
      if (failed && *failed > step) failed.reset();
    }

    void run(int nice) {
      if (nice != 0) detail::two_tier_lower_priority(nice, log);
      std::vector<char> buffer(std::size_t{1} << 20);
      for (;;) {
        std::int64_t step;
        {
          std::unique_lock<std::mutex> l(m);
          cv.wait(l, [&] { return stop || pending; });
          if (stop) return;
          step = *std::exchange(pending, std::nullopt);
          in_flight = step;
          abandon.store(false);  // a flag set for the copy before this one came too late
        }
        const auto start = std::chrono::steady_clock::now();
        std::string failure;
        bool abandoned = false, hook_failed = false;
        try {
          copy(step, buffer);
        } catch (const detail::two_tier_abandoned&) {
          abandoned = true;
        } catch (const std::exception& e) {
          failure = e.what();
        } catch (...) {
          failure = "a non-standard exception";
        }
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        {
          std::lock_guard<std::mutex> l(m);
          in_flight.reset();
          copy_time.reset();
          if (abandoned) {
            // superseded: neither durable nor failed
          } else if (failure.empty()) {
            newest = step;  // copies run in the order of the saves: the durable tier's latest
            failed.reset();
            const auto t = std::chrono::duration_cast<std::chrono::steady_clock::duration>(took);
            copy_mean = copy_mean ? *copy_mean + (t - *copy_mean) * 3 / 10 : t;
            if (on_copy) {
              try {
                on_copy(step, took);
              } catch (...) {  // the hook's failure is not the copy's
                hook_failed = true;
              }
            }
          } else {
            failed = step;
          }
        }
        cv.notify_all();
        if (hook_failed)
          detail::log_line(log, "two-tier: the on_copy hook threw after the copy of step " +
                                    std::to_string(step) + " (ignored)");
        if (abandoned)
          detail::log_line(log, "two-tier: the durable copy of step " + std::to_string(step) +
                                    " was abandoned: a preemption save's copy goes first (the "
                                    "local tier keeps it)");
        if (!failure.empty())
          detail::log_line(log, "two-tier: the durable copy of step " + std::to_string(step) +
                                    " to '" + durable.directory() +
                                    "' failed (the local tier keeps it): " + failure);
      }
    }

    // Saves the local checkpoint of `step` in the durable tier, holding LOCK_SH on it.
    void copy(std::int64_t step, std::vector<char>& buffer) {
      using in_io = typename LocalStore::io_type;
      using out_io = typename DurableStore::io_type;
      local_reader.restore_step(step, [&](const std::string& dir, std::int64_t st) {
        auto meta = detail::checkpoint_load_metadata<in_io>(dir);
        {
          std::lock_guard<std::mutex> l(m);
          if (meta) copy_time = meta->time;
        }
        if (meta && !meta->history.empty()) durable.begin_history(meta->history);
        if (meta && meta->hang) durable.set_hang_bounds(*meta->hang);
        auto writer = [&](const std::string& to) {
          detail::two_tier_copy_tree<in_io, out_io>(dir, to, true, buffer, abandon);
        };
        if (meta && meta->metrics.is_object())
          durable.save(st, writer, meta->metrics.as_object());
        else
          durable.save(st, writer);
      });
    }

    log_fn log;
    std::mutex m;
    std::condition_variable cv;
    std::optional<std::int64_t> pending, in_flight, failed, newest;  // newest: durable
    // the deadline of the save being committed locally (set before it, read by its commit)
    std::optional<std::chrono::steady_clock::time_point> save_deadline;
    std::optional<std::chrono::system_clock::time_point> copy_time;
    std::optional<std::chrono::steady_clock::duration> copy_mean;  // of the committed copies
    std::function<void(std::int64_t, std::chrono::duration<double>)> on_copy;
    std::atomic<bool> abandon{false};  // the copy in flight: stop streaming it
    bool stop = false;
    durable_manager_type durable;     // the copier's (and pin's) only
    local_manager_type local_reader;  // read_only: the copier's LOCK_SH on the local copy
  };

  struct impl {
    impl(std::string local_dir, directory_commit local_mode, std::string durable_dir,
         directory_commit durable_mode, two_tier_options o)
        : options(with_local_sums(std::move(o))),
          sh(std::make_shared<shared>(std::move(durable_dir), durable_mode, options.durable,
                                      local_dir, local_mode, options.local, options.log)),
          local(std::move(local_dir), local_mode, local_options(options.local, sh.get())),
          durable_reader(read_only, sh->durable.directory(), durable_mode, options.durable) {
      local.on_commit([this](const checkpoint_info& c) { request(c); });
      copier = std::thread([keep = sh, nice = options.copier_nice] { keep->run(nice); });
    }

    ~impl() {
      try {
        local.wait_until_finished();  // a staged save's local commit requests its copy
      } catch (const std::exception& e) {
        log(std::string("two-tier: the last local save failed: ") + e.what());
      }
      auto left = sh->wait_until(std::chrono::steady_clock::now() + options.durable_wait);
      {
        std::lock_guard<std::mutex> l(sh->m);
        sh->stop = true;
        sh->pending.reset();
        sh->on_copy = nullptr;  // a copy left to its thread calls no hook of the caller's
      }
      sh->cv.notify_all();
      bool hanging;
      {
        std::lock_guard<std::mutex> l(sh->m);
        hanging = sh->in_flight.has_value();
      }
      if (hanging) {
        log("two-tier: the durable copy of step(s) " + detail::two_tier_steps_text(left) +
            " did not finish within durable_wait; its thread is left running");
        copier.detach();
      } else {
        copier.join();
      }
    }

    // The local tier sums its files only when asked (local_sums): see restore_step.
    static two_tier_options with_local_sums(two_tier_options o) {
      o.local.checksums = o.local_sums;
      return o;
    }

    // The local options with the copier's steps kept on top of the user's retention.
    static checkpoint_options local_options(checkpoint_options o, shared* p) {
      retention_policy user = o.retention          ? *o.retention
                              : o.max_to_keep == 0 ? retention_policy::keep_all()
                                                   : retention_policy::keep_last(o.max_to_keep);
      o.retention = user | retention_policy::custom([p](const auto& cands) {
                      std::vector<bool> keep;
                      for (const auto& c : cands) keep.push_back(p->protects(c.step));
                      return keep;
                    });
      o.async_save = false;
      return o;
    }

    void log(const std::string& line) const { detail::log_line(options.log, line); }

    // A local save, then (its commit's hook, request()) the copier's request: a staged save's
    // commits on the local manager's background thread, so the request is made there. The
    // previous save is finished first, so the deadline the hook reads is this save's.
    template <class Save>
    checkpoint_info save(Save&& local_save) {
      local.wait_until_finished();
      {
        std::lock_guard<std::mutex> l(sh->m);
        sh->save_deadline = durable_deadline;
      }
      checkpoint_info info = local_save();
      last_save = std::chrono::steady_clock::now();
      return info;
    }

    // The local commit's hook (on the thread that committed): the step becomes the copier's
    // pending request.
    void request(const checkpoint_info& info) {
      std::optional<std::chrono::steady_clock::time_point> deadline;
      {
        std::lock_guard<std::mutex> l(sh->m);
        deadline = sh->save_deadline;
      }
      const std::optional<std::int64_t> replaced = sh->request(info.step, deadline);
      sh->cv.notify_all();
      if (replaced)
        log("two-tier: the durable copy of step " + std::to_string(*replaced) +
            " was replaced by step " + std::to_string(info.step) +
            "'s before it started (saves come faster than copies)");
    }

    void wait_bounded() {
      auto deadline =
          last_save ? *last_save + options.durable_wait : std::chrono::steady_clock::now();
      if (durable_deadline) deadline = std::min(deadline, *durable_deadline);
      unfinished = sh->wait_until(deadline);
      if (!unfinished.empty())
        log("two-tier: the durable copy of step(s) " + detail::two_tier_steps_text(unfinished) +
            " to '" + sh->durable.directory() +
            "' did not finish within durable_wait (or by the grace period's end); the local "
            "tier holds them");
    }

    // A tier's readable identities by step (of each step, the copy listed last), of the steps
    // its all_steps() lists (every recorded file there with its size).
    template <class Manager, class Io>
    std::map<std::int64_t, checkpoint_identity> identities(const Manager& mgr,
                                                           const char* tier) const {
      std::map<std::int64_t, checkpoint_identity> out;
      const auto steps = mgr.all_steps();
      for (const auto& c : mgr.checkpoints()) {
        if (!std::binary_search(steps.begin(), steps.end(), c.step)) continue;
        try {
          out[c.step] = detail::checkpoint_load_identity<Io>(c.path, c.step);
        } catch (const error& e) {
          out.erase(c.step);
          log(std::string("two-tier: the ") + tier + " copy of step " + std::to_string(c.step) +
              " is left out: " + e.what());
        }
      }
      return out;
    }

    std::map<std::int64_t, checkpoint_identity> local_ids() const {
      auto out = identities<local_manager_type, typename LocalStore::io_type>(local, "local");
      if (options.local_sums || out.empty()) return out;
      // Without sums of its own, a local copy is whole when every file its durable copy of the
      // same identity recorded is there with its size (a stat each, no read, as a tier's own
      // listing): a copy that lost a file is not listed here, the durable one is read instead.
      using local_io = typename LocalStore::io_type;
      using durable_io = typename DurableStore::io_type;
      std::map<std::int64_t, std::string> durable_paths;
      try {
        for (const auto& c : durable_reader.checkpoints()) durable_paths[c.step] = c.path;
      } catch (const error&) {  // the durable tier does not list: nothing to check against
        return out;
      }
      for (const auto& c : local.checkpoints()) {
        auto it = out.find(c.step);
        auto d = durable_paths.find(c.step);
        if (it == out.end() || d == durable_paths.end()) continue;
        try {
          if (!(detail::checkpoint_load_identity<durable_io>(d->second, c.step) == it->second))
            continue;
          checkpoint_integrity r = detail::checkpoint_verify_files<local_io, durable_io>(
              c.path, c.step, detail::checkpoint_check_depth::sizes, d->second);
          if (r.corrupt() && r.status != integrity_status::bad_metadata) {
            log("two-tier: the local copy of step " + std::to_string(c.step) + " is left out: " +
                to_string(r.status) + " of '" + r.file + "' against its durable copy's sums");
            out.erase(it);
          }
        } catch (const error&) {  // unreadable durable metadata: the local copy stays listed
        }
      }
      return out;
    }
    std::map<std::int64_t, checkpoint_identity> durable_ids() const {
      return identities<durable_manager_type, typename DurableStore::io_type>(durable_reader,
                                                                              "durable");
    }

    std::map<std::int64_t, checkpoint_identity> merged() const {
      auto out = local_ids();
      for (auto& [step, id] : durable_ids()) out.emplace(step, std::move(id));  // local wins
      return out;
    }

    // Loads `step` from either tier; then durable_step() follows it.
    void restore_step(std::int64_t step) {
      load_step(step);
      std::optional<std::int64_t> at_or_below;
      try {
        for (std::int64_t s : durable_reader.all_steps())
          if (s <= step) at_or_below = s;
      } catch (const error&) {  // the durable tier does not list: no durable step is known
      }
      sh->restored(step, at_or_below);
    }

    void load_step(std::int64_t step) {
      auto read = [this](const std::string& d, std::int64_t st) {
        if (reader) reader(d, st);
      };
      restored_hang.reset();
      auto l = local_ids();
      auto li = l.find(step);
      if (li != l.end()) {
        try {
          local.restore_step(step, [&](const std::string& d, std::int64_t st) {
            if (!options.local_sums) check_against_durable(d, li->second);  // under LOCK_SH
            read(d, st);
          });
          restored_hang = local.restored_hang_bounds();
          return;
        } catch (const error& e) {
          auto d = durable_ids();
          auto di = d.find(step);
          if (di == d.end() || !(di->second == li->second)) throw;
          log("two-tier: the local copy of step " + std::to_string(step) +
              " did not load, restoring the durable copy from '" + durable_reader.directory() +
              "': " + e.what());
          durable_reader.restore_step(step, read);
          restored_hang = durable_reader.restored_hang_bounds();
          prepare_local_staging(step);
          return;
        }
      }
      log("two-tier: the local tier has no step " + std::to_string(step) +
          ", restoring it from the durable tier '" + durable_reader.directory() + "'");
      durable_reader.restore_step(step, read);
      restored_hang = durable_reader.restored_hang_bounds();
      prepare_local_staging(step);
    }

    // A restore from the durable tier sizes the local tier's staging area (a staged writer's)
    // from the copy it loaded, as a local restore does from its own.
    void prepare_local_staging(std::int64_t step) noexcept {
      try {
        for (const auto& c : durable_reader.checkpoints())
          if (c.step == step) local.prepare_staging(c.path);
      } catch (...) {  // not sized: the first save maps what it needs
      }
    }

    // Checks the local copy of `id` at `dir` (the caller holds LOCK_SH on it) against the sums
    // the durable copy of the same identity recorded: the copier read these very bytes to copy
    // them. Throws checkpoint_corrupt on a mismatch; with nothing to check against (the copier
    // is behind, another identity, no sums recorded) logs that it restores unverified.
    void check_against_durable(const std::string& dir, const checkpoint_identity& id) const {
      using local_io = typename LocalStore::io_type;
      using durable_io = typename DurableStore::io_type;
      std::string why = "its durable copy is not there yet (the copier is behind)";
      std::optional<checkpoint_info> copy;
      try {
        for (const auto& c : durable_reader.checkpoints())
          if (c.step == id.step) copy = c;  // of each step, the one listed last
        if (copy && !(detail::checkpoint_load_identity<durable_io>(copy->path, id.step) == id)) {
          why = "its durable copy is of another history";
          copy.reset();
        }
      } catch (const error& e) {  // the durable tier does not read: the local copy still can
        why = std::string("its durable copy does not read: ") + e.what();
        copy.reset();
      }
      if (copy) {  // a failing read of a local file throws: the caller reads the durable copy
        checkpoint_integrity r = detail::checkpoint_verify_files<local_io, durable_io>(
            dir, id.step, detail::checkpoint_check_depth::sums, copy->path);
        if (r.status == integrity_status::ok) return;
        if (r.corrupt() && r.status != integrity_status::bad_metadata)
          throw checkpoint_corrupt(
              dir, id.step, r.file,
              std::string(to_string(r.status)) + " against its durable copy's sums: " + r.detail);
        why = "its durable copy records no sums to check against (" +
              std::string(to_string(r.status)) + (r.detail.empty() ? "" : ": " + r.detail) + ")";
      }
      log("two-tier: the local copy of step " + std::to_string(id.step) +
          " restores unverified: " + why);
    }

    two_tier_options options;
    std::shared_ptr<shared> sh;
    local_manager_type local;
    durable_manager_type durable_reader;  // read_only: the caller's view of the durable tier
    reader_type reader;
    std::optional<std::chrono::steady_clock::time_point> last_save;
    std::optional<std::chrono::steady_clock::time_point> durable_deadline;  // the grace's end
    std::vector<std::int64_t> unfinished;
    std::optional<hang_bounds> restored_hang;  // of the copy the last restore loaded
    std::thread copier;
  };

  std::unique_ptr<impl> s_;
};

HOLDFAST_NAMESPACE_END
