// tests/support/thread_state.hpp — what this process's threads are doing, read from /proc, so a
// timing test can wait until a thread is observed asleep instead of sleeping and assuming it.
//
// A test that means "the watcher sleeps in poll(), now wake it" takes the thread ids before the
// handler exists (thread_ids()), the new ones after (new_threads()), and waits until one of them
// is blocked in poll()/ppoll() (wait_asleep_in_poll(): its state is S and
// /proc/self/task/<tid>/syscall names poll or ppoll). The wait is a bounded look every
// millisecond at an observed state, not a pause that hopes the state was reached.
#pragma once

#include <dirent.h>
#include <sys/syscall.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace holdfast_test {

/// This process's thread ids (entries of /proc/self/task), sorted.
inline std::vector<pid_t> thread_ids() {
  std::vector<pid_t> out;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') out.push_back(static_cast<pid_t>(std::stol(e->d_name)));
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The threads running now that are not in `before` (from thread_ids()).
inline std::vector<pid_t> new_threads(const std::vector<pid_t>& before) {
  std::vector<pid_t> out;
  for (pid_t t : thread_ids())
    if (!std::binary_search(before.begin(), before.end(), t)) out.push_back(t);
  return out;
}

/// True when thread `tid` of this process is asleep (state S) inside poll() or ppoll().
inline bool asleep_in_poll(pid_t tid) {
  const std::string dir = "/proc/self/task/" + std::to_string(tid);
  std::ifstream stat(dir + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');  // the name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'S')
    return false;
  std::ifstream sc(dir + "/syscall");
  long nr = -1;
  if (!(sc >> nr)) return false;  // "running", or unreadable
#ifdef SYS_poll
  if (nr == SYS_poll) return true;
#endif
  return nr == SYS_ppoll;
}

/// Waits up to `timeout` until one of `tids` is observed asleep in poll() or ppoll(); true then.
inline bool wait_asleep_in_poll(const std::vector<pid_t>& tids, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (pid_t t : tids)
      if (asleep_in_poll(t)) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a bounded look, not an order
  }
}

}  // namespace holdfast_test
