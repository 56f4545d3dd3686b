// checkpoint_manager with several processes (real fork): read_only openers that never modify
// anything, the writer lock (flock; the lease where flock is not trusted) with its timeout and
// its holder named, an overlapping restart, retention leaving a checkpoint being read for the
// next save, a trainer saving in a loop beside processes that open the run read-only and
// restore 300 times, and SIGKILL at random moments of async saves.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>  // unshare(CLONE_NEWPID): a writer in another PID namespace
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>  // waitpid: the writer forked inside the new PID namespace
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <holdfast/checkpoint.hpp>
#include <holdfast/wait.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/files.hpp"
#include "support/sanitizers.hpp"
#include "support/shm_temp_dir.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using holdfast::checkpoint_lock;
using holdfast::checkpoint_manager;
using holdfast::checkpoint_options;
using holdfast::directory_commit;
using holdfast_test::sanitized;
using steps_t = std::vector<std::int64_t>;
using namespace std::chrono_literals;

namespace {

using holdfast_test::read_file;
using holdfast_test::write_plain;

// A flag file another process waits for (published whole).
void signal_file(const std::string& path, const std::string& content = "1") {
  holdfast::publisher().publish(path, content);
}

std::string payload(std::int64_t step, const std::string& f, std::size_t size) {
  std::string head = "step=" + std::to_string(step) + " file=" + f + ";";
  std::string s;
  s.reserve(size);
  while (s.size() < size) s += head;
  s.resize(size);
  return s;
}

using file_list = std::vector<std::pair<std::string, std::size_t>>;
const file_list small_files = {{"weights.bin", 20000}, {"optimizer.bin", 9000}, {"step.txt", 40}};
const file_list big_files = {
    {"a.bin", 1 << 20}, {"b.bin", 1 << 20}, {"c.bin", 1 << 20}, {"d.bin", 1 << 20}};

void write_files(const std::string& dir, std::int64_t step, const file_list& files) {
  for (const auto& [name, size] : files) {
    auto fd = holdfast::open_file(dir + "/" + name, O_WRONLY | O_CREAT | O_EXCL, 0644);
    std::string p = payload(step, name, size);
    holdfast::write_all(fd, p.data(), p.size());
    fd.close();
  }
}

// True when `dir` holds exactly the checkpoint of `step`.
bool complete(const std::string& dir, std::int64_t step, const file_list& files = small_files) {
  for (const auto& [name, size] : files) {
    std::error_code ec;
    if (!fs::exists(dir + "/" + name, ec)) return false;
    if (read_file(dir + "/" + name) != payload(step, name, size)) return false;
  }
  return true;
}

void write_small(const std::string& dir, std::int64_t step) { write_files(dir, step, small_files); }

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

struct log_lines {
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  holdfast::log_fn sink() const {
    auto l = lines;
    return [l](std::string_view line) { l->emplace_back(line); };
  }
  bool any(const std::string& part) const {
    for (const auto& l : *lines)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }
};

template <class F>
long long elapsed_ms(F f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

}  // namespace

TEST_CASE("read_only: never creates, sweeps, deletes or publishes — save refuses") {
  holdfast_test::temp_dir dir("ro");
  const std::string d = dir / "ckpt";
  {
    checkpoint_manager<> missing(holdfast::read_only, d, directory_commit::rename);
    CHECK(!missing.latest());
    CHECK(!missing.restore());
    CHECK(missing.all_steps().empty());
    CHECK(missing.is_read_only());
    CHECK(!fs::exists(d));  // not even the directory
  }
  {
    checkpoint_manager<> w(d, directory_commit::rename, {3});
    w.save(1, write_small);
    w.save(2, write_small);
  }
  // Leftovers a writer's sweep would remove, and a pointer listing a deletion.
  write_plain(d + "/.staging-step-3-999-1/weights.bin", "half");
  write_plain(d + "/.deleting-step-0-999-2/x", "y");
  write_plain(d + "/.holdfast-tmp.999.0123456789abcdef.latest", "partial");
  fs::create_directories(d + "/step-9");
  write_small(d + "/step-9", 9);
  fs::copy(d + "/step-2", d + "/step-0", fs::copy_options::recursive);
  write_plain(d + "/latest",
              "holdfast-checkpoints 1\nlatest step-2\nkeep step-1\nkeep step-2\ndelete step-0\n");
  const auto before = entries(d);
  const std::string pointer = read_file(d + "/latest");
  struct stat st0 {};
  ::stat(d.c_str(), &st0);

  checkpoint_manager<> ro(holdfast::read_only, d, directory_commit::rename);
  CHECK(ro.latest()->step == 2);
  CHECK(ro.all_steps() == steps_t{1, 2});
  std::int64_t loaded = -1;
  CHECK(ro.restore(
            [&](const std::string& p, std::int64_t s) { loaded = complete(p, s) ? s : -2; }) == 2);
  CHECK(loaded == 2);
  ro.restore_step(1,
                  [&](const std::string& p, std::int64_t s) { loaded = complete(p, s) ? s : -2; });
  CHECK(loaded == 1);
  CHECK(!ro.should_save(10));
  try {
    ro.save(10, write_small);
    FAIL("a read_only manager saved");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EROFS);
    CHECK(std::string(e.what()).find("read_only") != std::string::npos);
  }
  CHECK_THROWS_AS(ro.repair(), holdfast::error);
  ro.wait_until_finished();  // nothing in flight: returns
  auto report = ro.verify();
  CHECK(report.leftovers.size() == 4);  // staging, deleting, temp, listed deletion step-0
  CHECK(report.unnamed == std::vector<std::string>{"step-9"});

  CHECK(entries(d) == before);
  CHECK(read_file(d + "/latest") == pointer);
  struct stat st1 {};
  ::stat(d.c_str(), &st1);
  CHECK(st1.st_mtim.tv_sec == st0.st_mtim.tv_sec);
  CHECK(st1.st_mtim.tv_nsec == st0.st_mtim.tv_nsec);  // no entry added or removed, even briefly
}

TEST_CASE("a second writer waits writer_lock_timeout, then names the holder — a restart waits") {
  holdfast_test::temp_dir dir("lock");
  const std::string d = dir / "ckpt";
  holdfast_test::child holder([&] {
    checkpoint_manager<> m(d, directory_commit::rename, {2});
    CHILD_REQUIRE(m.uses_flock());
    m.save(1, write_small);
    signal_file(dir / "ready");
    // holds the lock until the parent's refused openers are done (not for a time they must fit)
    CHILD_REQUIRE(holdfast::await_file(dir / "go", 60s));
    m.save(2, write_small);  // undisturbed by the refused opener
  });
  REQUIRE(holdfast::await_file(dir / "ready", 20s));
  CHECK(fs::exists(d + "/.writer.lock"));

  checkpoint_options o{2};
  o.writer_lock_timeout = 200ms;
  long long waited = elapsed_ms([&] {
    try {
      checkpoint_manager<> m(d, directory_commit::rename, o);
      FAIL("a second writer got the lock");
    } catch (const holdfast::checkpoint_locked& e) {
      CHECK(e.errnum() == EBUSY);
      CHECK(e.holder_pid() == holder.pid());
      CHECK(e.holder_host() == hostname());
      std::string what = e.what();
      CHECK(what.find("pid " + std::to_string(holder.pid())) != std::string::npos);
      CHECK(what.find("host '" + hostname() + "'") != std::string::npos);
      CHECK(what.find(d + "/.writer.lock") != std::string::npos);
      CHECK(what.find("waited 200 ms") != std::string::npos);
    }
  });
  CHECK(waited >= 200);
  CHECK(waited < 1200);

  // In this process too: another manager is another writer.
  o.writer_lock_timeout = 0ms;
  CHECK_THROWS_AS(checkpoint_manager<>(d, directory_commit::rename, o),
                  holdfast::checkpoint_locked);

  // An overlapping restart: the new writer waits for the old one to go, then carries on. The
  // holder saves step 2 only after "go" and keeps the lock until it exits, so a restore of
  // step 2 below shows the new writer waited for it.
  o.writer_lock_timeout = 20s;
  signal_file(dir / "go");
  std::optional<checkpoint_manager<>> next;
  next.emplace(d, directory_commit::rename, o);
  auto res = holder.wait(20s);
  CHECK(res.ok());
  CHECK(res.failures.empty());
  std::int64_t loaded = -1;
  CHECK(next->restore(
            [&](const std::string& p, std::int64_t s) { loaded = complete(p, s) ? s : -2; }) == 2);
  CHECK(loaded == 2);
  next->save(3, write_small);
  CHECK(next->all_steps() == steps_t{2, 3});
}

TEST_CASE(
    "another task's checkpoint directory fails at once, naming both tasks — flock and lease") {
  // Two tasks of a job given one directory: the second waited writer_lock_timeout (30 s) and
  // then named a pid; with owners it fails at once, naming both and the fix. The same owner (a
  // relaunch of that task while its predecessor finishes) still waits.
  for (auto how : {checkpoint_lock::flock, checkpoint_lock::lease}) {
    INFO((how == checkpoint_lock::flock ? "flock" : "lease"));
    holdfast_test::temp_dir dir("owner");
    const std::string d = dir / "ckpt";
    checkpoint_options o{2};
    o.lock = how;
    o.owner = "task 0";
    holdfast_test::child holder([&] {
      checkpoint_manager<> m(d, directory_commit::rename, o);
      m.save(1, write_small);
      signal_file(dir / "ready");
      CHILD_REQUIRE(holdfast::await_file(dir / "go", 60s));
    });
    REQUIRE(holdfast::await_file(dir / "ready", 20s));
    o.owner = "task 1";
    o.writer_lock_timeout = 20s;  // not waited for
    long long took = elapsed_ms([&] {
      try {
        checkpoint_manager<> m(d, directory_commit::rename, o);
        FAIL("task 1 got task 0's writer lock");
      } catch (const holdfast::checkpoint_locked& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(e.errnum() == EBUSY);
        CHECK(e.holder_pid() == holder.pid());
        CHECK(e.holder_owner() == "task 0");
        CHECK(what.find("held by task 0, pid " + std::to_string(holder.pid())) !=
              std::string::npos);
        CHECK(what.find("task 1 opened the checkpoint directory of task 0: each task needs a "
                        "directory of its own") != std::string::npos);
        CHECK(what.find(d) != std::string::npos);
      }
    });
    CHECK(took < 2000);
    // the same owner waits (a predecessor of task 0 still finishing), as before
    o.owner = "task 0";
    o.writer_lock_timeout = 200ms;
    took = elapsed_ms([&] {
      CHECK_THROWS_AS(checkpoint_manager<>(d, directory_commit::rename, o),
                      holdfast::checkpoint_locked);
    });
    CHECK(took >= 200);
    signal_file(dir / "go");
    CHECK(holder.wait(20s).ok());
    o.owner = "task 1";  // released: any owner may take it
    checkpoint_manager<> after(d, directory_commit::rename, o);
    CHECK(after.all_steps() == steps_t{1});
  }
}

namespace {

// Pretends every file is on NFS (statfs f_type 0x6969): flock is not trusted there.
struct nfs_io : holdfast::posix_io {
  static int fstatfs(int fd, struct statfs* st) noexcept {
    int r = ::fstatfs(fd, st);
    st->f_type = 0x6969;
    return r;
  }
};
using nfs_store = holdfast::basic_store<holdfast::basic_local_filesystem<nfs_io>>;

}  // namespace

TEST_CASE("where statfs names no local filesystem, the writer lease with a heartbeat") {
  holdfast_test::temp_dir dir("lease");
  CHECK(holdfast::is_flock_trusted_filesystem(0xEF53));
  CHECK(holdfast::is_flock_trusted_filesystem(0x01021994));
  CHECK(!holdfast::is_flock_trusted_filesystem(0x6969));      // NFS
  CHECK(!holdfast::is_flock_trusted_filesystem(0x65735546));  // FUSE
  auto s = nfs_store::create(dir / "nfs");
  checkpoint_options o{1};
  {
    checkpoint_manager<nfs_store> m(s, "r", o);
    CHECK(!m.uses_flock());
    CHECK(fs::exists(m.directory() + "/.writer.lease"));
    CHECK(!fs::exists(m.directory() + "/.writer.lock"));
    CHECK(read_file(m.directory() + "/.writer.lease")
              .find("pid " + std::to_string(::getpid()) + "\nhost " + hostname() + "\n") !=
          std::string::npos);
    m.save(1, write_small);
    // Readers take no lock there (documented): retention may delete what a reader loads.
    checkpoint_manager<nfs_store> ro(holdfast::read_only, s, "r");
    ro.restore_step(1, [&](const std::string&) {
      m.save(2, write_small);
      CHECK(!fs::exists(m.directory() + "/step-1"));
    });
  }
  CHECK(!fs::exists(s.checkpoint_path("r") + "/.writer.lease"));  // released
}

TEST_CASE("the lease: refused while its holder beats, taken over when stale or its pid is gone") {
  holdfast_test::temp_dir dir("lease2");
  const std::string d = dir / "ckpt";
  const std::string lease = d + "/.writer.lease";
  log_lines log;
  checkpoint_options o{2};
  o.lock = checkpoint_lock::lease;
  o.lease_stale_after = 600ms;
  o.writer_lock_timeout = 200ms;
  o.log = log.sink();

  holdfast_test::child holder([&] {
    checkpoint_manager<> m(d, directory_commit::rename, o);
    m.save(1, write_small);
    signal_file(dir / "ready");
    for (;;) std::this_thread::sleep_for(1s);  // alive, beating, until killed
  });
  REQUIRE(holdfast::await_file(dir / "ready", 20s));
  std::this_thread::sleep_for(900ms);  // longer than lease_stale_after: only the heartbeat helps
  try {
    checkpoint_manager<> m(d, directory_commit::rename, o);
    FAIL("the lease of a live holder was taken");
  } catch (const holdfast::checkpoint_locked& e) {
    CHECK(e.holder_pid() == holder.pid());
    CHECK(e.holder_host() == hostname());
  }
  holder.kill(SIGKILL);
  holder.wait();
  CHECK(fs::exists(lease));  // a killed holder leaves its lease
  o.writer_lock_timeout = 5s;
  long long waited = elapsed_ms([&] {
    checkpoint_manager<> m(d, directory_commit::rename, o);  // its pid is gone on this host
    CHECK(m.all_steps() == steps_t{1});
  });
  CHECK(waited < 500);  // at once, not after lease_stale_after
  CHECK(log.any("its process is gone"));
  CHECK(!fs::exists(lease));

  // Another host's lease: stale by its age only.
  const std::string foreign = "holdfast-writer 1\npid 4242\nhost elsewhere.example\n";
  write_plain(lease, foreign);
  o.writer_lock_timeout = 200ms;
  try {
    checkpoint_manager<> m(d, directory_commit::rename, o);
    FAIL("a fresh foreign lease was taken");
  } catch (const holdfast::checkpoint_locked& e) {
    CHECK(e.holder_pid() == 4242);
    CHECK(e.holder_host() == "elsewhere.example");
  }
  fs::last_write_time(lease, fs::file_time_type::clock::now() - 10s);
  {
    checkpoint_manager<> m(d, directory_commit::rename, o);
    CHECK(log.any("of pid 4242 on host 'elsewhere.example' taken over: no heartbeat for"));

    // Taken over behind its back (as after a pause longer than lease_stale_after): the
    // heartbeat or the next save notices, and the save fails instead of writing beside another.
    fs::rename(lease, d + "/.lease-aside");
    write_plain(lease, foreign);
    const std::string before = read_file(d + "/latest");
    try {
      m.save(5, write_small);
      FAIL("a writer that lost its lease saved");
    } catch (const holdfast::checkpoint_locked& e) {
      CHECK(e.holder_host() == "elsewhere.example");
      CHECK(std::string(e.what()).find("taken over") != std::string::npos);
    }
    CHECK(read_file(d + "/latest") == before);
  }
  CHECK(read_file(lease) == foreign);  // not ours: left in place
}

TEST_CASE("retention leaves a checkpoint being read for the next save") {
  holdfast_test::temp_dir dir("held");
  const std::string d = dir / "ckpt";
  std::optional<checkpoint_manager<>> w;
  w.emplace(d, directory_commit::rename, checkpoint_options{1});
  w->save(1, write_small);
  checkpoint_manager<> r(holdfast::read_only, d, directory_commit::rename);
  bool inside = false;
  CHECK(r.restore([&](const std::string& p, std::int64_t step) {
    inside = true;
    w->save(2, write_small);  // keep 1: step-1 is due for deletion, but held (LOCK_SH)
    w->save(3, write_small);
    CHECK(complete(p, step));
    CHECK(fs::exists(d + "/step-1"));
    CHECK(!fs::exists(d + "/step-2"));
    CHECK(read_file(d + "/latest") ==
          "holdfast-checkpoints 1\nlatest step-3\nkeep step-3\ndelete step-1\n");
    CHECK(w->all_steps() == steps_t{3});
    CHECK(r.all_steps() == steps_t{3});
  }) == 1);
  CHECK(inside);
  w->save(4, write_small);  // released: now it goes
  CHECK(!fs::exists(d + "/step-1"));
  CHECK(read_file(d + "/latest") == "holdfast-checkpoints 1\nlatest step-4\nkeep step-4\n");
  w.reset();

  // The start-up sweep too: a listed deletion a reader holds stays, still listed.
  fs::copy(d + "/step-4", d + "/step-5", fs::copy_options::recursive);
  fs::remove(d + "/step-5/holdfast-metadata.json");  // step-5's own: a copy of step 4's is not
  holdfast::detail::checkpoint_write_metadata<holdfast::posix_io>(
      d + "/step-5", 5, std::chrono::system_clock::now(), nullptr);
  r.restore_step(4, [&](const std::string& p) {
    write_plain(d + "/latest",
                "holdfast-checkpoints 1\nlatest step-5\nkeep step-5\ndelete step-4\n");
    w.emplace(d, directory_commit::rename, checkpoint_options{1});
    CHECK(fs::exists(p));
    CHECK(read_file(d + "/latest") ==
          "holdfast-checkpoints 1\nlatest step-5\nkeep step-5\ndelete step-4\n");
  });
  w->save(6, write_small);
  CHECK(!fs::exists(d + "/step-4"));
  CHECK(read_file(d + "/latest") == "holdfast-checkpoints 1\nlatest step-6\nkeep step-6\n");
}

TEST_CASE("a trainer saving beside processes that open the run read-only and restore 300 times") {
  holdfast_test::shm_temp_dir dir("side");
  auto s = holdfast::store::create(dir / "store");
  const std::string stop = dir / "stop";
  const int readers = 3;
  const int restores_each = 100;
  const int intruder_opens = 20;

  holdfast_test::child trainer([&] {
    checkpoint_manager<> m(s, "run", {2});  // retention 2
    auto l = m.restore();
    std::int64_t step = l ? *l + 1 : 0;
    long saves = 0, failed = 0, deferred = 0;
    std::string first_error;
    while (!fs::exists(stop)) {
      try {
        m.save(step, write_small);
        ++saves;
        if (read_file(m.pointer_path()).find("\ndelete ") != std::string::npos) ++deferred;
      } catch (const std::exception& e) {
        if (!failed) first_error = e.what();
        ++failed;
      }
      if (step == 0) signal_file(dir / "ready");
      ++step;
    }
    write_plain(dir / "trainer", std::to_string(saves) + " " + std::to_string(failed) + " " +
                                     std::to_string(deferred) + " " + std::to_string(step - 1) +
                                     "\n" + first_error);
    CHILD_REQUIRE(failed == 0);
  });
  REQUIRE(holdfast::await_file(dir / "ready", 20s));

  std::vector<holdfast_test::child> procs;
  procs.reserve(readers + 1);
  for (int r = 0; r < readers; ++r) {
    procs.emplace_back([&, r] {
      long ok = 0, bad = 0, none = 0;
      std::string first_error;
      for (int i = 0; i < restores_each; ++i) {
        try {
          checkpoint_manager<> ro(holdfast::read_only, s, "run");  // a fresh open each time
          bool good = false;
          auto step = ro.restore([&](const std::string& p, std::int64_t st) {
            // The metadata by path: the writer may have listed this one for deletion (it
            // waits for this reader), so metadata(st), which asks the pointer, may not find it.
            const std::string mpath = p + "/holdfast-metadata.json";
            auto meta = holdfast::detail::parse_checkpoint_metadata(read_file(mpath), mpath);
            good = complete(p, st) && meta && meta->step == st;
          });
          if (!step)
            ++none;
          else if (good)
            ++ok;
          else
            ++bad;
        } catch (const std::exception& e) {
          if (first_error.empty()) first_error = e.what();
          ++bad;
        }
      }
      write_plain(dir / ("reader-" + std::to_string(r)),
                  std::to_string(ok) + " " + std::to_string(bad) + " " + std::to_string(none) +
                      "\n" + first_error);
      CHILD_REQUIRE(bad == 0);
    });
  }
  // A would-be second writer with no patience (an overlapping restart): refused, harmlessly.
  procs.emplace_back([&] {
    int refused = 0;
    checkpoint_options o{2};
    o.writer_lock_timeout = 0ms;
    for (int i = 0; i < intruder_opens; ++i) {
      try {
        checkpoint_manager<> m(s, "run", o);
      } catch (const holdfast::checkpoint_locked&) {
        ++refused;
      }
    }
    write_plain(dir / "intruder", std::to_string(refused));
    CHILD_REQUIRE(refused == intruder_opens);
  });
  for (auto& p : procs) {
    auto res = p.wait(std::chrono::seconds(sanitized ? 600 : 120));
    CHECK(res.ok());
    CHECK(res.failures == "");
  }
  signal_file(stop);
  auto tres = trainer.wait(60s);
  CHECK(tres.ok());
  CHECK(tres.failures == "");

  long saves = 0, failed = -1, deferred = 0, last = -1;
  std::istringstream(read_file(dir / "trainer")) >> saves >> failed >> deferred >> last;
  long ok = 0, bad = 0, none = 0;
  for (int r = 0; r < readers; ++r) {
    long o = 0, b = 0, n = 0;
    std::istringstream in(read_file(dir / ("reader-" + std::to_string(r))));
    in >> o >> b >> n;
    ok += o;
    bad += b;
    none += n;
    std::string rest;
    std::getline(in, rest);
    std::getline(in, rest);
    CHECK(rest == "");  // the first error, if any
  }
  CHECK(failed == 0);
  CHECK(bad == 0);
  CHECK(ok == readers * restores_each);
  CHECK(none == 0);
  CHECK(saves > 10);
  CHECK(read_file(dir / "intruder") == std::to_string(intruder_opens));

  // The trainer's next start restores the newest checkpoint, complete; nothing is left over.
  checkpoint_manager<> m(s, "run", {2});
  std::int64_t loaded = -1;
  CHECK(m.restore([&](const std::string& p, std::int64_t st) {
    loaded = complete(p, st) ? st : -2;
  }) == last);
  CHECK(loaded == last);
  auto report = m.verify();
  CHECK(report.ok());
  CHECK(report.leftovers.empty());
  CHECK(report.unnamed.empty());
  MESSAGE("trainer: " << saves << " saves, " << failed << " failed, " << deferred
                      << " with a deletion left for later (a reader held it); readers: " << ok
                      << " good restores, " << bad << " bad, " << none << " empty; "
                      << intruder_opens << " writer opens refused; restart restored step "
                      << loaded);
}

namespace {

// One async trial: a child commits step K synchronously, starts an async save of K+1 (4 MiB)
// and trains on; the parent kills it at a random moment after save() returned.
struct async_outcome {
  int previous = 0;  // the kill landed in the commit: step K stays the latest
  int next = 0;      // after the commit: step K+1 is the latest
};

void async_kill_trials(const std::string& d, directory_commit mode, int trials, std::uint64_t seed,
                       async_outcome& out) {
  std::mt19937_64 rng(seed);
  // How long an async commit of 4 MiB takes here, to aim the kills across it.
  long long commit_us = 0;
  {
    checkpoint_options o{2};
    o.async_save = true;
    checkpoint_manager<> m(d + "-calibrate", mode, o);
    m.save(0, [](const std::string& p, std::int64_t st) { write_files(p, st, big_files); });
    auto t0 = std::chrono::steady_clock::now();
    m.wait_until_finished();
    commit_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  commit_us = std::max<long long>(commit_us, 500);
  std::int64_t last_seen = -1;
  for (int t = 0; t < trials; ++t) {
    CAPTURE(t);
    const std::string flag = d + "-launched-" + std::to_string(t);
    holdfast_test::child c([&] {
      checkpoint_options o{2};
      o.async_save = true;
      checkpoint_manager<> m(d, mode, o);
      auto l = m.restore();
      std::int64_t k = l ? *l + 1 : 0;
      m.save(k, [](const std::string& p, std::int64_t st) { write_files(p, st, big_files); });
      m.wait_until_finished();  // K is committed
      m.save(k + 1, [](const std::string& p, std::int64_t st) { write_files(p, st, big_files); });
      // save() returned: the commit runs in background. The flag is an atomic publish without
      // syncs (no_sync), not a durable one, whose fsyncs put time between save() returning and the
      // parent's wake (in one asan CI run all 16 kills landed after the commit).
      holdfast::basic_publisher<holdfast::no_sync>().publish(flag, std::to_string(k));
      volatile double x = 0;
      for (;;) x = x + 1.0;  // training goes on
    });
    auto k_text = holdfast::await_file(flag, 60s);
    REQUIRE(k_text);
    const std::int64_t k = std::stoll(*k_text);
    // in the first half of the calibrated commit: a child's commit after its first save is
    // shorter than the calibrating one (up to 4x under asan), so half the kills still land after
    auto delay = std::uniform_int_distribution<long long>(0, commit_us / 2)(rng);
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
    c.kill(SIGKILL);
    auto res = c.wait(30s);
    CHECK(res.term_signal == SIGKILL);
    CHECK(res.failures == "");

    checkpoint_manager<> m(d, mode, {2});
    auto l = m.latest();
    REQUIRE(l);
    CHECK((l->step == k || l->step == k + 1));
    CHECK(complete(l->path, l->step, big_files));
    CHECK(l->step > last_seen);
    for (const auto& ck : m.checkpoints()) CHECK(complete(ck.path, ck.step, big_files));
    CHECK(m.verify().ok());
    if (l->step == k)
      ++out.previous;
    else
      ++out.next;
    last_seen = l->step;
  }
}

}  // namespace

TEST_CASE("SIGKILL during an async save: the previous checkpoint stays the latest, complete") {
  // A disk-backed directory: the commit's fsyncs take real time, so kills land inside it.
  holdfast_test::temp_dir dir("asynckill");
  const int trials = sanitized ? 8 : 24;
  async_outcome rename_out, marker_out;
  // The invariants hold in every trial; until some kill landed inside a commit (what the trials
  // are for), up to two more batches, each on fresh directories.
  for (int batch = 0; batch < 3 && rename_out.previous + marker_out.previous == 0; ++batch) {
    const std::string b = std::to_string(batch);
    const auto seed = static_cast<std::uint64_t>(batch) * 100;
    async_kill_trials(dir / ("rename-" + b), directory_commit::rename, trials, 5 + seed,
                      rename_out);
    async_kill_trials(dir / ("marker-" + b), directory_commit::marker, trials, 9 + seed,
                      marker_out);
  }
  MESSAGE("rename mode: " << rename_out.previous << " kills inside the commit (step K kept), "
                          << rename_out.next << " after it; marker mode: " << marker_out.previous
                          << " inside, " << marker_out.next << " after");
  CHECK(rename_out.previous + marker_out.previous > 0);  // some kills landed inside a commit
}

namespace {
// Runs `fn` in a process of a new PID namespace (as in a container that shares the hostname but
// not the PID namespace: a host-network pod): a child unshares CLONE_NEWPID and forks `fn` as
// the namespace's pid 1. Returns fn's exit code, or 77 when the kernel refused the namespace.
template <class F>
holdfast_test::child_result in_new_pid_namespace(F fn, std::chrono::milliseconds timeout) {
  holdfast_test::child c([&] {
    if (::unshare(CLONE_NEWPID) != 0) ::_exit(77);
    pid_t inner = ::fork();
    if (inner < 0) ::_exit(78);
    if (inner == 0) {
      fn();  // CHILD_REQUIRE reports through the pipe this process inherited
      ::_exit(0);
    }
    int status = 0;
    while (::waitpid(inner, &status, 0) < 0 && errno == EINTR) {
    }
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
  });
  return c.wait(timeout);
}
}  // namespace

TEST_CASE("the lease: a live writer in another PID namespace on this host keeps it") {
  // Invariant: while its holder is alive and beating, nobody else takes the lease, even where
  // kill(holder pid, 0) answers ESRCH because the holder's pid lives in another PID namespace;
  // the holder's next save then succeeds.
  holdfast_test::temp_dir dir("lease-pidns");
  const std::string d = dir / "ckpt";
  const std::string lease = d + "/.writer.lease";
  checkpoint_options o{2};
  o.lock = checkpoint_lock::lease;
  o.lease_stale_after = 20s;  // the heartbeat stays fresh: only the pid check can tell them apart
  o.writer_lock_timeout = 300ms;

  holdfast_test::child holder([&] {
    checkpoint_manager<> m(d, directory_commit::rename, o);
    m.save(1, write_small);
    signal_file(dir / "ready");
    CHILD_REQUIRE(holdfast::await_file(dir / "go", 60s));
    m.save(2, write_small);  // still the writer: check() finds its own lease
    CHILD_REQUIRE(m.all_steps() == steps_t({1, 2}));
  });
  REQUIRE(holdfast::await_file(dir / "ready", 20s));
  const std::string holder_pid = "pid " + std::to_string(holder.pid()) + "\n";
  REQUIRE(read_file(lease).find(holder_pid) != std::string::npos);

  auto r = in_new_pid_namespace(
      [&] {
        CHILD_REQUIRE(::getpid() == 1);  // the holder's pid is not in this namespace: ESRCH
        CHILD_REQUIRE(::kill(holder.pid(), 0) != 0 && errno == ESRCH);
        try {
          checkpoint_manager<> m(d, directory_commit::rename, o);
          const bool took_a_live_writers_lease = true;
          CHILD_REQUIRE(!took_a_live_writers_lease);
        } catch (const holdfast::checkpoint_locked& e) {
          CHILD_REQUIRE(e.holder_pid() == holder.pid());
        }
      },
      20s);
  if (r.exit_code == 77)
    FAIL("unshare(CLONE_NEWPID) was refused (this test needs root or CAP_SYS_ADMIN"
         << (std::getenv("CI") ? "; CI must run the tests as root" : "") << ")");
  CHECK(r.failures == "");
  CHECK(r.ok());
  CHECK(read_file(lease).find(holder_pid) != std::string::npos);  // still the holder's
  signal_file(dir / "go");
  auto h = holder.wait(20s);
  CHECK(h.failures == "");
  CHECK(h.ok());
}

TEST_CASE("the lease: a dead pid is trusted only where the lease names this PID namespace") {
  // Invariant: kill(pid, 0) = ESRCH makes a fresh lease stale only when the lease names this
  // host, PID namespace and boot; a lease without them (0.1.0) or naming another PID namespace
  // is stale by its heartbeat only.
  holdfast_test::temp_dir dir("lease-scope");
  const std::string d = dir / "ckpt";
  const std::string lease = d + "/.writer.lease";
  const auto here = holdfast::detail::checkpoint_local_pid_scope();
  REQUIRE(here.known());  // /proc is mounted where the tests run
  const std::string text = holdfast::detail::checkpoint_holder_text(7, "h", "n", here);
  CHECK(text.find("pidns " + here.pidns + "\n") != std::string::npos);
  CHECK(holdfast::detail::checkpoint_parse_pid_scope(text).same_as(here));
  CHECK(!holdfast::detail::checkpoint_parse_pid_scope("holdfast-writer 1\npid 7\n").known());

  holdfast_test::child gone([] {});  // a pid that no longer names a process
  const long gone_pid = gone.pid();  // wait() forgets it
  REQUIRE(gone.wait(20s).ok());
  const std::string pid = std::to_string(gone_pid);
  const std::string old_format = "holdfast-writer 1\npid " + pid + "\nhost " + hostname() + "\n";
  const std::string other_ns = old_format + "pidns pid:[1]\nboot " + here.boot + "\n";
  const std::string this_ns = old_format + "pidns " + here.pidns + "\nboot " + here.boot + "\n";
  log_lines log;
  checkpoint_options o{2};
  o.lock = checkpoint_lock::lease;
  o.lease_stale_after = 20s;
  o.writer_lock_timeout = 300ms;
  o.log = log.sink();
  { checkpoint_manager<> m(d, directory_commit::rename, o); }  // creates the directory
  for (const std::string& fresh : {old_format, other_ns}) {
    write_plain(lease, fresh);
    try {
      checkpoint_manager<> m(d, directory_commit::rename, o);
      FAIL("a fresh lease was taken on a pid check across PID namespaces: " << fresh);
    } catch (const holdfast::checkpoint_locked& e) {
      CHECK(e.holder_pid() == gone_pid);
    }
    fs::last_write_time(lease, fs::file_time_type::clock::now() - 30s);  // its heartbeat stopped
    { checkpoint_manager<> m(d, directory_commit::rename, o); }
    CHECK(log.any("of pid " + pid + " on host '" + hostname() + "' taken over: no heartbeat"));
    log.lines->clear();
  }
  write_plain(lease, this_ns);  // this PID namespace: the pid check is trusted, at once
  { checkpoint_manager<> m(d, directory_commit::rename, o); }
  CHECK(log.any("taken over: its process is gone"));
}
