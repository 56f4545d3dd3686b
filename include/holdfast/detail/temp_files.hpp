// holdfast/detail/temp_files.hpp — the temporary files a process made (the cache files of
// create_cache) and removes however it ends: their owner removes each, exit() and a return from
// main remove what is left (atexit), and holdfast's own exits remove them before they end the
// process without destructors (exit_with, wait_then_exit, hang_restart). remove_temp_files() is
// public for an Exit policy of the user's that ends the process itself (_exit, os._exit).
//
// Guarantees:
//   - A file is removed only by the process that registered it: a forked child's exit never
//     removes its parent's file.
//   - remove_temp_files() unlinks every file this process registered and has not removed yet,
//     then forgets them; it never throws and allocates nothing, and never blocks an exit for
//     long: should another thread hold the list (a cache being created at that very moment), it
//     gives up after 100 ms.
// Caveats:
//   - Nothing runs on SIGKILL, a crash or a power cut: a file made for a job that can be killed so
//     belongs in a directory the job removes (cache_options::dir).
//   - The list is the one piece of process-wide state besides the signal-handler slot: a path and
//     a pid per live temp file.
#pragma once

#include <unistd.h>  // getpid, unlink

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>  // atexit
#include <mutex>
#include <string>
#include <thread>  // this_thread::sleep_for: a bounded wait for the lock
#include <utility>
#include <vector>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

// This process's temp files, each with the pid that registered it.
struct temp_file_list {
  std::mutex m;
  std::vector<std::pair<std::string, pid_t>> files;
};

// Locks `m` within about 100 ms, so an exit never waits on a thread stuck holding it; false:
// not locked. (try_lock in a loop, not std::timed_mutex: its clocklock is invisible to
// ThreadSanitizer, which then reports the unlock.)
inline bool temp_files_lock(std::mutex& m) noexcept {
  for (int i = 0; i < 100; ++i) {
    if (m.try_lock()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// The list once a file was registered (null before): never destroyed, as exit() uses it last.
inline std::atomic<temp_file_list*>& temp_file_slot() noexcept {
  static std::atomic<temp_file_list*> slot{nullptr};
  return slot;
}

inline void temp_files_at_exit() noexcept;

// Registers `path` as a temp file of this process.
inline void temp_file_add(std::string path) {
  static temp_file_list* const list = [] {
    auto* l = new temp_file_list;
    temp_file_slot().store(l, std::memory_order_release);
    std::atexit(temp_files_at_exit);  // exit() and a return from main remove what is left
    return l;
  }();
  std::lock_guard<std::mutex> g(list->m);
  list->files.emplace_back(std::move(path), ::getpid());
}

// Forgets `path` (its owner removed it).
inline void temp_file_forget(const std::string& path) noexcept {
  temp_file_list* list = temp_file_slot().load(std::memory_order_acquire);
  if (!list || !temp_files_lock(list->m)) return;
  std::lock_guard<std::mutex> g(list->m, std::adopt_lock);
  const pid_t me = ::getpid();
  list->files.erase(
      std::remove_if(list->files.begin(), list->files.end(),
                     [&](const auto& f) { return f.second == me && f.first == path; }),
      list->files.end());
}

}  // namespace detail

/// Removes the temp files holdfast made in this process and has not removed yet (the cache
/// files of create_cache). holdfast's own exits call it; call it from an Exit policy of your own
/// that ends the process without destructors.
inline void remove_temp_files() noexcept {
  detail::temp_file_list* list = detail::temp_file_slot().load(std::memory_order_acquire);
  if (!list || !detail::temp_files_lock(list->m)) return;
  std::lock_guard<std::mutex> g(list->m, std::adopt_lock);
  const pid_t me = ::getpid();
  for (const auto& f : list->files)
    if (f.second == me) ::unlink(f.first.c_str());
  list->files.erase(std::remove_if(list->files.begin(), list->files.end(),
                                   [&](const auto& f) { return f.second == me; }),
                    list->files.end());
}

namespace detail {
inline void temp_files_at_exit() noexcept { remove_temp_files(); }
}  // namespace detail

HOLDFAST_NAMESPACE_END
