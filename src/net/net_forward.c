/* The forward pass: one function per layer kind, and the driver that chains them, times them and
 * keeps (in training mode) what backward needs.
 *
 * In-place work: the current features may be overwritten (ReLU, inference batch norm) only when
 * nothing else holds them. They are not ours when they are the caller's input, after a SAVE
 * (the saved tensor is the same one) and after a training ReLU (its backward reads its output).
 * Layers whose backward reads their input (convs, training batch norm) write new tensors. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "net/net_internal.h"
#include "tensor/tensor_impl.h"

static const char forward_func[] = "spconv_net_forward";

typedef struct net_pass {
    spconv_context *ctx;
    spconv_net *net;
    int training;
    spconv_sparse_tensor *cur;    /* one reference */
    int cur_owned;                /* 1: nothing else holds cur's features, in-place is safe */
    spconv_sparse_tensor **saved; /* [num_layers]: the tensor of each SAVE layer */
    spconv_tensor *dense;         /* TO_DENSE output */
    spconv_phase_ms *phase;       /* the running layer's forward times */
    int relu_done;                /* the batch norm before has applied the next layer's ReLU */
    int bn_done;                  /* the conv before has applied the next layer's batch norm */
    spconv__net_mirror *mirror;   /* the parameters on the features' device; NULL on the CPU */
    spconv_tensor *bn_block;      /* training: every batch norm's statistics, f64 [3 C] each in
                                     layer order, on the features' device (one read at the end) */
    int64_t bn_used;              /* doubles of bn_block handed out so far */
} net_pass;

static spconv_tensor *cur_features(const net_pass *p) { return spconv_sparse_features(p->cur); }

/* A new [rows, cols] tensor of the network's dtype, on the device of the current features, from
 * the context's allocator. */
static spconv_status new_matrix(const net_pass *p, int64_t rows, int64_t cols,
                                spconv_tensor **out) {
    const int64_t sizes[2] = {rows, cols};
    return spconv__tensor_empty_in("spconv_net_forward", p->ctx,
                                   spconv_tensor_device(cur_features(p)), p->net->dtype, 2, sizes,
                                   out);
}

/* Rulebook through @p p->cur's cache, timed as the rulebook phase. */
static spconv_status get_rulebook(net_pass *p, const spconv__net_layer *layer,
                                  spconv_rulebook **rb) {
    double start = spconv__now_s();
    int first = -1;
    SPCONV_FORWARD_IF_ERROR(spconv__net_clock_mark(p->net, p->ctx, &first));
    spconv_status st =
        spconv_sparse_get_rulebook(p->ctx, p->cur, &layer->params, layer->desc.key, rb);
    if (p->net->clock == NULL) {
        p->phase->rulebook = 1e3 * (spconv__now_s() - start);
    } else if (st == SPCONV_OK) { /* on the device's clock */
        st = spconv__net_clock_span_since(p->net, p->ctx, first, &p->phase->rulebook);
        if (st != SPCONV_OK) {
            spconv_rulebook_release(*rb);
            *rb = NULL;
        }
    }
    return st;
}

/* The layer after @p layer, or NULL. */
static const spconv__net_layer *layer_after(const net_pass *p, const spconv__net_layer *layer) {
    const spconv__net_layer *after = layer + 1;
    return after < p->net->layers + p->net->num_layers ? after : NULL;
}

static int fold_batchnorm = 1; /* spconv__net_fold_batchnorm */

int spconv__net_fold_batchnorm(int on) {
    const int previous = fold_batchnorm;
    if (on >= 0) fold_batchnorm = on != 0;
    return previous;
}

/* In inference a batch norm right after a conv on f32 / f64 CPU features (and a ReLU right after
 * that) is applied by the conv to each block of output rows while they are in cache, the same
 * arithmetic as forward_batchnorm's pass over the whole output (so the same bits), which then
 * passes the features on. */
static int folds_batchnorm(const net_pass *p, const spconv__net_layer *layer) {
    const spconv__net_layer *bn = layer_after(p, layer);
    const spconv_tensor *x = cur_features(p);
    return fold_batchnorm && !p->training && bn != NULL && bn->desc.kind == SPCONV_LAYER_BATCHNORM &&
           spconv_tensor_device(x).type == SPCONV_DEVICE_CPU &&
           (p->net->dtype == SPCONV_F32 || p->net->dtype == SPCONV_F64);
}

static spconv_status forward_conv(net_pass *p, spconv__net_layer *layer, spconv__layer_tape *tape,
                                  spconv_sparse_tensor **next) {
    spconv_rulebook *rb = NULL;
    spconv_tensor *y = NULL;
    SPCONV_FORWARD_IF_ERROR(get_rulebook(p, layer, &rb));
    const spconv__net_param *params = &p->net->params[layer->first_param];
    spconv__conv_timing timing = {0};
    double *bn_work = NULL;
    spconv__conv_epilogue epilogue = {NULL, NULL, 0, 1};
    const int fold = folds_batchnorm(p, layer);
    if (fold) {
        const spconv__net_layer *bn = layer_after(p, layer), *relu = layer_after(p, bn);
        bn_work = malloc((size_t)(6 * bn->c_in) * sizeof *bn_work);
        if (bn_work == NULL) {
            spconv_rulebook_release(rb);
            SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY,
                                "out of host memory for %" PRId64 " channels", bn->c_in);
        }
        spconv__net_bn_inference_terms(p->net, bn, bn_work);
        epilogue.scale = bn_work + 4 * bn->c_in;
        epilogue.shift = bn_work + 5 * bn->c_in;
        epilogue.relu = relu != NULL && relu->desc.kind == SPCONV_LAYER_RELU;
    }
    if (p->net->timing == SPCONV_NET_TIME_PHASES) { /* the conv's phases on the device's clock, where it has one */
        timing.clock = p->net->clock;
        timing.device_ms[0] = &p->phase->gather;
        timing.device_ms[1] = &p->phase->gemm;
        timing.device_ms[2] = &p->phase->scatter;
    }
    const spconv__conv_options options = {SPCONV__GEMM_AUTO, &timing, fold ? &epilogue : NULL};
    /* Parameters live on the CPU; on another device the pass reads its copy there. */
    spconv_tensor *const *values = NULL;
    if (p->mirror != NULL) values = &p->mirror->params[layer->first_param];
    const spconv_tensor *w = values != NULL ? values[0] : params[0].value;
    const spconv_tensor *b =
        !layer->desc.bias ? NULL : values != NULL ? values[1] : params[1].value;
    spconv_status st = spconv__conv_forward_ex(p->ctx, rb, cur_features(p), w, b, &options, &y);
    free(bn_work);
    if (st == SPCONV_OK && fold) {
        p->bn_done = 1;
        p->relu_done = epilogue.relu;
    }
    spconv__net_add_conv_timing(p->phase, &timing);
    if (st == SPCONV_OK) st = spconv_sparse_from_rulebook(p->cur, rb, y, next);
    layer->stats.pairs = spconv_rulebook_num_pairs(rb);
    layer->stats.flops = 2.0 * (double)layer->stats.pairs * (double)layer->desc.in_channels *
                         (double)layer->desc.out_channels;
    if (p->training && st == SPCONV_OK)
        tape->rulebook = rb;
    else
        spconv_rulebook_release(rb);
    spconv_tensor_release(y);
    p->cur_owned = 1;
    return st;
}

static spconv_status forward_maxpool(net_pass *p, spconv__net_layer *layer,
                                     spconv__layer_tape *tape, spconv_sparse_tensor **next) {
    spconv_rulebook *rb = NULL;
    spconv_tensor *y = NULL;
    SPCONV_FORWARD_IF_ERROR(get_rulebook(p, layer, &rb));
    spconv_status st =
        spconv_maxpool_forward(p->ctx, rb, cur_features(p), &y, p->training ? &tape->argmax : NULL);
    if (st == SPCONV_OK) st = spconv_sparse_from_rulebook(p->cur, rb, y, next);
    layer->stats.pairs = spconv_rulebook_num_pairs(rb);
    if (p->training && st == SPCONV_OK)
        tape->rulebook = rb;
    else
        spconv_rulebook_release(rb);
    spconv_tensor_release(y);
    p->cur_owned = 1;
    return st;
}

/* A training batch norm's statistics (kept in the tape for backward and for the running
 * statistics, which the pass updates at its end: update_running_stats) and its terms [2C], all on
 * the features' device, so the layer waits for nothing. gamma and beta come from the pass's
 * device copy, or on the CPU from the parameters. */
static spconv_status batchnorm_train_terms(net_pass *p, const spconv__net_layer *layer,
                                           spconv__layer_tape *tape, spconv_tensor **terms) {
    static const char func[] = "spconv_net_forward";
    const int64_t c = layer->c_in, three = 3 * c, two = 2 * c;
    spconv_tensor *x = cur_features(p);
    const spconv_device dev = spconv_tensor_device(x);
    spconv_tensor *affine = NULL;
    const double *affine_d = NULL;
    spconv_status st = SPCONV_OK;
    if (p->mirror != NULL) {
        affine_d = (const double *)spconv_tensor_data(p->mirror->bn_terms[layer->stats.index]) +
                   2 * c;
    } else {
        st = spconv__tensor_empty_in(func, p->ctx, dev, SPCONV_F64, 1, &two, &affine);
        if (st == SPCONV_OK) {
            const spconv__net_param *params = &p->net->params[layer->first_param];
            double *host = spconv_tensor_data(affine); /* the CPU: parameters are CPU tensors */
            spconv__net_to_doubles(params[0].value, host);
            spconv__net_to_doubles(params[1].value, host + c);
            affine_d = host;
        }
    }
    if (st == SPCONV_OK && p->bn_block != NULL) { /* NULL: every batch norm has no channel */
        st = spconv_tensor_narrow(p->bn_block, 0, p->bn_used, three, &tape->bn_stats);
        p->bn_used += three;
    } else if (st == SPCONV_OK) {
        st = spconv__tensor_empty_in(func, p->ctx, dev, SPCONV_F64, 1, &three, &tape->bn_stats);
    }
    if (st == SPCONV_OK) st = spconv__tensor_empty_in(func, p->ctx, dev, SPCONV_F64, 1, &two, terms);
    if (st == SPCONV_OK)
        st = spconv__net_batchnorm_stats(p->ctx, x, layer->desc.eps,
                                         spconv_tensor_data(tape->bn_stats));
    if (st == SPCONV_OK)
        st = spconv__net_batchnorm_terms(p->ctx, x, affine_d, spconv_tensor_data(tape->bn_stats),
                                         spconv_tensor_data(*terms));
    tape->bn_sites = spconv_sparse_num_sites(p->cur);
    spconv_tensor_release(affine);
    return st;
}

/* After a training pass: each batch norm's running statistics (parameters, on the CPU) move
 * toward its batch's, running = (1 - momentum) running + momentum batch (the unbiased variance),
 * where the batch had two rows or more. The statistics come home here in one read, once the pass
 * is queued: the pass's one wait for the device. */
static spconv_status update_running_stats(net_pass *p) {
    spconv_net *net = p->net;
    if (p->bn_block == NULL) return SPCONV_OK;
    spconv_tensor *home = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_device(p->ctx, p->bn_block, spconv_cpu(), &home));
    const double *all = spconv_tensor_data(home);
    int64_t at = 0;
    int changed = 0;
    spconv_status st = SPCONV_OK;
    for (int i = 0; i < net->num_layers && st == SPCONV_OK; ++i) {
        const spconv__net_layer *layer = &net->layers[i];
        const spconv__layer_tape *tape = &net->tape[i];
        if (layer->desc.kind != SPCONV_LAYER_BATCHNORM || tape->bn_stats == NULL) continue;
        const int64_t c = layer->c_in;
        const double *batch = all + at;
        at += 3 * c;
        if (tape->bn_sites < 2) continue;
        double *running = malloc((size_t)(2 * (c > 0 ? c : 1)) * sizeof *running);
        if (running == NULL) {
            st = spconv__error(SPCONV_ERR_OUT_OF_MEMORY,
                               "%s: out of host memory for the running statistics of %" PRId64
                               " channels",
                               forward_func, c);
            break;
        }
        const double m = layer->desc.momentum;
        const spconv__net_param *params = &net->params[layer->first_param];
        spconv__net_to_doubles(params[2].value, running);
        spconv__net_to_doubles(params[3].value, running + c);
        for (int64_t ch = 0; ch < c; ++ch) {
            running[ch] = (1.0 - m) * running[ch] + m * batch[ch];
            running[c + ch] = (1.0 - m) * running[c + ch] + m * batch[2 * c + ch];
        }
        spconv__net_from_doubles(running, params[2].value);
        spconv__net_from_doubles(running + c, params[3].value);
        changed = 1;
        free(running);
    }
    spconv_tensor_release(home);
    if (changed) net->param_version++; /* a kept copy of the running statistics is stale */
    return st;
}

static spconv_status forward_batchnorm(net_pass *p, spconv__net_layer *layer,
                                       spconv__layer_tape *tape, spconv_sparse_tensor **next) {
    if (p->bn_done) { /* by the conv before, on the features it wrote (forward_conv) */
        p->bn_done = 0;
        spconv_sparse_retain(p->cur);
        *next = p->cur;
        return SPCONV_OK;
    }
    const int64_t c = layer->c_in, n = spconv_sparse_num_sites(p->cur);
    /* The terms: in training from this batch's statistics, on the features' device; in
     * inference the running statistics', from the pass's device copy or (on the CPU) computed
     * here. */
    double *work = NULL;
    const double *scale_arg = NULL, *shift_arg = NULL;
    spconv_tensor *terms = NULL;
    spconv_status st = SPCONV_OK;
    if (p->training) {
        SPCONV_TRY_GOTO(st, batchnorm_train_terms(p, layer, tape, &terms), done);
        scale_arg = spconv_tensor_data(terms);
        shift_arg = scale_arg + c;
    } else if (p->mirror != NULL) {
        scale_arg = spconv_tensor_data(p->mirror->bn_terms[layer->stats.index]);
        shift_arg = scale_arg + c;
    } else {
        /* gamma, beta, running mean, running var, then scale and shift */
        work = malloc((size_t)(6 * (c > 0 ? c : 1)) * sizeof *work);
        if (work == NULL)
            SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                             "out of host memory for %" PRId64 " channels", c);
        spconv__net_bn_inference_terms(p->net, layer, work);
        scale_arg = work + 4 * c;
        shift_arg = work + 5 * c;
    }
    spconv_tensor *x = cur_features(p), *y = x;
    int in_place = p->cur_owned && !p->training;
    /* In inference a ReLU right after is done in the same pass (its bits are the same): one
     * trip through the features instead of two. Training keeps both outputs for backward. */
    const spconv__net_layer *after = layer_after(p, layer);
    const int fuse_relu = !p->training && after != NULL && after->desc.kind == SPCONV_LAYER_RELU;
    if (!in_place) SPCONV_TRY_GOTO(st, new_matrix(p, n, c, &y), done);
    st = spconv__net_batchnorm_apply(p->ctx, x, scale_arg, shift_arg, fuse_relu, y);
    if (st == SPCONV_OK) p->relu_done = fuse_relu;
    if (st != SPCONV_OK) {
        if (!in_place) spconv_tensor_release(y);
    } else if (in_place) {
        spconv_sparse_retain(p->cur);
        *next = p->cur;
    } else {
        st = spconv_sparse_with_features(p->cur, y, next);
        spconv_tensor_release(y);
        p->cur_owned = 1;
    }
done:
    spconv_tensor_release(terms); /* on a device, freed after the apply that reads it */
    free(work);
    return st;
}

static spconv_status forward_relu(net_pass *p, spconv_sparse_tensor **next) {
    if (p->relu_done) { /* by the batch norm before, on features it owns */
        p->relu_done = 0;
        spconv_sparse_retain(p->cur);
        *next = p->cur;
        return SPCONV_OK;
    }
    spconv_tensor *x = cur_features(p);
    if (p->cur_owned) {
        SPCONV_FORWARD_IF_ERROR(spconv__net_relu_forward(p->ctx, x, x));
        spconv_sparse_retain(p->cur);
        *next = p->cur;
    } else {
        spconv_tensor *y = NULL;
        SPCONV_FORWARD_IF_ERROR(
            new_matrix(p, spconv_tensor_size(x, 0), spconv_tensor_size(x, 1), &y));
        spconv_status st = spconv__net_relu_forward(p->ctx, x, y);
        if (st == SPCONV_OK) st = spconv_sparse_with_features(p->cur, y, next);
        spconv_tensor_release(y);
        SPCONV_FORWARD_IF_ERROR(st);
    }
    /* Training keeps the output for backward: later layers must not overwrite it. */
    p->cur_owned = !p->training;
    return SPCONV_OK;
}

/* CONCAT needs the saved tensor on exactly the current sites, in the same order. */
static spconv_status check_same_sites(spconv_context *ctx, const spconv_sparse_tensor *a,
                                      const spconv_sparse_tensor *b, const char *key) {
    int64_t n = spconv_sparse_num_sites(a), m = spconv_sparse_num_sites(b);
    SPCONV_RETURN_ERROR_IF(n != m, SPCONV_ERR_SHAPE_MISMATCH,
                           "the tensor saved as '%s' has %" PRId64
                           " sites but the current one has %" PRId64
                           "; concat needs the same sites",
                           key, m, n);
    spconv_tensor *ia = spconv_sparse_indices(a), *ib = spconv_sparse_indices(b);
    if (ia == ib || n == 0) return SPCONV_OK;
    /* Compared on the host (a reference, not a copy, for CPU tensors). */
    spconv_tensor *ca = NULL, *cb = NULL;
    spconv_status st = spconv_tensor_to_device(ctx, ia, spconv_cpu(), &ca);
    if (st == SPCONV_OK) st = spconv_tensor_to_device(ctx, ib, spconv_cpu(), &cb);
    if (st == SPCONV_OK) {
        const int32_t *ra = spconv_tensor_data(ca), *rb = spconv_tensor_data(cb);
        for (int64_t r = 0; r < n && st == SPCONV_OK; ++r)
            if (memcmp(ra + 4 * r, rb + 4 * r, 4 * sizeof *ra) != 0)
                st = spconv__error(SPCONV_ERR_GEOMETRY_MISMATCH,
                                   "row %" PRId64 " of the tensor saved as '%s' is site (%d, %d, "
                                   "%d, %d) but the current row is (%d, %d, %d, %d); concat "
                                   "needs the same sites in the same order",
                                   r, key, rb[4 * r], rb[4 * r + 1], rb[4 * r + 2], rb[4 * r + 3],
                                   ra[4 * r], ra[4 * r + 1], ra[4 * r + 2], ra[4 * r + 3]);
    }
    spconv_tensor_release(ca);
    spconv_tensor_release(cb);
    return st;
}

/* Copy @p src into columns [first, first + cols(src)) of @p dst. */
static spconv_status copy_columns(spconv_context *ctx, spconv_tensor *dst, int64_t first,
                                  const spconv_tensor *src) {
    spconv_tensor *view = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_narrow(dst, 1, first, spconv_tensor_size(src, 1), &view));
    spconv_status st = spconv_tensor_copy_(ctx, view, src);
    spconv_tensor_release(view);
    return st;
}

static spconv_status forward_concat(net_pass *p, const spconv__net_layer *layer,
                                    spconv_sparse_tensor **next) {
    const spconv_sparse_tensor *saved = p->saved[layer->saved_layer];
    SPCONV_FORWARD_IF_ERROR(check_same_sites(p->ctx, p->cur, saved, layer->desc.key));
    spconv_tensor *x = cur_features(p), *s = spconv_sparse_features(saved), *y = NULL;
    SPCONV_FORWARD_IF_ERROR(new_matrix(p, spconv_tensor_size(x, 0), layer->c_out, &y));
    spconv_status st = copy_columns(p->ctx, y, 0, x);
    if (st == SPCONV_OK) st = copy_columns(p->ctx, y, spconv_tensor_size(x, 1), s);
    if (st == SPCONV_OK) st = spconv_sparse_with_features(p->cur, y, next);
    spconv_tensor_release(y);
    p->cur_owned = 1;
    return st;
}

/* Bytes for the dense map: the last map's storage when nobody but the network holds it any more,
 * since a fresh buffer of SECOND's size (36 MB) costs tens of milliseconds of page faults. */
static spconv_status dense_storage(spconv_net *net, spconv_device device, size_t nbytes,
                                   spconv_storage **out) {
    spconv_storage *s = net->dense_storage;
    if (s != NULL && spconv_storage_nbytes(s) == nbytes &&
        spconv_device_equal(spconv_storage_device(s), device) &&
        __atomic_load_n(&s->refcount, __ATOMIC_ACQUIRE) == 1) {
        *out = s;
        return SPCONV_OK;
    }
    spconv_storage_release(net->dense_storage);
    net->dense_storage = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_storage_create(device, nbytes, &net->dense_storage));
    *out = net->dense_storage;
    return SPCONV_OK;
}

/* [B, C*D, H, W] with channel c*D + z: HeightCompression's order. */
static spconv_status forward_to_dense(net_pass *p, spconv_sparse_tensor **next) {
    int64_t shape[3];
    spconv_sparse_spatial_shape(p->cur, shape);
    const int64_t c = spconv_tensor_size(cur_features(p), 1);
    const int64_t sizes[4] = {spconv_sparse_batch_size(p->cur), c * shape[0], shape[1], shape[2]};
    int64_t numel = 1;
    for (int i = 0; i < 4; ++i) {
        SPCONV_RETURN_ERROR_IF(numel > INT64_MAX / 8 / sizes[i], SPCONV_ERR_OVERFLOW,
                               "a dense map of [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                               "] is too large",
                               sizes[0], sizes[1], sizes[2], sizes[3]);
        numel *= sizes[i];
    }
    spconv_storage *storage = NULL;
    spconv_tensor *indices = NULL;
    SPCONV_FORWARD_IF_ERROR(
        dense_storage(p->net, spconv_tensor_device(cur_features(p)), (size_t)numel * spconv_dtype_size(p->net->dtype), &storage));
    spconv_status st =
        spconv_tensor_from_storage(storage, 0, p->net->dtype, 4, sizes, NULL, &p->dense);
    if (st == SPCONV_OK)
        st = spconv_tensor_contiguous(p->ctx, spconv_sparse_indices(p->cur), &indices);
    if (st == SPCONV_OK)
        st = spconv__net_to_dense_scatter(p->ctx, cur_features(p), indices, p->dense);
    spconv_tensor_release(indices);
    SPCONV_FORWARD_IF_ERROR(st);
    spconv_sparse_retain(p->cur);
    *next = p->cur;
    return SPCONV_OK;
}

static spconv_status forward_kind(net_pass *p, spconv__net_layer *layer, spconv__layer_tape *tape,
                                  spconv_sparse_tensor **next) {
    switch (layer->desc.kind) {
    case SPCONV_LAYER_SUBM:
    case SPCONV_LAYER_CONV:
    case SPCONV_LAYER_TRANSPOSED:
    case SPCONV_LAYER_INVERSE: return forward_conv(p, layer, tape, next);
    case SPCONV_LAYER_MAXPOOL: return forward_maxpool(p, layer, tape, next);
    case SPCONV_LAYER_BATCHNORM: return forward_batchnorm(p, layer, tape, next);
    case SPCONV_LAYER_RELU: return forward_relu(p, next);
    case SPCONV_LAYER_TO_DENSE: return forward_to_dense(p, next);
    case SPCONV_LAYER_SAVE:
        spconv_sparse_retain(p->cur);
        p->saved[layer->stats.index] = p->cur;
        spconv_sparse_retain(p->cur);
        *next = p->cur;
        p->cur_owned = 0;
        return SPCONV_OK;
    case SPCONV_LAYER_CONCAT: return forward_concat(p, layer, next);
    }
    SPCONV_RETURN_ERROR(SPCONV_ERR_INTERNAL, "layer kind %d has no forward", (int)layer->desc.kind);
}

static spconv_status run_layer(net_pass *p, int index) {
    spconv_net *net = p->net;
    spconv__net_layer *layer = &net->layers[index];
    spconv__layer_tape *tape = &net->tape[index];
    spconv_layer_stats *stats = &layer->stats;
    const double start = spconv__now_s();
    int first = -1;
    SPCONV_FORWARD_IF_ERROR(spconv__net_clock_mark(net, p->ctx, &first));
    p->phase = &stats->forward;
    stats->sites_in = spconv_sparse_num_sites(p->cur);
    stats->channels_in = layer->c_in;
    stats->channels_out = layer->c_out;
    if (p->training) {
        spconv_sparse_retain(p->cur);
        tape->in = p->cur;
    }
    spconv_sparse_tensor *next = NULL;
    spconv_status st = forward_kind(p, layer, tape, &next);
    if (st != SPCONV_OK) return spconv__net_layer_error(forward_func, layer, st);
    stats->sites_out = spconv_sparse_num_sites(next);
    if (p->dense != NULL) stats->channels_out = spconv_tensor_size(p->dense, 1);
    if (p->training) {
        spconv_sparse_retain(next);
        tape->out = next;
    }
    spconv_sparse_release(p->cur);
    p->cur = next;
    st = spconv__net_finish_phase(net, p->ctx, &stats->forward, start, first);
    if (st != SPCONV_OK) return spconv__net_layer_error(forward_func, layer, st);
    if (net->progress != NULL) net->progress(net->progress_user, stats, net->num_layers, 0);
    return SPCONV_OK;
}

static spconv_status check_input(const spconv_net *net, const spconv_sparse_tensor *input,
                                 spconv_net_mode mode) {
    SPCONV_RETURN_ERROR_IF(mode != SPCONV_NET_INFERENCE && mode != SPCONV_NET_TRAINING,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: mode %d is not a network mode",
                           forward_func, (int)mode);
    const spconv_tensor *f = spconv_sparse_features(input);
    /* Every layer runs on the backend of the input's device: it must have each kernel the
     * network needs. (The parameters stay on the CPU until a backend besides the CPU's has the
     * conv kernels; then they move with the input.) */
    SPCONV_FORWARD_IF_ERROR(spconv__net_check_backend(forward_func, net, spconv_tensor_device(f),
                                                      mode == SPCONV_NET_TRAINING));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_dtype(f) != net->dtype, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: the input features are %s but the network's dtype is %s",
                           forward_func, spconv_dtype_name(spconv_tensor_dtype(f)),
                           spconv_dtype_name(net->dtype));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_size(f, 1) != net->in_channels, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: the input has %" PRId64 " channels but the network takes %" PRId64,
                           forward_func, spconv_tensor_size(f, 1), net->in_channels);
    return SPCONV_OK;
}

static void reset_stats(spconv_net *net) {
    for (int i = 0; i < net->num_layers; ++i) {
        spconv_layer_stats *s = &net->layers[i].stats;
        s->sites_in = s->sites_out = s->channels_in = s->channels_out = s->pairs = 0;
        s->flops = 0.0;
        memset(&s->forward, 0, sizeof s->forward);
        memset(&s->backward, 0, sizeof s->backward);
    }
}

spconv_status spconv_net_forward(spconv_context *ctx, spconv_net *net,
                                 const spconv_sparse_tensor *input, spconv_net_mode mode,
                                 spconv_tensor **out, spconv_sparse_tensor **out_sparse) {
    SPCONV_CHECK_NOT_NULL(forward_func, out);
    *out = NULL;
    if (out_sparse != NULL) *out_sparse = NULL;
    SPCONV_CHECK_NOT_NULL(forward_func, net);
    SPCONV_CHECK_NOT_NULL(forward_func, input);
    SPCONV_FORWARD_IF_ERROR(check_input(net, input, mode));
    spconv__net_clear_tape(net);
    reset_stats(net);
    SPCONV_FORWARD_IF_ERROR(
        spconv__net_clock_start(net, spconv_tensor_device(spconv_sparse_features(input))));
    net_pass p = {.ctx = ctx,
                  .net = net,
                  .training = mode == SPCONV_NET_TRAINING};
    p.saved = calloc((size_t)net->num_layers, sizeof *p.saved);
    SPCONV_RETURN_ERROR_IF(p.saved == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory",
                           forward_func);
    /* The layer kernels want contiguous rows; the cache stays shared with the caller's input. */
    spconv_tensor *features = NULL;
    spconv_status st =
        spconv__net_mirror_for(ctx, net, spconv_tensor_device(spconv_sparse_features(input)),
                               &p.mirror);
    if (st == SPCONV_OK && p.training) {
        int64_t doubles = 0;
        for (int i = 0; i < net->num_layers; ++i)
            if (net->layers[i].desc.kind == SPCONV_LAYER_BATCHNORM) doubles += 3 * net->layers[i].c_in;
        if (doubles > 0)
            st = spconv__tensor_empty_in(forward_func, ctx,
                                         spconv_tensor_device(spconv_sparse_features(input)),
                                         SPCONV_F64, 1, &doubles, &p.bn_block);
    }
    if (st == SPCONV_OK)
        st = spconv_tensor_contiguous(ctx, spconv_sparse_features(input), &features);
    if (st == SPCONV_OK) st = spconv_sparse_with_features(input, features, &p.cur);
    spconv_tensor_release(features);
    for (int i = 0; i < net->num_layers && st == SPCONV_OK; ++i) st = run_layer(&p, i);
    if (st == SPCONV_OK && p.training) st = update_running_stats(&p);
    if (st == SPCONV_OK) {
        *out = p.dense;
        if (p.dense == NULL) {
            *out = spconv_sparse_features(p.cur);
            spconv_tensor_retain(*out);
        }
        if (out_sparse != NULL) {
            *out_sparse = p.cur;
            p.cur = NULL;
        }
        net->has_tape = p.training;
        if (p.training) { /* backward reads the same copy */
            net->tape_mirror = p.mirror;
            p.mirror = NULL;
        }
    } else {
        spconv_tensor_release(p.dense);
        spconv__net_clear_tape(net);
    }
    spconv_sparse_release(p.cur);
    for (int i = 0; i < net->num_layers; ++i) spconv_sparse_release(p.saved[i]);
    free(p.saved);
    spconv__net_mirror_release(p.mirror);
    spconv_tensor_release(p.bn_block); /* the tapes hold views of it */
    return st;
}
