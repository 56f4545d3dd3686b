// holdfast/checkpoint/manager/reading.hpp — what checkpoint_manager (manager.hpp) reads: the
// listings (all_steps, all_identities), restore() and restore_step() under LOCK_SH with their
// integrity checks, verify_step(), and the hang bounds a checkpoint records.
//
// Guarantees:
//   - restore()/restore_step() hold LOCK_SH on the checkpoint while the reader runs
//     (reader_lock.hpp); deletions need LOCK_EX|LOCK_NB.
//   - Only checkpoints that count are listed, restored and counted by retention (listing.hpp):
//     holdfast's metadata of the step, and every file it records there with its recorded size
//     (one read and one lstat per file, no byte summed); an empty or hand-made directory, or one
//     whose metadata is damaged or whose recorded file is gone, is skipped with one log line
//     per process. all_steps() lists a step exactly when restore_step() of it finds a complete
//     retained checkpoint that counts; latest_step() never throws. all_identities() gives the
//     same checkpoints' identities (step and history, metadata.hpp), never throwing for a
//     damaged file (it is not listed).
//   - Integrity (integrity.hpp): restore() and restore_step() check the sizes and CRC32Cs the
//     metadata records under the same LOCK_SH before the reader runs: restore_step() of a
//     corrupt checkpoint throws checkpoint_corrupt naming it and its first bad file; restore()
//     logs the corrupt latest and loads the newest older step that is not corrupt, and throws
//     checkpoint_corrupt (the latest's) when none is. A checkpoint without recorded sums (older,
//     or checksums off) is unverified and restores. restore_step() of a step only a checkpoint
//     that does not count holds throws checkpoint_corrupt naming it and why, not ENOENT. Listing
//     (all_steps, all_identities, latest_step) sums nothing: it stats the recorded files
//     (above), so a missing or resized file takes its step out of the listings and out of
//     restore()'s choice; a flipped byte (same size) is found by restore()/restore_step() only.
//   - restored_hang_bounds() is the bounds the metadata of the checkpoint the last
//     restore()/restore_step() loaded records: none when that restore found no checkpoint,
//     threw, or the checkpoint records none (saved without them, by an older holdfast, or a
//     malformed or unreadable metadata file: the bounds never fail a restore).
//     newest_hang_bounds() reads the newest listed checkpoint's the same way, never throwing.
// Caveats:
//   - latest_step() is the largest retained step, latest() the checkpoint saved last: they
//     differ after an older step is saved again (a job restored at an older step re-saves it).
//   - A checkpoint corrupt only in its bytes (same sizes: listing does not read them) still
//     counts: it is listed, counts for should_save() and retention removes it in time; one that
//     does not count stays where it is until repair(), and checkpoints() still names it (every
//     complete retained directory). A read_only reader changes nothing.
//   - With checksums off, restores do not check recorded sums either; verify_step() always does.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../detail/hang_bounds.hpp"  // hang_bounds: what a checkpoint records
#include "../../error.hpp"               // checkpoint_corrupt
#include "../integrity.hpp"    // checkpoint_integrity, checkpoint_verify_files: restores' checks
#include "../maintenance.hpp"  // detail::checkpoint_maintenance: what this builds on
#include "../metadata.hpp"     // checkpoint_metadata, checkpoint_identity, the metadata file
#include "../names.hpp"        // checkpoint_info
#include "../reader_lock.hpp"  // detail::checkpoint_read_locked: restores under LOCK_SH

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// The reading side of a manager's state, on top of the directory's upkeep (maintenance.hpp);
// the save path (saving.hpp, through retaining.hpp) builds on it.
template <class Io, class Durability>
class checkpoint_reading : public checkpoint_maintenance<Io, Durability> {
  using base = checkpoint_maintenance<Io, Durability>;

 public:
  using base::counted_list;
  using base::dir;
  using base::find_step;
  using base::latest;
  using base::log;
  using base::mode;
  using base::options;
  using base::path_of;
  using typename base::counted;
  using typename base::io_type;
  using typename base::publisher_type;
  /// Loads a checkpoint directory (the manager's reader_type).
  using reader_type = std::function<void(const std::string& dir, std::int64_t step)>;

  using base::base;

  template <class Resolve, class Use>
  bool read_locked(Resolve resolve, Use use) const {
    return detail::checkpoint_read_locked<io_type, publisher_type>(dir, mode, options.lock, resolve,
                                                                   use);
  }

  // The latest checkpoint, or after a corrupt one (of step `below`) the newest older step.
  std::optional<std::int64_t> read_latest(const reader_type& reader) {
    restored_hang.reset();
    std::optional<std::int64_t> step, below;
    std::string path;
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
                                 path = c.path;
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
      log("checkpoint restore: step " + std::to_string(*step) + " read from '" + path + "'",
          log_level::info);
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
      r.file = std::string(detail::checkpoint_metadata_file_name);
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

  // The hang bounds the newest listed checkpoint records (newest_hang_bounds()).
  std::optional<hang_bounds> newest_hang_bounds() const noexcept {
    try {
      auto list = listed();
      return list.empty() ? std::nullopt : hang_bounds_at(list.back().path);
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

  reader_type default_reader;                // set_reader's
  std::optional<hang_bounds> restored_hang;  // what the last restore's checkpoint records
};

}  // namespace detail

HOLDFAST_NAMESPACE_END
