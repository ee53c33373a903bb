/* What `spconv run` and `spconv bench` share: the zoo names as an option's choices, the bundled
 * sample scan, a network's input read from a scan or from voxel files, and a zoo network with
 * optional weights. Functions that can fail print one line and return the exit status, as in
 * cli_args.h. */
#ifndef SPCONV_TOOLS_NET_ARGS_H
#define SPCONV_TOOLS_NET_ARGS_H

#include <stdint.h>

#include "spconv/spconv.h"

#define NET_ZOO_MAX 16

/** The zoo's names, NULL-terminated, for a CLI_CHOICE option. */
void net_zoo_choices(const char *names[NET_ZOO_MAX + 1]);

/** The bundled sample scan: $SPCONV_SAMPLE_SCAN when set, else data/sample_scan.bin of the
 *  source tree this tool was built from. An error naming both when the file is not there. */
int net_sample_scan(const char *cmd, const char **path);

/** The input of a network, kept as the features and indices that a fresh sparse tensor is made
 *  from for every pass (a fresh tensor has an empty rulebook cache: every pass builds its
 *  rulebooks, as spconv's benchmark counts them). */
typedef struct net_input {
    spconv_point_cloud *cloud;   /* the scan; NULL for voxel files */
    spconv_tensor *features;     /* float32 [N, C] */
    spconv_tensor *indices;      /* int32 [N, 4] (batch, z, y, x) */
    int64_t spatial_shape[3];    /* D, H, W */
    int64_t batch_size;
    spconv_voxelize_stats stats; /* how the scan's points went into voxels (zero for files) */
    double read_ms;
    double voxelize_ms;
} net_input;

/** Read the scan @p path (.bin, .pcd, .ply) and voxelize it as @p zin (of zoo network @p net,
 *  named in messages) says. */
int net_input_from_scan(const char *cmd, spconv_context *ctx, const char *net,
                        const spconv_net_input *zin, const char *path, net_input *out);

/** 1 when @p path names voxel files rather than a scan: a folder, or a prefix P with
 *  P_indices.i32 beside it. */
int net_input_is_voxels(const char *path);

/**
 * Voxels from files, on the spatial shape of @p zin, with zin->channels feature channels:
 *  - a folder with spconv_test_indices.i32 + spconv_test_features.f32 (raw little-endian int32
 *    [N, 4] rows (batch, z, y, x) and float32 [N, C]: spconv's bench_basic input), or else with
 *    indices.npy (int32/int64 [N, 4]) + features.npy (floating [N, C]);
 *  - a prefix P with P_indices.i32 + P_features.f32.
 * Every row is checked (in range, unique) before use.
 */
int net_input_from_voxels(const char *cmd, spconv_context *ctx, const char *net,
                          const spconv_net_input *zin, const char *path, net_input *out);

/** Replace the input by @p copies copies of it, copy c holding batch entries
 *  [c * batch_size, (c + 1) * batch_size) (as spconv's large benchmark scales its input). */
int net_input_replicate(const char *cmd, net_input *in, int64_t copies);

/** A new sparse tensor over the input's features (converted to @p dtype) and indices, with an
 *  empty rulebook cache. */
int net_input_sparse(const char *cmd, spconv_context *ctx, const net_input *in, spconv_dtype dtype,
                     spconv_sparse_tensor **out);

/** --dtype: the choices (NULL-terminated) and the dtype of choice @p index. */
extern const char *const net_dtype_names[];
spconv_dtype net_dtype_of(int index);

/** The dtype a network's output of @p dtype is written in: its own, or f32 for bf16 (.npy has
 *  no bf16; every bf16 value is an f32 value). */
spconv_dtype net_file_dtype(spconv_dtype dtype);

/** Replace @p *t by its conversion to @p dtype (nothing to do when it has it). */
int net_output_as(const char *cmd, spconv_context *ctx, spconv_tensor **t, spconv_dtype dtype);

/** The sparse tensor @p *in on the device of @p ctx (replaced; nothing to do on the CPU). */
int net_sparse_to_context_device(const char *cmd, spconv_context *ctx, spconv_sparse_tensor **in);

/** A network's outputs copied to the host where the network ran on a device (replaced; nothing
 *  to do on the CPU), for the writers and the picture. @p out_sparse may be NULL. */
int net_outputs_to_host(const char *cmd, spconv_context *ctx, spconv_tensor **output,
                        spconv_sparse_tensor **out_sparse);

/** Release what the input holds; a zeroed struct is a no-op. */
void net_input_release(net_input *in);

/** Zoo network @p name in @p dtype initialised from @p seed, then loaded from @p weights_dir when
 *  that is not NULL (every parameter "<name>.npy" in @p layout). Destroy *out also after a
 *  failure (it may hold the network whose weights did not load). On a context of a device other
 *  than the CPU the parameters are kept there (spconv_net_keep_on_device). */
int net_build(const char *cmd, spconv_context *ctx, const char *name, spconv_dtype dtype,
              uint64_t seed, const char *weights_dir, spconv_net_layout layout, spconv_net **out);

/** Wall-clock milliseconds on a monotonic clock. */
double net_now_ms(void);

#endif /* SPCONV_TOOLS_NET_ARGS_H */
