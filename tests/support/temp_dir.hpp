// tests/support/temp_dir.hpp — a scratch directory removed with everything in it at scope exit.
#pragma once

#include <stdlib.h>  // mkdtemp

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace holdfast_test {

/// mkdtemp under $TMPDIR (or /tmp); removed recursively by the process that created it.
class temp_dir {
 public:
  explicit temp_dir(const std::string& tag = "t") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/holdfast-" + tag + "-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
    owner_ = ::getpid();
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    if (::getpid() != owner_) return;  // a forked child never removes the parent's directory
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
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
