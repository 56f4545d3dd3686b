// The step agreement at cluster scale (issue 21), on threads against one etcd.
//
//   handler/scale/etcd/<N>      N threads in this process, each a preemption_handler (no_exit) with
//                               its own etcd_kv client to one etcd on loopback: notice -> all
//                               saved, against a bare broadcast through the same etcd (one insert,
//                               N - 1 watch objects waiting for it). "# handler/scale" lines print
//                               HTTP requests per worker per agreement (etcd_kv::stats()), store
//                               operations by kind (counting_kv) and the memory per handler (RSS
//                               delta / N).
// The simulated rows are in scale_model_bench.cpp, the idle ones in scale_threads_idle_bench.cpp;
// what they share with this file is in scale_threads.hpp.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <holdfast/handler.hpp>
#include <holdfast/kv/etcd.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "scale_threads.hpp"

namespace {

using namespace std::chrono_literals;
using namespace bench::scale;

// ================================================================================================
// Threads against one etcd.

// Resident set size of this process, bytes.
double rss_bytes() {
  std::ifstream in("/proc/self/statm");
  double pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// Training steps in lock step, as a collective would keep them: step k ends at start + (k + 1)
// periods. The period grows with N (max(1 ms, N x 20 us)) so that N threads on a 2-core machine
// make at most 50k step wake-ups a second.
std::chrono::microseconds step_period(int n) {
  return std::max(std::chrono::microseconds(1000), std::chrono::microseconds(20) * n);
}

struct scale_figures {
  double requests_per_worker = 0;  // HTTP requests (etcd_kv::stats())
  holdfast::kv_counts ops;         // store operations of every worker
  holdfast::kv_counts claimant;    // of task 0 (noticed: it claims and reads the acks)
  double rss_per_worker = 0;
  int threads = 0;
};

holdfast::kv_counts minus(holdfast::kv_counts a, const holdfast::kv_counts& b) {
  a.insert -= b.insert;
  a.put -= b.put;
  a.try_get -= b.try_get;
  a.get -= b.get;
  a.list -= b.list;
  a.erase -= b.erase;
  a.erase_prefix -= b.erase_prefix;
  a.failed -= b.failed;
  return a;
}
holdfast::kv_counts total_counts(const std::vector<counted_etcd>& kvs) {
  holdfast::kv_counts s;
  for (const auto& kv : kvs) {
    const auto c = kv.counts();
    s.insert += c.insert;
    s.put += c.put;
    s.try_get += c.try_get;
    s.get += c.get;
    s.list += c.list;
    s.erase += c.erase;
    s.erase_prefix += c.erase_prefix;
    s.failed += c.failed;
  }
  return s;
}

// N handlers (threads, no_exit, each with its own etcd client); task 0 is noticed once all run.
// Returns ns from the notice until the last save, or -1 on an error.
double scale_notice_to_saved(int n, scale_figures& fig) {
  holdfast::kv_namespace ns("scale" + std::to_string(next_run()), "0");
  const double rss0 = rss_bytes();
  std::vector<counted_etcd> kvs = etcd_clients(n, ns);
  std::vector<std::unique_ptr<bench_notice::cell>> cells;
  std::vector<std::unique_ptr<std::atomic<std::int64_t>>> saved;
  for (int t = 0; t < n; ++t) {
    cells.push_back(std::make_unique<bench_notice::cell>());
    saved.push_back(std::make_unique<std::atomic<std::int64_t>>(0));
  }
  start_gate gate;
  std::atomic<clk::time_point> start{clk::time_point{}};
  std::mutex err_m;
  std::string err;
  const auto period = step_period(n);
  std::vector<std::thread> th;
  th.reserve(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t)
    th.emplace_back([&, t] {
      const auto i = static_cast<std::size_t>(t);
      bool arrived = false;
      try {
        holdfast::handler_options o;
        o.ack_timeout = 60s;  // bounds a failed round; an agreement here takes < 2 s
        holdfast::preemption_handler<bench_config, counted_etcd, stamp_checkpoints> h(
            bench_config(bench_notice{cells[i].get()}), kvs[i], {t, n, "r"},
            stamp_checkpoints{saved[i].get()}, o);
        arrived = true;
        gate.arrive_and_wait();
        const clk::time_point t0 = start.load();
        for (;;) {
          const auto k = h.total_run_calls();
          if (h.run([&] { std::this_thread::sleep_until(t0 + (k + 1) * period); }) ==
              holdfast::run_status::stopped)
            break;
          if (clk::now() > t0 + 120s) throw std::runtime_error("no save within 120 s");
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(err_m);
        if (err.empty()) err = "task " + std::to_string(t) + ": " + e.what();
      }
      if (!arrived) gate.arrive_and_wait();
    });
  fig.threads = 2 * n + 1;
  double result = -1;
  if (gate.wait_arrived(n, 120s)) {
    start.store(clk::now() + 20ms);
    gate.open();
    std::this_thread::sleep_for(500ms);  // every watcher has opened its watch and looked
    const double rss1 = rss_bytes();
    const std::uint64_t r0 = requests(kvs);
    const holdfast::kv_counts c0 = total_counts(kvs), claimant0 = kvs[0].counts();
    const std::int64_t t0 = now_ns();
    cells[0]->fire();
    for (auto& x : th) x.join();
    std::int64_t last = 0;
    for (auto& s : saved) last = std::max(last, s->load());
    fig.requests_per_worker = static_cast<double>(requests(kvs) - r0) / n;
    fig.ops = minus(total_counts(kvs), c0);
    fig.claimant = minus(kvs[0].counts(), claimant0);
    fig.rss_per_worker = (rss1 - rss0) / n;
    if (err.empty() && last > t0) result = static_cast<double>(last - t0);
  } else {
    err = "the handlers did not start within 120 s";
    gate.open();
    for (auto& x : th) x.join();
  }
  if (!err.empty()) std::printf("# handler/scale/etcd/%d: error: %s\n", n, err.c_str());
  return result;
}

// The floor: task 0 inserts one key when told; N - 1 threads, each with a watch object on its
// own client, wake from poll() when the watch brings it.
double scale_broadcast(int n) {
  holdfast::kv_namespace ns("bcast" + std::to_string(next_run()), "0");
  std::vector<counted_etcd> kvs = etcd_clients(n, ns);
  std::vector<std::atomic<std::int64_t>> saved(static_cast<std::size_t>(n));
  start_gate ready;
  std::mutex go_m;
  std::condition_variable go_cv;
  bool go = false;
  std::atomic<bool> failed{false};
  std::vector<std::thread> th;
  th.reserve(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t)
    th.emplace_back([&, t] {
      const auto i = static_cast<std::size_t>(t);
      bool arrived = false;
      try {
        if (t == 0) {
          arrived = true;
          ready.arrive_and_wait();
          std::unique_lock<std::mutex> l(go_m);
          go_cv.wait(l, [&] { return go; });
          l.unlock();
          kvs[0].insert("b/stop", "0");
          saved[i].store(now_ns());
          return;
        }
        auto w = kvs[i].watch("b");
        (void)w.take();  // the first take: resync (the key is not there yet)
        arrived = true;
        ready.arrive_and_wait();
        const auto limit = clk::now() + 30s;
        while (clk::now() < limit) {
          if (!w.buffered()) {
            auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::min(w.due(), limit) - clk::now());
            pollfd p{w.fd(), POLLIN, 0};
            ::poll(&p, w.fd() >= 0 ? 1 : 0,
                   static_cast<int>(std::max<std::int64_t>(0, wait.count()) + 1));
          }
          auto c = w.take();
          bool seen = false;
          for (const auto& e : c.events) seen = seen || (e.key == "b/stop" && e.value);
          if (c.resync && !seen) seen = kvs[i].try_get("b/stop").has_value();
          if (seen) {
            saved[i].store(now_ns());
            return;
          }
        }
        failed = true;
      } catch (const std::exception& e) {
        std::printf("# handler/scale: bare broadcast task %d: %s\n", t, e.what());
        failed = true;
      }
      if (!arrived) ready.arrive_and_wait();
    });
  double result = -1;
  if (ready.wait_arrived(n, 120s)) {
    ready.open();
    std::this_thread::sleep_for(200ms);
    const std::int64_t t0 = now_ns();
    {
      std::lock_guard<std::mutex> l(go_m);
      go = true;
    }
    go_cv.notify_all();
    for (auto& x : th) x.join();
    std::int64_t last = 0;
    for (auto& s : saved) last = std::max(last, s.load());
    if (!failed) result = static_cast<double>(last - t0);
  } else {
    ready.open();
    {
      std::lock_guard<std::mutex> l(go_m);
      go = true;
    }
    go_cv.notify_all();
    for (auto& x : th) x.join();
  }
  return result;
}

[[maybe_unused]] const bool scale_registered = [] {
  for (int n : {16, 64, 256}) {
    const std::string s = std::to_string(n);
    bench::registry().push_back(
        {"handler/scale/etcd/" + s,
         [n](std::size_t) {
           if (!etcd()) return 0.0;
           scale_figures f;
           const double ns = scale_notice_to_saved(n, f);
           if (ns > 0 && first_time("scale/" + std::to_string(n))) {
             auto per = [n](std::uint64_t v) { return static_cast<double>(v) / n; };
             std::printf(
                 "# handler/scale/etcd/%d: per worker per agreement: %.2f HTTP requests "
                 "(etcd_kv::stats()), store ops insert %.3f put %.2f try_get %.2f get %.2f list "
                 "%.2f erase %.2f; claimant: get %llu try_get %llu insert %llu\n",
                 n, f.requests_per_worker, per(f.ops.insert), per(f.ops.put), per(f.ops.try_get),
                 per(f.ops.get), per(f.ops.list), per(f.ops.erase),
                 static_cast<unsigned long long>(f.claimant.get),
                 static_cast<unsigned long long>(f.claimant.try_get),
                 static_cast<unsigned long long>(f.claimant.insert));
             std::printf(
                 "# handler/scale/etcd/%d: %.0f KiB RSS per handler (RSS delta / N: its etcd "
                 "client, watch and 2 threads), step period %lld us, %d threads\n",
                 n, f.rss_per_worker / 1024, static_cast<long long>(step_period(n).count()),
                 f.threads);
           }
           std::fflush(stdout);
           return ns;
         },
         "bare broadcast/watch/etcd/" + s,
         [n](std::size_t) { return etcd() ? scale_broadcast(n) : 0.0; },
         bench::config{1, 5, n >= 256 ? 0 : 1, 0}});
  }
  return true;
}();

}  // namespace
