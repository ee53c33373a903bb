"""Sparse max pooling (spconv 2.x's SparseMaxPool1d / 2d / 3d). Starts from -inf, not from 0 as
spconv's CPU pool does, so all-negative windows give their maximum; ties go to the smallest
offset."""

from .. import ops
from .conv import MAX_NDIM, check_ndim, expand_nd, layer_sites
from .modules import SparseModule


class SparseMaxPool(SparseModule):
    def __init__(self, ndim, kernel_size=3, stride=None, padding=0, dilation=1, indice_key=None,
                 subm=False, algo=None, record_voxel_count=False, name=None):
        super().__init__(name=name)
        if not 1 <= ndim <= MAX_NDIM:
            raise NotImplementedError(f"spconv_c: {ndim}-d pooling does not exist here (1-d, "
                                      f"2-d and 3-d do)")
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
        check_ndim(self, input)
        rb, out_indices, out_shape, lifted = layer_sites(
            input, ops.REGULAR, self.kernel_size, self.stride, self.padding, self.dilation,
            [0] * self.ndim, self.indice_key)
        out = ops.indice_maxpool(rb, input.features)
        return input._derive(out, out_indices, out_shape, lifted)


class _SparseMaxPoolNd(SparseMaxPool):
    NDIM = 3

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, indice_key=None,
                 algo=None, record_voxel_count=False, name=None):
        super().__init__(self.NDIM, kernel_size, stride, padding, dilation, indice_key=indice_key,
                         algo=algo, record_voxel_count=record_voxel_count, name=name)


class SparseMaxPool1d(_SparseMaxPoolNd):
    NDIM = 1


class SparseMaxPool2d(_SparseMaxPoolNd):
    NDIM = 2


class SparseMaxPool3d(_SparseMaxPoolNd):
    NDIM = 3
