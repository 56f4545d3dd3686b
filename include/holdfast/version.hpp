// holdfast/version.hpp — version macros and the versioned inline namespace.
//
// Guarantees:
//   - HOLDFAST_VERSION is MAJOR * 10000 + MINOR * 100 + PATCH, usable in #if.
//   - Every public entity lives in holdfast::HOLDFAST_ABI_NAMESPACE (an inline namespace), so two
//     incompatible copies of holdfast linked into one program give a link error, not an ODR
//     violation at run time.
#pragma once

#define HOLDFAST_VERSION_MAJOR 0
#define HOLDFAST_VERSION_MINOR 1
#define HOLDFAST_VERSION_PATCH 0
#define HOLDFAST_VERSION \
  (HOLDFAST_VERSION_MAJOR * 10000 + HOLDFAST_VERSION_MINOR * 100 + HOLDFAST_VERSION_PATCH)
#define HOLDFAST_VERSION_STRING "0.1.0"

// The inline namespace changes with every release that breaks the ABI.
#define HOLDFAST_ABI_NAMESPACE v0_1
#define HOLDFAST_NAMESPACE_BEGIN \
  namespace holdfast {           \
  inline namespace HOLDFAST_ABI_NAMESPACE {
#define HOLDFAST_NAMESPACE_END \
  }                            \
  }

HOLDFAST_NAMESPACE_BEGIN

/// The library version as {major, minor, patch}, for run-time checks and logs.
struct version_info {
  int major;
  int minor;
  int patch;
  const char* string;
};

/// The version of the headers this translation unit was compiled with.
inline constexpr version_info version{HOLDFAST_VERSION_MAJOR, HOLDFAST_VERSION_MINOR,
                                      HOLDFAST_VERSION_PATCH, HOLDFAST_VERSION_STRING};

HOLDFAST_NAMESPACE_END
