// holdfast/detail/http.hpp — a small HTTP/1.1 client over the Io policy, for cloud metadata
// servers (termination notices) and etcd's JSON gateway (kv/etcd.hpp), and the transport seam a
// TLS layer plugs into.
//
// http_call / http_stream make one request per connection (`Connection: close`); http_pool
// keeps a few idle connections per client and reuses them (HTTP/1.1 keep-alive), so a TLS
// handshake is paid once per connection, not once per request, and counts the requests it sends
// and the connections it makes. http_open_stream keeps a streamed response open and reads it
// piece by piece without blocking (a long-lived watch polled by its owner). IPv4 and IPv6.
//
// The transport seam: every connection is made by a Transport (see check_transport below):
// connect with a timeout, read, write, what to poll, whether bytes are pending, close.
// plain_transport<Io> is TCP over the Io policy and the default everywhere; a TLS transport
// (examples/tls/openssl_transport.hpp) wraps the same socket calls, so the library itself
// depends on nothing but the standard library and POSIX.
//
// Guarantees:
//   - Every socket call goes through `Io::` (socket, connect, getsockopt, send, recv, poll,
//     getaddrinfo), so tests fail any of them with testing::fault_io. EINTR is retried.
//   - Connecting never blocks past `http_timeouts::connect` (non-blocking connect + poll; a TLS
//     transport's handshake shares the budget), and a request never waits past
//     `http_timeouts::read` after connecting: that is the budget for sending the request and
//     receiving the whole response (a server dribbling one byte a second cannot hold the caller).
//   - Bodies framed by Content-Length, by chunked transfer coding (extensions and trailers are
//     accepted and ignored) or by the connection closing. A body cut short, a malformed status
//     line, header or chunk size throws holdfast::error with errno EPROTO.
//   - Failures throw holdfast::error naming the operation ("resolve", "connect", "send", "recv",
//     "http") and the URL: ECONNREFUSED, ETIMEDOUT, EHOSTUNREACH, EPROTO, or the errno of the call.
//     A server that closes the connection before its response is complete throws
//     http_connection_closed (EPROTO too), so a caller can tell a lost connection from garbage.
//   - No SIGPIPE: requests are sent with MSG_NOSIGNAL.
//   - An optional cancel flag (std::atomic<bool>) ends any wait within ~20 ms (ECANCELED), so a
//     polling thread never holds up shutdown.
//   - Any status is a value for http_call (a 404 is a response, not an error).
//   - http_pool reuses a connection only after a response that ended cleanly (framed by length
//     or chunks, no `Connection: close`, HTTP/1.1, nothing left over), checks an idle one before
//     reusing it (closed or readable: dropped), and when a reused connection turns out closed
//     before any byte of the response arrived, sends the request once more on a fresh one. A
//     forked child never uses a connection it inherited (it would share it with its parent).
// Caveats:
//   - Name lookup (getaddrinfo) cannot be timed out; use numeric addresses where a lookup may
//     hang (the cloud notices default to 169.254.169.254 for that reason).
//   - No redirects, no proxies, no HTTP/2. Responses above 64 MiB are refused (EPROTO).
//   - https:// endpoints need a TLS transport; plain_transport refuses them (EPROTONOSUPPORT).
//   - http_stream's body has no read timeout of its own, only the caller's deadline (a watch may
//     be silent for a long time); the status line and headers must arrive within `read`. An
//     http_open_stream has no timeout at all after its head: its owner decides when silence is
//     suspicious.
#pragma once

#include <netdb.h>       // getaddrinfo, gai_strerror
#include <netinet/in.h>  // sockaddr_in for the address family checks
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>  // exception_ptr: a stale pooled connection is retried once
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../io.hpp"
#include "ascii.hpp"  // ascii_iequal, hex_digit: header names, chunk sizes

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// How long connecting, and then the whole exchange after connecting, may take.
struct http_timeouts {
  std::chrono::milliseconds connect{1000};
  std::chrono::milliseconds read{2000};
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

/// Where to connect: a host name or address (IPv6 without brackets), a port, and whether the
/// connection speaks TLS (an https:// URL).
struct http_endpoint {
  std::string host;
  std::uint16_t port = 80;
  bool tls = false;
  /// "http://host:port" (or https://), with brackets around an IPv6 address; used in messages.
  std::string url() const {
    bool v6 = host.find(':') != std::string::npos;
    return (tls ? "https://" : "http://") + (v6 ? "[" + host + "]" : host) + ":" +
           std::to_string(port);
  }
  /// Same host, port and scheme.
  bool same(const http_endpoint& o) const noexcept {
    return port == o.port && tls == o.tls && host == o.host;
  }
};

/// Parses `http://host[:port][/path]`, and with `allow_https` also `https://...` (port 80 or
/// 443 by default; `[::1]` for IPv6). When `path` is given it receives the path ("" when
/// absent). Throws holdfast::format_error on anything else.
inline http_endpoint parse_url(std::string_view url, std::string* path, bool allow_https) {
  const std::string src(url);
  const bool tls = allow_https && url.size() >= 8 && http_iequal(url.substr(0, 8), "https://");
  const std::string_view scheme = tls ? "https://" : "http://";
  if (url.size() < scheme.size() || !http_iequal(url.substr(0, scheme.size()), scheme))
    throw format_error(
        src, allow_https ? "offset 0: expected http:// or https://" : "offset 0: expected http://");
  const std::string at = "offset " + std::to_string(scheme.size()) + ": ";
  std::string_view rest = url.substr(scheme.size());
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (path)
    *path = slash == std::string_view::npos ? std::string() : std::string(rest.substr(slash));
  http_endpoint ep;
  ep.tls = tls;
  ep.port = tls ? 443 : 80;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) throw format_error(src, at + "unclosed '['");
    ep.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw format_error(src, "expected ':' after ']'");
      port = after.substr(1);
      if (port.empty()) throw format_error(src, "empty port");
    }
  } else {
    std::size_t colon = authority.find(':');
    ep.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) throw format_error(src, "empty port");
    }
  }
  if (ep.host.empty()) throw format_error(src, at + "empty host");
  if (!port.empty()) {
    unsigned long value = 0;
    for (char c : port) {
      if (c < '0' || c > '9') throw format_error(src, "port is not a number");
      value = value * 10 + static_cast<unsigned long>(c - '0');
      if (value > 65535) throw format_error(src, "port above 65535");
    }
    ep.port = static_cast<std::uint16_t>(value);
  }
  return ep;
}

/// Parses `http://host[:port][/path]` (port 80 by default; `[::1]` for IPv6); see parse_url.
inline http_endpoint parse_http_url(std::string_view url, std::string* path = nullptr) {
  return parse_url(url, path, false);
}

/// Parses `http://...` or `https://...` (a server a Transport may reach over TLS); see parse_url.
inline http_endpoint parse_endpoint_url(std::string_view url, std::string* path = nullptr) {
  return parse_url(url, path, true);
}

/// The server closed the connection before its response was complete: nothing, part of the
/// head or part of the body arrived (errno EPROTO, as for any malformed response).
class http_connection_closed : public error {
 public:
  using error::error;
};

// ---- internals -------------------------------------------------------------------------------

using http_clock = std::chrono::steady_clock;

/// The largest response http_call accepts, and the longest head (status line + headers).
inline constexpr std::size_t http_max_body = std::size_t{64} << 20;
inline constexpr std::size_t http_max_head = std::size_t{64} << 10;
/// With a cancel flag, waits are cut into slices this long so cancelling takes effect promptly.
inline constexpr int http_cancel_slice_ms = 20;

/// Milliseconds left until `deadline`, rounded up, clamped to [0, INT_MAX] for poll.
inline int http_poll_ms(http_clock::time_point deadline) noexcept {
  auto left = deadline - http_clock::now();
  if (left <= http_clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

/// Incremental decoder of a response body (Content-Length, chunked, or until close).
/// feed() passes decoded bytes to `sink(std::string_view) -> bool` (false: stop).
class http_body_decoder {
 public:
  enum class mode { none, length, chunked, until_close };
  enum class result { more, done, stopped };

  http_body_decoder() = default;
  http_body_decoder(mode m, std::uint64_t length, std::string where)
      : mode_(m), left_(length), where_(std::move(where)) {
    if (m == mode::none || (m == mode::length && length == 0)) done_ = true;
  }

  bool done() const noexcept { return done_; }
  /// True when the end of the connection ends the body properly.
  bool complete_at_eof() const noexcept { return done_ || mode_ == mode::until_close; }

  /// Decodes `in`; when `left` is given it receives how many bytes of `in` follow the end of
  /// the body (a connection with such bytes cannot be reused).
  template <class Sink>
  result feed(std::string_view in, Sink& sink, std::size_t* left = nullptr) {
    struct report {
      std::string_view& in;
      std::size_t* left;
      ~report() {
        if (left) *left = in.size();
      }
    } r{in, left};
    while (!done_ && !in.empty()) {
      if (mode_ == mode::length || mode_ == mode::until_close) {
        std::size_t take = in.size();
        if (mode_ == mode::length && left_ < take) take = static_cast<std::size_t>(left_);
        if (mode_ == mode::length) left_ -= take;
        if (mode_ == mode::length && left_ == 0) done_ = true;
        bool go = sink(in.substr(0, take));
        in.remove_prefix(take);
        if (!go) return done_ ? result::done : result::stopped;
        continue;
      }
      if (!feed_chunked(in, sink)) return done_ ? result::done : result::stopped;
    }
    return done_ ? result::done : result::more;
  }

 private:
  enum class chunk_state { size, data, data_end, trailer };

  [[noreturn]] void bad(const std::string& why) const { throw error(EPROTO, "http", where_, why); }

  // Collects one line (LF-terminated, CR stripped); returns true when complete.
  bool take_line(std::string_view& in) {
    std::size_t nl = in.find('\n');
    std::size_t take = nl == std::string_view::npos ? in.size() : nl + 1;
    line_.append(in.data(), take);
    in.remove_prefix(take);
    if (line_.size() > 4096) bad("chunk header line longer than 4096 bytes");
    if (nl == std::string_view::npos) return false;
    line_.pop_back();
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    return true;
  }

  void parse_size() {
    std::uint64_t size = 0;
    std::size_t i = 0;
    for (; i < line_.size(); ++i) {
      char c = line_[i];
      int digit = hex_digit(c);
      if (digit < 0) break;
      if (size > (UINT64_MAX >> 4)) bad("chunk size overflows");
      size = size * 16 + static_cast<std::uint64_t>(digit);
    }
    if (i == 0) bad("bad chunk size line '" + line_.substr(0, 40) + "'");
    while (i < line_.size() && (line_[i] == ' ' || line_[i] == '\t')) ++i;
    if (i < line_.size() && line_[i] != ';')
      bad("bad chunk size line '" + line_.substr(0, 40) + "'");
    left_ = size;
    state_ = size == 0 ? chunk_state::trailer : chunk_state::data;
  }

  // Returns false when the sink asked to stop.
  template <class Sink>
  bool feed_chunked(std::string_view& in, Sink& sink) {
    switch (state_) {
      case chunk_state::size:
        if (take_line(in)) {
          parse_size();
          line_.clear();
        }
        return true;
      case chunk_state::data: {
        std::size_t take = in.size();
        if (left_ < take) take = static_cast<std::size_t>(left_);
        left_ -= take;
        if (left_ == 0) state_ = chunk_state::data_end;
        bool go = sink(in.substr(0, take));
        in.remove_prefix(take);
        return go;
      }
      case chunk_state::data_end:
        if (take_line(in)) {
          if (!line_.empty()) bad("chunk data not followed by CRLF");
          state_ = chunk_state::size;
        }
        return true;
      case chunk_state::trailer:
        if (take_line(in)) {
          if (line_.empty()) done_ = true;
          line_.clear();
        }
        return true;
    }
    return true;
  }

  mode mode_ = mode::none;
  std::uint64_t left_ = 0;
  std::string where_;
  bool done_ = false;
  chunk_state state_ = chunk_state::size;
  std::string line_;
};

/// Parses a response head (status line and header fields, without the blank line).
inline void http_parse_head(std::string_view head, http_response& out, const std::string& where) {
  auto next_line = [&head]() {
    std::size_t nl = head.find('\n');
    std::string_view line = head.substr(0, nl);
    head.remove_prefix(nl == std::string_view::npos ? head.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  };
  std::string_view status = next_line();
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (status.size() < 12 || status.substr(0, 7) != "HTTP/1." || !digit(status[7]) ||
      status[8] != ' ' || !digit(status[9]) || !digit(status[10]) || !digit(status[11]) ||
      (status.size() > 12 && status[12] != ' '))
    throw error(EPROTO, "http", where,
                "bad status line '" + std::string(status.substr(0, 40)) + "'");
  out.status = (status[9] - '0') * 100 + (status[10] - '0') * 10 + (status[11] - '0');
  out.minor_version = status[7] - '0';
  out.headers.clear();
  while (!head.empty()) {
    std::string_view line = next_line();
    if (line.empty()) continue;
    std::size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos || line.front() == ' ' ||
        line.front() == '\t')
      throw error(EPROTO, "http", where,
                  "bad header line '" + std::string(line.substr(0, 40)) + "'");
    std::string_view name = line.substr(0, colon);
    if (name.find_first_of(" \t") != std::string_view::npos)
      throw error(EPROTO, "http", where, "space in header name '" + std::string(name) + "'");
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    out.headers.emplace_back(std::string(name), std::string(value));
  }
}

/// Chooses the body framing for a parsed head (RFC 9112 §6.3).
inline http_body_decoder http_body_for(const http_response& head, const std::string& method,
                                       const std::string& where) {
  using mode = http_body_decoder::mode;
  if (method == "HEAD" || head.status == 204 || head.status == 304 || head.status / 100 == 1)
    return http_body_decoder(mode::none, 0, where);
  if (const std::string* te = head.header("Transfer-Encoding")) {
    std::string_view v(*te);
    std::size_t comma = v.rfind(',');
    std::string_view last = comma == std::string_view::npos ? v : v.substr(comma + 1);
    while (!last.empty() && last.front() == ' ') last.remove_prefix(1);
    if (!http_iequal(last, "chunked"))
      throw error(EPROTO, "http", where, "unsupported Transfer-Encoding '" + *te + "'");
    return http_body_decoder(mode::chunked, 0, where);
  }
  if (const std::string* cl = head.header("Content-Length")) {
    std::uint64_t n = 0;
    if (cl->empty()) throw error(EPROTO, "http", where, "empty Content-Length");
    for (char c : *cl) {
      if (c < '0' || c > '9' || n > (UINT64_MAX - 9) / 10)
        throw error(EPROTO, "http", where, "bad Content-Length '" + *cl + "'");
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return http_body_decoder(mode::length, n, where);
  }
  return http_body_decoder(mode::until_close, 0, where);
}

}  // namespace detail

// ---- the transport seam ----------------------------------------------------------------------

/// Where a transport connects: host, port, and whether it speaks TLS (https://).
using transport_endpoint = detail::http_endpoint;

/// What a TLS transport needs to verify the server and present a client certificate. The
/// library only carries these (etcd_options::tls); a TLS transport reads them.
struct tls_options {
  /// PEM file of the certificate authorities that sign the server's certificate; empty: the
  /// system's default trust store.
  std::string ca_file;
  /// PEM client certificate (chain) to present, and its private key; both or neither.
  std::string cert_file;
  std::string key_file;
  /// The name to verify the server's certificate against (and to send as SNI) instead of the
  /// endpoint's host; an IP address is checked against the certificate's IP SANs.
  std::string server_name;
  /// Accept any server certificate, unverified. Only for tests on throw-away servers: anyone on
  /// the path can then read and change the traffic.
  bool insecure_skip_verify = false;
  /// True when nothing is set.
  bool empty() const noexcept {
    return ca_file.empty() && cert_file.empty() && key_file.empty() && server_name.empty() &&
           !insecure_skip_verify;
  }
};

/// Polls `fd` (through Io::poll) for `events` until `deadline`: true when ready (or in error:
/// the next call reports it), false on timeout. With `cancel`, waits in ~20 ms slices and throws
/// holdfast::error(ECANCELED, "http", where) once it is set. EINTR is retried. Transports use it
/// for their own waits (a TLS handshake), so every wait honours the same deadline and flag.
template <class Io>
bool wait_socket(int fd, short events, std::chrono::steady_clock::time_point deadline,
                 const std::atomic<bool>* cancel, const std::string& where) {
  for (;;) {
    if (cancel && cancel->load(std::memory_order_relaxed))
      throw error(ECANCELED, "http", where, "cancelled");
    pollfd p{fd, events, 0};
    int ms = detail::http_poll_ms(deadline);
    if (cancel && ms > detail::http_cancel_slice_ms) ms = detail::http_cancel_slice_ms;
    int n = Io::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) throw error(errno, "poll", where);
    if (n == 0 && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

namespace detail {

// Starts a non-blocking connect to one address: the socket, and 0 when connected, else the
// errno of this attempt (the socket is then closed and -1).
template <class Io>
int tcp_try_connect(const addrinfo& ai, http_clock::time_point deadline,
                    const std::atomic<bool>* cancel, const std::string& where, int& fd) {
  fd = Io::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) throw error(errno, "socket", where);
  struct closer {
    int& fd;
    bool keep = false;
    ~closer() {
      if (!keep && fd >= 0) Io::close(std::exchange(fd, -1));
    }
  } guard{fd};
  // EINTR: the connect may go on asynchronously or never have started; connecting again
  // tells which (EALREADY: in progress, EISCONN: done, else it starts now).
  int rc;
  while ((rc = Io::connect(fd, ai.ai_addr, ai.ai_addrlen)) != 0 && errno == EINTR) {
  }
  if (rc == 0 || errno == EISCONN) return (guard.keep = true, 0);
  if (errno != EINPROGRESS && errno != EALREADY) return errno;
  if (!wait_socket<Io>(fd, POLLOUT, deadline, cancel, where)) return ETIMEDOUT;
  int err = 0;
  socklen_t len = sizeof err;
  if (Io::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  guard.keep = err == 0;
  return err;
}

}  // namespace detail

/// Resolves `ep` and connects a non-blocking TCP socket (SOCK_CLOEXEC) to it within `timeout`,
/// trying each address in turn; returns the descriptor (the caller closes it with Io::close).
/// Throws holdfast::error("resolve" | "socket" | "connect", where): ECONNREFUSED, ETIMEDOUT
/// ("no connection within N ms"), EHOSTUNREACH, ... The TCP part of every transport.
template <class Io>
int connect_tcp(const transport_endpoint& ep, std::chrono::milliseconds timeout,
                const std::string& where, const std::atomic<bool>* cancel) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(ep.port);
  int rc = Io::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &list);
  if (rc != 0) {
    if (rc == EAI_SYSTEM) throw error(errno != 0 ? errno : EIO, "resolve", where);
    throw error(EHOSTUNREACH, "resolve", where, gai_strerror(rc));
  }
  struct guard {
    addrinfo* p;
    ~guard() { Io::freeaddrinfo(p); }
  } g{list};
  int last_errno = EHOSTUNREACH;
  for (addrinfo* ai = list; ai; ai = ai->ai_next) {
    int fd = -1;
    last_errno = detail::tcp_try_connect<Io>(*ai, deadline, cancel, where, fd);
    if (last_errno == 0) return fd;
    if (last_errno == ETIMEDOUT) break;
  }
  if (last_errno == ETIMEDOUT)
    throw error(ETIMEDOUT, "connect", where,
                "no connection within " + std::to_string(timeout.count()) + " ms");
  throw error(last_errno, "connect", where);
}

/// The default Transport: plain TCP over the Io policy (http:// only). Stateless; a connection
/// is one socket, read and write are recv and send.
template <class Io = posix_io>
class plain_transport {
 public:
  /// plain_transport speaks no TLS (etcd_kv refuses https:// endpoints with it).
  static constexpr bool speaks_tls = false;

  plain_transport() noexcept = default;
  /// TLS settings are not its business; accepted so every transport is built the same way.
  explicit plain_transport(const tls_options&) noexcept {}

  /// One TCP connection; closes on destruction.
  class connection {
   public:
    connection() noexcept = default;
    /// Takes ownership of a connected socket.
    explicit connection(int fd) noexcept : fd_(fd) {}
    connection(connection&& o) noexcept : fd_(std::exchange(o.fd_, -1)), want_(o.want_) {}
    connection& operator=(connection&& o) noexcept {
      if (this != &o) {
        close();
        fd_ = std::exchange(o.fd_, -1);
        want_ = o.want_;
      }
      return *this;
    }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;
    ~connection() { close(); }

    /// recv: bytes, 0 at end of stream, -1 with errno (EAGAIN: poll fd() for wants()).
    long read(char* buf, std::size_t n) noexcept {
      want_ = POLLIN;
      return static_cast<long>(Io::recv(fd_, buf, n, 0));
    }
    /// send (MSG_NOSIGNAL): bytes taken, -1 with errno (EAGAIN: poll fd() for wants()).
    long write(const char* buf, std::size_t n) noexcept {
      want_ = POLLOUT;
      return static_cast<long>(Io::send(fd_, buf, n, MSG_NOSIGNAL));
    }
    /// What the last call that would block waits for.
    short wants() const noexcept { return want_; }
    /// The socket.
    int fd() const noexcept { return fd_; }
    /// Never: every byte read is the socket's.
    bool pending() const noexcept { return false; }
    /// Nothing beyond errno.
    std::string why() const { return {}; }
    /// Closes the socket (idempotent).
    void close() noexcept {
      if (fd_ >= 0) Io::close(std::exchange(fd_, -1));
    }

   private:
    int fd_ = -1;
    short want_ = POLLIN;
  };

  /// Connects to `ep` within `timeout` (see connect_tcp); `where` names it in errors. An
  /// https:// endpoint throws holdfast::error(EPROTONOSUPPORT, "connect", where).
  connection connect(const transport_endpoint& ep, std::chrono::milliseconds timeout,
                     const std::string& where, const std::atomic<bool>* cancel) const {
    if (ep.tls)
      throw error(EPROTONOSUPPORT, "connect", where,
                  "https:// needs a TLS transport; plain_transport speaks http:// only");
    return connection(connect_tcp<Io>(ep, timeout, where, cancel));
  }
};

namespace detail {
template <class T>
using tr_connection = typename T::connection;
template <class T>
using tr_construct = decltype(T(std::declval<const tls_options&>()));
template <class T>
using tr_connect =
    decltype(std::declval<typename T::connection&>() = std::declval<const T&>().connect(
                 std::declval<const transport_endpoint&>(), std::chrono::milliseconds{},
                 std::declval<const std::string&>(),
                 static_cast<const std::atomic<bool>*>(nullptr)));
template <class T>
using tr_read = decltype(long{
    std::declval<typename T::connection&>().read(static_cast<char*>(nullptr), std::size_t{})});
template <class T>
using tr_write = decltype(long{
    std::declval<typename T::connection&>().write(static_cast<const char*>(nullptr),
                                                  std::size_t{})});
template <class T>
using tr_wants = decltype(short{std::declval<const typename T::connection&>().wants()});
template <class T>
using tr_fd = decltype(int{std::declval<const typename T::connection&>().fd()});
template <class T>
using tr_pending = decltype(bool{std::declval<const typename T::connection&>().pending()});
template <class T>
using tr_why = decltype(std::string{std::declval<const typename T::connection&>().why()});
template <class T>
using tr_close = decltype(std::declval<typename T::connection&>().close());
template <class T, class = void>
struct speaks_tls : std::false_type {};
template <class T>
struct speaks_tls<T, std::enable_if_t<T::speaks_tls>> : std::true_type {};
}  // namespace detail

/// True when T is a Transport: see check_transport for the members.
template <class T>
inline constexpr bool is_transport_v = detail::detect<detail::tr_connection, T>::value&&
    detail::detect<detail::tr_construct, T>::value&& detail::detect<detail::tr_connect, T>::value&&
        detail::detect<detail::tr_read, T>::value&& detail::detect<detail::tr_write, T>::value&&
            detail::detect<detail::tr_wants, T>::value&& detail::detect<detail::tr_fd, T>::value&&
                detail::detect<detail::tr_pending, T>::value&& detail::detect<
                    detail::tr_why, T>::value&& detail::detect<detail::tr_close, T>::value&&
                    std::is_move_constructible_v<T>&& std::is_copy_constructible_v<T>;

/// True when T declares `static constexpr bool speaks_tls = true` (it can serve https://).
template <class T>
inline constexpr bool transport_speaks_tls_v = detail::speaks_tls<T>::value;

/// Checks a Transport at compile time, naming the first missing member. The contract (all
/// non-blocking; waiting is the caller's, through wait_socket):
///   T(const tls_options&)                 built once per client, copyable (copies share state)
///   typename T::connection                one connection, movable, closes on destruction
///   connection connect(const transport_endpoint&, std::chrono::milliseconds timeout,
///                      const std::string& where, const std::atomic<bool>* cancel) const
///                                         connected (and for https, handshaken) within timeout,
///                                         or throws holdfast::error naming `where` and why
///   long read(char*, size_t)              bytes, 0 at end of stream, -1 with errno (EAGAIN:
///                                         poll fd() for wants())
///   long write(const char*, size_t)       bytes taken, -1 with errno (EAGAIN as for read)
///   short wants() const                   POLLIN or POLLOUT: what the last EAGAIN waits for
///   int fd() const                        the socket to poll
///   bool pending() const                  read() has bytes the socket will not show (a TLS
///                                         layer's decrypted bytes); asked before polling
///   std::string why() const               the last failure beyond its errno ("" if none)
///   void close() noexcept                 idempotent
template <class T>
constexpr bool check_transport() {
  using namespace detail;
  static_assert(detect<tr_connection, T>::value,
                "holdfast: a Transport needs a nested type `connection` (see plain_transport)");
  static_assert(detect<tr_construct, T>::value,
                "holdfast: a Transport needs a constructor T(const holdfast::tls_options&)");
  static_assert(std::is_copy_constructible_v<T>,
                "holdfast: a Transport must be copyable (copies share its state)");
  static_assert(detect<tr_connect, T>::value,
                "holdfast: a Transport needs connection connect(const transport_endpoint&, "
                "std::chrono::milliseconds, const std::string&, const std::atomic<bool>*) const");
  static_assert(detect<tr_read, T>::value,
                "holdfast: Transport::connection needs long read(char*, std::size_t)");
  static_assert(detect<tr_write, T>::value,
                "holdfast: Transport::connection needs long write(const char*, std::size_t)");
  static_assert(detect<tr_wants, T>::value,
                "holdfast: Transport::connection needs short wants() const (POLLIN or POLLOUT)");
  static_assert(detect<tr_fd, T>::value,
                "holdfast: Transport::connection needs int fd() const (the socket to poll)");
  static_assert(detect<tr_pending, T>::value,
                "holdfast: Transport::connection needs bool pending() const (bytes buffered)");
  static_assert(detect<tr_why, T>::value,
                "holdfast: Transport::connection needs std::string why() const");
  static_assert(detect<tr_close, T>::value,
                "holdfast: Transport::connection needs void close() noexcept");
  return true;
}

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
/// C++20 spelling of is_transport_v.
template <class T>
concept transport = is_transport_v<T>;
#endif

namespace detail {

/// Sends and receives on one connection with deadlines on every wait; asks the connection for
/// pending bytes before polling its socket.
template <class Io, class Conn>
class http_channel {
 public:
  http_channel(Conn& conn, const std::string& where, const std::atomic<bool>* cancel) noexcept
      : conn_(conn), where_(where), cancel_(cancel) {}

  /// Sends all of `data` before `deadline` (ETIMEDOUT after it).
  void send_all(std::string_view data, http_clock::time_point deadline) {
    while (!data.empty()) {
      long n = conn_.write(data.data(), data.size());
      if (n > 0) {
        data.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      const int e = n < 0 ? errno : EIO;
      if (e == EINTR) continue;
      if (e == EAGAIN || e == EWOULDBLOCK) {
        if (!wait(deadline)) throw error(ETIMEDOUT, "send", where_, "request not sent in time");
        continue;
      }
      throw error(e, "send", where_, conn_.why());
    }
  }

  /// Receives some bytes before `deadline`: the count, 0 at end of stream, -1 on timeout.
  long recv_some(char* buf, std::size_t n, http_clock::time_point deadline) {
    for (;;) {
      long r = conn_.read(buf, n);
      if (r >= 0) {
        received_ += static_cast<std::size_t>(r);
        return r;
      }
      const int e = errno;
      if (e == EINTR) continue;
      if (e != EAGAIN && e != EWOULDBLOCK) throw error(e, "recv", where_, conn_.why());
      if (!wait(deadline)) return -1;
    }
  }

  /// Response bytes received so far.
  std::size_t received() const noexcept { return received_; }

 private:
  bool wait(http_clock::time_point deadline) {
    const short events = conn_.wants();
    if ((events & POLLIN) && conn_.pending()) return true;
    return wait_socket<Io>(conn_.fd(), events, deadline, cancel_, where_);
  }

  Conn& conn_;
  const std::string& where_;
  const std::atomic<bool>* cancel_;
  std::size_t received_ = 0;
};

/// Serializes the request line and headers (adds Host, Content-Length, and Connection: close
/// unless `keep_alive`).
inline std::string http_serialize(const http_endpoint& ep, const http_request& req,
                                  bool keep_alive = false) {
  std::string out = (req.method.empty() ? std::string("GET") : req.method) + " " +
                    (req.target.empty() ? std::string("/") : req.target) + " HTTP/1.1\r\n";
  bool has_host = false, has_length = false;
  for (const auto& h : req.headers) {
    has_host = has_host || http_iequal(h.first, "Host");
    has_length = has_length || http_iequal(h.first, "Content-Length");
  }
  if (!has_host) {
    bool v6 = ep.host.find(':') != std::string::npos;
    out += "Host: " + (v6 ? "[" + ep.host + "]" : ep.host);
    if (ep.port != (ep.tls ? 443 : 80)) out += ":" + std::to_string(ep.port);
    out += "\r\n";
  }
  for (const auto& h : req.headers) {
    if (http_iequal(h.first, "Connection")) continue;
    out += h.first + ": " + h.second + "\r\n";
  }
  if (!keep_alive) out += "Connection: close\r\n";
  bool wants_length =
      !req.body.empty() || req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
  if (!has_length && wants_length)
    out += "Content-Length: " + std::to_string(req.body.size()) + "\r\n";
  out += "\r\n";
  out += req.body;
  return out;
}

/// What one exchange asks for and reports.
struct http_exchange_info {
  bool keep_alive = false;   ///< in: leave out `Connection: close`
  bool reusable = false;     ///< out: the response ended cleanly; the connection may serve again
  std::size_t received = 0;  ///< out: response bytes received (also when it throws)
};

// True when a response with this head lets the connection serve another request.
inline bool http_keeps_alive(const http_response& head) {
  if (head.minor_version < 1) return false;
  const std::string* c = head.header("Connection");
  return !c || !http_iequal(*c, "close");
}

/// Reads response heads from `sock` until a final (non-1xx) one and parses it into `head`;
/// the bytes after it (the start of the body) are left in `in`. False when `deadline` passes
/// first; a connection closed first throws http_connection_closed.
template <class Io, class Conn>
bool http_read_head(http_channel<Io, Conn>& sock, const http_endpoint& ep, const std::string& where,
                    http_clock::time_point deadline, http_response& head, std::string& in) {
  char buf[16384];
  auto find_head = [&in](std::size_t& end, std::size_t& sep) {
    std::size_t crlf = in.find("\r\n\r\n"), lf = in.find("\n\n");
    if (crlf != std::string::npos && (lf == std::string::npos || crlf < lf)) {
      end = crlf;
      sep = 4;
    } else if (lf != std::string::npos) {
      end = lf;
      sep = 2;
    }
  };
  for (;;) {  // read heads until a final (non-1xx) one
    std::size_t head_end = std::string::npos, sep = 0;
    find_head(head_end, sep);
    while (head_end == std::string::npos) {
      long n = sock.recv_some(buf, sizeof buf, deadline);
      if (n < 0) return false;
      if (n == 0)
        throw http_connection_closed(EPROTO, "http", where,
                                     !in.empty() ? "truncated response head"
                                     : ep.tls    ? "connection closed before a response"
                                                 : "connection closed before a response (a "
                                                   "server that speaks only TLS does this: "
                                                   "https://?)");
      in.append(buf, static_cast<std::size_t>(n));
      find_head(head_end, sep);
      if (head_end == std::string::npos && in.size() > http_max_head)
        throw error(EPROTO, "http", where, "response head longer than 64 KiB");
    }
    http_parse_head(std::string_view(in).substr(0, head_end), head, where);
    in.erase(0, head_end + sep);
    if (head.status / 100 != 1 || head.status == 101) return true;
  }
}

/// The shared exchange on a connected `conn`: send, read the head and then the body through
/// `sink`. Without `stream_deadline` (http_call) everything must finish within `t.read`
/// (ETIMEDOUT otherwise). With it (http_stream) the head must arrive within `t.read` and the
/// body is read until `*stream_deadline`, which ends the exchange quietly (returns false); a
/// non-2xx streamed response is read within `t.read` like a call.
template <class Io, class Conn, class Sink>
bool http_exchange(Conn& conn, const http_endpoint& ep, const http_request& req,
                   const std::string& where, http_timeouts t,
                   const http_clock::time_point* stream_deadline, http_response& head, Sink& sink,
                   const std::atomic<bool>* cancel, http_exchange_info& info) {
  http_channel<Io, Conn> sock(conn, where, cancel);
  struct report {
    http_exchange_info& info;
    http_channel<Io, Conn>& sock;
    ~report() { info.received = sock.received(); }
  } rep{info, sock};
  info.reusable = false;
  const auto read_deadline = http_clock::now() + t.read;
  const bool stream_ends_first = stream_deadline && *stream_deadline < read_deadline;
  const auto head_deadline = stream_ends_first ? *stream_deadline : read_deadline;
  sock.send_all(http_serialize(ep, req, info.keep_alive), head_deadline);

  char buf[16384];
  std::string in;
  if (!http_read_head<Io>(sock, ep, where, head_deadline, head, in)) {
    if (stream_ends_first) return false;
    throw error(ETIMEDOUT, "recv", where,
                "no response within " + std::to_string(t.read.count()) + " ms");
  }

  const bool quiet = stream_deadline && head.status / 100 == 2;
  const auto body_deadline = quiet ? *stream_deadline : read_deadline;
  http_body_decoder body = http_body_for(head, req.method, where);
  // Reusable only when the body is framed, complete, nothing follows it and the server agrees.
  const bool may_keep = info.keep_alive && !body.complete_at_eof() && http_keeps_alive(head);
  std::size_t left = 0;
  if (body.done()) {
    info.reusable = info.keep_alive && in.empty() && http_keeps_alive(head);
    return true;
  }
  if (!in.empty()) {
    auto r = body.feed(in, sink, &left);
    if (r != http_body_decoder::result::more) {
      info.reusable = r == http_body_decoder::result::done && may_keep && left == 0;
      return true;
    }
  }
  while (!body.done()) {
    long n = sock.recv_some(buf, sizeof buf, body_deadline);
    if (n < 0) {
      if (quiet) return false;
      throw error(ETIMEDOUT, "recv", where,
                  "response not complete within " + std::to_string(t.read.count()) + " ms");
    }
    if (n == 0) {
      if (body.complete_at_eof()) return true;
      throw http_connection_closed(EPROTO, "http", where, "truncated body");
    }
    auto r = body.feed(std::string_view(buf, static_cast<std::size_t>(n)), sink, &left);
    if (r != http_body_decoder::result::more) {
      info.reusable = r == http_body_decoder::result::done && may_keep && left == 0;
      return true;
    }
  }
  info.reusable = may_keep;
  return true;
}

// A sink that collects a whole response body (up to http_max_body).
struct http_collect {
  http_response& resp;
  const std::string& where;
  bool operator()(std::string_view bytes) {
    if (resp.body.size() + bytes.size() > http_max_body)
      throw error(EPROTO, "http", where, "response body above 64 MiB");
    resp.body.append(bytes.data(), bytes.size());
    return true;
  }
};

// The error http_stream throws for a non-2xx streamed response.
inline error http_stream_status(const http_response& head, const std::string& where,
                                const std::string& body) {
  return error(EPROTO, "http", where,
               "status " + std::to_string(head.status) + ": " + body.substr(0, 200));
}

}  // namespace detail

// ---- calls -----------------------------------------------------------------------------------

namespace detail {

/// http_call over any Transport: one connection, `Connection: close`.
template <class Io, class Transport>
http_response http_call_over(const Transport& transport, const http_endpoint& ep,
                             const http_request& req, http_timeouts t,
                             const std::atomic<bool>* cancel) {
  const std::string where = ep.url() + (req.target.empty() ? std::string("/") : req.target);
  auto conn = transport.connect(ep, t.connect, where, cancel);
  http_response resp;
  http_collect sink{resp, where};
  http_exchange_info info;
  http_exchange<Io>(conn, ep, req, where, t, nullptr, resp, sink, cancel, info);
  return resp;
}

/// http_stream on a connected `conn` (`Connection: close`); `where` names it in errors.
template <class Io, class Conn, class OnData>
void http_stream_on(Conn& conn, const http_endpoint& ep, const http_request& req,
                    const std::string& where, http_timeouts t, http_clock::time_point deadline,
                    OnData& on_data, const std::atomic<bool>* cancel) {
  http_response head;
  std::string error_body;
  auto sink = [&](std::string_view bytes) -> bool {
    if (head.status / 100 == 2) return static_cast<bool>(on_data(bytes));
    if (error_body.size() < 512)
      error_body.append(bytes.data(), std::min<std::size_t>(bytes.size(), 512));
    return true;
  };
  http_exchange_info info;
  http_exchange<Io>(conn, ep, req, where, t, &deadline, head, sink, cancel, info);
  if (head.status != 0 && head.status / 100 != 2) throw http_stream_status(head, where, error_body);
}

/// http_stream over any Transport: one connection, `Connection: close`.
template <class Io, class Transport, class OnData>
void http_stream_over(const Transport& transport, const http_endpoint& ep, const http_request& req,
                      http_timeouts t, http_clock::time_point deadline, OnData& on_data,
                      const std::atomic<bool>* cancel) {
  const std::string where = ep.url() + (req.target.empty() ? std::string("/") : req.target);
  auto conn = transport.connect(ep, t.connect, where, cancel);
  http_stream_on<Io>(conn, ep, req, where, t, deadline, on_data, cancel);
}

/// A streamed response kept open and read piece by piece, for a long-lived watch: open() sends
/// the request and reads the head (both within the request timeout); read() then passes the
/// de-chunked body to a sink as it arrives, without waiting unless asked to. fd() is the socket
/// to poll while it is open. Movable; closes the connection on destruction.
template <class Io, class Transport>
class http_open_stream {
 public:
  using connection = typename Transport::connection;

  /// What read() found.
  enum class status {
    open,  ///< the stream goes on (bytes may or may not have arrived)
    ended  ///< the body ended or the server closed the connection cleanly; now closed
  };

  /// A closed stream.
  http_open_stream() = default;

  /// Sends `req` on `conn` (`Connection: close`) and reads the head within `t.read`: ETIMEDOUT
  /// after it, http_connection_closed when the server closes first, and for a non-2xx status
  /// holdfast::error(EPROTO, "http", url, "status N: <start of body>") as http_stream.
  http_open_stream(connection conn, const http_endpoint& ep, const http_request& req,
                   http_timeouts t, const std::atomic<bool>* cancel)
      : conn_(std::move(conn)),
        where_(ep.url() + (req.target.empty() ? std::string("/") : req.target)),
        cancel_(cancel) {
    const auto deadline = http_clock::now() + t.read;
    http_channel<Io, connection> sock(conn_, where_, cancel_);
    sock.send_all(http_serialize(ep, req, false), deadline);
    http_response head;
    if (!http_read_head<Io>(sock, ep, where_, deadline, head, raw_))
      throw error(ETIMEDOUT, "recv", where_,
                  "no response within " + std::to_string(t.read.count()) + " ms");
    body_ = http_body_for(head, req.method, where_);
    if (head.status / 100 == 2) return;
    std::string error_body;
    auto sink = [&error_body](std::string_view bytes) {
      if (error_body.size() < 512)
        error_body.append(bytes.data(), std::min<std::size_t>(bytes.size(), 512));
      return true;
    };
    try {
      read(sink, deadline);
      while (conn_.fd() >= 0 && http_clock::now() < deadline) read(sink, deadline);
    } catch (const error&) {
      // the status is the news, not a body cut short
    }
    throw http_stream_status(head, where_, error_body);
  }

  /// The socket to poll for POLLIN while open; -1 once closed.
  int fd() const noexcept { return conn_.fd(); }
  /// True while the stream is open.
  bool is_open() const noexcept { return conn_.fd() >= 0; }
  /// True when bytes are waiting that polling the socket would not show (received with the head,
  /// or held by a TLS layer): read() returns them at once.
  bool pending() const noexcept { return is_open() && (!raw_.empty() || conn_.pending()); }
  /// "http://host:port/target", for messages.
  const std::string& where() const noexcept { return where_; }

  /// Passes what has arrived to `sink(std::string_view)` (its result is ignored); when nothing
  /// has, waits for bytes until `deadline` (a deadline already past: no wait). Reads at most
  /// about 1 MiB per call. Returns status::ended (and closes) when the body ends or the server
  /// closes the connection; throws holdfast::error for a failed read, a body cut short
  /// (http_connection_closed) or a malformed one (EPROTO), and then closes too.
  template <class Sink>
  status read(Sink&& sink, http_clock::time_point deadline) {
    auto feed = [&sink](std::string_view bytes) {
      sink(bytes);
      return true;
    };
    struct closer {
      http_open_stream& s;
      bool armed = true;
      ~closer() {
        if (armed) s.close();
      }
    } guard{*this};
    if (!is_open()) return status::ended;
    std::size_t got = 0;  // bytes passed on in this call: once some were, never wait
    if (!raw_.empty()) {
      const std::string bytes = std::move(raw_);
      raw_.clear();
      got = bytes.size();
      if (body_.feed(bytes, feed) == http_body_decoder::result::done) return status::ended;
    }
    char buf[16384];
    http_channel<Io, connection> sock(conn_, where_, cancel_);
    while (got < (std::size_t{1} << 20)) {
      long n = sock.recv_some(buf, sizeof buf, got > 0 ? http_clock::time_point() : deadline);
      if (n < 0) break;  // nothing more for now
      if (n == 0) {
        if (body_.complete_at_eof()) return status::ended;
        throw http_connection_closed(EPROTO, "http", where_, "connection closed mid-stream");
      }
      got += static_cast<std::size_t>(n);
      if (body_.feed(std::string_view(buf, static_cast<std::size_t>(n)), feed) ==
          http_body_decoder::result::done)
        return status::ended;
    }
    guard.armed = false;
    return status::open;
  }

  /// Closes the connection (idempotent).
  void close() noexcept {
    conn_.close();
    raw_.clear();
  }

 private:
  connection conn_;
  std::string where_;
  const std::atomic<bool>* cancel_ = nullptr;
  http_body_decoder body_;
  std::string raw_;  // body bytes that arrived with the head, not yet decoded
};

/// Sends `req` to `ep` and returns the whole response (any status). Throws holdfast::error:
/// ECONNREFUSED/EHOSTUNREACH/... from connect, ETIMEDOUT past a timeout, EPROTO for a malformed
/// or truncated response, the errno of a failed call otherwise. When `cancel` is given and
/// becomes true, the call gives up within ~20 ms with ECANCELED (for prompt shutdown).
template <class Io = posix_io>
http_response http_call(const http_endpoint& ep, const http_request& req, http_timeouts t = {},
                        const std::atomic<bool>* cancel = nullptr) {
  return http_call_over<Io>(plain_transport<Io>(), ep, req, t, cancel);
}

/// Sends `req` and passes the de-chunked body to `bool on_data(std::string_view)` as it
/// arrives. Returns when on_data returns false, the body ends, or `deadline` passes (no throw
/// on the deadline). The head must arrive within `t.read`. A non-2xx status throws
/// holdfast::error(EPROTO, "http", url, "status N: <start of body>") without calling on_data.
/// Other failures throw as http_call does (a truncated body is EPROTO); `cancel` as for
/// http_call.
template <class Io = posix_io, class OnData>
void http_stream(const http_endpoint& ep, const http_request& req, http_timeouts t,
                 http_clock::time_point deadline, OnData on_data,
                 const std::atomic<bool>* cancel = nullptr) {
  http_stream_over<Io>(plain_transport<Io>(), ep, req, t, deadline, on_data, cancel);
}

/// A few idle connections kept for reuse (HTTP/1.1 keep-alive), shared by the threads of one
/// client: call() takes an idle connection to the endpoint (or connects), and gives it back
/// when the response ended cleanly. Streams get a connection of their own (never pooled). It
/// counts the requests it sends and the connections it makes (relaxed atomics).
template <class Io, class Transport>
class http_pool {
  static_assert(check_transport<Transport>());

 public:
  using connection = typename Transport::connection;

  /// Keeps at most `max_idle` idle connections (0: none, every call connects) and none idle
  /// longer than `max_age` (a middlebox may have dropped it silently).
  http_pool(Transport transport, std::size_t max_idle,
            std::chrono::milliseconds max_age = std::chrono::seconds(30))
      : transport_(std::move(transport)), max_idle_(max_idle), max_age_(max_age) {}
  http_pool(const http_pool&) = delete;
  http_pool& operator=(const http_pool&) = delete;

  /// The transport connections are made with.
  const Transport& transport() const noexcept { return transport_; }

  /// As http_call, on a pooled connection when one to `ep` is idle and still open.
  http_response call(const http_endpoint& ep, const http_request& req, http_timeouts t,
                     const std::atomic<bool>* cancel = nullptr) {
    const std::string where = ep.url() + (req.target.empty() ? std::string("/") : req.target);
    std::optional<connection> conn = take(ep);
    const bool reused = conn.has_value();
    if (!reused) conn.emplace(connect(ep, t, where, cancel));
    http_response resp;
    http_exchange_info info;
    info.keep_alive = max_idle_ > 0;
    std::exception_ptr stale;
    try {
      http_collect sink{resp, where};
      requests_.fetch_add(1, std::memory_order_relaxed);
      http_exchange<Io>(*conn, ep, req, where, t, nullptr, resp, sink, cancel, info);
    } catch (const error& e) {
      if (!reused || info.received != 0 || !is_stale(e)) throw;
      stale = std::current_exception();
    }
    if (stale) {  // the server closed it as we reused it: once more, on a fresh connection
      conn.reset();
      try {
        conn.emplace(connect(ep, t, where, cancel));
      } catch (const error&) {
        std::rethrow_exception(stale);  // the request may have been sent: report that
      }
      resp = http_response();
      http_collect sink{resp, where};
      requests_.fetch_add(1, std::memory_order_relaxed);
      http_exchange<Io>(*conn, ep, req, where, t, nullptr, resp, sink, cancel, info);
    }
    if (info.reusable) give(ep, std::move(*conn));
    return resp;
  }

  /// As http_stream, on a connection of its own.
  template <class OnData>
  void stream(const http_endpoint& ep, const http_request& req, http_timeouts t,
              http_clock::time_point deadline, OnData on_data,
              const std::atomic<bool>* cancel = nullptr) const {
    const std::string where = ep.url() + (req.target.empty() ? std::string("/") : req.target);
    auto conn = connect(ep, t, where, cancel);
    requests_.fetch_add(1, std::memory_order_relaxed);
    http_stream_on<Io>(conn, ep, req, where, t, deadline, on_data, cancel);
  }

  /// Opens a long-lived stream on a connection of its own (see http_open_stream): connecting
  /// within `t.connect`, the head within `t.read`. `cancel` must outlive the stream.
  http_open_stream<Io, Transport> open_stream(const http_endpoint& ep, const http_request& req,
                                              http_timeouts t,
                                              const std::atomic<bool>* cancel = nullptr) const {
    const std::string where = ep.url() + (req.target.empty() ? std::string("/") : req.target);
    auto conn = connect(ep, t, where, cancel);
    requests_.fetch_add(1, std::memory_order_relaxed);
    return http_open_stream<Io, Transport>(std::move(conn), ep, req, t, cancel);
  }

  /// HTTP requests sent so far (calls, a stale connection's resend, streams), counted when
  /// sending starts.
  std::uint64_t requests() const noexcept { return requests_.load(std::memory_order_relaxed); }
  /// Connections made so far (pooled or for streams).
  std::uint64_t connections() const noexcept {
    return connections_.load(std::memory_order_relaxed);
  }

  /// Closes every idle connection to `ep` (after it failed or timed out).
  void drop(const http_endpoint& ep) noexcept {
    std::vector<idle_connection> gone;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (std::size_t i = 0; i < idle_.size();)
        if (idle_[i].ep.same(ep)) {
          gone.push_back(std::move(idle_[i]));
          idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
    }
  }

  /// Idle connections held now (to `ep` when given).
  std::size_t idle(const http_endpoint* ep = nullptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (const auto& c : idle_) n += !ep || c.ep.same(*ep);
    return n;
  }

 private:
  struct idle_connection {
    http_endpoint ep;
    connection conn;
    http_clock::time_point since;
  };

  connection connect(const http_endpoint& ep, http_timeouts t, const std::string& where,
                     const std::atomic<bool>* cancel) const {
    connection c = transport_.connect(ep, t.connect, where, cancel);
    connections_.fetch_add(1, std::memory_order_relaxed);
    return c;
  }

  static bool is_stale(const error& e) {
    if (dynamic_cast<const http_connection_closed*>(&e)) return true;
    const int n = e.errnum();
    return (e.operation() == "send" || e.operation() == "recv") &&
           (n == ECONNRESET || n == EPIPE || n == ECONNABORTED);
  }

  // An idle connection to `ep` that is still open and quiet, newest first. In a forked child
  // every inherited connection is dropped (closed here only: the parent's stay usable).
  std::optional<connection> take(const http_endpoint& ep) {
    const pid_t pid = Io::getpid();
    for (;;) {
      std::optional<idle_connection> c;
      std::vector<idle_connection> inherited;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (pid != owner_) {
          inherited.swap(idle_);
          owner_ = pid;
        }
        for (std::size_t i = idle_.size(); i-- > 0;)
          if (idle_[i].ep.same(ep)) {
            c.emplace(std::move(idle_[i]));
            idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
            break;
          }
      }
      if (!c) return std::nullopt;
      if (http_clock::now() - c->since <= max_age_ && quiet(c->conn)) return std::move(c->conn);
    }
  }

  // True when nothing arrived on an idle connection: no end of stream, no stray bytes. A TLS
  // transport may read (and keep) records that are no data, such as session tickets.
  static bool quiet(connection& c) {
    if (c.pending()) return false;
    pollfd p{c.fd(), POLLIN, 0};
    int n = Io::poll(&p, 1, 0);
    if (n == 0) return true;
    if (n < 0) return false;
    char buf[256];
    long r = c.read(buf, sizeof buf);
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !c.pending();
  }

  void give(const http_endpoint& ep, connection conn) {
    std::optional<idle_connection> evicted;
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() >= max_idle_) {
      if (idle_.empty()) return;
      evicted.emplace(std::move(idle_.front()));
      idle_.erase(idle_.begin());
    }
    idle_.push_back(idle_connection{ep, std::move(conn), http_clock::now()});
  }

  Transport transport_;
  std::size_t max_idle_;
  std::chrono::milliseconds max_age_;
  mutable std::mutex mutex_;
  std::vector<idle_connection> idle_;
  pid_t owner_ = Io::getpid();  // the process the idle connections belong to
  mutable std::atomic<std::uint64_t> requests_{0};
  mutable std::atomic<std::uint64_t> connections_{0};
};

}  // namespace detail
HOLDFAST_NAMESPACE_END
