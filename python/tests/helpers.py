"""Random sparse geometries and the dense PyTorch oracle they are checked against."""

import torch


def random_sites(gen, batch_size, shape, count):
    """``count`` distinct int32 rows (b, z, y, x) inside ``shape`` (at most all sites)."""
    d, h, w = shape
    total = batch_size * d * h * w
    flat = torch.randperm(total, generator=gen)[:min(count, total)]
    b = flat // (d * h * w)
    r = flat % (d * h * w)
    return torch.stack([b, r // (h * w), (r // w) % h, r % w], 1).int()


def random_sparse(gen, batch_size, shape, count, channels, dtype=torch.float64):
    indices = random_sites(gen, batch_size, shape, count)
    features = torch.randn(indices.shape[0], channels, generator=gen, dtype=dtype)
    return features, indices


def scatter_dense(features, indices, shape, batch_size, fill=0.0):
    """Differentiable dense [B, C, D, H, W] with ``fill`` at empty sites."""
    c = features.shape[1]
    dense = torch.full((batch_size, *shape, c), fill, dtype=features.dtype)
    i = indices.long()
    dense = dense.index_put((i[:, 0], i[:, 1], i[:, 2], i[:, 3]), features)
    return dense.permute(0, 4, 1, 2, 3)


def gather_dense(dense, indices):
    """Rows [N, C] of dense [B, C, D, H, W] at ``indices``."""
    i = indices.long()
    return dense.permute(0, 2, 3, 4, 1)[i[:, 0], i[:, 1], i[:, 2], i[:, 3]]


def check_grads(out_sparse, out_dense_at_sites, params, gen, **tolerance):
    """The same random projection of both outputs as a loss; the gradients with respect to
    ``params`` (pairs: ours, the oracle's) must agree within ``tolerance``."""
    proj = torch.randn(out_sparse.shape, generator=gen, dtype=out_sparse.dtype)
    ours = torch.autograd.grad((out_sparse * proj).sum(), [p for p, _ in params])
    theirs = torch.autograd.grad((out_dense_at_sites * proj).sum(), [q for _, q in params])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **tolerance)


def krsc_as_read(layer, weight):
    """The KRSC weight whose plain reading is what ``layer`` computes with ``weight``: a 1x1
    layer with legacy_1x1 (spconv's reading, the default) takes its weight as a [C_in, C_out]
    reshape, which KRSC writes transposed; any other layer reads KRSC as it is. Differentiable,
    so an oracle's weight gradient flows back to ``weight``."""
    if not (layer.conv1x1 and layer.legacy_1x1):
        return weight
    return weight.reshape(layer.in_channels, layer.out_channels).t().reshape(weight.shape)


def krsc_to_oidhw(weight):
    return weight.permute(0, 4, 1, 2, 3)


def krsc_to_iodhw(weight):
    return weight.permute(4, 0, 1, 2, 3)


class _Recorder:
    """A mode that writes down the name of every op it sees, and runs the op."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def _record(self, func, args, kwargs):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def recording_modes():
    """A torch dispatch mode and a torch function mode that record the ops they see (``.ops``)."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class SeenByDispatch(_Recorder, TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return self._record(func, args, kwargs)

    class SeenByFunction(_Recorder, TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return self._record(func, args, kwargs)

    return SeenByDispatch(), SeenByFunction()
