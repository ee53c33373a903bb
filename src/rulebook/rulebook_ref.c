/* Brute-force reference rulebooks (see rulebook_ref.h). Deliberately shares nothing with the fast
 * builders beyond parameter validation and the rulebook object: no hashing, no sorting, every
 * relation is tested with the per-axis rule written as in docs/design.md. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "rulebook/internal.h"
#include "rulebook/rulebook_ref.h"
#include "spconv/tensor.h"

#define FUNC "spconv__rulebook_build_ref"

/* A growable array of int32 values. */
typedef struct int32_list {
    int32_t *data;
    int64_t count, capacity;
} int32_list;

static spconv_status list_push(int32_list *list, const int32_t *values, int64_t n) {
    if (list->count + n > list->capacity) {
        const int64_t capacity = 2 * (list->count + n);
        int32_t *grown = realloc(list->data, (size_t)capacity * sizeof *grown);
        SPCONV_RETURN_ERROR_IF(grown == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                               FUNC ": out of host memory");
        list->data = grown;
        list->capacity = capacity;
    }
    memcpy(list->data + list->count, values, (size_t)n * sizeof *values);
    list->count += n;
    return SPCONV_OK;
}

/* The k with which input coordinate i reaches output coordinate o on one axis, or -1. */
static int64_t axis_kernel_index(const spconv_conv_params *p, int axis, int64_t i, int64_t o) {
    const int64_t kernel = p->kernel[axis], s = p->stride[axis], pad = p->padding[axis],
                  d = p->dilation[axis];
    for (int64_t k = 0; k < kernel; ++k) {
        int reaches;
        switch (p->kind) {
        case SPCONV_CONV_SUBM: reaches = i + (kernel / 2) * d - k * d == o; break;
        case SPCONV_CONV_TRANSPOSED: reaches = o == i * s - pad + k * d; break;
        default: reaches = i + pad - k * d == o * s; break;
        }
        if (reaches) return k;
    }
    return -1;
}

/* The kernel offset through which in_row reaches out_row, or -1. */
static int64_t kernel_index(const spconv_conv_params *p, const int32_t *in_row,
                            const int32_t *out_row) {
    if (in_row[0] != out_row[0]) return -1;
    int64_t k = 0;
    for (int axis = 0; axis < 3; ++axis) {
        const int64_t k_axis = axis_kernel_index(p, axis, in_row[1 + axis], out_row[1 + axis]);
        if (k_axis < 0) return -1;
        k = k * p->kernel[axis] + k_axis;
    }
    return k;
}

static spconv_status check_rows(const int32_t *rows, int64_t n, const int64_t shape[3],
                                int64_t batch_size) {
    for (int64_t r = 0; r < n; ++r) {
        const int32_t *row = rows + 4 * r;
        SPCONV_RETURN_ERROR_IF(row[0] < 0 || row[0] >= batch_size, SPCONV_ERR_OUT_OF_RANGE,
                               FUNC ": indices row %" PRId64
                                    " = (%d, %d, %d, %d) has batch index %d "
                                    "outside batch size %" PRId64,
                               r, row[0], row[1], row[2], row[3], row[0], batch_size);
        for (int axis = 0; axis < 3; ++axis)
            SPCONV_RETURN_ERROR_IF(row[1 + axis] < 0 || row[1 + axis] >= shape[axis],
                                   SPCONV_ERR_OUT_OF_RANGE,
                                   FUNC ": indices row %" PRId64 " = (%d, %d, %d, %d) is outside "
                                        "spatial shape (%" PRId64 ", %" PRId64 ", %" PRId64 ")",
                                   r, row[0], row[1], row[2], row[3], shape[0], shape[1], shape[2]);
        for (int64_t q = 0; q < r; ++q)
            SPCONV_RETURN_ERROR_IF(memcmp(rows + 4 * q, row, 4 * sizeof *row) == 0,
                                   SPCONV_ERR_DUPLICATE_INDEX,
                                   FUNC ": indices row %" PRId64 " = (%d, %d, %d, %d) duplicates "
                                        "row %" PRId64,
                                   r, row[0], row[1], row[2], row[3], q);
    }
    return SPCONV_OK;
}

/* Every output grid position of batch b, in (z, y, x) order, that some input reaches. The inputs
 * are narrowed axis by axis (z, then y) only to save time; the rule itself is unchanged. */
static spconv_status outputs_of_batch(const spconv_conv_params *p, const int32_t *rows, int64_t n,
                                      const int64_t out_shape[3], int32_t b, int64_t *by_z,
                                      int64_t *by_zy, int32_list *outputs) {
    for (int64_t oz = 0; oz < out_shape[0]; ++oz) {
        int64_t nz = 0;
        for (int64_t i = 0; i < n; ++i)
            if (rows[4 * i] == b && axis_kernel_index(p, 0, rows[4 * i + 1], oz) >= 0)
                by_z[nz++] = i;
        for (int64_t oy = 0; nz > 0 && oy < out_shape[1]; ++oy) {
            int64_t nzy = 0;
            for (int64_t j = 0; j < nz; ++j)
                if (axis_kernel_index(p, 1, rows[4 * by_z[j] + 2], oy) >= 0) by_zy[nzy++] = by_z[j];
            for (int64_t ox = 0; nzy > 0 && ox < out_shape[2]; ++ox) {
                int reached = 0;
                for (int64_t j = 0; j < nzy && !reached; ++j)
                    reached = axis_kernel_index(p, 2, rows[4 * by_zy[j] + 3], ox) >= 0;
                const int32_t site[4] = {b, (int32_t)oz, (int32_t)oy, (int32_t)ox};
                if (reached) SPCONV_FORWARD_IF_ERROR(list_push(outputs, site, 4));
            }
        }
    }
    return SPCONV_OK;
}

static spconv_status enumerate_outputs(const spconv_rulebook *rb, const int32_t *rows,
                                       int32_list *outputs) {
    const int64_t n = rb->num_in;
    int64_t *by_z = malloc((size_t)(n > 0 ? n : 1) * sizeof *by_z);
    int64_t *by_zy = malloc((size_t)(n > 0 ? n : 1) * sizeof *by_zy);
    spconv_status st = by_z != NULL && by_zy != NULL
                           ? SPCONV_OK
                           : spconv__error(SPCONV_ERR_OUT_OF_MEMORY, FUNC ": out of host memory");
    for (int64_t b = 0; st == SPCONV_OK && b < rb->batch_size; ++b)
        st =
            outputs_of_batch(&rb->params, rows, n, rb->out_shape, (int32_t)b, by_z, by_zy, outputs);
    free(by_z);
    free(by_zy);
    return st;
}

/* All (k, in_row, out_row) triples, outputs in order; then grouped by k keeping that order. */
static spconv_status fill_pairs(spconv_rulebook *rb, const int32_t *in_rows,
                                const int32_t *out_rows) {
    int32_list triples = {NULL, 0, 0};
    spconv_status st = SPCONV_OK;
    for (int64_t o = 0; o < rb->num_out && st == SPCONV_OK; ++o)
        for (int64_t i = 0; i < rb->num_in && st == SPCONV_OK; ++i) {
            const int64_t k = kernel_index(&rb->params, in_rows + 4 * i, out_rows + 4 * o);
            const int32_t triple[3] = {(int32_t)k, (int32_t)i, (int32_t)o};
            if (k >= 0) st = list_push(&triples, triple, 3);
        }
    const int64_t num_pairs = triples.count / 3, kv = rb->kernel_volume;
    /* Dense per-offset prefix sums: the reference is for small kernels. */
    int64_t *offsets = calloc((size_t)kv + 1, sizeof *offsets);
    if (st == SPCONV_OK && offsets == NULL)
        st = spconv__error(SPCONV_ERR_OUT_OF_MEMORY, FUNC ": out of host memory");
    for (int64_t t = 0; t < num_pairs && st == SPCONV_OK; ++t) ++offsets[triples.data[3 * t] + 1];
    for (int64_t k = 0; k < kv && st == SPCONV_OK; ++k) offsets[k + 1] += offsets[k];
    if (st == SPCONV_OK) st = spconv__rulebook_set_offsets(FUNC, rb, kv, NULL, offsets);
    if (st == SPCONV_OK) st = spconv__rulebook_alloc_pairs(rb);
    if (st == SPCONV_OK) {
        int32_t *pairs_in = spconv_tensor_data(rb->pairs_in);
        int32_t *pairs_out = spconv_tensor_data(rb->pairs_out);
        for (int64_t k = 0; k < kv; ++k) {
            int64_t pos = offsets[k];
            for (int64_t t = 0; t < num_pairs; ++t) {
                if (triples.data[3 * t] != k) continue;
                pairs_in[pos] = triples.data[3 * t + 1];
                pairs_out[pos] = triples.data[3 * t + 2];
                ++pos;
            }
        }
    }
    free(offsets);
    free(triples.data);
    return st;
}

static spconv_status set_outputs(spconv_rulebook *rb, const int32_t *in_rows) {
    if (rb->params.kind == SPCONV_CONV_SUBM) {
        rb->out_indices = rb->in_indices;
        spconv_tensor_retain(rb->out_indices);
        rb->num_out = rb->num_in;
        rb->center_is_identity = 1;
        return SPCONV_OK;
    }
    int32_list outputs = {NULL, 0, 0};
    spconv_status st = enumerate_outputs(rb, in_rows, &outputs);
    rb->num_out = outputs.count / 4;
    const int64_t sizes[2] = {rb->num_out, 4};
    if (st == SPCONV_OK)
        st = spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, sizes, outputs.data,
                                     &rb->out_indices);
    free(outputs.data);
    return st;
}

spconv_status spconv__rulebook_build_ref(const spconv_tensor *indices,
                                         const int64_t spatial_shape[3], int64_t batch_size,
                                         const spconv_conv_params *params, spconv_rulebook **out) {
    SPCONV_CHECK_NOT_NULL(FUNC, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(FUNC, indices);
    SPCONV_CHECK_NOT_NULL(FUNC, spatial_shape);
    SPCONV_CHECK_NOT_NULL(FUNC, params);
    int64_t out_shape[3];
    SPCONV_FORWARD_IF_ERROR(spconv__conv_geometry(FUNC, params, spatial_shape, out_shape));
    SPCONV_FORWARD_IF_ERROR(spconv__check_batch_size(FUNC, batch_size));
    spconv_tensor *rows;
    SPCONV_FORWARD_IF_ERROR(
        spconv__indices_contiguous(NULL, FUNC, indices, SPCONV_DEVICE_CPU, &rows));
    spconv_rulebook *rb;
    spconv_status st =
        spconv__rulebook_alloc(FUNC, params, spatial_shape, out_shape, batch_size, &rb);
    if (st != SPCONV_OK) {
        spconv_tensor_release(rows);
        return st;
    }
    rb->in_indices = rows;
    rb->num_in = spconv_tensor_size(rows, 0);
    const int32_t *in_rows = spconv_tensor_data(rows);
    SPCONV_TRY_GOTO(st, check_rows(in_rows, rb->num_in, spatial_shape, batch_size), fail);
    SPCONV_TRY_GOTO(st, set_outputs(rb, in_rows), fail);
    SPCONV_TRY_GOTO(st, fill_pairs(rb, in_rows, spconv_tensor_data(rb->out_indices)), fail);
    rb->rows_order[SPCONV__SIDE_OUT] = SPCONV__ORDER_SORTED; /* fill_pairs walks outputs in order */
    *out = rb;
    return SPCONV_OK;
fail:
    spconv_rulebook_release(rb);
    return st;
}
