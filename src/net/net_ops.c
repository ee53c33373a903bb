/* The network's layer kernels through the backend table: each call picks the backend of its
 * tensors' device with SPCONV_DISPATCH, so the network has no CPU-only layer and no device
 * branch of its own. spconv__net_check_backend asks the same table up front for every kernel a
 * network will need. */
#include "conv/half.h"
#include "core/backend.h"
#include "core/error.h"
#include "net/net_internal.h"
#include "tensor/tensor_impl.h"

/* The first argument of SPCONV_DISPATCH's message: the drivers prefix the layer. */
#define FUNC "network layer"

/* ---- 16-bit features ----------------------------------------------------------------------
 * The layer kernels compute in f32 or f64. For f16 / bf16 features each wrapper widens its
 * operands to f32 on their device (exactly), runs the kernel in place on those copies, and rounds
 * the tensor result once into the caller's, as the conv and pool entry points do (conv/half.h);
 * per-channel vectors and statistics are doubles throughout. */

static int is_half(const spconv_tensor *t) {
    return spconv__is_half_dtype(spconv_tensor_dtype(t));
}

static spconv_status widen(spconv_context *ctx, const spconv_tensor *t, spconv_tensor **wide) {
    return spconv_tensor_to_dtype(ctx, t, SPCONV_F32, wide);
}

/* Round the f32 result @p wide into @p dst and release it. */
static spconv_status narrow_into(spconv_context *ctx, spconv_status st, spconv_tensor *wide,
                                 spconv_tensor *dst) {
    if (st == SPCONV_OK) st = spconv_tensor_copy_(ctx, dst, wide);
    spconv_tensor_release(wide);
    return st;
}

spconv_status spconv__net_batchnorm_stats(spconv_context *ctx, const spconv_tensor *x, double eps,
                                          double *stats) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), batchnorm_stats, "batch-norm statistics", &be);
    if (!is_half(x)) return be->batchnorm_stats(ctx, x, eps, stats);
    spconv_tensor *x32 = NULL;
    spconv_status st = widen(ctx, x, &x32);
    if (st == SPCONV_OK) st = be->batchnorm_stats(ctx, x32, eps, stats);
    spconv_tensor_release(x32);
    return st;
}

spconv_status spconv__net_batchnorm_terms(spconv_context *ctx, const spconv_tensor *x,
                                          const double *affine, const double *stats,
                                          double *terms) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), batchnorm_terms, "batch-norm terms", &be);
    return be->batchnorm_terms(ctx, x, affine, stats, terms);
}

spconv_status spconv__net_batchnorm_apply(spconv_context *ctx, const spconv_tensor *x,
                                          const double *scale, const double *shift, int relu,
                                          spconv_tensor *y) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), batchnorm_apply, "batch norm", &be);
    if (!is_half(x)) return be->batchnorm_apply(ctx, x, scale, shift, relu, y);
    spconv_tensor *x32 = NULL;
    spconv_status st = widen(ctx, x, &x32);
    if (st == SPCONV_OK) st = be->batchnorm_apply(ctx, x32, scale, shift, relu, x32);
    return narrow_into(ctx, st, x32, y);
}

spconv_status spconv__net_batchnorm_backward(spconv_context *ctx, const spconv_tensor *x,
                                             const spconv_tensor *dy, const double *stats,
                                             const double *gamma, spconv_tensor *dx,
                                             double *sums) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), batchnorm_backward, "batch-norm backward", &be);
    if (!is_half(x)) return be->batchnorm_backward(ctx, x, dy, stats, gamma, dx, sums);
    spconv_tensor *x32 = NULL, *dy32 = NULL;
    spconv_status st = widen(ctx, x, &x32);
    if (st == SPCONV_OK) st = widen(ctx, dy, &dy32);
    if (st == SPCONV_OK) st = be->batchnorm_backward(ctx, x32, dy32, stats, gamma, dy32, sums);
    spconv_tensor_release(x32);
    return narrow_into(ctx, st, dy32, dx);
}

spconv_status spconv__net_relu_forward(spconv_context *ctx, const spconv_tensor *x,
                                       spconv_tensor *y) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), relu_forward, "ReLU", &be);
    if (!is_half(x)) return be->relu_forward(ctx, x, y);
    spconv_tensor *x32 = NULL;
    spconv_status st = widen(ctx, x, &x32);
    if (st == SPCONV_OK) st = be->relu_forward(ctx, x32, x32);
    return narrow_into(ctx, st, x32, y);
}

spconv_status spconv__net_relu_backward(spconv_context *ctx, const spconv_tensor *y,
                                        const spconv_tensor *dy, spconv_tensor *dx) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(y), relu_backward, "ReLU backward", &be);
    if (!is_half(y)) return be->relu_backward(ctx, y, dy, dx);
    spconv_tensor *y32 = NULL, *dy32 = NULL;
    spconv_status st = widen(ctx, y, &y32);
    if (st == SPCONV_OK) st = widen(ctx, dy, &dy32);
    if (st == SPCONV_OK) st = be->relu_backward(ctx, y32, dy32, dy32);
    spconv_tensor_release(y32);
    return narrow_into(ctx, st, dy32, dx);
}

spconv_status spconv__net_axpy(spconv_context *ctx, double alpha, const spconv_tensor *x,
                               spconv_tensor *y) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(y), axpy, "axpy", &be);
    if (!is_half(x) && !is_half(y)) return be->axpy(ctx, alpha, x, y);
    spconv_tensor *x32 = NULL, *y32 = NULL;
    spconv_status st = widen(ctx, x, &x32);
    if (st == SPCONV_OK && !is_half(y)) st = be->axpy(ctx, alpha, x32, y);
    if (st != SPCONV_OK || !is_half(y)) {
        spconv_tensor_release(x32);
        return st;
    }
    st = widen(ctx, y, &y32);
    if (st == SPCONV_OK) st = be->axpy(ctx, alpha, x32, y32);
    spconv_tensor_release(x32);
    return narrow_into(ctx, st, y32, y);
}

spconv_status spconv__net_to_dense_scatter(spconv_context *ctx, const spconv_tensor *features,
                                           const spconv_tensor *indices, spconv_tensor *dense) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(features), to_dense_scatter, "to-dense", &be);
    if (!is_half(features)) return be->to_dense_scatter(ctx, features, indices, dense);
    spconv_tensor *f32 = NULL, *d32 = NULL;
    spconv_status st = widen(ctx, features, &f32);
    if (st == SPCONV_OK)
        st = spconv_tensor_zeros(ctx, spconv_tensor_device(dense), SPCONV_F32,
                                 spconv_tensor_ndim(dense), spconv_tensor_sizes(dense), &d32);
    if (st == SPCONV_OK) st = be->to_dense_scatter(ctx, f32, indices, d32);
    spconv_tensor_release(f32);
    return narrow_into(ctx, st, d32, dense);
}

spconv_status spconv__net_to_dense_gather(spconv_context *ctx, const spconv_tensor *dense,
                                          const spconv_tensor *indices, spconv_tensor *features) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(dense), to_dense_gather, "to-dense backward", &be);
    if (!is_half(dense)) return be->to_dense_gather(ctx, dense, indices, features);
    spconv_tensor *d32 = NULL, *f32 = NULL;
    spconv_status st = widen(ctx, dense, &d32);
    if (st == SPCONV_OK)
        st = spconv__tensor_empty_in(FUNC, ctx, spconv_tensor_device(features), SPCONV_F32,
                                     spconv_tensor_ndim(features), spconv_tensor_sizes(features),
                                     &f32);
    if (st == SPCONV_OK) st = be->to_dense_gather(ctx, d32, indices, f32);
    spconv_tensor_release(d32);
    return narrow_into(ctx, st, f32, features);
}

/* ---- what a network needs of a backend ----------------------------------------------------- */

/* The first kernel that @p kind needs and @p be lacks (its name), or NULL. */
static const char *missing_kernel(const spconv_backend *be, spconv_layer_kind kind, int training) {
#define NEED(slot, what)                                                                           \
    do {                                                                                           \
        if (be->slot == NULL) return what;                                                         \
    } while (0)
    switch (kind) {
    case SPCONV_LAYER_SUBM:
    case SPCONV_LAYER_CONV:
    case SPCONV_LAYER_TRANSPOSED:
        NEED(rulebook_build, "rulebook build");
        /* fall through */
    case SPCONV_LAYER_INVERSE:
        NEED(conv_forward, "conv forward");
        if (training) NEED(conv_backward, "conv backward");
        return NULL;
    case SPCONV_LAYER_MAXPOOL:
        NEED(rulebook_build, "rulebook build");
        NEED(maxpool_forward, "max-pool forward");
        if (training) NEED(maxpool_backward, "max-pool backward");
        return NULL;
    case SPCONV_LAYER_BATCHNORM:
        NEED(batchnorm_apply, "batch norm");
        if (training) NEED(batchnorm_stats, "batch-norm statistics");
        if (training) NEED(batchnorm_terms, "batch-norm terms");
        if (training) NEED(batchnorm_backward, "batch-norm backward");
        return NULL;
    case SPCONV_LAYER_RELU:
        NEED(relu_forward, "ReLU");
        if (training) NEED(relu_backward, "ReLU backward");
        return NULL;
    case SPCONV_LAYER_TO_DENSE:
        NEED(to_dense_scatter, "to-dense");
        if (training) NEED(to_dense_gather, "to-dense backward");
        return NULL;
    case SPCONV_LAYER_SAVE:
        if (training) NEED(axpy, "axpy");
        return NULL;
    case SPCONV_LAYER_CONCAT:
        NEED(copy_strided, "strided copy");
        if (training) NEED(axpy, "axpy");
        return NULL;
    }
#undef NEED
    return NULL;
}

spconv_status spconv__net_check_backend(const char *func, const spconv_net *net,
                                        spconv_device device, int training) {
    const spconv_backend *be;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &be));
    return spconv__net_check_kernels(func, net, be, training);
}

spconv_status spconv__net_check_kernels(const char *func, const spconv_net *net,
                                        const spconv_backend *be, int training) {
    for (int i = 0; i < net->num_layers; ++i) {
        const char *what = missing_kernel(be, net->layers[i].desc.kind, training);
        if (what == NULL) continue;
        const spconv_status st = spconv__error(
            SPCONV_ERR_NOT_SUPPORTED, "the input is on the %s backend, which has no %s kernel yet",
            be->name, what);
        return spconv__net_layer_error(func, &net->layers[i], st);
    }
    return SPCONV_OK;
}
