// tests/support/c10d_like_kv.hpp — a store with only the operations PyTorch's c10d store has
// (compareSet as insert, set, check + get, wait, deleteKey as erase): no list, no prefix erase.
// The handler must agree over it, and clean up after itself; any_kv must report what it lacks.
#pragma once

#include <chrono>
#include <holdfast/kv/in_process.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace holdfast_test {

/// in_process_kv seen through c10d's four operations.
struct c10d_like_kv {
  holdfast::in_process_kv inner;
  bool insert(const std::string& k, std::string_view v) { return inner.insert(k, v); }
  void put(const std::string& k, std::string_view v) { inner.put(k, v); }
  std::optional<std::string> try_get(const std::string& k) { return inner.try_get(k); }
  std::optional<std::string> get(const std::string& k, std::chrono::milliseconds t) {
    return inner.get(k, t);
  }
  bool erase(const std::string& k) { return inner.erase(k); }
};

}  // namespace holdfast_test
