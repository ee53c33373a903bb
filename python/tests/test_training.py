"""Training with PyTorch's own machinery: a loss that goes down, DistributedDataParallel over two
processes (gloo, localhost) against a single-process run, and torch.compile against eager."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import spconv_c.pytorch as spconv
from helpers import random_sparse

SHAPE = [8, 8, 8]


def small_net():
    return spconv.SparseSequential(
        spconv.SubMConv3d(3, 8, 3, indice_key="s1"), nn.BatchNorm1d(8), nn.ReLU(),
        spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="d1"), nn.ReLU(),
        spconv.SubMConv3d(8, 8, 3, indice_key="s2"),
        spconv.SparseInverseConv3d(8, 4, 3, indice_key="d1"))


def sample(seed, count=120):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 2, SHAPE, count, 3, dtype=torch.float32)
    target = torch.randn(idx.shape[0], 4, generator=gen)
    return feats, idx, target


def loss_of(net, feats, idx, target):
    out = net(spconv.SparseConvTensor(feats, idx, SHAPE, 2))
    return ((out.features - target) ** 2).mean()


def test_loss_goes_down(seed):
    torch.manual_seed(seed)
    net = small_net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    feats, idx, target = sample(seed)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = loss_of(net, feats, idx, target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("losses", losses[0], "->", losses[-1])
    assert losses[-1] < 0.5 * losses[0]


# ---- DDP ---------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world, port, seed, state, out_dir):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        net = small_net()
        net.load_state_dict(state)
        ddp = nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        feats, idx, target = sample(seed + rank)  # each rank its own sample
        opt.zero_grad()
        loss_of(ddp, feats, idx, target).backward()
        grads = {n: p.grad.clone() for n, p in net.named_parameters()}
        opt.step()
        torch.save({"grads": grads, "params": {n: p.detach().clone()
                                                for n, p in net.named_parameters()}},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_match_single_process(seed, tmp_path):
    torch.manual_seed(seed)
    net = small_net()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    mp.spawn(_ddp_worker, args=(2, _free_port(), seed, state, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # Single process: the mean of the per-sample losses, whose gradient DDP's average equals.
    # (BatchNorm statistics are per rank in DDP, so the reference also normalises per sample.)
    ref = small_net()
    ref.load_state_dict(state)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt.zero_grad()
    total = sum(loss_of(ref, *sample(seed + r)) for r in range(2)) / 2
    total.backward()
    for name, p in ref.named_parameters():
        for r in range(2):
            torch.testing.assert_close(ranks[r]["grads"][name], p.grad, rtol=1e-5, atol=1e-6)
    opt.step()
    for name, p in ref.named_parameters():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(ranks[0]["params"][name], p.detach(), rtol=1e-5, atol=1e-6)


# ---- torch.compile ------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo keeps what it compiled per code object for the process, and past a few
    recompilations of a frame (8) it runs that frame eagerly for good: without a reset, a test
    would see what earlier tests compiled, or no compilation at all."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_torch_compile_matches_eager(seed):
    torch.manual_seed(seed)
    net = small_net().eval()
    feats, idx, _ = sample(seed)

    def run(model):
        x = spconv.SparseConvTensor(feats, idx, SHAPE, 2)
        return model(x).features

    eager = run(net)
    compiled = torch.compile(net, backend="aot_eager")
    torch.testing.assert_close(run(compiled), eager, rtol=1e-6, atol=1e-6)


def recording(backend, graphs):
    """torch.compile backend ``backend`` that keeps every graph Dynamo hands it in ``graphs``."""
    inner = torch._dynamo.lookup_backend(backend)

    def compile_graph(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)
    return compile_graph


def rulebook_ops_in(graphs):
    """The conv / pool operators the graphs call (by name)."""
    return [str(node.target).split("spconv_c.")[1].split(".")[0] for gm in graphs
            for node in gm.graph.nodes
            if node.op == "call_function" and "spconv_c." in str(node.target)]


def train_side_by_side(seed, make, backend, **compile_kwargs):
    """Three SGD steps of a network from ``make()`` and of its twin under torch.compile
    (``backend``), on samples of three sizes (100, 120, 140 sites, so the graphs are compiled
    again with symbolic sizes): the same losses and parameter gradients at every step. float64,
    so that the compiled graph's decompositions of the element-wise layers (batch norm), which
    may round in another order, cannot move the comparison: they differ by a few units of
    2^-52 per step, far inside 1e-9. Returns the two networks and the graphs compiled in the
    first pass."""
    torch.manual_seed(seed)
    eager = make().double()
    compiled_net = make().double()
    compiled_net.load_state_dict(eager.state_dict())
    graphs = []
    compiled = torch.compile(compiled_net, backend=recording(backend, graphs), **compile_kwargs)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, compiled_net)]
    first_pass = None
    for step in range(3):
        feats, idx, target = sample(seed + step, count=100 + 20 * step)
        feats, target = feats.double(), target.double()
        losses = []
        for net, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            loss = loss_of(net, feats, idx, target)
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-9, atol=0)
        for (name, a), b in zip(eager.named_parameters(), compiled_net.parameters()):
            assert b.grad is not None, f"{name}: no gradient through the compiled model"
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12, msg=name)
        for opt in opts:
            opt.step()
        if first_pass is None:
            first_pass = list(graphs)
    return eager, compiled_net, first_pass


def test_torch_compile_trains_as_eager(seed):
    # Training through torch.compile equals eager (train_side_by_side), and every conv runs
    # inside a compiled graph. (Traced, a conv took its rulebook as a fake torchbind object,
    # which skipped its autograd formula: the compiled outputs had no gradient and backward()
    # failed; the convs then ran outside the graphs, a break each, until they took the
    # rulebook's token, ops._call_rulebook_op.) The first pass's graphs hold the four convs of
    # small_net, each in one, and the builds whose sizes are known: two subm builds and the
    # inverse, whose input sites are checked unchanged where the graph runs (check_sites_token;
    # the strided build breaks the graph here: test_torch_compile_whole_graph).
    _, _, graphs = train_side_by_side(seed, small_net, "aot_eager")
    assert sorted(rulebook_ops_in(graphs)) == sorted(
        ["conv_forward_token"] * 4 + ["build_subm_token"] * 2 + ["inverse_token",
                                                                 "check_sites_token"])


def strided_bn_net():
    """small_net with a batch norm after its strided conv too, whose output count is an unbacked
    size when its rulebook is built inside the graph (modules._has_sites)."""
    return spconv.SparseSequential(
        spconv.SubMConv3d(3, 8, 3, indice_key="s1"), nn.BatchNorm1d(8), nn.ReLU(),
        spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="d1"), nn.BatchNorm1d(8), nn.ReLU(),
        spconv.SubMConv3d(8, 8, 3, indice_key="s2"),
        spconv.SparseInverseConv3d(8, 4, 3, indice_key="d1"))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_whole_graph(seed, backend):
    # With torch._dynamo.config.capture_dynamic_output_shape_ops, the strided build is traced
    # too (its output count an unbacked size): the whole network is one graph (fullgraph=True
    # holds), training equals eager (train_side_by_side), and so do the batch norm statistics.
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        eager, compiled_net, graphs = train_side_by_side(seed, strided_bn_net, backend,
                                                         fullgraph=True)
    assert len(graphs) == 1
    assert sorted(rulebook_ops_in(graphs)) == sorted(
        ["conv_forward_token"] * 4 + ["build_subm_token"] * 2
        + ["build_rulebook_token", "inverse_token", "check_sites_token"])
    for a, b in zip(eager.buffers(), compiled_net.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


def avg_pool_net():
    """A network with an average pool, and the inverse conv paired with it."""
    return spconv.SparseSequential(
        spconv.SubMConv3d(3, 8, 3, indice_key="s1"), nn.ReLU(),
        spconv.SparseAvgPool3d(2, 2, indice_key="p1"),
        spconv.SubMConv3d(8, 8, 3, indice_key="s2"),
        spconv.SparseInverseConv3d(8, 4, 2, indice_key="p1"))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_average_pool_in_the_graph(seed, backend):
    # The average pool is an op over the rulebook's token like the max pool (avgpool_forward_token,
    # its backward through avgpool_backward_token): with the strided builds traced, the network
    # is one graph and trains as eager. (It was a graph break each call before: the mean was
    # taken in Python over the handle's pair lists, which a compiled graph cannot read.)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        _, _, graphs = train_side_by_side(seed, avg_pool_net, backend, fullgraph=True)
    assert len(graphs) == 1
    assert sorted(rulebook_ops_in(graphs)) == sorted(
        ["conv_forward_token"] * 3 + ["avgpool_forward_token", "build_rulebook_token"]
        + ["build_subm_token"] * 2 + ["inverse_token", "check_sites_token"])


@pytest.mark.parametrize("capture", [False, True], ids=["strided-build-eager",
                                                     "strided-build-traced"])
def test_writes_between_compiled_calls_are_refused(seed, capture):
    # Compiled code takes the same indices tensor as unchanged (it cannot read versions), so a
    # cached rulebook's sites written into in eager code between two compiled calls that share
    # the cache went unseen: a compiled subm layer of the key reused the stale rulebook. The
    # check now runs inside the graph (ops.check_sites_token), with eager's ValueError; without
    # a write, the compiled layers give eager's outputs.
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 1, SHAPE, 40, 2, dtype=torch.float64)
    first = spconv.SubMConv3d(2, 3, 3, indice_key="k").double()
    second = spconv.SubMConv3d(3, 3, 3, indice_key="k").double()
    down = spconv.SparseConv3d(2, 4, 3, 2, 1, indice_key="d").double()
    inverse = spconv.SparseInverseConv3d(4, 2, 3, indice_key="d").double()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture), torch.no_grad():
        for make, use, says in ((first, second, "written into since"),
                                (down, inverse, "not the output sites .* row for row")):
            compiled_use = torch.compile(use, backend="aot_eager")
            y = torch.compile(make, backend="aot_eager")(
                spconv.SparseConvTensor(feats, idx.clone(), SHAPE, 1))
            torch.testing.assert_close(compiled_use(y).features, use(y).features, rtol=1e-12,
                                       atol=1e-12)
            y.indices[0, 0] = y.indices[0, 0]  # a write in place (the same values)
            with pytest.raises(ValueError, match=says):
                compiled_use(y)
            with pytest.raises(ValueError, match=says):
                use(y)  # as eager code refuses it
            torch._dynamo.reset()


def test_compiled_inference_after_training(seed):
    # Trained compiled first (the strided build breaks the graph, so Dynamo compiles the convs'
    # own frames and runs the SparseSequential's eagerly), then an inference under no_grad:
    # the sequence folds each batch norm into its conv while the conv's frame, compiled, holds
    # a rulebook token, which the folded op does not take (it failed: "Expected ... Rulebook
    # ... found type 'Tensor'"). The conv then applies the batch norm and ReLU as modules.
    torch.manual_seed(seed)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(3, 8, 3, indice_key="s1"), nn.BatchNorm1d(8), nn.ReLU(),
        spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="d1"), nn.ReLU()).double()
    compiled = torch.compile(net, backend="aot_eager")
    feats, idx, _ = sample(seed)
    feats = feats.double()
    compiled(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).features.sum().backward()
    net.eval()
    with torch.no_grad():
        want = net(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).features
        got = compiled(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).features
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_compiled_bad_geometry_names_it():
    # A geometry the engine refuses (an empty output shape) is refused under compile with the
    # same words, the strided build traced (ops.output_shape) or not (the engine's own).
    net = spconv.SparseSequential(spconv.SparseConv3d(2, 2, 3, 2, 0), spconv.ToDense()).double()
    x = spconv.SparseConvTensor(torch.ones(2, 2, dtype=torch.float64),
                                torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.int32),
                                [2, 2, 2], 1)
    for capture in (False, True):
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture):
            for model in (net, torch.compile(net, backend="aot_eager")):
                with pytest.raises(RuntimeError, match="output spatial shape is empty on axis 0"):
                    model(x)
        torch._dynamo.reset()


def test_torch_compile_whole_graph_batch_norm_counts():
    # A batch norm after a strided layer built inside the graph: on 1 output site in training
    # mode it is refused as eager code refuses it; on none (eager code skips it) the compiled
    # graph's assertion fails; a ReLU alone applies to no rows as eager skips it. (The graph
    # asserts what modules._has_sites told tracing, in PyTorch's words: "Runtime assertion
    # failed for expression u0 >= 2"; the message of torch._check is not carried into it.)
    shape, far = [8, 8, 8], [[0, 7, 7, 7]]  # kernel 3, stride 2, no padding: no window holds it

    def net(*tail):
        return spconv.SparseSequential(spconv.SparseConv3d(2, 3, 3, 2, 0), *tail).double()

    def run(model, sites):
        idx = torch.tensor(sites, dtype=torch.int32)
        x = spconv.SparseConvTensor(torch.ones(len(sites), 2, dtype=torch.float64), idx, shape, 1)
        return model(x)

    def empty():
        return spconv.SparseConvTensor(torch.zeros(0, 2, dtype=torch.float64),
                                       torch.zeros(0, 4, dtype=torch.int32), shape, 1)

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        # An empty input: no sites after the strided layer either (a count tracing knows),
        # so the batch norm is skipped as in eager code, in both modes.
        for training in (False, True):
            model = net(nn.BatchNorm1d(3)).train(training)
            want = model(empty()).features
            got = torch.compile(model, backend="aot_eager", fullgraph=True)(empty()).features
            assert got.shape == want.shape == (0, 3)
            torch._dynamo.reset()
        # A batch norm that keeps no running statistics takes batch ones in eval mode too.
        model = net(nn.BatchNorm1d(3, track_running_stats=False).double()).eval()
        sites = [[0, 1, 1, 1], [0, 5, 5, 5], [0, 3, 1, 5]]
        torch.testing.assert_close(
            run(torch.compile(model, backend="aot_eager", fullgraph=True), sites).features,
            run(model, sites).features, rtol=1e-12, atol=1e-12)
        torch._dynamo.reset()
        relu = net(nn.ReLU())
        assert run(torch.compile(relu, backend="aot_eager", fullgraph=True), far).features.shape \
            == (0, 3)
        torch._dynamo.reset()
        with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
            run(net(nn.BatchNorm1d(3).double()), [[0, 1, 1, 1]])  # eager: 1 site
        with pytest.raises(RuntimeError, match=r"assertion failed for expression u\d+ >= 2"):
            run(torch.compile(net(nn.BatchNorm1d(3)).train(), backend="aot_eager"),
                [[0, 1, 1, 1]])
        torch._dynamo.reset()
        bn_eval = net(nn.BatchNorm1d(3)).eval()
        assert run(bn_eval, far).features.shape == (0, 3)  # eager skips the batch norm
        with pytest.raises(RuntimeError, match=r"assertion failed for expression u\d+ >= 1"):
            run(torch.compile(bn_eval, backend="aot_eager"), far)


def test_torch_compile_inductor_follows_sizes(seed):
    # Inductor checks every output's size against the graph's. A rulebook handle entered the
    # graph as a fake object with the sizes of the first one traced, and nothing guarded them:
    # the second sample failed ("expected size 121==113"). Its token is a tensor, whose sizes
    # the graph follows.
    torch.manual_seed(seed)
    net = small_net().double().eval()
    compiled = torch.compile(net, backend="inductor")
    with torch.no_grad():
        for step in range(3):
            feats, idx, _ = sample(seed + step, count=100 + 20 * step)
            x = [spconv.SparseConvTensor(feats.double(), idx, SHAPE, 2) for _ in range(2)]
            torch.testing.assert_close(compiled(x[0]).features, net(x[1]).features, rtol=1e-9,
                                       atol=1e-12)


@pytest.mark.parametrize("capture", [False, True], ids=["strided-build-eager",
                                                     "strided-build-traced"])
def test_sites_cached_under_compile_are_checked_in_eager(seed, capture):
    # Versions cannot be read while torch.compile traces (the cache trusts identity there), but
    # what a compiled layer leaves in the cache must not vouch for its sites afterwards: written
    # into in eager code, they are refused (3-d subm key) or lifted again (2-d inverse conv).
    # The builds inside the graph (the subm one always, the strided one with
    # capture_dynamic_output_shape_ops) leave entries whose versions eager code reads from
    # their rulebooks (IndiceEntry._read_versions).
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture):
        _check_compiled_cache_in_eager(seed)


def _check_compiled_cache_in_eager(seed):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 1, SHAPE, 40, 2, dtype=torch.float64)
    first = spconv.SubMConv3d(2, 3, 3, indice_key="k").double()
    second = spconv.SubMConv3d(3, 3, 3, indice_key="k").double()
    free = [(0, z, y, x) for z in range(SHAPE[0]) for y in range(SHAPE[1]) for x in range(SHAPE[2])
            if not (idx == torch.tensor([0, z, y, x], dtype=torch.int32)).all(1).any()]
    for layer in (first, torch.compile(first, backend="aot_eager")):
        y = layer(spconv.SparseConvTensor(feats, idx.clone(), SHAPE, 1))
        y.indices[0] = torch.tensor(free[0], dtype=torch.int32)  # moved in place
        with pytest.raises(ValueError, match="written into since"):
            second(y)

    plane = [SHAPE[1], SHAPE[2]]
    idx2 = idx[:, [0, 2, 3]].unique(dim=0).contiguous()
    feats2 = torch.randn(idx2.shape[0], 2, generator=gen, dtype=torch.float64)
    down = spconv.SparseConv2d(2, 4, 3, 2, 1, indice_key="d").double()
    inverse = spconv.SparseInverseConv2d(4, 3, 3, indice_key="d").double()
    subm = spconv.SubMConv2d(3, 3, 3).double()
    for layer in (down, torch.compile(down, backend="aot_eager")):
        x = spconv.SparseConvTensor(feats2, idx2.clone(), plane, 1)
        with torch.no_grad():
            y = layer(x)
            x.indices[:, 1:] = torch.tensor(plane, dtype=torch.int32) - 1 - x.indices[:, 1:]
            z = inverse(y)  # its outputs are x's sites as they are now (mirrored)
            got = subm(z).features
            want = subm(spconv.SparseConvTensor(z.features, z.indices.clone(), plane, 1)).features
        assert torch.equal(got, want)


def test_torch_compile_of_the_ops_on_handles(seed):
    # The ops called directly with rulebook handles inside a compiled function: under compile
    # each handle is swapped for its token outside the graph (ops._call_rulebook_op), and two
    # pairs of rulebooks of other sizes through one compiled function give eager's outputs.
    from spconv_c import ops
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(27, 3, 5, generator=gen, dtype=torch.float64)

    def layer(subm, pool, feats):
        return ops.indice_maxpool(pool, ops.indice_conv(subm, feats, w).relu())

    compiled = torch.compile(layer, backend="inductor")
    for count in (60, 90):
        feats, idx = random_sparse(gen, 2, SHAPE, count, 3, dtype=torch.float64)
        subm = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
        pool = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 2, 2)
        torch.testing.assert_close(compiled(subm, pool, feats), layer(subm, pool, feats),
                                   rtol=1e-12, atol=1e-12)
