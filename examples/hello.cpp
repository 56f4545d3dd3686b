// The smallest holdfast program: include the umbrella header and print the version.
#include <holdfast/holdfast.hpp>

#include <cstdio>

int main() {
  std::printf("holdfast %s\n", holdfast::version.string);
  return 0;
}
