/* indice_conv forward: against a dense double oracle written from the geometry alone (the grid of
 * spconv's own tests and more), against the pair-loop reference, across thread counts and GEMM
 * implementations, and every bad input. Gradients live in test_conv_grad.c, pooling in
 * test_conv_pool.c, GEMM in test_conv_gemm.c, dense helpers and weight layouts in
 * test_conv_dense.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conv_cases.h"
#include "common/conv_helpers.h"
#include "conv/conv_cpu.h"
#include "conv/conv_exec.h"
#include "conv/fused.h"
#include "conv/conv_ref.h"

/* The case's forward in @p dtype through the public API (or _ex with @p options). */
static spconv_tensor *run_forward(spconv_context *ctx, const conv_case *c, spconv_dtype dtype,
                                  int with_bias, const spconv__conv_options *options) {
    spconv_tensor *x = conv_case_features(c, dtype);
    spconv_tensor *w = conv_case_weight(c, dtype);
    spconv_tensor *b = with_bias ? conv_tensor(dtype, 1, &c->c_out, c->bias) : NULL;
    spconv_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv__conv_forward_ex(ctx, c->rb, x, w, b, options, &out));
    assert_int_equal(spconv_tensor_ndim(out), 2);
    assert_int_equal(spconv_tensor_size(out, 0), c->n_out);
    assert_int_equal(spconv_tensor_size(out, 1), c->c_out);
    assert_int_equal(spconv_tensor_dtype(out), dtype);
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    spconv_tensor_release(b);
    return out;
}

/* Set up @p c, run its forward in f32 with the bias and in f64 without, and hold both to the
 * oracle (the oracle's sums less the bias, exact to an f64 rounding). */
static void check_forward(conv_case *c) {
    /* One thread: results do not depend on the thread count (test_determinism_threads), and a
     * serial run keeps OpenMP workers from spinning while the oracle computes. */
    spconv_context *ctx = conv_context(1);
    conv_case_setup(c, ctx);
    const int64_t n = c->n_out * c->c_out;
    double *expected = calloc((size_t)n + 1, sizeof(double));
    assert_non_null(expected);
    conv_case_oracle_forward(c, expected);
    for (int d = 0; d < 2; ++d) {
        spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
        spconv_tensor *out = run_forward(ctx, c, dtype, d == 0, NULL);
        if (d == 1)
            for (int64_t i = 0; i < n; ++i) expected[i] -= c->bias[i % c->c_out];
        double *got = conv_read(out, NULL);
        conv_case_expect_close(c, d == 0 ? "f32 with bias" : "f64 without bias", got, expected,
                               n, conv_tolerance(dtype));
        free(got);
        spconv_tensor_release(out);
    }
    free(expected);
    conv_case_free(c);
    spconv_context_destroy(ctx);
}

/* spconv's own test grid: shape [19, 18, 17], 1500 unique sites per batch, C_in 32, C_out
 * {32, 48, 64}, kernel {2, 3}, stride {1, 2, 3}, padding {0, 1, 2}, dilation {1, 2, 3}, every
 * combination (stride > 1 together with dilation > 1 too), f32 and f64. */
static void forward_grid(int64_t batch) {
    static const int64_t c_outs[3] = {32, 48, 64};
    for (int oc = 0; oc < 3; ++oc)
        for (int64_t k = 2; k <= 3; ++k)
            for (int64_t s = 1; s <= 3; ++s)
                for (int64_t p = 0; p <= 2; ++p)
                    for (int64_t d = 1; d <= 3; ++d) {
                        conv_case c =
                            conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, k, s, p, d),
                                           (int64_t[3]){19, 18, 17}, batch, 1500, 32, c_outs[oc]);
                        check_forward(&c);
                    }
}

static void test_forward_grid_batch1(void **state) {
    (void)state;
    forward_grid(1);
}

static void test_forward_grid_batch2(void **state) {
    (void)state;
    forward_grid(2);
}

/* A random case: shape 3..16 per axis, batch 1..3, up to a third of the cells active, channel
 * counts that are mostly not multiples of 4 or 8. */
static conv_case random_case(spconv_conv_kind kind) {
    conv_case c;
    memset(&c, 0, sizeof c);
    for (int a = 0; a < 3; ++a) c.shape[a] = spconv_test_rand_int(3, 16);
    c.batch = spconv_test_rand_int(1, 3);
    c.n_per_batch = spconv_test_rand_int(1, oracle_cells(c.shape) / 3 + 1);
    c.c_in = spconv_test_rand_int(1, 19);
    c.c_out = spconv_test_rand_int(1, 21);
    c.params = conv_case_random_params(kind, c.shape, 0);
    return c;
}

static void test_forward_anisotropic(void **state) {
    (void)state;
    for (int i = 0; i < 60; ++i) {
        conv_case c = random_case(SPCONV_CONV_REGULAR);
        check_forward(&c);
    }
}

static void test_forward_transposed(void **state) {
    (void)state;
    for (int i = 0; i < 60; ++i) {
        conv_case c = random_case(SPCONV_CONV_TRANSPOSED);
        check_forward(&c);
    }
    /* The main sizes with output padding on every axis. */
    conv_case c = conv_case_make(conv_params_iso(SPCONV_CONV_TRANSPOSED, 3, 2, 1, 1),
                                 (int64_t[3]){19, 18, 17}, 2, 1500, 32, 48);
    for (int a = 0; a < 3; ++a) c.params.output_padding[a] = 1;
    check_forward(&c);
}

/* Submanifold: dilation 1..3 with the main sizes, then random odd anisotropic kernels. */
static void test_forward_subm(void **state) {
    (void)state;
    static const int64_t c_outs[3] = {32, 48, 64};
    for (int64_t d = 1; d <= 3; ++d)
        for (int oc = 0; oc < 3; ++oc) {
            conv_case c =
                conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, d),
                               (int64_t[3]){19, 18, 17}, 1 + oc % 2, 1500, 32, c_outs[oc]);
            check_forward(&c);
        }
    for (int i = 0; i < 40; ++i) {
        conv_case c = random_case(SPCONV_CONV_SUBM);
        for (int a = 0; a < 3; ++a) {
            c.params.kernel[a] = 2 * spconv_test_rand_int(0, 2) + 1;
            c.params.dilation[a] = spconv_test_rand_int(1, 3);
        }
        check_forward(&c);
    }
}

/* Inverse conv: features on the outputs of a regular conv, back onto its inputs. */
static void test_forward_inverse(void **state) {
    (void)state;
    conv_case main_case = conv_case_make(conv_params_iso(SPCONV_CONV_INVERSE, 3, 2, 1, 1),
                                         (int64_t[3]){19, 18, 17}, 2, 1500, 64, 32);
    check_forward(&main_case);
    for (int i = 0; i < 40; ++i) {
        conv_case c = random_case(SPCONV_CONV_REGULAR);
        c.params.kind = SPCONV_CONV_INVERSE;
        check_forward(&c);
    }
}

/* No sites, one site, one channel: the sizes where loops run zero or one time. */
static void test_forward_small_sizes(void **state) {
    (void)state;
    /* Dilation 1 and a cubic shape of side `side` throughout. */
    static const struct {
        spconv_conv_kind kind;
        int64_t kernel, stride, padding, side, batch, n_per_batch, c_in, c_out;
    } cases[] = {
        {SPCONV_CONV_SUBM, 3, 1, 0, 5, 1, 1, 1, 1},    /* one site */
        {SPCONV_CONV_REGULAR, 2, 2, 0, 4, 2, 1, 3, 5}, /* one regular site per batch */
        {SPCONV_CONV_REGULAR, 3, 2, 1, 9, 1, 0, 7, 6}, /* empty */
        {SPCONV_CONV_SUBM, 3, 1, 0, 9, 1, 0, 7, 6},    /* empty subm */
        /* With C_out = 0 the output has no columns; with C_in = 0 it is the bias alone. */
        {SPCONV_CONV_REGULAR, 3, 1, 1, 6, 1, 20, 4, 0},
        {SPCONV_CONV_SUBM, 3, 1, 0, 6, 1, 20, 0, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const int64_t side = cases[i].side;
        conv_case c = conv_case_make(
            conv_params_iso(cases[i].kind, cases[i].kernel, cases[i].stride, cases[i].padding, 1),
            (int64_t[3]){side, side, side}, cases[i].batch, cases[i].n_per_batch, cases[i].c_in,
            cases[i].c_out);
        check_forward(&c);
    }
}

/* A case of @p kind whose target rows are cut into many blocks: the executor sizes blocks by
 * bytes (1024 f32 channels give 256 rows, f64 128), so wide channels on the accumulated side
 * (C_out in forward, C_in in backward) make short blocks. The transposed conv has many more
 * outputs than inputs, so it gets fewer sites and channels (its buffers stay small). */
static conv_case many_blocks_case(int i, int backward) {
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    const int transposed = kinds[i] == SPCONV_CONV_TRANSPOSED;
    const int64_t wide = transposed ? 256 : 1024;
    return conv_case_make(conv_params_iso(kinds[i], 3, i == 1 ? 1 : 2, 1, 1),
                          (int64_t[3]){20, 20, 20}, 1, transposed ? 1000 : 3000,
                          backward ? wide : 3, backward ? 3 : wide);
}

/* Dozens of output blocks, whose pair ranges are found per offset; the inverse case also sorts
 * its pairs by out row first. */
static void test_forward_many_blocks(void **state) {
    (void)state;
    for (int i = 0; i < 4; ++i) {
        conv_case c = many_blocks_case(i, 0);
        check_forward(&c);
    }
}

/* Strided views and the 5-d weight layout give the same bits as contiguous operands. */
static void test_forward_layouts(void **state) {
    (void)state;
    conv_case c = conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                 (int64_t[3]){11, 12, 13}, 2, 200, 6, 5);
    c.params.kernel[2] = 2;
    conv_case_setup(&c, NULL);
    spconv_tensor *reference = run_forward(NULL, &c, SPCONV_F32, 1, NULL);

    /* features as the left half of a [n, 2 C_in] tensor, weight as a 5-d tensor */
    int64_t wide_sizes[2] = {c.n_in, 2 * c.c_in};
    double *wide = calloc((size_t)(c.n_in * 2 * c.c_in) + 1, sizeof(double));
    assert_non_null(wide);
    for (int64_t i = 0; i < c.n_in; ++i)
        memcpy(wide + i * 2 * c.c_in, c.x + i * c.c_in, (size_t)c.c_in * sizeof(double));
    spconv_tensor *wide_t = conv_tensor(SPCONV_F32, 2, wide_sizes, wide), *x_view = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_narrow(wide_t, 1, 0, c.c_in, &x_view));
    assert_false(spconv_tensor_is_contiguous(x_view));
    int64_t w5_sizes[5] = {c.params.kernel[0], c.params.kernel[1], c.params.kernel[2], c.c_in,
                           c.c_out};
    spconv_tensor *w5 = conv_tensor(SPCONV_F32, 5, w5_sizes, c.w);
    spconv_tensor *b = conv_tensor(SPCONV_F32, 1, &c.c_out, c.bias), *out = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, c.rb, x_view, w5, b, &out));
    assert_true(conv_same_bits(out, reference));

    spconv_tensor_release(out);
    spconv_tensor_release(b);
    spconv_tensor_release(w5);
    spconv_tensor_release(x_view);
    spconv_tensor_release(wide_t);
    spconv_tensor_release(reference);
    free(wide);
    conv_case_free(&c);
}


/* The per-block pair ranges the executors read from a bounds table (spconv__pair_bounds, the
 * searches advancing in step) equal two plain binary searches per block and offset, on random
 * increasing segments, some empty, with targets that skip whole blocks or fill one, mirrored or
 * not, for 1 to 3,000 blocks (one block gets no table); a table is only offered where it fits,
 * and the size check does not overflow for block counts near INT64_MAX. */
static void test_pair_bounds(void **state) {
    (void)state;
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t num_rows = spconv_test_rand_int(2, 3000);
        const int64_t segments = spconv_test_rand_int(1, 9);
        const int64_t block_rows = spconv_test_rand_int(1, num_rows);
        const int64_t blocks = (num_rows + block_rows - 1) / block_rows;
        int64_t starts[10] = {0};
        int32_t *target = malloc((size_t)(segments * num_rows) * sizeof *target);
        assert_non_null(target);
        for (int64_t j = 0; j < segments; ++j) {
            const int64_t keep = spconv_test_rand_int(0, 100); /* percent of rows in the segment */
            const int64_t gap_lo = spconv_test_rand_int(0, num_rows), gap_hi = gap_lo + block_rows;
            starts[j + 1] = starts[j];
            for (int64_t r = 0; r < num_rows; ++r)
                if ((r < gap_lo || r >= gap_hi) && spconv_test_rand_int(0, 99) < keep)
                    target[starts[j + 1]++] = (int32_t)r;
        }
        spconv__pair_lists lists = {segments, NULL, starts, NULL, target, (int)(trial % 2),
                                    NULL, block_rows, blocks};
        const int64_t entries = spconv__pair_bounds_entries(&lists, block_rows, blocks);
        if (blocks < 2 || segments * (blocks + 1) > starts[segments] + segments) {
            assert_int_equal(entries, 0);
        } else {
            assert_int_equal(entries, segments * (blocks + 1));
        }
        if (entries == 0) {
            free(target);
            continue;
        }
        /* one thread's scratch after the table, as spconv__pair_bounds_bytes lays it out */
        int64_t *bounds = malloc(spconv__pair_bounds_bytes(entries, blocks, 1));
        assert_non_null(bounds);
        lists.bounds = bounds;
        int64_t *scratch = spconv__pair_bounds_scratch(bounds, entries);
        for (int64_t j = 0; j < segments; ++j) spconv__pair_bounds(&lists, j, scratch);
        /* whole blocks, and ranges with either end or both inside a block (the executors'
         * last blocks are parts of the table's) */
        for (int64_t j = 0; j < segments; ++j)
            for (int64_t b = 0; b < blocks; ++b) {
                const int64_t whole = b % 2 == 0;
                int64_t r0 = b * block_rows + (whole ? 0 : spconv_test_rand_int(0, block_rows - 1));
                if (r0 >= num_rows) r0 = num_rows - 1;
                const int64_t r1_max = r0 + 2 * block_rows < num_rows ? r0 + 2 * block_rows : num_rows;
                const int64_t r1 = whole ? (r0 + block_rows < num_rows ? r0 + block_rows : num_rows)
                                         : spconv_test_rand_int(r0 + 1 < r1_max ? r0 + 1 : r1_max, r1_max);
                const int64_t segment = lists.mirrored ? segments - 1 - j : j;
                const int64_t first =
                    spconv__lower_bound(target, starts[segment], starts[segment + 1], r0);
                const int64_t end = spconv__lower_bound(target, first, starts[segment + 1], r1);
                int64_t got_first = -1, got_end = -1;
                spconv__pairs_range(&lists, j, r0, r1, &got_first, &got_end);
                assert_int_equal(got_first, first);
                assert_int_equal(got_end, end);
            }
        free(bounds);
        free(target);
    }
    /* (blocks + 1) * active overflows int64 here: no table, and no signed overflow on the way
     * (the sanitizer build stops at one) */
    int64_t few[4] = {0, 10, 20, 30};
    spconv__pair_lists edge = {3, NULL, few, NULL, NULL, 0, NULL, 1, 0};
    assert_int_equal(spconv__pair_bounds_entries(&edge, 1, INT64_MAX - 1), 0);
    assert_int_equal(spconv__pair_bounds_entries(&edge, 1, INT64_MAX / 2), 0);
    assert_int_equal(spconv__pair_bounds_entries(&edge, 1, 10), 33); /* 3 * 11 = 30 + 3 */
    assert_int_equal(spconv__pair_bounds_entries(&edge, 1, 11), 0);
}

/* Weights the fused path reads where they lie (conv_cpu.h, spconv__weight_view_of): spconv's
 * KRSC layout permuted to [K, C_in, C_out] (as the PyTorch binding passes it), a narrowed C_out,
 * and a narrowed kernel dim that does not flatten (copied). Forward, data and weight gradients
 * must be bitwise those of the contiguous weight, in f32 and f64. */
static void weight_views_case(int64_t c_in, int64_t c_out) {
    conv_case c = conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 1, 1),
                                 (int64_t[3]){9, 10, 11}, 2, 150, c_in, c_out);
    conv_case_setup(&c, NULL);
    const int64_t kv = c.kernel_volume, ci = c.c_in, co = c.c_out;
    double *krsc = malloc((size_t)(co * kv * ci) * sizeof(double));
    double *wide = malloc((size_t)(kv * ci * 2 * co) * sizeof(double));
    double *longer = malloc((size_t)(kv / 3 * 4 * ci * co) * sizeof(double));
    double *dy = malloc((size_t)(c.n_out * co) * sizeof(double));
    assert_true(krsc && wide && longer && dy);
    for (int64_t k = 0; k < kv; ++k)
        for (int64_t i = 0; i < ci; ++i)
            for (int64_t o = 0; o < co; ++o) {
                const double w = c.w[(k * ci + i) * co + o];
                krsc[(o * kv + k) * ci + i] = w;
                wide[(k * ci + i) * 2 * co + o] = w;
                wide[(k * ci + i) * 2 * co + co + o] = -7.0;
                /* [3, 3, 4, C_in, C_out]: the kernel's x axis one longer */
                const int64_t kz = k / 9, ky = k / 3 % 3, kx = k % 3;
                longer[((((kz * 3 + ky) * 4 + kx) * ci + i) * co) + o] = w;
                longer[((((kz * 3 + ky) * 4 + 3) * ci + i) * co) + o] = -7.0;
            }
    for (int64_t i = 0; i < c.n_out * co; ++i) dy[i] = spconv_test_rand_float(-1.0f, 1.0f);
    const spconv_dtype dtypes[2] = {SPCONV_F32, SPCONV_F64};
    for (int d = 0; d < 2; ++d) {
        const spconv_dtype dt = dtypes[d];
        spconv_tensor *x = conv_case_features(&c, dt), *g = conv_case_grad_out(&c, dt, dy);
        int64_t w5[5] = {3, 3, 3, ci, co};
        spconv_tensor *plain = conv_tensor(dt, 5, w5, c.w), *ref = NULL, *ref_gx = NULL,
                      *ref_gw = NULL;
        SPCONV_ASSERT_OK(spconv_conv_forward(NULL, c.rb, x, plain, NULL, &ref));
        SPCONV_ASSERT_OK(spconv_conv_backward(NULL, c.rb, x, plain, g, &ref_gx, &ref_gw, NULL));
        int64_t krsc_sizes[5] = {co, 3, 3, 3, ci}, wide_sizes[5] = {3, 3, 3, ci, 2 * co},
                longer_sizes[5] = {3, 3, 4, ci, co};
        spconv_tensor *krsc_t = conv_tensor(dt, 5, krsc_sizes, krsc);
        spconv_tensor *wide_t = conv_tensor(dt, 5, wide_sizes, wide);
        spconv_tensor *longer_t = conv_tensor(dt, 5, longer_sizes, longer);
        spconv_tensor *views[3] = {NULL, NULL, NULL};
        SPCONV_ASSERT_OK(spconv_tensor_permute(krsc_t, (int[5]){1, 2, 3, 4, 0}, &views[0]));
        SPCONV_ASSERT_OK(spconv_tensor_narrow(wide_t, 4, 0, co, &views[1]));
        SPCONV_ASSERT_OK(spconv_tensor_narrow(longer_t, 2, 0, 3, &views[2]));
        for (int v = 0; v < 3; ++v) {
            assert_false(spconv_tensor_is_contiguous(views[v]));
            spconv_tensor *out = NULL, *gx = NULL, *gw = NULL;
            SPCONV_ASSERT_OK(spconv_conv_forward(NULL, c.rb, x, views[v], NULL, &out));
            SPCONV_ASSERT_OK(spconv_conv_backward(NULL, c.rb, x, views[v], g, &gx, &gw, NULL));
            if (!conv_same_bits(out, ref) || !conv_same_bits(gx, ref_gx) ||
                !conv_same_bits(gw, ref_gw))
                fail_msg("weight view %d (%s): results differ from the contiguous weight's", v,
                         dt == SPCONV_F32 ? "f32" : "f64");
            spconv_tensor_release(out), spconv_tensor_release(gx), spconv_tensor_release(gw);
            spconv_tensor_release(views[v]);
        }
        spconv_tensor_release(krsc_t), spconv_tensor_release(wide_t);
        spconv_tensor_release(longer_t), spconv_tensor_release(plain);
        spconv_tensor_release(ref), spconv_tensor_release(ref_gx), spconv_tensor_release(ref_gw);
        spconv_tensor_release(x), spconv_tensor_release(g);
    }
    free(krsc), free(wide), free(longer), free(dy);
    conv_case_free(&c);
}

/* Channels below one 8 x 8 block of the transposed pack (7 -> 19), and channels with full
 * blocks and edges in both directions (19 -> 37): the KRSC view's forward and the contiguous
 * weight's backward both pack W[k]^T. */
static void test_weight_views(void **state) {
    (void)state;
    weight_views_case(7, 19);
    weight_views_case(19, 37);
    /* whole tiles of C_out: the forward reads W[k] where it lies, rows ci_stride apart (a
     * narrowed view's row is longer than C_out; a KRSC view's is not read in place) */
    weight_views_case(8, 16);
    weight_views_case(5, 32);
    weight_views_case(3, 64);
}

/* Layers of at most 4 input channels sum each out row over its offsets in registers
 * (spconv__fused_out_rows); wider ones add every offset's products into the out rows. Both must
 * give the same bits, which this checks at the conv level: zero channels appended to x (up to 5,
 * which takes the per-offset path) and zero rows to every W[k] add fma(0, w, c) = c to each
 * product, exactly (a product starts from +0, so c is never -0). Subm (the identity's rows are set
 * first), a stride-2 regular conv and its inverse (rows that no pair reaches keep the bias, NaN
 * payloads included), f32 and f64, 1 and 2 threads. */
static void test_few_channels_same_bits_as_per_offset(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[3] = {SPCONV_CONV_SUBM, SPCONV_CONV_REGULAR,
                                              SPCONV_CONV_INVERSE};
    static const int64_t c_outs[3] = {16, 19, 64};
    for (int trial = 0; trial < 18; ++trial) {
        const spconv_conv_kind kind = kinds[trial % 3];
        const int64_t c_in = 1 + trial % 4, c_out = c_outs[trial / 3 % 3], wide = 5;
        /* the inverse of a kernel-2 stride-3 conv leaves every third input row unreached */
        conv_case c = conv_case_make(kind == SPCONV_CONV_SUBM ? conv_params_iso(kind, 3, 1, 1, 1)
                                     : kind == SPCONV_CONV_REGULAR ? conv_params_iso(kind, 3, 2, 1, 1)
                                                                   : conv_params_iso(kind, 2, 3, 0, 1),
                                     (int64_t[3]){12, 13, 14}, 2, 400, c_in, c_out);
        conv_case_setup(&c, NULL);
        const int64_t kv = c.kernel_volume, n_in = c.n_in;
        double *x = calloc((size_t)(n_in * wide), sizeof(double));
        double *w = calloc((size_t)(kv * wide * c_out), sizeof(double));
        double *bias = malloc((size_t)c_out * sizeof(double));
        assert_true(x && w && bias);
        for (int64_t i = 0; i < n_in; ++i)
            for (int64_t j = 0; j < c_in; ++j) x[i * wide + j] = c.x[i * c_in + j];
        for (int64_t k = 0; k < kv; ++k)
            for (int64_t j = 0; j < c_in; ++j)
                for (int64_t o = 0; o < c_out; ++o)
                    w[(k * wide + j) * c_out + o] = c.w[(k * c_in + j) * c_out + o];
        memcpy(bias, c.bias, (size_t)c_out * sizeof(double));
        /* a NaN with its sign bit set, not the canonical NaN: canonical where a product is added,
         * kept as it is where none is */
        bias[0] = -(double)NAN;
        for (int d = 0; d < 2; ++d) {
            const spconv_dtype dt = d == 0 ? SPCONV_F32 : SPCONV_F64;
            int64_t xs[2] = {n_in, c_in}, ws[3] = {kv, c_in, c_out};
            int64_t xw[2] = {n_in, wide}, ww[3] = {kv, wide, c_out};
            spconv_tensor *xt = conv_tensor(dt, 2, xs, c.x), *wt = conv_tensor(dt, 3, ws, c.w);
            spconv_tensor *xwt = conv_tensor(dt, 2, xw, x), *wwt = conv_tensor(dt, 3, ww, w);
            spconv_tensor *bt = conv_tensor(dt, 1, &c_out, bias);
            for (int threads = 1; threads <= 2; ++threads) {
                spconv_context *ctx = conv_context(threads);
                spconv_tensor *narrow = NULL, *padded = NULL;
                SPCONV_ASSERT_OK(spconv_conv_forward(ctx, c.rb, xt, wt, bt, &narrow));
                SPCONV_ASSERT_OK(spconv_conv_forward(ctx, c.rb, xwt, wwt, bt, &padded));
                if (!conv_same_bits(narrow, padded)) {
                    char text[160];
                    fail_msg("%s, %s, %d threads: %lld input channels differ from the same "
                             "channels padded to %lld", conv_case_text(&c, text, sizeof text),
                             d == 0 ? "f32" : "f64", threads, (long long)c_in, (long long)wide);
                }
                spconv_tensor_release(narrow), spconv_tensor_release(padded);
                spconv_context_destroy(ctx);
            }
            spconv_tensor_release(xt), spconv_tensor_release(wt), spconv_tensor_release(xwt);
            spconv_tensor_release(wwt), spconv_tensor_release(bt);
        }
        free(x), free(w), free(bias);
        conv_case_free(&c);
    }
}

/* The fast path against the pair-loop reference on every kind, f32 and f64. */
static void test_forward_matches_reference(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int i = 0; i < 4; ++i) {
        conv_case c = conv_case_make(conv_params_iso(kinds[i], 3, i == 1 ? 1 : 2, 1, 1),
                                     (int64_t[3]){15, 14, 13}, 2, 600, 19, 23);
        conv_case_setup(&c, NULL);
        for (int d = 0; d < 2; ++d) {
            spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
            spconv_tensor *x = conv_case_features(&c, dtype), *w = conv_case_weight(&c, dtype);
            spconv_tensor *b = conv_tensor(dtype, 1, &c.c_out, c.bias), *fast = NULL, *ref = NULL;
            SPCONV_ASSERT_OK(spconv_conv_forward(NULL, c.rb, x, w, b, &fast));
            SPCONV_ASSERT_OK(spconv__conv_forward_ref(NULL, c.rb, x, w, b, &ref));
            double *got = conv_read(fast, NULL), *want = conv_read(ref, NULL);
            conv_case_expect_close(&c, "fast vs reference", got, want, c.n_out * c.c_out,
                                   conv_tolerance(dtype));
            free(got);
            free(want);
            spconv_tensor_release(fast);
            spconv_tensor_release(ref);
            spconv_tensor_release(x);
            spconv_tensor_release(w);
            spconv_tensor_release(b);
        }
        conv_case_free(&c);
    }
}

/* Forward and backward of @p c with 1 and with 2 threads give the same bits. */
static void check_threads_agree(conv_case *c) {
    spconv_context *one = conv_context(1), *two = conv_context(2);
    conv_case_setup(c, one);
    spconv_tensor *out1 = run_forward(one, c, SPCONV_F32, 1, NULL);
    spconv_tensor *out2 = run_forward(two, c, SPCONV_F32, 1, NULL);
    char text[512];
    if (!conv_same_bits(out1, out2))
        fail_msg("%s: forward differs between 1 and 2 threads",
                 conv_case_text(c, text, sizeof text));
    spconv_tensor *x = conv_case_features(c, SPCONV_F32), *w = conv_case_weight(c, SPCONV_F32);
    spconv_tensor *g[2][3];
    SPCONV_ASSERT_OK(
        spconv__conv_backward_ex(one, c->rb, x, w, out1, NULL, &g[0][0], &g[0][1], &g[0][2]));
    SPCONV_ASSERT_OK(
        spconv__conv_backward_ex(two, c->rb, x, w, out1, NULL, &g[1][0], &g[1][1], &g[1][2]));
    for (int j = 0; j < 3; ++j) {
        if (!conv_same_bits(g[0][j], g[1][j]))
            fail_msg("%s: gradient %d differs between 1 and 2 threads",
                     conv_case_text(c, text, sizeof text), j);
        spconv_tensor_release(g[0][j]);
        spconv_tensor_release(g[1][j]);
    }
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    spconv_tensor_release(out1);
    spconv_tensor_release(out2);
    conv_case_free(c);
    spconv_context_destroy(one);
    spconv_context_destroy(two);
}

/* Every kind at the main sizes (subm's centre offset takes the direct-GEMM path), then random
 * geometries. */
static void test_determinism_threads(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int i = 0; i < 4; ++i) {
        conv_case c = conv_case_make(conv_params_iso(kinds[i], 3, 2, 1, 1),
                                     (int64_t[3]){19, 18, 17}, 2, 1500, 32, 48);
        check_threads_agree(&c);
    }
    for (int i = 0; i < 12; ++i) {
        conv_case c = random_case(i % 2 == 0 ? SPCONV_CONV_REGULAR : SPCONV_CONV_TRANSPOSED);
        check_threads_agree(&c);
    }
    /* Many row blocks, so that both threads take some, in forward and in backward. */
    for (int i = 0; i < 8; ++i) {
        conv_case c = many_blocks_case(i % 4, i >= 4);
        check_threads_agree(&c);
    }
    /* Over 8192 input rows: the backward's joint mode (weight gradient inside the data
     * gradient's blocks, conv_backward.c), 64 blocks in 7 segments and a tail that the two
     * threads share. */
    for (int i = 0; i < 2; ++i) {
        conv_case c = conv_case_make(conv_params_iso(i == 0 ? SPCONV_CONV_SUBM : SPCONV_CONV_REGULAR,
                                                     3, 1, i, 1),
                                     (int64_t[3]){24, 24, 24}, 1, 10000, 64, 48);
        check_threads_agree(&c);
    }
}

/* The executors' three product paths agree: the default (the fused kernels where the machine has
 * them, see conv/fused.h), gather + BLAS + scatter (UNFUSED: BLAS when built in) and gather +
 * plain-C fallback + scatter, forward and backward, f32 and f64. */
static void test_gemm_paths_agree(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[3] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED};
    static const spconv__gemm_impl impls[2] = {SPCONV__GEMM_UNFUSED, SPCONV__GEMM_FALLBACK};
    printf("default: %s; unfused products: %s\n",
           spconv__fused_available() ? "fused kernels" : "unfused",
           spconv__gemm_has_blas() ? "BLAS" : "fallback");
    for (int i = 0; i < 3; ++i)
        for (int d = 0; d < 2; ++d)
            for (int m = 0; m < 2; ++m) {
                spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
                spconv__conv_options other = {impls[m], NULL, NULL};
                /* 37 output channels: two full tiles and a tail in f32, four and a tail in f64. */
                conv_case c = conv_case_make(conv_params_iso(kinds[i], 3, 2, 1, 2),
                                             (int64_t[3]){19, 18, 17}, 1, 1500, 29, 37);
                conv_case_setup(&c, NULL);
                spconv_tensor *a = run_forward(NULL, &c, dtype, 1, NULL);
                spconv_tensor *b = run_forward(NULL, &c, dtype, 1, &other);
                double *va = conv_read(a, NULL), *vb = conv_read(b, NULL);
                conv_case_expect_close(&c, "default vs unfused forward", vb, va,
                                       c.n_out * c.c_out, conv_tolerance(dtype));
                spconv_tensor *x = conv_case_features(&c, dtype), *w = conv_case_weight(&c, dtype);
                spconv_tensor *ga[3], *gb[3];
                SPCONV_ASSERT_OK(
                    spconv__conv_backward_ex(NULL, c.rb, x, w, a, NULL, &ga[0], &ga[1], &ga[2]));
                SPCONV_ASSERT_OK(spconv__conv_backward_ex(NULL, c.rb, x, w, a, &other, &gb[0],
                                                          &gb[1], &gb[2]));
                conv_case_expect_close_tensors(&c, "default vs unfused backward", gb, ga, 3,
                                               conv_tolerance(dtype));
                free(va);
                free(vb);
                spconv_tensor_release(x);
                spconv_tensor_release(w);
                spconv_tensor_release(a);
                spconv_tensor_release(b);
                conv_case_free(&c);
            }
}

/* Operands for the error tests: a subm rulebook over 10 sites, features [10, 4], weight
 * [27, 4, 3], bias [3]. */
typedef struct bad_inputs {
    spconv_rulebook *rb;
    spconv_tensor *x, *w, *b;
} bad_inputs;

static bad_inputs make_bad_inputs(spconv_dtype dtype) {
    int64_t shape[3] = {6, 6, 6};
    int32_t *sites = oracle_random_sites(1, shape, 10);
    spconv_conv_params p = conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    bad_inputs in;
    in.rb = conv_build(NULL, sites, 10, shape, 1, &p);
    free(sites);
    int64_t xs[2] = {10, 4}, ws[3] = {27, 4, 3}, bs = 3;
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), dtype, 2, xs, 0.5, &in.x));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), dtype, 3, ws, 0.25, &in.w));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), dtype, 1, &bs, 1.0, &in.b));
    return in;
}

static void free_bad_inputs(bad_inputs *in) {
    spconv_rulebook_release(in->rb);
    spconv_tensor_release(in->x);
    spconv_tensor_release(in->w);
    spconv_tensor_release(in->b);
}

static spconv_tensor *full(spconv_dtype dtype, int ndim, const int64_t *sizes) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), dtype, ndim, sizes, 1.0, &t));
    return t;
}

static void test_forward_errors(void **state) {
    (void)state;
    bad_inputs in = make_bad_inputs(SPCONV_F32);
    spconv_tensor *out = (spconv_tensor *)&in; /* must be reset to NULL on failure */
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, in.w, in.b, NULL),
                        SPCONV_ERR_NULL_POINTER, "'out'");
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, NULL, in.x, in.w, in.b, &out),
                        SPCONV_ERR_NULL_POINTER, "spconv_conv_forward: 'rb' is NULL");
    assert_null(out);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, NULL, in.w, in.b, &out),
                        SPCONV_ERR_NULL_POINTER, "'features'");
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, NULL, in.b, &out),
                        SPCONV_ERR_NULL_POINTER, "'weight'");

    int64_t rows9[2] = {9, 4}, ch5[2] = {10, 5}, x3[3] = {10, 4, 1};
    spconv_tensor *t = full(SPCONV_F32, 2, rows9);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, t, in.w, in.b, &out),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "features have 9 rows but the rulebook has 10 input sites");
    spconv_tensor_release(t);
    t = full(SPCONV_F32, 2, ch5);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, t, in.w, in.b, &out),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "features have C_in = 5 channels but weight [27, 4, 3] expects C_in = 4");
    spconv_tensor_release(t);
    t = full(SPCONV_F32, 3, x3);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, t, in.w, in.b, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "features must be 2-d [num_in, C_in], got 3-d");
    spconv_tensor_release(t);

    int64_t kv8[3] = {8, 4, 3}, w4[4] = {27, 4, 3, 1}, w5[5] = {3, 3, 2, 4, 3}, b4 = 4;
    t = full(SPCONV_F32, 3, kv8);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, t, in.b, &out),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "weight [8, 4, 3] has KV = 8 kernel offsets but the rulebook has 27");
    spconv_tensor_release(t);
    t = full(SPCONV_F32, 4, w4);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, t, in.b, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "got 4-d [27, 4, 3, 1]");
    spconv_tensor_release(t);
    t = full(SPCONV_F32, 5, w5);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, t, in.b, &out),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "has kernel (3, 3, 2) but the rulebook has (3, 3, 3)");
    spconv_tensor_release(t);
    t = full(SPCONV_F32, 1, &b4);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, in.w, t, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "bias must be [C_out] = [3], got [4]");
    spconv_tensor_release(t);

    int64_t bias_sizes = 3;
    t = full(SPCONV_F64, 1, &bias_sizes);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, in.w, t, &out),
                        SPCONV_ERR_DTYPE_MISMATCH, "features is f32 but bias is f64");
    spconv_tensor_release(t);
    int64_t ws[3] = {27, 4, 3};
    t = full(SPCONV_F64, 3, ws);
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, t, in.b, &out),
                        SPCONV_ERR_DTYPE_MISMATCH, "features is f32 but weight is f64");
    spconv_tensor_release(t);
    assert_null(out);
    free_bad_inputs(&in);
}

/* Valid requests this build cannot serve: integer features for the executors, and f16 / bf16 for
 * the references (which compute in f32 or f64 only; the executors widen 16-bit operands). */
static void test_forward_unsupported_dtypes(void **state) {
    (void)state;
    static const spconv_dtype dtypes[3] = {SPCONV_F16, SPCONV_BF16, SPCONV_I32};
    static const char *const names[3] = {"not f16", "not bf16", "not i32"};
    for (int i = 0; i < 3; ++i) {
        bad_inputs in = make_bad_inputs(dtypes[i]);
        spconv_tensor *out = NULL;
        if (dtypes[i] == SPCONV_I32)
            SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, in.x, in.w, in.b, &out),
                                SPCONV_ERR_NOT_SUPPORTED, names[i]);
        SPCONV_ASSERT_FAILS(spconv__conv_forward_ref(NULL, in.rb, in.x, in.w, in.b, &out),
                            SPCONV_ERR_NOT_SUPPORTED, names[i]);
        assert_null(out);
        free_bad_inputs(&in);
    }
}

/* The whole file @p name of the data folder; skips the test (after saying why) when absent. */
static void *read_data_file(const char *name, size_t *bytes) {
    char *path = spconv_test_data_path(name);
    if (path == NULL) skip();
    FILE *f = fopen(path, "rb");
    free(path);
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc((size_t)size + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *bytes = (size_t)size;
    return data;
}

/* spconv's benchmark scan (125,562 sites in [80, 1600, 1600]): subm and stride-2 convs, forward
 * and backward, against the pair-loop reference. Dozens of row blocks, the subm centre's direct
 * product, mirrored offsets and sorted pairs all meet real neighbourhoods here. Narrow channels
 * keep the reference quick. */
static void test_real_data_matches_reference(void **state) {
    (void)state;
    size_t bytes = 0;
    int32_t *rows = read_data_file("spconv_test_indices.i32", &bytes);
    const int64_t n = (int64_t)(bytes / (4 * sizeof(int32_t))), shape[3] = {80, 1600, 1600};
    spconv_conv_params params[2] = {conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                    conv_params_iso(SPCONV_CONV_REGULAR, 3, 2, 1, 1)};
    for (int i = 0; i < 2; ++i) {
        spconv_rulebook *rb = conv_build(NULL, rows, n, shape, 1, &params[i]);
        const int64_t c_in = 8, c_out = 12, kv = 27, n_out = spconv_rulebook_num_out(rb);
        int64_t x_sizes[2] = {n, c_in}, w_sizes[3] = {kv, c_in, c_out}, g_sizes[2] = {n_out, c_out};
        double *xv = conv_random_values(n * c_in, -1.0, 1.0);
        double *wv = conv_random_values(kv * c_in * c_out, -1.0, 1.0);
        double *gv = conv_random_values(n_out * c_out, -1.0, 1.0);
        spconv_tensor *x = conv_tensor(SPCONV_F32, 2, x_sizes, xv);
        spconv_tensor *w = conv_tensor(SPCONV_F32, 3, w_sizes, wv);
        spconv_tensor *g = conv_tensor(SPCONV_F32, 2, g_sizes, gv);
        spconv_tensor *fast[4], *ref[4];
        SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, x, w, NULL, &fast[0]));
        SPCONV_ASSERT_OK(spconv__conv_forward_ref(NULL, rb, x, w, NULL, &ref[0]));
        SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, x, w, g, &fast[1], &fast[2], &fast[3]));
        SPCONV_ASSERT_OK(spconv__conv_backward_ref(NULL, rb, x, w, g, &ref[1], &ref[2], &ref[3]));
        for (int j = 0; j < 4; ++j) {
            int64_t count;
            double *a = conv_read(fast[j], &count), *b = conv_read(ref[j], NULL);
            double err = oracle_rel_error(a, b, count);
            if (!(err <= CONV_TOL_F32))
                fail_msg("real data, %s conv, output %d: normalised error %.3g",
                         i == 0 ? "subm" : "stride-2", j, err);
            free(a);
            free(b);
            spconv_tensor_release(fast[j]);
            spconv_tensor_release(ref[j]);
        }
        free(xv);
        free(wv);
        free(gv);
        spconv_tensor_release(x);
        spconv_tensor_release(w);
        spconv_tensor_release(g);
        spconv_rulebook_release(rb);
    }
    free(rows);
}

/* CUDA operands go to the CUDA backend: a clean NOT_SUPPORTED while it has no conv kernels, and
 * once it has, the same result as the CPU. Without a device no CUDA tensor can exist, and the
 * test is skipped. */
static void test_forward_cuda_dispatch(void **state) {
    (void)state;
    bad_inputs in = make_bad_inputs(SPCONV_F32);
    spconv_tensor *x = NULL, *w = NULL, *out = NULL;
    if (spconv_tensor_to_device(NULL, in.x, spconv_cuda(0), &x) != SPCONV_OK) {
        print_message("skip: no CUDA device (%s)\n", spconv_last_error());
        free_bad_inputs(&in);
        skip();
    }
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, in.rb, x, in.w, in.b, &out),
                        SPCONV_ERR_DEVICE_MISMATCH, "features is on cuda:0 but weight is on cpu");
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, in.w, spconv_cuda(0), &w));
    spconv_status st = spconv_conv_forward(NULL, in.rb, x, w, NULL, &out);
    if (st != SPCONV_OK) {
        SPCONV_ASSERT_FAILS(st, SPCONV_ERR_NOT_SUPPORTED, "spconv_conv_forward: the ");
    } else { /* a success is checked against the CPU, not taken on trust */
        spconv_tensor *want = NULL;
        SPCONV_ASSERT_OK(spconv_conv_forward(NULL, in.rb, in.x, in.w, NULL, &want));
        int64_t count, want_count;
        double *got_values = conv_read(out, &count), *want_values = conv_read(want, &want_count);
        assert_int_equal(count, want_count);
        double err = oracle_rel_error(got_values, want_values, count);
        if (!(err <= CONV_TOL_F32)) fail_msg("CUDA conv forward: normalised error %.3g", err);
        free(got_values);
        free(want_values);
        spconv_tensor_release(want);
    }
    spconv_tensor_release(out);
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    free_bad_inputs(&in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_grid_batch1),
        cmocka_unit_test(test_forward_grid_batch2),
        cmocka_unit_test(test_forward_anisotropic),
        cmocka_unit_test(test_forward_transposed),
        cmocka_unit_test(test_forward_subm),
        cmocka_unit_test(test_forward_inverse),
        cmocka_unit_test(test_forward_small_sizes),
        cmocka_unit_test(test_forward_many_blocks),
        cmocka_unit_test(test_forward_layouts),
        cmocka_unit_test(test_weight_views),
        cmocka_unit_test(test_few_channels_same_bits_as_per_offset),
        cmocka_unit_test(test_pair_bounds),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_determinism_threads),
        cmocka_unit_test(test_gemm_paths_agree),
        cmocka_unit_test(test_real_data_matches_reference),
        cmocka_unit_test(test_forward_errors),
        cmocka_unit_test(test_forward_unsupported_dtypes),
        cmocka_unit_test(test_forward_cuda_dispatch),
    };
    spconv_test_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
