// holdfast/detail/http.hpp — a small HTTP/1.1 client over the Io policy, for cloud metadata
// servers (termination notices) and etcd's JSON gateway (kv/etcd.hpp).
//
// One request per connection (`Connection: close`), plain http:// only, IPv4 and IPv6.
//
// Guarantees:
//   - Every socket call goes through `Io::` (socket, connect, getsockopt, send, recv, poll,
//     getaddrinfo), so tests fail any of them with testing::fault_io. EINTR is retried.
//   - Connecting never blocks past `http_timeouts::connect` (non-blocking connect + poll), and
//     http_call never waits past `http_timeouts::read` after connecting: that is the budget for
//     sending the request and receiving the whole response (a server dribbling one byte a second
//     cannot hold the caller).
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
// Caveats:
//   - Name lookup (getaddrinfo) cannot be timed out; use numeric addresses where a lookup may
//     hang (the cloud notices default to 169.254.169.254 for that reason).
//   - No TLS, no redirects, no keep-alive, no proxies. Responses above 64 MiB are refused (EPROTO).
//   - http_stream's body has no read timeout of its own, only the caller's deadline (a watch may
//     be silent for a long time); the status line and headers must arrive within `read`.
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
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../io.hpp"

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
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

/// A complete response: status code, header fields (values trimmed) and the de-chunked body.
struct http_response {
  int status = 0;
  http_headers headers;
  std::string body;
  /// The first header with this name (case-insensitive), or nullptr.
  const std::string* header(std::string_view name) const {
    for (const auto& h : headers)
      if (http_iequal(h.first, name)) return &h.second;
    return nullptr;
  }
};

/// Where to connect: a host name or address (IPv6 without brackets) and a port.
struct http_endpoint {
  std::string host;
  std::uint16_t port = 80;
  /// "http://host:port", with brackets around an IPv6 address; used in error messages.
  std::string url() const {
    bool v6 = host.find(':') != std::string::npos;
    return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

/// Parses `http://host[:port][/path]` (port 80 by default; `[::1]` for IPv6). When `path` is
/// given it receives the path ("" when absent). Throws holdfast::format_error on anything else.
inline http_endpoint parse_http_url(std::string_view url, std::string* path = nullptr) {
  const std::string src(url);
  constexpr std::string_view scheme = "http://";
  if (url.size() < scheme.size() || !http_iequal(url.substr(0, scheme.size()), scheme))
    throw format_error(src, "offset 0: expected http://");
  std::string_view rest = url.substr(scheme.size());
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (path)
    *path = slash == std::string_view::npos ? std::string() : std::string(rest.substr(slash));
  http_endpoint ep;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) throw format_error(src, "offset 7: unclosed '['");
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
  if (ep.host.empty()) throw format_error(src, "offset 7: empty host");
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

  template <class Sink>
  result feed(std::string_view in, Sink& sink) {
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
      int digit = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
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

/// One connected socket with deadlines on every wait.
template <class Io>
class http_socket {
 public:
  http_socket(std::string where, const std::atomic<bool>* cancel)
      : where_(std::move(where)), cancel_(cancel) {}
  http_socket(const http_socket&) = delete;
  http_socket& operator=(const http_socket&) = delete;
  ~http_socket() { close(); }

  /// Resolves and connects (non-blocking connect + poll), trying each address in turn.
  void connect(const http_endpoint& ep, std::chrono::milliseconds timeout) {
    auto deadline = http_clock::now() + timeout;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* list = nullptr;
    const std::string port = std::to_string(ep.port);
    int rc = Io::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &list);
    if (rc != 0) {
      if (rc == EAI_SYSTEM) throw error(errno != 0 ? errno : EIO, "resolve", where_);
      throw error(EHOSTUNREACH, "resolve", where_, gai_strerror(rc));
    }
    struct guard {
      addrinfo* p;
      ~guard() { Io::freeaddrinfo(p); }
    } g{list};
    int last_errno = EHOSTUNREACH;
    for (addrinfo* ai = list; ai; ai = ai->ai_next) {
      last_errno = try_connect(*ai, deadline);
      if (last_errno == 0) return;
      if (last_errno == ETIMEDOUT) break;
    }
    if (last_errno == ETIMEDOUT)
      throw error(ETIMEDOUT, "connect", where_,
                  "no connection within " + std::to_string(timeout.count()) + " ms");
    throw error(last_errno, "connect", where_);
  }

  /// Sends all of `data` before `deadline` (ETIMEDOUT after it).
  void send_all(std::string_view data, http_clock::time_point deadline) {
    while (!data.empty()) {
      ssize_t n = Io::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!wait(POLLOUT, deadline))
          throw error(ETIMEDOUT, "send", where_, "request not sent in time");
        continue;
      }
      throw error(n < 0 ? errno : EIO, "send", where_);
    }
  }

  /// Receives some bytes before `deadline`: the count, 0 at end of stream, -1 on timeout.
  long recv_some(char* buf, std::size_t n, http_clock::time_point deadline) {
    for (;;) {
      ssize_t r = Io::recv(fd_, buf, n, 0);
      if (r >= 0) return static_cast<long>(r);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) throw error(errno, "recv", where_);
      if (!wait(POLLIN, deadline)) return -1;
    }
  }

  void close() noexcept {
    if (fd_ >= 0) Io::close(fd_);
    fd_ = -1;
  }

  const std::string& where() const noexcept { return where_; }

 private:
  // Polls for `events` until `deadline`; false on timeout. Errors (POLLERR/POLLHUP) return true
  // so the next send/recv reports them.
  bool wait(short events, http_clock::time_point deadline) {
    for (;;) {
      if (cancel_ && cancel_->load(std::memory_order_relaxed))
        throw error(ECANCELED, "http", where_, "cancelled");
      pollfd p{fd_, events, 0};
      int ms = http_poll_ms(deadline);
      if (cancel_ && ms > http_cancel_slice_ms) ms = http_cancel_slice_ms;
      int n = Io::poll(&p, 1, ms);
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) throw error(errno, "poll", where_);
      if (n == 0 && http_clock::now() >= deadline) return false;
    }
  }

  // Returns 0 when connected, else the errno of this attempt.
  int try_connect(const addrinfo& ai, http_clock::time_point deadline) {
    close();
    fd_ = Io::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
    if (fd_ < 0) throw error(errno, "socket", where_);
    // EINTR: the connect may go on asynchronously or never have started; connecting again
    // tells which (EALREADY: in progress, EISCONN: done, else it starts now).
    int rc;
    while ((rc = Io::connect(fd_, ai.ai_addr, ai.ai_addrlen)) != 0 && errno == EINTR) {
    }
    if (rc == 0 || errno == EISCONN) return 0;
    if (errno != EINPROGRESS && errno != EALREADY) return errno;
    if (!wait(POLLOUT, deadline)) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof err;
    if (Io::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    return err;
  }

  std::string where_;
  const std::atomic<bool>* cancel_;
  int fd_ = -1;
};

/// Serializes the request line and headers (adds Host, Connection: close, Content-Length).
inline std::string http_serialize(const http_endpoint& ep, const http_request& req) {
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
    if (ep.port != 80) out += ":" + std::to_string(ep.port);
    out += "\r\n";
  }
  for (const auto& h : req.headers) {
    if (http_iequal(h.first, "Connection")) continue;
    out += h.first + ": " + h.second + "\r\n";
  }
  out += "Connection: close\r\n";
  bool wants_length =
      !req.body.empty() || req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
  if (!has_length && wants_length)
    out += "Content-Length: " + std::to_string(req.body.size()) + "\r\n";
  out += "\r\n";
  out += req.body;
  return out;
}

/// The shared exchange: connect, send, read the head and then the body through `sink`.
/// Without `stream_deadline` (http_call) everything after connecting must finish within
/// `t.read` (ETIMEDOUT otherwise). With it (http_stream) the head must arrive within `t.read`
/// and the body is read until `*stream_deadline`, which ends the exchange quietly (returns
/// false); a non-2xx streamed response is read within `t.read` like a call.
template <class Io, class Sink>
bool http_exchange(const http_endpoint& ep, const http_request& req, http_timeouts t,
                   const http_clock::time_point* stream_deadline, http_response& head, Sink& sink,
                   const std::atomic<bool>* cancel) {
  const std::string where = ep.url() + (req.target.empty() ? std::string("/") : req.target);
  http_socket<Io> sock(where, cancel);
  sock.connect(ep, t.connect);
  const auto read_deadline = http_clock::now() + t.read;
  const bool stream_ends_first = stream_deadline && *stream_deadline < read_deadline;
  const auto head_deadline = stream_ends_first ? *stream_deadline : read_deadline;
  sock.send_all(http_serialize(ep, req), head_deadline);

  char buf[16384];
  std::string in;
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
      long n = sock.recv_some(buf, sizeof buf, head_deadline);
      if (n < 0) {
        if (stream_ends_first) return false;
        throw error(ETIMEDOUT, "recv", where,
                    "no response within " + std::to_string(t.read.count()) + " ms");
      }
      if (n == 0)
        throw http_connection_closed(
            EPROTO, "http", where,
            in.empty() ? "connection closed before a response" : "truncated response head");
      in.append(buf, static_cast<std::size_t>(n));
      find_head(head_end, sep);
      if (head_end == std::string::npos && in.size() > http_max_head)
        throw error(EPROTO, "http", where, "response head longer than 64 KiB");
    }
    http_parse_head(std::string_view(in).substr(0, head_end), head, where);
    in.erase(0, head_end + sep);
    if (head.status / 100 != 1 || head.status == 101) break;
  }

  const bool quiet = stream_deadline && head.status / 100 == 2;
  const auto body_deadline = quiet ? *stream_deadline : read_deadline;
  http_body_decoder body = http_body_for(head, req.method, where);
  if (!in.empty() && !body.done()) {
    if (body.feed(in, sink) != http_body_decoder::result::more) return true;
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
    if (body.feed(std::string_view(buf, static_cast<std::size_t>(n)), sink) !=
        http_body_decoder::result::more)
      return true;
  }
  return true;
}

// ---- public calls ----------------------------------------------------------------------------

/// Sends `req` to `ep` and returns the whole response (any status). Throws holdfast::error:
/// ECONNREFUSED/EHOSTUNREACH/... from connect, ETIMEDOUT past a timeout, EPROTO for a malformed
/// or truncated response, the errno of a failed call otherwise. When `cancel` is given and
/// becomes true, the call gives up within ~20 ms with ECANCELED (for prompt shutdown).
template <class Io = posix_io>
http_response http_call(const http_endpoint& ep, const http_request& req, http_timeouts t = {},
                        const std::atomic<bool>* cancel = nullptr) {
  http_response resp;
  auto sink = [&resp, &ep, &req](std::string_view bytes) {
    if (resp.body.size() + bytes.size() > http_max_body)
      throw error(EPROTO, "http", ep.url() + req.target, "response body above 64 MiB");
    resp.body.append(bytes.data(), bytes.size());
    return true;
  };
  http_exchange<Io>(ep, req, t, nullptr, resp, sink, cancel);
  return resp;
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
  http_response head;
  std::string error_body;
  auto sink = [&](std::string_view bytes) -> bool {
    if (head.status / 100 == 2) return static_cast<bool>(on_data(bytes));
    if (error_body.size() < 512)
      error_body.append(bytes.data(), std::min<std::size_t>(bytes.size(), 512));
    return true;
  };
  http_exchange<Io>(ep, req, t, &deadline, head, sink, cancel);
  if (head.status != 0 && head.status / 100 != 2)
    throw error(EPROTO, "http", ep.url() + req.target,
                "status " + std::to_string(head.status) + ": " + error_body.substr(0, 200));
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
