// Staged saves under SIGKILL: a child saves in a loop with a staged writer (8 MiB over three
// files, on disk, so the syncs take real time) and changes its buffers to the next step's bytes
// as soon as save() returns; the parent kills it at a random point: during the staged copy, the
// background write of the staged files, or the commit (the syncs, the rename, the pointer; each
// phase is marked in shared memory and counted). After each kill the parent reopens the
// checkpoints as a restarted process would (its sweep removes what the kill left) and checks the
// invariant:
//   - every listed step restores, verifies, and its files are exactly that step's bytes (no
//     torn, partial or later-mutated step); restore() loads the newest such step;
//   - the latest is never older than a step the child saw committed;
//   - nothing else is left in the directory: no staging directory, no half-written file.
// And resident memory over 50 staged saves of 256 MiB: after save 50 at most 2 % of the state
// above what it was after save 5, the staging area at most the state (plus its 2 MiB rounding).
// Heavy (gcc-20-release, HOLDFAST_PROCESS_TESTS): >= 100 kills, 12.5 GiB written to tmpfs.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <holdfast/checkpoint.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/files.hpp"
#include "support/shm_temp_dir.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

enum phase : int { idle = 0, copying = 1, writing = 2, committing = 3, phases = 4 };

struct board {
  std::atomic<int> phase{idle};
  std::atomic<std::int64_t> committed{-1};
  std::atomic<int> up{0};
};
board* shared_board = nullptr;

void mark(int p) {
  if (shared_board) shared_board->phase.store(p);
}

// Marks the background part: opening a file in a staging directory is the staged write; a sync
// or a rename is the commit.
struct marking_io : holdfast::posix_io {
  static int open(const char* p, int f, mode_t m) noexcept {
    if (std::strstr(p, "/.staging-") && (f & O_CREAT)) mark(writing);
    return holdfast::posix_io::open(p, f, m);
  }
  static int fsync(int fd) noexcept {
    mark(committing);
    return holdfast::posix_io::fsync(fd);
  }
  static int renameat2(int od, const char* from, int nd, const char* to, unsigned fl) noexcept {
    mark(committing);
    return holdfast::posix_io::renameat2(od, from, nd, to, fl);
  }
};
using store_t = holdfast::basic_store<holdfast::basic_local_filesystem<marking_io>>;

constexpr std::size_t big = std::size_t{6} << 20;
constexpr std::size_t small = std::size_t{2} << 20;

// The bytes of file `f` at `step`: cheap to make and to check, different per step and file.
void fill(std::vector<unsigned char>& b, std::int64_t step, int f) {
  const auto v = static_cast<unsigned char>((step * 7 + f * 31) % 251);
  std::memset(b.data(), v, b.size());
  std::memcpy(b.data(), &step, sizeof step);
  std::memcpy(b.data() + b.size() - sizeof step, &step, sizeof step);
}

bool holds(const std::string& dir, std::int64_t step) {
  std::vector<unsigned char> a(big), b(small);
  fill(a, step, 0);
  fill(b, step, 1);
  const std::string s = std::to_string(step);
  auto same = [](const std::string& file, const std::vector<unsigned char>& want) {
    const std::string got = holdfast_test::read_file(file);
    return got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size()) == 0;
  };
  return same(dir + "/model.bin", a) && same(dir + "/optim.bin", b) &&
         holdfast_test::read_file(dir + "/step.txt") == s;
}

holdfast::checkpoint_options options() {
  holdfast::checkpoint_options o;
  o.max_to_keep = 2;
  o.writer_lock_timeout = 10s;
  o.log = [](std::string_view) {};
  return o;
}

[[noreturn]] void child_loop(const std::string& root) {
  auto st = store_t::create(root);
  holdfast::checkpoint_manager<store_t> m(st, "run", options());
  std::vector<unsigned char> model(big), optim(small);
  std::string step_text;
  m.set_writer([&](holdfast::checkpoint_stage& s) {
    mark(copying);
    s.write("model.bin", model.data(), model.size() / 2);
    s.write("optim.bin", optim.data(), optim.size());
    s.write("model.bin", model.data() + model.size() / 2, model.size() - model.size() / 2);
    s.write("step.txt", step_text.data(), step_text.size());
  });
  m.on_commit([](const holdfast::checkpoint_info& c) {
    shared_board->committed.store(c.step);
    mark(idle);
  });
  std::int64_t step = m.restore().value_or(0) + 1;
  fill(model, step, 0);
  fill(optim, step, 1);
  step_text = std::to_string(step);
  shared_board->up.store(1);
  for (;;) {
    m.save(step);  // returns once staged; the next save waits for this one's commit
    ++step;
    // Training changes the state at once: the checkpoint in flight must not see it.
    fill(model, step, 0);
    fill(optim, step, 1);
    step_text = std::to_string(step);
  }
}

}  // namespace

TEST_CASE(
    "staged saves: 100 SIGKILLs in the copy, the write and the commit never leave a torn step") {
  holdfast_test::temp_dir disk("staged-kill");
  const std::string root = disk / "store";
  void* mem =
      ::mmap(nullptr, sizeof(board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  shared_board = new (mem) board;
  std::mt19937 rng(45);
  std::uniform_int_distribution<int> delay_us(0, 40000);
  int landed[phases] = {};
  std::int64_t newest = 0;
  constexpr int kills = 100;
  for (int k = 0; k < kills; ++k) {
    CAPTURE(k);
    shared_board->up.store(0);
    shared_board->phase.store(idle);
    shared_board->committed.store(-1);
    holdfast_test::child c([&] { child_loop(root); });
    for (int i = 0; i < 20000 && shared_board->up.load() == 0; ++i)
      std::this_thread::sleep_for(500us);
    REQUIRE(shared_board->up.load() == 1);
    // Every tenth life waits for one commit first, so the run advances however slow the disk.
    if (k % 10 == 9)
      for (int i = 0; i < 20000 && shared_board->committed.load() < 0; ++i)
        std::this_thread::sleep_for(500us);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    c.kill(SIGKILL);
    auto r = c.wait(30s);
    REQUIRE(r.term_signal == SIGKILL);
    REQUIRE(r.failures == "");
    ++landed[shared_board->phase.load()];
    const std::int64_t committed = shared_board->committed.load();

    // A restarted process: the writer reopens (and sweeps), then every step is checked.
    auto st = store_t::create(root);
    holdfast::checkpoint_manager<store_t> m(st, "run", options());
    for (std::int64_t s : m.all_steps()) {
      CHECK(m.verify_step(s).status == holdfast::integrity_status::ok);
      CHECK_NOTHROW(m.restore_step(s, [&](const std::string& dir) { CHECK(holds(dir, s)); }));
    }
    std::int64_t restored = -1;
    auto l = m.restore([&](const std::string& dir, std::int64_t s) {
      CHECK(holds(dir, s));
      restored = s;
    });
    if (committed >= 0) {
      REQUIRE(l);
      CHECK(*l >= committed);
    }
    if (l)
      CHECK(*l >= newest);  // a kill never takes back a step an earlier life committed
    else
      CHECK(newest == 0);
    if (l) CHECK(restored == *l);
    for (const auto& e : fs::directory_iterator(m.directory())) {
      const std::string name = e.path().filename().string();
      const bool ours =
          name == "latest" || name.rfind("step-", 0) == 0 || name.find("lock") != std::string::npos;
      CHECK_MESSAGE(ours, "left in the checkpoint directory: " << name);
    }
    if (l) newest = *l;
  }
  MESSAGE("kills: " << kills << " (in the staged copy " << landed[copying]
                    << ", the background write " << landed[writing] << ", the commit "
                    << landed[committing] << ", between saves " << landed[idle] << "), newest step "
                    << newest);
  CHECK(landed[copying] > 0);
  CHECK(landed[writing] > 0);
  CHECK(landed[committing] > 0);
  CHECK(newest >= kills / 10);  // the run advanced: at least the lives that waited for a commit
  ::munmap(mem, sizeof(board));
}

namespace {
long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}
}  // namespace

TEST_CASE("staged saves: resident memory does not grow over 50 saves of 256 MiB") {
  holdfast_test::shm_temp_dir ram("staged-rss");
  constexpr std::size_t tensors = 200;
  constexpr std::size_t each = (std::size_t{256} << 20) / tensors / 64 * 64;
  std::vector<std::vector<unsigned char>> state;
  for (std::size_t i = 0; i < tensors; ++i) state.emplace_back(each, static_cast<unsigned char>(i));
  const std::size_t total = tensors * each;
  holdfast::checkpoint_options o = options();
  holdfast::checkpoint_manager<> m(ram / "ckpt", holdfast::directory_commit::rename, o);
  m.set_writer([&](holdfast::checkpoint_stage& s, std::int64_t step) {
    for (std::size_t i = 0; i < tensors; ++i)
      s.write(i % 2 ? "model.bin" : "optim.bin", state[i].data(), state[i].size());
    s.write("step.txt", &step, sizeof step);
  });
  long after5 = 0;
  for (std::int64_t step = 1; step <= 50; ++step) {
    m.save(step);
    state[static_cast<std::size_t>(step) % tensors][0] ^= 1;  // training changes the state
    m.wait_until_finished();
    if (step == 5) after5 = rss_kib();
  }
  const long after50 = rss_kib();
  REQUIRE(after5 > 0);
  const double grew = static_cast<double>(after50 - after5) * 1024.0 / static_cast<double>(total);
  MESSAGE("resident memory: " << after5 << " KiB after save 5, " << after50
                              << " KiB after save 50 (" << grew * 100
                              << " % of the state); staging area " << m.staging_capacity()
                              << " bytes for a state of " << total);
  CHECK(grew <= 0.02);
  CHECK(m.staging_capacity() >= total);
  CHECK(m.staging_capacity() <= total + (std::size_t{2} << 20));
  CHECK(m.latest()->step == 50);
}
