// tour_saving — docs/saving.md's tour of staged saves (built and run by CTest, checked against
// docs/saving.md).
#include <holdfast/checkpoint.hpp>
#include <holdfast/store.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  // A fresh directory each run, removed at the end (the tour saves step 0 once).
  std::string prefix = argc > 1 ? argv[1] : "/tmp/holdfast-example-saving";
  std::filesystem::remove_all(prefix);
  auto store = holdfast::store::create(prefix);
  std::vector<float> weights(1 << 16, 1.0f), bias(64, 0.5f);
  std::string text = "step\n";
  std::int64_t step = 0;
  // [snippet]
  holdfast::checkpoint_manager<> mgr(store, "run-1");
  mgr.set_writer([&](holdfast::checkpoint_stage& stage, std::int64_t /*step*/) {
    stage.write("weights.bin", weights.data(), weights.size() * sizeof(float));
    stage.write("weights.bin", bias.data(), bias.size() * sizeof(float));  // appended
    stage.write("step.txt", text.data(), text.size());
  });
  mgr.restore();   // sizes the staging area from the restored checkpoint
  mgr.save(step);  // returns once the bytes are copied
  // ... train on: the buffers may change now ...
  mgr.wait_until_finished();  // the commit, and its error if it failed
  // [/snippet]
  auto latest = mgr.latest();
  bool ok = latest && latest->step == step;
  if (ok) std::printf("committed %s\n", latest->path.c_str());
  std::filesystem::remove_all(prefix);
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
