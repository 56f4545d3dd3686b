// holdfast/handoff.hpp — command and ready files handed between jobs through a cache root.
//
// The pattern of TF models' NCF pipeline: the main job publishes a command (a flag file of
// `--key=value` lines, or a flat `command.json`) into a cache root named by a cache id; a data
// job, started as a subprocess or separately, waits for it, then publishes `ready.json` once per
// training cycle. Several workers meet on one root by sharing the cache id.
//
//   <data_dir>/<cache_id>/command.json                     (or `flagfile` with flag_codec)
//   <data_dir>/<cache_id>/training_cycle_<n>/ready.json
//
// The parts: handoff/command.hpp (the payload), handoff/json_codec.hpp and
// handoff/flag_codec.hpp (its two file formats), handoff/cache_root.hpp (where jobs meet); this
// header publishes and awaits the files.
//
// Guarantees:
//   - Every file is published with publish.hpp (temp + rename), so a reader never sees it
//     partial; await_* read through one descriptor (wait.hpp).
//   - A file name containing '/', "..", or NUL, or an empty one, is rejected (EINVAL).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "error.hpp"
#include "handoff/cache_root.hpp"
#include "handoff/command.hpp"
#include "handoff/flag_codec.hpp"
#include "handoff/json_codec.hpp"
#include "io.hpp"
#include "publish.hpp"
#include "wait.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// The directory of one training cycle's files: `<root>/training_cycle_<cycle>`.
inline std::string cycle_directory(const std::string& root, std::uint64_t cycle) {
  return root + "/training_cycle_" + std::to_string(cycle);
}

/// Publishes `cmd` as `<root>/<name>` (default: the codec's file name), atomically.
template <class Codec = json_codec, class Durability = durable, class Io = posix_io>
void publish_command(const std::string& root, const command& cmd,
                     std::string_view name = Codec::file_name) {
  detail::validate_component(name, "command file name");
  basic_publisher<Durability, Io>().publish(root + "/" + std::string(name), Codec::encode(cmd));
}

/// Waits up to `timeout` for `<root>/<name>` with a kept waiter and decodes it; std::nullopt
/// on timeout.
template <class Codec = json_codec, class Wait, class Io>
std::optional<command> await_command(basic_file_waiter<Wait, Io>& waiter, const std::string& root,
                                     std::chrono::milliseconds timeout,
                                     std::string_view name = Codec::file_name) {
  detail::validate_component(name, "command file name");
  std::string path = root + "/" + std::string(name);
  auto text = waiter.await(path, timeout);
  if (!text) return std::nullopt;
  return Codec::decode(*text, path);
}

/// Waits up to `timeout` for `<root>/<name>` and decodes it; std::nullopt on timeout.
template <class Codec = json_codec, class Wait = inotify_wait, class Io = posix_io>
std::optional<command> await_command(const std::string& root, std::chrono::milliseconds timeout,
                                     std::string_view name = Codec::file_name) {
  basic_file_waiter<Wait, Io> waiter;
  return await_command<Codec>(waiter, root, timeout, name);
}

/// Publishes `<root>/training_cycle_<cycle>/ready.json` with `payload` (the directory is
/// created if needed).
template <class Durability = durable, class Io = posix_io>
void publish_ready(const std::string& root, std::uint64_t cycle, const command& payload) {
  std::string dir = cycle_directory(root, cycle);
  if (Io::mkdir(dir.c_str(), 0755) == 0) {
    if constexpr (Durability::sync_parent) {  // the new directory's entry in the root
      auto fd = open_file<Io>(root, O_RDONLY | O_DIRECTORY);
      detail::sync_dir_fd<Durability>(fd);
      fd.close();
    }
  } else if (errno != EEXIST) {
    throw error(errno, "mkdir", dir);
  }
  basic_publisher<Durability, Io>().publish(dir + "/ready.json", json_codec::encode(payload));
}

/// Waits up to `timeout` for cycle `cycle`'s ready.json with a kept waiter (one inotify
/// descriptor for every cycle); std::nullopt on timeout.
template <class Wait, class Io>
std::optional<command> await_ready(basic_file_waiter<Wait, Io>& waiter, const std::string& root,
                                   std::uint64_t cycle, std::chrono::milliseconds timeout) {
  std::string path = cycle_directory(root, cycle) + "/ready.json";
  auto text = waiter.await(path, timeout);
  if (!text) return std::nullopt;
  return json_codec::decode(*text, path);
}

/// Waits up to `timeout` for cycle `cycle`'s ready.json; std::nullopt on timeout.
template <class Wait = inotify_wait, class Io = posix_io>
std::optional<command> await_ready(const std::string& root, std::uint64_t cycle,
                                   std::chrono::milliseconds timeout) {
  basic_file_waiter<Wait, Io> waiter;
  return await_ready(waiter, root, cycle, timeout);
}

HOLDFAST_NAMESPACE_END
