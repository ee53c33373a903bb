"""How much of SECOND's backbone torch.compile keeps inside compiled graphs, pass by pass.

Trains ``bench.second_net`` (OpenPCDet's VoxelBackBone8x) in float64 under torch.compile
(``aot_eager``) on random inputs of four sizes (3,000, 2,700, 2,400, 2,100 voxels in a
41 x 160 x 140 grid), checks every pass's output and parameter gradients against the same
network run eagerly, and prints how many of its 12 convs ran inside a compiled graph (a conv
outside every graph goes through ``ops._call_rulebook_op`` while nothing is compiling; one in a
graph is called by the graph). docs/pytorch.md, "Rulebook builds inside the graph", has the
figures.

  .venv/bin/python python/benchmarks/compile_coverage.py [--capture] [--recompile-limit N]

--capture sets torch._dynamo.config.capture_dynamic_output_shape_ops, with which the strided
builds are traced into the graph too; --recompile-limit sets torch._dynamo.config.recompile_limit
(PyTorch's default: 8).
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import spconv_c.pytorch as sp  # noqa: E402
from spconv_c import ops  # noqa: E402

SHAPE = [41, 160, 140]
SIZES = [3000, 2700, 2400, 2100]
CONVS = 12  # in bench.second_net


def sample(count, seed):
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randperm(SHAPE[0] * SHAPE[1] * SHAPE[2], generator=gen)[:count]
    z, y, x = flat // (SHAPE[1] * SHAPE[2]), (flat // SHAPE[2]) % SHAPE[1], flat % SHAPE[2]
    idx = torch.stack([torch.zeros_like(z), z, y, x], 1).int()
    return torch.randn(count, 4, generator=gen, dtype=torch.float64), idx


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capture", action="store_true",
                    help="torch._dynamo.config.capture_dynamic_output_shape_ops = True")
    ap.add_argument("--recompile-limit", type=int, default=None)
    args = ap.parse_args()
    if args.recompile_limit is not None:
        torch._dynamo.config.recompile_limit = args.recompile_limit
    torch._dynamo.config.capture_dynamic_output_shape_ops = args.capture

    outside = [0]
    call = ops._call_rulebook_op

    def counting(op, token_op, rulebook, *rest):
        if not torch.compiler.is_compiling():
            outside[0] += 1
        return call(op, token_op, rulebook, *rest)
    ops._call_rulebook_op = counting

    torch.manual_seed(0)
    eager = bench.second_net(sp).double()
    compiled_net = bench.second_net(sp).double()
    compiled_net.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_net, backend="aot_eager")
    print(f"capture_dynamic_output_shape_ops={args.capture}, "
          f"recompile_limit={torch._dynamo.config.recompile_limit}")
    for step, count in enumerate(SIZES):
        feats, idx = sample(count, step)
        want = eager(sp.SparseConvTensor(feats, idx, SHAPE, 1))
        want.sum().backward()
        outside[0] = 0
        start = time.perf_counter()
        got = compiled(sp.SparseConvTensor(feats, idx, SHAPE, 1))
        got.sum().backward()
        seconds = time.perf_counter() - start
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        for (name, a), b in zip(eager.named_parameters(), compiled_net.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12, msg=name)
            a.grad = b.grad = None
        print(f"pass {step + 1}: {count} voxels, {CONVS - outside[0]} of {CONVS} convs inside "
              f"compiled graphs, outputs and gradients equal eager's ({seconds:.1f} s)",
              flush=True)


if __name__ == "__main__":
    main()
