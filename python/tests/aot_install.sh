#!/usr/bin/env bash
# The ahead-of-time build: pip install ./python into a temporary folder (the C library taken from
# $SPCONV_C_BUILD_DIR when set), then use it from outside the checkout.
set -euo pipefail
py=${1:-python3}
# An absolute path (the check runs from another folder); not resolved through symlinks, which
# would leave the virtual environment.
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; *) py=$(command -v "$py") ;; esac
root=$(cd "$(dirname "$0")/../.." && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
"$py" -m pip install -q --no-build-isolation --no-deps --target "$prefix" "$root/python"
cd "$prefix"
PYTHONPATH=$prefix "$py" - <<'PY'
import torch
import spconv_c
import spconv_c.pytorch as spconv
assert spconv_c.BUILD_KIND == "aot", spconv_c.BUILD_KIND
assert spconv_c.__file__.startswith(__import__("os").getcwd()), spconv_c.__file__
idx = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2]], dtype=torch.int32)
x = spconv.SparseConvTensor(torch.ones(2, 3), idx, [4, 4, 4], 1)
y = spconv.SubMConv3d(3, 5, 3)(x)
assert y.features.shape == (2, 5)
print("aot: pip install ./python works:", spconv_c.__file__)
PY
