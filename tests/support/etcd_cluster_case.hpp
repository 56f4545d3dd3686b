// tests/support/etcd_cluster_case.hpp — what the test cases on a 3-member etcd cluster share
// (etcd_cluster_test, etcd_watch_cluster_test, handler_cluster_test): the binary's one cluster,
// a fresh key namespace per case, a member frozen for a scope, and a call retried over an
// election.
//
// Guarantees:
//   - shared_cluster() starts the 3 members once per test binary (about a second; each case
//     starting its own would cost that every time) and tears them down at exit.
//   - fresh_cluster_ns(name) never returns a namespace twice in a binary: reruns of a case and
//     earlier cases never see each other's keys.
//   - frozen_member thaws its member at scope exit even when a check threw, then waits until the
//     cluster is healthy again, so the next case starts on a whole cluster; a cluster that does
//     not recover within 30 s fails the case (FAIL_CHECK) instead of hanging it.
//   - with_retries(op) repeats `op` only on transient errors (holdfast::is_transient_kv_error),
//     for at most 10 s; any other error, or a transient one after that, is thrown.
// Caveats:
//   - A retried write may have been applied by the failed attempt: a caller whose write is not
//     idempotent (insert) must read the key back before trying again.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <holdfast/kv.hpp>  // kv_namespace, is_transient_kv_error
#include <string>
#include <thread>

#include "etcd_cluster.hpp"

namespace holdfast_test {

/// The binary's one 3-member cluster, started on first use.
inline etcd_cluster& shared_cluster() {
  static etcd_cluster cluster(3);
  return cluster;
}

/// A namespace `name`/<n> not used before in this binary.
inline holdfast::kv_namespace fresh_cluster_ns(const std::string& name) {
  static std::uint64_t n = 0;
  return holdfast::kv_namespace(name, ++n);
}

/// Freezes a member of shared_cluster() (SIGSTOP) for a scope; thawed by thaw() or at scope
/// exit, after which the cluster is healthy again.
class frozen_member {
 public:
  explicit frozen_member(int member) : member_(member) { shared_cluster().freeze(member); }
  frozen_member(const frozen_member&) = delete;
  frozen_member& operator=(const frozen_member&) = delete;
  ~frozen_member() {
    try {
      thaw();
    } catch (const std::exception& e) {
      FAIL_CHECK(e.what());  // the cluster did not recover: later cases will fail too
    }
  }
  /// Thaws the member now and waits (up to 30 s) for a healthy cluster.
  void thaw() {
    if (member_ < 0) return;
    shared_cluster().thaw(member_);
    member_ = -1;
    shared_cluster().wait_healthy(std::chrono::seconds(30));
  }

 private:
  int member_;
};

/// Calls `op` until it returns without a transient error, at most until 10 s have passed.
template <class Op>
auto with_retries(Op op) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    try {
      return op();
    } catch (const std::exception& e) {
      if (!holdfast::is_transient_kv_error(e) || std::chrono::steady_clock::now() > give_up) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace holdfast_test
