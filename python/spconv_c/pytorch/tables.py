"""spconv 2.x's tables: modules that join, add or fan out sparse tensors."""

import torch

from .functional import _check_alike, sparse_add
from .modules import SparseModule


def _same_sites(tensors, what):
    _check_alike(tensors, what)
    n = tensors[0].indices.shape[0]
    for i, t in enumerate(tensors):
        if t.indices.shape[0] != n:
            raise ValueError(f"spconv_c: {what}: operand {i} has {t.indices.shape[0]} sites, "
                             f"operand 0 has {n}; tensors on different sites need "
                             f"AddTableMisaligned (sparse_add)")


class JoinTable(SparseModule):
    """Concatenates the features of tensors on the same sites (channels after channels); the
    result has the first tensor's sites and cache. The sites are assumed row for row the same,
    as in spconv (only their counts are checked)."""

    def forward(self, input):
        _same_sites(list(input), "JoinTable")
        return input[0].replace_feature(torch.cat([t.features for t in input], 1))

    def input_spatial_size(self, out_size):
        return out_size


class AddTable(SparseModule):
    """Adds the features of tensors on the same sites (row for row, as in spconv)."""

    def forward(self, input):
        _same_sites(list(input), "AddTable")
        total = input[0].features
        for t in input[1:]:
            total = total + t.features
        return input[0].replace_feature(total)

    def input_spatial_size(self, out_size):
        return out_size


class AddTableMisaligned(SparseModule):
    """Adds tensors of one shape whose sites may differ (functional.sparse_add)."""

    def forward(self, input):
        return sparse_add(*input)

    def input_spatial_size(self, out_size):
        return out_size


class ConcatTable(SparseModule):
    """Runs each of its modules on the same input and returns their outputs as a list."""

    def forward(self, input):
        return [module(input) for module in self._modules.values()]

    def add(self, module):
        self._modules[str(len(self._modules))] = module
        return self

    def input_spatial_size(self, out_size):
        return self._modules["0"].input_spatial_size(out_size)
