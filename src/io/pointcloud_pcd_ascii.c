/* ASCII PCD data, parsed here rather than by PCL: PCL's ASCII reader turns a token it cannot parse
 * into 0, wraps a value too large for its field (300 in an int8 field becomes 44), ignores extra
 * values on a line and reads short lines as zeros, all without an error. Here every value must
 * parse as its field's TYPE and fit its SIZE, and every point line must hold exactly the values
 * the fields declare (the sum of COUNT); anything else is an error naming the line and field. */
#include <inttypes.h>
#include <string.h>

#include "core/error.h"
#include "io/pointcloud_native.h"
#include "io/pointcloud_pcd.h"
#include "io/pointcloud_text.h"

/* The scalar of a PCD TYPE and SIZE; 0 when the pair has no meaning (F1, F2, B2, ...). */
static int pcd_scalar(char type, unsigned size, spconv__scalar *out) {
    static const spconv__scalar ints[4] = {SPCONV__I8, SPCONV__I16, SPCONV__I32, SPCONV__I64};
    static const spconv__scalar uints[4] = {SPCONV__U8, SPCONV__U16, SPCONV__U32, SPCONV__U64};
    int k = size == 1 ? 0 : size == 2 ? 1 : size == 4 ? 2 : size == 8 ? 3 : -1;
    if (k < 0) return 0;
    if (type == 'I') *out = ints[k];
    else if (type == 'U') *out = uints[k];
    else if (type == 'F' && (size == 4 || size == 8)) *out = size == 4 ? SPCONV__F32 : SPCONV__F64;
    else if (type == 'B' && size == 1) *out = SPCONV__BOOL;
    else return 0;
    return 1;
}

/* The fields of the header as raw fields: names copied, offsets packed in order. */
static spconv_status plan_fields(const char *func, const char *path, const spconv__pcd_header *h,
                                 const spconv__pcd_field *fields, spconv__native_cloud *out) {
    size_t name_bytes = 0;
    for (int i = 0; i < h->num_fields; ++i) name_bytes += fields[i].name.n + 1;
    SPCONV_RETURN_ERROR_IF(!spconv__native_cloud_alloc(out, (size_t)h->num_fields, name_bytes,
                                                       h->points, h->point_step),
                           SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for the %" PRIu64
                           " points of '%s'", func, h->points, path);
    char *name = out->names;
    uint64_t offset = 0;
    for (int i = 0; i < h->num_fields; ++i) {
        const spconv__pcd_field *f = &fields[i];
        spconv__raw_field *r = &out->fields[i];
        if (!pcd_scalar(f->type, f->size, &r->type)) {
            spconv__native_cloud_free(out);
            SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT, "%s: '%s': field '%.*s' has TYPE %c with SIZE "
                                "%u, which is no number type", func, path, (int)f->name.n,
                                f->name.p, f->type, (unsigned)f->size);
        }
        memcpy(name, f->name.p, f->name.n);
        name[f->name.n] = '\0';
        r->name = name;
        r->offset = offset;
        r->count = f->count;
        name += f->name.n + 1;
        offset += (uint64_t)f->size * f->count;
    }
    return SPCONV_OK;
}

typedef struct ascii_reader {
    const char *func, *path;
    const spconv__pcd_field *fields;
    const spconv__raw_field *raw;
    int num_fields;
    uint64_t values; /* per point */
    int line_no;
} ascii_reader;

static spconv_status value_error(const ascii_reader *ar, int field, uint32_t index,
                                 spconv__span tok, spconv__value_result why) {
    const spconv__pcd_field *f = &ar->fields[field];
    char quoted[40], element[24] = "";
    spconv__quote_line(tok, quoted, sizeof quoted);
    if (f->count > 1) snprintf(element, sizeof element, "[%" PRIu32 "]", index);
    const char *problem = why == SPCONV__VALUE_RANGE ? "does not fit"
                          : f->type == 'F'           ? "is not a number of type"
                          : f->type == 'B'           ? "is not 0 or 1 for"
                                                     : "is not an integer of type";
    return spconv__error(SPCONV_ERR_FORMAT, "%s: '%s' line %d: field '%.*s%s' value '%s' %s %c%u "
                         "(%s)", ar->func, ar->path, ar->line_no, (int)f->name.n, f->name.p,
                         element, quoted, problem, f->type, (unsigned)f->size,
                         spconv__scalar_name(ar->raw[field].type));
}

/* One point line into @p record. */
static spconv_status read_point(const ascii_reader *ar, spconv__span line, unsigned char *record) {
    const char *cur = line.p, *end = line.p + line.n;
    spconv__span tok;
    uint64_t seen = 0;
    for (int i = 0; i < ar->num_fields; ++i) {
        const spconv__raw_field *r = &ar->raw[i];
        size_t size = spconv__scalar_size(r->type);
        for (uint32_t k = 0; k < ar->fields[i].count; ++k, ++seen) {
            if (!spconv__next_token(&cur, end, &tok))
                SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT, "%s: '%s' line %d has %" PRIu64 " values "
                                    "but a point has %" PRIu64 " (the sum of COUNT over FIELDS)",
                                    ar->func, ar->path, ar->line_no, seen, ar->values);
            spconv__value_result v =
                spconv__ascii_value(tok, r->type, record + r->offset + (uint64_t)k * size);
            if (v != SPCONV__VALUE_OK) return value_error(ar, i, k, tok, v);
        }
    }
    SPCONV_RETURN_ERROR_IF(spconv__next_token(&cur, end, &tok), SPCONV_ERR_FORMAT,
                           "%s: '%s' line %d has %" PRIu64 " values but a point has %" PRIu64
                           " (the sum of COUNT over FIELDS)", ar->func, ar->path, ar->line_no,
                           seen + (uint64_t)spconv__count_tokens(tok.p, end), ar->values);
    return SPCONV_OK;
}

static spconv_status read_lines(ascii_reader *ar, const char *text, size_t len,
                                const spconv__pcd_header *h, spconv__native_cloud *out) {
    ar->line_no = 1;
    for (size_t i = 0; i < h->data_offset; ++i) ar->line_no += text[i] == '\n';
    --ar->line_no; /* the loop below counts each line as it takes it */
    size_t pos = h->data_offset;
    uint64_t point = 0;
    spconv__span line;
    while (spconv__next_line(text, len, &pos, &line)) {
        ++ar->line_no;
        if (spconv__count_tokens(line.p, line.p + line.n) == 0) continue; /* blank lines */
        SPCONV_RETURN_ERROR_IF(point == h->points, SPCONV_ERR_FORMAT,
                               "%s: '%s' line %d: one point more than POINTS %" PRIu64, ar->func,
                               ar->path, ar->line_no, h->points);
        SPCONV_FORWARD_IF_ERROR(read_point(ar, line, out->data + point * h->point_step));
        ++point;
    }
    SPCONV_RETURN_ERROR_IF(point != h->points, SPCONV_ERR_FORMAT,
                           "%s: '%s' has %" PRIu64 " point lines after DATA ascii but POINTS is %"
                           PRIu64, ar->func, ar->path, point, h->points);
    return SPCONV_OK;
}

spconv_status spconv__pcd_read_ascii(const char *func, const char *path, const char *text,
                                     size_t len, const spconv__pcd_header *h,
                                     const spconv__pcd_field *fields, spconv__native_cloud *out) {
    SPCONV_FORWARD_IF_ERROR(plan_fields(func, path, h, fields, out));
    ascii_reader ar = {func, path, fields, out->fields, h->num_fields, h->values, 0};
    spconv_status st = read_lines(&ar, text, len, h, out);
    if (st != SPCONV_OK) {
        spconv__native_cloud_free(out);
        return st;
    }
    out->raw.width = h->width;
    out->raw.height = h->height;
    return SPCONV_OK;
}
