"""spconv 2.x's ``spconv.pytorch.functional`` helpers that work on whole sparse tensors."""

import torch

from .core import SparseConvTensor


def _check_alike(tensors, what):
    if not tensors:
        raise ValueError(f"spconv_c: {what} takes at least one SparseConvTensor")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, SparseConvTensor):
            raise TypeError(f"spconv_c: {what}: operand {i} is a {type(t).__name__}, not a "
                            f"SparseConvTensor")
        if (list(t.spatial_shape) != list(first.spatial_shape)
                or t.batch_size != first.batch_size
                or t.features.shape[1:] != first.features.shape[1:]):
            raise ValueError(f"spconv_c: {what}: operand {i} (spatial shape "
                             f"{list(t.spatial_shape)}, batch size {t.batch_size}, features "
                             f"{list(t.features.shape)}) does not match operand 0 (spatial shape "
                             f"{list(first.spatial_shape)}, batch size {first.batch_size}, "
                             f"features {list(first.features.shape)})")
        if t.features.dtype != first.features.dtype:
            raise ValueError(f"spconv_c: {what}: operand {i} has {t.features.dtype} features, "
                             f"operand 0 {first.features.dtype}")
        ndim = len(first.spatial_shape)
        idx = t.indices
        if idx.dtype != torch.int32 or idx.dim() != 2 or idx.shape[1] != ndim + 1:
            raise ValueError(f"spconv_c: {what}: operand {i}'s indices must be int32 "
                             f"[N, {ndim + 1}], got {idx.dtype} {list(idx.shape)}")
        if t.features.dim() != 2 or t.features.shape[0] != idx.shape[0]:
            raise ValueError(f"spconv_c: {what}: operand {i} has features "
                             f"{list(t.features.shape)} for {idx.shape[0]} sites")
        limits = torch.tensor([first.batch_size, *first.spatial_shape], device=idx.device)
        outside = ((idx < 0) | (idx >= limits)).any(1)
        if outside.any():
            row = int(outside.nonzero()[0, 0])
            raise ValueError(f"spconv_c: {what}: operand {i}'s indices row {row} = "
                             f"{tuple(idx[row].tolist())} is outside batch size "
                             f"{first.batch_size} and spatial shape {list(first.spatial_shape)}")


def sparse_add(*tensors):
    """The sum of sparse tensors of one shape whose sites may differ: a site of several operands
    gets the sum of their features. The sites are the union, sorted by (b, z, y, x) as spconv's
    sparse_add (sort + unique) sorts them. Each operand is added by one index_add without
    repeated rows, in the operands' order, so the sums are the same bits on every device and run.
    The result keeps the indice_key cache of the largest operand when the union is its sites row
    for row (the rulebooks cached there then fit); otherwise it starts a new one. (spconv keeps
    it whenever the union has as many sites, even in another order: its subm layers would then
    reuse pairs of the old order; ours would refuse the key, so it is not kept.)"""
    _check_alike(tensors, "sparse_add")
    first = tensors[0]
    everything = torch.cat([t.indices for t in tensors])
    sites, where = torch.unique(everything, dim=0, return_inverse=True)
    feats = first.features.new_zeros((sites.shape[0], first.features.shape[1]))
    begin = 0
    for t in tensors:
        end = begin + t.indices.shape[0]
        feats = feats.index_add(0, where[begin:end], t.features)
        begin = end
    largest = max(tensors, key=lambda t: t.indices.shape[0])
    out = SparseConvTensor(feats, sites.to(first.indices.dtype).contiguous(), first.spatial_shape,
                           first.batch_size)
    if sites.shape[0] == largest.indices.shape[0] and torch.equal(out.indices, largest.indices):
        out.indice_dict = largest.indice_dict
    return out
