/* The rulebook cache: a short list of (key, rulebook) entries behind a mutex. A network has a few
 * dozen keys at most, so a linear search is the simplest thing that is fast enough. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "rulebook/rulebook_cache.h"
#include "rulebook/rulebook_impl.h"

typedef struct cache_entry {
    char *key;
    spconv_rulebook *rb;
} cache_entry;

struct spconv__rulebook_cache {
    int64_t refcount; /* atomic, with the orderings of tensors */
    pthread_mutex_t mutex;
    cache_entry *entries;
    size_t count, capacity;
};

spconv_status spconv__rulebook_cache_create(const char *func, spconv__rulebook_cache **out) {
    *out = NULL;
    spconv__rulebook_cache *cache = calloc(1, sizeof *cache);
    SPCONV_RETURN_ERROR_IF(cache == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for a rulebook cache", func);
    if (pthread_mutex_init(&cache->mutex, NULL) != 0) {
        free(cache);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY,
                            "%s: cannot create the rulebook cache's mutex", func);
    }
    cache->refcount = 1;
    *out = cache;
    return SPCONV_OK;
}

void spconv__rulebook_cache_retain(spconv__rulebook_cache *cache) {
    if (cache != NULL) __atomic_fetch_add(&cache->refcount, 1, __ATOMIC_RELAXED);
}

void spconv__rulebook_cache_release(spconv__rulebook_cache *cache) {
    if (cache == NULL) return;
    if (__atomic_sub_fetch(&cache->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    for (size_t e = 0; e < cache->count; ++e) {
        free(cache->entries[e].key);
        spconv_rulebook_release(cache->entries[e].rb);
    }
    free(cache->entries);
    pthread_mutex_destroy(&cache->mutex);
    free(cache);
}

void spconv__rulebook_cache_lock(spconv__rulebook_cache *cache) {
    pthread_mutex_lock(&cache->mutex);
}

void spconv__rulebook_cache_unlock(spconv__rulebook_cache *cache) {
    pthread_mutex_unlock(&cache->mutex);
}

spconv_rulebook *spconv__rulebook_cache_find(const spconv__rulebook_cache *cache, const char *key) {
    for (size_t e = 0; e < cache->count; ++e)
        if (strcmp(cache->entries[e].key, key) == 0) return cache->entries[e].rb;
    return NULL;
}

static int same_geometry(const int64_t a[3], int64_t a_batch, const int64_t b[3],
                         int64_t b_batch) {
    return a_batch == b_batch && a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

int spconv__rulebook_cache_knows_sites(const spconv__rulebook_cache *cache,
                                       const spconv_tensor *indices, const int64_t shape[3],
                                       int64_t batch_size) {
    for (size_t e = 0; e < cache->count; ++e) {
        const spconv_rulebook *rb = cache->entries[e].rb;
        if (rb->in_indices == indices &&
            same_geometry(rb->in_shape, rb->batch_size, shape, batch_size))
            return 1;
        if (rb->out_indices == indices &&
            same_geometry(rb->out_shape, rb->batch_size, shape, batch_size))
            return 1;
    }
    return 0;
}

spconv_status spconv__rulebook_cache_insert(spconv__rulebook_cache *cache, const char *func,
                                            const char *key, spconv_rulebook *rb) {
    if (cache->count == cache->capacity) {
        const size_t capacity = cache->capacity == 0 ? 8 : 2 * cache->capacity;
        cache_entry *grown = realloc(cache->entries, capacity * sizeof *grown);
        SPCONV_RETURN_ERROR_IF(grown == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                               "%s: out of host memory for the rulebook cache", func);
        cache->entries = grown;
        cache->capacity = capacity;
    }
    const size_t length = strlen(key);
    char *copy = malloc(length + 1);
    SPCONV_RETURN_ERROR_IF(copy == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for indice_key '%s'", func, key);
    memcpy(copy, key, length + 1);
    spconv_rulebook_retain(rb);
    cache->entries[cache->count++] = (cache_entry){copy, rb};
    return SPCONV_OK;
}
