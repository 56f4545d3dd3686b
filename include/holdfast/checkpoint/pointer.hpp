// holdfast/checkpoint/pointer.hpp — the `latest` pointer of a checkpoint directory: its text
// format, and the effective pointer every query uses (as read when sound, else recovered from
// the complete checkpoints on disk).
//
// Layout of <run>/checkpoint/:   latest                   the pointer
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
// Guarantees:
//   - parse_checkpoint_pointer accepts exactly that format (every line ends in a newline, the
//     latest is among the kept, nothing is both kept and deleted) and throws format_error
//     naming the line otherwise. Pointers written by holdfast 0.1.0 are read unchanged.
//   - Recovery instead of crash loops: a pointer that is garbled or truncated, or that names a
//     checkpoint that is missing (or uncommitted in marker mode), or that is missing while
//     complete checkpoints are on disk, is reported once through the log hook, and every query
//     falls back to the complete checkpoints on disk that count as checkpoints (complete =
//     renamed into place in rename mode, committed marker in marker mode; never a partial one;
//     counting: listing.hpp), the newest (largest step, then generation) as the latest. Nothing
//     here throws for a bad pointer; the next save (or repair()) rewrites it.
//   - A pointer is judged dangling or missing only when it reads the same twice: a reader slower
//     than the writer does not mistake a pointer superseded a moment ago for a broken one.
//   - The listings (counted_list, find_step, latest) name a checkpoint exactly when it is
//     complete, retained and counts as a checkpoint (listing.hpp: holdfast's metadata and every
//     file it records), so restore_step() of a listed step finds it; one that does not count is
//     logged once per process and left where it is. latest() is the pointer's latest when it
//     counts, else the newest checkpoint that does. complete_list and find_retained name the
//     complete retained ones, counting or not (what is on disk, for verify and diagnostics).
// Caveats:
//   - Recovery orders by step: after a garbled pointer the latest is the largest step even if
//     an older step was saved again last, and checkpoints a garbled pointer listed for deletion
//     count as kept until the next save's retention.
//   - A pointer naming checkpoints of another step_prefix reads as garbled.
#pragma once

#include <fcntl.h>     // O_RDONLY: the pointer file
#include <sys/stat.h>  // struct stat: is a checkpoint a directory

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"    // format_error: a garbled pointer
#include "../io.hpp"       // open_file_if_exists, read_all
#include "../log.hpp"      // log_fn: where a recovery is reported
#include "../publish.hpp"  // basic_publisher::is_committed: marker mode's completeness
#include "../store.hpp"    // directory_commit, detail::store_join, store_lstat, store_list_dir
#include "listing.hpp"     // checkpoint_judge: which directories count as checkpoints
#include "names.hpp"       // checkpoint_info, detail::checkpoint_parse_name
#include "options.hpp"     // checkpoint_options: the prefix and the log hook

HOLDFAST_NAMESPACE_BEGIN

/// The state of the `latest` pointer.
enum class pointer_state {
  ok,       ///< well-formed, and its latest is complete
  missing,  ///< no pointer file
  garbled,  ///< not in the pointer format (or truncated, or names of another prefix)
  dangling  ///< well-formed, but its latest is missing or uncommitted
};

namespace detail {

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
        fail("expected 'holdfast-checkpoints 1', found '" + std::string(line.substr(0, 64)) + "'");
      header = true;
      continue;
    }
    auto space = line.find(' ');
    std::string_view key = line.substr(0, space);
    std::string_view value =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    if (key != "latest" && key != "keep" && key != "delete")
      fail("unknown key '" + std::string(key.substr(0, 64)) + "'");
    if (!checkpoint_step_of(value, prefix))
      fail("expected a checkpoint name '" + std::string(prefix) + "<N>', found '" +
           std::string(value.substr(0, 64)) + "'");
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

// A checkpoint directory as every query sees it: its paths and names, the log hook, and the
// effective pointer (as read when sound, else recovered from the disk). The manager's parts
// (manager/*.hpp) build on it; `mutex` guards options.log and last_logged for the derived
// classes' other state too.
template <class Io, class Durability>
class checkpoint_directory {
 public:
  using io_type = Io;
  using durability_type = Durability;
  using publisher_type = basic_publisher<durability_type, io_type>;

  checkpoint_directory(std::string d, directory_commit m, checkpoint_options o, bool ro)
      : dir(std::move(d)), mode(m), options(std::move(o)), read_only(ro) {
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    detail::checkpoint_check_prefix(options.step_prefix);
  }
  checkpoint_directory(const checkpoint_directory&) = delete;
  checkpoint_directory& operator=(const checkpoint_directory&) = delete;

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

  void log(const std::string& line, log_level level = log_level::warning) const {
    log_fn sink;
    {
      std::lock_guard<std::mutex> l(mutex);
      sink = options.log;
    }
    detail::log_line(sink, line, level);
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
    bool parsed = false;                      // the pointer file is well-formed (p as read)
    bool recovered = false;                   // p was built from the complete checkpoints on disk
    std::vector<skipped_checkpoint> skipped;  // recovered: complete on disk, not counting
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
    for (auto& name : found) {  // a deletion the pointer lists is not brought back
      if (v.parsed && std::find(v.p.remove.begin(), v.p.remove.end(), name) != v.p.remove.end())
        continue;
      checkpoint_judgement j = assess(name, bare_ok(v, name), report);
      if (j.counts)
        r.keep.push_back(std::move(name));
      else if (!j.gone)
        v.skipped.push_back({std::move(name), std::move(j.why)});
    }
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

  // --- what counts as a checkpoint (listing.hpp) -----------------------------------------------

  // A kept checkpoint that counts, with its identity (from the same read of its metadata).
  struct counted {
    checkpoint_info info;
    checkpoint_identity identity;
  };

  // Whether a directory `name` without a metadata file counts: the pointer file `v` was read
  // from keeps it by name (holdfast 0.1.0 wrote none), or this manager writes none.
  bool bare_ok(const view& v, const std::string& name) const {
    return !options.write_metadata || (v.parsed && std::find(v.file.keep.begin(), v.file.keep.end(),
                                                             name) != v.file.keep.end());
  }

  // Judges the checkpoint `name`; one skipped is logged once per process (when `report`).
  checkpoint_judgement assess(const std::string& name, bool bare, bool report) const {
    const std::string path = path_of(name);
    checkpoint_judgement j = checkpoint_judge<io_type>(path, step_of(name), bare);
    if (!j.counts && !j.gone && !complete(name)) j.gone = true;  // deleted or uncommitted since
    if (report && !j.counts && !j.gone && checkpoint_first_report(path, j.why))
      log(checkpoint_skipped_line(path, step_of(name), j.why));
    return j;
  }

  // The complete checkpoints `v` keeps that count, oldest first (the latest last); those that
  // do not are added to `skipped` (when given) and, when `report`, logged once per process.
  std::vector<counted> counted_of(const view& v, bool report,
                                  std::vector<skipped_checkpoint>* skipped = nullptr) const {
    std::vector<counted> out;
    if (skipped) skipped->insert(skipped->end(), v.skipped.begin(), v.skipped.end());
    for (const auto& k : v.p.keep) {
      if (!v.recovered && !complete(k)) continue;
      checkpoint_judgement j = assess(k, bare_ok(v, k), report);
      if (j.counts)
        out.push_back({info_of(k), std::move(j.identity)});
      else if (!j.gone && skipped)
        skipped->push_back({k, std::move(j.why)});
    }
    return out;
  }

  // The latest checkpoint: the pointer's when it counts, else the newest one that counts
  // (largest step; of one step, the one kept last). One gone since the pointer was read (a
  // slow reader, the writer's retention) is still named: readers resolve again (reader_lock).
  std::optional<checkpoint_info> latest() const {
    view v = read_view(true);
    if (v.p.latest.empty()) return std::nullopt;
    checkpoint_judgement j = assess(v.p.latest, bare_ok(v, v.p.latest), true);
    if (j.counts || j.gone) return info_of(v.p.latest);
    std::optional<checkpoint_info> best;
    for (auto& c : counted_of(v, true))
      if (!best || c.info.step >= best->step) best = std::move(c.info);
    return best;
  }

  // The complete retained checkpoints that count, oldest first (the latest last).
  std::vector<counted> counted_list() const { return counted_of(read_view(true), true); }

  // The complete retained checkpoints, counting or not, oldest first (the latest last).
  std::vector<checkpoint_info> complete_list() const {
    view v = read_view(true);
    std::vector<checkpoint_info> out;
    for (const auto& k : v.p.keep)
      if (v.recovered || complete(k)) out.push_back(info_of(k));
    return out;
  }

  // The complete retained checkpoint of `step` that counts, listed last, if any.
  std::optional<checkpoint_info> find_step(std::int64_t step) const {
    auto list = counted_list();
    for (auto c = list.rbegin(); c != list.rend(); ++c)
      if (c->info.step == step) return c->info;
    return std::nullopt;
  }

  // The complete retained checkpoint of `step` listed last, counting or not, if any.
  std::optional<checkpoint_info> find_retained(std::int64_t step) const {
    auto list = complete_list();
    for (auto c = list.rbegin(); c != list.rend(); ++c)
      if (c->step == step) return *c;
    return std::nullopt;
  }

  std::string dir;
  directory_commit mode;
  checkpoint_options options;
  bool read_only;
  mutable std::mutex mutex;  // options.log, last_logged (and the derived classes' failure)
  mutable std::string last_logged;
};

}  // namespace detail

HOLDFAST_NAMESPACE_END
