// holdfast/kv/incarnation.hpp — a fresh incarnation number for each launch of a job, taken from
// a store that outlives the launches.
//
// A job's keys live in a kv_namespace (run id + incarnation). A launcher's own restart counter
// (torchrun's TORCHELASTIC_RESTART_COUNT) starts at 0 again in every launch, and a relaunched
// job often keeps its run id (torchrun's default is "none"): over a store that outlives the
// launch (file://, etcd://) the new launch would read the keys the last one left (its recorded
// outcomes, its restore agreement) and act on them. take_incarnation gives each launch a number
// no earlier launch of the run id had.
//
//   auto kv = holdfast::make_kv(url, holdfast::incarnation_namespace(run_id));
//   std::uint64_t n = holdfast::take_incarnation(kv, "rank0/" + nonce);
//   // hand n to every task of this launch (through the launcher's own store), then
//   holdfast::kv_namespace ns(run_id, n);
//
// Guarantees:
//   - Each call returns a number no other call on the same store and run id returned: it is
//     recorded with insert-once under launch/<n> (the value names the taker), so two takers
//     racing get different numbers, and a number taken by a launch that then died is never
//     handed out again. Numbers grow: a call starts above the largest recorded one where the
//     store can list, else at 0 and steps past the taken ones (one insert each).
//   - A retry after a transient failure first reads launch/<n>: an insert that was applied
//     although its answer was lost is recognised by the taker's own value.
// Caveats:
//   - One task of a launch takes the number and the others must learn it from that task (the
//     launcher's store, a broadcast); tasks that each took one would each be alone.
//   - The records stay (a few bytes per launch); erase the incarnation namespace to reset.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "../error.hpp"
#include "../kv.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The namespace take_incarnation keeps its records in for `run_id`: (run_id, "launches"). No
/// job namespace collides with it (theirs have numeric incarnations).
inline kv_namespace incarnation_namespace(std::string run_id) {
  return kv_namespace(std::move(run_id), "launches");
}

/// Takes a fresh incarnation number on `kv` (opened in incarnation_namespace(run_id)); `taker`
/// names the caller (recorded as the value, and how a retried insert recognises itself). Store
/// errors propagate; throws holdfast::error(EOVERFLOW) after `max_tries` numbers all taken by
/// others (a runaway: launches take one each).
template <class Kv>
std::uint64_t take_incarnation(Kv& kv, std::string_view taker, unsigned max_tries = 1000) {
  static_assert(check_coordination_store<Kv>());
  std::uint64_t next = 0;
  if constexpr (has_kv_list_v<Kv>) {
    if (kv_supports(kv, kv_op::list)) {  // any_kv answers at run time
      for (const auto& entry : kv.list("launch")) {
        const std::string n = entry.first.substr(entry.first.rfind('/') + 1);
        if (!n.empty() && n.size() < 20 &&
            std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }))
          next = std::max<std::uint64_t>(next, std::stoull(n) + 1);
      }
    }
  }
  const std::string mine(taker);
  for (unsigned i = 0; i < max_tries; ++i, ++next) {
    const std::string key = "launch/" + std::to_string(next);
    bool created = false;
    try {
      created = kv.insert(key, mine);
    } catch (const std::exception& e) {
      if (!is_transient_kv_error(e)) throw;
      auto current = kv.try_get(key);  // applied, with the answer lost?
      created = current && *current == mine;
      if (!current) created = kv.insert(key, mine);
    }
    if (created) return next;
  }
  throw error(EOVERFLOW, "take_incarnation", "launch/",
              "no free incarnation number in " + std::to_string(max_tries) + " tries");
}

HOLDFAST_NAMESPACE_END
