// The one hex decoder and the one message escaper (detail/ascii.hpp), and the guarantee they
// give: a newline or ESC in a key, a path or a store URL never reaches an error message or a log
// line unescaped, whichever component produced it.
#include <doctest/doctest.h>

#include <holdfast/checkpoint.hpp>
#include <holdfast/detail/ascii.hpp>
#include <holdfast/error.hpp>
#include <holdfast/kv.hpp>
#include <holdfast/kv/filesystem.hpp>
#include <holdfast/kv/url.hpp>
#include <holdfast/log.hpp>
#include <holdfast/publish.hpp>
#include <holdfast/store.hpp>
#include <string>
#include <vector>

#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

using holdfast_test::error_text;

namespace {

// No byte below 0x20 and no DEL: what a terminal or a line-based log would act on.
bool has_control(const std::string& s) {
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("hex_digit: one decoder, each format's case rule") {
  using holdfast::detail::hex_case;
  using holdfast::detail::hex_digit;
  CHECK(hex_digit('0') == 0);
  CHECK(hex_digit('9') == 9);
  CHECK(hex_digit('a') == 10);
  CHECK(hex_digit('F') == 15);
  CHECK(hex_digit('g') == -1);
  CHECK(hex_digit('/') == -1);
  CHECK(hex_digit(':') == -1);
  CHECK(hex_digit('b', hex_case::lower) == 11);
  CHECK(hex_digit('B', hex_case::lower) == -1);
  CHECK(hex_digit('C', hex_case::upper) == 12);
  CHECK(hex_digit('c', hex_case::upper) == -1);
  CHECK(hex_digit('7', hex_case::upper) == 7);
  static_assert(holdfast::detail::hex_digit('e') == 14, "usable in constant expressions");
}

TEST_CASE("printable escapes every control byte and nothing else") {
  using holdfast::detail::printable;
  CHECK(printable("plain/key-1 é") == "plain/key-1 é");
  CHECK(printable(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(printable("line\nforged") == "line\\x0aforged");
  CHECK(printable("\x1b[2J") == "\\x1b[2J");
  CHECK(printable("\r\t\x7f") == "\\x0d\\x09\\x7f");
}

TEST_CASE("error::what() escapes the path and the detail, path() keeps the bytes") {
  holdfast::error e(EIO, "put", "job/\x1b[31mkey\n", "peer said: ok\nholdfast: forged");
  CHECK_FALSE(has_control(e.what()));
  CHECK(std::string(e.what()).find("job/\\x1b[31mkey\\x0a") != std::string::npos);
  CHECK(e.path() == "job/\x1b[31mkey\n");
  holdfast::agreement_timeout t("ctl/r0/\nack", {1, 2});
  CHECK_FALSE(has_control(t.what()));
}

TEST_CASE("a newline or ESC in a key never reaches a message unescaped") {
  for (std::string key : {std::string("bad\n/../key"), std::string("a/\x1b[2J/..", 10),
                          std::string("nul\0\nkey", 8) + "/"}) {
    CAPTURE(holdfast::detail::printable(key));
    CHECK_FALSE(has_control(error_text([&] { holdfast::validate_key(key); })));
    CHECK_FALSE(has_control(error_text([&] { holdfast::normalize_prefix(key + "/.."); })));
    CHECK_FALSE(has_control(error_text([&] { holdfast::kv_namespace(key, "0"); })));
  }
  // A valid key with a newline, refused by the filesystem store for its length: the message
  // names the key, escaped.
  holdfast_test::temp_dir dir;
  holdfast::filesystem_kv kv(dir.path(), {"run", "0"});
  const std::string key = "k\n\x1b" + std::string(400, 'x');
  auto msg = error_text([&] { kv.put(key, "v"); });
  CHECK_FALSE(has_control(msg));
  CHECK(msg.find("k\\x0a\\x1b") != std::string::npos);
}

TEST_CASE("a newline or ESC in a store URL or a kv URL never reaches a message unescaped") {
  for (std::string url :
       {"hdfs://nn\n:8x/p", "hdfs://nn:1\x1b/p", "ftp://h\n/x", "file://rel\npath"}) {
    CAPTURE(holdfast::detail::printable(url));
    CHECK_FALSE(has_control(error_text([&] { holdfast::parse_store_url(url); })));
  }
  for (std::string url :
       {"etcd://h\nost:2379/p", "etcd://h:1/p?x=\x1b[2J", "redis://\n", "file://rel\x1b"}) {
    CAPTURE(holdfast::detail::printable(url));
    CHECK_FALSE(has_control(error_text([&] { holdfast::make_kv(url, {"run", "0"}); })));
  }
}

TEST_CASE("a newline in a path never reaches a message unescaped") {
  holdfast_test::temp_dir dir;
  const std::string missing = dir.path() + "/no\ndir\x1b/file";
  auto msg = error_text([&] { holdfast::publisher{}.publish(missing, "x"); });
  CHECK_FALSE(has_control(msg));
  CHECK(msg.find("no\\x0adir\\x1b") != std::string::npos);
  holdfast::checkpoint_options o;
  o.step_prefix = "ck\npt-";
  CHECK_FALSE(has_control(error_text(
      [&] { holdfast::checkpoint_manager m(dir.path(), holdfast::directory_commit::rename, o); })));
  CHECK_FALSE(has_control(error_text([&] {
    holdfast::validate_run_id(
        "run\n/\x1b"
        "1");
  })));
}

TEST_CASE("log lines reach the sink escaped, one line per report") {
  std::vector<std::string> lines;
  holdfast::log_fn sink = [&](std::string_view l) { lines.emplace_back(l); };
  holdfast::detail::log_line(sink,
                             "pointer 'a\nholdfast: forged' recovered\x1b"
                             "[0m");
  REQUIRE(lines.size() == 1);
  CHECK_FALSE(has_control(lines[0]));
  CHECK(lines[0] == "pointer 'a\\x0aholdfast: forged' recovered\\x1b[0m");
}
