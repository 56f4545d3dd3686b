// tests/fuzz/fuzz_support.hpp — what the libFuzzer targets share: the input as text, a check that
// aborts with a message (a finding, like a sanitizer report), and scripted_io, an Io policy whose
// sockets replay canned HTTP responses, so the HTTP client and the code above it parse fuzzed
// bytes exactly as they would parse a server's.
//
// Every target swallows holdfast::error (and its subclasses) only: any other exception escapes
// LLVMFuzzerTestOneInput, std::terminate aborts, and libFuzzer saves the input as crash-<sha1>.
#pragma once

#include <arpa/inet.h>   // htons, htonl
#include <netdb.h>       // addrinfo
#include <netinet/in.h>  // sockaddr_in for the fake address
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <holdfast/io.hpp>

namespace hf_fuzz {

/// The fuzzer's bytes as text.
inline std::string_view text(const std::uint8_t* data, std::size_t size) noexcept {
  return {reinterpret_cast<const char*>(data), size};
}

/// Aborts with `what`: a property of the parser does not hold (a finding, as a sanitizer's).
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// Aborts with `what` when `ok` is false.
inline void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

/// Aborts with `what` and the two values when they differ.
inline void check_equal(const std::string& a, const std::string& b, const char* what) {
  if (a == b) return;
  std::fprintf(stderr, "fuzz check failed: %s\n  first:  '%s'\n  second: '%s'\n", what, a.c_str(),
               b.c_str());
  std::fflush(stderr);
  std::abort();
}

/// An Io policy whose sockets are scripted: each connect takes the next canned response, recv
/// returns it `chunk` bytes at a time (0: all at once) and then end of stream; send swallows the
/// request. Name lookup gives 127.0.0.1 without asking anyone; no real socket is ever opened.
struct scripted_io : holdfast::posix_io {
  struct script_t {
    std::vector<std::string> responses;  // one per connection, in order
    std::size_t next = 0;                // the next response to serve
    std::size_t chunk = 0;               // bytes per recv (0: everything left)
    std::string_view current;            // what the open connection has left to send
    std::vector<std::string> requests;   // what the client sent, one string per connection
  };
  /// The script of the calls to come (one per process: fuzz targets run one input at a time).
  static script_t& script() noexcept {
    static script_t s;
    return s;
  }
  /// Replaces the script: these responses, served `chunk` bytes per recv.
  static void reset(std::vector<std::string> responses, std::size_t chunk) {
    script_t& s = script();
    s.responses = std::move(responses);
    s.next = 0;
    s.chunk = chunk;
    s.current = {};
    s.requests.clear();
  }

  static constexpr int fake_fd = 1 << 20;  // above any real descriptor

  static int socket(int, int, int) noexcept { return fake_fd; }
  static int connect(int, const sockaddr*, socklen_t) noexcept {
    script_t& s = script();
    if (s.next >= s.responses.size()) {
      errno = ECONNREFUSED;
      return -1;
    }
    s.current = s.responses[s.next++];
    s.requests.emplace_back();
    return 0;
  }
  static int getsockopt(int, int, int, void* val, socklen_t* len) noexcept {
    if (val && len && *len >= sizeof(int)) std::memset(val, 0, sizeof(int));
    return 0;
  }
  static ssize_t send(int, const void* buf, std::size_t n, int) noexcept {
    script_t& s = script();
    if (!s.requests.empty()) s.requests.back().append(static_cast<const char*>(buf), n);
    return static_cast<ssize_t>(n);
  }
  static ssize_t recv(int, void* buf, std::size_t n, int) noexcept {
    script_t& s = script();
    std::size_t take = s.current.size() < n ? s.current.size() : n;
    if (s.chunk != 0 && take > s.chunk) take = s.chunk;
    if (take) std::memcpy(buf, s.current.data(), take);
    s.current.remove_prefix(take);
    return static_cast<ssize_t>(take);
  }
  static int poll(pollfd* fds, nfds_t n, int) noexcept {
    for (nfds_t i = 0; i < n; ++i) fds[i].revents = fds[i].events;
    return static_cast<int>(n);
  }
  static int getaddrinfo(const char*, const char*, const addrinfo*, addrinfo** out) noexcept {
    static sockaddr_in sa{};
    static addrinfo ai{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(80);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ai.ai_family = AF_INET;
    ai.ai_socktype = SOCK_STREAM;
    ai.ai_addr = reinterpret_cast<sockaddr*>(&sa);
    ai.ai_addrlen = sizeof sa;
    ai.ai_next = nullptr;
    *out = &ai;
    return 0;
  }
  static void freeaddrinfo(addrinfo*) noexcept {}
  static int close(int fd) noexcept { return fd == fake_fd ? 0 : holdfast::posix_io::close(fd); }
};

/// An HTTP/1.1 response with `status`, a Content-Length and `body`.
inline std::string http_ok(std::string_view body, int status = 200) {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

}  // namespace hf_fuzz
