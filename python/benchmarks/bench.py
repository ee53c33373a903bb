"""Benchmark of the PyTorch binding, in the spirit of PyTorch's C++-extension tutorial (the same
model as an extension and in plain Python): forward and forward+backward of spconv's
``bench_basic`` network, of the SECOND backbone (OpenPCDet VoxelBackBone8x) and of a pillar
detector's 2-d backbone (``pillar``: OpenPCDet's PillarBackBone8x on the KITTI scan's pillars)
and of a small U-Net (``unet``: OpenPCDet's UNetV2 in shape, with a forward of its own),

  ours     spconv_c.pytorch modules (the C engine through torch.ops.spconv_c);
  plain    the same modules with the conv / pool products in plain PyTorch over our rulebooks
           (index_select + mm + index_add_ per kernel offset; scatter_reduce amax for pooling);
  spconv   spconv 2.3.8's own modules, when installed;
  compiled (asked for with --variants) our modules under torch.compile (inductor) with
           torch._dynamo.config.capture_dynamic_output_shape_ops, so that every rulebook build is
           inside the one graph; compiled in the warm-up passes (give --warmup 2 or more);

same threads, medians of --repeat runs after --warmup, rulebooks built in every forward (as
spconv's benchmark counts them). A forward alone runs under torch.no_grad() for every variant (an
inference, as the C tool's forward is); with --backward it records the graph. --overhead also runs the C tool (`spconv bench`) on the same
network and input and prints the binding's overhead over it. --in-process splits that overhead
in one process, pass by pass (see in_process_overhead); with --backward it also sets a training
step of the modules against the engine's (in_process_training).

  .venv/bin/python python/benchmarks/bench.py [--net basic|second|pillar|unet|all] [--repeat 5]
      [--threads 1]
      [--backward] [--max-voxels N] [--overhead] [--in-process]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
DATA = ROOT.parent / "shared" / "data"

import spconv_c.ops as ops  # noqa: E402
import spconv_c.pytorch as ours  # noqa: E402


# ---- networks, written once against spconv's API ----------------------------------------------

def basic_net(sp):
    layers, cin = [], 3
    for i, c in enumerate([64, 64, 96, 96, 128, 128, 160, 160, 192, 192, 224, 224, 256, 256]):
        layers.append(sp.SubMConv3d(cin, c, 3, bias=False, indice_key=f"c{i // 2}"))
        cin = c
        if i % 2 == 1 and i < 13:
            layers.append(sp.SparseMaxPool3d(2, 2))
    return sp.SparseSequential(*layers)


def second_net(sp):
    def block(cin, cout, k, s=1, p=0, key=None, kind="subm"):
        conv = {"subm": lambda: sp.SubMConv3d(cin, cout, k, bias=False, indice_key=key),
                "spconv": lambda: sp.SparseConv3d(cin, cout, k, s, p, bias=False, indice_key=key)}
        return sp.SparseSequential(conv[kind](), nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01),
                                   nn.ReLU())
    return sp.SparseSequential(
        block(4, 16, 3, key="subm1"), block(16, 16, 3, key="subm1"),
        block(16, 32, 3, 2, 1, "spconv2", "spconv"), block(32, 32, 3, key="subm2"),
        block(32, 32, 3, key="subm2"),
        block(32, 64, 3, 2, 1, "spconv3", "spconv"), block(64, 64, 3, key="subm3"),
        block(64, 64, 3, key="subm3"),
        block(64, 64, 3, 2, (0, 1, 1), "spconv4", "spconv"), block(64, 64, 3, key="subm4"),
        block(64, 64, 3, key="subm4"),
        sp.SparseSequential(sp.SparseConv3d(64, 128, (3, 1, 1), (2, 1, 1), bias=False,
                                            indice_key="spconv_down2"),
                            nn.BatchNorm1d(128, eps=1e-3, momentum=0.01), nn.ReLU()),
        sp.ToDense())


def pillar_net(sp):
    """A 2-d backbone of pillar detectors (OpenPCDet's PillarBackBone8x, as PillarNet uses it):
    submanifold 2-d blocks at strides 1, 2, 4, 8 joined by strided 2-d convs, then dense."""
    def block(cin, cout, k=3, s=1, p=1, key=None, kind="subm"):
        conv = {"subm": lambda: sp.SubMConv2d(cin, cout, k, bias=False, indice_key=key),
                "spconv": lambda: sp.SparseConv2d(cin, cout, k, s, p, bias=False, indice_key=key)}
        return sp.SparseSequential(conv[kind](), nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01),
                                   nn.ReLU())
    return sp.SparseSequential(
        block(4, 32, key="subm1"), block(32, 32, key="subm1"),
        block(32, 64, 3, 2, 1, "spconv2", "spconv"), block(64, 64, key="subm2"),
        block(64, 64, key="subm2"),
        block(64, 128, 3, 2, 1, "spconv3", "spconv"), block(128, 128, key="subm3"),
        block(128, 128, key="subm3"),
        block(128, 256, 3, 2, 1, "spconv4", "spconv"), block(256, 256, key="subm4"),
        block(256, 256, key="subm4"),
        sp.ToDense())


class UNet(nn.Module):
    """A small submanifold U-Net for per-voxel outputs, in the shape of OpenPCDet's UNetV2 and as
    its users write one: stages called one by one in the module's own forward, inverse convs by
    the encoder's keys, skip features concatenated in Python (current channels first), a 1x1
    head; the C tool's "unet" (src/net/zoo_unet.c) layer for layer."""

    def __init__(self, sp):
        super().__init__()

        def block(cin, cout, key):
            return [sp.SubMConv3d(cin, cout, 3, bias=False, indice_key=key),
                    nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU()]

        def down(cin, cout, key):
            return [sp.SparseConv3d(cin, cout, 3, 2, 1, bias=False, indice_key=key),
                    nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU()]

        def up(cin, cout, key):
            return sp.SparseSequential(
                sp.SparseInverseConv3d(cin, cout, 3, bias=False, indice_key=key),
                nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU())

        self.conv_input = sp.SparseSequential(*block(4, 16, "subm1"))
        self.conv2 = sp.SparseSequential(*down(16, 32, "spconv2"), *block(32, 32, "subm2"))
        self.conv3 = sp.SparseSequential(*down(32, 64, "spconv3"), *block(64, 64, "subm3"))
        self.up3, self.dec2 = up(64, 32, "spconv3"), sp.SparseSequential(*block(64, 32, "subm2"))
        self.up2, self.dec1 = up(32, 16, "spconv2"), sp.SparseSequential(*block(32, 16, "subm1"))
        self.head = sp.SubMConv3d(16, 16, 1, bias=True)

    def forward(self, x):
        x1 = self.conv_input(x)
        x2 = self.conv2(x1)
        x = self.up3(self.conv3(x2))
        x = self.dec2(x.replace_feature(torch.cat([x.features, x2.features], 1)))
        x = self.up2(x)
        x = self.dec1(x.replace_feature(torch.cat([x.features, x1.features], 1)))
        return self.head(x)


NETS = {"basic": basic_net, "second": second_net, "pillar": pillar_net, "unet": UNet}


# ---- inputs -----------------------------------------------------------------------------------

def basic_input(max_voxels):
    idx = np.fromfile(DATA / "spconv_test_indices.i32", dtype=np.int32).reshape(-1, 4)
    feats = np.fromfile(DATA / "spconv_test_features.f32", dtype=np.float32).reshape(-1, 3)
    if max_voxels:
        idx, feats = idx[:max_voxels], feats[:max_voxels]
    return torch.from_numpy(feats.copy()), torch.from_numpy(idx.copy()), [80, 1600, 1600]


def second_input(max_voxels):
    pts = torch.from_numpy(np.fromfile(DATA / "kitti_000008.bin", dtype=np.float32).reshape(-1, 4))
    gen = ours.PointToVoxel([0.05, 0.05, 0.1], [0, -40, -3, 70.4, 40, 1], 4,
                            max_voxels or 40000, 5)
    voxels, coords, num = gen(pts)
    feats = voxels.sum(1) / num.view(-1, 1).float()
    idx = torch.cat([torch.zeros(coords.shape[0], 1, dtype=torch.int32), coords], 1)
    return feats, idx, [41, 1600, 1408]


def pillar_input(max_voxels):
    """The KITTI scan as PointPillars' pillars (0.16 m x 0.16 m columns over its 69.12 m x
    79.36 m range): sites (b, y, x) on a 496 x 432 grid, features the mean of each pillar's
    points (x, y, z, intensity)."""
    pts = torch.from_numpy(np.fromfile(DATA / "kitti_000008.bin", dtype=np.float32).reshape(-1, 4))
    gen = ours.PointToVoxel([0.16, 0.16, 4], [0, -39.68, -3, 69.12, 39.68, 1], 4,
                            max_voxels or 16000, 32)
    voxels, coords, num = gen(pts)
    feats = voxels.sum(1) / num.view(-1, 1).float()
    idx = torch.cat([torch.zeros(coords.shape[0], 1, dtype=torch.int32), coords[:, 1:]], 1)
    return feats, idx.contiguous(), [496, 432]


INPUTS = {"basic": basic_input, "second": second_input, "pillar": pillar_input,
          "unet": second_input}


# ---- the plain-PyTorch products over our rulebooks ---------------------------------------------

def plain_conv(rb, features, weight, bias=None):
    kv = rb.kernel_volume()
    w = weight.reshape(kv, weight.shape[-2], weight.shape[-1])
    offsets = rb.pair_offsets().tolist()
    pin, pout = rb.pairs_in().long(), rb.pairs_out().long()
    out = features.new_zeros(rb.num_out(), w.shape[2])
    if bias is not None:
        out = out + bias
    for k in range(kv):
        b, e = offsets[k], offsets[k + 1]
        if e > b:
            out = out.index_add(0, pout[b:e], features.index_select(0, pin[b:e]) @ w[k])
    return out


def plain_maxpool(rb, features):
    pin, pout = rb.pairs_in().long(), rb.pairs_out().long()
    out = features.new_full((rb.num_out(), features.shape[1]), float("-inf"))
    src = features.index_select(0, pin)
    return out.scatter_reduce(0, pout.view(-1, 1).expand_as(src), src, "amax")


class PlainProducts:
    """Swap the engine's products for the plain PyTorch ones inside the same modules."""

    def __enter__(self):
        self.saved = ops.indice_conv, ops.indice_maxpool
        ops.indice_conv, ops.indice_maxpool = plain_conv, plain_maxpool

    def __exit__(self, *exc):
        ops.indice_conv, ops.indice_maxpool = self.saved


# ---- timing -----------------------------------------------------------------------------------

def time_variant(lib, net, feats, idx, shape, backward, repeat, warmup):
    times = []
    for i in range(warmup + repeat):
        f = feats.clone().requires_grad_(backward)
        t0 = time.perf_counter()
        with torch.set_grad_enabled(backward):  # a forward alone is inference, as the C tool's
            out = net(lib.SparseConvTensor(f, idx, shape, 1))
        dense = out if isinstance(out, torch.Tensor) else out.features
        if backward:
            dense.sum().backward()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        # The pass's outputs go before the next pass starts, as the C tool's do (it writes every
        # pass's dense map into one buffer): held, two of SECOND's 36 MB maps would take turns
        # in the cache, and the to-dense of every pass would pay for it (2.1 ms instead of 1.3).
        del out, dense, f
    return times


def c_tool_forward_ms(net, repeat, warmup, threads):
    """The C tool's forward wall time of every timed pass (ms), or None when it is not built."""
    tool = ROOT / "build" / "tools" / "spconv"
    if not tool.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [str(tool), "bench", "--net", net, "--repeat", str(repeat), "--warmup", str(warmup),
               "--threads", str(threads), "--json", str(out)]
        cmd += ["--input", str(DATA if net == "basic" else DATA / "kitti_000008.bin")]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        report = json.loads(out.read_text())
    return [p["wall_ms"] for p in report["passes"]["forward"]["per_pass"]]


# ---- the binding's overhead, split, in one process -------------------------------------------

class _EngineNet:
    """The C engine's own network (the zoo's, as `spconv bench` runs it) called through ctypes
    from this process: the same library the extension uses, the same OpenMP runtime, heap and
    machine minute as the modules it is compared with. Its parameters are the zoo's, not the
    modules' (the work does not depend on the values)."""

    def __init__(self, name, feats, idx, shape, threads):
        import ctypes as C

        path = next(line.split()[-1] for line in open("/proc/self/maps")
                    if "libspconv.so" in line)
        self.lib = lib = C.CDLL(path)

        class Device(C.Structure):
            _fields_ = [("type", C.c_int), ("index", C.c_int)]

        def check(status, what):
            if status != 0:
                raise RuntimeError(f"bench: {what} failed (status {status})")
        self.C, self.check, cpu = C, check, Device(0, 0)
        self.ctx, self.net = C.c_void_p(), C.c_void_p()
        check(lib.spconv_context_create(cpu, C.byref(self.ctx)), "spconv_context_create")
        check(lib.spconv_context_set_num_threads(self.ctx, threads), "set_num_threads")
        check(lib.spconv_zoo_create(name.encode(), 2, C.c_uint64(0), C.byref(self.net)),
              "spconv_zoo_create")
        self.keep = (feats.contiguous(), idx.contiguous())
        self.wrapped = []
        for t, dtype in zip(self.keep, (2, 4)):  # SPCONV_F32, SPCONV_I32
            out = C.c_void_p()
            check(lib.spconv_tensor_wrap(cpu, dtype, 2, (C.c_int64 * 2)(*t.shape), None,
                                         C.c_void_p(t.data_ptr()), None, None, C.byref(out)),
                  "spconv_tensor_wrap")
            self.wrapped.append(out)
        self.shape = (C.c_int64 * 3)(*shape)
        self.cpu, self.grad = cpu, None

    def __call__(self, training=False):
        """One pass: an inference forward, or with ``training`` a training forward (batch
        statistics) and the backward of a fixed output gradient, as `spconv bench --backward`
        times them (the input's gradient left out, as there)."""
        C, lib = self.C, self.lib
        sp, out = C.c_void_p(), C.c_void_p()
        self.check(lib.spconv_sparse_create(self.wrapped[0], self.wrapped[1], self.shape,
                                            C.c_int64(1), C.byref(sp)), "spconv_sparse_create")
        self.check(lib.spconv_net_forward(self.ctx, self.net, sp, int(training), C.byref(out),
                                          None), "spconv_net_forward")
        if training:
            self.check(lib.spconv_net_backward(self.ctx, self.net, self._grad(out), None),
                       "spconv_net_backward")
        lib.spconv_tensor_release(out)
        lib.spconv_sparse_release(sp)

    def _grad(self, out):
        """A gradient of ``out``'s shape (made once, kept for every pass: its values do not
        change the work)."""
        C, lib = self.C, self.lib
        if self.grad is None:
            lib.spconv_tensor_sizes.restype = C.POINTER(C.c_int64)
            ndim = lib.spconv_tensor_ndim(out)
            sizes = lib.spconv_tensor_sizes(out)
            sizes = [sizes[d] for d in range(ndim)]
            self.grad_data = torch.randn(sizes, generator=torch.Generator().manual_seed(1))
            self.grad = C.c_void_p()
            self.check(lib.spconv_tensor_wrap(self.cpu, 2, ndim, (C.c_int64 * ndim)(*sizes),
                                              None, C.c_void_p(self.grad_data.data_ptr()), None,
                                              None, C.byref(self.grad)), "spconv_tensor_wrap")
        return self.grad

    def close(self):
        for t in self.wrapped + ([self.grad] if self.grad is not None else []):
            self.lib.spconv_tensor_release(t)
        self.lib.spconv_net_destroy(self.net)
        self.lib.spconv_context_destroy(self.ctx)


def ops_only(net, feats, idx, shape, with_torch_modules=True):
    """The network's work as bare operator calls (torch.ops.spconv_c, below autograd), none of
    the modules' Python: rulebooks by indice_key, convs, pools, densify, and, when
    with_torch_modules, torch's batch norm and in-place ReLU between them."""
    o, below = torch.ops.spconv_c, torch._C._AutoDispatchBelowAutograd
    x_f, x_i, x_s, cache = feats, idx, list(shape), {}
    # The rulebook whose output (or, for a subm one, input) sites x_i are: the next build goes
    # on them without checking the rows, as the engine's network and the modules do.
    source = None
    with below():
        for m in net.modules():
            if isinstance(m, (ours.SparseConv3d, ours.SubMConv3d, ours.SparseMaxPool3d)):
                subm = getattr(m, "subm", False)
                key = m.indice_key
                rb = cache.get(key) if subm and key is not None else None
                if rb is None:
                    geometry = (1 if subm else 0, m.kernel_size, m.stride, m.padding, m.dilation,
                                [0, 0, 0])
                    rb = (o.build_rulebook(x_i, x_s, 1, *geometry) if source is None
                          else o.build_rulebook_on(source, True, *geometry)[0])
                    cache[key] = rb
                    source = rb
                    if not subm:
                        x_i, x_s = rb.out_indices(), list(rb.out_shape())
                if isinstance(m, ours.SparseMaxPool3d):
                    x_f = o.maxpool_forward(rb, x_f)[0]
                else:
                    x_f = o.conv_forward(rb, x_f, m.weight.permute(1, 2, 3, 4, 0), m.bias)
            elif isinstance(m, nn.BatchNorm1d) and with_torch_modules:
                x_f = torch.batch_norm(x_f, m.weight, m.bias, m.running_mean, m.running_var,
                                       False, 0.0, m.eps, False)
            elif isinstance(m, nn.ReLU) and with_torch_modules:
                torch.relu_(x_f)
            elif isinstance(m, ours.ToDense):
                return o.sparse_to_dense(x_f, x_i, x_s, 1)
    return x_f


def _per_layer(net, feats, idx, shape):
    """The modules with their sequences run layer by layer (SPCONV_C_SEQUENCE_CALL=0)."""
    from spconv_c.pytorch import sequence
    sequence.ENABLED = False
    try:
        return net(ours.SparseConvTensor(feats, idx, shape, 1))
    finally:
        sequence.ENABLED = True


def take_turns(variants, passes, warmup, grad=False):
    """Each variant's pass times (ms, after ``warmup`` passes), the variants taking turns pass
    by pass in a shuffled order (seeded), under torch.no_grad() unless ``grad``."""
    times = {v: [] for v in variants}
    shuffle = random.Random(20261207)
    with torch.set_grad_enabled(grad):
        for i in range(warmup + passes):
            for v in shuffle.sample(list(variants), len(variants)):
                t0 = time.perf_counter()
                variants[v]()
                if i >= warmup:
                    times[v].append((time.perf_counter() - t0) * 1e3)
    return times


def report_turns(name, times, base):
    """Prints each variant's median and its overhead over variant ``base``: as the ratio of the
    medians, and as the median of the per-pass ratios. Pass i of every variant ran within a few
    hundred ms of the others': the latter leaves out the machine's drift from minute to minute,
    which the former keeps whenever the variants' passes fell unevenly into fast and slow
    minutes."""
    passes = len(times[base])
    print(f"{name:7s} in one process, median of {passes} passes each, taking turns "
          "(ratio of medians; median of the per-pass ratios):")
    base_median = statistics.median(times[base])
    for v, t in times.items():
        m = statistics.median(t)
        paired = statistics.median(a / b for a, b in zip(t, times[base]))
        print(f"{name:7s}   {v:11s} {m:8.2f} ms  {100 * (m / base_median - 1):+6.1f}% over the "
              f"{base}; {100 * (paired - 1):+6.1f}% pass by pass")


def stage_by_stage(net, feats, idx, shape):
    """SECOND's modules as OpenPCDet's VoxelBackBone8x runs them (a pass of it): conv_input,
    conv1 .. conv4 and conv_out called one after the other, each a sequence of its own, then
    the dense map as its HeightCompression asks for it."""
    blocks = list(net.children())
    stages = [ours.SparseSequential(*blocks[a:b]) for a, b in
              ((0, 1), (1, 2), (2, 5), (5, 8), (8, 11), (11, 12))]

    def run():
        x = ours.SparseConvTensor(feats, idx, shape, 1)
        for stage in stages:
            x = stage(x)
        return x.dense()
    return run


def in_process_overhead(name, net, feats, idx, shape, threads, passes, warmup):
    """The binding's overhead split into its parts, in one process, the variants taking turns
    pass by pass (so the machine's drift weighs on all alike), in a shuffled order each pass
    (seeded): with a fixed order reversed every other pass, a variant in the middle was always
    in the middle, and that position alone measured 1-2% slower (docs/pytorch.md):

      engine       the C engine's network (spconv_net_forward, through ctypes);
      bare ops     the same work as operator calls without torch's modules: what calling the
                   engine through PyTorch's dispatcher costs;
      + torch BN   ... with torch's batch norm and ReLU where the network has them (the engine
                   runs its own, fused and in place): what the network's torch modules cost;
      ours         the spconv_c.pytorch modules: what their Python costs on top;
      per layer    ... with each sequence run layer by layer, not in one call into C++;
      by stages    (SECOND) the same modules called as OpenPCDet's VoxelBackBone8x calls them:
                   its stages one by one (sequences of 1, 1, 3, 3, 3 and 1 blocks), then the
                   dense map (stage_by_stage).
    A network with a forward of its own (unet) has no bare-ops variants: ops_only walks a plain
    sequence.
    """
    engine = _EngineNet(name, feats, idx, shape, threads)
    variants = {"engine": engine,
                "bare ops": lambda: ops_only(net, feats, idx, shape, False),
                "+ torch BN": lambda: ops_only(net, feats, idx, shape, True),
                "ours": lambda: net(ours.SparseConvTensor(feats, idx, shape, 1)),
                "per layer": lambda: _per_layer(net, feats, idx, shape)}
    if not any(isinstance(m, nn.BatchNorm1d) for m in net.modules()):
        variants.pop("+ torch BN")
    if not isinstance(net, ours.SparseSequential):
        variants.pop("bare ops")
        variants.pop("+ torch BN", None)
    if name == "second":
        variants["by stages"] = stage_by_stage(net, feats, idx, shape)
    times = take_turns(variants, passes, warmup)
    engine.close()
    report_turns(name, times, "engine")


def in_process_training(name, net, feats, idx, shape, threads, passes, warmup):
    """The binding's overhead in training, in one process, taking turns as above: a training
    step's forward (batch norm on batch statistics) and backward of a fixed gradient of the
    output, the input's gradient left out, as `spconv bench --backward` times it:

      engine     the C engine's network (spconv_net_forward in training mode, then
                 spconv_net_backward);
      ours       the spconv_c.pytorch modules in train mode, with torch's batch norm and ReLU
                 (what a detector trains with), then autograd's backward; the parameters'
                 gradients set to None first, as an optimizer's zero_grad() does;
      by stages  (SECOND) the same, its stages called one by one (stage_by_stage).
    """
    engine = _EngineNet(name, feats, idx, shape, threads)
    net = net.train()
    with torch.no_grad():
        out = net(ours.SparseConvTensor(feats, idx, shape, 1))
    grad = torch.randn(out.shape if isinstance(out, torch.Tensor) else out.features.shape,
                       generator=torch.Generator().manual_seed(1))
    params = list(net.parameters())

    def step(forward):
        def run():
            for p in params:
                p.grad = None
            out = forward()
            (out if isinstance(out, torch.Tensor) else out.features).backward(grad)
        return run
    variants = {"engine": lambda: engine(training=True),
                "ours": step(lambda: net(ours.SparseConvTensor(feats, idx, shape, 1)))}
    if name == "second":
        variants["by stages"] = step(stage_by_stage(net, feats, idx, shape))
    times = take_turns(variants, passes, warmup, grad=True)
    engine.close()
    net.eval()
    report_turns(f"{name} training", times, "engine")


def as_3d(net):
    """A 2-d network's twin in 3-d: each 2-d conv as the 3-d conv of kernel (1, KH, KW), stride
    (1, SH, SW), padding (0, PH, PW) on sites (b, 0, y, x) in [1, H, W], with the same weights
    ([C_out, 1, KH, KW, C_in]); it gives the same bits (the engine runs a 2-d layer so)."""
    if isinstance(net, ours.SparseSequential):
        return ours.SparseSequential(*[as_3d(m) for m in net.children()])
    twins = {ours.SubMConv2d: ours.SubMConv3d, ours.SparseConv2d: ours.SparseConv3d}
    if type(net) not in twins:
        return net
    conv = twins[type(net)](net.in_channels, net.out_channels, [1, *net.kernel_size],
                            [1, *net.stride], [0, *net.padding], [1, *net.dilation],
                            bias=net.bias is not None, indice_key=net.indice_key)
    with torch.no_grad():
        conv.weight.copy_(net.weight.unsqueeze(1))
        if net.bias is not None:
            conv.bias.copy_(net.bias)
    return conv


def in_process_2d(name, net, feats, idx, shape, passes, warmup):
    """The C tool has no 2-d network; in one process, the 2-d modules (in one call, and layer by
    layer) against their 3-d twin (as_3d) in one call, which is the engine's own network but
    for the one call's overhead (+2-3% on SECOND), taking turns pass by pass as above."""
    twin = as_3d(net).eval()
    idx3 = torch.cat([idx[:, :1], torch.zeros_like(idx[:, :1]), idx[:, 1:]], 1).contiguous()
    variants = {"3-d twin": lambda: twin(ours.SparseConvTensor(feats, idx3, [1, *shape], 1)),
                "ours": lambda: net(ours.SparseConvTensor(feats, idx, shape, 1)),
                "per layer": lambda: _per_layer(net, feats, idx, shape)}
    with torch.no_grad():
        a, b = variants["ours"](), variants["3-d twin"]()
    assert torch.equal(a, b.reshape(a.shape)), "the 3-d twin gives other bits"
    report_turns(name, take_turns(variants, passes, warmup), "3-d twin")


def keep_freed_memory():
    """What the C tool does for itself (tools/spconv/main.c), so that both run alike: glibc serves
    blocks above its mmap threshold (at most 32 MiB) with fresh mmaps that fault in page by page
    and are unmapped on free, and a network's tensors (a dense BEV map is 36 MB) pay that on every
    pass. glibc reads MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ when the process starts, so
    the script starts itself again with them set; every variant of the run gets them alike (a
    user's own process can set them the same way)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 30), MALLOC_TRIM_THRESHOLD_=str(1 << 30))
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--net", default="all", choices=["basic", "second", "pillar", "unet", "all"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backward", action="store_true", help="also time forward+backward")
    ap.add_argument("--max-voxels", type=int, default=0, help="use the first N voxels only")
    ap.add_argument("--variants", default="ours,plain,spconv")
    ap.add_argument("--overhead", action="store_true",
                    help="compare with `build/tools/spconv bench` (writes its JSON figures)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the variants (and the C tool) this many times, alternating their "
                         "order, and pool every pass: a machine whose speed drifts then weighs "
                         "on all of them alike")
    ap.add_argument("--in-process", action="store_true",
                    help="split the binding's overhead in one process (engine via ctypes, bare "
                         "operator calls, with torch's batch norm, the modules)")
    ap.add_argument("--fresh-pages", action="store_true",
                    help="leave glibc's malloc as it is (see keep_freed_memory)")
    args = ap.parse_args()
    if not args.fresh_pages:
        keep_freed_memory()
    if not DATA.is_dir():
        sys.exit(f"bench: the inputs are in {DATA} (see README); not found")
    torch.set_num_threads(args.threads)
    try:
        import spconv.pytorch as theirs
        import spconv.pytorch.ops as spconv_ops
        if not torch.cuda.is_available():
            spconv_ops.get_current_stream = lambda: 0  # its CPU backward asks for a CUDA stream
    except ImportError:
        theirs = None
    nets = list(NETS) if args.net == "all" else [args.net]
    modes = [False, True] if args.backward else [False]
    print(f"threads {args.threads}, median [min, max] of {args.rounds} round(s) of {args.repeat} "
          "runs, variants in alternating order, ms")
    for name in nets:
        feats, idx, shape = INPUTS[name](args.max_voxels)
        build = NETS[name]
        in_c_tool = name != "pillar"  # the C tool's zoo has basic, SECOND and unet, no 2-d net
        torch.manual_seed(0)
        ref = build(ours).eval()
        variants = [v for v in args.variants.split(",")]
        if theirs is None and "spconv" in variants:
            print(f"{name:7s} spconv   (not installed)")
            variants.remove("spconv")
        if args.in_process and not args.max_voxels and not in_c_tool:
            in_process_2d(name, ref, feats, idx, shape, args.repeat * args.rounds, args.warmup)
        if args.in_process and not args.max_voxels and in_c_tool:
            in_process_overhead(name, ref, feats, idx, shape, args.threads,
                                args.repeat * args.rounds, args.warmup)
            if args.backward:
                in_process_training(name, ref, feats, idx, shape, args.threads,
                                    args.repeat * args.rounds, args.warmup)
        for backward in modes:
            phase = "fwd+bwd" if backward else "forward"
            nets_of = {}
            for variant in variants:
                lib = theirs if variant == "spconv" else ours
                nets_of[variant] = build(lib).eval()
                nets_of[variant].load_state_dict(ref.state_dict())
                if variant == "compiled":
                    torch._dynamo.reset()
                    nets_of[variant] = torch.compile(nets_of[variant], backend="inductor",
                                                     fullgraph=True)
            times = {v: [] for v in variants}
            tool = "C tool"
            with_tool = args.overhead and not backward and not args.max_voxels and in_c_tool
            if with_tool:
                times[tool] = []
            rounds = {v: [] for v in times}  # each round's median, per variant
            for rnd in range(args.rounds):
                order = list(times) if rnd % 2 == 0 else list(times)[::-1]
                for variant in order:
                    if variant == tool:
                        c_ms = c_tool_forward_ms(name, args.repeat, args.warmup, args.threads)
                        if c_ms is None:
                            print("overhead: build/tools/spconv not built")
                            del times[tool]
                        else:
                            times[tool] += c_ms
                            rounds[tool].append(statistics.median(c_ms))
                        continue
                    lib = theirs if variant == "spconv" else ours
                    ctx = (PlainProducts() if variant == "plain" else
                           torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
                           if variant == "compiled" else _Nothing())
                    with ctx, torch.set_grad_enabled(backward):
                        ms = time_variant(lib, nets_of[variant], feats, idx, shape, backward,
                                          args.repeat, args.warmup)
                    times[variant] += ms
                    rounds[variant].append(statistics.median(ms))
            median = {v: statistics.median(t) for v, t in times.items()}
            for v, t in times.items():
                print(f"{name:7s} {phase:8s} {v:8s} {median[v]:9.1f} [{min(t):.1f}, {max(t):.1f}]  "
                      f"({idx.shape[0]} voxels, {len(t)} passes)", flush=True)
            if tool in median and "ours" in median:
                # Also round by round: the two ran within a second or two of each other in every
                # round, so the median of the rounds' ratios leaves out the machine's drift from
                # minute to minute, which the ratio of the medians keeps.
                paired = statistics.median(a / b for a, b in zip(rounds["ours"], rounds[tool]))
                print(f"{name:7s} {phase:8s} binding overhead over the C tool "
                      f"{100 * (median['ours'] / median[tool] - 1):+.1f}% (ratio of the medians),"
                      f" {100 * (paired - 1):+.1f}% (median of the {len(rounds[tool])} rounds' "
                      "ratios)")
            if "spconv" in median:
                for v in median:
                    if v != "spconv":
                        paired = statistics.median(a / b for a, b in
                                                   zip(rounds["spconv"], rounds[v]))
                        print(f"{name:7s} {phase:8s} {v} is {median['spconv'] / median[v]:.2f}x "
                              f"spconv 2.3.8 ({paired:.2f}x round by round)")


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
