// benchmarks/two_tier_bench.cpp — the two-tier figures (issue 35, item 5): its own executable,
// holdfast_two_tier_bench, since its cases write gigabytes and run for minutes.
//
//   holdfast_two_tier_bench [--runs N] [--step-runs N] [--quick] [--dir D] [--shm D]
//
// A state is 4 shards in memory (a fixed byte pattern), written by the writer as 4 files.
//   1. local/<size>/<dir>: two_tier_checkpoints::save() (local_sums off, the default) to the local
//      tier, against a bare save of the same shards into the same directory: mkdir a temporary
//      directory, each file written and fsynced, the directory fsynced, renamed to its name, the
//      parent fsynced. 256 MiB and 1 GiB (--quick: 256 MiB only); local tier on the disk
//      (--dir, default /tmp) and on the RAM disk (--shm, default /dev/shm). The durable tier of
//      these saves is on the RAM disk, and the copy is waited for (untimed) before the next run.
//   2. durable/<size>: the same save straight to the durable tier made slow on purpose —
//      checkpoint_manager over a throttled Io policy (every write paced at 100 MiB/s, 20 ms
//      added to every fsync and fdatasync: a network mount), on the disk — against the two-tier
//      save of row 1 (the preemption path's blocked time: the local save only). Interleaved with
//      row 1 (bare, two-tier, slow durable, bare, ...).
//   3. steps/256MiB: a training-like loop (a fixed arithmetic kernel of ~50 ms per step, 32
//      steps, a save after steps 4, 14 and 24) saving 256 MiB through two_tier_checkpoints
//      (local tier on the RAM disk, durable on the disk, unthrottled: the copier as busy as it
//      gets), with the copier at the process's priority and at copier_nice 19, against the same
//      loop saving through a checkpoint_manager on the same RAM disk (no copy). The figure is
//      each run's mean step time (the kernel only, saves excluded), the median of N runs each
//      (--step-runs, default 9), the three interleaved, and the ratio.
// Each figure is a median of --runs (default 5) runs; every run uses fresh directories, made and
// removed outside the timing. Quote ratios: the machines are shared.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <holdfast/checkpoint/two_tier.hpp>
#include <holdfast/error.hpp>
#include <holdfast/io.hpp>
#include <holdfast/store.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench.hpp"        // summarize
#include "environment.hpp"  // bench::environment: the first line

namespace {

using clk = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr int shards = 4;
constexpr double throttle_bytes_per_s = 100.0 * 1024 * 1024;   // the slow durable tier's writes
constexpr auto throttle_sync = std::chrono::milliseconds(20);  // ... and each of its syncs

double seconds_since(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

// posix_io with writes paced at throttle_bytes_per_s and every sync 20 ms longer: a network
// mount's durable tier on a local disk.
struct throttled_io : holdfast::posix_io {
  static void pace(ssize_t n) {
    if (n > 0)
      std::this_thread::sleep_for(
          std::chrono::duration<double>(static_cast<double>(n) / throttle_bytes_per_s));
  }
  static ssize_t write(int fd, const void* buf, std::size_t n) noexcept {
    ssize_t r = holdfast::posix_io::write(fd, buf, n);
    pace(r);
    return r;
  }
  static ssize_t pwrite(int fd, const void* buf, std::size_t n, off_t off) noexcept {
    ssize_t r = holdfast::posix_io::pwrite(fd, buf, n, off);
    pace(r);
    return r;
  }
  static int fsync(int fd) noexcept {
    std::this_thread::sleep_for(throttle_sync);
    return holdfast::posix_io::fsync(fd);
  }
  static int fdatasync(int fd) noexcept {
    std::this_thread::sleep_for(throttle_sync);
    return holdfast::posix_io::fdatasync(fd);
  }
};
using slow_store = holdfast::basic_store<holdfast::basic_local_filesystem<throttled_io>>;

// The state: `shards` buffers of a fixed pattern (not zeros: no filesystem shortcut).
struct state {
  std::vector<std::vector<char>> parts;
  explicit state(std::size_t bytes) {
    for (int i = 0; i < shards; ++i) {
      std::vector<char> p(bytes / shards);
      for (std::size_t k = 0; k < p.size(); ++k)
        p[k] = static_cast<char>((k * 2654435761u + static_cast<std::size_t>(i)) >> 13);
      parts.push_back(std::move(p));
    }
  }
  std::size_t bytes() const { return parts.size() * parts[0].size(); }
};

void write_file(const std::string& path, const std::vector<char>& data, bool sync) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw holdfast::error(errno, "open", path);
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, std::min(data.size() - done, 8 * mib));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw holdfast::error(errno, "write", path);
    done += static_cast<std::size_t>(n);
  }
  if (sync && ::fsync(fd) != 0) throw holdfast::error(errno, "fsync", path);
  if (::close(fd) != 0) throw holdfast::error(errno, "close", path);
}

void sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw holdfast::error(errno, "open", dir);
  int r = ::fsync(fd);
  ::close(fd);
  if (r != 0) throw holdfast::error(errno, "fsync", dir);
}

// The writer every holdfast save uses: the shards as files through `Io` (the tier's: the slow
// durable tier paces the user's writes too), no syncs (the manager syncs).
template <class Io = holdfast::posix_io>
auto writer_of(const state& s) {
  return [&s](const std::string& dir) {
    for (std::size_t i = 0; i < s.parts.size(); ++i) {
      const std::string path = dir + "/shard-" + std::to_string(i) + ".bin";
      auto fd = holdfast::open_file<Io>(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
      for (std::size_t done = 0; done < s.parts[i].size(); done += 8 * mib)
        holdfast::write_all(fd, s.parts[i].data() + done,
                            std::min(8 * mib, s.parts[i].size() - done));
      fd.close();
    }
  };
}

// The bare save: tmp dir, files written and fsynced, dir fsynced, renamed, parent fsynced.
double bare_save(const state& s, const std::string& parent) {
  fs::create_directories(parent);
  auto t0 = clk::now();
  const std::string tmp = parent + "/.tmp-ckpt", final_dir = parent + "/ckpt";
  if (::mkdir(tmp.c_str(), 0755) != 0) throw holdfast::error(errno, "mkdir", tmp);
  for (std::size_t i = 0; i < s.parts.size(); ++i)
    write_file(tmp + "/shard-" + std::to_string(i) + ".bin", s.parts[i], true);
  sync_dir(tmp);
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    throw holdfast::error(errno, "rename", final_dir);
  sync_dir(parent);
  return seconds_since(t0);
}

holdfast::two_tier_options quiet_options() {
  holdfast::two_tier_options o;
  o.local.max_to_keep = 2;
  o.durable.max_to_keep = 1;
  o.durable_wait = std::chrono::milliseconds(600000);
  o.log = [](std::string_view line) {
    std::fprintf(stderr, "# log: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  return o;
}

// The two-tier save of `s` (local tier in `local`, durable in `durable`): the save's seconds;
// the durable copy is waited for after, untimed.
double two_tier_save(const state& s, const std::string& local, const std::string& durable) {
  holdfast::two_tier_checkpoints<> t(local, holdfast::directory_commit::rename, durable,
                                     holdfast::directory_commit::rename, quiet_options());
  auto t0 = clk::now();
  t.save(1, writer_of(s));
  double took = seconds_since(t0);
  auto left = t.wait_for_durable(clk::now() + std::chrono::minutes(10));
  if (!left.empty()) throw std::runtime_error("the durable copy did not finish");
  return took;
}

// The save of `s` straight to the throttled durable directory.
double slow_durable_save(const state& s, const std::string& dir) {
  holdfast::checkpoint_options o;
  o.async_save = false;
  holdfast::checkpoint_manager<slow_store> m(dir, holdfast::directory_commit::rename, o);
  auto t0 = clk::now();
  m.save(1, writer_of<throttled_io>(s));
  return seconds_since(t0);
}

double median(std::vector<double> v) { return bench::summarize(std::move(v)).median; }

std::string list(const std::vector<double>& v, double scale, const char* fmt) {
  std::string out;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, fmt, x * scale);
    out += (out.empty() ? "" : " ") + std::string(buf);
  }
  return out;
}

struct paths {
  std::string disk, shm;
};

// Rows 1 and 2 for one size: bare, two-tier (local on disk), slow durable, bare on the RAM disk,
// two-tier (local on the RAM disk), interleaved per run.
void save_rows(std::size_t bytes, int runs, const paths& p) {
  state s(bytes);
  const std::string size = bytes >= 1024 * mib ? std::to_string(bytes / (1024 * mib)) + "GiB"
                                               : std::to_string(bytes / mib) + "MiB";
  std::vector<double> bare_disk, tt_disk, slow, bare_shm, tt_shm;
  for (int r = 0; r < runs; ++r) {
    const std::string d = p.disk + "/run", m = p.shm + "/run";
    auto fresh = [](const std::string& dir) {
      fs::remove_all(dir);
      fs::create_directories(dir);
    };
    fresh(d);
    fresh(m);
    ::sync();  // what the last run left dirty is not this run's cost
    bare_disk.push_back(bare_save(s, d + "/bare"));
    tt_disk.push_back(two_tier_save(s, d + "/local", m + "/durable"));
    fresh(m);
    ::sync();
    slow.push_back(slow_durable_save(s, d + "/slow-durable"));
    fs::remove_all(d);
    ::sync();
    bare_shm.push_back(bare_save(s, m + "/bare"));
    tt_shm.push_back(two_tier_save(s, m + "/local", m + "/durable"));
    fresh(m);
  }
  fs::remove_all(p.disk + "/run");
  fs::remove_all(p.shm + "/run");
  auto row = [&](const char* name, const std::vector<double>& a, const char* bname,
                 const std::vector<double>& b) {
    std::printf("%-34s median %7.3f s  vs %-40s %7.3f s  ratio %.3f  (runs %s | %s)\n",
                (name + std::string("/") + size).c_str(), median(a), bname, median(b),
                median(a) / median(b), list(a, 1, "%.3f").c_str(), list(b, 1, "%.3f").c_str());
  };
  row("local(disk)/two_tier.save", tt_disk, "bare write+fsync+rename (same dir)", bare_disk);
  row("local(RAM disk)/two_tier.save", tt_shm, "bare write+fsync+rename (same dir)", bare_shm);
  std::printf(
      "%-34s median %7.3f s  vs two_tier.save (local on disk)           %7.3f s  saving %.2f s "
      "(%.1fx)  (runs %s)\n",
      ("durable(throttled)/direct save/" + size).c_str(), median(slow), median(tt_disk),
      median(slow) - median(tt_disk), median(slow) / median(tt_disk),
      list(slow, 1, "%.3f").c_str());
  std::fflush(stdout);
}

// A fixed arithmetic kernel: `n` rounds of mul-adds over a small array in cache.
double kernel(std::size_t n) {
  static double a[512];
  double acc = 0;
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < 512; ++i) {
      a[i] = a[i] * 0.999999 + 1e-9 * static_cast<double>(i + r);
      acc += a[i];
    }
  return acc;
}

// Rounds of kernel() that take about `target` seconds (the median of 5 tries).
std::size_t calibrate(double target) {
  volatile double sink = 0;
  std::size_t n = 256;
  for (;;) {
    auto t0 = clk::now();
    sink = sink + kernel(n);
    if (seconds_since(t0) > 0.01) break;
    n *= 2;
  }
  std::vector<double> per;
  for (int i = 0; i < 5; ++i) {
    auto t0 = clk::now();
    sink = sink + kernel(n);
    per.push_back(seconds_since(t0) / static_cast<double>(n));
  }
  return static_cast<std::size_t>(target / median(per));
}

// One training-like run: 32 steps, a save after steps 4, 14 and 24 (each copy has 8 steps or
// more to run beside); the mean step time (the kernel only).
template <class Save>
double training_run(std::size_t rounds, Save&& save) {
  volatile double sink = 0;
  double total = 0;
  const int steps = 32;
  for (int step = 1; step <= steps; ++step) {
    auto t0 = clk::now();
    sink = sink + kernel(rounds);
    total += seconds_since(t0);
    if (step % 10 == 4) save(step);
  }
  return total / steps;
}

// The loop saving through two_tier_checkpoints (copier at `nice`); its mean step time.
double run_with_copy(const state& s, std::size_t rounds, const paths& p, int nice,
                     std::vector<double>& durable_steps) {
  const std::string d = p.disk + "/steps", m = p.shm + "/steps";
  auto o = quiet_options();
  o.copier_nice = nice;
  holdfast::two_tier_checkpoints<> t(m + "/local", holdfast::directory_commit::rename,
                                     d + "/durable", holdfast::directory_commit::rename, o);
  double mean = training_run(rounds, [&](int step) { t.save(step, writer_of(s)); });
  t.wait_for_durable(clk::now() + std::chrono::minutes(10));
  durable_steps.push_back(static_cast<double>(t.durable_step().value_or(0)));
  return mean;
}

void step_rows(int runs, const paths& p) {
  state s(256 * mib);
  const std::size_t rounds = calibrate(0.050);
  std::vector<double> off, on, on_nice, durable_steps;
  const std::string d = p.disk + "/steps", m = p.shm + "/steps";
  auto fresh = [&] {  // no sync(): every run fsynced what it wrote
    fs::remove_all(d);
    fs::remove_all(m);
  };
  for (int r = 0; r < runs; ++r) {
    fresh();
    {
      holdfast::checkpoint_options o;
      o.async_save = false;
      o.max_to_keep = 2;
      holdfast::checkpoint_manager<> mgr(m + "/plain", holdfast::directory_commit::rename, o);
      off.push_back(training_run(rounds, [&](int step) { mgr.save(step, writer_of(s)); }));
    }
    fresh();
    on.push_back(run_with_copy(s, rounds, p, 0, durable_steps));
    fresh();
    on_nice.push_back(run_with_copy(s, rounds, p, 19, durable_steps));
  }
  fs::remove_all(d);
  fs::remove_all(m);
  auto row = [&](const char* name, const std::vector<double>& v) {
    std::printf(
        "%-44s mean step median %6.1f ms  vs copy off %6.1f ms  ratio %.3f  (median of %d; %s "
        "| off: %s ms)\n",
        name, median(v) * 1e3, median(off) * 1e3, median(v) / median(off), runs,
        list(v, 1e3, "%.1f").c_str(), list(off, 1e3, "%.1f").c_str());
  };
  row("steps/256MiB/background copy on", on);
  row("steps/256MiB/background copy on, copier_nice 19", on_nice);
  std::printf("#   durable step after each run (24 = the last save's copy reached it): %s\n",
              list(durable_steps, 1, "%.0f").c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5, step_runs = 9;
  bool quick = false;
  paths p{"/tmp", "/dev/shm"};
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--runs"))
      runs = std::max(1, std::atoi(value()));
    else if (!std::strcmp(argv[i], "--step-runs"))
      step_runs = std::max(1, std::atoi(value()));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--dir"))
      p.disk = value();
    else if (!std::strcmp(argv[i], "--shm"))
      p.shm = value();
    else {
      std::fprintf(stderr,
                   "usage: %s [--runs N] [--step-runs N] [--quick] [--dir DISK] [--shm RAMDISK]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string tag = "/holdfast-two-tier-bench-" + std::to_string(::getpid());
  p.disk += tag;
  p.shm += tag;
  try {
    fs::create_directories(p.disk);
    fs::create_directories(p.shm);
    std::printf("%s\n", bench::environment().c_str());
    std::printf(
        "two tiers: disk '%s', RAM disk '%s'; median of %d runs (steps: %d); the slow durable "
        "tier: writes paced at 100 MiB/s, +20 ms per fsync, on the disk\n",
        p.disk.c_str(), p.shm.c_str(), runs, step_runs);
    std::fflush(stdout);
    auto t0 = clk::now();
    save_rows(256 * mib, runs, p);
    if (!quick) save_rows(1024 * mib, runs, p);
    step_rows(step_runs, p);
    std::printf("# %.0f s in all\n", seconds_since(t0));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "holdfast_two_tier_bench: %s\n", e.what());
    fs::remove_all(p.disk);
    fs::remove_all(p.shm);
    return 1;
  }
  fs::remove_all(p.disk);
  fs::remove_all(p.shm);
  return 0;
}
