#!/usr/bin/env bash
# Install the Debian packages that building and testing spconv needs, only those missing.
# Idempotent, and silent when everything is already there. Run as root (or with sudo available).
set -euo pipefail

packages=(
  cmake ninja-build gcc g++ make pkg-config   # build
  libcmocka-dev                              # tests
  libopenblas-dev                            # CBLAS GEMM (a C fallback exists without it)
  libpcl-dev                                 # binary PCD reading through PCL's I/O module
  libpng-dev                                 # PNG pictures of results
  valgrind                                   # leak checks of the tensor tests
  clang libclang-rt-14-dev                   # libFuzzer targets
  python3 python3-venv python3-dev           # the PyTorch binding's tests (tools/test-python.sh)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
