#include <holdfast/holdfast.hpp>

#include <cstdio>

int main() {
  std::printf("holdfast %s\n", holdfast::version.string);
  return 0;
}
