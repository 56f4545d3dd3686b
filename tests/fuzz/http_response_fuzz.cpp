// Fuzzes the HTTP/1.1 response parsing of detail/http.hpp (cloud metadata servers, etcd's
// gateway): the status line and header fields (http_parse_head), the choice of body framing
// (http_body_for) and the Content-Length / chunked / until-close body decoder, all reached
// through http_call and http_stream over scripted_io, whose socket replays the fuzzed bytes.
//
// Input: byte 0 chooses the recv size (bits 0-5: 1 to 64 bytes, 0: all at once), the method
// (bit 6: HEAD) and the call (bit 7: http_stream, stopping after byte 1 % 4 + 1 pieces); the rest
// is the server's response.
// Properties: only holdfast::error escapes; http_call's outcome (status, headers, body, or the
// errno of its failure) does not depend on how the bytes are split across recv calls.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <holdfast/detail/http.hpp>

#include "fuzz_support.hpp"

namespace {

namespace d = holdfast::detail;

struct outcome {
  bool ok = false;
  int errnum = 0;
  d::http_response response;
};

outcome call(std::string_view response, std::size_t chunk, const std::string& method) {
  hf_fuzz::scripted_io::reset({std::string(response)}, chunk);
  outcome o;
  try {
    o.response = d::http_call<hf_fuzz::scripted_io>(d::http_endpoint{"127.0.0.1", 80},
                                                    d::http_request{method, "/x", {}, {}});
    o.ok = true;
  } catch (const holdfast::error& e) {
    o.errnum = e.errnum();
  }
  return o;
}

std::string describe(const outcome& o) {
  if (!o.ok) return "error " + std::to_string(o.errnum);
  std::string s = "status " + std::to_string(o.response.status);
  for (const auto& h : o.response.headers) s += " [" + h.first + ": " + h.second + "]";
  return s + " body '" + o.response.body + "'";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t chunk = data[0] & 0x3f;
  const std::string method = (data[0] & 0x40) ? "HEAD" : "GET";
  const bool stream = (data[0] & 0x80) != 0;
  const int stop_after = data[1] % 4 + 1;
  const auto response = hf_fuzz::text(data + 2, size - 2);

  if (stream) {
    hf_fuzz::scripted_io::reset({std::string(response)}, chunk);
    int pieces = 0;
    std::string got;
    try {
      d::http_stream<hf_fuzz::scripted_io>(
          d::http_endpoint{"::1", 2379}, d::http_request{"POST", "/v3/watch", {}, "{}"}, {},
          std::chrono::steady_clock::now() + std::chrono::seconds(5), [&](std::string_view bytes) {
            got.append(bytes);
            return ++pieces < stop_after;
          });
    } catch (const holdfast::error&) {
    }
    return 0;
  }

  const outcome whole = call(response, 0, method);
  if (chunk != 0) {
    const outcome split = call(response, chunk, method);
    hf_fuzz::check_equal(describe(split), describe(whole),
                         "http_call's result depends on how the response is split");
  }
  return 0;
}
