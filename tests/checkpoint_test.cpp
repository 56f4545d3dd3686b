// checkpoint_manager: save/latest/restore in both commit modes, retention (max_to_keep 1 and 3),
// the pointer protocol, all_steps/latest_step/restore_step and pinning, start-up sweeping,
// recovery from truncated, garbled and dangling pointers (and repair()), checkpoints written by
// holdfast 0.1.0, the marker mode's parent sync before the pointer, every syscall failing in
// turn, and SIGKILL at random points of save and of retention deletions (100 runs).
// Readers beside a writer, locks and async saves: checkpoint_process_test.cpp; metadata,
// should_save, retention policies and names: checkpoint_policy_test.cpp.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <holdfast/checkpoint.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/child.hpp"
#include "support/expect_error.hpp"
#include "support/files.hpp"
#include "support/kill_io.hpp"
#include "support/sanitizers.hpp"
#include "support/shm_temp_dir.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using holdfast::checkpoint_manager;
using holdfast::directory_commit;
using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;

namespace {

using holdfast_test::error_text;
using holdfast_test::sanitized;

using holdfast_test::read_file;
using holdfast_test::write_plain;

// The content of file `f` of the checkpoint of `step`: large enough to need several writes.
std::string payload(std::int64_t step, const std::string& f, std::size_t size) {
  std::string head = "step=" + std::to_string(step) + " file=" + f + ";";
  std::string s;
  while (s.size() < size) s += head;
  s.resize(size);
  return s;
}

const std::vector<std::pair<std::string, std::size_t>> files = {
    {"weights.bin", 20000}, {"optimizer.bin", 9000}, {"meta/step.txt", 40}};

// Writes a checkpoint through the Io policy of the manager under test.
template <class Io>
void write_checkpoint(const std::string& dir, std::int64_t step) {
  if (Io::mkdir((dir + "/meta").c_str(), 0755) != 0) throw holdfast::error(errno, "mkdir", dir);
  for (const auto& [name, size] : files) {
    auto fd = holdfast::open_file<Io>(dir + "/" + name, O_WRONLY | O_CREAT | O_EXCL, 0644);
    std::string p = payload(step, name, size);
    holdfast::write_all(fd, p.data(), p.size());
    fd.close();
  }
}

// True when `dir` holds exactly the checkpoint of `step`.
bool complete(const std::string& dir, std::int64_t step) {
  for (const auto& [name, size] : files) {
    std::error_code ec;
    if (!fs::exists(dir + "/" + name, ec)) return false;
    if (read_file(dir + "/" + name) != payload(step, name, size)) return false;
  }
  return true;
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// The writer's lock file (local filesystems): present in every directory a writer opened.
const std::string lock_file = ".writer.lock";

// Every log line a manager reports, for checks.
struct log_lines {
  std::vector<std::string> lines;
  holdfast::log_fn sink() {
    return [this](std::string_view l) { lines.emplace_back(l); };
  }
  bool any(const std::string& part) const {
    for (const auto& l : lines)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }
};

template <class Io>
using local_store = holdfast::basic_store<holdfast::basic_local_filesystem<Io>>;
template <class Io>
using remote_store = holdfast::basic_store<holdfast::basic_mounted_remote<Io>>;

}  // namespace

TEST_CASE_TEMPLATE("save, latest and restore in both commit modes", Store,
                   local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("ckpt");
  auto s = Store::create(dir.path());
  checkpoint_manager<Store> m(s, "run-1", {3});
  CHECK(m.directory() == s.checkpoint_path("run-1"));
  CHECK(!m.latest());
  CHECK(!m.restore());
  CHECK(m.checkpoints().empty());

  auto info = m.save(10, [](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  });
  CHECK(info.step == 10);
  CHECK(info.name == "step-10");
  CHECK(info.path == m.directory() + "/step-10");
  CHECK(complete(info.path, 10));
  auto l = m.latest();
  REQUIRE(l);
  CHECK(l->step == 10);
  CHECK(l->path == info.path);
  CHECK(read_file(m.pointer_path()) == "holdfast-checkpoints 1\nlatest step-10\nkeep step-10\n");
  if (std::is_same_v<Store, remote_store<holdfast::posix_io>>) {
    CHECK(m.commit_mode() == directory_commit::marker);
    CHECK(holdfast::publisher::is_committed(info.path));
  } else {
    CHECK(m.commit_mode() == directory_commit::rename);
    CHECK(!fs::exists(info.path + "/commit_success.txt"));
  }

  // The default writer and reader: the Checkpointer calls preemption_handler makes.
  CHECK_THROWS_AS(m.save(11), holdfast::error);
  m.set_writer([](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  });
  m.save(11);
  std::int64_t loaded = -1;
  std::string loaded_from;
  m.set_reader([&](const std::string& d) {  // the one-argument form
    loaded_from = d;
    loaded = complete(d, 11) ? 11 : -2;
  });
  auto restored = m.restore();
  REQUIRE(restored);
  CHECK(*restored == 11);
  CHECK(loaded == 11);
  CHECK(loaded_from == m.directory() + "/step-11");
  std::int64_t seen = -1;
  CHECK(m.restore([&](const std::string&, std::int64_t step) { seen = step; }) == 11);
  CHECK(seen == 11);

  // A reader beside it (an evaluator) sees the same state.
  checkpoint_manager<Store> again(holdfast::read_only, s, "run-1", {3});
  REQUIRE(again.latest());
  CHECK(again.latest()->step == 11);
  CHECK(again.checkpoints().size() == 2);
  CHECK(entries(m.directory()) ==
        std::set<std::string>{"latest", "step-10", "step-11", lock_file});  // no staging left

  CHECK_THROWS_AS(m.save(-1), holdfast::error);
  CHECK_THROWS_AS(checkpoint_manager<Store>(s, "a/b"), holdfast::error);
}

TEST_CASE_TEMPLATE("retention keeps max_to_keep checkpoints and never the latest", Store,
                   local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  for (std::size_t keep : {std::size_t{1}, std::size_t{3}}) {
    CAPTURE(keep);
    holdfast_test::temp_dir dir("keep");
    auto s = Store::create(dir.path());
    checkpoint_manager<Store> m(s, "r", {keep});
    m.set_writer([](const std::string& d, std::int64_t step) {
      write_checkpoint<holdfast::posix_io>(d, step);
    });
    for (std::int64_t step = 1; step <= 7; ++step) {
      m.save(step * 100);
      auto all = m.checkpoints();
      std::size_t expect = std::min<std::size_t>(keep, static_cast<std::size_t>(step));
      REQUIRE(all.size() == expect);
      CHECK(all.back().step == step * 100);  // the latest is kept
      std::set<std::string> expect_entries{"latest", lock_file};
      for (std::size_t i = 0; i < expect; ++i) {
        std::int64_t st = (step - static_cast<std::int64_t>(expect - 1 - i)) * 100;
        CHECK(all[i].step == st);
        CHECK(complete(all[i].path, st));
        expect_entries.insert("step-" + std::to_string(st));
      }
      CHECK(entries(m.directory()) == expect_entries);  // deleted ones are gone, nothing else
      CHECK(m.latest()->step == step * 100);
    }
  }
}

TEST_CASE(
    "max_to_keep 0 keeps all, re-saving a step supersedes it, a throwing writer leaves no trace") {
  holdfast_test::temp_dir dir("misc");
  auto s = holdfast::store::create(dir.path());
  checkpoint_manager<> m(s, "r", {0});
  auto w = [](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  };
  for (std::int64_t step = 1; step <= 6; ++step) m.save(step, w);
  CHECK(m.checkpoints().size() == 6);

  // Restored at 3, the job saves 3 again: a new directory, the old step-3 superseded.
  auto again = m.save(3, [](const std::string& d) { write_plain(d + "/v2", "second"); });
  CHECK(again.name == "step-3.1");
  CHECK(m.latest()->name == "step-3.1");
  CHECK(m.latest()->step == 3);
  CHECK(!fs::exists(m.directory() + "/step-3"));
  CHECK(read_file(m.latest()->path + "/v2") == "second");
  CHECK(m.checkpoints().size() == 6);

  auto before = read_file(m.pointer_path());
  auto before_entries = entries(m.directory());
  CHECK_THROWS_WITH_AS(m.save(7,
                              [](const std::string& d) {
                                write_plain(d + "/half", "x");
                                throw std::runtime_error("disk quota");
                              }),
                       "disk quota", std::runtime_error);
  CHECK(read_file(m.pointer_path()) == before);
  CHECK(entries(m.directory()) == before_entries);
}

namespace {

using steps_t = std::vector<std::int64_t>;

template <class Store>
constexpr bool marker_mode = std::is_same_v<Store, remote_store<holdfast::posix_io>>;

// A checkpoint directory made by hand (as another process's save would leave it), committed in
// marker mode.
template <class Store>
void make_checkpoint(const std::string& path, std::int64_t step) {
  fs::create_directories(path);
  write_checkpoint<holdfast::posix_io>(path, step);
  holdfast::detail::checkpoint_write_metadata<holdfast::posix_io>(
      path, step, std::chrono::system_clock::now(), nullptr);  // as holdfast's save writes it
  if (marker_mode<Store>) write_plain(path + "/commit_success.txt", "committed\n");
}

std::string pointer_text(const std::string& latest, const std::vector<std::string>& keep) {
  std::string s = "holdfast-checkpoints 1\nlatest " + latest + "\n";
  for (const auto& k : keep) s += "keep " + k + "\n";
  return s;
}

}  // namespace

TEST_CASE("truncated, garbled and dangling pointers: the job restores the newest complete one") {
  holdfast_test::temp_dir dir("bad");
  auto s = holdfast::store::create(dir.path());
  auto w = [](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  };
  std::string pointer;
  {
    checkpoint_manager<> m(s, "r", {2});
    m.save(1, w);
    m.save(2, w);
    pointer = m.pointer_path();
  }

  struct row {
    std::string content;
    std::string says;
  };
  const row garbage[] = {
      {"", "empty pointer file"},
      {"\x7f"
       "ELF\x02\x01\x01\n",
       "line 1: expected 'holdfast-checkpoints 1'"},
      {"model_checkpoint_path: \"ckpt-3\"\n", "line 1"},
      {"holdfast-checkpoints 1\nlatest step-2\nkeep step-2", "truncated"},
      {"holdfast-checkpoints 1\nlat", "truncated"},
      {"holdfast-checkpoints 1\nlatest step-x\nkeep step-x\n",
       "line 2: expected a checkpoint name"},
      {"holdfast-checkpoints 1\nlatest step-2\n", "not among the 'keep' lines"},
      {"holdfast-checkpoints 1\nnewest step-2\n", "line 2: unknown key 'newest'"},
      {"holdfast-checkpoints 1\nlatest step-2\nkeep step-2\nlatest step-2\n", "line 4"},
      {"holdfast-checkpoints 1\nkeep step-2\n", "no 'latest' line"},
      // Well-formed, but naming checkpoints that are not there (dangling).
      {"holdfast-checkpoints 1\nlatest step-9\nkeep step-9\n", "names 'step-9', which is missing"},
      {"holdfast-checkpoints 1\nlatest step-0099\nkeep step-0099\n",
       "names 'step-0099', which is missing"},
  };
  std::int64_t newest = 2;
  for (const auto& g : garbage) {
    CAPTURE(g.content);
    write_plain(pointer, g.content);
    log_lines log;
    holdfast::checkpoint_options o{2};
    o.log = log.sink();
    // The constructor never throws for a bad pointer: it logs (once) and carries on.
    checkpoint_manager<> m(s, "r", o);
    REQUIRE(m.latest());
    CHECK(m.latest()->step == newest);
    CHECK(m.latest_step() == newest);
    REQUIRE(log.lines.size() == 1);
    CHECK(log.any(pointer));
    CHECK(log.any(g.says));
    CHECK(log.any("using the newest complete checkpoint on disk, 'step-" + std::to_string(newest) +
                  "'"));
    CHECK(read_file(pointer) == g.content);  // nothing rewritten before a save
    std::int64_t loaded = -1;
    CHECK(m.restore([&](const std::string& d, std::int64_t step) {
      loaded = complete(d, step) ? step : -2;
    }) == newest);
    CHECK(loaded == newest);
    CHECK(log.lines.size() == 1);  // the same problem is reported once
    // The job saves again, and the save rewrites a sound pointer.
    m.save(++newest, w);
    CHECK(log.any("rewritten by the save of 'step-" + std::to_string(newest) + "'"));
    CHECK(holdfast::detail::parse_checkpoint_pointer(read_file(pointer), pointer).latest ==
          "step-" + std::to_string(newest));
    CHECK(m.verify().ok());
    CHECK(m.all_steps().size() == 2);
  }

  // Nothing complete on disk (only a staging directory full of files, and a bad pointer): the
  // job starts fresh instead of guessing at a partial checkpoint.
  for (const auto& e : entries(s.checkpoint_path("r")))
    if (e.rfind("step-", 0) == 0) fs::remove_all(s.checkpoint_path("r") + "/" + e);
  const std::string staged = s.checkpoint_path("r") + "/.staging-step-50-999-1";
  fs::create_directories(staged);
  write_checkpoint<holdfast::posix_io>(staged, 50);
  write_plain(pointer, "holdfast-checkpoints 1\nlatest step-3");
  log_lines log;
  holdfast::checkpoint_options o{2};
  o.log = log.sink();
  {
    // A reader first: it must not touch the staging directory (only a writer's sweep does).
    checkpoint_manager<> reader(holdfast::read_only, s, "r", o);
    CHECK(!reader.latest());
    CHECK(!reader.restore());
    CHECK(log.any("no complete checkpoint on disk: starting fresh"));
    CHECK(log.any("the writer's next save rewrites the pointer"));
    CHECK(fs::exists(staged));
  }
  checkpoint_manager<> m(s, "r", o);
  CHECK(!m.latest());
  CHECK(!m.restore());
  CHECK(m.all_steps().empty());
  CHECK(!fs::exists(staged));  // swept by the writer
  m.save(0, w);
  CHECK(m.latest()->step == 0);
  CHECK(read_file(pointer) == "holdfast-checkpoints 1\nlatest step-0\nkeep step-0\n");
}

TEST_CASE("marker mode: a checkpoint without its marker is never used, even named as latest") {
  holdfast_test::temp_dir dir("marker");
  using S = remote_store<holdfast::posix_io>;
  auto s = S::create(dir.path());
  log_lines log;
  holdfast::checkpoint_options o{3};
  o.log = log.sink();
  auto w = [](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  };
  std::string d;
  {
    checkpoint_manager<S> m(s, "r", o);
    d = m.directory();
    m.save(1, w);
    m.save(2, w);
    fs::remove(d + "/step-2/commit_success.txt");  // complete files, no marker: not committed
    REQUIRE(m.latest());
    CHECK(m.latest()->step == 1);  // the newest committed one, not the marker-less step-2
    CHECK(m.all_steps() == std::vector<std::int64_t>{1});
    CHECK(log.any("names 'step-2', which is not committed (no commit marker)"));
    CHECK(log.any("using the newest complete checkpoint on disk, 'step-1'"));
    auto r = m.verify();
    CHECK(r.pointer == holdfast::pointer_state::dangling);
    CHECK(r.missing == std::vector<std::string>{"step-2"});
    CHECK(!r.ok());
  }
  // A restarted writer sweeps the uncommitted directory and saves on.
  checkpoint_manager<S> m(s, "r", o);
  CHECK(!fs::exists(d + "/step-2"));
  m.save(3, w);
  CHECK(m.all_steps() == std::vector<std::int64_t>{1, 3});
  CHECK(m.verify().ok());
}

TEST_CASE_TEMPLATE("repair() rewrites a bad pointer from what is on disk — verify() reports", Store,
                   local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("repair");
  auto s = Store::create(dir.path());
  log_lines log;
  holdfast::checkpoint_options o{0};
  o.log = log.sink();
  checkpoint_manager<Store> m(s, "r", o);
  m.set_writer([](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  });
  const std::string d = m.directory();
  for (std::int64_t step : {3, 1, 2}) m.save(step);
  auto good = m.verify();
  CHECK(good.ok());
  CHECK(good.pointer == holdfast::pointer_state::ok);
  REQUIRE(good.checkpoints.size() == 3);
  CHECK(good.checkpoints.back().name == "step-2");  // the one saved last
  CHECK(good.unnamed.empty());
  CHECK(good.leftovers.empty());

  // A kept checkpoint deleted by hand: the pointer is still sound, one kept entry is missing.
  fs::remove_all(d + "/step-1");
  auto r = m.verify();
  CHECK(r.pointer == holdfast::pointer_state::ok);
  CHECK(r.missing == std::vector<std::string>{"step-1"});
  CHECK(!r.ok());
  r = m.repair();
  CHECK(r.ok());
  CHECK(read_file(m.pointer_path()) ==
        "holdfast-checkpoints 1\nlatest step-2\nkeep step-3\nkeep step-2\n");

  // Garbled: repair rewrites it from the complete checkpoints on disk, by step.
  write_plain(m.pointer_path(), "garbage\n");
  r = m.verify();
  CHECK(r.pointer == holdfast::pointer_state::garbled);
  CHECK(r.problem.find("line 1") != std::string::npos);
  CHECK(r.checkpoints.size() == 2);
  r = m.repair();
  CHECK(r.ok());
  CHECK(read_file(m.pointer_path()) ==
        "holdfast-checkpoints 1\nlatest step-3\nkeep step-2\nkeep step-3\n");
  CHECK(log.any("rewritten by repair(): latest 'step-3', 2 kept"));

  // Missing, with leftovers and an unnamed complete checkpoint.
  fs::remove(m.pointer_path());
  write_plain(d + "/.staging-step-4-999-1/x", "half");
  make_checkpoint<Store>(d + "/step-7", 7);
  r = m.verify();
  CHECK(r.pointer == holdfast::pointer_state::missing);
  CHECK(r.leftovers == std::vector<std::string>{".staging-step-4-999-1"});
  REQUIRE(r.checkpoints.size() == 3);
  CHECK(r.checkpoints.back().step == 7);
  r = m.repair();
  CHECK(r.ok());
  CHECK(r.leftovers.empty());
  CHECK(m.latest()->step == 7);

  // Nothing complete at all: repair removes the pointer; the run starts fresh.
  for (const auto& e : entries(d))
    if (e.rfind("step-", 0) == 0) fs::remove_all(d + "/" + e);
  r = m.repair();
  CHECK(!fs::exists(m.pointer_path()));
  CHECK(r.pointer == holdfast::pointer_state::missing);
  CHECK(r.checkpoints.empty());
  CHECK(!m.latest());

  checkpoint_manager<Store> ro(holdfast::read_only, s, "r");
  CHECK_THROWS_AS(ro.repair(), holdfast::error);
}

TEST_CASE("a run written by holdfast 0.1.0 (pointer, directories, no metadata) stays usable") {
  holdfast_test::temp_dir dir("compat");
  auto s = holdfast::store::create(dir.path());
  const std::string d = s.checkpoint_path("r");
  // Exactly what 0.1.0 left: step directories without metadata, its pointer text, no lock file.
  for (std::int64_t step : {10, 20, 30}) {
    fs::create_directories(d + "/step-" + std::to_string(step));
    write_checkpoint<holdfast::posix_io>(d + "/step-" + std::to_string(step), step);
  }
  fs::create_directories(d + "/step-20.1");
  write_checkpoint<holdfast::posix_io>(d + "/step-20.1", 20);
  write_plain(d + "/latest",
              "holdfast-checkpoints 1\nlatest step-20.1\nkeep step-10\nkeep step-30\n"
              "keep step-20.1\ndelete step-20\n");
  {
    checkpoint_manager<> ro(holdfast::read_only, s, "r");
    CHECK(ro.latest()->name == "step-20.1");
    CHECK(ro.all_steps() == std::vector<std::int64_t>{10, 20, 30});
    CHECK(!ro.metadata(30));  // no metadata file: none, not an error
    std::string from;
    ro.restore_step(
        30, [&](const std::string& p, std::int64_t step) { from = complete(p, step) ? p : ""; });
    CHECK(from == d + "/step-30");
    CHECK(entries(d).count(lock_file) == 0);  // the reader created nothing
  }
  checkpoint_manager<> m(s, "r", {3});
  CHECK(!fs::exists(d + "/step-20"));  // the listed deletion, finished by the sweep
  CHECK(m.latest()->name == "step-20.1");
  std::int64_t loaded = -1;
  CHECK(m.restore([&](const std::string& p, std::int64_t step) {
    loaded = complete(p, step) ? step : -2;
  }) == 20);
  CHECK(loaded == 20);
  m.save(40, [](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(p, step);
  });
  CHECK(read_file(d + "/latest") ==
        "holdfast-checkpoints 1\nlatest step-40\nkeep step-30\nkeep step-20.1\nkeep step-40\n");
  CHECK(m.metadata(40)->step == 40);
  // The 0.1.0 parser (no leading zeros, prefix step-) still reads what this release wrote.
  auto p = holdfast::detail::parse_checkpoint_pointer(read_file(d + "/latest"), d + "/latest");
  for (const auto& k : p.keep) CHECK(k.find("step-0") != 0);
}

TEST_CASE_TEMPLATE("all_steps lists complete retained checkpoints ascending, each once", Store,
                   local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("allsteps");
  auto s = Store::create(dir.path());
  checkpoint_manager<Store> m(s, "r", {0});
  m.set_writer([](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  });
  CHECK(m.all_steps().empty());
  CHECK(!m.latest_step());

  // Saved out of order, and step 2 saved twice (step-2.1 supersedes step-2).
  m.save(5);
  m.save(2);
  m.save(9);
  m.save(2);
  CHECK(m.all_steps() == steps_t{2, 5, 9});
  CHECK(m.latest_step() == 9);  // the largest step, not the one saved last
  CHECK(m.latest()->step == 2);

  // Two generations of step 5 kept (a pointer another version of the code left): listed once.
  const std::string d = m.directory();
  make_checkpoint<Store>(d + "/step-5.1", 5);
  write_plain(m.pointer_path(),
              pointer_text("step-5.1", {"step-5", "step-2.1", "step-9", "step-5.1"}));
  CHECK(m.all_steps() == steps_t{2, 5, 9});

  // A kept checkpoint deleted by hand, or replaced by a file, is left out, not an error.
  fs::remove_all(d + "/step-9");
  CHECK(m.all_steps() == steps_t{2, 5});
  CHECK(m.latest_step() == 5);
  write_plain(d + "/step-9", "not a directory");
  CHECK(m.all_steps() == steps_t{2, 5});
  CHECK(m.checkpoints().size() == 3);  // the complete ones: step-5, step-2.1, step-5.1
  fs::remove_all(d + "/step-5");
  CHECK(m.all_steps() == steps_t{2, 5});  // step-5.1 still holds step 5
  fs::remove_all(d + "/step-5.1");
  CHECK(m.all_steps() == steps_t{2});

  // Marker mode: a kept directory without its commit marker is not complete.
  fs::remove(d + "/step-2.1/commit_success.txt");  // absent in rename mode: no change there
  if (marker_mode<Store>) {
    CHECK(m.all_steps().empty());
    CHECK(!m.latest_step());
  } else {
    CHECK(m.all_steps() == steps_t{2});
    CHECK(m.latest_step() == 2);
  }
}

TEST_CASE("latest_step and all_steps recover from a garbled pointer — latest_step never throws") {
  holdfast_test::temp_dir dir("lateststep");
  auto s = holdfast::store::create(dir.path());
  checkpoint_manager<> m(s, "r", {3});
  static_assert(noexcept(m.latest_step()));
  CHECK(!m.latest_step());
  m.save(4, [](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  });
  REQUIRE(m.latest_step() == 4);

  for (const std::string& garbled : {std::string(""), std::string("holdfast-checkpoints 1\nlat"),
                                     std::string("\x7f"
                                                 "ELF\x02\x01\x01\n")}) {
    CAPTURE(garbled);
    write_plain(m.pointer_path(), garbled);
    CHECK(m.latest_step() == 4);
    CHECK(m.all_steps() == steps_t{4});
    std::string from;
    m.restore_step(4, [&](const std::string& p) { from = p; });
    CHECK(from == m.directory() + "/step-4");
  }
  // An I/O error reading the pointer (here: it is a directory) is an error for all_steps(),
  // nothing for latest_step().
  fs::remove(m.pointer_path());
  fs::create_directories(m.pointer_path());
  CHECK(!m.latest_step());
  CHECK_THROWS_AS(m.all_steps(), holdfast::error);
  fs::remove(m.pointer_path());
}

TEST_CASE_TEMPLATE("restore_step loads exactly that step, its newest generation, or ENOENT", Store,
                   local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("restorestep");
  auto s = Store::create(dir.path());
  checkpoint_manager<Store> m(s, "r", {3});
  const std::string d = m.directory();
  auto no_checkpoint = [&](std::int64_t step) {
    std::string text;
    try {
      m.restore_step(step);
      FAIL("restore_step(" << step << ") did not throw");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == ENOENT);
      CHECK(e.path() == d);
      text = e.what();
    }
    CHECK(text.find(d) != std::string::npos);
    CHECK(text.find("step " + std::to_string(step)) != std::string::npos);
  };
  no_checkpoint(1);  // no pointer yet

  m.set_writer([](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(p, step);
  });
  m.save(1);
  m.save(2);
  m.save(3);
  std::string loaded_from;
  std::int64_t loaded = -1;
  m.set_reader([&](const std::string& p, std::int64_t step) {
    loaded_from = p;
    loaded = complete(p, step) ? step : -2;  // the files hold the step they were written for
  });
  m.restore_step(2);
  CHECK(loaded == 2);
  CHECK(loaded_from == d + "/step-2");
  CHECK(complete(loaded_from, 2));
  m.restore_step(1);
  CHECK(loaded == 1);
  CHECK(complete(loaded_from, 1));

  std::string seen;
  m.restore_step(3, [&](const std::string& p) { seen = p; });  // the one-argument reader
  CHECK(seen == d + "/step-3");
  std::int64_t seen_step = -1;
  m.restore_step(2, [&](const std::string&, std::int64_t step) { seen_step = step; });
  CHECK(seen_step == 2);
  CHECK(m.latest()->step == 3);  // restoring an older step changes nothing on disk

  loaded = -1;
  no_checkpoint(4);
  no_checkpoint(0);
  CHECK(loaded == -1);  // the reader never ran for a step without a checkpoint

  // Two generations of step 2: the one listed last in the keep list is loaded.
  make_checkpoint<Store>(d + "/step-2.1", 2);
  write_plain(d + "/step-2.1/generation", "1");
  write_plain(m.pointer_path(),
              pointer_text("step-2.1", {"step-1", "step-2", "step-3", "step-2.1"}));
  m.restore_step(2);
  CHECK(loaded_from == d + "/step-2.1");
  CHECK(loaded == 2);
  write_plain(m.pointer_path(), pointer_text("step-2", {"step-1", "step-2.1", "step-3", "step-2"}));
  m.restore_step(2);
  CHECK(loaded_from == d + "/step-2");
  // The newest generation missing on disk: the older complete one still holds step 2.
  fs::remove_all(d + "/step-2");
  m.restore_step(2);
  CHECK(loaded_from == d + "/step-2.1");
  // Kept but missing on disk: none.
  fs::remove_all(d + "/step-1");
  no_checkpoint(1);
}

TEST_CASE_TEMPLATE("retention keeps the pinned step beyond max_to_keep until unpinned", Store,
                   local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("pin");
  auto s = Store::create(dir.path());
  {
    checkpoint_manager<Store> m(s, "r", {2});
    m.set_writer([](const std::string& p, std::int64_t step) {
      write_checkpoint<holdfast::posix_io>(p, step);
    });
    auto on_disk = [&] {
      std::set<std::string> out;
      for (const auto& e : entries(m.directory()))
        if (e != "latest" && e != lock_file) out.insert(e);
      return out;
    };
    CHECK(!m.pinned());
    m.save(1);
    m.pin(1);
    CHECK(m.pinned() == 1);
    for (std::int64_t step = 2; step <= 6; ++step) {
      CAPTURE(step);
      m.save(step);
      if (step >= 3) CHECK(m.all_steps() == steps_t{1, step - 1, step});
    }
    CHECK(m.all_steps() == steps_t{1, 5, 6});
    CHECK(on_disk() == std::set<std::string>{"step-1", "step-5", "step-6"});
    CHECK(complete(m.directory() + "/step-1", 1));
    CHECK(m.latest()->step == 6);

    // Unpinned, the next save's retention drops it.
    m.pin(std::nullopt);
    CHECK(!m.pinned());
    m.save(7);
    CHECK(m.all_steps() == steps_t{6, 7});
    CHECK(on_disk() == std::set<std::string>{"step-6", "step-7"});

    // A pinned step among the newest max_to_keep costs nothing extra until it falls behind.
    m.pin(7);
    m.save(8);
    CHECK(m.all_steps() == steps_t{7, 8});
    m.save(9);
    CHECK(m.all_steps() == steps_t{7, 8, 9});

    // Saving the pinned step again supersedes it: one generation kept, the new one pinned.
    m.save(7);
    CHECK(on_disk() == std::set<std::string>{"step-7.1", "step-9"});
    m.save(10);
    m.save(11);
    CHECK(m.all_steps() == steps_t{7, 10, 11});
    CHECK(on_disk() == std::set<std::string>{"step-7.1", "step-10", "step-11"});
    std::string from;
    m.restore_step(7, [&](const std::string& p) { from = p; });
    CHECK(from == m.directory() + "/step-7.1");
  }

  // The pin is the manager's only: a restarted process keeps what is on disk until it saves.
  checkpoint_manager<Store> again(s, "r", {2});
  CHECK(!again.pinned());
  CHECK(again.all_steps() == steps_t{7, 10, 11});
  again.save(12, [](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(p, step);
  });
  CHECK(again.all_steps() == steps_t{11, 12});
}

TEST_CASE_TEMPLATE("start-up sweeps what killed saves left, and finishes listed deletions", Store,
                   local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("sweep");
  auto s = Store::create(dir.path());
  std::string d;
  {
    checkpoint_manager<Store> m(s, "r", {3});
    d = m.directory();
    m.set_writer([](const std::string& p, std::int64_t step) {
      write_checkpoint<holdfast::posix_io>(p, step);
    });
    m.save(1);
    m.save(2);
    m.save(3);
  }
  // Leftovers: a staging dir, a half-deleted dir, a publish temp, a complete directory the
  // pointer never named (killed between commit and pointer), a foreign file, and a pointer that
  // lists step-1 as being deleted with step-1 half gone.
  write_plain(d + "/.staging-step-4-999-1/weights.bin", "half");
  write_plain(d + "/.deleting-step-0-999-2/x", "y");
  write_plain(d + "/.holdfast-tmp.999.0123456789abcdef.latest", "partial pointer");
  fs::create_directories(d + "/step-9");
  write_checkpoint<holdfast::posix_io>(d + "/step-9", 9);
  if (std::is_same_v<Store, remote_store<holdfast::posix_io>>)
    write_plain(d + "/step-9/commit_success.txt", "committed\n");
  write_plain(d + "/README.user", "mine");
  fs::remove(d + "/step-1/weights.bin");
  write_plain(d + "/latest",
              "holdfast-checkpoints 1\nlatest step-3\nkeep step-2\nkeep step-3\ndelete step-1\n");

  {
    checkpoint_manager<Store> m(s, "r", {3});
    CHECK(entries(d) ==
          std::set<std::string>{"latest", "step-2", "step-3", "README.user", lock_file});
    CHECK(read_file(d + "/latest") ==
          "holdfast-checkpoints 1\nlatest step-3\nkeep step-2\nkeep step-3\n");
    CHECK(m.latest()->step == 3);
  }

  // Without a pointer nothing complete is removed, only scratch (and marker-less dirs); the
  // complete ones are used (the newest as the latest) until a save writes a pointer again. An
  // empty step-6 (made by hand: in rename mode only a rename makes a step dir) is no checkpoint.
  fs::remove(d + "/latest");
  write_plain(d + "/.staging-step-5-999-3/w", "half");
  fs::create_directories(d + "/step-6");
  {
    checkpoint_manager<Store> n(s, "r", {3});
    auto left = entries(d);
    CHECK(left.count("step-2") == 1);
    CHECK(left.count("step-3") == 1);
    CHECK(left.count(".staging-step-5-999-3") == 0);
    CHECK(left.count("step-6") == (marker_mode<Store> ? 0 : 1));  // left where it is
    CHECK(n.latest()->step == 3);
    CHECK(n.all_steps() == steps_t{2, 3});
    CHECK(!fs::exists(d + "/latest"));  // the sweep does not write a pointer; a save does
  }

  // An age threshold keeps fresh scratch directories.
  write_plain(d + "/.staging-step-7-999-4/w", "fresh");
  checkpoint_manager<Store> aged(s, "r", {3, std::chrono::hours(1)});
  CHECK(entries(d).count(".staging-step-7-999-4") == 1);
}

namespace {

// posix_io recording what each fsync syncs (by the path its descriptor was opened with), and
// each rename and mkdir, in order.
struct recording_io : holdfast::posix_io {
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::string>& events() {
    static std::vector<std::string> e;
    return e;
  }
  static std::map<int, std::string>& paths() {
    static std::map<int, std::string> p;
    return p;
  }
  static void record(std::string e) {
    std::lock_guard<std::mutex> l(mutex());
    events().push_back(std::move(e));
  }
  static std::string path_of(int fd) {
    std::lock_guard<std::mutex> l(mutex());
    auto it = paths().find(fd);
    return it == paths().end() ? "?" : it->second;
  }
  static int open(const char* p, int f, mode_t m) noexcept {
    int fd = posix_io::open(p, f, m);
    if (fd >= 0) {
      std::lock_guard<std::mutex> l(mutex());
      paths()[fd] = p;
    }
    return fd;
  }
  static int close(int fd) noexcept {
    {
      std::lock_guard<std::mutex> l(mutex());
      paths().erase(fd);
    }
    return posix_io::close(fd);
  }
  static int fsync(int fd) noexcept {
    record("fsync " + path_of(fd));
    return posix_io::fsync(fd);
  }
  static int rename(const char* a, const char* b) noexcept {
    record("rename " + std::string(b));
    return posix_io::rename(a, b);
  }
  static int renameat2(int od, const char* a, int nd, const char* b, unsigned f) noexcept {
    record("rename " + std::string(b));
    return posix_io::renameat2(od, a, nd, b, f);
  }
  static int mkdir(const char* p, mode_t m) noexcept {
    record("mkdir " + std::string(p));
    return posix_io::mkdir(p, m);
  }
};

}  // namespace

TEST_CASE_TEMPLATE("the new checkpoint's entry is synced in its parent before the pointer names it",
                   Store, local_store<recording_io>, remote_store<recording_io>) {
  holdfast_test::temp_dir dir("order");
  auto s = Store::create(dir.path());
  checkpoint_manager<Store> m(s, "r", {3});
  const std::string d = m.directory();
  auto w = [](const std::string& p, std::int64_t step) { write_checkpoint<recording_io>(p, step); };
  m.save(1, w);
  {
    std::lock_guard<std::mutex> l(recording_io::mutex());
    recording_io::events().clear();
  }
  m.save(2, w);
  std::vector<std::string> ev;
  {
    std::lock_guard<std::mutex> l(recording_io::mutex());
    ev = recording_io::events();
  }
  auto index = [&](const std::string& e, std::size_t from = 0) {
    for (std::size_t i = from; i < ev.size(); ++i)
      if (ev[i] == e) return static_cast<std::ptrdiff_t>(i);
    return std::ptrdiff_t{-1};
  };
  // The step that makes the checkpoint whole: the rename into place, or the marker published.
  const bool marker = m.commit_mode() == directory_commit::marker;
  const std::string committed =
      marker ? "rename " + d + "/step-2/commit_success.txt" : "rename " + d + "/step-2";
  std::string trace;
  for (const auto& e : ev) trace += "\n  " + e;
  CAPTURE(trace);
  auto commit = index(committed);
  auto pointer = index("rename " + d + "/latest");
  REQUIRE(commit >= 0);
  REQUIRE(pointer > commit);
  auto parent_sync = index("fsync " + d, static_cast<std::size_t>(commit));
  CHECK(parent_sync > commit);
  CHECK(parent_sync < pointer);  // the directory entry is durable before the pointer names it
  if (marker) {
    // Made in place: its own entry is created by mkdir, and synced only by that parent sync.
    auto made = index("mkdir " + d + "/step-2");
    CHECK(made >= 0);
    CHECK(made < commit);
  }
}

TEST_CASE("save with each system call failing in turn keeps a complete latest") {
  holdfast_test::shm_temp_dir dir("ckptfault");
  using store_t = local_store<fault_io>;
  using remote_t = remote_store<fault_io>;
  auto run = [&](auto tag, const std::string& sub) {
    using S = decltype(tag);
    auto s = S::create(dir / sub);
    auto w = [](const std::string& p, std::int64_t step) { write_checkpoint<fault_io>(p, step); };
    // Count the calls of one save with retention (max_to_keep 2, third save deletes one).
    std::uint64_t total = 0;
    {
      checkpoint_manager<S> m(s, "count", {2});
      m.save(1, w);
      m.save(2, w);
      fault_plan::reset_counts();
      m.save(3, w);
      total = fault_plan::calls(io_op::any);
    }
    REQUIRE(total > 30);
    std::uint64_t failed = 0;
    for (std::uint64_t k = 1; k <= total; ++k) {
      CAPTURE(k);
      std::string id = "k" + std::to_string(k);
      {
        checkpoint_manager<S> m(s, id, {2});
        m.save(1, w);
        m.save(2, w);
        fault_plan::arm(fault{io_op::any, k, EIO});
        try {
          m.save(3, w);
        } catch (const holdfast::error& e) {
          ++failed;
          CHECK(e.errnum() == EIO);
        }
        fault_plan::disarm();
      }
      // What a restarted process sees: a complete latest, step 2 or 3.
      checkpoint_manager<S> after(s, id, {2});
      auto l = after.latest();
      REQUIRE(l);
      CHECK((l->step == 2 || l->step == 3));
      CHECK(complete(l->path, l->step));
      for (const auto& c : after.checkpoints()) CHECK(complete(c.path, c.step));
      for (const auto& e : entries(after.directory()))
        CHECK((e == "latest" || e == lock_file || e.rfind("step-", 0) == 0));
      after.save(4, w);  // and it can go on
      CHECK(after.latest()->step == 4);
      fs::remove_all(s.run_path(id));
    }
    CHECK(failed + 10 >= total);
  };
  run(store_t::create("/x"), "local");
  run(remote_t::create("/x"), "remote");
}

TEST_CASE("the start-up sweep with each system call failing in turn, then a clean restart") {
  holdfast_test::shm_temp_dir dir("sweepfault");
  using S = local_store<fault_io>;
  auto s = S::create(dir.path());
  auto w = [](const std::string& p, std::int64_t step) { write_checkpoint<fault_io>(p, step); };
  auto leave_leftovers = [&](const std::string& id) {
    checkpoint_manager<S> m(s, id, {2});
    m.save(1, w);
    m.save(2, w);
    std::string d = m.directory();
    write_plain(d + "/.staging-step-3-999-1/weights.bin", "half");
    write_plain(d + "/.deleting-step-0-999-2/sub/x", "y");
    write_plain(d + "/.holdfast-tmp.999.0123456789abcdef.latest", "partial");
    fs::create_directories(d + "/step-3");
    write_plain(d + "/latest",
                "holdfast-checkpoints 1\nlatest step-2\nkeep step-2\ndelete step-1\n");
    return d;
  };
  std::uint64_t total = 0;
  {
    leave_leftovers("count");
    fault_plan::reset_counts();
    checkpoint_manager<S> m(s, "count", {2});
    total = fault_plan::calls(io_op::any);
  }
  REQUIRE(total > 15);
  for (std::uint64_t k = 1; k <= total; ++k) {
    CAPTURE(k);
    std::string id = "k" + std::to_string(k);
    std::string d = leave_leftovers(id);
    fault_plan::arm(fault{io_op::any, k, EIO});
    try {
      checkpoint_manager<S> m(s, id, {2});
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EIO);
    }
    fault_plan::disarm();
    checkpoint_manager<S> after(s, id, {2});
    CHECK(entries(d) == std::set<std::string>{"latest", "step-2", lock_file});
    REQUIRE(after.latest());
    CHECK(after.latest()->step == 2);
    CHECK(complete(after.latest()->path, 2));
    CHECK(read_file(d + "/latest") == "holdfast-checkpoints 1\nlatest step-2\nkeep step-2\n");
  }
}

namespace {

// One crash trial: a child saves continuously (with retention deleting behind it) and dies by
// SIGKILL, either at its k-th system call or after a random delay; the parent then checks what a
// restarted process sees.
template <class S>
void crash_trials(const std::string& root, int runs, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto s = S::create(root);
  using manager = checkpoint_manager<S>;
  auto w = [](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast_test::kill_io>(p, step);
  };
  // Calls per save with deletions, to aim kills across save and retention.
  std::uint64_t per_save = 0;
  {
    holdfast_test::kill_io::arm(0);
    manager m(s, "calibrate", {2});
    m.save(1, w);
    m.save(2, w);
    holdfast_test::kill_io::arm(0);
    m.save(3, w);
    per_save = holdfast_test::kill_io::calls();
  }
  REQUIRE(per_save > 30);
  std::int64_t last_seen = -1;
  int by_call = 0, mid_delete = 0, mid_save = 0;
  for (int run = 0; run < runs; ++run) {
    CAPTURE(run);
    bool timed = run % 4 == 3;  // one run in four: a random delay instead of a call number
    std::uint64_t k = std::uniform_int_distribution<std::uint64_t>(1, 3 * per_save)(rng);
    auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 20000)(rng));
    holdfast_test::child c([&] {
      holdfast_test::kill_io::arm(timed ? 0 : k);
      manager m(s, "r", {2});  // start-up sweep runs under the kill too
      auto l = m.latest();
      std::int64_t step = l ? l->step + 1 : 0;
      for (;; ++step) m.save(step, w);
    });
    if (timed) std::this_thread::sleep_for(delay);  // the kill time itself is the random input
    if (timed) c.kill(SIGKILL);
    auto res = c.wait(std::chrono::seconds(30));
    CHECK(res.term_signal == SIGKILL);
    CHECK(res.failures.empty());
    if (!timed) ++by_call;

    // What the kill interrupted, seen before the restart sweeps it.
    std::string cdir = s.checkpoint_path("r");
    if (fs::exists(cdir + "/latest") &&
        read_file(cdir + "/latest").find("\ndelete ") != std::string::npos)
      ++mid_delete;
    for (const auto& e : entries(cdir))  // commit-marker mode writes a step in place: one whose
      if (e.rfind(".staging-", 0) == 0 || e.rfind(".holdfast-tmp.", 0) == 0 ||  // files are not
          (e.rfind("step-", 0) == 0 && !complete(cdir + "/" + e, std::stoll(e.substr(5)))))
        ++mid_save;  // all there yet was cut short too

    holdfast_test::kill_io::arm(0);
    manager m(s, "r", {2});
    auto l = m.latest();
    if (last_seen >= 0) REQUIRE(l);  // once a checkpoint existed, one always does
    if (l) {
      CHECK(complete(l->path, l->step));
      CHECK(l->step >= last_seen);  // never goes back
      for (const auto& c2 : m.checkpoints()) CHECK(complete(c2.path, c2.step));
      CHECK(m.checkpoints().size() <= 2);
      last_seen = l->step;
    }
    for (const auto& e : entries(m.directory()))  // the sweep left nothing else
      CHECK((e == "latest" || e == lock_file || e.rfind("step-", 0) == 0));
  }
  CHECK(by_call > 0);
  CHECK(mid_delete > 0);  // some kills landed among the retention deletions
  CHECK(mid_save > 0);    // and some inside a save (a staging directory or a temp left)
  MESSAGE("kills during deletions: " << mid_delete << ", during saves: " << mid_save);
  CHECK(last_seen > 3);  // the runs made progress across restarts
}

}  // namespace

TEST_CASE("SIGKILL at random points of save and retention: latest() is always complete") {
  // 100 runs per commit mode in normal builds; sanitizers slow each fork, so 25 there.
  const int runs = sanitized ? 25 : 100;
  holdfast_test::shm_temp_dir dir("crash");  // process death, not power loss: tmpfs is enough
  SUBCASE("rename mode") {
    crash_trials<local_store<holdfast_test::kill_io>>(dir / "local", runs, 7);
  }
  SUBCASE("commit-marker mode") {
    crash_trials<remote_store<holdfast_test::kill_io>>(dir / "remote", runs, 11);
  }
}

TEST_CASE(
    "checkpoint identity: saves record the history begun, old metadata reads as unknown, "
    "a damaged file is named") {
  holdfast_test::temp_dir dir("identity");
  auto s = holdfast::store::create(dir.path());
  const std::string d = s.checkpoint_path("r");
  checkpoint_manager<> m(s, "r", {0});
  const auto w = [](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(p, step);
  };
  m.save(10, w);  // before begin_history: unknown
  CHECK(m.history().empty());
  m.begin_history("9f3a0c1d");
  m.save(20, w);
  CHECK_THROWS_AS(m.begin_history("not one/id"), std::invalid_argument);
  CHECK(m.metadata(10)->history.empty());
  CHECK(m.metadata(20)->identity() == holdfast::checkpoint_identity{20, "9f3a0c1d"});
  CHECK(read_file(m.checkpoints().back().path + "/holdfast-metadata.json")
            .find("\"history\": \"9f3a0c1d\"") != std::string::npos);
  CHECK(m.all_identities() ==
        std::vector<holdfast::checkpoint_identity>{{10, ""}, {20, "9f3a0c1d"}});

  // a checkpoint without metadata (holdfast 0.1.0) is of unknown history
  fs::create_directories(d + "/step-5");
  write_checkpoint<holdfast::posix_io>(d + "/step-5", 5);
  const std::string meta = m.checkpoints().back().path + "/holdfast-metadata.json";
  CHECK(holdfast::detail::checkpoint_load_identity<holdfast::posix_io>(d + "/step-5", 5) ==
        holdfast::checkpoint_identity{5, ""});

  // a damaged history: metadata reads as none (never throws), the identity names the file,
  // and the listings leave the checkpoint out, naming it once
  log_lines log;
  m.set_log(log.sink());
  for (const std::string& text :
       {std::string("{\"format\": \"holdfast-checkpoint-metadata 1\", \"step\": 20, "
                    "\"history\": \"a b\", \"time_unix_ns\": 1, \"metrics\": null}"),
        std::string("{\"format\": \"holdfast-checkpoint-metadata 1\", \"step\": 21, "
                    "\"history\": \"h\", \"time_unix_ns\": 1, \"metrics\": null}"),
        std::string("{\"format\": \"holdfast-checkpoint-metadata 1\", \"step\": 20, "
                    "\"history\": 7}"),
        std::string("not json")}) {
    INFO(text);
    write_plain(meta, text);
    try {
      (void)holdfast::detail::checkpoint_load_identity<holdfast::posix_io>(d + "/step-20", 20);
      FAIL("a damaged metadata file read as an identity");
    } catch (const holdfast::format_error& e) {
      CHECK(e.path() == meta);
    }
    const std::size_t before = log.lines.size();
    CHECK(m.all_identities() == std::vector<holdfast::checkpoint_identity>{{10, ""}});
    CHECK(m.all_steps() == steps_t{10});
    CHECK(m.latest()->step == 10);
    // named once per reason (the bad histories "a b" and 7 are one reason)
    CHECK(log.lines.size() == before + (text.find("7}") != std::string::npos ? 0 : 1));
    CHECK(log.any("'" + d + "/step-20' (step 20) skipped: its holdfast-metadata.json is damaged"));
    const std::size_t once = log.lines.size();
    (void)m.all_identities();
    (void)m.restore([](const std::string&) {});
    CHECK(log.lines.size() == once);
  }
  CHECK(log.lines.size() == 3);
  write_plain(meta,
              "{\"format\": \"holdfast-checkpoint-metadata 1\", \"step\": 20, "
              "\"history\": \"a b\"}");
  CHECK(!m.metadata(20));
}

// --- what counts as a checkpoint (issue 42, item 7) -------------------------------------------

namespace {

// How many of `log`'s lines contain `part`.
std::size_t count_lines(const log_lines& log, const std::string& part) {
  std::size_t n = 0;
  for (const auto& l : log.lines) n += l.find(part) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE_TEMPLATE(
    "an empty hand-made step-N/ is no checkpoint: not restored, not counted by retention, named "
    "once",
    Store, local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("handmade");
  auto s = Store::create(dir.path());
  log_lines log;
  holdfast::checkpoint_options o{2};  // keep the newest 2
  o.log = log.sink();
  const auto w = [](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(p, step);
  };
  std::string d;
  {
    checkpoint_manager<Store> m(s, "r", o);
    d = m.directory();
    m.save(1, w);
    m.save(2, w);
  }
  // What a new user left: the pointer gone, and an empty step-5/ made by hand (committed, in
  // marker mode, so that only its content tells it apart).
  fs::remove(d + "/latest");
  fs::create_directories(d + "/step-5");
  if (marker_mode<Store>) write_plain(d + "/step-5/commit_success.txt", "committed\n");
  const std::string named = "'" + d + "/step-5' (step 5) skipped: ";

  checkpoint_manager<Store> m(s, "r", o);
  checkpoint_manager<Store> ro(holdfast::read_only, s, "r", o);
  for (const auto* x : {&m, &ro}) {
    CHECK(x->all_steps() == steps_t{1, 2});
    CHECK(x->latest_step() == 2);
    REQUIRE(x->latest());
    CHECK(x->latest()->name == "step-2");
  }
  std::int64_t loaded = -1;
  CHECK(m.restore([&](const std::string& p, std::int64_t st) {
    loaded = complete(p, st) ? st : -2;
  }) == 2);
  CHECK(loaded == 2);
  CHECK(holdfast_test::error_from([&] { m.restore_step(5, [](const std::string&) {}); }).errnum() ==
        ENOENT);
  CHECK(m.should_save(3));              // step 5 is not a saved step either
  CHECK(count_lines(log, named) == 1);  // once per process, however many listings and managers
  CHECK(
      log.any("there is no pointer file; using the newest complete checkpoint on disk, 'step-2'"));
  auto r = m.verify();
  CHECK(!r.ok());
  REQUIRE(r.skipped.size() == 1);
  CHECK(r.skipped[0].name == "step-5");
  CHECK(r.skipped[0].why.find(marker_mode<Store> ? "no holdfast-metadata.json" : "is empty") !=
        std::string::npos);

  // Retention (keep 2) counts checkpoints only: the save of 3 keeps 2 and 3 (5 was none of the
  // two), and the pointer it writes does not name step-5.
  m.save(3, w);
  CHECK(m.all_steps() == steps_t{2, 3});
  CHECK(fs::exists(d + "/step-2"));
  CHECK(!fs::exists(d + "/step-1"));
  m.save(4, w);
  CHECK(m.all_steps() == steps_t{3, 4});
  CHECK(ro.all_steps() == steps_t{3, 4});
  CHECK(fs::is_directory(d + "/step-5"));  // left where it is, unnamed
  CHECK(count_lines(log, named) == 1);
  r = m.verify();
  CHECK(r.unnamed == std::vector<std::string>{"step-5"});

  // repair() (or the next writer's start-up sweep) removes it: a sound pointer does not name it.
  r = m.repair();
  CHECK(r.ok());
  CHECK(!fs::exists(d + "/step-5"));
  CHECK(m.all_steps() == steps_t{3, 4});
}

TEST_CASE(
    "a damaged metadata file in an older checkpoint: restore and listings take the newest "
    "checkpoint that counts, naming the damaged one once") {
  holdfast_test::temp_dir dir("damaged");
  auto s = holdfast::store::create(dir.path());
  log_lines log;
  holdfast::checkpoint_options o{0};
  o.log = log.sink();
  checkpoint_manager<> m(s, "r", o);
  const auto w = [](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(p, step);
  };
  for (std::int64_t step : {1, 2, 3}) m.save(step, w);
  const std::string d = m.directory();
  write_plain(d + "/step-2/holdfast-metadata.json", "{\"format\": \"holdfast-checkpoint-met");
  const std::string named = "'" + d +
                            "/step-2' (step 2) skipped: its holdfast-metadata.json is "
                            "damaged";
  CHECK(m.all_steps() == steps_t{1, 3});
  CHECK(m.all_identities() == std::vector<holdfast::checkpoint_identity>{{1, ""}, {3, ""}});
  std::int64_t loaded = -1;
  CHECK(m.restore([&](const std::string& p, std::int64_t st) {
    loaded = complete(p, st) ? st : -2;
  }) == 3);
  CHECK(loaded == 3);
  CHECK(count_lines(log, named) == 1);

  // The newest damaged too (a recorded file gone): the newest that counts is restored.
  fs::remove(d + "/step-3/meta/step.txt");
  checkpoint_manager<> ro(holdfast::read_only, s, "r", o);
  CHECK(ro.all_steps() == steps_t{1});
  CHECK(ro.latest()->step == 1);
  CHECK(ro.restore([&](const std::string& p, std::int64_t st) {
    loaded = complete(p, st) ? st : -2;
  }) == 1);
  CHECK(loaded == 1);
  CHECK(count_lines(log, named) == 1);
  CHECK(count_lines(log, "'" + d + "/step-3' (step 3) skipped: its file 'meta/step.txt'") == 1);
}

TEST_CASE(
    "log: a commit is an info line with its bytes and seconds, a restore names the step read, "
    "a one-argument hook hears neither") {
  holdfast_test::temp_dir dir("ckpt-log");
  auto s = local_store<holdfast::posix_io>::create(dir.path());
  std::vector<std::pair<holdfast::log_level, std::string>> events;
  holdfast::checkpoint_options o;
  o.log = [&](holdfast::log_level level, std::string_view line) {
    events.emplace_back(level, std::string(line));
  };
  for (bool async : {false, true}) {
    CAPTURE(async);
    events.clear();
    o.async_save = async;
    checkpoint_manager<local_store<holdfast::posix_io>> m(s, async ? "async" : "sync", o);
    auto info = m.save(7, write_checkpoint<holdfast::posix_io>);
    m.wait_until_finished();
    REQUIRE(events.size() == 1);
    CHECK(events[0].first == holdfast::log_level::info);
    const std::string committed =
        "checkpoint step 7 committed: '" + info.path + "', 29040 bytes in ";  // the three files
    CHECK(events[0].second.substr(0, committed.size()) == committed);
    CHECK(events[0].second.substr(events[0].second.size() - 2) == " s");
    events.clear();
    CHECK(m.restore([](const std::string&, std::int64_t) {}) == 7);
    REQUIRE(events.size() == 1);
    CHECK(events[0].first == holdfast::log_level::info);
    CHECK(events[0].second == "checkpoint restore: step 7 read from '" + info.path + "'");

    log_lines problems;
    m.set_log(problems.sink());
    m.save(8, write_checkpoint<holdfast::posix_io>);
    m.wait_until_finished();
    CHECK(m.restore([](const std::string&, std::int64_t) {}) == 8);
    CHECK(problems.lines.empty());
  }
}
