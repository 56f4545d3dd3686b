// multinode_up — the multi-node harness (multinode.hpp) for a driver in another language:
//
//   multinode_up [NODES]          (2 by default; root, `ip`, etcd)
//
// Makes NODES nodes (network namespaces on a bridge) and the 3-member etcd across them, prints
// one line of JSON on stdout, then waits until its stdin closes (or SIGTERM, SIGINT, SIGHUP) and
// tears everything down: the namespaces, every process still inside them (whoever started it:
// `ip netns exec NS ...` included), the etcd members and the directories. A driver keeps the
// write end of the pipe and closes it when done; if the driver dies, the pipe closes with it, so
// nothing outlives the run (and the next harness sweeps what a SIGKILLed one left).
//
// The line:
//   {"prefix": "hfn<pid>", "shared_dir": "...", "log_dir": "...", "hub_address": "10.231.0.254",
//    "etcd_url": "etcd://10.231.0.1:2379,10.231.0.2:2379,10.231.0.3:2379",
//    "etcd_endpoints": ["http://10.231.0.1:2379", ...],
//    "nodes": [{"ns": "hfn<pid>n0", "address": "10.231.0.1", "interface": "hfn<pid>v0",
//               "local_dir": "..."}, ...],
//    "hosts": [... the same for every namespace, store-only ones included ...]}
// Where namespaces cannot be made: {"unavailable": "<why>"} and exit status 77. Any other
// failure: {"error": "<what>"} and exit status 1.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <holdfast/detail/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "multinode.hpp"

namespace {

volatile sig_atomic_t stop_requested = 0;

void on_signal(int) { stop_requested = 1; }

std::string quoted(const std::string& s) {
  return holdfast::detail::to_json(holdfast::detail::json_value(s));
}

std::string host_json(const holdfast_test::multinode& mn, int i) {
  return "{\"ns\": " + quoted(mn.ns(i)) + ", \"address\": " + quoted(mn.address(i)) +
         ", \"interface\": " + quoted(mn.interface_name(i)) +
         ", \"local_dir\": " + quoted(mn.local_dir(i)) + "}";
}

std::string describe(const holdfast_test::multinode& mn) {
  std::string nodes, hosts, endpoints;
  for (int i = 0; i < mn.nodes(); ++i) nodes += (i ? ", " : "") + host_json(mn, i);
  for (int i = 0; i < mn.hosts(); ++i) hosts += (i ? ", " : "") + host_json(mn, i);
  const auto eps = mn.etcd_endpoints();
  for (std::size_t i = 0; i < eps.size(); ++i) endpoints += (i ? ", " : "") + quoted(eps[i]);
  return "{\"prefix\": " + quoted(mn.prefix()) + ", \"shared_dir\": " + quoted(mn.shared_dir()) +
         ", \"log_dir\": " + quoted(mn.log_dir()) +
         ", \"hub_address\": " + quoted(holdfast_test::multinode::hub_address()) +
         ", \"etcd_url\": " + quoted(mn.etcd_url()) + ", \"etcd_endpoints\": [" + endpoints +
         "], \"nodes\": [" + nodes + "], \"hosts\": [" + hosts + "]}";
}

// Blocks until stdin reaches end of file or a stop signal arrives (read fails with EINTR: the
// handlers are installed without SA_RESTART).
void wait_for_eof() {
  char buf[256];
  while (!stop_requested) {
    const ssize_t n = ::read(0, buf, sizeof buf);
    if (n == 0) return;
    if (n < 0 && errno != EINTR) return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int nodes = argc > 1 ? std::atoi(argv[1]) : 2;
  struct sigaction sa {};
  sa.sa_handler = on_signal;  // no SA_RESTART: a blocked read returns EINTR
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // the driver may be gone when we print
  std::optional<holdfast_test::multinode> mn;
  try {
    mn.emplace(nodes);
    mn->start_etcd();
  } catch (const holdfast_test::multinode_unavailable& e) {
    std::printf("{\"unavailable\": %s}\n", quoted(e.what()).c_str());
    return 77;
  } catch (const std::exception& e) {
    std::printf("{\"error\": %s}\n", quoted(e.what()).c_str());
    return 1;
  }
  std::printf("%s\n", describe(*mn).c_str());
  std::fflush(stdout);
  wait_for_eof();
  mn.reset();  // every namespace, process and directory of the run
  return 0;
}
