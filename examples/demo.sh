#!/usr/bin/env bash
# The README's first command, exactly as the README shows it (the region below): configure the
# `demo` preset (g++, Release, examples only) in build/demo and build its one target, the main
# job (the `demo` build preset: a newcomer waits for one program, not every example), then run it,
# which prints its timeline and `verdict: PASS` or `verdict: FAIL`. CTest runs this script as
# example.readme_demo_command in the presets with HOLDFAST_HEAVY_TESTS and a Release build
# (gcc-20-release), from the repository root, as a newcomer would type it.
set -euo pipefail
cd "$(dirname "$0")/.."
# [snippet]
cmake --preset demo && cmake --build --preset demo && ./build/demo/examples/preemptible_training
# [/snippet]
