// holdfast/detail/path.hpp — the directory a path names its file in, for the components that
// check or open it (the file notice, the store's files, the cache file).
//
// Guarantees:
//   - parent_directory(p) is the text before p's last '/': "." for a bare name, "/" for a name
//     in the root. It reads nothing from the filesystem.
#pragma once

#include <string>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The directory `path`'s last component is in ("." for a bare name, "/" for one in the root).
inline std::string parent_directory(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
