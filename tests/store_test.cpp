// The artifact store: Horovod's URL and layout expectations as tables, validation, local output
// directories, and sync (nanosecond change detection, deletions, atomic copies under injected
// failures and under SIGKILL at every point; the manifest at the destination: restarts in new
// processes and new local directories, adoption of a manifest-less remote, strict parsing,
// concurrent syncs of two origins).
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
#include "support/expect_error.hpp"
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

using holdfast_test::error_text;
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

// Every regular file under `root` (relative path -> content) and every directory ("dir/"), without
// sync's own files (the manifest and its lock remotely, the origin file locally).
std::map<std::string, std::string> snapshot(const std::string& root,
                                            const std::vector<std::string>& skip_top = {}) {
  std::map<std::string, std::string> out;
  if (!fs::exists(root)) return out;
  std::vector<std::string> skip = skip_top;
  for (auto name :
       {holdfast::sync_manifest_name, holdfast::sync_lock_name, holdfast::sync_origin_name})
    skip.emplace_back(name);
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    std::string rel = fs::relative(it->path(), root).string();
    bool skipped = false;
    for (const auto& s : skip)
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
  // file://localhost/dbfs/x names file:///dbfs/x, which is DBFS: its full_path parses back to
  // DBFS too (url_fuzz found the local reading, whose full_path changed scheme).
  auto d = holdfast::parse_store_url("file://localhost/dbfs//tmp/store");
  CHECK(d.scheme == store_scheme::dbfs);
  CHECK(d.path == "/dbfs//tmp/store");
  CHECK(holdfast::parse_store_url(d.full_path(d.path)).scheme == store_scheme::dbfs);
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
  // The files this directory uploaded, then the directories their removal emptied.
  CHECK(r6.deleted == std::vector<std::string>{"b.txt", "sub", "sub/deeper", "sub/deeper/c.bin"});
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
  // With deletions: remote files this local directory uploaded earlier (its manifest entries)
  // and has since deleted, which the sync must remove, with the directory `old` they leave
  // empty.
  const std::map<std::string, std::string> extraneous = {
      {"old/", ""}, {"old/x", "stale"}, {"zz", "stale too"}, {"d/gone", "g"}};
  const std::string origin = store_t::create(dir / "origin").origin_of(local);

  for (bool deletions : {false, true}) {
    CAPTURE(deletions);
    holdfast::sync_options o;
    o.propagate_deletions = deletions;
    auto prepare = [&](const store_t& s) {
      if (!deletions) return;
      holdfast::sync_manifest m;
      for (const auto& e : extraneous) {
        if (e.first.back() == '/') continue;
        write_file(s.run_path("r") + "/" + e.first, e.second);
        holdfast::sync_manifest_entry entry;
        entry.origin = origin;
        entry.size = static_cast<std::int64_t>(e.second.size());
        entry.mode = 0100644;
        m.files[e.first] = entry;
      }
      write_file(s.run_path("r") + "/" + std::string(holdfast::sync_manifest_name),
                 holdfast::format_sync_manifest(m));
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
      std::string op = holdfast::testing::to_string(fault_plan::last_failed());
      if (!failed) {
        // Only closing a read-only descriptor (a local input, a directory scan) may fail
        // unnoticed: the descriptor is gone either way and nothing was written through it; and
        // unlinking the manifest's displaced old version after the new one is in place (a
        // temp publish.hpp documents, for sweep_stale_temps).
        CHECK((op == "close" || op == "closedir" || op == "unlink"));
      }
      std::string remote = s.run_path("r");
      // Whatever exists under a final name is complete: a mirrored file, or an untouched
      // extraneous one not yet deleted.
      for (const auto& entry : snapshot(remote)) {
        const std::string& rel = entry.first;
        CAPTURE(rel);
        if (holdfast::is_temp_name(fs::path(rel).filename().string())) continue;
        bool mirrored = expected.count(rel) && expected.at(rel) == entry.second;
        bool stale = extraneous.count(rel) && extraneous.at(rel) == entry.second;
        CHECK((mirrored || stale));
      }
      if (failed || op != "unlink") CHECK(!has_temp(remote));
      // A clean retry finishes the mirror (and sweeps a leftover temp).
      holdfast::sync_options retry = o;
      retry.sweep_temps_older_than = std::chrono::seconds(0);
      s.sync("r", local, retry);
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

// ---------------------------------------------------------------------------------------------
// sync across restarts: the manifest at the destination
// ---------------------------------------------------------------------------------------------

namespace {

holdfast::sync_options with_deletions() {
  holdfast::sync_options o;
  o.propagate_deletions = true;
  return o;
}

std::string manifest_of(const std::string& run_dir) {
  return run_dir + "/" + std::string(holdfast::sync_manifest_name);
}

// The manifest of a run, parsed.
holdfast::sync_manifest read_manifest(const std::string& run_dir) {
  std::string path = manifest_of(run_dir);
  return holdfast::parse_sync_manifest(read_file(path), path);
}

}  // namespace

TEST_CASE("a preempted job's next attempt, in a new process and a new local dir, keeps its files") {
  // The pattern at the top of store.hpp on a mount: each attempt writes into a fresh scratch
  // directory and syncs with deletions. Attempt 2 must not delete what attempt 1 uploaded.
  holdfast_test::temp_dir dir("attempts");
  holdfast::store_options so;
  so.local_temp_dir = dir / "scratch";
  fs::create_directories(so.local_temp_dir);
  using store_t = holdfast::basic_store<holdfast::mounted_remote>;
  const std::string remote = store_t::create(dir / "remote", so).run_path("run-7");

  holdfast_test::child first([&] {
    auto s = store_t::create(dir / "remote", so);
    auto out = s.local_output_dir("run-7");
    for (int i = 1; i <= 10; ++i)
      write_file(out.path() + "/logs/events." + std::to_string(i),
                 "attempt 1, event " + std::to_string(i));
    auto r = s.sync("run-7", out.path(), with_deletions());
    CHILD_REQUIRE(r.copied.size() == 10);
    CHILD_REQUIRE(r.deleted.empty());
    ::_exit(0);  // preempted: the scratch directory is left behind, as after a SIGKILL
  });
  auto r1 = first.wait(std::chrono::seconds(60));
  CHECK_MESSAGE(r1.ok(), r1.failures);
  auto after_first = snapshot(remote);
  CHECK(after_first.size() == 11);  // logs/ and its 10 files

  holdfast_test::child second([&] {
    auto s = store_t::create(dir / "remote", so);
    auto out = s.local_output_dir("run-7");  // a new, empty directory: a new origin
    auto r = s.sync("run-7", out.path(), with_deletions());
    CHILD_REQUIRE(r.deleted.empty());
    CHILD_REQUIRE(r.copied.empty());
    write_file(out.path() + "/logs/events.11", "attempt 2");
    r = s.sync("run-7", out.path(), with_deletions());
    CHILD_REQUIRE(r.copied == std::vector<std::string>{"logs/events.11"});
    CHILD_REQUIRE(r.deleted.empty());
    fs::remove(out.path() + "/logs/events.11");  // a file this attempt uploaded, deleted
    r = s.sync("run-7", out.path(), with_deletions());
    CHILD_REQUIRE(r.deleted == std::vector<std::string>{"logs/events.11"});
  });
  auto r2 = second.wait(std::chrono::seconds(60));
  CHECK_MESSAGE(r2.ok(), r2.failures);
  CHECK(snapshot(remote) == after_first);  // all 10 of attempt 1 kept, whole
  CHECK(!fs::exists(remote + "/logs/events.11"));
  auto m = read_manifest(remote);
  CHECK(m.files.size() == 10);
  CHECK(!has_temp(remote));
}

TEST_CASE("a restart in the same local dir re-copies nothing unchanged and deletes its own") {
  holdfast_test::temp_dir dir("restart");
  using store_t = holdfast::basic_store<holdfast::mounted_remote>;
  const std::string local = dir / "local";  // kept across attempts (a node-local disk)
  const std::string remote = store_t::create(dir / "remote").run_path("r");
  const std::vector<std::string> names = {"a.txt", "logs/b.txt", "logs/deep/c.txt"};
  for (const auto& n : names) {
    write_file(local + "/" + n, "content of " + n);
    age(local + "/" + n);  // not racily clean: the rule under test is the manifest's
  }
  holdfast_test::child first([&] {
    auto r = store_t::create(dir / "remote").sync("r", local, with_deletions());
    CHILD_REQUIRE(r.copied == names);
  });
  auto r1 = first.wait(std::chrono::seconds(60));
  CHECK_MESSAGE(r1.ok(), r1.failures);

  holdfast_test::child second([&] {
    auto s = store_t::create(dir / "remote");
    auto r = s.sync("r", local, with_deletions());
    CHILD_REQUIRE(r.copied.empty());
    CHILD_REQUIRE(r.unchanged == names);
    fs::remove_all(local + "/logs/deep");  // uploaded by the first process from this dir
    r = s.sync("r", local, with_deletions());
    CHILD_REQUIRE(r.deleted == (std::vector<std::string>{"logs/deep", "logs/deep/c.txt"}));
    CHILD_REQUIRE(r.copied.empty());
  });
  auto r2 = second.wait(std::chrono::seconds(60));
  CHECK_MESSAGE(r2.ok(), r2.failures);
  CHECK(snapshot(remote) == snapshot(local));
  auto m = read_manifest(remote);
  CHECK(m.files.size() == 2);
  std::string origin = store_t::create(dir / "remote").origin_of(local);
  for (const auto& e : m.files) CHECK(e.second.origin == origin);
}

TEST_CASE("a remote written without a manifest (the previous release) is adopted, not deleted") {
  holdfast_test::temp_dir dir("adopt");
  auto s = holdfast::store::create(dir / "remote");
  std::string remote = s.run_path("r");
  write_file(remote + "/a.txt", "old a");
  write_file(remote + "/logs/b.txt", "old b");
  write_file(remote + "/only-remote/c.txt", "old c");
  std::string local = dir / "local";
  write_file(local + "/a.txt", "new a");
  write_file(local + "/d.txt", "new d");
  auto r = s.sync("r", local, with_deletions());
  CHECK(r.deleted.empty());
  CHECK(r.copied == std::vector<std::string>{"a.txt", "d.txt"});
  CHECK(read_file(remote + "/a.txt") == "new a");
  CHECK(read_file(remote + "/logs/b.txt") == "old b");
  CHECK(read_file(remote + "/only-remote/c.txt") == "old c");
  auto m = read_manifest(remote);
  CHECK(m.files.size() == 2);  // only what this origin uploaded
  CHECK(m.files.count("a.txt") == 1);
  CHECK(m.files.count("d.txt") == 1);
  // Deleting locally removes what this directory uploaded, never the adopted files.
  fs::remove(local + "/d.txt");
  fs::remove(local + "/a.txt");
  r = s.sync("r", local, with_deletions());
  CHECK(r.deleted == std::vector<std::string>{"a.txt", "d.txt"});
  CHECK(read_file(remote + "/logs/b.txt") == "old b");
  CHECK(read_file(remote + "/only-remote/c.txt") == "old c");
  // Readers of the layout see the same files as before: the manifest is one more dot-file.
  CHECK(snapshot(remote) == (std::map<std::string, std::string>{{"logs/", ""},
                                                                {"logs/b.txt", "old b"},
                                                                {"only-remote/", ""},
                                                                {"only-remote/c.txt", "old c"}}));
}

TEST_CASE("manifest format: round trip, and every malformation a format_error naming the line") {
  holdfast::sync_manifest m;
  const std::string o1(32, 'a'), o2 = "0123456789abcdef0123456789abcdef";
  holdfast::sync_manifest_entry e;
  e.origin = o1;
  e.size = 12;
  e.mtime_ns = 1330712280123456789;
  e.ino = 4242;
  e.mode = 0100644;
  m.files["logs/events.1"] = e;
  e.origin = o2;
  e.mtime_ns = -5;  // before 1970
  e.racy = true;
  e.mode = 0100600;
  m.files["odd names/a b\\c\nd\te\x7f\xc3\xa9"] = e;
  const std::string text = holdfast::format_sync_manifest(m);
  CHECK(text ==
        "holdfast-sync-manifest 1\n"
        "file " +
            o1 +
            " 12 1330712280123456789 4242 100644 - logs/events.1\n"
            "file " +
            o2 +
            " 12 -5 4242 100600 r odd names/a b\\\\c\\nd\\x09e\\x7f\xc3\xa9\n"
            "end 2\n");
  auto back = holdfast::parse_sync_manifest(text, "m");
  CHECK(back.files == m.files);
  CHECK(holdfast::parse_sync_manifest("holdfast-sync-manifest 1\nend 0\n", "m").files.empty());

  const std::string head = "holdfast-sync-manifest 1\n";
  const std::string line = "file " + o1 + " 1 2 3 100644 - x\n";
  struct row {
    std::string text;
    const char* where;  // "line N: ..." fragment
  };
  const row rows[] = {
      {"", "line 1: empty"},
      {"holdfast-sync-manifest 1", "line 1: truncated"},
      {"hello\n", "line 1: not a holdfast sync manifest"},
      {"holdfast-sync-manifest 2\nend 0\n", "line 1: format version 2"},
      {"holdfast-sync-manifest x\nend 0\n", "line 1: bad format version"},
      {head, "line 1: truncated: no end line"},
      {head + line, "line 2: truncated: no end line"},
      {head + line.substr(0, 30), "line 2: truncated"},
      {head + line + "end 2\n", "line 3: the end line counts 2"},
      {head + line + "end 1\nfile", "line 4: truncated"},
      {head + line + "end 1\n\n", "line 4: text after the end line"},
      {head + "file zz 1 2 3 100644 - x\nend 1\n", "line 2: bad origin"},
      {head + "file " + o1 + " -1 2 3 100644 - x\nend 1\n", "line 2: bad size"},
      {head + "file " + o1 + " 1 2x 3 100644 - x\nend 1\n", "line 2: bad mtime"},
      {head + "file " + o1 + " 1 2 3 100648 - x\nend 1\n", "line 2: bad mode"},
      {head + "file " + o1 + " 1 2 3 100644 ? x\nend 1\n", "line 2: bad flags"},
      {head + "file " + o1 + " 1 2 3 100644 -\nend 1\n", "line 2: too few fields"},
      {head + "file " + o1 + " 1 2 3 100644 - ../escape\nend 1\n", "line 2: '.' or '..'"},
      {head + "file " + o1 + " 1 2 3 100644 - a/../../b\nend 1\n", "line 2: '.' or '..'"},
      {head + "file " + o1 + " 1 2 3 100644 - /etc/passwd\nend 1\n", "line 2: absolute path"},
      {head + "file " + o1 + " 1 2 3 100644 - a//b\nend 1\n", "line 2: empty path component"},
      {head + "file " + o1 + " 1 2 3 100644 - \nend 1\n", "line 2: empty path"},
      {head + "file " + o1 + " 1 2 3 100644 - a\\x00b\nend 1\n", "line 2: NUL"},
      {head + "file " + o1 + " 1 2 3 100644 - a\\qb\nend 1\n", "line 2: bad escape"},
      {head + "file " + o1 + " 1 2 3 100644 - .holdfast-sync-manifest\nend 1\n",
       "line 2: a name sync reserves"},
      {head + line + line + "end 2\n", "line 3: duplicate path 'x'"},
      {head + "garbage\nend 0\n", "line 2: expected 'file' or 'end'"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.text);
    try {
      holdfast::parse_sync_manifest(r.text, "/remote/runs/r/.holdfast-sync-manifest");
      FAIL("parsed");
    } catch (const holdfast::format_error& err) {
      CHECK(err.errnum() == EINVAL);
      CHECK(err.path() == "/remote/runs/r/.holdfast-sync-manifest");
      CHECK(std::string(err.what()).find(r.where) != std::string::npos);
    }
  }
}

TEST_CASE("a truncated or garbled manifest stops the sync before anything is deleted or copied") {
  holdfast_test::temp_dir dir("badmanifest");
  auto s = holdfast::store::create(dir / "remote");
  std::string remote = s.run_path("r");
  std::string local = dir / "local";
  for (const char* n : {"a", "b", "logs/c"}) write_file(local + "/" + n, n);
  s.sync("r", local);
  const std::string good = read_file(manifest_of(remote));
  auto before = snapshot(remote);
  REQUIRE(before.size() == 4);
  fs::remove_all(local + "/logs");
  fs::remove(local + "/a");
  write_file(local + "/new", "new");  // would be copied by a sync that went ahead
  const std::string garbled = [&] {
    std::string g = good;
    g[g.find(" 100")] = 'X';  // the first file line loses its mode field's separator
    return g;
  }();
  const std::pair<std::string, const char*> cases[] = {
      {good.substr(0, good.size() / 2), "truncated"},
      {good.substr(0, good.rfind("end ")), "no end line"},
      {garbled, "line 2:"},
  };
  for (const auto& c : cases) {
    const std::string& text = c.first;
    const char* why = c.second;
    CAPTURE(text);
    write_file(manifest_of(remote), text);
    try {
      s.sync("r", local, with_deletions());
      FAIL("synced");
    } catch (const holdfast::format_error& e) {
      CHECK(e.path() == manifest_of(remote));
      CHECK(std::string(e.what()).find(why) != std::string::npos);
      CHECK(std::string(e.what()).find("line ") != std::string::npos);
    }
    CHECK(snapshot(remote) == before);  // nothing deleted, nothing copied
    CHECK(read_file(manifest_of(remote)) == text);
  }
  // Removing the manifest is the way out: the remote is adopted, nothing deleted.
  fs::remove(manifest_of(remote));
  auto r = s.sync("r", local, with_deletions());
  CHECK(r.deleted.empty());
  CHECK(r.copied == std::vector<std::string>{"b", "new"});
}

TEST_CASE("origin ids: made with a scratch dir, stable, malformed origin files rejected") {
  holdfast_test::temp_dir dir("origin");
  holdfast::store_options so;
  so.local_temp_dir = dir.path();
  auto s = holdfast::basic_store<holdfast::mounted_remote>::create(dir / "remote", so);
  auto out = s.local_output_dir("r");
  REQUIRE(fs::exists(out.path() + "/" + std::string(holdfast::sync_origin_name)));
  std::string id = s.origin_of(out.path());
  CHECK(id.size() == 32);
  CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(s.origin_of(out.path()) == id);
  CHECK(read_file(out.path() + "/.holdfast-origin") == "holdfast-origin 1\n" + id + "\n");
  auto other = s.local_output_dir("r");
  CHECK(s.origin_of(other.path()) != id);
  // Never uploaded.
  write_file(out.path() + "/x", "x");
  CHECK(s.sync("r", out.path()).copied == std::vector<std::string>{"x"});
  CHECK(!fs::exists(s.run_path("r") + "/.holdfast-origin"));
  write_file(out.path() + "/.holdfast-origin", "holdfast-origin 1\nnot-hex\n");
  auto text = error_text<holdfast::format_error>([&] { s.origin_of(out.path()); });
  CHECK(text.find(out.path() + "/.holdfast-origin") != std::string::npos);
  CHECK(text.find("line 2") != std::string::npos);
}

TEST_CASE("concurrent syncs of two origins to one run lose no manifest entries") {
  holdfast_test::shm_temp_dir dir("concurrent");
  using store_t = holdfast::basic_store<holdfast::mounted_remote>;
  const std::string remote = store_t::create(dir / "remote").run_path("r");
  const int rounds = sanitized ? 8 : 25;
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<holdfast_test::child> kids;
  for (const char* who : {"one", "two"})
    kids.emplace_back([&, who] {
      ::close(gate[1]);
      char c;
      (void)!::read(gate[0], &c, 1);  // both start when the parent closes the gate
      auto s = store_t::create(dir / "remote");
      std::string local = dir / who;
      for (int i = 0; i < rounds; ++i) {
        write_file(local + "/logs/" + who + "." + std::to_string(i), who);
        // a file each round that this origin then deletes again
        write_file(local + "/tmp-" + who, std::to_string(i));
        s.sync("r", local, with_deletions());
        fs::remove(local + "/tmp-" + who);
        auto r = s.sync("r", local, with_deletions());
        CHILD_REQUIRE(r.deleted == std::vector<std::string>{"tmp-" + std::string(who)});
      }
    });
  ::close(gate[0]);
  ::close(gate[1]);
  for (auto& k : kids) {
    auto r = k.wait(std::chrono::seconds(120));
    CHECK_MESSAGE(r.ok(), r.failures);
  }
  auto m = read_manifest(remote);
  auto s = store_t::create(dir / "remote");
  CHECK(m.files.size() == static_cast<std::size_t>(2 * rounds));
  for (const char* who : {"one", "two"}) {
    std::string origin = s.origin_of(dir / who);
    for (int i = 0; i < rounds; ++i) {
      std::string rel = "logs/" + std::string(who) + "." + std::to_string(i);
      CAPTURE(rel);
      REQUIRE(m.files.count(rel) == 1);
      CHECK(m.files.at(rel).origin == origin);
      CHECK(read_file(remote + "/" + rel) == who);
    }
  }
  CHECK(!has_temp(remote));
}

namespace {
// posix_io whose flock answers ENOLCK, as an NFSv3 mount without a lock manager does.
struct no_lock_io : holdfast::posix_io {
  static int flock(int, int) noexcept {
    errno = ENOLCK;
    return -1;
  }
};
}  // namespace

TEST_CASE("where the run directory cannot be locked, sync fails unless told to go on") {
  holdfast_test::temp_dir dir("nolock");
  auto s = holdfast::basic_store<holdfast::basic_local_filesystem<no_lock_io>>::create(dir / "r");
  write_file(dir / "local/a", "a");
  try {
    s.sync("r", dir / "local");
    FAIL("synced without the lock");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == ENOLCK);
    CHECK(e.operation() == "flock");
    CHECK(e.path() == s.run_path("r") + "/" + std::string(holdfast::sync_lock_name));
  }
  holdfast::sync_options o;
  o.tolerate_no_lock = true;
  CHECK(s.sync("r", dir / "local", o).copied == std::vector<std::string>{"a"});
}

TEST_CASE("sync refuses a local dir inside the run dir, or around it, naming both") {
  holdfast_test::temp_dir dir("nested");
  auto s = holdfast::basic_store<holdfast::mounted_remote>::create(dir / "remote");
  std::string remote = s.run_path("r");
  std::string inside = remote + "/staging";
  write_file(inside + "/weights", "precious");
  write_file(remote + "/other", "o");
  for (bool deletions : {false, true}) {
    holdfast::sync_options o;
    o.propagate_deletions = deletions;
    try {
      s.sync("r", inside, o);
      FAIL("synced");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EINVAL);
      CHECK(e.path() == inside);
      CHECK(std::string(e.what()).find(remote) != std::string::npos);
    }
    // Through a symlink, too.
    fs::create_directory_symlink(inside, dir / "link");
    CHECK_THROWS_AS(s.sync("r", dir / "link", o), holdfast::error);
    fs::remove(dir / "link");
  }
  CHECK(read_file(inside + "/weights") == "precious");
  CHECK(read_file(remote + "/other") == "o");
  // The run directory inside the local one: every sync would copy the mirror into itself.
  auto outer = error_text<holdfast::error>([&] { s.sync("r", dir.path()); });
  CHECK(outer.find(dir.path()) != std::string::npos);
  CHECK(outer.find(remote) != std::string::npos);
  CHECK(!fs::exists(remote + "/remote"));
  // ... also when the run directory does not exist yet: refused before it is made.
  auto fresh = holdfast::basic_store<holdfast::mounted_remote>::create(dir / "fresh");
  CHECK_THROWS_AS(fresh.sync("r", dir.path()), holdfast::error);
  CHECK(!fs::exists(dir / "fresh"));
  // NUL in the local path would cut it.
  CHECK(error_text<holdfast::error>([&] { s.sync("r", std::string("/tmp\0/x", 7)); }).find("NUL") !=
        std::string::npos);
}

TEST_CASE("deletions never follow a symlink out of the run directory") {
  holdfast_test::temp_dir dir("escape");
  auto s = holdfast::store::create(dir / "remote");
  std::string remote = s.run_path("r");
  std::string local = dir / "local";
  write_file(local + "/logs/a", "a");
  write_file(local + "/keep", "k");
  s.sync("r", local);
  // Someone replaces the remote logs directory by a symlink to a directory outside the run
  // holding a file of the same name.
  write_file(dir / "outside/a", "not the run's");
  fs::remove_all(remote + "/logs");
  fs::create_directory_symlink(dir / "outside", remote + "/logs");
  fs::remove_all(local + "/logs");
  auto r = s.sync("r", local, with_deletions());
  CHECK(r.deleted.empty());
  CHECK(read_file(dir / "outside/a") == "not the run's");
  CHECK(read_manifest(remote).files.count("logs/a") == 0);  // forgotten: not there to delete
  CHECK(read_file(remote + "/keep") == "k");
}

namespace {
// posix_io that swaps the directory named "victim" for a symlink to `outside()` right after its
// type was checked, as another process could mid-removal.
struct swap_io : holdfast::posix_io {
  static std::string& outside() {
    static std::string p;
    return p;
  }
  static bool& armed() {
    static bool a = false;
    return a;
  }
  static int lstat(const char* p, struct stat* st) noexcept {  // a path-based removal's check
    int r = posix_io::lstat(p, st);
    std::string path = p;
    if (r == 0 && armed() && path.size() > 7 && path.substr(path.size() - 7) == "/victim") {
      armed() = false;
      ::rename(p, (outside() + ".moved").c_str());
      ::symlink(outside().c_str(), p);
    }
    return r;
  }
  static int fstatat(int d, const char* p, struct stat* st, int f) noexcept {
    int r = posix_io::fstatat(d, p, st, f);
    if (r == 0 && armed() && std::string(p) == "victim") {
      armed() = false;
      ::renameat(d, "victim", AT_FDCWD, (outside() + ".moved").c_str());  // out of the tree
      ::symlinkat(outside().c_str(), d, "victim");
    }
    return r;
  }
};
}  // namespace

TEST_CASE("reclaiming a dataset unlinks a symlink swapped in mid-removal, never follows it") {
  holdfast_test::temp_dir dir("reclaimswap");
  auto s = holdfast::basic_store<holdfast::basic_local_filesystem<swap_io>>::create(dir / "p");
  write_file(dir / "outside/precious", "keep me");
  write_file(s.train_data_path() + "/victim/part-0", "p0");
  swap_io::outside() = dir / "outside";
  swap_io::armed() = true;
  CHECK(s.reclaim_intermediate_data() == std::vector<std::string>{s.train_data_path()});
  CHECK_FALSE(swap_io::armed());  // the swap happened
  CHECK(read_file(dir / "outside/precious") == "keep me");
  CHECK_FALSE(fs::exists(s.train_data_path()));
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
