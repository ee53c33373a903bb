/* The `spconv` command-line tool (path in env SPCONV_TOOL, set by CTest): conv, maxpool and
 * rulebook through .npy files, held against the same computation through the C API, and the
 * error exits (status 2, one line on stderr, nothing left in --out). */
#define _XOPEN_SOURCE 700

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/run_tool.h"
#include "common/test_files.h"
#include "common/test_util.h"

#define PATH_CAP SPCONV_TOOL_PATH_CAP
#define MAX_ARGS 48

/* ---- running the tool ------------------------------------------------------------------------ */

typedef spconv_tool_fixture fixture;

static int setup(void **state) { return spconv_tool_setup(state, "spconv_cli"); }

static int teardown(void **state) { return spconv_tool_teardown(state); }

/* A command line under construction: "@name" arguments become paths in the scratch folder. */
typedef struct arglist {
    const char *argv[MAX_ARGS];
    int argc;
    char pool[16384];
    size_t used;
} arglist;

static void arg_add(arglist *a, const fixture *f, const char *fmt, ...) {
    assert_true(a->argc + 1 < MAX_ARGS);
    char text[PATH_CAP];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    char *slot = a->pool + a->used;
    size_t room = sizeof a->pool - a->used;
    int n = text[0] == '@' ? snprintf(slot, room, "%s/%s", f->dir, text + 1)
                           : snprintf(slot, room, "%s", text);
    assert_true(n >= 0 && (size_t)n < room);
    a->argv[a->argc++] = slot;
    a->argv[a->argc] = NULL;
    a->used += (size_t)n + 1;
}

static void arg_triple(arglist *a, const fixture *f, const char *flag, const int64_t v[3]) {
    arg_add(a, f, "%s", flag);
    arg_add(a, f, "%lld,%lld,%lld", (long long)v[0], (long long)v[1], (long long)v[2]);
}

/* Run the tool with @p a; returns its exit status, stdout and stderr are kept in f->out_text /
 * f->err_text. */
static int run_tool(fixture *f, arglist *a) { return spconv_tool_run(f, a->argv); }

static void assert_success(fixture *f, arglist *a) {
    int status = run_tool(f, a);
    if (status != 0) fail_msg("exit status %d, stderr: %s", status, f->err_text);
    assert_string_equal(f->err_text, "");
}

/* ---- inputs ---------------------------------------------------------------------------------- */

static void save(const fixture *f, const char *name, const spconv_tensor *t) {
    char path[PATH_CAP];
    SPCONV_ASSERT_OK(spconv_npy_write(NULL, spconv_test_join(f->dir, name, path, sizeof path), t));
}

/* @p n unique random rows (b, z, y, x) with b < batch, inside @p shape; the first rows take
 * batch 0, 1, ... so that the largest batch index is batch - 1 whenever n >= batch. */
static spconv_tensor *random_indices(int64_t n, int64_t batch, const int64_t shape[3]) {
    spconv_tensor *t = NULL;
    const int64_t sizes[2] = {n, 4};
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 2, sizes, &t));
    int32_t *rows = spconv_tensor_data(t);
    for (int64_t i = 0; i < n; ++i) {
        int unique;
        do {
            rows[4 * i] = (int32_t)(i < batch ? i : spconv_test_rand_int(0, batch - 1));
            for (int a = 0; a < 3; ++a)
                rows[4 * i + 1 + a] = (int32_t)spconv_test_rand_int(0, shape[a] - 1);
            unique = 1;
            for (int64_t j = 0; j < i && unique; ++j)
                unique = memcmp(&rows[4 * i], &rows[4 * j], 16) != 0;
        } while (!unique);
    }
    return t;
}

static spconv_tensor *random_values(spconv_dtype dtype, int ndim, const int64_t *sizes) {
    spconv_tensor *f64 = NULL, *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F64, ndim, sizes, &f64));
    double *data = spconv_tensor_data(f64);
    for (int64_t i = 0; i < spconv_tensor_numel(f64); ++i) data[i] = spconv_test_rand_double(-1, 1);
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, f64, dtype, &t));
    spconv_tensor_release(f64);
    return t;
}

/* ---- comparing outputs ----------------------------------------------------------------------- */

/* The .npy output @p name of --out must hold exactly @p expected (dtype, shape and bytes). */
static void assert_output(const char *out_dir, const char *name, const spconv_tensor *expected) {
    char path[PATH_CAP];
    spconv_tensor *got = NULL;
    SPCONV_ASSERT_OK(spconv_npy_read(spconv_test_join(out_dir, name, path, sizeof path), &got));
    assert_int_equal(spconv_tensor_dtype(got), spconv_tensor_dtype(expected));
    assert_int_equal(spconv_tensor_ndim(got), spconv_tensor_ndim(expected));
    for (int i = 0; i < spconv_tensor_ndim(got); ++i)
        assert_int_equal(spconv_tensor_size(got, i), spconv_tensor_size(expected, i));
    size_t n = (size_t)spconv_tensor_numel(got) * spconv_dtype_size(spconv_tensor_dtype(got));
    char *want = malloc(n + 1);
    assert_non_null(want);
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, expected, want, n));
    /* Same inputs, same thread count: the design promises bitwise-identical results. */
    if (n > 0 && memcmp(want, spconv_tensor_data(got), n) != 0)
        fail_msg("%s differs from the C API", name);
    free(want);
    spconv_tensor_release(got);
}

/* ---- weight layouts, written out here independently of the library's converters -------------- */

enum { LAYOUT_RSCK3, LAYOUT_KRSC, LAYOUT_OIDHW, LAYOUT_RSCK5 };
static const char *const layout_flag[] = {"rsck", "krsc", "oidhw", "rsck"};

/* Where element (k, i, o) of RSCK [KV, C_in, C_out] lives in @p layout. */
static int64_t layout_index(int layout, const int64_t kern[3], int64_t c_in, int64_t c_out,
                            int64_t k, int64_t i, int64_t o) {
    int64_t kd = k / (kern[1] * kern[2]), kh = (k / kern[2]) % kern[1], kw = k % kern[2];
    switch (layout) {
    case LAYOUT_KRSC: return (((o * kern[0] + kd) * kern[1] + kh) * kern[2] + kw) * c_in + i;
    case LAYOUT_OIDHW: return (((o * c_in + i) * kern[0] + kd) * kern[1] + kh) * kern[2] + kw;
    default: return (k * c_in + i) * c_out + o;
    }
}

/* RSCK [KV, C_in, C_out] rearranged into @p layout with its own shape. */
static spconv_tensor *rsck_to_layout(const spconv_tensor *w, int layout, const int64_t kern[3]) {
    int64_t kv = spconv_tensor_size(w, 0), c_in = spconv_tensor_size(w, 1),
            c_out = spconv_tensor_size(w, 2);
    int64_t sizes[5];
    int ndim = 5;
    if (layout == LAYOUT_RSCK3) {
        ndim = 3;
        memcpy(sizes, spconv_tensor_sizes(w), 3 * sizeof *sizes);
    } else if (layout == LAYOUT_RSCK5) {
        int64_t s[5] = {kern[0], kern[1], kern[2], c_in, c_out};
        memcpy(sizes, s, sizeof s);
    } else if (layout == LAYOUT_KRSC) {
        int64_t s[5] = {c_out, kern[0], kern[1], kern[2], c_in};
        memcpy(sizes, s, sizeof s);
    } else {
        int64_t s[5] = {c_out, c_in, kern[0], kern[1], kern[2]};
        memcpy(sizes, s, sizeof s);
    }
    spconv_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), spconv_tensor_dtype(w), ndim, sizes, &out));
    size_t elem = spconv_dtype_size(spconv_tensor_dtype(w));
    const char *src = spconv_tensor_data(w);
    char *dst = spconv_tensor_data(out);
    for (int64_t k = 0; k < kv; ++k)
        for (int64_t i = 0; i < c_in; ++i)
            for (int64_t o = 0; o < c_out; ++o)
                memcpy(dst + (size_t)layout_index(layout, kern, c_in, c_out, k, i, o) * elem,
                       src + (size_t)((k * c_in + i) * c_out + o) * elem, elem);
    return out;
}

/* ---- conv round trips ------------------------------------------------------------------------ */

typedef struct conv_case {
    const char *name;
    spconv_conv_kind kind;
    int64_t kernel[3], stride[3], padding[3], dilation[3], output_padding[3];
    spconv_dtype dtype;
    int layout;
    int bias, grad;
    int64_t n, c_in, c_out;
    int64_t batch_flag;  /* > 0: pass --batch-size */
    int explicit_kernel; /* pass --kernel although the 5-d weight implies it */
} conv_case;

static const int64_t shape_567[3] = {5, 6, 7};

/* The reference: the same layer through the C API, one thread like the tool's --threads 1. */
typedef struct conv_reference {
    spconv_context *ctx;
    spconv_rulebook *rb;
    spconv_tensor *out, *grad_features, *grad_weight, *grad_bias;
} conv_reference;

static spconv_conv_params case_params(const conv_case *c) {
    spconv_conv_params p = spconv_conv_params_default(c->kind);
    for (int a = 0; a < 3; ++a) {
        p.kernel[a] = c->kernel[a];
        p.stride[a] = c->stride[a];
        p.padding[a] =
            c->kind == SPCONV_CONV_SUBM ? (c->kernel[a] / 2) * c->dilation[a] : c->padding[a];
        p.dilation[a] = c->dilation[a];
        p.output_padding[a] = c->output_padding[a];
    }
    return p;
}

/* The batch size the tool must use: --batch-size, else 1 + the largest batch index. */
static int64_t batch_of(int64_t batch_flag, const spconv_tensor *indices) {
    if (batch_flag > 0) return batch_flag;
    const int32_t *rows = spconv_tensor_data(indices);
    int64_t largest = 0;
    for (int64_t i = 0; i < spconv_tensor_size(indices, 0); ++i)
        if (rows[4 * i] > largest) largest = rows[4 * i];
    return largest + 1;
}

/* The command line of case @p c for `spconv conv`, or for `spconv rulebook` (the same geometry
 * flags, no features or weight) when @p cmd says so. */
static void layer_args(arglist *a, const fixture *f, const char *cmd, const conv_case *c) {
    int conv = strcmp(cmd, "conv") == 0;
    arg_add(a, f, "%s", cmd);
    const char *fixed[] = {
        "--indices", "@in_indices.npy", "--spatial-shape", "5,6,7", "--threads", "1", "--out",
        "@out"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; ++i) arg_add(a, f, "%s", fixed[i]);
    if (conv) {
        const char *inputs[] = {"--features",     "@in_features.npy", "--weight",
                                "@in_weight.npy", "--weight-layout",  layout_flag[c->layout]};
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; ++i)
            arg_add(a, f, "%s", inputs[i]);
    }
    if (!conv || c->layout == LAYOUT_RSCK3 || c->explicit_kernel)
        arg_triple(a, f, "--kernel", c->kernel);
    /* A submanifold conv takes no stride and pads (K/2)*d: passing that padding is allowed. */
    if (c->kind != SPCONV_CONV_SUBM) arg_triple(a, f, "--stride", c->stride);
    spconv_conv_params p = case_params(c);
    if (c->kind != SPCONV_CONV_SUBM || !conv) arg_triple(a, f, "--padding", p.padding);
    arg_triple(a, f, "--dilation", c->dilation);
    if (c->kind == SPCONV_CONV_SUBM) arg_add(a, f, "--subm");
    if (c->kind == SPCONV_CONV_TRANSPOSED) {
        arg_add(a, f, "--transposed");
        arg_triple(a, f, "--output-padding", c->output_padding);
    }
    if (c->batch_flag > 0) {
        arg_add(a, f, "--batch-size");
        arg_add(a, f, "%lld", (long long)c->batch_flag);
    }
    if (c->bias) {
        arg_add(a, f, "--bias");
        arg_add(a, f, "@in_bias.npy");
    }
    if (c->grad) {
        arg_add(a, f, "--grad-out");
        arg_add(a, f, "@in_grad.npy");
    }
}

static void run_conv_case(fixture *f, const conv_case *c) {
    print_message("conv case: %s\n", c->name);
    spconv_tensor *indices = random_indices(c->n, 3, shape_567);
    spconv_tensor *features = random_values(c->dtype, 2, (const int64_t[2]){c->n, c->c_in});
    int64_t kv = c->kernel[0] * c->kernel[1] * c->kernel[2];
    spconv_tensor *weight = random_values(c->dtype, 3, (const int64_t[3]){kv, c->c_in, c->c_out});
    spconv_tensor *bias = c->bias ? random_values(c->dtype, 1, &c->c_out) : NULL;
    spconv_tensor *given_weight = rsck_to_layout(weight, c->layout, c->kernel);
    conv_reference r = {0};
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &r.ctx));
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(r.ctx, 1));
    spconv_conv_params params = case_params(c);
    SPCONV_ASSERT_OK(spconv_rulebook_build(r.ctx, indices, shape_567,
                                           batch_of(c->batch_flag, indices), &params, &r.rb));
    SPCONV_ASSERT_OK(spconv_conv_forward(r.ctx, r.rb, features, weight, bias, &r.out));
    spconv_tensor *grad = NULL;
    if (c->grad) {
        grad = random_values(c->dtype, 2, spconv_tensor_sizes(r.out));
        SPCONV_ASSERT_OK(spconv_conv_backward(r.ctx, r.rb, features, weight, grad, &r.grad_features,
                                              &r.grad_weight, bias ? &r.grad_bias : NULL));
        save(f, "in_grad.npy", grad);
    }
    save(f, "in_indices.npy", indices);
    save(f, "in_features.npy", features);
    save(f, "in_weight.npy", given_weight);
    if (bias) save(f, "in_bias.npy", bias);

    arglist a = {0};
    layer_args(&a, f, "conv", c);
    assert_success(f, &a);
    char out_dir[PATH_CAP], path[PATH_CAP];
    spconv_test_join(f->dir, "out", out_dir, sizeof out_dir);
    assert_output(out_dir, "indices.npy", spconv_rulebook_out_indices(r.rb));
    assert_output(out_dir, "features.npy", r.out);
    assert_int_equal(spconv_test_count_entries(out_dir), 2 + (c->grad ? 2 + (c->bias != 0) : 0));
    if (c->grad) {
        assert_output(out_dir, "grad_features.npy", r.grad_features);
        spconv_tensor *grad_weight = rsck_to_layout(r.grad_weight, c->layout, c->kernel);
        assert_output(out_dir, "grad_weight.npy", grad_weight);
        spconv_tensor_release(grad_weight);
        if (c->bias)
            assert_output(out_dir, "grad_bias.npy", r.grad_bias);
        else
            assert_false(
                spconv_test_exists(spconv_test_join(out_dir, "grad_bias.npy", path, sizeof path)));
    }
    assert_int_equal(spconv_test_remove_tree(out_dir), 0);
    spconv_tensor *tensors[] = {indices, features, weight,          bias,          given_weight,
                                grad,    r.out,    r.grad_features, r.grad_weight, r.grad_bias};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
    spconv_rulebook_release(r.rb);
    spconv_context_destroy(r.ctx);
}

static void test_conv_matches_c_api(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    const conv_case cases[] = {
        {.name = "regular f32, rsck [KV, C_in, C_out], stride 2, padding 1",
         .kind = SPCONV_CONV_REGULAR, .kernel = {3, 3, 3}, .stride = {2, 2, 2},
         .padding = {1, 1, 1}, .dilation = {1, 1, 1}, .dtype = SPCONV_F32,
         .layout = LAYOUT_RSCK3, .n = 60, .c_in = 5, .c_out = 4},
        {.name = "regular f64, oidhw, anisotropic, bias, backward", .kind = SPCONV_CONV_REGULAR,
         .kernel = {3, 1, 2}, .stride = {1, 2, 1}, .padding = {1, 0, 0}, .dilation = {1, 1, 2},
         .dtype = SPCONV_F64, .layout = LAYOUT_OIDHW, .bias = 1, .grad = 1, .n = 45, .c_in = 3,
         .c_out = 6, .explicit_kernel = 1},
        {.name = "subm f32, rsck 5-d, dilation 2, bias, backward", .kind = SPCONV_CONV_SUBM,
         .kernel = {3, 3, 3}, .stride = {1, 1, 1}, .dilation = {2, 1, 2}, .dtype = SPCONV_F32,
         .layout = LAYOUT_RSCK5, .bias = 1, .grad = 1, .n = 50, .c_in = 4, .c_out = 7},
        {.name = "transposed f32, krsc, output padding 1, backward without bias",
         .kind = SPCONV_CONV_TRANSPOSED, .kernel = {2, 2, 2}, .stride = {2, 2, 2},
         .dilation = {1, 1, 1}, .output_padding = {1, 1, 1}, .dtype = SPCONV_F32,
         .layout = LAYOUT_KRSC, .grad = 1, .n = 31, .c_in = 3, .c_out = 2},
        {.name = "subm f64, krsc, explicit batch size 4", .kind = SPCONV_CONV_SUBM,
         .kernel = {1, 3, 5}, .stride = {1, 1, 1}, .dilation = {1, 1, 1}, .dtype = SPCONV_F64,
         .layout = LAYOUT_KRSC, .n = 40, .c_in = 2, .c_out = 3, .batch_flag = 4,
         .explicit_kernel = 1},
        {.name = "subm f16, krsc, bias, backward: f16 files in, f16 files out",
         .kind = SPCONV_CONV_SUBM, .kernel = {3, 3, 3}, .stride = {1, 1, 1},
         .dilation = {1, 1, 1}, .dtype = SPCONV_F16, .layout = LAYOUT_KRSC, .bias = 1, .grad = 1,
         .n = 50, .c_in = 5, .c_out = 3},
        {.name = "regular f16, rsck, stride 2, backward without bias", .kind = SPCONV_CONV_REGULAR,
         .kernel = {2, 2, 2}, .stride = {2, 2, 2}, .dilation = {1, 1, 1}, .dtype = SPCONV_F16,
         .layout = LAYOUT_RSCK3, .grad = 1, .n = 40, .c_in = 4, .c_out = 6},
        {.name = "empty input (N = 0), regular f32 with bias, backward",
         .kind = SPCONV_CONV_REGULAR, .kernel = {3, 3, 3}, .stride = {1, 1, 1},
         .dilation = {1, 1, 1}, .dtype = SPCONV_F32, .layout = LAYOUT_RSCK3, .bias = 1,
         .grad = 1, .n = 0, .c_in = 3, .c_out = 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_conv_case(f, &cases[i]);
}

/* ---- maxpool and rulebook -------------------------------------------------------------------- */

/* f32 and f16 (whose files stay f16 end to end). */
static void run_maxpool_case(fixture *f, spconv_dtype dtype) {
    print_message("maxpool case: %s\n", spconv_dtype_name(dtype));
    spconv_tensor *indices = random_indices(80, 2, shape_567);
    spconv_tensor *features = random_values(dtype, 2, (const int64_t[2]){80, 5});
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, 1));
    spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    const int64_t kernel[3] = {2, 3, 2}, stride[3] = {2, 1, 2};
    memcpy(params.kernel, kernel, sizeof kernel);
    memcpy(params.stride, stride, sizeof stride);
    spconv_rulebook *rb = NULL;
    spconv_tensor *out = NULL, *argmax = NULL, *grad_features = NULL;
    SPCONV_ASSERT_OK(
        spconv_rulebook_build(ctx, indices, shape_567, batch_of(0, indices), &params, &rb));
    SPCONV_ASSERT_OK(spconv_maxpool_forward(ctx, rb, features, &out, &argmax));
    spconv_tensor *grad = random_values(dtype, 2, spconv_tensor_sizes(out));
    SPCONV_ASSERT_OK(spconv_maxpool_backward(ctx, rb, argmax, grad, &grad_features));
    save(f, "in_indices.npy", indices);
    save(f, "in_features.npy", features);
    save(f, "in_grad.npy", grad);

    arglist a = {0};
    const char *args[] = {
        "maxpool",         "--indices",    "@in_indices.npy", "--features", "@in_features.npy",
        "--spatial-shape", "5,6,7",        "--kernel",        "2,3,2",      "--stride=2,1,2",
        "--grad-out",      "@in_grad.npy", "--threads",       "1",          "--out",
        "@pool/nested"};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; ++i) arg_add(&a, f, "%s", args[i]);
    assert_success(f, &a);
    char out_dir[PATH_CAP];
    spconv_test_join(f->dir, "pool/nested", out_dir, sizeof out_dir);
    assert_int_equal(spconv_test_count_entries(out_dir), 3);
    assert_output(out_dir, "indices.npy", spconv_rulebook_out_indices(rb));
    assert_output(out_dir, "features.npy", out);
    assert_output(out_dir, "grad_features.npy", grad_features);
    assert_int_equal(spconv_test_remove_tree(out_dir), 0);

    spconv_tensor *tensors[] = {indices, features, out, argmax, grad, grad_features};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
    spconv_rulebook_release(rb);
    spconv_context_destroy(ctx);
}

static void test_maxpool_matches_c_api(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    run_maxpool_case(f, SPCONV_F32);
    run_maxpool_case(f, SPCONV_F16);
}

/* conv and maxpool --device cuda:0: the files hold what the C API computes on that device, bit
 * for bit (where a device, or the host emulation, is); a device that is not there is one line
 * and exit status 2. */
static spconv_tensor *to_cuda(const spconv_tensor *t) {
    spconv_tensor *d = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, t, spconv_cuda(0), &d));
    return d;
}

static void test_conv_and_maxpool_on_device(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    const int devices = spconv_has_cuda() ? spconv_cuda_device_count() : 0;
    spconv_tensor *indices = random_indices(70, 2, shape_567);
    spconv_tensor *features = random_values(SPCONV_F32, 2, (const int64_t[2]){70, 3});
    spconv_tensor *weight = random_values(SPCONV_F32, 3, (const int64_t[3]){27, 3, 4});
    spconv_tensor *bias = random_values(SPCONV_F32, 1, (const int64_t[1]){4});
    save(f, "in_indices.npy", indices);
    save(f, "in_features.npy", features);
    save(f, "in_weight.npy", weight);
    save(f, "in_bias.npy", bias);
    char missing[32];
    snprintf(missing, sizeof missing, "cuda:%d", devices);
    for (int pool = 0; pool < 2; ++pool) {
        arglist a = {0};
        arg_add(&a, f, pool ? "maxpool" : "conv");
        const char *common[] = {"--indices", "@in_indices.npy", "--features", "@in_features.npy",
                                "--spatial-shape", "5,6,7", "--kernel", "3,3,3", "--device",
                                missing, "--out", "@absent"};
        for (size_t i = 0; i < sizeof common / sizeof common[0]; ++i)
            arg_add(&a, f, "%s", common[i]);
        if (!pool) {
            arg_add(&a, f, "--weight");
            arg_add(&a, f, "@in_weight.npy");
        }
        assert_int_equal(run_tool(f, &a), 2);
        assert_non_null(strstr(f->err_text, spconv_has_cuda() ? "no CUDA device"
                                                              : "has no CUDA backend"));
        char absent[PATH_CAP];
        assert_false(spconv_test_exists(spconv_test_join(f->dir, "absent", absent, PATH_CAP)));
    }
    if (devices == 0) {
        spconv_tensor *tensors[] = {indices, features, weight, bias};
        for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
            spconv_tensor_release(tensors[i]);
        print_message("skip: no CUDA device for the --device cuda runs\n");
        skip();
    }
    spconv_tensor *di = to_cuda(indices), *dx = to_cuda(features), *dw = to_cuda(weight),
                  *db = to_cuda(bias);
    spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    params.padding[0] = params.padding[1] = params.padding[2] = 1;
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, di, shape_567, 2, &params, &rb));
    spconv_tensor *out = NULL, *grad = NULL, *dgrad = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, dx, dw, db, &out));
    grad = random_values(SPCONV_F32, 2, spconv_tensor_sizes(out));
    dgrad = to_cuda(grad);
    SPCONV_ASSERT_OK(spconv_conv_backward(NULL, rb, dx, dw, dgrad, &gx, &gw, &gb));
    save(f, "in_grad.npy", grad);
    arglist a = {0};
    const char *conv_args[] = {"conv", "--indices", "@in_indices.npy", "--features",
                               "@in_features.npy", "--weight", "@in_weight.npy", "--bias",
                               "@in_bias.npy", "--grad-out", "@in_grad.npy", "--spatial-shape",
                               "5,6,7", "--kernel", "3,3,3", "--padding", "1,1,1", "--device",
                               "cuda:0", "--out", "@gpu_conv"};
    for (size_t i = 0; i < sizeof conv_args / sizeof conv_args[0]; ++i)
        arg_add(&a, f, "%s", conv_args[i]);
    assert_success(f, &a);
    char out_dir[PATH_CAP];
    spconv_test_join(f->dir, "gpu_conv", out_dir, sizeof out_dir);
    assert_output(out_dir, "indices.npy", spconv_rulebook_out_indices(rb));
    assert_output(out_dir, "features.npy", out);
    assert_output(out_dir, "grad_features.npy", gx);
    assert_output(out_dir, "grad_weight.npy", gw);
    assert_output(out_dir, "grad_bias.npy", gb);
    spconv_tensor *pooled = NULL, *argmax = NULL, *pool_grad = NULL;
    SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, rb, dx, &pooled, &argmax));
    spconv_tensor *pgrad = random_values(SPCONV_F32, 2, spconv_tensor_sizes(pooled));
    spconv_tensor *dpgrad = to_cuda(pgrad);
    SPCONV_ASSERT_OK(spconv_maxpool_backward(NULL, rb, argmax, dpgrad, &pool_grad));
    save(f, "in_pool_grad.npy", pgrad);
    arglist b = {0};
    const char *pool_args[] = {"maxpool", "--indices", "@in_indices.npy", "--features",
                               "@in_features.npy", "--grad-out", "@in_pool_grad.npy",
                               "--spatial-shape", "5,6,7", "--kernel", "3,3,3", "--stride",
                               "1,1,1", "--padding", "1,1,1", "--device", "cuda", "--out",
                               "@gpu_pool"};
    for (size_t i = 0; i < sizeof pool_args / sizeof pool_args[0]; ++i)
        arg_add(&b, f, "%s", pool_args[i]);
    assert_success(f, &b);
    spconv_test_join(f->dir, "gpu_pool", out_dir, sizeof out_dir);
    assert_output(out_dir, "features.npy", pooled);
    assert_output(out_dir, "grad_features.npy", pool_grad);
    spconv_tensor *tensors[] = {indices, features, weight, bias, di, dx, dw, db, out, grad, dgrad,
                                gx, gw, gb, pooled, argmax, pgrad, dpgrad, pool_grad};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
    spconv_rulebook_release(rb);
}

/* counts [KV] and pairs [M, 3] (offset, in_row, out_row) as the tool must write them. */
static void rulebook_tables(const spconv_rulebook *rb, spconv_tensor **counts,
                            spconv_tensor **pairs) {
    int64_t kv = spconv_rulebook_kernel_volume(rb), m = spconv_rulebook_num_pairs(rb);
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_I64, 1, &kv, counts));
    SPCONV_ASSERT_OK(
        spconv_tensor_empty(spconv_cpu(), SPCONV_I64, 2, (const int64_t[2]){m, 3}, pairs));
    int32_t *in_rows = malloc((size_t)m * sizeof *in_rows + 1),
            *out_rows = malloc((size_t)m * sizeof *out_rows + 1);
    assert_non_null(in_rows);
    assert_non_null(out_rows);
    SPCONV_ASSERT_OK(
        spconv_tensor_copy_to_host(NULL, spconv_rulebook_pairs_in(rb), in_rows, (size_t)m * 4));
    SPCONV_ASSERT_OK(
        spconv_tensor_copy_to_host(NULL, spconv_rulebook_pairs_out(rb), out_rows, (size_t)m * 4));
    int64_t *count = spconv_tensor_data(*counts), *pair = spconv_tensor_data(*pairs);
    for (int64_t k = 0; k < kv; ++k) {
        int64_t begin, end;
        spconv_rulebook_offset_range(rb, k, &begin, &end);
        count[k] = end - begin;
        for (int64_t p = begin; p < end; ++p) {
            pair[3 * p] = k;
            pair[3 * p + 1] = in_rows[p];
            pair[3 * p + 2] = out_rows[p];
        }
    }
    free(in_rows);
    free(out_rows);
}

static void test_rulebook_matches_c_api(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    const conv_case cases[] = {
        {.name = "subm 3", .kind = SPCONV_CONV_SUBM, .kernel = {3, 3, 3}, .stride = {1, 1, 1},
         .dilation = {1, 1, 1}, .n = 70},
        {.name = "regular 3, stride 2, padding 1", .kind = SPCONV_CONV_REGULAR,
         .kernel = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}, .dilation = {1, 1, 1},
         .n = 70},
        {.name = "transposed 2,3,1", .kind = SPCONV_CONV_TRANSPOSED, .kernel = {2, 3, 1},
         .stride = {2, 1, 3}, .padding = {0, 1, 0}, .dilation = {1, 1, 1},
         .output_padding = {1, 0, 2}, .n = 30, .batch_flag = 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        print_message("rulebook case: %s\n", cases[c].name);
        spconv_tensor *indices = random_indices(cases[c].n, 2, shape_567);
        spconv_conv_params params = case_params(&cases[c]);
        spconv_rulebook *rb = NULL;
        SPCONV_ASSERT_OK(spconv_rulebook_build(
            NULL, indices, shape_567, batch_of(cases[c].batch_flag, indices), &params, &rb));
        spconv_tensor *counts = NULL, *pairs = NULL;
        rulebook_tables(rb, &counts, &pairs);
        save(f, "in_indices.npy", indices);
        arglist a = {0};
        layer_args(&a, f, "rulebook", &cases[c]);
        assert_success(f, &a);
        char out_dir[PATH_CAP];
        spconv_test_join(f->dir, "out", out_dir, sizeof out_dir);
        assert_int_equal(spconv_test_count_entries(out_dir), 3);
        assert_output(out_dir, "out_indices.npy", spconv_rulebook_out_indices(rb));
        assert_output(out_dir, "counts.npy", counts);
        assert_output(out_dir, "pairs.npy", pairs);
        assert_int_equal(spconv_test_remove_tree(out_dir), 0);
        spconv_tensor_release(counts);
        spconv_tensor_release(pairs);
        spconv_tensor_release(indices);
        spconv_rulebook_release(rb);
    }
}

/* ---- help ------------------------------------------------------------------------------------ */

static void test_help_lists_the_contract(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    const struct {
        const char *cmd;
        const char *flags[20];
    } commands[] = {
        {"conv",
         {"--indices", "--features", "--weight", "--spatial-shape", "--batch-size", "--kernel",
          "--stride", "--padding", "--dilation", "--output-padding", "--subm", "--transposed",
          "--bias", "--weight-layout", "--grad-out", "--threads", "--out", "grad_weight.npy",
          NULL}},
        {"maxpool",
         {"--indices", "--features", "--spatial-shape", "--batch-size", "--kernel", "--stride",
          "--padding", "--dilation", "--grad-out", "--out", "grad_features.npy", NULL}},
        {"rulebook",
         {"--indices", "--spatial-shape", "--kernel", "--subm", "--transposed", "--out",
          "pairs.npy", "counts.npy", "out_indices.npy", NULL}},
    };
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; ++c) {
        arglist a = {0};
        arg_add(&a, f, "%s", commands[c].cmd);
        arg_add(&a, f, "--bogus"); /* --help wins over other problems */
        arg_add(&a, f, "--help");
        assert_success(f, &a);
        char usage[64];
        snprintf(usage, sizeof usage, "usage: spconv %s ", commands[c].cmd);
        assert_non_null(strstr(f->out_text, usage));
        for (int i = 0; commands[c].flags[i] != NULL; ++i)
            if (strstr(f->out_text, commands[c].flags[i]) == NULL)
                fail_msg("`spconv %s --help` does not mention %s", commands[c].cmd,
                         commands[c].flags[i]);
    }
}

/* ---- error exits ----------------------------------------------------------------------------- */

/* Valid inputs (20 sites in 8x8x8, 3 -> 4 channels, kernel 3) and broken variants of them. */
static void write_error_inputs(const fixture *f) {
    const int64_t shape[3] = {8, 8, 8};
    spconv_tensor *indices = random_indices(20, 2, shape);
    save(f, "indices.npy", indices);
    int32_t *rows = spconv_tensor_data(indices);
    int32_t z = rows[4 * 3 + 1];
    rows[4 * 3 + 1] = 8; /* row 3: z = D */
    save(f, "indices_oob.npy", indices);
    rows[4 * 3 + 1] = z;
    memcpy(&rows[4 * 5], &rows[4 * 2], 16); /* row 5 repeats row 2 */
    save(f, "indices_dup.npy", indices);
    spconv_tensor *t = random_values(SPCONV_F32, 2, (const int64_t[2]){20, 4});
    save(f, "indices_f32.npy", t);
    spconv_tensor *tensors[] = {
        indices, t,
        random_values(SPCONV_F32, 2, (const int64_t[2]){20, 3}),
        random_values(SPCONV_F32, 2, (const int64_t[2]){20, 5}),
        random_values(SPCONV_F32, 3, (const int64_t[3]){27, 3, 4}),
        random_values(SPCONV_F64, 3, (const int64_t[3]){27, 3, 4}),
        random_values(SPCONV_F32, 3, (const int64_t[3]){8, 3, 4}),
        random_values(SPCONV_F32, 1, (const int64_t[1]){5}),
        random_values(SPCONV_F32, 2, (const int64_t[2]){1, 1}),
        random_values(SPCONV_F32, 2, (const int64_t[2]){4, 3}),
        random_values(SPCONV_F32, 5, (const int64_t[5]){3, 3, 0, 3, 4}),
        random_values(SPCONV_F32, 5, (const int64_t[5]){2, 2, 2, 3, 4}),
    };
    const char *names[] = {NULL,           NULL,           "features.npy",   "features_c5.npy",
                           "weight.npy",   "weight_f64.npy", "weight_kv8.npy", "bias_5.npy",
                           "grad_1x1.npy", "features_n4.npy", "weight_k0.npy",  "weight_k2.npy"};
    for (size_t i = 2; i < sizeof names / sizeof names[0]; ++i) save(f, names[i], tensors[i]);
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
    char path[PATH_CAP];
    /* features [20, 3] f32 whose data stops after 2 bytes */
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (20, 3), }\n";
    char bytes[128] = "\x93NUMPY\x01";
    bytes[8] = (char)strlen(dict);
    size_t n = 10 + strlen(dict);
    memcpy(bytes + 10, dict, strlen(dict));
    memcpy(bytes + n, "\x01\x02", 2);
    spconv_test_write_bytes(spconv_test_join(f->dir, "truncated.npy", path, sizeof path), bytes,
                            n + 2);
    spconv_test_write_bytes(spconv_test_join(f->dir, "not_a_folder", path, sizeof path), "x", 1);
}

typedef struct error_case {
    const char *args[24]; /* the command first; "@name" = a file of write_error_inputs */
    const char *message;
} error_case;

#define CONV_BASE                                                                                  \
    "conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight", "@weight.npy", \
        "--spatial-shape", "8,8,8"

static const error_case error_cases[] = {
    {{CONV_BASE, "--features", "@features.npy"}, "--features is given more than once"},
    {{"conv", "--indices", "@missing.npy", "--features", "@features.npy", "--weight", "@weight.npy",
      "--spatial-shape", "8,8,8"}, "No such file or directory"},
    {{"conv", "--indices", "@indices.npy", "--features", "@truncated.npy", "--weight",
      "@weight.npy", "--spatial-shape", "8,8,8"}, "truncated"},
    {{"conv", "--indices", "@indices_f32.npy", "--features", "@features.npy", "--weight",
      "@weight.npy", "--spatial-shape", "8,8,8"},
     "--indices: expected int32 [N, 4], got f32 [20, 4]"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features_c5.npy", "--weight",
      "@weight.npy", "--spatial-shape", "8,8,8"}, "channel mismatch"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight",
      "@weight_f64.npy", "--spatial-shape", "8,8,8"}, "dtype mismatch"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight",
      "@weight_kv8.npy", "--spatial-shape", "8,8,8"},
     "--weight: expected [KV, C_in, C_out] with KV = 27, the volume of the default kernel 3,3,3 "
     "(or a 5-d weight), got f32 [8, 3, 4]"},
    {{CONV_BASE, "--kernel", "2"},
     "with KV = 8, the volume of --kernel 2,2,2 (or a 5-d weight), got f32 [27, 3, 4]"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features_n4.npy", "--weight",
      "@weight.npy", "--spatial-shape", "8,8,8"},
     "--features: expected f16, f32 or f64 [N, C] with N = 20 (the --indices rows), got f32 [4, 3]"},
    {{"maxpool", "--indices", "@indices.npy", "--features", "@features_n4.npy",
      "--spatial-shape", "8,8,8"}, "with N = 20 (the --indices rows), got f32 [4, 3]"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight",
      "@weight_k0.npy", "--spatial-shape", "8,8,8"},
     "--weight shape [3, 3, 0, 3, 4] gives kernel 3,3,0; each kernel size must be in [1, 255]"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight",
      "@weight_k0.npy", "--weight-layout", "oidhw", "--spatial-shape", "8,8,8"},
     "--weight shape [3, 3, 0, 3, 4] gives kernel 0,3,4; each kernel size must be in [1, 255]"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight",
      "@weight_k2.npy", "--spatial-shape", "8,8,8", "--subm"},
     "the --weight kernel 2,2,2: z = 2 is even; --subm needs odd kernel sizes"},
    {{"conv", "--indices", "@indices_oob.npy", "--features", "@features.npy", "--weight",
      "@weight.npy", "--spatial-shape", "8,8,8"}, "/indices_oob.npy': indices row 3 = "},
    {{"conv", "--indices", "@indices_dup.npy", "--features", "@features.npy", "--weight",
      "@weight.npy", "--spatial-shape", "8,8,8"}, "/indices_dup.npy': indices row 5 = "},
    {{CONV_BASE, "--batch-size", "1", "--subm"}, "/indices.npy': "},
    {{CONV_BASE, "--batch-size", "1", "--subm"}, "batch index 1 outside batch size 1"},
    {{CONV_BASE, "--bias", "@bias_5.npy"}, "--bias: expected f32 [C_out = 4], got f32 [5]"},
    {{CONV_BASE, "--grad-out", "@grad_1x1.npy"}, "--grad-out: expected f32 [N_out"},
    {{CONV_BASE, "--kernel", "3,3"}, "--kernel '3,3'"},
    {{CONV_BASE, "--stride", "0"}, "--stride 0: value 0 is outside [1, "},
    {{CONV_BASE, "--padding", "-1"}, "--padding -1"},
    {{CONV_BASE, "--threads", "two"}, "--threads 'two': expected an integer"},
    {{CONV_BASE, "--spatial-shape=8,8,x"}, "--spatial-shape is given more than once"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight", "@weight.npy",
      "--spatial-shape", "8,8,x"}, "--spatial-shape '8,8,x'"},
    {{CONV_BASE, "--weight-layout", "nchw"}, "expected one of rsck, krsc, oidhw"},
    {{CONV_BASE, "--weight-layout", "krsc"}, "5-d KRSC"},
    {{CONV_BASE, "--foo"}, "unknown option '--foo'"},
    {{CONV_BASE, "stray"}, "unexpected argument 'stray'"},
    {{CONV_BASE, "--bias"}, "--bias needs a value"},
    {{CONV_BASE, "--subm=yes"}, "--subm takes no value"},
    {{CONV_BASE, "--subm", "--transposed"}, "exclude each other"},
    {{CONV_BASE, "--subm", "--stride", "2"}, "stride 1"},
    {{CONV_BASE, "--subm", "--padding", "0"}, "pads (K/2)*dilation = 1,1,1"},
    {{CONV_BASE, "--output-padding", "1"}, "--output-padding needs --transposed"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight",
      "@weight_kv8.npy", "--spatial-shape", "8,8,8", "--subm", "--kernel", "2"},
     "--kernel 2,2,2: z = 2 is even; --subm needs odd kernel sizes"},
    {{"rulebook", "--indices", "@indices.npy", "--spatial-shape", "8,8,8", "--subm", "--kernel",
      "3,3,4"}, "--kernel 3,3,4: x = 4 is even; --subm needs odd kernel sizes"},
    {{"conv", "--indices", "@indices.npy", "--features", "@features.npy", "--weight", "@weight.npy",
      "--spatial-shape", "8,8,8"}, "missing --out DIR"},
    {{"conv", "--indices", "@indices.npy", "--weight", "@weight.npy", "--spatial-shape", "8,8,8"},
     "missing --features"},
    {{"maxpool", "--indices", "@indices.npy", "--features", "@features.npy", "--spatial-shape",
      "8,8,8", "--subm"}, "unknown option '--subm'"},
    {{"maxpool", "--indices", "@indices_oob.npy", "--features", "@features.npy", "--spatial-shape",
      "8,8,8"}, "/indices_oob.npy': indices row 3 = "},
    {{"maxpool", "--indices", "@indices.npy", "--features", "@features.npy", "--spatial-shape",
      "8,8,8", "--grad-out", "@grad_1x1.npy"}, "--grad-out: expected f32 [N_out"},
    {{"rulebook", "--indices", "@indices.npy"}, "missing --spatial-shape"},
    {{"rulebook", "--indices", "@indices.npy", "--spatial-shape", "8,8,8", "--kernel", "9"},
     "--spatial-shape 8,8,8: on z, input 8 with kernel 9 (--kernel), stride 1, padding 0, "
     "dilation 1 gives an output of 0, which is empty"},
    {{"rulebook", "--indices", "@indices.npy", "--spatial-shape", "8,8,8", "--transposed",
      "--stride", "2", "--output-padding", "2"},
     "--output-padding 2,2,2: z = 2 must be less than max(--stride 2, --dilation 1) = 2"},
    {{"rulebook", "--indices", "@indices.npy", "--spatial-shape", "8,8,8", "--transposed",
      "--stride", "2,2,3", "--output-padding", "0,0,3"},
     "--output-padding 0,0,3: x = 3 must be less than max(--stride 3, --dilation 1) = 3"},
};

static void test_errors_exit_2_with_one_line_and_no_outputs(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    write_error_inputs(f);
    for (size_t c = 0; c < sizeof error_cases / sizeof error_cases[0]; ++c) {
        const error_case *e = &error_cases[c];
        arglist a = {0};
        for (int i = 0; e->args[i] != NULL; ++i) arg_add(&a, f, "%s", e->args[i]);
        int needs_out = strstr(e->message, "missing --out") == NULL;
        if (needs_out) {
            arg_add(&a, f, "--out");
            arg_add(&a, f, "@out_%zu/nested", c);
        }
        print_message("error case %zu: %s\n", c, e->message);
        int status = run_tool(f, &a);
        if (status != 2) fail_msg("exit status %d (expected 2), stderr: %s", status, f->err_text);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "spconv %s: ", e->args[0]);
        if (strncmp(f->err_text, prefix, strlen(prefix)) != 0 ||
            strstr(f->err_text, e->message) == NULL)
            fail_msg("stderr \"%s\" is not \"%s...%s...\"", f->err_text, prefix, e->message);
        char *newline = strchr(f->err_text, '\n');
        if (newline == NULL || newline[1] != '\0')
            fail_msg("stderr is not one line: \"%s\"", f->err_text);
        char out_dir[PATH_CAP];
        snprintf(out_dir, sizeof out_dir, "%s/out_%zu", f->dir, c);
        assert_false(spconv_test_exists(out_dir));
    }
}

/* Outputs appear together or not at all: when the last rename fails, the first is undone and the
 * files that were there before stay. */
static void test_failed_output_leaves_nothing(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    write_error_inputs(f);
    char out_dir[PATH_CAP], path[PATH_CAP];
    spconv_test_join(f->dir, "out", out_dir, sizeof out_dir);
    assert_int_equal(mkdir(out_dir, 0777), 0);
    assert_int_equal(mkdir(spconv_test_join(out_dir, "features.npy", path, sizeof path), 0777), 0);
    assert_int_equal(
        spconv_test_write_bytes(spconv_test_join(out_dir, "keep.txt", path, sizeof path), "k", 1),
        0);
    arglist a = {0};
    const char *args[] = {CONV_BASE, "--out", "@out"};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; ++i) arg_add(&a, f, "%s", args[i]);
    assert_int_equal(run_tool(f, &a), 2);
    assert_non_null(strstr(f->err_text, "features.npy"));
    assert_int_equal(spconv_test_count_entries(out_dir), 2);
    assert_false(spconv_test_exists(spconv_test_join(out_dir, "indices.npy", path, sizeof path)));

    /* --out naming a file fails before anything is computed. */
    a = (arglist){0};
    const char *args2[] = {CONV_BASE, "--out", "@not_a_folder"};
    for (size_t i = 0; i < sizeof args2 / sizeof args2[0]; ++i) arg_add(&a, f, "%s", args2[i]);
    assert_int_equal(run_tool(f, &a), 2);
    assert_non_null(strstr(f->err_text, "not_a_folder' is a file, not a folder"));
}

/* The expected stderr of a command that must fail: status 2, this one line exactly. */
static void expect_error_line(fixture *f, arglist *a, const char *line) {
    int status = run_tool(f, a);
    if (status != 2) fail_msg("exit status %d (expected 2), stderr: %s", status, f->err_text);
    char want[4 * PATH_CAP];
    snprintf(want, sizeof want, "%s\n", line);
    assert_string_equal(f->err_text, want);
}

/* conv --inverse: the inverse of the regular conv of the given geometry on --indices, forward
 * and backward, as spconv_rulebook_inverse + spconv_conv_forward / backward compute it; and its
 * errors. */
static void test_conv_inverse_matches_c_api(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    static const struct {
        const char *name;
        int64_t kernel, stride, padding;
    } geometries[] = {{"kernel 3, stride 2, padding 1", 3, 2, 1}, {"kernel 2, stride 2", 2, 2, 0}};
    for (size_t g = 0; g < sizeof geometries / sizeof geometries[0]; ++g) {
        print_message("inverse of: %s\n", geometries[g].name);
        const int64_t n = 60, c_in = 5, c_out = 3, k = geometries[g].kernel;
        spconv_tensor *indices = random_indices(n, 2, shape_567);
        spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_REGULAR);
        for (int i = 0; i < 3; ++i) {
            params.kernel[i] = k;
            params.stride[i] = geometries[g].stride;
            params.padding[i] = geometries[g].padding;
        }
        spconv_context *ctx = NULL;
        spconv_rulebook *forward = NULL, *inverse = NULL;
        SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
        SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, 1));
        SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, indices, shape_567, 2, &params, &forward));
        SPCONV_ASSERT_OK(spconv_rulebook_inverse(forward, &inverse));
        const int64_t m = spconv_rulebook_num_out(forward);
        spconv_tensor *features = random_values(SPCONV_F32, 2, (const int64_t[2]){m, c_in});
        spconv_tensor *weight =
            random_values(SPCONV_F32, 3, (const int64_t[3]){k * k * k, c_in, c_out});
        spconv_tensor *bias = random_values(SPCONV_F32, 1, &c_out);
        spconv_tensor *grad = random_values(SPCONV_F32, 2, (const int64_t[2]){n, c_out});
        spconv_tensor *out = NULL, *grad_features = NULL, *grad_weight = NULL, *grad_bias = NULL;
        SPCONV_ASSERT_OK(spconv_conv_forward(ctx, inverse, features, weight, bias, &out));
        SPCONV_ASSERT_OK(spconv_conv_backward(ctx, inverse, features, weight, grad, &grad_features,
                                              &grad_weight, &grad_bias));
        save(f, "in_indices.npy", indices);
        save(f, "in_features.npy", features);
        save(f, "in_weight.npy", weight);
        save(f, "in_bias.npy", bias);
        save(f, "in_grad.npy", grad);
        arglist a = {0};
        const char *args[] = {"conv", "--indices", "@in_indices.npy", "--spatial-shape", "5,6,7",
                              "--features", "@in_features.npy", "--weight", "@in_weight.npy",
                              "--bias", "@in_bias.npy", "--grad-out", "@in_grad.npy",
                              "--inverse", "--threads", "1", "--out", "@out"};
        for (size_t i = 0; i < sizeof args / sizeof args[0]; ++i) arg_add(&a, f, "%s", args[i]);
        arg_triple(&a, f, "--kernel", params.kernel);
        arg_triple(&a, f, "--stride", params.stride);
        arg_triple(&a, f, "--padding", params.padding);
        assert_success(f, &a);
        char out_dir[PATH_CAP];
        spconv_test_join(f->dir, "out", out_dir, sizeof out_dir);
        assert_output(out_dir, "indices.npy", indices); /* the forward's input, in its order */
        assert_output(out_dir, "features.npy", out);
        assert_output(out_dir, "grad_features.npy", grad_features);
        assert_output(out_dir, "grad_weight.npy", grad_weight);
        assert_output(out_dir, "grad_bias.npy", grad_bias);
        assert_int_equal(spconv_test_remove_tree(out_dir), 0);
        /* Features on the forward's input sites instead of its outputs: the count is named. */
        if (m != n) {
            spconv_tensor *on_inputs = random_values(SPCONV_F32, 2, (const int64_t[2]){n, c_in});
            save(f, "in_features.npy", on_inputs);
            spconv_tensor_release(on_inputs);
            char line[512];
            snprintf(line, sizeof line, "spconv conv: --features: expected f16, f32 or f64 [N, C] "
                     "with N = %lld (the output sites of the regular conv that --inverse "
                     "inverts, as `spconv rulebook` lists them), got f32 [%lld, %lld]",
                     (long long)m, (long long)n, (long long)c_in);
            expect_error_line(f, &a, line);
            assert_false(spconv_test_exists(out_dir));
        }
        spconv_tensor *tensors[] = {indices, features, weight,      bias,     grad,
                                    out,     grad_features, grad_weight, grad_bias};
        for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
            spconv_tensor_release(tensors[i]);
        spconv_rulebook_release(forward);
        spconv_rulebook_release(inverse);
        spconv_context_destroy(ctx);
    }
    /* An inverse of a submanifold or transposed conv is not a thing. */
    static const char *const kinds[] = {"--subm", "--transposed"};
    for (int i = 0; i < 2; ++i) {
        arglist a = {0};
        const char *args[] = {"conv", "--indices", "@in_indices.npy", "--spatial-shape", "5,6,7",
                              "--features", "@in_features.npy", "--weight", "@in_weight.npy",
                              "--inverse", kinds[i], "--out", "@out"};
        for (size_t j = 0; j < sizeof args / sizeof args[0]; ++j) arg_add(&a, f, "%s", args[j]);
        char line[128];
        snprintf(line, sizeof line, "spconv conv: --inverse inverts a regular conv: it excludes "
                 "%s", kinds[i]);
        expect_error_line(f, &a, line);
    }
}

/* --out is judged before any input is read (here --indices does not even exist, so any later
 * check would name it instead), and a failed check creates nothing. */
static void test_out_checked_before_the_work(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    write_error_inputs(f);
    char file[PATH_CAP], dir[PATH_CAP], line[3 * PATH_CAP], path[PATH_CAP];
    spconv_test_join(f->dir, "not_a_folder", file, sizeof file);
    const char *lazy[] = {"conv", "--indices", "@never.npy", "--features", "@features.npy",
                          "--weight", "@weight.npy", "--spatial-shape", "8,8,8", "--out"};
    /* A part of the path is a file. */
    arglist a = {0};
    for (size_t i = 0; i < sizeof lazy / sizeof lazy[0]; ++i) arg_add(&a, f, "%s", lazy[i]);
    arg_add(&a, f, "@not_a_folder/sub/deeper");
    snprintf(line, sizeof line, "spconv conv: --out '%s/sub/deeper': '%s' is a file, not a folder",
             file, file);
    expect_error_line(f, &a, line);
    /* A folder nobody may write in, root included. */
    a = (arglist){0};
    for (size_t i = 0; i < sizeof lazy / sizeof lazy[0]; ++i) arg_add(&a, f, "%s", lazy[i]);
    arg_add(&a, f, "/sys/kernel");
    assert_int_equal(run_tool(f, &a), 2);
    assert_non_null(strstr(f->err_text, "spconv conv: --out '/sys/kernel': cannot write in this "
                                        "folder: "));
    a = (arglist){0};
    for (size_t i = 0; i < sizeof lazy / sizeof lazy[0]; ++i) arg_add(&a, f, "%s", lazy[i]);
    arg_add(&a, f, "/proc/spconv-out");
    expect_error_line(f, &a, "spconv conv: --out '/proc/spconv-out': cannot create it in '/proc': "
                             "it takes no new entries");
    /* A final name of this command taken by a folder: rulebook writes pairs.npy. */
    spconv_test_join(f->dir, "rb", dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(mkdir(spconv_test_join(dir, "pairs.npy", path, sizeof path), 0777), 0);
    a = (arglist){0};
    const char *rulebook[] = {"rulebook", "--indices", "@never.npy", "--spatial-shape", "8,8,8",
                              "--out", "@rb"};
    for (size_t i = 0; i < sizeof rulebook / sizeof rulebook[0]; ++i)
        arg_add(&a, f, "%s", rulebook[i]);
    snprintf(line, sizeof line, "spconv rulebook: --out '%s': '%s' is a folder", dir, path);
    expect_error_line(f, &a, line);
    assert_int_equal(spconv_test_count_entries(dir), 1);
    /* grad_bias.npy is no output of a conv without --bias: a folder of that name is no obstacle. */
    assert_int_equal(rmdir(path), 0);
    assert_int_equal(mkdir(spconv_test_join(dir, "grad_bias.npy", path, sizeof path), 0777), 0);
    a = (arglist){0};
    const char *conv[] = {CONV_BASE, "--out", "@rb"};
    for (size_t i = 0; i < sizeof conv / sizeof conv[0]; ++i) arg_add(&a, f, "%s", conv[i]);
    assert_success(f, &a);
    assert_int_equal(spconv_test_count_entries(dir), 3);
}

/* `spconv help CMD` is `spconv CMD --help`; the help of each command mentions only what it has. */
static void test_help_command(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    arglist a = {0};
    arg_add(&a, f, "help");
    arg_add(&a, f, "maxpool");
    assert_success(f, &a);
    assert_non_null(strstr(f->out_text, "usage: spconv maxpool "));
    /* maxpool has no weight and no --subm; rulebook has --subm but no weight. */
    assert_null(strstr(f->out_text, "weight"));
    assert_null(strstr(f->out_text, "--subm"));
    a = (arglist){0};
    arg_add(&a, f, "rulebook");
    arg_add(&a, f, "--help");
    assert_success(f, &a);
    assert_null(strstr(f->out_text, "weight"));
    assert_non_null(strstr(f->out_text, "--subm uses (K/2)*dilation"));
    a = (arglist){0};
    arg_add(&a, f, "help");
    arg_add(&a, f, "conv");
    assert_success(f, &a);
    assert_non_null(strstr(f->out_text, "kernel size (default 3, or the 5-d weight's)"));
    a = (arglist){0};
    arg_add(&a, f, "help");
    arg_add(&a, f, "x");
    expect_error_line(f, &a, "spconv help: unknown command 'x' (see `spconv help`)");
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_conv_matches_c_api, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxpool_matches_c_api, setup, teardown),
cmocka_unit_test_setup_teardown(test_conv_and_maxpool_on_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rulebook_matches_c_api, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help_lists_the_contract, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors_exit_2_with_one_line_and_no_outputs, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_failed_output_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_checked_before_the_work, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv_inverse_matches_c_api, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help_command, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
