// The benchmark runner: every case registered by the linked *_bench.cpp files.
//
//   holdfast_bench [--tsv] [--filter SUBSTRING] [--reps N] [--list]
//
// Prints an environment line, then one row per case: median, minimum and p99 ns per operation,
// the baseline's median, and the ratio case / baseline (medians). --tsv prints
// case<TAB>median_ns<TAB>baseline<TAB>baseline_median_ns<TAB>ratio for machines to read.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench.hpp"
#include "environment.hpp"  // bench::environment: the first line

namespace {

std::size_t calibrate(const bench::case_def& c) {
  if (c.cfg.iterations) return c.cfg.iterations;
  std::size_t n = 1;
  for (;;) {
    double ms = c.fn(n) / 1e6;
    if (c.baseline) ms = std::min(ms, c.baseline(n) / 1e6);
    if (ms >= c.cfg.min_rep_ms || n >= (std::size_t{1} << 30)) return n;
    n *= 2;
  }
}

void run(const bench::case_def& c, bool tsv, int reps_override) {
  std::size_t n = calibrate(c);
  for (int i = 0; i < c.cfg.warmup; ++i) {
    c.fn(n);
    if (c.baseline) c.baseline(n);
  }
  int reps = reps_override > 0 ? reps_override : c.cfg.repetitions;
  std::vector<double> a, b;
  for (int i = 0; i < reps; ++i) {
    auto one = [&](const bench::measure& m, std::vector<double>& out) {
      out.push_back(m(n) / static_cast<double>(n));
    };
    if (i % 2 == 0 || !c.baseline) {
      one(c.fn, a);
      if (c.baseline) one(c.baseline, b);
    } else {
      one(c.baseline, b);
      one(c.fn, a);
    }
  }
  auto sa = bench::summarize(a);
  auto sb = bench::summarize(b);
  bool has_base = static_cast<bool>(c.baseline);
  double ratio = has_base && sb.median > 0 ? sa.median / sb.median : 0;
  if (tsv) {
    std::printf("%s\t%.1f\t%s\t%s\t%s\n", c.name.c_str(), sa.median,
                has_base ? c.baseline_name.c_str() : "-",
                has_base ? std::to_string(sb.median).c_str() : "-",
                has_base ? std::to_string(ratio).c_str() : "-");
  } else if (has_base) {
    std::printf(
        "%-44s median %11.1f ns  min %11.1f  p99 %11.1f | %-34s median %11.1f ns | ratio %.3f\n",
        c.name.c_str(), sa.median, sa.min, sa.p99, c.baseline_name.c_str(), sb.median, ratio);
  } else {
    std::printf("%-44s median %11.1f ns  min %11.1f  p99 %11.1f | (no baseline)\n", c.name.c_str(),
                sa.median, sa.min, sa.p99);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool tsv = false, list = false;
  std::string filter;
  int reps = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tsv")
      tsv = true;
    else if (a == "--list")
      list = true;
    else if (a == "--filter" && i + 1 < argc)
      filter = argv[++i];
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--tsv] [--filter SUBSTRING] [--reps N] [--list]\n", argv[0]);
      return 2;
    }
  }
  std::printf("%s%s\n", tsv ? "# " : "", bench::environment().c_str());
  if (tsv) std::printf("case\tmedian_ns\tbaseline\tbaseline_median_ns\tratio\n");
  for (const auto& c : bench::registry()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    if (list)
      std::printf("%s\n", c.name.c_str());
    else
      run(c, tsv, reps);
  }
  return 0;
}
