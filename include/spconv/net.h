/**
 * @file net.h
 * @brief Sparse networks: ordered layer sequences (spconv's SparseSequential), their weights,
 * forward and backward, per-layer statistics, and the model zoo (second, basic, unet).
 *
 * A network is an ordered list of layers described as data (::spconv_layer_desc): submanifold,
 * regular, transposed and inverse convolutions, max pooling, batch norm, ReLU, to-dense, and the
 * two layers a U-Net needs for skip connections (SAVE remembers the current tensor under a
 * name, CONCAT appends a remembered tensor's channels to the current one on the same sites).
 * Layers share rulebooks through the sparse tensor's indice_key cache exactly as spconv does:
 * submanifold layers with one key reuse one rulebook, and an inverse conv finds the rulebook of
 * the conv or pool it inverts by key (spconv_sparse_get_rulebook). The cache belongs to the input
 * sparse tensor: running a network twice on the same input reuses its rulebooks, so a benchmark
 * that wants rulebook building in every pass creates a fresh input each time.
 *
 * Parameters (PyTorch state-dict names, so exported checkpoints load by name):
 *  - conv layers: "<layer>.weight" [KV, C_in, C_out] (RSCK) and, with `bias`, "<layer>.bias"
 *    [C_out];
 *  - batch norm: "<layer>.weight" (gamma, [C]), "<layer>.bias" (beta, [C]) and the buffers
 *    "<layer>.running_mean" and "<layer>.running_var" ([C], not trained).
 * Initialisation from a seed is deterministic and depends only on (seed, parameter name): conv
 * weights are Kaiming-uniform for ReLU, U(-b, b) with b = sqrt(6 / fan_in), fan_in = KV * C_in;
 * conv biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)); batch norm gamma 1, beta 0, running mean 0,
 * running var 1.
 *
 * Weights on disk: a folder with one NumPy file per parameter, "<parameter name>.npy" (for
 * example "conv_input.0.weight.npy", "conv_input.1.running_var.npy"), f16/f32/f64, C order. A
 * conv weight may be RSCK [KV, C_in, C_out] or [KD, KH, KW, C_in, C_out] (spconv 1.x), or spconv
 * 2.x KRSC [C_out, KD, KH, KW, C_in]; see spconv_net_load_weights. docs/networks.md has the
 * recipe to export a PyTorch checkpoint.
 *
 * Thread rules: a network holds state (running statistics, what backward needs, statistics of
 * the last pass), so one network is used by one thread at a time.
 *
 * Backends: every layer runs on the backend of the input's device (the CPU or a CUDA device), in
 * the network's dtype; a forward first checks that this backend has every kernel the network
 * needs and otherwise fails naming the first layer it could not run. The parameters are kept on
 * the CPU (and copied to the input's device for its passes). The CPU and CUDA backends have every
 * layer's kernels (README, "Backends").
 */
#ifndef SPCONV_NET_H
#define SPCONV_NET_H

#include <stdint.h>

#include "spconv/context.h"
#include "spconv/conv.h"
#include "spconv/sparse.h"
#include "spconv/status.h"
#include "spconv/tensor.h"
#include "spconv/voxelize.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Layer kinds. The numbers are stable. */
typedef enum spconv_layer_kind {
    SPCONV_LAYER_SUBM = 0,       /**< submanifold conv (spconv SubMConv3d) */
    SPCONV_LAYER_CONV = 1,       /**< regular strided sparse conv (SparseConv3d) */
    SPCONV_LAYER_TRANSPOSED = 2, /**< transposed sparse conv (SparseConvTranspose3d) */
    SPCONV_LAYER_INVERSE = 3,    /**< inverse of the CONV or MAXPOOL layer with the same key */
    SPCONV_LAYER_MAXPOOL = 4,    /**< sparse max pooling (SparseMaxPool3d) */
    SPCONV_LAYER_BATCHNORM = 5,  /**< batch norm over the channels (BatchNorm1d on features) */
    SPCONV_LAYER_RELU = 6,
    SPCONV_LAYER_TO_DENSE = 7,   /**< dense BEV map [B, C*D, H, W]; must be the last layer */
    SPCONV_LAYER_SAVE = 8,       /**< remember the current tensor under `key`; passes it on */
    SPCONV_LAYER_CONCAT = 9      /**< features := [current, saved `key`] on the same sites */
} spconv_layer_kind;

/** "subm", "conv", "transposed", "inverse", "maxpool", "batchnorm", "relu", "to_dense",
 *  "save", "concat"; "invalid" for other values. */
const char *spconv_layer_kind_name(spconv_layer_kind kind);

/**
 * One layer, as data. Zero fields take the defaults noted, so a designated initializer names only
 * what matters: {.kind = SPCONV_LAYER_SUBM, .name = "conv1", .in_channels = 16,
 * .out_channels = 16, .kernel = {3, 3, 3}, .key = "subm1"}.
 *
 * Channels: conv layers declare in_channels and out_channels, batch norm declares in_channels
 * (its num_features); they must chain with what the previous layers produce. MAXPOOL, RELU,
 * SAVE and TO_DENSE keep the channel count; CONCAT adds the saved tensor's channels.
 *
 * TO_DENSE writes the dense map [B, C*D, H, W] of OpenPCDet's HeightCompression: channel
 * c * D + z holds feature c of height slice z (features outer, height inner).
 */
typedef struct spconv_layer_desc {
    spconv_layer_kind kind;
    const char *name;          /**< unique, 1-127 characters of [A-Za-z0-9_.-]; parameter prefix */
    int64_t in_channels;       /**< convs, batch norm: the channels the layer expects (> 0) */
    int64_t out_channels;      /**< convs (> 0) */
    int64_t kernel[3];         /**< convs, pool: (z, y, x), each > 0; subm: odd */
    int64_t stride[3];         /**< CONV, TRANSPOSED: 0 means 1; MAXPOOL: 0 means the kernel */
    int64_t padding[3];        /**< CONV, TRANSPOSED, MAXPOOL (subm pads (K/2)*dilation itself) */
    int64_t dilation[3];       /**< convs, pool; 0 means 1 */
    int64_t output_padding[3]; /**< TRANSPOSED */
    int bias;                  /**< convs: 1 adds the parameter "<name>.bias" */
    const char *key;           /**< convs, pool: indice_key (NULL: none; INVERSE: required);
                                    SAVE, CONCAT: the name of the saved tensor (required) */
    double eps;                /**< batch norm; 0 means 1e-5 (OpenPCDet's backbones use 1e-3) */
    double momentum;           /**< batch norm; 0 means 0.1; running = (1 - m) running + m batch */
} spconv_layer_desc;

typedef struct spconv_net spconv_net;

/**
 * A network of @p num_layers layers (copied; the caller keeps @p layers and its strings) taking
 * @p in_channels input channels, with features and conv parameters of @p dtype (any floating
 * dtype) initialised from @p seed (see the top of this file). An f16 or bf16 network computes
 * each layer in f32 on its widened operands and rounds each result once to @p dtype; its batch
 * norm parameters and running statistics (and their gradients) are f32. Checks everything that does not depend
 * on the input, each error naming the layer ("layer 3 'conv2.0.0' (conv) expects 16 input
 * channels but gets 32"): names (missing, repeated, bad characters), kinds, channels that do not
 * chain (SPCONV_ERR_SHAPE_MISMATCH), kernel/stride/padding/dilation values, an INVERSE whose key
 * no earlier CONV or MAXPOOL layer stores or whose kernel differs from that layer's
 * (SPCONV_ERR_NOT_FOUND / SPCONV_ERR_GEOMETRY_MISMATCH), SAVE names used twice or CONCAT of a
 * name not saved before (SPCONV_ERR_NOT_FOUND), TO_DENSE before the end, batch norm eps <= 0 or
 * momentum outside [0, 1]. *out is owned by the caller (spconv_net_destroy).
 */
spconv_status spconv_net_create(spconv_dtype dtype, int64_t in_channels,
                                const spconv_layer_desc *layers, int num_layers, uint64_t seed,
                                spconv_net **out);

/** Free the network, its parameters and whatever a pass kept; NULL is a no-op. */
void spconv_net_destroy(spconv_net *net);

int spconv_net_num_layers(const spconv_net *net);
/** The layer as the network holds it: defaults filled in (stride 1, eps 1e-5, ...), strings
 *  owned by the network. NULL when @p index is out of range. */
const spconv_layer_desc *spconv_net_layer(const spconv_net *net, int index);
spconv_dtype spconv_net_dtype(const spconv_net *net);
int64_t spconv_net_in_channels(const spconv_net *net);
/** Channels of the output features (for a TO_DENSE net: C before folding in the height D). */
int64_t spconv_net_out_channels(const spconv_net *net);

/* ---- parameters ------------------------------------------------------------------------------ */

/** Parameters and buffers in layer order (weight, bias; BN weight, bias, running_mean,
 *  running_var). */
int spconv_net_num_params(const spconv_net *net);
/** "<layer>.weight", ...; NULL when out of range. */
const char *spconv_net_param_name(const spconv_net *net, int index);
/** Index of the parameter called @p name, or -1. */
int spconv_net_find_param(const spconv_net *net, const char *name);
/** The parameter's contiguous CPU tensor, borrowed; writing into it changes the network (from the
 *  next pass; see spconv_net_keep_on_device for a copy kept on a device). NULL when out of
 *  range. */
spconv_tensor *spconv_net_param(const spconv_net *net, int index);
/** 1 for trained parameters, 0 for buffers (running_mean, running_var) and out of range. */
int spconv_net_param_trainable(const spconv_net *net, int index);
/** Gradient of the parameter from the last spconv_net_backward (same shape), borrowed; NULL for
 *  buffers and before the first backward. */
spconv_tensor *spconv_net_param_grad(const spconv_net *net, int index);

/**
 * Keep a copy of every parameter (and of each batch norm's inference scale and shift) on
 * @p device, made now in one transfer, for the passes that run there: they then upload nothing
 * (without it, a pass on a device other than the CPU makes that copy at its start and drops it at
 * its end). The parameters stay the CPU tensors above. The library's own changes to them
 * (spconv_net_load_weights, spconv_net_sgd_step, a training forward's running statistics) make
 * the next pass on @p device copy them again; after writing into a parameter through
 * spconv_net_param, call this again, or the kept copy is what passes read. The CPU device drops
 * the copy. Errors: SPCONV_ERR_NO_DEVICE (no such device, or no backend for it),
 * SPCONV_ERR_OUT_OF_MEMORY; the network then keeps its previous copy, if any.
 */
spconv_status spconv_net_keep_on_device(spconv_context *ctx, spconv_net *net,
                                        spconv_device device);

/** Weight layouts accepted by spconv_net_load_weights / written by spconv_net_save_weights. */
typedef enum spconv_net_layout {
    SPCONV_NET_LAYOUT_AUTO = 0, /**< load: by shape (see spconv_net_load_weights); save: RSCK */
    SPCONV_NET_LAYOUT_RSCK = 1, /**< [KV, C_in, C_out], or [KD, KH, KW, C_in, C_out] to load */
    SPCONV_NET_LAYOUT_KRSC = 2, /**< spconv 2.x [C_out, KD, KH, KW, C_in] */
    SPCONV_NET_LAYOUT_OIDHW = 3 /**< PyTorch dense conv3d [C_out, C_in, KD, KH, KW] */
} spconv_net_layout;

/**
 * Load every parameter and buffer from "<dir>/<name>.npy". A missing file is
 * SPCONV_ERR_NOT_FOUND, a file of another shape SPCONV_ERR_SHAPE_MISMATCH, an integer file
 * SPCONV_ERR_DTYPE_MISMATCH, each naming the parameter; other .npy errors are passed on with the
 * parameter named. Values are converted to the network's dtype. With SPCONV_NET_LAYOUT_AUTO a
 * conv weight may be 3-d RSCK [KV, C_in, C_out] or 5-d; a 5-d weight is KRSC when its shape is
 * [C_out, KD, KH, KW, C_in], else RSCK [KD, KH, KW, C_in, C_out] (a shape that fits both, only
 * possible when all five sizes are equal, is read as KRSC). The network changes only when every
 * file loaded: on failure it keeps its previous weights.
 */
spconv_status spconv_net_load_weights(spconv_context *ctx, spconv_net *net, const char *dir,
                                      spconv_net_layout layout);

/**
 * Write every parameter and buffer to "<dir>/<name>.npy" in the network's dtype, conv weights in
 * @p layout (AUTO and RSCK: 3-d [KV, C_in, C_out]; KRSC and OIDHW: 5-d). @p dir is created when
 * missing (its parent must exist). SPCONV_ERR_IO naming the file when one cannot be written.
 */
spconv_status spconv_net_save_weights(spconv_context *ctx, const spconv_net *net,
                                      const char *dir, spconv_net_layout layout);

/* ---- running --------------------------------------------------------------------------------- */

typedef enum spconv_net_mode {
    SPCONV_NET_INFERENCE = 0, /**< batch norm with running statistics; nothing kept */
    SPCONV_NET_TRAINING = 1   /**< batch norm with batch statistics (running ones updated); keeps
                                   what spconv_net_backward needs */
} spconv_net_mode;

/** Milliseconds of one pass of one layer. rulebook + gather + gemm + scatter + other = total;
 *  gather/gemm/scatter are the conv executor's phases, 0 for layers without a GEMM; other is the
 *  rest (pool kernels, batch norm, copies). On the CPU: wall clock, the phases summed over the
 *  threads and divided by the thread count. On a GPU: the device's clock (CUDA events queued
 *  between layers and around the rulebook, and with SPCONV_NET_TIME_PHASES around each phase of
 *  each kernel offset; see spconv_net_set_timing), read when spconv_net_stats is first called
 *  after the pass, which waits for the pass; until then (in the progress callback, say) they are
 *  0. */
typedef struct spconv_phase_ms {
    double total;
    double rulebook;
    double gather;
    double gemm;
    double scatter;
    double other;
} spconv_phase_ms;

/** What one layer did in the last pass. */
typedef struct spconv_layer_stats {
    int index;               /**< position in the network */
    const char *name;        /**< owned by the network */
    spconv_layer_kind kind;
    int64_t sites_in;        /**< active sites of the layer's input */
    int64_t sites_out;       /**< of its output (for TO_DENSE: sites of its input) */
    int64_t channels_in;
    int64_t channels_out;    /**< for TO_DENSE: C * D */
    int64_t pairs;           /**< rulebook pairs of a conv or pool (subm: centre included) */
    double flops;            /**< 2 * pairs * C_in * C_out for a conv's forward; else 0 */
    spconv_phase_ms forward;
    spconv_phase_ms backward; /**< zero until a backward ran after the last forward */
} spconv_layer_stats;

/** Statistics of layer @p index from the last pass (zero before the first), borrowed; NULL when
 *  out of range. After a pass on a GPU the first call waits for the pass and fills in the times
 *  (see spconv_phase_ms), so like the other calls on a network it is not for concurrent use; if
 *  the device fails then, the times stay as far as they were read. */
const spconv_layer_stats *spconv_net_stats(const spconv_net *net, int index);

/** Called after each layer of a pass (in reverse order during backward) with that layer's
 *  statistics; @p backward is 1 during spconv_net_backward. */
typedef void (*spconv_net_progress_fn)(void *user, const spconv_layer_stats *stats,
                                       int num_layers, int backward);

/** What a pass on a GPU times on the device's clock. Each CUDA event costs the host a microsecond
 *  or two; the CPU times every phase whatever is chosen (its clock costs nothing). */
typedef enum spconv_net_timing {
    SPCONV_NET_TIME_LAYERS = 0, /**< the default: each layer and its rulebook (three events a layer);
                                     a conv's gather, GEMM and scatter read 0, its time is "other" */
    SPCONV_NET_TIME_PHASES = 1, /**< also each conv's gather, GEMM and scatter: events around each
                                     phase of each kernel offset */
    SPCONV_NET_TIME_NONE = 2    /**< no events: the statistics hold the host's time to queue each
                                     layer, which is not the device's */
} spconv_net_timing;

/** Choose what the following passes time (see spconv_net_timing); an unknown value is ignored. */
void spconv_net_set_timing(spconv_net *net, spconv_net_timing timing);

/** Install (or with NULL remove) the progress callback; @p user is passed back to it. */
void spconv_net_set_progress(spconv_net *net, spconv_net_progress_fn fn, void *user);

/**
 * Run the network on @p input (features [N, C_in] of the network's dtype, on the CPU or a CUDA
 * device, where every layer then runs; N = 0 is valid). *out is the output: features [N_out, C_out] for a sparse output, or the dense map
 * [B, C*D, H, W] (zeros where no site is) for a network ending in TO_DENSE; the map's memory is
 * reused by a later forward once every reference to it is released. @p out_sparse
 * (may be NULL) receives the last sparse tensor (before densifying), whose indices and spatial
 * shape locate the output sites. Both come back with one reference. Rulebooks are built or found
 * through @p input's cache (see the top of this file). In SPCONV_NET_TRAINING mode batch norm
 * uses batch statistics (biased variance for normalising, unbiased for the running update, which
 * is skipped with fewer than 2 sites) and the network keeps what backward needs until the next
 * forward or backward (*out is part of that: do not write into it before the backward). A
 * failing layer's message names it: "spconv_net_forward: layer 4 'c1' (subm): ...".
 */
spconv_status spconv_net_forward(spconv_context *ctx, spconv_net *net,
                                 const spconv_sparse_tensor *input, spconv_net_mode mode,
                                 spconv_tensor **out, spconv_sparse_tensor **out_sparse);

/**
 * Back-propagate @p grad_out (the shape of the last forward's *out, the network's dtype, any
 * layout) through the last SPCONV_NET_TRAINING forward. Every trained parameter gets its
 * gradient (spconv_net_param_grad; overwritten, not accumulated) and @p grad_input (may be NULL)
 * receives d loss / d input features [N, C_in]. What the forward kept is released afterwards, so
 * a second backward needs a new forward (SPCONV_ERR_INVALID_ARGUMENT otherwise).
 */
spconv_status spconv_net_backward(spconv_context *ctx, spconv_net *net,
                                  const spconv_tensor *grad_out, spconv_tensor **grad_input);

/** Plain SGD on every trained parameter: p -= @p learning_rate * grad. Needs a backward first. */
spconv_status spconv_net_sgd_step(spconv_context *ctx, spconv_net *net, double learning_rate);

/* ---- model zoo ------------------------------------------------------------------------------- */

/** What a zoo network expects: how to voxelize a scan for it (mean of the points of a voxel over
 *  the first `point_columns` columns, as SECOND's MeanVFE; with one point per voxel, that point)
 *  and the sparse tensor it takes. */
typedef struct spconv_net_input {
    int64_t channels;             /**< feature channels = point_columns */
    int point_columns;            /**< x, y, z (3) or x, y, z, intensity (4) */
    double voxel_size[3];         /**< metres along x, y, z */
    double point_range[6];        /**< xmin, ymin, zmin, xmax, ymax, zmax */
    int64_t grid_size[3];         /**< voxels along x, y, z: round((max - min) / size) */
    int64_t spatial_shape[3];     /**< (D, H, W) of the input sparse tensor, z first; may exceed
                                       the grid (second adds 1 on z, as OpenPCDet does) */
    int64_t max_points_per_voxel;
    int64_t max_voxels;
} spconv_net_input;

/**
 * Voxelize one scan @p points (float32/float64 [P, F], F >= input->point_columns, x, y, z first,
 * CPU) as @p input says and wrap the result as the network's input: features [M, channels] of
 * @p dtype (the mean of each voxel's points over the first point_columns columns), indices
 * [M, 4] with batch index 0, spatial shape input->spatial_shape, batch size 1. M = 0 (nothing in
 * range) is a valid, empty input. @p stats (may be NULL) receives the voxelizer's account.
 * *out has one reference.
 */
spconv_status spconv_net_input_from_points(spconv_context *ctx, const spconv_net_input *input,
                                           const spconv_tensor *points, spconv_dtype dtype,
                                           spconv_sparse_tensor **out,
                                           spconv_voxelize_stats *stats);

/** Number of zoo networks, and their names / one-line summaries by index (NULL out of range). */
int spconv_zoo_count(void);
const char *spconv_zoo_name(int index);
const char *spconv_zoo_summary(int index);

/** The input a zoo network expects. Unknown @p name: SPCONV_ERR_NOT_FOUND listing the names. */
spconv_status spconv_zoo_input(const char *name, spconv_net_input *out);

/**
 * Build zoo network @p name with parameters of @p dtype initialised from @p seed:
 *  - "second": OpenPCDet's VoxelBackBone8x (SECOND) on the KITTI grid [41, 1600, 1408], 4 -> 128
 *    channels, ending in TO_DENSE: output [B, 256, 200, 176]; layer names follow OpenPCDet's
 *    module names (conv_input.0, conv_input.1, conv2.0.0, ..., conv_out.0), so its state dict
 *    (minus the "backbone_3d." prefix) loads by name;
 *  - "basic": spconv's bench_basic network (14 SubMConv3d 3x3x3 without bias, six
 *    SparseMaxPool3d(2, 2)), 3 -> 256 channels, layers "net.0" .. "net.19";
 *  - "unet": a small submanifold U-Net (three levels, 16/32/64 channels, inverse convs by key and
 *    skip connections by concatenation), 4 -> 16 channels on the input sites.
 */
spconv_status spconv_zoo_create(const char *name, spconv_dtype dtype, uint64_t seed,
                                spconv_net **out);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_NET_H */
