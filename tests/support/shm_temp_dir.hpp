// tests/support/shm_temp_dir.hpp — a scratch directory on tmpfs (/dev/shm) when there is one.
//
// For tests that repeat a durable protocol hundreds of times to fail or kill it at every system
// call: they check what the protocol leaves behind after a failure or a SIGKILL (the page cache
// is the same on tmpfs), not power-loss durability, and on tmpfs fsync costs nothing, which keeps
// them inside the suite's time budget. Falls back to $TMPDIR (or /tmp) where /dev/shm is missing
// or not writable. Otherwise a temp_dir: removed with everything in it by the process that made
// it.
#pragma once

#include <string>

#include "temp_dir.hpp"

namespace holdfast_test {

/// mkdtemp under /dev/shm (or $TMPDIR, /tmp); removed recursively by the process that made it.
class shm_temp_dir : public temp_dir {
 public:
  explicit shm_temp_dir(const std::string& tag = "t") : temp_dir(tag, {"/dev/shm", tmp_base()}) {}
};

}  // namespace holdfast_test
