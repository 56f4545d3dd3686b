// holdfast/termination/cloud.hpp — notices from cloud metadata servers, polled over HTTP:
// gce_maintenance_notice, gce_preempted_notice and aws_spot_notice (with its announced deadline).
//
// Guarantees:
//   - Each is a polled_notice (polled.hpp): one thread, a prompt stop() that cancels an HTTP
//     request in flight, and bad input (a malformed or truncated response, an unexpected value or
//     status, a slow or unreachable server) counted as "no notice" and logged once per run of
//     failures.
//   - aws_spot_notice uses IMDSv2 (a token from `PUT /latest/api/token`, cached, fetched again on
//     a 401). When the token request gets no answer or is refused — inside containers the PUT's
//     reply is dropped when the instance's hop limit is 1 — it polls with IMDSv1 GETs (no token),
//     so a spot notice is still seen where the instance allows IMDSv1, and asks for a token again
//     after a minute, or at once when a GET without a token is refused (401).
//   - AWS's `time` (ISO 8601 / RFC 3339) becomes deadline().
//   - A metadata URL from the environment ($GCE_METADATA_HOST, $AWS_EC2_METADATA_SERVICE_ENDPOINT)
//     that is not an http:// URL fails at once, the error naming the variable.
//   - Waking: each has polled_notice's set_waker; the polling thread notifies the attached waker
//     as soon as a poll finds the notice (has_notice_waker_v is true for all three).
// Caveats:
//   - Name lookup cannot be timed out: metadata URLs default to 169.254.169.254, not a name.
//   - While the token request gets no answer, a poll waits out its read timeout before the
//     IMDSv1 GET (once a minute, not on every poll).
//   - A wake comes only as fast as the polling finds the notice: up to one interval (1 s GCE,
//     5 s AWS) plus a request after the metadata server announced it.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/http.hpp"  // the metadata requests
#include "../detail/json.hpp"  // AWS's instance-action document
#include "../error.hpp"
#include "../io.hpp"
#include "notice.hpp"
#include "polled.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Where and how often a cloud notice asks its metadata server.
struct cloud_notice_options {
  /// Base URL of the metadata server; "" picks the platform's (see each notice).
  std::string url;
  /// Time between polls; 0 picks the notice's default (1 s GCE, 5 s AWS).
  std::chrono::milliseconds interval{0};
  /// Connect and whole-exchange timeouts of each request.
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds read_timeout{1000};
  /// Where a failed poll is logged (once per run of failures); empty: stderr.
  log_fn log;
};

namespace detail {

// The metadata URL an environment variable gives, checked here: a value that is no http:// URL
// fails naming the variable (a parse error of the URL alone does not say where it came from).
inline std::string metadata_url_from(const char* variable, std::string url) {
  try {
    (void)parse_http_url(url);
  } catch (const std::exception& e) {
    throw error(EINVAL, "environment", variable,
                "not a metadata server URL: " + std::string(e.what()));
  }
  return url;
}

}  // namespace detail

/// The GCE metadata server: $GCE_METADATA_HOST (as Google's client libraries read it: a host
/// and optional port, or an http:// URL), else http://169.254.169.254 (the address of
/// metadata.google.internal, without a DNS lookup). A bad value throws holdfast::error naming
/// GCE_METADATA_HOST (EINVAL).
inline std::string gce_metadata_url() {
  const char* host = std::getenv("GCE_METADATA_HOST");
  if (host && *host) {
    std::string h(host);
    return detail::metadata_url_from("GCE_METADATA_HOST",
                                     h.compare(0, 7, "http://") == 0 ? h : "http://" + h);
  }
  return "http://169.254.169.254";
}

/// The AWS instance metadata service: $AWS_EC2_METADATA_SERVICE_ENDPOINT (as the AWS SDKs read
/// it), else http://169.254.169.254. A bad value throws holdfast::error naming the variable.
inline std::string aws_metadata_url() {
  const char* url = std::getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (url && *url) {
    std::string u(url);
    while (!u.empty() && u.back() == '/') u.pop_back();
    return detail::metadata_url_from("AWS_EC2_METADATA_SERVICE_ENDPOINT", u);
  }
  return "http://169.254.169.254";
}

namespace detail {

inline std::string trim_ascii(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\n' || s.front() == '\r' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t'))
    s.remove_suffix(1);
  return std::string(s);
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
constexpr std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) noexcept {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

/// Parses an ISO 8601 / RFC 3339 time: YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM). Throws
/// format_error(source, ...) otherwise.
inline std::chrono::system_clock::time_point parse_iso8601(std::string_view s,
                                                           const std::string& source) {
  std::size_t i = 0;
  auto bad = [&](const char* why) {
    return format_error(source, "offset " + std::to_string(i) + ": " + why + " in time '" +
                                    std::string(s.substr(0, 40)) + "'");
  };
  auto num = [&](std::size_t digits) {
    int v = 0;
    for (std::size_t k = 0; k < digits; ++k, ++i) {
      if (i >= s.size() || s[i] < '0' || s[i] > '9') throw bad("expected a digit");
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  auto lit = [&](char c, char alt = '\0') {
    if (i >= s.size() || (s[i] != c && (alt == '\0' || s[i] != alt)))
      throw bad((std::string("expected '") + c + "'").c_str());
    ++i;
  };
  int year = num(4);
  lit('-');
  int month = num(2);
  lit('-');
  int day = num(2);
  lit('T', 't');
  int hour = num(2);
  lit(':');
  int minute = num(2);
  lit(':');
  int second = num(2);
  std::int64_t nanos = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    std::size_t digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (digits < 9) nanos = nanos * 10 + (s[i] - '0');
      ++digits;
      ++i;
    }
    if (digits == 0) throw bad("expected fraction digits");
    for (std::size_t k = digits; k < 9; ++k) nanos *= 10;
  }
  int offset_min = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    int sign = s[i] == '-' ? -1 : 1;
    ++i;
    int oh = num(2);
    lit(':');
    int om = num(2);
    offset_min = sign * (oh * 60 + om);
  } else {
    throw bad("expected 'Z' or an offset");
  }
  if (i != s.size()) throw bad("trailing characters");
  if (month < 1 || month > 12 || hour > 23 || minute > 59 || second > 60)
    throw bad("field out of range");
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  static constexpr int month_days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (day < 1 || day > month_days[month - 1] + (month == 2 && leap ? 1 : 0))
    throw bad("no such day in that month");
  std::int64_t secs =
      days_from_civil(year, static_cast<unsigned>(month), static_cast<unsigned>(day)) * 86400 +
      hour * 3600 + minute * 60 + second - offset_min * 60;
  // system_clock counts int64 nanoseconds: about 1677-09-22 to 2262-04-11
  using clock_duration = std::chrono::system_clock::duration;
  constexpr std::int64_t limit =
      std::chrono::duration_cast<std::chrono::seconds>(clock_duration::max()).count() - 1;
  if (secs > limit || secs < -limit) throw bad("outside the range the system clock can hold");
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<clock_duration>(
      std::chrono::seconds(secs) + std::chrono::nanoseconds(nanos)));
}

/// One GCE metadata value polled: noticed when it equals `expect`; other known values are
/// "no notice"; anything else throws (and is logged by the polling thread).
template <class Io>
struct gce_metadata_poll {
  http_endpoint endpoint;
  std::string path;  // the URL's path prefix, normally ""
  std::string key;   // "maintenance-event" or "preempted"
  std::string expect;
  std::vector<std::string> known;
  http_timeouts timeouts;

  std::string target() const { return path + "/computeMetadata/v1/instance/" + key; }
  std::string source() const {
    return "GCE metadata " + endpoint.url() + target() + " = " + expect;
  }
  poll_result operator()(const std::atomic<bool>& stopping) const {
    http_request req{"GET", target(), {{"Metadata-Flavor", "Google"}}, {}};
    http_response r = http_call<Io>(endpoint, req, timeouts, &stopping);
    const std::string where = endpoint.url() + target();
    if (r.status != 200) throw error(EPROTO, "http", where, "status " + std::to_string(r.status));
    const std::string value = trim_ascii(r.body);
    if (value == expect) return true;
    for (const auto& k : known)
      if (value == k) return false;
    throw format_error(where, "unexpected value '" + value.substr(0, 60) + "'");
  }
};

/// AWS spot interruption poll: IMDSv2 token (cached), then spot/instance-action. When the token
/// PUT fails (no answer: a container behind a hop limit of 1; or a refusal such as 403), the
/// GETs go without a token (IMDSv1) and the PUT is tried again after `token_retry`, or at once
/// when a GET without a token is refused with 401 (an instance that requires IMDSv2).
template <class Io>
struct aws_spot_poll {
  http_endpoint endpoint;
  std::string path;
  http_timeouts timeouts;
  /// How long IMDSv1 is used after a failed token request before the PUT is tried again.
  std::chrono::milliseconds token_retry{std::chrono::minutes(1)};
  std::string token;  // polling thread only; empty: IMDSv1
  std::chrono::steady_clock::time_point token_expires{};
  std::chrono::steady_clock::time_point token_retry_at{};  // while token is empty
  std::string token_failure;  // why the last token request failed ("" when it did not)

  static constexpr int token_ttl_seconds = 21600;
  static constexpr std::string_view action_key = "/latest/meta-data/spot/instance-action";

  std::string source() const {
    return "AWS metadata " + endpoint.url() + path + std::string(action_key);
  }

  void fetch_token(const std::atomic<bool>& stopping) {
    http_request req{"PUT",
                     path + "/latest/api/token",
                     {{"X-aws-ec2-metadata-token-ttl-seconds", std::to_string(token_ttl_seconds)}},
                     {}};
    http_response r = http_call<Io>(endpoint, req, timeouts, &stopping);
    if (r.status != 200 || r.body.empty())
      throw error(EPROTO, "http", endpoint.url() + req.target,
                  "token request answered status " + std::to_string(r.status));
    token = trim_ascii(r.body);
    token_expires = std::chrono::steady_clock::now() + std::chrono::seconds(token_ttl_seconds - 60);
  }
  /// Asks for a token; on failure (other than shutting down) falls back to IMDSv1 for a while.
  void try_token(const std::atomic<bool>& stopping) {
    try {
      fetch_token(stopping);
      token_failure.clear();
    } catch (const std::exception& e) {
      if (stopping.load()) throw;  // cancelled: not a reason to change protocol
      token.clear();
      token_failure = e.what();
      token_retry_at = std::chrono::steady_clock::now() + token_retry;
    }
  }
  http_response get_action(const std::atomic<bool>& stopping) const {
    http_request req{"GET", path + std::string(action_key), {}, {}};
    if (!token.empty()) req.headers.push_back({"X-aws-ec2-metadata-token", token});
    return http_call<Io>(endpoint, req, timeouts, &stopping);
  }
  poll_result operator()(const std::atomic<bool>& stopping) {
    const auto now = std::chrono::steady_clock::now();
    bool asked = false;  // a token request was made in this poll
    if (token.empty() ? now >= token_retry_at : now >= token_expires) {
      try_token(stopping);
      asked = true;
    }
    http_response r = get_action(stopping);
    // 401 with a token: it expired early (e.g. the service restarted): one new token and retry.
    // 401 without one: IMDSv1 is refused; ask for a token unless this poll just failed to.
    if (r.status == 401 && (!token.empty() || !asked)) {
      try_token(stopping);
      r = get_action(stopping);
    }
    const std::string where = endpoint.url() + path + std::string(action_key);
    if (r.status == 404) return false;
    if (r.status != 200) {
      std::string why = "status " + std::to_string(r.status);
      if (token.empty())
        why += " without a token (IMDSv1); the token request failed: " + token_failure;
      throw error(EPROTO, "http", where, why);
    }
    json_value doc = parse_json(r.body, where);
    const json_value* action = doc.is_object() ? doc.find("action") : nullptr;
    const json_value* time = doc.is_object() ? doc.find("time") : nullptr;
    if (!action || !action->is_string() || !time || !time->is_string())
      throw format_error(where, "expected {\"action\":...,\"time\":...}");
    const std::string& a = action->as_string();
    if (a != "terminate" && a != "stop" && a != "hibernate")
      throw format_error(where, "unknown action '" + a.substr(0, 40) + "'");
    return poll_result(true, parse_iso8601(time->as_string(), where));
  }
};

// `url`, else `fallback()` (the environment's URL, so a bad variable is read only when used).
inline http_endpoint endpoint_or_default(const std::string& url, std::string (*fallback)(),
                                         std::string& path) {
  http_endpoint ep = parse_http_url(url.empty() ? fallback() : url, &path);
  while (!path.empty() && path.back() == '/') path.pop_back();
  return ep;
}

inline log_fn log_or_default(log_fn log) { return log ? std::move(log) : log_fn(log_to_stderr); }

inline std::chrono::milliseconds interval_or(std::chrono::milliseconds i,
                                             std::chrono::milliseconds fallback) {
  return i.count() > 0 ? i : fallback;
}

template <class Io>
gce_metadata_poll<Io> make_gce_poll(const cloud_notice_options& o, std::string key,
                                    std::string expect, std::vector<std::string> known) {
  gce_metadata_poll<Io> p;
  p.endpoint = endpoint_or_default(o.url, gce_metadata_url, p.path);
  p.key = std::move(key);
  p.expect = std::move(expect);
  p.known = std::move(known);
  p.timeouts = {o.connect_timeout, o.read_timeout};
  return p;
}

}  // namespace detail

/// GCE host maintenance: `instance/maintenance-event` = TERMINATE_ON_HOST_MAINTENANCE (NONE and
/// MIGRATE_ON_HOST_MAINTENANCE are no notice). Polls every second by default.
template <class Io = posix_io>
class basic_gce_maintenance_notice : public polled_notice<detail::gce_metadata_poll<Io>> {
 public:
  explicit basic_gce_maintenance_notice(const cloud_notice_options& o = {})
      : polled_notice<detail::gce_metadata_poll<Io>>(
            detail::make_gce_poll<Io>(
                o, "maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE",
                {"NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE"}),
            detail::interval_or(o.interval, std::chrono::seconds(1)),
            detail::log_or_default(o.log)) {}
};
/// gce_maintenance_notice over the POSIX calls.
using gce_maintenance_notice = basic_gce_maintenance_notice<>;

/// GCE preemption (Spot/preemptible VMs): `instance/preempted` = TRUE. Polls every second.
template <class Io = posix_io>
class basic_gce_preempted_notice : public polled_notice<detail::gce_metadata_poll<Io>> {
 public:
  explicit basic_gce_preempted_notice(const cloud_notice_options& o = {})
      : polled_notice<detail::gce_metadata_poll<Io>>(
            detail::make_gce_poll<Io>(o, "preempted", "TRUE", {"FALSE"}),
            detail::interval_or(o.interval, std::chrono::seconds(1)),
            detail::log_or_default(o.log)) {}
};
/// gce_preempted_notice over the POSIX calls.
using gce_preempted_notice = basic_gce_preempted_notice<>;

/// AWS spot interruption: IMDSv2 token, then `spot/instance-action` (404: no notice; the
/// action's time becomes deadline()); IMDSv1 GETs while the token request fails. Polls every 5
/// seconds by default.
template <class Io = posix_io>
class basic_aws_spot_notice : public polled_notice<detail::aws_spot_poll<Io>> {
 public:
  explicit basic_aws_spot_notice(const cloud_notice_options& o = {})
      : polled_notice<detail::aws_spot_poll<Io>>(
            make(o), detail::interval_or(o.interval, std::chrono::seconds(5)),
            detail::log_or_default(o.log)) {}

 private:
  static detail::aws_spot_poll<Io> make(const cloud_notice_options& o) {
    detail::aws_spot_poll<Io> p;
    p.endpoint = detail::endpoint_or_default(o.url, aws_metadata_url, p.path);
    p.timeouts = {o.connect_timeout, o.read_timeout};
    return p;
  }
};
/// aws_spot_notice over the POSIX calls.
using aws_spot_notice = basic_aws_spot_notice<>;

HOLDFAST_NAMESPACE_END
