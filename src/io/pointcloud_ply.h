/* PLY headers: checked in C before PCL reads a file, so that a header that lies about its counts
 * (or lacks x, y, z) is an error and never reaches PCL's parser. */
#ifndef SPCONV_IO_POINTCLOUD_PLY_H
#define SPCONV_IO_POINTCLOUD_PLY_H

#include <stddef.h>
#include <stdint.h>

#include "io/pointcloud_pcl.h"
#include "io/pointcloud_text.h"
#include "spconv/status.h"

#define SPCONV_PLY_MAX_HEADER (1u << 20)
#define SPCONV_PLY_MAX_ELEMENTS 64

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

/* What the reader needs of a checked header: the elements in file order and their properties.
 * Names point into the header text that was checked. */
typedef struct spconv__ply_property {
    spconv__span name;
    spconv__span type_name;    /* as written ("uchar", "float32", ...) */
    spconv__scalar type;       /* of the value, or of a list's items */
    spconv__scalar count_type; /* of a list's length (lists only) */
    int is_list;
} spconv__ply_property;

typedef struct spconv__ply_element {
    spconv__span name;
    uint64_t count;
    int first_property, num_properties; /* a range of the layout's properties */
} spconv__ply_element;

typedef struct spconv__ply_layout {
    int num_elements;
    int vertex; /* index of the vertex element */
    spconv__ply_element elements[SPCONV_PLY_MAX_ELEMENTS];
    int num_properties, capacity;
    spconv__ply_property *properties;
} spconv__ply_layout;

/* spconv__ply_check, and on success the layout in *layout (free with spconv__ply_layout_free);
 * @p layout may be NULL. A list property in the vertex element is refused here: a point is a
 * fixed set of values, and PCL's reader asserts on lists whose length varies. */
spconv_status spconv__ply_check_layout(const char *func, const char *path, const char *head,
                                       size_t head_len, uint64_t file_size,
                                       spconv__ply_header *out, spconv__ply_layout **layout);

void spconv__ply_layout_free(spconv__ply_layout *layout);

struct spconv__native_cloud;

/* The vertices of the PLY file @p text (@p len bytes, all of the file) whose header
 * spconv__ply_check_layout accepted, parsed into @p out; the other elements are read past (ASCII
 * values checked too). ASCII values must parse as their property's type and fit it, each row of
 * an element is one line with exactly its values; binary data must hold every row.
 * SPCONV_ERR_FORMAT naming the line (ASCII) or element and row (binary) otherwise. */
spconv_status spconv__ply_read(const char *func, const char *path, const char *text, size_t len,
                               const spconv__ply_header *h, const spconv__ply_layout *layout,
                               struct spconv__native_cloud *out);

#endif /* SPCONV_IO_POINTCLOUD_PLY_H */
