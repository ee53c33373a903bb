/* Raw point records (as PCL's PCLPointCloud2 holds them) to the float32 [P, F] cloud. Plain C so
 * that the checks on field offsets and sizes are built, tested and fuzzed without PCL too. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/pointcloud_impl.h"
#include "io/pointcloud_pcl.h"

/* Columns of one cloud: a generous bound that still keeps a hostile header from asking for
 * absurd rows. */
#define MAX_COLUMNS 8192

/* Where column j of the output comes from. */
typedef struct column_source {
    uint64_t offset;
    spconv__scalar type;
    int channel; /* -1: the value itself; 0..3: byte of a packed rgb/rgba (r, g, b, a) */
} column_source;

typedef struct column_plan {
    column_source *sources;
    char **names;
    int count;
} column_plan;

size_t spconv__scalar_size(spconv__scalar type) {
    switch (type) {
    case SPCONV__BOOL: case SPCONV__I8: case SPCONV__U8: return 1;
    case SPCONV__I16: case SPCONV__U16: return 2;
    case SPCONV__I32: case SPCONV__U32: case SPCONV__F32: return 4;
    case SPCONV__I64: case SPCONV__U64: case SPCONV__F64: return 8;
    }
    return 0;
}

static double load_scalar(const unsigned char *p, spconv__scalar type) {
    union {
        int8_t i8; uint8_t u8; int16_t i16; uint16_t u16; int32_t i32; uint32_t u32;
        int64_t i64; uint64_t u64; float f32; double f64;
    } v;
    memcpy(&v, p, spconv__scalar_size(type));
    switch (type) {
    case SPCONV__BOOL: return v.u8 != 0;
    case SPCONV__I8: return v.i8;
    case SPCONV__U8: return v.u8;
    case SPCONV__I16: return v.i16;
    case SPCONV__U16: return v.u16;
    case SPCONV__I32: return v.i32;
    case SPCONV__U32: return v.u32;
    case SPCONV__I64: return (double)v.i64;
    case SPCONV__U64: return (double)v.u64;
    case SPCONV__F32: return v.f32;
    case SPCONV__F64: return v.f64;
    }
    return 0.0;
}

/* PCL packs colours into the 32 bits of one field as 0xAARRGGBB. */
static int is_packed_colour(const spconv__raw_field *f) {
    return (strcmp(f->name, "rgb") == 0 || strcmp(f->name, "rgba") == 0) && f->count == 1 &&
           spconv__scalar_size(f->type) == 4;
}

static float column_value(const unsigned char *point, const column_source *src) {
    if (src->channel < 0 && src->type == SPCONV__F32) { /* the common case, without a switch */
        float value;
        memcpy(&value, point + src->offset, sizeof value);
        return value;
    }
    if (src->channel < 0) return (float)load_scalar(point + src->offset, src->type);
    uint32_t packed;
    memcpy(&packed, point + src->offset, sizeof packed);
    static const int shift[4] = {16, 8, 0, 24};
    return (float)((packed >> shift[src->channel]) & 0xFFu);
}

/* Every field inside a point, the data long enough for width * height points. */
static spconv_status check_raw(const char *func, const char *path, const spconv__raw_cloud *raw,
                               uint64_t *num_points) {
    SPCONV_RETURN_ERROR_IF(raw->height != 0 && raw->width > UINT64_MAX / raw->height,
                           SPCONV_ERR_FORMAT, "%s: '%s': %" PRIu64 " x %" PRIu64 " points "
                           "overflow", func, path, raw->width, raw->height);
    uint64_t points = raw->width * raw->height;
    SPCONV_RETURN_ERROR_IF(points > 0 && (raw->point_step == 0 ||
                                          raw->data_bytes / raw->point_step < points),
                           SPCONV_ERR_FORMAT, "%s: '%s': %" PRIu64 " points of %" PRIu64
                           " bytes need more than the %" PRIu64 " bytes read", func, path, points,
                           raw->point_step, raw->data_bytes);
    for (size_t i = 0; i < raw->num_fields; ++i) {
        const spconv__raw_field *f = &raw->fields[i];
        uint64_t size = spconv__scalar_size(f->type);
        SPCONV_RETURN_ERROR_IF(size == 0 || f->count > raw->point_step ||
                                   f->offset > raw->point_step ||
                                   f->count > (raw->point_step - f->offset) / size,
                               SPCONV_ERR_FORMAT, "%s: '%s': field '%s' (offset %" PRIu64
                               ", %" PRIu64 " values) does not fit in a point of %" PRIu64
                               " bytes", func, path, f->name, f->offset, f->count,
                               raw->point_step);
    }
    *num_points = points;
    return SPCONV_OK;
}

static void plan_free(column_plan *plan) {
    for (int i = 0; plan->names != NULL && i < plan->count; ++i) free(plan->names[i]);
    free(plan->names);
    free(plan->sources);
}

/* Add a column named @p name (or name_index when index >= 0). */
static int plan_add(column_plan *plan, const spconv__raw_field *f, const char *name,
                    int64_t index, uint64_t offset, int channel) {
    size_t len = strlen(name) + 24;
    char *copy = malloc(len);
    if (copy == NULL) return 0;
    if (index >= 0) snprintf(copy, len, "%s_%" PRId64, name, index);
    else snprintf(copy, len, "%s", name);
    plan->names[plan->count] = copy;
    plan->sources[plan->count] = (column_source){offset, f->type, channel};
    ++plan->count;
    return 1;
}

static int is_coordinate(const char *name) {
    return strcmp(name, "x") == 0 || strcmp(name, "y") == 0 || strcmp(name, "z") == 0;
}

/* Columns of the other fields, after x, y, z. Returns 0 when out of memory. */
static int plan_field(column_plan *plan, const spconv__raw_field *f) {
    static const char *const channels[4] = {"r", "g", "b", "a"};
    if (is_packed_colour(f)) {
        int n = strcmp(f->name, "rgba") == 0 ? 4 : 3;
        for (int c = 0; c < n; ++c)
            if (!plan_add(plan, f, channels[c], -1, f->offset, c)) return 0;
        return 1;
    }
    size_t size = spconv__scalar_size(f->type);
    for (uint64_t k = 0; k < f->count; ++k)
        if (!plan_add(plan, f, f->name, f->count > 1 ? (int64_t)k : -1, f->offset + k * size, -1))
            return 0;
    return 1;
}

static uint64_t field_columns(const spconv__raw_field *f) {
    if (strcmp(f->name, "_") == 0 || (is_coordinate(f->name) && f->count == 1)) return 0;
    return is_packed_colour(f) ? (strcmp(f->name, "rgba") == 0 ? 4 : 3) : f->count;
}

static spconv_status build_plan(const char *func, const char *path, const spconv__raw_cloud *raw,
                                column_plan *plan) {
    memset(plan, 0, sizeof *plan);
    const spconv__raw_field *xyz[3] = {NULL, NULL, NULL};
    uint64_t total = 3;
    for (size_t i = 0; i < raw->num_fields; ++i) {
        const spconv__raw_field *f = &raw->fields[i];
        for (int a = 0; a < 3; ++a)
            if (xyz[a] == NULL && f->count == 1 && strcmp(f->name, (const char *[]){"x", "y", "z"}[a]) == 0)
                xyz[a] = f;
        /* Capped per field so that absurd counts cannot wrap the sum below the limit. */
        uint64_t columns = field_columns(f);
        total += columns > MAX_COLUMNS ? MAX_COLUMNS + 1 : columns;
    }
    for (int a = 0; a < 3; ++a)
        SPCONV_RETURN_ERROR_IF(xyz[a] == NULL, SPCONV_ERR_FORMAT,
                               "%s: '%s' has no field '%c' (a point cloud needs x, y and z)", func,
                               path, "xyz"[a]);
    SPCONV_RETURN_ERROR_IF(total > MAX_COLUMNS, SPCONV_ERR_FORMAT,
                           "%s: '%s': %" PRIu64 " values per point is more than %d", func, path,
                           total, MAX_COLUMNS);
    plan->sources = malloc((size_t)total * sizeof *plan->sources);
    plan->names = calloc((size_t)total, sizeof *plan->names);
    int ok = plan->sources != NULL && plan->names != NULL;
    for (int a = 0; ok && a < 3; ++a)
        ok = plan_add(plan, xyz[a], xyz[a]->name, -1, xyz[a]->offset, -1);
    for (size_t i = 0; ok && i < raw->num_fields; ++i)
        if (field_columns(&raw->fields[i]) > 0) ok = plan_field(plan, &raw->fields[i]);
    if (!ok) {
        plan_free(plan);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for the fields of '%s'",
                            func, path);
    }
    return SPCONV_OK;
}

/* Convert the points, skipping those with a non-finite coordinate; returns how many were kept. */
static int64_t convert_points(const spconv__raw_cloud *raw, uint64_t num_points,
                              const column_plan *plan, float *dst) {
    int64_t kept = 0;
    for (uint64_t i = 0; i < num_points; ++i) {
        const unsigned char *point = raw->data + i * raw->point_step;
        float *row = dst + kept * plan->count;
        for (int j = 0; j < plan->count; ++j) row[j] = column_value(point, &plan->sources[j]);
        kept += isfinite(row[0]) && isfinite(row[1]) && isfinite(row[2]);
    }
    return kept;
}

spconv_status spconv__raw_cloud_convert(const char *func, const char *path,
                                        const spconv__raw_cloud *raw, spconv_point_cloud **out) {
    *out = NULL;
    uint64_t num_points = 0;
    SPCONV_FORWARD_IF_ERROR(check_raw(func, path, raw, &num_points));
    column_plan plan;
    SPCONV_FORWARD_IF_ERROR(build_plan(func, path, raw, &plan));
    spconv_tensor *points = NULL;
    spconv_status st = spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2,
                                           (const int64_t[]){(int64_t)num_points, plan.count},
                                           &points);
    int64_t kept = 0;
    if (st == SPCONV_OK) {
        kept = convert_points(raw, num_points, &plan, spconv_tensor_data(points));
        st = spconv__cloud_make(func, points, (const char *const *)plan.names, out);
    }
    plan_free(&plan);
    if (st == SPCONV_OK) st = spconv__cloud_keep_rows(*out, kept);
    if (st != SPCONV_OK) {
        spconv_point_cloud_destroy(*out);
        *out = NULL;
        return st;
    }
    (*out)->dropped_nonfinite = (int64_t)num_points - kept;
    (*out)->width = (int64_t)raw->width;
    (*out)->height = (int64_t)raw->height;
    return SPCONV_OK;
}
