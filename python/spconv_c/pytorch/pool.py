"""Sparse max pooling (spconv 2.x's SparseMaxPool3d). Starts from -inf, not from 0 as spconv's
CPU pool does, so all-negative windows give their maximum; ties go to the smallest offset."""

from .. import ops
from .conv import expand_nd, rulebook_for
from .modules import SparseModule


class SparseMaxPool(SparseModule):
    def __init__(self, ndim, kernel_size=3, stride=None, padding=0, dilation=1, indice_key=None,
                 subm=False, algo=None, record_voxel_count=False, name=None):
        super().__init__(name=name)
        if ndim != 3:
            raise NotImplementedError("spconv_c: only 3-d pooling exists")
        if subm:
            raise NotImplementedError("spconv_c: submanifold max pooling is not supported")
        self.ndim = ndim
        self.kernel_size = expand_nd(ndim, kernel_size)
        self.stride = list(self.kernel_size) if stride is None else expand_nd(ndim, stride)
        self.padding = expand_nd(ndim, padding)
        self.dilation = expand_nd(ndim, dilation)
        self.subm = subm
        self.indice_key = indice_key
        self.algo = algo
        self.record_voxel_count = record_voxel_count

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}")

    def forward(self, input):
        _, rb, out_indices, out_shape = rulebook_for(
            input, ops.REGULAR, self.kernel_size, self.stride, self.padding, self.dilation,
            [0, 0, 0], self.indice_key)
        out = ops.indice_maxpool(rb, input.features)
        return input._derive(out, out_indices, out_shape)


class SparseMaxPool3d(SparseMaxPool):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, indice_key=None,
                 algo=None, record_voxel_count=False, name=None):
        super().__init__(3, kernel_size, stride, padding, dilation, indice_key=indice_key,
                         algo=algo, record_voxel_count=record_voxel_count, name=name)
