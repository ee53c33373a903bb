#!/usr/bin/env bash
# The PyTorch binding's tests (python/), run by tools/test.sh after the C tests.
#   tools/test-python.sh [pytest args]
# Uses the virtual environment .venv/ of the checkout, creating it when missing and installing
# what is missing in it: torch (the CPU-only wheels of download.pytorch.org when that index is
# reachable, else PyPI's, a few GB; an existing .venv is reused as it is), numpy, pytest, and
# spconv 2.3.8 (optional: the side-by-side tests skip without it). Then it builds the C library
# in build/ if needed, compiles the extension just in time (build/python-ext/), runs pytest, and
# checks the ahead-of-time build (pip install ./python into a temporary folder) unless
# SPCONV_C_SKIP_AOT=1. SPCONV_C_VENV overrides the environment's folder.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

venv=${SPCONV_C_VENV:-.venv}
py=$venv/bin/python
if [ ! -x "$py" ]; then
  echo "test-python: creating $venv"
  python3 -m venv "$venv"
fi
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "test-python: installing torch into $venv"
  if ! "$py" -m pip install -q --timeout 20 --retries 1 \
         --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null; then
    echo "test-python: the CPU-only index is not reachable; installing torch from PyPI"
    "$py" -m pip install -q torch
  fi
fi
"$py" -c "import numpy, pytest" 2>/dev/null || "$py" -m pip install -q numpy pytest
if ! "$py" -c "import spconv" 2>/dev/null; then
  "$py" -m pip install -q spconv==2.3.8 ||
    echo "test-python: spconv 2.3.8 is not installable here; its side-by-side tests will skip"
fi
setup=$(( $(date +%s) - start ))

# The C library the just-in-time build links (tools/test.sh has usually built it already).
if [ ! -f build/libspconv.so ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc)" --target spconv
fi
export SPCONV_C_BUILD_DIR=$PWD/build
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
"$py" -c "import spconv_c; print('test-python: extension', spconv_c.BUILD_KIND)"
"$py" -m pytest -q python/tests "$@"
# The side-by-side comparison with spconv in a process of its own with one OpenMP thread.
OMP_NUM_THREADS=1 "$py" -m pytest -q python/tests/test_spconv_compat.py "$@"

if [ "${SPCONV_C_SKIP_AOT:-0}" != 1 ]; then
  python/tests/aot_install.sh "$py"
fi
echo "test-python: finished in $(( $(date +%s) - start )) s (environment $setup s)"
