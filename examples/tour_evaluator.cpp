// tour_evaluator — docs/store.md's evaluator (built and run by CTest, checked against the page):
// a training run saves, then an evaluator opens the same run read-only and loads the latest.
#include <stdlib.h>  // mkdtemp

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <holdfast/checkpoint.hpp>
#include <holdfast/store.hpp>
#include <string>

struct model_t {
  std::int64_t weights = 0;
  void load_from(const std::string& dir) { std::ifstream(dir + "/weights") >> weights; }
};

int main() {
  // A fresh directory in $TMPDIR (else /tmp), removed at the end.
  std::string root =
      (std::filesystem::temp_directory_path() / "holdfast-tour-evaluator-XXXXXX").string();
  if (!::mkdtemp(root.data())) return 1;
  model_t model;
  {
    auto store = holdfast::store::create(root);
    {
      holdfast::checkpoint_manager<> ckpt(store, "run-7");
      ckpt.set_writer([](const std::string& d) { std::ofstream(d + "/weights") << 7; });
      ckpt.save(3);
    }
    // [snippet]
    holdfast::checkpoint_manager<> eval(holdfast::read_only, store, "run-7");
    eval.restore([&](const std::string& dir) { model.load_from(dir); });
    // [/snippet]
  }
  std::filesystem::remove_all(root);
  std::printf("evaluator loaded weights %lld\n", static_cast<long long>(model.weights));
  return model.weights == 7 ? 0 : 1;
}
