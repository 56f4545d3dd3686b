// holdfast/checkpoint/save_policy.hpp — when to save: the interval from the save's measured
// cost C and the mean time M between interruptions that come without a usable notice
// (issue 35). Three parts: the formulas (young_interval, daly_interval), the job's history of
// restarts in the run directory (run_history, holdfast-run-history.json), and the policy that
// combines them (save_interval_policy), with save_when_due for the training loop:
//
//   holdfast::run_history history(run_dir);               // <run_dir>/holdfast-run-history.json
//   history.begin(std::chrono::system_clock::now());      // closes the previous incarnation
//   holdfast::save_interval_options o;
//   o.mtbi_prior = std::chrono::hours(8);                 // M before the job has seen anything
//   holdfast::save_interval_policy policy(o);
//   policy.observe(history);                              // M and the last C from the history
//   policy.start(std::chrono::steady_clock::now());       // the restored state counts as saved
//   while (handler.total_run_calls() < steps) {           // a config with no_exit
//     if (handler.run(train_step) == holdfast::run_status::stopped) {  // preemption save done
//       history.note_notice(std::chrono::system_clock::now());
//       return;
//     }
//     if (holdfast::save_when_due(policy, handler.checkpointer(), handler.total_run_calls()))
//       history.note_save(std::chrono::system_clock::now(), policy.save_cost());
//   }
//   history.note_clean_end(std::chrono::system_clock::now());
// (docs/save-policy.md: the formulas, the prior, an exiting Exit policy, several workers.)
//
// Guarantees:
//   - The interval is Daly's (2006) higher-order optimum for compute interval T between saves
//     of cost C with exponential interruptions of mean M: T = sqrt(2CM) (1 + sqrt(C/2M)/3 +
//     C/18M) - C for C < 2M, else T = M; it tends to Young's sqrt(2CM) for C << M. The
//     policy's interval is max(that, the background copy's cost) clamped to [min_interval,
//     max_interval] (min_interval wins when the bounds cross): never shorter than a durable
//     copy takes unless max_interval is (two_tier_checkpoints::feed_copy_costs feeds the copies).
//   - C is an exponentially weighted mean of the measured blocking costs (record_save): the
//     first sample sets it, each next one moves it by cost_smoothing of the difference, so it
//     follows a state that grows or a filesystem that slows down with O(1) state. Until a cost
//     is measured, C is the history's last recorded cost (observe), else initial_save_cost (0
//     by default: the first save comes at min_interval and measures C). The background copy's cost
//     (record_copy) is averaged the same way, in an atomic: record_copy may run on another
//     thread (the two-tier copier's) while the training thread asks the policy.
//   - M = (prior_weight x mtbi_prior + exposure) / (prior_weight + unnoticed), exposure being
//     the run time of every earlier incarnation plus the current one's so far, unnoticed the
//     incarnations that ended killed (without a notice noted). This is 1 / E[rate] of a
//     Poisson process under the conjugate Gamma prior of shape prior_weight and mean rate
//     1/mtbi_prior: the prior counts as prior_weight interruptions seen in prior_weight x
//     mtbi_prior of run time, and the job's own history outweighs it as it accumulates.
//     Incarnations that ended with a notice (a preemption save) or cleanly count as exposure,
//     not as interruptions: a noticed preemption loses next to nothing.
//   - save_interval_policy reads no clock and does no I/O, and is for one thread, record_copy
//     excepted (above): should_save(now), interval(now)
//     and mtbi(now) are functions of the options, the recorded costs, the observed counters and
//     the times passed in, so two policies fed the same inputs answer the same. save_when_due
//     is the one that reads Clock::now(), around the save it times.
//   - run_history tolerates a missing file (a first start: the prior alone) and a bad one (not
//     JSON, not its format, a count negative or above 10^12, a run time negative or above 1e15
//     s): reported once through the log hook, the prior alone, the file rewritten. It writes the
//     file with the library's atomic publish, so a reader sees the previous version or the new one,
//     whole. Its writes never throw: a failed write is logged and returns false, and the counters
//     in memory go on (the history is advice; the training must not stop for it).
//   - The counters are kept as totals in the file (exact however long the job runs); the list
//     of incarnations kept beside them is bounded (the last 64).
// Caveats:
//   - A killed incarnation's run time is measured to its last note_save() or note_alive()
//     (save_when_due calls neither: the caller does, after a save) or, without one, to the next
//     begin(): the time the job waited to be restarted then counts as run time, which
//     overstates M.
//   - The history is per run directory and per process that calls begin(): call it in one
//     process per job (task 0), or give each task its own directory.
//   - An interruption whose notice came too late for the preemption save is unnoticed only if
//     note_notice() is called after that save committed, as documented; calling it on the
//     notice itself would count such a loss as noticed.
//   - M is one mean for the whole job: a bursty interruption rate is averaged, not tracked.
//   - An Exit policy that exits the process must call note_notice() itself (a callable Exit
//     policy): an incarnation that exits without it reads as killed.
//   - Tasks of one job measure different costs: where every task must save the same steps,
//     decide on one task and share the decision (handler_options::periodic_saves does). The
//     copy cost is the deciding task's own copier's: the other tasks' copies are not reported.
#pragma once

#include <fcntl.h>  // O_RDONLY: the history file

#include <algorithm>
#include <atomic>  // the copies' mean: record_copy from the copier's thread
#include <chrono>
#include <cmath>  // std::sqrt: the interval
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "../detail/json.hpp"  // the history file's format
#include "../error.hpp"
#include "../io.hpp"       // open_file_if_exists, read_all
#include "../log.hpp"      // log_fn: a bad history file, a failed write
#include "../publish.hpp"  // basic_publisher: the history file appears whole
#include "../store.hpp"    // detail::store_join

HOLDFAST_NAMESPACE_BEGIN

/// Seconds as a double: the unit of costs, intervals and M.
using save_seconds = std::chrono::duration<double>;

/// Young's (1974) interval between saves: sqrt(2 C M); 0 when C or M is not positive.
inline save_seconds young_interval(save_seconds cost, save_seconds mtbi) noexcept {
  const double c = cost.count(), m = mtbi.count();
  if (!(c > 0) || !(m > 0)) return save_seconds(0);
  return save_seconds(std::sqrt(2 * c * m));
}

/// Daly's (2006) interval: sqrt(2CM)(1 + sqrt(C/2M)/3 + C/18M) - C for C < 2M, else M.
inline save_seconds daly_interval(save_seconds cost, save_seconds mtbi) noexcept {
  const double c = cost.count(), m = mtbi.count();
  if (!(c > 0) || !(m > 0)) return save_seconds(0);
  if (c >= 2 * m) return mtbi;
  const double t = std::sqrt(2 * c * m) * (1 + std::sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c;
  return save_seconds(std::max(t, 0.0));
}

/// How an incarnation of the job ended.
enum class run_end {
  running,  ///< not ended yet (the current incarnation)
  notice,   ///< with a notice: its preemption save committed (note_notice)
  clean,    ///< on purpose: the job finished or was stopped (note_clean_end)
  killed    ///< without a notice: killed or crashed (nothing was noted before the next start)
};

/// One incarnation of the job, as run_history records it.
struct run_incarnation {
  std::chrono::system_clock::time_point start;  ///< when begin() was called
  save_seconds run_time{0};                     ///< from start to its end (or last note_alive)
  run_end end = run_end::running;               ///< how it ended
};

/// The counters M is learned from.
struct run_counters {
  save_seconds exposure{0};       ///< total run time of the ended incarnations
  std::int64_t unnoticed = 0;     ///< incarnations that ended killed
  std::int64_t noticed = 0;       ///< incarnations that ended with a notice
  std::int64_t clean = 0;         ///< incarnations that ended cleanly
  std::int64_t incarnations = 0;  ///< ended incarnations (the sum of the three)
};

namespace detail {

inline constexpr std::string_view run_history_file_name = "holdfast-run-history.json";
inline constexpr std::string_view run_history_format = "holdfast-run-history 1";
inline constexpr std::size_t run_history_kept = 64;  // incarnations listed in the file

inline const char* run_end_name(run_end e) noexcept {
  switch (e) {
    case run_end::running:
      return "running";
    case run_end::notice:
      return "notice";
    case run_end::clean:
      return "clean";
    case run_end::killed:
      return "killed";
  }
  return "running";
}

inline std::optional<run_end> run_end_from(std::string_view s) noexcept {
  for (run_end e : {run_end::running, run_end::notice, run_end::clean, run_end::killed})
    if (s == run_end_name(e)) return e;
  return std::nullopt;
}

inline std::int64_t run_history_ns(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

inline std::chrono::system_clock::time_point run_history_time(std::int64_t ns) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

// What the file holds: the totals, the last incarnations, the current one (if begun).
struct run_history_state {
  run_counters totals;
  std::deque<run_incarnation> past;  // oldest first, at most run_history_kept
  std::optional<run_incarnation> current;
  std::optional<std::chrono::system_clock::time_point> alive;  // the current one's note_alive
  std::optional<save_seconds> save_cost;                       // the last note_save's cost
};

inline json_value run_incarnation_json(const run_incarnation& r) {
  json_value o(json_value::object_t{});
  o.set("start_unix_ns", run_history_ns(r.start));
  o.set("run_s", r.run_time.count());
  o.set("end", run_end_name(r.end));
  return o;
}

inline std::string format_run_history(const run_history_state& s) {
  json_value doc(json_value::object_t{});
  doc.set("format", std::string(run_history_format));
  json_value totals(json_value::object_t{});
  totals.set("run_s", s.totals.exposure.count());
  totals.set("killed", s.totals.unnoticed);
  totals.set("notice", s.totals.noticed);
  totals.set("clean", s.totals.clean);
  doc.set("totals", std::move(totals));
  json_value::array_t past;
  for (const auto& r : s.past) past.push_back(run_incarnation_json(r));
  doc.set("incarnations", json_value(std::move(past)));
  if (s.save_cost) doc.set("save_cost_s", s.save_cost->count());
  if (s.current) {
    json_value cur = run_incarnation_json(*s.current);
    if (s.alive) cur.set("alive_unix_ns", run_history_ns(*s.alive));
    doc.set("current", std::move(cur));
  }
  return to_json(doc, 2);
}

// Bounds far past any job (30 million years, 10^12 restarts) that keep the sums finite and the
// counts from overflowing however long a damaged file's job runs on.
inline constexpr double run_history_max_seconds = 1e15;
inline constexpr std::int64_t run_history_max_count = 1'000'000'000'000;

// A field of `o` as a number / an integer within [0, the bound], else format_error.
inline double run_history_seconds(const json_value& o, std::string_view key,
                                  const std::string& path) {
  const json_value* v = o.find(key);
  if (!v || !v->is_number() || !(v->as_double() >= 0) ||
      !(v->as_double() <= run_history_max_seconds))
    throw format_error(path,
                       "\"" + std::string(key) + "\" is not a number of seconds in [0, 1e15]");
  return v->as_double();
}
inline std::int64_t run_history_count(const json_value& o, std::string_view key,
                                      const std::string& path) {
  const json_value* v = o.find(key);
  if (!v || !v->is_integer() || v->as_int64() < 0 || v->as_int64() > run_history_max_count)
    throw format_error(path, "\"" + std::string(key) + "\" is not a count in [0, 10^12]");
  return v->as_int64();
}

inline run_incarnation parse_run_incarnation(const json_value& o, const std::string& path) {
  if (!o.is_object()) throw format_error(path, "an incarnation is not an object");
  const json_value* start = o.find("start_unix_ns");
  const json_value* end = o.find("end");
  if (!start || !start->is_integer()) throw format_error(path, "no integer \"start_unix_ns\"");
  std::optional<run_end> e =
      end && end->is_string() ? run_end_from(end->as_string()) : std::nullopt;
  if (!e) throw format_error(path, "\"end\" is not running, notice, clean or killed");
  return {run_history_time(start->as_int64()), save_seconds(run_history_seconds(o, "run_s", path)),
          *e};
}

// The file's content; holdfast::error (format_error past the JSON) naming `path` otherwise.
inline run_history_state parse_run_history(std::string_view text, const std::string& path) {
  const json_value doc = parse_json(text, path);  // not JSON: holdfast::error naming `path`
  const json_value* format = doc.is_object() ? doc.find("format") : nullptr;
  if (!format || !format->is_string() || format->as_string() != run_history_format)
    throw format_error(path, "not a holdfast run history (no \"format\": \"" +
                                 std::string(run_history_format) + "\")");
  run_history_state s;
  const json_value* totals = doc.find("totals");
  if (!totals || !totals->is_object()) throw format_error(path, "no \"totals\" object");
  s.totals.exposure = save_seconds(run_history_seconds(*totals, "run_s", path));
  s.totals.unnoticed = run_history_count(*totals, "killed", path);
  s.totals.noticed = run_history_count(*totals, "notice", path);
  s.totals.clean = run_history_count(*totals, "clean", path);
  s.totals.incarnations = s.totals.unnoticed + s.totals.noticed + s.totals.clean;
  if (const json_value* past = doc.find("incarnations")) {
    if (!past->is_array()) throw format_error(path, "\"incarnations\" is not an array");
    for (const auto& r : past->as_array()) s.past.push_back(parse_run_incarnation(r, path));
    while (s.past.size() > run_history_kept) s.past.pop_front();
  }
  if (doc.find("save_cost_s"))
    s.save_cost = save_seconds(run_history_seconds(doc, "save_cost_s", path));
  if (const json_value* cur = doc.find("current")) {
    s.current = parse_run_incarnation(*cur, path);
    if (const json_value* alive = cur->find("alive_unix_ns")) {
      if (!alive->is_integer()) throw format_error(path, "\"alive_unix_ns\" is not an integer");
      s.alive = run_history_time(alive->as_int64());
    }
  }
  return s;
}

}  // namespace detail

/// The job's restarts, persisted in <run dir>/holdfast-run-history.json: each begin() closes the
/// previous incarnation (killed unless it noted a notice or a clean end) and opens a new one.
template <class Io = posix_io, class Durability = durable>
class basic_run_history {
 public:
  /// The history of the run directory `run_dir` (the file is read by begin()).
  explicit basic_run_history(std::string run_dir, log_fn log = {})
      : path_(detail::store_join(run_dir, detail::run_history_file_name)), log_(std::move(log)) {}

  /// The history file's path.
  const std::string& path() const noexcept { return path_; }

  /// At start: reads the file (missing: a first start; bad: logged, started afresh), closes the
  /// previous incarnation at `now` (or its last note_alive), opens one at `now`, writes the
  /// file. Returns whether the write succeeded.
  bool begin(std::chrono::system_clock::time_point now) {
    state_ = load();
    if (state_.current) close(*state_.current, state_.alive.value_or(now));
    state_.current = run_incarnation{now, save_seconds(0), run_end::running};
    state_.alive.reset();
    return write();
  }

  /// Before exiting after the preemption save committed: this incarnation ended with a notice.
  bool note_notice(std::chrono::system_clock::time_point now) { return note(run_end::notice, now); }
  /// Before exiting on purpose (the job finished, or was stopped without a preemption).
  bool note_clean_end(std::chrono::system_clock::time_point now) {
    return note(run_end::clean, now);
  }
  /// Records that this incarnation was alive at `now` (a killed one's run time ends there).
  bool note_alive(std::chrono::system_clock::time_point now) {
    if (!state_.current) return false;
    state_.alive = now;
    return write();
  }
  /// After a save: alive at `now`, and the save cost C (save_interval_policy::save_cost()), so
  /// the next incarnation starts from it rather than measuring it again.
  bool note_save(std::chrono::system_clock::time_point now, save_seconds cost) {
    state_.save_cost = cost;
    return note_alive(now);
  }

  /// The totals over the ended incarnations (not the current one).
  const run_counters& counters() const noexcept { return state_.totals; }
  /// The last ended incarnations, oldest first (at most 64).
  const std::deque<run_incarnation>& incarnations() const noexcept { return state_.past; }
  /// The save cost the last note_save recorded (in this incarnation or an earlier one).
  std::optional<save_seconds> save_cost() const noexcept { return state_.save_cost; }
  /// The current incarnation, once begun.
  const std::optional<run_incarnation>& current() const noexcept { return state_.current; }

 private:
  bool note(run_end how, std::chrono::system_clock::time_point now) {
    if (!state_.current) return false;
    state_.current->end = how;
    state_.alive = now;
    return write();
  }

  void close(run_incarnation r, std::chrono::system_clock::time_point end) {
    if (r.end == run_end::running) r.end = run_end::killed;
    // in double seconds: a damaged file's start time cannot overflow the subtraction
    const save_seconds run =
        save_seconds(end.time_since_epoch()) - save_seconds(r.start.time_since_epoch());
    r.run_time = run.count() > 0 ? run : save_seconds(0);
    run_counters& t = state_.totals;
    t.exposure += r.run_time;
    ++t.incarnations;
    if (r.end == run_end::killed) ++t.unnoticed;
    if (r.end == run_end::notice) ++t.noticed;
    if (r.end == run_end::clean) ++t.clean;
    state_.past.push_back(r);
    while (state_.past.size() > detail::run_history_kept) state_.past.pop_front();
  }

  detail::run_history_state load() const {
    try {
      auto fd = open_file_if_exists<Io>(path_, O_RDONLY);
      if (!fd) return {};
      std::string text = read_all(fd);
      fd.close();
      return detail::parse_run_history(text, path_);
    } catch (const error& e) {  // a bad file (or an unreadable one) is advice lost, not a failure
      detail::log_line(log_, std::string("run history: ") + e.what() +
                                 "; starting from the prior (the file is rewritten)");
      return {};
    }
  }

  bool write() const {
    try {
      basic_publisher<Durability, Io>().publish(path_, detail::format_run_history(state_), 0644);
      return true;
    } catch (const error& e) {
      detail::log_line(log_, std::string("run history not saved: ") + e.what());
      return false;
    }
  }

  std::string path_;
  log_fn log_;
  detail::run_history_state state_;
};

/// The run history with POSIX I/O and durable writes.
using run_history = basic_run_history<>;

/// What save_interval_policy is told before it measures anything, and its bounds.
struct save_interval_options {
  save_seconds mtbi_prior = std::chrono::hours(24);  ///< M before any history (unnoticed only)
  double prior_weight = 1;  ///< the prior counts as this many interruptions seen (> 0)
  save_seconds min_interval = std::chrono::seconds(30);  ///< never save more often
  save_seconds max_interval = std::chrono::hours(24);    ///< never save less often
  save_seconds initial_save_cost{0};                     ///< C until a save is measured
  double cost_smoothing = 0.3;  ///< weight of a new cost sample in C's running mean, in (0, 1]
};

/// When to save: every daly_interval(C, M) clamped to the options' bounds, C measured, M learned
/// from the prior and the job's history. Reads no clock; the caller passes every time.
template <class Clock = std::chrono::steady_clock>
class basic_save_interval_policy {
 public:
  /// The clock whose time points the caller passes.
  using clock_type = Clock;
  /// A time point of that clock.
  using time_point = typename Clock::time_point;

  /// A policy with `o`; throws holdfast::error(EINVAL) for a bad option.
  explicit basic_save_interval_policy(save_interval_options o = {}) : o_(o) {
    auto bad = [](const char* what) { throw error(EINVAL, "save_interval_policy", "", what); };
    if (!(o_.mtbi_prior.count() > 0)) bad("mtbi_prior must be positive");
    if (!(o_.prior_weight > 0)) bad("prior_weight must be positive");
    if (!(o_.cost_smoothing > 0 && o_.cost_smoothing <= 1)) bad("cost_smoothing must be in (0, 1]");
    if (!(o_.min_interval.count() >= 0) || !(o_.initial_save_cost.count() >= 0))
      bad("min_interval and initial_save_cost must not be negative");
  }

  /// The options.
  const save_interval_options& options() const noexcept { return o_; }

  /// At start (after any restore): the current incarnation's run time counts from `now`, and
  /// the restored state counts as saved at `now`.
  void start(time_point now) {
    run_start_ = now;
    last_save_ = now;
  }

  /// Takes the ended incarnations' counters (run_history::counters()).
  void observe(const run_counters& c) {
    past_exposure_ = c.exposure;
    unnoticed_ = c.unnoticed;
  }
  /// Takes the counters of `history`, and its save cost as C until one is measured.
  template <class Io, class D>
  void observe(const basic_run_history<Io, D>& history) {
    observe(history.counters());
    if (history.save_cost()) seed_save_cost(*history.save_cost());
  }
  /// C until a save is measured (an earlier incarnation's), unless one was measured already.
  void seed_save_cost(save_seconds cost) {
    if (!save_cost_.known) save_cost_ = {cost, true};
  }

  /// A save that blocked the training for `cost` finished at `finished`.
  void record_save(save_seconds cost, time_point finished) {
    save_cost_ = mean(save_cost_, cost);
    last_save_ = finished;
  }
  /// The background copy of a save to the durable tier took `cost` (a negative or NaN one is
  /// ignored). May be called from another thread (the copier's) while this one asks the policy.
  void record_copy(save_seconds cost) noexcept { copy_cost_.add(cost.count(), o_.cost_smoothing); }

  /// C: the running mean of the blocking costs (initial_save_cost before any).
  save_seconds save_cost() const noexcept {
    return save_cost_.known ? save_cost_.value : o_.initial_save_cost;
  }
  /// The running mean of the copies' costs (0 before any).
  save_seconds copy_cost() const noexcept { return save_seconds(copy_cost_.get()); }

  /// M at `now`: (prior_weight x mtbi_prior + exposure) / (prior_weight + unnoticed), the
  /// exposure counting the current incarnation's run time since start().
  save_seconds mtbi(time_point now) const noexcept {
    save_seconds exposure = past_exposure_;
    if (run_start_ && now > *run_start_) exposure += save_seconds(now - *run_start_);
    return (o_.prior_weight * o_.mtbi_prior + exposure) /
           (o_.prior_weight + static_cast<double>(unnoticed_));
  }

  /// The interval at `now`: max(daly_interval(C, M), the copy's cost), clamped to the bounds.
  save_seconds interval(time_point now) const noexcept {
    save_seconds t = std::max(daly_interval(save_cost(), mtbi(now)), copy_cost());
    t = std::min(t, o_.max_interval);
    return std::max(t, o_.min_interval);
  }

  /// True when interval(now) has passed since the last save (or start()); true before either.
  bool should_save(time_point now) const noexcept {
    if (!last_save_) return true;
    return save_seconds(now - *last_save_) >= interval(now);
  }

  /// When the last save finished (or start() was called).
  std::optional<time_point> last_save() const noexcept { return last_save_; }

 private:
  // A measured mean: a plain value and a flag rather than a std::optional, which GCC's -O3
  // takes for read uninitialized (-Wmaybe-uninitialized) through value_or.
  struct measured {
    save_seconds value{0};
    bool known = false;
  };

  measured mean(measured m, save_seconds sample) const {
    if (!m.known) return {sample, true};
    return {m.value + o_.cost_smoothing * (sample - m.value), true};
  }

  // The copies' running mean in seconds, negative before the first: one atomic, so the copier's
  // thread can add a sample while the training thread reads it. Copied as its value.
  class shared_mean {
   public:
    shared_mean() = default;
    shared_mean(const shared_mean& o) noexcept : v_(o.v_.load(std::memory_order_relaxed)) {}
    shared_mean& operator=(const shared_mean& o) noexcept {
      v_.store(o.v_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
    double get() const noexcept { return std::max(v_.load(std::memory_order_relaxed), 0.0); }
    void add(double sample, double smoothing) noexcept {
      if (!(sample >= 0)) return;  // negative or NaN: not a cost
      double old = v_.load(std::memory_order_relaxed);
      while (!v_.compare_exchange_weak(old, old < 0 ? sample : old + smoothing * (sample - old),
                                       std::memory_order_relaxed)) {
      }
    }

   private:
    std::atomic<double> v_{-1};
  };

  save_interval_options o_;
  measured save_cost_;
  shared_mean copy_cost_;
  save_seconds past_exposure_{0};
  std::int64_t unnoticed_ = 0;
  std::optional<time_point> run_start_;
  std::optional<time_point> last_save_;
};

/// The policy on steady_clock.
using save_interval_policy = basic_save_interval_policy<>;

/// From the training loop: when `policy` says a save is due at Clock::now(), saves `step`
/// through `ckpt.save(step, args...)` (a checkpoint_manager or any Checkpointer with that
/// call), times how long the call blocked, and records it. Returns whether it saved.
template <class Clock, class Checkpointer, class... Args>
bool save_when_due(basic_save_interval_policy<Clock>& policy, Checkpointer& ckpt, std::int64_t step,
                   Args&&... args) {
  const typename Clock::time_point begin = Clock::now();
  if (!policy.should_save(begin)) return false;
  ckpt.save(step, std::forward<Args>(args)...);
  const typename Clock::time_point end = Clock::now();
  policy.record_save(save_seconds(end - begin), end);
  return true;
}

HOLDFAST_NAMESPACE_END
