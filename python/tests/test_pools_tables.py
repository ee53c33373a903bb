"""Average and global pooling, sparse_add and the tables (spconv 2.x's SparseAvgPool*d,
SparseGlobalMaxPool / AvgPool, functional.sparse_add, JoinTable, AddTable, AddTableMisaligned,
ConcatTable) against dense PyTorch and brute force, in float64 on fresh random geometries.

Average pooling's oracle: the window sums of the dense features and of the occupancy (1 at the
active sites) from a depthwise conv with a kernel of ones (which takes dilation, as avg_pool does
not); the mean at an output site is their ratio. Tolerance as elsewhere in the dense oracles
(1e-10 for float64 sums of a few dozen values below ~10)."""

import pytest
import torch
import torch.nn.functional as F

import spconv_c.pytorch as spconv
from helpers import check_grads
from test_nd_layers import at, draw, leaf, out_size, sparse_input, to_dense

TOL = dict(rtol=1e-10, atol=1e-10)
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
AVG = {1: spconv.SparseAvgPool1d, 2: spconv.SparseAvgPool2d, 3: spconv.SparseAvgPool3d}


def window_means(feats, idx, shape, batch, k, s, p, d):
    """Dense [B, C, *out] of each window's mean over its active sites (0 where none)."""
    ndim = len(shape)
    c = feats.shape[1]
    ones = feats.new_ones((c, 1, *k))
    sums = CONV[ndim](to_dense(feats, idx, shape, batch), ones, None, s, p, d, groups=c)
    mask = to_dense(feats.new_ones((feats.shape[0], 1)), idx, shape, batch)
    counts = CONV[ndim](mask, feats.new_ones((1, 1, *k)), None, s, p, d)
    return sums / counts.clamp(min=1), counts


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("trial", range(4))
def test_avg_pool(seed, ndim, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    feats, idx, shape, batch, _ = sparse_input(gen, ndim)
    while True:
        k, s, d = draw(gen, 1, 3, ndim), draw(gen, 1, 2, ndim), draw(gen, 1, 2, ndim)
        p = [draw(gen, 0, kk // 2) for kk in k]
        if all(out_size(*a) > 0 for a in zip(shape, k, s, p, d)):
            break
    y = AVG[ndim](k, s, p, d)(spconv.SparseConvTensor(feats, idx, shape, batch))
    f2 = leaf(feats)
    dense, counts = window_means(f2, idx, shape, batch, k, s, p, d)
    assert list(dense.shape[2:]) == y.spatial_shape
    ref = at(dense, y.indices)
    torch.testing.assert_close(y.features, ref, **TOL)
    # the output sites are exactly the windows with an active site
    occupied = (counts[:, 0] > 0).nonzero().int()
    order = lambda t: t[torch.argsort(  # noqa: E731
        sum(t[:, i].long() * 10 ** (2 * (ndim - i)) for i in range(ndim + 1)))]
    assert torch.equal(order(y.indices), order(occupied))
    check_grads(y.features, ref, [(feats, f2)], gen, **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_avg_pool_16_bit(seed, dtype):
    # Summed in float32 and rounded once: against the float64 mean m of the same 16-bit values,
    # |ours - m| <= u16 |m| + (n + 1) 2^-24 mean(|x|) for a window of n active sites (the f32
    # sum's error gamma_{n-1} over its n terms, the division's, each term's exact conversion),
    # with u16 = 2^-11 (float16) or 2^-8 (bfloat16) the final rounding.
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, _ = sparse_input(gen, 3)
    x = feats.detach().to(dtype)
    y = spconv.SparseAvgPool3d(3, 2, 1)(spconv.SparseConvTensor(x, idx, shape, batch))
    assert y.features.dtype == dtype
    means, counts = window_means(x.double(), idx, shape, batch, [3] * 3, [2] * 3, [1] * 3,
                                 [1] * 3)
    abs_means, _ = window_means(x.double().abs(), idx, shape, batch, [3] * 3, [2] * 3, [1] * 3,
                                [1] * 3)
    m, n, a = at(means, y.indices), at(counts, y.indices), at(abs_means, y.indices)
    u16 = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
    bound = u16 * m.abs() + (n + 1) * 2.0 ** -24 * a
    assert ((y.features.double() - m).abs() <= bound).all()


def test_global_pools(seed):
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, c = sparse_input(gen, 3)
    empty = batch  # one more batch entry, without sites
    x = spconv.SparseConvTensor(feats, idx, shape, batch + 1)
    gmax, gavg = spconv.SparseGlobalMaxPool()(x), spconv.SparseGlobalAvgPool()(x)
    assert list(gmax.shape) == list(gavg.shape) == [batch + 1, c]
    values_max, values_avg = gmax.detach(), gavg.detach()
    for b in range(batch + 1):
        rows = [feats.detach()[i] for i in range(idx.shape[0]) if idx[i, 0] == b]
        if b == empty:
            assert not rows and (values_max[b] == 0).all() and (values_avg[b] == 0).all()
            continue
        for j in range(c):
            column = [float(r[j]) for r in rows]
            assert values_max[b, j].item() == max(column)
            assert abs(values_avg[b, j].item() - sum(column) / len(column)) < 1e-12
    # gradients: the max's to its one maximum, the mean's 1/n to every site of the entry
    (g,) = torch.autograd.grad(gmax.sum() + gavg.sum(), [feats])
    for b in range(batch):
        sel = idx[:, 0] == b
        f, gb = feats.detach()[sel], g[sel]
        want = torch.full_like(f, 1.0 / f.shape[0])
        want[f.argmax(0), torch.arange(c)] += 1.0
        torch.testing.assert_close(gb, want, **TOL)


def test_sparse_add_and_tables(seed):
    gen = torch.Generator().manual_seed(seed)
    fa, ia, shape, batch, c = sparse_input(gen, 3)
    fb = torch.randn(ia.shape[0] // 2 + 1, c, generator=gen, dtype=torch.float64)
    # b: the first half of a's sites and its last one, with its first row moved to a site that
    # a lacks where there is one, so that the union is larger than either operand
    ib = torch.cat([ia[: ia.shape[0] // 2], ia[-1:]]).clone()
    taken = {tuple(r) for r in ia.tolist()}
    free = [(b, z) for b in range(batch) for z in range(shape[0]) if (b, z, 0, 0) not in taken]
    if free:
        ib[0] = torch.tensor([free[0][0], free[0][1], 0, 0], dtype=torch.int32)
    fb.requires_grad_(True)
    a = spconv.SparseConvTensor(fa, ia, shape, batch)
    b = spconv.SparseConvTensor(fb, ib, shape, batch)
    s = spconv.functional.sparse_add(a, b)
    fa2, fb2 = leaf(fa), leaf(fb)
    dense = to_dense(fa2, ia, shape, batch) + to_dense(fb2, ib, shape, batch)
    union = torch.unique(torch.cat([ia, ib]), dim=0)
    assert torch.equal(s.indices, union)  # sorted by (b, z, y, x)
    ref = at(dense, s.indices)
    torch.testing.assert_close(s.features, ref, **TOL)
    check_grads(s.features, ref, [(fa, fa2), (fb, fb2)], gen, **TOL)
    t = spconv.AddTableMisaligned()([a, b])
    assert torch.equal(t.indices, s.indices) and torch.equal(t.features, s.features)
    # Aligned tables: the same sites row for row.
    a2 = a.replace_feature(fa * 2)
    joined = spconv.JoinTable()([a, a2])
    assert joined.indices is ia and torch.equal(joined.features, torch.cat([fa, fa * 2], 1))
    added = spconv.AddTable()([a, a2, a])
    torch.testing.assert_close(added.features, fa * 4, **TOL)
    outs = spconv.ConcatTable().add(spconv.SparseMaxPool3d(2)).add(spconv.SparseAvgPool3d(2))(a)
    assert len(outs) == 2 and torch.equal(outs[0].indices, outs[1].indices)
    with pytest.raises(ValueError, match="AddTable: operand 1 has .* sites, operand 0 has"):
        spconv.AddTable()([a, b])
    with pytest.raises(ValueError, match="sparse_add: operand 1 .* does not match operand 0"):
        spconv.functional.sparse_add(a, spconv.SparseConvTensor(fb, ib, shape, batch + 1))


def test_pool_errors():
    with pytest.raises(NotImplementedError, match="submanifold average pooling"):
        spconv.SparseAvgPool(3, 2, subm=True)
    with pytest.raises(TypeError, match="SparseGlobalMaxPool takes a SparseConvTensor"):
        spconv.SparseGlobalMaxPool()(torch.zeros(2, 2))
    idx = torch.tensor([[0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="SparseAvgPool2d is a 2-d layer; its input is 1-d"):
        spconv.SparseAvgPool2d(2)(spconv.SparseConvTensor(torch.zeros(1, 1), idx, [4], 1))


def test_pool_inputs_checked(seed):
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, _ = sparse_input(gen, 2)
    pool = spconv.SparseAvgPool2d(2)
    with pytest.raises(RuntimeError, match=r"SparseAvgPool2d: features must be \[.*\] \(a row "
                                           r"per site\), got"):
        pool(spconv.SparseConvTensor(torch.cat([feats, feats[:1]]), idx, shape, batch))
    with pytest.raises(RuntimeError, match="SparseAvgPool2d: features must be floating"):
        pool(spconv.SparseConvTensor(feats.detach().long(), idx, shape, batch))
    # global pools: a site of a batch entry past batch_size is an error, not left out
    bad = idx.clone()
    bad[-1, 0] = batch
    with pytest.raises(ValueError, match=f"SparseGlobalMaxPool: indices row {idx.shape[0] - 1} "
                                         f"has batch index {batch} outside batch size {batch}"):
        spconv.SparseGlobalMaxPool()(spconv.SparseConvTensor(feats, bad, shape, batch))
    with pytest.raises(ValueError, match="sparse_add: operand 1's indices row 0 = .* is outside"):
        neg = idx.clone()
        neg[0, 1] = -1
        spconv.functional.sparse_add(spconv.SparseConvTensor(feats, idx, shape, batch),
                                     spconv.SparseConvTensor(feats, neg, shape, batch))
    with pytest.raises(ValueError, match="sparse_add: operand 1 has torch.float32 features, "
                                         "operand 0 torch.float64"):
        spconv.functional.sparse_add(spconv.SparseConvTensor(feats, idx, shape, batch),
                                     spconv.SparseConvTensor(feats.float(), idx, shape, batch))
    # spconv's base classes default to stride 1; the 1d / 2d / 3d classes to the kernel's size
    assert spconv.SparseAvgPool(2, 3).stride == [1, 1] == spconv.SparseMaxPool(2, 3).stride
    assert spconv.SparseAvgPool2d(3).stride == [3, 3] == spconv.SparseMaxPool2d(3).stride


def test_sparse_add_keeps_a_cache_only_for_the_same_rows(seed):
    # The union of a tensor and a subset of its sites is its sites: sorted, they are its rows
    # only when it was sorted. The cache goes with them then, and a subm layer under a cached
    # key reuses its rulebook; otherwise the result starts a new cache and the layer builds.
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, c = sparse_input(gen, 3)
    for order in ("sorted", "shuffled"):
        rows = torch.unique(idx, dim=0) if order == "sorted" else idx
        layer = spconv.SubMConv3d(c, 2, 3, indice_key="s").double()
        a = layer(spconv.SparseConvTensor(feats[: rows.shape[0]], rows, shape, batch))
        b = spconv.SparseConvTensor(a.features[:3].detach(), rows[:3], shape, batch)
        s = spconv.functional.sparse_add(a, b)
        if order == "sorted" or torch.equal(torch.unique(rows, dim=0), rows):
            assert s.indice_dict is a.indice_dict
        else:
            assert s.indice_dict == {}
        y = spconv.SubMConv3d(2, 2, 3, indice_key="s").double()(s)  # never refused
        assert y.features.shape == (rows.shape[0], 2)
