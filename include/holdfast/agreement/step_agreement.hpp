// holdfast/agreement/step_agreement.hpp — step agreement: a pure state machine that decides,
// before each training step, whether to go on, checkpoint, or checkpoint and exit, so that every
// worker of a job checkpoints at one agreed step after any of them is told its machine is going
// away.
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
// The keys and one round's protocol: keys.hpp; the values written: value.hpp.
//
// Transitions (W: watcher side, protocol_next / results; T: training side, decide). The final
// phase (final_noticed, final_claimed, final_acked, final_published) mirrors the first.
// Within a state the machine holds at most one protocol operation, its sub-state (sub_state in
// the code: a protocol_op and an `issued` flag): a row "W: <op>" issues it (issued(op): the
// driver holds it, "(awaiting result)", and its result is the next event); a row whose next
// state names "W: <op>" leaves it pending (pending(op): the next protocol_next() issues it).
// The operations: claim (insert claim), ack (put ack), collect (wait ack/<t>), insert_step,
// wait_step (wait step), read_error (try_get error), timeout_list (list ack/), insert_timeout
// (insert step "timeout M").
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
//   acked          | on_value("hang ... by ...")                      | failed (hang)
//   acked          | on_value(error payload)                          | failed (peer)
//   acked          | on_value(another text)                           | failed (peer, malformed)
//   acked          | on_value(nullopt): the deadline passed           | recording: W: list ack/
//   acked          | on_list after the deadline, every task present   | W: insert step S = max+1
//   acked          | on_list after the deadline, tasks M missing      | W: insert step "timeout M"
//   acked          | on_insert(timeout) true                          | failed (timeout, M)
//   acked          | on_insert(timeout) false                         | W: wait step: follow it
//   noticed        | on_store_failure (retries ran out), not recording| recording: W: insert
//                  |                                                  | claim
//   acked, recording| on_insert(claim), true or false                 | W: list ack/
//   claimed, acked | on_store_failure (retries ran out), not recording| recording: W: list ack/
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
//   any            | on_hang_seen(value): a verdict recorded          | failed (hang)
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
//   - Exactly one claim per round (insert-once) and one recorded outcome per phase, never an
//     outcome without its claim (a noticed worker whose claim insert failed until the deadline
//     inserts the claim again before it records, so the idle workers, who watch the claim key,
//     join the round and find the outcome); every worker that acts follows it: all save at the
//     recorded step, or all fail with the recorded timeout naming the same missing tasks (a worker
//     stopped past the deadline that resumes finds the recorded timeout and fails with it). No
//     worker saves at a step the outcome key does not hold, and none fails with a timeout while it
//     holds a step.
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
//   - agreement_under_way(state) is true from a notice or a claim until the round's outcome is
//     known (or it failed): an outcome comes within the round's deadline plus one ack_timeout.
// Caveats:
//   - If every noticed worker dies during the grace countdown, nobody publishes the final step
//     and the survivors train on until the scheduler kills them.
//   - A noticed worker that cannot insert its claim before its deadline inserts it while
//     recording, then lists the acks: it never acked, so the timeout it records names itself
//     (and whoever had not acked by then), though it is alive; every worker follows that one
//     decision. Only a worker that cannot insert the claim even while recording fails alone
//     (unreachable), its peers training on until their next collective with it fails.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../version.hpp"
#include "keys.hpp"
#include "value.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The states of step_agreement (see the transition table at the top of this header).
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

/// Whether `s` is between a notice or a claim and the round's recorded outcome: the agreement is
/// under way and ends (an outcome known, or a failure) within the round's deadline plus one
/// ack_timeout. A training step that waits for its peers can wait that long rather than time out
/// on its own first (examples/preemptible_training.cpp).
constexpr bool agreement_under_way(agreement_state s) noexcept {
  switch (s) {
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

/// A verdict for one step.
enum class agreement_action : unsigned char {
  proceed,             ///< run the step
  wait,                ///< do not run it yet: the agreed step is not known (block until it is)
  save,                ///< checkpoint at this step, then return to the caller (no exit; re-armed)
  save_then_exit,      ///< checkpoint at this step, then exit through the Exit policy
  save_then_continue,  ///< first save of the grace path: checkpoint, then keep training
  fail,                ///< raise the failure described by step_agreement::failure()
};

/// Why the machine failed.
enum class agreement_failure : unsigned char {
  none,         ///< not failed
  peer,         ///< another task's step threw (peer_task, type_name, message)
  local,        ///< this task's step threw; the driver re-throws its own exception
  timeout,      ///< the recorded outcome is a timeout (missing_tasks: the recorded list)
  unreachable,  ///< the store could not be reached to read or record the outcome (message)
  hang,         ///< a hang verdict was recorded (task: the hung task; message: the value text)
};

/// What failed, for the driver to raise.
struct agreement_failure_info {
  agreement_failure kind = agreement_failure::none;
  int task = -1;                            ///< peer or local: the task whose step threw
  std::string type_name;                    ///< peer or local: the exception's type name
  std::string message;                      ///< peer or local: its what(); unreachable: why
  int errnum = 0;                           ///< unreachable: the store error's errno (0: none)
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
        (state_ == agreement_state::noticed && awaiting_ == nothing_awaited()))
      state_ = agreement_state::claimed;
  }

  /// The watcher saw the final-claim key of `round`.
  void on_final_seen(std::uint64_t round) {
    if (round != round_) return;
    if (state_ == agreement_state::grace ||
        (state_ == agreement_state::final_noticed && awaiting_ == nothing_awaited()))
      state_ = agreement_state::final_claimed;
  }

  /// The watcher (or a wait) saw the error key with `payload` ("task\ntype\nmessage").
  void on_error_seen(const std::string& payload) {
    if (state_ == agreement_state::stopped || state_ == agreement_state::failed) return;
    fail_with_payload(payload);
  }

  /// A hang verdict (a "hang" value, agreement/value.hpp) was recorded for this job, in a claim
  /// key, an outcome key or read back by a lost insert: the machine fails with kind hang (task:
  /// the hung task; message: the value's text). Sticky like any failure; ignored once failed.
  void on_hang_seen(const std::string& value) {
    if (inert()) return;
    auto v = parse_agreement_value(value);
    failure_ = agreement_failure_info{};
    failure_.kind = agreement_failure::hang;
    failure_.task = v && v->tasks.size() == 1 ? v->tasks[0] : -1;
    failure_.message = value;
    failure_.key = step_key();
    failure_.round = round_;
    state_ = agreement_state::failed;
    awaiting_ = nothing_awaited();
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
    awaiting_ = nothing_awaited();
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
  void on_store_failure(const std::string& why, int errnum = 0) {
    if (inert()) return;
    outbox_.clear();
    if (recording_ || !agreeing()) {
      failure_ = agreement_failure_info{};
      failure_.kind = agreement_failure::unreachable;
      failure_.message = why;
      failure_.errnum = errnum;
      failure_.key = step_key();
      failure_.round = round_;
      state_ = agreement_state::failed;
      awaiting_ = nothing_awaited();
      return;
    }
    recording_ = true;
    if (ack_deadline_ == time_point{}) ack_deadline_ = round_deadline_;
    // A noticed worker does not know whether its claim exists: it makes sure it does first, or
    // an outcome recorded without it would go unseen by the idle workers (they watch the claim).
    const bool claim_unknown =
        state_ == agreement_state::noticed || state_ == agreement_state::final_noticed;
    state_ = phase_state(phase(), agreement_state::acked);
    awaiting_ = pending(claim_unknown ? protocol_op::claim : protocol_op::timeout_list);
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
    awaiting_ = nothing_awaited();
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
    awaiting_ = nothing_awaited();
    claimant_ = false;
    my_counter_ = -1;
    step_[0] = step_[1] = -1;
    new_phase();
  }

  // ---- results of store instructions --------------------------------------------------------

  /// Result of an insert instruction: true when this worker created the key.
  void on_insert(bool created) {
    if (inert()) return;
    if (awaiting_ == issued(protocol_op::claim)) {
      awaiting_ = nothing_awaited();
      claimant_ = created || claimant_;
      if (recording_)  // the claim made sure of while recording: now the acks, then the outcome
        awaiting_ = pending(protocol_op::timeout_list);
      else
        state_ = phase_state(phase(), agreement_state::claimed);
    } else if (awaiting_ == issued(protocol_op::insert_step)) {
      awaiting_ = nothing_awaited();
      if (created)
        publish_step(computed_step_, true);
      else
        awaiting_ = pending(protocol_op::wait_step);  // another outcome is recorded: read it
    } else if (awaiting_ == issued(protocol_op::insert_timeout)) {
      awaiting_ = nothing_awaited();
      if (created)
        fail_timeout(std::move(missing_));
      else
        awaiting_ = pending(protocol_op::wait_step);  // a step or another timeout won: follow it
    } else {
      expect(false, "insert result");
    }
  }

  /// Result of a put instruction.
  void on_put() {
    if (inert()) return;
    expect(awaiting_ == issued(protocol_op::ack), "put");
    // The claimant collects the acks (O(N) reads in all); every other worker waits on the
    // outcome key alone.
    awaiting_ = claimant_ ? pending(protocol_op::collect) : pending(protocol_op::wait_step);
    collect_next_ = 0;
    collect_max_ = my_counter_;
    missing_.clear();
    ack_deadline_ = now_ + cfg_.ack_timeout;
    state_ = phase_state(phase(), agreement_state::acked);
  }

  /// Result of a try_get or wait instruction: the value, or nullopt (absent / deadline passed).
  void on_value(const std::optional<std::string>& value) {
    if (inert()) return;
    if (awaiting_ == issued(protocol_op::collect)) {  // the claimant's wait for one task's ack
      awaiting_ = pending(protocol_op::collect);
      auto c = value ? parse_int(*value) : std::nullopt;
      if (c)
        collect_max_ = std::max(collect_max_, *c);
      else  // absent at the deadline, or not a counter
        missing_.push_back(collect_next_);
      ++collect_next_;
    } else if (awaiting_ == issued(protocol_op::wait_step)) {
      awaiting_ = nothing_awaited();
      if (!value) {  // the deadline passed: record a timeout unless every ack is there now
        recording_ = true;
        awaiting_ = pending(protocol_op::timeout_list);
        return;
      }
      auto v = parse_agreement_value(*value);
      if (v && v->what == kind::step) {
        publish_step(v->step, false);
      } else if (v && v->what == kind::timeout) {
        fail_timeout(std::move(v->tasks));
      } else if (v && v->what == kind::abort) {
        awaiting_ = pending(protocol_op::read_error);
      } else if (v && v->what == kind::hang) {
        on_hang_seen(*value);
      } else {  // not the grammar: nobody can follow it; fail as a peer error naming it
        fail_with_payload(
            encode_error(-1, "holdfast::format_error", "malformed outcome '" + *value + "'"));
      }
    } else if (awaiting_ == issued(protocol_op::read_error)) {
      awaiting_ = nothing_awaited();
      fail_with_payload(value.value_or(std::string()));
    } else {
      expect(false, "value result");
    }
  }

  /// The driver saw this phase's outcome key hold `value` while it waited for an ack (a wait
  /// instruction of the claimant's collection), and abandoned that wait: the machine follows
  /// the value as if its own wait on the outcome key had returned it. Ignored otherwise.
  void on_outcome_seen(const std::string& value) {
    if (inert() || awaiting_ != issued(protocol_op::collect)) return;
    awaiting_ = issued(protocol_op::wait_step);
    on_value(value);
  }

  /// True when the outstanding instruction is a wait for an ack (the claimant's collection):
  /// the driver should also watch the outcome key (outcome_key()) and report it with
  /// on_outcome_seen, so a recorded outcome or an abort is not held up until the deadline.
  bool collecting() const noexcept { return awaiting_ == issued(protocol_op::collect); }

  /// The outcome key of the current phase (step, or final_step in the grace path).
  agreement_key outcome_key() const noexcept { return step_key(); }

  /// Result of a list instruction: the (key, value) pairs under the ack prefix.
  void on_list(const std::vector<std::pair<std::string, std::string>>& entries) {
    if (inert()) return;
    expect(awaiting_ == issued(protocol_op::timeout_list), "list");
    awaiting_ = nothing_awaited();
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
      awaiting_ = pending(protocol_op::insert_step);
    } else {  // record the timeout; whoever loses the race follows the key
      missing_ = std::move(missing);
      awaiting_ = pending(protocol_op::insert_timeout);
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
        awaiting_ = issued(protocol_op::claim);
        return make(instruction::op::insert, claim_key(), -1, value_text(kind::claim));
      case agreement_state::claimed:
      case agreement_state::final_claimed:
        awaiting_ = issued(protocol_op::ack);
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
           awaiting_ == nothing_awaited() && outbox_.empty();
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
  // The sub-state of a state: the store operation of the protocol the machine is in the middle
  // of (the transition table's "W: <op>"), and whether it is issued (the driver holds it:
  // "(awaiting result)", its result is the next event) or pending (the next protocol_next() issues
  // it). ack is only ever issued (protocol_next() issues it from claimed); claim is issued from
  // noticed, and is pending only while recording (the claim made sure of first).
  enum class protocol_op : unsigned char {
    none,            // nothing issued, nothing pending
    claim,           // insert claim
    ack,             // put ack/<task>
    collect,         // the claimant's wait for the next task's ack
    insert_step,     // insert step S into the outcome key
    wait_step,       // wait on the outcome key
    read_error,      // try_get the error key (the outcome was an abort)
    timeout_list,    // list the acks after the deadline
    insert_timeout,  // insert "timeout M" into the outcome key
  };
  struct sub_state {
    protocol_op op = protocol_op::none;
    bool issued = false;  // false: pending
    friend constexpr bool operator==(sub_state a, sub_state b) noexcept {
      return a.op == b.op && a.issued == b.issued;
    }
    friend constexpr bool operator!=(sub_state a, sub_state b) noexcept { return !(a == b); }
  };
  static constexpr sub_state nothing_awaited() noexcept { return {}; }
  static constexpr sub_state pending(protocol_op o) noexcept { return {o, false}; }
  static constexpr sub_state issued(protocol_op o) noexcept { return {o, true}; }
  using kind = agreement_value::kind;

  // Between a notice or a claim and the round's recorded outcome.
  bool agreeing() const noexcept { return agreement_under_way(state_); }

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
    awaiting_ = nothing_awaited();
  }

  bool inert() const noexcept {
    return state_ == agreement_state::failed || state_ == agreement_state::stopped;
  }

  bool is_waiting_for_result() const noexcept { return awaiting_.issued; }

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
    if (awaiting_.issued) expect(false, "state in acked");  // protocol_next() checked it
    switch (awaiting_.op) {
      case protocol_op::collect: {
        if (collect_next_ == cfg_.task) ++collect_next_;  // its own counter is known
        if (collect_next_ >= cfg_.num_tasks) {
          if (missing_.empty()) {
            computed_step_ = collect_max_ + 1;
            awaiting_ = pending(protocol_op::insert_step);
          } else {  // some ack never came by the deadline: record the timeout
            recording_ = true;
            awaiting_ = pending(protocol_op::insert_timeout);
          }
          return next_in_acked(now);
        }
        awaiting_ = issued(protocol_op::collect);
        instruction in = make(instruction::op::wait, ack_key(), collect_next_, {});
        in.deadline = std::max(now, ack_deadline_);
        return in;
      }
      case protocol_op::insert_step:
        awaiting_ = issued(protocol_op::insert_step);
        return make(instruction::op::insert, step_key(), -1,
                    value_text(kind::step, computed_step_));
      case protocol_op::wait_step: {
        awaiting_ = issued(protocol_op::wait_step);
        instruction in = make(instruction::op::wait, step_key(), -1, {});
        in.deadline = std::max(now, ack_deadline_);
        return in;
      }
      case protocol_op::read_error:
        awaiting_ = issued(protocol_op::read_error);
        return make(instruction::op::try_get, agreement_key::error, -1, {});
      case protocol_op::claim:  // recording, the claim never confirmed: insert it first
        awaiting_ = issued(protocol_op::claim);
        return make(instruction::op::insert, claim_key(), -1, value_text(kind::claim));
      case protocol_op::timeout_list:
        awaiting_ = issued(protocol_op::timeout_list);
        return make(instruction::op::list, ack_key(), -1, {});
      case protocol_op::insert_timeout:
        awaiting_ = issued(protocol_op::insert_timeout);
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
    awaiting_ = nothing_awaited();
  }

  // A run counter or task id as written by this protocol: a non-negative decimal, below
  // INT64_MAX (so max + 1 is a step).
  static std::optional<std::int64_t> parse_int(const std::string& s) {
    return detail::parse_agreement_int(s, INT64_MAX - 1);
  }

  config cfg_;
  agreement_state state_ = agreement_state::idle;
  sub_state awaiting_;  // the sub-state: the protocol operation issued or pending
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
