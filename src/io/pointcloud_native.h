/* Point records parsed in C (ASCII PCD, PLY): the same raw cloud the PCL shim produces, owned here,
 * and the parser of one ASCII value of a declared type shared by both text formats. */
#ifndef SPCONV_IO_POINTCLOUD_NATIVE_H
#define SPCONV_IO_POINTCLOUD_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#include "io/pointcloud_pcl.h"
#include "io/pointcloud_text.h"

/* A raw cloud and the memory it points to (spconv__native_cloud_free releases all of it). */
typedef struct spconv__native_cloud {
    spconv__raw_cloud raw;
    unsigned char *data;       /* raw.data: width * height records of raw.point_step bytes */
    spconv__raw_field *fields; /* raw.fields */
    char *names;               /* the NUL-terminated field names the fields point into */
} spconv__native_cloud;

/* Set up @p c for @p num_fields fields whose names need @p name_bytes bytes (NULs included) and
 * @p points records of @p point_step bytes (zeroed). 0 when out of memory (c is freed then). */
int spconv__native_cloud_alloc(spconv__native_cloud *c, size_t num_fields, size_t name_bytes,
                               uint64_t points, uint64_t point_step);

/* Free what spconv__native_cloud_alloc allocated; a zeroed cloud is a no-op. */
void spconv__native_cloud_free(spconv__native_cloud *c);

typedef enum spconv__value_result {
    SPCONV__VALUE_OK,
    SPCONV__VALUE_NOT_NUMBER, /* not a number of the type's kind (integer, 0/1, real) */
    SPCONV__VALUE_RANGE       /* a number, but outside what the type holds */
} spconv__value_result;

/* Parse the token @p tok as one value of @p type and store it (host byte order) at @p dst.
 * Integers are decimal with an optional sign and must fit the type exactly; BOOL takes 0 or 1;
 * reals take what strtod takes, "nan" and "inf" included, and must be within the type's finite
 * range unless infinite or NaN in the text. */
spconv__value_result spconv__ascii_value(spconv__span tok, spconv__scalar type, void *dst);

/* "int8", "uint16", "float32", ...: the C name of @p type, for messages. */
const char *spconv__scalar_name(spconv__scalar type);

#endif /* SPCONV_IO_POINTCLOUD_NATIVE_H */
