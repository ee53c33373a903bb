/* Raw clouds parsed in C and the ASCII value parser of the text formats (pointcloud_native.h). */
#include "io/pointcloud_native.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int spconv__native_cloud_alloc(spconv__native_cloud *c, size_t num_fields, size_t name_bytes,
                               uint64_t points, uint64_t point_step) {
    memset(c, 0, sizeof *c);
    uint64_t bytes = points * point_step; /* both bounded by the header checks: no overflow */
    c->fields = calloc(num_fields > 0 ? num_fields : 1, sizeof *c->fields);
    c->names = malloc(name_bytes > 0 ? name_bytes : 1);
    c->data = bytes < SIZE_MAX ? calloc(bytes > 0 ? (size_t)bytes : 1, 1) : NULL;
    if (c->fields == NULL || c->names == NULL || c->data == NULL) {
        spconv__native_cloud_free(c);
        return 0;
    }
    c->raw.data = c->data;
    c->raw.data_bytes = bytes;
    c->raw.point_step = point_step;
    c->raw.fields = c->fields;
    c->raw.num_fields = num_fields;
    return 1;
}

void spconv__native_cloud_free(spconv__native_cloud *c) {
    free(c->data);
    free(c->fields);
    free(c->names);
    memset(c, 0, sizeof *c);
}

const char *spconv__scalar_name(spconv__scalar type) {
    switch (type) {
    case SPCONV__BOOL: return "bool";
    case SPCONV__I8: return "int8";
    case SPCONV__U8: return "uint8";
    case SPCONV__I16: return "int16";
    case SPCONV__U16: return "uint16";
    case SPCONV__I32: return "int32";
    case SPCONV__U32: return "uint32";
    case SPCONV__I64: return "int64";
    case SPCONV__U64: return "uint64";
    case SPCONV__F32: return "float32";
    case SPCONV__F64: return "float64";
    }
    return "unknown";
}

/* Decimal digits only after an optional sign: strtoll/strtoull also take leading blanks, "0x"
 * prefixes (base 0) or, for strtoull, a '-' that wraps around; none of that is a PCD/PLY value. */
static int is_decimal(const char *s, int allow_minus) {
    if (*s == '+' || (allow_minus && *s == '-')) ++s;
    if (*s == '\0') return 0;
    for (; *s != '\0'; ++s)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

static spconv__value_result parse_signed(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!is_decimal(s, 1)) return SPCONV__VALUE_NOT_NUMBER;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi) return SPCONV__VALUE_RANGE;
    *out = v;
    return SPCONV__VALUE_OK;
}

static spconv__value_result parse_unsigned(const char *s, uint64_t hi, uint64_t *out) {
    if (s[0] == '-' && is_decimal(s + 1, 0)) return SPCONV__VALUE_RANGE; /* a number, below 0 */
    if (!is_decimal(s, 0)) return SPCONV__VALUE_NOT_NUMBER;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE || v > hi) return SPCONV__VALUE_RANGE;
    *out = v;
    return SPCONV__VALUE_OK;
}

static spconv__value_result parse_real(const char *s, int float32, double *out) {
    if (*s == '\0' || (*s != '+' && *s != '-' && *s != '.' && !(*s >= '0' && *s <= '9') &&
                       *s != 'n' && *s != 'N' && *s != 'i' && *s != 'I'))
        return SPCONV__VALUE_NOT_NUMBER; /* strtod would skip leading white space */
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0') return SPCONV__VALUE_NOT_NUMBER;
    /* An overflow in the text ("1e999") is out of range; a written "inf" or "nan" is a value. */
    int written_special = isinf(v) && errno != ERANGE ? 1 : isnan(v);
    int overflows = errno == ERANGE ? fabs(v) > 1.0 : float32 && isinf((float)v);
    if (!written_special && overflows) return SPCONV__VALUE_RANGE;
    *out = v;
    return SPCONV__VALUE_OK;
}

spconv__value_result spconv__ascii_value(spconv__span tok, spconv__scalar type, void *dst) {
    char s[72];
    if (tok.n == 0 || tok.n >= sizeof s) return SPCONV__VALUE_NOT_NUMBER;
    memcpy(s, tok.p, tok.n);
    s[tok.n] = '\0';
    int64_t i = 0;
    uint64_t u = 0;
    double d = 0.0;
    spconv__value_result r;
    switch (type) {
    case SPCONV__BOOL:
        if ((s[0] != '0' && s[0] != '1') || s[1] != '\0') return SPCONV__VALUE_NOT_NUMBER;
        *(uint8_t *)dst = (uint8_t)(s[0] == '1');
        return SPCONV__VALUE_OK;
    case SPCONV__I8:
        if ((r = parse_signed(s, INT8_MIN, INT8_MAX, &i)) == SPCONV__VALUE_OK) {
            int8_t v = (int8_t)i;
            memcpy(dst, &v, sizeof v);
        }
        return r;
    case SPCONV__I16:
        if ((r = parse_signed(s, INT16_MIN, INT16_MAX, &i)) == SPCONV__VALUE_OK) {
            int16_t v = (int16_t)i;
            memcpy(dst, &v, sizeof v);
        }
        return r;
    case SPCONV__I32:
        if ((r = parse_signed(s, INT32_MIN, INT32_MAX, &i)) == SPCONV__VALUE_OK) {
            int32_t v = (int32_t)i;
            memcpy(dst, &v, sizeof v);
        }
        return r;
    case SPCONV__I64:
        if ((r = parse_signed(s, INT64_MIN, INT64_MAX, &i)) == SPCONV__VALUE_OK)
            memcpy(dst, &i, sizeof i);
        return r;
    case SPCONV__U8:
        if ((r = parse_unsigned(s, UINT8_MAX, &u)) == SPCONV__VALUE_OK) {
            uint8_t v = (uint8_t)u;
            memcpy(dst, &v, sizeof v);
        }
        return r;
    case SPCONV__U16:
        if ((r = parse_unsigned(s, UINT16_MAX, &u)) == SPCONV__VALUE_OK) {
            uint16_t v = (uint16_t)u;
            memcpy(dst, &v, sizeof v);
        }
        return r;
    case SPCONV__U32:
        if ((r = parse_unsigned(s, UINT32_MAX, &u)) == SPCONV__VALUE_OK) {
            uint32_t v = (uint32_t)u;
            memcpy(dst, &v, sizeof v);
        }
        return r;
    case SPCONV__U64:
        if ((r = parse_unsigned(s, UINT64_MAX, &u)) == SPCONV__VALUE_OK) memcpy(dst, &u, sizeof u);
        return r;
    case SPCONV__F32:
        if ((r = parse_real(s, 1, &d)) == SPCONV__VALUE_OK) {
            float v = (float)d;
            memcpy(dst, &v, sizeof v);
        }
        return r;
    case SPCONV__F64:
        if ((r = parse_real(s, 0, &d)) == SPCONV__VALUE_OK) memcpy(dst, &d, sizeof d);
        return r;
    }
    return SPCONV__VALUE_NOT_NUMBER;
}
