// tests/support/shm_temp_dir.hpp — a scratch directory on tmpfs (/dev/shm) when there is one.
//
// For tests that repeat a durable protocol hundreds of times to fail or kill it at every system
// call: they check what the protocol leaves behind after a failure or a SIGKILL (the page cache
// is the same on tmpfs), not power-loss durability, and on tmpfs fsync costs nothing, which keeps
// them inside the suite's time budget. Falls back to $TMPDIR (or /tmp) where /dev/shm is missing
// or not writable.
#pragma once

#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace holdfast_test {

/// mkdtemp under /dev/shm (or $TMPDIR, /tmp); removed recursively by the process that made it.
class shm_temp_dir {
 public:
  explicit shm_temp_dir(const std::string& tag = "t") {
    const char* env = std::getenv("TMPDIR");
    for (std::string base : {std::string("/dev/shm"), std::string(env && *env ? env : "/tmp")}) {
      std::string tmpl = base + "/holdfast-" + tag + "-XXXXXX";
      if (::access(base.c_str(), W_OK) == 0 && ::mkdtemp(tmpl.data())) {
        path_ = tmpl;
        break;
      }
    }
    if (path_.empty()) throw std::runtime_error("shm_temp_dir: mkdtemp failed");
    owner_ = ::getpid();
  }
  shm_temp_dir(const shm_temp_dir&) = delete;
  shm_temp_dir& operator=(const shm_temp_dir&) = delete;
  ~shm_temp_dir() {
    if (::getpid() != owner_) return;  // a forked child never removes the parent's directory
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  /// path() + "/" + name
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  pid_t owner_;
};

}  // namespace holdfast_test
