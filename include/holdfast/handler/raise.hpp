// holdfast/handler/raise.hpp — the exception preemption_handler raises for a failed agreement:
// one per kind of agreement_failure_info (agreement/step_agreement.hpp), naming what the
// machine recorded.
//
// Guarantees:
//   - timeout: agreement_timeout naming the round's outcome key (under the run scope) and the
//     missing tasks as recorded; unreachable: agreement_unreachable naming that key and why, with
//     the store error's errno.
//   - hang: hang_detected with the recorded verdict's task, phase, step, elapsed time and bound
//     (handler/hang.hpp); a value that is no verdict still raises hang_detected (phase "unknown",
//     step -1, the value as its message).
//   - Any other kind (a peer's or this worker's step error): peer_error with the origin task,
//     the exception's type name and its message.
//   - It always throws; it reads nothing but its arguments.
#pragma once

#include <optional>
#include <string>

#include "../agreement/keys.hpp"            // agreement_key_name: the key a timeout names
#include "../agreement/step_agreement.hpp"  // agreement_failure_info: what failed
#include "../agreement/value.hpp"           // parse_agreement_value: a recorded hang verdict
#include "../error.hpp"  // agreement_timeout, agreement_unreachable, hang_detected, peer_error
#include "../version.hpp"
#include "hang.hpp"  // hang_verdict_of, hang_phase_name

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// Throws what the failure `f` of an agreement under the key prefix `scope` is.
[[noreturn]] inline void raise_agreement_failure(const agreement_failure_info& f,
                                                 const std::string& scope) {
  if (f.kind == agreement_failure::timeout)
    throw agreement_timeout(agreement_key_name(scope, f.key, f.round), f.missing_tasks);
  if (f.kind == agreement_failure::unreachable)
    throw agreement_unreachable(agreement_key_name(scope, f.key, f.round), f.message, f.errnum);
  if (f.kind == agreement_failure::hang) {
    auto a = parse_agreement_value(f.message);
    if (auto v = a ? hang_verdict_of(*a) : std::nullopt)
      throw hang_detected(v->task, hang_phase_name(v->phase), v->step, v->elapsed.count(),
                          v->bound.count(), v->describe());
    throw hang_detected(f.task, "unknown", -1, 0, 0, f.message);
  }
  throw peer_error(f.task, f.type_name, f.message);
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
