// The HTTP/1.1 client (detail/http.hpp) against the scripted loopback server: framing
// (Content-Length, chunked with extensions and trailers, until close), malformed and truncated
// responses, refused and timed-out connections, slow servers, injected syscall failures, and
// the streaming form used by etcd's watch.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <holdfast/detail/http.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/expect_error.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/http_server.hpp"
#include "support/thread_state.hpp"

using holdfast::detail::http_call;
using holdfast::detail::http_endpoint;
using holdfast::detail::http_request;
using holdfast::detail::http_response;
using holdfast::detail::http_stream;
using holdfast::detail::http_timeouts;
using holdfast::detail::parse_http_url;
using holdfast::testing::fault;
using holdfast::testing::fault_io;
using holdfast::testing::fault_plan;
using holdfast::testing::io_op;
using holdfast_test::disarm_on_exit;
using holdfast_test::error_from;
using holdfast_test::http_server;
using holdfast_test::reply;
using holdfast_test::seen_request;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

http_request get(const std::string& target) { return {"GET", target, {}, {}}; }

double ms_since(steady::time_point t0) {
  return std::chrono::duration<double, std::milli>(steady::now() - t0).count();
}

}  // namespace

TEST_CASE("parse_http_url: host, port, path, IPv6, and rejects the rest") {
  std::string path;
  auto ep = parse_http_url("http://127.0.0.1:2379/v3/kv", &path);
  CHECK(ep.host == "127.0.0.1");
  CHECK(ep.port == 2379);
  CHECK(path == "/v3/kv");
  ep = parse_http_url("http://metadata.google.internal", &path);
  CHECK(ep.host == "metadata.google.internal");
  CHECK(ep.port == 80);
  CHECK(path.empty());
  ep = parse_http_url("http://[::1]:8080/x");
  CHECK(ep.host == "::1");
  CHECK(ep.port == 8080);
  CHECK(ep.url() == "http://[::1]:8080");
  CHECK(parse_http_url("HTTP://h:1").port == 1);
  for (const char* bad : {"https://h", "h:80", "http://", "http://:80", "http://h:", "http://h:x",
                          "http://h:65536", "http://[::1", "http://[::1]x"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_http_url(bad), holdfast::format_error);
  }
}

TEST_CASE("Content-Length body, the request carries Host, Connection: close and its body") {
  http_server srv(
      [](const seen_request& r) { return reply(200, "echo:" + r.body, "X-Test: Yes  \r\n"); });
  auto ep = parse_http_url(srv.url());
  http_request req{"POST", "/v3/kv/put", {{"Metadata-Flavor", "Google"}}, "{\"key\":\"a\"}"};
  http_response r = http_call(ep, req);
  CHECK(r.status == 200);
  CHECK(r.body == "echo:{\"key\":\"a\"}");
  REQUIRE(r.header("x-test"));
  CHECK(*r.header("X-TEST") == "Yes");
  CHECK(r.header("missing") == nullptr);
  auto seen = srv.requests();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].method == "POST");
  CHECK(seen[0].target == "/v3/kv/put");
  CHECK(seen[0].header("Host") == "127.0.0.1:" + std::to_string(srv.port()));
  CHECK(seen[0].header("Connection") == "close");
  CHECK(seen[0].header("Metadata-Flavor") == "Google");
  CHECK(seen[0].header("Content-Length") == "11");
  CHECK(seen[0].body == "{\"key\":\"a\"}");
}

TEST_CASE("a host name with several addresses connects to the one that listens") {
  http_server srv([](const seen_request&) { return reply(200, "ok"); });
  // "localhost" may resolve to ::1 first, where nothing listens: the next address is tried.
  http_endpoint ep{"localhost", srv.port()};
  CHECK(http_call(ep, get("/")).body == "ok");
}

TEST_CASE("chunked bodies, with extensions and trailers, split at every byte") {
  std::string chunked = reply::chunked_head() + "5;name=value\r\nhello\r\n" + "1\r\n \r\n" +
                        "5 ; ext\r\nworld\r\n" + "0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n";
  SUBCASE("in one piece") {
    http_server srv([&](const seen_request&) { return reply::raw(chunked); });
    http_response r = http_call(parse_http_url(srv.url()), get("/"));
    CHECK(r.status == 200);
    CHECK(r.body == "hello world");
  }
  SUBCASE("one byte at a time") {
    http_server srv([&](const seen_request&) {
      reply rep;
      for (char c : chunked) rep.then(0ms, std::string(1, c));
      return rep;
    });
    http_response r = http_call(parse_http_url(srv.url()), get("/"));
    CHECK(r.body == "hello world");
  }
  SUBCASE("upper-case hex and a large chunk") {
    std::string big(0x1AB, 'z');
    http_server srv([&](const seen_request&) {
      return reply::raw(reply::chunked_head() + "1AB\r\n" + big + "\r\n0\r\n\r\n");
    });
    CHECK(http_call(parse_http_url(srv.url()), get("/")).body == big);
  }
}

TEST_CASE("a body without framing ends when the connection closes, 204 and HEAD have none") {
  http_server srv([](const seen_request& r) {
    if (r.target == "/close") return reply::raw("HTTP/1.1 200 OK\r\n\r\nuntil the end");
    if (r.target == "/204") return reply::raw("HTTP/1.1 204 No Content\r\n\r\n");
    if (r.target == "/continue")
      return reply::raw(
          "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    if (r.target == "/lf") return reply::raw("HTTP/1.0 200 OK\nContent-Length: 3\n\nabc");
    return reply::raw("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");  // HEAD: no body follows
  });
  auto ep = parse_http_url(srv.url());
  CHECK(http_call(ep, get("/close")).body == "until the end");
  CHECK(http_call(ep, get("/204")).status == 204);
  CHECK(http_call(ep, get("/continue")).body == "ok");
  CHECK(http_call(ep, get("/lf")).body == "abc");
  http_response head = http_call(ep, {"HEAD", "/", {}, {}});
  CHECK(head.status == 200);
  CHECK(head.body.empty());
}

TEST_CASE("404 and 500 are responses, not errors") {
  http_server srv(
      [](const seen_request& r) { return reply(r.target == "/a" ? 404 : 500, "nope"); });
  auto ep = parse_http_url(srv.url());
  CHECK(http_call(ep, get("/a")).status == 404);
  auto r = http_call(ep, get("/b"));
  CHECK(r.status == 500);
  CHECK(r.body == "nope");
}

TEST_CASE("malformed and truncated responses are EPROTO naming the URL") {
  struct bad_case {
    const char* name;
    std::string bytes;
  };
  std::vector<bad_case> cases = {
      {"garbage", "this is not http at all\r\n\r\n"},
      {"empty", ""},
      {"truncated head", "HTTP/1.1 200 OK\r\nContent-Le"},
      {"bad status", "HTTP/1.1 2x0 OK\r\n\r\n"},
      {"bad header", "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"},
      {"bad content-length", "HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n"},
      {"truncated content-length body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"},
      {"truncated chunked body", reply::chunked_head() + "a\r\nabc"},
      {"chunked body without last chunk", reply::chunked_head() + "3\r\nabc\r\n"},
      {"bad chunk size", reply::chunked_head() + "zz\r\nabc\r\n0\r\n\r\n"},
      {"chunk without CRLF", reply::chunked_head() + "3\r\nabcX\r\n0\r\n\r\n"},
      {"chunk size overflow", reply::chunked_head() + "fffffffffffffffff\r\n"},
      {"unsupported transfer coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    http_server srv([&](const seen_request&) { return reply::raw(c.bytes); });
    auto e = error_from([&] { http_call(parse_http_url(srv.url()), get("/meta")); });
    CHECK(e.errnum() == EPROTO);
    CHECK(e.path() == srv.url() + "/meta");
  }
}

TEST_CASE("connect refused is ECONNREFUSED and names the endpoint") {
  std::string url = holdfast_test::refused_url();
  auto e = error_from([&] { http_call(parse_http_url(url), get("/x")); });
  CHECK(e.errnum() == ECONNREFUSED);
  CHECK(e.operation() == "connect");
  CHECK(std::string(e.what()).find(url + "/x") != std::string::npos);
}

TEST_CASE("a connect that gets no answer times out at the connect timeout") {
  holdfast_test::blackhole hole;
  http_timeouts t{400ms, 5000ms};
  auto t0 = steady::now();
  auto e = error_from([&] { http_call(parse_http_url(hole.url()), get("/"), t); });
  double took = ms_since(t0);
  CHECK(e.errnum() == ETIMEDOUT);
  CHECK(e.operation() == "connect");
  CHECK(took >= 390);
  CHECK(took < 400 * 1.5 + 150);
}

TEST_CASE("a slow server times out at the read timeout, however it dribbles") {
  SUBCASE("silent") {
    http_server srv(
        [](const seen_request&) { return reply::delayed(5s, reply::response(200, "late")); });
    auto t0 = steady::now();
    auto e = error_from([&] { http_call(parse_http_url(srv.url()), get("/"), {1000ms, 400ms}); });
    double took = ms_since(t0);
    CHECK(e.errnum() == ETIMEDOUT);
    CHECK(took >= 390);
    CHECK(took < 400 * 1.5 + 150);
  }
  SUBCASE("one byte every 50 ms") {
    http_server srv([](const seen_request&) {
      reply r;
      std::string all = reply::response(200, std::string(100, 'x'));
      for (char c : all) r.then(50ms, std::string(1, c));
      return r;
    });
    auto t0 = steady::now();
    auto e = error_from([&] { http_call(parse_http_url(srv.url()), get("/"), {1000ms, 400ms}); });
    double took = ms_since(t0);
    CHECK(e.errnum() == ETIMEDOUT);
    CHECK(took < 400 * 1.5 + 150);
  }
  SUBCASE("head in time, body never completes") {
    http_server srv([](const seen_request&) {
      return reply::raw("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").keep_open();
    });
    auto e = error_from([&] { http_call(parse_http_url(srv.url()), get("/"), {1000ms, 400ms}); });
    CHECK(e.errnum() == ETIMEDOUT);
    CHECK(e.operation() == "recv");
  }
}

TEST_CASE("fault_io: EINTR is retried, short transfers are finished, EIO surfaces") {
  http_server srv([](const seen_request& r) {
    return reply::raw(reply::chunked_head() + reply::chunk("abc") + reply::chunk(r.target) +
                      reply::last_chunk());
  });
  auto ep = parse_http_url(srv.url());
  disarm_on_exit guard;
  SUBCASE("EINTR on recv, send, poll and connect") {
    for (io_op op : {io_op::recv, io_op::send, io_op::poll, io_op::connect}) {
      std::string name = holdfast::testing::to_string(op);
      CAPTURE(name);
      fault_plan::arm(fault{op, 1, EINTR, 1, 3});
      CHECK(http_call<fault_io>(ep, get("/t")).body == "abc/t");
      CHECK(fault_plan::failures() >= 1);
    }
  }
  SUBCASE("one byte per recv and per send") {
    fault_plan::arm(fault{io_op::recv, 1, 0, 1, 1000000});
    CHECK(http_call<fault_io>(ep, get("/t")).body == "abc/t");
    CHECK(fault_plan::failures() > 20);
    fault_plan::arm(fault{io_op::send, 1, 0, 1, 1000000});
    CHECK(http_call<fault_io>(ep, get("/t")).body == "abc/t");
    CHECK(fault_plan::failures() > 20);
  }
  SUBCASE("EIO on recv names the operation") {
    fault_plan::arm(fault{io_op::recv, 1, EIO});
    auto e = error_from([&] { http_call<fault_io>(ep, get("/t")); });
    CHECK(e.errnum() == EIO);
    CHECK(e.operation() == "recv");
    CHECK(e.path() == srv.url() + "/t");
  }
  SUBCASE("EIO at every call in turn: an error or a good response, never a hang or a crash") {
    fault_plan::reset_counts();
    CHECK(http_call<fault_io>(ep, get("/t")).body == "abc/t");
    auto calls = fault_plan::calls(io_op::any);
    REQUIRE(calls >= 5);
    int failed = 0;
    for (std::uint64_t k = 1; k <= calls; ++k) {
      CAPTURE(k);
      fault_plan::arm(fault{io_op::any, k, EIO});
      try {
        std::string body = http_call<fault_io>(ep, get("/t"), {1000ms, 1000ms}).body;
        CHECK(body == "abc/t");
        // A later call may not happen at all (recv found everything at once), and a failed
        // close goes unnoticed (the descriptor is gone either way); nothing else may.
        CHECK((fault_plan::failures() == 0 || fault_plan::last_failed() == io_op::close));
      } catch (const holdfast::error& e) {
        CHECK(e.errnum() == EIO);
        CHECK(fault_plan::failures() == 1);
        ++failed;
      }
    }
    // getaddrinfo, socket, connect, poll, getsockopt, send and the first recv always happen
    CHECK(failed >= 7);
  }
}

TEST_CASE("http_stream delivers a long-lived chunked body as it arrives, until the deadline") {
  http_server srv([](const seen_request&) {
    reply r = reply::raw(reply::chunked_head() + reply::chunk("{\"n\":0}"));
    for (int i = 1; i < 200; ++i) r.then(40ms, reply::chunk("{\"n\":" + std::to_string(i) + "}"));
    return r.keep_open();
  });
  auto ep = parse_http_url(srv.url());
  SUBCASE("deadline ends it quietly") {
    std::string got;
    auto t0 = steady::now();
    http_stream(ep, {"POST", "/v3/watch", {}, "{}"}, {1000ms, 200ms}, t0 + 600ms,
                [&](std::string_view b) {
                  got.append(b.data(), b.size());
                  return true;
                });
    double took = ms_since(t0);
    CHECK(took >= 590);
    CHECK(took < 600 * 1.5 + 150);
    CHECK(got.rfind("{\"n\":0}{\"n\":1}{\"n\":2}", 0) == 0);  // in order, de-chunked
    CHECK(got.find("\r\n") == std::string::npos);
  }
  SUBCASE("on_data returning false ends it at once") {
    int calls = 0;
    auto t0 = steady::now();
    http_stream(ep, get("/"), {}, t0 + 10s, [&](std::string_view) { return ++calls < 3; });
    CHECK(calls == 3);
    CHECK(ms_since(t0) < 2000);
  }
}

TEST_CASE("http_stream: a body that ends returns, errors and non-2xx throw") {
  http_server srv([](const seen_request& r) {
    if (r.target == "/short") return reply::raw(reply::response(200, "all of it"));
    if (r.target == "/404") return reply(404, "{\"error\":\"no such thing\"}");
    if (r.target == "/slow-head") return reply::delayed(5s, reply::response(200, "x"));
    return reply::raw(reply::chunked_head() + "5\r\nab");  // truncated
  });
  auto ep = parse_http_url(srv.url());
  auto far = steady::now() + 10s;
  std::string got;
  auto collect = [&](std::string_view b) {
    got.append(b.data(), b.size());
    return true;
  };
  http_stream(ep, get("/short"), {}, far, collect);
  CHECK(got == "all of it");
  auto e = error_from([&] { http_stream(ep, get("/404"), {}, far, collect); });
  CHECK(e.errnum() == EPROTO);
  CHECK(std::string(e.what()).find("status 404") != std::string::npos);
  CHECK(std::string(e.what()).find("no such thing") != std::string::npos);
  CHECK(error_from([&] { http_stream(ep, get("/cut"), {}, far, collect); }).errnum() == EPROTO);
  // the head must come within the read timeout...
  CHECK(error_from([&] {
          http_stream(ep, get("/slow-head"), {1000ms, 300ms}, far, collect);
        }).errnum() == ETIMEDOUT);
  // ...unless the caller's deadline comes first: then it is a quiet return
  auto t0 = steady::now();
  http_stream(ep, get("/slow-head"), {1000ms, 2000ms}, t0 + 300ms, collect);
  CHECK(ms_since(t0) < 300 * 1.5 + 150);
}

TEST_CASE("a cancel flag ends a call to a slow server well before its timeouts") {
  http_server srv(
      [](const seen_request&) { return reply::delayed(5s, reply::response(200, "x")); });
  holdfast_test::blackhole hole;
  for (const std::string& url : {srv.url(), hole.url()}) {  // waiting for the reply, and connecting
    CAPTURE(url);
    std::atomic<bool> cancel{false};
    std::atomic<steady::rep> cancelled_at{0};
    const pid_t caller = holdfast_test::this_thread_id();
    std::thread canceller([&] {
      // once the call is observed waiting in poll() (for the reply, or the connection)
      holdfast_test::wait_asleep_in_poll({caller}, 10s);
      cancelled_at = steady::now().time_since_epoch().count();
      cancel.store(true);
    });
    auto e = error_from([&] {
      http_call(parse_http_url(url), get("/"), {3000ms, 3000ms}, &cancel);
    });
    const auto ended = steady::now();
    canceller.join();
    CHECK(e.errnum() == ECANCELED);
    // cancelled, not timed out: a third of the 3 s timeouts tells the two apart
    CHECK(ended - steady::time_point(steady::duration(cancelled_at.load())) < 1000ms);
  }
}

TEST_CASE("http_stream: a cancel flag ends a silent stream before its deadline") {
  http_server srv([](const seen_request&) {
    return reply::raw(reply::chunked_head() + reply::chunk("first")).keep_open();
  });
  std::atomic<bool> cancel{false};
  std::string got;
  auto t0 = steady::now();
  auto e = error_from([&] {
    http_stream(
        parse_http_url(srv.url()), get("/watch"), {}, t0 + 10s,
        [&](std::string_view b) {
          got.append(b.data(), b.size());
          cancel.store(true);  // e.g. the owner is shutting down
          return true;
        },
        &cancel);
  });
  CHECK(e.errnum() == ECANCELED);
  CHECK(got == "first");
  CHECK(ms_since(t0) < 2000);  // cancelled, not at the 10 s deadline: a fifth of it
}

TEST_CASE("a huge error body reaches a message capped, saying how long it was") {
  // Invariant: a message shows at most the first 200 bytes of a reply body, then its length,
  // however long the body (an error body may be up to 64 MiB).
  const std::string body = "start-" + std::string(std::size_t{3} << 20, 'x');  // 3 MiB
  http_server srv([&](const seen_request&) { return reply(500, body); });
  const auto ep = parse_http_url(srv.url());
  const std::string length = "(" + std::to_string(body.size()) + " bytes)";
  auto check_capped = [&](const holdfast::error& e) {
    const std::string what = e.what();
    INFO(what.substr(0, 600));
    CHECK(e.errnum() == EPROTO);
    CHECK(what.find("status 500: start-xxx") != std::string::npos);
    CHECK(what.find(length) != std::string::npos);
    CHECK(what.size() < 600);
  };
  const http_timeouts t{1000ms, 20000ms};  // ample for 3 MiB on a loaded machine
  check_capped(error_from([&] {
    http_stream(ep, get("/stream"), t, steady::now() + 20s, [](std::string_view) { return true; });
  }));
  using transport = holdfast::plain_transport<holdfast::posix_io>;
  check_capped(error_from([&] {
    holdfast::detail::http_open_stream<holdfast::posix_io, transport> open(
        transport().connect(ep, t.connect, srv.url(), nullptr), ep, get("/watch"), t, nullptr);
  }));
}

namespace {

using pool_t =
    holdfast::detail::http_pool<holdfast::posix_io, holdfast::plain_transport<holdfast::posix_io>>;

// A server that answers "/first" (keeping the connection), then reads the next request on that
// connection and closes it without a byte of reply, as a server that applied a request and then
// lost its connection; the same request again (on a fresh connection) is answered.
holdfast_test::http_server::handler closes_the_second() {
  auto seen = std::make_shared<int>(0);
  return [seen](const seen_request& r) {
    if (r.target == "/first") return reply(200, "one").keep_alive();
    return ++*seen == 1 ? reply() : reply(200, "again");
  };
}

std::vector<std::string> targets(const http_server& srv) {
  std::vector<std::string> out;
  for (const auto& r : srv.requests()) out.push_back(r.target);
  return out;
}

}  // namespace

TEST_CASE("http_pool: a request that may have been applied is never sent twice") {
  using holdfast::detail::http_resend;
  http_server srv(closes_the_second());
  auto ep = parse_http_url(srv.url());
  pool_t pool({}, 4);
  REQUIRE(pool.call(ep, {"POST", "/first", {}, "{}"}, {}, http_resend::on_stale).body == "one");
  REQUIRE(pool.idle(&ep) == 1);  // the write below goes on this reused connection
  CHECK_THROWS_AS(pool.call(ep, {"POST", "/txn", {}, "{}"}, {}, http_resend::never),
                  holdfast::detail::http_connection_closed);
  // The invariant: the server saw the write once. A call after it is the next request it saw.
  CHECK(pool.call(ep, {"POST", "/first", {}, "{}"}, {}, http_resend::on_stale).body == "one");
  CHECK(targets(srv) == std::vector<std::string>{"/first", "/txn", "/first"});
  CHECK(pool.requests() == 3);
}

TEST_CASE("http_pool: a read whose reused connection closed unanswered is sent once more") {
  using holdfast::detail::http_resend;
  http_server srv(closes_the_second());
  auto ep = parse_http_url(srv.url());
  pool_t pool({}, 4);
  REQUIRE(pool.call(ep, {"POST", "/first", {}, "{}"}, {}, http_resend::on_stale).body == "one");
  REQUIRE(pool.idle(&ep) == 1);
  CHECK(pool.call(ep, {"POST", "/range", {}, "{}"}, {}, http_resend::on_stale).body == "again");
  CHECK(targets(srv) == std::vector<std::string>{"/first", "/range", "/range"});
  CHECK(pool.requests() == 3);
  CHECK(pool.connections() == 2);  // the resend went on a fresh connection
}
