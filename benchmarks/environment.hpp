// benchmarks/environment.hpp — the line every benchmark binary prints first: compiler, flags,
// CPU model and count, kernel, so figures from different runs say where they came from.
#pragma once

#include <sys/utsname.h>

#include <fstream>
#include <string>
#include <thread>

#ifndef HOLDFAST_BENCH_FLAGS
#define HOLDFAST_BENCH_FLAGS "unknown"
#endif

namespace bench {

/// "compiler: ... | flags: ... | cpu: <model> x<cores> | kernel: ...".
inline std::string environment() {
  utsname u{};
  ::uname(&u);
#if defined(__clang__)
  const std::string compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = "g++ " __VERSION__;
#else
  const std::string compiler = "unknown";
#endif
  std::string cpu = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  return "compiler: " + compiler + " | flags: " HOLDFAST_BENCH_FLAGS + " | cpu: " + cpu + " x" +
         std::to_string(std::thread::hardware_concurrency()) + " | kernel: " + u.sysname + " " +
         u.release;
}

}  // namespace bench
