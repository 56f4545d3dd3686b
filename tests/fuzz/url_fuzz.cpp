// Fuzzes the URL parsers of user and configuration input: detail::parse_http_url and parse_url
// (http:// and https://: cloud metadata and etcd endpoints), parse_kv_url (kv/url.hpp: file://
// and etcd:// coordination stores), parse_store_url and parse_hdfs_url (store.hpp: Horovod-style
// store prefixes).
// Properties: parse_url and parse_kv_url throw nothing but holdfast::format_error (their
// documented contract), the store parsers nothing but holdfast::error; what parse_kv_url accepts
// is usable (each etcd endpoint parses with parse_http_url to a non-zero port, the prefix is a
// valid key, the directory is absolute); a store URL's full_path(path) parses back to the same
// scheme and path, and localized_path undoes full_path; no error of parse_kv_url shows a password
// of the URL (user info's password, user info without ':', or a query value other than ca, cert,
// key, server_name, user, password_file, password_env, lease_ttl, leased_prefix).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <holdfast/detail/http.hpp>
#include <holdfast/kv/url.hpp>
#include <holdfast/store.hpp>

#include "fuzz_support.hpp"

namespace {

void http_url(std::string_view in, bool allow_https) {
  std::string path;
  holdfast::detail::http_endpoint ep;
  try {
    ep = allow_https ? holdfast::detail::parse_url(in, &path, true)
                     : holdfast::detail::parse_http_url(in, &path);
  } catch (const holdfast::format_error&) {
    return;
  }
  hf_fuzz::check(!ep.host.empty(), "parse_url accepted an empty host");
  hf_fuzz::check(path.empty() || path.front() == '/', "parse_url gave a relative path");
  hf_fuzz::check(allow_https || !ep.tls, "parse_http_url accepted an https:// URL");
}

// What a store URL holds that no error message may show: the password of user info
// ("etcd://user:secret@host"), user info without ':' (a token: "etcd://secret@host") and the
// values of query parameters not known to be harmless ("?password=secret"). Only secrets of 4 bytes
// or more that occur once in the URL are checked (a shorter or repeated one may be in the message
// for another reason, e.g. as the host), in the URL the error shows (error::path()).
std::vector<std::string> secrets_of(std::string_view url) {
  std::vector<std::string> out;
  auto unique = [&](std::string_view s) {
    // '*' (the redaction), '\\' and control bytes (detail::printable's escapes) could spell the
    // secret from other text: such secrets are not checked.
    for (char c : s)
      if (c == '*' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == '\x7f') return;
    if (s.size() >= 4 && url.find(s) == url.rfind(s)) out.emplace_back(s);
  };
  const std::size_t scheme_end = url.find("://");
  const std::size_t auth = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  const std::size_t auth_end = std::min(url.find_first_of("/?#", auth), url.size());
  const std::size_t at = url.substr(0, auth_end).rfind('@');
  if (at != std::string_view::npos && at >= auth) {
    const std::size_t colon = url.substr(0, at).find(':', auth);
    if (colon != std::string_view::npos)
      unique(url.substr(colon + 1, at - colon - 1));
    else
      unique(url.substr(auth, at - auth));  // token-only user info: all of it is secret
  }
  const std::size_t q = url.find('?', auth_end);
  if (q == std::string_view::npos) return out;
  std::string_view query = url.substr(q + 1);
  for (;;) {
    const std::size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    const std::size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    bool safe = false;
    for (std::string_view k : {"ca", "cert", "key", "server_name", "user", "password_file",
                               "password_env", "lease_ttl", "leased_prefix"})
      safe = safe || key == k;
    if (eq != std::string_view::npos && !safe) unique(item.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return out;
}

// `s` with each "\\xHH" of detail::printable back as its byte.
std::string unescaped(std::string_view s) {
  auto hex = [](char c) { return c >= 'a' && c <= 'f' ? c - 'a' + 10 : c - '0'; };
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] == 'x') {
      out += static_cast<char>(hex(s[i + 2]) * 16 + hex(s[i + 3]));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

void kv_url(std::string_view in) {
  holdfast::kv_url u;
  try {
    u = holdfast::parse_kv_url(in);
  } catch (const holdfast::format_error& e) {
    // The URL as the error shows it (its other text quotes only keys and members), with
    // detail::printable's escapes undone: "h\\x0123" shows the bytes h, 0x01, '2', '3', not the
    // text "x0123" (a secret once in the URL, as the value of ?a=, is not shown there).
    const std::string shown = unescaped(e.path());
    for (const auto& secret : secrets_of(in))
      if (shown.find(secret) != std::string::npos)
        hf_fuzz::fail("parse_kv_url's error shows a secret of the URL: '" + secret + "' in " +
                      e.what());
    return;
  }
  if (u.scheme == holdfast::kv_url::kind::file) {
    hf_fuzz::check(
        u.directory.size() > 1 && u.directory.front() == '/' && u.directory.back() != '/',
        "parse_kv_url gave a file store that is not an absolute directory");
    return;
  }
  hf_fuzz::check(!u.endpoints.empty(), "parse_kv_url gave an etcd store without members");
  for (const auto& e : u.endpoints) {
    try {
      auto ep = holdfast::detail::parse_endpoint_url(e);
      hf_fuzz::check(ep.port != 0, "parse_kv_url gave an etcd member on port 0");
      hf_fuzz::check(ep.tls == u.secure, "an etcd member's scheme differs from the URL's");
    } catch (const holdfast::format_error& x) {
      hf_fuzz::fail("parse_kv_url gave an endpoint parse_endpoint_url refuses: " +
                    std::string(x.what()));
    }
  }
  hf_fuzz::check_equal(holdfast::detail::key_problem(u.prefix), "",
                       "parse_kv_url gave an invalid prefix");
}

void store_url(std::string_view in) {
  try {
    (void)holdfast::parse_hdfs_url(in);
  } catch (const holdfast::error&) {
  }
  (void)holdfast::is_dbfs_path(in);
  (void)holdfast::normalize_dbfs_path(in);
  holdfast::store_url u;
  try {
    u = holdfast::parse_store_url(in);
  } catch (const holdfast::error&) {
    return;
  }
  const std::string full = u.full_path(u.path);
  hf_fuzz::check_equal(u.localized_path(full), u.path, "localized_path does not undo full_path");
  holdfast::store_url again;
  try {
    again = holdfast::parse_store_url(full);
  } catch (const holdfast::error& e) {
    hf_fuzz::fail("parse_store_url refuses full_path of what it parsed: " + std::string(e.what()));
  }
  hf_fuzz::check(again.scheme == u.scheme, "full_path of a store URL parses to another scheme");
  hf_fuzz::check_equal(again.path, u.path, "full_path of a store URL parses to another path");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = hf_fuzz::text(data, size);
  http_url(in, false);
  http_url(in, true);
  kv_url(in);
  store_url(in);
  return 0;
}
