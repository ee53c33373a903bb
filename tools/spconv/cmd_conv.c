/* `spconv conv`, `spconv maxpool` and `spconv rulebook`: one sparse layer from .npy files to .npy
 * files, so that the kernels can be tested from any language. The interface is a contract (issue
 * 3); see each command's --help. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "commands.h"
#include "spconv/spconv.h"

/* The options every command of this file shares: the input sites and the layer geometry. */
typedef struct layer_args {
    const char *indices_path;
    int64_t spatial_shape[3];
    int64_t batch_size; /* 0 until given: then 1 + the largest batch index */
    int64_t kernel[3];
    /* Where the kernel came from, for messages: "--kernel", "the default kernel" or "the
     * --weight kernel". */
    const char *kernel_source;
    int64_t stride[3];
    int64_t padding[3];
    int64_t dilation[3];
    int64_t output_padding[3];
    int subm;
    int transposed;
    int inverse; /* conv only: the inverse of the regular conv this geometry describes */
    int64_t threads;
    const char *out_dir;
    const char *device; /* rulebook, conv, maxpool; NULL: the CPU */
} layer_args;

/* What every command holds while it runs; released by job_free. */
typedef struct layer_job {
    const char *cmd;
    const char *out_names[6]; /* the files --out receives, NULL-terminated */
    layer_args args;
    cli_spec spec;
    spconv_conv_params params;
    spconv_context *ctx;
    spconv_tensor *indices;
    spconv_rulebook *rb;
} layer_job;

#define MAX_LAYER_OPTIONS 20 /* conv, the largest command, has 18 */

static void layer_args_init(layer_args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < 3; ++i) {
        a->kernel[i] = 3;
        a->stride[i] = 1;
        a->dilation[i] = 1;
    }
    a->kernel_source = "the default kernel";
}

#define COORD_MAX ((int64_t)INT32_MAX)

/* Append the input-site options to opts[*n]. */
static void add_site_options(layer_args *a, cli_option *opts, int *n) {
    opts[(*n)++] = (cli_option){.name = "--indices", .kind = CLI_PATH, .value = &a->indices_path,
                                .metavar = "I.npy", .required = 1,
                                .help = "active sites, int32 [N, 4] rows (batch, z, y, x)"};
    opts[(*n)++] = (cli_option){.name = "--spatial-shape", .kind = CLI_TRIPLE,
                                .value = a->spatial_shape, .metavar = "D,H,W", .required = 1,
                                .min = 1, .max = COORD_MAX, .help = "sizes of the z, y, x axes"};
    opts[(*n)++] = (cli_option){.name = "--batch-size", .kind = CLI_INT, .value = &a->batch_size,
                                .metavar = "B", .min = 1, .max = COORD_MAX,
                                .help = "number of batches (default: 1 + largest batch index)"};
}

/* The required --features option; @p help names the dtypes and shape. */
static cli_option features_option(const char **path, const char *help) {
    return (cli_option){.name = "--features", .kind = CLI_PATH, .value = path, .metavar = "F.npy",
                        .required = 1, .help = help};
}

/* The --grad-out option, which makes a layer command run backward too. */
static cli_option grad_out_option(const char **path) {
    return (cli_option){.name = "--grad-out", .kind = CLI_PATH, .value = path, .metavar = "G.npy",
                        .help = "gradient of the output: run backward too"};
}

/* Which command the geometry options are for: their help says only what that command has. */
typedef enum geometry_for {
    GEOMETRY_CONV,     /* conv: the kernel may come from a 5-d weight */
    GEOMETRY_RULEBOOK, /* rulebook: --subm, --transposed, no weight */
    GEOMETRY_POOL      /* maxpool: always the regular geometry */
} geometry_for;

#define KERNEL_MAX 255

/* Append the geometry and output options of command @p cmd to opts[*n]: --subm, --transposed and
 * --output-padding are not for pooling, whose geometry is always the regular one. */
static void add_geometry_options(layer_args *a, cli_option *opts, int *n, geometry_for cmd) {
    const int with_kind = cmd != GEOMETRY_POOL;
    opts[(*n)++] = (cli_option){.name = "--kernel", .kind = CLI_TRIPLE, .value = a->kernel,
                                .metavar = "K|KD,KH,KW", .min = 1, .max = KERNEL_MAX,
                                .help = cmd == GEOMETRY_CONV
                                            ? "kernel size (default 3, or the 5-d weight's)"
                                            : "kernel size (default 3)"};
    opts[(*n)++] = (cli_option){.name = "--stride", .kind = CLI_TRIPLE, .value = a->stride,
                                .metavar = "S|SD,SH,SW", .min = 1, .max = COORD_MAX,
                                .help = "stride (default 1)"};
    opts[(*n)++] = (cli_option){.name = "--padding", .kind = CLI_TRIPLE, .value = a->padding,
                                .metavar = "P|PD,PH,PW", .min = 0, .max = COORD_MAX,
                                .help = with_kind
                                            ? "padding (default 0; --subm uses (K/2)*dilation)"
                                            : "padding (default 0)"};
    opts[(*n)++] = (cli_option){.name = "--dilation", .kind = CLI_TRIPLE, .value = a->dilation,
                                .metavar = "D|DD,DH,DW", .min = 1, .max = COORD_MAX,
                                .help = "dilation (default 1)"};
    if (with_kind) {
        opts[(*n)++] = (cli_option){.name = "--output-padding", .kind = CLI_TRIPLE,
                                    .value = a->output_padding, .metavar = "P|PD,PH,PW", .min = 0,
                                    .max = COORD_MAX,
                                    .help = "extra output size of --transposed (default 0)"};
        opts[(*n)++] = (cli_option){.name = "--subm", .kind = CLI_SWITCH, .value = &a->subm,
                                    .help = "submanifold: output sites = input sites"};
        opts[(*n)++] = (cli_option){.name = "--transposed", .kind = CLI_SWITCH,
                                    .value = &a->transposed, .help = "transposed convolution"};
    }
    if (cmd == GEOMETRY_CONV)
        opts[(*n)++] = (cli_option){.name = "--inverse", .kind = CLI_SWITCH, .value = &a->inverse,
                                    .help = "inverse of the regular conv of this geometry on "
                                            "--indices"};
    opts[(*n)++] = (cli_option){.name = "--threads", .kind = CLI_INT, .value = &a->threads,
                                .metavar = "N", .min = 1, .max = SPCONV_MAX_THREADS,
                                .help = "CPU threads (default: all cores)"};
    opts[(*n)++] = (cli_option){.name = "--out", .kind = CLI_PATH, .value = &a->out_dir,
                                .metavar = "DIR", .required = 1,
                                .help = "output folder (created; files appear only on success)"};
}

static int given(const layer_job *job, const char *name) {
    const cli_option *opt = cli_find_option(&job->spec, name);
    return opt != NULL && opt->given;
}

static int equal3(const int64_t a[3], const int64_t b[3]) {
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

/* Combinations of flags that make no sense, caught before any file is read. */
static int check_flag_combinations(const layer_job *job) {
    const layer_args *a = &job->args;
    if (a->subm && a->transposed)
        return cli_error(job->cmd, "--subm and --transposed exclude each other");
    if (a->inverse && (a->subm || a->transposed))
        return cli_error(job->cmd, "--inverse inverts a regular conv: it excludes %s",
                         a->subm ? "--subm" : "--transposed");
    if (given(job, "--output-padding") && !a->transposed)
        return cli_error(job->cmd, "--output-padding needs --transposed");
    const int64_t one[3] = {1, 1, 1};
    if (a->subm && !equal3(a->stride, one))
        return cli_error(job->cmd, "--stride %lld,%lld,%lld: a submanifold conv has stride 1",
                         (long long)a->stride[0], (long long)a->stride[1], (long long)a->stride[2]);
    return 0;
}

/* Fill job->params from the arguments once the kernel is final (it may come from a weight). */
static int make_params(layer_job *job) {
    const layer_args *a = &job->args;
    spconv_conv_kind kind = a->subm         ? SPCONV_CONV_SUBM
                            : a->transposed ? SPCONV_CONV_TRANSPOSED
                                            : SPCONV_CONV_REGULAR;
    job->params = spconv_conv_params_default(kind);
    spconv_conv_params *p = &job->params;
    for (int i = 0; i < 3; ++i) {
        p->kernel[i] = a->kernel[i];
        p->stride[i] = a->stride[i];
        p->padding[i] = a->subm ? (a->kernel[i] / 2) * a->dilation[i] : a->padding[i];
        p->dilation[i] = a->dilation[i];
        p->output_padding[i] = a->output_padding[i];
    }
    /* A submanifold conv fixes its padding; a different explicit one would be silently ignored. */
    if (a->subm && given(job, "--padding") && !equal3(a->padding, p->padding))
        return cli_error(job->cmd, "--padding: a submanifold conv pads (K/2)*dilation = "
                         "%lld,%lld,%lld here", (long long)p->padding[0],
                         (long long)p->padding[1], (long long)p->padding[2]);
    return 0;
}

static const char axis_names[3] = {'z', 'y', 'x'};

/* One axis's output extent, as the rulebook builder computes it. */
static int64_t output_size(const spconv_conv_params *p, int axis, int64_t in) {
    const int64_t k = p->kernel[axis], s = p->stride[axis], pad = p->padding[axis],
                  d = p->dilation[axis];
    if (p->kind == SPCONV_CONV_SUBM) return in;
    if (p->kind == SPCONV_CONV_TRANSPOSED)
        return (in - 1) * s - 2 * pad + d * (k - 1) + 1 + p->output_padding[axis];
    const int64_t span = in + 2 * pad - d * (k - 1) - 1; /* floor division, as PyTorch */
    return span < 0 ? 0 : span / s + 1;
}

/* The geometry rules of the rulebook builder, checked here so that the message names the option
 * and the axis rather than a library parameter (kernel[0], output_padding[2]). */
static int check_geometry(const layer_job *job) {
    const layer_args *a = &job->args;
    const spconv_conv_params *p = &job->params;
    for (int axis = 0; axis < 3; ++axis) {
        const char name = axis_names[axis];
        if (a->subm && p->kernel[axis] % 2 == 0)
            return cli_error(job->cmd, "%s %lld,%lld,%lld: %c = %lld is even; --subm needs odd "
                             "kernel sizes", a->kernel_source, (long long)p->kernel[0],
                             (long long)p->kernel[1], (long long)p->kernel[2], name,
                             (long long)p->kernel[axis]);
        const int64_t limit = p->stride[axis] > p->dilation[axis] ? p->stride[axis]
                                                                  : p->dilation[axis];
        if (a->transposed && p->output_padding[axis] >= limit)
            return cli_error(job->cmd, "--output-padding %lld,%lld,%lld: %c = %lld must be less "
                             "than max(--stride %lld, --dilation %lld) = %lld",
                             (long long)p->output_padding[0], (long long)p->output_padding[1],
                             (long long)p->output_padding[2], name,
                             (long long)p->output_padding[axis], (long long)p->stride[axis],
                             (long long)p->dilation[axis], (long long)limit);
        const int64_t size = output_size(p, axis, a->spatial_shape[axis]);
        if (size <= 0 || size > COORD_MAX)
            return cli_error(job->cmd, "--spatial-shape %lld,%lld,%lld: on %c, input %lld with "
                             "kernel %lld (%s), stride %lld, padding %lld, dilation %lld gives an "
                             "output of %lld, %s", (long long)a->spatial_shape[0],
                             (long long)a->spatial_shape[1], (long long)a->spatial_shape[2], name,
                             (long long)a->spatial_shape[axis], (long long)p->kernel[axis],
                             a->kernel_source, (long long)p->stride[axis],
                             (long long)p->padding[axis], (long long)p->dilation[axis],
                             (long long)size,
                             size <= 0 ? "which is empty" : "beyond int32 coordinates");
    }
    return 0;
}

/* A tensor must have @p ndim dims of @p sizes (entries < 0 match any size) and @p dtype (< 0:
 * f16, f32 or f64, the floating dtypes of .npy); @p expected says it in words for the message. */
static int require_tensor(const char *cmd, const char *flag, const spconv_tensor *t, int dtype,
                          int ndim, const int64_t *sizes, const char *expected) {
    spconv_dtype actual = spconv_tensor_dtype(t);
    int ok = dtype < 0 ? (actual == SPCONV_F16 || actual == SPCONV_F32 || actual == SPCONV_F64)
                     : (int)actual == dtype;
    ok = ok && spconv_tensor_ndim(t) == ndim;
    for (int i = 0; ok && i < ndim; ++i) ok = sizes[i] < 0 || sizes[i] == spconv_tensor_size(t, i);
    if (ok) return 0;
    char got[160];
    cli_describe_tensor(t, got, sizeof got);
    return cli_error(cmd, "%s: expected %s, got %s", flag, expected, got);
}

/* --features: floating [N, C] with a row per --indices row. */
static int require_features(const layer_job *job, const spconv_tensor *features) {
    const int64_t n = spconv_tensor_size(job->indices, 0);
    char expected[96];
    snprintf(expected, sizeof expected, "f16, f32 or f64 [N, C] with N = %lld (the --indices rows)",
             (long long)n);
    return require_tensor(job->cmd, "--features", features, -1, 2, (const int64_t[2]){n, -1},
                          expected);
}

/* --features of --inverse: a row per output site of the regular conv it inverts. */
static int require_inverse_features(const layer_job *job, const spconv_tensor *features) {
    const int64_t n = spconv_rulebook_num_in(job->rb);
    char expected[200];
    snprintf(expected, sizeof expected, "f16, f32 or f64 [N, C] with N = %lld (the output sites of "
             "the regular conv that --inverse inverts, as `spconv rulebook` lists them)",
             (long long)n);
    return require_tensor(job->cmd, "--features", features, -1, 2, (const int64_t[2]){n, -1},
                          expected);
}

/* Read --indices, default the batch size, and make the context. */
static int load_sites(layer_job *job) {
    layer_args *a = &job->args;
    int rc = cli_read_npy(job->cmd, "--indices", a->indices_path, &job->indices);
    if (rc != 0) return rc;
    const int64_t sizes[2] = {-1, 4};
    rc = require_tensor(job->cmd, "--indices", job->indices, SPCONV_I32, 2, sizes, "int32 [N, 4]");
    if (rc != 0) return rc;
    if (!given(job, "--batch-size")) {
        /* Rows with a negative batch index are left to the rulebook builder to report. */
        const int32_t *rows = spconv_tensor_data(job->indices);
        int64_t largest = 0;
        for (int64_t i = 0; i < spconv_tensor_size(job->indices, 0); ++i)
            if (rows[4 * i] > largest) largest = rows[4 * i];
        a->batch_size = largest + 1;
    }
    spconv_device device;
    rc = cli_parse_device(job->cmd, "--device", a->device, &device);
    if (rc != 0) return rc;
    spconv_status st = spconv_context_create(device, &job->ctx);
    if (st == SPCONV_OK && a->threads > 0)
        st = spconv_context_set_num_threads(job->ctx, (int)a->threads);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "creating the context");
    if (device.type == SPCONV_DEVICE_CPU) return 0;
    spconv_tensor *on_device;
    st = spconv_tensor_to_device(job->ctx, job->indices, device, &on_device);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "copying --indices to the device");
    spconv_tensor_release(job->indices);
    job->indices = on_device;
    return 0;
}

static int build_rulebook(layer_job *job) {
    int rc = check_geometry(job);
    if (rc != 0) return rc;
    spconv_status st = spconv_rulebook_build(job->ctx, job->indices, job->args.spatial_shape,
                                             job->args.batch_size, &job->params, &job->rb);
    if (st == SPCONV_OK && job->args.inverse) {
        /* The forward conv's pairs, swapped: outputs are the --indices rows, in their order. */
        spconv_rulebook *forward = job->rb;
        job->rb = NULL;
        st = spconv_rulebook_inverse(forward, &job->rb);
        spconv_rulebook_release(forward);
        if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "inverting the rulebook");
    }
    if (st == SPCONV_OK) return 0;
    if (st < 100 || st >= 200) return cli_status_error(job->cmd, st, "building the rulebook");
    /* The geometry was checked above: what the builder still refuses is a row of --indices
     * (outside the shape or the batch size, repeated). Its function name says nothing here. */
    const char *detail = spconv_last_error();
    static const char func[] = "spconv_rulebook_build: ";
    if (strncmp(detail, func, sizeof func - 1) == 0) detail += sizeof func - 1;
    cli_error(job->cmd, "--indices '%s': %s", job->args.indices_path,
              detail[0] != '\0' ? detail : spconv_status_string(st));
    return CLI_EXIT_USAGE;
}

static void job_free(layer_job *job) {
    spconv_rulebook_release(job->rb);
    spconv_tensor_release(job->indices);
    spconv_context_destroy(job->ctx);
}

/* Parse the command line into job->args; 1 to go on, 0 to return *exit_status. */
static int parse_job(layer_job *job, cli_option *opts, int num_opts, const char *summary,
                     const char *epilog, int argc, char **argv, int *exit_status) {
    job->spec = (cli_spec){.command = job->cmd, .summary = summary, .options = opts,
                           .num_options = num_opts, .epilog = epilog};
    if (!cli_parse(&job->spec, argc, argv, exit_status)) return 0;
    if (given(job, "--kernel")) job->args.kernel_source = "--kernel";
    *exit_status = check_flag_combinations(job);
    return *exit_status == 0;
}

/* Before any file is read: --out can take job->out_names. */
static int check_out(const layer_job *job) {
    return cli_outdir_check(job->cmd, job->args.out_dir, job->out_names);
}

/* Write job->out_names[i] = tensors[i] into --out, all or none. */
static int write_outputs(const layer_job *job, spconv_tensor *const *tensors) {
    cli_outdir od;
    int rc = cli_outdir_open(&od, job->cmd, job->args.out_dir);
    for (int i = 0; rc == 0 && job->out_names[i] != NULL; ++i)
        rc = cli_outdir_write_npy(&od, job->ctx, job->out_names[i], tensors[i]);
    if (rc == 0) rc = cli_outdir_commit(&od);
    cli_outdir_close(&od);
    return rc;
}

/* ==== conv ==================================================================================== */

typedef struct conv_job {
    layer_job base;
    const char *features_path, *weight_path, *bias_path, *grad_out_path;
    int layout; /* index into layout_names, in spconv_weight_layout order */
    int weight_ndim;
    spconv_tensor *features, *weight_given, *weight, *bias, *grad_out;
    spconv_tensor *out, *grad_features, *grad_weight_rsck, *grad_weight, *grad_bias;
} conv_job;

static const char *const layout_names[] = {"rsck", "krsc", "oidhw", NULL};
static const spconv_weight_layout layouts[] = {SPCONV_WEIGHT_RSCK, SPCONV_WEIGHT_KRSC,
                                               SPCONV_WEIGHT_OIDHW};

static void conv_job_free(conv_job *j) {
    spconv_tensor *tensors[] = {j->features, j->weight_given, j->weight, j->bias,
                                j->grad_out, j->out, j->grad_features, j->grad_weight_rsck,
                                j->grad_weight, j->grad_bias};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
    job_free(&j->base);
}

/* RSCK is accepted 3-d [KV, C_in, C_out] (kernel from --kernel) or 5-d [KD, KH, KW, C_in, C_out];
 * the other layouts are 5-d and are converted. Sets j->weight to 3-d RSCK and the kernel. */
static int weight_to_rsck(conv_job *j) {
    layer_job *job = &j->base;
    const spconv_tensor *w = j->weight_given;
    spconv_weight_layout layout = layouts[j->layout];
    j->weight_ndim = spconv_tensor_ndim(w);
    const int64_t *k = job->args.kernel;
    if (layout == SPCONV_WEIGHT_RSCK && j->weight_ndim == 3) {
        int64_t kv = k[0] * k[1] * k[2];
        const int64_t sizes[3] = {kv, -1, -1};
        spconv_tensor_retain(j->weight_given);
        j->weight = j->weight_given;
        char expected[160];
        snprintf(expected, sizeof expected, "[KV, C_in, C_out] with KV = %lld, the volume of %s "
                 "%lld,%lld,%lld (or a 5-d weight)", (long long)kv, job->args.kernel_source,
                 (long long)k[0], (long long)k[1], (long long)k[2]);
        return require_tensor(job->cmd, "--weight", w, spconv_tensor_dtype(w), 3, sizes,
                              expected);
    }
    if (j->weight_ndim != 5) {
        const char *expected = "5-d OIDHW [C_out, C_in, KD, KH, KW]";
        if (layout == SPCONV_WEIGHT_RSCK) expected = "3-d or 5-d RSCK";
        if (layout == SPCONV_WEIGHT_KRSC) expected = "5-d KRSC [C_out, KD, KH, KW, C_in]";
        return require_tensor(job->cmd, "--weight", w, spconv_tensor_dtype(w), 5,
                              (const int64_t[5]){-1, -1, -1, -1, -1}, expected);
    }
    /* Where the kernel sits in each layout's shape: RSCK [KD, KH, KW, ..], KRSC [C_out, KD, ..],
     * OIDHW [C_out, C_in, KD, ..]. Checked here, as --kernel is, before the library sees it. */
    const int first = layout == SPCONV_WEIGHT_RSCK ? 0 : layout == SPCONV_WEIGHT_KRSC ? 1 : 2;
    const int64_t *shape = spconv_tensor_sizes(w);
    for (int axis = 0; axis < 3; ++axis) {
        if (shape[first + axis] >= 1 && shape[first + axis] <= KERNEL_MAX) continue;
        return cli_error(job->cmd, "--weight shape [%lld, %lld, %lld, %lld, %lld] gives kernel "
                         "%lld,%lld,%lld; each kernel size must be in [1, %d]",
                         (long long)shape[0], (long long)shape[1], (long long)shape[2],
                         (long long)shape[3], (long long)shape[4], (long long)shape[first],
                         (long long)shape[first + 1], (long long)shape[first + 2], KERNEL_MAX);
    }
    int64_t kernel[3];
    spconv_status st = spconv_weight_to_rsck(job->ctx, w, layout, kernel, &j->weight);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "--weight");
    if (given(job, "--kernel") && !equal3(kernel, job->args.kernel))
        return cli_error(job->cmd, "--kernel %lld,%lld,%lld disagrees with the --weight kernel "
                         "%lld,%lld,%lld", (long long)job->args.kernel[0],
                         (long long)job->args.kernel[1], (long long)job->args.kernel[2],
                         (long long)kernel[0], (long long)kernel[1], (long long)kernel[2]);
    memcpy(job->args.kernel, kernel, sizeof kernel);
    job->args.kernel_source = "the --weight kernel";
    return 0;
}

/* @p *t moved to the context's device (nothing to do on the CPU): the .npy files are read on
 * the host, the layer runs where --device says, and the outputs are copied back when written. */
static int to_job_device(layer_job *job, spconv_tensor **t, const char *what) {
    const spconv_device device = spconv_context_device(job->ctx);
    if (*t == NULL || spconv_device_equal(spconv_tensor_device(*t), device)) return 0;
    spconv_tensor *moved = NULL;
    const spconv_status st = spconv_tensor_to_device(job->ctx, *t, device, &moved);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, what);
    spconv_tensor_release(*t);
    *t = moved;
    return 0;
}

static cli_option device_option(layer_args *a) {
    return (cli_option){.name = "--device", .kind = CLI_PATH, .value = &a->device,
                        .metavar = "cpu|cuda[:N]",
                        .help = "where the rulebook and the layer run (default cpu; the inputs are "
                                "read and the outputs written on the host)"};
}

/* Features, weight and bias: read, shapes and dtypes checked against each other. */
static int conv_load(conv_job *j) {
    layer_job *job = &j->base;
    int rc = cli_read_npy(job->cmd, "--features", j->features_path, &j->features);
    /* An inverse conv's features sit on the forward conv's outputs: checked once it is built. */
    if (rc == 0 && !job->args.inverse) rc = require_features(job, j->features);
    if (rc == 0) rc = cli_read_npy(job->cmd, "--weight", j->weight_path, &j->weight_given);
    if (rc != 0) return rc;
    spconv_dtype dtype = spconv_tensor_dtype(j->features);
    if (spconv_tensor_dtype(j->weight_given) != dtype)
        return cli_error(job->cmd, "dtype mismatch: --weight is %s but --features is %s; they "
                         "must match", spconv_dtype_name(spconv_tensor_dtype(j->weight_given)),
                         spconv_dtype_name(dtype));
    rc = weight_to_rsck(j);
    if (rc != 0) return rc;
    int64_t c_in = spconv_tensor_size(j->weight, 1), c_out = spconv_tensor_size(j->weight, 2);
    if (spconv_tensor_size(j->features, 1) != c_in)
        return cli_error(job->cmd, "channel mismatch: --features has C = %lld channels but "
                         "--weight expects C_in = %lld",
                         (long long)spconv_tensor_size(j->features, 1), (long long)c_in);
    if (j->bias_path == NULL) return 0;
    rc = cli_read_npy(job->cmd, "--bias", j->bias_path, &j->bias);
    if (rc != 0) return rc;
    char expected[64];
    snprintf(expected, sizeof expected, "%s [C_out = %lld]", spconv_dtype_name(dtype),
             (long long)c_out);
    return require_tensor(job->cmd, "--bias", j->bias, (int)dtype, 1, &c_out, expected);
}

/* grad_weight in the layout the weight came in. */
static int grad_weight_to_layout(conv_job *j) {
    layer_job *job = &j->base;
    spconv_status st;
    if (layouts[j->layout] == SPCONV_WEIGHT_RSCK && j->weight_ndim == 3) {
        spconv_tensor_retain(j->grad_weight_rsck);
        j->grad_weight = j->grad_weight_rsck;
        return 0;
    }
    if (layouts[j->layout] == SPCONV_WEIGHT_RSCK)
        st = spconv_tensor_reshape(job->ctx, j->grad_weight_rsck, 5,
                                   spconv_tensor_sizes(j->weight_given), &j->grad_weight);
    else
        st = spconv_weight_from_rsck(job->ctx, j->grad_weight_rsck, job->args.kernel,
                                     layouts[j->layout], &j->grad_weight);
    return st == SPCONV_OK ? 0 : cli_status_error(job->cmd, st, "converting grad_weight");
}

/* Read --grad-out and check it has the dtype and shape of the forward output @p out, whose
 * channel count the message calls @p channels. */
static int read_grad_out(const char *cmd, const char *path, const spconv_tensor *out,
                         const char *channels, spconv_tensor **grad_out) {
    int rc = cli_read_npy(cmd, "--grad-out", path, grad_out);
    if (rc != 0) return rc;
    const int64_t sizes[2] = {spconv_tensor_size(out, 0), spconv_tensor_size(out, 1)};
    char expected[96];
    snprintf(expected, sizeof expected, "%s [N_out = %lld, %s = %lld]",
             spconv_dtype_name(spconv_tensor_dtype(out)), (long long)sizes[0], channels,
             (long long)sizes[1]);
    return require_tensor(cmd, "--grad-out", *grad_out, (int)spconv_tensor_dtype(out), 2, sizes,
                          expected);
}

static int conv_backward(conv_job *j) {
    layer_job *job = &j->base;
    int rc = read_grad_out(job->cmd, j->grad_out_path, j->out, "C_out", &j->grad_out);
    if (rc == 0) rc = to_job_device(job, &j->grad_out, "--grad-out");
    if (rc != 0) return rc;
    spconv_status st = spconv_conv_backward(job->ctx, job->rb, j->features, j->weight,
                                            j->grad_out, &j->grad_features, &j->grad_weight_rsck,
                                            j->bias ? &j->grad_bias : NULL);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "backward");
    return grad_weight_to_layout(j);
}

static int conv_run(conv_job *j) {
    layer_job *job = &j->base;
    int rc = load_sites(job);
    if (rc == 0) rc = conv_load(j);
    if (rc == 0) rc = make_params(job);
    if (rc == 0) rc = build_rulebook(job);
    if (rc == 0 && job->args.inverse) rc = require_inverse_features(job, j->features);
    if (rc == 0) rc = to_job_device(job, &j->features, "--features");
    if (rc == 0) rc = to_job_device(job, &j->weight, "--weight");
    if (rc == 0) rc = to_job_device(job, &j->bias, "--bias");
    if (rc != 0) return rc;
    spconv_status st = spconv_conv_forward(job->ctx, job->rb, j->features, j->weight, j->bias,
                                           &j->out);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "forward");
    if (j->grad_out_path != NULL) {
        rc = conv_backward(j);
        if (rc != 0) return rc;
    }
    /* In the order of conv_output_names. */
    spconv_tensor *outputs[5] = {spconv_rulebook_out_indices(job->rb), j->out, j->grad_features,
                                 j->grad_weight, j->grad_bias};
    return write_outputs(job, outputs);
}

/* What conv writes: backward adds the gradients, a bias adds its gradient. */
static void conv_output_names(conv_job *j) {
    const char **names = j->base.out_names;
    int n = 0;
    names[n++] = "indices.npy";
    names[n++] = "features.npy";
    if (j->grad_out_path != NULL) {
        names[n++] = "grad_features.npy";
        names[n++] = "grad_weight.npy";
        if (j->bias_path != NULL) names[n++] = "grad_bias.npy";
    }
    names[n] = NULL;
}

int spconv_cmd_conv(int argc, char **argv) {
    conv_job j = {.base.cmd = "conv"};
    layer_args_init(&j.base.args);
    cli_option opts[MAX_LAYER_OPTIONS];
    int n = 0;
    add_site_options(&j.base.args, opts, &n);
    opts[n++] = features_option(&j.features_path, "input features, f16, f32 or f64 [N, C_in]");
    opts[n++] = (cli_option){.name = "--weight", .kind = CLI_PATH, .value = &j.weight_path,
                             .metavar = "W.npy", .required = 1,
                             .help = "weight in --weight-layout, dtype of the features"};
    opts[n++] = (cli_option){.name = "--weight-layout", .kind = CLI_CHOICE, .value = &j.layout,
                             .metavar = "rsck|krsc|oidhw", .choices = layout_names,
                             .help = "rsck [KV|KD,KH,KW, C_in, C_out] (default), krsc, oidhw"};
    opts[n++] = (cli_option){.name = "--bias", .kind = CLI_PATH, .value = &j.bias_path,
                             .metavar = "BIAS.npy", .help = "bias [C_out]"};
    opts[n++] = grad_out_option(&j.grad_out_path);
    opts[n++] = device_option(&j.base.args);
    add_geometry_options(&j.base.args, opts, &n, GEOMETRY_CONV);
    int status;
    if (parse_job(&j.base, opts, n, "Sparse 3D convolution: regular, --subm, --transposed or "
                  "--inverse.",
                  "writes DIR/indices.npy (int32 [N_out, 4]), DIR/features.npy ([N_out, C_out]);\n"
                  "with --grad-out also DIR/grad_features.npy, DIR/grad_weight.npy (the weight's\n"
                  "layout) and, with --bias, DIR/grad_bias.npy.\n"
                  "--inverse (spconv's SparseInverseConv3d): the geometry options and --indices\n"
                  "describe the regular conv that is inverted (its forward input); --features\n"
                  "holds a row per output site of that conv, in its order (sorted by b, z, y, x:\n"
                  "`spconv rulebook` with the same options writes them as out_indices.npy). The\n"
                  "pairs are that conv's, swapped, and the output sites are the --indices rows in\n"
                  "their order (indices.npy = --indices).",
                  argc, argv, &status)) {
        conv_output_names(&j);
        status = check_out(&j.base);
        if (status == 0) status = conv_run(&j);
    }
    conv_job_free(&j);
    return status;
}

/* ==== maxpool ================================================================================= */

typedef struct pool_job {
    layer_job base;
    const char *features_path, *grad_out_path;
    spconv_tensor *features, *out, *argmax, *grad_out, *grad_features;
} pool_job;

static int pool_backward(pool_job *j) {
    layer_job *job = &j->base;
    int rc = read_grad_out(job->cmd, j->grad_out_path, j->out, "C", &j->grad_out);
    if (rc == 0) rc = to_job_device(job, &j->grad_out, "--grad-out");
    if (rc != 0) return rc;
    spconv_status st = spconv_maxpool_backward(job->ctx, job->rb, j->argmax, j->grad_out,
                                               &j->grad_features);
    return st == SPCONV_OK ? 0 : cli_status_error(job->cmd, st, "backward");
}

static int pool_run(pool_job *j) {
    layer_job *job = &j->base;
    int rc = load_sites(job);
    if (rc == 0) rc = cli_read_npy(job->cmd, "--features", j->features_path, &j->features);
    if (rc == 0) rc = require_features(job, j->features);
    if (rc == 0) rc = make_params(job);
    if (rc == 0) rc = build_rulebook(job);
    if (rc == 0) rc = to_job_device(job, &j->features, "--features");
    if (rc != 0) return rc;
    spconv_status st = spconv_maxpool_forward(job->ctx, job->rb, j->features, &j->out,
                                              j->grad_out_path ? &j->argmax : NULL);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "forward");
    if (j->grad_out_path != NULL) {
        rc = pool_backward(j);
        if (rc != 0) return rc;
    }
    spconv_tensor *outputs[3] = {spconv_rulebook_out_indices(job->rb), j->out, j->grad_features};
    return write_outputs(job, outputs);
}

int spconv_cmd_maxpool(int argc, char **argv) {
    pool_job j = {.base.cmd = "maxpool"};
    layer_args_init(&j.base.args);
    cli_option opts[MAX_LAYER_OPTIONS];
    int n = 0;
    add_site_options(&j.base.args, opts, &n);
    opts[n++] = features_option(&j.features_path, "input features, f16, f32 or f64 [N, C]");
    opts[n++] = grad_out_option(&j.grad_out_path);
    opts[n++] = device_option(&j.base.args);
    add_geometry_options(&j.base.args, opts, &n, GEOMETRY_POOL);
    int status;
    if (parse_job(&j.base, opts, n, "Sparse 3D max pooling (the regular conv geometry).",
                  "writes DIR/indices.npy (int32 [N_out, 4]), DIR/features.npy ([N_out, C]);\n"
                  "with --grad-out also DIR/grad_features.npy ([N, C]).",
                  argc, argv, &status)) {
        const char **names = j.base.out_names;
        names[0] = "indices.npy";
        names[1] = "features.npy";
        names[2] = j.grad_out_path != NULL ? "grad_features.npy" : NULL;
        status = check_out(&j.base);
        if (status == 0) status = pool_run(&j);
    }
    spconv_tensor *tensors[] = {j.features, j.out, j.argmax, j.grad_out, j.grad_features};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
    job_free(&j.base);
    return status;
}

/* ==== rulebook ================================================================================ */

/* counts int64 [KV] and pairs int64 [M, 3] rows (offset, in_row, out_row) from the rulebook. */
static int rulebook_tables(layer_job *job, spconv_tensor **counts, spconv_tensor **pairs) {
    int64_t kv = spconv_rulebook_kernel_volume(job->rb);
    int64_t m = spconv_rulebook_num_pairs(job->rb);
    const int64_t active = spconv_rulebook_num_active_offsets(job->rb);
    const int64_t *ks = spconv_rulebook_active_offsets(job->rb);
    const int64_t *starts = spconv_rulebook_active_starts(job->rb);
    spconv_status st = spconv_tensor_empty(spconv_cpu(), SPCONV_I64, 1, &kv, counts);
    if (st == SPCONV_OK)
        st = spconv_tensor_empty(spconv_cpu(), SPCONV_I64, 2, (const int64_t[2]){m, 3}, pairs);
    int32_t *rows = m > 0 ? malloc((size_t)m * 2 * sizeof *rows) : NULL;
    if (st == SPCONV_OK && m > 0 && rows == NULL)
        return cli_error(job->cmd, "out of memory for %lld pairs", (long long)m);
    if (st == SPCONV_OK && m > 0)
        st = spconv_tensor_copy_to_host(job->ctx, spconv_rulebook_pairs_in(job->rb), rows,
                                        (size_t)m * sizeof *rows);
    if (st == SPCONV_OK && m > 0)
        st = spconv_tensor_copy_to_host(job->ctx, spconv_rulebook_pairs_out(job->rb), rows + m,
                                        (size_t)m * sizeof *rows);
    if (st == SPCONV_OK) {
        int64_t *count_data = spconv_tensor_data(*counts), *pair_data = spconv_tensor_data(*pairs);
        for (int64_t k = 0; k < kv; ++k) count_data[k] = 0;
        for (int64_t j = 0; j < active; ++j) {
            count_data[ks[j]] = starts[j + 1] - starts[j];
            for (int64_t p = starts[j]; p < starts[j + 1]; ++p) {
                pair_data[3 * p] = ks[j];
                pair_data[3 * p + 1] = rows[p];
                pair_data[3 * p + 2] = rows[m + p];
            }
        }
    }
    free(rows);
    return st == SPCONV_OK ? 0 : cli_status_error(job->cmd, st, "reading the rulebook");
}

static int rulebook_run(layer_job *job, spconv_tensor **counts, spconv_tensor **pairs) {
    int rc = load_sites(job);
    if (rc == 0) rc = make_params(job);
    if (rc == 0) rc = build_rulebook(job);
    if (rc == 0) rc = rulebook_tables(job, counts, pairs);
    if (rc != 0) return rc;
    spconv_tensor *outputs[3] = {spconv_rulebook_out_indices(job->rb), *counts, *pairs};
    return write_outputs(job, outputs);
}

int spconv_cmd_rulebook(int argc, char **argv) {
    layer_job job = {.cmd = "rulebook"};
    layer_args_init(&job.args);
    cli_option opts[MAX_LAYER_OPTIONS];
    int n = 0;
    add_site_options(&job.args, opts, &n);
    add_geometry_options(&job.args, opts, &n, GEOMETRY_RULEBOOK);
    opts[n++] = (cli_option){.name = "--device", .kind = CLI_PATH, .value = &job.args.device,
                             .metavar = "cpu|cuda[:N]",
                             .help = "where to build (default cpu; the rulebook is the same)"};
    spconv_tensor *counts = NULL, *pairs = NULL;
    int status;
    if (parse_job(&job, opts, n, "The rulebook of a sparse conv: which input row feeds which "
                  "output row through each kernel offset.",
                  "writes DIR/out_indices.npy (int32 [N_out, 4]), DIR/counts.npy (int64 [KV]) and\n"
                  "DIR/pairs.npy (int64 [M, 3] rows (offset, in_row, out_row), grouped by offset).",
                  argc, argv, &status)) {
        const char *names[] = {"out_indices.npy", "counts.npy", "pairs.npy", NULL};
        memcpy(job.out_names, names, sizeof names);
        status = check_out(&job);
        if (status == 0) status = rulebook_run(&job, &counts, &pairs);
    }
    spconv_tensor_release(counts);
    spconv_tensor_release(pairs);
    job_free(&job);
    return status;
}
