// A tiny program that uses holdfast the way a host application does: one #include.
#include <holdfast/holdfast.hpp>

#include <cstdio>
#include <cstring>

int main() {
  static_assert(HOLDFAST_VERSION >= 100, "the version macros come from version.hpp");
  if (std::strcmp(holdfast::version.string, HOLDFAST_VERSION_STRING) != 0) return 1;
  std::printf("consumer ok: holdfast %s\n", holdfast::version.string);
  return 0;
}
