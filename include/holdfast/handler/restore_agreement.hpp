// holdfast/handler/restore_agreement.hpp — the start-up restore agreement: before the first
// step every task restores the same checkpoint, the newest step all of them hold.
//
// Guarantees:
//   - With a Checkpointer that has all_steps() and restore_step() (has_step_restore_v;
//     checkpoint_manager does) and handler_options::agree_on_restore (on by default): each task
//     puts the steps it holds under restore/have/<task>, reads every task's list (waiting at most
//     ack_timeout), and proposes the newest step all of them hold; insert-once on restore/step
//     records the first proposal and every task restores exactly that step (and pins it, when
//     the Checkpointer has pin(), so retention keeps it until a newer common step is known).
//   - A task that never starts makes the agreement throw agreement_timeout naming it, on every
//     task; a store that cannot be reached to record or read the outcome throws
//     agreement_unreachable; a list or an outcome that is not the grammar throws format_error.
//   - Without those members each task restores its own latest checkpoint (weaker: a worker whose
//     last save failed resumes from an older step than its peers).
// Caveats:
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

#include "../agreement.hpp"  // agreement_value, step lists, newest_common_step
#include "../error.hpp"      // agreement_timeout, agreement_unreachable, format_error
#include "../kv.hpp"         // is_transient_kv_error
#include "../version.hpp"
#include "options.hpp"
#include "store_retry.hpp"
#include "traits.hpp"  // has_step_restore_v, ckpt_pin

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

// Every task publishes the steps it holds (restore/have/<task>); each reads all N lists,
// waiting until ack_timeout, and proposes the newest common step ("none" when there is none,
// a timeout naming the tasks with no list); insert-once on restore/step records the first
// proposal and every task follows it.
template <class Clock, class Kv, class Checkpointer>
std::optional<std::int64_t> agree_on_restore(Kv& kv, Checkpointer& checkpoints,
                                             const restore_party<Clock>& party) {
  const std::string have = party.scope + "restore/have/";
  const std::string outcome_key = party.scope + "restore/step";
  const typename Clock::time_point deadline = Clock::now() + party.options.ack_timeout;
  const typename Clock::time_point recording = deadline + party.options.ack_timeout;
  std::vector<std::vector<std::int64_t>> lists;
  std::vector<int> missing;
  try {
    const std::string mine = format_step_list(checkpoints.all_steps());
    party.store.retrying([&] { kv.put(have + std::to_string(party.cluster.task), mine); },
                         deadline);
    for (int t = 0; t < party.cluster.num_tasks; ++t) {
      const std::string key = have + std::to_string(t);
      auto left = std::chrono::ceil<std::chrono::milliseconds>(
          std::max<typename Clock::duration>(deadline - Clock::now(), {}));
      auto v = party.store.retrying([&] { return kv.get(key, left); }, deadline);
      if (!v) {
        missing.push_back(t);
      } else if (auto steps = parse_step_list(*v)) {
        lists.push_back(std::move(*steps));
      } else {
        throw format_error(key, "not a step list: '" + *v + "'");
      }
    }
  } catch (const std::exception& e) {
    if (dynamic_cast<const format_error*>(&e) || !is_transient_kv_error(e)) throw;
    // the store failed until the deadline: record what this task knows (a timeout)
    if (missing.empty()) missing.push_back(party.cluster.task);
  }
  std::optional<std::int64_t> common = newest_common_step(lists);
  const auto& w = party.writer;
  std::string proposal = !missing.empty()
                             ? w.value_text(agreement_value::kind::timeout, -1, missing)
                         : common ? w.value_text(agreement_value::kind::step, *common)
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
  return follow_restore<Clock>(checkpoints, *decided, outcome_key);
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
