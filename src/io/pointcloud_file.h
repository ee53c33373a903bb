/* File helpers of the point-cloud readers and writers: opening with precise messages, reading a
 * file's head, and writing through a temporary name so that a file appears whole or not at all. */
#ifndef SPCONV_IO_POINTCLOUD_FILE_H
#define SPCONV_IO_POINTCLOUD_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "spconv/status.h"

/* Open the regular file @p path for reading and return its size. A missing, unreadable or
 * non-regular file is SPCONV_ERR_IO naming @p func and the path. */
spconv_status spconv__file_open_read(const char *func, const char *path, FILE **file,
                                     uint64_t *size);

/* Read exactly @p nbytes from @p file into @p dst; a short read is SPCONV_ERR_IO. */
spconv_status spconv__file_read_exact(const char *func, const char *path, FILE *file, void *dst,
                                      size_t nbytes);

/* Read the first min(size, max_bytes) bytes of @p path into a new NUL-terminated buffer (free
 * with free()). */
spconv_status spconv__file_read_head(const char *func, const char *path, size_t max_bytes,
                                     char **head, size_t *head_len, uint64_t *file_size);

/* A file being written under a temporary name beside its final path. */
typedef struct spconv__file_writer {
    FILE *file;
    char *final_path;
    char *temp_path;
} spconv__file_writer;

spconv_status spconv__file_writer_open(const char *func, const char *path,
                                       spconv__file_writer *w);
/* Write @p nbytes; errors are remembered by stdio and reported by commit. */
void spconv__file_writer_put(spconv__file_writer *w, const void *data, size_t nbytes);
/* Flush, close and rename to the final path; on any failure the temporary is removed. */
spconv_status spconv__file_writer_commit(const char *func, spconv__file_writer *w);
/* Close and remove the temporary (after an error elsewhere). */
void spconv__file_writer_abort(spconv__file_writer *w);

#endif /* SPCONV_IO_POINTCLOUD_FILE_H */
