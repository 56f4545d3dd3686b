// holdfast/detail/detect.hpp — the one member-detection helper the policy traits share.
//
// Guarantees:
//   - detect<Probe, T>::value is true exactly when Probe<T> is well-formed (the detection idiom
//     of std::experimental::is_detected, in C++17).
#pragma once

#include <type_traits>

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// True when `Probe<T>` names a type: T has what the probe asks for.
template <template <class> class Probe, class T, class = void>
struct detect : std::false_type {};
template <template <class> class Probe, class T>
struct detect<Probe, T, std::void_t<Probe<T>>> : std::true_type {};

}  // namespace detail
HOLDFAST_NAMESPACE_END
