// tests/support/process_job.hpp — a job of forked worker processes, each training under its own
// preemption_handler with real SIGTERM notices and real exits, for the multi-process handler
// tests (handler_process_test, handler_stress_test, handler_cluster_test).
//
// The parent forks the workers (child.hpp), waits until each is ready, then runs a schedule of
// actions measured from that moment (the notice moment): signals to workers (SIGTERM notices,
// SIGSTOP/SIGCONT stalls, SIGKILL), or any call (freeze an etcd member). An action may wait for a
// gate first (a key in the store, a marker file), and may schedule follow-ups relative to when
// it fired (a stall's SIGCONT). The parent starts no thread (fork + TSAN): it sleeps until the
// next action is due and waits on gates with a deadline between them.
//
// A worker logs, one line each, to log-<task>: "handler <run id>" once its handler is built,
// "restored <step> <acc>", "saving <step> at <steady ms>" and "save <step> <acc>" around each
// checkpoint, and how it ended. Exit codes: 42 saved and exited, 3 peer_error, 4 agreement_timeout,
// 5 its own step's error, 6 agreement_unreachable, 7 another holdfast::error, 0 finished its steps.
//
// check_outcomes() reads every round's recorded outcome key (parse_agreement_value) and checks
// that every worker followed it: the handler's guarantee that in every round all workers save at
// the same step or all fail the same way.
#pragma once

#include <signal.h>
#include <sys/wait.h>  // waitid: has a worker ended

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <holdfast/agreement.hpp>
#include <holdfast/handler.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/wait.hpp>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>  // std::this_thread: step times and the parent's sleeps (no thread is started)
#include <utility>
#include <vector>

#include "child.hpp"
#include "etcd_server.hpp"
#include "handler_harness.hpp"
#include "temp_dir.hpp"

namespace holdfast_test {

using std::chrono::milliseconds;

/// Exit codes of a worker process.
namespace worker_exit {
inline constexpr int finished = 0;     ///< ran all its steps
inline constexpr int saved = 42;       ///< saved at the agreed step and exited
inline constexpr int peer = 3;         ///< holdfast::peer_error
inline constexpr int timeout = 4;      ///< holdfast::agreement_timeout
inline constexpr int own = 5;          ///< its own step threw
inline constexpr int unreachable = 6;  ///< holdfast::agreement_unreachable
inline constexpr int store = 7;        ///< another holdfast::error (a store failure)
}  // namespace worker_exit

// ---- backends --------------------------------------------------------------------------------

inline int next_job_id() {
  static int id = 0;
  return ++id;
}

/// filesystem_kv under one temp directory per backend object.
struct filesystem_backend {
  static constexpr const char* name = "filesystem_kv";
  temp_dir root{"handler-fskv"};
  holdfast::filesystem_kv make_kv(const holdfast::kv_namespace& ns) const {
    return holdfast::filesystem_kv(root.path(), ns);
  }
  /// The parent's view of the store (gates, outcomes).
  holdfast::filesystem_kv make_observer_kv(const holdfast::kv_namespace& ns) const {
    return make_kv(ns);
  }
  static milliseconds watch() { return milliseconds(20); }
};

/// etcd_kv on the binary's shared single-member etcd.
struct etcd_backend {
  static constexpr const char* name = "etcd_kv";
  std::string url = shared_etcd().url();
  holdfast::etcd_kv make_kv(const holdfast::kv_namespace& ns) const {
    holdfast::etcd_options o;
    o.endpoints = {url};
    o.request_timeout = milliseconds(5000);
    return holdfast::etcd_kv(o, ns);
  }
  holdfast::etcd_kv make_observer_kv(const holdfast::kv_namespace& ns) const { return make_kv(ns); }
  static milliseconds watch() { return milliseconds(50); }
};

// ---- the job ---------------------------------------------------------------------------------

/// Which termination config the workers use.
enum class exit_kind {
  generic42,      ///< presets::generic: SIGTERM, exit 42
  kubernetes143,  ///< presets::kubernetes(0s): exit 143
  custom77,       ///< a callable Exit policy: exit 77
  grace42,        ///< SIGTERM, a grace period, logs "exit <ms after the notice>", exit 42
  rearm42,        ///< no_exit: after each save a new handler (new run id); exit 42 after `rounds`
};

/// What the workers do.
struct scenario {
  int n = 4;
  std::int64_t max_steps = 1000000;
  std::vector<int> step_us;    // per task; 1000 µs each when empty
  std::int64_t ready_at = 10;  // a worker touches ready-<task> after this many steps (this run)
  exit_kind exit = exit_kind::generic42;
  milliseconds grace{0};
  milliseconds grace_margin{150};  // handler_options::grace_margin (tests use a 1 s grace)
  milliseconds ack_timeout{3000};
  int throw_task = -1;         // this task's step throws std::runtime_error("nan loss") ...
  std::int64_t throw_at = -1;  // ... when its run counter is this
  bool save_override = false;
  bool coupled = false;  // each step is a barrier through the store (a gradient exchange)
  std::string incarnation = "0";
  int rounds = 1;              // rearm42: handlers built one after the other
  milliseconds save_delay{0};  // every save takes at least this long
  std::string run_id = "run";  // the first handler's run id; handler k > 0 adds "-k"
};

/// The run id of the k-th handler a worker builds.
inline std::string run_id_of(const scenario& sc, int k) {
  return k == 0 ? sc.run_id : sc.run_id + "-" + std::to_string(k);
}

/// The files of one job (a fresh directory) and its kv namespace.
struct job {
  temp_dir dir{"handler-proc"};
  std::string run = "job" + std::to_string(next_job_id());
  std::string log(int t) const { return dir / ("log-" + std::to_string(t)); }
  std::string ready(int t) const { return dir / ("ready-" + std::to_string(t)); }
  std::string ckpt(int t) const { return dir / ("ckpt-" + std::to_string(t)); }
  std::string up(int t, const std::string& inc) const {
    return dir / ("up-" + inc + "-" + std::to_string(t));
  }
  std::string go(const std::string& inc) const { return dir / ("go-" + inc); }
  /// Touched by task t once its k-th handler (k > 0) is built: its notice is installed again.
  std::string armed(int t, int k) const {
    return dir / ("armed-" + std::to_string(k) + "-" + std::to_string(t));
  }
  /// Touched by task t when a save starts.
  std::string saving(int t) const { return dir / ("saving-" + std::to_string(t)); }
  holdfast::kv_namespace ns(const scenario& sc) const {
    return holdfast::kv_namespace(run, sc.incarnation);
  }
};

// ---- one worker process ------------------------------------------------------------------------

/// Ends the worker process with `code` (no destructors: the handler's watcher may be blocked).
[[noreturn]] inline void end_worker(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

/// Exits the process with 77 (a callable Exit policy).
struct custom_exit {
  void operator()(const holdfast::exit_context&) const { end_worker(77); }
};

/// Logs how long after the notice it ran, then exits with 42 (the grace tests' Exit policy).
struct logged_exit {
  std::string log;
  void operator()(const holdfast::exit_context& ctx) const {
    auto ms = std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now() -
                  ctx.noticed_at.value_or(std::chrono::steady_clock::time_point{}))
                  .count();
    append_line(log, "exit " + std::to_string(static_cast<long>(ms)));
    end_worker(worker_exit::saved);
  }
};

/// Now on the steady clock in ms (CLOCK_MONOTONIC: comparable between the job's processes).
inline long long steady_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// The default Checkpointer, whose writer marks the start of each save (saving-<task>, a
/// "saving" log line), takes sc.save_delay, then logs "save <step> <acc>".
inline holdfast::checkpoint_manager<> logged_checkpoints(const job& j, int task, const scenario& sc,
                                                         worker_state* st) {
  auto m = make_checkpoints(j.ckpt(task), st);
  m.set_writer([st, marker = j.saving(task), delay = sc.save_delay](const std::string& d,
                                                                    std::int64_t step) {
    append_line(marker, std::to_string(step));
    append_line(st->log, "saving " + std::to_string(step) + " at " + std::to_string(steady_ms()));
    std::this_thread::sleep_for(delay);
    std::ofstream(d + "/state") << st->acc;
    ++st->saves;
    st->saved_steps.push_back(step);
    append_line(st->log, "save " + std::to_string(step) + " " + std::to_string(st->acc));
  });
  return m;
}

inline holdfast::handler_options worker_options(const scenario& sc, milliseconds watch) {
  holdfast::handler_options o;
  o.ack_timeout = sc.ack_timeout;
  o.watch_interval = watch;
  o.grace_margin = sc.grace_margin;
  return o;
}

/// One worker's training: its store clients, state and log.
template <class Backend>
class worker_process {
 public:
  using kv_type = decltype(std::declval<const Backend&>().make_kv(
      std::declval<const holdfast::kv_namespace&>()));

  worker_process(const Backend& be, const job& j, int task, const scenario& sc)
      : j_(j),
        task_(task),
        sc_(sc),
        kv_(be.make_kv(j.ns(sc))),
        grads_(be.make_kv(holdfast::kv_namespace(j.run, "grads-" + sc.incarnation))) {
    st_.log = j.log(task);
  }

  /// Builds a handler per round (make_config() gives each a fresh Config), trains, and ends the
  /// process with the exit code of how it ended.
  template <class Config, class MakeConfig>
  [[noreturn]] void run(MakeConfig make_config) {
    try {
      for (int k = 0; k < sc_.rounds; ++k) {
        holdfast::preemption_handler<Config, kv_type> h(
            make_config(), kv_, {task_, sc_.n, run_id_of(sc_, k)},
            logged_checkpoints(j_, task_, sc_, &st_), worker_options(sc_, Backend::watch()));
        if (!train(h, k)) end_worker(worker_exit::finished);
        append_line(st_.log, "stopped " + std::to_string(h.total_run_calls()));
      }
      end_worker(worker_exit::saved);
    } catch (...) {
      end_worker(log_failure());
    }
  }

  /// The log path (for configs that log).
  const std::string& log() const { return st_.log; }

 private:
  // Trains with handler k until its run() answers stopped (true) or the steps are done (false).
  template <class Handler>
  bool train(Handler& h, int k) {
    started(h, k);
    const std::int64_t start = h.restored_step().value_or(0);
    while (h.total_run_calls() < sc_.max_steps) {
      step_started_ = std::chrono::steady_clock::now();
      if (h.run([&] { step(h, k, start); }) == holdfast::run_status::stopped) return true;
    }
    append_line(st_.log,
                "finished " + std::to_string(h.total_run_calls()) + " " + std::to_string(st_.acc));
    return false;
  }

  template <class Handler>
  void started(Handler& h, int k) {
    append_line(st_.log, "handler " + run_id_of(sc_, k));
    if (k == 0) {  // start together: the skew under test is the step time, not the start-up
      append_line(j_.up(task_, sc_.incarnation), "up");
      if (!holdfast::await_file(j_.go(sc_.incarnation), std::chrono::seconds(20))) end_worker(9);
    } else {
      append_line(j_.armed(task_, k), "armed");
    }
    append_line(st_.log, "restored " + std::to_string(h.restored_step().value_or(-1)) + " " +
                             std::to_string(st_.acc));
  }

  template <class Handler>
  void step(Handler& h, int k, std::int64_t start) {
    if (task_ == sc_.throw_task && h.total_run_calls() == sc_.throw_at)
      throw std::runtime_error("nan loss");
    if (sc_.coupled) exchange(h.total_run_calls());
    ++st_.acc;
    if (k == 0 && h.total_run_calls() == start + sc_.ready_at)
      append_line(j_.ready(task_), "ready");
    const int us = sc_.step_us.empty() ? 1000 : sc_.step_us[static_cast<std::size_t>(task_)];
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

  // Waits for every worker's gradient of step `counter`.
  void exchange(std::int64_t counter) {
    const std::string k = std::to_string(counter);
    grads_.put(k + "/" + std::to_string(task_), "g");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (grads_.list(k).size() < static_cast<std::size_t>(sc_.n) &&
           std::chrono::steady_clock::now() < until)
      (void)grads_.get(k + "/never", milliseconds(2));
  }

  // Logs the exception being handled; returns the exit code for it.
  int log_failure() {
    try {
      throw;
    } catch (const holdfast::peer_error& e) {
      append_line(st_.log, "peer " + std::to_string(e.origin_task()) + " " + e.type_name() + " " +
                               e.message());
      return worker_exit::peer;
    } catch (const holdfast::agreement_timeout& e) {
      append_line(st_.log, "timeout " + join_tasks(e.missing_tasks()) + " " +
                               std::to_string(since_step_ms()) + " " + e.path());
      return worker_exit::timeout;
    } catch (const holdfast::agreement_unreachable& e) {
      append_line(st_.log, "unreachable " + e.path() + " " + e.what());
      return worker_exit::unreachable;
    } catch (const holdfast::error& e) {
      append_line(st_.log, std::string("error ") + e.what());
      return worker_exit::store;
    } catch (const std::exception& e) {
      append_line(st_.log, std::string("own ") + e.what());
      return worker_exit::own;
    }
  }

  // "1,3," (the log's form of a task list).
  static std::string join_tasks(const std::vector<int>& tasks) {
    std::string s;
    for (int t : tasks) s += std::to_string(t) + ",";
    return s;
  }

  long since_step_ms() const {
    return static_cast<long>(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_started_)
            .count());
  }

  const job& j_;
  int task_;
  const scenario& sc_;
  kv_type kv_;
  kv_type grads_;
  worker_state st_;
  std::chrono::steady_clock::time_point step_started_ = std::chrono::steady_clock::now();
};

/// The body of worker `task`: its config per sc.exit, then worker_process::run (never returns).
template <class Backend>
void worker(const Backend& be, const job& j, int task, const scenario& sc) {
  // doctest's crash handler for SIGTERM came with the fork; a worker program has none (and
  // signal_notice would chain to it).
  ::signal(SIGTERM, SIG_DFL);
  worker_process<Backend> w(be, j, task, sc);
  using sigterm = holdfast::signal_notice<SIGTERM>;
  auto with_override = [&](auto cfg) {
    if (sc.save_override)
      cfg.set_save_override(
          [log = w.log()](std::int64_t s) { append_line(log, "override " + std::to_string(s)); });
    return cfg;
  };
  switch (sc.exit) {
    case exit_kind::generic42:
      w.template run<holdfast::presets::generic>(
          [&] { return with_override(holdfast::presets::generic()); });
    case exit_kind::kubernetes143:
      w.template run<holdfast::presets::kubernetes>(
          [&] { return with_override(holdfast::presets::kubernetes(std::chrono::seconds(0))); });
    case exit_kind::custom77:
      w.template run<holdfast::termination_config<sigterm, custom_exit>>(
          [&] { return with_override(holdfast::termination_config<sigterm, custom_exit>()); });
    case exit_kind::grace42:
      w.template run<holdfast::termination_config<sigterm, logged_exit>>([&] {
        return with_override(holdfast::termination_config<sigterm, logged_exit>(
            sigterm(), logged_exit{w.log()}, sc.grace));
      });
    case exit_kind::rearm42:
      w.template run<holdfast::termination_config<sigterm, holdfast::no_exit>>([&] {
        return with_override(holdfast::termination_config<sigterm, holdfast::no_exit>());
      });
  }
}

// ---- the parent's schedule ---------------------------------------------------------------------

/// Waits up to `budget` for a condition; true once it holds. It may look at the workers (a gate
/// on a worker's marker file gives up on a worker that already ended).
using gate_fn = std::function<bool(milliseconds budget, const std::vector<child>& kids)>;

/// Something the parent does at `at` after the notice moment (or, with a gate, as soon as the
/// gate opens after `at`; dropped when it does not open within gate_timeout).
struct action {
  milliseconds at{0};
  int task = -1;               ///< a signal to this worker ...
  int sig = 0;                 ///< ... (0: none)
  std::function<void()> call;  ///< or (also) this call
  gate_fn gate;                ///< empty: fire at `at`
  milliseconds gate_timeout{10000};
  std::string what;          ///< for the trial's description
  std::vector<action> then;  ///< follow-ups, their `at` relative to this one's firing
};

/// A signal to `task` at `at`.
inline action signal_at(milliseconds at, int task, int sig, std::string what = {}) {
  action a;
  a.at = at;
  a.task = task;
  a.sig = sig;
  a.what = std::move(what);
  return a;
}

/// A stall: SIGSTOP `task` at `at`, SIGCONT it `length` later.
inline action stall_at(milliseconds at, int task, milliseconds length) {
  action a = signal_at(at, task, SIGSTOP);
  a.then.push_back(signal_at(length, task, SIGCONT));
  return a;
}

/// True once the child has ended (not reaped: its wait() still reports how).
inline bool has_ended(const child& c) {
  siginfo_t si{};
  return ::waitid(P_PID, static_cast<id_t>(c.pid()), &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         si.si_pid != 0;
}

/// A gate open once, for every task in `files`, its file exists or the task has ended; each is
/// waited for (in slices of 20 ms, to see an end) with what is left of the budget.
inline gate_fn files_gate(std::map<int, std::string> files) {
  return [files = std::move(files)](milliseconds budget, const std::vector<child>& kids) {
    const auto end = std::chrono::steady_clock::now() + budget;
    for (const auto& [task, path] : files) {
      for (;;) {
        const auto left =
            std::chrono::duration_cast<milliseconds>(end - std::chrono::steady_clock::now());
        if (holdfast::await_file(path, std::clamp(left, milliseconds(0), milliseconds(20)))) break;
        if (has_ended(kids[static_cast<std::size_t>(task)])) break;
        if (left <= milliseconds(0)) return false;
      }
    }
    return true;
  };
}

/// A gate open once every key exists in the store `kv` (the parent's client; never a worker's).
template <class Kv>
gate_fn keys_gate(std::shared_ptr<Kv> kv, std::vector<std::string> keys) {
  return [kv, keys = std::move(keys)](milliseconds budget, const std::vector<child>&) {
    const auto end = std::chrono::steady_clock::now() + budget;
    for (const auto& k : keys) {
      auto left = std::chrono::duration_cast<milliseconds>(end - std::chrono::steady_clock::now());
      try {
        if (!kv->get(k, std::max(left, milliseconds(0)))) return false;
      } catch (const std::exception&) {  // the store is busy (a frozen member): try again
        return false;
      }
    }
    return true;
  };
}

/// The key `name` ("ctl/r0/claim", "ack/r0/3", "restore/step") of handler `run_id`.
inline std::string handler_key(const std::string& run_id, const std::string& name) {
  return "holdfast/" + run_id + "/" + name;
}

/// The ack keys of round 0 of handler `run_id`, of every task but `skip`.
inline std::vector<std::string> ack_keys(const scenario& sc, const std::string& run_id,
                                         int skip = -1) {
  std::vector<std::string> keys;
  for (int t = 0; t < sc.n; ++t)
    if (t != skip) keys.push_back(handler_key(run_id, "ack/r0/" + std::to_string(t)));
  return keys;
}

/// Runs a schedule against the forked workers (no thread: sleeps and gated waits in turn).
class schedule_runner {
 public:
  using clock = std::chrono::steady_clock;

  explicit schedule_runner(std::vector<child>& kids) : kids_(kids) {}

  /// Fires every action (and follow-up) of `plan`, measured from `t0`; returns what it did, when
  /// ("+5ms SIGSTOP 3", "dropped ...").
  std::vector<std::string> run(const std::vector<action>& plan, clock::time_point t0) {
    t0_ = t0;
    for (const auto& a : plan) add(t0 + a.at, a);
    while (!pending_.empty()) {
      if (fire_due()) continue;
      if (auto g = due_gate(); g != pending_.end()) {
        wait_gate(g);
        continue;
      }
      std::this_thread::sleep_until(pending_.front().at);
    }
    return std::move(done_);
  }

 private:
  struct pending {
    clock::time_point at;
    action a;
  };

  void add(clock::time_point at, const action& a) {
    auto pos = std::upper_bound(pending_.begin(), pending_.end(), at,
                                [](clock::time_point t, const pending& p) { return t < p.at; });
    pending_.insert(pos, pending{at, a});
  }

  static std::string signal_name(int sig) {
    switch (sig) {
      case SIGTERM:
        return "SIGTERM";
      case SIGKILL:
        return "SIGKILL";
      case SIGSTOP:
        return "SIGSTOP";
      case SIGCONT:
        return "SIGCONT";
      default:
        return "signal " + std::to_string(sig);
    }
  }

  void note(const std::string& prefix, const action& a) {
    const auto ms = std::chrono::duration_cast<milliseconds>(clock::now() - t0_).count();
    std::string what = a.what;
    if (what.empty() && a.sig) what = signal_name(a.sig);
    if (a.task >= 0 && a.sig) what += " " + std::to_string(a.task);
    done_.push_back(prefix + "+" + std::to_string(ms) + "ms " + what);
  }

  void fire(const action& a) {
    const auto now = clock::now();
    note("", a);
    if (a.sig && a.task >= 0 && a.task < static_cast<int>(kids_.size()))
      kids_[static_cast<std::size_t>(a.task)].kill(a.sig);
    if (a.call) a.call();
    for (const auto& f : a.then) add(now + f.at, f);
  }

  // Fires the first due action without a gate; false when there is none.
  bool fire_due() {
    const auto now = clock::now();
    for (auto p = pending_.begin(); p != pending_.end() && p->at <= now; ++p) {
      if (p->a.gate) continue;
      action a = std::move(p->a);
      pending_.erase(p);
      fire(a);
      return true;
    }
    return false;
  }

  std::vector<pending>::iterator due_gate() {
    const auto now = clock::now();
    for (auto p = pending_.begin(); p != pending_.end() && p->at <= now; ++p)
      if (p->a.gate) return p;
    return pending_.end();
  }

  // Waits on a due gate until it opens, its timeout, or the next ungated action (which then
  // fires before the gate is tried again).
  void wait_gate(std::vector<pending>::iterator g) {
    const auto give_up = g->at + g->a.gate_timeout;
    auto until = give_up;
    for (const auto& p : pending_)
      if (!p.a.gate) until = std::min(until, std::max(p.at, clock::now()));
    const auto budget =
        std::chrono::duration_cast<milliseconds>(until - clock::now()) + milliseconds(1);
    if (g->a.gate(std::max(budget, milliseconds(0)), kids_)) {
      action a = std::move(g->a);
      pending_.erase(g);
      fire(a);
    } else if (clock::now() >= give_up) {
      note("dropped (its gate never opened) ", g->a);
      pending_.erase(g);
    }
  }

  std::vector<child>& kids_;
  std::vector<pending> pending_;
  clock::time_point t0_{};
  std::vector<std::string> done_;
};

// ---- running a job -----------------------------------------------------------------------------

/// How the workers of one job ended.
struct result {
  std::vector<child_result> exits;
  std::vector<std::vector<std::string>> logs;
  double notice_to_exit_ms = 0;       // from the notice moment until the last worker ended
  long long noticed_at_ms = 0;        // the notice moment, steady_ms()
  std::vector<std::string> schedule;  // what the parent did, when (schedule_runner::run)
  std::vector<std::int64_t> saves(int t) const {
    std::vector<std::int64_t> s;
    for (auto& l : logs[static_cast<std::size_t>(t)])
      if (l.rfind("save ", 0) == 0) s.push_back(std::stoll(l.substr(5)));
    return s;
  }
  std::string last(int t) const {
    auto& l = logs[static_cast<std::size_t>(t)];
    return l.empty() ? "" : l.back();
  }
  std::set<std::int64_t> first_saves() const {
    std::set<std::int64_t> s;
    for (std::size_t t = 0; t < logs.size(); ++t) {
      auto v = saves(static_cast<int>(t));
      if (!v.empty()) s.insert(v.front());
    }
    return s;
  }
  /// Workers the parent had to kill at the deadline.
  int hangs() const {
    return static_cast<int>(std::count_if(exits.begin(), exits.end(),
                                          [](const child_result& c) { return c.timed_out; }));
  }
};

/// Waits for every child until `deadline` (each killed past it) and reads the logs.
inline result collect(std::vector<child>& kids, const job& j,
                      std::chrono::steady_clock::time_point noticed_at,
                      std::chrono::steady_clock::time_point deadline) {
  result r;
  for (auto& k : kids) {
    k.kill(SIGCONT);  // a stall the schedule left open must not look like a hang
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    r.exits.push_back(k.wait(std::max(left, milliseconds(1))));
  }
  r.notice_to_exit_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - noticed_at)
          .count();
  r.noticed_at_ms = std::chrono::duration_cast<milliseconds>(noticed_at.time_since_epoch()).count();
  for (std::size_t t = 0; t < kids.size(); ++t)
    r.logs.push_back(read_lines(j.log(static_cast<int>(t))));
  return r;
}

/// Forks the workers; once each touched its ready file (when `plan` is not empty), runs `plan`
/// from that moment; waits for every worker at most `deadline` after it.
template <class Backend>
result run_schedule(const Backend& be, const job& j, const scenario& sc,
                    const std::vector<action>& plan,
                    milliseconds deadline = std::chrono::seconds(30)) {
  std::vector<child> kids;
  for (int t = 0; t < sc.n; ++t) kids.emplace_back([&, t] { worker(be, j, t, sc); });
  std::map<int, std::string> up, ready;
  for (int t = 0; t < sc.n; ++t) up[t] = j.up(t, sc.incarnation), ready[t] = j.ready(t);
  // a worker that ended (its restore or its steps failed) does not hold the others up
  if (!files_gate(up)(std::chrono::seconds(20), kids))
    throw std::runtime_error("the workers did not start within 20 s");
  append_line(j.go(sc.incarnation), "go");
  if (!plan.empty() && !files_gate(ready)(std::chrono::seconds(20), kids))
    throw std::runtime_error("the workers did not get ready within 20 s");
  const auto noticed_at = std::chrono::steady_clock::now();
  auto done = schedule_runner(kids).run(plan, noticed_at);
  result r = collect(kids, j, noticed_at, noticed_at + deadline);
  r.schedule = std::move(done);
  return r;
}

/// The plain schedule: SIGKILL `kill_task` (if any), then SIGTERM every task in `noticed`.
inline std::vector<action> notices(const std::vector<int>& noticed, int kill_task = -1) {
  std::vector<action> plan;
  if (kill_task >= 0) plan.push_back(signal_at(milliseconds(0), kill_task, SIGKILL, "kill"));
  for (int t : noticed) plan.push_back(signal_at(milliseconds(0), t, SIGTERM, "notice"));
  return plan;
}

/// Forks the workers, SIGKILLs `kill_task` (if any) once all are ready, then notices `noticed`.
template <class Backend>
result run_job(const Backend& be, const job& j, const scenario& sc, const std::vector<int>& noticed,
               int kill_task = -1) {
  return run_schedule(be, j, sc, notices(noticed, kill_task));
}

/// Every worker's exit and log, one line per worker.
inline std::string describe(const result& r) {
  std::ostringstream s;
  s << "notice at " << r.noticed_at_ms << ", last exit " << r.notice_to_exit_ms
    << " ms later; schedule:";
  for (const auto& d : r.schedule) s << " [" << d << "]";
  s << "\n";
  for (std::size_t t = 0; t < r.exits.size(); ++t) {
    s << "task " << t << ": exit " << r.exits[t].exit_code << " signal " << r.exits[t].term_signal
      << " timed_out " << r.exits[t].timed_out << " " << r.exits[t].failures << " log:";
    for (auto& l : r.logs[t]) s << " [" << l << "]";
    s << "\n";
  }
  return s.str();
}

/// Checks: every worker exited with `code`, saved exactly `saves` times, all at the same steps.
inline void check_agreed_exit(const result& r, int code, std::size_t saves = 1) {
  INFO(describe(r));
  std::set<std::vector<std::int64_t>> steps;
  for (std::size_t t = 0; t < r.exits.size(); ++t) {
    CHECK(r.exits[t].exit_code == code);
    CHECK(r.exits[t].failures == "");
    auto s = r.saves(static_cast<int>(t));
    CHECK(s.size() == saves);
    steps.insert(s);
  }
  CHECK(steps.size() == 1);
}

// ---- the invariant
// -------------------------------------------------------------------------------

/// What one worker did, per round ("<run id>/r0", "<run id>/r0/final", "<run id>/restore"),
/// read from its log.
struct worker_acts {
  std::map<std::string, std::vector<std::int64_t>> saves;  ///< round → steps saved
  std::map<std::string, std::vector<int>> timeouts;        ///< round → missing tasks raised
  std::set<std::string> unreachable;                       ///< rounds it could not reach
  std::map<std::string, std::string> peer;                 ///< run id → "task type message"
  std::map<std::string, std::int64_t> restored;            ///< run id → step restored
  std::set<std::string> runs;                              ///< run ids of its handlers
  std::string own;                                         ///< its own step's error
};

/// The round ("<run id>/r<N>", ".../r<N>/final" or ".../restore") a handler key names.
inline std::string round_of_key(const std::string& key) {
  const std::string prefix = "holdfast/";
  if (key.rfind(prefix, 0) != 0) return "?" + key;
  const auto slash = key.find('/', prefix.size());
  if (slash == std::string::npos) return "?" + key;
  const std::string run = key.substr(prefix.size(), slash - prefix.size());
  std::string rest = key.substr(slash + 1);
  if (rest.rfind("restore", 0) == 0) return run + "/restore";
  if (rest.rfind("ctl/", 0) == 0) rest = rest.substr(4);  // ctl/r<N>/step: round r<N>
  const auto r = rest.find('/');
  const std::string round = rest.substr(0, r);
  const bool final = r != std::string::npos && rest.compare(r + 1, 5, "final") == 0;
  return run + "/" + round + (final ? "/final" : "");
}

/// The outcome key of a round (as round_of_key names it).
inline std::string outcome_key(const std::string& round) {
  const auto slash = round.find('/');
  const std::string run = round.substr(0, slash), rest = round.substr(slash + 1);
  if (rest == "restore") return handler_key(run, "restore/step");
  if (rest.size() > 6 && rest.compare(rest.size() - 6, 6, "/final") == 0)
    return handler_key(run, "ctl/" + rest.substr(0, rest.size() - 6) + "/final_step");
  return handler_key(run, "ctl/" + rest + "/step");
}

/// "1,3," → {1, 3}.
inline std::vector<int> parse_tasks(const std::string& s) {
  std::vector<int> v;
  std::istringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) v.push_back(std::stoi(item));
  return v;
}

namespace detail {
// Reads one log line into `a`; `run` is the current handler's run id, `saved` its saves so far.
inline void read_act(const std::string& line, worker_acts& a, std::string& run, int& saved) {
  std::istringstream in(line);
  std::string word;
  in >> word;
  if (word == "handler") {
    in >> run;
    saved = 0;
    a.runs.insert(run);
  } else if (word == "restored") {
    in >> a.restored[run];
  } else if (word == "save") {
    std::int64_t s = 0;
    in >> s;
    a.saves[run + (saved++ == 0 ? "/r0" : "/r0/final")].push_back(s);
  } else if (word == "timeout") {
    std::string ids, key;
    long ms = 0;
    in >> ids >> ms >> key;
    a.timeouts[round_of_key(key)] = parse_tasks(ids);
  } else if (word == "unreachable") {
    std::string key;
    in >> key;
    a.unreachable.insert(round_of_key(key));
  } else if (word == "peer") {
    a.peer[run] = line.substr(5);
  } else if (word == "own") {
    a.own = line.substr(4);
  }
}
}  // namespace detail

/// What the log of one worker says it did.
inline worker_acts read_acts(const std::vector<std::string>& log) {
  worker_acts a;
  std::string run = "?";
  int saved = 0;
  for (const auto& line : log) detail::read_act(line, a, run, saved);
  return a;
}

/// Tallies of one job's outcome, and every way it broke the invariant.
struct outcome_report {
  std::vector<std::string> violations;  ///< empty: every worker followed every recorded outcome
  bool splits = false;  ///< some round split the workers among themselves, whatever was recorded
  int saves = 0;        ///< saves by all workers
  int timeouts = 0;     ///< workers that raised agreement_timeout
  int unreachable = 0;  ///< workers that raised agreement_unreachable
  int hangs = 0;        ///< workers killed at the deadline
  std::map<std::string, std::string> recorded;  ///< round → its outcome key's value ("" none)
};

namespace detail {
inline std::string tasks_text(const std::vector<int>& v) {
  std::string s;
  for (int t : v) s += (s.empty() ? "" : ",") + std::to_string(t);
  return "{" + s + "}";
}

// Checks one round: what each worker did in it against its recorded outcome.
inline void check_round(const std::string& round, const std::optional<std::string>& text,
                        const std::vector<worker_acts>& acts, std::vector<std::string>& out) {
  auto bad = [&](std::size_t t, const std::string& why) {
    out.push_back(round + ": task " + std::to_string(t) + " " + why +
                  " (recorded: " + text.value_or("nothing") + ")");
  };
  std::optional<holdfast::agreement_value> v;
  if (text) v = holdfast::parse_agreement_value(*text);
  if (text && !v) out.push_back(round + ": outcome '" + *text + "' does not parse");
  using kind = holdfast::agreement_value::kind;
  for (std::size_t t = 0; t < acts.size(); ++t) {
    auto s = acts[t].saves.find(round);
    auto m = acts[t].timeouts.find(round);
    const bool saved = s != acts[t].saves.end(), timed_out = m != acts[t].timeouts.end();
    if (saved && (!v || v->what != kind::step))
      bad(t, "saved at " + std::to_string(s->second.front()));
    if (saved && v && v->what == kind::step &&
        (s->second.size() != 1 || s->second.front() != v->step))
      bad(t, "saved at " + std::to_string(s->second.back()) + ", not the recorded step");
    if (timed_out && (!v || v->what != kind::timeout || v->tasks != m->second))
      bad(t, "raised agreement_timeout " + tasks_text(m->second));
  }
}

// Splits visible among the workers themselves, whatever the store says: two saved steps, or a
// save beside a timeout, or two timeout lists, in one round.
inline void check_split(const std::string& round, const std::vector<worker_acts>& acts,
                        std::vector<std::string>& out) {
  std::set<std::int64_t> steps;
  std::set<std::vector<int>> lists;
  for (const auto& a : acts) {
    if (auto s = a.saves.find(round); s != a.saves.end())
      steps.insert(s->second.begin(), s->second.end());
    if (auto m = a.timeouts.find(round); m != a.timeouts.end()) lists.insert(m->second);
  }
  if (steps.size() > 1 || lists.size() > 1 || (!steps.empty() && !lists.empty()))
    out.push_back("SPLIT in " + round + ": " + std::to_string(steps.size()) + " saved step(s), " +
                  std::to_string(lists.size()) + " timeout list(s)");
}

// Every peer_error of a run names the error recorded in its error key.
inline void check_peers(const std::string& run, const std::optional<std::string>& error,
                        const std::vector<worker_acts>& acts, std::vector<std::string>& out) {
  std::string expected;
  if (error) {
    auto a = error->find('\n'), b = error->find('\n', a + 1);
    if (a != std::string::npos && b != std::string::npos)
      expected =
          error->substr(0, a) + " " + error->substr(a + 1, b - a - 1) + " " + error->substr(b + 1);
  }
  for (std::size_t t = 0; t < acts.size(); ++t) {
    auto p = acts[t].peer.find(run);
    if (p != acts[t].peer.end() && p->second != expected)
      out.push_back(run + ": task " + std::to_string(t) + " raised peer_error '" + p->second +
                    "', recorded error '" + expected + "'");
  }
}

// A worker's exit code says what its log says: 42 only after a save and no failure, and 42
// after a save unless a failure followed or a signal ended it; 3, 4, 6 only with the matching
// peer_error, agreement_timeout, agreement_unreachable.
inline void check_exit(std::size_t t, const std::vector<std::string>& log, const child_result& e,
                       std::vector<std::string>& out) {
  auto has = [&](const char* word) {
    return std::any_of(log.begin(), log.end(),
                       [&](const std::string& l) { return l.rfind(word, 0) == 0; });
  };
  const bool failed = has("peer ") || has("timeout ") || has("unreachable ") || has("own ");
  bool ok = true;
  if (e.exit_code == worker_exit::saved) ok = (has("save ") || has("override ")) && !failed;
  if (e.exit_code == worker_exit::peer) ok = has("peer ");
  if (e.exit_code == worker_exit::timeout) ok = has("timeout ");
  if (e.exit_code == worker_exit::unreachable) ok = has("unreachable ");
  if (has("save ") && !failed && !has("error ") && e.term_signal == 0 && !e.timed_out)
    ok = ok && e.exit_code == worker_exit::saved;
  if (!ok)
    out.push_back("task " + std::to_string(t) + " exited " + std::to_string(e.exit_code) +
                  " but its log does not say so");
}

// Every handler of one run restored the same step.
inline void check_restores(const std::string& run, const std::vector<worker_acts>& acts,
                           std::vector<std::string>& out) {
  std::set<std::int64_t> steps;
  for (const auto& a : acts)
    if (auto r = a.restored.find(run); r != a.restored.end()) steps.insert(r->second);
  if (steps.size() > 1)
    out.push_back("SPLIT in " + run + "/restore: " + std::to_string(steps.size()) +
                  " different steps restored");
}
}  // namespace detail

/// Reads every round's outcome from the store (the parent's client `kv`) and checks that each
/// worker followed it: saves only at a recorded step, timeouts only naming the recorded list,
/// peer errors naming the recorded error; a round with no outcome has no save and no timeout;
/// every handler of a run restored one step; exit codes match the logs (42 after a save: for
/// jobs whose Exit policy exits 42).
template <class Kv>
outcome_report check_outcomes(Kv& kv, const result& r) {
  outcome_report rep;
  std::vector<worker_acts> acts;
  std::set<std::string> rounds, runs;
  for (const auto& log : r.logs) acts.push_back(read_acts(log));
  for (const auto& a : acts) {
    for (const auto& run : a.runs) {
      runs.insert(run);
      for (const char* suffix : {"/r0", "/r0/final", "/restore"}) rounds.insert(run + suffix);
    }
    for (const auto& s : a.saves)
      rounds.insert(s.first), rep.saves += static_cast<int>(s.second.size());
    for (const auto& m : a.timeouts) rounds.insert(m.first);
    rep.timeouts += a.timeouts.empty() ? 0 : 1;
    rep.unreachable += a.unreachable.empty() ? 0 : 1;
  }
  for (const auto& round : rounds) {
    auto text = kv.try_get(outcome_key(round));
    rep.recorded[round] = text.value_or("");
    const auto before = rep.violations.size();
    detail::check_split(round, acts, rep.violations);
    rep.splits = rep.splits || rep.violations.size() > before;
    detail::check_round(round, text, acts, rep.violations);
  }
  for (const auto& run : runs) {
    detail::check_peers(run, kv.try_get(handler_key(run, "ctl/error")), acts, rep.violations);
    const auto before = rep.violations.size();
    detail::check_restores(run, acts, rep.violations);
    rep.splits = rep.splits || rep.violations.size() > before;
  }
  for (std::size_t t = 0; t < r.exits.size(); ++t)
    detail::check_exit(t, r.logs[t], r.exits[t], rep.violations);
  rep.hangs = r.hangs();
  return rep;
}

/// The recorded outcome of round 0 of handler `run_id` (nullopt: none, or it does not parse).
template <class Kv>
std::optional<holdfast::agreement_value> recorded_step(Kv& kv, const std::string& run_id = "run") {
  auto text = kv.try_get(handler_key(run_id, "ctl/r0/step"));
  if (!text) return std::nullopt;
  return holdfast::parse_agreement_value(*text);
}

}  // namespace holdfast_test
