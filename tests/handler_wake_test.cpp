// The preemption handler's event-driven watcher (issue 21): it sleeps in one poll() on its waker
// and on the store's control watch, so
//   (a) once both watchers are observed asleep in poll() (support/thread_state.hpp), a signal is
//       seen by the noticed worker's watcher, and the claim by its peer's watcher, within 2 s
//       (a fifth of the 10 s watch_interval that a sliced wait would take), over etcd_kv (a real
//       etcd on loopback) and over filesystem_kv, with a 100 ms and a 10 s watch_interval;
//   (b) idle handlers over etcd_kv send nothing but the watch's health probes (one etcd client per
//       handler, so stats() counts per worker);
//   (c) over filesystem_kv, 4 worker threads agree on one step after one notice, and a dead
//       worker makes every survivor raise agreement_timeout naming it within ack_timeout x 1.5
//       of the notice (at its deadline, not an ack_timeout later);
//   (d) shutting down an idle handler whose watcher is observed asleep in poll() is prompt
//       (< 2 s, a fifth of its 10 s watch_interval), with a notice that wakes the watcher and
//       with one that cannot;
//   (e) over a store that can wait only on named keys (support/key_wait_kv.hpp: a watch that
//       follows one key), directly and in an any_kv, 4 threads agree on one step with no
//       blocking get; with its get_many the claimant reads the acks in O(1) calls, and a dead
//       worker's timeout names it within ack_timeout; an idle worker makes no store calls;
//   (f) a store made from a URL (make_kv, an any_kv) keeps the watch: idle over etcd:// it sends
//       nothing but probes and opens no connection; over file:// a claim wakes it through
//       inotify well before its 10 s watch_interval.
// Timing bounds: a RUN_SERIAL suite. Workers are threads; the notices are real signal_notices
// (SIGUSR1, SIGUSR2: doctest installs no handler on them) raised in-process, or flag_notice.
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>  // uncaught_exceptions: a failed REQUIRE ends the workers
#include <functional>
#include <holdfast/agreement.hpp>
#include <holdfast/handler.hpp>
#include <holdfast/kv/any.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/url.hpp>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/etcd_server.hpp"
#include "support/handler_harness.hpp"
#include "support/handler_team.hpp"
#include "support/key_wait_kv.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

using namespace std::chrono_literals;
using holdfast::agreement_state;
using holdfast::run_status;
using holdfast_test::ignored_signals;
using holdfast_test::worker_state;
using outcome = holdfast_test::thread_outcome;
using team = holdfast_test::thread_team;
using clk = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

template <int Sig>
using sig_config = holdfast::termination_config<holdfast::signal_notice<Sig>, holdfast::no_exit>;
template <int Sig, class Kv>
using sig_handler =
    holdfast::preemption_handler<sig_config<Sig>, Kv, holdfast_test::memory_checkpoints>;

static_assert(holdfast::has_kv_watch_v<holdfast::etcd_kv>, "etcd_kv is waited on with a watch");
static_assert(holdfast::has_kv_watch_v<holdfast::filesystem_kv>,
              "filesystem_kv is waited on with a watch");
static_assert(holdfast::has_notice_waker_v<sig_config<SIGUSR1>>, "signal_notice wakes");
static_assert(holdfast::has_notice_waker_v<holdfast_test::flag_notice>, "polled_notice wakes");

double us_since(clk::time_point t0) {
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}
double ms_since(clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

// A fresh key namespace per handler job.
holdfast::kv_namespace fresh_ns() {
  static int n = 0;
  return holdfast::kv_namespace("wake" + std::to_string(++n), "0");
}

// A new etcd client (its own stats) on the shared etcd.
holdfast::etcd_kv etcd_store(const holdfast::kv_namespace& ns, milliseconds request = 5000ms) {
  holdfast::etcd_options o;
  o.endpoints = {holdfast_test::shared_etcd().url()};
  o.request_timeout = request;
  return holdfast::etcd_kv(o, ns);
}

// Whether `h` left idle since the start: a state past idle, or a later round (the agreement ran
// and the handler re-armed between two looks).
template <class Handler>
bool left_idle(const Handler& h) {
  auto a = h.agreement();
  return a.state() != agreement_state::idle || a.round() > 0;
}

// (a) Two workers as threads over `make_kv()` stores: task 0 listens to SIGUSR1, task 1 to
// SIGUSR2. SIGUSR1 is raised once both trained; measured: the signal → task 0's watcher forwards
// it (its state leaves idle), → task 1's watcher sees the claim; then both save at one step.
template <class Kv, class MakeKv>
void notice_latency(const std::string& store, MakeKv make_kv, milliseconds watch_interval) {
  INFO(store << ", watch_interval " << watch_interval.count() << " ms");
  ignored_signals ignored;  // outlives the notices
  holdfast::handler_options o;
  o.ack_timeout = 10s;
  o.watch_interval = watch_interval;
  const holdfast::kv_namespace ns = fresh_ns();
  std::vector<worker_state> st(2);
  const auto threads0 = holdfast_test::thread_ids();
  sig_handler<SIGUSR1, Kv> h0(sig_config<SIGUSR1>(), make_kv(ns), {0, 2, "wake"}, {&st[0]}, o);
  const auto watcher0 = holdfast_test::new_threads(threads0);  // h0's watcher
  const auto threads1 = holdfast_test::thread_ids();
  sig_handler<SIGUSR2, Kv> h1(sig_config<SIGUSR2>(), make_kv(ns), {1, 2, "wake"}, {&st[1]}, o);
  const auto watcher1 = holdfast_test::new_threads(threads1);
  team tm(2);
  tm.train(0, h0);
  tm.train(1, h1);
  REQUIRE(tm.wait_steps(20, 10s));
  // Both watchers observed asleep in poll() (not assumed after a pause): the wake-ups measured
  // below are wake-ups from that sleep.
  REQUIRE(holdfast_test::wait_asleep_in_poll(watcher0, 10s));
  REQUIRE(holdfast_test::wait_asleep_in_poll(watcher1, 10s));
  REQUIRE_FALSE(left_idle(h0));
  REQUIRE_FALSE(left_idle(h1));

  std::optional<double> noticed_us, claim_us;
  const auto t0 = clk::now();
  ::raise(SIGUSR1);  // its handler runs on this thread before raise returns
  while ((!noticed_us || !claim_us) && clk::now() - t0 < 5s) {
    if (!noticed_us && left_idle(h0)) noticed_us = us_since(t0);
    if (!claim_us && left_idle(h1)) claim_us = us_since(t0);
    std::this_thread::sleep_for(100us);
  }
  REQUIRE(tm.wait_ended(20s));
  const double done_ms =
      std::chrono::duration<double, std::milli>(std::max(tm[0].ended, tm[1].ended) - t0).count();
  tm.finish();
  MESSAGE(store << ", watch_interval " << watch_interval.count()
                << " ms: signal -> noticed by its watcher " << noticed_us.value_or(-1) / 1000.0
                << " ms, -> claim seen by the peer " << claim_us.value_or(-1) / 1000.0
                << " ms, -> both saved " << done_ms << " ms");
  REQUIRE(noticed_us);
  REQUIRE(claim_us);
  // Woken, not polled: with the 10 s watch_interval a sliced wait would take up to 10 s; a
  // fifth of it tells the two apart on a loaded machine (the 100 ms run meets the same bound).
  CHECK(*noticed_us < 2e6);
  CHECK(*claim_us < 2e6);
  CHECK(h0.config().notice().signal() == SIGUSR1);
  CHECK_FALSE(h1.config().notice().noticed());
  for (int t = 0; t < 2; ++t) {
    CHECK(tm[t].error == "");
    CHECK(tm[t].last == run_status::stopped);
    CHECK(st[static_cast<std::size_t>(t)].saved_steps.size() == 1);
  }
  CHECK(st[0].saved_steps == st[1].saved_steps);
  auto kv = make_kv(ns);
  auto text = kv.try_get("holdfast/wake/ctl/r0/step");
  REQUIRE(text);
  auto step = holdfast::parse_agreement_value(*text);
  REQUIRE(step);
  CHECK(step->what == holdfast::agreement_value::kind::step);
  CHECK(st[0].saved_steps == std::vector<std::int64_t>{step->step});
}

}  // namespace

TEST_CASE("wake (a): a signal is seen well within a 10 s watch_interval over etcd_kv") {
  for (milliseconds interval : {100ms, 10000ms})
    notice_latency<holdfast::etcd_kv>(
        "etcd_kv", [](const holdfast::kv_namespace& ns) { return etcd_store(ns); }, interval);
}

TEST_CASE("wake (a): a signal is seen well within a 10 s watch_interval over filesystem_kv") {
  holdfast_test::temp_dir root("wake-fskv");
  for (milliseconds interval : {100ms, 10000ms})
    notice_latency<holdfast::filesystem_kv>(
        "filesystem_kv",
        [&](const holdfast::kv_namespace& ns) { return holdfast::filesystem_kv(root.path(), ns); },
        interval);
}

TEST_CASE("wake (b): idle handlers over etcd_kv send nothing but the watch's health probes") {
  // request_timeout 5 s (the default: a probe every 2.5 s) and 2 s (a probe every second)
  for (milliseconds request : {5000ms, 2000ms}) {
    INFO("request_timeout " << request.count() << " ms");
    ignored_signals ignored;
    constexpr int n = 2;
    const holdfast::kv_namespace ns = fresh_ns();
    std::vector<holdfast::etcd_kv> kvs;  // one client per handler: its stats are that handler's
    for (int t = 0; t < n; ++t) kvs.push_back(etcd_store(ns, request));
    std::vector<worker_state> st(n);
    using handler = sig_handler<SIGUSR1, holdfast::etcd_kv>;
    std::vector<std::unique_ptr<handler>> hs;
    std::vector<std::vector<pid_t>> watchers;  // each handler's watcher thread
    for (int t = 0; t < n; ++t) {              // default handler_options
      const auto threads = holdfast_test::thread_ids();
      hs.push_back(std::make_unique<handler>(
          sig_config<SIGUSR1>(), kvs[std::size_t(t)], holdfast::cluster_info{t, n, "idle"},
          holdfast_test::memory_checkpoints{&st[std::size_t(t)]}));
      watchers.push_back(holdfast_test::new_threads(threads));
    }
    team tm(n);
    for (int t = 0; t < n; ++t) tm.train(t, *hs[std::size_t(t)]);
    REQUIRE(tm.wait_steps(5, 10s));
    const auto opened = clk::now() + 5s;  // every watcher opened its control watch
    while (clk::now() < opened &&
           !std::all_of(kvs.begin(), kvs.end(), [](auto& kv) { return kv.stats().watch_opens; }))
      std::this_thread::sleep_for(1ms);
    for (const auto& w : watchers)  // and each is observed asleep in poll() on it
      REQUIRE(holdfast_test::wait_asleep_in_poll(w, 10s));
    std::vector<holdfast::etcd_stats> before;
    for (auto& kv : kvs) before.push_back(kv.stats());
    const auto t0 = clk::now();
    std::this_thread::sleep_for(2s);
    const double seconds = ms_since(t0) / 1000.0;
    std::vector<holdfast::etcd_stats> after;
    for (auto& kv : kvs) after.push_back(kv.stats());
    const std::int64_t steps = tm[0].progress.load();
    tm.finish();
    for (int t = 0; t < n; ++t) {
      const auto& b = before[std::size_t(t)];
      const auto& a = after[std::size_t(t)];
      const auto requests = a.requests - b.requests;
      MESSAGE("request_timeout " << request.count() << " ms, handler " << t << ": " << requests
                                 << " requests in " << seconds << " s idle (" << a.probes - b.probes
                                 << " probes, " << a.watch_opens - b.watch_opens << " watch opens, "
                                 << a.connections - b.connections << " connections); " << steps
                                 << " steps trained meanwhile");
      CHECK(b.watch_opens >= 1);
      CHECK(requests <= static_cast<std::uint64_t>(seconds) + 1);  // <= 1 per second, + 1
      CHECK(a.probes - b.probes == requests);                      // nothing but probes
      CHECK(a.watch_opens == b.watch_opens);                       // no range and watch per slice
      CHECK(a.connections - b.connections <= 1);
      if (request == 2000ms) CHECK(a.probes - b.probes >= 1);  // the probes do run
      CHECK(hs[std::size_t(t)]->state() == agreement_state::idle);
      CHECK(st[std::size_t(t)].saves == 0);
    }
  }
}

namespace {

using flag_config = holdfast::termination_config<holdfast_test::flag_notice, holdfast::no_exit>;

// (c) `n` worker threads over filesystem_kv, each building its handler (the default
// checkpoint_manager: the restore agreement runs too); `dead` ends its handler after 10 steps
// without a notice; task `noticed` is noticed once the others ran 20 steps (and the dead one
// ended). The outcomes are in `out` and `st`; `notice_at` is when the notice was given.
template <class Kv = holdfast::filesystem_kv>
struct fs_job {
  holdfast_test::temp_dir dir{"wake-fsjob"};
  holdfast::kv_namespace ns = fresh_ns();
  Kv kv{holdfast::filesystem_kv(dir.path(), ns)};  // each handler a copy (counting_kv: shared)
  std::vector<std::unique_ptr<std::atomic<bool>>> flags;
  std::deque<outcome> out;
  std::vector<worker_state> st;
  std::atomic<bool> quit{false};
  clk::time_point notice_at{};
  holdfast::kv_counts before_notice{};  // counting_kv: the job's operations before the notice

  void run(int n, int noticed, int dead, milliseconds ack_timeout) {
    for (int t = 0; t < n; ++t) flags.push_back(std::make_unique<std::atomic<bool>>(false));
    out.resize(static_cast<std::size_t>(n));
    st.resize(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int t = 0; t < n; ++t)
      threads.emplace_back([this, t, n, dead, ack_timeout] { work(t, n, dead, ack_timeout); });
    struct joiner {
      std::vector<std::thread>& threads;
      std::atomic<bool>& quit;
      ~joiner() {
        if (std::uncaught_exceptions() > 0) quit.store(true);  // a failed REQUIRE below
        for (auto& t : threads) t.join();
      }
    } join_at_exit{threads, quit};
    const auto ready = clk::now() + 20s;
    for (int t = 0; t < n; ++t)
      while (out[std::size_t(t)].progress.load() < 20 && clk::now() < ready)
        std::this_thread::sleep_for(1ms);
    for (int t = 0; t < n; ++t) REQUIRE(out[std::size_t(t)].progress.load() >= 20);
    if constexpr (!std::is_same_v<Kv, holdfast::filesystem_kv>) before_notice = kv.counts();
    notice_at = clk::now();
    flags[std::size_t(noticed)]->store(true);
  }

  void work(int t, int n, int dead, milliseconds ack_timeout) {
    outcome& o = out[std::size_t(t)];
    worker_state& s = st[std::size_t(t)];
    holdfast_test::record_outcome(o, [&] {
      holdfast::handler_options opt;
      opt.ack_timeout = ack_timeout;
      holdfast::preemption_handler<flag_config, Kv> h(
          flag_config(holdfast_test::flag_notice(
                          holdfast_test::flag_poll{flags[std::size_t(t)].get()}, 1ms),
                      holdfast::no_exit{}),
          kv, {t, n, "fs"},
          holdfast_test::make_checkpoints(dir / ("ckpt-" + std::to_string(t)), &s), opt);
      holdfast_test::train_thread(
          h, o, quit,
          [&] {
            ++s.acc;
            std::this_thread::sleep_for(1ms);
          },
          t == dead ? 10 : -1);  // dead: its watcher stops too
    });
  }

  double ms_to(clk::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - notice_at).count();
  }
  std::optional<holdfast::agreement_value> recorded(const std::string& name) const {
    auto text = holdfast::filesystem_kv(dir.path(), ns).try_get("holdfast/fs/" + name);
    return text ? holdfast::parse_agreement_value(*text) : std::nullopt;
  }
};

}  // namespace

TEST_CASE("wake (c): 4 threads over filesystem_kv agree on one step after one notice") {
  for (int noticed : {0, 3}) {
    INFO("notice to task " << noticed);
    fs_job<> j;
    j.run(4, noticed, -1, 10000ms);
    std::set<std::vector<std::int64_t>> steps;
    double last_ms = 0;
    for (int t = 0; t < 4; ++t) {
      const outcome& o = j.out[std::size_t(t)];
      const worker_state& s = j.st[std::size_t(t)];
      CHECK(o.error == "");
      CHECK(o.last == run_status::stopped);
      CHECK(s.saved_steps.size() == 1);
      CHECK(o.counter == s.saved_steps.front());  // stopped at the agreed step
      CHECK(s.acc == o.counter);                  // nothing ran after the save
      steps.insert(s.saved_steps);
      last_ms = std::max(last_ms, j.ms_to(o.ended));
    }
    MESSAGE("filesystem_kv, notice to task " << noticed << ": notice -> all 4 saved in " << last_ms
                                             << " ms");
    CHECK(steps.size() == 1);
    auto claim = j.recorded("ctl/r0/claim");
    auto step = j.recorded("ctl/r0/step");
    REQUIRE(claim);
    REQUIRE(step);
    CHECK(claim->writer == noticed);
    CHECK(step->what == holdfast::agreement_value::kind::step);
    CHECK(std::vector<std::int64_t>{step->step} == *steps.begin());
    CHECK(last_ms < 10000);  // within ack_timeout (a save may fsync: no tighter bound)
  }
}

TEST_CASE("wake (c): over filesystem_kv the acks come through watches: no blocking get") {
  // The claimant collects the acks through a watch on the round's acks, the others wait for the
  // outcome on their control watch: from the notice on, no store call blocks, and the reads are
  // O(1) per worker (each wake-up of a filesystem watch is a resync: the key is read again).
  constexpr int n = 4;
  fs_job<holdfast::counting_kv<holdfast::filesystem_kv>> j;
  j.run(n, 0, -1, 10000ms);
  std::set<std::vector<std::int64_t>> steps;
  for (int t = 0; t < n; ++t) {
    CHECK(j.out[std::size_t(t)].error == "");
    steps.insert(j.st[std::size_t(t)].saved_steps);
  }
  CHECK(steps.size() == 1);
  CHECK(steps.begin()->size() == 1);
  const holdfast::kv_counts c = j.kv.counts();
  CHECK(c.get == j.before_notice.get);      // no blocking get
  CHECK(c.list == j.before_notice.list);    // nor a listing
  CHECK(c.put - j.before_notice.put == n);  // one ack each
  // 8 per worker for the round, and with hang detection (hang_report, the default) up to 2 more:
  // the verdict key ctl/hang, read again after a resync like every key the watcher looks up
  CHECK(c.try_get - j.before_notice.try_get <= 10 * n);
}

TEST_CASE("wake (c): over filesystem_kv a dead worker makes every survivor raise its timeout") {
  constexpr milliseconds ack = 1000ms;
  fs_job<> j;
  j.run(4, 0, 2, ack);
  // At the deadline, not an ack_timeout later: half an ack_timeout of slack tells them apart.
  const double bound = static_cast<double>(ack.count()) * 1.5;
  for (int t : {0, 1, 3}) {
    const outcome& o = j.out[std::size_t(t)];
    const double ms = j.ms_to(o.ended);
    MESSAGE("filesystem_kv, task " << t << ": notice -> agreement_timeout in " << ms
                                   << " ms (bound " << bound << " ms)");
    CHECK(o.error == "timeout");
    CHECK(o.missing == std::vector<int>{2});
    CHECK(ms <= bound);
    CHECK(j.st[std::size_t(t)].saves == 0);
  }
  auto step = j.recorded("ctl/r0/step");
  REQUIRE(step);
  CHECK(step->what == holdfast::agreement_value::kind::timeout);
  CHECK(step->tasks == std::vector<int>{2});
}

namespace {

// A notice that cannot wake the watcher (no set_waker): the watcher then sleeps at most one
// watch_interval, and only a stop request wakes it earlier.
struct quiet_notice {
  void start() {}
  void stop() noexcept {}
  bool noticed() const noexcept { return false; }
  std::optional<clk::time_point> noticed_at() const noexcept { return std::nullopt; }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    return std::nullopt;
  }
};
using quiet_config = holdfast::termination_config<quiet_notice, holdfast::no_exit>;
static_assert(!holdfast::has_notice_waker_v<quiet_config>, "quiet_notice cannot wake");

// (d) An idle handler with a 10 s watch_interval over `kv`: how long shutdown() and the
// destructor take once its watcher sleeps.
template <class Config, class Kv>
void check_prompt_shutdown(const std::string& what, Kv kv) {
  holdfast::handler_options o;
  o.watch_interval = 10s;
  worker_state st;
  const auto threads = holdfast_test::thread_ids();
  auto h =
      std::make_unique<holdfast::preemption_handler<Config, Kv, holdfast_test::memory_checkpoints>>(
          Config(), std::move(kv), holdfast::cluster_info{0, 1, "down"},
          holdfast_test::memory_checkpoints{&st}, o);
  // the watcher is observed asleep in poll() (with a notice that cannot wake it, for up to 10 s)
  REQUIRE(holdfast_test::wait_asleep_in_poll(holdfast_test::new_threads(threads), 10s));
  CHECK(h->state() == agreement_state::idle);
  const auto t0 = clk::now();
  h->shutdown();
  const double shutdown_ms = ms_since(t0);
  h.reset();
  const double total_ms = ms_since(t0);
  MESSAGE(what << ": shutdown " << shutdown_ms << " ms, with the destructor " << total_ms << " ms");
  // Woken, not waited out: a fifth of the 10 s watch_interval tells the two apart.
  CHECK(shutdown_ms < 2000);
  CHECK(total_ms < 2000);
}

}  // namespace

TEST_CASE("wake (d): an idle handler shuts down well within its 10 s watch_interval") {
  ignored_signals ignored;
  // ids, not a count: a thread joined a moment ago is listed until the kernel releases it
  const auto threads = holdfast_test::thread_ids();
  check_prompt_shutdown<sig_config<SIGUSR1>>("etcd_kv, signal_notice", etcd_store(fresh_ns()));
  check_prompt_shutdown<quiet_config>("etcd_kv, a notice that cannot wake", etcd_store(fresh_ns()));
  holdfast_test::temp_dir root("wake-down");
  check_prompt_shutdown<sig_config<SIGUSR1>>("filesystem_kv, signal_notice",
                                             holdfast::filesystem_kv(root.path(), fresh_ns()));
  check_prompt_shutdown<quiet_config>("filesystem_kv, a notice that cannot wake",
                                      holdfast::filesystem_kv(root.path(), fresh_ns()));
  CHECK(holdfast_test::settled_new_threads(threads, 0).size() == 0);  // every watcher joined
}

namespace {

using counted_key_wait = holdfast::counting_kv<holdfast_test::key_wait_kv>;
template <class Kv>
using flag_handler =
    holdfast::preemption_handler<flag_config, Kv, holdfast_test::memory_checkpoints>;

// One handler for thread workers: task `task` of `n` in run `run`, noticed when `*flag` is set.
template <class Kv>
std::unique_ptr<flag_handler<Kv>> make_flag_handler(Kv kv, int task, int n, const char* run,
                                                    std::atomic<bool>* flag, worker_state* st,
                                                    holdfast::handler_options o = {}) {
  return std::make_unique<flag_handler<Kv>>(
      flag_config(holdfast_test::flag_notice(holdfast_test::flag_poll{flag}, 1ms),
                  holdfast::no_exit{}),
      std::move(kv), holdfast::cluster_info{task, n, run}, holdfast_test::memory_checkpoints{st},
      o);
}

// (e) What a 4-worker job over a key-wait store did, from the notice on.
struct key_wait_result {
  std::vector<std::string> errors;        // per task ("" none, "timeout", "other ...")
  std::vector<std::vector<int>> missing;  // a timeout's missing tasks, per task
  std::vector<std::vector<std::int64_t>> saved;
  std::vector<double> ended_ms;  // notice -> run() answered stopped or threw
  holdfast::kv_counts ops;       // the job's store operations from the notice on
};

// 4 handlers over copies of `kv` (every call counted by `counted`, which `kv` holds), trained
// by threads; task 0 is noticed once all ran 20 steps. `dead` (if >= 0) is shut down before
// the notice: it trains on but never acks.
template <class Kv>
key_wait_result key_wait_job(Kv kv, const counted_key_wait& counted, int dead,
                             milliseconds ack_timeout) {
  constexpr int n = 4;
  holdfast::handler_options o;
  o.ack_timeout = ack_timeout;  // watch_interval: the default 100 ms
  std::vector<std::unique_ptr<std::atomic<bool>>> flags;
  std::vector<worker_state> st(n);
  std::vector<std::unique_ptr<flag_handler<Kv>>> hs;
  for (int t = 0; t < n; ++t) {
    flags.push_back(std::make_unique<std::atomic<bool>>(false));
    hs.push_back(make_flag_handler(kv, t, n, "kw", flags.back().get(), &st[std::size_t(t)], o));
  }
  if (dead >= 0) hs[std::size_t(dead)]->shutdown();
  team tm(n);
  for (int t = 0; t < n; ++t) tm.train(t, *hs[std::size_t(t)]);
  REQUIRE(tm.wait_steps(20, 20s));
  const holdfast::kv_counts before = counted.counts();
  const auto notice_at = clk::now();
  flags[0]->store(true);
  const auto end = notice_at + 30s;
  for (int t = 0; t < n; ++t)
    while (t != dead && tm[t].progress.load() != std::numeric_limits<std::int64_t>::max() &&
           clk::now() < end)
      std::this_thread::sleep_for(1ms);
  tm.finish();
  key_wait_result r;
  r.ops = counted.counts();
  r.ops.get -= before.get;
  r.ops.try_get -= before.try_get;
  r.ops.get_many -= before.get_many;
  r.ops.put -= before.put;
  for (int t = 0; t < n; ++t) {
    r.errors.push_back(tm[t].error);
    r.missing.push_back(tm[t].missing);
    r.saved.push_back(st[std::size_t(t)].saved_steps);
    r.ended_ms.push_back(
        std::chrono::duration<double, std::milli>(tm[t].ended - notice_at).count());
  }
  return r;
}

}  // namespace

TEST_CASE("wake (e): over a store that waits on named keys, 4 threads agree on one step") {
  for (bool batched : {false, true})
    for (bool erased : {false, true}) {
      const std::string label = std::string(batched ? "with get_many" : "without get_many") +
                                (erased ? ", in an any_kv" : "");
      INFO(label);
      counted_key_wait counted(
          holdfast_test::key_wait_kv(holdfast::in_process_kv(fresh_ns()), batched));
      const key_wait_result r = erased ? key_wait_job(holdfast::any_kv(counted), counted, -1, 10s)
                                       : key_wait_job(counted, counted, -1, 10s);
      for (int t = 0; t < 4; ++t) {
        CHECK(r.errors[std::size_t(t)] == "");
        CHECK(r.saved[std::size_t(t)].size() == 1);
        CHECK(r.saved[std::size_t(t)] == r.saved[0]);  // one agreed step
      }
      MESSAGE("key-wait store, " << label << ": " << r.ops.to_string() << " from the notice on");
      CHECK(r.ops.get == 0);  // no blocking get: the watches (following keys) and get_many wait
      CHECK(r.ops.put == 4);  // one ack each
      CHECK(r.ops.try_get <= 8 * 4);
      if (batched)
        CHECK(r.ops.get_many <= 2);  // one batch for the N - 1 acks (a second if one was slow)
      else
        CHECK(r.ops.get_many == 0);  // the claimant's ack watch follows each ack key
    }
}

TEST_CASE("wake (e): with get_many a dead worker's timeout names it within ack_timeout") {
  constexpr milliseconds ack = 1000ms;
  counted_key_wait counted(holdfast_test::key_wait_kv(holdfast::in_process_kv(fresh_ns()), true));
  const key_wait_result r = key_wait_job(counted, counted, 2, ack);
  const double bound = static_cast<double>(ack.count()) + 500;
  for (int t : {0, 1, 3}) {
    MESSAGE("key-wait store with get_many, task " << t << ": notice -> agreement_timeout in "
                                                  << r.ended_ms[std::size_t(t)] << " ms");
    CHECK(r.errors[std::size_t(t)] == "timeout");
    CHECK(r.missing[std::size_t(t)] == std::vector<int>{2});
    CHECK(r.ended_ms[std::size_t(t)] <= bound);
    CHECK(r.saved[std::size_t(t)].empty());
  }
  CHECK(r.ops.get_many >= 1);
  CHECK(r.ops.get_many <= 3);  // one slice to the deadline (+ one read at it), not a get per ack
  CHECK(r.ops.get == 0);
}

TEST_CASE("wake (e): an idle worker over a store that waits on named keys makes no store calls") {
  constexpr milliseconds interval = 100ms;
  for (bool erased : {false, true}) {
    const std::string label = erased ? "in an any_kv" : "direct";
    INFO(label);
    counted_key_wait counted(holdfast_test::key_wait_kv{holdfast::in_process_kv(fresh_ns())});
    std::atomic<bool> flag{false};
    worker_state st;
    holdfast::handler_options o;
    o.watch_interval = interval;
    auto idle = [&](auto h) {
      team tm(1);
      tm.train(0, *h);
      // the watcher looked at the claim and error keys once and again after its watch's first
      // take, then sleeps
      const auto looked = clk::now() + 10s;
      while (counted.counts().try_get < 4 && clk::now() < looked) std::this_thread::sleep_for(1ms);
      const holdfast::kv_counts before = counted.counts();
      const auto t0 = clk::now();
      std::this_thread::sleep_for(2s);
      const double slices = ms_since(t0) / static_cast<double>(interval.count());
      const holdfast::kv_counts after = counted.counts();
      tm.finish();
      MESSAGE("idle over a key-wait store, " << label << ": " << after.total() - before.total()
                                             << " store calls in " << slices << " watch intervals");
      CHECK(after.get == before.get);  // never the sliced path's blocking get
      CHECK(static_cast<double>(after.total() - before.total()) < slices / 4);
      CHECK(h->state() == agreement_state::idle);
    };
    if (erased)
      idle(make_flag_handler(holdfast::any_kv(counted), 0, 2, "idle", &flag, &st, o));
    else
      idle(make_flag_handler(counted, 0, 2, "idle", &flag, &st, o));
  }
}

TEST_CASE("wake (f): idle over make_kv(etcd://...) the handler keeps the watch: probes only") {
  const holdfast::kv_namespace ns = fresh_ns();
  const std::string url =
      "etcd://127.0.0.1:" + std::to_string(holdfast_test::shared_etcd().port()) + "/wakeurl";
  holdfast::any_kv kv = holdfast::make_kv(url, ns);  // its own client: its stats are this handler's
  REQUIRE(kv.supports(holdfast::kv_op::watch));
  std::atomic<bool> flag{false};
  worker_state st;
  const auto threads = holdfast_test::thread_ids();
  auto h = make_flag_handler(kv, 0, 2, "url", &flag, &st);  // default options: 100 ms interval
  const auto watcher = holdfast_test::new_threads(threads);
  team tm(1);
  tm.train(0, *h);
  const auto opened = clk::now() + 10s;  // the watcher opened its control watch
  while (clk::now() < opened && kv.stats_as<holdfast::etcd_stats>().value().watch_opens == 0)
    std::this_thread::sleep_for(1ms);
  REQUIRE(holdfast_test::wait_asleep_in_poll(watcher, 10s));  // and sleeps on it
  const holdfast::etcd_stats before = kv.stats_as<holdfast::etcd_stats>().value();
  const auto t0 = clk::now();
  std::this_thread::sleep_for(3s);
  const double seconds = ms_since(t0) / 1000.0;
  const holdfast::etcd_stats after = kv.stats_as<holdfast::etcd_stats>().value();
  tm.finish();
  const auto requests = after.requests - before.requests;
  MESSAGE("make_kv(etcd://), idle: " << requests << " requests, "
                                     << after.connections - before.connections << " connections in "
                                     << seconds << " s");
  CHECK(before.watch_opens >= 1);
  CHECK(after.watch_opens == before.watch_opens);              // no range and watch per slice
  CHECK(after.connections == before.connections);              // no new connection
  CHECK(requests <= static_cast<std::uint64_t>(seconds) + 1);  // <= 1 per second, + 1
  CHECK(after.probes - before.probes == requests);             // nothing but probes
  CHECK(h->state() == agreement_state::idle);
}

TEST_CASE("wake (f): over make_kv(file://...) a claim wakes the idle handler through inotify") {
  holdfast_test::temp_dir dir("wake-url");
  const holdfast::kv_namespace ns = fresh_ns();
  const std::string url = "file://" + dir.path();
  holdfast::counting_kv<holdfast::any_kv> counted(holdfast::make_kv(url, ns));
  std::atomic<bool> flag{false};
  worker_state st;
  holdfast::handler_options o;
  o.watch_interval = 10s;  // the sliced wait would look once in 10 s
  o.ack_timeout = 10s;
  const auto threads = holdfast_test::thread_ids();
  auto h = make_flag_handler(counted, 0, 2, "fsurl", &flag, &st, o);
  const auto watcher = holdfast_test::new_threads(threads);
  team tm(1);
  tm.train(0, *h);
  // the watcher read the claim and error keys, opened its watch, read them again: it sleeps
  const auto looked = clk::now() + 10s;
  while (counted.counts().try_get < 4 && clk::now() < looked) std::this_thread::sleep_for(1ms);
  REQUIRE(holdfast_test::wait_asleep_in_poll(watcher, 10s));  // observed, not assumed
  CHECK_FALSE(left_idle(*h));
  holdfast::agreement_value claim;
  claim.what = holdfast::agreement_value::kind::claim;
  claim.writer = 1;
  claim.nonce = "0123456789abcdef";
  holdfast::any_kv peer = holdfast::make_kv(url, ns);  // another worker's store
  const auto t0 = clk::now();
  REQUIRE(peer.insert("holdfast/fsurl/ctl/r0/claim", holdfast::format_agreement_value(claim)));
  std::optional<double> woke_ms;
  while (!woke_ms && clk::now() - t0 < 5s) {
    if (left_idle(*h)) woke_ms = ms_since(t0);
    std::this_thread::sleep_for(1ms);
  }
  MESSAGE("make_kv(file://): claim -> the idle handler left idle in " << woke_ms.value_or(-1)
                                                                      << " ms");
  REQUIRE(woke_ms);
  CHECK(*woke_ms < 3000);            // well before the 10 s watch_interval
  CHECK(counted.counts().get == 0);  // the watch woke it, not a blocking get
  h->shutdown();  // its peer never acks: release the training thread before the 10 s timeout
  tm.finish();
}
