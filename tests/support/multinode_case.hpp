// tests/support/multinode_case.hpp — what the multi-node suites share: a harness per case that
// FAILS where namespaces cannot be made and CI=true, and says it skipped elsewhere.
#pragma once

#include <doctest/doctest.h>

#include <optional>
#include <utility>

#include "multinode.hpp"

namespace holdfast_test {

/// Runs `body(multinode&)` on a harness of `nodes` nodes; where namespaces are unavailable,
/// FAILs when CI=true and prints why it skipped elsewhere.
template <class F>
void with_multinode(int nodes, F&& body) {
  std::optional<multinode> mn;
  try {
    mn.emplace(nodes);
  } catch (const multinode_unavailable& e) {
    if (multinode_required()) FAIL(e.what());
    MESSAGE("skipped: " << e.what());
    return;
  }
  std::forward<F>(body)(*mn);
}

}  // namespace holdfast_test
