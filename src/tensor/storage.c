/* Storages: reference-counted owners (or wrappers) of bytes on one device. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/backend.h"
#include "core/context_impl.h"
#include "core/error.h"
#include "tensor/tensor_impl.h"

static spconv_status storage_new(const char *func, spconv_device device, spconv_storage **out) {
    spconv_storage *storage = calloc(1, sizeof *storage);
    SPCONV_RETURN_ERROR_IF(storage == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for the storage header", func);
    storage->refcount = 1;
    storage->device = device;
    *out = storage;
    return SPCONV_OK;
}

spconv_status spconv__storage_create_in(const char *func, spconv_context *ctx,
                                        spconv_device device, size_t nbytes,
                                        spconv_storage **out) {
    *out = NULL;
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    spconv_storage *storage = NULL;
    SPCONV_FORWARD_IF_ERROR(storage_new(func, device, &storage));
    spconv__allocation memory;
    spconv_status st = spconv__context_alloc(func, ctx, device, nbytes, &memory);
    if (st != SPCONV_OK) {
        free(storage);
        return st;
    }
    storage->data = memory.data;
    storage->nbytes = nbytes;
    storage->owns_data = 1;
    storage->hook_free = memory.free_fn;
    storage->hook_user = memory.free_user;
    *out = storage;
    return SPCONV_OK;
}

spconv_status spconv__storage_create(const char *func, spconv_device device, size_t nbytes,
                                     spconv_storage **out) {
    return spconv__storage_create_in(func, NULL, device, nbytes, out);
}

spconv_status spconv_storage_create(spconv_device device, size_t nbytes, spconv_storage **out) {
    SPCONV_CHECK_NOT_NULL("spconv_storage_create", out);
    return spconv__storage_create("spconv_storage_create", device, nbytes, out);
}

spconv_status spconv_storage_wrap(spconv_device device, void *data, size_t nbytes,
                                  spconv_deleter deleter, void *user, spconv_storage **out) {
    static const char func[] = "spconv_storage_wrap";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_RETURN_ERROR_IF(data == NULL && nbytes > 0, SPCONV_ERR_NULL_POINTER,
                           "%s: 'data' is NULL with nbytes = %zu", func, nbytes);
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    spconv_storage *storage = NULL;
    SPCONV_FORWARD_IF_ERROR(storage_new(func, device, &storage));
    storage->data = data;
    storage->nbytes = nbytes;
    storage->deleter = deleter;
    storage->deleter_user = user;
    *out = storage;
    return SPCONV_OK;
}

/* Increments need no ordering: whoever retains already holds a reference, so the object cannot
 * be freed concurrently. The decrement is acq_rel so that every write made through the storage
 * by other threads happens-before the free done by the thread that drops the last reference. */
void spconv_storage_retain(spconv_storage *storage) {
    if (storage != NULL) __atomic_fetch_add(&storage->refcount, 1, __ATOMIC_RELAXED);
}

void spconv_storage_release(spconv_storage *storage) {
    if (storage == NULL) return;
    if (__atomic_sub_fetch(&storage->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (storage->owns_data) {
        const spconv__allocation memory = {.data = storage->data, .nbytes = storage->nbytes,
                                           .device = storage->device,
                                           .free_fn = storage->hook_free,
                                           .free_user = storage->hook_user};
        spconv__context_free(&memory);
    } else if (storage->deleter != NULL) {
        storage->deleter(storage->data, storage->deleter_user);
    }
    free(storage);
}

void *spconv_storage_data(const spconv_storage *storage) { return storage->data; }

size_t spconv_storage_nbytes(const spconv_storage *storage) { return storage->nbytes; }

spconv_device spconv_storage_device(const spconv_storage *storage) { return storage->device; }

spconv_status spconv_tensor_take_memory(spconv_tensor *tensor, spconv_free_fn free_fn, void *user,
                                        void **data, size_t *nbytes) {
    static const char func[] = "spconv_tensor_take_memory";
    SPCONV_CHECK_NOT_NULL(func, tensor);
    SPCONV_CHECK_NOT_NULL(func, free_fn);
    SPCONV_CHECK_NOT_NULL(func, data);
    SPCONV_CHECK_NOT_NULL(func, nbytes);
    spconv_storage *storage = tensor->storage;
    /* The caller holds a reference: nobody else can retain either object while both counts are
     * 1, so the check and the hand-over cannot race. */
    const int64_t tensor_refs = __atomic_load_n(&tensor->refcount, __ATOMIC_ACQUIRE);
    const int64_t storage_refs = __atomic_load_n(&storage->refcount, __ATOMIC_ACQUIRE);
    SPCONV_RETURN_ERROR_IF(tensor_refs != 1, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the tensor has %" PRId64 " references, not only the caller's",
                           func, tensor_refs);
    SPCONV_RETURN_ERROR_IF(storage_refs != 1, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the tensor's storage is shared (%" PRId64 " references: views or "
                           "other tensors use it)",
                           func, storage_refs);
    SPCONV_RETURN_ERROR_IF(!storage->owns_data || storage->hook_free == NULL,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the tensor's memory %s, not from an allocator hook", func,
                           storage->owns_data ? "is the library's own" : "is wrapped caller memory");
    SPCONV_RETURN_ERROR_IF(storage->hook_free != free_fn || storage->hook_user != user,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the tensor's memory came from another allocator (%s)", func,
                           storage->hook_free != free_fn
                               ? "another hook, or the CUDA backend's pool"
                               : "the same free function with other user data");
    *data = storage->data;
    *nbytes = storage->nbytes;
    storage->owns_data = 0; /* the release below frees the headers, not the memory */
    spconv_tensor_release(tensor);
    return SPCONV_OK;
}
