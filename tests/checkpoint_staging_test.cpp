// Staged saves (checkpoint/staging.hpp): checkpoint_manager's save with a staged writer copies
// the state into a reused staging area and commits on the background thread. Checked here: the
// files hold exactly the bytes given at save() (a buffer changed right after save() returns
// does not change the checkpoint), their recorded CRC32Cs (summed as written) verify, the area
// is reused (one region of the state's size, no growth over saves), restore() sizes it, bad
// names and throwing writers leave no trace, a failed background write is rethrown and leaves
// the previous latest, both commit modes, two tiers, and the handler's preemption save waits
// for the staged commit. SIGKILL at random points: checkpoint_staging_process_test.cpp.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <holdfast/checkpoint.hpp>
#include <holdfast/detail/crc32c.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <set>
#include <string>
#include <vector>

#include "support/expect_error.hpp"
#include "support/files.hpp"
#include "support/shm_temp_dir.hpp"

namespace fs = std::filesystem;
using holdfast::checkpoint_manager;
using holdfast::checkpoint_stage;
using holdfast::directory_commit;
using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using holdfast_test::read_file;

namespace {

template <class Io>
using local_store = holdfast::basic_store<holdfast::basic_local_filesystem<Io>>;
template <class Io>
using remote_store = holdfast::basic_store<holdfast::basic_mounted_remote<Io>>;

holdfast::checkpoint_options quiet(std::size_t keep = 2) {
  holdfast::checkpoint_options o;
  o.max_to_keep = keep;
  o.log = [](std::string_view) {};
  return o;
}

// A state of several buffers: `n` floats of weights (two ranges of one file), a small header.
struct state {
  std::vector<float> weights, moments;
  std::string header;
  explicit state(std::size_t n, float seed) : weights(n), moments(n / 3 + 1) {
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = seed + static_cast<float>(i);
    for (std::size_t i = 0; i < moments.size(); ++i) moments[i] = seed * 2 - static_cast<float>(i);
    header = "seed=" + std::to_string(seed);
  }
  void stage(checkpoint_stage& s) const {
    const std::size_t half = weights.size() / 2;
    s.write("weights.bin", weights.data(), half * sizeof(float));
    s.write("header.txt", header.data(), header.size());
    s.write("weights.bin", weights.data() + half, (weights.size() - half) * sizeof(float));
    s.write("moments.bin", moments.data(), moments.size() * sizeof(float));
  }
  std::uint64_t bytes() const {
    return (weights.size() + moments.size()) * sizeof(float) + header.size();
  }
};

std::string bytes_of(const void* p, std::size_t n) {
  return std::string(static_cast<const char*>(p), n);
}

// True when the checkpoint at `dir` holds exactly `s`'s bytes.
bool holds(const std::string& dir, const state& s) {
  return read_file(dir + "/weights.bin") ==
             bytes_of(s.weights.data(), s.weights.size() * sizeof(float)) &&
         read_file(dir + "/moments.bin") ==
             bytes_of(s.moments.data(), s.moments.size() * sizeof(float)) &&
         read_file(dir + "/header.txt") == s.header;
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("a staged save holds exactly the bytes given at save(), in both commit modes",
                   Store, local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::shm_temp_dir tmp("staged");
  auto st = Store::create(tmp / "store");
  checkpoint_manager<Store> m(st, "run", quiet());
  state s(300000, 1.5f);
  m.set_writer([&](checkpoint_stage& stage) { s.stage(stage); });
  for (std::int64_t step = 1; step <= 4; ++step) {
    state expected = s;
    m.save(step);
    // Changed right after save() returned, while the background write runs: the checkpoint
    // holds what the buffers held at the call.
    for (auto& w : s.weights) w += 1000;
    s.header = "changed after save " + std::to_string(step);
    m.wait_until_finished();
    auto l = m.latest();
    REQUIRE(l);
    CHECK(l->step == step);
    CHECK(holds(l->path, expected));
    CHECK(m.verify_step(step).status == holdfast::integrity_status::ok);
    // The sums were taken over the staged bytes as they were written: they match the files.
    auto meta = m.metadata(step);
    REQUIRE(meta);
    const std::string weights = read_file(l->path + "/weights.bin");
    auto doc = holdfast::detail::parse_json(read_file(l->path + "/holdfast-metadata.json"), "m");
    const auto* files = doc.find("files");
    REQUIRE(files);
    const auto* w = files->find("weights.bin");
    REQUIRE(w);
    CHECK(w->find("crc32c")->as_uint64() ==
          holdfast::detail::crc32c(weights.data(), weights.size()));
    CHECK(w->find("size")->as_uint64() == weights.size());
    CHECK(files->as_object().size() == 3);
  }
  // A restarted process restores the latest, with the reader given the directory.
  checkpoint_manager<Store> r(holdfast::read_only, st, "run", quiet());
  std::string restored;
  CHECK(r.restore([&](const std::string& d) { restored = d; }) == 4);
  CHECK(fs::exists(restored + "/weights.bin"));
}

TEST_CASE("the staging area is reused: one region of the state's size, no growth over saves") {
  holdfast_test::shm_temp_dir tmp("staged-reuse");
  checkpoint_manager<> m(tmp / "ckpt", directory_commit::rename, quiet());
  state s(1 << 20, 3.0f);  // 4 MiB of weights: one range larger than nothing staged before
  m.set_writer([&](checkpoint_stage& stage, std::int64_t) { s.stage(stage); });
  CHECK(m.staging_capacity() == 0);
  m.save(1);
  m.wait_until_finished();
  // After the first save's background part: one region, at most the state rounded to 2 MiB.
  const std::size_t settled = m.staging_capacity();
  CHECK(settled >= s.bytes());
  CHECK(settled <= s.bytes() + (std::size_t{2} << 20));
  for (std::int64_t step = 2; step <= 12; ++step) {
    m.save(step);
    CHECK(m.save_in_flight());
    m.wait_until_finished();
    CHECK(m.staging_capacity() == settled);
  }
  CHECK(!m.save_in_flight());
  // A save twice the size grows it, a save back at the old size shrinks it back only when it
  // uses less than half: the area follows the last save.
  state big(3 << 20, 4.0f);
  m.save(13, [&](checkpoint_stage& stage) { big.stage(stage); });
  m.wait_until_finished();
  CHECK(m.staging_capacity() >= big.bytes());
  CHECK(m.staging_capacity() <= big.bytes() + (std::size_t{2} << 20));
  CHECK(holds(m.latest()->path, big));
  m.save(14);
  m.wait_until_finished();
  CHECK(m.staging_capacity() == settled);
}

TEST_CASE("restore() sizes the staging area from the restored checkpoint") {
  holdfast_test::shm_temp_dir tmp("staged-restore");
  state s(1 << 19, 5.0f);
  {
    checkpoint_manager<> m(tmp / "ckpt", directory_commit::rename, quiet());
    m.set_writer([&](checkpoint_stage& stage) { s.stage(stage); });
    m.save(7);
  }  // destruction waits for the background commit
  checkpoint_manager<> m(tmp / "ckpt", directory_commit::rename, quiet());
  m.set_writer([&](checkpoint_stage& stage) { s.stage(stage); });
  CHECK(m.staging_capacity() == 0);
  CHECK(m.restore() == 7);
  CHECK(m.staging_capacity() >= s.bytes());
  CHECK(m.staging_capacity() <= s.bytes() + (std::size_t{2} << 20));
  const std::size_t before = m.staging_capacity();
  m.save(8);
  m.wait_until_finished();
  CHECK(m.staging_capacity() == before);  // the first save after the restore mapped nothing
  // A writer of files is not staged: its restore maps nothing.
  checkpoint_manager<> plain(tmp / "plain", directory_commit::rename, quiet());
  plain.set_writer([](const std::string& d) { holdfast_test::write_plain(d + "/f", "x"); });
  plain.save(1);
  CHECK(plain.restore() == 1);
  CHECK(plain.staging_capacity() == 0);
  // reserve_staging() sizes it ahead of the first save.
  checkpoint_manager<> fresh(tmp / "fresh", directory_commit::rename, quiet());
  fresh.reserve_staging(std::size_t{8} << 20);
  CHECK(fresh.staging_capacity() == (std::size_t{8} << 20));
}

TEST_CASE("bad staged names and writers that throw leave no trace") {
  holdfast_test::shm_temp_dir tmp("staged-bad");
  checkpoint_manager<> m(tmp / "ckpt", directory_commit::rename, quiet());
  state s(1000, 1.0f);
  m.save(1, [&](checkpoint_stage& stage) { s.stage(stage); });
  m.wait_until_finished();
  const auto before = entries(m.directory());
  const std::string latest = read_file(m.pointer_path());
  for (const char* bad : {"", ".", "..", "a/b", "holdfast-metadata.json", "\xff\xfe"}) {
    const std::string name = bad;
    CAPTURE(name);
    const std::string what = holdfast_test::error_text([&] {
      m.save(2, [&](checkpoint_stage& stage) {
        stage.write("ok.bin", "x", 1);
        stage.write(bad, "y", 1);
      });
    });
    CHECK(what.find("checkpoint stage") != std::string::npos);
    CHECK(what.find(name.empty() ? "empty" : "'" + name.substr(0, 1)) != std::string::npos);
    CHECK(entries(m.directory()) == before);
    CHECK(read_file(m.pointer_path()) == latest);
  }
  CHECK_THROWS_WITH(m.save(2,
                           [](checkpoint_stage& stage) {
                             stage.write("a.bin", "a", 1);
                             throw std::runtime_error("the model is not ready");
                           }),
                    "the model is not ready");
  CHECK(entries(m.directory()) == before);
  CHECK(!m.save_in_flight());
  CHECK(m.latest()->step == 1);
  CHECK(m.all_steps() == std::vector<std::int64_t>{1});
}

TEST_CASE(
    "a failed background write is rethrown once, leaves the previous latest, and saves go on") {
  holdfast_test::shm_temp_dir tmp("staged-fault");
  using S = local_store<fault_io>;
  auto st = S::create(tmp / "store");
  checkpoint_manager<S> m(st, "run", quiet());
  state s(200000, 2.0f);
  m.set_writer([&](checkpoint_stage& stage) { s.stage(stage); });
  m.save(1);
  m.wait_until_finished();
  const auto before = entries(m.directory());
  for (io_op op : {io_op::write, io_op::open, io_op::close, io_op::fsync, io_op::renameat2}) {
    const std::string called = holdfast::testing::to_string(op);
    CAPTURE(called);
    fault_plan::arm(fault{op, 1, ENOSPC});
    bool returned = false;
    const holdfast::error e = holdfast_test::error_from([&] {
      m.save(2);  // a write, fsync or rename fails on the background thread, after it returned
      returned = true;
      m.wait_until_finished();
    });
    fault_plan::disarm();
    if (op == io_op::write || op == io_op::fsync || op == io_op::renameat2) CHECK(returned);
    CHECK(e.errnum() == ENOSPC);
    CHECK(e.path().find(m.directory()) == 0);  // it names the file or directory
    CHECK_NOTHROW(m.wait_until_finished());    // rethrown once
    CHECK(entries(m.directory()) == before);   // the staging directory is gone
    CHECK(m.latest()->step == 1);
    CHECK(holds(m.latest()->path, state(200000, 2.0f)));
  }
  s = state(200000, 9.0f);
  m.save(2);
  m.wait_until_finished();
  CHECK(m.latest()->step == 2);
  CHECK(holds(m.latest()->path, s));
}

TEST_CASE("a save called while a staged save is in flight waits for it, and both commit") {
  holdfast_test::shm_temp_dir tmp("staged-wait");
  checkpoint_manager<> m(tmp / "ckpt", directory_commit::rename, quiet(0));
  std::vector<state> states;
  for (int i = 0; i < 6; ++i) states.emplace_back(100000, static_cast<float>(i));
  int committed = 0;
  m.on_commit([&](const holdfast::checkpoint_info&) { ++committed; });
  for (int i = 0; i < 6; ++i)
    m.save(i + 1,
           [&, i](checkpoint_stage& stage) { states[static_cast<std::size_t>(i)].stage(stage); });
  m.wait_until_finished();
  CHECK(committed == 6);
  CHECK(m.all_steps().size() == 6);
  for (const auto& c : m.checkpoints())
    CHECK(holds(c.path, states[static_cast<std::size_t>(c.step - 1)]));
}

TEST_CASE("two tiers: a staged save commits locally, then its durable copy follows") {
  holdfast_test::shm_temp_dir tmp("staged-tiers");
  holdfast::two_tier_options o;
  o.local = quiet(2);
  o.durable = quiet(3);
  o.log = [](std::string_view) {};
  o.durable_wait = std::chrono::seconds(30);
  state s(400000, 6.0f);
  {
    holdfast::two_tier_checkpoints<> t(tmp / "local", directory_commit::rename, tmp / "durable",
                                       directory_commit::rename, o);
    t.set_writer([&](checkpoint_stage& stage) { s.stage(stage); });
    for (std::int64_t step = 1; step <= 3; ++step) {
      t.save(step);
      t.wait_until_finished();  // the local commit, then the copy
      CHECK(t.durable_step() == step);
      CHECK(t.unfinished().empty());
    }
  }
  // A new node: an empty local tier restores from the durable copy, which sizes its staging.
  holdfast::two_tier_checkpoints<> t(tmp / "local2", directory_commit::rename, tmp / "durable",
                                     directory_commit::rename, o);
  t.set_writer([&](checkpoint_stage& stage) { s.stage(stage); });
  std::string dir;
  t.set_reader([&](const std::string& d) { dir = d; });
  CHECK(t.restore() == 3);
  CHECK(dir.find("/durable/") != std::string::npos);
  CHECK(holds(dir, s));
  CHECK(t.local().staging_capacity() >= s.bytes());
}
