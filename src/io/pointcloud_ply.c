/* PLY header validation before PCL reads a file. */
#include "io/pointcloud_ply.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/pointcloud_pcl.h"
#include "io/pointcloud_text.h"

#define MAX_ELEMENTS SPCONV_PLY_MAX_ELEMENTS
#define MAX_PROPERTIES 1024
/* PCL keeps element counts in 32-bit signed integers. */
#define MAX_COUNT ((uint64_t)INT32_MAX)

typedef struct ply_parser {
    const char *func, *path;
    int line_no;
    spconv__span line;
    int seen_format, binary;
    int num_elements;
    uint64_t counts[MAX_ELEMENTS];
    uint64_t row_bytes[MAX_ELEMENTS]; /* fewest bytes of one row (lists empty) */
    int num_properties[MAX_ELEMENTS];
    int vertex;                       /* element index of "vertex", -1 */
    int has_xyz[3];
    spconv__ply_header *h;
    spconv__ply_layout *layout;       /* what is recorded for the reader, or NULL */
} ply_parser;

static spconv_status line_error(const ply_parser *ps, const char *what) {
    char quoted[48];
    spconv__quote_line(ps->line, quoted, sizeof quoted);
    return spconv__error(SPCONV_ERR_FORMAT, "%s: '%s' is not a valid PLY file: header line %d "
                         "'%s': %s", ps->func, ps->path, ps->line_no, quoted, what);
}

static const struct ply_type {
    const char *name;
    unsigned size;
    spconv__scalar scalar;
} ply_types[] = {{"char", 1, SPCONV__I8},     {"uchar", 1, SPCONV__U8},   {"int8", 1, SPCONV__I8},
                 {"uint8", 1, SPCONV__U8},    {"short", 2, SPCONV__I16},  {"ushort", 2, SPCONV__U16},
                 {"int16", 2, SPCONV__I16},   {"uint16", 2, SPCONV__U16}, {"int", 4, SPCONV__I32},
                 {"uint", 4, SPCONV__U32},    {"int32", 4, SPCONV__I32},  {"uint32", 4, SPCONV__U32},
                 {"float", 4, SPCONV__F32},   {"float32", 4, SPCONV__F32}, {"double", 8, SPCONV__F64},
                 {"float64", 8, SPCONV__F64}};

/* The PLY scalar type named @p t, NULL for an unknown name. */
static const struct ply_type *find_type(spconv__span t) {
    for (size_t i = 0; i < sizeof ply_types / sizeof ply_types[0]; ++i)
        if (spconv__span_is(t, ply_types[i].name)) return &ply_types[i];
    return NULL;
}

/* Bytes of a PLY scalar type, 0 for an unknown name. */
static unsigned type_size(spconv__span t) {
    const struct ply_type *type = find_type(t);
    return type != NULL ? type->size : 0;
}

/* Record one property of the latest element for the reader. */
static spconv_status record_property(ply_parser *ps, spconv__span name, spconv__span type,
                                     spconv__span count_type, int is_list) {
    spconv__ply_layout *l = ps->layout;
    if (l == NULL) return SPCONV_OK;
    if (l->num_properties == l->capacity) {
        int capacity = l->capacity > 0 ? 2 * l->capacity : 16;
        spconv__ply_property *grown = realloc(l->properties, (size_t)capacity * sizeof *grown);
        SPCONV_RETURN_ERROR_IF(grown == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory",
                               ps->func);
        l->properties = grown;
        l->capacity = capacity;
    }
    spconv__ply_property *p = &l->properties[l->num_properties++];
    p->name = name;
    p->type = find_type(type)->scalar;
    p->count_type = is_list ? find_type(count_type)->scalar : p->type;
    p->is_list = is_list;
    p->type_name = type;
    ++l->elements[ps->num_elements - 1].num_properties;
    return SPCONV_OK;
}

static spconv_status parse_format(ply_parser *ps, const char *cur, const char *end) {
    spconv__span kind, version;
    if (ps->seen_format) return line_error(ps, "format given twice");
    if (ps->num_elements > 0) return line_error(ps, "format must come before the elements");
    if (spconv__count_tokens(cur, end) != 2 || !spconv__next_token(&cur, end, &kind) ||
        !spconv__next_token(&cur, end, &version) || !spconv__span_is(version, "1.0"))
        return line_error(ps, "needs 'format <ascii|binary_little_endian|binary_big_endian> 1.0'");
    if (spconv__span_is(kind, "ascii")) ps->binary = 0;
    else if (spconv__span_is(kind, "binary_little_endian") ||
             spconv__span_is(kind, "binary_big_endian")) ps->binary = 1;
    else return line_error(ps, "unknown format (ascii, binary_little_endian, binary_big_endian)");
    memcpy(ps->h->format, kind.p, kind.n);
    ps->h->format[kind.n] = '\0';
    ps->seen_format = 1;
    return SPCONV_OK;
}

static spconv_status parse_element(ply_parser *ps, const char *cur, const char *end) {
    spconv__span name, count;
    uint64_t n;
    if (!ps->seen_format) return line_error(ps, "an element before the format line");
    if (ps->num_elements == MAX_ELEMENTS) return line_error(ps, "more than 64 elements");
    if (spconv__count_tokens(cur, end) != 2 || !spconv__next_token(&cur, end, &name) ||
        !spconv__next_token(&cur, end, &count) || !spconv__span_u64(count, MAX_COUNT, &n))
        return line_error(ps, "needs 'element <name> <count>' with a count in [0, 2^31)");
    int e = ps->num_elements++;
    ps->counts[e] = n;
    if (ps->layout != NULL) {
        ps->layout->num_elements = ps->num_elements;
        ps->layout->elements[e] = (spconv__ply_element){name, n, ps->layout->num_properties, 0};
    }
    if (spconv__span_is(name, "vertex")) {
        if (ps->vertex >= 0) return line_error(ps, "a second vertex element");
        ps->vertex = e;
        ps->h->vertices = n;
    }
    return SPCONV_OK;
}

static spconv_status parse_property(ply_parser *ps, const char *cur, const char *end) {
    if (ps->num_elements == 0) return line_error(ps, "a property before any element");
    int e = ps->num_elements - 1;
    if (ps->num_properties[e]++ == MAX_PROPERTIES)
        return line_error(ps, "more than 1024 properties in one element");
    spconv__span type, count_type, item_type, name;
    int tokens = spconv__count_tokens(cur, end);
    spconv__next_token(&cur, end, &type);
    if (tokens == 4 && spconv__span_is(type, "list")) {
        spconv__next_token(&cur, end, &count_type);
        spconv__next_token(&cur, end, &item_type);
        spconv__next_token(&cur, end, &name);
        unsigned count_size = type_size(count_type);
        if (count_size == 0 || count_size == 8 || spconv__span_is(count_type, "float") ||
            spconv__span_is(count_type, "float32") || type_size(item_type) == 0)
            return line_error(ps, "a list needs an integer count type and a known item type");
        /* A point is a fixed set of values; a list in the vertex element would make it vary from
         * vertex to vertex (PCL asserts on that). Lists of other elements (faces) are skipped. */
        if (e == ps->vertex)
            SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT, "%s: '%s' line %d: property list '%.*s' in "
                                "element 'vertex' is not supported (a point needs a fixed set of "
                                "scalar properties)", ps->func, ps->path, ps->line_no,
                                (int)name.n, name.p);
        /* An empty list still stores its count (binary) or one number (ascii). */
        ps->row_bytes[e] += ps->binary ? count_size : 2;
        return record_property(ps, name, item_type, count_type, 1);
    }
    if (tokens != 2) return line_error(ps, "needs 'property <type> <name>' or 'property list "
                                           "<count type> <item type> <name>'");
    spconv__next_token(&cur, end, &name);
    unsigned size = type_size(type);
    if (size == 0) return line_error(ps, "unknown property type");
    ps->row_bytes[e] += ps->binary ? size : 2;
    for (int a = 0; a < 3 && e == ps->vertex; ++a)
        if (spconv__span_is(name, (const char *[]){"x", "y", "z"}[a])) ps->has_xyz[a] = 1;
    return record_property(ps, name, type, type, 0);
}

static spconv_status parse_line(ply_parser *ps, int *is_end) {
    const char *cur = ps->line.p, *end = ps->line.p + ps->line.n;
    spconv__span key;
    *is_end = 0;
    if (!spconv__next_token(&cur, end, &key)) return SPCONV_OK;
    if (spconv__span_is(key, "comment") || spconv__span_is(key, "obj_info")) return SPCONV_OK;
    if (spconv__span_is(key, "format")) return parse_format(ps, cur, end);
    if (spconv__span_is(key, "element")) return parse_element(ps, cur, end);
    if (spconv__span_is(key, "property")) return parse_property(ps, cur, end);
    if (spconv__span_is(key, "end_header") && spconv__count_tokens(cur, end) == 0) {
        *is_end = 1;
        return SPCONV_OK;
    }
    return line_error(ps, "unknown keyword (expected format, comment, obj_info, element, property "
                          "or end_header)");
}

static spconv_status parse_lines(ply_parser *ps, const char *head, size_t head_len) {
    size_t pos = 0;
    ps->line_no = 1;
    int is_ply = spconv__next_line(head, head_len, &pos, &ps->line);
    if (is_ply) {
        const char *cur = ps->line.p, *end = ps->line.p + ps->line.n;
        spconv__span magic;
        is_ply = spconv__next_token(&cur, end, &magic) && magic.p == ps->line.p &&
                 spconv__span_is(magic, "ply") && spconv__count_tokens(cur, end) == 0;
    }
    SPCONV_RETURN_ERROR_IF(!is_ply, SPCONV_ERR_FORMAT,
                           "%s: '%s' is not a PLY file: it does not start with the line 'ply'",
                           ps->func, ps->path);
    while (spconv__next_line(head, head_len, &pos, &ps->line)) {
        ++ps->line_no;
        int is_end;
        SPCONV_FORWARD_IF_ERROR(parse_line(ps, &is_end));
        if (is_end) {
            ps->h->data_offset = pos;
            return SPCONV_OK;
        }
    }
    SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                        "%s: '%s' is not a valid PLY file: no end_header in the first %zu bytes",
                        ps->func, ps->path, head_len);
}

/* A format line, a vertex element with x, y, z, and room for every declared row. */
static spconv_status check_content(ply_parser *ps, uint64_t file_size) {
    SPCONV_RETURN_ERROR_IF(!ps->seen_format, SPCONV_ERR_FORMAT,
                           "%s: '%s' is not a valid PLY file: no format line", ps->func, ps->path);
    SPCONV_RETURN_ERROR_IF(ps->vertex < 0, SPCONV_ERR_FORMAT,
                           "%s: '%s' has no vertex element (a point cloud needs vertices with x, "
                           "y and z)", ps->func, ps->path);
    for (int a = 0; a < 3; ++a)
        SPCONV_RETURN_ERROR_IF(!ps->has_xyz[a], SPCONV_ERR_FORMAT,
                               "%s: '%s' has no vertex property '%c' (a point cloud needs x, y "
                               "and z)", ps->func, ps->path, "xyz"[a]);
    uint64_t need = 0;
    for (int e = 0; e < ps->num_elements; ++e)
        need += ps->counts[e] * ps->row_bytes[e]; /* <= 64 * 2^31 * 8 KiB: no overflow */
    /* The last ascii value needs no separator after it. */
    if (!ps->binary && need > 0) --need;
    uint64_t available = file_size - ps->h->data_offset;
    ps->h->min_data = need;
    SPCONV_RETURN_ERROR_IF(available < need, SPCONV_ERR_FORMAT,
                           "%s: '%s' declares %" PRIu64 " vertices (and its other elements) that "
                           "need at least %" PRIu64 " bytes of %s data, but only %" PRIu64
                           " bytes follow the header", ps->func, ps->path, ps->h->vertices, need,
                           ps->h->format, available);
    return SPCONV_OK;
}

spconv_status spconv__ply_check_layout(const char *func, const char *path, const char *head,
                                       size_t head_len, uint64_t file_size,
                                       spconv__ply_header *out, spconv__ply_layout **layout) {
    memset(out, 0, sizeof *out);
    if (layout != NULL) *layout = NULL;
    ply_parser *ps = calloc(1, sizeof *ps);
    spconv__ply_layout *l = layout != NULL ? calloc(1, sizeof *l) : NULL;
    if (ps == NULL || (layout != NULL && l == NULL)) {
        free(ps);
        free(l);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory", func);
    }
    ps->func = func;
    ps->path = path;
    ps->vertex = -1;
    ps->h = out;
    ps->layout = l;
    spconv_status st = parse_lines(ps, head, head_len);
    if (st == SPCONV_OK) st = check_content(ps, file_size);
    if (l != NULL) l->vertex = ps->vertex;
    free(ps);
    if (st != SPCONV_OK) {
        spconv__ply_layout_free(l);
        return st;
    }
    if (layout != NULL) *layout = l;
    return SPCONV_OK;
}

spconv_status spconv__ply_check(const char *func, const char *path, const char *head,
                                size_t head_len, uint64_t file_size, spconv__ply_header *out) {
    return spconv__ply_check_layout(func, path, head, head_len, file_size, out, NULL);
}

void spconv__ply_layout_free(spconv__ply_layout *layout) {
    if (layout == NULL) return;
    free(layout->properties);
    free(layout);
}
