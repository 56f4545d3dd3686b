// detail/base64.hpp: RFC 4648 test vectors, every byte value round-trips, malformed input is a
// format_error naming the source and the offset.
#include <doctest/doctest.h>

#include <holdfast/detail/base64.hpp>
#include <random>
#include <string>

using holdfast::detail::base64_decode;
using holdfast::detail::base64_encode;

TEST_CASE("base64 matches the RFC 4648 test vectors") {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (auto& v : vectors) {
    CHECK(base64_encode(v.first) == v.second);
    CHECK(base64_decode(v.second, "t") == v.first);
  }
  CHECK(base64_encode("a/b") == "YS9i");  // what etcd sees for the key "a/b"
}

TEST_CASE("base64 round-trips every byte value and random binary strings") {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  CHECK(base64_decode(base64_encode(all), "t") == all);
  std::mt19937 rng(7);
  for (int len = 0; len < 70; ++len) {
    std::string s;
    for (int i = 0; i < len; ++i) s += static_cast<char>(rng() & 0xff);
    std::string e = base64_encode(s);
    CHECK(e.size() % 4 == 0);
    CHECK(base64_decode(e, "t") == s);
  }
}

TEST_CASE("base64_decode rejects malformed input with the source and offset") {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      base64_decode(text, "etcd reply");
    } catch (const holdfast::format_error& e) {
      CHECK(e.errnum() == EINVAL);
      return e.what();
    }
    return "no error";
  };
  CHECK(error_of("Zm9").find("multiple of 4") != std::string::npos);
  CHECK(error_of("Zm9v!A==").find("offset 4") != std::string::npos);
  CHECK(error_of("Zm9v!A==").find("etcd reply") != std::string::npos);
  CHECK(error_of("Z===").find("padding") != std::string::npos);
  CHECK(error_of("Zg=a").find("offset 2") != std::string::npos);  // '=' not at the end
  CHECK(error_of("Zm=v").find("offset 2") != std::string::npos);
  CHECK(error_of("Zm8=Zm8=").find("offset 3") != std::string::npos);  // padding mid-stream
  CHECK(error_of("Zh==").find("padding bits") != std::string::npos);  // non-canonical
  CHECK(error_of("Zm9=").find("padding bits") != std::string::npos);
}
