"""PointToVoxel in the spirit of spconv's: points [P, F] (x, y, z first) to voxels on the CPU."""

import math

import torch

from .. import ops


class PointToVoxel:
    """spconv.pytorch.utils.PointToVoxel's interface over the engine's voxelizer.

    ``__call__`` returns (voxels [M, max_points, F], indices int32 [M, 3] (z, y, x),
    num_points int32 [M]); ``generate_voxel_with_id`` adds each point's voxel row (-1: dropped).
    The attributes are spconv's, in its order (z, y, x; each value a float32's):
    ``vsize`` [3], ``coors_range`` [6] (min zyx, max zyx), ``grid_size`` [3] (a sparse tensor's
    spatial shape), ``grid_stride`` [3] (a cell's row-major step along each axis) and ``ndim``
    (3: the engine voxelizes in 3-d only, where spconv also takes 1, 2 or 4 axes).
    Unlike spconv's, each call returns tensors of its own (spconv's are views of buffers the
    next call overwrites), and ``empty_mean`` fills a voxel's unused slots with the mean of its
    points (spconv 2.3.8's CPU path adds the previous voxel's mean in; its CUDA path does not).
    """

    def __init__(self, vsize_xyz, coors_range_xyz, num_point_features, max_num_voxels,
                 max_num_points_per_voxel, device=torch.device("cpu:0")):
        if torch.device(device).type != "cpu":
            raise NotImplementedError("spconv_c: PointToVoxel runs on the CPU (the engine's "
                                      "voxelizer is CPU only); move the points to the CPU")
        vsize = [float(v) for v in vsize_xyz]
        coors_range = [float(v) for v in coors_range_xyz]
        self.num_point_features = num_point_features
        self.max_num_voxels = max_num_voxels
        self.max_num_points_per_voxel = max_num_points_per_voxel
        self.device = torch.device(device)
        if len(vsize) != 3 or len(coors_range) != 6:
            raise ValueError(f"spconv_c: PointToVoxel needs 3 voxel sizes (x, y, z) and 6 range "
                             f"values (min xyz, max xyz), got {vsize} and {coors_range}")
        for i, axis in enumerate("xyz"):
            size, lo, hi = vsize[i], coors_range[i], coors_range[i + 3]
            if not (math.isfinite(size) and size > 0):
                raise ValueError(f"spconv_c: PointToVoxel: voxel size {axis} = {size} (must be "
                                 f"finite and > 0)")
            if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
                raise ValueError(f"spconv_c: PointToVoxel: range {axis} = [{lo}, {hi}] (must "
                                 f"be finite, max > min)")
        self._vsize_xyz, self._range_xyz = vsize, coors_range
        # The grid as the engine makes it (float32 arithmetic, halves rounded away from zero, as
        # spconv's), asked of the engine on no points: its checks (a grid too large for its
        # keys, one of no cells) then fail here, as spconv's fail at construction.
        grid_xyz = ops.voxelize(torch.empty(0, max(3, int(num_point_features))), vsize,
                                coors_range, max_num_points_per_voxel,
                                max_num_voxels)[5].tolist()
        as_f32 = torch.tensor(vsize + coors_range, dtype=torch.float32).tolist()
        self.ndim = 3
        self.vsize = as_f32[2::-1]
        self.coors_range = as_f32[5:2:-1] + as_f32[:5:-1]
        self.grid_size = grid_xyz[::-1]
        self.grid_stride = [grid_xyz[0] * grid_xyz[1], grid_xyz[0], 1]

    def _run(self, pc, empty_mean):
        if pc.shape[1] != self.num_point_features:
            raise ValueError(f"spconv_c: PointToVoxel expects {self.num_point_features} features "
                             f"per point, got {pc.shape[1]}")
        voxels, mean, coords, num, point_voxel, grid = ops.voxelize(
            pc, self._vsize_xyz, self._range_xyz, self.max_num_points_per_voxel,
            self.max_num_voxels)
        if empty_mean:
            # spconv's empty_mean: unused slots hold the voxel's mean instead of zeros.
            slot = torch.arange(voxels.shape[1]).view(1, -1)
            unused = slot >= num.view(-1, 1)
            voxels = torch.where(unused.unsqueeze(-1), mean.unsqueeze(1), voxels)
        return voxels, coords, num, point_voxel

    def __call__(self, pc, clear_voxels=True, empty_mean=False):
        voxels, coords, num, _ = self._run(pc, empty_mean)
        return voxels, coords, num

    def generate_voxel_with_id(self, pc, clear_voxels=True, empty_mean=False):
        return self._run(pc, empty_mean)


def gather_features_by_pc_voxel_id(seg_res_features, pc_voxel_id, invalid_value=0):
    """Per point, the row of ``seg_res_features`` (a voxel-wise result, [M, ...]) of its voxel,
    by the ids ``generate_voxel_with_id`` gives (``pc_voxel_id`` [P], -1 for a point no voxel
    took, which gets ``invalid_value``): spconv 2.x's helper for mapping a segmentation back to
    the points. Differentiable in ``seg_res_features``."""
    if pc_voxel_id.dim() != 1 or pc_voxel_id.is_floating_point():
        raise ValueError(f"spconv_c: pc_voxel_id must be an integer [P] tensor, got "
                         f"{pc_voxel_id.dtype} {list(pc_voxel_id.shape)}")
    ids = pc_voxel_id.to(seg_res_features.device).long()
    rows = seg_res_features.shape[0]
    if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= rows):
        raise ValueError(f"spconv_c: pc_voxel_id holds ids outside [-1, {rows}) (the voxel rows)")
    at = (ids >= 0).nonzero().view(-1)
    res = seg_res_features.new_full((ids.shape[0], *seg_res_features.shape[1:]), invalid_value)
    return res.index_put((at,), seg_res_features[ids[at]])
