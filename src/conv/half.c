/* fp16 and bf16 operands of the conv and pooling entry points: converted to f32 at the edges, run
 * by the backend's f32 slot, results rounded once (see half.h). */
#include "conv/half.h"

#include "core/error.h"

int spconv__is_half_dtype(spconv_dtype dtype) {
    return dtype == SPCONV_F16 || dtype == SPCONV_BF16;
}

/* *wide = @p t as f32 on its device; NULL stays NULL. */
static spconv_status widen(spconv_context *ctx, const spconv_tensor *t, spconv_tensor **wide) {
    *wide = NULL;
    if (t == NULL) return SPCONV_OK;
    return spconv_tensor_to_dtype(ctx, t, SPCONV_F32, wide);
}

/* Replace the f32 result *slot (if any) by its rounding to @p dtype; on failure *slot is released
 * and set to NULL. */
static spconv_status narrow(spconv_context *ctx, spconv_dtype dtype, spconv_tensor **slot) {
    if (slot == NULL || *slot == NULL) return SPCONV_OK;
    spconv_tensor *rounded = NULL;
    spconv_status st = spconv_tensor_to_dtype(ctx, *slot, dtype, &rounded);
    spconv_tensor_release(*slot);
    *slot = rounded;
    return st;
}

spconv_status spconv__half_conv_forward(const spconv_backend *backend, spconv_context *ctx,
                                        const spconv_rulebook *rb, const spconv_tensor *features,
                                        const spconv_tensor *weight, const spconv_tensor *bias,
                                        const spconv__conv_options *options, spconv_tensor **out) {
    const spconv_dtype dtype = spconv_tensor_dtype(features);
    spconv_tensor *f = NULL, *w = NULL, *b = NULL, *y = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, widen(ctx, features, &f), done);
    SPCONV_TRY_GOTO(st, widen(ctx, weight, &w), done);
    SPCONV_TRY_GOTO(st, widen(ctx, bias, &b), done);
    SPCONV_TRY_GOTO(st, backend->conv_forward(ctx, rb, f, w, b, options, &y), done);
    SPCONV_TRY_GOTO(st, narrow(ctx, dtype, &y), done);
    *out = y, y = NULL;
done:
    spconv_tensor_release(y);
    spconv_tensor_release(b);
    spconv_tensor_release(w);
    spconv_tensor_release(f);
    return st;
}

spconv_status spconv__half_conv_backward(const spconv_backend *backend, spconv_context *ctx,
                                         const spconv_rulebook *rb, const spconv_tensor *features,
                                         const spconv_tensor *weight,
                                         const spconv_tensor *grad_out,
                                         const spconv__conv_options *options,
                                         spconv_tensor **grad_features,
                                         spconv_tensor **grad_weight, spconv_tensor **grad_bias) {
    const spconv_dtype dtype = spconv_tensor_dtype(features);
    spconv_tensor *f = NULL, *w = NULL, *g = NULL, *df = NULL, *dw = NULL, *db = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, widen(ctx, features, &f), done);
    SPCONV_TRY_GOTO(st, widen(ctx, weight, &w), done);
    SPCONV_TRY_GOTO(st, widen(ctx, grad_out, &g), done);
    SPCONV_TRY_GOTO(st,
                    backend->conv_backward(ctx, rb, f, w, g, options,
                                           grad_features != NULL ? &df : NULL,
                                           grad_weight != NULL ? &dw : NULL,
                                           grad_bias != NULL ? &db : NULL),
                    done);
    SPCONV_TRY_GOTO(st, narrow(ctx, dtype, &df), done);
    SPCONV_TRY_GOTO(st, narrow(ctx, dtype, &dw), done);
    SPCONV_TRY_GOTO(st, narrow(ctx, dtype, &db), done);
    if (grad_features != NULL) *grad_features = df, df = NULL;
    if (grad_weight != NULL) *grad_weight = dw, dw = NULL;
    if (grad_bias != NULL) *grad_bias = db, db = NULL;
done:
    spconv_tensor_release(db);
    spconv_tensor_release(dw);
    spconv_tensor_release(df);
    spconv_tensor_release(g);
    spconv_tensor_release(w);
    spconv_tensor_release(f);
    return st;
}

spconv_status spconv__half_maxpool_forward(const spconv_backend *backend, spconv_context *ctx,
                                           const spconv_rulebook *rb,
                                           const spconv_tensor *features, spconv_tensor **out,
                                           spconv_tensor **argmax) {
    const spconv_dtype dtype = spconv_tensor_dtype(features);
    spconv_tensor *f = NULL, *y = NULL, *arg = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, widen(ctx, features, &f), done);
    SPCONV_TRY_GOTO(st, backend->maxpool_forward(ctx, rb, f, &y, argmax != NULL ? &arg : NULL),
                    done);
    SPCONV_TRY_GOTO(st, narrow(ctx, dtype, &y), done);
    *out = y, y = NULL;
    if (argmax != NULL) *argmax = arg, arg = NULL;
done:
    spconv_tensor_release(arg);
    spconv_tensor_release(y);
    spconv_tensor_release(f);
    return st;
}

spconv_status spconv__half_maxpool_backward(const spconv_backend *backend, spconv_context *ctx,
                                            const spconv_rulebook *rb, const spconv_tensor *argmax,
                                            const spconv_tensor *grad_out,
                                            spconv_tensor **grad_features) {
    const spconv_dtype dtype = spconv_tensor_dtype(grad_out);
    spconv_tensor *g = NULL, *dx = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, widen(ctx, grad_out, &g), done);
    SPCONV_TRY_GOTO(st, backend->maxpool_backward(ctx, rb, argmax, g, &dx), done);
    SPCONV_TRY_GOTO(st, narrow(ctx, dtype, &dx), done);
    *grad_features = dx, dx = NULL;
done:
    spconv_tensor_release(dx);
    spconv_tensor_release(g);
    return st;
}
