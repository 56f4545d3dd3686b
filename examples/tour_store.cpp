// tour_store — the README's tour of this part (built and run by CTest, checked against README.md).
#include <holdfast/checkpoint.hpp>
#include <holdfast/store.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  std::string prefix = argc > 1 ? argv[1] : "/tmp/holdfast-example";
  auto store = holdfast::store::create(prefix);  // file://, hdfs:// (+ mount), dbfs:/ or a path

  // Checkpoints: whole directories, a `latest` pointer, the 3 newest kept.
  holdfast::checkpoint_options o;
  o.max_to_keep = 3;
  holdfast::checkpoint_manager<> ckpt(store, "run-7", o);
  std::int64_t weights = 0;
  ckpt.set_writer([&](const std::string& dir) { std::ofstream(dir + "/weights") << weights; });
  ckpt.set_reader([&](const std::string& dir) { std::ifstream(dir + "/weights") >> weights; });
  std::int64_t first = ckpt.restore().value_or(-1) + 1;  // resume after the latest checkpoint
  for (std::int64_t step = first; step < first + 5; ++step) {
    weights += step;
    ckpt.save(step);
  }
  std::printf("latest: %s\n", ckpt.latest()->path.c_str());

  // Other artifacts: write locally, mirror changed files (atomically) to the run directory.
  auto out = store.local_output_dir("run-7");  // the run dir itself for a local store
  std::ofstream(out.path() + "/metrics.csv") << "step,loss\n" << first << ",0.5\n";
  holdfast::sync_options so;
  so.propagate_deletions = true;
  auto r = store.sync("run-7", out.path(), so);
  std::printf("copied %zu, deleted %zu, unchanged %zu\n", r.copied.size(), r.deleted.size(),
              r.unchanged.size());
}
