// holdfast/cache.hpp — an index-addressed cache file shared by processes, file-compatible with
// pfio's MultiprocessFileCache / FileCache / ReadOnlyFileCache. Include this header for all of
// it; each part lives in cache/:
//
//   cache/options.hpp     create_cache, attach_cache, preload_cache (tags), cache_options,
//                         bad_slot_policy, cache_bytes, cache_entry
//   cache/policies.hpp    Read (mmap_read, pread_read), Lock (flock_lock, mutex_lock, no_lock,
//                         is_network_filesystem), Sync (sync_never, sync_each_put)
//   cache/format.hpp      pfio_format, checked_format, the little-endian codec
//   cache/traits.hpp      is_cache_*_policy_v, the cache_*_policy concepts, check_cache_policies,
//                         cache_format_records_data_end_v, cache_format_sealable_v
//   cache/file.hpp        detail::cache_file: the file's state, creating, opening and mapping it
//   cache/file_cache.hpp  basic_file_cache, multiprocess_file_cache, file_cache,
//                         readonly_file_cache
//
//   holdfast::multiprocess_file_cache cache(holdfast::create_cache, 50000);
//   if (!cache.get(i)) cache.put(i, decode(sample(i)));   // any process, any order
//   auto bytes = cache.get(i);                            // std::optional<std::string_view>
//
// Guarantees and caveats: see each part; the cache's own are in cache/file_cache.hpp. In short:
// a reader in any process sees an empty slot or the complete item, never a torn one; gets take
// no lock; puts store once, serialized by flock across processes; bad input is reported as
// corrupt_cache naming the file and the slot, never obeyed; pfio_format files are pfio's byte for
// byte, and a Format opts into a header-kept end of data or seal bit by declaring it.
#pragma once

#include "cache/file.hpp"
#include "cache/file_cache.hpp"
#include "cache/format.hpp"
#include "cache/options.hpp"
#include "cache/policies.hpp"
#include "cache/traits.hpp"
