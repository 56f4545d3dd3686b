// The artifact store: Horovod's URL and layout expectations as tables, validation, local output
// directories, and sync (nanosecond change detection, deletions, atomic copies under injected
// failures and under SIGKILL at every point).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <holdfast/store.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/child.hpp"
#include "support/kill_io.hpp"
#include "support/sanitizers.hpp"
#include "support/shm_temp_dir.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using holdfast::store_scheme;
using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;

namespace {

using holdfast_test::sanitized;

void write_file(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  auto fd = holdfast::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  holdfast::write_all(fd, content.data(), content.size());
  fd.close();
}

std::string read_file(const std::string& path) {
  auto fd = holdfast::open_file(path, O_RDONLY);
  return holdfast::read_all(fd);
}

void set_mtime(const std::string& path, std::int64_t sec, long nsec) {
  timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = static_cast<time_t>(sec);
  ts[0].tv_nsec = ts[1].tv_nsec = nsec;
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), ts, 0) == 0);
}

// Moves a file's mtime an hour back (keeping its nanoseconds).
void age(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  set_mtime(path, static_cast<std::int64_t>(st.st_mtim.tv_sec) - 3600, st.st_mtim.tv_nsec);
}

// Every regular file under `root` (relative path -> content) and every directory ("dir/").
std::map<std::string, std::string> snapshot(const std::string& root,
                                            const std::vector<std::string>& skip_top = {}) {
  std::map<std::string, std::string> out;
  if (!fs::exists(root)) return out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    std::string rel = fs::relative(it->path(), root).string();
    bool skipped = false;
    for (const auto& s : skip_top)
      if (rel == s || rel.rfind(s + "/", 0) == 0) skipped = true;
    if (skipped) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory())
      out[rel + "/"] = "";
    else
      out[rel] = read_file(it->path().string());
  }
  return out;
}

bool has_temp(const std::string& root) {
  if (!fs::exists(root)) return false;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (holdfast::is_temp_name(e.path().filename().string())) return true;
  return false;
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// URLs and layout: Horovod's own expectations (test_spark.py: test_hdfs_store_parse_url,
// test_dbfs_local_store; store.py: get_*_data_path, get_run_path, ...).
// ---------------------------------------------------------------------------------------------

TEST_CASE("parse_hdfs_url follows Horovod's HDFSStore table") {
  struct row {
    const char* url;
    const char* prefix;  // path_prefix()
    const char* host;
    std::uint16_t port;
    const char* path;
  };
  const row rows[] = {
      // Case 1: full path
      {"hdfs://namenode01:8020/user/test/output", "hdfs://namenode01:8020", "namenode01", 8020,
       "/user/test/output"},
      // Case 2: no host and port
      {"hdfs:///user/test/output", "hdfs://", "default", 0, "/user/test/output"},
      // Case 3: no prefix
      {"/user/test/output", "hdfs://", "default", 0, "/user/test/output"},
      // Host without port, port without host
      {"hdfs://namenode01/user/x", "hdfs://namenode01", "namenode01", 0, "/user/x"},
      {"hdfs://:9000/user/x", "hdfs://:9000", "default", 9000, "/user/x"},
      // No namespace, host and port
      {"namenode01:8020/user/test/output", "hdfs://", "namenode01", 8020, "/user/test/output"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.url);
    auto u = holdfast::parse_hdfs_url(r.url);
    CHECK(u.scheme == store_scheme::hdfs);
    CHECK(u.url_prefix == r.prefix);
    CHECK(u.host == r.host);
    CHECK(u.port == r.port);
    CHECK(u.path == r.path);
  }
  // get_full_path and get_localized_path
  auto full = holdfast::parse_hdfs_url("hdfs://namenode01:8020/user/test/output");
  CHECK(full.full_path("/user/test/output") == "hdfs://namenode01:8020/user/test/output");
  CHECK(full.localized_path("hdfs://namenode01:8020/user/test/output") == "/user/test/output");
  auto bare = holdfast::parse_hdfs_url("hdfs:///user/test/output");
  CHECK(bare.full_path("/user/test/output") == "hdfs:///user/test/output");
  CHECK(bare.localized_path("hdfs:///user/test/output") == "/user/test/output");
  auto none = holdfast::parse_hdfs_url("/user/test/output");
  CHECK(none.full_path("/user/test/output") == "hdfs:///user/test/output");
  CHECK(none.localized_path("hdfs:///user/test/output") == "/user/test/output");

  // Case 5: bad prefix; and Horovod's "Failed to parse path from URL".
  CHECK(error_text<holdfast::error>([] {
          holdfast::parse_hdfs_url("file:///user/test/output");
        }).find("mismatched HDFS namespace") != std::string::npos);
  CHECK(error_text<holdfast::error>([] {
          holdfast::parse_hdfs_url("hdfs://namenode01:8020");
        }).find("hdfs://namenode01:8020") != std::string::npos);
  CHECK_THROWS_AS(holdfast::parse_hdfs_url("hdfs://nn:80x0/p"), holdfast::error);
  CHECK_THROWS_AS(holdfast::parse_hdfs_url("hdfs://nn:65536/p"), holdfast::error);
}

TEST_CASE("DBFS spellings normalize to the FUSE path, as Horovod's DBFSLocalStore") {
  struct row {
    const char* in;
    bool dbfs;
    const char* out;
  };
  const row rows[] = {
      {"dbfs:/tmp/test_local_dir2", true, "/dbfs/tmp/test_local_dir2"},
      {"/dbfs/tmp/test_local_dir1", true, "/dbfs/tmp/test_local_dir1"},
      {"file:///dbfs/tmp/test_local_dir3", true, "/dbfs/tmp/test_local_dir3"},
      {"dbfs://tmp/x", false, "dbfs://tmp/x"},  // not a DBFS spelling
      {"/tmp/dbfs/x", false, "/tmp/dbfs/x"},
      {"file:///tmp/x", false, "file:///tmp/x"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.in);
    CHECK(holdfast::is_dbfs_path(r.in) == r.dbfs);
    CHECK(holdfast::normalize_dbfs_path(r.in) == r.out);
    if (r.dbfs) {
      auto u = holdfast::parse_store_url(r.in);
      CHECK(u.scheme == store_scheme::dbfs);
      CHECK(u.path == r.out);
    }
  }
}

TEST_CASE("parse_store_url dispatches by scheme and rejects unknown ones, naming the URL") {
  auto f = holdfast::parse_store_url("file:///data/exp");
  CHECK(f.scheme == store_scheme::local);
  CHECK(f.path == "/data/exp");
  CHECK(f.full_path("/data/exp/runs") == "file:///data/exp/runs");
  CHECK(holdfast::parse_store_url("file://localhost/data/exp").path == "/data/exp");
  auto p = holdfast::parse_store_url("/data/exp");
  CHECK(p.scheme == store_scheme::local);
  CHECK(p.path == "/data/exp");
  CHECK(holdfast::parse_store_url("relative/dir").path == "relative/dir");
  auto h = holdfast::parse_store_url("hdfs://nn:8020/user/x");
  CHECK(h.scheme == store_scheme::hdfs);
  CHECK(h.host == "nn");
  CHECK(h.port == 8020);

  for (const char* bad : {"s3://bucket/prefix", "gs://bucket/x", "ftp://h/x", "dbfs://x/y"}) {
    CAPTURE(bad);
    auto text = error_text<holdfast::error>([&] { holdfast::parse_store_url(bad); });
    CHECK(text.find("unknown URL scheme") != std::string::npos);
    CHECK(text.find(bad) != std::string::npos);
  }
  CHECK(error_text<holdfast::error>([] {
          holdfast::parse_store_url("file://otherhost/x");
        }).find("file://otherhost/x") != std::string::npos);
  CHECK_THROWS_AS(holdfast::parse_store_url(""), holdfast::error);
  CHECK_THROWS_AS(holdfast::parse_store_url(std::string("/a\0b", 4)), holdfast::error);
  try {
    holdfast::parse_store_url("s3://b/x");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EINVAL);
  }
}

TEST_CASE("store layout table: runs, checkpoint, logs, intermediate data with and without index") {
  struct row {
    const char* prefix;
    const char* root;
  };
  const row rows[] = {
      {"/data/exp", "/data/exp"},        {"/data/exp/", "/data/exp"},
      {"file:///data/exp", "/data/exp"}, {"dbfs:/ml/exp", "/dbfs/ml/exp"},
      {"/dbfs/ml/exp", "/dbfs/ml/exp"},  {"file:///dbfs/ml/exp", "/dbfs/ml/exp"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.prefix);
    auto s = holdfast::store::create(r.prefix);
    std::string root = r.root;
    CHECK(s.runs_path() == root + "/runs");
    CHECK(s.run_path("run_001") == root + "/runs/run_001");
    CHECK(s.checkpoint_path("run_001") == root + "/runs/run_001/checkpoint");
    CHECK(s.logs_path("run_001") == root + "/runs/run_001/logs");
    CHECK(s.train_data_path() == root + "/intermediate_train_data");
    CHECK(s.val_data_path() == root + "/intermediate_val_data");
    CHECK(s.test_data_path() == root + "/intermediate_test_data");
    CHECK(s.train_data_path(3) == root + "/intermediate_train_data.3");
    CHECK(s.val_data_path("7") == root + "/intermediate_val_data.7");
    CHECK(s.test_data_path(0) == root + "/intermediate_test_data.0");
    CHECK(s.train_data_path(std::size_t{12}) == root + "/intermediate_train_data.12");
  }
  // hdfs:// through a mount.
  holdfast::store_options o;
  o.hdfs_mount = "/mnt/hdfs/";
  auto h = holdfast::store::create("hdfs://namenode01:8020/user/test/output", o);
  CHECK(h.prefix_path() == "/mnt/hdfs/user/test/output");
  CHECK(h.run_path("r") == "/mnt/hdfs/user/test/output/runs/r");
  CHECK(h.url().host == "namenode01");
  CHECK(h.url().full_path(h.url().path) == "hdfs://namenode01:8020/user/test/output");
  CHECK(error_text<holdfast::error>([] {
          holdfast::store::create("hdfs:///user/x");
        }).find("hdfs_mount") != std::string::npos);

  // The policies satisfy the trait (and the C++20 concept); other types do not.
  static_assert(holdfast::is_filesystem_policy_v<holdfast::local_filesystem>);
  static_assert(holdfast::is_filesystem_policy_v<holdfast::mounted_remote>);
  static_assert(holdfast::is_filesystem_policy_v<holdfast::filesystem_by_url>);
  static_assert(!holdfast::is_filesystem_policy_v<holdfast::posix_io>);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  static_assert(holdfast::filesystem_policy<holdfast::mounted_remote>);
#endif

  // Commit modes: chosen by URL for `store`, fixed by the other policies.
  CHECK(holdfast::store::create("/data/x").commit_mode() == holdfast::directory_commit::rename);
  CHECK(holdfast::store::create("dbfs:/x").commit_mode() == holdfast::directory_commit::marker);
  CHECK(h.commit_mode() == holdfast::directory_commit::marker);
  CHECK(holdfast::basic_store<holdfast::mounted_remote>::create("/data/x").commit_mode() ==
        holdfast::directory_commit::marker);
  CHECK(holdfast::basic_store<holdfast::local_filesystem>::create("dbfs:/x").commit_mode() ==
        holdfast::directory_commit::rename);
}

TEST_CASE("run ids and dataset indices with '/', '..', NUL or nothing are rejected by name") {
  auto s = holdfast::store::create("/data/exp");
  const std::string bad_ids[] = {"a/b", "/abs", "..", "a..b", ".", "", std::string("a\0b", 3)};
  for (const auto& id : bad_ids) {
    CAPTURE(id);
    auto text = error_text<holdfast::error>([&] { (void)s.run_path(id); });
    CHECK(text.find("run id") != std::string::npos);
    CHECK_THROWS_AS(s.checkpoint_path(id), holdfast::error);
    CHECK_THROWS_AS(s.logs_path(id), holdfast::error);
    CHECK_THROWS_AS(s.train_data_path(std::string_view(id)), holdfast::error);
  }
  auto slash = error_text<holdfast::error>([&] { (void)s.run_path("team/run1"); });
  CHECK(slash.find("'team/run1'") != std::string::npos);
  CHECK(slash.find("'/'") != std::string::npos);
  auto nul = error_text<holdfast::error>([&] { (void)s.run_path(std::string("r\0x", 3)); });
  CHECK(nul.find("r\\x00x") != std::string::npos);
  CHECK(error_text<holdfast::error>([&] {
          (void)s.val_data_path("1/2");
        }).find("dataset index '1/2'") != std::string::npos);
  CHECK_NOTHROW((void)s.run_path("run.2024-01-01_12:00"));
}

TEST_CASE("local_output_dir: the run directory on a local store, a scratch dir on a mount") {
  holdfast_test::temp_dir dir("store");
  auto local = holdfast::store::create(dir.path() + "/local");
  {
    auto out = local.local_output_dir("r1");
    CHECK(out.path() == dir.path() + "/local/runs/r1");
    CHECK(!out.is_scratch());
    CHECK(fs::is_directory(out.path()));
  }
  CHECK(fs::is_directory(dir.path() + "/local/runs/r1"));  // kept

  holdfast::store_options o;
  o.local_temp_dir = dir.path();
  auto remote = holdfast::basic_store<holdfast::mounted_remote>::create(dir / "remote", o);
  std::string scratch;
  {
    auto out = remote.local_output_dir("r1");
    scratch = out.path();
    CHECK(out.is_scratch());
    CHECK(scratch.rfind(dir.path() + "/holdfast-run-r1-", 0) == 0);
    write_file(scratch + "/logs/a.txt", "x");
    auto moved = std::move(out);
    CHECK(fs::exists(scratch + "/logs/a.txt"));
  }
  CHECK(!fs::exists(scratch));
  CHECK_THROWS_AS(remote.local_output_dir("../x"), holdfast::error);
}

// ---------------------------------------------------------------------------------------------
// sync
// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("sync mirrors creations, modifications within one second, and deletions", FS,
                   holdfast::local_filesystem, holdfast::mounted_remote) {
  holdfast_test::temp_dir dir("sync");
  auto s = holdfast::basic_store<FS>::create(dir / "remote");
  std::string local = dir / "local";
  std::string remote = s.run_path("run_001");
  write_file(local + "/a.txt", "alpha");
  write_file(local + "/b.txt", "bravo");
  write_file(local + "/logs/events.1", "event-one");
  write_file(local + "/sub/deeper/c.bin", std::string(3 << 20, 'c'));  // several copy buffers
  ::chmod((local + "/b.txt").c_str(), 0600);
  // Old mtimes: a file written within a clock tick of a sync is (rightly) copied once more by
  // the next one; this test checks the other rules.
  for (const char* f : {"/a.txt", "/b.txt", "/logs/events.1", "/sub/deeper/c.bin"}) age(local + f);

  auto r1 = s.sync("run_001", local);
  CHECK(r1.copied ==
        std::vector<std::string>{"a.txt", "b.txt", "logs/events.1", "sub/deeper/c.bin"});
  CHECK(r1.deleted.empty());
  CHECK(r1.unchanged.empty());
  CHECK(snapshot(remote) == snapshot(local));
  CHECK((fs::status(remote + "/b.txt").permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write));

  auto r2 = s.sync("run_001", local);
  CHECK(r2.copied.empty());
  CHECK(r2.unchanged.size() == 4);

  // Two modifications within one second, same size: only the nanoseconds of the mtime differ.
  const std::int64_t second = 1330712280;
  write_file(local + "/a.txt", "ALPHA");
  set_mtime(local + "/a.txt", second, 100000000);
  auto r3 = s.sync("run_001", local);
  CHECK(r3.copied == std::vector<std::string>{"a.txt"});
  CHECK(read_file(remote + "/a.txt") == "ALPHA");
  write_file(local + "/a.txt", "AlPhA");
  set_mtime(local + "/a.txt", second, 200000000);
  auto r4 = s.sync("run_001", local);
  CHECK(r4.copied == std::vector<std::string>{"a.txt"});
  CHECK(read_file(remote + "/a.txt") == "AlPhA");
  // Same mtime to the nanosecond, different size.
  write_file(local + "/a.txt", "AlPhA+");
  set_mtime(local + "/a.txt", second, 200000000);
  CHECK(s.sync("run_001", local).copied == std::vector<std::string>{"a.txt"});
  CHECK(snapshot(remote) == snapshot(local));

  // Deletions are not propagated unless asked.
  fs::remove(local + "/b.txt");
  fs::remove_all(local + "/sub");
  auto r5 = s.sync("run_001", local);
  CHECK(r5.deleted.empty());
  CHECK(fs::exists(remote + "/b.txt"));
  holdfast::sync_options del;
  del.propagate_deletions = true;
  auto r6 = s.sync("run_001", local, del);
  CHECK(r6.deleted == std::vector<std::string>{"b.txt", "sub"});
  CHECK(r6.copied.empty());
  CHECK(snapshot(remote) == snapshot(local));

  // A file re-created with old content after its deletion is copied again.
  write_file(local + "/b.txt", "bravo");
  age(local + "/b.txt");
  CHECK(s.sync("run_001", local, del).copied == std::vector<std::string>{"b.txt"});
  // A file that became a directory, with deletions.
  fs::remove(local + "/a.txt");
  write_file(local + "/a.txt/inner", "i");
  auto r7 = s.sync("run_001", local, del);
  CHECK(r7.deleted == std::vector<std::string>{"a.txt"});
  CHECK(r7.copied == std::vector<std::string>{"a.txt/inner"});
  CHECK(snapshot(remote) == snapshot(local));
  CHECK(!has_temp(remote));
}

TEST_CASE("sync catches a same-size rewrite in the same clock tick (racily clean files)") {
  holdfast_test::temp_dir dir("racy");
  auto s = holdfast::store::create(dir / "remote");
  std::string local = dir / "local";
  std::string remote = s.run_path("r");
  // Both versions get the very same mtime, to the nanosecond, as two writes within one tick of
  // the kernel's coarse clock do. Only the sync's own clock can tell them apart.
  timespec now{};
  REQUIRE(::clock_gettime(CLOCK_REALTIME, &now) == 0);
  write_file(local + "/state.json", "{\"loss\": 1.0}");
  set_mtime(local + "/state.json", now.tv_sec, now.tv_nsec);
  CHECK(s.sync("r", local).copied == std::vector<std::string>{"state.json"});
  write_file(local + "/state.json", "{\"loss\": 0.5}");
  set_mtime(local + "/state.json", now.tv_sec, now.tv_nsec);
  struct stat st {};
  REQUIRE(::stat((local + "/state.json").c_str(), &st) == 0);
  CHECK(st.st_mtim.tv_nsec == now.tv_nsec);
  CHECK(s.sync("r", local).copied == std::vector<std::string>{"state.json"});
  CHECK(read_file(remote + "/state.json") == "{\"loss\": 0.5}");
  // Once the file is older than the window, it counts as unchanged.
  set_mtime(local + "/state.json", now.tv_sec - 10, now.tv_nsec);
  CHECK(s.sync("r", local).copied == std::vector<std::string>{"state.json"});  // mtime changed
  CHECK(s.sync("r", local).unchanged == std::vector<std::string>{"state.json"});
}

TEST_CASE("sync leaves the checkpoint directory alone, skips links, sweeps stale temps") {
  holdfast_test::temp_dir dir("sync");
  auto s = holdfast::store::create(dir / "remote");
  std::string local = dir / "local";
  std::string remote = s.run_path("r");
  write_file(local + "/checkpoint/local-only", "not mirrored");
  write_file(local + "/keep.txt", "k");
  REQUIRE(::symlink("keep.txt", (local + "/link").c_str()) == 0);
  write_file(s.checkpoint_path("r") + "/step-1/w", "weights");
  std::string stale = remote + "/.holdfast-tmp.12345.0123456789abcdef.partial";
  write_file(stale, "half");
  holdfast::sync_options o;
  o.propagate_deletions = true;
  o.sweep_temps_older_than = std::chrono::seconds(0);
  auto r = s.sync("r", local, o);
  CHECK(r.copied == std::vector<std::string>{"keep.txt"});
  CHECK(r.skipped == std::vector<std::string>{"link"});
  CHECK(read_file(s.checkpoint_path("r") + "/step-1/w") == "weights");
  CHECK(!fs::exists(s.checkpoint_path("r") + "/local-only"));
  CHECK(!fs::exists(stale));

  // Syncing the run directory onto itself (a local store's output dir) copies nothing.
  auto out = s.local_output_dir("r");
  auto self = s.sync("r", out.path());
  CHECK(self.copied.empty());
  CHECK(self.unchanged == std::vector<std::string>{"keep.txt"});

  CHECK_THROWS_AS(s.sync("r", dir / "missing"), holdfast::error);
  CHECK_THROWS_AS(s.sync("bad/id", local), holdfast::error);
}

TEST_CASE("sync with each system call failing in turn never leaves a partial or temp file") {
  holdfast_test::shm_temp_dir dir("syncfault");
  std::string local = dir / "local";
  write_file(local + "/a", std::string(100000, 'a'));
  write_file(local + "/d/b", std::string(1200000, 'b'));  // two copy buffers
  write_file(local + "/d/e/c", "c");
  using store_t = holdfast::basic_store<holdfast::basic_local_filesystem<fault_io>>;
  auto expected = snapshot(local);
  // With deletions: remote entries the local tree lacks, which the sync must remove.
  const std::map<std::string, std::string> extraneous = {
      {"old/", ""}, {"old/x", "stale"}, {"zz", "stale too"}, {"d/gone", "g"}};

  for (bool deletions : {false, true}) {
    CAPTURE(deletions);
    holdfast::sync_options o;
    o.propagate_deletions = deletions;
    auto prepare = [&](const store_t& s) {
      if (!deletions) return;
      for (const auto& e : extraneous)
        if (e.first.back() != '/') write_file(s.run_path("r") + "/" + e.first, e.second);
    };
    std::uint64_t total = 0;
    {
      auto s = store_t::create(dir / "count");
      prepare(s);
      fault_plan::reset_counts();
      s.sync("r", local, o);
      total = fault_plan::calls(io_op::any);
      fs::remove_all(dir / "count");
    }
    REQUIRE(total > 20);
    std::uint64_t failures = 0;
    for (std::uint64_t k = 1; k <= total; ++k) {
      CAPTURE(k);
      std::string root = dir / ("r" + std::to_string(k));
      auto s = store_t::create(root);
      prepare(s);
      bool failed = false;
      fault_plan::arm(fault{io_op::any, k, EIO});
      try {
        s.sync("r", local, o);
      } catch (const holdfast::error& e) {
        failed = true;
        CHECK(e.errnum() == EIO);
      }
      fault_plan::disarm();
      failures += failed ? 1 : 0;
      if (!failed) {
        std::string op = holdfast::testing::to_string(fault_plan::last_failed());
        // Only closing a read-only descriptor (a local input, a directory scan) may fail
        // unnoticed: the descriptor is gone either way and nothing was written through it.
        CHECK((op == "close" || op == "closedir"));
      }
      std::string remote = s.run_path("r");
      // Whatever exists under a final name is complete: a mirrored file, or an untouched
      // extraneous one not yet deleted.
      for (const auto& entry : snapshot(remote)) {
        const std::string& rel = entry.first;
        CAPTURE(rel);
        bool mirrored = expected.count(rel) && expected.at(rel) == entry.second;
        bool stale = extraneous.count(rel) && extraneous.at(rel) == entry.second;
        CHECK((mirrored || stale));
      }
      CHECK(!has_temp(remote));
      // A clean retry finishes the mirror.
      s.sync("r", local, o);
      CHECK(snapshot(remote) == expected);  // extraneous entries gone too
      fs::remove_all(root);
    }
    CHECK(failures + 12 >= total);
  }
}

TEST_CASE("a copier SIGKILLed at any point of a sync never leaves a partial remote file") {
  holdfast_test::shm_temp_dir dir("synckill");
  std::string local = dir / "local";
  std::mt19937_64 rng(20261121);
  const std::size_t sizes[] = {1000, 300000, 1200000, 5000, 600000, 20};  // one spans two buffers
  for (int i = 0; i < 6; ++i) {
    std::string content(sizes[i], static_cast<char>('a' + i));
    write_file(local + "/f" + std::to_string(i) + (i % 2 ? "/x" : ""), content);
  }
  auto expected = snapshot(local);
  using store_t = holdfast::basic_store<holdfast::basic_local_filesystem<holdfast_test::kill_io>>;

  std::uint64_t total = 0;
  {
    auto s = store_t::create(dir / "count");
    holdfast_test::kill_io::arm(0);
    s.sync("r", local);
    total = holdfast_test::kill_io::calls();
  }
  REQUIRE(total > 30);
  // 40 trials in normal builds; sanitizers make each fork and copy slow, so 15 there.
  const int trials = sanitized ? 15 : 40;
  for (int t = 0; t < trials; ++t) {
    std::string root = dir / ("t" + std::to_string(t));
    std::uint64_t k = std::uniform_int_distribution<std::uint64_t>(1, total)(rng);
    CAPTURE(k);
    holdfast_test::child c([&] {
      auto s = store_t::create(root);
      holdfast_test::kill_io::arm(k);
      s.sync("r", local);
      CHILD_REQUIRE(false);  // the kill always lands: k <= total
    });
    auto res = c.wait(std::chrono::seconds(30));
    CHECK(res.term_signal == SIGKILL);
    CHECK(res.failures.empty());
    auto s = holdfast::basic_store<holdfast::local_filesystem>::create(root);
    std::string remote = s.run_path("r");
    for (const auto& entry : snapshot(remote)) {
      const std::string& rel = entry.first;
      const std::string& content = entry.second;
      CAPTURE(rel);
      if (holdfast::is_temp_name(fs::path(rel).filename().string())) continue;
      REQUIRE(expected.count(rel) == 1);
      CHECK(expected.at(rel) == content);  // never partial under its final name
    }
    // The next sync (with deletions and an immediate sweep) completes the mirror exactly.
    holdfast::sync_options o;
    o.propagate_deletions = true;
    o.sweep_temps_older_than = std::chrono::seconds(0);
    s.sync("r", local, o);
    CHECK(snapshot(remote) == expected);
    CHECK(!has_temp(remote));
    fs::remove_all(root);
  }
}

TEST_CASE("reclaim_intermediate_data removes datasets only when called, with their indices") {
  holdfast_test::temp_dir dir("reclaim");
  auto s = holdfast::store::create(dir.path());
  write_file(s.train_data_path() + "/part-0", "t");
  write_file(s.train_data_path(1) + "/part-0", "t1");
  write_file(s.val_data_path() + "/part-0", "v");
  write_file(s.test_data_path(2), "x");
  write_file(dir / "intermediate_train_data_other", "not a dataset");
  write_file(s.run_path("r") + "/logs/l", "log");
  auto out = s.local_output_dir("r");  // nothing implicit touches the data
  CHECK(fs::exists(s.train_data_path()));

  auto removed = s.reclaim_intermediate_data(holdfast::dataset::train);
  CHECK(removed == std::vector<std::string>{s.train_data_path(), s.train_data_path(1)});
  CHECK(!fs::exists(s.train_data_path()));
  CHECK(fs::exists(s.val_data_path()));
  removed = s.reclaim_intermediate_data();
  CHECK(removed == std::vector<std::string>{s.test_data_path(2), s.val_data_path()});
  CHECK(fs::exists(dir / "intermediate_train_data_other"));
  CHECK(fs::exists(s.run_path("r") + "/logs/l"));
  for (const auto& e : fs::directory_iterator(dir.path()))
    CHECK(e.path().filename().string().rfind(".holdfast-reclaim-", 0) != 0);
}
