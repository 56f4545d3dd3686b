// tests/support/http_server.hpp — a scripted HTTP server on 127.0.0.1 for tests.
//
//   holdfast_test::http_server srv([](const holdfast_test::seen_request& r) {
//     if (r.target == "/x") return holdfast_test::reply(200, "hello");      // Content-Length
//     return holdfast_test::reply::raw("garbage\r\n\r\n");                  // any bytes
//   });
//   auto ep = holdfast::detail::parse_http_url(srv.url());
//
// The handler runs on the server's one thread, once per connection, and returns a `reply`: a
// list of steps (pause, then send bytes), after which the server closes the connection (or,
// with `hold_open`, keeps it open until the client closes or the server stops; with
// `serve_next`, reads the next request on it and calls the handler again: keep-alive). A reply
// with no steps closes the connection without answering. Pauses end early
// when the client disconnects or the server is destroyed, so a "slow server" never slows
// shutdown. Connections are served one at a time. Requests are recorded for assertions.
//
// Also: `refused_endpoint()` (a port nobody listens on) and `blackhole` (a listener whose
// accept queue is full, so a new connect gets no answer: a connect timeout on loopback).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace holdfast_test {

/// A request as the server received it.
struct seen_request {
  std::string method, target, body;
  std::vector<std::pair<std::string, std::string>> headers;
  /// The first header with this name (case-insensitive), or "" when absent.
  std::string header(const std::string& name) const {
    for (const auto& h : headers)
      if (lower(h.first) == lower(name)) return h.second;
    return {};
  }
  static std::string lower(std::string s) {
    for (auto& c : s)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return s;
  }
};

/// What the server does with one connection: each step pauses, then sends its bytes.
struct reply {
  struct step {
    std::chrono::milliseconds pause{0};
    std::string bytes;
  };
  std::vector<step> steps;
  /// After the last step, keep the connection open until the client closes or the server stops.
  bool hold_open = false;
  /// After the last step, read the next request on the same connection (HTTP keep-alive).
  bool serve_next = false;

  reply() = default;
  /// A complete response with Content-Length and optional extra header lines ("K: V\r\n..."),
  /// saying `Connection: close` (the server closes after it, unless keep_alive() is asked): a
  /// client must not pool a connection the server is about to close, or its next request races
  /// the close (and a write is never resent).
  reply(int status, const std::string& body, const std::string& extra_headers = "") {
    steps.push_back(
        {std::chrono::milliseconds(0), response(status, body, close_header + extra_headers)});
  }
  /// Any bytes, sent at once, then close.
  static reply raw(std::string bytes) {
    reply r;
    r.steps.push_back({std::chrono::milliseconds(0), std::move(bytes)});
    return r;
  }
  /// Waits `pause` before sending anything (a slow server).
  static reply delayed(std::chrono::milliseconds pause, std::string bytes) {
    reply r;
    r.steps.push_back({pause, std::move(bytes)});
    return r;
  }
  /// Appends a step (for dribbled or streamed responses).
  reply& then(std::chrono::milliseconds pause, std::string bytes) {
    steps.push_back({pause, std::move(bytes)});
    return *this;
  }
  /// Keeps the connection open after the last step.
  reply& keep_open() {
    hold_open = true;
    return *this;
  }
  /// Serves the next request on this connection after the last step (keep-alive).
  reply& keep_alive() {
    serve_next = true;
    for (auto& st : steps) {
      auto at = st.bytes.find(close_header);
      if (at != std::string::npos) st.bytes.erase(at, close_header.size());
    }
    return *this;
  }
  /// The header reply(status, body) adds and keep_alive() removes.
  static inline const std::string close_header = "Connection: close\r\n";

  static std::string reason(int status) {
    switch (status) {
      case 200:
        return "OK";
      case 404:
        return "Not Found";
      case 401:
        return "Unauthorized";
      case 500:
        return "Internal Server Error";
      default:
        return "Status";
    }
  }
  /// Status line + Content-Length + extra headers + body.
  static std::string response(int status, const std::string& body,
                              const std::string& extra_headers = "") {
    return "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra_headers + "\r\n" +
           body;
  }
  /// Status line + Transfer-Encoding: chunked head (no body yet).
  static std::string chunked_head(int status = 200) {
    return "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
           "\r\nTransfer-Encoding: chunked\r\n\r\n";
  }
  /// One chunk: hex size, CRLF, data, CRLF.
  static std::string chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return size + data + "\r\n";
  }
  /// The last chunk and the end of the (empty) trailer section.
  static std::string last_chunk() { return "0\r\n\r\n"; }
};

/// The server. Throws std::runtime_error when it cannot listen.
class http_server {
 public:
  using handler = std::function<reply(const seen_request&)>;

  explicit http_server(handler h) : handler_(std::move(h)) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_ < 0) throw std::runtime_error("http_server: socket failed");
    int one = 1;
    ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_, 64) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("http_server: bind/listen failed");
    port_ = ntohs(a.sin_port);
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::runtime_error("http_server: pipe2 failed");
    thread_ = std::thread([this] { run(); });
  }
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;
  /// Stops at once, even in the middle of a pause or a held-open connection.
  ~http_server() {
    stop_.store(true);
    (void)!::write(wake_[1], "x", 1);
    thread_.join();
    ::close(listen_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  /// The port on 127.0.0.1.
  std::uint16_t port() const { return port_; }
  /// "http://127.0.0.1:<port>"
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// The requests received so far, in order.
  std::vector<seen_request> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  /// How many requests were received.
  std::size_t request_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.size();
  }
  /// Replaces the handler (takes effect with the next connection).
  void set_handler(handler h) {
    std::lock_guard<std::mutex> lock(mu_);
    handler_ = std::move(h);
  }

 private:
  using clock = std::chrono::steady_clock;

  // Waits for `fd` to have `events` or for the stop pipe; false when stopping or timed out.
  bool wait_for(int fd, short events, clock::time_point deadline) {
    for (;;) {
      if (stop_.load()) return false;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      int ms = left.count() < 0 ? 0 : static_cast<int>(left.count()) + 1;
      pollfd p[2] = {{fd, events, 0}, {wake_[0], POLLIN, 0}};
      int n = ::poll(p, 2, ms);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || p[1].revents) return false;
      if (n > 0) return true;
      if (clock::now() >= deadline) return false;
    }
  }

  // Pauses for `d`, ending early when the client hangs up or the server stops; false then.
  bool pause(int fd, std::chrono::milliseconds d) {
    auto deadline = clock::now() + d;
    while (clock::now() < deadline) {
      if (!wait_for(fd, POLLIN | POLLRDHUP, deadline))
        return !stop_.load() && clock::now() >= deadline;
      char c;
      ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;  // client gone
      if (n > 0) {  // unexpected extra bytes: drain them
        char sink[512];
        (void)!::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      }
    }
    return true;
  }

  bool read_request(int fd, seen_request& req) {
    std::string in;
    auto deadline = clock::now() + std::chrono::seconds(5);
    std::size_t end;
    char buf[4096];
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      if (!wait_for(fd, POLLIN, deadline)) return false;
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      in.append(buf, static_cast<std::size_t>(n));
    }
    std::string head = in.substr(0, end);
    std::string rest = in.substr(end + 4);
    std::size_t pos = head.find("\r\n");
    std::string line = head.substr(0, pos);
    std::size_t s1 = line.find(' '), s2 = line.rfind(' ');
    if (s1 == std::string::npos || s2 == s1) return false;
    req.method = line.substr(0, s1);
    req.target = line.substr(s1 + 1, s2 - s1 - 1);
    while (pos != std::string::npos) {
      std::size_t next = head.find("\r\n", pos + 2);
      std::string h =
          head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      std::size_t colon = h.find(':');
      if (colon != std::string::npos) {
        std::size_t v = colon + 1;
        while (v < h.size() && h[v] == ' ') ++v;
        req.headers.emplace_back(h.substr(0, colon), h.substr(v));
      }
      pos = next;
    }
    std::size_t length = 0;
    std::string cl = req.header("Content-Length");
    if (!cl.empty()) length = static_cast<std::size_t>(std::stoul(cl));
    while (rest.size() < length) {
      if (!wait_for(fd, POLLIN, deadline)) return false;
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      rest.append(buf, static_cast<std::size_t>(n));
    }
    req.body = rest.substr(0, length);
    return true;
  }

  void send_all(int fd, const std::string& bytes) {
    std::size_t off = 0;
    auto deadline = clock::now() + std::chrono::seconds(5);
    while (off < bytes.size()) {
      ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!wait_for(fd, POLLOUT, deadline)) return;
      } else {
        return;
      }
    }
  }

  void serve(int fd) {
    for (;;) {
      seen_request req;
      if (!read_request(fd, req)) return;
      handler h;
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.push_back(req);
        h = handler_;
      }
      reply r = h(req);
      for (const auto& s : r.steps) {
        if (s.pause.count() > 0 && !pause(fd, s.pause)) return;
        send_all(fd, s.bytes);
      }
      if (r.serve_next) continue;
      if (r.hold_open) pause(fd, std::chrono::seconds(60));
      return;
    }
  }

  void run() {
    while (!stop_.load()) {
      if (!wait_for(listen_, POLLIN, clock::now() + std::chrono::seconds(3600))) continue;
      int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      serve(fd);
      ::shutdown(fd, SHUT_WR);
      ::close(fd);
    }
  }

  handler handler_;
  int listen_ = -1;
  int wake_[2] = {-1, -1};
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<seen_request> seen_;
  std::thread thread_;
};

/// "http://127.0.0.1:<port>" where nothing listens (the port was bound, then released).
inline std::string refused_url() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

/// A loopback listener that never accepts and whose accept queue is full, so a new connect
/// gets no SYN-ACK and times out: a connect timeout without leaving the machine.
class blackhole {
 public:
  blackhole() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_, 0) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("blackhole: bind/listen failed");
    port_ = ntohs(a.sin_port);
    // Fill the accept queue (backlog 0 admits one; a few more make sure), without accepting.
    for (int i = 0; i < 4; ++i) {
      int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
      fillers_.push_back(c);
    }
    // Wait for the queued ones to complete their handshake.
    for (int c : fillers_) {
      pollfd p{c, POLLOUT, 0};
      ::poll(&p, 1, 200);
    }
  }
  blackhole(const blackhole&) = delete;
  blackhole& operator=(const blackhole&) = delete;
  ~blackhole() {
    for (int c : fillers_) ::close(c);
    ::close(listen_);
  }
  /// "http://127.0.0.1:<port>"
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int listen_ = -1;
  std::uint16_t port_ = 0;
  std::vector<int> fillers_;
};

}  // namespace holdfast_test
