// cache_tool — look inside, check and convert preserved holdfast / pfio cache files.
//
//   cache_tool inspect [--length N] FILE       slots, fill, sizes (pfio files: length guessed
//                                              from the index when not given)
//   cache_tool verify  [--length N] FILE       every entry inside the file, every checksum right;
//                                              exit 1 on corruption
//   cache_tool convert --to pfio|checked [--length N] SRC DST
//                                              rewrite SRC in the other format as DST (a new
//                                              file; an existing DST is an error)
//
// Exit codes: 0 ok, 1 corrupt (or DST exists), 2 usage or I/O error.
#include <fcntl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <holdfast/cache.hpp>
#include <string>
#include <vector>

namespace hf = holdfast;

namespace {

template <class Format>
using reader = hf::basic_file_cache<hf::mmap_read, hf::no_lock, hf::sync_never, Format>;
template <class Format>
using writer = hf::basic_file_cache<hf::mmap_read, hf::no_lock, hf::sync_never, Format>;

struct args {
  std::string command, to, src, dst;
  std::uint64_t length = 0;
};

int usage() {
  std::fprintf(stderr,
               "usage: cache_tool inspect [--length N] FILE\n"
               "       cache_tool verify  [--length N] FILE\n"
               "       cache_tool convert --to pfio|checked [--length N] SRC DST\n");
  return 2;
}

bool is_checked(const std::string& path) {
  auto fd = hf::open_file(path, O_RDONLY);
  char magic[8] = {};
  return hf::pread_full(fd, magic, 8, 0) == 8 &&
         std::memcmp(magic, hf::checked_format::magic, 8) == 0;
}

// pfio files store no length. The longest prefix of the file that reads as a consistent index
// (every entry empty or pointing past the index and inside the file) is the best guess.
std::uint64_t guess_pfio_length(const std::string& path) {
  auto fd = hf::open_file(path, O_RDONLY);
  auto size = static_cast<std::uint64_t>(hf::stat_fd(fd).st_size);
  std::uint64_t first_data = size, k = 0;
  char e[16];
  while (16 * (k + 1) <= first_data &&
         hf::pread_full(fd, e, 16, static_cast<off_t>(16 * k)) == 16) {
    auto off = hf::detail::get_le64(e);
    auto len = static_cast<std::int64_t>(hf::detail::get_le64(e + 8));
    bool empty = len == -1 && off == 0;
    bool item = len >= 0 && off >= 16 * (k + 1) && off <= size &&
                static_cast<std::uint64_t>(len) <= size - off;
    if (!empty && !item) break;
    if (item && len > 0 && off < first_data) first_data = off;
    ++k;
  }
  while (k > 0 && 16 * k > first_data) --k;
  return k;
}

template <class Format>
int inspect(const std::string& path, std::uint64_t length, const char* how) {
  auto c = reader<Format>::preload(path, length);
  std::uint64_t filled = 0, bytes = 0, lo = ~std::uint64_t{0}, hi = 0;
  for (std::uint64_t i = 0; i < c.length(); ++i)
    if (auto e = c.entry(i)) {
      ++filled;
      bytes += e->size;
      lo = std::min(lo, e->size);
      hi = std::max(hi, e->size);
    }
  std::printf("file:    %s\n", path.c_str());
  std::printf("format:  %s\n", Format::name);
  std::printf("length:  %llu slots (%s)\n", static_cast<unsigned long long>(c.length()), how);
  std::printf(
      "filled:  %llu (%.1f%%), empty: %llu\n", static_cast<unsigned long long>(filled),
      c.length() ? 100.0 * static_cast<double>(filled) / static_cast<double>(c.length()) : 0.0,
      static_cast<unsigned long long>(c.length() - filled));
  std::printf("bytes:   index %llu, items %llu, file %llu\n",
              static_cast<unsigned long long>(c.data_offset()),
              static_cast<unsigned long long>(bytes),
              static_cast<unsigned long long>(c.size_bytes()));
  if (filled)
    std::printf("items:   min %llu, mean %.1f, max %llu bytes\n",
                static_cast<unsigned long long>(lo),
                static_cast<double>(bytes) / static_cast<double>(filled),
                static_cast<unsigned long long>(hi));
  return 0;
}

template <class Format>
int verify(const std::string& path, std::uint64_t length) {
  auto c = reader<Format>::preload(path, length);  // every entry, every checksum
  std::uint64_t filled = 0;
  for (std::uint64_t i = 0; i < c.length(); ++i) filled += c.get(i).has_value();
  std::printf("ok: %s, %s format, %llu slots, %llu filled\n", path.c_str(), Format::name,
              static_cast<unsigned long long>(c.length()), static_cast<unsigned long long>(filled));
  return 0;
}

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

template <class From, class To>
int convert(const std::string& src, std::uint64_t length, const std::string& dst) {
  auto in = reader<From>::preload(src, length);
  hf::cache_options o;
  o.dir = dir_of(dst);
  writer<To> out(hf::create_cache, in.length(), o);
  std::uint64_t n = 0;
  for (std::uint64_t i = 0; i < in.length(); ++i)
    if (auto v = in.get(i)) {
      if (!out.put(i, *v)) throw hf::error(ENOSPC, "put", out.path(), "slot " + std::to_string(i));
      ++n;
    }
  if (!out.preserve(dst)) {
    std::fprintf(stderr, "cache_tool: %s exists; not replaced\n", dst.c_str());
    return 1;
  }
  std::printf("converted %llu items of %llu slots: %s (%s) -> %s (%s)\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(in.length()),
              src.c_str(), From::name, dst.c_str(), To::name);
  return 0;
}

int run(const args& a) {
  bool checked = is_checked(a.src);
  std::uint64_t length = a.length;
  const char* how = checked ? "from the header" : "given";
  if (!checked && length == 0) {
    length = guess_pfio_length(a.src);
    how = "guessed from the index; pass --length to be sure";
    if (length == 0) {
      std::fprintf(stderr, "cache_tool: %s: cannot guess the length; pass --length\n",
                   a.src.c_str());
      return 2;
    }
  }
  if (a.command == "inspect")
    return checked ? inspect<hf::checked_format>(a.src, length, how)
                   : inspect<hf::pfio_format>(a.src, length, how);
  if (a.command == "verify")
    return checked ? verify<hf::checked_format>(a.src, length)
                   : verify<hf::pfio_format>(a.src, length);
  if (a.to == "checked" && !checked)
    return convert<hf::pfio_format, hf::checked_format>(a.src, length, a.dst);
  if (a.to == "pfio" && checked)
    return convert<hf::checked_format, hf::pfio_format>(a.src, length, a.dst);
  if (a.to == "checked")
    return convert<hf::checked_format, hf::checked_format>(a.src, length, a.dst);
  if (a.to == "pfio") return convert<hf::pfio_format, hf::pfio_format>(a.src, length, a.dst);
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--length" && i + 1 < argc)
      a.length = std::strtoull(argv[++i], nullptr, 10);
    else if (s == "--to" && i + 1 < argc)
      a.to = argv[++i];
    else if (a.command.empty())
      a.command = s;
    else
      files.push_back(s);
  }
  bool one = (a.command == "inspect" || a.command == "verify") && files.size() == 1;
  bool two = a.command == "convert" && files.size() == 2 && (a.to == "pfio" || a.to == "checked");
  if (!one && !two) return usage();
  a.src = files[0];
  if (two) a.dst = files[1];
  try {
    return run(a);
  } catch (const hf::corrupt_cache& e) {
    std::fprintf(stderr, "cache_tool: corrupt: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cache_tool: %s\n", e.what());
    return 2;
  }
}
