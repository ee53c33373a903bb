"""SparseConvTensor: features [N, C] + indices int32 [N, 4] (b, z, y, x) + spatial shape + batch
size, and the indice_key cache (``indice_dict``) that the layers of one network share."""

import torch

from .. import ops


def _shape3(spatial_shape):
    """A spatial shape as a list of 3 Python ints (accepts lists, tuples, NumPy arrays, tensors)."""
    shape = [int(v) for v in spatial_shape]
    if len(shape) != 3:
        raise ValueError(f"spconv_c: spatial_shape must have 3 values (D, H, W), got {shape}")
    return shape


def version_of(tensor):
    """The tensor's version counter, or None for an inference tensor (torch.inference_mode),
    which has none: such indices are never taken as unchanged."""
    return None if tensor.is_inference() else tensor._version


class IndiceEntry:
    """What ``indice_dict[key]`` holds: one layer's rulebook and the geometry it was built for.

    ``indices`` / ``spatial_shape`` are the layer's input, ``out_indices`` /
    ``out_spatial_shape`` its output; ``kind`` is ops.REGULAR, ops.SUBM or ops.TRANSPOSED (a pool
    stores a REGULAR rulebook). ``inverse()`` is the rulebook of the inverse conv (built once).
    """

    def __init__(self, rulebook, kind, indices, spatial_shape, out_indices, out_spatial_shape,
                 ksize, stride, padding, dilation, batch_size=None):
        self.rulebook = rulebook
        self.kind = kind
        self.is_subm = kind == ops.SUBM
        self.indices, self.spatial_shape = indices, spatial_shape
        self.out_indices, self.out_spatial_shape = out_indices, out_spatial_shape
        self.ksize, self.stride, self.padding, self.dilation = ksize, stride, padding, dilation
        self.batch_size = batch_size
        # The versions of both index tensors when the rulebook was built: while a tensor is the
        # same object at the same version, nothing has written into it, and the next rulebook
        # on those sites need not check them again (rulebook_for).
        self.in_version = version_of(indices)
        self.out_version = version_of(out_indices)
        self._inverse = None

    def inverse(self):
        if self._inverse is None:
            self._inverse = ops.inverse_rulebook(self.rulebook)
        return self._inverse


class SparseConvTensor:
    """spconv 2.x's SparseConvTensor (the attributes detection code reads, same constructor)."""

    def __init__(self, features, indices, spatial_shape, batch_size, grid=None, voxel_num=None,
                 indice_dict=None, benchmark=False, permanent_thrust_allocator=False,
                 enable_timer=False, force_algo=None):
        self._features = features
        self.indices = indices
        self.spatial_shape = _shape3(spatial_shape)
        self.batch_size = int(batch_size)
        self.indice_dict = {} if indice_dict is None else indice_dict
        self.grid = grid
        self.voxel_num = voxel_num
        self.benchmark = benchmark
        self.benchmark_record = {}
        self.thrust_allocator = None
        self.enable_timer = enable_timer
        self.force_algo = force_algo

    @property
    def features(self):
        return self._features

    @features.setter
    def features(self, value):
        self._features = value

    def replace_feature(self, feature):
        """A tensor with the same sites and cache and new features (same number of rows)."""
        new = self.shadow_copy()
        new._features = feature
        return new

    def shadow_copy(self):
        """A new tensor sharing every attribute (features, indices, the indice_dict cache, the
        benchmark record), as spconv's shadow copy does; the layers derive their outputs from
        it. It copies the attributes as they are, without __init__'s conversions, since they
        were converted when this tensor was made: a layer pays ~1 us for it, not ~4."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def _derive(self, features, indices, spatial_shape):
        """A layer's output: this tensor's attributes with new sites (spatial_shape a list of 3
        ints)."""
        new = self.shadow_copy()
        new._features, new.indices, new.spatial_shape = features, indices, spatial_shape
        return new

    @property
    def spatial_size(self):
        d, h, w = self.spatial_shape
        return d * h * w

    def find_indice_pair(self, key):
        if key is None:
            return None
        return self.indice_dict.get(key)

    @classmethod
    def from_dense(cls, x):
        """From a channels-last dense [B, D, H, W, C]: the sites where any channel is non-zero."""
        spatial_shape = list(x.shape[1:-1])
        indices = torch.nonzero(x.abs().sum(-1)).int()
        features = x[indices[:, 0].long(), indices[:, 1].long(), indices[:, 2].long(),
                     indices[:, 3].long()]
        return cls(features, indices, spatial_shape, x.shape[0])

    def dense(self, channels_first=True):
        """Dense [B, C, D, H, W] (channels_first) or [B, D, H, W, C]; differentiable."""
        out = ops.sparse_to_dense(self._features, self.indices, self.spatial_shape,
                                  self.batch_size)
        return out if channels_first else out.permute(0, 2, 3, 4, 1).contiguous()

    @property
    def sparity(self):
        return self.indices.shape[0] / (self.spatial_size * self.batch_size)

    def __add__(self, other):
        if isinstance(other, SparseConvTensor):
            return self.replace_feature(self._features + other.features)
        return self.replace_feature(self._features + other)

    def __repr__(self):
        return (f"SparseConvTensor[features={tuple(self._features.shape)}, "
                f"spatial_shape={self.spatial_shape}, batch_size={self.batch_size}]")
