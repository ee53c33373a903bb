/* Rulebook objects: allocation, reference counting, accessors and the inverse rulebook. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "rulebook/internal.h"
#include "spconv/tensor.h"

spconv_status spconv__rulebook_alloc(const char *func, const spconv_conv_params *params,
                                     const int64_t in_shape[3], const int64_t out_shape[3],
                                     int64_t batch_size, spconv_rulebook **out) {
    *out = NULL;
    spconv_rulebook *rb = calloc(1, sizeof *rb);
    SPCONV_RETURN_ERROR_IF(rb == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for a rulebook", func);
    rb->refcount = 1;
    rb->params = *params;
    memcpy(rb->in_shape, in_shape, sizeof rb->in_shape);
    memcpy(rb->out_shape, out_shape, sizeof rb->out_shape);
    rb->batch_size = batch_size;
    rb->kernel_volume = spconv_conv_kernel_volume(params);
    const int64_t no_pairs = 0;
    spconv_status st = spconv__rulebook_set_offsets(func, rb, 0, NULL, &no_pairs);
    if (st != SPCONV_OK) {
        spconv_rulebook_release(rb);
        return st;
    }
    *out = rb;
    return SPCONV_OK;
}

spconv_status spconv__rulebook_set_offsets(const char *func, spconv_rulebook *rb,
                                           int64_t num_slots, const int64_t *slot_offsets,
                                           const int64_t *starts) {
    int64_t active = 0;
    for (int64_t j = 0; j < num_slots; ++j) active += starts[j + 1] > starts[j];
    free(rb->active_offsets);
    free(rb->active_starts);
    rb->active_offsets = malloc((size_t)(active > 0 ? active : 1) * sizeof *rb->active_offsets);
    rb->active_starts = malloc((size_t)(active + 1) * sizeof *rb->active_starts);
    SPCONV_RETURN_ERROR_IF(rb->active_offsets == NULL || rb->active_starts == NULL,
                           SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for %" PRId64 " pair offsets", func, active);
    int64_t a = 0;
    for (int64_t j = 0; j < num_slots; ++j) {
        if (starts[j + 1] == starts[j]) continue;
        rb->active_offsets[a] = slot_offsets != NULL ? slot_offsets[j] : j;
        rb->active_starts[a++] = starts[j];
    }
    rb->num_pairs = num_slots > 0 ? starts[num_slots] : 0;
    rb->active_starts[a] = rb->num_pairs;
    rb->num_active = active;
    return SPCONV_OK;
}

spconv_status spconv__rulebook_alloc_pairs(spconv_rulebook *rb) {
    const int64_t num_pairs = rb->num_pairs;
    SPCONV_FORWARD_IF_ERROR(
        spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 1, &num_pairs, &rb->pairs_in));
    return spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 1, &num_pairs, &rb->pairs_out);
}

spconv_status spconv__check_indices(const char *func, const spconv_tensor *indices) {
    SPCONV_RETURN_ERROR_IF(spconv_tensor_dtype(indices) != SPCONV_I32, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: indices must be int32, got %s", func,
                           spconv_dtype_name(spconv_tensor_dtype(indices)));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(indices) != 2, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: indices must be [N, 4] rows (b, z, y, x), got a %d-d tensor", func,
                           spconv_tensor_ndim(indices));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_size(indices, 1) != 4, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: indices must be [N, 4] rows (b, z, y, x), got [%" PRId64
                           ", %" PRId64 "]",
                           func, spconv_tensor_size(indices, 0), spconv_tensor_size(indices, 1));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_size(indices, 0) > INT32_MAX, SPCONV_ERR_OVERFLOW,
                           "%s: %" PRId64 " indices rows exceed int32 row numbers", func,
                           spconv_tensor_size(indices, 0));
    return SPCONV_OK;
}

spconv_status spconv__indices_contiguous(spconv_context *ctx, const char *func,
                                         const spconv_tensor *indices,
                                         spconv_device_type device_type, spconv_tensor **out) {
    *out = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__check_indices(func, indices));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_device(indices).type != device_type,
                           SPCONV_ERR_NOT_SUPPORTED, "%s: indices are on a %s device, not on the "
                           "device of this rulebook builder (%s)", func,
                           spconv_tensor_device(indices).type == SPCONV_DEVICE_CPU ? "CPU" : "CUDA",
                           device_type == SPCONV_DEVICE_CPU ? "CPU" : "CUDA");
    return spconv_tensor_contiguous(ctx, indices, out);
}

/* Same orderings as tensors: relaxed increments suffice because a reference can only be copied
 * by someone who already holds one; the last decrement must see every other thread's writes. */
void spconv_rulebook_retain(spconv_rulebook *rb) {
    if (rb != NULL) __atomic_fetch_add(&rb->refcount, 1, __ATOMIC_RELAXED);
}

void spconv_rulebook_release(spconv_rulebook *rb) {
    if (rb == NULL) return;
    if (__atomic_sub_fetch(&rb->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    spconv_tensor_release(rb->pairs_in);
    spconv_tensor_release(rb->pairs_out);
    spconv_tensor_release(rb->in_indices);
    spconv_tensor_release(rb->out_indices);
    free(rb->active_offsets);
    free(rb->active_starts);
    free(rb);
}

const spconv_conv_params *spconv_rulebook_params(const spconv_rulebook *rb) { return &rb->params; }
spconv_conv_kind spconv_rulebook_forward_kind(const spconv_rulebook *rb) {
    return rb->params.kind == SPCONV_CONV_INVERSE ? rb->inverts : rb->params.kind;
}
int64_t spconv_rulebook_kernel_volume(const spconv_rulebook *rb) { return rb->kernel_volume; }
int64_t spconv_rulebook_num_in(const spconv_rulebook *rb) { return rb->num_in; }
int64_t spconv_rulebook_num_out(const spconv_rulebook *rb) { return rb->num_out; }
int64_t spconv_rulebook_batch_size(const spconv_rulebook *rb) { return rb->batch_size; }

void spconv_rulebook_in_shape(const spconv_rulebook *rb, int64_t shape[3]) {
    memcpy(shape, rb->in_shape, sizeof rb->in_shape);
}

void spconv_rulebook_out_shape(const spconv_rulebook *rb, int64_t shape[3]) {
    memcpy(shape, rb->out_shape, sizeof rb->out_shape);
}

int64_t spconv_rulebook_num_active_offsets(const spconv_rulebook *rb) { return rb->num_active; }
const int64_t *spconv_rulebook_active_offsets(const spconv_rulebook *rb) {
    return rb->active_offsets;
}
const int64_t *spconv_rulebook_active_starts(const spconv_rulebook *rb) {
    return rb->active_starts;
}

void spconv_rulebook_offset_range(const spconv_rulebook *rb, int64_t k, int64_t *begin,
                                  int64_t *end) {
    int64_t lo = 0, hi = rb->num_active;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (rb->active_offsets[mid] < k)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < rb->num_active && rb->active_offsets[lo] == k) {
        *begin = rb->active_starts[lo];
        *end = rb->active_starts[lo + 1];
    } else {
        *begin = *end = 0;
    }
}

int64_t spconv_rulebook_num_pairs(const spconv_rulebook *rb) { return rb->num_pairs; }

spconv_tensor *spconv_rulebook_pairs_in(const spconv_rulebook *rb) { return rb->pairs_in; }
spconv_tensor *spconv_rulebook_pairs_out(const spconv_rulebook *rb) { return rb->pairs_out; }
spconv_tensor *spconv_rulebook_in_indices(const spconv_rulebook *rb) { return rb->in_indices; }
spconv_tensor *spconv_rulebook_out_indices(const spconv_rulebook *rb) { return rb->out_indices; }

/* A built rulebook is never modified, so the inverse shares the forward's tensors with the roles
 * swapped. Within an offset its pairs stay in the forward's order, i.e. increasing in_row; each
 * out_row (a forward input row) still appears at most once per offset, because a regular conv
 * sends an input through one offset to at most one output. */
spconv_status spconv_rulebook_inverse(const spconv_rulebook *forward, spconv_rulebook **out) {
    const char *func = "spconv_rulebook_inverse";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, forward);
    /* Per kernel offset a regular and a transposed rulebook pair each input row with at most one
     * output row and each output row with at most one input row, so the sides swapped are a
     * rulebook of the same form (the executors' per-offset scatter meets no row twice). */
    SPCONV_RETURN_ERROR_IF(forward->params.kind != SPCONV_CONV_REGULAR &&
                               forward->params.kind != SPCONV_CONV_TRANSPOSED,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: only a REGULAR (conv or pool) or TRANSPOSED rulebook can be "
                           "inverted, got kind %d",
                           func, (int)forward->params.kind);
    spconv_conv_params params = forward->params;
    params.kind = SPCONV_CONV_INVERSE;
    spconv_rulebook *rb;
    SPCONV_FORWARD_IF_ERROR(spconv__rulebook_alloc(func, &params, forward->out_shape,
                                                   forward->in_shape, forward->batch_size, &rb));
    spconv_status st = spconv__rulebook_set_offsets(func, rb, forward->num_active,
                                                    forward->active_offsets,
                                                    forward->active_starts);
    if (st != SPCONV_OK) {
        spconv_rulebook_release(rb);
        return st;
    }
    rb->inverts = forward->params.kind;
    rb->num_in = forward->num_out;
    rb->num_out = forward->num_in;
    rb->pairs_in = forward->pairs_out;
    rb->pairs_out = forward->pairs_in;
    rb->in_indices = forward->out_indices;
    rb->out_indices = forward->in_indices;
    rb->rows_order[SPCONV__SIDE_IN] =
        __atomic_load_n(&forward->rows_order[SPCONV__SIDE_OUT], __ATOMIC_RELAXED);
    rb->rows_order[SPCONV__SIDE_OUT] =
        __atomic_load_n(&forward->rows_order[SPCONV__SIDE_IN], __ATOMIC_RELAXED);
    spconv_tensor_retain(rb->pairs_in);
    spconv_tensor_retain(rb->pairs_out);
    spconv_tensor_retain(rb->in_indices);
    spconv_tensor_retain(rb->out_indices);
    *out = rb;
    return SPCONV_OK;
}
