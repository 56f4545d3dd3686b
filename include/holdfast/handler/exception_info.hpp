// holdfast/handler/exception_info.hpp — what the handler publishes about a step's exception so
// its peers can raise peer_error: the exception's dynamic type name and its message.
//
// Guarantees:
//   - Both are called inside a catch block and never throw out of it for a std::exception or any
//     other type: an exception that is not a std::exception has the message "".
//   - With GCC or Clang the type name is demangled (abi::__cxa_current_exception_type); elsewhere
//     it is "unknown exception".
// Caveats:
//   - Outside a catch block the type name is "unknown exception" and current_exception_message()
//     calls std::terminate (a bare `throw;`).
#pragma once

#include <cstdlib>  // std::free: the demangled name
#include <exception>
#include <string>
#include <typeinfo>

#if defined(__GNUC__) || defined(__clang__)
#include <cxxabi.h>  // __cxa_current_exception_type, __cxa_demangle: the error's type name
#endif

#include "../version.hpp"

HOLDFAST_NAMESPACE_BEGIN
namespace detail {

/// The dynamic type name of the exception being handled (call inside a catch block).
inline std::string current_exception_type_name() {
#if defined(__GNUC__) || defined(__clang__)
  if (const std::type_info* t = abi::__cxa_current_exception_type()) {
    int status = 0;
    char* d = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
    std::string name = status == 0 && d ? d : t->name();
    std::free(d);
    return name;
  }
#endif
  return "unknown exception";
}

/// The message of the exception being handled: what() for std::exception, else "".
inline std::string current_exception_message() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return {};
  }
}

}  // namespace detail
HOLDFAST_NAMESPACE_END
