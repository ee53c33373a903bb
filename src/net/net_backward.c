/* The backward pass: layers in reverse order, each turning the gradient of its output into the
 * gradient of its input (and of its parameters) from what the training forward kept.
 *
 * A SAVE layer's output feeds the next layer and every CONCAT that reads it, so its gradient is
 * the sum of both: CONCAT hands the columns of the saved part back to the SAVE layer's slot, and
 * the SAVE layer adds that slot to the gradient flowing through it. The gradient may be
 * overwritten in place (ReLU, batch norm, SAVE's sum) only when it is ours, not the caller's
 * grad_out. */
#include <inttypes.h>
#include <stdlib.h>

#include "conv/conv_check.h"
#include "core/backend.h"
#include "core/error.h"
#include "net/net_internal.h"
#include "tensor/tensor_impl.h"

static const char backward_func[] = "spconv_net_backward";

typedef struct back_pass {
    spconv_context *ctx;
    spconv_net *net;
    int want_input;              /* the caller asked for the gradient of the input features */
    spconv_tensor *grad;         /* d loss / d (output of the running layer); one reference */
    int grad_owned;              /* 1: nothing else holds grad, in-place is safe */
    spconv_tensor **saved_grads; /* [num_layers]: gradient CONCATs hand back to a SAVE layer */
    spconv_phase_ms *phase;
    spconv_tensor **device_grads; /* [num_params]: gradients computed on another device than the
                                     CPU, brought to the CPU after the last layer (no wait
                                     between layers) */
} back_pass;

/* Replace the running gradient by @p next (whose reference is taken over), a tensor of ours. */
static void set_grad(back_pass *b, spconv_tensor *next) {
    spconv_tensor_release(b->grad);
    b->grad = next;
    b->grad_owned = 1;
}

/* The running gradient, writable: itself when ours, else a copy that becomes ours. */
static spconv_status own_grad(back_pass *b) {
    if (b->grad_owned) return SPCONV_OK;
    spconv_tensor *copy = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_clone(b->ctx, b->grad, &copy));
    set_grad(b, copy);
    return SPCONV_OK;
}

/* Store a parameter gradient (reference taken over). */
static void set_param_grad(spconv_net *net, int index, spconv_tensor *grad) {
    spconv_tensor_release(net->params[index].grad);
    net->params[index].grad = grad;
}

/* Store a parameter gradient computed on any device (reference taken over). Parameters live on
 * the CPU: a CPU gradient is stored as it is; one on another device waits in b->device_grads
 * until the end of the pass, so that the layers run without waiting for the device. */
static void set_param_grad_from(back_pass *b, int index, spconv_tensor *grad) {
    if (spconv_tensor_device(grad).type == SPCONV_DEVICE_CPU) {
        set_param_grad(b->net, index, grad);
        return;
    }
    spconv_tensor_release(b->device_grads[index]);
    b->device_grads[index] = grad;
}

static size_t tensor_bytes(const spconv_tensor *t) {
    return (size_t)spconv_tensor_numel(t) * spconv_dtype_size(spconv_tensor_dtype(t));
}

/* The gradients left on another device, to the CPU in one read: each is copied (queued on the
 * device) into one block, the block comes to the host, and each gradient is cut from it. */
static spconv_status bring_grads_home(back_pass *b) {
    const int count = b->net->num_params;
    spconv_tensor **flat = calloc((size_t)(count > 0 ? count : 1), sizeof *flat);
    SPCONV_RETURN_ERROR_IF(flat == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory",
                           backward_func);
    spconv_status st = SPCONV_OK;
    spconv_device device = spconv_cpu();
    size_t total = 0;
    for (int i = 0; i < count && st == SPCONV_OK; ++i) {
        if (b->device_grads[i] == NULL) continue;
        st = spconv_tensor_contiguous(b->ctx, b->device_grads[i], &flat[i]);
        if (st != SPCONV_OK) break;
        device = spconv_tensor_device(flat[i]);
        total += spconv__net_piece_bytes(tensor_bytes(flat[i]));
    }
    const spconv_backend *backend = NULL;
    spconv_storage *block = NULL;
    unsigned char *host = NULL;
    if (st == SPCONV_OK && total > 0) {
        st = spconv__backend_check(backward_func, device, &backend);
        if (st == SPCONV_OK)
            st = spconv__storage_create_in(backward_func, b->ctx, device, total, &block);
        host = st == SPCONV_OK ? malloc(total) : NULL;
        if (st == SPCONV_OK && host == NULL)
            st = spconv__error(SPCONV_ERR_OUT_OF_MEMORY,
                               "%s: out of host memory for %zu bytes of gradients",
                               backward_func, total);
    }
    size_t at = 0;
    for (int i = 0; i < count && st == SPCONV_OK && total > 0; ++i) {
        if (flat[i] == NULL) continue;
        const size_t bytes = tensor_bytes(flat[i]);
        if (bytes > 0)
            st = backend->copy_on_device(b->ctx, device.index,
                                         (unsigned char *)spconv_storage_data(block) + at,
                                         spconv_tensor_data(flat[i]), bytes);
        at += spconv__net_piece_bytes(bytes);
    }
    if (st == SPCONV_OK && total > 0)
        st = backend->copy_to_host(b->ctx, device.index, host, spconv_storage_data(block), total);
    at = 0;
    for (int i = 0; i < count; ++i) {
        if (flat[i] == NULL) continue;
        spconv_tensor *home = NULL;
        if (st == SPCONV_OK)
            st = spconv_tensor_from_host(NULL, spconv_cpu(), spconv_tensor_dtype(flat[i]),
                                         spconv_tensor_ndim(flat[i]), spconv_tensor_sizes(flat[i]),
                                         host + at, &home);
        if (home != NULL) set_param_grad(b->net, i, home);
        at += spconv__net_piece_bytes(tensor_bytes(flat[i]));
        spconv_tensor_release(flat[i]);
        spconv_tensor_release(b->device_grads[i]);
        b->device_grads[i] = NULL;
    }
    spconv_storage_release(block);
    free(host);
    free(flat);
    return st;
}

static spconv_status backward_conv(back_pass *b, const spconv__net_layer *layer,
                                   const spconv__layer_tape *tape) {
    const spconv__net_param *params = &b->net->params[layer->first_param];
    spconv_tensor *d_in = NULL, *d_weight = NULL, *d_bias = NULL;
    spconv__conv_timing timing = {0};
    if (b->net->timing == SPCONV_NET_TIME_PHASES) { /* the conv's phases on the device's clock, where it has one */
        timing.clock = b->net->clock;
        timing.device_ms[0] = &b->phase->gather;
        timing.device_ms[1] = &b->phase->gemm;
        timing.device_ms[2] = &b->phase->scatter;
    }
    const spconv__conv_options options = {SPCONV__GEMM_AUTO, &timing, NULL};
    /* The first layer's input gradient is wanted only when the caller asked for it. */
    int want_in = layer->stats.index > 0 || b->want_input;
    /* The weight the forward used: its copy on the forward's device, or the CPU parameter. */
    const spconv_tensor *w = b->net->tape_mirror != NULL
                                 ? b->net->tape_mirror->params[layer->first_param]
                                 : params[0].value;
    spconv_status st =
        spconv__conv_backward_ex(b->ctx, tape->rulebook, spconv_sparse_features(tape->in), w,
                                 b->grad, &options, want_in ? &d_in : NULL, &d_weight,
                                 layer->desc.bias ? &d_bias : NULL);
    spconv__net_add_conv_timing(b->phase, &timing);
    SPCONV_FORWARD_IF_ERROR(st);
    set_param_grad_from(b, layer->first_param, d_weight);
    if (layer->desc.bias) set_param_grad_from(b, layer->first_param + 1, d_bias);
    if (want_in) {
        set_grad(b, d_in);
    } else {
        spconv_tensor_release(b->grad);
        b->grad = NULL;
    }
    return SPCONV_OK;
}

/* Batch-norm backward on the features' device: dx in place of dy, and dgamma, dbeta from sums
 * left there (on a device they come home with the other parameter gradients, after the pass).
 * gamma comes from the forward's device copy, or on the CPU from the parameter. */
static spconv_status backward_batchnorm(back_pass *b, const spconv__net_layer *layer,
                                        const spconv__layer_tape *tape) {
    static const char func[] = "spconv_net_backward";
    const int64_t c = layer->c_in, two = 2 * c;
    const int p0 = layer->first_param;
    const spconv_tensor *x = spconv_sparse_features(tape->in);
    const spconv_device dev = spconv_tensor_device(x);
    const spconv_dtype param_dtype = spconv_tensor_dtype(b->net->params[p0].value);
    spconv_tensor *gamma = NULL, *sums = NULL, *view = NULL, *d_gamma = NULL, *d_beta = NULL;
    const double *gamma_d = NULL;
    spconv_status st = SPCONV_OK;
    if (b->net->tape_mirror != NULL) {
        gamma_d = (const double *)spconv_tensor_data(
                      b->net->tape_mirror->bn_terms[layer->stats.index]) +
                  2 * c;
    } else {
        st = spconv__tensor_empty_in(func, b->ctx, dev, SPCONV_F64, 1, &c, &gamma);
        if (st == SPCONV_OK) { /* the CPU: parameters are CPU tensors */
            spconv__net_to_doubles(b->net->params[p0].value, spconv_tensor_data(gamma));
            gamma_d = spconv_tensor_data(gamma);
        }
    }
    if (st == SPCONV_OK) st = spconv__tensor_empty_in(func, b->ctx, dev, SPCONV_F64, 1, &two, &sums);
    /* dx may overwrite dy: the kernel reads each dy element once, after its sums. */
    if (st == SPCONV_OK) st = own_grad(b);
    if (st == SPCONV_OK)
        st = spconv__net_batchnorm_backward(b->ctx, x, b->grad, spconv_tensor_data(tape->bn_stats),
                                            gamma_d, b->grad, spconv_tensor_data(sums));
    /* the sums in the parameters' dtype, rounded as on the host (tensor/convert.h) */
    if (st == SPCONV_OK) st = spconv_tensor_narrow(sums, 0, 0, c, &view);
    if (st == SPCONV_OK) st = spconv_tensor_to_dtype(b->ctx, view, param_dtype, &d_gamma);
    spconv_tensor_release(view);
    view = NULL;
    if (st == SPCONV_OK) st = spconv_tensor_narrow(sums, 0, c, c, &view);
    if (st == SPCONV_OK) st = spconv_tensor_to_dtype(b->ctx, view, param_dtype, &d_beta);
    spconv_tensor_release(view);
    if (st == SPCONV_OK) {
        set_param_grad_from(b, p0, d_gamma);
        set_param_grad_from(b, p0 + 1, d_beta);
    } else {
        spconv_tensor_release(d_gamma);
        spconv_tensor_release(d_beta);
    }
    spconv_tensor_release(gamma);
    spconv_tensor_release(sums);
    return st;
}

static spconv_status backward_concat(back_pass *b, const spconv__net_layer *layer) {
    const int64_t first = layer->c_in, second = layer->c_out - layer->c_in;
    spconv_tensor *view = NULL, *mine = NULL, *theirs = NULL;
    /* Clones, not views: each part is then ours to overwrite without touching the other. */
    spconv_status st = spconv_tensor_narrow(b->grad, 1, 0, first, &view);
    if (st == SPCONV_OK) st = spconv_tensor_clone(b->ctx, view, &mine);
    spconv_tensor_release(view);
    view = NULL;
    if (st == SPCONV_OK) st = spconv_tensor_narrow(b->grad, 1, first, second, &view);
    if (st == SPCONV_OK) st = spconv_tensor_clone(b->ctx, view, &theirs);
    spconv_tensor_release(view);
    if (st != SPCONV_OK) {
        spconv_tensor_release(mine);
        spconv_tensor_release(theirs);
        return st;
    }
    spconv_tensor **slot = &b->saved_grads[layer->saved_layer];
    if (*slot == NULL) {
        *slot = theirs;
    } else {
        st = spconv__net_axpy(b->ctx, 1.0, theirs, *slot);
        spconv_tensor_release(theirs);
        if (st != SPCONV_OK) {
            spconv_tensor_release(mine);
            return st;
        }
    }
    set_grad(b, mine);
    return SPCONV_OK;
}

static spconv_status backward_to_dense(back_pass *b, const spconv__net_layer *layer,
                                       const spconv__layer_tape *tape) {
    spconv_tensor *indices = NULL, *d_in = NULL;
    const int64_t n = spconv_sparse_num_sites(tape->in);
    SPCONV_FORWARD_IF_ERROR(
        spconv_tensor_contiguous(b->ctx, spconv_sparse_indices(tape->in), &indices));
    const int64_t sizes[2] = {n, layer->c_in};
    spconv_status st =
        spconv__tensor_empty_in("spconv_net_backward", b->ctx, spconv_tensor_device(b->grad),
                                b->net->dtype, 2, sizes, &d_in);
    if (st == SPCONV_OK) {
        st = spconv__net_to_dense_gather(b->ctx, b->grad, indices, d_in);
        if (st == SPCONV_OK)
            set_grad(b, d_in);
        else
            spconv_tensor_release(d_in);
    }
    spconv_tensor_release(indices);
    return st;
}

static spconv_status backward_kind(back_pass *b, const spconv__net_layer *layer,
                                   const spconv__layer_tape *tape) {
    switch (layer->desc.kind) {
    case SPCONV_LAYER_SUBM:
    case SPCONV_LAYER_CONV:
    case SPCONV_LAYER_TRANSPOSED:
    case SPCONV_LAYER_INVERSE: return backward_conv(b, layer, tape);
    case SPCONV_LAYER_MAXPOOL: {
        spconv_tensor *d_in = NULL;
        SPCONV_FORWARD_IF_ERROR(
            spconv__maxpool_backward_trusted(b->ctx, tape->rulebook, tape->argmax, b->grad,
                                             &d_in));
        set_grad(b, d_in);
        return SPCONV_OK;
    }
    case SPCONV_LAYER_BATCHNORM: return backward_batchnorm(b, layer, tape);
    case SPCONV_LAYER_RELU:
        SPCONV_FORWARD_IF_ERROR(own_grad(b));
        return spconv__net_relu_backward(b->ctx, spconv_sparse_features(tape->out), b->grad,
                                         b->grad);
    case SPCONV_LAYER_TO_DENSE: return backward_to_dense(b, layer, tape);
    case SPCONV_LAYER_SAVE: {
        spconv_tensor *extra = b->saved_grads[layer->stats.index];
        if (extra == NULL) return SPCONV_OK;
        SPCONV_FORWARD_IF_ERROR(own_grad(b));
        return spconv__net_axpy(b->ctx, 1.0, extra, b->grad);
    }
    case SPCONV_LAYER_CONCAT: return backward_concat(b, layer);
    }
    SPCONV_RETURN_ERROR(SPCONV_ERR_INTERNAL, "layer kind %d has no backward",
                        (int)layer->desc.kind);
}

/* grad_out must have the shape of the last forward's output. */
static spconv_status check_grad_out(const spconv_net *net, const spconv_tensor *grad_out) {
    const spconv__net_layer *last = &net->layers[net->num_layers - 1];
    const spconv__layer_tape *tape = &net->tape[net->num_layers - 1];
    int64_t want[4];
    int ndim = 2;
    want[0] = spconv_sparse_num_sites(tape->out);
    want[1] = last->c_out;
    if (last->desc.kind == SPCONV_LAYER_TO_DENSE) {
        int64_t shape[3];
        spconv_sparse_spatial_shape(tape->in, shape);
        ndim = 4;
        want[0] = spconv_sparse_batch_size(tape->in);
        want[1] = last->c_out * shape[0];
        want[2] = shape[1];
        want[3] = shape[2];
    }
    int same = spconv_tensor_ndim(grad_out) == ndim;
    for (int i = 0; same && i < ndim; ++i) same = spconv_tensor_size(grad_out, i) == want[i];
    SPCONV_RETURN_ERROR_IF(!same, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: grad_out has %d dims [%" PRId64 ", %" PRId64 ", ...] but the "
                           "output of the last forward is [%" PRId64 ", %" PRId64 "%s]",
                           backward_func, spconv_tensor_ndim(grad_out),
                           spconv_tensor_size(grad_out, 0), spconv_tensor_size(grad_out, 1),
                           want[0], want[1], ndim == 4 ? ", H, W" : "");
    SPCONV_RETURN_ERROR_IF(spconv_tensor_dtype(grad_out) != net->dtype, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: grad_out is %s but the network's dtype is %s", backward_func,
                           spconv_dtype_name(spconv_tensor_dtype(grad_out)),
                           spconv_dtype_name(net->dtype));
    SPCONV_RETURN_ERROR_IF(
        !spconv_device_equal(spconv_tensor_device(grad_out),
                             spconv_tensor_device(spconv_sparse_features(tape->out))),
        SPCONV_ERR_DEVICE_MISMATCH,
        "%s: grad_out is not on the device of the last forward's output", backward_func);
    return SPCONV_OK;
}

static spconv_status back_layer(back_pass *b, int index) {
    spconv_net *net = b->net;
    spconv__net_layer *layer = &net->layers[index];
    const double start = spconv__now_s();
    int first = -1;
    spconv_status st = spconv__net_clock_mark(net, b->ctx, &first);
    if (st != SPCONV_OK) return spconv__net_layer_error(backward_func, layer, st);
    b->phase = &layer->stats.backward;
    st = backward_kind(b, layer, &net->tape[index]);
    if (st != SPCONV_OK) return spconv__net_layer_error(backward_func, layer, st);
    st = spconv__net_finish_phase(net, b->ctx, b->phase, start, first);
    if (st != SPCONV_OK) return spconv__net_layer_error(backward_func, layer, st);
    if (net->progress != NULL) net->progress(net->progress_user, &layer->stats, net->num_layers, 1);
    return SPCONV_OK;
}

spconv_status spconv_net_backward(spconv_context *ctx, spconv_net *net,
                                  const spconv_tensor *grad_out, spconv_tensor **grad_input) {
    if (grad_input != NULL) *grad_input = NULL;
    SPCONV_CHECK_NOT_NULL(backward_func, net);
    SPCONV_CHECK_NOT_NULL(backward_func, grad_out);
    SPCONV_RETURN_ERROR_IF(!net->has_tape, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: nothing to go back through: run spconv_net_forward in "
                           "SPCONV_NET_TRAINING mode first (each backward needs its own forward)",
                           backward_func);
    SPCONV_FORWARD_IF_ERROR(check_grad_out(net, grad_out));
    back_pass b = {.ctx = ctx,
                   .net = net,
                   .want_input = grad_input != NULL};
    b.saved_grads = calloc((size_t)net->num_layers, sizeof *b.saved_grads);
    b.device_grads = calloc((size_t)net->num_params + 1, sizeof *b.device_grads);
    spconv_status st = SPCONV_OK;
    if (b.saved_grads == NULL || b.device_grads == NULL)
        st = spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory", backward_func);
    if (st == SPCONV_OK) st = spconv_tensor_contiguous(ctx, grad_out, &b.grad);
    for (int i = net->num_layers - 1; i >= 0 && st == SPCONV_OK && b.grad != NULL; --i)
        st = back_layer(&b, i);
    if (st == SPCONV_OK && grad_input != NULL) st = own_grad(&b);
    if (st == SPCONV_OK) st = bring_grads_home(&b);
    if (st == SPCONV_OK && grad_input != NULL) {
        *grad_input = b.grad;
        b.grad = NULL;
    }
    if (st == SPCONV_OK) net->has_grads = 1;
    spconv_tensor_release(b.grad);
    if (b.saved_grads != NULL)
        for (int i = 0; i < net->num_layers; ++i) spconv_tensor_release(b.saved_grads[i]);
    free(b.saved_grads);
    if (b.device_grads != NULL)
        for (int i = 0; i < net->num_params; ++i) spconv_tensor_release(b.device_grads[i]);
    free(b.device_grads);
    spconv__net_clear_tape(net);
    return st;
}
