// detail/json.hpp: values, exact integers, doubles that keep their type, RFC 8259 escapes in
// both directions, and a table of malformed texts with their offsets.
#include <doctest/doctest.h>

#include <clocale>
#include <cstdint>
#include <holdfast/detail/json.hpp>
#include <limits>
#include <string>

using holdfast::detail::json_quote;
using holdfast::detail::json_value;
using holdfast::detail::parse_json;
using holdfast::detail::to_json;

TEST_CASE("values: types, accessors, ordered objects") {
  json_value v =
      parse_json(R"({"b":true,"n":null,"i":-42,"d":2.5,"s":"x","a":[1,"y"],"o":{}})", "t.json");
  REQUIRE(v.is_object());
  CHECK(v.as_object().size() == 7);
  CHECK(v.as_object()[0].first == "b");  // insertion order
  CHECK(v.as_object()[6].first == "o");
  CHECK(v.find("b")->as_bool());
  CHECK(v.find("n")->is_null());
  CHECK(v.find("i")->is_integer());
  CHECK(v.find("i")->as_int64() == -42);
  CHECK(v.find("d")->is_number());
  CHECK_FALSE(v.find("d")->is_integer());
  CHECK(v.find("d")->as_double() == 2.5);
  CHECK(v.find("s")->as_string() == "x");
  CHECK(v.find("a")->as_array().size() == 2);
  CHECK(v.find("o")->is_object());
  CHECK(v.find("missing") == nullptr);
  CHECK(v.find("a")->find("x") == nullptr);  // not an object
  // wrong-type access is an error, not a crash
  CHECK_THROWS_AS((void)v.find("s")->as_int64(), holdfast::error);
  CHECK_THROWS_AS((void)v.find("d")->as_int64(), holdfast::error);
  CHECK_THROWS_AS((void)v.find("b")->as_string(), holdfast::error);
  CHECK_THROWS_AS((void)v.find("i")->as_array(), holdfast::error);

  json_value built;
  built.set("k", 1);
  built.set("k", 2);  // set replaces in place
  built.set("arr", json_value()).push_back("x");
  CHECK(to_json(built) == R"({"k":2,"arr":["x"]})");
  CHECK(parse_json(to_json(v), "again") == v);
}

TEST_CASE("integers are exact across the int64 and uint64 range") {
  auto max = std::numeric_limits<std::int64_t>::max();
  auto min = std::numeric_limits<std::int64_t>::min();
  CHECK(parse_json("9223372036854775807", "t").as_int64() == max);
  CHECK(parse_json("-9223372036854775808", "t").as_int64() == min);
  CHECK(to_json(json_value(max)) == "9223372036854775807");
  CHECK(to_json(json_value(min)) == "-9223372036854775808");
  CHECK(parse_json("18446744073709551615", "t").as_uint64() ==
        std::numeric_limits<std::uint64_t>::max());
  try {
    (void)parse_json("9223372036854775808", "t").as_int64();
    FAIL("no error");
  } catch (const holdfast::error& e) {
    CHECK(e.errnum() == ERANGE);
  }
  CHECK_THROWS_AS((void)parse_json("-1", "t").as_uint64(), holdfast::error);
  // a big integer keeps its text even beyond 64 bits
  CHECK(to_json(parse_json("123456789012345678901234567890", "t")) ==
        "123456789012345678901234567890");
}

TEST_CASE("doubles round-trip in the shortest form and stay doubles") {
  for (double d : {0.1, -2.5, 1e300, 5e-324, 3.0, 0.0, 123456789.125, 1.0 / 3.0}) {
    CAPTURE(d);
    std::string text = to_json(json_value(d));
    json_value back = parse_json(text, "t");
    CHECK(back.as_double() == d);
    CHECK_FALSE(back.is_integer());
  }
  CHECK(to_json(json_value(3.0)) == "3.0");
  CHECK(to_json(json_value(0.1)) == "0.1");
  CHECK_THROWS_AS((void)json_value{std::numeric_limits<double>::quiet_NaN()}, holdfast::error);
  CHECK_THROWS_AS((void)json_value{std::numeric_limits<double>::infinity()}, holdfast::error);
  CHECK_THROWS_AS((void)parse_json("1e400", "t").as_double(), holdfast::error);
  // the C locale's decimal separator does not matter
  if (std::setlocale(LC_NUMERIC, "de_DE.UTF-8")) {
    CHECK(to_json(json_value(2.5)) == "2.5");
    CHECK(parse_json("2.5", "t").as_double() == 2.5);
    std::setlocale(LC_NUMERIC, "C");
  }
}

TEST_CASE("strings: RFC 8259 escapes out and in, UTF-8 passed through") {
  CHECK(json_quote("plain") == "\"plain\"");
  CHECK(json_quote("q\"b\\") == R"("q\"b\\")");
  CHECK(json_quote("\b\f\n\r\t") == R"("\b\f\n\r\t")");
  CHECK(json_quote(std::string("\x01\x1f\x00", 3)) == R"("\u0001\u001f\u0000")");
  CHECK(json_quote("caf\xc3\xa9 \xf0\x9f\x9a\x80") == "\"caf\xc3\xa9 \xf0\x9f\x9a\x80\"");
  CHECK(json_quote("/") == "\"/\"");
  CHECK(parse_json(R"("\u00e9\u20ac\ud83d\ude80\/\"\\")", "t").as_string() ==
        "\xc3\xa9\xe2\x82\xac\xf0\x9f\x9a\x80/\"\\");
  CHECK(parse_json(R"("\u0000")", "t").as_string() == std::string(1, '\0'));
  std::string all;
  for (int c = 1; c < 128; ++c) all += static_cast<char>(c);
  all += "\xc3\xa9\xe2\x82\xac\xf0\x9f\x9a\x80";
  CHECK(parse_json(json_quote(all), "t").as_string() == all);
}

TEST_CASE("pretty output parses back the same") {
  json_value v = parse_json(R"({"a":[1,{"b":[]}],"c":{},"d":"e"})", "t");
  std::string pretty = to_json(v, 2);
  CHECK(pretty.find("\n  \"a\": [") != std::string::npos);
  CHECK(parse_json(pretty, "t") == v);
}

TEST_CASE("malformed JSON: format_error naming the source and the byte offset") {
  struct row {
    std::string text;
    const char* expect;
  };
  const row rows[] = {
      {"", "offset 0: unexpected end of input"},
      {"   ", "offset 3: unexpected end of input"},
      {"{", "offset 1: unexpected end of input"},
      {"[1,2", "offset 4: unexpected end of input"},
      {"\"abc", "offset 4: unexpected end of input"},
      {"tru", "offset 0: unexpected end of input"},
      {"nul", "offset 0: unexpected end of input"},
      {"-", "offset 1: unexpected end of input"},
      {"1.", "offset 2: unexpected end of input"},
      {"1e", "offset 2: unexpected end of input"},
      {"\"\\u12", "offset 5: unexpected end of input"},
      {"[1,]", "offset 3: trailing comma in array"},
      {"{\"a\":1,}", "offset 7: trailing comma in object"},
      {"{\"a\" 1}", "offset 5: expected ':'"},
      {"{a:1}", "offset 1: expected a string key"},
      {"[1 2]", "offset 3: expected ',' or ']'"},
      {"{\"a\":1 \"b\":2}", "offset 7: expected ',' or '}'"},
      {"01", "offset 1: leading zero"},
      {"-a", "offset 1: expected a digit"},
      {"1.x", "offset 2: expected a digit after '.'"},
      {"1e+", "offset 3: unexpected end of input"},
      {"+1", "offset 0: expected a value"},
      {".5", "offset 0: expected a value"},
      {"NaN", "offset 0: expected a value"},
      {"truE", "offset 0: invalid literal"},
      {"\"\\x\"", "offset 1: invalid escape"},
      {"\"\\u12g4\"", "offset 5: expected a hex digit"},
      {"\"\\udc00\"", "offset 1: lone low surrogate"},
      {"\"\\ud800x\"", "offset 1: high surrogate without a low surrogate"},
      {"\"\\ud800\\u0041\"", "offset 1: high surrogate without a low surrogate"},
      {"\"a\nb\"", "offset 2: unescaped control character"},
      {"\"\xff\"", "offset 1: invalid UTF-8"},
      {"\"\xc0\xaf\"", "offset 1: invalid UTF-8"},           // overlong
      {"\"\xed\xa0\x80\"", "offset 1: invalid UTF-8"},       // encoded surrogate
      {"\"\xe2\x82\"", "offset 1: invalid UTF-8 sequence"},  // cut sequence then quote
      {"{\"a\":1,\"a\":2}", "offset 7: duplicate key \"a\""},
      {"1 2", "offset 2: unexpected text after the JSON value"},
      {"{} // c", "offset 3: unexpected text"},
      {std::string(600, '[') + std::string(600, ']'), "nesting deeper than 512"},
  };
  for (const auto& r : rows) {
    CAPTURE(r.text);
    try {
      (void)parse_json(r.text, "/jobs/cmd.json");
      FAIL("parsed without error");
    } catch (const holdfast::format_error& e) {
      std::string w = e.what();
      CHECK(w.find("/jobs/cmd.json") != std::string::npos);
      CHECK_MESSAGE(w.find(r.expect) != std::string::npos, w);
      CHECK(e.errnum() == EINVAL);
    }
  }
  // a duplicate key in a large object (the hashed path)
  std::string big = "{";
  for (int i = 0; i < 40; ++i) big += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  CHECK(parse_json(big + "\"z\":0}", "t").as_object().size() == 41);
  CHECK_THROWS_AS(parse_json(big + "\"k3\":0}", "t"), holdfast::format_error);
}
