/* The CUDA backend's conv and max-pool executors against the CPU backend, on fresh random
 * geometries of spconv's test grid (kernel 2/3, stride 1/2/3, padding 0/1/2, dilation 1/2,
 * batch 1-2, channel counts 1, 3, 17, 64; regular, subm, transposed and inverse), forward and
 * backward, f32, f64, f16 and bf16, plus bitwise repeatability on the device. Runs on a GPU, or on
 * the CPU in the host-emulation build (tools/test.sh --emulate-cuda); skipped with a message
 * elsewhere.
 *
 * Tolerance, from the arithmetic rather than from a run: both backends compute each output as a
 * sum of n = KV * C products (plus the bias) in the accumulation precision, in different orders,
 * so each is within gamma_n * S of the exact value, where S is the same sum over absolute values
 * and gamma_n = n u / (1 - n u) (u = 2^-24 for f32, 2^-53 for f64). Their difference is therefore
 * at most 2 gamma_n S, element by element; S is computed in f64 by the CPU backend on |operands|.
 * f16 and bf16 accumulate in f32 (conv/half.h) and then round each result once, which moves it by
 * at most u_h times its f32 value (u_h = 2^-11 for f16, 2^-8 for bf16) or half a subnormal
 * spacing: so add u_h / (1 - u_h) (|cuda| + |cpu|) and that spacing twice.
 *
 * The CUDA backend runs f16 and bf16 convs on their 16-bit operands (gathered as they are, products
 * on 16-bit values summed in f32, conv.cu), which conv/half.h's contract says must give the numbers
 * of the f32 conv on the widened operands, rounded once: in the host emulation, whose products are
 * one f32 loop, bit for bit; on a GPU, whose tensor cores sum in another order, within the bound
 * above, except that tensor cores are reported to truncate rather than round their f32 sums: a
 * truncated sum errs by up to 2u, not u, so the device's side of the 16-bit bound takes
 * gamma_n with u = 2^-23 (the CPU's keeps 2^-24): (gamma_n(2^-24) + gamma_n(2^-23)) S. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rulebook_testing.h"
#include "common/test_util.h"
#include "spconv/config.h"
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

/* Skips the calling test, saying why, where no CUDA device (nor the emulation) is there. */
#define SKIP_WITHOUT_DEVICE()                                                                \
    do {                                                                                     \
        if (!have_device()) {                                                                \
            print_message("skip: no CUDA device (%s)\n", spconv_last_error());               \
            skip();                                                                          \
        }                                                                                    \
    } while (0)

/* Set (or with NULL unset) the CUDA conv's workspace budget, SPCONV_CUDA_CONV_WORKSPACE_KIB. */
static void set_budget_kib(const char *kib) {
    if (kib != NULL)
        assert_int_equal(setenv("SPCONV_CUDA_CONV_WORKSPACE_KIB", kib, 1), 0);
    else
        assert_int_equal(unsetenv("SPCONV_CUDA_CONV_WORKSPACE_KIB"), 0);
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

static const spconv_dtype DTYPES[4] = {SPCONV_F32, SPCONV_F64, SPCONV_F16, SPCONV_BF16};

static int is_half(spconv_dtype dtype) {
    return dtype == SPCONV_F16 || dtype == SPCONV_BF16;
}

/* Unit roundoff of the accumulation (f32 for the 16-bit dtypes). */
static double gamma_n(spconv_dtype dtype, int64_t n) {
    const double u = dtype == SPCONV_F64 ? ldexp(1.0, -53) : ldexp(1.0, -24);
    return (double)n * u / (1.0 - (double)n * u);
}

/* gamma_n of f32 sums that truncate (the error of a step up to 2^-23 of it): the tensor cores'
 * side of the 16-bit bound (see the top of the file). */
static double gamma_n_truncated(int64_t n) {
    const double u = ldexp(1.0, -23);
    return (double)n * u / (1.0 - (double)n * u);
}

/* |got - want| <= 2 gamma_n bound + tiny, element by element (16-bit: the device's gamma_n for
 * truncated sums, gamma_n_truncated). */
static void assert_within(const char *what, const spconv_tensor *got, const spconv_tensor *want,
                          const spconv_tensor *bound, spconv_dtype dtype, int64_t n) {
    int64_t ng, nw, nb;
    double *g = read_values(got, &ng), *w = read_values(want, &nw), *b = read_values(bound, &nb);
    assert_int_equal(ng, nw);
    assert_int_equal(ng, nb);
    assert_true(spconv_device_equal(spconv_tensor_device(got), spconv_cuda(0)));
    const double factor = is_half(dtype) ? gamma_n(dtype, n + 1) + gamma_n_truncated(n + 1)
                                         : 2.0 * gamma_n(dtype, n + 1);
    const double u_h = dtype == SPCONV_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    const double spacing = dtype == SPCONV_F16 ? ldexp(1.0, -24) : 0.0;
    for (int64_t i = 0; i < ng; ++i) {
        /* The smallest normal number covers results that underflow in f32. */
        double allowed = factor * b[i] + (dtype == SPCONV_F64 ? 2.3e-308 : 1.2e-38);
        if (is_half(dtype)) allowed += u_h / (1.0 - u_h) * (fabs(g[i]) + fabs(w[i])) + spacing;
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
    if (bytes > 0 && memcmp(x, y, bytes) != 0) fail_msg("%s: the bytes differ", what);
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

/* @p t as @p dtype (a new tensor on its device). */
static spconv_tensor *as_dtype(const spconv_tensor *t, spconv_dtype dtype) {
    spconv_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, t, dtype, &out));
    return out;
}

/* @p got (16-bit, from the device) against @p wide, the device's f32 result on the widened
 * operands, rounded to @p got's dtype: the same bytes in the emulation, the bound of
 * assert_within on a GPU. */
static void assert_widened(const char *what, const spconv_tensor *got, const spconv_tensor *wide,
                           const spconv_tensor *bound, spconv_dtype dtype, int64_t n) {
    spconv_tensor *rounded = as_dtype(wide, dtype);
    if (SPCONV_CUDA_EMULATION)
        assert_same_bytes(what, got, rounded);
    else
        assert_within(what, got, rounded, bound, dtype, n);
    spconv_tensor_release(rounded);
}

/* f16 / bf16 on the device against the device's f32 conv of the widened operands. */
static void check_half_against_widened(const spconv_rulebook *rb, spconv_dtype dtype,
                                       spconv_tensor *xd, spconv_tensor *wd, spconv_tensor *bd,
                                       spconv_tensor *gd, const spconv_tensor *got,
                                       const spconv_tensor *cdx, const spconv_tensor *cdw,
                                       const spconv_tensor *cdb, const spconv_tensor *bound,
                                       const spconv_tensor *bdx, const spconv_tensor *bdw,
                                       const spconv_tensor *bdb, int64_t c_in, int64_t c_out) {
    const int64_t kv = spconv_rulebook_kernel_volume(rb);
    spconv_tensor *x32 = as_dtype(xd, SPCONV_F32), *w32 = as_dtype(wd, SPCONV_F32);
    spconv_tensor *b32 = as_dtype(bd, SPCONV_F32), *g32 = as_dtype(gd, SPCONV_F32);
    spconv_tensor *y32 = NULL, *dx32 = NULL, *dw32 = NULL, *db32 = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, x32, w32, b32, &y32));
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, x32, w32, g32, &dx32, &dw32, &db32));
    assert_widened("16-bit forward against widened f32", got, y32, bound, dtype, kv * c_in);
    assert_widened("16-bit grad features against widened f32", cdx, dx32, bdx, dtype,
                   kv * c_out);
    assert_widened("16-bit grad weight against widened f32", cdw, dw32, bdw, dtype,
                   spconv_rulebook_num_pairs(rb));
    assert_widened("16-bit grad bias against widened f32", cdb, db32, bdb, dtype,
                   spconv_rulebook_num_out(rb));
    spconv_tensor *all[] = {x32, w32, b32, g32, y32, dx32, dw32, db32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
}

/* A conv case: random operands on the host and their copies on the device, their magnitudes in
 * f64, and the CPU's forward and backward on both (the magnitudes' results are the sums S of the
 * tolerance above). */
typedef struct conv_case {
    spconv_tensor *x, *w, *b, *gy;       /* host operands */
    spconv_tensor *xd, *wd, *bd, *gd;    /* the same on the device */
    spconv_tensor *ax, *aw, *ab, *ag;    /* |operands| in f64 */
    spconv_tensor *y, *dx, *dw, *db;     /* the CPU on the operands */
    spconv_tensor *by, *bdx, *bdw, *bdb; /* the CPU on the magnitudes */
} conv_case;

static conv_case make_conv_case(const spconv_rulebook *rb, spconv_dtype dtype, int64_t c_in,
                                int64_t c_out) {
    const int64_t kv = spconv_rulebook_kernel_volume(rb);
    const int64_t n_in = spconv_rulebook_num_in(rb), n_out = spconv_rulebook_num_out(rb);
    conv_case c = {0};
    c.x = random_tensor(dtype, 2, (const int64_t[]){n_in, c_in});
    c.w = random_tensor(dtype, 3, (const int64_t[]){kv, c_in, c_out});
    c.b = random_tensor(dtype, 1, &c_out);
    c.gy = random_tensor(dtype, 2, (const int64_t[]){n_out, c_out});
    c.xd = on_cuda(c.x), c.wd = on_cuda(c.w), c.bd = on_cuda(c.b), c.gd = on_cuda(c.gy);
    c.ax = abs_f64(c.x), c.aw = abs_f64(c.w), c.ab = abs_f64(c.b), c.ag = abs_f64(c.gy);
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, c.x, c.w, c.b, &c.y));
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, c.x, c.w, c.gy, &c.dx, &c.dw, &c.db));
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, c.ax, c.aw, c.ab, &c.by));
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, c.ax, c.aw, c.ag, &c.bdx, &c.bdw, &c.bdb));
    return c;
}

static void release_conv_case(conv_case *c) {
    spconv_tensor *all[] = {c->x,  c->w,  c->b,  c->gy, c->xd, c->wd,  c->bd,  c->gd,
                            c->ax, c->aw, c->ab, c->ag, c->y,  c->dx,  c->dw,  c->db,
                            c->by, c->bdx, c->bdw, c->bdb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
}

static void check_conv_case(const geometry *g, spconv_dtype dtype, int64_t c_in, int64_t c_out) {
    const spconv_rulebook *rb = g->rb;
    const int64_t kv = spconv_rulebook_kernel_volume(rb), n_out = spconv_rulebook_num_out(rb);
    conv_case c = make_conv_case(rb, dtype, c_in, c_out);

    /* forward, twice on the device */
    spconv_tensor *got = NULL, *again = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, c.xd, c.wd, c.bd, &got));
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, c.xd, c.wd, c.bd, &again));
    assert_within("forward", got, c.y, c.by, dtype, kv * c_in);
    assert_same_bytes("forward", got, again);

    /* backward: every gradient, then each alone */
    spconv_tensor *cdx = NULL, *cdw = NULL, *cdb = NULL, *rdx = NULL, *rdw = NULL;
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, c.xd, c.wd, c.gd, &cdx, &cdw, &cdb));
    assert_within("grad features", cdx, c.dx, c.bdx, dtype, kv * c_out);
    assert_within("grad weight", cdw, c.dw, c.bdw, dtype, spconv_rulebook_num_pairs(rb));
    /* the CPU's sums in the CPU's order (blocks of rows, then the blocks): its bytes */
    if (is_half(dtype))
        assert_within("grad bias", cdb, c.db, c.bdb, dtype, n_out);
    else
        assert_same_bytes("grad bias", cdb, c.db);
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, c.xd, c.wd, c.gd, &rdx, NULL, NULL));
    assert_same_bytes("grad features alone", rdx, cdx);
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, c.xd, c.wd, c.gd, NULL, &rdw, NULL));
    assert_same_bytes("grad weight alone", rdw, cdw);
    if (is_half(dtype))
        check_half_against_widened(rb, dtype, c.xd, c.wd, c.bd, c.gd, got, cdx, cdw, cdb, c.by,
                                   c.bdx, c.bdw, c.bdb, c_in, c_out);

    spconv_tensor *all[] = {got, again, cdx, cdw, cdb, rdx, rdw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    release_conv_case(&c);
}

static void test_conv_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    for (int trial = 0; trial < 16; ++trial) {
        geometry g = random_geometry(trial % 4);
        const spconv_dtype dtype = DTYPES[(trial / 4) % 4];
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

/* The bias gradient over many rows: the CPU sums blocks of 4096 rows and then the blocks, in
 * double; the device does the same in parallel and so gives the CPU's bytes (f32 and f64). Sites
 * enough for several blocks, on a 1x1x1 subm conv (the bias gradient does not see the kernel). */
static void test_bias_gradient_is_the_cpus_bit_for_bit(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int64_t big[3] = {40, 40, 20};
    const int64_t batch = 2, per_batch = spconv_test_rand_int(5000, 9000);
    int32_t *rows = spconv_test_random_sites(batch, big, per_batch);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, batch * per_batch);
    free(rows);
    spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_SUBM);
    for (int axis = 0; axis < 3; ++axis) params.kernel[axis] = 1;
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, big, batch, &params, &rb));
    const int64_t n_out = spconv_rulebook_num_out(rb);
    print_message("%lld output rows (%lld blocks of 4096)\n", (long long)n_out,
                  (long long)((n_out + 4095) / 4096));
    assert_true(n_out > 2 * 4096);
    const spconv_dtype dtypes[2] = {SPCONV_F32, SPCONV_F64};
    for (int i = 0; i < 2; ++i) {
        const int64_t c_in = 3, c_out = 7;
        spconv_tensor *x = random_tensor(dtypes[i], 2, (const int64_t[]){n_out, c_in});
        spconv_tensor *w = random_tensor(dtypes[i], 3, (const int64_t[]){1, c_in, c_out});
        spconv_tensor *g = random_tensor(dtypes[i], 2, (const int64_t[]){n_out, c_out});
        spconv_tensor *xd = on_cuda(x), *wd = on_cuda(w), *gd = on_cuda(g);
        spconv_tensor *db = NULL, *cdb = NULL;
        SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, x, w, g, NULL, NULL, &db));
        SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, xd, wd, gd, NULL, NULL, &cdb));
        assert_same_bytes("grad bias", cdb, db);
        spconv_tensor *all[] = {x, w, g, xd, wd, gd, db, cdb};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; ++j) spconv_tensor_release(all[j]);
    }
    spconv_rulebook_release(rb);
    spconv_tensor_release(indices);
}

/* Max pooling: outputs and argmax bitwise (a maximum is exact), gradients within the bound of
 * their sums (several outputs may pick one input). NaN inputs follow the CPU's rule. Budgets of
 * a few KiB split the offsets into groups of one or a few (the table must fit): the same bytes
 * on any device, since each output and input gradient still folds its pairs in the offsets'
 * order. */
static void test_maxpool_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    for (int trial = 0; trial < 8; ++trial) {
        geometry g = random_geometry(0);
        const spconv_dtype dtype = DTYPES[trial % 4];
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
        set_budget_kib(trial % 2 ? "1" : "4");
        spconv_tensor *sy = NULL, *sarg = NULL, *sdx = NULL;
        SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, g.rb, xd, &sy, &sarg));
        SPCONV_ASSERT_OK(spconv_maxpool_backward(NULL, g.rb, sarg, gd, &sdx));
        set_budget_kib(NULL);
        assert_same_bytes("pool argmax, small groups", sarg, carg);
        assert_same_bytes("pool output, small groups", sy, cy);
        assert_same_bytes("pool grad, small groups", sdx, cdx);
        spconv_tensor *all[] = {x,  gy,  xd,  gd, y,  arg, cy,  carg, dx,
                                cdx, bdx, ag, sy, sarg, sdx};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
        spconv_rulebook_release(g.rb);
    }
}

/* An argmax whose rows are neither -1 nor an input row is refused on the device with the CPU's
 * status and message (the device kernel compares rows and would give a silently wrong gradient),
 * whichever element is bad. */
static void test_bad_argmax_on_device(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    geometry g = random_geometry(0);
    const int64_t n_in = spconv_rulebook_num_in(g.rb), n_out = spconv_rulebook_num_out(g.rb);
    const int64_t c = 3;
    spconv_tensor *x = random_tensor(SPCONV_F32, 2, (const int64_t[]){n_in, c});
    spconv_tensor *gy = random_tensor(SPCONV_F32, 2, (const int64_t[]){n_out, c});
    spconv_tensor *y = NULL, *arg = NULL;
    SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, g.rb, x, &y, &arg));
    if (n_out > 0) {
        int32_t *a = (int32_t *)spconv_tensor_data(arg);
        const int64_t at = spconv_test_rand_int(0, (int)(n_out * c - 1));
        const int32_t bad[2] = {(int32_t)n_in, -7};
        for (int i = 0; i < 2; ++i) {
            const int32_t kept = a[at];
            a[at] = bad[i];
            spconv_tensor *dx = NULL, *gd = on_cuda(gy), *ad = on_cuda(arg);
            const spconv_status want = spconv_maxpool_backward(NULL, g.rb, arg, gy, &dx);
            assert_int_equal(want, SPCONV_ERR_OUT_OF_RANGE);
            char message[512];
            snprintf(message, sizeof message, "%s", spconv_last_error());
            SPCONV_ASSERT_STATUS(spconv_maxpool_backward(NULL, g.rb, ad, gd, &dx), want);
            assert_null(dx);
            assert_string_equal(spconv_last_error(), message);
            spconv_tensor_release(gd);
            spconv_tensor_release(ad);
            a[at] = kept;
        }
    }
    spconv_tensor *all[] = {x, gy, y, arg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    spconv_rulebook_release(g.rb);
}

/* Integer features are no conv operands on the device either: a clear NOT_SUPPORTED. */
static void test_unsupported_dtype(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    geometry g = random_geometry(1);
    const int64_t n = spconv_rulebook_num_in(g.rb), kv = spconv_rulebook_kernel_volume(g.rb);
    spconv_tensor *x = random_tensor(SPCONV_I32, 2, (const int64_t[]){n, 3});
    spconv_tensor *w = random_tensor(SPCONV_I32, 3, (const int64_t[]){kv, 3, 2});
    spconv_tensor *xd = on_cuda(x), *wd = on_cuda(w), *out = NULL;
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, g.rb, xd, wd, NULL, &out),
                        SPCONV_ERR_NOT_SUPPORTED, "not i32");
    assert_null(out);
    spconv_tensor *all[] = {x, w, xd, wd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    spconv_rulebook_release(g.rb);
}

/* The network's own layers (batch norm, ReLU, save / concat, to-dense) on the CUDA backend
 * against the CPU backend, through spconv_net_forward / backward: a network without convs runs
 * on the device already. Batch statistics are sums in double of the same blocks in the same
 * order on both (so they differ only by contraction into FMAs), and every output element is a
 * short chain of operations in the working precision: the bound used is 64 u |value| + the
 * smallest normal, u of the network's dtype, far below any real error (a wrong channel or a
 * missing term moves values by O(1)). 16-bit networks compute each layer in f32 on both backends
 * and round it once, so the same holds with u of f16 or bf16. */
static void assert_close(const char *what, const spconv_tensor *got, const spconv_tensor *want,
                         spconv_dtype dtype) {
    int64_t ng, nw;
    double *g = read_values(got, &ng), *w = read_values(want, &nw);
    assert_int_equal(ng, nw);
    const double u = dtype == SPCONV_F16    ? ldexp(1.0, -11)
                     : dtype == SPCONV_BF16 ? ldexp(1.0, -8)
                     : dtype == SPCONV_F32  ? ldexp(1.0, -24)
                                            : ldexp(1.0, -53);
    for (int64_t i = 0; i < ng; ++i) {
        const double allowed = 64.0 * u * (fabs(w[i]) + 1.0);
        if (!(fabs(g[i] - w[i]) <= allowed) && !(isnan(g[i]) && isnan(w[i])))
            fail_msg("%s: element %lld: cuda %.17g, cpu %.17g", what, (long long)i, g[i], w[i]);
    }
    free(g);
    free(w);
}

static void test_net_layers_match_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn1", .in_channels = 5},
        {.kind = SPCONV_LAYER_RELU, .name = "r1"},
        {.kind = SPCONV_LAYER_SAVE, .name = "s1", .key = "skip"},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn2", .in_channels = 5, .eps = 1e-3},
        {.kind = SPCONV_LAYER_CONCAT, .name = "cat", .key = "skip"},
        {.kind = SPCONV_LAYER_RELU, .name = "r2"},
        {.kind = SPCONV_LAYER_TO_DENSE, .name = "dense"},
    };
    const int n_layers = (int)(sizeof layers / sizeof layers[0]);
    for (int trial = 0; trial < 8; ++trial) {
        const spconv_dtype dtype = DTYPES[trial % 4];
        const int64_t batch = 1 + trial / 4, per_batch = spconv_test_rand_int(1, 1500);
        int32_t *rows = spconv_test_random_sites(batch, SHAPE, per_batch);
        const int64_t n = batch * per_batch;
        spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
        free(rows);
        spconv_tensor *x = random_tensor(dtype, 2, (const int64_t[]){n, 5});
        spconv_tensor *xd = on_cuda(x), *id = on_cuda(indices);
        spconv_sparse_tensor *in = NULL, *in_d = NULL;
        SPCONV_ASSERT_OK(spconv_sparse_create(x, indices, SHAPE, batch, &in));
        SPCONV_ASSERT_OK(spconv_sparse_create(xd, id, SHAPE, batch, &in_d));
        const uint64_t seed = spconv_test_rand_u64();
        spconv_net *cpu = NULL, *gpu = NULL;
        SPCONV_ASSERT_OK(spconv_net_create(dtype, 5, layers, n_layers, seed, &cpu));
        SPCONV_ASSERT_OK(spconv_net_create(dtype, 5, layers, n_layers, seed, &gpu));
        /* Inference with the initial running statistics, then a training pass and its backward. */
        spconv_tensor *y = NULL, *yd = NULL;
        SPCONV_ASSERT_OK(spconv_net_forward(NULL, cpu, in, SPCONV_NET_INFERENCE, &y, NULL));
        SPCONV_ASSERT_OK(spconv_net_forward(NULL, gpu, in_d, SPCONV_NET_INFERENCE, &yd, NULL));
        assert_true(spconv_device_equal(spconv_tensor_device(yd), spconv_cuda(0)));
        assert_close("inference output", yd, y, dtype);
        spconv_tensor_release(y);
        spconv_tensor_release(yd);
        SPCONV_ASSERT_OK(spconv_net_forward(NULL, cpu, in, SPCONV_NET_TRAINING, &y, NULL));
        SPCONV_ASSERT_OK(spconv_net_forward(NULL, gpu, in_d, SPCONV_NET_TRAINING, &yd, NULL));
        assert_close("training output", yd, y, dtype);
        spconv_tensor *gy = random_tensor(dtype, spconv_tensor_ndim(y), spconv_tensor_sizes(y));
        spconv_tensor *gyd = on_cuda(gy), *dx = NULL, *dxd = NULL;
        SPCONV_ASSERT_OK(spconv_net_backward(NULL, cpu, gy, &dx));
        SPCONV_ASSERT_OK(spconv_net_backward(NULL, gpu, gyd, &dxd));
        assert_close("input gradient", dxd, dx, dtype);
        for (int p = 0; p < spconv_net_num_params(cpu); ++p) {
            assert_close(spconv_net_param_name(cpu, p), spconv_net_param(gpu, p),
                         spconv_net_param(cpu, p), dtype);
            if (spconv_net_param_grad(cpu, p) != NULL)
                assert_close(spconv_net_param_name(cpu, p), spconv_net_param_grad(gpu, p),
                             spconv_net_param_grad(cpu, p), dtype);
        }
        spconv_tensor *all[] = {indices, x, xd, id, y, yd, gy, gyd, dx, dxd};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
        spconv_sparse_release(in);
        spconv_sparse_release(in_d);
        spconv_net_destroy(cpu);
        spconv_net_destroy(gpu);
    }
}

/* ---- parameters kept on the device ----------------------------------------------------------
 * spconv_net_keep_on_device: a pass reads the kept copy and uploads nothing. On a second inference
 * pass whose rulebook the input's cache already holds, the layers only queue work: the emulation
 * counts no host wait at all (with a context or without one), where the same network without a kept copy waits for its one
 * upload. Both give the same bytes; after training (running statistics), an SGD step, and a
 * write into a parameter followed by keep_on_device again, they still do, so the kept copy follows
 * every change. A training pass and its backward wait for the device only after their last layer
 * (batch norms keep statistics, terms and gradients on the device). */
#if SPCONV_CUDA_EMULATION
unsigned long long spconv__cuda_emulation_host_waits(void);
#define HOST_WAITS() spconv__cuda_emulation_host_waits()
#else
#define HOST_WAITS() 0ull /* a GPU run checks the bytes only */
#endif

/* Random f32 features [n, c] at n random sites of SHAPE (batch 1), as a sparse tensor on the
 * device, with the host tensors it came from. */
typedef struct device_input {
    spconv_tensor *indices, *x, *xd, *id;
    spconv_sparse_tensor *in;
} device_input;

static device_input make_device_input(int64_t n, int64_t c) {
    device_input d;
    int32_t *rows = spconv_test_random_sites(1, SHAPE, n);
    d.indices = spconv_test_indices_tensor(rows, n);
    free(rows);
    d.x = random_tensor(SPCONV_F32, 2, (const int64_t[]){n, c});
    d.xd = on_cuda(d.x);
    d.id = on_cuda(d.indices);
    d.in = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(d.xd, d.id, SHAPE, 1, &d.in));
    return d;
}

static void release_device_input(device_input *d) {
    spconv_sparse_release(d->in);
    spconv_tensor *all[] = {d->indices, d->x, d->xd, d->id};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
}

/* A rulebook built on the device serves CPU features too: the CPU executors copy its pairs to the
 * host (as the CUDA ones copy a CPU rulebook's to the device), and give the bytes of the CPU
 * rulebook of the same sites. On a GPU, and in the emulation (which keeps device memory from the
 * host), the executors reading the device pairs in place would fault. */
static void test_device_rulebook_with_cpu_features(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    device_input d = make_device_input(250, 6);
    const spconv_conv_kind kinds[2] = {SPCONV_CONV_SUBM, SPCONV_CONV_REGULAR};
    for (int i = 0; i < 2; ++i) {
        spconv_conv_params params = spconv_conv_params_default(kinds[i]);
        spconv_rulebook *rb_d = NULL, *rb_h = NULL;
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, d.id, SHAPE, 1, &params, &rb_d));
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, d.indices, SHAPE, 1, &params, &rb_h));
        assert_true(spconv_device_equal(spconv_tensor_device(spconv_rulebook_pairs_in(rb_d)),
                                        spconv_cuda(0)));
        spconv_tensor *w = random_tensor(SPCONV_F32, 3, (const int64_t[]){27, 6, 5});
        spconv_tensor *g = random_tensor(SPCONV_F32, 2,
                                         (const int64_t[]){spconv_rulebook_num_out(rb_h), 5});
        spconv_tensor *y_d = NULL, *y_h = NULL, *dx_d = NULL, *dx_h = NULL, *dw_d = NULL,
                      *dw_h = NULL, *p_d = NULL, *p_h = NULL;
        SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb_d, d.x, w, NULL, &y_d));
        SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb_h, d.x, w, NULL, &y_h));
        assert_true(spconv_device_equal(spconv_tensor_device(y_d), spconv_cpu()));
        assert_memory_equal(spconv_tensor_data(y_d), spconv_tensor_data(y_h),
                            (size_t)spconv_tensor_numel(y_h) * sizeof(float));
        SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb_d, d.x, w, g, &dx_d, &dw_d, NULL));
        SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb_h, d.x, w, g, &dx_h, &dw_h, NULL));
        assert_memory_equal(spconv_tensor_data(dx_d), spconv_tensor_data(dx_h),
                            (size_t)spconv_tensor_numel(dx_h) * sizeof(float));
        assert_memory_equal(spconv_tensor_data(dw_d), spconv_tensor_data(dw_h),
                            (size_t)spconv_tensor_numel(dw_h) * sizeof(float));
        if (kinds[i] == SPCONV_CONV_REGULAR) {
            SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, rb_d, d.x, &p_d, NULL));
            SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, rb_h, d.x, &p_h, NULL));
            assert_memory_equal(spconv_tensor_data(p_d), spconv_tensor_data(p_h),
                                (size_t)spconv_tensor_numel(p_h) * sizeof(float));
        }
        spconv_tensor *all[] = {w, g, y_d, y_h, dx_d, dx_h, dw_d, dw_h, p_d, p_h};
        for (size_t t = 0; t < sizeof all / sizeof all[0]; ++t) spconv_tensor_release(all[t]);
        spconv_rulebook_release(rb_d);
        spconv_rulebook_release(rb_h);
    }
    release_device_input(&d);
}

static spconv_tensor *net_pass(spconv_context *ctx, spconv_net *net,
                               const spconv_sparse_tensor *in, spconv_net_mode mode) {
    spconv_tensor *y = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(ctx, net, in, mode, &y, NULL));
    return y;
}

/* The host's waits as each layer ends (the progress callback). */
typedef struct wait_marks {
    unsigned long long at[32];
    int count;
} wait_marks;

static void mark_waits(void *user, const spconv_layer_stats *stats, int num_layers, int backward) {
    (void)stats;
    (void)num_layers;
    (void)backward;
    wait_marks *m = user;
    if (m->count < 32) m->at[m->count++] = HOST_WAITS();
}

static void test_kept_parameters_make_no_host_round_trip(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "c1", .in_channels = 5, .out_channels = 8,
         .kernel = {3, 3, 3}, .key = "k"},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "b1", .in_channels = 8},
        {.kind = SPCONV_LAYER_RELU, .name = "r1"},
        {.kind = SPCONV_LAYER_SUBM, .name = "c2", .in_channels = 8, .out_channels = 6,
         .kernel = {3, 3, 3}, .key = "k", .bias = 1},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "b2", .in_channels = 6},
        {.kind = SPCONV_LAYER_RELU, .name = "r2"},
    };
    const int n_layers = (int)(sizeof layers / sizeof layers[0]);
    device_input d = make_device_input(400, 5);
    const spconv_sparse_tensor *in = d.in;
    const uint64_t seed = spconv_test_rand_u64();
    spconv_net *kept = NULL, *plain = NULL;
    SPCONV_ASSERT_OK(spconv_net_create(SPCONV_F32, 5, layers, n_layers, seed, &kept));
    SPCONV_ASSERT_OK(spconv_net_create(SPCONV_F32, 5, layers, n_layers, seed, &plain));
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cuda(0), &ctx));
    SPCONV_ASSERT_OK(spconv_net_keep_on_device(ctx, kept, spconv_cuda(0)));

    spconv_tensor_release(net_pass(ctx, kept, in, SPCONV_NET_INFERENCE)); /* caches the rulebook */
    unsigned long long before = HOST_WAITS();
    spconv_tensor *y_kept = net_pass(ctx, kept, in, SPCONV_NET_INFERENCE);
    assert_int_equal(HOST_WAITS() - before, 0);
    before = HOST_WAITS(); /* without a context: the legacy stream, scratch from the pool */
    spconv_tensor *y_legacy = net_pass(NULL, kept, in, SPCONV_NET_INFERENCE);
    assert_int_equal(HOST_WAITS() - before, 0);
    assert_same_bytes("inference without a context", y_legacy, y_kept);
    spconv_tensor_release(y_legacy);
    before = HOST_WAITS();
    spconv_tensor *y_plain = net_pass(ctx, plain, in, SPCONV_NET_INFERENCE);
    if (SPCONV_CUDA_EMULATION) assert_true(HOST_WAITS() - before > 0);
    assert_same_bytes("inference", y_kept, y_plain);
    spconv_tensor_release(y_kept);
    spconv_tensor_release(y_plain);

    /* Training (running statistics change), backward, an SGD step: the kept copy follows. A
     * training pass's batch norms keep their statistics, terms and gradients on the device: no
     * layer waits, and the pass waits only at its end, when its batch norms' statistics come home
     * in one read for the running statistics; the backward only when the gradients come home, in
     * one read too. */
    wait_marks marks = {.count = 0};
    spconv_net_set_progress(kept, mark_waits, &marks);
    before = HOST_WAITS();
    y_kept = net_pass(ctx, kept, in, SPCONV_NET_TRAINING);
    const unsigned long long training_waits = HOST_WAITS() - before;
    assert_int_equal(marks.count, n_layers);
    for (int i = 0; i < marks.count; ++i) assert_int_equal(marks.at[i] - before, 0);
    assert_true(training_waits <= 2); /* one read: a copy to the host and its synchronisation */
    y_plain = net_pass(ctx, plain, in, SPCONV_NET_TRAINING);
    assert_same_bytes("training", y_kept, y_plain);
    spconv_tensor *gy = random_tensor(SPCONV_F32, 2, spconv_tensor_sizes(y_kept));
    spconv_tensor *gyd = on_cuda(gy), *dx_kept = NULL, *dx_plain = NULL;
    marks.count = 0;
    before = HOST_WAITS();
    SPCONV_ASSERT_OK(spconv_net_backward(ctx, kept, gyd, &dx_kept));
    assert_int_equal(marks.count, n_layers);
    for (int i = 0; i < marks.count; ++i) assert_int_equal(marks.at[i] - before, 0);
    const unsigned long long backward_waits = HOST_WAITS() - before;
    print_message("training pass: %llu host waits at its end; backward: %llu\n", training_waits,
                  backward_waits);
    assert_true(backward_waits <= 2); /* the gradients in one read */
    spconv_net_set_progress(kept, NULL, NULL);
    SPCONV_ASSERT_OK(spconv_net_backward(ctx, plain, gyd, &dx_plain));
    assert_same_bytes("input gradient", dx_kept, dx_plain);
    for (int p = 0; p < spconv_net_num_params(kept); ++p)
        if (spconv_net_param_grad(plain, p) != NULL)
            assert_same_bytes(spconv_net_param_name(kept, p), spconv_net_param_grad(kept, p),
                              spconv_net_param_grad(plain, p));
    {   /* the training pass changed the running statistics: the kept copy follows */
        spconv_tensor *a = net_pass(ctx, kept, in, SPCONV_NET_INFERENCE);
        spconv_tensor *b = net_pass(ctx, plain, in, SPCONV_NET_INFERENCE);
        assert_same_bytes("inference after training", a, b);
        spconv_tensor_release(a);
        spconv_tensor_release(b);
    }
    SPCONV_ASSERT_OK(spconv_net_sgd_step(ctx, kept, 0.25));
    SPCONV_ASSERT_OK(spconv_net_sgd_step(ctx, plain, 0.25));
    spconv_tensor *all[] = {y_kept, y_plain, gy, gyd, dx_kept, dx_plain};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    y_kept = net_pass(ctx, kept, in, SPCONV_NET_INFERENCE);
    y_plain = net_pass(ctx, plain, in, SPCONV_NET_INFERENCE);
    assert_same_bytes("inference after a step", y_kept, y_plain);
    spconv_tensor_release(y_kept);
    spconv_tensor_release(y_plain);

    /* A write of the caller's, then keep_on_device again. */
    const int w2 = spconv_net_find_param(kept, "c2.weight");
    assert_true(w2 >= 0);
    SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, spconv_net_param(kept, w2), 0.125));
    SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, spconv_net_param(plain, w2), 0.125));
    SPCONV_ASSERT_OK(spconv_net_keep_on_device(ctx, kept, spconv_cuda(0)));
    y_kept = net_pass(ctx, kept, in, SPCONV_NET_INFERENCE);
    y_plain = net_pass(ctx, plain, in, SPCONV_NET_INFERENCE);
    assert_same_bytes("inference after a write", y_kept, y_plain);
    spconv_tensor_release(y_kept);
    spconv_tensor_release(y_plain);
    SPCONV_ASSERT_OK(spconv_net_keep_on_device(ctx, kept, spconv_cpu())); /* drops the copy */

    spconv_net_destroy(kept);
    spconv_net_destroy(plain);
    spconv_context_destroy(ctx);
    release_device_input(&d);
}

/* ---- layer times on the device's clock ------------------------------------------------------
 * On a device with its own clock the statistics are spans between events (unless the network
 * times nothing there: then the progress callback sees the host's times): each layer's total is
 * at least its named phases (rulebook, and with SPCONV_NET_TIME_PHASES the conv's gather, GEMM and
 * scatter, each of which did some work so took some time), "other" is the rest, and the layers
 * together take no longer than the pass as the host saw it. Without phase timing the conv phases
 * stay 0 on the device. */
static double host_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Event times are floats of about half a microsecond's resolution, and a sum of spans may exceed
 * the span around them by that much per span: the sums below allow 1 us per layer. */
#define CLOCK_SLACK_MS 1e-3

static void check_phase_sums(const spconv_net *net, int backward, int phases, double wall_ms) {
    double layers_ms = 0.0;
    for (int i = 0; i < spconv_net_num_layers(net); ++i) {
        const spconv_layer_stats *st = spconv_net_stats(net, i);
        const spconv_phase_ms *p = backward ? &st->backward : &st->forward;
        const double named = p->rulebook + p->gather + p->gemm + p->scatter;
        const double other = p->total - named > 0.0 ? p->total - named : 0.0;
        if (!(p->total >= 0.0 && named <= p->total + CLOCK_SLACK_MS &&
              fabs(p->other - other) <= 1e-9 * (1 + p->total)))
            fail_msg("layer %d (%s): total %g, named phases %g, other %g", i,
                     backward ? "backward" : "forward", p->total, named, p->other);
        const int is_conv = st->kind == SPCONV_LAYER_SUBM || st->kind == SPCONV_LAYER_CONV;
        if (is_conv && phases && !(p->gather > 0.0 && p->gemm > 0.0 && p->scatter > 0.0))
            fail_msg("layer %d: conv phases %g %g %g", i, p->gather, p->gemm, p->scatter);
        if (!phases && (p->gather != 0.0 || p->gemm != 0.0 || p->scatter != 0.0))
            fail_msg("layer %d: conv phases timed without SPCONV_NET_TIME_PHASES", i);
        layers_ms += p->total;
    }
    if (!(layers_ms <= wall_ms + CLOCK_SLACK_MS * spconv_net_num_layers(net)))
        fail_msg("the layers took %g ms of a %g ms pass", layers_ms, wall_ms);
}

/* The progress callback runs as each layer is queued, before the device's clock can be read: it
 * must see no time yet (host times would not be 0). */
static void record_progress_total(void *user, const spconv_layer_stats *stats, int num_layers,
                                  int backward) {
    double *seen = user;
    (void)num_layers;
    const spconv_phase_ms *p = backward ? &stats->backward : &stats->forward;
    *seen += p->total + p->rulebook;
}

static void test_layer_times_come_from_the_device_clock(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "c1", .in_channels = 3, .out_channels = 8,
         .kernel = {3, 3, 3}, .key = "k"},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "b1", .in_channels = 8},
        {.kind = SPCONV_LAYER_RELU, .name = "r1"},
        {.kind = SPCONV_LAYER_CONV, .name = "c2", .in_channels = 8, .out_channels = 4,
         .kernel = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}},
    };
    device_input d = make_device_input(300, 3);
    const spconv_sparse_tensor *in = d.in;
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_net_create(SPCONV_F32, 3, layers, 4, spconv_test_rand_u64(), &net));
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cuda(0), &ctx));
    double seen_in_progress = 0.0;
    spconv_net_set_progress(net, record_progress_total, &seen_in_progress);
    for (int phases = 0; phases <= 1; ++phases) {
        spconv_net_set_timing(net, phases ? SPCONV_NET_TIME_PHASES : SPCONV_NET_TIME_LAYERS);
        double start = host_ms();
        spconv_tensor *y = net_pass(ctx, net, in, SPCONV_NET_TRAINING);
        SPCONV_ASSERT_OK(spconv_context_synchronize(ctx));
        const double forward_ms = host_ms() - start;
        spconv_tensor *gy = random_tensor(SPCONV_F32, 2, spconv_tensor_sizes(y));
        spconv_tensor *gyd = on_cuda(gy);
        start = host_ms();
        SPCONV_ASSERT_OK(spconv_net_backward(ctx, net, gyd, NULL));
        SPCONV_ASSERT_OK(spconv_context_synchronize(ctx));
        const double backward_ms = host_ms() - start;
        assert_true(seen_in_progress == 0.0);
        check_phase_sums(net, 0, phases, forward_ms);
        check_phase_sums(net, 1, phases, backward_ms);
        assert_true(spconv_net_stats(net, 0)->forward.total > 0.0); /* read once resolved */
        spconv_tensor_release(y);
        spconv_tensor_release(gy);
        spconv_tensor_release(gyd);
    }
    /* No events: the host's queueing times, there as each layer is reported. */
    spconv_net_set_timing(net, SPCONV_NET_TIME_NONE);
    spconv_tensor_release(net_pass(ctx, net, in, SPCONV_NET_INFERENCE));
    assert_true(seen_in_progress > 0.0);
    spconv_net_destroy(net);
    spconv_context_destroy(ctx);
    release_device_input(&d);
}

/* A repeated site on the device is refused as on the CPU, naming the row, before anything runs. */
static void test_net_to_dense_bad_sites(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const spconv_layer_desc layers[] = {{.kind = SPCONV_LAYER_TO_DENSE, .name = "dense"}};
    const int32_t rows[3][4] = {{0, 1, 2, 3}, {0, 4, 5, 6}, {0, 1, 2, 3}};
    spconv_tensor *indices = spconv_test_indices_tensor(&rows[0][0], 3);
    spconv_tensor *x = random_tensor(SPCONV_F32, 2, (const int64_t[]){3, 2});
    spconv_tensor *xd = on_cuda(x), *id = on_cuda(indices), *out = NULL;
    spconv_sparse_tensor *in = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(xd, id, SHAPE, 1, &in));
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_net_create(SPCONV_F32, 2, layers, 1, 1, &net));
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_DUPLICATE_INDEX,
                        "indices row 2 = (0, 1, 2, 3) repeats an earlier row");
    assert_null(out);
    spconv_net_destroy(net);
    spconv_sparse_release(in);
    spconv_tensor *all[] = {indices, x, xd, id};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
}

/* Whole zoo networks on the device against the CPU, in f64, on the first points of the bundled
 * sample scan (a wedge of a real LiDAR sweep, kept small because the emulated device is slow):
 * inference output, then a training forward and backward (input gradient, every parameter
 * gradient and the updated running statistics).
 * Tolerance: normalised error (max difference over max magnitude) <= 1e-9. Each layer's sums of
 * at most KV * C_in <= 27 * 128 terms differ between the backends by at most 2 gamma_n ~ 8e-13
 * of their absolute sums in f64, and the layers add such errors (first order) along a network
 * of under 30 layers: about 2e-11 before batch norm's division by the batch deviation, which
 * the margin of 50x covers. A wrong offset, channel or row moves values by O(1). */
static double normalised_error(const spconv_tensor *got, const spconv_tensor *want) {
    int64_t ng, nw;
    double *g = read_values(got, &ng), *w = read_values(want, &nw);
    assert_int_equal(ng, nw);
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < ng; ++i) {
        const double d = fabs(g[i] - w[i]);
        diff = d > diff || isnan(d) ? d : diff;
        scale = fabs(w[i]) > scale ? fabs(w[i]) : scale;
    }
    free(g);
    free(w);
    return scale > 0.0 ? diff / scale : diff;
}

static void assert_normalised(const char *net, const char *what, const spconv_tensor *got,
                              const spconv_tensor *want) {
    const double err = normalised_error(got, want);
    if (!(err <= 1e-9)) fail_msg("%s: %s: normalised error %.3g", net, what, err);
}

static void check_zoo_net(const char *name, const spconv_tensor *points) {
    spconv_net_input zin;
    SPCONV_ASSERT_OK(spconv_zoo_input(name, &zin));
    spconv_tensor *pts = NULL, *pts_d = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_narrow(points, 1, 0, zin.point_columns, &pts));
    pts_d = on_cuda(pts);
    spconv_sparse_tensor *in = NULL, *in_d = NULL;
    SPCONV_ASSERT_OK(spconv_net_input_from_points(NULL, &zin, pts, SPCONV_F64, &in, NULL));
    spconv_tensor *f_d = on_cuda(spconv_sparse_features(in)),
                  *i_d = on_cuda(spconv_sparse_indices(in));
    int64_t shape[3];
    spconv_sparse_spatial_shape(in, shape);
    SPCONV_ASSERT_OK(spconv_sparse_create(f_d, i_d, shape, spconv_sparse_batch_size(in), &in_d));
    const uint64_t seed = spconv_test_rand_u64();
    spconv_net *cpu = NULL, *gpu = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create(name, SPCONV_F64, seed, &cpu));
    SPCONV_ASSERT_OK(spconv_zoo_create(name, SPCONV_F64, seed, &gpu));
    spconv_tensor *y = NULL, *yd = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, cpu, in, SPCONV_NET_INFERENCE, &y, NULL));
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, gpu, in_d, SPCONV_NET_INFERENCE, &yd, NULL));
    assert_true(spconv_device_equal(spconv_tensor_device(yd), spconv_cuda(0)));
    print_message("%s: %lld voxels, output of %lld elements\n", name,
                  (long long)spconv_sparse_num_sites(in), (long long)spconv_tensor_numel(y));
    assert_normalised(name, "inference output", yd, y);
    spconv_tensor_release(y);
    spconv_tensor_release(yd);
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, cpu, in, SPCONV_NET_TRAINING, &y, NULL));
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, gpu, in_d, SPCONV_NET_TRAINING, &yd, NULL));
    assert_normalised(name, "training output", yd, y);
    spconv_tensor *gy = random_tensor(SPCONV_F64, spconv_tensor_ndim(y), spconv_tensor_sizes(y));
    spconv_tensor *gyd = on_cuda(gy), *dx = NULL, *dxd = NULL;
    SPCONV_ASSERT_OK(spconv_net_backward(NULL, cpu, gy, &dx));
    SPCONV_ASSERT_OK(spconv_net_backward(NULL, gpu, gyd, &dxd));
    assert_normalised(name, "input gradient", dxd, dx);
    for (int p = 0; p < spconv_net_num_params(cpu); ++p) {
        assert_normalised(name, spconv_net_param_name(cpu, p), spconv_net_param(gpu, p),
                          spconv_net_param(cpu, p));
        if (spconv_net_param_grad(cpu, p) != NULL)
            assert_normalised(name, spconv_net_param_name(cpu, p), spconv_net_param_grad(gpu, p),
                              spconv_net_param_grad(cpu, p));
    }
    spconv_tensor *all[] = {pts, pts_d, f_d, i_d, y, yd, gy, gyd, dx, dxd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    spconv_sparse_release(in);
    spconv_sparse_release(in_d);
    spconv_net_destroy(cpu);
    spconv_net_destroy(gpu);
}

static void test_zoo_networks_match_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_OK(spconv_point_cloud_read(SPCONV_TEST_SOURCE_DIR "/data/sample_scan.bin",
                                             SPCONV_CLOUD_AUTO, 0, &pc));
    /* Every k-th point: a thinned sweep that still covers every zoo network's range. */
    const spconv_tensor *all = spconv_point_cloud_points(pc);
    const int64_t total = spconv_tensor_size(all, 0), cols = spconv_tensor_size(all, 1);
    const int64_t every = total > 6000 ? total / 6000 : 1, take = total / every;
    int64_t count;
    double *values = read_values(all, &count), *kept = malloc((size_t)(take * cols + 1) * 8);
    assert_non_null(kept);
    for (int64_t r = 0; r < take; ++r)
        memcpy(kept + r * cols, values + r * every * cols, (size_t)cols * sizeof *kept);
    spconv_tensor *first = NULL, *f64 = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F64, 2,
                                             (const int64_t[]){take, cols}, kept, &f64));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, f64, spconv_tensor_dtype(all), &first));
    spconv_tensor_release(f64);
    free(values);
    free(kept);
    static const char *names[] = {"second", "basic", "unet"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) check_zoo_net(names[i], first);
    spconv_tensor_release(first);
    spconv_point_cloud_destroy(pc);
}

/* sparse <-> dense on the device: bit for bit the CPU's dense map, sites and features (with
 * zeros, -0 and NaN in the map), and the CPU's messages for a bad row. */
static void test_dense_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    for (int trial = 0; trial < 8; ++trial) {
        const spconv_dtype dtype = DTYPES[trial % 4];
        const int64_t batch = 1 + trial / 4, per_batch = spconv_test_rand_int(1, 200);
        const int64_t c = CHANNELS[spconv_test_rand_int(0, 2)], n = batch * per_batch;
        int32_t *rows = spconv_test_random_sites(batch, SHAPE, per_batch);
        spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
        free(rows);
        spconv_tensor *x = random_tensor(dtype, 2, (const int64_t[]){n, c});
        /* a row of zeros (dropped by dense_to_sparse), a -0 and a NaN (a -0 row is dropped too) */
        spconv_tensor *row0 = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_select(x, 0, 0, &row0));
        SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, row0, trial / 4 ? 0.0 : -0.0));
        spconv_tensor_release(row0);
        if (n > 1) {
            SPCONV_ASSERT_OK(spconv_tensor_select(x, 0, 1, &row0));
            SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, row0, NAN));
            spconv_tensor_release(row0);
        }
        spconv_tensor *xd = on_cuda(x), *id = on_cuda(indices);
        spconv_tensor *dense = NULL, *dense_d = NULL;
        SPCONV_ASSERT_OK(spconv_sparse_to_dense(NULL, x, indices, SHAPE, batch, &dense));
        SPCONV_ASSERT_OK(spconv_sparse_to_dense(NULL, xd, id, SHAPE, batch, &dense_d));
        assert_same_bytes("sparse_to_dense", dense_d, dense);
        spconv_tensor *f = NULL, *i = NULL, *fd = NULL, *i_d = NULL;
        SPCONV_ASSERT_OK(spconv_dense_to_sparse(NULL, dense, &f, &i));
        SPCONV_ASSERT_OK(spconv_dense_to_sparse(NULL, dense_d, &fd, &i_d));
        assert_true(spconv_device_equal(spconv_tensor_device(fd), spconv_cuda(0)));
        assert_int_equal(spconv_tensor_size(fd, 0), n - 1);
        assert_same_bytes("dense_to_sparse features", fd, f);
        assert_same_bytes("dense_to_sparse indices", i_d, i);
        spconv_tensor *all[] = {indices, x, xd, id, dense, dense_d, f, i, fd, i_d};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; ++k) spconv_tensor_release(all[k]);
    }
    /* Bad rows: row 3 outside (x = W), row 2 repeating row 0, and both (the first one counts). */
    const int32_t cases[3][4][4] = {
        {{0, 1, 1, 1}, {0, 2, 2, 2}, {0, 3, 3, 3}, {0, 1, 2, 11}},
        {{0, 1, 1, 1}, {0, 2, 2, 2}, {0, 1, 1, 1}, {0, 4, 4, 4}},
        {{0, 1, 1, 1}, {0, 2, 2, 2}, {0, 1, 1, 1}, {0, 1, 2, 11}},
    };
    for (int k = 0; k < 3; ++k) {
        spconv_tensor *indices = spconv_test_indices_tensor(&cases[k][0][0], 4);
        spconv_tensor *x = random_tensor(SPCONV_F32, 2, (const int64_t[]){4, 2});
        spconv_tensor *xd = on_cuda(x), *id = on_cuda(indices), *out = NULL;
        const spconv_status want = spconv_sparse_to_dense(NULL, x, indices, SHAPE, 1, &out);
        assert_true(want != SPCONV_OK);
        char message[512];
        snprintf(message, sizeof message, "%s", spconv_last_error());
        SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, xd, id, SHAPE, 1, &out), want, message);
        assert_null(out);
        spconv_tensor *all[] = {indices, x, xd, id};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; ++j) spconv_tensor_release(all[j]);
    }
}

/* ---- the plan: budgets change launches, not sums -------------------------------------------
 * A conv's steps depend on the workspace budget (SPCONV_CUDA_CONV_WORKSPACE_KIB): by default the
 * offsets of these small layers share one group; a few KiB give several groups, one offset alone
 * or chunks of one offset (scatter-adds). Every target element adds its terms in the offsets'
 * order whatever the plan, so in the emulation (whose products do not depend on how many rows a
 * product has) every budget gives the same output and input gradient bytes; on a GPU each is held
 * to the CPU bound instead. The weight gradient is held to the CPU bound under every budget: an
 * offset split into chunks sums its pairs chunk by chunk, another order.
 * A budget that is not a positive number of KiB is refused by name. With the default budget, a
 * subm forward on device operands takes one gather, a product per active offset, a memset, the
 * table and the sum; the backward two gathers, two products per offset, the same three for the
 * input gradient, the weight gradient's memset and the bias gradient's two (its row blocks' sums
 * and their total, conv.cu's column_block_sums_kernel). */
#if SPCONV_CUDA_EMULATION
unsigned long long spconv__cuda_emulation_launches(void);
#endif

static void assert_same_or_within(const char *what, const spconv_tensor *got,
                                  const spconv_tensor *first, const spconv_tensor *cpu,
                                  const spconv_tensor *bound, spconv_dtype dtype, int64_t n) {
    if (SPCONV_CUDA_EMULATION)
        assert_same_bytes(what, got, first);
    else
        assert_within(what, got, cpu, bound, dtype, n);
}

static void check_budgets(const geometry *g, spconv_dtype dtype, int64_t c_in, int64_t c_out) {
    static const char *budgets[] = {NULL, "1", "4", "16", "64"};
    const spconv_rulebook *rb = g->rb;
    const int64_t kv = spconv_rulebook_kernel_volume(rb);
    conv_case c = make_conv_case(rb, dtype, c_in, c_out);
    const int64_t n_fwd = kv * c_in, n_dx = kv * c_out, n_dw = spconv_rulebook_num_pairs(rb);
    spconv_tensor *first[2] = {NULL, NULL};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; ++i) {
        set_budget_kib(budgets[i]);
        spconv_tensor *cy = NULL, *cdx = NULL, *cdw = NULL;
        SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, c.xd, c.wd, c.bd, &cy));
        SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, c.xd, c.wd, c.gd, &cdx, &cdw, NULL));
        print_message("  budget %s KiB\n", budgets[i] != NULL ? budgets[i] : "(default)");
        assert_within("forward", cy, c.y, c.by, dtype, n_fwd);
        assert_within("grad features", cdx, c.dx, c.bdx, dtype, n_dx);
        assert_within("grad weight", cdw, c.dw, c.bdw, dtype, n_dw);
        if (i == 0) {
            first[0] = cy;
            first[1] = cdx;
        } else {
            assert_same_or_within("forward, another budget", cy, first[0], c.y, c.by, dtype,
                                  n_fwd);
            assert_same_or_within("grad features, another budget", cdx, first[1], c.dx, c.bdx,
                                  dtype, n_dx);
            spconv_tensor_release(cy);
            spconv_tensor_release(cdx);
        }
        spconv_tensor_release(cdw);
    }
    set_budget_kib(NULL);
    spconv_tensor_release(first[0]);
    spconv_tensor_release(first[1]);
    release_conv_case(&c);
}

static void test_budgets_change_launches_not_sums(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    for (int trial = 0; trial < 8; ++trial) {
        geometry g = random_geometry(trial % 4);
        const spconv_dtype dtype = trial < 4 ? SPCONV_F32 : SPCONV_F16;
        const int64_t c_in = trial % 2 ? 17 : 64, c_out = trial % 3 ? 64 : 3;
        print_message("%s %s, %lld -> %lld channels, %lld pairs in %lld offsets\n", g.name,
                      spconv_dtype_name(dtype), (long long)c_in, (long long)c_out,
                      (long long)spconv_rulebook_num_pairs(g.rb),
                      (long long)spconv_rulebook_num_active_offsets(g.rb));
        check_budgets(&g, dtype, c_in, c_out);
        spconv_rulebook_release(g.rb);
    }

    /* a budget that is not a number of KiB */
    geometry g = random_geometry(1);
    const int64_t n = spconv_rulebook_num_in(g.rb), kv = spconv_rulebook_kernel_volume(g.rb);
    spconv_tensor *x = random_tensor(SPCONV_F32, 2, (const int64_t[]){n, 8});
    spconv_tensor *w = random_tensor(SPCONV_F32, 3, (const int64_t[]){kv, 8, 8});
    spconv_tensor *xd = on_cuda(x), *wd = on_cuda(w), *y = NULL;
    static const char *bad[] = {"abc", "0", "-4", "12x", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        set_budget_kib(bad[i]);
        const spconv_status st = spconv_conv_forward(NULL, g.rb, xd, wd, NULL, &y);
        if (bad[i][0] == '\0') { /* empty: unset */
            SPCONV_ASSERT_OK(st);
            spconv_tensor_release(y);
            y = NULL;
            continue;
        }
        assert_int_equal(st, SPCONV_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(spconv_last_error(), "SPCONV_CUDA_CONV_WORKSPACE_KIB"));
        assert_null(y);
    }
    set_budget_kib(NULL);
    spconv_tensor *all[] = {x, w, xd, wd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    spconv_rulebook_release(g.rb);
}

/* A rulebook build on the device reads back twice, and the voxelizer too: the number of pairs (candidates) with the
 * validation marks and the site table's counters, and the offsets' counts (with a strided build's
 * number of outputs). The emulation counts each copy to the host and each synchronisation as a
 * wait: 4 + 2 for subm, 4 + 3 for a strided conv, 2 + 2 for the voxelizer. */
static void test_map_build_waits(void **state) {
    (void)state;
#if !SPCONV_CUDA_EMULATION
    print_message("skip: waits are counted by the host emulation only\n");
    skip();
#else
    SKIP_WITHOUT_DEVICE();
    device_input d = make_device_input(300, 4);
    const spconv_conv_kind kinds[2] = {SPCONV_CONV_SUBM, SPCONV_CONV_REGULAR};
    const unsigned long long most[2] = {6, 7};
    for (int i = 0; i < 2; ++i) {
        spconv_conv_params params = spconv_conv_params_default(kinds[i]);
        if (kinds[i] == SPCONV_CONV_REGULAR)
            for (int a = 0; a < 3; ++a) params.stride[a] = 2;
        spconv_rulebook *rb = NULL, *cpu = NULL;
        const unsigned long long before = HOST_WAITS();
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, d.id, SHAPE, 1, &params, &rb));
        const unsigned long long waits = HOST_WAITS() - before;
        print_message("%s rulebook: %llu waits\n", i == 0 ? "subm" : "strided", waits);
        assert_true(waits <= most[i]);
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, d.indices, SHAPE, 1, &params, &cpu));
        assert_int_equal(spconv_rulebook_num_pairs(rb), spconv_rulebook_num_pairs(cpu));
        assert_int_equal(spconv_rulebook_num_out(rb), spconv_rulebook_num_out(cpu));
        spconv_rulebook_release(rb);
        spconv_rulebook_release(cpu);
    }
    release_device_input(&d);

    /* The voxelizer: the voxel count with the table's counters, then the drop counts (4). */
    const int64_t n = 500;
    spconv_tensor *points = random_tensor(SPCONV_F32, 2, (const int64_t[]){n, 4});
    spconv_tensor *points_d = on_cuda(points);
    const spconv_voxelize_params params = {{0.25f, 0.25f, 0.25f},
                                           {-1.0f, -1.0f, -1.0f, 1.0f, 1.0f, 1.0f},
                                           5,
                                           INT64_MAX,
                                           SPCONV_VOXELIZE_MEAN};
    spconv_voxels v = {0}, c = {0};
    const unsigned long long before = HOST_WAITS();
    SPCONV_ASSERT_OK(spconv_voxelize(NULL, points_d, &params, &v));
    const unsigned long long waits = HOST_WAITS() - before;
    print_message("voxelizer: %llu waits\n", waits);
    assert_true(waits <= 4);
    SPCONV_ASSERT_OK(spconv_voxelize(NULL, points, &params, &c));
    assert_int_equal(spconv_tensor_size(v.coords, 0), spconv_tensor_size(c.coords, 0));
    assert_int_equal(v.stats.dropped_range, c.stats.dropped_range);
    spconv_voxels_release(&v);
    spconv_voxels_release(&c);
    spconv_tensor_release(points);
    spconv_tensor_release(points_d);
#endif
}

static void test_subm_conv_launches(void **state) {
    (void)state;
#if !SPCONV_CUDA_EMULATION
    print_message("skip: launches are counted by the host emulation only\n");
    skip();
#else
    SKIP_WITHOUT_DEVICE();
    set_budget_kib(NULL);
    device_input d = make_device_input(200, 32);
    spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_SUBM);
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, d.id, SHAPE, 1, &params, &rb));
    const int64_t k = spconv_rulebook_num_active_offsets(rb);
    spconv_tensor *w = random_tensor(SPCONV_F32, 3, (const int64_t[]){27, 32, 32});
    spconv_tensor *wd = on_cuda(w), *g = random_tensor(SPCONV_F32, 2, (const int64_t[]){200, 32});
    spconv_tensor *gd = on_cuda(g), *y = NULL, *dx = NULL, *dw = NULL, *db = NULL;
    const unsigned long long before = spconv__cuda_emulation_launches();
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, d.xd, wd, NULL, &y));
    const unsigned long long forward = spconv__cuda_emulation_launches() - before;
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, d.xd, wd, gd, &dx, &dw, &db));
    const unsigned long long backward = spconv__cuda_emulation_launches() - before - forward;
    print_message("subm conv, %lld active offsets: forward %llu launches, backward %llu\n",
                  (long long)k, forward, backward);
    assert_true(k > 8);
    assert_true(forward <= (unsigned long long)k + 4);
    assert_true(backward <= 2 * (unsigned long long)k + 8);
    spconv_tensor *all[] = {w, wd, g, gd, y, dx, dw, db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    spconv_rulebook_release(rb);
    release_device_input(&d);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_matches_cpu),
        cmocka_unit_test(test_bias_gradient_is_the_cpus_bit_for_bit),
        cmocka_unit_test(test_maxpool_matches_cpu),
        cmocka_unit_test(test_bad_argmax_on_device),
        cmocka_unit_test(test_unsupported_dtype),
        cmocka_unit_test(test_device_rulebook_with_cpu_features),
        cmocka_unit_test(test_net_layers_match_cpu),
        cmocka_unit_test(test_net_to_dense_bad_sites),
        cmocka_unit_test(test_kept_parameters_make_no_host_round_trip),
        cmocka_unit_test(test_layer_times_come_from_the_device_clock),
        cmocka_unit_test(test_dense_matches_cpu),
        cmocka_unit_test(test_zoo_networks_match_cpu),
        cmocka_unit_test(test_budgets_change_launches_not_sums),
        cmocka_unit_test(test_subm_conv_launches),
        cmocka_unit_test(test_map_build_waits),
    };
    spconv_test_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
