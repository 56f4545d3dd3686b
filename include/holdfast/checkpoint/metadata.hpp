// holdfast/checkpoint/metadata.hpp — holdfast-metadata.json, the small file in each checkpoint
// that records its step, its history (checkpoint_identity), the time its save started, the
// user's metrics and the hang detector's learned bounds.
//
// Guarantees:
//   - The file holds {"format": "holdfast-checkpoint-metadata 1", "step", "history" (the
//     history id the checkpoint was saved in; absent when unknown), "time_unix_ns" (Unix
//     nanoseconds), "metrics" (a JSON object, or null), "hang_bounds" ({"step_ns", "save_ns",
//     "restore_ns", "steps"}, integers; absent when the saver had none), "files" (each regular
//     file's path relative to the checkpoint -> {"size", "crc32c"}, integers; integrity.hpp;
//     absent with checksums off and in older checkpoints)}; it is written in the checkpoint
//     before the checkpoint is committed, and synced with the rest of it. Readers that predate
//     "history", "hang_bounds" or "files" ignore them (the format stays version 1).
//   - A "hang_bounds" that is not an object of those four non-negative integers (one missing,
//     a string, a fraction, a negative or out-of-range number) reads as absent; the rest of the
//     file still reads.
//   - Reading metadata never throws for the file's content: a missing, unreadable or foreign
//     file, or one whose history is not a history id, reads as no metadata
//     (parse_checkpoint_metadata returns nothing).
//   - Reading an identity (checkpoint_load_identity, which the restore agreement uses) is
//     stricter: a missing file or one without "history" is an unknown history (a checkpoint of
//     holdfast 0.1.0, or saved with write_metadata off), and a file that is not holdfast's
//     metadata, names another step, or holds a bad history throws format_error naming it, so a
//     damaged file never passes for an unknown history.
//   - A checkpoint without it (holdfast 0.1.0) reads as having no metrics; retention then uses
//     its directory's mtime as its time.
// Caveats:
//   - A writer may not create holdfast-metadata.json at the top of its checkpoint (the save
//     fails with EEXIST).
#pragma once

#include <fcntl.h>  // O_CREAT, O_EXCL, O_NOFOLLOW: the metadata file is created, never reused

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "../agreement/step_list.hpp"  // checkpoint_identity: the step and its history
#include "../detail/hang_bounds.hpp"   // hang_bounds: the learned bounds a checkpoint records
#include "../detail/json.hpp"          // the metadata file's format
#include "../error.hpp"
#include "../io.hpp"     // basic_fd, open_file_if_exists, read_all, write_all
#include "../store.hpp"  // detail::store_join

HOLDFAST_NAMESPACE_BEGIN

/// One user metric or several, saved with a checkpoint: a JSON object ({{"loss", 0.25}}).
using checkpoint_metrics = detail::json_value::object_t;

/// What a checkpoint's holdfast-metadata.json holds.
struct checkpoint_metadata {
  std::int64_t step = -1;                      ///< the step
  std::string history;                         ///< the history it was saved in; empty: unknown
  std::chrono::system_clock::time_point time;  ///< when its save started
  detail::json_value metrics;                  ///< the user metrics (an object, or null)
  std::optional<hang_bounds> hang;             ///< the hang detector's bounds; none: absent
  /// The metric `key` as a number, when present.
  std::optional<double> metric(std::string_view key) const {
    const detail::json_value* v = metrics.find(key);
    if (!v || !v->is_number()) return std::nullopt;
    return v->as_double();
  }
  /// The checkpoint's identity: its step and history.
  checkpoint_identity identity() const { return {step, history}; }
};

namespace detail {

// The metadata file in each checkpoint (checkpoint_manager<>::metadata_file_name).
inline constexpr std::string_view checkpoint_metadata_file_name = "holdfast-metadata.json";

inline std::int64_t checkpoint_to_unix_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

inline std::chrono::system_clock::time_point checkpoint_from_unix_ns(std::int64_t ns) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

// {"step_ns", "save_ns", "restore_ns", "steps"}.
inline json_value checkpoint_hang_bounds_json(const hang_bounds& b) {
  json_value o(json_value::object_t{});
  o.set("step_ns", static_cast<std::int64_t>(b.step.count()));
  o.set("save_ns", static_cast<std::int64_t>(b.save.count()));
  o.set("restore_ns", static_cast<std::int64_t>(b.restore.count()));
  o.set("steps", b.steps);
  return o;
}

// The bounds `v` holds; nothing unless it is an object of the four non-negative integers.
inline std::optional<hang_bounds> checkpoint_hang_bounds_of(const json_value& v) {
  if (!v.is_object()) return std::nullopt;
  std::int64_t ns[3] = {};
  const char* const names[3] = {"step_ns", "save_ns", "restore_ns"};
  try {
    for (int i = 0; i < 3; ++i) {
      const json_value* f = v.find(names[i]);
      if (!f || !f->is_integer()) return std::nullopt;
      ns[i] = f->as_int64();  // ERANGE: outside int64
      if (ns[i] < 0) return std::nullopt;
    }
    const json_value* steps = v.find("steps");
    if (!steps || !steps->is_integer()) return std::nullopt;
    hang_bounds b;
    b.step = std::chrono::nanoseconds(ns[0]);
    b.save = std::chrono::nanoseconds(ns[1]);
    b.restore = std::chrono::nanoseconds(ns[2]);
    b.steps = steps->as_uint64();  // ERANGE: negative or above uint64
    return b;
  } catch (const error&) {
    return std::nullopt;
  }
}

// The metadata document; the manager adds "files" (integrity.hpp) once the writer ran.
inline json_value checkpoint_metadata_json(std::int64_t step,
                                           std::chrono::system_clock::time_point time,
                                           const checkpoint_metrics* metrics,
                                           const std::string& history = {},
                                           const hang_bounds* hang = nullptr) {
  json_value doc(json_value::object_t{});
  doc.set("format", "holdfast-checkpoint-metadata 1");
  doc.set("step", step);
  if (!history.empty()) doc.set("history", history);
  doc.set("time_unix_ns", checkpoint_to_unix_ns(time));
  doc.set("metrics", metrics ? json_value(*metrics) : json_value());
  if (hang) doc.set("hang_bounds", checkpoint_hang_bounds_json(*hang));
  return doc;
}

inline std::string format_checkpoint_metadata(std::int64_t step,
                                              std::chrono::system_clock::time_point time,
                                              const checkpoint_metrics* metrics,
                                              const std::string& history = {},
                                              const hang_bounds* hang = nullptr) {
  return to_json(checkpoint_metadata_json(step, time, metrics, history, hang), 2);
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
    if (const json_value* h = doc.find("history")) {
      if (!h->is_string() || !checkpoint_history_ok(h->as_string())) return std::nullopt;
      m.history = h->as_string();
    }
    if (const json_value* metrics = doc.find("metrics"); metrics && metrics->is_object())
      m.metrics = *metrics;
    if (const json_value* h = doc.find("hang_bounds")) m.hang = checkpoint_hang_bounds_of(*h);
    return m;
  } catch (const error&) {
    return std::nullopt;
  }
}

// The metadata of the checkpoint at `checkpoint_path`; nothing when it has no (readable) file.
template <class Io>
std::optional<checkpoint_metadata> checkpoint_load_metadata(const std::string& checkpoint_path) {
  std::string path = detail::store_join(checkpoint_path, checkpoint_metadata_file_name);
  auto fd = open_file_if_exists<Io>(path, O_RDONLY | O_NOFOLLOW);
  if (!fd) return std::nullopt;
  std::string text = read_all(fd);
  fd.close();
  return detail::parse_checkpoint_metadata(text, path);
}

// The identity of the checkpoint of `step` at `checkpoint_path`: an unknown history when it has
// no metadata file or the file records none; format_error naming the file when the file is not
// holdfast's metadata, names another step, or holds a bad history.
template <class Io>
checkpoint_identity checkpoint_load_identity(const std::string& checkpoint_path,
                                             std::int64_t step) {
  std::string path = detail::store_join(checkpoint_path, checkpoint_metadata_file_name);
  auto fd = open_file_if_exists<Io>(path, O_RDONLY | O_NOFOLLOW);
  if (!fd) return {step, {}};
  std::string text = read_all(fd);
  fd.close();
  json_value doc;
  try {
    doc = parse_json(text, path);
  } catch (const error& e) {
    throw format_error(path, std::string("not holdfast's checkpoint metadata: ") + e.what());
  }
  const json_value* format = doc.find("format");
  const json_value* s = doc.find("step");
  if (!format || !format->is_string() || format->as_string() != "holdfast-checkpoint-metadata 1")
    throw format_error(path, "not holdfast's checkpoint metadata (no known \"format\")");
  if (!s || !s->is_integer() || s->as_int64() != step)
    throw format_error(path, "its \"step\" is not the checkpoint's step " + std::to_string(step));
  const json_value* h = doc.find("history");
  if (!h) return {step, {}};
  if (!h->is_string()) throw format_error(path, "its \"history\" is not a string");
  return read_checkpoint_identity(std::to_string(step) + "@" + h->as_string(), path);
}

// Creates the metadata file in `work` (a checkpoint being written) holding `text`, unsynced.
template <class Io>
void checkpoint_write_metadata_text(const std::string& work, const std::string& text) {
  std::string path = detail::store_join(work, checkpoint_metadata_file_name);
  int fd = Io::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST)
      throw error(EEXIST, "checkpoint save", path,
                  "the writer created holdfast's metadata file; give its file another name");
    throw error(errno, "open", path);
  }
  basic_fd<Io> f(fd, path);
  write_all(f, text.data(), text.size());
  f.close();  // synced with the rest of the checkpoint
}

// Creates the metadata file in `work` (a checkpoint being written), unsynced.
template <class Io>
void checkpoint_write_metadata(const std::string& work, std::int64_t step,
                               std::chrono::system_clock::time_point time,
                               const checkpoint_metrics* metrics, const std::string& history = {},
                               const hang_bounds* hang = nullptr) {
  checkpoint_write_metadata_text<Io>(
      work, detail::format_checkpoint_metadata(step, time, metrics, history, hang));
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
