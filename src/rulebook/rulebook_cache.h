/* The rulebook cache shared by sparse tensors derived from one another (spconv's indice_dict):
 * indice_key string -> rulebook. The rulebook records the geometry and input sites it was built
 * for, which is what reuse is checked against (sparse_rulebook.c). */
#ifndef SPCONV_RULEBOOK_CACHE_H
#define SPCONV_RULEBOOK_CACHE_H

#include "spconv/rulebook.h"

typedef struct spconv__rulebook_cache spconv__rulebook_cache;

/* An empty cache with one reference. */
spconv_status spconv__rulebook_cache_create(const char *func, spconv__rulebook_cache **out);
void spconv__rulebook_cache_retain(spconv__rulebook_cache *cache);
/* The last release drops the cache's references to its rulebooks. NULL is a no-op. */
void spconv__rulebook_cache_release(spconv__rulebook_cache *cache);

/* Find and insert must run between lock and unlock, so that a lookup and the insert that follows
 * it are one step for threads sharing the cache. */
void spconv__rulebook_cache_lock(spconv__rulebook_cache *cache);
void spconv__rulebook_cache_unlock(spconv__rulebook_cache *cache);

/* The rulebook stored under @p key (borrowed), or NULL. */
spconv_rulebook *spconv__rulebook_cache_find(const spconv__rulebook_cache *cache, const char *key);

/* 1 when a stored rulebook took @p indices (the same tensor object) as its input sites on
 * (shape, batch_size), which its build checked, or gave them as its output sites on that
 * geometry, which a build makes in range and unique. A tensor object is taken to keep its rows,
 * as the reuse of a stored rulebook takes it (sparse_rulebook.c). */
int spconv__rulebook_cache_knows_sites(const spconv__rulebook_cache *cache,
                                       const spconv_tensor *indices, const int64_t shape[3],
                                       int64_t batch_size);

/* Store @p rb (retained) under @p key, which must not be stored yet. */
spconv_status spconv__rulebook_cache_insert(spconv__rulebook_cache *cache, const char *func,
                                            const char *key, spconv_rulebook *rb);

#endif /* SPCONV_RULEBOOK_CACHE_H */
