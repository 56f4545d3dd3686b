// tour_publish — the README's tour of this part (built and run by CTest, checked against
// README.md).
#include <holdfast/handoff.hpp>
#include <holdfast/publish.hpp>
#include <holdfast/wait.hpp>

#include <chrono>
#include <cstdio>
#include <string>

using namespace std::chrono_literals;

int main() {
  // 1. Publish a file: readers see the old version or the new one, never a mix.
  holdfast::publisher pub;  // durable: fsync file + fsync directory
  pub.publish("/tmp/holdfast-tour-model.json", R"({"step": 100})");
  bool first = pub.publish_once("/tmp/holdfast-tour-lock", "owner=1");  // false if it exists
  (void)first;

  // Stream a large file straight into the temp descriptor.
  pub.publish_with("/tmp/holdfast-tour-shard.bin", [](const holdfast::unique_fd& fd) {
    std::string block(1 << 20, 'x');
    for (int i = 0; i < 4; ++i) holdfast::write_all(fd, block.data(), block.size());
  });

  // 2. Wait for a file and read it whole through one descriptor.
  if (auto text = holdfast::await_file("/tmp/holdfast-tour-model.json", 2s))
    std::printf("read %zu bytes\n", text->size());

  // 3. Hand a command to a data job through a cache root keyed by a cache id.
  holdfast::cache_root root("/tmp", "holdfast-tour-run");  // removed at scope exit (we made it)
  holdfast::command cmd;
  cmd.set("data_dir", "/data/ml-20m").set("batch_size", 98304).set("use_xla", true);
  holdfast::publish_command(root.path(), cmd);  // command.json; flag_codec writes --key=value

  // ... in the data job (another process, same cache id):
  holdfast::file_waiter waiter;  // one inotify descriptor for every wait
  auto got = holdfast::await_command(waiter, root.path(), 10s);
  if (!got) return 1;                        // timed out
  got->require({"data_dir", "batch_size"});  // format_error naming the file if one is missing
  holdfast::command ready;
  ready.set("batch_count", got->get_int("batch_size") / 1024);
  holdfast::publish_ready(root.path(), /*cycle=*/0, ready);

  // ... and back in the main job:
  auto r = holdfast::await_ready(waiter, root.path(), 0, 10s);
  std::printf("cycle 0 ready: %lld batches\n", static_cast<long long>(r->get_int("batch_count")));

  // 4. At start-up, remove temps that killed writers left behind (only ours, only old ones).
  holdfast::sweep_stale_temps("/tmp", std::chrono::minutes(10));

  // (The tour's own files go again: a run leaves nothing in /tmp.)
  for (const char* f :
       {"/tmp/holdfast-tour-model.json", "/tmp/holdfast-tour-lock", "/tmp/holdfast-tour-shard.bin"})
    std::remove(f);
}
