// Wake-up descriptors: detail::waker (eventfd notify/drain), notice sources that notify it the
// moment they notice (from a real signal handler, from a polling thread), detaching (also while
// signals fly, with the descriptor number reused), and the traits that tell a watcher whether it
// may sleep in poll() alone.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>  // gettid
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <holdfast/detail/waker.hpp>
#include <holdfast/termination.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "support/child.hpp"
#include "support/http_server.hpp"
#include "support/sanitizers.hpp"
#include "support/scoped_disposition.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

using namespace std::chrono_literals;
using holdfast::signal_notice;
using holdfast::detail::waker;
using holdfast_test::scoped_disposition;  // SIG_IGN under a notice: a late delivery is dropped
using steady = std::chrono::steady_clock;

namespace {

// poll() for POLLIN on `fd` for up to `timeout`, through EINTR: 1 readable, 0 timed out.
int wait_readable(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = steady::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(deadline - steady::now(), steady::duration::zero()));
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n >= 0) return n > 0 && (p.revents & POLLIN) ? 1 : 0;
    if (errno != EINTR) return -1;
  }
}

bool readable_now(int fd) { return wait_readable(fd, 0ms) == 1; }

template <class P>
bool eventually(P pred, std::chrono::milliseconds timeout = 5000ms) {
  const auto deadline = steady::now() + timeout;
  while (!pred()) {
    if (steady::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

double ms_between(steady::time_point a, steady::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A thread blocked in poll() on a waker's descriptor (for up to `timeout`); it records when
// poll() returned. Constructed once the thread is observed asleep in poll(), not assumed to be.
class blocked_poller {
 public:
  static constexpr auto timeout = 10000ms;

  explicit blocked_poller(int fd)
      : thread_([this, fd] {
          tid_.store(static_cast<pid_t>(::syscall(SYS_gettid)));
          woke_.store(wait_readable(fd, timeout) == 1);
          at_ = steady::now();
          done_.store(true);
        }) {
    while (tid_.load() == 0) std::this_thread::yield();
    asleep_ = holdfast_test::wait_asleep_in_poll({tid_.load()}, timeout / 2);
  }
  /// Whether the thread was seen asleep in poll() before the constructor returned.
  bool was_asleep() const { return asleep_; }
  ~blocked_poller() {
    if (thread_.joinable()) thread_.join();
  }
  blocked_poller(const blocked_poller&) = delete;
  blocked_poller& operator=(const blocked_poller&) = delete;

  /// Joins; true when poll() saw the descriptor readable (not a timeout).
  bool woke() {
    if (thread_.joinable()) thread_.join();
    return woke_.load();
  }
  bool done() const { return done_.load(); }
  /// When poll() returned (valid after woke()).
  steady::time_point at() const { return at_; }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> woke_{false}, done_{false};
  bool asleep_ = false;
  steady::time_point at_{};
  std::thread thread_;
};

// A notice that notices only when asked (no thread of its own): it cannot wake anyone.
struct asked_notice {
  std::atomic<bool>* flag = nullptr;
  void start() {}
  void stop() noexcept {}
  bool noticed() const noexcept { return flag && flag->load(); }
  std::optional<steady::time_point> noticed_at() const noexcept { return std::nullopt; }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    return std::nullopt;
  }
};

struct flag_poll {
  std::atomic<bool>* flag;
  bool operator()() const { return flag->load(); }
};

// A Config of its own that meets the handler's contract but has no set_waker.
struct plain_config {
  using exit_type = holdfast::no_exit;
  void start() {}
  void stop() noexcept {}
  bool noticed() const noexcept { return false; }
  std::optional<steady::time_point> noticed_at() const noexcept { return std::nullopt; }
  std::optional<std::chrono::system_clock::time_point> announced_deadline() const noexcept {
    return std::nullopt;
  }
};

}  // namespace

// ---- the traits ------------------------------------------------------------------------------

TEST_CASE("traits: which sources and configs wake on notice") {
  using holdfast::any_of;
  using holdfast::has_notice_waker_v;
  using holdfast::termination_config;
  namespace p = holdfast::presets;
  // Sources that notice on their own (a signal handler, a polling thread) wake.
  static_assert(has_notice_waker_v<signal_notice<>>);
  static_assert(has_notice_waker_v<signal_notice<SIGUSR1, SIGTERM>>);
  static_assert(has_notice_waker_v<holdfast::polled_notice<flag_poll>>);
  static_assert(has_notice_waker_v<holdfast::file_notice>);
  static_assert(has_notice_waker_v<holdfast::gce_maintenance_notice>);
  static_assert(has_notice_waker_v<holdfast::gce_preempted_notice>);
  static_assert(has_notice_waker_v<holdfast::aws_spot_notice>);
  // A source asked only through noticed() does not; nor does an any_of that holds one.
  static_assert(!has_notice_waker_v<asked_notice>);
  static_assert(!holdfast::detail::can_set_waker_v<asked_notice>);
  static_assert(has_notice_waker_v<any_of<signal_notice<>, holdfast::file_notice>>);
  static_assert(any_of<signal_notice<>, holdfast::file_notice>::wakes_on_notice);
  static_assert(!has_notice_waker_v<any_of<signal_notice<>, asked_notice>>);
  static_assert(!any_of<signal_notice<>, asked_notice>::wakes_on_notice);
  static_assert(holdfast::detail::can_set_waker_v<any_of<signal_notice<>, asked_notice>>);
  static_assert(!has_notice_waker_v<any_of<any_of<asked_notice>, signal_notice<>>>);
  // Configs: wakes_on_notice follows the Notice; presets and with_exit's configs have it.
  static_assert(termination_config<>::wakes_on_notice);
  static_assert(has_notice_waker_v<termination_config<>>);
  static_assert(termination_config<holdfast::file_notice>::wakes_on_notice);
  static_assert(!termination_config<asked_notice>::wakes_on_notice);
  static_assert(!has_notice_waker_v<termination_config<asked_notice>>);
  static_assert(!termination_config<any_of<signal_notice<>, asked_notice>>::wakes_on_notice);
  static_assert(p::generic::wakes_on_notice && p::borg::wakes_on_notice &&
                p::borg_tpu::wakes_on_notice && p::gce_gpu::wakes_on_notice &&
                p::gce_cpu::wakes_on_notice && p::kubernetes::wakes_on_notice &&
                p::slurm::wakes_on_notice && p::aws_spot::wakes_on_notice);
  static_assert(has_notice_waker_v<p::slurm> && has_notice_waker_v<p::aws_spot>);
  using rebound = holdfast::rebind_exit_t<p::kubernetes, holdfast::no_exit>;
  static_assert(rebound::wakes_on_notice && has_notice_waker_v<rebound>);
  using with_exit_t =
      decltype(holdfast::with_exit(std::declval<p::slurm>(), std::declval<holdfast::no_exit>()));
  static_assert(with_exit_t::wakes_on_notice);
  // A Config without set_waker answers false.
  static_assert(!has_notice_waker_v<plain_config>);
  CHECK(true);
}

// ---- the waker itself ------------------------------------------------------------------------

TEST_CASE("waker: notify makes the fd readable, drain resets it") {
  waker w;
  REQUIRE(w.fd() >= 0);
  CHECK((::fcntl(w.fd(), F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(w.fd(), F_GETFD) & FD_CLOEXEC) != 0);
  CHECK_FALSE(readable_now(w.fd()));
  CHECK_FALSE(w.drain());
  w.notify();
  CHECK(readable_now(w.fd()));
  CHECK(w.drain());
  CHECK_FALSE(readable_now(w.fd()));
  CHECK_FALSE(w.drain());
  for (int i = 0; i < 3; ++i) w.notify();  // several notifies are one wake-up
  CHECK(w.drain());
  CHECK_FALSE(w.drain());
}

TEST_CASE("waker: notify preserves errno and never blocks on a saturated counter") {
  waker w;
  errno = ENOSPC;
  w.notify();
  CHECK(errno == ENOSPC);
  // The counter's maximum is 2^64 - 2: one more write would block, so it fails with EAGAIN.
  const std::uint64_t most = UINT64_MAX - 1 - 1;  // leave room for exactly one notify
  REQUIRE(::write(w.fd(), &most, sizeof most) == static_cast<ssize_t>(sizeof most));
  const auto t0 = steady::now();
  errno = EDOM;
  w.notify();  // fills it
  w.notify();  // EAGAIN, dropped
  CHECK(errno == EDOM);
  CHECK(ms_between(t0, steady::now()) < 2000);  // a blocking write would never return
  CHECK(readable_now(w.fd()));
  CHECK(w.drain());
  CHECK_FALSE(readable_now(w.fd()));
}

TEST_CASE("waker: a failing eventfd throws holdfast::error naming eventfd") {
  holdfast_test::child c([] {
    // UBSan's vptr check opens /proc/self/maps the first time it meets a dynamic type: let it
    // meet error_category (holdfast::error's constructor uses it) while descriptors remain, and
    // look at the exception only once the limit is back.
    CHILD_REQUIRE(holdfast::error(EMFILE, "eventfd", "").code().message() != "");
    rlimit saved{};
    CHILD_REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    rlimit none = saved;
    none.rlim_cur = 0;  // no new descriptor at all
    CHILD_REQUIRE(::setrlimit(RLIMIT_NOFILE, &none) == 0);
    bool threw = false;
    try {
      waker w;
      ::setrlimit(RLIMIT_NOFILE, &saved);
    } catch (const holdfast::error& e) {
      ::setrlimit(RLIMIT_NOFILE, &saved);
      threw = true;
      CHILD_REQUIRE(e.code().value() == EMFILE);
      CHILD_REQUIRE(std::string(e.what()).find("eventfd") != std::string::npos);
    }
    CHILD_REQUIRE(threw);
  });
  auto r = c.wait(10s);
  INFO(r.failures);
  CHECK(r.ok());
}

// ---- one contract, every waking source -------------------------------------------------------

namespace {

// Each fixture makes a source (or a Config) that wakes, and can trigger its notice; `within` is
// how long a wake may take after trigger(): a raised signal's handler notifies before raise()
// returns, so 0 (readable at once, no clock involved); a polling source up to its interval,
// given a bound of 100 to 200 intervals.
struct signal_fixture {
  using notice_type = signal_notice<SIGUSR1>;
  static constexpr auto within = 0ms;
  scoped_disposition ign{SIGUSR1, SIG_IGN};
  notice_type make() { return notice_type(); }
  void trigger() { ::raise(SIGUSR1); }
};

struct two_signal_fixture {
  using notice_type = signal_notice<SIGUSR2, SIGUSR1>;
  static constexpr auto within = 0ms;
  scoped_disposition ign1{SIGUSR1, SIG_IGN}, ign2{SIGUSR2, SIG_IGN};
  notice_type make() { return notice_type(); }
  void trigger() { ::raise(SIGUSR1); }
};

struct polled_fixture {
  using notice_type = holdfast::polled_notice<flag_poll>;
  static constexpr auto within = 1000ms;
  std::atomic<bool> flag{false};
  notice_type make() { return notice_type(flag_poll{&flag}, 5ms); }
  void trigger() { flag = true; }
};

struct file_fixture {
  using notice_type = holdfast::file_notice;
  static constexpr auto within = 1000ms;
  holdfast_test::temp_dir dir{"waker"};
  notice_type make() { return notice_type(dir / "preempt", 5ms); }
  void trigger() {
    ::close(::open((dir / "preempt").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  }
};

struct gce_preempted_fixture {
  using notice_type = holdfast::gce_preempted_notice;
  static constexpr auto within = 2000ms;
  std::atomic<bool> on{false};
  holdfast_test::http_server srv{[this](const holdfast_test::seen_request&) {
    return holdfast_test::reply(200, on.load() ? "TRUE" : "FALSE");
  }};
  notice_type make() {
    holdfast::cloud_notice_options o;
    o.url = srv.url();
    o.interval = 10ms;
    o.log = [](std::string_view) {};
    return notice_type(o);
  }
  void trigger() { on = true; }
};

struct any_of_fixture {
  using notice_type = holdfast::any_of<signal_notice<SIGUSR1>, holdfast::file_notice>;
  static constexpr auto within = 1000ms;
  holdfast_test::temp_dir dir{"waker"};
  scoped_disposition ign{SIGUSR1, SIG_IGN};
  notice_type make() {
    return notice_type(signal_notice<SIGUSR1>(), holdfast::file_notice(dir / "preempt", 5ms));
  }
  // The second source: the signal one is covered by config_fixture and the mixed any_of test.
  void trigger() {
    ::close(::open((dir / "preempt").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  }
};

struct config_fixture {
  using notice_type = holdfast::termination_config<signal_notice<SIGUSR1>, holdfast::no_exit>;
  static constexpr auto within = 0ms;
  scoped_disposition ign{SIGUSR1, SIG_IGN};
  notice_type make() { return notice_type(); }
  void trigger() { ::raise(SIGUSR1); }
};

struct preset_fixture {
  using notice_type = holdfast::rebind_exit_t<holdfast::presets::slurm, holdfast::no_exit>;
  static constexpr auto within = 0ms;
  scoped_disposition ign1{SIGUSR1, SIG_IGN}, ign2{SIGTERM, SIG_IGN};
  notice_type make() {
    return holdfast::with_exit(holdfast::presets::slurm(), holdfast::no_exit{});
  }
  void trigger() { ::raise(SIGTERM); }
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("waker contract", F, waker_contract) {
  static_assert(holdfast::has_notice_waker_v<typename F::notice_type>);
  F f;
  waker w;

  SUBCASE("attached before start: the notice wakes the waker, once recorded") {
    auto n = f.make();
    n.set_waker(&w);
    n.start();
    CHECK(wait_readable(w.fd(), 30ms) == 0);  // no notice, no wake
    const auto t0 = steady::now();
    f.trigger();
    REQUIRE(wait_readable(w.fd(), F::within) == 1);  // the bound is poll()'s timeout
    MESSAGE("trigger -> readable: " << ms_between(t0, steady::now()) << " ms");
    CHECK(n.noticed());  // recorded before the wake
    CHECK(w.drain());
    CHECK_FALSE(w.drain());
    n.stop();
    n.set_waker(nullptr);
  }
  SUBCASE("attached after start") {
    auto n = f.make();
    n.start();
    n.set_waker(&w);
    f.trigger();
    REQUIRE(wait_readable(w.fd(), F::within) == 1);
    CHECK(n.noticed());
    CHECK(w.drain());
    n.set_waker(nullptr);
    n.stop();
  }
  SUBCASE("detached: noticed, but no wake") {
    auto n = f.make();
    n.set_waker(&w);
    n.start();
    n.set_waker(nullptr);
    f.trigger();
    CHECK(eventually([&] { return n.noticed(); }));
    CHECK(wait_readable(w.fd(), 30ms) == 0);
    CHECK_FALSE(w.drain());
    n.stop();
  }
  SUBCASE("a moved source keeps its waker") {
    auto a = f.make();
    a.set_waker(&w);
    auto n = std::move(a);
    n.start();
    f.trigger();
    REQUIRE(wait_readable(w.fd(), F::within) == 1);
    CHECK(n.noticed());
    n.stop();
    n.set_waker(nullptr);
  }
}

TEST_CASE_TEMPLATE_INVOKE(waker_contract, signal_fixture, two_signal_fixture, polled_fixture,
                          file_fixture, gce_preempted_fixture, any_of_fixture, config_fixture,
                          preset_fixture);

// ---- signals from elsewhere ------------------------------------------------------------------

TEST_CASE("a signal sent to the process wakes a thread blocked in poll, well before its timeout") {
  scoped_disposition ign(SIGUSR1, SIG_IGN);
  waker w;
  signal_notice<SIGUSR1> n;
  n.set_waker(&w);
  n.start();
  blocked_poller poller(w.fd());
  REQUIRE(poller.was_asleep());
  CHECK_FALSE(poller.done());
  const auto sent = steady::now();
  REQUIRE(::kill(::getpid(), SIGUSR1) == 0);  // any thread may take it, the poller too
  REQUIRE(poller.woke());
  const double ms = ms_between(sent, poller.at());
  MESSAGE("kill -> poll() returned: " << ms << " ms");
  CHECK(ms < 2000);  // woken, not timed out (10 s): a fifth of the timeout tells them apart
  CHECK(n.noticed());
  CHECK(w.drain());
  n.stop();
  n.set_waker(nullptr);
}

TEST_CASE(
    "pthread_kill on a third thread wakes a thread blocked in poll, well before its timeout") {
  scoped_disposition ign(SIGUSR1, SIG_IGN);
  waker w;
  signal_notice<SIGUSR1> n;
  n.start();
  n.set_waker(&w);
  std::atomic<bool> quit{false};
  std::thread target([&] {
    while (!quit.load()) std::this_thread::sleep_for(1ms);
  });
  blocked_poller poller(w.fd());
  REQUIRE(poller.was_asleep());
  const auto sent = steady::now();
  REQUIRE(::pthread_kill(target.native_handle(), SIGUSR1) == 0);
  const bool woke = poller.woke();
  quit = true;
  target.join();
  REQUIRE(woke);
  const double ms = ms_between(sent, poller.at());
  MESSAGE("pthread_kill -> poll() returned: " << ms << " ms");
  CHECK(ms < 2000);  // woken, not timed out (10 s)
  CHECK(n.noticed());
  CHECK(n.signal() == SIGUSR1);
  n.set_waker(nullptr);
  n.stop();
}

TEST_CASE("a file that appears wakes a thread blocked in poll, after one poll interval") {
  holdfast_test::temp_dir dir("waker");
  waker w;
  holdfast::file_notice n(dir / "preempt", 10ms);
  n.set_waker(&w);
  n.start();
  blocked_poller poller(w.fd());
  REQUIRE(poller.was_asleep());
  const auto created = steady::now();
  ::close(::open((dir / "preempt").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  REQUIRE(poller.woke());
  const double ms = ms_between(created, poller.at());
  MESSAGE("file created -> poll() returned: " << ms << " ms (interval 10 ms)");
  CHECK(ms < 2000);  // woken, not the poller's 10 s timeout: a fifth of it tells them apart
  CHECK(n.noticed());
  CHECK(*n.noticed_at() >= created);
  CHECK(w.drain());
  n.set_waker(nullptr);
}

// ---- attachments ------------------------------------------------------------------------------

TEST_CASE("signal_notice: the waker stays attached across stop and start, stop wakes no one") {
  scoped_disposition ign(SIGUSR1, SIG_IGN);
  waker w;
  signal_notice<SIGUSR1> n;
  n.set_waker(&w);
  n.start();
  ::raise(SIGUSR1);
  CHECK(w.drain());
  n.stop();
  ::raise(SIGUSR1);  // ignored: not noticed, and no wake
  CHECK_FALSE(w.drain());
  n.start();
  CHECK_FALSE(n.noticed());
  ::raise(SIGUSR1);
  CHECK(n.noticed());
  CHECK(w.drain());
  n.stop();
  n.set_waker(nullptr);
}

TEST_CASE("two notices on one signal wake their own wakers, one detached wakes none") {
  scoped_disposition ign(SIGUSR1, SIG_IGN);
  waker w1, w2;
  signal_notice<SIGUSR1> a, b;
  a.set_waker(&w1);
  b.set_waker(&w2);
  a.start();
  b.start();
  ::raise(SIGUSR1);
  CHECK(w1.drain());
  CHECK(w2.drain());
  b.set_waker(nullptr);
  ::raise(SIGUSR1);
  CHECK(w1.drain());
  CHECK_FALSE(w2.drain());
  b.set_waker(&w1);  // re-pointed: both notify w1
  ::raise(SIGUSR1);
  CHECK(w1.drain());
  CHECK_FALSE(w2.drain());
  b.stop();
  a.stop();
  a.set_waker(nullptr);
  b.set_waker(nullptr);
}

TEST_CASE("any_of with a source that cannot wake: the others still wake, the trait says no") {
  scoped_disposition ign(SIGUSR1, SIG_IGN);
  std::atomic<bool> asked{false};
  using mixed = holdfast::any_of<signal_notice<SIGUSR1>, asked_notice>;
  static_assert(!holdfast::has_notice_waker_v<mixed>);
  holdfast::termination_config<mixed, holdfast::no_exit> cfg(
      mixed(signal_notice<SIGUSR1>(), asked_notice{&asked}));
  static_assert(!decltype(cfg)::wakes_on_notice);
  waker w;
  cfg.set_waker(&w);
  cfg.start();
  asked = true;  // noticed, but only a look at noticed() finds it
  CHECK(cfg.noticed());
  CHECK(wait_readable(w.fd(), 30ms) == 0);
  ::raise(SIGUSR1);
  CHECK(readable_now(w.fd()));  // the handler notified before raise() returned
  cfg.stop();
  cfg.set_waker(nullptr);
}

TEST_CASE("detaching while signals fly: no write reaches the descriptor after set_waker(nullptr)") {
  // A thread raises SIGUSR1 in a loop (its handler runs there) while this one attaches a fresh
  // waker, detaches it and destroys it, then opens an eventfd that reuses the number: nothing
  // may reach it. Sanitized builds run ~10x slower: fewer rounds.
  scoped_disposition ign(SIGUSR1, SIG_IGN);
  signal_notice<SIGUSR1> n;
  n.start();
  std::atomic<bool> quit{false};
  std::atomic<std::uint64_t> raised{0};
  std::thread sender([&] {
    while (!quit.load()) {
      ::raise(SIGUSR1);
      raised.fetch_add(1);
    }
  });
  const int rounds = holdfast_test::sanitized ? 50 : 300;
  int reused = 0, stray = 0, woken = 0;
  for (int i = 0; i < rounds; ++i) {
    int number = -1;
    {
      waker w;
      number = w.fd();
      n.set_waker(&w);
      woken += wait_readable(w.fd(), 100ms);
      n.set_waker(nullptr);
    }
    const int probe = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    REQUIRE(probe >= 0);
    reused += probe == number;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::uint64_t v = 0;
    stray += ::read(probe, &v, sizeof v) > 0;
    ::close(probe);
  }
  quit = true;
  sender.join();
  n.stop();
  MESSAGE(raised.load() << " signals, " << reused << " of " << rounds
                        << " probes reused the detached number");
  CHECK(woken == rounds);
  CHECK(reused > 0);
  CHECK(stray == 0);
}
