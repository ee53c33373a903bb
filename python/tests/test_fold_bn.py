"""Folding an inference batch norm (and ReLU) into the conv before it (modules._fold_length):
the same bits as PyTorch's own nn.BatchNorm1d and nn.ReLU after our conv, used only where
nothing can tell the difference (inference, the torch classes, no hooks), and the operator
itself through opcheck and its error messages."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

import spconv_c.pytorch as spconv
from spconv_c import ops
from spconv_c.pytorch import modules, sequence
from helpers import random_sparse, recording_modes

SHAPE = [9, 10, 11]


def random_bn(gen, c, dtype, affine=True):
    bn = nn.BatchNorm1d(c, eps=1e-3, momentum=0.01, affine=affine, dtype=dtype).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=gen, dtype=dtype))
        bn.running_var.copy_(torch.rand(c, generator=gen, dtype=dtype) * 3 + 1e-4)
        if affine:
            bn.weight.copy_(torch.randn(c, generator=gen, dtype=dtype))
            bn.bias.copy_(torch.randn(c, generator=gen, dtype=dtype))
    return bn


def block_net(gen, dtype, c_in=5, relu=True, affine=True):
    """SECOND's blocks: conv -> BatchNorm1d -> ReLU, a strided conv, an inverse conv."""
    def block(conv, c):
        layers = [conv, random_bn(gen, c, dtype, affine)] + ([nn.ReLU()] if relu else [])
        return spconv.SparseSequential(*layers)
    net = spconv.SparseSequential(
        block(spconv.SubMConv3d(c_in, 16, 3, indice_key="s1"), 16),
        block(spconv.SparseConv3d(16, 13, 3, 2, 1, indice_key="d1"), 13),
        block(spconv.SubMConv3d(13, 33, 3, indice_key="s2"), 33),
        block(spconv.SparseInverseConv3d(33, 8, 3, indice_key="d1"), 8),
    ).to(dtype)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * 0.3)
    return net.eval()


def run(net, feats, idx, fold):
    saved = modules.FOLD_BN
    modules.FOLD_BN = fold
    try:
        with torch.no_grad():
            return net(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).features
    finally:
        modules.FOLD_BN = saved


def folding_case(seed):
    """A float32 block network, its input and its unfolded output, once the first folded run has
    probed this PyTorch build (_probe_fold); skips where the fold is off on it."""
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, 300, 5, torch.float32)
    net = block_net(gen, torch.float32)
    run(net, feats, idx, True)
    if not modules._fold_agrees[torch.float32]:
        pytest.skip("this PyTorch build's batch norm is not fma(x, scale, shift): no fold")
    return gen, feats, idx, net, run(net, feats, idx, False)


class CountFolds:
    """Counts the convs run with a folded batch norm (so that a test knows the fold happened, or
    did not): the folded ops called layer by layer, and the folded steps of sequences run in
    one call (sequence.py, whose steps' last integer says whether they fold)."""

    def __enter__(self):
        self.saved, self.calls = ops.indice_conv_bn, 0
        self.saved_runner = sequence._runner
        runner = sequence._the_runner()
        outer = self

        def counted(*args, **kwargs):
            self.calls += 1
            return self.saved(*args, **kwargs)

        class Runner:
            def run(self, *args):
                steps = args[5]
                outer.calls += sum(steps[sequence.STEP_INTS - 1::sequence.STEP_INTS])
                return runner.run(*args)
        ops.indice_conv_bn = counted
        sequence._runner = Runner()
        return self

    def __exit__(self, *exc):
        ops.indice_conv_bn = self.saved
        sequence._runner = self.saved_runner


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("relu,affine", [(True, True), (False, True), (True, False)])
def test_folded_equals_torch_batch_norm(seed, dtype, relu, affine):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, 300, 5, dtype)
    feats[7, 2] = float("nan")  # a NaN travels the same way through both
    net = block_net(gen, dtype, relu=relu, affine=affine)
    run(net, feats, idx, True)  # the first fold probes this build (_probe_fold)
    with CountFolds() as folds:
        folded = run(net, feats, idx, True)
    assert folds.calls == (4 if modules._fold_agrees[dtype] else 0)
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        # x86 builds of PyTorch compile these kernels with FMA contraction: the fold must agree
        assert modules._fold_agrees[dtype], "the folded batch norm differs from PyTorch's"
    if not modules._fold_agrees[dtype]:
        pytest.skip(f"this PyTorch build's batch norm does not compute fma(x, scale, shift) in "
                    f"{dtype}: the fold is off (and the modules give PyTorch's results unfolded)")
    plain = run(net, feats, idx, False)
    assert modules._same_bits(folded, plain)
    assert torch.isnan(plain).any()  # the NaN check above is not vacuous


def test_fold_only_where_nothing_can_tell(seed):
    gen, feats, idx, net, want = folding_case(seed)
    with CountFolds() as folds:
        # grad mode records a graph: nothing folded, gradients flow
        out = net(spconv.SparseConvTensor(feats.requires_grad_(), idx, SHAPE, 2)).features
        assert out.requires_grad and folds.calls == 0 and torch.equal(out.detach(), want)
        out.sum().backward()
        assert feats.grad is not None
        feats = feats.detach()
        # a hook on the ReLU: the batch norm still folds, the ReLU runs as a module
        seen = []
        handle = net[0][2].register_forward_hook(lambda m, i, o: seen.append(o.shape))
        assert torch.equal(run(net, feats, idx, True), want) and len(seen) == 1
        assert folds.calls == 4
        handle.remove()
        # hooks on a block (a nested SparseSequential, which an inference runs straight from
        # its parent's loop where nothing would see the difference): they run, and it folds
        calls = []
        handles = [net[1].register_forward_pre_hook(lambda m, i: calls.append("pre")),
                   net[1].register_forward_hook(lambda m, i, o: calls.append("post"))]
        assert torch.equal(run(net, feats, idx, True), want) and calls == ["pre", "post"]
        assert folds.calls == 8
        for h in handles:
            h.remove()
        # a block whose forward is replaced on the instance runs that forward
        block = net[1]
        block.forward = lambda x: calls.append("own") or type(block).forward(block, x)
        assert torch.equal(run(net, feats, idx, True), want) and calls[-1] == "own"
        assert folds.calls == 12
        del net[1].forward
        # a global hook registered while the outer sequence runs (here by a hook of its first
        # block) sees the later blocks and their modules, as when each block is called
        everything, registered = [], []

        def register_global(m, i, o):
            if not registered:
                registered.append(register_module_forward_hook(
                    lambda mm, ii, oo: everything.append(type(mm).__name__)))
        handle = net[0].register_forward_hook(register_global)
        assert torch.equal(run(net, feats, idx, True), want)
        registered[0].remove()
        handle.remove()
        assert (everything.count("SparseSequential") == len(net) - 1
                and everything.count("BatchNorm1d") == len(net) - 1)
        folds.calls = 4
        # a hook on the batch norm: that block is not folded
        handle = net[1][1].register_forward_hook(lambda m, i, o: seen.append(o.shape))
        assert torch.equal(run(net, feats, idx, True), want) and len(seen) == 2
        assert folds.calls == 4 + 3
        handle.remove()
        # a batch norm in training mode updates its statistics: not folded
        net[2][1].train()
        before = net[2][1].running_mean.clone()
        run(net, feats, idx, True)
        assert folds.calls == 7 + 3 and not torch.equal(net[2][1].running_mean, before)
        net[2][1].eval()
        want = run(net, feats, idx, False)  # with the statistics it has now
        # a subclass of BatchNorm1d may do anything: not folded
        class MyBN(nn.BatchNorm1d):
            pass
        mine = MyBN(33, eps=1e-3).eval()
        mine.load_state_dict(net[2][1].state_dict())
        net[2].add_module("1", mine)  # replaces the batch norm in place
        assert torch.equal(run(net, feats, idx, True), want)
        assert folds.calls == 10 + 3
    # SPCONV_C_FOLD_BN=0 (modules.FOLD_BN) turns it off
    with CountFolds() as folds:
        run(net, feats, idx, False)
        assert folds.calls == 0


def test_fold_in_other_settings(seed):
    """inference_mode folds as no_grad does; an empty tensor, non-contiguous features, a forward
    replaced on an instance, a batch norm of other channels: the same as unfolded."""
    gen, feats, idx, net, want = folding_case(seed)
    with CountFolds() as folds:
        with torch.inference_mode():
            got = net(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).features
        assert folds.calls == 4 and modules._same_bits(got.clone(), want)
        wide = torch.randn(feats.shape[0], 10, generator=gen)
        wide[:, ::2] = feats
        assert torch.equal(run(net, wide[:, ::2], idx, True), want)  # a strided view
        assert folds.calls == 8
        empty = run(net, feats[:0], idx[:0], True)
        assert empty.shape == (0, 8) and torch.equal(empty, run(net, feats[:0], idx[:0], False))
        # a forward replaced on one batch norm instance: that block runs its modules
        bn = net[1][1]
        bn.forward = lambda x: nn.BatchNorm1d.forward(bn, x) * 2
        calls = folds.calls
        doubled = run(net, feats, idx, True)
        assert folds.calls == calls + 3 and not torch.equal(doubled, want)
        assert torch.equal(doubled, run(net, feats, idx, False))
        del bn.forward
    # a batch norm of other channels than its conv's: PyTorch's own error, not the fold's
    bad = spconv.SparseSequential(spconv.SubMConv3d(5, 4, 3, indice_key="b"),
                                  nn.BatchNorm1d(6).eval())
    with torch.no_grad(), pytest.raises(RuntimeError, match="running_mean should contain 4"):
        bad(spconv.SparseConvTensor(feats, idx, SHAPE, 2))


def test_fold_environment_and_parametrized_weights(seed):
    """The call's own conditions (modules._fold_environment, asked once per Sequential call): a
    dispatch mode, a torch-function mode, and a global module hook each see PyTorch's
    own batch norm, nothing folded, the same result. A parametrized conv weight (which moves out
    of the parameter dict) still folds, with the weight the parametrization computes."""
    from torch.nn.utils import parametrize

    gen, feats, idx, net, want = folding_case(seed)
    with CountFolds() as folds:
        for mode in recording_modes():
            with mode:
                got = run(net, feats, idx, True)
            assert torch.equal(got, want) and folds.calls == 0
            assert any("batch_norm" in op for op in mode.ops), mode.ops
        seen = []
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, i, o: seen.append(type(m).__name__))
        try:
            assert torch.equal(run(net, feats, idx, True), want) and folds.calls == 0
        finally:
            handle.remove()
        assert seen.count("BatchNorm1d") == 4
        assert torch.equal(run(net, feats, idx, True), want) and folds.calls == 4

    class Twice(nn.Module):
        def forward(self, w):
            return w * 2

    plain = copy.deepcopy(net)
    with torch.no_grad():
        plain[1][0].weight.mul_(2)
    want = run(plain, feats, idx, False)
    parametrize.register_parametrization(net[1][0], "weight", Twice())
    assert "weight" not in net[1][0]._parameters
    with CountFolds() as folds:
        assert torch.equal(run(net, feats, idx, True), want) and folds.calls == 4


def test_the_probe_detects_another_formula(monkeypatch):
    """_probe_fold compares against torch's batch norm: an op computing anything else fails it."""
    real = ops._ops.conv_forward_bn

    def unfused_multiply_add(rb, x, w, b, bw, bb, mean, var, eps, relu, krsc=False):
        if krsc:
            w = w.permute(*range(1, w.dim()), 0)
        out = ops.indice_conv(rb, x, w, b)
        scale = (var + eps).sqrt().reciprocal() * (bw if bw is not None else 1)
        shift = (bb if bb is not None else 0) - mean * scale
        out = out * scale + shift  # two roundings instead of one
        return torch.relu(out) if relu else out

    if not modules._probe_fold(torch.float32):
        pytest.skip("the fold is already off on this PyTorch build (see the test above)")
    monkeypatch.setattr(ops._ops, "conv_forward_bn", unfused_multiply_add)
    assert not modules._probe_fold(torch.float32)
    monkeypatch.setattr(ops._ops, "conv_forward_bn", real)


def test_opcheck_and_errors(seed):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, 60, 3, torch.float64)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    w = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64)
    bn = random_bn(gen, 4, torch.float64)
    op = torch.ops.spconv_c.conv_forward_bn.default
    args = (rb, feats, w, None, bn.weight.detach(), bn.bias.detach(), bn.running_mean,
            bn.running_var, bn.eps, True)
    torch.library.opcheck(op, args)
    torch.library.opcheck(op, (rb, feats, w, torch.randn(4, dtype=torch.float64), None, None,
                               bn.running_mean, bn.running_var, 1e-5, False))
    # The modules hand it their KRSC weight [C_out, KD, KH, KW, C_in] (krsc=True): the same
    # bits as the engine's layout, and opcheck's fake kernel sizes the output from C_out.
    krsc = w.reshape(3, 3, 3, 3, 4).permute(4, 0, 1, 2, 3).contiguous()
    krsc_args = (*args[:2], krsc, *args[3:], True)
    torch.library.opcheck(op, krsc_args)
    assert torch.equal(op(*krsc_args), op(*args))
    with pytest.raises(RuntimeError, match=r"a KRSC weight is \[C_out, \*K, C_in\]"):
        op(*args[:2], krsc.reshape(4, -1), *args[3:], True)
    with pytest.raises(RuntimeError, match=r"running_var must be a CPU Double \[4\]"):
        op(rb, feats, w, None, None, None, bn.running_mean, bn.running_var[:3], 1e-3, True)
    with pytest.raises(RuntimeError, match=r"bn_weight must be a CPU Double \[4\].*Float"):
        op(rb, feats, w, None, bn.weight.float(), None, bn.running_mean, bn.running_var, 1e-3,
           True)
    with pytest.raises(RuntimeError, match="float32 / float64 features only"):
        op(rb, feats.half(), w.half(), None, None, None, bn.running_mean.half(),
           bn.running_var.half(), 1e-3, True)
    with pytest.raises(RuntimeError, match="spconv_conv_forward_affine: features have C_in = 2"):
        op(rb, feats[:, :2], w, None, None, None, bn.running_mean, bn.running_var, 1e-3, True)
