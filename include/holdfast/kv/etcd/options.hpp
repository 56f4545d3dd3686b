// holdfast/kv/etcd/options.hpp — how to reach etcd (etcd_options: endpoints, timeouts, lease and
// the keys it goes on, prefix, TLS, authentication, connection reuse) and what one client counts
// (etcd_stats).
//
// Guarantees:
//   - Plain values with working defaults: one endpoint at http://127.0.0.1:2379, 1 s to connect,
//     5 s per request, no lease, keys under "holdfast/", 4 idle connections kept.
//   - A lease goes only on the keys below `leased_prefix` (liveness keys), never on any other:
//     etcd deletes a leased key a TTL after its writer stops renewing, and a recorded decision
//     (the step agreement's claims and outcomes, the restore step) must outlive its writer, or
//     a peer paused past the TTL finds the outcome key empty and records a second outcome.
//   - No secret lives in the options: a password is named by a file or an environment
//     variable and read once when the client is made (kv/etcd/client.hpp), never put in a
//     message.
//   - etcd_stats counts requests sent (unary calls, authentication, keep-alives, watch opens and
//     probes), connections made, watch opens, probes and body bytes read; etcd_kv::stats() reads
//     them together from relaxed atomics shared by every handle on one client.
// Caveats:
//   - The options are checked when a client is made, not here: no endpoints, mixed http:// and
//     https://, TLS options with http:// endpoints, a user without exactly one password source,
//     a user with http:// endpoints not all loopback (unless allow_plaintext_auth), an invalid
//     prefix, or a lease_ttl and a leased_prefix without each other throw holdfast::error
//     (EINVAL) then.
//   - leased_prefix must not cover keys that record decisions: the handler's live under
//     "holdfast/<run id>/" in each namespace, so a leased_prefix of "holdfast" would lease them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../detail/http/transport.hpp"  // tls_options

HOLDFAST_NAMESPACE_BEGIN

/// How to reach etcd.
struct etcd_options {
  /// Client URLs, `http://host:port` or (with a TLS transport) `https://host:port`, all of one
  /// scheme; failover goes round them in order (see the header).
  std::vector<std::string> endpoints{"http://127.0.0.1:2379"};
  /// Time allowed to connect to one endpoint.
  std::chrono::milliseconds connect_timeout{1000};
  /// Time allowed for one request after connecting, and the longest a get's watch stays open
  /// before get ranges again; a quiet watch() is probed every max(1 s, request_timeout / 2).
  std::chrono::milliseconds request_timeout{5000};
  /// How long an endpoint that failed to connect, timed out, lost its connection or answered
  /// "unavailable" is skipped while others are not suspect; 0 never skips one.
  std::chrono::milliseconds suspect_for{10000};
  /// The longest watch message (one JSON line of the stream) accepted; a longer one is an
  /// EMSGSIZE error naming the endpoint.
  std::size_t max_message = std::size_t{64} << 20;
  /// Lease time-to-live; 0 means no lease (keys stay until erased). Needs leased_prefix. The
  /// lease is renewed every TTL / 3, each member tried for at most TTL / 6 (not
  /// request_timeout), and granted again when etcd lost it (kv/etcd/lease.hpp).
  std::chrono::seconds lease_ttl{0};
  /// The keys the lease goes on: those strictly below `leased_prefix + "/"` in a handle's
  /// namespace (liveness keys, such as "live" for "live/<task>"), as list() scopes a prefix;
  /// every other key is written without a lease. Empty (the default): no lease; needs lease_ttl.
  std::string leased_prefix;
  /// The first segment of every key holdfast writes in etcd.
  std::string prefix = "holdfast";
  /// For https:// endpoints: CA file, client certificate and key, server name (read by the
  /// TLS transport; setting any of them with http:// endpoints is refused).
  tls_options tls;
  /// The etcd user to authenticate as; empty: no authentication.
  std::string user;
  /// A file holding the user's password (one line; a final newline is dropped)...
  std::string password_file;
  /// ...or the name of an environment variable holding it. Exactly one of the two with a user.
  std::string password_env;
  /// Send the password over http:// endpoints that are not all loopback (127.0.0.0/8, ::1,
  /// localhost); without it such options are refused (EINVAL) when the client is made.
  bool allow_plaintext_auth = false;
  /// Idle connections kept for reuse by one client (all endpoints together); 0: one
  /// connection per request.
  std::size_t idle_connections = 4;
};

/// Counters of one etcd client, shared by every handle on it (copies, with_namespace views) and
/// by its watches; relaxed atomics, read together by etcd_kv::stats().
struct etcd_stats {
  /// HTTP requests sent: every unary call (a resend on a stale keep-alive connection,
  /// authentication and lease keep-alives included), every watch opened, every probe.
  std::uint64_t requests = 0;
  /// Connections made (TCP, with a TLS handshake for https://): pooled ones and watch streams.
  std::uint64_t connections = 0;
  /// Watch streams opened: a get's windows, a watch object's first open and its resumes.
  std::uint64_t watch_opens = 0;
  /// Health probes sent by watch objects (counted in `requests` too).
  std::uint64_t probes = 0;
  /// Response body bytes received: unary answers, watch streams (the HTTP heads aside).
  std::uint64_t bytes_read = 0;
};

HOLDFAST_NAMESPACE_END
