// benchmarks/save_policy_bench.cpp — the save interval policy replayed on synthetic traces
// (issue 35, item 5): its own executable, holdfast_save_policy_bench (a simulation, not a
// timing: its figures are costs in simulated hours, the same on every machine).
//
//   holdfast_save_policy_bench [--traces N] [--days D] [--seed S] [--prior-off F]
//
// A job needs D days of work (7 by default) in steps of 1 s; a save blocks it for C (5 s or
// 60 s); each interruption costs a restart of 120 s. Interruptions arrive in the job's running
// time: unnoticed ones (killed, no usable notice) as a Poisson process of mean M (1 h, 4 h,
// 24 h), or Markov-modulated (bursty: calm 16 h mean between interruptions for a mean of 24 h,
// storms of 20 min for a mean of 2 h; M is the long-run mean, 3.47 h), plus noticed preemptions
// as a Poisson process of the same mean M (the preemption save keeps the work done; it costs
// C and the restart). An unnoticed interruption loses the work since the last committed save
// (and a save in progress). Cost of a run = its makespan - D days: lost work + saves +
// restarts.
//   - the policy: holdfast::basic_save_interval_policy on a simulated clock, a new one per
//     incarnation as after a real restart, told the counters a run_history would hold
//     (observe: running time, unnoticed interruptions; the last C); a save is taken at the first
//     step where should_save() says so. Its prior: M itself, and M x F (F = 4 by default: a
//     prior 4x too optimistic, the user guessed rarer interruptions; --prior-off 0.25 for one
//     4x too pessimistic).
//   - every fixed interval on a grid (Young's sqrt(2CM) x 2^(k/8), k = -32..32), on the same
//     traces (common random numbers), and the best of them in hindsight; then fixed intervals
//     4x shorter and 4x longer than that best.
// For each row: the mean cost over N traces (1000 by default), the ratios to the best fixed
// interval, and the acceptance (policy within 10 % of the best fixed, better than 4x too short
// and 4x too long). Exits 1 when a row with the right prior misses it. Deterministic: traces
// come from splitmix64 seeded by (seed, row, trace), no std distribution (their output differs
// between standard libraries). Runs in a few seconds in Release (--traces 100: under a second).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <holdfast/checkpoint/save_policy.hpp>
#include <string>
#include <vector>

#include "environment.hpp"  // bench::environment: the first line

namespace {

// --- traces -----------------------------------------------------------------------------------

// splitmix64: a tiny deterministic generator, the same bits everywhere.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double exponential(double mean) { return -mean * std::log1p(-uniform()); }
};

// The interruption process of a row.
struct process {
  const char* name;
  double mean;  // M: the long-run mean time between unnoticed interruptions (s)
  bool bursty;
};

// Markov-modulated rates of the bursty trace: calm and storm states.
constexpr double calm_mtbi = 16 * 3600.0, calm_dwell = 24 * 3600.0;
constexpr double storm_mtbi = 20 * 60.0, storm_dwell = 2 * 3600.0;
constexpr double bursty_mean =  // dwell-weighted rate, inverted
    (calm_dwell + storm_dwell) / (calm_dwell / calm_mtbi + storm_dwell / storm_mtbi);

struct event {
  double t;  // running time (s)
  bool noticed;
};

// One trace: its events, generated as far as a strategy asks (each strategy replays the same).
class trace {
 public:
  trace(const process& p, std::uint64_t seed) : p_(p), unnoticed_{seed}, noticed_{~seed} {
    storm_ = p_.bursty && unnoticed_.uniform() < storm_dwell / (calm_dwell + storm_dwell);
    dwell_end_ = p_.bursty ? unnoticed_.exponential(storm_ ? storm_dwell : calm_dwell) : 0;
    next_unnoticed_ = draw_unnoticed(0);
    next_noticed_ = noticed_.exponential(p_.mean);
  }
  const event& operator[](std::size_t i) {
    while (events_.size() <= i) {
      if (next_unnoticed_ < next_noticed_) {
        events_.push_back({next_unnoticed_, false});
        next_unnoticed_ = draw_unnoticed(next_unnoticed_);
      } else {
        events_.push_back({next_noticed_, true});
        next_noticed_ += noticed_.exponential(p_.mean);
      }
    }
    return events_[i];
  }

 private:
  double draw_unnoticed(double t) {
    if (!p_.bursty) return t + unnoticed_.exponential(p_.mean);
    for (;;) {  // memoryless within a state: redraw at each switch
      double c = t + unnoticed_.exponential(storm_ ? storm_mtbi : calm_mtbi);
      if (c < dwell_end_) return c;
      t = dwell_end_;
      storm_ = !storm_;
      dwell_end_ = t + unnoticed_.exponential(storm_ ? storm_dwell : calm_dwell);
    }
  }

  process p_;
  rng unnoticed_, noticed_;
  bool storm_ = false;
  double dwell_end_ = 0;
  double next_unnoticed_, next_noticed_;
  std::vector<event> events_;
};

// --- the job ----------------------------------------------------------------------------------

struct job {
  double work;     // s of work to do
  double step;     // s per step
  double cost;     // C: s a save blocks
  double restart;  // s per interruption
};

constexpr double give_up = 30;  // a run past give_up x the work counts as never finishing

// A run's cost, and its part no interval changes: restarts and preemption saves.
struct run_cost {
  double total = 0;
  double fixed = 0;
};

// A fixed interval T (rounded up to whole steps): per stretch between two events, whole cycles
// of work + save, then what the event leaves.
run_cost run_fixed(const job& j, trace& tr, double interval) {
  const double work = std::max(j.step, std::ceil(interval / j.step) * j.step);
  const double cycle = work + j.cost;
  double done = 0, now = 0, makespan = 0, other = 0;
  for (std::size_t i = 0;; ++i) {
    const event& e = tr[i];
    const double span = e.t - now;  // running time until the event
    const double left = j.work - done;
    const double cycles_to_end = std::ceil(left / work);
    const double finish = (cycles_to_end - 1) * cycle + (left - (cycles_to_end - 1) * work);
    if (finish <= span) return {makespan + finish - j.work, other};
    const double full = std::floor(span / cycle);
    done += full * work;
    const double rest = span - full * cycle;  // into the cycle the event cut
    if (e.noticed) {
      done += std::min(rest, work);  // the preemption save keeps it
      makespan += j.cost;
      other += j.cost;
    }
    makespan += span + j.restart;
    other += j.restart;
    now = e.t;
    if (makespan > give_up * j.work) return {HUGE_VAL, other};
  }
}

// The policy's simulated clock: seconds of running time.
struct sim_clock {
  using duration = std::chrono::duration<double>;
  using rep = double;
  using period = std::ratio<1>;
  using time_point = std::chrono::time_point<sim_clock, duration>;
  static time_point now() { return time_point(); }
};
using sim_policy = holdfast::basic_save_interval_policy<sim_clock>;

// The policy: a new one per incarnation, told what the run history would hold.
run_cost run_policy(const job& j, trace& tr, const holdfast::save_interval_options& o) {
  holdfast::run_counters history;
  std::optional<holdfast::save_seconds> last_cost;
  double done = 0, now = 0, makespan = 0, other = 0;
  auto at = [](double s) { return sim_clock::time_point(sim_clock::duration(s)); };
  for (std::size_t i = 0;; ++i) {
    const event& e = tr[i];
    sim_policy p(o);
    p.observe(history);
    if (last_cost) p.seed_save_cost(*last_cost);
    p.start(at(now));
    const double begin = now;
    double t = now;  // the incarnation's clock
    bool ended = false;
    while (!ended) {
      // work whole steps until should_save (or the job is done, or the event)
      const double last = p.last_save()->time_since_epoch().count();
      double k = std::max(1.0, std::ceil(p.interval(at(last)).count() / j.step));
      while (!p.should_save(at(last + k * j.step))) ++k;
      double work = k * j.step;
      const double left = j.work - done;
      if (work >= left && t + left <= e.t) return {makespan + (t + left - begin) - j.work, other};
      if (t + work > e.t) {  // cut in the work phase
        if (e.noticed) done += e.t - t;
        ended = true;
      } else if (t + work + j.cost > e.t) {  // cut in the save phase
        if (e.noticed) done += work;
        ended = true;
      } else {
        t += work + j.cost;
        done += work;
        p.record_save(holdfast::save_seconds(j.cost), at(t));
        last_cost = p.save_cost();
      }
    }
    history.exposure += holdfast::save_seconds(e.t - begin);
    ++history.incarnations;
    if (e.noticed)
      ++history.noticed;
    else
      ++history.unnoticed;
    if (e.noticed) makespan += j.cost, other += j.cost;  // the preemption save
    makespan += (e.t - begin) + j.restart;
    other += j.restart;
    now = e.t;
    if (makespan > give_up * j.work) return {HUGE_VAL, other};
  }
}

// --- the rows ---------------------------------------------------------------------------------

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  rng r{a * 0x9e3779b97f4a7c15ULL ^ b};
  return r.next();
}

std::string hours(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f h", s / 3600);
  return buf;
}

std::string span(double s) {
  char buf[32];
  if (s < 120)
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.2f h", s / 3600);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int traces = 1000;
  double days = 7;
  std::uint64_t seed = 35;
  double prior_off = 4;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--traces"))
      traces = std::max(1, std::atoi(value()));
    else if (!std::strcmp(argv[i], "--days"))
      days = std::max(0.1, std::atof(value()));
    else if (!std::strcmp(argv[i], "--seed"))
      seed = std::strtoull(value(), nullptr, 10);
    else if (!std::strcmp(argv[i], "--prior-off"))
      prior_off = std::max(0.01, std::atof(value()));
    else {
      std::fprintf(stderr, "usage: %s [--traces N] [--days D] [--seed S] [--prior-off F]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("%s\n", bench::environment().c_str());
  std::printf(
      "save interval policy, replayed: %d traces per row, %.3g days of work in 1 s steps, "
      "restart 120 s, noticed preemptions at the same mean as the unnoticed; cost = lost work "
      "+ saves + restarts per job (mean)\n\n",
      traces, days);
  char off_label[32];
  std::snprintf(off_label, sizeof off_label, "policy (prior %gM)", prior_off);
  std::printf("%-22s %5s | %-21s %-21s | %-9s %-10s | %-17s %-17s | %-8s | %s\n", "unnoticed M",
              "C", "policy (prior M)", off_label, "best T", "best cost", "T/4", "4T", "lost+sv",
              "accept");

  const process processes[] = {{"Poisson 1 h", 3600, false},
                               {"Poisson 4 h", 4 * 3600, false},
                               {"Poisson 24 h", 24 * 3600, false},
                               {"bursty (mean 3.47 h)", bursty_mean, true}};
  const double costs[] = {5, 60};
  const auto started = std::chrono::steady_clock::now();
  bool all_ok = true;
  std::uint64_t row = 0;
  for (const process& proc : processes)
    for (double c : costs) {
      ++row;
      const job j{days * 86400, 1, c, 120};
      holdfast::save_interval_options right, off;
      right.mtbi_prior = off.mtbi_prior = holdfast::save_seconds(proc.mean);
      off.mtbi_prior = holdfast::save_seconds(prior_off * proc.mean);
      const double young = std::sqrt(2 * c * proc.mean);
      std::vector<double> grid;
      for (int k = -32; k <= 32; ++k) grid.push_back(young * std::exp2(k / 8.0));
      std::vector<run_cost> fixed(grid.size());
      run_cost pol_right, pol_off;
      auto add = [](run_cost& sum, const run_cost& r) {
        sum.total += r.total;
        sum.fixed += r.fixed;
      };
      std::vector<std::uint64_t> seeds;
      for (int n = 0; n < traces; ++n)
        seeds.push_back(mix(seed, row * 1'000'003 + std::uint64_t(n)));
      for (std::uint64_t s : seeds) {
        trace tr(proc, s);
        add(pol_right, run_policy(j, tr, right));
        add(pol_off, run_policy(j, tr, off));
        for (std::size_t g = 0; g < grid.size(); ++g) add(fixed[g], run_fixed(j, tr, grid[g]));
      }
      const std::size_t best = static_cast<std::size_t>(
          std::min_element(fixed.begin(), fixed.end(),
                           [](const run_cost& a, const run_cost& b) { return a.total < b.total; }) -
          fixed.begin());
      const double best_t = grid[best];
      double short4 = 0, long4 = 0;
      for (std::uint64_t s : seeds) {
        trace tr(proc, s);
        short4 += run_fixed(j, tr, best_t / 4).total;
        long4 += run_fixed(j, tr, best_t * 4).total;
      }
      const double n = traces;
      const double best_cost = fixed[best].total / n;
      // the part an interval controls (lost work + periodic saves), policy against best fixed
      const double controlled =
          (pol_right.total - pol_right.fixed) / (fixed[best].total - fixed[best].fixed);
      const double pol_r = pol_right.total / n, pol_o = pol_off.total / n;
      short4 /= n, long4 /= n;
      const bool ok = pol_r <= 1.10 * best_cost && pol_r < short4 && pol_r < long4;
      all_ok = all_ok && ok;
      char label[24], pr[32], po[32], s4[32], l4[32];
      std::snprintf(label, sizeof label, "%.0f s", c);
      std::snprintf(pr, sizeof pr, "%s (%.3fx)", hours(pol_r).c_str(), pol_r / best_cost);
      std::snprintf(po, sizeof po, "%s (%.3fx)", hours(pol_o).c_str(), pol_o / best_cost);
      std::snprintf(s4, sizeof s4, "%s (%.2fx)", hours(short4).c_str(), short4 / best_cost);
      std::snprintf(l4, sizeof l4, "%s (%.2fx)", hours(long4).c_str(), long4 / best_cost);
      std::printf("%-22s %5s | %-21s %-21s | %-9s %-10s | %-17s %-17s | %-8.3f | %s%s\n", proc.name,
                  label, pr, po, span(best_t).c_str(), hours(best_cost).c_str(), s4, l4, controlled,
                  ok ? "ok" : "MISSED",
                  best == 0 || best + 1 == grid.size() ? " (best T at the grid's edge)" : "");
      std::fflush(stdout);
    }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "\nCosts are means per job; (Nx): against the best fixed interval. lost+sv: the same ratio "
      "for the policy (prior M) without the restarts and preemption saves no interval changes.\n"
      "accept: the policy with the right prior within 10 %% of the best fixed interval in "
      "hindsight, and cheaper than 4x too short and 4x too long. %s (%.1f s)\n",
      all_ok ? "all rows ok" : "SOME ROWS MISSED", secs);
  return all_ok ? 0 : 1;
}
