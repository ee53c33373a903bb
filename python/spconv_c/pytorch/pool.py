"""Sparse pooling: spconv 2.x's SparseMaxPool1d / 2d / 3d, SparseAvgPool1d / 2d / 3d and the
global pools. Max pooling starts from -inf, not from 0 as spconv's CPU pool does, so
all-negative windows give their maximum; ties go to the smallest offset."""

import torch

from .. import ops
from .conv import MAX_NDIM, check_ndim, expand_nd, layer_sites, own_cache
from .core import SparseConvTensor
from .modules import SparseModule, VoxelCount


class _WindowPool(SparseModule, VoxelCount):
    """What the max and average pools share: spconv's constructor, the window's geometry."""

    KIND = "max"

    def __init__(self, ndim, kernel_size=3, stride=1, padding=0, dilation=1, indice_key=None,
                 subm=False, algo=None, record_voxel_count=False, name=None):
        # stride: 1 by default as in spconv's base class; None is the kernel's size (the
        # default of the 1d / 2d / 3d classes).
        super().__init__(name=name)
        if not 1 <= ndim <= MAX_NDIM:
            raise NotImplementedError(f"spconv_c: {ndim}-d pooling does not exist here (1-d, "
                                      f"2-d and 3-d do)")
        if subm:
            raise NotImplementedError(f"spconv_c: submanifold {self.KIND} pooling is not "
                                      f"supported")
        self.ndim = ndim
        self.kernel_size = expand_nd(ndim, kernel_size)
        self.stride = list(self.kernel_size) if stride is None else expand_nd(ndim, stride)
        self.padding = expand_nd(ndim, padding)
        self.dilation = expand_nd(ndim, dilation)
        self.subm = subm
        self.indice_key = indice_key
        self.algo = algo
        self.record_voxel_count = record_voxel_count
        if record_voxel_count:
            self._add_voxel_count()

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}")

    def _sites(self, input, token=None, store=None):
        check_ndim(self, input)
        return layer_sites(input, ops.REGULAR, self.kernel_size, self.stride, self.padding,
                           self.dilation, [0] * self.ndim, self.indice_key, token, store)


class SparseMaxPool(_WindowPool):
    def forward(self, input):
        store = own_cache(input, self.indice_key) if isinstance(input, SparseConvTensor) else None
        rb, out_indices, out_shape, lifted = self._sites(input, store=store)
        out = ops.indice_maxpool(rb, input.features)
        self._count_voxels(out_indices.shape[0])
        return input._derive(out, out_indices, out_shape, lifted, store)


# As this module defines them (see conv.AS_DEFINED).
MAXPOOL_AS_DEFINED = (("forward", SparseMaxPool.forward), ("_sites", _WindowPool._sites))


class _FixedNdim:
    """spconv's constructor of the 1d / 2d / 3d pool classes (stride defaults to the kernel's
    size), for a pool class after it in the bases; NDIM is set by each class."""

    NDIM = 3

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, indice_key=None,
                 algo=None, record_voxel_count=False, name=None):
        super().__init__(self.NDIM, kernel_size, stride, padding, dilation, indice_key=indice_key,
                         algo=algo, record_voxel_count=record_voxel_count, name=name)


class _SparseMaxPoolNd(_FixedNdim, SparseMaxPool):
    pass


class SparseMaxPool1d(_SparseMaxPoolNd):
    NDIM = 1


class SparseMaxPool2d(_SparseMaxPoolNd):
    NDIM = 2


class SparseMaxPool3d(_SparseMaxPoolNd):
    NDIM = 3


class SparseMaxPool4d(_SparseMaxPoolNd):
    NDIM = 4  # refused at construction: the engine has three spatial axes


# ---- average pooling --------------------------------------------------------------------------

def _check_features(module, features, rows):
    """The checks the engine makes of a pool's features, for the pools written in PyTorch:
    floating [rows, C]."""
    name = type(module).__name__
    if not isinstance(features, torch.Tensor) or not features.is_floating_point():
        got = features.dtype if isinstance(features, torch.Tensor) else type(features).__name__
        raise RuntimeError(f"spconv_c: {name}: features must be floating (float16, bfloat16, "
                           f"float32, float64), got {got}")
    if features.dim() != 2 or features.shape[0] != rows:
        raise RuntimeError(f"spconv_c: {name}: features must be [{rows}, C] (a row per site), "
                           f"got {list(features.shape)}")


class SparseAvgPool(_WindowPool):
    """spconv 2.x's SparseAvgPool: each output site's features are the mean over the active input
    sites of its window (not over the window's volume), as spconv's counts make them. spconv
    2.3.8 runs it on CUDA only; here it runs on both devices, through the engine's rulebook."""

    KIND = "average"

    def forward(self, input):
        store = own_cache(input, self.indice_key) if isinstance(input, SparseConvTensor) else None
        rb, out_indices, out_shape, lifted = self._sites(input, store=store)
        _check_features(self, input.features, input.indices.shape[0])
        self._count_voxels(out_indices.shape[0])
        return input._derive(ops.indice_avgpool(rb, input.features), out_indices, out_shape,
                             lifted, store)


class _SparseAvgPoolNd(_FixedNdim, SparseAvgPool):
    pass


class SparseAvgPool1d(_SparseAvgPoolNd):
    NDIM = 1


class SparseAvgPool2d(_SparseAvgPoolNd):
    NDIM = 2


class SparseAvgPool3d(_SparseAvgPoolNd):
    NDIM = 3


# ---- global pooling ---------------------------------------------------------------------------

class _GlobalPool(SparseModule):
    """Dense [B, C]: per batch entry, the maximum (or mean) of its sites' features; a batch entry
    without sites gives zeros. One reduction per entry, so the results do not depend on the
    sites' order in memory beyond what the reduction itself does, and never on atomics."""

    MEAN = False

    @property
    def is_mean(self):  # spconv's attribute
        return self.MEAN

    def forward(self, input):
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"spconv_c: {type(self).__name__} takes a SparseConvTensor, got "
                            f"{type(input).__name__}")
        feats, indices = input.features, input.indices
        if indices.dim() != 2 or indices.shape[1] < 2:
            raise RuntimeError(f"spconv_c: {type(self).__name__}: indices must be [N, 1 + ndim] "
                               f"rows (b, ...), got {list(indices.shape)}")
        _check_features(self, feats, indices.shape[0])
        batch = indices[:, 0]
        outside = (batch < 0) | (batch >= input.batch_size)
        if outside.any():
            row = int(outside.nonzero()[0, 0])
            raise ValueError(f"spconv_c: {type(self).__name__}: indices row {row} has batch "
                             f"index {int(batch[row])} outside batch size {input.batch_size}")
        rows = []
        for b in range(input.batch_size):
            f = feats[batch == b]
            if f.shape[0] == 0:
                rows.append(feats.new_zeros(feats.shape[1]))
            elif self.MEAN:
                acc = torch.float32 if f.dtype in (torch.float16, torch.bfloat16) else f.dtype
                rows.append(f.to(acc).mean(0).to(f.dtype))
            else:
                rows.append(f.max(0).values)
        return torch.stack(rows) if rows else feats.new_zeros((0, feats.shape[1]))


class SparseGlobalMaxPool(_GlobalPool):
    """spconv 2.x's SparseGlobalMaxPool: [B, C], each batch entry's maximum per channel."""


class SparseGlobalAvgPool(_GlobalPool):
    """spconv 2.x's SparseGlobalAvgPool, as meant: [B, C], each batch entry's mean per channel.
    (spconv 2.3.8's takes element [0] of each mean and returns [B], the first channel's means.)"""

    MEAN = True
