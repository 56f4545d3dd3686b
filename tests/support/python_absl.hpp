// tests/support/python_absl.hpp — run /usr/bin/python3 (with absl) from a test and read its output.
//
// The interop tests drive tests/absl_interop.py with the system interpreter, /usr/bin/python3
// (not the first python3 on PATH, which may be another interpreter without absl), in isolated
// mode (-I: no PYTHONPATH, no user site) and UTF-8 mode (-X utf8). When the interpreter or absl
// is missing, require_python_absl() throws, so the test FAILS (never skips): with CI=true the
// message says tests/run must install the Debian packages; otherwise it names them.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace holdfast_test {

/// The interpreter: $HOLDFAST_TEST_PYTHON when set (tests of the missing-python path use it),
/// else /usr/bin/python3.
inline std::string python_binary() {
  const char* env = std::getenv("HOLDFAST_TEST_PYTHON");
  return env && *env ? env : "/usr/bin/python3";
}

/// The exact install line tests/run and the messages name.
inline constexpr const char* python_absl_install =
    "apt-get install -y --no-install-recommends python3 python3-absl";

/// How a process ended and what it printed.
struct process_output {
  int exit_code = -1;      ///< exit status when it exited normally, else -1
  int term_signal = 0;     ///< the signal that ended it, else 0
  bool timed_out = false;  ///< killed at the deadline
  std::string out;         ///< its stdout
  std::string err;         ///< its stderr
  bool ok() const { return exit_code == 0 && !timed_out; }
};

/// Runs argv[0] (an absolute path, no PATH search) with `argv` in directory `cwd`, collecting
/// stdout and stderr until it exits; killed with SIGKILL at `timeout`.
inline process_output run_process(const std::vector<std::string>& argv, const std::string& cwd,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw std::runtime_error("pipe2 failed");
  }
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  process_output r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  return r;
}

/// Runs the interpreter on `args` (after -I -X utf8) in `cwd`.
inline process_output run_python(const std::vector<std::string>& args, const std::string& cwd) {
  std::vector<std::string> argv{python_binary(), "-I", "-X", "utf8"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, cwd);
}

/// Throws std::runtime_error with install advice when the interpreter or absl is missing (a
/// failure, not a skip).
inline void require_python_absl() {
  const std::string bin = python_binary();
  std::string missing;
  if (::access(bin.c_str(), X_OK) != 0) {
    missing = bin + " is missing";
  } else {
    auto r = run_python({"-c", "import absl.flags"}, "/");
    if (!r.ok()) {
      std::string why = r.err;
      while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
      why = why.substr(why.rfind('\n') == std::string::npos ? 0 : why.rfind('\n') + 1);
      missing = bin + " cannot import absl.flags (" + (why.empty() ? "no message" : why) + ")";
    }
  }
  if (missing.empty()) return;
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true")
    throw std::runtime_error("python3 with absl is required in CI but " + missing +
                             ": tests/run must install the Debian packages python3 and "
                             "python3-absl (" +
                             python_absl_install + ")");
  throw std::runtime_error("the absl interop tests need /usr/bin/python3 with absl, but " +
                           missing + ": install the Debian packages (sudo " + python_absl_install +
                           ")");
}

}  // namespace holdfast_test
