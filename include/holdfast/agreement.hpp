// holdfast/agreement.hpp — step agreement: a pure state machine that decides, before each training
// step, whether to go on, checkpoint, or checkpoint and exit, so that every worker of a job
// checkpoints at one agreed step after any of them is told its machine is going away.
//
// The machine does no I/O, starts no thread and reads no clock. It is driven from two sides
// (preemption_handler in handler.hpp, or a test), one at a time (the handler holds a mutex):
//   - the watcher (a background thread) feeds events — this worker's notice, what it saw in the
//     coordination store — and asks `protocol_next(counter, now)` for the next store operation
//     (insert, put, try_get, wait, list, erase), performs it and reports the result. The
//     watcher, not the training thread, claims, acks, collects the acks and records the step, so
//     a worker blocked inside a step (a collective waiting for a peer) still takes part.
//   - the training thread asks `decide(counter, now, mean_step)` before each step: proceed,
//     wait (the step is not known yet), save, save then exit, save then continue through the
//     grace period, or fail.
// All protocol logic lives here; the drivers only map key ids to strings and call the store.
//
// Protocol of one round (keys relative to the run scope, see agreement_key_name; values in the
// one grammar of agreement_value: "<body> by <task>/<nonce>", so every value names its writer).
// Control keys live under ctl/, which every worker watches; acks live apart, read by one worker:
//   ctl/r<N>/claim      insert-once by the first noticed worker ("claim by 2/9f3a"): the CLAIMANT
//   ack/r<N>/<task>     every worker's watcher, once it knows of the claim, raises its training
//                       thread's attention and puts the run counter read in the same atomic
//                       operation (so the training thread stops at the next boundary at most)
//   ctl/r<N>/step       the round's OUTCOME, recorded once (insert-once): the claimant reads the
//                       N - 1 other acks one by one (a wait each, until its deadline) and
//                       inserts "step <max(counters) + 1>" (XLA's rule: any skew is tolerated; no
//                       worker is past its published counter + 1 <= the step), or "timeout
//                       <missing tasks>" when some ack never came; every other worker waits on
//                       this key alone until its deadline, then lists the acks (or reads each)
//                       and records the step or the timeout itself; whoever loses the race
//                       reads and follows the key
//   ctl/r<N>/final, final_ack/r<N>/<task>, ctl/r<N>/final_step
//                       the same three keys for the second save of the grace path
//   ctl/error           insert-once by a worker whose step threw ("task\ntype\nmessage");
//                       it also inserts "abort" into the outcome and claim keys of its round
//                       and the next, so peers blocked on any of them wake up and read the error
// Cleanup (erase instructions, best effort): once a phase's outcome is a step, each worker
// erases its own ack; the worker that recorded round N's first step erases round N-1's control
// keys (every task acked round N, so none reads round N-1 any more). Any number of rounds
// leaves one round's control keys and no acks, with single-key erases (no prefix delete).
//
// Transitions (W: watcher side, protocol_next / results; T: training side, decide). The final
// phase (final_noticed, final_claimed, final_acked, final_published) mirrors the first.
//
//   state          | event or answer                                  | next state
//   ---------------+--------------------------------------------------+------------------------
//   idle           | on_notice (a new one)                            | noticed
//   idle           | on_claim_seen(round)                             | claimed (follower)
//   idle           | T: proceed                                       | idle
//   noticed        | W: insert claim = "claim by me"                  | (awaiting result)
//   noticed        | on_insert(true)                                  | claimed (claimant)
//   noticed        | on_insert(false), or on_claim_seen first         | claimed (follower)
//   claimed        | W: put ack/<task> = counter                      | (awaiting result)
//   claimed        | on_put                                           | acked, deadline set
//   acked, claimant| W: wait ack/<t> (deadline), each other task t    | (awaiting result)
//   acked, claimant| on_value(counter); nullopt or not a counter: t   | next task (past the
//                  | is missing                                       | deadline: no waiting)
//   acked, claimant| every task read, none missing                    | W: insert step S = max+1
//   acked, claimant| every task read, tasks M missing                 | recording: W: insert
//                  |                                                  | step "timeout M"
//   acked, claimant| on_outcome_seen(value) while waiting for an ack  | as on_value(value) below
//   any other      | on_outcome_seen(value)                           | (ignored)
//   acked          | on_insert(step) true                             | step_published (S)
//   acked          | on_insert(step) false; a non-claimant after ack  | W: wait step (deadline)
//   acked          | on_value("step S by ...")                        | step_published (S)
//   acked          | on_value("timeout M by ...")                     | failed (timeout, M)
//   acked          | on_value("abort by ...")                         | W: try_get error
//   acked          | on_value(error payload)                          | failed (peer)
//   acked          | on_value(another text)                           | failed (peer, malformed)
//   acked          | on_value(nullopt): the deadline passed           | recording: W: list ack/
//   acked          | on_list after the deadline, every task present   | W: insert step S = max+1
//   acked          | on_list after the deadline, tasks M missing      | W: insert step "timeout M"
//   acked          | on_insert(timeout) true                          | failed (timeout, M)
//   acked          | on_insert(timeout) false                         | W: wait step: follow it
//   noticed..acked | on_store_failure (retries ran out), not recording| recording: W: list ack/
//   noticed..acked | on_store_failure while recording                 | failed (unreachable)
//   step_published | (entering it) W: erase ack/<me>; the recorder of   | (no result)
//                  | a first step in round N > 0: erase ctl/r<N-1>/*  |
//   final_published| (entering it) W: erase final_ack/<me>            | (no result)
//   noticed..acked | T: counter <= published counter (or none yet)    | proceed
//   noticed..acked | T: counter > published counter                   | wait
//   step_published | T: counter < S                                   | proceed
//   step_published | T: counter >= S, grace > 0                       | save_then_continue, grace
//   step_published | T: counter >= S, no grace, exits                 | save_then_exit, exiting
//   step_published | T: counter >= S, no grace, no exit               | save, idle (round + 1)
//   grace          | T: noticed here, now > end - 6 mean - 2 overhead | final_noticed, proceed
//                  |    - grace_margin                                |
//   grace          | T: otherwise                                     | proceed
//   grace          | on_final_seen(round)                             | final_claimed
//   final_published| T: counter >= S2, exits (no exit)                | save_then_exit (save)
//   exiting        | T: proceed (the driver exits, or calls rearm)    | exiting
//   any            | on_error_seen(payload of another task)           | failed (peer)
//   any            | on_local_error: W inserts error and aborts       | failed (local)
//   failed         | T: fail (sticky)                                 | failed
//   any            | on_stop                                          | stopped (inert)
//
// "end" is notice time + grace period, or the notice's announced deadline when that is earlier;
// 6 x mean step time is TF's 3 x 2 x step-time buffer; "overhead" (note_overhead) is what the
// first agreement and save took, reserved twice so the second one also fits; grace_margin is a
// fixed reserve on top (handler_options::grace_margin). Only a worker that was noticed itself
// computes it (clocks of different machines are never compared).
//
// Retries: the driver retries a failed store instruction (transient errors, with backoff) until
// retry_deadline(): the round's deadline (ack_timeout after the ack; before it, ack_timeout after
// this worker joined the round), and while recording the outcome one more ack_timeout. Inserts
// are made idempotent by the driver (values name their writer: a retry reads the key first).
//
// Guarantees:
//   - Exactly one claim per round (insert-once) and one recorded outcome per phase; every worker
//     that acts follows it: all save at the recorded step, or all fail with the recorded
//     timeout naming the same missing tasks (a worker stopped past the deadline that resumes
//     finds the recorded timeout and fails with it). No worker saves at a step the outcome key
//     does not hold, and none fails with a timeout while it holds a step.
//   - A worker that can reach the store neither to read nor to record the outcome fails with
//     kind unreachable and never saves (outside the invariant; the restore agreement in the
//     handler keeps the restarted job on one step).
//   - No worker passes the agreed step: it is above every published counter, and decide()
//     answers wait once the counter passed this worker's published one, until the outcome is
//     known.
//   - O(N) store traffic per agreement in all: every worker but the claimant makes a constant
//     number of operations (claim insert if noticed, one put, one wait, one erase; a list or N
//     reads and an insert only when its deadline passes); the claimant reads N - 1 acks and
//     inserts the outcome. Events a watcher of ctl/ sees per round: a constant number.
//   - No unbounded wait: the only blocking instruction (wait) carries the deadline
//     `acked time + ack_timeout`; past it the outcome is recorded or read within the retry
//     deadline.
//   - Re-armable: after a save without exit (or rearm()), the next round uses fresh keys.
// Caveats:
//   - If every noticed worker dies during the grace countdown, nobody publishes the final step
//     and the survivors train on until the scheduler kills them.
//   - A noticed worker that cannot insert its claim before its deadline records a timeout in a
//     round its peers may never see (they watch the claim key): it fails alone, its peers train
//     on until their next collective with it fails.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "version.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The states of step_agreement (see the transition table at the top of agreement.hpp).
enum class agreement_state : unsigned char {
  idle,             ///< no notice, no claim seen: steady state
  noticed,          ///< this worker was noticed and is claiming
  claimed,          ///< a claim exists; this worker publishes its counter (its ack)
  acked,            ///< counter published; waiting until every task has acked and a step exists
  step_published,   ///< the agreed step is known; save when the run counter reaches it
  grace,            ///< saved once; training through the grace period
  final_noticed,    ///< this worker decided the grace period is over and claims the final save
  final_claimed,    ///< the final claim exists; publishing this worker's counter
  final_acked,      ///< waiting for every final ack and the final step
  final_published,  ///< the final step is known; save and exit when the counter reaches it
  exiting,          ///< the last save was answered; the driver exits or re-arms
  failed,           ///< a peer's error, a local error, or an agreement timeout (sticky)
  stopped,          ///< shut down; inert
};

/// A verdict for one step.
enum class agreement_action : unsigned char {
  proceed,             ///< run the step
  wait,                ///< do not run it yet: the agreed step is not known (block until it is)
  save,                ///< checkpoint at this step, then return to the caller (no exit; re-armed)
  save_then_exit,      ///< checkpoint at this step, then exit through the Exit policy
  save_then_continue,  ///< first save of the grace path: checkpoint, then keep training
  fail,                ///< raise the failure described by step_agreement::failure()
};

/// The keys of the protocol (names: agreement_key_name).
enum class agreement_key : unsigned char {
  claim,        ///< ctl/r<N>/claim
  ack,          ///< ack/r<N>/<task> (a list instruction names the prefix ack/r<N>/)
  step,         ///< ctl/r<N>/step
  final_claim,  ///< ctl/r<N>/final
  final_ack,    ///< final_ack/r<N>/<task>
  final_step,   ///< ctl/r<N>/final_step
  error,        ///< ctl/error (one per run)
};

/// The prefix of every control key (claims, outcomes, the error key) under `scope` (which ends
/// with '/'): "<scope>ctl". Acks live apart from it, so a watch on it sees O(1) events per round.
inline std::string agreement_control_prefix(std::string_view scope) {
  return std::string(scope) + "ctl";
}

/// The full key for `k` in round `round` under `scope` (which ends with '/'); task -1 names the
/// ack prefix (ending with '/'). Control keys: <scope>ctl/r<N>/{claim,step,final,final_step} and
/// <scope>ctl/error; acks: <scope>ack/r<N>/<task> and <scope>final_ack/r<N>/<task>.
inline std::string agreement_key_name(std::string_view scope, agreement_key k, std::uint64_t round,
                                      int task = -1) {
  std::string s(scope);
  if (k == agreement_key::ack || k == agreement_key::final_ack) {
    s += k == agreement_key::ack ? "ack/r" : "final_ack/r";
    s += std::to_string(round) + "/";
    return task < 0 ? s : s + std::to_string(task);
  }
  s += "ctl/";
  if (k == agreement_key::error) return s + "error";
  s += "r" + std::to_string(round) + "/";
  switch (k) {
    case agreement_key::claim:
      return s + "claim";
    case agreement_key::step:
      return s + "step";
    case agreement_key::final_claim:
      return s + "final";
    case agreement_key::final_step:
      return s + "final_step";
    case agreement_key::ack:
    case agreement_key::final_ack:
    case agreement_key::error:
      break;
  }
  return s;
}

/// What a control key of the agreement holds: a claim, or a round's recorded outcome (an agreed
/// step, a timeout naming the missing tasks, an abort after a step error, or "none" for a restore
/// agreement that found no common step), and who wrote it. Text form (one grammar, parsed by
/// parse_agreement_value and written by format_agreement_value):
///   value  := body " by " task "/" nonce
///   body   := "claim" | "step " int | "timeout " int ("," int)* | "abort" | "none"
///   int    := "0" | [1-9][0-9]*   (a non-negative int64; task ids fit an int)
///   nonce  := 1 to 32 of [0-9A-Za-z_-]   (the writing handler's instance: a restarted process
///                                         with the same task writes another nonce)
/// e.g. "step 57 by 2/9f3a0c1d", "timeout 1,3 by 0/77e2b4aa". Timeout task lists are ascending
/// with no duplicates.
struct agreement_value {
  /// What the value says.
  enum class kind : unsigned char { claim, step, timeout, abort, none };
  kind what = kind::step;  ///< the body
  std::int64_t step = -1;  ///< step: the agreed (or restored) step
  std::vector<int> tasks;  ///< timeout: the tasks that did not answer, ascending
  int writer = -1;         ///< the task that wrote it
  std::string nonce;       ///< the writing handler instance

  /// Same body and writer.
  friend bool operator==(const agreement_value& a, const agreement_value& b) {
    return a.what == b.what && a.step == b.step && a.tasks == b.tasks && a.writer == b.writer &&
           a.nonce == b.nonce;
  }
  /// Not the same value.
  friend bool operator!=(const agreement_value& a, const agreement_value& b) { return !(a == b); }
};

namespace detail {
/// A non-negative decimal with no sign, no leading zero (but "0") and at most `max`.
inline std::optional<std::int64_t> parse_agreement_int(std::string_view s, std::int64_t max) {
  if (s.empty() || s.size() > 19 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const int d = c - '0';
    if (v > (max - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}
inline bool agreement_nonce_ok(std::string_view n) {
  if (n.empty() || n.size() > 32) return false;
  for (char c : n)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
          c == '-'))
      return false;
  return true;
}
}  // namespace detail

/// The text form of `v` (see agreement_value). Throws std::invalid_argument for a value the
/// grammar cannot spell (a negative step or task, an empty timeout list, a bad nonce).
inline std::string format_agreement_value(const agreement_value& v) {
  if (v.writer < 0 || !detail::agreement_nonce_ok(v.nonce))
    throw std::invalid_argument("agreement value: bad writer " + std::to_string(v.writer) + "/" +
                                v.nonce);
  std::string body;
  switch (v.what) {
    case agreement_value::kind::claim:
      body = "claim";
      break;
    case agreement_value::kind::step:
      if (v.step < 0) throw std::invalid_argument("agreement value: negative step");
      body = "step " + std::to_string(v.step);
      break;
    case agreement_value::kind::timeout:
      if (v.tasks.empty()) throw std::invalid_argument("agreement value: empty timeout list");
      body = "timeout ";
      for (std::size_t i = 0; i < v.tasks.size(); ++i) {
        if (v.tasks[i] < 0 || (i > 0 && v.tasks[i] <= v.tasks[i - 1]))
          throw std::invalid_argument("agreement value: timeout tasks not ascending");
        body += (i ? "," : "") + std::to_string(v.tasks[i]);
      }
      break;
    case agreement_value::kind::abort:
      body = "abort";
      break;
    case agreement_value::kind::none:
      body = "none";
      break;
  }
  return body + " by " + std::to_string(v.writer) + "/" + v.nonce;
}

/// Parses a control value (see agreement_value); std::nullopt when `text` does not follow the
/// grammar exactly. Never throws, never reads past `text`.
inline std::optional<agreement_value> parse_agreement_value(std::string_view text) noexcept {
  try {
    constexpr std::string_view by = " by ";
    const auto at = text.rfind(by);
    if (at == std::string_view::npos) return std::nullopt;
    std::string_view body = text.substr(0, at), who = text.substr(at + by.size());
    const auto slash = who.find('/');
    if (slash == std::string_view::npos) return std::nullopt;
    constexpr std::int64_t int_max = 0x7fffffff;
    auto writer = detail::parse_agreement_int(who.substr(0, slash), int_max);
    if (!writer || !detail::agreement_nonce_ok(who.substr(slash + 1))) return std::nullopt;
    agreement_value v;
    v.writer = static_cast<int>(*writer);
    v.nonce = std::string(who.substr(slash + 1));
    auto word = [&](std::string_view w) {
      if (body.substr(0, w.size()) != w) return false;
      body.remove_prefix(w.size());
      return true;
    };
    if (body == "claim") {
      v.what = agreement_value::kind::claim;
    } else if (body == "abort") {
      v.what = agreement_value::kind::abort;
    } else if (body == "none") {
      v.what = agreement_value::kind::none;
    } else if (word("step ")) {
      auto s = detail::parse_agreement_int(body, INT64_MAX);
      if (!s) return std::nullopt;
      v.what = agreement_value::kind::step;
      v.step = *s;
    } else if (word("timeout ")) {
      v.what = agreement_value::kind::timeout;
      for (;;) {
        const auto comma = body.find(',');
        auto t = detail::parse_agreement_int(body.substr(0, comma), int_max);
        if (!t || (!v.tasks.empty() && *t <= v.tasks.back())) return std::nullopt;
        v.tasks.push_back(static_cast<int>(*t));
        if (comma == std::string_view::npos) break;
        body.remove_prefix(comma + 1);
      }
    } else {
      return std::nullopt;
    }
    return v;
  } catch (...) {  // std::bad_alloc: not a value we can hold
    return std::nullopt;
  }
}

/// The text of a restore agreement's step list: the steps a worker holds, ascending, joined by
/// ',' ("" for none). At most the newest `max_steps` are written.
inline std::string format_step_list(const std::vector<std::int64_t>& steps,
                                    std::size_t max_steps = 1000) {
  std::string s;
  const std::size_t from = steps.size() > max_steps ? steps.size() - max_steps : 0;
  for (std::size_t i = from; i < steps.size(); ++i)
    s += (i > from ? "," : "") + std::to_string(steps[i]);
  return s;
}

/// Parses format_step_list's text (strictly ascending non-negative steps); std::nullopt when it
/// does not follow that form.
inline std::optional<std::vector<std::int64_t>> parse_step_list(std::string_view text) {
  std::vector<std::int64_t> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    auto s = detail::parse_agreement_int(text.substr(0, comma), INT64_MAX);
    if (!s || (!out.empty() && *s <= out.back())) return std::nullopt;
    out.push_back(*s);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return std::nullopt;  // a trailing ','
  }
  return out;
}

/// The newest step present in every list (each ascending), or std::nullopt when they share none.
inline std::optional<std::int64_t> newest_common_step(
    const std::vector<std::vector<std::int64_t>>& lists) {
  if (lists.empty()) return std::nullopt;
  const auto& first = lists.front();
  for (auto it = first.rbegin(); it != first.rend(); ++it) {
    bool everywhere = std::all_of(lists.begin() + 1, lists.end(), [&](const auto& l) {
      return std::binary_search(l.begin(), l.end(), *it);
    });
    if (everywhere) return *it;
  }
  return std::nullopt;
}

/// Why the machine failed.
enum class agreement_failure : unsigned char {
  none,         ///< not failed
  peer,         ///< another task's step threw (peer_task, type_name, message)
  local,        ///< this task's step threw; the driver re-throws its own exception
  timeout,      ///< the recorded outcome is a timeout (missing_tasks: the recorded list)
  unreachable,  ///< the store could not be reached to read or record the outcome (message)
};

/// What failed, for the driver to raise.
struct agreement_failure_info {
  agreement_failure kind = agreement_failure::none;
  int task = -1;                            ///< peer or local: the task whose step threw
  std::string type_name;                    ///< peer or local: the exception's type name
  std::string message;                      ///< peer or local: its what(); unreachable: why
  std::vector<int> missing_tasks;           ///< timeout: tasks with no ack, as recorded
  agreement_key key = agreement_key::step;  ///< timeout, unreachable: the outcome key
  std::uint64_t round = 0;                  ///< timeout, unreachable: its round
};

/// Static parameters of a step_agreement.
template <class Duration>
struct basic_agreement_config {
  int task = 0;                   ///< this worker's task id, 0 <= task < num_tasks
  int num_tasks = 1;              ///< workers in the job
  Duration grace{};               ///< grace period; zero = save then exit
  Duration ack_timeout{};         ///< how long a worker waits for every ack
  bool exit_after_save = true;    ///< false: no_exit (save, then re-arm and return)
  std::uint64_t first_round = 0;  ///< round number to start from
  Duration grace_margin{};        ///< the final claim of the grace path is made this much earlier
  std::string nonce = "0";        ///< this instance's id in the values it writes ("by task/nonce")
};

/// The pure step-agreement state machine; Clock only names the time_point and duration types.
template <class Clock = std::chrono::steady_clock>
class basic_step_agreement {
 public:
  using clock = Clock;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using config = basic_agreement_config<duration>;

  /// One thing for the driver to do: a verdict (kind == decide) or a store operation.
  struct instruction {
    enum class op : unsigned char { decide, insert, put, try_get, wait, list, erase };
    op kind = op::decide;
    agreement_action action = agreement_action::proceed;  ///< decide: the verdict
    std::int64_t step = -1;                               ///< decide with a save: the step saved
    agreement_key key = agreement_key::claim;             ///< store ops: which key
    std::uint64_t round = 0;                              ///< store ops: its round
    int task = -1;          ///< ack keys: the task (-1 for a list of the prefix)
    std::string value;      ///< insert, put: the value
    time_point deadline{};  ///< wait: block until the key exists or this time
  };

  explicit basic_step_agreement(config cfg) : cfg_(cfg), round_(cfg.first_round) {
    if (cfg_.num_tasks < 1 || cfg_.task < 0 || cfg_.task >= cfg_.num_tasks)
      throw std::invalid_argument("step_agreement: task " + std::to_string(cfg_.task) +
                                  " outside [0, " + std::to_string(cfg_.num_tasks) + ")");
    if (!detail::agreement_nonce_ok(cfg_.nonce))
      throw std::invalid_argument("step_agreement: nonce '" + cfg_.nonce +
                                  "' is not 1 to 32 of [0-9A-Za-z_-]");
  }

  // ---- events -------------------------------------------------------------------------------

  /// This worker got a termination notice at `when`, with an optional announced deadline.
  /// A notice at or before one already served by a save is ignored.
  void on_notice(time_point when, std::optional<time_point> deadline = std::nullopt) {
    if (state_ == agreement_state::stopped || state_ == agreement_state::failed) return;
    if (consumed_notice_ && when <= *consumed_notice_) return;
    if (notice_ && *notice_ <= when) return;  // keep the earliest notice of this round
    notice_ = when;
    deadline_ = deadline;
    if (state_ == agreement_state::idle) state_ = agreement_state::noticed;
  }

  /// The watcher saw the claim key of `round`.
  void on_claim_seen(std::uint64_t round) {
    if (round != round_) return;
    if (state_ == agreement_state::idle ||
        (state_ == agreement_state::noticed && awaiting_ == await::none))
      state_ = agreement_state::claimed;
  }

  /// The watcher saw the final-claim key of `round`.
  void on_final_seen(std::uint64_t round) {
    if (round != round_) return;
    if (state_ == agreement_state::grace ||
        (state_ == agreement_state::final_noticed && awaiting_ == await::none))
      state_ = agreement_state::final_claimed;
  }

  /// The watcher (or a wait) saw the error key with `payload` ("task\ntype\nmessage").
  void on_error_seen(const std::string& payload) {
    if (state_ == agreement_state::stopped || state_ == agreement_state::failed) return;
    fail_with_payload(payload);
  }

  /// This worker's step threw: the following protocol_next() calls emit the inserts that publish
  /// the error and put "abort" into the step and claim keys of this round and the next (so a peer
  /// blocked on any of them wakes), then answer fail (kind local).
  void on_local_error(const std::string& type_name, const std::string& message) {
    if (state_ == agreement_state::stopped) return;
    if (state_ == agreement_state::failed) return;
    failure_ = agreement_failure_info{};
    failure_.kind = agreement_failure::local;
    failure_.task = cfg_.task;
    failure_.type_name = type_name;
    failure_.message = message;
    state_ = agreement_state::failed;
    awaiting_ = await::none;
    outbox_.clear();
    std::string payload = encode_error(cfg_.task, type_name, message);
    outbox_.push_back(make(instruction::op::insert, agreement_key::error, -1, payload));
    for (std::uint64_t r : {round_, round_ + 1})
      for (agreement_key k : {agreement_key::step, agreement_key::final_step, agreement_key::claim,
                              agreement_key::final_claim}) {
        instruction in = make(instruction::op::insert, k, -1, value_text(kind::abort));
        in.round = r;
        outbox_.push_back(std::move(in));
      }
  }

  /// The time the driver spent agreeing and saving for the first save of the grace path. The
  /// final claim is made twice that much earlier, on top of the 6 × mean step time buffer, so
  /// the second agreement and save also end before the grace period does.
  void note_overhead(duration d) {
    if (d > overhead_) overhead_ = d;
  }

  /// A store instruction failed for good: its retries (the driver's, with backoff) ran out at
  /// retry_deadline(), or the error was not transient. Before the round's deadline the machine
  /// goes on to record the round's outcome (list the acks, insert a timeout naming the missing
  /// tasks, or follow what is recorded); when recording fails too, it fails with kind
  /// unreachable: this worker never saves in this round and raises agreement_unreachable.
  void on_store_failure(const std::string& why) {
    if (inert()) return;
    outbox_.clear();
    if (recording_ || !agreeing()) {
      failure_ = agreement_failure_info{};
      failure_.kind = agreement_failure::unreachable;
      failure_.message = why;
      failure_.key = step_key();
      failure_.round = round_;
      state_ = agreement_state::failed;
      awaiting_ = await::none;
      return;
    }
    recording_ = true;
    if (ack_deadline_ == time_point{}) ack_deadline_ = round_deadline_;
    state_ = phase_state(phase(), agreement_state::acked);
    awaiting_ = await::timeout_list_pending;
  }

  /// Until when the driver may retry the store instruction it holds (transient failures, with
  /// backoff): the round's deadline (the ack deadline once acked, else ack_timeout after this
  /// worker joined the round); while recording the outcome after it, one more ack_timeout.
  time_point retry_deadline() const noexcept {
    const time_point d = ack_deadline_ != time_point{} ? ack_deadline_ : round_deadline_;
    return recording_ ? d + cfg_.ack_timeout : d;
  }

  /// Shut down: the machine answers proceed and asks for nothing from now on.
  void on_stop() {
    state_ = agreement_state::stopped;
    awaiting_ = await::none;
    outbox_.clear();
  }

  /// Start a new round (after a save the driver did not exit on, or an in-process restart).
  void rearm() {
    if (state_ == agreement_state::stopped || state_ == agreement_state::failed) return;
    ++round_;
    // Every notice up to now was served by this round's save.
    time_point served = notice_ ? std::max(*notice_, now_) : now_;
    consumed_notice_ = std::max(consumed_notice_.value_or(served), served);
    notice_.reset();
    deadline_.reset();
    state_ = agreement_state::idle;
    awaiting_ = await::none;
    claimant_ = false;
    my_counter_ = -1;
    step_[0] = step_[1] = -1;
    new_phase();
  }

  // ---- results of store instructions --------------------------------------------------------

  /// Result of an insert instruction: true when this worker created the key.
  void on_insert(bool created) {
    if (inert()) return;
    if (awaiting_ == await::claim) {
      awaiting_ = await::none;
      claimant_ = created || claimant_;
      state_ = phase_state(phase(), agreement_state::claimed);
    } else if (awaiting_ == await::insert_step) {
      awaiting_ = await::none;
      if (created)
        publish_step(computed_step_, true);
      else
        awaiting_ = await::wait_step_pending;  // another outcome is recorded: read it
    } else if (awaiting_ == await::insert_timeout) {
      awaiting_ = await::none;
      if (created)
        fail_timeout(std::move(missing_));
      else
        awaiting_ = await::wait_step_pending;  // a step or another timeout won: follow it
    } else {
      expect(false, "insert result");
    }
  }

  /// Result of a put instruction.
  void on_put() {
    if (inert()) return;
    expect(awaiting_ == await::ack, "put");
    // The claimant collects the acks (O(N) reads in all); every other worker waits on the
    // outcome key alone.
    awaiting_ = claimant_ ? await::collect_pending : await::wait_step_pending;
    collect_next_ = 0;
    collect_max_ = my_counter_;
    missing_.clear();
    ack_deadline_ = now_ + cfg_.ack_timeout;
    state_ = phase_state(phase(), agreement_state::acked);
  }

  /// Result of a try_get or wait instruction: the value, or nullopt (absent / deadline passed).
  void on_value(const std::optional<std::string>& value) {
    if (inert()) return;
    if (awaiting_ == await::collect) {  // the claimant's wait for one task's ack
      awaiting_ = await::collect_pending;
      auto c = value ? parse_int(*value) : std::nullopt;
      if (c)
        collect_max_ = std::max(collect_max_, *c);
      else  // absent at the deadline, or not a counter
        missing_.push_back(collect_next_);
      ++collect_next_;
    } else if (awaiting_ == await::wait_step) {
      awaiting_ = await::none;
      if (!value) {  // the deadline passed: record a timeout unless every ack is there now
        recording_ = true;
        awaiting_ = await::timeout_list_pending;
        return;
      }
      auto v = parse_agreement_value(*value);
      if (v && v->what == kind::step) {
        publish_step(v->step, false);
      } else if (v && v->what == kind::timeout) {
        fail_timeout(std::move(v->tasks));
      } else if (v && v->what == kind::abort) {
        awaiting_ = await::error_pending;
      } else {  // not the grammar: nobody can follow it; fail as a peer error naming it
        fail_with_payload(
            encode_error(-1, "holdfast::format_error", "malformed outcome '" + *value + "'"));
      }
    } else if (awaiting_ == await::read_error) {
      awaiting_ = await::none;
      fail_with_payload(value.value_or(std::string()));
    } else {
      expect(false, "value result");
    }
  }

  /// The driver saw this phase's outcome key hold `value` while it waited for an ack (a wait
  /// instruction of the claimant's collection), and abandoned that wait: the machine follows
  /// the value as if its own wait on the outcome key had returned it. Ignored otherwise.
  void on_outcome_seen(const std::string& value) {
    if (inert() || awaiting_ != await::collect) return;
    awaiting_ = await::wait_step;
    on_value(value);
  }

  /// True when the outstanding instruction is a wait for an ack (the claimant's collection):
  /// the driver should also watch the outcome key (outcome_key()) and report it with
  /// on_outcome_seen, so a recorded outcome or an abort is not held up until the deadline.
  bool collecting() const noexcept { return awaiting_ == await::collect; }

  /// The outcome key of the current phase (step, or final_step in the grace path).
  agreement_key outcome_key() const noexcept { return step_key(); }

  /// Result of a list instruction: the (key, value) pairs under the ack prefix.
  void on_list(const std::vector<std::pair<std::string, std::string>>& entries) {
    if (inert()) return;
    expect(awaiting_ == await::timeout_list, "list");
    awaiting_ = await::none;
    std::vector<bool> seen(static_cast<std::size_t>(cfg_.num_tasks), false);
    std::int64_t max_counter = -1;
    for (const auto& kv : entries) {
      auto slash = kv.first.rfind('/');
      auto t = parse_int(slash == std::string::npos ? kv.first : kv.first.substr(slash + 1));
      auto c = parse_int(kv.second);
      if (!t || !c || *t < 0 || *t >= cfg_.num_tasks) continue;
      seen[static_cast<std::size_t>(*t)] = true;
      max_counter = std::max(max_counter, *c);
    }
    std::vector<int> missing;
    for (int t = 0; t < cfg_.num_tasks; ++t)
      if (!seen[static_cast<std::size_t>(t)]) missing.push_back(t);
    if (missing.empty()) {
      computed_step_ = max_counter + 1;
      awaiting_ = await::insert_step_pending;
    } else {  // record the timeout; whoever loses the race follows the key
      missing_ = std::move(missing);
      awaiting_ = await::insert_timeout_pending;
    }
  }

  // ---- the two questions: the watcher's and the training thread's ---------------------------

  /// The watcher's question: the next store operation of the protocol, or a decide instruction
  /// (action proceed) when there is none now. `counter` is the run counter the watcher read at
  /// the moment it raised the training thread's attention (see wants_counter()): the ack carries
  /// it. Each store instruction's result but an erase's must be reported (on_insert, on_put,
  /// on_value, on_list) before asking again.
  instruction protocol_next(std::int64_t counter, time_point now) {
    now_ = now;
    if (!outbox_.empty()) {
      instruction in = std::move(outbox_.front());
      outbox_.erase(outbox_.begin());
      return in;
    }
    expect(!is_waiting_for_result(), "protocol_next() before the previous result");
    if (agreeing() && round_deadline_ == time_point{}) round_deadline_ = now + cfg_.ack_timeout;
    switch (state_) {
      case agreement_state::noticed:
      case agreement_state::final_noticed:
        awaiting_ = await::claim;
        return make(instruction::op::insert, claim_key(), -1, value_text(kind::claim));
      case agreement_state::claimed:
      case agreement_state::final_claimed:
        awaiting_ = await::ack;
        my_counter_ = counter;
        return make(instruction::op::put, ack_key(), cfg_.task, std::to_string(counter));
      case agreement_state::acked:
      case agreement_state::final_acked:
        return next_in_acked(now);
      default:
        return verdict(agreement_action::proceed);
    }
  }

  /// True when protocol_next() will publish this worker's ack: the watcher must then read the
  /// run counter atomically with raising the training thread's attention, and pass it.
  bool wants_counter() const noexcept {
    return (state_ == agreement_state::claimed || state_ == agreement_state::final_claimed) &&
           awaiting_ == await::none && outbox_.empty();
  }

  /// The training thread's question, before the step with run counter `counter` at time `now`,
  /// given the running mean step time: proceed, wait (the agreed step is not known yet and this
  /// step may be past it: block until the watcher reports), save, save then exit, save then
  /// continue, or fail. A step is never past the agreed step: the agreed step is above every
  /// published counter, and a worker only waits once its counter passed its published one.
  instruction decide(std::int64_t counter, time_point now, duration mean_step = duration::zero()) {
    now_ = now;
    if (agreeing())  // the outcome is not known: a step past the published counter may be it
      return verdict(my_counter_ >= 0 && counter > my_counter_ ? agreement_action::wait
                                                               : agreement_action::proceed);
    switch (state_) {
      case agreement_state::failed:
        return verdict(agreement_action::fail);
      case agreement_state::step_published:
      case agreement_state::final_published:
        return next_in_published(counter);
      case agreement_state::grace: {
        if (notice_) {
          time_point end = *notice_ + cfg_.grace;
          if (deadline_ && *deadline_ < end) end = *deadline_;
          if (now > end - 6 * mean_step - 2 * overhead_ - cfg_.grace_margin)
            state_ = agreement_state::final_noticed;
        }
        return verdict(agreement_action::proceed);
      }
      default:  // idle, exiting, stopped
        break;
    }
    return verdict(agreement_action::proceed);
  }

  // ---- queries -------------------------------------------------------------------------------

  /// The current state.
  agreement_state state() const noexcept { return state_; }
  /// The current round (keys r<round>/...).
  std::uint64_t round() const noexcept { return round_; }
  /// True when this worker won the claim of the current round.
  bool claimant() const noexcept { return claimant_; }
  /// The agreed step of the first (0) or final (1) save of this round, or -1.
  std::int64_t agreed_step(int which = 0) const noexcept { return step_[which ? 1 : 0]; }
  /// The counter this worker published in its ack of the current phase, or -1.
  std::int64_t published_counter() const noexcept { return my_counter_; }
  /// What failed (kind none unless state() == failed).
  const agreement_failure_info& failure() const noexcept { return failure_; }
  /// The configuration.
  const config& settings() const noexcept { return cfg_; }
  /// Whether decide() must be asked before every step (false only in steady state: idle with no
  /// notice, exiting or stopped).
  bool needs_attention() const noexcept {
    return !(state_ == agreement_state::idle || state_ == agreement_state::exiting ||
             state_ == agreement_state::stopped) ||
           !outbox_.empty();
  }
  /// The trigger key the watcher should block on now: claim in idle/noticed, final_claim in grace;
  /// nullopt when no trigger can arrive (the error key is watched in every state).
  std::optional<agreement_key> watch_key() const noexcept {
    switch (state_) {
      case agreement_state::idle:
      case agreement_state::noticed:
        return agreement_key::claim;
      case agreement_state::grace:
      case agreement_state::final_noticed:
        return agreement_key::final_claim;
      default:
        return std::nullopt;
    }
  }

  /// The value this worker writes for `what` ("claim by 2/9f3a", "step 57 by 2/9f3a", ...).
  std::string value_text(agreement_value::kind what, std::int64_t step = -1,
                         std::vector<int> tasks = {}) const {
    agreement_value v;
    v.what = what;
    v.step = step;
    v.tasks = std::move(tasks);
    v.writer = cfg_.task;
    v.nonce = cfg_.nonce;
    return format_agreement_value(v);
  }

  /// The error payload written to the error key: "task\ntype\nmessage".
  static std::string encode_error(int task, const std::string& type_name,
                                  const std::string& message) {
    return std::to_string(task) + "\n" + type_name + "\n" + message;
  }

 private:
  enum class await : unsigned char {
    none,
    claim,                   // insert claim issued
    ack,                     // put ack issued
    collect_pending,         // the claimant's next() waits for the next task's ack
    collect,                 // that wait issued
    insert_step_pending,     // next() issues insert step
    insert_step,             // insert step issued
    wait_step_pending,       // next() issues wait step
    wait_step,               // wait issued
    error_pending,           // next() issues try_get error
    read_error,              // try_get error issued
    timeout_list_pending,    // next() lists the acks after the deadline
    timeout_list,            // list issued
    insert_timeout_pending,  // next() records the timeout (insert into the outcome key)
    insert_timeout,          // insert issued
  };
  using kind = agreement_value::kind;

  // Between a notice or a claim and the round's recorded outcome.
  bool agreeing() const noexcept {
    switch (state_) {
      case agreement_state::noticed:
      case agreement_state::claimed:
      case agreement_state::acked:
      case agreement_state::final_noticed:
      case agreement_state::final_claimed:
      case agreement_state::final_acked:
        return true;
      default:
        return false;
    }
  }

  // A phase (first save or final save) starts: no deadline, nothing being recorded.
  void new_phase() noexcept {
    recording_ = false;
    round_deadline_ = time_point{};
    ack_deadline_ = time_point{};
    missing_.clear();
  }

  void fail_timeout(std::vector<int> missing) {
    failure_ = agreement_failure_info{};
    failure_.kind = agreement_failure::timeout;
    failure_.missing_tasks = std::move(missing);
    failure_.key = step_key();
    failure_.round = round_;
    state_ = agreement_state::failed;
    awaiting_ = await::none;
  }

  bool inert() const noexcept {
    return state_ == agreement_state::failed || state_ == agreement_state::stopped;
  }

  bool is_waiting_for_result() const noexcept {
    switch (awaiting_) {
      case await::claim:
      case await::ack:
      case await::collect:
      case await::insert_step:
      case await::wait_step:
      case await::read_error:
      case await::timeout_list:
      case await::insert_timeout:
        return true;
      default:
        return false;
    }
  }

  static void expect(bool ok, const char* what) {
    if (!ok) throw std::logic_error(std::string("step_agreement: unexpected ") + what);
  }

  int phase() const noexcept {
    switch (state_) {
      case agreement_state::grace:
      case agreement_state::final_noticed:
      case agreement_state::final_claimed:
      case agreement_state::final_acked:
      case agreement_state::final_published:
        return 1;
      default:
        return 0;
    }
  }
  static agreement_state phase_state(int phase, agreement_state first) {
    if (phase == 0) return first;
    switch (first) {
      case agreement_state::claimed:
        return agreement_state::final_claimed;
      case agreement_state::acked:
        return agreement_state::final_acked;
      case agreement_state::step_published:
        return agreement_state::final_published;
      default:
        return first;
    }
  }
  agreement_key claim_key() const {
    return phase() ? agreement_key::final_claim : agreement_key::claim;
  }
  agreement_key ack_key() const { return phase() ? agreement_key::final_ack : agreement_key::ack; }
  agreement_key step_key() const {
    return phase() ? agreement_key::final_step : agreement_key::step;
  }

  instruction make(typename instruction::op o, agreement_key key, int task, std::string value) {
    instruction in;
    in.kind = o;
    in.key = key;
    in.round = round_;
    in.task = task;
    in.value = std::move(value);
    return in;
  }
  static instruction verdict(agreement_action a, std::int64_t step = -1) {
    instruction in;
    in.action = a;
    in.step = step;
    return in;
  }

  instruction next_in_acked(time_point now) {
    switch (awaiting_) {
      case await::collect_pending: {
        if (collect_next_ == cfg_.task) ++collect_next_;  // its own counter is known
        if (collect_next_ >= cfg_.num_tasks) {
          if (missing_.empty()) {
            computed_step_ = collect_max_ + 1;
            awaiting_ = await::insert_step_pending;
          } else {  // some ack never came by the deadline: record the timeout
            recording_ = true;
            awaiting_ = await::insert_timeout_pending;
          }
          return next_in_acked(now);
        }
        awaiting_ = await::collect;
        instruction in = make(instruction::op::wait, ack_key(), collect_next_, {});
        in.deadline = std::max(now, ack_deadline_);
        return in;
      }
      case await::insert_step_pending:
        awaiting_ = await::insert_step;
        return make(instruction::op::insert, step_key(), -1,
                    value_text(kind::step, computed_step_));
      case await::wait_step_pending: {
        awaiting_ = await::wait_step;
        instruction in = make(instruction::op::wait, step_key(), -1, {});
        in.deadline = std::max(now, ack_deadline_);
        return in;
      }
      case await::error_pending:
        awaiting_ = await::read_error;
        return make(instruction::op::try_get, agreement_key::error, -1, {});
      case await::timeout_list_pending:
        awaiting_ = await::timeout_list;
        return make(instruction::op::list, ack_key(), -1, {});
      case await::insert_timeout_pending:
        awaiting_ = await::insert_timeout;
        return make(instruction::op::insert, step_key(), -1,
                    value_text(kind::timeout, -1, missing_));
      default:
        break;
    }
    expect(false, "state in acked");
    return verdict(agreement_action::proceed);
  }

  instruction next_in_published(std::int64_t counter) {
    int p = phase();
    std::int64_t s = step_[p];
    if (counter < s) return verdict(agreement_action::proceed);
    if (p == 0 && cfg_.grace > duration::zero()) {
      state_ = agreement_state::grace;
      my_counter_ = -1;   // the final phase publishes a new one
      claimant_ = false;  // and has a claimant of its own
      new_phase();
      return verdict(agreement_action::save_then_continue, counter);
    }
    if (cfg_.exit_after_save) {
      state_ = agreement_state::exiting;
      return verdict(agreement_action::save_then_exit, counter);
    }
    rearm();
    return verdict(agreement_action::save, counter);
  }

  // The phase's outcome is a step: follow it, and clean up what nobody reads any more. This
  // worker's ack goes (a worker that lists the acks later finds it missing, but its timeout
  // loses the insert to this step and follows it). The worker that recorded the first step of
  // round N also erases round N-1's control keys: every task acked round N, so none still reads
  // round N-1. Each round thus leaves its control keys until the next round's step, and acks not
  // at all: O(N) keys for any number of rounds, erased one key at a time (no prefix delete).
  void publish_step(std::int64_t s, bool recorded_here) {
    int p = phase();
    step_[p] = s;
    state_ = phase_state(p, agreement_state::step_published);
    outbox_.push_back(make(instruction::op::erase, ack_key(), cfg_.task, {}));
    if (recorded_here && p == 0 && round_ > 0)
      for (agreement_key k : {agreement_key::claim, agreement_key::step, agreement_key::final_claim,
                              agreement_key::final_step}) {
        instruction in = make(instruction::op::erase, k, -1, {});
        in.round = round_ - 1;
        outbox_.push_back(std::move(in));
      }
  }

  void fail_with_payload(const std::string& payload) {
    failure_ = agreement_failure_info{};
    failure_.kind = agreement_failure::peer;
    auto a = payload.find('\n');
    auto b = a == std::string::npos ? a : payload.find('\n', a + 1);
    if (a != std::string::npos && b != std::string::npos) {
      failure_.task = static_cast<int>(parse_int(payload.substr(0, a)).value_or(-1));
      failure_.type_name = payload.substr(a + 1, b - a - 1);
      failure_.message = payload.substr(b + 1);
    } else {
      failure_.type_name = "unknown";
      failure_.message = payload.empty() ? "agreement aborted" : payload;
    }
    if (failure_.task == cfg_.task) failure_.kind = agreement_failure::local;
    state_ = agreement_state::failed;
    awaiting_ = await::none;
  }

  // A run counter or task id as written by this protocol: a non-negative decimal, below
  // INT64_MAX (so max + 1 is a step).
  static std::optional<std::int64_t> parse_int(const std::string& s) {
    return detail::parse_agreement_int(s, INT64_MAX - 1);
  }

  config cfg_;
  agreement_state state_ = agreement_state::idle;
  await awaiting_ = await::none;
  std::uint64_t round_ = 0;
  bool claimant_ = false;
  std::optional<time_point> notice_;
  std::optional<time_point> deadline_;
  std::optional<time_point> consumed_notice_;
  time_point now_{};
  time_point ack_deadline_{};    // the ack deadline of this phase (set by on_put)
  time_point round_deadline_{};  // ack_timeout after this worker joined this phase
  bool recording_ = false;       // past the deadline: recording or reading the outcome
  std::vector<int> missing_;     // the tasks a timeout being recorded names
  std::int64_t my_counter_ = -1;
  std::int64_t computed_step_ = -1;
  int collect_next_ = 0;           // the claimant's collection: the next task to read
  std::int64_t collect_max_ = -1;  // the largest counter collected so far
  std::int64_t step_[2] = {-1, -1};
  duration overhead_ = duration::zero();
  agreement_failure_info failure_;
  std::vector<instruction> outbox_;
};

/// The step agreement on the steady clock.
using step_agreement = basic_step_agreement<>;
/// Its configuration.
using agreement_config = step_agreement::config;

HOLDFAST_NAMESPACE_END
