// tour_io — docs/architecture.md's tour of the Io policy (built and run by CTest, checked
// against the page): fault_io fails the first fsync, and the error names the call and the path.
#include <fcntl.h>
#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <holdfast/io.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <string>

int main() {
  char tmpl[] = "/tmp/holdfast-tour-io-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string path = dir + "/out.bin";
  const char data[] = "weights";
  const std::size_t size = sizeof data;
  bool thrown = false;
  {
    // [snippet]
    using namespace holdfast::testing;

    fault_plan::arm(fault{io_op::fsync, /*nth=*/1, EIO});
    auto fd = holdfast::open_file<fault_io>(path, O_CREAT | O_WRONLY, 0644);
    holdfast::write_all(fd, data, size);  // short writes and EINTR are finished and retried
    try {
      holdfast::sync_file(
          fd);  // throws holdfast::error: fsync '/tmp/…/out.bin': Input/output error
    } catch (const holdfast::error& e) {
      std::printf("%s\n", e.what());
      thrown = e.code().value() == EIO;
    }
    // [/snippet]
    fault_plan::disarm();
  }
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
  return thrown ? 0 : 1;
}
