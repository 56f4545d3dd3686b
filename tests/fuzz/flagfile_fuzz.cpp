// Fuzzes flag_codec::decode (handoff.hpp): the absl-style `--key=value` flag file a main job
// hands to a data job through a shared cache root, nested `--flagfile=` files included.
// Input: the main file, then the files it may include, separated by the line "\x01\x01": the
// k-th of them is "fuzz/f<k>" (reached by `--flagfile=f<k>`). They live in memory (files_io):
// the fuzzer never reads the real filesystem.
// Properties: only holdfast::error escapes, from decoding or from the typed getters; every key
// decoded passes command::validate_key; re-encoding a decoded command (unless encode refuses it
// with EINVAL: a value with a line break or NUL) decodes to an equal command.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <holdfast/handoff.hpp>

#include "fuzz_support.hpp"

namespace {

/// An Io policy whose files are in memory: `files[k]` at `names[k]`; nothing else exists.
struct files_io : holdfast::posix_io {
  struct fs_t {
    std::vector<std::string> names, files;
    std::vector<std::size_t> offsets;  // read position per open file
  };
  static fs_t& fs() noexcept {
    static fs_t f;
    return f;
  }
  static constexpr int first_fd = 1 << 20;

  static int find(const char* path) noexcept {
    auto& f = fs();
    for (std::size_t k = 0; k < f.names.size(); ++k)
      if (f.names[k] == path) return static_cast<int>(k);
    errno = ENOENT;
    return -1;
  }
  static int stat(const char* path, struct stat* st) noexcept {
    const int k = find(path);
    if (k < 0) return -1;
    std::memset(st, 0, sizeof *st);
    st->st_mode = S_IFREG | 0644;
    st->st_dev = 1;
    st->st_ino = static_cast<ino_t>(k + 1);
    st->st_size = static_cast<off_t>(fs().files[static_cast<std::size_t>(k)].size());
    return 0;
  }
  static int open(const char* path, int, mode_t) noexcept {
    const int k = find(path);
    if (k < 0) return -1;
    fs().offsets[static_cast<std::size_t>(k)] = 0;
    return first_fd + k;
  }
  static int fstat(int fd, struct stat* st) noexcept {
    return stat(fs().names[static_cast<std::size_t>(fd - first_fd)].c_str(), st);
  }
  static ssize_t read(int fd, void* buf, std::size_t n) noexcept {
    const auto k = static_cast<std::size_t>(fd - first_fd);
    const std::string& file = fs().files[k];
    std::size_t& at = fs().offsets[k];
    const std::size_t take = std::min(n, file.size() - at);
    std::memcpy(buf, file.data() + at, take);
    at += take;
    return static_cast<ssize_t>(take);
  }
  static int close(int fd) noexcept { return fd >= first_fd ? 0 : holdfast::posix_io::close(fd); }

  /// Splits the input into the main file and the files it may include.
  static void load(std::string_view in) {
    auto& f = fs();
    f.names.clear();
    f.files.clear();
    static constexpr std::string_view sep = "\n\x01\x01\n";
    for (std::size_t k = 0;; ++k) {
      const auto at = in.find(sep);
      f.names.push_back(k == 0 ? "fuzz/flagfile" : "fuzz/f" + std::to_string(k));
      f.files.emplace_back(in.substr(0, at));
      if (at == std::string_view::npos) break;
      in.remove_prefix(at + sep.size());
    }
    f.offsets.assign(f.files.size(), 0);
  }
};

void use_getters(const holdfast::command& c) {
  for (const auto& e : c.entries()) {
    try {
      holdfast::command::validate_key(e.key);
    } catch (const holdfast::error& x) {
      hf_fuzz::fail("decode kept a key validate_key refuses: " + std::string(x.what()));
    }
    hf_fuzz::check(c.find(e.key) == &e, "find() does not give the entry back");
    (void)c.get_string(e.key);
    try {
      (void)c.get_int(e.key);
    } catch (const holdfast::error&) {
    }
    try {
      (void)c.get_bool(e.key);
    } catch (const holdfast::error&) {
    }
    try {
      (void)c.get_double(e.key);
    } catch (const holdfast::error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string source = "fuzz/flagfile";
  files_io::load(hf_fuzz::text(data, size));
  holdfast::command c;
  try {
    c = holdfast::flag_codec::decode<files_io>(files_io::fs().files.front(), source);
  } catch (const holdfast::error&) {
    return 0;
  }
  use_getters(c);
  std::string text;
  try {
    text = holdfast::flag_codec::encode(c);
  } catch (const holdfast::error& e) {
    hf_fuzz::check(e.errnum() == EINVAL, "flag_codec::encode failed with another errno");
    return 0;  // a value with '\r' or NUL inside: documented as unwritable
  }
  try {
    hf_fuzz::check(holdfast::flag_codec::decode<files_io>(text, source) == c,
                   "a re-encoded flag file decodes to another command");
  } catch (const holdfast::error& e) {
    hf_fuzz::fail("flag_codec rejects its own encoding: " + std::string(e.what()));
  }
  return 0;
}
