// The POSIX layer: descriptors, full transfers, syncs, and every injected failure surfacing as
// holdfast::error with the right errno, operation and path (or retried where it should be).
#include <doctest/doctest.h>
#include <fcntl.h>

#include <holdfast/io.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <string>

#include "support/expect_error.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/temp_dir.hpp"

using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using holdfast_test::disarm_on_exit;
using fd_t = holdfast::basic_fd<fault_io>;

namespace {

std::string slurp(const std::string& path) {
  auto fd = holdfast::open_file(path, O_RDONLY);
  return holdfast::read_all(fd);
}

// Runs `op` with `f` armed; returns the holdfast::error it threw (fails the test if none).
template <class Op>
holdfast::error expect_error(const fault& f, Op op) {
  disarm_on_exit guard;
  fault_plan::arm(f);
  return holdfast_test::error_from(op);
}

}  // namespace

TEST_CASE("error carries operation, path and errno, and reads well") {
  holdfast::error e(EIO, "fsync", "/ckpt/step-10");
  CHECK(e.errnum() == EIO);
  CHECK(e.code() == std::errc::io_error);
  CHECK(e.operation() == "fsync");
  CHECK(e.path() == "/ckpt/step-10");
  CHECK(std::string(e.what()).find("fsync '/ckpt/step-10'") == 0);
  CHECK(std::string(e.what()).find("Input/output error") != std::string::npos);

  holdfast::format_error fe("flags.txt", "line 3: expected --key=value");
  CHECK(fe.errnum() == EINVAL);
  CHECK(std::string(fe.what()).find("flags.txt") != std::string::npos);
  CHECK(std::string(fe.what()).find("line 3") != std::string::npos);

  holdfast::corrupt_cache cc("cache.bin", 7, "entry points past end of file");
  CHECK(cc.slot() == 7);
  CHECK(std::string(cc.what()).find("slot 7") != std::string::npos);

  holdfast::agreement_timeout at("acks", {1, 3});
  CHECK(at.missing_tasks() == std::vector<int>{1, 3});
  CHECK(std::string(at.what()).find("1,3") != std::string::npos);

  holdfast::peer_error pe(2, "std::runtime_error", "nan loss");
  CHECK(pe.origin_task() == 2);
  CHECK(std::string(pe.what()).find("nan loss") != std::string::npos);
  const holdfast::error& base = pe;  // one catch clause sees every holdfast failure
  CHECK(base.errnum() == ECANCELED);
}

TEST_CASE("basic_fd owns, moves, releases and reports close errors") {
  holdfast_test::temp_dir dir("io");
  auto fd = holdfast::open_file(dir / "a", O_CREAT | O_RDWR, 0600);
  CHECK(fd);
  CHECK(fd.path() == dir / "a");
  CHECK((::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC) != 0);  // O_CLOEXEC always

  int raw = fd.get();
  holdfast::unique_fd moved = std::move(fd);
  CHECK_FALSE(fd);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  CHECK(moved.get() == raw);
  moved.close();
  CHECK_FALSE(moved);
  CHECK(::fcntl(raw, F_GETFD) == -1);

  auto e = expect_error(fault{io_op::close, 1, EIO}, [&] {
    auto f = fd_t(fault_io::open((dir / "a").c_str(), O_RDONLY | O_CLOEXEC, 0), dir / "a");
    f.close();
  });
  CHECK(e.errnum() == EIO);
  CHECK(e.operation() == "close");
  CHECK(e.path() == dir / "a");
}

TEST_CASE("open_file names the path, open_file_if_exists treats ENOENT as a value") {
  holdfast_test::temp_dir dir("io");
  try {
    holdfast::open_file(dir / "missing", O_RDONLY);
    FAIL("expected an error");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == ENOENT);
    CHECK(e.operation() == "open");
    CHECK(e.path() == dir / "missing");
  }
  CHECK_FALSE(holdfast::open_file_if_exists(dir / "missing", O_RDONLY));

  disarm_on_exit guard;
  fault_plan::arm(fault{io_op::open, 1, EINTR});
  auto fd = holdfast::open_file<fault_io>(dir / "b", O_CREAT | O_WRONLY, 0600);
  CHECK(fd);
  CHECK(fault_plan::failures() == 1);  // EINTR was injected and retried
}

TEST_CASE("write_all: EINTR and short writes are retried, ENOSPC surfaces") {
  holdfast_test::temp_dir dir("io");
  const std::string data(100000, 'q');

  SUBCASE("EINTR is retried") {
    disarm_on_exit guard;
    fault_plan::arm(fault{io_op::write, 1, EINTR, 0, 3});
    auto fd = holdfast::open_file<fault_io>(dir / "w", O_CREAT | O_WRONLY, 0600);
    holdfast::write_all(fd, data.data(), data.size());
    fd.close();
    CHECK(fault_plan::failures() == 3);
    CHECK(slurp(dir / "w") == data);
  }
  SUBCASE("short writes are finished") {
    disarm_on_exit guard;
    fault_plan::arm(fault{io_op::write, 1, 0, 7, 5});
    auto fd = holdfast::open_file<fault_io>(dir / "w", O_CREAT | O_WRONLY, 0600);
    holdfast::write_all(fd, data.data(), data.size());
    fd.close();
    CHECK(fault_plan::failures() == 5);
    CHECK(fault_plan::calls(io_op::write) == 6);  // 5 short writes of 7 bytes, then the rest
    CHECK(slurp(dir / "w") == data);
  }
  SUBCASE("ENOSPC surfaces with operation and path") {
    auto fd = holdfast::open_file<fault_io>(dir / "w", O_CREAT | O_WRONLY, 0600);
    auto e = expect_error(fault{io_op::write, 1, ENOSPC},
                          [&] { holdfast::write_all(fd, data.data(), data.size()); });
    CHECK(e.errnum() == ENOSPC);
    CHECK(e.operation() == "write");
    CHECK(e.path() == dir / "w");
  }
}

TEST_CASE("pwrite_all and pread_full: offsets survive short transfers and EINTR") {
  holdfast_test::temp_dir dir("io");
  std::string data;
  for (int i = 0; i < 5000; ++i) data += static_cast<char>('a' + i % 26);
  auto fd = holdfast::open_file<fault_io>(dir / "p", O_CREAT | O_RDWR, 0600);
  {
    disarm_on_exit guard;
    fault_plan::arm(fault{io_op::pwrite, 1, 0, 100, 4});
    holdfast::pwrite_all(fd, data.data(), data.size(), 10);
    CHECK(fault_plan::failures() == 4);
  }
  std::string back(data.size(), '\0');
  {
    disarm_on_exit guard;
    fault_plan::arm(fault{io_op::pread, 1, EINTR});
    CHECK(holdfast::pread_full(fd, back.data(), back.size(), 10) == data.size());
    CHECK(back == data);
  }
  {
    disarm_on_exit guard;
    fault_plan::arm(fault{io_op::pread, 1, 0, 33, 10});
    CHECK(holdfast::pread_full(fd, back.data(), back.size(), 10) == data.size());
    CHECK(back == data);
  }
  // Reading past the end returns what there is.
  CHECK(holdfast::pread_full(fd, back.data(), back.size(), 5000) == 10);

  auto e = expect_error(fault{io_op::pread, 1, EIO},
                        [&] { holdfast::pread_full(fd, back.data(), back.size(), 0); });
  CHECK(e.errnum() == EIO);
  CHECK(e.operation() == "pread");
  auto w = expect_error(fault{io_op::pwrite, 1, ENOSPC},
                        [&] { holdfast::pwrite_all(fd, data.data(), data.size(), 0); });
  CHECK(w.errnum() == ENOSPC);
  CHECK(w.operation() == "pwrite");
  CHECK(w.path() == dir / "p");
}

TEST_CASE("read_full and read_all retry EINTR and short reads, and stop at end of file") {
  holdfast_test::temp_dir dir("io");
  std::string data(200000, 'r');
  {
    auto fd = holdfast::open_file(dir / "r", O_CREAT | O_WRONLY, 0600);
    holdfast::write_all(fd, data.data(), data.size());
  }
  disarm_on_exit guard;
  fault_plan::arm(fault{io_op::read, 1, EINTR, 0, 2});
  auto fd = holdfast::open_file<fault_io>(dir / "r", O_RDONLY);
  CHECK(holdfast::read_all(fd) == data);
  CHECK(fault_plan::failures() == 2);

  fault_plan::arm(fault{io_op::read, 1, 0, 1000, 3});
  auto fd2 = holdfast::open_file<fault_io>(dir / "r", O_RDONLY);
  std::string part(5000, '\0');
  CHECK(holdfast::read_full(fd2, part.data(), part.size()) == 5000);
  CHECK(part == data.substr(0, 5000));

  auto e = expect_error(fault{io_op::read, 1, EIO}, [&] { holdfast::read_all(fd2); });
  CHECK(e.errnum() == EIO);
  CHECK(e.operation() == "read");
  CHECK(e.path() == dir / "r");
}

TEST_CASE("fsync and fdatasync: EIO surfaces, EINTR is retried") {
  holdfast_test::temp_dir dir("io");
  auto fd = holdfast::open_file<fault_io>(dir / "s", O_CREAT | O_WRONLY, 0600);

  auto e = expect_error(fault{io_op::fsync, 1, EIO}, [&] { holdfast::sync_file(fd); });
  CHECK(e.errnum() == EIO);
  CHECK(e.operation() == "fsync");
  CHECK(e.path() == dir / "s");

  auto d = expect_error(fault{io_op::fdatasync, 1, EIO}, [&] { holdfast::datasync_file(fd); });
  CHECK(d.operation() == "fdatasync");

  disarm_on_exit guard;
  fault_plan::arm(fault{io_op::fsync, 1, EINTR, 0, 2});
  holdfast::sync_file(fd);
  CHECK(fault_plan::failures() == 2);
  fault_plan::arm(fault{io_op::fdatasync, 1, EINTR});
  holdfast::datasync_file(fd);
  CHECK(fault_plan::failures() == 1);
}

TEST_CASE("sync_directory syncs and reports the directory on failure") {
  holdfast_test::temp_dir dir("io");
  holdfast::sync_directory(dir.path());
  auto e = expect_error(fault{io_op::fsync, 1, EINVAL},
                        [&] { holdfast::sync_directory<fault_io>(dir.path()); });
  CHECK(e.errnum() == EINVAL);
  CHECK(e.operation() == "fsync");
  CHECK(e.path() == dir.path());
  CHECK_THROWS_AS(holdfast::sync_directory(dir / "nope"), holdfast::error);
}

TEST_CASE("fault_plan counts calls and fails exactly the chosen one") {
  holdfast_test::temp_dir dir("io");
  disarm_on_exit guard;
  fault_plan::reset_counts();
  auto fd = holdfast::open_file<fault_io>(dir / "c", O_CREAT | O_RDWR, 0600);
  holdfast::sync_file(fd);
  fd.close();
  CHECK(fault_plan::calls(io_op::open) == 1);
  CHECK(fault_plan::calls(io_op::fsync) == 1);
  CHECK(fault_plan::calls(io_op::close) == 1);
  CHECK(fault_plan::calls(io_op::any) == 3);
  CHECK(fault_plan::failures() == 0);

  // Fail the 2nd call of any kind: the fsync.
  fault_plan::arm(fault{io_op::any, 2, EIO});
  auto fd2 = holdfast::open_file<fault_io>(dir / "c", O_RDWR);
  CHECK_THROWS_AS(holdfast::sync_file(fd2), holdfast::error);
  CHECK(fault_plan::last_failed() == io_op::fsync);
  CHECK(std::string(holdfast::testing::to_string(io_op::fsync)) == "fsync");
}

namespace {
struct not_io {
  static int open(const char*, int, mode_t) { return -1; }
};
}  // namespace

TEST_CASE("the Io policy trait accepts posix_io and fault_io and rejects others") {
  CHECK(holdfast::is_io_policy_v<holdfast::posix_io>);
  CHECK(holdfast::is_io_policy_v<fault_io>);
  CHECK_FALSE(holdfast::is_io_policy_v<not_io>);
  CHECK_FALSE(holdfast::is_io_policy_v<int>);
}
