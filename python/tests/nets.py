"""One network written once against spconv 2.x's API; built with spconv itself or with
spconv_c.pytorch (the drop-in test changes only the module namespace)."""

import torch
from torch import nn


def make_net(spconv, cin=4, ndim=3):
    """The network of ``ndim``-d layers (spconv's SubMConv{ndim}d, ...), the same for 1, 2, 3."""
    def layer(kind):
        return getattr(spconv, f"{kind}{ndim}d")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = spconv.SparseSequential(
                layer("SubMConv")(cin, 16, 3, padding=1, bias=False, indice_key="subm1"),
                nn.BatchNorm1d(16), nn.ReLU())
            self.down = spconv.SparseSequential(
                layer("SparseConv")(16, 32, 3, 2, 1, bias=False, indice_key="down1"), nn.ReLU())
            self.mid = layer("SubMConv")(32, 32, 3, indice_key="subm2")
            self.pw = layer("SubMConv")(32, 32, 1, indice_key="pw")
            self.up = layer("SparseInverseConv")(32, 16, 3, indice_key="down1")
            self.pool = layer("SparseMaxPool")(2, 2)
            self.head = spconv.SparseSequential(
                layer("SparseConvTranspose")(32, 8, 2, 2, bias=True), spconv.ToDense())

        def forward(self, x):
            a = self.stem(x)
            b = self.down(a)
            c = self.pw(self.mid(b))
            u = self.up(c)
            skip = u.replace_feature(u.features + a.features)  # inverse: the conv's input order
            pooled = self.pool(b)
            return skip.features, self.head(pooled)

    return Net()


def kitti_voxels(path, voxel=0.4):
    """A KITTI scan in a 40 m x 40 m x 4 m box as (features [N, 4] f32, indices [N, 4], shape)."""
    import numpy as np  # imported here: the GPU check runs make_net where NumPy may be missing

    pts = np.fromfile(path, dtype=np.float32).reshape(-1, 4)
    import spconv_c.pytorch as ours
    gen = ours.PointToVoxel([voxel] * 3, [0, -20, -3, 40, 20, 1], 4, 40000, 5)
    voxels, coords, num = gen(torch.from_numpy(pts))
    feats = voxels.sum(1) / num.view(-1, 1).float()
    indices = torch.cat([torch.zeros(coords.shape[0], 1, dtype=torch.int32), coords], 1)
    shape = list(gen.grid_size)  # (z, y, x), as spconv's
    return feats, indices, shape


def flattened(feats, indices, shape, ndim):
    """The voxels seen from above (2-d: the sites (b, y, x), bird's-eye view, as pillar networks
    see a scan) or along x alone (1-d: (b, x)): the voxels of one column as one site, their
    features summed."""
    keep = [0, *range(4 - ndim, 4)]
    sites, which = torch.unique(indices[:, keep], dim=0, return_inverse=True)
    summed = torch.zeros(sites.shape[0], feats.shape[1], dtype=feats.dtype)
    summed.index_add_(0, which, feats)
    return summed, sites.int(), shape[3 - ndim:]
