#!/usr/bin/env bash
# The README's test command: install missing dependencies, configure, build, run every test.
#   tools/test.sh             release build in build/ (CUDA compiled when nvcc is found), all tests
#   tools/test.sh --sanitize  ASan+UBSan build of the CPU library in build-asan/, all tests
#   tools/test.sh --emulate-cuda
#                             the CUDA backend as the host emulation (docs/cuda.md) in build-emu/:
#                             cuda/*.cu compiled by g++, every CUDA test runs its kernels on the CPU,
#                             queued work as late as CUDA allows, threads of each launch in a
#                             shuffled order (SPCONV_CUDA_EMULATION_SCHEDULE=shuffle:SEED, a fresh
#                             seed each run, printed; set the variable to repeat one)
#   tools/test.sh --emulate-cuda --sanitize
#                             the same under ASan+UBSan in build-emu-asan/ (kernels included)
#   tools/test.sh --no-openmp the CPU library built without OpenMP in build-noomp/ (every parallel
#                             loop a plain loop, as core/parallel.h promises), all C tests
#   tools/test.sh --fuzz      libFuzzer targets (clang) in build-fuzz/: every seed and regression
#                             input of tests/fuzz/corpus/, then a short mutation run per target
#                             (FUZZ_SECONDS each, default 20) into a scratch corpus
# Extra arguments after the mode go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=0 emulate=0 fuzz=0 noomp=0
while [ $# -gt 0 ]; do
  case $1 in
    --sanitize) sanitize=1 ;;
    --emulate-cuda) emulate=1 ;;
    --fuzz) fuzz=1 ;;
    --no-openmp) noomp=1 ;;
    *) break ;;
  esac
  shift
done

tools/install-deps.sh

jobs=$(nproc)
if [ $fuzz = 1 ]; then
  build=build-fuzz
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DSPCONV_FUZZ=ON -DSPCONV_CUDA=OFF -DSPCONV_BUILD_TESTS=OFF "$@" >/dev/null
  targets=(fuzz_bin fuzz_npy fuzz_pcd fuzz_ply)
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  for t in "${targets[@]}"; do
    corpus=tests/fuzz/corpus/${t#fuzz_}
    log=$scratch/$t.log
    mkdir -p "$scratch/$t"
    # Every committed input once (a regression run), then mutations from them into a scratch
    # folder so that the repository is never written. A crash or sanitizer report exits non-zero.
    art=(-artifact_prefix="$PWD/$build/")
    if ! "$build/tests/fuzz/$t" "${art[@]}" -runs=0 -close_fd_mask=3 "$corpus" >"$log" 2>&1 ||
       ! "$build/tests/fuzz/$t" "${art[@]}" -max_total_time="${FUZZ_SECONDS:-20}" -close_fd_mask=3 \
           -print_final_stats=1 "$scratch/$t" "$corpus" >>"$log" 2>&1; then
      tail -n 40 "$log"
      echo "fuzz: $t FAILED (the crashing input is $build/crash-*)"
      exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    echo "fuzz: $t passed: $(ls "$corpus" | wc -l) corpus inputs, ${runs:-?} executions in ${FUZZ_SECONDS:-20} s"
  done
  exit 0
fi

configure=(-DSPCONV_WERROR=ON)
if [ $emulate = 1 ]; then
  # The emulation is this build's CUDA backend: nvcc is not asked for even where it exists.
  build=build-emu
  configure+=(-DSPCONV_CUDA=OFF -DSPCONV_CUDA_EMULATION=ON)
  # A GPU runs a launch's threads in any order: a kernel whose result depends on the order is
  # wrong, and a scrambled order shows it where the index order would hide it.
  if [ -z "${SPCONV_CUDA_EMULATION_SCHEDULE:-}" ]; then
    export SPCONV_CUDA_EMULATION_SCHEDULE=shuffle:$(( (RANDOM << 15) | RANDOM ))
  fi
  echo "emulated CUDA: SPCONV_CUDA_EMULATION_SCHEDULE=$SPCONV_CUDA_EMULATION_SCHEDULE"
elif [ $noomp = 1 ]; then
  # OpenMP is optional: without it the library, the tools and the tests must still build
  # warning-free and pass (a stray omp_* call outside core/parallel.h fails here).
  build=build-noomp
  configure+=(-DSPCONV_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON)
else
  build=build
fi
if [ $sanitize = 1 ]; then
  # The CUDA runtime and ASan do not mix (ASan reserves the address ranges the driver wants);
  # the sanitizer run covers the CPU library, the reference for every backend, and with
  # --emulate-cuda the CUDA backend's own code too (its device memory is then host memory).
  if [ $emulate = 0 ]; then configure+=(-DSPCONV_CUDA=OFF); fi
  build=$build-asan
  configure+=(-DCMAKE_BUILD_TYPE=Debug -DSPCONV_SANITIZE=ON)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:check_initialization_order=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  configure+=(-DCMAKE_BUILD_TYPE=Release)
fi
cmake -S . -B "$build" -G Ninja "${configure[@]}" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
if [ $emulate = 1 ]; then
  # The launch checks and the map builders once more with every launch's threads in reverse:
  # the schedule checks of test_cuda_launch only run under forward or reverse.
  SPCONV_CUDA_EMULATION_SCHEDULE=reverse ctest --test-dir "$build" --output-on-failure \
    -j "$jobs" -R 'test_cuda_launch|test_backend_ops'
fi
# The PyTorch binding's tests (pytest in .venv/, tools/test-python.sh) after the C tests of the
# release build (SPCONV_C_SKIP_PYTHON=1: not now).
if [ $sanitize = 0 ] && [ $emulate = 0 ] && [ $noomp = 0 ] && [ "${SPCONV_C_SKIP_PYTHON:-0}" != 1 ]; then
  tools/test-python.sh
fi
