/* Strided copy (with dtype conversion) and fill on the GPU: one thread per destination element in
 * a grid-stride loop, offsets from strided_index.h, conversions from tensor/convert.h, so the
 * results are bit for bit those of the CPU backend. */
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "cuda_check.h"
#include "cuda_common.h"
#include "strided_index.h"
#include "tensor/convert.h"
#include "tensor/tensor_impl.h"

/* The storage type of one element of each dtype. Floating elements are held as their bits:
 * convert.h reads values out of them itself, and a copy between equal dtypes must move bits
 * without any floating-point instruction in between. */
template <spconv_dtype Dtype> struct element;
template <> struct element<SPCONV_F16> { typedef uint16_t type; };
template <> struct element<SPCONV_BF16> { typedef uint16_t type; };
template <> struct element<SPCONV_F32> { typedef uint32_t type; };
template <> struct element<SPCONV_F64> { typedef uint64_t type; };
template <> struct element<SPCONV_I32> { typedef int32_t type; };
template <> struct element<SPCONV_I64> { typedef int64_t type; };
template <> struct element<SPCONV_U8> { typedef uint8_t type; };

/* Elements are loaded and stored through typed (so aligned, full-width) pointers; the conversion
 * runs on local copies, where convert.h's memcpy calls become register moves. Equal dtypes are
 * copied as bits, as the CPU backend does (a trip through the conversion would quiet a
 * signalling NaN). */
template <spconv_dtype Dst, spconv_dtype Src>
__global__ void copy_strided_kernel(typename element<Dst>::type *__restrict__ dst,
                                    const typename element<Src>::type *__restrict__ src,
                                    spconv__strided_pair pair, int64_t numel) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += step) {
        int64_t dst_offset, src_offset;
        spconv__strided_pair_offsets(&pair, i, &dst_offset, &src_offset);
        typename element<Src>::type in = src[src_offset];
        typename element<Dst>::type out;
        if constexpr (Dst == Src)
            out = in;
        else
            spconv__convert_element(&out, Dst, &in, Src);
        dst[dst_offset] = out;
    }
}

/* The fill value arrives already converted (on the host, by convert.h), as the element's bits. */
template <typename Bits>
__global__ void fill_kernel(Bits *__restrict__ dst, Bits value, spconv__strided_pair pair,
                            int64_t numel) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += step) {
        int64_t dst_offset, unused_offset;
        spconv__strided_pair_offsets(&pair, i, &dst_offset, &unused_offset);
        dst[dst_offset] = value;
    }
}

/* One launch: where it goes and over what. */
typedef struct launch_shape {
    cudaStream_t stream;
    int blocks;
    spconv__strided_pair pair;
    int64_t numel;
} launch_shape;

static spconv_status launch_shape_init(launch_shape *shape, spconv_context *ctx,
                                       const spconv_tensor *dst, const int64_t *src_strides) {
    int resident = 0;
    SPCONV_FORWARD_IF_ERROR(
        spconv__cuda_resident_blocks(SPCONV_CUDA_ELEMENTWISE_THREADS, &resident));
    shape->stream = spconv__cuda_stream_for(ctx, dst->storage->device.index);
    shape->numel = dst->numel;
    shape->blocks = spconv__grid_blocks(dst->numel, SPCONV_CUDA_ELEMENTWISE_THREADS, resident);
    spconv__strided_pair_init(&shape->pair, dst->ndim, dst->sizes, dst->strides, src_strides);
    return SPCONV_OK;
}

/* The kernels access elements through typed pointers, and a misaligned one is a device fault
 * that breaks the whole CUDA context. Only caller memory could be misaligned (cudaMalloc aligns
 * to 256 bytes), and spconv_tensor_wrap / spconv_tensor_from_storage refuse it on a device
 * (create.c) for every op; this check stays as the copy's and fill's own guard. */
static spconv_status check_aligned(const char *func, const char *role, const spconv_tensor *t) {
    size_t element = spconv__tensor_element_size(t);
    const void *data = spconv_tensor_data(t);
    SPCONV_RETURN_ERROR_IF((uintptr_t)data % element != 0, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the %s's first element at %p is not aligned to its %zu-byte %s "
                           "elements, which the GPU cannot load",
                           func, role, data, element, spconv_dtype_name(t->dtype));
    return SPCONV_OK;
}

/* ---- strided copy ---------------------------------------------------------------------------- */

template <spconv_dtype Dst, spconv_dtype Src>
static spconv_status launch_copy(const launch_shape *shape, void *dst, const void *src) {
    SPCONV_CUDA_LAUNCH((copy_strided_kernel<Dst, Src>), shape->blocks,
                       SPCONV_CUDA_ELEMENTWISE_THREADS, 0, shape->stream,
                       (typename element<Dst>::type *)dst,
                       (const typename element<Src>::type *)src, shape->pair, shape->numel);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

template <spconv_dtype Dst>
static spconv_status launch_copy_from(spconv_dtype src_dtype, const launch_shape *shape, void *dst,
                                      const void *src) {
    switch (src_dtype) {
    case SPCONV_F16: return launch_copy<Dst, SPCONV_F16>(shape, dst, src);
    case SPCONV_BF16: return launch_copy<Dst, SPCONV_BF16>(shape, dst, src);
    case SPCONV_F32: return launch_copy<Dst, SPCONV_F32>(shape, dst, src);
    case SPCONV_F64: return launch_copy<Dst, SPCONV_F64>(shape, dst, src);
    case SPCONV_I32: return launch_copy<Dst, SPCONV_I32>(shape, dst, src);
    case SPCONV_I64: return launch_copy<Dst, SPCONV_I64>(shape, dst, src);
    case SPCONV_U8: return launch_copy<Dst, SPCONV_U8>(shape, dst, src);
    }
    return spconv__error(SPCONV_ERR_INTERNAL, "cuda copy_strided: source dtype %d is not a dtype",
                         (int)src_dtype);
}

static spconv_status launch_copy_to(spconv_dtype dst_dtype, spconv_dtype src_dtype,
                                    const launch_shape *shape, void *dst, const void *src) {
    switch (dst_dtype) {
    case SPCONV_F16: return launch_copy_from<SPCONV_F16>(src_dtype, shape, dst, src);
    case SPCONV_BF16: return launch_copy_from<SPCONV_BF16>(src_dtype, shape, dst, src);
    case SPCONV_F32: return launch_copy_from<SPCONV_F32>(src_dtype, shape, dst, src);
    case SPCONV_F64: return launch_copy_from<SPCONV_F64>(src_dtype, shape, dst, src);
    case SPCONV_I32: return launch_copy_from<SPCONV_I32>(src_dtype, shape, dst, src);
    case SPCONV_I64: return launch_copy_from<SPCONV_I64>(src_dtype, shape, dst, src);
    case SPCONV_U8: return launch_copy_from<SPCONV_U8>(src_dtype, shape, dst, src);
    }
    return spconv__error(SPCONV_ERR_INTERNAL,
                         "cuda copy_strided: destination dtype %d is not a dtype", (int)dst_dtype);
}

spconv_status spconv__cuda_copy_strided(spconv_context *ctx, spconv_tensor *dst,
                                        const spconv_tensor *src) {
    if (dst->numel == 0) return SPCONV_OK;
    spconv_device dst_device = dst->storage->device, src_device = src->storage->device;
    SPCONV_RETURN_ERROR_IF(src_device.type != SPCONV_DEVICE_CUDA ||
                               src_device.index != dst_device.index,
                           SPCONV_ERR_DEVICE_MISMATCH,
                           "cuda copy_strided: the source is not on CUDA device %d, where the "
                           "destination is",
                           dst_device.index);
    SPCONV_FORWARD_IF_ERROR(check_aligned("spconv_tensor_copy_", "destination", dst));
    SPCONV_FORWARD_IF_ERROR(check_aligned("spconv_tensor_copy_", "source", src));
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(dst_device.index));
    launch_shape shape;
    SPCONV_FORWARD_IF_ERROR(launch_shape_init(&shape, ctx, dst, src->strides));
    /* Equal dtypes over two dense, identically ordered ranges: the copy engine does it. */
    if (dst->dtype == src->dtype && shape.pair.ndim == 1 && shape.pair.strides[0][0] == 1 &&
        shape.pair.strides[1][0] == 1) {
        CUDA_TRY(cudaMemcpyAsync(spconv_tensor_data(dst), spconv_tensor_data(src),
                                 (size_t)dst->numel * spconv__tensor_element_size(dst),
                                 cudaMemcpyDeviceToDevice, shape.stream));
        return SPCONV_OK;
    }
    return launch_copy_to(dst->dtype, src->dtype, &shape, spconv_tensor_data(dst),
                          spconv_tensor_data(src));
}

/* ---- fill ------------------------------------------------------------------------------------ */

template <typename Bits>
static spconv_status launch_fill(const launch_shape *shape, void *dst, const void *value) {
    Bits bits;
    memcpy(&bits, value, sizeof bits);
    SPCONV_CUDA_LAUNCH(fill_kernel<Bits>, shape->blocks, SPCONV_CUDA_ELEMENTWISE_THREADS, 0,
                       shape->stream, (Bits *)dst, bits, shape->pair, shape->numel);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

spconv_status spconv__cuda_fill(spconv_context *ctx, spconv_tensor *dst, double value) {
    if (dst->numel == 0) return SPCONV_OK;
    SPCONV_FORWARD_IF_ERROR(check_aligned("spconv_tensor_fill", "tensor", dst));
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(dst->storage->device.index));
    launch_shape shape;
    SPCONV_FORWARD_IF_ERROR(launch_shape_init(&shape, ctx, dst, NULL));
    /* Converted once here, by the same function the CPU backend's fill uses. */
    unsigned char pattern[8] = {0};
    spconv__store_from_floating(pattern, dst->dtype, value);
    switch (spconv__tensor_element_size(dst)) {
    case 1: return launch_fill<uint8_t>(&shape, spconv_tensor_data(dst), pattern);
    case 2: return launch_fill<uint16_t>(&shape, spconv_tensor_data(dst), pattern);
    case 4: return launch_fill<uint32_t>(&shape, spconv_tensor_data(dst), pattern);
    case 8: return launch_fill<uint64_t>(&shape, spconv_tensor_data(dst), pattern);
    }
    return spconv__error(SPCONV_ERR_INTERNAL, "cuda fill: dtype %d has no element size",
                         (int)dst->dtype);
}
