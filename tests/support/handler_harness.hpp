// tests/support/handler_harness.hpp — what the handler tests and benchmarks share: a per-worker
// notice for threads (a flag polled by the real polled_notice), a Checkpointer wired the default
// way (checkpoint_manager with a writer and a reader) that logs every save. (Thread checks:
// thread_state.hpp.)
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <holdfast/checkpoint.hpp>
#include <holdfast/termination.hpp>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace holdfast_test {

/// polled_notice's poll for thread workers: noticed when the flag is set.
struct flag_poll {
  const std::atomic<bool>* flag;
  bool operator()() const { return flag->load(); }
};

/// A notice per thread: the real polled_notice polling a flag every millisecond.
using flag_notice = holdfast::polled_notice<flag_poll>;

/// Appends one line to `path` (O_APPEND: safe from several processes).
inline void append_line(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string l = line + "\n";
  (void)!::write(fd, l.data(), l.size());
  ::close(fd);
}

/// The lines of `path` (none when it does not exist).
inline std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

/// The training state of one worker: one increment per step, checkpointed and restored.
struct worker_state {
  std::int64_t acc = 0;    ///< steps of work done (restored from the checkpoint)
  std::int64_t saves = 0;  ///< checkpoints written by this process
  std::vector<std::int64_t> saved_steps;
  std::string log;  ///< where "save <step> <acc>" lines go ("" = nowhere)
};

/// The default Checkpointer (checkpoint_manager), with a writer and reader for `st`.
inline holdfast::checkpoint_manager<> make_checkpoints(const std::string& dir, worker_state* st) {
  holdfast::checkpoint_options o;
  o.max_to_keep = 0;  // keep all: the tests count them
  holdfast::checkpoint_manager<> m(dir, holdfast::directory_commit::rename, o);
  m.set_writer([st](const std::string& d, std::int64_t step) {
    std::ofstream(d + "/state") << st->acc;
    ++st->saves;
    st->saved_steps.push_back(step);
    if (!st->log.empty())
      append_line(st->log, "save " + std::to_string(step) + " " + std::to_string(st->acc));
  });
  m.set_reader([st](const std::string& d) {
    std::ifstream in(d + "/state");
    in >> st->acc;
  });
  return m;
}

/// A Checkpointer in memory (for tests of the agreement where the disk would only add time):
/// save(step) records into `st`, restore() returns the last step saved into `st`.
struct memory_checkpoints {
  worker_state* st;
  void save(std::int64_t step) {
    ++st->saves;
    st->saved_steps.push_back(step);
  }
  std::optional<std::int64_t> restore() {
    if (st->saved_steps.empty()) return std::nullopt;
    st->acc = st->saved_steps.back();
    return st->saved_steps.back();
  }
};

// A notice that can be given again: noticed_at() is the time the test last set (0: none), so a
// re-armed handler sees each new one (flag_notice latches its first).
struct repeat_notice {
  const std::atomic<std::int64_t>* at_ns;
  void start() {}
  void stop() {}
  bool noticed() const { return at_ns->load() != 0; }
  std::optional<std::chrono::steady_clock::time_point> noticed_at() const {
    auto ns = at_ns->load();
    if (!ns) return std::nullopt;
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
  }
  std::optional<std::chrono::system_clock::time_point> deadline() const { return std::nullopt; }
};

}  // namespace holdfast_test
