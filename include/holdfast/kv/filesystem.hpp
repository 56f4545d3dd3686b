// holdfast/kv/filesystem.hpp — a kv_store in a directory that every worker can see: local disk
// for the processes of one host, NFS, Lustre or a FUSE mount for several hosts.
//
// One file per key, published with holdfast/publish.hpp and awaited with holdfast/wait.hpp:
//   insert = publish_once (renameat2 RENAME_NOREPLACE, or link + unlink), put = publish
//   (rename over), get = await_file with the Wait policy, list = one scan of the namespace's
//   directory. Layout: `<root>/<run id>/<incarnation>/<escaped key>`, where the escaped key is
//   the whole key in one file name: bytes other than A-Z a-z 0-9 - _ . (and a leading '.')
//   become %XX, so "acks/3" is the file "acks%2F3". Listing a nested prefix is therefore one
//   scan that compares decoded names, and no directory is ever created or removed under a key.
//
// Guarantees:
//   - insert is exclusive across threads, processes and hosts sharing the directory (as
//     exclusive as the filesystem's rename-noreplace or link: atomic on local filesystems and
//     NFS).
//   - A reader sees a value whole (old or new), never a partial write.
//   - get wakes on the insert (inotify_wait: an inotify watch on the namespace directory, with a
//     re-check every 500 ms for changes made by other NFS hosts) or polls with back-off up to
//     100 ms (poll_wait, for network filesystems); either way it returns by the deadline.
//   - Files that are not escaped keys (publish temps ".holdfast-tmp.*", anything starting with
//     '.', names that do not decode) are ignored by list and erase_prefix.
// Caveats:
//   - A key becomes one file name: an escaped key longer than 255 bytes is refused with
//     ENAMETOOLONG (keys of mostly [A-Za-z0-9._-] up to ~250 bytes fit).
//   - The default Durability is `no_sync`: keys are coordination state of one incarnation and
//     need to be visible, not to survive a power loss. Choose `durable` to make them survive.
//   - A writer killed mid-publish leaves a ".holdfast-tmp.*" temp; remove old ones with
//     holdfast::sweep_stale_temps(kv.directory(), age).
//   - erase and erase_prefix are not atomic across keys (one unlink per key).
#pragma once

#include <dirent.h>  // DIR, dirent: the namespace scan
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../io.hpp"
#include "../kv.hpp"
#include "../publish.hpp"
#include "../wait.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

/// One key (or namespace part) as one file name: [A-Za-z0-9_.-] kept (not a leading '.'),
/// every other byte %XX (upper-case hex).
inline std::string fs_escape(std::string_view key) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size());
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// The key a file name stands for, or std::nullopt when the name is not fs_escape's output.
inline std::optional<std::string> fs_unescape(std::string_view name) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(name.size());
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      out += name[i];
      continue;
    }
    if (i + 2 >= name.size()) return std::nullopt;
    int hi = digit(name[i + 1]), lo = digit(name[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  if (fs_escape(out) != name) return std::nullopt;  // only canonical names are keys
  return out;
}

}  // namespace detail

/// A kv_store in a shared directory (see the header comment). `Wait` is inotify_wait (local
/// filesystems) or poll_wait (network filesystems); `Durability` is a publish.hpp policy.
template <class Wait = inotify_wait, class Durability = no_sync, class Io = posix_io>
class basic_filesystem_kv {
  static_assert(check_io_policy<Io>());

 public:
  /// Uses `<root>/<run id>/<incarnation>/`, creating the directories that are missing (0755,
  /// parents of `root` included).
  /// Throws holdfast::error naming the directory when it cannot be created.
  basic_filesystem_kv(std::string root, kv_namespace ns)
      : root_(std::move(root)),
        ns_(std::move(ns)),
        dir_(root_ + "/" + detail::fs_escape(ns_.run_id()) + "/" +
             detail::fs_escape(ns_.incarnation())) {
    make_dir(root_);
    make_dir(root_ + "/" + detail::fs_escape(ns_.run_id()));
    make_dir(dir_);
  }

  /// Another handle on the same root directory, scoped to namespace `ns`.
  basic_filesystem_kv with_namespace(kv_namespace ns) const {
    return basic_filesystem_kv(root_, std::move(ns));
  }
  /// This handle's namespace.
  const kv_namespace& ns() const noexcept { return ns_; }
  /// The directory holding this namespace's keys.
  const std::string& directory() const noexcept { return dir_; }
  /// The file that holds `key` (validated).
  std::string path_of(const std::string& key) const {
    validate_key(key, "kv path");
    return file_of(key, "kv path");
  }

  /// Stores `value` under `key` unless the key exists (publish_once); true when stored.
  bool insert(const std::string& key, std::string_view value) {
    validate_key(key, "kv insert");
    return publisher_type().publish_once(file_of(key, "kv insert"), value, 0644);
  }

  /// Stores `value` under `key`, replacing any previous value (publish).
  void put(const std::string& key, std::string_view value) {
    validate_key(key, "kv put");
    publisher_type().publish(file_of(key, "kv put"), value, 0644);
  }

  /// The value of `key`, or std::nullopt.
  std::optional<std::string> try_get(const std::string& key) const {
    validate_key(key, "kv try_get");
    return read_if_exists(file_of(key, "kv try_get"));
  }

  /// Waits until `key` exists (Wait policy) or `timeout` passes.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) const {
    validate_key(key, "kv get");
    const std::string path = file_of(key, "kv get");
    // Present already (the common case): one open + read, no inotify set-up and tear-down
    // (closing an inotify descriptor costs the kernel milliseconds).
    if (auto value = read_if_exists(path)) return value;
    if (timeout <= decltype(timeout){0}) return std::nullopt;
    return await_file<Wait, Io>(path, timeout);
  }

  /// Every key strictly below `prefix + "/"` (all keys for ""), sorted, with its value.
  kv_pairs list(const std::string& prefix) const {
    const std::string start = scope(prefix, "kv list");
    kv_pairs out;
    for (auto& key : scan(start)) {
      auto value = read_if_exists(dir_ + "/" + detail::fs_escape(key));
      if (value) out.emplace_back(std::move(key), std::move(*value));  // else erased meanwhile
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Removes `key`; true when it existed.
  bool erase(const std::string& key) {
    validate_key(key, "kv erase");
    return remove(file_of(key, "kv erase"));
  }

  /// Removes every key strictly below `prefix + "/"` (all keys for ""); returns how many.
  std::size_t erase_prefix(const std::string& prefix) {
    const std::string start = scope(prefix, "kv erase_prefix");
    std::size_t n = 0;
    for (const auto& key : scan(start))
      if (remove(dir_ + "/" + detail::fs_escape(key))) ++n;
    return n;
  }

 private:
  using publisher_type = basic_publisher<Durability, Io>;

  // mkdir -p: creates `dir` and any missing parent.
  static void make_dir(const std::string& dir) {
    if (Io::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return;
    const std::size_t slash = dir.rfind('/');
    if (errno == ENOENT && slash != std::string::npos && slash > 0) {
      make_dir(dir.substr(0, slash));
      if (Io::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return;
    }
    throw error(errno, "mkdir", dir);
  }

  std::string file_of(const std::string& key, const char* op) const {
    std::string name = detail::fs_escape(key);
    if (name.size() > 255)
      throw error(ENAMETOOLONG, op, key,
                  "escaped key is " + std::to_string(name.size()) + " bytes, above 255");
    return dir_ + "/" + name;
  }

  std::string scope(const std::string& prefix, const char* op) const {
    std::string p = normalize_prefix(prefix, op);
    return p.empty() ? std::string() : p + "/";
  }

  // Reads a whole value: sized by fstat (values are published whole, so the size is final),
  // with one extra byte to notice a file that is still growing and finish it with read_all.
  static std::optional<std::string> read_if_exists(const std::string& path) {
    auto fd = open_file_if_exists<Io>(path, O_RDONLY);
    if (!fd) return std::nullopt;
    const auto size = static_cast<std::size_t>(stat_fd(fd).st_size);
    std::string content(size + 1, '\0');
    const std::size_t got = read_full(fd, &content[0], size + 1);
    content.resize(got);
    if (got == size + 1) content += read_all(fd);
    fd.close();
    return content;
  }

  static bool remove(const std::string& path) {
    if (Io::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw error(errno, "unlink", path);
  }

  // The keys in the namespace directory that start with `start` (unsorted).
  std::vector<std::string> scan(const std::string& start) const {
    DIR* d = Io::opendir(dir_.c_str());
    if (!d) throw error(errno, "opendir", dir_);
    std::vector<std::string> keys;
    for (;;) {
      errno = 0;
      dirent* e = Io::readdir(d);
      if (!e) {
        int err = errno;
        Io::closedir(d);
        if (err != 0) throw error(err, "readdir", dir_);
        return keys;
      }
      if (e->d_name[0] == '.') continue;  // ".", "..", publish temps
      auto key = detail::fs_unescape(e->d_name);
      if (key && key->compare(0, start.size(), start) == 0) keys.push_back(std::move(*key));
    }
  }

  std::string root_;
  kv_namespace ns_;
  std::string dir_;
};

/// The filesystem store for local filesystems (inotify wake-ups).
using filesystem_kv = basic_filesystem_kv<inotify_wait>;
/// The filesystem store for network filesystems (NFS, Lustre, FUSE): polls with back-off.
using network_filesystem_kv = basic_filesystem_kv<poll_wait>;

HOLDFAST_NAMESPACE_END
