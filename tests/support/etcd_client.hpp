// tests/support/etcd_client.hpp — the options of an etcd_kv client in the etcd tests: its
// endpoints and the timeouts the test bounds its checks with.
//
// Guarantees:
//   - etcd_client_options(endpoints, request, connect) sets exactly the endpoints and the two
//     timeouts; every other option keeps etcd_options' default, so a test that changes one more
//     (suspect_for, tls, a user) says so where it does.
// Caveats:
//   - The connect timeout defaults to 500 ms: a refused or silent endpoint costs a test about
//     that much, and a loopback etcd answers well within it.
#pragma once

#include <chrono>
#include <holdfast/kv/etcd.hpp>
#include <string>
#include <utility>
#include <vector>

namespace holdfast_test {

/// etcd_options for `endpoints` with these timeouts, the rest etcd's defaults.
inline holdfast::etcd_options etcd_client_options(
    std::vector<std::string> endpoints, std::chrono::milliseconds request,
    std::chrono::milliseconds connect = std::chrono::milliseconds(500)) {
  holdfast::etcd_options o;
  o.endpoints = std::move(endpoints);
  o.connect_timeout = connect;
  o.request_timeout = request;
  return o;
}

}  // namespace holdfast_test
