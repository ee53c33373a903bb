"""An inference SparseSequential run in one call into C++ (pytorch/sequence.py) against the
same sequence run layer by layer (SPCONV_C_SEQUENCE_CALL=0): the same output bits, the same
sites, and an indice_key cache that later layers use as they would use the per-layer one (the
same rulebooks, the same tensors shared between entries, the same recorded versions). Random
sequences on random sites, seeds printed; the per-layer path itself is checked against dense
PyTorch elsewhere (test_dense_oracle.py, test_fold_bn.py)."""

import random

import pytest
import torch
from torch import nn

import spconv_c.pytorch as spconv
from spconv_c import ops
from spconv_c.pytorch import sequence
from helpers import random_sparse

SHAPE = [11, 12, 13]
SHAPES = {1: [29], 2: [17, 19], 3: SHAPE}


@pytest.fixture(autouse=True)
def every_length():
    """The one call for sequences of any length here (short ones run layer by layer by
    default, sequence.MIN_LAYERS: test_short_sequences_run_layer_by_layer)."""
    saved = sequence.MIN_LAYERS
    sequence.MIN_LAYERS = 1
    yield
    sequence.MIN_LAYERS = saved


class Calls:
    """Records the steps of every one-call run (their integers, STEP_INTS a step)."""

    def __enter__(self):
        self.saved = sequence._runner
        runner = sequence._the_runner()
        self.steps = []
        outer = self

        class Runner:
            def run(self, *args):
                outer.steps.append(list(args[5]))
                return runner.run(*args)
        sequence._runner = Runner()
        return self

    def __exit__(self, *exc):
        sequence._runner = self.saved

    def counts(self):
        return [len(s) // sequence.STEP_INTS for s in self.steps]

    def sources(self):
        return [s[i + 2] for s in self.steps for i in range(0, len(s), sequence.STEP_INTS)]


def per_layer(fn):
    saved = sequence.ENABLED
    sequence.ENABLED = False
    try:
        return fn()
    finally:
        sequence.ENABLED = saved


def random_bn(gen, c, dtype):
    bn = nn.BatchNorm1d(c, eps=1e-3, affine=bool(torch.randint(0, 4, (1,), generator=gen)),
                        dtype=dtype).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=gen, dtype=dtype))
        bn.running_var.copy_(torch.rand(c, generator=gen, dtype=dtype) * 2 + 0.1)
        if bn.affine:
            bn.weight.copy_(torch.randn(c, generator=gen, dtype=dtype))
            bn.bias.copy_(torch.randn(c, generator=gen, dtype=dtype))
    return bn


def layer_classes(ndim):
    """(SubMConv, SparseConv, SparseConvTranspose, SparseMaxPool, SparseInverseConv) of ndim."""
    return tuple(getattr(spconv, f"{name}{ndim}d") for name in
                 ("SubMConv", "SparseConv", "SparseConvTranspose", "SparseMaxPool",
                  "SparseInverseConv"))


def random_net(seed, dtype, c_in, ndim=3):
    """A random inference sequence of what the one call takes: subm convs (keys shared at a
    level of sites, or none), strided and transposed convs and max pools (each with a key),
    blocks (a nested SparseSequential of conv, batch norm and perhaps a ReLU), batch norms
    directly after a conv, biases or none; ``ndim``-d layers. Returns (net, the keys of its
    strided layers)."""
    subm_conv, sparse_conv, transposed_conv, max_pool, _ = layer_classes(ndim)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    layers, strided = [], []
    c = c_in
    level_key = "s_in"  # (a name no later level takes: a key's subm layers share their sites)
    downs = ups = 0
    for n in range(rng.randint(3, 8)):
        what = rng.choice(["subm", "subm", "subm", "down", "up", "pool"])
        if what == "down" and downs < 2:
            downs += 1
            key = f"d{n}"
            strided.append(key)
            c_out = rng.randint(1, 9)
            layer = sparse_conv(c, c_out, rng.choice([2, 3]), 2, rng.choice([0, 1]),
                                bias=rng.random() < 0.3, indice_key=key)
            level_key = f"s{n}"
        elif what == "up" and ups < 1:
            ups += 1
            key = f"u{n}"
            strided.append(key)
            c_out = rng.randint(1, 9)
            layer = transposed_conv(c, c_out, 2, 2, bias=rng.random() < 0.3, indice_key=key)
            level_key = f"s{n}"
        elif what == "pool" and downs < 2:
            downs += 1
            key = f"p{n}"
            strided.append(key)
            layers.append(max_pool(2, 2, indice_key=key))
            level_key = f"s{n}"
            continue
        else:
            c_out = rng.randint(1, 9)
            layer = subm_conv(c, c_out, 3, bias=rng.random() < 0.3,
                              indice_key=level_key if rng.random() < 0.8 else None)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
        layer = layer.to(dtype)
        shape = rng.choice(["plain", "block", "block_relu", "bn"])
        if shape == "plain":
            layers.append(layer)
        elif shape == "bn":
            layers += [layer, random_bn(gen, c_out, dtype)]
        else:
            inner = [layer, random_bn(gen, c_out, dtype)]
            if shape == "block_relu":
                inner.append(nn.ReLU())
            layers.append(spconv.SparseSequential(*inner))
        c = c_out
    return spconv.SparseSequential(*layers).eval(), strided


def signature(out, x):
    """What a later layer can tell of an output and its cache: the features' bits, the sites,
    each entry's geometry, rulebook pairs, index values and recorded versions, and which
    index tensors and shape lists are the same object (numbered in order of appearance).
    (Not Rulebook.sites_version(), which the one call leaves at -2 where the layers may have
    built from rows they checked: docs/pytorch.md.)"""
    ids = {}

    def tensor_id(t):
        return ids.setdefault(id(t), len(ids))

    def lift(t):  # a 1-d / 2-d tensor's kept lifted rows (core.SparseConvTensor.lifted_sites)
        kept = t.__dict__.get("_lift")
        return kept and (tensor_id(kept[0]), kept[1], tensor_id(kept[2]), kept[2].tolist(),
                         kept[3])

    sig = [out.features.dtype, out.features.shape, out.features.view(-1).tolist(),
           out.indices.tolist(), list(out.spatial_shape), tensor_id(x.indices),
           tensor_id(out.indices), tensor_id(x.spatial_shape), tensor_id(out.spatial_shape),
           lift(x), lift(out)]
    for key, e in out.indice_dict.items():
        rb = e.rulebook
        sig.append((key, e.kind, e.ksize, e.stride, e.padding, e.dilation, e.batch_size,
                    e.ndim, list(e.spatial_shape), list(e.out_spatial_shape),
                    e.indices.tolist(), e.out_indices.tolist(), tensor_id(e.indices),
                    tensor_id(e.out_indices), tensor_id(e.spatial_shape),
                    tensor_id(e.out_spatial_shape), e.in_version, e.out_version,
                    rb.pair_offsets().tolist(), rb.pairs_in().tolist(), rb.pairs_out().tolist(),
                    e.nd_indices is not None and (tensor_id(e.nd_indices),
                                                  e.nd_indices.tolist()), e.nd_version))
    return sig


def sparse_input(seed, dtype, c_in, count=220, batch=2, ndim=3):
    """Features and ``ndim``-d sites in SHAPES[ndim]."""
    gen = torch.Generator().manual_seed(seed + 1)
    shape = SHAPES[ndim]
    feats, idx = random_sparse(gen, batch, [1] * (3 - ndim) + shape, min(count, batch *
                               int(torch.tensor(shape).prod()) // 2), c_in, dtype)
    return feats, torch.cat([idx[:, :1], idx[:, 4 - ndim:]], 1).contiguous()


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_call_equals_layer_by_layer(seed, dtype, ndim):
    # (A 1-d / 2-d sequence runs on its lifted sites: its entries hold lifted sites and its
    # strided layers' entries the nd indices their inverse conv gives back; the signature
    # compares those and the rows kept with the output's nd indices.)
    shape = SHAPES[ndim]
    subm_conv, _, _, _, inverse_conv = layer_classes(ndim)
    for trial in range(6):
        s = seed + 1000 * trial
        c_in = 1 + s % 5
        net, strided = random_net(s, dtype, c_in, ndim)
        feats, idx = sparse_input(s, dtype, c_in, ndim=ndim)
        with torch.no_grad(), Calls() as calls:
            x = spconv.SparseConvTensor(feats, idx, shape, 2)
            got = net(x)
        assert calls.counts() and sum(calls.counts()) >= 1, (s, net)
        with torch.no_grad():
            x_ref = spconv.SparseConvTensor(feats, idx, shape, 2)
            want = per_layer(lambda: net(x_ref))
        assert signature(got, x) == signature(want, x_ref), (s, net)
        # (A network whose layers refuse it, one by one, is refused alike: test_errors_*.)
        # The caches serve the layers after the sequence alike: a subm layer of the last
        # level's key (reused, or built on known sites) and the inverse of the last strided
        # layer (which needs the output to be that layer's sites, row for row, unchanged).
        c = got.features.shape[1]
        gen = torch.Generator().manual_seed(s + 7)
        after = [subm_conv(c, 3, 3, indice_key="later").to(dtype)]
        if strided and strided[-1] in got.indice_dict and not strided[-1].startswith("u"):
            last = got.indice_dict[strided[-1]]
            sites = got.indices if ndim == 3 else got._lift[2]
            if last.out_indices is sites:
                after.append(inverse_conv(3, 2, last.ksize[3 - ndim:], strided[-1]).to(dtype))
        follow = spconv.SparseSequential(*after)
        with torch.no_grad():
            for p in follow.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype))
            a = per_layer(lambda: follow(got))
            b = per_layer(lambda: follow(want))
        assert signature(a, x) == signature(b, x_ref), (s, net)


def test_short_sequences_run_layer_by_layer(seed):
    """A sequence that starts with fewer sparse layers the walk could take than
    sequence.MIN_LAYERS (3), nested ones counted, runs layer by layer, with no walk (its walk
    and call cost what they save); one of that many runs in one call; both give the same
    bits. The count stops at a layer the walk never takes (here an inverse conv, a 1x1 conv,
    a module on features it does not fold)."""
    sequence.MIN_LAYERS = 3
    dtype = torch.float64
    feats, idx = sparse_input(seed, dtype, 3)

    def block(cin, cout, key):
        return spconv.SparseSequential(spconv.SubMConv3d(cin, cout, 3, indice_key=key),
                                       nn.BatchNorm1d(cout).eval(), nn.ReLU())
    nets = [(1, spconv.SparseSequential(block(3, 4, "a"))),
            (2, spconv.SparseSequential(block(3, 4, "a"), spconv.SparseConv3d(4, 2, 3, 2, 1,
                                                                              indice_key="d"),
                                        nn.ReLU(), spconv.SparseInverseConv3d(2, 2, 3, "d"),
                                        spconv.SubMConv3d(2, 2, 3))),
            (1, spconv.SparseSequential(block(3, 4, "a"), spconv.SubMConv3d(4, 4, 1),
                                        block(4, 4, "a"), block(4, 4, "a"))),
            (0, spconv.SparseSequential(nn.Dropout(0.0), block(3, 4, "a"), block(4, 4, "a"),
                                        block(4, 4, "a"))),
            (3, spconv.SparseSequential(block(3, 4, "a"), spconv.SparseSequential(
                block(4, 4, "a"), spconv.SparseMaxPool3d(2, 2))))]
    for layers, net in nets:
        net = net.to(dtype).eval()
        assert sequence._layer_count(net._modules.values(), 3)[0] == layers
        with torch.no_grad(), Calls() as calls:
            x = spconv.SparseConvTensor(feats, idx, SHAPE, 2)
            got = net(x)
        assert calls.counts() == ([] if layers < 3 else [3]), layers
        with torch.no_grad():
            x_ref = spconv.SparseConvTensor(feats, idx, SHAPE, 2)
            want = per_layer(lambda: net(x_ref))
        assert signature(got, x) == signature(want, x_ref), layers
    assert sequence._layer_count([block(3, 3, None) for _ in range(5)], 2) == (2, False)


def test_a_walk_that_takes_nothing_leaves_the_input(seed):
    """Found by a hostile review: the walk of a 2-d sequence lifted its input's sites (and kept
    the rows with its indices) before it knew that it would take a layer; when it took none
    (a ReLU first), the layers after shared the input's rows, not rows of their own."""
    sequence.MIN_LAYERS = 0  # (walk whatever the count: a ReLU first ends it at 0)
    feats, idx = sparse_input(seed, torch.float64, 3, ndim=2)
    net = spconv.SparseSequential(nn.ReLU(), *[spconv.SubMConv2d(3, 3, 3, indice_key="b")
                                               for _ in range(3)]).double().eval()
    with torch.no_grad(), Calls() as calls:
        x = spconv.SparseConvTensor(feats, idx, SHAPES[2], 2)
        got = net(x)
    assert calls.steps == [] and "_lift" not in x.__dict__
    with torch.no_grad():
        x_ref = spconv.SparseConvTensor(feats, idx, SHAPES[2], 2)
        want = per_layer(lambda: net(x_ref))
    assert signature(got, x) == signature(want, x_ref)


def test_sources_follow_the_cache(seed):
    """The walk takes a rulebook where the layers would: a subm key cached by an earlier call
    on the same sites is reused (not rebuilt), a new key on sites a cached rulebook knows is
    built on them (not from the checked rows), and only sites nothing knows are checked."""
    dtype = torch.float64
    feats, idx = sparse_input(seed, dtype, 3)
    first = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key="a"),
                                    spconv.SubMConv3d(4, 4, 3, indice_key="a")).to(dtype)
    second = spconv.SparseSequential(spconv.SubMConv3d(4, 4, 3, indice_key="a"),
                                     spconv.SubMConv3d(4, 5, 3, indice_key="b"),
                                     spconv.SparseConv3d(5, 2, 3, 2, 1, indice_key="c"),
                                     spconv.SubMConv3d(2, 2, 3, indice_key="e")).to(dtype)
    with torch.no_grad(), Calls() as calls:
        y = first(spconv.SparseConvTensor(feats, idx, SHAPE, 2))
        z = second(y)
    # (A subm entry's output sites are its input's: conv._known_sites finds them as those.)
    assert calls.sources() == [sequence._FROM_INDICES, sequence._REUSE, sequence._REUSE,
                               sequence._ON_OUTPUTS, sequence._ON_INPUTS, sequence._ON_OUTPUTS]
    assert z.indice_dict["a"] is y.indice_dict["a"]  # reused, not stored again
    with torch.no_grad():
        y_ref = per_layer(lambda: first(spconv.SparseConvTensor(feats, idx, SHAPE, 2)))
        z_ref = per_layer(lambda: second(y_ref))
    assert signature(z, y) == signature(z_ref, y_ref)


def test_what_the_walk_leaves_to_the_layers(seed):
    """A module the walk does not take ends the one call there: the layers before it run in
    one call, the rest one by one; nothing the walk does not take ever runs in it."""
    dtype = torch.float32
    feats, idx = sparse_input(seed, dtype, 4)

    def net(*middle):
        return spconv.SparseSequential(
            spconv.SparseSequential(spconv.SubMConv3d(4, 6, 3, indice_key="a"),
                                    nn.BatchNorm1d(6).eval(), nn.ReLU()),
            spconv.SparseConv3d(6, 5, 3, 2, 1, indice_key="d"),
            *middle,
            spconv.SubMConv3d(5, 5, 3, indice_key="b")).to(dtype)

    class MySubM(spconv.SubMConv3d):
        pass

    hooked = spconv.SubMConv3d(5, 5, 3, indice_key="b")
    hooked.register_forward_hook(lambda m, i, o: None)
    cases = {"a ReLU on its own": nn.ReLU(), "an inverse conv": None,
             "a subclass": MySubM(5, 5, 3, indice_key="b"), "a hook": hooked,
             "a 1x1 conv": spconv.SubMConv3d(5, 5, 1, indice_key="one"),
             "a batch norm in training mode": nn.BatchNorm1d(5),
             "another weight dtype": spconv.SubMConv3d(5, 5, 3, indice_key="b").double()}
    for name, middle in cases.items():
        if middle is None:
            model = spconv.SparseSequential(
                spconv.SubMConv3d(4, 5, 3, indice_key="a"),
                spconv.SparseConv3d(5, 5, 3, 2, 1, indice_key="d"),
                spconv.SparseInverseConv3d(5, 5, 3, indice_key="d"),
                spconv.SubMConv3d(5, 5, 3, indice_key="a")).to(dtype)
        else:
            model = net(middle)
            if name == "another weight dtype":
                model[2].double()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
        model.eval()
        if name == "a batch norm in training mode":
            model[2].train()
        with torch.no_grad(), Calls() as calls:
            x = spconv.SparseConvTensor(feats, idx, SHAPE, 2)
            got = model(x)
        assert calls.counts() == [2], (name, calls.counts())  # the first block and the strided
        with torch.no_grad():
            x_ref = spconv.SparseConvTensor(feats, idx, SHAPE, 2)
            if name == "a batch norm in training mode":
                model[2].running_mean.zero_()
                model[2].running_var.fill_(1)
                model[2].num_batches_tracked.zero_()
            want = per_layer(lambda: model(x_ref))
        assert signature(got, x) == signature(want, x_ref), name


def test_no_one_call_where_something_watches(seed):
    """Gradients recorded, half precision: the layers run one by one."""
    feats, idx = sparse_input(seed, torch.float32, 3)
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key="a"),
                                  spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d"))
    with Calls() as calls:
        out = net(spconv.SparseConvTensor(feats.requires_grad_(), idx, SHAPE, 2))
        assert out.features.requires_grad
        with torch.no_grad():
            net.half()(spconv.SparseConvTensor(feats.half(), idx, SHAPE, 2))
    assert calls.steps == []


def test_errors_are_the_layers(seed):
    """An error inside the one call is raised by the layers run one by one: the same message,
    and the cache as far as the layers filled it."""
    feats, idx = sparse_input(seed, torch.float64, 3)
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key="a"),
                                  spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d"),
                                  spconv.SubMConv3d(4, 4, 3, indice_key="b")).double()
    bad = idx.clone()
    bad[5, 2] = SHAPE[1]  # outside the grid
    messages, caches = [], []
    for one_call in (True, False):
        x = spconv.SparseConvTensor(feats, bad, SHAPE, 2)
        with torch.no_grad(), pytest.raises(RuntimeError) as err:
            if one_call:
                net(x)
            else:
                per_layer(lambda: net(x))
        messages.append(str(err.value))
        caches.append(sorted(x.indice_dict))
    assert messages[0] == messages[1] and "row 5" in messages[0]
    assert caches[0] == caches[1]
    # Channels that do not chain: the layer's own ValueError.
    with torch.no_grad(), pytest.raises(ValueError, match=r"expects features \[N, 3\]"):
        net(spconv.SparseConvTensor(feats[:, :2].contiguous(), idx, SHAPE, 2))


def test_weights_are_read_every_call(seed):
    """Nothing is kept between calls: a weight written in place, a parameter replaced, a batch
    norm's statistics changed: the next call uses them."""
    feats, idx = sparse_input(seed, torch.float64, 3)
    net = spconv.SparseSequential(
        spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key="a"),
                                nn.BatchNorm1d(4).eval(), nn.ReLU()),
        spconv.SparseConv3d(4, 2, 3, 2, 1, indice_key="d")).double().eval()

    def both():
        with torch.no_grad():
            got = net(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).features
            want = per_layer(lambda: net(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).features)
        assert torch.equal(got, want)
        return got

    first = both()
    with torch.no_grad():
        net[0][0].weight.mul_(-1)
    second = both()
    net[1].weight = nn.Parameter(net[1].weight.detach() * 3)
    third = both()
    with torch.no_grad():
        net[0][1].running_var.fill_(9)
    fourth = both()
    assert not torch.equal(first, second) and not torch.equal(second, third)
    assert not torch.equal(third, fourth)


def test_runner_refuses_malformed_steps():
    """The runner is internal, but a malformed step list is an error, not a crash."""
    runner = sequence._the_runner()
    feats = torch.zeros(1, 1, dtype=torch.float64)
    idx = torch.zeros(1, 4, dtype=torch.int32)
    geometry = [3, 3, 3, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    step = [0, ops.SUBM, sequence._REUSE, 5] + geometry + [0, 0]
    with pytest.raises(RuntimeError, match="names rulebook 5"):
        runner.run(feats, idx, [2, 2, 2], 1, [], step, [None] * 6, [0.0])
    with pytest.raises(RuntimeError, match="whole steps"):
        runner.run(feats, idx, [2, 2, 2], 1, [], step[:-1], [None] * 6, [0.0])
    step[2] = sequence._FROM_INDICES
    with pytest.raises(RuntimeError, match="without a weight"):
        runner.run(feats, idx, [2, 2, 2], 1, [], step, [None] * 6, [0.0])


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_to_dense_ends_the_call(seed, ndim):
    """A ToDense in the outer sequence is the call's last step (the dense map of the sites so
    far; a 1-d / 2-d one [B, C, *its spatial shape]); what follows it takes the dense tensor,
    layer by layer. A ToDense inside a nested sequence ends that sequence's call the same
    way."""
    shape = SHAPES[ndim]
    for trial in range(3):
        s = seed + 1000 * trial
        net, _ = random_net(s, torch.float32, 3, ndim)
        feats, idx = sparse_input(s, torch.float32, 3, ndim=ndim)
        model = spconv.SparseSequential(*net, spconv.ToDense(), nn.Flatten(1, 2))
        nested = spconv.SparseSequential(spconv.SparseSequential(*net, spconv.ToDense()),
                                         nn.Flatten(1, 2))
        for m in (model, nested):
            with torch.no_grad(), Calls() as calls:
                x = spconv.SparseConvTensor(feats, idx, shape, 2)
                got = m(x)
            assert calls.steps and calls.steps[-1][-sequence.STEP_INTS] == sequence._TO_DENSE
            with torch.no_grad():
                x_ref = spconv.SparseConvTensor(feats, idx, shape, 2)
                want = per_layer(lambda: m(x_ref))
            assert got.shape == want.shape and torch.equal(got, want), s
            fake = got.new_zeros(0, 1)  # the caches compared through an output of no sites
            assert (signature(x._derive(fake, x.indices, x.spatial_shape), x)
                    == signature(x_ref._derive(fake, x_ref.indices, x_ref.spatial_shape), x_ref))


def test_what_a_user_may_have_changed(seed, monkeypatch):
    """Found by a hostile review: a SparseConvTensor subclass, tensor subclasses (whose own
    dispatch sees the ops layer by layer), a layer class's method replaced, a geometry attribute
    of another type, channel attributes that no longer describe the weights, and a cached key
    reused from equal rows in another tensor: the same as layer by layer, and no one call where
    it would skip what the user put there."""
    feats, idx = sparse_input(seed, torch.float64, 3)

    def make():
        gen = torch.Generator().manual_seed(seed)
        net = spconv.SparseSequential(
            spconv.SubMConv3d(3, 4, 3, indice_key="a"), nn.BatchNorm1d(4).eval(), nn.ReLU(),
            spconv.SparseConv3d(4, 5, 3, 2, 1, indice_key="d"),
            spconv.SubMConv3d(5, 2, 3, indice_key="b")).double()
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
        return net

    def both(net, make_input):
        outcomes = []
        for one_call in (True, False):
            x = make_input()
            with torch.no_grad(), Calls() as calls:
                try:
                    out = net(x) if one_call else per_layer(lambda: net(x))
                    outcomes.append(("out", signature(out, x)))
                except Exception as e:
                    outcomes.append(("err", type(e), str(e), sorted(x.indice_dict)))
            if one_call:
                steps = calls.counts()
        assert outcomes[0] == outcomes[1]
        return steps

    class MySparse(spconv.SparseConvTensor):
        @property
        def features(self):
            return self._features.clamp(-1, 1)

    class MyTensor(torch.Tensor):
        pass

    net = make()
    assert both(net, lambda: spconv.SparseConvTensor(feats, idx, SHAPE, 2)) == [3]
    assert both(net, lambda: MySparse(feats, idx, SHAPE, 2)) == []
    assert both(net, lambda: spconv.SparseConvTensor(feats.as_subclass(MyTensor), idx, SHAPE,
                                                     2)) == []
    # A forward replaced on a class (for logging, say) is called, as layer by layer.
    seen = []
    plain = spconv.SparseConv3d.forward
    monkeypatch.setattr(spconv.SparseConv3d, "forward",
                        lambda self, x: seen.append(1) or plain(self, x))
    assert both(net, lambda: spconv.SparseConvTensor(feats, idx, SHAPE, 2)) == [1]
    assert len(seen) == 2
    monkeypatch.undo()
    # A ReLU whose forward is set on the instance, after a folded batch norm: called, both
    # ways (the batch norm folds into the conv in one call; the ReLU runs as set).
    block = make()
    relu = block[2]
    relu.forward = lambda x: nn.functional.relu(x) * 2
    assert both(block, lambda: spconv.SparseConvTensor(feats, idx, SHAPE, 2)) == [1]
    # Attributes set to other types: what the layers make of them (here an error, with the
    # cache as the layers leave it).
    odd = make()
    odd[3].padding = 1
    assert both(odd, lambda: spconv.SparseConvTensor(feats, idx, SHAPE, 2)) == []
    # A weight replaced by one of other channels than the attributes say: the next layer's
    # check of its features is the layers' ValueError.
    stale = make()
    stale[3].weight = nn.Parameter(torch.randn(6, 3, 3, 3, 4, dtype=torch.float64))
    both(stale, lambda: spconv.SparseConvTensor(feats, idx, SHAPE, 2))
    # A cached subm key reused from a tensor of equal rows: the layer hands on the cached
    # entry's index tensor, and the entries after it name that one.
    first = spconv.SparseSequential(spconv.SubMConv3d(3, 3, 3, indice_key="a"),
                                    spconv.SubMConv3d(3, 3, 3, indice_key="a")).double()
    with torch.no_grad():
        cache = first(spconv.SparseConvTensor(feats, idx, SHAPE, 2)).indice_dict

    def from_clone():
        return spconv.SparseConvTensor(feats, idx.clone(), SHAPE, 2, indice_dict=dict(cache))
    assert both(make(), from_clone) == [3]


def test_a_profiler_sees_the_steps(seed):
    """The call and each of its steps are recorded as the ops the layers would call."""
    feats, idx = sparse_input(seed, torch.float32, 3)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(3, 4, 3, indice_key="a"), nn.BatchNorm1d(4).eval(),
        spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d"), spconv.SparseMaxPool3d(2, 2),
        spconv.ToDense())
    with torch.no_grad(), torch.profiler.profile(activities=[
            torch.profiler.ProfilerActivity.CPU]) as prof:
        net(spconv.SparseConvTensor(feats, idx, SHAPE, 2))
    names = {e.name for e in prof.events()}
    assert {"spconv_c::run_sequence", "spconv_c::build_rulebook", "spconv_c::build_rulebook_on",
            "spconv_c::conv_forward_bn", "spconv_c::conv_forward",
            "spconv_c::maxpool_inference", "spconv_c::sparse_to_dense"} <= names, names
