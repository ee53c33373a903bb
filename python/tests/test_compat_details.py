"""What detection code touches besides the arithmetic: keyword construction with NumPy spatial
shapes, settable indices, dtypes, the legacy 1x1 reading, SparseModule subclasses inside a
SparseSequential, and checkpoint-loader isinstance checks."""

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

import spconv_c.ops as ops
import spconv_c.pytorch as spconv
from spconv_c.pytorch import sequence
from spconv_c.pytorch.conv import SparseConvolution
from helpers import random_sparse

SHAPE = [6, 7, 8]


def tensor(seed, channels=3, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, 60, channels, dtype=dtype)
    return spconv.SparseConvTensor(features=feats, indices=idx,
                                   spatial_shape=np.array(SHAPE), batch_size=2)


def test_numpy_shape_and_settable_indices(seed):
    x = tensor(seed)
    assert x.spatial_shape == SHAPE and all(type(v) is int for v in x.spatial_shape)
    x.indices = x.indices.clone()
    x.indices[:, 0] = 0  # edited in place, as detection code does with batch columns
    assert int(x.indices[:, 0].max()) == 0


def test_spatial_shape_of_whole_numbers(seed):
    x = tensor(seed)
    for whole in ([6.0, 7.0, 8.0], np.array(SHAPE, dtype=np.float32), torch.tensor(SHAPE)):
        y = spconv.SparseConvTensor(x.features, x.indices, whole, 2)
        assert y.spatial_shape == SHAPE and all(type(v) is int for v in y.spatial_shape)
    # spconv's int() would make it [6, 7, 8] without a word
    for part in ([6.5, 7, 8], np.array([6, 7.25, 8]), torch.tensor([6.0, 7.0, 8.5])):
        with pytest.raises(ValueError, match="spatial_shape must hold whole numbers"):
            spconv.SparseConvTensor(x.features, x.indices, part, 2)


def test_half_and_double_features(seed):
    """A float32 module takes 16-bit features: its weights take their dtype, so the output is
    the 16-bit module's, bit for bit (its accuracy is test_half.py's)."""
    conv = spconv.SubMConv3d(3, 4, 3, bias=True)
    x = tensor(seed)
    ref = conv(x).features
    for dtype in (torch.float16, torch.bfloat16):
        xh = x.replace_feature(x.features.to(dtype))
        got = conv(xh).features
        assert got.dtype == dtype
        assert torch.equal(got, copy.deepcopy(conv).to(dtype)(xh).features)
    dbl = conv.double()(x.replace_feature(x.features.double())).features
    torch.testing.assert_close(dbl.float(), ref, rtol=1e-5, atol=1e-5)


def test_1x1_reads_krsc_as_cin_cout_unless_told(seed):
    # spconv's reading by default (a spconv checkpoint gives spconv's outputs), KRSC's when
    # legacy_1x1 is off
    conv = spconv.SubMConv3d(3, 5, 1, bias=False)
    assert conv.legacy_1x1
    x = tensor(seed)
    w = conv.weight.detach()  # [5, 1, 1, 1, 3]
    torch.testing.assert_close(conv(x).features, x.features @ w.reshape(3, 5))
    conv.legacy_1x1 = False
    torch.testing.assert_close(conv(x).features, x.features @ w.reshape(5, 3).t())


def test_inverse_1x1_inverts_unless_legacy(seed):
    """A kernel-volume-1 inverse conv goes back to the sites of the layer under its key, its
    KRSC weight read as what it says; with legacy_1x1 it is spconv 2.x's 1x1 path: the product
    on its input's sites, the weight read as a [C_in, C_out] reshape, the key unread
    (test_spconv_compat.py holds that to spconv itself)."""
    x = tensor(seed)
    pool = spconv.SparseMaxPool3d(1, 2, indice_key="p")
    inv = spconv.SparseInverseConv3d(3, 5, 1, indice_key="p", bias=False)
    inv.legacy_1x1 = False
    w = inv.weight.detach()  # [5, 1, 1, 1, 3]
    y = pool(x)
    assert y.indices.shape[0] < x.indices.shape[0], "the pool dropped no site: nothing shown"
    back = inv(y)
    assert torch.equal(back.indices, x.indices) and back.spatial_shape == SHAPE
    # Each pooled site goes back to the one site it came from; the others get zeros.
    expect = torch.zeros(x.indices.shape[0], 5)
    rb = y.find_indice_pair("p").rulebook
    pin, pout = rb.pairs_in().long(), rb.pairs_out().long()
    expect[pin] = y.features[pout] @ w.reshape(5, 3).t()
    torch.testing.assert_close(back.features, expect)
    inv.legacy_1x1 = True
    same = inv(y)
    assert torch.equal(same.indices, y.indices) and same.spatial_shape == y.spatial_shape
    torch.testing.assert_close(same.features, y.features @ w.reshape(3, 5))


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("kind", ["SparseConv3d", "SparseConvTranspose3d"])
def test_inverse_1x1_of_a_1x1_layer(seed, kind, legacy):
    """A 1x1 stride-1 layer stores no rulebook under its key (as in spconv); a 1x1 inverse on
    that key goes back to its sites, which are its input's: the product there (spconv runs
    that pair; it was a KeyError). A key nothing ran under is still refused."""
    x = tensor(seed)
    first = getattr(spconv, kind)(3, 4, 1, indice_key="k", bias=False)
    inv = spconv.SparseInverseConv3d(4, 5, 1, indice_key="k", bias=False)
    other = spconv.SparseInverseConv3d(4, 5, 1, indice_key="nope", bias=False)
    inv.legacy_1x1 = other.legacy_1x1 = legacy

    def read(layer):  # the weight as [C_in, C_out]
        w = layer.weight.detach()
        return w.reshape(4, 5) if legacy else w.reshape(5, 4).t()
    y = first(x)
    assert "k" not in y.indice_dict and torch.equal(y.indices, x.indices)
    back = inv(y)
    assert torch.equal(back.indices, x.indices) and back.spatial_shape == SHAPE
    torch.testing.assert_close(back.features, y.features @ read(inv))
    with torch.no_grad():  # inverse 1x1 layers that find no key run the product: see above
        torch.testing.assert_close(other(y).features, y.features @ read(other))
    with pytest.raises(KeyError, match="unknown indice_key 'nope'"):
        spconv.SparseInverseConv3d(4, 5, 3, indice_key="nope")(y)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_inverse_of_a_transposed_conv_in_every_ndim(seed, ndim):
    """Back to the transposed conv's input sites (its own index tensor) and shape, in 1-d, 2-d
    and 3-d, the same in one call, layer by layer and compiled (test_dense_oracle.py holds the
    values to dense conv3d, test_spconv_compat.py to spconv 2.3.8)."""
    x3 = tensor(seed)
    keep = [0, *range(4 - ndim, 4)]
    idx = torch.unique(x3.indices[:, keep], dim=0)
    x = spconv.SparseConvTensor(x3.features[:len(idx)].double(), idx, SHAPE[3 - ndim:], 2)
    n = f"{ndim}d"
    net = spconv.SparseSequential(
        getattr(spconv, f"SparseConvTranspose{n}")(3, 4, 3, 2, 1, indice_key="t"),
        getattr(spconv, f"SubMConv{n}")(4, 4, 3, indice_key="s"),
        getattr(spconv, f"SparseInverseConv{n}")(4, 2, 3, indice_key="t")).double().eval()
    outs = []
    for one_call in (True, False):
        sequence.ENABLED = one_call
        try:
            with torch.no_grad():
                y = net(spconv.SparseConvTensor(x.features, x.indices, x.spatial_shape, 2))
        finally:
            sequence.ENABLED = True
        assert y.indices is x.indices and y.spatial_shape == x.spatial_shape
        outs.append(y.features)
    assert torch.equal(outs[0], outs[1])
    compiled = torch.compile(net, backend="aot_eager")(
        spconv.SparseConvTensor(x.features, x.indices, x.spatial_shape, 2))
    assert torch.equal(compiled.indices, x.indices)
    torch.testing.assert_close(compiled.features, outs[0], rtol=0, atol=0)


class Block(spconv.SparseModule):
    """OpenPCDet's SparseBasicBlock shape: gets the SparseConvTensor, residual add."""

    def __init__(self, c):
        super().__init__()
        self.conv = spconv.SubMConv3d(c, c, 3, indice_key="blk")
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.conv(x)
        return out.replace_feature(self.relu(out.features + x.features))


def test_sparse_module_subclass_in_sequential(seed):
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 8, 3, indice_key="blk"), Block(8),
                                  nn.BatchNorm1d(8), spconv.ToDense())
    out = net(tensor(seed))
    assert out.shape == (2, 8, *SHAPE)
    assert sum(isinstance(m, SparseConvolution) for m in net.modules()) == 2


class _Counting(nn.ReLU):
    """An nn.ReLU subclass: SparseSequential must call it as a module (no in-place shortcut)."""

    calls = 0

    def forward(self, x):
        _Counting.calls += 1
        return super().forward(x)


@pytest.mark.parametrize("train", [False, True])
def test_batch_norm_relu_in_place_is_the_modules(seed, train):
    """SparseSequential runs a plain nn.ReLU after an nn.BatchNorm1d in place on the batch norm's
    output (modules.py). Outputs and every gradient must be bitwise those of calling the two
    modules as PyTorch does, in eval and in training mode (running statistics too), and the
    input's features must not change."""
    torch.manual_seed(seed)
    conv = spconv.SubMConv3d(3, 8, 3, indice_key="k")
    bn = nn.BatchNorm1d(8)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(-2, 2)  # negative scales: some rows go below zero either way
    fast = spconv.SparseSequential(copy.deepcopy(conv), copy.deepcopy(bn), nn.ReLU())
    ref_conv, ref_bn = copy.deepcopy(conv), copy.deepcopy(bn)
    fast.train(train), ref_conv.train(train), ref_bn.train(train)
    x = tensor(seed)
    before = x.features.clone()
    f1 = x.features.clone().requires_grad_(True)
    f2 = x.features.clone().requires_grad_(True)
    out = fast(x.replace_feature(f1)).features
    mid = ref_conv(x.replace_feature(f2))
    want = nn.functional.relu(ref_bn(mid.features))
    assert torch.equal(out, want)
    assert (out == 0).any() and (out > 0).any()
    grad = torch.randn_like(out)
    out.backward(grad)
    want.backward(grad)
    assert torch.equal(f1.grad, f2.grad)
    assert torch.equal(fast[0].weight.grad, ref_conv.weight.grad)
    assert torch.equal(fast[1].weight.grad, ref_bn.weight.grad)
    assert torch.equal(fast[1].bias.grad, ref_bn.bias.grad)
    assert torch.equal(fast[1].running_mean, ref_bn.running_mean)
    assert torch.equal(fast[1].running_var, ref_bn.running_var)
    assert torch.equal(x.features, before)


def test_relu_subclass_and_hooks_are_called(seed):
    """The in-place shortcut is only for the plain modules: a subclass of nn.ReLU, or a ReLU or
    batch norm with a hook, runs as the module it is."""
    _Counting.calls = 0
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 8, 3), nn.BatchNorm1d(8), _Counting())
    net(tensor(seed))
    assert _Counting.calls == 1
    seen = []
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU())
    net[2].register_forward_hook(lambda m, i, o: seen.append(o))
    out = net(tensor(seed)).features
    assert len(seen) == 1 and seen[0] is out
    kept = []
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU())
    net[1].register_forward_hook(lambda m, i, o: kept.append(o))
    net(tensor(seed))
    assert (kept[0] < 0).any()  # the batch norm's output, not overwritten by the ReLU


def _pairs(rb):
    return (rb.pair_offsets(), rb.pairs_in(), rb.pairs_out(), rb.out_indices(), rb.out_shape())


def test_build_rulebook_on_a_side_equals_a_checked_build(seed):
    """ops.build_rulebook_on gives, on either side of a regular, subm, transposed or inverse
    rulebook, the rulebook that ops.build_rulebook gives on those sites."""
    gen = torch.Generator().manual_seed(seed)
    _, idx = random_sparse(gen, 2, SHAPE, 70, 1)
    regular = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1)
    sources = [regular, ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3),
               ops.build_rulebook(idx, SHAPE, 2, ops.TRANSPOSED, 2, 2, 0),
               ops.inverse_rulebook(regular)]
    for source in sources:
        for side in (False, True):
            sites = source.out_indices() if side else source.in_indices()
            shape = source.out_shape() if side else source.in_shape()
            for kind, k, s, p in ((ops.REGULAR, 3, 2, 1), (ops.SUBM, 3, 1, 0),
                                  (ops.TRANSPOSED, 2, 2, 0), (ops.REGULAR, 2, 2, 0)):
                on, on_sites, on_shape = ops.build_rulebook_on(source, side, kind, k, s, p)
                checked = ops.build_rulebook(sites, shape, 2, kind, k, s, p)
                for a, b in zip(_pairs(on), _pairs(checked)):
                    assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                # It hands back its output sites and shape, as the handle gives them.
                assert torch.equal(on_sites, checked.out_indices())
                assert on_shape == list(checked.out_shape())


def test_known_sites_are_checked_again_once_written(seed, monkeypatch):
    """The modules build a layer's rulebook on the sites of a stored one (no checks) only while
    the indices are the same tensor at the same version: after an edit in place, even through a
    view, the next rulebook checks them, and a repeated row is the engine's error. (Layer by
    layer: a sequence run in one call takes the same rulebooks, test_sequence.py.)"""
    monkeypatch.setattr(sequence, "ENABLED", False)
    calls = {"checked": 0, "on": 0}
    checked, on = ops.build_rulebook, ops.build_rulebook_on

    def count_checked(*args, **kwargs):
        calls["checked"] += 1
        return checked(*args, **kwargs)

    def count_on(*args, **kwargs):
        calls["on"] += 1
        return on(*args, **kwargs)

    monkeypatch.setattr(ops, "build_rulebook", count_checked)
    monkeypatch.setattr(ops, "build_rulebook_on", count_on)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(3, 4, 3, indice_key="s1"),
        spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d1"),
        spconv.SubMConv3d(4, 4, 3, indice_key="s2"),
        spconv.SparseConv3d(4, 4, 2, 2, 0, indice_key="d2")).double()
    x = tensor(seed, dtype=torch.float64)
    with torch.no_grad():
        net(x)
    assert calls == {"checked": 1, "on": 3}  # only the first layer's sites are checked

    # The same first layer, then its output's indices edited in place (a view of them): the
    # next layer's build checks them and names the repeated row.
    y = net[0](x)
    assert y.indices is x.indices
    rows = y.indices[:2]
    rows[1] = rows[0]
    calls.update(checked=0, on=0)
    with pytest.raises(RuntimeError, match="row 1"):
        net[1](y)
    assert calls == {"checked": 1, "on": 0}

    # Another tensor object with the same rows is not known either (its rows are checked).
    x2 = tensor(seed, dtype=torch.float64)
    y2 = net[0](x2)
    z2 = spconv.SparseConvTensor(y2.features, y2.indices.clone(), y2.spatial_shape, 2,
                                 indice_dict=y2.indice_dict)
    calls.update(checked=0, on=0)
    net[1](z2)
    assert calls == {"checked": 1, "on": 0}

    # Inference tensors have no version counter: under torch.inference_mode the outputs'
    # indices are never taken as unchanged, and the results are those of torch.no_grad.
    with torch.no_grad():
        expected = net(tensor(seed, dtype=torch.float64)).features
    calls.update(checked=0, on=0)
    with torch.inference_mode():
        got = net(tensor(seed, dtype=torch.float64)).features
    assert torch.equal(got, expected)
    assert calls["checked"] >= 2  # the strided outputs' indices are inference tensors


def test_minus_and_select_by_index(seed):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 1, [6, 6, 6], 30, 3)
    x = spconv.SparseConvTensor(feats, idx, [6, 6, 6], 1)
    y = spconv.SubMConv3d(3, 2, 3, indice_key="s").double()(x)
    assert torch.equal(y.minus().features, -y.features) and y.minus().indices is idx
    keep = torch.arange(idx.shape[0]) % 3 != 0
    part = y.select_by_index(keep)
    assert torch.equal(part.indices, idx[keep]) and torch.equal(part.features, y.features[keep])
    assert part.indice_dict == {} and "s" in y.indice_dict  # the parent's cache is kept
    # a subm layer under the same key on the selected sites builds its own rulebook
    z = spconv.SubMConv3d(2, 2, 3, indice_key="s").double()(part)
    assert z.features.shape == (int(keep.sum()), 2)
    assert not x.is_quantized
    with pytest.raises(ValueError, match="not quantized"):
        x.q_scale()


@pytest.mark.parametrize("kind", ["subm", "regular"])
def test_indice_pairs_as_spconv_lays_them_out(seed, kind):
    # indice_dict[key].indice_pairs: int32 [2, KV, N_in], offset k's pairs (input row, output
    # row) packed from the left and -1 after; held to a brute-force oracle of the geometry
    # (in = out * stride - padding + offset * dilation), with indice_pair_num their counts
    # (a subm key's before the centre only, 0 from it on, as spconv counts them).
    x = tensor(seed)
    if kind == "subm":
        layer = spconv.SubMConv3d(3, 4, (3, 1, 3), dilation=(1, 1, 2), indice_key="k")
        stride, padding = [1, 1, 1], [1, 0, 2]
    else:
        layer = spconv.SparseConv3d(3, 4, (2, 3, 3), (2, 1, 2), (0, 1, 1), indice_key="k")
        stride, padding = [2, 1, 2], [0, 1, 1]
    y = layer(x)
    entry = y.indice_dict["k"]
    pairs, num = entry.indice_pairs, entry.indice_pair_num
    kv = math.prod(layer.kernel_size)
    assert pairs.dtype == num.dtype == torch.int32
    assert list(pairs.shape) == [2, kv, x.indices.shape[0]] and list(num.shape) == [kv]
    assert entry.algo is spconv.ConvAlgo.Native and entry.voxel_num is None
    sites_in = {tuple(r): i for i, r in enumerate(x.indices.tolist())}
    sites_out = y.indices.tolist()
    for k in range(kv):
        n = int((pairs[0, k] >= 0).sum())
        assert (pairs[:, k, n:] == -1).all() and (pairs[:, k, :n] >= 0).all()
        assert int(num[k]) == (0 if kind == "subm" and k >= kv // 2 else n)
        offset = np.unravel_index(k, layer.kernel_size)
        want = set()
        for o, (b, *site) in enumerate(sites_out):
            at = tuple([b] + [c * s - p + q * d for c, s, p, q, d in
                              zip(site, stride, padding, offset, layer.dilation)])
            if at in sites_in:
                want.add((sites_in[at], o))
        assert set(zip(pairs[0, k, :n].tolist(), pairs[1, k, :n].tolist())) == want
        assert len(want) == n


def keyed_sequence(channels):
    """A subm conv with its batch norm and ReLU, a strided conv, two subm convs and the inverse
    of the strided one, each with a key (a, d, s, s, d); float64, in eval mode."""
    return spconv.SparseSequential(
        spconv.SubMConv3d(channels, 4, 3, indice_key="a"), nn.BatchNorm1d(4), nn.ReLU(),
        spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d"),
        spconv.SubMConv3d(4, 4, 3, indice_key="s"), spconv.SubMConv3d(4, 4, 3, indice_key="s"),
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="d")).double().eval()


def inference(net, x, one_call):
    """``net(x)`` under no_grad, its sequences in one call or layer by layer."""
    sequence.ENABLED = one_call
    try:
        with torch.no_grad():
            return net(x)
    finally:
        sequence.ENABLED = True


@pytest.mark.parametrize("one_call", [False, True])
def test_a_layer_caches_for_its_output_only(seed, one_call):
    # As spconv's layers (input.indice_dict.copy()): a layer's key is in its output's cache and
    # in what derives from it, not in its input's or a sibling branch's, so two heads on one
    # tensor may use one key name with kernels of their own (here that was an error). In an
    # inference SparseSequential run in one call too.
    x = tensor(seed, dtype=torch.float64)
    teacher = spconv.SubMConv3d(3, 4, 3, indice_key="k").double()
    student = spconv.SubMConv3d(3, 4, 5, indice_key="k").double()
    a, b = teacher(x), student(x)
    assert x.indice_dict == {}
    assert a.indice_dict["k"].ksize == [3, 3, 3] and b.indice_dict["k"].ksize == [5, 5, 5]
    c = spconv.SubMConv3d(4, 4, 3, indice_key="k").double()(a)
    assert c.indice_dict["k"] is a.indice_dict["k"]  # downstream, the key is reused
    up = inference(keyed_sequence(4), c, one_call)
    assert set(c.indice_dict) == {"k"} and set(up.indice_dict) == {"k", "a", "d", "s"}
    assert torch.equal(up.indices, c.indices)  # the inverse conv found its key downstream


def test_record_voxel_count_keeps_spconvs_buffer(seed):
    # record_voxel_count=True: strided convs and pools keep spconv's max_num_voxels_during_training
    # buffer (in their state_dict, so spconv's checkpoints load strictly), raised to each call's
    # output site count; subm and inverse layers have none, as in spconv.
    x = tensor(seed)
    down = spconv.SparseConv3d(3, 4, 3, 2, 1, indice_key="d", record_voxel_count=True)
    pool = spconv.SparseMaxPool3d(2, 2, record_voxel_count=True)
    subm = spconv.conv.SparseConvolution(3, 3, 4, 3, subm=True, record_voxel_count=True)
    net = spconv.SparseSequential(down, pool)
    assert set(net.state_dict()) == {"0.weight", "0.bias", "0.max_num_voxels_during_training",
                                     "1.max_num_voxels_during_training"}
    assert subm.get_max_num_voxels() is None and "max_num_voxels_during_training" not in dict(
        subm.named_buffers())
    y = down(x)
    z = pool(y)
    assert down.get_max_num_voxels().tolist() == [y.indices.shape[0]]
    assert pool.get_max_num_voxels().tolist() == [z.indices.shape[0]]
    down(spconv.SparseConvTensor(x.features[:3], x.indices[:3], SHAPE, 2))  # fewer sites
    assert down.get_max_num_voxels().tolist() == [y.indices.shape[0]]  # the most, kept
    with torch.no_grad():
        net.eval()(x)  # in inference too, and in one call (a walk leaves such layers out)
    assert down.get_max_num_voxels().tolist() == [y.indices.shape[0]]
    # a state_dict without the buffer (a model saved before it was on) loads: zeros
    fresh = spconv.SparseConv3d(3, 4, 3, 2, 1, record_voxel_count=True)
    fresh.load_state_dict({"weight": down.weight, "bias": down.bias})
    assert fresh.get_max_num_voxels().tolist() == [0]


def test_fused_activation_is_refused_not_left_out(seed):
    # spconv's act_type (an activation fused into its GPU inference kernels; its CPU build
    # refuses one): refused here too, with a message, rather than run without it.
    class Activation:  # stands for cumm's tv.gemm.Activation members (a name)
        def __init__(self, name):
            self.name = name
    x = tensor(seed)
    spconv.conv.SparseConvolution(3, 3, 4, 3, subm=True, act_type=Activation("None_"))(x)
    layer = spconv.conv.SparseConvolution(3, 3, 4, 3, subm=True, act_type=Activation("ReLU"))
    with pytest.raises(NotImplementedError, match="act_type=.* is not supported"):
        layer(x)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="act_type"):
        spconv.SparseSequential(layer, spconv.SubMConv3d(4, 4, 3), spconv.SubMConv3d(4, 4, 3),
                                spconv.SubMConv3d(4, 4, 3)).eval()(x)


def test_sparse_module_name_and_feature_modules():
    # spconv's SparseModule keeps its name; is_spconv_module counts its SparseBatchNorm and
    # SparseReLU (a SparseSequential hands them the SparseConvTensor).
    assert spconv.SubMConv3d(3, 4, 3, name="stem").name == "stem"
    assert spconv.SparseMaxPool3d(2, name="p").name == "p" and spconv.Identity() is not None
    from spconv_c.pytorch.modules import is_sparse_conv, is_spconv_module
    assert is_spconv_module(spconv.SparseBatchNorm(4)) and is_spconv_module(spconv.SparseReLU())
    assert not is_spconv_module(nn.ReLU())
    assert is_sparse_conv(spconv.SubMConv2d(3, 4, 3)) and not is_sparse_conv(spconv.ToDense())


def test_small_spconv_attributes(seed):
    # tensor + sparse tensor and += (in place, on the features), an empty grid and int8_scale
    # by default, the global pools' is_mean and the IndiceData name, as spconv's
    x = tensor(seed, dtype=torch.float64)
    t = torch.randn(x.features.shape, dtype=torch.float64)
    assert torch.equal((t + x).features, t + x.features)
    features, before = x.features, x.features.clone()
    y = x
    y += t
    assert y is x and x.features is features and torch.equal(features, before + t)
    assert x.grid.numel() == 0 and x.int8_scale is None
    assert spconv.SparseGlobalAvgPool().is_mean and not spconv.SparseGlobalMaxPool().is_mean
    from spconv_c.pytorch.core import IndiceData, IndiceEntry
    assert IndiceData is IndiceEntry
    # from_dense of any dtype (spconv's goes through torch's to_sparse): the non-zero sites
    for dense in (x.dense(channels_first=False) != 0, x.dense(channels_first=False).int()):
        back = spconv.SparseConvTensor.from_dense(dense)
        want = dense.to_sparse(dense.dim() - 1)
        assert torch.equal(back.indices, want.indices().t().int())
        assert torch.equal(back.features, want.values())


def test_any_conv_algo_runs_the_one_algorithm(seed):
    # algo= as spconv's users pin it: every ConvAlgo value is taken and gives the same outputs
    # (the engine has one algorithm); a layer without one says Native, as spconv's CPU build.
    x = tensor(seed, dtype=torch.float64)
    outs = []
    for algo in (None, *spconv.ConvAlgo):
        torch.manual_seed(0)
        layer = spconv.SubMConv3d(3, 4, 3, algo=algo).double()
        assert layer.algo is (spconv.ConvAlgo.Native if algo is None else algo)
        outs.append(layer(x).features)
    assert all(torch.equal(o, outs[0]) for o in outs)


def point_to_voxel_oracle(pts, vsize, lo, hi, max_voxels, max_points):
    """spconv's point-to-voxel rule, point by point in float32 (its arithmetic): the grid is
    round((max - min) / size), halves away from zero; a point's cell floor((p - min) / size);
    voxels numbered by their first point, at most max_voxels of them, each keeping its first
    max_points points. (grid xyz, {cell zyx: row}, rows' points, each point's row or -1)."""
    f32 = np.float32
    grid = [int(np.floor(np.float64((f32(hi[a]) - f32(lo[a])) / f32(vsize[a])) + 0.5))
            for a in range(3)]
    cells, members, ids = {}, [], []
    for p in pts.numpy():
        c = [np.floor((f32(p[a]) - f32(lo[a])) / f32(vsize[a])) for a in range(3)]
        if not all(np.isfinite(v) and 0 <= v < g for v, g in zip(c, grid)):
            ids.append(-1)
            continue
        key = (int(c[2]), int(c[1]), int(c[0]))
        if key not in cells:
            if len(cells) == max_voxels:
                ids.append(-1)
                continue
            cells[key] = len(cells)
            members.append([])
        row = cells[key]
        if len(members[row]) < max_points:
            members[row].append(p)
        ids.append(row)
    return grid, cells, members, ids


def test_point_to_voxel_against_a_brute_force_oracle(seed):
    # Random points, some outside the range or not finite, on grids whose extent is a whole
    # number of voxels or ends half-way through one (rounded up, as spconv's): the voxels, their
    # cells, counts, the points' rows and spconv's attributes (z, y, x) from the oracle, every
    # cell inside grid_size (the spatial shape), and empty_mean's fill the mean of the points.
    gen = torch.Generator().manual_seed(seed)
    for vsize, lo, hi, max_voxels, max_points in (
            ([0.4, 0.5, 0.25], [0, -1, -0.5], [1.0, 1.0, 0.75], 100, 3),  # 2.5, 4 and 5 cells
            ([0.1, 0.1, 0.1], [0, 0, 0], [0.35, 0.25, 0.3], 40, 2),       # 3.5, 2.5 and 3 cells
            ([0.3, 0.2, 0.5], [-1, -1, -1], [1.0, 1.0, 1.0], 5, 4)):      # voxels run out
        pts = torch.rand(300, 5, generator=gen) * 3 - 1.2
        pts[::37, 1] = float("nan")
        pts[5::41, 2] = float("inf")
        p2v = spconv.PointToVoxel(vsize, lo + hi, 5, max_voxels, max_points)
        grid, cells, members, ids = point_to_voxel_oracle(pts, vsize, lo, hi, max_voxels,
                                                          max_points)
        assert p2v.grid_size == grid[::-1] and p2v.ndim == 3
        assert p2v.grid_stride == [grid[0] * grid[1], grid[0], 1]
        f32 = np.float32
        assert p2v.vsize == [float(f32(v)) for v in vsize[::-1]]
        assert p2v.coors_range == [float(f32(v)) for v in lo[::-1] + hi[::-1]]
        voxels, coords, num, pc_ids = p2v.generate_voxel_with_id(pts)
        assert coords.tolist() == [list(key) for key in cells]
        assert (coords < torch.tensor(p2v.grid_size, dtype=torch.int32)).all()
        assert num.tolist() == [len(m) for m in members]
        assert pc_ids.tolist() == ids
        want = torch.zeros(len(members), max_points, 5)
        for row, kept in enumerate(members):
            want[row, :len(kept)] = torch.from_numpy(np.stack(kept))
        assert torch.equal(voxels, want)
        filled, _, _ = p2v(pts, empty_mean=True)
        for row, kept in enumerate(members):
            assert torch.equal(filled[row, :len(kept)], want[row, :len(kept)])
            mean = np.stack(kept).astype(np.float64).mean(0)
            # a float32 of the mean: within one float32 spacing of it (the engine sums in
            # double and rounds the quotient once; the double sum of at most 4 float32s
            # is exact but for a few double units, far below that spacing)
            bound = torch.from_numpy(np.spacing(np.abs(mean).astype(np.float32))).double()
            err = (filled[row, len(kept):].double() - torch.from_numpy(mean)).abs()
            assert (err <= bound).all(), (row, err.max())


def test_gather_features_by_pc_voxel_id(seed):
    # Points back from their voxels: each point gets its voxel's row, a dropped point (-1) the
    # invalid value; gradients reach the voxel rows of the points that have one.
    from spconv_c.pytorch.utils import gather_features_by_pc_voxel_id
    gen = torch.Generator().manual_seed(seed)
    pts = torch.rand(500, 4, generator=gen) * torch.tensor([4.0, 4.0, 2.0, 1.0])
    pts[:20, 0] = -1.0  # outside the range: no voxel
    p2v = spconv.PointToVoxel([0.5, 0.5, 0.5], [0, 0, 0, 4, 4, 2], 4, 100, 3)
    voxels, coords, num, ids = p2v.generate_voxel_with_id(pts)
    seg = torch.randn(coords.shape[0], 3, generator=gen, dtype=torch.float64,
                      requires_grad=True)
    out = gather_features_by_pc_voxel_id(seg, ids, invalid_value=-7.0)
    for p in range(pts.shape[0]):
        want = seg[ids[p]] if ids[p] >= 0 else torch.full((3,), -7.0, dtype=torch.float64)
        assert torch.equal(out[p], want)
    assert (ids[:20] == -1).all() and (ids >= 0).sum() > 0
    (g,) = torch.autograd.grad(out.sum(), [seg])
    counts = torch.bincount(ids[ids >= 0].long(), minlength=seg.shape[0]).double()
    assert torch.equal(g, counts.view(-1, 1).expand_as(g))
    empty = gather_features_by_pc_voxel_id(seg[:0], torch.full((4,), -1))
    assert empty.shape == (4, 3) and (empty == 0).all()
    with pytest.raises(ValueError, match=r"ids outside \[-1, "):
        gather_features_by_pc_voxel_id(seg, torch.tensor([0, seg.shape[0]]))


def test_identity_and_module_names(seed):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 1, [6, 6, 6], 20, 3)
    x = spconv.SparseConvTensor(feats, idx, [6, 6, 6], 1)
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 2, 3), spconv.Identity(),
                                  inner=spconv.SparseSequential(spconv.SparseMaxPool3d(2)))
    assert spconv.Identity()(x) is x
    y = net(x)
    assert y.features.shape[1] == 2
    spconv.assign_name_for_sparse_modules(net)
    assert net[0]._sparse_unique_name == "0"
    assert net.inner[0]._sparse_unique_name == "inner.0"


def strided_output(seed):
    """A strided conv's output (4 channels, its rulebook cached under key "d"), float64."""
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, 60, 2, dtype=torch.float64)
    down = spconv.SparseConv3d(2, 4, 3, 2, 1, indice_key="d").double()
    with torch.no_grad():
        return down(spconv.SparseConvTensor(feats, idx, SHAPE, 2))


def test_deepcopied_tensor_keeps_its_cache(seed):
    # A deepcopy writes into the copied indices (their version is 1, the cache recorded 0): the
    # copied cache must still take its copied sites, where the original took the original ones,
    # and refuse them where the original's had been written into before the copy.
    # (The subm key is stored in the cache of the first subm layer's output, which the next
    # one takes: a layer's entry is not seen by its input.)
    mid = strided_output(seed)
    sub = spconv.SubMConv3d(4, 4, 3, indice_key="s").double()
    with torch.no_grad():
        first = sub(mid)
        want = sub(first).features
        twin = copy.deepcopy(first)
        assert torch.equal(sub(twin).features, want)
        first.indices[0, 0] = first.indices[0, 0]  # a write in place, same values
        with pytest.raises(ValueError, match="written into since"):
            sub(first)
        with pytest.raises(ValueError, match="written into since"):
            sub(copy.deepcopy(first))


def test_cache_pickled_before_graph_builds_loads(seed):
    # Cache entries gained a token-only form (made inside compiled graphs) and renamed three
    # attributes for it; an entry pickled with the old names (rulebook, in_version,
    # out_version, no tokens) still loads, and serves as the original did.
    from spconv_c.pytorch.core import IndiceEntry
    mid = strided_output(seed)
    inverse = spconv.SparseInverseConv3d(4, 2, 3, indice_key="d").double()
    with torch.no_grad():
        want = inverse(mid).features
        entry = mid.indice_dict["d"]
        state = entry.__getstate__()
        old = {"rulebook" if k == "_rulebook" else k.lstrip("_") if k in (
            "_in_version", "_out_version") else k: v for k, v in state.items()
            if k not in ("token", "_inverse_token")}
        loaded = object.__new__(IndiceEntry)
        loaded.__setstate__(old)
        mid.indice_dict["d"] = loaded
        assert torch.equal(inverse(mid).features, want)


@pytest.mark.parametrize("key_dtype", [torch.int32, torch.int64])
def test_hash_table_against_a_dict(seed, key_dtype):
    # spconv.pytorch.hash.HashTable's interface, held to a Python dict assigned in order: a key
    # keeps one slot, its value the last one given; query finds the held keys and leaves the
    # other rows; insert_exist_keys sets only held keys; assign_arange_ numbers the keys in the
    # order of their first insertion, which items() returns.
    from spconv_c.pytorch.hash import HashTable
    gen = torch.Generator().manual_seed(seed)
    table = HashTable(torch.device("cpu"), key_dtype, torch.float64)
    oracle = {}
    for _ in range(4):
        keys = torch.randint(-50, 50, (30,), generator=gen).to(key_dtype)
        values = torch.randn(30, generator=gen, dtype=torch.float64)
        with_values = bool(torch.randint(0, 2, (1,), generator=gen))
        table.insert(keys, values if with_values else None)
        for k, v in zip(keys.tolist(), values.tolist()):
            if with_values:
                oracle[k] = v
            else:
                oracle.setdefault(k, 0.0)
        probe = torch.randint(-60, 60, (40,), generator=gen).to(key_dtype)
        got, empty = table.query(probe, torch.full((40,), 7.0, dtype=torch.float64))
        for k, g, e in zip(probe.tolist(), got.tolist(), empty.tolist()):
            assert e == (k not in oracle) and g == oracle.get(k, 7.0)
        update = torch.randn(40, generator=gen, dtype=torch.float64)
        missing = table.insert_exist_keys(probe, update)
        assert missing.dtype == torch.uint8
        for k, v, m in zip(probe.tolist(), update.tolist(), missing.tolist()):
            assert m == (k not in oracle)
            if k in oracle:
                oracle[k] = v
    keys, values, count = table.items()
    assert keys.tolist() == list(oracle) and values.tolist() == list(oracle.values())
    assert count.tolist() == [len(oracle)]
    numbered = HashTable("cpu", key_dtype, torch.int64)
    numbered.insert(keys.flip(0))
    assert numbered.assign_arange_().tolist() == [len(oracle)]
    ids, empty = numbered.query(keys)
    assert not empty.any() and ids.tolist() == list(range(len(oracle)))[::-1]
    with pytest.raises(ValueError, match="keys must be"):
        table.insert(keys.double())
    with pytest.raises(ValueError, match="needs int32 or int64 values"):
        table.assign_arange_()


@pytest.mark.parametrize("one_call", [False, True])
def test_foreign_entries_in_the_cache(seed, one_call):
    # Code stores its own objects in indice_dict under keys of its own (SphereFormer keeps a
    # tuple of index tensors there): the layers pass them on and read only their own keys,
    # layer by layer and in one call, and a copy of the tensor keeps them.
    x = tensor(seed, dtype=torch.float64)
    mine = (torch.arange(3), torch.ones(2), 5)
    x.indice_dict["sphere"] = mine
    y = inference(keyed_sequence(3), x, one_call)
    assert y.indice_dict["sphere"] is mine and set(y.indice_dict) == {"sphere", "a", "d", "s"}
    assert torch.equal(y.indices, x.indices)
    assert copy.deepcopy(y).indice_dict["sphere"][2] == 5
