// tests/support/multinode.hpp — several test "nodes" on one machine: network namespaces on a
// bridge, each with its own address, its own processes and a node-local directory, and a
// 3-member etcd spread over them.
//
// Layout (P is the test process's pid, so two runs never collide; every name fits IFNAMSIZ):
//   hfnPh        the hub namespace: bridge hfnPb, address 10.231.0.254/24
//   hfnPn<i>     node i (i = 0..hosts-1): veth hfnPv<i>, address 10.231.0.<i+1>/24, lo up;
//                its peer hfnPp<i> is a port of the bridge in the hub
//   <root>/shared       the run directory every node sees (checkpoints)
//   <root>/node-<i>     node i's local directory (empty on a fresh node)
// Only 10.231.0.0/24 is used, and only inside these namespaces: the root namespace gets no
// link, address or route, and nothing outside the namespaces is contacted.
//
// Guarantees:
//   - There are always at least 3 namespaces ("hosts"), so etcd runs as 3 members, one per
//     namespace: with 2 worker nodes the third is store-only, and a lost node costs at most one
//     member.
//   - While the harness exists, the thread that made it lives in the hub namespace: it reaches
//     every node's address, and no service of the host (127.0.0.1 there is the hub's own).
//     Processes it forks start there too; spawn() and enter() put them in a node.
//   - Every process spawned in a node dies with the test process (PR_SET_PDEATHSIG), however
//     that ends; the destructor SIGKILLs and reaps them, kills anything else still inside the
//     namespaces, deletes the namespaces (their links go with them) and the directories.
//   - The constructor first sweeps leftovers of runs that died: namespaces named hfn<pid>...
//     whose pid is gone (their processes are killed first), and their directories
//     (<scratch>/hfn<pid>-..., where etcd's data would otherwise pile up).
//   - Where namespaces cannot be made (no `ip`, no CAP_SYS_ADMIN, a kernel that refuses), the
//     constructor throws multinode_unavailable, naming the reason; tests turn that into a
//     failure when CI=true, a skip elsewhere (with_multinode, multinode_case.hpp).
// Caveats:
//   - Only the process (and thread) that made the harness may drive it; forked children use
//     enter() and nothing else.
//   - replace_etcd_member keeps etcd's default strict reconfiguration check: etcd refuses to
//     remove or add a member ("unhealthy cluster") until the others have been connected for 5 s,
//     so a replacement within 5 s of a start or of a member's loss waits for that.
//   - cut() takes the node's bridge port down: its packets are dropped, its own address stays
//     (processes there keep their sockets and time out, as on a real partition).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>  // setns, CLONE_NEWNET
#include <signal.h>
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <holdfast/detail/http.hpp>
#include <holdfast/detail/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "etcd_server.hpp"  // etcd_binary, require_etcd

namespace holdfast_test {

/// Namespaces cannot be made here; what() says why.
class multinode_unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace mn_detail {

using clock = std::chrono::steady_clock;

/// Runs `ip args...` and returns {exit code, stdout + stderr}; exit code 127 when `ip` cannot be
/// executed.
inline std::pair<int, std::string> ip(const std::vector<std::string>& args) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::vector<std::string> all = {"ip"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(p[1], 1);
    ::dup2(p[1], 2);
    ::execvp("ip", argv.data());
    ::_exit(127);
  }
  ::close(p[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) != 0;) {
    if (n > 0)
      out.append(buf, static_cast<std::size_t>(n));
    else if (errno != EINTR)
      break;
  }
  ::close(p[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

/// `ip args...`, throwing std::runtime_error with its output when it fails.
inline void ip_or_throw(const std::vector<std::string>& args) {
  auto [rc, out] = ip(args);
  if (rc == 0) return;
  std::string cmd = "ip";
  for (const auto& a : args) cmd += " " + a;
  throw std::runtime_error("multinode: `" + cmd + "` failed (" + std::to_string(rc) + "): " + out);
}

inline std::string netns_path(const std::string& name) { return "/run/netns/" + name; }

/// The inode of a named namespace (0 when it does not exist).
inline ino_t netns_inode(const std::string& name) {
  struct stat st {};
  return ::stat(netns_path(name).c_str(), &st) == 0 ? st.st_ino : 0;
}

/// The processes whose network namespace is the one with inode `ino`.
inline std::vector<pid_t> pids_in_netns(ino_t ino) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    struct stat st {};
    const std::string ns = std::string("/proc/") + e->d_name + "/ns/net";
    if (::stat(ns.c_str(), &st) == 0 && st.st_ino == ino) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

/// The named namespaces that exist now.
inline std::vector<std::string> netns_names() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/run/netns");
  if (!d) return out;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  ::closedir(d);
  return out;
}

/// SIGKILLs every process in namespace `name`, then deletes it (its links go with it).
inline void destroy_netns(const std::string& name) {
  if (const ino_t ino = netns_inode(name))
    for (pid_t pid : pids_in_netns(ino)) ::kill(pid, SIGKILL);
  ip({"netns", "del", name});
}

/// The pid a harness namespace name carries ("hfn<pid>..."), 0 when it is not one.
inline pid_t owner_of(const std::string& name) {
  if (name.rfind("hfn", 0) != 0) return 0;
  const long pid = std::strtol(name.c_str() + 3, nullptr, 10);
  return pid > 0 ? static_cast<pid_t>(pid) : 0;
}

/// Where the run's directories go: /dev/shm when it has room (etcd fsyncs on every write),
/// else $TMPDIR or /tmp.
inline std::string scratch_base() {
  struct statvfs st {};
  if (::access("/dev/shm", W_OK) == 0 && ::statvfs("/dev/shm", &st) == 0 &&
      static_cast<unsigned long long>(st.f_bavail) * st.f_frsize >= (1ull << 30))
    return "/dev/shm";
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

/// True when `name` is a harness's ("hfn<pid>...") and that process is gone.
inline bool stale(const std::string& name) {
  const pid_t owner = owner_of(name);
  if (owner <= 0 || owner == ::getpid()) return false;
  return ::kill(owner, 0) != 0 && errno == ESRCH;  // alive, or not ours to judge: kept
}

/// Deletes the namespaces and scratch directories of harnesses whose process is gone; returns
/// their names.
inline std::vector<std::string> sweep_stale() {
  std::vector<std::string> swept;
  for (const auto& name : netns_names())
    if (stale(name)) {
      destroy_netns(name);
      swept.push_back(name);
    }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(scratch_base(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.find('-') == std::string::npos || !stale(name)) continue;
    std::filesystem::remove_all(e.path(), ec);
    swept.push_back(name);
  }
  return swept;
}

/// Moves the calling thread into the namespace `fd` refers to.
inline void enter_netns_fd(int fd, const std::string& what) {
  if (::setns(fd, CLONE_NEWNET) != 0)
    throw std::runtime_error("multinode: setns into " + what + " failed: " + std::strerror(errno));
}

/// Waits up to `timeout` for `pid` (a child) to exit; its wait status, or nullopt.
inline std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    int n;
    do n = ::poll(&p, 1, static_cast<int>(timeout.count()));
    while (n < 0 && errno == EINTR);
    ::close(fd);
    if (n == 0) return std::nullopt;
  }
  int status = 0;
  pid_t r;
  while ((r = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (r != pid) return std::nullopt;
  return status;
}

}  // namespace mn_detail

/// A process running in a node.
struct node_process {
  int node = -1;
  pid_t pid = 0;
  std::string tag;      ///< what it is ("etcd", "worker-3", ...)
  bool exited = false;  ///< reaped
  int status = 0;       ///< its wait status once exited
  bool frozen = false;  ///< between freeze and thaw
};

/// Several nodes on one machine (see the top of this file).
class multinode {
 public:
  static constexpr int etcd_client_port = 2379;
  static constexpr int etcd_peer_port = 2380;

  /// Makes `nodes` worker nodes (2 or 3) and, with fewer than 3, store-only namespaces up to 3
  /// hosts. Throws multinode_unavailable when namespaces cannot be made here.
  explicit multinode(int nodes) : nodes_(nodes), hosts_(nodes < 3 ? 3 : nodes) {
    if (nodes < 1 || nodes > 8) throw std::invalid_argument("multinode: 1..8 nodes");
    prefix_ = "hfn" + std::to_string(::getpid());
    swept_ = mn_detail::sweep_stale();
    for (const auto& name : mn_detail::netns_names())  // a previous harness of this process
      if (name.rfind(prefix_, 0) == 0) mn_detail::destroy_netns(name);
    root_ = mn_detail::scratch_base() + "/" + prefix_ + "-XXXXXX";
    if (!::mkdtemp(root_.data())) throw std::runtime_error("multinode: mkdtemp " + root_);
    try {
      build();
    } catch (...) {
      teardown();
      throw;
    }
  }
  multinode(const multinode&) = delete;
  multinode& operator=(const multinode&) = delete;
  ~multinode() { teardown(); }

  /// Worker nodes.
  int nodes() const { return nodes_; }
  /// Namespaces hosting an etcd member or workers (at least 3).
  int hosts() const { return hosts_; }
  /// The prefix of every namespace and link name of this harness ("hfn<pid>").
  const std::string& prefix() const { return prefix_; }
  /// The namespaces of dead runs the constructor removed.
  const std::vector<std::string>& swept() const { return swept_; }
  /// Every namespace name of this harness, the hub first.
  std::vector<std::string> namespaces() const {
    std::vector<std::string> out = {hub()};
    for (int i = 0; i < hosts_; ++i) out.push_back(ns(i));
    return out;
  }

  /// Host `i`'s namespace name.
  std::string ns(int i) const { return prefix_ + "n" + std::to_string(check(i)); }
  /// Host `i`'s address, "10.231.0.<i+1>".
  std::string address(int i) const { return "10.231.0." + std::to_string(check(i) + 1); }
  /// Host `i`'s network interface inside its namespace ("hfnPv<i>"; e.g. GLOO_SOCKET_IFNAME).
  std::string interface_name(int i) const { return veth(i); }
  /// The hub's address (the harness's own thread).
  static std::string hub_address() { return "10.231.0.254"; }
  /// The shared run directory.
  std::string shared_dir() const { return root_ + "/shared"; }
  /// Host `i`'s node-local directory.
  std::string local_dir(int i) const { return root_ + "/node-" + std::to_string(check(i)); }
  /// Where spawned processes' logs go.
  std::string log_dir() const { return root_ + "/logs"; }

  /// In a forked child: moves the calling thread into host `i`'s namespace.
  void enter(int i) const {
    const int fd = ::open(mn_detail::netns_path(ns(i)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("multinode: open " + mn_detail::netns_path(ns(i)));
    mn_detail::enter_netns_fd(fd, ns(i));
    ::close(fd);
  }

  /// Runs `f` on the calling thread inside host `i`'s namespace (a socket it makes stays
  /// there), then returns the thread to the hub; returns what `f` returns.
  template <class F>
  auto in_node(int i, F&& f) {
    enter(i);
    struct back_to_hub {
      const multinode* self;
      ~back_to_hub() { self->enter_hub(); }
    } guard{this};
    return f();
  }

  /// Starts `argv` (argv[0] a path) in host `i`'s namespace, stdout and stderr appended to
  /// log_dir()/<tag>.log, with `env` added to the environment; returns its pid. It dies with
  /// the test process.
  pid_t spawn(int i, const std::string& tag, std::vector<std::string> argv,
              const std::vector<std::string>& env = {}) {
    const int nsfd = ::open(mn_detail::netns_path(ns(i)).c_str(), O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) throw std::runtime_error("multinode: open " + mn_detail::netns_path(ns(i)));
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const std::string log = log_dir() + "/" + tag + ".log";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(nsfd);
      throw std::runtime_error("multinode: fork failed");
    }
    if (pid == 0) {
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
      if (::setns(nsfd, CLONE_NEWNET) != 0) ::_exit(126);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      const int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (nul >= 0) ::dup2(nul, 0);
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(nsfd);
    procs_.push_back(node_process{i, pid, tag, false, 0, false});
    return pid;
  }

  /// Every process spawned so far (exited ones included).
  const std::vector<node_process>& processes() const { return procs_; }
  /// The record of `pid`.
  const node_process& process(pid_t pid) const {
    for (const auto& p : procs_)
      if (p.pid == pid) return p;
    throw std::out_of_range("multinode: no process " + std::to_string(pid));
  }
  /// The log of the process tagged `tag`.
  std::string log_of(const std::string& tag, std::size_t max_bytes = 4000) const {
    std::ifstream in(log_dir() + "/" + tag + ".log");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
  }

  /// Waits up to `timeout` for `pid` to exit; its wait status, or nullopt.
  std::optional<int> wait(pid_t pid, std::chrono::milliseconds timeout) {
    node_process& p = at(pid);
    if (!p.exited) {
      auto st = mn_detail::wait_exit(pid, timeout);
      if (!st) return std::nullopt;
      p.exited = true;
      p.status = *st;
      p.frozen = false;
    }
    return p.status;
  }

  /// Sends `sig` to host `i`'s live processes (those whose tag starts with `tag_prefix`).
  void signal(int i, int sig, const std::string& tag_prefix = "") {
    for (auto& p : procs_)
      if (mine(p, i, tag_prefix)) ::kill(p.pid, sig);
  }
  /// SIGKILLs host `i`'s live processes (matching `tag_prefix`) and reaps them.
  void kill(int i, const std::string& tag_prefix = "") {
    signal(i, SIGKILL, tag_prefix);
    for (auto& p : procs_)
      if (mine(p, i, tag_prefix) && !wait(p.pid, std::chrono::seconds(10)))
        throw std::runtime_error("multinode: " + p.tag + " survived SIGKILL");
  }
  /// SIGSTOPs host `i`'s live processes (matching `tag_prefix`); returns once each is stopped.
  void freeze(int i, const std::string& tag_prefix = "") {
    for (auto& p : procs_) {
      if (!mine(p, i, tag_prefix) || p.frozen) continue;
      ::kill(p.pid, SIGSTOP);
      siginfo_t si{};
      while (::waitid(P_PID, static_cast<id_t>(p.pid), &si, WSTOPPED | WEXITED | WNOWAIT) != 0 &&
             errno == EINTR) {
      }
      p.frozen = si.si_code == CLD_STOPPED;
    }
  }
  /// Resumes host `i`'s frozen processes (SIGCONT).
  void thaw(int i, const std::string& tag_prefix = "") {
    for (auto& p : procs_)
      if (mine(p, i, tag_prefix) && p.frozen) {
        ::kill(p.pid, SIGCONT);
        p.frozen = false;
      }
  }

  /// Cuts host `i` off the bridge (its port down): nothing reaches it, it reaches nothing.
  void cut(int i) { ip_or_throw_hub({"link", "set", port(i), "down"}); }
  /// Puts host `i` back on the bridge.
  void reconnect(int i) { ip_or_throw_hub({"link", "set", port(i), "up"}); }

  /// Empties host `i`'s local directory (a fresh node); its processes must be gone.
  void wipe_local(int i) {
    for (const auto& p : procs_)
      if (p.node == i && !p.exited)
        throw std::logic_error("multinode: wipe_local with " + p.tag + " running");
    std::error_code ec;
    std::filesystem::remove_all(local_dir(i), ec);
    std::filesystem::create_directories(local_dir(i));
  }

  // ------------------------------------------------------------------------------------------
  // etcd: member i (named m<i+1>) on host i (i = 0, 1, 2), data in its node-local directory.

  /// "http://10.231.0.<i+1>:2379"
  std::string etcd_endpoint(int i) const {
    return "http://" + address(i) + ":" + std::to_string(etcd_client_port);
  }
  /// The three client endpoints.
  std::vector<std::string> etcd_endpoints() const {
    return {etcd_endpoint(0), etcd_endpoint(1), etcd_endpoint(2)};
  }
  /// "etcd://10.231.0.1:2379,10.231.0.2:2379,10.231.0.3:2379" + `path`
  std::string etcd_url(const std::string& path = "") const {
    std::string u = "etcd://";
    for (int i = 0; i < 3; ++i)
      u += (i ? "," : "") + address(i) + ":" + std::to_string(etcd_client_port);
    return u + path;
  }

  /// Starts the three members (a new cluster) and waits up to `timeout` until each is healthy.
  void start_etcd(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    require_etcd();
    std::string initial;
    for (int i = 0; i < 3; ++i) initial += (i ? "," : "") + member(i) + "=" + peer_url(i);
    token_ = prefix_ + "-" + std::to_string(mn_detail::clock::now().time_since_epoch().count());
    for (int i = 0; i < 3; ++i) start_member(i, initial, "new");
    wait_etcd_healthy({0, 1, 2}, timeout);
  }
  /// The pid of member `i` (0 when it does not run).
  pid_t etcd_pid(int i) const { return etcd_pids_[static_cast<std::size_t>(i)]; }

  /// One GET /health on member `i` from the hub: "" when it answers true, else why not.
  std::string etcd_health(int i, std::chrono::milliseconds timeout = std::chrono::seconds(1)) {
    namespace hd = holdfast::detail;
    try {
      auto r = hd::http_call(hd::http_endpoint{address(i), etcd_client_port},
                             hd::http_request{"GET", "/health", {}, {}},
                             hd::http_timeouts{std::chrono::milliseconds(300), timeout});
      if (r.status == 200 && r.body.find("\"true\"") != std::string::npos) return "";
      return "status " + std::to_string(r.status) + ": " + r.body;
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  /// Waits until each member in `members` answers /health true; throws (with the logs) when
  /// `timeout` passes first.
  void wait_etcd_healthy(const std::vector<int>& members, std::chrono::milliseconds timeout) {
    const auto deadline = mn_detail::clock::now() + timeout;
    for (int i : members) {
      std::string why;
      while (!(why = etcd_health(i)).empty()) {
        if (etcd_pids_[static_cast<std::size_t>(i)] == 0 ||
            (wait(etcd_pids_[static_cast<std::size_t>(i)], std::chrono::milliseconds(0))))
          throw std::runtime_error("multinode: etcd m" + std::to_string(i + 1) + " exited; log:\n" +
                                   log_of(member(i)));
        if (mn_detail::clock::now() >= deadline)
          throw std::runtime_error("multinode: etcd m" + std::to_string(i + 1) + " not healthy (" +
                                   why + "); log:\n" + log_of(member(i)));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls a remote state
      }
    }
  }
  /// Replaces member `i` the way etcd documents it for a lost machine: its process is killed
  /// (if still running) and its data removed (a fresh node), it is removed from the cluster
  /// and added back (v3 cluster API, through a healthy member), then started with
  /// --initial-cluster-state existing; returns once it answers /health true. Throws (with the
  /// logs) when any step fails for `timeout`.
  void replace_etcd_member(int i, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto deadline = mn_detail::clock::now() + timeout;
    auto& pid = etcd_pids_[static_cast<std::size_t>(i)];
    if (pid != 0 && !process(pid).exited) {
      ::kill(pid, SIGKILL);
      ::kill(pid, SIGCONT);
      wait(pid, std::chrono::seconds(10));
    }
    std::error_code ec;
    std::filesystem::remove_all(local_dir(i) + "/etcd", ec);
    // Remove the old member (found by its peer URL), then add the new one: each retried while
    // the cluster answers "leader changed", "unhealthy cluster" and the like.
    retry_until(deadline, "remove m" + std::to_string(i + 1), [&] {
      const auto id = member_id(i);
      if (id.empty()) return true;  // already gone
      etcd_call("/v3/cluster/member/remove", "{\"ID\":" + id + "}");
      return false;
    });
    retry_until(deadline, "add m" + std::to_string(i + 1), [&] {
      if (!member_id(i).empty()) return true;
      etcd_call("/v3/cluster/member/add", "{\"peerURLs\":[\"" + peer_url(i) + "\"]}");
      return false;
    });
    std::string initial;
    for (int k = 0; k < 3; ++k) initial += (k ? "," : "") + member(k) + "=" + peer_url(k);
    start_member(i, initial, "existing");
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - mn_detail::clock::now());
    wait_etcd_healthy({i}, std::max(left, std::chrono::milliseconds(1000)));
  }

  /// What etcd last answered to a refused reconfiguration in replace_etcd_member ("" if none).
  const std::string& last_reconfig_error() const { return last_reconfig_error_; }

  /// The member that leads, as that member itself says (among `candidates`); -1 when none does.
  int etcd_leader(const std::vector<int>& candidates = {0, 1, 2}) {
    namespace hd = holdfast::detail;
    for (int i : candidates) {
      try {
        auto r = hd::http_call(
            hd::http_endpoint{address(i), etcd_client_port},
            hd::http_request{"POST", "/v3/maintenance/status", {}, "{}"},
            hd::http_timeouts{std::chrono::milliseconds(300), std::chrono::milliseconds(1000)});
        hd::json_value v = hd::parse_json(r.body, etcd_endpoint(i));
        const hd::json_value* header = v.find("header");
        const hd::json_value* self = header ? header->find("member_id") : nullptr;
        const hd::json_value* leader = v.find("leader");
        if (self && leader && hd::to_json(*self) == hd::to_json(*leader)) return i;
      } catch (const std::exception&) {
      }
    }
    return -1;
  }

 private:
  int check(int i) const {
    if (i < 0 || i >= hosts_) throw std::out_of_range("multinode: no host " + std::to_string(i));
    return i;
  }
  std::string hub() const { return prefix_ + "h"; }
  std::string bridge() const { return prefix_ + "b"; }
  std::string port(int i) const { return prefix_ + "p" + std::to_string(check(i)); }
  std::string veth(int i) const { return prefix_ + "v" + std::to_string(check(i)); }
  static std::string member(int i) { return "m" + std::to_string(i + 1); }
  std::string peer_url(int i) const {
    return "http://" + address(i) + ":" + std::to_string(etcd_peer_port);
  }

  // POST `path` to the first live member that answers 200, returning its parsed answer;
  // throws otherwise (the last problem in the message).
  holdfast::detail::json_value etcd_call(const std::string& path, const std::string& body) {
    namespace hd = holdfast::detail;
    std::string why = "no live member";
    for (int j = 0; j < 3; ++j) {
      const pid_t pid = etcd_pids_[static_cast<std::size_t>(j)];
      if (pid == 0 || process(pid).exited || process(pid).frozen) continue;
      try {
        auto r = hd::http_call(
            hd::http_endpoint{address(j), etcd_client_port},
            hd::http_request{"POST", path, {}, body},
            hd::http_timeouts{std::chrono::milliseconds(300), std::chrono::milliseconds(2000)});
        if (r.status == 200) return hd::parse_json(r.body, etcd_endpoint(j) + path);
        why = etcd_endpoint(j) + path + ": status " + std::to_string(r.status) + ": " + r.body;
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    throw std::runtime_error("multinode: " + why);
  }

  // The JSON text of the ID of the cluster member whose peer URL is host `i`'s; "" when none.
  std::string member_id(int i) {
    namespace hd = holdfast::detail;
    hd::json_value v = etcd_call("/v3/cluster/member/list", "{}");
    const hd::json_value* members = v.find("members");
    if (!members || !members->is_array()) return "";
    for (const auto& m : members->as_array()) {
      const hd::json_value* peers = m.find("peerURLs");
      const hd::json_value* id = m.find("ID");
      if (!peers || !id || !peers->is_array()) continue;
      for (const auto& u : peers->as_array())
        if (u.is_string() && u.as_string() == peer_url(i)) return hd::to_json(*id);
    }
    return "";
  }

  // Calls `step` until it returns true, retrying on exceptions until `deadline`; the last
  // problem is kept in last_reconfig_error().
  template <class Step>
  void retry_until(mn_detail::clock::time_point deadline, const std::string& what, Step step) {
    for (;;) {
      try {
        if (step()) return;
      } catch (const std::exception& e) {
        last_reconfig_error_ = e.what();
      }
      if (mn_detail::clock::now() >= deadline)
        throw std::runtime_error("multinode: etcd " + what + " failed: " + last_reconfig_error_);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the cluster settles
    }
  }

  void ip_or_throw_hub(std::vector<std::string> args) {
    args.insert(args.begin(), {"-n", hub()});
    mn_detail::ip_or_throw(args);
  }

  void build() {
    for (const auto& d : {shared_dir(), log_dir()}) std::filesystem::create_directories(d);
    for (int i = 0; i < hosts_; ++i) std::filesystem::create_directories(local_dir(i));
    auto [rc, out] = mn_detail::ip({"netns", "add", hub()});
    if (rc != 0) {
      const char* ci = std::getenv("CI");
      throw multinode_unavailable(
          std::string("multinode: cannot make a network namespace (`ip netns add` ") +
          (rc == 127 ? "could not run: install iproute2" : "failed: " + out) +
          "); the multi-node tests need root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and a kernel with "
          "network namespaces" +
          (ci && std::string(ci) == "true" ? "; CI=true: this is a failure" : ""));
    }
    made_.push_back(hub());
    ip_or_throw_hub({"link", "add", bridge(), "type", "bridge"});
    ip_or_throw_hub({"addr", "add", hub_address() + "/24", "dev", bridge()});
    ip_or_throw_hub({"link", "set", bridge(), "up"});
    ip_or_throw_hub({"link", "set", "lo", "up"});
    for (int i = 0; i < hosts_; ++i) {
      mn_detail::ip_or_throw({"netns", "add", ns(i)});
      made_.push_back(ns(i));
      ip_or_throw_hub(
          {"link", "add", port(i), "type", "veth", "peer", "name", veth(i), "netns", ns(i)});
      ip_or_throw_hub({"link", "set", port(i), "master", bridge()});
      ip_or_throw_hub({"link", "set", port(i), "up"});
      mn_detail::ip_or_throw({"-n", ns(i), "addr", "add", address(i) + "/24", "dev", veth(i)});
      mn_detail::ip_or_throw({"-n", ns(i), "link", "set", veth(i), "up"});
      mn_detail::ip_or_throw({"-n", ns(i), "link", "set", "lo", "up"});
    }
    // The making thread moves into the hub, so it reaches the nodes (and they it).
    home_fd_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home_fd_ < 0) throw std::runtime_error("multinode: open /proc/thread-self/ns/net");
    hub_fd_ = ::open(mn_detail::netns_path(hub()).c_str(), O_RDONLY | O_CLOEXEC);
    if (hub_fd_ < 0) throw std::runtime_error("multinode: open the hub namespace");
    enter_hub();
  }

  // Back into the hub (cannot fail for a namespace this thread was in; noexcept for guards).
  void enter_hub() const noexcept { ::setns(hub_fd_, CLONE_NEWNET); }

  void start_member(int i, const std::string& initial, const std::string& state) {
    const std::string client = etcd_endpoint(i), peer = peer_url(i);
    etcd_pids_[static_cast<std::size_t>(i)] = spawn(i, member(i),
                                                    {etcd_binary(),
                                                     "--name",
                                                     member(i),
                                                     "--data-dir",
                                                     local_dir(i) + "/etcd",
                                                     "--listen-client-urls",
                                                     client,
                                                     "--advertise-client-urls",
                                                     client,
                                                     "--listen-peer-urls",
                                                     peer,
                                                     "--initial-advertise-peer-urls",
                                                     peer,
                                                     "--initial-cluster",
                                                     initial,
                                                     "--initial-cluster-state",
                                                     state,
                                                     "--initial-cluster-token",
                                                     token_,
                                                     "--heartbeat-interval",
                                                     "50",
                                                     "--election-timeout",
                                                     "500",
                                                     "--logger",
                                                     "zap",
                                                     "--log-level",
                                                     "warn"});
  }

  node_process& at(pid_t pid) { return const_cast<node_process&>(process(pid)); }
  static bool mine(const node_process& p, int i, const std::string& tag_prefix) {
    return p.node == i && !p.exited && p.tag.rfind(tag_prefix, 0) == 0;
  }

  void teardown() noexcept {
    for (auto& p : procs_)
      if (!p.exited) {
        ::kill(p.pid, SIGKILL);
        ::kill(p.pid, SIGCONT);
      }
    for (auto& p : procs_)
      if (!p.exited) {
        int status = 0;
        while (::waitpid(p.pid, &status, 0) < 0 && errno == EINTR) {
        }
        p.exited = true;
        p.status = status;
      }
    if (home_fd_ >= 0) {
      ::setns(home_fd_, CLONE_NEWNET);
      ::close(home_fd_);
      home_fd_ = -1;
    }
    if (hub_fd_ >= 0) ::close(hub_fd_);
    hub_fd_ = -1;
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) mn_detail::destroy_netns(*it);
    made_.clear();
    std::error_code ec;
    if (!root_.empty()) std::filesystem::remove_all(root_, ec);
  }

  int nodes_, hosts_;
  std::string prefix_, root_, token_, last_reconfig_error_;
  std::vector<std::string> swept_, made_;
  std::vector<node_process> procs_;
  pid_t etcd_pids_[3] = {0, 0, 0};
  int home_fd_ = -1, hub_fd_ = -1;
};

/// True when CI=true: a multinode_unavailable is then a failure, elsewhere a skip.
inline bool multinode_required() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

}  // namespace holdfast_test
