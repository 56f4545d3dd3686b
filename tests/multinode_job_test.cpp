// The C++ job (examples/preemptible_training, its worker mode) across nodes of the multi-node
// harness (support/multinode.hpp): 2 nodes, 2 workers per node, coordinating over etcd://
// with all three members (one per namespace; the third host is store-only), checkpoints in the
// shared run directory, each worker's cache in its node's local directory.
//   - preempt one node (SIGTERM to its workers, as a cloud does): every worker on every node
//     saves once, at the one recorded step, and exits 42; the node is then lost (its etcd
//     member included), a fresh node takes its place (the member removed and added back), and
//     the restarted job restores that step on every worker and finishes bit-exact against an
//     uninterrupted run of the same job on the same nodes, every step run once per worker.
// A heavy suite (HOLDFAST_HEAVY_TESTS), run serially. The parent process starts no thread.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <holdfast/agreement.hpp>
#include <holdfast/kv/url.hpp>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/multinode_case.hpp"
#include "support/process_job.hpp"  // recorded_step

using namespace std::chrono_literals;
using holdfast_test::multinode;
using holdfast_test::with_multinode;

namespace {

constexpr int per_node = 2;
constexpr int nodes = 2;
constexpr int workers = per_node * nodes;
constexpr int steps = 40;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The numbers printed after `marker` on the lines of `text` that contain it.
std::vector<std::int64_t> numbers_after(const std::string& text, const std::string& marker) {
  std::vector<std::int64_t> out;
  for (std::size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1))
    out.push_back(std::stoll(text.substr(at + marker.size())));
  return out;
}

/// One run of the example's workers across the nodes: task t on node t / per_node.
class node_job {
 public:
  node_job(multinode& mn, std::string name)
      : mn_(mn), name_(std::move(name)), dir_(mn.shared_dir() + "/" + name_) {}

  const std::string& dir() const { return dir_; }
  /// The store URL: every member, the key prefix of this job.
  std::string url() const { return mn_.etcd_url("/" + name_); }
  /// The node task `t` runs on.
  static int node_of(int t) { return t / per_node; }
  /// The log tag of task `t` in `incarnation`.
  std::string tag(int incarnation, int t) const {
    return name_ + "-i" + std::to_string(incarnation) + "-w" + std::to_string(t);
  }

  /// Starts every worker of `incarnation`.
  void launch(int incarnation) {
    pids_.clear();
    for (int t = 0; t < workers; ++t) {
      const int node = node_of(t);
      pids_.push_back(mn_.spawn(
          node, tag(incarnation, t),
          {HOLDFAST_DEMO_BINARY, "--worker", std::to_string(t), "--incarnation",
           std::to_string(incarnation), "--workers", std::to_string(workers), "--steps",
           std::to_string(steps), "--grace", "0", "--kv", url(), "--seed", "7", "--dir", dir_},
          {"TMPDIR=" + mn_.local_dir(node)}));  // the cache file: node-local
    }
  }

  /// The steps task `t` has logged (every incarnation).
  std::vector<std::int64_t> steps_of(int t) const {
    std::vector<std::int64_t> out;
    std::istringstream in(slurp(dir_ + "/steps-" + std::to_string(t) + ".log"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) out.push_back(std::stoll(line));
    return out;
  }

  /// Waits until every task has logged `n` steps; false at the deadline.
  bool wait_steps(std::size_t n, std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      bool all = true;
      for (int t = 0; t < workers; ++t) all = all && steps_of(t).size() >= n;
      if (all) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(10ms);  // polls the workers' step logs
    }
  }

  /// Waits for every worker of the last launch; the exit codes (-1: killed, -2: still running
  /// at the deadline, then killed).
  std::vector<int> wait_all(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::vector<int> codes;
    for (pid_t pid : pids_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      auto st = mn_.wait(pid, std::max(left, 0ms));
      if (!st) {
        ::kill(pid, SIGKILL);
        mn_.wait(pid, 10s);
        codes.push_back(-2);
      } else {
        codes.push_back(WIFEXITED(*st) ? WEXITSTATUS(*st) : -1);
      }
    }
    return codes;
  }

  /// Every worker's log of `incarnation`, for failure messages.
  std::string logs(int incarnation) const {
    std::string out;
    for (int t = 0; t < workers; ++t)
      out += "--- " + tag(incarnation, t) + "\n" + mn_.log_of(tag(incarnation, t), 1500);
    return out;
  }

 private:
  multinode& mn_;
  std::string name_, dir_;
  std::vector<pid_t> pids_;
};

}  // namespace

TEST_CASE("multinode job: preempt one node, every worker saves at one step, a fresh node resumes") {
  with_multinode(nodes, [](multinode& mn) {
    mn.start_etcd();

    // The uninterrupted run the preempted one must match bit for bit.
    node_job ref(mn, "reference");
    ref.launch(1);
    const auto ref_codes = ref.wait_all(60s);
    INFO(ref.logs(1));
    REQUIRE(ref_codes == std::vector<int>(workers, 0));
    const std::string expected = slurp(ref.dir() + "/final-model.bin");
    REQUIRE(!expected.empty());

    // Incarnation 1: node 1's workers get SIGTERM once every worker has run a few steps.
    node_job job(mn, "job");
    job.launch(1);
    REQUIRE(job.wait_steps(8, 30s));
    const auto notice = std::chrono::steady_clock::now();
    mn.signal(1, SIGTERM, "job-i1-");
    const auto codes = job.wait_all(40s);  // ack_timeout (10 s) and more
    const double took =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - notice)
            .count();
    std::printf("multinode job: preempted node 1: notice -> every worker exited: %.0f ms\n", took);
    INFO(job.logs(1));
    CHECK(codes == std::vector<int>(workers, 42));
    // One save per worker, all at the recorded step.
    std::set<std::int64_t> saved;
    for (int t = 0; t < workers; ++t) {
      const auto saves = numbers_after(mn.log_of(job.tag(1, t), 1 << 20), "checkpoint at step ");
      CHECK_MESSAGE(saves.size() == 1, "worker " << t << " saved " << saves.size() << " times");
      saved.insert(saves.begin(), saves.end());
    }
    REQUIRE(saved.size() == 1);
    const std::int64_t step = *saved.begin();
    auto kv = holdfast::make_kv(job.url(), {"train", 1});
    const auto recorded = holdfast_test::recorded_step(kv, "train");
    REQUIRE(recorded);
    CHECK(recorded->what == holdfast::agreement_value::kind::step);
    CHECK(recorded->step == step);

    // The node is lost (its etcd member with it); a fresh node takes its place.
    mn.kill(1);
    mn.wipe_local(1);
    mn.replace_etcd_member(1);

    // Incarnation 2: every worker restores that step and the job finishes bit-exact.
    job.launch(2);
    const auto codes2 = job.wait_all(60s);
    INFO(job.logs(2));
    CHECK(codes2 == std::vector<int>(workers, 0));
    for (int t = 0; t < workers; ++t) {
      const auto restored =
          numbers_after(mn.log_of(job.tag(2, t), 1 << 20), "restored checkpoint of step ");
      CHECK(restored == std::vector<std::int64_t>{step});
      std::map<std::int64_t, int> seen;
      for (auto s : job.steps_of(t)) ++seen[s];
      CHECK_MESSAGE(seen.size() == static_cast<std::size_t>(steps), "worker " << t);
      for (const auto& [s, n] : seen) CHECK_MESSAGE(n == 1, "worker " << t << " step " << s);
    }
    CHECK(slurp(job.dir() + "/final-model.bin") == expected);
  });
}
