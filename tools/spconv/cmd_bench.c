/* `spconv bench`: times a zoo network's forward (and backward) pass with warm-up and
 * repetitions, per layer and per phase, as spconv's own network benchmark does (rulebook
 * building counted in every forward). See `spconv bench --help` and docs/benchmarks.md for the
 * JSON schema. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_report.h"
#include "cli_args.h"
#include "commands.h"
#include "conv/conv_exec.h"
#include "conv/fused.h"
#include "conv/gemm.h"
#include "conv/gemm_peak.h"
#include "core/device_clock.h"
#include "core/error.h"
#include "io/pointcloud_file.h"
#include "net_args.h"
#include "tensor/tensor_impl.h"
#include "spconv/spconv.h"

#define PEAK_REPEAT 3

typedef struct bench_args {
    int net;
    int dtype;          /* index into net_dtype_names */
    const char *input;  /* NULL: the bundled sample */
    int64_t repeat;
    int64_t warmup;
    int backward;
    int input_grad;
    int64_t replicate;
    int64_t threads;    /* 0: all cores */
    const char *device; /* --device; NULL: the CPU */
    int64_t peak_size;  /* 0: do not measure the sgemm peak */
    int peak_every_pass; /* measure it again after every timed pass */
    int phases;          /* time the conv phases on a GPU's clock */
    int64_t seed;
    const char *json;
} bench_args;

typedef struct bench_job {
    const char *cmd;
    bench_args args;
    bench_run run; /* what the report prints (bench_report.h) */
    spconv_context *ctx;
    spconv__device_clock *clock; /* the device's own clock; NULL on the CPU */
    spconv_net *net;
    net_input input;
    spconv_tensor *grad; /* the fixed output gradient of --backward */
    spconv__file_writer json; /* the JSON's temporary, opened after the timing */
} bench_job;

/* ---- one pass --------------------------------------------------------------------------------- */

/* A fixed pseudo-random gradient of @p out's shape: every backward sees the same one. */
static int make_grad(bench_job *job, const spconv_tensor *out) {
    spconv_status st = spconv_tensor_empty(spconv_cpu(), SPCONV_F32, spconv_tensor_ndim(out),
                                           spconv_tensor_sizes(out), &job->grad);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "the output gradient");
    float *g = spconv_tensor_data(job->grad);
    uint64_t state = (uint64_t)job->args.seed * 2654435761u + 1;
    for (int64_t i = 0; i < spconv_tensor_numel(job->grad); ++i) {
        state = state * 6364136223846793005u + 1442695040888963407u; /* speed, not quality */
        g[i] = (float)(state >> 40) * 0x1.0p-23f - 1.0f;
    }
    /* In the output's dtype, on its device (where the network ran); a reference on the CPU. */
    spconv_tensor *moved = NULL, *typed = NULL;
    st = spconv_tensor_to_dtype(job->ctx, job->grad, spconv_tensor_dtype(out), &typed);
    spconv_tensor_release(job->grad);
    job->grad = typed;
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "the output gradient");
    st = spconv_tensor_to_device(job->ctx, job->grad, spconv_tensor_device(out), &moved);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "the output gradient");
    spconv_tensor_release(job->grad);
    job->grad = moved;
    return 0;
}

static double unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void record(bench_samples *s, int rep, const spconv_net *net, int backward, double wall,
                   double start_unix) {
    size_t live, peak;
    spconv__cpu_memory_usage(&live, &peak);
    s->tensor_mib[rep] = (double)peak / (1024.0 * 1024.0);
    s->wall[rep] = wall;
    s->start[rep] = start_unix;
    for (int i = 0; i < s->layers; ++i) {
        const spconv_layer_stats *st = spconv_net_stats(net, i);
        const spconv_phase_ms *p = backward ? &st->backward : &st->forward;
        const double values[BENCH_PHASES] = {p->total, p->rulebook, p->gather,
                                             p->gemm, p->scatter, p->other};
        memcpy(bench_sample(s, rep, i), values, sizeof values);
    }
}

/* One forward (and backward) on a fresh input; recorded as repetition @p rep unless it is < 0. */
static int one_pass(bench_job *job, int rep) {
    spconv_sparse_tensor *input = NULL;
    spconv_tensor *out = NULL;
    int rc = net_input_sparse(job->cmd, job->ctx, &job->input, spconv_net_dtype(job->net),
                              &input);
    if (rc != 0) return rc;
    const spconv_net_mode mode = job->args.backward ? SPCONV_NET_TRAINING : SPCONV_NET_INFERENCE;
    double start_unix = unix_ms();
    spconv__cpu_memory_reset_peak();
    double start = net_now_ms(), device_ms = 0.0;
    int first = -1, last = -1;
    spconv_status st = spconv__device_clock_mark(job->clock, job->ctx, &first);
    if (st == SPCONV_OK) st = spconv_net_forward(job->ctx, job->net, input, mode, &out, NULL);
    if (st == SPCONV_OK) st = spconv__device_clock_mark(job->clock, job->ctx, &last);
    /* On a GPU the ops return once their work is queued: the pass ends when the device is done
     * (a no-op on the CPU). */
    if (st == SPCONV_OK) st = spconv_context_synchronize(job->ctx);
    const double forward_ms = net_now_ms() - start;
    if (st == SPCONV_OK) st = spconv__device_clock_span(job->clock, first, last, &device_ms);
    if (st == SPCONV_OK) st = spconv__device_clock_resolve(job->clock);
    if (st != SPCONV_OK) spconv__device_clock_reset(job->clock); /* no span outlives device_ms */
    if (st != SPCONV_OK) rc = cli_status_error(job->cmd, st, "forward");
    if (rc == 0 && rep >= 0) {
        record(&job->run.forward, rep, job->net, 0, forward_ms, start_unix);
        job->run.forward.device[rep] = device_ms;
        job->run.out_bytes = spconv_tensor_numel(out) * (int64_t)spconv_dtype_size(
                                                            spconv_tensor_dtype(out));
    }
    if (rc == 0 && job->args.backward && job->grad == NULL) rc = make_grad(job, out);
    if (rc == 0 && job->args.backward) {
        start_unix = unix_ms();
        spconv__cpu_memory_reset_peak();
        start = net_now_ms();
        device_ms = 0.0;
        spconv_tensor *grad_input = NULL;
        st = spconv__device_clock_mark(job->clock, job->ctx, &first);
        if (st == SPCONV_OK)
            st = spconv_net_backward(job->ctx, job->net, job->grad,
                                     job->args.input_grad ? &grad_input : NULL);
        if (st == SPCONV_OK) st = spconv__device_clock_mark(job->clock, job->ctx, &last);
        if (st == SPCONV_OK) st = spconv_context_synchronize(job->ctx);
        spconv_tensor_release(grad_input);
        const double backward_ms = net_now_ms() - start;
        if (st == SPCONV_OK) st = spconv__device_clock_span(job->clock, first, last, &device_ms);
        if (st == SPCONV_OK) st = spconv__device_clock_resolve(job->clock);
        if (st != SPCONV_OK) spconv__device_clock_reset(job->clock);
        if (st != SPCONV_OK) rc = cli_status_error(job->cmd, st, "backward");
        if (rc == 0 && rep >= 0) {
            record(&job->run.backward, rep, job->net, 1, backward_ms, start_unix);
            job->run.backward.device[rep] = device_ms;
        }
    }
    spconv_tensor_release(out);
    spconv_sparse_release(input);
    return rc;
}

/* ---- set-up ----------------------------------------------------------------------------------- */

static int read_input(bench_job *job) {
    const char *path = job->args.input;
    int rc = path == NULL ? net_sample_scan(job->cmd, &path) : 0;
    if (rc != 0) return rc;
    job->run.input = path;
    job->run.input_is_voxels = net_input_is_voxels(path);
    rc = job->run.input_is_voxels
             ? net_input_from_voxels(job->cmd, job->ctx, job->run.net_name, &job->run.zin, path,
                                     &job->input)
             : net_input_from_scan(job->cmd, job->ctx, job->run.net_name, &job->run.zin, path,
                                   &job->input);
    if (rc == 0 && job->args.replicate > 1)
        rc = net_input_replicate(job->cmd, &job->input, job->args.replicate);
    return rc;
}

/* The JSON goes through the library's one file writer: a temporary created exclusively beside
 * FILE and renamed over it. The path is checked before the timing (cli_outfile_check) but the
 * temporary is made only at the end, so that an interrupted bench leaves no file behind. */
static int finish_json(bench_job *job) {
    spconv_status st = spconv__file_writer_open("--json", job->args.json, &job->json);
    if (st != SPCONV_OK) return cli_error(job->cmd, "%s", spconv_last_error());
    bench_report_json(&job->run, job->json.file);
    st = spconv__file_writer_commit("--json", &job->json);
    return st == SPCONV_OK ? 0 : cli_error(job->cmd, "%s", spconv_last_error());
}

static int setup(bench_job *job) {
    const bench_args *a = &job->args;
    int rc = a->json != NULL ? cli_outfile_check(job->cmd, "--json", a->json) : 0;
    spconv_status st = SPCONV_OK;
    spconv_device device = spconv_cpu();
    if (rc == 0) rc = cli_parse_device(job->cmd, "--device", a->device, &device);
    if (rc == 0) st = spconv_zoo_input(job->run.net_name, &job->run.zin);
    if (rc == 0 && st == SPCONV_OK) st = spconv_context_create(device, &job->ctx);
    if (rc == 0 && st == SPCONV_OK) st = spconv_context_set_num_threads(job->ctx, (int)a->threads);
    if (rc == 0 && st == SPCONV_OK) st = spconv__device_clock_create(device, &job->clock);
    if (rc == 0 && st != SPCONV_OK) rc = cli_status_error(job->cmd, st, "setting up");
    if (rc == 0)
        rc = net_build(job->cmd, job->ctx, job->run.net_name, net_dtype_of(a->dtype),
                       (uint64_t)a->seed, NULL, SPCONV_NET_LAYOUT_AUTO, &job->net);
    if (rc == 0) rc = read_input(job);
    if (rc != 0) return rc;
    if (device.type == SPCONV_DEVICE_CUDA) job->run.gemm = "cublas";
    job->run.device_clock = job->clock != NULL;
    job->run.time_phases = job->clock != NULL && a->phases;
    spconv_net_set_timing(job->net,
                          job->run.time_phases ? SPCONV_NET_TIME_PHASES : SPCONV_NET_TIME_LAYERS);
    job->run.threads = spconv_context_num_threads(job->ctx);
    job->run.dtype = net_dtype_names[a->dtype];
    job->run.sites = spconv_tensor_size(job->input.features, 0);
    job->run.points = job->input.cloud ? spconv_point_cloud_num_points(job->input.cloud) : -1;
    memcpy(job->run.spatial_shape, job->input.spatial_shape, sizeof job->run.spatial_shape);
    const int layers = spconv_net_num_layers(job->net), reps = (int)a->repeat;
    if (bench_samples_init(&job->run.forward, reps, layers) != 0 ||
        (a->backward && bench_samples_init(&job->run.backward, reps, layers) != 0) ||
        (a->peak_every_pass && (job->run.pass_peak = calloc((size_t)reps, sizeof(double))) == NULL))
        return cli_error(job->cmd, "out of memory for %d x %d timings", reps, layers);
    return 0;
}

static double higher(double a, double b) { return a > b ? a : b; }

/* The sites (0, 0, i / 1024, i % 1024) for i < n, int32 [n, 4] on @p device. */
static spconv_status row_of_sites(spconv_context *ctx, spconv_device device, int64_t n,
                                  spconv_tensor **out) {
    int32_t *rows = malloc((size_t)(4 * (n > 0 ? n : 1)) * sizeof *rows);
    if (rows == NULL)
        return spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "out of host memory for %lld sites",
                             (long long)n);
    for (int64_t i = 0; i < n; ++i) {
        rows[4 * i] = rows[4 * i + 1] = 0;
        rows[4 * i + 2] = (int32_t)(i / 1024);
        rows[4 * i + 3] = (int32_t)(i % 1024);
    }
    const spconv_status st =
        spconv_tensor_from_host(ctx, device, SPCONV_I32, 2, (const int64_t[]){n, 4}, rows, out);
    free(rows);
    return st;
}

/* A device's ceilings, on its own clock, best of PEAK_REPEAT: the GEMM rate on the network's
 * dtype, from a kernel-1 subm conv of 8P sites, P -> P channels, whose one product (the centre
 * offset's, [8P, P] x [P, P], cuBLAS) is timed alone as its GEMM phase; and the copy bandwidth,
 * from a device-to-device copy of those 8P x P features (bytes read + written). */
static spconv_status device_peaks(bench_job *job, double *gemm_gflops, double *copy_gbps) {
    *gemm_gflops = *copy_gbps = 0.0;
    const int64_t p = job->args.peak_size, n = 8 * p;
    const spconv_device device = spconv_context_device(job->ctx);
    const spconv_dtype dtype = spconv_net_dtype(job->net);
    spconv_tensor *sites = NULL, *x = NULL, *w = NULL, *y = NULL, *copy = NULL;
    spconv_rulebook *rb = NULL;
    spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_SUBM);
    for (int i = 0; i < 3; ++i) params.kernel[i] = 1;
    const int64_t shape[3] = {1, (n + 1023) / 1024, 1024};
    spconv_status st = row_of_sites(job->ctx, device, n, &sites);
    if (st == SPCONV_OK) st = spconv_rulebook_build(job->ctx, sites, shape, 1, &params, &rb);
    if (st == SPCONV_OK)
        st = spconv_tensor_full(job->ctx, device, dtype, 2, (const int64_t[]){n, p}, 0.5, &x);
    if (st == SPCONV_OK)
        st = spconv_tensor_full(job->ctx, device, dtype, 3, (const int64_t[]){1, p, p}, 0.25, &w);
    for (int r = 0; r < PEAK_REPEAT && st == SPCONV_OK; ++r) {
        double gemm_ms = 0.0, copy_ms = 0.0;
        int first = -1, last = -1;
        spconv__conv_timing timing = {0};
        timing.clock = job->clock;
        timing.device_ms[1] = &gemm_ms;
        const spconv__conv_options options = {SPCONV__GEMM_AUTO, &timing, NULL};
        st = spconv__conv_forward_ex(job->ctx, rb, x, w, NULL, &options, &y);
        if (st == SPCONV_OK) st = spconv__device_clock_mark(job->clock, job->ctx, &first);
        if (st == SPCONV_OK) st = spconv_tensor_clone(job->ctx, x, &copy);
        if (st == SPCONV_OK) st = spconv__device_clock_mark(job->clock, job->ctx, &last);
        if (st == SPCONV_OK) st = spconv__device_clock_span(job->clock, first, last, &copy_ms);
        if (st == SPCONV_OK) st = spconv_context_synchronize(job->ctx);
        if (st == SPCONV_OK) st = spconv__device_clock_resolve(job->clock);
        if (st != SPCONV_OK) spconv__device_clock_reset(job->clock); /* spans into this loop */
        spconv_tensor_release(y);
        spconv_tensor_release(copy);
        y = copy = NULL;
        const double flops = 2.0 * (double)n * (double)p * (double)p;
        const double bytes = 2.0 * (double)n * (double)p * (double)spconv_dtype_size(dtype);
        if (st == SPCONV_OK && gemm_ms > 0.0) *gemm_gflops = higher(*gemm_gflops, flops / gemm_ms * 1e-6);
        if (st == SPCONV_OK && copy_ms > 0.0) *copy_gbps = higher(*copy_gbps, bytes / copy_ms * 1e-6);
    }
    spconv_rulebook_release(rb);
    spconv_tensor_release(sites);
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    return st;
}

static int measure_peak(bench_job *job) {
    if (job->args.peak_size == 0) return 0;
    bench_run *run = &job->run;
    if (job->clock != NULL) { /* a GPU: its own ceilings, not the host's sgemm */
        const spconv_status st = device_peaks(job, &run->peak_gflops, &run->copy_gbps);
        if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "measuring the device's peaks");
        run->peak_blas_gflops = run->peak_gflops;
        run->blas = "cuBLAS";
        return 0;
    }
    spconv_status st = spconv__sgemm_peak_parts(run->threads, job->args.peak_size, PEAK_REPEAT,
                                                &run->peak_blas_gflops, &run->peak_fused_gflops);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "measuring the sgemm peak");
    run->peak_gflops = higher(run->peak_blas_gflops, run->peak_fused_gflops);
    run->blas = spconv__blas_name();
    return 0;
}

/* --peak-every-pass: the peak again after timed pass @p rep; that pass is set against the higher
 * of this one and the one before it (*before: the previous pass's, or the first measurement).
 * The higher one, because a peak measured while something else ran is low and would flatter the
 * pass. */
static int measure_pass_peak(bench_job *job, int rep, double *before) {
    double blas = 0.0, fused = 0.0;
    spconv_status st = spconv__sgemm_peak_parts(job->run.threads, job->args.peak_size, PEAK_REPEAT,
                                                &blas, &fused);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "measuring the sgemm peak");
    const double after = higher(blas, fused);
    job->run.pass_peak[rep] = higher(*before, after);
    *before = after;
    return 0;
}

/* The process's peak resident set so far, MiB (0 where getrusage cannot tell). */
static double peak_resident_mib(void) {
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0) return 0.0;
    return (double)usage.ru_maxrss / 1024.0; /* Linux reports KiB */
}

static int bench_steps(bench_job *job) {
    int rc = setup(job);
    if (rc == 0) rc = measure_peak(job);
    for (int r = 0; rc == 0 && r < job->args.warmup; ++r) rc = one_pass(job, -1);
    double before = job->run.peak_gflops;
    for (int r = 0; rc == 0 && r < job->args.repeat; ++r) {
        rc = one_pass(job, r);
        if (rc == 0 && job->run.pass_peak != NULL) rc = measure_pass_peak(job, r, &before);
    }
    if (rc != 0) return rc;
    job->run.rss_peak_mib = peak_resident_mib();
    if (bench_report_capture_layers(&job->run, job->net) != 0)
        return cli_error(job->cmd, "out of memory for the report");
    if (spconv_context_device(job->ctx).type == SPCONV_DEVICE_CPU) /* its tensors are counted */
        bench_report_capture_needs(&job->run, job->net);
    bench_report_print(&job->run, stdout);
    return job->args.json != NULL ? finish_json(job) : 0;
}

static void bench_free(bench_job *job) {
    if (job->json.file != NULL) spconv__file_writer_abort(&job->json);
    bench_run_free(&job->run);
    spconv_tensor_release(job->grad);
    net_input_release(&job->input);
    spconv_net_destroy(job->net);
    spconv__device_clock_destroy(job->clock);
    spconv_context_destroy(job->ctx);
}

static const char bench_epilog[] =
    "--input is a scan (.bin, .pcd, .ply; voxelized for the network) or voxel files: a folder with\n"
    "spconv_test_indices.i32 + spconv_test_features.f32 (spconv's bench_basic input, e.g.\n"
    "../shared/data) or with indices.npy + features.npy, or a prefix P of P_indices.i32 +\n"
    "P_features.f32; voxels take the network's spatial shape (basic: [80, 1600, 1600]). Default:\n"
    "the bundled sample scan. Every pass gets a fresh input tensor, so rulebooks are built in\n"
    "every forward. --backward times a training-mode forward and the backward of a fixed\n"
    "random output gradient. Reports medians with [min, max] per layer and per phase\n"
    "(rulebook, gather, GEMM, scatter, other), GFLOP/s, and the GEMM phase's share of this\n"
    "machine's sgemm peak (a PEAK^3 float32 product run the way the conv executor runs its\n"
    "products), with wall / floor (floor = GFLOP / peak). On a machine whose speed drifts,\n"
    "--peak-every-pass measures the peak beside every pass and sets each pass against its own.\n"
    "--json FILE writes all of it; the schema is in docs/benchmarks.md.";

int spconv_cmd_bench(int argc, char **argv) {
    static const char cmd[] = "bench";
    const char *zoo[NET_ZOO_MAX + 1];
    net_zoo_choices(zoo);
    bench_job job = {.cmd = cmd,
                     .args = {.repeat = 5, .warmup = 1, .peak_size = 2048, .seed = 1, .replicate = 1}};
    bench_args *a = &job.args;
    cli_option opts[] = {
        {.name = "--net", .kind = CLI_CHOICE, .value = &a->net, .choices = zoo,
         .metavar = "second|basic|unet", .help = "zoo network (default second)"},
        {.name = "--input", .kind = CLI_PATH, .value = &a->input, .metavar = "SCAN|VOXELS",
         .help = "what to run on (default: the bundled sample scan)"},
        {.name = "--repeat", .kind = CLI_INT, .value = &a->repeat, .metavar = "N", .min = 1,
         .max = 100000, .help = "timed passes (default 5)"},
        {.name = "--warmup", .kind = CLI_INT, .value = &a->warmup, .metavar = "N", .min = 0,
         .max = 100000, .help = "untimed passes first (default 1)"},
        {.name = "--dtype", .kind = CLI_CHOICE, .value = &a->dtype, .choices = net_dtype_names,
         .metavar = "f32|f16|bf16",
         .help = "features and conv weights (default f32; 16-bit ones sum in f32)"},
        {.name = "--backward", .kind = CLI_SWITCH, .value = &a->backward,
         .help = "time training forward + backward"},
        {.name = "--input-grad", .kind = CLI_SWITCH, .value = &a->input_grad,
         .help = "with --backward: the input's gradient too (as spconv computes it)"},
        {.name = "--replicate", .kind = CLI_INT, .value = &a->replicate, .metavar = "R", .min = 1,
         .max = 64, .help = "run on R copies of the input, one batch entry each (default 1)"},
        {.name = "--threads", .kind = CLI_INT, .value = &a->threads, .metavar = "N", .min = 1,
         .max = SPCONV_MAX_THREADS, .help = "CPU threads (default: all cores)"},
        {.name = "--device", .kind = CLI_PATH, .value = &a->device, .metavar = "cpu|cuda[:N]",
         .help = "where the network runs (default cpu); on a GPU passes and layers are also "
                 "timed with CUDA events"},
        {.name = "--phases", .kind = CLI_SWITCH, .value = &a->phases,
         .help = "on a GPU, time each conv's gather, GEMM and scatter too (events around each "
                 "kernel offset; the CPU always times them)"},
        {.name = "--peak-size", .kind = CLI_INT, .value = &a->peak_size, .metavar = "PEAK",
         .min = 0, .max = 16384,
         .help = "sgemm size of the peak measurement (default 2048; 0: skip)"},
        {.name = "--peak-every-pass", .kind = CLI_SWITCH, .value = &a->peak_every_pass,
         .help = "measure the peak after every timed pass too, and set each pass against the "
                 "peak beside it"},
        {.name = "--seed", .kind = CLI_INT, .value = &a->seed, .metavar = "S", .min = 0,
         .max = INT64_MAX, .help = "seed of the parameters and the gradient (default 1)"},
        {.name = "--json", .kind = CLI_PATH, .value = &a->json, .metavar = "FILE",
         .help = "also write the results as JSON"},
    };
    cli_spec spec = {.command = cmd,
                     .summary = "time a zoo network per layer and per phase, rulebooks included",
                     .options = opts, .num_options = (int)(sizeof opts / sizeof opts[0]),
                     .epilog = bench_epilog};
    int status;
    if (!cli_parse(&spec, argc, argv, &status)) return status;
    if (a->input_grad && !a->backward)
        return cli_error(cmd, "--input-grad needs --backward (the gradient comes from a backward)");
    if (a->peak_every_pass && a->peak_size == 0)
        return cli_error(cmd, "--peak-every-pass needs a peak (--peak-size is 0)");
    job.run.net_name = zoo[a->net];
    job.run.repeat = (int)a->repeat;
    job.run.warmup = (int)a->warmup;
    job.run.with_backward = a->backward;
    job.run.with_input_grad = a->input_grad;
    job.run.replicate = (int)a->replicate;
    job.run.seed = a->seed;
    job.run.peak_size = a->peak_size;
    job.run.gemm = spconv__fused_available() ? "fused" : spconv__gemm_has_blas() ? "blas" : "fallback";
    int rc = bench_steps(&job);
    bench_free(&job);
    return rc;
}
