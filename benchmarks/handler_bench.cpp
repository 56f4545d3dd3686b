// Preemption handler: the per-step cost of run() against a bare loop calling the same step, and
// the time from a notice until every worker has saved (4 and 16 workers; threads over
// in_process_kv, processes over filesystem_kv and etcd_kv) against the floor of telling every
// worker through the same store (no agreement): the noticed worker inserts one key and the
// others learn of it the fastest way the store allows, then save as the handler rows do. Over
// filesystem_kv and etcd_kv that is a watch object (kv.watch(prefix), opened and taken once
// before the notice, as the handler's watcher does; then poll() on fd() and take(), plus one
// try_get when a take reports resync); in_process_kv has no watch, so a blocked get (woken by
// its condition variable). Also prints the store operations per worker per agreement, counted
// with counting_kv (lines starting with "# handler"), and the hang detector's cost per run()
// (hang_report against hang_none, handler/run/hang=on rows).
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <holdfast/handler.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/in_process.hpp>
#include <holdfast/publish.hpp>
#include <holdfast/wait.hpp>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../tests/support/child.hpp"
#include "../tests/support/temp_dir.hpp"
#include "bench.hpp"
#include "etcd.hpp"
#include "stamps.hpp"

namespace {

using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;

using bench::etcd;     // the binary's one etcd, shared with the scale cases
using bench::next_id;  // fresh namespaces
using bench::now_ns;   // when a worker saved

template <class T>
inline void keep(T& v) {
  asm volatile("" : "+r"(v) : : "memory");  // the step's work is not optimized away
}

// A notice for threads: a flag, polled by the real polled_notice.
struct flag_poll {
  const std::atomic<bool>* flag;
  bool operator()() const { return flag->load(); }
};
using flag_config =
    holdfast::termination_config<holdfast::polled_notice<flag_poll>, holdfast::no_exit>;

// A Checkpointer that records when it saved (the disk is not what these cases measure).
struct stamp_checkpoints {
  std::atomic<std::int64_t>* saved_at;
  void save(std::int64_t) { saved_at->store(now_ns()); }
  std::optional<std::int64_t> restore() { return std::nullopt; }
};

// ---- per-step overhead -----------------------------------------------------------------------

template <int Work>
void step_work(std::uint64_t& x) {
  for (int i = 0; i < Work; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    keep(x);
  }
}

// Hang: the handler's hang policy (hang_report, the default: detection on; hang_none: off).
template <int Work, class Hang = holdfast::hang_report>
double run_loop(std::size_t n) {
  std::atomic<bool> flag{false};
  std::atomic<std::int64_t> saved{0};
  holdfast::in_process_kv kv(holdfast::kv_namespace("bench", next_id()));
  holdfast::handler_options o;
  o.watch_interval = 20ms;
  holdfast::preemption_handler<flag_config, holdfast::in_process_kv, stamp_checkpoints, clk, Hang>
      h(flag_config(holdfast::polled_notice<flag_poll>(flag_poll{&flag}, 1s)), kv, {0, 1, "r"},
        stamp_checkpoints{&saved}, o);
  std::uint64_t x = 1;
  auto t0 = clk::now();
  for (std::size_t i = 0; i < n; ++i) h.run([&x] { step_work<Work>(x); });
  auto t1 = clk::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count();
}

template <int Work>
double bare_loop(std::size_t n) {
  std::uint64_t x = 1;
  auto step = [&x] { step_work<Work>(x); };
  auto t0 = clk::now();
  for (std::size_t i = 0; i < n; ++i) step();
  auto t1 = clk::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count();
}

bench::registrar run_empty{
    {"handler/run/step=1 mul-add", run_loop<1>, "bare loop/step=1 mul-add", bare_loop<1>}};
bench::registrar run_1k{{"handler/run/step=1000 mul-add", run_loop<1000>,
                         "bare loop/step=1000 mul-add", bare_loop<1000>}};

// The hang detector's cost on the hot path (issue 34): run() with detection on (hang_report, the
// default) against run() with it compiled out (hang_none), in one binary, interleaved, median of
// 9. The step=1 row gives the ns per run() (the difference of the medians), the step=1000 row
// the ratio on a step of some work.
const bench::config hang_cfg{0, 9, 2, 20};
bench::registrar run_hang_1{
    {"handler/run/hang=on/step=1 mul-add", run_loop<1, holdfast::hang_report>,
     "handler/run/hang=off/step=1 mul-add", run_loop<1, holdfast::hang_none>, hang_cfg}};
bench::registrar run_hang_1k{
    {"handler/run/hang=on/step=1000 mul-add", run_loop<1000, holdfast::hang_report>,
     "handler/run/hang=off/step=1000 mul-add", run_loop<1000, holdfast::hang_none>, hang_cfg}};

// ---- notice → all saved, threads over in_process_kv -------------------------------------------

const bench::config agreement_cfg{1, 7, 1, 0};

using counted_kv = holdfast::counting_kv<holdfast::in_process_kv>;

// W workers train (steps of 100 µs); task 0 is noticed; returns ns from the notice until the
// last save. Prints the store operations per worker once per W.
double threads_notice_to_saved(int w) {
  counted_kv kv(holdfast::in_process_kv(holdfast::kv_namespace("bench", next_id())));
  std::vector<std::unique_ptr<std::atomic<bool>>> flags;
  std::vector<std::unique_ptr<std::atomic<std::int64_t>>> saved;
  for (int t = 0; t < w; ++t) {
    flags.push_back(std::make_unique<std::atomic<bool>>(false));
    saved.push_back(std::make_unique<std::atomic<std::int64_t>>(0));
  }
  std::atomic<int> running{0};
  std::vector<std::thread> th;
  for (int t = 0; t < w; ++t)
    th.emplace_back([&, t] {
      holdfast::handler_options o;
      o.watch_interval = 5ms;
      holdfast::preemption_handler<flag_config, counted_kv, stamp_checkpoints> h(
          flag_config(holdfast::polled_notice<flag_poll>(
              flag_poll{flags[static_cast<std::size_t>(t)].get()}, 1ms)),
          kv, {t, w, "r"}, stamp_checkpoints{saved[static_cast<std::size_t>(t)].get()}, o);
      bool counted = false;
      while (h.total_run_calls() < 1000000) {
        if (h.run([] { std::this_thread::sleep_for(100us); }) == holdfast::run_status::stopped)
          break;
        if (!counted && h.total_run_calls() >= 5) {
          counted = true;
          ++running;
        }
      }
    });
  while (running.load() < w) std::this_thread::sleep_for(1ms);
  auto before = kv.counts();
  const std::int64_t t0 = now_ns();
  flags[0]->store(true);
  for (auto& x : th) x.join();
  std::int64_t last = 0;
  for (auto& s : saved) last = std::max(last, s->load());
  auto c = kv.counts();
  static std::vector<int> printed;
  if (std::find(printed.begin(), printed.end(), w) == printed.end()) {
    printed.push_back(w);
    auto per = [&](std::uint64_t a, std::uint64_t b) { return static_cast<double>(a - b) / w; };
    std::printf(
        "# handler: %2d workers, store ops per worker per agreement: insert %.2f put %.2f "
        "list %.2f try_get %.2f | blocking get %.2f (step waits + watcher slices)\n",
        w, per(c.insert, before.insert), per(c.put, before.put), per(c.list, before.list),
        per(c.try_get, before.try_get), per(c.get, before.get));
  }
  return static_cast<double>(last - t0);
}

// The floor: task 0's flag → insert "stop" → the others, blocked in get, save.
double threads_broadcast(int w) {
  holdfast::in_process_kv kv(holdfast::kv_namespace("bench", next_id()));
  std::vector<std::atomic<std::int64_t>> saved(static_cast<std::size_t>(w));
  std::atomic<bool> flag{false};
  std::atomic<int> running{0};
  std::vector<std::thread> th;
  for (int t = 0; t < w; ++t)
    th.emplace_back([&, t] {
      ++running;
      if (t == 0) {
        while (!flag.load()) std::this_thread::sleep_for(100us);
        kv.insert("stop", "0");
      } else {
        (void)kv.get("stop", 10s);
      }
      saved[static_cast<std::size_t>(t)].store(now_ns());
    });
  while (running.load() < w) std::this_thread::sleep_for(1ms);
  const std::int64_t t0 = now_ns();
  flag.store(true);
  for (auto& x : th) x.join();
  std::int64_t last = 0;
  for (auto& s : saved) last = std::max(last, s.load());
  return static_cast<double>(last - t0);
}

bench::registrar threads4{{"handler/notice->saved/threads/in_process/4",
                           [](std::size_t) { return threads_notice_to_saved(4); },
                           "bare broadcast/threads/in_process/4",
                           [](std::size_t) { return threads_broadcast(4); }, agreement_cfg}};
bench::registrar threads16{{"handler/notice->saved/threads/in_process/16",
                            [](std::size_t) { return threads_notice_to_saved(16); },
                            "bare broadcast/threads/in_process/16",
                            [](std::size_t) { return threads_broadcast(16); }, agreement_cfg}};

// ---- notice → all saved, processes -----------------------------------------------------------

struct fs_backend {
  holdfast_test::temp_dir dir{"handler-bench"};
  holdfast::filesystem_kv make(const holdfast::kv_namespace& ns) const {
    return holdfast::filesystem_kv(dir.path(), ns);
  }
  static std::chrono::milliseconds watch() { return 20ms; }
};
struct etcd_backend {
  std::string url = etcd() ? etcd()->url() : "";
  holdfast::etcd_kv make(const holdfast::kv_namespace& ns) const {
    holdfast::etcd_options o;
    o.endpoints = {url};
    return holdfast::etcd_kv(o, ns);
  }
  static std::chrono::milliseconds watch() { return 50ms; }
};

// The floor's wait: sleeps in poll() on watch `w` (opened on the prefix of `key` and taken once,
// before the notice) until a take brings `key` with a value (an event, or a resync after which
// one try_get finds it). False at `limit`.
template <class Kv, class W>
bool await_with_watch(Kv& kv, W& w, const std::string& key, clk::time_point limit) {
  for (;;) {
    if (!w.buffered()) {
      const auto until = std::min(w.due(), limit);
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(until - clk::now(), clk::duration::zero()));
      pollfd p{w.fd(), POLLIN, 0};
      ::poll(&p, w.fd() >= 0 ? 1 : 0,
             static_cast<int>(std::min<std::int64_t>(wait.count(), 1 << 30)));
    }
    auto c = w.take();
    bool seen = false;
    for (const auto& e : c.events)
      if (e.key == key) seen = e.value.has_value();  // the last event of the key wins
    if (c.resync && !seen) seen = kv.try_get(key).has_value();
    if (seen) return true;
    if (clk::now() >= limit) return false;
  }
}

constexpr clk::duration step = 1ms;  // a training step of the process rows

std::int64_t read_ns(const std::string& path) {
  std::ifstream in(path);
  std::int64_t v = 0;
  in >> v;
  return v;
}
void write_ns(const std::string& path, std::int64_t v) { std::ofstream(path) << v; }

// A worker's last act: publishes when it saved, then sleeps until the parent kills it, so that
// no worker's exit (address space teardown, descriptors closed) competes with the later ones'
// saves for the CPU.
[[noreturn]] void report_and_pause(const std::string& path, std::int64_t saved_at) {
  holdfast::basic_publisher<holdfast::no_sync>().publish(path, std::to_string(saved_at));
  for (;;) ::pause();
}

// The Exit policy of the handler's workers: as a preempted job's process ends at its save, so
// does a worker's part here (it reports and pauses; exit_with would end it). no_exit would
// instead restart each worker's watcher thread (the in-process restart path), and the early
// savers' restarts would compete with the late savers for the CPU.
struct report_exit {
  static inline std::string path;                     // this worker's report (set after fork)
  static inline std::atomic<std::int64_t>* saved_at;  // stamped by stamp_checkpoints
  static constexpr bool returns = false;
  [[noreturn]] void operator()() const noexcept { report_and_pause(path, saved_at->load()); }
};

// W forked workers (signal_notice, report_exit); SIGTERM to task 0 once all run; ns until the last
// save (steady_clock is system-wide). The workers train in lockstep, as the workers of a
// data-parallel job do (their collectives hold them together): each steps on a shared 1 ms grid
// from a common start, so all are at the same step when the notice comes, and the notice comes
// in the middle of a step (the mean case). Without that, 16 free-running processes on 2 cores
// drift up to 6 steps apart, and the slowest worker's catching up to the agreed step (which must
// be above every worker's counter) is what the row would measure. `handler` false: the bare
// broadcast (task 0 waits for the signal in sigwait and inserts "b/stop"; the others wait on a
// watch of "b", opened before they report ready).
template <class Backend>
double processes_notice_to_saved(int w, bool handler) {
  Backend be;
  holdfast_test::temp_dir dir("handler-bench-proc");
  holdfast::kv_namespace ns("bench" + std::to_string(next_id()), "0");
  std::vector<holdfast_test::child> kids;
  for (int t = 0; t < w; ++t)
    kids.emplace_back([&, t] {
      ::signal(SIGTERM, SIG_DFL);
      auto kv = be.make(ns);
      std::string ready = dir / ("ready-" + std::to_string(t));
      std::string out = dir / ("saved-" + std::to_string(t));
      if (!handler) {
        std::int64_t saved_at = 0;
        if (t == 0) {
          sigset_t set;
          sigemptyset(&set);
          sigaddset(&set, SIGTERM);
          sigprocmask(SIG_BLOCK, &set, nullptr);
          write_ns(ready, 1);
          int sig = 0;
          sigwait(&set, &sig);
          kv.insert("b/stop", "0");
          saved_at = now_ns();
        } else {
          auto stop_watch = kv.watch("b");
          {  // the first take (resync or snapshot), as the handler's watcher makes at start
            auto c = stop_watch.take();
            bool there = false;
            for (const auto& e : c.events) there = there || (e.key == "b/stop" && e.value);
            if (c.resync && !there) there = kv.try_get("b/stop").has_value();
            if (there) std::_Exit(3);
          }
          write_ns(ready, 1);
          if (!await_with_watch(kv, stop_watch, "b/stop", clk::now() + 20s)) std::_Exit(4);
          // Saved now, with the watch still open (as the handler saves before its watch goes):
          // closing an inotify descriptor costs the kernel milliseconds (8-16 ms measured here).
          saved_at = now_ns();
        }
        report_and_pause(out, saved_at);
      }
      std::atomic<std::int64_t> saved{0};
      holdfast::handler_options o;
      o.watch_interval = Backend::watch();
      report_exit::path = out;
      report_exit::saved_at = &saved;
      using cfg = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, report_exit>;
      holdfast::preemption_handler<cfg, decltype(kv), stamp_checkpoints> h(
          cfg(), kv, {t, w, "r"}, stamp_checkpoints{&saved}, o);
      write_ns(ready, 1);
      if (!holdfast::await_file(dir / "go", 30s)) std::_Exit(5);
      const clk::time_point go{clk::duration(read_ns(dir / "go"))};
      auto step_end = go;  // step k ends at go + k ms, for every worker
      for (;;) {           // until report_exit ends the worker's part at its save
        step_end += step;
        h.run([&] { std::this_thread::sleep_until(step_end); });
      }
    });
  for (int t = 0; t < w; ++t)
    if (!holdfast::await_file(dir / ("ready-" + std::to_string(t)), 30s)) return -1;
  if (handler) {  // 20 lockstep steps, then the notice in the middle of the 21st
    const auto go = clk::now() + 10ms;
    holdfast::publisher().publish(dir / "go", std::to_string(go.time_since_epoch().count()));
    std::this_thread::sleep_until(go + 20 * step + step / 2);
  }
  const std::int64_t t0 = now_ns();
  kids[0].kill(SIGTERM);
  std::int64_t last = 0;
  for (int t = 0; t < w; ++t) {
    const std::string out = dir / ("saved-" + std::to_string(t));
    if (!holdfast::await_file(out, 30s)) return -1;
    last = std::max(last, read_ns(out));
  }
  for (auto& k : kids) k.kill(SIGKILL);
  for (auto& k : kids) (void)k.wait(30s);
  return static_cast<double>(last - t0);
}

template <class Backend>
void register_processes(const char* name) {
  for (int w : {4, 16}) {
    std::string s = std::string(name) + "/" + std::to_string(w);
    bench::registry().push_back({"handler/notice->saved/processes/" + s,
                                 [w](std::size_t) {
                                   if (std::is_same_v<Backend, etcd_backend> && !etcd()) return 0.0;
                                   return processes_notice_to_saved<Backend>(w, true);
                                 },
                                 "bare broadcast/watch/processes/" + s,
                                 [w](std::size_t) {
                                   if (std::is_same_v<Backend, etcd_backend> && !etcd()) return 0.0;
                                   return processes_notice_to_saved<Backend>(w, false);
                                 },
                                 bench::config{1, 9, 1, 0}});
  }
}

[[maybe_unused]] const bool registered = [] {
  register_processes<fs_backend>("filesystem");
  register_processes<etcd_backend>("etcd");
  return true;
}();

}  // namespace
