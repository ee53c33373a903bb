/* What `spconv run` and `spconv bench` share (see net_args.h). */
#define _POSIX_C_SOURCE 200809L

#include "net_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli_args.h"
#include "io/pointcloud_file.h"

double net_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void net_zoo_choices(const char *names[NET_ZOO_MAX + 1]) {
    int count = spconv_zoo_count() < NET_ZOO_MAX ? spconv_zoo_count() : NET_ZOO_MAX;
    for (int i = 0; i < count; ++i) names[i] = spconv_zoo_name(i);
    names[count] = NULL;
}

/* What the messages about voxel files call them: bench's option, or run's argument. */
static const char *flag_of(const char *cmd) {
    return strcmp(cmd, "bench") == 0 ? "--input" : "SCAN";
}

static int is_file(const char *path) {
    struct stat info;
    return stat(path, &info) == 0 && S_ISREG(info.st_mode);
}

static int is_dir(const char *path) {
    struct stat info;
    return stat(path, &info) == 0 && S_ISDIR(info.st_mode);
}

int net_sample_scan(const char *cmd, const char **path) {
    static const char built_in[] = SPCONV_SAMPLE_DATA_DIR "/sample_scan.bin";
    const char *env = getenv("SPCONV_SAMPLE_SCAN");
    if (env != NULL && env[0] != '\0') {
        if (!is_file(env))
            return cli_error(cmd, "SPCONV_SAMPLE_SCAN='%s' is not a readable file", env);
        *path = env;
        return 0;
    }
    if (!is_file(built_in))
        return cli_error(cmd, "no SCAN given and the bundled sample '%s' is missing (give a scan, "
                         "or set SPCONV_SAMPLE_SCAN)", built_in);
    *path = built_in;
    return 0;
}

/* "unet, second": the zoo networks whose input has @p channels channels, or "none". */
static void nets_taking(int64_t channels, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < spconv_zoo_count() && used < cap; ++i) {
        spconv_net_input zin;
        if (spconv_zoo_input(spconv_zoo_name(i), &zin) != SPCONV_OK || zin.channels != channels)
            continue;
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "",
                                 spconv_zoo_name(i));
    }
    if (used == 0) snprintf(buf, cap, "none");
}

/* ---- from a scan ------------------------------------------------------------------------------ */

/* Keep the input's features and indices and drop the tensor (and its rulebook cache). */
static void take_tensors(net_input *in, spconv_sparse_tensor *sp) {
    in->features = spconv_sparse_features(sp);
    in->indices = spconv_sparse_indices(sp);
    spconv_tensor_retain(in->features);
    spconv_tensor_retain(in->indices);
    spconv_sparse_spatial_shape(sp, in->spatial_shape);
    in->batch_size = spconv_sparse_batch_size(sp);
    spconv_sparse_release(sp);
}

int net_input_from_scan(const char *cmd, spconv_context *ctx, const char *net,
                        const spconv_net_input *zin, const char *path, net_input *out) {
    memset(out, 0, sizeof *out);
    double start = net_now_ms();
    spconv_status st = spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &out->cloud);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "reading the scan");
    out->read_ms = net_now_ms() - start;
    const int fields = spconv_point_cloud_num_fields(out->cloud);
    if (fields < zin->point_columns) {
        /* A network reads the first point_columns fields: one taking at most `fields` would do. */
        char others[128] = "none";
        for (int c = fields; c >= 3 && strcmp(others, "none") == 0; --c)
            nets_taking(c, others, sizeof others);
        return cli_error(cmd, "'%s' has %d fields per point; --net %s takes %d (x, y, z%s); "
                         "networks that take at most %d: %s", path, fields, net,
                         zin->point_columns, zin->point_columns > 3 ? ", intensity" : "", fields,
                         others);
    }
    spconv_sparse_tensor *sp = NULL;
    start = net_now_ms();
    st = spconv_net_input_from_points(ctx, zin, spconv_point_cloud_points(out->cloud), SPCONV_F32,
                                      &sp, &out->stats);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "voxelizing the scan");
    out->voxelize_ms = net_now_ms() - start;
    take_tensors(out, sp);
    return 0;
}

/* ---- from voxel files ------------------------------------------------------------------------- */

int net_input_is_voxels(const char *path) {
    char probe[4096];
    snprintf(probe, sizeof probe, "%s_indices.i32", path);
    return is_dir(path) || (!is_file(path) && is_file(probe));
}

/* The whole file @p path; *data is malloc'd (NULL for an empty file). Opened through the
 * library's input opener (the tool links the static library and sees its internal helpers), so a
 * named pipe or device given as --input is refused instead of blocking the tool. */
static int read_whole(const char *cmd, const char *path, void **data, size_t *bytes) {
    *data = NULL;
    *bytes = 0;
    char *buf = NULL;
    size_t len = 0;
    spconv_status st = spconv__file_read_all(flag_of(cmd), path, SIZE_MAX - 1, &buf, &len);
    if (st != SPCONV_OK) return cli_error(cmd, "%s", spconv_last_error());
    if (len == 0) {
        free(buf);
        return 0;
    }
    *data = buf;
    *bytes = len;
    return 0;
}

/* The files hold little-endian values; swap the bytes of each 4-byte word on a big-endian host. */
static void words_from_little_endian(void *data, size_t words) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe == 1) return;
    uint8_t *b = data;
    for (size_t i = 0; i < words; ++i, b += 4) {
        uint8_t t0 = b[0], t1 = b[1];
        b[0] = b[3], b[1] = b[2], b[2] = t1, b[3] = t0;
    }
}

/* int32 [N, 4] rows and float32 [N, C] features from raw files. */
static int read_raw_pair(const char *cmd, spconv_context *ctx, const char *net,
                         const char *indices_path, const char *features_path, int64_t channels,
                         net_input *out) {
    void *rows = NULL, *values = NULL;
    size_t row_bytes = 0, value_bytes = 0;
    int rc = read_whole(cmd, indices_path, &rows, &row_bytes);
    if (rc == 0) rc = read_whole(cmd, features_path, &values, &value_bytes);
    const int64_t n = (int64_t)(row_bytes / 16);
    if (rc == 0 && row_bytes % 16 != 0)
        rc = cli_error(cmd, "%s: '%s' has %zu bytes, not a whole number of int32 [N, 4] rows",
                       flag_of(cmd), indices_path, row_bytes);
    if (rc == 0 && value_bytes != (size_t)n * (size_t)channels * 4) {
        /* Say it in channels, the unit the user chose the network by, when the bytes allow. */
        const size_t row = (size_t)n * 4;
        if (n > 0 && value_bytes % row == 0) {
            const int64_t held = (int64_t)(value_bytes / row);
            char others[128];
            nets_taking(held, others, sizeof others);
            rc = cli_error(cmd, "%s: '%s' holds %lld float32 channels for each of the %lld "
                           "rows; --net %s takes %lld; networks that take %lld: %s", flag_of(cmd),
                           features_path, (long long)held, (long long)n, net,
                           (long long)channels, (long long)held, others);
        } else {
            rc = cli_error(cmd, "%s: '%s' has %zu bytes, not a whole number of float32 "
                           "channels for each of the %lld rows; --net %s takes %lld channels "
                           "(%lld bytes)", flag_of(cmd), features_path, value_bytes, (long long)n,
                           net, (long long)channels, (long long)(n * channels * 4));
        }
    }
    if (rc == 0) {
        words_from_little_endian(rows, row_bytes / 4);
        words_from_little_endian(values, value_bytes / 4);
        spconv_status st = spconv_tensor_from_host(ctx, spconv_cpu(), SPCONV_I32, 2,
                                                   (int64_t[]){n, 4}, rows, &out->indices);
        if (st == SPCONV_OK)
            st = spconv_tensor_from_host(ctx, spconv_cpu(), SPCONV_F32, 2,
                                         (int64_t[]){n, channels}, values, &out->features);
        if (st != SPCONV_OK) rc = cli_status_error(cmd, st, flag_of(cmd));
    }
    free(rows);
    free(values);
    return rc;
}

/* Indices as int32 [N, 4]: int32 as it is, int64 when every value fits. */
static int indices_as_int32(const char *cmd, spconv_context *ctx, const char *path,
                            spconv_tensor *t, spconv_tensor **out) {
    spconv_dtype dtype = spconv_tensor_dtype(t);
    if (spconv_tensor_ndim(t) != 2 || spconv_tensor_size(t, 1) != 4 ||
        (dtype != SPCONV_I32 && dtype != SPCONV_I64)) {
        char held[160];
        cli_describe_tensor(t, held, sizeof held);
        return cli_error(cmd, "%s: '%s' is %s; it must be int32 or int64 [N, 4] (batch, z, "
                         "y, x)", flag_of(cmd), path, held);
    }
    if (dtype == SPCONV_I64) {
        const int64_t *v = spconv_tensor_data(t);
        for (int64_t i = 0; i < spconv_tensor_numel(t); ++i)
            if (v[i] < INT32_MIN || v[i] > INT32_MAX)
                return cli_error(cmd, "%s: '%s' row %lld holds %lld, beyond int32", flag_of(cmd),
                                 path, (long long)(i / 4), (long long)v[i]);
    }
    spconv_status st = spconv_tensor_to_dtype(ctx, t, SPCONV_I32, out);
    return st == SPCONV_OK ? 0 : cli_status_error(cmd, st, flag_of(cmd));
}

static int read_npy_pair(const char *cmd, spconv_context *ctx, const char *net,
                         const char *indices_path, const char *features_path, int64_t channels,
                         net_input *out) {
    spconv_tensor *indices = NULL, *features = NULL;
    int rc = cli_read_npy(cmd, flag_of(cmd), indices_path, &indices);
    if (rc == 0) rc = cli_read_npy(cmd, flag_of(cmd), features_path, &features);
    if (rc == 0) rc = indices_as_int32(cmd, ctx, indices_path, indices, &out->indices);
    if (rc == 0 && (spconv_tensor_ndim(features) != 2 ||
                    !spconv_dtype_is_floating(spconv_tensor_dtype(features)) ||
                    spconv_tensor_size(features, 0) != spconv_tensor_size(indices, 0) ||
                    spconv_tensor_size(features, 1) != channels)) {
        char held[160];
        cli_describe_tensor(features, held, sizeof held);
        rc = cli_error(cmd, "%s: '%s' is %s; --net %s takes floating [%lld, %lld] (a row "
                       "per index row, %lld channels)", flag_of(cmd), features_path, held, net,
                       (long long)spconv_tensor_size(indices, 0), (long long)channels,
                       (long long)channels);
    }
    if (rc == 0) {
        spconv_status st = spconv_tensor_to_dtype(ctx, features, SPCONV_F32, &out->features);
        if (st != SPCONV_OK) rc = cli_status_error(cmd, st, flag_of(cmd));
    }
    spconv_tensor_release(indices);
    spconv_tensor_release(features);
    return rc;
}

/* Find the two files that @p path stands for and read them. */
static int read_voxel_files(const char *cmd, spconv_context *ctx, const char *net,
                            const char *path, int64_t channels, net_input *out) {
    char indices[4096], features[4096];
    if (is_dir(path)) {
        snprintf(indices, sizeof indices, "%s/spconv_test_indices.i32", path);
        snprintf(features, sizeof features, "%s/spconv_test_features.f32", path);
        if (is_file(indices))
            return read_raw_pair(cmd, ctx, net, indices, features, channels, out);
        snprintf(indices, sizeof indices, "%s/indices.npy", path);
        snprintf(features, sizeof features, "%s/features.npy", path);
        if (is_file(indices))
            return read_npy_pair(cmd, ctx, net, indices, features, channels, out);
        return cli_error(cmd, "%s: folder '%s' has neither spconv_test_indices.i32 + "
                         "spconv_test_features.f32 nor indices.npy + features.npy", flag_of(cmd),
                         path);
    }
    snprintf(indices, sizeof indices, "%s_indices.i32", path);
    snprintf(features, sizeof features, "%s_features.f32", path);
    return read_raw_pair(cmd, ctx, net, indices, features, channels, out);
}

int net_input_from_voxels(const char *cmd, spconv_context *ctx, const char *net,
                          const spconv_net_input *zin, const char *path, net_input *out) {
    memset(out, 0, sizeof *out);
    const double start = net_now_ms();
    int rc = read_voxel_files(cmd, ctx, net, path, zin->channels, out);
    if (rc != 0) return rc;
    out->read_ms = net_now_ms() - start;
    memcpy(out->spatial_shape, zin->spatial_shape, sizeof out->spatial_shape);
    const int64_t n = spconv_tensor_size(out->indices, 0);
    const int32_t *rows = spconv_tensor_data(out->indices);
    int64_t largest = 0;
    for (int64_t i = 0; i < n; ++i) largest = rows[4 * i] > largest ? rows[4 * i] : largest;
    out->batch_size = largest + 1;
    spconv_sparse_tensor *sp = NULL;
    rc = net_input_sparse(cmd, NULL, out, SPCONV_F32, &sp); /* validated on the host */
    if (rc != 0) return rc;
    spconv_status st = spconv_sparse_validate(ctx, sp);
    spconv_sparse_release(sp);
    return st == SPCONV_OK ? 0 : cli_status_error(cmd, st, flag_of(cmd));
}

/* ---- both ------------------------------------------------------------------------------------- */

int net_input_replicate(const char *cmd, net_input *in, int64_t copies) {
    const int64_t n = spconv_tensor_size(in->features, 0), c = spconv_tensor_size(in->features, 1);
    if (in->batch_size > INT32_MAX / copies || n > INT32_MAX / copies)
        return cli_error(cmd, "--replicate %lld: %lld sites in %lld batch entries would overflow",
                         (long long)copies, (long long)n, (long long)in->batch_size);
    spconv_tensor *features = NULL, *indices = NULL;
    const int64_t f_sizes[2] = {copies * n, c}, i_sizes[2] = {copies * n, 4};
    spconv_status st = spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, f_sizes, &features);
    if (st == SPCONV_OK) st = spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 2, i_sizes, &indices);
    spconv_tensor *f = NULL, *i = NULL;
    if (st == SPCONV_OK) st = spconv_tensor_contiguous(NULL, in->features, &f);
    if (st == SPCONV_OK) st = spconv_tensor_contiguous(NULL, in->indices, &i);
    if (st == SPCONV_OK) {
        const float *fs = spconv_tensor_data(f);
        const int32_t *is = spconv_tensor_data(i);
        float *fd = spconv_tensor_data(features);
        int32_t *id = spconv_tensor_data(indices);
        for (int64_t k = 0; k < copies; ++k) {
            memcpy(fd + k * n * c, fs, (size_t)(n * c) * sizeof *fd);
            for (int64_t r = 0; r < n; ++r) {
                id[4 * (k * n + r)] = (int32_t)(is[4 * r] + k * in->batch_size);
                memcpy(id + 4 * (k * n + r) + 1, is + 4 * r + 1, 3 * sizeof *id);
            }
        }
    }
    spconv_tensor_release(f);
    spconv_tensor_release(i);
    if (st != SPCONV_OK) {
        spconv_tensor_release(features);
        spconv_tensor_release(indices);
        return cli_status_error(cmd, st, "replicating the input");
    }
    spconv_tensor_release(in->features);
    spconv_tensor_release(in->indices);
    in->features = features;
    in->indices = indices;
    in->batch_size *= copies;
    return 0;
}

int net_input_sparse(const char *cmd, spconv_context *ctx, const net_input *in, spconv_dtype dtype,
                     spconv_sparse_tensor **out) {
    spconv_tensor *features = NULL;
    spconv_status st = spconv_tensor_to_dtype(ctx, in->features, dtype, &features);
    if (st == SPCONV_OK)
        st = spconv_sparse_create(features, in->indices, in->spatial_shape, in->batch_size, out);
    spconv_tensor_release(features);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "making the input sparse tensor");
    return net_sparse_to_context_device(cmd, ctx, out);
}

const char *const net_dtype_names[] = {"f32", "f16", "bf16", NULL};

spconv_dtype net_dtype_of(int index) {
    static const spconv_dtype dtypes[] = {SPCONV_F32, SPCONV_F16, SPCONV_BF16};
    return dtypes[index];
}

spconv_dtype net_file_dtype(spconv_dtype dtype) {
    return dtype == SPCONV_BF16 ? SPCONV_F32 : dtype;
}

int net_output_as(const char *cmd, spconv_context *ctx, spconv_tensor **t, spconv_dtype dtype) {
    if (spconv_tensor_dtype(*t) == dtype) return 0;
    spconv_tensor *converted = NULL;
    spconv_status st = spconv_tensor_to_dtype(ctx, *t, dtype, &converted);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "converting the output");
    spconv_tensor_release(*t);
    *t = converted;
    return 0;
}

/* @p sp's features and sites on @p device, as a new sparse tensor. */
static spconv_status sparse_on(spconv_context *ctx, const spconv_sparse_tensor *sp,
                               spconv_device device, spconv_sparse_tensor **out) {
    spconv_tensor *f = NULL, *i = NULL;
    int64_t shape[3];
    spconv_sparse_spatial_shape(sp, shape);
    spconv_status st = spconv_tensor_to_device(ctx, spconv_sparse_features(sp), device, &f);
    if (st == SPCONV_OK) st = spconv_tensor_to_device(ctx, spconv_sparse_indices(sp), device, &i);
    if (st == SPCONV_OK) st = spconv_sparse_create(f, i, shape, spconv_sparse_batch_size(sp), out);
    spconv_tensor_release(f);
    spconv_tensor_release(i);
    return st;
}

int net_sparse_to_context_device(const char *cmd, spconv_context *ctx, spconv_sparse_tensor **in) {
    const spconv_device device = spconv_context_device(ctx);
    if (spconv_device_equal(spconv_tensor_device(spconv_sparse_features(*in)), device)) return 0;
    spconv_sparse_tensor *moved = NULL;
    const spconv_status st = sparse_on(ctx, *in, device, &moved);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "copying the input to the device");
    spconv_sparse_release(*in);
    *in = moved;
    return 0;
}

int net_outputs_to_host(const char *cmd, spconv_context *ctx, spconv_tensor **output,
                        spconv_sparse_tensor **out_sparse) {
    if (spconv_device_equal(spconv_tensor_device(*output), spconv_cpu())) return 0;
    spconv_tensor *host = NULL;
    spconv_status st = spconv_tensor_to_device(ctx, *output, spconv_cpu(), &host);
    if (st == SPCONV_OK) {
        spconv_tensor_release(*output);
        *output = host;
    }
    if (st == SPCONV_OK && out_sparse != NULL && *out_sparse != NULL) {
        spconv_sparse_tensor *moved = NULL;
        st = sparse_on(ctx, *out_sparse, spconv_cpu(), &moved);
        if (st == SPCONV_OK) {
            spconv_sparse_release(*out_sparse);
            *out_sparse = moved;
        }
    }
    return st == SPCONV_OK ? 0 : cli_status_error(cmd, st, "copying the output to the host");
}

void net_input_release(net_input *in) {
    spconv_point_cloud_destroy(in->cloud);
    spconv_tensor_release(in->features);
    spconv_tensor_release(in->indices);
    memset(in, 0, sizeof *in);
}

int net_build(const char *cmd, spconv_context *ctx, const char *name, spconv_dtype dtype,
              uint64_t seed, const char *weights_dir, spconv_net_layout layout, spconv_net **out) {
    *out = NULL;
    spconv_status st = spconv_zoo_create(name, dtype, seed, out);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "--net");
    if (weights_dir != NULL) {
        if (!is_dir(weights_dir))
            return cli_error(cmd, "--weights '%s': not a folder (expected one .npy file per "
                             "parameter)", weights_dir);
        st = spconv_net_load_weights(ctx, *out, weights_dir, layout);
        if (st != SPCONV_OK) return cli_status_error(cmd, st, "--weights");
    }
    /* On a GPU the parameters stay there for every pass (one upload now, none per layer). */
    const spconv_device device = spconv_context_device(ctx);
    if (device.type == SPCONV_DEVICE_CPU) return 0;
    st = spconv_net_keep_on_device(ctx, *out, device);
    return st == SPCONV_OK ? 0 : cli_status_error(cmd, st, "copying the parameters to the device");
}
