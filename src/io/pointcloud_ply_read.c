/* PLY data, read here rather than by PCL. PCL's PLY reader aborts the process (assert) on valid
 * files: a vertex list whose length changes from vertex to vertex, an "obj_info" line indented by
 * a blank; it prints warnings of its own for the elements it does not handle, and its ASCII parse
 * wraps values that do not fit their type. Reading the format is small: rows of typed values,
 * ASCII or binary in either byte order, and lists (skipped: they belong to faces and other
 * elements, a point cloud is the vertices). The bytes parsed are the bytes the header check saw. */
#include <inttypes.h>
#include <string.h>

#include "core/error.h"
#include "io/pointcloud_native.h"
#include "io/pointcloud_ply.h"
#include "io/pointcloud_text.h"

typedef struct ply_reader {
    const char *func, *path;
    const char *text;
    size_t len, pos;
    int binary, swap; /* swap: the file's byte order is not the host's */
    int line_no;
    const spconv__ply_layout *layout;
    unsigned char *scratch; /* room for one value of any type */
} ply_reader;

/* PCL packs uchar red, green, blue (and alpha) into one rgb field that the conversion unpacks
 * into r, g, b (a); the same names here keep both readers' clouds alike. */
static const char *field_name(const spconv__ply_property *p) {
    static const char *const colours[4][2] = {{"red", "r"}, {"green", "g"}, {"blue", "b"},
                                              {"alpha", "a"}};
    if (p->type == SPCONV__U8)
        for (int c = 0; c < 4; ++c)
            if (spconv__span_is(p->name, colours[c][0])) return colours[c][1];
    return NULL;
}

/* The vertex properties as raw fields, packed in file order. */
static spconv_status plan_vertex(const ply_reader *pr, uint64_t vertices,
                                 spconv__native_cloud *out) {
    const spconv__ply_layout *l = pr->layout;
    const spconv__ply_element *v = &l->elements[l->vertex];
    size_t name_bytes = 0;
    uint64_t step = 0;
    for (int i = 0; i < v->num_properties; ++i) {
        const spconv__ply_property *p = &l->properties[v->first_property + i];
        name_bytes += p->name.n + 1;
        step += spconv__scalar_size(p->type);
    }
    SPCONV_RETURN_ERROR_IF(!spconv__native_cloud_alloc(out, (size_t)v->num_properties, name_bytes,
                                                       vertices, step),
                           SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for the %" PRIu64
                           " vertices of '%s'", pr->func, vertices, pr->path);
    char *name = out->names;
    uint64_t offset = 0;
    for (int i = 0; i < v->num_properties; ++i) {
        const spconv__ply_property *p = &l->properties[v->first_property + i];
        const char *renamed = field_name(p);
        size_t n = renamed != NULL ? strlen(renamed) : p->name.n;
        memcpy(name, renamed != NULL ? renamed : p->name.p, n);
        name[n] = '\0';
        out->fields[i] = (spconv__raw_field){name, p->type, offset, 1};
        name += n + 1;
        offset += spconv__scalar_size(p->type);
    }
    out->raw.width = vertices;
    out->raw.height = 1;
    return SPCONV_OK;
}

/* ---- binary --------------------------------------------------------------------------------- */

static spconv_status binary_value(ply_reader *pr, const spconv__ply_element *e, uint64_t row,
                                  spconv__scalar type, unsigned char *dst) {
    size_t size = spconv__scalar_size(type);
    SPCONV_RETURN_ERROR_IF(pr->len - pr->pos < size, SPCONV_ERR_FORMAT,
                           "%s: '%s': the data ends inside row %" PRIu64 " of element '%.*s'",
                           pr->func, pr->path, row, (int)e->name.n, e->name.p);
    for (size_t b = 0; b < size; ++b)
        dst[b] = (unsigned char)pr->text[pr->pos + (pr->swap ? size - 1 - b : b)];
    pr->pos += size;
    return SPCONV_OK;
}

/* The length of a list, from its count value of @p type at @p p (host order). */
static int64_t list_length(const unsigned char *p, spconv__scalar type) {
    switch (type) {
    case SPCONV__I8: { int8_t v; memcpy(&v, p, 1); return v; }
    case SPCONV__U8: return p[0];
    case SPCONV__I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case SPCONV__U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case SPCONV__I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case SPCONV__U32: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: return -1; /* the header check allows only these count types */
    }
}

static spconv_status binary_list(ply_reader *pr, const spconv__ply_element *e, uint64_t row,
                                 const spconv__ply_property *p) {
    SPCONV_FORWARD_IF_ERROR(binary_value(pr, e, row, p->count_type, pr->scratch));
    int64_t n = list_length(pr->scratch, p->count_type);
    SPCONV_RETURN_ERROR_IF(n < 0, SPCONV_ERR_FORMAT, "%s: '%s': list '%.*s' of row %" PRIu64
                           " of element '%.*s' has a negative length %" PRId64, pr->func,
                           pr->path, (int)p->name.n, p->name.p, row, (int)e->name.n, e->name.p, n);
    uint64_t bytes = (uint64_t)n * spconv__scalar_size(p->type);
    SPCONV_RETURN_ERROR_IF(pr->len - pr->pos < bytes, SPCONV_ERR_FORMAT,
                           "%s: '%s': the data ends inside list '%.*s' of row %" PRIu64
                           " of element '%.*s'", pr->func, pr->path, (int)p->name.n, p->name.p,
                           row, (int)e->name.n, e->name.p);
    pr->pos += (size_t)bytes;
    return SPCONV_OK;
}

static spconv_status binary_element(ply_reader *pr, int index, spconv__native_cloud *out) {
    const spconv__ply_layout *l = pr->layout;
    const spconv__ply_element *e = &l->elements[index];
    for (uint64_t row = 0; row < e->count; ++row) {
        unsigned char *record = index == l->vertex ? out->data + row * out->raw.point_step : NULL;
        for (int i = 0; i < e->num_properties; ++i) {
            const spconv__ply_property *p = &l->properties[e->first_property + i];
            if (p->is_list) {
                SPCONV_FORWARD_IF_ERROR(binary_list(pr, e, row, p));
                continue;
            }
            unsigned char *dst = record != NULL ? record + out->fields[i].offset : pr->scratch;
            SPCONV_FORWARD_IF_ERROR(binary_value(pr, e, row, p->type, dst));
        }
    }
    return SPCONV_OK;
}

/* ---- ascii ---------------------------------------------------------------------------------- */

/* The next line that holds a token; 0 at the end of the data. */
static int next_row_line(ply_reader *pr, spconv__span *line) {
    while (spconv__next_line(pr->text, pr->len, &pr->pos, line)) {
        ++pr->line_no;
        if (spconv__count_tokens(line->p, line->p + line->n) > 0) return 1;
    }
    return 0;
}

static spconv_status ascii_value(ply_reader *pr, const spconv__ply_property *p,
                                 spconv__scalar type, spconv__span tok, unsigned char *dst) {
    spconv__value_result v = spconv__ascii_value(tok, type, dst);
    if (v == SPCONV__VALUE_OK) return SPCONV_OK;
    char quoted[40];
    spconv__quote_line(tok, quoted, sizeof quoted);
    const int real = type == SPCONV__F32 || type == SPCONV__F64;
    SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT, "%s: '%s' line %d: property '%.*s' value '%s' %s %.*s "
                        "(%s)", pr->func, pr->path, pr->line_no, (int)p->name.n, p->name.p, quoted,
                        v == SPCONV__VALUE_RANGE ? "does not fit"
                        : real                   ? "is not a number of type"
                                                 : "is not an integer of type",
                        p->is_list && type == p->count_type ? 4 : (int)p->type_name.n,
                        p->is_list && type == p->count_type ? "list" : p->type_name.p,
                        spconv__scalar_name(type));
}

static spconv_status too_few(const ply_reader *pr, const spconv__ply_element *e) {
    return spconv__error(SPCONV_ERR_FORMAT, "%s: '%s' line %d: a row of element '%.*s' with fewer "
                         "values than its properties need", pr->func, pr->path, pr->line_no,
                         (int)e->name.n, e->name.p);
}

static spconv_status ascii_row(ply_reader *pr, const spconv__ply_element *e, spconv__span line,
                               unsigned char *record, const spconv__native_cloud *out) {
    const spconv__ply_layout *l = pr->layout;
    const char *cur = line.p, *end = line.p + line.n;
    spconv__span tok;
    for (int i = 0; i < e->num_properties; ++i) {
        const spconv__ply_property *p = &l->properties[e->first_property + i];
        if (!spconv__next_token(&cur, end, &tok)) return too_few(pr, e);
        if (!p->is_list) {
            unsigned char *dst = record != NULL ? record + out->fields[i].offset : pr->scratch;
            SPCONV_FORWARD_IF_ERROR(ascii_value(pr, p, p->type, tok, dst));
            continue;
        }
        SPCONV_FORWARD_IF_ERROR(ascii_value(pr, p, p->count_type, tok, pr->scratch));
        int64_t n = list_length(pr->scratch, p->count_type);
        SPCONV_RETURN_ERROR_IF(n < 0, SPCONV_ERR_FORMAT, "%s: '%s' line %d: list '%.*s' has a "
                               "negative length %" PRId64, pr->func, pr->path, pr->line_no,
                               (int)p->name.n, p->name.p, n);
        for (int64_t k = 0; k < n; ++k) {
            if (!spconv__next_token(&cur, end, &tok)) return too_few(pr, e);
            SPCONV_FORWARD_IF_ERROR(ascii_value(pr, p, p->type, tok, pr->scratch));
        }
    }
    SPCONV_RETURN_ERROR_IF(spconv__next_token(&cur, end, &tok), SPCONV_ERR_FORMAT,
                           "%s: '%s' line %d: a row of element '%.*s' with more values than its "
                           "properties take", pr->func, pr->path, pr->line_no, (int)e->name.n,
                           e->name.p);
    return SPCONV_OK;
}

static spconv_status ascii_element(ply_reader *pr, int index, spconv__native_cloud *out) {
    const spconv__ply_layout *l = pr->layout;
    const spconv__ply_element *e = &l->elements[index];
    spconv__span line;
    for (uint64_t row = 0; row < e->count; ++row) {
        SPCONV_RETURN_ERROR_IF(!next_row_line(pr, &line), SPCONV_ERR_FORMAT,
                               "%s: '%s': the data ends after %" PRIu64 " of the %" PRIu64
                               " rows of element '%.*s'", pr->func, pr->path, row, e->count,
                               (int)e->name.n, e->name.p);
        unsigned char *record = index == l->vertex ? out->data + row * out->raw.point_step : NULL;
        SPCONV_FORWARD_IF_ERROR(ascii_row(pr, e, line, record, out));
    }
    return SPCONV_OK;
}

spconv_status spconv__ply_read(const char *func, const char *path, const char *text, size_t len,
                               const spconv__ply_header *h, const spconv__ply_layout *layout,
                               spconv__native_cloud *out) {
    const uint16_t probe = 1;
    const int host_big = *(const unsigned char *)&probe == 0;
    unsigned char scratch[8];
    ply_reader pr = {func, path, text, len, (size_t)h->data_offset,
                     strcmp(h->format, "ascii") != 0,
                     (strcmp(h->format, "binary_big_endian") == 0) != host_big, 0, layout,
                     scratch};
    for (size_t i = 0; i < pr.pos; ++i) pr.line_no += text[i] == '\n';
    SPCONV_FORWARD_IF_ERROR(plan_vertex(&pr, h->vertices, out));
    spconv_status st = SPCONV_OK;
    for (int e = 0; st == SPCONV_OK && e < layout->num_elements; ++e)
        st = pr.binary ? binary_element(&pr, e, out) : ascii_element(&pr, e, out);
    spconv__span line;
    if (st == SPCONV_OK && !pr.binary && next_row_line(&pr, &line))
        st = spconv__error(SPCONV_ERR_FORMAT, "%s: '%s' line %d: values after the last row of "
                           "the last element", func, path, pr.line_no);
    if (st != SPCONV_OK) spconv__native_cloud_free(out);
    return st;
}
