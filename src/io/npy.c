/* NumPy .npy files. The format (numpy/lib/format.py, NEP 1): the magic "\x93NUMPY", a major and a
 * minor version byte, the header length (little-endian uint16 for version 1.0, uint32 for 2.0 and
 * 3.0), then a Python dict literal with the keys 'descr', 'fortran_order' and 'shape', padded with
 * spaces and ended by '\n', then the raw elements. Reading takes any valid header (keys in any
 * order, either quote style, trailing commas); writing produces the bytes np.save produces. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/pointcloud_file.h"
#include "spconv/npy.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
/* NumPy's default limit is 10000 bytes; we allow more but bound the allocation a file can ask. */
#define NPY_MAX_HEADER_BYTES (1u << 20)
#define NPY_MAX_DESCR 64

typedef struct npy_dtype_entry {
    char kind;
    int bytes;
    spconv_dtype dtype;
} npy_dtype_entry;

static const npy_dtype_entry npy_dtypes[] = {
    {'i', 4, SPCONV_I32}, {'i', 8, SPCONV_I64}, {'f', 2, SPCONV_F16},
    {'f', 4, SPCONV_F32}, {'f', 8, SPCONV_F64}, {'u', 1, SPCONV_U8},
};
#define NPY_DTYPE_COUNT (sizeof npy_dtypes / sizeof npy_dtypes[0])
#define NPY_SUPPORTED "<i4, <i8, <f2, <f4, <f8, |u1"

typedef struct npy_header {
    spconv_dtype dtype;
    int fortran_order;
    int ndim;
    int64_t shape[SPCONV_MAX_DIMS];
} npy_header;

/* A cursor over the header text; `path` only names the file in messages. */
typedef struct npy_parser {
    const char *path;
    const char *text;
    size_t len;
    size_t pos;
} npy_parser;

/* ---- reading the header dict ----------------------------------------------------------------- */

static spconv_status malformed(const npy_parser *p, const char *what) {
    SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                        "spconv_npy_read: '%s': malformed header: %s (at byte %zu of the header)",
                        p->path, what, p->pos);
}

static void skip_space(npy_parser *p) {
    while (p->pos < p->len && (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' ||
                               p->text[p->pos] == '\n' || p->text[p->pos] == '\r'))
        ++p->pos;
}

static int peek(const npy_parser *p) {
    return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1;
}

/* Consume `c` (after blanks) or fail with a message naming what was expected. */
static spconv_status expect_char(npy_parser *p, char c, const char *what) {
    skip_space(p);
    if (peek(p) != c) return malformed(p, what);
    ++p->pos;
    return SPCONV_OK;
}

/* A Python string literal in single or double quotes, without escapes, into buf. */
static spconv_status parse_string(npy_parser *p, char *buf, size_t cap) {
    skip_space(p);
    int quote = peek(p);
    if (quote != '\'' && quote != '"') return malformed(p, "expected a quoted string");
    size_t start = ++p->pos;
    while (p->pos < p->len && p->text[p->pos] != quote) {
        unsigned char c = (unsigned char)p->text[p->pos];
        if (c == '\\') return malformed(p, "escape sequences in strings are not supported");
        if (c == '\n') return malformed(p, "unterminated string");
        if (c < 0x20) return malformed(p, "control character inside a string");
        ++p->pos;
    }
    if (p->pos == p->len) return malformed(p, "unterminated string");
    size_t n = p->pos - start;
    if (n >= cap) return malformed(p, "string too long");
    memcpy(buf, p->text + start, n);
    buf[n] = '\0';
    ++p->pos;
    return SPCONV_OK;
}

static int starts_with(const npy_parser *p, const char *word) {
    size_t n = strlen(word);
    return p->len - p->pos >= n && memcmp(p->text + p->pos, word, n) == 0;
}

static spconv_status parse_bool(npy_parser *p, int *out) {
    skip_space(p);
    if (starts_with(p, "True"))
        *out = 1;
    else if (starts_with(p, "False"))
        *out = 0;
    else
        return malformed(p, "'fortran_order' must be True or False");
    p->pos += *out ? 4 : 5;
    return SPCONV_OK;
}

/* A non-negative decimal integer; an 'L' suffix (Python 2 longs, old NumPy files) is allowed. */
static spconv_status parse_dim(npy_parser *p, int64_t *out) {
    skip_space(p);
    if (peek(p) < '0' || peek(p) > '9')
        return malformed(p, "expected a non-negative integer in 'shape'");
    int64_t value = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        int digit = peek(p) - '0';
        if (value > (INT64_MAX - digit) / 10)
            SPCONV_RETURN_ERROR(
                SPCONV_ERR_FORMAT,
                "spconv_npy_read: '%s': shape dim at byte %zu does not fit in int64", p->path,
                p->pos);
        value = value * 10 + digit;
        ++p->pos;
    }
    if (peek(p) == 'L' || peek(p) == 'l') ++p->pos;
    *out = value;
    return SPCONV_OK;
}

/* A tuple of dims: "()", "(n,)", "(a, b)", "(a, b,)". As in Python, "(n)" is not a tuple. */
static spconv_status parse_shape(npy_parser *p, npy_header *h) {
    SPCONV_FORWARD_IF_ERROR(expect_char(p, '(', "'shape' must be a tuple"));
    h->ndim = 0;
    int saw_comma = 0;
    for (;;) {
        skip_space(p);
        if (peek(p) == ')') break;
        if (h->ndim == SPCONV_MAX_DIMS)
            SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                                "spconv_npy_read: '%s': shape has more than %d dims", p->path,
                                SPCONV_MAX_DIMS);
        SPCONV_FORWARD_IF_ERROR(parse_dim(p, &h->shape[h->ndim]));
        ++h->ndim;
        skip_space(p);
        saw_comma = peek(p) == ',';
        if (saw_comma)
            ++p->pos;
        else if (peek(p) != ')')
            return malformed(p, "expected ',' or ')' in 'shape'");
    }
    if (h->ndim == 1 && !saw_comma) return malformed(p, "'shape' (n) is not a tuple; write (n,)");
    ++p->pos;
    return SPCONV_OK;
}

/* Byte-order character, kind and size -> dtype. Byte order does not matter for one-byte types, so
 * '|', '<', '>', '=' and none are all accepted there; wider types must say '<' ('=' would mean
 * the writer's native order, which the file does not record). */
static spconv_status descr_to_dtype(const char *path, const char *descr, spconv_dtype *out) {
    char order = (descr[0] != '\0' && strchr("<>|=", descr[0]) != NULL) ? descr[0] : '\0';
    const char *body = order ? descr + 1 : descr;
    /* The size is a plain decimal number without a leading zero, as NumPy spells it. */
    long bytes = 0;
    if (body[0] != '\0' && body[1] >= '1' && body[1] <= '9' && strlen(body + 1) <= 2 &&
        strspn(body + 1, "0123456789") == strlen(body + 1))
        bytes = strtol(body + 1, NULL, 10);
    for (size_t i = 0; bytes > 0 && i < NPY_DTYPE_COUNT; ++i) {
        if (npy_dtypes[i].kind != body[0] || npy_dtypes[i].bytes != bytes) continue;
        if (bytes == 1 || order == '<') {
            *out = npy_dtypes[i].dtype;
            return SPCONV_OK;
        }
        SPCONV_RETURN_ERROR_IF(order == '>', SPCONV_ERR_FORMAT,
                               "spconv_npy_read: '%s': big-endian data ('%s') is not supported; "
                               "save it little-endian (arr.astype('<%s'))",
                               path, descr, body);
        SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                            "spconv_npy_read: '%s': dtype '%s' does not say little-endian ('<%s')",
                            path, descr, body);
    }
    SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                        "spconv_npy_read: '%s': unsupported dtype '%s' (supported: %s)", path,
                        descr, NPY_SUPPORTED);
}

/* The value of one key; `seen` catches duplicates (bit 0 descr, 1 fortran_order, 2 shape). */
static spconv_status parse_entry(npy_parser *p, npy_header *h, unsigned *seen) {
    char key[32];
    SPCONV_FORWARD_IF_ERROR(parse_string(p, key, sizeof key));
    SPCONV_FORWARD_IF_ERROR(expect_char(p, ':', "expected ':' after a key"));
    const char *keys[3] = {"descr", "fortran_order", "shape"};
    int which = -1;
    for (int i = 0; i < 3; ++i)
        if (strcmp(key, keys[i]) == 0) which = i;
    SPCONV_RETURN_ERROR_IF(which < 0, SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': unexpected header key '%s'", p->path, key);
    SPCONV_RETURN_ERROR_IF(*seen & (1u << which), SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': header key '%s' appears twice", p->path, key);
    *seen |= 1u << which;
    if (which == 1) return parse_bool(p, &h->fortran_order);
    if (which == 2) return parse_shape(p, h);
    skip_space(p);
    SPCONV_RETURN_ERROR_IF(peek(p) == '[', SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': unsupported dtype: structured dtypes (a 'descr' "
                           "list) are not supported",
                           p->path);
    char descr[NPY_MAX_DESCR];
    SPCONV_FORWARD_IF_ERROR(parse_string(p, descr, sizeof descr));
    return descr_to_dtype(p->path, descr, &h->dtype);
}

static spconv_status parse_header(npy_parser *p, npy_header *h) {
    SPCONV_FORWARD_IF_ERROR(expect_char(p, '{', "expected '{' opening the header dict"));
    unsigned seen = 0;
    for (;;) {
        skip_space(p);
        if (peek(p) == '}') break;
        SPCONV_FORWARD_IF_ERROR(parse_entry(p, h, &seen));
        skip_space(p);
        if (peek(p) == ',')
            ++p->pos;
        else if (peek(p) != '}')
            return malformed(p, "expected ',' or '}' after a value");
    }
    ++p->pos;
    skip_space(p);
    if (p->pos != p->len) return malformed(p, "unexpected text after the header dict");
    const char *keys[3] = {"descr", "fortran_order", "shape"};
    for (int i = 0; i < 3; ++i)
        SPCONV_RETURN_ERROR_IF(!(seen & (1u << i)), SPCONV_ERR_FORMAT,
                               "spconv_npy_read: '%s': header has no '%s' key", p->path, keys[i]);
    SPCONV_RETURN_ERROR_IF(h->fortran_order, SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': Fortran-order arrays are not supported; save "
                           "np.ascontiguousarray(arr)",
                           p->path);
    return SPCONV_OK;
}

/* ---- reading the file ------------------------------------------------------------------------ */

static uint32_t read_le(const unsigned char *bytes, int count) {
    uint32_t value = 0;
    for (int i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
    return value;
}

/* Bytes of data the shape needs; SPCONV_ERR_FORMAT when that overflows. Zero dims are set
 * aside first so that (0, huge, huge) still counts as absurd: the strides must fit too. */
static spconv_status data_bytes(const char *path, const npy_header *h, int64_t *out) {
    int64_t product = (int64_t)spconv_dtype_size(h->dtype);
    int has_zero = 0;
    for (int i = 0; i < h->ndim; ++i) {
        if (h->shape[i] == 0) {
            has_zero = 1;
            continue;
        }
        SPCONV_RETURN_ERROR_IF(product > INT64_MAX / h->shape[i], SPCONV_ERR_FORMAT,
                               "spconv_npy_read: '%s': shape dim %d = %lld makes the array size "
                               "overflow int64",
                               path, i, (long long)h->shape[i]);
        product *= h->shape[i];
    }
    *out = has_zero ? 0 : product;
    return SPCONV_OK;
}

/* Magic, version, header length: the number of bytes before the dict and the dict's length. */
static spconv_status read_preamble(FILE *f, const char *path, int64_t file_size, size_t *prefix_len,
                                   size_t *header_len) {
    unsigned char pre[12];
    SPCONV_RETURN_ERROR_IF(
        file_size < 10 || fread(pre, 1, 8, f) != 8, SPCONV_ERR_FORMAT,
        "spconv_npy_read: '%s': file of %lld bytes is too short for a .npy header", path,
        (long long)file_size);
    SPCONV_RETURN_ERROR_IF(memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) != 0, SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': not a .npy file (bad magic bytes "
                           "%02x %02x %02x %02x %02x %02x)",
                           path, pre[0], pre[1], pre[2], pre[3], pre[4], pre[5]);
    int major = pre[6], minor = pre[7];
    SPCONV_RETURN_ERROR_IF(major < 1 || major > 3 || minor != 0, SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': unsupported .npy version %d.%d (supported: 1.0, "
                           "2.0, 3.0)",
                           path, major, minor);
    int len_bytes = major == 1 ? 2 : 4;
    *prefix_len = 8 + (size_t)len_bytes;
    SPCONV_RETURN_ERROR_IF(file_size < (int64_t)*prefix_len ||
                               fread(pre + 8, 1, (size_t)len_bytes, f) != (size_t)len_bytes,
                           SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': file ends inside the header "
                           "length",
                           path);
    uint32_t len = read_le(pre + 8, len_bytes);
    SPCONV_RETURN_ERROR_IF(len > NPY_MAX_HEADER_BYTES, SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': header length %lu exceeds the limit of %u bytes",
                           path, (unsigned long)len, NPY_MAX_HEADER_BYTES);
    SPCONV_RETURN_ERROR_IF((int64_t)len > file_size - (int64_t)*prefix_len, SPCONV_ERR_FORMAT,
                           "spconv_npy_read: '%s': header length %lu runs past the end of the "
                           "%lld-byte file",
                           path, (unsigned long)len, (long long)file_size);
    *header_len = len;
    return SPCONV_OK;
}

static spconv_status read_header(FILE *f, const char *path, int64_t file_size, npy_header *h,
                                 int64_t *data_offset) {
    size_t prefix_len = 0, header_len = 0;
    SPCONV_FORWARD_IF_ERROR(read_preamble(f, path, file_size, &prefix_len, &header_len));
    char *text = malloc(header_len + 1);
    SPCONV_RETURN_ERROR_IF(text == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "spconv_npy_read: out of host memory for a %zu-byte header", header_len);
    spconv_status st = SPCONV_OK;
    if (fread(text, 1, header_len, f) != header_len)
        st = spconv__error(SPCONV_ERR_IO, "spconv_npy_read: '%s': reading the header failed: %s",
                           path, ferror(f) ? strerror(errno) : "unexpected end of file");
    if (st == SPCONV_OK) {
        npy_parser parser = {path, text, header_len, 0};
        st = parse_header(&parser, h);
    }
    free(text);
    *data_offset = (int64_t)(prefix_len + header_len);
    return st;
}

/* Through the library's one input opener: a named pipe or device is refused before any read. */
static spconv_status open_for_reading(const char *path, FILE **out, int64_t *size) {
    uint64_t bytes = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__file_open_read("spconv_npy_read", path, out, &bytes));
    *size = (int64_t)bytes;
    return SPCONV_OK;
}

static void describe_shape(const npy_header *h, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < h->ndim && used < cap; ++i)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "",
                                 (long long)h->shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, h->ndim == 1 ? ",)" : ")");
}

/* The tensor that the header describes, after checking the file holds exactly its bytes. */
static spconv_status read_data(FILE *f, const char *path, const npy_header *h, int64_t available,
                               spconv_tensor **out) {
    int64_t needed = 0;
    SPCONV_FORWARD_IF_ERROR(data_bytes(path, h, &needed));
    if (needed != available) {
        char shape[256];
        describe_shape(h, shape, sizeof shape);
        SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                            "spconv_npy_read: '%s': header lies about the size: shape %s of %s "
                            "needs %lld data bytes but the file %s %lld",
                            path, shape, spconv_dtype_name(h->dtype), (long long)needed,
                            needed > available ? "is truncated, holding only"
                                               : "is longer, holding",
                            (long long)available);
    }
    spconv_tensor *t;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_empty(spconv_cpu(), h->dtype, h->ndim, h->shape, &t));
    if (needed > 0 && fread(spconv_tensor_data(t), 1, (size_t)needed, f) != (size_t)needed) {
        int err = ferror(f) ? errno : 0;
        spconv_tensor_release(t);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO,
                            "spconv_npy_read: '%s': reading %lld data bytes failed: %s", path,
                            (long long)needed, err ? strerror(err) : "unexpected end of file");
    }
    *out = t;
    return SPCONV_OK;
}

spconv_status spconv_npy_read(const char *path, spconv_tensor **out) {
    SPCONV_CHECK_NOT_NULL("spconv_npy_read", out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL("spconv_npy_read", path);
    FILE *f = NULL;
    int64_t file_size = 0;
    SPCONV_FORWARD_IF_ERROR(open_for_reading(path, &f, &file_size));
    npy_header h = {0};
    int64_t data_offset = 0;
    spconv_status st = read_header(f, path, file_size, &h, &data_offset);
    if (st == SPCONV_OK) st = read_data(f, path, &h, file_size - data_offset, out);
    fclose(f);
    return st;
}

/* ---- writing --------------------------------------------------------------------------------- */

static const char *dtype_descr(spconv_dtype dtype) {
    switch (dtype) {
    case SPCONV_I32: return "<i4";
    case SPCONV_I64: return "<i8";
    case SPCONV_F16: return "<f2";
    case SPCONV_F32: return "<f4";
    case SPCONV_F64: return "<f8";
    case SPCONV_U8: return "|u1";
    case SPCONV_BF16: break;
    }
    return NULL;
}

/* The whole preamble + header as np.save writes it. The dict is at most ~230 bytes (8 dims of 19
 * digits), so version 1.0 with its 16-bit length always suffices; @p buf holds 512 bytes.
 * np.save (NumPy >= 1.23) also puts up to 21 spaces after the dict so that the first dim can grow
 * in place, then pads. For at most 8 dims whose product fits in int64 (as the reader demands) the
 * dict plus those spaces stays under 117 bytes, so the header is 128 bytes with or without them
 * and padding alone gives the same bytes. */
static size_t build_header(const spconv_tensor *t, char *buf) {
    char dict[400];
    int ndim = spconv_tensor_ndim(t);
    size_t n =
        (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                         dtype_descr(spconv_tensor_dtype(t)));
    for (int i = 0; i < ndim; ++i)
        n += (size_t)snprintf(dict + n, sizeof dict - n, "%s%lld", i ? ", " : "",
                              (long long)spconv_tensor_size(t, i));
    n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }", ndim == 1 ? "," : "");
    size_t prefix = NPY_MAGIC_LEN + 2 + 2;
    /* np.save pads with 1..64 spaces (64, not 0, when already aligned) before the final '\n'. */
    size_t pad = NPY_ALIGN - (prefix + n + 1) % NPY_ALIGN;
    size_t header_len = n + pad + 1;
    memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (char)(header_len & 0xFF);
    buf[9] = (char)(header_len >> 8);
    memcpy(buf + prefix, dict, n);
    memset(buf + prefix + n, ' ', pad);
    buf[prefix + header_len - 1] = '\n';
    return prefix + header_len;
}

/* Header and data through the one writer of every output file (a temporary created
 * exclusively beside @p path, renamed over it only when all of it was written). */
static spconv_status write_file(const char *path, const char *header, size_t header_len,
                                const void *data, size_t data_len) {
    spconv__file_writer w;
    SPCONV_FORWARD_IF_ERROR(spconv__file_writer_open("spconv_npy_write", path, &w));
    spconv__file_writer_put(&w, header, header_len);
    spconv__file_writer_put(&w, data, data_len);
    return spconv__file_writer_commit("spconv_npy_write", &w);
}

spconv_status spconv_npy_write(spconv_context *ctx, const char *path, const spconv_tensor *t) {
    SPCONV_CHECK_NOT_NULL("spconv_npy_write", path);
    SPCONV_CHECK_NOT_NULL("spconv_npy_write", t);
    spconv_dtype dtype = spconv_tensor_dtype(t);
    SPCONV_RETURN_ERROR_IF(
        dtype_descr(dtype) == NULL, SPCONV_ERR_DTYPE_MISMATCH,
        "spconv_npy_write: '%s': dtype %s has no .npy equivalent (supported: " NPY_SUPPORTED ")",
        path, spconv_dtype_name(dtype));
    char header[512];
    size_t header_len = build_header(t, header);
    size_t data_len = (size_t)spconv_tensor_numel(t) * spconv_dtype_size(dtype);
    /* A contiguous CPU tensor is written straight from its storage; anything else is first
     * gathered into host memory in row-major order. */
    int direct =
        spconv_tensor_device(t).type == SPCONV_DEVICE_CPU && spconv_tensor_is_contiguous(t);
    void *host = NULL;
    if (!direct && data_len > 0) {
        host = malloc(data_len);
        SPCONV_RETURN_ERROR_IF(host == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                               "spconv_npy_write: out of host memory for %zu bytes", data_len);
        spconv_status st = spconv_tensor_copy_to_host(ctx, t, host, data_len);
        if (st != SPCONV_OK) {
            free(host);
            return st;
        }
    }
    const void *data = direct ? spconv_tensor_data(t) : host;
    spconv_status st = write_file(path, header, header_len, data, data_len);
    free(host);
    return st;
}
