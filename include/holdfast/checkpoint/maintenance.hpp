// holdfast/checkpoint/maintenance.hpp — what changes a checkpoint directory besides writing a
// checkpoint: publishing the pointer, deleting a checkpoint no reader holds, the start-up sweep
// after crashed saves, verify() and repair().
//
// Guarantees:
//   - A deletion takes LOCK_EX|LOCK_NB on the checkpoint first (where flock is trusted) and
//     does nothing when a reader holds it; then the checkpoint is renamed aside (or its marker
//     removed, in marker mode) whole before the rest is removed, so it is never seen half gone.
//   - The start-up sweep runs under the writer lock, which proves no other writer is alive: it
//     removes staging and half-deleted directories, publish temps, incomplete (marker-less)
//     checkpoints, deletions the pointer lists, and complete checkpoints a sound pointer does
//     not name (a save killed between publishing the checkpoint and the pointer). Only what is
//     at least sweep_older_than old is removed.
//   - verify() logs nothing and changes nothing; it reports the kept directories that do not
//     count as checkpoints (listing.hpp) as skipped, and ok() is false while there are any.
//     repair() sweeps, finishes listed deletions and rewrites the pointer from what verify()
//     reports as used (or removes it when there is no complete checkpoint), deletes the skipped
//     ones (those a reader holds stay listed for deletion), then reports again.
// Caveats:
//   - A complete checkpoint a bad pointer does not name is kept (only a sound pointer proves it
//     was never published); repair() names it.
//   - A listed deletion a reader still holds stays listed, for the next save or sweep.
#pragma once

#include <fcntl.h>     // O_RDONLY, O_DIRECTORY, O_NOFOLLOW: a checkpoint about to be deleted
#include <sys/file.h>  // LOCK_EX, LOCK_NB
#include <sys/stat.h>  // struct stat: ages of swept directories

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "../io.hpp"        // basic_fd
#include "../publish.hpp"   // sweep_stale_temps, is_temp_name; the publisher of the pointer
#include "../store.hpp"     // detail::store_list_dir, store_remove_tree, store_sync_dir
#include "listing.hpp"      // skipped_checkpoint: what does not count as a checkpoint
#include "names.hpp"        // checkpoint_info
#include "pointer.hpp"      // pointer_state, detail::checkpoint_directory: the effective pointer
#include "writer_lock.hpp"  // detail::checkpoint_locks_trusted

HOLDFAST_NAMESPACE_BEGIN

/// What verify() found in a checkpoint directory.
struct checkpoint_report {
  pointer_state pointer = pointer_state::missing;  ///< the pointer's state
  std::string problem;                             ///< why the pointer is not ok ("" when ok)
  std::vector<checkpoint_info> checkpoints;  ///< what the manager uses, oldest first (latest last)
  std::vector<std::string> missing;          ///< kept by the pointer but missing or incomplete
  std::vector<std::string> unnamed;    ///< complete on disk, not named by a well-formed pointer
  std::vector<std::string> leftovers;  ///< staging, half-deleted, incomplete, listed deletions
  /// Kept (or found by a recovery) and complete, but not counted as checkpoints (listing.hpp: no
  /// or damaged metadata, a recorded file missing or resized): never listed or restored.
  std::vector<skipped_checkpoint> skipped;
  /// True when the pointer is sound and every checkpoint it keeps is complete and counts.
  bool ok() const noexcept {
    return pointer == pointer_state::ok && missing.empty() && skipped.empty();
  }
};

namespace detail {

// A checkpoint directory's upkeep, on top of what every query sees (checkpoint_directory); the
// manager's reading side (manager/reading.hpp) builds on it. Everything but verify() is the
// writer's, under its writer lock.
template <class Io, class Durability>
class checkpoint_maintenance : public checkpoint_directory<Io, Durability> {
  using base = checkpoint_directory<Io, Durability>;

 public:
  using base::base;
  using base::complete;
  using base::counted_of;
  using base::dir;
  using base::info_of;
  using base::last_logged;
  using base::log;
  using base::mode;
  using base::mutex;
  using base::options;
  using base::parse;
  using base::path_of;
  using base::pointer_path;
  using base::read_view;
  using base::scratch_name;
  using typename base::durability_type;
  using typename base::io_type;
  using typename base::publisher_type;
  using typename base::view;

  void write_pointer(const detail::checkpoint_pointer& p) const {
    publisher_type().publish(pointer_path(), detail::format_checkpoint_pointer(p), 0644);
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
    if (checkpoint_locks_trusted<io_type>(options.lock, fd.get())) {
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
    for (auto& c : counted_of(v, false, &r.skipped)) r.checkpoints.push_back(std::move(c.info));
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

  // repair() without its checks: the caller is the writer, no save in flight, lease still held.
  // The pointer is rewritten to keep what counts; what does not count is deleted.
  checkpoint_report repair_unchecked() {
    sweep();
    view v = read_view(false);
    std::vector<std::string> missing;
    if (!v.recovered)
      for (const auto& k : v.p.keep)
        if (!complete(k)) missing.push_back(k);
    std::vector<skipped_checkpoint> skipped;
    const auto kept = counted_of(v, false, &skipped);
    if (v.status != pointer_state::ok || !missing.empty() || !skipped.empty()) {
      detail::checkpoint_pointer p;
      for (const auto& c : kept) p.keep.push_back(c.info.name);
      p.remove = v.p.remove;
      for (const auto& k : skipped) p.remove.push_back(k.name);
      std::string removed;
      if (!skipped.empty()) removed = ", " + std::to_string(skipped.size()) + " skipped removed";
      if (p.keep.empty()) {
        for (const auto& k : skipped) remove_checkpoint(k.name);
        if (io_type::unlink(pointer_path().c_str()) != 0 && errno != ENOENT)
          throw error(errno, "unlink", pointer_path());
        log("checkpoint pointer '" + pointer_path() +
            "' removed by repair(): no complete checkpoint on disk" + removed);
      } else {
        p.latest = p.keep.back();
        write_pointer(p);  // before the deletions: a valid latest whatever happens next
        if (!skipped.empty()) {
          std::vector<std::string> left;
          for (const auto& r : p.remove)
            if (!remove_checkpoint(r)) left.push_back(r);
          if (left != p.remove) {
            p.remove = std::move(left);
            write_pointer(p);
          }
        }
        log("checkpoint pointer '" + pointer_path() + "' rewritten by repair(): latest '" +
            p.latest + "', " + std::to_string(p.keep.size()) + " kept" + removed);
      }
      std::lock_guard<std::mutex> l(mutex);
      last_logged.clear();
    }
    return verify();
  }
};

}  // namespace detail

HOLDFAST_NAMESPACE_END
