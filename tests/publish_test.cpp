// Atomic publishing: the contract over every Durability x Io, a failure injected at every
// syscall of every protocol, concurrent readers and writers (threads and processes), a
// publish_once race, writers killed at random points, and the stale-temp sweep.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <holdfast/publish.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <holdfast/wait.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/sanitizers.hpp"
#include "support/temp_dir.hpp"

using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using holdfast_test::disarm_on_exit;
using namespace std::chrono_literals;

namespace {

using holdfast_test::sanitized;

std::string slurp(const std::string& path) {
  auto fd = holdfast::open_file(path, O_RDONLY);
  return holdfast::read_all(fd);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

std::vector<std::string> temps_in(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& n : holdfast::detail::list_directory<holdfast::posix_io>(dir))
    if (holdfast::is_temp_name(n)) out.push_back(n);
  return out;
}

void make_dir(const std::string& p) { REQUIRE(::mkdir(p.c_str(), 0755) == 0); }

void write_plain(const std::string& path, const std::string& content) {
  auto fd = holdfast::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  holdfast::write_all(fd, content.data(), content.size());
  fd.close();
}

// A version whose checksum is embedded: "<fnv64 hex> <tag>\n<payload>".
std::uint64_t fnv(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}
std::string make_version(const std::string& tag, std::size_t payload) {
  std::string body = tag + "\n" + std::string(payload, static_cast<char>('a' + payload % 26));
  char head[20];
  std::snprintf(head, sizeof head, "%016llx ", static_cast<unsigned long long>(fnv(body)));
  return head + body;
}
bool is_complete_version(const std::string& s) {
  if (s.size() < 17 || s[16] != ' ') return false;
  return std::strtoull(s.substr(0, 16).c_str(), nullptr, 16) == fnv(s.substr(17));
}

// A scratch directory on tmpfs when there is one: the stress tests want many interleavings per
// second, and ext4's rename heuristic (auto_da_alloc) makes each replace cost a flush there.
class fast_temp_dir {
 public:
  fast_temp_dir() {
    struct stat st {};
    std::string base =
        ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && ::access("/dev/shm", W_OK) == 0
            ? "/dev/shm"
            : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    std::string tmpl = base + "/holdfast-stress-XXXXXX";
    REQUIRE(::mkdtemp(&tmpl[0]) != nullptr);
    path_ = tmpl;
    owner_ = ::getpid();
  }
  fast_temp_dir(const fast_temp_dir&) = delete;
  fast_temp_dir& operator=(const fast_temp_dir&) = delete;
  ~fast_temp_dir() {
    if (::getpid() == owner_) holdfast::detail::remove_tree<holdfast::posix_io>(path_);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& n) const { return path_ + "/" + n; }

 private:
  std::string path_;
  pid_t owner_;
};

template <class D, class Io>
struct combo {
  using durability = D;
  using io = Io;
  using publisher = holdfast::basic_publisher<D, Io>;
};

}  // namespace

TEST_CASE("temp names: recognizable pattern, pid inside, cut to 255 bytes") {
  CHECK(holdfast::is_temp_name(".holdfast-tmp.123.0123456789abcdef.x"));
  CHECK(holdfast::is_temp_name(".holdfast-tmp.1.ffffffffffffffff.a.b"));
  CHECK_FALSE(holdfast::is_temp_name(".holdfast-tmp.123.0123456789abcdef"));   // no name
  CHECK_FALSE(holdfast::is_temp_name(".holdfast-tmp..0123456789abcdef.x"));    // no pid
  CHECK_FALSE(holdfast::is_temp_name(".holdfast-tmp.12.0123456789abcde.x"));   // 15 hex
  CHECK_FALSE(holdfast::is_temp_name(".holdfast-tmp.12.0123456789ABCDEF.x"));  // upper case
  CHECK_FALSE(holdfast::is_temp_name("holdfast-tmp.12.0123456789abcdef.x"));
  CHECK_FALSE(holdfast::is_temp_name("model.ckpt"));
  auto t = holdfast::detail::temp_path_for<holdfast::posix_io>("/d", std::string(300, 'n'), 0);
  auto name = holdfast::detail::split_path(t).second;
  CHECK(name.size() == 255);
  CHECK(holdfast::is_temp_name(name));
  CHECK(name.find("." + std::to_string(::getpid()) + ".") != std::string::npos);
}

namespace {
struct missing_einval_choice {  // a Durability policy that does not say what EINVAL means
  static constexpr holdfast::file_sync file = holdfast::file_sync::full;
  static constexpr bool sync_parent = true;
};
}  // namespace

TEST_CASE("Durability policies are checked at compile time") {
  static_assert(holdfast::detail::is_durability_policy_v<holdfast::durable>);
  static_assert(holdfast::detail::is_durability_policy_v<holdfast::durable_tolerate_einval>);
  static_assert(holdfast::detail::is_durability_policy_v<holdfast::data_only>);
  static_assert(holdfast::detail::is_durability_policy_v<holdfast::no_sync>);
  static_assert(!holdfast::detail::is_durability_policy_v<missing_einval_choice>);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  static_assert(holdfast::durability_policy<holdfast::durable>);
  static_assert(!holdfast::durability_policy<missing_einval_choice>);
#endif
  CHECK(holdfast::durable::on_directory_einval == holdfast::directory_einval::fail);
  CHECK(holdfast::durable_tolerate_einval::on_directory_einval ==
        holdfast::directory_einval::accept);
}

TEST_CASE("split_path") {
  using holdfast::detail::split_path;
  CHECK(split_path("a") == std::make_pair(std::string("."), std::string("a")));
  CHECK(split_path("/a") == std::make_pair(std::string("/"), std::string("a")));
  CHECK(split_path("x/y/z") == std::make_pair(std::string("x/y"), std::string("z")));
  CHECK(split_path("x/y/") == std::make_pair(std::string("x"), std::string("y")));
}

TEST_CASE_TEMPLATE_DEFINE("publisher contract", T, publisher_contract) {
  using P = typename T::publisher;
  using fd_type = typename P::fd_type;
  holdfast_test::temp_dir dir("pub");
  const P pub;
  const std::string target = dir / "model.json";

  SUBCASE("publish creates the target with the requested mode and leaves no temp") {
    pub.publish(target, "hello", 0640);
    CHECK(slurp(target) == "hello");
    CHECK(mode_of(target) == 0640);
    CHECK(temps_in(dir.path()).empty());
  }
  SUBCASE("publish replaces, whole, and empty content is a file") {
    pub.publish(target, std::string(1 << 20, 'x') + "end");
    pub.publish(target, "v2");
    CHECK(slurp(target) == "v2");
    pub.publish(target, "");
    CHECK(exists(target));
    CHECK(slurp(target).empty());
    CHECK(temps_in(dir.path()).empty());
  }
  SUBCASE("publish_once creates once and never replaces") {
    CHECK(pub.publish_once(target, "first", 0600));
    CHECK(mode_of(target) == 0600);
    CHECK_FALSE(pub.publish_once(target, "second"));
    CHECK(slurp(target) == "first");
    CHECK(temps_in(dir.path()).empty());
  }
  SUBCASE("streaming writers write into the temp descriptor") {
    pub.publish_with(target, [](const fd_type& fd) {
      for (int i = 0; i < 100; ++i) holdfast::write_all(fd, "0123456789", 10);
    });
    CHECK(slurp(target) == [] {
      std::string s;
      for (int i = 0; i < 100; ++i) s += "0123456789";
      return s;
    }());
    CHECK(pub.publish_once_with(dir / "once",
                                [](const fd_type& fd) { holdfast::write_all(fd, "abc", 3); }));
    CHECK_FALSE(pub.publish_once_with(dir / "once", [](const fd_type& fd) {
      holdfast::write_all(fd, "zzz", 3);  // a losing writer's bytes go nowhere
    }));
    CHECK(temps_in(dir.path()).empty());
    CHECK(slurp(dir / "once") == "abc");
  }
  SUBCASE("a throwing writer: its exception, target untouched, no temp") {
    pub.publish(target, "old");
    CHECK_THROWS_AS(pub.publish_with(target,
                                     [](const fd_type& fd) {
                                       holdfast::write_all(fd, "partial", 7);
                                       throw std::runtime_error("writer failed");
                                     }),
                    std::runtime_error);
    CHECK(slurp(target) == "old");
    CHECK(temps_in(dir.path()).empty());
  }
  SUBCASE("errors name the operation and the path") {
    try {
      pub.publish(dir / "missing-dir/x", "a");
      FAIL("no error");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == ENOENT);
      CHECK(e.operation() == "open");
      CHECK(e.path().find(dir / "missing-dir/") == 0);
    }
    CHECK_THROWS_AS(pub.publish(dir / "..", "a"), holdfast::error);
    CHECK_THROWS_AS(pub.publish("", "a"), holdfast::error);
  }
  SUBCASE("a target name near NAME_MAX still gets a temp in the same directory") {
    std::string longname = dir / std::string(250, 'L');
    pub.publish(longname, "long");
    CHECK(slurp(longname) == "long");
    CHECK(temps_in(dir.path()).empty());
  }
  SUBCASE("publish_directory: no-replace returns false, replace swaps whole trees") {
    make_dir(dir / "stage1");
    make_dir(dir / "stage1/sub");
    write_plain(dir / "stage1/a", "A1");
    write_plain(dir / "stage1/sub/b", "B1");
    CHECK(pub.publish_directory(dir / "stage1", dir / "ckpt"));
    CHECK(slurp(dir / "ckpt/a") == "A1");
    CHECK(slurp(dir / "ckpt/sub/b") == "B1");
    CHECK_FALSE(exists(dir / "stage1"));

    make_dir(dir / "stage2");
    write_plain(dir / "stage2/a", "A2");
    CHECK_FALSE(pub.publish_directory(dir / "stage2", dir / "ckpt"));
    CHECK(slurp(dir / "ckpt/a") == "A1");
    CHECK(slurp(dir / "stage2/a") == "A2");

    pub.publish_directory(dir / "stage2", dir / "ckpt", holdfast::replace_existing);
    CHECK(slurp(dir / "ckpt/a") == "A2");
    CHECK_FALSE(exists(dir / "ckpt/sub"));
    CHECK_FALSE(exists(dir / "stage2"));  // the old tree was removed

    make_dir(dir / "stage3");
    write_plain(dir / "stage3/c", "C");
    pub.publish_directory(dir / "stage3", dir / "fresh", holdfast::replace_existing);
    CHECK(slurp(dir / "fresh/c") == "C");
  }
  SUBCASE("commit-marker mode: absent until the marker, removal drops the marker first") {
    make_dir(dir / "step-10");
    write_plain(dir / "step-10/shard-0", "data");
    CHECK_FALSE(P::is_committed(dir / "step-10"));
    CHECK_FALSE(P::is_committed(dir / "nonexistent"));
    pub.commit_directory(dir / "step-10");
    CHECK(P::is_committed(dir / "step-10"));
    CHECK(exists(dir / "step-10/commit_success.txt"));
    pub.remove_committed_directory(dir / "step-10");
    CHECK_FALSE(exists(dir / "step-10"));
    CHECK_FALSE(P::is_committed(dir / "step-10"));
  }
}

TEST_CASE_TEMPLATE_INVOKE(publisher_contract, combo<holdfast::durable, holdfast::posix_io>,
                          combo<holdfast::durable_tolerate_einval, holdfast::posix_io>,
                          combo<holdfast::data_only, holdfast::posix_io>,
                          combo<holdfast::no_sync, holdfast::posix_io>,
                          combo<holdfast::durable, fault_io>,
                          combo<holdfast::durable_tolerate_einval, fault_io>,
                          combo<holdfast::data_only, fault_io>, combo<holdfast::no_sync, fault_io>);

namespace {

// fault_io on a filesystem without renameat2: publish_once takes the link + unlink fallback.
struct no_renameat2_io : fault_io {
  static int renameat2(int, const char*, int, const char*, unsigned) noexcept {
    errno = ENOSYS;  // not counted: the sweep fails only calls that reach the kernel
    return -1;
  }
};

// fault_io whose directory fsync answers EINVAL, as some NFS and FUSE mounts do.
struct einval_dirsync_io : fault_io {
  static int fsync(int fd) noexcept {
    struct stat st {};
    if (posix_io::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      errno = EINVAL;
      return -1;
    }
    return fault_io::fsync(fd);
  }
};

// Runs `op` once unarmed to count its calls, then once per call k with call k failing.
// `check(threw, error)` sees each outcome after `reset()` restored the starting state.
template <class Reset, class Op, class Check>
void fail_each_call(int errnum, Reset reset, Op op, Check check) {
  disarm_on_exit guard;
  reset();
  fault_plan::disarm();
  fault_plan::reset_counts();
  op();
  const auto calls = fault_plan::calls(io_op::any);
  REQUIRE(calls >= 1);
  for (std::uint64_t k = 1; k <= calls; ++k) {
    reset();
    fault_plan::arm(fault{io_op::any, k, errnum});
    CAPTURE(k);
    bool threw = false;
    holdfast::error err(0, "", "");
    try {
      op();
    } catch (const holdfast::error& e) {
      threw = true;
      err = e;
    }
    fault_plan::disarm();
    REQUIRE(fault_plan::failures() == 1);
    check(threw, err, fault_plan::last_failed());
  }
}

template <class D, class Io = fault_io>
void fault_sweep_file(const char* label) {
  CAPTURE(label);
  fast_temp_dir dir;  // what a failure leaves, not power loss: tmpfs keeps the loop quick
  const holdfast::basic_publisher<D, Io> pub;
  const std::string target = dir / "t";
  const std::string fresh = dir / "fresh";
  const std::string big(100000, 'n');
  bool ok = false;  // the op's result (doctest assertions inside an op would swallow its throw)

  for (int errnum : {EIO, ENOSPC}) {
    CAPTURE(errnum);
    // publish over an existing target
    fail_each_call(
        errnum, [&] { write_plain(target, "old"); }, [&] { pub.publish(target, big); },
        [&](bool threw, const holdfast::error& e, io_op failed) {
          if (threw) {
            CHECK(slurp(target) == "old");
            CHECK(e.operation() == holdfast::testing::to_string(failed));
            CHECK(e.errnum() == errnum);
            CHECK(temps_in(dir.path()).empty());
          } else {
            // only a cleanup unlink after success may fail silently; sweep removes the rest
            CHECK(failed == io_op::unlink);
            CHECK(slurp(target) == big);
            holdfast::sweep_stale_temps(dir.path(), 0ms);
            CHECK(temps_in(dir.path()).empty());
          }
        });
    // publish of a new target
    fail_each_call(
        errnum, [&] { ::unlink(fresh.c_str()); }, [&] { pub.publish(fresh, "new"); },
        [&](bool threw, const holdfast::error& e, io_op failed) {
          CHECK(threw);
          CHECK_FALSE(exists(fresh));
          CHECK(e.operation() == holdfast::testing::to_string(failed));
          CHECK(temps_in(dir.path()).empty());
        });
    // publish_once of a new target
    fail_each_call(
        errnum, [&] { ::unlink(fresh.c_str()); },
        [&] { ok = false, ok = pub.publish_once(fresh, "new"); },
        [&](bool threw, const holdfast::error& e, io_op failed) {
          if (threw) {
            CHECK_FALSE(exists(fresh));
            CHECK(e.operation() == holdfast::testing::to_string(failed));
            CHECK(temps_in(dir.path()).empty());
          } else {
            CHECK(ok);
            CHECK(failed == io_op::unlink);  // the link fallback's temp removal
            CHECK(slurp(fresh) == "new");
            holdfast::sweep_stale_temps(dir.path(), 0ms);
            CHECK(temps_in(dir.path()).empty());
          }
        });
    // publish_once over an existing target: false, or an error; never a change
    fail_each_call(
        errnum, [&] { write_plain(target, "old"); },
        [&] { ok = false, ok = pub.publish_once(target, "new"); },
        [&](bool threw, const holdfast::error& e, io_op failed) {
          CHECK(slurp(target) == "old");
          if (!threw) CHECK_FALSE(ok);
          if (threw) CHECK(e.operation() == holdfast::testing::to_string(failed));
          // a failed cleanup (closing the directory, unlinking the losing temp) is not an
          // error of an outcome that is a value; a temp left is the sweep's
          if (!threw) CHECK((failed == io_op::unlink || failed == io_op::close));
          holdfast::sweep_stale_temps(dir.path(), 0ms);
          CHECK(temps_in(dir.path()).empty());
        });
  }
}

template <class D>
void fault_sweep_directory(const char* label) {
  CAPTURE(label);
  fast_temp_dir dir;
  const holdfast::basic_publisher<D, fault_io> pub;
  bool ok = false;
  auto stage = [&] {
    holdfast::detail::remove_tree<holdfast::posix_io>(dir / "stage");
    make_dir(dir / "stage");
    make_dir(dir / "stage/sub");
    write_plain(dir / "stage/a", "new-a");
    write_plain(dir / "stage/sub/b", "new-b");
  };
  auto old_target = [&] {
    holdfast::detail::remove_tree<holdfast::posix_io>(dir / "ckpt");
    make_dir(dir / "ckpt");
    write_plain(dir / "ckpt/a", "old-a");
  };
  // replace
  fail_each_call(
      EIO,
      [&] {
        stage();
        old_target();
      },
      [&] { pub.publish_directory(dir / "stage", dir / "ckpt", holdfast::replace_existing); },
      [&](bool threw, const holdfast::error& e, io_op failed) {
        if (threw) {
          CHECK(slurp(dir / "ckpt/a") == "old-a");
          CHECK(slurp(dir / "stage/a") == "new-a");
          CHECK(e.operation() == holdfast::testing::to_string(failed));
        } else {
          // removing the displaced old tree is cleanup after success
          CHECK(slurp(dir / "ckpt/a") == "new-a");
          CHECK(slurp(dir / "ckpt/sub/b") == "new-b");
        }
      });
  // no-replace of a fresh target
  fail_each_call(
      EIO,
      [&] {
        stage();
        holdfast::detail::remove_tree<holdfast::posix_io>(dir / "ckpt");
      },
      [&] { ok = false, ok = pub.publish_directory(dir / "stage", dir / "ckpt"); },
      [&](bool threw, const holdfast::error& e, io_op failed) {
        CHECK(threw);
        CHECK_FALSE(ok);
        CHECK_FALSE(exists(dir / "ckpt"));
        CHECK(slurp(dir / "stage/sub/b") == "new-b");
        CHECK(e.operation() == holdfast::testing::to_string(failed));
      });
}

}  // namespace

TEST_CASE("a failure at every syscall leaves the target untouched and no temp behind") {
  fault_sweep_file<holdfast::durable>("durable");
  fault_sweep_file<holdfast::durable_tolerate_einval>("durable_tolerate_einval");
  fault_sweep_file<holdfast::data_only>("data_only");
  fault_sweep_file<holdfast::no_sync>("no_sync");
  fault_sweep_file<holdfast::durable, no_renameat2_io>("durable, link fallback");
  fault_sweep_file<holdfast::no_sync, no_renameat2_io>("no_sync, link fallback");
}

TEST_CASE("a failure at every syscall of publish_directory rolls back") {
  fault_sweep_directory<holdfast::durable>("durable");
  fault_sweep_directory<holdfast::no_sync>("no_sync");
}

TEST_CASE("a failure at every syscall of commit_directory leaves no marker") {
  holdfast_test::temp_dir dir("faultcommit");
  using P = holdfast::basic_publisher<holdfast::durable, fault_io>;
  const P pub;
  const std::string step = dir / "step-20";
  make_dir(step);
  make_dir(step + "/sub");
  write_plain(step + "/shard-0", "zero");
  write_plain(step + "/sub/shard-1", "one");
  fail_each_call(
      EIO, [&] { ::unlink((step + "/commit_success.txt").c_str()); },
      [&] { pub.commit_directory(step); },
      [&](bool threw, const holdfast::error& e, io_op failed) {
        CHECK(threw);
        CHECK_FALSE(P::is_committed(step));
        CHECK(e.operation() == holdfast::testing::to_string(failed));
        CHECK(temps_in(step).empty());
      });
  pub.commit_directory(step);
  CHECK(P::is_committed(step));
}

TEST_CASE("EINTR and short writes are finished, not reported") {
  holdfast_test::temp_dir dir("intr");
  const holdfast::basic_publisher<holdfast::durable, fault_io> pub;
  disarm_on_exit guard;
  const std::string content(200000, 'w');
  fault_plan::arm(fault{io_op::write, 1, 0, 7, 5});  // five writes of at most 7 bytes
  pub.publish(dir / "t", content);
  CHECK(fault_plan::failures() == 5);
  CHECK(slurp(dir / "t") == content);
  fault_plan::arm(fault{io_op::fsync, 1, EINTR, 1, 2});
  pub.publish(dir / "t", "again");
  CHECK(fault_plan::failures() == 2);
  CHECK(slurp(dir / "t") == "again");
}

TEST_CASE("a directory fsync answering EINVAL: an error for durable, accepted when chosen") {
  holdfast_test::temp_dir dir("einval");
  write_plain(dir / "t", "old");
  const holdfast::basic_publisher<holdfast::durable, einval_dirsync_io> strict;
  try {
    strict.publish(dir / "t", "new");
    FAIL("durable accepted EINVAL from the directory fsync");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EINVAL);
    CHECK(e.operation() == "fsync");
    CHECK(e.path() == dir.path());
  }
  CHECK(slurp(dir / "t") == "old");  // rolled back
  CHECK(temps_in(dir.path()).empty());
  const holdfast::basic_publisher<holdfast::durable_tolerate_einval, einval_dirsync_io> lenient;
  lenient.publish(dir / "t", "new");
  CHECK(slurp(dir / "t") == "new");
  CHECK(lenient.publish_once(dir / "u", "u"));
  CHECK(slurp(dir / "u") == "u");
  CHECK(temps_in(dir.path()).empty());
}

TEST_CASE("readers see one whole version while threads and processes republish") {
  fast_temp_dir dir;
  const std::string target = dir / "shared";
  const holdfast::basic_publisher<holdfast::no_sync> pub;
  // 10,000 republishes in all per mode; under sanitizers a tenth (they are 10-50x slower).
  const int total = sanitized ? 1000 : 10000;
  const int writers = 4;
  pub.publish(target, make_version("seed", 10));

  SUBCASE("threads") {
    std::atomic<bool> done{false};
    std::atomic<long> reads{0}, bad{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 2; ++r)
      readers.emplace_back([&] {
        while (!done.load()) {
          auto v = holdfast::await_file<holdfast::poll_wait>(target, 1000ms);
          if (!v || !is_complete_version(*v)) ++bad;
          ++reads;
        }
      });
    std::vector<std::thread> ws;
    for (int w = 0; w < writers; ++w)
      ws.emplace_back([&, w] {
        for (int i = 0; i < total / writers; ++i)
          pub.publish(target, make_version("t" + std::to_string(w) + "." + std::to_string(i),
                                           static_cast<std::size_t>((i * 977 + w) % 9000)));
      });
    for (auto& t : ws) t.join();
    done = true;
    for (auto& t : readers) t.join();
    CHECK(bad.load() == 0);
    CHECK(reads.load() > 0);
  }
  SUBCASE("processes") {
    std::vector<holdfast_test::child> kids;
    for (int w = 0; w < writers; ++w)
      kids.emplace_back([&, w] {
        for (int i = 0; i < total / writers; ++i)
          pub.publish(target, make_version("p" + std::to_string(w) + "." + std::to_string(i),
                                           static_cast<std::size_t>((i * 977 + w) % 9000)));
      });
    const std::string stop = dir / "stop";
    std::vector<holdfast_test::child> readers;
    for (int r = 0; r < 2; ++r)
      readers.emplace_back([&] {
        long n = 0;
        struct stat st {};
        for (; ::stat(stop.c_str(), &st) != 0 && n < 10000000; ++n) {
          auto fd = holdfast::open_file(target, O_RDONLY);
          CHILD_REQUIRE(is_complete_version(holdfast::read_all(fd)));
        }
        CHILD_REQUIRE(n > 0);
      });
    for (auto& k : kids) {
      auto r = k.wait(120s);
      CHECK_MESSAGE(r.ok(), r.failures);
    }
    pub.publish(stop, "stop");
    for (auto& k : readers) {
      auto r = k.wait(60s);
      CHECK_MESSAGE(r.ok(), r.failures);
    }
    CHECK(is_complete_version(slurp(target)));
  }
  CHECK(temps_in(dir.path()).empty());
}

TEST_CASE("publish_once among 8 forked processes: exactly one wins") {
  holdfast_test::temp_dir dir("once");
  const int rounds = sanitized ? 5 : 20;
  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    const std::string target = dir / ("lock." + std::to_string(round));
    int gate[2];
    REQUIRE(::pipe(gate) == 0);
    std::vector<holdfast_test::child> kids;
    for (int i = 0; i < 8; ++i)
      kids.emplace_back([&, i] {
        ::close(gate[1]);
        char c;
        (void)!::read(gate[0], &c, 1);  // all start when the parent closes the gate
        bool won =
            round % 2
                ? holdfast::basic_publisher<holdfast::no_sync, no_renameat2_io>().publish_once(
                      target, std::to_string(i))
                : holdfast::publisher().publish_once(target, std::to_string(i));
        ::_exit(won ? 0 : 3);
      });
    ::close(gate[0]);
    ::close(gate[1]);
    int winners = 0, winner = -1;
    for (int i = 0; i < 8; ++i) {
      auto r = kids[static_cast<std::size_t>(i)].wait(30s);
      CHECK((r.exit_code == 0 || r.exit_code == 3));
      if (r.exit_code == 0) ++winners, winner = i;
    }
    CHECK(winners == 1);
    CHECK(slurp(target) == std::to_string(winner));
  }
  CHECK(temps_in(dir.path()).empty());
}

TEST_CASE("writers killed with SIGKILL at random points: target absent or whole, sweep cleans") {
  holdfast_test::temp_dir dir("kill");
  const std::string target = dir / "ckpt";
  write_plain(dir / "keep.txt", "not a temp");
  write_plain(dir / ".holdfast-tmp.not-a-real-temp", "does not match the pattern");
  std::mt19937 rng(12345);
  const int runs = sanitized ? 40 : 200;
  int present = 0;
  // Sanitizers slow the child down ~10x: widen the window of kill points to match.
  const unsigned window_us = sanitized ? 30000 : 3000;
  for (int run = 0; run < runs; ++run) {
    CAPTURE(run);
    // run % 3 == 0: from no target, killed anywhere from the first publish on (absent or whole)
    // run % 3 == 1: killed after the first publish completed (must be present and whole)
    // run % 3 == 2: over the previous run's version, durable
    const int kind = run % 3;
    if (kind == 0) ::unlink(target.c_str());
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    holdfast_test::child writer([&] {
      ::close(ready[0]);
      if (kind != 1) (void)!::write(ready[1], "r", 1);
      auto loop = [&](const auto& pub) {
        for (int i = 0;; ++i) {
          pub.publish(target, make_version(std::to_string(run) + "." + std::to_string(i),
                                           static_cast<std::size_t>(50000 + i * 4099 % 150000)));
          if (kind == 1 && i == 0) (void)!::write(ready[1], "r", 1);
        }
      };
      // over an old version, durable: killed between the exchange and the unlink of the old
      // version leaves that version as a temp
      if (kind == 2) loop(holdfast::basic_publisher<holdfast::durable>());
      loop(holdfast::basic_publisher<holdfast::data_only>());
    });
    ::close(ready[1]);
    char c;
    CHECK(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % window_us));  // random point
    writer.kill(SIGKILL);
    auto r = writer.wait(10s);
    CHECK(r.term_signal == SIGKILL);
    if (kind == 1) CHECK(exists(target));
    if (exists(target)) {
      ++present;
      CHECK(is_complete_version(slurp(target)));
    }
  }
  const auto leftovers = temps_in(dir.path()).size();
  MESSAGE("runs with a target: " << present << ", temps left by killed writers: " << leftovers);
  CHECK(present > 0);
  // a recent leftover is younger than an hour: kept; with no threshold: removed
  CHECK(holdfast::sweep_stale_temps(dir.path(), std::chrono::hours(1)) == 0);
  CHECK(temps_in(dir.path()).size() == leftovers);
  CHECK(holdfast::sweep_stale_temps(dir.path(), 0ms) == leftovers);
  CHECK(temps_in(dir.path()).empty());
  CHECK(slurp(dir / "keep.txt") == "not a temp");
  CHECK(exists(dir / ".holdfast-tmp.not-a-real-temp"));
}

TEST_CASE("sweep_stale_temps: only the temp pattern, only older than the threshold") {
  holdfast_test::temp_dir dir("sweep");
  const std::string old_temp = dir / ".holdfast-tmp.4242.0123456789abcdef.model";
  write_plain(old_temp, "x");
  write_plain(dir / "model", "y");
  write_plain(dir / ".holdfast-tmp.4242.model", "z");  // no hex part: not ours
  make_dir(dir / ".holdfast-tmp.1.0123456789abcdef.dir");
  CHECK(holdfast::sweep_stale_temps(dir.path(), 300ms) == 0);  // too young
  std::this_thread::sleep_for(400ms);                          // let it age past the threshold
  const std::string young = dir / ".holdfast-tmp.4243.0123456789abcdef.model";
  write_plain(young, "w");
  CHECK(holdfast::sweep_stale_temps(dir.path(), 300ms) == 1);
  CHECK_FALSE(exists(old_temp));
  CHECK(exists(young));
  CHECK(exists(dir / "model"));
  CHECK(exists(dir / ".holdfast-tmp.4242.model"));
  CHECK(exists(dir / ".holdfast-tmp.1.0123456789abcdef.dir"));  // directories are never touched
  CHECK_THROWS_AS(holdfast::sweep_stale_temps(dir / "nope", 0ms), holdfast::error);
}

namespace {

// Checks that `pub` refuses to publish over the directory at `target` (EISDIR, naming it) and
// that a directory is still there; returns its lstat.
template <class P>
struct stat refused_over_directory(const P& pub, const std::string& target) {
  try {
    pub.publish(target, "a file");
    FAIL("published over a directory");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EISDIR);
    CHECK(e.path() == target);
  }
  struct stat st {};
  REQUIRE(::lstat(target.c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  return st;
}

template <class P>
void refuses_directory(const char* label) {
  CAPTURE(label);
  holdfast_test::temp_dir dir("pubdir");
  const std::string target = dir / "target";
  make_dir(target);
  write_plain(target + "/inside", "kept");
  struct stat before {};
  REQUIRE(::lstat(target.c_str(), &before) == 0);
  const P pub;
  const struct stat after = refused_over_directory(pub, target);
  CHECK(after.st_ino == before.st_ino);  // the same directory, never moved aside
  CHECK(slurp(target + "/inside") == "kept");
  CHECK(holdfast::detail::list_directory<holdfast::posix_io>(dir.path()) ==
        std::vector<std::string>{"target"});   // no temp, no directory under a temp name
  CHECK_FALSE(pub.publish_once(target, "x"));  // exists: not replaced
  CHECK(slurp(target + "/inside") == "kept");
}

// fault_io that makes a directory at the target right after publish's own check found none,
// as a concurrent process could: the exchange then meets a directory.
struct dir_appears_io : fault_io {
  static std::string& armed() {
    static std::string path;
    return path;
  }
  static int lstat(const char* p, struct stat* st) noexcept {
    int r = fault_io::lstat(p, st);
    if (r != 0 && !armed().empty() && armed() == p) {
      ::mkdir(p, 0755);
      armed().clear();
    }
    return r;
  }
};

}  // namespace

TEST_CASE("publish onto an existing directory: every policy refuses (EISDIR), the dir untouched") {
  refuses_directory<holdfast::basic_publisher<holdfast::durable>>("durable");
  refuses_directory<holdfast::basic_publisher<holdfast::durable_tolerate_einval>>(
      "durable_tolerate_einval");
  refuses_directory<holdfast::basic_publisher<holdfast::data_only>>("data_only");
  refuses_directory<holdfast::basic_publisher<holdfast::no_sync>>("no_sync");
  refuses_directory<holdfast::basic_publisher<holdfast::durable, no_renameat2_io>>(
      "durable, no renameat2");

  // A directory made between durable's check and its exchange: swapped back. (The other
  // policies make no check to race with: their rename itself refuses a directory, above.)
  holdfast_test::temp_dir dir("pubrace");
  const std::string target = dir / "late";
  auto race = [&](const auto& pub, const char* label) {
    CAPTURE(label);
    holdfast::detail::remove_tree<holdfast::posix_io>(target);
    dir_appears_io::armed() = target;
    refused_over_directory(pub, target);
    CHECK(holdfast::detail::list_directory<holdfast::posix_io>(dir.path()) ==
          std::vector<std::string>{"late"});
  };
  race(holdfast::basic_publisher<holdfast::durable, dir_appears_io>(), "durable");
  race(holdfast::basic_publisher<holdfast::durable_tolerate_einval, dir_appears_io>(),
       "durable_tolerate_einval");
}

TEST_CASE("a NUL in a target or staging path is refused (EINVAL), never cut short") {
  holdfast_test::temp_dir dir("nul");
  const holdfast::publisher pub;
  const std::string cut = dir / "a";
  const std::string with_nul = cut + std::string("\0.json", 6);
  for (int kind = 0; kind < 3; ++kind) {
    CAPTURE(kind);
    try {
      if (kind == 0) pub.publish(with_nul, "x");
      if (kind == 1) pub.publish_once(with_nul, "x");
      if (kind == 2) {
        make_dir(dir / "stage");
        pub.publish_directory(dir / "stage", with_nul);
      }
      FAIL("accepted");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EINVAL);
      CHECK(e.path() == cut + "\\x00.json");  // shown, not cut
    }
    CHECK_FALSE(exists(cut));
  }
  make_dir(dir / "stage2");
  CHECK_THROWS_AS(pub.publish_directory(dir / std::string("stage2\0x", 8), dir / "t"),
                  holdfast::error);
  CHECK_FALSE(exists(dir / "t"));
  CHECK(temps_in(dir.path()).empty());
}

namespace {
// posix_io that, right after a stat of a directory named "victim" succeeds, swaps it for a
// symlink to the directory `outside()`: what another process can do mid-removal.
struct swap_io : holdfast::posix_io {
  static std::string& outside() {
    static std::string p;
    return p;
  }
  static std::string& victim() {  // full path of the directory to swap once
    static std::string p;
    return p;
  }
  static void swap_now() {
    if (victim().empty()) return;
    std::string v = std::exchange(victim(), std::string());
    ::rename(v.c_str(), (outside() + ".moved").c_str());  // out of the tree
    ::symlink(outside().c_str(), v.c_str());
  }
  static int lstat(const char* p, struct stat* st) noexcept {
    int r = posix_io::lstat(p, st);
    if (r == 0 && victim() == p) swap_now();
    return r;
  }
  static int fstatat(int d, const char* p, struct stat* st, int f) noexcept {
    int r = posix_io::fstatat(d, p, st, f);
    if (r == 0 && std::string(p) == "victim") swap_now();
    return r;
  }
};
}  // namespace

TEST_CASE("tree removal unlinks a symlink swapped in mid-removal, never follows it") {
  holdfast_test::temp_dir dir("swap");
  for (bool top : {false, true}) {
    CAPTURE(top);
    // outside/: what must survive. tree/victim/: swapped for a symlink to outside/ after its
    // type was checked (the victim is the tree's root itself, or a directory inside it).
    holdfast::detail::remove_tree<holdfast::posix_io>(dir / "tree");
    make_dir(dir / "outside");
    write_plain(dir / "outside/precious", "keep me");
    make_dir(dir / "tree");
    write_plain(dir / "tree/a", "a");
    make_dir(dir / "tree/victim");
    write_plain(dir / "tree/victim/precious", "tree copy");
    swap_io::outside() = dir / "outside";
    swap_io::victim() = dir / "tree/victim";
    const std::string root = top ? dir / "tree/victim" : dir / "tree";
    try {
      holdfast::detail::remove_tree<swap_io>(root);
    } catch (const holdfast::error&) {  // whether it reports is secondary; what it removed is not
    }
    CHECK(swap_io::victim().empty());  // the swap happened
    CHECK(slurp(dir / "outside/precious") == "keep me");
    CHECK_FALSE(exists(dir / "tree/victim"));  // the symlink itself was unlinked
    if (!top) CHECK_FALSE(exists(dir / "tree"));
    CHECK(slurp(dir / "outside.moved/precious") == "tree copy");  // moved away: not ours
    holdfast::detail::remove_tree<holdfast::posix_io>(dir / "tree");
    holdfast::detail::remove_tree<holdfast::posix_io>(dir / "outside");
    holdfast::detail::remove_tree<holdfast::posix_io>(dir / "outside.moved");
  }
}

TEST_CASE("copy_to_local's copies never match the temp pattern: a sweep cannot take one in use") {
  holdfast_test::temp_dir dir("copysweep");
  make_dir(dir / "local");
  write_plain(dir / "shard.bin", "shard");
  auto copy = holdfast::copy_to_local(dir / "shard.bin", dir / "local");
  const std::string name = holdfast::detail::split_path(copy.path()).second;
  CHECK_FALSE(holdfast::is_temp_name(name));
  CHECK(name.rfind(std::string(holdfast::local_copy_prefix), 0) == 0);
  CHECK(holdfast::sweep_stale_temps(dir / "local", 0ms) == 0);
  CHECK(slurp(copy.path()) == "shard");
}
