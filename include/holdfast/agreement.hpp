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
// Include this header for all of it; each part lives in agreement/:
//
//   agreement/step_agreement.hpp  basic_step_agreement (the machine, its transition table and
//                                 guarantees), agreement_state, agreement_action,
//                                 agreement_failure(_info), basic_agreement_config, step_agreement
//   agreement/keys.hpp            agreement_key, agreement_key_name, agreement_control_prefix, and
//                                 the keys of one round
//   agreement/value.hpp           agreement_value: the one grammar of the values written, with
//                                 parse_agreement_value and format_agreement_value
//   agreement/step_list.hpp       the restore agreement's step lists: format_step_list,
//                                 parse_step_list, newest_common_step
//
// Guarantees and caveats: see each part.
//
#pragma once

#include "agreement/keys.hpp"
#include "agreement/step_agreement.hpp"
#include "agreement/step_list.hpp"
#include "agreement/value.hpp"
