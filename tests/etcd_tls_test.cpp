// etcd_kv over TLS and with authentication, through the transport seam, against real etcd
// members (etcd_server with an etcd_tls_spec) and certificates made by the openssl command line:
// TLS with password auth, TLS with client certificates, every bad input (wrong CA, expired,
// self-signed, wrong host, wrong password, http against TLS and the reverse, a server that
// accepts and never answers, one that answers garbage) as a clear holdfast::error within the
// connect timeout, token expiry between requests and during a watch, connection reuse (one
// handshake for many requests), fault_io failing every socket call under TLS, secrets never in an
// error message, make_kv with etcds:// URLs, the agreement with forked workers over TLS + auth,
// and the multi-process demo over etcds://.
//
// Built only when CMake finds OpenSSL (a CI build without it fails at configure time).
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/kv/url.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "openssl_transport.hpp"
#include "support/elapsed.hpp"
#include "support/etcd_client.hpp"
#include "support/etcd_server.hpp"
#include "support/expect_error.hpp"
#include "support/fault_sweep.hpp"
#include "support/http_server.hpp"
#include "support/process_job.hpp"
#include "support/tls_etcd.hpp"

using namespace std::chrono_literals;
using holdfast::etcd_options;
using holdfast::kv_namespace;
using holdfast_test::contains;
using holdfast_test::ms_since;
using holdfast_test::reply;
using holdfast_test::shared_certs;
using holdfast_test::tls_member;
using holdfast_test::trusting_ca;
using clk = std::chrono::steady_clock;
using tls = holdfast_tls::openssl_transport<>;
using tls_kv = holdfast::basic_etcd_kv<holdfast::posix_io, tls>;

namespace {

const kv_namespace ns0("run", 0);
const std::string password = "pw-7f3a9c-s3cret";  // must never show in an error

// Every error text the tests provoke, to search for secrets.
std::vector<std::string>& seen_errors() {
  static std::vector<std::string> all;
  return all;
}

// Records an error's text and checks that no secret is in it.
void seen(const holdfast::error& e) {
  seen_errors().push_back(e.what());
  CHECK_FALSE(contains(e.what(), password));
}

// Runs `op`; returns the holdfast::error it threw (fails the test when none), seen().
template <class Op>
holdfast::error error_from(Op op) {
  return holdfast_test::error_from(op, seen);
}

std::string password_file() {
  static std::string path =
      holdfast_test::tls_certs::write(shared_certs().dir / "password", password + "\n");
  return path;
}

// One POST over TLS (CA verified), for set-up: the server's JSON reply; throws on an error.
std::string tls_post(const std::string& url, const std::string& target, const std::string& body) {
  namespace hd = holdfast::detail;
  auto r = hd::http_call_over<holdfast::posix_io>(tls(trusting_ca()), hd::parse_endpoint_url(url),
                                                  hd::http_request{"POST", target, {}, body},
                                                  hd::http_timeouts{2000ms, 5000ms}, nullptr);
  if (r.status != 200) throw std::runtime_error(target + ": " + r.body);
  return r.body;
}

// Adds user root with `password`, grants it the root role and turns authentication on.
void enable_auth(const std::string& url) {
  tls_post(url, "/v3/auth/user/add", R"({"name":"root","password":")" + password + R"("})");
  tls_post(url, "/v3/auth/user/grant", R"({"user":"root","role":"root"})");
  tls_post(url, "/v3/auth/enable", "{}");
}

// The binary's TLS + password-auth member, with a 1 s token TTL: tokens expire between most
// requests of every test that uses it.
holdfast_test::etcd_server& auth_server() {
  static holdfast_test::etcd_server s(tls_member(shared_certs().server_cert, 1));
  static bool enabled = (enable_auth(s.url()), true);
  (void)enabled;
  return s;
}

etcd_options tls_options_for(const std::string& url, bool with_auth = true,
                             std::chrono::milliseconds connect = 1000ms,
                             std::chrono::milliseconds request = 3000ms) {
  etcd_options o = holdfast_test::etcd_client_options({url}, request, connect);
  o.tls = trusting_ca();
  if (with_auth) {
    o.user = "root";
    o.password_file = password_file();
  }
  return o;
}

// A listening socket nobody accepts from: the kernel completes the TCP handshake, then the
// server never says a word (a TLS handshake waits forever).
struct silent_listener {
  int fd = -1;
  std::uint16_t port = 0;
  silent_listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~silent_listener() { ::close(fd); }
  std::string url(const char* scheme = "https://") const {
    return scheme + std::string("127.0.0.1:") + std::to_string(port);
  }
};

// Waits up to 10 s until `kv` has opened `n` watches (its get is watching, not ranging): the
// observed state a writer waits for before the put that must reach the get through its watch.
bool watch_opened(const tls_kv& kv, std::uint64_t n = 1) {
  const auto end = clk::now() + 10s;
  while (kv.stats().watch_opens < n) {
    if (clk::now() >= end) return false;
    std::this_thread::sleep_for(1ms);  // a bounded look, not an order
  }
  return true;
}

}  // namespace

TEST_CASE("etcd over TLS with password auth: every operation, watches, the token on each") {
  auto& server = auth_server();
  tls_kv kv(tls_options_for(server.url()), ns0);
  CHECK(kv.insert("a", "1"));
  CHECK_FALSE(kv.insert("a", "2"));
  kv.put("b/c", "3");
  CHECK(kv.try_get("a") == std::optional<std::string>("1"));
  CHECK(kv.list("b").size() == 1);
  CHECK(kv.erase("b/c"));
  std::thread writer([&] {
    CHECK(watch_opened(kv));  // the get is watching: the value reaches it through the watch
    tls_kv(tls_options_for(server.url()), ns0).put("later", "w");
  });
  auto t0 = clk::now();
  CHECK(kv.get("later", 5s) == std::optional<std::string>("w"));  // a watch, authenticated
  CHECK(ms_since(t0) < 3000);
  writer.join();
  CHECK(kv.authentications() >= 1);

  // The password from an environment variable works the same.
  ::setenv("HOLDFAST_TEST_ETCD_PASSWORD", password.c_str(), 1);
  auto o = tls_options_for(server.url());
  o.password_file.clear();
  o.password_env = "HOLDFAST_TEST_ETCD_PASSWORD";
  CHECK(tls_kv(o, ns0).try_get("a") == std::optional<std::string>("1"));
  ::unsetenv("HOLDFAST_TEST_ETCD_PASSWORD");
  auto e = error_from([&] { tls_kv(o, ns0); });  // the variable is gone
  CHECK(e.errnum() == EINVAL);
  CHECK(contains(e.what(), "HOLDFAST_TEST_ETCD_PASSWORD"));

  // Without credentials the cluster refuses, and the error says what is missing.
  e = error_from([&] { tls_kv(tls_options_for(server.url(), false), ns0).try_get("a"); });
  CHECK(e.errnum() == EACCES);
  CHECK(contains(e.what(), "user name is empty"));
  CHECK(contains(e.what(), "requires authentication"));

  // A wrong password: EACCES naming the user and the endpoint, never the password.
  const std::string wrong_file =
      holdfast_test::tls_certs::write(shared_certs().dir / "wrong-password", "not-it\n");
  o = tls_options_for(server.url());
  o.password_file = wrong_file;
  t0 = clk::now();
  e = error_from([&] { tls_kv(o, ns0).put("a", "x"); });
  CHECK(ms_since(t0) < 3000 / 2);  // refused once, not retried until the 3 s request timeout
  CHECK(e.errnum() == EACCES);
  CHECK(contains(e.what(), "authentication failed"));
  CHECK(contains(e.what(), "user 'root'"));
  CHECK(contains(e.what(), server.url()));
  CHECK_FALSE(contains(e.what(), "not-it"));
}

TEST_CASE("etcd over TLS: one handshake serves many requests — a suspect's connections drop") {
  using holdfast::testing::fault;
  using holdfast::testing::fault_io;
  using holdfast::testing::fault_plan;
  using holdfast::testing::io_op;
  auto& server = auth_server();
  holdfast::basic_etcd_kv<fault_io, holdfast_tls::openssl_transport<fault_io>> kv(
      tls_options_for(server.url()), ns0);
  kv.put("reuse", "x");
  fault_plan::arm(fault{io_op::any, std::uint64_t(1) << 62, EIO});  // counts, never fires
  for (int i = 0; i < 20; ++i) CHECK(kv.try_get("reuse") == std::optional<std::string>("x"));
  CHECK(fault_plan::calls(io_op::connect) <= 1);  // at most one re-authentication's reconnect
  fault_plan::disarm();
  CHECK(kv.idle_connections() == 1);

  // Failover: a refused endpoint first, then the TLS member; the refused one turns suspect.
  auto o = tls_options_for(holdfast_test::refused_url());
  o.endpoints.front().replace(0, 4, "https");
  o.endpoints.push_back(server.url());
  tls_kv two(o, ns0);
  CHECK(two.try_get("reuse") == std::optional<std::string>("x"));
  CHECK(two.idle_connections() == 1);
  // The member hangs: a request times out, the member turns suspect and its connection goes.
  auto quick = tls_options_for(server.url(), true, 1000ms, 500ms);
  tls_kv q(quick, ns0);
  q.put("q", "1");
  CHECK(q.idle_connections() == 1);
  server.freeze();
  auto e = error_from([&] { q.put("q", "2"); });
  server.thaw();
  CHECK(e.errnum() == ETIMEDOUT);
  CHECK(q.idle_connections() == 0);
  q.put("q", "3");  // a fresh connection (and handshake)
  CHECK(q.try_get("q") == std::optional<std::string>("3"));
}

TEST_CASE("etcd over TLS with client certificates (auth off)") {
  auto t = tls_member(shared_certs().server_cert);
  t.trusted_ca_file = shared_certs().ca;
  t.client_cert_auth = true;
  holdfast_test::etcd_server server(t);
  auto o = tls_options_for(server.url(), false);
  o.tls.cert_file = shared_certs().client_cert;
  o.tls.key_file = shared_certs().client_key;
  tls_kv kv(o, ns0);
  CHECK(kv.insert("k", "v"));
  CHECK(kv.get("k", 1s) == std::optional<std::string>("v"));

  // Without a certificate the server refuses: a clear error, not a hang.
  auto t0 = clk::now();
  auto e = error_from([&] { tls_kv(tls_options_for(server.url(), false), ns0).put("k", "w"); });
  CHECK(ms_since(t0) < 3000 * 3 / 2);  // not a hang: the 3 s request timeout, checked at 1.5 x
  CHECK(e.errnum() == EPROTO);
  CHECK(contains(e.what(), server.url()));
  CHECK(contains(e.what(), "certificate"));

  // A certificate without its key, and a missing CA file, are refused up front.
  o.tls.key_file.clear();
  e = error_from([&] { tls_kv(o, ns0); });
  CHECK(e.errnum() == EINVAL);
  o = tls_options_for(server.url(), false);
  o.tls.ca_file = shared_certs().dir / "no-such-ca.crt";
  e = error_from([&] { tls_kv(o, ns0); });
  CHECK(e.errnum() == ENOENT);
  CHECK(contains(e.what(), "no-such-ca.crt"));
}

TEST_CASE(
    "etcd over TLS: bad certificates, names and servers fail clearly within the connect timeout") {
  auto& good = auth_server();
  holdfast_test::etcd_server expired(tls_member(shared_certs().expired_cert));
  holdfast_test::etcd_server self_signed(tls_member(shared_certs().self_signed));
  holdfast_test::etcd_server wrong_host(tls_member(shared_certs().wrong_host));
  holdfast_test::etcd_server plain;
  silent_listener silent;
  // Answers garbage to whatever arrives (a TLS ClientHello included).
  holdfast_test::http_server garbage(
      [](const holdfast_test::seen_request&) { return reply::raw("garbage\r\n\r\n"); });
  std::atomic<bool> stop{false};
  silent_listener chatty;  // accepts and answers garbage at once, without reading a request
  std::thread chatter([&] {
    while (!stop) {
      pollfd p{chatty.fd, POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      int c = ::accept(chatty.fd, nullptr, nullptr);
      if (c < 0) continue;
      (void)!::send(c, "HELLO THERE\r\n\r\n", 15, MSG_NOSIGNAL);
      ::close(c);
    }
  });

  struct bad_case {
    const char* name;
    std::string url;
    std::string ca;
    std::string server_name;
    int errnum;
    const char* why;
  };
  const std::string garbage_url = "https" + garbage.url().substr(4);
  const bad_case cases[] = {
      {"wrong CA", good.url(), shared_certs().other_ca, "", EPROTO, "unable to get local issuer"},
      {"expired", expired.url(), shared_certs().ca, "", EPROTO, "certificate has expired"},
      {"self-signed", self_signed.url(), shared_certs().ca, "", EPROTO, "self-signed certificate"},
      {"wrong host (IP SAN)", wrong_host.url(), shared_certs().ca, "", EPROTO,
       "IP address mismatch"},
      {"wrong server_name", good.url(), shared_certs().ca, "etcd.example", EPROTO,
       "hostname mismatch"},
      {"TLS client, plain server", "https" + plain.url().substr(4), shared_certs().ca, "",
       ECONNRESET, "not a TLS server"},
      {"accepts, never answers", silent.url(), shared_certs().ca, "", ETIMEDOUT,
       "no TLS handshake within"},
      {"reads the hello, never answers", garbage_url, shared_certs().ca, "", ETIMEDOUT,
       "is it a TLS server?"},
      {"answers garbage at once", chatty.url(), shared_certs().ca, "", EPROTO, "not a TLS server"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    auto o = tls_options_for(c.url, false, 700ms, 2000ms);
    o.tls.ca_file = c.ca;
    o.tls.server_name = c.server_name;
    tls_kv kv(o, ns0);
    auto t0 = clk::now();
    auto e = error_from([&] { kv.put("k", "v"); });
    auto ms = ms_since(t0);
    INFO(std::string(e.what()));
    CHECK(e.errnum() == c.errnum);
    CHECK(contains(e.what(), c.url));
    CHECK(contains(e.what(), c.why));
    CHECK(contains(e.what(), "tls handshake"));
    CHECK(ms < 700 * 3 / 2);  // the 700 ms connect timeout, checked at 1.5 x
  }

  // insecure_skip_verify, named explicitly, accepts the self-signed server.
  auto o = tls_options_for(self_signed.url(), false);
  o.tls.ca_file.clear();
  o.tls.insecure_skip_verify = true;
  tls_kv lax(o, ns0);
  lax.put("k", "v");
  CHECK(lax.try_get("k") == std::optional<std::string>("v"));

  // A plain-http client against the TLS member: told to use https://.
  etcd_options plain_client;
  plain_client.endpoints = {"http" + good.url().substr(5)};
  plain_client.connect_timeout = 700ms;
  auto t0 = clk::now();
  auto e = error_from([&] { holdfast::etcd_kv(plain_client, ns0).put("k", "v"); });
  CHECK(ms_since(t0) < 2000);
  INFO(std::string(e.what()));
  // etcd 3.4 closes (or resets) the connection without a word; a server that answers Go's "400
  // Client sent an HTTP request to an HTTPS server" gets "speaks TLS: use https://".
  CHECK((e.errnum() == ECONNRESET || e.errnum() == EPROTO));
  CHECK(contains(e.what(), plain_client.endpoints.front()));
  CHECK((contains(e.what(), "https://?") || contains(e.what(), "speaks TLS") ||
         contains(e.what(), "reset")));
  // ...and an https:// endpoint without a TLS transport is refused up front.
  plain_client.endpoints = {good.url()};
  CHECK(error_from([&] { holdfast::etcd_kv(plain_client, ns0); }).errnum() == EINVAL);

  stop = true;
  chatter.join();
}

TEST_CASE("etcd over TLS: tokens that expire between requests and during a watch fail nothing") {
  auto& server = auth_server();  // --auth-token-ttl 1
  tls_kv kv(tls_options_for(server.url(), true, 1000ms, 1000ms), ns0);
  kv.put("ttl/a", "1");
  const auto first = kv.authentications();
  for (int i = 0; i < 3; ++i) {
    // a stall the test injects on purpose: the token has expired (TTL 1 s, swept every ~0.5 s)
    std::this_thread::sleep_for(1600ms);
    kv.put("ttl/a", std::to_string(i));
    CHECK(kv.try_get("ttl/a") == std::optional<std::string>(std::to_string(i)));
  }
  CHECK(kv.authentications() > first);  // it did authenticate again

  // A long get: its watch outlives the token (windows of request_timeout = 1 s, each followed by
  // a range with an expired token): the value still arrives.
  const auto opened = kv.stats().watch_opens;
  std::thread writer([&] {
    CHECK(watch_opened(kv, opened + 1));  // the get is watching
    // A stall the test injects on purpose: the token (TTL 1 s, swept every ~0.5 s) expires
    // while the get waits, across several 1 s watch windows.
    std::this_thread::sleep_for(3500ms);
    tls_kv(tls_options_for(server.url()), ns0).put("ttl/late", "w");
  });
  auto t0 = clk::now();
  CHECK(kv.get("ttl/late", 8s) == std::optional<std::string>("w"));
  CHECK(ms_since(t0) < 6000);
  writer.join();

  // One watch open across the expiry (request_timeout 5 s: a single watch window).
  tls_kv patient(tls_options_for(server.url(), true, 1000ms, 5000ms), ns0);
  std::thread writer2([&] {
    CHECK(watch_opened(patient));  // its one watch is open
    // A stall the test injects on purpose: the token expires while that watch is open.
    std::this_thread::sleep_for(2500ms);
    tls_kv(tls_options_for(server.url()), ns0).put("ttl/watched", "w2");
  });
  t0 = clk::now();
  CHECK(patient.get("ttl/watched", 8s) == std::optional<std::string>("w2"));
  CHECK(ms_since(t0) < 4500);
  writer2.join();
}

TEST_CASE(
    "etcd auth: a refused token means one new authentication and one retry, and no secret leaks") {
  // A fake etcd that hands out a known token, then refuses it as it pleases.
  const std::string token = "TOKEN-d41d8cd98f";
  std::atomic<int> mode{0};
  std::mutex mu;
  std::vector<std::string> authorizations;
  holdfast_test::http_server fake([&](const holdfast_test::seen_request& r) {
    if (r.target == "/v3/auth/authenticate") {
      CHECK(contains(r.body, password));
      return reply(200, R"({"header":{},"token":")" + token + R"("})");
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      authorizations.push_back(r.header("Authorization"));
    }
    if (mode == 0) return reply(200, R"({"header":{"revision":"2"}})");
    if (mode == 1)
      return reply(401, R"({"error":"etcdserver: invalid auth token","code":16,)"
                        R"("message":"etcdserver: invalid auth token"})");
    return reply(500, "boom " + r.header("Authorization"));  // even an echoing server
  });
  etcd_options o;
  o.endpoints = {fake.url()};
  o.user = "root";
  o.password_file = password_file();
  holdfast::etcd_kv kv(o, ns0);
  CHECK_FALSE(kv.try_get("k").has_value());
  CHECK(kv.authentications() == 1);
  REQUIRE(authorizations.size() == 1);
  CHECK(authorizations[0] == token);

  mode = 1;
  auto e = error_from([&] { kv.put("k", "v"); });
  CHECK(e.errnum() == EACCES);
  CHECK(contains(e.what(), "invalid auth token"));
  CHECK(kv.authentications() == 2);   // once more...
  CHECK(authorizations.size() == 3);  // ...and the request once more, then the error
  CHECK_FALSE(contains(e.what(), token));

  mode = 2;
  e = error_from([&] { kv.put("k", "v"); });
  CHECK(e.errnum() == EIO);
  for (const auto& text : seen_errors()) {
    INFO(text);
    CHECK_FALSE(contains(text, password));
  }
  // The echoing server's body is quoted in the error: holdfast cannot stop a server from
  // repeating the token, but its own messages never contain it.
  CHECK(contains(e.what(), "status 500"));
}

TEST_CASE("etcd over TLS: every socket call failed in turn is a clear error, never a hang") {
  using holdfast::testing::fault;
  using holdfast::testing::fault_io;
  using holdfast::testing::fault_plan;
  using holdfast::testing::io_op;
  holdfast_test::disarm_on_exit guard;
  auto& server = auth_server();
  auto o = tls_options_for(server.url(), true, 1000ms, 2000ms);
  for (std::size_t pool : {std::size_t{0}, std::size_t{4}}) {
    CAPTURE(pool);
    o.idle_connections = pool;
    holdfast::basic_etcd_kv<fault_io, holdfast_tls::openssl_transport<fault_io>> kv(o, ns0);
    kv.put("f", "v");
    for (int op = 0; op < 2; ++op) {
      CAPTURE(op);
      auto run = [&] { return op == 0 ? !kv.insert("f", "w") : !kv.get("absent", 300ms); };
      holdfast_test::call_sweep sweep;
      sweep.min_calls = 2;
      sweep.extra = 8;
      sweep.pooled = pool > 0;
      sweep.bound_ms = 2000 * 3 / 2 + 1100;  // a request timeout (at 1.5 x) and a connect at most
      holdfast_test::fail_each_call(sweep, run, [&](const holdfast::error& e) {
        seen(e);
        CHECK(contains(e.what(), op == 0 ? "etcd insert 'f'" : "etcd get 'absent'"));
      });
    }
  }
  // The first connect, send and recv of a fresh client, each failed: an error naming the call.
  o.idle_connections = 4;
  for (io_op op : {io_op::connect, io_op::send, io_op::recv}) {
    CAPTURE(holdfast::testing::to_string(op));
    holdfast::basic_etcd_kv<fault_io, holdfast_tls::openssl_transport<fault_io>> kv(o, ns0);
    fault_plan::arm(fault{op, 1, ECONNRESET});
    auto e = error_from([&] { kv.put("f", "x"); });
    fault_plan::disarm();
    CHECK(e.errnum() == ECONNRESET);
  }
}

TEST_CASE("make_kv<openssl_transport>: an etcds:// URL with CA, user and password file") {
  auto& server = auth_server();
  const std::string url = "etcds://127.0.0.1:" + std::to_string(server.port()) +
                          "/urltls?ca=" + shared_certs().ca +
                          "&user=root&password_file=" + password_file();
  holdfast::any_kv kv = holdfast::make_kv<tls>(url, {"run", 1});
  CHECK(kv.insert("k", "v"));
  CHECK(kv.get("k", 1s) == std::optional<std::string>("v"));
  auto o = tls_options_for(server.url());
  o.prefix = "urltls";
  CHECK(tls_kv(o, {"run", 1}).try_get("k") == std::optional<std::string>("v"));
  // Without a TLS transport, etcds:// is refused with a pointer to one.
  auto e = error_from([&] { holdfast::make_kv(url, {"run", 1}); });
  CHECK(e.errnum() == EPROTONOSUPPORT);
  CHECK(contains(e.what(), "openssl_transport"));
}

namespace {

/// The process_job backend over the TLS + auth member (forked workers, real notices).
struct tls_etcd_backend {
  static constexpr const char* name = "etcd_kv over TLS + auth";
  std::string url = auth_server().url();
  // written here, in the parent: forked workers writing it at once would read each other's
  // truncated file
  std::string pw_file = password_file();
  tls_kv make_kv(const kv_namespace& ns) const {
    return tls_kv(tls_options_for(url, true, 1000ms, 5000ms), ns);
  }
  tls_kv make_observer_kv(const kv_namespace& ns) const { return make_kv(ns); }
  static std::chrono::milliseconds watch() { return std::chrono::milliseconds(50); }
};

}  // namespace

TEST_CASE("agreement over TLS + auth: 4 forked workers save at one step and exit 42") {
  tls_etcd_backend be;
  INFO(std::string(tls_etcd_backend::name));
  for (auto noticed : {std::vector<int>{2}, std::vector<int>{0, 3}}) {
    holdfast_test::job j;
    holdfast_test::scenario sc;
    auto r = holdfast_test::run_job(be, j, sc, noticed);
    INFO(holdfast_test::describe(r));
    holdfast_test::check_agreed_exit(r, 42);
  }
}

#ifdef HOLDFAST_DEMO_TLS_BINARY
TEST_CASE("the preemptible_training demo over etcds:// with a CA, a user and a password file") {
  auto& server = auth_server();
  const std::string url = "etcds://127.0.0.1:" + std::to_string(server.port()) +
                          "?ca=" + shared_certs().ca +
                          "&user=root&password_file=" + password_file();
  const std::string cmd = std::string("'") + HOLDFAST_DEMO_TLS_BINARY +
                          "' --workers 3 --steps 24 --preempt-at 8 --kv='" + url + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  INFO(out);
  CHECK(status == 0);
  CHECK(contains(out, "verdict: PASS"));
  CHECK(contains(out, "coordination: etcds://"));
  CHECK_FALSE(contains(out, password));
}
#endif
