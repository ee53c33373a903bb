"""Points to voxels, as a detector's data pipeline calls it once per sample (OpenPCDet's
transform_points_to_voxels, in its DataLoader workers): spconv_c.pytorch.PointToVoxel against
spconv 2.3.8's PointToVoxel (CPU), the two taking turns call by call in one process, on the
shared scans with the grids detectors use. Medians in ms, and their ratio. Both run on one thread
(spconv's CPU voxelizer is serial; a DataLoader worker has one), and both give the same voxels
(python/tests/test_spconv_compat.py::test_point_to_voxel_same_as_spconv).

  .venv/bin/python python/benchmarks/bench_voxelize.py [--repeat 50] [--threads 1]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
DATA = ROOT.parent / "shared" / "data"

import spconv_c.pytorch as ours  # noqa: E402

# (name, scan, features per point, voxel size xyz, range, max voxels, max points per voxel)
CASES = [
    ("SECOND KITTI", "kitti_000008.bin", 4, [0.05, 0.05, 0.1], [0, -40, -3, 70.4, 40, 1],
     16000, 5),
    ("PointPillars KITTI", "kitti_000008.bin", 4, [0.16, 0.16, 4],
     [0, -39.68, -3, 69.12, 39.68, 1], 16000, 32),
    ("CenterPoint nuScenes", "nuscenes_lidar_top.pcd.bin", 5, [0.075, 0.075, 0.2],
     [-54, -54, -5, 54, 54, 3], 120000, 10),
    ("spconv bench_large scan", "spconv_benchmark_pc.bin", 4, [0.1, 0.1, 0.1],
     [-80, -80, -2, 80, 80, 6], 150000, 5),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not DATA.is_dir():
        sys.exit(f"bench_voxelize: the scans are in {DATA} (see README); not found")
    torch.set_num_threads(args.threads)
    try:
        from spconv.pytorch.utils import PointToVoxel as Theirs
    except ImportError:
        Theirs = None
        print("spconv 2.3.8 is not installed: ours alone")
    print(f"threads {args.threads}, median of {args.repeat} calls each, taking turns, ms")
    for name, scan, features, vsize, coors_range, max_voxels, max_points in CASES:
        path = DATA / scan
        if not path.is_file():
            print(f"{name:24s} skipped: {path} not found")
            continue
        pts = torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(-1, features))
        variants = {"ours": ours.PointToVoxel(vsize, coors_range, features, max_voxels,
                                              max_points)}
        if Theirs is not None:
            variants["spconv"] = Theirs(vsize, coors_range, features, max_voxels, max_points)
        times = {v: [] for v in variants}
        for i in range(args.repeat + 2):
            for v, gen in variants.items() if i % 2 else reversed(variants.items()):
                t0 = time.perf_counter()
                gen(pts)
                if i >= 2:
                    times[v].append((time.perf_counter() - t0) * 1e3)
        voxels = variants["ours"](pts)[1].shape[0]
        line = (f"{name:24s} {pts.shape[0]:7d} points {voxels:7d} voxels   ours "
                f"{statistics.median(times['ours']):7.2f}")
        if "spconv" in times:
            line += (f"   spconv {statistics.median(times['spconv']):7.2f}   spconv / ours "
                     f"{statistics.median(times['spconv']) / statistics.median(times['ours']):.2f}")
        print(line)


if __name__ == "__main__":
    main()
