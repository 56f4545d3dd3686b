// tests/support/tls_certs.hpp — certificates for the TLS tests, made with the openssl command line
// in a fresh temp directory: a CA, a server certificate for 127.0.0.1 (IP SAN), a client
// certificate, and the bad ones (another CA, an expired, a self-signed and a wrong-host server
// certificate). EC P-256 keys: quick to make and to handshake with. When the openssl command is
// missing the constructor throws (the test FAILS, never skips), naming the Debian package.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "temp_dir.hpp"

namespace holdfast_test {

/// Throws std::runtime_error with install advice when /usr/bin/openssl is missing.
inline void require_openssl_cli() {
  if (::access("/usr/bin/openssl", X_OK) == 0) return;
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true")
    throw std::runtime_error(
        "the openssl command is required in CI: tests/run must install the Debian package openssl");
  throw std::runtime_error("the TLS tests need /usr/bin/openssl: sudo apt-get install openssl");
}

/// A set of PEM files for one test binary.
struct tls_certs {
  temp_dir dir{"tls-certs"};
  std::string ca = dir / "ca.crt";                    ///< signs everything below
  std::string other_ca = dir / "other-ca.crt";        ///< a CA that signed none of these
  std::string server_cert = dir / "server.crt";       ///< CN and IP SAN 127.0.0.1, signed by ca
  std::string server_key = dir / "server.key";        ///< the key of every server certificate
  std::string expired_cert = dir / "expired.crt";     ///< as server_cert, expired yesterday
  std::string self_signed = dir / "self-signed.crt";  ///< as server_cert, signed by itself
  std::string wrong_host = dir / "wrong-host.crt";    ///< SANs wrong.example and 10.9.9.9
  std::string client_cert = dir / "client.crt";       ///< CN root, clientAuth, signed by ca
  std::string client_key = dir / "client.key";

  tls_certs() {
    require_openssl_cli();
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string sign = "openssl x509 -req -CA ca.crt -CAkey ca.key -CAcreateserial";
    const std::string script =
        "set -e; cd '" + dir.path() + "'\n" + "openssl req -x509 " + ec +
        " -keyout ca.key -out ca.crt -days 2 -subj /CN=holdfast-ca\n" + "openssl req -x509 " + ec +
        " -keyout other.key -out other-ca.crt -days 2 -subj /CN=holdfast-other-ca\n" +
        "openssl req " + ec + " -keyout server.key -out server.csr -subj /CN=127.0.0.1\n" +
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > "
        "server.ext\n" +
        sign + " -in server.csr -out server.crt -days 2 -extfile server.ext\n" + sign +
        " -in server.csr -out expired.crt -days -1 -extfile server.ext\n" +
        "printf 'subjectAltName=DNS:wrong.example,IP:10.9.9.9\\nextendedKeyUsage=serverAuth,"
        "clientAuth\\n' > wrong.ext\n" +
        sign + " -in server.csr -out wrong-host.crt -days 2 -extfile wrong.ext\n" +
        "openssl x509 -req -in server.csr -signkey server.key -out self-signed.crt -days 2 "
        "-extfile server.ext\n" +
        "openssl req " + ec + " -keyout client.key -out client.csr -subj /CN=root\n" +
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n" + sign +
        " -in client.csr -out client.crt -days 2 -extfile client.ext\n";
    const std::string log = dir / "openssl.log";
    const std::string cmd = "/bin/sh '" + write(dir / "make.sh", script) + "' > '" + log + "' 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream in(log);
      std::stringstream ss;
      ss << in.rdbuf();
      throw std::runtime_error("making test certificates failed:\n" + ss.str());
    }
  }

  /// Writes `text` to `path`; returns the path.
  static std::string write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
    return path;
  }
};

}  // namespace holdfast_test
