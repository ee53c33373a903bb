"""What detection code touches besides the arithmetic: keyword construction with NumPy spatial
shapes, settable indices, dtypes, the legacy 1x1 reading, SparseModule subclasses inside a
SparseSequential, and checkpoint-loader isinstance checks."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import spconv_c.pytorch as spconv
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


def test_legacy_1x1_reads_krsc_as_cin_cout(seed):
    conv = spconv.SubMConv3d(3, 5, 1, bias=False)
    x = tensor(seed)
    w = conv.weight.detach()  # [5, 1, 1, 1, 3]
    torch.testing.assert_close(conv(x).features, x.features @ w.reshape(5, 3).t())
    conv.legacy_1x1 = True
    torch.testing.assert_close(conv(x).features, x.features @ w.reshape(3, 5))


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
