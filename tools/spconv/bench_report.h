/* The timings of `spconv bench` and their report: medians with [min, max] per layer and per
 * phase, throughput, the GEMM phase against the sgemm peak, as text and as JSON (schema in
 * docs/benchmarks.md). */
#ifndef SPCONV_TOOLS_BENCH_REPORT_H
#define SPCONV_TOOLS_BENCH_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "spconv/spconv.h"

/* The phases of spconv_phase_ms, in its order: total = the other five. */
#define BENCH_PHASES 6

/* Milliseconds of every layer and phase in every timed pass of one direction. */
typedef struct bench_samples {
    int repeat;
    int layers;
    double *layer;   /* [repeat][layers][BENCH_PHASES] */
    double *wall;    /* [repeat]: the whole pass, as the caller timed it */
    double *device;  /* [repeat]: the pass on the device's own clock (CUDA events: from before its
                      * first op to after its last); unused where the device has none */
    double *start;   /* [repeat]: when the pass began, ms since the Unix epoch (CLOCK_REALTIME),
                      * so that passes of runs made side by side can be put in one time order */
    double *tensor_mib; /* [repeat]: the engine's CPU tensors at their most during the pass */
    double *scratch; /* [repeat]: for sorting */
} bench_samples;

/** Allocate for @p repeat passes of @p layers layers; 0 on success, -1 out of memory. */
int bench_samples_init(bench_samples *s, int repeat, int layers);
/** The BENCH_PHASES values of layer @p layer in pass @p rep. */
double *bench_sample(bench_samples *s, int rep, int layer);

/* What one layer is: the same in every pass. */
typedef struct bench_layer {
    const char *name; /* borrowed from the network */
    spconv_layer_kind kind;
    int64_t sites_in, sites_out, channels_in, channels_out, pairs;
    double flops; /* forward */
} bench_layer;

/* A benchmark run: the configuration, the peak and the samples. */
typedef struct bench_run {
    const char *net_name;
    const char *input;
    int input_is_voxels;
    spconv_net_input zin;
    int64_t points; /* of the scan; -1 for voxel files */
    int64_t sites;
    int64_t spatial_shape[3];
    int threads, repeat, warmup;
    const char *dtype; /* of the network: "f32", "f16", "bf16" */
    const char *gemm; /* who runs the products: "fused", "blas", "fallback" or "cublas" */
    int with_backward; /* backward timed too; forward in training mode */
    int with_input_grad; /* the backward also computes the input's gradient */
    int replicate;       /* copies of the input, one batch entry each */
    double rss_peak_mib; /* the process's peak resident memory at the end; 0 where unknown */
    int64_t out_bytes;   /* the forward's output (for TO_DENSE: the dense map), bytes */
    /* An inference forward's lower bound (bench_report_capture_needs): the parameters plus, at the
     * layer that needs most, what it reads and writes at once; 0 where not computed. */
    double needed_mib;
    int needed_layer;
    int64_t seed, peak_size;
    double peak_gflops; /* the higher of the two below; 0: not measured */
    double peak_blas_gflops, peak_fused_gflops; /* BLAS products, fused kernels (0: none) */
    const char *blas;   /* the BLAS's name and kernels, spconv__blas_name() */
    /* [repeat], or NULL: with --peak-every-pass, the peak beside timed pass r (the higher of the
     * measurements just before and just after it), so that a pass is set against the ceiling of
     * its own minutes on a machine whose speed drifts. */
    double *pass_peak;
    /* A device with its own clock (a GPU): passes, layers and phases are timed on it, and the
     * peak is the device's own GEMM (peak_gflops, on the network's dtype) beside its copy
     * bandwidth; conv phases only with time_phases (SPCONV_NET_TIME_PHASES). */
    int device_clock;
    int time_phases;
    double copy_gbps; /* device-to-device copy, bytes read + written per second / 1e9; 0: none */
    bench_samples forward, backward;
    bench_layer *layers;
    int num_layers;
} bench_run;

/** Copy what every layer of @p net is (from its last pass); 0 on success, -1 out of memory. */
int bench_report_capture_layers(bench_run *run, const spconv_net *net);

/** The least memory an engine that builds rulebooks holds to run an inference forward of
 *  @p net as the last pass did (after bench_report_capture_layers): the parameters, plus the
 *  largest over the layers of the features and coordinates the layer reads and writes, its
 *  rulebook's pairs without the centre of a subm (two int32 rows a pair) and the saved tensors
 *  a later CONCAT still needs. Batch norm and ReLU count their input only (they can work in
 *  place). Kept rulebooks, the input of a layer once its output exists and every workspace are
 *  left out, so such an engine could not hold less (one that probes a hash table per output
 *  instead of keeping the pairs would hold the table instead). Leaves needed_mib at 0 for a
 *  training forward. For a network on the CPU, whose tensors the report counts. */
void bench_report_capture_needs(bench_run *run, const spconv_net *net);

/** The human-readable report. */
void bench_report_print(bench_run *run, FILE *out);

/** The JSON report (docs/benchmarks.md). */
void bench_report_json(bench_run *run, FILE *out);

/** Free the samples and the layer copies; a zeroed run is a no-op. */
void bench_run_free(bench_run *run);

#endif /* SPCONV_TOOLS_BENCH_REPORT_H */
