"""The binding on a GPU: CUDA tensors through the engine's CUDA backend, its memory from PyTorch's
caching allocator, its work on PyTorch's current stream. Skipped (and reported so) where torch
sees no CUDA device, as on the CI machine; tools/gpu-check.sh runs it on a lent GPU."""

import types

import torch

try:
    import pytest
except ImportError:  # the GPU machine may lack pytest; the runner at the end needs only marks
    def _parametrize(arg, values):
        def mark(test):
            test.pytestmark = getattr(test, "pytestmark", []) + [
                types.SimpleNamespace(name="parametrize", args=(arg, values))]
            return test
        return mark

    pytest = types.SimpleNamespace(mark=types.SimpleNamespace(
        parametrize=_parametrize, skipif=lambda *args, **kwargs: None))

import spconv_c  # noqa: F401
from spconv_c import ops
from helpers import random_sparse

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device visible to torch")

SHAPE = [6, 7, 6]


def case(seed, count=60, cin=3, cout=4):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, count, cin)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    w = torch.randn(27, cin, cout, generator=gen, dtype=torch.float64)
    b = torch.randn(cout, generator=gen, dtype=torch.float64)
    return rb, feats, w, b


def test_conv_on_cuda_equals_cpu(seed):
    # float64: the GPU sums in another order, so not bitwise; each output is a sum of at most
    # 27 * 3 products of values below ~4 in magnitude, whose float64 rounding is below 1e-13.
    rb, feats, w, b = case(seed)
    want = ops.indice_conv(rb, feats, w, b)
    f = feats.cuda().requires_grad_(True)
    wc = w.cuda().requires_grad_(True)
    got = ops.indice_conv(rb, f, wc, b.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-10)
    g = torch.randn(got.shape, dtype=torch.float64)
    got.backward(g.cuda())
    f_cpu = feats.clone().requires_grad_(True)
    w_cpu = w.clone().requires_grad_(True)
    ops.indice_conv(rb, f_cpu, w_cpu, b).backward(g)
    torch.testing.assert_close(f.grad.cpu(), f_cpu.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(wc.grad.cpu(), w_cpu.grad, rtol=0, atol=1e-9)


def test_outputs_come_from_the_caching_allocator(seed):
    # The engine's CUDA context allocates through c10's CUDA allocator: an output held by torch
    # shows in torch.cuda.memory_allocated(), and goes back to it when dropped.
    rb, feats, w, b = case(seed, count=200, cin=8, cout=64)
    f, wc = feats.cuda(), w.cuda()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = ops.indice_conv(rb, f, wc, None)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    assert held >= out.numel() * out.element_size(), (held, out.shape)
    del out
    torch.cuda.synchronize()
    # What the op kept besides its output (the context's workspace) stays with the context.
    assert torch.cuda.memory_allocated() - before < held


def test_work_is_ordered_on_the_current_stream(seed):
    # Features written on a side stream behind a long sleep, then the conv on that stream with no
    # synchronisation: only an engine that queues on PyTorch's current stream reads them written.
    rb, feats, w, b = case(seed)
    want = ops.indice_conv(rb, feats, w, b)
    base, wc, bc = feats.cuda(), w.cuda(), b.cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        f = torch.empty_like(base)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the write
        f.copy_(base)
        got = ops.indice_conv(rb, f, wc, bc)
        host = got.to("cpu", non_blocking=False)
    torch.testing.assert_close(host, want, rtol=0, atol=1e-10)


def block_state(address):
    """The caching allocator's state of the block at @p address ('active_allocated',
    'active_pending_free', 'inactive'), from its snapshot; None if no block starts there."""
    for segment in torch.cuda.memory._snapshot()["segments"]:
        at = segment["address"]
        for block in segment["blocks"]:
            if block.get("address", at) == address:
                return block["state"]
            at += block["size"]
    return None


def test_record_stream_reaches_engine_outputs(seed):
    # An engine output is the caching allocator's own block (adopt_cuda_block), so record_stream
    # holds it back while a use on another stream is still queued: after `del` the block is
    # pending its free, not free. A from_blob tensor's record_stream would do nothing, and the
    # block would be free (inactive) at once.
    if torch.cuda.get_allocator_backend() != "native":
        pytest.skip("the allocator snapshot lists blocks only for the native caching allocator")
    rb, feats, w, b = case(seed, count=200, cin=8, cout=64)
    f, wc = feats.cuda(), w.cuda()
    out = ops.indice_conv(rb, f, wc, None)
    ptr = out.data_ptr()
    assert block_state(ptr) == "active_allocated"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the use
        total = out.sum()
    out.record_stream(side)
    del out
    assert block_state(ptr) == "active_pending_free"
    torch.cuda.synchronize()
    assert torch.isfinite(total).item()


@pytest.mark.parametrize("ndim", [3, 2])
def test_modules_on_cuda_indices_equal_cpu(seed, ndim):
    # A spconv user's tensors: features and indices both on the GPU. Rulebooks are built there
    # (bitwise the CPU's, pairs and output sites), every layer runs there, and the outputs and
    # gradients match the same network on the CPU. float64: each output is a sum of at most a
    # few thousand products and batch-norm terms of values of order 10, so the two devices'
    # different summation orders differ by far less than 1e-9. ndim 2: the same network of 2-d
    # layers on the sites seen from above (the 2-d layers' lifting on the device).
    import copy

    import spconv_c.pytorch as ours
    from nets import flattened, make_net

    shape = [12, 12, 12]
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, shape, 300, 4)
    for kind, ksize, stride in ((ops.SUBM, 3, 1), (ops.REGULAR, 3, 2)):
        rb_h = ops.build_rulebook(idx, shape, 2, kind, ksize, stride)
        rb_d = ops.build_rulebook(idx.cuda(), shape, 2, kind, ksize, stride)
        assert rb_d.pairs_in().device.type == "cuda"
        assert torch.equal(rb_d.pairs_in().cpu(), rb_h.pairs_in())
        assert torch.equal(rb_d.pairs_out().cpu(), rb_h.pairs_out())
        assert torch.equal(rb_d.out_indices().cpu(), rb_h.out_indices())
        assert torch.equal(rb_d.pair_offsets(), rb_h.pair_offsets())

    if ndim != 3:
        feats, idx, shape = flattened(feats, idx, shape, ndim)
    torch.manual_seed(seed)
    net = make_net(ours, ndim=ndim).double()
    gpu = copy.deepcopy(net).cuda()
    f_h = feats.clone().requires_grad_(True)
    f_d = feats.cuda().requires_grad_(True)
    want = net(ours.SparseConvTensor(f_h, idx, shape, 2))
    got = gpu(ours.SparseConvTensor(f_d, idx.cuda(), shape, 2))
    for g, w in zip(got, want):
        assert g.device.type == "cuda"
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=1e-9)
    (sum(t.square().sum() for t in want)).backward()
    (sum(t.square().sum() for t in got)).backward()
    torch.testing.assert_close(f_d.grad.cpu(), f_h.grad, rtol=1e-9, atol=1e-9)
    for (name, p_h), p_d in zip(net.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(p_d.grad.cpu(), p_h.grad, rtol=1e-9, atol=1e-9, msg=name)


def test_average_pool_on_cuda_is_the_cpu_bits(seed):
    # The average pool adds offset after offset with one index_add per offset and no repeated
    # rows, so each output takes the same float64 additions in the same order on either device.
    import spconv_c.pytorch as ours

    shape = [10, 10, 10]
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, shape, 400, 5)
    pool = ours.SparseAvgPool3d(3, 2, 1)
    want = pool(ours.SparseConvTensor(feats, idx, shape, 2))
    got = pool(ours.SparseConvTensor(feats.cuda(), idx.cuda(), shape, 2))
    assert torch.equal(got.indices.cpu(), want.indices)
    assert torch.equal(got.features.cpu(), want.features)


def test_token_on_cuda(seed):
    # A rulebook built on the GPU gives a token on the GPU (what torch.compile's graphs take);
    # the token ops run the same kernels as the handle ops: the same bits. A copy is refused.
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, 60, 3)
    rb = ops.build_rulebook(idx.cuda(), SHAPE, 2, ops.REGULAR, 3, 2, 1)
    token = rb.token()
    assert token.device.type == "cuda" and list(token.shape) == [rb.num_in(), rb.num_out(), 0]
    f = feats.cuda()
    w = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64).cuda()
    want = torch.ops.spconv_c.conv_forward(rb, f, w, None)
    assert torch.equal(torch.ops.spconv_c.conv_forward_token(token, f, w, None), want)
    pooled = torch.ops.spconv_c.maxpool_forward(rb, f)
    pooled_t = torch.ops.spconv_c.maxpool_forward_token(token, f)
    assert all(torch.equal(a, b) for a, b in zip(pooled, pooled_t))
    try:
        torch.ops.spconv_c.conv_forward_token(token.clone(), f, w, None)
    except RuntimeError as e:
        assert "not a rulebook token" in str(e), str(e)
    else:
        raise AssertionError("a copy of a token was taken for a rulebook")


@pytest.mark.parametrize("capture", [False, True])
def test_compiled_training_on_cuda(seed, capture):
    # torch.compile (aot_eager) on the GPU: the modules hand the ops rulebook tokens on the
    # device; outputs and gradients equal the eager network's on two inputs of different sizes
    # (float64; the compiled batch norm may round in another order, far inside 1e-9). With
    # capture (capture_dynamic_output_shape_ops) the strided builds run inside the graph too.
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture):
        _compiled_training_on_cuda(seed)
    torch._dynamo.reset()


def _compiled_training_on_cuda(seed):
    import copy

    import spconv_c.pytorch as ours
    from nets import make_net

    shape = [12, 12, 12]
    torch.manual_seed(seed)
    eager = make_net(ours, ndim=3).double().cuda()
    compiled_net = copy.deepcopy(eager)
    compiled = torch.compile(compiled_net, backend="aot_eager")
    gen = torch.Generator().manual_seed(seed)
    for count in (300, 260):
        feats, idx = random_sparse(gen, 2, shape, count, 4)
        results = []
        for net, model in ((eager, eager), (compiled_net, compiled)):
            net.zero_grad()
            f = feats.cuda().requires_grad_(True)
            out = model(ours.SparseConvTensor(f, idx.cuda(), shape, 2))
            (sum(t.square().sum() for t in out)).backward()
            results.append((out, f.grad, [p.grad for p in net.parameters()]))
        (out_e, gf_e, gp_e), (out_c, gf_c, gp_c) = results
        for a, b in zip(out_c, out_e):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(gf_c, gf_e, rtol=1e-9, atol=1e-9)
        for a, b in zip(gp_c, gp_e):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


if __name__ == "__main__":
    # Without pytest (the GPU machine of tools/gpu-check.sh may lack it): every test of this
    # file once, each parametrization too, with a printed seed; a failure raises.
    import inspect
    import random
    import sys
    if not torch.cuda.is_available():
        print("test_cuda_binding: skipped: no CUDA device visible to torch")
        sys.exit(0)
    seed = random.SystemRandom().randrange(2**31)
    count = 0
    for name, test in list(globals().items()):
        if not name.startswith("test_") or not inspect.isfunction(test):
            continue
        cases = [{}]
        for mark in getattr(test, "pytestmark", []):
            if mark.name == "parametrize":
                arg, values = mark.args
                cases = [dict(c, **{arg: v}) for c in cases for v in values]
        for params in cases:
            print(f"test_cuda_binding: {name} {params} (seed {seed})", flush=True)
            test(seed, **params)
            count += 1
    print(f"test_cuda_binding: {count} passed")
