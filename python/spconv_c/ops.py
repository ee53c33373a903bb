"""The operators of the extension (``torch.ops.spconv_c.*``) with what PyTorch needs around them:
fake (meta) kernels, so that ``torch.compile`` and ``torch.library.opcheck`` can trace them, and
autograd formulas, so that the differentiable ones work with ``backward()``.

Operators (schemas in ``csrc/ops.cpp``):

==================  ===========================================================================
build_rulebook      indices int32 [N, 4] -> Rulebook (regular / pool, subm, transposed)
build_subm_token    build_rulebook of kind SUBM, as the rulebook's token (below), traced inside
                    compiled graphs: its sizes, [N, N, 0], are known before it runs
build_rulebook_token
                    build_rulebook of a regular / pool or transposed kind -> (its token, its
                    output sites int32 [M, 4]); M depends on the data (an unbacked size traced)
inverse_token       inverse_rulebook over tokens: [num_in, num_out, 0] -> [num_out, num_in, 0]
token_rulebook      a token -> the Rulebook handle it stands for
check_sites_token   (token, indices, version, message) -> a new token of the same rulebook, or a
                    ValueError with the message where the indices were written into since
                    (version: theirs at the build; -1 the build's own record)
check_lifted_token  (token, rows [N, 4], indices [N, 1 + ndim], message) -> a new token of the
                    same rulebook, or a ValueError with the message where the rows are not the
                    1-d / 2-d indices lifted (b, 0, ..., coordinates), row for row
build_rulebook_on   (Rulebook, output_side, kind, geometry) -> (the Rulebook build_rulebook gives on
                    that rulebook's input or output sites, its output sites, its output spatial
                    shape), without checking those rows again (the caller vouches that they are
                    unchanged: the modules compare tensor versions)
inverse_rulebook    Rulebook of a regular conv or pool -> the Rulebook of its inverse conv
conv_forward        (rulebook, features [N_in, C_in], weight [KV, C_in, C_out] or
                    [KD, KH, KW, C_in, C_out], bias [C_out] or None) -> [N_out, C_out]
conv_forward_bn     conv_forward, then an inference batch norm (running statistics, eps, optional
                    weight and bias) and optionally a ReLU, folded into the conv's output pass;
                    CPU f32 / f64, inference only (no autograd formula); with krsc=True the
                    weight is the modules' KRSC [C_out, *K, C_in] (1 to 3 kernel axes)
conv_backward       -> (grad_features, grad_weight, grad_bias); unwanted ones are empty
maxpool_forward     (rulebook, features) -> (out [N_out, C], argmax int32 [N_out, C])
maxpool_backward    (rulebook, argmax, grad_out) -> grad_features [N_in, C]
maxpool_inference   (rulebook, features) -> out: maxpool_forward without the argmax, which only a
                    backward reads; inference only (no autograd formula)
avgpool_forward     (rulebook, features) -> [N_out, C]: each output's mean over its pairs' inputs
                    (PyTorch's index ops over the pair lists; an output without pairs gets 0)
avgpool_backward    (rulebook, grad_out) -> grad_features [N_in, C]
conv_forward_token, conv_backward_token, maxpool_forward_token, maxpool_backward_token,
avgpool_forward_token, avgpool_backward_token
                    the same with the rulebook given by its token (below) instead of the handle
sparse_to_dense     (features [N, C], indices [N, 4], spatial_shape, batch_size) -> [B, C, D, H, W]
voxelize            points [P, F] -> (voxels, mean features, coords (z, y, x), num_points,
                    point_voxel, grid_size (x, y, z))
==================  ===========================================================================

A Rulebook is an opaque handle (``torch.classes.spconv_c.Rulebook``): its methods give
``num_in()``, ``num_out()``, ``kernel_volume()``, ``pair_offsets()`` (int64 [KV + 1]),
``in_indices()``, ``out_indices()`` (views, no copies), and ``pairs_in()``, ``pairs_out()``
(copies: the engine relies on what it recorded about its pair lists when it built them), and
``token()``: a tensor, uint8 [num_in, num_out, 0], whose empty storage holds the rulebook. The
*_token ops take it; under torch.compile the modules hand them tokens, which trace as ordinary
tensor inputs (sizes guarded or symbolic, saved for a backward like any tensor), where a handle
is a fake object of fixed sizes that AOTAutograd cannot save (docs/pytorch.md, "Rulebook
tokens"). A view of a token stands for the same rulebook; a copy stands for nothing and is
refused.
"""

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

REGULAR, SUBM, TRANSPOSED, INVERSE = 0, 1, 2, 3

_ops = torch.ops.spconv_c


# ---- fake rulebook: what tracing knows about a rulebook -----------------------------------------

@torch._library.register_fake_class("spconv_c::Rulebook")
class FakeRulebook:
    """A rulebook handle under tracing: the sizes of the real one it was made from. They are
    fixed (nothing guards them), so compiled code takes tokens instead (``_call_rulebook_op``);
    this serves the handle ops' fake kernels, which opcheck and FakeTensorMode run."""

    def __init__(self, kind, num_in, num_out, kernel_volume):
        self._kind, self._num_in, self._num_out, self._kv = kind, num_in, num_out, kernel_volume

    @classmethod
    def __obj_unflatten__(cls, flat):
        return cls(**dict(flat))

    def kind(self):
        return self._kind

    def num_in(self):
        return self._num_in

    def num_out(self):
        return self._num_out

    def kernel_volume(self):
        return self._kv


# build_rulebook and inverse_rulebook have no fake kernels: they return a rulebook handle (a
# torchbind object), which PyTorch's fake tensors cannot produce, and a regular build's output
# count depends on the data anyway. Under torch.compile they run eagerly (build_rulebook below is
# a graph break); the conv and pool ops then take the rulebook's token. The builders that return
# tokens trace inside the graph: a submanifold build (build_subm_token: its outputs are its
# inputs) and an inverse (inverse_token: the sides swap), whose sizes are known before they run,
# and a regular / transposed / pool build (build_rulebook_token), whose output count is an
# unbacked size: Dynamo traces that only with capture_dynamic_output_shape_ops (else the call is
# a graph break, and the modules then build outside the graph, conv.rulebook_for).


@torch.library.register_fake("spconv_c::build_subm_token")
def _(indices, spatial_shape, batch_size, kernel_size, stride, padding, dilation,
      output_padding):
    n = indices.shape[0]
    return indices.new_empty((n, n, 0), dtype=torch.uint8)


@torch.library.register_fake("spconv_c::build_rulebook_token")
def _(indices, spatial_shape, batch_size, kind, kernel_size, stride, padding, dilation,
      output_padding):
    # No sites, no outputs: a count tracing knows to be 0 (Dynamo specializes an empty input)
    # stays known, so that what follows is traced for none (a batch norm is then skipped).
    if statically_known_true(indices.shape[0] == 0):
        m = 0
    else:
        m = torch.library.get_ctx().new_dynamic_size()
    return (indices.new_empty((indices.shape[0], m, 0), dtype=torch.uint8),
            indices.new_empty((m, 4)))


@torch.library.register_fake("spconv_c::check_sites_token")
def _(token, indices, version, what):
    return token.new_empty(token.shape)


@torch.library.register_fake("spconv_c::check_lifted_token")
def _(token, rows, indices, what):
    return token.new_empty(token.shape)


@torch.library.register_fake("spconv_c::inverse_token")
def _(forward):
    return forward.new_empty((forward.shape[1], forward.shape[0], 0))


def _one_device(op, *tensors):
    """The fake (meta) kernels run too when an eager call mixes in a meta tensor; without this
    they would hand back an uninitialised tensor of the first argument's device."""
    devices = sorted({str(t.device) for t in tensors if t is not None})
    if len(devices) > 1:
        raise RuntimeError(f"spconv_c.{op}: the tensors are on {', '.join(devices)}; "
                           f"all must be on one device")


@torch.library.register_fake("spconv_c::conv_forward_bn")
def _(rulebook, features, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, relu,
      krsc=False):
    _one_device("conv_forward_bn", features, weight, bias, bn_weight, bn_bias, running_mean,
                running_var)
    if krsc and not 3 <= weight.dim() <= 5:
        raise RuntimeError(f"spconv_c.conv_forward_bn: a KRSC weight is [C_out, *K, C_in] with 1 "
                           f"to 3 kernel axes, got {list(weight.shape)}")
    return features.new_empty(rulebook.num_out(), weight.shape[0 if krsc else -1])


def _token_device(op, token, *tensors):
    """A token copied to the meta device stands for no rulebook (a copy never does), but with
    real tensors beside it the call dispatches to the fake kernels, which would hand back an
    uninitialised tensor of the features' device: refused, as a copy is elsewhere."""
    others = sorted({str(t.device) for t in tensors if t is not None})
    if token.device.type == "meta" and others != ["meta"]:
        raise RuntimeError(f"spconv_c.{op}: the rulebook argument is a tensor on the meta "
                           f"device, not a rulebook token (a copy of a token stands for nothing); "
                           f"the other tensors are on {', '.join(others)}")


def _pool_values(op, what, values, rows):
    """The checks the average pool ops make of their ``values`` (named ``what``;
    csrc/ops.cpp, check_pool_values), for tracing and meta tensors: floating [rows, C]."""
    if values.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise RuntimeError(f"spconv_c.{op}: {what} must be floating (float16, bfloat16, float32, "
                           f"float64), got {values.dtype}")
    if values.dim() != 2:
        raise RuntimeError(f"spconv_c.{op}: {what} must be [{rows}, C] (a row per site), got "
                           f"{list(values.shape)}")
    torch._check(values.shape[0] == rows, lambda: f"spconv_c.{op}: {what} must be [{rows}, C] "
                 f"(a row per site), got {list(values.shape)}")


@torch.library.register_fake("spconv_c::maxpool_inference")
def _(rulebook, features):
    _one_device("maxpool_inference", features)
    return features.new_empty(rulebook.num_out(), features.shape[1])


def _register_fakes(suffix, sizes):
    """Fake kernels of conv_forward, conv_backward, maxpool_* and avgpool_* with
    ``suffix`` ("" for the handle ops, "_token" for the token ops); ``sizes(rulebook)`` gives
    its (num_in, num_out). A token's are its shape [num_in, num_out, 0], symbolic where tracing
    made them so; a handle's come from FakeRulebook. The rulebook is left out of the device
    check: the engine lets it differ from the features' (a rulebook built on the host serves
    CUDA features)."""

    def name(op):
        return f"spconv_c::{op}{suffix}"

    def token_check(op, rulebook, *tensors):
        if suffix:
            _token_device(op, rulebook, *tensors)

    @torch.library.register_fake(name("conv_forward"))
    def _(rulebook, features, weight, bias):
        token_check(f"conv_forward{suffix}", rulebook, features, weight, bias)
        _one_device(f"conv_forward{suffix}", features, weight, bias)
        return features.new_empty(sizes(rulebook)[1], weight.shape[-1])

    @torch.library.register_fake(name("conv_backward"))
    def _(rulebook, features, weight, grad_out, output_mask):
        token_check(f"conv_backward{suffix}", rulebook, features, weight, grad_out)
        _one_device(f"conv_backward{suffix}", features, weight, grad_out)

        def maybe(flag, like, shape):
            return like.new_empty(shape) if flag else like.new_empty(0)
        return (maybe(output_mask[0], features, features.shape),
                maybe(output_mask[1], weight, weight.shape),
                maybe(output_mask[2], weight, (weight.shape[-1],)))

    @torch.library.register_fake(name("maxpool_forward"))
    def _(rulebook, features):
        token_check(f"maxpool_forward{suffix}", rulebook, features)
        _one_device(f"maxpool_forward{suffix}", features)
        shape = (sizes(rulebook)[1], features.shape[1])
        return features.new_empty(shape), features.new_empty(shape, dtype=torch.int32)

    @torch.library.register_fake(name("maxpool_backward"))
    def _(rulebook, argmax, grad_out):
        token_check(f"maxpool_backward{suffix}", rulebook, argmax, grad_out)
        _one_device(f"maxpool_backward{suffix}", argmax, grad_out)
        return grad_out.new_empty(sizes(rulebook)[0], grad_out.shape[1])

    @torch.library.register_fake(name("avgpool_forward"))
    def _(rulebook, features):
        token_check(f"avgpool_forward{suffix}", rulebook, features)
        _pool_values(f"avgpool_forward{suffix}", "features", features, sizes(rulebook)[0])
        return features.new_empty(sizes(rulebook)[1], features.shape[1])

    @torch.library.register_fake(name("avgpool_backward"))
    def _(rulebook, grad_out):
        token_check(f"avgpool_backward{suffix}", rulebook, grad_out)
        _pool_values(f"avgpool_backward{suffix}", "grad_out", grad_out, sizes(rulebook)[1])
        return grad_out.new_empty(sizes(rulebook)[0], grad_out.shape[1])


_register_fakes("", lambda rb: (rb.num_in(), rb.num_out()))
_register_fakes("_token", lambda token: (token.shape[0], token.shape[1]))


@torch.library.register_fake("spconv_c::sparse_to_dense")
def _(features, indices, spatial_shape, batch_size):
    _one_device("sparse_to_dense", features, indices)
    return features.new_empty(batch_size, features.shape[1], *spatial_shape)


@torch.library.register_fake("spconv_c::voxelize")
def _(points, voxel_size, coors_range, max_points, max_voxels):
    m = torch.library.get_ctx().new_dynamic_size()
    f = points.shape[1]
    return (points.new_empty(m, max_points, f, dtype=torch.float32),
            points.new_empty(m, f, dtype=torch.float32),
            points.new_empty(m, 3, dtype=torch.int32),
            points.new_empty(m, dtype=torch.int32),
            points.new_empty(points.shape[0], dtype=torch.int64),
            points.new_empty(3, dtype=torch.int64))


# ---- autograd -----------------------------------------------------------------------------------
# The formulas are registered twice, for the ops that take the rulebook handle and for those that
# take its token (conv_forward_token, ...): the same formulas over the matching pair of ops.

def _register_conv_autograd(forward, backward):
    """conv ``forward``'s gradient through ``backward``, and ``backward``'s own (double backward)
    through both (``forward`` and ``backward`` are OpOverloadPackets of torch.ops.spconv_c)."""

    def setup(ctx, inputs, output):
        rulebook, features, weight, bias = inputs
        ctx.rulebook = rulebook
        ctx.has_bias = bias is not None
        ctx.save_for_backward(features, weight)

    def grad(ctx, grad_out):
        features, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[1], ctx.needs_input_grad[2],
                ctx.has_bias and ctx.needs_input_grad[3]]
        gf, gw, gb = backward(ctx.rulebook, features, weight, grad_out.contiguous(), mask)
        return None, gf if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None

    torch.library.register_autograd(forward._qualified_op_name, grad, setup_context=setup)

    # Double backward. conv_backward is linear in grad_out and in each of (features, weight):
    #   gf[i]  = sum over pairs (i, o, k) of g[o] W_k^T      (features' values unused)
    #   gw_k   = sum over pairs (i, o, k) of f[i]^T g[o]
    #   gb     = sum over o of g[o]
    # so the gradients of <ggf, gf> + <ggw, gw> + <ggb, gb> are again convolutions over the same
    # rulebook:
    #   wrt g: conv_forward(ggf, W) + conv_forward(f, ggw) + ggb
    #   wrt f: the data gradient of the conv with weight ggw, conv_backward(f, ggw, g)[0]
    #   wrt W: the weight gradient with features ggf, conv_backward(ggf, W, g)[1]
    # Each is computed with the differentiable operators, so every further order works too.

    def backward_setup(ctx, inputs, output):
        rulebook, features, weight, grad_out, output_mask = inputs
        ctx.rulebook = rulebook
        ctx.mask = list(output_mask)
        ctx.save_for_backward(features, weight, grad_out)

    def double_grad(ctx, ggf, ggw, ggb):
        features, weight, grad_out = ctx.saved_tensors
        rb = ctx.rulebook
        # Outputs not asked for are empty tensors: their gradients are nothing to propagate.
        ggf = ggf if ctx.mask[0] and ggf is not None else None
        ggw = ggw if ctx.mask[1] and ggw is not None else None
        ggb = ggb if ctx.mask[2] and ggb is not None else None
        want_f, want_w, want_g = ctx.needs_input_grad[1:4]
        d_f = d_w = d_g = None
        if want_g:
            d_g = grad_out.new_zeros(grad_out.shape)
            if ggf is not None:
                d_g = d_g + forward(rb, ggf.contiguous(), weight, None)
            if ggw is not None:
                d_g = d_g + forward(rb, features, ggw.contiguous(), None)
            if ggb is not None:
                d_g = d_g + ggb
        if want_f and ggw is not None:
            d_f = backward(rb, features, ggw.contiguous(), grad_out, [True, False, False])[0]
        if want_w and ggf is not None:
            d_w = backward(rb, ggf.contiguous(), weight, grad_out, [False, True, False])[1]
        return None, d_f, d_w, d_g, None

    torch.library.register_autograd(backward._qualified_op_name, double_grad,
                                    setup_context=backward_setup)


def _register_pool_autograd(forward, backward):
    """max pool ``forward``'s gradient through ``backward``, and ``backward``'s own."""

    def setup(ctx, inputs, output):
        rulebook, features = inputs
        ctx.rulebook = rulebook
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    def grad(ctx, grad_out, _grad_argmax):
        (argmax,) = ctx.saved_tensors
        return None, backward(ctx.rulebook, argmax, grad_out.contiguous())

    torch.library.register_autograd(forward._qualified_op_name, grad, setup_context=setup)

    # maxpool_backward puts grad_out[o, c] at input row argmax[o, c]: linear in grad_out, and its
    # gradient reads the incoming gradient back at the same rows (outputs without pairs, argmax
    # -1, get 0). torch.gather keeps every further order differentiable.

    def backward_setup(ctx, inputs, output):
        rulebook, argmax, grad_out = inputs
        ctx.save_for_backward(argmax)

    def double_grad(ctx, gg):
        (argmax,) = ctx.saved_tensors
        if not ctx.needs_input_grad[2]:
            return None, None, None
        valid = argmax >= 0
        picked = torch.gather(gg, 0, argmax.long().clamp(min=0))
        return None, None, torch.where(valid, picked, picked.new_zeros(()))

    torch.library.register_autograd(backward._qualified_op_name, double_grad,
                                    setup_context=backward_setup)


def _register_avgpool_autograd(forward, backward):
    """average pool ``forward``'s gradient through ``backward``, and ``backward``'s own. Both are
    linear, and each is the other's adjoint: forward gives out[o] = sum over o's pairs (i, o) of
    f[i] / n[o], backward gives g_in[i] = sum over i's pairs (i, o) of g[o] / n[o], so the
    gradient of <gg, backward(g)> with respect to g is forward(gg)."""

    def setup(ctx, inputs, output):
        ctx.rulebook = inputs[0]

    def grad(ctx, grad_out):
        if not ctx.needs_input_grad[1]:
            return None, None
        return None, backward(ctx.rulebook, grad_out.contiguous())

    def double_grad(ctx, gg):
        if not ctx.needs_input_grad[1]:
            return None, None
        return None, forward(ctx.rulebook, gg.contiguous())

    torch.library.register_autograd(forward._qualified_op_name, grad, setup_context=setup)
    torch.library.register_autograd(backward._qualified_op_name, double_grad, setup_context=setup)


_register_conv_autograd(_ops.conv_forward, _ops.conv_backward)
_register_conv_autograd(_ops.conv_forward_token, _ops.conv_backward_token)
_register_pool_autograd(_ops.maxpool_forward, _ops.maxpool_backward)
_register_pool_autograd(_ops.maxpool_forward_token, _ops.maxpool_backward_token)
_register_avgpool_autograd(_ops.avgpool_forward, _ops.avgpool_backward)
_register_avgpool_autograd(_ops.avgpool_forward_token, _ops.avgpool_backward_token)


def _dense_setup(ctx, inputs, output):
    features, indices, spatial_shape, batch_size = inputs
    ctx.save_for_backward(indices)


def _dense_backward(ctx, grad_dense):
    # The gradient of a scatter into the dense grid is the gather at the same sites.
    (indices,) = ctx.saved_tensors
    idx = indices.long()
    grad = grad_dense.permute(0, 2, 3, 4, 1)[idx[:, 0], idx[:, 1], idx[:, 2], idx[:, 3]]
    return grad, None, None, None


torch.library.register_autograd("spconv_c::sparse_to_dense", _dense_backward,
                                setup_context=_dense_setup)


# ---- Python entry points ------------------------------------------------------------------------

def _triple(v):
    if isinstance(v, int):
        return [v, v, v]
    v = [int(x) for x in v]
    return v * 3 if len(v) == 1 else v


def _geometry(kernel_size, stride, padding, dilation, output_padding):
    """A layer's kernel, stride, padding, dilation and output padding, each as 3 ints (the
    builders' arguments in their schema's order)."""
    return (_triple(kernel_size), _triple(stride), _triple(padding), _triple(dilation),
            _triple(output_padding))


@torch.compiler.disable
def build_rulebook(indices, spatial_shape, batch_size, kind, kernel_size, stride=1, padding=0,
                   dilation=1, output_padding=0):
    """The rulebook of a conv or pool of ``kind`` (REGULAR, SUBM, TRANSPOSED) over ``indices``."""
    return _ops.build_rulebook(indices, _triple(spatial_shape), int(batch_size), int(kind),
                               *_geometry(kernel_size, stride, padding, dilation, output_padding))


@torch.compiler.disable
def build_rulebook_on(source, output_side, kind, kernel_size, stride=1, padding=0, dilation=1,
                      output_padding=0):
    """build_rulebook over ``source``'s output sites (``output_side``) or input sites, on that
    side's spatial shape and ``source``'s batch size, skipping the rows' checks: only for sites
    that nothing has written into since ``source`` was built. Returns (rulebook, its
    out_indices(), its out_shape())."""
    return _call_builder(_ops.build_rulebook_on, source, bool(output_side), int(kind),
                         *_geometry(kernel_size, stride, padding, dilation, output_padding))


@torch.compiler.disable
def inverse_rulebook(forward):
    return _call_builder(_ops.inverse_rulebook, forward)


def _inference():
    """True when no graph can be recorded (grad mode off) and nothing is tracing.

    The autograd kernels registered above are Python functions that the dispatcher calls for
    every op, gradient or not; with grad mode off they only step below autograd and call the op
    again, which costs ~15 us a call. Inference (a detector's forward under torch.no_grad(), or
    spconv's benchmark) then goes below autograd directly, as they would. Under torch.compile
    the ops are traced through the dispatcher as always."""
    return not torch.is_grad_enabled() and not torch.compiler.is_compiling()


_below_autograd = torch._C._AutoDispatchBelowAutograd

# Inference calls go to the dispatcher boxed (torch._C._dispatch_call_boxed on the op's handle),
# not through ``torch.ops``' Python argument parsing: that parsing asks every argument for
# ``__torch_function__``, and a rulebook (a torchbind ScriptObject) answers through a C++
# exception. That cost 10 us a call with warm caches and 0.1-0.2 ms after a layer's products had
# flushed them (SECOND: ~1 ms a pass over its 12 convs; docs/pytorch.md). The dispatcher is the
# same either way (the same kernel, dispatch modes and the Python key included); a torch
# function mode, which only the Python parsing consults, takes the ordinary call.
_boxed_call = getattr(torch._C, "_dispatch_call_boxed", None)
_find_op = getattr(torch._C, "_dispatch_find_schema_or_throw", None)
_function_mode = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: True)
_handles = {}


def _handle(op):
    """The dispatcher's handle of ``op`` (an OpOverloadPacket of torch.ops.spconv_c)."""
    handle = _handles.get(op)
    if handle is None:
        handle = _handles[op] = _find_op(op._qualified_op_name, "")
    return handle


def _call_below_autograd(op, *args):
    """``op(*args)`` below autograd, which the caller has entered."""
    if _boxed_call is not None and _find_op is not None and not _function_mode():
        return _boxed_call(_handle(op), *args)
    return op(*args)


def _call_builder(op, *args):
    """``op(*args)`` for a builder that takes a rulebook (build_rulebook_on, inverse_rulebook),
    boxed in any grad mode: they have no autograd behaviour (no tensor arguments), and through
    ``torch.ops`` their rulebook argument costs the exception described above (SECOND's seven
    builds on known sites: ~1 ms a pass)."""
    if _boxed_call is not None and _find_op is not None and not _function_mode():
        return _boxed_call(_handle(op), *args)
    return op(*args)


def _call(op, *args):
    """``op(*args)``, straight below autograd in inference (see _inference)."""
    if _inference():
        with _below_autograd():
            return _call_below_autograd(op, *args)
    return op(*args)


def build_subm_token(indices, spatial_shape, batch_size, kernel_size, stride=1, padding=0,
                     dilation=1, output_padding=0):
    """The token of ``build_rulebook(..., SUBM, ...)``; traced inside a compiled graph."""
    return _ops.build_subm_token(indices, _triple(spatial_shape), int(batch_size),
                                 *_geometry(kernel_size, stride, padding, dilation,
                                            output_padding))


def build_rulebook_token(indices, spatial_shape, batch_size, kind, kernel_size, stride=1,
                        padding=0, dilation=1, output_padding=0):
    """(token, out_indices) of ``build_rulebook(...)`` for a regular, pool or transposed
    ``kind``; traced inside a compiled graph (the output count an unbacked size)."""
    return _ops.build_rulebook_token(indices, _triple(spatial_shape), int(batch_size), int(kind),
                                     *_geometry(kernel_size, stride, padding, dilation,
                                                output_padding))


def output_shape(kind, spatial_shape, kernel_size, stride, padding, dilation, output_padding):
    """The output spatial shape of a rulebook of ``kind`` (REGULAR, SUBM, TRANSPOSED) on
    ``spatial_shape`` (3 ints), as the engine computes it (spconv_conv_output_shape; a test
    holds them equal), for compiled code, where the rulebook's own out_shape() cannot be read.
    An empty or too large output is refused as the engine refuses it (before tracing goes on
    with sizes that make no sense)."""
    out = []
    for axis, (n, k, s, p, d, op) in enumerate(zip(
            spatial_shape, *_geometry(kernel_size, stride, padding, dilation, output_padding))):
        if kind == SUBM:
            size = n
        elif kind == TRANSPOSED:
            size = (n - 1) * s - 2 * p + d * (k - 1) + 1 + op
        else:
            span = n + 2 * p - d * (k - 1) - 1
            size = 0 if span < 0 else span // s + 1
        name = "zyx"[axis]
        if size <= 0:
            raise RuntimeError(f"spconv_c: output spatial shape is empty on axis {axis} ({name}): "
                               f"input {n}, kernel {k}, stride {s}, padding {p}, dilation {d} "
                               f"give {size}")
        if size > 2**31 - 1:
            raise RuntimeError(f"spconv_c: output spatial shape on axis {axis} ({name}) would be "
                               f"{size}, beyond int32 coordinates")
        out.append(size)
    return out


def inverse_token(forward):
    """The token of the inverse of the rulebook whose token is ``forward``; traced inside a
    compiled graph."""
    return _ops.inverse_token(forward)


def check_sites_token(token, indices, version, what):
    """``token`` again (a new tensor of the same rulebook) once ``indices`` are found at
    ``version`` (-1: the one the rulebook's build read; -2: nothing to compare) when the graph
    runs; else a ValueError saying ``what``. Traced inside compiled graphs."""
    return _ops.check_sites_token(token, indices, int(version), str(what))


def check_lifted_token(token, rows, indices, what):
    """``token`` again (a new tensor of the same rulebook) once ``rows``, the engine's [N, 4]
    sites, are found to lift ``indices``, a 1-d / 2-d layer's [N, 1 + ndim] ones, row for row when
    the graph runs; else a ValueError saying ``what``. Traced inside compiled graphs."""
    return _ops.check_lifted_token(token, rows, indices, str(what))


@torch.compiler.disable
def token_rulebook(token):
    """The Rulebook handle a token stands for (outside any compiled graph)."""
    return _ops.token_rulebook(token)


@torch.compiler.disable
def rulebook_token(rulebook):
    """``rulebook.token()``, outside any compiled graph (where the handle would be a fake one)."""
    return rulebook.token()


def _call_rulebook_op(op, token_op, rulebook, *args):
    """_call for the differentiable ops that take a rulebook (conv, max pool): ``op`` with a
    rulebook handle, ``token_op`` with a token (Rulebook.token()). Under torch.compile a handle
    is swapped for its token first (made outside the graph: a graph break; the modules hand the
    ops tokens there, made where the rulebook is built, so theirs do not break). Traced, a
    handle is a fake object with the sizes of the first rulebook traced, which nothing guards:
    a graph compiled for one scan gave the next one outputs of the wrong size (inductor refused
    them; with a gradient AOTAutograd could not save it for the backward either). A token is a
    tensor, whose sizes the graph guards or makes symbolic like any other input's."""
    if isinstance(rulebook, torch.Tensor):
        return _call(token_op, rulebook, *args)
    if torch.compiler.is_compiling():
        return token_op(rulebook_token(rulebook), *args)
    return _call(op, rulebook, *args)


def indice_conv(rulebook, features, weight, bias=None):
    """Differentiable sparse conv over ``rulebook`` (a handle, or its token); weight
    [KV, C_in, C_out] or 5-d RSCK."""
    return _call_rulebook_op(_ops.conv_forward, _ops.conv_forward_token, rulebook, features,
                             weight, bias)


def indice_conv_bn(rulebook, features, weight, bias, bn, relu, krsc=False):
    """``relu(bn(indice_conv(...)))`` for an ``nn.BatchNorm1d`` ``bn`` in eval mode, in one op:
    inference only (see modules._fold_length for when it is used); ``krsc``: ``weight`` is a
    module's KRSC [C_out, *K, C_in]. The op has no autograd kernel, so the call goes straight
    to it (no below-autograd guard to enter)."""
    params, buffers = bn._parameters, bn._buffers
    return _call_below_autograd(_ops.conv_forward_bn, rulebook, features, weight, bias,
                                params.get("weight"), params.get("bias"),
                                buffers["running_mean"], buffers["running_var"], bn.eps, relu,
                                krsc)


def indice_maxpool(rulebook, features):
    """Differentiable max pool over ``rulebook`` (a handle, or its token; starts from -inf, NaN
    propagates). In inference (see _inference) with a handle, without the argmax, which only a
    backward reads (maxpool_inference; the op has no autograd kernel to step below)."""
    if _inference() and not isinstance(rulebook, torch.Tensor):
        return _call_below_autograd(_ops.maxpool_inference, rulebook, features)
    return _call_rulebook_op(_ops.maxpool_forward, _ops.maxpool_forward_token, rulebook,
                             features)[0]


def indice_avgpool(rulebook, features):
    """Differentiable average pool over ``rulebook`` (a handle, or its token): each output's mean
    over the inputs of its pairs, summed offset by offset (16-bit ones in float32)."""
    return _call_rulebook_op(_ops.avgpool_forward, _ops.avgpool_forward_token, rulebook,
                             features)


def sparse_to_dense(features, indices, spatial_shape, batch_size):
    """Differentiable dense [B, C, D, H, W] of a sparse tensor."""
    return _call(_ops.sparse_to_dense, features, indices, _triple(spatial_shape), int(batch_size))


def voxelize(points, voxel_size, coors_range, max_points, max_voxels):
    return _ops.voxelize(points, [float(v) for v in voxel_size], [float(v) for v in coors_range],
                         int(max_points), int(max_voxels))
