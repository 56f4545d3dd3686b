// checkpoint_manager as users of Orbax's and TF's managers expect it: per-checkpoint metadata
// (save time, user metrics) and best_step, should_save with step and time intervals, retention
// policies (keep the last N, every N steps, every N hours on an injected clock, the best N by a
// metric, your own rule, any-of, never the latest nor the pinned step), name prefixes and
// zero-padded widths (and runs written with another width), and async saves in one process
// (returns before the commit, one in flight, failures rethrown, restore/destruction wait), and
// the hang detector's bounds in the metadata (every save records the last set, restores read
// them back, old and malformed files read as none).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <holdfast/checkpoint.hpp>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/files.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

namespace fs = std::filesystem;
using holdfast::checkpoint_manager;
using holdfast::checkpoint_options;
using holdfast::metric_order;
using holdfast::retention_policy;
using steps_t = std::vector<std::int64_t>;
using namespace std::chrono_literals;

namespace {

using holdfast_test::read_file;
using holdfast_test::write_plain;

// A checkpoint's one file holds its step.
void write_step(const std::string& dir, std::int64_t step) {
  write_plain(dir + "/state", std::to_string(step));
}
bool holds(const std::string& dir, std::int64_t step) {
  std::error_code ec;
  return fs::exists(dir + "/state", ec) && read_file(dir + "/state") == std::to_string(step);
}

std::set<std::string> checkpoint_dirs(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n[0] != '.') out.insert(n);
  }
  return out;
}

// A wall clock the test moves by hand.
struct fake_clock {
  std::shared_ptr<std::chrono::system_clock::time_point> now =
      std::make_shared<std::chrono::system_clock::time_point>(
          std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 50)));
  std::function<std::chrono::system_clock::time_point()> fn() const {
    auto p = now;
    return [p] { return *p; };
  }
  void advance(std::chrono::nanoseconds d) {
    *now += std::chrono::duration_cast<std::chrono::system_clock::duration>(d);
  }
};

struct log_lines {
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  holdfast::log_fn sink() const {
    auto m = mutex;
    auto l = lines;
    return [m, l](std::string_view line) {
      std::lock_guard<std::mutex> g(*m);
      l->emplace_back(line);
    };
  }
  bool any(const std::string& part) const {
    std::lock_guard<std::mutex> g(*mutex);
    for (const auto& l : *lines)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }
};

}  // namespace

TEST_CASE("metadata: save time and user metrics in each checkpoint — best_step") {
  holdfast_test::temp_dir dir("meta");
  auto s = holdfast::store::create(dir.path());
  fake_clock clock;
  checkpoint_options o{0};
  o.clock = clock.fn();
  checkpoint_manager<> m(s, "r", o);
  m.set_writer(write_step);
  const auto t0 = *clock.now;

  m.save(1, {{"loss", 0.75}, {"accuracy", 0.5}, {"note", "warm-up"}});
  clock.advance(90s);
  m.save(2, {{"loss", 0.25}, {"accuracy", 0.5}});
  clock.advance(90s);
  m.save(3, {{"loss", 0.5}, {"accuracy", 0.875}});
  m.save(4);  // no metrics

  auto m1 = m.metadata(1);
  REQUIRE(m1);
  CHECK(m1->step == 1);
  CHECK(m1->time == t0);
  CHECK(m1->metric("loss") == 0.75);
  CHECK(m1->metric("note") == std::nullopt);  // not a number
  CHECK(m1->metrics.find("note")->as_string() == "warm-up");
  CHECK(m.metadata(2)->time == t0 + 90s);
  CHECK(m.metadata(4)->metrics.is_null());
  CHECK(!m.metadata(5));

  // The file: JSON any tool can read.
  const std::string text = read_file(m.directory() + "/step-2/holdfast-metadata.json");
  auto doc = holdfast::detail::parse_json(text, "metadata");
  CHECK(doc.find("format")->as_string() == "holdfast-checkpoint-metadata 1");
  CHECK(doc.find("step")->as_int64() == 2);
  CHECK(doc.find("time_unix_ns")->as_int64() == holdfast::detail::checkpoint_to_unix_ns(t0 + 90s));
  CHECK(doc.find("metrics")->find("loss")->as_double() == 0.25);

  CHECK(m.best_step("loss", metric_order::min) == 2);
  CHECK(m.best_step("accuracy", metric_order::max) == 3);
  CHECK(m.best_step("accuracy", metric_order::min) == 2);  // ties: the newer
  CHECK(!m.best_step("bleu", metric_order::max));

  // A read_only opener sees the same.
  checkpoint_manager<> ro(holdfast::read_only, s, "r");
  CHECK(ro.metadata(3)->metric("accuracy") == 0.875);

  // The name is reserved: a writer that creates it fails the save, leaving no trace.
  const std::string before = read_file(m.pointer_path());
  CHECK_THROWS_WITH_AS(
      m.save(5, [](const std::string& d) { write_plain(d + "/holdfast-metadata.json", "{}"); }),
      doctest::Contains("metadata file"), holdfast::error);
  CHECK(read_file(m.pointer_path()) == before);
  CHECK(checkpoint_dirs(m.directory()).size() == 4);

  // write_metadata off: no file, no metadata.
  holdfast_test::temp_dir dir2("nometa");
  checkpoint_options off;
  off.write_metadata = false;
  checkpoint_manager<> n(dir2.path(), holdfast::directory_commit::rename, off);
  n.save(1, write_step);
  CHECK(!fs::exists(n.directory() + "/step-1/holdfast-metadata.json"));
  CHECK(!n.metadata(1));
}

TEST_CASE("should_save: new steps at the interval, or once the time interval passed") {
  holdfast_test::temp_dir dir("should");
  fake_clock clock;
  checkpoint_options o;
  o.clock = clock.fn();
  {
    checkpoint_manager<> every(dir / "a", holdfast::directory_commit::rename, o);  // default: 1
    CHECK(every.should_save(0));
    CHECK(every.should_save(7));
    every.save(7, write_step);
    CHECK(!every.should_save(7));  // saved
    CHECK(!every.should_save(3));  // older than the newest saved
    CHECK(every.should_save(8));
    CHECK(!every.should_save(-1));
  }
  {
    // A restarted writer knows the newest step on disk.
    checkpoint_manager<> again(dir / "a", holdfast::directory_commit::rename, o);
    CHECK(!again.should_save(7));
    CHECK(again.should_save(8));
    checkpoint_manager<> ro(holdfast::read_only, dir / "a", holdfast::directory_commit::rename);
    CHECK(!ro.should_save(100));  // a reader never saves
  }
  o.save_interval_steps = 5;
  checkpoint_manager<> by5(dir / "b", holdfast::directory_commit::rename, o);
  std::vector<std::int64_t> due;
  for (std::int64_t step = 0; step <= 16; ++step)
    if (by5.should_save(step)) {
      due.push_back(step);
      by5.save(step, write_step);
    }
  CHECK(due == steps_t{0, 5, 10, 15});

  // Time: every 10 minutes of (injected) wall clock, whatever the step.
  o.save_interval_steps = 0;
  o.save_interval = 10min;
  checkpoint_manager<> timed(dir / "c", holdfast::directory_commit::rename, o);
  CHECK(timed.should_save(1));  // nothing saved yet
  timed.save(1, write_step);
  clock.advance(9min);
  CHECK(!timed.should_save(2));
  clock.advance(1min);
  CHECK(timed.should_save(2));
  CHECK(!timed.should_save(1));  // never an old step
}

TEST_CASE("retention policies: every N steps, every N hours, best N, custom, any-of") {
  holdfast_test::temp_dir dir("policy");
  auto run = [&](const std::string& name, checkpoint_options o) {
    return checkpoint_manager<>(dir / name, holdfast::directory_commit::rename, std::move(o));
  };

  SUBCASE("keep_last(N) replaces max_to_keep; every_n_steps keeps the multiples") {
    checkpoint_options o{1};  // ignored: retention is set
    o.retention = retention_policy::keep_last(2) | retention_policy::every_n_steps(10);
    auto m = run("steps", o);
    for (std::int64_t step = 1; step <= 25; ++step) m.save(step, write_step);
    CHECK(m.all_steps() == steps_t{10, 20, 24, 25});
    CHECK(checkpoint_dirs(m.directory()) ==
          std::set<std::string>{"step-10", "step-20", "step-24", "step-25"});
    for (std::int64_t st : m.all_steps())
      CHECK(holds(m.directory() + "/step-" + std::to_string(st), st));
  }

  SUBCASE("every_n_hours(1) (TF keep_checkpoint_every_n_hours) on an injected clock") {
    fake_clock clock;
    checkpoint_options o;
    o.clock = clock.fn();
    o.retention = retention_policy::keep_last(1) | retention_policy::every_n_hours(1);
    auto m = run("hours", o);
    for (std::int64_t step = 0; step <= 6; ++step) {  // one save every 25 minutes
      m.save(step, write_step);
      clock.advance(25min);
    }
    // Kept: the first (t=0), then the first at least an hour after it (t=75 min), then the
    // first an hour after that (t=150 min, also the latest).
    CHECK(m.all_steps() == steps_t{0, 3, 6});
    m.save(7, write_step);  // t=175 min: only 25 min after step 6
    CHECK(m.all_steps() == steps_t{0, 3, 6, 7});
    clock.advance(25min);
    m.save(8, write_step);  // step 7 is neither the latest nor an hour after step 6
    CHECK(m.all_steps() == steps_t{0, 3, 6, 8});
  }

  SUBCASE("every(period) on checkpoints without metadata uses their directory mtime") {
    const std::string d = dir / "mtime";
    fs::create_directories(d);
    auto now = fs::file_time_type::clock::now();
    for (int i : {1, 2}) {
      fs::create_directories(d + "/step-" + std::to_string(i));
      write_step(d + "/step-" + std::to_string(i), i);
    }
    fs::last_write_time(d + "/step-1", now - 5h);
    fs::last_write_time(d + "/step-2", now - 2h);  // 3 hours after step-1
    write_plain(d + "/latest", "holdfast-checkpoints 1\nlatest step-2\nkeep step-1\nkeep step-2\n");
    checkpoint_options o;
    o.retention = retention_policy::keep_last(1) | retention_policy::every(1h);
    auto m = run("mtime", o);
    m.save(3, write_step);  // now: 2 hours after step-2
    CHECK(m.all_steps() == steps_t{1, 2, 3});
    m.save(4, write_step);  // seconds after step 3: kept only while it is the latest
    CHECK(m.all_steps() == steps_t{1, 2, 3, 4});
    m.save(5, write_step);
    CHECK(m.all_steps() == steps_t{1, 2, 3, 5});
  }

  SUBCASE("best_n by a metric (Orbax BestN), min and max, with the latest always kept") {
    checkpoint_options o;
    o.retention = retention_policy::best_n(2, "loss", metric_order::min);
    auto m = run("best", o);
    const double losses[] = {0.9, 0.5, 0.7, 0.3, 0.8};
    for (std::int64_t step = 1; step <= 5; ++step)
      m.save(step, write_step, {{"loss", losses[step - 1]}});
    CHECK(m.all_steps() == steps_t{2, 4, 5});     // the two best, and the latest (the worst)
    CHECK_THROWS_AS(m.save(6), holdfast::error);  // no writer set: fails, changes nothing
    CHECK(m.all_steps() == steps_t{2, 4, 5});
  }

  SUBCASE("best_n max, composed with keep_last; checkpoints without the metric") {
    checkpoint_options o;
    o.retention = retention_policy::any_of(
        {retention_policy::keep_last(1), retention_policy::best_n(1, "acc", metric_order::max)});
    auto m = run("bestmax", o);
    m.save(1, write_step, {{"acc", 0.6}});
    m.save(2, write_step, {{"acc", 0.9}});
    m.save(3, write_step);  // no metric: kept while latest only
    m.save(4, write_step, {{"acc", 0.7}});
    CHECK(m.all_steps() == steps_t{2, 4});
    CHECK(m.best_step("acc", metric_order::max) == 2);
  }

  SUBCASE("a custom rule, and the pinned step kept whatever the policy says") {
    checkpoint_options o;
    o.retention = retention_policy::custom([](const std::vector<holdfast::retention_candidate>& c) {
      std::vector<bool> keep(c.size());
      for (std::size_t i = 0; i < c.size(); ++i) keep[i] = c[i].step % 2 == 0;
      return keep;
    });
    auto m = run("custom", o);
    m.save(1, write_step);
    m.pin(1);
    for (std::int64_t step = 2; step <= 7; ++step) m.save(step, write_step);
    CHECK(m.all_steps() == steps_t{1, 2, 4, 6, 7});  // even ones, the pinned 1, the latest 7
    m.pin(std::nullopt);
    m.save(8, write_step);
    CHECK(m.all_steps() == steps_t{2, 4, 6, 8});
  }
}

TEST_CASE("names: step_prefix and zero-padded width — other widths stay readable") {
  using holdfast::detail::checkpoint_step_of;
  CHECK(checkpoint_step_of("step-7") == 7);
  CHECK(checkpoint_step_of("step-007") == 7);  // 0.1.0 rejected leading zeros
  CHECK(checkpoint_step_of("step-0") == 0);
  CHECK(checkpoint_step_of("step-00000000000000000000000012") == 12);
  CHECK(checkpoint_step_of("step-12.003") == 12);
  CHECK(!checkpoint_step_of("step-"));
  CHECK(!checkpoint_step_of("step-1x"));
  CHECK(!checkpoint_step_of("step-1."));
  CHECK(!checkpoint_step_of("step-1234567890123456789"));  // 19 significant digits
  CHECK(checkpoint_step_of("ckpt_00000042", "ckpt_") == 42);
  CHECK(!checkpoint_step_of("step-42", "ckpt_"));

  holdfast_test::temp_dir dir("names");
  const std::string d = dir / "ckpt";
  checkpoint_options o{2};
  o.step_prefix = "ckpt_";
  o.step_format_fixed_length = 8;
  {
    checkpoint_manager<> m(d, holdfast::directory_commit::rename, o);
    CHECK(m.save(12, write_step).name == "ckpt_00000012");
    CHECK(m.save(123456789, write_step).name == "ckpt_123456789");  // wider than 8: all digits
    CHECK(m.save(12, write_step).name == "ckpt_00000012.1");        // a re-save
    CHECK(m.latest()->name == "ckpt_00000012.1");
    CHECK(m.all_steps() == steps_t{12, 123456789});
  }
  // The same run opened unpadded (a changed width): read, restored, retained alike.
  o.step_format_fixed_length = 0;
  {
    checkpoint_manager<> m(d, holdfast::directory_commit::rename, o);
    CHECK(m.all_steps() == steps_t{12, 123456789});
    std::string from;
    m.restore_step(12,
                   [&](const std::string& p, std::int64_t st) { from = holds(p, st) ? p : ""; });
    CHECK(from == d + "/ckpt_00000012.1");
    CHECK(m.save(13, write_step).name == "ckpt_13");
    CHECK(m.all_steps() == steps_t{12, 13});  // keep 2: the padded 123456789 went
  }
  // Written unpadded, read padded; and a run of another prefix is left alone.
  o.step_format_fixed_length = 5;
  o.step_prefix = "step-";
  log_lines log;
  o.log = log.sink();
  {
    checkpoint_manager<> m(d, holdfast::directory_commit::rename, o);
    CHECK(m.all_steps().empty());  // ckpt_ names are not this prefix's
    CHECK(log.any("expected a checkpoint name 'step-<N>'"));
    CHECK(m.save(14, write_step).name == "step-00014");
    CHECK(checkpoint_dirs(d).count("ckpt_13") == 1);  // never deleted by another prefix's run
  }

  for (const char* bad : {"", ".hidden", "a/b", "new\nline"}) {
    CAPTURE(bad);
    checkpoint_options b;
    b.step_prefix = bad;
    try {
      checkpoint_manager<> m(dir / "bad", holdfast::directory_commit::rename, b);
      FAIL("a bad step_prefix was accepted");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EINVAL);
      CHECK(e.operation() == "step_prefix");
    }
  }
}

namespace {

// A latch the test opens by hand.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void release() {
    {
      std::lock_guard<std::mutex> l(m);
      open = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return open; });
  }
};

}  // namespace

TEST_CASE("async save: returns once the writer ran — one in flight — restore and wait join it") {
  holdfast_test::temp_dir dir("async");
  checkpoint_options o{2};
  o.async_save = true;
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, o);
  m.save(1, write_step);
  m.wait_until_finished();
  REQUIRE(m.latest());
  CHECK(m.latest()->step == 1);

  // The writer snapshots in the caller's thread and returns the slow part, which runs on the
  // background thread: save() returns while it is blocked, and nothing is published yet.
  gate g;
  std::atomic<bool> deferred_ran{false};
  std::thread::id writer_thread, deferred_thread;
  auto info = m.save(2, [&](const std::string& d, std::int64_t step) {
    writer_thread = std::this_thread::get_id();
    return [&, d, step] {
      g.wait();
      deferred_thread = std::this_thread::get_id();
      write_step(d, step);
      deferred_ran = true;
    };
  });
  CHECK(info.name == "step-2");
  CHECK(writer_thread == std::this_thread::get_id());
  CHECK(!deferred_ran);
  CHECK(m.latest()->step == 1);  // not published before the commit
  CHECK(m.all_steps() == steps_t{1});
  CHECK(!m.should_save(2));  // in flight counts as saved

  // restore() waits for the save in flight.
  const pid_t me = holdfast_test::this_thread_id();
  std::atomic<bool> restore_blocked{false};
  std::thread opener([&] {
    // once restore() is observed waiting (asleep on a futex) for the save in flight
    restore_blocked = holdfast_test::wait_asleep_in({me}, {SYS_futex}, 10s);
    g.release();
  });
  std::int64_t restored = -1;
  CHECK(m.restore([&](const std::string& p, std::int64_t st) {
    restored = holds(p, st) ? st : -2;
  }) == 2);
  opener.join();
  CHECK(restore_blocked);
  CHECK(restored == 2);
  CHECK(deferred_ran);
  CHECK(deferred_thread != std::this_thread::get_id());

  // One in flight: the next save waits for the previous commit before running its writer.
  gate g2;
  std::atomic<bool> first_done{false};
  m.save(3, [&](const std::string& d, std::int64_t step) {
    return [&, d, step] {
      g2.wait();
      write_step(d, step);
      first_done = true;
    };
  });
  std::thread opener2([&] {
    // once the next save is observed waiting for the previous commit
    (void)holdfast_test::wait_asleep_in({me}, {SYS_futex}, 10s);
    g2.release();
  });
  bool first_done_when_second_wrote = false;
  m.save(4, [&](const std::string& d, std::int64_t step) {
    first_done_when_second_wrote = first_done.load();
    write_step(d, step);
  });
  opener2.join();
  CHECK(first_done_when_second_wrote);
  m.wait_until_finished();
  CHECK(m.all_steps() == steps_t{3, 4});

  // Destruction waits too: a reader opened afterwards sees the save.
  {
    checkpoint_manager<> moved(std::move(m));  // a manager moves with its save in flight
    moved.save(5, [](const std::string& d, std::int64_t step) {
      return [d, step] {
        std::this_thread::sleep_for(50ms);
        write_step(d, step);
      };
    });
  }
  checkpoint_manager<> ro(holdfast::read_only, dir / "c", holdfast::directory_commit::rename);
  CHECK(ro.latest()->step == 5);
  CHECK(ro.all_steps() == steps_t{4, 5});
}

TEST_CASE("async save: a background failure is rethrown once, by wait or by the next call") {
  holdfast_test::temp_dir dir("asyncfail");
  log_lines log;
  checkpoint_options o{3};
  o.async_save = true;
  o.log = log.sink();
  auto failing = [](const std::string& d, std::int64_t step) {
    write_step(d, step);
    return [] { throw std::runtime_error("disk quota (background)"); };
  };
  {
    checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, o);
    m.set_writer(write_step);
    m.save(1);
    m.wait_until_finished();
    const std::string before = read_file(m.pointer_path());

    m.save(2, failing);
    CHECK(!m.should_save(2));
    CHECK_THROWS_WITH_AS(m.wait_until_finished(), "disk quota (background)", std::runtime_error);
    m.wait_until_finished();  // once
    CHECK(read_file(m.pointer_path()) == before);
    CHECK(checkpoint_dirs(m.directory()) == std::set<std::string>{"step-1"});  // no trace
    CHECK(m.should_save(2));  // the failed step is due again

    m.save(2, failing);
    CHECK_THROWS_WITH_AS(m.save(3), "disk quota (background)", std::runtime_error);
    m.save(3);  // the failure was reported: this one runs
    m.save(4, failing);
    CHECK_THROWS_AS(m.restore(), std::runtime_error);
    m.save(4, failing);
    CHECK_THROWS_AS(m.restore_step(1), std::runtime_error);
    m.wait_until_finished();
    CHECK(m.all_steps() == steps_t{1, 3});

    // Nobody waits for the last one: destruction logs it.
    m.save(5, failing);
  }
  CHECK(log.any("background save of step 5"));
  CHECK(log.any("disk quota (background)"));

  // Synchronous mode runs a returned deferred part inline, and throws its failure directly.
  checkpoint_options sync{3};
  checkpoint_manager<> s(dir / "c", holdfast::directory_commit::rename, sync);
  CHECK_THROWS_AS(s.save(6, failing), std::runtime_error);
  bool ran = false;
  s.save(6, [&](const std::string& d, std::int64_t step) {
    return [&, d, step] {
      write_step(d, step);
      ran = true;
    };
  });
  CHECK(ran);
  CHECK(s.latest()->step == 6);
}

namespace {

using std::chrono::nanoseconds;

// Two distinct sets of bounds; the second at the edges of the fields' ranges.
const holdfast::hang_bounds bounds_a{nanoseconds(1'500'000'000), nanoseconds(20'000'000'000),
                                     nanoseconds(3'000'000'007), 1234};
const holdfast::hang_bounds bounds_b{nanoseconds(INT64_MAX), nanoseconds(0), nanoseconds(1),
                                     UINT64_MAX};

// The metadata of step 7 in history "h1" with `hang` as its "hang_bounds" text (none: absent).
std::string metadata_text(const std::string& hang) {
  return "{\"format\": \"holdfast-checkpoint-metadata 1\", \"step\": 7, \"history\": \"h1\", "
         "\"time_unix_ns\": 5, \"metrics\": {\"loss\": 0.5}" +
         (hang.empty() ? std::string() : ", \"hang_bounds\": " + hang) + "}";
}

// restore_step(step) with the default reader, then what it restored.
std::optional<holdfast::hang_bounds> restored_at(checkpoint_manager<>& m, std::int64_t step) {
  m.restore_step(step);
  return m.restored_hang_bounds();
}

}  // namespace

TEST_CASE(
    "hang bounds: every save records the last set, restores and a restarted manager read them") {
  holdfast_test::temp_dir dir("hangb");
  auto s = holdfast::store::create(dir.path());
  {
    checkpoint_manager<> m(s, "r");
    m.set_writer(write_step);
    m.set_reader([](const std::string&) {});
    CHECK(!m.restored_hang_bounds());
    CHECK(!m.restore());  // nothing to restore
    CHECK(!m.restored_hang_bounds());

    m.save(1);  // before set_hang_bounds: none recorded
    m.set_hang_bounds(bounds_a);
    m.save(2);
    m.save(3, {{"loss", 0.5}});  // still bounds_a: until set again
    m.set_hang_bounds(bounds_b);
    m.save(4);

    CHECK(!m.metadata(1)->hang);
    CHECK(m.metadata(2)->hang == bounds_a);
    CHECK(m.metadata(3)->hang == bounds_a);
    CHECK(m.metadata(3)->metric("loss") == 0.5);
    CHECK(m.metadata(4)->hang == bounds_b);
    CHECK(read_file(m.directory() + "/step-1/holdfast-metadata.json").find("hang_bounds") ==
          std::string::npos);

    // The file: the four integers, in a format older readers still accept.
    const std::string text = read_file(m.directory() + "/step-2/holdfast-metadata.json");
    auto doc = holdfast::detail::parse_json(text, "metadata");
    CHECK(doc.find("format")->as_string() == "holdfast-checkpoint-metadata 1");
    const auto* h = doc.find("hang_bounds");
    REQUIRE(h);
    CHECK(h->find("step_ns")->as_int64() == 1'500'000'000);
    CHECK(h->find("save_ns")->as_int64() == 20'000'000'000);
    CHECK(h->find("restore_ns")->as_int64() == 3'000'000'007);
    CHECK(h->find("steps")->as_uint64() == 1234);
    CHECK(holdfast::detail::checkpoint_load_identity<holdfast::posix_io>(
              m.directory() + "/step-2", 2) == holdfast::checkpoint_identity{2, ""});

    // Each restore reports the bounds of the checkpoint it loaded, and only that one's.
    CHECK(m.restore() == 4);
    CHECK(m.restored_hang_bounds() == bounds_b);
    CHECK(restored_at(m, 2) == bounds_a);
    CHECK(!restored_at(m, 1));
    CHECK(restored_at(m, 3) == bounds_a);
    CHECK_THROWS_AS(m.restore_step(99), holdfast::error);  // no checkpoint: none restored
    CHECK(!m.restored_hang_bounds());
    CHECK(restored_at(m, 4) == bounds_b);
    CHECK_THROWS_AS(m.restore_step(2, [](const std::string&) { throw std::runtime_error("x"); }),
                    std::runtime_error);  // a reader that fails restored nothing
    CHECK(!m.restored_hang_bounds());
  }

  // A restarted job: a new manager on the same directory starts with nothing restored, then
  // reads what its predecessor saved.
  checkpoint_manager<> next(s, "r");
  CHECK(!next.restored_hang_bounds());
  CHECK(next.restore([](const std::string&) {}) == 4);
  CHECK(next.restored_hang_bounds() == bounds_b);
  checkpoint_manager<> ro(holdfast::read_only, s, "r");
  ro.restore_step(2, [](const std::string&) {});
  CHECK(ro.restored_hang_bounds() == bounds_a);
}

TEST_CASE("hang bounds: an async save records those set when save() was called") {
  holdfast_test::temp_dir dir("hanga");
  checkpoint_options o{0};
  o.async_save = true;
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, o);
  m.set_hang_bounds(bounds_a);
  gate g;
  m.save(1, [&](const std::string& d, std::int64_t step) {
    return [&g, d, step] {
      g.wait();  // the commit waits until the bounds were changed
      write_step(d, step);
    };
  });
  m.set_hang_bounds(bounds_b);  // while step 1 is in flight
  g.release();
  m.wait_until_finished();
  m.save(2, write_step);
  m.wait_until_finished();
  CHECK(m.metadata(1)->hang == bounds_a);
  CHECK(m.metadata(2)->hang == bounds_b);
  CHECK(m.restore([](const std::string&) {}) == 2);
  CHECK(m.restored_hang_bounds() == bounds_b);
  m.restore_step(1, [](const std::string&) {});
  CHECK(m.restored_hang_bounds() == bounds_a);
}

TEST_CASE("hang bounds: absent in old files, and a malformed one reads as absent, never throws") {
  using holdfast::detail::parse_checkpoint_metadata;
  // An old file (no "hang_bounds"): the rest reads, the bounds are absent.
  auto old = parse_checkpoint_metadata(metadata_text(""), "old");
  REQUIRE(old);
  CHECK(old->step == 7);
  CHECK(old->history == "h1");
  CHECK(!old->hang);

  auto edge = parse_checkpoint_metadata(
      metadata_text("{\"step_ns\": 0, \"save_ns\": 9223372036854775807, \"restore_ns\": 2, "
                    "\"steps\": 18446744073709551615}"),
      "edge");
  REQUIRE(edge);
  CHECK(edge->hang ==
        holdfast::hang_bounds{nanoseconds(0), nanoseconds(INT64_MAX), nanoseconds(2), UINT64_MAX});

  const std::vector<std::string> malformed = {
      "null",
      "[]",
      "\"5 s\"",
      "12",
      "{}",
      R"({"step_ns": 1, "save_ns": 2, "restore_ns": 3})",                // no steps
      R"({"save_ns": 2, "restore_ns": 3, "steps": 4})",                  // no step_ns
      R"({"step_ns": "1", "save_ns": 2, "restore_ns": 3, "steps": 4})",  // a string
      R"({"step_ns": 1.5, "save_ns": 2, "restore_ns": 3, "steps": 4})",  // a fraction
      R"({"step_ns": 1, "save_ns": 2e9, "restore_ns": 3, "steps": 4})",  // an exponent
      R"({"step_ns": 1, "save_ns": 2, "restore_ns": -3, "steps": 4})",   // negative
      R"({"step_ns": 1, "save_ns": 2, "restore_ns": 3, "steps": -4})",   // negative
      R"({"step_ns": 9223372036854775808, "save_ns": 2, "restore_ns": 3, "steps": 4})",
      R"({"step_ns": 1, "save_ns": 2, "restore_ns": 3, "steps": 18446744073709551616})",
      R"({"step_ns": 1, "save_ns": 2, "restore_ns": 3, "steps": null})",
  };
  for (const auto& h : malformed) {
    CAPTURE(h);
    std::optional<holdfast::checkpoint_metadata> m;
    CHECK_NOTHROW(m = parse_checkpoint_metadata(metadata_text(h), "bad"));
    REQUIRE(m);
    CHECK(m->step == 7);  // the rest still reads
    CHECK(m->history == "h1");
    CHECK(m->metric("loss") == 0.5);
    CHECK(!m->hang);
  }

  // On disk: a checkpoint whose file was written by an older holdfast, or holds a malformed
  // "hang_bounds", or cannot be read at all, restores with no bounds and without an error.
  holdfast_test::temp_dir dir("hango");
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename);
  m.set_hang_bounds(bounds_a);
  m.save(7, write_step);
  const std::string file = m.directory() + "/step-7/holdfast-metadata.json";
  std::int64_t loaded = -1;
  auto reader = [&](const std::string& d, std::int64_t st) { loaded = holds(d, st) ? st : -2; };
  CHECK(m.restore(reader) == 7);
  CHECK(m.restored_hang_bounds() == bounds_a);
  for (const std::string& text :
       {metadata_text(""), metadata_text(malformed[9]), metadata_text(malformed[12])}) {
    write_plain(file, text);
    loaded = -1;
    CHECK(m.restore(reader) == 7);
    CHECK(loaded == 7);
    CHECK(!m.restored_hang_bounds());
    m.restore_step(7, reader);
    CHECK(!m.restored_hang_bounds());
  }
  fs::remove(file);
  fs::create_directory(file);  // open succeeds, read fails (EISDIR)
  // the integrity check (checksums on) cannot read the metadata: an I/O error, not the bounds'
  // (they never fail a restore), and nothing is reported restored
  CHECK_THROWS_AS(m.restore_step(7, [](const std::string&) {}), holdfast::error);
  CHECK(!m.restored_hang_bounds());
}
