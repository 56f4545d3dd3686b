// holdfast/checkpoint.hpp — checkpoints of a run as whole directories, with retention and an
// atomically replaced `latest` pointer (TF CheckpointManager's protocol on holdfast publishing).
// checkpoint_manager is the Checkpointer preemption_handler uses by default.
//
//   holdfast::checkpoint_options o;
//   o.max_to_keep = 3;
//   holdfast::checkpoint_manager<> ckpt(holdfast::store::create("/data/exp"), "run-7", o);
//   ckpt.set_writer([&](const std::string& dir) { model.save_to(dir); });
//   ckpt.set_reader([&](const std::string& dir) { model.load_from(dir); });
//   std::optional<std::int64_t> step = ckpt.restore();   // loads the latest, if any
//   ckpt.save(step_number);
//
// For a restore agreement (every worker restores the newest step all of them hold):
//   std::vector<std::int64_t> mine = ckpt.all_steps();   // publish these, agree on `common`
//   ckpt.restore_step(common);                           // load exactly that step
//   ckpt.pin(common);                                    // retention keeps it until unpinned
//
// Layout of <run>/checkpoint/:   latest                   the pointer (see below)
//                                step-<N>[.<G>]/          one checkpoint (G: a re-save of N)
//                                .staging-step-<N>-<pid>-<k>/   being written (rename mode)
//                                .deleting-step-<N>-<pid>-<k>/  being removed (rename mode)
// The pointer is text: "holdfast-checkpoints 1", then "latest <name>", then one "keep <name>"
// per retained checkpoint, oldest first, then "delete <name>" for deletions in progress.
//
// Protocol of save(step, writer):
//   1. rename mode: mkdir a staging directory, writer fills it, publish_directory syncs every
//      file and renames it to step-<N>; marker mode (mounted_remote): mkdir step-<N>, writer
//      fills it in place, commit_directory syncs it and writes commit_success.txt last;
//   2. the pointer is published atomically naming the new latest, the retained list, and the
//      checkpoints about to be deleted (the oldest beyond the newest max_to_keep, never the
//      latest, never one of the pinned step);
//   3. the deletions: each directory renamed aside (or its marker removed) first, then removed;
//   4. the pointer is published again without the deletions.
//
// Guarantees:
//   - latest() names a complete checkpoint whenever the process was killed: before step 2 the
//     previous pointer still names the previous checkpoint, which retention never deletes.
//   - A checkpoint counts once the pointer names it. At construction the manager sweeps staging
//     and half-deleted directories, publish temps, marker-less directories, finishes deletions
//     the pointer lists, and removes checkpoint directories the pointer does not name (a save
//     killed between steps 1 and 2).
//   - A pointer that is not in the format above, or names a checkpoint that is missing (or has
//     no commit marker in marker mode), is a holdfast::format_error / holdfast::error naming the
//     pointer file and the checkpoint; nothing is guessed.
//   - A writer that throws leaves no trace: the staging (or in-place) directory is removed and
//     the pointer is unchanged.
//   - all_steps() lists a step exactly when restore_step() of it finds a complete checkpoint
//     (named by a 'keep' line, a directory, and in marker mode committed); a kept checkpoint
//     missing on disk is left out, not an error. latest_step() never throws.
//   - Retention never deletes a checkpoint of the pinned step: a save keeps the newest
//     max_to_keep plus the pinned one (which does not count against the limit when older).
//     Saving the pinned step again still supersedes its previous generation.
// Caveats:
//   - One manager (one process) writes a given checkpoint directory at a time; with
//     checkpoint_options::sweep_older_than at 0, construction removes any staging directory.
//   - A checkpoint directory deleted by hand while the pointer names it makes latest(),
//     checkpoints() and restore() throw; all_steps() and latest_step() just leave it out.
//   - all_steps() and restore_step() still throw holdfast::format_error for a garbled pointer
//     (latest_step() then gives nothing), and holdfast::error for I/O errors other than a
//     missing checkpoint.
//   - The pin lives in the manager only, not in the pointer: a restarted process pins again.
//     While a step is pinned, up to max_to_keep + 1 checkpoints are kept.
//   - latest_step() is the largest retained step, latest() the checkpoint saved last: they
//     differ after an older step is saved again (a job restored at an older step re-saves it).
//   - A manager is not thread-safe: one thread at a time saves or restores through it.
#pragma once

#include <fcntl.h>     // O_RDONLY: reading the pointer
#include <sys/stat.h>  // struct stat: ages of swept directories

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "error.hpp"
#include "io.hpp"
#include "publish.hpp"
#include "store.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Options of checkpoint_manager.
struct checkpoint_options {
  /// How many checkpoints to keep (the newest, counting the latest); 0 keeps every one.
  std::size_t max_to_keep = 5;
  /// At construction, staging directories and publish temps at least this old are swept; 0
  /// sweeps all (one manager per directory).
  std::chrono::milliseconds sweep_older_than{0};
};

/// One checkpoint: its step, its directory name and its full path.
struct checkpoint_info {
  std::int64_t step = -1;  ///< the training step it holds
  std::string name;        ///< "step-<N>" or "step-<N>.<G>"
  std::string path;        ///< <checkpoint dir>/<name>
};

namespace detail {
// "step-<N>" or "step-<N>.<G>" (N, G decimal without sign or leading zeros) -> N.
inline std::optional<std::int64_t> checkpoint_step_of(std::string_view name) {
  static constexpr std::string_view prefix = "step-";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  auto number = [](std::string_view digits) -> std::optional<std::int64_t> {
    if (digits.empty() || digits.size() > 18 || (digits.size() > 1 && digits[0] == '0'))
      return std::nullopt;
    std::int64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  auto dot = name.find('.');
  auto step = number(name.substr(0, dot));
  if (!step) return std::nullopt;
  if (dot != std::string_view::npos && !number(name.substr(dot + 1))) return std::nullopt;
  return step;
}

// The pointer file's content.
struct checkpoint_pointer {
  std::string latest;
  std::vector<std::string> keep;    // oldest first; contains latest
  std::vector<std::string> remove;  // deletions in progress
};

inline std::string format_checkpoint_pointer(const checkpoint_pointer& p) {
  std::string s = "holdfast-checkpoints 1\nlatest " + p.latest + "\n";
  for (const auto& k : p.keep) s += "keep " + k + "\n";
  for (const auto& d : p.remove) s += "delete " + d + "\n";
  return s;
}

inline checkpoint_pointer parse_checkpoint_pointer(std::string_view text, const std::string& path) {
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
        fail("expected 'holdfast-checkpoints 1', found '" + store_printable(line.substr(0, 64)) +
             "'");
      header = true;
      continue;
    }
    auto space = line.find(' ');
    std::string_view key = line.substr(0, space);
    std::string_view value =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    if (!checkpoint_step_of(value))
      fail("expected a checkpoint name 'step-<N>', found '" + store_printable(value.substr(0, 64)) +
           "'");
    if (key == "latest") {
      if (!p.latest.empty()) fail("a second 'latest'");
      if (!p.keep.empty()) fail("'latest' after 'keep'");
      p.latest = std::string(value);
    } else if (key == "keep") {
      if (!p.remove.empty()) fail("'keep' after 'delete'");
      p.keep.emplace_back(value);
    } else if (key == "delete") {
      p.remove.emplace_back(value);
    } else {
      fail("unknown key '" + store_printable(key.substr(0, 64)) + "'");
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
}  // namespace detail

/// Checkpoints of one run: save, retention, latest, restore. Store: a basic_store (its
/// Filesystem policy gives the Io, the Durability and the commit mode).
template <class Store = store>
class checkpoint_manager {
 public:
  using store_type = Store;                                          ///< the store
  using io_type = typename Store::io_type;                           ///< its syscall policy
  using durability_type = typename Store::durability_type;           ///< its publishing durability
  using publisher_type = basic_publisher<durability_type, io_type>;  ///< publishes dirs and pointer
  /// Fills a checkpoint directory; may also take the step as a second argument.
  using writer_type = std::function<void(const std::string& dir, std::int64_t step)>;
  /// Loads a checkpoint directory; may also take the step as a second argument.
  using reader_type = std::function<void(const std::string& dir, std::int64_t step)>;

  /// Manages <store>/runs/<run_id>/checkpoint: creates it, then sweeps what crashed saves left.
  checkpoint_manager(const Store& s, std::string_view run_id, checkpoint_options options = {})
      : checkpoint_manager(s.checkpoint_path(run_id), s.commit_mode(), options) {}

  /// Manages the checkpoint directory `dir` directly, committing by `mode`.
  checkpoint_manager(std::string dir, directory_commit mode, checkpoint_options options = {})
      : dir_(std::move(dir)), mode_(mode), options_(options) {
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    auto created = detail::store_make_dirs<io_type>(dir_);
    if (!created.empty())
      detail::store_sync_dir<durability_type, io_type>(detail::store_parent(created[0]));
    for (std::size_t i = 0; i + 1 < created.size(); ++i)
      detail::store_sync_dir<durability_type, io_type>(created[i]);
    sweep();
  }

  /// The checkpoint directory.
  const std::string& directory() const noexcept { return dir_; }
  /// The pointer file: <directory>/latest.
  std::string pointer_path() const { return detail::store_join(dir_, "latest"); }
  /// How checkpoints are committed (rename, or a marker on mounts).
  directory_commit commit_mode() const noexcept { return mode_; }
  /// The options given at construction.
  const checkpoint_options& options() const noexcept { return options_; }

  /// Sets the writer save(step) uses.
  template <class Writer>
  void set_writer(Writer writer) {
    writer_ = [w = std::move(writer)](const std::string& d, std::int64_t s) mutable {
      detail::checkpoint_call(w, d, s);
    };
  }
  /// Sets the reader restore() uses.
  template <class Reader>
  void set_reader(Reader reader) {
    reader_ = [r = std::move(reader)](const std::string& d, std::int64_t s) mutable {
      detail::checkpoint_call(r, d, s);
    };
  }

  /// Saves a checkpoint of `step` with the writer given to set_writer (the Checkpointer call
  /// preemption_handler makes). Throws holdfast::error (EINVAL) when no writer was set.
  checkpoint_info save(std::int64_t step) {
    if (!writer_)
      throw error(EINVAL, "checkpoint save", dir_,
                  "no writer: call set_writer() first, or save(step, writer)");
    return save(step, writer_);
  }

  /// Saves a checkpoint of `step`: `writer(dir[, step])` fills a fresh directory, which is
  /// committed whole, then the pointer names it and retention runs. Returns the checkpoint.
  template <class Writer>
  checkpoint_info save(std::int64_t step, Writer&& writer) {
    if (step < 0)
      throw error(EINVAL, "checkpoint save", dir_, "negative step " + std::to_string(step));
    std::optional<detail::checkpoint_pointer> old = read_pointer();
    std::string name = fresh_name(step, old);
    std::string target = detail::store_join(dir_, name);
    struct stat st {};
    if (detail::store_lstat<io_type>(target, st)) remove_checkpoint(name);  // unnamed leftover
    if (mode_ == directory_commit::rename)
      write_by_rename(target, name, step, writer);
    else
      write_in_place(target, step, writer);

    detail::checkpoint_pointer next;
    next.latest = name;
    if (old) {
      next.remove = old->remove;  // deletions a failed save left: retried below
      for (const auto& k : old->keep) {
        if (detail::checkpoint_step_of(k) == step)
          next.remove.push_back(k);  // superseded by this save
        else
          next.keep.push_back(k);
      }
    }
    next.keep.push_back(name);
    apply_retention(next);
    write_pointer(next);  // before the deletions: a valid latest whatever happens next
    if (!next.remove.empty()) {
      for (const auto& r : next.remove) remove_checkpoint(r);
      next.remove.clear();
      write_pointer(next);  // after the deletions
    }
    return checkpoint_info{step, name, target};
  }

  /// The newest checkpoint the pointer names, or nothing before the first save. Throws
  /// holdfast::format_error for a malformed pointer, holdfast::error (ENOENT) when it names a
  /// checkpoint that is missing or, in marker mode, not committed.
  std::optional<checkpoint_info> latest() const {
    auto p = read_pointer();
    if (!p) return std::nullopt;
    return info_checked(p->latest);
  }

  /// Every retained checkpoint, oldest first (the latest last); each is checked as by latest().
  std::vector<checkpoint_info> checkpoints() const {
    std::vector<checkpoint_info> out;
    auto p = read_pointer();
    if (!p) return out;
    for (const auto& k : p->keep) out.push_back(info_checked(k));
    return out;
  }

  /// Loads the latest checkpoint with the reader given to set_reader (when one is set) and
  /// returns its step, or nothing when there is no checkpoint yet (the Checkpointer call
  /// preemption_handler makes at construction).
  std::optional<std::int64_t> restore() {
    auto l = latest();
    if (!l) return std::nullopt;
    if (reader_) reader_(l->path, l->step);
    return l->step;
  }

  /// Loads the latest checkpoint with `reader(dir[, step])` and returns its step, or nothing.
  template <class Reader>
  std::optional<std::int64_t> restore(Reader&& reader) {
    auto l = latest();
    if (!l) return std::nullopt;
    detail::checkpoint_call(reader, l->path, l->step);
    return l->step;
  }

  /// Steps of every complete retained checkpoint, ascending, each once (missing ones left out).
  std::vector<std::int64_t> all_steps() const {
    std::vector<std::int64_t> steps;
    auto p = read_pointer();
    if (!p) return steps;
    for (const auto& k : p->keep)
      if (complete(k)) steps.push_back(*detail::checkpoint_step_of(k));
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
  }

  /// The newest step of all_steps(), or nothing when there is none or the pointer is unreadable.
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
    auto c = checkpoint_at(step);
    if (reader_) reader_(c.path, c.step);
  }

  /// Loads the checkpoint of exactly `step` with `reader(dir[, step])`; ENOENT as above.
  template <class Reader>
  void restore_step(std::int64_t step, Reader&& reader) {
    auto c = checkpoint_at(step);
    detail::checkpoint_call(reader, c.path, c.step);
  }

  /// Pins `step` (nullopt unpins): retention never deletes a checkpoint of the pinned step.
  void pin(std::optional<std::int64_t> step) noexcept { pinned_ = step; }
  /// The pinned step, if any.
  std::optional<std::int64_t> pinned() const noexcept { return pinned_; }

 private:
  static constexpr std::string_view staging_prefix = ".staging-";
  static constexpr std::string_view deleting_prefix = ".deleting-";

  std::string scratch_name(std::string_view kind, const std::string& name) const {
    return std::string(kind) + name + "-" + std::to_string(io_type::getpid()) + "-" +
           std::to_string(detail::store_next_serial());
  }

  std::optional<detail::checkpoint_pointer> read_pointer() const {
    std::string path = pointer_path();
    auto fd = open_file_if_exists<io_type>(path, O_RDONLY);
    if (!fd) return std::nullopt;
    std::string text = read_all(fd);
    fd.close();
    return detail::parse_checkpoint_pointer(text, path);
  }

  void write_pointer(const detail::checkpoint_pointer& p) const {
    publisher_type().publish(pointer_path(), detail::format_checkpoint_pointer(p), 0644);
  }

  // Moves the kept checkpoints older than the newest max_to_keep to the removal list, except
  // those of the pinned step.
  void apply_retention(detail::checkpoint_pointer& p) const {
    std::size_t limit = options_.max_to_keep;
    if (limit == 0 || p.keep.size() <= limit) return;
    std::size_t older = p.keep.size() - limit;  // p.keep[0, older) are beyond the limit
    std::vector<std::string> kept;
    for (std::size_t i = 0; i < p.keep.size(); ++i) {
      if (i >= older || (pinned_ && detail::checkpoint_step_of(p.keep[i]) == *pinned_))
        kept.push_back(std::move(p.keep[i]));
      else
        p.remove.push_back(std::move(p.keep[i]));
    }
    p.keep = std::move(kept);
  }

  // True when the kept checkpoint `name` is a directory and, in marker mode, committed.
  bool complete(const std::string& name) const {
    std::string path = detail::store_join(dir_, name);
    struct stat st {};
    if (!detail::store_lstat<io_type>(path, st) || !S_ISDIR(st.st_mode)) return false;
    return mode_ != directory_commit::marker || publisher_type::is_committed(path);
  }

  // The complete retained checkpoint of `step` listed last, or ENOENT.
  checkpoint_info checkpoint_at(std::int64_t step) const {
    auto p = read_pointer();
    if (p)
      for (auto k = p->keep.rbegin(); k != p->keep.rend(); ++k)
        if (detail::checkpoint_step_of(*k) == step && complete(*k))
          return checkpoint_info{step, *k, detail::store_join(dir_, *k)};
    throw error(ENOENT, "checkpoint restore", dir_,
                "no complete retained checkpoint of step " + std::to_string(step));
  }

  checkpoint_info info_checked(const std::string& name) const {
    std::string path = detail::store_join(dir_, name);
    struct stat st {};
    if (!detail::store_lstat<io_type>(path, st) || !S_ISDIR(st.st_mode))
      throw error(ENOENT, "checkpoint", path,
                  "named by the pointer '" + pointer_path() + "' but missing");
    if (mode_ == directory_commit::marker && !publisher_type::is_committed(path))
      throw error(ENOENT, "checkpoint", path,
                  "named by the pointer '" + pointer_path() + "' but has no commit marker");
    return checkpoint_info{*detail::checkpoint_step_of(name), name, path};
  }

  // "step-N", or "step-N.G" with the first G not in use when the pointer already keeps step-N.
  std::string fresh_name(std::int64_t step,
                         const std::optional<detail::checkpoint_pointer>& p) const {
    std::string base = "step-" + std::to_string(step);
    auto used = [&](const std::string& n) {
      return p && (std::find(p->keep.begin(), p->keep.end(), n) != p->keep.end() ||
                   std::find(p->remove.begin(), p->remove.end(), n) != p->remove.end());
    };
    if (!used(base)) return base;
    for (unsigned g = 1;; ++g) {
      std::string n = base + "." + std::to_string(g);
      if (!used(n)) return n;
    }
  }

  template <class Writer>
  void write_by_rename(const std::string& target, const std::string& name, std::int64_t step,
                       Writer& writer) {
    std::string staging = detail::store_join(dir_, scratch_name(staging_prefix, name));
    if (io_type::mkdir(staging.c_str(), 0755) != 0) throw error(errno, "mkdir", staging);
    try {
      detail::checkpoint_call(writer, staging, step);
      if (!publisher_type().publish_directory(staging, target))
        throw error(EEXIST, "checkpoint save", target, "created concurrently");
    } catch (...) {
      try {
        detail::store_remove_tree<io_type>(staging);
      } catch (...) {  // the first error is the one reported; the sweep removes the rest
      }
      throw;
    }
  }

  template <class Writer>
  void write_in_place(const std::string& target, std::int64_t step, Writer& writer) {
    if (io_type::mkdir(target.c_str(), 0755) != 0) throw error(errno, "mkdir", target);
    try {
      detail::checkpoint_call(writer, target, step);
      publisher_type().commit_directory(target);
    } catch (...) {
      try {
        detail::store_remove_tree<io_type>(target);
      } catch (...) {  // the first error is the one reported; the sweep removes the rest
      }
      throw;
    }
  }

  // Takes a checkpoint away whole first (rename aside, or its marker), then removes the rest.
  void remove_checkpoint(const std::string& name) const {
    std::string path = detail::store_join(dir_, name);
    if (mode_ == directory_commit::marker) {
      publisher_type().remove_committed_directory(path);
      return;
    }
    std::string aside = detail::store_join(dir_, scratch_name(deleting_prefix, name));
    if (io_type::rename(path.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) return;
      throw error(errno, "rename", path);
    }
    detail::store_sync_dir<durability_type, io_type>(dir_);
    detail::store_remove_tree<io_type>(aside);
  }

  bool old_enough(const std::string& path) const {
    if (options_.sweep_older_than.count() <= 0) return true;
    struct stat st {};
    if (!detail::store_lstat<io_type>(path, st)) return false;
    using namespace std::chrono;
    auto ns = [](const timespec& ts) { return seconds(ts.tv_sec) + nanoseconds(ts.tv_nsec); };
    auto now = duration_cast<nanoseconds>(system_clock::now().time_since_epoch());
    return now - std::max(ns(st.st_mtim), ns(st.st_ctim)) >= options_.sweep_older_than;
  }

  // Start-up: clean up after saves and deletions that were killed.
  void sweep() {
    sweep_stale_temps<io_type>(dir_, options_.sweep_older_than);
    auto pointer = read_pointer();
    bool removed_any = false;
    for (const auto& name : detail::store_list_dir<io_type>(dir_)) {
      std::string path = detail::store_join(dir_, name);
      bool scratch = detail::store_starts_with(name, staging_prefix) ||
                     detail::store_starts_with(name, deleting_prefix);
      if (scratch) {
        if (old_enough(path)) {
          detail::store_remove_tree<io_type>(path);
          removed_any = true;
        }
        continue;
      }
      if (!detail::checkpoint_step_of(name)) continue;  // not ours
      bool kept = pointer && std::find(pointer->keep.begin(), pointer->keep.end(), name) !=
                                 pointer->keep.end();
      if (kept) continue;
      bool incomplete = mode_ == directory_commit::marker && !publisher_type::is_committed(path);
      if ((pointer || incomplete) && old_enough(path)) {
        remove_checkpoint(name);
        removed_any = true;
      }
    }
    if (removed_any) detail::store_sync_dir<durability_type, io_type>(dir_);
    if (pointer && !pointer->remove.empty()) {
      pointer->remove.clear();  // the loop above removed them: none is kept
      write_pointer(*pointer);
    }
  }

  std::string dir_;
  directory_commit mode_;
  checkpoint_options options_;
  writer_type writer_;
  reader_type reader_;
  std::optional<std::int64_t> pinned_;
};

HOLDFAST_NAMESPACE_END
