// holdfast/agreement/keys.hpp — the keys of the step agreement (agreement_key) and their names
// under a run scope: the control keys every worker watches (ctl/) and the acks apart from them.
//
// Protocol of one round (keys relative to the run scope, see agreement_key_name; values in the
// one grammar of agreement_value: "<body> by <task>/<nonce>", so every value names its writer).
// Control keys live under ctl/, which every worker watches; acks live apart, read by one worker:
//   ctl/r<N>/claim      insert-once by the first noticed worker ("claim by 2/9f3a"): the CLAIMANT
//   ack/r<N>/<task>     every worker's watcher, once it knows of the claim, raises its training
//                       thread's attention and puts the run counter read in the same atomic
//                       operation (so the training thread stops at the next boundary at most)
//   ctl/r<N>/step       the round's OUTCOME, recorded once (insert-once): the claimant reads the
//                       N - 1 other acks (the machine asks one by one, a wait each, until its
//                       deadline; the watcher answers from a watch or batched reads) and
//                       inserts "step <max(counters) + 1>" (XLA's rule: any skew is tolerated; no
//                       worker is past its published counter + 1 <= the step), or "timeout
//                       <missing tasks>" when some ack never came; every other worker waits on
//                       this key alone until its deadline, then lists the acks (or reads each)
//                       and records the step or the timeout itself; whoever loses the race
//                       reads and follows the key
//   ctl/r<N>/final, final_ack/r<N>/<task>, ctl/r<N>/final_step
//                       the same three keys for the second save of the grace path
//   ctl/hang            insert-once: a hang verdict that fails no round (handler/hang.hpp); a
//                       verdict during a round is recorded into its outcome key, and one that
//                       ends the job (the restart policy) into the claim key all idle workers
//                       wait on
//   ctl/save/<k>        insert-once by task 0: the k-th periodic save (k = 1, 2, ... per run id),
//                       "save <step>": every task saves at that step (handler_options::
//                       periodic_saves); each task reports it under saved/<task> ("saved <step>
//                       <cost>", put over the previous report), and task 0 erases ctl/save/<k>
//                       once every task reported k or later: O(1) keys for any number of saves
//   ctl/error           insert-once by a worker whose step threw ("task\ntype\nmessage");
//                       it also inserts "abort" into the outcome and claim keys of its round
//                       and the next, so peers blocked on any of them wake up and read the error
// Cleanup (erase instructions, best effort): once a phase's outcome is a step, each worker
// erases its own ack; the worker that recorded round N's first step erases round N-1's control
// keys (every task acked round N, so none reads round N-1 any more). Any number of rounds
// leaves one round's control keys and no acks, with single-key erases (no prefix delete).
//
// Guarantees:
//   - agreement_key_name is the one place a key's name is spelled; control keys share the
//     prefix agreement_control_prefix(scope), acks never do.
//   - The round is the segment before a key's last (ctl/r<N>/step, ack/r<N>/<task>): a store
//     that groups keys by the prefix before it (filesystem_kv's directories) keeps every
//     round's control keys together and every round's acks together, so a round makes no new
//     group there.
// Caveats:
//   - `scope` must end with '/' (the handler's is "holdfast/<run_id>/"); nothing here checks it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

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

/// The hang verdict key under `scope`: "<scope>ctl/hang", insert-once, where a verdict that
/// fails no round is recorded (handler/hang.hpp; a verdict during a round goes to its outcome
/// key instead).
inline std::string hang_key_name(std::string_view scope) {
  return agreement_control_prefix(scope) + "/hang";
}

/// The k-th periodic save's decision under `scope`: "<scope>ctl/save/<k>" (insert-once by task
/// 0; the control watch brings it to every task).
inline std::string periodic_save_key_name(std::string_view scope, std::uint64_t k) {
  return agreement_control_prefix(scope) + "/save/" + std::to_string(k);
}

/// Where `task` reports its periodic saves: "<scope>saved/<task>" (outside ctl/, read by task 0
/// alone, as acks are).
inline std::string periodic_report_key_name(std::string_view scope, int task) {
  return std::string(scope) + "saved/" + std::to_string(task);
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

HOLDFAST_NAMESPACE_END
