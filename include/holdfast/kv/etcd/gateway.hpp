// holdfast/kv/etcd/gateway.hpp — etcd's JSON gateway as the client and the watch read it: the
// lines of a stream, the range_end of a prefix, int64s sent as strings, gRPC error codes and
// what they mean (errno, a token to renew), and the fields of a kv object.
//
// Keys and values travel base64-encoded in JSON, as the gateway requires (detail/base64.hpp).
//
// Guarantees:
//   - etcd_errno maps a gateway error to errno: EAGAIN for gRPC code 14 (unavailable: leader
//     changed, no leader, request timed out, server stopped, transport closing), ETIMEDOUT for 4
//     (deadline exceeded) and etcd's own "context deadline exceeded", EACCES for 16
//     (unauthenticated), 7 (permission denied) and a failed authentication, EIO for the rest.
//   - etcd_token_problem is true for the answers a fresh token may cure ("invalid auth token",
//     "user name is empty"); etcd_unauthenticated is the error that asks for one.
//   - etcd_int reads an int64 sent as a JSON string or number, and throws EPROTO for anything
//     else; etcd_string_field throws EPROTO for a field that is absent or not a string;
//     etcd_decoded_value treats an absent value as the empty one (the gateway omits empty
//     fields) and throws holdfast::format_error for bad base64.
//   - etcd_take_lines hands on complete, non-blank lines only; a partial line stays pending.
// Caveats:
//   - No I/O here, and no limit on a pending line: the client caps a watch message
//     (etcd_options::max_message).
#pragma once

#include <cerrno>
#include <charconv>  // from_chars: an int64 sent as a string
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>  // errc

#include "../../detail/base64.hpp"
#include "../../detail/json.hpp"
#include "../../error.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Cuts the complete lines (LF-terminated) off the front of `pending` and passes each one that
/// is not blank to `on_line(const std::string&) -> bool` until it returns false; returns false
/// then (the lines after it stay in `pending`), true otherwise.
template <class OnLine>
bool etcd_take_lines(std::string& pending, OnLine&& on_line) {
  for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
    const std::string line = pending.substr(0, nl);
    pending.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") != std::string::npos && !on_line(line)) return false;
  }
  return true;
}

/// The etcd range_end that covers every key starting with `prefix`: the prefix with its last
/// byte below 0xff incremented and what follows dropped; "\0" (everything) for an all-0xff one.
inline std::string etcd_prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto last = static_cast<unsigned char>(prefix.back());
    if (last < 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

/// An int64 the gateway sends as a JSON string ("42") or a number; `fallback` when absent.
inline std::int64_t etcd_int(const json_value* v, std::int64_t fallback = 0) {
  if (!v) return fallback;
  if (v->is_number()) return v->as_int64();
  const std::string& s = v->as_string();
  std::int64_t out = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size())
    throw error(EPROTO, "etcd", "", "expected an integer, got '" + s + "'");
  return out;
}

/// The errno for a gateway error with gRPC status `code` and message `text`: EAGAIN for 14
/// (unavailable), ETIMEDOUT for 4 (deadline exceeded) and for etcd's own request deadline
/// (code 2, "context deadline exceeded"), EACCES for 16 (unauthenticated) and 7 (permission
/// denied) and for a failed authentication, EIO for the rest.
inline int etcd_errno(std::int64_t code, const std::string& text) noexcept {
  if (code == 14) return EAGAIN;
  if (code == 4 || (code == 2 && text == "context deadline exceeded")) return ETIMEDOUT;
  if (code == 16 || code == 7 || text.find("authentication failed") != std::string::npos)
    return EACCES;
  return EIO;
}

/// etcd refused the request's token (gRPC code 16, "invalid auth token": expired or unknown), or
/// the request carried none while authentication is on: the client authenticates again and
/// retries once.
class etcd_unauthenticated : public error {
 public:
  using error::error;
};

/// True for an answer that a fresh token may cure: "invalid auth token" (code 16) and "user name
/// is empty" (code 3: no token, as when authentication was enabled after the client started).
inline bool etcd_token_problem(std::int64_t code, const std::string& text) noexcept {
  return code == 16 || text.find("invalid auth token") != std::string::npos ||
         text.find("user name is empty") != std::string::npos;
}

/// The base64-decoded value of an etcd kv object (a range's "kvs" item or a watch event's "kv");
/// the gateway omits empty fields, so an absent "value" is the empty value. `key` names the
/// key in errors.
inline std::string etcd_decoded_value(const json_value& kv, const std::string& key) {
  const auto* v = kv.find("value");
  return v ? base64_decode(v->as_string(), "etcd value of '" + key + "'") : std::string();
}

/// The string field `field` of an etcd kv object (as "key", still base64-encoded); EPROTO when it
/// is absent or not a string.
inline std::string etcd_string_field(const json_value& kv, const char* field,
                                     const std::string& key) {
  const auto* v = kv.find(field);
  if (!v || !v->is_string())
    throw error(EPROTO, "etcd", key, std::string("reply without a string '") + field + "'");
  return v->as_string();
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
