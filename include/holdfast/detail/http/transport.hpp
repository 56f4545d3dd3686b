// holdfast/detail/http/transport.hpp — the transport seam: how the HTTP client makes a
// connection. The Transport contract (check_transport, is_transport_v, the C++20 concept),
// plain_transport<Io> (TCP over the Io policy, the default everywhere), connect_tcp (the TCP
// part of every transport), wait_socket (the one wait every transport uses) and tls_options
// (what a TLS transport reads).
//
// A TLS transport (examples/tls/openssl_transport.hpp) wraps the same socket calls, so the
// library itself depends on nothing but the standard library and POSIX.
//
// Guarantees:
//   - Every socket call goes through `Io::` (socket, connect, getsockopt, send, recv, poll,
//     getaddrinfo), so tests fail any of them with testing::fault_io. EINTR is retried.
//   - Connecting never blocks past its timeout (non-blocking connect + poll, each address in
//     turn; a TLS transport's handshake shares the budget). Failures throw holdfast::error
//     naming the operation ("resolve", "socket", "connect") and the URL: ECONNREFUSED,
//     ETIMEDOUT ("no connection within N ms"), EHOSTUNREACH, or the errno of the call.
//   - No SIGPIPE: plain_transport sends with MSG_NOSIGNAL.
//   - wait_socket with a cancel flag (std::atomic<bool>) waits in ~20 ms slices and throws
//     ECANCELED once it is set, so a polling thread never holds up shutdown.
//   - check_transport<T>()'s static_asserts name the first member a Transport lacks.
// Caveats:
//   - Name lookup (getaddrinfo) cannot be timed out; use numeric addresses where a lookup may
//     hang (the cloud notices default to 169.254.169.254 for that reason).
//   - https:// endpoints need a TLS transport; plain_transport refuses them (EPROTONOSUPPORT).
#pragma once

#include <netdb.h>       // getaddrinfo, gai_strerror
#include <netinet/in.h>  // sockaddr_in for the address family checks
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "../../error.hpp"
#include "../../io.hpp"  // posix_io, detail::detect
#include "endpoint.hpp"  // http_endpoint: transport_endpoint
#include "message.hpp"   // http_clock

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// With a cancel flag, waits are cut into slices this long so cancelling takes effect promptly.
inline constexpr int http_cancel_slice_ms = 20;

/// Milliseconds left until `deadline`, rounded up, clamped to [0, INT_MAX] for poll.
inline int http_poll_ms(http_clock::time_point deadline) noexcept {
  auto left = deadline - http_clock::now();
  if (left <= http_clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

}  // namespace detail

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

HOLDFAST_NAMESPACE_END
