// benchmarks/multinode_bench.cpp — figures across nodes (issue 33, item 4): its own executable,
// holdfast_multinode_bench, since it makes network namespaces (root and `ip` needed) through the
// multi-node harness (tests/support/multinode.hpp: nodes on a bridge, a 3-member etcd spread
// over them, the third host store-only with 2 nodes).
//
//   holdfast_multinode_bench [--runs N] [--nodes 2,3] [--ack-timeout MS] [--request-timeout MS]
//                            [--no-saved] [--no-kill]
//
// Every worker is a real process (this binary, re-executed with --worker) in its node's
// namespace, 2 per node, talking to etcd_kv with the three members' endpoints, its own node's
// member first (as a node would list its local member first; the store-only host's member is
// last for everyone), request_timeout 1 s. Each figure is the median of N runs (default 5); the
// two sides of a ratio run interleaved (ABAB...) on the same nodes and cluster, so drift hits
// both. Times are steady_clock stamps the workers take themselves (one clock for every
// namespace), read back from files in the shared run directory.
//   - notice -> every worker saved: the workers run holdfast::preemption_handler (signal_notice
//     on SIGTERM), training in lockstep on a shared 1 ms grid (as benchmarks/handler_bench.cpp's
//     process rows); SIGTERM to task 0 mid-step; ms until the last worker has saved (every
//     worker at one step, checked). A save is a cheap one (a small file in the node-local
//     directory, no fsync), so the figure is the agreement.
//   - its baseline, a bare broadcast with acks through the same cluster: the same processes,
//     task 0 (SIGTERM awaited in sigwait) inserts one key, every other task learns it through a
//     watch opened before the notice and inserts its own ack key, task 0 waits (on a watch of
//     the acks, also opened before) until it has seen every ack: one notice broadcast plus the
//     acks, the least any agreement needs. The ratio is the acceptance (<= 4).
//   - a killed node: the handler's workers train (ack_timeout 2 s), then the last node is
//     SIGKILLed whole (its workers and its etcd member), then SIGTERM to task 0: ms until every
//     survivor has raised agreement_timeout, against the configured ack_timeout; the runs that
//     named other tasks than the dead ones are counted. Twice: with etcd's leader moved
//     (MoveLeader) to node 0's member first, so the node lost hosts a follower, and to the killed
//     node's member, so a leader is elected meanwhile. Each run on a fresh harness (the killed
//     member is not replaced); a run that fails is counted and its first failure printed.
// Not run by CI (CI time is scarce); built with the other benchmarks. Without root, or where
// namespaces cannot be made, it says so and exits 1.
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <holdfast/error.hpp>
#include <holdfast/handler/preemption_handler.hpp>
#include <holdfast/kv/etcd.hpp>
#include <holdfast/publish.hpp>
#include <holdfast/termination.hpp>
#include <holdfast/wait.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../tests/support/multinode.hpp"
#include "bench.hpp"        // summarize
#include "environment.hpp"  // bench::environment: the first line
#include "stamps.hpp"       // now_ns

namespace {

using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;
using bench::now_ns;
using holdfast_test::multinode;

constexpr int per_node = 2;            // workers per node
constexpr clk::duration step = 1ms;    // a training step of the handler's workers
constexpr auto wait_limit = 30s;       // the longest any one wait of the parent lasts
constexpr auto watch_interval = 50ms;  // handler_options::watch_interval (as handler_bench)
// etcd_options::request_timeout of every worker (--request-timeout; as multinode_job_test's
// killed-node case): a request to a member that lost its leader fails over after it.
std::chrono::milliseconds request_timeout{1000};

// ---- the workers ------------------------------------------------------------------------------

enum class mode { handler, broadcast, kill };

const char* name_of(mode m) {
  return m == mode::handler ? "handler" : m == mode::broadcast ? "broadcast" : "kill";
}

struct worker_args {
  int task = 0, workers = 0;
  mode m = mode::handler;
  std::vector<std::string> endpoints;  // this worker's order: its node's member first
  std::string ns, dir, local;
  std::chrono::milliseconds ack_timeout{10000};
  std::chrono::milliseconds request_timeout{1000};
};

void publish(const std::string& path, const std::string& text) {
  holdfast::basic_publisher<holdfast::no_sync>().publish(path, text);
}

std::string file(const std::string& dir, const char* what, int t) {
  return dir + "/" + what + "-" + std::to_string(t);
}

// A worker's last act: publishes `text` in `path`, then sleeps until the parent kills it, so no
// worker's exit competes with the later ones for the CPU.
[[noreturn]] void report_and_pause(const std::string& path, const std::string& text) {
  publish(path, text);
  for (;;) ::pause();
}

// The Checkpointer: a cheap save (one small file in the node-local directory, no fsync), stamped.
struct small_file_checkpoints {
  std::string local;
  int task = 0;
  std::atomic<std::int64_t>* saved_at = nullptr;
  std::atomic<std::int64_t>* saved_step = nullptr;
  void save(std::int64_t step_no) {
    publish(local + "/ckpt-" + std::to_string(task), std::to_string(step_no));
    saved_at->store(now_ns());
    saved_step->store(step_no);
  }
  std::optional<std::int64_t> restore() { return std::nullopt; }
};

// The Exit policy: the worker's part ends at its save (it reports when it saved and pauses).
struct report_exit {
  static inline std::string path;
  static inline std::atomic<std::int64_t>* saved_at = nullptr;
  static inline std::atomic<std::int64_t>* saved_step = nullptr;
  static constexpr bool returns = false;
  [[noreturn]] void operator()() const noexcept {  // "<when> <step>"
    report_and_pause(path,
                     std::to_string(saved_at->load()) + " " + std::to_string(saved_step->load()));
  }
};

holdfast::etcd_kv make_kv(const worker_args& a) {
  holdfast::etcd_options o;
  o.endpoints = a.endpoints;
  o.request_timeout = a.request_timeout;
  return holdfast::etcd_kv(o, holdfast::kv_namespace(a.ns, "0"));
}

// Waits on `w` (its first take made) until it has brought `want` distinct keys below its prefix
// with values (an event, or a resync after which one list finds them). False at `limit`.
template <class Kv, class W>
bool await_keys(Kv& kv, W& w, const std::string& prefix, std::size_t want,
                std::set<std::string>& seen, clk::time_point limit) {
  while (seen.size() < want) {
    if (!w.buffered()) {
      const auto until = std::min(w.due(), limit);
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(until - clk::now(), clk::duration::zero()));
      pollfd p{w.fd(), POLLIN, 0};
      ::poll(&p, w.fd() >= 0 ? 1 : 0,
             static_cast<int>(std::min<std::int64_t>(wait.count(), 1 << 30)));
    }
    auto c = w.take();
    for (const auto& e : c.events)
      if (e.value) seen.insert(e.key);
    if (c.resync && seen.size() < want)
      for (const auto& kvp : kv.list(prefix)) seen.insert(kvp.first);
    if (seen.size() < want && clk::now() >= limit) return false;
  }
  return true;
}

// The bare broadcast with acks: task 0 inserts stop/go on SIGTERM and waits for every ack; the
// others insert ack/<t> once they see it. Task 0 reports when it had every ack.
[[noreturn]] void broadcast_worker(const worker_args& a) {
  auto kv = make_kv(a);
  const std::size_t others = static_cast<std::size_t>(a.workers - 1);
  if (a.task == 0) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &set, nullptr);
    auto acks = kv.watch("ack");
    std::set<std::string> seen;
    for (const auto& e : acks.take().events)  // the first take: the snapshot (empty)
      if (e.value) seen.insert(e.key);
    if (!seen.empty()) std::_Exit(3);
    publish(file(a.dir, "ready", 0), "1");
    int sig = 0;
    ::sigwait(&set, &sig);
    kv.insert("stop/go", "0");
    if (!await_keys(kv, acks, "ack", others, seen, clk::now() + wait_limit)) std::_Exit(4);
    report_and_pause(file(a.dir, "done", 0), std::to_string(now_ns()));
  }
  auto stop = kv.watch("stop");
  std::set<std::string> seen;
  for (const auto& e : stop.take().events)
    if (e.value) seen.insert(e.key);
  if (!seen.empty()) std::_Exit(3);
  publish(file(a.dir, "ready", a.task), "1");
  if (!await_keys(kv, stop, "stop", 1, seen, clk::now() + wait_limit)) std::_Exit(4);
  // Acked with the watch still open (as the handler acks from its watcher).
  kv.insert("ack/" + std::to_string(a.task), "0");
  report_and_pause(file(a.dir, "acked", a.task), std::to_string(now_ns()));
}

// The handler's workers: lockstep 1 ms steps on the grid the parent's go file starts; the part
// ends at the save (report_exit) or, in a killed-node run, at agreement_timeout (reported with
// the tasks it names).
[[noreturn]] void handler_worker(const worker_args& a) {
  auto kv = make_kv(a);
  std::atomic<std::int64_t> saved{0}, saved_step{-1};
  report_exit::path = file(a.dir, "saved", a.task);
  report_exit::saved_at = &saved;
  report_exit::saved_step = &saved_step;
  holdfast::handler_options o;
  o.ack_timeout = a.ack_timeout;
  o.watch_interval = watch_interval;
  using cfg = holdfast::termination_config<holdfast::signal_notice<SIGTERM>, report_exit>;
  holdfast::preemption_handler<cfg, holdfast::etcd_kv, small_file_checkpoints> h(
      cfg(), kv, {a.task, a.workers, "r"},
      small_file_checkpoints{a.local, a.task, &saved, &saved_step}, o);
  publish(file(a.dir, "ready", a.task), "1");
  const auto go_text = holdfast::await_file(a.dir + "/go", wait_limit);
  if (!go_text) std::_Exit(5);
  auto step_end = clk::time_point(clk::duration(std::stoll(*go_text)));
  try {
    for (;;) {  // until report_exit ends the worker's part at its save
      step_end += step;
      h.run([&] { std::this_thread::sleep_until(step_end); });
    }
  } catch (const holdfast::agreement_timeout& e) {
    const std::int64_t at = now_ns();
    std::string tasks;
    for (int t : e.missing_tasks()) tasks += (tasks.empty() ? "" : ",") + std::to_string(t);
    report_and_pause(file(a.dir, "timeout", a.task), std::to_string(at) + " " + tasks);
  }
}

int worker_main(int argc, char** argv) {
  worker_args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--worker") {
      a.task = std::stoi(v);
    } else if (k == "--workers") {
      a.workers = std::stoi(v);
    } else if (k == "--mode") {
      a.m = v == "handler" ? mode::handler : v == "broadcast" ? mode::broadcast : mode::kill;
    } else if (k == "--endpoint") {
      a.endpoints.push_back(v);
    } else if (k == "--ns") {
      a.ns = v;
    } else if (k == "--dir") {
      a.dir = v;
    } else if (k == "--local") {
      a.local = v;
    } else if (k == "--ack-timeout") {
      a.ack_timeout = std::chrono::milliseconds(std::stoll(v));
    } else if (k == "--request-timeout") {
      a.request_timeout = std::chrono::milliseconds(std::stoll(v));
    }
  }
  try {
    if (a.m == mode::broadcast) broadcast_worker(a);
    handler_worker(a);
  } catch (const std::exception& e) {
    publish(file(a.dir, "error", a.task), e.what());
    std::fprintf(stderr, "worker %d: %s\n", a.task, e.what());
    return 6;
  }
}

// ---- the parent -------------------------------------------------------------------------------

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  return std::string(buf, static_cast<std::size_t>(n));
}

std::int64_t first_number(const std::string& s) { return std::stoll(s); }

// One run's workers on `mn`: task t on node t / per_node.
class run_set {
 public:
  run_set(multinode& mn, mode m, int id, std::chrono::milliseconds ack_timeout)
      : mn_(mn), id_(id), workers_(mn.nodes() * per_node) {
    dir_ = mn.shared_dir() + "/run-" + std::to_string(id);
    std::filesystem::create_directories(dir_);
    const std::string exe = self_exe();
    for (int t = 0; t < workers_; ++t) {
      const int node = t / per_node;
      std::vector<std::string> argv = {exe,
                                       "--worker",
                                       std::to_string(t),
                                       "--workers",
                                       std::to_string(workers_),
                                       "--mode",
                                       name_of(m),
                                       "--ns",
                                       "mnb" + std::to_string(id),
                                       "--dir",
                                       dir_,
                                       "--local",
                                       mn.local_dir(node),
                                       "--ack-timeout",
                                       std::to_string(ack_timeout.count()),
                                       "--request-timeout",
                                       std::to_string(request_timeout.count())};
      for (int k = 0; k < 3; ++k) {  // its node's member first (the store-only host's last)
        argv.push_back("--endpoint");
        argv.push_back(mn.etcd_endpoint((node + k) % 3));
      }
      pids_.push_back(mn.spawn(node, tag(t), argv));
    }
  }
  run_set(const run_set&) = delete;
  run_set& operator=(const run_set&) = delete;
  ~run_set() {
    for (int i = 0; i < mn_.nodes(); ++i) try {
        mn_.kill(i, prefix());
      } catch (const std::exception&) {  // the harness kills what is left at its end
      }
  }

  const std::string& dir() const { return dir_; }
  int workers() const { return workers_; }
  pid_t pid(int t) const { return pids_[static_cast<std::size_t>(t)]; }

  // Waits for dir()/<what>-<t>; throws (with the workers' logs) at wait_limit.
  std::string await(const char* what, int t) const {
    auto s = holdfast::await_file(file(dir_, what, t), wait_limit);
    if (s) return *s;
    throw std::runtime_error("no " + file(dir_, what, t) + " after 30 s; logs:\n" + logs());
  }
  // The workers' logs (the end of each).
  std::string logs() const {
    std::string out;
    for (int k = 0; k < workers_; ++k) out += "--- " + tag(k) + "\n" + mn_.log_of(tag(k), 1500);
    return out;
  }
  // Waits for the first of dir()/<what>-<t> for `whats` (polled every 5 ms); {what, content},
  // or {"", ""} at wait_limit.
  std::pair<std::string, std::string> await_any(const std::vector<std::string>& whats,
                                                int t) const {
    const auto until = clk::now() + wait_limit;
    for (;;) {
      for (const auto& w : whats) {
        std::ifstream in(file(dir_, w.c_str(), t));
        if (in) return {w, std::string(std::istreambuf_iterator<char>(in), {})};
      }
      if (clk::now() >= until) return {"", ""};
      std::this_thread::sleep_for(5ms);  // polls the workers' reports
    }
  }
  void await_ready() const {
    for (int t = 0; t < workers_; ++t) await("ready", t);
  }
  // Starts the lockstep grid and returns in the middle of step 21.
  void go() const {
    const auto start = clk::now() + 50ms;
    publish(dir_ + "/go", std::to_string(start.time_since_epoch().count()));
    std::this_thread::sleep_until(start + 20 * step + step / 2);
  }

 private:
  std::string prefix() const { return "w" + std::to_string(id_) + "-"; }
  std::string tag(int t) const { return prefix() + std::to_string(t); }

  multinode& mn_;
  int id_, workers_;
  std::string dir_;
  std::vector<pid_t> pids_;
};

int next_run = 0;

// notice -> every worker saved (ms).
double handler_run(multinode& mn) {
  run_set r(mn, mode::handler, ++next_run, 10s);
  r.await_ready();
  r.go();
  const std::int64_t t0 = now_ns();
  ::kill(r.pid(0), SIGTERM);
  std::int64_t last = 0;
  std::set<std::string> steps;  // one agreed step, or the run is not a figure
  for (int t = 0; t < r.workers(); ++t) {
    const std::string s = r.await("saved", t);
    last = std::max(last, first_number(s));
    steps.insert(s.substr(s.find(' ') + 1));
  }
  if (steps.size() != 1) throw std::runtime_error("the workers saved different steps");
  return static_cast<double>(last - t0) / 1e6;
}

// notice -> task 0 has every ack of the bare broadcast (ms).
double broadcast_run(multinode& mn) {
  run_set r(mn, mode::broadcast, ++next_run, 10s);
  r.await_ready();
  const std::int64_t t0 = now_ns();
  ::kill(r.pid(0), SIGTERM);
  return static_cast<double>(first_number(r.await("done", 0)) - t0) / 1e6;
}

std::string joined(const std::vector<double>& v) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? " " : "") << v[i];
  return s.str();
}

// etcd's v3 JSON gateway on member `i`, from the hub: the parsed answer to POST `path`.
holdfast::detail::json_value etcd_post(multinode& mn, int i, const std::string& path,
                                       const std::string& body) {
  namespace hd = holdfast::detail;
  auto r =
      hd::http_call(hd::http_endpoint{mn.address(i), multinode::etcd_client_port},
                    hd::http_request{"POST", path, {}, body}, hd::http_timeouts{300ms, 2000ms});
  if (r.status != 200)
    throw std::runtime_error(path + ": status " + std::to_string(r.status) + ": " + r.body);
  return hd::parse_json(r.body, mn.etcd_endpoint(i) + path);
}

// Makes member `to` etcd's leader (MoveLeader, sent to the current leader) and returns once it
// says it leads; throws after 20 s.
void move_leader(multinode& mn, int to) {
  namespace hd = holdfast::detail;
  const auto until = clk::now() + 20s;
  std::string id;  // member `to`'s ID, as the JSON text etcd gave it
  const std::string peer =
      "http://" + mn.address(to) + ":" + std::to_string(multinode::etcd_peer_port);
  const auto list = etcd_post(mn, to, "/v3/cluster/member/list", "{}");
  if (const auto* members = list.find("members"); members && members->is_array())
    for (const auto& m : members->as_array())
      if (const auto* urls = m.find("peerURLs"); urls && urls->is_array() && m.find("ID"))
        for (const auto& u : urls->as_array())
          if (u.is_string() && u.as_string() == peer) id = hd::to_json(*m.find("ID"));
  if (id.empty()) throw std::runtime_error("move_leader: no member m" + std::to_string(to + 1));
  std::string why;
  for (;;) {
    const int leader = mn.etcd_leader();
    if (leader == to) return;
    if (clk::now() >= until) throw std::runtime_error("move_leader: " + why);
    try {
      if (leader >= 0)
        etcd_post(mn, leader, "/v3/maintenance/transfer-leadership", "{\"targetID\":" + id + "}");
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::this_thread::sleep_for(50ms);  // polls the cluster's leader
  }
}

// One killed-node run: when the survivors raised agreement_timeout and what they named.
struct kill_result {
  double ms = 0;
  std::string named, want;
};

// A fresh harness of `nodes` nodes, etcd's leader on the last node's member (`leader`) or on
// node 0's; the last node killed whole, then a notice to task 0: ms until every survivor
// raised agreement_timeout (the last of them), and the tasks they named (throws when two
// survivors named different tasks: two decisions in one round).
kill_result kill_run(int nodes, std::chrono::milliseconds ack_timeout, bool leader) {
  multinode mn(nodes);
  mn.start_etcd();
  move_leader(mn, leader ? nodes - 1 : 0);
  run_set r(mn, mode::kill, ++next_run, ack_timeout);
  r.await_ready();
  r.go();
  const int dead = nodes - 1;
  kill_result out;
  mn.kill(dead);  // its workers and its etcd member, at once
  const std::int64_t t0 = now_ns();
  ::kill(r.pid(0), SIGTERM);
  for (int t = dead * per_node; t < r.workers(); ++t)
    out.want += (out.want.empty() ? "" : ",") + std::to_string(t);
  std::int64_t last = 0;
  for (int t = 0; t < dead * per_node; ++t) {
    const auto [what, s] = r.await_any({"timeout", "saved", "error"}, t);
    const std::string after = " after " + joined({static_cast<double>(now_ns() - t0) / 1e6}) +
                              " ms (task 0 named " + out.named + "); logs:\n" + r.logs();
    if (what != "timeout")
      throw std::runtime_error("killed node: task " + std::to_string(t) + " " +
                               (what.empty() ? "neither saved nor raised" : what + ": " + s) +
                               after);
    const std::string named = s.substr(s.find(' ') + 1);
    if (t > 0 && named != out.named)
      throw std::runtime_error("killed node: task " + std::to_string(t) + " named tasks " + named +
                               after);
    out.named = named;
    last = std::max(last, first_number(s));
  }
  out.ms = static_cast<double>(last - t0) / 1e6;
  return out;
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--runs N] [--nodes 2,3] [--ack-timeout MS] [--request-timeout MS] "
               "[--no-saved] [--no-kill]\n",
               self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") return worker_main(argc, argv);
  int runs = 5;
  std::vector<int> node_counts = {2, 3};
  std::chrono::milliseconds ack_timeout{2000};
  bool kill_figure = true, saved_figure = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--nodes" && i + 1 < argc) {
      node_counts.clear();
      std::istringstream in(argv[++i]);
      for (std::string n; std::getline(in, n, ',');) node_counts.push_back(std::stoi(n));
    } else if (a == "--ack-timeout" && i + 1 < argc) {
      ack_timeout = std::chrono::milliseconds(std::atoll(argv[++i]));
    } else if (a == "--request-timeout" && i + 1 < argc) {
      request_timeout = std::chrono::milliseconds(std::atoll(argv[++i]));
    } else if (a == "--no-kill") {
      kill_figure = false;
    } else if (a == "--no-saved") {
      saved_figure = false;
    } else {
      return usage(argv[0]);
    }
  }
  if (runs < 1) return usage(argv[0]);
  for (int n : node_counts)
    if (n < 2 || n > 3) return usage(argv[0]);
  if (::geteuid() != 0) {
    std::fprintf(stderr,
                 "holdfast_multinode_bench: needs root: it makes network namespaces (ip netns; "
                 "CAP_SYS_ADMIN and CAP_NET_ADMIN) for its nodes. Run it as root (sudo).\n");
    return 1;
  }
  std::printf("%s\n", bench::environment().c_str());
  std::printf(
      "# %d workers per node (each a process in its node's network namespace), etcd_kv over a "
      "3-member etcd (one member per namespace), medians of %d runs; times in ms\n",
      per_node, runs);
  std::fflush(stdout);
  try {
    for (int nodes : saved_figure ? node_counts : std::vector<int>{}) {
      multinode mn(nodes);
      mn.start_etcd();
      (void)handler_run(mn);  // warm-up: connections, page cache, the members' first writes
      (void)broadcast_run(mn);
      std::vector<double> a, b;
      for (int i = 0; i < runs; ++i) {  // ABAB...
        if (i % 2 == 0) {
          a.push_back(handler_run(mn));
          b.push_back(broadcast_run(mn));
        } else {
          b.push_back(broadcast_run(mn));
          a.push_back(handler_run(mn));
        }
      }
      const auto sa = bench::summarize(a), sb = bench::summarize(b);
      const std::string w = std::to_string(nodes * per_node);
      std::printf("multinode/notice->saved/%d nodes/%s workers  median %7.1f ms  (runs %s)\n",
                  nodes, w.c_str(), sa.median, joined(a).c_str());
      std::printf("multinode/bare broadcast+acks/%d nodes/%s    median %7.1f ms  (runs %s)\n",
                  nodes, w.c_str(), sb.median, joined(b).c_str());
      std::printf(
          "multinode/notice->saved/%d nodes: ratio %.2f (median / bare broadcast median; "
          "acceptance <= 4)\n",
          nodes, sb.median > 0 ? sa.median / sb.median : 0.0);
      std::fflush(stdout);
    }
    if (kill_figure)
      for (int nodes : node_counts)
        for (bool leader : {false, true}) {
          std::vector<double> k;
          std::string detail, first_failure;
          int wrong = 0, failed = 0;
          for (int i = 0; i < runs; ++i) {
            try {
              const kill_result r = kill_run(nodes, ack_timeout, leader);
              k.push_back(r.ms);
              detail += (detail.empty() ? "" : " ") + joined({r.ms});
              if (r.named != r.want) {
                ++wrong;
                detail += "(named " + r.named + ")";
              }
            } catch (const holdfast_test::multinode_unavailable&) {
              throw;
            } catch (const std::exception& e) {  // counted and shown: a figure of the others
              if (failed++ == 0) first_failure = e.what();
            }
          }
          const auto sk = bench::summarize(k);
          std::printf(
              "multinode/killed node/%d nodes/%s: notice -> survivors raise agreement_timeout  "
              "median %7.1f ms  (runs %s) | ack_timeout %lld ms, ratio %.2f | naming other "
              "tasks than the dead: %d, failed: %d, of %d runs\n",
              nodes, leader ? "etcd leader's node" : "a follower's node", sk.median, detail.c_str(),
              static_cast<long long>(ack_timeout.count()),
              sk.median / static_cast<double>(ack_timeout.count()), wrong, failed, runs);
          if (failed) std::printf("#   first failure: %s\n", first_failure.c_str());
          std::fflush(stdout);
        }
  } catch (const holdfast_test::multinode_unavailable& e) {
    std::fprintf(stderr, "holdfast_multinode_bench: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "holdfast_multinode_bench: failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
