/* Fused gather-GEMM-scatter kernels (see fused.h). */
#include "conv/fused.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPCONV__FUSED_X86 1
#include <immintrin.h>
/* Only these functions are compiled for AVX2 + FMA; the library stays baseline x86-64, and
 * spconv__fused_available() checks the machine before any of them runs. */
#define FUSED_TARGET __attribute__((target("avx2,fma")))
#else
#define SPCONV__FUSED_X86 0
#endif

/* The weight gather prefetches the rows of the pair this many ahead, x rows and g rows (8 was
 * too short a lead for the product's reads of the x rows once the copies got fast). */
#define GATHER_AHEAD 48
/* Rows of the register block; its columns are one tile (two vectors). */
#define FUSED_ROWS 6

/* A tile row: 16 floats or 8 doubles (the kernels take f32 and f64 only). */
#define TILE_BYTES 64
static int64_t tile_width(spconv_dtype dtype) { return dtype == SPCONV_F32 ? 16 : 8; }

int spconv__fused_available(void) {
#if SPCONV__FUSED_X86
    static int available = -1;
    if (available < 0) {
        __builtin_cpu_init();
        available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return available;
#else
    return 0;
#endif
}

size_t spconv__fused_packed_bytes(spconv_dtype dtype, int64_t k, int64_t n) {
    const int64_t tw = tile_width(dtype), tiles = (n + tw - 1) / tw;
    return (size_t)(tiles * tw * k) * spconv_dtype_size(dtype);
}

/* Row-major B: each tile row is a run of B's row p, copied whole. B^T (trans, b stored [n, k]):
 * each of the tile's columns is a run of b's row, read in order and written down the tile
 * (tw elements apart, within the tile's k * tw elements, which stay in L1); reading across the
 * rows instead, one element of each per step, is ~5 times slower for spconv's KRSC weights,
 * whose rows lie KV * C_in elements apart. */
#define PACK_BODY(T)                                                                               \
    {                                                                                              \
        const T *src = b;                                                                          \
        T *dst = packed;                                                                           \
        for (int64_t t = 0; t < tiles; ++t, dst += k * tw) {                                       \
            const int64_t w = n - t * tw < tw ? n - t * tw : tw;                                   \
            if (trans) {                                                                           \
                for (int64_t j = 0; j < w; ++j) {                                                  \
                    const T *col = src + (t * tw + j) * ldb;                                       \
                    for (int64_t p = 0; p < k; ++p) dst[p * tw + j] = col[p];                      \
                }                                                                                  \
            } else if (w == tw) { /* a constant size: vector moves, not a library call a row */    \
                for (int64_t p = 0; p < k; ++p)                                                    \
                    memcpy(dst + p * tw, src + p * ldb + t * tw, TILE_BYTES);                      \
            } else {                                                                               \
                for (int64_t p = 0; p < k; ++p)                                                    \
                    memcpy(dst + p * tw, src + p * ldb + t * tw, (size_t)w * sizeof(T));           \
            }                                                                                      \
            for (int64_t p = 0; p < k; ++p)                                                        \
                for (int64_t j = w; j < tw; ++j) dst[p * tw + j] = (T)0;                           \
        }                                                                                          \
    }

#if SPCONV__FUSED_X86
/* PACK_BODY(float) for B^T by 8 x 8 blocks: 8 runs of b (8 columns of B), 8 elements of each,
 * transposed in registers into 8 tile rows; the edges as PACK_BODY does them. The same values
 * in the same places (only moved). */
FUSED_TARGET static void pack_trans_f32_avx2(const float *b, int64_t ldb, int64_t k, int64_t n,
                                             float *dst) {
    const int64_t tw = 16, tiles = (n + tw - 1) / tw;
    for (int64_t t = 0; t < tiles; ++t, dst += k * tw) {
        const int64_t w = n - t * tw < tw ? n - t * tw : tw;
        int64_t j = 0;
        for (; j + 8 <= w; j += 8) {
            const float *col = b + (t * tw + j) * ldb;
            int64_t p = 0;
            for (; p + 8 <= k; p += 8) {
                __m256 r[8], u[8], v[8];
                for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(col + i * ldb + p);
                for (int i = 0; i < 8; i += 2) {
                    u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                    u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
                }
                for (int i = 0; i < 8; i += 4) {
                    v[i] = _mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
                    v[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
                    v[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
                    v[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
                }
                /* v[i] holds element i % 4 + (lane half) of runs 0-3 (v[0..3]) and 4-7 (v[4..7]) */
                for (int i = 0; i < 4; ++i) {
                    _mm256_storeu_ps(dst + (p + i) * tw + j,
                                     _mm256_permute2f128_ps(v[i], v[i + 4], 0x20));
                    _mm256_storeu_ps(dst + (p + i + 4) * tw + j,
                                     _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
                }
            }
            for (; p < k; ++p)
                for (int64_t i = 0; i < 8; ++i) dst[p * tw + j + i] = col[i * ldb + p];
        }
        for (; j < w; ++j) {
            const float *col = b + (t * tw + j) * ldb;
            for (int64_t p = 0; p < k; ++p) dst[p * tw + j] = col[p];
        }
        for (int64_t p = 0; p < k; ++p)
            for (int64_t jj = w; jj < tw; ++jj) dst[p * tw + jj] = 0.0f;
    }
}
#endif

void spconv__fused_pack(spconv_dtype dtype, const void *b, int64_t ldb, int trans, int64_t k,
                        int64_t n, void *packed) {
    const int64_t tw = tile_width(dtype), tiles = (n + tw - 1) / tw;
#if SPCONV__FUSED_X86
    if (dtype == SPCONV_F32 && trans && spconv__fused_available()) {
        pack_trans_f32_avx2(b, ldb, k, n, packed);
        return;
    }
#endif
    if (dtype == SPCONV_F32)
        PACK_BODY(float)
    else
        PACK_BODY(double)
}

#if SPCONV__FUSED_X86

/* A kernel's three ways of reading x's rows (see fused_rows), and for contiguous x rows two ways of
 * reading B: packed (tile t's row p at packed + t * k * TW + p * TW) or where it lies (ldb > 0:
 * at packed + t * TW + p * ldb). Each is its own inlined copy of the body, so that the strides
 * are constants where they can be. Both give a tile row's TW elements contiguous, the same
 * values in the same order: the same bits. */
#define FUSED_MODES(NAME)                                                                          \
    if (lda == 0 && ldb > 0)                                                                       \
        NAME##_body(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, k, 1,      \
                    NULL, 1, ldb);                                                                 \
    else if (lda == 0)                                                                             \
        NAME##_body(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, k, 1,      \
                    NULL, 0, 0);                                                                   \
    else if (kx == NULL)                                                                           \
        NAME##_body(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, 1, lda,    \
                    NULL, 0, 0);                                                                   \
    else                                                                                           \
        NAME##_body(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, 1, lda,    \
                    kx, 0, 0);

/* One kernel body for both element types. V is the vector type, L its lanes (TW = 2 L); the
 * ops are the AVX2 intrinsics of that type; MASK(j) is the load/store mask of the lanes of a
 * vector starting at column j of the last tile that lie below n. Each block of FUSED_ROWS pairs
 * runs every tile: the products of a tile are summed over p = 0..k-1 in registers, then added
 * into y, so every element gets its terms in the same order whatever the block. */
#define FUSED_KERNEL(NAME, T, V, L, ZERO, LOAD, STORE, BCAST, FMA, ADD, MLOAD, MSTORE, MASKS,      \
                     CANON)                                                                        \
    /* y += c, or with @p base (set mode) y = base + c: base is the bias or, when NULL, zero. A    \
     * NaN sum is stored as the default NaN (CANON): which of two NaN operands an x86 add returns  \
     * depends on their order, which the compiler may swap, so this is what keeps NaN outputs      \
     * bitwise identical across code paths and thread counts. */                                   \
    FUSED_TARGET static inline void NAME##_add(T *yr, const T *base, int set, V c0, V c1,          \
                                               int full, __m256i m0, __m256i m1) {                 \
        if (full) {                                                                                \
            const V b0 = !set ? LOAD(yr) : base != NULL ? LOAD(base) : ZERO();                     \
            const V b1 = !set ? LOAD(yr + L) : base != NULL ? LOAD(base + L) : ZERO();             \
            STORE(yr, CANON(ADD(b0, c0)));                                                         \
            STORE(yr + L, CANON(ADD(b1, c1)));                                                     \
        } else {                                                                                   \
            const V b0 = !set ? MLOAD(yr, m0) : base != NULL ? MLOAD(base, m0) : ZERO();           \
            const V b1 = !set ? MLOAD(yr + L, m1) : base != NULL ? MLOAD(base + L, m1) : ZERO();   \
            MSTORE(yr, m0, CANON(ADD(b0, c0)));                                                    \
            MSTORE(yr + L, m1, CANON(ADD(b1, c1)));                                                \
        }                                                                                          \
    }                                                                                              \
    /* Rows i .. i + R - 1 (R < FUSED_ROWS), every tile: the rows a block of FUSED_ROWS leaves.    \
     * Row by row, each tile's two accumulators wait on the FMA latency (a quarter of the rate);   \
     * R rows keep 2 R of them in flight. The same terms in the same order, so the same bits.      \
     * The weight gradient's products have C_in rows, where 64 rows leave 4 (1/16 of them at a     \
     * quarter of the rate cost 1/5 more time). */                                                 \
    FUSED_TARGET __attribute__((always_inline)) static inline void NAME##_few(                     \
        const int R, int64_t i, const T *x, const int32_t *src, int64_t src_base, T *y,            \
        const int32_t *dst, int64_t dst_base, int64_t k, int64_t n, const T *packed, int set,      \
        const T *bias, int64_t rs, int64_t es, const int32_t *kx, const int direct, int64_t ldb,   \
        int64_t tiles, int64_t last, __m256i m0, __m256i m1) {                                     \
        const T *a[FUSED_ROWS];                                                                    \
        T *yo[FUSED_ROWS];                                                                         \
        for (int r = 0; r < R; ++r) {                                                              \
            a[r] = x + (src != NULL ? (int64_t)src[i + r] : src_base + i + r) * rs;                \
            yo[r] = y + (dst != NULL ? (int64_t)dst[i + r] : dst_base + i + r) * n;                \
        }                                                                                          \
        for (int64_t t = 0; t < tiles; ++t) {                                                      \
            const T *w = packed + t * (direct ? 2 * L : k * 2 * L);                                \
            V c0[FUSED_ROWS], c1[FUSED_ROWS];                                                      \
            for (int r = 0; r < R; ++r) c0[r] = ZERO(), c1[r] = ZERO();                            \
            for (int64_t p = 0; p < k; ++p, w += direct ? ldb : 2 * L) {                           \
                const V w0 = LOAD(w), w1 = LOAD(w + L);                                            \
                for (int r = 0; r < R; ++r) {                                                      \
                    const V v = BCAST(kx != NULL ? a[0] + (int64_t)kx[p] * es + r                  \
                                      : es == 1  ? a[r] + p                                        \
                                                 : a[0] + p * es + r);                             \
                    c0[r] = FMA(v, w0, c0[r]);                                                     \
                    c1[r] = FMA(v, w1, c1[r]);                                                     \
                }                                                                                  \
            }                                                                                      \
            const int full = t + 1 < tiles || n - last == 2 * L;                                   \
            const int64_t j = t * 2 * L;                                                           \
            for (int r = 0; r < R; ++r)                                                            \
                NAME##_add(yo[r] + j, bias != NULL ? bias + j : NULL, set, c0[r], c1[r], full, m0, \
                           m1);                                                                    \
        }                                                                                          \
    }                                                                                              \
    FUSED_TARGET __attribute__((always_inline)) static inline void NAME##_body(                    \
        int64_t count, const T *x, const int32_t *src, int64_t src_base, T *y, const int32_t *dst, \
        int64_t dst_base, int64_t k, int64_t n, const T *packed, int set, const T *bias,           \
        int64_t rs, int64_t es, const int32_t *kx, const int direct, int64_t ldb) {                \
        const int64_t tiles = (n + 2 * L - 1) / (2 * L), last = (tiles - 1) * 2 * L;               \
        __m256i m0, m1;                                                                            \
        MASKS(n - last, m0, m1);                                                                   \
        int64_t i = 0;                                                                             \
        for (; i + FUSED_ROWS <= count; i += FUSED_ROWS) {                                         \
            const T *a[FUSED_ROWS];                                                                \
            T *yo[FUSED_ROWS];                                                                     \
            for (int r = 0; r < FUSED_ROWS; ++r) {                                                 \
                a[r] = x + (src != NULL ? (int64_t)src[i + r] : src_base + i + r) * rs;            \
                yo[r] = y + (dst != NULL ? (int64_t)dst[i + r] : dst_base + i + r) * n;            \
            }                                                                                      \
            for (int64_t t = 0; t < tiles; ++t) {                                                  \
                const T *w = packed + t * (direct ? 2 * L : k * 2 * L);                            \
                V c00 = ZERO(), c01 = ZERO(), c10 = ZERO(), c11 = ZERO(), c20 = ZERO(),            \
                  c21 = ZERO(), c30 = ZERO(), c31 = ZERO(), c40 = ZERO(), c41 = ZERO(),            \
                  c50 = ZERO(), c51 = ZERO();                                                      \
                for (int64_t p = 0; p < k; ++p, w += direct ? ldb : 2 * L) {                       \
                    const V w0 = LOAD(w), w1 = LOAD(w + L);                                        \
                    V v = BCAST(kx != NULL ? a[0] + (int64_t)kx[p] * es + 0 : es == 1 ? a[0] + p : a[0] + p * es + 0);                                                         \
                    c00 = FMA(v, w0, c00);                                                         \
                    c01 = FMA(v, w1, c01);                                                         \
                    v = BCAST(kx != NULL ? a[0] + (int64_t)kx[p] * es + 1 : es == 1 ? a[1] + p : a[0] + p * es + 1);                                                           \
                    c10 = FMA(v, w0, c10);                                                         \
                    c11 = FMA(v, w1, c11);                                                         \
                    v = BCAST(kx != NULL ? a[0] + (int64_t)kx[p] * es + 2 : es == 1 ? a[2] + p : a[0] + p * es + 2);                                                           \
                    c20 = FMA(v, w0, c20);                                                         \
                    c21 = FMA(v, w1, c21);                                                         \
                    v = BCAST(kx != NULL ? a[0] + (int64_t)kx[p] * es + 3 : es == 1 ? a[3] + p : a[0] + p * es + 3);                                                           \
                    c30 = FMA(v, w0, c30);                                                         \
                    c31 = FMA(v, w1, c31);                                                         \
                    v = BCAST(kx != NULL ? a[0] + (int64_t)kx[p] * es + 4 : es == 1 ? a[4] + p : a[0] + p * es + 4);                                                           \
                    c40 = FMA(v, w0, c40);                                                         \
                    c41 = FMA(v, w1, c41);                                                         \
                    v = BCAST(kx != NULL ? a[0] + (int64_t)kx[p] * es + 5 : es == 1 ? a[5] + p : a[0] + p * es + 5);                                                           \
                    c50 = FMA(v, w0, c50);                                                         \
                    c51 = FMA(v, w1, c51);                                                         \
                }                                                                                  \
                const int full = t + 1 < tiles || n - last == 2 * L;                               \
                const int64_t j = t * 2 * L;                                                       \
                const T *b = bias != NULL ? bias + j : NULL;                                       \
                NAME##_add(yo[0] + j, b, set, c00, c01, full, m0, m1);                             \
                NAME##_add(yo[1] + j, b, set, c10, c11, full, m0, m1);                             \
                NAME##_add(yo[2] + j, b, set, c20, c21, full, m0, m1);                             \
                NAME##_add(yo[3] + j, b, set, c30, c31, full, m0, m1);                             \
                NAME##_add(yo[4] + j, b, set, c40, c41, full, m0, m1);                             \
                NAME##_add(yo[5] + j, b, set, c50, c51, full, m0, m1);                             \
            }                                                                                      \
        }                                                                                          \
        if (i + 4 <= count) {                                                                      \
            NAME##_few(4, i, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, rs, es,  \
                       kx, direct, ldb, tiles, last, m0, m1);                                      \
            i += 4;                                                                                \
        }                                                                                          \
        if (i + 2 <= count) {                                                                      \
            NAME##_few(2, i, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, rs, es,  \
                       kx, direct, ldb, tiles, last, m0, m1);                                      \
            i += 2;                                                                                \
        }                                                                                          \
        for (; i < count; ++i) { /* the last row, in the same order of terms */                    \
            const T *a0 = x + (src != NULL ? (int64_t)src[i] : src_base + i) * rs;                 \
            T *y0 = y + (dst != NULL ? (int64_t)dst[i] : dst_base + i) * n;                        \
            for (int64_t t = 0; t < tiles; ++t) {                                                  \
                const T *w = packed + t * (direct ? 2 * L : k * 2 * L);                            \
                V c00 = ZERO(), c01 = ZERO();                                                      \
                for (int64_t p = 0; p < k; ++p, w += direct ? ldb : 2 * L) {                       \
                    const V v = BCAST(kx != NULL ? a0 + (int64_t)kx[p] * es : a0 + p * es);        \
                    c00 = FMA(v, LOAD(w), c00);                                                    \
                    c01 = FMA(v, LOAD(w + L), c01);                                                \
                }                                                                                  \
                NAME##_add(y0 + t * 2 * L, bias != NULL ? bias + t * 2 * L : NULL, set, c00, c01,  \
                           t + 1 < tiles || n - last == 2 * L, m0, m1);                            \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    FUSED_TARGET static void NAME(int64_t count, const T *x, const int32_t *src, int64_t src_base, \
                                  T *y, const int32_t *dst, int64_t dst_base, int64_t k,           \
                                  int64_t n, const T *packed, int set, const T *bias,              \
                                  int64_t lda, const int32_t *kx, int64_t ldb) {                   \
        FUSED_MODES(NAME)                                                                          \
    }

/* Masks of the last tile, whose first @p width (1..TW) columns lie below n. */
FUSED_TARGET static inline void masks_f32(int64_t width, __m256i *m0, __m256i *m1) {
    int32_t lanes[16];
    for (int j = 0; j < 16; ++j) lanes[j] = j < width ? -1 : 0;
    *m0 = _mm256_loadu_si256((const __m256i *)lanes);
    *m1 = _mm256_loadu_si256((const __m256i *)(lanes + 8));
}

FUSED_TARGET static inline void masks_f64(int64_t width, __m256i *m0, __m256i *m1) {
    int64_t lanes[8];
    for (int j = 0; j < 8; ++j) lanes[j] = j < width ? -1 : 0;
    *m0 = _mm256_loadu_si256((const __m256i *)lanes);
    *m1 = _mm256_loadu_si256((const __m256i *)(lanes + 4));
}

#define MASKS_F32(width, m0, m1) masks_f32(width, &(m0), &(m1))
#define MASKS_F64(width, m0, m1) masks_f64(width, &(m0), &(m1))

/* NaN lanes become the default quiet NaN (sign clear, no payload): 0x7fc00000 / 0x7ff8... */
FUSED_TARGET static inline __m256 canon_f32(__m256 v) {
    return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                            _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

FUSED_TARGET static inline __m256d canon_f64(__m256d v) {
    return _mm256_blendv_pd(v, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7ff8000000000000LL)),
                            _mm256_cmp_pd(v, v, _CMP_UNORD_Q));
}

FUSED_KERNEL(rows_f32, float, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
             _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_add_ps, _mm256_maskload_ps,
             _mm256_maskstore_ps, MASKS_F32, canon_f32)
FUSED_KERNEL(rows_f64, double, __m256d, 4, _mm256_setzero_pd, _mm256_loadu_pd, _mm256_storeu_pd,
             _mm256_broadcast_sd, _mm256_fmadd_pd, _mm256_add_pd, _mm256_maskload_pd,
             _mm256_maskstore_pd, MASKS_F64, canon_f64)

/* The AVX-512 kernels: the same arithmetic (each element's k terms by fused multiply-adds in
 * increasing p from zero, then one add into y, NaN stored as the default NaN), so their results
 * are bitwise those of the AVX2 kernels above; only the register blocking differs. A tile of the
 * packed B is one 512-bit vector. Rows go 12 at a time, then 4, then single rows. Of 12 rows,
 * each run of 4 tiles is done as 6 rows x 4 tiles twice, and the tiles left as 12 rows x 2 (or
 * 1) tiles: 24 accumulators, which keep both FMA ports busy through the FMA latency, and 6 x 4
 * reads each x row once per 4 tiles and loads 10 operands per 24 FMAs, where 12 x 2 reads it
 * twice and loads 14 (a 64-channel subm layer's products 2% faster in the network). Fewer rows
 * take 4 tiles at a time too, which keeps more accumulators in flight. */
#define FUSED512_TARGET __attribute__((target("avx512f,fma")))
#define FUSED512_INLINE FUSED512_TARGET __attribute__((always_inline)) static inline

#define FUSED512_KERNEL(NAME, T, V, L, M, ZERO, LOAD, SET1, FMA, ADD, MLOAD, MSTORE, CMPU, MMOV,   \
                        QNAN)                                                                      \
    FUSED512_INLINE void NAME##_add(T *yr, const T *base, int set, V c, M m) {                     \
        const V b = !set ? MLOAD(m, yr) : base != NULL ? MLOAD(m, base) : ZERO();                  \
        const V s = ADD(b, c);                                                                     \
        MSTORE(yr, m, MMOV(s, CMPU(s, s, _CMP_UNORD_Q), QNAN));                                    \
    }                                                                                              \
    /* Rows a[0..R) times NT (1-4) consecutive tiles, w the first, into columns j.. of             \
     * yo[0..R); @p m_last masks the last of the NT tiles. */                                      \
    FUSED512_INLINE void NAME##_block(const int R, const int NT, const T *const *a, T *const *yo,  \
                                      const T *w, int64_t k, int64_t j, M m_last, int set,         \
                                      const T *bias, int64_t es, const int32_t *kx,                \
                                      const int direct, int64_t ldb) {                             \
        V c[12][4];                                                                                \
        for (int r = 0; r < R; ++r)                                                                \
            for (int u = 0; u < NT; ++u) c[r][u] = ZERO();                                         \
        for (int64_t p = 0; p < k; ++p) {                                                          \
            V wv[4];                                                                               \
            for (int u = 0; u < NT; ++u) /* in place: rows ldb apart; packed: tiles k rows */      \
                wv[u] = LOAD(direct ? w + u * L + p * ldb : w + (u * k + p) * L);                  \
            for (int r = 0; r < R; ++r) {                                                          \
                const V v = SET1(kx != NULL ? a[0][(int64_t)kx[p] * es + r]                        \
                                 : es == 1  ? a[r][p]                                              \
                                            : a[0][p * es + r]);                                   \
                for (int u = 0; u < NT; ++u) c[r][u] = FMA(v, wv[u], c[r][u]);                     \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < R; ++r)                                                                \
            for (int u = 0; u < NT; ++u)                                                           \
                NAME##_add(yo[r] + j + u * L, bias != NULL ? bias + j + u * L : NULL, set,         \
                           c[r][u], u == NT - 1 ? m_last : (M)~(M)0);                              \
    }                                                                                              \
    FUSED512_INLINE void NAME##_rows(const int R, int64_t i, const T *x, const int32_t *src,       \
                                     int64_t src_base, T *y, const int32_t *dst, int64_t dst_base, \
                                     int64_t k, int64_t n, const T *packed, int set,               \
                                     const T *bias, int64_t rs, int64_t es, const int32_t *kx,     \
                                     const int direct, int64_t ldb) {                              \
        const int64_t tiles = (n + L - 1) / L, width = n - (tiles - 1) * L;                        \
        const M m_last = width >= L ? (M)~(M)0 : (M)((1u << width) - 1u);                          \
        const T *a[12];                                                                            \
        T *yo[12];                                                                                 \
        for (int r = 0; r < R; ++r) {                                                              \
            a[r] = x + (src != NULL ? (int64_t)src[i + r] : src_base + i + r) * rs;                \
            yo[r] = y + (dst != NULL ? (int64_t)dst[i + r] : dst_base + i + r) * n;                \
        }                                                                                          \
        int64_t t = 0;                                                                             \
        if (R == 12) /* 4 tiles: two blocks of 6 rows, which read each x row once */               \
            for (; t + 4 <= tiles; t += 4)                                                         \
                for (int h = 0; h < 12; h += 6)                                                    \
                    NAME##_block(6, 4, a + h, yo + h, packed + t * (direct ? L : k * L), k, t * L, \
                                 t + 4 == tiles ? m_last : (M)~(M)0, set, bias, es, kx, direct,    \
                                 ldb);                                                             \
        else                                                                                       \
            for (; t + 4 <= tiles; t += 4)                                                         \
                NAME##_block(R, 4, a, yo, packed + t * (direct ? L : k * L), k, t * L,             \
                             t + 4 == tiles ? m_last : (M)~(M)0, set, bias, es, kx, direct, ldb);  \
        for (; t + 2 <= tiles; t += 2)                                                             \
            NAME##_block(R, 2, a, yo, packed + t * (direct ? L : k * L), k, t * L,                 \
                         t + 2 == tiles ? m_last : (M)~(M)0, set, bias, es, kx, direct, ldb);      \
        if (t < tiles)                                                                             \
            NAME##_block(R, 1, a, yo, packed + t * (direct ? L : k * L), k, t * L, m_last, set,    \
                         bias, es, kx, direct, ldb);                                               \
    }                                                                                              \
    FUSED512_INLINE void NAME##_body(int64_t count, const T *x, const int32_t *src,                \
                                     int64_t src_base, T *y, const int32_t *dst, int64_t dst_base, \
                                     int64_t k, int64_t n, const T *packed, int set,               \
                                     const T *bias, int64_t rs, int64_t es, const int32_t *kx,     \
                                     const int direct, int64_t ldb) {                              \
        int64_t i = 0;                                                                             \
        for (; i + 12 <= count; i += 12)                                                           \
            NAME##_rows(12, i, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, rs,    \
                        es, kx, direct, ldb);                                                      \
        for (; i + 4 <= count; i += 4)                                                             \
            NAME##_rows(4, i, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, rs,     \
                        es, kx, direct, ldb);                                                      \
        for (; i < count; ++i)                                                                     \
            NAME##_rows(1, i, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, rs,     \
                        es, kx, direct, ldb);                                                      \
    }                                                                                              \
    FUSED512_TARGET static void NAME(int64_t count, const T *x, const int32_t *src,                \
                                     int64_t src_base, T *y, const int32_t *dst, int64_t dst_base, \
                                     int64_t k, int64_t n, const T *packed, int set,               \
                                     const T *bias, int64_t lda, const int32_t *kx, int64_t ldb) { \
        FUSED_MODES(NAME)                                                                          \
    }

FUSED512_KERNEL(rows512_f32, float, __m512, 16, __mmask16, _mm512_setzero_ps, _mm512_loadu_ps,
                _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_maskz_loadu_ps,
                _mm512_mask_storeu_ps, _mm512_cmp_ps_mask, _mm512_mask_mov_ps,
                _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)))
FUSED512_KERNEL(rows512_f64, double, __m512d, 8, __mmask8, _mm512_setzero_pd, _mm512_loadu_pd,
                _mm512_set1_pd, _mm512_fmadd_pd, _mm512_add_pd, _mm512_maskz_loadu_pd,
                _mm512_mask_storeu_pd, _mm512_cmp_pd_mask, _mm512_mask_mov_pd,
                _mm512_castsi512_pd(_mm512_set1_epi64(0x7ff8000000000000LL)))


/* The out-row kernels (spconv__fused_out_rows): one out row at a time, a chunk of its columns
 * summed in registers over every offset that reaches the row, then stored once. Each offset's
 * product is summed over p from zero by fused multiply-adds and then added to the row's sum, in
 * the order in which the per-offset kernels above add them into y (bias or zero, the identity
 * offset, then the others in increasing order): the same values. The default NaN is stored once
 * at the end rather than after every add, which gives the same bits too (a NaN stays a NaN; no
 * other value is touched by it). A chunk is 4 vectors of LV lanes (8 registers with the
 * product's), a whole number of TW-wide tiles; its vector u reads B at
 * (u * LV / TW) * bts + (u * LV) % TW + p * bps from the chunk's first tile, packed or in place
 * as the per-offset kernels read it. A chunk that runs past n takes its bias from a zero-padded
 * copy and stores through a buffer. */
#define OUT_ROWS_KERNEL(NAME, TARGET, T, V, LV, TW, ZERO, LOAD, STORE, SET1, FMA, ADD, CANON)      \
    TARGET __attribute__((always_inline)) static inline void NAME##_terms(                         \
        V *acc, const int nv, const T *xr, const T *w, int64_t k, int64_t bts, int64_t bps) {      \
        V c[4];                                                                                    \
        for (int u = 0; u < nv; ++u) c[u] = ZERO();                                                \
        for (int64_t p = 0; p < k; ++p) {                                                          \
            const V v = SET1(xr[p]);                                                               \
            for (int u = 0; u < nv; ++u)                                                           \
                c[u] = FMA(v, LOAD(w + (u * LV / TW) * bts + (u * LV) % TW + p * bps), c[u]);      \
        }                                                                                          \
        for (int u = 0; u < nv; ++u) acc[u] = ADD(acc[u], c[u]);                                   \
    }                                                                                              \
    TARGET __attribute__((always_inline)) static inline void NAME##_chunk(                         \
        const int nv, int64_t rows, const T *x, int64_t self_base, const T *w_self,                \
        const uint64_t *masks, const int32_t *sources, int64_t stride, const T *const *w,          \
        int64_t offset, int64_t bts, int64_t bps, int64_t k, int64_t n, int64_t c0, int64_t width, \
        const T *bias, T *y) {                                                                     \
        for (int64_t i = 0; i < rows; ++i) {                                                       \
            V acc[4];                                                                              \
            for (int u = 0; u < nv; ++u) acc[u] = bias != NULL ? LOAD(bias + u * LV) : ZERO();     \
            if (w_self != NULL)                                                                    \
                NAME##_terms(acc, nv, x + (self_base + i) * k, w_self + offset, k, bts, bps);      \
            for (uint64_t m = masks[i]; m != 0; m &= m - 1) {                                      \
                const int j = __builtin_ctzll(m);                                                  \
                NAME##_terms(acc, nv, x + (int64_t)sources[i * stride + j] * k, w[j] + offset, k,  \
                             bts, bps);                                                            \
            }                                                                                      \
            /* A row that no product reached keeps its bias bits, NaN payloads included, as the \
             * per-offset path leaves them; a sum is stored as that path stores every sum. */      \
            const int summed = w_self != NULL || masks[i] != 0;                                    \
            T *yr = y + i * n + c0;                                                                \
            if (width == nv * LV) {                                                                \
                for (int u = 0; u < nv; ++u)                                                       \
                    STORE(yr + u * LV, summed ? CANON(acc[u]) : acc[u]);                           \
            } else {                                                                               \
                T part[4 * LV];                                                                    \
                for (int u = 0; u < nv; ++u)                                                       \
                    STORE(part + u * LV, summed ? CANON(acc[u]) : acc[u]);                         \
                memcpy(yr, part, (size_t)width * sizeof(T));                                       \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    TARGET static void NAME(int64_t rows, const T *x, int64_t self_base, const T *w_self,          \
                            const uint64_t *masks, const int32_t *sources, int64_t stride,         \
                            const T *const *w, int64_t ldb, int64_t k, int64_t n, const T *bias,   \
                            T *y) {                                                                \
        const int64_t bts = ldb > 0 ? TW : k * TW, bps = ldb > 0 ? ldb : TW;                       \
        for (int64_t c0 = 0; c0 < n; c0 += 4 * LV) {                                               \
            const int64_t width = n - c0 < 4 * LV ? n - c0 : 4 * LV;                               \
            const int nv = (int)((width + LV - 1) / LV);                                           \
            const int64_t offset = c0 / TW * bts; /* the chunk's first tile */                     \
            T padded[4 * LV];                                                                      \
            const T *b = bias != NULL ? bias + c0 : NULL;                                          \
            if (b != NULL && width < 4 * LV) {                                                     \
                memset(padded, 0, sizeof padded);                                                  \
                memcpy(padded, b, (size_t)width * sizeof(T));                                      \
                b = padded;                                                                        \
            }                                                                                      \
            if (nv == 4)                                                                           \
                NAME##_chunk(4, rows, x, self_base, w_self, masks, sources, stride, w, offset,     \
                             bts, bps, k, n, c0, width, b, y);                                     \
            else if (nv == 3)                                                                      \
                NAME##_chunk(3, rows, x, self_base, w_self, masks, sources, stride, w, offset,     \
                             bts, bps, k, n, c0, width, b, y);                                     \
            else if (nv == 2)                                                                      \
                NAME##_chunk(2, rows, x, self_base, w_self, masks, sources, stride, w, offset,     \
                             bts, bps, k, n, c0, width, b, y);                                     \
            else                                                                                   \
                NAME##_chunk(1, rows, x, self_base, w_self, masks, sources, stride, w, offset,     \
                             bts, bps, k, n, c0, width, b, y);                                     \
        }                                                                                          \
    }

FUSED512_TARGET static inline __m512 canon512_f32(__m512 v) {
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                              _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

FUSED512_TARGET static inline __m512d canon512_f64(__m512d v) {
    return _mm512_mask_mov_pd(v, _mm512_cmp_pd_mask(v, v, _CMP_UNORD_Q),
                              _mm512_castsi512_pd(_mm512_set1_epi64(0x7ff8000000000000LL)));
}

OUT_ROWS_KERNEL(out512_f32, FUSED512_TARGET, float, __m512, 16, 16, _mm512_setzero_ps,
                _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps,
                canon512_f32)
OUT_ROWS_KERNEL(out512_f64, FUSED512_TARGET, double, __m512d, 8, 8, _mm512_setzero_pd,
                _mm512_loadu_pd, _mm512_storeu_pd, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_add_pd,
                canon512_f64)
OUT_ROWS_KERNEL(out256_f32, FUSED_TARGET, float, __m256, 8, 16, _mm256_setzero_ps, _mm256_loadu_ps,
                _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, canon_f32)
OUT_ROWS_KERNEL(out256_f64, FUSED_TARGET, double, __m256d, 4, 8, _mm256_setzero_pd,
                _mm256_loadu_pd, _mm256_storeu_pd, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_add_pd,
                canon_f64)

#endif /* SPCONV__FUSED_X86 */

/* 2: the AVX2 kernels; 3: the AVX-512 ones. The widest the machine has, unless a test chose. */
static int fused_isa = -1;

static int fused_widest(void) {
#if SPCONV__FUSED_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 3 : 2;
#else
    return 0;
#endif
}

int spconv__fused_isa(int isa) {
    if (fused_isa < 0) fused_isa = fused_widest();
    const int previous = fused_isa;
    if (isa >= 2 && isa <= fused_widest()) fused_isa = isa;
    return previous;
}

int spconv__fused_reads_b(spconv_dtype dtype, int64_t n) {
    return n > 0 && n % tile_width(dtype) == 0;
}

int64_t spconv__fused_block_columns(spconv_dtype dtype) {
    if (fused_isa < 0) fused_isa = fused_widest();
    return (fused_isa == 3 ? 4 : 1) * tile_width(dtype);
}

/* Row i of x is x + row_i * k with its elements contiguous or, for @p lda > 0, x + row_i with
 * element p at + p * lda (the columns of a [k, lda] matrix, read as rows; src must be NULL), or
 * with @p kx, element p at + kx[p] * lda (the columns of the rows kx[0..k) of such a matrix). */
static void fused_rows(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                       int64_t src_base, void *y, const int32_t *dst, int64_t dst_base, int64_t k,
                       int64_t n, const void *packed, int64_t ldb, int set, const void *bias,
                       int64_t lda, const int32_t *kx) {
    if (count <= 0 || n <= 0) return;
#if SPCONV__FUSED_X86
    if (fused_isa < 0) fused_isa = fused_widest();
    if (fused_isa == 3 && dtype == SPCONV_F32)
        rows512_f32(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, lda, kx,
                    ldb);
    else if (fused_isa == 3)
        rows512_f64(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, lda, kx,
                    ldb);
    else if (dtype == SPCONV_F32)
        rows_f32(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, lda, kx, ldb);
    else
        rows_f64(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias, lda, kx, ldb);
#else
    (void)dtype, (void)x, (void)src, (void)src_base, (void)y, (void)dst, (void)dst_base, (void)k,
        (void)packed, (void)ldb, (void)set, (void)bias, (void)lda, (void)kx;
#endif
}

void spconv__fused_rows(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                        int64_t src_base, void *y, const int32_t *dst, int64_t dst_base, int64_t k,
                        int64_t n, const void *b, int64_t ldb) {
    fused_rows(dtype, count, x, src, src_base, y, dst, dst_base, k, n, b, ldb, 0, NULL, 0, NULL);
}

void spconv__fused_rows_set(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                            int64_t src_base, void *y, const int32_t *dst, int64_t dst_base,
                            int64_t k, int64_t n, const void *b, int64_t ldb, const void *bias) {
    fused_rows(dtype, count, x, src, src_base, y, dst, dst_base, k, n, b, ldb, 1, bias, 0, NULL);
}

void spconv__fused_out_rows(spconv_dtype dtype, int64_t rows, const void *x, int64_t self_base,
                            const void *w_self, const uint64_t *masks, const int32_t *sources,
                            int64_t stride, const void *const *w, int64_t ldb, int64_t k,
                            int64_t n, const void *bias, void *y) {
    if (rows <= 0 || n <= 0) return;
#if SPCONV__FUSED_X86
    if (fused_isa < 0) fused_isa = fused_widest();
    if (fused_isa == 3 && dtype == SPCONV_F32)
        out512_f32(rows, x, self_base, w_self, masks, sources, stride, (const float *const *)w, ldb,
                   k, n, bias, y);
    else if (fused_isa == 3)
        out512_f64(rows, x, self_base, w_self, masks, sources, stride, (const double *const *)w,
                   ldb, k, n, bias, y);
    else if (dtype == SPCONV_F32)
        out256_f32(rows, x, self_base, w_self, masks, sources, stride, (const float *const *)w, ldb,
                   k, n, bias, y);
    else
        out256_f64(rows, x, self_base, w_self, masks, sources, stride, (const double *const *)w,
                   ldb, k, n, bias, y);
#else
    (void)dtype, (void)x, (void)self_base, (void)w_self, (void)masks, (void)sources, (void)stride,
        (void)w, (void)ldb, (void)k, (void)bias, (void)y;
#endif
}

size_t spconv__fused_weight_scratch_bytes(spconv_dtype dtype, int64_t chunk, int64_t c_in,
                                          int64_t c_out) {
    (void)c_in;
    return spconv__fused_packed_bytes(dtype, chunk, c_out);
}

#if SPCONV__FUSED_X86
/* The chunk's g rows in the packed tile layout of B, zero past c_out: a tile row is two AVX2
 * vectors, the last tile's lanes past c_out loaded as zeros by the mask (a memcpy of a variable
 * 64 bytes per tile row was a library call each, a third of the gather's time). The x rows stay
 * where they are (the product reads them through src); they are only prefetched here, so that
 * the product finds them in the cache. */
#define WEIGHT_GATHER_AVX2(NAME, T, V, L, LOADU, STOREU, MLOAD, MASKS)                             \
    FUSED_TARGET static void NAME(int64_t count, const T *xs, const int32_t *src,                  \
                                  int64_t src_base, const T *gs, const int32_t *dst,               \
                                  int64_t dst_base, int64_t c_in, int64_t c_out, T *tiles) {       \
        const int64_t tw = 2 * L, tw_tiles = (c_out + tw - 1) / tw, last = (tw_tiles - 1) * tw;    \
        __m256i m0, m1;                                                                            \
        MASKS(c_out - last, m0, m1);                                                               \
        const int last_full = c_out - last == tw;                                                  \
        for (int64_t i = 0; i < count; ++i) {                                                      \
            if (i + GATHER_AHEAD < count) {                                                        \
                const T *ahead_x = xs + (src != NULL ? (int64_t)src[i + GATHER_AHEAD]              \
                                                     : src_base + i + GATHER_AHEAD) * c_in;        \
                const T *ahead_g = gs + (dst != NULL ? (int64_t)dst[i + GATHER_AHEAD]              \
                                                     : dst_base + i + GATHER_AHEAD) * c_out;       \
                for (int64_t b = 0; b < c_in; b += 64 / (int64_t)sizeof(T))                        \
                    __builtin_prefetch(ahead_x + b);                                               \
                for (int64_t b = 0; b < c_out; b += 64 / (int64_t)sizeof(T))                       \
                    __builtin_prefetch(ahead_g + b);                                               \
            }                                                                                      \
            const T *grow = gs + (dst != NULL ? (int64_t)dst[i] : dst_base + i) * c_out;           \
            T *to = tiles + i * tw;                                                                \
            for (int64_t t = 0; t + 1 < tw_tiles; ++t, to += count * tw) {                         \
                STOREU(to, LOADU(grow + t * tw));                                                  \
                STOREU(to + L, LOADU(grow + t * tw + L));                                          \
            }                                                                                      \
            if (last_full) {                                                                       \
                STOREU(to, LOADU(grow + last));                                                    \
                STOREU(to + L, LOADU(grow + last + L));                                            \
            } else {                                                                               \
                STOREU(to, MLOAD(grow + last, m0));                                                \
                STOREU(to + L, MLOAD(grow + last + L, m1));                                        \
            }                                                                                      \
        }                                                                                          \
    }
WEIGHT_GATHER_AVX2(weight_gather_f32, float, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
                   _mm256_maskload_ps, MASKS_F32)
WEIGHT_GATHER_AVX2(weight_gather_f64, double, __m256d, 4, _mm256_loadu_pd, _mm256_storeu_pd,
                   _mm256_maskload_pd, MASKS_F64)
#endif

void spconv__fused_weight_gather(spconv_dtype dtype, int64_t count, const void *x,
                                 const int32_t *src, int64_t src_base, const void *g,
                                 const int32_t *dst, int64_t dst_base, int64_t c_in, int64_t c_out,
                                 void *scratch) {
    if (count <= 0 || c_in <= 0 || c_out <= 0) return;
#if SPCONV__FUSED_X86
    if (dtype == SPCONV_F32)
        weight_gather_f32(count, x, src, src_base, g, dst, dst_base, c_in, c_out, scratch);
    else
        weight_gather_f64(count, x, src, src_base, g, dst, dst_base, c_in, c_out, scratch);
#else
    (void)dtype, (void)x, (void)src, (void)src_base, (void)g, (void)dst, (void)dst_base,
        (void)scratch;
#endif
}

void spconv__fused_weight_product(spconv_dtype dtype, int64_t count, const void *x,
                                  const int32_t *src, int64_t src_base, int64_t c_in,
                                  int64_t c_out, const void *scratch, void *sums) {
    if (count <= 0 || c_in <= 0 || c_out <= 0) return;
    /* rows of the product: the c_in columns of x's rows src_i (or src_base + i) */
    const char *base = (const char *)x;
    if (src == NULL) base += (size_t)(src_base * c_in) * spconv_dtype_size(dtype);
    fused_rows(dtype, c_in, base, NULL, 0, sums, NULL, 0, count, c_out, scratch, 0, 0, NULL, c_in,
               src);
}

/* ---- the affine epilogue (spconv_conv_forward_affine) ----------------------------------------- */

/* One element: fma, then relu as `v < 0 ? 0 : v`. fma / fmaf are single-rounding everywhere; in
 * the AVX2 + FMA functions they compile to the instruction, elsewhere they may be calls. */
#define AFFINE_ROWS(T, FMA)                                                                        \
    {                                                                                              \
        T *row = y;                                                                                \
        for (int64_t r = 0; r < rows; ++r, row += c)                                               \
            for (int64_t j = 0; j < c; ++j) {                                                      \
                T v = scale != NULL ? FMA(row[j], scale[j], shift[j]) : row[j];                    \
                row[j] = relu && v < 0 ? (T)0 : v;                                                 \
            }                                                                                      \
    }

static void affine_f32(float *y, int64_t rows, int64_t c, const float *scale, const float *shift,
                       int relu) AFFINE_ROWS(float, fmaf)

static void affine_f64(double *y, int64_t rows, int64_t c, const double *scale,
                       const double *shift, int relu) AFFINE_ROWS(double, fma)

#if SPCONV__FUSED_X86
/* 8 columns at a time; the last columns of a row as above. relu: lanes below zero (not NaN, not
 * -0) become +0, as the scalar expression. */
FUSED_TARGET static void affine_f32_avx2(float *y, int64_t rows, int64_t c, const float *scale,
                                         const float *shift, int relu) {
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; ++r, y += c) {
        int64_t j = 0;
        for (; j + 8 <= c; j += 8) {
            __m256 v = _mm256_loadu_ps(y + j);
            if (scale != NULL)
                v = _mm256_fmadd_ps(v, _mm256_loadu_ps(scale + j), _mm256_loadu_ps(shift + j));
            if (relu) v = _mm256_andnot_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ), v);
            _mm256_storeu_ps(y + j, v);
        }
        for (; j < c; ++j) {
            float v = scale != NULL ? __builtin_fmaf(y[j], scale[j], shift[j]) : y[j];
            y[j] = relu && v < 0 ? 0.0f : v;
        }
    }
}

FUSED_TARGET static void affine_f64_avx2(double *y, int64_t rows, int64_t c, const double *scale,
                                         const double *shift, int relu) {
    const __m256d zero = _mm256_setzero_pd();
    for (int64_t r = 0; r < rows; ++r, y += c) {
        int64_t j = 0;
        for (; j + 4 <= c; j += 4) {
            __m256d v = _mm256_loadu_pd(y + j);
            if (scale != NULL)
                v = _mm256_fmadd_pd(v, _mm256_loadu_pd(scale + j), _mm256_loadu_pd(shift + j));
            if (relu) v = _mm256_andnot_pd(_mm256_cmp_pd(v, zero, _CMP_LT_OQ), v);
            _mm256_storeu_pd(y + j, v);
        }
        for (; j < c; ++j) {
            double v = scale != NULL ? __builtin_fma(y[j], scale[j], shift[j]) : y[j];
            y[j] = relu && v < 0 ? 0.0 : v;
        }
    }
}
#endif

void spconv__affine_rows(spconv_dtype dtype, void *y, int64_t rows, int64_t c, const void *scale,
                         const void *shift, int relu) {
    if (rows <= 0 || c <= 0 || (scale == NULL && !relu)) return;
#if SPCONV__FUSED_X86
    if (spconv__fused_available()) {
        if (dtype == SPCONV_F32)
            affine_f32_avx2(y, rows, c, scale, shift, relu);
        else
            affine_f64_avx2(y, rows, c, scale, shift, relu);
        return;
    }
#endif
    if (dtype == SPCONV_F32)
        affine_f32(y, rows, c, scale, shift, relu);
    else
        affine_f64(y, rows, c, scale, shift, relu);
}
