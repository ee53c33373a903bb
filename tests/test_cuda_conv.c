/* The CUDA backend's conv and max-pool executors against the CPU backend, on fresh random
 * geometries of spconv's test grid (kernel 2/3, stride 1/2/3, padding 0/1/2, dilation 1/2,
 * batch 1-2, channel counts 1, 3, 17, 64; regular, subm, transposed and inverse), forward and
 * backward, f32 and f64, plus bitwise repeatability on the device. Runs on a GPU, or on the CPU
 * in the host-emulation build (tools/test.sh --emulate-cuda); skipped with a message elsewhere.
 *
 * Tolerance, from the arithmetic rather than from a run: both backends compute each output as a
 * sum of n = KV * C products (plus the bias) in the working precision, in different orders, so
 * each is within gamma_n * S of the exact value, where S is the same sum over absolute values and
 * gamma_n = n u / (1 - n u) (u = 2^-24 for f32, 2^-53 for f64). Their difference is therefore at
 * most 2 gamma_n S, element by element; S is computed in f64 by the CPU backend on |operands|. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rulebook_testing.h"
#include "common/test_util.h"
#include "spconv/spconv.h"

static const int64_t SHAPE[3] = {13, 12, 11};
static const int64_t CHANNELS[4] = {1, 3, 17, 64};

static int have_device(void) {
    spconv_tensor *t = NULL;
    const int64_t one = 1;
    if (spconv_tensor_empty(spconv_cuda(0), SPCONV_F32, 1, &one, &t) != SPCONV_OK) return 0;
    spconv_tensor_release(t);
    return 1;
}

static spconv_tensor *random_tensor(spconv_dtype dtype, int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    double *values = malloc((size_t)(n > 0 ? n : 1) * sizeof *values);
    assert_non_null(values);
    for (int64_t i = 0; i < n; ++i) values[i] = spconv_test_rand_double(-1, 1);
    spconv_tensor *d = NULL, *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F64, ndim, sizes, values, &d));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, d, dtype, &t));
    spconv_tensor_release(d);
    free(values);
    return t;
}

/* A host f64 copy of any tensor's elements. */
static double *read_values(const spconv_tensor *t, int64_t *count) {
    spconv_tensor *host = NULL, *d = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, t, spconv_cpu(), &host));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, host, SPCONV_F64, &d));
    *count = spconv_tensor_numel(d);
    double *values = malloc((size_t)(*count > 0 ? *count : 1) * sizeof *values);
    assert_non_null(values);
    if (*count > 0) memcpy(values, spconv_tensor_data(d), (size_t)*count * sizeof *values);
    spconv_tensor_release(d);
    spconv_tensor_release(host);
    return values;
}

/* |t| as f64 on the CPU. */
static spconv_tensor *abs_f64(const spconv_tensor *t) {
    int64_t n;
    double *v = read_values(t, &n);
    for (int64_t i = 0; i < n; ++i) v[i] = fabs(v[i]);
    spconv_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F64, spconv_tensor_ndim(t),
                                             spconv_tensor_sizes(t), v, &out));
    free(v);
    return out;
}

static spconv_tensor *on_cuda(const spconv_tensor *t) {
    spconv_tensor *d = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, t, spconv_cuda(0), &d));
    return d;
}

static double gamma_n(spconv_dtype dtype, int64_t n) {
    const double u = dtype == SPCONV_F32 ? ldexp(1.0, -24) : ldexp(1.0, -53);
    return (double)n * u / (1.0 - (double)n * u);
}

/* |got - want| <= 2 gamma_n bound + tiny, element by element. */
static void assert_within(const char *what, const spconv_tensor *got, const spconv_tensor *want,
                          const spconv_tensor *bound, spconv_dtype dtype, int64_t n) {
    int64_t ng, nw, nb;
    double *g = read_values(got, &ng), *w = read_values(want, &nw), *b = read_values(bound, &nb);
    assert_int_equal(ng, nw);
    assert_int_equal(ng, nb);
    assert_true(spconv_device_equal(spconv_tensor_device(got), spconv_cuda(0)));
    const double factor = 2.0 * gamma_n(dtype, n + 1);
    for (int64_t i = 0; i < ng; ++i) {
        /* The smallest normal number covers results that underflow in f32. */
        const double allowed = factor * b[i] + (dtype == SPCONV_F32 ? 1.2e-38 : 2.3e-308);
        if (!(fabs(g[i] - w[i]) <= allowed))
            fail_msg("%s: element %lld: cuda %.17g, cpu %.17g, allowed difference %.3g", what,
                     (long long)i, g[i], w[i], allowed);
    }
    free(g);
    free(w);
    free(b);
}

static void assert_same_bytes(const char *what, const spconv_tensor *a, const spconv_tensor *b) {
    const size_t bytes =
        (size_t)spconv_tensor_numel(a) * spconv_dtype_size(spconv_tensor_dtype(a));
    assert_int_equal(spconv_tensor_numel(a), spconv_tensor_numel(b));
    void *x = malloc(bytes + 1), *y = malloc(bytes + 1);
    assert_non_null(x);
    assert_non_null(y);
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, a, x, bytes));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, b, y, bytes));
    if (bytes > 0 && memcmp(x, y, bytes) != 0) fail_msg("%s: two runs differ", what);
    free(x);
    free(y);
}

typedef struct geometry {
    spconv_conv_params params;
    spconv_rulebook *rb; /* the rulebook the layer runs on (inverse: of the paired conv) */
    const char *name;
} geometry;

/* A random layer on random sites: returns its rulebook. */
static geometry random_geometry(int kind_index) {
    static const char *names[4] = {"regular", "subm", "transposed", "inverse"};
    const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                       SPCONV_CONV_TRANSPOSED, SPCONV_CONV_REGULAR};
    geometry g = {spconv_conv_params_default(kinds[kind_index]), NULL, names[kind_index]};
    for (int axis = 0; axis < 3; ++axis) {
        g.params.kernel[axis] = kinds[kind_index] == SPCONV_CONV_SUBM ? 3 : spconv_test_rand_int(2, 3);
        g.params.stride[axis] = spconv_test_rand_int(1, 3);
        g.params.padding[axis] = spconv_test_rand_int(0, 2);
        g.params.dilation[axis] = spconv_test_rand_int(1, 2);
        if (kinds[kind_index] == SPCONV_CONV_TRANSPOSED) g.params.padding[axis] = 0;
    }
    const int64_t batch = spconv_test_rand_int(1, 2);
    const int64_t per_batch = spconv_test_rand_int(1, 300);
    int32_t *rows = spconv_test_random_sites(batch, SHAPE, per_batch);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, batch * per_batch);
    free(rows);
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, SHAPE, batch, &g.params, &rb));
    spconv_tensor_release(indices);
    if (kind_index == 3) {
        SPCONV_ASSERT_OK(spconv_rulebook_inverse(rb, &g.rb));
        spconv_rulebook_release(rb);
    } else {
        g.rb = rb;
    }
    return g;
}

static void check_conv_case(const geometry *g, spconv_dtype dtype, int64_t c_in, int64_t c_out) {
    const spconv_rulebook *rb = g->rb;
    const int64_t kv = spconv_rulebook_kernel_volume(rb);
    const int64_t n_in = spconv_rulebook_num_in(rb), n_out = spconv_rulebook_num_out(rb);
    spconv_tensor *x = random_tensor(dtype, 2, (const int64_t[]){n_in, c_in});
    spconv_tensor *w = random_tensor(dtype, 3, (const int64_t[]){kv, c_in, c_out});
    spconv_tensor *b = random_tensor(dtype, 1, &c_out);
    spconv_tensor *gy = random_tensor(dtype, 2, (const int64_t[]){n_out, c_out});
    spconv_tensor *xd = on_cuda(x), *wd = on_cuda(w), *bd = on_cuda(b), *gd = on_cuda(gy);

    /* forward, twice on the device */
    spconv_tensor *want = NULL, *got = NULL, *again = NULL, *bound = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, x, w, b, &want));
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, xd, wd, bd, &got));
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, xd, wd, bd, &again));
    spconv_tensor *ax = abs_f64(x), *aw = abs_f64(w), *ab = abs_f64(b), *ag = abs_f64(gy);
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, ax, aw, ab, &bound));
    assert_within("forward", got, want, bound, dtype, kv * c_in);
    assert_same_bytes("forward", got, again);

    /* backward: every gradient, then each alone */
    spconv_tensor *dx = NULL, *dw = NULL, *db = NULL, *cdx = NULL, *cdw = NULL, *cdb = NULL;
    spconv_tensor *bdx = NULL, *bdw = NULL, *bdb = NULL, *rdx = NULL, *rdw = NULL;
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, x, w, gy, &dx, &dw, &db));
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, xd, wd, gd, &cdx, &cdw, &cdb));
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, ax, aw, ag, &bdx, &bdw, &bdb));
    assert_within("grad features", cdx, dx, bdx, dtype, kv * c_out);
    assert_within("grad weight", cdw, dw, bdw, dtype, spconv_rulebook_num_pairs(rb));
    assert_within("grad bias", cdb, db, bdb, dtype, n_out);
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, xd, wd, gd, &rdx, NULL, NULL));
    assert_same_bytes("grad features alone", rdx, cdx);
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, xd, wd, gd, NULL, &rdw, NULL));
    assert_same_bytes("grad weight alone", rdw, cdw);

    spconv_tensor *all[] = {x, w, b, gy, xd, wd, bd, gd, want, got, again, bound, ax, aw, ab, ag,
                            dx, dw, db, cdx, cdw, cdb, bdx, bdw, bdb, rdx, rdw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
}

static void test_conv_matches_cpu(void **state) {
    (void)state;
    if (!have_device()) {
        print_message("skip: no CUDA device (%s)\n", spconv_last_error());
        skip();
    }
    for (int trial = 0; trial < 16; ++trial) {
        geometry g = random_geometry(trial % 4);
        const spconv_dtype dtype = trial % 2 == 0 ? SPCONV_F32 : SPCONV_F64;
        const int64_t c_in = CHANNELS[spconv_test_rand_int(0, 3)];
        const int64_t c_out = CHANNELS[spconv_test_rand_int(0, 3)];
        print_message("%s %s kernel %lld stride %lld padding %lld dilation %lld, %lld -> %lld "
                      "channels, %lld pairs\n",
                      g.name, spconv_dtype_name(dtype), (long long)g.params.kernel[0],
                      (long long)g.params.stride[0], (long long)g.params.padding[0],
                      (long long)g.params.dilation[0], (long long)c_in, (long long)c_out,
                      (long long)spconv_rulebook_num_pairs(g.rb));
        check_conv_case(&g, dtype, c_in, c_out);
        spconv_rulebook_release(g.rb);
    }
}

/* Max pooling: outputs and argmax bitwise (a maximum is exact), gradients within the bound of
 * their sums (several outputs may pick one input). NaN inputs follow the CPU's rule. */
static void test_maxpool_matches_cpu(void **state) {
    (void)state;
    if (!have_device()) {
        print_message("skip: no CUDA device (%s)\n", spconv_last_error());
        skip();
    }
    for (int trial = 0; trial < 8; ++trial) {
        geometry g = random_geometry(0);
        const spconv_dtype dtype = trial % 2 == 0 ? SPCONV_F32 : SPCONV_F64;
        const int64_t c = CHANNELS[spconv_test_rand_int(0, 3)];
        const int64_t n_in = spconv_rulebook_num_in(g.rb), n_out = spconv_rulebook_num_out(g.rb);
        spconv_tensor *x = random_tensor(dtype, 2, (const int64_t[]){n_in, c});
        if (trial == 1 && n_in * c > 0) SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, x, NAN));
        spconv_tensor *gy = random_tensor(dtype, 2, (const int64_t[]){n_out, c});
        spconv_tensor *xd = on_cuda(x), *gd = on_cuda(gy);
        spconv_tensor *y = NULL, *arg = NULL, *cy = NULL, *carg = NULL;
        SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, g.rb, x, &y, &arg));
        SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, g.rb, xd, &cy, &carg));
        assert_same_bytes("pool argmax", carg, arg);
        assert_same_bytes("pool output", cy, y);
        spconv_tensor *dx = NULL, *cdx = NULL, *bdx = NULL, *ag = abs_f64(gy);
        SPCONV_ASSERT_OK(spconv_maxpool_backward(NULL, g.rb, arg, gy, &dx));
        SPCONV_ASSERT_OK(spconv_maxpool_backward(NULL, g.rb, carg, gd, &cdx));
        SPCONV_ASSERT_OK(spconv_maxpool_backward(NULL, g.rb, arg, ag, &bdx));
        assert_within("pool grad", cdx, dx, bdx, dtype, spconv_rulebook_kernel_volume(g.rb));
        spconv_tensor *all[] = {x, gy, xd, gd, y, arg, cy, carg, dx, cdx, bdx, ag};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
        spconv_rulebook_release(g.rb);
    }
}

/* f16 / bf16 are not there yet on the device: a clear NOT_SUPPORTED, not a crash. */
static void test_unsupported_dtype(void **state) {
    (void)state;
    if (!have_device()) {
        print_message("skip: no CUDA device (%s)\n", spconv_last_error());
        skip();
    }
    geometry g = random_geometry(1);
    const int64_t n = spconv_rulebook_num_in(g.rb), kv = spconv_rulebook_kernel_volume(g.rb);
    spconv_tensor *x = random_tensor(SPCONV_F16, 2, (const int64_t[]){n, 3});
    spconv_tensor *w = random_tensor(SPCONV_F16, 3, (const int64_t[]){kv, 3, 2});
    spconv_tensor *xd = on_cuda(x), *wd = on_cuda(w), *out = NULL;
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, g.rb, xd, wd, NULL, &out),
                        SPCONV_ERR_NOT_SUPPORTED, "f16");
    assert_null(out);
    spconv_tensor *all[] = {x, w, xd, wd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    spconv_rulebook_release(g.rb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_matches_cpu),
        cmocka_unit_test(test_maxpool_matches_cpu),
        cmocka_unit_test(test_unsupported_dtype),
    };
    spconv_test_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
