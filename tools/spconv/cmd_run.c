/* `spconv run`: the main job. A scan goes through a zoo network; the command prints what every
 * layer did and writes the output tensor and a picture. See `spconv run --help`. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_args.h"
#include "commands.h"
#include "net_args.h"
#include "net_picture.h"
#include "run_batch.h"
#include "spconv/spconv.h"

typedef struct run_args {
    const char *scan;     /* the first of the inputs, NULL if none */
    const char **inputs;  /* every positional argument */
    int num_inputs;
    const char *list;     /* --list FILE */
    int64_t batch_size;
    int batch_given;
    int net;          /* index into the zoo */
    const char *weights;
    int layout;       /* index into layout_names */
    int dtype;        /* index into net_dtype_names */
    int64_t seed;
    int64_t threads;  /* 0: all cores */
    const char *device; /* --device; NULL: the CPU */
    const char *out_dir;
    int quiet;
    int progress;
} run_args;

static const char *const layout_names[] = {"auto", "rsck", "krsc", "oidhw", NULL};
static const spconv_net_layout layouts[] = {SPCONV_NET_LAYOUT_AUTO, SPCONV_NET_LAYOUT_RSCK,
                                            SPCONV_NET_LAYOUT_KRSC, SPCONV_NET_LAYOUT_OIDHW};

/* What a run holds; released by run_free. */
typedef struct run_job {
    const char *cmd;
    run_args args;
    const char *net_name;
    spconv_net_input zin;
    spconv_context *ctx;
    spconv_net *net;
    net_input input;
    spconv_tensor *output;
    spconv_sparse_tensor *out_sparse;
    double forward_ms;
    cli_outdir od;
} run_job;

/* ---- progress --------------------------------------------------------------------------------- */

typedef struct progress_state {
    const char *cmd;
    int tty; /* on a terminal one line is rewritten in place; elsewhere one line per layer */
    int on_device; /* a GPU: a layer is only queued when it is reported, and its time is read
                      from the device's clock after the pass (the table), so none is printed */
} progress_state;

static void on_progress(void *user, const spconv_layer_stats *s, int num_layers, int backward) {
    const progress_state *ps = user;
    const char *kind = spconv_layer_kind_name(s->kind);
    const double ms = backward ? s->backward.total : s->forward.total;
    char when[32];
    if (ps->on_device)
        snprintf(when, sizeof when, "queued");
    else
        snprintf(when, sizeof when, "%.1f ms", ms);
    /* "progress:" tells these lines from the one-line errors that share stderr. */
    if (ps->tty)
        fprintf(stderr, "\r\033[Kspconv %s: progress: layer %d/%d %s (%s) %s", ps->cmd,
                s->index + 1, num_layers, s->name, kind, when);
    else
        fprintf(stderr, "spconv %s: progress: layer %d/%d %s (%s) %s\n", ps->cmd,
                s->index + 1, num_layers, s->name, kind, when);
    fflush(stderr);
}

/* ---- the report ------------------------------------------------------------------------------- */

static void format_shape(const spconv_tensor *t, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < spconv_tensor_ndim(t) && used < cap; ++d)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "",
                                 (long long)spconv_tensor_size(t, d));
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static int name_width(const spconv_net *net) {
    int width = 5; /* "layer" */
    for (int i = 0; i < spconv_net_num_layers(net); ++i) {
        int len = (int)strlen(spconv_net_layer(net, i)->name);
        width = len > width ? len : width;
    }
    return width;
}

static void print_layer_table(const spconv_net *net) {
    const int w = name_width(net);
    double sum = 0.0;
    for (int i = 0; i < spconv_net_num_layers(net); ++i)
        sum += spconv_net_stats(net, i)->forward.total;
    printf("%3s  %-*s  %-10s %10s %10s %13s %12s %10s %7s\n", "#", w, "layer", "kind", "sites in",
           "sites out", "channels", "pairs", "ms", "share");
    for (int i = 0; i < spconv_net_num_layers(net); ++i) {
        const spconv_layer_stats *s = spconv_net_stats(net, i);
        char channels[32];
        snprintf(channels, sizeof channels, "%lld -> %lld", (long long)s->channels_in,
                 (long long)s->channels_out);
        printf("%3d  %-*s  %-10s %10lld %10lld %13s %12lld %10.2f %6.1f%%\n", i, w, s->name,
               spconv_layer_kind_name(s->kind), (long long)s->sites_in, (long long)s->sites_out,
               channels, (long long)s->pairs, s->forward.total,
               sum > 0.0 ? 100.0 * s->forward.total / sum : 0.0);
    }
}

static double total_flops(const spconv_net *net) {
    double flops = 0.0;
    for (int i = 0; i < spconv_net_num_layers(net); ++i) flops += spconv_net_stats(net, i)->flops;
    return flops;
}

static void print_summary(const run_job *job) {
    const net_input *in = &job->input;
    const int64_t voxels = spconv_tensor_size(in->features, 0);
    char shape[96];
    format_shape(job->output, shape, sizeof shape);
    const double flops = total_flops(job->net);
    const double gflops = job->forward_ms > 0.0 ? flops * 1e-6 / job->forward_ms : 0.0;
    if (in->cloud == NULL) {
        printf("%s: %lld voxels (from voxel files) -> output %s; forward %.1f ms, %.2f GFLOP, "
               "%.1f GFLOP/s; read %.1f ms\n", job->net_name, (long long)voxels, shape,
               job->forward_ms, flops * 1e-9, gflops, in->read_ms);
        return;
    }
    printf("%s: %lld points -> %lld voxels (%lld points in range) -> output %s; forward %.1f ms, "
           "%.2f GFLOP, %.1f GFLOP/s; read %.1f ms, voxelize %.1f ms\n",
           job->net_name, (long long)spconv_point_cloud_num_points(in->cloud), (long long)voxels,
           (long long)in->stats.voxelized, shape, job->forward_ms, flops * 1e-9, gflops,
           in->read_ms, in->voxelize_ms);
    if (voxels == 0) {
        const double *r = job->zin.point_range;
        printf("note: no point of the scan lies in the network's range (x [%g, %g), y [%g, %g), "
               "z [%g, %g)): 0 voxels, so the output has no active site\n",
               r[0], r[3], r[1], r[4], r[2], r[5]);
    }
}

/* ---- outputs ---------------------------------------------------------------------------------- */

static int write_picture(run_job *job, int64_t size[2]) {
    if (!SPCONV_HAVE_PNG) {
        printf("note: picture.png not written: this build of spconv has no libpng\n");
        return 0;
    }
    if (job->input.cloud == NULL) {
        if (!job->args.quiet)
            printf("note: picture.png not written: voxel files have no points to show\n");
        return 0;
    }
    const char *path;
    int rc = cli_outdir_path(&job->od, "picture.png", &path);
    if (rc != 0) return rc;
    spconv_image *image = NULL;
    /* the picture reads f32 values; a 16-bit output is widened (exactly) for it */
    spconv_tensor *values = NULL;
    spconv_status st = spconv_tensor_to_dtype(job->ctx, job->output, SPCONV_F32, &values);
    if (st == SPCONV_OK)
        st = picture_make(&job->zin, spconv_point_cloud_points(job->input.cloud), values,
                          job->out_sparse, &image);
    spconv_tensor_release(values);
    if (st == SPCONV_OK) st = spconv_png_write(path, image);
    if (st == SPCONV_OK) size[0] = image->width, size[1] = image->height;
    spconv_image_destroy(image);
    return st == SPCONV_OK ? 0 : cli_outdir_write_error(&job->od, path, st, "picture.png");
}

static int write_outputs(run_job *job) {
    const int dense = spconv_tensor_ndim(job->output) == 4;
    int64_t size[2] = {0, 0};
    /* The folder is made only now: a run stopped before this point leaves nothing behind. */
    int rc = net_output_as(job->cmd, job->ctx, &job->output,
                           net_file_dtype(spconv_tensor_dtype(job->output)));
    if (rc == 0) rc = cli_outdir_open(&job->od, job->cmd, job->args.out_dir);
    if (rc == 0) rc = cli_outdir_write_npy(&job->od, job->ctx, "output.npy", job->output);
    if (rc == 0 && !dense)
        rc = cli_outdir_write_npy(&job->od, job->ctx, "out_indices.npy",
                                  spconv_sparse_indices(job->out_sparse));
    if (rc == 0) rc = write_picture(job, size);
    if (rc == 0) rc = cli_outdir_commit(&job->od);
    if (rc != 0 || job->args.quiet) return rc;
    const char *dir = job->args.out_dir;
    printf("wrote %s/output.npy%s", dir, dense ? "" : ", ");
    if (!dense) printf("%s/out_indices.npy", dir);
    if (size[0] > 0)
        printf(", %s/picture.png (%lld x %lld: output heat map | input occupancy)", dir,
               (long long)size[0], (long long)size[1]);
    printf("\n");
    return 0;
}

/* ---- the command ------------------------------------------------------------------------------ */

static int forward(run_job *job) {
    progress_state ps = {.cmd = job->cmd, .tty = isatty(STDERR_FILENO),
                         .on_device = spconv_context_device(job->ctx).type != SPCONV_DEVICE_CPU};
    const int show = job->args.progress || (ps.tty && !job->args.quiet);
    if (show) spconv_net_set_progress(job->net, on_progress, &ps);
    spconv_sparse_tensor *input = NULL;
    int rc = net_input_sparse(job->cmd, job->ctx, &job->input, spconv_net_dtype(job->net),
                              &input);
    if (rc != 0) return rc;
    const double start = net_now_ms();
    spconv_status st = spconv_net_forward(job->ctx, job->net, input, SPCONV_NET_INFERENCE,
                                          &job->output, &job->out_sparse);
    if (st == SPCONV_OK) st = spconv_context_synchronize(job->ctx); /* GPU work done (cmd_bench.c) */
    job->forward_ms = net_now_ms() - start;
    if (show && ps.tty) fprintf(stderr, "\r\033[K");
    spconv_net_set_progress(job->net, NULL, NULL);
    spconv_sparse_release(input);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "running the network");
    return net_outputs_to_host(job->cmd, job->ctx, &job->output, &job->out_sparse);
}

/* The context and the network, with their input format. */
static int setup_network(run_job *job) {
    const run_args *a = &job->args;
    spconv_device device;
    int rc = cli_parse_device(job->cmd, "--device", a->device, &device);
    if (rc != 0) return rc;
    spconv_status st = spconv_zoo_input(job->net_name, &job->zin);
    if (st == SPCONV_OK) st = spconv_context_create(device, &job->ctx);
    if (st == SPCONV_OK) st = spconv_context_set_num_threads(job->ctx, (int)a->threads);
    if (st != SPCONV_OK) return cli_status_error(job->cmd, st, "setting up");
    return net_build(job->cmd, job->ctx, job->net_name, net_dtype_of(a->dtype), (uint64_t)a->seed,
                     a->weights, layouts[a->layout], &job->net);
}

/* One scan (or one set of voxel files): the per-layer table, the outputs and the picture. */
static int run_one(run_job *job) {
    const run_args *a = &job->args;
    /* Every name run may write; which of them it does depends on the network's output. */
    static const char *const out_names[] = {"output.npy", "out_indices.npy", "picture.png", NULL};
    int rc = cli_outdir_check(job->cmd, a->out_dir, out_names);
    if (rc == 0 && a->scan == NULL) rc = net_sample_scan(job->cmd, &job->args.scan);
    if (rc == 0) rc = setup_network(job);
    if (rc == 0 && net_input_is_voxels(a->scan))
        rc = net_input_from_voxels(job->cmd, job->ctx, job->net_name, &job->zin, a->scan,
                                   &job->input);
    else if (rc == 0)
        rc = net_input_from_scan(job->cmd, job->ctx, job->net_name, &job->zin, a->scan,
                                 &job->input);
    if (rc == 0) rc = forward(job);
    if (rc == 0 && !a->quiet) print_layer_table(job->net);
    if (rc == 0) print_summary(job);
    if (rc == 0) rc = write_outputs(job);
    return rc;
}

/* Several inputs, in batches of --batch-size: one output folder per input. */
static int run_many(run_job *job) {
    const run_args *a = &job->args;
    run_items items;
    int rc = run_items_collect(job->cmd, a->inputs, a->num_inputs, a->list, &items);
    if (rc == 0) rc = cli_outdir_check(job->cmd, a->out_dir, NULL);
    if (rc == 0) rc = setup_network(job);
    if (rc == 0) {
        const run_batch_config config = {
            .cmd = job->cmd, .ctx = job->ctx, .net = job->net, .net_name = job->net_name,
            .zin = &job->zin, .items = &items, .batch_size = a->batch_size,
            .out_dir = a->out_dir, .quiet = a->quiet, .progress = a->progress};
        rc = run_batches(&config);
    }
    run_items_free(&items);
    return rc;
}

/* Several inputs, a list or a folder of scans are many; one scan or voxel files are one. */
static int run_job_steps(run_job *job) {
    const run_args *a = &job->args;
    /* --batch-size alone makes a run "many", so that a script's glob matching one file still
     * gets the layout of many. */
    const int many = a->num_inputs > 1 || a->list != NULL || a->batch_given ||
                     (a->num_inputs == 1 && run_is_scan_folder(a->scan));
    if (many && a->num_inputs == 0 && a->list == NULL)
        return cli_error(job->cmd, "--batch-size needs inputs: scans, folders of scans or --list");
    return many ? run_many(job) : run_one(job);
}

static void run_free(run_job *job) {
    cli_outdir_close(&job->od);
    spconv_tensor_release(job->output);
    spconv_sparse_release(job->out_sparse);
    net_input_release(&job->input);
    spconv_net_destroy(job->net);
    spconv_context_destroy(job->ctx);
}

static const char run_epilog[] =
    "SCAN is a KITTI/nuScenes .bin, a PCD or a PLY file, or voxel files as bench --input takes\n"
    "them (a folder with indices.npy + features.npy or spconv_test_indices.i32 +\n"
    "spconv_test_features.f32, or a prefix P of P_indices.i32 + P_features.f32, on the network's\n"
    "spatial shape): with --weights, a network with given weights on given voxels, to compare\n"
    "with another engine. Without SCAN the bundled sample data/sample_scan.bin is used (or\n"
    "$SPCONV_SAMPLE_SCAN). The scan is voxelized as the network\n"
    "expects (`second`, `unet`: KITTI grid, mean of x, y, z, intensity; `basic`: 0.1 m voxels of\n"
    "x, y, z), run once for inference, and the layers are listed with their active sites,\n"
    "rulebook pairs and time. Without --weights the parameters come from --seed.\n"
    "Writes into DIR: output.npy (second: the dense BEV map [1, 256, 200, 176]; the others:\n"
    "[N, C] features of the output sites; float32, float16 with --dtype f16), out_indices.npy\n"
    "(int32 [N, 4] b, z, y, x of a sparse output) and picture.png: the output as a bird's-eye heat map of feature norms (left)\n"
    "beside the occupancy of the input points (right), x to the right, y up, brighter = more\n"
    "(not for voxel files).\n"
    "\n"
    "Many scans: several SCANs, a folder of scans (its .bin, .pcd and .ply files in name order),\n"
    "--list FILE (one path a line, relative to FILE's folder; # comments) or --batch-size run\n"
    "them B at a time, scan j of a batch as batch index j (as detection training batches), and\n"
    "write DIR/<scan name>/output.npy (and out_indices.npy, batch index 0): what a run of that\n"
    "scan alone gives (the same sites; the same features bit for bit with the plain-C GEMM,\n"
    "within float32 rounding with OpenBLAS). One line per batch and a total with scans per\n"
    "second; a progress bar on a terminal (--progress: one line per batch elsewhere). No\n"
    "picture. All the files appear only once every scan ran.";

int spconv_cmd_run(int argc, char **argv) {
    static const char cmd[] = "run";
    const char *zoo[NET_ZOO_MAX + 1];
    net_zoo_choices(zoo);
    run_job job = {.cmd = cmd, .args = {.seed = 1, .out_dir = "spconv-out", .batch_size = 1}};
    run_args *a = &job.args;
    cli_option opts[] = {
        {.name = "--net", .kind = CLI_CHOICE, .value = &a->net, .choices = zoo,
         .metavar = "second|basic|unet", .help = "zoo network (default second)"},
        {.name = "--weights", .kind = CLI_PATH, .value = &a->weights, .metavar = "DIR",
         .help = "folder of <parameter>.npy files (default: initialised from --seed)"},
        {.name = "--weight-layout", .kind = CLI_CHOICE, .value = &a->layout,
         .choices = layout_names, .metavar = "auto|rsck|krsc|oidhw",
         .help = "layout of the conv weights in --weights (default auto: by shape)"},
        {.name = "--dtype", .kind = CLI_CHOICE, .value = &a->dtype, .choices = net_dtype_names,
         .metavar = "f32|f16|bf16",
         .help = "features and conv weights (default f32; 16-bit ones sum in f32, batch norm "
                 "in f32; bf16 outputs are written as f32)"},
        {.name = "--seed", .kind = CLI_INT, .value = &a->seed, .metavar = "S", .min = 0,
         .max = INT64_MAX, .help = "seed of the initial parameters (default 1)"},
        {.name = "--threads", .kind = CLI_INT, .value = &a->threads, .metavar = "N", .min = 1,
         .max = SPCONV_MAX_THREADS, .help = "CPU threads (default: all cores)"},
        {.name = "--device", .kind = CLI_PATH, .value = &a->device, .metavar = "cpu|cuda[:N]",
         .help = "where the network runs (default cpu; scans are read and voxelized on the host)"},
        {.name = "--out", .kind = CLI_PATH, .value = &a->out_dir, .metavar = "DIR",
         .help = "output folder (default spconv-out; files appear only on success)"},
        {.name = "--quiet", .kind = CLI_SWITCH, .value = &a->quiet,
         .help = "print only the summary line"},
        {.name = "--progress", .kind = CLI_SWITCH, .value = &a->progress,
         .help = "report each layer (many scans: each batch) on stderr off a terminal too"},
        {.name = "--list", .kind = CLI_PATH, .value = &a->list, .metavar = "FILE",
         .help = "also run the scans listed in FILE, one path a line"},
        {.name = "--batch-size", .kind = CLI_INT, .value = &a->batch_size, .metavar = "B",
         .min = 1, .max = 4096, .help = "scans per batch with many scans (default 1)"},
    };
    cli_spec spec = {.command = cmd,
                     .summary = "voxelize a LiDAR scan, run a sparse backbone on it, report every "
                                "layer and write the output and a picture",
                     .positional = "SCAN", .positional_value = &a->scan,
                     .positional_optional = 1, .positional_max = argc > 1 ? argc : 2,
                     .positional_count = &a->num_inputs,
                     .options = opts,
                     .num_options = (int)(sizeof opts / sizeof opts[0]), .epilog = run_epilog};
    int status;
    const char **inputs = calloc((size_t)(argc > 1 ? argc : 2), sizeof *inputs);
    if (inputs == NULL) return cli_error(cmd, "out of memory");
    spec.positional_values = inputs;
    a->inputs = inputs;
    int rc;
    if (cli_parse(&spec, argc, argv, &status)) {
        job.net_name = zoo[a->net];
        a->batch_given = cli_find_option(&spec, "--batch-size")->given;
        rc = run_job_steps(&job);
    } else {
        rc = status;
    }
    run_free(&job);
    free(inputs);
    return rc;
}
