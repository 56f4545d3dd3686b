// holdfast/checkpoint/listing.hpp — which directories count as checkpoints. A complete directory
// under a checkpoint name is listed, restored and counted by retention only when it holds
// holdfast's metadata of its step and every file that metadata records, with its recorded size;
// any other one is skipped, and reported once per process.
//
// Guarantees:
//   - checkpoint_judge reads the directory's holdfast-metadata.json once (integrity.hpp's
//     checkpoint_read_record) and lstats each file it records (no byte is read): the directory
//     counts when the file is holdfast's metadata of that step (format, step, a history id or
//     none) and every recorded file is there, a regular file of its recorded size. Its identity
//     (step and history) comes from the same read. The CRC32C of every byte is checked by
//     restores only (integrity.hpp), as before.
//   - A directory without a metadata file counts only where holdfast itself saves them so, and
//     only when it holds a file: the well-formed pointer keeps it by name (a run of holdfast
//     0.1.0), or the manager saves without metadata (write_metadata off). An empty directory
//     never counts, nor a hand-made step-5/ that the pointer's recovery finds on disk.
//   - A directory that is gone by the time it is judged (a deletion racing a listing) is
//     neither counted nor reported.
//   - checkpoint_first_report is true once per process for each skipped directory and reason,
//     however many listings and managers see it: the one line checkpoint_skipped_line words.
// Caveats:
//   - What was reported lives in the one process-wide set of the checkpoint part (the paths
//     and reasons reported, kept until the process ends), so a later listing by another manager
//     of the same directory says nothing new.
//   - A listing judges every checkpoint it keeps (one small read, one lstat per recorded file);
//     the writer's retention judges each checkpoint once (manager/retaining.hpp).
#pragma once

#include <sys/stat.h>  // S_ISDIR: is the directory still there

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "../agreement/step_list.hpp"  // checkpoint_identity
#include "../store.hpp"                // detail::store_join, store_lstat, store_list_dir
#include "integrity.hpp"               // checkpoint_read_record, checkpoint_size_problem
#include "metadata.hpp"                // detail::checkpoint_metadata_file_name

HOLDFAST_NAMESPACE_BEGIN

/// A directory under a checkpoint name that does not count as a checkpoint, and why
/// (checkpoint_report::skipped).
struct skipped_checkpoint {
  std::string name;  ///< its directory name
  std::string why;   ///< why it does not count: no or damaged metadata, a recorded file missing
};

namespace detail {

// Whether a complete directory under a checkpoint name counts as a checkpoint.
struct checkpoint_judgement {
  bool counts = false;           // listed, restorable, counted by retention
  bool gone = false;             // vanished while judged: neither counted nor reported
  std::string why;               // skipped: the reason, in words
  checkpoint_identity identity;  // counts: its step and history ("" unknown)
};

// Judges the directory at `path` named for `step`; `bare_ok`: a directory without a metadata
// file counts (the pointer keeps it by name, or the manager saves without metadata).
template <class Io>
checkpoint_judgement checkpoint_judge(const std::string& path, std::int64_t step, bool bare_ok) {
  checkpoint_judgement j;
  j.identity = {step, {}};
  const std::string meta_name(checkpoint_metadata_file_name);
  const checkpoint_record rec = checkpoint_read_record<Io>(store_join(path, meta_name), step);
  if (!rec.present) {
    struct stat st {};
    if (!store_lstat<Io>(path, st) || !S_ISDIR(st.st_mode)) {
      j.gone = true;
      return j;
    }
    if (store_list_dir<Io>(path).empty()) {
      j.why = "it is empty (no " + meta_name + ", no file)";
      return j;
    }
    if (bare_ok) {
      j.counts = true;
      return j;
    }
    j.why = "it has no " + meta_name + " (not a checkpoint holdfast saved)";
    return j;
  }
  if (!rec.damage.empty()) {
    j.why = "its " + meta_name + " is damaged: " + rec.damage;
    return j;
  }
  if (rec.files)
    for (const auto& [rel, want] : *rec.files)
      if (auto bad = checkpoint_size_problem<Io>(path, rel, want)) {
        j.why = "its file '" + rel + "' does not match the metadata (" + to_string(bad->first) +
                ": " + bad->second + ")";
        return j;
      }
  j.counts = true;
  j.identity.history = rec.history;
  return j;
}

// True the first time this process asks for `path` and `why`.
inline bool checkpoint_first_report(const std::string& path, const std::string& why) {
  // Never destroyed: a background save may still list while the process exits.
  static std::mutex* const m = new std::mutex;
  static std::set<std::string>* const seen = new std::set<std::string>;
  std::lock_guard<std::mutex> l(*m);
  return seen->insert(path + '\n' + why).second;
}

// The line that reports the directory at `path` (named for `step`) as skipped for `why`.
inline std::string checkpoint_skipped_line(const std::string& path, std::int64_t step,
                                           const std::string& why) {
  return "checkpoint '" + path + "' (step " + std::to_string(step) + ") skipped: " + why +
         "; it is not listed, restored or counted by retention (remove it by hand, or repair() "
         "does)";
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
