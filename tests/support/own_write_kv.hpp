// tests/support/own_write_kv.hpp — a store that hides the outcome of a writer's own insert, as
// etcd can: the first insert into a key whose name ends with a given suffix (the claim) is
// applied but answered `false` (a txn applied, its connection lost, the request resent), or it
// times out unapplied and commits late, just before the retry's insert (a frozen member that
// resumes after the retry's read saw nothing), so that insert answers `false` too.
//
// Guarantees:
//   - Copies share the store and the fault: it fires once in all (fired() counts it), on the
//     first insert into a matching key; every other call goes straight to the wrapped store.
//   - lost_answer: the insert is applied, then `false` is returned. late_commit: the insert
//     throws ETIMEDOUT (transient) without applying; the next insert into that key first
//     applies the held write, then runs (so it answers `false` for the writer's own value).
// Caveats:
//   - No watch: a handler over it polls at its watch interval.
#pragma once

#include <cerrno>
#include <chrono>
#include <holdfast/error.hpp>
#include <holdfast/kv.hpp>  // kv_pairs
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace holdfast_test {

/// How the wrapped store hides the insert's outcome (see the top of this file).
enum class own_write_fault { lost_answer, late_commit };

/// `Kv` (in_process_kv) with one insert whose answer is `false` for the writer's own value.
template <class Kv>
class own_write_kv {
  struct state {
    std::mutex mutex;
    int fired = 0;
    std::optional<std::pair<std::string, std::string>> held;  // a late commit, not applied yet
  };

 public:
  /// Fires `fault` on the first insert into a key ending with `suffix`.
  own_write_kv(Kv inner, own_write_fault fault, std::string suffix)
      : inner_(std::move(inner)), fault_(fault), suffix_(std::move(suffix)) {}

  /// How many times the fault fired (0 or 1).
  int fired() const {
    std::lock_guard<std::mutex> lock(s_->mutex);
    return s_->fired;
  }
  /// The wrapped store.
  Kv& inner() { return inner_; }

  bool insert(const std::string& key, std::string_view value) {
    std::unique_lock<std::mutex> lock(s_->mutex);
    if (s_->held && s_->held->first == key) {  // the timed-out attempt commits now
      inner_.insert(key, s_->held->second);
      s_->held.reset();
    }
    if (s_->fired == 0 && ends_with(key, suffix_)) {
      ++s_->fired;
      if (fault_ == own_write_fault::late_commit) {
        s_->held.emplace(key, std::string(value));
        throw holdfast::error(ETIMEDOUT, "kv insert", key, "timed out (it will commit late)");
      }
      inner_.insert(key, value);
      return false;  // applied, but the answer says another writer was first
    }
    lock.unlock();
    return inner_.insert(key, value);
  }
  void put(const std::string& key, std::string_view value) { inner_.put(key, value); }
  std::optional<std::string> try_get(const std::string& key) { return inner_.try_get(key); }
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) {
    return inner_.get(key, timeout);
  }
  holdfast::kv_pairs list(const std::string& prefix) { return inner_.list(prefix); }
  bool erase(const std::string& key) { return inner_.erase(key); }
  std::size_t erase_prefix(const std::string& prefix) { return inner_.erase_prefix(prefix); }

 private:
  static bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  }

  Kv inner_;
  own_write_fault fault_;
  std::string suffix_;
  std::shared_ptr<state> s_ = std::make_shared<state>();
};

}  // namespace holdfast_test
