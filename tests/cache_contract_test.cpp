// The cache contract, instantiated once for every combination of Read x Lock x Sync x Format
// policies: put-once, get/get_into, range errors, freeze, size limit, attach, preserve/preload,
// the creator-only removal of the temp file, and concurrent puts from threads.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <holdfast/cache.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.hpp"

namespace hf = holdfast;

namespace {

// Deterministic, slot-specific bytes (with NULs) of a slot-dependent size.
std::string item(std::uint64_t slot, std::size_t size, char salt = 'a') {
  std::string s(size, '\0');
  for (std::size_t k = 0; k < size; ++k)
    s[k] = static_cast<char>((slot * 131 + k * 7 + static_cast<unsigned char>(salt)) & 0xFF);
  return s;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

template <class Cache>
hf::cache_options in(const holdfast_test::temp_dir& dir, std::uint64_t limit = 0) {
  hf::cache_options o;
  o.dir = dir.path();
  o.size_limit = limit;
  return o;
}

template <class Cache>
std::string as_string(const std::optional<typename Cache::value_type>& v) {
  REQUIRE(v.has_value());
  return std::string(v->data(), v->size());
}

}  // namespace

#define HF_CACHE_TYPES(Sync, Format)                                      \
  hf::basic_file_cache<hf::mmap_read, hf::flock_lock, Sync, Format>,      \
      hf::basic_file_cache<hf::mmap_read, hf::mutex_lock, Sync, Format>,  \
      hf::basic_file_cache<hf::mmap_read, hf::no_lock, Sync, Format>,     \
      hf::basic_file_cache<hf::pread_read, hf::flock_lock, Sync, Format>, \
      hf::basic_file_cache<hf::pread_read, hf::mutex_lock, Sync, Format>, \
      hf::basic_file_cache<hf::pread_read, hf::no_lock, Sync, Format>

TEST_CASE_TEMPLATE_DEFINE("cache contract: put once, get, get_into", Cache, contract_put_get) {
  holdfast_test::temp_dir dir("cache");
  Cache c(hf::create_cache, 10, in<Cache>(dir));
  CHECK(c.length() == 10);
  CHECK(c.owns_file());
  CHECK(c.path().rfind(dir.path() + "/", 0) == 0);
  CHECK(c.filled() == 0);
  CHECK(c.data_offset() == Cache::format::header_size + 10 * Cache::format::entry_size);
  CHECK(c.size_bytes() == c.data_offset());
  for (std::uint64_t i = 0; i < 10; ++i) {
    CHECK_FALSE(c.get(i).has_value());
    CHECK_FALSE(c.contains(i));
  }

  CHECK(c.put(3, item(3, 100)));
  CHECK(c.put(0, std::string()));  // zero bytes: present, and distinct from empty
  CHECK(c.put(9, item(9, 5000)));
  CHECK_FALSE(c.put(3, item(3, 100, 'z')));  // stores once
  CHECK(as_string<Cache>(c.get(3)) == item(3, 100));
  CHECK(as_string<Cache>(c.get(9)) == item(9, 5000));
  auto zero = c.get(0);
  REQUIRE(zero.has_value());
  CHECK(zero->empty());
  CHECK(c.contains(0));
  CHECK_FALSE(c.contains(1));
  CHECK(c.filled() == 3);
  CHECK(c.size_bytes() == c.data_offset() + 5100);

  std::string s = "untouched";
  CHECK_FALSE(c.get_into(1, s));
  CHECK(s == "untouched");
  CHECK(c.get_into(9, s));
  CHECK(s == item(9, 5000));
  std::vector<unsigned char> v;
  CHECK(c.get_into(3, v));
  CHECK(std::string(v.begin(), v.end()) == item(3, 100));

  auto e = c.entry(3);
  REQUIRE(e.has_value());
  CHECK(e->offset >= c.data_offset());
  CHECK(e->size == 100);
  CHECK_FALSE(c.entry(4).has_value());
}

TEST_CASE_TEMPLATE_DEFINE("cache contract: out-of-range slots are errors", Cache, contract_range) {
  holdfast_test::temp_dir dir("cache");
  Cache c(hf::create_cache, 4, in<Cache>(dir));
  for (auto op : {0, 1, 2, 3}) {
    try {
      std::string buf;
      if (op == 0) (void)c.get(4);
      if (op == 1) (void)c.put(4, "x");
      if (op == 2) (void)c.get_into(100, buf);
      if (op == 3) (void)c.contains(~std::uint64_t{0});
      FAIL("no error for an out-of-range slot");
    } catch (const hf::error& err) {
      CHECK(err.errnum() == ERANGE);
      CHECK(err.path() == c.path());
      CHECK(std::string(err.what()).find("out of range") != std::string::npos);
    }
  }
  CHECK(c.filled() == 0);
}

TEST_CASE_TEMPLATE_DEFINE("cache contract: freeze and the size limit (index + data)", Cache,
                          contract_limit) {
  holdfast_test::temp_dir dir("cache");
  const std::uint64_t index = Cache::format::header_size + 8 * Cache::format::entry_size;
  Cache c(hf::create_cache, 8, in<Cache>(dir, index + 100));
  CHECK(c.put(0, item(0, 60)));
  CHECK(c.put(1, item(1, 40)));  // exactly at the limit
  CHECK_FALSE(c.frozen());
  CHECK_FALSE(c.put(2, item(2, 1)));  // one byte past it
  CHECK(c.frozen());
  CHECK_FALSE(c.put(3, std::string()));  // frozen: nothing more, not even zero bytes
  CHECK(c.size_bytes() == index + 100);
  CHECK(as_string<Cache>(c.get(1)) == item(1, 40));

  Cache d(hf::create_cache, 8, in<Cache>(dir));
  CHECK(d.put(0, "a"));
  d.freeze();
  CHECK(d.frozen());
  CHECK_FALSE(d.put(1, "b"));
  CHECK(as_string<Cache>(d.get(0)) == "a");
}

TEST_CASE_TEMPLATE_DEFINE(
    "cache contract: attach shares the live file, and only the creator removes it", Cache,
    contract_attach) {
  holdfast_test::temp_dir dir("cache");
  std::string path;
  {
    Cache c(hf::create_cache, 16, in<Cache>(dir));
    path = c.path();
    CHECK(c.put(1, item(1, 10)));
    {
      auto a = Cache::attach(path, 16);
      CHECK_FALSE(a.owns_file());
      CHECK(a.length() == 16);
      CHECK(as_string<Cache>(a.get(1)) == item(1, 10));
      CHECK(a.put(2, item(2, 3000)));
      CHECK_FALSE(a.put(1, "again"));
      CHECK(as_string<Cache>(c.get(2)) == item(2, 3000));
      CHECK_FALSE(c.put(2, "again"));
    }
    CHECK(exists(path));  // the attached object did not remove it
    Cache moved = std::move(c);
    CHECK(moved.owns_file());
    CHECK(as_string<Cache>(moved.get(2)) == item(2, 3000));
  }
  CHECK_FALSE(exists(path));  // the creating object did
  if (Cache::format::stores_length) {
    Cache c(hf::create_cache, 5, in<Cache>(dir));
    auto a = Cache::attach(c.path());  // the length comes from the header
    CHECK(a.length() == 5);
    CHECK_THROWS_AS(Cache::attach(c.path(), 6), hf::corrupt_cache);
  } else {
    Cache c(hf::create_cache, 5, in<Cache>(dir));
    CHECK_THROWS_AS(Cache::attach(c.path()), hf::error);  // pfio files store no length
  }
}

TEST_CASE_TEMPLATE_DEFINE("cache contract: preserve hard-links and freezes, preload reads it back",
                          Cache, contract_preserve) {
  holdfast_test::temp_dir dir("cache");
  std::string kept = dir / "kept.cache";
  {
    Cache c(hf::create_cache, 6, in<Cache>(dir));
    CHECK(c.put(0, item(0, 700)));
    CHECK(c.put(4, item(4, 1)));
    CHECK(c.preserve("kept.cache"));
    CHECK(c.frozen());
    CHECK_FALSE(c.put(5, "late"));
    struct stat a {
    }, b{};
    REQUIRE(::stat(c.path().c_str(), &a) == 0);
    REQUIRE(::stat(kept.c_str(), &b) == 0);
    CHECK(a.st_ino == b.st_ino);            // a hard link, not a copy
    CHECK_FALSE(c.preserve("kept.cache"));  // the name exists: false, nothing replaced
  }
  CHECK(exists(kept));  // outlives the cache
  ::chmod(kept.c_str(), 0400);
  auto p = Cache::preload(kept, 6);
  CHECK(p.frozen());
  CHECK_FALSE(p.owns_file());
  CHECK(p.filled() == 2);
  CHECK(as_string<Cache>(p.get(0)) == item(0, 700));
  CHECK(as_string<Cache>(p.get(4)) == item(4, 1));
  CHECK_FALSE(p.get(5).has_value());
  CHECK_FALSE(p.put(5, "x"));
  // preserving a preloaded file again (another name) works and keeps it read-only
  CHECK(p.preserve(dir / "again.cache"));
  CHECK(exists(dir / "again.cache"));
}

TEST_CASE_TEMPLATE_DEFINE("cache contract: concurrent puts from threads store each slot once",
                          Cache, contract_threads) {
  if constexpr (!std::is_same_v<typename Cache::lock_policy, hf::no_lock>) {
    holdfast_test::temp_dir dir("cache");
    Cache c(hf::create_cache, 200, in<Cache>(dir));
    std::vector<int> wins(4 * 200, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (std::uint64_t i = 0; i < 200; ++i) {
          auto slot = (i * 37 + static_cast<std::uint64_t>(t) * 11) % 200;
          if (c.put(slot, item(slot, 20 + slot % 50, static_cast<char>('a' + t))))
            wins[static_cast<std::size_t>(t) * 200 + slot] = 1;
          (void)c.get((slot + 1) % 200);
        }
      });
    for (auto& th : threads) th.join();
    for (std::uint64_t slot = 0; slot < 200; ++slot) {
      int winners = 0;
      char salt = 0;
      for (int t = 0; t < 4; ++t)
        if (wins[static_cast<std::size_t>(t) * 200 + slot]) {
          ++winners;
          salt = static_cast<char>('a' + t);
        }
      REQUIRE(winners == 1);
      CHECK(as_string<Cache>(c.get(slot)) == item(slot, 20 + slot % 50, salt));
    }
  }
}

#define HF_INVOKE_ALL(name)                                                        \
  TEST_CASE_TEMPLATE_INVOKE(name, HF_CACHE_TYPES(hf::sync_never, hf::pfio_format), \
                            HF_CACHE_TYPES(hf::sync_never, hf::checked_format),    \
                            HF_CACHE_TYPES(hf::sync_each_put, hf::pfio_format),    \
                            HF_CACHE_TYPES(hf::sync_each_put, hf::checked_format))

HF_INVOKE_ALL(contract_put_get);
HF_INVOKE_ALL(contract_range);
HF_INVOKE_ALL(contract_limit);
HF_INVOKE_ALL(contract_attach);
HF_INVOKE_ALL(contract_preserve);
HF_INVOKE_ALL(contract_threads);

TEST_CASE("cache aliases pick the documented policies") {
  CHECK(std::is_same_v<hf::multiprocess_file_cache::read_policy, hf::mmap_read>);
  CHECK(std::is_same_v<hf::multiprocess_file_cache::lock_policy, hf::flock_lock>);
  CHECK(std::is_same_v<hf::multiprocess_file_cache::format, hf::pfio_format>);
  CHECK(std::is_same_v<hf::file_cache::lock_policy, hf::mutex_lock>);
  CHECK(std::is_same_v<hf::readonly_file_cache::lock_policy, hf::no_lock>);
  CHECK(std::is_same_v<hf::multiprocess_file_cache::value_type, std::string_view>);
  CHECK(std::is_same_v<hf::basic_file_cache<hf::pread_read>::value_type, hf::cache_bytes>);
  CHECK(hf::is_cache_read_policy_v<hf::pread_read>);
  CHECK_FALSE(hf::is_cache_read_policy_v<int>);
  CHECK(hf::is_cache_lock_policy_v<hf::flock_lock>);
  CHECK_FALSE(hf::is_cache_lock_policy_v<hf::mmap_read>);
  CHECK(hf::is_cache_sync_policy_v<hf::sync_each_put>);
  CHECK_FALSE(hf::is_cache_sync_policy_v<hf::no_lock>);
  CHECK(hf::is_cache_format_policy_v<hf::checked_format>);
  CHECK_FALSE(hf::is_cache_format_policy_v<hf::sync_never>);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  CHECK(hf::cache_format_policy<hf::pfio_format>);
  CHECK_FALSE(hf::cache_lock_policy<int>);
#endif
}
