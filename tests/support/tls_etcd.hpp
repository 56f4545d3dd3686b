// tests/support/tls_etcd.hpp — what a test or benchmark of etcd over TLS sets up before its first
// request: the binary's certificates, a member that serves one of them, a client that trusts
// the CA.
//
// Guarantees:
//   - shared_certs() makes the certificates once per binary (support/tls_certs.hpp: a CA, a
//     server certificate for 127.0.0.1 and the bad ones) and removes them at exit.
//   - tls_member(cert) is an etcd_tls_spec serving `cert` with the certificates' server key, and
//     nothing else: no client-certificate authentication, etcd's token TTL unless one is given.
//   - trusting_ca() is a client's tls_options trusting shared_certs().ca and nothing more (no
//     client certificate).
// Caveats:
//   - Without the openssl command shared_certs() throws (the test FAILS, never skips); a
//     benchmark that must run without it catches that itself.
//   - This header needs no TLS library: the transport a client uses is the caller's choice.
#pragma once

#include <holdfast/kv/etcd.hpp>  // tls_options
#include <string>

#include "etcd_server.hpp"
#include "tls_certs.hpp"

namespace holdfast_test {

/// The binary's certificates, made on first use.
inline tls_certs& shared_certs() {
  static tls_certs certs;
  return certs;
}

/// A member's TLS: `cert` (one of shared_certs()'s) with the shared server key; `token_ttl`
/// seconds of auth token life (0: etcd's default).
inline etcd_tls_spec tls_member(const std::string& cert, int token_ttl = 0) {
  etcd_tls_spec t;
  t.cert_file = cert;
  t.key_file = shared_certs().server_key;
  t.auth_token_ttl = token_ttl;
  return t;
}

/// A client's TLS: verify the server against shared_certs()'s CA.
inline holdfast::tls_options trusting_ca() {
  holdfast::tls_options t;
  t.ca_file = shared_certs().ca;
  return t;
}

}  // namespace holdfast_test
