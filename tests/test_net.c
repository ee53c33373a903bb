/* Networks: forward against a layer-by-layer reference built here from the public conv API with
 * rulebooks built without the cache (so cache sharing, in-place work and skip connections are
 * checked), whole-sequence backward against central finite differences in f64, a training loop,
 * the zoo networks on synthetic input and on real scans (skipped when absent), weights saved and
 * loaded, and every error path with its status and message. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/test_util.h"
#include "core/backend.h"
#include "net/net_internal.h"
#include "spconv/io.h"
#include "spconv/net.h"

/* ---- small tensor helpers -------------------------------------------------------------------- */

static double get_value(const spconv_tensor *t, int64_t i) {
    return spconv_tensor_dtype(t) == SPCONV_F32 ? ((const float *)spconv_tensor_data(t))[i]
                                                : ((const double *)spconv_tensor_data(t))[i];
}

static void set_value(spconv_tensor *t, int64_t i, double v) {
    if (spconv_tensor_dtype(t) == SPCONV_F32)
        ((float *)spconv_tensor_data(t))[i] = (float)v;
    else
        ((double *)spconv_tensor_data(t))[i] = v;
}

static spconv_tensor *new_tensor(spconv_dtype dtype, int ndim, const int64_t *sizes) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), dtype, ndim, sizes, &t));
    return t;
}

static int all_finite(const spconv_tensor *t) {
    for (int64_t i = 0; i < spconv_tensor_numel(t); ++i)
        if (!isfinite(get_value(t, i))) return 0;
    return 1;
}

static void assert_sizes(const spconv_tensor *t, int ndim, const int64_t *sizes) {
    assert_int_equal(spconv_tensor_ndim(t), ndim);
    for (int i = 0; i < ndim; ++i) assert_int_equal(spconv_tensor_size(t, i), sizes[i]);
}

/* Largest |a - b| over two tensors of the same numel, and largest |b|. */
static double max_diff(const spconv_tensor *a, const spconv_tensor *b, double *scale) {
    assert_int_equal(spconv_tensor_numel(a), spconv_tensor_numel(b));
    double diff = 0.0;
    *scale = 0.0;
    for (int64_t i = 0; i < spconv_tensor_numel(a); ++i) {
        diff = fmax(diff, fabs(get_value(a, i) - get_value(b, i)));
        *scale = fmax(*scale, fabs(get_value(b, i)));
    }
    return diff;
}

/* ---- random sparse inputs -------------------------------------------------------------------- */

/* @p n unique random sites of batches 0..batch-1 inside the box [0, box) of spatial shape
 * @p shape (box <= shape), with features U(-1, 1) of @p channels. */
static spconv_sparse_tensor *random_input(spconv_dtype dtype, int64_t channels,
                                          const int64_t shape[3], const int64_t box[3],
                                          int64_t batch, int64_t n) {
    const int64_t cells = batch * box[0] * box[1] * box[2];
    assert_true(n <= cells / 2);
    unsigned char *used = calloc((size_t)cells, 1);
    assert_non_null(used);
    spconv_tensor *indices = new_tensor(SPCONV_I32, 2, (int64_t[]){n, 4});
    int32_t *rows = spconv_tensor_data(indices);
    for (int64_t r = 0; r < n;) {
        int64_t cell = spconv_test_rand_int(0, cells - 1);
        if (used[cell]) continue;
        used[cell] = 1;
        rows[4 * r + 3] = (int32_t)(cell % box[2]);
        rows[4 * r + 2] = (int32_t)(cell / box[2] % box[1]);
        rows[4 * r + 1] = (int32_t)(cell / (box[2] * box[1]) % box[0]);
        rows[4 * r + 0] = (int32_t)(cell / (box[2] * box[1] * box[0]));
        ++r;
    }
    free(used);
    spconv_tensor *features = new_tensor(dtype, 2, (int64_t[]){n, channels});
    for (int64_t i = 0; i < n * channels; ++i)
        set_value(features, i, spconv_test_rand_double(-1, 1));
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, shape, batch, &sp));
    spconv_tensor_release(features);
    spconv_tensor_release(indices);
    return sp;
}

/* Random values for every parameter and buffer (running var positive), so that batch norm in
 * inference mode is not the identity. */
static void randomise_params(spconv_net *net) {
    for (int p = 0; p < spconv_net_num_params(net); ++p) {
        spconv_tensor *t = spconv_net_param(net, p);
        int is_var = strstr(spconv_net_param_name(net, p), "running_var") != NULL;
        for (int64_t i = 0; i < spconv_tensor_numel(t); ++i)
            set_value(t, i,
                      is_var ? spconv_test_rand_double(0.5, 2.0)
                             : get_value(t, i) + spconv_test_rand_double(-0.3, 0.3));
    }
}

/* Zoo network @p name in @p dtype, initialised from @p seed; *input gets its input description. */
static spconv_net *zoo_net(const char *name, spconv_dtype dtype, uint64_t seed,
                           spconv_net_input *input) {
    SPCONV_ASSERT_OK(spconv_zoo_input(name, input));
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create(name, dtype, seed, &net));
    return net;
}

/* ---- reference forward: the public conv API, rulebooks built without the cache --------------- */

typedef struct ref_entry {
    const char *key;
    spconv_rulebook *rb;           /* CONV / MAXPOOL rulebooks by key */
    spconv_tensor *feat, *indices; /* SAVE: the saved tensor */
} ref_entry;

typedef struct ref_state {
    spconv_tensor *feat, *indices; /* current features [N, C] and sites [N, 4] */
    int64_t shape[3], batch;
    ref_entry entries[32];
    int num_entries;
} ref_state;

static spconv_tensor *param_of(const spconv_net *net, const char *layer, const char *suffix) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", layer, suffix);
    int index = spconv_net_find_param(net, name);
    return index < 0 ? NULL : spconv_net_param(net, index);
}

static void ref_set(ref_state *s, spconv_tensor *feat, spconv_tensor *indices) {
    spconv_tensor_release(s->feat);
    spconv_tensor_release(s->indices);
    s->feat = feat;
    s->indices = indices;
}

static void ref_conv(ref_state *s, const spconv_net *net, const spconv_layer_desc *d) {
    static const spconv_conv_kind kinds[] = {SPCONV_CONV_SUBM, SPCONV_CONV_REGULAR,
                                             SPCONV_CONV_TRANSPOSED};
    spconv_rulebook *rb = NULL;
    if (d->kind == SPCONV_LAYER_INVERSE) {
        int j = s->num_entries - 1;
        while (j >= 0 && !(s->entries[j].rb != NULL && strcmp(s->entries[j].key, d->key) == 0)) --j;
        assert_true(j >= 0);
        SPCONV_ASSERT_OK(spconv_rulebook_inverse(s->entries[j].rb, &rb));
    } else {
        spconv_conv_params p = spconv_conv_params_default(
            d->kind == SPCONV_LAYER_MAXPOOL ? SPCONV_CONV_REGULAR : kinds[d->kind]);
        memcpy(p.kernel, d->kernel, sizeof p.kernel);
        memcpy(p.stride, d->stride, sizeof p.stride);
        memcpy(p.padding, d->padding, sizeof p.padding);
        memcpy(p.dilation, d->dilation, sizeof p.dilation);
        memcpy(p.output_padding, d->output_padding, sizeof p.output_padding);
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, s->indices, s->shape, s->batch, &p, &rb));
    }
    spconv_tensor *y = NULL;
    if (d->kind == SPCONV_LAYER_MAXPOOL)
        SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, rb, s->feat, &y, NULL));
    else
        SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, s->feat, param_of(net, d->name, "weight"),
                                             d->bias ? param_of(net, d->name, "bias") : NULL, &y));
    spconv_tensor *out_indices = spconv_rulebook_out_indices(rb);
    spconv_tensor_retain(out_indices);
    ref_set(s, y, out_indices);
    spconv_rulebook_out_shape(rb, s->shape);
    if ((d->kind == SPCONV_LAYER_CONV || d->kind == SPCONV_LAYER_MAXPOOL) && d->key != NULL) {
        assert_true(s->num_entries < 32);
        s->entries[s->num_entries++] = (ref_entry){.key = d->key, .rb = rb};
    } else {
        spconv_rulebook_release(rb);
    }
}

static void ref_elementwise(ref_state *s, const spconv_net *net, const spconv_layer_desc *d) {
    const int64_t n = spconv_tensor_size(s->feat, 0), c = spconv_tensor_size(s->feat, 1);
    spconv_tensor *y = new_tensor(spconv_tensor_dtype(s->feat), 2, (int64_t[]){n, c});
    for (int64_t r = 0; r < n; ++r)
        for (int64_t ch = 0; ch < c; ++ch) {
            double x = get_value(s->feat, r * c + ch), v;
            if (d->kind == SPCONV_LAYER_RELU) {
                v = x > 0 ? x : 0;
            } else {
                double mean = get_value(param_of(net, d->name, "running_mean"), ch);
                double var = get_value(param_of(net, d->name, "running_var"), ch);
                v = (x - mean) / sqrt(var + d->eps) *
                        get_value(param_of(net, d->name, "weight"), ch) +
                    get_value(param_of(net, d->name, "bias"), ch);
            }
            set_value(y, r * c + ch, v);
        }
    spconv_tensor_retain(s->indices);
    ref_set(s, y, s->indices);
}

static void ref_concat(ref_state *s, const spconv_layer_desc *d) {
    int j = s->num_entries - 1;
    while (j >= 0 && !(s->entries[j].feat != NULL && strcmp(s->entries[j].key, d->key) == 0)) --j;
    assert_true(j >= 0);
    const spconv_tensor *saved = s->entries[j].feat;
    const int64_t n = spconv_tensor_size(s->feat, 0), c1 = spconv_tensor_size(s->feat, 1),
                  c2 = spconv_tensor_size(saved, 1);
    assert_int_equal(spconv_tensor_size(saved, 0), n);
    assert_memory_equal(spconv_tensor_data(s->entries[j].indices), spconv_tensor_data(s->indices),
                        (size_t)n * 4 * sizeof(int32_t));
    spconv_tensor *y = new_tensor(spconv_tensor_dtype(s->feat), 2, (int64_t[]){n, c1 + c2});
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t ch = 0; ch < c1; ++ch)
            set_value(y, r * (c1 + c2) + ch, get_value(s->feat, r * c1 + ch));
        for (int64_t ch = 0; ch < c2; ++ch)
            set_value(y, r * (c1 + c2) + c1 + ch, get_value(saved, r * c2 + ch));
    }
    spconv_tensor_retain(s->indices);
    ref_set(s, y, s->indices);
}

/* Dense [B, C*D, H, W] with channel c*D + z, written from the definition. */
static spconv_tensor *ref_to_dense(const ref_state *s) {
    const int64_t n = spconv_tensor_size(s->feat, 0), c = spconv_tensor_size(s->feat, 1);
    const int64_t D = s->shape[0], H = s->shape[1], W = s->shape[2];
    spconv_tensor *dense =
        new_tensor(spconv_tensor_dtype(s->feat), 4, (int64_t[]){s->batch, c * D, H, W});
    const int32_t *idx = spconv_tensor_data(s->indices);
    for (int64_t r = 0; r < n; ++r)
        for (int64_t ch = 0; ch < c; ++ch) {
            const int32_t *q = idx + 4 * r;
            int64_t at = ((q[0] * c * D + ch * D + q[1]) * H + q[2]) * W + q[3];
            set_value(dense, at, get_value(s->feat, r * c + ch));
        }
    return dense;
}

/* The output of @p net (inference) on @p in, computed layer by layer from the definitions. */
static spconv_tensor *reference_forward(const spconv_net *net, const spconv_sparse_tensor *in) {
    ref_state s = {0};
    spconv_tensor_retain(spconv_sparse_features(in));
    spconv_tensor_retain(spconv_sparse_indices(in));
    ref_set(&s, spconv_sparse_features(in), spconv_sparse_indices(in));
    spconv_sparse_spatial_shape(in, s.shape);
    s.batch = spconv_sparse_batch_size(in);
    spconv_tensor *result = NULL;
    for (int i = 0; i < spconv_net_num_layers(net); ++i) {
        const spconv_layer_desc *d = spconv_net_layer(net, i);
        switch (d->kind) {
        case SPCONV_LAYER_BATCHNORM:
        case SPCONV_LAYER_RELU: ref_elementwise(&s, net, d); break;
        case SPCONV_LAYER_SAVE:
            spconv_tensor_retain(s.feat);
            spconv_tensor_retain(s.indices);
            s.entries[s.num_entries++] =
                (ref_entry){.key = d->key, .feat = s.feat, .indices = s.indices};
            break;
        case SPCONV_LAYER_CONCAT: ref_concat(&s, d); break;
        case SPCONV_LAYER_TO_DENSE: result = ref_to_dense(&s); break;
        default: ref_conv(&s, net, d); break;
        }
    }
    if (result == NULL) {
        result = s.feat;
        s.feat = NULL;
    }
    ref_set(&s, NULL, NULL);
    for (int j = 0; j < s.num_entries; ++j) {
        spconv_rulebook_release(s.entries[j].rb);
        spconv_tensor_release(s.entries[j].feat);
        spconv_tensor_release(s.entries[j].indices);
    }
    return result;
}

/* Forward in inference mode against the reference, within @p tolerance of the output's scale. */
static void check_against_reference(spconv_net *net, const spconv_sparse_tensor *in,
                                    double tolerance) {
    spconv_tensor *out = NULL, *ref = reference_forward(net, in);
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL));
    assert_sizes(out, spconv_tensor_ndim(ref), spconv_tensor_sizes(ref));
    double scale, diff = max_diff(out, ref, &scale);
    printf("  forward vs reference: max |diff| %.3g over output scale %.3g\n", diff, scale);
    assert_true(diff <= tolerance * (1.0 + scale));
    assert_true(scale > 0.0); /* a zero output would prove nothing */
    spconv_tensor_release(out);
    spconv_tensor_release(ref);
}

/* ---- networks used by several tests ---------------------------------------------------------- */

/* Every layer kind, a SAVE followed by an in-place-capable ReLU, and a ReLU on the caller's input.
 */
static const spconv_layer_desc all_kinds_net[] = {
    {.kind = SPCONV_LAYER_RELU, .name = "relu_in"},
    {.kind = SPCONV_LAYER_SUBM, .name = "c1", .in_channels = 3, .out_channels = 5,
     .kernel = {3, 3, 3}, .bias = 1, .key = "s1"},
    {.kind = SPCONV_LAYER_SAVE, .name = "keep", .key = "k"},
    {.kind = SPCONV_LAYER_RELU, .name = "r1"},
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn1", .in_channels = 5},
    {.kind = SPCONV_LAYER_CONCAT, .name = "cat", .key = "k"},
    {.kind = SPCONV_LAYER_SUBM, .name = "c2", .in_channels = 10, .out_channels = 4,
     .kernel = {3, 1, 3}, .key = "s2"},
    {.kind = SPCONV_LAYER_MAXPOOL, .name = "pool", .kernel = {2, 2, 2}, .stride = {2, 2, 2},
     .key = "p"},
    {.kind = SPCONV_LAYER_CONV, .name = "down", .in_channels = 4, .out_channels = 6,
     .kernel = {3, 3, 3}, .stride = {1, 2, 2}, .padding = {1, 1, 1}, .key = "d"},
    {.kind = SPCONV_LAYER_INVERSE, .name = "up", .in_channels = 6, .out_channels = 4,
     .kernel = {3, 3, 3}, .key = "d"},
    {.kind = SPCONV_LAYER_INVERSE, .name = "unpool", .in_channels = 4, .out_channels = 3,
     .key = "p"},
    {.kind = SPCONV_LAYER_TRANSPOSED, .name = "tr", .in_channels = 3, .out_channels = 2,
     .kernel = {2, 2, 2}, .stride = {2, 2, 2}, .bias = 1},
    {.kind = SPCONV_LAYER_TO_DENSE, .name = "bev"},
};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static spconv_net *create_net(spconv_dtype dtype, int64_t in_channels,
                              const spconv_layer_desc *layers, int n) {
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(
        spconv_net_create(dtype, in_channels, layers, n, spconv_test_rand_u64(), &net));
    return net;
}

/* ---- forward against the reference ----------------------------------------------------------- */

static void test_forward_all_kinds_matches_reference(void **state) {
    (void)state;
    spconv_net *net = create_net(SPCONV_F64, 3, all_kinds_net, COUNT(all_kinds_net));
    randomise_params(net);
    const int64_t shape[3] = {7, 10, 9};
    spconv_sparse_tensor *in = random_input(SPCONV_F64, 3, shape, shape, 2, 150);
    spconv_tensor *before = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_clone(NULL, spconv_sparse_features(in), &before));
    check_against_reference(net, in, 1e-12);
    /* The first layer is a ReLU: it must not have written into the caller's features. */
    double scale;
    assert_true(max_diff(spconv_sparse_features(in), before, &scale) == 0.0);
    /* A second run reuses the cached rulebooks and gives bitwise the same output. */
    spconv_tensor *a = NULL, *b = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &a, NULL));
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &b, NULL));
    assert_true(max_diff(a, b, &scale) == 0.0);
    assert_int_equal(spconv_net_out_channels(net), 2);
    spconv_tensor_release(a);
    spconv_tensor_release(b);
    spconv_tensor_release(before);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

static void test_unet_matches_reference(void **state) {
    (void)state;
    spconv_net_input input;
    spconv_net *net = zoo_net("unet", SPCONV_F64, spconv_test_rand_u64(), &input);
    randomise_params(net);
    spconv_sparse_tensor *in =
        random_input(SPCONV_F64, 4, input.spatial_shape, (int64_t[]){8, 24, 24}, 1, 1500);
    check_against_reference(net, in, 1e-10);
    /* Output on the input sites, in their order. */
    spconv_tensor *out = NULL;
    spconv_sparse_tensor *out_sp = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, &out_sp));
    assert_sizes(out, 2, (int64_t[]){1500, 16});
    assert_memory_equal(spconv_tensor_data(spconv_sparse_indices(out_sp)),
                        spconv_tensor_data(spconv_sparse_indices(in)), 1500 * 4 * sizeof(int32_t));
    spconv_tensor_release(out);
    spconv_sparse_release(out_sp);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

/* second on a synthetic cluster: output shape, the BEV channel order against the final sparse
 * tensor, and the reference (f32). */
static void test_second_synthetic(void **state) {
    (void)state;
    spconv_net_input input;
    spconv_net *net = zoo_net("second", SPCONV_F32, spconv_test_rand_u64(), &input);
    randomise_params(net);
    assert_int_equal(input.spatial_shape[0], 41);
    assert_int_equal(input.spatial_shape[1], 1600);
    assert_int_equal(input.spatial_shape[2], 1408);
    spconv_sparse_tensor *in =
        random_input(SPCONV_F32, 4, input.spatial_shape, (int64_t[]){20, 48, 48}, 1, 3000);
    spconv_tensor *out = NULL;
    spconv_sparse_tensor *last = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, &last));
    assert_sizes(out, 4, (int64_t[]){1, 256, 200, 176});
    assert_true(all_finite(out));
    int64_t shape[3];
    spconv_sparse_spatial_shape(last, shape);
    assert_int_equal(shape[0], 2);
    assert_int_equal(shape[1], 200);
    assert_int_equal(shape[2], 176);
    /* Channel c*2 + z of the map is feature c of the site at height z. */
    const spconv_tensor *f = spconv_sparse_features(last);
    const int32_t *idx = spconv_tensor_data(spconv_sparse_indices(last));
    assert_true(spconv_sparse_num_sites(last) > 0);
    for (int64_t r = 0; r < spconv_sparse_num_sites(last); ++r)
        for (int64_t c = 0; c < 128; c += 9) {
            int64_t at = ((c * 2 + idx[4 * r + 1]) * 200 + idx[4 * r + 2]) * 176 + idx[4 * r + 3];
            assert_true(get_value(out, at) == get_value(f, r * 128 + c));
        }
    check_against_reference(net, in, 1e-4);
    spconv_tensor_release(out);
    spconv_sparse_release(last);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

static void test_basic_synthetic(void **state) {
    (void)state;
    spconv_net_input input;
    spconv_net *net = zoo_net("basic", SPCONV_F32, spconv_test_rand_u64(), &input);
    assert_int_equal(spconv_net_num_layers(net), 20);
    int subm = 0, pools = 0;
    for (int i = 0; i < 20; ++i) {
        const spconv_layer_desc *d = spconv_net_layer(net, i);
        subm += d->kind == SPCONV_LAYER_SUBM && !d->bias;
        pools += d->kind == SPCONV_LAYER_MAXPOOL;
    }
    assert_int_equal(subm, 14);
    assert_int_equal(pools, 6);
    assert_int_equal(spconv_net_num_params(net), 14); /* weights only, no bias */
    spconv_sparse_tensor *in =
        random_input(SPCONV_F32, 3, input.spatial_shape, (int64_t[]){32, 40, 40}, 1, 4000);
    spconv_tensor *out = NULL;
    spconv_sparse_tensor *last = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, &last));
    assert_int_equal(spconv_tensor_size(out, 1), 256);
    assert_true(spconv_tensor_size(out, 0) > 0);
    assert_true(all_finite(out));
    int64_t shape[3];
    spconv_sparse_spatial_shape(last, shape);
    assert_int_equal(shape[0], 1);
    assert_int_equal(shape[1], 25);
    assert_int_equal(shape[2], 25);
    check_against_reference(net, in, 1e-4);
    spconv_tensor_release(out);
    spconv_sparse_release(last);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

/* The dense map's buffer is reused only once the caller let go of the previous map. */
static void test_dense_output_reuse(void **state) {
    (void)state;
    spconv_net *net = create_net(SPCONV_F32, 3, all_kinds_net, COUNT(all_kinds_net));
    const int64_t shape[3] = {7, 10, 9};
    spconv_sparse_tensor *a = random_input(SPCONV_F32, 3, shape, shape, 1, 150);
    spconv_sparse_tensor *b = random_input(SPCONV_F32, 3, shape, shape, 1, 40);
    spconv_tensor *out_a = NULL, *out_b = NULL, *copy_a = NULL, *again = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, a, SPCONV_NET_INFERENCE, &out_a, NULL));
    SPCONV_ASSERT_OK(spconv_tensor_clone(NULL, out_a, &copy_a));
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, b, SPCONV_NET_INFERENCE, &out_b, NULL));
    double scale;
    assert_true(max_diff(out_a, copy_a, &scale) == 0.0); /* still held: not overwritten */
    assert_true(spconv_tensor_data(out_a) != spconv_tensor_data(out_b));
    spconv_tensor_release(out_a);
    spconv_tensor_release(out_b);
    /* Both released: the next map reuses a buffer that held b's sites, which must be cleared. */
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, a, SPCONV_NET_INFERENCE, &again, NULL));
    assert_true(max_diff(again, copy_a, &scale) == 0.0);
    spconv_tensor_release(again);
    spconv_tensor_release(copy_a);
    spconv_sparse_release(a);
    spconv_sparse_release(b);
    spconv_net_destroy(net);
}

/* ---- backward against finite differences ----------------------------------------------------- */

/* L = sum(out * R) after a training forward. */
static double loss_of(spconv_net *net, const spconv_sparse_tensor *in, const spconv_tensor *r) {
    spconv_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_TRAINING, &out, NULL));
    double loss = 0.0;
    for (int64_t i = 0; i < spconv_tensor_numel(out); ++i)
        loss += get_value(out, i) * get_value(r, i);
    spconv_tensor_release(out);
    return loss;
}

typedef struct fd_count {
    int checked, kinks;
} fd_count;

/* Compare d L / d t[i] = @p analytic with central differences. A kink (ReLU, max pool) between
 * x - h and x + h shows as one-sided differences that disagree more than the mismatch: such a
 * point is skipped and counted. */
static void check_fd(spconv_net *net, const spconv_sparse_tensor *in, const spconv_tensor *r,
                     spconv_tensor *t, int64_t i, double analytic, const char *what,
                     fd_count *count) {
    const double h = 1e-6, x = get_value(t, i);
    set_value(t, i, x + h);
    double plus = loss_of(net, in, r);
    set_value(t, i, x - h);
    double minus = loss_of(net, in, r);
    set_value(t, i, x);
    double centre = loss_of(net, in, r);
    double fd = (plus - minus) / (2 * h), mismatch = fabs(fd - analytic);
    ++count->checked;
    if (mismatch <= 1e-6 * (1.0 + fabs(analytic))) return;
    double one_sided_gap = fabs((plus - centre) / h - (centre - minus) / h);
    if (one_sided_gap > mismatch) {
        ++count->kinks;
        return;
    }
    fail_msg("%s element %lld: backward %.10g, finite differences %.10g", what, (long long)i,
             analytic, fd);
}

static void gradient_check(const spconv_layer_desc *layers, int num_layers, int64_t in_channels,
                           const int64_t shape[3], int64_t batch, int64_t sites) {
    spconv_net *net = create_net(SPCONV_F64, in_channels, layers, num_layers);
    randomise_params(net);
    spconv_sparse_tensor *in = random_input(SPCONV_F64, in_channels, shape, shape, batch, sites);
    spconv_tensor *out = NULL, *grad_in = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_TRAINING, &out, NULL));
    spconv_tensor *r = new_tensor(SPCONV_F64, spconv_tensor_ndim(out), spconv_tensor_sizes(out));
    for (int64_t i = 0; i < spconv_tensor_numel(r); ++i)
        set_value(r, i, spconv_test_rand_double(-1, 1));
    SPCONV_ASSERT_OK(spconv_net_backward(NULL, net, r, &grad_in));
    assert_sizes(grad_in, 2, spconv_tensor_sizes(spconv_sparse_features(in)));
    /* Keep the analytic gradients: the finite-difference passes run forwards only. */
    const int np = spconv_net_num_params(net);
    spconv_tensor **grads = calloc((size_t)np, sizeof *grads);
    for (int p = 0; p < np; ++p) {
        if (!spconv_net_param_trainable(net, p)) {
            assert_null(spconv_net_param_grad(net, p));
            continue;
        }
        assert_non_null(spconv_net_param_grad(net, p));
        SPCONV_ASSERT_OK(spconv_tensor_clone(NULL, spconv_net_param_grad(net, p), &grads[p]));
    }
    fd_count count = {0, 0};
    spconv_tensor *x = spconv_sparse_features(in);
    for (int64_t i = 0; i < spconv_tensor_numel(x); ++i)
        check_fd(net, in, r, x, i, get_value(grad_in, i), "input", &count);
    for (int p = 0; p < np; ++p) {
        if (grads[p] == NULL) continue;
        spconv_tensor *value = spconv_net_param(net, p);
        for (int s = 0; s < 6; ++s) {
            int64_t i = spconv_test_rand_int(0, spconv_tensor_numel(value) - 1);
            check_fd(net, in, r, value, i, get_value(grads[p], i), spconv_net_param_name(net, p),
                     &count);
        }
        spconv_tensor_release(grads[p]);
    }
    printf("  %d gradients checked, %d skipped at kinks\n", count.checked, count.kinks);
    assert_true(count.kinks * 50 <= count.checked);
    free(grads);
    spconv_tensor_release(r);
    spconv_tensor_release(out);
    spconv_tensor_release(grad_in);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

/* subm, sparse conv, BN (training), ReLU, inverse conv, and a skip connection around them. */
static void test_backward_unet_like_matches_finite_differences(void **state) {
    (void)state;
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "c1", .in_channels = 3, .out_channels = 4,
         .kernel = {3, 3, 3}, .bias = 1, .key = "s1"},
        {.kind = SPCONV_LAYER_SAVE, .name = "keep", .key = "x1"},
        {.kind = SPCONV_LAYER_CONV, .name = "down", .in_channels = 4, .out_channels = 5,
         .kernel = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}, .key = "d"},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 5},
        {.kind = SPCONV_LAYER_RELU, .name = "relu"},
        {.kind = SPCONV_LAYER_INVERSE, .name = "up", .in_channels = 5, .out_channels = 4,
         .kernel = {3, 3, 3}, .key = "d"},
        {.kind = SPCONV_LAYER_CONCAT, .name = "cat", .key = "x1"},
        {.kind = SPCONV_LAYER_SUBM, .name = "c2", .in_channels = 8, .out_channels = 3,
         .kernel = {3, 3, 3}, .key = "s1"},
    };
    gradient_check(layers, COUNT(layers), 3, (int64_t[]){6, 7, 8}, 2, 45);
}

/* max pool, BN, ReLU, transposed conv, to-dense. */
static void test_backward_pool_dense_matches_finite_differences(void **state) {
    (void)state;
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "c1", .in_channels = 2, .out_channels = 3,
         .kernel = {3, 3, 3}},
        {.kind = SPCONV_LAYER_MAXPOOL, .name = "pool", .kernel = {2, 2, 2}, .stride = {2, 2, 2}},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 3},
        {.kind = SPCONV_LAYER_RELU, .name = "relu"},
        {.kind = SPCONV_LAYER_TRANSPOSED, .name = "tr", .in_channels = 3, .out_channels = 2,
         .kernel = {2, 2, 2}, .stride = {2, 2, 2}, .bias = 1},
        {.kind = SPCONV_LAYER_TO_DENSE, .name = "bev"},
    };
    gradient_check(layers, COUNT(layers), 2, (int64_t[]){6, 6, 8}, 2, 40);
}

/* Every layer kind, including a ReLU on the input and a ReLU after a SAVE. */
static void test_backward_all_kinds_matches_finite_differences(void **state) {
    (void)state;
    gradient_check(all_kinds_net, COUNT(all_kinds_net), 3, (int64_t[]){7, 10, 9}, 2, 60);
}

/* ---- training -------------------------------------------------------------------------------- */

static double mse_and_grad(const spconv_tensor *out, const spconv_tensor *target,
                           spconv_tensor *grad) {
    const int64_t n = spconv_tensor_numel(out);
    double loss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        double d = get_value(out, i) - get_value(target, i);
        loss += d * d / (double)n;
        set_value(grad, i, 2.0 * d / (double)n);
    }
    return loss;
}

static void test_training_lowers_loss(void **state) {
    (void)state;
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "c1", .in_channels = 3, .out_channels = 8,
         .kernel = {3, 3, 3}, .bias = 1, .key = "a"},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn1", .in_channels = 8},
        {.kind = SPCONV_LAYER_RELU, .name = "r1"},
        {.kind = SPCONV_LAYER_SUBM, .name = "c2", .in_channels = 8, .out_channels = 8,
         .kernel = {3, 3, 3}, .key = "a"},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn2", .in_channels = 8},
        {.kind = SPCONV_LAYER_RELU, .name = "r2"},
        {.kind = SPCONV_LAYER_SUBM, .name = "head", .in_channels = 8, .out_channels = 2,
         .kernel = {1, 1, 1}, .bias = 1},
    };
    spconv_net *net = create_net(SPCONV_F32, 3, layers, COUNT(layers));
    const int64_t shape[3] = {8, 16, 16};
    spconv_sparse_tensor *in = random_input(SPCONV_F32, 3, shape, shape, 1, 300);
    spconv_tensor *target = new_tensor(SPCONV_F32, 2, (int64_t[]){300, 2});
    spconv_tensor *grad = new_tensor(SPCONV_F32, 2, (int64_t[]){300, 2});
    for (int64_t i = 0; i < 600; ++i) set_value(target, i, spconv_test_rand_double(-1, 1));
    SPCONV_ASSERT_FAILS(spconv_net_sgd_step(NULL, net, 0.1), SPCONV_ERR_INVALID_ARGUMENT,
                        "no gradients");
    double first = 0.0, last = 0.0;
    for (int step = 0; step < 40; ++step) {
        spconv_tensor *out = NULL;
        SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_TRAINING, &out, NULL));
        last = mse_and_grad(out, target, grad);
        if (step == 0) first = last;
        SPCONV_ASSERT_OK(spconv_net_backward(NULL, net, grad, NULL));
        SPCONV_ASSERT_OK(spconv_net_sgd_step(NULL, net, 0.2));
        spconv_tensor_release(out);
    }
    printf("  MSE %.4f -> %.4f after 40 SGD steps\n", first, last);
    assert_true(isfinite(last));
    assert_true(last < 0.7 * first);
    /* The running statistics moved away from their initial 0 / 1. */
    spconv_tensor *mean = spconv_net_param(net, spconv_net_find_param(net, "bn1.running_mean"));
    double moved = 0.0;
    for (int64_t i = 0; i < 8; ++i) moved += fabs(get_value(mean, i));
    assert_true(moved > 0.0);
    spconv_tensor_release(target);
    spconv_tensor_release(grad);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

/* ---- statistics and progress ----------------------------------------------------------------- */

typedef struct progress_log {
    int calls, backward_calls, last_index, in_order;
} progress_log;

static void on_progress(void *user, const spconv_layer_stats *stats, int num_layers, int backward) {
    progress_log *log = user;
    int expected = backward ? num_layers - 1 - log->backward_calls : log->calls;
    if (stats->index != expected) log->in_order = 0;
    if (backward)
        ++log->backward_calls;
    else
        ++log->calls;
}

static void test_stats_and_progress(void **state) {
    (void)state;
    spconv_net *net = create_net(SPCONV_F32, 3, all_kinds_net, COUNT(all_kinds_net));
    progress_log log = {0, 0, -1, 1};
    spconv_net_set_progress(net, on_progress, &log);
    const int64_t shape[3] = {7, 10, 9};
    spconv_sparse_tensor *in = random_input(SPCONV_F32, 3, shape, shape, 1, 120);
    spconv_tensor *out = NULL, *grad = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_TRAINING, &out, NULL));
    const int n = spconv_net_num_layers(net);
    assert_int_equal(log.calls, n);
    SPCONV_ASSERT_OK(
        spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 4, spconv_tensor_sizes(out), &grad));
    SPCONV_ASSERT_OK(spconv_net_backward(NULL, net, grad, NULL));
    assert_int_equal(log.backward_calls, n);
    assert_true(log.in_order);
    for (int i = 0; i < n; ++i) {
        const spconv_layer_stats *s = spconv_net_stats(net, i);
        assert_int_equal(s->index, i);
        assert_string_equal(s->name, spconv_net_layer(net, i)->name);
        const spconv_phase_ms *f = &s->forward;
        double parts = f->rulebook + f->gather + f->gemm + f->scatter + f->other;
        assert_true(f->total >= 0.0 && fabs(parts - f->total) <= 1e-6 + 1e-9 * f->total);
        if (i > 0) assert_int_equal(s->sites_in, spconv_net_stats(net, i - 1)->sites_out);
        if (s->kind == SPCONV_LAYER_SUBM) assert_true(s->pairs >= s->sites_in);
        if (s->kind == SPCONV_LAYER_SUBM)
            assert_true(s->flops ==
                        2.0 * (double)s->pairs * (double)s->channels_in * (double)s->channels_out);
    }
    assert_int_equal(spconv_net_stats(net, 0)->sites_in, 120);
    assert_int_equal(spconv_net_stats(net, n - 1)->channels_out, 2 * 14); /* C * D after "tr" */
    assert_null(spconv_net_stats(net, n));
    spconv_tensor_release(out);
    spconv_tensor_release(grad);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

/* ---- weights --------------------------------------------------------------------------------- */

/* A fresh folder under /tmp; remove_folder deletes its files and itself. */
static char *make_folder(void) {
    char *dir = malloc(64);
    snprintf(dir, 64, "/tmp/spconv_test_net_XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_folder(const spconv_net *net, char *dir) {
    char path[512];
    for (int p = 0; p < spconv_net_num_params(net); ++p) {
        snprintf(path, sizeof path, "%s/%s.npy", dir, spconv_net_param_name(net, p));
        remove(path);
    }
    rmdir(dir);
    free(dir);
}

static void assert_same_params(const spconv_net *a, const spconv_net *b) {
    assert_int_equal(spconv_net_num_params(a), spconv_net_num_params(b));
    for (int p = 0; p < spconv_net_num_params(a); ++p) {
        const spconv_tensor *x = spconv_net_param(a, p), *y = spconv_net_param(b, p);
        assert_int_equal(spconv_tensor_numel(x), spconv_tensor_numel(y));
        assert_memory_equal(spconv_tensor_data(x), spconv_tensor_data(y),
                            (size_t)spconv_tensor_numel(x) *
                                spconv_dtype_size(spconv_tensor_dtype(x)));
    }
}

static void test_weights_round_trip(void **state) {
    (void)state;
    spconv_net *a = NULL, *b = NULL, *c = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create("unet", SPCONV_F32, spconv_test_rand_u64(), &a));
    randomise_params(a);
    SPCONV_ASSERT_OK(spconv_zoo_create("unet", SPCONV_F32, spconv_test_rand_u64(), &b));
    SPCONV_ASSERT_OK(spconv_zoo_create("unet", SPCONV_F32, spconv_test_rand_u64(), &c));
    char *dir = make_folder();
    SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, a, dir, SPCONV_NET_LAYOUT_AUTO));
    SPCONV_ASSERT_OK(spconv_net_load_weights(NULL, b, dir, SPCONV_NET_LAYOUT_AUTO));
    assert_same_params(a, b);
    /* spconv 2.x layout: element [co, kz, ky, kx, ci] of the file is W[k][ci][co]. */
    SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, a, dir, SPCONV_NET_LAYOUT_KRSC));
    char path[512];
    snprintf(path, sizeof path, "%s/conv2.0.0.weight.npy", dir);
    spconv_tensor *krsc = NULL;
    SPCONV_ASSERT_OK(spconv_npy_read(path, &krsc));
    assert_sizes(krsc, 5, (int64_t[]){32, 3, 3, 3, 16});
    const spconv_tensor *w = spconv_net_param(a, spconv_net_find_param(a, "conv2.0.0.weight"));
    for (int s = 0; s < 50; ++s) {
        int64_t co = spconv_test_rand_int(0, 31), k = spconv_test_rand_int(0, 26),
                ci = spconv_test_rand_int(0, 15);
        assert_true(get_value(krsc, (co * 27 + k) * 16 + ci) ==
                    get_value(w, (k * 16 + ci) * 32 + co));
    }
    spconv_tensor_release(krsc);
    SPCONV_ASSERT_OK(spconv_net_load_weights(NULL, c, dir, SPCONV_NET_LAYOUT_AUTO));
    assert_same_params(a, c);
    remove_folder(a, dir);
    spconv_net_destroy(a);
    spconv_net_destroy(b);
    spconv_net_destroy(c);
}

/* Same seed, same values; another seed, other values; BN starts at gamma 1, beta 0, 0 / 1. */
static void test_seeded_initialisation(void **state) {
    (void)state;
    uint64_t seed = spconv_test_rand_u64();
    spconv_net *a = NULL, *b = NULL, *c = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create("second", SPCONV_F32, seed, &a));
    SPCONV_ASSERT_OK(spconv_zoo_create("second", SPCONV_F32, seed, &b));
    SPCONV_ASSERT_OK(spconv_zoo_create("second", SPCONV_F32, seed + 1, &c));
    assert_same_params(a, b);
    const int w = spconv_net_find_param(a, "conv2.0.0.weight");
    assert_true(w >= 0);
    const spconv_tensor *wa = spconv_net_param(a, w), *wc = spconv_net_param(c, w);
    double bound = sqrt(6.0 / (27.0 * 16.0)), sum_sq = 0.0;
    int differ = 0;
    for (int64_t i = 0; i < spconv_tensor_numel(wa); ++i) {
        assert_true(fabs(get_value(wa, i)) <= bound);
        sum_sq += get_value(wa, i) * get_value(wa, i);
        differ += get_value(wa, i) != get_value(wc, i);
    }
    /* U(-b, b) has variance b^2 / 3. */
    double var = sum_sq / (double)spconv_tensor_numel(wa);
    assert_true(fabs(var - bound * bound / 3.0) < 0.1 * bound * bound / 3.0);
    assert_true(differ > spconv_tensor_numel(wa) / 2);
    static const char *const bn[4] = {"weight", "bias", "running_mean", "running_var"};
    static const double bn_init[4] = {1.0, 0.0, 0.0, 1.0};
    for (int k = 0; k < 4; ++k) {
        char name[64];
        snprintf(name, sizeof name, "conv_out.1.%s", bn[k]);
        int p = spconv_net_find_param(a, name);
        assert_true(p >= 0);
        assert_int_equal(spconv_net_param_trainable(a, p), k < 2);
        for (int64_t i = 0; i < 128; ++i)
            assert_true(get_value(spconv_net_param(a, p), i) == bn_init[k]);
    }
    assert_int_equal(spconv_net_find_param(a, "conv_out.0.bias"), -1); /* bias=False */
    spconv_net_destroy(a);
    spconv_net_destroy(b);
    spconv_net_destroy(c);
}

/* Write a .npy file of zeros. */
static void write_zeros(const char *path, spconv_dtype dtype, int ndim, const int64_t *sizes) {
    spconv_tensor *t = new_tensor(dtype, ndim, sizes);
    SPCONV_ASSERT_OK(spconv_npy_write(NULL, path, t));
    spconv_tensor_release(t);
}

static void test_bad_weight_files(void **state) {
    (void)state;
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "conv1", .in_channels = 2, .out_channels = 3,
         .kernel = {3, 3, 3}, .bias = 1},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn1", .in_channels = 3},
    };
    const uint64_t seed = spconv_test_rand_u64();
    spconv_net *net = NULL, *twin = NULL;
    SPCONV_ASSERT_OK(spconv_net_create(SPCONV_F32, 2, layers, COUNT(layers), seed, &net));
    SPCONV_ASSERT_OK(spconv_net_create(SPCONV_F32, 2, layers, COUNT(layers), seed, &twin));
    char *dir = make_folder(), var[512], weight[512];
    SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, net, dir, SPCONV_NET_LAYOUT_RSCK));
    snprintf(var, sizeof var, "%s/bn1.running_var.npy", dir);
    snprintf(weight, sizeof weight, "%s/conv1.weight.npy", dir);
    remove(var);
    SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, net, dir, SPCONV_NET_LAYOUT_AUTO),
                        SPCONV_ERR_NOT_FOUND, "parameter 'bn1.running_var' has no file");
    write_zeros(var, SPCONV_F32, 1, (int64_t[]){4});
    SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, net, dir, SPCONV_NET_LAYOUT_AUTO),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "parameter 'bn1.running_var' has shape [4], but the network needs [3]");
    write_zeros(var, SPCONV_I32, 1, (int64_t[]){3});
    SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, net, dir, SPCONV_NET_LAYOUT_AUTO),
                        SPCONV_ERR_DTYPE_MISMATCH, "parameter 'bn1.running_var' in");
    /* From here on the buffer is fine (f64, converted); the conv weight is not. */
    write_zeros(var, SPCONV_F64, 1, (int64_t[]){3});
    write_zeros(weight, SPCONV_F32, 3, (int64_t[]){27, 3, 2});
    SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, net, dir, SPCONV_NET_LAYOUT_AUTO),
                        SPCONV_ERR_SHAPE_MISMATCH, "'conv1.weight' has shape [27, 3, 2]");
    /* A KRSC file is refused when RSCK is asked for. */
    write_zeros(weight, SPCONV_F32, 5, (int64_t[]){3, 3, 3, 3, 2});
    SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, net, dir, SPCONV_NET_LAYOUT_RSCK),
                        SPCONV_ERR_SHAPE_MISMATCH, "'conv1.weight'");
    /* Failed loads left the network as it was. */
    assert_same_params(net, twin);
    remove_folder(net, dir);
    spconv_net_destroy(net);
    spconv_net_destroy(twin);
}

static void test_bad_weight_folders(void **state) {
    (void)state;
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "conv1", .in_channels = 2, .out_channels = 3,
         .kernel = {3, 3, 3}},
    };
    spconv_net *net = create_net(SPCONV_F32, 2, layers, COUNT(layers));
    char *dir = make_folder();
    SPCONV_ASSERT_FAILS(
        spconv_net_load_weights(NULL, net, "/nonexistent/folder", SPCONV_NET_LAYOUT_AUTO),
        SPCONV_ERR_NOT_FOUND, "'conv1.weight' has no file '/nonexistent/folder/conv1.weight.npy'");
    SPCONV_ASSERT_FAILS(
        spconv_net_save_weights(NULL, net, "/nonexistent/folder/x", SPCONV_NET_LAYOUT_AUTO),
        SPCONV_ERR_IO, "cannot create the folder '/nonexistent/folder/x'");
    SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, net, dir, SPCONV_NET_LAYOUT_AUTO));
    char file[512];
    snprintf(file, sizeof file, "%s/conv1.weight.npy", dir);
    SPCONV_ASSERT_FAILS(spconv_net_save_weights(NULL, net, file, SPCONV_NET_LAYOUT_AUTO),
                        SPCONV_ERR_IO, "exists and is not a folder");
    SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, net, dir, (spconv_net_layout)9),
                        SPCONV_ERR_INVALID_ARGUMENT, "layout 9");
    remove_folder(net, dir);
    spconv_net_destroy(net);
}

/* ---- errors at creation ---------------------------------------------------------------------- */

/* Networks that spconv_net_create refuses, with the status and a piece of the message. */
typedef struct bad_net {
    spconv_layer_desc layers[2];
    int num_layers;
    spconv_status status;
    const char *message;
} bad_net;

#define SUBM3(nm, cin, cout, key_)                                                                 \
    {.kind = SPCONV_LAYER_SUBM, .name = nm, .in_channels = cin, .out_channels = cout,              \
     .kernel = {3, 3, 3}, .key = key_}

static const bad_net bad_nets[] = {
    {{SUBM3("conv1", 3, 16, NULL), {.kind = SPCONV_LAYER_CONV, .name = "conv2", .in_channels = 32,
      .out_channels = 8, .kernel = {3, 3, 3}}}, 2, SPCONV_ERR_SHAPE_MISMATCH,
     "layer 1 'conv2' (conv): expects 32 input channels but gets 16 from layer 0 'conv1'"},
    {{SUBM3("c", 4, 1, NULL)}, 1, SPCONV_ERR_SHAPE_MISMATCH, "from the network input"},
    {{{.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 5}}, 1,
     SPCONV_ERR_SHAPE_MISMATCH, "'bn' (batchnorm): expects 5"},
    {{SUBM3("c", 3, 3, "s"), {.kind = SPCONV_LAYER_INVERSE, .name = "inv", .in_channels = 3,
      .out_channels = 3, .key = "s"}}, 2, SPCONV_ERR_NOT_FOUND,
     "'inv' (inverse): no earlier conv or maxpool layer stores a rulebook under key 's'"},
    {{{.kind = SPCONV_LAYER_CONV, .name = "d", .in_channels = 3, .out_channels = 3,
       .kernel = {3, 3, 3}, .stride = {2, 2, 2}, .key = "k"},
      {.kind = SPCONV_LAYER_INVERSE, .name = "u", .in_channels = 3, .out_channels = 3,
       .kernel = {2, 2, 2}, .key = "k"}}, 2, SPCONV_ERR_GEOMETRY_MISMATCH,
     "'u' (inverse): kernel (2, 2, 2) differs from kernel (3, 3, 3) of layer 0 'd'"},
    {{{.kind = SPCONV_LAYER_INVERSE, .name = "u", .in_channels = 3, .out_channels = 3}}, 1,
     SPCONV_ERR_INVALID_ARGUMENT, "needs the key of the conv it inverts"},
    {{{.kind = SPCONV_LAYER_CONCAT, .name = "cat", .key = "x"}}, 1, SPCONV_ERR_NOT_FOUND,
     "'cat' (concat): no earlier save layer stores a tensor under 'x'"},
    {{{.kind = SPCONV_LAYER_SAVE, .name = "s1", .key = "x"},
      {.kind = SPCONV_LAYER_SAVE, .name = "s2",
       .key = "x"}}, 2, SPCONV_ERR_INVALID_ARGUMENT, "'s2' (save): layer 0 's1' already saves"},
    {{{.kind = SPCONV_LAYER_SAVE, .name = "s"}}, 1, SPCONV_ERR_INVALID_ARGUMENT, "needs a key"},
    {{{.kind = SPCONV_LAYER_TO_DENSE, .name = "bev"}, {.kind = SPCONV_LAYER_RELU, .name = "r"}},
     2, SPCONV_ERR_INVALID_ARGUMENT, "'bev' (to_dense): to_dense must be the last"},
    {{{.kind = SPCONV_LAYER_RELU, .name = "r"}, {.kind = SPCONV_LAYER_RELU, .name = "r"}}, 2,
     SPCONV_ERR_INVALID_ARGUMENT, "layer 1 'r' (relu): the name is already used by layer 0"},
    {{{.kind = SPCONV_LAYER_RELU, .name = "a/b"}}, 1, SPCONV_ERR_INVALID_ARGUMENT,
     "character 1 of the name"},
    {{{.kind = SPCONV_LAYER_RELU}}, 1, SPCONV_ERR_INVALID_ARGUMENT, "has no name"},
    {{{.kind = SPCONV_LAYER_SUBM, .name = "c", .in_channels = 3, .out_channels = 3,
       .kernel = {3, 2, 3}}}, 1, SPCONV_ERR_INVALID_ARGUMENT, "odd, but it is 2 on axis y"},
    {{{.kind = SPCONV_LAYER_CONV, .name = "c", .in_channels = 3, .out_channels = 3,
       .kernel = {3, 3, 3}, .padding = {0, -1, 0}}}, 1, SPCONV_ERR_INVALID_ARGUMENT,
     "on axis y kernel 3, stride 1, dilation 1 must be >= 1 and padding -1"},
    {{{.kind = SPCONV_LAYER_TRANSPOSED, .name = "t", .in_channels = 3, .out_channels = 3,
       .kernel = {2, 2, 2}, .stride = {2, 2, 2}, .output_padding = {0, 0, 2}}}, 1,
     SPCONV_ERR_INVALID_ARGUMENT, "output padding 2 on axis x must be below"},
    {{{.kind = SPCONV_LAYER_CONV, .name = "c", .in_channels = 3, .out_channels = 3,
       .kernel = {3, 3, 3}, .output_padding = {1, 0, 0}}}, 1, SPCONV_ERR_INVALID_ARGUMENT,
     "output padding is for transposed convs only"},
    {{{.kind = SPCONV_LAYER_MAXPOOL, .name = "p"}}, 1, SPCONV_ERR_INVALID_ARGUMENT,
     "'p' (maxpool): on axis z kernel 0"},
    {{{.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 3, .eps = -1}}, 1,
     SPCONV_ERR_INVALID_ARGUMENT, "eps (-1)"},
    {{{.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 3, .momentum = 1.5}}, 1,
     SPCONV_ERR_INVALID_ARGUMENT, "momentum (1.5)"},
    {{{.kind = (spconv_layer_kind)42, .name = "x"}}, 1, SPCONV_ERR_INVALID_ARGUMENT, "kind 42"},
    {{{.kind = SPCONV_LAYER_SUBM, .name = "c", .in_channels = 3, .kernel = {3, 3, 3}}}, 1,
     SPCONV_ERR_INVALID_ARGUMENT, "out_channels must be > 0"},
    /* (2^32, 1, 1) offsets wrapped nothing but made a kernel the rulebooks refuse; the product of
     * three sizes of 2^31 - 1 overflowed int64 in the weights' fan-in */
    {{{.kind = SPCONV_LAYER_CONV, .name = "c", .in_channels = 3, .out_channels = 3,
       .kernel = {INT64_C(1) << 32, 1, 1}}}, 1, SPCONV_ERR_INVALID_ARGUMENT,
     "'c' (conv): on axis z kernel 4294967296, stride 1, dilation 1, padding 0 and output "
     "padding 0 must be at most 2147483647"},
    {{{.kind = SPCONV_LAYER_CONV, .name = "c", .in_channels = 3, .out_channels = 3,
       .kernel = {INT32_MAX, INT32_MAX, INT32_MAX}}}, 1, SPCONV_ERR_INVALID_ARGUMENT,
     "'c' (conv): kernel (2147483647, 2147483647, 2147483647) has more than 2147483647 offsets"},
    {{{.kind = SPCONV_LAYER_MAXPOOL, .name = "p", .kernel = {65536, 65536, 1}}}, 1,
     SPCONV_ERR_INVALID_ARGUMENT, "has more than 2147483647 offsets"},
};

static void test_create_errors_in_layers(void **state) {
    (void)state;
    for (int i = 0; i < COUNT(bad_nets); ++i) {
        spconv_net *net = (spconv_net *)&net; /* must come back NULL */
        SPCONV_ASSERT_FAILS(spconv_net_create(SPCONV_F32, 3, bad_nets[i].layers,
                                              bad_nets[i].num_layers, 1, &net),
                            bad_nets[i].status, bad_nets[i].message);
        assert_null(net);
    }
}

static void test_create_errors_in_arguments(void **state) {
    (void)state;
    const spconv_layer_desc relu[] = {{.kind = SPCONV_LAYER_RELU, .name = "r"}};
    spconv_net *net = NULL;
    SPCONV_ASSERT_FAILS(spconv_net_create(SPCONV_I32, 3, relu, 1, 1, &net),
                        SPCONV_ERR_NOT_SUPPORTED, "not i32");
    SPCONV_ASSERT_FAILS(spconv_net_create(SPCONV_F32, 3, relu, 0, 1, &net),
                        SPCONV_ERR_INVALID_ARGUMENT, "at least one layer");
    SPCONV_ASSERT_FAILS(spconv_net_create(SPCONV_F32, 0, relu, 1, 1, &net),
                        SPCONV_ERR_INVALID_ARGUMENT, "in_channels must be > 0");
    SPCONV_ASSERT_FAILS(spconv_net_create(SPCONV_F32, 3, NULL, 1, 1, &net), SPCONV_ERR_NULL_POINTER,
                        "'layers'");
    SPCONV_ASSERT_FAILS(spconv_zoo_create("resnet", SPCONV_F32, 1, &net), SPCONV_ERR_NOT_FOUND,
                        "no zoo network is called 'resnet' (known: second, basic, unet)");
    spconv_net_input input;
    SPCONV_ASSERT_FAILS(spconv_zoo_input("resnet", &input), SPCONV_ERR_NOT_FOUND, "'resnet'");
    assert_null(net);
    assert_int_equal(spconv_zoo_count(), 3);
    assert_null(spconv_zoo_name(3));
    for (int i = 0; i < spconv_zoo_count(); ++i) assert_non_null(spconv_zoo_summary(i));
}

/* ---- errors while running -------------------------------------------------------------------- */

static void test_run_errors_sites(void **state) {
    (void)state;
    /* A skip connection across a downsampling: the sites differ at run time. */
    static const spconv_layer_desc across[] = {
        {.kind = SPCONV_LAYER_SAVE, .name = "keep", .key = "x"},
        {.kind = SPCONV_LAYER_CONV, .name = "down", .in_channels = 3, .out_channels = 3,
         .kernel = {2, 2, 2}, .stride = {2, 2, 2}},
        {.kind = SPCONV_LAYER_CONCAT, .name = "cat", .key = "x"},
    };
    spconv_net *net = create_net(SPCONV_F32, 3, across, COUNT(across));
    const int64_t shape[3] = {8, 8, 8};
    spconv_sparse_tensor *in = random_input(SPCONV_F32, 3, shape, shape, 1, 100);
    spconv_tensor *out = (spconv_tensor *)&out;
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "layer 2 'cat' (concat): the tensor saved as 'x' has 100 sites");
    assert_null(out);
    spconv_net_destroy(net);
    /* One submanifold key with two kernels. */
    static const spconv_layer_desc reuse[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "a", .in_channels = 3, .out_channels = 3,
         .kernel = {3, 3, 3}, .key = "s"},
        {.kind = SPCONV_LAYER_SUBM, .name = "b", .in_channels = 3, .out_channels = 3,
         .kernel = {5, 5, 5}, .key = "s"},
    };
    net = create_net(SPCONV_F32, 3, reuse, COUNT(reuse));
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_GEOMETRY_MISMATCH, "spconv_net_forward: layer 1 'b' (subm): ");
    spconv_net_destroy(net);
    /* A to_dense straight on the caller's sites checks them. */
    static const spconv_layer_desc dense_only[] = {{.kind = SPCONV_LAYER_TO_DENSE, .name = "bev"}};
    net = create_net(SPCONV_F32, 3, dense_only, 1);
    int32_t *rows = spconv_tensor_data(spconv_sparse_indices(in));
    int32_t saved_row[4];
    memcpy(saved_row, rows + 4 * 7, sizeof saved_row);
    rows[4 * 7 + 2] = 8;
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_OUT_OF_RANGE, "layer 0 'bev' (to_dense): indices row 7 = (0, ");
    memcpy(rows + 4 * 7, rows + 4 * 3, sizeof saved_row);
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_DUPLICATE_INDEX, "row 7");
    memcpy(rows + 4 * 7, saved_row, sizeof saved_row);
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL));
    spconv_tensor_release(out);
    spconv_net_destroy(net);
    spconv_sparse_release(in);
}

/* The running statistics move after a training pass's last layer, in one step: a pass that fails
 * on a later layer leaves them as they were, and one that succeeds moves them. */
static void test_failed_training_pass_keeps_running_stats(void **state) {
    (void)state;
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "a", .in_channels = 3, .out_channels = 3,
         .kernel = {3, 3, 3}, .key = "s"},
        {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 3},
        {.kind = SPCONV_LAYER_SUBM, .name = "b", .in_channels = 3, .out_channels = 3,
         .kernel = {5, 5, 5}, .key = "s"}, /* the same key with another kernel: fails */
    };
    const int64_t shape[3] = {8, 8, 8};
    spconv_sparse_tensor *in = random_input(SPCONV_F32, 3, shape, shape, 1, 100);
    for (int whole = 0; whole < 2; ++whole) {
        spconv_net *net = create_net(SPCONV_F32, 3, layers, whole ? 2 : 3);
        const int mean = spconv_net_find_param(net, "bn.running_mean");
        const int var = spconv_net_find_param(net, "bn.running_var");
        assert_true(mean >= 0 && var >= 0);
        float before[2][3], after[2][3];
        SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, spconv_net_param(net, mean), before[0],
                                                    sizeof before[0]));
        SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, spconv_net_param(net, var), before[1],
                                                    sizeof before[1]));
        spconv_tensor *out = NULL;
        if (whole) {
            SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_TRAINING, &out, NULL));
            spconv_tensor_release(out);
        } else {
            SPCONV_ASSERT_FAILS(
                spconv_net_forward(NULL, net, in, SPCONV_NET_TRAINING, &out, NULL),
                SPCONV_ERR_GEOMETRY_MISMATCH, "layer 2 'b' (subm)");
        }
        SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, spconv_net_param(net, mean), after[0],
                                                    sizeof after[0]));
        SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, spconv_net_param(net, var), after[1],
                                                    sizeof after[1]));
        if (whole)
            assert_true(memcmp(before, after, sizeof before) != 0);
        else
            assert_memory_equal(before, after, sizeof before);
        spconv_net_destroy(net);
    }
    spconv_sparse_release(in);
}

/* Input of the wrong dtype, channels or mode; backward without a training forward or with a
 * gradient of the wrong shape or dtype. */
static void test_run_errors_arguments(void **state) {
    (void)state;
    static const spconv_layer_desc one[] = {
        {.kind = SPCONV_LAYER_SUBM, .name = "a", .in_channels = 3, .out_channels = 3,
         .kernel = {3, 3, 3}},
    };
    const int64_t shape[3] = {8, 8, 8};
    spconv_sparse_tensor *in = random_input(SPCONV_F32, 3, shape, shape, 1, 100);
    spconv_tensor *out = NULL;
    spconv_net *net = create_net(SPCONV_F64, 3, one, 1);
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_DTYPE_MISMATCH,
                        "input features are f32 but the network's dtype is f64");
    spconv_net_destroy(net);
    net = create_net(SPCONV_F32, 3, one, 1);
    spconv_sparse_tensor *four = random_input(SPCONV_F32, 4, shape, shape, 1, 10);
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, four, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "the input has 4 channels but the network takes 3");
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, in, (spconv_net_mode)5, &out, NULL),
                        SPCONV_ERR_INVALID_ARGUMENT, "mode 5");
    SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, net, NULL, SPCONV_NET_INFERENCE, &out, NULL),
                        SPCONV_ERR_NULL_POINTER, "'input'");
    spconv_tensor *grad = new_tensor(SPCONV_F32, 2, (int64_t[]){100, 3}), *wrong = NULL;
    SPCONV_ASSERT_FAILS(spconv_net_backward(NULL, net, grad, NULL), SPCONV_ERR_INVALID_ARGUMENT,
                        "nothing to go back through");
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL));
    spconv_tensor_release(out);
    SPCONV_ASSERT_FAILS(spconv_net_backward(NULL, net, grad, NULL), SPCONV_ERR_INVALID_ARGUMENT,
                        "SPCONV_NET_TRAINING");
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_TRAINING, &out, NULL));
    spconv_tensor_release(out);
    wrong = new_tensor(SPCONV_F32, 2, (int64_t[]){99, 3});
    SPCONV_ASSERT_FAILS(spconv_net_backward(NULL, net, wrong, NULL), SPCONV_ERR_SHAPE_MISMATCH,
                        "grad_out has 2 dims [99, 3");
    spconv_tensor_release(wrong);
    wrong = new_tensor(SPCONV_F64, 2, (int64_t[]){100, 3});
    SPCONV_ASSERT_FAILS(spconv_net_backward(NULL, net, wrong, NULL), SPCONV_ERR_DTYPE_MISMATCH,
                        "grad_out is f64");
    spconv_tensor_release(wrong);
    SPCONV_ASSERT_OK(spconv_net_backward(NULL, net, grad, NULL));
    SPCONV_ASSERT_FAILS(spconv_net_backward(NULL, net, grad, NULL), SPCONV_ERR_INVALID_ARGUMENT,
                        "each backward needs its own forward");
    SPCONV_ASSERT_FAILS(spconv_net_sgd_step(NULL, net, NAN), SPCONV_ERR_INVALID_ARGUMENT,
                        "not finite");
    spconv_tensor_release(grad);
    spconv_sparse_release(four);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
}

/* Every layer runs on the backend of the input's device, so a network on a device whose backend
 * lacks one of its kernels fails before any layer runs, naming the layer, the backend and the
 * kernel. Every backend built today has every kernel a network needs, so the check is held
 * against copies of the CPU's table with slots emptied. */
static void test_backend_without_the_kernels(void **state) {
    (void)state;
    static const spconv_layer_desc layers[] = {
        {.kind = SPCONV_LAYER_RELU, .name = "r"},
        {.kind = SPCONV_LAYER_SUBM, .name = "a", .in_channels = 3, .out_channels = 3,
         .kernel = {3, 3, 3}},
    };
    spconv_net *net = create_net(SPCONV_F32, 3, layers, 2);
    SPCONV_ASSERT_OK(spconv__net_check_kernels("f", net, &spconv__cpu_backend, 1));
    spconv_backend table = spconv__cpu_backend;
    table.name = "test";
    table.conv_backward = NULL;
    SPCONV_ASSERT_OK(spconv__net_check_kernels("f", net, &table, 0)); /* inference needs none */
    SPCONV_ASSERT_FAILS(spconv__net_check_kernels("f", net, &table, 1), SPCONV_ERR_NOT_SUPPORTED,
                        "f: layer 1 'a' (subm): the input is on the test backend, which has no "
                        "conv backward kernel yet");
    table.relu_forward = NULL;
    SPCONV_ASSERT_FAILS(spconv__net_check_kernels("f", net, &table, 0), SPCONV_ERR_NOT_SUPPORTED,
                        "f: layer 0 'r' (relu): the input is on the test backend, which has no "
                        "ReLU kernel yet");
    spconv_net_destroy(net);
}

/* ---- batch norm with the ReLU in the same pass ---------------------------------------------- */

/* In inference a batch norm followed by a ReLU runs as one pass: its bits must be those of the
 * two layers one after the other and of a scalar loop here (product and sum each rounded, in
 * double), for f32 and f64, in place and not, on 1 and 2 threads, on both sides of the size at
 * which the pass goes parallel, with NaN, infinities, signed zeros and values that the affine map
 * sends just below zero, and NaN shifts: a NaN result is stored as the default quiet NaN. */
static void test_batchnorm_relu_fused_bits(void **state) {
    (void)state;
    const unsigned long long seed = (unsigned long long)spconv_test_seed();
    const int64_t shapes[3][2] = {{7, 5}, {1100, 33}, {5000, 64}};
    for (int d = 0; d < 2; ++d) {
        const spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
        for (int s = 0; s < 3; ++s) {
            const int64_t n = shapes[s][0], c = shapes[s][1], total = n * c;
            double *scale = malloc((size_t)c * sizeof *scale), *shift = malloc((size_t)c * sizeof *shift);
            assert_non_null(scale);
            assert_non_null(shift);
            for (int64_t ch = 0; ch < c; ++ch) {
                scale[ch] = spconv_test_rand_double(-2.0, 2.0);
                shift[ch] = spconv_test_rand_double(-1.0, 1.0);
                /* zero shifts, so that signed zeros reach the ReLU */
                if (ch % 4 == 1) shift[ch] = 0.0;
                if (ch % 4 == 2) shift[ch] = -0.0;
                /* NaN shifts of either sign meet NaN products: which NaN an add returns is left
                 * open, so the kernel must store the default NaN */
                if (ch % 8 == 3) shift[ch] = NAN;
                if (ch % 8 == 7) shift[ch] = -NAN;
            }
            spconv_tensor *x = new_tensor(dtype, 2, shapes[s]);
            const double specials[6] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0};
            for (int64_t i = 0; i < total; ++i) {
                const int64_t ch = i % c;
                const int kind = (int)spconv_test_rand_int(0, 9);
                /* x with x * scale + shift a hair from zero, either side */
                const double near = scale[ch] != 0.0 ? -shift[ch] / scale[ch] : 0.0;
                set_value(x, i, kind < 6 ? specials[kind]
                                : kind < 8 ? near * (1.0 + spconv_test_rand_double(-1e-7, 1e-7))
                                           : spconv_test_rand_double(-3.0, 3.0));
            }
            spconv_tensor *want = new_tensor(dtype, 2, shapes[s]);
            for (int64_t i = 0; i < total; ++i) {
                const int64_t ch = i % c;
                if (dtype == SPCONV_F32) {
                    const float v = (float)(((const float *)spconv_tensor_data(x))[i] * scale[ch] + shift[ch]);
                    ((float *)spconv_tensor_data(want))[i] = isnan(v) ? NAN : v < 0 ? 0 : v;
                } else {
                    const double v = ((const double *)spconv_tensor_data(x))[i] * scale[ch] + shift[ch];
                    ((double *)spconv_tensor_data(want))[i] = isnan(v) ? NAN : v < 0 ? 0 : v;
                }
            }
            const size_t bytes = (size_t)total * spconv_dtype_size(dtype);
            for (int threads = 1; threads <= 2; ++threads) {
                spconv_context *ctx = NULL;
                SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
                SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, threads));
                spconv_tensor *fused = new_tensor(dtype, 2, shapes[s]);
                spconv_tensor *two = new_tensor(dtype, 2, shapes[s]);
                spconv_tensor *in_place = new_tensor(dtype, 2, shapes[s]);
                SPCONV_ASSERT_OK(spconv__net_batchnorm_apply(ctx, x, scale, shift, 1, fused));
                SPCONV_ASSERT_OK(spconv__net_batchnorm_apply(ctx, x, scale, shift, 0, two));
                SPCONV_ASSERT_OK(spconv__net_relu_forward(ctx, two, two));
                memcpy(spconv_tensor_data(in_place), spconv_tensor_data(x), bytes);
                SPCONV_ASSERT_OK(
                    spconv__net_batchnorm_apply(ctx, in_place, scale, shift, 1, in_place));
                if (memcmp(spconv_tensor_data(fused), spconv_tensor_data(want), bytes) != 0 ||
                    memcmp(spconv_tensor_data(two), spconv_tensor_data(want), bytes) != 0 ||
                    memcmp(spconv_tensor_data(in_place), spconv_tensor_data(want), bytes) != 0)
                    fail_msg("seed %llu: %s [%lld, %lld] on %d thread(s): bits differ", seed,
                             spconv_dtype_name(dtype), (long long)n, (long long)c, threads);
                spconv_tensor_release(fused);
                spconv_tensor_release(two);
                spconv_tensor_release(in_place);
                spconv_context_destroy(ctx);
            }
            spconv_tensor_release(want);
            spconv_tensor_release(x);
            free(scale);
            free(shift);
        }
    }
}

/* In inference a conv followed by a batch norm (and a ReLU) applies both to each block of its
 * output rows (spconv__net_fold_batchnorm): the network's output and last features must be the
 * bits of the layers run one by one, f32 and f64, on 1 and 2 threads: SECOND (conv -> BN ->
 * ReLU throughout), and a network with a batch norm without a ReLU after a conv, after a ReLU
 * and after a pool (neither folded), with a NaN among the features. */
static const spconv_layer_desc bn_kinds_net[] = {
    {.kind = SPCONV_LAYER_SUBM, .name = "c1", .in_channels = 3, .out_channels = 17,
     .kernel = {3, 3, 3}, .bias = 1, .key = "s1"},
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn1", .in_channels = 17},
    {.kind = SPCONV_LAYER_CONV, .name = "down", .in_channels = 17, .out_channels = 16,
     .kernel = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}, .key = "d"},
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn2", .in_channels = 16},
    {.kind = SPCONV_LAYER_RELU, .name = "r2"},
    {.kind = SPCONV_LAYER_INVERSE, .name = "up", .in_channels = 16, .out_channels = 5,
     .kernel = {3, 3, 3}, .key = "d"},
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn5", .in_channels = 5},
    {.kind = SPCONV_LAYER_RELU, .name = "r5"},
    {.kind = SPCONV_LAYER_MAXPOOL, .name = "pool", .kernel = {2, 2, 2}, .stride = {2, 2, 2}},
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn3", .in_channels = 5},
    {.kind = SPCONV_LAYER_RELU, .name = "r3"},
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn4", .in_channels = 5},
};

static void expect_fold_same_bits(spconv_net *net, const spconv_sparse_tensor *in,
                                  const char *what) {
    for (int threads = 1; threads <= 2; ++threads) {
        spconv_context *ctx = NULL;
        SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
        SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, threads));
        spconv_tensor *out[2] = {NULL, NULL};
        spconv_sparse_tensor *last[2] = {NULL, NULL};
        for (int fold = 0; fold < 2; ++fold) {
            const int previous = spconv__net_fold_batchnorm(fold);
            SPCONV_ASSERT_OK(
                spconv_net_forward(ctx, net, in, SPCONV_NET_INFERENCE, &out[fold], &last[fold]));
            spconv__net_fold_batchnorm(previous);
        }
        const spconv_tensor *f0 = spconv_sparse_features(last[0]),
                            *f1 = spconv_sparse_features(last[1]);
        const size_t esize = spconv_dtype_size(spconv_tensor_dtype(out[0]));
        assert_int_equal(spconv_tensor_numel(out[0]), spconv_tensor_numel(out[1]));
        assert_int_equal(spconv_tensor_numel(f0), spconv_tensor_numel(f1));
        if (memcmp(spconv_tensor_data(out[0]), spconv_tensor_data(out[1]),
                   (size_t)spconv_tensor_numel(out[0]) * esize) != 0 ||
            memcmp(spconv_tensor_data(f0), spconv_tensor_data(f1),
                   (size_t)spconv_tensor_numel(f0) * esize) != 0)
            fail_msg("%s on %d thread(s): the folded batch norms change the bits", what, threads);
        for (int i = 0; i < 2; ++i) {
            spconv_tensor_release(out[i]);
            spconv_sparse_release(last[i]);
        }
        spconv_context_destroy(ctx);
    }
}

static void test_batchnorm_folded_into_conv_bits(void **state) {
    (void)state;
    spconv_net_input input;
    spconv_net *second = zoo_net("second", SPCONV_F32, spconv_test_rand_u64(), &input);
    randomise_params(second);
    spconv_sparse_tensor *in =
        random_input(SPCONV_F32, 4, input.spatial_shape, (int64_t[]){20, 48, 48}, 1, 3000);
    expect_fold_same_bits(second, in, "second f32");
    spconv_sparse_release(in);
    spconv_net_destroy(second);
    for (int d = 0; d < 2; ++d) {
        const spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
        spconv_net *net = create_net(dtype, 3, bn_kinds_net, COUNT(bn_kinds_net));
        randomise_params(net);
        const int64_t shape[3] = {9, 12, 11};
        spconv_sparse_tensor *x = random_input(dtype, 3, shape, shape, 2, 400);
        /* a NaN feature: canonical wherever a batch norm maps it */
        set_value(spconv_sparse_features(x), 7, NAN);
        expect_fold_same_bits(net, x, spconv_dtype_name(dtype));
        spconv_sparse_release(x);
        spconv_net_destroy(net);
    }
}

/* ---- empty inputs ---------------------------------------------------------------------------- */

/* A scan whose points all fall outside every zoo range voxelizes to N = 0 and still runs. */
static void test_zero_voxels(void **state) {
    (void)state;
    spconv_tensor *points = new_tensor(SPCONV_F32, 2, (int64_t[]){20, 4});
    for (int64_t i = 0; i < 20; ++i) {
        set_value(points, 4 * i + 0, -100.0 - (double)i);
        set_value(points, 4 * i + 1, spconv_test_rand_double(-10, 10));
        set_value(points, 4 * i + 2, spconv_test_rand_double(-1, 1));
    }
    for (int z = 0; z < spconv_zoo_count(); ++z) {
        spconv_net_input input;
        spconv_net *net = zoo_net(spconv_zoo_name(z), SPCONV_F32, 1, &input);
        spconv_sparse_tensor *in = NULL;
        spconv_voxelize_stats stats;
        SPCONV_ASSERT_OK(
            spconv_net_input_from_points(NULL, &input, points, SPCONV_F32, &in, &stats));
        assert_int_equal(spconv_sparse_num_sites(in), 0);
        assert_int_equal(stats.dropped_range, 20);
        spconv_tensor *out = NULL;
        for (int mode = 0; mode < 2; ++mode) {
            SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, (spconv_net_mode)mode, &out, NULL));
            assert_int_equal(spconv_net_stats(net, 0)->sites_in, 0);
            if (spconv_tensor_ndim(out) == 2) {
                assert_int_equal(spconv_tensor_size(out, 0), 0);
            } else {
                assert_sizes(out, 4, (int64_t[]){1, 256, 200, 176});
                for (int64_t i = 0; i < spconv_tensor_numel(out); i += 997)
                    assert_true(get_value(out, i) == 0.0);
            }
            if (mode == SPCONV_NET_TRAINING) {
                spconv_tensor *grad_in = NULL;
                SPCONV_ASSERT_OK(spconv_net_backward(NULL, net, out, &grad_in));
                assert_int_equal(spconv_tensor_size(grad_in, 0), 0);
                spconv_tensor_release(grad_in);
            }
            spconv_tensor_release(out);
        }
        spconv_sparse_release(in);
        spconv_net_destroy(net);
    }
    spconv_tensor_release(points);
}

/* ---- real scans ------------------------------------------------------------------------------ */

/* The bundled sample scan lives in the repository's data/ beside tests/. */
static char *repo_data_path(const char *name) {
    const char *file = __FILE__;
    const char *tests = strstr(file, "tests/test_net.c");
    if (tests == NULL) {
        print_message("skip: cannot locate the repository from '%s'\n", file);
        skip();
    }
    size_t length = (size_t)(tests - file) + strlen("data/") + strlen(name) + 1;
    char *path = malloc(length);
    snprintf(path, length, "%.*sdata/%s", (int)(tests - file), file, name);
    if (access(path, R_OK) != 0) {
        print_message("skip: '%s' is not present\n", path);
        free(path);
        skip();
    }
    return path;
}

/* Every zoo network on the scan at @p path: shapes, finite values, and the per-layer account. */
static void run_zoo_on_scan(char *path) {
    if (path == NULL) skip();
    spconv_point_cloud *cloud = NULL;
    SPCONV_ASSERT_OK(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &cloud));
    const spconv_tensor *points = spconv_point_cloud_points(cloud);
    for (int z = 0; z < spconv_zoo_count(); ++z) {
        const char *name = spconv_zoo_name(z);
        spconv_net_input input;
        spconv_net *net = zoo_net(name, SPCONV_F32, 1, &input);
        spconv_sparse_tensor *in = NULL;
        SPCONV_ASSERT_OK(spconv_net_input_from_points(NULL, &input, points, SPCONV_F32, &in, NULL));
        const int64_t n = spconv_sparse_num_sites(in);
        assert_true(n > 0);
        spconv_tensor *out = NULL;
        spconv_sparse_tensor *last = NULL;
        SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, &last));
        assert_true(all_finite(out));
        double total = 0.0;
        for (int i = 0; i < spconv_net_num_layers(net); ++i)
            total += spconv_net_stats(net, i)->forward.total;
        printf("  %-6s on %s: %lld voxels -> %s [%lld, %lld, ...], %.1f ms\n", name, path,
               (long long)n, spconv_tensor_ndim(out) == 4 ? "dense" : "sparse",
               (long long)spconv_tensor_size(out, 0), (long long)spconv_tensor_size(out, 1), total);
        if (strcmp(name, "second") == 0) {
            assert_sizes(out, 4, (int64_t[]){1, 256, 200, 176});
            assert_true(spconv_sparse_num_sites(last) > 0);
        } else if (strcmp(name, "unet") == 0) {
            assert_sizes(out, 2, (int64_t[]){n, 16});
        } else {
            int64_t shape[3];
            spconv_sparse_spatial_shape(last, shape);
            assert_true(shape[0] == 1 && shape[1] == 25 && shape[2] == 25);
            assert_int_equal(spconv_tensor_size(out, 1), 256);
        }
        spconv_tensor_release(out);
        spconv_sparse_release(last);
        spconv_sparse_release(in);
        spconv_net_destroy(net);
    }
    spconv_point_cloud_destroy(cloud);
    free(path);
}

static void test_zoo_on_sample_scan(void **state) {
    (void)state;
    run_zoo_on_scan(repo_data_path("sample_scan.bin"));
}

static void test_zoo_on_kitti(void **state) {
    (void)state;
    run_zoo_on_scan(spconv_test_data_path("kitti_000008.bin"));
}

/* Raw little-endian records of @p width values of @p elem bytes into a new tensor. */
static spconv_tensor *read_raw(const char *path, spconv_dtype dtype, int64_t width) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    const int64_t rows = bytes / (long)(width * (int64_t)spconv_dtype_size(dtype));
    spconv_tensor *t = new_tensor(dtype, 2, (int64_t[]){rows, width});
    assert_int_equal(fread(spconv_tensor_data(t), 1, (size_t)bytes, f), (size_t)bytes);
    fclose(f);
    return t;
}

/* basic on spconv's own benchmark voxels, the input of its bench_basic. */
static void test_basic_on_spconv_benchmark_voxels(void **state) {
    (void)state;
    char *ipath = spconv_test_data_path("spconv_test_indices.i32");
    char *fpath = ipath == NULL ? NULL : spconv_test_data_path("spconv_test_features.f32");
    if (fpath == NULL) {
        free(ipath);
        skip();
    }
    spconv_tensor *indices = read_raw(ipath, SPCONV_I32, 4),
                  *features = read_raw(fpath, SPCONV_F32, 3);
    assert_int_equal(spconv_tensor_size(indices, 0), 125562);
    spconv_net_input input;
    spconv_net *net = zoo_net("basic", SPCONV_F32, 1, &input);
    spconv_sparse_tensor *in = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, input.spatial_shape, 1, &in));
    spconv_tensor *out = NULL;
    spconv_sparse_tensor *last = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, &last));
    int64_t shape[3];
    spconv_sparse_spatial_shape(last, shape);
    assert_true(shape[0] == 1 && shape[1] == 25 && shape[2] == 25);
    assert_int_equal(spconv_tensor_size(out, 1), 256);
    assert_true(spconv_tensor_size(out, 0) > 0);
    assert_true(all_finite(out));
    double total = 0.0, gemm = 0.0, rulebook = 0.0;
    for (int i = 0; i < spconv_net_num_layers(net); ++i) {
        total += spconv_net_stats(net, i)->forward.total;
        gemm += spconv_net_stats(net, i)->forward.gemm;
        rulebook += spconv_net_stats(net, i)->forward.rulebook;
    }
    printf("  basic on %lld voxels: %.1f ms (rulebook %.1f, GEMM %.1f), %lld output sites\n",
           (long long)spconv_sparse_num_sites(in), total, rulebook, gemm,
           (long long)spconv_tensor_size(out, 0));
    spconv_tensor_release(out);
    spconv_sparse_release(last);
    spconv_sparse_release(in);
    spconv_net_destroy(net);
    spconv_tensor_release(indices);
    spconv_tensor_release(features);
    free(ipath);
    free(fpath);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_all_kinds_matches_reference),
        cmocka_unit_test(test_unet_matches_reference),
        cmocka_unit_test(test_second_synthetic),
        cmocka_unit_test(test_basic_synthetic),
        cmocka_unit_test(test_dense_output_reuse),
        cmocka_unit_test(test_backward_unet_like_matches_finite_differences),
        cmocka_unit_test(test_backward_pool_dense_matches_finite_differences),
        cmocka_unit_test(test_backward_all_kinds_matches_finite_differences),
        cmocka_unit_test(test_training_lowers_loss),
        cmocka_unit_test(test_stats_and_progress),
        cmocka_unit_test(test_weights_round_trip),
        cmocka_unit_test(test_seeded_initialisation),
        cmocka_unit_test(test_bad_weight_files),
        cmocka_unit_test(test_bad_weight_folders),
        cmocka_unit_test(test_create_errors_in_layers),
        cmocka_unit_test(test_create_errors_in_arguments),
        cmocka_unit_test(test_run_errors_sites),
        cmocka_unit_test(test_failed_training_pass_keeps_running_stats),
        cmocka_unit_test(test_run_errors_arguments),
        cmocka_unit_test(test_backend_without_the_kernels),
        cmocka_unit_test(test_batchnorm_relu_fused_bits),
        cmocka_unit_test(test_batchnorm_folded_into_conv_bits),
        cmocka_unit_test(test_zero_voxels),
        cmocka_unit_test(test_zoo_on_sample_scan),
        cmocka_unit_test(test_zoo_on_kitti),
        cmocka_unit_test(test_basic_on_spconv_benchmark_voxels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
