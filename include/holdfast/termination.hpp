// holdfast/termination.hpp — where a preemption notice comes from, how to exit, how long the
// grace period is, and the platform presets (after TF's TerminationConfig). Include this header
// for all of it; each part lives in termination/:
//
//   termination/notice.hpp    the Notice contract (start, stop, noticed, noticed_at, deadline),
//                             check_notice_policy, any_of<N...>, poll_result, log_fn
//   termination/signal.hpp    signal_notice<Signals...> (per-signal time left), the handler slot
//   termination/polled.hpp    polled_notice<F>, file_notice
//   termination/cloud.hpp     gce_maintenance_notice, gce_preempted_notice, aws_spot_notice
//   termination/exit.hpp      exit_context, exit_with<Code>, no_exit, wait_then_exit, invoke_exit
//   termination/config.hpp    termination_config<Notice, Exit>: notice + exit + grace + save
//   termination/presets.hpp   presets::generic, borg, borg_tpu, gce_gpu, gce_cpu, kubernetes,
//                             slurm, aws_spot
//   termination/platform.hpp  detect_platform(), visit_preset()
//
// The contract the handler (handler.hpp) relies on: a Config has start(), stop(), noticed(),
// noticed_at() (steady clock), announced_deadline() (the wall-clock time the source says the
// machine goes away, when it says), grace_period(), a save override, and exit(exit_context)
// (the notice time and how long the checkpoint took), which returns only for an Exit policy
// that returns (no_exit, or a callable that does). The grace ends at the earlier of
// noticed_at() + grace_period() and the announced deadline.
//
// Guarantees and caveats: see each part. In short: the signal handler is async-signal-safe and
// chains to the earlier handler as the kernel would have called it; polling notices run one
// thread each, stop promptly and turn bad input into "no notice" plus one log line; nothing runs
// until start().
#pragma once

#include "termination/cloud.hpp"
#include "termination/config.hpp"
#include "termination/exit.hpp"
#include "termination/notice.hpp"
#include "termination/platform.hpp"
#include "termination/polled.hpp"
#include "termination/presets.hpp"
#include "termination/signal.hpp"
