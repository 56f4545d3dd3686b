// What every test shares, precompiled once per build (tests/CMakeLists.txt, HOLDFAST_TEST_PCH):
// doctest, every public header, the test-only fault injection and the standard headers most
// tests include. Each test still includes what it uses; this only saves the parsing.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <holdfast/holdfast.hpp>
#include <holdfast/testing/fault_io.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>
