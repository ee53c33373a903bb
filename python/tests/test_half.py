"""float16 and bfloat16 through the modules, against dense PyTorch in float64 on the same 16-bit
values: outputs, input and weight gradients.

The bound comes from the engine's contract for 16-bit operands: every result is a sum of n terms
accumulated in float32 and rounded once to the 16-bit dtype (unit roundoff u: 2**-11 for float16,
2**-8 for bfloat16). With S the same sum over absolute values and g = n 2**-24 / (1 - n 2**-24),
    |result - exact| <= u |exact| + (1 + u) g S + eta,
eta being half the spacing of float16's subnormals (2**-25; bfloat16's are far smaller). Summing
in the 16-bit dtype, or rounding to the wrong one, breaks it."""

import pytest
import torch
import torch.nn.functional as F

import spconv_c.pytorch as spconv
from helpers import gather_dense, krsc_to_iodhw, krsc_to_oidhw, random_sites, scatter_dense

HALVES = {"float16": (torch.float16, 2.0**-11, 2.0**-25),
          "bfloat16": (torch.bfloat16, 2.0**-8, 2.0**-134)}


def assert_within(what, got, exact, sums, n, dtype_name):
    dtype, u, eta = HALVES[dtype_name]
    assert got.dtype == dtype, what
    g = n * 2.0**-24 / (1 - n * 2.0**-24)
    err = (got.double() - exact).abs()
    allowed = u * exact.abs() + (1 + u) * g * sums + eta
    worst = (err - allowed).max().item() if err.numel() else -1.0
    assert worst <= 0, f"{what}: error exceeds the bound by {worst:.3g}"


def dense_conv(kind, f, idx, w, b, shape, batch, k, s, p, d):
    x = scatter_dense(f, idx, shape, batch)
    if kind == "transposed":
        return F.conv_transpose3d(x, krsc_to_iodhw(w), b, s, p)
    pad = (k // 2) * d if kind == "subm" else p
    return F.conv3d(x, krsc_to_oidhw(w), b, 1 if kind == "subm" else s, pad, d)


@pytest.mark.parametrize("dtype_name", sorted(HALVES))
@pytest.mark.parametrize("kind", ["regular", "subm", "transposed"])
def test_conv_half_against_dense(seed, kind, dtype_name):
    dtype = HALVES[dtype_name][0]
    gen = torch.Generator().manual_seed(seed)
    shape, batch, cin, cout = [6, 5, 7], 2, 17, 9
    idx = random_sites(gen, batch, shape, 60)
    k, s, p, d = (3, 1, 1, 1) if kind == "subm" else (3, 2, 1, 1)
    if kind == "regular":
        conv = spconv.SparseConv3d(cin, cout, k, s, p, d, bias=True)
    elif kind == "subm":
        conv = spconv.SubMConv3d(cin, cout, k, bias=True)
    else:
        conv = spconv.SparseConvTranspose3d(cin, cout, k, s, p, bias=True)
    conv = conv.to(dtype)
    feats = torch.randn(idx.shape[0], cin, generator=gen).to(dtype).requires_grad_(True)
    y = conv(spconv.SparseConvTensor(feats, idx, shape, batch))
    assert y.features.dtype == dtype
    proj = torch.randn(y.features.shape, generator=gen).to(dtype)
    gf, gw = torch.autograd.grad((y.features * proj).sum(), [feats, conv.weight])

    def oracle(f, w, b, pr):
        f = f.detach().double().requires_grad_(True)
        w = w.detach().double().requires_grad_(True)
        out = gather_dense(dense_conv(kind, f, idx, w, b.detach().double(), shape, batch,
                                      k, s, p, d), y.indices)
        grads = torch.autograd.grad((out * pr.double()).sum(), [f, w])
        return out.detach(), grads[0], grads[1]

    ey, egf, egw = oracle(feats, conv.weight, conv.bias, proj)
    sy, sgf, sgw = oracle(feats.abs(), conv.weight.abs(), conv.bias.abs(), proj.abs())
    kv = k ** 3
    assert_within("output", y.features, ey, sy, kv * cin + 1, dtype_name)
    assert_within("grad features", gf, egf, sgf, kv * cout, dtype_name)
    assert_within("grad weight", gw, egw, sgw, max(len(idx), len(y.indices)), dtype_name)


@pytest.mark.parametrize("dtype_name", sorted(HALVES))
def test_max_pool_and_dense_half(seed, dtype_name):
    """Pooling picks values, so its output is the dense max pool's, bit for bit; each input's
    gradient is one sum over the outputs that picked it; to-dense only moves elements."""
    dtype = HALVES[dtype_name][0]
    gen = torch.Generator().manual_seed(seed)
    shape, batch = [6, 6, 5], 2
    idx = random_sites(gen, batch, shape, 80)
    feats = (torch.randn(idx.shape[0], 5, generator=gen) - 1).to(dtype).requires_grad_(True)
    x = spconv.SparseConvTensor(feats, idx, shape, batch)
    y = spconv.SparseMaxPool3d(3, 2, 1)(x)
    f2 = feats.detach().double().requires_grad_(True)
    dense = F.max_pool3d(scatter_dense(f2, idx, shape, batch, fill=float("-inf")), 3, 2, 1)
    at_sites = gather_dense(dense, y.indices)
    assert y.features.dtype == dtype
    assert torch.equal(y.features.double(), at_sites)
    proj = torch.randn(y.features.shape, generator=gen).to(dtype)
    (g,) = torch.autograd.grad((y.features * proj).sum(), [feats])
    (eg,) = torch.autograd.grad((at_sites * proj.double()).sum(), [f2], retain_graph=True)
    (sg,) = torch.autograd.grad((at_sites * proj.double().abs()).sum(), [f2])
    assert_within("pool grad", g, eg, sg, 27, dtype_name)
    d = x.dense()
    assert d.dtype == dtype
    assert torch.equal(d.double(), scatter_dense(feats.detach().double(), idx, shape, batch))
