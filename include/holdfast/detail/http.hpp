// holdfast/detail/http.hpp — a small HTTP/1.1 client over the Io policy, for cloud metadata
// servers (termination notices) and etcd's JSON gateway (kv/etcd.hpp), and the transport seam a
// TLS layer plugs into. Include this header for all of it; each part lives in detail/http/:
//
//   detail/http/message.hpp    http_request, http_response, http_headers, http_timeouts,
//                              http_iequal, http_connection_closed, http_clock
//   detail/http/endpoint.hpp   http_endpoint, parse_url, parse_http_url, parse_endpoint_url
//   detail/http/decoder.hpp    http_parse_head, http_body_for, http_body_decoder (framing)
//   detail/http/transport.hpp  the Transport contract (check_transport, is_transport_v,
//                              transport, transport_speaks_tls_v), plain_transport<Io>,
//                              connect_tcp, wait_socket, tls_options, transport_endpoint
//   detail/http/exchange.hpp   http_serialize, http_exchange, http_call, http_stream (one
//                              connection per request) and their _over/_on forms
//   detail/http/stream.hpp     http_open_stream: a streamed response kept open, read without
//                              blocking (a long-lived watch)
//   detail/http/pool.hpp       http_pool: idle connections reused (HTTP/1.1 keep-alive),
//                              requests and connections counted
//
// http_call / http_stream make one request per connection (`Connection: close`); http_pool
// keeps a few idle connections per client and reuses them, so a TLS handshake is paid once per
// connection, not once per request. IPv4 and IPv6. Every connection is made by a Transport:
// plain_transport<Io> is TCP over the Io policy and the default everywhere; a TLS transport
// (examples/tls/openssl_transport.hpp) wraps the same socket calls, so the library itself
// depends on nothing but the standard library and POSIX.
//
// Guarantees and caveats: see each part. In short: every socket call goes through `Io::`
// (EINTR retried, no SIGPIPE); connecting is bounded by `http_timeouts::connect` and a request
// by `http_timeouts::read`; a cancel flag ends any wait within ~20 ms (ECANCELED); failures
// throw holdfast::error naming the operation and the URL (EPROTO for a malformed or truncated
// response, http_connection_closed for a connection lost mid-response); any status is a value
// for http_call; the pool reuses a connection only after a cleanly ended response and never in
// a forked child. No redirects, proxies or HTTP/2; responses above 64 MiB are refused; name
// lookup cannot be timed out; https:// needs a TLS transport.
#pragma once

#include "http/decoder.hpp"
#include "http/endpoint.hpp"
#include "http/exchange.hpp"
#include "http/message.hpp"
#include "http/pool.hpp"
#include "http/stream.hpp"
#include "http/transport.hpp"
