// holdfast/detail/waker.hpp — a wake-up descriptor (an eventfd) that notice sources signal the
// moment they notice, so a watcher can sleep in one poll() instead of looking every slice; and
// waker_slot, the place a source keeps the descriptor it signals.
//
// Guarantees:
//   - waker::fd() is readable (POLLIN) from the first notify() until the next drain(); drain()
//     says whether a notify() came in between. Several notify() calls before a drain() are one
//     wake-up.
//   - notify() is async-signal-safe (one write(2) of a uint64 1, retried on EINTR), preserves
//     errno, never blocks: on a saturated counter (EAGAIN) the descriptor is readable already.
//   - waker_slot::notify() is async-signal-safe and lock-free too; after attach() returns, no
//     notify() still in flight writes to the descriptor attached before, so that waker may be
//     destroyed.
// Caveats:
//   - A waker must outlive its attachment: call set_waker(nullptr) (waker_slot::attach(nullptr))
//     before destroying it. attach() is not async-signal-safe (it waits for notifications in
//     flight) and must not be called from a signal handler.
//   - Linux only (eventfd).
#pragma once

#include <sys/eventfd.h>  // eventfd: the wake-up descriptor
#include <unistd.h>       // read, write, close

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <thread>  // yield: attach() waits out notifications in flight

#include "../error.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// A wake-up descriptor: notice sources notify() it, a watcher poll()s fd() and drain()s it.
class waker {
 public:
  /// Opens the eventfd (non-blocking, close-on-exec); throws holdfast::error naming "eventfd".
  waker() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw error(errno, "eventfd", "");
  }
  waker(const waker&) = delete;
  waker& operator=(const waker&) = delete;
  /// Closes the descriptor; nothing may still be attached to it.
  ~waker() { ::close(fd_); }

  /// The descriptor to poll() for POLLIN.
  int fd() const noexcept { return fd_; }
  /// Makes fd() readable. Async-signal-safe; preserves errno.
  void notify() const noexcept { notify_fd(fd_); }
  /// Resets the counter; true when notify() was called since the last drain().
  bool drain() noexcept {
    std::uint64_t n = 0;
    for (;;) {
      if (::read(fd_, &n, sizeof n) == static_cast<ssize_t>(sizeof n)) return n > 0;
      if (errno != EINTR) return false;  // EAGAIN: nothing since the last drain
    }
  }

  /// Adds 1 to the eventfd `fd` (nothing when fd < 0). Async-signal-safe; preserves errno.
  static void notify_fd(int fd) noexcept {
    if (fd < 0) return;
    const int saved_errno = errno;
    const std::uint64_t one = 1;
    while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
    errno = saved_errno;
  }

 private:
  int fd_;
};

/// Where a notice source keeps the waker it signals: its descriptor number, and how many
/// notify() calls are in flight. Lock-free, constant-initialized (usable in the signal slot).
class waker_slot {
 public:
  constexpr waker_slot() noexcept = default;
  waker_slot(const waker_slot&) = delete;
  waker_slot& operator=(const waker_slot&) = delete;

  /// Attaches `w` (nullptr detaches). On return no notify() still writes to the previous waker.
  void attach(const waker* w) noexcept { attach_fd(w ? w->fd() : -1); }
  /// As attach(), by descriptor number (-1 detaches).
  void attach_fd(int fd) noexcept {
    fd_.store(fd);
    while (busy_.load() != 0) std::this_thread::yield();
  }
  /// The attached descriptor, or -1.
  int fd() const noexcept { return fd_.load(); }
  /// Notifies the attached waker, if any. Async-signal-safe; preserves errno.
  void notify() const noexcept {
    busy_.fetch_add(1);  // seq_cst, as attach_fd's store and load: see the Guarantees
    waker::notify_fd(fd_.load());
    busy_.fetch_sub(1);
  }

 private:
  std::atomic<int> fd_{-1};
  mutable std::atomic<int> busy_{0};
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
