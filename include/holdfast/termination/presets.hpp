// holdfast/termination/presets.hpp — the platform conventions as named types: presets::generic,
// borg, borg_tpu, gce_gpu, gce_cpu, kubernetes, slurm and aws_spot, each a termination_config
// with the platform's notice, exit code and grace period (the values of TF's presets and the
// schedulers').
//
// Guarantees:
//   - Each preset has `name`, `exit_code` and `default_grace` as static members, and is a
//     termination_config (so the handler takes it as its Config).
//   - Nothing runs until start().
//   - A preset whose notice listens to several signals (slurm) announces the deadline of the
//     signal that came first; grace_deadline() is capped by it.
// Caveats:
//   - The times are the platforms' defaults; a site that changed them (Kubernetes'
//     terminationGracePeriodSeconds, Slurm's `--signal` time, GraceTime and KillWait) must pass
//     its own values to the constructor.
#pragma once

#include <signal.h>  // SIGTERM, SIGUSR1

#include <chrono>

#include "cloud.hpp"
#include "config.hpp"
#include "exit.hpp"
#include "signal.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The platform conventions as named types (the values of TF's presets and the schedulers').
namespace presets {

/// Anywhere else: SIGTERM, exit 42, no grace. 42 is a code no crash or signal produces
/// (crashes give 1, signals 128 + n), so a restart policy or wrapper script can tell "saved and
/// stopped for a preemption" from a failure; TF's generic preset uses the same code.
struct generic : termination_config<signal_notice<SIGTERM>, exit_with<42>> {
  static constexpr const char* name = "generic";
  static constexpr std::chrono::seconds default_grace{0};
  generic() : termination_config(signal_notice<SIGTERM>(), exit_with<42>(), default_grace) {}
};

/// Borg: SIGTERM, exit 42 (TF's Borg preset: the code Borg's restart policy reads as
/// "preempted, restart me" rather than a task failure), no grace.
struct borg : termination_config<signal_notice<SIGTERM>, exit_with<42>> {
  static constexpr const char* name = "borg";
  static constexpr std::chrono::seconds default_grace{0};
  borg() : termination_config(signal_notice<SIGTERM>(), exit_with<42>(), default_grace) {}
};

/// Borg TPU: SIGTERM; exit 42 as on Borg, but only after waiting out the 900 s notice window
/// less the measured checkpoint time, as TF's Borg TPU exit function does (the worker keeps its
/// TPU slice for the window rather than exiting into a restart that cannot start yet); no grace.
struct borg_tpu : termination_config<signal_notice<SIGTERM>, wait_then_exit<42, 900000>> {
  static constexpr const char* name = "borg_tpu";
  static constexpr std::chrono::seconds default_grace{0};
  static constexpr std::chrono::seconds notice_window{900};
  borg_tpu()
      : termination_config(signal_notice<SIGTERM>(), wait_then_exit<42, 900000>(), default_grace) {}
};

/// GCE with GPUs: maintenance-event poll; exit 143 (TF's GCE code, 128 + SIGTERM: the status
/// of a process ended by the platform's SIGTERM, so supervisors such as systemd, managed
/// instance groups and job wrappers treat it as a termination, not an application error);
/// 3600 s grace (GCE announces maintenance of GPU hosts an hour ahead: keep training meanwhile).
struct gce_gpu : termination_config<gce_maintenance_notice, exit_with<143>> {
  static constexpr const char* name = "gce_gpu";
  static constexpr std::chrono::seconds default_grace{3600};
  explicit gce_gpu(const cloud_notice_options& o = {})
      : termination_config(gce_maintenance_notice(o), exit_with<143>(), default_grace) {}
};

/// GCE without GPUs: maintenance-event poll; exit 143 (as gce_gpu); no grace (CPU VMs get
/// about 60 s notice before a terminating maintenance: save at once).
struct gce_cpu : termination_config<gce_maintenance_notice, exit_with<143>> {
  static constexpr const char* name = "gce_cpu";
  static constexpr std::chrono::seconds default_grace{0};
  explicit gce_cpu(const cloud_notice_options& o = {})
      : termination_config(gce_maintenance_notice(o), exit_with<143>(), default_grace) {}
};

/// Kubernetes: SIGTERM; exit 143 (128 + SIGTERM, what the kubelet expects from a pod told to
/// stop; the Job/Deployment controller restarts it); grace = terminationGracePeriodSeconds
/// (default 30 s) — pass your pod's value.
struct kubernetes : termination_config<signal_notice<SIGTERM>, exit_with<143>> {
  static constexpr const char* name = "kubernetes";
  static constexpr std::chrono::seconds default_grace{30};
  explicit kubernetes(std::chrono::seconds grace = default_grace)
      : termination_config(signal_notice<SIGTERM>(), exit_with<143>(), grace) {}
};

/// Slurm: SIGUSR1 or SIGTERM, whichever comes first; exit 143; 120 s grace, cut short by the
/// deadline of the signal that came first. Which `--signal` form reaches the trainer:
///   - a trainer started with `srun` (a task of a job step) gets `--signal=USR1@120`: SIGUSR1
///     120 s before the time limit;
///   - a trainer started directly by the batch script needs `--signal=B:USR1@120`, which signals
///     only the batch shell: the script must `exec` the trainer (or trap the signal and forward
///     it to the trainer), else the trainer never sees it.
/// SIGUSR1 leaves the `--signal` time: deadline() = arrival + usr1_time_left (120 s by default;
/// pass your `@` value). Preemption sends SIGTERM, and SIGKILL follows after GraceTime + KillWait
/// (partition and site settings; 0 + 30 s = 30 s by default), not 120 s: deadline() = arrival +
/// term_time_left (30 s by default; pass your site's sum). Requeueing is the scheduler's: submit
/// with `--requeue` (and `--open-mode=append`) so the job comes back after the exit.
struct slurm : termination_config<signal_notice<SIGUSR1, SIGTERM>, exit_with<143>> {
  static constexpr const char* name = "slurm";
  static constexpr std::chrono::seconds default_grace{120};
  /// The time left after SIGUSR1: the `@` of `--signal=USR1@120`.
  static constexpr std::chrono::seconds default_usr1_time_left{120};
  /// The time left after SIGTERM: GraceTime + KillWait (Slurm's defaults: 0 + 30 s).
  static constexpr std::chrono::seconds default_term_time_left{30};
  /// `grace`, and the time left after SIGUSR1 and after SIGTERM (see above).
  explicit slurm(std::chrono::seconds grace = default_grace,
                 std::chrono::seconds usr1_time_left = default_usr1_time_left,
                 std::chrono::seconds term_time_left = default_term_time_left)
      : termination_config(
            signal_notice<SIGUSR1, SIGTERM>({{SIGUSR1, usr1_time_left}, {SIGTERM, term_time_left}}),
            exit_with<143>(), grace) {}
};

/// AWS spot: poll spot/instance-action every 5 s; exit 143 (as on GCE); grace up to the
/// deadline in the notice (two minutes; grace_deadline() is capped by the announced time).
struct aws_spot : termination_config<aws_spot_notice, exit_with<143>> {
  static constexpr const char* name = "aws_spot";
  static constexpr std::chrono::seconds default_grace{120};
  explicit aws_spot(const cloud_notice_options& o = {})
      : termination_config(aws_spot_notice(o), exit_with<143>(), default_grace) {}
};

}  // namespace presets

HOLDFAST_NAMESPACE_END
