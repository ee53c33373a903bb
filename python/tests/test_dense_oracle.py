"""Each module against dense PyTorch (conv3d, conv_transpose3d, max_pool3d) in float64 on fresh
random geometries: outputs at the active sites (and nothing elsewhere), input and weight
gradients."""

import pytest
import torch
import torch.nn.functional as F

import spconv_c.pytorch as spconv
import helpers
from helpers import (gather_dense, krsc_as_read, krsc_to_iodhw, krsc_to_oidhw, random_sparse,
                     scatter_dense)

TOL = dict(rtol=1e-10, atol=1e-10)


def geometry(gen):
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    return dict(batch=r(1, 2), shape=[r(4, 8), r(4, 8), r(4, 8)], cin=r(1, 4), cout=r(1, 4),
                density=0.1 + 0.5 * float(torch.rand(1, generator=gen)))


def make_input(gen, g):
    count = max(1, int(g["density"] * g["batch"] * g["shape"][0] * g["shape"][1] * g["shape"][2]))
    feats, idx = random_sparse(gen, g["batch"], g["shape"], count, g["cin"])
    feats.requires_grad_(True)
    return feats, idx


def check_grads(out_sparse, out_dense_at_sites, params, gen):
    helpers.check_grads(out_sparse, out_dense_at_sites, params, gen, **TOL)


def oracle_leaves(feats, weight):
    """Separate leaves for the dense path so both gradients are computed independently."""
    return feats.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)


@pytest.mark.parametrize("trial", range(6))
def test_regular_conv(seed, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    g = geometry(gen)
    while True:  # redraw the conv until its output grid is not empty
        k = int(torch.randint(1, 4, (1,), generator=gen))
        s = int(torch.randint(1, 3, (1,), generator=gen))
        p = int(torch.randint(0, 2, (1,), generator=gen))
        d = int(torch.randint(1, 3, (1,), generator=gen))
        if all((n + 2 * p - d * (k - 1) - 1) // s + 1 > 0 for n in g["shape"]):
            break
    if k == 1 and s == 1 and p != 0:
        with pytest.raises(ValueError, match="padding must be zero for a 1x1 conv"):
            spconv.SparseConv3d(1, 1, k, s, p)  # as spconv 2.x
        p = 0
    feats, idx = make_input(gen, g)
    conv = spconv.SparseConv3d(g["cin"], g["cout"], k, s, p, d, bias=True).double()
    x = spconv.SparseConvTensor(feats, idx, g["shape"], g["batch"])
    y = conv(x)
    f2, w2 = oracle_leaves(feats, conv.weight)
    dense = F.conv3d(scatter_dense(f2, idx, g["shape"], g["batch"]),
                     krsc_to_oidhw(krsc_as_read(conv, w2)), conv.bias.detach(), s, p, d)
    assert list(dense.shape[2:]) == y.spatial_shape
    at_sites = gather_dense(dense, y.indices)
    torch.testing.assert_close(y.features, at_sites, **TOL)
    # Every site the dense conv reaches with a non-bias value is an output site.
    mask = torch.zeros(dense.shape[0], *dense.shape[2:], dtype=torch.bool)
    i = y.indices.long()
    mask[i[:, 0], i[:, 1], i[:, 2], i[:, 3]] = True
    rest = dense.detach().permute(0, 2, 3, 4, 1)[~mask] - conv.bias.detach()
    assert rest.numel() == 0 or rest.abs().max().item() < 1e-12
    check_grads(y.features, at_sites, [(feats, f2), (conv.weight, w2)], gen)


@pytest.mark.parametrize("trial", range(6))
def test_subm_conv(seed, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    g = geometry(gen)
    k = [1, 3, 5][int(torch.randint(0, 3, (1,), generator=gen))]
    d = int(torch.randint(1, 3, (1,), generator=gen))
    feats, idx = make_input(gen, g)
    conv = spconv.SubMConv3d(g["cin"], g["cout"], k, dilation=d, bias=False).double()
    y = conv(spconv.SparseConvTensor(feats, idx, g["shape"], g["batch"]))
    assert torch.equal(y.indices, idx)  # outputs in the input's row order
    f2, w2 = oracle_leaves(feats, conv.weight)
    dense = F.conv3d(scatter_dense(f2, idx, g["shape"], g["batch"]),
                     krsc_to_oidhw(krsc_as_read(conv, w2)), None, 1, (k // 2) * d, d)
    at_sites = gather_dense(dense, idx)
    torch.testing.assert_close(y.features, at_sites, **TOL)
    check_grads(y.features, at_sites, [(feats, f2), (conv.weight, w2)], gen)


@pytest.mark.parametrize("trial", range(6))
def test_transposed_conv(seed, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    g = geometry(gen)
    g["shape"] = [max(2, n // 2) for n in g["shape"]]
    k = int(torch.randint(1, 4, (1,), generator=gen))
    s = int(torch.randint(1, 3, (1,), generator=gen))
    p = int(torch.randint(0, 2, (1,), generator=gen))
    if k == 1 and s == 1 and p != 0:
        # a 1x1 conv takes no padding, transposed or not (as spconv 2.x); the refusal is checked
        with pytest.raises(ValueError, match="padding must be zero for a 1x1 conv"):
            spconv.SparseConvTranspose3d(1, 1, k, s, p)
        p = 0
    if any((n - 1) * s - 2 * p + (k - 1) + 1 <= 0 for n in g["shape"]):
        pytest.skip("empty output for this geometry")
    feats, idx = make_input(gen, g)
    conv = spconv.SparseConvTranspose3d(g["cin"], g["cout"], k, s, p, bias=True).double()
    y = conv(spconv.SparseConvTensor(feats, idx, g["shape"], g["batch"]))
    f2, w2 = oracle_leaves(feats, conv.weight)
    dense = F.conv_transpose3d(scatter_dense(f2, idx, g["shape"], g["batch"]),
                               krsc_to_iodhw(krsc_as_read(conv, w2)), conv.bias.detach(), s, p)
    assert list(dense.shape[2:]) == y.spatial_shape
    at_sites = gather_dense(dense, y.indices)
    torch.testing.assert_close(y.features, at_sites, **TOL)
    check_grads(y.features, at_sites, [(feats, f2), (conv.weight, w2)], gen)


@pytest.mark.parametrize("trial", range(6))
def test_inverse_conv(seed, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    g = geometry(gen)
    k = int(torch.randint(2, 4, (1,), generator=gen))
    s = int(torch.randint(1, 3, (1,), generator=gen))
    p = int(torch.randint(0, 2, (1,), generator=gen))
    feats, idx = make_input(gen, g)
    down = spconv.SparseConv3d(g["cin"], g["cout"], k, s, p, bias=False, indice_key="d").double()
    up = spconv.SparseInverseConv3d(g["cout"], g["cin"], k, indice_key="d").double()
    x = spconv.SparseConvTensor(feats, idx, g["shape"], g["batch"])
    mid = down(x)
    mid_feats = mid.features.detach().clone().requires_grad_(True)
    y = up(mid.replace_feature(mid_feats))
    assert torch.equal(y.indices, idx) and y.spatial_shape == g["shape"]
    # Oracle: the transposed conv with the inverted conv's stride, padding, dilation, taken
    # without cropping and read at input site i + p.
    f2, w2 = oracle_leaves(mid_feats, up.weight)
    full = F.conv_transpose3d(scatter_dense(f2, mid.indices, mid.spatial_shape, g["batch"]),
                              krsc_to_iodhw(w2), None, s, 0)
    # Input sites beyond the last stride step have no pairs: pad the oracle with zeros there.
    need = [n + p - m for n, m in zip(g["shape"], full.shape[2:])]
    full = F.pad(full, [0, max(0, need[2]), 0, max(0, need[1]), 0, max(0, need[0])])
    shifted = idx.clone()
    shifted[:, 1:] += p
    at_sites = gather_dense(full, shifted) + up.bias.detach()
    torch.testing.assert_close(y.features, at_sites, **TOL)
    check_grads(y.features, at_sites, [(mid_feats, f2), (up.weight, w2)], gen)


@pytest.mark.parametrize("trial", range(6))
def test_inverse_of_a_transposed_conv(seed, trial):
    """An inverse conv on a transposed conv's key (as spconv 2.x allows) goes back to that conv's
    input sites: y[i] = sum_k W_k x[i * s - p + k * d], the pairs of the transposed conv read the
    other way, which is the dense regular conv with the same stride, padding and dilation over
    the transposed conv's output, read at its input sites."""
    gen = torch.Generator().manual_seed(seed + trial)
    g = geometry(gen)
    g["shape"] = [max(2, n // 2) for n in g["shape"]]
    k = int(torch.randint(2, 4, (1,), generator=gen))
    s = int(torch.randint(1, 3, (1,), generator=gen))
    p = int(torch.randint(0, 2, (1,), generator=gen))
    d = int(torch.randint(1, 3, (1,), generator=gen))
    if any((n - 1) * s - 2 * p + d * (k - 1) + 1 <= 0 for n in g["shape"]):
        pytest.skip("empty output for this geometry")
    feats, idx = make_input(gen, g)
    up = spconv.SparseConvTranspose3d(g["cin"], g["cout"], k, s, p, dilation=d, bias=False,
                                      indice_key="t").double()
    back = spconv.SparseInverseConv3d(g["cout"], g["cin"], k, indice_key="t").double()
    mid = up(spconv.SparseConvTensor(feats, idx, g["shape"], g["batch"]))
    mid_feats = mid.features.detach().clone().requires_grad_(True)
    y = back(mid.replace_feature(mid_feats))
    assert torch.equal(y.indices, idx) and y.spatial_shape == g["shape"]
    f2, w2 = oracle_leaves(mid_feats, back.weight)
    dense = F.conv3d(scatter_dense(f2, mid.indices, mid.spatial_shape, g["batch"]),
                     krsc_to_oidhw(w2), back.bias.detach(), s, p, d)
    at_sites = gather_dense(dense, idx)
    torch.testing.assert_close(y.features, at_sites, **TOL)
    check_grads(y.features, at_sites, [(mid_feats, f2), (back.weight, w2)], gen)


@pytest.mark.parametrize("trial", range(6))
def test_max_pool(seed, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    g = geometry(gen)
    k = int(torch.randint(1, 4, (1,), generator=gen))
    s = int(torch.randint(1, 3, (1,), generator=gen))
    p = int(torch.randint(0, k // 2 + 1, (1,), generator=gen))
    if any((n + 2 * p - (k - 1) - 1) // s + 1 <= 0 for n in g["shape"]):
        pytest.skip("empty output for this geometry")
    feats, idx = make_input(gen, g)
    feats = (feats.detach() - 1.0).requires_grad_(True)  # many all-negative windows: -inf start
    pool = spconv.SparseMaxPool3d(k, s, p)
    y = pool(spconv.SparseConvTensor(feats, idx, g["shape"], g["batch"]))
    f2 = feats.detach().clone().requires_grad_(True)
    dense = F.max_pool3d(scatter_dense(f2, idx, g["shape"], g["batch"], fill=float("-inf")),
                         k, s, p)
    assert list(dense.shape[2:]) == y.spatial_shape
    at_sites = gather_dense(dense, y.indices)
    torch.testing.assert_close(y.features, at_sites, **TOL)
    check_grads(y.features, at_sites, [(feats, f2)], gen)


def test_to_dense(seed):
    gen = torch.Generator().manual_seed(seed)
    g = geometry(gen)
    feats, idx = make_input(gen, g)
    x = spconv.SparseConvTensor(feats, idx, g["shape"], g["batch"])
    dense = spconv.ToDense()(x)
    f2 = feats.detach().clone().requires_grad_(True)
    ref = scatter_dense(f2, idx, g["shape"], g["batch"])
    torch.testing.assert_close(dense, ref, **TOL)
    torch.testing.assert_close(x.dense(channels_first=False), ref.permute(0, 2, 3, 4, 1), **TOL)
    proj = torch.randn(dense.shape, generator=gen, dtype=dense.dtype)
    (ga,) = torch.autograd.grad((dense * proj).sum(), [feats])
    (gb,) = torch.autograd.grad((ref * proj).sum(), [f2])
    torch.testing.assert_close(ga, gb, **TOL)
