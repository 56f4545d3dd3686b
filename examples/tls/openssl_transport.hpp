// examples/tls/openssl_transport.hpp — a TLS Transport for holdfast, over OpenSSL (1.1.1 or 3.x).
//
// holdfast's headers depend on nothing but the standard library and POSIX; they carry the
// transport seam (holdfast/detail/http.hpp: plain_transport, check_transport) and the TLS
// settings (holdfast::tls_options in etcd_options::tls). This header is the TLS layer a host
// copies or includes: add examples/tls to the include path and link OpenSSL (CMake:
// find_package(OpenSSL) and OpenSSL::SSL).
//
//   using tls = holdfast_tls::openssl_transport<>;
//   holdfast::basic_etcd_kv<holdfast::posix_io, tls> kv(options, {"run-7", 0});  // https://
//   holdfast::any_kv any = holdfast::make_kv<tls>(
//       "etcds://10.0.0.5:2379?ca=/etc/etcd/ca.pem&user=trainer&password_file=/run/pw", ns);
//
// Guarantees:
//   - OpenSSL never touches the socket: it reads and writes memory BIOs, and every socket call
//     (socket, connect, send, recv, poll) goes through the Io policy, so testing::fault_io fails
//     them under TLS as it does without.
//   - The server's certificate chain is verified against tls_options::ca_file (the system's
//     store when empty) and its name against tls_options::server_name or else the endpoint's
//     host (an IP address against the certificate's IP SANs, a name against its DNS SANs). Only
//     tls_options::insecure_skip_verify turns verification off.
//   - TLS 1.2 or later. TCP connect and handshake together finish within the connect timeout or
//     throw holdfast::error(errno, "tls handshake", endpoint, reason): ETIMEDOUT (no handshake in
//     time: a server that accepts and never answers), ECONNRESET (closed during the handshake),
//     EPROTO (not a TLS server, or a certificate refused: "certificate verify failed: <why>").
//   - Bad settings throw holdfast::error when the transport is built ("tls ca_file", "tls
//     cert_file", "tls key_file"), naming the file and OpenSSL's reason.
//   - http:// endpoints get plain TCP connections: the endpoint's scheme decides.
// Caveats:
//   - The CA, certificate and key files are read by OpenSSL itself, not through the Io policy.
//   - No close_notify on close and no session resumption: every new connection makes a full
//     handshake (etcd_kv keeps connections alive, so that is once per pooled connection).
//   - With TLS 1.3 a server that refuses the client's certificate says so after the handshake:
//     the first request fails with EPROTO ("recv ... (tls: ... alert certificate required)").
#pragma once

#include <arpa/inet.h>  // inet_pton: is the name to verify an IP address?
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>  // X509_VERIFY_PARAM_set1_host / _ip_asc
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <holdfast/detail/http.hpp>
#include <memory>
#include <string>
#include <utility>

namespace holdfast_tls {

namespace detail {

// OpenSSL's queued error reasons, joined (and the queue cleared).
inline std::string openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    char buf[256];
    if (!reason) {
      ERR_error_string_n(e, buf, sizeof buf);
      reason = buf;
    }
    if (!out.empty()) out += "; ";
    out += reason;
  }
  return out;
}

inline bool is_ip_address(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// The errno for a settings file OpenSSL could not load: the file's own problem if it has one.
inline int file_errno(const std::string& path) {
  return ::access(path.c_str(), R_OK) != 0 ? errno : EINVAL;
}

}  // namespace detail

/// A holdfast Transport speaking TLS through OpenSSL memory BIOs over `Io`'s sockets.
template <class Io = holdfast::posix_io>
class openssl_transport {
 public:
  /// It can serve https:// endpoints.
  static constexpr bool speaks_tls = true;

  /// Builds the OpenSSL context: trust store, client certificate and key, verification.
  explicit openssl_transport(const holdfast::tls_options& options = {}) : opts_(options) {
    ERR_clear_error();
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) throw holdfast::error(ENOMEM, "tls setup", "", detail::openssl_errors());
    ctx_.reset(ctx, SSL_CTX_free);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_verify(ctx, opts_.insecure_skip_verify ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                       nullptr);
    if (!opts_.insecure_skip_verify) {
      if (opts_.ca_file.empty()) {
        if (SSL_CTX_set_default_verify_paths(ctx) != 1)
          throw holdfast::error(EINVAL, "tls ca_file", "",
                                "no system trust store: " + detail::openssl_errors());
      } else if (SSL_CTX_load_verify_locations(ctx, opts_.ca_file.c_str(), nullptr) != 1) {
        throw holdfast::error(detail::file_errno(opts_.ca_file), "tls ca_file", opts_.ca_file,
                              "cannot load the CA file: " + detail::openssl_errors());
      }
    }
    if (opts_.cert_file.empty() != opts_.key_file.empty())
      throw holdfast::error(EINVAL, "tls cert_file",
                            opts_.cert_file.empty() ? opts_.key_file : opts_.cert_file,
                            "a client certificate and its key go together");
    if (opts_.cert_file.empty()) return;
    if (SSL_CTX_use_certificate_chain_file(ctx, opts_.cert_file.c_str()) != 1)
      throw holdfast::error(detail::file_errno(opts_.cert_file), "tls cert_file", opts_.cert_file,
                            "cannot load the certificate: " + detail::openssl_errors());
    if (SSL_CTX_use_PrivateKey_file(ctx, opts_.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      throw holdfast::error(detail::file_errno(opts_.key_file), "tls key_file", opts_.key_file,
                            "cannot load the private key: " + detail::openssl_errors());
    if (SSL_CTX_check_private_key(ctx) != 1)
      throw holdfast::error(EINVAL, "tls key_file", opts_.key_file,
                            "the key does not match the certificate");
  }

  /// One connection: TLS for https://, plain TCP for http://. Closes on destruction.
  class connection {
   public:
    connection() noexcept = default;
    connection(connection&& o) noexcept { take(o); }
    connection& operator=(connection&& o) noexcept {
      if (this != &o) {
        close();
        take(o);
      }
      return *this;
    }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;
    ~connection() { close(); }

    /// Decrypted bytes, 0 at end of stream, -1 with errno (EAGAIN: poll fd() for wants();
    /// EPROTO: a TLS failure, see why()).
    long read(char* buf, std::size_t n) {
      want_ = POLLIN;
      if (!ssl_) return static_cast<long>(Io::recv(fd_, buf, n, 0));
      why_.clear();
      for (;;) {
        if (flush() <= 0) return -1;
        ERR_clear_error();
        const int r = SSL_read(ssl_, buf, clamp(n));
        if (r > 0) return r;
        const int e = SSL_get_error(ssl_, r);
        if (e == SSL_ERROR_ZERO_RETURN) return 0;  // close_notify
        if (e == SSL_ERROR_WANT_WRITE) continue;
        if (e != SSL_ERROR_WANT_READ) return fail();
        if (BIO_ctrl_pending(wbio_) > 0) continue;  // something to send first (a key update)
        const long got = fill();
        if (got > 0) continue;
        return got;  // 0: the peer closed; -1: errno (EAGAIN: wait for POLLIN)
      }
    }

    /// Encrypts and sends: bytes taken, -1 with errno (EAGAIN: poll fd() for wants()).
    long write(const char* buf, std::size_t n) {
      want_ = POLLOUT;
      if (!ssl_) return static_cast<long>(Io::send(fd_, buf, n, MSG_NOSIGNAL));
      why_.clear();
      for (;;) {
        if (flush() <= 0) return -1;
        ERR_clear_error();
        const int r = SSL_write(ssl_, buf, clamp(n));
        if (r > 0) return flush() < 0 ? -1 : r;  // the rest goes out with the next call
        const int e = SSL_get_error(ssl_, r);
        if (e == SSL_ERROR_WANT_WRITE) continue;
        if (e != SSL_ERROR_WANT_READ) return fail();
        const long got = fill();
        if (got > 0) continue;
        if (got == 0) errno = EPIPE;
        return -1;
      }
    }

    /// What the last EAGAIN waits for.
    short wants() const noexcept { return want_; }
    /// The socket.
    int fd() const noexcept { return fd_; }
    /// Decrypted bytes buffered that poll() on the socket will not show.
    bool pending() const noexcept { return ssl_ && SSL_pending(ssl_) > 0; }
    /// The last TLS failure ("" when errno says it all).
    std::string why() const { return why_; }
    /// Frees the TLS state and closes the socket (idempotent).
    void close() noexcept {
      if (ssl_) SSL_free(std::exchange(ssl_, nullptr));  // frees both BIOs
      rbio_ = wbio_ = nullptr;
      if (fd_ >= 0) Io::close(std::exchange(fd_, -1));
    }

   private:
    friend class openssl_transport;

    void take(connection& o) noexcept {
      fd_ = std::exchange(o.fd_, -1);
      ssl_ = std::exchange(o.ssl_, nullptr);
      rbio_ = std::exchange(o.rbio_, nullptr);
      wbio_ = std::exchange(o.wbio_, nullptr);
      out_ = std::move(o.out_);
      sent_ = std::exchange(o.sent_, 0);
      want_ = o.want_;
      why_ = std::move(o.why_);
    }

    static int clamp(std::size_t n) noexcept { return n > INT_MAX ? INT_MAX : static_cast<int>(n); }

    // Sends what OpenSSL wrote: 1 all sent, 0 the socket is full (errno EAGAIN, wants POLLOUT),
    // -1 failed (errno).
    int flush() {
      char tmp[16384];
      for (int n; (n = BIO_read(wbio_, tmp, sizeof tmp)) > 0;)
        out_.append(tmp, static_cast<std::size_t>(n));
      while (sent_ < out_.size()) {
        const ssize_t w = Io::send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
        if (w > 0) {
          sent_ += static_cast<std::size_t>(w);
          continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          want_ = POLLOUT;
          return 0;
        }
        if (w == 0) errno = EIO;
        return -1;
      }
      out_.clear();
      sent_ = 0;
      return 1;
    }

    // Feeds OpenSSL from the socket: bytes read, 0 at end of stream, -1 (errno; EAGAIN: wants
    // POLLIN).
    long fill() {
      char tmp[16384];
      for (;;) {
        const ssize_t r = Io::recv(fd_, tmp, sizeof tmp, 0);
        if (r > 0) {
          BIO_write(rbio_, tmp, static_cast<int>(r));
          return static_cast<long>(r);
        }
        if (r == 0) return 0;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) want_ = POLLIN;
        return -1;
      }
    }

    long fail() {
      const std::string errs = detail::openssl_errors();
      why_ = "tls: " + (errs.empty() ? std::string("protocol error") : errs);
      errno = EPROTO;
      return -1;
    }

    int fd_ = -1;
    SSL* ssl_ = nullptr;
    BIO* rbio_ = nullptr;  // socket -> OpenSSL
    BIO* wbio_ = nullptr;  // OpenSSL -> socket
    std::string out_;      // ciphertext not sent yet, from sent_ on
    std::size_t sent_ = 0;
    short want_ = POLLIN;
    std::string why_;
  };

  /// Connects to `ep` and, for https://, makes the TLS handshake, all within `timeout`.
  connection connect(const holdfast::transport_endpoint& ep, std::chrono::milliseconds timeout,
                     const std::string& where, const std::atomic<bool>* cancel) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    connection c;
    c.fd_ = holdfast::connect_tcp<Io>(ep, timeout, where, cancel);
    if (!ep.tls) return c;
    ERR_clear_error();
    c.ssl_ = SSL_new(ctx_.get());
    if (!c.ssl_) throw holdfast::error(ENOMEM, "tls handshake", where, detail::openssl_errors());
    c.rbio_ = BIO_new(BIO_s_mem());
    c.wbio_ = BIO_new(BIO_s_mem());
    if (!c.rbio_ || !c.wbio_) {
      if (c.rbio_) BIO_free(c.rbio_);
      if (c.wbio_) BIO_free(c.wbio_);
      c.rbio_ = c.wbio_ = nullptr;
      throw holdfast::error(ENOMEM, "tls handshake", where, detail::openssl_errors());
    }
    BIO_set_mem_eof_return(c.rbio_, -1);  // empty means "wait for more", not end of stream
    BIO_set_mem_eof_return(c.wbio_, -1);
    SSL_set_bio(c.ssl_, c.rbio_, c.wbio_);  // the SSL owns them now
    SSL_set_connect_state(c.ssl_);
    const std::string& name = opts_.server_name.empty() ? ep.host : opts_.server_name;
    const bool ip = detail::is_ip_address(name);
    if (!ip) SSL_set_tlsext_host_name(c.ssl_, name.c_str());
    if (!opts_.insecure_skip_verify) {
      X509_VERIFY_PARAM* param = SSL_get0_param(c.ssl_);
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      const int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                        : X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0);
      if (ok != 1)
        throw holdfast::error(EINVAL, "tls handshake", where, "cannot verify the name " + name);
    }
    handshake(c, deadline, timeout, where, cancel);
    return c;
  }

 private:
  void handshake(connection& c, std::chrono::steady_clock::time_point deadline,
                 std::chrono::milliseconds timeout, const std::string& where,
                 const std::atomic<bool>* cancel) const {
    auto wait = [&](short events) {
      if (!holdfast::wait_socket<Io>(c.fd_, events, deadline, cancel, where))
        throw holdfast::error(ETIMEDOUT, "tls handshake", where,
                              "no TLS handshake within " + std::to_string(timeout.count()) +
                                  " ms (is it a TLS server?)");
    };
    for (;;) {
      ERR_clear_error();
      const int r = SSL_do_handshake(c.ssl_);
      const int e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(c.ssl_, r);
      if (e != SSL_ERROR_NONE && e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
        throw holdfast::error(EPROTO, "tls handshake", where, failure(c));
      const int f = c.flush();
      if (f < 0) throw holdfast::error(errno, "tls handshake", where);
      if (f == 0) {
        wait(POLLOUT);
        continue;
      }
      if (e == SSL_ERROR_NONE) return;
      if (e == SSL_ERROR_WANT_WRITE) continue;
      const long got = c.fill();
      if (got > 0) continue;
      const int err = got == 0 ? ECONNRESET : errno;
      if (got == 0 || err == ECONNRESET)
        throw holdfast::error(ECONNRESET, "tls handshake", where,
                              std::string(got == 0 ? "the server closed" : "the server reset") +
                                  " the connection during the TLS handshake (not a TLS server? "
                                  "http:// endpoints speak plain HTTP)");
      if (err != EAGAIN && err != EWOULDBLOCK) throw holdfast::error(err, "tls handshake", where);
      wait(POLLIN);
    }
  }

  // Why a handshake failed: the certificate check's verdict, or OpenSSL's reasons.
  static std::string failure(const connection& c) {
    std::string errs = detail::openssl_errors();
    const long verdict = SSL_get_verify_result(c.ssl_);
    if (verdict != X509_V_OK)
      return std::string("certificate verify failed: ") + X509_verify_cert_error_string(verdict);
    for (const char* plain : {"wrong version number", "packet length too long", "unknown protocol",
                              "record layer failure"})
      if (errs.find(plain) != std::string::npos)
        return errs + " (not a TLS server? http:// endpoints speak plain HTTP)";
    return errs.empty() ? std::string("TLS handshake failed") : errs;
  }

  holdfast::tls_options opts_;
  std::shared_ptr<SSL_CTX> ctx_;
};

static_assert(holdfast::check_transport<openssl_transport<>>());

}  // namespace holdfast_tls
