// holdfast/wait.hpp — wait for a published file and read it whole; copy it to local disk.
//
// The reading side of publish.hpp: a job waits for a command or ready file another job
// publishes, with a timeout, and reads it through one descriptor, so a concurrent republish
// (a rename over the path) never mixes two versions.
//
// Guarantees:
//   - await_file returns the whole content of the file as it was when opened, or std::nullopt
//     once the timeout has passed; it returns no later than the deadline plus one wake-up
//     (poll_wait sleeps never past the deadline; inotify_wait polls its descriptor up to it).
//   - inotify_wait watches the parent directory (IN_CREATE, IN_MOVED_TO, IN_CLOSE_WRITE) and
//     also re-checks every `recheck` interval, because inotify does not see changes made by
//     other hosts on NFS. Where inotify cannot be used (inotify_init1 or inotify_add_watch fails:
//     ENOSYS, EMFILE, ENOSPC, a missing parent directory, …) it falls back to poll_wait's loop.
//   - poll_wait backs off from `initial_interval`, doubling, to `max_interval`; it uses only
//     open and read, so it works on every filesystem.
//   - copy_to_local copies through one descriptor into a 0600 file in $TMPDIR (or /tmp), owned
//     by a move-only handle that unlinks it when dropped (only in the process that made it). Its
//     name, ".holdfast-copy.<pid>.<hex>.<name>", never matches the publish temp pattern, so
//     sweep_stale_temps on that directory cannot remove a copy another process is using.
// Caveats:
//   - A file written in place (not published) may be read while still being written: pair
//     await_file with publish.hpp, or with a commit marker.
//   - await_file opens and closes an inotify descriptor per call, and closing one costs the
//     kernel an RCU grace period (milliseconds, after the content was read): keep a
//     basic_file_waiter to wait repeatedly with one descriptor.
//   - Custom wait policies: derive from poll_wait or inotify_wait and shadow the intervals
//     (await_file passes the derived policy as Self, so the shadowed values are used).
#pragma once

#include <sys/inotify.h>  // IN_* masks

#include <algorithm>
#include <chrono>
#include <cstdlib>  // getenv: $TMPDIR for copy_to_local
#include <optional>
#include <string>
#include <string_view>
#include <thread>  // sleep_for: poll_wait's interval
#include <utility>

#include "error.hpp"
#include "io.hpp"
#include "publish.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Wait policy: re-open the path at a backed-off interval. Works on NFS and every filesystem.
struct poll_wait {
  /// The first interval between attempts.
  static constexpr std::chrono::milliseconds initial_interval{2};
  /// The interval doubles up to this.
  static constexpr std::chrono::milliseconds max_interval{100};

  /// Calls `attempt()` (returning std::optional) until it has a value or `deadline` passes.
  /// `state` is a descriptor a stateful policy may keep between calls (unused here).
  template <class Io, class Attempt, class Self = poll_wait>
  static auto wait(const std::string& path, std::chrono::steady_clock::time_point deadline,
                   Attempt&& attempt, basic_fd<Io>& state) -> decltype(attempt()) {
    (void)path;
    (void)state;
    auto interval = std::chrono::milliseconds(Self::initial_interval);
    for (;;) {
      if (auto r = attempt()) return r;
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return std::nullopt;
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(interval, deadline - now));
      interval = std::min(interval * 2, std::chrono::milliseconds(Self::max_interval));
    }
  }
};

/// Wait policy: inotify on the parent directory, falling back to poll_wait where unsupported.
struct inotify_wait {
  /// The fallback's first interval.
  static constexpr std::chrono::milliseconds initial_interval{2};
  /// The fallback's longest interval.
  static constexpr std::chrono::milliseconds max_interval{100};
  /// Re-check this often even without an event (inotify misses other hosts' NFS changes).
  static constexpr std::chrono::milliseconds recheck{500};

  /// As poll_wait::wait, woken by inotify events. `state` holds the inotify descriptor: an
  /// empty one is created here, and a caller that keeps it (basic_file_waiter) reuses it.
  template <class Io, class Attempt, class Self = inotify_wait>
  static auto wait(const std::string& path, std::chrono::steady_clock::time_point deadline,
                   Attempt&& attempt, basic_fd<Io>& state) -> decltype(attempt()) {
    if (!state) {
      int raw = Io::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
      if (raw < 0) return poll_wait::wait<Io, Attempt&, Self>(path, deadline, attempt, state);
      state = basic_fd<Io>(raw, "inotify");
    }
    std::string dir = detail::split_path(path).first;
    // Watching a directory again returns the same watch: a kept descriptor gathers watches on
    // the directories it waited on, whose events only cause an extra attempt.
    if (Io::inotify_add_watch(state.get(), dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE) <
        0)
      return poll_wait::wait<Io, Attempt&, Self>(path, deadline, attempt, state);
    for (;;) {
      if (auto r = attempt()) return r;  // after the watch exists: no event can be missed
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return std::nullopt;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      auto slice = std::min(left, std::chrono::milliseconds(Self::recheck));
      pollfd pfd{state.get(), POLLIN, 0};
      int n = Io::poll(&pfd, 1, static_cast<int>(slice.count()));
      if (n < 0 && errno != EINTR)
        return poll_wait::wait<Io, Attempt&, Self>(path, deadline, attempt, state);
      if (n > 0) drain<Io>(state);
    }
  }

 private:
  template <class Io>
  static void drain(const basic_fd<Io>& fd) noexcept {
    alignas(inotify_event) char buf[4096];
    while (Io::read(fd.get(), buf, sizeof buf) > 0) {
    }
  }
};

namespace detail {
template <class Io>
std::optional<std::string> read_if_exists(const std::string& path) {
  auto fd = open_file_if_exists<Io>(path, O_RDONLY);
  if (!fd) return std::nullopt;
  std::string content = read_all(fd);
  fd.close();
  return content;
}
}  // namespace detail

/// Waits for files again and again with one kept wait state (for inotify_wait, one inotify
/// descriptor). Closing an inotify descriptor waits for an RCU grace period (milliseconds), so
/// a job that waits once per cycle should keep a waiter rather than call await_file. One
/// waiter serves one thread at a time.
template <class Wait = inotify_wait, class Io = posix_io>
class basic_file_waiter {
 public:
  /// As await_file.
  std::optional<std::string> await(const std::string& path, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto attempt = [&] { return detail::read_if_exists<Io>(path); };
    return Wait::template wait<Io, decltype(attempt)&, Wait>(path, deadline, attempt, state_);
  }

 private:
  basic_fd<Io> state_;
};

/// A waiter with the default policies.
using file_waiter = basic_file_waiter<>;

/// Waits up to `timeout` for `path` to exist, then returns its whole content read through one
/// descriptor; std::nullopt on timeout. Errors other than "does not exist yet" throw.
template <class Wait = inotify_wait, class Io = posix_io>
std::optional<std::string> await_file(const std::string& path, std::chrono::milliseconds timeout) {
  return basic_file_waiter<Wait, Io>().await(path, timeout);
}

/// A local temp copy of a file, unlinked when dropped (by the process that made it only).
template <class Io = posix_io>
class basic_local_copy {
 public:
  basic_local_copy() noexcept = default;
  /// Takes ownership of the file at `path`.
  explicit basic_local_copy(std::string path) noexcept
      : path_(std::move(path)), owner_(Io::getpid()) {}
  basic_local_copy(basic_local_copy&& o) noexcept
      : path_(std::exchange(o.path_, std::string())), owner_(o.owner_) {}
  basic_local_copy& operator=(basic_local_copy&& o) noexcept {
    if (this != &o) {
      reset();
      path_ = std::exchange(o.path_, std::string());
      owner_ = o.owner_;
    }
    return *this;
  }
  basic_local_copy(const basic_local_copy&) = delete;
  basic_local_copy& operator=(const basic_local_copy&) = delete;
  ~basic_local_copy() { reset(); }

  /// The local path ("" when empty).
  const std::string& path() const noexcept { return path_; }
  /// True when a copy is held.
  explicit operator bool() const noexcept { return !path_.empty(); }
  /// Keeps the file on disk and gives up ownership; returns its path.
  std::string release() noexcept { return std::exchange(path_, std::string()); }
  /// Unlinks the copy now (in the owning process only).
  void reset() noexcept {
    if (!path_.empty() && Io::getpid() == owner_) Io::unlink(path_.c_str());
    path_.clear();
  }

 private:
  std::string path_;
  pid_t owner_ = -1;
};

/// The local copy type for the default Io policy.
using local_copy = basic_local_copy<posix_io>;

/// The prefix of copy_to_local's files: ".holdfast-copy.<pid>.<hex>.<name>" (not a publish temp,
/// so sweep_stale_temps never removes a copy in use).
inline constexpr std::string_view local_copy_prefix = ".holdfast-copy.";

/// Copies `path` through one descriptor into a new 0600 file under `local_dir` (default
/// $TMPDIR, else /tmp), named with local_copy_prefix. For libraries that only open local paths. On
/// failure nothing is left.
template <class Io = posix_io>
basic_local_copy<Io> copy_to_local(const std::string& path, std::string local_dir = "") {
  if (local_dir.empty()) {
    const char* t = std::getenv("TMPDIR");
    local_dir = t && *t ? t : "/tmp";
  }
  auto src = open_file<Io>(path, O_RDONLY);
  auto dst =
      detail::create_temp<Io>(local_dir, detail::split_path(path).second, 0, local_copy_prefix);
  basic_local_copy<Io> copy(dst.path());
  std::string buf(1 << 20, '\0');
  for (;;) {
    std::size_t got = read_full(src, &buf[0], buf.size());
    write_all(dst, buf.data(), got);
    if (got < buf.size()) break;
  }
  dst.close();
  src.close();
  return copy;
}

HOLDFAST_NAMESPACE_END
