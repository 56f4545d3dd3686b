// holdfast/termination/signal.hpp — notices from signals: signal_notice<Signals...>, and the
// signal-handler slot behind it (the library's only global state).
//
// signal_notice<SIGUSR1, SIGTERM> is noticed when one of its signals is delivered after start();
// signal() tells which came first. Each signal may carry the time the process has left once it
// arrives (set_time_left(), or the constructor's {signal, time} list): deadline() is then the
// first signal's arrival (wall clock) plus that signal's time. So one notice can say "120 s left"
// for Slurm's `--signal=USR1@120` and "30 s left" for the SIGTERM of a preemption.
//
// Guarantees:
//   - The signal handler is async-signal-safe: it only calls clock_gettime and stores into
//     lock-free atomics (the first signal's number, its arrival on both clocks, a delivery
//     count), then chains to the handler installed before it (sa_handler or SA_SIGINFO form) the
//     way the kernel would have called that handler:
//       * with the earlier handler's sa_mask blocked, and its signal blocked too unless it was
//         installed with SA_NODEFER (ours is installed with its sa_mask and SA_NODEFER, so the
//         kernel sets that mask for the whole delivery);
//       * SA_RESETHAND: called for one delivery only; after it the earlier disposition counts as
//         SIG_DFL, and SIG_DFL is what the last stop() leaves (the kernel would have reset it).
//     SIG_IGN and SIG_DFL are not chained: a notice takes over the default action of its
//     signals, so a SIGTERM no longer kills the process while a signal_notice is started (that is
//     its purpose: the handler saves, then exits through the Exit policy). errno is preserved,
//     and the handler is installed with SA_RESTART, so the program's blocking calls are not
//     interrupted with EINTR by a notice.
//   - Several signal_notices (several configs) on one signal all see each delivery. The previous
//     disposition is restored when the last of them stops.
//   - The only global state is the signal-handler slot (a fixed table of 64 listener cells and
//     the saved dispositions); everything else lives in the notice objects.
//   - deadline() is computed from what the handler stored: it does not move once noticed, and
//     it survives stop().
//   - Waking: with a waker attached (set_waker, before or after start()), the signal handler
//     notifies it after recording each delivery, before chaining — one write(2) to its eventfd,
//     whose number the handler reads from a lock-free atomic in the notice's cell (no lock, no
//     allocation). set_waker(nullptr), stop() and destruction detach, and wait for a handler
//     running on another thread to finish its write: after they return the waker may be
//     destroyed. Deliveries while stopped wake no one (they are not noticed either).
// Caveats:
//   - At most 64 signal_notices may be started at once (start() throws EMFILE beyond that).
//   - If another library installs its own handler on the signal after a notice started and does
//     not restore ours, stop() leaves that handler in place (ours stays in its chain, inert).
//   - The times left are what the caller knows of the platform (a scheduler's settings); nothing
//     reads them from the platform. Set them before start().
//   - An attached waker must outlive the attachment (set_waker(nullptr) or stop() first), and
//     set_waker must not be called from a signal handler.
#pragma once

#include <signal.h>  // sigaction: the signal-handler slot

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>  // yield: an install waits for a handler copying a record
#include <utility>

#include "../detail/waker.hpp"  // waker_slot: what the handler notifies
#include "../error.hpp"
#include "notice.hpp"  // the Notice contract, the clocks the handler reads

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

/// "SIGTERM" for the signals a preemption notice comes by, else the number.
inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGALRM:
      return "SIGALRM";
    case SIGCONT:
      return "SIGCONT";
    case SIGPWR:
      return "SIGPWR";
    default:
      return std::to_string(sig);
  }
}

static_assert(std::atomic<std::int64_t>::is_always_lock_free &&
                  std::atomic<std::uint64_t>::is_always_lock_free &&
                  std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "holdfast: the signal handler needs lock-free atomics");

/// One listener: a started signal_notice. The handler writes only into these.
struct signal_cell {
  std::atomic<bool> in_use{false};
  std::atomic<std::uint64_t> mask{0};  // bit n - 1: listens to signal n
  std::atomic<int> claimed{0};         // the first delivery claims the time
  std::atomic<bool> noticed{false};
  std::atomic<int> signo{0};
  std::atomic<std::int64_t> at_ns{0};    // CLOCK_MONOTONIC
  std::atomic<std::int64_t> wall_ns{0};  // CLOCK_REALTIME, for per-signal deadlines
  std::atomic<std::uint64_t> count{0};
  waker_slot wake;  // the eventfd notified on each delivery, or -1
};

inline constexpr int signal_saved_ring = 8;

/// Per signal: how many notices installed it and what was there before. The handler may still
/// be running (on another thread) when the next install saves a new previous disposition, so
/// saved dispositions go into a ring and are published by an index. The handler copies the
/// record it loaded under a reader count of that record, and only while it is still the
/// published one (read_previous); an install waits for a record's readers before it rewrites it
/// (eight changes later), so no copy ever meets a write.
struct signal_disposition {
  int installs = 0;  // under signal_table::mu
  struct sigaction saved[signal_saved_ring] {};
  /// Per saved record: an SA_RESETHAND handler had its one call (set by the signal handler).
  std::atomic<bool> used_up[signal_saved_ring]{};
  /// Per saved record: handlers copying it now (a few instructions each).
  std::atomic<int> readers[signal_saved_ring]{};
  std::atomic<int> current{0};
  const struct sigaction& previous() const noexcept {
    return saved[current.load(std::memory_order_acquire)];
  }
};

inline constexpr int signal_cell_count = 64;
inline constexpr int signal_max = 64;

struct signal_table {
  std::mutex mu;  // install/uninstall only; never taken in the handler
  signal_cell cells[signal_cell_count];
  signal_disposition sig[signal_max + 1];
};

/// The slot. Constant-initialized, so the handler never meets a guard variable.
inline signal_table signal_slot;

/// The listener-mask bit of signal `sig` (1..64).
constexpr std::uint64_t signal_bit(int sig) noexcept {
  return std::uint64_t{1} << static_cast<unsigned>(sig - 1);
}

/// SA_RESETHAND as an int (it is 0x80000000, an unsigned literal; sa_flags is an int).
inline constexpr int sa_resethand = static_cast<int>(SA_RESETHAND);

/// True when a disposition is a function to call, not SIG_DFL or SIG_IGN.
inline bool calls_function(const struct sigaction& sa) noexcept {
  const std::uintptr_t h = (sa.sa_flags & SA_SIGINFO)
                               ? reinterpret_cast<std::uintptr_t>(sa.sa_sigaction)
                               : reinterpret_cast<std::uintptr_t>(sa.sa_handler);
  return h != reinterpret_cast<std::uintptr_t>(SIG_DFL) &&
         h != reinterpret_cast<std::uintptr_t>(SIG_IGN);
}

/// A copy of the published previous disposition and its index, made under the record's reader
/// count and only while it is still the published one: an install rewriting a record (never the
/// published one) waits for its readers, and one publishing it has finished writing it. The
/// operations are sequentially consistent, so a reader whose count the install missed sees the
/// index moved on and tries again.
inline struct sigaction read_previous(signal_disposition& d, int& index) noexcept {
  for (;;) {
    const int i = d.current.load();
    d.readers[i].fetch_add(1);
    if (d.current.load() == i) {
      const struct sigaction copy = d.saved[i];
      d.readers[i].fetch_sub(1);
      index = i;
      return copy;
    }
    d.readers[i].fetch_sub(1);
  }
}

inline void chain_previous(int sig, siginfo_t* info, void* ctx) noexcept {
  signal_disposition& d = signal_slot.sig[sig];
  int i = 0;
  const struct sigaction prev = read_previous(d, i);
  // SIG_DFL, SIG_IGN: nothing. Re-raising a default SIGTERM would kill the process we are
  // here to save; the notice takes over the default action instead.
  if (!calls_function(prev)) return;
  // A one-shot handler: the kernel would have reset it to SIG_DFL on the delivery that called
  // it. The first delivery to get here makes the one call (deliveries may race on threads).
  if ((prev.sa_flags & sa_resethand) && d.used_up[i].exchange(true)) return;
  if (prev.sa_flags & SA_SIGINFO)
    prev.sa_sigaction(sig, info, ctx);
  else
    prev.sa_handler(sig);
}

inline void signal_handler(int sig, siginfo_t* info, void* ctx) noexcept {
  const int saved_errno = errno;
  const std::int64_t now = monotonic_ns();
  const std::int64_t wall = realtime_ns();
  const std::uint64_t bit = signal_bit(sig);
  for (auto& c : signal_slot.cells) {
    if (!(c.mask.load(std::memory_order_acquire) & bit)) continue;
    c.count.fetch_add(1);
    int unclaimed = 0;
    if (c.claimed.compare_exchange_strong(unclaimed, 1)) {
      c.at_ns.store(now);
      c.wall_ns.store(wall);
      c.signo.store(sig);
      c.noticed.store(true, std::memory_order_release);
    }
    c.wake.notify();  // after recording: a woken watcher sees noticed()
  }
  chain_previous(sig, info, ctx);
  errno = saved_errno;
}

inline bool is_our_handler(const struct sigaction& sa) noexcept {
  return (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == &signal_handler;
}

inline bool same_disposition(const struct sigaction& a, const struct sigaction& b) noexcept {
  if (a.sa_flags != b.sa_flags) return false;
  if (std::memcmp(&a.sa_mask, &b.sa_mask, sizeof a.sa_mask) != 0) return false;
  return (a.sa_flags & SA_SIGINFO) ? a.sa_sigaction == b.sa_sigaction
                                   : a.sa_handler == b.sa_handler;
}

/// Our disposition over `prev`: the earlier handler's sa_mask and SA_NODEFER, so the kernel
/// gives the chained call the signal mask that handler asked for.
inline struct sigaction our_disposition(const struct sigaction& prev) noexcept {
  struct sigaction ours {};
  ours.sa_sigaction = &signal_handler;
  ours.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  if (calls_function(prev)) {
    ours.sa_mask = prev.sa_mask;
    ours.sa_flags |= prev.sa_flags & SA_NODEFER;
  }
  return ours;
}

/// SIG_DFL, no flags, nothing blocked: what the kernel leaves after a one-shot handler.
inline struct sigaction default_disposition() noexcept {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  return dfl;
}

/// Installs the handler on `sig` for one more notice (the first saves what was there).
inline void install_signal(int sig) {
  std::lock_guard<std::mutex> lock(signal_slot.mu);
  signal_disposition& d = signal_slot.sig[sig];
  if (d.installs > 0) {
    ++d.installs;
    return;
  }
  struct sigaction current {};
  if (::sigaction(sig, nullptr, &current) != 0)
    throw error(errno, "sigaction", "signal " + std::to_string(sig));
  // Still ours (a later handler sat on top when we last stopped): keep the saved previous.
  // Otherwise save what is there, unless it is the record we hold and that record is not a
  // used-up one-shot handler (installed again, it is armed again).
  if (!is_our_handler(current)) {
    const int i = d.current.load(std::memory_order_relaxed);
    if (!same_disposition(d.saved[i], current) || d.used_up[i].load()) {
      const int next = (i + 1) % signal_saved_ring;
      // A handler still copying that record (it loaded the index eight changes ago): it is a
      // few instructions from done.
      while (d.readers[next].load() != 0) std::this_thread::yield();
      d.saved[next] = current;
      d.used_up[next].store(false);
      d.current.store(next, std::memory_order_release);
    }
  }
  const struct sigaction ours = our_disposition(d.previous());
  if (::sigaction(sig, &ours, nullptr) != 0)
    throw error(errno, "sigaction", "signal " + std::to_string(sig));
  d.installs = 1;
}

/// Drops one notice from `sig`; the last one restores the previous disposition (SIG_DFL for a
/// one-shot handler that had its call).
inline void uninstall_signal(int sig) noexcept {
  std::lock_guard<std::mutex> lock(signal_slot.mu);
  signal_disposition& d = signal_slot.sig[sig];
  if (d.installs == 0 || --d.installs > 0) return;
  struct sigaction current {};
  if (::sigaction(sig, nullptr, &current) != 0) return;
  // Someone installed a handler over ours: leave it (it may chain to us; we are then inert).
  if (!is_our_handler(current)) return;
  const int i = d.current.load(std::memory_order_relaxed);
  const struct sigaction& prev = d.saved[i];
  const bool one_shot = (prev.sa_flags & sa_resethand) != 0;
  const struct sigaction dfl = default_disposition();
  const bool used = one_shot && d.used_up[i].load();
  ::sigaction(sig, used ? &dfl : &prev, nullptr);
  // A delivery racing with the restore may have made the one call through us just now.
  if (one_shot && !used && d.used_up[i].load()) ::sigaction(sig, &dfl, nullptr);
}

/// Claims a free listener cell, reset, notifying eventfd `wake_fd` (-1: none); -1 when all are
/// taken.
inline int acquire_signal_cell(std::uint64_t mask, int wake_fd = -1) noexcept {
  for (int i = 0; i < signal_cell_count; ++i) {
    signal_cell& c = signal_slot.cells[i];
    bool free = false;
    if (!c.in_use.compare_exchange_strong(free, true)) continue;
    c.noticed.store(false);
    c.count.store(0);
    c.signo.store(0);
    c.at_ns.store(0);
    c.wall_ns.store(0);
    c.claimed.store(0);
    c.wake.attach_fd(wake_fd);
    c.mask.store(mask, std::memory_order_release);
    return i;
  }
  return -1;
}

/// Frees a cell; on return no handler still notifies its waker.
inline void release_signal_cell(int i) noexcept {
  signal_slot.cells[i].mask.store(0, std::memory_order_release);
  signal_slot.cells[i].wake.attach_fd(-1);
  signal_slot.cells[i].in_use.store(false, std::memory_order_release);
}

}  // namespace detail

/// The time a process has left once `signal` arrived first (a signal_notice's deadline() is
/// that arrival, on the wall clock, + `left`).
struct signal_time {
  int signal;
  std::chrono::milliseconds left;
};

/// A notice from signals (SIGTERM by default): e.g. signal_notice<SIGUSR1, SIGTERM>.
template <int First = SIGTERM, int... Rest>
class signal_notice {
  static_assert(((First > 0 && First <= detail::signal_max) && ... &&
                 (Rest > 0 && Rest <= detail::signal_max)),
                "holdfast: signal_notice takes signal numbers between 1 and 64");
  static_assert(((First != SIGKILL && First != SIGSTOP) && ... &&
                 (Rest != SIGKILL && Rest != SIGSTOP)),
                "holdfast: SIGKILL and SIGSTOP cannot be caught");

 public:
  /// The signals watched, in order.
  static constexpr std::array<int, 1 + sizeof...(Rest)> signals{First, Rest...};

  /// No time left set: deadline() stays empty.
  signal_notice() noexcept = default;
  /// With the time left after each listed signal, e.g. {{SIGUSR1, 120s}, {SIGTERM, 30s}}
  /// (as set_time_left; signals not listed announce no deadline).
  explicit signal_notice(std::initializer_list<signal_time> times) {
    for (const signal_time& t : times) set_time_left(t.signal, t.left);
  }
  signal_notice(signal_notice&& o) noexcept
      : cell_(std::exchange(o.cell_, -1)),
        noticed_(o.noticed_),
        signo_(o.signo_),
        at_ns_(o.at_ns_),
        wall_ns_(o.wall_ns_),
        count_(o.count_),
        left_ms_(o.left_ms_),
        wake_fd_(std::exchange(o.wake_fd_, -1)) {}
  signal_notice& operator=(signal_notice&& o) noexcept {
    if (this != &o) {
      stop();
      cell_ = std::exchange(o.cell_, -1);
      noticed_ = o.noticed_;
      signo_ = o.signo_;
      at_ns_ = o.at_ns_;
      wall_ns_ = o.wall_ns_;
      count_ = o.count_;
      left_ms_ = o.left_ms_;
      wake_fd_ = std::exchange(o.wake_fd_, -1);
    }
    return *this;
  }
  signal_notice(const signal_notice&) = delete;
  signal_notice& operator=(const signal_notice&) = delete;
  /// Stops (restoring the previous handlers when it was the last notice on them).
  ~signal_notice() { stop(); }

  /// Sets the time left once `sig` arrived first: deadline() = its arrival + `left`. Throws
  /// holdfast::error(EINVAL) for a signal this notice does not watch or a negative time. Call
  /// before start().
  signal_notice& set_time_left(int sig, std::chrono::milliseconds left) {
    if (left.count() < 0)
      throw error(EINVAL, "signal_notice", "",
                  "negative time left for signal " + std::to_string(sig));
    bool watched = false;
    for (std::size_t i = 0; i < signals.size(); ++i) {
      if (signals[i] != sig) continue;
      left_ms_[i] = left.count();
      watched = true;
    }
    if (!watched)
      throw error(EINVAL, "signal_notice", "",
                  "signal " + std::to_string(sig) + " is not one this notice watches");
    return *this;
  }
  /// The time left set for `sig`, if any.
  std::optional<std::chrono::milliseconds> time_left(int sig) const noexcept {
    for (std::size_t i = 0; i < signals.size(); ++i)
      if (signals[i] == sig && left_ms_[i] >= 0) return std::chrono::milliseconds(left_ms_[i]);
    return std::nullopt;
  }

  /// Installs the handler on each signal (chaining to what was there). Clears an earlier notice.
  void start() {
    if (cell_ >= 0) return;
    std::uint64_t mask = 0;
    for (int s : signals) mask |= detail::signal_bit(s);
    int cell = detail::acquire_signal_cell(mask, wake_fd_);
    if (cell < 0) throw error(EMFILE, "signal_notice", "", "more than 64 started signal notices");
    noticed_ = false;
    std::size_t done = 0;
    try {
      for (; done < signals.size(); ++done) detail::install_signal(signals[done]);
    } catch (...) {
      while (done > 0) detail::uninstall_signal(signals[--done]);
      detail::release_signal_cell(cell);
      throw;
    }
    cell_ = cell;
  }
  /// Uninstalls (the last notice on a signal restores the previous handler); the outcome stays.
  void stop() noexcept {
    if (cell_ < 0) return;
    for (std::size_t i = signals.size(); i > 0; --i) detail::uninstall_signal(signals[i - 1]);
    const detail::signal_cell& c = detail::signal_slot.cells[cell_];
    noticed_ = c.noticed.load(std::memory_order_acquire);
    signo_ = c.signo.load();
    at_ns_ = c.at_ns.load();
    wall_ns_ = c.wall_ns.load();
    count_ = c.count.load();
    detail::release_signal_cell(std::exchange(cell_, -1));
  }
  /// True while the handlers are installed.
  bool running() const noexcept { return cell_ >= 0; }
  /// Notifies `w` from the signal handler on each delivery while started (nullptr detaches; on
  /// return no handler still writes to the previous waker). `w` must outlive the attachment.
  void set_waker(const detail::waker* w) noexcept {
    wake_fd_ = w ? w->fd() : -1;
    if (cell_ >= 0) detail::signal_slot.cells[cell_].wake.attach_fd(wake_fd_);
  }

  /// True once one of the signals was delivered after start().
  bool noticed() const noexcept {
    return cell_ >= 0 ? detail::signal_slot.cells[cell_].noticed.load(std::memory_order_acquire)
                      : noticed_;
  }
  /// When the first signal was caught (steady clock), if one was.
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    if (!noticed()) return std::nullopt;
    return detail::steady_from_ns(cell_ >= 0 ? detail::signal_slot.cells[cell_].at_ns.load()
                                             : at_ns_);
  }
  /// The first signal's arrival (wall clock) + the time left set for it; empty when no time is
  /// set for that signal (or before a notice).
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    const int sig = signal();
    if (sig == 0) return std::nullopt;
    const auto left = time_left(sig);
    if (!left) return std::nullopt;
    const std::int64_t wall =
        cell_ >= 0 ? detail::signal_slot.cells[cell_].wall_ns.load() : wall_ns_;
    return detail::system_from_ns(wall) + *left;
  }
  /// The first signal caught, or 0.
  int signal() const noexcept {
    if (!noticed()) return 0;
    return cell_ >= 0 ? detail::signal_slot.cells[cell_].signo.load() : signo_;
  }
  /// What fired, for the log: "signal SIGTERM" ("" before a notice).
  std::string source() const {
    const int sig = signal();
    return sig == 0 ? std::string() : "signal " + detail::signal_name(sig);
  }
  /// How many deliveries were seen since start().
  std::uint64_t count() const noexcept {
    return cell_ >= 0 ? detail::signal_slot.cells[cell_].count.load() : count_;
  }

 private:
  static constexpr std::array<std::int64_t, 1 + sizeof...(Rest)> no_times() noexcept {
    std::array<std::int64_t, 1 + sizeof...(Rest)> a{};
    for (auto& ms : a) ms = -1;
    return a;
  }

  int cell_ = -1;
  bool noticed_ = false;
  int signo_ = 0;
  std::int64_t at_ns_ = 0;
  std::int64_t wall_ns_ = 0;
  std::uint64_t count_ = 0;
  std::array<std::int64_t, 1 + sizeof...(Rest)> left_ms_ = no_times();  // per signal; -1: none
  int wake_fd_ = -1;  // the attached waker's eventfd, copied into the cell while started
};

HOLDFAST_NAMESPACE_END
