// etcd_kv beyond the shared contract: failures (server stopped, hung, garbage, unreachable
// endpoints) each end in a clear holdfast::error within their timeout; failover; the watch is
// one request (no polling); leases keep a live client's leased keys (below leased_prefix) and
// drop a dead one's, and never go on another key; the fixture fails (never skips) without etcd.
#include <doctest/doctest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <holdfast/kv/etcd.hpp>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <holdfast/testing/fault_io.hpp>

#include "support/child.hpp"
#include "support/elapsed.hpp"
#include "support/etcd_client.hpp"
#include "support/etcd_server.hpp"
#include "support/expect_error.hpp"
#include "support/fault_sweep.hpp"
#include "support/http_server.hpp"
#include "support/thread_state.hpp"

using namespace std::chrono_literals;
using holdfast::etcd_kv;
using holdfast::etcd_options;
using holdfast::kv_namespace;
using holdfast_test::contains;
using holdfast_test::error_from;
using holdfast_test::ms_since;
using holdfast_test::reply;
using clk = std::chrono::steady_clock;

namespace {

const kv_namespace ns0("run", 0);

etcd_options options_for(std::vector<std::string> endpoints,
                         std::chrono::milliseconds connect = 500ms,
                         std::chrono::milliseconds request = 3000ms) {
  return holdfast_test::etcd_client_options(std::move(endpoints), request, connect);
}

// Waits (polling, bounded by `timeout`) until `key` is absent.
bool wait_gone(etcd_kv& kv, const std::string& key, std::chrono::milliseconds timeout) {
  auto deadline = clk::now() + timeout;
  while (clk::now() < deadline) {
    if (!kv.try_get(key)) return true;
    std::this_thread::sleep_for(100ms);  // a bounded look at a condition, with a deadline
  }
  return !kv.try_get(key);
}

}  // namespace

TEST_CASE("etcd_kv: stopping the server fails a blocked get and later calls, quickly") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}), ns0);
  kv.put("before", "ok");
  std::atomic<pid_t> tid{0};
  std::string what;
  int errnum = 0;
  long long elapsed = -1;
  std::thread waiter([&] {
    tid = holdfast_test::this_thread_id();
    auto t0 = clk::now();
    try {
      kv.get("never/inserted", 8s);
    } catch (const holdfast::error& e) {
      what = e.what();
      errnum = e.errnum();
    }
    elapsed = ms_since(t0);
  });
  while (tid.load() == 0) std::this_thread::yield();
  // the get is blocked in its watch: the watch is open and the thread observed asleep in poll()
  const auto opened = clk::now() + 10s;
  while (kv.stats().watch_opens == 0 && clk::now() < opened) std::this_thread::sleep_for(1ms);
  CHECK(kv.stats().watch_opens == 1);
  CHECK(holdfast_test::wait_asleep_in_poll({tid.load()}, 10s));
  server.stop();
  waiter.join();
  INFO(what);
  CHECK(errnum != 0);     // an error, not a timeout value
  CHECK(elapsed < 6000);  // long before the get's 8 s
  CHECK(contains(what, "etcd get 'never/inserted'"));

  auto t0 = clk::now();
  auto e = error_from([&] { kv.put("after", "x"); });
  CHECK(ms_since(t0) < 500 * 1.5);  // refused at once, not a connect timeout (500 ms) or more
  CHECK(e.errnum() == ECONNREFUSED);
  CHECK(contains(e.what(), "etcd put 'after'"));
  CHECK(contains(e.what(), "no etcd endpoint reachable"));
  CHECK(contains(e.what(), server.url()));
}

TEST_CASE("etcd_kv: a hung server (SIGSTOP) times out each call within its request timeout") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}, 500ms, 600ms), ns0);
  etcd_kv patient(options_for({server.url()}, 2000ms, 10000ms), ns0);  // for set-up and checks
  patient.put("k", "v");
  server.freeze();
  struct resume {
    holdfast_test::etcd_server& s;
    ~resume() { s.thaw(); }
  } resume_on_exit{server};
  for (int i = 0; i < 2; ++i) {
    auto t0 = clk::now();
    auto e = i == 0 ? error_from([&] { kv.insert("k2", "v"); })
                    : error_from([&] { kv.get("k3", 2000ms); });
    auto ms = ms_since(t0);
    INFO(std::string(e.what()));
    CHECK(e.errnum() == ETIMEDOUT);
    CHECK(ms >= 550);
    CHECK(ms < 600 * 1.5);  // a timeout is checked at 1.5 x its value
  }
  server.thaw();
  CHECK(patient.try_get("k") == std::optional<std::string>("v"));  // and it recovers
}

TEST_CASE("etcd_kv: a kv_call_deadline ends a call by it, past silent and hung endpoints") {
  // Three endpoints out of reach (two that never accept, one frozen member): without a bound one
  // call takes a 1 s timeout on each, about 3 s; under a kv_call_deadline it fails by the
  // deadline, as a timeout (transient, so a caller's retry loop goes on), naming the endpoints.
  holdfast_test::etcd_server server;
  holdfast_test::blackhole silent_a, silent_b;
  etcd_kv patient(options_for({server.url()}, 2000ms, 10000ms), ns0);
  patient.put("k", "v");
  etcd_kv kv(options_for({silent_a.url(), silent_b.url(), server.url()}, 1000ms, 1000ms), ns0);
  server.freeze();
  struct resume {
    holdfast_test::etcd_server& s;
    ~resume() { s.thaw(); }
  } resume_on_exit{server};
  constexpr auto bound = 400ms;
  const std::function<void()> calls[] = {[&] { (void)kv.try_get("k"); }, [&] { kv.put("k2", "v"); },
                                         [&] { (void)kv.get("k3", 5s); },
                                         [&] { (void)kv.list(""); }};
  for (const auto& call : calls) {
    const auto t0 = clk::now();
    holdfast::error e = [&] {
      const holdfast::kv_call_deadline scope(t0 + bound);
      return error_from(call);
    }();
    const auto ms = ms_since(t0);
    INFO(std::string(e.what()));
    CHECK(e.errnum() == ETIMEDOUT);
    CHECK(holdfast::is_transient_kv_error(e));
    CHECK(ms < 2000);  // by the 400 ms deadline, not after the 3 s of three timeouts
  }
  // Once it has passed, a call fails at once, before any endpoint is tried.
  {
    const holdfast::kv_call_deadline scope(clk::now() - 1ms);
    const auto t0 = clk::now();
    auto e = error_from([&] { (void)kv.try_get("k"); });
    CHECK(contains(e.what(), "kv_call_deadline"));
    CHECK(ms_since(t0) < 500);  // no 1 s connect timeout
  }
  server.thaw();
  CHECK(patient.try_get("k") == std::optional<std::string>("v"));
}

TEST_CASE(
    "kv_call_deadline: scopes nest, the earliest deadline applies, each restores the one before") {
  using holdfast::kv_call_deadline;
  CHECK_FALSE(kv_call_deadline::current().has_value());
  CHECK(kv_call_deadline::cap(5000ms) == 5000ms);
  const auto now = clk::now();
  {
    const kv_call_deadline outer(now + 10s);
    CHECK(kv_call_deadline::current() == now + 10s);
    {
      const kv_call_deadline later(now + 60s);  // cannot extend the outer one
      CHECK(kv_call_deadline::current() == now + 10s);
      const kv_call_deadline earlier(now + 1s);
      CHECK(kv_call_deadline::current() == now + 1s);
      CHECK(kv_call_deadline::cap(5000ms) <= 1000ms);
      CHECK(kv_call_deadline::cap(10ms) == 10ms);
      CHECK_FALSE(kv_call_deadline::passed());
    }
    CHECK(kv_call_deadline::current() == now + 10s);
    std::thread other([] { CHECK_FALSE(kv_call_deadline::current().has_value()); });  // per thread
    other.join();
    const kv_call_deadline past(now - 1ms);
    CHECK(kv_call_deadline::passed());
    CHECK(kv_call_deadline::cap(5000ms) == 0ms);
  }
  CHECK_FALSE(kv_call_deadline::current().has_value());
}

TEST_CASE("etcd_kv: garbage and error replies from a fake server are clear errors, never hangs") {
  std::atomic<int> mode{0};
  holdfast_test::http_server fake([&](const holdfast_test::seen_request&) {
    switch (mode.load()) {
      case 0:
        return reply::raw("garbage\r\n\r\n");
      case 1:
        return reply(200, "this is not json");
      case 2:
        return reply(200, R"({"error":"etcdserver: requested lease not found","code":5})");
      case 3:
        return reply(500, R"({"message":"boom"})");
      case 4:
        return reply::raw(reply::chunked_head() + "5\r\n{\"he");  // cut mid-body
      default:
        return reply::delayed(10s, "");  // never answers
    }
  });
  etcd_kv kv(options_for({fake.url()}, 500ms, 500ms), ns0);
  struct expectation {
    int errnum;
    const char* text;
  };
  const expectation expected[] = {
      {EPROTO, "http"},    {EPROTO, "malformed reply"}, {EIO, "requested lease not found"},
      {EIO, "status 500"}, {ECONNRESET, "truncated"},   {ETIMEDOUT, "no response"}};
  for (int m = 0; m < 6; ++m) {
    mode = m;
    CAPTURE(m);
    auto t0 = clk::now();
    auto e = error_from([&] { kv.insert("some/key", "v"); });
    INFO(std::string(e.what()));
    CHECK(e.errnum() == expected[m].errnum);
    CHECK(contains(e.what(), "etcd insert 'some/key'"));
    CHECK(contains(e.what(), expected[m].text));
    CHECK(ms_since(t0) < 500 * 1.5);  // request timeout 500 ms, checked at 1.5 x
  }
  mode = 1;
  CHECK(error_from([&] { kv.list("some"); }).errnum() == EPROTO);
  CHECK(error_from([&] { kv.get("some/key", 300ms); }).errnum() == EPROTO);
}

TEST_CASE("etcd_kv: get is one range and one watch from revision + 1 (no polling)") {
  std::atomic<int> event_after_ms{-1};  // -1: the watch stays silent
  holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
    if (r.target == "/v3/kv/range") return reply(200, R"({"header":{"revision":"41"}})");
    std::string created = R"({"result":{"header":{"revision":"41"},"created":true}})"
                          "\n";
    reply rep = reply::raw(reply::chunked_head() + reply::chunk(created));
    if (event_after_ms >= 0)
      rep.then(std::chrono::milliseconds(event_after_ms.load()),
               reply::chunk(R"({"result":{"events":[{"kv":{"key":"eA==","value":)"
                            R"("ZnJvbSB3YXRjaA==","mod_revision":"42"}}]}})"
                            "\n"));
    return rep.keep_open();
  });
  etcd_kv kv(options_for({fake.url()}), ns0);

  auto t0 = clk::now();
  CHECK_FALSE(kv.get("x", 500ms).has_value());
  auto ms = ms_since(t0);
  CHECK(ms >= 495);
  CHECK(ms < 500 * 1.5);  // the get's own timeout, checked at 1.5 x
  auto seen = fake.requests();
  REQUIRE(seen.size() == 2);  // one range, one watch, nothing in between
  CHECK(seen[0].target == "/v3/kv/range");
  CHECK(seen[1].target == "/v3/watch");
  CHECK(contains(seen[1].body, R"("start_revision":"42")"));

  event_after_ms = 100;
  t0 = clk::now();
  CHECK(kv.get("x", 5s) == std::optional<std::string>("from watch"));
  CHECK(ms_since(t0) < 2000);
  CHECK(fake.request_count() == 4);
}

TEST_CASE("etcd_kv: a watch created past the range's revision ranges again at once") {
  // etcd catches a watch that starts at a revision it has passed up only every 100 ms: when the
  // created message shows writes since the range, get ranges again instead of waiting for it.
  std::atomic<int> ranges{0};
  holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
    if (r.target == "/v3/kv/range")
      return ++ranges == 1 ? reply(200, R"({"header":{"revision":"41"}})")
                           : reply(200, R"({"header":{"revision":"43"},"kvs":[{"key":"eA==",)"
                                        R"("value":"bGF0ZQ==","mod_revision":"42"}]})");
    std::string created = R"({"result":{"header":{"revision":"43"},"created":true}})"
                          "\n";
    return reply::raw(reply::chunked_head() + reply::chunk(created)).keep_open();
  });
  etcd_kv kv(options_for({fake.url()}), ns0);
  const auto t0 = clk::now();
  CHECK(kv.get("x", 5s) == std::optional<std::string>("late"));
  // at once, not after the 3 s watch window (the fake never sends the event): a fifth of it
  CHECK(ms_since(t0) < 3000 / 5);
  auto seen = fake.requests();
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].target == "/v3/kv/range");
  CHECK(seen[1].target == "/v3/watch");
  CHECK(seen[2].target == "/v3/kv/range");
}

TEST_CASE("etcd_kv: get skips delete events and ranges again after a cancelled watch") {
  std::atomic<int> ranges{0};
  std::atomic<bool> compacted{true};
  const std::string created = R"({"result":{"header":{"revision":"5"},"created":true}})"
                              "\n";
  holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
    if (r.target == "/v3/kv/range") {
      if (++ranges == 2 && compacted)  // the second range finds the key
        return reply(200,
                     R"({"header":{"revision":"12"},"kvs":[{"key":"eA==","value":"YWZ0ZXI="}]})");
      return reply(200, R"({"header":{"revision":"5"}})");
    }
    if (compacted)  // created, then cancelled (compaction): the server ends the stream
      return reply::raw(reply::chunked_head() + reply::chunk(created) +
                        reply::chunk(R"({"result":{"canceled":true,"compact_revision":"9"}})"
                                     "\n") +
                        reply::last_chunk());
    return reply::raw(
               reply::chunked_head() + reply::chunk(created) +
               reply::chunk(R"({"result":{"events":[{"type":"DELETE","kv":{"key":"eA=="}}]}})"
                            "\n") +
               reply::chunk(R"({"result":{"events":[{"kv":{"key":"eA==","value":"cHV0"}}]}})"
                            "\n"))
        .keep_open();
  });
  etcd_kv kv(options_for({fake.url()}), ns0);
  CHECK(kv.get("x", 3s) == std::optional<std::string>("after"));
  CHECK(fake.request_count() == 3);  // range, watch (cancelled), range
  compacted = false;
  CHECK(kv.get("x", 3s) == std::optional<std::string>("put"));  // the DELETE event is skipped
  CHECK(fake.request_count() == 5);
}

TEST_CASE("etcd_kv: failover past a refused and a silent endpoint, sticking to the good one") {
  holdfast_test::etcd_server server;
  holdfast_test::blackhole silent;
  const std::string refused = holdfast_test::refused_url();

  etcd_kv a(options_for({refused, server.url()}), ns0);
  CHECK(a.insert("k", "v"));
  CHECK(a.try_get("k") == std::optional<std::string>("v"));

  etcd_kv b(options_for({silent.url(), server.url()}, 1000ms), ns0);
  auto t0 = clk::now();
  CHECK(b.try_get("k") == std::optional<std::string>("v"));  // after a 1 s connect timeout
  CHECK(ms_since(t0) >= 990);
  t0 = clk::now();
  CHECK_FALSE(b.insert("k", "w"));  // the good endpoint is now tried first: no 1 s wait
  CHECK(ms_since(t0) < 900);
  CHECK(b.get("k", 1s) == std::optional<std::string>("v"));

  etcd_kv none(options_for({refused, silent.url()}, 300ms), ns0);
  t0 = clk::now();
  auto e = error_from([&] { none.put("k", "v"); });
  CHECK(ms_since(t0) < 300 * 1.5);  // one refused connect + one 300 ms timeout, at 1.5 x
  CHECK(contains(e.what(), refused));
  CHECK(contains(e.what(), silent.url()));
  CHECK(contains(e.what(), "no etcd endpoint reachable"));
}

TEST_CASE("etcd_kv: etcd's 'unavailable' answers (gRPC code 14) are EAGAIN and transient") {
  const std::string kinds[] = {"leader changed", "no leader", "request timed out",
                               "server stopped"};
  std::string answer;  // set before each request; read on the server thread after it arrives
  std::mutex mu;
  holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.target == "/v3/kv/range" && answer.empty())
      return reply(200, R"({"header":{"revision":"3"}})");
    if (r.target == "/v3/watch")  // the gateway's stream form: the error is an object
      return reply::raw(reply::chunked_head() +
                        reply::chunk(R"({"error":{"grpc_code":14,"http_code":503,)"
                                     R"("message":"transport is closing",)"
                                     R"("http_status":"Service Unavailable"}})"
                                     "\n") +
                        reply::last_chunk());
    return reply(503, answer);
  });
  auto set_answer = [&](const std::string& a) {
    std::lock_guard<std::mutex> lock(mu);
    answer = a;
  };
  etcd_kv kv(options_for({fake.url()}, 500ms, 1000ms), ns0);
  for (const auto& kind : kinds) {
    CAPTURE(kind);
    const std::string msg = "etcdserver: " + kind;
    set_answer(R"({"error":")" + msg + R"(","code":14,"message":")" + msg + R"("})");
    auto e = error_from([&] { kv.insert("k", "v"); });
    INFO(std::string(e.what()));
    CHECK(e.errnum() == EAGAIN);
    CHECK(holdfast::is_transient_kv_error(e));
    CHECK(contains(e.what(), "etcd insert 'k'"));
    CHECK(contains(e.what(), msg));
  }
  set_answer("");  // the range answers; the watch's stream carries the error object
  auto e = error_from([&] { kv.get("k", 2s); });
  CHECK(e.errnum() == EAGAIN);
  CHECK(holdfast::is_transient_kv_error(e));
  CHECK(contains(e.what(), "transport is closing"));

  set_answer(R"({"error":"etcdserver: key is not provided","code":3,)"
             R"("message":"etcdserver: key is not provided"})");
  e = error_from([&] { kv.put("k", "v"); });
  CHECK(e.errnum() == EIO);
  CHECK_FALSE(holdfast::is_transient_kv_error(e));
  CHECK(contains(e.what(), "key is not provided"));
}

TEST_CASE("etcd_kv: after 'unavailable' a read moves on to the next endpoint, a write does not") {
  const std::string unavailable =
      R"({"error":"etcdserver: leader changed","code":14,"message":"etcdserver: leader changed"})";
  holdfast_test::http_server busy(
      [&](const holdfast_test::seen_request&) { return reply(503, unavailable); });
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({busy.url(), server.url()}), ns0);
  auto e = error_from([&] { kv.put("k", "v"); });  // sent to `busy`: its outcome is unknown
  CHECK(e.errnum() == EAGAIN);
  CHECK(busy.request_count() == 1);
  CHECK_FALSE(kv.try_get("k").has_value());  // `busy` is suspect now: etcd answers at once
  kv.put("k", "v");                          // the caller's retry lands on etcd too
  CHECK(busy.request_count() == 1);

  etcd_kv reader(options_for({busy.url(), server.url()}), ns0);
  CHECK(reader.try_get("k") == std::optional<std::string>("v"));  // retried at once on etcd
  CHECK(busy.request_count() == 2);
}

TEST_CASE("etcd_kv: an endpoint that timed out is skipped for suspect_for, then tried again") {
  holdfast_test::etcd_server server;
  std::atomic<bool> silent{true};
  holdfast_test::http_server fake([&](const holdfast_test::seen_request&) {
    if (silent) return reply::delayed(60s, "");  // accepts, never answers: a frozen member
    return reply(200, R"({"header":{"revision":"7"},"kvs":[{"key":"aw==","value":")" +
                          holdfast::detail::base64_encode("from fake") + R"("}]})");
  });
  etcd_kv(options_for({server.url()}), ns0).put("k", "real");
  auto o = options_for({fake.url(), server.url()}, 500ms, 1000ms);
  o.suspect_for = 2000ms;
  etcd_kv kv(o, ns0);

  auto t0 = clk::now();
  CHECK(kv.try_get("k") == std::optional<std::string>("real"));  // one request timeout
  CHECK(ms_since(t0) >= 990);
  CHECK(ms_since(t0) < 1900);
  t0 = clk::now();
  CHECK(kv.try_get("k") == std::optional<std::string>("real"));  // the suspect is skipped
  CHECK(ms_since(t0) < 1000 / 2);  // not the 1 s request timeout a try on the suspect costs
  CHECK(fake.request_count() == 1);

  // The fake now answers and etcd hangs: a write to etcd times out and is not retried on the
  // fake; 1 s later the fake's 2 s suspicion has run out while etcd's has not, so a read goes
  // to the fake first.
  silent = false;
  server.freeze();
  struct resume {
    holdfast_test::etcd_server& s;
    ~resume() { s.thaw(); }
  } resume_on_exit{server};
  t0 = clk::now();
  auto e = error_from([&] { kv.put("k", "lost"); });
  CHECK(e.errnum() == ETIMEDOUT);
  CHECK(holdfast::is_transient_kv_error(e));
  CHECK(ms_since(t0) < 1900);
  CHECK(fake.request_count() == 1);
  // A stall on purpose: the suspicions age (fake: marked >= 2050 ms ago; etcd: ~1050 ms ago).
  std::this_thread::sleep_for(1050ms);
  t0 = clk::now();
  CHECK(kv.try_get("k") == std::optional<std::string>("from fake"));
  // a healed suspect is tried before a fresh one: not the 1 s timeout on the frozen etcd
  CHECK(ms_since(t0) < 1000 / 2);
}

TEST_CASE("etcd_kv lease: a live client keeps its leased keys, a SIGKILLed one loses them only") {
  holdfast_test::etcd_server server;
  etcd_kv observer(options_for({server.url()}), ns0);
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  holdfast_test::child worker([&] {
    auto o = options_for({server.url()});
    o.lease_ttl = 2s;             // keep-alives every ~670 ms: a loaded machine still keeps it
    o.leased_prefix = "workers";  // liveness keys; "step/1" records a decision: never leased
    etcd_kv kv(o, ns0);
    CHILD_REQUIRE(kv.lease_id() != 0);
    CHILD_REQUIRE(kv.insert("workers/1", "alive"));
    kv.put("step/1", "10");
    (void)!::write(fds[1], "r", 1);
    for (;;) ::pause();  // killed by the parent
  });
  ::close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10000) == 1);
  ::close(fds[0]);
  CHECK(observer.try_get("workers/1") == std::optional<std::string>("alive"));
  // A window in which nothing may happen: 1.5 TTLs (+ etcd's 500 ms expiry sweep), so only
  // keep-alives can have kept the keys.
  std::this_thread::sleep_for(3000ms);
  CHECK(observer.try_get("workers/1") == std::optional<std::string>("alive"));
  worker.kill(SIGKILL);
  auto r = worker.wait(5s);
  CHECK(r.term_signal == SIGKILL);
  auto t0 = clk::now();
  CHECK(wait_gone(observer, "workers/1", 6s));
  CHECK(ms_since(t0) < 5000);                          // TTL 2 s + etcd's expiry sweep, well inside
  CHECK(observer.insert("workers/1", "replacement"));  // the slot is free again
  CHECK(observer.try_get("step/1") == std::optional<std::string>("10"));  // outside: it stays
}

TEST_CASE("etcd_kv lease: destruction stops the keep-alive promptly and revoke deletes at once") {
  holdfast_test::etcd_server server;
  etcd_kv observer(options_for({server.url()}), ns0);
  auto o = options_for({server.url()});
  o.lease_ttl = 2s;
  o.leased_prefix = "live";
  {
    std::optional<etcd_kv> kv(std::in_place, o, ns0);
    kv->put("live/kept", "v");
    CHECK(kv->lease_alive());
    auto copy = kv->with_namespace(kv_namespace("run", 1));  // shares the lease
    CHECK(copy.lease_id() == kv->lease_id());
    copy.put("live/other-ns", "v");
    kv.reset();
    CHECK(copy.lease_alive());  // the last handle still keeps the lease
    auto t0 = clk::now();
    { auto gone = std::move(copy); }
    CHECK(ms_since(t0) < 2000 / 3 / 2);  // not a keep-alive period (ttl / 3) slept through
  }
  CHECK(observer.try_get("live/kept").has_value());  // not revoked on destruction

  {
    etcd_kv kv(o, ns0);
    kv.put("live/revoked", "v");
    CHECK(kv.insert("live/inserted", "v"));  // an insert below leased_prefix is leased too
    kv.put("decision", "v");                 // outside leased_prefix: no lease
    CHECK(kv.insert("live", "v"));           // the prefix itself is not below it
    kv.revoke_lease();
    CHECK_FALSE(kv.lease_alive());
    CHECK_FALSE(observer.try_get("live/revoked").has_value());
    CHECK_FALSE(observer.try_get("live/inserted").has_value());
    CHECK(observer.try_get("decision") == std::optional<std::string>("v"));
    CHECK(observer.try_get("live") == std::optional<std::string>("v"));
    kv.revoke_lease();  // idempotent
    CHECK(kv.lease_id() == 0);
    kv.put("live/after-revoke", "v");  // writes go on, without a lease
    CHECK(observer.try_get("live/after-revoke") == std::optional<std::string>("v"));
  }

  {  // a keep-alive in flight to a hung server does not hold up destruction
    o.lease_ttl = 1s;
    o.request_timeout = 5000ms;
    std::optional<etcd_kv> kv(std::in_place, o, ns0);
    const auto sent = kv->stats().requests;
    server.freeze();
    // a keep-alive is sent to the hung server (one keep-alive period, ttl / 3, at most): observed
    const auto end = clk::now() + 10s;
    while (kv->stats().requests == sent && clk::now() < end)
      std::this_thread::sleep_for(1ms);  // a bounded look, not an order
    CHECK(kv->stats().requests > sent);
    auto t0 = clk::now();
    kv.reset();
    auto ms = ms_since(t0);
    server.thaw();
    CHECK(ms < 5000 / 5);  // a fifth of the 5 s request timeout it would wait out
  }
}

TEST_CASE("etcd_kv: keys live under <prefix>/<run>/<incarnation>/ in etcd") {
  holdfast_test::etcd_server server;
  auto o = options_for({server.url()});
  o.prefix = "jobs/holdfast";
  etcd_kv kv(o, kv_namespace("r1", 2));
  CHECK(kv.etcd_key("a/b") == "jobs/holdfast/r1/2/a/b");
  kv.put("a/b", std::string("v\0w", 3));
  namespace hd = holdfast::detail;
  auto resp = hd::http_call(
      hd::parse_http_url(server.url()),
      hd::http_request{"POST",
                       "/v3/kv/range",
                       {},
                       "{\"key\":\"" + hd::base64_encode("jobs/holdfast/r1/2/a/b") + "\"}"});
  REQUIRE(resp.status == 200);
  CHECK(contains(resp.body, hd::base64_encode(std::string("v\0w", 3))));
}

TEST_CASE("etcd_kv: bad options are rejected up front") {
  CHECK(error_from([] { etcd_kv(options_for({}), ns0); }).errnum() == EINVAL);
  CHECK(error_from([] { etcd_kv(options_for({"https://127.0.0.1:2379"}), ns0); }).errnum() ==
        EINVAL);
  auto o = options_for({"http://127.0.0.1:1"});
  o.prefix = "a//b";
  CHECK(error_from([&] { etcd_kv(o, ns0); }).errnum() == EINVAL);
  o.prefix = "ok";
  o.lease_ttl = 5s;  // and no leased_prefix: a lease for no key
  auto bad = error_from([&] { etcd_kv(o, ns0); });
  CHECK(bad.errnum() == EINVAL);
  CHECK(contains(bad.what(), "lease_ttl without leased_prefix"));
  o.lease_ttl = 0s;
  o.leased_prefix = "live";  // and no lease_ttl
  CHECK(error_from([&] { etcd_kv(o, ns0); }).errnum() == EINVAL);
  o.lease_ttl = 5s;
  o.leased_prefix = "live//x";
  CHECK(error_from([&] { etcd_kv(o, ns0); }).errnum() == EINVAL);
  o.leased_prefix = "live/";  // a trailing '/' is accepted, as list() accepts it
  // granting the lease needs the server: a clear error now, not later
  auto e = error_from([&] { etcd_kv(o, ns0); });
  CHECK(e.errnum() == ECONNREFUSED);
  CHECK(contains(e.what(), "etcd lease grant"));
}

TEST_CASE("etcd range_end for prefixes") {
  using holdfast::detail::etcd_prefix_end;
  CHECK(etcd_prefix_end("a/") == "a0");
  CHECK(etcd_prefix_end("a\xff") == "b");
  CHECK(etcd_prefix_end("\xff\xff") == std::string(1, '\0'));
}

TEST_CASE("etcd fixture: a missing etcd fails the test (never skips), naming the package") {
  struct env_guard {
    std::string ci;
    bool had_ci;
    env_guard() : had_ci(std::getenv("CI") != nullptr) {
      if (had_ci) ci = std::getenv("CI");
    }
    ~env_guard() {
      ::unsetenv("HOLDFAST_TEST_ETCD");
      if (had_ci)
        ::setenv("CI", ci.c_str(), 1);
      else
        ::unsetenv("CI");
    }
  } guard;
  ::setenv("HOLDFAST_TEST_ETCD", "/nonexistent/etcd", 1);
  ::setenv("CI", "true", 1);
  std::string msg;
  try {
    holdfast_test::etcd_server s;
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  CHECK(contains(msg, "required in CI"));
  CHECK(contains(msg, "etcd-server"));
  ::unsetenv("CI");
  msg.clear();
  try {
    holdfast_test::etcd_server s;
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  CHECK(contains(msg, "apt-get install etcd-server"));
}

TEST_CASE("etcd_kv: every socket call of a request failed in turn is a clear error, no hang") {
  using holdfast::testing::fault_io;
  holdfast_test::disarm_on_exit guard;
  holdfast_test::etcd_server server;
  for (std::size_t pool : {std::size_t{0}, std::size_t{4}}) {  // a connection per request; reused
    CAPTURE(pool);
    auto o = options_for({server.url()});
    o.idle_connections = pool;
    holdfast::basic_etcd_kv<fault_io> kv(o, ns0);
    kv.put("k", "v");
    for (int op = 0; op < 2; ++op) {  // a plain request, then a get that goes on to a watch
      CAPTURE(op);
      auto run = [&] {  // true when the answer is right (k exists, "absent" does not)
        return op == 0 ? !kv.insert("k", "w") : !kv.get("absent", 300ms).has_value();
      };
      holdfast_test::call_sweep sweep;
      sweep.min_calls = pool == 0 ? 4 : 2;  // socket, connect, send, recv; reused: send, recv
      sweep.extra = 6;                      // a reconnect after a dropped one
      sweep.pooled = pool > 0;
      sweep.bound_ms = 3000 * 3 / 2;  // never past the request timeout (3 s), checked at 1.5 x
      holdfast_test::fail_each_call(sweep, run, [&](const holdfast::error& e) {
        CHECK(contains(e.what(), op == 0 ? "etcd insert 'k'" : "etcd get 'absent'"));
      });
    }
    CHECK(kv.try_get("k") == std::optional<std::string>("v"));
  }
}

TEST_CASE("etcd_kv: connections are reused, and dropped when their endpoint turns suspect") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}), ns0);
  CHECK(kv.idle_connections() == 0);
  kv.put("k", "v");
  CHECK(kv.idle_connections() == 1);
  for (int i = 0; i < 20; ++i) CHECK(kv.try_get("k") == std::optional<std::string>("v"));
  CHECK(kv.idle_connections() == 1);  // one connection served every request
  // Threads share the pool: at most idle_connections (4) stay idle afterwards.
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) kv.put("t", "x");
    });
  for (auto& t : threads) t.join();
  CHECK(kv.idle_connections() >= 1);
  CHECK(kv.idle_connections() <= 4);

  // A request that times out makes the endpoint suspect and closes its idle connections.
  etcd_kv short_kv(options_for({server.url()}, 500ms, 300ms), ns0);
  short_kv.put("a", "1");
  CHECK(short_kv.idle_connections() == 1);
  server.freeze();
  CHECK(error_from([&] { short_kv.put("a", "2"); }).errnum() == ETIMEDOUT);
  CHECK(short_kv.idle_connections() == 0);
  server.thaw();
  // another key: the timed-out put of "a" may still be applied after the thaw, in any order
  short_kv.put("b", "3");
  CHECK(short_kv.try_get("b") == std::optional<std::string>("3"));

  // A restarted server closed every pooled connection: the next request notices and reconnects.
  auto o = options_for({server.url()});
  o.idle_connections = 0;  // one connection per request: nothing is kept
  etcd_kv single(o, ns0);
  CHECK(single.try_get("b") == std::optional<std::string>("3"));
  CHECK(single.idle_connections() == 0);
}

TEST_CASE("etcd_kv: a forked child never shares its parent's pooled connection") {
  holdfast_test::etcd_server server;
  etcd_kv kv(options_for({server.url()}), ns0);
  kv.put("fork", "0");
  REQUIRE(kv.idle_connections() == 1);  // inherited by the child below
  holdfast_test::child worker([&] {
    for (int i = 0; i < 50; ++i) {
      kv.put("fork/child", std::to_string(i));
      CHILD_REQUIRE(kv.try_get("fork/child") == std::optional<std::string>(std::to_string(i)));
    }
  });
  for (int i = 0; i < 50; ++i) {  // at the same time, on the parent's connection
    kv.put("fork/parent", std::to_string(i));
    CHECK(kv.try_get("fork/parent") == std::optional<std::string>(std::to_string(i)));
  }
  auto r = worker.wait(20s);
  CHECK(r.ok());
  CHECK(kv.idle_connections() == 1);
}

TEST_CASE("etcd_kv: a pooled connection the server closed is noticed before reuse") {
  // The fake server closes every connection after one reply (no Connection: close header):
  // each pooled connection is found closed and replaced, and no request is lost or doubled.
  holdfast_test::http_server fake([&](const holdfast_test::seen_request&) {
    return reply(200, R"({"header":{"revision":"3"},"kvs":[{"key":"aw==","value":"dg=="}]})");
  });
  etcd_kv kv(options_for({fake.url()}), ns0);
  for (int i = 0; i < 10; ++i) CHECK(kv.try_get("k") == std::optional<std::string>("v"));
  CHECK(fake.request_count() == 10);
  // Writes too: never sent twice.
  for (int i = 0; i < 5; ++i) kv.put("k", "v");
  CHECK(fake.request_count() == 15);
}

TEST_CASE("etcd_kv: a watch message longer than the limit is a clear error, not a growing buffer") {
  const std::string megabyte(std::size_t{1} << 20, 'x');  // no newline: one message never ends
  holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
    if (r.target == "/v3/kv/range") return reply(200, R"({"header":{"revision":"41"}})");
    std::string body = reply::chunked_head() +
                       reply::chunk(R"({"result":{"header":{"revision":"41"},"created":true}})"
                                    "\n");
    for (int i = 0; i < 3; ++i) body += reply::chunk(megabyte);
    return reply::raw(std::move(body)).keep_open();
  });
  auto o = options_for({fake.url()});
  o.request_timeout = 20s;  // the whole message arrives within one watch window
  o.max_message = std::size_t{2} << 20;
  etcd_kv kv(o, ns0);
  try {
    (void)kv.get("x", 20s);
    FAIL("no error");
  } catch (const holdfast::error& e) {
    INFO(std::string(e.what()));
    CHECK(e.errnum() == EMSGSIZE);
    CHECK(contains(e.what(), "watch message from " + fake.url()));
  }
}

TEST_CASE("etcd_kv: a huge reply body reaches a message capped, saying how long it was") {
  // Invariant: whatever etcd (or a proxy in front of it) answers, a message shows at most the
  // first 200 bytes of the reply body (or of the error text in it), then its length.
  const std::string huge = std::string(std::size_t{3} << 20, 'x');  // 3 MiB
  std::atomic<int> mode{0};
  const std::string bodies[] = {
      "start-" + huge,                                 // status 500, not JSON
      R"({"message":"start-)" + huge + "\"}",          // status 500, JSON without an error
      R"(["start-)" + huge + "\"]",                    // status 200, JSON but not an object
      R"({"error":"start-)" + huge + R"(","code":2})"  // etcd's error text
  };
  holdfast_test::http_server fake([&](const holdfast_test::seen_request&) {
    const int m = mode.load();
    return reply(m < 2 ? 500 : 200, bodies[m]);
  });
  etcd_kv kv(options_for({fake.url()}, 1000ms, 20000ms), ns0);
  for (int m = 0; m < 4; ++m) {
    CAPTURE(m);
    mode = m;
    const auto e = error_from([&] { kv.insert("some/key", "v"); });
    const std::string what = e.what();
    INFO(what.substr(0, 600));
    CHECK(contains(what, "start-xxx"));
    CHECK(contains(what, "bytes)"));
    CHECK(what.size() < 700);
  }
}

TEST_CASE("etcd_kv: a password over plain http:// is refused unless every member is loopback") {
  using holdfast::testing::fault;
  using holdfast::testing::fault_io;
  using holdfast::testing::fault_plan;
  using holdfast::testing::io_op;
  holdfast_test::disarm_on_exit guard;
  ::setenv("HOLDFAST_TEST_ETCD_PW", "hunter2", 1);
  auto with_user = [](std::vector<std::string> endpoints) {
    auto o = options_for(std::move(endpoints));
    o.user = "trainer";
    o.password_env = "HOLDFAST_TEST_ETCD_PW";
    return o;
  };
  // Refused at construction, before any call is made: a lease is asked for, so a client that
  // did not refuse would resolve and connect at once; and every call fails, so even then no
  // packet leaves for TEST-NET-1 (192.0.2.0/24, never to be contacted).
  for (const auto& endpoints :
       std::vector<std::vector<std::string>>{{"http://192.0.2.1:2379"},
                                             {"http://127.0.0.1:2379", "http://192.0.2.1:2379"},
                                             {"http://[::1]:2379", "http://192.0.2.1"},
                                             {"http://127.0.0.1.example:2379"}}) {
    CAPTURE(endpoints.back());
    auto o = with_user(endpoints);
    o.lease_ttl = 5s;
    o.leased_prefix = "live";
    fault_plan::arm(fault{io_op::any, 1, EACCES, 1, 1000});
    const auto e = error_from([&] { holdfast::basic_etcd_kv<fault_io> kv(o, ns0); });
    INFO(std::string(e.what()));
    CHECK(fault_plan::calls(io_op::any) == 0);
    fault_plan::disarm();
    CHECK(e.errnum() == EINVAL);
    CHECK(contains(e.what(), "allow_plaintext_auth"));
    CHECK_FALSE(contains(e.what(), "hunter2"));
  }
  // Accepted with the flag (no lease: nothing is contacted), and where every member is loopback.
  auto flagged = with_user({"http://192.0.2.1:2379"});
  flagged.allow_plaintext_auth = true;
  etcd_kv accepted(flagged, ns0);
  etcd_kv local_names(with_user({"http://localhost:2379", "http://[::1]:2379",
                                 "http://127.5.6.7:2379", "http://LOCALHOST:1"}),
                      ns0);
  holdfast_test::etcd_server server;  // no authentication: the client finds it off and goes on
  etcd_kv loopback(with_user({server.url()}), ns0);
  CHECK(loopback.insert("k", "v"));
  CHECK(loopback.try_get("k") == std::optional<std::string>("v"));
  ::unsetenv("HOLDFAST_TEST_ETCD_PW");
}

TEST_CASE("etcd_kv: a write whose reused connection closed unanswered is not sent again") {
  // etcd may apply a txn and then lose the connection: sending it again would answer
  // "succeeded: false" for this caller's own write. A read is safe to send again.
  std::atomic<int> ranges{0}, txns{0};
  holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
    if (r.target == "/v3/kv/txn") {
      ++txns;
      return reply();  // applied, say, but the connection closes before a byte of the reply
    }
    if (++ranges == 2) return reply();  // the reused connection closes unanswered
    return reply(200, R"({"header":{"revision":"1"}})").keep_alive();
  });
  etcd_kv kv(options_for({fake.url()}), ns0);
  CHECK_FALSE(kv.try_get("a").has_value());
  REQUIRE(kv.idle_connections() == 1);
  CHECK_FALSE(kv.try_get("a").has_value());  // sent again on a fresh connection
  CHECK(ranges == 3);
  REQUIRE(kv.idle_connections() == 1);
  auto e = error_from([&] { kv.insert("k", "v"); });
  CHECK(holdfast::is_transient_kv_error(e));
  CHECK(contains(e.what(), "outcome unknown"));
  CHECK(contains(e.what(), "etcd insert 'k'"));
  CHECK(txns == 1);  // the invariant: a write that may have been applied is sent once
}
