// holdfast/detail/http/stream.hpp — http_open_stream: a streamed response kept open and read
// piece by piece without blocking, for a long-lived watch polled by its owner.
//
// Guarantees:
//   - Opening sends the request and reads the head within `http_timeouts::read` (ETIMEDOUT
//     after it, http_connection_closed when the server closes first); a non-2xx status throws
//     holdfast::error(EPROTO, "http", url, "status N: <start of body>") as http_stream does.
//   - read() never waits when bytes have arrived (or a TLS layer holds some: pending()), reads
//     at most about 1 MiB per call, and passes the de-chunked body on as it comes.
//   - The stream closes itself when its body ends, the server closes the connection, or a read
//     fails or finds the body cut short or malformed (which throws); close() is idempotent and
//     the destructor closes too.
// Caveats:
//   - No timeout at all after the head: the owner decides when silence is suspicious.
//   - One thread at a time; `cancel`, when given, must outlive the stream.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "../../error.hpp"
#include "decoder.hpp"   // http_body_decoder, http_body_for
#include "endpoint.hpp"  // http_endpoint
#include "exchange.hpp"  // http_channel, http_serialize, http_read_head, http_error_body,
                         // http_stream_status
#include "message.hpp"   // http_request, http_response, http_connection_closed

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

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
    http_error_body error_body;  // its start and its length, for the message
    try {
      read(error_body, deadline);
      while (conn_.fd() >= 0 && http_clock::now() < deadline) read(error_body, deadline);
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

}  // namespace detail
HOLDFAST_NAMESPACE_END
