/* File helpers of the library's readers and writers: the one way every input file is opened
 * (never blocking, regular files only), reading all of a file, and writing through a
 * temporary name so that a file appears whole or not at all. */
#ifndef SPCONV_IO_POINTCLOUD_FILE_H
#define SPCONV_IO_POINTCLOUD_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "spconv/status.h"

/* Open the regular file @p path for reading and return its size: the only way the library (and
 * the tools) open an input. The open itself cannot block (O_NONBLOCK: opening a named pipe with
 * no writer would wait forever, a tty could wait for a carrier) and is checked with fstat on the
 * descriptor before anything is read, so a named pipe, device, socket or directory is refused
 * without a single read. A missing, unreadable or non-regular file is SPCONV_ERR_IO naming
 * @p func, the path and, for a non-regular file, its kind ("... is not a regular file (a named
 * pipe)"). The stream is blocking again (O_NONBLOCK cleared) when returned. */
spconv_status spconv__file_open_read(const char *func, const char *path, FILE **file,
                                     uint64_t *size);

/* Read all of the regular file @p path (opened once, with spconv__file_open_read) into a new
 * buffer of *len bytes plus a NUL after them (free with free()); more than @p max_bytes is
 * SPCONV_ERR_IO. */
spconv_status spconv__file_read_all(const char *func, const char *path, uint64_t max_bytes,
                                    char **data, size_t *len);

/* Read exactly @p nbytes from @p file into @p dst; a short read is SPCONV_ERR_IO. */
spconv_status spconv__file_read_exact(const char *func, const char *path, FILE *file, void *dst,
                                      size_t nbytes);

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
