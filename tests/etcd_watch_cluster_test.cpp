// etcd_kv's long-lived watch on a real 3-member etcd cluster on loopback: when the member the
// watch streams from is frozen with SIGSTOP (it keeps the connection and never answers, so the
// stream just goes quiet), the watch's health probe times out, the member becomes suspect and
// the watch resumes on another member from its last revision: a put made through a healthy
// member while the watch was stuck arrives within about 2 probe intervals + one request
// timeout, exactly once, with a follower frozen and with the leader frozen (an election).
// Heavy (three members): built with HOLDFAST_HEAVY_TESTS, run serially.
#include <doctest/doctest.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <holdfast/kv/etcd.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/elapsed.hpp"
#include "support/etcd_client.hpp"
#include "support/etcd_cluster_case.hpp"
#include "support/watch_follow.hpp"

using namespace std::chrono_literals;
using holdfast::etcd_kv;
using holdfast::etcd_options;
using holdfast::kv_event;
using holdfast::kv_namespace;
using clk = std::chrono::steady_clock;
using holdfast_test::ms_since;
using holdfast_test::shared_cluster;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds request_timeout{1000};  // probes every max(1 s, 1 s / 2) = 1 s

etcd_options options_for(std::vector<std::string> endpoints) {
  return holdfast_test::etcd_client_options(std::move(endpoints), request_timeout);
}

kv_namespace fresh_ns() { return holdfast_test::fresh_cluster_ns("watch-cluster"); }

// Follows the watch as the handler does until an event for `key` arrived or `timeout` passed;
// returns every event seen.
std::vector<kv_event> follow_until(etcd_kv::watcher& w, const std::string& key,
                                   milliseconds timeout) {
  return holdfast_test::follow_watch(w, timeout, [&](const std::vector<kv_event>& all) {
    return std::any_of(all.begin(), all.end(), [&](const kv_event& e) { return e.key == key; });
  });
}

// Puts through the healthy members, retrying transient errors (an election) for up to 10 s.
void put_retrying(etcd_kv& kv, const std::string& key, const std::string& value) {
  holdfast_test::with_retries([&] { kv.put(key, value); });
}

}  // namespace

TEST_CASE("etcd_kv watch on a cluster: a frozen member's watch moves and the put arrives") {
  auto& c = shared_cluster();
  c.wait_healthy(30s);
  const int leader = c.leader();
  int member = -1;
  SUBCASE("a follower frozen") { member = (leader + 1) % c.size(); }
  SUBCASE("the leader frozen") { member = leader; }
  REQUIRE(member >= 0);
  CAPTURE(member);

  const kv_namespace ns = fresh_ns();
  std::vector<std::string> urls = c.urls();
  std::rotate(urls.begin(), urls.begin() + member, urls.end());  // the frozen one first
  etcd_kv kv(options_for(urls), ns);
  etcd_kv healthy(options_for({urls[1], urls[2]}), ns);
  auto w = kv.watch("ctl");
  REQUIRE(w.endpoint() == c.url(member));
  CHECK(w.take().complete);
  healthy.put("ctl/before", "1");
  REQUIRE(follow_until(w, "ctl/before", 5000ms).size() == 1);
  const auto before = kv.stats();

  holdfast_test::frozen_member frozen(member);
  const auto t0 = clk::now();
  put_retrying(healthy, "ctl/k", "while frozen");
  auto events = follow_until(w, "ctl/k", 10000ms);
  const long long ms = ms_since(t0);
  const auto after = kv.stats();
  MESSAGE("moved from " << c.url(member) << " to " << w.endpoint() << " and delivered in " << ms
                        << " ms; probes " << after.probes - before.probes << ", watch opens "
                        << after.watch_opens - before.watch_opens);
  REQUIRE(events.size() == 1);
  CHECK(events[0].value == "while frozen");
  CHECK(w.endpoint() != c.url(member));
  CHECK(w.fd() >= 0);
  // 2 probe intervals + the probe's request timeout, with room for an election and a busy host.
  CHECK(ms < 2 * w.probe_interval().count() + request_timeout.count() + 1500);
  CHECK(after.probes > before.probes);
  CHECK(after.watch_opens > before.watch_opens);

  put_retrying(healthy, "ctl/after", "2");  // and it watches on, from the new member
  events = follow_until(w, "ctl/after", 5000ms);
  REQUIRE(events.size() == 1);
  CHECK(events[0].value == "2");
}
