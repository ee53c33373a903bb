/* Rulebooks on the GPU, bit for bit the CPU's (src/rulebook/; orders in docs/design.md):
 *  1. validation and the site table: a key per row, the first row outside the batch or the shape
 *     (atomicMin), the rows before it inserted into a seeded table of packed 64-bit keys
 *     (hash_table.cu: atomicCAS on the key, atomicMin on the row, capacity checked), and, when a
 *     key repeated, the first row that does not own its key; the messages are the CPU's
 *     (rulebook/sites.h);
 *  2. the pairs as 64-bit sort keys (offset k << 32 | out_row) with the input row beside them:
 *     SUBM probes the table at the offsets below the centre and each hit also gives its mirror
 *     (k and KV-1-k are opposite displacements), the centre is the identity, or, for large
 *     kernels and few sites, sorts the sites by bin and tests those of neighbouring bins
 *     (rulebook/site_bins.h, the CPU's rule); REGULAR and
 *     TRANSPOSED list every (input, offset) that reaches an output as a candidate (output key,
 *     input row << 32 | k), sort the candidates by output key, and number the distinct keys:
 *     those are the output sites, in (b, z, y, x) order (rulebook/axis_reach.h gives each axis's
 *     offsets, so the work is the candidates');
 *  3. one sort of the pair keys groups the pairs by offset, in increasing out_row within each
 *     (keys are unique: an output meets an offset at most once), and a binary search per offset
 *     counts its pairs: the counts of every offset are what comes back to the host, or, for a
 *     kernel of more than DENSE_OFFSET_COUNTS offsets, the list of the offsets that occur.
 * Both sorts take 32-bit keys and values where they fit (narrow_candidates, narrow_code: output
 * keys of at most 32 bits, rows x KV and KV x output rows under 2^32, so every real layer), in
 * the same order as the 64-bit codings above. No array grows with the kernel beyond the counts,
 * so any kernel the geometry accepts is built, as on the CPU. Counts are int64 throughout.
 *
 * The host waits twice a build: for the number of pairs (or candidates) it must allocate, read
 * with the validation marks and the site table's insert counters (the insert reads the first bad
 * row on the device; the kernels queued before that read are safe on any rows), and at the end
 * for the offsets' counts, with a strided build's number of outputs (their sites are written for
 * as many rows as candidates, then copied to their exact size). A kernel over
 * DENSE_OFFSET_COUNTS waits once more, for its offset lists, and a subm build through bins
 * once more, for the validation before its work; only an error path waits more, to name the
 * row. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "maps_common.h"
#include "rulebook/axis_reach.h"
#include "rulebook/internal.h"
#include "rulebook/site_bins.h"
#include "rulebook/sites.h"
#include "spconv/tensor.h"

/* ---- validation and the site table ----------------------------------------------------------- */

__global__ void site_keys_kernel(const int32_t *rows, int64_t n, spconv__key_layout layout,
                                 int64_t batch_size, int64_t d, int64_t h, int64_t w,
                                 uint64_t *keys, unsigned long long *first_bad) {
    SPCONV_CUDA_GRID_LOOP(r, n) {
        const int32_t *row = rows + 4 * r;
        if (row[0] < 0 || row[0] >= batch_size || row[1] < 0 || row[1] >= d || row[2] < 0 ||
            row[2] >= h || row[3] < 0 || row[3] >= w) {
            keys[r] = SPCONV_HASH_EMPTY;
            atomicMin(first_bad, (unsigned long long)r);
        } else {
            keys[r] = spconv__key_pack(&layout, row[0], row[1], row[2], row[3]);
        }
    }
}

/* The table keeps a repeated key's smallest row, so a row that does not own its key repeats an
 * earlier one. */
__global__ void first_duplicate_kernel(spconv__hash_table table, const uint64_t *keys, int64_t n,
                                       unsigned long long *first) {
    SPCONV_CUDA_GRID_LOOP(r, n) {
        if (spconv__hash_find(&table, keys[r]) != (int32_t)r)
            atomicMin(first, (unsigned long long)r);
    }
}

__global__ void owner_kernel(spconv__hash_table table, const uint64_t *keys, int64_t r,
                             int32_t *owner) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *owner = spconv__hash_find(&table, keys[r]);
}

#define LAUNCH_MAP(stream, n, kernel, ...)                                                   \
    do {                                                                                      \
        int blocks_;                                                                          \
        SPCONV_FORWARD_IF_ERROR(spconv__cuda_map_blocks((n), &blocks_));                      \
        SPCONV_CUDA_LAUNCH(kernel, blocks_, SPCONV_CUDA_MAP_THREADS, 0, stream, __VA_ARGS__); \
        CUDA_TRY(cudaGetLastError());                                                         \
    } while (0)

/* Marks of the site table's build, read back with the build's first count: [0] the first row
 * outside the batch or the shape, [1] the first row that repeats an earlier one, [2] inserts that
 * found no free slot, [3] inserts of a key already there. */
enum { MARK_FIRST_BAD, MARK_FIRST_DUP, MARK_FULL, MARK_REPEATED, NUM_MARKS };

/* What every builder of this file shares. */
struct build_state {
    const char *func;
    spconv_context *ctx; /* outputs come from its allocator (context.h) */
    cudaStream_t stream;
    spconv_device device;
    const int32_t *rows; /* device, [N, 4], validated */
    int64_t num_in;
    spconv__key_layout in_layout;
    spconv__device_array<uint64_t> keys; /* [N] packed input keys */
    spconv__device_array<spconv__hash_slot> slots;
    spconv__hash_table table;
    spconv__device_array<unsigned long long> marks; /* [NUM_MARKS], below */
    uint64_t capacity;                               /* the site table's slots */
    const int64_t *shape;                            /* the input's spatial shape */
    int64_t batch_size;
};

static spconv_status read_u64(cudaStream_t stream, const unsigned long long *device_value,
                              unsigned long long *value) {
    CUDA_TRY(cudaMemcpyAsync(value, device_value, sizeof *value, cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    return SPCONV_OK;
}

static spconv_status read_row(cudaStream_t stream, const int32_t *rows, int64_t r,
                              int32_t row[4]) {
    CUDA_TRY(cudaMemcpyAsync(row, rows + 4 * r, 4 * sizeof *row, cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    return SPCONV_OK;
}

/* Queue the validation and the site table: keys, the first bad row (atomicMin), the table of the
 * rows before it (the insert reads that row on the device, so that a duplicate before it is named
 * first) and its counters, all in s->marks. Nothing is read here: the marks come back with the
 * build's first count (check_sites), and until then the kernels that follow are safe on any rows
 * (a bad row's key is empty, coordinates are bounds-checked, every probe ends). */
static spconv_status queue_site_table(build_state *s, const int64_t shape[3],
                                      int64_t batch_size) {
    const char *func = s->func;
    const int64_t n = s->num_in;
    s->shape = shape;
    s->batch_size = batch_size;
    SPCONV_FORWARD_IF_ERROR(
        spconv__key_layout_checked(func, "input", batch_size, shape, &s->in_layout));
    SPCONV_FORWARD_IF_ERROR(s->keys.alloc(s->ctx, func, n, "site keys"));
    SPCONV_FORWARD_IF_ERROR(s->marks.alloc(s->ctx, func, NUM_MARKS, "validation marks"));
    unsigned long long *marks = s->marks.get();
    CUDA_TRY(cudaMemsetAsync(marks, 0xff, 2 * sizeof(unsigned long long), s->stream));
    CUDA_TRY(cudaMemsetAsync(marks + MARK_FULL, 0, 2 * sizeof(unsigned long long), s->stream));
    if (n > 0)
        LAUNCH_MAP(s->stream, n, site_keys_kernel, s->rows, n, s->in_layout, batch_size, shape[0],
                   shape[1], shape[2], s->keys.get(), marks + MARK_FIRST_BAD);
    s->capacity = spconv__hash_capacity_for(n);
    SPCONV_RETURN_ERROR_IF(s->capacity == 0, SPCONV_ERR_OVERFLOW,
                           "%s: a hash table for %" PRId64 " sites is too large", func, n);
    SPCONV_FORWARD_IF_ERROR(spconv__cuda_hash_table_init(func, s->ctx, s->stream, s->capacity,
                                                         &s->slots, &s->table));
    return spconv__cuda_hash_insert_queued(s->stream, &s->table, s->keys.get(), n,
                                           marks + MARK_FIRST_BAD, marks + MARK_FULL);
}

/* The errors the marks (as read back, @p host) say, in the CPU's order of precedence: a full
 * table, a repeated row before the first bad one, a bad row. Naming a row reads it (error paths
 * only). */
static spconv_status check_sites(build_state *s, const unsigned long long *host) {
    const char *func = s->func;
    const int64_t n = s->num_in;
    const int64_t bad =
        host[MARK_FIRST_BAD] < (unsigned long long)n ? (int64_t)host[MARK_FIRST_BAD] : n;
    SPCONV_RETURN_ERROR_IF(host[MARK_FULL] > 0, SPCONV_ERR_CAPACITY,
                           "%s: hash table of %llu slots is full (%lld keys, %llu found no slot)",
                           func, (unsigned long long)s->capacity, (long long)bad,
                           host[MARK_FULL]);
    int32_t row[4];
    if (host[MARK_REPEATED] > 0) {
        LAUNCH_MAP(s->stream, bad, first_duplicate_kernel, s->table, s->keys.get(), bad,
                   s->marks.get() + MARK_FIRST_DUP);
        unsigned long long first_dup;
        SPCONV_FORWARD_IF_ERROR(
            read_u64(s->stream, s->marks.get() + MARK_FIRST_DUP, &first_dup));
        if (first_dup < (unsigned long long)bad) {
            spconv__device_array<int32_t> owner;
            SPCONV_FORWARD_IF_ERROR(owner.alloc(s->ctx, func, 1, "a row owner"));
            SPCONV_CUDA_LAUNCH(owner_kernel, 1, 1, 0, s->stream, s->table, s->keys.get(),
                               (int64_t)first_dup, owner.get());
            CUDA_TRY(cudaGetLastError());
            int32_t owner_row = -1;
            CUDA_TRY(cudaMemcpyAsync(&owner_row, owner.get(), sizeof owner_row,
                                     cudaMemcpyDeviceToHost, s->stream));
            SPCONV_FORWARD_IF_ERROR(read_row(s->stream, s->rows, (int64_t)first_dup, row));
            return spconv__report_duplicate(func, row, (int64_t)first_dup, owner_row);
        }
    }
    if (bad < n) {
        SPCONV_FORWARD_IF_ERROR(read_row(s->stream, s->rows, bad, row));
        return spconv__report_out_of_range(func, row, bad, s->shape, s->batch_size);
    }
    return SPCONV_OK;
}

/* ---- submanifold pairs ---------------------------------------------------------------------- */

typedef struct subm_geometry {
    int64_t kernel[3], dilation[3], shape[3];
    int64_t half; /* KV / 2: the centre, and the number of probed offsets */
    int64_t kernel_volume;
} subm_geometry;

/* The input row at offset k of output row @p row, or -1. */
static __device__ __forceinline__ int32_t subm_neighbour(const subm_geometry *g,
                                                         const spconv__hash_table *table,
                                                         const spconv__key_layout *layout,
                                                         const int32_t *row, int64_t k) {
    const int64_t kx = k % g->kernel[2], ky = (k / g->kernel[2]) % g->kernel[1],
                  kz = k / (g->kernel[2] * g->kernel[1]);
    const int64_t z = row[1] + (kz - g->kernel[0] / 2) * g->dilation[0];
    const int64_t y = row[2] + (ky - g->kernel[1] / 2) * g->dilation[1];
    const int64_t x = row[3] + (kx - g->kernel[2] / 2) * g->dilation[2];
    if (z < 0 || z >= g->shape[0] || y < 0 || y >= g->shape[1] || x < 0 || x >= g->shape[2])
        return -1;
    return spconv__hash_find(table, spconv__key_pack(layout, row[0], z, y, x));
}

__global__ void subm_count_kernel(subm_geometry g, spconv__hash_table table,
                                  spconv__key_layout layout, const int32_t *rows, int64_t n,
                                  int64_t *hits) {
    SPCONV_CUDA_GRID_LOOP(o, n) {
        int64_t count = 0;
        for (int64_t k = 0; k < g.half; ++k)
            count += subm_neighbour(&g, &table, &layout, rows + 4 * o, k) >= 0;
        hits[o] = count;
    }
}

/* Hit (input i reaches output o through k) is pair key k << 32 | o, and its mirror, input o
 * reaching output i through KV-1-k, goes after every lower hit; the centre pairs come last. */
__global__ void subm_write_kernel(subm_geometry g, spconv__hash_table table,
                                  spconv__key_layout layout, const int32_t *rows, int64_t n,
                                  const int64_t *starts, int64_t total_hits, uint64_t *pair_keys,
                                  int32_t *pair_in) {
    SPCONV_CUDA_GRID_LOOP(o, n) {
        int64_t at = starts[o];
        for (int64_t k = 0; k < g.half; ++k) {
            const int32_t i = subm_neighbour(&g, &table, &layout, rows + 4 * o, k);
            if (i < 0) continue;
            pair_keys[at] = (uint64_t)k << 32 | (uint64_t)o;
            pair_in[at] = i;
            pair_keys[total_hits + at] = (uint64_t)(g.kernel_volume - 1 - k) << 32 | (uint64_t)i;
            pair_in[total_hits + at] = (int32_t)o;
            ++at;
        }
        pair_keys[2 * total_hits + o] = (uint64_t)g.half << 32 | (uint64_t)o;
        pair_in[2 * total_hits + o] = (int32_t)o;
    }
}

/* Large kernels, and few sites (the CPU's rule, spconv__subm_by_bins): the sites sorted by bin
 * (rulebook/site_bins.h), each testing the sites of the bins its reach meets, work bounded by the
 * pairs rather than N x KV/2 probes; every hit is written directly (the mirror and the centre are
 * hits of their own). The rows are valid by then (build_subm waits for the validation first). */
__global__ void bin_keys_kernel(spconv__bin_geometry g, const int32_t *rows, int64_t n,
                                uint64_t *keys, int32_t *order) {
    SPCONV_CUDA_GRID_LOOP(r, n) {
        keys[r] = spconv__bin_key(&g, rows + 4 * r);
        order[r] = (int32_t)r;
    }
}

__global__ void bin_pairs_count_kernel(spconv__bin_geometry g, const uint64_t *keys,
                                       const int32_t *order, const int32_t *rows, int64_t n,
                                       int64_t *hits) {
    SPCONV_CUDA_GRID_LOOP(o, n) {
        spconv__bin_walk walk;
        spconv__bin_walk_start(&g, rows + 4 * o, &walk);
        int64_t count = 0, k;
        int32_t i;
        while (spconv__bin_walk_next(&g, keys, order, rows, n, &walk, &k, &i)) ++count;
        hits[o] = count;
    }
}

__global__ void bin_pairs_write_kernel(spconv__bin_geometry g, const uint64_t *keys,
                                       const int32_t *order, const int32_t *rows, int64_t n,
                                       const int64_t *starts, uint64_t *pair_keys,
                                       int32_t *pair_in) {
    SPCONV_CUDA_GRID_LOOP(o, n) {
        spconv__bin_walk walk;
        spconv__bin_walk_start(&g, rows + 4 * o, &walk);
        int64_t at = starts[o], k;
        int32_t i;
        while (spconv__bin_walk_next(&g, keys, order, rows, n, &walk, &k, &i)) {
            pair_keys[at] = (uint64_t)k << 32 | (uint64_t)o;
            pair_in[at] = i;
            ++at;
        }
    }
}

/* ---- regular and transposed candidates ------------------------------------------------------ */

typedef struct strided_geometry {
    spconv__axis_geometry axes[3];
    spconv__key_layout out_layout;
} strided_geometry;

/* The offsets of each axis through which a row reaches outputs: rulebook/axis_reach.h, which the
 * CPU builder walks too, so the work is the candidates' and not the kernel's. */
static __device__ __forceinline__ int64_t axis_count(const spconv__axis_geometry *a, int64_t c) {
    int64_t first, last, step;
    return spconv__axis_reach(a, c, &first, &last, &step) ? (last - first) / step + 1 : 0;
}

__global__ void candidate_count_kernel(strided_geometry g, const int32_t *rows, int64_t n,
                                       int64_t *counts) {
    SPCONV_CUDA_GRID_LOOP(r, n) {
        const int32_t *row = rows + 4 * r;
        counts[r] = axis_count(&g.axes[0], row[1]) * axis_count(&g.axes[1], row[2]) *
                    axis_count(&g.axes[2], row[3]);
    }
}

/* How a candidate codes its output key (packed (b, z, y, x): spconv__key_pack) and its input row
 * r and offset k for the candidates' sort. Wide: the 64-bit key and r << 32 | k. Where the output
 * key takes at most 32 bits (a KITTI grid's 41 x 1600 x 1408 takes 28, plus the batch) and the
 * input rows times the offsets fit 32 bits, narrow: the key in 32 bits and r * KV + k, the same
 * order in a quarter of the sort's traffic (half the radix passes over half the bytes). */
struct wide_candidates {
    typedef uint64_t key_type;
    typedef uint64_t value_type;
    __device__ uint64_t value(int64_t r, int64_t k) const {
        return (uint64_t)r << 32 | (uint64_t)k;
    }
    __device__ int32_t row(uint64_t v) const { return (int32_t)(v >> 32); }
    __device__ uint64_t offset(uint64_t v) const { return v & UINT32_MAX; }
};

struct narrow_candidates {
    typedef uint32_t key_type;
    typedef uint32_t value_type;
    uint32_t kernel_volume;
    __device__ uint32_t value(int64_t r, int64_t k) const {
        return (uint32_t)(r * kernel_volume + k);
    }
    __device__ int32_t row(uint32_t v) const { return (int32_t)(v / kernel_volume); }
    __device__ uint64_t offset(uint32_t v) const { return v % kernel_volume; }
};

template <typename Code>
__global__ void candidate_write_kernel(strided_geometry g, Code code, const int32_t *rows,
                                       int64_t n, const int64_t *starts,
                                       typename Code::key_type *out_keys,
                                       typename Code::value_type *values) {
    SPCONV_CUDA_GRID_LOOP(r, n) {
        const int32_t *row = rows + 4 * r;
        int64_t first[3], last[3], step[3];
        bool reaches = true;
        for (int a = 0; a < 3; ++a)
            reaches = reaches && spconv__axis_reach(&g.axes[a], row[1 + a], &first[a], &last[a],
                                                    &step[a]);
        if (!reaches) continue;
        int64_t at = starts[r];
        const int64_t kh = g.axes[1].kernel, kw = g.axes[2].kernel;
        for (int64_t kz = first[0]; kz <= last[0]; kz += step[0]) {
            const int64_t oz = spconv__axis_output(&g.axes[0], row[1], kz);
            for (int64_t ky = first[1]; ky <= last[1]; ky += step[1]) {
                const int64_t oy = spconv__axis_output(&g.axes[1], row[2], ky);
                for (int64_t kx = first[2]; kx <= last[2]; kx += step[2]) {
                    const int64_t ox = spconv__axis_output(&g.axes[2], row[3], kx);
                    out_keys[at] = (typename Code::key_type)spconv__key_pack(
                        &g.out_layout, row[0], oz, oy, ox);
                    values[at] = code.value(r, (kz * kh + ky) * kw + kx);
                    ++at;
                }
            }
        }
    }
}

template <typename Key>
__global__ void output_heads_kernel(const Key *sorted_keys, int64_t n, int64_t *heads) {
    SPCONV_CUDA_GRID_LOOP(j, n) heads[j] = j == 0 || sorted_keys[j] != sorted_keys[j - 1];
}

/* heads now holds the inclusive sums: candidate j belongs to output row heads[j] - 1. */
template <typename Code>
__global__ void outputs_kernel(spconv__key_layout layout, Code code,
                               const typename Code::key_type *sorted_keys,
                               const typename Code::value_type *values, const int64_t *heads,
                               int64_t n, int32_t *out_rows, uint64_t *pair_keys,
                               int32_t *pair_in) {
    SPCONV_CUDA_GRID_LOOP(j, n) {
        const int64_t out_row = heads[j] - 1;
        if (j == 0 || sorted_keys[j] != sorted_keys[j - 1])
            spconv__key_unpack(&layout, sorted_keys[j], out_rows + 4 * out_row);
        pair_keys[j] = code.offset(values[j]) << 32 | (uint64_t)out_row;
        pair_in[j] = code.row(values[j]);
    }
}

/* ---- pairs by offset -------------------------------------------------------------------------- */

/* How a pair key codes (offset k, out_row o). The builders write k << 32 | o (wide_code). Where
 * the kernel's offsets times the output rows fit 32 bits (every real layer: 27 offsets x 10^7
 * rows is under 2^29), the keys are narrowed to k * rows + o (narrow_code) before the sort: both
 * increase with (k, o), so the pairs come out alike, and a radix sort of 32-bit keys makes half
 * the passes over fewer bytes. */
struct wide_code {
    typedef uint64_t key_type;
    __device__ uint64_t offset(uint64_t key) const { return key >> 32; }
    __device__ int32_t row(uint64_t key) const { return (int32_t)(key & UINT32_MAX); }
    __device__ uint64_t first_key(int64_t k) const { return (uint64_t)k << 32; }
};

struct narrow_code {
    typedef uint32_t key_type;
    uint32_t rows; /* every out_row is below it */
    __device__ uint64_t offset(uint32_t key) const { return key / rows; }
    __device__ int32_t row(uint32_t key) const { return (int32_t)(key % rows); }
    __device__ uint64_t first_key(int64_t k) const { return (uint64_t)k * rows; }
};

__global__ void narrow_keys_kernel(const uint64_t *wide, int64_t n, uint32_t rows,
                                   uint32_t *narrow) {
    SPCONV_CUDA_GRID_LOOP(j, n) {
        narrow[j] = (uint32_t)((wide[j] >> 32) * rows + (wide[j] & UINT32_MAX));
    }
}

template <typename Code>
__global__ void pairs_out_kernel(Code code, const typename Code::key_type *keys, int64_t n,
                                 int32_t *pairs_out) {
    SPCONV_CUDA_GRID_LOOP(j, n) pairs_out[j] = code.row(keys[j]);
}

/* The first j in [0, n) with keys[j] >= value (n when none): keys increase. */
template <typename Key>
static __device__ __forceinline__ int64_t first_at_least(const Key *keys, int64_t n,
                                                         uint64_t value) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The per-offset counts of a rulebook come back in one of two forms. A kernel of up to
 * DENSE_OFFSET_COUNTS offsets (40^3 and below, every real layer) gets the count of each of its
 * offsets, read back with the build's last wait. A larger kernel would make those arrays, on the
 * device and the host, grow with the kernel rather than with the pairs (a 1023^3 pool over a few
 * sites is 2^30 offsets), so there the offsets that occur are listed instead, as the CPU builders
 * do: at most min(KV, pairs) of them, read back in one more wait. */
#define DENSE_OFFSET_COUNTS ((int64_t)1 << 16)

/* counts[k] = the pairs of offset k among the n sorted pair keys, for every k < kv: the distance
 * between the first keys of k and of k + 1. */
template <typename Code>
__global__ void offset_counts_kernel(Code code, const typename Code::key_type *keys, int64_t n,
                                     int64_t kv, int64_t *counts) {
    SPCONV_CUDA_GRID_LOOP(k, kv) {
        counts[k] = first_at_least(keys, n, code.first_key(k + 1)) -
                    first_at_least(keys, n, code.first_key(k));
    }
}

template <typename Code>
static __device__ __forceinline__ bool offset_head(Code code, const typename Code::key_type *keys,
                                                   int64_t j) {
    return j == 0 || code.offset(keys[j]) != code.offset(keys[j - 1]);
}

/* heads[j] = 1 where sorted pair j is the first of its offset, 0 elsewhere. */
template <typename Code>
__global__ void offset_heads_kernel(Code code, const typename Code::key_type *keys, int64_t n,
                                    int64_t *heads) {
    SPCONV_CUDA_GRID_LOOP(j, n) heads[j] = offset_head(code, keys, j);
}

/* heads now holds the inclusive sums: the first pair j of each offset fills slot heads[j] - 1 with
 * the offset and j, where its pairs start; the slots come out in increasing offset. */
template <typename Code>
__global__ void offset_slots_kernel(Code code, const typename Code::key_type *keys,
                                    const int64_t *heads, int64_t n, int64_t *slot_offsets,
                                    int64_t *slot_starts) {
    SPCONV_CUDA_GRID_LOOP(j, n) {
        if (!offset_head(code, keys, j)) continue;
        slot_offsets[heads[j] - 1] = (int64_t)code.offset(keys[j]);
        slot_starts[heads[j] - 1] = j;
    }
}

/* The rulebook's non-empty offsets (increasing) and their pair counts, from the count of every
 * offset (host [kernel_volume]), into the rulebook's active-offset lists: the one place that
 * knows their layout. */
static spconv_status set_offset_counts(const char *func, spconv_rulebook *rb,
                                       const int64_t *counts) {
    const int64_t kv = rb->kernel_volume;
    int64_t *starts = (int64_t *)malloc((size_t)(kv + 1) * sizeof *starts);
    SPCONV_RETURN_ERROR_IF(starts == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for %" PRId64 " offset counts", func, kv);
    starts[0] = 0;
    for (int64_t k = 0; k < kv; ++k) starts[k + 1] = starts[k] + counts[k];
    const spconv_status st = spconv__rulebook_set_offsets(func, rb, kv, NULL, starts);
    free(starts);
    return st;
}

/* The count of every offset of a kernel of up to DENSE_OFFSET_COUNTS offsets, read back with
 * @p extra (another read the caller needs, or NULL): the build's last wait. */
template <typename Code>
static spconv_status read_dense_counts(const build_state *s, Code code,
                                       const typename Code::key_type *keys, int64_t n,
                                       spconv_rulebook *rb, const spconv__host_read *extra) {
    const char *func = s->func;
    const int64_t kv = rb->kernel_volume;
    spconv__device_array<int64_t> counts;
    SPCONV_FORWARD_IF_ERROR(counts.alloc(s->ctx, func, kv, "pair counts"));
    if (kv > 0)
        LAUNCH_MAP(s->stream, kv, offset_counts_kernel<Code>, code, keys, n, kv, counts.get());
    int64_t *host = (int64_t *)malloc((size_t)(kv > 0 ? kv : 1) * sizeof *host);
    SPCONV_RETURN_ERROR_IF(host == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for %" PRId64 " offset counts", func, kv);
    spconv__host_read reads[2] = {{host, counts.get(), (size_t)kv * sizeof *host},
                                  {NULL, NULL, 0}};
    if (extra != NULL) reads[1] = *extra;
    const cudaError_t err = spconv__cuda_read_back(s->stream, reads, 2);
    spconv_status st = SPCONV_OK;
    if (err == cudaSuccess) st = set_offset_counts(func, rb, host);
    free(host);
    CUDA_TRY(err);
    return st;
}

/* The offsets that occur among the n sorted pair keys of a larger kernel, with where their pairs
 * start: their number comes back with @p extra, then the lists. */
template <typename Code>
static spconv_status read_active_offsets(const build_state *s, Code code,
                                         const typename Code::key_type *keys, int64_t n,
                                         spconv_rulebook *rb, const spconv__host_read *extra) {
    const char *func = s->func;
    const int64_t kv = rb->kernel_volume, most = n < kv ? n : kv;
    spconv__device_array<int64_t> heads, slot_offsets, slot_starts;
    SPCONV_FORWARD_IF_ERROR(heads.alloc(s->ctx, func, n, "offset heads"));
    SPCONV_FORWARD_IF_ERROR(slot_offsets.alloc(s->ctx, func, most, "active offsets"));
    SPCONV_FORWARD_IF_ERROR(slot_starts.alloc(s->ctx, func, most, "active offset starts"));
    if (n > 0) {
        LAUNCH_MAP(s->stream, n, offset_heads_kernel<Code>, code, keys, n, heads.get());
        SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(s->ctx, func, s->stream, "numbering the offsets",
                                              thrust::inclusive_scan, heads.get(),
                                              heads.get() + n, heads.get()));
        LAUNCH_MAP(s->stream, n, offset_slots_kernel<Code>, code, keys, heads.get(), n,
                   slot_offsets.get(), slot_starts.get());
    }
    int64_t active = 0;
    const int64_t last = n > 0 ? n - 1 : 0;
    spconv__host_read reads[2] = {{&active, heads.get() + last, n > 0 ? sizeof active : 0},
                                  {NULL, NULL, 0}};
    if (extra != NULL) reads[1] = *extra;
    CUDA_TRY(spconv__cuda_read_back(s->stream, reads, 2));
    int64_t *offsets = (int64_t *)malloc((size_t)(active > 0 ? active : 1) * sizeof *offsets);
    int64_t *starts = (int64_t *)malloc((size_t)(active + 1) * sizeof *starts);
    if (offsets == NULL || starts == NULL) {
        free(offsets);
        free(starts);
        return spconv__error(SPCONV_ERR_OUT_OF_MEMORY,
                             "%s: out of host memory for %" PRId64 " pair offsets", func, active);
    }
    const spconv__host_read lists[2] = {
        {offsets, slot_offsets.get(), (size_t)active * sizeof *offsets},
        {starts, slot_starts.get(), (size_t)active * sizeof *starts}};
    const cudaError_t err = spconv__cuda_read_back(s->stream, lists, 2);
    spconv_status st = SPCONV_OK;
    if (err == cudaSuccess) {
        starts[active] = n;
        st = spconv__rulebook_set_offsets(func, rb, active, offsets, starts);
    }
    free(offsets);
    free(starts);
    CUDA_TRY(err);
    return st;
}

/* Sort the n pair keys (coded by @p code) with their input rows, which are the data of
 * rb->pairs_in already; write rb->pairs_out and find the pairs of each offset, then read them
 * back with @p extra (another read the caller needs, or NULL). */
template <typename Code>
static spconv_status sort_pairs(const build_state *s, Code code, typename Code::key_type *keys,
                                int64_t n, spconv_rulebook *rb, const spconv__host_read *extra) {
    const char *func = s->func;
    int32_t *pair_in = (int32_t *)spconv_tensor_data(rb->pairs_in);
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, s->ctx, s->device, SPCONV_I32, 1, &n, &rb->pairs_out));
    if (n > 0) {
        SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(s->ctx, func, s->stream, "sorting the pairs",
                                              thrust::sort_by_key, keys, keys + n, pair_in));
        LAUNCH_MAP(s->stream, n, pairs_out_kernel<Code>, code, keys, n,
                   (int32_t *)spconv_tensor_data(rb->pairs_out));
    }
    return rb->kernel_volume <= DENSE_OFFSET_COUNTS
               ? read_dense_counts(s, code, keys, n, rb, extra)
               : read_active_offsets(s, code, keys, n, rb, extra);
}

/* The pairs' last steps from the @p n keys k << 32 | out_row in @p pair_keys, every out_row below
 * @p out_rows: narrowed to 32 bits where they fit (narrow_code), sorted, and their offsets found. */
static spconv_status finish_pairs(const build_state *s, spconv__device_array<uint64_t> *pair_keys,
                                  int64_t n, int64_t out_rows, spconv_rulebook *rb,
                                  const spconv__host_read *extra) {
    const int64_t kv = rb->kernel_volume;
    if (out_rows < 1 || kv > ((int64_t)1 << 32) / out_rows)
        return sort_pairs(s, wide_code(), pair_keys->get(), n, rb, extra);
    const narrow_code code = {(uint32_t)out_rows};
    spconv__device_array<uint32_t> narrow;
    SPCONV_FORWARD_IF_ERROR(narrow.alloc(s->ctx, s->func, n, "narrow pair keys"));
    if (n > 0)
        LAUNCH_MAP(s->stream, n, narrow_keys_kernel, pair_keys->get(), n, code.rows,
                   narrow.get());
    pair_keys->release(); /* stream-ordered: after the narrowing */
    return sort_pairs(s, code, narrow.get(), n, rb, extra);
}

/* ---- the builders --------------------------------------------------------------------------- */

/* starts = the exclusive sums of counts [n] and *total their sum, read back with the site
 * table's marks, which are then checked (check_sites): the build's first wait. */
static spconv_status exclusive_sums(build_state *s, const int64_t *counts, int64_t n,
                                    int64_t *starts, int64_t *total) {
    *total = 0;
    if (n == 0) return SPCONV_OK; /* no rows: nothing to validate */
    SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(s->ctx, s->func, s->stream, "summing the counts",
                                          thrust::exclusive_scan, counts, counts + n, starts,
                                          (int64_t)0));
    int64_t last_start = 0, last_count = 0;
    unsigned long long marks[NUM_MARKS];
    const spconv__host_read reads[3] = {{&last_start, starts + n - 1, sizeof last_start},
                                        {&last_count, counts + n - 1, sizeof last_count},
                                        {marks, s->marks.get(), sizeof marks}};
    CUDA_TRY(spconv__cuda_read_back(s->stream, reads, 3));
    SPCONV_FORWARD_IF_ERROR(check_sites(s, marks));
    *total = last_start + last_count;
    return SPCONV_OK;
}

/* The site table's marks read back and checked (check_sites) on their own: a wait that only the
 * builds through bins take, since their work must see valid, unique rows (a repeated row would
 * share its bin with its copies, and the tests would grow as the square of the copies). */
static spconv_status wait_for_sites(build_state *s) {
    if (s->num_in == 0) return SPCONV_OK;
    unsigned long long marks[NUM_MARKS];
    const spconv__host_read read = {marks, s->marks.get(), sizeof marks};
    CUDA_TRY(spconv__cuda_read_back(s->stream, &read, 1));
    return check_sites(s, marks);
}

static spconv_status build_subm(build_state *s, spconv_rulebook *rb) {
    const char *func = s->func;
    const int64_t n = s->num_in;
    rb->out_indices = rb->in_indices;
    spconv_tensor_retain(rb->out_indices);
    rb->num_out = n;
    rb->center_is_identity = 1;
    subm_geometry g;
    spconv__bin_geometry bins;
    for (int a = 0; a < 3; ++a) {
        g.kernel[a] = bins.kernel[a] = rb->params.kernel[a];
        g.dilation[a] = bins.dilation[a] = rb->params.dilation[a];
        g.shape[a] = bins.shape[a] = rb->in_shape[a];
    }
    bins.layout = s->in_layout;
    g.kernel_volume = rb->kernel_volume;
    g.half = rb->kernel_volume / 2;
    /* Large kernels and few sites go through bins, as on the CPU (build_subm.c); the others probe
     * half the kernel's offsets and get the mirrors and the centre from symmetry. */
    const bool by_bins = spconv__subm_by_bins(n, rb->kernel_volume) != 0;
    spconv__device_array<int64_t> hits, starts;
    spconv__device_array<uint64_t> bin_keys;
    spconv__device_array<int32_t> bin_order;
    SPCONV_FORWARD_IF_ERROR(hits.alloc(s->ctx, func, n, "neighbour counts"));
    SPCONV_FORWARD_IF_ERROR(starts.alloc(s->ctx, func, n, "neighbour starts"));
    if (by_bins) {
        SPCONV_FORWARD_IF_ERROR(wait_for_sites(s));
        SPCONV_FORWARD_IF_ERROR(bin_keys.alloc(s->ctx, func, n, "bin keys"));
        SPCONV_FORWARD_IF_ERROR(bin_order.alloc(s->ctx, func, n, "sites by bin"));
        if (n > 0) {
            LAUNCH_MAP(s->stream, n, bin_keys_kernel, bins, s->rows, n, bin_keys.get(),
                       bin_order.get());
            SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(s->ctx, func, s->stream,
                                                  "sorting the sites by bin",
                                                  thrust::sort_by_key, bin_keys.get(),
                                                  bin_keys.get() + n, bin_order.get()));
            LAUNCH_MAP(s->stream, n, bin_pairs_count_kernel, bins, bin_keys.get(),
                       bin_order.get(), s->rows, n, hits.get());
        }
    } else if (n > 0) {
        LAUNCH_MAP(s->stream, n, subm_count_kernel, g, s->table, s->in_layout, s->rows, n,
                   hits.get());
    }
    int64_t total_hits;
    SPCONV_FORWARD_IF_ERROR(exclusive_sums(s, hits.get(), n, starts.get(), &total_hits));
    const int64_t num_pairs = by_bins ? total_hits : 2 * total_hits + n;
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, s->ctx, s->device, SPCONV_I32, 1, &num_pairs, &rb->pairs_in));
    spconv__device_array<uint64_t> pair_keys;
    SPCONV_FORWARD_IF_ERROR(pair_keys.alloc(s->ctx, func, num_pairs, "pair keys"));
    int32_t *pair_in = (int32_t *)spconv_tensor_data(rb->pairs_in);
    if (n > 0 && by_bins)
        LAUNCH_MAP(s->stream, n, bin_pairs_write_kernel, bins, bin_keys.get(), bin_order.get(),
                   s->rows, n, starts.get(), pair_keys.get(), pair_in);
    else if (n > 0)
        LAUNCH_MAP(s->stream, n, subm_write_kernel, g, s->table, s->in_layout, s->rows, n,
                   starts.get(), total_hits, pair_keys.get(), pair_in);
    return finish_pairs(s, &pair_keys, num_pairs, n, rb, NULL);
}

/* A strided build from its @p total candidates, whose places are @p starts (released once the
 * candidates are written), coded by @p code. */
template <typename Code>
static spconv_status strided_outputs(build_state *s, spconv_rulebook *rb,
                                     const strided_geometry &g, Code code,
                                     spconv__device_array<int64_t> *starts, int64_t total) {
    const char *func = s->func;
    const int64_t n = s->num_in;
    spconv__device_array<typename Code::key_type> out_keys;
    spconv__device_array<typename Code::value_type> values;
    SPCONV_FORWARD_IF_ERROR(out_keys.alloc(s->ctx, func, total, "candidate keys"));
    SPCONV_FORWARD_IF_ERROR(values.alloc(s->ctx, func, total, "candidates"));
    if (n > 0)
        LAUNCH_MAP(s->stream, n, candidate_write_kernel<Code>, g, code, s->rows, n,
                   starts->get(), out_keys.get(), values.get());
    starts->release();
    SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(s->ctx, func, s->stream, "sorting the candidates",
                                          thrust::sort_by_key, out_keys.get(),
                                          out_keys.get() + total, values.get()));
    spconv__device_array<int64_t> heads;
    SPCONV_FORWARD_IF_ERROR(heads.alloc(s->ctx, func, total, "output numbers"));
    if (total > 0) {
        LAUNCH_MAP(s->stream, total, output_heads_kernel<typename Code::key_type>, out_keys.get(),
                   total, heads.get());
        SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(s->ctx, func, s->stream,
                                              "numbering the output sites", thrust::inclusive_scan,
                                              heads.get(), heads.get() + total, heads.get()));
    }
    /* The outputs number at most the candidates: with fewer than 2^31 candidates every output
     * row fits int32, and the sites are written for that many rows and copied to their exact
     * size once the count comes back with the offsets' (one wait for both). More candidates
     * read the count first, to refuse more than int32 rows before writing any. */
    const bool bounded = total <= INT32_MAX;
    int64_t num_out = 0;
    if (!bounded) {
        CUDA_TRY(cudaMemcpyAsync(&num_out, heads.get() + total - 1, sizeof num_out,
                                 cudaMemcpyDeviceToHost, s->stream));
        CUDA_TRY(cudaStreamSynchronize(s->stream));
        SPCONV_RETURN_ERROR_IF(num_out > INT32_MAX, SPCONV_ERR_OVERFLOW,
                               "%s: %" PRId64 " output sites exceed int32 row numbers", func,
                               num_out);
    }
    const int64_t site_rows = bounded ? total : num_out;
    spconv__device_array<int32_t> sites;
    SPCONV_FORWARD_IF_ERROR(sites.alloc(s->ctx, func, 4 * site_rows, "output sites"));
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, s->ctx, s->device, SPCONV_I32, 1, &total, &rb->pairs_in));
    spconv__device_array<uint64_t> pair_keys;
    SPCONV_FORWARD_IF_ERROR(pair_keys.alloc(s->ctx, func, total, "pair keys"));
    if (total > 0)
        LAUNCH_MAP(s->stream, total, outputs_kernel<Code>, g.out_layout, code, out_keys.get(),
                   values.get(), heads.get(), total, sites.get(), pair_keys.get(),
                   (int32_t *)spconv_tensor_data(rb->pairs_in));
    out_keys.release();
    values.release();
    const spconv__host_read count_read = {&num_out, heads.get() + total - 1, sizeof num_out};
    SPCONV_FORWARD_IF_ERROR(finish_pairs(s, &pair_keys, total, site_rows, rb,
                                         bounded && total > 0 ? &count_read : NULL));
    rb->num_out = num_out;
    const int64_t out_sizes[2] = {num_out, 4};
    SPCONV_FORWARD_IF_ERROR(spconv__tensor_empty_in(func, s->ctx, s->device, SPCONV_I32, 2,
                                                    out_sizes, &rb->out_indices));
    if (num_out > 0)
        CUDA_TRY(cudaMemcpyAsync(spconv_tensor_data(rb->out_indices), sites.get(),
                                 (size_t)num_out * 4 * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                 s->stream));
    return SPCONV_OK;
}

static spconv_status build_strided(build_state *s, spconv_rulebook *rb) {
    const char *func = s->func;
    const int64_t n = s->num_in;
    strided_geometry g;
    for (int a = 0; a < 3; ++a)
        g.axes[a] = spconv__axis_geometry{rb->params.kernel[a],  rb->params.stride[a],
                                          rb->params.padding[a], rb->params.dilation[a],
                                          rb->out_shape[a],
                                          rb->params.kind == SPCONV_CONV_TRANSPOSED};
    SPCONV_FORWARD_IF_ERROR(spconv__key_layout_checked(func, "output", rb->batch_size,
                                                       rb->out_shape, &g.out_layout));
    spconv__device_array<int64_t> counts, starts;
    SPCONV_FORWARD_IF_ERROR(counts.alloc(s->ctx, func, n, "candidate counts"));
    SPCONV_FORWARD_IF_ERROR(starts.alloc(s->ctx, func, n, "candidate starts"));
    if (n > 0) LAUNCH_MAP(s->stream, n, candidate_count_kernel, g, s->rows, n, counts.get());
    int64_t total;
    SPCONV_FORWARD_IF_ERROR(exclusive_sums(s, counts.get(), n, starts.get(), &total));
    counts.release();
    const int64_t kv = rb->kernel_volume;
    if (g.out_layout.total_bits <= 32 && (n == 0 || kv <= ((int64_t)1 << 32) / n))
        return strided_outputs(s, rb, g, narrow_candidates{(uint32_t)kv}, &starts, total);
    return strided_outputs(s, rb, g, wide_candidates(), &starts, total);
}

spconv_status spconv__cuda_rulebook_build(spconv_context *ctx, const spconv_tensor *indices,
                                          const int64_t spatial_shape[3], int64_t batch_size,
                                          const spconv_conv_params *params,
                                          spconv_rulebook **out) {
    const char *func = "spconv_rulebook_build";
    int64_t out_shape[3];
    SPCONV_FORWARD_IF_ERROR(spconv__conv_geometry(func, params, spatial_shape, out_shape));
    const spconv_device device = spconv_tensor_device(indices);
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device.index));
    spconv_tensor *rows;
    SPCONV_FORWARD_IF_ERROR(
        spconv__indices_contiguous(ctx, func, indices, SPCONV_DEVICE_CUDA, &rows));
    spconv_rulebook *rb;
    spconv_status st =
        spconv__rulebook_alloc(func, params, spatial_shape, out_shape, batch_size, &rb);
    if (st != SPCONV_OK) {
        spconv_tensor_release(rows);
        return st;
    }
    rb->in_indices = rows; /* the rulebook owns the reference now */
    rb->num_in = spconv_tensor_size(rows, 0);
    build_state s;
    s.func = func;
    s.ctx = ctx;
    s.stream = spconv__cuda_stream_for(ctx, device.index);
    s.device = device;
    s.rows = (const int32_t *)spconv_tensor_data(rows);
    s.num_in = rb->num_in;
    st = queue_site_table(&s, spatial_shape, batch_size);
    if (st == SPCONV_OK)
        st = params->kind == SPCONV_CONV_SUBM ? build_subm(&s, rb) : build_strided(&s, rb);
    if (st != SPCONV_OK) {
        spconv_rulebook_release(rb);
        return st;
    }
    rb->rows_order[SPCONV__SIDE_OUT] = SPCONV__ORDER_SORTED; /* the CPU build's order */
    *out = rb;
    return SPCONV_OK;
}
