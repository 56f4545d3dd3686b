// benchmarks/scale_threads.hpp — what the scale cases on threads against one etcd share
// (scale_threads_bench.cpp: notice -> saved over N handlers; scale_threads_idle_bench.cpp: idle
// handlers' requests): the binary's etcd, one counted client per worker, a notice the benchmark
// fires, a Checkpointer that stamps the save time, and a gate the threads start behind.
//
// Guarantees:
//   - etcd() is the binary's one etcd (etcd.hpp), shared with the handler cases: started on first
//     use; without etcd it prints one "# handler: no etcd" line and returns null, and the etcd
//     cases report 0 instead of failing the run.
//   - Each client from etcd_clients() has its own connections, suspect marks and counters;
//     counting_kv forwards watch() and stats(), so a handler takes the same evented path as over
//     a bare etcd_kv.
//   - bench_notice wakes the handler's watcher as signal_notice does from its handler.
// Caveats:
//   - next_run() hands out run ids for fresh key namespaces; the etcd's keys are never removed.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <holdfast/handler.hpp>
#include <holdfast/kv/etcd.hpp>
#include <mutex>
#include <optional>
#include <vector>

#include "etcd.hpp"    // the binary's one etcd
#include "scale.hpp"   // now_ns: when a save happened
#include "stamps.hpp"  // next_id: run ids

namespace bench::scale {

using bench::etcd;  // the binary's etcd, shared with the handler cases

/// A run id not handed out before in this binary: a fresh key namespace per case run.
inline std::uint64_t next_run() { return bench::next_id(); }

// An etcd client whose operations are counted by kind (copies share the counters; watch() and
// stats() are forwarded, so the handler takes the same evented path as with a bare etcd_kv).
using counted_etcd = holdfast::counting_kv<holdfast::etcd_kv>;

// One client per worker (connections, suspect marks and counters of its own).
inline std::vector<counted_etcd> etcd_clients(int n, const holdfast::kv_namespace& ns) {
  holdfast::etcd_options o;
  o.endpoints = {etcd()->url()};
  std::vector<counted_etcd> kvs;
  kvs.reserve(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) kvs.emplace_back(std::in_place, o, ns);
  return kvs;
}

/// HTTP requests the clients sent so far (etcd_kv::stats()), summed.
inline std::uint64_t requests(const std::vector<counted_etcd>& kvs) {
  std::uint64_t r = 0;
  for (const auto& kv : kvs) r += kv.stats().requests;
  return r;
}

// A notice the benchmark raises: it records the notice and wakes the handler's watcher (the
// waker it was given), as signal_notice does from its handler.
struct bench_notice {
  struct cell {
    holdfast::detail::notice_record record;
    std::atomic<const holdfast::detail::waker*> waker{nullptr};
    void fire() {
      record.record(std::nullopt);
      if (const auto* w = waker.load()) w->notify();
    }
  };
  cell* c;
  void start() {}
  void stop() noexcept {}
  bool noticed() const noexcept { return c->record.noticed.load(std::memory_order_acquire); }
  std::optional<clk::time_point> noticed_at() const noexcept { return c->record.noticed_at(); }
  std::optional<std::chrono::system_clock::time_point> deadline() const noexcept {
    return c->record.deadline();
  }
  void set_waker(const holdfast::detail::waker* w) noexcept { c->waker.store(w); }
};
using bench_config = holdfast::termination_config<bench_notice, holdfast::no_exit>;
static_assert(holdfast::has_notice_waker_v<bench_config>);

struct stamp_checkpoints {
  std::atomic<std::int64_t>* saved_at;
  void save(std::int64_t) { saved_at->store(now_ns()); }
  std::optional<std::int64_t> restore() { return std::nullopt; }
};

// Threads arrive, then wait until the benchmark opens the gate.
class start_gate {
 public:
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(m_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
  }
  bool wait_arrived(int n, std::chrono::seconds limit) {
    std::unique_lock<std::mutex> l(m_);
    return cv_.wait_for(l, limit, [&] { return arrived_ >= n; });
  }
  void open() {
    std::lock_guard<std::mutex> l(m_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  bool open_ = false;
};

}  // namespace bench::scale
