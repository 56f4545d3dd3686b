// Fuzzes preloading a cache file (cache.hpp: basic_file_cache's preload_cache constructor), the
// reader of a preserved file that may have been cut short or garbled on its way between machines,
// in every read policy and format: the input becomes a file (see cache_fuzz_support.hpp for the
// layout), which is preloaded and then read slot by slot.
// Properties: only holdfast::error escapes; a preload that succeeds validated every slot, so no
// later get, get_into, entry or contains throws, they agree with each other, and every item lies
// inside [data_offset, file size); get(length()) throws ERANGE.
#include <cstddef>
#include <cstdint>

#include <holdfast/cache.hpp>

#include "cache_fuzz_support.hpp"

namespace {

template <class Read, class Format>
void preload(const hf_fuzz::cache_case& c, const std::string& path) {
  using cache_t = holdfast::basic_file_cache<Read, holdfast::no_lock, holdfast::sync_never, Format>;
  holdfast::cache_options o;
  if (c.treat_as_empty) o.on_bad_slot = holdfast::bad_slot_policy::treat_as_empty;
  try {
    cache_t cache(holdfast::preload_cache, path, c.length, o);
    hf_fuzz::read_every_slot(cache, c.file.size(), false);
  } catch (const holdfast::error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  static const hf_fuzz::scratch_file file("preload");
  const hf_fuzz::cache_case c(data, size);
  file.write(c.file);
  if (c.pread) {
    if (c.checked)
      preload<holdfast::pread_read, holdfast::checked_format>(c, file.path());
    else
      preload<holdfast::pread_read, holdfast::pfio_format>(c, file.path());
  } else {
    if (c.checked)
      preload<holdfast::mmap_read, holdfast::checked_format>(c, file.path());
    else
      preload<holdfast::mmap_read, holdfast::pfio_format>(c, file.path());
  }
  return 0;
}
