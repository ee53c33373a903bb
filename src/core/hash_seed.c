/* Seeds for the hash tables (see hash_seed.h). */
#define _GNU_SOURCE /* getrandom */
#include "core/hash_seed.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

/* splitmix64's output function: turns any 64-bit state into well-mixed bits. */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Whatever differs between calls and processes when the kernel's generator is unavailable:
 * both clocks, the address of a stack variable and of this function (ASLR). Weak against someone
 * who can observe the process, but an input crafted in advance cannot know it. */
static uint64_t fallback_entropy(void) {
    struct timespec mono, real;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    uint64_t state = (uint64_t)mono.tv_nsec ^ ((uint64_t)mono.tv_sec << 30);
    uint64_t local = 0;
    state ^= splitmix64(&state) ^ (uint64_t)(uintptr_t)&local;
    state ^= splitmix64(&state) ^ (uint64_t)real.tv_nsec ^ ((uint64_t)real.tv_sec << 20);
    state ^= splitmix64(&state) ^ (uint64_t)(uintptr_t)&fallback_entropy;
    return splitmix64(&state);
}

static uint64_t fresh_entropy(void) {
    uint64_t value;
    unsigned char *bytes = (unsigned char *)&value;
    size_t have = 0;
    while (have < sizeof value) {
        const ssize_t got = getrandom(bytes + have, sizeof value - have, GRND_NONBLOCK);
        if (got > 0) {
            have += (size_t)got;
        } else if (got < 0 && errno == EINTR) {
            continue;
        } else {
            return fallback_entropy(); /* ENOSYS, or EAGAIN before the pool is initialised */
        }
    }
    return value;
}

void spconv__hash_seed_draw(spconv__hash_seed *seed) {
    const char *forced = getenv("SPCONV_HASH_SEED");
    uint64_t state;
    if (forced != NULL && *forced != '\0') {
        state = (uint64_t)strtoull(forced, NULL, 0);
    } else {
        state = fresh_entropy();
    }
    seed->salt = splitmix64(&state);
    seed->multiplier = splitmix64(&state) | 1;
}
