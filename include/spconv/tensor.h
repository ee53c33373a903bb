/**
 * @file tensor.h
 * @brief Storage and strided tensors, after PyTorch's StorageImpl / TensorImpl split.
 *
 * A storage owns (or wraps) bytes on one device. A tensor is a view of a storage: an element
 * offset, up to SPCONV_MAX_DIMS sizes and strides (both counted in elements, strides may be 0 for
 * expanded dims) and a dtype. Views share the storage of their base; a view of a view points at
 * the same storage, never at the other view.
 *
 * Ownership: every function that returns a tensor or storage through `**out` hands the caller one
 * reference; give it back with the matching _release (release of NULL is a no-op). Arguments are
 * borrowed: a function never keeps a reference to an input unless it says so (a view retains its
 * storage). On failure `*out` is left NULL and nothing is leaked.
 *
 * Thread rules: reference counting is thread-safe; concurrent writes to one storage are not.
 */
#ifndef SPCONV_TENSOR_H
#define SPCONV_TENSOR_H

#include <stdint.h>
#include <stdio.h>

#include "spconv/context.h"
#include "spconv/status.h"
#include "spconv/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPCONV_MAX_DIMS 8

typedef struct spconv_storage spconv_storage;
typedef struct spconv_tensor spconv_tensor;

/** Frees wrapped memory when its storage's last reference goes. */
typedef void (*spconv_deleter)(void *data, void *user);

/* ---- storage ------------------------------------------------------------------------------ */

/** Allocate @p nbytes on @p device (64-byte aligned on the CPU; on CUDA from the backend's
 *  stream-ordered pool, on the legacy stream; see docs/cuda.md). Contents are
 *  uninitialised. SPCONV_ERR_OUT_OF_MEMORY when the allocation fails. */
spconv_status spconv_storage_create(spconv_device device, size_t nbytes, spconv_storage **out);

/** Wrap caller memory of @p nbytes on @p device. The storage never frees @p data itself; when its
 *  last reference goes, @p deleter (if not NULL) is called with (data, user). On failure the
 *  deleter is not called: the caller still owns @p data. */
spconv_status spconv_storage_wrap(spconv_device device, void *data, size_t nbytes,
                                  spconv_deleter deleter, void *user, spconv_storage **out);

void spconv_storage_retain(spconv_storage *storage);
void spconv_storage_release(spconv_storage *storage);
void *spconv_storage_data(const spconv_storage *storage);
size_t spconv_storage_nbytes(const spconv_storage *storage);
spconv_device spconv_storage_device(const spconv_storage *storage);

/* ---- creation ----------------------------------------------------------------------------- */

/** New contiguous tensor, uninitialised. @p sizes has @p ndim entries, each >= 0; ndim may be 0
 *  (a scalar). Errors: ndim outside [0, 8], a negative size, numel * element size overflowing
 *  int64, allocation failure. */
spconv_status spconv_tensor_empty(spconv_device device, spconv_dtype dtype, int ndim,
                                  const int64_t *sizes, spconv_tensor **out);
/** New contiguous tensor filled with zeros. */
spconv_status spconv_tensor_zeros(spconv_context *ctx, spconv_device device, spconv_dtype dtype,
                                  int ndim, const int64_t *sizes, spconv_tensor **out);
/** New contiguous tensor filled with @p value (converted to @p dtype). */
spconv_status spconv_tensor_full(spconv_context *ctx, spconv_device device, spconv_dtype dtype,
                                 int ndim, const int64_t *sizes, double value,
                                 spconv_tensor **out);
/** 1-d tensor start, start+step, ... < end (> end for a negative step); step != 0. */
spconv_status spconv_tensor_arange(spconv_context *ctx, spconv_device device, spconv_dtype dtype,
                                   int64_t start, int64_t end, int64_t step, spconv_tensor **out);
/** New contiguous tensor on @p device holding a copy of @p host_data, a contiguous host array of
 *  numel elements of @p dtype. The caller keeps @p host_data. */
spconv_status spconv_tensor_from_host(spconv_context *ctx, spconv_device device,
                                      spconv_dtype dtype, int ndim, const int64_t *sizes,
                                      const void *host_data, spconv_tensor **out);
/** Tensor over caller memory @p data on @p device with the given sizes and @p strides (NULL:
 *  contiguous). The memory must cover every addressed element; @p deleter as in
 *  spconv_storage_wrap (not called on failure). Negative strides are rejected, and so is device
 *  memory not aligned to the element size (a GPU faults on such loads). */
spconv_status spconv_tensor_wrap(spconv_device device, spconv_dtype dtype, int ndim,
                                 const int64_t *sizes, const int64_t *strides, void *data,
                                 spconv_deleter deleter, void *user, spconv_tensor **out);
/** Tensor viewing @p storage from element @p offset with sizes/strides (strides NULL: contiguous);
 *  checked to stay inside the storage, and, on a device, to start aligned to the element size.
 *  The tensor retains the storage. */
spconv_status spconv_tensor_from_storage(spconv_storage *storage, int64_t offset,
                                         spconv_dtype dtype, int ndim, const int64_t *sizes,
                                         const int64_t *strides, spconv_tensor **out);

void spconv_tensor_retain(spconv_tensor *tensor);
void spconv_tensor_release(spconv_tensor *tensor);

/**
 * Hand the memory under @p tensor to the caller, when it came from the allocator hook whose free
 * function and user data are @p free_fn and @p user (spconv_context_set_allocator) and nothing
 * else uses it: @p tensor is the last reference to itself and the only tensor of its storage. On
 * success *data is the storage's first byte and *nbytes its size, @p tensor is released (read its
 * sizes, strides and data pointer first), and the library never calls free_fn for that memory:
 * the caller frees it, with free_fn(data, nbytes, device, user) or through the allocator behind
 * it. A framework whose allocator made the memory can so give it to its own tensor type (the
 * PyTorch binding does, so that Tensor.record_stream reaches engine outputs).
 * Otherwise SPCONV_ERR_INVALID_ARGUMENT says why (another reference, a shared storage, memory of
 * another allocator, of the library's own (the CUDA backend's pool among them) or wrapped memory)
 * and @p tensor is left as it was; NULL tensor, free_fn, data or nbytes is SPCONV_ERR_NULL_POINTER.
 */
spconv_status spconv_tensor_take_memory(spconv_tensor *tensor, spconv_free_fn free_fn, void *user,
                                        void **data, size_t *nbytes);

/* ---- properties (cheap; the tensor must not be NULL) --------------------------------------- */

int spconv_tensor_ndim(const spconv_tensor *t);
/** Size of dim @p dim; negative dims count from the end; 0 for a dim out of range. */
int64_t spconv_tensor_size(const spconv_tensor *t, int dim);
int64_t spconv_tensor_stride(const spconv_tensor *t, int dim);
const int64_t *spconv_tensor_sizes(const spconv_tensor *t);   /**< ndim entries */
const int64_t *spconv_tensor_strides(const spconv_tensor *t); /**< ndim entries, in elements */
int64_t spconv_tensor_numel(const spconv_tensor *t);
int64_t spconv_tensor_offset(const spconv_tensor *t); /**< element offset into the storage */
spconv_dtype spconv_tensor_dtype(const spconv_tensor *t);
spconv_device spconv_tensor_device(const spconv_tensor *t);
spconv_storage *spconv_tensor_storage(const spconv_tensor *t); /**< borrowed */
/** 1 when elements are laid out row-major without gaps (sizes of 1 and empty tensors count). */
int spconv_tensor_is_contiguous(const spconv_tensor *t);
/** Address of element (0, ..., 0) on the tensor's device. */
void *spconv_tensor_data(const spconv_tensor *t);

/* ---- views: share the storage, return a new tensor handle ---------------------------------- */

/** Elements start .. start+length-1 of dim @p dim. */
spconv_status spconv_tensor_narrow(const spconv_tensor *t, int dim, int64_t start,
                                   int64_t length, spconv_tensor **out);
/** Python-style t[start:end:step] along @p dim with step >= 1; start/end are clamped to the size
 *  after negative ones are counted from the end, as Python does. */
spconv_status spconv_tensor_slice(const spconv_tensor *t, int dim, int64_t start, int64_t end,
                                  int64_t step, spconv_tensor **out);
/** Drop dim @p dim, keeping index @p index (negative counts from the end). */
spconv_status spconv_tensor_select(const spconv_tensor *t, int dim, int64_t index,
                                   spconv_tensor **out);
/** Reorder dims: out dim i is input dim dims[i]; @p dims is a permutation of 0..ndim-1. */
spconv_status spconv_tensor_permute(const spconv_tensor *t, const int *dims, spconv_tensor **out);
spconv_status spconv_tensor_transpose(const spconv_tensor *t, int dim0, int dim1,
                                      spconv_tensor **out);
/** Same elements with new sizes (one may be -1, inferred), without copying; fails with
 *  SPCONV_ERR_INVALID_ARGUMENT when the strides do not allow it (use reshape). */
spconv_status spconv_tensor_view(const spconv_tensor *t, int ndim, const int64_t *sizes,
                                 spconv_tensor **out);
/** As view when the strides allow, otherwise a contiguous copy. */
spconv_status spconv_tensor_reshape(spconv_context *ctx, const spconv_tensor *t, int ndim,
                                    const int64_t *sizes, spconv_tensor **out);
/** Remove dim @p dim if its size is 1 (otherwise a plain new handle); dim = SPCONV_ALL_DIMS
 *  removes every dim of size 1. */
#define SPCONV_ALL_DIMS (-1000)
spconv_status spconv_tensor_squeeze(const spconv_tensor *t, int dim, spconv_tensor **out);
/** Insert a dim of size 1 before dim @p dim (0..ndim; negative counts from ndim+1). */
spconv_status spconv_tensor_unsqueeze(const spconv_tensor *t, int dim, spconv_tensor **out);
/** Broadcast to @p sizes (ndim >= t's ndim, new dims in front); dims of size 1 get stride 0;
 *  -1 keeps a size. */
spconv_status spconv_tensor_expand(const spconv_tensor *t, int ndim, const int64_t *sizes,
                                   spconv_tensor **out);

/* ---- copies ------------------------------------------------------------------------------- */

/** Copy @p src into @p dst element-wise: same shape, any layouts, any dtypes (converted; floats to
 *  integers truncate toward zero), any devices. @p dst must not be an expanded (stride-0) view
 *  and must not overlap @p src unless they are the same view. */
spconv_status spconv_tensor_copy_(spconv_context *ctx, spconv_tensor *dst, const spconv_tensor *src);
/** @p t itself (one more reference) when contiguous, otherwise a contiguous copy. */
spconv_status spconv_tensor_contiguous(spconv_context *ctx, const spconv_tensor *t,
                                       spconv_tensor **out);
/** Always a new contiguous copy on the same device. */
spconv_status spconv_tensor_clone(spconv_context *ctx, const spconv_tensor *t, spconv_tensor **out);
/** A contiguous copy on @p device (a new reference to @p t if already there and contiguous). */
spconv_status spconv_tensor_to_device(spconv_context *ctx, const spconv_tensor *t,
                                      spconv_device device, spconv_tensor **out);
/** A contiguous copy converted to @p dtype (a new reference to @p t if already so). */
spconv_status spconv_tensor_to_dtype(spconv_context *ctx, const spconv_tensor *t,
                                     spconv_dtype dtype, spconv_tensor **out);
/** Set every element of @p t to @p value (converted to its dtype). */
spconv_status spconv_tensor_fill(spconv_context *ctx, spconv_tensor *t, double value);
/** Copy all elements, in row-major order, into the host buffer @p dst of @p nbytes bytes (must be
 *  numel * element size). Works from any device and layout. */
spconv_status spconv_tensor_copy_to_host(spconv_context *ctx, const spconv_tensor *t, void *dst,
                                         size_t nbytes);

/* ---- debugging ---------------------------------------------------------------------------- */

/** One line: "tensor f32 cpu [2, 3] strides [3, 1] offset 0 contiguous". */
void spconv_tensor_describe(const spconv_tensor *t, char *buf, size_t buflen);
/** Describe, then up to @p max_elements values in nested brackets (any device). */
spconv_status spconv_tensor_print(spconv_context *ctx, const spconv_tensor *t, FILE *stream,
                                  int64_t max_elements);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_TENSOR_H */
