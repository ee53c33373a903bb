/* Checking int32 [n, 4] site rows (b, z, y, x) against a (B, D, H, W) grid on the device, for
 * the ops that write sites into a dense map (dense.cu, the network's to-dense in net.cu): the first
 * row outside the grid and the first row that repeats an earlier one, in row order, as the CPU
 * finds them walking the rows. Each caller words its own message from what comes back. */
#ifndef SPCONV_CUDA_SITE_CHECK_H
#define SPCONV_CUDA_SITE_CHECK_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "spconv/context.h"
#include "spconv/status.h"

/* What the check found; rows are INT32_MAX where there is nothing to report. */
typedef struct spconv__site_check {
    int32_t bad_row;   /* the first bad row (outside, or repeating), INT32_MAX: none */
    int repeated;      /* 1: bad_row repeats earlier_row; 0: bad_row is outside the grid */
    int32_t earlier_row;
    int32_t site[4];   /* bad_row's coordinates */
} spconv__site_check;

/* Check the @p n rows of @p idx (device memory) against @p grid (B, D, H, W) on @p stream, with
 * grid-stride launches of up to @p blocks blocks; synchronises to read the answer back. Scratch
 * comes from @p ctx's allocator (NULL: the backend's pool). Messages name @p func. */
spconv_status spconv__cuda_check_sites(const char *func, const spconv_context *ctx,
                                       cudaStream_t stream, int blocks,
                                       const int32_t *idx, int64_t n, const int64_t grid[4],
                                       spconv__site_check *out);

#endif /* SPCONV_CUDA_SITE_CHECK_H */
