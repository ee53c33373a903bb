/* Tensors: a strided view of a storage; reference counting, cached facts and properties. */
#include <stdlib.h>

#include "core/error.h"
#include "tensor/geometry.h"
#include "tensor/tensor_impl.h"

size_t spconv__tensor_element_size(const spconv_tensor *t) { return spconv_dtype_size(t->dtype); }

void spconv__tensor_update_cache(spconv_tensor *t) {
    int64_t numel = 1, expected_stride = 1;
    int contiguous = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
        numel *= t->sizes[i];
        /* A dim of size 1 is never stepped over, so its stride does not matter. */
        if (t->sizes[i] != 1 && t->strides[i] != expected_stride) contiguous = 0;
        expected_stride *= t->sizes[i];
    }
    t->numel = numel;
    t->is_contiguous = contiguous || numel == 0;
}

spconv_status spconv__tensor_make(spconv_storage *storage, int64_t offset, spconv_dtype dtype,
                                  int ndim, const int64_t *sizes, const int64_t *strides,
                                  spconv_tensor **out) {
    *out = NULL;
    spconv_tensor *t = calloc(1, sizeof *t);
    SPCONV_RETURN_ERROR_IF(t == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "spconv tensor: out of host memory for a tensor header");
    t->refcount = 1;
    t->storage = storage;
    spconv_storage_retain(storage);
    t->offset = offset;
    t->ndim = ndim;
    t->dtype = dtype;
    for (int i = 0; i < ndim; ++i) t->sizes[i] = sizes[i];
    if (strides != NULL) {
        for (int i = 0; i < ndim; ++i) t->strides[i] = strides[i];
    } else {
        spconv__contiguous_strides(ndim, sizes, t->strides);
    }
    spconv__tensor_update_cache(t);
    *out = t;
    return SPCONV_OK;
}

/* Same orderings as the storage's count, for the same reasons (see storage.c). */
void spconv_tensor_retain(spconv_tensor *tensor) {
    if (tensor != NULL) __atomic_fetch_add(&tensor->refcount, 1, __ATOMIC_RELAXED);
}

void spconv_tensor_release(spconv_tensor *tensor) {
    if (tensor == NULL) return;
    if (__atomic_sub_fetch(&tensor->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    spconv_storage_release(tensor->storage);
    free(tensor);
}

int spconv_tensor_ndim(const spconv_tensor *t) { return t->ndim; }

int64_t spconv_tensor_size(const spconv_tensor *t, int dim) {
    if (dim < 0) dim += t->ndim;
    return dim >= 0 && dim < t->ndim ? t->sizes[dim] : 0;
}

int64_t spconv_tensor_stride(const spconv_tensor *t, int dim) {
    if (dim < 0) dim += t->ndim;
    return dim >= 0 && dim < t->ndim ? t->strides[dim] : 0;
}

const int64_t *spconv_tensor_sizes(const spconv_tensor *t) { return t->sizes; }

const int64_t *spconv_tensor_strides(const spconv_tensor *t) { return t->strides; }

int64_t spconv_tensor_numel(const spconv_tensor *t) { return t->numel; }

int64_t spconv_tensor_offset(const spconv_tensor *t) { return t->offset; }

spconv_dtype spconv_tensor_dtype(const spconv_tensor *t) { return t->dtype; }

spconv_device spconv_tensor_device(const spconv_tensor *t) { return t->storage->device; }

spconv_storage *spconv_tensor_storage(const spconv_tensor *t) { return t->storage; }

int spconv_tensor_is_contiguous(const spconv_tensor *t) { return t->is_contiguous; }

void *spconv_tensor_data(const spconv_tensor *t) {
    char *base = t->storage->data;
    /* Empty storages may have no memory at all; never do arithmetic on NULL. */
    return base == NULL ? NULL : base + (size_t)t->offset * spconv__tensor_element_size(t);
}
