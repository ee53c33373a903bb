/* PLY headers: checked in C before PCL reads a file, so that a header that lies about its counts
 * (or lacks x, y, z) is an error and never reaches PCL's parser. */
#ifndef SPCONV_IO_POINTCLOUD_PLY_H
#define SPCONV_IO_POINTCLOUD_PLY_H

#include <stddef.h>
#include <stdint.h>

#include "spconv/status.h"

#define SPCONV_PLY_MAX_HEADER (1u << 20)

typedef struct spconv__ply_header {
    char format[24];       /* "ascii", "binary_little_endian", "binary_big_endian" */
    uint64_t vertices;     /* count of the vertex element */
    uint64_t data_offset;  /* first byte after end_header */
    uint64_t min_data;     /* fewest bytes of data that can hold every declared element */
} spconv__ply_header;

/* Validate the PLY header at the start of @p head (the first @p head_len bytes, NUL-terminated,
 * of @p path, a file of @p file_size bytes): magic, format, elements and properties with known
 * types, a vertex element with scalar x, y and z, and enough bytes after the header for every
 * declared element. SPCONV_ERR_FORMAT with the line and problem otherwise. */
spconv_status spconv__ply_check(const char *func, const char *path, const char *head,
                                size_t head_len, uint64_t file_size, spconv__ply_header *out);

#endif /* SPCONV_IO_POINTCLOUD_PLY_H */
