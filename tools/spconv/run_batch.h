/* `spconv run` on many scans (run_batch.c): the list of inputs made from files, folders and list
 * files, and the batches they run in. Functions that can fail print one line and return the exit
 * status, as in cli_args.h. */
#ifndef SPCONV_TOOLS_RUN_BATCH_H
#define SPCONV_TOOLS_RUN_BATCH_H

#include <stdint.h>

#include "spconv/spconv.h"

/* One input: a scan file, or voxel files (a folder or a prefix, as net_input_from_voxels). */
typedef struct run_item {
    char *path;
    char *name; /* its output subfolder: the file name without its extension */
    int is_voxels;
} run_item;

typedef struct run_items {
    run_item *items;
    int count;
    int capacity;
} run_items;

/**
 * The inputs named by @p args (each a scan file, a voxel folder or prefix, or a folder whose
 * .bin, .pcd and .ply files are taken in name order) and by the lines of the list file @p list
 * (NULL: none; one path per line, relative to the list's folder; blank lines and lines starting
 * with '#' skipped), in that order. Two inputs with one name are refused: each gets its own
 * output subfolder.
 */
int run_items_collect(const char *cmd, const char *const *args, int num_args, const char *list,
                      run_items *out);

void run_items_free(run_items *items);

/** 1 when @p path is a folder of scans: a folder without the voxel files bench reads. */
int run_is_scan_folder(const char *path);

typedef struct run_batch_config {
    const char *cmd;
    spconv_context *ctx;
    spconv_net *net;
    const char *net_name;
    const spconv_net_input *zin;
    const run_items *items;
    int64_t batch_size;
    const char *out_dir;
    int quiet;
    int progress; /* 1: a progress line per batch on stderr even off a terminal */
} run_batch_config;

/**
 * Run the network on the items, @p batch_size at a time: the scans of a batch become one sparse
 * tensor, scan j of the batch with batch index j, and each scan's part of the output is written
 * to OUT/<name>/output.npy (and out_indices.npy for a sparse output, batch index 0), as a run on
 * that scan alone writes it. Every file appears only when all the scans ran.
 */
int run_batches(const run_batch_config *config);

#endif /* SPCONV_TOOLS_RUN_BATCH_H */
