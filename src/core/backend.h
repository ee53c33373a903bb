/* Backends are plain C tables of function pointers, one labelled slot per line (after ggml).
 * The dispatcher picks the table from a tensor's device; an empty slot means "not supported"
 * and the caller answers SPCONV_ERR_NOT_SUPPORTED, never a crash. Later issues add op slots. */
#ifndef SPCONV_CORE_BACKEND_H
#define SPCONV_CORE_BACKEND_H

#include <stddef.h>

#include "spconv/config.h"
#include "spconv/context.h"
#include "spconv/rulebook.h"
#include "spconv/tensor.h"
#include "spconv/voxelize.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds spent per phase of a conv executor, summed over the threads that ran them (divide by
 * `threads` for a wall-clock share). A call adds to the fields, so one struct can collect several
 * calls. */
typedef struct spconv__conv_timing {
    double gather_s;  /* copying rows into the contiguous GEMM operands */
    double gemm_s;    /* the products, including the subm centre offset's direct product */
    double scatter_s; /* scatter-adds, output initialisation, ordered reductions of partials */
    int threads;      /* threads of the last call */
    /* A backend with a device clock (CUDA) times the phases on @p clock instead when it is not
     * NULL: marks around each phase of each kernel offset, whose device milliseconds are added to
     * *device_ms[0..2] (gather, gemm, scatter) when the caller resolves the clock. */
    struct spconv__device_clock *clock;
    double *device_ms[3];
} spconv__conv_timing;

/* Knobs of the conv executors that the public API does not expose: which GEMM runs (tests hold
 * BLAS against the plain-C fallback; a spconv__gemm_impl of conv/gemm.h) and per-phase timing
 * (benchmarks). NULL options mean the defaults: the fastest GEMM, no clock read. */
/* What spconv_conv_forward_affine applies to every output element after its sum, in the
 * features' dtype: y = fma(y, scale[c], shift[c]) (one rounding; both NULL: no affine step),
 * then with relu y < 0 ? 0 : y. Host pointers of C_out elements each.
 * With `wide` set, scale and shift are doubles and the step is the network's inference batch
 * norm (spconv__cpu_bn_rows): y = (T)(y * scale[c] + shift[c]) computed in double, a NaN stored
 * as the default NaN, then the ReLU; the same bits as that layer run on the conv's output. */
typedef struct spconv__conv_epilogue {
    const void *scale;
    const void *shift;
    int relu;
    int wide;
} spconv__conv_epilogue;

typedef struct spconv__conv_options {
    int gemm;                    /* SPCONV__GEMM_AUTO (0) unless a test wants the fallback */
    spconv__conv_timing *timing; /* NULL: no clock is read */
    /* forward only, CPU backend only (the entry point refuses others); NULL: none */
    const spconv__conv_epilogue *epilogue;
} spconv__conv_options;

typedef struct spconv_backend {
    const char *name;

    /* devices and contexts */
    int (*device_count)(void);                                /* 0 when none, never an error */
    spconv_status (*context_init)(spconv_context *ctx);       /* stream, handles */
    void (*context_destroy)(spconv_context *ctx);
    /* queue ctx's work on `stream` (NULL: the context's own) and bind its handles to it */
    spconv_status (*context_set_stream)(spconv_context *ctx, void *stream);
    spconv_status (*synchronize)(spconv_context *ctx);
    /* the device's clock (core/device_clock.h): a mark queued on ctx's stream (the legacy one
     * without a context of this device), and the milliseconds between two recorded marks, which
     * waits for `end`. NULL slots: no device clock (the CPU's is the host's). */
    spconv_status (*mark_create)(int device_index, void **mark);
    void (*mark_destroy)(int device_index, void *mark);
    spconv_status (*mark_record)(spconv_context *ctx, int device_index, void *mark);
    spconv_status (*mark_elapsed_ms)(int device_index, void *start, void *end, double *ms);

    /* memory on this backend's device number device_index */
    spconv_status (*alloc)(int device_index, size_t nbytes, void **ptr);
    /* Memory for a call made with ctx (may be NULL), ordered on the call's stream where the backend
     * can (the CUDA backend's pool): *free_fn, when set, gives it back (with user data NULL)
     * instead of free. NULL slot: alloc and free. */
    spconv_status (*alloc_ordered)(const spconv_context *ctx, int device_index, size_t nbytes,
                                   void **ptr, spconv_free_fn *free_fn);
    void (*free)(int device_index, void *ptr);
    /* Contiguous bytes between the host and this device, or within this device. For the CPU
     * backend all three are memcpy. Ordered on ctx's stream; the host side is synchronous. */
    spconv_status (*copy_to_device)(spconv_context *ctx, int device_index, void *dst,
                                    const void *src_host, size_t nbytes);
    spconv_status (*copy_to_host)(spconv_context *ctx, int device_index, void *dst_host,
                                  const void *src, size_t nbytes);
    spconv_status (*copy_on_device)(spconv_context *ctx, int device_index, void *dst,
                                    const void *src, size_t nbytes);

    /* element-wise ops, both tensors on this backend's device (same shape, any layouts/dtypes) */
    spconv_status (*copy_strided)(spconv_context *ctx, spconv_tensor *dst, const spconv_tensor *src);
    spconv_status (*fill)(spconv_context *ctx, spconv_tensor *dst, double value);

    /* points to voxels (voxelize.h) for a batch of scans, the first on this backend's device;
     * @p func names the public entry point, @p batch_column 1 for (b, z, y, x) coords, 0 for
     * (z, y, x); *out is zeroed and num_scans checked by the entry point */
    spconv_status (*voxelize)(spconv_context *ctx, const char *func,
                              const spconv_tensor *const *scans, int64_t num_scans,
                              const spconv_voxelize_params *params, int batch_column,
                              spconv_voxels *out);

    /* rulebook of a regular, subm or transposed conv or a pool (rulebook.h) from indices on this
     * backend's device; arguments checked by spconv_rulebook_build, rows validated here */
    spconv_status (*rulebook_build)(spconv_context *ctx, const spconv_tensor *indices,
                                    const int64_t spatial_shape[3], int64_t batch_size,
                                    const spconv_conv_params *params, spconv_rulebook **out);

    /* sparse convolution (conv.h), operands already checked by the entry points in src/conv/,
     * all on this backend's device; options may be NULL */
    spconv_status (*conv_forward)(spconv_context *ctx, const spconv_rulebook *rb,
                                  const spconv_tensor *features, const spconv_tensor *weight,
                                  const spconv_tensor *bias, const spconv__conv_options *options,
                                  spconv_tensor **out);
    /* Each gradient pointer may be NULL (not wanted); at least one is not. */
    spconv_status (*conv_backward)(spconv_context *ctx, const spconv_rulebook *rb,
                                   const spconv_tensor *features, const spconv_tensor *weight,
                                   const spconv_tensor *grad_out,
                                   const spconv__conv_options *options,
                                   spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                   spconv_tensor **grad_bias);
    spconv_status (*maxpool_forward)(spconv_context *ctx, const spconv_rulebook *rb,
                                     const spconv_tensor *features, spconv_tensor **out,
                                     spconv_tensor **argmax);
    spconv_status (*maxpool_backward)(spconv_context *ctx, const spconv_rulebook *rb,
                                      const spconv_tensor *argmax, const spconv_tensor *grad_out,
                                      spconv_tensor **grad_features);
    spconv_status (*sparse_to_dense)(spconv_context *ctx, const spconv_tensor *features,
                                     const spconv_tensor *indices, const int64_t spatial_shape[3],
                                     int64_t batch_size, spconv_tensor **out);
    spconv_status (*dense_to_sparse)(spconv_context *ctx, const spconv_tensor *dense,
                                     spconv_tensor **features, spconv_tensor **indices);

    /* the network's own layers (src/net/) on contiguous f32/f64 features [n, c] of this device.
     * Per-channel vectors are double arrays on this device (host memory for the CPU): the batch
     * statistics, the batch norm's terms and its parameter gradients stay where the features are,
     * so a training layer neither waits for the device nor uploads anything. y may be x (and dx
     * may be dy) where the net works in place.
     * stats [3c]: the batch mean, 1 / sqrt(biased variance + eps), the unbiased variance. */
    spconv_status (*batchnorm_stats)(spconv_context *ctx, const spconv_tensor *x, double eps,
                                     double *stats);
    /* terms [2c] = scale = gamma * invstd, shift = beta - mean * scale, from affine [2c]
     * (gamma, beta) and stats [3c] (batchnorm_stats'); x gives the device and c. */
    spconv_status (*batchnorm_terms)(spconv_context *ctx, const spconv_tensor *x,
                                     const double *affine, const double *stats, double *terms);
    /* y = x * scale + shift, then (relu != 0) y < 0 ? 0 : y in the same pass, as the ReLU slot
     * would (NaN kept), so that a fused pair gives the bits of the two. */
    spconv_status (*batchnorm_apply)(spconv_context *ctx, const spconv_tensor *x,
                                     const double *scale, const double *shift, int relu,
                                     spconv_tensor *y);
    /* dx from x, dy, stats [3c] (batchnorm_stats') and gamma [c]; sums [2c] = dgamma, dbeta. */
    spconv_status (*batchnorm_backward)(spconv_context *ctx, const spconv_tensor *x,
                                        const spconv_tensor *dy, const double *stats,
                                        const double *gamma, spconv_tensor *dx, double *sums);
    spconv_status (*relu_forward)(spconv_context *ctx, const spconv_tensor *x, spconv_tensor *y);
    spconv_status (*relu_backward)(spconv_context *ctx, const spconv_tensor *y,
                                   const spconv_tensor *dy, spconv_tensor *dx);
    /* y += alpha * x, same numel (gradient sums of skip connections, SGD steps) */
    spconv_status (*axpy)(spconv_context *ctx, double alpha, const spconv_tensor *x,
                          spconv_tensor *y);
    /* the TO_DENSE layer: features [n, C] at int32 [n, 4] sites into a zeroed [B, C*D, H, W] map
     * with channel c*D + z (HeightCompression's order); sites outside the map or repeated are
     * errors; and its backward, the map read back at the sites */
    spconv_status (*to_dense_scatter)(spconv_context *ctx, const spconv_tensor *features,
                                      const spconv_tensor *indices, spconv_tensor *dense);
    spconv_status (*to_dense_gather)(spconv_context *ctx, const spconv_tensor *dense,
                                     const spconv_tensor *indices, spconv_tensor *features);

    /* 1: conv_forward / conv_backward take f16 and bf16 operands as they are (products on the
     * 16-bit values, sums in f32, each result rounded once to the operands' dtype: conv/half.h's
     * contract); 0 (the default): the entry points convert them to f32 at the edges for it. */
    int conv_half_native;
} spconv_backend;

extern const spconv_backend spconv__cpu_backend;
#if SPCONV_HAVE_CUDA
extern const spconv_backend spconv__cuda_backend;
#endif

/** The backend of @p device, or NULL when it is not built in. */
const spconv_backend *spconv__backend_for(spconv_device device);

/** As above, but records SPCONV_ERR_NO_DEVICE naming @p func when the backend is missing or the
 *  device index is not present. */
spconv_status spconv__backend_check(const char *func, spconv_device device,
                                    const spconv_backend **out);

/** The one dispatch of an op: the backend of @p device into *backend_out when it is present and
 *  fills @p slot; otherwise return from the calling function with SPCONV_ERR_NO_DEVICE, or
 *  SPCONV_ERR_NOT_SUPPORTED naming the op (@p what) and the backend. Every op entry point calls
 *  it, the CPU's included: no entry point branches on the device type itself. */
#define SPCONV_DISPATCH(func, device, slot, what, backend_out)                                    \
    do {                                                                                          \
        SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, backend_out));                \
        SPCONV_RETURN_ERROR_IF((*(backend_out))->slot == NULL, SPCONV_ERR_NOT_SUPPORTED,          \
                               "%s: the %s backend has no %s kernel", func,                       \
                               (*(backend_out))->name, what);                                     \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CORE_BACKEND_H */
