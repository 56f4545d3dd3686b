// holdfast/checkpoint.hpp — checkpoints of a run as whole directories, with retention and an
// atomically replaced `latest` pointer (TF CheckpointManager's protocol on holdfast publishing),
// one writer and any number of readers side by side. checkpoint_manager is the Checkpointer
// preemption_handler uses by default.
//
//   holdfast::checkpoint_options o;
//   o.retention = holdfast::retention_policy::keep_last(3) |
//                 holdfast::retention_policy::best_n(2, "loss", holdfast::metric_order::min);
//   o.async_save = true;                                  // fsyncs, rename, pointer in background
//   holdfast::checkpoint_manager<> ckpt(holdfast::store::create("/data/exp"), "run-7", o);
//   ckpt.set_writer([&](const std::string& dir) { model.save_to(dir); });
//   ckpt.set_reader([&](const std::string& dir) { model.load_from(dir); });
//   std::optional<std::int64_t> step = ckpt.restore();   // loads the latest, if any
//   if (ckpt.should_save(n)) ckpt.save(n, {{"loss", 0.25}});
//   ckpt.wait_until_finished();                           // before exiting
//
//   // An evaluator beside the trainer: never modifies anything.
//   holdfast::checkpoint_manager<> eval(holdfast::read_only, store, "run-7");
//   eval.restore([&](const std::string& dir) { model.load_from(dir); });
//
// For a restore agreement (every worker restores the newest step all of them hold):
//   std::vector<std::int64_t> mine = ckpt.all_steps();   // publish these, agree on `common`
//   ckpt.restore_step(common);                           // load exactly that step
//   ckpt.pin(common);                                    // retention keeps it until unpinned
//
// Layout of <run>/checkpoint/:   latest                   the pointer (see below)
//                                <prefix><N>[.<G>]/       one checkpoint (G: a re-save of N);
//                                                         prefix "step-", N unpadded by default
//                                <ckpt>/holdfast-metadata.json   its step, time and metrics
//                                .writer.lock             the writer's flock (local filesystems)
//                                .writer.lease            the writer's lease (elsewhere)
//                                .staging-<name>-<pid>-<k>/    being written (rename mode)
//                                .deleting-<name>-<pid>-<k>/   being removed (rename mode)
// The pointer is text: "holdfast-checkpoints 1", then "latest <name>", then one "keep <name>"
// per retained checkpoint, oldest first, then "delete <name>" for deletions not done yet.
//
// Protocol of save(step, writer):
//   1. rename mode: mkdir a staging directory, writer fills it (in the caller's thread), the
//      metadata file is added, publish_directory syncs every file and renames it to the
//      checkpoint's name, syncing the parent; marker mode (mounted_remote): mkdir the checkpoint
//      in place, writer fills it, commit_directory syncs it and writes commit_success.txt last,
//      then the parent directory is synced (so the new entry is durable before the pointer);
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
//   - Readers and writers side by side: a writing manager holds the writer lock for its whole
//     life (flock on <dir>/.writer.lock where statfs names a local filesystem — ext2/3/4, xfs,
//     btrfs, tmpfs, overlayfs, f2fs, zfs, ramfs, ...; elsewhere the lease <dir>/.writer.lease
//     holding pid, host and a heartbeat mtime, stale after checkpoint_options::lease_stale_after
//     or at once when its pid is gone on this host). A second writer waits up to
//     writer_lock_timeout, then throws holdfast::checkpoint_locked naming the holder's pid and
//     host. A read_only manager never creates, sweeps, deletes or publishes anything, and save()
//     refuses (EROFS).
//   - restore()/restore_step() hold LOCK_SH (flock) on the checkpoint's directory while the
//     reader runs; retention and the start-up sweep delete a checkpoint only when they get
//     LOCK_EX|LOCK_NB on it. A reader that finds a checkpoint being deleted resolves the pointer
//     again. So where flock is trusted, with a trainer saving (retention on) and any number of
//     read_only openers restoring, no save fails and no restore sees a partial or vanishing
//     checkpoint.
//   - The start-up sweep runs under the writer lock, which proves no other writer is alive: it
//     removes staging and half-deleted directories, publish temps, incomplete (marker-less)
//     checkpoints, deletions the pointer lists, and complete checkpoints a sound pointer does
//     not name (a save killed between steps 1 and 2).
//   - latest() names a complete checkpoint whenever the writer was killed: before step 2 the
//     previous pointer still names the previous checkpoint, which retention never deletes.
//   - Recovery instead of crash loops: a pointer that is garbled or truncated, or that names a
//     checkpoint that is missing (or uncommitted in marker mode), or that is missing while
//     complete checkpoints are on disk, is reported once through the log hook, and every query
//     falls back to the complete checkpoints on disk (complete = renamed into place in rename
//     mode, committed marker in marker mode; never a partial one), the newest (largest step,
//     then generation) as the latest. The constructor never throws for a bad pointer; the next
//     save (or repair()) rewrites it.
//   - A writer that throws leaves no trace: the staging (or in-place) directory is removed and
//     the pointer is unchanged. So does a failed background save; its error is rethrown by
//     wait_until_finished() and by the next save(), restore() or restore_step().
//   - Async saves: at most one in flight (the next save() waits for it); restore(),
//     restore_step(), repair(), wait_until_finished() and destruction wait for it.
//   - all_steps() lists a step exactly when restore_step() of it finds a complete checkpoint;
//     latest_step() never throws.
//   - Retention never deletes the latest nor a checkpoint of the pinned step. max_to_keep N is
//     retention_policy::keep_last(N) (0: keep all) unless checkpoint_options::retention is set.
//   - Names: step_prefix and step_format_fixed_length (zero padding) shape new names; any width,
//     padded or not, of the configured prefix is read, so changing the width keeps a run
//     readable. Pointers and directories written by holdfast 0.1.0 are read unchanged.
//   - Metadata: each checkpoint holds holdfast-metadata.json (format, step, save time in Unix
//     nanoseconds, user metrics as a JSON object); checkpoints without it (0.1.0) read as
//     having no metrics, their directory's mtime as their time.
// Caveats:
//   - flock is trusted only where statfs names a local filesystem. Elsewhere (NFS, FUSE, SMB,
//     Lustre, ...) the writer lease relies on clocks agreeing within lease_stale_after, a
//     writer paused longer than that loses the lease (its heartbeat notices; its saves then
//     throw checkpoint_locked), and readers take no lock: retention there may delete a
//     checkpoint a reader is loading (the reader's own error says so; it can retry).
//   - flock belongs to the open file description: a child forked while a manager lives shares
//     its writer lock (exec drops it, descriptors are O_CLOEXEC). Do not fork while an async
//     save is in flight.
//   - step_prefix must stay the same for a run: names of another prefix are not seen (and a
//     pointer naming them reads as garbled). Names padded with zeros or written with a
//     non-default prefix are not readable by holdfast 0.1.0.
//   - The pin lives in the manager only, not in the pointer: a restarted process pins again.
//   - latest_step() is the largest retained step, latest() the checkpoint saved last: they
//     differ after an older step is saved again (a job restored at an older step re-saves it).
//   - A second writing manager in the same process is a second writer: it waits, then throws
//     checkpoint_locked. Share one manager, or open the others read_only.
//   - Recovery orders by step: after a garbled pointer the latest is the largest step even if
//     an older step was saved again last, and checkpoints a garbled pointer listed for deletion
//     count as kept until the next save's retention.
//   - A step whose async save fails counts for should_save() until the failure is rethrown.
//   - A manager is not thread-safe: one thread at a time calls it (its background save and the
//     lease heartbeat are its own). The log hook may be called from the background thread. A
//     moved-from manager may only be destroyed or assigned to.
//   - A writer may not create holdfast-metadata.json at the top of its checkpoint (the save
//     fails with EEXIST).
#pragma once

#include <fcntl.h>       // O_RDONLY, O_DIRECTORY: the pointer, checkpoint directories
#include <signal.h>      // kill(pid, 0): is a lease holder on this host alive
#include <sys/file.h>    // LOCK_SH, LOCK_EX, LOCK_NB
#include <sys/stat.h>    // struct stat: inodes, ages of swept directories
#include <sys/statfs.h>  // fstatfs: whether flock can be trusted
#include <unistd.h>      // gethostname: the writer lock's holder

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/json.hpp"  // per-checkpoint metadata
#include "error.hpp"
#include "io.hpp"
#include "log.hpp"
#include "publish.hpp"
#include "store.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Tag: open a checkpoint directory for reading only (no sweep, no mkdir, no pointer write).
struct read_only_t {
  explicit read_only_t() = default;
};
/// The read_only_t value.
inline constexpr read_only_t read_only{};

/// How the writer lock is taken.
enum class checkpoint_lock {
  automatic,  ///< flock where statfs names a local filesystem, else the lease
  flock,      ///< flock on <dir>/.writer.lock, and reader locks, whatever the filesystem
  lease       ///< the lease file <dir>/.writer.lease with a heartbeat; readers take no lock
};

/// Whether a larger or a smaller metric is better.
enum class metric_order {
  max,  ///< larger is better (accuracy)
  min   ///< smaller is better (loss)
};

/// One user metric or several, saved with a checkpoint: a JSON object ({{"loss", 0.25}}).
using checkpoint_metrics = detail::json_value::object_t;

/// A checkpoint as a retention policy sees it.
struct retention_candidate {
  std::int64_t step = -1;                      ///< the step it holds
  std::string name;                            ///< its directory name
  std::chrono::system_clock::time_point time;  ///< when its save started (or its mtime)
  std::optional<detail::json_value> metrics;   ///< its metrics object, when it has one
  /// The metric `key` as a number, when present.
  std::optional<double> metric(std::string_view key) const {
    if (!metrics) return std::nullopt;
    const detail::json_value* v = metrics->find(key);
    if (!v || !v->is_number()) return std::nullopt;
    return v->as_double();
  }
};

/// Which checkpoints retention keeps: any of its rules (keep the last N, one every N steps or
/// every period, the best N by a metric, or your own). The latest and the pinned step are kept
/// whatever the policy says.
class retention_policy {
 public:
  /// Your own rule: which of the candidates (oldest first) to keep.
  using rule_fn = std::function<std::vector<bool>(const std::vector<retention_candidate>&)>;

  /// Keeps every checkpoint.
  static retention_policy keep_all() { return one({kind::all, 0, 0, {}, {}, {}, {}}); }
  /// Keeps the newest `n` (n >= 1; counting the latest).
  static retention_policy keep_last(std::size_t n) {
    return one({kind::last, std::max<std::size_t>(n, 1), 0, {}, {}, {}, {}});
  }
  /// Keeps every checkpoint whose step is a multiple of `n` (Orbax EveryNSteps).
  static retention_policy every_n_steps(std::int64_t n) {
    return one({kind::steps, 0, std::max<std::int64_t>(n, 1), {}, {}, {}, {}});
  }
  /// Keeps the oldest checkpoint, then one at least `period` of save time after the previous
  /// one kept by this rule (TF keep_checkpoint_every_n_hours, Orbax EveryNSeconds).
  static retention_policy every(std::chrono::nanoseconds period) {
    return one({kind::period, 0, 0, period, {}, {}, {}});
  }
  /// every(), in hours.
  static retention_policy every_n_hours(double hours) {
    return every(std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double, std::ratio<3600>>(hours)));
  }
  /// Keeps the `n` best checkpoints by the number `metric` (Orbax BestN); ties go to the newer.
  /// Checkpoints without the metric are not kept by this rule.
  static retention_policy best_n(std::size_t n, std::string metric, metric_order order) {
    return one({kind::best, n, 0, {}, std::move(metric), order, {}});
  }
  /// Your own rule (it may throw: the save then fails after publishing, before any deletion).
  static retention_policy custom(rule_fn rule) {
    return one({kind::custom, 0, 0, {}, {}, metric_order::max, std::move(rule)});
  }
  /// Keeps what any of `policies` keeps.
  static retention_policy any_of(std::vector<retention_policy> policies) {
    retention_policy r;
    for (auto& p : policies)
      for (auto& rule : p.rules_) r.rules_.push_back(std::move(rule));
    return r;
  }
  /// Keeps what `a` or `b` keeps.
  friend retention_policy operator|(retention_policy a, retention_policy b) {
    return any_of({std::move(a), std::move(b)});
  }

  /// Which of `c` (oldest first) the policy keeps.
  std::vector<bool> keeps(const std::vector<retention_candidate>& c) const {
    std::vector<bool> keep(c.size(), false);
    for (const auto& r : rules_) apply(r, c, keep);
    return keep;
  }
  /// True when a rule looks at save times or metrics (the manager then reads the metadata).
  bool needs_metadata() const noexcept {
    for (const auto& r : rules_)
      if (r.k == kind::period || r.k == kind::best || r.k == kind::custom) return true;
    return false;
  }

 private:
  enum class kind { all, last, steps, period, best, custom };
  struct rule {
    kind k;
    std::size_t n;
    std::int64_t every_steps;
    std::chrono::nanoseconds period;
    std::string metric;
    metric_order order;
    rule_fn fn;
  };
  static retention_policy one(rule r) {
    retention_policy p;
    p.rules_.push_back(std::move(r));
    return p;
  }
  static void apply(const rule& r, const std::vector<retention_candidate>& c,
                    std::vector<bool>& keep) {
    switch (r.k) {
      case kind::all:
        keep.assign(c.size(), true);
        break;
      case kind::last:
        for (std::size_t i = c.size() > r.n ? c.size() - r.n : 0; i < c.size(); ++i) keep[i] = true;
        break;
      case kind::steps:
        for (std::size_t i = 0; i < c.size(); ++i)
          if (c[i].step % r.every_steps == 0) keep[i] = true;
        break;
      case kind::period: {
        std::vector<std::size_t> order(c.size());
        for (std::size_t i = 0; i < c.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return c[a].time < c[b].time; });
        std::optional<std::chrono::system_clock::time_point> last;
        for (std::size_t i : order) {
          if (!last || c[i].time - *last >= r.period) {
            keep[i] = true;
            last = c[i].time;
          }
        }
        break;
      }
      case kind::best: {
        std::vector<std::pair<double, std::size_t>> scored;
        for (std::size_t i = 0; i < c.size(); ++i)
          if (auto m = c[i].metric(r.metric)) scored.emplace_back(*m, i);
        std::stable_sort(scored.begin(), scored.end(), [&](const auto& a, const auto& b) {
          if (a.first != b.first)
            return r.order == metric_order::max ? a.first > b.first : a.first < b.first;
          return a.second > b.second;  // ties: the newer first
        });
        for (std::size_t i = 0; i < scored.size() && i < r.n; ++i) keep[scored[i].second] = true;
        break;
      }
      case kind::custom: {
        std::vector<bool> mine = r.fn(c);
        for (std::size_t i = 0; i < c.size() && i < mine.size(); ++i)
          if (mine[i]) keep[i] = true;
        break;
      }
    }
  }

  std::vector<rule> rules_;
};

/// Options of checkpoint_manager. The first two members keep their 0.1.0 order ({3} and
/// {3, age} still initialize max_to_keep and sweep_older_than).
struct checkpoint_options {
  /// How many checkpoints to keep (the newest, counting the latest); 0 keeps every one.
  /// Ignored when `retention` is set.
  std::size_t max_to_keep = 5;
  /// At construction, staging directories and publish temps at least this old are swept (the
  /// writer lock already proves their writer dead; 0 sweeps all).
  std::chrono::milliseconds sweep_older_than{0};
  /// Which checkpoints to keep; unset: keep_last(max_to_keep) (keep_all for 0).
  std::optional<retention_policy> retention{};
  /// should_save(step) is true for new steps that are a multiple of this (0: never by steps).
  std::int64_t save_interval_steps = 1;
  /// should_save(step) is also true once this much time passed since the last save (0: off).
  std::chrono::milliseconds save_interval{0};
  /// save() returns once the writer ran; syncs, rename, pointer and retention run on a
  /// background thread (wait_until_finished() waits for them).
  bool async_save = false;
  /// Names are <step_prefix><step>[.<generation>]; not empty, no '/', not starting with '.'.
  std::string step_prefix = "step-";
  /// Steps in new names are zero-padded to this many digits (0: unpadded).
  std::size_t step_format_fixed_length = 0;
  /// How long a writer waits for another writer's lock before checkpoint_locked.
  std::chrono::milliseconds writer_lock_timeout{30000};
  /// How the writer lock is taken (automatic: from statfs).
  checkpoint_lock lock = checkpoint_lock::automatic;
  /// A lease whose heartbeat is older than this is stale (the heartbeat beats 6 times per age).
  std::chrono::milliseconds lease_stale_after{60000};
  /// Where recoveries and background problems are reported (empty: log_to_stderr).
  log_fn log{};
  /// The wall clock of save times, should_save and retention periods (empty: system_clock).
  std::function<std::chrono::system_clock::time_point()> clock{};
  /// Write holdfast-metadata.json into each checkpoint.
  bool write_metadata = true;
};

/// One checkpoint: its step, its directory name and its full path.
struct checkpoint_info {
  std::int64_t step = -1;  ///< the training step it holds
  std::string name;        ///< "step-<N>" or "step-<N>.<G>" (with the configured prefix)
  std::string path;        ///< <checkpoint dir>/<name>
};

/// What a checkpoint's holdfast-metadata.json holds.
struct checkpoint_metadata {
  std::int64_t step = -1;                      ///< the step
  std::chrono::system_clock::time_point time;  ///< when its save started
  detail::json_value metrics;                  ///< the user metrics (an object, or null)
  /// The metric `key` as a number, when present.
  std::optional<double> metric(std::string_view key) const {
    const detail::json_value* v = metrics.find(key);
    if (!v || !v->is_number()) return std::nullopt;
    return v->as_double();
  }
};

/// The state of the `latest` pointer.
enum class pointer_state {
  ok,       ///< well-formed, and its latest is complete
  missing,  ///< no pointer file
  garbled,  ///< not in the pointer format (or truncated, or names of another prefix)
  dangling  ///< well-formed, but its latest is missing or uncommitted
};

/// What verify() found in a checkpoint directory.
struct checkpoint_report {
  pointer_state pointer = pointer_state::missing;  ///< the pointer's state
  std::string problem;                             ///< why the pointer is not ok ("" when ok)
  std::vector<checkpoint_info> checkpoints;  ///< what the manager uses, oldest first (latest last)
  std::vector<std::string> missing;          ///< kept by the pointer but missing or incomplete
  std::vector<std::string> unnamed;    ///< complete on disk, not named by a well-formed pointer
  std::vector<std::string> leftovers;  ///< staging, half-deleted, incomplete, listed deletions
  /// True when the pointer is sound and every checkpoint it keeps is complete.
  bool ok() const noexcept { return pointer == pointer_state::ok && missing.empty(); }
};

/// Another process holds the checkpoint directory's writer lock (errno EBUSY).
class checkpoint_locked : public error {
 public:
  checkpoint_locked(std::string lock_path, long holder_pid, std::string holder_host,
                    const std::string& why)
      : error(EBUSY, "checkpoint writer lock", std::move(lock_path),
              "held by " + describe(holder_pid, holder_host) + "; " + why),
        pid_(holder_pid),
        host_(std::move(holder_host)) {}
  /// The holder's pid (0 when unknown).
  long holder_pid() const noexcept { return pid_; }
  /// The holder's host name ("" when unknown).
  const std::string& holder_host() const noexcept { return host_; }

 private:
  static std::string describe(long pid, const std::string& host) {
    if (pid <= 0 && host.empty()) return "an unknown process";
    return "pid " + std::to_string(pid) + " on host '" + host + "'";
  }
  long pid_;
  std::string host_;
};

/// True for a statfs f_type where flock is a real lock between processes of this machine:
/// ext2/3/4, xfs, btrfs, tmpfs, overlayfs, ramfs, f2fs, zfs, reiserfs, jfs, bcachefs, nilfs2.
constexpr bool is_flock_trusted_filesystem(std::uint64_t f_type) noexcept {
  switch (static_cast<std::uint32_t>(f_type)) {  // f_type is a signed long: compare 32 bits
    case 0xEF53u:                                // ext2, ext3, ext4
    case 0x58465342u:                            // xfs
    case 0x9123683Eu:                            // btrfs
    case 0x01021994u:                            // tmpfs
    case 0x794C7630u:                            // overlayfs
    case 0x858458F6u:                            // ramfs
    case 0xF2F52010u:                            // f2fs
    case 0x2FC12FC1u:                            // zfs
    case 0x52654973u:                            // reiserfs
    case 0x3153464Au:                            // jfs
    case 0xCA451A4Eu:                            // bcachefs
    case 0x3434u:                                // nilfs2
      return true;
    default:
      return false;
  }
}

namespace detail {

// Checks a step prefix: not empty, no '/', no control character, not starting with '.'.
inline void checkpoint_check_prefix(std::string_view prefix) {
  const char* why = nullptr;
  if (prefix.empty())
    why = "is empty";
  else if (prefix[0] == '.')
    why = "starts with '.' (holdfast's scratch names do)";
  else
    for (char c : prefix)
      if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == ' ')
        why = "contains '/', a space or a control character";
  if (why) throw error(EINVAL, "step_prefix", printable(prefix), why);
}

// Decimal digits, leading zeros allowed, at most 18 significant: the value.
inline std::optional<std::int64_t> checkpoint_number(std::string_view digits) {
  if (digits.empty()) return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  std::size_t first = digits.find_first_not_of('0');
  if (first == std::string_view::npos) return 0;
  if (digits.size() - first > 18) return std::nullopt;
  std::int64_t v = 0;
  for (char c : digits.substr(first)) v = v * 10 + (c - '0');
  return v;
}

// {step, generation} of "<prefix><N>[.<G>]" (N and G decimal, any width), or nothing.
inline std::optional<std::pair<std::int64_t, std::int64_t>> checkpoint_parse_name(
    std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  auto dot = name.find('.');
  auto step = checkpoint_number(name.substr(0, dot));
  if (!step) return std::nullopt;
  if (dot == std::string_view::npos) return std::make_pair(*step, std::int64_t{0});
  auto gen = checkpoint_number(name.substr(dot + 1));
  if (!gen) return std::nullopt;
  return std::make_pair(*step, *gen);
}

// "<prefix><N>[.<G>]" -> N; any width of N, so runs written unpadded or padded stay readable.
inline std::optional<std::int64_t> checkpoint_step_of(std::string_view name,
                                                      std::string_view prefix) {
  auto p = checkpoint_parse_name(name, prefix);
  if (!p) return std::nullopt;
  return p->first;
}

// "step-<N>" or "step-<N>.<G>" -> N.
inline std::optional<std::int64_t> checkpoint_step_of(std::string_view name) {
  return checkpoint_step_of(name, "step-");
}

// The name of generation `gen` of `step`: prefix + step zero-padded to `width` [+ ".gen"].
inline std::string checkpoint_name(std::string_view prefix, std::size_t width, std::int64_t step,
                                   std::int64_t gen) {
  std::string digits = std::to_string(step);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  std::string n = std::string(prefix) + digits;
  if (gen > 0) n += "." + std::to_string(gen);
  return n;
}

// The pointer file's content.
struct checkpoint_pointer {
  std::string latest;
  std::vector<std::string> keep;    // oldest first; contains latest
  std::vector<std::string> remove;  // deletions not done yet
};

inline std::string format_checkpoint_pointer(const checkpoint_pointer& p) {
  std::string s = "holdfast-checkpoints 1\nlatest " + p.latest + "\n";
  for (const auto& k : p.keep) s += "keep " + k + "\n";
  for (const auto& d : p.remove) s += "delete " + d + "\n";
  return s;
}

inline checkpoint_pointer parse_checkpoint_pointer(std::string_view text, const std::string& path,
                                                   std::string_view prefix = "step-") {
  checkpoint_pointer p;
  std::size_t line_no = 0;
  bool header = false;
  auto fail = [&](const std::string& why) -> void {
    throw format_error(path, "line " + std::to_string(line_no) + ": " + why);
  };
  while (!text.empty()) {
    ++line_no;
    auto nl = text.find('\n');
    if (nl == std::string_view::npos) fail("truncated (no newline at the end)");
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    if (!header) {
      if (line != "holdfast-checkpoints 1")
        fail("expected 'holdfast-checkpoints 1', found '" + printable(line.substr(0, 64)) + "'");
      header = true;
      continue;
    }
    auto space = line.find(' ');
    std::string_view key = line.substr(0, space);
    std::string_view value =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    if (key != "latest" && key != "keep" && key != "delete")
      fail("unknown key '" + printable(key.substr(0, 64)) + "'");
    if (!checkpoint_step_of(value, prefix))
      fail("expected a checkpoint name '" + printable(prefix) + "<N>', found '" +
           printable(value.substr(0, 64)) + "'");
    if (key == "latest") {
      if (!p.latest.empty()) fail("a second 'latest'");
      if (!p.keep.empty()) fail("'latest' after 'keep'");
      p.latest = std::string(value);
    } else if (key == "keep") {
      if (!p.remove.empty()) fail("'keep' after 'delete'");
      p.keep.emplace_back(value);
    } else {
      p.remove.emplace_back(value);
    }
  }
  if (!header) throw format_error(path, "empty pointer file");
  if (p.latest.empty()) throw format_error(path, "no 'latest' line");
  if (std::find(p.keep.begin(), p.keep.end(), p.latest) == p.keep.end())
    throw format_error(path, "'latest " + p.latest + "' is not among the 'keep' lines");
  for (const auto& d : p.remove)
    if (std::find(p.keep.begin(), p.keep.end(), d) != p.keep.end())
      throw format_error(path, "'" + d + "' is both kept and deleted");
  return p;
}

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

inline std::string checkpoint_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// The lock files' content: who holds it.
inline std::string checkpoint_holder_text(long pid, const std::string& host,
                                          const std::string& nonce) {
  std::string s = "holdfast-writer 1\npid " + std::to_string(pid) + "\nhost " + host + "\n";
  if (!nonce.empty()) s += "nonce " + nonce + "\n";
  return s;
}

// {pid, host} from a lock file's content ({0, ""} for what cannot be read).
inline std::pair<long, std::string> checkpoint_parse_holder(std::string_view text) {
  long pid = 0;
  std::string host;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.substr(0, 4) == "pid ") {
      auto n = checkpoint_number(line.substr(4));
      pid = n ? static_cast<long>(*n) : 0;
    } else if (line.substr(0, 5) == "host ") {
      host = printable(line.substr(5, 255));
    }
  }
  return {pid, host};
}

inline std::int64_t checkpoint_to_unix_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

inline std::chrono::system_clock::time_point checkpoint_from_unix_ns(std::int64_t ns) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

inline std::string format_checkpoint_metadata(std::int64_t step,
                                              std::chrono::system_clock::time_point time,
                                              const checkpoint_metrics* metrics) {
  json_value doc(json_value::object_t{});
  doc.set("format", "holdfast-checkpoint-metadata 1");
  doc.set("step", step);
  doc.set("time_unix_ns", checkpoint_to_unix_ns(time));
  doc.set("metrics", metrics ? json_value(*metrics) : json_value());
  return to_json(doc, 2);
}

inline std::optional<checkpoint_metadata> parse_checkpoint_metadata(std::string_view text,
                                                                    const std::string& path) {
  try {
    json_value doc = parse_json(text, path);
    const json_value* format = doc.find("format");
    const json_value* step = doc.find("step");
    const json_value* time = doc.find("time_unix_ns");
    if (!format || !format->is_string() || format->as_string() != "holdfast-checkpoint-metadata 1")
      return std::nullopt;
    checkpoint_metadata m;
    if (step && step->is_integer()) m.step = step->as_int64();
    if (time && time->is_integer()) m.time = checkpoint_from_unix_ns(time->as_int64());
    if (const json_value* metrics = doc.find("metrics"); metrics && metrics->is_object())
      m.metrics = *metrics;
    return m;
  } catch (const error&) {
    return std::nullopt;
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
  static constexpr std::string_view metadata_file_name = "holdfast-metadata.json";

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
  bool uses_flock() const noexcept { return s_->use_flock; }

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

  /// The latest checkpoint (recovered from disk when the pointer is bad), or nothing.
  std::optional<checkpoint_info> latest() const { return s_->latest(); }

  /// Every complete retained checkpoint, oldest first (the latest last).
  std::vector<checkpoint_info> checkpoints() const { return s_->complete_list(); }

  /// Loads the latest checkpoint with the reader given to set_reader (when one is set), holding
  /// LOCK_SH on it, and returns its step, or nothing when there is no checkpoint yet.
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

  /// Steps of every complete retained checkpoint, ascending, each once.
  std::vector<std::int64_t> all_steps() const { return s_->all_steps(); }

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

  /// Loads the checkpoint of exactly `step` with the reader given to set_reader (when one is
  /// set). Throws holdfast::error (ENOENT) naming the directory and the step when it has none.
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
template <class Store>
class checkpoint_manager<Store>::impl {
 public:
  static constexpr std::int64_t no_pin = std::numeric_limits<std::int64_t>::min();
  using writer_fn = std::function<std::function<void()>(const std::string&, std::int64_t)>;

  impl(std::string d, directory_commit m, checkpoint_options o, bool ro)
      : dir(std::move(d)), mode(m), options(std::move(o)), read_only(ro) {
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    detail::checkpoint_check_prefix(options.step_prefix);
    use_flock = options.lock != checkpoint_lock::lease;
  }
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
    release_writer_lock();
  }

  // --- construction of a writer ----------------------------------------------------------------

  void open_writer() {
    auto created = detail::store_make_dirs<io_type>(dir);
    if (!created.empty())
      detail::store_sync_dir<durability_type, io_type>(detail::store_parent(created[0]));
    for (std::size_t i = 0; i + 1 < created.size(); ++i)
      detail::store_sync_dir<durability_type, io_type>(created[i]);
    if (options.lock == checkpoint_lock::automatic) {
      auto fd = open_file<io_type>(dir, O_RDONLY | O_DIRECTORY);
      use_flock = is_flock_trusted_filesystem(detail::filesystem_type<io_type>(fd.get()));
    }
    host = detail::checkpoint_hostname();
    if (use_flock)
      acquire_flock();
    else
      acquire_lease();
    sweep();
    auto steps = all_steps();
    if (!steps.empty()) last_step = steps.back();
  }

  // --- paths and names ---------------------------------------------------------------------------

  std::string pointer_path() const { return detail::store_join(dir, "latest"); }
  std::string path_of(const std::string& name) const { return detail::store_join(dir, name); }
  std::optional<std::pair<std::int64_t, std::int64_t>> parse(std::string_view name) const {
    return detail::checkpoint_parse_name(name, options.step_prefix);
  }
  std::int64_t step_of(const std::string& name) const { return parse(name)->first; }

  std::string scratch_name(std::string_view kind, const std::string& name) const {
    return std::string(kind) + name + "-" + std::to_string(io_type::getpid()) + "-" +
           std::to_string(detail::store_next_serial());
  }

  std::chrono::system_clock::time_point now() const {
    return options.clock ? options.clock() : std::chrono::system_clock::now();
  }

  void log(const std::string& line) const {
    log_fn sink;
    {
      std::lock_guard<std::mutex> l(mutex);
      sink = options.log;
    }
    detail::log_line(sink, line);
  }

  // Logs `line` unless it is the last line logged (recoveries are seen by every query).
  void log_once(const std::string& line) const {
    {
      std::lock_guard<std::mutex> l(mutex);
      if (line == last_logged) return;
      last_logged = line;
    }
    log(line);
  }

  // --- the effective pointer ---------------------------------------------------------------------

  struct view {
    detail::checkpoint_pointer p;     // latest empty: no checkpoint
    detail::checkpoint_pointer file;  // the pointer file as read, when well-formed
    pointer_state status = pointer_state::missing;
    std::string problem;
    bool parsed = false;     // the pointer file is well-formed (p as read)
    bool recovered = false;  // p was built from the complete checkpoints on disk
  };

  // True when `name` is a directory and, in marker mode, committed.
  bool complete(const std::string& name) const {
    std::string path = path_of(name);
    struct stat st {};
    if (!detail::store_lstat<io_type>(path, st) || !S_ISDIR(st.st_mode)) return false;
    return mode != directory_commit::marker || publisher_type::is_committed(path);
  }

  // The complete checkpoints on disk, oldest (step, generation) first.
  std::vector<std::string> scan_complete() const {
    std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, std::string>> found;
    for (const auto& name : detail::store_list_dir<io_type>(dir)) {
      auto p = parse(name);
      if (p && complete(name)) found.emplace_back(*p, name);
    }
    std::sort(found.begin(), found.end());
    std::vector<std::string> out;
    for (auto& f : found) out.push_back(std::move(f.second));
    return out;
  }

  // The pointer as the manager uses it: as read when sound, else rebuilt from the disk.
  std::optional<std::string> read_pointer_text() const {
    auto fd = open_file_if_exists<io_type>(pointer_path(), O_RDONLY);
    if (!fd) return std::nullopt;
    std::string text = read_all(fd);
    fd.close();
    return text;
  }

  // Parses and checks the pointer text into v (p, file, parsed, status, problem).
  void judge(view& v, const std::optional<std::string>& text) const {
    if (!text) return;  // missing
    try {
      v.file = detail::parse_checkpoint_pointer(*text, pointer_path(), options.step_prefix);
      v.p = v.file;
      v.parsed = true;
    } catch (const format_error& e) {
      v.status = pointer_state::garbled;
      v.problem = e.what();
      return;
    }
    if (complete(v.p.latest)) {
      v.status = pointer_state::ok;
      return;
    }
    v.status = pointer_state::dangling;
    v.problem = "it names '" + v.p.latest + "', which is " +
                (mode == directory_commit::marker && dir_exists(v.p.latest)
                     ? "not committed (no commit marker)"
                     : "missing");
  }

  // The pointer as the manager uses it: as read when sound, else rebuilt from the disk.
  view read_view(bool report) const {
    const std::string path = pointer_path();
    view v;
    // A reader slower than the writer can read a pointer whose latest was superseded and
    // deleted a moment later (or none, just before a first save's pointer): only a pointer
    // that reads the same twice is judged dangling or missing.
    for (int attempt = 0;; ++attempt) {
      v = view{};
      std::optional<std::string> text = read_pointer_text();
      judge(v, text);
      if (v.status == pointer_state::ok || v.status == pointer_state::garbled || attempt >= 3)
        break;
      if (read_pointer_text() == text) break;
    }
    if (v.status == pointer_state::ok) return v;
    std::vector<std::string> found = scan_complete();
    if (v.status == pointer_state::missing && found.empty()) return v;  // a fresh run
    if (v.status == pointer_state::missing) v.problem = "there is no pointer file";
    detail::checkpoint_pointer r;
    for (auto& name : found)  // a deletion the pointer lists is not brought back
      if (!v.parsed || std::find(v.p.remove.begin(), v.p.remove.end(), name) == v.p.remove.end())
        r.keep.push_back(std::move(name));
    if (v.parsed) r.remove = v.p.remove;
    if (!r.keep.empty()) r.latest = r.keep.back();
    v.p = std::move(r);
    v.recovered = true;
    if (report) {
      std::string line = "checkpoint pointer '" + path + "': " + v.problem + "; ";
      if (v.p.latest.empty())
        line += "no complete checkpoint on disk: starting fresh";
      else
        line += "using the newest complete checkpoint on disk, '" + v.p.latest + "' (step " +
                std::to_string(step_of(v.p.latest)) + ")";
      line += read_only ? "; the writer's next save rewrites the pointer"
                        : "; the next save rewrites the pointer";
      log_once(line);
    }
    return v;
  }

  bool dir_exists(const std::string& name) const {
    struct stat st {};
    return detail::store_lstat<io_type>(path_of(name), st) && S_ISDIR(st.st_mode);
  }

  checkpoint_info info_of(const std::string& name) const {
    return checkpoint_info{step_of(name), name, path_of(name)};
  }

  std::optional<checkpoint_info> latest() const {
    view v = read_view(true);
    if (v.p.latest.empty()) return std::nullopt;
    return info_of(v.p.latest);
  }

  std::vector<checkpoint_info> complete_list() const {
    view v = read_view(true);
    std::vector<checkpoint_info> out;
    for (const auto& k : v.p.keep)
      if (v.recovered || complete(k)) out.push_back(info_of(k));
    return out;
  }

  std::vector<std::int64_t> all_steps() const {
    std::vector<std::int64_t> steps;
    for (const auto& c : complete_list()) steps.push_back(c.step);
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
  }

  // The complete retained checkpoint of `step` listed last, if any.
  std::optional<checkpoint_info> find_step(std::int64_t step) const {
    auto list = complete_list();
    for (auto c = list.rbegin(); c != list.rend(); ++c)
      if (c->step == step) return *c;
    return std::nullopt;
  }

  // --- reading under LOCK_SH ---------------------------------------------------------------------

  // Runs `use(info)` while holding LOCK_SH on the checkpoint `resolve()` names (re-resolving
  // when it is being deleted or replaced); false when resolve() names none.
  template <class Resolve, class Use>
  bool read_locked(Resolve resolve, Use use) const {
    for (int attempt = 0;; ++attempt) {
      if (attempt > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(attempt < 5 ? 100 : 2000));
      if (attempt >= 200)
        throw error(EAGAIN, "checkpoint restore", dir,
                    "the checkpoint was deleted or replaced under the reader 200 times");
      std::optional<checkpoint_info> c = resolve();
      if (!c) return false;
      auto fd = open_file_if_exists<io_type>(c->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      if (!fd) continue;  // deleted since the pointer was read
      if (locks_trusted(fd.get())) {
        int r;
        while ((r = io_type::flock(fd.get(), LOCK_SH | LOCK_NB)) != 0 && errno == EINTR) {
        }
        if (r != 0) {
          if (errno == EWOULDBLOCK) continue;  // being deleted
          throw error(errno, "flock", c->path);
        }
      }
      // Still the checkpoint under its name (not renamed aside, not replaced), still committed.
      struct stat held {};
      struct stat named {};
      if (io_type::fstat(fd.get(), &held) != 0) throw error(errno, "fstat", c->path);
      if (!detail::store_lstat<io_type>(c->path, named) || named.st_ino != held.st_ino ||
          named.st_dev != held.st_dev)
        continue;
      if (mode == directory_commit::marker && !publisher_type::is_committed(c->path)) continue;
      use(*c);
      return true;  // fd closes: the lock is released
    }
  }

  std::optional<std::int64_t> read_latest(const reader_type& reader) const {
    std::optional<std::int64_t> step;
    bool found = read_locked([&] { return latest(); },
                             [&](const checkpoint_info& c) {
                               if (reader) reader(c.path, c.step);
                               step = c.step;
                             });
    if (!found) return std::nullopt;
    return step;
  }

  void read_step(std::int64_t step, const reader_type& reader) const {
    bool found = read_locked([&] { return find_step(step); },
                             [&](const checkpoint_info& c) {
                               if (reader) reader(c.path, c.step);
                             });
    if (!found)
      throw error(ENOENT, "checkpoint restore", dir,
                  "no complete retained checkpoint of step " + std::to_string(step));
  }

  // flock is a real lock for this file's filesystem (or the options force it).
  bool locks_trusted(int fd) const noexcept {
    switch (options.lock) {
      case checkpoint_lock::flock:
        return true;
      case checkpoint_lock::lease:
        return false;
      case checkpoint_lock::automatic:
        break;
    }
    return is_flock_trusted_filesystem(detail::filesystem_type<io_type>(fd));
  }

  // --- metadata ----------------------------------------------------------------------------------

  std::optional<checkpoint_metadata> load_metadata(const std::string& name) const {
    std::string path = detail::store_join(path_of(name), metadata_file_name);
    auto fd = open_file_if_exists<io_type>(path, O_RDONLY | O_NOFOLLOW);
    if (!fd) return std::nullopt;
    std::string text = read_all(fd);
    fd.close();
    return detail::parse_checkpoint_metadata(text, path);
  }

  void write_metadata(const std::string& work, std::int64_t step,
                      std::chrono::system_clock::time_point time,
                      const checkpoint_metrics* metrics) const {
    std::string path = detail::store_join(work, metadata_file_name);
    int fd =
        io_type::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (errno == EEXIST)
        throw error(EEXIST, "checkpoint save", path,
                    "the writer created holdfast's metadata file; give its file another name");
      throw error(errno, "open", path);
    }
    basic_fd<io_type> f(fd, path);
    std::string text = detail::format_checkpoint_metadata(step, time, metrics);
    write_all(f, text.data(), text.size());
    f.close();  // synced with the rest of the checkpoint
  }

  // --- saving ------------------------------------------------------------------------------------

  struct job {
    std::int64_t step = -1;
    std::string name, target, work;  // work: the staging dir (rename) or the target (marker)
    std::function<void()> deferred;
    detail::checkpoint_pointer old;
    bool repairs = false;  // the old pointer was bad: this save rewrites it
    std::chrono::system_clock::time_point time;
    std::optional<detail::json_value> metrics;
  };

  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer& writer, const checkpoint_metrics* metrics) {
    if (read_only)
      throw error(EROFS, "checkpoint save", dir,
                  "opened read_only: only the writer's manager saves");
    if (step < 0)
      throw error(EINVAL, "checkpoint save", dir, "negative step " + std::to_string(step));
    finish_and_rethrow();
    check_lease();
    job j;
    j.step = step;
    j.time = now();
    if (metrics) j.metrics = detail::json_value(*metrics);
    view v = read_view(true);
    j.repairs = v.recovered;  // garbled, dangling, or missing with checkpoints on disk
    j.old = std::move(v.p);
    j.name = fresh_name(step, j.old);
    j.target = path_of(j.name);
    j.work =
        mode == directory_commit::rename ? path_of(scratch_name(".staging-", j.name)) : j.target;
    if (io_type::mkdir(j.work.c_str(), 0755) != 0) throw error(errno, "mkdir", j.work);
    try {
      j.deferred = detail::checkpoint_call_writer(writer, j.work, step);
      if (options.write_metadata) write_metadata(j.work, step, j.time, metrics);
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
    check_lease();  // a writer that lost its lease leaves the new checkpoint unnamed

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
    apply_retention(next, j);
    write_pointer(next);  // before the deletions: a valid latest whatever happens next
    if (j.repairs)
      log("checkpoint pointer '" + pointer_path() + "' rewritten by the save of '" + j.name + "'");
    if (!next.remove.empty()) {
      std::vector<std::string> left;
      for (const auto& r : next.remove)
        if (!remove_checkpoint(r)) left.push_back(r);
      if (left != next.remove) {
        next.remove = std::move(left);
        write_pointer(next);  // after the deletions
      }
    }
  }

  void write_pointer(const detail::checkpoint_pointer& p) const {
    publisher_type().publish(pointer_path(), detail::format_checkpoint_pointer(p), 0644);
  }

  // The retention policy in force.
  retention_policy policy() const {
    if (options.retention) return *options.retention;
    if (options.max_to_keep == 0) return retention_policy::keep_all();
    return retention_policy::keep_last(options.max_to_keep);
  }

  // Moves the kept checkpoints the policy drops to the removal list, except the latest and
  // those of the pinned step.
  void apply_retention(detail::checkpoint_pointer& p, const job& j) const {
    retention_policy rp = policy();
    std::vector<retention_candidate> cands;
    for (const auto& k : p.keep) {
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
    std::vector<std::string> kept;
    for (std::size_t i = 0; i < p.keep.size(); ++i) {
      bool k = (i < keep.size() && keep[i]) || p.keep[i] == j.name || cands[i].step == pin;
      if (k)
        kept.push_back(std::move(p.keep[i]));
      else
        p.remove.push_back(std::move(p.keep[i]));
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

  // Takes a checkpoint away: LOCK_EX|LOCK_NB on it first (false, and nothing done, when a
  // reader holds it), then renamed aside (or its marker removed) whole, then the rest removed.
  bool remove_checkpoint(const std::string& name) const {
    std::string path = path_of(name);
    basic_fd<io_type> fd;
    for (;;) {
      int f = io_type::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
      if (f >= 0) {
        fd = basic_fd<io_type>(f, path);
        break;
      }
      if (errno == EINTR) continue;
      if (errno == ENOENT) return true;
      if (errno != ENOTDIR && errno != ELOOP) throw error(errno, "open", path);
      detail::store_remove_tree<io_type>(path);  // not a directory: nobody reads it
      return true;
    }
    if (locks_trusted(fd.get())) {
      int r;
      while ((r = io_type::flock(fd.get(), LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
      }
      if (r != 0) {
        if (errno == EWOULDBLOCK) return false;
        throw error(errno, "flock", path);
      }
    }
    if (mode == directory_commit::marker) {
      publisher_type().remove_committed_directory(path);
      return true;
    }
    std::string aside = path_of(scratch_name(".deleting-", name));
    if (io_type::rename(path.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) return true;
      throw error(errno, "rename", path);
    }
    detail::store_sync_dir<durability_type, io_type>(dir);
    detail::store_remove_tree<io_type>(aside);
    return true;
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

  // --- the start-up sweep, verify and repair -----------------------------------------------------

  bool old_enough(const std::string& path) const {
    if (options.sweep_older_than.count() <= 0) return true;
    struct stat st {};
    if (!detail::store_lstat<io_type>(path, st)) return false;
    using namespace std::chrono;
    auto ns = [](const timespec& ts) { return seconds(ts.tv_sec) + nanoseconds(ts.tv_nsec); };
    auto t = duration_cast<nanoseconds>(system_clock::now().time_since_epoch());
    return t - std::max(ns(st.st_mtim), ns(st.st_ctim)) >= options.sweep_older_than;
  }

  static bool is_scratch(std::string_view name) {
    return detail::store_starts_with(name, ".staging-") ||
           detail::store_starts_with(name, ".deleting-");
  }

  // Under the writer lock: cleans up after saves and deletions that were killed.
  void sweep() {
    sweep_stale_temps<io_type>(dir, options.sweep_older_than);
    view v = read_view(true);
    bool removed_any = false;
    std::vector<std::string> left;  // listed deletions a reader still holds
    for (const auto& name : detail::store_list_dir<io_type>(dir)) {
      std::string path = path_of(name);
      if (is_scratch(name)) {
        if (old_enough(path)) {
          detail::store_remove_tree<io_type>(path);
          removed_any = true;
        }
        continue;
      }
      if (!parse(name)) continue;  // not ours
      if (std::find(v.p.keep.begin(), v.p.keep.end(), name) != v.p.keep.end()) continue;
      bool listed = std::find(v.p.remove.begin(), v.p.remove.end(), name) != v.p.remove.end();
      bool incomplete = !complete(name);
      // A complete checkpoint nobody names: only a sound pointer proves it was never published.
      if (!listed && !incomplete && v.status != pointer_state::ok) continue;
      if (!old_enough(path)) continue;
      if (remove_checkpoint(name))
        removed_any = true;
      else if (listed)
        left.push_back(name);
    }
    if (removed_any) detail::store_sync_dir<durability_type, io_type>(dir);
    if (v.status == pointer_state::ok && left != v.p.remove) {
      v.p.remove = std::move(left);
      write_pointer(v.p);
    }
  }

  checkpoint_report verify() const {
    checkpoint_report r;
    view v = read_view(false);
    r.pointer = v.status;
    r.problem = v.problem;
    for (const auto& c : complete_list_of(v)) r.checkpoints.push_back(c);
    const detail::checkpoint_pointer& named = v.file;  // empty unless well-formed
    for (const auto& k : named.keep)
      if (!complete(k)) r.missing.push_back(k);
    for (const auto& name : detail::store_list_dir<io_type>(dir)) {
      if (is_scratch(name) || is_temp_name(name)) {
        r.leftovers.push_back(name);
        continue;
      }
      if (!parse(name)) continue;
      bool kept = std::find(named.keep.begin(), named.keep.end(), name) != named.keep.end();
      bool listed = std::find(named.remove.begin(), named.remove.end(), name) != named.remove.end();
      if (kept) continue;
      if (listed || !complete(name))
        r.leftovers.push_back(name);
      else if (v.parsed)
        r.unnamed.push_back(name);
    }
    return r;
  }

  std::vector<checkpoint_info> complete_list_of(const view& v) const {
    std::vector<checkpoint_info> out;
    for (const auto& k : v.p.keep)
      if (v.recovered || complete(k)) out.push_back(info_of(k));
    return out;
  }

  checkpoint_report repair() {
    if (read_only)
      throw error(EROFS, "checkpoint repair", dir, "opened read_only: only the writer repairs");
    finish_and_rethrow();
    check_lease();
    sweep();
    view v = read_view(false);
    std::vector<std::string> missing;
    if (!v.recovered)
      for (const auto& k : v.p.keep)
        if (!complete(k)) missing.push_back(k);
    if (v.status != pointer_state::ok || !missing.empty()) {
      if (v.p.latest.empty()) {
        if (io_type::unlink(pointer_path().c_str()) != 0 && errno != ENOENT)
          throw error(errno, "unlink", pointer_path());
        log("checkpoint pointer '" + pointer_path() +
            "' removed by repair(): no complete checkpoint on disk");
      } else {
        detail::checkpoint_pointer p;
        for (const auto& k : v.p.keep)
          if (v.recovered || complete(k)) p.keep.push_back(k);
        p.latest = p.keep.back();
        p.remove = v.p.remove;
        write_pointer(p);
        log("checkpoint pointer '" + pointer_path() + "' rewritten by repair(): latest '" +
            p.latest + "', " + std::to_string(p.keep.size()) + " kept");
      }
      std::lock_guard<std::mutex> l(mutex);
      last_logged.clear();
    }
    return verify();
  }

  // --- the writer lock ---------------------------------------------------------------------------

  std::string flock_path() const { return detail::store_join(dir, ".writer.lock"); }
  std::string lease_path() const { return detail::store_join(dir, ".writer.lease"); }

  template <class Try>
  void wait_for_lock(const std::string& path, Try attempt) {
    using namespace std::chrono;
    const auto deadline = steady_clock::now() + options.writer_lock_timeout;
    auto pause = milliseconds(1);
    for (;;) {
      if (attempt()) return;
      if (steady_clock::now() >= deadline) {
        auto holder = read_holder(path);
        throw checkpoint_locked(
            path, holder.first, holder.second,
            "waited " + std::to_string(options.writer_lock_timeout.count()) +
                " ms; one process writes a checkpoint directory at a time (open readers with "
                "holdfast::read_only)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, milliseconds(100));
    }
  }

  std::pair<long, std::string> read_holder(const std::string& path) const {
    try {
      auto fd = open_file_if_exists<io_type>(path, O_RDONLY | O_NOFOLLOW);
      if (!fd) return {0, std::string()};
      return detail::checkpoint_parse_holder(read_all(fd));
    } catch (const error&) {
      return {0, std::string()};
    }
  }

  void acquire_flock() {
    const std::string path = flock_path();
    lock_fd = open_file<io_type>(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0644);
    wait_for_lock(path, [&] {
      int r;
      while ((r = io_type::flock(lock_fd.get(), LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
      }
      if (r == 0) return true;
      if (errno != EWOULDBLOCK) throw error(errno, "flock", path);
      return false;
    });
    std::string text = detail::checkpoint_holder_text(io_type::getpid(), host, std::string());
    if (io_type::ftruncate(lock_fd.get(), 0) != 0) throw error(errno, "ftruncate", path);
    pwrite_all(lock_fd, text.data(), text.size(), 0);
  }

  // The lease: a file linked into place whole (link is atomic on NFS too), holding pid, host
  // and a nonce; its mtime is the heartbeat. A stale one is renamed aside and checked to be the
  // one judged stale before it is removed.
  void acquire_lease() {
    const std::string path = lease_path();
    lease_text = detail::checkpoint_holder_text(io_type::getpid(), host, detail::temp_suffix(7));
    auto fd = detail::create_temp<io_type>(dir, "writer.lease");
    detail::unlink_guard<io_type> temp(fd.path());
    write_all(fd, lease_text.data(), lease_text.size());
    wait_for_lock(path, [&] {
      if (io_type::link(temp.path().c_str(), path.c_str()) == 0) return true;
      if (errno != EEXIST) throw error(errno, "link", path, "taking the writer lease");
      struct stat st {};
      if (!detail::store_lstat<io_type>(path, st)) return false;  // released: try again
      auto holder = read_holder(path);
      std::string why = stale_reason(holder, st);
      if (!why.empty()) take_over(path, st, holder, why);
      return false;
    });
    lease_ino = stat_fd(fd).st_ino;
    lock_fd = std::move(fd);
    lease_held = true;
    heartbeat = std::thread([this] { beat(); });
  }

  std::string stale_reason(const std::pair<long, std::string>& holder,
                           const struct stat& st) const {
    if (holder.first > 0 && holder.second == host && holder.first != io_type::getpid() &&
        ::kill(static_cast<pid_t>(holder.first), 0) != 0 && errno == ESRCH)
      return "its process is gone";
    using namespace std::chrono;
    auto mtime = seconds(st.st_mtim.tv_sec) + nanoseconds(st.st_mtim.tv_nsec);
    auto age = duration_cast<nanoseconds>(system_clock::now().time_since_epoch()) - mtime;
    if (age >= options.lease_stale_after)
      return "no heartbeat for " + std::to_string(duration_cast<milliseconds>(age).count()) + " ms";
    return std::string();
  }

  void take_over(const std::string& path, const struct stat& judged,
                 const std::pair<long, std::string>& holder, const std::string& why) {
    std::string aside = detail::temp_path_for<io_type>(dir, "writer.lease.stale", 3);
    if (io_type::rename(path.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) return;  // another writer took it first
      throw error(errno, "rename", path, "taking over a stale writer lease");
    }
    struct stat moved {};
    bool same = detail::store_lstat<io_type>(aside, moved) && moved.st_ino == judged.st_ino &&
                moved.st_dev == judged.st_dev;
    if (!same) io_type::link(aside.c_str(), path.c_str());  // a fresh lease: put it back
    io_type::unlink(aside.c_str());
    if (same)
      log("checkpoint writer lease '" + path + "' of pid " + std::to_string(holder.first) +
          " on host '" + holder.second + "' taken over: " + why);
  }

  // The lease heartbeat: rewrites the lease (its mtime) 6 times per lease_stale_after, and
  // notices when another writer took it over.
  void beat() {
    using namespace std::chrono;
    auto interval =
        std::max(duration_cast<milliseconds>(options.lease_stale_after) / 6, milliseconds(5));
    std::unique_lock<std::mutex> l(beat_mutex);
    while (!beat_stop) {
      beat_cv.wait_for(l, interval, [&] { return beat_stop; });
      if (beat_stop) return;
      try {
        pwrite_all(lock_fd, lease_text.data(), lease_text.size(), 0);
        datasync_file(lock_fd);  // a network filesystem sets the mtime when the write reaches it
      } catch (const error& e) {
        log(std::string("checkpoint writer lease heartbeat failed: ") + e.what());
      }
      if (!owns_lease()) {
        lease_lost.store(true);
        auto holder = read_holder(lease_path());
        log("checkpoint writer lease '" + lease_path() + "' lost to pid " +
            std::to_string(holder.first) + " on host '" + holder.second +
            "': this manager's saves fail from now on");
        return;
      }
    }
  }

  bool owns_lease() const {
    struct stat st {};
    try {
      return detail::store_lstat<io_type>(lease_path(), st) && st.st_ino == lease_ino;
    } catch (const error&) {
      return true;  // cannot tell: the next beat looks again
    }
  }

  // Throws checkpoint_locked when the lease was taken over by another writer.
  void check_lease() {
    if (!lease_held) return;
    if (!lease_lost.load() && owns_lease()) return;
    lease_lost.store(true);
    auto holder = read_holder(lease_path());
    throw checkpoint_locked(lease_path(), holder.first, holder.second,
                            "this manager's lease was taken over (paused longer than "
                            "lease_stale_after?); it no longer writes");
  }

  void release_writer_lock() noexcept {
    if (heartbeat.joinable()) {
      {
        std::lock_guard<std::mutex> l(beat_mutex);
        beat_stop = true;
      }
      beat_cv.notify_all();
      heartbeat.join();
    }
    if (lease_held && owns_lease()) io_type::unlink(lease_path().c_str());
    lock_fd.reset();  // flock: closing releases it; the file stays (removing it would race)
  }

  // --- state
  // ---------------------------------------------------------------------------------------

  std::string dir;
  directory_commit mode;
  checkpoint_options options;
  bool read_only;
  bool use_flock = true;
  writer_fn default_writer;    // set_writer's
  reader_type default_reader;  // set_reader's
  std::atomic<std::int64_t> pinned{no_pin};

  // should_save's memory (caller's thread only)
  std::optional<std::int64_t> last_step, prev_last_step;
  std::optional<std::chrono::system_clock::time_point> last_save_time;

  // the save in flight
  std::thread inflight;
  std::exception_ptr failure;  // guarded by mutex
  std::int64_t failed_step = -1;

  // the writer lock
  std::string host;
  basic_fd<io_type> lock_fd;
  bool lease_held = false;
  ino_t lease_ino = 0;
  std::string lease_text;
  std::atomic<bool> lease_lost{false};
  std::thread heartbeat;
  std::mutex beat_mutex;
  std::condition_variable beat_cv;
  bool beat_stop = false;

  mutable std::mutex mutex;  // options.log, last_logged, failure
  mutable std::string last_logged;
};

HOLDFAST_NAMESPACE_END
