/* The network's layer kernels through the backend table: each call picks the backend of its
 * tensors' device with SPCONV_DISPATCH, so the network has no CPU-only layer and no device
 * branch of its own. spconv__net_check_backend asks the same table up front for every kernel a
 * network will need. */
#include "core/backend.h"
#include "core/error.h"
#include "net/net_internal.h"

/* The first argument of SPCONV_DISPATCH's message: the drivers prefix the layer. */
#define FUNC "network layer"

spconv_status spconv__net_batchnorm_stats(spconv_context *ctx, const spconv_tensor *x, double eps,
                                          double *mean, double *invstd, double *var_unbiased) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), batchnorm_stats, "batch-norm statistics", &be);
    return be->batchnorm_stats(ctx, x, eps, mean, invstd, var_unbiased);
}

spconv_status spconv__net_batchnorm_apply(spconv_context *ctx, const spconv_tensor *x,
                                          const double *scale, const double *shift, int relu,
                                          spconv_tensor *y) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), batchnorm_apply, "batch norm", &be);
    return be->batchnorm_apply(ctx, x, scale, shift, relu, y);
}

spconv_status spconv__net_batchnorm_backward(spconv_context *ctx, const spconv_tensor *x,
                                             const spconv_tensor *dy, const double *mean,
                                             const double *invstd, const double *gamma,
                                             spconv_tensor *dx, double *dgamma, double *dbeta) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), batchnorm_backward, "batch-norm backward", &be);
    return be->batchnorm_backward(ctx, x, dy, mean, invstd, gamma, dx, dgamma, dbeta);
}

spconv_status spconv__net_relu_forward(spconv_context *ctx, const spconv_tensor *x,
                                       spconv_tensor *y) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(x), relu_forward, "ReLU", &be);
    return be->relu_forward(ctx, x, y);
}

spconv_status spconv__net_relu_backward(spconv_context *ctx, const spconv_tensor *y,
                                        const spconv_tensor *dy, spconv_tensor *dx) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(y), relu_backward, "ReLU backward", &be);
    return be->relu_backward(ctx, y, dy, dx);
}

spconv_status spconv__net_axpy(spconv_context *ctx, double alpha, const spconv_tensor *x,
                               spconv_tensor *y) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(y), axpy, "axpy", &be);
    return be->axpy(ctx, alpha, x, y);
}

spconv_status spconv__net_to_dense_scatter(spconv_context *ctx, const spconv_tensor *features,
                                           const spconv_tensor *indices, spconv_tensor *dense) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(features), to_dense_scatter, "to-dense", &be);
    return be->to_dense_scatter(ctx, features, indices, dense);
}

spconv_status spconv__net_to_dense_gather(spconv_context *ctx, const spconv_tensor *dense,
                                          const spconv_tensor *indices, spconv_tensor *features) {
    const spconv_backend *be;
    SPCONV_DISPATCH(FUNC, spconv_tensor_device(dense), to_dense_gather, "to-dense backward", &be);
    return be->to_dense_gather(ctx, dense, indices, features);
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
