// tests/support/fs_kv_fixture.hpp — a filesystem_kv over a fresh temp directory, as a doctest
// fixture (TEST_CASE_FIXTURE): the case's body sees `tmp` and `kv`.
//
// Guarantees:
//   - Each case gets its own directory (support/temp_dir.hpp), removed with everything in it
//     after the case, and `kv` in namespace run/0 on it: what most cases of one store's tests
//     would otherwise write as their first two lines.
//   - Kv may be any basic_filesystem_kv (network_filesystem_kv, one over fault_io): the fixture
//     only constructs it.
// Caveats:
//   - `kv` is made before the case's body runs: a case that must arm a fault or change the
//     environment before the store exists writes its own set-up instead.
#pragma once

#include <holdfast/kv/filesystem.hpp>

#include "temp_dir.hpp"

namespace holdfast_test {

/// A temp directory `tmp` and a store `kv` (namespace run/0) on it.
template <class Kv = holdfast::filesystem_kv>
struct fs_kv_fixture {
  temp_dir tmp{"fsw"};
  Kv kv{tmp.path(), holdfast::kv_namespace("run", "0")};
};

}  // namespace holdfast_test
