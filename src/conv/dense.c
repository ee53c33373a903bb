/* Sparse <-> dense [B, C, D, H, W] helpers (any dtype: they only move elements), on the CPU, and
 * their dispatchers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conv/conv_check.h"
#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "core/parallel.h"
#include "tensor/convert.h"
#include "tensor/tensor_impl.h"

/* a * b into *out unless it passes INT64_MAX (both non-negative). */
static int mul_fits(int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* Row @p row of the int32 [N, 4] @p idx is inside batch and spatial shape. */
static spconv_status check_site(const char *func, const int32_t *idx, int64_t row,
                                const int64_t shape[3], int64_t batch_size) {
    const int32_t *r = idx + row * 4;
    int inside = r[0] >= 0 && r[0] < batch_size;
    for (int axis = 0; axis < 3; ++axis)
        inside = inside && r[axis + 1] >= 0 && r[axis + 1] < shape[axis];
    SPCONV_RETURN_ERROR_IF(!inside, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: indices row %lld = (%d, %d, %d, %d) is outside batch size %lld and "
                           "spatial shape (%lld, %lld, %lld)",
                           func, (long long)row, r[0], r[1], r[2], r[3], (long long)batch_size,
                           (long long)shape[0], (long long)shape[1], (long long)shape[2]);
    return SPCONV_OK;
}

/* The first row before @p row with the same coordinates (it exists: the caller saw the cell
 * taken), for the duplicate message. */
static int64_t earlier_duplicate(const int32_t *idx, int64_t row) {
    int64_t j = 0;
    while (j < row && memcmp(idx + j * 4, idx + row * 4, 4 * sizeof(int32_t)) != 0) ++j;
    return j;
}

/* Where each row of @p idx lands in a [B, C, cells] map, as b * C * cells + cell (add c * cells
 * for channel c), after checking every row in order: inside the shape, and no site twice. */
static spconv_status site_cells(const char *func, const int32_t *idx, int64_t n,
                                const int64_t shape[3], int64_t batch_size, int64_t channels,
                                unsigned char *taken, int64_t *at) {
    const int64_t cells = shape[0] * shape[1] * shape[2];
    for (int64_t i = 0; i < n; ++i) {
        SPCONV_FORWARD_IF_ERROR(check_site(func, idx, i, shape, batch_size));
        const int32_t *r = idx + i * 4;
        int64_t cell = ((int64_t)r[1] * shape[1] + r[2]) * shape[2] + r[3];
        int64_t site = r[0] * cells + cell;
        if (taken[site / 8] & (1u << (site % 8))) {
            int64_t j = earlier_duplicate(idx, i);
            SPCONV_RETURN_ERROR(SPCONV_ERR_DUPLICATE_INDEX,
                                "%s: indices rows %lld and %lld are both (%d, %d, %d, %d)", func,
                                (long long)j, (long long)i, r[0], r[1], r[2], r[3]);
        }
        taken[site / 8] |= (unsigned char)(1u << (site % 8));
        at[i] = r[0] * channels * cells + cell;
    }
    return SPCONV_OK;
}

/* The map is written tile by tile: a work item is DENSE_TILE_CELLS cells of one batch entry's
 * planes for DENSE_CHANNEL_BLOCK channels. It zeroes those parts of the planes (16 KiB each for
 * float32) and then puts the values of the tile's sites into them while they are in cache; each
 * site's channels of the block are one cache line of its feature row (float32). So the map goes
 * out to memory once and every feature row is read once per block. Channel by channel instead,
 * each channel read one element of every feature row: the whole feature matrix passed through
 * the cache once per channel (128 times for SECOND's 4,236 x 128 to-dense, 1.8 ms of its 2.8). */
#define DENSE_TILE_CELLS 4096
#define DENSE_CHANNEL_BLOCK 16

#define SCATTER_TILES(T)                                                                           \
    do {                                                                                           \
        const T *from = (const T *)src;                                                            \
        T *to = (T *)dst;                                                                          \
        SPCONV_OMP(omp parallel for num_threads(threads) schedule(dynamic, 1)                      \
                            if(batch_size * channels * cells > (1 << 20)))                          \
        for (int64_t w = 0; w < items; ++w) {                                                      \
            const int64_t bt = w / blocks, b = bt / tiles;                                         \
            const int64_t c0 = w % blocks * DENSE_CHANNEL_BLOCK;                                   \
            const int64_t c1 = c0 + DENSE_CHANNEL_BLOCK < channels ? c0 + DENSE_CHANNEL_BLOCK      \
                                                                   : channels;                     \
            const int64_t lo = bt % tiles * DENSE_TILE_CELLS;                                      \
            const int64_t len = cells - lo < DENSE_TILE_CELLS ? cells - lo : DENSE_TILE_CELLS;     \
            for (int64_t c = c0; c < c1; ++c)                                                      \
                memset(to + (b * channels + c) * cells + lo, 0, (size_t)len * sizeof(T));          \
            for (int64_t j = starts[bt]; j < starts[bt + 1]; ++j) {                                \
                const int64_t i = order[j];                                                        \
                const T *row = from + i * channels;                                                \
                T *site = to + at[i];                                                              \
                for (int64_t c = c0; c < c1; ++c) site[c * cells] = row[c];                        \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* The same map channel by channel, when there is no memory for the tiles' site lists: each
 * channel's [cells] blocks are zeroed and then take that channel's values. */
#define SCATTER_CHANNELS(T)                                                                        \
    do {                                                                                           \
        const T *from = (const T *)src;                                                            \
        T *to = (T *)dst;                                                                          \
        SPCONV_OMP(omp parallel for num_threads(threads) schedule(static)                          \
                            if(batch_size * channels * cells > (1 << 20)))                          \
        for (int64_t c = 0; c < channels; ++c) {                                                   \
            for (int64_t b = 0; b < batch_size; ++b)                                               \
                memset(to + (b * channels + c) * cells, 0, (size_t)cells * sizeof(T));             \
            for (int64_t i = 0; i < n; ++i) to[at[i] + c * cells] = from[i * channels + c];        \
        }                                                                                          \
    } while (0)

/* starts[bt] .. starts[bt + 1]: where the rows of tile bt = b * tiles + cell / DENSE_TILE_CELLS
 * lie in order (increasing row within a tile); NULL for no memory. */
static int64_t *tile_rows(int64_t n, int64_t channels, const int64_t *at, int64_t cells,
                          int64_t batch_size, int64_t tiles, int64_t **order) {
    const int64_t num_tiles = batch_size * tiles;
    int64_t *starts = calloc((size_t)num_tiles + 2, sizeof *starts);
    *order = malloc((size_t)(n > 0 ? n : 1) * sizeof **order);
    if (starts == NULL || *order == NULL) {
        free(starts);
        free(*order);
        *order = NULL;
        return NULL;
    }
    const int64_t per_batch = channels * cells;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t b = at[i] / per_batch, cell = at[i] % per_batch;
        ++starts[b * tiles + cell / DENSE_TILE_CELLS + 2];
    }
    for (int64_t t = 2; t <= num_tiles + 1; ++t) starts[t] += starts[t - 1];
    for (int64_t i = 0; i < n; ++i) { /* starts[bt + 1] is tile bt's cursor, then its end */
        const int64_t b = at[i] / per_batch, cell = at[i] % per_batch;
        (*order)[starts[b * tiles + cell / DENSE_TILE_CELLS + 1]++] = i;
    }
    return starts;
}

void spconv__cpu_scatter_channels(int threads, size_t elem, const void *src, int64_t n,
                                  int64_t channels, const int64_t *at, int64_t cells,
                                  int64_t batch_size, void *dst) {
    (void)threads; /* only the OpenMP pragmas read it */
    if (channels <= 0 || cells <= 0 || batch_size <= 0) return; /* an empty map */
    const int64_t tiles = (cells + DENSE_TILE_CELLS - 1) / DENSE_TILE_CELLS;
    const int64_t blocks = (channels + DENSE_CHANNEL_BLOCK - 1) / DENSE_CHANNEL_BLOCK;
    const int64_t items = batch_size * tiles * blocks;
    int64_t *order = NULL;
    int64_t *starts = tile_rows(n, channels, at, cells, batch_size, tiles, &order);
    if (starts != NULL) {
        switch (elem) {
        case 1: SCATTER_TILES(uint8_t); break;
        case 2: SCATTER_TILES(uint16_t); break;
        case 4: SCATTER_TILES(uint32_t); break;
        default: SCATTER_TILES(uint64_t); break;
        }
    } else {
        switch (elem) {
        case 1: SCATTER_CHANNELS(uint8_t); break;
        case 2: SCATTER_CHANNELS(uint16_t); break;
        case 4: SCATTER_CHANNELS(uint32_t); break;
        default: SCATTER_CHANNELS(uint64_t); break;
        }
    }
    free(starts);
    free(order);
}
#undef SCATTER_TILES
#undef SCATTER_CHANNELS

static spconv_status sparse_to_dense_cpu(spconv_context *ctx, const spconv_tensor *features,
                                         const spconv_tensor *indices, const int64_t shape[3],
                                         int64_t batch_size, const int64_t dense_sizes[5],
                                         spconv_tensor **out) {
    static const char func[] = "spconv_sparse_to_dense";
    spconv_tensor *f = NULL, *idx = NULL, *dense = NULL;
    unsigned char *taken = NULL;
    int64_t *at = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, features, &f), done);
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, indices, &idx), done);
    const int64_t n = spconv_tensor_size(f, 0), cells = shape[0] * shape[1] * shape[2];
    int64_t sites = batch_size * cells;
    taken = calloc((size_t)(sites / 8 + 1), 1);
    at = malloc((size_t)(n > 0 ? n : 1) * sizeof *at);
    if (taken == NULL || at == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: no memory for the occupancy bitmap of %lld sites", func,
                         (long long)sites);
    SPCONV_TRY_GOTO(st,
                    site_cells(func, spconv_tensor_data(idx), n, shape, batch_size,
                               dense_sizes[1], taken, at),
                    done);
    /* Every element is written below (zeroed or scattered): no zero fill first. */
    SPCONV_TRY_GOTO(st,
                    spconv__tensor_empty_in(func, ctx, spconv_cpu(), spconv_tensor_dtype(features),
                                            5, dense_sizes, &dense),
                    done);
    spconv__cpu_scatter_channels(spconv_context_num_threads(ctx),
                                 spconv_dtype_size(spconv_tensor_dtype(f)), spconv_tensor_data(f),
                                 n, dense_sizes[1], at, cells, batch_size,
                                 spconv_tensor_data(dense));
    *out = dense, dense = NULL;
done:
    free(taken);
    free(at);
    spconv_tensor_release(dense);
    spconv_tensor_release(idx);
    spconv_tensor_release(f);
    return st;
}

/* Shapes of sparse_to_dense: positive spatial shape and batch size, features [N, C], indices
 * int32 [N, 4] on the same device, and a dense size that fits int64. */
static spconv_status check_sparse_to_dense(const char *func, const spconv_tensor *features,
                                           const spconv_tensor *indices, const int64_t shape[3],
                                           int64_t batch_size, int64_t dense_sizes[5]) {
    SPCONV_RETURN_ERROR_IF(batch_size <= 0, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: batch_size = %lld must be positive", func, (long long)batch_size);
    for (int axis = 0; axis < 3; ++axis)
        SPCONV_RETURN_ERROR_IF(shape[axis] <= 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: spatial shape (%lld, %lld, %lld) must be positive", func,
                               (long long)shape[0], (long long)shape[1], (long long)shape[2]);
    SPCONV_FORWARD_IF_ERROR(spconv__check_matrix(func, features, "features", -1, -1));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_dtype(indices) != SPCONV_I32, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: indices must be i32, got %s", func,
                           spconv_dtype_name(spconv_tensor_dtype(indices)));
    SPCONV_FORWARD_IF_ERROR(
        spconv__check_matrix(func, indices, "indices", spconv_tensor_size(features, 0), 4));
    spconv_device f_dev = spconv_tensor_device(features), i_dev = spconv_tensor_device(indices);
    SPCONV_RETURN_ERROR_IF(!spconv_device_equal(f_dev, i_dev), SPCONV_ERR_DEVICE_MISMATCH,
                           "%s: features are on %s but indices are on %s", func,
                           spconv__device_text(f_dev).text, spconv__device_text(i_dev).text);
    int64_t sizes[5] = {batch_size, spconv_tensor_size(features, 1), shape[0], shape[1], shape[2]};
    /* Sizes of 0 count as 1, so that the site count B * D * H * W is checked even when C = 0. */
    int64_t numel = 1;
    for (int i = 0; i < 5; ++i)
        SPCONV_RETURN_ERROR_IF(!mul_fits(numel, sizes[i] > 0 ? sizes[i] : 1, &numel),
                               SPCONV_ERR_OVERFLOW,
                               "%s: dense size [%lld, %lld, %lld, %lld, %lld] overflows int64",
                               func, (long long)sizes[0], (long long)sizes[1], (long long)sizes[2],
                               (long long)sizes[3], (long long)sizes[4]);
    memcpy(dense_sizes, sizes, sizeof sizes);
    return SPCONV_OK;
}

spconv_status spconv_sparse_to_dense(spconv_context *ctx, const spconv_tensor *features,
                                     const spconv_tensor *indices, const int64_t spatial_shape[3],
                                     int64_t batch_size, spconv_tensor **out) {
    static const char func[] = "spconv_sparse_to_dense";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_CHECK_NOT_NULL(func, indices);
    SPCONV_CHECK_NOT_NULL(func, spatial_shape);
    int64_t dense_sizes[5];
    SPCONV_FORWARD_IF_ERROR(
        check_sparse_to_dense(func, features, indices, spatial_shape, batch_size, dense_sizes));
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, spconv_tensor_device(features), sparse_to_dense, "sparse_to_dense",
                    &backend);
    return backend->sparse_to_dense(ctx, features, indices, spatial_shape, batch_size, out);
}

/* The CPU backend's slot (operands checked by the entry point). */
spconv_status spconv__cpu_sparse_to_dense(spconv_context *ctx, const spconv_tensor *features,
                                          const spconv_tensor *indices,
                                          const int64_t spatial_shape[3], int64_t batch_size,
                                          spconv_tensor **out) {
    const int64_t dense_sizes[5] = {batch_size, spconv_tensor_size(features, 1), spatial_shape[0],
                                    spatial_shape[1], spatial_shape[2]};
    return sparse_to_dense_cpu(ctx, features, indices, spatial_shape, batch_size, dense_sizes, out);
}

static int element_is_nonzero(const char *p, spconv_dtype dtype) {
    if (spconv_dtype_is_floating(dtype)) return spconv__load_floating(p, dtype) != 0.0;
    return spconv__load_integer(p, dtype) != 0;
}

/* mask[b * cells + cell] = 1 where any channel of dense [B, C, cells] is non-zero (NaN counts);
 * returns the number of such sites. */
static int64_t mark_sites(const char *dense, spconv_dtype dtype, int64_t batch, int64_t channels,
                          int64_t cells, unsigned char *mask) {
    const size_t elem = spconv_dtype_size(dtype);
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t c = 0; c < channels; ++c) {
            const char *plane = dense + (size_t)((b * channels + c) * cells) * elem;
            for (int64_t s = 0; s < cells; ++s)
                mask[b * cells + s] |=
                    (unsigned char)element_is_nonzero(plane + (size_t)s * elem, dtype);
        }
    int64_t count = 0;
    for (int64_t s = 0; s < batch * cells; ++s) count += mask[s];
    return count;
}

/* Copy the marked sites, in (b, z, y, x) order, into features [N, C] and indices [N, 4]. */
static void gather_sites(const char *dense, spconv_dtype dtype, const int64_t sizes[5],
                         const unsigned char *mask, char *features, int32_t *indices) {
    const size_t elem = spconv_dtype_size(dtype);
    const int64_t channels = sizes[1], cells = sizes[2] * sizes[3] * sizes[4];
    int64_t n = 0;
    for (int64_t b = 0; b < sizes[0]; ++b)
        for (int64_t cell = 0; cell < cells; ++cell) {
            if (!mask[b * cells + cell]) continue;
            int32_t *r = indices + n * 4;
            r[0] = (int32_t)b;
            r[1] = (int32_t)(cell / (sizes[3] * sizes[4]));
            r[2] = (int32_t)(cell / sizes[4] % sizes[3]);
            r[3] = (int32_t)(cell % sizes[4]);
            for (int64_t c = 0; c < channels; ++c)
                memcpy(features + (size_t)(n * channels + c) * elem,
                       dense + (size_t)((b * channels + c) * cells + cell) * elem, elem);
            ++n;
        }
}

/* The CPU backend's slot (operand checked by the entry point). */
spconv_status spconv__cpu_dense_to_sparse(spconv_context *ctx, const spconv_tensor *dense,
                                          spconv_tensor **features, spconv_tensor **indices) {
    static const char func[] = "spconv_dense_to_sparse";
    const int64_t *sizes = spconv_tensor_sizes(dense);
    const spconv_dtype dtype = spconv_tensor_dtype(dense);
    const int64_t sites = sizes[0] * sizes[2] * sizes[3] * sizes[4];
    spconv_tensor *d = NULL, *f = NULL, *idx = NULL;
    unsigned char *mask = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, dense, &d), done);
    mask = calloc((size_t)sites + 1, 1);
    if (mask == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: no memory for the mask of %lld sites", func, (long long)sites);
    int64_t n = mark_sites(spconv_tensor_data(d), dtype, sizes[0], sizes[1],
                           sizes[2] * sizes[3] * sizes[4], mask);
    int64_t f_sizes[2] = {n, sizes[1]}, i_sizes[2] = {n, 4};
    SPCONV_TRY_GOTO(st, spconv_tensor_empty(spconv_cpu(), dtype, 2, f_sizes, &f), done);
    SPCONV_TRY_GOTO(st, spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 2, i_sizes, &idx), done);
    gather_sites(spconv_tensor_data(d), dtype, sizes, mask, spconv_tensor_data(f),
                 spconv_tensor_data(idx));
    *features = f, f = NULL;
    *indices = idx, idx = NULL;
done:
    free(mask);
    spconv_tensor_release(idx);
    spconv_tensor_release(f);
    spconv_tensor_release(d);
    return st;
}

spconv_status spconv_dense_to_sparse(spconv_context *ctx, const spconv_tensor *dense,
                                     spconv_tensor **features, spconv_tensor **indices) {
    static const char func[] = "spconv_dense_to_sparse";
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_CHECK_NOT_NULL(func, indices);
    *features = NULL;
    *indices = NULL;
    SPCONV_CHECK_NOT_NULL(func, dense);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(dense) != 5, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: dense must be 5-d [B, C, D, H, W], got %d-d %s", func,
                           spconv_tensor_ndim(dense), spconv__shape_text(dense).text);
    const int64_t *sizes = spconv_tensor_sizes(dense);
    for (int i = 0; i < 5; ++i)
        SPCONV_RETURN_ERROR_IF(i != 1 && sizes[i] > INT32_MAX, SPCONV_ERR_OVERFLOW,
                               "%s: dense %s has a batch or spatial size beyond int32 indices",
                               func, spconv__shape_text(dense).text);
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, spconv_tensor_device(dense), dense_to_sparse, "dense_to_sparse",
                    &backend);
    return backend->dense_to_sparse(ctx, dense, features, indices);
}
