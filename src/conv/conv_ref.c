/* References for the conv and pooling executors (see conv_ref.h): f64 copies in, one loop over
 * the pairs, f64 accumulators, one rounding to the operands' dtype at the end. */
#include "conv/conv_ref.h"

#include <math.h>
#include <string.h>

#include "conv/conv_check.h"
#include "core/error.h"

/* Everything a reference reads, as contiguous host arrays. */
typedef struct ref_inputs {
    spconv_tensor *held[6]; /* references to release */
    int count;
    const int32_t *pairs_in, *pairs_out;
    int64_t num_active;
    const int64_t *active, *starts; /* the rulebook's offsets that have pairs */
} ref_inputs;

static void ref_release(ref_inputs *in) {
    for (int i = 0; i < in->count; ++i) spconv_tensor_release(in->held[i]);
}

/* A contiguous f64 copy of @p t (or @p t itself when it already is one), kept in @p in. */
static spconv_status ref_f64(spconv_context *ctx, ref_inputs *in, const spconv_tensor *t,
                             const double **data) {
    spconv_tensor *copy;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_dtype(ctx, t, SPCONV_F64, &copy));
    in->held[in->count++] = copy;
    *data = spconv_tensor_data(copy);
    return SPCONV_OK;
}

static spconv_status ref_pairs(spconv_context *ctx, ref_inputs *in, const spconv_rulebook *rb) {
    spconv_tensor *pin, *pout;
    SPCONV_FORWARD_IF_ERROR(spconv__rulebook_pairs(ctx, rb, &pin, &pout));
    in->held[in->count++] = pin;
    in->held[in->count++] = pout;
    in->pairs_in = spconv_tensor_data(pin);
    in->pairs_out = spconv_tensor_data(pout);
    in->num_active = spconv_rulebook_num_active_offsets(rb);
    in->active = spconv_rulebook_active_offsets(rb);
    in->starts = spconv_rulebook_active_starts(rb);
    return SPCONV_OK;
}

/* The references run on the CPU in f32 or f64 only. */
static spconv_status ref_check_cpu(const char *func, const spconv_tensor *t) {
    SPCONV_RETURN_ERROR_IF(spconv_tensor_device(t).type != SPCONV_DEVICE_CPU,
                           SPCONV_ERR_NOT_SUPPORTED, "%s: the references run on the CPU only",
                           func);
    const spconv_dtype dtype = spconv_tensor_dtype(t);
    SPCONV_RETURN_ERROR_IF(dtype != SPCONV_F32 && dtype != SPCONV_F64, SPCONV_ERR_NOT_SUPPORTED,
                           "%s: the references compute in f32 or f64, not %s", func,
                           spconv_dtype_name(dtype));
    return SPCONV_OK;
}

/* An f64 accumulator of the given sizes, zero-filled. */
static spconv_status ref_accumulator(spconv_context *ctx, int ndim, const int64_t *sizes,
                                     spconv_tensor **acc, double **data) {
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F64, ndim, sizes, acc));
    *data = spconv_tensor_data(*acc);
    return SPCONV_OK;
}

/* *out = @p acc rounded to @p dtype; @p acc is released either way. */
static spconv_status ref_finish(spconv_context *ctx, spconv_tensor *acc, spconv_dtype dtype,
                                spconv_tensor **out) {
    spconv_status st = spconv_tensor_to_dtype(ctx, acc, dtype, out);
    spconv_tensor_release(acc);
    return st;
}

spconv_status spconv__conv_forward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                       const spconv_tensor *features, const spconv_tensor *weight,
                                       const spconv_tensor *bias, spconv_tensor **out) {
    static const char func[] = "spconv__conv_forward_ref";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_CHECK_NOT_NULL(func, weight);
    spconv__conv_dims d;
    SPCONV_FORWARD_IF_ERROR(spconv__conv_check(func, rb, features, weight, bias, NULL, &d));
    SPCONV_FORWARD_IF_ERROR(ref_check_cpu(func, features));
    ref_inputs in = {{NULL}, 0, NULL, NULL, 0, NULL, NULL};
    const double *x, *w, *b = NULL;
    spconv_tensor *acc = NULL;
    double *y;
    int64_t sizes[2] = {d.num_out, d.c_out};
    spconv_status st;
    SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, features, &x), done);
    SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, weight, &w), done);
    if (bias != NULL) SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, bias, &b), done);
    SPCONV_TRY_GOTO(st, ref_pairs(ctx, &in, rb), done);
    SPCONV_TRY_GOTO(st, ref_accumulator(ctx, 2, sizes, &acc, &y), done);
    for (int64_t o = 0; o < d.num_out && b != NULL; ++o)
        for (int64_t co = 0; co < d.c_out; ++co) y[o * d.c_out + co] = b[co];
    for (int64_t j = 0; j < in.num_active && d.c_in > 0 && d.c_out > 0; ++j)
        for (int64_t p = in.starts[j], k = in.active[j]; p < in.starts[j + 1]; ++p) {
            const double *x_row = x + in.pairs_in[p] * d.c_in;
            double *y_row = y + in.pairs_out[p] * d.c_out;
            for (int64_t ci = 0; ci < d.c_in; ++ci)
                for (int64_t co = 0; co < d.c_out; ++co)
                    y_row[co] += x_row[ci] * w[(k * d.c_in + ci) * d.c_out + co];
        }
    st = ref_finish(ctx, acc, d.dtype, out);
    acc = NULL;
done:
    spconv_tensor_release(acc);
    ref_release(&in);
    return st;
}

/* The three gradient sums of spconv__conv_backward_ref into f64 accumulators (any may be NULL). */
static void ref_backward_sums(const spconv__conv_dims *d, const ref_inputs *in, const double *x,
                              const double *w, const double *g, double *gx, double *gw,
                              double *gb) {
    for (int64_t j = 0; j < in->num_active && d->c_in > 0 && d->c_out > 0; ++j)
        for (int64_t p = in->starts[j], k = in->active[j]; p < in->starts[j + 1]; ++p) {
            const double *x_row = x + in->pairs_in[p] * d->c_in;
            const double *g_row = g + in->pairs_out[p] * d->c_out;
            for (int64_t ci = 0; ci < d->c_in; ++ci)
                for (int64_t co = 0; co < d->c_out; ++co) {
                    int64_t wi = (k * d->c_in + ci) * d->c_out + co;
                    if (gx != NULL) gx[in->pairs_in[p] * d->c_in + ci] += g_row[co] * w[wi];
                    if (gw != NULL) gw[wi] += x_row[ci] * g_row[co];
                }
        }
    for (int64_t o = 0; o < d->num_out && gb != NULL; ++o)
        for (int64_t co = 0; co < d->c_out; ++co) gb[co] += g[o * d->c_out + co];
}

spconv_status spconv__conv_backward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                        const spconv_tensor *features, const spconv_tensor *weight,
                                        const spconv_tensor *grad_out,
                                        spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                        spconv_tensor **grad_bias) {
    static const char func[] = "spconv__conv_backward_ref";
    spconv_tensor **outs[3] = {grad_features, grad_weight, grad_bias};
    for (int i = 0; i < 3; ++i)
        if (outs[i] != NULL) *outs[i] = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_CHECK_NOT_NULL(func, weight);
    SPCONV_CHECK_NOT_NULL(func, grad_out);
    spconv__conv_dims d;
    SPCONV_FORWARD_IF_ERROR(spconv__conv_check(func, rb, features, weight, NULL, grad_out, &d));
    SPCONV_FORWARD_IF_ERROR(ref_check_cpu(func, features));
    ref_inputs in = {{NULL}, 0, NULL, NULL, 0, NULL, NULL};
    const double *x, *w, *g;
    spconv_tensor *acc[3] = {NULL, NULL, NULL};
    double *sums[3] = {NULL, NULL, NULL};
    int64_t in_sizes[2] = {d.num_in, d.c_in};
    int ndims[3] = {2, spconv_tensor_ndim(weight), 1};
    const int64_t *sizes[3] = {in_sizes, spconv_tensor_sizes(weight), &d.c_out};
    spconv_status st;
    SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, features, &x), done);
    SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, weight, &w), done);
    SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, grad_out, &g), done);
    SPCONV_TRY_GOTO(st, ref_pairs(ctx, &in, rb), done);
    for (int i = 0; i < 3; ++i)
        if (outs[i] != NULL)
            SPCONV_TRY_GOTO(st, ref_accumulator(ctx, ndims[i], sizes[i], &acc[i], &sums[i]), done);
    ref_backward_sums(&d, &in, x, w, g, sums[0], sums[1], sums[2]);
    for (int i = 0; i < 3; ++i) {
        if (outs[i] == NULL) continue;
        st = ref_finish(ctx, acc[i], d.dtype, outs[i]);
        acc[i] = NULL;
        if (st != SPCONV_OK) goto done;
    }
done:
    for (int i = 0; i < 3; ++i) spconv_tensor_release(acc[i]);
    if (st != SPCONV_OK)
        for (int i = 0; i < 3; ++i)
            if (outs[i] != NULL) spconv_tensor_release(*outs[i]), *outs[i] = NULL;
    ref_release(&in);
    return st;
}

spconv_status spconv__maxpool_forward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                          const spconv_tensor *features, spconv_tensor **out,
                                          spconv_tensor **argmax) {
    static const char func[] = "spconv__maxpool_forward_ref";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    if (argmax != NULL) *argmax = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_FORWARD_IF_ERROR(spconv__pool_check_forward(func, rb, features));
    SPCONV_FORWARD_IF_ERROR(ref_check_cpu(func, features));
    const int64_t num_out = spconv_rulebook_num_out(rb), c = spconv_tensor_size(features, 1);
    int64_t sizes[2] = {num_out, c};
    ref_inputs in = {{NULL}, 0, NULL, NULL, 0, NULL, NULL};
    const double *x;
    spconv_tensor *acc = NULL, *arg = NULL;
    double *best;
    spconv_status st;
    SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, features, &x), done);
    SPCONV_TRY_GOTO(st, ref_pairs(ctx, &in, rb), done);
    SPCONV_TRY_GOTO(st, ref_accumulator(ctx, 2, sizes, &acc, &best), done);
    SPCONV_TRY_GOTO(st, spconv_tensor_full(ctx, spconv_cpu(), SPCONV_I32, 2, sizes, -1.0, &arg),
                    done);
    int32_t *arg_data = spconv_tensor_data(arg);
    for (int64_t i = 0; i < num_out * c; ++i) best[i] = -INFINITY;
    /* Offsets in increasing k; the first pair of an output takes it, later ones only when
     * strictly greater: a tie keeps the smallest k. A NaN input wins over any number, and the
     * first NaN stays. */
    for (int64_t j = 0; j < in.num_active; ++j)
        for (int64_t p = in.starts[j]; p < in.starts[j + 1]; ++p)
            for (int64_t ch = 0; ch < c; ++ch) {
                double v = x[in.pairs_in[p] * c + ch], *b = &best[in.pairs_out[p] * c + ch];
                int32_t *a = &arg_data[in.pairs_out[p] * c + ch];
                if (*a < 0 || v > *b || (isnan(v) && !isnan(*b))) {
                    *b = v;
                    *a = in.pairs_in[p];
                }
            }
    st = ref_finish(ctx, acc, spconv_tensor_dtype(features), out);
    acc = NULL;
    if (st == SPCONV_OK && argmax != NULL) *argmax = arg, arg = NULL;
done:
    spconv_tensor_release(arg);
    spconv_tensor_release(acc);
    ref_release(&in);
    return st;
}

spconv_status spconv__maxpool_backward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                           const spconv_tensor *argmax,
                                           const spconv_tensor *grad_out,
                                           spconv_tensor **grad_features) {
    static const char func[] = "spconv__maxpool_backward_ref";
    SPCONV_CHECK_NOT_NULL(func, grad_features);
    *grad_features = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, argmax);
    SPCONV_CHECK_NOT_NULL(func, grad_out);
    SPCONV_FORWARD_IF_ERROR(spconv__pool_check_backward(func, rb, argmax, grad_out));
    SPCONV_FORWARD_IF_ERROR(ref_check_cpu(func, grad_out));
    const int64_t num_out = spconv_rulebook_num_out(rb), c = spconv_tensor_size(grad_out, 1);
    int64_t sizes[2] = {spconv_rulebook_num_in(rb), c};
    ref_inputs in = {{NULL}, 0, NULL, NULL, 0, NULL, NULL};
    const double *g;
    spconv_tensor *arg = NULL, *acc = NULL;
    double *gx;
    spconv_status st;
    SPCONV_TRY_GOTO(st, ref_f64(ctx, &in, grad_out, &g), done);
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, argmax, &arg), done);
    const int32_t *a = spconv_tensor_data(arg);
    SPCONV_TRY_GOTO(st, spconv__check_argmax_rows(func, a, num_out, c, sizes[0], 1), done);
    SPCONV_TRY_GOTO(st, ref_accumulator(ctx, 2, sizes, &acc, &gx), done);
    for (int64_t o = 0; o < num_out; ++o)
        for (int64_t ch = 0; ch < c; ++ch)
            if (a[o * c + ch] >= 0) gx[a[o * c + ch] * c + ch] += g[o * c + ch];
    st = ref_finish(ctx, acc, spconv_tensor_dtype(grad_out), grad_features);
    acc = NULL;
done:
    spconv_tensor_release(acc);
    spconv_tensor_release(arg);
    ref_release(&in);
    return st;
}
