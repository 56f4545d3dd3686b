// etcd_kv against a real 3-member etcd cluster on loopback: a member frozen with SIGSTOP (it
// accepts connections and never answers) costs each operation's first call about one request
// timeout and later calls nothing; writes sent to it fail with transient errors and the retry
// lands on a healthy member; a get whose member freezes under its watch moves on within about
// two request timeouts without missing the put; killing the leader under a stream of operations
// (retried on transient errors, inserts recognised by reading back) delays none past 3 s.
#include <doctest/doctest.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <holdfast/handler/liveness.hpp>
#include <holdfast/kv/etcd.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/elapsed.hpp"
#include "support/etcd_client.hpp"
#include "support/etcd_cluster_case.hpp"
#include "support/thread_state.hpp"

using namespace std::chrono_literals;
using holdfast::etcd_kv;
using holdfast::etcd_options;
using holdfast::kv_namespace;
using clk = std::chrono::steady_clock;
using holdfast_test::frozen_member;
using holdfast_test::ms_since;
using holdfast_test::shared_cluster;
using holdfast_test::with_retries;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds request_timeout{1000};
// A first call pays at most two request timeouts (the frozen member's, and one more in case an
// election is under way); the margin covers a loaded 2-core machine.
constexpr long long first_call_ms = 2 * request_timeout.count() + 500;
// A call that skips the suspect pays no timeout: half the request timeout it would cost.
constexpr long long skipped_ms = request_timeout.count() / 2;

// The members' URLs, starting with member `first` and going round.
std::vector<std::string> urls_from(int first) {
  std::vector<std::string> urls = shared_cluster().urls();
  std::rotate(urls.begin(), urls.begin() + first, urls.end());
  return urls;
}

etcd_options options_for(std::vector<std::string> endpoints, milliseconds suspect_for = 10s) {
  etcd_options o = holdfast_test::etcd_client_options(std::move(endpoints), request_timeout);
  o.suspect_for = suspect_for;
  return o;
}

kv_namespace fresh_ns() { return holdfast_test::fresh_cluster_ns("cluster"); }

// Runs `op` twice on a client that has not met the frozen member yet: the first call within
// first_call_ms (it pays the timeout), the second, which skips the suspect, within skipped_ms.
void check_first_and_next(const std::string& name, etcd_kv& kv,
                          const std::function<void(etcd_kv&)>& op) {
  CAPTURE(name);
  auto t0 = clk::now();
  op(kv);
  CHECK(ms_since(t0) < first_call_ms);
  t0 = clk::now();
  op(kv);
  CHECK(ms_since(t0) < skipped_ms);
}

// Inserts under the handler's contract: after a transient failure the key is read back first,
// and the insert counts as done when it holds this writer's value.
bool insert_with_retries(etcd_kv& kv, const std::string& key, const std::string& value) {
  bool retried = false;
  auto mine = [&] { return kv.try_get(key) == std::optional<std::string>(value); };
  return with_retries([&] {
    const bool again = retried;
    retried = true;
    if (again && mine()) return true;
    return kv.insert(key, value) || (again && mine());  // applied late, after the read-back
  });
}

}  // namespace

TEST_CASE("etcd_cluster fixture: one leader, a put on one member is read on every member") {
  auto& c = shared_cluster();
  REQUIRE(c.size() == 3);
  c.wait_healthy(30s);
  const int leader = c.leader();
  CHECK((leader >= 0 && leader < 3));
  const kv_namespace ns = fresh_ns();
  etcd_kv(options_for({c.url(0)}), ns).put("hello", "world");
  for (int i = 0; i < c.size(); ++i)
    CHECK(etcd_kv(options_for({c.url(i)}), ns).try_get("hello") ==
          std::optional<std::string>("world"));
}

TEST_CASE("etcd_kv on a cluster: a frozen first endpoint costs one timeout, then is skipped") {
  auto& c = shared_cluster();
  c.wait_healthy(30s);
  const int first = (c.leader() + 1) % c.size();  // a follower: no election muddles the timing
  const kv_namespace ns = fresh_ns();
  const auto urls = urls_from(first);
  etcd_kv healthy(options_for({urls[1], urls[2]}), ns);
  healthy.put("k", "v");
  healthy.put("dir/a", "1");
  frozen_member f(first);
  auto fresh = [&] { return etcd_kv(options_for(urls), ns); };

  SUBCASE("reads fail over") {
    etcd_kv a = fresh(), b = fresh();
    check_first_and_next("try_get", a, [](etcd_kv& kv) {
      CHECK(kv.try_get("k") == std::optional<std::string>("v"));
    });
    check_first_and_next("list", b, [](etcd_kv& kv) { CHECK(kv.list("dir").size() == 1); });
  }

  SUBCASE("get returns a value put on a healthy member while it waits") {
    etcd_kv kv = fresh();
    std::thread putter([&] {
      // past the frozen range: the get is watching (its watch is open), observed, not assumed
      const auto opened = clk::now() + 10s;
      while (kv.stats().watch_opens == 0 && clk::now() < opened)
        std::this_thread::sleep_for(1ms);  // a bounded look, not an order
      CHECK(kv.stats().watch_opens == 1);
      try {
        healthy.put("later", "arrived");
      } catch (const std::exception&) {  // the get then times out: reported below
      }
    });
    auto t0 = clk::now();
    auto got = kv.get("later", 10s);
    auto ms = ms_since(t0);
    putter.join();
    CHECK(got == std::optional<std::string>("arrived"));
    CHECK(ms < first_call_ms);
    t0 = clk::now();
    CHECK(kv.get("later", 10s) == std::optional<std::string>("arrived"));
    CHECK(ms_since(t0) < skipped_ms);
  }

  SUBCASE("writes sent to it fail with a transient error; the retry succeeds elsewhere") {
    healthy.put("gone", "x");
    // Each write is made twice with the same effect, so a late apply by the thawed member
    // changes nothing; each returns true when it did its work.
    const std::vector<std::pair<const char*, std::function<bool(etcd_kv&)>>> writes = {
        {"put", [](etcd_kv& kv) { return kv.put("w/put", "mine"), true; }},
        {"insert", [](etcd_kv& kv) { return kv.insert("w/insert", "mine"); }},
        {"erase", [](etcd_kv& kv) { return kv.erase("gone"); }}};
    for (const auto& w : writes) {
      const std::string name = w.first;
      CAPTURE(name);
      etcd_kv kv = fresh();
      auto t0 = clk::now();
      try {
        const bool done = w.second(kv);  // another member took it: allowed, not today's policy
        CHECK(done);
      } catch (const std::exception& e) {
        INFO(e.what());
        CHECK(holdfast::is_transient_kv_error(e));
      }
      CHECK(ms_since(t0) < first_call_ms);
      t0 = clk::now();
      CHECK(w.second(kv));
      CHECK(ms_since(t0) < skipped_ms);
    }
    CHECK(healthy.try_get("w/put") == std::optional<std::string>("mine"));
    CHECK(healthy.try_get("w/insert") == std::optional<std::string>("mine"));
    CHECK_FALSE(healthy.try_get("gone").has_value());
  }

  SUBCASE("thawed, it serves again once suspect_for has passed") {
    // Endpoints [first, other follower, leader]: the frozen one is marked, the follower serves.
    const int leader = c.leader();
    const int other = 3 - first - leader;
    etcd_kv kv(options_for({c.url(first), c.url(other), c.url(leader)}, 1500ms), ns);
    CHECK(kv.try_get("k") == std::optional<std::string>("v"));
    f.thaw();
    std::this_thread::sleep_for(1500ms);  // a stall on purpose: its suspicion (1500 ms) runs out
    {
      frozen_member g(other);  // the current endpoint hangs: the leader serves
      CHECK(kv.try_get("k") == std::optional<std::string>("v"));
    }
    frozen_member l(leader);  // now the leader hangs: next round is `first`, healthy again
    auto t0 = clk::now();
    CHECK(kv.try_get("k") == std::optional<std::string>("v"));
    CHECK(ms_since(t0) < 3 * request_timeout.count() + 500);  // + an election under way
  }
}

TEST_CASE("etcd_kv on a cluster: a get whose member freezes under its watch moves on") {
  auto& c = shared_cluster();
  c.wait_healthy(30s);
  const int first = (c.leader() + 1) % c.size();
  const kv_namespace ns = fresh_ns();
  const auto urls = urls_from(first);
  etcd_kv kv(options_for(urls), ns);
  etcd_kv healthy(options_for({urls[1], urls[2]}), ns);
  CHECK_FALSE(kv.try_get("late").has_value());  // the client now sits on `first`

  std::optional<std::string> got;
  long long ms = -1;
  std::string failure;
  std::atomic<pid_t> tid{0};
  std::thread getter([&] {
    tid = holdfast_test::this_thread_id();
    auto t0 = clk::now();
    try {
      got = kv.get("late", 20s);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    ms = ms_since(t0);
  });
  // the get is watching on `first`: its watch is open and its thread observed asleep in poll()
  while (tid.load() == 0) std::this_thread::yield();
  const auto opened = clk::now() + 10s;
  while (kv.stats().watch_opens == 0 && clk::now() < opened) std::this_thread::sleep_for(1ms);
  CHECK(kv.stats().watch_opens == 1);
  CHECK(holdfast_test::wait_asleep_in_poll({tid.load()}, 10s));
  {
    frozen_member f(first);       // returns once the member is stopped
    healthy.put("late", "seen");  // the frozen watch never delivers it: the next range must
    getter.join();
  }
  CHECK_MESSAGE(failure.empty(), failure);
  CHECK(got == std::optional<std::string>("seen"));
  // The watch window (<= 1 request timeout) + the range that times out on the frozen member.
  CHECK(ms < 2 * request_timeout.count() + 1000);
}

TEST_CASE("etcd_kv on a cluster: killing the leader delays no operation past 3 s") {
  auto& c = shared_cluster();
  c.wait_healthy(30s);
  const int leader = c.leader();
  const kv_namespace ns = fresh_ns();
  std::atomic<bool> stop{false};
  std::atomic<int> after_kill{0};
  std::atomic<int> rounds_before[2] = {{0}, {0}};
  std::atomic<int> rounds_after[2] = {{0}, {0}};
  std::atomic<bool> killed{false};
  std::mutex mu;
  std::vector<std::string> problems;
  long long slowest = 0;
  auto note = [&](long long ms, const std::string& problem) {
    std::lock_guard<std::mutex> lock(mu);
    slowest = std::max(slowest, ms);
    if (!problem.empty()) problems.push_back(problem);
  };
  // Runs one operation (with its retries), noting how long it took and what went wrong.
  auto timed = [&](const std::function<std::string()>& op) {
    auto t0 = clk::now();
    std::string problem;
    try {
      problem = op();
    } catch (const std::exception& e) {
      problem = e.what();
    }
    note(ms_since(t0), problem);
    return problem.empty();
  };
  auto worker = [&](int id) {  // worker 0 starts on the leader, worker 1 on a follower
    etcd_kv kv(options_for(urls_from((leader + id) % c.size())), ns);
    for (int i = 0; !stop; ++i) {
      const std::string key = "w" + std::to_string(id) + "/" + std::to_string(i);
      const std::string value = "writer " + std::to_string(id) + " op " + std::to_string(i);
      const bool ok =
          timed([&] { return insert_with_retries(kv, key, value) ? "" : "insert lost: " + key; }) &&
          timed([&] { return with_retries([&] { kv.put(key + "/p", value); }), std::string(); }) &&
          timed([&] {
            auto got = with_retries([&] { return kv.get(key, 1s); });
            return got == std::optional<std::string>(value) ? "" : "get missed " + key;
          });
      if (!ok) {
        rounds_after[id] = 1 << 20;  // a problem: nothing more to wait for from this worker
        return;
      }
      if (killed) {
        ++after_kill;
        ++rounds_after[id];
      } else {
        ++rounds_before[id];
      }
    }
  };
  // Waits up to `s` for `done` (a bounded look at the workers' round counters).
  auto wait_for = [](const std::function<bool()>& done, std::chrono::seconds s) {
    const auto end = clk::now() + s;
    while (!done() && clk::now() < end) std::this_thread::sleep_for(1ms);
    return done();
  };
  std::thread w1(worker, 0), w2(worker, 1);
  // Both workers have done rounds on the healthy cluster (each is mid-operation at the kill).
  CHECK(wait_for([&] { return rounds_before[0] >= 2 && rounds_before[1] >= 2; }, 20s));
  c.kill(leader);
  killed = true;
  // Each worker finishes rounds across the election (or stops at a problem, reported below).
  CHECK(wait_for([&] { return rounds_after[0] >= 3 && rounds_after[1] >= 3; }, 30s));
  stop = true;
  w1.join();
  w2.join();
  c.restart(leader);  // leave the cluster whole for later cases
  c.wait_healthy(30s);
  CHECK_MESSAGE(problems.empty(), (problems.empty() ? std::string() : problems.front()));
  CHECK(after_kill > 0);
  CHECK(slowest < 3000);
}

// Liveness over a cluster whose member the workers prefer (first in their endpoint lists)
// hangs: it accepts connections and never answers (SIGSTOP) while the other two keep quorum.
// Two workers' monitors (a ring of two, each on a client and lease of its own) with TTL 2 s and
// the default 5 s request timeout (a keep-alive that waited it out would lose the lease): for
// 2 x TTL no liveness key is deleted (an observer on the healthy members watches them) and each
// lease is the same one, alive. Once the member resumes, both keys say "alive" (a leader that
// resumes may revoke the leases the new leader kept, etcd-io/etcd#15247 in the etcd 3.4.23 the
// tests run: the leases are granted again and the keys put back) and nobody is named frozen.
TEST_CASE("liveness on a cluster: the preferred member hanging for 2 x TTL names nobody") {
  auto& c = shared_cluster();
  constexpr auto ttl = 2s;
  for (const std::string which : {"a follower", "the leader"}) {
    CAPTURE(which);
    c.wait_healthy(30s);
    const int leader = c.leader();
    const int member = which == "the leader" ? leader : (leader + 1) % c.size();
    const kv_namespace ns = fresh_ns();
    const std::string run = "keepalive-" + ns.incarnation();
    const std::string scope = "holdfast/" + run + "/";
    const auto urls = urls_from(member);
    etcd_options o = holdfast_test::etcd_client_options(urls, 5000ms);  // the default request
    o.lease_ttl = ttl;
    o.leased_prefix = holdfast::liveness_leased_prefix(run);
    etcd_kv observer(options_for({urls[1], urls[2]}), ns);
    auto w = observer.watch(scope + "live");
    std::mutex mu;
    std::condition_variable named;
    int verdicts = 0;
    std::vector<etcd_kv> kvs{etcd_kv(o, ns), etcd_kv(o, ns)};
    std::vector<std::unique_ptr<holdfast::liveness_monitor<etcd_kv>>> monitors;
    for (int t = 0; t < 2; ++t)
      monitors.push_back(std::make_unique<holdfast::liveness_monitor<etcd_kv>>(
          kvs[static_cast<std::size_t>(t)], scope, t, 2, [&](int, milliseconds) {
            std::lock_guard<std::mutex> lock(mu);
            ++verdicts;
            named.notify_all();
          }));
    for (auto& m : monitors) REQUIRE(m->wait_successor_seen(10s));
    const std::int64_t leases[2] = {kvs[0].lease_id(), kvs[1].lease_id()};
    std::vector<std::string> deleted;  // liveness keys deleted while the member hangs
    (void)w.take();                    // the snapshot
    {
      frozen_member f(member);
      const auto until = clk::now() + 2 * ttl;
      while (clk::now() < until) {
        pollfd p{w.fd(), POLLIN, 0};
        ::poll(&p, 1, 100);
        for (const auto& e : w.take().events)
          if (!e.value) deleted.push_back(e.key);
      }
      for (int t = 0; t < 2; ++t) {
        CAPTURE(t);
        CHECK(kvs[static_cast<std::size_t>(t)].lease_alive());
        CHECK(kvs[static_cast<std::size_t>(t)].lease_id() == leases[t]);  // kept all along
      }
    }
    CHECK_MESSAGE(deleted.empty(), "deleted while the member hung: "
                                       << (deleted.empty() ? std::string() : deleted.front()));
    // Resumed: both keys alive (kept, or put back under a new lease), then no verdict within
    // the monitors' grace (TTL / 2) and a margin.
    auto both_alive = [&] {
      for (int t = 0; t < 2; ++t) {
        auto v = observer.try_get(holdfast::liveness_key(scope, t));
        if (!v || v->rfind("alive", 0) != 0 || !kvs[static_cast<std::size_t>(t)].lease_alive())
          return false;
      }
      return true;
    };
    const auto back = clk::now() + 2 * ttl;
    while (!both_alive() && clk::now() < back)
      std::this_thread::sleep_for(50ms);  // a bounded look at a condition, with a deadline
    CHECK(both_alive());
    std::unique_lock<std::mutex> lock(mu);
    CHECK_FALSE(named.wait_for(lock, ttl / 2 + 500ms, [&] { return verdicts > 0; }));
  }
}
