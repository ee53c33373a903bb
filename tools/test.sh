#!/usr/bin/env bash
# The README's test command: install missing dependencies, configure, build, run every test.
#   tools/test.sh             release build in build/ (CUDA compiled when nvcc is found), all tests
#   tools/test.sh --sanitize  ASan+UBSan build of the CPU library in build-asan/, all tests
# Extra arguments after the mode go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=release
if [ "${1:-}" = "--sanitize" ]; then mode=sanitize; shift; fi

tools/install-deps.sh

jobs=$(nproc)
if [ "$mode" = sanitize ]; then
  # The CUDA runtime and ASan do not mix (ASan reserves the address ranges the driver wants);
  # the sanitizer run covers the CPU library, the reference for every backend.
  build=build-asan
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSPCONV_SANITIZE=ON \
        -DSPCONV_WERROR=ON -DSPCONV_CUDA=OFF "$@" >/dev/null
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:check_initialization_order=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  build=build
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPCONV_WERROR=ON "$@" >/dev/null
fi
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
