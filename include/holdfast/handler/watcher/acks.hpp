// holdfast/handler/watcher/acks.hpp — how the claimant reads the acks of its round, chosen once
// at construction (ack_reads_): in batches where the store has a native get_many, or can list
// but cannot be waited on; else one by one, which protocol.hpp does (through the ack watch of
// watches.hpp where the store is evented, else with blocking gets). It also holds what every
// key wait shares: one look's result (key_look) and the wait's retry deadline.
//
// Guarantees:
//   - The claimant collects the acks in get_many batches where the store has a native one, or,
//     over a store that can list but has neither a watch nor get_many, with one list of the
//     round's acks per look (and a blocking get of the awaited ack when the list lacked it):
//     O(1) requests while the acks are there already, not one round trip per task.
//   - What a batch read serves the round's later waits; an ack not read by a batch that ended at
//     or past the deadline is missing, as a blocking get's would be.
//   - A batch's store calls are retried while they fail transiently, until the wait's retry
//     deadline (wait_retry_until_, set by the protocol step).
// Caveats:
//   - A stop during the collection waits for the current slice (up to max(watch_interval, 1 s)).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../kv.hpp"  // get_many: one wait for many keys, the store's own where it has one
#include "../../version.hpp"
#include "periodic_saves.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// agreement_watcher's batched reads of the claimant's acks, on the parts below.
template <class Config, class Kv, class Clock, class Hang>
class watcher_acks : public watcher_periodic<Config, Kv, Clock, Hang> {
  using below = watcher_periodic<Config, Kv, Clock, Hang>;

 protected:
  using below::below;

  // What this part uses of the state (state.hpp).
  using below::cluster_;
  using below::evented_;
  using below::kv_;
  using below::options_;
  using below::retrying;
  using below::stop_;
  using typename below::time_point;

  // What one look for the awaited key found: its value, or `done` when waiting longer is futile
  // (the deadline passed, or a batch that ended at or past it lacked the key).
  struct key_look {
    std::optional<std::string> value;
    bool done = false;
  };

  // ---- the claimant's acks in batches (a native get_many, or a list) --------------------------
  //
  // The machine asks for the acks one task at a time (a wait each, until the round's deadline).
  // A store that reads many keys in one wait answers them together: one get_many over every ack
  // of the round not read yet, in slices of min(time left, max(watch_interval, 1 s)), between
  // which the outcome key is read (a peer may have recorded the outcome, or aborted). A store
  // that can list but cannot be waited on (no watch, no get_many: in_process_kv) answers with
  // one list of the round's ack prefix, then, when the awaited ack was not in it, one blocking
  // get of that ack for a slice: O(1) requests while the acks are there already, not one round
  // trip per task (issue 32, item 10). What a batch read serves the round's later waits. An ack
  // not read by a batch that ended at or past the deadline is missing, as a blocking get's
  // would be.

  // How the claimant reads the acks (chosen once, at construction).
  enum class ack_reads : unsigned char {
    one_by_one,  // the ack watch (an evented store), or a blocking get per ack (neither below)
    get_many,    // the store's native get_many
    list,        // a list of the round's acks, a blocking get of the awaited one it lacked
  };

  static ack_reads choose_ack_reads(const Kv& kv, bool evented) {
    if (kv_supports(kv, kv_op::get_many)) return ack_reads::get_many;
    if (!evented && kv_supports(kv, kv_op::list)) return ack_reads::list;
    return ack_reads::one_by_one;
  }

  struct ack_batch {
    std::string prefix;                          // ".../ack/r<N>/": the round and the phase
    std::map<std::string, std::string> present;  // the acks read so far
    bool final = false;  // a batch ended at or past the deadline: what it lacked is missing
  };

  // Looks for the ack `key` among those read, reading a batch when it is not there yet.
  auto batch_look(const std::string& key, time_point deadline) {
    const std::string prefix = key.substr(0, key.rfind('/') + 1);
    if (ack_batch_.prefix != prefix) ack_batch_ = ack_batch{prefix, {}, false};
    return [this, &key, deadline] {
      auto read = [&]() -> std::optional<std::string> {
        if (auto it = ack_batch_.present.find(key); it != ack_batch_.present.end())
          return it->second;
        return std::nullopt;
      };
      if (auto v = read()) return key_look{std::move(v), true};
      if (ack_batch_.final || stop_.load()) return key_look{std::nullopt, true};
      read_acks(key, deadline);
      auto v = read();
      const bool done = v.has_value() || ack_batch_.final;
      return key_look{std::move(v), done};
    };
  }

  // One batch read for one slice (at most until `deadline`): a get_many over the round's acks
  // not read yet, or a list and, when the awaited `key` was not listed, a blocking get of it.
  void read_acks(const std::string& key, time_point deadline) {
    using ms = std::chrono::milliseconds;
    const ms left =
        std::chrono::ceil<ms>(std::max<typename Clock::duration>(deadline - Clock::now(), {}));
    const ms slice = std::min(left, std::max<ms>(options_.watch_interval, std::chrono::seconds(1)));
    if constexpr (has_kv_list_v<Kv>) {
      if (ack_reads_ == ack_reads::list) {
        auto list = [&] {
          for (auto& e : retrying([&] { return kv_.list(ack_batch_.prefix); }, wait_retry_until_))
            ack_batch_.present.emplace(std::move(e.first), std::move(e.second));
        };
        list();
        if (!ack_batch_.present.count(key))
          if (auto v = retrying([&] { return kv_.get(key, slice); }, wait_retry_until_))
            ack_batch_.present.emplace(key, std::move(*v));
        if (Clock::now() >= deadline) {
          // the acks that came while the get waited: what a read of each at the deadline
          // would find (the list before the get is as old as the slice)
          list();
          ack_batch_.final = true;
        }
        return;
      }
    }
    (void)key;
    std::vector<std::string> keys;
    for (int t = 0; t < cluster_.num_tasks; ++t) {
      std::string k = ack_batch_.prefix + std::to_string(t);
      if (!ack_batch_.present.count(k)) keys.push_back(std::move(k));
    }
    auto values = retrying([&] { return holdfast::get_many(kv_, keys, slice); }, wait_retry_until_);
    for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i)
      if (values[i]) ack_batch_.present.emplace(keys[i], std::move(*values[i]));
    if (Clock::now() >= deadline) ack_batch_.final = true;
  }

  const ack_reads ack_reads_ = choose_ack_reads(kv_, evented_);  // how (see batch_look)
  ack_batch ack_batch_;            // the claimant's acks read in batches (watcher thread only)
  time_point wait_retry_until_{};  // the current wait's retry deadline (watcher thread only)
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
