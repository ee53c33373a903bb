/* bench_rulebook_memory: peak memory and time of rulebook builds whose kernel is large against
 * the work they do, each in a child process so that its peak resident set (ru_maxrss) is its own:
 *  - regular, kernel 255, stride 255, on 5 sites of spatial shape [255, 1600, 1600] (5 pairs);
 *  - submanifold, kernel 255, on the same 5 sites;
 *  - submanifold, kernel 15, on spconv's benchmark input (125,562 sites of
 *    DATA_DIR/spconv_test_indices.i32, shape [80, 1600, 1600]; skipped without the data).
 *   bench_rulebook_memory [--threads T] [DATA_DIR]
 * DATA_DIR defaults to $SPCONV_DATA_DIR, then ../shared/data. A benchmark: it asserts nothing. */
#define _DEFAULT_SOURCE /* wait4 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spconv/spconv.h"

#define BENCH_SITES 125562

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

typedef struct build_case {
    const char *name;
    spconv_conv_kind kind;
    int64_t kernel, stride;
    int64_t shape[3];
    int use_data;
} build_case;

/* Five sites spread over [255, 1600, 1600], each alone in its 255^3 block. */
static const int32_t few_sites[5][4] = {
    {0, 3, 10, 20}, {0, 100, 400, 300}, {0, 200, 900, 1500}, {0, 254, 1400, 700}, {0, 128, 1200, 1100}};

/* Runs in the child: one build; prints its time and size. */
static int run_case(const build_case *c, int threads, const char *data_dir) {
    int32_t *rows = NULL;
    int64_t n = 5;
    if (c->use_data) {
        char path[4096];
        snprintf(path, sizeof path, "%s/spconv_test_indices.i32", data_dir);
        FILE *f = fopen(path, "rb");
        rows = malloc((size_t)BENCH_SITES * 4 * sizeof *rows);
        if (f == NULL || rows == NULL ||
            fread(rows, 4 * sizeof *rows, BENCH_SITES, f) != BENCH_SITES) {
            printf("%-40s skipped: cannot read %s\n", c->name, path);
            return 0;
        }
        fclose(f);
        n = BENCH_SITES;
    }
    spconv_context *ctx;
    spconv_tensor *indices;
    if (spconv_context_create(spconv_cpu(), &ctx) != SPCONV_OK ||
        (threads > 0 && spconv_context_set_num_threads(ctx, threads) != SPCONV_OK) ||
        spconv_tensor_wrap(spconv_cpu(), SPCONV_I32, 2, (const int64_t[]){n, 4}, NULL,
                           rows != NULL ? (void *)rows : (void *)few_sites, NULL, NULL,
                           &indices) != SPCONV_OK) {
        printf("%-40s failed: %s\n", c->name, spconv_last_error());
        return 1;
    }
    spconv_conv_params params = spconv_conv_params_default(c->kind);
    for (int a = 0; a < 3; ++a) {
        params.kernel[a] = c->kernel;
        params.stride[a] = c->stride;
    }
    spconv_rulebook *rb;
    const double t0 = now_ms();
    const spconv_status st = spconv_rulebook_build(ctx, indices, c->shape, 1, &params, &rb);
    const double ms = now_ms() - t0;
    if (st != SPCONV_OK) {
        printf("%-40s failed after %.0f ms: %s\n", c->name, ms, spconv_last_error());
        return 1;
    }
    printf("%-40s threads %2d %10.1f ms %12lld pairs", c->name, spconv_context_num_threads(ctx), ms,
           (long long)spconv_rulebook_num_pairs(rb));
    fflush(stdout);
    spconv_rulebook_release(rb);
    spconv_tensor_release(indices);
    spconv_context_destroy(ctx);
    free(rows);
    return 0;
}

int main(int argc, char **argv) {
    int threads = 0;
    const char *data_dir = getenv("SPCONV_DATA_DIR");
    if (data_dir == NULL) data_dir = "../shared/data";
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (argv[i][0] != '-') data_dir = argv[i];
        else {
            fprintf(stderr, "usage: bench_rulebook_memory [--threads T] [DATA_DIR]\n");
            return 2;
        }
    }
    const build_case cases[] = {
        {"regular kernel 255 stride 255, 5 sites", SPCONV_CONV_REGULAR, 255, 255, {255, 1600, 1600}, 0},
        {"subm kernel 255, 5 sites", SPCONV_CONV_SUBM, 255, 1, {255, 1600, 1600}, 0},
        {"subm kernel 15, 125,562 sites", SPCONV_CONV_SUBM, 15, 1, {80, 1600, 1600}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        fflush(stdout);
        const pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) _exit(run_case(&cases[i], threads, data_dir));
        int status;
        struct rusage usage;
        if (wait4(pid, &status, 0, &usage) != pid) {
            perror("wait4");
            return 1;
        }
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            printf("  peak RSS %8.1f MiB\n", (double)usage.ru_maxrss / 1024.0);
        else
            printf("  (child failed, peak RSS %.1f MiB)\n", (double)usage.ru_maxrss / 1024.0);
    }
    return 0;
}
