// tests/support/child.hpp — run a lambda in a forked child and learn how it ended.
//
// The child reports its assertion failures to the parent through a pipe (CHILD_REQUIRE), and
// the parent waits on the child with a deadline (pidfd + poll, no sleeping), killing it on
// timeout. doctest's own assertions must not be used in a child: its report would be lost.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace holdfast_test {

/// How a child ended.
struct child_result {
  int exit_code = -1;      ///< exit status when it exited normally, else -1
  int term_signal = 0;     ///< the signal that killed it, else 0
  bool timed_out = false;  ///< the parent killed it at the deadline
  std::string failures;    ///< CHILD_REQUIRE messages and uncaught exceptions
  bool ok() const { return exit_code == 0 && failures.empty() && !timed_out; }
};

namespace detail {
inline int& failure_fd() {
  static int fd = -1;
  return fd;
}
inline void report(const std::string& msg) {
  std::string line = msg + "\n";
  if (failure_fd() >= 0) (void)!::write(failure_fd(), line.data(), line.size());
}
}  // namespace detail

/// In a child: record a failure and exit with status 1 when `cond` is false.
#define CHILD_REQUIRE(cond)                                                                    \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      ::holdfast_test::detail::report(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                      ": CHILD_REQUIRE(" #cond ") failed");                    \
      ::_exit(1);                                                                              \
    }                                                                                          \
  } while (0)

/// A forked child running `fn`; it exits 0 when `fn` returns, 2 on an uncaught exception.
class child {
 public:
  template <class F>
  explicit child(F&& fn) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(p[0]);
      detail::failure_fd() = p[1];
      int code = 0;
      try {
        fn();
      } catch (const std::exception& e) {
        detail::report(std::string("uncaught exception: ") + e.what());
        code = 2;
      } catch (...) {
        detail::report("uncaught non-std exception");
        code = 2;
      }
      ::_exit(code);
    }
    ::close(p[1]);
    pipe_ = p[0];
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  child(child&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)),
        pipe_(std::exchange(o.pipe_, -1)),
        pidfd_(std::exchange(o.pidfd_, -1)) {}
  ~child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (pipe_ >= 0) ::close(pipe_);
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  pid_t pid() const { return pid_; }
  void kill(int sig) const { ::kill(pid_, sig); }

  /// Waits up to `timeout` for the child to end; kills it with SIGKILL past the deadline.
  child_result wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    child_result r;
    if (pid_ <= 0) return r;
    if (pidfd_ >= 0) {
      pollfd pfd{pidfd_, POLLIN, 0};
      int n;
      do n = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
      while (n < 0 && errno == EINTR);
      if (n == 0) {
        r.timed_out = true;
        ::kill(pid_, SIGKILL);
      }
    }
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipe_, buf, sizeof buf)) > 0) r.failures.append(buf, static_cast<size_t>(n));
    return r;
  }

 private:
  pid_t pid_ = -1;
  int pipe_ = -1;
  int pidfd_ = -1;
};

}  // namespace holdfast_test
