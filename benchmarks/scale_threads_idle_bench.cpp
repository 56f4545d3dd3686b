// The step agreement at cluster scale (issue 21): what idle handlers cost the store.
//
//   handler/idle/etcd/16/...    16 idle handlers (default handler_options) for 5 s: the mean time
//                               between two HTTP requests of one worker (etcd_kv::stats()); the
//                               "# handler/idle" line prints it as requests per worker-second.
// The etcd, the clients, the notice and the gate are scale_threads.hpp's.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <holdfast/handler.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "scale_threads.hpp"

namespace {

using namespace std::chrono_literals;
using namespace bench::scale;

// ---- idle ---------------------------------------------------------------------------------------

// K handlers with the default handler_options train (10 ms steps) with no notice for 5 s (two
// periods of the watch's health probe, every max(1 s, request_timeout / 2) = 2.5 s by default):
// the mean time between two HTTP requests of one worker (etcd_kv::stats()).
double idle_ns_between_requests(int k) {
  constexpr auto window = 5s;
  holdfast::kv_namespace ns("idle" + std::to_string(next_run()), "0");
  std::vector<counted_etcd> kvs = etcd_clients(k, ns);
  std::vector<std::unique_ptr<bench_notice::cell>> cells;
  std::atomic<std::int64_t> saved{0};
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
            bench_config(bench_notice{cells[i].get()}), kvs[i], {t, k, "r"},
            stamp_checkpoints{&saved});
        arrived = true;
        gate.arrive_and_wait();
        while (!quit.load()) h.run([] { std::this_thread::sleep_for(10ms); });
      } catch (const std::exception& e) {
        std::printf("# handler/idle: task %d: %s\n", t, e.what());
      }
      if (!arrived) gate.arrive_and_wait();
    });
  double result = -1;
  if (gate.wait_arrived(k, 60s)) {
    gate.open();
    std::this_thread::sleep_for(500ms);  // start-up: the watches open and look once
    const std::uint64_t r0 = requests(kvs);
    const auto t0 = clk::now();
    std::this_thread::sleep_for(window);
    const std::uint64_t r1 = requests(kvs);
    const double worker_s = k * std::chrono::duration<double>(clk::now() - t0).count();
    const double per_worker_s = static_cast<double>(r1 - r0) / worker_s;
    if (first_time("idle/" + std::to_string(k)))
      std::printf(
          "# handler/idle/etcd/%d: %.3f HTTP requests per worker-second idle (default "
          "handler_options, %llu requests in %.1f worker-s; target <= 1)\n",
          k, per_worker_s, static_cast<unsigned long long>(r1 - r0), worker_s);
    std::fflush(stdout);
    result = 1e9 * worker_s / static_cast<double>(std::max<std::uint64_t>(1, r1 - r0));
  } else {
    gate.open();
  }
  quit = true;
  for (auto& x : th) x.join();
  return result;
}

bench::registrar idle16{{"handler/idle/etcd/16/ns-between-requests-per-worker",
                         [](std::size_t) { return etcd() ? idle_ns_between_requests(16) : 0.0; },
                         "",
                         {},
                         bench::config{1, 3, 0, 0}}};
}  // namespace
