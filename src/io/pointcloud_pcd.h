/* PCD headers: checked in C before PCL reads a file, so that a header that lies about its sizes
 * is an error and never reaches PCL's readers. Also the binary PCD writer. */
#ifndef SPCONV_IO_POINTCLOUD_PCD_H
#define SPCONV_IO_POINTCLOUD_PCD_H

#include <stddef.h>
#include <stdint.h>

#include "io/pointcloud_text.h"
#include "spconv/status.h"

/* The header must end within this many bytes (PCL's own files use a few hundred). */
#define SPCONV_PCD_MAX_HEADER (1u << 20)
/* At most this many values per point (the sum of COUNT over the fields). */
#define SPCONV_PCD_MAX_VALUES 4096

typedef enum spconv__pcd_data {
    SPCONV__PCD_ASCII = 0,
    SPCONV__PCD_BINARY = 1,
    SPCONV__PCD_BINARY_COMPRESSED = 2
} spconv__pcd_data;

typedef struct spconv__pcd_header {
    char version[16];      /* as written after VERSION ("0.7", ".5"), "" when absent */
    int num_fields;
    uint64_t width, height;
    uint64_t points;       /* = width * height, checked */
    uint64_t point_step;   /* bytes of one point in binary data: sum of SIZE * COUNT */
    uint64_t values;       /* values of one point: sum of COUNT */
    spconv__pcd_data data;
    uint64_t data_offset;  /* first byte after the DATA line */
} spconv__pcd_header;

/* Validate the PCD header at the start of @p head, the first @p head_len bytes (NUL-terminated)
 * of @p path, a file of @p file_size bytes; head_len must be min(file_size,
 * SPCONV_PCD_MAX_HEADER + 8) so that a compressed block's size words are inside it. Checks the
 * keywords and their order, that SIZE/TYPE/COUNT agree with FIELDS, that x, y and z exist,
 * WIDTH * HEIGHT = POINTS, and that the data after the header can hold POINTS points.
 * SPCONV_ERR_FORMAT with the line and problem otherwise. */
spconv_status spconv__pcd_check(const char *func, const char *path, const char *head,
                                size_t head_len, uint64_t file_size, spconv__pcd_header *out);

/* One field as the header declares it. */
typedef struct spconv__pcd_field {
    spconv__span name;     /* inside the header text that was checked */
    char type;             /* 'I', 'U', 'F' or 'B' (upper case) */
    uint8_t size;          /* bytes of one value: 1, 2, 4 or 8 */
    uint32_t count;        /* values of this field in a point */
} spconv__pcd_field;

/* spconv__pcd_check, and on success the h->num_fields fields in a new array *fields (free with
 * free(); its names point into @p head). @p fields may be NULL. */
spconv_status spconv__pcd_check_fields(const char *func, const char *path, const char *head,
                                       size_t head_len, uint64_t file_size,
                                       spconv__pcd_header *out, spconv__pcd_field **fields);

struct spconv__native_cloud;

/* The points of the ASCII PCD file @p text (@p len bytes, all of the file, whose header @p h and
 * @p fields spconv__pcd_check_fields returned) parsed into @p out: every value must parse as its
 * field's TYPE and fit its SIZE, every non-blank line after DATA is one point with exactly
 * h->values values, and there are exactly POINTS such lines. SPCONV_ERR_FORMAT naming the line
 * and the field otherwise. */
spconv_status spconv__pcd_read_ascii(const char *func, const char *path, const char *text,
                                     size_t len, const spconv__pcd_header *h,
                                     const spconv__pcd_field *fields,
                                     struct spconv__native_cloud *out);

/* "ascii", "binary", "binary_compressed". */
const char *spconv__pcd_data_name(spconv__pcd_data data);

#endif /* SPCONV_IO_POINTCLOUD_PCD_H */
