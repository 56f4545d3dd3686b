// Checkpoint integrity (issue 35, item 2): every save records each file's size and CRC32C in
// holdfast-metadata.json ("files"), in both commit modes and for async saves' deferred writes;
// verify_step() names the first bad file (a flipped byte, a truncated file, a deleted file, a
// damaged metadata file); restore_step() throws checkpoint_corrupt before the reader runs;
// restore() logs a corrupt latest and falls back to the newest intact older step; checkpoints
// without recorded sums (older releases, checksums off) are unverified and restore; a failing or
// short read while checking is never taken for corruption. checkpoint_tool verify:
// examples/CMakeLists.txt (example.checkpoint_tool.verify_corrupt).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <holdfast/checkpoint.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <map>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using holdfast::checkpoint_corrupt;
using holdfast::checkpoint_manager;
using holdfast::checkpoint_options;
using holdfast::integrity_status;
using holdfast_test::read_file;
using holdfast_test::write_plain;
using steps_t = std::vector<std::int64_t>;

namespace {

// A checkpoint's files: their content depends on the step; one is in a subdirectory.
std::map<std::string, std::string> files_of(std::int64_t step) {
  std::string big;
  while (big.size() < 300000) big += "weights of step " + std::to_string(step) + ";";
  return {{"weights.bin", big},
          {"optimizer.bin", std::string(5000, static_cast<char>('a' + step % 26))},
          {"meta/step.txt", std::to_string(step)},
          {"empty", ""}};
}

void write_files(const std::string& dir, std::int64_t step) {
  for (const auto& [name, content] : files_of(step)) write_plain(dir + "/" + name, content);
}

// The files of `dir` read back: which step's they are (-1: none intact).
std::int64_t step_held(const std::string& dir, std::int64_t step) {
  for (const auto& [name, content] : files_of(step))
    if (read_file(dir + "/" + name) != content) return -1;
  return step;
}

// Overwrites one byte in place (the size stays).
void flip_byte(const std::string& path, off_t at) {
  auto fd = holdfast::open_file(path, O_RDWR);
  char c = 0;
  REQUIRE(::pread(fd.get(), &c, 1, at) == 1);
  c = static_cast<char>(c ^ 0x20);
  REQUIRE(::pwrite(fd.get(), &c, 1, at) == 1);
  fd.close();
}

struct log_lines {
  std::vector<std::string> lines;
  holdfast::log_fn sink() {
    return [this](std::string_view l) { lines.emplace_back(l); };
  }
  bool any(const std::string& a, const std::string& b = "") const {
    for (const auto& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    return false;
  }
};

template <class Io>
using local_store = holdfast::basic_store<holdfast::basic_local_filesystem<Io>>;
template <class Io>
using remote_store = holdfast::basic_store<holdfast::basic_mounted_remote<Io>>;

template <class T>
struct template_tag {
  using type = T;
};

// posix_io recording, in order, which inodes had their writeback started and which were fsynced.
struct writeback_event {
  bool writeback;  // else an fsync
  ino_t ino;
};
std::vector<writeback_event>& writeback_events() {
  static std::vector<writeback_event> e;
  return e;
}
ino_t inode_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}
struct writeback_io : holdfast::posix_io {
  static int start_writeback(int fd) noexcept {
    writeback_events().push_back({true, inode_of(fd)});
    return holdfast::posix_io::start_writeback(fd);
  }
  static int fsync(int fd) noexcept {
    writeback_events().push_back({false, inode_of(fd)});
    return holdfast::posix_io::fsync(fd);
  }
};

}  // namespace

TEST_CASE_TEMPLATE("every file's size and CRC32C recorded at save, and verify_step checks them",
                   Store, local_store<holdfast::posix_io>, remote_store<holdfast::posix_io>) {
  holdfast_test::temp_dir dir("crc");
  auto s = Store::create(dir.path());
  checkpoint_manager<Store> m(s, "r", {0});
  m.save(7, write_files);
  const std::string ck = m.latest()->path;

  auto meta = holdfast::detail::parse_json(read_file(ck + "/holdfast-metadata.json"), "meta");
  const auto* files = meta.find("files");
  REQUIRE(files);
  REQUIRE(files->is_object());
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> recorded;
  for (const auto& [path, v] : files->as_object())
    recorded[path] = {v.find("size")->as_uint64(), v.find("crc32c")->as_uint64()};
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> expected;
  for (const auto& [name, content] : files_of(7))
    expected[name] = {content.size(), holdfast::detail::crc32c(content.data(), content.size())};
  CHECK(recorded == expected);  // every regular file, not the metadata, not the marker

  auto r = m.verify_step(7);
  CHECK(r.status == integrity_status::ok);
  CHECK(!r.corrupt());
  CHECK(r.step == 7);
  CHECK(r.path == ck);
  std::int64_t loaded = -1;
  m.restore_step(7, [&](const std::string& d, std::int64_t st) { loaded = step_held(d, st); });
  CHECK(loaded == 7);
  CHECK_THROWS_AS(m.verify_step(8), holdfast::error);  // no such step: ENOENT

  // a flipped byte is found in either mode
  flip_byte(ck + "/meta/step.txt", 0);
  r = m.verify_step(7);
  CHECK(r.status == integrity_status::crc_mismatch);
  CHECK(r.file == "meta/step.txt");
  CHECK(r.corrupt());
}

TEST_CASE(
    "a flipped byte: verify_step names the file, restore_step throws checkpoint_corrupt, "
    "restore() falls back to the next older step and logs") {
  holdfast_test::temp_dir dir("flip");
  log_lines log;
  checkpoint_options o{0};
  o.log = log.sink();
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, o);
  for (std::int64_t st : {1, 2, 3}) m.save(st, write_files);
  const std::string c3 = m.checkpoints().back().path;
  flip_byte(c3 + "/weights.bin", 123456);

  auto r = m.verify_step(3);
  CHECK(r.status == integrity_status::crc_mismatch);
  CHECK(r.file == "weights.bin");
  CHECK(r.detail.find("recorded") != std::string::npos);
  CHECK(m.verify_step(2).status == integrity_status::ok);

  // restore_step: the reader never runs; the exception names the checkpoint and the file
  bool ran = false;
  try {
    m.restore_step(3, [&](const std::string&) { ran = true; });
    FAIL("restore_step loaded a corrupt checkpoint");
  } catch (const checkpoint_corrupt& e) {
    CHECK(e.errnum() == EBADMSG);
    CHECK(e.step() == 3);
    CHECK(e.file() == "weights.bin");
    CHECK(e.path() == c3);
    CHECK(std::string(e.what()).find("weights.bin") != std::string::npos);
  }
  CHECK(!ran);

  // restore(): the latest is corrupt, step 2 is loaded, and the log names the corrupt one
  std::vector<std::int64_t> loaded;
  auto reader = [&](const std::string& d, std::int64_t st) { loaded.push_back(step_held(d, st)); };
  CHECK(m.restore(reader) == 2);
  CHECK(loaded == steps_t{2});
  CHECK(log.any("is corrupt", "step-3"));
  CHECK(log.any("restored step 2 instead of the corrupt step 3"));
  CHECK(m.all_steps() == steps_t{1, 2, 3});  // listing unchanged (and cheap)

  // a read_only reader falls back the same way; two corrupt steps: the next intact one
  flip_byte(m.checkpoints()[1].path + "/optimizer.bin", 4999);
  checkpoint_manager<> ro(holdfast::read_only, dir / "c", holdfast::directory_commit::rename, o);
  loaded.clear();
  CHECK(ro.restore(reader) == 1);
  CHECK(loaded == steps_t{1});

  // none intact: never a corrupt restore, never a silent fresh start
  flip_byte(m.checkpoints()[0].path + "/weights.bin", 0);
  loaded.clear();
  try {
    (void)ro.restore(reader);
    FAIL("restore() loaded a corrupt checkpoint or started fresh");
  } catch (const checkpoint_corrupt& e) {
    CHECK(e.step() == 3);
  }
  CHECK(loaded.empty());
  CHECK(log.any("no older checkpoint"));

  // with checksums off, restores do not check (verify_step still does)
  checkpoint_options off = o;
  off.checksums = false;
  checkpoint_manager<> trusting(holdfast::read_only, dir / "c", holdfast::directory_commit::rename,
                                off);
  CHECK(trusting.restore() == 3);
  CHECK(trusting.verify_step(3).corrupt());
}

TEST_CASE("a truncated file, a deleted file and damaged metadata are corrupt too") {
  holdfast_test::temp_dir dir("trunc");
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, {0});
  for (std::int64_t st : {1, 2, 3, 4}) m.save(st, write_files);
  auto path = [&](std::int64_t st) {
    return m.checkpoints()[static_cast<std::size_t>(st - 1)].path;
  };

  fs::resize_file(path(1) + "/weights.bin", 1000);
  auto r = m.verify_step(1);
  CHECK(r.status == integrity_status::size_mismatch);
  CHECK(r.file == "weights.bin");

  fs::remove(path(2) + "/meta/step.txt");
  r = m.verify_step(2);
  CHECK(r.status == integrity_status::missing);
  CHECK(r.file == "meta/step.txt");
  CHECK_THROWS_AS(m.restore_step(2), checkpoint_corrupt);

  write_plain(path(3) + "/holdfast-metadata.json", "{\"format\": \"holdfast-check");  // torn
  r = m.verify_step(3);
  CHECK(r.status == integrity_status::bad_metadata);
  CHECK(r.file == "holdfast-metadata.json");
  CHECK_THROWS_AS(m.restore_step(3), checkpoint_corrupt);

  CHECK(m.verify_step(4).status == integrity_status::ok);
  CHECK(m.restore() == 4);
}

TEST_CASE(
    "checkpoints without recorded sums (older releases, checksums off) are unverified and "
    "restore") {
  holdfast_test::temp_dir dir("old");
  const std::string d = dir / "c";
  {
    checkpoint_options off{0};
    off.checksums = false;
    checkpoint_manager<> m(d, holdfast::directory_commit::rename, off);
    m.save(1, write_files);
    CHECK(read_file(m.latest()->path + "/holdfast-metadata.json").find("files") ==
          std::string::npos);
  }
  // a checkpoint as an earlier release wrote it: metadata without "files", and none at all
  checkpoint_manager<> m(d, holdfast::directory_commit::rename, {0});
  fs::create_directories(d + "/step-5");
  write_files(d + "/step-5", 5);
  holdfast::detail::checkpoint_write_metadata<holdfast::posix_io>(
      d + "/step-5", 5, std::chrono::system_clock::now(), nullptr);
  fs::create_directories(d + "/step-6");
  write_files(d + "/step-6", 6);
  write_plain(d + "/latest",
              "holdfast-checkpoints 1\nlatest step-6\nkeep step-1\nkeep step-5\nkeep step-6\n");
  for (std::int64_t st : {1, 5, 6}) {
    CAPTURE(st);
    auto r = m.verify_step(st);
    CHECK(r.status == integrity_status::unverified);
    CHECK(!r.corrupt());
  }
  std::int64_t loaded = -1;
  CHECK(m.restore([&](const std::string& p, std::int64_t st) { loaded = step_held(p, st); }) == 6);
  CHECK(loaded == 6);
  m.restore_step(5, [&](const std::string& p, std::int64_t st) { loaded = step_held(p, st); });
  CHECK(loaded == 5);
  // and the next save records sums again
  m.save(7, write_files);
  CHECK(m.verify_step(7).status == integrity_status::ok);
}

TEST_CASE("async saves record the sums of what the deferred part wrote") {
  holdfast_test::temp_dir dir("async");
  checkpoint_options o{0};
  o.async_save = true;
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, o);
  m.save(1, [](const std::string& d, std::int64_t step) {
    write_plain(d + "/snapshot", "taken in the caller's thread");
    return [d, step] { write_files(d, step); };  // written on the background thread
  });
  m.wait_until_finished();
  auto meta =
      holdfast::detail::parse_json(read_file(m.latest()->path + "/holdfast-metadata.json"), "meta");
  REQUIRE(meta.find("files"));
  CHECK(meta.find("files")->find("snapshot"));
  CHECK(meta.find("files")->find("weights.bin"));
  CHECK(meta.find("files")->find("meta/step.txt"));
  CHECK(m.verify_step(1).status == integrity_status::ok);
  flip_byte(m.latest()->path + "/weights.bin", 7);
  CHECK(m.verify_step(1).status == integrity_status::crc_mismatch);
  CHECK_THROWS_AS(m.restore_step(1), checkpoint_corrupt);
}

TEST_CASE("a failing or short read while checking is an I/O error, never corruption") {
  using holdfast::testing::fault;
  using holdfast::testing::fault_plan;
  using holdfast::testing::io_op;
  holdfast_test::temp_dir dir("readfault");
  using S = local_store<holdfast::testing::fault_io>;
  auto s = S::create(dir.path());
  checkpoint_manager<S> m(s, "r", {0});
  m.save(1, write_files);
  fault_plan::reset_counts();
  m.restore_step(1);
  const std::uint64_t reads = fault_plan::calls(io_op::read);
  REQUIRE(reads >= 5);  // the pointer, the metadata, and each recorded file
  for (std::uint64_t k = 1; k <= reads; ++k) {
    CAPTURE(k);
    bool ran = false;
    auto reader = [&](const std::string&) { ran = true; };
    fault_plan::arm(fault{io_op::read, k, EIO});
    try {
      m.restore_step(1, reader);
    } catch (const checkpoint_corrupt& e) {
      FAIL("an EIO was reported as corruption: " << std::string(e.what()));
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EIO);
      CHECK(!ran);
    }
    fault_plan::arm(fault{io_op::read, k, 0, 1});  // a one-byte read: finished, not corrupt
    ran = false;
    m.restore_step(1, reader);
    CHECK(ran);
    fault_plan::disarm();
  }
}

TEST_CASE("summing starts each file's writeback before the save syncs it, only where it syncs") {
  holdfast_test::temp_dir dir("writeback");
  auto run = [&](auto store_tag, const std::string& name) {
    using S = typename decltype(store_tag)::type;
    auto s = S::create(dir / name);
    checkpoint_manager<S> m(s, "r", {0});
    writeback_events().clear();
    m.save(1, write_files);
    CHECK(m.verify_step(1).status == integrity_status::ok);
    return writeback_events();
  };
  template_tag<local_store<writeback_io>> durable_tag;
  auto events = run(durable_tag, "durable");
  std::vector<ino_t> started;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (!events[i].writeback) continue;
    started.push_back(events[i].ino);
    for (std::size_t k = 0; k < i; ++k)  // no sync of that file came before its writeback
      CHECK_FALSE((!events[k].writeback && events[k].ino == events[i].ino));
  }
  CHECK(started.size() == files_of(1).size());  // every data file, the metadata file not
  for (ino_t ino : started) {
    bool synced = false;
    for (const auto& e : events) synced = synced || (!e.writeback && e.ino == ino);
    CHECK(synced);  // a hint only: the save still syncs it
  }
  // A store that syncs no file starts no writeback.
  template_tag<
      holdfast::basic_store<holdfast::basic_local_filesystem<writeback_io, holdfast::no_sync>>>
      no_sync_tag;
  auto none = run(no_sync_tag, "no_sync");
  for (const auto& e : none) CHECK_FALSE(e.writeback);
}

TEST_CASE(
    "a deleted or truncated file takes its step out of the listings, and the older is latest") {
  // Invariant: every step all_steps()/all_identities() list (and latest_step()) restores with
  // restore_step(); a checkpoint whose recorded file is gone or has another size is not listed.
  holdfast_test::temp_dir dir("list");
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, {0});
  for (std::int64_t st : {1, 2, 3}) m.save(st, write_files);
  auto path = [&](std::int64_t st) {
    return m.checkpoints()[static_cast<std::size_t>(st - 1)].path;
  };
  auto listed_restore = [&] {
    auto steps = m.all_steps();
    auto ids = m.all_identities();
    REQUIRE(ids.size() == steps.size());
    for (std::size_t i = 0; i < steps.size(); ++i) {
      CHECK(ids[i].step == steps[i]);
      CHECK_NOTHROW(m.restore_step(steps[i]));
    }
    return steps;
  };
  const std::string p3 = path(3), p2 = path(2);
  SUBCASE("deleted") { fs::remove(p3 + "/meta/step.txt"); }
  SUBCASE("truncated") { fs::resize_file(p3 + "/weights.bin", 1000); }
  CHECK(listed_restore() == steps_t{1, 2});
  CHECK(m.latest_step() == 2);
  std::int64_t got = -1;
  CHECK(m.restore([&](const std::string& d, std::int64_t st) { got = step_held(d, st); }) == 2);
  CHECK(got == 2);
  // the same loss in the step below leaves step 1 the newest listed
  fs::remove(p2 + "/optimizer.bin");
  CHECK(listed_restore() == steps_t{1});
  CHECK(m.latest_step() == 1);
  CHECK(m.restore() == 1);
}

TEST_CASE(
    "listing does not read the bytes: a flipped byte stays listed and restore_step names it") {
  holdfast_test::temp_dir dir("flip");
  checkpoint_manager<> m(dir / "c", holdfast::directory_commit::rename, {0});
  for (std::int64_t st : {1, 2}) m.save(st, write_files);
  flip_byte(m.checkpoints()[1].path + "/optimizer.bin", 17);
  CHECK(m.all_steps() == steps_t{1, 2});  // by design: listing stats, never reads
  CHECK(m.latest_step() == 2);
  try {
    m.restore_step(2);
    FAIL("restore_step of a corrupt checkpoint returned");
  } catch (const checkpoint_corrupt& e) {
    CHECK(std::string(e.what()).find("optimizer.bin") != std::string::npos);
  }
  CHECK(m.restore() == 1);  // restore() falls back past it
}
