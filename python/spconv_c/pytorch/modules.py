"""SparseModule, SparseSequential and the feature-wise helpers, as in spconv 2.x."""

import os
from collections import OrderedDict

import torch
from torch import nn
from torch.nn.modules import module as module_impl

from .. import ops
from .core import SparseConvTensor


class SparseModule(nn.Module):
    """Base of every module that takes a SparseConvTensor (not only its features).

    SparseSequential hands the whole SparseConvTensor to instances of it, so user blocks
    (OpenPCDet's SparseBasicBlock) subclass it.
    """

    def __init__(self, name=None):
        super().__init__()
        self.name = name
        self._sparse_unique_name = name or ""


def is_spconv_module(module):
    """A module that a SparseSequential hands the SparseConvTensor (spconv's test: its sparse
    modules and its SparseBatchNorm / SparseReLU, which take one)."""
    return isinstance(module, (SparseModule, SparseBatchNorm, SparseReLU))


def is_sparse_conv(module):
    """Whether ``module`` is a sparse conv (spconv's helper of that name)."""
    from .conv import SparseConvolution  # (conv.py imports this module)
    return isinstance(module, SparseConvolution)


# spconv's record of the most output sites a strided layer has made (record_voxel_count=True;
# its TensorRT export reads it): a buffer, so that a spconv state_dict that holds it loads and
# saves unchanged.
MAX_NUM_VOXELS = "max_num_voxels_during_training"


class VoxelCount:
    """What spconv's strided convs and pools with record_voxel_count keep: the buffer above,
    raised to each call's output site count (as spconv does, in training and inference alike),
    ``get_max_num_voxels()``, and a state_dict without it loading as zeros."""

    def _add_voxel_count(self, device=None):
        self.register_buffer(MAX_NUM_VOXELS, torch.zeros(1, dtype=torch.int32, device=device))
        self._register_load_state_dict_pre_hook(_zero_voxel_count)

    def get_max_num_voxels(self):
        return self._buffers.get(MAX_NUM_VOXELS)

    def _count_voxels(self, sites):
        count = self._buffers.get(MAX_NUM_VOXELS)
        if count is not None:
            with torch.no_grad():
                count.clamp_(min=sites)


def _zero_voxel_count(state_dict, prefix, *args):
    state_dict.setdefault(prefix + MAX_NUM_VOXELS, torch.zeros(1, dtype=torch.int32))


def assign_name_for_sparse_modules(module):
    """Name every SparseModule inside ``module`` by its path in it (spconv's per-layer timer
    names; kept here for code that calls it)."""
    for name, m in module.named_modules():
        if isinstance(m, SparseModule):
            m._sparse_unique_name = name


class Identity(nn.Module):
    """spconv's Identity: returns its input as it is (a SparseConvTensor included)."""

    def forward(self, input):
        return input

    def input_spatial_size(self, out_size):
        return out_size


class SparseSequential(SparseModule):
    """nn.Sequential for sparse tensors: SparseModules get the SparseConvTensor; any other module
    (nn.BatchNorm1d, nn.ReLU, ...) is applied to its features."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)
        for name, module in kwargs.items():
            if name in self._modules:
                raise ValueError(f"SparseSequential: name {name!r} already exists")
            self.add_module(name, module)

    def __getitem__(self, idx):
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range")
        if idx < 0:
            idx += len(self)
        return list(self._modules.values())[idx]

    def __len__(self):
        return len(self._modules)

    def add(self, module, name=None):
        if name is None:
            name = str(len(self._modules))
            if name in self._modules:
                raise KeyError("name exists")
        self.add_module(name, module)

    def forward(self, input):
        modules = list(self._modules.values())
        # Whether this call may fold a batch norm into the conv before it (_fold_length): the
        # call's environment, asked once.
        return self._run_all(input, modules, len(modules) > 1 and _fold_environment())

    def _run_all(self, input, modules, may_fold):
        """_run, after running in one call into C++ as many of the first modules as that can
        run (sequence.py) where the call may fold (an inference)."""
        taken = 0
        if may_fold and _sequence.ENABLED:
            output, taken = _sequence.run(input, modules)
            if taken:
                input = output
        return self._run(input, modules[taken:], may_fold) if taken < len(modules) else input

    def _run(self, input, modules, may_fold):
        count = len(modules)
        previous = None
        i = 0
        while i < count:
            module = modules[i]
            i += 1
            if is_spconv_module(module):
                if (may_fold and type(module) is SparseSequential and _plain(module)
                        and SparseSequential.forward is _SEQUENCE_FORWARD
                        and not _global_hooks()):
                    # A nested sequence (a detector's block) in a call that may fold: run it
                    # here with this call's environment. Module.__call__ would add nothing (no
                    # hooks on it or global ones, the class's forward as written), and asking
                    # the environment again cost ~20 us a block after a conv had left the caches
                    # cold (docs/pytorch.md, "The overhead on an AVX-512 Xeon").
                    inner = list(module._modules.values())
                    input = module._run_all(input, inner, len(inner) > 1)
                    previous = module
                    continue
                fold = _fold_length(module, modules, i, input) if may_fold else 0
                if fold:
                    # conv -> batch norm [-> ReLU] in one op (see _fold_length)
                    input = module._forward(input, bn=modules[i], relu=fold == 2)
                    i += fold
                    previous = modules[i - 1]
                    continue
                input = module(input)
            elif isinstance(input, SparseConvTensor):
                if _has_sites(input, module):
                    if _relu_in_place(previous, module):
                        input = input.replace_feature(torch.relu_(input.features))
                    else:
                        input = input.replace_feature(module(input.features))
            else:
                input = module(input)
            previous = module
        return input


# A replacement of SparseSequential.forward on the class turns _run's shortcut off.
_SEQUENCE_FORWARD = SparseSequential.forward


def _batch_norm_rows_message():
    return ("spconv_c: under torch.compile, a batch norm in a SparseSequential needs more than 1 "
            "site in training mode (as F.batch_norm), and at least 1 after a layer whose output "
            "count the graph computes (eager code skips it on none)")


def _has_sites(input, module):
    """Whether ``input`` has sites: a layer on features (``module``) is applied only then, as
    in spconv.

    Under torch.compile with a strided layer's rulebook built inside the graph
    (conv._build_traced), its output count is an unbacked size, which tracing cannot branch on.
    A count it cannot decide is taken as non-zero (guard_or_true): element-wise layers applied
    to no rows give what skipping them gives. A batch norm branches on the count itself
    (F.batch_norm refuses 1 row for batch statistics, and its kernel treats 0 rows apart):
    torch._check asserts at least 2 sites where it takes batch statistics (training mode, or no
    running statistics kept) and 1 otherwise, which tracing then knows.
    A count of 1 in training is refused as eager code refuses it; a strided layer with no
    output sites before a batch norm fails the assertion where eager code would skip the
    batch norm (docs/pytorch.md, "Rulebook builds inside the graph")."""
    rows = input.indices.shape[0]
    if not torch.compiler.is_compiling():
        return rows != 0
    if not _guard_or_true(rows != 0):
        return False  # a known count of 0
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        # Batch statistics (training, or no running ones kept) need 2 rows, as F.batch_norm.
        batch_stats = module.training or (module.running_mean is None
                                          and module.running_var is None)
        torch._check(rows > 1 if batch_stats else rows > 0, _batch_norm_rows_message)
    return True


try:
    from torch.fx.experimental.symbolic_shapes import guard_or_true as _guard_or_true
except ImportError:  # a PyTorch before guard_or_true (2025), which cannot trace such counts
    def _guard_or_true(condition):
        return bool(condition)


# Folding an inference batch norm into the conv before it (SPCONV_C_FOLD_BN=0 turns it off).
FOLD_BN = os.environ.get("SPCONV_C_FOLD_BN", "1") != "0"
_fold_agrees = {}  # dtype -> whether the folded op gives torch's bits on this build (_probe_fold)


def _global_hooks():
    return (module_impl._global_forward_hooks or module_impl._global_forward_pre_hooks
            or module_impl._global_backward_hooks
            or getattr(module_impl, "_global_backward_pre_hooks", None))


def _fold_environment():
    """The part of _fold_length's conditions that belongs to the call, not to the modules:
    folding is on, the call is an inference (no gradient recorded, nothing compiled), nothing
    traces it, no dispatch or torch-function mode watches the ops, and no global module hook
    would miss the batch norm's call."""
    return (FOLD_BN and ops._inference() and not torch._C._is_tracing() and not _modes_active()
            and not _global_hooks())


_FOLD_DTYPES = (torch.float32, torch.float64)


def _fold_length(conv, modules, i, input):
    """How many of ``modules[i:]`` the conv ``conv`` can take into its own op: 2 for an
    ``nn.BatchNorm1d`` in eval mode followed by an ``nn.ReLU``, 1 for the batch norm alone, else
    0. The caller has checked _fold_environment (an inference, nothing tracing, compiling or
    watching). Here: the torch classes themselves (not subclasses) called as they are (no hooks,
    no instance forward, not compiled on their own), a batch norm of the conv's channels, CPU
    float32 / float64 features with batch-norm tensors of their dtype on the CPU, and only where
    _probe_fold found the folded op bitwise equal to PyTorch's own batch norm and ReLU. The
    result is then PyTorch's, with one op instead of three and no pass of its own over the output
    for the batch norm or the ReLU.

    It runs once per conv of every inference forward, so it reads what it needs straight from the
    modules' dicts (nn.Module.__getattr__ costs ~1 us a name) and asks the cheapest questions
    first."""
    if i >= len(modules):
        return 0
    bn = modules[i]
    if type(bn) is not nn.BatchNorm1d or bn.training or not isinstance(input, SparseConvTensor):
        return 0
    foldable = getattr(conv, "_foldable", None)
    if foldable is None or not foldable() or not _plain(conv) or not _plain(bn):
        return 0
    buffers, params = bn._buffers, bn._parameters
    mean, var = buffers.get("running_mean"), buffers.get("running_var")
    if mean is None or var is None or mean.numel() != conv.out_channels:
        return 0
    feats = input.features
    dtype = feats.dtype
    if dtype not in _FOLD_DTYPES or not feats.is_cpu:
        return 0
    weight, bias = params.get("weight"), params.get("bias")
    for t in (mean, var, weight, bias):
        if t is not None and (t.dtype != dtype or not t.is_cpu):
            return 0
    agrees = _fold_agrees.get(dtype)
    if agrees is None:
        agrees = _fold_agrees[dtype] = _probe_fold(dtype)
    if not agrees:
        return 0
    relu = i + 1 < len(modules) and type(modules[i + 1]) is nn.ReLU and _plain(modules[i + 1])
    return 2 if relu else 1


def _plain(module):
    """No hooks, no forward replaced on the instance, not compiled on its own
    (``module.compile()``): calling the module is its class's forward and nothing else."""
    return (_no_hooks(module) and "forward" not in module.__dict__
            and getattr(module, "_compiled_call_impl", None) is None)


def _modes_active():
    """A dispatch or torch-function mode (FakeTensorMode, a FLOP counter, a profiler's mode) is
    watching the ops: let it see PyTorch's own batch norm, not the folded op."""
    dispatch = getattr(torch._C, "_len_torch_dispatch_stack", None)
    function = getattr(torch._C, "_is_torch_function_mode_enabled", None)
    return bool((dispatch is not None and dispatch() > 0)
                or (function is not None and function()))


def _same_bits(a, b):
    """Equal elements bit for bit, NaN meeting any NaN (x86 returns one NaN operand or the other
    depending on the instruction's operand order, which compilers choose)."""
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    view = torch.int32 if a.dtype == torch.float32 else torch.int64
    return torch.equal(a.masked_fill(nan, 0).view(view), b.masked_fill(nan, 0).view(view))


def _probe_fold(dtype):
    """Whether the folded op (ops.indice_conv_bn) gives bitwise what the conv followed by
    PyTorch's batch norm and ReLU gives, on this PyTorch build and machine: the extension computes
    batch norm as PyTorch's CPU kernel does (csrc/ops.cpp, conv_forward_bn), but whether that
    kernel's multiply-add is fused depends on how PyTorch was compiled. Random convs, batch
    norms (with and without affine parameters, near-zero and large variances, negative scales)
    and channel counts across vector widths, with and without the ReLU, in a private generator."""
    try:
        return _probe_fold_on_cpu(dtype)
    except Exception:  # whatever the caller's state breaks here, the answer is "do not fold"
        return False


def _probe_fold_on_cpu(dtype):
    cpu = torch.device("cpu")
    gen = torch.Generator(device=cpu).manual_seed(20261202)
    shape = [7, 8, 9]
    cells = torch.randperm(shape[0] * shape[1] * shape[2], generator=gen, device=cpu)[:150]
    idx = torch.stack([torch.zeros_like(cells), cells // (shape[1] * shape[2]),
                       cells // shape[2] % shape[1], cells % shape[2]], 1).int()
    rb = ops.build_rulebook(idx, shape, 1, ops.SUBM, 3)
    with torch.no_grad():
        for c_in, c_out in ((3, 1), (4, 3), (5, 8), (16, 13), (8, 16), (7, 33), (32, 64)):
            x = torch.randn(idx.shape[0], c_in, generator=gen, dtype=dtype, device=cpu) * 3
            w = torch.randn(27, c_in, c_out, generator=gen, dtype=dtype, device=cpu) / c_in
            b = torch.randn(c_out, generator=gen, dtype=dtype, device=cpu)
            for affine in (True, False):
                bn = nn.BatchNorm1d(c_out, eps=1e-3, affine=affine, dtype=dtype,
                                    device=cpu).eval()
                bn.running_mean.copy_(torch.randn(c_out, generator=gen, dtype=dtype, device=cpu))
                var = torch.rand(c_out, generator=gen, dtype=dtype, device=cpu) * 4
                var[::3] = 1e-6
                bn.running_var.copy_(var)
                if affine:
                    bn.weight.copy_(torch.randn(c_out, generator=gen, dtype=dtype, device=cpu))
                    bn.bias.copy_(torch.randn(c_out, generator=gen, dtype=dtype, device=cpu))
                plain = bn(ops.indice_conv(rb, x, w, b))
                for relu in (False, True):
                    want = torch.relu(plain) if relu else plain
                    if not _same_bits(ops.indice_conv_bn(rb, x, w, b, bn, relu), want):
                        return False
    return True


def _no_hooks(module):
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or
                getattr(module, "_backward_pre_hooks", None))


def _relu_in_place(previous, module):
    """True for a plain nn.ReLU right after a batch norm of this sequence (the torch classes
    themselves, not subclasses, whose forward might return its input), neither with hooks: the
    ReLU can then overwrite the batch norm's output, which nothing else holds (batch norm's
    backward keeps its input and statistics, not its output), instead of writing a fresh tensor.
    The values are the same (the same op); what it saves is a tensor the size of the features,
    whose fresh pages cost more than the ReLU itself when the allocator returns large blocks to
    the system (glibc's default). Global module hooks turn it off too, and so does a forward
    set on the ReLU instance (which is then called)."""
    return (type(module) is nn.ReLU and type(previous) in (nn.BatchNorm1d, nn.SyncBatchNorm)
            and _plain(module) and _no_hooks(previous)
            and not _global_hooks())


class ToDense(SparseModule):
    """SparseConvTensor -> dense [B, C, *spatial] ([B, C, D, H, W] for 3-d)."""

    def forward(self, x):
        return x.dense()


# As this module defines them (see conv.AS_DEFINED), and nn.Module's call.
TO_DENSE_AS_DEFINED = (("forward", ToDense.forward),)
MODULE_CALL = nn.Module.__call__


class RemoveGrid(SparseModule):
    def forward(self, x):
        x.grid = None
        return x


class _FeatureWise:
    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


class SparseBatchNorm(_FeatureWise, nn.BatchNorm1d):
    pass


class SparseSyncBatchNorm(_FeatureWise, nn.SyncBatchNorm):
    pass


class SparseReLU(_FeatureWise, nn.ReLU):
    pass


class SparseIdentity(_FeatureWise, nn.Identity):
    pass


class _Sequence:
    """sequence.py, imported on first use (it imports the layer classes, whose modules import
    this one)."""

    def __getattr__(self, name):
        from . import sequence
        globals()["_sequence"] = sequence
        return getattr(sequence, name)


_sequence = _Sequence()
