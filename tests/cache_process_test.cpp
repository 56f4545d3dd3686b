// The cache across real processes: 4 writers + 4 readers (fork) doing 100,000 operations, a
// forked child reopening its own descriptor, creator-only removal, ENOSPC and every other
// injected syscall failure of a put, read-only preload (files and directories, as another
// user), writers SIGKILLed in the middle of puts, and locking on a network filesystem (NFS
// emulated through the Io policy).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <holdfast/cache.hpp>
#include <holdfast/termination/exit.hpp>  // exit_with, wait_then_exit: the exits a worker takes
#include <holdfast/testing/fault_io.hpp>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/child.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/sanitizers.hpp"
#include "support/temp_dir.hpp"

namespace hf = holdfast;
using hf::testing::fault;
using hf::testing::fault_io;
using hf::testing::fault_plan;
using hf::testing::io_op;
using holdfast_test::disarm_on_exit;

namespace {

using holdfast_test::sanitized;

// The stress counts of the issue; scaled down under sanitizers only (they run ~10x slower).
constexpr std::uint64_t total_ops = sanitized ? 20000 : 100000;
constexpr int kill_runs = sanitized ? 20 : 100;

hf::cache_options in(const holdfast_test::temp_dir& dir) {
  hf::cache_options o;
  o.dir = dir.path();
  return o;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A self-describing record: slot (8 bytes), writer (1 byte), then bytes derived from both, of a
// slot-dependent size. A reader can tell a torn, misplaced or twice-written item.
std::string record(std::uint64_t slot, unsigned writer, std::size_t max_extra = 200) {
  std::size_t size = 9 + (slot * 40503 + writer * 5) % max_extra;
  std::string s(size, '\0');
  hf::detail::put_le64(&s[0], slot);
  s[8] = static_cast<char>(writer);
  for (std::size_t k = 9; k < size; ++k)
    s[k] = static_cast<char>((slot * 31 + writer * 17 + k * 3) & 0xFF);
  return s;
}
// The writer of a record if it is exactly record(slot, writer) for `slot`, else -1.
int writer_of(std::string_view v, std::uint64_t slot, std::size_t max_extra = 200) {
  if (v.size() < 9 || hf::detail::get_le64(v.data()) != slot) return -1;
  auto w = static_cast<unsigned char>(v[8]);
  return v == record(slot, w, max_extra) ? w : -1;
}

void write_u64s(const std::string& path, const std::vector<std::uint64_t>& v) {
  auto fd = hf::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  hf::write_all(fd, v.data(), v.size() * 8);
  fd.close();
}
std::vector<std::uint64_t> read_u64s(const std::string& path) {
  auto fd = hf::open_file(path, O_RDONLY);
  auto s = hf::read_all(fd);
  std::vector<std::uint64_t> v(s.size() / 8);
  std::memcpy(v.data(), s.data(), v.size() * 8);
  return v;
}

// Waits up to `ms` for `fd` to become readable.
bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do n = ::poll(&p, 1, ms);
  while (n < 0 && errno == EINTR);
  return n == 1;
}

struct pipe_pair {
  int r = -1, w = -1;
  pipe_pair() {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    r = p[0];
    w = p[1];
  }
  ~pipe_pair() {
    ::close(r);
    ::close(w);
  }
  void signal() const { (void)!::write(w, "x", 1); }
  bool wait(int ms) const {
    char c;
    return readable_within(r, ms) && ::read(r, &c, 1) == 1;
  }
};

template <class Cache>
void stress(std::uint64_t ops) {
  holdfast_test::temp_dir dir("cache");
  const std::uint64_t slots = ops / 5;  // writers try every slot 2.5 times in all: many conflicts
  const std::uint64_t per_process = ops / 8;
  Cache cache(hf::create_cache, slots, in(dir));
  std::vector<holdfast_test::child> kids;
  for (unsigned w = 0; w < 4; ++w)
    kids.emplace_back([&, w] {
      std::vector<std::uint64_t> won;
      for (std::uint64_t k = 0; k < per_process; ++k) {
        auto slot = (k * (2 * w + 1) + w * 977) % slots;
        if (cache.put(slot, record(slot, w))) won.push_back(slot);
      }
      write_u64s(dir / ("w" + std::to_string(w)), won);
    });
  for (unsigned r = 0; r < 4; ++r)
    kids.emplace_back([&, r] {
      std::map<std::uint64_t, int> seen;
      std::uint64_t x = 88172645463325252ull + r;
      std::string buf;
      // Read while the writers write: on a loaded machine a reader could otherwise run all its
      // reads before the first put, and observe nothing (bounded: 10 s).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (cache.filled() == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      for (std::uint64_t k = 0; k < per_process; ++k) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        auto slot = x % slots;
        int w = -2;
        if (k % 2) {
          if (auto v = cache.get(slot)) w = writer_of(std::string_view(v->data(), v->size()), slot);
        } else if (cache.get_into(slot, buf)) {
          w = writer_of(buf, slot);
        }
        if (w == -2) continue;  // empty
        CHILD_REQUIRE(w >= 0);  // complete, untorn, for this slot
        auto it = seen.emplace(slot, w).first;
        CHILD_REQUIRE(it->second == w);  // never replaced: no slot is written twice
      }
      std::vector<std::uint64_t> flat;
      for (auto& [slot, w] : seen) flat.insert(flat.end(), {slot, static_cast<std::uint64_t>(w)});
      write_u64s(dir / ("r" + std::to_string(r)), flat);
    });
  for (auto& k : kids) {
    auto res = k.wait(std::chrono::seconds(120));
    INFO(res.failures);
    REQUIRE(res.ok());
  }
  std::vector<int> winner(slots, -1);
  std::uint64_t wins = 0;
  for (unsigned w = 0; w < 4; ++w)
    for (auto slot : read_u64s(dir / ("w" + std::to_string(w)))) {
      REQUIRE(winner[slot] == -1);  // no slot is written twice
      winner[slot] = static_cast<int>(w);
      ++wins;
    }
  CHECK(wins == cache.filled());
  CHECK(wins > slots / 2);
  for (std::uint64_t slot = 0; slot < slots; ++slot) {
    auto v = cache.get(slot);
    REQUIRE(v.has_value() == (winner[slot] >= 0));
    if (v) REQUIRE(writer_of(std::string_view(v->data(), v->size()), slot) == winner[slot]);
  }
  std::uint64_t observed = 0;
  for (unsigned r = 0; r < 4; ++r) {
    auto flat = read_u64s(dir / ("r" + std::to_string(r)));
    for (std::size_t k = 0; k + 1 < flat.size(); k += 2) {
      REQUIRE(winner[flat[k]] == static_cast<int>(flat[k + 1]));  // reads saw the winner's bytes
      ++observed;
    }
  }
  CHECK(observed > 0);
}

}  // namespace

TEST_CASE("4 writer + 4 reader processes: every read is the slot's one write") {
  SUBCASE("mmap_read + flock_lock + pfio_format (multiprocess_file_cache)") {
    stress<hf::multiprocess_file_cache>(total_ops);
  }
  SUBCASE("pread_read + flock_lock + checked_format") {
    stress<
        hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_never, hf::checked_format>>(
        total_ops / 5);
  }
}

TEST_CASE("a forked child reopens its own descriptor, so flock excludes it from the parent") {
  holdfast_test::temp_dir dir("cache");
  using cache_t = hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never,
                                       hf::pfio_format, fault_io>;
  cache_t cache(hf::create_cache, 4, in(dir));
  REQUIRE(cache.put(0, "parent"));
  // The parent holds the lock on its description, as it would in the middle of a put.
  const int parent_fd = cache.lock_handle();
  REQUIRE(parent_fd >= 0);
  REQUIRE(::flock(parent_fd, LOCK_EX) == 0);
  pipe_pair done;
  holdfast_test::child kid([&] {
    fault_plan::reset_counts();
    CHILD_REQUIRE(cache.put(1, "child"));                // blocks until the parent unlocks
    CHILD_REQUIRE(fault_plan::calls(io_op::open) == 1);  // reopened once
    CHILD_REQUIRE(cache.lock_handle() >= 0);  // (the number may be reused; the description is new)
    CHILD_REQUIRE(cache.put(2, "again"));
    CHILD_REQUIRE(fault_plan::calls(io_op::open) == 1);  // and only once
    CHILD_REQUIRE(!cache.owns_file());
    done.signal();
  });
  // Had the child used the inherited descriptor, flock would have let it straight in.
  CHECK_FALSE(done.wait(400));
  CHECK_FALSE(cache.contains(1));
  REQUIRE(::flock(parent_fd, LOCK_UN) == 0);
  CHECK(done.wait(10000));
  auto r = kid.wait(std::chrono::seconds(10));
  INFO(r.failures);
  REQUIRE(r.ok());
  CHECK(*cache.get(1) == "child");
  CHECK(*cache.get(2) == "again");
  CHECK(cache.lock_handle() == parent_fd);  // the parent's descriptor is untouched
  CHECK(cache.put(3, "parent again"));
}

TEST_CASE("without MADV_WIPEONFORK a fork is noticed by getpid, and the child still reopens") {
  holdfast_test::temp_dir dir("cache");
  using cache_t = hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_never,
                                       hf::pfio_format, fault_io>;
  cache_t cache(hf::create_cache, 4, in(dir));
  {
    disarm_on_exit guard;
    fault_plan::arm(fault{io_op::madvise, 1, EINVAL});  // as on a kernel older than 4.14
    REQUIRE(cache.put(0, "parent"));
    CHECK(fault_plan::failures() == 1);
  }
  holdfast_test::child kid([&] {
    fault_plan::reset_counts();
    CHILD_REQUIRE(cache.put(1, "child"));
    CHILD_REQUIRE(fault_plan::calls(io_op::open) == 1);
    CHILD_REQUIRE(cache.put(2, "child"));
    CHILD_REQUIRE(fault_plan::calls(io_op::open) == 1);
  });
  auto r = kid.wait(std::chrono::seconds(10));
  INFO(r.failures);
  CHECK(r.ok());
  fault_plan::reset_counts();
  CHECK(cache.put(3, "parent"));
  CHECK(fault_plan::calls(io_op::open) == 0);  // the parent keeps its descriptor
  CHECK(*cache.get(1) == "child");
}

// Runs twice: as the test (creates a cache, execs this binary on this test case only) and, in
// the exec'ed copy, as the worker (HOLDFAST_CACHE_WORKER set), which attaches by path and length.
TEST_CASE("an exec'ed worker attaches to the live cache by path and length") {
  if (const char* path = std::getenv("HOLDFAST_CACHE_WORKER")) {
    auto c = hf::multiprocess_file_cache::attach(path, 16);
    CHECK_FALSE(c.owns_file());
    REQUIRE(c.get(1).has_value());
    CHECK(*c.get(1) == "from the parent");
    CHECK(c.put(5, "from the exec'ed worker"));
    CHECK_FALSE(c.put(1, "again"));
    return;
  }
  holdfast_test::temp_dir dir("cache");
  hf::multiprocess_file_cache cache(hf::create_cache, 16, in(dir));
  REQUIRE(cache.put(1, "from the parent"));
  holdfast_test::child worker([&] {
    ::setenv("HOLDFAST_CACHE_WORKER", cache.path().c_str(), 1);
    char self[] = "/proc/self/exe";
    char filter[] = "--test-case=an exec'ed worker attaches*";
    char quiet[] = "--no-intro";
    char* argv[] = {self, filter, quiet, nullptr};
    ::execv(self, argv);
    const bool exec_failed = true;  // execv returns only on failure
    CHILD_REQUIRE(!exec_failed);
  });
  auto r = worker.wait(std::chrono::seconds(30));
  INFO(r.failures);
  CHECK(r.exit_code == 0);  // doctest exits non-zero when a worker assertion failed
  REQUIRE(cache.get(5).has_value());
  CHECK(*cache.get(5) == "from the exec'ed worker");
}

TEST_CASE("only the creating process's object removes the temp file") {
  holdfast_test::temp_dir dir("cache");
  std::optional<hf::multiprocess_file_cache> cache;
  cache.emplace(hf::create_cache, 8, in(dir));
  const std::string path = cache->path();
  holdfast_test::child kid([&] {
    CHILD_REQUIRE(!cache->owns_file());
    CHILD_REQUIRE(cache->put(1, "from child"));
    cache.reset();  // the child's copy of the object dies: the file stays
    auto attached = hf::multiprocess_file_cache::attach(path, 8);
    CHILD_REQUIRE(attached.put(2, "attached"));
  });
  auto r = kid.wait(std::chrono::seconds(10));
  INFO(r.failures);
  REQUIRE(r.ok());
  CHECK(exists(path));
  CHECK(*cache->get(1) == "from child");
  CHECK(*cache->get(2) == "attached");
  CHECK(cache->owns_file());
  cache.reset();
  CHECK_FALSE(exists(path));
}

TEST_CASE(
    "a created cache file goes with its process however it ends: exit_with, wait_then_exit, "
    "exit(), remove_temp_files before _exit; never with a forked child") {
  // Invariant: once the creating process has ended, its temp cache file is gone, whichever way
  // it ended but SIGKILL; a child forked from it never removes it.
  holdfast_test::temp_dir dir("cache-exit");
  auto left = [&] {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      out.push_back(e.path().filename().string());
    return out;
  };
  const std::pair<const char*, int> ends[] = {
      {"exit_with", 42}, {"wait_then_exit", 43}, {"exit", 44}, {"remove_temp_files", 45}};
  for (const auto& e : ends) {  // not a structured binding: C++17 lambdas (CAPTURE) can't use one
    const std::string end = e.first;
    const int status = e.second;
    CAPTURE(end);
    holdfast_test::child worker([&] {
      hf::multiprocess_file_cache cache(hf::create_cache, 8, in(dir));  // alive at the exit
      CHILD_REQUIRE(cache.put(0, "sample"));
      {  // a forked grandchild ending by exit() leaves the file to its creator
        holdfast_test::child grandchild([] { std::exit(0); });
        CHILD_REQUIRE(grandchild.wait(std::chrono::seconds(20)).exit_code == 0);
      }
      CHILD_REQUIRE(exists(cache.path()));
      if (end == "exit_with") hf::exit_with<42>{}();
      if (end == "wait_then_exit") hf::wait_then_exit<43, 0>{}();
      if (end == "exit") std::exit(44);
      hf::remove_temp_files();  // what a callable Exit policy of the user's does
      CHILD_REQUIRE(!exists(cache.path()));
      ::_exit(45);
    });
    auto r = worker.wait(std::chrono::seconds(30));
    INFO(r.failures);
    CHECK(r.exit_code == status);
    CHECK(left() == std::vector<std::string>{});
  }
}

TEST_CASE("ENOSPC freezes the cache without an exception, and the lock is released") {
  holdfast_test::temp_dir dir("cache");
  using cache_t = hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never,
                                       hf::checked_format, fault_io>;
  cache_t cache(hf::create_cache, 8, in(dir));
  const auto size_before = cache.size_bytes();
  pipe_pair failed, release;
  holdfast_test::child full([&] {
    fault_plan::arm(fault{io_op::pwrite, 1, ENOSPC});
    CHILD_REQUIRE(!cache.put(0, std::string(1000, 'x')));  // false, no exception
    CHILD_REQUIRE(cache.frozen());
    fault_plan::disarm();
    CHILD_REQUIRE(!cache.put(1, "y"));  // frozen stays frozen
    failed.signal();
    CHILD_REQUIRE(release.wait(20000));  // stay alive: a lock we held would still be held
  });
  REQUIRE(failed.wait(10000));
  holdfast_test::child other([&] {
    CHILD_REQUIRE(cache.put(2, "goes on"));  // would block forever if the lock were held
  });
  auto r2 = other.wait(std::chrono::seconds(5));
  INFO(r2.failures);
  CHECK(r2.ok());
  release.signal();
  auto r1 = full.wait(std::chrono::seconds(10));
  INFO(r1.failures);
  CHECK(r1.ok());
  CHECK_FALSE(cache.contains(0));  // nothing published for the failed put
  CHECK(*cache.get(2) == "goes on");
  CHECK(cache.size_bytes() == size_before + 7);
  CHECK_FALSE(cache.frozen());  // frozen is per object: the parent goes on too
  CHECK(cache.put(3, "parent"));

  SUBCASE("fdatasync ENOSPC before the entry: also false and frozen") {
    using synced = hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_each_put,
                                        hf::pfio_format, fault_io>;
    synced s(hf::create_cache, 2, in(dir));
    disarm_on_exit guard;
    fault_plan::arm(fault{io_op::fdatasync, 1, ENOSPC});
    CHECK_FALSE(s.put(0, "data"));
    CHECK(s.frozen());
    CHECK_FALSE(s.contains(0));
  }
}

TEST_CASE_TEMPLATE(
    "every syscall of a put failing in turn: an error, no half-written entry, no lock held",
    cache_t,
    hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_each_put, hf::checked_format,
                         fault_io>,
    hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_each_put, hf::pfio_format,
                         fault_io>) {
  holdfast_test::temp_dir dir("cache");
  disarm_on_exit guard;
  cache_t probe(hf::create_cache, 1, in(dir));
  fault_plan::reset_counts();
  REQUIRE(probe.put(0, "probe"));
  const auto calls = fault_plan::calls(io_op::any);
  REQUIRE(calls >= 5);  // flock, pwrite, fdatasync, fdatasync, unlock (+ first-put setup)
  for (std::uint64_t k = 1; k <= calls; ++k) {
    CAPTURE(k);
    cache_t cache(hf::create_cache, 2, in(dir));
    fault_plan::arm(fault{io_op::any, k, EIO});
    bool stored = false;
    std::string op = "(none)";
    try {
      stored = cache.put(0, "payload");
    } catch (const hf::error& e) {
      op = e.operation();
      CHECK(e.errnum() == EIO);
      CHECK(e.path() == cache.path());
    }
    CAPTURE(op);
    fault_plan::disarm();
    CHECK(fault_plan::failures() == 1);
    auto v = cache.get(0);
    if (v) CHECK(*v == "payload");  // published only when complete (a failed final sync aside)
    if (stored) CHECK(v.has_value());
    if (op == "open" || op == "flock" || op == "lseek" || op == "pwrite") {
      CHECK_FALSE(v.has_value());  // failed before the entry was published
    }
    // the lock is free: another process's put goes through
    holdfast_test::child kid([&] { CHILD_REQUIRE(cache.put(1, "next")); });
    auto r = kid.wait(std::chrono::seconds(5));
    INFO(r.failures);
    CHECK(r.ok());
  }
}

TEST_CASE("preserve/preload round trip with a read-only file in a read-only directory") {
  holdfast_test::temp_dir dir("cache");
  ::chmod(dir.path().c_str(), 0755);
  const std::string sub = dir / "kept";
  REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
  {
    hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::checked_format> c(
        hf::create_cache, 50, [&] {
          hf::cache_options o;
          o.dir = sub;
          return o;
        }());
    hf::multiprocess_file_cache p(hf::create_cache, 50, in(dir));
    for (std::uint64_t i = 0; i < 50; i += 2) {
      REQUIRE(c.put(i, record(i, 1)));
      REQUIRE(p.put(i, record(i, 2)));
    }
    REQUIRE(c.preserve("checked.cache"));
    REQUIRE(p.preserve(sub + "/pfio.cache"));
  }
  for (auto name : {"checked.cache", "pfio.cache"}) ::chmod((sub + "/" + name).c_str(), 0444);
  ::chmod(sub.c_str(), 0555);
  // As another user when we are root (root ignores permission bits), else as ourselves.
  holdfast_test::child kid([&] {
    if (::geteuid() == 0) {
      CHILD_REQUIRE(::setgid(65534) == 0);
      CHILD_REQUIRE(::setuid(65534) == 0);
    }
    CHILD_REQUIRE(::open((sub + "/pfio.cache").c_str(), O_RDWR) == -1);  // truly read-only
    CHILD_REQUIRE(errno == EACCES);
    auto check = [&](const auto& cache, unsigned writer) {
      CHILD_REQUIRE((::fcntl(cache.native_handle(), F_GETFL) & O_ACCMODE) == O_RDONLY);
      CHILD_REQUIRE(cache.filled() == 25);
      for (std::uint64_t i = 0; i < 50; ++i) {
        auto v = cache.get(i);
        CHILD_REQUIRE(v.has_value() == (i % 2 == 0));
        if (v) CHILD_REQUIRE(writer_of(std::string_view(v->data(), v->size()), i) == int(writer));
      }
    };
    using checked_ro =
        hf::basic_file_cache<hf::mmap_read, hf::no_lock, hf::sync_never, hf::checked_format>;
    using checked_pread =
        hf::basic_file_cache<hf::pread_read, hf::no_lock, hf::sync_never, hf::checked_format>;
    check(checked_ro::preload(sub + "/checked.cache"), 1);
    check(checked_pread::preload(sub + "/checked.cache"), 1);
    check(hf::readonly_file_cache::preload(sub + "/pfio.cache", 50), 2);
    check(hf::multiprocess_file_cache::preload(sub + "/pfio.cache", 50), 2);
  });
  auto r = kid.wait(std::chrono::seconds(20));
  INFO(r.failures);
  CHECK(r.ok());
  ::chmod(sub.c_str(), 0755);
}

namespace {

// A writer child puts records of up to ~64 KiB and reports each put on a pipe; the parent lets it
// run for a random number of puts and SIGKILLs it, mid-put at an arbitrary instruction.
template <class Cache>
void killed_writer(int runs) {
  holdfast_test::temp_dir dir("cache");
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  int killed_with_data = 0;
  for (int run = 0; run < runs; ++run) {
    const std::uint64_t slots = 64;
    Cache cache(hf::create_cache, slots, in(dir));
    pipe_pair progress, hold;
    holdfast_test::child writer([&] {
      for (std::uint64_t i = 0; i < slots; ++i) {
        (void)cache.put(i, record(i, 7, 65536));
        progress.signal();
      }
      char c;
      (void)!::read(hold.r, &c, 1);  // never returns (nobody writes): the parent kills us
    });
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    auto puts = x % 40;
    for (std::uint64_t k = 0; k < puts; ++k) REQUIRE(progress.wait(10000));
    writer.kill(SIGKILL);
    auto r = writer.wait(std::chrono::seconds(10));
    CHECK(r.term_signal == SIGKILL);
    std::string name = "killed-" + std::to_string(run);
    REQUIRE(cache.preserve(name));
    // preload validates every entry (and with checked_format every checksum)
    auto kept = Cache::preload(dir / name, slots);
    const auto size = kept.size_bytes();
    for (std::uint64_t i = 0; i < slots; ++i) {
      auto e = kept.entry(i);
      if (!e) continue;
      REQUIRE(e->offset + e->size <= size);  // no entry points past the end of the file
      auto v = kept.get(i);
      REQUIRE(writer_of(std::string_view(v->data(), v->size()), i, 65536) == 7);  // complete
    }
    killed_with_data += kept.filled() > 0;
  }
  CHECK(killed_with_data > 0);
}

}  // namespace

TEST_CASE("a writer SIGKILLed in the middle of puts leaves only complete items") {
  SUBCASE("checked_format: the preserved file preloads and every item checks") {
    killed_writer<
        hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::checked_format>>(
        kill_runs);
  }
  SUBCASE("pfio_format: no entry points past the end of the file") {
    killed_writer<hf::multiprocess_file_cache>(kill_runs);
  }
  SUBCASE("pread_read + checked_format") {
    killed_writer<
        hf::basic_file_cache<hf::pread_read, hf::flock_lock, hf::sync_never, hf::checked_format>>(
        kill_runs / 4);
  }
}

namespace {

// NFS without NFS: fstatfs answers NFS's magic, and flock behaves as the NFS client emulates it,
// with a POSIX record lock (F_SETLKW, F_WRLCK), which the kernel refuses with EBADF on a
// descriptor not open for writing. Counts those refusals.
struct nfs_io : hf::posix_io {
  static std::atomic<int>& ebadf() {
    static std::atomic<int> n{0};
    return n;
  }
  static int fstatfs(int fd, struct statfs* st) noexcept {
    int r = ::fstatfs(fd, st);
    if (r == 0) st->f_type = 0x6969;  // NFS_SUPER_MAGIC
    return r;
  }
  static int flock(int fd, int op) noexcept {
    struct flock fl {};
    fl.l_type = (op & LOCK_UN) ? F_UNLCK : F_WRLCK;
    fl.l_whence = SEEK_SET;
    int r = ::fcntl(fd, (op & LOCK_NB) ? F_SETLK : F_SETLKW, &fl);
    if (r != 0 && errno == EBADF) ++ebadf();
    return r;
  }
};
// The same locks on a filesystem statfs does not name (it answers ext4's magic).
struct unnamed_network_io : nfs_io {
  static int fstatfs(int fd, struct statfs* st) noexcept {
    int r = ::fstatfs(fd, st);
    if (r == 0) st->f_type = 0xEF53;
    return r;
  }
};

}  // namespace

TEST_CASE("network filesystems are named by their statfs magic") {
  CHECK(hf::is_network_filesystem(0x6969));                                               // NFS
  CHECK(hf::is_network_filesystem(0x517B));                                               // SMB
  CHECK(hf::is_network_filesystem(0xFF534D42));                                           // CIFS
  CHECK(hf::is_network_filesystem(static_cast<std::uint64_t>(std::int64_t{-11317950})));  // CIFS,
  // as a sign-extended f_type
  CHECK(hf::is_network_filesystem(0x65735546));        // FUSE
  CHECK(hf::is_network_filesystem(0x0BD00BD0));        // Lustre
  CHECK(hf::is_network_filesystem(0x47504653));        // GPFS
  CHECK(hf::is_network_filesystem(0x01021997));        // 9p
  CHECK(hf::is_network_filesystem(0x00C36400));        // Ceph
  CHECK_FALSE(hf::is_network_filesystem(0xEF53));      // ext2/3/4
  CHECK_FALSE(hf::is_network_filesystem(0x58465342));  // XFS
  CHECK_FALSE(hf::is_network_filesystem(0x01021994));  // tmpfs
  CHECK_FALSE(hf::is_network_filesystem(0x9123683E));  // btrfs
  CHECK_FALSE(hf::is_network_filesystem(0));
}

TEST_CASE_TEMPLATE("on a network filesystem puts lock through a read-write descriptor", Io, nfs_io,
                   unnamed_network_io) {
  holdfast_test::temp_dir dir("cache");
  using cache_t =
      hf::basic_file_cache<hf::mmap_read, hf::flock_lock, hf::sync_never, hf::pfio_format, Io>;
  cache_t cache(hf::create_cache, 8, in(dir));
  nfs_io::ebadf() = 0;
  CHECK(cache.put(0, "first"));  // was: holdfast::error "flock" EBADF on every put
  CHECK(cache.put(1, "second"));
  CHECK((::fcntl(cache.lock_handle(), F_GETFL) & O_ACCMODE) == O_RDWR);
  // statfs named NFS: read-write from the start; an unnamed one: after one EBADF
  CHECK(nfs_io::ebadf() == (std::is_same_v<Io, nfs_io> ? 0 : 1));
  // and the record lock excludes another process: hold it as a put would, a child's put waits
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  REQUIRE(::fcntl(cache.lock_handle(), F_SETLK, &fl) == 0);
  pipe_pair done;
  holdfast_test::child kid([&] {
    CHILD_REQUIRE(cache.put(2, "child"));
    done.signal();
  });
  CHECK_FALSE(done.wait(400));
  CHECK_FALSE(cache.contains(2));
  fl.l_type = F_UNLCK;
  REQUIRE(::fcntl(cache.lock_handle(), F_SETLK, &fl) == 0);
  CHECK(done.wait(10000));
  auto r = kid.wait(std::chrono::seconds(10));
  INFO(r.failures);
  CHECK(r.ok());
  CHECK(*cache.get(2) == "child");
  CHECK(*cache.get(0) == "first");
}
