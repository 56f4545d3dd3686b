// tests/support/files.hpp — reading and writing whole files in tests (plain, unsynced).
#pragma once

#include <fcntl.h>

#include <filesystem>
#include <holdfast/io.hpp>
#include <string>

namespace holdfast_test {

/// The whole content of `path`.
inline std::string read_file(const std::string& path) {
  auto fd = holdfast::open_file(path, O_RDONLY);
  return holdfast::read_all(fd);
}

/// Writes `content` to `path` (creating its parent directories), replacing what was there.
inline void write_plain(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  auto fd = holdfast::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  holdfast::write_all(fd, content.data(), content.size());
  fd.close();
}

}  // namespace holdfast_test
