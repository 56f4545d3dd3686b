// The multi-node harness (support/multinode.hpp) checked on its own: nodes as network
// namespaces on a bridge reach each other's addresses and not the host's loopback services; a
// 3-member etcd across 3 namespaces elects a leader and serves a put from one node and a get
// from another; a node cut off the bridge is unreachable and back once reconnected (its etcd
// member catches up); a lost node's member is removed and added back on a fresh node; the
// harness leaves no namespace, link or process behind, sweeps the namespaces and directories of
// a dead run, and says clearly when namespaces cannot be made. Built where
// HOLDFAST_MULTINODE_TESTS is on (the gcc-20-release preset), run serially. The parent process
// starts no thread.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <holdfast/kv/etcd.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/child.hpp"
#include "support/etcd_client.hpp"
#include "support/multinode_case.hpp"

using namespace std::chrono_literals;
using holdfast_test::multinode;
using holdfast_test::with_multinode;

namespace {

/// A listening TCP socket on `addr`, port chosen by the kernel, in the calling thread's
/// namespace; {fd, port}.
std::pair<int, std::uint16_t> listen_on(const std::string& addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, addr.c_str(), &a.sin_addr) == 1);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  return {fd, ntohs(a.sin_port)};
}

/// Connects to addr:port within `timeout`: "" when connected, else why not.
std::string connect_problem(const std::string& addr, std::uint16_t port,
                            std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return "socket failed";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
  std::string why;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) {
      why = std::strerror(errno);
    } else {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) {
        why = "timed out";
      } else {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) why = std::strerror(err);
      }
    }
  }
  ::close(fd);
  return why;
}

/// The inode of the calling thread's network namespace.
ino_t own_netns() {
  struct stat st {};
  REQUIRE(::stat("/proc/thread-self/ns/net", &st) == 0);
  return st.st_ino;
}

bool is_empty_dir(const std::string& d) {
  return std::filesystem::is_directory(d) && std::filesystem::is_empty(d);
}

holdfast::etcd_kv kv_on(const std::vector<std::string>& endpoints) {
  return holdfast::etcd_kv(holdfast_test::etcd_client_options(endpoints, 2000ms),
                           holdfast::kv_namespace("multinode", 0));
}

}  // namespace

TEST_CASE("multinode: nodes reach each other's addresses and not the host's loopback") {
  // A service of the host, on its loopback, made before the harness moves this thread.
  auto [host_fd, host_port] = listen_on("127.0.0.1");
  with_multinode(2, [&, host_port = host_port](multinode& mn) {
    REQUIRE(mn.hosts() == 3);
    std::vector<std::pair<int, std::uint16_t>> listeners;
    for (int i = 0; i < mn.hosts(); ++i)
      listeners.push_back(mn.in_node(i, [&] { return listen_on(mn.address(i)); }));
    auto [hub_fd, hub_port] = listen_on(multinode::hub_address());
    // The harness's thread (in the hub) reaches every node and not the host's loopback.
    for (int i = 0; i < mn.hosts(); ++i)
      CHECK(connect_problem(mn.address(i), listeners[static_cast<std::size_t>(i)].second, 2s) ==
            "");
    CHECK(connect_problem("127.0.0.1", host_port, 2s) != "");
    // A process in node 0 reaches node 1, the store-only host 2 and the hub, not the host.
    holdfast_test::child c([&, hub_port = hub_port] {
      mn.enter(0);
      for (int i = 1; i < mn.hosts(); ++i)
        CHILD_REQUIRE(connect_problem(mn.address(i), listeners[static_cast<std::size_t>(i)].second,
                                      2s) == "");
      CHILD_REQUIRE(connect_problem(multinode::hub_address(), hub_port, 2s) == "");
      CHILD_REQUIRE(connect_problem("127.0.0.1", host_port, 2s) != "");
    });
    auto r = c.wait(20s);
    INFO(r.failures);
    CHECK(r.ok());
    // Node-local directories: distinct, empty, beside the shared run directory.
    CHECK(is_empty_dir(mn.shared_dir()));
    for (int i = 0; i < mn.hosts(); ++i) CHECK(is_empty_dir(mn.local_dir(i)));
    CHECK(mn.local_dir(0) != mn.local_dir(1));
    for (auto& l : listeners) ::close(l.first);
    ::close(hub_fd);
  });
  ::close(host_fd);
}

TEST_CASE("multinode: a 3-member etcd across 3 namespaces elects a leader and serves clients") {
  with_multinode(2, [](multinode& mn) {
    mn.start_etcd();
    const auto until = std::chrono::steady_clock::now() + 10s;
    int leader = -1;
    while ((leader = mn.etcd_leader()) < 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(20ms);  // polls a remote state
    CHECK(leader >= 0);
    for (int i = 0; i < 3; ++i) CHECK(mn.process(mn.etcd_pid(i)).node == i);
    // A put from node 0 through the store-only host's member; a get from node 1 through
    // node 0's member.
    holdfast_test::child writer([&] {
      mn.enter(0);
      auto kv = kv_on({mn.etcd_endpoint(2)});
      kv.put("k", "across nodes");
    });
    auto w = writer.wait(20s);
    INFO(w.failures);
    REQUIRE(w.ok());
    holdfast_test::child reader([&] {
      mn.enter(1);
      auto kv = kv_on({mn.etcd_endpoint(0)});
      CHILD_REQUIRE(kv.get("k", 5s) == std::optional<std::string>("across nodes"));
    });
    auto r = reader.wait(20s);
    INFO(r.failures);
    CHECK(r.ok());
  });
}

TEST_CASE("multinode: a node cut off is unreachable and back once reconnected") {
  with_multinode(2, [](multinode& mn) {
    mn.start_etcd();
    mn.cut(1);
    // Its member neither answers nor is reached; the other two keep a quorum.
    CHECK(connect_problem(mn.address(1), multinode::etcd_client_port, 300ms) != "");
    CHECK(mn.etcd_health(1, 500ms) != "");
    holdfast_test::child isolated([&] {  // and node 1 reaches nobody
      mn.enter(1);
      CHILD_REQUIRE(connect_problem(mn.address(0), multinode::etcd_client_port, 300ms) != "");
    });
    auto iso = isolated.wait(10s);
    INFO(iso.failures);
    CHECK(iso.ok());
    // When node 1's member led, the other two elect a leader first: a put before that times out.
    mn.wait_etcd_healthy({0, 2}, 10s);
    kv_on({mn.etcd_endpoint(0), mn.etcd_endpoint(2)}).put("during", "the cut");
    mn.reconnect(1);
    mn.wait_etcd_healthy({1}, 10s);
    // Its member caught up: a client in node 1, on that member only, reads the write.
    holdfast_test::child reader([&] {
      mn.enter(1);
      auto kv = kv_on({mn.etcd_endpoint(1)});
      CHILD_REQUIRE(kv.get("during", 5s) == std::optional<std::string>("the cut"));
    });
    auto r = reader.wait(20s);
    INFO(r.failures);
    CHECK(r.ok());
  });
}

TEST_CASE("multinode: a lost node's etcd member is replaced on a fresh node") {
  with_multinode(2, [](multinode& mn) {
    mn.start_etcd();
    kv_on(mn.etcd_endpoints()).put("before", "the loss");
    const pid_t old = mn.etcd_pid(1);
    mn.kill(1);  // the node is gone, its member with it
    mn.wipe_local(1);
    CHECK(mn.process(old).exited);
    mn.replace_etcd_member(1, 20s);
    CHECK(mn.etcd_pid(1) != old);
    CHECK(std::filesystem::exists(mn.local_dir(1) + "/etcd"));
    // The new member serves the old data and new writes, read on that member alone.
    kv_on({mn.etcd_endpoint(0)}).put("after", "the loss");
    holdfast_test::child reader([&] {
      mn.enter(1);
      auto kv = kv_on({mn.etcd_endpoint(1)});
      CHILD_REQUIRE(kv.get("before", 5s) == std::optional<std::string>("the loss"));
      CHILD_REQUIRE(kv.get("after", 5s) == std::optional<std::string>("the loss"));
    });
    auto r = reader.wait(20s);
    INFO(r.failures);
    CHECK(r.ok());
  });
}

TEST_CASE("multinode: cleanup leaves no namespace, link or process behind") {
  const ino_t home = own_netns();
  std::vector<std::string> names;
  std::vector<ino_t> inodes;
  std::vector<pid_t> pids;
  std::string prefix, root;
  with_multinode(3, [&](multinode& mn) {
    mn.start_etcd();
    pids.push_back(mn.spawn(0, "sleeper", {"/bin/sleep", "600"}));
    mn.freeze(2);  // a frozen node too: its member is stopped
    for (const auto& p : mn.processes()) pids.push_back(p.pid);
    names = mn.namespaces();
    for (const auto& n : names) inodes.push_back(holdfast_test::mn_detail::netns_inode(n));
    prefix = mn.prefix();
    root = std::filesystem::path(mn.shared_dir()).parent_path().string();
    CHECK(own_netns() != home);  // the thread is in the hub
  });
  if (names.empty()) return;  // skipped
  CHECK(own_netns() == home);
  for (const auto& n : names) CHECK_MESSAGE(!std::filesystem::exists("/run/netns/" + n), n);
  for (ino_t ino : inodes) CHECK(holdfast_test::mn_detail::pids_in_netns(ino).empty());
  for (pid_t pid : pids) CHECK(::kill(pid, 0) != 0);
  auto [rc, links] = holdfast_test::mn_detail::ip({"-o", "link", "show"});
  CHECK(rc == 0);
  CHECK(links.find(prefix) == std::string::npos);
  CHECK(!std::filesystem::exists(root));
}

TEST_CASE("multinode: the namespaces of a dead run are swept at start") {
  // A pid that no longer runs: a child reaped at once.
  holdfast_test::child gone([] {});
  const pid_t dead = gone.pid();
  REQUIRE(gone.wait(10s).ok());
  const std::string stale = "hfn" + std::to_string(dead) + "n0";
  auto [rc, out] = holdfast_test::mn_detail::ip({"netns", "add", stale});
  if (rc != 0) {
    if (holdfast_test::multinode_required()) FAIL(out);
    MESSAGE("skipped: ip netns add: " << out);
    return;
  }
  // and its scratch directory, with an etcd data directory in it
  const std::string stale_dir =
      holdfast_test::mn_detail::scratch_base() + "/hfn" + std::to_string(dead) + "-test";
  std::filesystem::create_directories(stale_dir + "/node-0/etcd");
  with_multinode(2, [&](multinode& mn) {
    CHECK(std::find(mn.swept().begin(), mn.swept().end(), stale) != mn.swept().end());
    CHECK(!std::filesystem::exists("/run/netns/" + stale));
    CHECK(!std::filesystem::exists(stale_dir));
  });
  std::error_code ec;
  std::filesystem::remove_all(stale_dir, ec);             // when the sweep failed
  holdfast_test::mn_detail::ip({"netns", "del", stale});  // when the sweep failed
}

TEST_CASE("multinode: without namespaces the harness says why") {
  // No `ip` on the PATH: the constructor throws multinode_unavailable, naming the tool.
  holdfast_test::child c([] {
    ::setenv("PATH", "/nonexistent", 1);
    bool constructed = false;
    try {
      multinode mn(2);
      constructed = true;
    } catch (const holdfast_test::multinode_unavailable& e) {
      CHILD_REQUIRE(std::string(e.what()).find("iproute2") != std::string::npos);
    }
    CHILD_REQUIRE(!constructed);
  });
  auto r = c.wait(20s);
  INFO(r.failures);
  CHECK(r.ok());
}
