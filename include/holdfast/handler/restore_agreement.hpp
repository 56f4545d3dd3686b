// holdfast/handler/restore_agreement.hpp — the start-up restore agreement: before the first
// step every task restores the same checkpoint, the newest one all of them hold with the same
// identity (step and history).
//
// Guarantees:
//   - With a Checkpointer that has all_steps() and restore_step() (has_step_restore_v;
//     checkpoint_manager does) and handler_options::agree_on_restore (on by default): each task
//     puts the checkpoints it holds under restore/have/<task> (an identity list, step_list.hpp),
//     reads every task's list (waiting at most ack_timeout), and proposes the newest step all of
//     them hold with the same identity; insert-once on restore/step records the first proposal
//     and every task restores exactly that step (and pins it, when the Checkpointer has pin(),
//     so retention keeps it until a newer common step is known).
//   - Histories: a Checkpointer with all_identities() and begin_history() (has_identity_v;
//     checkpoint_manager does) lists each step with the history it was saved in, and after the
//     agreement begins a new history, the recorded outcome's nonce (one per launch, the same on
//     every task), which its saves then record. So two checkpoints of one step saved in
//     different launches (a save that failed on some tasks, then was redone after restoring an
//     older step) are never taken for one: the agreement picks an older step they share, or
//     none. Steps of unknown history (older checkpoints, or a Checkpointer without those
//     members) match by step only where every task's is unknown.
//   - Stale keys: before it writes, each task reads its own restore/have/<task>, restore/step,
//     ctl/r0/claim, ctl/r0/step and ctl/error. None of them can exist yet in this launch (no
//     task passes the agreement without this task's list), so a value there was written by an
//     earlier launch under the same run id and incarnation: construction throws holdfast::error
//     (EEXIST) naming the key and the run id and incarnation, rather than following it. (A
//     restore/step holding a timeout may be this launch's, this task having started late: it
//     throws agreement_timeout, as following it would.)
//   - A task that never starts makes the agreement throw agreement_timeout naming it, on every
//     task; a store that cannot be reached to record or read the outcome throws
//     agreement_unreachable; a list or an outcome that is not the grammar throws format_error.
//   - A checkpoint of this task that does not count (damaged metadata, a recorded file gone, an
//     empty hand-made directory: checkpoint/listing.hpp) is not in its list, named once in the
//     log, and never fails the start: the agreement picks the newest step every task holds.
//   - Without those members each task restores its own latest checkpoint (weaker: a worker whose
//     last save failed resumes from an older step than its peers).
// Caveats:
//   - Stale keys are detected by the restore agreement only (not without it), and by task: a task
//     id the earlier launch did not have finds only the shared keys (restore/step, ctl/); each
//     launch needs a fresh incarnation (take_incarnation).
//   - The keys live in the kv namespace (run id + incarnation): a restart with a different
//     number of tasks agrees among the new tasks only, each reading its own task's checkpoint
//     directory; a task id that did not exist before holds nothing, so the common step is none
//     and every task starts fresh unless the checkpoints are shared (one writer).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../agreement.hpp"  // agreement_value, identity lists, newest_common_identity
#include "../error.hpp"      // agreement_timeout, agreement_unreachable, format_error
#include "../kv.hpp"         // is_transient_kv_error
#include "../version.hpp"
#include "options.hpp"
#include "store_retry.hpp"
#include "traits.hpp"  // has_step_restore_v, has_identity_v, ckpt_pin

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Who takes part in a restore agreement, where its keys live, and how values are signed.
template <class Clock>
struct restore_party {
  const cluster_info& cluster;
  const std::string& scope;                   // "holdfast/<run_id>/"
  const handler_options& options;             // ack_timeout, agree_on_restore
  const basic_step_agreement<Clock>& writer;  // value_text: "... by <task>/<nonce>"
  const store_retry<Clock>& store;            // retries and exactly-once inserts
};

// Restores `checkpoints` to the step every task follows (its outcome key's text's step).
template <class Clock, class Checkpointer>
std::optional<std::int64_t> follow_restore(Checkpointer& checkpoints, const agreement_value& v,
                                           const std::string& key) {
  std::optional<std::int64_t> step;
  switch (v.what) {
    case agreement_value::kind::step:
      checkpoints.restore_step(v.step);
      step = v.step;
      break;
    case agreement_value::kind::none:
      break;
    case agreement_value::kind::timeout:
      throw agreement_timeout(key, v.tasks);
    default:
      throw format_error(key, "not a restore outcome: '" + format_agreement_value(v) + "'");
  }
  if constexpr (detect<ckpt_pin, Checkpointer>::value) checkpoints.pin(step);
  return step;
}

template <class T>
using kv_ns = decltype(std::declval<const T&>().ns().incarnation());

// How a message names the store's namespace: run id and incarnation where the Kv tells them.
template <class Kv>
std::string restore_launch_name(const Kv& kv) {
  if constexpr (detect<kv_ns, Kv>::value) {
    return "run id '" + kv.ns().run_id() + "' incarnation '" + kv.ns().incarnation() + "'";
  } else {
    return "this run id and incarnation";
  }
}

// The checkpoints this task holds, with their histories where the Checkpointer knows them.
template <class Checkpointer>
std::vector<checkpoint_identity> restore_held(const Checkpointer& checkpoints) {
  if constexpr (has_identity_v<Checkpointer>) {
    return checkpoints.all_identities();
  } else {
    std::vector<checkpoint_identity> out;
    for (std::int64_t s : checkpoints.all_steps()) out.push_back({s, {}});
    return out;
  }
}

// Refuses keys an earlier launch under the same run id and incarnation left: none of them can
// exist in this launch before this task has put its list (see the Guarantees). A recorded
// timeout may be this launch's (this task started late): it is thrown as the agreement would,
// which refuses a stale one too.
template <class Clock, class Kv>
void refuse_stale_restore_keys(Kv& kv, const restore_party<Clock>& party,
                               typename Clock::time_point deadline) {
  const std::string& sc = party.scope;
  const std::string keys[] = {sc + "restore/have/" + std::to_string(party.cluster.task),
                              sc + "restore/step", agreement_key_name(sc, agreement_key::claim, 0),
                              agreement_key_name(sc, agreement_key::step, 0),
                              agreement_key_name(sc, agreement_key::error, 0)};
  for (const std::string& key : keys) {
    auto v = party.store.retrying([&] { return kv.try_get(key); }, deadline);
    if (!v) continue;
    if (key == keys[1]) {
      auto d = parse_agreement_value(*v);
      if (d && d->what == agreement_value::kind::timeout) throw agreement_timeout(key, d->tasks);
    }
    throw error(EEXIST, "restore agreement", key,
                "a value left by an earlier launch under " + restore_launch_name(kv) + " ('" +
                    v->substr(0, 200) +
                    "'): refusing to follow it; give each launch a fresh incarnation "
                    "(take_incarnation)");
  }
}

// Every task publishes the checkpoints it holds (restore/have/<task>); each reads all N lists,
// waiting until ack_timeout, and proposes the newest common identity ("none" when there is
// none, a timeout naming the tasks with no list); insert-once on restore/step records the first
// proposal and every task follows it, then begins the launch's history (the outcome's nonce).
template <class Clock, class Kv, class Checkpointer>
std::optional<std::int64_t> agree_on_restore(Kv& kv, Checkpointer& checkpoints,
                                             const restore_party<Clock>& party) {
  const std::string have = party.scope + "restore/have/";
  const std::string outcome_key = party.scope + "restore/step";
  const typename Clock::time_point deadline = Clock::now() + party.options.ack_timeout;
  const typename Clock::time_point recording = deadline + party.options.ack_timeout;
  std::vector<std::vector<checkpoint_identity>> lists;
  std::vector<int> missing;
  try {
    refuse_stale_restore_keys(kv, party, deadline);
    const std::string mine = format_identity_list(restore_held(checkpoints));
    party.store.retrying([&] { kv.put(have + std::to_string(party.cluster.task), mine); },
                         deadline);
    for (int t = 0; t < party.cluster.num_tasks; ++t) {
      const std::string key = have + std::to_string(t);
      auto left = std::chrono::ceil<std::chrono::milliseconds>(
          std::max<typename Clock::duration>(deadline - Clock::now(), {}));
      auto v = party.store.retrying([&] { return kv.get(key, left); }, deadline);
      if (!v) {
        missing.push_back(t);
      } else if (auto ids = parse_identity_list(*v)) {
        lists.push_back(std::move(*ids));
      } else {
        throw format_error(key, "not a checkpoint list: '" + *v + "'");
      }
    }
  } catch (const std::exception& e) {
    if (dynamic_cast<const format_error*>(&e) || dynamic_cast<const agreement_timeout*>(&e) ||
        !is_transient_kv_error(e))
      throw;
    // the store failed until the deadline: record what this task knows (a timeout)
    if (missing.empty()) missing.push_back(party.cluster.task);
  }
  std::optional<checkpoint_identity> common = newest_common_identity(lists);
  const auto& w = party.writer;
  std::string proposal = !missing.empty()
                             ? w.value_text(agreement_value::kind::timeout, -1, missing)
                         : common ? w.value_text(agreement_value::kind::step, common->step)
                                  : w.value_text(agreement_value::kind::none);
  std::optional<agreement_value> decided;
  try {
    auto text = party.store.insert_or_read(kv, outcome_key, proposal, recording).current;
    if (!text) text = party.store.retrying([&] { return kv.try_get(outcome_key); }, recording);
    decided = parse_agreement_value(text.value_or(std::string()));
    if (!decided) throw format_error(outcome_key, "not an outcome: '" + text.value_or("") + "'");
  } catch (const format_error&) {
    throw;
  } catch (const std::exception& e) {
    throw agreement_unreachable(outcome_key, e.what());
  }
  auto step = follow_restore<Clock>(checkpoints, *decided, outcome_key);
  if constexpr (has_identity_v<Checkpointer>) checkpoints.begin_history(decided->nonce);
  return step;
}

/// What a handler restores at construction: the agreed step where the Checkpointer can take part
/// in the restore agreement and the options ask for it, else the Checkpointer's own restore().
template <class Clock, class Kv, class Checkpointer>
std::optional<std::int64_t> restore_at_start(Kv& kv, Checkpointer& checkpoints,
                                             const restore_party<Clock>& party) {
  if constexpr (has_step_restore_v<Checkpointer>) {
    if (party.options.agree_on_restore) return agree_on_restore(kv, checkpoints, party);
  }
  return checkpoints.restore();
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
