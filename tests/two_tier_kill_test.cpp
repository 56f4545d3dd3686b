// two_tier_checkpoints under SIGKILL: a child saves in a loop with both tiers (local keep 2 on a
// RAM disk, durable keep 3 on disk) and is killed at a random point: during a local save, a
// local retention, a background copy or a durable retention (each thread marks its phase in
// shared memory; the parent counts where each kill landed). After each kill the parent reopens
// both tiers as a restarted process would and checks the invariant:
//   - every step either tier lists restores, and its files are exactly the step's bytes (no
//     restore of an incomplete or corrupt step);
//   - the newest durable step is never older than one the child saw committed durable.
// Heavy (gcc-20-release): >= 200 kills.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <holdfast/checkpoint/two_tier.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/shm_temp_dir.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;

namespace {

enum phase : int {
  idle = 0,
  local_save = 1,
  local_retention = 2,
  copying = 3,
  durable_retention = 4
};

// What the child tells the parent, in memory both see.
struct board {
  std::atomic<int> main_phase{idle};
  std::atomic<int> copier_phase{idle};
  std::atomic<std::int64_t> durable_committed{-1};
  std::atomic<int> up{0};
};
board* shared_board = nullptr;

// The durable mount's Io: opening a file in a staging directory marks the copier's phase as
// copying (the pointer and the deletions after a durable retention do not).
struct marking_io : holdfast::posix_io {
  static int open(const char* p, int f, mode_t m) noexcept {
    if (shared_board && std::strstr(p, "/.staging-")) shared_board->copier_phase.store(copying);
    return holdfast::posix_io::open(p, f, m);
  }
};
using durable_store = holdfast::basic_store<holdfast::basic_local_filesystem<marking_io>>;
using tiers = holdfast::two_tier_checkpoints<holdfast::store, durable_store>;

std::string content(std::int64_t step) {
  return std::string(3000 + static_cast<std::size_t>(step % 5) * 1000,
                     static_cast<char>('a' + step % 26)) +
         std::to_string(step);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void check_step(const std::string& dir, std::int64_t step) {
  if (slurp(dir + "/data") != content(step) || slurp(dir + "/sub/more") != std::to_string(step))
    throw std::runtime_error("step " + std::to_string(step) + " at '" + dir +
                             "' does not hold its bytes");
}

// A retention rule that keeps nothing itself and marks the phase.
holdfast::retention_policy marking(std::atomic<int> board::*which, int what) {
  return holdfast::retention_policy::custom([which, what](const auto& c) {
    if (shared_board) (shared_board->*which).store(what);
    return std::vector<bool>(c.size(), false);
  });
}

holdfast::two_tier_options options() {
  holdfast::two_tier_options o;
  o.local.retention =
      holdfast::retention_policy::keep_last(2) | marking(&board::main_phase, local_retention);
  o.durable.retention =
      holdfast::retention_policy::keep_last(3) | marking(&board::copier_phase, durable_retention);
  o.local.writer_lock_timeout = o.durable.writer_lock_timeout = 10s;
  o.log = o.local.log = o.durable.log = [](std::string_view) {};
  o.durable_wait = 0ms;
  return o;
}

tiers open(const std::string& local, const std::string& durable) {
  return tiers(local, holdfast::directory_commit::rename, durable,
               holdfast::directory_commit::rename, options());
}

[[noreturn]] void child_loop(const std::string& local, const std::string& durable) {
  auto t = open(local, durable);
  t.set_writer([](const std::string& dir, std::int64_t step) {
    shared_board->main_phase.store(local_save);
    std::ofstream(dir + "/data") << content(step);
    ::mkdir((dir + "/sub").c_str(), 0755);
    std::ofstream(dir + "/sub/more") << step;
  });
  std::int64_t step = t.latest_step().value_or(0) + 1;
  shared_board->up.store(1);
  for (;;) {
    t.save(step++);
    shared_board->main_phase.store(idle);
    if (auto s = t.durable_step()) shared_board->durable_committed.store(*s);
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a training step
  }
}

}  // namespace

TEST_CASE("two tiers: 200 SIGKILLs at random points never leave an incomplete step restorable") {
  holdfast_test::shm_temp_dir ram("tiers-kill-local");
  holdfast_test::temp_dir disk("tiers-kill-durable");
  const std::string local = ram / "local";
  const std::string durable = disk / "durable";
  void* mem =
      ::mmap(nullptr, sizeof(board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  shared_board = new (mem) board;
  std::mt19937 rng(35);
  std::uniform_int_distribution<int> delay_us(0, 30000);
  int landed[5][5] = {};  // [main phase][copier phase]
  std::int64_t newest = 0;
  constexpr int kills = 200;
  for (int k = 0; k < kills; ++k) {
    shared_board->up.store(0);
    shared_board->main_phase.store(idle);
    shared_board->copier_phase.store(idle);
    shared_board->durable_committed.store(-1);
    holdfast_test::child c([&] { child_loop(local, durable); });
    for (int i = 0; i < 20000 && shared_board->up.load() == 0; ++i)
      std::this_thread::sleep_for(500us);
    REQUIRE(shared_board->up.load() == 1);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    c.kill(SIGKILL);
    auto r = c.wait(30s);
    REQUIRE(r.term_signal == SIGKILL);
    REQUIRE(r.failures == "");
    ++landed[shared_board->main_phase.load()][shared_board->copier_phase.load()];
    const std::int64_t committed = shared_board->durable_committed.load();

    // A restarted process: both tiers reopened (the writers sweep what the kill left).
    auto t = open(local, durable);
    std::int64_t loaded = -1;
    t.set_reader([&](const std::string& dir, std::int64_t s) {
      check_step(dir, s);
      loaded = s;
    });
    for (std::int64_t s : t.all_steps()) {
      CHECK_NOTHROW(t.restore_step(s));
      CHECK(loaded == s);
    }
    holdfast::checkpoint_options quiet;
    quiet.log = [](std::string_view) {};
    holdfast::checkpoint_manager<durable_store> d(holdfast::read_only, durable,
                                                  holdfast::directory_commit::rename, quiet);
    for (std::int64_t s : d.all_steps())
      CHECK_NOTHROW(d.restore_step(s, [&](const std::string& dir) { check_step(dir, s); }));
    CHECK(d.latest_step().value_or(-1) >= committed);
    if (auto l = t.latest_step()) newest = *l;
  }
  MESSAGE("kills: " << kills << ", newest step " << newest);
  int main_hits[5] = {}, copier_hits[5] = {};
  for (int m = 0; m < 5; ++m)
    for (int c = 0; c < 5; ++c) {
      main_hits[m] += landed[m][c];
      copier_hits[c] += landed[m][c];
    }
  MESSAGE("kills landing in the main thread's local save: "
          << main_hits[local_save] << ", local retention: " << main_hits[local_retention]
          << ", between saves: " << main_hits[idle] << "; in the copier's copy: "
          << copier_hits[copying] << ", durable retention: " << copier_hits[durable_retention]
          << ", before its first copy: " << copier_hits[idle]);
  CHECK(main_hits[local_save] > 0);
  CHECK(main_hits[local_retention] > 0);
  CHECK(copier_hits[copying] > 0);
  CHECK(copier_hits[durable_retention] > 0);
  CHECK(newest > kills);  // the run advanced
  ::munmap(mem, sizeof(board));
}
