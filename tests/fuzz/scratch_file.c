/* The scratch file of a fuzz target (see scratch_file.h). */
#define _POSIX_C_SOURCE 200809L

#include "scratch_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One path per process and extension; a harness runs one target, so this is its only state. */
static char scratch_path[256];

const char *fuzz_write_input(const char *extension, const uint8_t *data, size_t size) {
    if (scratch_path[0] == '\0') {
        const char *dir = getenv("TMPDIR");
        snprintf(scratch_path, sizeof scratch_path, "%s/spconv_fuzz_%ld%s",
                 dir != NULL && dir[0] != '\0' ? dir : "/tmp", (long)getpid(), extension);
    }
    FILE *f = fopen(scratch_path, "wb");
    if (f == NULL || (size > 0 && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        fprintf(stderr, "fuzz: cannot write %s\n", scratch_path);
        abort();
    }
    return scratch_path;
}
