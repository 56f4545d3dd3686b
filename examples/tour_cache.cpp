// tour_cache — the README's tour of this part (built and run by CTest, checked against README.md).
#include <holdfast/cache.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

std::string decode_sample(std::uint64_t i) { return "sample " + std::to_string(i); }

int main() {
  holdfast::cache_options opts;
  opts.dir = "/tmp";             // where the temp file goes (default: $TMPDIR, else /tmp)
  opts.size_limit = 1ull << 30;  // index + data; a put past it returns false and freezes

  // A temp file, removed when `cache` is destroyed in this process (never by a child).
  holdfast::multiprocess_file_cache cache(holdfast::create_cache, 1000, opts);

  // Data-loader workers: fork; each put stores a slot once, whoever comes first.
  for (int w = 0; w < 2; ++w)
    if (fork() == 0) {
      for (std::uint64_t i = 0; i < 1000; ++i)
        if (!cache.get(i)) cache.put(i, decode_sample(i));
      _exit(0);
    }
  while (wait(nullptr) > 0) {
  }

  if (auto v = cache.get(42))  // std::optional<std::string_view>: no lock, no syscall
    std::printf("%.*s\n", static_cast<int>(v->size()), v->data());

  // Keep it: a hard link next to the temp file; the cache freezes. pfio can preload it too.
  if (cache.preserve("epoch0.cache")) {
    auto kept = holdfast::readonly_file_cache::preload("/tmp/epoch0.cache", 1000);
    std::printf("%llu of %llu filled\n", static_cast<unsigned long long>(kept.filled()),
                static_cast<unsigned long long>(kept.length()));
    std::remove("/tmp/epoch0.cache");
  }
}
