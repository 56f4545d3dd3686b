// tests/support/temp_dir.hpp — a scratch directory removed with everything in it at scope exit.
#pragma once

#include <stdlib.h>  // mkdtemp
#include <unistd.h>  // access, getpid, usleep

#include <cstdio>  // fprintf: what the removal left
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <system_error>

namespace holdfast_test {

/// mkdtemp under $TMPDIR (or /tmp); removed recursively by the process that created it.
class temp_dir {
 public:
  explicit temp_dir(const std::string& tag = "t") : temp_dir(tag, {tmp_base()}) {}
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  /// Removes the directory; a writer still at work inside (a thread the test did not join)
  /// can make one pass fail, so it tries a few times over ~0.5 s, then names what it left on
  /// stderr (tests/run fails a run that leaves anything in its TMPDIR).
  ~temp_dir() {
    if (::getpid() != owner_) return;  // a forked child never removes the parent's directory
    std::error_code ec;
    for (int attempt = 0; attempt < 10; ++attempt) {
      if (attempt > 0) ::usleep(50 * 1000);
      ec.clear();
      std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, ec);
      std::filesystem::remove_all(path_, ec);
      if (!ec && !std::filesystem::exists(path_, ec)) return;
    }
    std::fprintf(stderr, "temp_dir: could not remove %s: %s\n", path_.c_str(),
                 ec ? ec.message().c_str() : "still there");
  }
  const std::string& path() const { return path_; }
  /// path() + "/" + name
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 protected:
  /// mkdtemp under the first of `bases` that is writable and where mkdtemp succeeds.
  temp_dir(const std::string& tag, std::initializer_list<std::string> bases) {
    std::string tried;
    for (const std::string& base : bases) {
      std::string tmpl = base + "/holdfast-" + tag + "-XXXXXX";
      if (::access(base.c_str(), W_OK) == 0 && ::mkdtemp(tmpl.data())) {
        path_ = tmpl;
        break;
      }
      tried += (tried.empty() ? "" : ", ") + tmpl;
    }
    if (path_.empty()) throw std::runtime_error("mkdtemp failed for " + tried);
    owner_ = ::getpid();
  }
  /// $TMPDIR, or /tmp where it is unset or empty.
  static std::string tmp_base() {
    const char* base = std::getenv("TMPDIR");
    return base && *base ? base : "/tmp";
  }

 private:
  std::string path_;
  pid_t owner_;
};

}  // namespace holdfast_test
