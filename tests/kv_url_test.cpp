// kv/url.hpp and kv/any.hpp: the store URL grammar (every accepted form and the refusals, each
// naming the offset), make_kv over a real directory and a real etcd, and any_kv's forwarding,
// including the optional operations of a store that has only c10d's four, the watch (and a
// watch that follows one key), get_many and the held store's stats.
#include <doctest/doctest.h>
#include <poll.h>

#include <holdfast/kv/any.hpp>
#include <holdfast/kv/in_process.hpp>
#include <holdfast/kv/url.hpp>
#include <holdfast/store/url.hpp>  // parse_store_url: one rule for plain paths
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/c10d_like_kv.hpp"
#include "support/etcd_server.hpp"
#include "support/key_wait_kv.hpp"
#include "support/temp_dir.hpp"

using holdfast::kv_url;
using holdfast::parse_kv_url;
using namespace std::chrono_literals;

namespace {

// Parses each URL of `bad` ({url, what its refusal names}): each must be refused with a
// format_error whose message names it; `check(url, error)` looks at the rest.
template <std::size_t N, class Check>
void check_refused(const std::pair<const char*, const char*> (&bad)[N], Check check) {
  for (const auto& item : bad) {
    const char* url = item.first;
    const char* why = item.second;
    INFO(url);
    try {
      parse_kv_url(url);
      FAIL("accepted");
    } catch (const holdfast::format_error& e) {
      INFO(std::string(e.what()));
      CHECK(std::string(e.what()).find(why) != std::string::npos);
      check(url, e);
    }
  }
}

}  // namespace

TEST_CASE("kv url: file and etcd forms") {
  auto f = parse_kv_url("file:///shared/dir/");
  CHECK(f.scheme == kv_url::kind::file);
  CHECK(f.directory == "/shared/dir");
  CHECK(parse_kv_url("FILE:///x").directory == "/x");

  auto e = parse_kv_url("etcd://10.0.0.5:2379,10.0.0.6,[::1]:2380/jobs/a");
  CHECK(e.scheme == kv_url::kind::etcd);
  CHECK(e.endpoints == std::vector<std::string>{"http://10.0.0.5:2379", "http://10.0.0.6:2379",
                                                "http://[::1]:2380"});
  CHECK(e.prefix == "jobs/a");
  CHECK(parse_kv_url("etcd://h").prefix == "holdfast");
  CHECK(parse_kv_url("etcd://h:1/p/").prefix == "p");
  CHECK(parse_kv_url("etcd://[::1]").endpoints == std::vector<std::string>{"http://[::1]:2379"});
}

TEST_CASE("kv url: an absolute path is a directory store, as store::create takes it") {
  // One rule for plain paths (make_kv("/tmp/kv") was refused while store::create accepted it).
  CHECK(parse_kv_url("/shared/kv").scheme == holdfast::kv_url::kind::file);
  CHECK(parse_kv_url("/shared/kv//").directory == "/shared/kv");
  CHECK(parse_kv_url("/shared/kv").directory == parse_kv_url("file:///shared/kv").directory);
  CHECK(holdfast::parse_store_url("/shared/kv").path == "/shared/kv");
  const std::pair<const char*, const char*> bad[] = {
      {"shared/kv",
       "offset 0: unknown scheme (expected file://, etcd://, etcds:// or an "
       "absolute directory; a relative path would name another directory"},
      {"/", "offset 0: the root directory is not a store"},
      {"/a?x=1", "offset 2: no query or fragment"},
  };
  for (const auto& [url, what] : bad) {
    try {
      parse_kv_url(url);
      FAIL("accepted " << url);
    } catch (const holdfast::format_error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, e.what());
    }
  }
}

TEST_CASE("kv url: refusals name the url and the offset") {
  const std::pair<const char*, const char*> bad[] = {
      {"", "offset 0: unknown scheme"},
      {"etcs://h", "offset 0: unknown scheme"},
      {"redis://h:1", "offset 0: unknown scheme"},
      {"file://relative", "offset 7: expected an absolute directory"},
      {"file://", "offset 7"},
      {"file:///", "root directory"},
      {"file:///a?x", "offset 9: no query"},
      {"etcd://", "offset 7: no etcd member"},
      {"etcd:///p", "offset 7: no etcd member"},
      {"etcd://a,,b", "offset 9: empty member"},
      {"etcd://a,", "offset 9: empty member"},
      {"etcd://h:0", "port"},
      {"etcd://h:70000", "bad member"},
      {"etcd://h:x", "bad member"},
      {"etcd://h:1?ca=x", "etcd:// takes only lease_ttl= and leased_prefix="},
      {"etcd://h:1/a//b", "bad prefix"},
      {"etcd://h:1/a/../b", "bad prefix"},
      {"etcd://h:1/p?x", "offset 13: query parameter without '='"},
      {"etcd://[::1:1", "bad member"},
      {"etcd://h 1", "' ' not allowed"},
  };
  check_refused(bad,
                [](const char* url, const holdfast::format_error& e) { CHECK(e.path() == url); });
  try {  // a query value is never shown, even where no query belongs
    parse_kv_url("file:///a?x=1");
    FAIL("accepted");
  } catch (const holdfast::format_error& e) {
    CHECK(std::string(e.what()).find("offset 9: no query") != std::string::npos);
    CHECK(e.path() == "file:///a?x=***");
  }
  try {
    parse_kv_url(std::string("file:///a\0b", 11));
    FAIL("accepted a NUL");
  } catch (const holdfast::format_error& e) {
    CHECK(std::string(e.what()).find("offset 9: NUL") != std::string::npos);
  }
  try {  // DEL is a control byte as those below ' ' are (url_fuzz found a host holding one)
    parse_kv_url(
        "etcd://h\x7f"
        "1:2379");
    FAIL("accepted a DEL in a host");
  } catch (const holdfast::format_error& e) {
    CHECK(std::string(e.what()).find("offset 7: character '\\x7f' not allowed in a host") !=
          std::string::npos);
    CHECK(e.path() == "etcd://h\\x7f1:2379");
  }
}

TEST_CASE("kv url: the secure form etcds:// with its query") {
  auto e = parse_kv_url(
      "etcds://10.0.0.5:2379,[::1]/jobs/a?ca=/etc/etcd/ca.pem&cert=/c.pem&key=/k.pem"
      "&server_name=etcd.internal&user=trainer&password_file=/run/secrets/etcd%20pw");
  CHECK(e.scheme == kv_url::kind::etcd);
  CHECK(e.secure);
  CHECK(e.endpoints == std::vector<std::string>{"https://10.0.0.5:2379", "https://[::1]:2379"});
  CHECK(e.prefix == "jobs/a");
  CHECK(e.tls.ca_file == "/etc/etcd/ca.pem");
  CHECK(e.tls.cert_file == "/c.pem");
  CHECK(e.tls.key_file == "/k.pem");
  CHECK(e.tls.server_name == "etcd.internal");
  CHECK(e.user == "trainer");
  CHECK(e.password_file == "/run/secrets/etcd pw");  // %-escapes decoded
  CHECK(e.password_env.empty());

  auto bare = parse_kv_url("ETCDS://h:1");  // no query: the system's CAs, no authentication
  CHECK(bare.secure);
  CHECK(bare.endpoints == std::vector<std::string>{"https://h:1"});
  CHECK(bare.prefix == "holdfast");
  CHECK(bare.tls.empty());
  auto env = parse_kv_url("etcds://h?user=u&password_env=ETCD_PW");
  CHECK(env.password_env == "ETCD_PW");
  CHECK(env.prefix == "holdfast");
  CHECK_FALSE(parse_kv_url("etcd://h").secure);
}

TEST_CASE("kv url: a password in a URL is refused, and never shown") {
  const std::pair<const char*, const char*> bad[] = {
      {"etcds://h:1?user=root&password=hunter2", "a password does not belong in a URL"},
      {"etcds://h:1?password=hunter2&user=root", "a password does not belong in a URL"},
      {"etcds://root:hunter2@h:1", "'@' not allowed"},
      {"etcd://root:hunter2@h:1/p", "'@' not allowed"},
      {"etcds://root:hunter2@h:1?ca=/x", "'@' not allowed"},
      {"etcds://h:1?pasword=hunter2", "offset 12: unknown query parameter"},
      {"etcds://h:1?hunter2", "without '='"},
      {"etcds://h:1?ca=/x&hunter2=", "unknown query parameter"},
  };
  check_refused(bad, [](const char*, const holdfast::format_error& e) {
    CHECK(std::string(e.what()).find("hunter2") == std::string::npos);
    CHECK(e.path().find("***") != std::string::npos);
  });
  // The redacted URL keeps what is harmless.
  try {
    parse_kv_url("etcds://root:hunter2@h:1/p?ca=/etc/ca.pem&password=hunter2&x=1");
    FAIL("accepted");
  } catch (const holdfast::format_error& e) {
    CHECK(e.path() == "etcds://root:***@h:1/p?ca=/etc/ca.pem&password=***&***");
  }
  try {  // in other schemes too
    parse_kv_url("file:///d?token=abc123&x=1");
    FAIL("accepted");
  } catch (const holdfast::format_error& e) {
    CHECK(e.path() == "file:///d?token=***&x=***");  // no value of an unknown key shows
  }
}

TEST_CASE("kv url: etcds:// query refusals name the offset") {
  const std::pair<const char*, const char*> bad[] = {
      {"etcds://h:1?", "offset 12: empty query"},
      {"etcds://h:1?ca=/a&&user=u", "offset 18: empty query parameter"},
      {"etcds://h:1?ca=", "offset 15: empty value for 'ca'"},
      {"etcds://h:1?ca=/a&ca=/b", "offset 18: query parameter 'ca' given twice"},
      {"etcds://h:1?ca=/a%2", "offset 15: bad %-escape"},
      {"etcds://h:1?ca=/a%00b", "bad %-escape"},
      {"etcds://h:1?cert=/c", "cert= and key= go together"},
      {"etcds://h:1?user=u", "user= needs password_file= or password_env="},
      {"etcds://h:1?password_env=X", "a password source without user="},
      {"etcds://h:1?user=u&password_env=X&password_file=/f", "exclude each other"},
      {"etcds://h:1#frag", "offset 11: no fragment"},
      {"etcds://?ca=/x", "offset 8: no etcd member"},
      {"etcds://h:1/a//b?ca=/x", "bad prefix"},
      {"etcd://h:1?user=u&password_env=X", "etcd:// takes only lease_ttl="},
  };
  check_refused(bad, [](const char* url, const holdfast::format_error& e) {
    CHECK(e.path() == url);  // nothing secret in these: shown as written
  });
}

// The lease for liveness keys (handler/liveness.hpp) from a URL, in both etcd schemes.
TEST_CASE("kv url: lease_ttl= and leased_prefix= in etcd:// and etcds://") {
  auto plain = parse_kv_url("etcd://h:1/jobs?lease_ttl=6&leased_prefix=holdfast/run-7/live/");
  CHECK(plain.lease_ttl == std::chrono::seconds(6));
  CHECK(plain.leased_prefix == "holdfast/run-7/live");  // a trailing '/' is dropped
  CHECK(plain.prefix == "jobs");
  auto s = parse_kv_url("etcds://h:1?ca=/ca.pem&lease_ttl=10&leased_prefix=holdfast%2Fr%2Flive");
  CHECK(s.lease_ttl == std::chrono::seconds(10));
  CHECK(s.leased_prefix == "holdfast/r/live");
  CHECK(parse_kv_url("etcd://h:1").lease_ttl == std::chrono::seconds(0));
  const std::pair<const char*, const char*> bad[] = {
      {"etcd://h:1?lease_ttl=6", "lease_ttl= and leased_prefix= go together"},
      {"etcd://h:1?leased_prefix=live", "lease_ttl= and leased_prefix= go together"},
      {"etcd://h:1?lease_ttl=0&leased_prefix=live", "offset 21: lease_ttl= takes whole seconds"},
      {"etcd://h:1?lease_ttl=6s&leased_prefix=live", "lease_ttl= takes whole seconds"},
      {"etcd://h:1?lease_ttl=3601&leased_prefix=live", "lease_ttl= takes whole seconds"},
      {"etcd://h:1?lease_ttl=6&leased_prefix=a//b", "bad leased_prefix"},
      {"etcd://h:1?lease_ttl=6&lease_ttl=7&leased_prefix=a", "given twice"},
      {"etcd://h:1?", "empty query"},
      {"etcd://h:1?lease_ttl=6&leased_prefix=a#x", "no fragment"},
  };
  check_refused(bad, [](const char* url, const holdfast::format_error& e) {
    CHECK(e.path() == url);  // nothing secret in these: shown as written
  });
}

TEST_CASE("make_kv: etcds:// without a TLS transport is refused, naming one") {
  try {
    holdfast::make_kv("etcds://127.0.0.1:1?user=u&password_env=X", {"run", 0});
    FAIL("accepted");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EPROTONOSUPPORT);
    CHECK(std::string(e.what()).find("TLS transport") != std::string::npos);
  }
}

TEST_CASE("make_kv: a directory and a real etcd behind one any_kv type") {
  holdfast_test::temp_dir dir("kvurl");
  holdfast::any_kv f = holdfast::make_kv("file://" + dir.path() + "/kv", {"run", 3});
  CHECK(f.insert("a/b", "1"));
  CHECK_FALSE(f.insert("a/b", "2"));
  CHECK(f.try_get("a/b") == "1");
  CHECK(f.list("a").size() == 1);
  holdfast::filesystem_kv direct(dir.path() + "/kv", {"run", 3});  // the same files
  CHECK(direct.try_get("a/b") == "1");

  holdfast_test::etcd_server server;
  const std::string url = "etcd://127.0.0.1:" + std::to_string(server.port()) + "/urltest";
  holdfast::any_kv e = holdfast::make_kv(url, {"run", 3});
  CHECK(e.insert("k", "v"));
  CHECK(e.get("k", 100ms) == "v");
  CHECK(e.supports(holdfast::kv_op::list));
  holdfast::etcd_options o;
  o.endpoints = {server.url()};
  o.prefix = "urltest";
  CHECK(holdfast::etcd_kv(o, {"run", 3}).try_get("k") == "v");  // the URL's prefix was used

  // both keep their watch; only etcd has stats, counted by the client the any_kv holds
  CHECK(f.supports(holdfast::kv_op::watch));
  CHECK(e.supports(holdfast::kv_op::watch));
  CHECK_FALSE(f.supports(holdfast::kv_op::get_many));
  CHECK_FALSE(f.stats_as<holdfast::etcd_stats>());
  const auto before = e.stats_as<holdfast::etcd_stats>();
  REQUIRE(before);
  CHECK(before->requests >= 2);  // the insert and the get, at least
  e.try_get("k");
  const auto after = e.stats_as<holdfast::etcd_stats>();
  REQUIRE(after);
  CHECK(after->requests == before->requests + 1);
  CHECK_FALSE(e.stats_as<int>());  // not its type

  // The URL's lease reaches the store, and any_kv says which keys carry it (kv_lease_ttl).
  holdfast::any_kv leased = holdfast::make_kv(url + "?lease_ttl=5&leased_prefix=live", {"run", 3});
  CHECK(leased.leases("live/0/beat"));
  CHECK_FALSE(leased.leases("ctl/r0/step"));  // a decision is never leased
  CHECK(holdfast::kv_lease_ttl(leased, "live/0/beat") == 5s);
  CHECK(holdfast::kv_lease_ttl(leased, "live") == 0s);
  CHECK(holdfast::kv_lease_ttl(e, "live/0/beat") == 0s);  // no lease in its URL
  CHECK(holdfast::kv_lease_ttl(f, "live/0/beat") == 0s);  // a directory has no leases
}

TEST_CASE("any_kv: forwards the four operations — optional ones only where the store has them") {
  holdfast::in_process_kv base({"r", 0});
  holdfast::any_kv full(base);
  CHECK(full.supports(holdfast::kv_op::erase_prefix));
  full.put("x/1", "a");
  CHECK(full.erase_prefix("x") == 1);

  holdfast::any_kv small(holdfast_test::c10d_like_kv{holdfast::in_process_kv({"r", 0})});
  CHECK(small.insert("k", "v"));
  CHECK(small.try_get("k") == "v");
  CHECK(small.get("missing", 1ms) == std::nullopt);
  CHECK_FALSE(small.supports(holdfast::kv_op::list));
  CHECK(small.supports(holdfast::kv_op::erase));  // c10d's deleteKey
  CHECK_FALSE(small.supports(holdfast::kv_op::erase_prefix));
  CHECK(small.supports(holdfast::kv_op::get));
  try {
    small.list("p");
    FAIL("listed");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == ENOTSUP);
    CHECK(e.path() == "p");
  }
  holdfast::any_kv copy = small;  // copies share the store
  CHECK(copy.try_get("k") == "v");
}

TEST_CASE("any_kv: watch, get_many and stats only where the held store has them") {
  holdfast::any_kv small(holdfast_test::c10d_like_kv{holdfast::in_process_kv({"r", 0})});
  CHECK_FALSE(small.supports(holdfast::kv_op::watch));
  CHECK_FALSE(small.supports(holdfast::kv_op::get_many));
  CHECK_FALSE(holdfast::kv_supports(small, holdfast::kv_op::watch));
  CHECK_FALSE(small.stats_as<holdfast::etcd_stats>());
  for (auto call : {+[](holdfast::any_kv& kv) { kv.watch("ctl"); },
                    +[](holdfast::any_kv& kv) { kv.get_many({"ctl/a"}, 0ms); }}) {
    try {
      holdfast::any_kv copy = small;
      call(copy);
      FAIL("no ENOTSUP");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == ENOTSUP);
      CHECK(e.path().rfind("ctl", 0) == 0);  // the prefix, or the first key
    }
  }
  // the free get_many falls back to single reads
  small.put("a", "1");
  CHECK(holdfast::get_many(small, {"a", "b"}, 0ms) ==
        std::vector<std::optional<std::string>>{"1", std::nullopt});

  // a store that waits on named keys and reads them in batches: every member forwarded
  holdfast_test::key_wait_kv store{holdfast::in_process_kv({"r", 1})};
  holdfast::counting_kv<holdfast_test::key_wait_kv> counted(store);
  holdfast::any_kv any(counted);
  CHECK(any.supports(holdfast::kv_op::watch));
  CHECK(any.supports(holdfast::kv_op::get_many));
  CHECK(holdfast::get_many(any, {"a", "b"}, 0ms) ==
        std::vector<std::optional<std::string>>{std::nullopt, std::nullopt});
  CHECK(counted.counts().get_many == 1);  // the store's own, through any_kv and counting_kv
  holdfast::any_kv_watch w = any.watch("ctl");
  CHECK(w.take().resync);
  w.follow({"ctl/claim"});  // forwarded: the store wakes fd() once the key exists
  holdfast::any_kv_watch moved = std::move(w);
  std::thread writer([any]() mutable { any.insert("ctl/claim", "c"); });
  pollfd p{moved.fd(), POLLIN, 0};
  CHECK(::poll(&p, 1, 10000) == 1);
  writer.join();
  CHECK(moved.take().resync);
  // a held store that says no at run time
  holdfast::any_kv single(holdfast_test::key_wait_kv(holdfast::in_process_kv({"r", 2}), false));
  CHECK_FALSE(single.supports(holdfast::kv_op::get_many));
  CHECK(single.supports(holdfast::kv_op::watch));
}

TEST_CASE("kv url: token-only user info is a secret, masked in every error a URL can produce") {
  // Invariant: whatever a URL's user info holds without a ':' (an access token, not a user
  // name: a user name is shown only when a password follows it) never appears in an error.
  const std::pair<const char*, const char*> bad[] = {
      {"etcd://s3cr3tT0ken@h:1", "'@' not allowed"},
      {"etcd://s3cr3tT0ken@h:1/p", "'@' not allowed"},
      {"etcd://h:1,s3cr3tT0ken@h2:1/p", "'@' not allowed"},
      {"etcds://s3cr3tT0ken@h:1?ca=/x", "'@' not allowed"},
      {"etcd://s3cr3tT0ken@h:1/a//b", "'@' not allowed"},
      {"etcd://s3cr3tT0ken@h:1?ca=x", "'@' not allowed"},
      {"etcds://s3cr3tT0ken@h:1?", "empty query"},
      {"etcds://s3cr3tT0ken@h:1#f", "no fragment"},
      {"etcd://s3cr3tT0ken@", "'@' not allowed"},
      {"file://s3cr3tT0ken@/dir", "offset 7: expected an absolute directory"},
      {"redis://s3cr3tT0ken@h:1", "offset 0: unknown scheme"},
      {"https://s3cr3tT0ken@h:1/x", "offset 0: unknown scheme"},
  };
  check_refused(bad, [](const char*, const holdfast::format_error& e) {
    CHECK(std::string(e.what()).find("s3cr3tT0ken") == std::string::npos);
    CHECK(e.path().find("***@") != std::string::npos);
  });
  try {  // a NUL after the token: the same
    parse_kv_url(std::string("etcd://s3cr3tT0ken@h\0", 21));
    FAIL("accepted");
  } catch (const holdfast::format_error& e) {
    CHECK(std::string(e.what()).find("s3cr3tT0ken") == std::string::npos);
  }
  // What is masked: the whole user info without ':', only the password with one.
  try {
    parse_kv_url("etcds://s3cr3tT0ken@h:1/p?ca=/etc/ca.pem");
    FAIL("accepted");
  } catch (const holdfast::format_error& e) {
    CHECK(e.path() == "etcds://***@h:1/p?ca=/etc/ca.pem");
  }
  try {
    parse_kv_url("etcd://trainer:hunter2@h:1");
    FAIL("accepted");
  } catch (const holdfast::format_error& e) {
    CHECK(e.path() == "etcd://trainer:***@h:1");
  }
  try {  // make_kv's own errors show the URL the same way
    holdfast::make_kv("s3://s3cr3tT0ken@bucket/x", {"run", 0});
    FAIL("accepted");
  } catch (const holdfast::error& e) {
    CHECK(std::string(e.what()).find("s3cr3tT0ken") == std::string::npos);
  }
}
