"""What detection code touches besides the arithmetic: keyword construction with NumPy spatial
shapes, settable indices, dtypes, the legacy 1x1 reading, SparseModule subclasses inside a
SparseSequential, and checkpoint-loader isinstance checks."""

import copy

import numpy as np
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
