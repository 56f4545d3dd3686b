// holdfast/checkpoint/manager/retaining.hpp — retention as checkpoint_manager (manager.hpp)
// applies it in each save: which kept checkpoints the retention policy (retention.hpp) drops
// from the pointer, the pin, and the deletions after the pointer is published (steps 2 to 4 of
// the save protocol, saving.hpp).
//
// Guarantees:
//   - Retention never deletes the latest (the checkpoint just saved) nor a checkpoint of the
//     pinned step.
//   - Retention's candidates are the checkpoints that count (listing.hpp): one that does not is
//     neither counted among the kept nor deleted (repair() deletes it); one that is gone (deleted
//     by hand, or uncommitted) leaves the pointer; a recovered pointer holds only those that
//     count. Each kept checkpoint is judged once per manager (those it saved or listed at open
//     are known to count), so a save judges nothing again; one that does not count is logged
//     once per process.
//   - A policy that needs metadata (time, metrics: retention_policy::needs_metadata) reads each
//     candidate's metadata file; a candidate without one has its directory's mtime as its time.
//   - The deletions run after the pointer naming the new latest is published: each checkpoint
//     is locked exclusively (flock LOCK_EX|LOCK_NB on its directory), then renamed aside (or its
//     marker removed) and removed (maintenance.hpp); one a reader holds is left, still listed as
//     "delete", for the next save; then the pointer is published again without the deletions
//     that were done.
// Caveats:
//   - The pin lives in the manager only, not in the pointer: a restarted process pins again.
#pragma once

#include <sys/stat.h>  // struct stat: mtimes of checkpoints without metadata

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../detail/json.hpp"  // json_value: a candidate's metrics
#include "../../store.hpp"        // detail::store_lstat
#include "../listing.hpp"         // checkpoint_judgement: does a kept checkpoint count
#include "../pointer.hpp"         // detail::checkpoint_pointer
#include "../retention.hpp"       // retention_policy, retention_candidate
#include "reading.hpp"            // detail::checkpoint_reading: what this builds on

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// A save's new checkpoint, as retention sees it (the save's job, saving.hpp, extends it).
struct checkpoint_added {
  std::string name;                            // the new checkpoint
  std::vector<std::string> named;              // what the pointer file keeps (when well-formed)
  std::chrono::system_clock::time_point time;  // when its save started
  std::optional<json_value> metrics;           // what it records
};

// Retention in a manager's state, on top of the reading side; the save path (saving.hpp)
// builds on it.
template <class Io, class Durability>
class checkpoint_retaining : public checkpoint_reading<Io, Durability> {
  using base = checkpoint_reading<Io, Durability>;

 public:
  using base::load_metadata;
  using base::options;
  using base::path_of;
  using base::remove_checkpoint;
  using base::step_of;
  using base::write_pointer;
  using typename base::io_type;

  static constexpr std::int64_t no_pin = std::numeric_limits<std::int64_t>::min();

  using base::base;

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
  retention_role role_in_retention(const std::string& k, const checkpoint_added& j) {
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
  void apply_retention(detail::checkpoint_pointer& p, const checkpoint_added& j) {
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

  // The deletions `next` lists, once it is published: a checkpoint a reader holds stays listed;
  // the pointer is published again when any was done.
  void delete_dropped(detail::checkpoint_pointer& next) {
    if (next.remove.empty()) return;
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

  std::atomic<std::int64_t> pinned{no_pin};

  // The kept checkpoints known to count (saved by this manager, or judged so): retention
  // judges each one once. Used by open_writer and commit only (one at a time).
  std::set<std::string> known;
};

}  // namespace detail

HOLDFAST_NAMESPACE_END
