#!/usr/bin/env bash
# The README's main-job command: install what is missing, configure and build the `spconv` tool
# in build/, run `spconv run` on the bundled sample scan (or on the scan and options given) and
# say where the picture is.
#   tools/run.sh                              second on data/sample_scan.bin, outputs in out/
#   tools/run.sh SCAN --net unet --out DIR    any `spconv run` arguments
# Extra CMake configure options can be given in $SPCONV_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install-deps.sh
# shellcheck disable=SC2086  # word splitting of the extra options is intended
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SPCONV_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$(nproc)" --target spconv_cli

# The output folder: the one given with --out, else out/.
out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --out) out="${args[i + 1]:-}" ;;
    --out=*) out="${args[i]#--out=}" ;;
  esac
done
if [ -z "$out" ]; then
  out=out
  args+=(--out "$out")
fi

build/tools/spconv run "${args[@]}"
case "$out" in
  /*) where="$out" ;;
  *) where="$(pwd)/$out" ;;
esac
if [ -f "$where/picture.png" ]; then
  echo "picture: $where/picture.png"
fi
