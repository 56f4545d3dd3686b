// tests/support/thread_state.hpp — what this process's threads are doing, read from /proc, so a
// timing test can wait until a thread is observed asleep instead of sleeping and assuming it.
//
// A test that means "the watcher sleeps in poll(), now wake it" takes the thread ids before the
// handler exists (thread_ids()), the new ones after (new_threads()), and waits until one of them
// is blocked in poll()/ppoll() (wait_asleep_in_poll(): its state is S and
// /proc/self/task/<tid>/syscall names poll or ppoll). wait_asleep_in() does the same for any set
// of calls (wait_syscalls(): poll and a condition variable's futex), also for a child process's
// thread. The wait is a bounded look every millisecond at an observed state, not a pause that
// hopes the state was reached.
//
// A test that means "this object starts n threads and leaves none" compares thread ids, not
// counts: it takes thread_ids() before the object exists and waits (settled_new_threads()) until
// exactly n threads that are not in that set run, then none. A thread joined a moment ago (an
// earlier case's, or one the constructor started and joined) is still listed until the kernel
// releases it, after join() returned: in the set it skews no count, and a count taken once right
// after a join would read it.
#pragma once

#include <dirent.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>  // syscall

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "sanitizers.hpp"  // start_runtime_threads

namespace holdfast_test {

/// This process's thread ids (entries of /proc/self/task), sorted. A sanitizer's runtime thread
/// started at the first pthread_create already runs (start_runtime_threads), so it is never new.
inline std::vector<pid_t> thread_ids() {
  start_runtime_threads();
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

/// The threads not in `before` once exactly `n` of them run, or those of the last look after
/// `timeout`: a thread started is listed from its creation, one joined until the kernel releases
/// it a moment after join() returned. A bounded look every millisecond.
inline std::vector<pid_t> settled_new_threads(
    const std::vector<pid_t>& before, std::size_t n,
    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  auto now = new_threads(before);
  while (now.size() != n && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a bounded look, not an order
    now = new_threads(before);
  }
  return now;
}

/// The system call thread `tid` of process `pid` (0: this one) sleeps in (its state S), or -1
/// when it is running, asleep outside a system call, or unreadable.
inline long sleeping_syscall(pid_t tid, pid_t pid = 0) {
  const std::string dir =
      "/proc/" + (pid ? std::to_string(pid) : std::string("self")) + "/task/" + std::to_string(tid);
  std::ifstream stat(dir + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  const auto paren = line.rfind(')');  // the name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'S') return -1;
  std::ifstream sc(dir + "/syscall");
  long nr = -1;
  if (!(sc >> nr)) return -1;  // "running", or unreadable
  return nr;
}

/// poll() and ppoll(): where a watcher or a watch's wait sleeps.
inline std::vector<long> poll_syscalls() {
  return {
#ifdef SYS_poll
      SYS_poll,
#endif
      SYS_ppoll};
}

/// The calls a blocking wait sleeps in: poll()/ppoll() (a descriptor), futex (a condition
/// variable) and clock_nanosleep/nanosleep (a store that re-checks on a timer, as
/// network_filesystem_kv's get does).
inline std::vector<long> wait_syscalls() {
  auto out = poll_syscalls();
  out.insert(out.end(), {SYS_futex, SYS_clock_nanosleep, SYS_nanosleep});
  return out;
}

/// True when thread `tid` of this process is asleep (state S) inside poll() or ppoll().
inline bool asleep_in_poll(pid_t tid) {
  const long nr = sleeping_syscall(tid);
  const auto polls = poll_syscalls();
  return std::find(polls.begin(), polls.end(), nr) != polls.end();
}

/// Waits up to `timeout` until one of `tids` (threads of process `pid`, 0: this one) is observed
/// asleep in one of `syscalls`; true then. A bounded look every millisecond.
inline bool wait_asleep_in(const std::vector<pid_t>& tids, const std::vector<long>& syscalls,
                           std::chrono::milliseconds timeout, pid_t pid = 0) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (pid_t t : tids) {
      const long nr = sleeping_syscall(t, pid);
      if (std::find(syscalls.begin(), syscalls.end(), nr) != syscalls.end()) return true;
    }
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a bounded look, not an order
  }
}

/// Waits up to `timeout` until one of `tids` is observed asleep in poll() or ppoll(); true then.
inline bool wait_asleep_in_poll(const std::vector<pid_t>& tids, std::chrono::milliseconds timeout) {
  return wait_asleep_in(tids, poll_syscalls(), timeout);
}

/// This thread's id (gettid).
inline pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

}  // namespace holdfast_test
