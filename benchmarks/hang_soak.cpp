// benchmarks/hang_soak.cpp — the hang detector's no-false-positive run (issue 34, item 6): a real
// preemption_handler with the hang detector on trains for M minutes beside a CPU hog, and no
// verdict may come. Its own executable, holdfast_hang_soak, run by hand (30 minutes by default):
//
//   holdfast_hang_soak [--minutes M] [--hog K] [--seed S] [--multiplier X]
//
//   - The handler: preemption_handler<signal_notice config, in_process_kv, checkpoint_manager<>,
//     steady_clock, counting_hang> where counting_hang is a Hang policy (detects = true) that
//     counts the verdicts and prints each one.
//   - A step: busy-work (a quarter of its length, calibrated unloaded, so the hog stretches it)
//     then a sleep, log-normal around a median of 20 ms (sigma 0.3), 1 % of the steps 10x; a
//     periodic save every 200 steps (checkpoint_manager to a temp directory, a small state).
//   - The hog: K threads spinning (default: the hardware threads), so steps and the watcher
//     compete for the cores.
//   - hang_options: the default multiplier (--multiplier 1 shows the run can fail: verdicts and
//     exit 1 within a minute or two) and window; floors scaled to the job (a few medians:
//     below what the learned rule gives, so the rule decides) and a warm-up of one window with a
//     floor over a 10x step and a long save (printed).
// Prints the duration, the steps, the saves, the verdicts (the exit status is 1 unless 0), the
// final learned bounds (learned_hang_bounds()) and the largest ratio of a step's length (from
// one run() to the next: the interval the handler times, a periodic save between the two
// included) to the step bound the handler held for it (hang_bound(hang_phase::step), read as the
// step starts).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <holdfast/checkpoint.hpp>
#include <holdfast/handler.hpp>
#include <holdfast/kv/in_process.hpp>
#include <holdfast/termination.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../tests/support/temp_dir.hpp"
#include "environment.hpp"

namespace {

using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The Hang policy under test: counts verdicts (the handler's watcher calls act once per verdict).
struct counting_hang {
  static inline std::atomic<int> verdicts{0};
  static constexpr bool detects = true;
  static constexpr bool ends_job = false;  // as hang_report: outside a round, ctl/hang
  static void act(const holdfast::hang_verdict& v, const holdfast::hang_options&) noexcept {
    verdicts.fetch_add(1);
    std::fprintf(stderr, "hang_soak: VERDICT: %s\n", v.describe().c_str());
  }
};

using config = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, holdfast::no_exit>;
using handler = holdfast::preemption_handler<config, holdfast::in_process_kv,
                                             holdfast::checkpoint_manager<>, clk, counting_hang>;

template <class T>
inline void keep(T& v) {
  asm volatile("" : "+r"(v) : : "memory");  // the busy-work is not optimized away
}

void busy(std::uint64_t iterations, std::uint64_t& x) {
  for (std::uint64_t i = 0; i < iterations; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    keep(x);
  }
}

// Iterations of busy() per nanosecond, unloaded (before the hog starts).
double calibrate() {
  std::uint64_t x = 1, n = 1 << 16;
  for (;;) {
    const auto t0 = clk::now();
    busy(n, x);
    const auto dt = std::chrono::duration<double, std::nano>(clk::now() - t0).count();
    if (dt > 50e6) return static_cast<double>(n) / dt;
    n *= 2;
  }
}

double ms(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) / 1e6; }

struct args {
  double minutes = 30;
  unsigned hog = std::max(1u, std::thread::hardware_concurrency());
  std::uint64_t seed = 1;
  double multiplier = holdfast::hang_options{}.multiplier;
};

bool parse(int argc, char** argv, args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc) return false;
    if (s == "--minutes")
      a.minutes = std::atof(argv[++i]);
    else if (s == "--hog")
      a.hog = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (s == "--multiplier")
      a.multiplier = std::atof(argv[++i]);
    else if (s == "--seed")
      a.seed = std::strtoull(argv[++i], nullptr, 10);
    else
      return false;
  }
  return a.minutes > 0 && a.multiplier > 0;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  if (!parse(argc, argv, a)) {
    std::fprintf(stderr,
                 "usage: holdfast_hang_soak [--minutes M] [--hog K] [--seed S] [--multiplier X]\n");
    return 2;
  }
  std::printf("%s\n", bench::environment().c_str());
  constexpr auto median = 20ms;
  constexpr int save_every = 200;

  holdfast::hang_options ho;  // the default window
  ho.multiplier = a.multiplier;
  ho.step_floor = 2 * median;
  ho.save_floor = 2 * median;
  ho.restore_floor = 60 * median;
  ho.warmup_steps = ho.window_steps;  // one window (see tests/hang_learner_test.cpp)
  ho.warmup_floor = 60 * median;      // over a 10x step and a save of 30 steps in the warm-up
  ho.period = 100ms;
  std::printf(
      "hang_options: multiplier %.1f, window %u steps, warm-up %u steps, floors: step %lld "
      "ms, warm-up %lld ms, save %lld ms; step median %lld ms, 1 %% at 10x, a save every "
      "%d steps; hog %u threads; %.2f minutes\n",
      ho.multiplier, ho.window_steps, ho.warmup_steps,
      static_cast<long long>(ho.step_floor.count()),
      static_cast<long long>(ho.warmup_floor.count()),
      static_cast<long long>(ho.save_floor.count()), static_cast<long long>(median.count()),
      save_every, a.hog, a.minutes);
  std::fflush(stdout);

  const double per_ns = calibrate();
  std::atomic<bool> stop{false};
  std::vector<std::thread> hog;
  for (unsigned i = 0; i < a.hog; ++i)
    hog.emplace_back([&stop] {
      std::uint64_t x = 7;
      while (!stop.load(std::memory_order_relaxed)) busy(1 << 14, x);
    });

  holdfast_test::temp_dir dir("hang-soak");
  std::vector<char> state(64 * 1024, 'w');  // the "model"
  holdfast::checkpoint_manager<> ckpt(holdfast::store::create(dir / "store"), "soak");
  ckpt.set_writer([&](const std::string& d) {
    std::ofstream(d + "/state", std::ios::binary)
        .write(state.data(), static_cast<std::streamsize>(state.size()));
  });
  ckpt.set_reader([](const std::string&) {});
  holdfast::in_process_kv kv(holdfast::kv_namespace("soak", 1));
  holdfast::handler_options o;
  o.hang = ho;
  handler h(config{}, kv, {0, 1, "soak"}, std::move(ckpt), o);

  std::mt19937_64 rng(a.seed);
  std::normal_distribution<double> z(0.0, 0.3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::uint64_t x = 1, steps = 0, saves = 0, over = 0;
  double max_ratio = 0;
  clk::time_point prev_start{};
  std::chrono::nanoseconds prev_bound{0};
  const auto t0 = clk::now();
  const auto end = t0 + std::chrono::duration_cast<clk::duration>(
                            std::chrono::duration<double, std::ratio<60>>(a.minutes));
  while (clk::now() < end) {
    double d = static_cast<double>(std::chrono::nanoseconds(median).count()) * std::exp(z(rng));
    if (u(rng) < 0.01) d *= 10.0;
    h.run([&] {
      // The previous step, from its start to this one's, against the bound it was held to.
      const auto start = clk::now();
      if (prev_bound.count() > 0) {
        const auto len = std::chrono::duration_cast<std::chrono::nanoseconds>(start - prev_start);
        max_ratio = std::max(
            max_ratio, static_cast<double>(len.count()) / static_cast<double>(prev_bound.count()));
        if (len >= prev_bound) ++over;
      }
      prev_start = start;
      prev_bound = h.hang_bound(holdfast::hang_phase::step);
      busy(static_cast<std::uint64_t>(d / 4 * per_ns), x);
      std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<std::int64_t>(d * 3 / 4)));
    });
    ++steps;
    if (steps % save_every == 0) {  // a periodic save, as a training loop makes one
      h.checkpointer().save(h.total_run_calls());
      ++saves;
    }
  }
  const double secs = std::chrono::duration<double>(clk::now() - t0).count();
  stop = true;
  for (auto& t : hog) t.join();

  const holdfast::hang_bounds b = h.learned_hang_bounds();
  const int verdicts = counting_hang::verdicts.load();
  std::printf("duration %.1f s, steps %llu, saves %llu, verdicts %d\n", secs,
              static_cast<unsigned long long>(steps), static_cast<unsigned long long>(saves),
              verdicts);
  std::printf(
      "learned: longest step %.1f ms over the last window(s) (%llu steps timed), step "
      "bound %.1f ms; largest step / its bound %.3f; steps past their bound %llu\n",
      ms(b.step), static_cast<unsigned long long>(b.steps),
      ms(h.hang_bound(holdfast::hang_phase::step)), max_ratio,
      static_cast<unsigned long long>(over));
  h.shutdown();
  return verdicts == 0 ? 0 : 1;
}
