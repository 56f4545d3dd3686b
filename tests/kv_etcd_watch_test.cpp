// etcd_kv's long-lived watch (etcd_kv::watch, the handler's way of waiting) against a real etcd on
// loopback: the first take is a snapshot of the prefix; a put by another client wakes poll() on
// fd() (well before a 10 s poll timeout) and take() returns it; an erase is nullopt; keys below the
// prefix are seen at any depth, keys outside it (or in another namespace) are not; an idle watch
// costs at most one request per second (stats()); after the server is killed and restarted on its
// data directory the watch resumes and delivers every later change exactly once, in order; an
// erase_prefix of 5 keys (5 events at one revision) is 5 erases, live and after a resume; a resume
// past a compaction gives a new snapshot; watch() returns at once (not after request_timeout)
// whether the stream's first message comes with the HTTP head or after it. The 3-member cases (a
// frozen member) are in etcd_watch_cluster_test.cpp. An any_kv holding an etcd_kv
// (make_kv("etcd://...")) keeps the watch and the client's stats.
#include <doctest/doctest.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <holdfast/kv/any.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/url.hpp>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/elapsed.hpp"
#include "support/etcd_client.hpp"
#include "support/etcd_cluster.hpp"
#include "support/etcd_server.hpp"
#include "support/http_server.hpp"
#include "support/watch_follow.hpp"

using namespace std::chrono_literals;
using holdfast::etcd_kv;
using holdfast::etcd_options;
using holdfast::kv_event;
using holdfast::kv_namespace;
using clk = std::chrono::steady_clock;
using holdfast_test::ms_since;
using std::chrono::milliseconds;

static_assert(holdfast::has_kv_watch_v<etcd_kv>, "etcd_kv offers watch()");

namespace {

const kv_namespace ns0("run", 0);

etcd_options options_for(std::vector<std::string> endpoints, milliseconds request = 2000ms) {
  return holdfast_test::etcd_client_options(std::move(endpoints), request);
}

// "key=value" or "key=<erased>", for comparing event lists in messages.
std::string show(const std::vector<kv_event>& events) {
  std::string out;
  for (const auto& e : events)
    out += (out.empty() ? "" : " ") + e.key + "=" + (e.value ? *e.value : "<erased>");
  return out;
}

// Follows a watch as the handler's watcher does (support/watch_follow.hpp); etcd never asks for
// a re-read: it gives snapshots.
template <class Done>
std::vector<kv_event> follow(etcd_kv::watcher& w, milliseconds timeout, Done done,
                             bool* snapshot = nullptr) {
  bool resync = false;
  auto all = holdfast_test::follow_watch(w, timeout, done, snapshot, &resync);
  CHECK_FALSE(resync);
  return all;
}

// Until an event for `key` arrived.
auto until_key(const std::string& key) {
  return [key](const std::vector<kv_event>& evs) {
    return std::any_of(evs.begin(), evs.end(), [&](const kv_event& e) { return e.key == key; });
  };
}

// Drains what the watch holds now (the stream's first messages).
void settle(etcd_kv::watcher& w) {
  follow(w, 200ms, [](const std::vector<kv_event>&) { return false; });
}

// The store's current revision and a compaction to it, through the gateway directly.
std::int64_t current_revision(const std::string& url) {
  namespace hd = holdfast::detail;
  auto r = hd::http_call(hd::parse_http_url(url),
                         hd::http_request{"POST", "/v3/kv/range", {}, "{\"key\":\"AA==\"}"},
                         hd::http_timeouts{500ms, 2000ms});
  hd::json_value v = hd::parse_json(r.body, url);
  const hd::json_value* header = v.find("header");
  return hd::etcd_int(header ? header->find("revision") : nullptr);
}
void compact(const std::string& url, std::int64_t revision) {
  namespace hd = holdfast::detail;
  auto r = hd::http_call(
      hd::parse_http_url(url),
      hd::http_request{"POST",
                       "/v3/kv/compaction",
                       {},
                       "{\"revision\":\"" + std::to_string(revision) + "\",\"physical\":true}"},
      hd::http_timeouts{500ms, 5000ms});
  REQUIRE_MESSAGE(r.status == 200, r.body);
}

// Runs `op` until it does not throw a transient error (a restarted server may still be electing
// itself); at most `timeout`.
template <class Op>
void retrying(Op op, milliseconds timeout = 10000ms) {
  const auto deadline = clk::now() + timeout;
  for (;;) {
    try {
      op();
      return;
    } catch (const holdfast::error& e) {
      if (!holdfast::is_transient_kv_error(e) || clk::now() >= deadline) throw;
      std::this_thread::sleep_for(50ms);
    }
  }
}

}  // namespace

TEST_CASE("etcd_kv watch: first take is a snapshot and a put wakes poll, well before its timeout") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}), ns0);
  etcd_kv writer(options_for({server.url()}), ns0);  // another client
  writer.put("ctl/before", "old");

  auto w = kv.watch("ctl");
  CHECK(w.fd() >= 0);
  CHECK(w.endpoint() == server.url());
  CHECK(w.buffered());  // the snapshot is due at once
  auto first = w.take();
  CHECK(first.complete);
  CHECK_FALSE(first.resync);
  REQUIRE(first.events.size() == 1);  // "ctl/before" predates the watch: in the snapshot
  CHECK(first.events[0].key == "ctl/before");
  CHECK(first.events[0].value == "old");
  CHECK(kv.stats().bytes_read > 0);  // the range's answer and the stream's first message
  settle(w);
  CHECK_FALSE(w.take().complete);

  long long worst_us = 0, worst_from_start_us = 0;
  auto us_since = [](clk::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(clk::now() - t).count();
  };
  for (int i = 0; i < 5; ++i) {
    const std::string value = "v" + std::to_string(i);
    const auto start = clk::now();
    writer.put("ctl/k", value);
    const auto t0 = clk::now();  // the put is applied: the watch must wake on it
    pollfd p{w.fd(), POLLIN, 0};
    const int n = ::poll(&p, 1, 10000);
    const long long us = us_since(t0);
    worst_us = std::max(worst_us, us);
    worst_from_start_us = std::max<long long>(worst_from_start_us, us_since(start));
    REQUIRE(n == 1);
    CHECK(us < 2000000);  // woken by the put: a fifth of poll()'s 10 s timeout tells that apart
    auto c = w.take();
    if (c.events.empty())  // the message may arrive in two pieces
      c = holdfast::kv_changes{follow(w, 1000ms, until_key("ctl/k")), false};
    REQUIRE(c.events.size() == 1);
    CHECK(c.events[0].key == "ctl/k");
    CHECK(c.events[0].value == value);
    CHECK_FALSE(c.resync);
  }
  MESSAGE("worst wake latency: " << worst_us << " us after the put returned, "
                                 << worst_from_start_us << " us after it started");
}

TEST_CASE("etcd_kv watch: through an any_kv (make_kv) a snapshot, then a put wakes poll") {
  holdfast_test::etcd_server server;
  holdfast::any_kv kv =
      holdfast::make_kv("etcd://127.0.0.1:" + std::to_string(server.port()) + "/holdfast", ns0);
  etcd_kv writer(options_for({server.url()}), ns0);  // another client, same keys
  writer.put("ctl/before", "old");
  REQUIRE(kv.supports(holdfast::kv_op::watch));
  holdfast::any_kv_watch w = kv.watch("ctl");
  CHECK(w.fd() >= 0);
  auto first = holdfast_test::follow_watch(w, 5000ms, until_key("ctl/before"));
  REQUIRE(first.size() == 1);
  CHECK(first[0].value == "old");
  w.follow({"ctl/k"});  // etcd watches the whole prefix: ignored
  const auto before = kv.stats_as<holdfast::etcd_stats>();
  REQUIRE(before);
  CHECK(before->watch_opens == 1);  // the erased watch is the client's own
  writer.put("ctl/k", "v");
  pollfd p{w.fd(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  auto events = holdfast_test::follow_watch(w, 5000ms, until_key("ctl/k"));
  REQUIRE(events.size() == 1);
  CHECK(events[0].value == "v");
  const auto after = kv.stats_as<holdfast::etcd_stats>();
  REQUIRE(after);
  CHECK(after->connections == before->connections);  // the stream, no new connection
  CHECK(after->watch_opens == before->watch_opens);
}

TEST_CASE("etcd_kv watch: erase is nullopt, nested keys are seen, keys outside are not") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}), ns0);
  etcd_kv writer(options_for({server.url()}), ns0);
  etcd_kv other_ns = writer.with_namespace(kv_namespace("run", 1));
  auto w = kv.watch("ctl");
  CHECK(w.take().complete);

  writer.put("ctl/a/b/c", "1");
  writer.put("ctlx", "outside");    // a sibling, not below "ctl/"
  writer.put("ctl", "the prefix");  // the prefix itself is not below it
  writer.put("other/k", "outside");
  other_ns.put("ctl/k", "another namespace");
  writer.put("ctl/a", "2");
  CHECK(writer.erase("ctl/a/b/c"));
  writer.put("ctl/end", "");
  auto events = follow(w, 5000ms, until_key("ctl/end"));
  INFO(show(events));
  REQUIRE(events.size() == 4);
  CHECK(events[0].key == "ctl/a/b/c");
  CHECK(events[0].value == "1");
  CHECK(events[1].key == "ctl/a");
  CHECK(events[1].value == "2");
  CHECK(events[2].key == "ctl/a/b/c");
  CHECK_FALSE(events[2].value.has_value());
  CHECK(events[3].key == "ctl/end");
  CHECK(events[3].value == "");  // an empty value is a value, not an erase

  auto all = kv.watch("");  // every key of the namespace
  CHECK(all.take().complete);
  writer.put("top", "t");
  other_ns.put("top", "not ours");
  auto seen = follow(all, 5000ms, until_key("top"));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].value == "t");
}

TEST_CASE("etcd_kv watch: an idle watch costs at most one request per second") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}, 2000ms), ns0);  // probes every max(1 s, 2 s / 2)
  auto w = kv.watch("ctl");
  CHECK(w.probe_interval() == 1000ms);
  w.take();
  settle(w);
  const int fd = w.fd();
  const auto before = kv.stats();
  const auto t0 = clk::now();
  auto events = follow(w, 3000ms, [](const std::vector<kv_event>&) { return false; });
  const double seconds = static_cast<double>(ms_since(t0)) / 1000.0;
  const auto after = kv.stats();
  const auto requests = after.requests - before.requests;
  MESSAGE("idle: " << requests << " requests in " << seconds << " s ("
                   << static_cast<double>(requests) / seconds << "/s), "
                   << after.probes - before.probes << " probes, "
                   << after.connections - before.connections << " new connections");
  CHECK(events.empty());
  CHECK(requests <= 3);                                // <= 1 per second
  CHECK(after.probes - before.probes == requests);     // nothing but probes
  CHECK(after.probes - before.probes >= 2);            // and they do run
  CHECK(after.connections - before.connections <= 1);  // one keep-alive, reused
  CHECK(after.watch_opens == before.watch_opens);      // the stream stays open
  CHECK(w.fd() == fd);
  CHECK(w.due() > clk::now());
}

TEST_CASE("etcd_kv watch: with a lease, the keep-alives are the probes and nothing else is sent") {
  holdfast_test::etcd_server server;
  etcd_options o = options_for({server.url()}, 2000ms);
  o.lease_ttl = std::chrono::seconds(3);  // a keep-alive every second, on the watched endpoint
  o.leased_prefix = "live";
  etcd_kv kv(o, ns0);
  auto w = kv.watch("ctl");
  CHECK(w.probe_interval() == 1500ms);  // 1.5 keep-alive periods
  w.take();
  settle(w);
  const auto before = kv.stats();
  const auto t0 = clk::now();
  auto events = follow(w, 3500ms, [](const std::vector<kv_event>&) { return false; });
  const double seconds = static_cast<double>(ms_since(t0)) / 1000.0;
  const auto after = kv.stats();
  const auto requests = after.requests - before.requests;
  MESSAGE("idle with a lease: " << requests << " requests in " << seconds << " s, "
                                << after.probes - before.probes << " probes");
  CHECK(events.empty());
  CHECK(after.probes == before.probes);  // the keep-alives answered for the endpoint
  CHECK(requests >= 2);                  // the keep-alives themselves
  CHECK(requests <= 5);                  // one per second, nothing more
  CHECK(after.watch_opens == before.watch_opens);
}

TEST_CASE("etcd_kv watch: resumes after a server restart, each change once and in order") {
  holdfast_test::etcd_cluster server(1);  // one member that can be killed and restarted
  etcd_kv kv(options_for({server.url(0)}, 1000ms), ns0);
  etcd_kv writer(options_for({server.url(0)}, 1000ms), ns0);
  auto w = kv.watch("ctl");
  CHECK(w.take().complete);
  writer.put("ctl/k", "1");
  auto events = follow(w, 5000ms, until_key("ctl/k"));
  REQUIRE(events.size() == 1);
  const auto opens = kv.stats().watch_opens;

  server.kill(0);
  follow(w, 5000ms, [&](const std::vector<kv_event>&) { return w.fd() < 0; });
  REQUIRE(w.fd() == -1);  // disconnected: the caller sleeps until due()
  CHECK(w.endpoint().empty());
  CHECK(w.due() - clk::now() <= w.probe_interval());  // the next attempt is bounded

  server.restart(0);
  retrying([&] { writer.put("ctl/k", "2"); });  // before the watch reconnects
  bool snapshot = false;
  events = follow(
      w, 10000ms, [](const std::vector<kv_event>& evs) { return !evs.empty(); }, &snapshot);
  REQUIRE(w.fd() >= 0);
  retrying([&] { writer.put("ctl/k", "3"); });
  retrying([&] { writer.put("ctl/j", "4"); });
  retrying([&] { writer.erase("ctl/k"); });
  retrying([&] { writer.put("ctl/end", "5"); });
  auto more = follow(w, 10000ms, until_key("ctl/end"), &snapshot);
  events.insert(events.end(), more.begin(), more.end());
  INFO(show(events));
  CHECK_FALSE(snapshot);  // resumed: nothing was missed, no re-range
  REQUIRE(events.size() == 5);
  CHECK(show(events) == "ctl/k=2 ctl/k=3 ctl/j=4 ctl/k=<erased> ctl/end=5");
  CHECK(kv.stats().watch_opens > opens);
}

TEST_CASE("etcd_kv watch: a resume past a compaction gives a new snapshot") {
  holdfast_test::etcd_cluster server(1);
  etcd_kv kv(options_for({server.url(0)}, 1000ms), ns0);
  etcd_kv writer(options_for({server.url(0)}, 1000ms), ns0);
  auto w = kv.watch("ctl");
  CHECK(w.take().complete);
  writer.put("ctl/k", "1");
  REQUIRE(follow(w, 5000ms, until_key("ctl/k")).size() == 1);
  const std::int64_t seen = w.revision();

  server.kill(0);
  follow(w, 5000ms, [&](const std::vector<kv_event>&) { return w.fd() < 0; });
  REQUIRE(w.fd() == -1);
  server.restart(0);
  retrying([&] { writer.put("ctl/k", "2"); });  // missed by the watch: compacted away
  retrying([&] { writer.put("ctl/k", "3"); });
  const std::int64_t now = current_revision(server.url(0));
  REQUIRE(now > seen + 1);
  compact(server.url(0), now);

  bool snapshot = false;
  auto events = follow(
      w, 10000ms, [&](const std::vector<kv_event>&) { return snapshot && w.fd() >= 0; }, &snapshot);
  INFO(show(events));
  CHECK(snapshot);
  CHECK(show(events) == "ctl/k=3");  // what the key holds now; "2" is not replayed
  CHECK(w.revision() >= now);
  writer.put("ctl/k", "4");  // and it watches on
  events = follow(w, 5000ms, until_key("ctl/k"), &snapshot);
  REQUIRE(events.size() == 1);
  CHECK(events[0].value == "4");
}

TEST_CASE("etcd_kv watch: watch() returns at once, not after request_timeout") {
  // Regression: opening a watch waited request_timeout when the stream's first message (the
  // "created" one) arrived in the same read as the HTTP head.
  // A fifth of the 5 s request_timeout it would wait out (not 500 ms: a loaded 2-core machine).
  constexpr milliseconds bound = 1000ms;
  SUBCASE("a real etcd") {
    holdfast_test::etcd_server server;
    etcd_kv writer(options_for({server.url()}, 5000ms), ns0);
    writer.put("ctl/before", "old");
    long long worst = 0;
    for (int i = 0; i < 5; ++i) {
      etcd_kv kv(options_for({server.url()}, 5000ms), ns0);  // a new client: a new connection
      const auto t0 = clk::now();
      auto w = kv.watch(i % 2 ? "ctl" : "empty");
      const long long ms = ms_since(t0);
      worst = std::max(worst, ms);
      CHECK(ms < bound.count());
      CHECK(w.fd() >= 0);  // connected, not left to retry
      CHECK(w.take().complete);
      CHECK(kv.stats().watch_opens == 1);
      auto again = kv.watch("ctl");  // a second watch on the same client
      CHECK(ms_since(t0) < 2 * bound.count());
      CHECK(again.fd() >= 0);
    }
    MESSAGE("real etcd: the slowest of 5 watch() calls took " << worst << " ms");
  }
  SUBCASE("a fake server: the first message in the head's packet, or after it") {
    const std::string created = R"({"result":{"header":{"revision":"5"},"created":true}})"
                                "\n";
    for (bool together : {true, false}) {
      const std::string how =
          together ? "head and first message in one write" : "first message 20 ms after the head";
      INFO(how);
      holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
        if (r.target == "/v3/kv/range")
          return holdfast_test::reply(200, R"({"header":{"revision":"5"}})");
        holdfast_test::reply s;
        if (together) {
          s.then(0ms, holdfast_test::reply::chunked_head() + holdfast_test::reply::chunk(created));
        } else {
          s.then(0ms, holdfast_test::reply::chunked_head());
          s.then(20ms, holdfast_test::reply::chunk(created));
        }
        return s.keep_open();
      });
      etcd_kv kv(options_for({fake.url()}, 5000ms), ns0);
      const auto t0 = clk::now();
      auto w = kv.watch("ctl");
      const long long ms = ms_since(t0);
      MESSAGE(how << ": watch() took " << ms << " ms");
      CHECK(ms < bound.count());
      CHECK(w.fd() >= 0);
      CHECK(w.endpoint() == fake.url());
      CHECK(w.revision() == 5);
      auto c = w.take();
      CHECK(c.complete);
      CHECK(c.events.empty());
      CHECK(fake.request_count() == 2);  // range, watch
    }
  }
}

namespace {

// What a cache built from a watch's events holds: the snapshot (a complete take) replaces it,
// each put sets its key, each erase removes it.
struct event_cache {
  std::map<std::string, std::string> keys;
  void apply(const std::vector<kv_event>& events) {
    for (const auto& e : events)
      if (e.value)
        keys[e.key] = *e.value;
      else
        keys.erase(e.key);
  }
};

// Erase events in `events`.
std::size_t erases(const std::vector<kv_event>& events) {
  return static_cast<std::size_t>(
      std::count_if(events.begin(), events.end(), [](const kv_event& e) { return !e.value; }));
}

const std::vector<std::string> five_keys = {"ctl/a", "ctl/b", "ctl/c/d", "ctl/e", "ctl/f"};

}  // namespace

// Issue 32, item 3: a deleterange of N keys (erase_prefix; a lease expiry too) is N events at
// ONE revision; the watch delivered the first and dropped the others as "delivered already",
// so a cache built from the events kept deleted keys. Invariant: every event of a revision is
// delivered, exactly once, live and across a resume.
TEST_CASE("etcd_kv watch: erase_prefix of 5 keys (one revision) delivers 5 erases") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}), ns0);
  etcd_kv writer(options_for({server.url()}), ns0);
  for (const auto& k : five_keys) writer.put(k, "v");
  auto w = kv.watch("ctl");
  event_cache cache;
  auto first = w.take();
  REQUIRE(first.complete);
  cache.apply(first.events);
  REQUIRE(cache.keys.size() == 5);

  REQUIRE(writer.erase_prefix("ctl") == 5);
  writer.put("ctl/end", "after");  // a later revision: its event ends the follow
  auto events = follow(w, 5000ms, until_key("ctl/end"));
  INFO(show(events));
  cache.apply(events);
  CHECK(erases(events) == 5);
  CHECK(show(events) ==
        "ctl/a=<erased> ctl/b=<erased> ctl/c/d=<erased> ctl/e=<erased> "
        "ctl/f=<erased> ctl/end=after");
  REQUIRE(cache.keys.size() == 1);  // no deleted key left behind
  CHECK(cache.keys.begin()->first == "ctl/end");
}

TEST_CASE(
    "etcd_kv watch: a resume delivers every erase of an erase_prefix made while it was down") {
  holdfast_test::etcd_cluster server(1);
  etcd_kv kv(options_for({server.url(0)}, 1000ms), ns0);
  etcd_kv writer(options_for({server.url(0)}, 1000ms), ns0);
  auto w = kv.watch("ctl");
  event_cache cache;
  cache.apply(w.take().events);
  for (const auto& k : five_keys) writer.put(k, "v");
  auto events = follow(w, 5000ms, [](const std::vector<kv_event>& e) { return e.size() == 5; });
  cache.apply(events);
  REQUIRE(cache.keys.size() == 5);

  server.kill(0);
  follow(w, 5000ms, [&](const std::vector<kv_event>&) { return w.fd() < 0; });
  REQUIRE(w.fd() == -1);
  server.restart(0);
  // While the watch is down (it reconnects only in take()): 5 erases at one revision, then a put.
  std::size_t erased = 0;
  retrying([&] { erased = writer.erase_prefix("ctl"); });
  CHECK(erased == 5);
  retrying([&] { writer.put("ctl/end", "after"); });
  bool snapshot = false;
  events = follow(w, 10000ms, until_key("ctl/end"), &snapshot);
  INFO(show(events));
  CHECK_FALSE(snapshot);  // resumed, not re-ranged: the events themselves
  cache.apply(events);
  CHECK(erases(events) == 5);
  REQUIRE(cache.keys.size() == 1);
  CHECK(cache.keys.begin()->first == "ctl/end");
}
