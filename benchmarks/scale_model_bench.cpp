// The step agreement at cluster scale (issue 21), simulated.
//
//   handler/simulated/<N>       N workers' step_agreement machines in one process against a
//                               simulated store (a discrete-event simulation, below): one agreement
//                               from a notice until every machine published the same step. The
//                               row's time is the host CPU time of simulating it (no baseline);
//                               "# handler/simulated" lines print the store traffic it made (per
//                               worker and per agreement) and the simulated time it took.
// The cases on threads against a real etcd are in scale_threads_bench.cpp and
// scale_threads_idle_bench.cpp.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <holdfast/agreement.hpp>
#include <holdfast/kv.hpp>  // kv_event, kv_pairs: what the simulated store holds and delivers
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bench.hpp"
#include "scale.hpp"

namespace {

using namespace std::chrono_literals;
using namespace bench::scale;

// ================================================================================================
// The simulation.
//
// Every worker is a basic_step_agreement driven the way preemption_handler drives it with a store
// that can be waited on (handler.hpp, "the control watch"): a worker parks on its watch of ctl/
// and answers the events it brings; control keys not yet seen are read once with try_get (the
// handler's ctl_seen_); a wait on a control key (the outcome) costs no request while waiting; a
// wait on an ack key (the claimant's collection) is a blocking get in slices of watch_interval,
// each slice that ends empty-handed also looking at the outcome key. The store applies each
// request half a latency after it is sent and answers half a latency later (jittered); a blocking
// get waits in a per-key waiter list, woken by a put or insert of its key or by its deadline; each
// write of a ctl/ key is delivered to every worker's watch (one delivery each). Task 0 is noticed
// and claims; a few stalled workers answer the claim late, within ack_timeout. Each worker's run
// counter is 1000 + task % 3, so the agreed step must be 1003 everywhere.
//
// Not modelled: the store's own service time (it answers at any rate), the watch's health
// probes (see handler/idle), start-up (each watch is open and has read the claim and error keys:
// the steady state before a notice).

struct sim_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<sim_clock>;
  static time_point now() noexcept { return time_point{}; }  // the machine never asks
};
using sim_machine = holdfast::basic_step_agreement<sim_clock>;
using sim_op = sim_machine::instruction::op;

struct sim_params {
  int workers = 10000;
  std::int64_t latency = 500000;  // ns, request round trip (two one-way halves)
  std::int64_t jitter = 100000;   // ns, each half is latency/2 +- jitter/2 (uniform)
  int stalled = 5;                // workers that answer the claim late
  std::int64_t stall_min = 200000000, stall_max = 2000000000;  // ns
  std::int64_t ack_timeout = 180000000000;                     // ns (handler default, 3 min)
  std::int64_t watch_interval = 100000000;                     // ns (handler default)
  std::uint64_t seed = 21;
};

// Store requests by kind.
struct sim_counts {
  std::uint64_t insert = 0, put = 0, try_get = 0, get = 0, list = 0, erase = 0;
  std::uint64_t total() const { return insert + put + try_get + get + list + erase; }
};

struct sim_report {
  int workers = 0;
  std::uint64_t deliveries = 0;
  sim_counts all, claimant;
  std::uint64_t bytes_written = 0, bytes_read = 0;
  std::int64_t published_ns = 0;  // simulated: notice -> every machine step_published
  std::int64_t claimant_ns = 0;   // simulated: notice -> the claimant recorded the step
  std::uint64_t events = 0;       // simulation events processed
};

class simulation {
 public:
  explicit simulation(sim_params p) : p_(p), rng_(p.seed) {
    if (p_.workers < 2) throw std::invalid_argument("simulation: at least 2 workers");
    ctl_prefix_ = holdfast::agreement_control_prefix(scope_) + "/";
    error_key_ = holdfast::agreement_key_name(scope_, holdfast::agreement_key::error, 0);
    const std::string claim0 =
        holdfast::agreement_key_name(scope_, holdfast::agreement_key::claim, 0);
    ws_.reserve(static_cast<std::size_t>(p_.workers));
    for (int t = 0; t < p_.workers; ++t) {
      sim_machine::config c;
      c.task = t;
      c.num_tasks = p_.workers;
      c.ack_timeout = std::chrono::nanoseconds(p_.ack_timeout);
      c.exit_after_save = false;
      c.nonce = "n" + std::to_string(t);
      ws_.emplace_back(c);
      worker& w = ws_.back();
      w.counter = 1000 + t % 3;
      // The steady state: the watch is open and the first look read the claim and error keys.
      w.seen = {{claim0, std::nullopt}, {error_key_, std::nullopt}};
      w.md = mode::trigger;
      w.parked = true;
    }
    std::uniform_int_distribution<int> pick(1, p_.workers - 1);
    std::uniform_int_distribution<std::int64_t> stall(p_.stall_min, p_.stall_max);
    for (int k = 0; k < std::min(p_.stalled, p_.workers - 1); ++k) {
      int t;
      do t = pick(rng_);
      while (ws_[static_cast<std::size_t>(t)].stall > 0);
      ws_[static_cast<std::size_t>(t)].stall = stall(rng_);
    }
  }

  // Runs one agreement; throws std::runtime_error unless every machine published step 1003.
  sim_report run() {
    now_ = start_;
    worker& w0 = ws_[0];
    w0.m.on_notice(tp(now_));
    wake(0);
    while (!q_.empty()) {
      const event e = q_.top();
      q_.pop();
      now_ = e.t;
      ++rep_.events;
      switch (e.kind) {
        case ev::apply:
          apply(e.id);
          break;
        case ev::reply:
          on_reply(e.id);
          break;
        case ev::deliver:
          on_deliver(e.worker, e.id);
          break;
        case ev::expire:
          on_expire(e.id);
          break;
        case ev::wake:
          on_wake(e.worker, e.id);
          break;
      }
    }
    const std::int64_t expected = 1000 + std::min(p_.workers - 1, 2) + 1;
    for (const worker& w : ws_)
      if (w.m.state() != holdfast::agreement_state::step_published || w.m.agreed_step() != expected)
        throw std::runtime_error("simulation: task " + std::to_string(&w - ws_.data()) +
                                 " ended in state " +
                                 std::to_string(static_cast<int>(w.m.state())) + " with step " +
                                 std::to_string(w.m.agreed_step()) + ", expected step_published " +
                                 std::to_string(expected));
    rep_.workers = p_.workers;
    rep_.published_ns = last_published_ - start_;
    rep_.claimant_ns = claimant_published_ - start_;
    return rep_;
  }

 private:
  enum class ev : std::uint8_t { apply, reply, deliver, expire, wake };
  struct event {
    std::int64_t t;
    std::uint64_t seq;
    ev kind;
    int worker;
    int id;  // request id (apply, reply, expire), write id (deliver), wake token (wake)
  };
  struct later {
    bool operator()(const event& a, const event& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  enum class rq : std::uint8_t { insert, put, try_get, get, list, erase };
  enum class why : std::uint8_t { machine, ctl_read, ack_slice };
  struct request {
    int worker = 0;
    rq kind = rq::get;
    why purpose = why::machine;
    std::string key, value;
    std::int64_t deadline = 0;
    bool answered = false;
    bool created = false;
    std::optional<std::string> got;
    holdfast::kv_pairs listed;
  };
  // What a worker is doing: running the protocol (a request out), waiting for a trigger, waiting
  // on a control key, looking at the outcome key between two slices of a collection, stalled.
  enum class mode : std::uint8_t { busy, trigger, ctl_wait, collect_also, stalled };
  struct worker {
    explicit worker(const sim_machine::config& c) : m(c) {}
    sim_machine m;
    std::int64_t counter = 0;
    std::int64_t stall = 0;  // > 0: the first event that wakes it is answered this much later
    mode md = mode::busy;
    bool parked = false;  // asleep in poll() on its watch (and the waker)
    int token = 0;        // the current wake-up timer's token
    bool error_seen = false;
    bool published = false;
    std::string wait_key, also_key;
    std::int64_t wait_deadline = 0;
    std::vector<std::pair<std::string, std::optional<std::string>>> seen;  // ctl_seen_
    std::vector<int> inbox;  // writes delivered to its watch, not yet taken
  };

  static sim_clock::time_point tp(std::int64_t ns) {
    return sim_clock::time_point(std::chrono::nanoseconds(ns));
  }
  static std::int64_t ns(sim_clock::time_point t) { return t.time_since_epoch().count(); }

  void push(std::int64_t t, ev kind, int w, int id) { q_.push(event{t, seq_++, kind, w, id}); }
  std::int64_t one_way() {
    std::uniform_int_distribution<std::int64_t> d(-p_.jitter / 2, p_.jitter / 2);
    return p_.latency / 2 + d(rng_);
  }
  bool is_ctl(const std::string& key) const { return key.rfind(ctl_prefix_, 0) == 0; }
  std::string name(holdfast::agreement_key k, std::uint64_t round, int task = -1) const {
    return holdfast::agreement_key_name(scope_, k, round, task);
  }

  // ---- the store ---------------------------------------------------------------------------

  int send(int w, rq kind, why purpose, std::string key, std::string value = {},
           std::int64_t deadline = 0) {
    sim_counts* counts[2] = {&rep_.all, w == 0 ? &rep_.claimant : nullptr};
    for (sim_counts* c : counts) {
      if (!c) continue;
      switch (kind) {
        case rq::insert:
          ++c->insert;
          break;
        case rq::put:
          ++c->put;
          break;
        case rq::try_get:
          ++c->try_get;
          break;
        case rq::get:
          ++c->get;
          break;
        case rq::list:
          ++c->list;
          break;
        case rq::erase:
          ++c->erase;
          break;
      }
    }
    rep_.bytes_written += key.size() + value.size();
    ws_[static_cast<std::size_t>(w)].parked = false;
    const int id = static_cast<int>(reqs_.size());
    request r;
    r.worker = w;
    r.kind = kind;
    r.purpose = purpose;
    r.key = std::move(key);
    r.value = std::move(value);
    r.deadline = deadline;
    reqs_.push_back(std::move(r));
    push(now_ + one_way(), ev::apply, w, id);
    return id;
  }

  void answer(int id) {
    reqs_[static_cast<std::size_t>(id)].answered = true;
    push(now_ + one_way(), ev::reply, reqs_[static_cast<std::size_t>(id)].worker, id);
  }

  void apply(int id) {
    request& r = reqs_[static_cast<std::size_t>(id)];
    switch (r.kind) {
      case rq::insert:
        if (data_.count(r.key) == 0) {
          data_[r.key] = r.value;
          r.created = true;
          written(r.key, r.value);
        }
        break;
      case rq::put:
        data_[r.key] = r.value;
        written(r.key, r.value);
        break;
      case rq::try_get:
      case rq::get: {
        auto it = data_.find(r.key);
        if (it != data_.end()) {
          r.got = it->second;
        } else if (r.kind == rq::get) {
          waiters_[r.key].push_back(id);
          push(std::max(now_, r.deadline), ev::expire, r.worker, id);
          return;  // answered by a write of the key or by the deadline
        }
        break;
      }
      case rq::list: {
        const std::string start = r.key.back() == '/' ? r.key : r.key + "/";
        for (auto it = data_.lower_bound(start);
             it != data_.end() && it->first.compare(0, start.size(), start) == 0; ++it)
          r.listed.emplace_back(it->first, it->second);
        break;
      }
      case rq::erase:
        if (data_.erase(r.key) > 0) erased(r.key);
        break;
    }
    answer(id);
  }

  void written(const std::string& key, const std::string& value) {
    if (auto it = waiters_.find(key); it != waiters_.end()) {
      for (int id : it->second) {
        request& r = reqs_[static_cast<std::size_t>(id)];
        if (r.answered) continue;
        r.got = value;
        answer(id);
      }
      waiters_.erase(it);
    }
    if (is_ctl(key)) broadcast(key, value);
  }
  void erased(const std::string& key) {
    if (is_ctl(key)) broadcast(key, std::nullopt);
  }
  void broadcast(const std::string& key, std::optional<std::string> value) {
    const int id = static_cast<int>(writes_.size());
    writes_.push_back(holdfast::kv_event{key, std::move(value)});
    for (int w = 0; w < p_.workers; ++w) push(now_ + one_way(), ev::deliver, w, id);
  }

  void on_expire(int id) {
    request& r = reqs_[static_cast<std::size_t>(id)];
    if (r.answered) return;
    auto& list = waiters_[r.key];
    list.erase(std::remove(list.begin(), list.end(), id), list.end());
    answer(id);  // got stays nullopt
  }

  // ---- the workers -------------------------------------------------------------------------

  worker& at(int w) { return ws_[static_cast<std::size_t>(w)]; }

  void note_published(int w) {
    worker& W = at(w);
    if (!W.published && W.m.state() == holdfast::agreement_state::step_published) {
      W.published = true;
      last_published_ = std::max(last_published_, now_);
      if (w == 0) claimant_published_ = now_;
    }
  }

  // The watcher's loop: the machine's next store operation, or the wait for a trigger.
  void drive(int w) {
    worker& W = at(w);
    if (++depth_ > 64) throw std::runtime_error("simulation: task " + std::to_string(w) + " spins");
    const bool wants = W.m.wants_counter();
    const auto in = W.m.protocol_next(wants ? W.counter : 0, tp(now_));
    if (in.kind == sim_op::decide) {
      W.md = mode::trigger;
      trigger_step(w);
      --depth_;
      return;
    }
    const std::string key = name(in.key, in.round, in.task);
    W.md = mode::busy;
    switch (in.kind) {
      case sim_op::insert:
        send(w, rq::insert, why::machine, key, in.value);
        break;
      case sim_op::put:
        send(w, rq::put, why::machine, key, in.value);
        break;
      case sim_op::try_get:
        send(w, rq::try_get, why::machine, key);
        break;
      case sim_op::list:
        send(w, rq::list, why::machine, key);
        break;
      case sim_op::erase:
        send(w, rq::erase, why::machine, key);
        break;
      case sim_op::wait:
        W.wait_key = key;
        W.wait_deadline = ns(in.deadline);
        W.also_key = W.m.collecting() ? name(W.m.outcome_key(), in.round) : std::string();
        if (is_ctl(key)) {
          W.md = mode::ctl_wait;
          ctl_wait_step(w);
        } else {
          ack_slice(w);
        }
        break;
      case sim_op::decide:
        break;
    }
    --depth_;
  }

  // control_value(): what the watch brought, or one try_get (false: resumed at its reply).
  bool control_value(int w, const std::string& key, std::optional<std::string>& out) {
    for (const auto& e : at(w).seen)
      if (e.first == key) {
        out = e.second;
        return true;
      }
    send(w, rq::try_get, why::ctl_read, key);
    return false;
  }
  static void remember(worker& W, const std::string& key, std::optional<std::string> value) {
    for (auto& e : W.seen)
      if (e.first == key) {
        e.second = std::move(value);
        return;
      }
    W.seen.emplace_back(key, std::move(value));
  }
  // The watch's take(): the delivered writes into ctl_seen_.
  void take(int w) {
    worker& W = at(w);
    for (int id : W.inbox)
      remember(W, writes_[static_cast<std::size_t>(id)].key,
               writes_[static_cast<std::size_t>(id)].value);
    W.inbox.clear();
  }
  // Sleeps in poll() until an event arrives or `until` (-1: no timeout).
  void park(int w, std::int64_t until) {
    worker& W = at(w);
    W.parked = true;
    ++W.token;
    if (until >= 0) push(until, ev::wake, w, W.token);
  }

  // wait_for_trigger: the claim (or final claim, or error) key from what the watch brought.
  void trigger_step(int w) {
    worker& W = at(w);
    for (;;) {
      const std::uint64_t round = W.m.round();
      const auto trigger = W.m.watch_key();
      const std::string key = trigger ? name(*trigger, round) : W.error_seen ? "" : error_key_;
      std::optional<std::string> v, err;
      if (!key.empty() && !control_value(w, key, v)) return;
      if (!W.error_seen && !v && !control_value(w, error_key_, err)) return;
      if (!v && !err) {
        if (W.inbox.empty()) return park(w, -1);
        take(w);
        continue;
      }
      if (v && !trigger) err = std::exchange(v, std::nullopt);
      if (v && is_abort(*v)) {
        std::optional<std::string> e;
        if (!control_value(w, error_key_, e)) return;
        err = e.value_or(std::string());
      }
      if (err) {
        W.error_seen = true;
        W.m.on_error_seen(*err);
      } else if (*trigger == holdfast::agreement_key::claim) {
        W.m.on_claim_seen(round);
      } else if (*trigger == holdfast::agreement_key::final_claim) {
        W.m.on_final_seen(round);
      }
      return drive(w);
    }
  }

  // wait_for_key on a control key: no request while waiting, the watch brings the value.
  void ctl_wait_step(int w) {
    worker& W = at(w);
    for (;;) {
      std::optional<std::string> v;
      if (!control_value(w, W.wait_key, v)) return;
      if (v || now_ >= W.wait_deadline) {
        W.md = mode::busy;
        W.m.on_value(v);
        note_published(w);
        return drive(w);
      }
      if (W.inbox.empty()) return park(w, W.wait_deadline);
      take(w);
    }
  }

  // wait_for_key on an ack key: a blocking get for one slice.
  void ack_slice(int w) {
    worker& W = at(w);
    W.md = mode::busy;
    send(w, rq::get, why::ack_slice, W.wait_key, {},
         std::min(W.wait_deadline, now_ + p_.watch_interval));
  }
  // Between two slices: what the watch has (no sleep), then the outcome key.
  void collect_also_step(int w) {
    worker& W = at(w);
    take(w);
    std::optional<std::string> v;
    if (!control_value(w, W.also_key, v)) return;
    if (v) {
      W.md = mode::busy;
      W.m.on_outcome_seen(*v);
      note_published(w);
      return drive(w);
    }
    ack_slice(w);
  }

  void on_reply(int id) {
    // Taken out of the request first: answering may send more (reqs_ grows).
    request& r = reqs_[static_cast<std::size_t>(id)];
    const int w = r.worker;
    const rq kind = r.kind;
    const why purpose = r.purpose;
    const bool created = r.created;
    std::string key = std::move(r.key);
    std::optional<std::string> got = std::move(r.got);
    holdfast::kv_pairs listed = std::move(r.listed);
    r.key.shrink_to_fit();
    r.value.clear();
    r.value.shrink_to_fit();
    worker& W = at(w);
    if (got) rep_.bytes_read += got->size();
    for (const auto& kv : listed) rep_.bytes_read += kv.first.size() + kv.second.size();
    switch (purpose) {
      case why::machine:
        switch (kind) {
          case rq::insert:
            W.m.on_insert(created);
            break;
          case rq::put:
            W.m.on_put();
            break;
          case rq::try_get:
          case rq::get:
            W.m.on_value(got);
            break;
          case rq::list:
            W.m.on_list(listed);
            break;
          case rq::erase:
            break;
        }
        note_published(w);
        drive(w);
        break;
      case why::ctl_read:
        remember(W, key, std::move(got));
        resume(w);
        break;
      case why::ack_slice:
        if (got || now_ >= W.wait_deadline) {
          W.m.on_value(got);
          note_published(w);
          drive(w);
        } else if (W.also_key.empty()) {
          ack_slice(w);
        } else {
          W.md = mode::collect_also;
          collect_also_step(w);
        }
        break;
    }
  }

  void resume(int w) {
    switch (at(w).md) {
      case mode::trigger:
        return trigger_step(w);
      case mode::ctl_wait:
        return ctl_wait_step(w);
      case mode::collect_also:
        return collect_also_step(w);
      case mode::busy:
      case mode::stalled:
        return;
    }
  }

  // Out of poll(): an event, the notice, or the timeout.
  void wake(int w) {
    worker& W = at(w);
    W.parked = false;
    ++W.token;                                   // the pending timeout, if any, is stale now
    if (W.stall > 0 && W.md == mode::trigger) {  // frozen: answers this much later
      W.md = mode::stalled;
      push(now_ + std::exchange(W.stall, 0), ev::wake, w, W.token);
      return;
    }
    take(w);
    if (W.md == mode::trigger) return drive(w);  // the loop: forward_notice, protocol_step, ...
    resume(w);
  }

  void on_deliver(int w, int id) {
    const holdfast::kv_event& e = writes_[static_cast<std::size_t>(id)];
    ++rep_.deliveries;
    rep_.bytes_read += e.key.size() + (e.value ? e.value->size() : 0);
    worker& W = at(w);
    W.inbox.push_back(id);
    if (W.parked) wake(w);
  }

  void on_wake(int w, int token) {
    worker& W = at(w);
    if (token != W.token) return;
    if (W.md == mode::stalled) {
      W.md = mode::trigger;
      take(w);
      return drive(w);
    }
    if (!W.parked) return;
    W.parked = false;
    take(w);
    if (W.md == mode::trigger) return drive(w);
    resume(w);
  }

  static bool is_abort(const std::string& value) {
    auto v = holdfast::parse_agreement_value(value);
    return v && v->what == holdfast::agreement_value::kind::abort;
  }

  sim_params p_;
  std::mt19937_64 rng_;
  const std::string scope_ = "holdfast/sim/";
  std::string ctl_prefix_, error_key_;
  const std::int64_t start_ = 1000000000;  // 1 s: time_point{} means "unset" to the machine
  std::int64_t now_ = 0;
  std::int64_t last_published_ = 0;
  std::int64_t claimant_published_ = 0;
  std::uint64_t seq_ = 0;
  int depth_ = 0;
  std::priority_queue<event, std::vector<event>, later> q_;
  std::vector<worker> ws_;
  std::vector<request> reqs_;
  std::vector<holdfast::kv_event> writes_;
  std::map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<int>> waiters_;
  sim_report rep_;
};

void print_simulated(const sim_report& r, const sim_params& p, double cpu_ms) {
  const double n = r.workers;
  const sim_counts& a = r.all;
  std::printf(
      "# handler/simulated %6d workers, per worker: deliveries %.3f, requests %.4f (insert %.4f "
      "put %.4f try_get %.4f get %.4f list %.4f erase %.4f), bytes written %.1f read %.1f\n",
      r.workers, static_cast<double>(r.deliveries) / n, static_cast<double>(a.total()) / n,
      static_cast<double>(a.insert) / n, static_cast<double>(a.put) / n,
      static_cast<double>(a.try_get) / n, static_cast<double>(a.get) / n,
      static_cast<double>(a.list) / n, static_cast<double>(a.erase) / n,
      static_cast<double>(r.bytes_written) / n, static_cast<double>(r.bytes_read) / n);
  std::printf(
      "# handler/simulated %6d workers, per agreement: deliveries %llu, requests %llu (claimant "
      "%llu: get %llu), bytes written %llu read %llu; notice->all published %.1f ms simulated "
      "(claimant recorded the step at %.1f ms; round trip %.2f ms +-%.2f, %d stalled 0.2-2 s); "
      "%llu events, host CPU %.1f ms\n",
      r.workers, static_cast<unsigned long long>(r.deliveries),
      static_cast<unsigned long long>(a.total()),
      static_cast<unsigned long long>(r.claimant.total()),
      static_cast<unsigned long long>(r.claimant.get),
      static_cast<unsigned long long>(r.bytes_written),
      static_cast<unsigned long long>(r.bytes_read), static_cast<double>(r.published_ns) / 1e6,
      static_cast<double>(r.claimant_ns) / 1e6, static_cast<double>(p.latency) / 1e6,
      static_cast<double>(p.jitter) / 1e6, p.stalled, static_cast<unsigned long long>(r.events),
      cpu_ms);
  std::fflush(stdout);
}

double simulated(int workers) {
  sim_params p;
  p.workers = workers;
  const std::int64_t c0 = cpu_ns();
  sim_report r;
  try {
    simulation sim(p);
    r = sim.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "handler/simulated/%d: %s\n", workers, e.what());
    std::exit(1);
  }
  const double cpu = static_cast<double>(cpu_ns() - c0);
  if (first_time("simulated/" + std::to_string(workers))) print_simulated(r, p, cpu / 1e6);
  return cpu;
}

[[maybe_unused]] const bool simulated_registered = [] {
  for (int n : {1000, 10000, 100000})
    bench::registry().push_back({"handler/simulated/" + std::to_string(n),
                                 [n](std::size_t) { return simulated(n); },
                                 "",
                                 {},
                                 bench::config{1, n >= 100000 ? 3 : 5, 0, 0}});
  return true;
}();

}  // namespace
