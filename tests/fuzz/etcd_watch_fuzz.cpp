// Fuzzes etcd's watch stream (kv/etcd.hpp) as the gateway sends it: newline-delimited JSON
// messages over a streamed HTTP body, split into lines by detail::etcd_client::stream and read by
// basic_etcd_kv::get (created / canceled / events with base64 keys and values), over scripted_io.
//
// Input: byte 0 bits 0-5 choose the recv size (1 to 64 bytes, 0: all at once), bit 6 frames the
// stream with chunked transfer coding (else it ends when the connection closes); the rest is the
// body of the watch response.
// Properties: only holdfast::error escapes; the messages stream() hands on, and whether it
// fails, do not depend on how the bytes are split across recv calls; each message handed on is a
// JSON object that a line of the body parses to.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <holdfast/kv/etcd.hpp>

#include "fuzz_support.hpp"

namespace {

namespace d = holdfast::detail;
using hf_fuzz::scripted_io;

std::string frame(std::string_view body, bool chunked) {
  std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
  if (!chunked) return head + "\r\n" + std::string(body);
  std::string out = head + "Transfer-Encoding: chunked\r\n\r\n";
  // Chunks of 7 bytes: chunk boundaries fall inside messages and inside UTF-8 sequences.
  for (std::size_t at = 0; at < body.size(); at += 7) {
    const auto piece = body.substr(at, 7);
    static const char hex[] = "0123456789abcdef";
    out += hex[piece.size()];
    out += "\r\n";
    out += piece;
    out += "\r\n";
  }
  return out + "0\r\n\r\n";
}

holdfast::etcd_options options() {
  holdfast::etcd_options o;
  o.endpoints = {"http://127.0.0.1:2379"};
  o.request_timeout = std::chrono::milliseconds(2000);
  o.suspect_for = std::chrono::milliseconds(0);
  return o;
}

struct streamed {
  std::vector<std::string> messages;  // to_json of each message handed on
  bool failed = false;
};

streamed stream(const std::string& response, std::size_t chunk) {
  scripted_io::reset({response}, chunk);
  d::etcd_client<scripted_io> client(options());
  streamed out;
  try {
    client.stream("/v3/watch", "{}", "etcd get", "k",
                  std::chrono::steady_clock::now() + std::chrono::seconds(2),
                  [&](const d::json_value& msg) {
                    hf_fuzz::check(msg.is_object(), "stream handed on a message that is no object");
                    out.messages.push_back(d::to_json(msg));
                    return true;
                  });
  } catch (const holdfast::error&) {
    out.failed = true;
  }
  return out;
}

// The JSON objects the lines of `body` parse to, in order, up to the first that does not.
std::vector<std::string> lines_as_json(std::string_view body) {
  std::vector<std::string> out;
  while (!body.empty()) {
    const auto nl = body.find('\n');
    const auto line = body.substr(0, nl);
    body.remove_prefix(nl == std::string_view::npos ? body.size() : nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
    try {
      out.push_back(d::to_json(d::parse_json(line, "line")));
    } catch (const holdfast::error&) {
      break;
    }
  }
  return out;
}

void get(const std::string& watch_response, std::size_t chunk) {
  const std::string range = hf_fuzz::http_ok(R"({"header":{"revision":"7"}})");
  scripted_io::reset({range, watch_response}, chunk);
  try {
    holdfast::basic_etcd_kv<scripted_io> kv(options(), holdfast::kv_namespace("run", 0));
    (void)kv.get("step", std::chrono::milliseconds(1500));
  } catch (const holdfast::error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t chunk = data[0] & 0x3f;
  const bool chunked = (data[0] & 0x40) != 0;
  const auto body = hf_fuzz::text(data + 1, size - 1);
  const std::string response = frame(body, chunked);

  const streamed whole = stream(response, 0);
  if (chunk != 0) {
    const streamed split = stream(response, chunk);
    hf_fuzz::check(split.failed == whole.failed, "stream's failure depends on the recv sizes");
    hf_fuzz::check(split.messages == whole.messages, "stream's messages depend on the recv sizes");
  }
  const auto expected = lines_as_json(body);
  hf_fuzz::check(whole.messages.size() <= expected.size(),
                 "stream handed on more messages than "
                 "the body has JSON lines");
  for (std::size_t i = 0; i < whole.messages.size(); ++i)
    hf_fuzz::check_equal(whole.messages[i], expected[i], "stream handed on another message");

  get(response, chunk);
  return 0;
}
