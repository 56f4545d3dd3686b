// holdfast/detail/http/message.hpp — the vocabulary of the HTTP/1.1 client: a request, a
// response, the timeouts of one exchange, and the error for a connection closed mid-response.
//
// Guarantees:
//   - Plain values: http_request and http_response copy and move as their strings do; nothing
//     here does I/O.
//   - http_response::header() finds a field by name ASCII case-insensitively (http_iequal), the
//     first one when a name repeats.
//   - http_body_excerpt is how every message shows a reply body (or text taken from one): at
//     most its first 200 bytes, escaped, and its length when longer, so an error stays short
//     whatever the server sent (up to 64 MiB).
//   - http_connection_closed is a holdfast::error (errno EPROTO, as any malformed response), so a
//     caller can tell a lost connection from garbage by its type alone.
// Caveats:
//   - Header values are kept as received (trimmed of spaces and tabs); nothing is unfolded or
//     decoded.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../ascii.hpp"  // ascii_iequal: header names; printable: bodies in messages

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// How long connecting, and then the whole exchange after connecting, may take; `until`, when
/// set, is an end for the whole call besides (the caller's deadline: the exchange after a slow
/// connect gets only what is left of it).
struct http_timeouts {
  std::chrono::milliseconds connect{1000};
  std::chrono::milliseconds read{2000};
  std::optional<std::chrono::steady_clock::time_point> until;

  http_timeouts() = default;
  http_timeouts(std::chrono::milliseconds c, std::chrono::milliseconds r,
                std::optional<std::chrono::steady_clock::time_point> u = std::nullopt)
      : connect(c), read(r), until(u) {}
};

/// Header fields as sent or received, in order.
using http_headers = std::vector<std::pair<std::string, std::string>>;

/// A request: method ("GET"), target ("/v3/kv/put"), extra headers and body. Host, Connection
/// and (when there is a body or the method is POST/PUT/PATCH) Content-Length are added.
struct http_request {
  std::string method;
  std::string target;
  http_headers headers;
  std::string body;
};

/// ASCII case-insensitive equality, for header names.
inline bool http_iequal(std::string_view a, std::string_view b) noexcept {
  return ascii_iequal(a, b);
}

/// A complete response: status code, header fields (values trimmed) and the de-chunked body.
struct http_response {
  int status = 0;
  /// The minor HTTP version of the status line (HTTP/1.x): 0 or 1.
  int minor_version = 1;
  http_headers headers;
  std::string body;
  /// The first header with this name (case-insensitive), or nullptr.
  const std::string* header(std::string_view name) const {
    for (const auto& h : headers)
      if (http_iequal(h.first, name)) return &h.second;
    return nullptr;
  }
};

/// The most bytes of a reply body a message shows (http_body_excerpt).
inline constexpr std::size_t http_body_shown = 200;

/// A reply body as every message shows it: its first http_body_shown bytes (escaped by
/// printable), then "... (N bytes)" when the body, `total` bytes long, has more.
inline std::string http_body_excerpt(std::string_view body, std::size_t total) {
  std::string out = printable(body.substr(0, http_body_shown));
  if (total > http_body_shown) out += "... (" + std::to_string(total) + " bytes)";
  return out;
}

/// http_body_excerpt of a body held whole.
inline std::string http_body_excerpt(std::string_view body) {
  return http_body_excerpt(body, body.size());
}

/// The server closed the connection before its response was complete: nothing, part of the
/// head or part of the body arrived (errno EPROTO, as for any malformed response).
class http_connection_closed : public error {
 public:
  using error::error;
};

/// The clock of every deadline the client keeps.
using http_clock = std::chrono::steady_clock;

}  // namespace detail
HOLDFAST_NAMESPACE_END
