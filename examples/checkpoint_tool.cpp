// checkpoint_tool — look at, check and repair a run's checkpoint directory.
//
//   checkpoint_tool list   [options] DIR    the checkpoints in use (step, name, history, saved at,
//                                           metrics; history "-" when unknown; the hang
//                                           detector's bounds below, when recorded) and the
//                                           pointer's state; changes nothing
//   checkpoint_tool verify [options] DIR    exit 0 when the pointer is sound and every checkpoint
//                                           it keeps is complete and counts (holdfast's
//                                           metadata: else "skipped: NAME (why)"), with each
//                                           file's size and CRC32C as its save recorded them,
//                                           else 1 (naming the first bad file of each);
//                                           changes nothing
//   checkpoint_tool verify [options] --durable DDIR DIR
//                                           both tiers of two_tier_checkpoints (DIR the local,
//                                           DDIR the durable): each as above, every finding
//                                           prefixed with its tier ("local: ", "durable: "); a
//                                           local step without a durable copy is a warning
//                                           (the copier may be behind), a step whose two
//                                           copies differ in identity (history) a failure
//   checkpoint_tool repair [options] DIR    takes the writer lock (waiting --timeout), sweeps
//                                           what killed saves left, rewrites a bad pointer from
//                                           the complete checkpoints on disk that count, and
//                                           deletes the kept directories that do not
//   checkpoint_tool demo   [options] [--durable DDIR] --steps N DIR
//                                           writes N small checkpoints, to try the tool on
//                                           (with --durable: through two_tier_checkpoints, each
//                                           step copied to DDIR before the next is saved)
//
// DIR is a checkpoint directory: <store>/runs/<run_id>/checkpoint.
// Options: --marker      commit-marker mode (a mounted remote: gcsfuse, DBFS, an HDFS gateway)
//          --durable D   verify, demo: the durable tier's directory (DIR: the local tier's)
//          --durable-marker  the durable tier commits with markers
//          --prefix P    the run's step_prefix (default "step-")
//          --width N     zero-padding of new names (demo)
//          --timeout MS  how long repair and demo wait for the writer lock (default 0)
// Exit codes: 0 ok, 1 problems found (verify) or the writer lock is held, 2 usage or I/O error.
#include <time.h>  // gmtime_r: times in UTC

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <holdfast/checkpoint.hpp>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace hf = holdfast;

namespace {

struct args {
  std::string command, dir;
  std::string durable;  // verify: the durable tier (dir is then the local tier)
  bool marker = false;
  bool durable_marker = false;
  std::string prefix = "step-";
  std::size_t width = 0;
  long long timeout_ms = 0;
  long long steps = 0;
};

int usage() {
  std::fprintf(stderr,
               "usage: checkpoint_tool list|verify|repair [--marker] [--prefix P] [--timeout MS] "
               "DIR\n"
               "       checkpoint_tool verify [--marker] [--prefix P] --durable DDIR "
               "[--durable-marker] DIR\n"
               "       checkpoint_tool demo [--marker] [--prefix P] [--width N] [--durable DDIR] "
               "--steps N DIR\n");
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

hf::directory_commit mode_of(bool marker) {
  return marker ? hf::directory_commit::marker : hf::directory_commit::rename;
}
hf::directory_commit mode_of(const args& a) { return mode_of(a.marker); }

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

// `tier`: "" for one directory, else "local: " or "durable: ", the prefix of each finding.
void print_report(const hf::checkpoint_report& r, const char* tier = "") {
  std::printf("%spointer: %s%s%s\n", tier, state_name(r.pointer), r.problem.empty() ? "" : " — ",
              r.problem.c_str());
  for (const auto& m : r.missing)
    std::printf("%smissing: %s (kept by the pointer)\n", tier, m.c_str());
  for (const auto& u : r.unnamed)
    std::printf("%sunnamed: %s (complete, not named by the pointer)\n", tier, u.c_str());
  for (const auto& l : r.leftovers) std::printf("%sleftover: %s\n", tier, l.c_str());
  for (const auto& k : r.skipped)  // not listed, restored or counted by retention
    std::printf("%sskipped: %s (%s)\n", tier, k.name.c_str(), k.why.c_str());
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

// One tier's findings: whether all is well, and each intact step's identity (unreadable: none).
struct tier_result {
  bool ok = true;
  std::map<std::int64_t, std::optional<hf::checkpoint_identity>> ids;
  std::vector<std::int64_t> corrupt;  // reported in their tier, not compared
};

std::string identity_text(const std::optional<hf::checkpoint_identity>& id) {
  if (!id) return "unreadable";
  return std::to_string(id->step) + "@" + (id->known() ? id->history : "-");
}

// A check of an unverified checkpoint against another copy's sums (the local tier's against
// the durable tier's); nothing when there is none.
using recheck_fn =
    std::function<std::optional<hf::checkpoint_integrity>(const hf::checkpoint_integrity&)>;

// Checks one checkpoint directory: the pointer and completeness (verify()), then each
// checkpoint's files against the sizes and CRC32Cs recorded at save (or, where it recorded none,
// by `recheck`). `tier_name` ("local", "durable"; "" for one directory) prefixes each finding.
tier_result verify_directory(const std::string& dir, hf::directory_commit mode, const args& a,
                             const std::string& tier_name, const recheck_fn& recheck = {}) {
  hf::checkpoint_manager<> m(hf::read_only, dir, mode, options_of(a));
  const std::string prefix = tier_name.empty() ? "" : tier_name + ": ";
  const char* tier = prefix.c_str();
  auto r = m.verify();
  print_report(r, tier);
  bool intact = true;
  tier_result out;
  std::vector<std::int64_t> steps;  // every retained step: all_steps() leaves out a missing file
  for (const auto& c : m.checkpoints()) steps.push_back(c.step);
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (std::int64_t step : steps) {
    hf::checkpoint_integrity c = m.verify_step(step);
    if (c.status == hf::integrity_status::unverified && recheck)
      if (auto again = recheck(c)) c = *again;
    std::string name = c.path.substr(c.path.rfind('/') + 1);
    if (c.corrupt()) {
      intact = false;
      out.corrupt.push_back(step);
      std::printf("%scorrupt: %s/%s (%s: %s)\n", tier, name.c_str(), c.file.c_str(),
                  hf::to_string(c.status), c.detail.c_str());
      continue;
    } else if (c.status == hf::integrity_status::unverified) {
      std::printf("%sunverified: %s (%s)\n", tier, name.c_str(), c.detail.c_str());
    }
    try {
      out.ids[step] = hf::detail::checkpoint_load_identity<hf::posix_io>(c.path, step);
    } catch (const std::exception& e) {
      out.ids[step] = std::nullopt;
      std::printf("%sunreadable metadata: %s (%s)\n", tier, name.c_str(), e.what());
    }
  }
  const std::string in = tier_name.empty() ? "" : " in the " + tier_name + " tier";
  if (!r.ok()) std::printf("verify: problems found%s (checkpoint_tool repair)\n", in.c_str());
  if (!intact) std::printf("verify: corrupt checkpoints%s (restore() skips them)\n", in.c_str());
  out.ok = r.ok() && intact;
  return out;
}

// Across the tiers: a local step the durable tier lacks (a warning: the copier may be behind),
// a step whose copies differ in identity (a failure: two histories under one step). Steps
// corrupt in a tier are reported there, not here. True when no identity differs.
bool compare_tiers(const tier_result& local, const tier_result& durable) {
  bool same = true;
  for (const auto& [step, id] : local.ids) {
    auto d = durable.ids.find(step);
    if (std::find(durable.corrupt.begin(), durable.corrupt.end(), step) != durable.corrupt.end())
      continue;
    if (d == durable.ids.end()) {
      std::printf(
          "warning: step %lld is in the local tier only (no durable copy: the copier may "
          "be behind)\n",
          static_cast<long long>(step));
    } else if (!id || !d->second || *id != *d->second) {
      same = false;
      std::printf("differ: step %lld is %s in the local tier and %s in the durable tier\n",
                  static_cast<long long>(step), identity_text(id).c_str(),
                  identity_text(d->second).c_str());
    }
  }
  if (!same) std::printf("verify: the tiers hold different checkpoints under one step\n");
  return same;
}

int verify(const args& a) {
  if (a.durable.empty()) {
    bool ok = verify_directory(a.dir, mode_of(a), a, "").ok;
    if (ok) std::printf("verify: ok\n");
    return ok ? 0 : 1;
  }
  // A local tier saved with local_sums off records no sums: its steps are checked against the
  // durable copy of the same identity, as two_tier_checkpoints' restore does.
  hf::checkpoint_manager<> d(hf::read_only, a.durable, mode_of(a.durable_marker), options_of(a));
  auto against_durable = [&d](const hf::checkpoint_integrity& c) {
    std::optional<hf::checkpoint_integrity> out;
    try {
      auto id = hf::detail::checkpoint_load_identity<hf::posix_io>(c.path, c.step);
      for (const auto& dc : d.checkpoints())
        if (dc.step == c.step &&
            hf::detail::checkpoint_load_identity<hf::posix_io>(dc.path, c.step) == id)
          out = hf::detail::checkpoint_verify_files<hf::posix_io>(
              c.path, c.step, hf::detail::checkpoint_check_depth::sums, dc.path);
    } catch (const std::exception&) {  // reported by each tier's own check
      out.reset();
    }
    if (out && out->status == hf::integrity_status::bad_metadata) out.reset();
    if (out && out->corrupt()) out->detail += ", against the durable copy's sums";
    return out;
  };
  tier_result local = verify_directory(a.dir, mode_of(a), a, "local", against_durable);
  tier_result durable = verify_directory(a.durable, mode_of(a.durable_marker), a, "durable");
  bool same = compare_tiers(local, durable);
  bool ok = local.ok && durable.ok && same;
  if (ok) std::printf("verify: ok (both tiers)\n");
  return ok ? 0 : 1;
}

int repair(const args& a) {
  hf::checkpoint_manager<> m(a.dir, mode_of(a), options_of(a));  // the writer lock, the sweep
  auto r = m.repair();
  print_report(r);
  std::printf("repair: %s, latest %s\n", r.ok() ? "ok" : "incomplete",
              r.checkpoints.empty() ? "none" : r.checkpoints.back().name.c_str());
  return r.ok() || r.checkpoints.empty() ? 0 : 1;
}

// Demo state: one small file per step.
void write_demo_state(const std::string& d, std::int64_t s) {
  auto fd = hf::open_file(d + "/state", O_WRONLY | O_CREAT | O_EXCL, 0644);
  std::string text = "step " + std::to_string(s) + "\n";
  hf::write_all(fd, text.data(), text.size());
  fd.close();
}

// What the handler's hang detector sets before each save: list shows it.
hf::hang_bounds demo_bounds(std::int64_t step) {
  return {std::chrono::milliseconds(20), std::chrono::milliseconds(150),
          std::chrono::milliseconds(0), static_cast<std::uint64_t>(step + 1) * 100};
}

// demo --durable: N steps through two_tier_checkpoints, each copied before the next is saved.
int demo_tiers(const args& a) {
  hf::two_tier_options o;
  o.local = o.durable = options_of(a);
  o.log = o.local.log;
  hf::two_tier_checkpoints<> t(a.dir, mode_of(a), a.durable, mode_of(a.durable_marker), o);
  t.begin_history("demo");
  std::int64_t first = t.latest_step() ? *t.latest_step() + 1 : 0;
  for (std::int64_t step = first; step < first + a.steps; ++step) {
    t.set_hang_bounds(demo_bounds(step));
    t.save(step, write_demo_state);
    auto left = t.wait_for_durable(std::chrono::steady_clock::now() + std::chrono::minutes(1));
    if (!left.empty()) throw std::runtime_error("demo: the durable copy did not finish");
  }
  std::printf("demo: saved steps %lld..%lld in %s and %s\n", static_cast<long long>(first),
              static_cast<long long>(first + a.steps - 1), a.dir.c_str(), a.durable.c_str());
  return 0;
}

int demo(const args& a) {
  if (a.steps <= 0) return usage();
  if (!a.durable.empty()) return demo_tiers(a);
  hf::checkpoint_manager<> m(a.dir, mode_of(a), options_of(a));
  m.begin_history("demo");  // what the handler's restore agreement sets: list shows it
  std::int64_t first = m.latest_step() ? *m.latest_step() + 1 : 0;
  for (std::int64_t step = first; step < first + a.steps; ++step) {
    m.set_hang_bounds(demo_bounds(step));
    m.save(step, write_demo_state, {{"loss", 1.0 / static_cast<double>(step + 1)}});
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
    } else if (s == "--durable-marker") {
      a.durable_marker = true;
    } else if (s == "--prefix" || s == "--width" || s == "--timeout" || s == "--steps" ||
               s == "--durable") {
      const char* v = value();
      if (!v) return usage();
      if (s == "--durable")
        a.durable = v;
      else if (s == "--prefix")
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
  if ((!a.durable.empty() || a.durable_marker) && a.command != "verify" && a.command != "demo")
    return usage();
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
