/* The one way the CUDA backend launches a kernel, so that the same .cu sources build with nvcc
 * for a GPU and with the host C++ compiler for the host emulation (cuda/emulation/, CMake option
 * SPCONV_CUDA_EMULATION), where `<<<...>>>` does not parse:
 *
 *   SPCONV_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, arguments...);
 *   CUDA_TRY(cudaGetLastError());
 *
 * A kernel name with a comma in it (template arguments) goes in parentheses, or the preprocessor
 * splits it: SPCONV_CUDA_LAUNCH((copy_kernel<Dst, Src>), blocks, threads, 0, stream, ...).
 * Kernels must be correct for any grid (grid-stride loops): the emulated device is small, so its
 * grids are. A launch reports a bad configuration through cudaGetLastError in both builds. */
#ifndef SPCONV_CUDA_LAUNCH_H
#define SPCONV_CUDA_LAUNCH_H

#include <cuda_runtime.h>

#include "spconv/config.h"

#if SPCONV_CUDA_EMULATION
#ifdef __CUDACC__
#error "this build emulates CUDA on the host (SPCONV_CUDA_EMULATION): compile cuda/ with g++"
#endif
#define SPCONV_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                      \
    spconv__emu::launch(#kernel, kernel, dim3(grid), dim3(block), (shared_bytes), (stream),    \
                        __VA_ARGS__)
#else
#ifndef __CUDACC__
#error "cuda/ is compiled by nvcc, or by the host compiler only in the emulated build"
#endif
#define SPCONV_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                      \
    (kernel)<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#endif

#endif /* SPCONV_CUDA_LAUNCH_H */
