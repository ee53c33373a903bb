/* The report of `spconv bench` (see bench_report.h). */
#include "bench_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const phase_keys[BENCH_PHASES] = {"total",   "rulebook", "gather",
                                                     "gemm",    "scatter",  "other"};
static const char *const phase_titles[BENCH_PHASES] = {"total", "rulebook", "gather",
                                                       "GEMM",  "scatter",  "other"};
enum { PHASE_TOTAL = 0, PHASE_GATHER = 2, PHASE_GEMM = 3, PHASE_SCATTER = 4 };

int bench_samples_init(bench_samples *s, int repeat, int layers) {
    s->repeat = repeat;
    s->layers = layers;
    s->layer = calloc((size_t)repeat * (size_t)(layers > 0 ? layers : 1) * BENCH_PHASES,
                      sizeof *s->layer);
    s->wall = calloc((size_t)repeat, sizeof *s->wall);
    s->start = calloc((size_t)repeat, sizeof *s->start);
    s->tensor_mib = calloc((size_t)repeat, sizeof *s->tensor_mib);
    s->scratch = calloc((size_t)repeat, sizeof *s->scratch);
    s->device = calloc((size_t)repeat, sizeof *s->device);
    return s->layer != NULL && s->wall != NULL && s->start != NULL && s->tensor_mib != NULL &&
                   s->scratch != NULL && s->device != NULL ? 0 : -1;
}

double *bench_sample(bench_samples *s, int rep, int layer) {
    return s->layer + ((size_t)rep * (size_t)s->layers + (size_t)layer) * BENCH_PHASES;
}

static void samples_free(bench_samples *s) {
    free(s->layer);
    free(s->wall);
    free(s->start);
    free(s->tensor_mib);
    free(s->scratch);
    free(s->device);
    memset(s, 0, sizeof *s);
}

void bench_run_free(bench_run *run) {
    samples_free(&run->forward);
    samples_free(&run->backward);
    free(run->pass_peak);
    run->pass_peak = NULL;
    free(run->layers);
    run->layers = NULL;
    run->num_layers = 0;
}

int bench_report_capture_layers(bench_run *run, const spconv_net *net) {
    run->num_layers = spconv_net_num_layers(net);
    run->layers = calloc((size_t)run->num_layers, sizeof *run->layers);
    if (run->layers == NULL) return -1;
    for (int i = 0; i < run->num_layers; ++i) {
        const spconv_layer_stats *s = spconv_net_stats(net, i);
        run->layers[i] = (bench_layer){.name = s->name, .kind = s->kind, .sites_in = s->sites_in,
                                       .sites_out = s->sites_out, .channels_in = s->channels_in,
                                       .channels_out = s->channels_out, .pairs = s->pairs,
                                       .flops = s->flops};
    }
    return 0;
}

/* Bytes of the features of @p sites rows of @p channels. */
static double feature_bytes(int64_t sites, int64_t channels, size_t element) {
    return (double)sites * (double)channels * (double)element;
}

/* What layer @p l reads and writes at once (see bench_report_capture_needs). */
static double layer_needs(const bench_run *run, int l, size_t element) {
    const bench_layer *ly = &run->layers[l];
    const double coords = 4.0 * sizeof(int32_t); /* (b, z, y, x) a site */
    double bytes = feature_bytes(ly->sites_in, ly->channels_in, element) +
                   coords * (double)ly->sites_in;
    switch (ly->kind) {
    case SPCONV_LAYER_SUBM: /* the same sites; the centre maps each row to itself */
        bytes += feature_bytes(ly->sites_out, ly->channels_out, element) +
                 2.0 * sizeof(int32_t) *
                     (double)(ly->pairs > ly->sites_in ? ly->pairs - ly->sites_in : 0);
        break;
    case SPCONV_LAYER_CONV:
    case SPCONV_LAYER_TRANSPOSED:
    case SPCONV_LAYER_INVERSE:
    case SPCONV_LAYER_MAXPOOL: /* new sites */
        bytes += feature_bytes(ly->sites_out, ly->channels_out, element) +
                 coords * (double)ly->sites_out + 2.0 * sizeof(int32_t) * (double)ly->pairs;
        break;
    case SPCONV_LAYER_CONCAT:
        bytes += feature_bytes(ly->sites_out, ly->channels_out, element);
        break;
    case SPCONV_LAYER_TO_DENSE: bytes += (double)run->out_bytes; break;
    default: break; /* batch norm and ReLU in place, SAVE passes its input on */
    }
    return bytes;
}

void bench_report_capture_needs(bench_run *run, const spconv_net *net) {
    run->needed_mib = 0.0;
    run->needed_layer = -1;
    if (run->with_backward || run->num_layers != spconv_net_num_layers(net)) return;
    const size_t element = spconv_dtype_size(spconv_net_dtype(net));
    double params = 0.0;
    for (int i = 0; i < spconv_net_num_params(net); ++i) {
        const spconv_tensor *t = spconv_net_param(net, i);
        params +=
            (double)spconv_tensor_numel(t) * (double)spconv_dtype_size(spconv_tensor_dtype(t));
    }
    double most = 0.0;
    for (int l = 0; l < run->num_layers; ++l) {
        double bytes = layer_needs(run, l, element);
        /* Tensors saved before l that a CONCAT at l or later still takes: their features, unless
         * only SAVEs stand between the save and l (then the saved tensor is l's input). */
        for (int s = 0; s < l; ++s) {
            const spconv_layer_desc *d = spconv_net_layer(net, s);
            if (d->kind != SPCONV_LAYER_SAVE) continue;
            int passed_on = 1;
            for (int m = s + 1; m < l; ++m)
                passed_on &= spconv_net_layer(net, m)->kind == SPCONV_LAYER_SAVE;
            if (passed_on) continue;
            for (int c = l; c < run->num_layers; ++c) {
                const spconv_layer_desc *e = spconv_net_layer(net, c);
                if (e->kind == SPCONV_LAYER_CONCAT && strcmp(e->key, d->key) == 0) {
                    bytes += feature_bytes(run->layers[s].sites_in, run->layers[s].channels_in,
                                           element);
                    break;
                }
            }
        }
        if (l == 0 || bytes > most) {
            most = bytes;
            run->needed_layer = l;
        }
    }
    if (run->needed_layer >= 0) run->needed_mib = (params + most) / (1024.0 * 1024.0);
}

/* ---- statistics ------------------------------------------------------------------------------- */

typedef struct spread {
    double median, min, max;
} spread;

static int compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median, min and max of the values already in s->scratch. */
static spread scratch_spread(bench_samples *s) {
    const int n = s->repeat;
    qsort(s->scratch, (size_t)n, sizeof *s->scratch, compare_doubles);
    const double median =
        n % 2 ? s->scratch[n / 2] : 0.5 * (s->scratch[n / 2 - 1] + s->scratch[n / 2]);
    return (spread){median, s->scratch[0], s->scratch[n - 1]};
}

static spread layer_spread(bench_samples *s, int layer, int phase) {
    for (int r = 0; r < s->repeat; ++r) s->scratch[r] = bench_sample(s, r, layer)[phase];
    return scratch_spread(s);
}

/* Per pass, the sum of one phase over the layers. */
static spread phase_spread(bench_samples *s, int phase) {
    for (int r = 0; r < s->repeat; ++r) {
        s->scratch[r] = 0.0;
        for (int l = 0; l < s->layers; ++l) s->scratch[r] += bench_sample(s, r, l)[phase];
    }
    return scratch_spread(s);
}

static spread tensor_spread(bench_samples *s) {
    memcpy(s->scratch, s->tensor_mib, (size_t)s->repeat * sizeof *s->scratch);
    return scratch_spread(s);
}

static spread device_spread(bench_samples *s) {
    memcpy(s->scratch, s->device, (size_t)s->repeat * sizeof *s->scratch);
    return scratch_spread(s);
}

static spread wall_spread(bench_samples *s) {
    memcpy(s->scratch, s->wall, (size_t)s->repeat * sizeof *s->scratch);
    return scratch_spread(s);
}

/* One direction's totals. */
typedef struct pass_summary {
    spread wall;
    spread device;      /* on the device's clock (bench_run.device_clock) */
    double gather_gbps, scatter_gbps; /* forward with the device's conv phases timed; else 0 */
    spread phases[BENCH_PHASES];
    double flops;       /* per pass */
    double gflops;      /* flops / median wall */
    double gemm_gflops; /* flops / median GEMM phase */
    double gemm_share;  /* gemm_gflops / sgemm peak; 0 without a peak */
    double floor_ms;    /* flops / sgemm peak: no pass can be faster; 0 without a peak */
    spread over_floor;  /* wall / floor per pass, against each pass's own peak where measured
                         * (--peak-every-pass), else against the one peak; 0 without a peak */
} pass_summary;

/* A conv's backward computes d_features and d_weight (twice the forward's products), except
 * that the first layer's d_features is skipped unless --input-grad asks for the input's
 * gradient (spconv_net_backward leaves it out otherwise). */
static double layer_flops(const bench_run *run, int layer, int backward) {
    if (!backward) return run->layers[layer].flops;
    return run->layers[layer].flops * (layer > 0 || run->with_input_grad ? 2.0 : 1.0);
}

/* The report's words for bench_run.gemm. */
static const char *gemm_words(const char *gemm) {
    return strcmp(gemm, "fused") == 0    ? "the fused kernels"
           : strcmp(gemm, "blas") == 0   ? "BLAS"
           : strcmp(gemm, "cublas") == 0 ? "cuBLAS"
                                         : "the C fallback";
}

static double per_second(double flops, double ms) { return ms > 0.0 ? flops / ms * 1e-6 : 0.0; }

/* The milliseconds @p flops take at @p gflops. */
static double floor_ms(double flops, double gflops) {
    return gflops > 0.0 ? flops / gflops * 1e-6 : 0.0;
}

/* Pass @p rep's wall time over its floor: against its own peak where one was measured beside it. */
static double pass_over_floor(const bench_run *run, const bench_samples *s, int rep, double flops) {
    const double peak = run->pass_peak != NULL ? run->pass_peak[rep] : run->peak_gflops;
    const double least = floor_ms(flops, peak);
    return least > 0.0 ? s->wall[rep] / least : 0.0;
}

/* Bytes a forward conv's gather and scatter phases must at least move over the whole pass: each
 * pair outside a subm's centre reads a row of C_in features and writes it gathered; the scatter
 * (the sum of the products into the output) reads each such product row once and writes every
 * output row once (sums in f32, or f64 for f64), as a step that sums a group of offsets row by
 * row does; its tables, the reads of the output by later steps and a centre offset's products
 * are left out. */
static void forward_traffic(const bench_run *run, double *gather, double *scatter) {
    const double elem = strcmp(run->dtype, "f64") == 0 ? 8.0
                        : strcmp(run->dtype, "f32") == 0 ? 4.0 : 2.0;
    const double sum = elem > 4.0 ? 8.0 : 4.0;
    *gather = *scatter = 0.0;
    for (int l = 0; l < run->num_layers; ++l) {
        const bench_layer *ly = &run->layers[l];
        if (ly->flops <= 0.0) continue; /* not a conv */
        const double moved =
            (double)(ly->pairs - (ly->kind == SPCONV_LAYER_SUBM ? ly->sites_in : 0));
        *gather += moved * (double)ly->channels_in * elem * 2.0;
        *scatter += moved * (double)ly->channels_out * sum +
                    (double)ly->sites_out * (double)ly->channels_out * sum;
    }
}

static pass_summary summarize(bench_run *run, bench_samples *s, int backward) {
    pass_summary p = {.wall = wall_spread(s)};
    if (run->device_clock) p.device = device_spread(s);
    for (int k = 0; k < BENCH_PHASES; ++k) p.phases[k] = phase_spread(s, k);
    for (int l = 0; l < run->num_layers; ++l) p.flops += layer_flops(run, l, backward);
    p.gflops = per_second(p.flops, p.wall.median);
    p.gemm_gflops = per_second(p.flops, p.phases[PHASE_GEMM].median);
    p.gemm_share = run->peak_gflops > 0.0 ? p.gemm_gflops / run->peak_gflops : 0.0;
    p.floor_ms = floor_ms(p.flops, run->peak_gflops);
    for (int r = 0; r < s->repeat; ++r) s->scratch[r] = pass_over_floor(run, s, r, p.flops);
    p.over_floor = scratch_spread(s);
    if (run->device_clock && run->time_phases && !backward) {
        double gather = 0.0, scatter = 0.0;
        forward_traffic(run, &gather, &scatter);
        p.gather_gbps = per_second(gather, p.phases[PHASE_GATHER].median);
        p.scatter_gbps = per_second(scatter, p.phases[PHASE_SCATTER].median);
    }
    return p;
}

/* What the report calls the GEMM ceiling. */
static const char *peak_name(const bench_run *run) {
    return run->device_clock ? "device GEMM peak" : "sgemm peak";
}

/* ---- text ------------------------------------------------------------------------------------- */

static int name_width(const bench_run *run) {
    int width = 5;
    for (int l = 0; l < run->num_layers; ++l) {
        int len = (int)strlen(run->layers[l].name);
        width = len > width ? len : width;
    }
    return width;
}

static void print_layers(bench_run *run, bench_samples *s, int backward, FILE *out) {
    const int w = name_width(run);
    const double sum = phase_spread(s, PHASE_TOTAL).median;
    fprintf(out, "%3s  %-*s  %-10s %9s %9s %11s %7s %27s %6s %9s %9s %9s %9s %9s\n", "#", w,
            "layer", "kind", "sites in", "sites out", "pairs", "GFLOP", "ms median [min, max]",
            "share", "rulebook", "gather", "GEMM", "scatter", "other");
    for (int l = 0; l < run->num_layers; ++l) {
        const bench_layer *ly = &run->layers[l];
        spread t = layer_spread(s, l, PHASE_TOTAL);
        fprintf(out, "%3d  %-*s  %-10s %9lld %9lld %11lld %7.3f %9.2f [%7.2f, %7.2f] %5.1f%%", l, w,
                ly->name, spconv_layer_kind_name(ly->kind), (long long)ly->sites_in,
                (long long)ly->sites_out, (long long)ly->pairs,
                layer_flops(run, l, backward) * 1e-9, t.median, t.min, t.max,
                sum > 0.0 ? 100.0 * t.median / sum : 0.0);
        for (int k = 1; k < BENCH_PHASES; ++k)
            fprintf(out, " %9.2f", layer_spread(s, l, k).median);
        fputc('\n', out);
    }
}

static void print_pass(bench_run *run, bench_samples *s, const char *title, int backward,
                       FILE *out) {
    fprintf(out, "\n%s\n", title);
    print_layers(run, s, backward, out);
    pass_summary p = summarize(run, s, backward);
    fprintf(out, "phases (sum over layers), ms median [min, max] and share of the layers' time:\n");
    for (int k = 1; k < BENCH_PHASES; ++k)
        fprintf(out, "  %-9s %9.2f [%9.2f, %9.2f] %5.1f%%\n", phase_titles[k], p.phases[k].median,
                p.phases[k].min, p.phases[k].max,
                p.phases[0].median > 0.0 ? 100.0 * p.phases[k].median / p.phases[0].median : 0.0);
    fprintf(out, "  %-9s %9.2f [%9.2f, %9.2f]\n", "layers", p.phases[0].median, p.phases[0].min,
            p.phases[0].max);
    fprintf(out, "%s: %.2f ms median [%.2f, %.2f] wall, %.3f GFLOP, %.1f GFLOP/s; GEMM phase %.1f "
            "GFLOP/s", title, p.wall.median, p.wall.min, p.wall.max, p.flops * 1e-9, p.gflops,
            p.gemm_gflops);
    if (run->peak_gflops > 0.0)
        fprintf(out, " = %.1f%% of the %s", 100.0 * p.gemm_share, peak_name(run));
    fputc('\n', out);
    if (run->device_clock)
        fprintf(out, "%s: %.3f ms median [%.3f, %.3f] on the device's clock (CUDA events from "
                "before the first op to after the last)%s\n", title, p.device.median,
                p.device.min, p.device.max,
                run->time_phases ? "" : "; conv phases not timed (--phases), so GEMM is 0");
    if (p.gather_gbps > 0.0 || p.scatter_gbps > 0.0) {
        fprintf(out, "%s: gather %.1f GB/s, scatter %.1f GB/s (least bytes moved / phase time)",
                title, p.gather_gbps, p.scatter_gbps);
        if (run->copy_gbps > 0.0)
            fprintf(out, " = %.1f%%, %.1f%% of the device's copy bandwidth",
                    100.0 * p.gather_gbps / run->copy_gbps, 100.0 * p.scatter_gbps / run->copy_gbps);
        fputc('\n', out);
    }
    if (run->peak_gflops > 0.0)
        fprintf(out, "%s: GEMM floor %.2f ms (GFLOP / %s); wall / floor %.3f median "
                "[%.3f, %.3f]%s\n", title, p.floor_ms, peak_name(run), p.over_floor.median,
                p.over_floor.min, p.over_floor.max,
                run->pass_peak != NULL ? ", each pass against its own peak" : "");
    const spread mib = tensor_spread(s);
    fprintf(out, "%s: %.2f us per input site; engine tensors at their most %.1f MiB median "
            "[%.1f, %.1f] (%.2f KiB per input site)\n", title,
            run->sites > 0 ? 1e3 * p.wall.median / (double)run->sites : 0.0, mib.median, mib.min,
            mib.max, run->sites > 0 ? 1024.0 * mib.median / (double)run->sites : 0.0);
    if (!backward && run->needed_mib > 0.0) {
        fprintf(out, "%s: at least %.1f MiB needed (parameters, and what layer %d '%s' reads and "
                "writes at once)", title, run->needed_mib, run->needed_layer,
                run->layers[run->needed_layer].name);
        if (mib.median > 0.0) /* 0 where the C library does not tell allocation sizes */
            fprintf(out, "; engine tensors at their most %.2fx that", mib.median / run->needed_mib);
        fputc('\n', out);
    }
}

void bench_report_print(bench_run *run, FILE *out) {
    fprintf(out, "spconv bench: %s on %s (", run->net_name, run->input);
    if (run->points >= 0) fprintf(out, "%lld points, ", (long long)run->points);
    fprintf(out, "%lld %s, spatial shape [%lld, %lld, %lld])\n", (long long)run->sites,
            run->input_is_voxels ? "sites" : "voxels", (long long)run->spatial_shape[0],
            (long long)run->spatial_shape[1], (long long)run->spatial_shape[2]);
    fprintf(out, "%d thread%s, %s, GEMM by %s, %d timed pass%s after %d warm-up%s; every forward "
            "builds its rulebooks\n", run->threads, run->threads == 1 ? "" : "s", run->dtype,
            gemm_words(run->gemm), run->repeat, run->repeat == 1 ? "" : "es",
            run->warmup, run->warmup == 1 ? "" : "s");
    if (run->peak_gflops > 0.0 && run->device_clock)
        fprintf(out, "device GEMM peak: %.1f GFLOP/s (%s, a [%lld, %lld] x [%lld, %lld] product "
                "of %s, the conv's own centre-offset product); device copy: %.1f GB/s read + "
                "written\n", run->peak_gflops, run->blas != NULL ? run->blas : "cuBLAS",
                8 * (long long)run->peak_size, (long long)run->peak_size,
                (long long)run->peak_size, (long long)run->peak_size, run->dtype, run->copy_gbps);
    else if (run->peak_gflops > 0.0)
        fprintf(out, "sgemm peak: %.1f GFLOP/s (%lld^3 float32, row blocks per thread: %.1f by %s, "
                "%.1f by the fused kernels)\n", run->peak_gflops, (long long)run->peak_size,
                run->peak_blas_gflops, run->blas != NULL ? run->blas : "BLAS",
                run->peak_fused_gflops);
    if (run->pass_peak != NULL) {
        memcpy(run->forward.scratch, run->pass_peak, (size_t)run->repeat * sizeof(double));
        const spread beside = scratch_spread(&run->forward);
        fprintf(out, "sgemm peak beside each pass: %.1f GFLOP/s median [%.1f, %.1f]\n",
                beside.median, beside.min, beside.max);
    }
    print_pass(run, &run->forward, run->with_backward ? "forward (training)" : "forward", 0, out);
    if (run->with_backward) print_pass(run, &run->backward, "backward", 1, out);
    if (run->rss_peak_mib > 0.0)
        fprintf(out, "process peak resident memory: %.1f MiB (everything: the input, the network, "
                "the allocator's free lists)\n", run->rss_peak_mib);
}

/* ---- JSON ------------------------------------------------------------------------------------- */

static void json_string(FILE *out, const char *text) {
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)text; *c != '\0'; ++c) {
        if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
        else if (*c < 0x20) fprintf(out, "\\u%04x", *c);
        else fputc(*c, out);
    }
    fputc('"', out);
}

/* JSON has no NaN or infinity. */
static void json_number(FILE *out, double value) {
    if (isfinite(value)) fprintf(out, "%.6g", value);
    else fputs("null", out);
}

static void json_spread(FILE *out, spread s) {
    fputs("{\"median\": ", out);
    json_number(out, s.median);
    fputs(", \"min\": ", out);
    json_number(out, s.min);
    fputs(", \"max\": ", out);
    json_number(out, s.max);
    fputc('}', out);
}

static void json_config(const bench_run *run, FILE *out) {
    fputs("  \"config\": {\"net\": ", out);
    json_string(out, run->net_name);
    fputs(", \"input\": ", out);
    json_string(out, run->input);
    fprintf(out, ", \"input_kind\": \"%s\", \"points\": ", run->input_is_voxels ? "voxels" : "scan");
    if (run->points >= 0) fprintf(out, "%lld", (long long)run->points);
    else fputs("null", out);
    fprintf(out, ", \"sites\": %lld, \"spatial_shape\": [%lld, %lld, %lld], \"in_channels\": %lld, "
            "\"threads\": %d, \"dtype\": \"%s\", \"repeat\": %d, \"warmup\": %d, \"backward\": %s, "
            "\"input_grad\": %s, \"replicate\": %d, \"seed\": %lld, "
            "\"gemm\": \"%s\", \"peak_size\": %lld, \"version\": ",
            (long long)run->sites, (long long)run->spatial_shape[0],
            (long long)run->spatial_shape[1], (long long)run->spatial_shape[2],
            (long long)run->zin.channels, run->threads, run->dtype, run->repeat, run->warmup,
            run->with_backward ? "true" : "false", run->with_input_grad ? "true" : "false",
            run->replicate, (long long)run->seed, run->gemm,
            (long long)run->peak_size);
    json_string(out, spconv_version_string());
    fputs("},\n", out);
}

/* Every timed pass in the order it ran: when it began, its wall time and its phases summed over
 * the layers, so that a script can compare runs pass by pass (or interleave two runs). */
static void json_pass_samples(const bench_run *run, bench_samples *s, double flops, FILE *out) {
    fputs(",\n      \"per_pass\": [", out);
    for (int r = 0; r < s->repeat; ++r) {
        fprintf(out, "%s{\"rep\": %d, \"start_unix_ms\": %.3f, \"wall_ms\": ",
                r ? ",\n                   " : "", r, s->start[r]);
        json_number(out, s->wall[r]);
        fputs(", \"peak_gflops\": ", out);
        if (run->pass_peak != NULL) json_number(out, run->pass_peak[r]);
        else fputs("null", out);
        fputs(", \"wall_over_floor\": ", out);
        if (run->peak_gflops > 0.0) json_number(out, pass_over_floor(run, s, r, flops));
        else fputs("null", out);
        fputs(", \"tensor_mib\": ", out);
        json_number(out, s->tensor_mib[r]);
        fputs(", \"phases_ms\": {", out);
        for (int k = 0; k < BENCH_PHASES; ++k) {
            double sum = 0.0;
            for (int l = 0; l < s->layers; ++l) sum += bench_sample(s, r, l)[k];
            fprintf(out, "%s\"%s\": ", k ? ", " : "", phase_keys[k]);
            json_number(out, sum);
        }
        fputs("}}", out);
    }
    fputc(']', out);
}

static void json_pass(bench_run *run, bench_samples *s, int backward, FILE *out) {
    pass_summary p = summarize(run, s, backward);
    fprintf(out, "{\"mode\": \"%s\", \"wall_ms\": ",
            backward ? "backward" : run->with_backward ? "training" : "inference");
    json_spread(out, p.wall);
    fputs(", \"device_ms\": ", out);
    if (run->device_clock) json_spread(out, p.device);
    else fputs("null", out);
    fputs(", \"gather_gbps\": ", out);
    if (p.gather_gbps > 0.0) json_number(out, p.gather_gbps);
    else fputs("null", out);
    fputs(", \"scatter_gbps\": ", out);
    if (p.scatter_gbps > 0.0) json_number(out, p.scatter_gbps);
    else fputs("null", out);
    fputs(", \"phases_ms\": {", out);
    for (int k = 0; k < BENCH_PHASES; ++k) {
        fprintf(out, "%s\"%s\": ", k ? ", " : "", phase_keys[k]);
        json_spread(out, p.phases[k]);
    }
    fputs("}, \"gflop\": ", out);
    json_number(out, p.flops * 1e-9);
    fputs(", \"gflops\": ", out);
    json_number(out, p.gflops);
    fputs(", \"gemm_gflops\": ", out);
    json_number(out, p.gemm_gflops);
    fputs(", \"gemm_share_of_peak\": ", out);
    if (run->peak_gflops > 0.0) json_number(out, p.gemm_share);
    else fputs("null", out);
    fputs(", \"floor_ms\": ", out);
    if (run->peak_gflops > 0.0) json_number(out, p.floor_ms);
    else fputs("null", out);
    fputs(", \"wall_over_floor\": ", out);
    if (run->peak_gflops > 0.0) json_spread(out, p.over_floor);
    else fputs("null", out);
    fputs(", \"tensor_mib\": ", out);
    json_spread(out, tensor_spread(s));
    if (!backward && run->needed_mib > 0.0) {
        fputs(", \"needed_mib\": ", out);
        json_number(out, run->needed_mib);
        fprintf(out, ", \"needed_layer\": %d", run->needed_layer);
    }
    json_pass_samples(run, s, p.flops, out);
    fputc('}', out);
}

static void json_layer_phases(bench_samples *s, int layer, FILE *out) {
    fputc('{', out);
    for (int k = 0; k < BENCH_PHASES; ++k) {
        fprintf(out, "%s\"%s\": ", k ? ", " : "", phase_keys[k]);
        json_spread(out, layer_spread(s, layer, k));
    }
    fputc('}', out);
}

/* Layer @p layer's phases in every pass: one array per phase, indexed by repetition. */
static void json_layer_per_pass(bench_samples *s, int layer, FILE *out) {
    fputc('{', out);
    for (int k = 0; k < BENCH_PHASES; ++k) {
        fprintf(out, "%s\"%s\": [", k ? ", " : "", phase_keys[k]);
        for (int r = 0; r < s->repeat; ++r) {
            if (r) fputs(", ", out);
            json_number(out, bench_sample(s, r, layer)[k]);
        }
        fputc(']', out);
    }
    fputc('}', out);
}

static void json_layer(bench_run *run, int l, FILE *out) {
    const bench_layer *ly = &run->layers[l];
    fprintf(out, "    {\"index\": %d, \"name\": ", l);
    json_string(out, ly->name);
    fprintf(out, ", \"kind\": \"%s\", \"sites_in\": %lld, \"sites_out\": %lld, \"channels_in\": "
            "%lld, \"channels_out\": %lld, \"pairs\": %lld, \"gflop\": ",
            spconv_layer_kind_name(ly->kind), (long long)ly->sites_in, (long long)ly->sites_out,
            (long long)ly->channels_in, (long long)ly->channels_out, (long long)ly->pairs);
    json_number(out, ly->flops * 1e-9);
    fputs(",\n     \"forward_ms\": ", out);
    json_layer_phases(&run->forward, l, out);
    fputs(",\n     \"forward_ms_per_pass\": ", out);
    json_layer_per_pass(&run->forward, l, out);
    if (run->with_backward) {
        fputs(",\n     \"backward_ms\": ", out);
        json_layer_phases(&run->backward, l, out);
        fputs(",\n     \"backward_ms_per_pass\": ", out);
        json_layer_per_pass(&run->backward, l, out);
    }
    fprintf(out, "}%s\n", l + 1 < run->num_layers ? "," : "");
}

void bench_report_json(bench_run *run, FILE *out) {
    fputs("{\n  \"schema\": \"spconv-bench/1\",\n", out);
    json_config(run, out);
    fputs("  \"sgemm_peak_gflops\": ", out);
    if (run->peak_gflops > 0.0) json_number(out, run->peak_gflops);
    else fputs("null", out);
    fputs(",\n  \"sgemm_peak_parts\": ", out);
    if (run->peak_gflops > 0.0) {
        fputs("{\"blas\": ", out);
        json_number(out, run->peak_blas_gflops);
        fputs(", \"fused\": ", out);
        if (run->peak_fused_gflops > 0.0) json_number(out, run->peak_fused_gflops);
        else fputs("null", out);
        fputs(", \"blas_name\": ", out);
        json_string(out, run->blas != NULL ? run->blas : "");
        fputs("}", out);
    } else {
        fputs("null", out);
    }
    fputs(",\n  \"device_clock\": ", out);
    fputs(run->device_clock ? "true" : "false", out);
    fprintf(out, ", \"time_phases\": %s, \"copy_gbps\": ", run->time_phases ? "true" : "false");
    if (run->copy_gbps > 0.0) json_number(out, run->copy_gbps);
    else fputs("null", out);
    fputs(",\n  \"rss_peak_mib\": ", out);
    if (run->rss_peak_mib > 0.0) json_number(out, run->rss_peak_mib);
    else fputs("null", out);
    fputs(",\n  \"passes\": {\"forward\": ", out);
    json_pass(run, &run->forward, 0, out);
    if (run->with_backward) {
        fputs(",\n             \"backward\": ", out);
        json_pass(run, &run->backward, 1, out);
    }
    fputs("},\n  \"layers\": [\n", out);
    for (int l = 0; l < run->num_layers; ++l) json_layer(run, l, out);
    fputs("  ]\n}\n", out);
}
