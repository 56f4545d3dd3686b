// holdfast/handler/restore_agreement.hpp — the start-up restore agreement: before the first
// step every task restores the same checkpoint, the newest one all of them hold with the same
// identity (step and history).
//
// Guarantees:
//   - With a Checkpointer that has all_steps() and restore_step() (has_step_restore_v;
//     checkpoint_manager does) and handler_options::agree_on_restore (on by default): each task
//     puts the checkpoints it holds under restore/have/<task> (an identity list, step_list.hpp),
//     reads every task's list (waiting at most restore_timeout), and proposes the newest step all
//     of them hold with the same identity; insert-once on restore/step records the first proposal
//     and every task restores exactly that step (and pins it, when the Checkpointer has pin(),
//     so retention keeps it until a newer common step is known).
//   - Bounds: the start's first store calls (the stale-key reads below, this task's put) must be
//     answered within handler_options::start_timeout (10 s): a store out of reach fails the
//     start with agreement_unreachable carrying the store's error (which names its URL or path)
//     and its errno; a store error that is no outage (a permission, a full disk) is thrown as it
//     is. The wait for every task's list lasts restore_timeout (10 minutes: ranks may start
//     minutes apart), with a line every restore_report_interval (10 s) to options.log naming
//     the tasks there and those not; the recorded timeout then states that bound. Recording the
//     outcome may take one ack_timeout more.
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

#include "../agreement.hpp"         // agreement_value, identity lists, newest_common_identity
#include "../error.hpp"             // agreement_timeout, agreement_unreachable, format_error
#include "../kv.hpp"                // is_transient_kv_error
#include "../kv/call_deadline.hpp"  // kv_call_deadline: the wait's report, within 1 s
#include "../log.hpp"               // log_line: the wait's report
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
  const handler_options& options;             // agree_on_restore, its timeouts, log
  const basic_step_agreement<Clock>& writer;  // value_text: "... by <task>/<nonce>"
  const store_retry<Clock>& store;            // retries and exactly-once inserts
};

// "1,2,5": at most 16 ids, then how many more.
inline std::string restore_task_list(const std::vector<int>& tasks) {
  std::string s;
  for (std::size_t i = 0; i < tasks.size() && i < 16; ++i)
    s += (i ? "," : "") + std::to_string(tasks[i]);
  if (tasks.size() > 16) s += " and " + std::to_string(tasks.size() - 16) + " more";
  return s.empty() ? "none" : s;
}

// "600 s", "300 ms": a bound as the start's messages state it.
inline std::string restore_duration_text(std::chrono::milliseconds d) {
  const auto ms = d.count();
  return ms % 1000 ? std::to_string(ms) + " ms" : std::to_string(ms / 1000) + " s";
}

// "within 600 s (handler_options::restore_timeout)": the bound a restore timeout states.
inline std::string restore_bound_text(const handler_options& o) {
  return "within " + restore_duration_text(o.restore_timeout) +
         " (handler_options::restore_timeout)";
}

// Restores `checkpoints` to the step every task follows (its outcome key's text's step).
template <class Clock, class Checkpointer>
std::optional<std::int64_t> follow_restore(Checkpointer& checkpoints, const agreement_value& v,
                                           const std::string& key, const std::string& bound) {
  std::optional<std::int64_t> step;
  switch (v.what) {
    case agreement_value::kind::step:
      checkpoints.restore_step(v.step);
      step = v.step;
      break;
    case agreement_value::kind::none:
      break;
    case agreement_value::kind::timeout:
      throw agreement_timeout(key, v.tasks, bound);
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

// Calls `fn` (a store call on `key`) with the start's retries until `reached_by`: a store out
// of reach until then fails the start with agreement_unreachable, the store's error and errno.
template <class Clock, class F>
auto reach_at_start(const restore_party<Clock>& party, const std::string& key, F&& fn,
                    typename Clock::time_point reached_by) -> decltype(fn()) {
  try {
    return party.store.retrying(std::forward<F>(fn), reached_by);
  } catch (const std::exception& e) {
    if (!is_transient_kv_error(e)) throw;  // names its file or key and errno already
    throw agreement_unreachable(key,
                                "the store did not answer within " +
                                    restore_duration_text(party.options.start_timeout) +
                                    " of the start (handler_options::start_timeout): " + e.what(),
                                errnum_of(e));
  }
}

// Refuses keys an earlier launch under the same run id and incarnation left: none of them can
// exist in this launch before this task has put its list (see the Guarantees). A recorded
// timeout may be this launch's (this task started late): it is thrown as the agreement would,
// which refuses a stale one too. These are the start's first store calls: held to `reached_by`.
template <class Clock, class Kv>
void refuse_stale_restore_keys(Kv& kv, const restore_party<Clock>& party,
                               typename Clock::time_point reached_by) {
  const std::string& sc = party.scope;
  const std::string keys[] = {sc + "restore/have/" + std::to_string(party.cluster.task),
                              sc + "restore/step", agreement_key_name(sc, agreement_key::claim, 0),
                              agreement_key_name(sc, agreement_key::step, 0),
                              agreement_key_name(sc, agreement_key::error, 0)};
  for (const std::string& key : keys) {
    auto v = reach_at_start(
        party, key, [&] { return kv.try_get(key); }, reached_by);
    if (!v) continue;
    if (key == keys[1]) {
      auto d = parse_agreement_value(*v);
      if (d && d->what == agreement_value::kind::timeout)
        throw agreement_timeout(key, d->tasks, restore_bound_text(party.options));
    }
    throw error(EEXIST, "restore agreement", key,
                "a value left by an earlier launch under " + restore_launch_name(kv) + " ('" +
                    v->substr(0, 200) +
                    "'): refusing to follow it; give each launch a fresh incarnation "
                    "(take_incarnation)");
  }
}

// While the restore agreement waits for task `waiting` (tasks below it have answered): one line
// naming the tasks there and those not (the later ones are looked up once, within 1 s).
template <class Clock, class Kv>
void report_restore_wait(Kv& kv, const restore_party<Clock>& party, int waiting,
                         typename Clock::duration waited) {
  const std::string have = party.scope + "restore/have/";
  std::vector<int> there, absent;
  for (int t = 0; t < waiting; ++t) there.push_back(t);
  absent.push_back(waiting);
  std::string trouble;
  try {
    const kv_call_deadline bound(std::chrono::steady_clock::now() + std::chrono::seconds(1));
    for (int t = waiting + 1; t < party.cluster.num_tasks; ++t)
      (kv.try_get(have + std::to_string(t)) ? there : absent).push_back(t);
  } catch (const std::exception& e) {
    trouble = std::string("; the store: ") + e.what();
  }
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(waited).count();
  log_line(party.options.log, "restore agreement: task " + std::to_string(party.cluster.task) +
                                  " waited " + std::to_string(s) +
                                  " s for the checkpoints of tasks " + restore_task_list(absent) +
                                  " (there: " + restore_task_list(there) + "; it gives up " +
                                  restore_bound_text(party.options) + ")" + trouble);
}

// Every task publishes the checkpoints it holds (restore/have/<task>); each reads all N lists,
// waiting until restore_timeout (a line every restore_report_interval), and proposes the newest
// common identity ("none" when there is none, a timeout naming the tasks with no list);
// insert-once on restore/step records the first proposal and every task follows it, then
// begins the launch's history (the outcome's nonce). The store must answer within
// start_timeout of the start.
template <class Clock, class Kv, class Checkpointer>
std::optional<std::int64_t> agree_on_restore(Kv& kv, Checkpointer& checkpoints,
                                             const restore_party<Clock>& party) {
  const handler_options& o = party.options;
  const std::string have = party.scope + "restore/have/";
  const std::string outcome_key = party.scope + "restore/step";
  const typename Clock::time_point start = Clock::now();
  const typename Clock::time_point reached_by = start + o.start_timeout;
  const typename Clock::time_point deadline = start + o.restore_timeout;
  const typename Clock::time_point recording = deadline + o.ack_timeout;
  const auto every =
      std::max<typename Clock::duration>(o.restore_report_interval, std::chrono::milliseconds(10));
  const std::string bound = restore_bound_text(o);
  refuse_stale_restore_keys(kv, party, reached_by);
  const std::string mine_key = have + std::to_string(party.cluster.task);
  const std::string mine = format_identity_list(restore_held(checkpoints));
  reach_at_start(
      party, mine_key, [&] { kv.put(mine_key, mine); }, reached_by);
  std::vector<std::vector<checkpoint_identity>> lists;
  std::vector<int> missing;
  try {
    typename Clock::time_point next_report = start + every;
    for (int t = 0; t < party.cluster.num_tasks; ++t) {
      const std::string key = have + std::to_string(t);
      std::optional<std::string> v;
      for (;;) {  // blocking gets, each ending by the next report
        auto left = std::chrono::ceil<std::chrono::milliseconds>(
            std::max<typename Clock::duration>(std::min(deadline, next_report) - Clock::now(), {}));
        v = party.store.retrying([&] { return kv.get(key, left); }, deadline);
        if (v || Clock::now() >= deadline) break;
        if (Clock::now() >= next_report) {
          report_restore_wait(kv, party, t, Clock::now() - start);
          next_report += every;
        }
      }
      if (!v) {
        missing.push_back(t);
      } else if (auto ids = parse_identity_list(*v)) {
        lists.push_back(std::move(*ids));
      } else {
        throw format_error(key, "not a checkpoint list: '" + *v + "'");
      }
    }
  } catch (const std::exception& e) {
    if (dynamic_cast<const format_error*>(&e) || !is_transient_kv_error(e)) throw;
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
    throw agreement_unreachable(outcome_key, e.what(), errnum_of(e));
  }
  auto step = follow_restore<Clock>(checkpoints, *decided, outcome_key, bound);
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
