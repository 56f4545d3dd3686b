// holdfast/handoff/cache_root.hpp — a cache root `<data_dir>/<cache_id>`, where jobs that share
// a cache id meet, and the default cache id.
//
// Guarantees:
//   - basic_cache_root creates the root (mkdir) or joins an existing one; with the create_only
//     tag it only creates, and an existing root is an error (EEXIST). It removes the root at
//     destruction only if it created it, only in the process that created it, and only if the
//     directory there is still the one it created (same device and inode).
//   - The default cache id is the UTC time to the second, the host name (made a safe path
//     component), the pid and 32 random bits ("20240131T235959-node1-4242-9f86d081"): pids
//     repeat across containers, the host name and the random bits do not.
// Caveats:
//   - The "same directory" check compares device and inode: a root removed by someone else and
//     re-created may get the same inode number back, and is then removed.
//   - The default cache id is unique, so workers that must meet pass an explicit id.
#pragma once

#include <sys/stat.h>
#include <unistd.h>  // gethostname: the default cache id

#include <chrono>
#include <cstdint>
#include <ctime>
#include <random>  // random_device: 32 random bits in the default cache id
#include <string>
#include <string_view>

#include "../error.hpp"
#include "../io.hpp"
#include "../publish.hpp"  // detail::remove_tree: the root's removal
#include "command.hpp"     // detail::validate_component: the cache id

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

/// `s` as a safe path component for a cache id: ASCII letters, digits, '_', '-' and '.' kept
/// ('.' not first and not after another '.'), anything else '_'; at most 64 characters;
/// "host" when empty.
inline std::string path_safe(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-' || (c == '.' && !out.empty() && out.back() != '.');
    out += keep ? c : '_';
  }
  return out.empty() ? std::string("host") : out;
}

/// 32 random bits from std::random_device (getrandom on Linux); where it is unavailable, a mix
/// of the monotonic clock, the pid and a stack address (still differs between processes).
inline std::uint32_t random_bits32() noexcept {
  try {
    std::random_device rd;
    return static_cast<std::uint32_t>(rd());
  } catch (...) {
    int here = 0;
    auto x =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (static_cast<std::uint64_t>(::getpid()) << 32) ^
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&here));
    x ^= x >> 33;  // splitmix64 finalizer
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<std::uint32_t>(x);
  }
}

}  // namespace detail

/// A default cache id: the UTC time to the second, the host name, the pid and 32 random bits,
/// e.g. "20240131T235959-node1-4242-9f86d081"; always one valid path component.
template <class Io = posix_io>
std::string default_cache_id() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  static constexpr char hex[] = "0123456789abcdef";
  std::uint32_t r = detail::random_bits32();
  std::string bits(8, '0');
  for (int i = 7; i >= 0; --i, r >>= 4) bits[static_cast<std::size_t>(i)] = hex[r & 0xf];
  return std::string(buf) + "-" + detail::path_safe(host) + "-" + std::to_string(Io::getpid()) +
         "-" + bits;
}

/// Tag: basic_cache_root creates the root and fails with EEXIST if it exists (as
/// Boost.Interprocess create_only); without it, an existing root is joined.
struct create_only_t {
  explicit create_only_t() = default;
};
/// The create_only_t value.
inline constexpr create_only_t create_only{};

/// A cache root `<data_dir>/<cache_id>`: created or joined; removed at destruction only by
/// the process that created it.
template <class Io = posix_io>
class basic_cache_root {
 public:
  /// Creates `<data_dir>/<cache_id>` (mode 0755), or joins it when it exists. The data dir
  /// must exist. Throws EINVAL for a bad cache id.
  basic_cache_root(const std::string& data_dir, const std::string& cache_id)
      : basic_cache_root(data_dir, cache_id, false) {}
  /// A new root under `data_dir` with default_cache_id().
  explicit basic_cache_root(const std::string& data_dir)
      : basic_cache_root(data_dir, default_cache_id<Io>()) {}
  /// Creates `<data_dir>/<cache_id>`; throws holdfast::error(EEXIST, "mkdir") if it exists.
  basic_cache_root(create_only_t, const std::string& data_dir, const std::string& cache_id)
      : basic_cache_root(data_dir, cache_id, true) {}
  /// Creates a new root under `data_dir` with default_cache_id(); EEXIST if it exists.
  basic_cache_root(create_only_t, const std::string& data_dir)
      : basic_cache_root(data_dir, default_cache_id<Io>(), true) {}

 private:
  basic_cache_root(const std::string& data_dir, const std::string& cache_id, bool only_create)
      : id_(cache_id) {
    detail::validate_component(cache_id, "cache_id");
    path_ = data_dir + "/" + cache_id;
    if (Io::mkdir(path_.c_str(), 0755) == 0) {
      created_ = true;
      owner_ = Io::getpid();
    } else if (errno != EEXIST || only_create) {
      throw error(errno, "mkdir", path_);
    }
    struct stat st {};
    if (Io::stat(path_.c_str(), &st) != 0) {
      int e = errno;
      if (created_) Io::rmdir(path_.c_str());
      throw error(e, "stat", path_);
    }
    if (!S_ISDIR(st.st_mode)) throw error(ENOTDIR, "mkdir", path_, "exists and is not a directory");
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }

 public:
  basic_cache_root(basic_cache_root&& o) noexcept
      : id_(std::move(o.id_)),
        path_(std::move(o.path_)),
        created_(std::exchange(o.created_, false)),
        owner_(o.owner_),
        dev_(o.dev_),
        ino_(o.ino_) {}
  basic_cache_root& operator=(basic_cache_root&&) = delete;
  basic_cache_root(const basic_cache_root&) = delete;
  basic_cache_root& operator=(const basic_cache_root&) = delete;

  /// Removes the root if this object created it, in the creating process, and it is still the
  /// same directory. Errors are swallowed (a destructor); call remove() to see them.
  ~basic_cache_root() {
    try {
      remove();
    } catch (const error&) {
    }
  }

  /// The root's path.
  const std::string& path() const noexcept { return path_; }
  /// The cache id.
  const std::string& id() const noexcept { return id_; }
  /// True when this object created the root (and so owns it).
  bool owns() const noexcept { return created_; }
  /// Keeps the root on disk at destruction.
  void release() noexcept { created_ = false; }

  /// Removes the root now under the same conditions as the destructor; true when removed.
  bool remove() {
    if (!created_ || Io::getpid() != owner_) return false;
    created_ = false;
    struct stat st {};
    if (Io::lstat(path_.c_str(), &st) != 0) {
      if (errno == ENOENT) return false;
      throw error(errno, "lstat", path_);
    }
    if (!S_ISDIR(st.st_mode) || st.st_dev != dev_ || st.st_ino != ino_) return false;
    detail::remove_tree<Io>(path_);
    return true;
  }

 private:
  std::string id_;
  std::string path_;
  bool created_ = false;
  pid_t owner_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

/// The cache root for the default Io policy.
using cache_root = basic_cache_root<posix_io>;

HOLDFAST_NAMESPACE_END
