"""SparseModule, SparseSequential and the feature-wise helpers, as in spconv 2.x."""

from collections import OrderedDict

import torch
from torch import nn
from torch.nn.modules import module as module_impl

from .core import SparseConvTensor


class SparseModule(nn.Module):
    """Base of every module that takes a SparseConvTensor (not only its features).

    SparseSequential hands the whole SparseConvTensor to instances of it, so user blocks
    (OpenPCDet's SparseBasicBlock) subclass it.
    """

    def __init__(self, name=None):
        super().__init__()
        self._sparse_unique_name = name or ""


def is_spconv_module(module):
    return isinstance(module, SparseModule)


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
        previous = None
        for module in self._modules.values():
            if is_spconv_module(module):
                input = module(input)
            elif isinstance(input, SparseConvTensor):
                if input.indices.shape[0] != 0:
                    if _relu_in_place(previous, module):
                        input = input.replace_feature(torch.relu_(input.features))
                    else:
                        input = input.replace_feature(module(input.features))
            else:
                input = module(input)
            previous = module
        return input


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
    the system (glibc's default). Global module hooks turn it off too."""
    return (type(module) is nn.ReLU and type(previous) in (nn.BatchNorm1d, nn.SyncBatchNorm)
            and _no_hooks(module) and _no_hooks(previous)
            and not module_impl._global_forward_hooks
            and not module_impl._global_forward_pre_hooks
            and not module_impl._global_backward_hooks
            and not getattr(module_impl, "_global_backward_pre_hooks", None))


class ToDense(SparseModule):
    """SparseConvTensor -> dense [B, C, D, H, W]."""

    def forward(self, x):
        return x.dense()


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
