// tests/support/etcd_server.hpp — a real single-member etcd for a test, on free loopback ports.
//
// Starts /usr/bin/etcd (Debian package etcd-server, 3.4) with its data in a fresh directory
// (on /dev/shm when writable, else the temp dir) and client and peer URLs on free 127.0.0.1 ports,
// waits until /health answers true (with a deadline), and on stop() or destruction terminates it
// (SIGTERM, then SIGKILL) and removes the directories. When etcd is missing the constructor throws,
// so the test FAILS (never skips): with CI=true the message says CI must install it; otherwise it
// names the Debian package to install.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <holdfast/detail/http.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "temp_dir.hpp"

namespace holdfast_test {

/// Where the etcd binary is expected: $HOLDFAST_TEST_ETCD when set (tests of the missing-etcd
/// path use it), else /usr/bin/etcd.
inline std::string etcd_binary() {
  const char* env = std::getenv("HOLDFAST_TEST_ETCD");
  return env && *env ? env : "/usr/bin/etcd";
}

/// Throws std::runtime_error with install advice when etcd is missing (a failure, not a skip).
inline void require_etcd() {
  const std::string bin = etcd_binary();
  if (::access(bin.c_str(), X_OK) == 0) return;
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true")
    throw std::runtime_error("etcd is required in CI but " + bin +
                             " is missing: tests/run must install the Debian package etcd-server");
  throw std::runtime_error("etcd tests need " + bin +
                           ": install the Debian package etcd-server "
                           "(sudo apt-get install etcd-server)");
}

/// A free TCP port on 127.0.0.1 (bound to port 0, then released).
inline std::uint16_t free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind/getsockname failed");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// A running etcd member for one test.
class etcd_server {
 public:
  /// Starts etcd and waits up to `ready_timeout` for it to be healthy; throws on failure, with
  /// the tail of etcd's log in the message.
  explicit etcd_server(std::chrono::milliseconds ready_timeout = std::chrono::seconds(20))
      : dir_("etcd") {
    require_etcd();
    owner_ = ::getpid();
    // etcd fsyncs its WAL on every write; on tmpfs that costs nothing, so a loaded disk cannot
    // push a test's requests past their timeouts. Falls back to the temp dir.
    std::string shm = "/dev/shm/holdfast-etcd-XXXXXX";
    if (shm_has_room() && ::mkdtemp(shm.data())) shm_ = shm;
    data_root_ = shm_.empty() ? dir_.path() : shm_;
    std::string last;
    for (int attempt = 0; attempt < 3; ++attempt) {  // a port may be taken between probe and bind
      try {
        start(ready_timeout);
        return;
      } catch (const std::exception& e) {
        last = e.what();
        kill_now();
      }
    }
    remove_shm();
    throw std::runtime_error(last);
  }
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;
  ~etcd_server() {
    if (::getpid() != owner_) return;
    stop();
    remove_shm();
  }

  /// "http://127.0.0.1:PORT", for etcd_options::endpoints.
  std::string url() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  /// The client port.
  std::uint16_t port() const { return client_port_; }
  /// The process id of etcd (0 once stopped).
  pid_t pid() const { return pid_; }
  /// True while etcd runs.
  bool running() const { return pid_ > 0; }

  /// Terminates etcd (SIGTERM, SIGKILL after 5 s) and waits for it; idempotent.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (!wait_exit(std::chrono::seconds(5))) kill_now();
    pid_ = 0;
  }
  /// Kills etcd with SIGKILL at once (a crashed server).
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    wait_exit(std::chrono::seconds(10));
    pid_ = 0;
  }

  /// Freezes etcd with SIGSTOP and returns once it is stopped (kill alone returns before the
  /// stop takes effect, and a request sent at once could still be served): a hung server.
  void freeze() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGSTOP);
    siginfo_t si{};
    while (::waitid(P_PID, static_cast<id_t>(pid_), &si, WSTOPPED | WEXITED | WNOWAIT) != 0 &&
           errno == EINTR) {
    }
  }
  /// Resumes a frozen etcd (SIGCONT).
  void thaw() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  /// The last `max_bytes` of etcd's log, for failure messages.
  std::string log_tail(std::size_t max_bytes = 2000) const {
    std::ifstream in(dir_ / "etcd.log");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
  }

 private:
  void start(std::chrono::milliseconds ready_timeout) {
    client_port_ = free_loopback_port();
    std::uint16_t peer = free_loopback_port();
    while (peer == client_port_) peer = free_loopback_port();
    const std::string client = url();
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    const std::string data = data_root_ + "/data-" + std::to_string(client_port_);
    std::vector<std::string> args = {
        etcd_binary(), "--name", "holdfast-test", "--data-dir", data, "--listen-client-urls",
        client, "--advertise-client-urls", client, "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url, "--initial-cluster", "holdfast-test=" + peer_url,
        // one member: a short election gets it serving in ~0.1 s
        "--heartbeat-interval", "20", "--election-timeout", "200", "--logger", "zap", "--log-level",
        "warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir_ / "etcd.log";
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      int nul = ::open("/dev/null", O_RDONLY);
      if (nul >= 0) ::dup2(nul, 0);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    wait_healthy(ready_timeout);
  }

  void wait_healthy(std::chrono::milliseconds timeout) {
    namespace hd = holdfast::detail;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const hd::http_endpoint ep{"127.0.0.1", client_port_};
    std::string last = "no answer";
    while (std::chrono::steady_clock::now() < deadline) {
      if (exited()) {
        pid_ = 0;
        ::close(pidfd_);
        pidfd_ = -1;
        throw std::runtime_error("etcd exited during start-up; log:\n" + log_tail());
      }
      try {
        auto r = hd::http_call(
            ep, hd::http_request{"GET", "/health", {}, {}},
            hd::http_timeouts{std::chrono::milliseconds(200), std::chrono::milliseconds(1000)});
        if (r.status == 200 && r.body.find("\"true\"") != std::string::npos) return;
        last = "status " + std::to_string(r.status) + ": " + r.body;
      } catch (const std::exception& e) {
        last = e.what();
      }
      // Not serving yet: wait a little for the process to change state (or exit) and retry.
      pollfd p{pidfd_, POLLIN, 0};
      ::poll(&p, 1, 20);
    }
    throw std::runtime_error("etcd at " + url() + " not healthy within " +
                             std::to_string(timeout.count()) + " ms (" + last + "); log:\n" +
                             log_tail());
  }

  // etcd preallocates a 64 MiB WAL segment: use /dev/shm only when it is writable and roomy
  // (a container's default /dev/shm is 64 MiB).
  static bool shm_has_room() {
    struct statvfs st {};
    if (::access("/dev/shm", W_OK) != 0 || ::statvfs("/dev/shm", &st) != 0) return false;
    return static_cast<unsigned long long>(st.f_bavail) * st.f_frsize >= (1ull << 30);
  }

  void remove_shm() {
    if (shm_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(shm_, ec);
    shm_.clear();
  }

  bool exited() {
    int status = 0;
    return pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_;
  }

  bool wait_exit(std::chrono::milliseconds timeout) {
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      int n;
      do n = ::poll(&p, 1, static_cast<int>(timeout.count()));
      while (n < 0 && errno == EINTR);
      if (n == 0) return false;
    }
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    if (pidfd_ >= 0) ::close(pidfd_);
    pidfd_ = -1;
    return true;
  }

  temp_dir dir_;
  std::string shm_;        // etcd's data directory on tmpfs, when /dev/shm is writable
  std::string data_root_;  // shm_ or dir_
  pid_t owner_ = 0;
  pid_t pid_ = 0;
  int pidfd_ = -1;
  std::uint16_t client_port_ = 0;
};

}  // namespace holdfast_test
