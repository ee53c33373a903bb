"""The operators themselves: gradcheck in float64, torch.library.opcheck (schema, fake kernel,
autograd registration), zero-copy outputs, and bad input reaching Python as the engine's
message."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import spconv_c  # noqa: F401
import spconv_c.pytorch as spconv
from spconv_c import ops
from helpers import random_sparse, recording_modes

SHAPE = [5, 6, 5]


def small_input(seed, channels=2, count=30, batch=2):
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, batch, SHAPE, count, channels)
    return gen, feats, idx


def rulebooks(idx):
    regular = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1)
    transposed = ops.build_rulebook(idx, SHAPE, 2, ops.TRANSPOSED, 2, 2, 0)
    return {
        "regular": regular,
        "subm": ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3),
        "transposed": transposed,
        "inverse": ops.inverse_rulebook(regular),
        "inverse of transposed": ops.inverse_rulebook(transposed),
    }


# First derivatives by gradcheck; second ones (the backward ops' own autograd) by gradgradcheck,
# which compares the gradient of the analytic backward with finite differences of it.
CHECKS = {1: gradcheck, 2: gradgradcheck}


# The conv and pool ops take a rulebook as a handle (conv_forward, ...) or as its token, a tensor
# (conv_forward_token, ...: what the modules hand them under torch.compile); both are checked.
FORMS = ["handle", "token"]


def as_form(rb, form):
    return rb.token() if form == "token" else rb


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("kind", ["regular", "subm", "transposed", "inverse",
                                  "inverse of transposed"])
def test_conv_gradcheck(seed, kind, order, form):
    gen, feats, idx = small_input(seed, count=30 if order == 1 else 20)
    rb = rulebooks(idx)[kind]
    cin, cout = 2, 3
    if kind.startswith("inverse"):  # its input lives on the inverted conv's output sites
        feats = torch.randn(rb.num_in(), cin, generator=gen, dtype=torch.float64)
    kv = rb.kernel_volume()
    w = torch.randn(kv, cin, cout, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(cout, generator=gen, dtype=torch.float64, requires_grad=True)
    f = feats.detach().requires_grad_(True)
    arg = as_form(rb, form)
    assert CHECKS[order](lambda f, w, b: ops.indice_conv(arg, f, w, b), (f, w, b))


def test_conv_double_backward_of_one_input(seed):
    # Only some inputs need gradients: the double backward computes just those, and a 5-d
    # weight keeps its shape.
    gen, feats, idx = small_input(seed, count=20)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    w = torch.randn(3, 3, 3, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(lambda w: ops.indice_conv(rb, feats, w), (w,))
    f = feats.detach().requires_grad_(True)
    assert gradgradcheck(lambda f: ops.indice_conv(rb, f, w.detach()), (f,))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("order", [1, 2])
def test_maxpool_gradcheck(seed, order, form):
    _, feats, idx = small_input(seed, count=40)
    rb = as_form(ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 2, 2, 0), form)
    # Distinct values keep every maximum away from ties, where max is not differentiable.
    f = (torch.randperm(feats.numel(), dtype=torch.float64).view(feats.shape) / 7.0 - 3.0)
    f.requires_grad_(True)
    assert CHECKS[order](lambda f: ops.indice_maxpool(rb, f), (f,))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("kind", ["regular", "transposed", "inverse"])
def test_avgpool_gradcheck(seed, kind, order, form):
    gen, feats, idx = small_input(seed, count=30 if order == 1 else 20)
    rb = rulebooks(idx)[kind]
    f = torch.randn(rb.num_in(), 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert CHECKS[order](lambda f: ops.indice_avgpool(as_form(rb, form), f), (f,))


@pytest.mark.parametrize("kind", ["regular", "subm", "transposed", "inverse"])
def test_avgpool_is_the_mean_over_pairs(seed, kind):
    """The average pool op over any rulebook against a brute force over its pair lists: each
    output the float64 mean of its pairs' inputs, 0 where it has none (an inverse rulebook's
    outputs outside every window: a regular kernel 1, stride 2 rulebook leaves most of them)."""
    gen, feats, idx = small_input(seed, count=40)
    rb = rulebooks(idx)[kind]
    if kind == "inverse":
        rb = ops.inverse_rulebook(ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 1, 2, 0))
    f = torch.randn(rb.num_in(), 3, generator=gen, dtype=torch.float64)
    sums = [[0.0] * 3 for _ in range(rb.num_out())]
    counts = [0] * rb.num_out()
    for i, o in zip(rb.pairs_in().tolist(), rb.pairs_out().tolist()):
        counts[o] += 1
        sums[o] = [a + b for a, b in zip(sums[o], f[i].tolist())]
    want = torch.tensor([[v / max(n, 1) for v in row] for row, n in zip(sums, counts)],
                        dtype=torch.float64).view(rb.num_out(), 3)
    if kind == "inverse":
        assert 0 in counts and max(counts) == 1  # outputs without pairs are part of the check
    got = ops.indice_avgpool(rb, f)
    # Sums of up to 27 values of size ~3: 1e-12 is ~100 times their float64 rounding error.
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(ops.indice_avgpool(rb.token(), f), got)
    for bad, says in [(f[1:], r"features must be \[%d, C\]" % rb.num_in()),
                      (f.int(), "features must be floating")]:
        with pytest.raises(RuntimeError, match=r"^spconv_c\.avgpool_forward: " + says):
            torch.ops.spconv_c.avgpool_forward(rb, bad)
    with pytest.raises(RuntimeError, match=r"^spconv_c\.avgpool_backward_token: grad_out must"):
        torch.ops.spconv_c.avgpool_backward_token(rb.token(), got[1:])


def test_maxpool_inference_is_the_forward_without_argmax(seed):
    """In inference the modules' max pool skips the argmax (maxpool_inference): the same bits
    as maxpool_forward's output, NaNs and all-negative windows included; with gradients
    recorded the argmax is made for the backward."""
    gen, feats, idx = small_input(seed, count=40, channels=3)
    regular = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 2, 2, 0)
    for rb in (regular, ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1)):
        f = torch.randn(rb.num_in(), 3, generator=gen, dtype=torch.float64) - 5.0
        torch.library.opcheck(torch.ops.spconv_c.maxpool_inference.default, (rb, f))
        f[::7, 1] = float("nan")
        want = torch.ops.spconv_c.maxpool_forward(rb, f)[0]
        got = torch.ops.spconv_c.maxpool_inference(rb, f)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
    mode = recording_modes()[0]
    with torch.no_grad(), mode:
        ops.indice_maxpool(regular, feats)
    assert [op for op in mode.ops if "spconv_c" in op] == ["spconv_c.maxpool_inference.default"]
    f = feats.detach().requires_grad_(True)
    mode = recording_modes()[0]
    with mode:
        ops.indice_maxpool(regular, f).sum().backward()
    assert "spconv_c.maxpool_forward.default" in mode.ops and f.grad is not None


def test_avgpool_over_a_window_as_large_as_the_grid(seed):
    """A window over the whole grid (a global pool written as an average pool): each batch
    entry's one output is the mean of its sites. Its kernel has 12 x 10^6 offsets, of which the
    op walks only those with pairs (walking them all took seconds and gigabytes on a KITTI
    grid)."""
    gen = torch.Generator().manual_seed(seed)
    shape = [30, 400, 1000]
    feats, idx = random_sparse(gen, 2, shape, 300, 3)
    rb = ops.build_rulebook(idx, shape, 2, ops.REGULAR, shape, shape, 0)
    assert rb.num_out() == 2 and rb.kernel_volume() == 30 * 400 * 1000
    got = ops.indice_avgpool(rb, feats)
    batch = rb.out_indices()[:, 0].long()
    want = torch.stack([feats[idx[:, 0] == b].mean(0) for b in batch.tolist()])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_token_copied_to_meta_is_refused(seed):
    # Beside real tensors a meta "token" sends the call to the fake kernels, which would return
    # an uninitialised tensor of the features' device; it stands for no rulebook (a copy).
    gen, feats, idx = small_input(seed)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1)
    meta = rb.token().to("meta")
    w = torch.randn(27, 2, 3, generator=gen, dtype=torch.float64)
    for call in (lambda: ops.indice_avgpool(meta, feats), lambda: ops.indice_maxpool(meta, feats),
                 lambda: ops.indice_conv(meta, feats, w)):
        with pytest.raises(RuntimeError, match="a tensor on the meta device, not a rulebook "
                                               "token .* the other tensors are on cpu"):
            call()
    # All on meta is a meta computation: its sizes, nothing else.
    out = ops.indice_avgpool(meta, feats.to("meta"))
    assert out.device.type == "meta" and list(out.shape) == [rb.num_out(), 2]
    # The fake kernels make the op's checks (meta values, and tracing).
    for bad, says in [(feats[:, 0], r"features must be \[%d, C\]" % rb.num_in()),
                      (feats[1:], r"features must be \[%d, C\]" % rb.num_in()),
                      (feats.int(), "features must be floating")]:
        with pytest.raises(RuntimeError, match=r"^spconv_c\.avgpool_forward_token: " + says):
            ops.indice_avgpool(meta, bad.to("meta"))


def test_token_made_in_inference_mode_trains_compiled(seed):
    """A token is never an inference tensor, so that a compiled training graph can save it
    for its backward (AOTAutograd refuses inference tensors there, and a clone of a token
    stands for nothing)."""
    gen, feats, idx = small_input(seed)
    with torch.inference_mode():
        token = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1).token()
    assert not token.is_inference()
    f = feats.detach().requires_grad_(True)
    fn = lambda t, x: ops.indice_avgpool(t, x).square().sum()  # noqa: E731
    fn(token, f).backward()
    want, f.grad = f.grad, None
    torch.compile(fn, backend="aot_eager")(token, f).backward()
    torch.testing.assert_close(f.grad, want, rtol=1e-12, atol=1e-12)


def test_token_stands_for_its_rulebook(seed):
    """A token gives the handle's bits, keeps its rulebook alive, and is refused with a message
    wherever it does not stand for one: a copy, a view of another shape, any other tensor."""
    gen, feats, idx = small_input(seed, channels=3)
    w = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1)
    token = rb.token()
    assert token.dtype == torch.uint8 and list(token.shape) == [rb.num_in(), rb.num_out(), 0]
    want = torch.ops.spconv_c.conv_forward(rb, feats, w, None)
    assert torch.equal(torch.ops.spconv_c.conv_forward_token(token, feats, w, None), want)
    alias = token.detach()[:]  # a view shares the storage, which is what identifies a token
    del rb
    assert torch.equal(torch.ops.spconv_c.conv_forward_token(alias, feats, w, None), want)
    for bad, says in [(token.clone(), "not a rulebook token"),
                      (torch.empty(token.shape, dtype=torch.uint8), "not a rulebook token"),
                      (feats, "not a rulebook token"),
                      (token[1:], "a rulebook token is ["),
                      (token.reshape(token.shape[1], token.shape[0], 0), "a rulebook token is [")]:
        if list(bad.shape) == list(token.shape) and bad is not feats and "is [" in says:
            continue  # (a transposed shape equal to the token's when num_in == num_out)
        with pytest.raises(RuntimeError, match=says.replace("[", r"\[")):
            torch.ops.spconv_c.conv_forward_token(bad, feats, w, None)
    with pytest.raises(RuntimeError, match="not a rulebook token"):
        torch.ops.spconv_c.maxpool_forward_token(feats, feats)
    with pytest.raises(RuntimeError, match=r"^spconv_c\.conv_forward_token: .*SPCONV_ERR"):
        torch.ops.spconv_c.conv_forward_token(alias, feats[1:], w, None)  # a row short
    # A token may be on another device than the features (a host rulebook serves CUDA features,
    # as a handle does): the fake kernels, which run for meta features, size the output from it.
    meta = torch.ops.spconv_c.conv_forward_token(token, feats.to("meta"), w.to("meta"), None)
    assert meta.device.type == "meta" and meta.shape == want.shape


def test_copied_cache_entry_makes_its_own_tokens(seed):
    # The indice_key cache keeps tokens beside the handles; a copied entry (a deepcopied
    # SparseConvTensor's indice_dict) drops them and makes tokens of its own copies.
    import copy
    from spconv_c.pytorch.core import IndiceEntry
    gen, feats, idx = small_input(seed, channels=3)
    w = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1)
    entry = IndiceEntry(rb, ops.REGULAR, idx, SHAPE, rb.out_indices(), rb.out_shape(), [3] * 3,
                        [2] * 3, [1] * 3, [1] * 3, 2, 3, rb.token())
    entry.inverse(token=True)
    twin = copy.deepcopy(entry)
    assert twin.token is None and twin._inverse_token is None
    want = ops.indice_conv(rb, feats, w)
    assert torch.equal(ops.indice_conv(twin.rulebook_arg(token=True), feats, w), want)
    g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    back = torch.randn(27, 4, 3, generator=gen, dtype=torch.float64)
    assert torch.equal(ops.indice_conv(twin.inverse(token=True), g, back),
                       ops.indice_conv(entry.inverse(), g, back))


def test_token_builders_give_the_handles_rulebooks(seed):
    """build_subm_token, build_rulebook_token and inverse_token (what compiled graphs call) make
    the rulebooks build_rulebook and inverse_rulebook make: the same output sites, the same conv
    bits; token sizes as their fake kernels declare them; bad kinds refused."""
    gen, feats, idx = small_input(seed, channels=3)
    w = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64)
    w8 = torch.randn(8, 3, 4, generator=gen, dtype=torch.float64)
    conv = torch.ops.spconv_c.conv_forward
    conv_tk = torch.ops.spconv_c.conv_forward_token
    n = idx.shape[0]

    subm = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    tk = ops.build_subm_token(idx, SHAPE, 2, 3)
    assert list(tk.shape) == [n, n, 0] and tk.dtype == torch.uint8
    assert torch.equal(conv_tk(tk, feats, w, None), conv(subm, feats, w, None))
    assert ops.token_rulebook(tk).kind() == ops.SUBM

    for kind, k, s, p, weight in [(ops.REGULAR, 3, 2, 1, w), (ops.TRANSPOSED, 2, 2, 0, w8)]:
        rb = ops.build_rulebook(idx, SHAPE, 2, kind, k, s, p)
        tk, out = ops.build_rulebook_token(idx, SHAPE, 2, kind, k, s, p)
        assert list(tk.shape) == [n, rb.num_out(), 0]
        assert torch.equal(out, rb.out_indices())
        assert ops.output_shape(kind, SHAPE, k, s, p, 1, 0) == list(rb.out_shape())
        assert torch.equal(conv_tk(tk, feats, weight, None), conv(rb, feats, weight, None))
        if kind != ops.REGULAR:
            continue  # (only regular rulebooks invert)
        inv, inv_tk = ops.inverse_rulebook(rb), ops.inverse_token(tk)
        assert list(inv_tk.shape) == [rb.num_out(), n, 0]
        g = torch.randn(rb.num_out(), 3, generator=gen, dtype=torch.float64)
        assert torch.equal(conv_tk(inv_tk, g, weight, None), conv(inv, g, weight, None))
    with pytest.raises(RuntimeError, match=r"build_rulebook_token: kind 1 \(subm\)"):
        ops.build_rulebook_token(idx, SHAPE, 2, ops.SUBM, 3)
    with pytest.raises(RuntimeError, match="build_subm_token: .*spatial shape"):
        ops.build_subm_token(idx, [0, 6, 5], 2, 3)
    with pytest.raises(RuntimeError, match="inverse_token: the rulebook argument is not a rulebook"):
        ops.inverse_token(idx)


def test_token_builders_keep_their_own_sites(seed):
    # Inside a graph compiled by inductor, a tensor no later node reads is dead, and its memory
    # may serve another: a rulebook built there on shared indices saw them overwritten (its
    # in_indices read another tensor's values; build_rulebook_on trusts them). The token
    # builders give the rulebook its own copy, and hand back a copy of its output sites.
    _, _, idx = small_input(seed)
    coords = idx.long()

    def fn(coords):
        sites = (coords + 0).int()
        subm = ops.build_subm_token(sites, SHAPE, 2, 3)
        strided, out = ops.build_rulebook_token((coords + 0).int(), SHAPE, 2, ops.REGULAR, 3,
                                                2, 1)
        later = (coords * 0 + 7).int()  # same size and dtype, made after the sites are dead
        return subm, strided, later

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        subm, strided, _ = torch.compile(fn, backend="inductor", fullgraph=True)(coords)
    torch._dynamo.reset()
    want = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 3, 2, 1)
    assert torch.equal(ops.token_rulebook(subm).in_indices(), idx)
    assert torch.equal(ops.token_rulebook(strided).in_indices(), idx)
    assert torch.equal(ops.token_rulebook(strided).out_indices(), want.out_indices())


def test_check_sites_token(seed):
    # check_sites_token (the cache's "unchanged since" check, run where the graph runs): a new
    # token of the same rulebook while the sites are at the version given (or the one the build
    # read, -1), else a ValueError with the caller's words; nothing compared for -2 or an
    # inference tensor.
    gen, feats, idx = small_input(seed, channels=3)
    idx = idx.clone()
    w = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64)
    tk = ops.build_subm_token(idx, SHAPE, 2, 3)
    checked = ops.check_sites_token(tk, idx, -1, "written into")
    assert checked.data_ptr() == tk.data_ptr() and checked.untyped_storage() is not None
    assert torch.equal(torch.ops.spconv_c.conv_forward_token(checked, feats, w, None),
                       torch.ops.spconv_c.conv_forward_token(tk, feats, w, None))
    assert list(ops.check_sites_token(tk, idx, idx._version, "x").shape) == list(tk.shape)
    idx[0, 0] = idx[0, 0]  # a write in place
    with pytest.raises(ValueError, match="^the sites were written into$"):
        ops.check_sites_token(tk, idx, -1, "the sites were written into")
    with pytest.raises(ValueError, match="moved"):
        ops.check_sites_token(tk, idx, idx._version - 1, "moved")
    ops.check_sites_token(tk, idx, -2, "nothing compared")
    with torch.inference_mode():
        frozen = idx.clone()
    ops.check_sites_token(tk, frozen, 0, "an inference tensor has no version")


def test_check_lifted_token(seed):
    # check_lifted_token (compiled code's check that the rows a 1-d / 2-d layer's cached
    # rulebook is used on still lift its nd indices): a new token of the same rulebook while
    # they do, else a ValueError with the caller's words; shapes, dtypes and devices that
    # cannot be compared are an error of their own. The modules' eager twin of it
    # (conv._lifts, for a rulebook held as a handle) gives the same verdicts.
    from spconv_c.pytorch.conv import _lifts
    gen, feats, idx = small_input(seed, channels=3)

    def verdict(tk, rows, nd_idx):
        try:
            checked = ops.check_lifted_token(tk, rows, nd_idx, "the indices moved")
        except ValueError as e:
            assert str(e) == "the indices moved" and not _lifts(rows, nd_idx)
            return False
        assert checked.data_ptr() == tk.data_ptr() and list(checked.shape) == list(tk.shape)
        assert _lifts(rows, nd_idx)
        return True

    for nd in (1, 2):
        nd_idx = torch.cat([idx[:, :1], idx[:, 4 - nd:]], 1).unique(dim=0)
        rows = torch.cat([nd_idx[:, :1], torch.zeros(nd_idx.shape[0], 3 - nd, dtype=torch.int32),
                          nd_idx[:, 1:]], 1)
        tk = ops.build_subm_token(rows, SHAPE, 2, 3)
        assert verdict(tk, rows, nd_idx)
        nd_idx[0, 0] = nd_idx[0, 0]  # a write that keeps the values: no version is read
        assert verdict(tk, rows, nd_idx)
        assert verdict(tk, rows[:, :], nd_idx.t().contiguous().t())  # strided: the slow path
        for col in range(nd + 1):
            moved = nd_idx.clone()
            moved[-1, col] += 1
            assert not verdict(tk, rows, moved)
            assert not verdict(tk, rows, moved.t().contiguous().t())
        for col in range(1, 4 - nd):
            raised = rows.clone()
            raised[0, col] = 1  # a leading axis the rows must hold at 0
            assert not verdict(tk, raised, nd_idx)
        assert not verdict(tk, rows, nd_idx[1:])
        with pytest.raises(RuntimeError, match=r"rows must be \[N, 4\] and indices \[N, 2\] "
                                               r"or \[N, 3\], of one dtype"):
            ops.check_lifted_token(tk, rows, nd_idx.long(), "moved")
        with pytest.raises(RuntimeError, match="rows must be"):
            ops.check_lifted_token(tk, nd_idx, rows, "moved")


def test_output_shape_is_the_engines(seed):
    # ops.output_shape (what compiled code reads for a build inside the graph) against the
    # rulebook's own out_shape(), on random geometries of every kind the engine accepts.
    gen = torch.Generator().manual_seed(seed)
    idx = torch.zeros(1, 4, dtype=torch.int32)
    checked = 0
    for _ in range(300):
        kind = [ops.REGULAR, ops.SUBM, ops.TRANSPOSED][int(torch.randint(3, (), generator=gen))]
        r = [int(v) for v in torch.randint(1, 5, (16,), generator=gen)]
        shape, k, s, d = [r[0] * 3, r[1] * 2, r[2]], r[3:6], r[6:9], r[9:12]
        p = [v - 1 for v in r[12:15]]
        op = [min(r[15] - 1, s[0] - 1)] * 3 if kind == ops.TRANSPOSED else [0] * 3
        try:
            rb = ops.build_rulebook(idx, shape, 1, kind, k, s, p, d, op)
        except RuntimeError as e:
            if "output spatial shape is empty" in str(e):  # refused alike
                with pytest.raises(RuntimeError, match="output spatial shape is empty"):
                    ops.output_shape(kind, shape, k, s, p, d, op)
            continue  # (or a geometry refused for another reason: a kernel too large, ...)
        assert ops.output_shape(kind, shape, k, s, p, d, op) == list(rb.out_shape()), \
            (kind, shape, k, s, p, d, op)
        checked += 1
    assert checked > 100


def test_builds_record_the_sites_version(seed):
    # Rulebook.sites_version: the indices' version a build read (a cache entry made inside a
    # compiled graph takes it afterwards); -1 for an inference tensor.
    _, _, idx = small_input(seed)
    idx = idx.clone()
    idx.add_(0)
    idx.add_(0)
    assert ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3).sites_version() == idx._version == 2
    assert ops.token_rulebook(ops.build_subm_token(idx, SHAPE, 2, 3)).sites_version() == 2
    with torch.inference_mode():
        frozen = idx.clone()
    assert ops.build_rulebook(frozen, SHAPE, 2, ops.REGULAR, 3).sites_version() == -1


@pytest.mark.parametrize("order", [1, 2])
def test_sparse_to_dense_gradcheck(seed, order):
    _, feats, idx = small_input(seed)
    f = feats.detach().requires_grad_(True)
    assert CHECKS[order](lambda f: ops.sparse_to_dense(f, idx, SHAPE, 2), (f,))


def test_opcheck_every_op(seed):
    gen, feats, idx = small_input(seed)
    rbs = rulebooks(idx)
    rb = rbs["regular"]
    w = torch.randn(27, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)
    f = feats.detach().requires_grad_(True)
    g = torch.randn(rb.num_out(), 3, generator=gen, dtype=torch.float64)
    pool_rb = ops.build_rulebook(idx, SHAPE, 2, ops.REGULAR, 2, 2, 0)
    pooled, argmax = torch.ops.spconv_c.maxpool_forward(pool_rb, feats)
    points = torch.rand(200, 4, generator=gen) * 10
    # The rulebook builders return a torchbind handle, which fake tensors cannot produce (they
    # are graph breaks under torch.compile): their schema and autograd registration are checked.
    handle_ops = [
        (torch.ops.spconv_c.build_rulebook.default,
         (idx, SHAPE, 2, ops.SUBM, [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1], [0, 0, 0])),
        (torch.ops.spconv_c.inverse_rulebook.default, (rb,)),
        (torch.ops.spconv_c.build_rulebook_on.default,
         (rb, True, ops.SUBM, [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1], [0, 0, 0])),
    ]
    for op, args in handle_ops:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration"))
    # token -> handle likewise, on the token as it is (opcheck would copy it; opcheck_uncopied)
    from torch.testing._internal.optests import generate_tests
    for check in (generate_tests.safe_schema_check,
                  generate_tests.safe_autograd_registration_check):
        check(torch.ops.spconv_c.token_rulebook.default, (rb.token(),), {}, copy_inputs=False)
    cases = [
        (torch.ops.spconv_c.conv_forward.default, (rb, f, w, b)),
        (torch.ops.spconv_c.conv_forward.default, (rbs["subm"], f, w, None)),
        (torch.ops.spconv_c.conv_backward.default, (rb, feats, w.detach(), g, [True, True, True])),
        # Its own autograd (double backward), traced too:
        (torch.ops.spconv_c.conv_backward.default, (rb, f, w, g.clone().requires_grad_(True),
                                                    [True, True, True])),
        (torch.ops.spconv_c.conv_backward.default, (rb, f, w, g.clone().requires_grad_(True),
                                                    [True, False, False])),
        (torch.ops.spconv_c.maxpool_backward.default,
         (pool_rb, argmax, torch.ones_like(pooled).requires_grad_(True))),
        (torch.ops.spconv_c.maxpool_forward.default, (pool_rb, f)),
        (torch.ops.spconv_c.maxpool_backward.default, (pool_rb, argmax, torch.ones_like(pooled))),
        (torch.ops.spconv_c.avgpool_forward.default, (pool_rb, f)),
        (torch.ops.spconv_c.avgpool_backward.default,
         (pool_rb, torch.ones_like(pooled).requires_grad_(True))),
        (torch.ops.spconv_c.sparse_to_dense.default, (f, idx, SHAPE, 2)),
        (torch.ops.spconv_c.voxelize.default, (points, [1.0, 1.0, 1.0], [0, 0, 0, 10, 10, 10], 5, 100)),
        # The builders that return tokens (traced inside compiled graphs): sizes known
        # (subm), or the output count an unbacked size (regular, transposed).
        (torch.ops.spconv_c.build_subm_token.default,
         (idx, SHAPE, 2, [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1], [0, 0, 0])),
        (torch.ops.spconv_c.build_rulebook_token.default,
         (idx, SHAPE, 2, ops.REGULAR, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], [0, 0, 0])),
        (torch.ops.spconv_c.build_rulebook_token.default,
         (idx, SHAPE, 2, ops.TRANSPOSED, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], [0, 0, 0])),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
    tk, pool_tk = rb.token(), pool_rb.token()
    lifted = idx.clone()
    lifted[:, 1] = 0  # rows as a 2-d layer's are (sites may now repeat: only the check reads them)
    token_cases = [
        (torch.ops.spconv_c.conv_forward_token.default, (tk, f, w, b)),
        (torch.ops.spconv_c.conv_forward_token.default, (rbs["subm"].token(), f, w, None)),
        (torch.ops.spconv_c.conv_backward_token.default,
         (tk, feats, w.detach(), g, [True, True, True])),
        (torch.ops.spconv_c.conv_backward_token.default,
         (tk, f, w, g.clone().requires_grad_(True), [True, True, True])),
        (torch.ops.spconv_c.maxpool_forward_token.default, (pool_tk, f)),
        (torch.ops.spconv_c.maxpool_backward_token.default,
         (pool_tk, argmax, torch.ones_like(pooled).requires_grad_(True))),
        (torch.ops.spconv_c.avgpool_forward_token.default, (pool_tk, f)),
        (torch.ops.spconv_c.avgpool_backward_token.default,
         (pool_tk, torch.ones_like(pooled).requires_grad_(True))),
        (torch.ops.spconv_c.inverse_token.default, (tk,)),
        (torch.ops.spconv_c.check_sites_token.default, (tk, idx, -1, "sites written into")),
        (torch.ops.spconv_c.check_lifted_token.default,
         (tk, lifted, lifted[:, [0, 2, 3]], "rows moved")),
    ]
    for op, args in token_cases:
        opcheck_uncopied(op, args)


def opcheck_uncopied(op, args):
    """torch.library.opcheck's default checks (schema, autograd registration, fake kernel,
    AOTAutograd with dynamic shapes) on the inputs as given. opcheck runs each on copies of the
    tensor inputs, and a copy of a token stands for nothing (a token is known by its storage;
    test_token_stands_for_its_rulebook), so the token ops take these from PyTorch's optests
    module, where each check can be told not to copy. Their outputs are compared with eager's
    as opcheck compares them."""
    from torch.testing._internal.optests import aot_autograd, generate_tests
    generate_tests.safe_schema_check(op, args, {}, copy_inputs=False)
    generate_tests.safe_autograd_registration_check(op, args, {}, copy_inputs=False)
    generate_tests.safe_fake_check(op, args, {}, copy_inputs=False)
    aot_autograd.aot_autograd_check(lambda *a: op(*a), args, {}, True, check_gradients="auto",
                                    copy_inputs=False)


def test_inference_path_gives_the_same_bits(seed):
    """Under torch.no_grad() the ops go below autograd directly (ops._inference): the same
    values as with autograd recording, outputs that need no gradient, and the error messages
    still the engine's."""
    gen, feats, idx = small_input(seed, channels=3)
    weight = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64)
    bias = torch.randn(4, generator=gen, dtype=torch.float64)
    rbs = rulebooks(idx)
    f = feats.clone().requires_grad_()
    for kind in ("regular", "subm", "inverse"):
        rb = rbs[kind]
        x = f if kind != "inverse" else torch.randn(rb.num_in(), 3, generator=gen,
                                                     dtype=torch.float64, requires_grad=True)
        recorded = ops.indice_conv(rb, x, weight, bias)
        assert recorded.requires_grad
        with torch.no_grad():
            plain = ops.indice_conv(rb, x, weight, bias)
        assert not plain.requires_grad and torch.equal(plain, recorded.detach())
    pooled = ops.indice_maxpool(rbs["regular"], f)
    dense = ops.sparse_to_dense(f, idx, SHAPE, 2)
    with torch.no_grad():
        assert torch.equal(ops.indice_maxpool(rbs["regular"], f), pooled.detach())
        assert torch.equal(ops.sparse_to_dense(f, idx, SHAPE, 2), dense.detach())
        with pytest.raises(RuntimeError, match="features"):
            ops.indice_conv(rbs["subm"], f[:, :2], weight, bias)


def test_inference_calls_reach_modes(seed):
    """Inference calls go to the dispatcher boxed (ops._call_below_autograd), past torch.ops'
    Python argument parsing: a dispatch mode must still see each op, with the same result, and a
    torch function mode, which only that parsing consults, makes the call take the ordinary
    path (it sees the op too)."""
    gen, feats, idx = small_input(seed, channels=3)
    weight = torch.randn(27, 3, 4, generator=gen, dtype=torch.float64)
    rbs = rulebooks(idx)
    with torch.no_grad():
        want = ops.indice_conv(rbs["subm"], feats, weight)
        pooled = ops.indice_maxpool(rbs["regular"], feats)
        for mode in recording_modes():
            with mode:
                got = ops.indice_conv(rbs["subm"], feats, weight)
                got_pool = ops.indice_maxpool(rbs["regular"], feats)
            assert torch.equal(got, want) and torch.equal(got_pool, pooled)
            assert any("spconv_c.conv_forward" in op for op in mode.ops), mode.ops
            # (in inference the max pool skips the argmax: maxpool_inference)
            assert any("spconv_c.maxpool_inference" in op for op in mode.ops), mode.ops
    # The builders that take a rulebook go boxed in any grad mode (ops._call_builder): the
    # modes see them too, with the same rulebooks.
    on_want = ops.build_rulebook_on(rbs["regular"], True, ops.SUBM, 3)[0]
    inverse_want = ops.inverse_rulebook(rbs["regular"])
    for grad in (False, True):
        for mode in recording_modes():
            with torch.set_grad_enabled(grad), mode:
                on = ops.build_rulebook_on(rbs["regular"], True, ops.SUBM, 3)[0]
                inverse = ops.inverse_rulebook(rbs["regular"])
            assert torch.equal(on.pairs_in(), on_want.pairs_in())
            assert torch.equal(on.pair_offsets(), on_want.pair_offsets())
            assert torch.equal(inverse.pairs_out(), inverse_want.pairs_out())
            assert any("spconv_c.build_rulebook_on" in op for op in mode.ops), mode.ops
            assert any("spconv_c.inverse_rulebook" in op for op in mode.ops), mode.ops


def test_layer_outputs_keep_the_inputs_attributes(seed):
    """A layer's output is a shadow copy of its input with new sites (as spconv's layers make
    it): the grid, voxel_num, benchmark flag and record travel along, and the cache as a copy
    with the keys the layers stored (the input's is left as it was, as spconv's)."""
    _, feats, idx = small_input(seed, channels=2)
    x = spconv.SparseConvTensor(feats.float(), idx, SHAPE, 2, grid=torch.zeros(1),
                                voxel_num=torch.tensor([7]), benchmark=True)
    net = spconv.SparseSequential(spconv.SparseConv3d(2, 3, 3, 2, 1, indice_key="d"),
                                  torch.nn.ReLU(), spconv.SparseMaxPool3d(2, 2),
                                  spconv.SubMConv3d(3, 3, 3, indice_key="s"))
    out = net(x)
    assert out is not x and x.indice_dict == {} and set(out.indice_dict) == {"d", "s"}
    assert out.grid is x.grid and out.voxel_num is x.voxel_num and out.benchmark
    assert out.benchmark_record is x.benchmark_record and out.batch_size == 2
    assert out.features.shape == (out.indices.shape[0], 3)
    assert x.features.shape[1] == 2 and x.indices is idx  # the input is left as it was


def test_outputs_are_not_copied():
    _, feats, idx = small_input(1)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    # The rulebook's indices are the caller's tensor itself (wrapped, not copied).
    assert rb.in_indices().data_ptr() == idx.data_ptr()
    assert rb.out_indices().data_ptr() == idx.data_ptr()
    # The pairs come out as copies: writing into one leaves the rulebook's lists as they were.
    pairs = rb.pairs_in()
    assert pairs.data_ptr() != rb.pairs_in().data_ptr()
    kept = pairs.clone()
    pairs.fill_(-1)
    assert torch.equal(rb.pairs_in(), kept)
    offsets = rb.pair_offsets()
    assert offsets[-1].item() == rb.num_pairs() and offsets.shape[0] == 28


def test_rulebook_outlives_its_indices():
    _, feats, idx = small_input(2)
    rb = ops.build_rulebook(idx.clone(), SHAPE, 2, ops.SUBM, 3)  # the clone's only owner is rb
    import gc
    gc.collect()
    assert torch.equal(rb.in_indices(), idx)


# ---- bad input: a Python exception with the engine's message ------------------------------------

def test_wrong_index_dtype():
    _, _, idx = small_input(3)
    with pytest.raises(RuntimeError, match="indices must be int32"):
        ops.build_rulebook(idx.long(), SHAPE, 2, ops.SUBM, 3)


def test_bad_coordinates():
    _, _, idx = small_input(4)
    bad = idx.clone()
    bad[5] = torch.tensor([0, 1, 99, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"row 5 = \(0, 1, 99, 1\) is outside spatial shape"):
        spconv.SubMConv3d(2, 2, 3)(spconv.SparseConvTensor(torch.zeros(30, 2), bad, SHAPE, 2))


def test_duplicate_coordinates():
    _, _, idx = small_input(5)
    bad = idx.clone()
    bad[7] = bad[2]
    with pytest.raises(RuntimeError, match="DUPLICATE"):
        ops.build_rulebook(bad, SHAPE, 2, ops.SUBM, 3)


def test_wrong_feature_shape():
    _, feats, idx = small_input(6)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    w = torch.zeros(27, 3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="spconv_c.conv_forward: .*SHAPE_MISMATCH"):
        ops.indice_conv(rb, feats, w)


def test_mixed_dtypes():
    _, feats, idx = small_input(7)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    with pytest.raises(RuntimeError, match="DTYPE_MISMATCH"):
        ops.indice_conv(rb, feats, torch.zeros(27, 2, 4, dtype=torch.float32))


def test_unknown_indice_key():
    _, feats, idx = small_input(8)
    x = spconv.SparseConvTensor(feats.float(), idx, SHAPE, 2)
    with pytest.raises(KeyError, match="unknown indice_key 'nope'"):
        spconv.SparseInverseConv3d(2, 2, 3, indice_key="nope")(x)


def test_subm_key_reused_on_other_sites():
    """A subm indice_key is reused only on the sites it was built on, row for row: the same
    count of other sites (here the same sites in another order) is refused, not multiplied with
    the cached pairs; equal sites in another tensor still reuse it."""
    _, feats, idx = small_input(9)
    layer = spconv.SubMConv3d(2, 3, 3, indice_key="s").double()
    y = layer(spconv.SparseConvTensor(feats, idx, SHAPE, 2))
    again = layer(spconv.SparseConvTensor(feats, idx.clone(), SHAPE, 2, indice_dict=y.indice_dict))
    assert torch.equal(again.features, y.features)
    perm = torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(9))
    moved = spconv.SparseConvTensor(feats[perm], idx[perm].contiguous(), SHAPE, 2,
                                    indice_dict=y.indice_dict)
    with pytest.raises(ValueError, match="indice_key 's' holds a subm rulebook of other sites"):
        layer(moved)


def test_subm_key_after_indices_written_in_place(seed):
    """The same indices tensor written into since the key's rulebook was built holds other
    sites: the key is refused (it was reused, and the stale pairs gave wrong outputs); a
    spatial shape set to a NumPy array is compared as its values."""
    import numpy as np
    gen = torch.Generator().manual_seed(seed)
    feats, idx = random_sparse(gen, 1, SHAPE, 20, 2)
    layer = spconv.SubMConv3d(2, 3, 3, indice_key="s").double()
    then = spconv.SubMConv3d(3, 3, 3, indice_key="s").double()
    x = spconv.SparseConvTensor(feats, idx, SHAPE, 1)
    y = layer(x)  # its cache holds the key, on the sites of x (the same indices tensor)
    assert y.indices is idx and "s" in y.indice_dict
    y.spatial_shape = np.array(SHAPE)
    again = then(y)  # unchanged sites, the shape as an array: reused
    fresh = then(spconv.SparseConvTensor(y.features, idx.clone(), SHAPE, 1))
    assert torch.equal(again.features, fresh.features)
    taken = {tuple(r) for r in idx.tolist()}
    free = [(0, z, 0, 0) for z in range(SHAPE[0]) if (0, z, 0, 0) not in taken]
    if not free:
        pytest.skip("no free site on the first column")
    x.indices[0] = torch.tensor(free[0], dtype=torch.int32)
    with pytest.raises(ValueError, match="holds a subm rulebook of other sites .*written into "
                                         "since"):
        then(y)


def test_inverse_on_other_sites():
    """The inverse conv takes the output sites of the conv under its key, row for row."""
    _, feats, idx = small_input(10)
    down = spconv.SparseConv3d(2, 2, 3, 2, 1, indice_key="d").double()
    up = spconv.SparseInverseConv3d(2, 2, 3, indice_key="d").double()
    y = down(spconv.SparseConvTensor(feats, idx, SHAPE, 2))
    assert up(y).features.shape[0] == idx.shape[0]
    perm = torch.randperm(y.indices.shape[0], generator=torch.Generator().manual_seed(10))
    moved = spconv.SparseConvTensor(y.features[perm], y.indices[perm].contiguous(),
                                    y.spatial_shape, 2, indice_dict=y.indice_dict)
    with pytest.raises(ValueError, match="not the output sites of the conv under indice_key 'd'"):
        up(moved)
    bigger = spconv.SparseConvTensor(y.features, y.indices, [s * 4 for s in y.spatial_shape], 2,
                                     indice_dict=y.indice_dict)
    with pytest.raises(ValueError, match="not the output sites"):
        up(bigger)


def test_1x1_rows_must_match_sites():
    _, feats, idx = small_input(11)
    x = spconv.SparseConvTensor(feats[:-1], idx, SHAPE, 2)
    with pytest.raises(ValueError, match=r"feature rows for \d+ sites"):
        spconv.SubMConv3d(2, 3, 1).double()(x)


def test_1x1_checks_dtypes_and_shapes():
    """The 1x1 path needs no rulebook but refuses what the others refuse without one: integer
    features (which used to truncate the weights to integers) and indices that are not int32
    [N, 4]."""
    _, feats, idx = small_input(12)
    layer = spconv.SubMConv3d(2, 3, 1)
    with pytest.raises(RuntimeError, match="features must be floating .*got torch.int64"):
        layer(spconv.SparseConvTensor(feats.long(), idx, SHAPE, 2))
    with pytest.raises(RuntimeError, match=r"indices must be int32 \[N, 4\].*torch.int64"):
        layer(spconv.SparseConvTensor(feats.float(), idx.long(), SHAPE, 2))
    with pytest.raises(RuntimeError, match=r"indices must be int32 \[N, 4\].*\[\d+, 3\]"):
        layer(spconv.SparseConvTensor(feats.float(), idx[:, 1:].contiguous(), SHAPE, 2))


def test_bad_layer_and_voxelizer_arguments():
    with pytest.raises(ValueError, match="kernel_size must be >= 1"):
        spconv.SubMConv3d(3, 3, 0)
    with pytest.raises(ValueError, match="kernel_size must be >= 1"):
        spconv.SparseConv3d(3, 3, (3, -1, 3))
    with pytest.raises(ValueError, match="channel counts must be >= 0"):
        spconv.SubMConv3d(-1, 3, 3)
    # no input channels: a layer (of zero weights) all the same, as nn.Conv3d
    assert spconv.SubMConv3d(0, 3, 3).weight.shape == (3, 3, 3, 3, 0)
    with pytest.raises(ValueError, match="voxel size x = 0.0"):
        spconv.PointToVoxel([0, 1, 1], [0, 0, 0, 4, 4, 4], 4, 10, 5)
    with pytest.raises(ValueError, match="voxel size y = nan"):
        spconv.PointToVoxel([1, float("nan"), 1], [0, 0, 0, 4, 4, 4], 4, 10, 5)
    with pytest.raises(ValueError, match=r"range z = \[4.0, 4.0\]"):
        spconv.PointToVoxel([1, 1, 1], [0, 0, 4, 4, 4, 4], 4, 10, 5)


def test_meta_tensor_mixed_in():
    """A meta tensor among CPU ones sends the call to the fake kernels: an error, not an
    uninitialised output."""
    _, feats, idx = small_input(12)
    rb = ops.build_rulebook(idx, SHAPE, 2, ops.SUBM, 3)
    with pytest.raises(RuntimeError, match="on cpu, meta; all must be on one device"):
        ops.indice_conv(rb, feats, torch.ones(27, 2, 3, dtype=feats.dtype, device="meta"))
    with pytest.raises(RuntimeError, match="sparse_to_dense: the tensors are on cpu, meta"):
        ops.sparse_to_dense(feats, idx.to("meta"), SHAPE, 2)


def test_rulebook_pickles_by_rebuilding(seed):
    import copy
    _, feats, idx = small_input(seed)
    for rb in rulebooks(idx).values():
        twin = copy.deepcopy(rb)
        assert twin.kind() == rb.kind() and twin.num_out() == rb.num_out()
        for what in ("pairs_in", "pairs_out", "pair_offsets", "out_indices"):
            assert torch.equal(getattr(twin, what)(), getattr(rb, what)())
