/* Rulebooks of sparse tensors through the indice_key cache, and sparse tensors on a rulebook's
 * output sites. Reuse is only ever granted for the same geometry on the same sites: anything else
 * under a known key is SPCONV_ERR_GEOMETRY_MISMATCH. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "rulebook/internal.h"
#include "rulebook/sparse_impl.h"
#include "spconv/tensor.h"

static const char *kind_name(spconv_conv_kind kind) {
    switch (kind) {
    case SPCONV_CONV_REGULAR: return "REGULAR";
    case SPCONV_CONV_SUBM: return "SUBM";
    case SPCONV_CONV_TRANSPOSED: return "TRANSPOSED";
    case SPCONV_CONV_INVERSE: return "INVERSE";
    }
    return "unknown";
}

/* A struct so that it can be formatted straight into a message argument. */
typedef struct geometry_text {
    char text[400];
} geometry_text;

#define TRIPLE_FMT "(%" PRId64 ", %" PRId64 ", %" PRId64 ")"
#define TRIPLE(a) (a)[0], (a)[1], (a)[2]

static geometry_text describe(const spconv_conv_params *p, const int64_t shape[3],
                              int64_t batch_size) {
    geometry_text g;
    snprintf(g.text, sizeof g.text,
             "%s kernel " TRIPLE_FMT " stride " TRIPLE_FMT " padding " TRIPLE_FMT
             " dilation " TRIPLE_FMT " output_padding " TRIPLE_FMT " on spatial shape " TRIPLE_FMT
             " with batch size %" PRId64,
             kind_name(p->kind), TRIPLE(p->kernel), TRIPLE(p->stride), TRIPLE(p->padding),
             TRIPLE(p->dilation), TRIPLE(p->output_padding), TRIPLE(shape), batch_size);
    return g;
}

/* 1 when parameters give the same rulebook on the same input (a SUBM ignores stride and
 * padding; only a TRANSPOSED uses output padding). */
static int same_params(const spconv_conv_params *a, const spconv_conv_params *b) {
    if (a->kind != b->kind) return 0;
    for (int axis = 0; axis < 3; ++axis) {
        if (a->kernel[axis] != b->kernel[axis] || a->dilation[axis] != b->dilation[axis]) return 0;
        if (a->kind != SPCONV_CONV_SUBM &&
            (a->stride[axis] != b->stride[axis] || a->padding[axis] != b->padding[axis]))
            return 0;
        if (a->kind == SPCONV_CONV_TRANSPOSED && a->output_padding[axis] != b->output_padding[axis])
            return 0;
    }
    return 1;
}

static int same_shape(const int64_t a[3], const int64_t b[3]) {
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

/* *same = 1 when both int32 [N, 4] tensors hold the same rows in the same order. The common case,
 * one tensor passed along a network, is decided without reading the rows. */
static spconv_status same_sites(spconv_context *ctx, const spconv_tensor *a, const spconv_tensor *b,
                                int *same) {
    const int64_t n = spconv_tensor_size(a, 0);
    *same = n == spconv_tensor_size(b, 0);
    if (!*same || a == b || n == 0) return SPCONV_OK;
    if (spconv_tensor_data(a) == spconv_tensor_data(b) &&
        memcmp(spconv_tensor_strides(a), spconv_tensor_strides(b), 2 * sizeof(int64_t)) == 0 &&
        spconv_device_equal(spconv_tensor_device(a), spconv_tensor_device(b)))
        return SPCONV_OK;
    const size_t nbytes = (size_t)n * 4 * sizeof(int32_t);
    int32_t *rows_a = malloc(nbytes), *rows_b = malloc(nbytes);
    spconv_status st = rows_a != NULL && rows_b != NULL
                           ? SPCONV_OK
                           : spconv__error(SPCONV_ERR_OUT_OF_MEMORY,
                                           "spconv_sparse_get_rulebook: out of host memory to "
                                           "compare %" PRId64 " sites",
                                           n);
    if (st == SPCONV_OK) st = spconv_tensor_copy_to_host(ctx, a, rows_a, nbytes);
    if (st == SPCONV_OK) st = spconv_tensor_copy_to_host(ctx, b, rows_b, nbytes);
    if (st == SPCONV_OK) *same = memcmp(rows_a, rows_b, nbytes) == 0;
    free(rows_a);
    free(rows_b);
    return st;
}

static spconv_status check_reusable(spconv_context *ctx, const char *func, const char *key,
                                    const spconv_rulebook *rb, const spconv_sparse_tensor *in,
                                    const spconv_conv_params *params) {
    SPCONV_RETURN_ERROR_IF(
        !same_params(&rb->params, params) || !same_shape(rb->in_shape, in->spatial_shape) ||
            rb->batch_size != in->batch_size,
        SPCONV_ERR_GEOMETRY_MISMATCH,
        "%s: indice_key '%s' holds a rulebook for %s, but this layer asks for %s", func, key,
        describe(&rb->params, rb->in_shape, rb->batch_size).text,
        describe(params, in->spatial_shape, in->batch_size).text);
    int same;
    SPCONV_FORWARD_IF_ERROR(same_sites(ctx, rb->in_indices, in->indices, &same));
    SPCONV_RETURN_ERROR_IF(
        !same, SPCONV_ERR_GEOMETRY_MISMATCH,
        "%s: indice_key '%s' holds a rulebook built on other input sites (%" PRId64
        " rows) than this layer's input (%" PRId64 " rows)",
        func, key, rb->num_in, spconv_tensor_size(in->indices, 0));
    return SPCONV_OK;
}

static spconv_status inverse_from_cache(spconv_context *ctx, const char *func, const char *key,
                                        const spconv_sparse_tensor *in,
                                        const spconv_conv_params *params, spconv_rulebook **out) {
    const spconv_rulebook *rb = spconv__rulebook_cache_find(in->cache, key);
    SPCONV_RETURN_ERROR_IF(rb == NULL, SPCONV_ERR_NOT_FOUND,
                           "%s: no rulebook is stored under indice_key '%s' for the INVERSE conv "
                           "to invert",
                           func, key);
    SPCONV_RETURN_ERROR_IF(
        rb->params.kind != SPCONV_CONV_REGULAR && rb->params.kind != SPCONV_CONV_TRANSPOSED,
        SPCONV_ERR_GEOMETRY_MISMATCH,
        "%s: indice_key '%s' holds a %s rulebook; an INVERSE conv inverts a REGULAR or "
        "TRANSPOSED one",
        func, key, kind_name(rb->params.kind));
    SPCONV_RETURN_ERROR_IF(!same_shape(rb->params.kernel, params->kernel),
                           SPCONV_ERR_GEOMETRY_MISMATCH,
                           "%s: indice_key '%s' holds kernel " TRIPLE_FMT
                           " but the INVERSE conv has kernel " TRIPLE_FMT,
                           func, key, TRIPLE(rb->params.kernel), TRIPLE(params->kernel));
    SPCONV_RETURN_ERROR_IF(
        !same_shape(rb->out_shape, in->spatial_shape) || rb->batch_size != in->batch_size,
        SPCONV_ERR_GEOMETRY_MISMATCH,
        "%s: indice_key '%s' produced spatial shape " TRIPLE_FMT " with batch size %" PRId64
        ", but the INVERSE conv's input has " TRIPLE_FMT " with batch size %" PRId64,
        func, key, TRIPLE(rb->out_shape), rb->batch_size, TRIPLE(in->spatial_shape),
        in->batch_size);
    int same;
    SPCONV_FORWARD_IF_ERROR(same_sites(ctx, rb->out_indices, in->indices, &same));
    SPCONV_RETURN_ERROR_IF(!same, SPCONV_ERR_GEOMETRY_MISMATCH,
                           "%s: the INVERSE conv's input sites (%" PRId64 " rows) are not the "
                           "output sites (%" PRId64 " rows) of the conv under indice_key '%s'",
                           func, spconv_tensor_size(in->indices, 0), rb->num_out, key);
    return spconv_rulebook_inverse(rb, out);
}

/* Reuse the rulebook under key when it fits, else build and store one; the cache is locked. */
static spconv_status cached_rulebook(spconv_context *ctx, const char *func, const char *key,
                                     const spconv_sparse_tensor *in,
                                     const spconv_conv_params *params, spconv_rulebook **out) {
    spconv_rulebook *stored = spconv__rulebook_cache_find(in->cache, key);
    if (stored != NULL) {
        SPCONV_FORWARD_IF_ERROR(check_reusable(ctx, func, key, stored, in, params));
        spconv_rulebook_retain(stored);
        *out = stored;
        return SPCONV_OK;
    }
    spconv_rulebook *rb;
    const int known = spconv__rulebook_cache_knows_sites(in->cache, in->indices,
                                                          in->spatial_shape, in->batch_size);
    SPCONV_FORWARD_IF_ERROR(spconv__rulebook_build_sites(ctx, in->indices, in->spatial_shape,
                                                         in->batch_size, params, known, &rb));
    const spconv_status st = spconv__rulebook_cache_insert(in->cache, func, key, rb);
    if (st != SPCONV_OK) {
        spconv_rulebook_release(rb);
        return st;
    }
    *out = rb;
    return SPCONV_OK;
}

spconv_status spconv_sparse_get_rulebook(spconv_context *ctx, const spconv_sparse_tensor *in,
                                         const spconv_conv_params *params, const char *indice_key,
                                         spconv_rulebook **out) {
    const char *func = "spconv_sparse_get_rulebook";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, in);
    SPCONV_CHECK_NOT_NULL(func, params);
    const int has_key = indice_key != NULL && indice_key[0] != '\0';
    if (params->kind != SPCONV_CONV_INVERSE) {
        /* Bad parameters are reported as such, before any comparison with a cached rulebook. */
        int64_t out_shape[3];
        SPCONV_FORWARD_IF_ERROR(spconv__conv_geometry(func, params, in->spatial_shape, out_shape));
        if (!has_key) {
            spconv__rulebook_cache_lock(in->cache);
            const int known = spconv__rulebook_cache_knows_sites(in->cache, in->indices,
                                                                  in->spatial_shape,
                                                                  in->batch_size);
            spconv__rulebook_cache_unlock(in->cache);
            return spconv__rulebook_build_sites(ctx, in->indices, in->spatial_shape,
                                                in->batch_size, params, known, out);
        }
    }
    SPCONV_RETURN_ERROR_IF(!has_key, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: an INVERSE conv needs the indice_key of the conv it inverts", func);
    spconv__rulebook_cache_lock(in->cache);
    const spconv_status st = params->kind == SPCONV_CONV_INVERSE
                                 ? inverse_from_cache(ctx, func, indice_key, in, params, out)
                                 : cached_rulebook(ctx, func, indice_key, in, params, out);
    spconv__rulebook_cache_unlock(in->cache);
    return st;
}

spconv_status spconv_sparse_from_rulebook(const spconv_sparse_tensor *in, const spconv_rulebook *rb,
                                          spconv_tensor *features, spconv_sparse_tensor **out) {
    const char *func = "spconv_sparse_from_rulebook";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, in);
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_RETURN_ERROR_IF(
        rb->num_in != spconv_tensor_size(in->indices, 0) ||
            !same_shape(rb->in_shape, in->spatial_shape) || rb->batch_size != in->batch_size,
        SPCONV_ERR_GEOMETRY_MISMATCH,
        "%s: the rulebook was built for %" PRId64 " sites on spatial shape " TRIPLE_FMT
        " with batch size %" PRId64 ", but the input has %" PRId64 " sites on " TRIPLE_FMT
        " with batch size %" PRId64,
        func, rb->num_in, TRIPLE(rb->in_shape), rb->batch_size, spconv_tensor_size(in->indices, 0),
        TRIPLE(in->spatial_shape), in->batch_size);
    return spconv__sparse_make(func, features, rb->out_indices, rb->out_shape, rb->batch_size,
                               in->cache, out);
}
