"""An inference SparseSequential in one call into C++ (SparseSequential.forward uses it).

Between two layers the modules run some Python and call into C++ once or twice; a conv that has
just streamed megabytes through the caches leaves that code cold, and each such call then costs
0.05-0.1 ms (docs/pytorch.md, "The overhead on an AVX-512 Xeon"). Here a sequence of 1-d, 2-d
or 3-d convs (each with the eval-mode batch norm and ReLU that _fold_length would fold into it)
and max pools, nested plain SparseSequentials included, and a ToDense that ends it, is first
walked in Python, deciding for every layer what the layer itself would decide (which rulebook,
built how, reused from where), and then run by the extension's SequenceRunner in one call,
which calls the very C++ functions the per-layer ops call, in the same order. The output
features, sites and indice_key cache entries are the ones the layers give one by one;
tests/test_sequence.py compares the two bit for bit.

The walk takes the longest run of whole modules it can from the start of the sequence. What it
does not take (a layer of another ndim, a 1x1 conv, an inverse conv, a layer on features that
is not folded, a subclass, hooks, a weight of another dtype, a cached key on sites the call
makes) and what follows it run layer by layer, and so does the whole sequence after any error
raised by the call: the layers then raise their own errors, with the messages and the partly
filled cache that the per-layer path gives. A sequence that starts with fewer than MIN_LAYERS
sparse layers the walk could take runs layer by layer from the start.
``SPCONV_C_SEQUENCE_CALL=0`` turns this off.
"""

import os

import torch

from .. import ops
from . import conv as _conv, core as _core, modules as _modules, pool as _pool
from .conv import (SparseConv1d, SparseConv2d, SparseConv3d, SparseConvTranspose1d,
                   SparseConvTranspose2d, SparseConvTranspose3d, SubMConv1d, SubMConv2d,
                   SubMConv3d, _known_sites, rulebook_for)
from .core import MAX_NDIM, IndiceEntry, SparseConvTensor, lift_shape, version_of
from .modules import (_SEQUENCE_FORWARD, MAX_NUM_VOXELS, SparseSequential, ToDense,
                      _fold_length, _plain)
from .pool import SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d

ENABLED = os.environ.get("SPCONV_C_SEQUENCE_CALL", "1") != "0"
# A sequence that starts with fewer sparse layers the walk could take than this runs layer by
# layer (_layer_count): there the walk and the call cost what they save. Measured
# (docs/pytorch.md, "Short sequences"): on a U-Net whose sequences hold one or two convs the
# one call was 1-3 points of the pass slower than the layers; on OpenPCDet's stages of one to
# three convs, no faster; on SECOND's 12 in one sequence, 3-5 points faster.
MIN_LAYERS = 3

# csrc/ops.cpp, run_sequence: the layout of a step (STEP_INTS integers, the last one "folds a
# batch norm").
STEP_INTS = 21
_CONV, _MAXPOOL, _TO_DENSE = 0, 1, 2
_FROM_INDICES, _ON_OUTPUTS, _ON_INPUTS, _REUSE = 0, 1, 2, 3

_CONVS = (SubMConv1d, SubMConv2d, SubMConv3d, SparseConv1d, SparseConv2d, SparseConv3d,
          SparseConvTranspose1d, SparseConvTranspose2d, SparseConvTranspose3d)
_POOLS = (SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d)
_FOLDABLE = (torch.nn.BatchNorm1d, torch.nn.ReLU)  # what a conv may fold (_fold_length)
# What a 1-d / 2-d layer's kernel, stride, padding, dilation and output padding get on the
# leading axes its sites are lifted with (conv.layer_sites).
_LIFT_FILL = (1, 1, 0, 1, 0)
_FLOATS = (torch.float32, torch.float64)
# Tensors the call may take: those of no subclass, whose ops a __torch_dispatch__ or
# __torch_function__ of their own would see layer by layer.
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_runner = None


def _the_runner():
    global _runner
    if _runner is None:
        _runner = torch.classes.spconv_c.SequenceRunner()
    return _runner


def _plain_tensor(t):
    return t is None or type(t) in _PLAIN_TENSORS


def _as_written(module, methods):
    """``module`` runs the methods its package defined: none replaced on its class (or a base,
    for logging, say) or on the instance, no hooks (_plain)."""
    cls = type(module)
    return (_plain(module) and cls.__call__ is _modules.MODULE_CALL
            and all(getattr(cls, name) is method and name not in module.__dict__
                    for name, method in methods))


def _ints(values):
    return [int(v) for v in values]


def _lifted(geometry):
    """A layer's kernel, stride, padding, dilation and output padding in the engine's 3-d space
    (a 1-d / 2-d layer's with the values of the axes its sites are lifted with)."""
    return tuple(lift_shape(_ints(values), fill) for values, fill in zip(geometry, _LIFT_FILL))


class _Walk:
    """The steps of one call, and what the indice_key cache would hold after each."""

    def __init__(self, input):
        self.input = input
        self.cache = input.indice_dict
        # A 1-d / 2-d sequence runs on its sites lifted to the engine's 3-d space, as each of
        # its layers would (conv.layer_sites): the rows kept with the nd indices.
        # (Rows it makes are kept with the input's indices only once the call runs: a walk that
        # takes nothing leaves the input as it was.)
        self.ndim = len(input.spatial_shape)
        if self.ndim < MAX_NDIM:
            lifted = input.shadow_copy()
            lifted.indices, lifted.spatial_shape, _ = input._lifted_rows(keep=False)
        else:
            lifted = input
        self.rows, self.shape = lifted.indices, lifted.spatial_shape
        features = input.features
        self.dtype = features.dtype
        self.channels = features.shape[1] if features.dim() == 2 else -1
        # The current sites: 0 the input's, s + 1 step s's output. On the input's sites, the
        # tensor a layer would get there (``view``): a reused cached subm key hands on its
        # entry's index tensor and shape list, as rulebook_for does; ``generation`` counts
        # such changes.
        self.sites = 0
        self.view = lifted
        self.generation = 0
        self.checked = None     # the index tensor a build from checked rows reads
        self.on_input = None    # the first step whose rulebook has the input's sites as input
        self.keys = {}          # key -> (step, kind, kernel, dilation, sites, generation)
        self.known = []         # cached rulebooks the steps name (ref -1 - position)
        self.ints, self.tensors, self.eps = [], [], []
        # per step: (kind, key or None, geometry, the entry a reuse takes its output sites
        # from: a cached IndiceEntry, or ("made", key) for an entry this call makes; None for
        # a rulebook the step builds)
        self.layers = []
        self.to_dense = False   # a last step makes the dense map (ToDense)

    def _known_ref(self, rulebook):
        for n, rb in enumerate(self.known):
            if rb is rulebook:
                return -1 - n
        self.known.append(rulebook)
        return -len(self.known)

    def _source(self, kind, key, geometry):
        """(source, ref, reused) of the layer's rulebook as rulebook_for would find or build
        it; None where the per-layer path should decide (and, as the case may be, refuse)."""
        kernel, _, _, dilation, _ = geometry
        if kind == ops.SUBM and key is not None:
            made = self.keys.get(key)
            if made is not None:
                step, made_kind, made_kernel, made_dilation, sites, generation = made
                if (made_kind != ops.SUBM or made_kernel != kernel or made_dilation != dilation
                        or sites != self.sites or generation != self.generation):
                    return None  # the layer raises its own error, or compares rows by value
                return _REUSE, step, ("made", key)
            if key in self.cache:
                if self.sites != 0:
                    return None  # a cached key on sites this call makes: compared by value
                try:
                    entry, rb, _, _ = rulebook_for(self.view, kind, *geometry, key, self.ndim,
                                                   False)
                except (KeyError, ValueError, TypeError, RuntimeError):
                    return None
                return _REUSE, self._known_ref(rb), entry
        if self.sites != 0:
            return _ON_OUTPUTS, self.sites - 1, None
        if self.on_input is not None:
            return _ON_INPUTS, self.on_input, None
        known = _known_sites(self.cache, self.view)
        if known is not None:
            return (_ON_OUTPUTS if known[1] else _ON_INPUTS), self._known_ref(known[0]), None
        self.checked = self.view.indices
        return _FROM_INDICES, 0, None

    def add(self, what, kind, key, geometry, tensors=(None,) * 6, eps=0.0, relu=False,
            fold=False):
        geometry = tuple(_ints(values) for values in geometry)
        if any(len(values) != MAX_NDIM for values in geometry):
            return False
        source = self._source(kind, key, geometry)
        if source is None:
            return False
        step = len(self.layers)
        self.ints += [what, kind, source[0], source[1]]
        for values in geometry:
            self.ints += values
        self.ints += [int(relu), int(fold)]
        self.tensors += tensors
        self.eps.append(float(eps))
        reused = source[2]
        self.layers.append((kind, key, geometry, reused))
        if reused is None:
            if self.sites == 0 and self.on_input is None:
                self.on_input = step
            if key is not None:
                self.keys[key] = (step, kind, geometry[0], geometry[3], self.sites,
                                  self.generation)
        elif isinstance(reused, IndiceEntry) and (reused.out_indices is not self.view.indices
                                                  or reused.out_spatial_shape
                                                  is not self.view.spatial_shape):
            view = self.view.shadow_copy()
            view.indices, view.spatial_shape = reused.out_indices, reused.out_spatial_shape
            self.view = view
            self.generation += 1
        if kind != ops.SUBM:
            self.sites = step + 1
        return True

    def conv(self, module, modules, i, may_fold):
        """The conv ``module`` = modules[i - 1], with what it folds; how many of modules[i:] it
        took (0, 1 or 2), or None where the walk stops."""
        if (type(module) not in _CONVS or module.ndim != self.ndim
                or not _as_written(module, _conv.AS_DEFINED) or module.conv1x1
                or module._fused_activation or MAX_NUM_VOXELS in module._buffers):
            return None
        # The weight and bias as _forward reads them (a parametrization computes them).
        params = module._parameters
        weight = params.get("weight")
        if weight is None:
            weight = module.weight
        bias = params["bias"] if "bias" in params else module.bias
        # _forward's check is of the features it gets: their channels are what the weight
        # before made (KRSC: C_out first), whatever that layer's attribute says.
        if (module.in_channels != self.channels or weight.dtype != self.dtype
                or weight.dim() != self.ndim + 2 or not _plain_tensor(weight)
                or (bias is not None and (bias.dtype != self.dtype or not _plain_tensor(bias)))):
            return None
        fold = _fold_length(module, modules, i, self.input) if may_fold else 0
        tensors = [weight, bias, None, None, None, None]
        eps = 0.0
        if fold:
            bn = modules[i]
            tensors[2:] = [bn._parameters.get("weight"), bn._parameters.get("bias"),
                           bn._buffers["running_mean"], bn._buffers["running_var"]]
            if not all(_plain_tensor(t) for t in tensors[2:]):
                return None
            eps = bn.eps
        geometry = _lifted((module.kernel_size, module.stride, module.padding, module.dilation,
                            module.output_padding))
        if not self.add(_CONV, module._kind(), module.indice_key, geometry, tensors, eps,
                        fold == 2, fold > 0):
            return None
        self.channels = weight.shape[0]
        return fold

    def pool(self, module):
        if (module.ndim != self.ndim or not _as_written(module, _pool.MAXPOOL_AS_DEFINED)
                or MAX_NUM_VOXELS in module._buffers):
            return False
        geometry = _lifted((module.kernel_size, module.stride, module.padding, module.dilation,
                            [0] * self.ndim))
        return self.add(_MAXPOOL, ops.REGULAR, module.indice_key, geometry)

    def dense(self, module):
        """A ToDense (SparseConvTensor.dense of the sites so far), as the call's last step."""
        if (not _as_written(module, _modules.TO_DENSE_AS_DEFINED)
                or SparseConvTensor.dense is not _core.DENSE_AS_DEFINED):
            return False
        self.ints += [_TO_DENSE] + [0] * (STEP_INTS - 1)
        self.tensors += [None] * 6
        self.eps.append(0.0)
        self.to_dense = True
        return True

    def _state(self):
        return (len(self.ints), len(self.tensors), len(self.eps), len(self.layers),
                len(self.known), dict(self.keys), self.sites, self.on_input, self.channels,
                self.view, self.generation, self.checked)

    def _restore(self, state):
        (ints, tensors, eps, layers, known, self.keys, self.sites, self.on_input, self.channels,
         self.view, self.generation, self.checked) = state
        del self.ints[ints:], self.tensors[tensors:], self.eps[eps:], self.layers[layers:]
        del self.known[known:]

    def sequence(self, modules, may_fold, whole=True):
        """Walk ``modules`` as SparseSequential._run would run them: how many of them the walk
        takes, each whole (a conv with what it folds, a nested sequence with all of its
        layers). ``whole``: all or none (a nested sequence's)."""
        count = len(modules)
        i = taken = 0
        while i < count:
            state = None if whole else self._state()
            module = modules[i]
            i += 1
            kind = type(module)
            if kind is SparseSequential:
                inner = list(module._modules.values())
                ok = (_plain(module) and SparseSequential.forward is _SEQUENCE_FORWARD
                      and kind.__call__ is _modules.MODULE_CALL
                      and self.sequence(inner, len(inner) > 1) == len(inner))
            elif kind in _POOLS:
                ok = self.pool(module)
            elif kind is ToDense:
                # Only in the outer sequence, where the walk may stop after it: what follows
                # takes a dense tensor, which the layers pass on as it is.
                if not whole and self.dense(module):
                    return i
                ok = False
            else:
                folded = self.conv(module, modules, i, may_fold)
                ok = folded is not None
                if ok:
                    i += folded
            if not ok:
                if state is not None:
                    self._restore(state)
                return taken
            taken = i
        return taken

    def run(self):
        """The call, then the cache entries the layers would have stored, and the output: the
        same entries, index tensors and shape lists as the layers make and hand on (a built
        entry's input shape is a copy, its output shape the list the next layer gets; a reused
        key hands on its entry's output sites). A 1-d / 2-d sequence's entries hold lifted
        sites, as its layers' do, and each strided layer's output gets its nd indices (a copy
        of the engine's rows without the leading axes), which the next strided layer's entry
        records as the sites its inverse conv gives back (conv.layer_sites)."""
        input, ndim = self.input, self.ndim
        if ndim < MAX_NDIM and input.__dict__.get("_lift", (None,) * 3)[2] is not self.rows:
            input._keep_lifted(self.rows)  # as the first layer would
        features, rulebooks, sites, shapes = _the_runner().run(
            input.features, self.rows if self.checked is None else self.checked,
            _ints(self.shape), input.batch_size, self.known, self.ints, self.tensors, self.eps)
        indices, shape, nd = self.rows, self.shape, input.indices
        columns = [0, *range(MAX_NDIM + 1 - ndim, MAX_NDIM + 1)]
        made, entries = 0, {}
        # The output's cache: a copy of the input's with the entries the layers store, as each
        # layer gives its output (conv.own_cache); the input's is left as it was.
        keyed = any(key is not None for _, key, _, _ in self.layers)
        cache = dict(self.cache) if keyed else self.cache
        for (kind, key, geometry, reused), rb in zip(self.layers, rulebooks):
            out_nd = nd
            if reused is not None:
                entry = entries[reused[1]] if isinstance(reused, tuple) else reused
                out_indices, out_shape = entry.out_indices, entry.out_spatial_shape
            elif kind == ops.SUBM:
                out_indices, out_shape = indices, list(shape)
            else:
                out_indices, out_shape = sites[made], shapes[3 * made:3 * made + 3]
                made += 1
                if ndim < MAX_NDIM:
                    out_nd = out_indices[:, columns]
            if reused is None and key is not None:
                kernel, stride, padding, dilation, _ = geometry
                entry = IndiceEntry(rb, kind, indices, list(shape), out_indices, out_shape,
                                    list(kernel), list(stride), list(padding), list(dilation),
                                    input.batch_size, ndim)
                if ndim < MAX_NDIM and kind != ops.SUBM:
                    entry.nd_indices, entry.nd_version = nd, version_of(nd)
                cache[key] = entries[key] = entry
            indices, shape, nd = out_indices, out_shape, out_nd
        if self.to_dense:  # [B, C, 1, (1,) *nd shape] -> [B, C, *nd shape], as .dense() does
            return features if ndim == MAX_NDIM else features.reshape(
                features.shape[0], features.shape[1], *shape[MAX_NDIM - ndim:])
        if ndim == MAX_NDIM:
            out = input._derive(features, indices, shape)
        else:
            out = input._derive(features, nd, shape[MAX_NDIM - ndim:], indices)
        out.indice_dict = cache
        return out


def _layer_count(modules, cap):
    """(count, stopped): how many sparse layers (convs and max pools, nested sequences' too)
    the walk could take from the start of ``modules``, counted up to ``cap``, and whether a
    module it never takes stopped the count (an inverse or 1x1 conv, another pool, a subclass,
    a module on features other than a batch norm or ReLU it may fold, a ToDense, which ends a
    call). Whether the walk takes the layers counted (their ndim, dtypes, hooks, ...) it does
    not ask."""
    count = 0
    for module in modules:
        kind = type(module)
        if kind is SparseSequential:
            inner, stopped = _layer_count(module._modules.values(), cap - count)
            count += inner
            if stopped:
                return count, True
        elif (kind in _CONVS and not module.conv1x1) or kind in _POOLS:
            count += 1
        elif kind not in _FOLDABLE:
            return count, True
        if count >= cap:
            break
    return count, False


def run(input, modules):
    """The first modules of ``modules`` (a SparseSequential's, in a call that may fold:
    modules._fold_environment) that the walk takes, run on ``input`` in one call: (output, how
    many modules it ran); (None, 0) where the per-layer path must run them all."""
    if type(input) is not SparseConvTensor or not 1 <= len(input.spatial_shape) <= MAX_NDIM:
        return None, 0
    features, indices = input.features, input.indices
    if (type(features) not in _PLAIN_TENSORS or type(indices) not in _PLAIN_TENSORS
            or features.dtype not in _FLOATS or not features.is_cpu):
        return None, 0
    if _layer_count(modules, MIN_LAYERS)[0] < MIN_LAYERS:
        return None, 0
    try:
        walk = _Walk(input)
        taken = walk.sequence(modules, len(modules) > 1, whole=False)
        if not walk.layers:
            return None, 0
        return walk.run(), taken
    except Exception:  # the layers, one by one, raise it with their own message
        return None, 0
