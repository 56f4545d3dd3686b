// tests/support/scoped_disposition.hpp — a signal's disposition set for a scope and the previous
// one restored, as the signal tests put a known action (often SIG_IGN) under a notice.
//
// Guarantees:
//   - The constructor installs the action (a plain handler or SIG_IGN / SIG_DFL, an SA_SIGINFO
//     action, or any struct sigaction with its flags and mask) and keeps the one it replaced;
//     the destructor puts that one back, whatever a test installed in between.
//   - doctest reports (and re-raises) SIGTERM from its own handler: a test that sets a
//     disposition for its duration gives doctest's back when it ends.
// Caveats:
//   - It is not chained to: a signal_notice started inside the scope replaces the action and,
//     stopped, restores it; a scope that ends while such a notice is started restores under it.
//   - Process-wide, as sigaction is: two threads' scopes on one signal must nest.
#pragma once

#include <signal.h>

namespace holdfast_test {

/// Sets `sig`'s action for the scope and restores the previous one at its end.
class scoped_disposition {
 public:
  /// A plain handler: a function, SIG_IGN or SIG_DFL (no flags, empty mask).
  scoped_disposition(int sig, void (*handler)(int)) : sig_(sig) {
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, &old_);
  }
  /// An SA_SIGINFO action (empty mask).
  scoped_disposition(int sig, void (*action)(int, siginfo_t*, void*)) : sig_(sig) {
    struct sigaction sa {};
    sa.sa_sigaction = action;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, &old_);
  }
  /// Any disposition (flags and mask included).
  scoped_disposition(int sig, const struct sigaction& sa) : sig_(sig) {
    ::sigaction(sig, &sa, &old_);
  }
  ~scoped_disposition() { ::sigaction(sig_, &old_, nullptr); }
  scoped_disposition(const scoped_disposition&) = delete;
  scoped_disposition& operator=(const scoped_disposition&) = delete;

 private:
  int sig_;
  struct sigaction old_ {};
};

}  // namespace holdfast_test
