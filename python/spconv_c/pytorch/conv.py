"""Sparse convolutions with spconv 2.x's constructor arguments and weight layout.

Weights are stored as spconv 2.x stores them, KRSC ``[C_out, KD, KH, KW, C_in]``, so a spconv
(or OpenPCDet) state_dict loads unchanged. The engine wants RSCK ``[KD, KH, KW, C_in, C_out]``:
the module hands it ``weight.permute(1, 2, 3, 4, 0)``, a view; the engine makes it contiguous
once per call (KV * C_in * C_out elements, small beside the features) and the gradient flows
back through the same view.

Kernel-volume-1 layers: spconv 2.x computes them as ``features @ weight.view(C_in, C_out)``, a
plain reshape of the KRSC tensor rather than its transpose (spconv issue #450); checkpoints
trained that way depend on it, so that is the default here too (``legacy_1x1``), and a spconv
checkpoint gives spconv's outputs. ``SparseConvolution.legacy_1x1 = False`` (per module, or
``SPCONV_C_LEGACY_1X1=0`` for every module) reads such a weight as what KRSC says it is, as for
any other kernel.
"""

import math
import os

import torch
from torch import nn
from torch.nn import init
from torch.nn.parameter import Parameter

from .. import ops
from .core import (MAX_NDIM, UNREAD, ConvAlgo, IndiceEntry, SparseConvTensor, axes_of,
                   extents_of, lift_shape, unchanged_since, version_of)
from .modules import MAX_NUM_VOXELS, SparseModule, VoxelCount

# spconv's reading of kernel-volume-1 weights unless SPCONV_C_LEGACY_1X1=0 (the module docstring)
LEGACY_1X1_DEFAULT = os.environ.get("SPCONV_C_LEGACY_1X1", "1") != "0"


def expand_nd(ndim, value):
    if isinstance(value, int):
        return [value] * ndim
    value = [int(v) for v in value]
    if len(value) == 1:
        return value * ndim
    if len(value) != ndim:
        raise ValueError(f"spconv_c: expected {ndim} values, got {value}")
    return value


class _KeyMismatch(ValueError):
    pass


def _same_sites(cached, version, indices):
    """Whether ``indices`` are the sites a cached rulebook was built on (``cached``, whose version
    was ``version`` then), row for row: the same tensor at the same version (the layers of a
    sequence pass it on, so this is the usual answer), else equal values (a pass over the rows).
    The same tensor written into since (in place, or through a view) is not: its values then
    say nothing about what it held. An inference tensor has no version, nor has any tensor
    under torch.compile (core.version_of); the same one is then taken as unchanged (writes to
    it cannot be seen, as writes through ``.data`` cannot)."""
    if cached is indices:
        return unchanged_since(version, indices)
    return (cached.shape == indices.shape and cached.dtype == indices.dtype
            and torch.equal(cached, indices))


def _same_shape(stored, shape):
    """A stored spatial shape (a list of ints) against a tensor's, which a user may have set to
    a tuple or a NumPy array."""
    return stored == shape if type(shape) is list else stored == [int(v) for v in shape]


def _known_sites(cache, input):
    """(rulebook, output_side) of a stored rulebook that took ``input``'s indices as its input
    sites (checked by its build) or gave them as its output sites (made valid by it), on the
    same spatial shape and batch size, where the indices are the same tensor at the same version
    (nothing has written into them since, not even in place through a view); else None."""
    indices = input.indices
    version = version_of(indices)
    if version is None:
        return None
    for entry in cache.values():
        if not isinstance(entry, IndiceEntry) or entry.batch_size != input.batch_size:
            continue
        if (entry.out_indices is indices and entry.out_version == version
                and _same_shape(entry.out_spatial_shape, input.spatial_shape)):
            return entry.rulebook, True
        if (entry.indices is indices and entry.in_version == version
                and _same_shape(entry.spatial_shape, input.spatial_shape)):
            return entry.rulebook, False
    return None


@torch.compiler.disable
def _build(cache, input, kind, ksize, stride, padding, dilation, output_padding, indice_key,
           ndim, with_token):
    """A new rulebook on ``input``'s sites, as a new IndiceEntry, stored under ``indice_key``
    (when not None): built on the sites of a stored rulebook where they are known (the rows'
    checks, 15-20% of a strided build, skipped), else from the indices; with its token when
    ``with_token``. Outside any compiled graph: it reads the handle (traced, a fake one), and
    the compiled code that follows takes only the entry's tensors and token."""
    known = _known_sites(cache, input)
    if known is not None:
        rb, out_indices, out_shape = ops.build_rulebook_on(known[0], known[1], kind, ksize,
                                                           stride, padding, dilation,
                                                           output_padding)
    else:
        rb = ops.build_rulebook(input.indices, input.spatial_shape, input.batch_size, kind,
                                ksize, stride, padding, dilation, output_padding)
        out_indices = out_shape = None
    if kind == ops.SUBM:
        out_indices, out_shape = input.indices, list(input.spatial_shape)
    elif out_indices is None:
        out_indices, out_shape = rb.out_indices(), list(rb.out_shape())
    entry = IndiceEntry(rb, kind, input.indices, list(input.spatial_shape), out_indices,
                        out_shape, list(ksize), list(stride), list(padding), list(dilation),
                        input.batch_size, ndim, rb.token() if with_token else None)
    if indice_key is not None:
        cache[indice_key] = entry
    return entry


def _compared(version, unread):
    """What ops.check_sites_token compares a cached rulebook's sites with, from the version its
    entry recorded: that version; ``unread`` for an entry made inside a compiled graph (UNREAD);
    -2 (nothing) for an inference tensor's (None)."""
    if version is UNREAD:
        return unread
    return -2 if version is None else version


def _build_traced(cache, input, kind, ksize, stride, padding, dilation, output_padding,
                  indice_key, ndim):
    """_build inside a compiled graph: the rulebook as its token, from ops.build_subm_token
    (sizes [N, N, 0], known before it runs) or ops.build_rulebook_token (the output count an
    unbacked size), so that a build is no graph break. The entry holds only the token (its
    ``rulebook`` is made from it if eager code asks). It builds from the indices, with the
    rows' checks (_known_sites compares tensor versions, which compiled code cannot read:
    core.version_of)."""
    shape = list(input.spatial_shape)
    if kind == ops.SUBM:
        token = ops.build_subm_token(input.indices, shape, input.batch_size, ksize, stride,
                                     padding, dilation, output_padding)
        out_indices, out_shape = input.indices, list(shape)
    else:
        token, out_indices = ops.build_rulebook_token(input.indices, shape, input.batch_size,
                                                      kind, ksize, stride, padding, dilation,
                                                      output_padding)
        out_shape = ops.output_shape(kind, shape, ksize, stride, padding, dilation,
                                     output_padding)
    entry = IndiceEntry(None, kind, input.indices, shape, out_indices, out_shape, list(ksize),
                        list(stride), list(padding), list(dilation), input.batch_size, ndim,
                        token)
    if indice_key is not None:
        cache[indice_key] = entry
    return entry


def rulebook_for(input, kind, ksize, stride, padding, dilation, output_padding, indice_key,
                 ndim=MAX_NDIM, token=None, store=None):
    """The rulebook of a layer on ``input`` through its indice_key cache; returns (entry, rb,
    out_indices, out_spatial_shape). ``rb`` is the handle, or its token (Rulebook.token()) with
    ``token``, which defaults to "under torch.compile": there the ops take the token, which is a
    tensor, so that its sizes are the graph's (a rulebook handle entered a graph with the sizes
    of the first one traced, and nothing guarded them) and a training graph can keep it for the
    backward (AOTAutograd saves tensors, not torchbind objects).

    subm: reused when the key holds a subm rulebook of the same kernel/dilation on the same
    sites, else built and stored; regular / transposed / pool: built and stored under the key
    (the inverse conv finds it); inverse: the inverse of the rulebook stored under the key.
    Under torch.compile, with a token, a subm build is traced inside the graph
    (_build_traced), and so is a regular / transposed / pool one where
    ``torch._dynamo.config.capture_dynamic_output_shape_ops`` lets the graph hold an output
    count that depends on the data; else a build runs outside the graph (_build, a break).
    ``ndim``: the layer's own (a 1-d / 2-d layer's ``input`` is lifted); a key stored by a layer
    of another ndim is refused, since lifted sites of several ndims can look alike.
    """
    if token is None:
        token = torch.compiler.is_compiling()
    cache = input.indice_dict
    entry = cache.get(indice_key) if indice_key is not None else None
    if entry is not None and kind in (ops.INVERSE, ops.SUBM) and entry.ndim != ndim:
        raise ValueError(f"spconv_c: indice_key {indice_key!r} holds the rulebook of a "
                         f"{entry.ndim}-d layer; this layer is {ndim}-d")
    if kind == ops.INVERSE:
        if indice_key is None or indice_key not in cache:
            raise KeyError(f"spconv_c: inverse conv: unknown indice_key {indice_key!r} (known: "
                           f"{sorted(cache)}); the conv it inverts must run first with that key")
        entry = cache[indice_key]
        if entry.is_subm:
            raise ValueError(f"spconv_c: inverse conv: indice_key {indice_key!r} holds a "
                             f"submanifold rulebook; only regular and transposed convs and pools "
                             f"invert")
        if list(entry.ksize) != list(ksize):
            raise ValueError(f"spconv_c: inverse conv: kernel {ksize} differs from the kernel "
                             f"{entry.ksize} of the conv under indice_key {indice_key!r}")
        if entry.out_indices.shape[0] != input.indices.shape[0]:
            raise ValueError(f"spconv_c: inverse conv: the input has {input.indices.shape[0]} "
                             f"sites, the conv under indice_key {indice_key!r} produced "
                             f"{entry.out_indices.shape[0]}")
        if (list(entry.out_spatial_shape) != list(input.spatial_shape)
                or not _same_sites(entry.out_indices, entry.out_version, input.indices)):
            raise ValueError(f"spconv_c: inverse conv: the input's sites (spatial shape "
                             f"{list(input.spatial_shape)}) are not the output sites of the conv "
                             f"under indice_key {indice_key!r} (spatial shape "
                             f"{list(entry.out_spatial_shape)}), row for row")
        rb = entry.inverse(token)
        if token and torch.compiler.is_compiling() and entry.out_indices is input.indices:
            # The output sites a non-subm build made: version 0 then, unless recorded.
            rb = ops.check_sites_token(rb, input.indices, _compared(entry._out_version, 0),
                                       f"spconv_c: inverse conv: the input's sites are not the "
                                       f"output sites of the conv under indice_key "
                                       f"{indice_key!r}, row for row: its indices were written "
                                       f"into since")
        return entry, rb, entry.indices, entry.spatial_shape
    if kind == ops.SUBM and indice_key is not None and indice_key in cache:
        entry = cache[indice_key]
        if (not entry.is_subm or list(entry.ksize) != list(ksize)
                or list(entry.dilation) != list(dilation)):
            raise _KeyMismatch(f"spconv_c: indice_key {indice_key!r} holds a rulebook of another "
                               f"geometry (kernel {entry.ksize}, dilation {entry.dilation}, "
                               f"subm={entry.is_subm}); this layer has kernel {ksize}, dilation "
                               f"{dilation}, subm=True")
        if not _same_shape(entry.spatial_shape, input.spatial_shape):
            raise _KeyMismatch(f"spconv_c: indice_key {indice_key!r} holds a subm rulebook of "
                               f"spatial shape {entry.spatial_shape}; this layer's input has "
                               f"{[int(v) for v in input.spatial_shape]}")
        if (entry.indices.shape[0] != input.indices.shape[0]
                or not _same_sites(entry.indices, entry.in_version, input.indices)):
            written = entry.indices is input.indices
            raise _KeyMismatch(f"spconv_c: indice_key {indice_key!r} holds a subm rulebook of "
                               f"other sites ({entry.indices.shape[0]} sites; this layer's "
                               f"input has {input.indices.shape[0]}"
                               + (", its indices written into since" if written else "")
                               + "); a key's subm layers must share their sites")
        rb = entry.rulebook_arg(token)
        if token and torch.compiler.is_compiling() and entry.indices is input.indices:
            rb = ops.check_sites_token(rb, input.indices, _compared(entry._in_version, -1),
                                       f"spconv_c: indice_key {indice_key!r} holds a subm "
                                       f"rulebook of other sites (its indices written into "
                                       f"since); a key's subm layers must share their sites")
        return entry, rb, entry.out_indices, entry.out_spatial_shape
    if token and torch.compiler.is_compiling() and (
            kind == ops.SUBM or torch._dynamo.config.capture_dynamic_output_shape_ops):
        entry = _build_traced(cache if store is None else store, input, kind, ksize, stride,
                              padding, dilation, output_padding, indice_key, ndim)
        return entry, entry.token, entry.out_indices, entry.out_spatial_shape
    entry = _build(cache if store is None else store, input, kind, ksize, stride, padding,
                   dilation, output_padding, indice_key, ndim, token)
    return entry, entry.rulebook_arg(token), entry.out_indices, entry.out_spatial_shape


def own_cache(input, indice_key):
    """The cache a layer with ``indice_key`` stores its entry in and its output keeps: a copy of
    its input's (None for no key: nothing stored, the output shares the input's). As spconv's
    layers do (``input.indice_dict.copy()``), a key is then seen by the layer's output and what
    derives from it, not by its input or the input's other branches: two heads on one tensor may
    each use a key of their own geometry under one name."""
    return None if indice_key is None else dict(input.indice_dict)


def _lifts(rows, indices):
    """Whether the engine's [N, 4] ``rows`` are the nd ``indices`` lifted, row for row (what
    ops.check_lifted_token checks where the rulebook is a token)."""
    nd = indices.shape[1] - 1
    return (rows.shape[0] == indices.shape[0] and torch.equal(rows[:, 0], indices[:, 0])
            and torch.equal(rows[:, MAX_NDIM + 1 - nd:], indices[:, 1:])
            and not rows[:, 1:MAX_NDIM + 1 - nd].any())


def check_ndim(module, input):
    """That ``input`` is a SparseConvTensor with as many spatial axes as the layer's."""
    if not isinstance(input, SparseConvTensor):
        raise TypeError(f"spconv_c: {type(module).__name__} takes a SparseConvTensor, got "
                        f"{type(input).__name__}")
    if len(input.spatial_shape) != module.ndim:
        raise ValueError(f"spconv_c: {type(module).__name__} is a {module.ndim}-d layer; its "
                         f"input is {len(input.spatial_shape)}-d (spatial_shape "
                         f"{list(input.spatial_shape)})")


def layer_sites(input, kind, ksize, stride, padding, dilation, output_padding, indice_key,
                token=None, store=None):
    """rulebook_for on ``input`` of any ndim: returns (rb, out_indices, out_spatial_shape, lifted)
    with the output's sites as the layer gives them (nd), and ``lifted`` their engine rows for
    _derive (None for a 3-d layer). A 1-d / 2-d layer works in the engine's 3-d space on the
    lifted sites (core.py's docstring); the cache under its indice_key holds those. Its outputs:
    a subm layer's are the input's own indices (the same tensor); an inverse conv's are the nd
    indices its paired conv took; others an int32 [M, ndim + 1] copy of the engine's rows.
    ``rb`` is the handle or the token, as rulebook_for's ``token`` says. A rulebook the layer
    builds goes under its key into ``store`` (own_cache), else into the input's cache."""
    ndim = len(input.spatial_shape)
    if ndim == MAX_NDIM:
        _, rb, out_indices, out_shape = rulebook_for(input, kind, ksize, stride, padding, dilation,
                                                     output_padding, indice_key, ndim, token,
                                                     store)
        return rb, out_indices, out_shape, None
    sites = input.shadow_copy()  # shares the indice_dict
    sites.indices, sites.spatial_shape, unverified = input._lifted_rows()
    try:
        entry, rb, rows, shape = rulebook_for(
            sites, kind, lift_shape(ksize, 1), lift_shape(stride, 1), lift_shape(padding, 0),
            lift_shape(dilation, 1), lift_shape(output_padding, 0), indice_key, ndim, token,
            store)
    except RuntimeError as e:
        lead = MAX_NDIM - ndim
        axes = axes_of(ndim)
        raise RuntimeError(f"{e} (a {ndim}-d layer runs in the engine as a 3-d one: sites (b, "
                           f"{'0, ' * lead}{axes}) in [{'1, ' * lead}{extents_of(ndim)}], kernel "
                           f"{[1] * lead + list(ksize)})") from e
    if unverified:
        # Rows kept with the nd indices, taken under torch.compile, which cannot read whether
        # the indices were written into since (eager code lifts them again then): their values
        # are compared with the indices, where the graph runs. (Lifting them anew would lose
        # the identity by which the cache knows sites from layer to layer.)
        # A refused call may leave behind an entry that a strided build stored (outside the
        # graph) on the rows as they were; nothing holds its output sites.
        what = (f"spconv_c: the indices of this {ndim}-d layer's input, or the rows in the "
                f"engine's 3-d space kept with them, were written into since those rows were "
                f"made, which compiled code cannot see; give the tensor new indices "
                f"(x.indices = x.indices.clone()) before writing into them, or run the module "
                f"eagerly")
        if isinstance(rb, torch.Tensor):
            rb = ops.check_lifted_token(rb, sites.indices, input.indices, what)
        elif not _lifts(sites.indices, input.indices):
            # (A handle: rulebook_for ran eagerly, in a frame Dynamo skipped, while the rows
            # were taken in a compiled one.)
            raise ValueError(what)
    if kind == ops.SUBM:
        out = input.indices
    elif kind == ops.INVERSE and entry.nd_indices is not None:
        out = entry.nd_indices
        if not unchanged_since(entry.nd_version, out):
            rows = None  # written into since: the next layer lifts what they hold now
    else:
        out = rows[:, [0, *range(MAX_NDIM + 1 - ndim, MAX_NDIM + 1)]]  # a copy
        if kind != ops.INVERSE:
            entry.nd_indices, entry.nd_version = input.indices, version_of(input.indices)
    return rb, out, shape[MAX_NDIM - ndim:], rows


class SparseConvolution(SparseModule, VoxelCount):
    """Base of every sparse conv (checkpoint loaders test isinstance against it)."""

    legacy_1x1 = LEGACY_1X1_DEFAULT
    _fused_activation = False  # (modules pickled before there was one)

    def __init__(self, ndim, in_channels, out_channels, kernel_size=3, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, subm=False, output_padding=0, transposed=False,
                 inverse=False, indice_key=None, algo=None, fp32_accum=None,
                 record_voxel_count=False, act_type=None, act_alpha=0, act_beta=0,
                 large_kernel_fast_algo=False, name=None, device=None, dtype=None):
        super().__init__(name=name)
        if not 1 <= ndim <= MAX_NDIM:
            raise NotImplementedError(f"spconv_c: {ndim}-d sparse convolutions do not exist "
                                      f"here (1-d, 2-d and 3-d do)")
        if groups != 1:
            raise NotImplementedError("spconv_c: groups != 1 is not supported (nor by spconv)")
        self.ndim = ndim
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = expand_nd(ndim, kernel_size)
        self.stride = expand_nd(ndim, stride)
        self.padding = expand_nd(ndim, padding)
        self.dilation = expand_nd(ndim, dilation)
        self.output_padding = expand_nd(ndim, output_padding)
        self.groups = groups
        self.subm, self.transposed, self.inverse = subm, transposed, inverse
        self.indice_key = indice_key
        # accepted; the engine has one algorithm (spconv's CPU build makes every layer Native)
        self.algo = ConvAlgo.Native if algo is None else algo
        self.fp32_accum = fp32_accum
        self.record_voxel_count = record_voxel_count
        self.act_type, self.act_alpha, self.act_beta = act_type, act_alpha, act_beta
        # spconv fuses an activation given so into its GPU inference kernels (its CPU build
        # refuses one). The engine has none fused: such a layer refuses to run, rather than run
        # without it (apply the activation as a module after the layer).
        self._fused_activation = getattr(act_type, "name", act_type) not in (None, "None_")
        self.large_kernel_fast_algo = large_kernel_fast_algo
        if in_channels < 0 or out_channels < 0:
            raise ValueError(f"spconv_c: channel counts must be >= 0, got in_channels="
                             f"{in_channels}, out_channels={out_channels}")
        if any(k < 1 for k in self.kernel_size):
            raise ValueError(f"spconv_c: kernel_size must be >= 1 on every axis, got "
                             f"{self.kernel_size}")
        kv = math.prod(self.kernel_size)
        # spconv's 1x1 fast path: kernel volume 1 and (subm or stride 1).
        self.conv1x1 = kv == 1 and (subm or math.prod(self.stride) == 1)
        if self.conv1x1 and not subm and self.padding != [0] * ndim:
            raise ValueError("spconv_c: padding must be zero for a 1x1 conv (k=1, s=1)")
        kwargs = {"device": device, "dtype": dtype}
        self.weight_shape = [out_channels, *self.kernel_size, in_channels]
        self.weight = Parameter(torch.zeros(*self.weight_shape, **kwargs))
        if bias:
            self.bias = Parameter(torch.zeros(out_channels, **kwargs))
        else:
            self.register_parameter("bias", None)
        if record_voxel_count and not subm and not inverse:
            self._add_voxel_count(device)
        self.reset_parameters()

    def _fan_in(self):
        return self.in_channels * math.prod(self.kernel_size)

    def reset_parameters(self):
        # Kaiming-uniform with a = sqrt(5) over fan_in = C_in * KV, as nn.Conv3d and spconv do.
        # Without input channels there is no fan-in and nothing to scale: bounds 0, as nn.Conv3d.
        fan_in = self._fan_in()
        gain = math.sqrt(2.0 / (1 + 5))
        bound = gain * math.sqrt(3.0 / fan_in) if fan_in > 0 else 0.0
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
        if self.bias is not None:
            b = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            init.uniform_(self.bias, -b, b)

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != [0] * self.ndim:
            s += f", padding={self.padding}"
        if self.dilation != [1] * self.ndim:
            s += f", dilation={self.dilation}"
        if self.output_padding != [0] * self.ndim:
            s += f", output_padding={self.output_padding}"
        if self.bias is None:
            s += ", bias=False"
        if self.indice_key is not None:
            s += f", indice_key={self.indice_key!r}"
        return s

    def is_inverseable(self):
        return self.indice_key is not None and not self.subm

    def _kind(self):
        if self.inverse:
            return ops.INVERSE
        if self.subm:
            return ops.SUBM
        return ops.TRANSPOSED if self.transposed else ops.REGULAR

    def forward(self, input, add_input=None):
        return self._forward(input, add_input)

    def _direct(self, input):
        """Whether the layer is a plain product ``features @ W`` on its input's sites, with no
        rulebook: a kernel-volume-1 layer with stride 1 (conv1x1), except an inverse one, which
        goes back to the sites of the conv under its key; with legacy_1x1 an inverse one too, as
        spconv 2.x computes it (its 1x1 path takes every conv1x1 layer, ignoring the key). A
        1x1 layer stores no rulebook under its key, so an inverse 1x1 on a key that nothing
        stored inverts such a layer (spconv runs that pair): that layer's output sites were its
        input sites, and going back is the product on them too."""
        if not self.conv1x1:
            return False
        if not self.inverse or self.legacy_1x1:
            return True
        return self.indice_key is not None and self.indice_key not in input.indice_dict

    def _foldable(self):
        """Whether a following batch norm can be folded into this layer's op (_forward's bn):
        the layers that go through a rulebook and keep their own forward (a 1x1 layer may not:
        _direct)."""
        return type(self).forward is SparseConvolution.forward and not self.conv1x1

    def _forward(self, input, add_input=None, bn=None, relu=False):
        """The layer, and with @p bn (an nn.BatchNorm1d in eval mode, inference only; see
        modules._fold_length) that batch norm and, with @p relu, a ReLU applied to the output in
        the same op."""
        check_ndim(self, input)
        if self._fused_activation:
            raise NotImplementedError(f"spconv_c: {type(self).__name__}: act_type="
                                      f"{self.act_type} (spconv's activation fused into its GPU "
                                      f"inference kernels) is not supported; apply the "
                                      f"activation as a module after the layer")
        feats = input.features
        shape = feats.shape
        if len(shape) != 2 or shape[1] != self.in_channels:
            raise ValueError(f"spconv_c: {type(self).__name__} expects features [N, "
                             f"{self.in_channels}], got {list(shape)}")
        # The weights take the features' dtype (as spconv's kernels need); the engine computes
        # f16 / bf16 in f32 and rounds each result once, on either device. (Read from the
        # parameter dict where they are there: nn.Module.__getattr__ costs ~1 us a name; a
        # parametrization moves them out of it, and the attribute then computes them.)
        params = self._parameters
        weight = params.get("weight")
        if weight is None:
            weight = self.weight
        bias = params["bias"] if "bias" in params else self.bias
        if weight.dtype != feats.dtype:
            weight = weight.to(feats.dtype)
        if bias is not None and bias.dtype != feats.dtype:
            bias = bias.to(feats.dtype)
        if self._direct(input):
            # No rulebook: every site maps to itself. The checks the engine makes on the other
            # paths that do not need the sites' coordinates: the dtypes and shapes (int features
            # would otherwise truncate the weights).
            if not feats.is_floating_point():
                raise RuntimeError(f"spconv_c: {type(self).__name__}: features must be floating "
                                   f"(float16, bfloat16, float32, float64), got {feats.dtype}")
            indices = input.indices
            if (indices.dtype != torch.int32 or indices.dim() != 2
                    or indices.shape[1] != self.ndim + 1):
                raise RuntimeError(f"spconv_c: {type(self).__name__}: indices must be int32 "
                                   f"[N, {self.ndim + 1}] rows (b, {axes_of(self.ndim)}), got "
                                   f"{indices.dtype} {list(indices.shape)}")
            if feats.shape[0] != input.indices.shape[0]:
                raise ValueError(f"spconv_c: {type(self).__name__}: {feats.shape[0]} feature "
                                 f"rows for {input.indices.shape[0]} sites (indices rows)")
            if self.legacy_1x1:
                w = weight.reshape(self.in_channels, self.out_channels)
            else:
                w = weight.reshape(self.out_channels, self.in_channels).t()
            if feats.dtype in (torch.float16, torch.bfloat16):
                # Sum in f32 and round once, as the engine's layers do.
                out = feats.float() @ w.float()
                if bias is not None:
                    out = out + bias.float()
                out = out.to(feats.dtype)
            else:
                out = feats @ w
                if bias is not None:
                    out = out + bias
            result = input.replace_feature(out)
        else:
            store = own_cache(input, self.indice_key)
            rb, out_indices, out_shape, lifted = layer_sites(
                input, self._kind(), self.kernel_size, self.stride, self.padding, self.dilation,
                self.output_padding, self.indice_key, store=store)
            if bn is not None and not isinstance(rb, torch.Tensor):
                # Folded (inference, a handle): the op takes the KRSC weight as it is.
                out = ops.indice_conv_bn(rb, feats, weight, bias, bn, relu, krsc=True)
            else:
                # KRSC [C_out, *K, C_in] -> the engine's [KD, KH, KW, C_in, C_out], views only.
                w = weight.permute(*range(1, self.ndim + 2), 0)
                for _ in range(MAX_NDIM - self.ndim):
                    w = w.unsqueeze(0)
                out = ops.indice_conv(rb, feats, w, bias)
                if bn is not None:
                    # A token: this frame is compiled while the SparseSequential's, which chose
                    # to fold, runs eagerly (Dynamo skips a frame whose loop has a graph break).
                    # The graph takes the batch norm and ReLU as modules (the same bits as the
                    # folded op gives: modules._probe_fold).
                    out = bn(out)
                    if relu:
                        out = torch.relu(out)
            result = input._derive(out, out_indices, out_shape, lifted, store)
            self._count_voxels(out_indices.shape[0])
        if add_input is not None:
            result = result.replace_feature(result.features + add_input.features)
        return result


# The methods as this module defines them: an inference sequence run in one call stands in for
# them only while a class has them so (sequence._as_written).
AS_DEFINED = (("forward", SparseConvolution.forward), ("_forward", SparseConvolution._forward),
              ("_kind", SparseConvolution._kind))


# spconv 2.x's layer classes, one per kind and ndim, with its constructor arguments. Each kind's
# constructor is written once, in a private base whose subclasses only set NDIM, so that a
# SubMConv2d is not an instance of SubMConv3d (user code tells layers apart by class).


class _SparseConv(SparseConvolution):
    NDIM = 3

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, indice_key=None, algo=None, fp32_accum=None,
                 record_voxel_count=False, large_kernel_fast_algo=False, name=None):
        super().__init__(self.NDIM, in_channels, out_channels, kernel_size, stride, padding,
                         dilation, groups, bias, indice_key=indice_key, algo=algo,
                         fp32_accum=fp32_accum, record_voxel_count=record_voxel_count,
                         large_kernel_fast_algo=large_kernel_fast_algo, name=name)


class _SubMConv(SparseConvolution):
    NDIM = 3

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, indice_key=None, algo=None, fp32_accum=None,
                 large_kernel_fast_algo=False, name=None):
        super().__init__(self.NDIM, in_channels, out_channels, kernel_size, stride, padding,
                         dilation, groups, bias, True, indice_key=indice_key, algo=algo,
                         fp32_accum=fp32_accum, large_kernel_fast_algo=large_kernel_fast_algo,
                         name=name)


class _SparseConvTranspose(SparseConvolution):
    NDIM = 3

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, indice_key=None, algo=None, fp32_accum=None,
                 record_voxel_count=False, large_kernel_fast_algo=False, name=None):
        super().__init__(self.NDIM, in_channels, out_channels, kernel_size, stride, padding,
                         dilation, groups, bias, transposed=True, indice_key=indice_key,
                         algo=algo, fp32_accum=fp32_accum, record_voxel_count=record_voxel_count,
                         large_kernel_fast_algo=large_kernel_fast_algo, name=name)


class _SparseInverseConv(SparseConvolution):
    NDIM = 3

    def __init__(self, in_channels, out_channels, kernel_size, indice_key, bias=True, algo=None,
                 fp32_accum=None, large_kernel_fast_algo=False, name=None):
        super().__init__(self.NDIM, in_channels, out_channels, kernel_size, bias=bias,
                         inverse=True, indice_key=indice_key, algo=algo, fp32_accum=fp32_accum,
                         large_kernel_fast_algo=large_kernel_fast_algo, name=name)


class SparseConv1d(_SparseConv):
    NDIM = 1


class SparseConv2d(_SparseConv):
    NDIM = 2


class SparseConv3d(_SparseConv):
    NDIM = 3


class SubMConv1d(_SubMConv):
    NDIM = 1


class SubMConv2d(_SubMConv):
    NDIM = 2


class SubMConv3d(_SubMConv):
    NDIM = 3


class SparseConvTranspose1d(_SparseConvTranspose):
    NDIM = 1


class SparseConvTranspose2d(_SparseConvTranspose):
    NDIM = 2


class SparseConvTranspose3d(_SparseConvTranspose):
    NDIM = 3


class SparseInverseConv1d(_SparseInverseConv):
    NDIM = 1


class SparseInverseConv2d(_SparseInverseConv):
    NDIM = 2


class SparseInverseConv3d(_SparseInverseConv):
    NDIM = 3


# spconv's 4-d layers: named, so that a network written for them fails at construction with
# the reason (the engine has three spatial axes) rather than with an AttributeError.


class SparseConv4d(_SparseConv):
    NDIM = 4


class SubMConv4d(_SubMConv):
    NDIM = 4


class SparseConvTranspose4d(_SparseConvTranspose):
    NDIM = 4


class SparseInverseConv4d(_SparseInverseConv):
    NDIM = 4
