// holdfast/termination.hpp — where a preemption notice comes from, how to exit, how long the
// grace period is, and the platform presets (after TF's TerminationConfig).
//
// A Notice policy has start(), stop(), a non-blocking `bool noticed() const noexcept`,
// `noticed_at()` (steady-clock time of the notice) and `deadline()` (the wall-clock time the
// source announced the machine goes away, when it says). Sources: signal_notice<Signals...>,
// polled_notice<F>, file_notice, gce_maintenance_notice, gce_preempted_notice, aws_spot_notice,
// and any_of<N...> to combine them. An Exit policy is exit_with<Code>, no_exit, wait_then_exit
// or any callable. termination_config<Notice, Exit> adds the grace period and an optional save
// override; presets::generic, borg, borg_tpu, gce_gpu, gce_cpu, kubernetes, slurm and aws_spot
// are the platform conventions as named types. Nothing runs until start().
//
// Guarantees:
//   - The signal handler is async-signal-safe: it only touches lock-free atomics and calls
//     clock_gettime, then chains to the handler installed before it (sa_handler or SA_SIGINFO
//     form). SIG_IGN and SIG_DFL are not chained: a notice takes over the default action of its
//     signals, so a SIGTERM no longer kills the process while a signal_notice is started (that is
//     its purpose: the handler saves, then exits through the Exit policy). errno is preserved,
//     and the handler is installed with SA_RESTART, so the program's blocking calls are not
//     interrupted with EINTR by a notice.
//   - Several signal_notices (several configs) on one signal all see each delivery. The previous
//     disposition is restored when the last of them stops.
//   - The only global state is the signal-handler slot (a fixed table of 64 listener cells and
//     the saved dispositions); everything else lives in the notice objects.
//   - A polling notice runs one background thread; stop() wakes it through a condition variable
//     and cancels an HTTP request in flight, so it returns within a few tens of milliseconds.
//   - Bad input never escapes a polling thread: an exception from a poll (a malformed or
//     truncated response, a slow or unreachable server, a failed stat) counts as "no notice" and
//     is logged once per run of failures through the notice's log hook (stderr by default).
//   - Once noticed, a notice stays noticed (a polling notice stops polling).
// Caveats:
//   - noticed_at() uses CLOCK_MONOTONIC, which is std::chrono::steady_clock on Linux.
//   - At most 64 signal_notices may be started at once (start() throws EMFILE beyond that).
//   - If another library installs its own handler on the signal after a notice started and does
//     not restore ours, stop() leaves that handler in place (ours stays in its chain, inert).
//   - polled_notice<F>::stop() waits for a poll in progress; F should be short, or take a
//     `const std::atomic<bool>&` (true when stopping) and return early.
//   - Name lookup cannot be timed out: metadata URLs default to 169.254.169.254, not a name.
#pragma once

#include <signal.h>  // sigaction: the signal-handler slot
#include <sys/stat.h>
#include <time.h>  // clock_gettime: async-signal-safe time in the handler

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "detail/http.hpp"  // the cloud metadata notices
#include "detail/json.hpp"  // AWS's instance-action document
#include "error.hpp"
#include "io.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Receives one line per problem a background notice meets.
using log_fn = std::function<void(std::string_view)>;

/// The default log hook: "holdfast: <line>" on stderr.
inline void log_to_stderr(std::string_view line) noexcept {
  std::fprintf(stderr, "holdfast: %.*s\n", static_cast<int>(line.size()), line.data());
}

/// What a poll found: a notice, and the deadline it announced (if any).
struct poll_result {
  bool noticed = false;
  std::optional<std::chrono::system_clock::time_point> deadline;
  /// From a plain bool: noticed or not, no deadline.
  poll_result(bool n = false) noexcept : noticed(n) {}  // NOLINT: implicit on purpose
  /// Noticed with an announced deadline.
  poll_result(bool n, std::optional<std::chrono::system_clock::time_point> d) noexcept
      : noticed(n), deadline(d) {}
};

namespace detail {

/// CLOCK_MONOTONIC in nanoseconds (async-signal-safe).
inline std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline std::chrono::steady_clock::time_point steady_from_ns(std::int64_t ns) noexcept {
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

/// A notice's outcome, readable from any thread.
struct notice_record {
  std::atomic<bool> noticed{false};
  std::atomic<std::int64_t> at_ns{0};
  std::atomic<bool> has_deadline{false};
  std::atomic<std::int64_t> deadline_ns{0};  // system_clock, since the epoch

  void record(std::optional<std::chrono::system_clock::time_point> deadline) noexcept {
    if (noticed.load(std::memory_order_acquire)) return;
    if (deadline) {
      deadline_ns.store(
          std::chrono::duration_cast<std::chrono::nanoseconds>(deadline->time_since_epoch())
              .count());
      has_deadline.store(true);
    }
    at_ns.store(monotonic_ns());
    noticed.store(true, std::memory_order_release);
  }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    if (!noticed.load(std::memory_order_acquire)) return std::nullopt;
    return steady_from_ns(at_ns.load());
  }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    if (!noticed.load(std::memory_order_acquire) || !has_deadline.load()) return std::nullopt;
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(deadline_ns.load())));
  }
};

// ---- the signal-handler slot (the library's only global state) -------------------------------

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
  std::atomic<std::int64_t> at_ns{0};
  std::atomic<std::uint64_t> count{0};
};

inline constexpr int signal_saved_ring = 8;

/// Per signal: how many notices installed it and what was there before. The handler may still
/// be running (on another thread) when the next install saves a new previous disposition, so
/// saved dispositions go into a ring and are published by an index: a running handler keeps
/// reading the record it loaded, which is not reused until eight more changes.
struct signal_disposition {
  int installs = 0;  // under signal_table::mu
  struct sigaction saved[signal_saved_ring] {};
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

inline void chain_previous(int sig, siginfo_t* info, void* ctx) noexcept {
  const struct sigaction& prev = signal_slot.sig[sig].previous();
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, ctx);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler) {
    prev.sa_handler(sig);
  }
  // SIG_DFL, SIG_IGN: nothing. Re-raising a default SIGTERM would kill the process we are
  // here to save; the notice takes over the default action instead.
}

inline void signal_handler(int sig, siginfo_t* info, void* ctx) noexcept {
  const int saved_errno = errno;
  const std::int64_t now = monotonic_ns();
  const std::uint64_t bit = signal_bit(sig);
  for (auto& c : signal_slot.cells) {
    if (!(c.mask.load(std::memory_order_acquire) & bit)) continue;
    c.count.fetch_add(1);
    int unclaimed = 0;
    if (c.claimed.compare_exchange_strong(unclaimed, 1)) {
      c.at_ns.store(now);
      c.signo.store(sig);
      c.noticed.store(true, std::memory_order_release);
    }
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
  if (!is_our_handler(current) && !same_disposition(d.previous(), current)) {
    int next = (d.current.load(std::memory_order_relaxed) + 1) % signal_saved_ring;
    d.saved[next] = current;
    d.current.store(next, std::memory_order_release);
  }
  struct sigaction ours {};
  ours.sa_sigaction = &signal_handler;
  ours.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  if (::sigaction(sig, &ours, nullptr) != 0)
    throw error(errno, "sigaction", "signal " + std::to_string(sig));
  d.installs = 1;
}

/// Drops one notice from `sig`; the last one restores the previous disposition.
inline void uninstall_signal(int sig) noexcept {
  std::lock_guard<std::mutex> lock(signal_slot.mu);
  signal_disposition& d = signal_slot.sig[sig];
  if (d.installs == 0 || --d.installs > 0) return;
  struct sigaction current {};
  if (::sigaction(sig, nullptr, &current) != 0) return;
  // Someone installed a handler over ours: leave it (it may chain to us; we are then inert).
  if (is_our_handler(current)) ::sigaction(sig, &d.previous(), nullptr);
}

/// Claims a free listener cell, reset; -1 when all are taken.
inline int acquire_signal_cell(std::uint64_t mask) noexcept {
  for (int i = 0; i < signal_cell_count; ++i) {
    signal_cell& c = signal_slot.cells[i];
    bool free = false;
    if (!c.in_use.compare_exchange_strong(free, true)) continue;
    c.noticed.store(false);
    c.count.store(0);
    c.signo.store(0);
    c.at_ns.store(0);
    c.claimed.store(0);
    c.mask.store(mask, std::memory_order_release);
    return i;
  }
  return -1;
}

inline void release_signal_cell(int i) noexcept {
  signal_slot.cells[i].mask.store(0, std::memory_order_release);
  signal_slot.cells[i].in_use.store(false, std::memory_order_release);
}

}  // namespace detail

// ---- notice sources ----------------------------------------------------------------------------

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

  signal_notice() noexcept = default;
  signal_notice(signal_notice&& o) noexcept
      : cell_(std::exchange(o.cell_, -1)),
        noticed_(o.noticed_),
        signo_(o.signo_),
        at_ns_(o.at_ns_),
        count_(o.count_) {}
  signal_notice& operator=(signal_notice&& o) noexcept {
    if (this != &o) {
      stop();
      cell_ = std::exchange(o.cell_, -1);
      noticed_ = o.noticed_;
      signo_ = o.signo_;
      at_ns_ = o.at_ns_;
      count_ = o.count_;
    }
    return *this;
  }
  signal_notice(const signal_notice&) = delete;
  signal_notice& operator=(const signal_notice&) = delete;
  /// Stops (restoring the previous handlers when it was the last notice on them).
  ~signal_notice() { stop(); }

  /// Installs the handler on each signal (chaining to what was there). Clears an earlier notice.
  void start() {
    if (cell_ >= 0) return;
    std::uint64_t mask = 0;
    for (int s : signals) mask |= detail::signal_bit(s);
    int cell = detail::acquire_signal_cell(mask);
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
    count_ = c.count.load();
    detail::release_signal_cell(std::exchange(cell_, -1));
  }
  /// True while the handlers are installed.
  bool running() const noexcept { return cell_ >= 0; }

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
  /// Signals announce no deadline.
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    return std::nullopt;
  }
  /// The first signal caught, or 0.
  int signal() const noexcept {
    if (!noticed()) return 0;
    return cell_ >= 0 ? detail::signal_slot.cells[cell_].signo.load() : signo_;
  }
  /// How many deliveries were seen since start().
  std::uint64_t count() const noexcept {
    return cell_ >= 0 ? detail::signal_slot.cells[cell_].count.load() : count_;
  }

 private:
  int cell_ = -1;
  bool noticed_ = false;
  int signo_ = 0;
  std::int64_t at_ns_ = 0;
  std::uint64_t count_ = 0;
};

/// A notice found by calling `F` on a background thread every `interval` (1 s by default).
/// F returns bool or poll_result; it may take `const std::atomic<bool>& stopping`.
template <class F>
class polled_notice {
  static_assert(std::is_invocable_v<F&, const std::atomic<bool>&> || std::is_invocable_v<F&>,
                "holdfast: polled_notice<F> needs F() or F(const std::atomic<bool>& stopping)");

 public:
  /// Polls `poll` every `interval` (at least 1 ms) once started; failures go to `log`.
  explicit polled_notice(F poll, std::chrono::milliseconds interval = std::chrono::seconds(1),
                         log_fn log = log_to_stderr)
      : s_(std::make_unique<shared>(
            std::move(poll), std::max(interval, std::chrono::milliseconds(1)), std::move(log))) {}
  polled_notice(polled_notice&&) noexcept = default;
  polled_notice& operator=(polled_notice&& o) noexcept {
    if (this != &o) {
      stop();
      s_ = std::move(o.s_);
      thread_ = std::move(o.thread_);
    }
    return *this;
  }
  /// Stops the thread (promptly).
  ~polled_notice() { stop(); }

  /// Starts the polling thread (the first poll is immediate). No-op when running or noticed.
  void start() {
    if (thread_.joinable() || s_->rec.noticed.load()) return;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stop_requested = false;
    }
    s_->stopping.store(false);
    thread_ = std::thread([s = s_.get()] { run(*s); });
  }
  /// Wakes and joins the thread; cancels an HTTP request in flight. The outcome stays.
  void stop() noexcept {
    if (!s_ || !thread_.joinable()) return;
    s_->stopping.store(true);
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stop_requested = true;
    }
    s_->cv.notify_all();
    thread_.join();
  }
  /// True while the thread runs.
  bool running() const noexcept { return thread_.joinable(); }

  /// True once a poll found a notice.
  bool noticed() const noexcept { return s_->rec.noticed.load(std::memory_order_acquire); }
  /// When the poll that found the notice returned (steady clock).
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    return s_->rec.noticed_at();
  }
  /// The deadline the source announced, if any.
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    return s_->rec.deadline();
  }
  /// Polls completed (with or without a notice), and polls that failed.
  std::uint64_t polls() const noexcept { return s_->polls.load(); }
  std::uint64_t failures() const noexcept { return s_->failures.load(); }
  /// Replaces the log hook; call before start().
  void set_log(log_fn log) { s_->log = std::move(log); }
  /// The interval between polls.
  std::chrono::milliseconds interval() const noexcept { return s_->interval; }
  /// The poller (e.g. to read its endpoint).
  const F& poller() const noexcept { return s_->fn; }

 private:
  struct shared {
    shared(F f, std::chrono::milliseconds i, log_fn l)
        : fn(std::move(f)), interval(i), log(std::move(l)) {}
    F fn;
    std::chrono::milliseconds interval;
    log_fn log;
    std::mutex mu;
    std::condition_variable cv;
    bool stop_requested = false;  // under mu
    std::atomic<bool> stopping{false};
    detail::notice_record rec;
    std::atomic<std::uint64_t> polls{0}, failures{0};
    bool failing = false;  // polling thread only
  };

  static void fail(shared& s, const char* what) noexcept {
    s.failures.fetch_add(1);
    if (s.failing || s.stopping.load()) return;  // once per run of failures; quiet on shutdown
    s.failing = true;
    try {
      if (s.log) s.log(std::string("notice poll failed (treated as no notice): ") + what);
    } catch (...) {
    }
  }

  static bool poll_once(shared& s) noexcept {
    try {
      poll_result r;
      if constexpr (std::is_invocable_v<F&, const std::atomic<bool>&>)
        r = s.fn(static_cast<const std::atomic<bool>&>(s.stopping));
      else
        r = s.fn();
      s.polls.fetch_add(1);
      s.failing = false;
      if (r.noticed) s.rec.record(r.deadline);
      return r.noticed;
    } catch (const std::exception& e) {
      fail(s, e.what());
    } catch (...) {
      fail(s, "unknown exception");
    }
    return false;
  }

  static void run(shared& s) noexcept {
    for (;;) {
      if (poll_once(s)) return;
      std::unique_lock<std::mutex> lock(s.mu);
      if (s.cv.wait_for(lock, s.interval, [&s] { return s.stop_requested; })) return;
    }
  }

  std::unique_ptr<shared> s_;
  std::thread thread_;
};

namespace detail {
/// file_notice's poll: does the path exist?
template <class Io>
struct file_exists {
  std::string path;
  bool operator()() const {
    struct stat st {};
    if (Io::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    throw error(errno, "stat", path);
  }
};
}  // namespace detail

/// A notice when a file appears (Kubernetes preStop hooks, batch schedulers, tests).
template <class Io = posix_io>
class basic_file_notice : public polled_notice<detail::file_exists<Io>> {
 public:
  /// Watches `path`, checking every `interval` (1 s by default) with stat.
  explicit basic_file_notice(std::string path,
                             std::chrono::milliseconds interval = std::chrono::seconds(1),
                             log_fn log = log_to_stderr)
      : polled_notice<detail::file_exists<Io>>(detail::file_exists<Io>{std::move(path)}, interval,
                                               std::move(log)) {}
  /// The watched path.
  const std::string& path() const noexcept { return this->poller().path; }
};
/// file_notice over the POSIX calls.
using file_notice = basic_file_notice<>;

// ---- cloud metadata notices --------------------------------------------------------------------

/// Where and how often a cloud notice asks its metadata server.
struct cloud_notice_options {
  /// Base URL of the metadata server; "" picks the platform's (see each notice).
  std::string url;
  /// Time between polls; 0 picks the notice's default (1 s GCE, 5 s AWS).
  std::chrono::milliseconds interval{0};
  /// Connect and whole-exchange timeouts of each request.
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds read_timeout{1000};
  /// Where a failed poll is logged (once per run of failures); empty: stderr.
  log_fn log;
};

/// The GCE metadata server: $GCE_METADATA_HOST (as Google's client libraries read it), else
/// http://169.254.169.254 (the address of metadata.google.internal, without a DNS lookup).
inline std::string gce_metadata_url() {
  const char* host = std::getenv("GCE_METADATA_HOST");
  if (host && *host) {
    std::string h(host);
    return h.compare(0, 7, "http://") == 0 ? h : "http://" + h;
  }
  return "http://169.254.169.254";
}

/// The AWS instance metadata service: $AWS_EC2_METADATA_SERVICE_ENDPOINT (as the AWS SDKs read
/// it), else http://169.254.169.254.
inline std::string aws_metadata_url() {
  const char* url = std::getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (url && *url) {
    std::string u(url);
    while (!u.empty() && u.back() == '/') u.pop_back();
    return u;
  }
  return "http://169.254.169.254";
}

namespace detail {

inline std::string trim_ascii(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\n' || s.front() == '\r' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t'))
    s.remove_suffix(1);
  return std::string(s);
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
constexpr std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) noexcept {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

/// Parses an ISO 8601 / RFC 3339 time: YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM). Throws
/// format_error(source, ...) otherwise.
inline std::chrono::system_clock::time_point parse_iso8601(std::string_view s,
                                                           const std::string& source) {
  std::size_t i = 0;
  auto bad = [&](const char* why) {
    return format_error(source, "offset " + std::to_string(i) + ": " + why + " in time '" +
                                    std::string(s.substr(0, 40)) + "'");
  };
  auto num = [&](std::size_t digits) {
    int v = 0;
    for (std::size_t k = 0; k < digits; ++k, ++i) {
      if (i >= s.size() || s[i] < '0' || s[i] > '9') throw bad("expected a digit");
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  auto lit = [&](char c, char alt = '\0') {
    if (i >= s.size() || (s[i] != c && (alt == '\0' || s[i] != alt)))
      throw bad((std::string("expected '") + c + "'").c_str());
    ++i;
  };
  int year = num(4);
  lit('-');
  int month = num(2);
  lit('-');
  int day = num(2);
  lit('T', 't');
  int hour = num(2);
  lit(':');
  int minute = num(2);
  lit(':');
  int second = num(2);
  std::int64_t nanos = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    std::size_t digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (digits < 9) nanos = nanos * 10 + (s[i] - '0');
      ++digits;
      ++i;
    }
    if (digits == 0) throw bad("expected fraction digits");
    for (std::size_t k = digits; k < 9; ++k) nanos *= 10;
  }
  int offset_min = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    int sign = s[i] == '-' ? -1 : 1;
    ++i;
    int oh = num(2);
    lit(':');
    int om = num(2);
    offset_min = sign * (oh * 60 + om);
  } else {
    throw bad("expected 'Z' or an offset");
  }
  if (i != s.size()) throw bad("trailing characters");
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60)
    throw bad("field out of range");
  std::int64_t secs =
      days_from_civil(year, static_cast<unsigned>(month), static_cast<unsigned>(day)) * 86400 +
      hour * 3600 + minute * 60 + second - offset_min * 60;
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(secs) + std::chrono::nanoseconds(nanos)));
}

/// One GCE metadata value polled: noticed when it equals `expect`; other known values are
/// "no notice"; anything else throws (and is logged by the polling thread).
template <class Io>
struct gce_metadata_poll {
  http_endpoint endpoint;
  std::string path;  // the URL's path prefix, normally ""
  std::string key;   // "maintenance-event" or "preempted"
  std::string expect;
  std::vector<std::string> known;
  http_timeouts timeouts;

  std::string target() const { return path + "/computeMetadata/v1/instance/" + key; }
  poll_result operator()(const std::atomic<bool>& stopping) const {
    http_request req{"GET", target(), {{"Metadata-Flavor", "Google"}}, {}};
    http_response r = http_call<Io>(endpoint, req, timeouts, &stopping);
    const std::string where = endpoint.url() + target();
    if (r.status != 200) throw error(EPROTO, "http", where, "status " + std::to_string(r.status));
    const std::string value = trim_ascii(r.body);
    if (value == expect) return true;
    for (const auto& k : known)
      if (value == k) return false;
    throw format_error(where, "unexpected value '" + value.substr(0, 60) + "'");
  }
};

/// AWS spot interruption poll: IMDSv2 token (cached), then spot/instance-action.
template <class Io>
struct aws_spot_poll {
  http_endpoint endpoint;
  std::string path;
  http_timeouts timeouts;
  std::string token;  // polling thread only
  std::chrono::steady_clock::time_point token_expires{};

  static constexpr int token_ttl_seconds = 21600;
  static constexpr std::string_view action_key = "/latest/meta-data/spot/instance-action";

  void fetch_token(const std::atomic<bool>& stopping) {
    http_request req{"PUT",
                     path + "/latest/api/token",
                     {{"X-aws-ec2-metadata-token-ttl-seconds", std::to_string(token_ttl_seconds)}},
                     {}};
    http_response r = http_call<Io>(endpoint, req, timeouts, &stopping);
    if (r.status != 200 || r.body.empty())
      throw error(EPROTO, "http", endpoint.url() + req.target,
                  "token request answered status " + std::to_string(r.status));
    token = trim_ascii(r.body);
    token_expires = std::chrono::steady_clock::now() + std::chrono::seconds(token_ttl_seconds - 60);
  }
  http_response get_action(const std::atomic<bool>& stopping) const {
    http_request req{
        "GET", path + std::string(action_key), {{"X-aws-ec2-metadata-token", token}}, {}};
    return http_call<Io>(endpoint, req, timeouts, &stopping);
  }
  poll_result operator()(const std::atomic<bool>& stopping) {
    if (token.empty() || std::chrono::steady_clock::now() >= token_expires) fetch_token(stopping);
    http_response r = get_action(stopping);
    if (r.status == 401) {  // the token expired early (e.g. the service restarted)
      fetch_token(stopping);
      r = get_action(stopping);
    }
    const std::string where = endpoint.url() + path + std::string(action_key);
    if (r.status == 404) return false;
    if (r.status != 200) throw error(EPROTO, "http", where, "status " + std::to_string(r.status));
    json_value doc = parse_json(r.body, where);
    const json_value* action = doc.is_object() ? doc.find("action") : nullptr;
    const json_value* time = doc.is_object() ? doc.find("time") : nullptr;
    if (!action || !action->is_string() || !time || !time->is_string())
      throw format_error(where, "expected {\"action\":...,\"time\":...}");
    const std::string& a = action->as_string();
    if (a != "terminate" && a != "stop" && a != "hibernate")
      throw format_error(where, "unknown action '" + a.substr(0, 40) + "'");
    return poll_result(true, parse_iso8601(time->as_string(), where));
  }
};

inline http_endpoint endpoint_or_default(const std::string& url, const std::string& fallback,
                                         std::string& path) {
  http_endpoint ep = parse_http_url(url.empty() ? fallback : url, &path);
  while (!path.empty() && path.back() == '/') path.pop_back();
  return ep;
}

inline log_fn log_or_default(log_fn log) { return log ? std::move(log) : log_fn(log_to_stderr); }

inline std::chrono::milliseconds interval_or(std::chrono::milliseconds i,
                                             std::chrono::milliseconds fallback) {
  return i.count() > 0 ? i : fallback;
}

template <class Io>
gce_metadata_poll<Io> make_gce_poll(const cloud_notice_options& o, std::string key,
                                    std::string expect, std::vector<std::string> known) {
  gce_metadata_poll<Io> p;
  p.endpoint = endpoint_or_default(o.url, gce_metadata_url(), p.path);
  p.key = std::move(key);
  p.expect = std::move(expect);
  p.known = std::move(known);
  p.timeouts = {o.connect_timeout, o.read_timeout};
  return p;
}

}  // namespace detail

/// GCE host maintenance: `instance/maintenance-event` = TERMINATE_ON_HOST_MAINTENANCE (NONE and
/// MIGRATE_ON_HOST_MAINTENANCE are no notice). Polls every second by default.
template <class Io = posix_io>
class basic_gce_maintenance_notice : public polled_notice<detail::gce_metadata_poll<Io>> {
 public:
  explicit basic_gce_maintenance_notice(const cloud_notice_options& o = {})
      : polled_notice<detail::gce_metadata_poll<Io>>(
            detail::make_gce_poll<Io>(
                o, "maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE",
                {"NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE"}),
            detail::interval_or(o.interval, std::chrono::seconds(1)),
            detail::log_or_default(o.log)) {}
};
/// gce_maintenance_notice over the POSIX calls.
using gce_maintenance_notice = basic_gce_maintenance_notice<>;

/// GCE preemption (Spot/preemptible VMs): `instance/preempted` = TRUE. Polls every second.
template <class Io = posix_io>
class basic_gce_preempted_notice : public polled_notice<detail::gce_metadata_poll<Io>> {
 public:
  explicit basic_gce_preempted_notice(const cloud_notice_options& o = {})
      : polled_notice<detail::gce_metadata_poll<Io>>(
            detail::make_gce_poll<Io>(o, "preempted", "TRUE", {"FALSE"}),
            detail::interval_or(o.interval, std::chrono::seconds(1)),
            detail::log_or_default(o.log)) {}
};
/// gce_preempted_notice over the POSIX calls.
using gce_preempted_notice = basic_gce_preempted_notice<>;

/// AWS spot interruption: IMDSv2 token, then `spot/instance-action` (404: no notice; the
/// action's time becomes deadline()). Polls every 5 seconds by default.
template <class Io = posix_io>
class basic_aws_spot_notice : public polled_notice<detail::aws_spot_poll<Io>> {
 public:
  explicit basic_aws_spot_notice(const cloud_notice_options& o = {})
      : polled_notice<detail::aws_spot_poll<Io>>(
            make(o), detail::interval_or(o.interval, std::chrono::seconds(5)),
            detail::log_or_default(o.log)) {}

 private:
  static detail::aws_spot_poll<Io> make(const cloud_notice_options& o) {
    detail::aws_spot_poll<Io> p;
    p.endpoint = detail::endpoint_or_default(o.url, aws_metadata_url(), p.path);
    p.timeouts = {o.connect_timeout, o.read_timeout};
    return p;
  }
};
/// aws_spot_notice over the POSIX calls.
using aws_spot_notice = basic_aws_spot_notice<>;

// ---- the Notice concept and any_of -----------------------------------------------------------

namespace detail {
template <class T>
using notice_start = decltype(std::declval<T&>().start());
template <class T>
using notice_stop = decltype(std::declval<T&>().stop());
template <class T>
using notice_noticed = decltype(bool{std::declval<const T&>().noticed()});
template <class T>
using notice_at = decltype(std::optional<std::chrono::steady_clock::time_point>{
    std::declval<const T&>().noticed_at()});
template <class T>
using notice_deadline = decltype(std::optional<std::chrono::system_clock::time_point>{
    std::declval<const T&>().deadline()});
}  // namespace detail

/// True when T has the Notice interface (start, stop, noticed, noticed_at, deadline).
template <class T>
inline constexpr bool is_notice_policy_v =
    detail::detect<detail::notice_start, T>::value&& detail::detect<detail::notice_stop, T>::value&&
        detail::detect<detail::notice_noticed, T>::value&& detail::detect<
            detail::notice_at, T>::value&& detail::detect<detail::notice_deadline, T>::value;

/// Checks a Notice policy at compile time, naming the first missing member.
template <class T>
constexpr bool check_notice_policy() {
  static_assert(detail::detect<detail::notice_start, T>::value,
                "holdfast: a Notice policy needs void start()");
  static_assert(detail::detect<detail::notice_stop, T>::value,
                "holdfast: a Notice policy needs void stop()");
  static_assert(detail::detect<detail::notice_noticed, T>::value,
                "holdfast: a Notice policy needs bool noticed() const noexcept");
  static_assert(detail::detect<detail::notice_at, T>::value,
                "holdfast: a Notice policy needs "
                "std::optional<steady_clock::time_point> noticed_at() const");
  static_assert(detail::detect<detail::notice_deadline, T>::value,
                "holdfast: a Notice policy needs "
                "std::optional<system_clock::time_point> deadline() const");
  return true;
}

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_notice_policy_v.
template <class T>
concept notice_policy = is_notice_policy_v<T>;
#endif

/// Noticed when any of its sources is: the earliest notice time and the earliest deadline.
template <class... N>
class any_of {
  static_assert(sizeof...(N) > 0, "holdfast: any_of needs at least one notice source");
  static_assert((check_notice_policy<N>() && ...));

 public:
  any_of() = default;
  /// Combines these sources (moved in).
  explicit any_of(N... sources) : n_(std::move(sources)...) {}

  /// Starts every source; if one fails, the ones started are stopped and the error rethrown.
  void start() { start_from<0>(); }
  /// Stops every source (last first).
  void stop() noexcept { stop_before<sizeof...(N)>(); }
  bool noticed() const noexcept {
    return std::apply([](const auto&... n) { return (n.noticed() || ...); }, n_);
  }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    std::optional<std::chrono::steady_clock::time_point> best;
    std::apply([&best](const auto&... n) { (earliest(best, n.noticed_at()), ...); }, n_);
    return best;
  }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    std::optional<std::chrono::system_clock::time_point> best;
    std::apply([&best](const auto&... n) { (earliest(best, n.deadline()), ...); }, n_);
    return best;
  }
  /// The I-th source.
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(n_);
  }
  template <std::size_t I>
  const auto& get() const noexcept {
    return std::get<I>(n_);
  }

 private:
  template <class T>
  static void earliest(std::optional<T>& best, const std::optional<T>& t) noexcept {
    if (t && (!best || *t < *best)) best = t;
  }
  template <std::size_t I>
  void start_from() {
    if constexpr (I < sizeof...(N)) {
      std::get<I>(n_).start();
      try {
        start_from<I + 1>();
      } catch (...) {
        std::get<I>(n_).stop();
        throw;
      }
    }
  }
  template <std::size_t I>
  void stop_before() noexcept {
    if constexpr (I > 0) {
      std::get<I - 1>(n_).stop();
      stop_before<I - 1>();
    }
  }

  std::tuple<N...> n_;
};

// ---- exit policies -----------------------------------------------------------------------------

/// What an exit policy is told: when the notice came, how long the checkpoint took.
struct exit_context {
  std::optional<std::chrono::steady_clock::time_point> noticed_at;
  std::chrono::nanoseconds checkpoint_duration{0};
};

/// Exits the process with `Code` after flushing stdio. It calls _Exit, not exit: static
/// destructors would run while the program's other threads (data loaders, collectives, our own
/// pollers) still use what they destroy, and the checkpoint is already durable. Use a callable
/// exit policy to run cleanup first.
template <int Code>
struct exit_with {
  static_assert(Code >= 0 && Code <= 255, "holdfast: exit codes are 0..255");
  /// The process exit status.
  static constexpr int code = Code;
  /// Never returns.
  static constexpr bool returns = false;
  [[noreturn]] void operator()(const exit_context& = {}) const noexcept {
    std::fflush(nullptr);
    std::_Exit(Code);
  }
};

/// Does not exit: the handler returns a status instead, for in-process restarts.
struct no_exit {
  static constexpr int code = -1;
  static constexpr bool returns = true;
  void operator()(const exit_context& = {}) const noexcept {}
};

/// Waits out a notice window less the measured checkpoint time, then exits with `Code`
/// (Borg TPU: exiting early gets the job rescheduled onto the slice still being drained). The
/// wait is `WindowMs - checkpoint_duration` from the call, never past noticed_at + WindowMs.
template <int Code, long long WindowMs>
struct wait_then_exit {
  static_assert(Code >= 0 && Code <= 255, "holdfast: exit codes are 0..255");
  static_assert(WindowMs >= 0, "holdfast: the window cannot be negative");
  static constexpr int code = Code;
  static constexpr bool returns = false;
  /// The notice window.
  static constexpr std::chrono::milliseconds window{WindowMs};
  [[noreturn]] void operator()(const exit_context& ctx = {}) const noexcept {
    auto now = std::chrono::steady_clock::now();
    auto until = now + window - ctx.checkpoint_duration;
    if (ctx.noticed_at && *ctx.noticed_at + window < until) until = *ctx.noticed_at + window;
    std::this_thread::sleep_until(until);
    std::fflush(nullptr);
    std::_Exit(Code);
  }
};

/// The exit code an Exit policy announces (`Exit::code`), or -1 for a callable.
template <class Exit, class = void>
struct exit_code_of : std::integral_constant<int, -1> {};
template <class Exit>
struct exit_code_of<Exit, std::void_t<decltype(Exit::code)>>
    : std::integral_constant<int, Exit::code> {};

/// Whether an Exit policy may return (`Exit::returns`); true for a plain callable.
template <class Exit, class = void>
struct exit_returns : std::true_type {};
template <class Exit>
struct exit_returns<Exit, std::void_t<decltype(Exit::returns)>>
    : std::bool_constant<Exit::returns> {};

/// Calls an Exit policy with the context if it takes one, else with no arguments.
template <class Exit>
void invoke_exit(Exit& exit, const exit_context& ctx) {
  static_assert(std::is_invocable_v<Exit&, const exit_context&> || std::is_invocable_v<Exit&>,
                "holdfast: an Exit policy is callable as exit(const exit_context&) or exit()");
  if constexpr (std::is_invocable_v<Exit&, const exit_context&>)
    exit(ctx);
  else
    exit();
}

// ---- termination_config ------------------------------------------------------------------------

/// Where the notice comes from, how to exit, the grace period, and an optional save override
/// (TF's TerminationConfig). The handler (handler.hpp) consumes it.
template <class Notice = signal_notice<>, class Exit = exit_with<42>>
class termination_config {
  static_assert(check_notice_policy<Notice>());

 public:
  using notice_type = Notice;
  using exit_type = Exit;
  /// A save override: called with the agreed step instead of the default checkpoint.
  using save_fn = std::function<void(std::int64_t step)>;
  /// The exit code, or -1 when the Exit policy does not announce one.
  static constexpr int exit_code = exit_code_of<Exit>::value;

  explicit termination_config(Notice notice = Notice(), Exit exit = Exit(),
                              std::chrono::milliseconds grace = std::chrono::milliseconds(0),
                              save_fn save = {})
      : notice_(std::move(notice)), exit_(std::move(exit)), grace_(grace), save_(std::move(save)) {}

  /// The notice source.
  Notice& notice() noexcept { return notice_; }
  const Notice& notice() const noexcept { return notice_; }
  /// The exit policy.
  Exit& exit_policy() noexcept { return exit_; }
  const Exit& exit_policy() const noexcept { return exit_; }
  /// How long training may go on after the notice (0: save at the next agreed step and exit).
  std::chrono::milliseconds grace_period() const noexcept { return grace_; }
  termination_config& set_grace_period(std::chrono::milliseconds g) noexcept {
    grace_ = g;
    return *this;
  }
  /// The save override, if set.
  const save_fn& save_override() const noexcept { return save_; }
  bool has_save_override() const noexcept { return static_cast<bool>(save_); }
  termination_config& set_save_override(save_fn f) {
    save_ = std::move(f);
    return *this;
  }

  /// Starts and stops the notice source.
  void start() { notice_.start(); }
  void stop() noexcept { notice_.stop(); }
  bool noticed() const noexcept { return notice_.noticed(); }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const noexcept {
    return notice_.noticed_at();
  }
  std::optional<std::chrono::system_clock::time_point> announced_deadline() const noexcept {
    return notice_.deadline();
  }
  /// When the grace period ends: noticed_at + grace, but no later than the announced deadline.
  std::optional<std::chrono::steady_clock::time_point> grace_deadline() const noexcept {
    auto at = notice_.noticed_at();
    if (!at) return std::nullopt;
    auto end = *at + grace_;
    if (auto d = notice_.deadline()) {
      auto left = *d - std::chrono::system_clock::now();
      auto capped = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
      if (capped < end) end = capped;
    }
    return end;
  }
  /// Runs the exit policy. Returns only when it does (no_exit, or a callable that returns).
  void exit(const exit_context& ctx) { invoke_exit(exit_, ctx); }
  void exit() { invoke_exit(exit_, exit_context{notice_.noticed_at(), {}}); }

 private:
  Notice notice_;
  Exit exit_;
  std::chrono::milliseconds grace_;
  save_fn save_;
};

// ---- presets -----------------------------------------------------------------------------------

/// The platform conventions as named types (the values of TF's presets and the schedulers').
namespace presets {

/// Anywhere else: SIGTERM, exit 42, no grace. 42 is a code no crash or signal produces
/// (crashes give 1, signals 128 + n), so a restart policy or wrapper script can tell "saved and
/// stopped for a preemption" from a failure; TF's generic preset uses the same code.
struct generic : termination_config<signal_notice<SIGTERM>, exit_with<42>> {
  static constexpr const char* name = "generic";
  static constexpr std::chrono::seconds default_grace{0};
  generic() : termination_config(signal_notice<SIGTERM>(), exit_with<42>(), default_grace) {}
};

/// Borg: SIGTERM, exit 42 (TF's Borg preset: the code Borg's restart policy reads as
/// "preempted, restart me" rather than a task failure), no grace.
struct borg : termination_config<signal_notice<SIGTERM>, exit_with<42>> {
  static constexpr const char* name = "borg";
  static constexpr std::chrono::seconds default_grace{0};
  borg() : termination_config(signal_notice<SIGTERM>(), exit_with<42>(), default_grace) {}
};

/// Borg TPU: SIGTERM; exit 42 as on Borg, but only after waiting out the 900 s notice window
/// less the measured checkpoint time, as TF's Borg TPU exit function does (the worker keeps its
/// TPU slice for the window rather than exiting into a restart that cannot start yet); no grace.
struct borg_tpu : termination_config<signal_notice<SIGTERM>, wait_then_exit<42, 900000>> {
  static constexpr const char* name = "borg_tpu";
  static constexpr std::chrono::seconds default_grace{0};
  static constexpr std::chrono::seconds notice_window{900};
  borg_tpu()
      : termination_config(signal_notice<SIGTERM>(), wait_then_exit<42, 900000>(), default_grace) {}
};

/// GCE with GPUs: maintenance-event poll; exit 143 (TF's GCE code, 128 + SIGTERM: the status
/// of a process ended by the platform's SIGTERM, so supervisors such as systemd, managed
/// instance groups and job wrappers treat it as a termination, not an application error);
/// 3600 s grace (GCE announces maintenance of GPU hosts an hour ahead: keep training meanwhile).
struct gce_gpu : termination_config<gce_maintenance_notice, exit_with<143>> {
  static constexpr const char* name = "gce_gpu";
  static constexpr std::chrono::seconds default_grace{3600};
  explicit gce_gpu(const cloud_notice_options& o = {})
      : termination_config(gce_maintenance_notice(o), exit_with<143>(), default_grace) {}
};

/// GCE without GPUs: maintenance-event poll; exit 143 (as gce_gpu); no grace (CPU VMs get
/// about 60 s notice before a terminating maintenance: save at once).
struct gce_cpu : termination_config<gce_maintenance_notice, exit_with<143>> {
  static constexpr const char* name = "gce_cpu";
  static constexpr std::chrono::seconds default_grace{0};
  explicit gce_cpu(const cloud_notice_options& o = {})
      : termination_config(gce_maintenance_notice(o), exit_with<143>(), default_grace) {}
};

/// Kubernetes: SIGTERM; exit 143 (128 + SIGTERM, what the kubelet expects from a pod told to
/// stop; the Job/Deployment controller restarts it); grace = terminationGracePeriodSeconds
/// (default 30 s) — pass your pod's value.
struct kubernetes : termination_config<signal_notice<SIGTERM>, exit_with<143>> {
  static constexpr const char* name = "kubernetes";
  static constexpr std::chrono::seconds default_grace{30};
  explicit kubernetes(std::chrono::seconds grace = default_grace)
      : termination_config(signal_notice<SIGTERM>(), exit_with<143>(), grace) {}
};

/// Slurm: SIGUSR1 (from `--signal=B:USR1@120`, 120 s before the time limit) or SIGTERM
/// (preemption); exit 143; 120 s grace. Requeueing is the scheduler's: submit with `--requeue`
/// (and `--open-mode=append`) so the job comes back after the exit.
struct slurm : termination_config<signal_notice<SIGUSR1, SIGTERM>, exit_with<143>> {
  static constexpr const char* name = "slurm";
  static constexpr std::chrono::seconds default_grace{120};
  explicit slurm(std::chrono::seconds grace = default_grace)
      : termination_config(signal_notice<SIGUSR1, SIGTERM>(), exit_with<143>(), grace) {}
};

/// AWS spot: poll spot/instance-action every 5 s; exit 143 (as on GCE); grace up to the
/// deadline in the notice (two minutes; grace_deadline() is capped by the announced time).
struct aws_spot : termination_config<aws_spot_notice, exit_with<143>> {
  static constexpr const char* name = "aws_spot";
  static constexpr std::chrono::seconds default_grace{120};
  explicit aws_spot(const cloud_notice_options& o = {})
      : termination_config(aws_spot_notice(o), exit_with<143>(), default_grace) {}
};

}  // namespace presets

// ---- run-time platform detection ---------------------------------------------------------------

/// Platforms detect_platform() can tell apart.
enum class platform { generic, kubernetes, slurm, gce };

/// "generic", "kubernetes", "slurm", "gce".
inline const char* to_string(platform p) noexcept {
  switch (p) {
    case platform::kubernetes:
      return "kubernetes";
    case platform::slurm:
      return "slurm";
    case platform::gce:
      return "gce";
    case platform::generic:
      break;
  }
  return "generic";
}

/// How detect_platform() looks.
struct detect_options {
  /// The GCE metadata server; "" = gce_metadata_url().
  std::string gce_url;
  /// How long to wait for it (connect and answer).
  std::chrono::milliseconds timeout{300};
  /// Reads the environment; empty = std::getenv.
  std::function<const char*(const char*)> getenv;
};

/// Reads environment markers: KUBERNETES_SERVICE_HOST → kubernetes, SLURM_JOB_ID → slurm, a GCE
/// metadata server answering with `Metadata-Flavor: Google` within the timeout → gce, else
/// generic. The compile-time presets remain the primary path.
template <class Io = posix_io>
platform detect_platform(const detect_options& o = {}) {
  auto env = [&o](const char* name) -> bool {
    const char* v = o.getenv ? o.getenv(name) : std::getenv(name);
    return v && *v;
  };
  if (env("KUBERNETES_SERVICE_HOST")) return platform::kubernetes;
  if (env("SLURM_JOB_ID")) return platform::slurm;
  try {
    std::string path;
    auto ep = detail::parse_http_url(o.gce_url.empty() ? gce_metadata_url() : o.gce_url, &path);
    while (!path.empty() && path.back() == '/') path.pop_back();
    detail::http_request req{
        "GET", path + "/computeMetadata/v1/", {{"Metadata-Flavor", "Google"}}, {}};
    auto r = detail::http_call<Io>(ep, req, {o.timeout, o.timeout});
    const std::string* flavor = r.header("Metadata-Flavor");
    if (r.status == 200 && flavor && *flavor == "Google") return platform::gce;
  } catch (const std::exception&) {
    // unreachable, slow or not a metadata server: not GCE
  }
  return platform::generic;
}

/// Calls `f` with the preset for `p` (gce: gce_gpu when `gpus`, else gce_cpu), for run-time
/// choice: `visit_preset(detect_platform(), [](auto preset) { ... })`. Every call of `f` must
/// return the same type.
template <class F>
decltype(auto) visit_preset(platform p, F&& f, bool gpus = false) {
  switch (p) {
    case platform::kubernetes:
      return std::forward<F>(f)(presets::kubernetes());
    case platform::slurm:
      return std::forward<F>(f)(presets::slurm());
    case platform::gce:
      if (gpus) return std::forward<F>(f)(presets::gce_gpu());
      return std::forward<F>(f)(presets::gce_cpu());
    case platform::generic:
      break;
  }
  return std::forward<F>(f)(presets::generic());
}

HOLDFAST_NAMESPACE_END
