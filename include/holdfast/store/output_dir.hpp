// holdfast/store/output_dir.hpp — basic_output_dir, the local directory a run writes its output
// into: the run directory itself (local stores) or a scratch directory that is removed with
// everything in it when the object dies (stores on a mount, mirrored by sync()).
//
// Guarantees:
//   - A scratch directory is removed once, by the object that holds it last (moves hand it on);
//     the removal never follows a symlink (store_remove_tree).
//   - The destructor never throws: a failed removal is left behind.
// Caveats:
//   - Files written to a scratch directory reach the store only through sync().
#pragma once

#include <string>
#include <utility>  // exchange: moves hand the scratch directory on

#include "../io.hpp"       // posix_io: the default syscalls
#include "fs_helpers.hpp"  // detail::store_remove_tree

HOLDFAST_NAMESPACE_BEGIN

/// A local output directory for a run; a scratch one is removed with everything in it when this
/// object is destroyed.
template <class Io = posix_io>
class basic_output_dir {
 public:
  basic_output_dir() = default;
  basic_output_dir(std::string path, bool scratch) : path_(std::move(path)), scratch_(scratch) {}
  basic_output_dir(basic_output_dir&& o) noexcept
      : path_(std::move(o.path_)), scratch_(std::exchange(o.scratch_, false)) {}
  basic_output_dir& operator=(basic_output_dir&& o) noexcept {
    if (this != &o) {
      cleanup();
      path_ = std::move(o.path_);
      scratch_ = std::exchange(o.scratch_, false);
    }
    return *this;
  }
  basic_output_dir(const basic_output_dir&) = delete;
  basic_output_dir& operator=(const basic_output_dir&) = delete;
  ~basic_output_dir() { cleanup(); }

  /// The directory to write into.
  const std::string& path() const noexcept { return path_; }
  /// True when it is a scratch directory (removed on destruction) rather than the run directory.
  bool is_scratch() const noexcept { return scratch_; }

 private:
  void cleanup() noexcept {
    if (!scratch_) return;
    scratch_ = false;
    try {
      detail::store_remove_tree<Io>(path_);
    } catch (...) {  // best effort: a destructor must not throw
    }
  }
  std::string path_;
  bool scratch_ = false;
};

HOLDFAST_NAMESPACE_END
