// holdfast/checkpoint/retention.hpp — which checkpoints a run keeps: retention_policy (keep the
// last N, one every N steps or every period, the best N by a metric, your own rule, or any of
// these), and the candidates it judges. Pure: no I/O; the manager (manager.hpp) feeds it.
//
// Guarantees:
//   - keeps() is a function of the candidates alone (oldest first) and keeps what any of the
//     policy's rules keeps; best_n breaks ties toward the newer checkpoint.
//   - Whatever the policy says, the manager never deletes the latest checkpoint nor one of the
//     pinned step. max_to_keep N is keep_last(N) (0: keep_all) unless
//     checkpoint_options::retention is set.
//   - needs_metadata() tells the manager when save times or metrics must be read from disk.
// Caveats:
//   - A checkpoint without holdfast-metadata.json (0.1.0) has no metrics and its directory's
//     mtime as its time; best_n does not keep it.
//   - A custom rule may throw: the save then fails after publishing, before any deletion.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <ratio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/json.hpp"  // json_value: a checkpoint's metrics

HOLDFAST_NAMESPACE_BEGIN

/// Whether a larger or a smaller metric is better.
enum class metric_order {
  max,  ///< larger is better (accuracy)
  min   ///< smaller is better (loss)
};

/// A checkpoint as a retention policy sees it.
struct retention_candidate {
  std::int64_t step = -1;                      ///< the step it holds
  std::string name;                            ///< its directory name
  std::chrono::system_clock::time_point time;  ///< when its save started (or its mtime)
  std::optional<detail::json_value> metrics;   ///< its metrics object, when it has one
  /// The metric `key` as a number, when present.
  std::optional<double> metric(std::string_view key) const {
    if (!metrics) return std::nullopt;
    const detail::json_value* v = metrics->find(key);
    if (!v || !v->is_number()) return std::nullopt;
    return v->as_double();
  }
};

/// Which checkpoints retention keeps: any of its rules (keep the last N, one every N steps or
/// every period, the best N by a metric, or your own). The latest and the pinned step are kept
/// whatever the policy says.
class retention_policy {
 public:
  /// Your own rule: which of the candidates (oldest first) to keep.
  using rule_fn = std::function<std::vector<bool>(const std::vector<retention_candidate>&)>;

  /// Keeps every checkpoint.
  static retention_policy keep_all() { return one({kind::all, 0, 0, {}, {}, {}, {}}); }
  /// Keeps the newest `n` (n >= 1; counting the latest).
  static retention_policy keep_last(std::size_t n) {
    return one({kind::last, std::max<std::size_t>(n, 1), 0, {}, {}, {}, {}});
  }
  /// Keeps every checkpoint whose step is a multiple of `n` (Orbax EveryNSteps).
  static retention_policy every_n_steps(std::int64_t n) {
    return one({kind::steps, 0, std::max<std::int64_t>(n, 1), {}, {}, {}, {}});
  }
  /// Keeps the oldest checkpoint, then one at least `period` of save time after the previous
  /// one kept by this rule (TF keep_checkpoint_every_n_hours, Orbax EveryNSeconds).
  static retention_policy every(std::chrono::nanoseconds period) {
    return one({kind::period, 0, 0, period, {}, {}, {}});
  }
  /// every(), in hours.
  static retention_policy every_n_hours(double hours) {
    return every(std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double, std::ratio<3600>>(hours)));
  }
  /// Keeps the `n` best checkpoints by the number `metric` (Orbax BestN); ties go to the newer.
  /// Checkpoints without the metric are not kept by this rule.
  static retention_policy best_n(std::size_t n, std::string metric, metric_order order) {
    return one({kind::best, n, 0, {}, std::move(metric), order, {}});
  }
  /// Your own rule (it may throw: the save then fails after publishing, before any deletion).
  static retention_policy custom(rule_fn rule) {
    return one({kind::custom, 0, 0, {}, {}, metric_order::max, std::move(rule)});
  }
  /// Keeps what any of `policies` keeps.
  static retention_policy any_of(std::vector<retention_policy> policies) {
    retention_policy r;
    for (auto& p : policies)
      for (auto& rule : p.rules_) r.rules_.push_back(std::move(rule));
    return r;
  }
  /// Keeps what `a` or `b` keeps.
  friend retention_policy operator|(retention_policy a, retention_policy b) {
    return any_of({std::move(a), std::move(b)});
  }

  /// Which of `c` (oldest first) the policy keeps.
  std::vector<bool> keeps(const std::vector<retention_candidate>& c) const {
    std::vector<bool> keep(c.size(), false);
    for (const auto& r : rules_) apply(r, c, keep);
    return keep;
  }
  /// True when a rule looks at save times or metrics (the manager then reads the metadata).
  bool needs_metadata() const noexcept {
    for (const auto& r : rules_)
      if (r.k == kind::period || r.k == kind::best || r.k == kind::custom) return true;
    return false;
  }

 private:
  enum class kind { all, last, steps, period, best, custom };
  struct rule {
    kind k;
    std::size_t n;
    std::int64_t every_steps;
    std::chrono::nanoseconds period;
    std::string metric;
    metric_order order;
    rule_fn fn;
  };
  static retention_policy one(rule r) {
    retention_policy p;
    p.rules_.push_back(std::move(r));
    return p;
  }
  static void apply(const rule& r, const std::vector<retention_candidate>& c,
                    std::vector<bool>& keep) {
    switch (r.k) {
      case kind::all:
        keep.assign(c.size(), true);
        break;
      case kind::last:
        for (std::size_t i = c.size() > r.n ? c.size() - r.n : 0; i < c.size(); ++i) keep[i] = true;
        break;
      case kind::steps:
        for (std::size_t i = 0; i < c.size(); ++i)
          if (c[i].step % r.every_steps == 0) keep[i] = true;
        break;
      case kind::period: {
        std::vector<std::size_t> order(c.size());
        for (std::size_t i = 0; i < c.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return c[a].time < c[b].time; });
        std::optional<std::chrono::system_clock::time_point> last;
        for (std::size_t i : order) {
          if (!last || c[i].time - *last >= r.period) {
            keep[i] = true;
            last = c[i].time;
          }
        }
        break;
      }
      case kind::best: {
        std::vector<std::pair<double, std::size_t>> scored;
        for (std::size_t i = 0; i < c.size(); ++i)
          if (auto m = c[i].metric(r.metric)) scored.emplace_back(*m, i);
        std::stable_sort(scored.begin(), scored.end(), [&](const auto& a, const auto& b) {
          if (a.first != b.first)
            return r.order == metric_order::max ? a.first > b.first : a.first < b.first;
          return a.second > b.second;  // ties: the newer first
        });
        for (std::size_t i = 0; i < scored.size() && i < r.n; ++i) keep[scored[i].second] = true;
        break;
      }
      case kind::custom: {
        std::vector<bool> mine = r.fn(c);
        for (std::size_t i = 0; i < c.size() && i < mine.size(); ++i)
          if (mine[i]) keep[i] = true;
        break;
      }
    }
  }

  std::vector<rule> rules_;
};

HOLDFAST_NAMESPACE_END
