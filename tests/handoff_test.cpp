// Command-file handoff: both codecs round-trip, malformed input names the file and the line or
// offset, names are validated, ready files per cycle, a handoff between real processes, and the
// cache-root owner guard in forked children.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <holdfast/handoff.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <limits>
#include <string>
#include <thread>

#include "support/child.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using holdfast::command;

namespace {

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string slurp(const std::string& path) {
  auto fd = holdfast::open_file(path, O_RDONLY);
  return holdfast::read_all(fd);
}

void write_plain(const std::string& path, const std::string& content) {
  auto fd = holdfast::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  holdfast::write_all(fd, content.data(), content.size());
  fd.close();
}

command sample() {
  command c;
  c.set("data_dir", "/data/ncf \"ml-20m\"\\\ttab")
      .set("unicode", "caf\xc3\xa9 \xf0\x9f\x9a\x80")
      .set("batch_size", 98304)
      .set("min_int", std::numeric_limits<std::int64_t>::min())
      .set("max_int", std::numeric_limits<std::int64_t>::max())
      .set("learning_rate", 0.0005)
      .set("whole_double", 3.0)
      .set("huge", 1e300)
      .set("use_xla", true)
      .set("eval", false)
      .set("empty", "");
  return c;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const holdfast::format_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG TYPE: ") + e.what();
  }
  return "NO ERROR";
}

}  // namespace

TEST_CASE("json codec round-trips every type exactly") {
  command c = sample();
  std::string text = holdfast::json_codec::encode(c);
  command back = holdfast::json_codec::decode(text, "command.json");
  CHECK(back == c);
  CHECK(back.get_int("min_int") == std::numeric_limits<std::int64_t>::min());
  CHECK(back.get_int("max_int") == std::numeric_limits<std::int64_t>::max());
  CHECK(back.get_double("learning_rate") == 0.0005);
  CHECK(back.find("whole_double")->val.kind == command::type::real);  // 3.0 stays a double
  CHECK(back.get_double("huge") == 1e300);
  CHECK(back.get_bool("use_xla"));
  CHECK_FALSE(back.get_bool("eval"));
  CHECK(back.get_string("data_dir") == "/data/ncf \"ml-20m\"\\\ttab");
  CHECK(back.get_string("unicode") == "caf\xc3\xa9 \xf0\x9f\x9a\x80");
  CHECK(back.get_string("empty").empty());
  CHECK(text.find("\\\"ml-20m\\\"") != std::string::npos);  // RFC 8259 escapes in the file
  CHECK(text.find("\\t") != std::string::npos);
  // key order is kept
  CHECK(back.entries().front().key == "data_dir");
  CHECK(back.entries().back().key == "empty");
  // escapes written by other tools decode
  command other = holdfast::json_codec::decode(
      R"({"s":"a\u00e9\ud83d\ude80\/\b\f\n\r","n":-1.5e-3,"i":0})", "x.json");
  CHECK(other.get_string("s") == "a\xc3\xa9\xf0\x9f\x9a\x80/\b\f\n\r");
  CHECK(other.get_double("n") == -0.0015);
  CHECK(other.get_int("i") == 0);
}

TEST_CASE("flag codec round-trips values as absl flag files") {
  command c = sample();
  c.set("data_dir", "/data/ncf \"ml-20m\"\\ tab\tx");  // quotes, backslash, tab are fine
  std::string text = holdfast::flag_codec::encode(c);
  CHECK(text.find("--batch_size=98304\n") != std::string::npos);
  CHECK(text.find("--use_xla=true\n") != std::string::npos);
  CHECK(text.find("--whole_double=3.0\n") != std::string::npos);
  command back = holdfast::flag_codec::decode(text, "flagfile");
  REQUIRE(back.size() == c.size());
  for (const auto& e : c.entries()) CHECK(back.get_string(e.key) == e.val.text);
  CHECK(back.get_int("min_int") == std::numeric_limits<std::int64_t>::min());
  CHECK(back.get_int("batch_size") == 98304);
  CHECK(back.get_double("learning_rate") == 0.0005);
  CHECK(back.get_double("huge") == 1e300);
  CHECK(back.get_bool("use_xla"));
  CHECK_FALSE(back.get_bool("eval"));
  // comments, blank lines, CRLF, indentation and bare boolean flags
  command f = holdfast::flag_codec::decode("# generated\n\n  --a=1\r\n--verbose\n--eq=x=y\n", "ff");
  CHECK(f.get_int("a") == 1);
  CHECK(f.get_bool("verbose"));
  CHECK(f.get_string("eq") == "x=y");
  // a newline cannot be written into a flag file
  command nl;
  nl.set("k", "two\nlines");
  CHECK_THROWS_AS(holdfast::flag_codec::encode(nl), holdfast::error);
}

TEST_CASE("malformed flag files name the file and the line") {
  struct row {
    const char* text;
    const char* expect;
  };
  const row rows[] = {
      {"x=1\n", "line 1: expected --key=value"},
      {"--a=1\n--b=2\n-c=3\n", "line 3: expected --key=value"},
      {"--a=1\n--a=2\n", "line 2: duplicate key 'a'"},
      {"--a=1\n--b=2", "line 2: no newline at end of file (truncated?)"},
      {"--=3\n", "line 1: bad key"},
      {"\n# c\n--a b=1\n", "line 3: bad key 'a b'"},
      {"--../x=1\n", "line 1: bad key"},
      {"---a=1\n", "line 1: bad key"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.text);
    auto w = what_of([&] { holdfast::flag_codec::decode(r.text, "/cache/flagfile"); });
    CHECK(w.find("/cache/flagfile") != std::string::npos);
    CHECK_MESSAGE(w.find(r.expect) != std::string::npos, w);
  }
  command bad = holdfast::flag_codec::decode("--n=12abc\n--ok=1\n", "/cache/flagfile");
  auto w = what_of([&] { (void)bad.get_int("n"); });
  CHECK_MESSAGE(w.find("line 1: key 'n': expected an integer, got '12abc'") != std::string::npos,
                w);
  w = what_of([&] { (void)bad.get_bool("n"); });
  CHECK(w.find("expected a boolean") != std::string::npos);
}

TEST_CASE("malformed JSON commands name the file and the offset") {
  struct row {
    const char* text;
    const char* expect;
  };
  const row rows[] = {
      {"", "offset 0: unexpected end of input"},
      {"[1,2]", "offset 0: expected a JSON object, got array"},
      {R"({"a":{"b":1}})",
       "offset 1: key 'a': value must be a string, integer, boolean or "
       "double, not object"},
      {R"({"a":1,"b":[1]})", "offset 7: key 'b'"},
      {R"({"a":1,"n":null})", "offset 7: key 'n'"},
      {R"({"a":1,"b":2)", "offset 12: unexpected end of input"},
      {"{\"a\":\"trunc", "offset 11: unexpected end of input"},
      {R"({"a":1,"a":2})", "offset 7: duplicate key \"a\""},
      {R"({"a":99999999999999999999})", "key 'a': integer outside int64"},
      {R"({"x=y":1})", "offset 1: bad key"},
      {R"({"a":1,})", "offset 7"},
      {R"({"a":01})", "offset 6: leading zero"},
      {R"({"a":"\q"})", "offset 6: invalid escape"},
      {"{\"a\":\"\x01\"}", "offset 6: unescaped control character"},
      {R"({"a":1} x)", "offset 8: unexpected text after the JSON value"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.text);
    auto w = what_of([&] { holdfast::json_codec::decode(r.text, "/cache/command.json"); });
    CHECK(w.find("/cache/command.json") != std::string::npos);
    CHECK_MESSAGE(w.find(r.expect) != std::string::npos, w);
  }
}

TEST_CASE("missing required keys and type mismatches name the file and the key") {
  command c = holdfast::json_codec::decode(R"({"a":"x","n":1.5})", "/r/command.json");
  c.require({"a", "n"});
  auto w = what_of([&] { c.require({"a", "epochs"}); });
  CHECK(w.find("/r/command.json") != std::string::npos);
  CHECK(w.find("missing required key 'epochs'") != std::string::npos);
  w = what_of([&] { (void)c.get_int("n"); });
  CHECK(w.find("offset ") != std::string::npos);
  CHECK(w.find("key 'n': expected an integer, got '1.5'") != std::string::npos);
  w = what_of([&] { (void)c.get_double("a"); });
  CHECK(w.find("expected a number") != std::string::npos);
}

TEST_CASE("ids, names and keys with '/', '..' or NUL are rejected") {
  holdfast_test::temp_dir dir("ids");
  for (std::string bad : {std::string("a/b"), std::string(".."), std::string("x..y"),
                          std::string("n\0ul", 4), std::string(""), std::string(".")}) {
    CAPTURE(bad);
    try {
      holdfast::cache_root r(dir.path(), bad);
      FAIL("accepted a bad cache id");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EINVAL);
      CHECK(e.operation() == "cache_id");
    }
    CHECK_THROWS_AS(holdfast::publish_command(dir.path(), command(), bad), holdfast::error);
    CHECK_THROWS_AS((void)holdfast::await_command(dir.path(), 1ms, bad), holdfast::error);
    command c;
    CHECK_THROWS_AS(c.set(bad, 1), holdfast::error);
  }
  command c;
  CHECK_THROWS_AS(c.set("a=b", 1), holdfast::error);
  CHECK_THROWS_AS(c.set("-a", 1), holdfast::error);
  CHECK_THROWS_AS(c.set("a b", 1), holdfast::error);
  CHECK(holdfast::detail::list_directory<holdfast::posix_io>(dir.path()).empty());
}

TEST_CASE("publish_command / await_command through a cache root, both codecs") {
  holdfast_test::temp_dir dir("cmd");
  holdfast::cache_root root(dir.path(), "run-1");
  CHECK(root.owns());
  CHECK(root.path() == dir / "run-1");
  command c = sample();
  holdfast::publish_command(root.path(), c);
  holdfast::publish_command<holdfast::flag_codec>(root.path(), c);
  auto j = holdfast::await_command(root.path(), 1s);
  REQUIRE(j);
  CHECK(*j == c);
  CHECK(j->source() == root.path() + "/command.json");
  auto f = holdfast::await_command<holdfast::flag_codec>(root.path(), 1s);
  REQUIRE(f);
  CHECK(f->get_int("batch_size") == 98304);
  CHECK(slurp(root.path() + "/flagfile").find("--use_xla=true\n") != std::string::npos);
  // a custom name
  holdfast::publish_command(root.path(), c, "eval.json");
  CHECK(holdfast::await_command(root.path(), 1s, "eval.json") == c);
  // absent: nothing after the timeout
  CHECK_FALSE(holdfast::await_command(root.path(), 50ms, "nope.json"));
  // a malformed file on disk: the error names it, and nothing is modified
  write_plain(root.path() + "/bad.json", "{\"a\":1,");
  auto w = what_of([&] { (void)holdfast::await_command(root.path(), 1s, "bad.json"); });
  CHECK(w.find(root.path() + "/bad.json") != std::string::npos);
  CHECK(w.find("offset 7") != std::string::npos);
  CHECK(slurp(root.path() + "/bad.json") == "{\"a\":1,");
}

TEST_CASE("ready files per training cycle") {
  holdfast_test::temp_dir dir("ready");
  holdfast::cache_root root(dir.path(), "r");
  CHECK_FALSE(holdfast::await_ready(root.path(), 0, 30ms));
  for (std::uint64_t cycle = 0; cycle < 3; ++cycle) {
    command p;
    p.set("batch_count", static_cast<std::int64_t>(100 + cycle)).set("shard_dir", "shards");
    holdfast::publish_ready(root.path(), cycle, p);
  }
  for (std::uint64_t cycle = 0; cycle < 3; ++cycle) {
    auto r = holdfast::await_ready(root.path(), cycle, 1s);
    REQUIRE(r);
    CHECK(r->get_int("batch_count") == static_cast<std::int64_t>(100 + cycle));
  }
  CHECK(is_dir(root.path() + "/training_cycle_2"));
  CHECK_FALSE(holdfast::await_ready(root.path(), 3, 30ms));
}

TEST_CASE("handoff between processes: the data job waits for the command, answers per cycle") {
  holdfast_test::temp_dir dir("handoff");
  holdfast::cache_root root(dir.path(), "shared-id");
  const std::string path = root.path();
  // the data job: started first, waits for the command, then publishes two cycles
  holdfast_test::child data_job([&] {
    holdfast::cache_root joined(dir.path(), "shared-id");  // joins, does not own
    CHILD_REQUIRE(!joined.owns());
    holdfast::file_waiter waiter;
    auto cmd = holdfast::await_command<holdfast::flag_codec>(waiter, joined.path(), 10s);
    CHILD_REQUIRE(cmd.has_value());
    CHILD_REQUIRE(cmd->get_int("epochs") == 2);
    for (std::int64_t cycle = 0; cycle < cmd->get_int("epochs"); ++cycle) {
      command ready;
      ready.set("cycle", cycle).set("worker", cmd->get_string("worker"));
      holdfast::publish_ready(joined.path(), static_cast<std::uint64_t>(cycle), ready);
    }
  });
  std::this_thread::sleep_for(100ms);  // the command appears after the data job started waiting
  command cmd;
  cmd.set("epochs", 2).set("worker", "main");
  holdfast::publish_command<holdfast::flag_codec>(path, cmd);
  holdfast::file_waiter waiter;  // one inotify descriptor for every cycle
  for (std::uint64_t cycle = 0; cycle < 2; ++cycle) {
    auto r = holdfast::await_ready(waiter, path, cycle, 10s);
    REQUIRE(r);
    CHECK(r->get_int("cycle") == static_cast<std::int64_t>(cycle));
    CHECK(r->get_string("worker") == "main");
  }
  auto res = data_job.wait(10s);
  CHECK_MESSAGE(res.ok(), res.failures);
  CHECK(is_dir(path));  // the joining child did not remove the root
}

TEST_CASE("the owner guard removes only the root it created, only in its own process") {
  holdfast_test::temp_dir dir("owner");
  SUBCASE("a child that creates a root removes it when it exits") {
    holdfast_test::child c([&] {
      holdfast::cache_root root(dir.path(), "child-root");
      CHILD_REQUIRE(root.owns());
      holdfast::publish_command(root.path(), sample());
      CHILD_REQUIRE(is_dir(dir / "child-root"));
    });
    auto r = c.wait(10s);
    CHECK_MESSAGE(r.ok(), r.failures);
    CHECK_FALSE(is_dir(dir / "child-root"));
  }
  SUBCASE("a root someone else created is never removed") {
    REQUIRE(::mkdir((dir / "theirs").c_str(), 0755) == 0);
    holdfast_test::child c([&] {
      holdfast::cache_root root(dir.path(), "theirs");
      CHILD_REQUIRE(!root.owns());
      CHILD_REQUIRE(!root.remove());
    });
    auto r = c.wait(10s);
    CHECK_MESSAGE(r.ok(), r.failures);
    CHECK(is_dir(dir / "theirs"));
    { holdfast::cache_root joined(dir.path(), "theirs"); }
    CHECK(is_dir(dir / "theirs"));
  }
  SUBCASE("a forked child inherits the guard but never removes the parent's root") {
    holdfast::cache_root root(dir.path(), "parents");
    holdfast_test::child c([&] { CHILD_REQUIRE(!root.remove()); });
    auto r = c.wait(10s);
    CHECK_MESSAGE(r.ok(), r.failures);
    CHECK(is_dir(dir / "parents"));
    CHECK(root.remove());
    CHECK_FALSE(is_dir(dir / "parents"));
  }
  SUBCASE("a root replaced by another process's directory is left alone") {
    {
      holdfast::cache_root root(dir.path(), "replaced");
      // moved away (so its inode stays in use) and a new directory made in its place
      REQUIRE(::rename((dir / "replaced").c_str(), (dir / "moved").c_str()) == 0);
      REQUIRE(::mkdir((dir / "replaced").c_str(), 0755) == 0);
    }
    CHECK(is_dir(dir / "replaced"));
    CHECK(is_dir(dir / "moved"));
  }
  SUBCASE("release keeps the root; the default id is time-based and unique per process") {
    std::string path;
    {
      holdfast::cache_root root(dir.path());
      path = root.path();
      CHECK(root.owns());
      const std::string& id = root.id();
      CHECK(id.size() > 16);
      CHECK(id[8] == 'T');
      CHECK(id.substr(id.rfind('-') + 1) == std::to_string(::getpid()));
      root.release();
    }
    CHECK(is_dir(path));
  }
}

TEST_CASE("a failure at every syscall of the handoff leaves no command, ready file or root") {
  using holdfast::testing::fault;
  using holdfast::testing::fault_io;
  using holdfast::testing::fault_plan;
  using holdfast::testing::io_op;
  holdfast_test::temp_dir dir("handofffault");
  struct disarm {
    ~disarm() { fault_plan::disarm(); }
  } guard;
  command c = sample();
  // the whole exchange: create the root, publish the command, publish a ready file
  auto protocol = [&] {
    holdfast::basic_cache_root<fault_io> root(dir.path(), "job");
    holdfast::publish_command<holdfast::json_codec, holdfast::durable, fault_io>(root.path(), c);
    holdfast::publish_ready<holdfast::durable, fault_io>(root.path(), 7, c);
    root.release();  // keep it for the checks
  };
  fault_plan::reset_counts();
  protocol();
  const auto calls = fault_plan::calls(io_op::any);
  holdfast::detail::remove_tree<holdfast::posix_io>(dir / "job");
  REQUIRE(calls > 10);
  for (std::uint64_t k = 1; k <= calls; ++k) {
    CAPTURE(k);
    fault_plan::arm(fault{io_op::any, k, EIO});
    bool threw = false;
    try {
      protocol();
    } catch (const holdfast::error& e) {
      threw = true;
      CHECK(e.operation() == holdfast::testing::to_string(fault_plan::last_failed()));
    }
    fault_plan::disarm();
    if (threw) {
      // the guard removed the root it had created; nothing half-written was left anywhere
      CHECK_FALSE(is_dir(dir / "job"));
    } else {
      // only a cleanup call after a completed step may fail without an error
      auto failed = fault_plan::last_failed();
      CHECK((failed == io_op::unlink || failed == io_op::close));
      auto cmd = holdfast::await_command(dir / "job", 1s);
      REQUIRE(cmd);
      CHECK(*cmd == c);
      CHECK(holdfast::await_ready(dir / "job", 7, 1s) == c);
    }
    holdfast::detail::remove_tree<holdfast::posix_io>(dir / "job");
  }
}
