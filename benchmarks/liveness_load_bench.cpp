// The liveness signal's idle cost on etcd (issue 34, item 3: <= 0.2 requests per worker-second
// above today's idle handler).
//
//   handler/idle/liveness/etcd/8/...   8 idle handlers (default handler_options, 10 ms steps),
//                                      each beside a liveness_monitor on its client (lease TTL
//                                      liveness_default_ttl, leased_prefix
//                                      liveness_leased_prefix(run)), for 20 s: the mean time
//                                      between two HTTP requests of one worker
//   handler/idle/etcd/8/...            (baseline) the same handlers without lease or monitor
// A "# handler/idle/liveness" line prints both as requests per worker-second, and the
// difference. The handler does not own the monitor yet; the integration puts one beside it on
// the same client, which is what is measured here.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <holdfast/handler.hpp>
#include <holdfast/handler/liveness.hpp>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "scale_threads.hpp"

namespace {

using namespace std::chrono_literals;
using namespace bench::scale;

constexpr int workers = 8;
constexpr auto window = 20s;

// Requests per worker-second of the last run with and without liveness (-1: not run yet).
double last_with = -1, last_without = -1;

// `k` handlers idle for `window`, each with its own counted etcd client; with `liveness`, the
// client leases the liveness keys and a monitor runs beside each handler. Returns the mean time
// between two HTTP requests of one worker (ns), and stores requests per worker-second.
double idle_ns(int k, bool liveness) {
  const std::string run = "r";
  holdfast::kv_namespace ns("live" + std::to_string(next_run()), "0");
  holdfast::etcd_options o;
  o.endpoints = {etcd()->url()};
  if (liveness) {
    o.lease_ttl = holdfast::liveness_default_ttl;
    o.leased_prefix = holdfast::liveness_leased_prefix(run);
  }
  std::vector<counted_etcd> kvs;
  kvs.reserve(static_cast<std::size_t>(k));
  for (int t = 0; t < k; ++t) kvs.emplace_back(std::in_place, o, ns);
  std::vector<std::unique_ptr<bench_notice::cell>> cells;
  std::atomic<std::int64_t> saved{0};
  std::atomic<int> verdicts{0};
  for (int t = 0; t < k; ++t) cells.push_back(std::make_unique<bench_notice::cell>());
  start_gate gate;
  std::atomic<bool> quit{false};
  std::vector<std::thread> th;
  for (int t = 0; t < k; ++t)
    th.emplace_back([&, t] {
      const auto i = static_cast<std::size_t>(t);
      bool arrived = false;
      try {
        holdfast::preemption_handler<bench_config, counted_etcd, stamp_checkpoints> h(
            bench_config(bench_notice{cells[i].get()}), kvs[i], {t, k, run},
            stamp_checkpoints{&saved});
        std::optional<holdfast::liveness_monitor<counted_etcd>> mon;
        if (liveness) {
          mon.emplace(kvs[i], "holdfast/" + run + "/", t, k,
                      [&](int, std::chrono::milliseconds) { ++verdicts; });
          if (!mon->active()) std::printf("# handler/idle/liveness: task %d: not active\n", t);
        }
        arrived = true;
        gate.arrive_and_wait();
        while (!quit.load()) h.run([] { std::this_thread::sleep_for(10ms); });
      } catch (const std::exception& e) {
        std::printf("# handler/idle/liveness: task %d: %s\n", t, e.what());
      }
      if (!arrived) gate.arrive_and_wait();
    });
  double result = -1;
  if (gate.wait_arrived(k, 60s)) {
    gate.open();
    std::this_thread::sleep_for(1s);  // start-up: the keys put, the watches open and look once
    const std::uint64_t r0 = requests(kvs);
    const auto t0 = clk::now();
    std::this_thread::sleep_for(window);
    const std::uint64_t r1 = requests(kvs);
    const double worker_s = k * std::chrono::duration<double>(clk::now() - t0).count();
    const double per_worker_s = static_cast<double>(r1 - r0) / worker_s;
    (liveness ? last_with : last_without) = per_worker_s;
    if (verdicts.load() != 0)
      std::printf("# handler/idle/liveness: %d false verdicts while idle\n", verdicts.load());
    if (last_with >= 0 && last_without >= 0) {
      std::printf(
          "# handler/idle/liveness/etcd/%d: %.3f requests per worker-second with liveness (TTL "
          "%lld s), %.3f without: %+.3f (target <= +0.2)\n",
          k, last_with, static_cast<long long>(holdfast::liveness_default_ttl.count()),
          last_without, last_with - last_without);
      last_with = last_without = -1;
    }
    std::fflush(stdout);
    result = 1e9 * worker_s / static_cast<double>(std::max<std::uint64_t>(1, r1 - r0));
  } else {
    gate.open();
  }
  quit = true;
  for (auto& x : th) x.join();
  return result;
}

bench::registrar idle_liveness{{"handler/idle/liveness/etcd/8/ns-between-requests-per-worker",
                                [](std::size_t) { return etcd() ? idle_ns(workers, true) : 0.0; },
                                "handler/idle/etcd/8/ns-between-requests-per-worker",
                                [](std::size_t) { return etcd() ? idle_ns(workers, false) : 0.0; },
                                bench::config{1, 1, 0, 0}}};
}  // namespace
