// benchmarks/etcd.hpp — the binary's one plain etcd for the handler cases (handler_bench.cpp:
// notice -> saved over processes) and the scale cases on threads (scale_threads.hpp), so the
// binary starts one server for both instead of one each.
//
// Guarantees:
//   - etcd() starts one etcd on loopback (tests/support/etcd_server.hpp) on its first call and
//     returns the same one after; --list calls it never, so listing starts no server.
//   - Without etcd it prints one "# handler: no etcd (...)" line and returns null from then on;
//     the etcd cases then report 0 instead of failing the run.
// Caveats:
//   - Keys are never removed: each case writes under a namespace of its own (bench::next_id,
//     bench::scale::next_run). The kv cases (kv_bench.cpp) keep their own fresh etcd, and a TLS
//     one, so their latency rows never read a store the other cases filled.
#pragma once

#include <cstdio>
#include <exception>
#include <memory>

#include "../tests/support/etcd_server.hpp"

namespace bench {

/// The binary's etcd, started on first use; null (after one "# handler" line) without one.
inline holdfast_test::etcd_server* etcd() {
  static std::unique_ptr<holdfast_test::etcd_server> s = [] {
    try {
      return std::make_unique<holdfast_test::etcd_server>();
    } catch (const std::exception& e) {
      std::printf("# handler: no etcd (%s): etcd cases report 0\n", e.what());
      return std::unique_ptr<holdfast_test::etcd_server>();
    }
  }();
  return s.get();
}

}  // namespace bench
