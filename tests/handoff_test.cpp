// Command-file handoff: both codecs round-trip, malformed input names the file and the line or
// offset, flag files read as absl reads them (and as TF's NCF main job writes them, checked with
// Python and absl themselves), names are validated, ready files per cycle, a handoff between
// real processes, the cache-root owner guard in forked children, and collision-proof cache ids.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <holdfast/handoff.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/child.hpp"
#include "support/fault_sweep.hpp"  // disarm_on_exit
#include "support/python_absl.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_state.hpp"

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
      {"--a=1\n--b=2\nc=3\n", "line 3: expected --key=value"},
      {"--a=1\n-\n", "line 2: expected --key=value"},
      {"--a=1\n--\n", "line 2: expected --key=value"},
      {"--a=1\n--flagfile\n", "line 2: --flagfile needs a file name"},
      {"--a=1\n\n--flagfile=missing.flags\n", "line 3: --flagfile=missing.flags: cannot read"},
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

TEST_CASE("flag files: Python's True/False and any case of true/t/1/false/f/0 are booleans") {
  // the NCF main job writes "--{}={}".format(k, v): str(True) is "True"
  command c = holdfast::flag_codec::decode(
      "--redirect_logs=True\n--ml_perf=False\n--a=TRUE\n--b=t\n--c=F\n--d=0\n--e=1\n--f=fAlSe\n"
      "--g=yes\n--h=No\n--bad=maybe\n--bad2=tru\n",
      "/cache/flagfile");
  CHECK(c.get_bool("redirect_logs"));
  CHECK_FALSE(c.get_bool("ml_perf"));
  CHECK(c.get_bool("a"));
  CHECK(c.get_bool("b"));
  CHECK_FALSE(c.get_bool("c"));
  CHECK_FALSE(c.get_bool("d"));
  CHECK(c.get_bool("e"));
  CHECK_FALSE(c.get_bool("f"));
  CHECK(c.get_bool("g"));  // yes/no: holdfast's own spelling, kept
  CHECK_FALSE(c.get_bool("h"));
  auto w = what_of([&] { (void)c.get_bool("bad"); });
  CHECK_MESSAGE(w.find("/cache/flagfile") != std::string::npos, w);
  CHECK_MESSAGE(w.find("line 11: key 'bad': expected a boolean, got 'maybe'") != std::string::npos,
                w);
  CHECK(what_of([&] { (void)c.get_bool("bad2"); }).find("line 12") != std::string::npos);
}

TEST_CASE("flag files: lines starting with // are comments, as lines starting with #") {
  command c = holdfast::flag_codec::decode(
      "// generated by the main job\n  // indented\n\t# tab\n--a=1\n--url=http://x//y\n//--b=2\n",
      "ff");
  CHECK(c.size() == 2);
  CHECK(c.get_int("a") == 1);
  CHECK(c.get_string("url") == "http://x//y");  // only a line's first characters make a comment
  CHECK_FALSE(c.contains("b"));
}

TEST_CASE("flag files: leading and trailing whitespace of a line is dropped") {
  command c = holdfast::flag_codec::decode(
      "  --a=x  \t\n\t--n=2 \r\n--s=in side\x0b\x0c\n   \t \n--t= lead\n", "ff");
  CHECK(c.get_string("a") == "x");
  CHECK(c.get_int("n") == 2);
  CHECK(c.get_string("s") == "in side");
  CHECK(c.get_string("t") == " lead");  // absl strips the line, not the value after '='
  CHECK(c.size() == 4);
  // so a value ending in whitespace cannot survive a flag file: writing one is refused
  for (const char* v : {"x ", "x\t", "\t", "x\f"}) {
    CAPTURE(v);
    command bad;
    bad.set("k", v);
    try {
      (void)holdfast::flag_codec::encode(bad);
      FAIL("wrote a value that absl would read back shorter");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EINVAL);
    }
  }
  command lead;
  lead.set("k", " lead");
  CHECK(holdfast::flag_codec::decode(holdfast::flag_codec::encode(lead), "ff") == lead);
}

TEST_CASE("flag files: --noname is false, --name is true, the later line wins") {
  command c = holdfast::flag_codec::decode(
      "--use_xla\n--noeval\n--x=1\n--nox\n--noy\n--y\n-nosingle\n--notify=yes\n--no=3\n", "ff");
  CHECK(c.get_bool("use_xla"));
  CHECK_FALSE(c.get_bool("eval"));
  CHECK_FALSE(c.get_bool("x"));  // --x=1 then --nox
  CHECK(c.get_bool("y"));        // --noy then --y
  CHECK_FALSE(c.get_bool("single"));
  CHECK(c.get_bool("notify"));  // with a value, a name starting with "no" is itself
  CHECK(c.get_int("no") == 3);
  CHECK_FALSE(c.contains("noeval"));
  CHECK(c.find("eval")->where == 2);
  CHECK(c.get_string("eval") == "false");
  // --noname=value is not a negation: absl refuses it for a boolean, holdfast keeps the key
  CHECK(holdfast::flag_codec::decode("--nofoo=1\n", "ff").get_int("nofoo") == 1);
}

TEST_CASE("flag files: a missing final newline is accepted") {
  command c = holdfast::flag_codec::decode("--a=1\n--b=last", "/cache/flagfile");
  CHECK(c.get_int("a") == 1);
  CHECK(c.get_string("b") == "last");
  CHECK(holdfast::flag_codec::decode("--only", "ff").get_bool("only"));
  CHECK(holdfast::flag_codec::decode("--a=1\n# end", "ff").size() == 1);
  CHECK(holdfast::flag_codec::decode("", "ff").size() == 0);
}

TEST_CASE("flag files: a flag given twice takes the later value") {
  command c = holdfast::flag_codec::decode("--a=1\n--b=x\n--a=2\n--a=3\n", "/cache/flagfile");
  CHECK(c.size() == 2);
  CHECK(c.get_int("a") == 3);
  CHECK(c.find("a")->where == 4);  // errors about it name the line that won
  CHECK(c.entries().front().key == "a");
  // JSON still refuses a duplicate key (RFC 8259 leaves it undefined)
  CHECK(what_of([] {
          holdfast::json_codec::decode(R"({"a":1,"a":2})", "c.json");
        }).find("duplicate key") != std::string::npos);
}

TEST_CASE("flag files: 0x and 0o integers as absl reads them") {
  command c = holdfast::flag_codec::decode(
      "--h=0x1F\n--H=0xff\n--o=0o17\n--d=017\n--max=0x7fffffffffffffff\n--neg=-12\n"
      "--X=0X1F\n--nh=-0x1\n--empty=0x\n--g=0xg\n--big=0x8000000000000000\n--oct9=0o9\n",
      "/cache/flagfile");
  CHECK(c.get_int("h") == 31);
  CHECK(c.get_int("H") == 255);
  CHECK(c.get_int("o") == 15);
  CHECK(c.get_int("d") == 17);  // a leading zero alone is decimal, as in absl
  CHECK(c.get_int("max") == std::numeric_limits<std::int64_t>::max());
  CHECK(c.get_int("neg") == -12);
  for (const char* bad : {"X", "nh", "empty", "g", "big", "oct9"}) {
    CAPTURE(bad);
    auto w = what_of([&] { (void)c.get_int(bad); });
    CHECK_MESSAGE(w.find("expected an integer") != std::string::npos, w);
    CHECK(w.find("/cache/flagfile") != std::string::npos);
  }
}

TEST_CASE("flag files: --flagfile nests relative to the including file and skips a cycle") {
  holdfast_test::temp_dir dir("nest");
  REQUIRE(::mkdir((dir / "sub").c_str(), 0755) == 0);
  const std::string top = dir / "top.flags", inner = dir / "sub/inner.flags";
  write_plain(dir / "abs.flags", "--d=0x10\n");
  write_plain(inner, "--b=2\n--flagfile=../top.flags\n--c=inner\n--e=zz\n");
  write_plain(top, "--a=1\n--flagfile=sub/inner.flags\n--c=top\n  --flagfile=" +
                       (dir / "abs.flags") + "  \n--flagfile=\n");
  const std::string before = slurp(top);
  auto got = holdfast::await_command<holdfast::flag_codec>(dir.path(), 1s, "top.flags");
  REQUIRE(got);
  command& c = *got;
  CHECK(c.get_int("a") == 1);
  CHECK(c.get_int("b") == 2);
  CHECK(c.get_string("c") == "top");  // the including file's later line wins
  CHECK(c.get_int("d") == 16);
  CHECK_FALSE(c.contains("flagfile"));
  REQUIRE(c.warnings().size() == 1);  // the cycle back to top.flags, skipped as absl does
  CHECK_MESSAGE(c.warnings()[0].find("sub/inner.flags") != std::string::npos, c.warnings()[0]);
  CHECK_MESSAGE(c.warnings()[0].find("line 2") != std::string::npos, c.warnings()[0]);
  // a value from a nested file: errors name that file and its line
  CHECK(c.find("b")->file == inner);
  auto w = what_of([&] { (void)c.get_int("e"); });
  CHECK_MESSAGE(w.find(inner + "' (line 4: key 'e'") != std::string::npos, w);
  // a syntax error in a nested file names it, its line, and where it was included
  write_plain(dir / "broken.flags", "--ok=1\nnot a flag\n");
  w = what_of([&] { holdfast::flag_codec::decode("--x=1\n--flagfile=broken.flags\n", top); });
  CHECK_MESSAGE(w.find(dir / "broken.flags") != std::string::npos, w);
  CHECK_MESSAGE(w.find("line 2: expected --key=value") != std::string::npos, w);
  CHECK_MESSAGE(w.find("included from " + top + " line 2") != std::string::npos, w);
  // a missing nested file names the including file and line
  w = what_of([&] { holdfast::flag_codec::decode("\n--flagfile=nope.flags\n", top); });
  CHECK_MESSAGE(w.find(top + "' (line 2: --flagfile=nope.flags: cannot read " +
                       (dir / "nope.flags")) != std::string::npos,
                w);
  // a directory, a device or a FIFO is refused, not read (or waited on)
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0644) == 0);
  for (const std::string& odd : {dir / "sub", std::string("/dev/zero"), dir / "fifo"}) {
    CAPTURE(odd);
    w = what_of([&] { holdfast::flag_codec::decode("--flagfile=" + odd + "\n", top); });
    CHECK_MESSAGE(w.find("line 1: --flagfile=" + odd + ": " + odd + " is not a regular file") !=
                      std::string::npos,
                  w);
  }
  // a chain deeper than the limit is refused rather than followed
  for (std::size_t i = 0; i <= holdfast::flag_codec::max_nesting_depth + 1; ++i)
    write_plain(dir / ("chain" + std::to_string(i)),
                "--flagfile=chain" + std::to_string(i + 1) + "\n");
  w = what_of([&] { holdfast::flag_codec::decode("--flagfile=chain0\n", top); });
  CHECK_MESSAGE(w.find("nested deeper than") != std::string::npos, w);
  CHECK(slurp(top) == before);  // reading never modifies anything
}

TEST_CASE("flag files: holdfast never writes what it or absl would read differently") {
  command c;
  c.set("flagfile", "x");  // absl would follow it as a nested file
  try {
    (void)holdfast::flag_codec::encode(c);
    FAIL("wrote --flagfile=");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == EINVAL);
  }
  command j;
  j.set("flagfile", "x");  // a plain key in JSON
  CHECK(holdfast::json_codec::decode(holdfast::json_codec::encode(j), "c.json") == j);
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
  // the command appears after the data job started waiting: its (only) thread is observed
  // asleep in poll() on the command's directory
  CHECK(holdfast_test::wait_asleep_in({data_job.pid()}, holdfast_test::poll_syscalls(), 10s,
                                      data_job.pid()));
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
  SUBCASE("release keeps the root created with the default id") {
    std::string path;
    {
      holdfast::cache_root root(dir.path());
      path = root.path();
      CHECK(root.owns());
      CHECK(root.id()[8] == 'T');
      root.release();
    }
    CHECK(is_dir(path));
  }
}

TEST_CASE("default cache ids carry the host, the pid and 32 random bits") {
  // "<UTC yyyymmddThhmmss>-<host>-<pid>-<8 hex>": pids repeat across containers, so two
  // containers starting in the same second must still get different ids
  const std::string a = holdfast::default_cache_id(), b = holdfast::default_cache_id();
  CHECK(a != b);  // same second, same host, same pid: only the random bits differ
  for (const std::string& id : {a, b}) {
    CAPTURE(id);
    holdfast::detail::validate_component(id, "cache_id");  // one valid path component
    CHECK(id[8] == 'T');
    auto last = id.rfind('-');
    auto pid_dash = id.rfind('-', last - 1);
    REQUIRE(pid_dash != std::string::npos);
    CHECK(id.substr(last + 1).size() == 8);
    CHECK(id.substr(last + 1).find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(id.substr(pid_dash + 1, last - pid_dash - 1) == std::to_string(::getpid()));
    char host[256] = {};
    REQUIRE(::gethostname(host, sizeof host - 1) == 0);
    CHECK(id.substr(16, pid_dash - 16) == holdfast::detail::path_safe(host));
  }
  // a host name is made a safe path component: no '/', no "..", nothing outside [A-Za-z0-9_.-]
  CHECK(holdfast::detail::path_safe("node-1.cluster.local") == "node-1.cluster.local");
  CHECK(holdfast::detail::path_safe("a..b/c d\xc3\xa9") == "a._b_c_d__");
  CHECK(holdfast::detail::path_safe("") == "host");
  CHECK(holdfast::detail::path_safe(".") == "_");
  CHECK(holdfast::detail::path_safe(std::string(300, 'h')).size() == 64);
  // ids made in forked children (another pid each) are all distinct too
  holdfast_test::temp_dir dir("ids");
  std::vector<holdfast_test::child> kids;
  for (int i = 0; i < 4; ++i)
    kids.emplace_back([&, i] {
      holdfast::publisher pub;
      pub.publish(dir / ("id" + std::to_string(i)), holdfast::default_cache_id());
    });
  std::vector<std::string> ids{a, b};
  for (int i = 0; i < 4; ++i) {
    auto r = kids[static_cast<std::size_t>(i)].wait(10s);
    CHECK_MESSAGE(r.ok(), r.failures);
    ids.push_back(slurp(dir / ("id" + std::to_string(i))));
  }
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t j = i + 1; j < ids.size(); ++j) CHECK(ids[i] != ids[j]);
}

TEST_CASE("create_only: a cache root that already exists is refused with EEXIST") {
  holdfast_test::temp_dir dir("createonly");
  {
    holdfast::cache_root mine(holdfast::create_only, dir.path(), "run");
    CHECK(mine.owns());
    CHECK(is_dir(dir / "run"));
    try {
      holdfast::cache_root again(holdfast::create_only, dir.path(), "run");
      FAIL("created a root that exists");
    } catch (const holdfast::error& e) {
      CHECK(e.errnum() == EEXIST);
      CHECK(e.operation() == "mkdir");
      CHECK(e.path() == dir / "run");
    }
    CHECK(is_dir(dir / "run"));                      // the refusal removed nothing
    holdfast::cache_root joined(dir.path(), "run");  // the default still joins
    CHECK_FALSE(joined.owns());
  }
  CHECK_FALSE(is_dir(dir / "run"));  // removed by its creator
  // a file in the way is EEXIST too; the default id works with create_only
  write_plain(dir / "file", "x");
  CHECK_THROWS_AS(holdfast::cache_root(holdfast::create_only, dir.path(), "file"), holdfast::error);
  holdfast::cache_root fresh(holdfast::create_only, dir.path());
  CHECK(fresh.owns());
  CHECK(fresh.path() == dir / fresh.id());
  CHECK_THROWS_AS(holdfast::cache_root(holdfast::create_only, dir.path(), "a/b"), holdfast::error);
}

namespace {

/// The interop helper script, run by /usr/bin/python3.
std::string interop_script() { return std::string(HOLDFAST_SOURCE_DIR) + "/tests/absl_interop.py"; }

/// absl's parse of `path` (run in `cwd`) with flags of the given TYPE:NAME specs, as a command.
command absl_parse(const std::string& path, const std::string& cwd,
                   const std::vector<std::string>& specs) {
  std::vector<std::string> args{interop_script(), "absl-read", path};
  args.insert(args.end(), specs.begin(), specs.end());
  auto r = holdfast_test::run_python(args, cwd);
  INFO("absl_interop.py stderr: ", r.err);
  REQUIRE(r.ok());
  return holdfast::json_codec::decode(r.out, "absl_interop.py output");
}

/// The absl flag type for a command value.
std::string absl_type(command::type t) {
  switch (t) {
    case command::type::integer:
      return "int";
    case command::type::real:
      return "float";
    case command::type::boolean:
      return "bool";
    case command::type::string:
      break;
  }
  return "string";
}

/// Sets (and restores) an environment variable for a scope.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~scoped_env() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("interop: holdfast reads the flag file TF's NCF main job writes") {
  holdfast_test::require_python_absl();
  holdfast_test::temp_dir dir("ncf");
  const std::string path = dir / "flagfile";
  auto r = holdfast_test::run_python({interop_script(), "write-ncf", path}, dir.path());
  INFO("absl_interop.py stderr: ", r.err);
  REQUIRE(r.ok());
  REQUIRE(slurp(path).find("--redirect_logs=True\n") != std::string::npos);  // str(True)
  REQUIRE(slurp(path).find("--learning_rate=1e-05\n") != std::string::npos);
  REQUIRE(slurp(path).find("--seed=None\n") != std::string::npos);
  auto got = holdfast::await_command<holdfast::flag_codec>(dir.path(), 10s);
  REQUIRE(got);
  const command& c = *got;
  CHECK(c.size() == 22);
  CHECK(c.get_string("data_dir") == "/data/movielens ml-20m");
  CHECK(c.get_int("cache_id") == 1528841970);
  CHECK(c.get_int("num_neg") == 4);
  CHECK(c.get_int("num_train_positives") == 19861770);
  CHECK(c.get_int("num_items") == 26744);
  CHECK(c.get_int("num_users") == 138493);
  CHECK(c.get_int("num_readers") == 8);
  CHECK(c.get_int("epochs_per_cycle") == 1);
  CHECK(c.get_int("num_cycles") == 14);
  CHECK(c.get_int("train_batch_size") == 98304);
  CHECK(c.get_int("eval_batch_size") == 160000);
  CHECK(c.get_int("num_workers") == 6);
  CHECK(c.get_bool("redirect_logs"));
  CHECK_FALSE(c.get_bool("use_tf_logging"));
  CHECK_FALSE(c.get_bool("ml_perf"));
  CHECK(c.get_bool("output_ml_perf_compliance_logging"));
  CHECK(c.get_double("learning_rate") == 1e-05);
  CHECK(c.get_double("beta1") == 0.5);
  CHECK(c.get_double("epsilon") == 1e-08);
  CHECK(c.get_double("big") == 1e20);
  CHECK(c.get_double("negative") == -2.5);
  CHECK(c.get_string("seed") == "None");  // Python's None arrives as its str()
  CHECK(what_of([&] { (void)c.get_int("seed"); }).find("expected an integer, got 'None'") !=
        std::string::npos);
}

TEST_CASE("interop: absl parses the flag files holdfast writes, value for value") {
  holdfast_test::require_python_absl();
  holdfast_test::temp_dir dir("abslread");
  command c = sample();
  c.set("data_dir", "/data/ncf \"ml-20m\"\\ tab\tx")
      .set("cache_id", 1528841970)
      .set("redirect_logs", true)
      .set("ml_perf", false)
      .set("learning_rate", 1e-05)
      .set("beta1", 0.5)
      .set("lead", "  spaces before")
      .set("looks_int", "0x10")
      .set("notify", true);
  holdfast::publish_command<holdfast::flag_codec>(dir.path(), c);
  std::vector<std::string> specs;
  for (const auto& e : c.entries()) specs.push_back(absl_type(e.val.kind) + ":" + e.key);
  command absl = absl_parse(dir / "flagfile", dir.path(), specs);
  REQUIRE(absl.size() == c.size());
  for (const auto& e : c.entries()) {
    CAPTURE(e.key);
    const command::entry* a = absl.find(e.key);
    REQUIRE(a);
    switch (e.val.kind) {
      case command::type::integer:
        CHECK(absl.get_int(e.key) == e.val.integer);
        break;
      case command::type::real:
        CHECK(absl.get_double(e.key) == e.val.real);
        break;
      case command::type::boolean:
        CHECK(absl.get_bool(e.key) == e.val.boolean);
        break;
      case command::type::string:
        CHECK(a->val.kind == command::type::string);
        CHECK(absl.get_string(e.key) == e.val.text);
        break;
    }
  }
}

TEST_CASE("interop: holdfast reads an absl-style flag file as absl does") {
  holdfast_test::require_python_absl();
  holdfast_test::temp_dir dir("abslstyle");
  REQUIRE(::mkdir((dir / "conf").c_str(), 0755) == 0);
  // every feature of an absl flag file; the nested file is named relative to the including
  // file, and absl (relative to its working directory) runs in that same directory
  write_plain(dir / "conf/common.flags", "# shared\n--num_neg=4\n--learning_rate=0.5\n");
  write_plain(dir / "main.flags",
              "# comment\n"
              "// another comment\n"
              "\n"
              "   \t\n"
              "--data_dir=/data/ml-20m  \n"
              "\t--batch_size=98304\n"
              "--use_xla=True\n"
              "--eval=False\n"
              "--hash_pipeline=t\n"
              "--deterministic=F\n"
              "--verbose\n"
              "--nouse_tpu\n"
              "--mask=0x1F\n"
              "--perm=0o755\n"
              "--flagfile=conf/common.flags\n"
              "--flagfile=main.flags\n"
              "--num_neg=8\r\n"
              "-epsilon=1e-08\n"
              "--name=a=b c\n"
              "--learning_rate=1e-05");  // no final newline, and the later value wins
  const std::vector<std::string> specs{
      "string:data_dir",    "int:batch_size",     "bool:use_xla", "bool:eval",
      "bool:hash_pipeline", "bool:deterministic", "bool:verbose", "bool:use_tpu",
      "int:mask",           "int:perm",           "int:num_neg",  "float:epsilon",
      "string:name",        "float:learning_rate"};
  command absl = absl_parse("main.flags", dir.path(), specs);  // as absl sees the nesting
  auto got = holdfast::await_command<holdfast::flag_codec>(dir.path(), 10s, "main.flags");
  REQUIRE(got);
  const command& c = *got;
  CHECK(c.warnings().size() == 1);  // main.flags including itself, skipped as absl skips it
  CHECK(c.size() == specs.size());
  for (const auto& spec : specs) {
    CAPTURE(spec);
    auto colon = spec.find(':');
    std::string type = spec.substr(0, colon), key = spec.substr(colon + 1);
    if (type == "int")
      CHECK(c.get_int(key) == absl.get_int(key));
    else if (type == "float")
      CHECK(c.get_double(key) == absl.get_double(key));
    else if (type == "bool")
      CHECK(c.get_bool(key) == absl.get_bool(key));
    else
      CHECK(c.get_string(key) == absl.get_string(key));
  }
  // and the values themselves
  CHECK(c.get_string("data_dir") == "/data/ml-20m");
  CHECK(c.get_int("mask") == 31);
  CHECK(c.get_int("perm") == 493);
  CHECK(c.get_int("num_neg") == 8);
  CHECK(c.get_double("learning_rate") == 1e-05);
  CHECK_FALSE(c.get_bool("use_tpu"));
  CHECK(c.get_string("name") == "a=b c");
}

TEST_CASE("interop: a missing python3 or absl fails the test with an install hint") {
  scoped_env python("HOLDFAST_TEST_PYTHON", "/nonexistent/python3");
  {
    scoped_env ci("CI", "true");
    try {
      holdfast_test::require_python_absl();
      FAIL("a missing interpreter passed");
    } catch (const std::runtime_error& e) {
      std::string w = e.what();
      CHECK_MESSAGE(w.find("required in CI") != std::string::npos, w);
      CHECK_MESSAGE(w.find("tests/run must install") != std::string::npos, w);
      CHECK_MESSAGE(w.find("python3-absl") != std::string::npos, w);
    }
  }
  scoped_env ci("CI", nullptr);
  try {
    holdfast_test::require_python_absl();
    FAIL("a missing interpreter passed");
  } catch (const std::runtime_error& e) {
    std::string w = e.what();
    CHECK_MESSAGE(w.find("/nonexistent/python3 is missing") != std::string::npos, w);
    CHECK_MESSAGE(w.find("apt-get install -y --no-install-recommends python3 python3-absl") !=
                      std::string::npos,
                  w);
  }
}

TEST_CASE("a failure at every syscall of the handoff leaves no command, ready file or root") {
  using holdfast::testing::fault;
  using holdfast::testing::fault_io;
  using holdfast::testing::fault_plan;
  using holdfast::testing::io_op;
  holdfast_test::temp_dir dir("handofffault");
  holdfast_test::disarm_on_exit guard;
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
