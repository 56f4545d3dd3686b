// Artifact store: a checkpoint save (64 MiB in 16 files, retention on) against the same bytes
// written with the same bare syscalls and durability; an async save of the same 64 MiB on a
// disk-backed directory (never tmpfs): the time the training thread is blocked against the
// synchronous durable save, and a CPU-bound step run while the async commit goes on against the
// same step alone; and a sync of 1,000 unchanged files against a bare readdir + lstat walk.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>  // statfs: the async cases need a disk, not tmpfs
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <holdfast/checkpoint.hpp>
#include <holdfast/store.hpp>
#include <string>
#include <vector>

#include "bench.hpp"

namespace {

constexpr std::size_t kShards = 16;
constexpr std::size_t kShardBytes = std::size_t{4} << 20;  // 16 x 4 MiB = 64 MiB
constexpr std::size_t kKeep = 2;

std::string scratch_root(const char* tag) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(base && *base ? base : "/tmp") + "/holdfast-bench-" + tag + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) std::abort();
  return tmpl;
}

const std::vector<char>& shard_bytes() {
  static const std::vector<char> data = [] {
    std::vector<char> d(kShardBytes);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<char>((i * 131) ^ (i >> 12));
    return d;
  }();
  return data;
}

void check(bool ok) {
  if (!ok) std::abort();
}

void bare_write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    check(w > 0);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void bare_sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  check(fd >= 0 && ::fsync(fd) == 0 && ::close(fd) == 0);
}

// --- save ------------------------------------------------------------------------------------

using bench_store = holdfast::basic_store<holdfast::local_filesystem>;

struct save_fixture {
  std::string root = scratch_root("save");
  bench_store store = bench_store::create(root);
  holdfast::checkpoint_manager<bench_store> manager{store, "run", {kKeep}};
  std::int64_t step = 0;
  // The baseline's own checkpoint directory.
  std::string bare = root + "/bare";
  std::int64_t bare_step = 0;
  save_fixture() { check(::mkdir(bare.c_str(), 0755) == 0); }
  ~save_fixture() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

save_fixture& save_state() {
  static save_fixture f;
  return f;
}

void holdfast_save() {
  auto& f = save_state();
  f.manager.save(f.step++, [](const std::string& dir) {
    const auto& data = shard_bytes();
    for (std::size_t i = 0; i < kShards; ++i) {
      auto fd = holdfast::open_file(dir + "/shard-" + std::to_string(i),
                                    O_WRONLY | O_CREAT | O_EXCL, 0644);
      holdfast::write_all(fd, data.data(), data.size());
      fd.close();
    }
  });
}

// The pointer publish, bare: temp, write, fsync, close, rename, directory fsync.
void bare_pointer(const std::string& dir, const std::string& text) {
  std::string temp = dir + "/.tmp-latest";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  check(fd >= 0);
  bare_write_all(fd, text.data(), text.size());
  check(::fsync(fd) == 0 && ::close(fd) == 0);
  check(::rename(temp.c_str(), (dir + "/latest").c_str()) == 0);
  bare_sync_dir(dir);
}

void bare_save() {
  auto& f = save_state();
  const std::string& dir = f.bare;
  std::int64_t step = f.bare_step++;
  // Read the previous pointer, as a save does.
  int pfd = ::open((dir + "/latest").c_str(), O_RDONLY | O_CLOEXEC);
  if (pfd >= 0) {
    char buf[4096];
    while (::read(pfd, buf, sizeof buf) > 0) {
    }
    ::close(pfd);
  }
  std::string staging = dir + "/.staging-" + std::to_string(step);
  std::string target = dir + "/step-" + std::to_string(step);
  check(::mkdir(staging.c_str(), 0755) == 0);
  const auto& data = shard_bytes();
  for (std::size_t i = 0; i < kShards; ++i) {
    std::string p = staging + "/shard-" + std::to_string(i);
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    check(fd >= 0);
    bare_write_all(fd, data.data(), data.size());
    check(::fsync(fd) == 0 && ::close(fd) == 0);
  }
  bare_sync_dir(staging);
  check(::syscall(SYS_renameat2, AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), 1u) == 0);
  bare_sync_dir(dir);
  std::string text = "holdfast-checkpoints 1\nlatest step-" + std::to_string(step) + "\n";
  bare_pointer(dir, text);
  if (step >= static_cast<std::int64_t>(kKeep)) {  // retention: the oldest goes
    std::string old = dir + "/step-" + std::to_string(step - static_cast<std::int64_t>(kKeep));
    std::string aside = dir + "/.deleting-" + std::to_string(step);
    check(::rename(old.c_str(), aside.c_str()) == 0);
    bare_sync_dir(dir);
    for (std::size_t i = 0; i < kShards; ++i)
      check(::unlink((aside + "/shard-" + std::to_string(i)).c_str()) == 0);
    check(::rmdir(aside.c_str()) == 0);
    bare_pointer(dir, text);
  }
}

bench::registrar save_case{{"store/save/64MiB-16files/durable", bench::timed([](std::size_t n) {
                              for (std::size_t i = 0; i < n; ++i) holdfast_save();
                            }),
                            "bare 16 x (write+fsync) + rename + dirsyncs",
                            bench::timed([](std::size_t n) {
                              for (std::size_t i = 0; i < n; ++i) bare_save();
                            }),
                            bench::config{1, 9, 1, 0}}};

// --- async save --------------------------------------------------------------------------------

// True when `dir` is on a filesystem with a disk under it (not tmpfs or ramfs, where fsync is
// free and an async save would have nothing to hide).
bool on_disk(const std::string& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return false;
  auto type = static_cast<std::uint32_t>(st.f_type);
  return type != 0x01021994u && type != 0x858458F6u;
}

// A scratch directory on a disk: $TMPDIR, /var/tmp, /tmp or the working directory, the first
// that is not tmpfs.
std::string disk_scratch_root(const char* tag) {
  const char* env = std::getenv("TMPDIR");
  for (std::string base : {std::string(env && *env ? env : ""), std::string("/var/tmp"),
                           std::string("/tmp"), std::string(".")}) {
    if (base.empty() || !on_disk(base)) continue;
    std::string tmpl = base + "/holdfast-bench-" + tag + "-XXXXXX";
    if (::mkdtemp(tmpl.data())) return tmpl;
  }
  std::abort();  // no disk-backed directory to measure on
}

void write_shards(const std::string& dir) {
  const auto& data = shard_bytes();
  for (std::size_t i = 0; i < kShards; ++i) {
    auto fd =
        holdfast::open_file(dir + "/shard-" + std::to_string(i), O_WRONLY | O_CREAT | O_EXCL, 0644);
    holdfast::write_all(fd, data.data(), data.size());
    fd.close();
  }
}

holdfast::checkpoint_options async_options() {
  holdfast::checkpoint_options o{kKeep};
  o.async_save = true;
  return o;
}

// A CPU-bound training step: arithmetic over a cache-resident buffer, about 20 ms.
struct cpu_step {
  std::vector<std::uint64_t> state = std::vector<std::uint64_t>(8192, 1);
  std::size_t rounds = 1;
  cpu_step() {
    using clock = std::chrono::steady_clock;
    for (;;) {
      auto t0 = clock::now();
      run();
      if (clock::now() - t0 >= std::chrono::milliseconds(20) || rounds > (std::size_t{1} << 24))
        break;
      rounds *= 2;
    }
  }
  void run() {
    std::uint64_t x = state[0];
    for (std::size_t r = 0; r < rounds; ++r)
      for (auto& v : state) {
        x = x * 6364136223846793005ull + v;
        v = x ^ (x >> 29);
      }
    state[0] = x;
  }
};

struct async_fixture {
  std::string root = disk_scratch_root("async");
  bench_store store = bench_store::create(root);
  holdfast::checkpoint_manager<bench_store> async_manager{store, "async", async_options()};
  holdfast::checkpoint_manager<bench_store> sync_manager{store, "sync", {kKeep}};
  std::int64_t async_step = 0, sync_step = 0;
  cpu_step step;
  ~async_fixture() {
    async_manager.wait_until_finished();
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

async_fixture& async_state() {
  static async_fixture f;
  return f;
}

double ns_of(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::nano>(d).count();
}

// The time save() blocks the training thread; the previous save's commit is waited for outside
// the timing (a loop that saves less often than a commit takes never waits there).
double async_save_blocked(std::size_t n) {
  auto& f = async_state();
  double ns = 0;
  for (std::size_t i = 0; i < n; ++i) {
    f.async_manager.wait_until_finished();
    auto t0 = std::chrono::steady_clock::now();
    f.async_manager.save(f.async_step++, write_shards);
    ns += ns_of(std::chrono::steady_clock::now() - t0);
  }
  f.async_manager.wait_until_finished();
  return ns;
}

// One step while an async save's commit (fsyncs, rename, pointer, retention) runs.
double step_during_save(std::size_t n) {
  auto& f = async_state();
  double ns = 0;
  for (std::size_t i = 0; i < n; ++i) {
    f.async_manager.wait_until_finished();
    f.async_manager.save(f.async_step++, write_shards);
    auto t0 = std::chrono::steady_clock::now();
    f.step.run();
    ns += ns_of(std::chrono::steady_clock::now() - t0);
  }
  f.async_manager.wait_until_finished();
  return ns;
}

bench::registrar async_blocked_case{{"store/async_save/blocked/64MiB", async_save_blocked,
                                     "synchronous durable save (same dir)",
                                     bench::timed([](std::size_t n) {
                                       auto& f = async_state();
                                       for (std::size_t i = 0; i < n; ++i)
                                         f.sync_manager.save(f.sync_step++, write_shards);
                                     }),
                                     bench::config{1, 9, 1, 0}}};

bench::registrar async_step_case{{"store/async_save/step_during_save", step_during_save,
                                  "the same CPU-bound step alone", bench::timed([](std::size_t n) {
                                    auto& f = async_state();
                                    for (std::size_t i = 0; i < n; ++i) f.step.run();
                                  }),
                                  bench::config{1, 9, 1, 0}}};

// --- sync of unchanged files -----------------------------------------------------------------

constexpr int kDirs = 10;
constexpr int kFilesPerDir = 100;

std::size_t bare_walk(const std::string& dir);

struct sync_fixture {
  std::string root = scratch_root("sync");
  std::string local = root + "/local";
  std::size_t walked = 0;  // what the bare walk finds: the files, and sync's .holdfast-origin
  bench_store store = bench_store::create(root + "/remote");
  sync_fixture() {
    check(::mkdir(local.c_str(), 0755) == 0);
    for (int d = 0; d < kDirs; ++d) {
      std::string dir = local + "/d" + std::to_string(d);
      check(::mkdir(dir.c_str(), 0755) == 0);
      for (int i = 0; i < kFilesPerDir; ++i) {
        std::string p = dir + "/f" + std::to_string(i);
        int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        check(fd >= 0);
        bare_write_all(fd, p.data(), p.size());
        check(::close(fd) == 0);
        // An old mtime: files written just before a sync are copied once more by the next.
        timespec ts[2] = {{1330712280, 0}, {1330712280, 0}};
        check(::utimensat(AT_FDCWD, p.c_str(), ts, 0) == 0);
      }
    }
    auto r = store.sync("run", local);  // the first pass copies; measured passes find no change
    check(r.copied.size() == static_cast<std::size_t>(kDirs * kFilesPerDir));
    walked = bare_walk(local);
    check(walked >= static_cast<std::size_t>(kDirs * kFilesPerDir));
  }
  ~sync_fixture() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

sync_fixture& sync_state() {
  static sync_fixture f;
  return f;
}

// A bare walk: opendir/readdir every directory and lstat every entry.
std::size_t bare_walk(const std::string& dir) {
  std::size_t files = 0;
  DIR* d = ::opendir(dir.c_str());
  check(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0)))
      continue;
    std::string p = dir + "/" + e->d_name;
    struct stat st {};
    check(::lstat(p.c_str(), &st) == 0);
    if (S_ISDIR(st.st_mode))
      files += bare_walk(p);
    else
      ++files;
  }
  ::closedir(d);
  return files;
}

bench::registrar sync_case{{"store/sync/1000-unchanged", bench::timed([](std::size_t n) {
                              auto& f = sync_state();
                              for (std::size_t i = 0; i < n; ++i) {
                                auto r = f.store.sync("run", f.local);
                                check(r.copied.empty() &&
                                      r.unchanged.size() == kDirs * kFilesPerDir);
                              }
                            }),
                            "bare readdir + lstat walk", bench::timed([](std::size_t n) {
                              auto& f = sync_state();
                              for (std::size_t i = 0; i < n; ++i)
                                check(bare_walk(f.local) == f.walked);
                            })}};

}  // namespace
