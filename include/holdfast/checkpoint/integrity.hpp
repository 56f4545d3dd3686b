// holdfast/checkpoint/integrity.hpp — a checkpoint's files checked against what its save
// recorded: the size and CRC32C of every regular file, in holdfast-metadata.json's "files".
//
// Guarantees:
//   - checkpoint_sum_files walks a checkpoint (never following a symlink) and gives every
//     regular file but the top-level holdfast-metadata.json, as a '/'-separated path relative
//     to the checkpoint with its size and CRC32C (detail/crc32c.hpp), in a fixed order (names
//     sorted in each directory, depth first). It reads each file once, through one 1 MiB
//     buffer reused for every file (never a whole file in memory), through the Io policy. Asked
//     to (a save about to sync), it starts each file's writeback as it opens it
//     (Io::start_writeback where the policy has it: a hint whose failure changes nothing).
//   - checkpoint_verify_files checks the recorded files in that order and reports the first one
//     missing (or no longer a regular file), of another size, or of another CRC32C. Files the
//     save did not record (commit_success.txt, a file added later) are not checked. The record
//     may be another copy's of the same checkpoint (a durable copy's, for its local copy).
//   - A checkpoint whose metadata records no "files" (saved before holdfast recorded them, or
//     with checksums or write_metadata off) is unverified, never corrupt. A metadata file that
//     is present but not holdfast's (not JSON, another format, another step, a history that is
//     not a history id, a malformed "files", a path leaving the checkpoint) is corrupt, with the
//     reason bad_metadata.
//   - checkpoint_read_record reads the metadata once for every check of it (the sums here, the
//     listing rule of listing.hpp); checkpoint_size_problem is the lstat-only check of one
//     recorded file (missing, no longer a regular file, another size) that listings make: it
//     never reads a file's bytes, so a flipped byte passes it.
//   - Only a mismatch is reported as corruption: a failing system call (EIO) throws
//     holdfast::error as everywhere else.
// Caveats:
//   - A CRC detects accidental corruption (a flipped bit, a torn or truncated copy), not
//     tampering.
//   - JSON holds UTF-8 only: a file whose path is not valid UTF-8 is not recorded, so not
//     checked.
//   - The metadata file carries no checksum of its own: damage that leaves it well-formed (a
//     digit of a metric) is not detected.
#pragma once

#include <fcntl.h>     // O_RDONLY, O_NOFOLLOW: files are read, never through a symlink
#include <sys/stat.h>  // struct stat: regular files, directories, sizes

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/crc32c.hpp"  // crc32c_extend: streamed over each file
#include "../detail/json.hpp"    // the "files" member of the metadata
#include "../error.hpp"
#include "../io.hpp"     // open_file, open_file_if_exists, read_full, read_all
#include "../store.hpp"  // detail::store_join, store_list_dir, store_lstat
#include "metadata.hpp"  // detail::checkpoint_metadata_file_name

HOLDFAST_NAMESPACE_BEGIN

/// What checking a checkpoint's files against its metadata found.
enum class integrity_status {
  ok,             ///< every recorded file has its recorded size and CRC32C
  unverified,     ///< nothing recorded to check against (an older checkpoint, checksums off)
  missing,        ///< a recorded file is gone (or is no longer a regular file)
  size_mismatch,  ///< a recorded file has another size (truncated, extended)
  crc_mismatch,   ///< a recorded file has its size but another CRC32C (a flipped byte)
  bad_metadata    ///< holdfast-metadata.json is present but damaged
};

/// The name of an integrity_status ("ok", "unverified", "missing", "size mismatch", "crc32c
/// mismatch", "bad metadata").
inline const char* to_string(integrity_status s) noexcept {
  switch (s) {
    case integrity_status::ok:
      return "ok";
    case integrity_status::unverified:
      return "unverified";
    case integrity_status::missing:
      return "missing";
    case integrity_status::size_mismatch:
      return "size mismatch";
    case integrity_status::crc_mismatch:
      return "crc32c mismatch";
    case integrity_status::bad_metadata:
      return "bad metadata";
  }
  return "?";
}

/// The result of checking one checkpoint (checkpoint_manager::verify_step).
struct checkpoint_integrity {
  integrity_status status = integrity_status::ok;  ///< what was found
  std::int64_t step = -1;                          ///< the checkpoint's step
  std::string path;                                ///< the checkpoint's directory
  std::string file;    ///< the first bad file, relative to the checkpoint ("" when not corrupt)
  std::string detail;  ///< why, in words: the sizes or CRC32Cs recorded and found
  /// True when a recorded file (or the metadata) does not match: never for ok or unverified.
  bool corrupt() const noexcept {
    return status != integrity_status::ok && status != integrity_status::unverified;
  }
};

namespace detail {

// One file's record.
struct checkpoint_file_sum {
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};
using checkpoint_file_sums = std::vector<std::pair<std::string, checkpoint_file_sum>>;

// Bytes read at a time when summing a file.
inline constexpr std::size_t checkpoint_sum_buffer = std::size_t{1} << 20;

// The size and CRC32C of the file at `path`, read once through `buf`. With `writeback`, the
// file's dirty pages start going to the disk first (Io::start_writeback, where the policy has
// it): the sync after the sum then waits for less, as the disk writes while the CPU sums.
template <class Io>
checkpoint_file_sum checkpoint_sum_file(const std::string& path, std::vector<unsigned char>& buf,
                                        bool writeback = false) {
  if (buf.size() < checkpoint_sum_buffer) buf.resize(checkpoint_sum_buffer);
  auto fd = open_file<Io>(path, O_RDONLY | O_NOFOLLOW);
  if constexpr (detect<io_start_writeback, Io>::value)
    if (writeback) Io::start_writeback(fd.get());  // a hint: its failure changes nothing
  checkpoint_file_sum s;
  for (;;) {
    std::size_t n = read_full(fd, buf.data(), buf.size());
    s.crc32c = crc32c_extend(s.crc32c, buf.data(), n);
    s.size += n;
    if (n < buf.size()) break;
  }
  fd.close();
  return s;
}

// True when `name` survives a JSON round trip (valid UTF-8).
inline bool checkpoint_json_name(const std::string& name) {
  for (char c : name)
    if (static_cast<unsigned char>(c) >= 0x80) {
      try {
        return parse_json(to_json(json_value(name)), "name").as_string() == name;
      } catch (const error&) {
        return false;
      }
    }
  return true;
}

template <class Io>
void checkpoint_sum_tree(const std::string& root, const std::string& rel, checkpoint_file_sums& out,
                         std::vector<unsigned char>& buf, bool writeback) {
  for (const auto& name : store_list_dir<Io>(rel.empty() ? root : store_join(root, rel))) {
    if (rel.empty() && name == checkpoint_metadata_file_name) continue;
    std::string r = rel.empty() ? name : rel + "/" + name;
    std::string path = store_join(root, r);
    struct stat st {};
    if (!store_lstat<Io>(path, st)) continue;
    if (S_ISDIR(st.st_mode))
      checkpoint_sum_tree<Io>(root, r, out, buf, writeback);
    else if (S_ISREG(st.st_mode) && checkpoint_json_name(r))
      out.emplace_back(std::move(r), checkpoint_sum_file<Io>(path, buf, writeback));
  }
}

// Every regular file of the checkpoint at `root` (its metadata file excepted) with its sum;
// `writeback`: each file's writeback is started as it is opened (a save about to sync them).
template <class Io>
checkpoint_file_sums checkpoint_sum_files(const std::string& root, bool writeback = false) {
  checkpoint_file_sums out;
  std::vector<unsigned char> buf;
  checkpoint_sum_tree<Io>(root, "", out, buf, writeback);
  return out;
}

// {"<path>": {"size": N, "crc32c": N}, ...}: the metadata's "files".
inline json_value checkpoint_files_json(const checkpoint_file_sums& sums) {
  json_value files(json_value::object_t{});
  auto& members = files.as_object();  // paths are unique: no set()'s search per member
  members.reserve(sums.size());
  for (const auto& [path, s] : sums) {
    json_value f(json_value::object_t{});
    f.set("size", s.size);
    f.set("crc32c", s.crc32c);
    members.emplace_back(path, std::move(f));
  }
  return files;
}

// A recorded path stays inside the checkpoint: relative, no empty, "." or ".." component.
inline bool checkpoint_inside(std::string_view p) {
  if (p.empty() || p.front() == '/') return false;
  for (;;) {
    auto slash = p.find('/');
    std::string_view c = p.substr(0, slash);
    if (c.empty() || c == "." || c == "..") return false;
    if (slash == std::string_view::npos) return true;
    p.remove_prefix(slash + 1);
  }
}

// The "files" of a metadata document: nothing when absent; bad_metadata (in `why`) when
// malformed.
inline std::optional<checkpoint_file_sums> checkpoint_files_of(const json_value& doc,
                                                               std::string& why) {
  const json_value* files = doc.find("files");
  if (!files) return std::nullopt;
  checkpoint_file_sums out;
  if (!files->is_object()) {
    why = "its \"files\" is not an object";
    return out;
  }
  for (const auto& [path, v] : files->as_object()) {
    const json_value* size = v.find("size");
    const json_value* crc = v.find("crc32c");
    try {
      if (!checkpoint_inside(path) || !size || !crc) throw error(EINVAL, "json", "");
      std::uint64_t c = crc->as_uint64();
      if (c > 0xFFFFFFFFu) throw error(ERANGE, "json", "");
      out.emplace_back(path, checkpoint_file_sum{size->as_uint64(), static_cast<std::uint32_t>(c)});
    } catch (const error&) {
      why = "its record of '" + path + "' is malformed";
      return out;
    }
  }
  return out;
}

inline std::string checkpoint_hex32(std::uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x00000000";
  for (std::size_t i = 0; i < 8; ++i) s[9 - i] = digits[(v >> (4 * i)) & 0xFu];
  return s;
}

// What the metadata file of a checkpoint records, read once: nothing (no file), why it is
// damaged, or its history ("" unknown) and "files" (none in older checkpoints).
struct checkpoint_record {
  bool present = false;  // the file exists
  std::string damage;    // present but not holdfast's metadata of this step: why ("" when sound)
  std::string history;
  std::optional<checkpoint_file_sums> files;
};

// Reads the metadata file `meta` of the checkpoint of `step` through Io: damaged when it is not
// JSON, not holdfast's format, of another step, of a history that is not a history id, or with
// a malformed "files".
template <class Io>
checkpoint_record checkpoint_read_record(const std::string& meta, std::int64_t step) {
  checkpoint_record r;
  auto fd = open_file_if_exists<Io>(meta, O_RDONLY | O_NOFOLLOW);
  if (!fd) return r;
  r.present = true;
  std::string text = read_all(fd);
  fd.close();
  json_value doc;
  try {
    doc = parse_json(text, meta);
  } catch (const error& e) {
    r.damage = e.what();
    return r;
  }
  const json_value* format = doc.find("format");
  const json_value* s = doc.find("step");
  if (!format || !format->is_string() || format->as_string() != "holdfast-checkpoint-metadata 1") {
    r.damage = "not holdfast's checkpoint metadata";
    return r;
  }
  bool step_ok = false;
  try {
    step_ok = s && s->is_integer() && s->as_int64() == step;
  } catch (const error&) {  // beyond int64
  }
  if (!step_ok) {
    r.damage = "its \"step\" is not the checkpoint's step " + std::to_string(step);
    return r;
  }
  if (const json_value* h = doc.find("history")) {
    if (!h->is_string() || !checkpoint_history_ok(h->as_string())) {
      r.damage = "its \"history\" is not a history id";
      return r;
    }
    r.history = h->as_string();
  }
  r.files = checkpoint_files_of(doc, r.damage);
  return r;
}

// What is wrong with the recorded file `rel` of the checkpoint at `path` by lstat alone:
// missing, no longer a regular file, or of another size; nothing when it matches `want`.
template <class Io>
std::optional<std::pair<integrity_status, std::string>> checkpoint_size_problem(
    const std::string& path, const std::string& rel, const checkpoint_file_sum& want) {
  struct stat st {};
  if (!store_lstat<Io>(store_join(path, rel), st))
    return std::make_pair(integrity_status::missing, std::string("no such file"));
  if (!S_ISREG(st.st_mode))
    return std::make_pair(integrity_status::missing, std::string("no longer a regular file"));
  auto size = static_cast<std::uint64_t>(st.st_size);
  if (size != want.size)
    return std::make_pair(
        integrity_status::size_mismatch,
        std::to_string(want.size) + " bytes recorded, " + std::to_string(size) + " found");
  return std::nullopt;
}

// How far checkpoint_verify_files looks: every byte (restores, verify_step), or only that each
// recorded file is there with its size (one stat per file, no read).
enum class checkpoint_check_depth { sums, sizes };

// Checks the checkpoint of `step` at `path` against the "files" of the metadata in
// `recorded_in` (read through MetaIo; empty: `path`'s own): another copy of the same checkpoint
// (two_tier.hpp checks a local copy against its durable copy's sums).
template <class Io, class MetaIo = Io>
checkpoint_integrity checkpoint_verify_files(
    const std::string& path, std::int64_t step,
    checkpoint_check_depth depth = checkpoint_check_depth::sums,
    const std::string& recorded_in = {}) {
  checkpoint_integrity r;
  r.step = step;
  r.path = path;
  auto found = [&](integrity_status s, std::string file, std::string detail) {
    r.status = s;
    r.file = std::move(file);
    r.detail = std::move(detail);
    return r;
  };
  const std::string meta_name(checkpoint_metadata_file_name);
  const checkpoint_record rec = checkpoint_read_record<MetaIo>(
      store_join(recorded_in.empty() ? path : recorded_in, meta_name), step);
  if (!rec.present) return found(integrity_status::unverified, "", "no metadata file");
  if (!rec.damage.empty()) return found(integrity_status::bad_metadata, meta_name, rec.damage);
  if (!rec.files) return found(integrity_status::unverified, "", "no checksums recorded");
  std::vector<unsigned char> buf;
  for (const auto& [rel, want] : *rec.files) {
    if (auto bad = checkpoint_size_problem<Io>(path, rel, want))
      return found(bad->first, rel, bad->second);
    if (depth == checkpoint_check_depth::sizes) continue;
    checkpoint_file_sum got = checkpoint_sum_file<Io>(store_join(path, rel), buf);
    if (got.size != want.size)
      return found(
          integrity_status::size_mismatch, rel,
          std::to_string(want.size) + " bytes recorded, " + std::to_string(got.size) + " read");
    if (got.crc32c != want.crc32c)
      return found(
          integrity_status::crc_mismatch, rel,
          checkpoint_hex32(want.crc32c) + " recorded, " + checkpoint_hex32(got.crc32c) + " read");
  }
  return r;
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
