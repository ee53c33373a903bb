#!/usr/bin/env bash
# Gather, on this machine, what tools/gpu-check.sh needs on a lent GPU machine, which has no
# package registry and no ../shared (see ../shared/GPU.md):
#   .gpu-deps/*.deb   the Debian packages the build and the tests need (unpacked there, into
#                     .gpu-deps/root, never into /)
#   .gpu-deps/data/   the few files of ../shared/data that GPU tests and benchmarks read
# .gpu-deps/ is ignored by git; name it in the device run's `carry` list (about 20 MB).
# Idempotent: packages and files already there are kept.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=.gpu-deps
data_src=${SPCONV_DATA_DIR:-../shared/data}
# OpenBLAS's pthread build links libgfortran5 (which needs libquadmath0): an image without them
# would fail CMake's BLAS check and build without BLAS, changing the CPU reference's figures.
packages=(libcmocka0 libcmocka-dev libopenblas0 libopenblas0-pthread libopenblas-dev
          libopenblas-pthread-dev libgfortran5 libquadmath0)
# The real voxel set of spconv's own network benchmark, one KITTI scan, and spconv's benchmark
# point cloud (198,130 points: the voxelizer's real-scan test and benchmark).
data_files=(spconv_test_indices.i32 spconv_test_features.f32 kitti_000008.bin
            spconv_benchmark_pc.bin)

mkdir -p "$deps/data"
# A rehearsal of gpu-check.sh here unpacks into root/; it is rebuilt there, so do not carry it.
rm -rf "$deps/root"

missing=()
for p in "${packages[@]}"; do
  compgen -G "$deps/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-deps: downloading ${missing[*]}"
  (cd "$deps" && apt-get download -q "${missing[@]}")
fi

for f in "${data_files[@]}"; do
  if [ ! -f "$data_src/$f" ]; then
    echo "gpu-deps: $data_src/$f is missing; GPU tests that need it will skip" >&2
  elif [ ! -f "$deps/data/$f" ]; then
    cp "$data_src/$f" "$deps/data/$f"
  fi
done

echo "gpu-deps: $(du -sh "$deps" | cut -f1) in $deps/ (carry it: \"carry\": [\"$deps\"])"
