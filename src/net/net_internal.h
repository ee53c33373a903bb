/* Shared by the files of the net module: the network's fields, what a training pass keeps for
 * backward, the per-layer kernels (batch norm, ReLU, concatenation) and small helpers. */
#ifndef SPCONV_NET_INTERNAL_H
#define SPCONV_NET_INTERNAL_H

#include <stdint.h>

#include "conv/conv_exec.h"
#include "core/device_clock.h"
#include "core/parallel.h"
#include "spconv/net.h"


/* One parameter or buffer. `value` is a contiguous CPU tensor of the network's dtype. */
typedef struct spconv__net_param {
    char *name; /* "<layer>.weight", owned */
    spconv_tensor *value;
    spconv_tensor *grad; /* NULL for buffers and before the first backward */
    int trainable;
} spconv__net_param;

/* What a training forward keeps for one layer's backward. Every layer keeps its input and
 * output; the rest depends on the kind. */
typedef struct spconv__layer_tape {
    spconv_sparse_tensor *in;
    spconv_sparse_tensor *out;
    spconv_rulebook *rulebook; /* convs and pool */
    spconv_tensor *argmax;     /* pool */
    spconv_tensor *bn_stats;   /* batch norm: f64 [3C] on the features' device: batch mean,
                                  1 / sqrt(var + eps), unbiased variance (net_ops.c) */
    int64_t bn_sites;          /* batch norm: the rows the statistics came from */
} spconv__layer_tape;

/* A layer as the network holds it. */
typedef struct spconv__net_layer {
    spconv_layer_desc desc; /* defaults filled in; name and key point into the owned copies */
    char *name_owned;
    char *key_owned;
    spconv_conv_params params; /* convs and pool */
    int64_t c_in, c_out;       /* channels flowing in and out (TO_DENSE: C before folding) */
    int first_param;           /* parameters first_param .. first_param + num_params - 1 */
    int num_params;
    int saved_layer; /* CONCAT: index of the SAVE layer it reads; INVERSE: the layer
                        whose rulebook it inverts; else -1 */
    spconv_layer_stats stats;
} spconv__net_layer;

/* Copies of the parameters on a device other than the CPU, made in one transfer (net_mirror.c):
 * what a pass there reads instead of uploading each parameter. `version` is the network's
 * param_version when it was made: a copy of another version is stale. Reference-counted (a pass
 * and the network may hold it); not for concurrent use, as the network is not. */
typedef struct spconv__net_mirror {
    int64_t refcount;
    spconv_device device;
    uint64_t version;
    spconv_tensor **params;   /* [num_params] on `device`, the parameters' dtypes and shapes */
    spconv_tensor **bn_terms; /* [num_layers]: a batch norm's f64 [4, C]: its inference terms
                                 (scale then shift, net_forward.c's arithmetic), then gamma and
                                 beta as doubles (a training pass's batchnorm_terms and backward
                                 read them there); NULL for other layers */
    int num_params, num_layers;
} spconv__net_mirror;

struct spconv_net {
    spconv_dtype dtype;
    int64_t in_channels;
    int num_layers;
    spconv__net_layer *layers;
    int num_params;
    spconv__net_param *params;
    spconv__layer_tape *tape; /* [num_layers]; filled by a training forward */
    int has_tape;
    int has_grads;
    spconv_storage *dense_storage; /* the last TO_DENSE map's bytes, reused when free */
    uint64_t param_version;        /* bumped by each change the library makes to parameters */
    spconv__net_mirror *kept;      /* spconv_net_keep_on_device's copy, or NULL */
    spconv__net_mirror *tape_mirror; /* the copy a training forward used, for its backward */
    spconv__device_clock *clock;   /* the device clock of the last pass's device; NULL: the CPU */
    spconv_net_timing timing;      /* spconv_net_set_timing */
    spconv_net_progress_fn progress;
    void *progress_user;
};

/* Whether an inference forward folds a batch norm (and the ReLU after it) into the conv before it
 * (net_forward.c, folds_batchnorm): sets it for @p on >= 0 and returns the value before. Tests
 * turn it off to hold the folded network to the layers run one by one. Not for concurrent use. */
int spconv__net_fold_batchnorm(int on);

/* ---- creation helpers (net.c, used by the zoo) ----------------------------------------------- */

/* Release everything a training forward kept. */
void spconv__net_clear_tape(spconv_net *net);

/* Allocate and initialise the parameters of every layer from @p seed (net_weights.c). */
spconv_status spconv__net_init_params(spconv_net *net, uint64_t seed);

/* ---- timing on the device's clock (net.c) ----------------------------------------------------
 * On a device with its own clock (CUDA), layer times are spans between marks queued as the pass
 * goes, added into the statistics when spconv_net_stats resolves them. */

/* Make net->clock the clock of @p device (NULL on the CPU, or when the network times nothing on
 * a device: SPCONV_NET_TIME_NONE), with no marks; a forward calls it. */
spconv_status spconv__net_clock_start(spconv_net *net, spconv_device device);
/* A mark on the pass's stream, -1 without a clock. */
spconv_status spconv__net_clock_mark(spconv_net *net, spconv_context *ctx, int *mark);
/* A mark now, and the span from mark @p first to it added into *dest when resolved. */
spconv_status spconv__net_clock_span_since(spconv_net *net, spconv_context *ctx, int first,
                                           double *dest);
/* End a layer's timing: its total from mark @p first on the device's clock (its "other" then
 * comes when resolved), or from @p start_s on the host's, with "other" whatever the named phases
 * leave of it. */
spconv_status spconv__net_finish_phase(spconv_net *net, spconv_context *ctx,
                                       spconv_phase_ms *phase, double start_s, int first);

/* ---- parameters on a device (net_mirror.c) --------------------------------------------------- */

/* An inference batch norm's per-channel terms, in double: y = x * scale + shift, from the layer's
 * gamma, beta, running mean and running var. @p work holds 6 * c doubles: those four, then scale
 * and shift. */
void spconv__net_bn_inference_terms(const spconv_net *net, const spconv__net_layer *bn,
                                    double *work);

/* The copy of the parameters a pass on @p device reads (one reference), made now in one transfer
 * unless the network keeps an up-to-date one for that device; *out NULL on the CPU. */
spconv_status spconv__net_mirror_for(spconv_context *ctx, spconv_net *net, spconv_device device,
                                     spconv__net_mirror **out);
void spconv__net_mirror_release(spconv__net_mirror *mirror);

/* ---- the network's layer kernels, through the backend of the features' device (net_ops.c) ----
 * Contiguous f32/f64 features [n, c]; the slots are described in core/backend.h. An op the
 * device's backend lacks is SPCONV_ERR_NOT_SUPPORTED naming the op and the backend. Messages name
 * no function: the forward/backward drivers prefix the layer. */

/* Batch statistics into stats, double [3c] on x's device: the mean, invstd = 1 / sqrt(biased var
 * + eps), and the unbiased variance. The sums run over fixed blocks of rows, so results do not
 * depend on the thread count. */
spconv_status spconv__net_batchnorm_stats(spconv_context *ctx, const spconv_tensor *x, double eps,
                                          double *stats);
/* terms [2c] = scale = gamma * invstd, shift = beta - mean * scale (double arrays on x's device;
 * affine [2c] = gamma, beta). */
spconv_status spconv__net_batchnorm_terms(spconv_context *ctx, const spconv_tensor *x,
                                          const double *affine, const double *stats,
                                          double *terms);
/* y = x * scale[c] + shift[c], then with @p relu the ReLU of that in the same pass (the bits of
 * spconv__net_relu_forward after it); y may be x (in place). scale and shift are double [c] on
 * x's device. */
spconv_status spconv__net_batchnorm_apply(spconv_context *ctx, const spconv_tensor *x,
                                          const double *scale, const double *shift, int relu,
                                          spconv_tensor *y);
/* Batch-norm backward with batch statistics (stats as spconv__net_batchnorm_stats writes them,
 * gamma [c], both on x's device): dx, and sums [2c] = dgamma, dbeta (overwritten, on x's
 * device). */
spconv_status spconv__net_batchnorm_backward(spconv_context *ctx, const spconv_tensor *x,
                                             const spconv_tensor *dy, const double *stats,
                                             const double *gamma, spconv_tensor *dx,
                                             double *sums);
/* y = max(x, 0) (NaN passes); y may be x. */
spconv_status spconv__net_relu_forward(spconv_context *ctx, const spconv_tensor *x,
                                       spconv_tensor *y);
/* dx = dy where y > 0, else 0; dx may be dy. */
spconv_status spconv__net_relu_backward(spconv_context *ctx, const spconv_tensor *y,
                                        const spconv_tensor *dy, spconv_tensor *dx);
/* y += alpha * x (same numel). */
spconv_status spconv__net_axpy(spconv_context *ctx, double alpha, const spconv_tensor *x,
                               spconv_tensor *y);
/* dense [B, C*D, H, W] := 0, then dense[b, ch * D + z, y, x] = features[r, ch] at the site
 * (b, z, y, x) of row r of @p indices (contiguous int32 [n, 4]). Sites outside the map or
 * repeated are errors, checked before anything is written. */
spconv_status spconv__net_to_dense_scatter(spconv_context *ctx, const spconv_tensor *features,
                                           const spconv_tensor *indices, spconv_tensor *dense);
/* features[r, ch] = dense[b, ch * D + z, y, x] at the site of row r of @p indices. */
spconv_status spconv__net_to_dense_gather(spconv_context *ctx, const spconv_tensor *dense,
                                          const spconv_tensor *indices, spconv_tensor *features);

/* SPCONV_ERR_NOT_SUPPORTED naming the layer when the backend of @p device lacks a kernel that
 * the network's layers need for @p training (or inference): checked before any layer runs, so
 * that a network fails up front rather than half way. */
spconv_status spconv__net_check_backend(const char *func, const spconv_net *net,
                                        spconv_device device, int training);
/* The same against the table @p be (tests hand it a table with slots removed). */
spconv_status spconv__net_check_kernels(const char *func, const spconv_net *net,
                                        const spconv_backend *be, int training);

/* ---- small helpers --------------------------------------------------------------------------- */

/* The kinds that hold a conv weight: SUBM, CONV, TRANSPOSED, INVERSE. */
static inline int spconv__layer_is_conv(spconv_layer_kind kind) {
    return kind == SPCONV_LAYER_SUBM || kind == SPCONV_LAYER_CONV ||
           kind == SPCONV_LAYER_TRANSPOSED || kind == SPCONV_LAYER_INVERSE;
}

/* Add the conv executor's phase clocks to @p phase in milliseconds. The executor sums them over
 * its threads: divided by the thread count they are wall-clock shares. */
static inline void spconv__net_add_conv_timing(spconv_phase_ms *phase,
                                               const spconv__conv_timing *timing) {
    const double ms_per_s = timing->threads > 0 ? 1e3 / timing->threads : 0.0;
    phase->gather += timing->gather_s * ms_per_s;
    phase->gemm += timing->gemm_s * ms_per_s;
    phase->scatter += timing->scatter_s * ms_per_s;
}

/* Re-record the current error message prefixed by "func: layer i 'name' (kind): " and return
 * @p status, so a failure deep inside a layer says which layer it was. */
spconv_status spconv__net_layer_error(const char *func, const spconv__net_layer *layer,
                                      spconv_status status);

/* The dtype of a parameter of a layer of @p kind: the network's, except batch norm's of a 16-bit
 * network, which are f32 (its affine and running statistics stay in f32, as mixed-precision
 * training keeps them). */
spconv_dtype spconv__net_param_dtype(const spconv_net *net, spconv_layer_kind kind);

/* Copy a contiguous floating tensor's elements to doubles, and doubles into such a tensor
 * (rounded to nearest even; to f16 / bf16 through f32, as convert.h says). */
/* Bytes a piece of @p bytes takes in a packed device block (the parameters' copy, the gradients
 * brought home): each piece starts on 256 bytes, a device allocation's alignment. */
static inline size_t spconv__net_piece_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

void spconv__net_to_doubles(const spconv_tensor *t, double *dst);
void spconv__net_from_doubles(const double *src, spconv_tensor *t);

#endif /* SPCONV_NET_INTERNAL_H */
