/* PCD header validation (before PCL reads a file) and the binary PCD writer. */
#include "io/pointcloud_pcd.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/pointcloud_file.h"
#include "io/pointcloud_impl.h"
#include "io/pointcloud_text.h"

#define MAX_FIELDS 1024
#define MAX_FIELD_COUNT (1u << 20)
/* PCL counts points in 32-bit signed integers in places. */
#define MAX_POINTS ((uint64_t)INT32_MAX)

/* A decimal number as PCL's streams read it: sign, digits, point, exponent. */
static int span_number(spconv__span t) {
    char buf[64];
    if (t.n == 0 || t.n >= sizeof buf) return 0;
    memcpy(buf, t.p, t.n);
    buf[t.n] = '\0';
    char *end;
    (void)strtod(buf, &end);
    return *end == '\0';
}

/* ---- the parser ------------------------------------------------------------------------------ */

/* The keywords in the order the PCD format prescribes (PCL writes them so); each at most once.
 * Enforcing the order keeps PCL, which reads some of them in any order but sizes its buffers as
 * it goes, from seeing a header we understood differently. */
typedef enum pcd_key {
    KEY_VERSION, KEY_FIELDS, KEY_SIZE, KEY_TYPE, KEY_COUNT, KEY_WIDTH, KEY_HEIGHT, KEY_VIEWPOINT,
    KEY_POINTS, KEY_DATA, KEY_NONE
} pcd_key;

static const char *const key_names[KEY_NONE] = {"VERSION", "FIELDS", "SIZE", "TYPE", "COUNT",
                                                "WIDTH", "HEIGHT", "VIEWPOINT", "POINTS", "DATA"};

typedef struct pcd_parser {
    const char *func, *path;
    int line_no;
    spconv__span line;
    int last_key;   /* the latest keyword seen, -1 before the first */
    int seen[KEY_NONE];
    int num_fields;
    uint8_t sizes[MAX_FIELDS];
    uint32_t counts[MAX_FIELDS];
    char types[MAX_FIELDS];
    spconv__span names[MAX_FIELDS];
    int has_xyz[3];
    spconv__pcd_header *h;
} pcd_parser;

/* Record a message naming the line. */
static spconv_status line_error(const pcd_parser *ps, const char *what) {
    char quoted[48];
    spconv__quote_line(ps->line, quoted, sizeof quoted);
    return spconv__error(SPCONV_ERR_FORMAT, "%s: '%s' is not a valid PCD file: header line %d "
                         "'%s': %s", ps->func, ps->path, ps->line_no, quoted, what);
}

static spconv_status parse_fields(pcd_parser *ps, const char *cur, const char *end) {
    int n = spconv__count_tokens(cur, end);
    if (n < 1 || n > MAX_FIELDS) return line_error(ps, "needs 1 to 1024 field names");
    spconv__span tok;
    for (int i = 0; spconv__next_token(&cur, end, &tok); ++i) {
        for (int a = 0; a < 3; ++a)
            if (spconv__span_is(tok, (const char *[]){"x", "y", "z"}[a])) ps->has_xyz[a] = 1;
        ps->sizes[i] = 4; /* PCL's defaults for files that leave SIZE/TYPE/COUNT out */
        ps->counts[i] = 1;
        ps->types[i] = 'F';
        ps->names[i] = tok;
    }
    ps->num_fields = n;
    return SPCONV_OK;
}

/* SIZE, TYPE and COUNT: one value per field. */
static spconv_status check_per_field(pcd_parser *ps, const char *cur, const char *end) {
    if (!ps->seen[KEY_FIELDS]) return line_error(ps, "comes without FIELDS before it");
    if (spconv__count_tokens(cur, end) != ps->num_fields)
        return line_error(ps, "the number of values differs from the number of FIELDS");
    return SPCONV_OK;
}

static spconv_status parse_size(pcd_parser *ps, const char *cur, const char *end) {
    SPCONV_FORWARD_IF_ERROR(check_per_field(ps, cur, end));
    spconv__span tok;
    uint64_t v;
    for (int i = 0; spconv__next_token(&cur, end, &tok); ++i) {
        if (!spconv__span_u64(tok, 8, &v) || (v != 1 && v != 2 && v != 4 && v != 8))
            return line_error(ps, "a SIZE must be 1, 2, 4 or 8");
        ps->sizes[i] = (uint8_t)v;
    }
    return SPCONV_OK;
}

static spconv_status parse_type(pcd_parser *ps, const char *cur, const char *end) {
    if (!ps->seen[KEY_SIZE]) return line_error(ps, "TYPE needs SIZE before it");
    SPCONV_FORWARD_IF_ERROR(check_per_field(ps, cur, end));
    spconv__span tok;
    for (int i = 0; spconv__next_token(&cur, end, &tok); ++i) {
        char t = tok.n == 1 ? tok.p[0] : '?';
        if (t >= 'a' && t <= 'z') t = (char)(t - 'a' + 'A');
        int size = ps->sizes[i];
        int ok = (t == 'I' || t == 'U') || (t == 'F' && (size == 4 || size == 8)) ||
                 (t == 'B' && size == 1);
        if (!ok) return line_error(ps, "a TYPE must be I or U (any SIZE), F (SIZE 4 or 8) or B "
                                       "(SIZE 1)");
        ps->types[i] = t;
    }
    return SPCONV_OK;
}

static spconv_status parse_count(pcd_parser *ps, const char *cur, const char *end) {
    if (!ps->seen[KEY_TYPE]) return line_error(ps, "COUNT needs SIZE and TYPE before it");
    SPCONV_FORWARD_IF_ERROR(check_per_field(ps, cur, end));
    spconv__span tok;
    uint64_t v;
    for (int i = 0; spconv__next_token(&cur, end, &tok); ++i) {
        if (!spconv__span_u64(tok, MAX_FIELD_COUNT, &v) || v == 0)
            return line_error(ps, "a COUNT must be in [1, 1048576]");
        ps->counts[i] = (uint32_t)v;
    }
    return SPCONV_OK;
}

/* WIDTH, HEIGHT, POINTS: one count. */
static spconv_status parse_number(pcd_parser *ps, const char *cur, const char *end,
                                  uint64_t *value) {
    spconv__span tok;
    if (spconv__count_tokens(cur, end) != 1 || !spconv__next_token(&cur, end, &tok) ||
        !spconv__span_u64(tok, UINT32_MAX, value))
        return line_error(ps, "needs one count in [0, 4294967295]");
    return SPCONV_OK;
}

static spconv_status parse_version(pcd_parser *ps, const char *cur, const char *end) {
    spconv__span v;
    if (spconv__count_tokens(cur, end) != 1 || !spconv__next_token(&cur, end, &v) ||
        v.n >= sizeof ps->h->version)
        return line_error(ps, "needs one short version");
    memcpy(ps->h->version, v.p, v.n);
    ps->h->version[v.n] = '\0';
    return SPCONV_OK;
}

static spconv_status parse_viewpoint(pcd_parser *ps, const char *cur, const char *end) {
    spconv__span tok;
    if (spconv__count_tokens(cur, end) != 7) return line_error(ps, "needs 7 numbers (tx ty tz qw qx qy qz)");
    while (spconv__next_token(&cur, end, &tok))
        if (!span_number(tok)) return line_error(ps, "needs 7 numbers (tx ty tz qw qx qy qz)");
    return SPCONV_OK;
}

static spconv_status parse_data(pcd_parser *ps, const char *cur, const char *end) {
    spconv__span tok;
    if (spconv__count_tokens(cur, end) != 1 || !spconv__next_token(&cur, end, &tok))
        return line_error(ps, "needs one of ascii, binary, binary_compressed");
    if (spconv__span_is(tok, "ascii")) ps->h->data = SPCONV__PCD_ASCII;
    else if (spconv__span_is(tok, "binary")) ps->h->data = SPCONV__PCD_BINARY;
    else if (spconv__span_is(tok, "binary_compressed")) ps->h->data = SPCONV__PCD_BINARY_COMPRESSED;
    else return line_error(ps, "needs one of ascii, binary, binary_compressed");
    return SPCONV_OK;
}

static pcd_key key_of(spconv__span word) {
    if (spconv__span_is(word, "COLUMNS")) return KEY_FIELDS; /* the old name */
    for (int k = 0; k < KEY_NONE; ++k)
        if (spconv__span_is(word, key_names[k])) return (pcd_key)k;
    return KEY_NONE;
}

/* Dispatch one non-empty, non-comment line; *is_data is set on the DATA line. */
static spconv_status parse_line(pcd_parser *ps, int *is_data) {
    const char *cur = ps->line.p, *end = ps->line.p + ps->line.n;
    spconv__span word;
    spconv__next_token(&cur, end, &word);
    pcd_key key = key_of(word);
    *is_data = key == KEY_DATA;
    if (key == KEY_NONE)
        return line_error(ps, "unknown keyword (expected VERSION, FIELDS, SIZE, TYPE, COUNT, "
                              "WIDTH, HEIGHT, VIEWPOINT, POINTS or DATA)");
    if ((int)key <= ps->last_key)
        return line_error(ps, "repeated or out of order (the order is VERSION, FIELDS, SIZE, "
                              "TYPE, COUNT, WIDTH, HEIGHT, VIEWPOINT, POINTS, DATA)");
    ps->last_key = (int)key;
    ps->seen[key] = 1;
    spconv__pcd_header *h = ps->h;
    switch (key) {
    case KEY_VERSION: return parse_version(ps, cur, end);
    case KEY_FIELDS: return parse_fields(ps, cur, end);
    case KEY_SIZE: return parse_size(ps, cur, end);
    case KEY_TYPE: return parse_type(ps, cur, end);
    case KEY_COUNT: return parse_count(ps, cur, end);
    case KEY_WIDTH: return parse_number(ps, cur, end, &h->width);
    case KEY_HEIGHT: return parse_number(ps, cur, end, &h->height);
    case KEY_VIEWPOINT: return parse_viewpoint(ps, cur, end);
    case KEY_POINTS: return parse_number(ps, cur, end, &h->points);
    case KEY_DATA: return parse_data(ps, cur, end);
    case KEY_NONE: break;
    }
    return SPCONV_OK;
}

/* PCL matches keywords by prefix ("FIELDSxyz" is FIELDS to it), COLUMNS included. */
static int starts_with_keyword(spconv__span word) {
    static const char *const prefixes[] = {"VERSION", "FIELDS", "COLUMNS", "SIZE", "TYPE",
                                           "COUNT", "WIDTH", "HEIGHT", "VIEWPOINT", "POINTS",
                                           "DATA"};
    for (size_t k = 0; k < sizeof prefixes / sizeof prefixes[0]; ++k) {
        size_t n = strlen(prefixes[k]);
        if (word.n >= n && memcmp(word.p, prefixes[k], n) == 0) return 1;
    }
    return 0;
}

/* PCL's header parser does not stop at DATA: it goes on reading lines, skipping empty and
 * comment lines, and treats a line whose first word starts with a keyword as more header, even
 * inside binary data (where that corrupts its state); any other line, white space only included,
 * ends it. Refuse data that PCL would take for header. */
static spconv_status check_after_data(pcd_parser *ps, const char *head, size_t head_len,
                                      size_t pos) {
    while (spconv__next_line(head, head_len, &pos, &ps->line)) {
        ++ps->line_no;
        const char *cur = ps->line.p;
        spconv__span first;
        if (ps->line.n == 0) continue;
        if (!spconv__next_token(&cur, ps->line.p + ps->line.n, &first)) return SPCONV_OK;
        if (first.p[0] == '#') continue;
        if (starts_with_keyword(first))
            return line_error(ps, "the data after DATA starts like a header line, which PCL "
                                  "would read as more header");
        return SPCONV_OK;
    }
    return SPCONV_OK;
}

/* Walk the header lines up to and including DATA; sets data_offset. */
static spconv_status parse_lines(pcd_parser *ps, const char *head, size_t head_len) {
    size_t pos = 0;
    while (spconv__next_line(head, head_len, &pos, &ps->line)) {
        ++ps->line_no;
        const char *cur = ps->line.p;
        spconv__span first;
        if (ps->line.n == 0) continue; /* PCL skips empty lines... */
        if (!spconv__next_token(&cur, ps->line.p + ps->line.n, &first)) /* ...but ends here */
            return line_error(ps, "a line of only white space, where PCL stops reading the "
                                  "header (before DATA)");
        if (first.p[0] == '#') continue;
        int is_data;
        SPCONV_FORWARD_IF_ERROR(parse_line(ps, &is_data));
        if (is_data) {
            ps->h->data_offset = pos;
            return check_after_data(ps, head, head_len, pos);
        }
    }
    SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                        "%s: '%s' is not a valid PCD file: no DATA line in the first %zu bytes",
                        ps->func, ps->path, head_len);
}

/* FIELDS and POINTS present, x/y/z present, WIDTH * HEIGHT = POINTS; point sizes. */
static spconv_status check_layout(pcd_parser *ps) {
    spconv__pcd_header *h = ps->h;
    SPCONV_RETURN_ERROR_IF(!ps->seen[KEY_FIELDS] || !ps->seen[KEY_POINTS], SPCONV_ERR_FORMAT,
                           "%s: '%s' is not a valid PCD file: the header lacks %s", ps->func,
                           ps->path, !ps->seen[KEY_FIELDS] ? "FIELDS" : "POINTS");
    for (int a = 0; a < 3; ++a)
        SPCONV_RETURN_ERROR_IF(!ps->has_xyz[a], SPCONV_ERR_FORMAT,
                               "%s: '%s' has no field '%c' (a point cloud needs x, y and z)",
                               ps->func, ps->path, "xyz"[a]);
    /* PCL's conventions for old files: no WIDTH means unorganized, no HEIGHT means 1. */
    if (!ps->seen[KEY_WIDTH]) h->width = h->points;
    if (!ps->seen[KEY_HEIGHT]) h->height = 1;
    SPCONV_RETURN_ERROR_IF(h->width * h->height != h->points, SPCONV_ERR_FORMAT,
                           "%s: '%s' is not a valid PCD file: WIDTH %" PRIu64 " x HEIGHT %" PRIu64
                           " != POINTS %" PRIu64, ps->func, ps->path, h->width, h->height,
                           h->points);
    SPCONV_RETURN_ERROR_IF(h->points > MAX_POINTS, SPCONV_ERR_FORMAT,
                           "%s: '%s': POINTS %" PRIu64 " is more than PCL can index (%" PRIu64 ")",
                           ps->func, ps->path, h->points, MAX_POINTS);
    h->num_fields = ps->num_fields;
    h->point_step = 0;
    h->values = 0;
    for (int i = 0; i < ps->num_fields; ++i) {
        h->point_step += (uint64_t)ps->sizes[i] * ps->counts[i];
        h->values += ps->counts[i];
    }
    SPCONV_RETURN_ERROR_IF(h->values > SPCONV_PCD_MAX_VALUES, SPCONV_ERR_FORMAT,
                           "%s: '%s': %" PRIu64 " values per point (sum of COUNT) is more than %d",
                           ps->func, ps->path, h->values, SPCONV_PCD_MAX_VALUES);
    return SPCONV_OK;
}

static uint32_t load_u32le(const char *p) {
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
}

/* The bytes after the header must be able to hold POINTS points. */
static spconv_status check_data_size(const pcd_parser *ps, const char *head, size_t head_len,
                                     uint64_t file_size) {
    const spconv__pcd_header *h = ps->h;
    uint64_t available = file_size - h->data_offset;
    uint64_t needed = h->points * h->point_step; /* <= 2^31 * 8 * 4096 values: no overflow */
    const char *kind = spconv__pcd_data_name(h->data);
    if (h->data == SPCONV__PCD_BINARY) {
        SPCONV_RETURN_ERROR_IF(available < needed, SPCONV_ERR_FORMAT,
                               "%s: '%s' says POINTS %" PRIu64 " of %" PRIu64 " bytes (%" PRIu64
                               " bytes of binary data) but only %" PRIu64 " bytes follow the "
                               "header", ps->func, ps->path, h->points, h->point_step, needed,
                               available);
    } else if (h->data == SPCONV__PCD_BINARY_COMPRESSED) {
        SPCONV_RETURN_ERROR_IF(available < 8, SPCONV_ERR_FORMAT,
                               "%s: '%s' ends before the sizes of its compressed block", ps->func,
                               ps->path);
        SPCONV_RETURN_ERROR_IF(h->data_offset + 8 > head_len, SPCONV_ERR_FORMAT,
                               "%s: '%s' has a header longer than %u bytes", ps->func, ps->path,
                               SPCONV_PCD_MAX_HEADER);
        uint32_t compressed = load_u32le(head + h->data_offset);
        uint32_t uncompressed = load_u32le(head + h->data_offset + 4);
        SPCONV_RETURN_ERROR_IF(compressed > available - 8, SPCONV_ERR_FORMAT,
                               "%s: '%s': the compressed block claims %" PRIu32 " bytes but only "
                               "%" PRIu64 " follow", ps->func, ps->path, compressed, available - 8);
        SPCONV_RETURN_ERROR_IF(uncompressed != needed, SPCONV_ERR_FORMAT,
                               "%s: '%s': the compressed block unpacks to %" PRIu32 " bytes but "
                               "POINTS %" PRIu64 " x %" PRIu64 " bytes = %" PRIu64, ps->func,
                               ps->path, uncompressed, h->points, h->point_step, needed);
    } else if (h->points > 0) {
        /* Each value takes at least one character and one separator. */
        uint64_t least = h->points * h->values * 2 - 1;
        SPCONV_RETURN_ERROR_IF(available < least, SPCONV_ERR_FORMAT,
                               "%s: '%s' says POINTS %" PRIu64 " of %" PRIu64 " values but its %"
                               PRIu64 " bytes of %s data cannot hold them", ps->func, ps->path,
                               h->points, h->values, available, kind);
    }
    return SPCONV_OK;
}

/* The fields as the parser recorded them, in a new array. */
static spconv_status copy_fields(const pcd_parser *ps, spconv__pcd_field **fields) {
    spconv__pcd_field *f = calloc((size_t)ps->num_fields, sizeof *f);
    SPCONV_RETURN_ERROR_IF(f == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory", ps->func);
    for (int i = 0; i < ps->num_fields; ++i)
        f[i] = (spconv__pcd_field){ps->names[i], ps->types[i], ps->sizes[i], ps->counts[i]};
    *fields = f;
    return SPCONV_OK;
}

spconv_status spconv__pcd_check_fields(const char *func, const char *path, const char *head,
                                       size_t head_len, uint64_t file_size,
                                       spconv__pcd_header *out, spconv__pcd_field **fields) {
    memset(out, 0, sizeof *out);
    if (fields != NULL) *fields = NULL;
    pcd_parser *ps = calloc(1, sizeof *ps);
    SPCONV_RETURN_ERROR_IF(ps == NULL, SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory", func);
    ps->func = func;
    ps->path = path;
    ps->last_key = -1;
    ps->h = out;
    spconv_status st = parse_lines(ps, head, head_len);
    if (st == SPCONV_OK) st = check_layout(ps);
    if (st == SPCONV_OK) st = check_data_size(ps, head, head_len, file_size);
    if (st == SPCONV_OK && fields != NULL) st = copy_fields(ps, fields);
    free(ps);
    return st;
}

spconv_status spconv__pcd_check(const char *func, const char *path, const char *head,
                                size_t head_len, uint64_t file_size, spconv__pcd_header *out) {
    return spconv__pcd_check_fields(func, path, head, head_len, file_size, out, NULL);
}

const char *spconv__pcd_data_name(spconv__pcd_data data) {
    switch (data) {
    case SPCONV__PCD_ASCII: return "ascii";
    case SPCONV__PCD_BINARY: return "binary";
    case SPCONV__PCD_BINARY_COMPRESSED: return "binary_compressed";
    }
    return "unknown";
}

/* ---- writing -------------------------------------------------------------------------------- */

static spconv_status check_field_names(const char *func, const char *const *names, int64_t count) {
    for (int64_t i = 0; names != NULL && i < count; ++i) {
        const char *name = names[i];
        SPCONV_RETURN_ERROR_IF(name == NULL || name[0] == '\0', SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: field name %lld is %s", func, (long long)i,
                               name == NULL ? "NULL" : "empty");
        for (const char *c = name; *c != '\0'; ++c)
            SPCONV_RETURN_ERROR_IF((unsigned char)*c <= ' ' || *c == 127,
                                   SPCONV_ERR_INVALID_ARGUMENT,
                                   "%s: field name %lld ('%s') contains white space or control "
                                   "characters", func, (long long)i, name);
    }
    return SPCONV_OK;
}

/* One header line "KEY v v v ..." with a value per field. */
static void put_per_field(spconv__file_writer *w, const char *key, int64_t count,
                          const char *const *names, const char *value) {
    spconv__file_writer_put(w, key, strlen(key));
    static const char *const xyz[3] = {"x", "y", "z"};
    for (int64_t i = 0; i < count; ++i) {
        char generated[32];
        const char *v = value;
        if (v == NULL && names != NULL) {
            v = names[i];
        } else if (v == NULL) {
            snprintf(generated, sizeof generated, "f%lld", (long long)i);
            v = i < 3 ? xyz[i] : generated;
        }
        spconv__file_writer_put(w, " ", 1);
        spconv__file_writer_put(w, v, strlen(v));
    }
    spconv__file_writer_put(w, "\n", 1);
}

spconv_status spconv_pcd_write(spconv_context *ctx, const char *path, const spconv_tensor *points,
                               const char *const *field_names) {
    static const char func[] = "spconv_pcd_write";
    spconv_tensor *host;
    SPCONV_FORWARD_IF_ERROR(spconv__cloud_host_f32(ctx, func, points, &host));
    int64_t rows = spconv_tensor_size(host, 0), cols = spconv_tensor_size(host, 1);
    spconv_status st = SPCONV_OK;
    if (cols > SPCONV_PCD_MAX_VALUES || rows > (int64_t)MAX_POINTS)
        st = spconv__error(SPCONV_ERR_INVALID_ARGUMENT, "%s: [%lld, %lld] is larger than a PCD "
                           "file holds (%d fields, %" PRIu64 " points)", func, (long long)rows,
                           (long long)cols, SPCONV_PCD_MAX_VALUES, MAX_POINTS);
    if (st == SPCONV_OK) st = check_field_names(func, field_names, cols);
    spconv__file_writer w;
    if (st == SPCONV_OK) st = spconv__file_writer_open(func, path, &w);
    if (st == SPCONV_OK) {
        static const char intro[] = "# .PCD v0.7 - Point Cloud Data file format (spconv)\n"
                                    "VERSION 0.7\n";
        spconv__file_writer_put(&w, intro, sizeof intro - 1);
        put_per_field(&w, "FIELDS", cols, field_names, NULL);
        put_per_field(&w, "SIZE", cols, NULL, "4");
        put_per_field(&w, "TYPE", cols, NULL, "F");
        put_per_field(&w, "COUNT", cols, NULL, "1");
        char counts[160];
        int n = snprintf(counts, sizeof counts,
                         "WIDTH %lld\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS %lld\nDATA binary\n",
                         (long long)rows, (long long)rows);
        spconv__file_writer_put(&w, counts, (size_t)n);
        spconv__file_writer_put(&w, spconv_tensor_data(host), (size_t)(rows * cols) * sizeof(float));
        st = spconv__file_writer_commit(func, &w);
    }
    spconv_tensor_release(host);
    return st;
}
