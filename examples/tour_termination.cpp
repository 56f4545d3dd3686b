// tour_termination — a custom termination config, a preset, and run-time detection.
#include <holdfast/termination.hpp>

#include <csignal>
#include <cstdio>

int main() {
  // [snippet]
  // SIGTERM or a file dropped by a preStop hook; no_exit: the loop decides what to do.
  using notice = holdfast::any_of<holdfast::signal_notice<SIGTERM>, holdfast::file_notice>;
  holdfast::termination_config<notice, holdfast::no_exit> cfg(
      notice{holdfast::signal_notice<SIGTERM>{}, holdfast::file_notice("/tmp/preempt")});
  cfg.set_grace_period(std::chrono::seconds(30));
  cfg.start();  // installs the handler (chained to any earlier one), starts the file poller

  for (long step = 0; step < 1000; ++step) {
    if (step == 3) std::raise(SIGTERM);  // stand-in for the platform's notice
    if (cfg.noticed()) {                 // an atomic load per source: fine on every step
      std::printf("notice at step %ld, grace %lld s\n", step,
                  static_cast<long long>(cfg.grace_period().count() / 1000));
      break;  // save a checkpoint here, then cfg.exit()
    }
  }

  // The platform's conventions as a named type...
  holdfast::presets::kubernetes k8s(std::chrono::seconds(60));  // SIGTERM, exit 143, 60 s grace
  std::printf("%s: exit code %d\n", k8s.name, k8s.exit_code);
  // ...or chosen at run time.
  holdfast::visit_preset(holdfast::detect_platform(), [](auto preset) {
    std::printf("detected: %s (exit code %d)\n", preset.name, preset.exit_code);
  });
  // [/snippet]
}
