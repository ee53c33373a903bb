"""SparseModule, SparseSequential and the feature-wise helpers, as in spconv 2.x."""

from collections import OrderedDict

import torch
from torch import nn

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
        for module in self._modules.values():
            if is_spconv_module(module):
                input = module(input)
            elif isinstance(input, SparseConvTensor):
                if input.indices.shape[0] != 0:
                    input = input.replace_feature(module(input.features))
            else:
                input = module(input)
        return input


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
