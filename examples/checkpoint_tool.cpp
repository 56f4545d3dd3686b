// checkpoint_tool — look at, check and repair a run's checkpoint directory.
//
//   checkpoint_tool list   [options] DIR    the checkpoints in use (step, name, history, saved at,
//                                           metrics; history "-" when unknown; the hang
//                                           detector's bounds below, when recorded) and the
//                                           pointer's state; changes nothing
//   checkpoint_tool verify [options] DIR    exit 0 when the pointer is sound and every checkpoint
//                                           it keeps is complete, with each file's size and
//                                           CRC32C as its save recorded them, else 1 (naming
//                                           the first bad file of each); changes nothing
//   checkpoint_tool repair [options] DIR    takes the writer lock (waiting --timeout), sweeps
//                                           what killed saves left, and rewrites a bad pointer
//                                           from the complete checkpoints on disk
//   checkpoint_tool demo   [options] --steps N DIR
//                                           writes N small checkpoints, to try the tool on
//
// DIR is a checkpoint directory: <store>/runs/<run_id>/checkpoint.
// Options: --marker      commit-marker mode (a mounted remote: gcsfuse, DBFS, an HDFS gateway)
//          --prefix P    the run's step_prefix (default "step-")
//          --width N     zero-padding of new names (demo)
//          --timeout MS  how long repair and demo wait for the writer lock (default 0)
// Exit codes: 0 ok, 1 problems found (verify) or the writer lock is held, 2 usage or I/O error.
#include <time.h>  // gmtime_r: times in UTC

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <holdfast/checkpoint.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace hf = holdfast;

namespace {

struct args {
  std::string command, dir;
  bool marker = false;
  std::string prefix = "step-";
  std::size_t width = 0;
  long long timeout_ms = 0;
  long long steps = 0;
};

int usage() {
  std::fprintf(stderr,
               "usage: checkpoint_tool list|verify|repair [--marker] [--prefix P] [--timeout MS] "
               "DIR\n"
               "       checkpoint_tool demo [--marker] [--prefix P] [--width N] --steps N DIR\n");
  return 2;
}

hf::checkpoint_options options_of(const args& a) {
  hf::checkpoint_options o;
  o.max_to_keep = 0;  // the tool never deletes checkpoints by retention
  o.step_prefix = a.prefix;
  o.step_format_fixed_length = a.width;
  o.writer_lock_timeout = std::chrono::milliseconds(a.timeout_ms);
  o.log = [](std::string_view line) {
    std::fprintf(stderr, "checkpoint_tool: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  return o;
}

hf::directory_commit mode_of(const args& a) {
  return a.marker ? hf::directory_commit::marker : hf::directory_commit::rename;
}

std::string seconds(std::chrono::nanoseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", static_cast<double>(d.count()) / 1e9);
  return buf;
}

std::string utc(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  if (!gmtime_r(&secs, &tm)) return "?";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

const char* state_name(hf::pointer_state s) {
  switch (s) {
    case hf::pointer_state::ok:
      return "ok";
    case hf::pointer_state::missing:
      return "missing";
    case hf::pointer_state::garbled:
      return "garbled";
    case hf::pointer_state::dangling:
      return "dangling";
  }
  return "?";
}

void print_report(const hf::checkpoint_report& r) {
  std::printf("pointer: %s%s%s\n", state_name(r.pointer), r.problem.empty() ? "" : " — ",
              r.problem.c_str());
  for (const auto& m : r.missing) std::printf("missing: %s (kept by the pointer)\n", m.c_str());
  for (const auto& u : r.unnamed)
    std::printf("unnamed: %s (complete, not named by the pointer)\n", u.c_str());
  for (const auto& l : r.leftovers) std::printf("leftover: %s\n", l.c_str());
}

int list(const args& a) {
  hf::checkpoint_manager<> m(hf::read_only, a.dir, mode_of(a), options_of(a));
  auto r = m.verify();
  std::printf("%s: %zu checkpoint%s\n", a.dir.c_str(), r.checkpoints.size(),
              r.checkpoints.size() == 1 ? "" : "s");
  for (std::size_t i = 0; i < r.checkpoints.size(); ++i) {
    const auto& c = r.checkpoints[i];
    auto meta = m.metadata(c.step);
    std::string when = meta ? utc(meta->time) : "-";
    std::string history = meta && meta->identity().known() ? meta->history : "-";
    std::string metrics =
        meta && !meta->metrics.is_null() ? hf::detail::to_json(meta->metrics) : "-";
    std::printf("  %12lld  %-24s %-16s %-20s %s%s\n", static_cast<long long>(c.step),
                c.name.c_str(), history.c_str(), when.c_str(), metrics.c_str(),
                i + 1 == r.checkpoints.size() ? "  (latest)" : "");
    if (meta && meta->hang)  // what a restarted handler's hang detector starts from
      std::printf("  %12s  hang bounds: step %s, save %s, restore %s, %llu steps timed\n", "",
                  seconds(meta->hang->step).c_str(), seconds(meta->hang->save).c_str(),
                  seconds(meta->hang->restore).c_str(),
                  static_cast<unsigned long long>(meta->hang->steps));
  }
  print_report(r);
  return 0;
}

// Checks one checkpoint directory: the pointer and completeness (verify()), then each
// checkpoint's files against the sizes and CRC32Cs recorded at save. True when all is well.
bool verify_directory(const args& a, const std::string& dir) {
  hf::checkpoint_manager<> m(hf::read_only, dir, mode_of(a), options_of(a));
  auto r = m.verify();
  print_report(r);
  bool intact = true;
  for (std::int64_t step : m.all_steps()) {
    hf::checkpoint_integrity c = m.verify_step(step);
    std::string name = c.path.substr(c.path.rfind('/') + 1);
    if (c.corrupt()) {
      intact = false;
      std::printf("corrupt: %s/%s (%s: %s)\n", name.c_str(), c.file.c_str(),
                  hf::to_string(c.status), c.detail.c_str());
    } else if (c.status == hf::integrity_status::unverified) {
      std::printf("unverified: %s (%s)\n", name.c_str(), c.detail.c_str());
    }
  }
  if (!r.ok()) std::printf("verify: problems found (checkpoint_tool repair)\n");
  if (!intact) std::printf("verify: corrupt checkpoints (restore() skips them)\n");
  if (r.ok() && intact) std::printf("verify: ok\n");
  return r.ok() && intact;
}

int verify(const args& a) { return verify_directory(a, a.dir) ? 0 : 1; }

int repair(const args& a) {
  hf::checkpoint_manager<> m(a.dir, mode_of(a), options_of(a));  // the writer lock, the sweep
  auto r = m.repair();
  print_report(r);
  std::printf("repair: %s, latest %s\n", r.ok() ? "ok" : "incomplete",
              r.checkpoints.empty() ? "none" : r.checkpoints.back().name.c_str());
  return r.ok() || r.checkpoints.empty() ? 0 : 1;
}

int demo(const args& a) {
  if (a.steps <= 0) return usage();
  hf::checkpoint_manager<> m(a.dir, mode_of(a), options_of(a));
  m.begin_history("demo");  // what the handler's restore agreement sets: list shows it
  std::int64_t first = m.latest_step() ? *m.latest_step() + 1 : 0;
  for (std::int64_t step = first; step < first + a.steps; ++step) {
    // what the handler's hang detector sets before each save: list shows it
    m.set_hang_bounds({std::chrono::milliseconds(20), std::chrono::milliseconds(150),
                       std::chrono::milliseconds(0), static_cast<std::uint64_t>(step + 1) * 100});
    m.save(step,
           [](const std::string& d, std::int64_t s) {
             auto fd = hf::open_file(d + "/state", O_WRONLY | O_CREAT | O_EXCL, 0644);
             std::string text = "step " + std::to_string(s) + "\n";
             hf::write_all(fd, text.data(), text.size());
             fd.close();
           },
           {{"loss", 1.0 / static_cast<double>(step + 1)}});
  }
  std::printf("demo: saved steps %lld..%lld in %s\n", static_cast<long long>(first),
              static_cast<long long>(first + a.steps - 1), a.dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  args a;
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (s == "--marker") {
      a.marker = true;
    } else if (s == "--prefix" || s == "--width" || s == "--timeout" || s == "--steps") {
      const char* v = value();
      if (!v) return usage();
      if (s == "--prefix")
        a.prefix = v;
      else if (s == "--width")
        a.width = static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
      else if (s == "--timeout")
        a.timeout_ms = std::strtoll(v, nullptr, 10);
      else
        a.steps = std::strtoll(v, nullptr, 10);
    } else if (!s.empty() && s[0] == '-') {
      return usage();
    } else if (a.dir.empty()) {
      a.dir = s;
    } else {
      return usage();
    }
  }
  if (a.dir.empty()) return usage();
  try {
    if (a.command == "list") return list(a);
    if (a.command == "verify") return verify(a);
    if (a.command == "repair") return repair(a);
    if (a.command == "demo") return demo(a);
    return usage();
  } catch (const hf::checkpoint_locked& e) {
    std::fprintf(stderr, "checkpoint_tool: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_tool: %s\n", e.what());
    return 2;
  }
}
