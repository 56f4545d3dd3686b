// benchmarks/staged_save_bench.cpp — the staged-save figures of the core (issue 45, items 1 and
// 3): its own executable, holdfast_staged_save_bench, since its cases write gigabytes.
//
//   holdfast_staged_save_bench [--runs N] [--mib M ...] [--dir D]
//
// A state is 200 buffers (sizes from 64 KiB to about 4 MiB in a fixed pattern, scaled to M MiB
// in all; default M = 256 and 1024), filled with a fixed byte pattern, staged into 3 files by a
// checkpoint_manager's staged writer (checksums on, the default; a local disk: --dir, default
// /tmp). Rows, each the median of --runs (default 5) runs, case and baseline interleaved:
//   1. blocked/<M>MiB: how long save() blocks the caller (the staged copy into the reused,
//      warmed staging area, plus the save's bookkeeping), against a bare copy of the same
//      buffers into one buffer allocated once and written before (the limit). Goal (issue 45):
//      at most 1.2x.
//   2. committed/<M>MiB: from save() to the local tier holding the committed step (the
//      manager's on_commit hook: the copy, the staged write with its CRC32C, the metadata, the
//      syncs, the rename, the pointer), against a bare save of the same buffers: mkdir a
//      temporary directory, the three files written from the buffers and fsynced, the
//      directory fsynced, renamed to its name, the parent fsynced. Goal: at most 1.2x.
//      background/<M>MiB: to wait_until_finished()'s return, which adds retention's deletion of
//      the step that fell out (max_to_keep 2), against the same bare save (which deletes
//      nothing: its directory is removed outside the timing).
//   3. first-after-restore/<M>MiB: the blocked time of the first save of a fresh manager after
//      restore() (a relaunch: the area is sized and faulted in at restore), against the blocked
//      time of a later save of that manager. Goal: at most 1x (no slower).
//   4. rss/<M>MiB: resident memory after save 50 minus after save 5 (one manager, saves of the
//      same state), as a fraction of the state; and the staging area's size against the state.
//      Goal: at most 2 % and 1x.
// Quote ratios: the machines are shared.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <holdfast/checkpoint/manager.hpp>
#include <holdfast/io.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "bench.hpp"        // summarize
#include "environment.hpp"  // bench::environment: the first line

namespace {

using clk = std::chrono::steady_clock;
namespace fs = std::filesystem;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr int buffers = 200;

double seconds_since(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

// 200 buffers, M MiB in all, in three files: buffer i goes to file i % 3.
struct state {
  std::vector<std::vector<unsigned char>> bufs;
  std::size_t total = 0;
  explicit state(std::size_t total_mib) {
    std::vector<double> weights;
    for (int i = 0; i < buffers; ++i) weights.push_back(1.0 + (i * 37 % 64));
    double sum = 0;
    for (double w : weights) sum += w;
    for (int i = 0; i < buffers; ++i) {
      auto n = static_cast<std::size_t>(static_cast<double>(total_mib * mib) *
                                        weights[static_cast<std::size_t>(i)] / sum);
      n = std::max<std::size_t>(n / 64 * 64, 64 * 1024);
      bufs.emplace_back(n, static_cast<unsigned char>(i * 13 + 7));
      total += n;
    }
  }
  static const char* file_of(int i) {
    static const char* names[] = {"model.bin", "optimizer.bin", "extra.bin"};
    return names[i % 3];
  }
  void stage(holdfast::checkpoint_stage& s) const {
    for (int i = 0; i < buffers; ++i)
      s.write(file_of(i), bufs[static_cast<std::size_t>(i)].data(),
              bufs[static_cast<std::size_t>(i)].size());
  }
};

holdfast::checkpoint_options quiet() {
  holdfast::checkpoint_options o;
  o.max_to_keep = 2;
  o.log = [](std::string_view) {};
  return o;
}

void fsync_path(const std::string& p, int flags) {
  auto fd = holdfast::open_file<>(p, flags);
  if (::fsync(fd.get()) != 0) throw holdfast::error(errno, "fsync", p);
}

// The bare save: the three files written from the buffers, each fsynced, the directory fsynced,
// renamed, the parent fsynced.
void bare_save(const state& s, const std::string& parent, int n) {
  const std::string tmp = parent + "/.tmp-" + std::to_string(n);
  const std::string dst = parent + "/bare-" + std::to_string(n);
  if (::mkdir(tmp.c_str(), 0755) != 0) throw holdfast::error(errno, "mkdir", tmp);
  for (int f = 0; f < 3; ++f) {
    auto fd =
        holdfast::open_file<>(tmp + "/" + state::file_of(f), O_WRONLY | O_CREAT | O_EXCL, 0644);
    for (int i = f; i < buffers; i += 3)
      holdfast::write_all(fd, s.bufs[static_cast<std::size_t>(i)].data(),
                          s.bufs[static_cast<std::size_t>(i)].size());
    if (::fsync(fd.get()) != 0) throw holdfast::error(errno, "fsync", tmp);
    fd.close();
  }
  fsync_path(tmp, O_RDONLY | O_DIRECTORY);
  if (::rename(tmp.c_str(), dst.c_str()) != 0) throw holdfast::error(errno, "rename", dst);
  fsync_path(parent, O_RDONLY | O_DIRECTORY);
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

void row(const char* name, std::size_t m, double a, const char* base, double b) {
  std::printf("%-30s %10.4f s   %-26s %10.4f s   ratio %.3f\n",
              (std::string(name) + "/" + std::to_string(m) + "MiB").c_str(), a, base, b, a / b);
}

void run_size(std::size_t m, int runs, const std::string& root) {
  state s(m);
  const std::string dir = root + "/staged-" + std::to_string(m);
  const std::string bare = root + "/bare-" + std::to_string(m);
  fs::remove_all(dir);
  fs::remove_all(bare);
  fs::create_directories(bare);
  std::vector<unsigned char> limit(s.total, 1);  // the bare copy's buffer, allocated once, written
  std::vector<double> blocked, copied, committed, background, bare_saved;
  {
    holdfast::checkpoint_manager<> mgr(dir, holdfast::directory_commit::rename, quiet());
    mgr.set_writer([&](holdfast::checkpoint_stage& st) { s.stage(st); });
    clk::time_point hook;
    mgr.on_commit([&](const holdfast::checkpoint_info&) { hook = clk::now(); });
    std::int64_t step = 0;
    mgr.save(++step);  // the first save maps the area: warm-up
    mgr.wait_until_finished();
    for (int r = 0; r < runs + 1; ++r) {
      auto t0 = clk::now();
      std::size_t at = 0;
      for (const auto& b : s.bufs) {
        std::memcpy(limit.data() + at, b.data(), b.size());
        at += b.size();
      }
      const double c = seconds_since(t0);
      t0 = clk::now();
      mgr.save(++step);
      const double bl = seconds_since(t0);
      mgr.wait_until_finished();
      const double done = seconds_since(t0);
      const double cm = std::chrono::duration<double>(hook - t0).count();
      t0 = clk::now();
      bare_save(s, bare, r);
      const double bs = seconds_since(t0);
      fs::remove_all(bare + "/bare-" + std::to_string(r));
      if (r == 0) continue;  // warm-up
      copied.push_back(c);
      blocked.push_back(bl);
      committed.push_back(cm);
      background.push_back(done);
      bare_saved.push_back(bs);
    }
  }
  row("blocked", m, bench::summarize(blocked).median, "bare copy (warmed buffer)",
      bench::summarize(copied).median);
  row("committed", m, bench::summarize(committed).median, "bare write+fsync+rename",
      bench::summarize(bare_saved).median);
  row("background", m, bench::summarize(background).median, "bare write+fsync+rename",
      bench::summarize(bare_saved).median);

  // A relaunch: a fresh manager restores, then saves; against its later saves.
  std::vector<double> first, later;
  for (int r = 0; r < runs; ++r) {
    holdfast::checkpoint_manager<> mgr(dir, holdfast::directory_commit::rename, quiet());
    mgr.set_writer([&](holdfast::checkpoint_stage& st) { s.stage(st); });
    auto step = mgr.restore().value_or(0);
    auto t0 = clk::now();
    mgr.save(++step);
    first.push_back(seconds_since(t0));
    mgr.wait_until_finished();
    t0 = clk::now();
    mgr.save(++step);
    later.push_back(seconds_since(t0));
    mgr.wait_until_finished();
  }
  row("first-after-restore", m, bench::summarize(first).median, "a later save",
      bench::summarize(later).median);

  // Resident memory over 50 saves.
  {
    holdfast::checkpoint_manager<> mgr(dir, holdfast::directory_commit::rename, quiet());
    mgr.set_writer([&](holdfast::checkpoint_stage& st) { s.stage(st); });
    auto step = mgr.restore().value_or(0);
    long after5 = 0, after50 = 0;
    for (int i = 1; i <= 50; ++i) {
      mgr.save(++step);
      mgr.wait_until_finished();
      if (i == 5) after5 = rss_kib();
      if (i == 50) after50 = rss_kib();
    }
    const double grew = static_cast<double>(after50 - after5) * 1024.0;
    std::printf("%-30s %10.4f %%   staging area %.3fx the state (%zu of %zu bytes)\n",
                ("rss/" + std::to_string(m) + "MiB").c_str(),
                100.0 * grew / static_cast<double>(s.total),
                static_cast<double>(mgr.staging_capacity()) / static_cast<double>(s.total),
                mgr.staging_capacity(), s.total);
  }
  fs::remove_all(dir);
  fs::remove_all(bare);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  std::vector<std::size_t> sizes;
  std::string root = "/tmp";
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--runs" && i + 1 < argc)
      runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--mib" && i + 1 < argc)
      sizes.push_back(static_cast<std::size_t>(std::atol(argv[++i])));
    else if (a == "--dir" && i + 1 < argc)
      root = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: holdfast_staged_save_bench [--runs N] [--mib M ...] [--dir D]\n");
      return 2;
    }
  }
  if (sizes.empty()) sizes = {256, 1024};
  std::printf("%s\n", bench::environment().c_str());
  std::printf("staged saves: %d buffers, 3 files, checksums on, dir %s, median of %d runs\n",
              buffers, root.c_str(), runs);
  const std::string scratch = root + "/holdfast-staged-bench-" + std::to_string(::getpid());
  fs::create_directories(scratch);
  try {
    for (std::size_t m : sizes) run_size(m, runs, scratch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "holdfast_staged_save_bench: %s\n", e.what());
    fs::remove_all(scratch);
    return 1;
  }
  fs::remove_all(scratch);
  return 0;
}
