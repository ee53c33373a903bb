/* `spconv run` on many scans, in batches (see run_batch.h). */
#define _POSIX_C_SOURCE 200809L

#include "run_batch.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_args.h"
#include "io/pointcloud_file.h"
#include "net_args.h"

#define LIST_MAX_BYTES ((uint64_t)64 << 20)

/* ---- the inputs ------------------------------------------------------------------------------- */

static int is_dir(const char *path) {
    struct stat info;
    return stat(path, &info) == 0 && S_ISDIR(info.st_mode);
}

static int is_file(const char *path) {
    struct stat info;
    return stat(path, &info) == 0 && S_ISREG(info.st_mode);
}

static char *joined(const char *dir, const char *name) {
    size_t size = strlen(dir) + strlen(name) + 2;
    char *path = malloc(size);
    if (path != NULL) snprintf(path, size, "%s/%s", dir, name);
    return path;
}

/* A folder of voxel files (rather than a folder of scans): one of the pairs bench reads. */
static int is_voxel_folder(const char *path) {
    static const char *const marks[] = {"spconv_test_indices.i32", "indices.npy"};
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; ++i) {
        char *probe = joined(path, marks[i]);
        int found = probe != NULL && is_file(probe);
        free(probe);
        if (found) return 1;
    }
    return 0;
}

int run_is_scan_folder(const char *path) { return is_dir(path) && !is_voxel_folder(path); }

static int has_scan_extension(const char *name) {
    static const char *const extensions[] = {".bin", ".pcd", ".ply"};
    size_t len = strlen(name);
    for (size_t i = 0; i < sizeof extensions / sizeof extensions[0]; ++i)
        if (len > 4 && strcasecmp(name + len - 4, extensions[i]) == 0) return 1;
    return 0;
}

/* The output subfolder of @p path: its last component without the extension of a scan file. */
static char *item_name(const char *path, int strip_extension) {
    size_t end = strlen(path);
    while (end > 1 && path[end - 1] == '/') --end;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/') --start;
    size_t len = end - start;
    if (strip_extension) {
        for (size_t i = len; i > 1; --i) {
            if (path[start + i - 1] != '.') continue;
            len = i - 1;
            break;
        }
    }
    char *name = malloc(len + 1);
    if (name == NULL) return NULL;
    memcpy(name, path + start, len);
    name[len] = '\0';
    return name;
}

static int add_item(const char *cmd, run_items *out, const char *path, int is_voxels,
                    const char *origin) {
    if (out->count == out->capacity) {
        int capacity = out->capacity ? 2 * out->capacity : 16;
        run_item *grown = realloc(out->items, (size_t)capacity * sizeof *grown);
        if (grown == NULL) return cli_error(cmd, "out of memory for %d inputs", capacity);
        out->items = grown;
        out->capacity = capacity;
    }
    run_item *item = &out->items[out->count];
    item->path = malloc(strlen(path) + 1);
    item->name = item_name(path, !is_voxels && !is_dir(path));
    item->is_voxels = is_voxels;
    if (item->path == NULL || item->name == NULL) {
        free(item->path);
        free(item->name);
        return cli_error(cmd, "out of memory");
    }
    strcpy(item->path, path);
    ++out->count;
    if (item->name[0] == '\0' || strcmp(item->name, ".") == 0 || strcmp(item->name, "..") == 0)
        return cli_error(cmd, "%s'%s': its name gives no output folder name", origin, path);
    return 0;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The scans of folder @p dir, in name order. */
static int add_folder(const char *cmd, run_items *out, const char *dir, const char *origin) {
    DIR *d = opendir(dir);
    if (d == NULL) return cli_error(cmd, "%scannot read folder '%s': %s", origin, dir,
                                    strerror(errno));
    char **names = NULL;
    int count = 0, capacity = 0, rc = 0;
    for (struct dirent *e = readdir(d); rc == 0 && e != NULL; e = readdir(d)) {
        if (e->d_name[0] == '.' || !has_scan_extension(e->d_name)) continue;
        char *path = joined(dir, e->d_name);
        if (path != NULL && !is_file(path)) {
            free(path);
            continue;
        }
        if (path != NULL && count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            char **grown = realloc(names, (size_t)capacity * sizeof *grown);
            if (grown == NULL) free(path), path = NULL;
            else names = grown;
        }
        if (path == NULL) rc = cli_error(cmd, "out of memory");
        else names[count++] = path;
    }
    closedir(d);
    if (rc == 0 && count == 0)
        rc = cli_error(cmd, "%sfolder '%s' holds no .bin, .pcd or .ply file (nor voxel files: "
                       "indices.npy or spconv_test_indices.i32)", origin, dir);
    if (rc == 0) qsort(names, (size_t)count, sizeof *names, compare_names);
    for (int i = 0; i < count; ++i) {
        if (rc == 0) rc = add_item(cmd, out, names[i], 0, origin);
        free(names[i]);
    }
    free(names);
    return rc;
}

/* One path: a scan, voxel files or a folder of scans. @p origin prefixes the messages. */
static int add_path(const char *cmd, run_items *out, const char *path, const char *origin) {
    if (is_dir(path))
        return is_voxel_folder(path) ? add_item(cmd, out, path, 1, origin)
                                     : add_folder(cmd, out, path, origin);
    if (is_file(path)) return add_item(cmd, out, path, 0, origin);
    if (net_input_is_voxels(path)) return add_item(cmd, out, path, 1, origin);
    struct stat info;
    if (stat(path, &info) != 0)
        return cli_error(cmd, "%scannot read '%s': %s", origin, path, strerror(errno));
    return cli_error(cmd, "%s'%s' is neither a regular file nor a folder", origin, path);
}

static int add_list(const char *cmd, run_items *out, const char *list) {
    char *text = NULL;
    size_t len = 0;
    spconv_status st = spconv__file_read_all("--list", list, LIST_MAX_BYTES, &text, &len);
    if (st != SPCONV_OK) return cli_error(cmd, "%s", spconv_last_error());
    if (memchr(text, '\0', len) != NULL) {
        free(text);
        return cli_error(cmd, "--list '%s': holds a NUL byte; it must be text, one path a line",
                         list);
    }
    char *base = item_name(list, 0); /* only for its length: the folder is what precedes it */
    size_t folder_len = base != NULL ? strlen(list) - strlen(base) : 0;
    while (folder_len > 1 && list[folder_len - 1] == '/') --folder_len;
    free(base);
    int rc = 0, line = 0, before = out->count;
    for (char *next = text; rc == 0 && next != NULL;) {
        char *start = next, *end = strchr(start, '\n');
        next = end != NULL ? end + 1 : NULL;
        if (end == NULL) end = start + strlen(start);
        ++line;
        while (start < end && (*start == ' ' || *start == '\t')) ++start;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) --end;
        if (start == end || *start == '#') continue;
        *end = '\0';
        char origin[4200];
        snprintf(origin, sizeof origin, "--list '%s' line %d: ", list, line);
        if (start[0] == '/' || folder_len == 0) {
            rc = add_path(cmd, out, start, origin);
            continue;
        }
        size_t size = folder_len + strlen(start) + 2;
        char *path = malloc(size);
        if (path == NULL) rc = cli_error(cmd, "out of memory");
        else snprintf(path, size, "%.*s/%s", (int)folder_len, list, start);
        if (rc == 0) rc = add_path(cmd, out, path, origin);
        free(path);
    }
    free(text);
    if (rc == 0 && out->count == before)
        rc = cli_error(cmd, "--list '%s': names no scan (blank lines and # comments only)", list);
    return rc;
}

/* By name, then in input order (the items sit in one array), so that messages are stable. */
static int compare_items(const void *a, const void *b) {
    const run_item *x = *(const run_item *const *)a, *y = *(const run_item *const *)b;
    int by_name = strcmp(x->name, y->name);
    return by_name != 0 ? by_name : (x > y) - (x < y);
}

/* Every output subfolder must be a different one. */
static int check_names(const char *cmd, const run_items *items) {
    const run_item **sorted = malloc((size_t)items->count * sizeof *sorted);
    if (sorted == NULL) return cli_error(cmd, "out of memory");
    for (int i = 0; i < items->count; ++i) sorted[i] = &items->items[i];
    qsort(sorted, (size_t)items->count, sizeof *sorted, compare_items);
    int rc = 0;
    for (int i = 1; rc == 0 && i < items->count; ++i)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            rc = cli_error(cmd, "'%s' and '%s' would both write into --out/%s: give the inputs "
                           "different names", sorted[i - 1]->path, sorted[i]->path,
                           sorted[i]->name);
    free(sorted);
    return rc;
}

int run_items_collect(const char *cmd, const char *const *args, int num_args, const char *list,
                      run_items *out) {
    memset(out, 0, sizeof *out);
    int rc = 0;
    for (int i = 0; rc == 0 && i < num_args; ++i) rc = add_path(cmd, out, args[i], "");
    if (rc == 0 && list != NULL) rc = add_list(cmd, out, list);
    if (rc == 0) rc = check_names(cmd, out);
    return rc;
}

void run_items_free(run_items *items) {
    for (int i = 0; i < items->count; ++i) {
        free(items->items[i].path);
        free(items->items[i].name);
    }
    free(items->items);
    memset(items, 0, sizeof *items);
}

/* ---- running ---------------------------------------------------------------------------------- */

static const char *const sparse_outputs[] = {"output.npy", "out_indices.npy", NULL};

/* What the batches add up to, for the summary line. */
typedef struct batch_totals {
    int64_t voxels;
    double read_ms, voxelize_ms, forward_ms, write_ms;
} batch_totals;

/* One batch: its inputs, the network's output and, for a sparse output, its host copies. */
typedef struct batch {
    int first, count;
    net_input *inputs;
    spconv_tensor *output;
    spconv_sparse_tensor *out_sparse;
    spconv_dtype file_dtype; /* what output.npy holds (net_file_dtype of the output's) */
    float *features; /* sparse output: [rows, channels], as f32 */
    int32_t *indices; /* [rows, 4] */
    int64_t rows, channels;
} batch;

static void batch_release(batch *b) {
    for (int j = 0; b->inputs != NULL && j < b->count; ++j) net_input_release(&b->inputs[j]);
    free(b->inputs);
    spconv_tensor_release(b->output);
    spconv_sparse_release(b->out_sparse);
    free(b->features);
    free(b->indices);
    memset(b, 0, sizeof *b);
}

static int read_inputs(const run_batch_config *c, batch *b, batch_totals *totals) {
    b->inputs = calloc((size_t)b->count, sizeof *b->inputs);
    if (b->inputs == NULL) return cli_error(c->cmd, "out of memory");
    for (int j = 0; j < b->count; ++j) {
        const run_item *item = &c->items->items[b->first + j];
        net_input *in = &b->inputs[j];
        int rc = item->is_voxels
                     ? net_input_from_voxels(c->cmd, c->ctx, c->net_name, c->zin, item->path, in)
                     : net_input_from_scan(c->cmd, c->ctx, c->net_name, c->zin, item->path, in);
        if (rc != 0) return rc;
        if (in->batch_size > 1)
            return cli_error(c->cmd, "'%s' holds batch indices up to %lld; with several inputs "
                             "each must be one scan (batch index 0)", item->path,
                             (long long)(in->batch_size - 1));
        totals->voxels += spconv_tensor_size(in->features, 0);
        totals->read_ms += in->read_ms;
        totals->voxelize_ms += in->voxelize_ms;
    }
    return 0;
}

/* The inputs of the batch as one sparse tensor: input j's rows with batch index j. */
static int concatenate(const run_batch_config *c, const batch *b, spconv_sparse_tensor **out) {
    const int64_t channels = c->zin->channels;
    int64_t rows = 0;
    for (int j = 0; j < b->count; ++j) rows += spconv_tensor_size(b->inputs[j].features, 0);
    float *features = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)channels * sizeof *features);
    int32_t *indices = malloc((size_t)(rows > 0 ? rows : 1) * 4 * sizeof *indices);
    spconv_status st = features != NULL && indices != NULL ? SPCONV_OK : SPCONV_ERR_OUT_OF_MEMORY;
    int64_t at = 0;
    for (int j = 0; st == SPCONV_OK && j < b->count; ++j) {
        const net_input *in = &b->inputs[j];
        const int64_t n = spconv_tensor_size(in->features, 0);
        if (n == 0) continue;
        st = spconv_tensor_copy_to_host(c->ctx, in->features, features + at * channels,
                                        (size_t)(n * channels) * sizeof *features);
        if (st == SPCONV_OK)
            st = spconv_tensor_copy_to_host(c->ctx, in->indices, indices + at * 4,
                                            (size_t)n * 4 * sizeof *indices);
        for (int64_t r = at; st == SPCONV_OK && r < at + n; ++r) indices[4 * r] = j;
        at += n;
    }
    spconv_tensor *f = NULL, *i = NULL;
    if (st == SPCONV_OK)
        st = spconv_tensor_from_host(c->ctx, spconv_cpu(), SPCONV_F32, 2,
                                     (const int64_t[]){rows, channels}, features, &f);
    if (st == SPCONV_OK)
        st = spconv_tensor_from_host(c->ctx, spconv_cpu(), SPCONV_I32, 2,
                                     (const int64_t[]){rows, 4}, indices, &i);
    spconv_tensor *typed = NULL;
    if (st == SPCONV_OK) st = spconv_tensor_to_dtype(c->ctx, f, spconv_net_dtype(c->net), &typed);
    if (st == SPCONV_OK)
        st = spconv_sparse_create(typed, i, c->zin->spatial_shape, b->count, out);
    spconv_tensor_release(typed);
    spconv_tensor_release(f);
    spconv_tensor_release(i);
    free(features);
    free(indices);
    if (st != SPCONV_OK) return cli_status_error(c->cmd, st, "making the batch's input");
    return net_sparse_to_context_device(c->cmd, c->ctx, out);
}

static int forward(const run_batch_config *c, batch *b, batch_totals *totals) {
    spconv_sparse_tensor *input = NULL;
    int rc = concatenate(c, b, &input);
    if (rc != 0) return rc;
    const double start = net_now_ms();
    spconv_status st = spconv_net_forward(c->ctx, c->net, input, SPCONV_NET_INFERENCE, &b->output,
                                          &b->out_sparse);
    if (st == SPCONV_OK) st = spconv_context_synchronize(c->ctx); /* GPU work done (cmd_bench.c) */
    totals->forward_ms += net_now_ms() - start;
    spconv_sparse_release(input);
    if (st != SPCONV_OK) return cli_status_error(c->cmd, st, "running the network");
    rc = net_outputs_to_host(c->cmd, c->ctx, &b->output, &b->out_sparse);
    if (rc != 0) return rc;
    b->file_dtype = net_file_dtype(spconv_tensor_dtype(b->output));
    if (spconv_tensor_ndim(b->output) == 4) return net_output_as(c->cmd, c->ctx, &b->output, b->file_dtype);
    /* The scans' rows are split on the host as f32 (exact for f16 and bf16 values). */
    rc = net_output_as(c->cmd, c->ctx, &b->output, SPCONV_F32);
    if (rc != 0) return rc;
    /* A sparse output is split by batch index: copy it to the host once for all its scans. */
    b->rows = spconv_tensor_size(b->output, 0);
    b->channels = spconv_tensor_size(b->output, 1);
    b->features = malloc((size_t)(b->rows > 0 ? b->rows : 1) * (size_t)b->channels *
                         sizeof *b->features);
    b->indices = malloc((size_t)(b->rows > 0 ? b->rows : 1) * 4 * sizeof *b->indices);
    st = b->features != NULL && b->indices != NULL ? SPCONV_OK : SPCONV_ERR_OUT_OF_MEMORY;
    if (st == SPCONV_OK && b->rows > 0)
        st = spconv_tensor_copy_to_host(c->ctx, b->output, b->features,
                                        (size_t)(b->rows * b->channels) * sizeof *b->features);
    if (st == SPCONV_OK && b->rows > 0)
        st = spconv_tensor_copy_to_host(c->ctx, spconv_sparse_indices(b->out_sparse), b->indices,
                                        (size_t)b->rows * 4 * sizeof *b->indices);
    return st == SPCONV_OK ? 0 : cli_status_error(c->cmd, st, "reading the output");
}

/* Scan @p j's rows of a sparse output, in their order, with batch index 0. */
static spconv_status sparse_part(const run_batch_config *c, const batch *b, int j,
                                 spconv_tensor **features, spconv_tensor **indices) {
    int64_t n = 0;
    for (int64_t r = 0; r < b->rows; ++r) n += b->indices[4 * r] == j;
    float *f = malloc((size_t)(n > 0 ? n : 1) * (size_t)b->channels * sizeof *f);
    int32_t *i = malloc((size_t)(n > 0 ? n : 1) * 4 * sizeof *i);
    spconv_status st = f != NULL && i != NULL ? SPCONV_OK : SPCONV_ERR_OUT_OF_MEMORY;
    for (int64_t r = 0, at = 0; st == SPCONV_OK && r < b->rows; ++r) {
        if (b->indices[4 * r] != j) continue;
        memcpy(f + at * b->channels, b->features + r * b->channels,
               (size_t)b->channels * sizeof *f);
        memcpy(i + at * 4, b->indices + r * 4, 4 * sizeof *i);
        i[at * 4] = 0;
        ++at;
    }
    if (st == SPCONV_OK)
        st = spconv_tensor_from_host(c->ctx, spconv_cpu(), SPCONV_F32, 2,
                                     (const int64_t[]){n, b->channels}, f, features);
    if (st == SPCONV_OK)
        st = spconv_tensor_from_host(c->ctx, spconv_cpu(), SPCONV_I32, 2,
                                     (const int64_t[]){n, 4}, i, indices);
    free(f);
    free(i);
    return st;
}

/* Scan j's outputs into its folder, under temporary names until the final commit. */
static int write_part(const run_batch_config *c, const batch *b, int j, cli_outdir *od) {
    const run_item *item = &c->items->items[b->first + j];
    char *dir = joined(c->out_dir, item->name);
    if (dir == NULL) return cli_error(c->cmd, "out of memory");
    int rc = cli_outdir_open(od, c->cmd, dir);
    free(dir);
    spconv_tensor *features = NULL, *indices = NULL;
    spconv_status st = SPCONV_OK;
    if (rc == 0 && b->indices == NULL) {
        st = spconv_tensor_narrow(b->output, 0, j, 1, &features);
    } else if (rc == 0) {
        st = sparse_part(c, b, j, &features, &indices);
    }
    if (rc == 0 && st != SPCONV_OK) rc = cli_status_error(c->cmd, st, "splitting the output");
    if (rc == 0) rc = net_output_as(c->cmd, c->ctx, &features, b->file_dtype);
    if (rc == 0) rc = cli_outdir_write_npy(od, c->ctx, "output.npy", features);
    if (rc == 0 && indices != NULL)
        rc = cli_outdir_write_npy(od, c->ctx, "out_indices.npy", indices);
    spconv_tensor_release(features);
    spconv_tensor_release(indices);
    return rc;
}

/* ---- progress and report ---------------------------------------------------------------------- */

#define BAR_WIDTH 30

static void show_progress(const run_batch_config *c, int tty, int done, int batch_index,
                          int batches, double elapsed_ms) {
    const int total = c->items->count;
    const double rate = elapsed_ms > 0.0 ? done * 1e3 / elapsed_ms : 0.0;
    if (!tty) {
        fprintf(stderr, "spconv %s: progress: %d/%d scans (batch %d/%d), %.2f scans/s\n", c->cmd,
                done, total, batch_index + 1, batches, rate);
        return;
    }
    char bar[BAR_WIDTH + 1];
    const int filled = (int)((int64_t)done * BAR_WIDTH / total);
    for (int i = 0; i < BAR_WIDTH; ++i) bar[i] = i < filled ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    fprintf(stderr, "\r\033[Kspconv %s: progress: [%s] %d/%d scans, %.2f scans/s", c->cmd, bar,
            done, total, rate);
    if (done == total) fprintf(stderr, "\r\033[K");
    fflush(stderr);
}

static void print_batch(const run_batch_config *c, const batch *b, int index, int batches,
                        int64_t voxels, double forward_ms) {
    const run_item *items = c->items->items;
    printf("batch %d/%d: scans %d-%d (%s .. %s): %lld voxels, forward %.1f ms\n", index + 1,
           batches, b->first + 1, b->first + b->count, items[b->first].name,
           items[b->first + b->count - 1].name, (long long)voxels, forward_ms);
}

static void print_totals(const run_batch_config *c, int batches, const batch_totals *t,
                         double all_ms, int dense) {
    const int n = c->items->count;
    printf("%s: %d scans in %d batches of up to %lld: %lld voxels; %.2f s in all (read %.2f s, "
           "voxelize %.2f s, forward %.2f s, write %.2f s): %.2f scans/s, forward alone %.2f "
           "scans/s\n",
           c->net_name, n, batches, (long long)c->batch_size, (long long)t->voxels, all_ms * 1e-3,
           t->read_ms * 1e-3, t->voxelize_ms * 1e-3, t->forward_ms * 1e-3, t->write_ms * 1e-3,
           all_ms > 0.0 ? n * 1e3 / all_ms : 0.0,
           t->forward_ms > 0.0 ? n * 1e3 / t->forward_ms : 0.0);
    if (!c->quiet)
        printf("wrote %s/<scan>/output.npy%s for each of the %d scans\n", c->out_dir,
               dense ? "" : " and out_indices.npy", n);
}

/* ---- the batches ------------------------------------------------------------------------------ */

/* The signal that asked the run to stop (0: none). The one piece of global state: a signal
 * handler can only set a flag. Between batches the run stops, removes what it wrote and dies
 * of that signal, so that an interrupted run of many scans leaves nothing, as one of one scan. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define NUM_STOP_SIGNALS ((int)(sizeof stop_signals / sizeof stop_signals[0]))

/* Before any work: every scan's folder can take its outputs. */
static int check_outputs(const run_batch_config *c) {
    for (int i = 0; i < c->items->count; ++i) {
        char *dir = joined(c->out_dir, c->items->items[i].name);
        if (dir == NULL) return cli_error(c->cmd, "out of memory");
        int rc = cli_outdir_check(c->cmd, dir, sparse_outputs);
        free(dir);
        if (rc != 0) return rc;
    }
    return 0;
}

static int run_all(const run_batch_config *c, cli_outdir *dirs) {
    const int n = c->items->count;
    const int batches = (int)((n + c->batch_size - 1) / c->batch_size);
    const int tty = isatty(STDERR_FILENO);
    const int show = c->progress || (tty && !c->quiet);
    batch_totals totals = {0};
    int dense = 1, rc = 0;
    const double start = net_now_ms();
    for (int index = 0; rc == 0 && index < batches && !stop_signal; ++index) {
        batch b = {.first = (int)(index * c->batch_size)};
        b.count = (int)(n - b.first < c->batch_size ? n - b.first : c->batch_size);
        const int64_t voxels_before = totals.voxels;
        const double forward_before = totals.forward_ms;
        rc = read_inputs(c, &b, &totals);
        if (rc == 0) rc = forward(c, &b, &totals);
        const double write_start = net_now_ms();
        for (int j = 0; rc == 0 && j < b.count; ++j) rc = write_part(c, &b, j, &dirs[b.first + j]);
        totals.write_ms += net_now_ms() - write_start;
        dense = dense && b.indices == NULL;
        if (rc == 0 && !c->quiet)
            print_batch(c, &b, index, batches, totals.voxels - voxels_before,
                        totals.forward_ms - forward_before);
        const int done = b.first + b.count;
        batch_release(&b);
        if (rc == 0 && show) show_progress(c, tty, done, index, batches, net_now_ms() - start);
    }
    if ((rc != 0 || stop_signal) && show && tty) fprintf(stderr, "\r\033[K");
    if (stop_signal) return CLI_EXIT_FAILURE; /* no commit; the caller dies of the signal */
    const double commit_start = net_now_ms();
    for (int i = 0; rc == 0 && i < n; ++i) rc = cli_outdir_commit(&dirs[i]);
    totals.write_ms += net_now_ms() - commit_start;
    if (rc == 0) print_totals(c, batches, &totals, net_now_ms() - start, dense);
    return rc;
}

int run_batches(const run_batch_config *c) {
    int rc = check_outputs(c);
    if (rc != 0) return rc;
    cli_outdir *dirs = calloc((size_t)c->items->count, sizeof *dirs);
    if (dirs == NULL) return cli_error(c->cmd, "out of memory");
    struct sigaction stop = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART},
                     before[NUM_STOP_SIGNALS];
    sigemptyset(&stop.sa_mask);
    for (int i = 0; i < NUM_STOP_SIGNALS; ++i) sigaction(stop_signals[i], &stop, &before[i]);
    rc = run_all(c, dirs);
    /* Innermost folders first: the last scan's folder may sit in a --out the first one made. */
    for (int i = c->items->count - 1; i >= 0; --i) cli_outdir_close(&dirs[i]);
    free(dirs);
    for (int i = 0; i < NUM_STOP_SIGNALS; ++i) sigaction(stop_signals[i], &before[i], NULL);
    if (stop_signal) raise(stop_signal);
    return rc;
}
