# Warning flags for holdfast's own tests, benchmarks and examples. Never applied to consumers:
# the library target carries no compile options.
add_library(holdfast_warnings INTERFACE)
target_compile_options(holdfast_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow -Werror
  # GCC 12 reports std::string's operator+(const char*, string&&) at -O2/-O3 as an overlapping
  # memcpy (GCC bug 105329, a false positive inside libstdc++); nothing else is turned off.
  $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_GREATER_EQUAL:$<CXX_COMPILER_VERSION>,12>>:-Wno-restrict>)

# Our own targets see the headers as project headers (not SYSTEM), so the warnings reach them.
add_library(holdfast_dev INTERFACE)
target_link_libraries(holdfast_dev INTERFACE holdfast holdfast_warnings)
