"""Drop-in: the same network (nets.make_net, of 3-d, 2-d and 1-d layers) built with spconv 2.3.8
and with spconv_c.pytorch, the same state_dict, the same KITTI input (seen from above for 2-d,
along x for 1-d): same outputs and gradients. spconv runs with one thread (its CPU scatter-add
races with more). Its CPU max pool starts from 0, ours from -inf:
the pooled features here follow a ReLU, so no window is all negative and both agree."""

import os

import pytest
import torch

import spconv_c.pytorch as ours
from nets import flattened, kitti_voxels, make_net

spconv = pytest.importorskip("spconv.pytorch", reason="spconv 2.3.8 is not installed")

# spconv's CPU kernels race with more than one OpenMP thread, and torch.set_num_threads does
# not reach all of them: the comparison runs in its own process (tools/test-python.sh).
pytestmark = pytest.mark.skipif(os.environ.get("OMP_NUM_THREADS") != "1",
                                reason="the spconv comparison needs OMP_NUM_THREADS=1 "
                                       "(spconv 2.3.8's CPU scatter-add races with more threads)")


@pytest.fixture
def one_thread(monkeypatch):
    if not torch.cuda.is_available():
        # spconv 2.3.8's CPU backward asks torch for the current CUDA stream even for CPU
        # tensors, which fails on a CUDA build of torch without a driver; the CPU has stream 0.
        import spconv.pytorch.ops as spconv_ops
        monkeypatch.setattr(spconv_ops, "get_current_stream", lambda: 0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(net, feats, indices, shape, lib):
    f = feats.clone().requires_grad_(True)
    x = lib.SparseConvTensor(f, indices.clone(), shape, 1)
    skip, dense = net(x)
    gen = torch.Generator().manual_seed(0)
    loss = (skip * torch.randn(skip.shape, generator=gen)).sum() + \
        (dense * torch.randn(dense.shape, generator=gen)).sum()
    loss.backward()
    return skip.detach(), dense.detach(), f.grad, {n: p.grad for n, p in net.named_parameters()}


@pytest.mark.parametrize("ndim", [3, 2, 1])
def test_same_state_dict_same_results(data_dir, one_thread, seed, ndim):
    torch.manual_seed(seed)
    feats, indices, shape = kitti_voxels(data_dir / "kitti_000008.bin")
    if ndim != 3:  # the scan from above (2-d: pillars), or along x (1-d)
        feats, indices, shape = flattened(feats, indices, shape, ndim)
    theirs = make_net(spconv, ndim=ndim)
    mine = make_net(ours, ndim=ndim)
    missing = mine.load_state_dict(theirs.state_dict())  # unchanged: KRSC weights
    assert not missing.missing_keys and not missing.unexpected_keys
    # The pointwise layer: spconv reads its KRSC weight as a [C_in, C_out] reshape (#450), and
    # so do ours by default (legacy_1x1): the state_dict alone gives spconv's outputs.
    assert mine.pw.conv1x1 and mine.pw.legacy_1x1
    # In float64, so that the two engines' different orders of summation cannot matter. In
    # float32 they did, by chance: the first layer's weight gradient sums ~1e5 products through
    # the BatchNorm's division by the batch std, and 1 element in ~2000 differed by up to 3e-4
    # of the tensor's largest value (~5e3 units of float32's rounding 6e-8). The same
    # amplification of float64's rounding (1.1e-16) is below 1e-12 of the largest value; the
    # test allows 1e-9 of it, and a wrong pair, weight layout or missing term moves elements
    # by far more (they are O(1) of it).
    a = run(theirs.double(), feats.double(), indices, shape, spconv)
    b = run(mine.double(), feats.double(), indices, shape, ours)

    def same(mine_t, theirs_t, what):
        scale = theirs_t.abs().max().item()
        assert scale > 0, f"{what} is all zero: nothing compared"
        torch.testing.assert_close(mine_t, theirs_t, rtol=0, atol=1e-9 * scale,
                                   msg=lambda m: f"{what}: {m}")

    same(b[0], a[0], "skip features")
    same(b[1], a[1], "dense head")
    same(b[2], a[2], "input gradient")
    for name, grad in a[3].items():
        same(b[3][name], grad, f"gradient of {name}")


def test_max_pool_starts_from_minus_infinity(one_thread):
    # One window, all negative: the maximum is -1, where spconv's CPU pool says 0.
    idx = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1]], dtype=torch.int32)
    feats = torch.tensor([[-1.0], [-2.0]])
    y = ours.SparseMaxPool3d(2, 2)(ours.SparseConvTensor(feats, idx, [2, 2, 2], 1))
    assert y.features.item() == -1.0


def test_legacy_1x1_inverse_conv_same_as_spconv(data_dir, one_thread, seed):
    # spconv 2.3.8 computes a kernel-volume-1 inverse conv on its 1x1 path (the product on its
    # input's sites, the key unread); with legacy_1x1 (the default) ours does too (without it,
    # ours inverts: test_compat_details.py), the same sites, shape and values.
    feats, indices, shape = kitti_voxels(data_dir / "kitti_000008.bin")
    feats = feats.abs()  # spconv's CPU max pool starts from 0: no negative feature to pool
    torch.manual_seed(seed)
    outs = []
    for lib in (spconv, ours):
        net = lib.SparseSequential(lib.SparseMaxPool3d(1, 2, indice_key="p"),
                                   lib.SparseInverseConv3d(feats.shape[1], 6, 1, indice_key="p",
                                                           bias=False)).double()
        if lib is spconv:
            state = net.state_dict()
        else:
            net.load_state_dict(state)
        y = net(lib.SparseConvTensor(feats.double(), indices, shape, 1))
        # The pool's output sites come in another order from spconv (its hash table's): both
        # sorted by (b, z, y, x).
        rows = y.indices.long()
        key = ((rows[:, 0] * shape[0] + rows[:, 1]) * shape[1] + rows[:, 2]) * shape[2] + rows[:, 3]
        order = torch.argsort(key)
        outs.append((rows[order], list(y.spatial_shape), y.features.detach()[order]))
    assert torch.equal(outs[1][0], outs[0][0]) and outs[1][1] == outs[0][1]
    torch.testing.assert_close(outs[1][2], outs[0][2], rtol=0, atol=1e-12)


def test_inverse_of_a_transposed_conv_same_as_spconv(data_dir, one_thread, seed):
    # An inverse conv on a transposed conv's key goes back to that conv's input sites, in their
    # order (a subm conv between them, on the transposed conv's output sites, in whatever order
    # each library makes them): the same rows and values as spconv 2.3.8's, and gradients.
    feats, indices, shape = kitti_voxels(data_dir / "kitti_000008.bin")
    feats, indices = feats[:3000].double(), indices[:3000]
    torch.manual_seed(seed)
    results = []
    for lib in (spconv, ours):
        net = lib.SparseSequential(
            lib.SparseConvTranspose3d(feats.shape[1], 8, 3, 2, 1, indice_key="t", bias=False),
            lib.SubMConv3d(8, 8, 3, indice_key="s", bias=False),
            lib.SparseInverseConv3d(8, 5, 3, indice_key="t", bias=True)).double()
        if lib is spconv:
            state = net.state_dict()
        else:
            net.load_state_dict(state)
        f = feats.clone().requires_grad_(True)
        y = net(lib.SparseConvTensor(f, indices, shape, 1))
        gen = torch.Generator().manual_seed(0)
        (y.features * torch.randn(y.features.shape, generator=gen, dtype=torch.float64)).sum()\
            .backward()
        results.append((y.indices, list(y.spatial_shape), y.features.detach(), f.grad,
                        net[2].weight.grad))
    assert torch.equal(results[1][0], results[0][0]) and results[1][1] == results[0][1]
    for mine, theirs in zip(results[1][2:], results[0][2:]):
        scale = theirs.abs().max().item()
        assert scale > 0
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-9 * scale)


def test_sparse_add_same_as_spconv(data_dir, one_thread, seed):
    # Two operands on partly shared sites of the KITTI scan: the same sites in the same (sorted)
    # order, the same sums (each site adds at most one value to another: the same bits).
    feats, indices, shape = kitti_voxels(data_dir / "kitti_000008.bin")
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(indices.shape[0], generator=gen)
    a_rows, b_rows = pick[: 2 * len(pick) // 3], pick[len(pick) // 3:]
    other = torch.randn(len(b_rows), feats.shape[1], generator=gen)
    results = []
    for lib in (spconv, ours):
        a = lib.SparseConvTensor(feats[a_rows], indices[a_rows], shape, 1)
        b = lib.SparseConvTensor(other, indices[b_rows], shape, 1)
        s = lib.functional.sparse_add(a, b)
        results.append((s.indices, s.features.detach()))
    assert torch.equal(results[1][0], results[0][0])
    assert torch.equal(results[1][1], results[0][1])


def test_gather_features_by_pc_voxel_id_same_as_spconv(one_thread, seed):
    from spconv.pytorch.utils import gather_features_by_pc_voxel_id as theirs_gather
    from spconv_c.pytorch.utils import gather_features_by_pc_voxel_id as ours_gather
    gen = torch.Generator().manual_seed(seed)
    seg = torch.randn(50, 3, generator=gen)
    ids = torch.randint(-1, 50, (400,), generator=gen)
    for invalid in (0, -1.5):
        assert torch.equal(ours_gather(seg, ids, invalid), theirs_gather(seg, ids, invalid))


@pytest.mark.parametrize("scan, features, vsize, coors_range, max_voxels, max_points", [
    # SECOND's KITTI grid, a pillar grid, a coarse one whose voxels run out, nuScenes' grid
    ("kitti_000008.bin", 4, [0.05, 0.05, 0.1], [0, -40, -3, 70.4, 40, 1], 16000, 5),
    ("kitti_000008.bin", 4, [0.16, 0.16, 4], [0, -39.68, -3, 69.12, 39.68, 1], 16000, 32),
    ("spconv_benchmark_pc.bin", 4, [0.3, 0.3, 0.35], [-50, -40, -1, 50, 60, 6], 3000, 3),
    ("nuscenes_lidar_top.pcd.bin", 5, [0.075, 0.075, 0.2], [-54, -54, -5, 54, 54, 3], 60000,
     10),
])
def test_point_to_voxel_same_as_spconv(data_dir, one_thread, scan, features, vsize,
                                       coors_range, max_voxels, max_points):
    # A detector's data pipeline on real scans: the same voxels in the same order, the same
    # cells, counts and per-point voxel rows, and spconv's attributes (z, y, x). (empty_mean is
    # left out: spconv 2.3.8's CPU fill adds the previous voxel's mean in; ours is the mean,
    # test_compat_details.test_point_to_voxel_against_a_brute_force_oracle.)
    import numpy as np
    from spconv.pytorch.utils import PointToVoxel as Theirs
    pts = torch.from_numpy(np.fromfile(data_dir / scan, dtype=np.float32).reshape(-1, features))
    theirs = Theirs(vsize, coors_range, features, max_voxels, max_points)
    mine = ours.PointToVoxel(vsize, coors_range, features, max_voxels, max_points)
    for name in ("vsize", "coors_range", "grid_size", "grid_stride", "ndim"):
        assert list(np.atleast_1d(getattr(mine, name))) == list(
            np.atleast_1d(getattr(theirs, name))), name
    want = [t.clone() for t in theirs.generate_voxel_with_id(pts)]  # views of its buffers
    got = mine.generate_voxel_with_id(pts)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_indice_pairs_same_as_spconv(data_dir, one_thread):
    # What segmentation code reads from the cache (indice_dict[key].indice_pairs and
    # indice_pair_num) on the KITTI scan, a subm key and a strided one: the same layout, counts
    # (a subm key's only before the centre, as spconv counts them) and pairs. A strided conv's
    # output rows come in another order from spconv (ours sorted), so its pairs are compared by
    # sites; within an offset the order of the pairs is not.
    feats, indices, shape = kitti_voxels(data_dir / "kitti_000008.bin")
    got = {}
    for lib in (spconv, ours):
        net = lib.SparseSequential(lib.SubMConv3d(4, 4, 3, indice_key="s"),
                                   lib.SparseConv3d(4, 4, 3, 2, 1, indice_key="d"))
        with torch.no_grad():
            y = net(lib.SparseConvTensor(feats, indices, shape, 1))
        got[lib] = y.indice_dict
    for key in ("s", "d"):
        a, b = got[spconv][key], got[ours][key]
        assert a.indice_pairs.shape == b.indice_pairs.shape
        assert a.indice_pairs.dtype == b.indice_pairs.dtype
        assert torch.equal(a.indice_pair_num, b.indice_pair_num)
        assert a.algo.name == b.algo.name
        for k in range(a.indice_pairs.shape[1]):
            sides = []
            for e in (a, b):
                n = int((e.indice_pairs[0, k] >= 0).sum())  # packed from the left
                assert (e.indice_pairs[:, k, n:] == -1).all()
                rows_in = e.indice_pairs[0, k, :n].long()
                sites_out = e.out_indices[e.indice_pairs[1, k, :n].long()]
                sides.append(set(zip(rows_in.tolist(), map(tuple, sites_out.tolist()))))
            assert sides[0] == sides[1], (key, k)


def test_record_voxel_count_state_dict_same_as_spconv(data_dir, one_thread):
    # A checkpoint of layers made with record_voxel_count=True (spconv's TensorRT export path)
    # loads strictly both ways, and a forward leaves the same counts in the buffers.
    feats, indices, shape = kitti_voxels(data_dir / "kitti_000008.bin")
    nets = {}
    for lib in (spconv, ours):
        torch.manual_seed(0)
        nets[lib] = lib.SparseSequential(
            lib.SparseConv3d(4, 8, 3, 2, 1, record_voxel_count=True),
            lib.SparseMaxPool3d(2, 2, record_voxel_count=True),
            lib.SubMConv3d(8, 8, 3))
    assert list(nets[spconv].state_dict()) == list(nets[ours].state_dict())
    nets[ours].load_state_dict(nets[spconv].state_dict(), strict=True)
    nets[spconv].load_state_dict(nets[ours].state_dict(), strict=True)
    for lib, net in nets.items():
        with torch.no_grad():
            net(lib.SparseConvTensor(feats, indices, shape, 1))
    for a, b in zip(nets[spconv].buffers(), nets[ours].buffers()):
        assert torch.equal(a, b) and int(a) > 0


def test_every_public_name_of_spconv_pytorch_exists():
    # A network written for spconv 2.x changes only its import: every class and function that
    # spconv.pytorch exports is here too, except its internals (C++ core, hash table, raw ops,
    # constants) and what it re-exports from elsewhere (torch, numpy, typing, pathlib).
    import inspect
    internal = {"cppcore", "hash", "ops", "constants", "identity", "platform", "Path", "Union",
                "np", "torch"}
    names = {n for n, v in vars(spconv).items() if not n.startswith("_")
             and not inspect.ismodule(v) and n not in internal}
    missing = sorted(n for n in names if not hasattr(ours, n))
    assert not missing, f"spconv.pytorch names missing in spconv_c.pytorch: {missing}"
    # ... and the enum a layer's algo= names (Cylinder3D, Pointcept: algo=ConvAlgo.Native)
    assert [(m.name, m.value) for m in ours.ConvAlgo] == [(m.name, m.value)
                                                          for m in spconv.ConvAlgo]
