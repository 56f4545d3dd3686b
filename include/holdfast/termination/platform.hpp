// holdfast/termination/platform.hpp — run-time platform detection: detect_platform() reads
// environment markers and probes the GCE metadata server; visit_preset() calls a function with
// the matching preset. The compile-time presets remain the primary path.
//
// Guarantees:
//   - detect_platform() never waits past its timeout (300 ms by default) for the metadata
//     server, and any failure to reach it means "not GCE".
// Caveats:
//   - Name lookup cannot be timed out: the GCE URL defaults to 169.254.169.254, not a name.
#pragma once

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "../detail/http.hpp"  // the metadata probe
#include "../io.hpp"
#include "cloud.hpp"  // gce_metadata_url
#include "presets.hpp"

HOLDFAST_NAMESPACE_BEGIN

/// Platforms detect_platform() can tell apart.
enum class platform { generic, kubernetes, slurm, gce };

/// "generic", "kubernetes", "slurm", "gce".
inline const char* to_string(platform p) noexcept {
  switch (p) {
    case platform::kubernetes:
      return "kubernetes";
    case platform::slurm:
      return "slurm";
    case platform::gce:
      return "gce";
    case platform::generic:
      break;
  }
  return "generic";
}

/// How detect_platform() looks.
struct detect_options {
  /// The GCE metadata server; "" = gce_metadata_url().
  std::string gce_url;
  /// How long to wait for it (connect and answer).
  std::chrono::milliseconds timeout{300};
  /// Reads the environment; empty = std::getenv.
  std::function<const char*(const char*)> getenv;
};

/// Reads environment markers: KUBERNETES_SERVICE_HOST → kubernetes, SLURM_JOB_ID → slurm, a GCE
/// metadata server answering with `Metadata-Flavor: Google` within the timeout → gce, else
/// generic. The compile-time presets remain the primary path.
template <class Io = posix_io>
platform detect_platform(const detect_options& o = {}) {
  auto env = [&o](const char* name) -> bool {
    const char* v = o.getenv ? o.getenv(name) : std::getenv(name);
    return v && *v;
  };
  if (env("KUBERNETES_SERVICE_HOST")) return platform::kubernetes;
  if (env("SLURM_JOB_ID")) return platform::slurm;
  try {
    std::string path;
    auto ep = detail::parse_http_url(o.gce_url.empty() ? gce_metadata_url() : o.gce_url, &path);
    while (!path.empty() && path.back() == '/') path.pop_back();
    detail::http_request req{
        "GET", path + "/computeMetadata/v1/", {{"Metadata-Flavor", "Google"}}, {}};
    auto r = detail::http_call<Io>(ep, req, {o.timeout, o.timeout});
    const std::string* flavor = r.header("Metadata-Flavor");
    if (r.status == 200 && flavor && *flavor == "Google") return platform::gce;
  } catch (const std::exception&) {
    // unreachable, slow or not a metadata server: not GCE
  }
  return platform::generic;
}

/// Calls `f` with the preset for `p` (gce: gce_gpu when `gpus`, else gce_cpu), for run-time
/// choice: `visit_preset(detect_platform(), [](auto preset) { ... })`. Every call of `f` must
/// return the same type.
template <class F>
decltype(auto) visit_preset(platform p, F&& f, bool gpus = false) {
  switch (p) {
    case platform::kubernetes:
      return std::forward<F>(f)(presets::kubernetes());
    case platform::slurm:
      return std::forward<F>(f)(presets::slurm());
    case platform::gce:
      if (gpus) return std::forward<F>(f)(presets::gce_gpu());
      return std::forward<F>(f)(presets::gce_cpu());
    case platform::generic:
      break;
  }
  return std::forward<F>(f)(presets::generic());
}

HOLDFAST_NAMESPACE_END
