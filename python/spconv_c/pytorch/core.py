"""SparseConvTensor: features [N, C] + indices int32 [N, 1 + ndim] (b, z, y, x for 3-d; b, y, x
for 2-d; b, x for 1-d) + spatial shape + batch size, and the indice_key cache (``indice_dict``)
that the layers of one network share.

The engine is 3-d. A 1-d or 2-d tensor's sites are lifted to it with leading axes of extent 1:
(b, y, x) in [H, W] is the engine's (b, 0, y, x) in [1, H, W], and (b, x) in [W] is
(b, 0, 0, x) in [1, 1, W]; a layer's kernel, stride, padding and dilation get 1, 1, 0, 1 on those
axes. Along an axis of extent 1 a kernel of 1 pairs a site only with itself, so the lifted
rulebook has exactly the pairs of the nd conv, in the same order (the lifted sites sort as the
nd ones do). See docs/pytorch.md, "1-d and 2-d layers"."""

import enum
import math

import torch

from .. import ops

MAX_NDIM = 3


def _spatial_shape(spatial_shape):
    """A spatial shape as a list of 1 to 3 Python ints (accepts lists, tuples, NumPy arrays,
    tensors). A whole float (41.0) is taken as spconv takes it; one with a fraction, which
    spconv's int() truncates without a word, is refused."""
    shape = [int(v) for v in spatial_shape]
    if any(bool(v != n) for v, n in zip(spatial_shape, shape)):
        raise ValueError(f"spconv_c: spatial_shape must hold whole numbers of voxels, got "
                         f"{list(spatial_shape)}")
    if not 1 <= len(shape) <= MAX_NDIM:
        raise ValueError(f"spconv_c: spatial_shape must have 1, 2 or 3 values ([W], [H, W] or "
                         f"[D, H, W]; the engine has no 4-d convolution), got {shape}")
    return shape


def lift_shape(shape, fill):
    """An nd list (a spatial shape, or a kernel's sizes, strides, ...) as the engine's 3 values:
    ``fill`` on the leading axes an nd tensor lacks."""
    return [fill] * (MAX_NDIM - len(shape)) + list(shape)


class _Unread:
    """What version_of gives under torch.compile, where a version counter is a data-dependent
    value (reading it breaks the graph)."""

    def __repr__(self):
        return "<version not read: torch.compile>"


UNREAD = _Unread()


def version_of(tensor):
    """The tensor's version counter; None for an inference tensor (torch.inference_mode), which
    has none; UNREAD under torch.compile. A rulebook cached on sites of version None is reused
    for the same tensor (identity), but no build skips its checks on them
    (conv._known_sites)."""
    if torch.compiler.is_compiling():
        return UNREAD
    return None if tensor.is_inference() else tensor._version


def unchanged_since(version, tensor):
    """Whether ``tensor``, which was at ``version`` (from version_of), has not been written
    into since, as far as can be told. Under torch.compile the same tensor is taken as
    unchanged (no version can be read there). Outside it, a version recorded while compiling
    (UNREAD) says nothing, and the tensor counts as changed; an inference tensor's (None) is
    taken as unchanged."""
    now = version_of(tensor)
    if now is UNREAD:
        return True
    if version is UNREAD:
        return False
    return version is None or now is None or now == version


# A token of an entry built in eager code is made outside any compiled graph, from the handle (a
# handle that enters a traced frame becomes a fake object there, which Dynamo builds with a
# warning per method it lacks).

@torch.compiler.disable
def _token_of(entry):
    return entry.rulebook.token()


@torch.compiler.disable
def _inverse_handle_token(entry):
    return entry._inverse.token()


def axes_of(ndim):
    """The names of an nd tensor's spatial axes: "y, x" for 2-d."""
    return ", ".join(["z", "y", "x"][MAX_NDIM - ndim:])


def extents_of(ndim):
    """The names of an nd spatial shape's extents: "H, W" for 2-d."""
    return ", ".join(["D", "H", "W"][MAX_NDIM - ndim:])


class ConvAlgo(enum.Enum):
    """spconv's choice of conv algorithm (its ``spconv.core.ConvAlgo``, exported by
    ``spconv.pytorch``), for code that names one (``algo=ConvAlgo.Native``). The engine has one
    algorithm, gather, GEMM and scatter-add per kernel offset (spconv's Native): a layer takes any
    of these and runs it."""
    Native = 0
    MaskImplicitGemm = 1
    MaskSplitImplicitGemm = 2


class IndiceEntry:
    """What ``indice_dict[key]`` holds: one layer's rulebook and the geometry it was built for.

    ``indices`` / ``spatial_shape`` are the layer's input, ``out_indices`` /
    ``out_spatial_shape`` its output, in the engine's 3-d space (a 1-d / 2-d layer's sites
    lifted, see the module's docstring); ``kind`` is ops.REGULAR, ops.SUBM or ops.TRANSPOSED
    (a pool stores a REGULAR rulebook). ``inverse()`` is the rulebook of the inverse conv (built
    once). ``token``: the rulebook's token (Rulebook.token()) where one was made, else None;
    ``rulebook_arg`` / ``inverse`` give the handle or the token as the ops take them. An entry
    made inside a compiled graph (conv._build_traced) has only its token;
    ``rulebook`` then gives the handle the token stands for, on first use, in eager code.
    """

    def __init__(self, rulebook, kind, indices, spatial_shape, out_indices, out_spatial_shape,
                 ksize, stride, padding, dilation, batch_size=None, ndim=MAX_NDIM, token=None):
        self._rulebook = rulebook
        self.token = token
        self.kind = kind
        self.is_subm = kind == ops.SUBM
        self.indices, self.spatial_shape = indices, spatial_shape
        self.out_indices, self.out_spatial_shape = out_indices, out_spatial_shape
        self.ksize, self.stride, self.padding, self.dilation = ksize, stride, padding, dilation
        self.batch_size = batch_size
        self.ndim = ndim  # the layer's (its sites above are lifted when it is below 3)
        # For a 1-d / 2-d layer (whose sites above are the engine's lifted 3-d ones): the nd
        # input indices, which its inverse conv gives back (set by the layer; else None).
        self.nd_indices = self.nd_version = None
        # The versions of both index tensors when the rulebook was built: while a tensor is the
        # same object at the same version, nothing has written into it, and the next rulebook
        # on those sites need not check them again (rulebook_for).
        # (Made inside a compiled graph they are UNREAD, and read afterwards from the rulebook:
        # _read_versions.)
        self._in_version = version_of(indices)
        self._out_version = version_of(out_indices)
        self._inverse = self._inverse_token = None

    # Copies (deepcopy, pickle). A token is known by its storage, which a copy does not share:
    # a copied entry makes its own tokens when asked (the handles copy by rebuilding). The
    # copied index tensors have versions of their own (a deepcopy writes into them, version
    # 1), so each recorded version becomes "unchanged" or "changed" as of the copy, and the
    # copy's versions are read again on arrival: a copied cache vouches for its copied sites
    # exactly where the original vouched for the original ones.
    _VERSIONED = (("indices", "_in_version"), ("out_indices", "_out_version"),
                  ("nd_indices", "nd_version"))

    @property
    def rulebook(self):
        """The rulebook's handle (from the token, for an entry made inside a compiled graph)."""
        if self._rulebook is None:
            self._rulebook = ops.token_rulebook(self.token)
        return self._rulebook

    # spconv 2.x's IndiceData fields beside the geometry above, for code that reads them (its
    # layers run the one algorithm, Native; voxel_num is spconv's TensorRT-export count).
    algo = ConvAlgo.Native
    voxel_num = None

    @property
    def indice_pairs(self):
        """The rulebook as spconv's IndiceData holds it: int32 [2, KV, N_in], for kernel offset
        k the input rows (row 0) and output rows (row 1) of its pairs, packed from the left, -1
        after them. A copy, made on each call (segmentation code pools point positions over
        it, e.g. Stratified Transformer's get_downsample_info)."""
        rb = self.rulebook
        offsets = rb.pair_offsets()
        counts = offsets.diff()
        pairs_in, pairs_out = rb.pairs_in(), rb.pairs_out()
        out = torch.full((2, counts.numel(), rb.num_in()), -1, dtype=torch.int32,
                         device=pairs_in.device)
        k = torch.repeat_interleave(torch.arange(counts.numel()), counts)
        slot = torch.arange(int(offsets[-1])) - offsets[:-1].repeat_interleave(counts)
        k, slot = k.to(out.device), slot.to(out.device)
        out[0, k, slot] = pairs_in.to(torch.int32)
        out[1, k, slot] = pairs_out.to(torch.int32)
        return out

    @property
    def indice_pair_num(self):
        """int32 [KV]: the number of pairs of each kernel offset, as spconv's IndiceData counts
        them: a subm key of an odd kernel counts only the offsets before the centre, and 0 from
        the centre on (spconv's conv runs the centre as a direct product and offset k past it
        with the count of offset KV - 1 - k, its mirror), though indice_pairs holds them all."""
        counts = self.rulebook.pair_offsets().diff().to(torch.int32)
        if self.is_subm and all(k % 2 for k in self.ksize):
            counts[counts.numel() // 2:] = 0
        return counts

    def _read_versions(self):
        """An entry made inside a compiled graph (conv._build_traced) recorded its versions as
        UNREAD, which outside compile would count as changed and refuse the next layer of its
        key. Eager code reads them afterwards: the input sites' from the rulebook, whose build
        read the indices' version when it ran (Rulebook.sites_version); the output sites are
        the input's (subm) or a tensor the build made (version 0 then, unless an inference
        tensor). A write into them inside the compiled region itself goes unseen, as
        docs/pytorch.md says."""
        if (self._in_version is UNREAD and self.token is not None
                and not torch.compiler.is_compiling()):
            built = self.rulebook.sites_version()
            if built >= -1:
                self._in_version = None if built == -1 else built
                if self.is_subm:
                    self._out_version = self._in_version
                else:
                    self._out_version = None if self.out_indices.is_inference() else 0

    @property
    def in_version(self):
        self._read_versions()
        return self._in_version

    @property
    def out_version(self):
        self._read_versions()
        return self._out_version

    def __getstate__(self):
        self._read_versions()
        state = dict(self.__dict__)
        state["_rulebook"] = self.rulebook  # (a handle pickles by rebuilding; a token cannot)
        if state["_inverse"] is None and state["_inverse_token"] is not None:
            state["_inverse"] = ops.token_rulebook(state["_inverse_token"])
        state["token"] = state["_inverse_token"] = None
        for tensor, version in self._VERSIONED:
            if state[tensor] is not None:
                state[version] = unchanged_since(state[version], state[tensor])
        return state

    # The attributes' names before compiled graphs made entries (a cache pickled then loads).
    _RENAMED = {"rulebook": "_rulebook", "in_version": "_in_version",
                "out_version": "_out_version"}

    def __setstate__(self, state):
        state = {self._RENAMED.get(name, name): value for name, value in state.items()}
        state.setdefault("token", None)
        state.setdefault("_inverse_token", None)
        self.__dict__.update(state)
        for tensor, version in self._VERSIONED:
            if state[tensor] is not None:
                # -1: no version a tensor can have, so the sites count as changed.
                self.__dict__[version] = version_of(state[tensor]) if state[version] else -1

    def rulebook_arg(self, token=False):
        """The rulebook as the conv / pool ops take it: the handle, or with ``token`` its token
        (made outside any compiled graph when the entry has none yet)."""
        if not token:
            return self.rulebook
        if self.token is None:
            self.token = _token_of(self)
        return self.token

    def inverse(self, token=False):
        """The inverse conv's rulebook (built once): its handle, or with ``token`` its token.
        The token is made from the rulebook's token (ops.inverse_token), which traces inside a
        compiled graph: an inverse's sizes are the forward's, swapped."""
        if token:
            if self._inverse_token is None:
                if self._inverse is not None:
                    self._inverse_token = _inverse_handle_token(self)
                else:
                    self._inverse_token = ops.inverse_token(self.rulebook_arg(True))
            return self._inverse_token
        if self._inverse is None:
            if self._inverse_token is not None:
                self._inverse = ops.token_rulebook(self._inverse_token)
            else:
                self._inverse = ops.inverse_rulebook(self.rulebook)
        return self._inverse


class SparseConvTensor:
    """spconv 2.x's SparseConvTensor (the attributes detection code reads, same constructor)."""

    def __init__(self, features, indices, spatial_shape, batch_size, grid=None, voxel_num=None,
                 indice_dict=None, benchmark=False, permanent_thrust_allocator=False,
                 enable_timer=False, force_algo=None):
        self._features = features
        self.indices = indices
        self.spatial_shape = _spatial_shape(spatial_shape)
        self.batch_size = int(batch_size)
        self.indice_dict = {} if indice_dict is None else indice_dict
        self.grid = torch.empty(0) if grid is None else grid  # spconv's: an empty tensor
        self.voxel_num = voxel_num
        self.benchmark = benchmark
        self.benchmark_record = {}
        self.thrust_allocator = None
        self.enable_timer = enable_timer
        self.force_algo = force_algo
        self.int8_scale = None  # spconv's (its int8 inference; none here)

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

    def minus(self):
        """The same sites with negated features."""
        return self.replace_feature(-self._features)

    def select_by_index(self, valid_indices):
        """The sites (and their features) picked by ``valid_indices`` (an index or a mask over
        the rows), with a new, empty indice_dict: the cached rulebooks are of other sites.
        (spconv clears the indice_dict it shares with this tensor, which empties this tensor's
        cache too; this one is left as it is.)"""
        new = self.shadow_copy()
        new.indices = self.indices[valid_indices]
        new._features = self._features[valid_indices]
        new.indice_dict = {}
        new.__dict__.pop("_lift", None)
        return new

    @property
    def is_quantized(self):
        return self._features.is_quantized

    def q_scale(self):
        if self.is_quantized:
            return self._features.q_scale()
        raise ValueError("spconv_c: the sparse tensor's features are not quantized")

    def dequantize(self):
        return self.replace_feature(self._features.dequantize())

    def shadow_copy(self):
        """A new tensor sharing every attribute (features, indices, the indice_dict cache, the
        benchmark record), as spconv's shadow copy does; the layers derive their outputs from
        it. It copies the attributes as they are, without __init__'s conversions, since they
        were converted when this tensor was made: a layer pays ~1 us for it, not ~4."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def _derive(self, features, indices, spatial_shape, lifted=None, indice_dict=None):
        """A layer's output: this tensor's attributes with new sites (spatial_shape a list of
        ints). ``lifted``: for a 1-d / 2-d output, its sites as the engine's [M, 4] rows, which
        the next layer takes as they are (see lifted_sites). ``indice_dict``: the output's
        cache, where the layer made one (conv.own_cache), else this tensor's."""
        new = self.shadow_copy()
        new._features, new.indices, new.spatial_shape = features, indices, spatial_shape
        if indice_dict is not None:
            new.indice_dict = indice_dict
        if lifted is not None:
            new._lift = (indices, version_of(indices), lifted, version_of(lifted))
        else:
            new.__dict__.pop("_lift", None)  # another tensor's rows: of no use here
        return new

    def lifted_sites(self):
        """(indices [N, 4], spatial shape [3]): this tensor's sites in the engine's 3-d space.
        A 3-d tensor's are its own. A 1-d / 2-d tensor's are an int32 [N, 4] copy with zeros on
        the leading axes, made once: it is kept with the nd indices it came from and used again
        while both are the same tensors at the same versions (nothing has written into them,
        not even through a view or an indice_dict entry's ``indices``; an inference tensor,
        which has no version, while it is the same tensor), so the rulebook cache, which knows
        sites by tensor identity, knows them from layer to layer. (Under torch.compile, which
        cannot read versions, lifted anew.)"""
        rows, shape, unverified = self._lifted_rows()
        if unverified:  # (needs no identity: no cached rulebook is used)
            rows, shape, _ = self._lifted_rows(again=True)
        return rows, shape

    def _lifted_rows(self, again=False, keep=True):
        """(rows, spatial shape, unverified): lifted_sites, where ``unverified`` says that they
        are kept rows taken under torch.compile, which cannot read a version, so that it cannot
        tell whether the nd indices (or the rows) were written into since; the caller then
        compares their values (conv.layer_sites) or asks for them ``again``: lifted anew, and
        not kept. ``keep``: keep rows it makes with the indices (else the caller does:
        sequence._Walk)."""
        shape = self.spatial_shape
        indices = self.indices
        ndim = len(shape)
        if ndim == MAX_NDIM:
            return indices, shape, False
        lifted = lift_shape(shape, 1)
        kept = self.__dict__.get("_lift")
        if (not again and kept is not None and len(kept) == 4 and kept[0] is indices
                and unchanged_since(kept[1], indices) and unchanged_since(kept[3], kept[2])):
            # (An inference tensor has no version: the same one is taken as unchanged, as the
            # indice_key cache takes it, conv._same_sites; so is any under torch.compile. Rows
            # kept by an older version of this class, without their own version, are lifted
            # again.)
            return kept[2], lifted, torch.compiler.is_compiling()
        if (not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32
                or indices.dim() != 2 or indices.shape[1] != ndim + 1):
            got = (f"{indices.dtype} {list(indices.shape)}" if isinstance(indices, torch.Tensor)
                   else type(indices).__name__)
            raise RuntimeError(f"spconv_c: the indices of a {ndim}-d SparseConvTensor must be "
                               f"int32 [N, {ndim + 1}] rows (b, {axes_of(ndim)}), got {got}")
        rows = indices.new_zeros((indices.shape[0], MAX_NDIM + 1))
        rows[:, 0] = indices[:, 0]
        rows[:, MAX_NDIM + 1 - ndim:] = indices[:, 1:]
        if keep and not again:
            self._keep_lifted(rows)
        return rows, lifted, False

    def _keep_lifted(self, rows):
        """Keep ``rows``, the lift of this tensor's indices as they are now, with them."""
        self._lift = (self.indices, version_of(self.indices), rows, version_of(rows))

    @property
    def spatial_size(self):
        return math.prod(self.spatial_shape)

    def find_indice_pair(self, key):
        if key is None:
            return None
        return self.indice_dict.get(key)

    @classmethod
    def from_dense(cls, x):
        """From a channels-last dense [B, *spatial, C] (1 to 3 spatial axes): the sites where any
        channel is non-zero (a NaN counts; any dtype, bool too, as torch's to_sparse)."""
        spatial_shape = list(x.shape[1:-1])
        indices = torch.nonzero((x != 0).any(-1)).int()
        features = x[tuple(indices.long().t())]
        return cls(features, indices, spatial_shape, x.shape[0])

    def dense(self, channels_first=True):
        """Dense [B, C, *spatial] (channels_first) or [B, *spatial, C]; differentiable."""
        if len(self.spatial_shape) == MAX_NDIM:  # (no call to lifted_sites: a graph break)
            out = ops.sparse_to_dense(self._features, self.indices, self.spatial_shape,
                                      self.batch_size)
        else:
            indices, shape = self.lifted_sites()
            out = ops.sparse_to_dense(self._features, indices, shape, self.batch_size)
            out = out.reshape(out.shape[0], out.shape[1], *self.spatial_shape)
        return out if channels_first else out.movedim(1, -1).contiguous()

    @property
    def sparity(self):
        return self.indices.shape[0] / (self.spatial_size * self.batch_size)

    def __add__(self, other):
        if isinstance(other, SparseConvTensor):
            return self.replace_feature(self._features + other.features)
        return self.replace_feature(self._features + other)

    def __radd__(self, other):  # tensor + sparse tensor, as spconv's
        return self.replace_feature(other + self._features)

    def __iadd__(self, other):
        """``x += y`` adds into x's features in place, as spconv's does."""
        self._features += other.features if isinstance(other, SparseConvTensor) else other
        return self

    def __repr__(self):
        return (f"SparseConvTensor[features={tuple(self._features.shape)}, "
                f"spatial_shape={self.spatial_shape}, batch_size={self.batch_size}]")


# As this module defines it (see conv.AS_DEFINED).
DENSE_AS_DEFINED = SparseConvTensor.dense

# spconv's name for a cache entry's class, for code that names it.
IndiceData = IndiceEntry
