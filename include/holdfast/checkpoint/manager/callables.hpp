// holdfast/checkpoint/manager/callables.hpp — how checkpoint_manager (manager.hpp) calls the
// user's writers and readers: as f(dir, step) or f(dir), and a writer's deferred part.
//
// Guarantees:
//   - A writer or reader is called as f(dir, step) when it is invocable so, else as f(dir).
//   - A writer returns void (no deferred part: the call gives an empty function) or a callable
//     that finishes the write (a move-only one is fine: it is held by a shared_ptr, never
//     copied); the manager runs it once, in save() or on the background thread of an async
//     save. A writer whose result is not callable does not compile (a static_assert says why).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>  // std::make_shared: a move-only deferred part in a std::function
#include <string>
#include <type_traits>
#include <utility>

#include "../../version.hpp"

HOLDFAST_NAMESPACE_BEGIN

namespace detail {

// Calls f(dir, step) or f(dir), whichever it accepts.
template <class F>
void checkpoint_call(F& f, const std::string& dir, std::int64_t step) {
  if constexpr (std::is_invocable_v<F&, const std::string&, std::int64_t>)
    f(dir, step);
  else
    f(dir);
}

// Wraps what a writer returned: nothing, or a callable that finishes the write later.
template <class R>
std::function<void()> checkpoint_deferred(R&& r) {
  using D = std::decay_t<R>;
  static_assert(std::is_invocable_v<D&>,
                "holdfast: a checkpoint writer returns void, or a callable that finishes the "
                "write (it runs on the background thread of an async save)");
  auto held = std::make_shared<D>(std::forward<R>(r));  // a move-only callable is fine too
  return [held] { (*held)(); };
}

// A stored writer's result is already the deferred part (empty when it has none).
inline std::function<void()> checkpoint_deferred(std::function<void()> f) { return f; }

// Calls a writer as f(dir, step) or f(dir); returns its deferred part (empty when it has none).
template <class F>
std::function<void()> checkpoint_call_writer(F& f, const std::string& dir, std::int64_t step) {
  if constexpr (std::is_invocable_v<F&, const std::string&, std::int64_t>) {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, const std::string&, std::int64_t>>) {
      f(dir, step);
      return {};
    } else {
      return checkpoint_deferred(f(dir, step));
    }
  } else {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, const std::string&>>) {
      f(dir);
      return {};
    } else {
      return checkpoint_deferred(f(dir));
    }
  }
}

}  // namespace detail

HOLDFAST_NAMESPACE_END
