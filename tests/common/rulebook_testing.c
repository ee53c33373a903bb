/* Helpers for the rulebook and sparse-tensor tests (see rulebook_testing.h). */
#include "common/rulebook_testing.h"

#include <stdlib.h>
#include <string.h>

#include "rulebook/rulebook_impl.h"

int32_t *spconv_test_random_sites(int64_t batch, const int64_t shape[3], int64_t per_batch) {
    const int64_t volume = shape[0] * shape[1] * shape[2], n = batch * per_batch;
    assert_true(per_batch <= volume);
    int32_t *rows = malloc((size_t)(n > 0 ? n : 1) * 4 * sizeof *rows);
    int64_t *cells = malloc((size_t)volume * sizeof *cells);
    assert_non_null(rows);
    assert_non_null(cells);
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t c = 0; c < volume; ++c) cells[c] = c;
        /* A partial Fisher-Yates shuffle draws per_batch distinct cells. */
        for (int64_t j = 0; j < per_batch; ++j) {
            const int64_t pick = spconv_test_rand_int(j, volume - 1);
            const int64_t cell = cells[pick];
            cells[pick] = cells[j];
            cells[j] = cell;
            int32_t *row = rows + 4 * (b * per_batch + j);
            row[0] = (int32_t)b;
            row[1] = (int32_t)(cell / (shape[1] * shape[2]));
            row[2] = (int32_t)(cell / shape[2] % shape[1]);
            row[3] = (int32_t)(cell % shape[2]);
        }
    }
    for (int64_t j = n - 1; j > 0; --j) { /* mix the batches */
        const int64_t pick = spconv_test_rand_int(0, j);
        int32_t swap[4];
        memcpy(swap, rows + 4 * j, sizeof swap);
        memcpy(rows + 4 * j, rows + 4 * pick, sizeof swap);
        memcpy(rows + 4 * pick, swap, sizeof swap);
    }
    free(cells);
    return rows;
}

spconv_tensor *spconv_test_indices_tensor(const int32_t *rows, int64_t n) {
    const int64_t sizes[2] = {n, 4};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, sizes, rows, &t));
    return t;
}

int spconv_test_pair_follows_rule(const spconv_conv_params *params, const int32_t *in,
                                  const int32_t *out, int64_t k) {
    if (in[0] != out[0]) return 0;
    const int64_t *kernel = params->kernel;
    const int64_t split[3] = {k / (kernel[1] * kernel[2]), k / kernel[2] % kernel[1],
                              k % kernel[2]};
    for (int axis = 0; axis < 3; ++axis) {
        const int64_t i = in[1 + axis], o = out[1 + axis], c = split[axis];
        const int64_t s = params->stride[axis], p = params->padding[axis],
                      d = params->dilation[axis];
        int ok;
        switch (params->kind) {
        case SPCONV_CONV_SUBM: ok = i + (kernel[axis] / 2) * d - c * d == o; break;
        case SPCONV_CONV_TRANSPOSED: ok = o == i * s - p + c * d; break;
        case SPCONV_CONV_INVERSE: ok = o + p - c * d == i * s; break;
        default: ok = i + p - c * d == o * s; break;
        }
        if (!ok) return 0;
    }
    return 1;
}

/* spconv_test_pair_follows_rule for @p rb's pair (in, out) at offset k; an inverse's pairs follow
 * the rule of the kind it inverts, sides swapped. */
static int pair_follows(const spconv_rulebook *rb, const int32_t *in, const int32_t *out,
                        int64_t k) {
    const spconv_conv_params *params = spconv_rulebook_params(rb);
    if (params->kind != SPCONV_CONV_INVERSE)
        return spconv_test_pair_follows_rule(params, in, out, k);
    spconv_conv_params forward = *params;
    forward.kind = spconv_rulebook_forward_kind(rb);
    return spconv_test_pair_follows_rule(&forward, out, in, k);
}

static int compare_rows(const int32_t *a, const int32_t *b) {
    for (int f = 0; f < 4; ++f)
        if (a[f] != b[f]) return a[f] < b[f] ? -1 : 1;
    return 0;
}

static const int32_t *contiguous_i32(const spconv_tensor *t, int64_t numel) {
    assert_int_equal(spconv_tensor_dtype(t), SPCONV_I32);
    assert_int_equal(spconv_tensor_numel(t), numel);
    assert_true(spconv_tensor_is_contiguous(t));
    return spconv_tensor_data(t);
}

static void check_sites(const spconv_rulebook *rb, const int32_t *in_rows,
                        const int32_t *out_rows) {
    const spconv_conv_params *params = spconv_rulebook_params(rb);
    int64_t in_shape[3], out_shape[3], expected[3];
    spconv_rulebook_in_shape(rb, in_shape);
    spconv_rulebook_out_shape(rb, out_shape);
    if (params->kind == SPCONV_CONV_INVERSE) {
        /* The inverse's input shape is the output shape of the conv it inverts. */
        spconv_conv_params forward = *params;
        forward.kind = spconv_rulebook_forward_kind(rb);
        assert_true(forward.kind == SPCONV_CONV_REGULAR || forward.kind == SPCONV_CONV_TRANSPOSED);
        SPCONV_ASSERT_OK(spconv_conv_output_shape(&forward, out_shape, expected));
        assert_memory_equal(expected, in_shape, sizeof expected);
    } else {
        SPCONV_ASSERT_OK(spconv_conv_output_shape(params, in_shape, expected));
        assert_memory_equal(expected, out_shape, sizeof expected);
    }
    const int64_t batch = spconv_rulebook_batch_size(rb);
    for (int64_t o = 0; o < spconv_rulebook_num_out(rb); ++o) {
        const int32_t *row = out_rows + 4 * o;
        assert_true(row[0] >= 0 && row[0] < batch);
        for (int axis = 0; axis < 3; ++axis)
            assert_true(row[1 + axis] >= 0 && row[1 + axis] < out_shape[axis]);
        if ((params->kind == SPCONV_CONV_REGULAR || params->kind == SPCONV_CONV_TRANSPOSED) &&
            o > 0)
            assert_true(compare_rows(out_rows + 4 * (o - 1), row) < 0);
    }
    if (params->kind == SPCONV_CONV_SUBM) {
        assert_ptr_equal(spconv_rulebook_in_indices(rb), spconv_rulebook_out_indices(rb));
        assert_ptr_equal(in_rows, out_rows);
    }
}

/* The active-offset list is well formed: offsets strictly increasing inside the kernel, every
 * listed offset non-empty, prefix sums from 0 to the pair count, and spconv_rulebook_offset_range
 * agreeing with it for every offset of the kernel (empty for the ones not listed). */
static void check_active_offsets(const spconv_rulebook *rb) {
    const int64_t kv = spconv_rulebook_kernel_volume(rb);
    const int64_t active = spconv_rulebook_num_active_offsets(rb);
    const int64_t *ks = spconv_rulebook_active_offsets(rb);
    const int64_t *starts = spconv_rulebook_active_starts(rb);
    assert_true(active >= 0 && active <= kv);
    assert_int_equal(starts[0], 0);
    assert_int_equal(starts[active], spconv_rulebook_num_pairs(rb));
    for (int64_t j = 0; j < active; ++j) {
        assert_true(ks[j] >= 0 && ks[j] < kv);
        if (j > 0) assert_true(ks[j - 1] < ks[j]);
        assert_true(starts[j] < starts[j + 1]);
    }
    /* Every offset when the kernel is small enough to walk; the listed ones and their
     * neighbours otherwise. */
    int64_t j = 0;
    for (int64_t k = 0; k < kv && kv <= 100000; ++k) {
        int64_t begin = -1, end = -1;
        spconv_rulebook_offset_range(rb, k, &begin, &end);
        if (j < active && ks[j] == k) {
            assert_int_equal(begin, starts[j]);
            assert_int_equal(end, starts[j + 1]);
            ++j;
        } else {
            assert_int_equal(begin, end);
        }
    }
    for (j = 0; j < active; ++j) {
        int64_t begin = -1, end = -1;
        spconv_rulebook_offset_range(rb, ks[j], &begin, &end);
        assert_int_equal(begin, starts[j]);
        assert_int_equal(end, starts[j + 1]);
        spconv_rulebook_offset_range(rb, ks[j] + 1, &begin, &end);
        if (j + 1 == active || ks[j + 1] != ks[j] + 1) assert_int_equal(begin, end);
    }
}

/* Every pair obeys the rule, has rows in range and a distinct out_row within its offset. */
static void check_pairs(const spconv_rulebook *rb, const int32_t *in_rows,
                        const int32_t *out_rows) {
    const spconv_conv_params *params = spconv_rulebook_params(rb);
    const int64_t kv = spconv_rulebook_kernel_volume(rb), num_out = spconv_rulebook_num_out(rb);
    const int64_t active = spconv_rulebook_num_active_offsets(rb);
    const int64_t *ks = spconv_rulebook_active_offsets(rb);
    const int64_t *starts = spconv_rulebook_active_starts(rb);
    const int64_t num_pairs = spconv_rulebook_num_pairs(rb);
    const int32_t *pairs_in = contiguous_i32(spconv_rulebook_pairs_in(rb), num_pairs);
    const int32_t *pairs_out = contiguous_i32(spconv_rulebook_pairs_out(rb), num_pairs);
    int64_t *last_offset = malloc((size_t)(num_out > 0 ? num_out : 1) * sizeof *last_offset);
    unsigned char *reached = calloc((size_t)(num_out > 0 ? num_out : 1), 1);
    assert_non_null(last_offset);
    assert_non_null(reached);
    for (int64_t o = 0; o < num_out; ++o) last_offset[o] = -1;
    check_active_offsets(rb);
    int in_sorted = 1, out_sorted = 1;
    for (int64_t a = 0; a < active; ++a) {
        const int64_t k = ks[a];
        for (int64_t j = starts[a]; j < starts[a + 1]; ++j) {
            const int32_t i = pairs_in[j], o = pairs_out[j];
            if (j > starts[a]) {
                in_sorted &= pairs_in[j - 1] < i;
                out_sorted &= pairs_out[j - 1] < o;
            }
            assert_true(i >= 0 && i < spconv_rulebook_num_in(rb));
            assert_true(o >= 0 && o < num_out);
            assert_true(pair_follows(rb, in_rows + 4 * i, out_rows + 4 * o, k));
            assert_true(last_offset[o] < k); /* out_row at most once per offset */
            last_offset[o] = k;
            reached[o] = 1;
            if (params->kind != SPCONV_CONV_INVERSE && j > starts[a])
                assert_true(pairs_out[j - 1] < o);
        }
    }
    /* The order the rulebook records (at its build, or learnt by an executor) is the true one. */
    const int truth[2] = {in_sorted, out_sorted};
    for (int side = 0; side < 2; ++side)
        if (rb->rows_order[side] != SPCONV__ORDER_UNKNOWN)
            assert_int_equal(rb->rows_order[side] == SPCONV__ORDER_SORTED, truth[side]);
    if (params->kind != SPCONV_CONV_INVERSE)
        assert_int_equal(rb->rows_order[SPCONV__SIDE_OUT], SPCONV__ORDER_SORTED);
    if (params->kind == SPCONV_CONV_REGULAR || params->kind == SPCONV_CONV_TRANSPOSED)
        for (int64_t o = 0; o < num_out; ++o) assert_true(reached[o]);
    if (params->kind == SPCONV_CONV_SUBM) {
        int64_t begin, end;
        spconv_rulebook_offset_range(rb, kv / 2, &begin, &end);
        assert_int_equal(end - begin, num_out);
        for (int64_t o = 0; o < num_out; ++o) {
            assert_int_equal(pairs_in[begin + o], o);
            assert_int_equal(pairs_out[begin + o], o);
        }
        /* Mirrored offsets pair the same sites the other way round: equal counts. */
        for (int64_t a = 0; a < active; ++a) {
            assert_int_equal(ks[a] + ks[active - 1 - a], kv - 1);
            assert_int_equal(starts[a + 1] - starts[a],
                             starts[active - a] - starts[active - 1 - a]);
        }
    }
    free(last_offset);
    free(reached);
}

void spconv_test_check_rulebook(const spconv_rulebook *rb) {
    assert_non_null(rb);
    const spconv_conv_params *params = spconv_rulebook_params(rb);
    assert_int_equal(spconv_rulebook_kernel_volume(rb), spconv_conv_kernel_volume(params));
    const int32_t *in_rows =
        contiguous_i32(spconv_rulebook_in_indices(rb), 4 * spconv_rulebook_num_in(rb));
    const int32_t *out_rows =
        contiguous_i32(spconv_rulebook_out_indices(rb), 4 * spconv_rulebook_num_out(rb));
    check_sites(rb, in_rows, out_rows);
    check_pairs(rb, in_rows, out_rows);
}

static void assert_tensors_equal(const spconv_tensor *a, const spconv_tensor *b) {
    assert_int_equal(spconv_tensor_numel(a), spconv_tensor_numel(b));
    const int64_t n = spconv_tensor_numel(a);
    if (n > 0)
        assert_memory_equal(contiguous_i32(a, n), contiguous_i32(b, n),
                            (size_t)n * sizeof(int32_t));
}

void spconv_test_assert_rulebooks_equal(const spconv_rulebook *a, const spconv_rulebook *b) {
    const spconv_conv_params *pa = spconv_rulebook_params(a), *pb = spconv_rulebook_params(b);
    assert_int_equal(pa->kind, pb->kind);
    for (int axis = 0; axis < 3; ++axis) {
        assert_int_equal(pa->kernel[axis], pb->kernel[axis]);
        assert_int_equal(pa->stride[axis], pb->stride[axis]);
        assert_int_equal(pa->padding[axis], pb->padding[axis]);
        assert_int_equal(pa->dilation[axis], pb->dilation[axis]);
        assert_int_equal(pa->output_padding[axis], pb->output_padding[axis]);
    }
    int64_t shape_a[3], shape_b[3];
    spconv_rulebook_in_shape(a, shape_a);
    spconv_rulebook_in_shape(b, shape_b);
    assert_memory_equal(shape_a, shape_b, sizeof shape_a);
    spconv_rulebook_out_shape(a, shape_a);
    spconv_rulebook_out_shape(b, shape_b);
    assert_memory_equal(shape_a, shape_b, sizeof shape_a);
    assert_int_equal(spconv_rulebook_batch_size(a), spconv_rulebook_batch_size(b));
    assert_int_equal(spconv_rulebook_num_in(a), spconv_rulebook_num_in(b));
    assert_int_equal(spconv_rulebook_num_out(a), spconv_rulebook_num_out(b));
    const int64_t kv = spconv_rulebook_kernel_volume(a);
    assert_int_equal(kv, spconv_rulebook_kernel_volume(b));
    const int64_t active = spconv_rulebook_num_active_offsets(a);
    assert_int_equal(active, spconv_rulebook_num_active_offsets(b));
    if (active > 0)
        assert_memory_equal(spconv_rulebook_active_offsets(a), spconv_rulebook_active_offsets(b),
                            (size_t)active * sizeof(int64_t));
    assert_memory_equal(spconv_rulebook_active_starts(a), spconv_rulebook_active_starts(b),
                        (size_t)(active + 1) * sizeof(int64_t));
    assert_tensors_equal(spconv_rulebook_in_indices(a), spconv_rulebook_in_indices(b));
    assert_tensors_equal(spconv_rulebook_out_indices(a), spconv_rulebook_out_indices(b));
    assert_tensors_equal(spconv_rulebook_pairs_in(a), spconv_rulebook_pairs_in(b));
    assert_tensors_equal(spconv_rulebook_pairs_out(a), spconv_rulebook_pairs_out(b));
}

spconv_conv_params spconv_test_random_params(spconv_conv_kind kind, const int64_t shape[3]) {
    for (;;) {
        spconv_conv_params p = spconv_conv_params_default(kind);
        for (int axis = 0; axis < 3; ++axis) {
            p.kernel[axis] = kind == SPCONV_CONV_SUBM ? 2 * spconv_test_rand_int(0, 2) + 1
                                                      : spconv_test_rand_int(1, 4);
            p.stride[axis] = spconv_test_rand_int(1, 3);
            p.padding[axis] = spconv_test_rand_int(0, 2);
            p.dilation[axis] = spconv_test_rand_int(1, 3);
            if (kind == SPCONV_CONV_TRANSPOSED) {
                const int64_t limit =
                    p.stride[axis] > p.dilation[axis] ? p.stride[axis] : p.dilation[axis];
                p.output_padding[axis] = spconv_test_rand_int(0, limit - 1);
            }
        }
        int64_t out[3];
        if (spconv_conv_output_shape(&p, shape, out) == SPCONV_OK) return p;
    }
}
