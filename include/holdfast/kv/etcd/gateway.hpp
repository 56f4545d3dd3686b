// holdfast/kv/etcd/gateway.hpp — etcd's JSON gateway as the client and the watch read it: the
// lines of a stream, the range_end of a prefix, int64s sent as strings, gRPC error codes and
// what they mean (errno, a token to renew, a lease etcd no longer holds), the fields of a kv
// object, and the bodies of a put and an insert.
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
//   - etcd_put_json, etcd_insert_json (a txn: put only while the key has create_revision 0) and
//     etcd_range_json spell each request body once, for etcd_kv's writes and the lease's re-puts
//     of leased keys under a new lease (kv/etcd/lease.hpp).
// Caveats:
//   - No I/O here, and no limit on a pending line: the client caps a watch message
//     (etcd_options::max_message).
#pragma once

#include <cerrno>
#include <charconv>  // from_chars: an int64 sent as a string
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>  // errc

#include "../../detail/base64.hpp"
#include "../../detail/json.hpp"
#include "../../error.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Whether a request may go to another endpoint, or again on a fresh connection, after it was
/// sent: reads may, writes (whose outcome is then unknown) may not (kv/etcd/client.hpp).
enum class etcd_request { read, write };

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

/// True for etcd's answer to a write or keep-alive naming a lease it no longer holds (expired or
/// revoked): "requested lease not found" (gRPC code 5).
inline bool etcd_lease_not_found(const error& e) noexcept {
  return std::string_view(e.what()).find("requested lease not found") != std::string_view::npos;
}

/// The body of a put of `key` (a full etcd key) = `value`, carrying `lease` unless it is 0.
inline std::string etcd_put_json(std::string_view key, std::string_view value, std::int64_t lease) {
  std::string body = "{\"key\":" + json_quote(base64_encode(key)) +
                     ",\"value\":" + json_quote(base64_encode(value));
  if (lease != 0) body += ",\"lease\":\"" + std::to_string(lease) + "\"";
  return body + "}";
}

/// The body of a txn that puts `key` = `value` (with `lease` unless 0) only while the key does
/// not exist (create_revision 0): exactly one of several inserters succeeds.
inline std::string etcd_insert_json(std::string_view key, std::string_view value,
                                    std::int64_t lease) {
  return "{\"compare\":[{\"target\":\"CREATE\",\"key\":" + json_quote(base64_encode(key)) +
         ",\"createRevision\":\"0\"}],\"success\":[{\"requestPut\":" +
         etcd_put_json(key, value, lease) + "}]}";
}

/// The body of a range (or deleterange) of every key starting with `start`.
inline std::string etcd_range_json(const std::string& start) {
  return "{\"key\":" + json_quote(base64_encode(start)) +
         ",\"range_end\":" + json_quote(base64_encode(etcd_prefix_end(start))) + "}";
}

/// Whether the reply to an etcd_insert_json txn says it put the key.
inline bool etcd_txn_succeeded(const json_value& reply) {
  const json_value* ok = reply.find("succeeded");
  return ok && ok->is_bool() && ok->as_bool();
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
