// holdfast/detail/http/pool.hpp — http_pool: a few idle connections per client kept for reuse
// (HTTP/1.1 keep-alive), so a TLS handshake is paid once per connection, not once per request;
// it counts the requests it sends and the connections it makes.
//
// Guarantees:
//   - A connection is reused only after a response that ended cleanly (framed by length or
//     chunks, no `Connection: close`, HTTP/1.1, nothing left over); an idle one is checked before
//     reuse (closed, readable or older than max_age: dropped).
//   - When a reused connection turns out closed before any byte of the response arrived, a
//     request the caller marked http_resend::on_stale (a read: safe to apply twice) is sent once
//     more on a fresh one; if connecting fails then, the first failure is reported. A request
//     marked http_resend::never (a write: the server may have applied it and then dropped the
//     connection) is never sent twice: that failure is thrown (http_connection_closed, or the
//     send/recv error), for the caller to report as "sent, outcome unknown". The method does
//     not tell the two apart: etcd's JSON gateway POSTs its reads too.
//   - A forked child never uses a connection it inherited (it would share it with its parent):
//     it drops them all (closing only its own copies).
//   - Safe to share between threads; the counters are relaxed atomics. Streams (stream(),
//     open_stream()) get a connection of their own, never pooled.
// Caveats:
//   - At most `max_idle` idle connections in all, the oldest evicted first; 0 pools none.
//   - Errors are those of exchange.hpp and transport.hpp. An idle connection is closed when it
//     is found closed or stale at reuse, or when the caller drop()s its endpoint's (after a
//     failure): the pool does not watch them meanwhile.
#pragma once

#include <poll.h>       // poll: is an idle connection still quiet
#include <sys/types.h>  // pid_t: the process the idle connections belong to

#include <algorithm>  // min, max: a resend within what is left of the call
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>  // exception_ptr: a stale pooled connection is retried once
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../../io.hpp"
#include "endpoint.hpp"   // http_endpoint
#include "exchange.hpp"   // http_exchange, http_collect, http_stream_on
#include "message.hpp"    // http_response, http_connection_closed
#include "stream.hpp"     // http_open_stream
#include "transport.hpp"  // check_transport

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// Whether http_pool::call may send a request once more when its reused connection turns out
/// closed before any byte of the reply: `on_stale` for a request safe to apply twice (a read),
/// `never` for one the server may have applied (a write).
enum class http_resend : unsigned char { never, on_stale };

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

  /// As http_call, on a pooled connection when one to `ep` is idle and still open; `resend`
  /// says whether `req` may be sent again after that connection closed unanswered.
  http_response call(const http_endpoint& ep, const http_request& req, http_timeouts t,
                     http_resend resend, const std::atomic<bool>* cancel = nullptr) {
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
      if (!reused || info.received != 0 || !is_stale(e) || resend != http_resend::on_stale) throw;
      stale = std::current_exception();
    }
    if (stale) {  // the server closed it as we reused it: once more, on a fresh connection
      conn.reset();
      if (t.until)  // within what is left of the call
        t.connect =
            std::min(t.connect, std::chrono::ceil<std::chrono::milliseconds>(std::max(
                                    *t.until - http_clock::now(), http_clock::duration::zero())));
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
