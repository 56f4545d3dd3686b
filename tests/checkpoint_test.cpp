// checkpoint_manager: save/latest/restore in both commit modes, retention (max_to_keep 1 and 3),
// the pointer protocol, all_steps/latest_step/restore_step and pinning, start-up sweeping, bad
// pointers, every syscall failing in turn, and SIGKILL at random points of save and of retention
// deletions (100 runs).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <holdfast/checkpoint.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/child.hpp"
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

using holdfast_test::sanitized;

std::string read_file(const std::string& path) {
  auto fd = holdfast::open_file(path, O_RDONLY);
  return holdfast::read_all(fd);
}

void write_plain(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  auto fd = holdfast::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  holdfast::write_all(fd, content.data(), content.size());
  fd.close();
}

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

template <class E, class F>
std::string error_text(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no exception of the expected type was thrown");
  return {};
}

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

  // A second manager (a restarted process) sees the same state.
  checkpoint_manager<Store> again(s, "run-1", {3});
  REQUIRE(again.latest());
  CHECK(again.latest()->step == 11);
  CHECK(again.checkpoints().size() == 2);
  CHECK(entries(m.directory()) ==
        std::set<std::string>{"latest", "step-10", "step-11"});  // no staging left

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
      std::set<std::string> expect_entries{"latest"};
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
    "max_to_keep 0 keeps all; re-saving a step supersedes it; a throwing writer leaves no trace") {
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

TEST_CASE("bad pointers give clear errors naming the pointer file and the checkpoint") {
  holdfast_test::temp_dir dir("bad");
  auto s = holdfast::store::create(dir.path());
  checkpoint_manager<> m(s, "r", {2});
  m.set_writer([](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  });
  m.save(1);
  m.save(2);
  const std::string pointer = m.pointer_path();
  const std::string good = read_file(pointer);

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
      {"holdfast-checkpoints 1\nlatest step-x\nkeep step-x\n",
       "line 2: expected a checkpoint name"},
      {"holdfast-checkpoints 1\nlatest step-2\n", "not among the 'keep' lines"},
      {"holdfast-checkpoints 1\nnewest step-2\n", "line 2: unknown key 'newest'"},
      {"holdfast-checkpoints 1\nlatest step-2\nkeep step-2\nlatest step-2\n", "line 4"},
      {"holdfast-checkpoints 1\nlatest step-02\nkeep step-02\n", "line 2"},
      {"holdfast-checkpoints 1\nkeep step-2\n", "no 'latest' line"},
  };
  for (const auto& g : garbage) {
    CAPTURE(g.content);
    write_plain(pointer, g.content);
    auto text = error_text<holdfast::format_error>([&] { (void)m.latest(); });
    CHECK(text.find(pointer) != std::string::npos);
    CHECK(text.find(g.says) != std::string::npos);
    CHECK_THROWS_AS(m.restore(), holdfast::format_error);
    CHECK_THROWS_AS(m.save(3), holdfast::format_error);  // never guesses over a bad pointer
    // A restarted process fails at construction, naming the file.
    CHECK(error_text<holdfast::format_error>([&] {
            checkpoint_manager<> fresh(s, "r");
          }).find(pointer) != std::string::npos);
  }

  // A pointer naming a checkpoint that is missing.
  write_plain(pointer, good);
  fs::remove_all(m.directory() + "/step-2");
  auto text = error_text<holdfast::error>([&] { (void)m.latest(); });
  CHECK(text.find(m.directory() + "/step-2") != std::string::npos);
  CHECK(text.find(pointer) != std::string::npos);
  CHECK(text.find("missing") != std::string::npos);
  try {
    (void)m.latest();
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == ENOENT);
    CHECK(e.path() == m.directory() + "/step-2");
  }
  CHECK_THROWS_AS(m.restore(), holdfast::error);
}

TEST_CASE(
    "marker mode: a checkpoint without its marker is absent, and named by the pointer an error") {
  holdfast_test::temp_dir dir("marker");
  auto s = remote_store<holdfast::posix_io>::create(dir.path());
  checkpoint_manager<remote_store<holdfast::posix_io>> m(s, "r", {2});
  m.set_writer([](const std::string& d, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(d, step);
  });
  m.save(1);
  fs::remove(m.directory() + "/step-1/commit_success.txt");
  auto text = error_text<holdfast::error>([&] { (void)m.latest(); });
  CHECK(text.find("commit marker") != std::string::npos);
  CHECK(text.find(m.directory() + "/step-1") != std::string::npos);
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
  if (marker_mode<Store>) write_plain(path + "/commit_success.txt", "committed\n");
}

std::string pointer_text(const std::string& latest, const std::vector<std::string>& keep) {
  std::string s = "holdfast-checkpoints 1\nlatest " + latest + "\n";
  for (const auto& k : keep) s += "keep " + k + "\n";
  return s;
}

}  // namespace

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
  CHECK_THROWS_AS(m.checkpoints(), holdfast::error);  // the strict listing still refuses
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

TEST_CASE("latest_step gives nothing, never an exception, for an empty or garbled pointer") {
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
    CHECK(!m.latest_step());
    auto text = error_text<holdfast::format_error>([&] { (void)m.all_steps(); });
    CHECK(text.find(m.pointer_path()) != std::string::npos);
    CHECK_THROWS_AS(m.restore_step(4), holdfast::format_error);
  }
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
  checkpoint_manager<Store> m(s, "r", {2});
  m.set_writer([](const std::string& p, std::int64_t step) {
    write_checkpoint<holdfast::posix_io>(p, step);
  });
  auto on_disk = [&] {
    std::set<std::string> out;
    for (const auto& e : entries(m.directory()))
      if (e != "latest") out.insert(e);
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

  checkpoint_manager<Store> m(s, "r", {3});
  CHECK(entries(d) == std::set<std::string>{"latest", "step-2", "step-3", "README.user"});
  CHECK(read_file(d + "/latest") ==
        "holdfast-checkpoints 1\nlatest step-3\nkeep step-2\nkeep step-3\n");
  CHECK(m.latest()->step == 3);

  // Without a pointer nothing complete is removed, only scratch (and marker-less dirs).
  fs::remove(d + "/latest");
  write_plain(d + "/.staging-step-5-999-3/w", "half");
  fs::create_directories(d + "/step-6");  // committed in neither mode's sense for marker mode
  checkpoint_manager<Store> n(s, "r", {3});
  auto left = entries(d);
  CHECK(left.count("step-2") == 1);
  CHECK(left.count("step-3") == 1);
  CHECK(left.count(".staging-step-5-999-3") == 0);
  if (std::is_same_v<Store, remote_store<holdfast::posix_io>>) CHECK(left.count("step-6") == 0);
  CHECK(!n.latest());

  // An age threshold keeps fresh scratch directories (another saver may be writing them).
  write_plain(d + "/.staging-step-7-999-4/w", "fresh");
  checkpoint_manager<Store> aged(s, "r", {3, std::chrono::hours(1)});
  CHECK(entries(d).count(".staging-step-7-999-4") == 1);
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
        CHECK((e == "latest" || e.rfind("step-", 0) == 0));
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
    CHECK(entries(d) == std::set<std::string>{"latest", "step-2"});
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
    for (const auto& e : entries(cdir))
      if (e.rfind(".staging-", 0) == 0 || e.rfind(".holdfast-tmp.", 0) == 0) ++mid_save;

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
    for (const auto& e : entries(m.directory()))
      CHECK((e == "latest" || e.rfind("step-", 0) == 0));  // the sweep left nothing else
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
