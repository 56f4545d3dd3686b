// Fuzzes attaching to a live cache file (cache.hpp: basic_file_cache's attach_cache
// constructor), as an exec'ed worker does, with mmap_read and pread_read, pfio_format and
// checked_format, and a small mmap reserve: the input becomes a file (see cache_fuzz_support.hpp
// for the layout), which is attached, read slot by slot, then written once.
// Properties: only holdfast::error escapes (no SIGBUS from an item past the end of the file or
// the mapping); an attach that succeeds validated every entry, so with pfio_format no later read
// throws (checked_format may still find a bad checksum: attach does not read the items); the
// ways of reading agree; a put that returns true is read back exactly.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <holdfast/cache.hpp>

#include "cache_fuzz_support.hpp"

namespace {

template <class Read, class Format>
void attach(const hf_fuzz::cache_case& c, const std::string& path) {
  using cache_t =
      holdfast::basic_file_cache<Read, holdfast::flock_lock, holdfast::sync_never, Format>;
  holdfast::cache_options o;
  o.reserve = c.reserve;
  const bool checked = std::is_same<Format, holdfast::checked_format>::value;
  try {
    cache_t cache(holdfast::attach_cache, path, c.length, o);
    hf_fuzz::read_every_slot(cache, c.file.size(), checked);
    // Put into the first empty slot, then read it back.
    const std::string item = "fuzz item " + std::to_string(c.file.size());
    for (std::uint64_t i = 0; i < cache.length(); ++i) {
      if (cache.contains(i)) continue;
      if (cache.put(i, item)) {
        auto v = cache.get(i);
        hf_fuzz::check(v && std::string_view(v->data(), v->size()) == item,
                       "a put item does not read back");
      }
      break;
    }
  } catch (const holdfast::error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  static const hf_fuzz::scratch_file file("attach");
  const hf_fuzz::cache_case c(data, size);
  file.write(c.file);
  if (c.pread) {
    if (c.checked)
      attach<holdfast::pread_read, holdfast::checked_format>(c, file.path());
    else
      attach<holdfast::pread_read, holdfast::pfio_format>(c, file.path());
  } else {
    if (c.checked)
      attach<holdfast::mmap_read, holdfast::checked_format>(c, file.path());
    else
      attach<holdfast::mmap_read, holdfast::pfio_format>(c, file.path());
  }
  return 0;
}
