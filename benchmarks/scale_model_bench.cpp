// The step agreement at cluster scale (issue 21), simulated.
//
//   handler/simulated/<collect>/<server>/<N>
//                               N workers' step_agreement machines in one process against a
//                               simulated store (a discrete-event simulation, below): one agreement
//                               from a notice until every machine published the same step. The
//                               row's time is the host CPU time of simulating it (no baseline);
//                               "# handler/simulated" lines print the store traffic it made (per
//                               worker and per agreement) and the simulated time it took.
//                               <collect>: how the claimant reads the acks (watcher/acks.hpp):
//                               one_by_one (a blocking get per task: before issue 32, item 10),
//                               list (a list of the round's acks, then a blocking get of the
//                               awaited ack it lacked) or get_many (one wait for every ack not
//                               read yet). <server>: the store's single server, serving k requests
//                               at a time with a measured service time (sim_server below).
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
// handler's watch_cache), unless the watch began with a snapshot (etcd: absent, no read); a wait on
// a control key (the outcome) costs no request while waiting; a wait on an ack key (the claimant's
// collection) is, by <collect>, a blocking get in slices of watch_interval (one_by_one), or the
// watcher's batch_look: the acks read so far, else a list of the round's acks and a blocking get of
// the awaited one it lacked (list), or one get_many of every ack not read yet (get_many), in slices
// of max(watch_interval, 1 s); each look or slice that ends empty-handed also looks at the outcome
// key. A request reaches the store half a latency after it is sent and its answer comes back half a
// latency after the server sent it (jittered); a blocking get waits in a per-key waiter list, woken
// by a put or insert of its key or by its deadline; each write of a ctl/ key is delivered to every
// worker's watch (one delivery each). Task 0 is noticed and claims; a few stalled workers answer
// the claim late, within ack_timeout. Each worker's run counter is 1000 + task % 3, so the agreed
// step must be 1003 everywhere.
//
// The store is ONE server (sim_server): it serves `slots` requests at a time, each taking
// `service` ns, plus `per_item` ns per key a batched read (list, get_many) answers and per
// watch event or woken waiter it sends; requests queue in arrival order, so concurrency is not
// free and the N workers' own traffic (acks, erases, watch events) competes with the claimant's
// collection. A request takes effect when its service ends (a write is visible then).
// Not modelled: the watch's health probes (see handler/idle), start-up (each watch is open and
// has read the claim and error keys: the steady state before a notice).
//
// The servers' figures, measured on this project's 2-core CI machine (shared, so upper bounds):
//   tcpstore: PyTorch's TCPStore serves from one libuv loop (slots 1); its CPU time per request
//             (benchmarks/torch_store_bench.py --service-time: the server process's utime +
//             stime over the requests 4 client processes sent): get 9,625 ns, multi_get
//             of 64 keys 18,500 ns (141 ns a key beyond the first:
//             per_item; a set measured 500 ns: the get is the service time used)
//   etcd:     one etcd 3.x on loopback, its process's CPU time per request over 4,000 requests
//             of one etcd_kv client (benchmarks/kv_bench.cpp, "kv/etcd/server CPU per ..."):
//             get 285 us, put 235 us (the larger is the service time used: 285 us), list of 16
//             keys 495 us (14 us a key beyond the first: per_item). holdfast talks to etcd's
//             JSON gateway, which re-issues each request as gRPC inside etcd: that is most of the
//             cost. etcd serves on every core: slots 2, this machine's cores. Reads cost the get
//             (285 us), writes (insert, put, erase) the put (235 us).
//   etcd16:   the same etcd on a 16-core machine (the project's device machine, one run of
//             kv_bench there): get 897.5 us, put 540 us, list of 16 keys 1,142.5 us (16.3 us a
//             key), more CPU per request than on 2 cores (Go spreads each over more threads),
//             served 16 at once. Checked against a real agreement there:
//             handler/scale/etcd/256 took 27.8 ms for its ~512 requests (54 us a request of
//             wall time; the model's 540-897 us over 16 slots: 34-56 us).

struct sim_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<sim_clock>;
  static time_point now() noexcept { return time_point{}; }  // the machine never asks
};
using sim_machine = holdfast::basic_step_agreement<sim_clock>;
using sim_op = sim_machine::instruction::op;

// The store's single server (see above).
struct sim_server {
  const char* name = "instant";
  int slots = 1;              // requests served at a time
  std::int64_t service = 0;   // ns per request (a read)
  std::int64_t per_item = 0;  // ns per key answered by a batch, per event or waiter answered
  // The watch starts with a snapshot of ctl/ (etcd's, kv_changes::complete): a control key it
  // has not brought is absent, no read (watch_cache's `complete`); else one try_get reads it.
  bool snapshot = false;
  std::int64_t write_service = -1;  // ns per insert, put or erase; -1: `service`
};

// How the claimant reads the acks (handler/watcher/acks.hpp).
enum class sim_collect : std::uint8_t { one_by_one, list, get_many };

struct sim_params {
  int workers = 10000;
  sim_server server;
  sim_collect collect = sim_collect::one_by_one;
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
  std::uint64_t insert = 0, put = 0, try_get = 0, get = 0, list = 0, erase = 0, get_many = 0;
  std::uint64_t total() const { return insert + put + try_get + get + list + erase + get_many; }
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
        case ev::arrive:
          arrive(e.id);
          break;
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
        case ev::drive:
          drive(e.worker);
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
  enum class ev : std::uint8_t { arrive, apply, reply, deliver, expire, wake, drive };
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
  enum class rq : std::uint8_t { insert, put, try_get, get, list, erase, get_many };
  enum class why : std::uint8_t {
    machine,
    ctl_read,
    ack_slice,
    ack_list,
    ack_final_list,
    ack_many
  };
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
    std::vector<std::string> keys;                 // get_many
    std::vector<std::optional<std::string>> many;  // get_many's answer
    std::size_t missing = 0;                       // get_many: keys not there yet
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
    // the claimant's batched collection (watcher/acks.hpp's ack_batch)
    std::string batch_prefix;
    std::unordered_map<std::string, std::string> present;
    bool batch_final = false;
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
        case rq::get_many:
          ++c->get_many;
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
    push(now_ + one_way(), ev::arrive, w, id);
    return id;
  }

  // The server: `cost` ns on the slot that frees first, from now; returns when it is done.
  std::int64_t serve(std::int64_t cost) {
    if (p_.server.service == 0 && p_.server.per_item == 0) return now_;
    if (slots_.empty())
      for (int i = 0; i < p_.server.slots; ++i) slots_.push(0);
    const std::int64_t end = std::max(now_, slots_.top()) + cost;
    slots_.pop();
    slots_.push(end);
    return end;
  }
  // A request arrived: it queues for the server and takes effect when its service ends. A list
  // costs per_item per key it will answer (counted now), a get_many per key asked.
  void arrive(int id) {
    const request& r = reqs_[static_cast<std::size_t>(id)];
    const bool write = r.kind == rq::insert || r.kind == rq::put || r.kind == rq::erase;
    std::int64_t cost =
        write && p_.server.write_service >= 0 ? p_.server.write_service : p_.server.service;
    if (r.kind == rq::list) {
      std::size_t n = 0;
      for (auto it = data_.lower_bound(r.key);
           it != data_.end() && it->first.compare(0, r.key.size(), r.key) == 0; ++it)
        ++n;
      cost += p_.server.per_item * static_cast<std::int64_t>(n);
    } else if (r.kind == rq::get_many) {
      cost += p_.server.per_item * static_cast<std::int64_t>(r.keys.size());
    }
    push(serve(cost), ev::apply, r.worker, id);
  }

  // Sends the answer: at once when the request's service just ended, else (a waiter woken by a
  // write or its deadline) after per_item of the server's time.
  void answer(int id, bool served = true) {
    reqs_[static_cast<std::size_t>(id)].answered = true;
    const std::int64_t at = served ? now_ : serve(p_.server.per_item);
    push(at + one_way(), ev::reply, reqs_[static_cast<std::size_t>(id)].worker, id);
  }
  void fill_many(request& r) {
    r.many.clear();
    for (const auto& k : r.keys) {
      auto it = data_.find(k);
      r.many.push_back(it == data_.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
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
      case rq::get_many: {
        for (const auto& k : r.keys)
          if (data_.count(k) == 0) {
            ++r.missing;
            waiters_[k].push_back(id);
          }
        if (r.missing > 0 && now_ < r.deadline) {
          push(r.deadline, ev::expire, r.worker, id);
          return;  // answered once every key exists, or at the deadline
        }
        fill_many(r);
        break;
      }
    }
    answer(id);
  }

  void written(const std::string& key, const std::string& value) {
    if (auto it = waiters_.find(key); it != waiters_.end()) {
      for (int id : it->second) {
        request& r = reqs_[static_cast<std::size_t>(id)];
        if (r.answered) continue;
        if (r.kind == rq::get_many) {
          if (--r.missing > 0) continue;
          fill_many(r);
        } else {
          r.got = value;
        }
        answer(id, false);
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
    for (int w = 0; w < p_.workers; ++w)  // the server sends each watch its event
      push(serve(p_.server.per_item) + one_way(), ev::deliver, w, id);
  }

  void on_expire(int id) {
    request& r = reqs_[static_cast<std::size_t>(id)];
    if (r.answered) return;
    if (r.kind == rq::get_many) {
      for (const auto& k : r.keys) {
        auto it = waiters_.find(k);
        if (it == waiters_.end()) continue;
        it->second.erase(std::remove(it->second.begin(), it->second.end(), id), it->second.end());
      }
      fill_many(r);
      return answer(id, false);
    }
    auto& list = waiters_[r.key];
    list.erase(std::remove(list.begin(), list.end(), id), list.end());
    answer(id, false);  // got stays nullopt
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
        } else if (p_.collect == sim_collect::one_by_one) {
          ack_slice(w);
        } else {
          batch_look(w);
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
    if (p_.server.snapshot) {  // absent, the watch's snapshot says
      out = std::nullopt;
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

  // ---- the claimant's batched collection (watcher/acks.hpp: batch_look, read_acks) ---------

  // One look for the awaited ack: among those read, else a batch read for one slice of
  // min(time left, max(watch_interval, 1 s)).
  void batch_look(int w) {
    worker& W = at(w);
    W.md = mode::busy;
    const std::string prefix = W.wait_key.substr(0, W.wait_key.rfind('/') + 1);
    if (W.batch_prefix != prefix) {
      W.batch_prefix = prefix;
      W.present.clear();
      W.batch_final = false;
    }
    if (auto it = W.present.find(W.wait_key); it != W.present.end()) return ack_seen(w, it->second);
    if (W.batch_final) return ack_seen(w, std::nullopt);
    if (p_.collect == sim_collect::list) {
      send(w, rq::list, why::ack_list, prefix);
      return;
    }
    std::vector<std::string> keys;
    for (int t = 0; t < p_.workers; ++t) {
      std::string k = prefix + std::to_string(t);
      if (t != w && !W.present.count(k)) keys.push_back(std::move(k));
    }
    for (const auto& k : keys) rep_.bytes_written += k.size();
    const int id = send(w, rq::get_many, why::ack_many, {}, {}, batch_slice_end(w));
    reqs_[static_cast<std::size_t>(id)].keys = std::move(keys);
  }
  std::int64_t batch_slice_end(int w) const {
    const worker& W = ws_[static_cast<std::size_t>(w)];
    return std::min(W.wait_deadline, now_ + std::max<std::int64_t>(p_.watch_interval, 1000000000));
  }
  // The awaited ack's value (or none: missing), as the machine's wait answers it.
  // The machine's next instruction comes from a fresh event: acks read by one batch are taken
  // one after another without recursion.
  void ack_seen(int w, std::optional<std::string> v) {
    worker& W = at(w);
    W.m.on_value(std::move(v));
    note_published(w);
    push(now_, ev::drive, w, 0);
  }
  // After a batch read: the ack, or (none, not final) the outcome key, then the next look.
  void after_batch(int w) {
    worker& W = at(w);
    if (now_ >= W.wait_deadline) W.batch_final = true;
    if (W.present.count(W.wait_key) || W.batch_final) return batch_look(w);
    W.md = mode::collect_also;
    collect_also_step(w);
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
    if (p_.collect == sim_collect::one_by_one) return ack_slice(w);
    batch_look(w);
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
    std::vector<std::string> many_keys = std::move(r.keys);
    std::vector<std::optional<std::string>> many = std::move(r.many);
    r.key.shrink_to_fit();
    r.value.clear();
    r.value.shrink_to_fit();
    worker& W = at(w);
    if (got) rep_.bytes_read += got->size();
    for (const auto& kv : listed) rep_.bytes_read += kv.first.size() + kv.second.size();
    for (const auto& v : many)
      if (v) rep_.bytes_read += v->size();
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
          case rq::get_many:
            break;
        }
        note_published(w);
        drive(w);
        break;
      case why::ack_final_list:  // at the deadline: what came while the get waited, then final
        for (auto& e : listed) W.present.emplace(std::move(e.first), std::move(e.second));
        after_batch(w);
        break;
      case why::ack_list:
        for (auto& e : listed) W.present.emplace(std::move(e.first), std::move(e.second));
        if (!W.present.count(W.wait_key) && now_ < W.wait_deadline) {
          send(w, rq::get, why::ack_slice, W.wait_key, {}, batch_slice_end(w));
          break;
        }
        after_batch(w);
        break;
      case why::ack_many:
        for (std::size_t i = 0; i < many_keys.size() && i < many.size(); ++i)
          if (many[i]) W.present.emplace(many_keys[i], std::move(*many[i]));
        after_batch(w);
        break;
      case why::ctl_read:
        remember(W, key, std::move(got));
        resume(w);
        break;
      case why::ack_slice:
        if (p_.collect != sim_collect::one_by_one) {  // the get after a list that lacked it
          if (got) W.present.emplace(key, std::move(*got));
          if (now_ >= W.wait_deadline) {  // watcher/acks.hpp lists once more at the deadline
            send(w, rq::list, why::ack_final_list, W.batch_prefix);
            break;
          }
          after_batch(w);
          break;
        }
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
  std::priority_queue<std::int64_t, std::vector<std::int64_t>, std::greater<>> slots_;
  std::unordered_map<std::string, std::vector<int>> waiters_;
  sim_report rep_;
};

const char* collect_name(sim_collect c) {
  switch (c) {
    case sim_collect::one_by_one:
      return "one_by_one";
    case sim_collect::list:
      return "list";
    case sim_collect::get_many:
      return "get_many";
  }
  return "?";
}

std::string row_name(const sim_params& p) {
  return std::string("handler/simulated/") + collect_name(p.collect) + "/" + p.server.name + "/" +
         std::to_string(p.workers);
}

void print_simulated(const sim_report& r, const sim_params& p, double cpu_ms) {
  const double n = r.workers;
  const sim_counts& a = r.all;
  const std::string row = row_name(p);
  std::printf(
      "# %s: per worker: deliveries %.3f, requests %.4f (insert %.4f put %.4f try_get %.4f get "
      "%.4f list %.4f erase %.4f get_many %.4f), bytes written %.1f read %.1f\n",
      row.c_str(), static_cast<double>(r.deliveries) / n, static_cast<double>(a.total()) / n,
      static_cast<double>(a.insert) / n, static_cast<double>(a.put) / n,
      static_cast<double>(a.try_get) / n, static_cast<double>(a.get) / n,
      static_cast<double>(a.list) / n, static_cast<double>(a.erase) / n,
      static_cast<double>(a.get_many) / n, static_cast<double>(r.bytes_written) / n,
      static_cast<double>(r.bytes_read) / n);
  std::printf(
      "# %s: per agreement: deliveries %llu, requests %llu (claimant %llu: get %llu list %llu "
      "get_many %llu), bytes written %llu read %llu; server %s (%d at a time, %.1f us/request + "
      "%.2f us/item), round trip %.2f ms +-%.2f, %d stalled 0.2-2 s; %llu events, host CPU %.1f "
      "ms\n",
      row.c_str(), static_cast<unsigned long long>(r.deliveries),
      static_cast<unsigned long long>(a.total()),
      static_cast<unsigned long long>(r.claimant.total()),
      static_cast<unsigned long long>(r.claimant.get),
      static_cast<unsigned long long>(r.claimant.list),
      static_cast<unsigned long long>(r.claimant.get_many),
      static_cast<unsigned long long>(r.bytes_written),
      static_cast<unsigned long long>(r.bytes_read), p.server.name, p.server.slots,
      static_cast<double>(p.server.service) / 1e3, static_cast<double>(p.server.per_item) / 1e3,
      static_cast<double>(p.latency) / 1e6, static_cast<double>(p.jitter) / 1e6, p.stalled,
      static_cast<unsigned long long>(r.events), cpu_ms);
  std::printf(
      "# %s: notice -> all published %.1f ms simulated (claimant recorded the step at %.1f ms)%s\n",
      row.c_str(), static_cast<double>(r.published_ns) / 1e6,
      static_cast<double>(r.claimant_ns) / 1e6,
      r.workers >= 100000
          ? (r.published_ns <= 5000000000 ? "  [goal <= 5 s: met]" : "  [goal <= 5 s: MISSED]")
          : "");
  std::fflush(stdout);
}

double simulated(const sim_params& p) {
  const std::int64_t c0 = cpu_ns();
  sim_report r;
  try {
    simulation sim(p);
    r = sim.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", row_name(p).c_str(), e.what());
    std::exit(1);
  }
  const double cpu = static_cast<double>(cpu_ns() - c0);
  if (first_time(row_name(p))) print_simulated(r, p, cpu / 1e6);
  return cpu;
}

// The measured servers (see "The servers' figures" above).
constexpr sim_server tcpstore_server{"tcpstore", 1, 9625, 141};
constexpr sim_server etcd_server{"etcd", 2, 285000, 14000, true, 235000};
// etcd on a 16-core machine (as a 100,000-worker job would run it), its CPU time per request
// measured there (see "The servers' figures")
constexpr sim_server etcd16_server{"etcd16", 16, 897500, 16300, true, 540000};

[[maybe_unused]] const bool simulated_registered = [] {
  // before (one_by_one) and after (the batched reads the watcher makes over each store: etcd
  // can list, TCPStore has a get_many through the PyTorch extension)
  const std::pair<sim_collect, sim_server> rows[] = {
      {sim_collect::one_by_one, etcd_server},   {sim_collect::list, etcd_server},
      {sim_collect::list, etcd16_server},       {sim_collect::one_by_one, tcpstore_server},
      {sim_collect::get_many, tcpstore_server},
  };
  for (const auto& [collect, server] : rows)
    for (int n : {1000, 10000, 100000}) {
      sim_params p;
      p.workers = n;
      p.server = server;
      p.collect = collect;
      bench::registry().push_back({row_name(p),
                                   [p](std::size_t) { return simulated(p); },
                                   "",
                                   {},
                                   bench::config{1, n >= 100000 ? 1 : 3, 0, 0}});
    }
  return true;
}();

}  // namespace
