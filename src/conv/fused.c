/* Fused gather-GEMM-scatter kernels (see fused.h). */
#include "conv/fused.h"

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

/* Rows of the register block; its columns are one tile (two vectors). */
#define FUSED_ROWS 6

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

#define PACK_BODY(T)                                                                               \
    {                                                                                              \
        const T *src = b;                                                                          \
        T *dst = packed;                                                                           \
        for (int64_t t = 0; t < tiles; ++t)                                                        \
            for (int64_t p = 0; p < k; ++p)                                                        \
                for (int64_t j = 0; j < tw; ++j) {                                                 \
                    const int64_t col = t * tw + j;                                                \
                    *dst++ = col >= n ? (T)0 : trans ? src[col * ldb + p] : src[p * ldb + col];    \
                }                                                                                  \
    }

void spconv__fused_pack(spconv_dtype dtype, const void *b, int64_t ldb, int trans, int64_t k,
                        int64_t n, void *packed) {
    const int64_t tw = tile_width(dtype), tiles = (n + tw - 1) / tw;
    if (dtype == SPCONV_F32)
        PACK_BODY(float)
    else
        PACK_BODY(double)
}

#if SPCONV__FUSED_X86

/* One kernel body for both element types. V is the vector type, L its lanes (TW = 2 L); the
 * ops are the AVX2 intrinsics of that type; MASK(j) is the load/store mask of the lanes of a
 * vector starting at column j of the last tile that lie below n. Each block of FUSED_ROWS pairs
 * runs every tile: the products of a tile are summed over p = 0..k-1 in registers, then added
 * into y, so every element gets its terms in the same order whatever the block. */
#define FUSED_KERNEL(NAME, T, V, L, ZERO, LOAD, STORE, BCAST, FMA, ADD, MLOAD, MSTORE, MASKS,     \
                     CANON)                                                                        \
    /* y += c, or with @p base (set mode) y = base + c: base is the bias or, when NULL, zero. A    \
     * NaN sum is stored as the default NaN (CANON): which of two NaN operands an x86 add returns  \
     * depends on their order, which the compiler may swap, so this is what keeps NaN outputs      \
     * bitwise identical across code paths and thread counts. */                                 \
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
    FUSED_TARGET static void NAME(int64_t count, const T *x, const int32_t *src, int64_t src_base, \
                                  T *y, const int32_t *dst, int64_t dst_base, int64_t k,           \
                                  int64_t n, const T *packed, int set, const T *bias) {            \
        const int64_t tiles = (n + 2 * L - 1) / (2 * L), last = (tiles - 1) * 2 * L;               \
        __m256i m0, m1;                                                                            \
        MASKS(n - last, m0, m1);                                                                   \
        int64_t i = 0;                                                                             \
        for (; i + FUSED_ROWS <= count; i += FUSED_ROWS) {                                         \
            const T *a[FUSED_ROWS];                                                                \
            T *yo[FUSED_ROWS];                                                                     \
            for (int r = 0; r < FUSED_ROWS; ++r) {                                                 \
                a[r] = x + (src != NULL ? (int64_t)src[i + r] : src_base + i + r) * k;             \
                yo[r] = y + (dst != NULL ? (int64_t)dst[i + r] : dst_base + i + r) * n;            \
            }                                                                                      \
            for (int64_t t = 0; t < tiles; ++t) {                                                  \
                const T *w = packed + t * k * 2 * L;                                               \
                V c00 = ZERO(), c01 = ZERO(), c10 = ZERO(), c11 = ZERO(), c20 = ZERO(),            \
                  c21 = ZERO(), c30 = ZERO(), c31 = ZERO(), c40 = ZERO(), c41 = ZERO(),            \
                  c50 = ZERO(), c51 = ZERO();                                                      \
                for (int64_t p = 0; p < k; ++p, w += 2 * L) {                                      \
                    const V w0 = LOAD(w), w1 = LOAD(w + L);                                        \
                    V v = BCAST(a[0] + p);                                                         \
                    c00 = FMA(v, w0, c00);                                                         \
                    c01 = FMA(v, w1, c01);                                                         \
                    v = BCAST(a[1] + p);                                                           \
                    c10 = FMA(v, w0, c10);                                                         \
                    c11 = FMA(v, w1, c11);                                                         \
                    v = BCAST(a[2] + p);                                                           \
                    c20 = FMA(v, w0, c20);                                                         \
                    c21 = FMA(v, w1, c21);                                                         \
                    v = BCAST(a[3] + p);                                                           \
                    c30 = FMA(v, w0, c30);                                                         \
                    c31 = FMA(v, w1, c31);                                                         \
                    v = BCAST(a[4] + p);                                                           \
                    c40 = FMA(v, w0, c40);                                                         \
                    c41 = FMA(v, w1, c41);                                                         \
                    v = BCAST(a[5] + p);                                                           \
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
        for (; i < count; ++i) { /* the last rows, one at a time, in the same order of terms */    \
            const T *a0 = x + (src != NULL ? (int64_t)src[i] : src_base + i) * k;                  \
            T *y0 = y + (dst != NULL ? (int64_t)dst[i] : dst_base + i) * n;                        \
            for (int64_t t = 0; t < tiles; ++t) {                                                  \
                const T *w = packed + t * k * 2 * L;                                               \
                V c00 = ZERO(), c01 = ZERO();                                                      \
                for (int64_t p = 0; p < k; ++p, w += 2 * L) {                                      \
                    const V v = BCAST(a0 + p);                                                     \
                    c00 = FMA(v, LOAD(w), c00);                                                    \
                    c01 = FMA(v, LOAD(w + L), c01);                                                \
                }                                                                                  \
                NAME##_add(y0 + t * 2 * L, bias != NULL ? bias + t * 2 * L : NULL, set, c00, c01,  \
                           t + 1 < tiles || n - last == 2 * L, m0, m1);                            \
            }                                                                                      \
        }                                                                                          \
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

#endif /* SPCONV__FUSED_X86 */

static void fused_rows(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                       int64_t src_base, void *y, const int32_t *dst, int64_t dst_base, int64_t k,
                       int64_t n, const void *packed, int set, const void *bias) {
    if (count <= 0 || n <= 0) return;
#if SPCONV__FUSED_X86
    if (dtype == SPCONV_F32)
        rows_f32(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias);
    else
        rows_f64(count, x, src, src_base, y, dst, dst_base, k, n, packed, set, bias);
#else
    (void)dtype, (void)x, (void)src, (void)src_base, (void)y, (void)dst, (void)dst_base, (void)k,
        (void)packed, (void)set, (void)bias;
#endif
}

void spconv__fused_rows(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                        int64_t src_base, void *y, const int32_t *dst, int64_t dst_base, int64_t k,
                        int64_t n, const void *packed) {
    fused_rows(dtype, count, x, src, src_base, y, dst, dst_base, k, n, packed, 0, NULL);
}

void spconv__fused_rows_set(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                            int64_t src_base, void *y, const int32_t *dst, int64_t dst_base,
                            int64_t k, int64_t n, const void *packed, const void *bias) {
    fused_rows(dtype, count, x, src, src_base, y, dst, dst_base, k, n, packed, 1, bias);
}
