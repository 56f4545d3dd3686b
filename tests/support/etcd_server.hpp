// tests/support/etcd_server.hpp — a real single-member etcd for a test, on free loopback ports.
//
// Starts /usr/bin/etcd (Debian package etcd-server, 3.4) with its data in a fresh directory
// (on /dev/shm when writable, else the temp dir) and client and peer URLs on free 127.0.0.1 ports,
// waits until /health answers true (with a deadline), and on stop() or destruction terminates it
// (SIGTERM, then SIGKILL) and removes the directories. The etcd process never outlives the test
// process: it gets PR_SET_PDEATHSIG(SIGKILL), so a test ended by CTest's TIMEOUT or a crash
// takes its servers with it (its scratch directories stay behind then). When etcd is missing the
// constructor throws, so the test FAILS (never skips): with CI=true the message says CI must
// install it; otherwise it names the Debian package to install.
//
// shared_etcd() is the binary's one server, for the tests whose cases share it (each case in a
// namespace of its own).
//
// etcd_member (one etcd process: start, health, signals) and etcd_scratch (where members keep
// their data and logs) are shared with etcd_cluster.hpp.
//
// A member may serve its clients over TLS (etcd_tls_spec: server certificate and key, optional
// client-certificate authentication, auth token TTL): its client URL is then https:// and its
// health is read from a plain-http metrics listener (--listen-metrics-urls), so this header
// needs no TLS library.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
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
#include <future>  // fork_on_lasting_thread
#include <holdfast/detail/http.hpp>
#include <optional>
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

/// `count` distinct free loopback ports.
inline std::vector<std::uint16_t> free_loopback_ports(std::size_t count) {
  std::vector<std::uint16_t> out;
  while (out.size() < count) {
    std::uint16_t p = free_loopback_port();
    bool seen = false;
    for (auto q : out) seen = seen || q == p;
    if (!seen) out.push_back(p);
  }
  return out;
}

/// "http://127.0.0.1:PORT"
inline std::string loopback_url(std::uint16_t port) {
  return "http://127.0.0.1:" + std::to_string(port);
}

/// Where etcd members keep their data (on /dev/shm when it is writable and roomy: etcd fsyncs
/// its WAL on every write, which costs nothing on tmpfs, so a loaded disk cannot push a test's
/// requests past their timeouts) and their logs (a temp dir). Removed by the creating process.
class etcd_scratch {
 public:
  etcd_scratch() : dir_("etcd"), owner_(::getpid()) {
    std::string shm = "/dev/shm/holdfast-etcd-XXXXXX";
    if (shm_has_room() && ::mkdtemp(shm.data())) shm_ = shm;
  }
  etcd_scratch(const etcd_scratch&) = delete;
  etcd_scratch& operator=(const etcd_scratch&) = delete;
  ~etcd_scratch() {
    if (::getpid() != owner_ || shm_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(shm_, ec);
  }
  /// A data directory path (not created) named `name`.
  std::string data_dir(const std::string& name) const {
    return (shm_.empty() ? dir_.path() : shm_) + "/" + name;
  }
  /// A log file path named `name`.
  std::string log_path(const std::string& name) const { return dir_ / name; }

 private:
  // etcd preallocates a 64 MiB WAL segment: a container's default /dev/shm (64 MiB) is too small.
  static bool shm_has_room() {
    struct statvfs st {};
    if (::access("/dev/shm", W_OK) != 0 || ::statvfs("/dev/shm", &st) != 0) return false;
    return static_cast<unsigned long long>(st.f_bavail) * st.f_frsize >= (1ull << 30);
  }

  temp_dir dir_;
  std::string shm_;
  pid_t owner_;
};

/// TLS on a member's client URL (peers stay plain http on loopback).
struct etcd_tls_spec {
  std::string cert_file, key_file;  ///< the server's certificate and key (PEM)
  std::string trusted_ca_file;      ///< with client_cert_auth: the CA of client certificates
  bool client_cert_auth = false;    ///< --client-cert-auth: clients must present a certificate
  int auth_token_ttl = 0;           ///< --auth-token-ttl in seconds; 0: etcd's default (300)
};

/// What an etcd member is: its name, data directory, log file, ports and the flags that place
/// it in its cluster (--initial-cluster and the like).
struct etcd_member_spec {
  std::string name, data_dir, log_path;
  std::uint16_t client_port = 0, peer_port = 0;
  std::vector<std::string> cluster_args;
  std::optional<etcd_tls_spec> tls = std::nullopt;  ///< serve clients over https://
  std::uint16_t metrics_port = 0;                   ///< with tls: the plain-http /health port
};

/// One etcd process: started, checked for health, frozen, killed; SIGKILLed (and reaped) on
/// destruction by the process that made it.
class etcd_member {
 public:
  /// Describes the member; start() runs it.
  explicit etcd_member(etcd_member_spec spec) : spec_(std::move(spec)), owner_(::getpid()) {}
  etcd_member(const etcd_member&) = delete;
  etcd_member& operator=(const etcd_member&) = delete;
  ~etcd_member() {
    if (::getpid() == owner_) kill_now();
  }

  /// "http://127.0.0.1:CLIENT_PORT" ("https://..." for a TLS member)
  std::string url() const {
    return spec_.tls ? "https://127.0.0.1:" + std::to_string(spec_.client_port)
                     : loopback_url(spec_.client_port);
  }
  /// The client port.
  std::uint16_t port() const { return spec_.client_port; }
  /// The process id (0 when not running).
  pid_t pid() const { return pid_; }
  /// True while the process runs (frozen or not).
  bool running() const { return pid_ > 0; }
  /// True between freeze() and thaw().
  bool frozen() const { return frozen_; }

  /// Forks and execs etcd on the spec's data directory and ports (a data directory that exists
  /// is reused: the member rejoins its cluster). The etcd dies with the test process
  /// (PR_SET_PDEATHSIG), however that ends.
  void start() {
    std::vector<std::string> args = command_line();
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = fork_on_lasting_thread([&] { exec_child(argv, parent); });
    if (pid_ < 0) throw std::runtime_error("fork failed");
    frozen_ = false;
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }

  /// One GET /health: "" when it answers true, else why not.
  std::string health_problem(std::chrono::milliseconds timeout) const {
    namespace hd = holdfast::detail;
    try {
      const std::uint16_t port = spec_.tls ? spec_.metrics_port : spec_.client_port;
      auto r = hd::http_call(hd::http_endpoint{"127.0.0.1", port},
                             hd::http_request{"GET", "/health", {}, {}},
                             hd::http_timeouts{std::chrono::milliseconds(200), timeout});
      if (r.status == 200 && r.body.find("\"true\"") != std::string::npos) return "";
      return "status " + std::to_string(r.status) + ": " + r.body;
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  /// Waits until /health answers true; throws std::runtime_error (with the log's tail) when the
  /// process exits or `timeout` passes first.
  void wait_healthy(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string last = "no answer";
    while (std::chrono::steady_clock::now() < deadline) {
      if (reap_if_exited())
        throw std::runtime_error("etcd " + spec_.name + " exited; log:\n" + log_tail());
      last = health_problem(std::chrono::milliseconds(1000));
      if (last.empty()) return;
      // Not serving yet: wait a little for the process to change state (or exit) and retry.
      pollfd p{pidfd_, POLLIN, 0};
      ::poll(&p, 1, 20);
    }
    throw std::runtime_error("etcd " + spec_.name + " at " + url() + " not healthy within " +
                             std::to_string(timeout.count()) + " ms (" + last + "); log:\n" +
                             log_tail());
  }

  /// Terminates it (SIGTERM, SIGKILL after 5 s) and waits for it; idempotent.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (frozen_) thaw();  // a stopped process handles SIGTERM only once continued
    if (!wait_exit(std::chrono::seconds(5))) kill_now();
    pid_ = 0;
  }
  /// Kills it with SIGKILL at once (a crash) and reaps it; idempotent.
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    wait_exit(std::chrono::seconds(10));
    pid_ = 0;
    frozen_ = false;
  }

  /// Freezes it with SIGSTOP and returns once it is stopped (kill alone returns before the
  /// stop takes effect, and a request sent at once could still be served): a hung server.
  void freeze() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGSTOP);
    siginfo_t si{};
    while (::waitid(P_PID, static_cast<id_t>(pid_), &si, WSTOPPED | WEXITED | WNOWAIT) != 0 &&
           errno == EINTR) {
    }
    frozen_ = true;
  }
  /// Resumes a frozen member (SIGCONT).
  void thaw() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
    frozen_ = false;
  }

  /// The last `max_bytes` of its log, for failure messages.
  std::string log_tail(std::size_t max_bytes = 2000) const {
    std::ifstream in(spec_.log_path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
  }

 private:
  std::vector<std::string> command_line() const {
    const std::string client = url(), peer = loopback_url(spec_.peer_port);
    std::vector<std::string> args = {etcd_binary(),  "--name",
                                     spec_.name,     "--data-dir",
                                     spec_.data_dir, "--listen-client-urls",
                                     client,         "--advertise-client-urls",
                                     client,         "--listen-peer-urls",
                                     peer,           "--initial-advertise-peer-urls",
                                     peer,           "--logger",
                                     "zap",          "--log-level",
                                     "warn"};
    args.insert(args.end(), spec_.cluster_args.begin(), spec_.cluster_args.end());
    if (spec_.tls) {
      const etcd_tls_spec& t = *spec_.tls;
      args.insert(args.end(), {"--cert-file", t.cert_file, "--key-file", t.key_file,
                               "--listen-metrics-urls", loopback_url(spec_.metrics_port)});
      if (!t.trusted_ca_file.empty()) {
        args.push_back("--trusted-ca-file");
        args.push_back(t.trusted_ca_file);
      }
      if (t.client_cert_auth) args.push_back("--client-cert-auth");
      if (t.auth_token_ttl > 0) {
        args.push_back("--auth-token-ttl");
        args.push_back(std::to_string(t.auth_token_ttl));
      }
    }
    return args;
  }

  // PR_SET_PDEATHSIG fires when the thread that forked exits, not the process: fork on the main
  // thread, which lives as long as the process, or else on a thread parked for the process's
  // life (a member started from a test's worker thread outlives that thread). Returns the pid.
  template <class F>
  static pid_t fork_on_lasting_thread(F&& in_child) {
    if (::syscall(SYS_gettid) == ::getpid()) {
      pid_t pid = ::fork();
      if (pid == 0) in_child();
      return pid;
    }
    std::promise<pid_t> forked;
    std::future<pid_t> pid = forked.get_future();
    std::thread([forked = std::move(forked), &in_child]() mutable {
      pid_t p = ::fork();
      if (p == 0) in_child();
      forked.set_value(p);
      for (;;) ::pause();  // parked: its exit would kill the member
    }).detach();
    return pid.get();
  }

  [[noreturn]] void exec_child(std::vector<char*>& argv, pid_t parent) const {
    // Dies with the test process: CTest's TIMEOUT (SIGTERM, then SIGKILL) or a crash must not
    // leave etcd servers running. A parent that died before the prctl is caught by getppid.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
    int fd = ::open(spec_.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nul >= 0) ::dup2(nul, 0);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }

  // Reaps the process when it has exited; true then.
  bool reap_if_exited() {
    int status = 0;
    if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = 0;
    close_pidfd();
    return true;
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
    close_pidfd();
    return true;
  }

  void close_pidfd() {
    if (pidfd_ >= 0) ::close(pidfd_);
    pidfd_ = -1;
  }

  etcd_member_spec spec_;
  pid_t owner_;
  pid_t pid_ = 0;
  int pidfd_ = -1;
  bool frozen_ = false;
};

/// A running single-member etcd for one test.
class etcd_server {
 public:
  /// Starts etcd and waits up to `ready_timeout` for it to be healthy; throws on failure, with
  /// the tail of etcd's log in the message.
  explicit etcd_server(std::chrono::milliseconds ready_timeout = std::chrono::seconds(20))
      : etcd_server(std::nullopt, ready_timeout) {}

  /// As above, serving clients over TLS as `tls` says (url() is then https://).
  explicit etcd_server(std::optional<etcd_tls_spec> tls,
                       std::chrono::milliseconds ready_timeout = std::chrono::seconds(20))
      : tls_(std::move(tls)) {
    require_etcd();
    std::string last;
    for (int attempt = 0; attempt < 3; ++attempt) {  // a port may be taken between probe and bind
      try {
        start(ready_timeout);
        return;
      } catch (const std::exception& e) {
        last = e.what();
        if (member_) member_->kill_now();
      }
    }
    throw std::runtime_error(last);
  }
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;
  ~etcd_server() {
    if (::getpid() == owner_) stop();
  }

  /// "http://127.0.0.1:PORT" ("https://..." with TLS), for etcd_options::endpoints.
  std::string url() const { return member_->url(); }
  /// The client port.
  std::uint16_t port() const { return member_->port(); }
  /// The process id of etcd (0 once stopped).
  pid_t pid() const { return member_->pid(); }
  /// True while etcd runs.
  bool running() const { return member_->running(); }

  /// Terminates etcd (SIGTERM, SIGKILL after 5 s) and waits for it; idempotent.
  void stop() { member_->stop(); }
  /// Kills etcd with SIGKILL at once (a crashed server).
  void kill_now() { member_->kill_now(); }
  /// Freezes etcd with SIGSTOP and returns once it is stopped: a hung server.
  void freeze() { member_->freeze(); }
  /// Resumes a frozen etcd (SIGCONT).
  void thaw() { member_->thaw(); }
  /// The last `max_bytes` of etcd's log, for failure messages.
  std::string log_tail(std::size_t max_bytes = 2000) const { return member_->log_tail(max_bytes); }

 private:
  void start(std::chrono::milliseconds ready_timeout) {
    const auto ports = free_loopback_ports(3);
    const std::string peer_url = loopback_url(ports[1]);
    // one member: a short election gets it serving in ~0.1 s
    member_.emplace(etcd_member_spec{"holdfast-test",
                                     scratch_.data_dir("data-" + std::to_string(ports[0])),
                                     scratch_.log_path("etcd.log"),
                                     ports[0],
                                     ports[1],
                                     {"--initial-cluster", "holdfast-test=" + peer_url,
                                      "--heartbeat-interval", "20", "--election-timeout", "200"},
                                     tls_,
                                     ports[2]});
    member_->start();
    member_->wait_healthy(ready_timeout);
  }

  etcd_scratch scratch_;
  pid_t owner_ = ::getpid();
  std::optional<etcd_tls_spec> tls_;
  std::optional<etcd_member> member_;  // declared last: destroyed (killed) before its scratch
};

/// The test binary's one etcd, started on first use (starting etcd takes ~1 s).
inline etcd_server& shared_etcd() {
  static etcd_server server;
  return server;
}

}  // namespace holdfast_test
