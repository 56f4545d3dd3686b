// holdfast/detail/http/exchange.hpp — one request and its response on one connection: formatting
// the request (http_serialize), sending it and reading the head and body within deadlines
// (http_exchange), and the one-connection calls built on it: http_call (the whole response) and
// http_stream (the body passed on as it arrives), over plain TCP or any Transport.
//
// Guarantees:
//   - A request never waits past `http_timeouts::read` after connecting: that is the budget for
//     sending the request and receiving the whole response (a server dribbling one byte a second
//     cannot hold the caller); connecting is bounded by `http_timeouts::connect` (transport.hpp).
//   - Failures throw holdfast::error naming the operation ("send", "recv", "http") and the URL:
//     ETIMEDOUT past a timeout, EPROTO for a malformed or truncated response (decoder.hpp), the
//     errno of the call otherwise. A server that closes the connection before its response is
//     complete throws http_connection_closed (EPROTO too).
//   - Any status is a value for http_call (a 404 is a response, not an error); a non-2xx
//     streamed response throws EPROTO "status N: <start of body>... (N bytes)" without reaching
//     on_data (message.hpp's http_body_excerpt: at most 200 bytes of any body in a message).
//   - http_serialize adds Host, Content-Length (when there is a body or the method is
//     POST/PUT/PATCH) and `Connection: close` unless asked to keep the connection; a
//     Connection header of the caller's is dropped.
//   - http_exchange reports whether the connection may serve again: only after a response that
//     ended cleanly (framed by length or chunks, no `Connection: close`, HTTP/1.1, nothing left
//     over), and how many response bytes arrived (also when it throws).
//   - An optional cancel flag ends any wait within ~20 ms (ECANCELED).
// Caveats:
//   - http_call and http_stream make one connection per request (`Connection: close`); reuse is
//     http_pool's (pool.hpp).
//   - No redirects, no proxies, no HTTP/2. Responses above 64 MiB, and heads above 64 KiB, are
//     refused (EPROTO).
//   - http_stream's body has no read timeout of its own, only the caller's deadline (a watch may
//     be silent for a long time); the status line and headers must arrive within `read`.
#pragma once

#include <poll.h>  // POLLIN: what a connection waits for

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "../../error.hpp"
#include "../../io.hpp"   // posix_io
#include "decoder.hpp"    // http_parse_head, http_body_for, http_body_decoder
#include "endpoint.hpp"   // http_endpoint
#include "message.hpp"    // http_request, http_response, http_connection_closed
#include "transport.hpp"  // wait_socket, plain_transport

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The largest response http_call accepts, and the longest head (status line + headers).
inline constexpr std::size_t http_max_body = std::size_t{64} << 20;
inline constexpr std::size_t http_max_head = std::size_t{64} << 10;

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
  const auto read_deadline =
      t.until ? std::min(http_clock::now() + t.read, *t.until) : http_clock::now() + t.read;
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

// The start of a non-2xx streamed response's body (what a message shows of it) and its length.
struct http_error_body {
  std::string start;
  std::size_t total = 0;
  bool operator()(std::string_view bytes) {
    if (start.size() < http_body_shown)
      start.append(bytes.data(), std::min(bytes.size(), http_body_shown - start.size()));
    total += bytes.size();
    return true;
  }
};

// The error http_stream throws for a non-2xx streamed response.
inline error http_stream_status(const http_response& head, const std::string& where,
                                const http_error_body& body) {
  return error(
      EPROTO, "http", where,
      "status " + std::to_string(head.status) + ": " + http_body_excerpt(body.start, body.total));
}

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
  http_error_body error_body;
  auto sink = [&](std::string_view bytes) -> bool {
    if (head.status / 100 == 2) return static_cast<bool>(on_data(bytes));
    return error_body(bytes);
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

}  // namespace detail

namespace detail {

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

}  // namespace detail
HOLDFAST_NAMESPACE_END
