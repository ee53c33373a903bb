/* Fused gather-GEMM-scatter for the conv executors: y[dst_i, :] += x[src_i, :] @ B for a list of
 * pairs, reading the x rows where they lie and adding each product row straight into its y row,
 * so that neither the gathered operand nor the product is ever written to memory.
 *
 * B (k x n) is packed once per call into column tiles: tile t holds columns [t*TW, t*TW + TW) of
 * every row of B, contiguous and zero-padded past n, so that the micro-kernel streams it; a
 * row-major B of whole tiles may be read where it lies instead (the forward's W[k], where that
 * pays: conv_forward.c), with the same values in the same order. The
 * micro-kernel keeps a block of products in registers (6 rows x TW columns, TW = 16 floats or 8
 * doubles, two AVX2 vectors; with AVX-512, a tile per vector, 6 rows x 4 tiles or 12 rows x 2)
 * and adds the k terms of each element in increasing order with fused
 * multiply-adds, starting from zero, before one add into y. An element's value therefore depends
 * only on its own row of x and column of B, never on how rows are grouped or which thread runs
 * them: results are bitwise identical for every thread count, block size and batch composition.
 * A NaN result is stored as the default quiet NaN (0x7fc00000, 0x7ff8000000000000): which NaN an
 * x86 add returns depends on its operands' order, so NaN bits would otherwise vary too.
 *
 * The kernels exist for x86-64 machines with AVX2 and FMA, and in AVX-512 form for machines
 * that have it (both checked at run time); elsewhere
 * spconv__fused_available() is 0 and the executors keep the unfused gather + BLAS + scatter
 * path, which is also the reference the tests hold these kernels against. */
#ifndef SPCONV_CONV_FUSED_H
#define SPCONV_CONV_FUSED_H

#include <stddef.h>
#include <stdint.h>

#include "spconv/types.h"

/* 1 when the fused kernels can run on this machine, for f32 and f64. */
int spconv__fused_available(void);

/* The kernels spconv__fused_rows runs: 2 for the AVX2 ones, 3 for the AVX-512 ones (bitwise the
 * same results, wider registers). The default is the widest the machine has. Sets @p isa where
 * the machine has it (0 sets nothing) and returns the choice before the call; for tests and
 * benchmarks, not thread-safe against running convolutions. */
int spconv__fused_isa(int isa);

/* Bytes of B (k x n, elements of @p dtype) once packed. */
size_t spconv__fused_packed_bytes(spconv_dtype dtype, int64_t k, int64_t n);

/* Pack B = @p b ([k, n] row-major with leading dimension @p ldb), or B = b^T for @p trans (b
 * stored [n, k], leading dimension ldb), into @p packed (spconv__fused_packed_bytes bytes). */
void spconv__fused_pack(spconv_dtype dtype, const void *b, int64_t ldb, int trans, int64_t k,
                        int64_t n, void *packed);

/* 1 when the kernels can read B ([k, n], row-major) where it lies, without packing: n a whole
 * number of tiles (a multiple of 16 floats or 8 doubles), so that no tile row reads past n. */
int spconv__fused_reads_b(spconv_dtype dtype, int64_t n);

/* Columns of B that one register block of the current kernel set reads (AVX-512: 4 tiles; AVX2:
 * 1). A row of B up to this wide is read as one run in place; a wider one in strips, down the
 * rows, which is slower than packed tiles where the products reuse B many times. */
int64_t spconv__fused_block_columns(spconv_dtype dtype);

/* For i < count: y[dst_i, 0:n] += x[src_i, 0:k] @ B, where src_i = src[i] (or src_base + i when
 * @p src is NULL), likewise dst_i; x rows hold k elements, y rows n. Within one call the dst rows
 * must be distinct. With @p ldb 0, @p b is B packed by spconv__fused_pack with the same k and n;
 * with ldb > 0 it is B itself, row p at b + p * ldb, which needs spconv__fused_reads_b(dtype, n).
 * Either way the same values are read in the same order: the same bits. Only valid when
 * spconv__fused_available(). */
void spconv__fused_rows(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                        int64_t src_base, void *y, const int32_t *dst, int64_t dst_base, int64_t k,
                        int64_t n, const void *b, int64_t ldb);

/* The same, but each dst row is written instead of added to: y[dst_i, :] = bias + x[src_i, :] @ B
 * (the sum from zero, then one add of the bias; @p bias [n] or NULL for none), so that a first
 * pass over every target row needs no zero-fill before it. */
void spconv__fused_rows_set(spconv_dtype dtype, int64_t count, const void *x, const int32_t *src,
                            int64_t src_base, void *y, const int32_t *dst, int64_t dst_base,
                            int64_t k, int64_t n, const void *b, int64_t ldb,
                            const void *bias);

/* Out rows y[i, 0:n] for i < rows (rows of y contiguous, n elements apart), each computed whole:
 * bias (or zero), plus x[self_base + i, :] @ W_self when @p w_self is not NULL (a subm layer's
 * identity offset), plus for each bit j of masks[i], in increasing j, x[sources[i * stride + j],
 * :] @ W_j with W_j = w[j]. x rows hold k elements. Every product is summed over k from zero by
 * fused multiply-adds and then added, so each row gets the bits that spconv__fused_rows_set for
 * the identity followed by spconv__fused_rows for each offset in increasing order gives it; the
 * row is stored once, not read and written per offset, which pays where k is small (a first
 * layer of 3 or 4 input channels). B (W_self and every w[j]) is packed for @p ldb 0, or read in
 * place with rows ldb apart (spconv__fused_reads_b), as in spconv__fused_rows. Only valid when
 * spconv__fused_available(). */
void spconv__fused_out_rows(spconv_dtype dtype, int64_t rows, const void *x, int64_t self_base,
                            const void *w_self, const uint64_t *masks, const int32_t *sources,
                            int64_t stride, const void *const *w, int64_t ldb, int64_t k,
                            int64_t n, const void *bias, void *y);

/* The weight gradient of a chunk of pairs, sums[c_in, c_out] += sum over i < count of
 * x[src_i, :]^T g[dst_i, :] (src_i, dst_i as above; rows may repeat), in two steps: the gather
 * packs the chunk's g rows as B into @p scratch (spconv__fused_weight_scratch_bytes for at least
 * @p count pairs) and prefetches its x rows; the product multiplies them by the kernels above
 * with k = count, its rows being the c_in columns of the x rows, read where they lie. Each
 * element's count terms are summed by fused multiply-adds in increasing i from zero and then
 * added once into sums. Only valid when spconv__fused_available() (both are AVX2 code). */
size_t spconv__fused_weight_scratch_bytes(spconv_dtype dtype, int64_t chunk, int64_t c_in,
                                          int64_t c_out);
void spconv__fused_weight_gather(spconv_dtype dtype, int64_t count, const void *x,
                                 const int32_t *src, int64_t src_base, const void *g,
                                 const int32_t *dst, int64_t dst_base, int64_t c_in, int64_t c_out,
                                 void *scratch);
void spconv__fused_weight_product(spconv_dtype dtype, int64_t count, const void *x,
                                  const int32_t *src, int64_t src_base, int64_t c_in,
                                  int64_t c_out, const void *scratch, void *sums);

/* Rows [0, rows) of y [rows, c] (f32 or f64) in place: y = fma(y, scale[j], shift[j]) with one
 * rounding when scale and shift are given (both or neither), then with @p relu y < 0 ? 0 : y (-0
 * and NaN pass). Vectorised where spconv__fused_available(), the same values either way. */
void spconv__affine_rows(spconv_dtype dtype, void *y, int64_t rows, int64_t c, const void *scale,
                         const void *shift, int relu);

#endif /* SPCONV_CONV_FUSED_H */
