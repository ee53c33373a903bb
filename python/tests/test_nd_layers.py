"""1-d and 2-d layers (spconv 2.x's SubMConv2d, SparseConv1d, SparseMaxPool2d, ...) against dense
PyTorch (conv1d / conv2d, conv_transpose1d / 2d, max_pool1d / 2d) in float64 on fresh random
geometries with a different kernel, stride, padding and dilation on each axis: outputs at the
active sites (and nothing elsewhere), input and weight gradients. The oracle works on nd dense
tensors of its own; it shares nothing with the lifting to the engine's 3-d space that the layers
do (core.py).

Tolerance: every output is a float64 sum of at most 3 * 3 * 4 products of values below ~10 in
magnitude, so the two orders of summation differ by far less than 1e-12; 1e-10 is the dense
oracle's tolerance elsewhere (test_dense_oracle.py), and a wrong pair or weight moves an output
by O(1)."""

import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import spconv_c.pytorch as spconv
from helpers import check_grads, krsc_as_read

TOL = dict(rtol=1e-10, atol=1e-10)
CONV = {1: F.conv1d, 2: F.conv2d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d}
POOL = {1: F.max_pool1d, 2: F.max_pool2d}
LAYERS = {1: (spconv.SparseConv1d, spconv.SubMConv1d, spconv.SparseConvTranspose1d,
              spconv.SparseInverseConv1d, spconv.SparseMaxPool1d),
          2: (spconv.SparseConv2d, spconv.SubMConv2d, spconv.SparseConvTranspose2d,
              spconv.SparseInverseConv2d, spconv.SparseMaxPool2d)}


def draw(gen, lo, hi, n=None):
    if n is None:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))
    return [int(v) for v in torch.randint(lo, hi + 1, (n,), generator=gen)]


def sparse_input(gen, ndim, least=3):
    """(features [N, C] float64 leaf, indices int32 [N, 1 + ndim], shape, batch, C)."""
    batch = draw(gen, 1, 2)
    shape = draw(gen, least, 9, ndim)
    cells = batch * torch.tensor(shape).prod().item()
    count = max(1, int((0.1 + 0.5 * float(torch.rand(1, generator=gen))) * cells))
    flat = torch.randperm(cells, generator=gen)[:count]
    cols = []
    for n in reversed([batch] + shape):
        cols.append(flat % n)
        flat = flat // n
    indices = torch.stack(list(reversed(cols)), 1).int()
    cin = draw(gen, 1, 4)
    feats = torch.randn(indices.shape[0], cin, generator=gen, dtype=torch.float64)
    return feats.requires_grad_(True), indices, shape, batch, cin


def to_dense(feats, indices, shape, batch, fill=0.0):
    """Differentiable dense [B, C, *shape] with ``fill`` at empty sites."""
    dense = torch.full((batch, *shape, feats.shape[1]), fill, dtype=feats.dtype)
    dense = dense.index_put(tuple(indices.long().t()), feats)
    return dense.movedim(-1, 1)


def at(dense, indices):
    """Rows [N, C] of dense [B, C, *shape] at ``indices``."""
    return dense.movedim(1, -1)[tuple(indices.long().t())]


def dense_weight(weight, transposed):
    """spconv's KRSC [C_out, *K, C_in] as torch's [C_out, C_in, *K] (or [C_in, C_out, *K] for a
    transposed conv)."""
    w = weight.movedim(-1, 1)
    return w.transpose(0, 1) if transposed else w


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def same_grads(out, ref, pairs, gen):
    check_grads(out, ref, pairs, gen, **TOL)


def nothing_else(y, dense, background):
    """No site outside y's holds anything but ``background`` in the dense result."""
    mask = torch.zeros(dense.shape[0], *dense.shape[2:], dtype=torch.bool)
    mask[tuple(y.indices.long().t())] = True
    rest = dense.detach().movedim(1, -1)[~mask]
    if isinstance(background, float):  # -inf: a pool's empty windows
        assert torch.isneginf(rest).all()
    else:
        assert rest.numel() == 0 or (rest - background).abs().max().item() < 1e-12


def out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("trial", range(4))
def test_regular_conv(seed, ndim, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    feats, idx, shape, batch, cin = sparse_input(gen, ndim)
    while True:  # per-axis geometry, redrawn until the output grid is not empty
        k, s, p, d = draw(gen, 1, 3, ndim), draw(gen, 1, 3, ndim), draw(gen, 0, 2, ndim), \
            draw(gen, 1, 2, ndim)
        if all(out_size(*a) > 0 for a in zip(shape, k, s, p, d)) and \
                not (k == [1] * ndim and s == [1] * ndim):
            break
    cout = draw(gen, 1, 4)
    conv = LAYERS[ndim][0](cin, cout, k, s, p, d, bias=True).double()
    assert list(conv.weight.shape) == [cout, *k, cin]  # spconv's KRSC
    y = conv(spconv.SparseConvTensor(feats, idx, shape, batch))
    assert y.indices.dtype == torch.int32 and list(y.indices.shape[1:]) == [ndim + 1]
    f2, w2 = leaf(feats), leaf(conv.weight)
    dense = CONV[ndim](to_dense(f2, idx, shape, batch), dense_weight(w2, False),
                       conv.bias.detach(), s, p, d)
    assert list(dense.shape[2:]) == y.spatial_shape
    ref = at(dense, y.indices)
    torch.testing.assert_close(y.features, ref, **TOL)
    nothing_else(y, dense, conv.bias.detach())
    same_grads(y.features, ref, [(feats, f2), (conv.weight, w2)], gen)
    # the layer's own dense output: its features at its sites, zero elsewhere
    torch.testing.assert_close(
        y.dense(), to_dense(y.features.detach(), y.indices, y.spatial_shape, batch), **TOL)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("trial", range(4))
def test_subm_conv(seed, ndim, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    feats, idx, shape, batch, cin = sparse_input(gen, ndim)
    k = [[1, 3, 5][draw(gen, 0, 2)] for _ in range(ndim)]
    d = draw(gen, 1, 2, ndim)
    cout = draw(gen, 1, 4)
    conv = LAYERS[ndim][1](cin, cout, k, dilation=d, bias=False, indice_key="s").double()
    x = spconv.SparseConvTensor(feats, idx, shape, batch)
    y = conv(x)
    assert y.indices is idx  # outputs in the input's rows, the same tensor
    f2, w2 = leaf(feats), leaf(conv.weight)
    dense = CONV[ndim](to_dense(f2, idx, shape, batch),
                       dense_weight(krsc_as_read(conv, w2), False), None, 1,
                       [(kk // 2) * dd for kk, dd in zip(k, d)], d)
    ref = at(dense, idx)
    torch.testing.assert_close(y.features, ref, **TOL)
    same_grads(y.features, ref, [(feats, f2), (conv.weight, w2)], gen)
    # A second layer under the same key reuses the rulebook; on the same sites it is the same.
    again = LAYERS[ndim][1](cout, cout, k, dilation=d, bias=False, indice_key="s").double()
    z = again(y)
    dense2 = CONV[ndim](to_dense(y.features.detach(), idx, shape, batch),
                        dense_weight(krsc_as_read(again, again.weight.detach()), False),
                        None, 1,
                        [(kk // 2) * dd for kk, dd in zip(k, d)], d)
    torch.testing.assert_close(z.features, at(dense2, idx), **TOL)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("trial", range(4))
def test_transposed_conv(seed, ndim, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    feats, idx, shape, batch, cin = sparse_input(gen, ndim)
    while True:
        k, s, p = draw(gen, 1, 3, ndim), draw(gen, 1, 3, ndim), draw(gen, 0, 1, ndim)
        if all((n - 1) * ss - 2 * pp + kk > 0 for n, kk, ss, pp in zip(shape, k, s, p)) and \
                not (k == [1] * ndim and s == [1] * ndim):
            break
    cout = draw(gen, 1, 4)
    conv = LAYERS[ndim][2](cin, cout, k, s, p, bias=True).double()
    y = conv(spconv.SparseConvTensor(feats, idx, shape, batch))
    f2, w2 = leaf(feats), leaf(conv.weight)
    dense = CONV_T[ndim](to_dense(f2, idx, shape, batch), dense_weight(w2, True),
                         conv.bias.detach(), s, p)
    assert list(dense.shape[2:]) == y.spatial_shape
    ref = at(dense, y.indices)
    torch.testing.assert_close(y.features, ref, **TOL)
    nothing_else(y, dense, conv.bias.detach())
    same_grads(y.features, ref, [(feats, f2), (conv.weight, w2)], gen)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("trial", range(4))
def test_inverse_conv(seed, ndim, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    feats, idx, shape, batch, cin = sparse_input(gen, ndim)
    k, s = draw(gen, 2, 3, ndim), draw(gen, 1, 2, ndim)
    cout = draw(gen, 1, 4)
    down = LAYERS[ndim][0](cin, cout, k, s, bias=False, indice_key="d").double()
    up = LAYERS[ndim][3](cout, cin, k, indice_key="d").double()
    mid = down(spconv.SparseConvTensor(feats, idx, shape, batch))
    mid_feats = leaf(mid.features)
    y = up(mid.replace_feature(mid_feats))
    assert y.indices is idx and y.spatial_shape == shape  # the paired conv's input rows
    # Oracle: the transposed conv of the down conv's geometry, read at the input sites (sites
    # past the last stride step have no pairs: zero-padded).
    f2, w2 = leaf(mid_feats), leaf(up.weight)
    full = CONV_T[ndim](to_dense(f2, mid.indices, mid.spatial_shape, batch),
                        dense_weight(w2, True), None, s)
    pad = []
    for n, m in reversed(list(zip(shape, full.shape[2:]))):
        pad += [0, max(0, n - m)]
    ref = at(F.pad(full, pad), idx) + up.bias.detach()
    torch.testing.assert_close(y.features, ref, **TOL)
    same_grads(y.features, ref, [(mid_feats, f2), (up.weight, w2)], gen)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("trial", range(4))
def test_max_pool(seed, ndim, trial):
    gen = torch.Generator().manual_seed(seed + trial)
    feats, idx, shape, batch, _ = sparse_input(gen, ndim)
    while True:
        k, s = draw(gen, 1, 3, ndim), draw(gen, 1, 2, ndim)
        p = [draw(gen, 0, kk // 2) for kk in k]
        if all(out_size(n, kk, ss, pp, 1) > 0 for n, kk, ss, pp in zip(shape, k, s, p)):
            break
    feats = leaf(feats.detach() - 1.0)  # many all-negative windows: the pool starts from -inf
    y = LAYERS[ndim][4](k, s, p)(spconv.SparseConvTensor(feats, idx, shape, batch))
    f2 = leaf(feats)
    dense = POOL[ndim](to_dense(f2, idx, shape, batch, fill=float("-inf")), k, s, p)
    assert list(dense.shape[2:]) == y.spatial_shape
    ref = at(dense, y.indices)
    torch.testing.assert_close(y.features, ref, **TOL)
    nothing_else(y, dense, float("-inf"))
    same_grads(y.features, ref, [(feats, f2)], gen)


@pytest.mark.parametrize("ndim", [1, 2])
def test_dense_and_from_dense(seed, ndim):
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, _ = sparse_input(gen, ndim)
    x = spconv.SparseConvTensor(feats, idx, shape, batch)
    ref = to_dense(leaf(feats), idx, shape, batch)
    torch.testing.assert_close(x.dense(), ref, **TOL)
    torch.testing.assert_close(spconv.ToDense()(x), ref, **TOL)
    torch.testing.assert_close(x.dense(channels_first=False), ref.movedim(1, -1), **TOL)
    assert x.spatial_size == torch.tensor(shape).prod().item()
    back = spconv.SparseConvTensor.from_dense(ref.detach().movedim(1, -1))
    assert back.spatial_shape == shape and back.indices.shape[1] == ndim + 1
    order = lambda t: torch.argsort(  # noqa: E731
        sum(t[:, i].long() * 10 ** (2 * (ndim - i)) for i in range(ndim + 1)))
    torch.testing.assert_close(back.indices[order(back.indices)], idx[order(idx)], rtol=0,
                               atol=0)
    (g,) = torch.autograd.grad((x.dense() * ref.detach()).sum(), [feats])
    torch.testing.assert_close(g, feats.detach(), **TOL)


def test_gradcheck_2d(seed):
    gen = torch.Generator().manual_seed(seed)
    _, idx, shape, batch, cin = sparse_input(gen, 2, least=5)  # 4 after the pool: room for down
    pool = spconv.SparseMaxPool2d(2, 1)
    sub = spconv.SubMConv2d(cin, 2, [3, 1], bias=True).double()
    down = spconv.SparseConv2d(2, 3, [2, 3], [2, 1], bias=False).double()
    call = torch.func.functional_call

    def net(x, w1, w2):
        t = pool(spconv.SparseConvTensor(x, idx, shape, batch))
        t = call(sub, {"weight": w1, "bias": sub.bias}, (t,))
        return call(down, {"weight": w2}, (t,)).features

    # Distinct features 1/4 apart, so that gradcheck's steps (1e-6) never change a pool's
    # choice; the pool comes first, on them.
    x = leaf(torch.randperm(idx.shape[0] * cin, generator=gen).double().view(-1, cin) / 4)
    assert torch.autograd.gradcheck(net, (x, leaf(sub.weight), leaf(down.weight)))


def test_nd_errors():
    idx = torch.tensor([[0, 1, 2], [0, 3, 3]], dtype=torch.int32)
    x = spconv.SparseConvTensor(torch.randn(2, 2), idx, [5, 6], 1)
    with pytest.raises(ValueError, match="SubMConv3d is a 3-d layer; its input is 2-d"):
        spconv.SubMConv3d(2, 3, 3)(x)
    with pytest.raises(ValueError, match="SparseMaxPool1d is a 1-d layer; its input is 2-d"):
        spconv.SparseMaxPool1d(2)(x)
    with pytest.raises(ValueError, match="spatial_shape must have 1, 2 or 3 values"):
        spconv.SparseConvTensor(torch.randn(2, 2), idx, [2, 2, 2, 2], 1)
    with pytest.raises(NotImplementedError, match="4-d sparse convolutions do not exist"):
        spconv.SparseConvolution(4, 2, 3)
    for layer in (spconv.SubMConv4d, spconv.SparseConv4d, spconv.SparseConvTranspose4d):
        with pytest.raises(NotImplementedError, match="4-d sparse convolutions do not exist "
                                                      r"here \(1-d, 2-d and 3-d do\)"):
            layer(2, 3, 3)
    with pytest.raises(NotImplementedError, match="4-d sparse convolutions do not exist"):
        spconv.SparseInverseConv4d(2, 3, 3, indice_key="k")
    with pytest.raises(NotImplementedError, match="4-d pooling does not exist here"):
        spconv.SparseMaxPool4d(2)
    bad = spconv.SparseConvTensor(torch.randn(2, 2), idx[:, :2].contiguous(), [5, 6], 1)
    with pytest.raises(RuntimeError, match=r"2-d SparseConvTensor must be int32 \[N, 3\]"):
        spconv.SubMConv2d(2, 3, 3)(bad)
    with pytest.raises(RuntimeError, match=r"int32 \[N, 3\] rows \(b, y, x\)"):
        spconv.SubMConv2d(2, 3, 1)(bad)  # the 1x1 path, which builds no rulebook
    far = spconv.SparseConvTensor(torch.randn(2, 2), idx + torch.tensor([0, 0, 9],
                                                                         dtype=torch.int32),
                                  [5, 6], 1)
    with pytest.raises(RuntimeError, match=r"outside spatial shape .*a 2-d layer runs in the "
                       r"engine as a 3-d one: sites \(b, 0, y, x\) in \[1, H, W\], kernel "
                       r"\[1, 3, 3\]"):
        spconv.SparseConv2d(2, 3, 3)(far)


def test_written_indices_are_lifted_again(seed):
    # The lifted rows are kept with the nd indices they came from while nothing writes into
    # them; after an in-place write the next layer must see the new sites, not the kept rows.
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, cin = sparse_input(gen, 2)
    conv = spconv.SparseConv2d(cin, 2, 3, 1, 1, bias=False).double()
    x = spconv.SparseConvTensor(feats.detach(), idx.clone(), shape, batch)
    conv(x)
    kept = x._lift[2]
    assert conv(x) is not None and x._lift[2] is kept  # unchanged indices: the same rows
    free = [(b, i, j) for b in range(batch) for i in range(shape[0]) for j in range(shape[1])
            if not ((idx[:, 0] == b) & (idx[:, 1] == i) & (idx[:, 2] == j)).any()]
    if not free:
        pytest.skip("every site is active: no free site to move a row to")
    x.indices[0] = torch.tensor(free[0], dtype=torch.int32)  # in place
    y = conv(x)
    fresh = conv(spconv.SparseConvTensor(feats.detach(), x.indices.clone(), shape, batch))
    assert torch.equal(y.indices, fresh.indices)
    torch.testing.assert_close(y.features, fresh.features, rtol=0, atol=0)


def test_rows_written_through_the_cache_are_lifted_again(seed):
    # Found by a hostile review: the lifted rows kept with a tensor's nd indices are also its
    # cache entries' sites (spconv's find_indice_pair(key).indices hands them out), and a
    # write into them went unseen (only the nd indices' version was compared): the next layer
    # built on the written rows. Now their own version is compared too: the next layer lifts
    # the nd indices again, and a subm layer of the key refuses the written entry.
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, cin = sparse_input(gen, 2, least=4)
    feats = feats.detach()
    first = spconv.SubMConv2d(cin, 2, 3, indice_key="k").double()
    other = spconv.SubMConv2d(2, 2, 3, indice_key="other").double()
    with torch.no_grad():
        y = first(spconv.SparseConvTensor(feats, idx.clone(), shape, batch))
        rows = y.find_indice_pair("k").indices
        assert rows is y._lift[2]
        site = free_site(y.indices, shape, batch)
        if site is None:
            pytest.skip("every site is active: no free site to move a row to")
        rows[0] = torch.tensor([site[0], 0, *site[1:]], dtype=torch.int32)  # the rows only
        want = other(spconv.SparseConvTensor(y.features, y.indices.clone(), shape, batch))
        torch.testing.assert_close(other(y).features, want.features, rtol=0, atol=0)
        with pytest.raises(ValueError, match="holds a subm rulebook of other sites"):
            spconv.SubMConv2d(2, 2, 3, indice_key="k").double()(y)


def test_rows_kept_by_an_older_version_are_lifted_again():
    # Found by a review: rows kept before the rows' own version was recorded (a 3-value _lift,
    # from an older pickle) raised an IndexError; they are lifted again.
    x = spconv.SparseConvTensor(torch.ones(2, 3), torch.tensor([[0, 1, 1], [0, 5, 5]],
                                                               dtype=torch.int32), [8, 8], 1)
    old = x.lifted_sites()[0]
    x._lift = x._lift[:3]
    y = pickle.loads(pickle.dumps(x))
    assert spconv.SubMConv2d(3, 3, 3)(y).features.shape == (2, 3)
    assert len(y._lift) == 4 and torch.equal(y._lift[2], old)


def test_lifted_sites_under_compile_are_not_stale():
    # Found by a hostile review: SparseConvTensor.lifted_sites() under torch.compile returned
    # the rows kept with the indices as they were before an eager write; it lifts anew there.
    x = spconv.SparseConvTensor(torch.ones(2, 1), torch.tensor([[0, 1, 1], [0, 5, 5]],
                                                                dtype=torch.int32), [12, 12], 1)
    x.lifted_sites()
    x.indices[0, 1] = 7
    torch._dynamo.reset()
    got = torch.compile(lambda t: t.lifted_sites()[0] + 0, backend="aot_eager")(x)
    torch._dynamo.reset()
    assert got.tolist() == x.lifted_sites()[0].tolist() == [[0, 0, 7, 1], [0, 0, 5, 5]]


def free_site(indices, shape, batch):
    """A site (b, *coordinates) inside ``shape`` that no row of ``indices`` holds, or None."""
    taken = {tuple(r) for r in indices.tolist()}
    for flat in range(batch * math.prod(shape)):
        site = []
        for n in reversed([batch] + list(shape)):
            site.append(flat % n)
            flat //= n
        site.reverse()
        if tuple(site) not in taken:
            return site
    return None


@pytest.mark.parametrize("capture", [False, True], ids=["strided-build-eager",
                                                     "strided-build-traced"])
@pytest.mark.parametrize("ndim", [1, 2])
def test_writes_between_compiled_calls_are_refused_nd(seed, ndim, capture):
    # A 1-d / 2-d layer runs on rows lifted from the nd indices and kept with them. Eager code
    # lifts them again once the indices are written into (their version moves); compiled code
    # cannot read versions and took the kept rows as they were, so an eager write between two
    # compiled calls went unseen: every layer after it ran on the old sites, silently. Now the
    # rows' values are compared with the indices where the graph runs (ops.check_lifted_token):
    # a write that moves a site is refused (eager refuses it too where a cached rulebook is
    # reused; a regular conv there builds on the new sites), one that keeps the values is not,
    # and a dense output, which needs no cached rulebook, lifts anew and gives eager's.
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, cin = sparse_input(gen, ndim, least=4)
    feats = feats.detach()
    conv, subm, _, inverse, _ = LAYERS[ndim]
    first = subm(cin, 3, 3, indice_key="k").double()
    down = conv(cin, 3, 3, 2, 1, indice_key="d").double()
    cases = ((first, subm(3, 3, 3, indice_key="k").double(), "other sites"),
             (down, inverse(3, 2, 3, indice_key="d").double(), "not the output sites"),
             (first, conv(3, 2, 3, 2, 1).double(), None),
             (first, spconv.ToDense(), None))
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture), torch.no_grad():
        for make, use, eager_says in cases:
            torch._dynamo.reset()
            compiled_use = torch.compile(use, backend="aot_eager")
            y = torch.compile(make, backend="aot_eager")(
                spconv.SparseConvTensor(feats, idx.clone(), shape, batch))

            def same(a, b):
                a, b = (t if isinstance(t, torch.Tensor) else t.features for t in (a, b))
                torch.testing.assert_close(a, b, rtol=0, atol=0)

            same(compiled_use(y), use(y))
            y.indices[0, 0] = y.indices[0, 0]  # a write in place that keeps the values
            same(compiled_use(y), use(y))
            site = free_site(y.indices, y.spatial_shape, batch)
            if site is None:
                continue  # every site is taken: nowhere to move a row to
            y.indices[0] = torch.tensor(site, dtype=torch.int32)
            if isinstance(use, spconv.ToDense):
                same(compiled_use(y), use(y))
                continue
            with pytest.raises(ValueError, match="were written into since those rows were "
                                                 "made, which compiled code cannot see"):
                compiled_use(y)
            if eager_says is None:
                want = use(spconv.SparseConvTensor(y.features, y.indices.clone(), y.spatial_shape,
                                                   batch))
                same(use(y), want)  # eager builds on the new sites
            else:
                with pytest.raises(ValueError, match=eager_says):
                    use(y)
    torch._dynamo.reset()


@pytest.mark.parametrize("capture", [False, True], ids=["strided-build-eager",
                                                     "strided-build-traced"])
def test_torch_compile_2d_matches_eager(seed, capture):
    # (capture: torch._dynamo.config.capture_dynamic_output_shape_ops, with which the strided
    # builds, the pool's included, are traced into the one graph: fullgraph holds.)
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, cin = sparse_input(gen, 2, least=6)
    torch.manual_seed(seed)
    net = spconv.SparseSequential(
        spconv.SubMConv2d(cin, 8, 3, indice_key="s1"), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
        spconv.SparseConv2d(8, 8, 3, 2, 1, indice_key="d1"), spconv.SubMConv2d(8, 8, 3),
        spconv.SparseInverseConv2d(8, 4, 3, indice_key="d1"), spconv.SparseMaxPool2d(2, 2),
        spconv.ToDense()).double().eval()

    def run(model):
        x = feats.detach().clone().requires_grad_(True)
        out = model(spconv.SparseConvTensor(x, idx, shape, batch))
        (g,) = torch.autograd.grad(out.square().sum(), [x])
        return out, g

    eager = run(net)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture):
        compiled = run(torch.compile(net, backend="aot_eager", fullgraph=capture))
    torch._dynamo.reset()
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, **TOL)


def test_key_of_another_ndim_is_refused(seed):
    # Lifted, a 1-d tensor and a 2-d one of height 1 (or a 3-d one of depth 1) have alike
    # sites; a key holds the ndim of the layer that stored it, and one of another ndim refuses it.
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, cin = sparse_input(gen, 1)
    x1 = spconv.SparseConvTensor(feats, idx, shape, batch)
    down = spconv.SparseConv1d(cin, 2, 3, 2, 1, indice_key="k").double()
    mid = down(x1)
    flat = mid.indices
    as_2d = spconv.SparseConvTensor(
        mid.features, torch.stack([flat[:, 0], torch.zeros_like(flat[:, 0]), flat[:, 1]], 1),
        [1, *mid.spatial_shape], batch, indice_dict=mid.indice_dict)
    with pytest.raises(ValueError, match="indice_key 'k' holds the rulebook of a 1-d layer; "
                                         "this layer is 2-d"):
        spconv.SparseInverseConv2d(2, cin, [1, 3], indice_key="k").double()(as_2d)
    with pytest.raises(ValueError, match="holds the rulebook of a 1-d layer; this layer is 3-d"):
        spconv.SubMConv3d(2, 2, 3, indice_key="k").double()(spconv.SparseConvTensor(
            mid.features, torch.cat([flat[:, :1], torch.zeros_like(flat), flat[:, 1:]], 1),
            [1, 1, *mid.spatial_shape], batch, indice_dict=mid.indice_dict))


def test_inference_mode_2d(seed):
    # Under torch.inference_mode (a deployment's forward) the indices have no version counter:
    # the lifted rows are kept by identity, as the indice_key cache keeps sites, and the
    # outputs are the same bits as with grad mode off.
    gen = torch.Generator().manual_seed(seed)
    feats, idx, shape, batch, cin = sparse_input(gen, 2, least=6)
    net = spconv.SparseSequential(
        spconv.SubMConv2d(cin, 4, 3, indice_key="s"), spconv.SubMConv2d(4, 4, 3, indice_key="s"),
        spconv.SparseConv2d(4, 4, 3, 2, 1, indice_key="d"),
        spconv.SparseInverseConv2d(4, 4, 3, indice_key="d")).double()
    with torch.no_grad():
        want = net(spconv.SparseConvTensor(feats.detach(), idx, shape, batch))
    with torch.inference_mode():
        x = spconv.SparseConvTensor(feats.detach().clone(), idx.clone(), shape, batch)
        got = net(x)
        assert x._lift[2] is got._lift[2]  # the inverse gave back the input's own rows
    assert torch.equal(got.indices, want.indices) and torch.equal(got.features, want.features)
