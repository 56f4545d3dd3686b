// holdfast/agreement.hpp — step agreement: a pure state machine that decides, before each training
// step, whether to go on, checkpoint, or checkpoint and exit, so that every worker of a job
// checkpoints at one agreed step after any of them is told its machine is going away.
//
// The machine does no I/O, starts no thread and reads no clock. It is driven from two sides
// (preemption_handler in handler.hpp, or a test), one at a time (the handler holds a mutex):
//   - the watcher (a background thread) feeds events — this worker's notice, what it saw in the
//     coordination store — and asks `protocol_next(counter, now)` for the next store operation
//     (insert, put, try_get, wait, list), performs it and reports the result. The watcher, not
//     the training thread, claims, acks, lists the acks and publishes the step, so a worker
//     blocked inside a step (a collective waiting for a peer) still takes part.
//   - the training thread asks `decide(counter, now, mean_step)` before each step: proceed,
//     wait (the step is not known yet), save, save then exit, save then continue through the
//     grace period, or fail.
// All protocol logic lives here; the drivers only map key ids to strings and call the store.
//
// Protocol of one round (keys relative to the run scope, see agreement_key_name):
//   r<N>/claim          insert-once by the first noticed worker (value: its task id)
//   r<N>/ack/<task>     every worker's watcher, once it knows of the claim, raises its training
//                       thread's attention and puts the run counter read in the same atomic
//                       operation (so the training thread stops at the next boundary at most)
//   r<N>/step           the worker whose list of ack/ shows every task inserts max(counters) + 1
//                       (XLA's rule: any skew is tolerated; no worker is past its published
//                       counter + 1 <= the step)
//   r<N>/final, r<N>/final_ack/<task>, r<N>/final_step
//                       the same three keys for the second save of the grace path
//   error               insert-once by a worker whose step threw ("task\ntype\nmessage");
//                       it also inserts "abort" into the step and claim keys of its round and
//                       the next, so peers blocked on any of them wake up and read the error
//
// Transitions (W: watcher side, protocol_next / results; T: training side, decide). The final
// phase (final_noticed, final_claimed, final_acked, final_published) mirrors the first.
//
//   state          | event or answer                                  | next state
//   ---------------+--------------------------------------------------+------------------------
//   idle           | on_notice (a new one)                            | noticed
//   idle           | on_claim_seen(round)                             | claimed (follower)
//   idle           | T: proceed                                       | idle
//   noticed        | W: insert claim = task                           | (awaiting result)
//   noticed        | on_insert(true)                                  | claimed (claimant)
//   noticed        | on_insert(false), or on_claim_seen first         | claimed (follower)
//   claimed        | W: put ack/<task> = counter                      | (awaiting result)
//   claimed        | on_put                                           | acked, deadline set
//   acked          | W: list ack/                                     | (awaiting result)
//   acked          | on_list, every task present                      | W: insert step = max + 1
//   acked          | on_insert(step) true                             | step_published
//   acked          | on_insert(step) false, or list incomplete        | W: wait step (deadline)
//   acked          | on_value(step = S)                               | step_published (S)
//   acked          | on_value("abort")                                | W: try_get error
//   acked          | on_value(error payload)                          | failed (peer)
//   acked          | on_value(nullopt): the deadline passed           | W: list ack/ again
//   acked          | on_list after the deadline, tasks missing        | failed (timeout)
//   noticed..acked | T: counter <= published counter (or none yet)    | proceed
//   noticed..acked | T: counter > published counter                   | wait
//   step_published | T: counter < S                                   | proceed
//   step_published | T: counter >= S, grace > 0                       | save_then_continue, grace
//   step_published | T: counter >= S, no grace, exits                 | save_then_exit, exiting
//   step_published | T: counter >= S, no grace, no exit               | save, idle (round + 1)
//   grace          | T: noticed here, now > end - 6 mean - 2 overhead | final_noticed, proceed
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
// first agreement and save took, reserved twice so the second one also fits with a margin. Only
// a worker that was noticed itself computes it (clocks of different machines are never compared).
//
// Guarantees:
//   - Exactly one claim per round (insert-once), one agreed step per phase: every worker that
//     lists a complete ack set computes the same max + 1, and insert-once keeps the first.
//   - No worker passes the agreed step: it is above every published counter, and decide()
//     answers wait once the counter passed this worker's published one, until the step is known.
//   - Constant store traffic per worker per agreement, independent of the number of workers:
//     claim insert (noticed workers), one put, one list, at most one insert and one wait.
//   - No unbounded wait: the only blocking instruction (wait) carries the deadline
//     `acked time + ack_timeout`; past it the machine lists the acks and fails with the missing
//     task ids (holdfast::agreement_timeout in the handler).
//   - Re-armable: after a save without exit (or rearm()), the next round uses fresh keys.
// Caveats:
//   - If every noticed worker dies during the grace countdown, nobody publishes the final step
//     and the survivors train on until the scheduler kills them.
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
  claim,        ///< r<N>/claim
  ack,          ///< r<N>/ack/<task> (a list instruction names the prefix r<N>/ack/)
  step,         ///< r<N>/step
  final_claim,  ///< r<N>/final
  final_ack,    ///< r<N>/final_ack/<task>
  final_step,   ///< r<N>/final_step
  error,        ///< error (one per run)
};

/// The full key for `k` in round `round` under `scope` (which ends with '/'); task -1 names the
/// ack prefix (ending with '/').
inline std::string agreement_key_name(std::string_view scope, agreement_key k, std::uint64_t round,
                                      int task = -1) {
  std::string s(scope);
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
      s += k == agreement_key::ack ? "ack/" : "final_ack/";
      return task < 0 ? s : s + std::to_string(task);
    case agreement_key::error:
      break;
  }
  return s;
}

/// Why the machine failed.
enum class agreement_failure : unsigned char {
  none,     ///< not failed
  peer,     ///< another task's step threw (peer_task, type_name, message)
  local,    ///< this task's step threw; the driver re-throws its own exception
  timeout,  ///< not every task acked before the deadline (missing_tasks)
};

/// What failed, for the driver to raise.
struct agreement_failure_info {
  agreement_failure kind = agreement_failure::none;
  int task = -1;                           ///< peer or local: the task whose step threw
  std::string type_name;                   ///< peer or local: the exception's type name
  std::string message;                     ///< peer or local: its what()
  std::vector<int> missing_tasks;          ///< timeout: tasks with no ack
  agreement_key key = agreement_key::ack;  ///< timeout: the ack prefix that was waited on
  std::uint64_t round = 0;                 ///< timeout: its round
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
    enum class op : unsigned char { decide, insert, put, try_get, wait, list };
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
        instruction in = make(instruction::op::insert, k, -1, std::string(abort_value));
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
        publish_step(computed_step_);
      else
        awaiting_ = await::wait_step_pending;
    } else {
      expect(false, "insert result");
    }
  }

  /// Result of a put instruction.
  void on_put() {
    if (inert()) return;
    expect(awaiting_ == await::ack, "put");
    awaiting_ = await::list_pending;
    ack_deadline_ = now_ + cfg_.ack_timeout;
    state_ = phase_state(phase(), agreement_state::acked);
  }

  /// Result of a try_get or wait instruction: the value, or nullopt (absent / deadline passed).
  void on_value(const std::optional<std::string>& value) {
    if (inert()) return;
    if (awaiting_ == await::wait_step) {
      awaiting_ = await::none;
      if (!value) {
        awaiting_ = await::timeout_list_pending;
      } else if (*value == abort_value) {
        awaiting_ = await::error_pending;
      } else if (auto s = parse_int(*value)) {
        publish_step(*s);
      } else {
        fail_with_payload(*value);  // a malformed step value is treated as a peer's error
      }
    } else if (awaiting_ == await::read_error) {
      awaiting_ = await::none;
      fail_with_payload(value.value_or(std::string()));
    } else {
      expect(false, "value result");
    }
  }

  /// Result of a list instruction: the (key, value) pairs under the ack prefix.
  void on_list(const std::vector<std::pair<std::string, std::string>>& entries) {
    if (inert()) return;
    expect(awaiting_ == await::list || awaiting_ == await::timeout_list, "list");
    bool after_deadline = awaiting_ == await::timeout_list;
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
    } else if (after_deadline) {
      failure_ = agreement_failure_info{};
      failure_.kind = agreement_failure::timeout;
      failure_.missing_tasks = std::move(missing);
      failure_.key = phase() == 0 ? agreement_key::ack : agreement_key::final_ack;
      failure_.round = round_;
      state_ = agreement_state::failed;
    } else {
      awaiting_ = await::wait_step_pending;
    }
  }

  // ---- the two questions: the watcher's and the training thread's ---------------------------

  /// The watcher's question: the next store operation of the protocol, or a decide instruction
  /// (action proceed) when there is none now. `counter` is the run counter the watcher read at
  /// the moment it raised the training thread's attention (see wants_counter()): the ack carries
  /// it. Each store instruction's result must be reported (on_insert, on_put, on_value, on_list)
  /// before asking again.
  instruction protocol_next(std::int64_t counter, time_point now) {
    now_ = now;
    if (!outbox_.empty()) {
      instruction in = std::move(outbox_.front());
      outbox_.erase(outbox_.begin());
      return in;
    }
    expect(!is_waiting_for_result(), "protocol_next() before the previous result");
    switch (state_) {
      case agreement_state::noticed:
      case agreement_state::final_noticed:
        awaiting_ = await::claim;
        return make(instruction::op::insert, claim_key(), -1, std::to_string(cfg_.task));
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
    switch (state_) {
      case agreement_state::idle:
      case agreement_state::exiting:
      case agreement_state::stopped:
        return verdict(agreement_action::proceed);
      case agreement_state::failed:
        return verdict(agreement_action::fail);
      case agreement_state::noticed:
      case agreement_state::claimed:
      case agreement_state::acked:
      case agreement_state::final_noticed:
      case agreement_state::final_claimed:
      case agreement_state::final_acked:
        if (my_counter_ >= 0 && counter > my_counter_) return verdict(agreement_action::wait);
        return verdict(agreement_action::proceed);
      case agreement_state::step_published:
      case agreement_state::final_published:
        return next_in_published(counter);
      case agreement_state::grace: {
        if (notice_) {
          time_point end = *notice_ + cfg_.grace;
          if (deadline_ && *deadline_ < end) end = *deadline_;
          if (now > end - 6 * mean_step - 2 * overhead_) state_ = agreement_state::final_noticed;
        }
        return verdict(agreement_action::proceed);
      }
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

  /// The error payload written to the error key: "task\ntype\nmessage".
  static std::string encode_error(int task, const std::string& type_name,
                                  const std::string& message) {
    return std::to_string(task) + "\n" + type_name + "\n" + message;
  }

  /// The value inserted into step keys to abort waits after an error.
  static constexpr std::string_view abort_value = "abort";

 private:
  enum class await : unsigned char {
    none,
    claim,                // insert claim issued
    ack,                  // put ack issued
    list_pending,         // next() issues list
    list,                 // list issued
    insert_step_pending,  // next() issues insert step
    insert_step,          // insert step issued
    wait_step_pending,    // next() issues wait step
    wait_step,            // wait issued
    error_pending,        // next() issues try_get error
    read_error,           // try_get error issued
    timeout_list_pending,
    timeout_list,
  };

  bool inert() const noexcept {
    return state_ == agreement_state::failed || state_ == agreement_state::stopped;
  }

  bool is_waiting_for_result() const noexcept {
    switch (awaiting_) {
      case await::claim:
      case await::ack:
      case await::list:
      case await::insert_step:
      case await::wait_step:
      case await::read_error:
      case await::timeout_list:
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

  instruction make(typename instruction::op kind, agreement_key key, int task, std::string value) {
    instruction in;
    in.kind = kind;
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
      case await::list_pending:
        awaiting_ = await::list;
        return make(instruction::op::list, ack_key(), -1, {});
      case await::insert_step_pending:
        awaiting_ = await::insert_step;
        return make(instruction::op::insert, step_key(), -1, std::to_string(computed_step_));
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
      my_counter_ = -1;  // the final phase publishes a new one
      return verdict(agreement_action::save_then_continue, counter);
    }
    if (cfg_.exit_after_save) {
      state_ = agreement_state::exiting;
      return verdict(agreement_action::save_then_exit, counter);
    }
    rearm();
    return verdict(agreement_action::save, counter);
  }

  void publish_step(std::int64_t s) {
    int p = phase();
    step_[p] = s;
    state_ = phase_state(p, agreement_state::step_published);
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

  static std::optional<std::int64_t> parse_int(const std::string& s) {
    if (s.empty() || s.size() > 19) return std::nullopt;
    std::size_t i = s[0] == '-' ? 1 : 0;
    if (i == s.size()) return std::nullopt;
    std::int64_t v = 0;
    for (; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      v = v * 10 + (s[i] - '0');
    }
    return s[0] == '-' ? -v : v;
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
  time_point ack_deadline_{};
  std::int64_t my_counter_ = -1;
  std::int64_t computed_step_ = -1;
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
