// tests/support/etcd_cluster.hpp — a real 3-member (or n-member) etcd cluster on loopback.
//
// Members m1..mN start together with --initial-cluster-state new and a unique cluster token,
// client and peer URLs on free 127.0.0.1 ports, data on /dev/shm when it has room (as
// etcd_server), and a 50 ms heartbeat with a 500 ms election timeout, so a killed leader is
// replaced in well under a second. Tests freeze (SIGSTOP), thaw, kill and restart members and
// ask who leads. Only the process that made the cluster tears it down (forked workers do not),
// and its members die with that process however it ends (etcd_member sets PR_SET_PDEATHSIG);
// a missing etcd makes the constructor throw, so the test FAILS (never skips).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <holdfast/detail/http.hpp>
#include <holdfast/detail/json.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "etcd_server.hpp"

namespace holdfast_test {

/// A running etcd cluster for one test binary.
class etcd_cluster {
 public:
  /// Starts `members` members and waits up to `ready_timeout` until each answers /health true;
  /// throws std::runtime_error (with a member's log) otherwise.
  explicit etcd_cluster(int members = 3,
                        std::chrono::milliseconds ready_timeout = std::chrono::seconds(30))
      : ready_timeout_(ready_timeout) {
    require_etcd();
    std::string last;
    for (int attempt = 0; attempt < 3; ++attempt) {  // a port may be taken between probe and bind
      try {
        start(members);
        return;
      } catch (const std::exception& e) {
        last = e.what();
        members_.clear();  // kills them
      }
    }
    throw std::runtime_error(last);
  }
  etcd_cluster(const etcd_cluster&) = delete;
  etcd_cluster& operator=(const etcd_cluster&) = delete;
  /// Kills every member and removes their data, in the process that made the cluster only
  /// (each member and directory checks the pid itself: a forked worker leaves them alone).
  ~etcd_cluster() = default;

  /// The number of members.
  int size() const { return static_cast<int>(members_.size()); }
  /// "http://127.0.0.1:P" per member, in member order.
  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (const auto& m : members_) out.push_back(m->url());
    return out;
  }
  /// Member `i`'s client URL.
  std::string url(int i) const { return at(i).url(); }

  /// Freezes member `i` (SIGSTOP) and returns once it is stopped.
  void freeze(int i) { at(i).freeze(); }
  /// Resumes member `i` (SIGCONT).
  void thaw(int i) { at(i).thaw(); }
  /// Kills member `i` (SIGKILL) and reaps it.
  void kill(int i) { at(i).kill_now(); }
  /// Starts a killed member again on its data directory and ports, and waits until it answers
  /// /health true (it rejoined).
  void restart(int i) {
    if (at(i).running()) throw std::logic_error("etcd cluster: member still running");
    at(i).start();
    at(i).wait_healthy(ready_timeout_);
  }

  /// The index of the current leader, as a live, unfrozen member that leads says; waits up to
  /// 10 s for one, then throws std::runtime_error.
  int leader() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::string last = "no live member answered";
    do {
      for (int i = 0; i < size(); ++i)
        if (live(i) && leads(i, last)) return i;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < deadline);
    throw std::runtime_error("etcd cluster: no leader within 10 s (" + last + ")");
  }

  /// Waits until every live, unfrozen member answers /health true; throws std::runtime_error
  /// when `timeout` passes first.
  void wait_healthy(std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int i = 0; i < size(); ++i) {
      while (live(i) && !at(i).health_problem(std::chrono::milliseconds(1000)).empty()) {
        if (std::chrono::steady_clock::now() >= deadline)
          throw std::runtime_error("etcd cluster: member " + std::to_string(i) +
                                   " not healthy within " + std::to_string(timeout.count()) +
                                   " ms; log:\n" + at(i).log_tail());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

 private:
  etcd_member& at(int i) const {
    if (i < 0 || i >= size())
      throw std::out_of_range("etcd cluster: no member " + std::to_string(i));
    return *members_[static_cast<std::size_t>(i)];
  }
  bool live(int i) const { return at(i).running() && !at(i).frozen(); }

  void start(int n) {
    const auto count = static_cast<std::size_t>(n);
    const auto ports = free_loopback_ports(2 * count);  // client, peer for each member
    std::string initial;
    for (std::size_t i = 0; i < count; ++i)
      initial += (i ? "," : "") + name(i) + "=" + loopback_url(ports[2 * i + 1]);
    const std::string token =
        "holdfast-" + std::to_string(::getpid()) + "-" +
        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    for (std::size_t i = 0; i < count; ++i) {
      members_.push_back(std::make_unique<etcd_member>(
          etcd_member_spec{name(i),
                           scratch_.data_dir(name(i) + "-" + std::to_string(ports[2 * i])),
                           scratch_.log_path(name(i) + ".log"),
                           ports[2 * i],
                           ports[2 * i + 1],
                           {"--initial-cluster", initial, "--initial-cluster-state", "new",
                            "--initial-cluster-token", token, "--heartbeat-interval", "50",
                            "--election-timeout", "500"}}));
      members_.back()->start();
    }
    for (auto& m : members_) m->wait_healthy(ready_timeout_);
  }

  static std::string name(std::size_t i) { return "m" + std::to_string(i + 1); }

  // Whether member `i` says it leads (POST /v3/maintenance/status: header.member_id == leader);
  // notes why not in `why`.
  bool leads(int i, std::string& why) const {
    namespace hd = holdfast::detail;
    try {
      auto r = hd::http_call(
          hd::parse_http_url(url(i)), hd::http_request{"POST", "/v3/maintenance/status", {}, "{}"},
          hd::http_timeouts{std::chrono::milliseconds(200), std::chrono::milliseconds(1000)});
      hd::json_value v = hd::parse_json(r.body, url(i));
      const hd::json_value* header = v.find("header");
      const hd::json_value* self = header ? header->find("member_id") : nullptr;
      const hd::json_value* leader = v.find("leader");
      if (self && leader && hd::to_json(*self) == hd::to_json(*leader)) return true;
      why = "member " + std::to_string(i) + ": " + r.body.substr(0, 300);
    } catch (const std::exception& e) {
      why = e.what();
    }
    return false;
  }

  std::chrono::milliseconds ready_timeout_;
  etcd_scratch scratch_;
  std::vector<std::unique_ptr<etcd_member>>
      members_;  // declared last: destroyed (killed) before the scratch directories
};

}  // namespace holdfast_test
