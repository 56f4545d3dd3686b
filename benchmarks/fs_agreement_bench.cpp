// The filesystem store's cost per agreement, counted, not timed (issue 32, item 11).
//
//   handler/filesystem/counts/<N>  N worker threads, each a preemption_handler over one
//                                  basic_filesystem_kv<inotify_wait, no_sync, counting_io> on a
//                                  temporary directory, run 1 + kRounds agreements in a row
//                                  (no_exit: each save re-arms; task 0 is noticed anew once all
//                                  served the last). The row's time is the wall time of one
//                                  agreement; "# handler/filesystem/counts" lines print, for the
//                                  first round and per later round, the files created, the
//                                  directories created, and the inotify wake-ups of each worker
//                                  (the claimant's apart: it also watches the round's acks),
//                                  counted with counting_io.hpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <holdfast/handler.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../tests/support/handler_harness.hpp"  // worker_state, memory_checkpoints, repeat_notice
#include "../tests/support/temp_dir.hpp"
#include "bench.hpp"
#include "counting_io.hpp"

namespace {

using namespace std::chrono_literals;
using fs_kv =
    holdfast::basic_filesystem_kv<holdfast::inotify_wait, holdfast::no_sync, bench::counting_io>;
constexpr int kRounds = 5;

// One round's counts: the sums, and the wake-ups of each thread that had any.
struct round_counts {
  std::uint64_t files = 0, dirs = 0;
  std::vector<std::uint64_t> wakeups;  // sorted, largest last (the claimant's watcher)
};

round_counts diff(const std::map<std::thread::id, bench::fs_counts>& before,
                  const std::map<std::thread::id, bench::fs_counts>& after) {
  round_counts r;
  for (const auto& [id, c] : after) {
    bench::fs_counts b;
    if (auto it = before.find(id); it != before.end()) b = it->second;
    r.files += c.files - b.files;
    r.dirs += c.dirs - b.dirs;
    if (c.wakeups > b.wakeups) r.wakeups.push_back(c.wakeups - b.wakeups);
  }
  std::sort(r.wakeups.begin(), r.wakeups.end());
  return r;
}

// The counts once they stop changing (the round's cleanup runs in the watchers after the
// saves): unchanged over 20 ms, within 2 s.
std::map<std::thread::id, bench::fs_counts> settled() {
  auto same = [](const auto& a, const auto& b) {
    if (a.size() != b.size()) return false;
    for (const auto& [id, c] : a) {
      auto it = b.find(id);
      if (it == b.end() || it->second.files != c.files || it->second.dirs != c.dirs ||
          it->second.wakeups != c.wakeups)
        return false;
    }
    return true;
  };
  auto now = bench::counting_io::snapshot();
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(20ms);
    auto next = bench::counting_io::snapshot();
    if (same(now, next)) break;
    now = std::move(next);
  }
  return now;
}

void print_round(const char* what, int n, const round_counts& c, double rounds) {
  std::uint64_t claimant = c.wakeups.empty() ? 0 : c.wakeups.back();
  std::uint64_t others = 0, sum = 0;
  for (std::size_t i = 0; i + 1 < c.wakeups.size(); ++i) {
    others = std::max(others, c.wakeups[i]);
    sum += c.wakeups[i];
  }
  const double mean = n > 1 ? static_cast<double>(sum) / (n - 1) : 0;
  std::printf(
      "# handler/filesystem/counts/%d %s: files created %.2f, directories created %.2f, "
      "inotify wake-ups per non-claimant worker %.2f (the most: %.2f), of the claimant %.2f\n",
      n, what, static_cast<double>(c.files) / rounds, static_cast<double>(c.dirs) / rounds,
      mean / rounds, static_cast<double>(others) / rounds, static_cast<double>(claimant) / rounds);
}

// Runs 1 + kRounds agreements between n threads; returns the ns one later agreement took.
double agreements(int n) {
  using cfg = holdfast::termination_config<holdfast_test::repeat_notice, holdfast::no_exit>;
  holdfast_test::temp_dir dir;
  fs_kv kv(dir.path(), holdfast::kv_namespace("counts", 0));
  std::atomic<std::int64_t> at_ns{0};  // task 0's notice; the others are never noticed
  std::atomic<std::int64_t> never{0};
  std::vector<std::atomic<int>> served(static_cast<std::size_t>(n));
  std::vector<std::atomic<std::int64_t>> pos(static_cast<std::size_t>(n));
  std::atomic<bool> done{false};
  std::vector<holdfast_test::worker_state> st(static_cast<std::size_t>(n));
  std::vector<std::thread> th;
  bench::counting_io::reset();
  for (int t = 0; t < n; ++t)
    th.emplace_back([&, t] {
      holdfast::handler_options o;
      o.ack_timeout = 10s;
      holdfast::preemption_handler<cfg, fs_kv, holdfast_test::memory_checkpoints> h(
          cfg(holdfast_test::repeat_notice{t == 0 ? &at_ns : &never}, holdfast::no_exit{}), kv,
          {t, n, "counts"}, {&st[static_cast<std::size_t>(t)]}, o);
      auto& mine = pos[static_cast<std::size_t>(t)];
      while (!done.load()) {
        mine.store(h.total_run_calls());
        auto coupled = [&] {  // like a collective: no worker runs ahead of the slowest by 2
          for (;;) {
            std::int64_t low = mine.load();
            for (auto& p : pos) low = std::min(low, p.load());
            if (done.load() || mine.load() <= low + 1) return;
            std::this_thread::yield();
          }
        };
        if (h.run(coupled) == holdfast::run_status::stopped) ++served[static_cast<std::size_t>(t)];
      }
    });
  auto all_served = [&](int r) {
    auto deadline = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      bool all = true;
      for (auto& s : served) all = all && s.load() >= r;
      if (all) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(100us);
    }
  };
  auto before = settled();
  round_counts first, later;
  std::int64_t later_ns = 0;
  bool ok = true;
  for (int r = 1; r <= 1 + kRounds && ok; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    at_ns.store(t0.time_since_epoch().count());
    ok = all_served(r);
    const auto t1 = std::chrono::steady_clock::now();
    auto after = settled();
    round_counts c = diff(before, after);
    before = std::move(after);
    if (r == 1) {
      first = c;
      continue;
    }
    later_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    later.files += c.files;
    later.dirs += c.dirs;
    later.wakeups.resize(std::max(later.wakeups.size(), c.wakeups.size()));
    // the largest (the claimant's) last in each: add them rank by rank from the top
    for (std::size_t i = 0; i < c.wakeups.size(); ++i)
      later.wakeups[later.wakeups.size() - 1 - i] += c.wakeups[c.wakeups.size() - 1 - i];
  }
  done.store(true);
  for (auto& x : th) x.join();
  if (!ok) {
    std::fprintf(stderr, "handler/filesystem/counts/%d: a round did not finish in 30 s\n", n);
    std::exit(1);
  }
  for (std::size_t t = 1; t < st.size(); ++t)
    if (st[t].saved_steps != st[0].saved_steps) {
      std::fprintf(stderr, "handler/filesystem/counts/%d: workers saved different steps\n", n);
      std::exit(1);
    }
  static bool printed = false;
  if (!std::exchange(printed, true)) {
    print_round("round 1", n, first, 1);
    print_round("per later round", n, later, kRounds);
  }
  return static_cast<double>(later_ns) / kRounds;
}

const bench::registrar counts_4{bench::case_def{"handler/filesystem/counts/4",
                                                [](std::size_t) { return agreements(4); },
                                                "",
                                                {},
                                                bench::config{1, 1, 0, 0}}};

}  // namespace
