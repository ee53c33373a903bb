/* File helpers of the library's readers and writers (see pointcloud_file.h). */
#define _POSIX_C_SOURCE 200809L

#include "io/pointcloud_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* What a non-regular file is, for the message. */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a named pipe";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a file";
}

spconv_status spconv__file_open_read(const char *func, const char *path, FILE **file,
                                     uint64_t *size) {
    *file = NULL;
    *size = 0;
    SPCONV_CHECK_NOT_NULL(func, path);
    SPCONV_RETURN_ERROR_IF(path[0] == '\0', SPCONV_ERR_IO, "%s: the path is empty", func);
    /* fopen would block in open(2) on a named pipe without a writer; O_NONBLOCK makes that open
     * return at once, O_NOCTTY keeps a terminal from becoming ours, and the type is checked on
     * the descriptor (fstat, not stat on the name) so it belongs to what would be read. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    SPCONV_RETURN_ERROR_IF(fd < 0, SPCONV_ERR_IO, "%s: cannot open '%s' (%s)", func, path,
                           strerror(errno));
    struct stat info;
    const char *problem = NULL;
    int err = 0;
    if (fstat(fd, &info) != 0) {
        err = errno;
        problem = "cannot stat";
    } else if (!S_ISREG(info.st_mode)) {
        close(fd);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: '%s' is not a regular file (%s)", func, path,
                            file_kind(info.st_mode));
    } else {
        /* Regular files never block, but the stream should behave as an ordinary one. */
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
            err = errno;
            problem = "cannot set up";
        }
    }
    FILE *f = problem == NULL ? fdopen(fd, "rb") : NULL;
    if (problem == NULL && f == NULL) {
        err = errno;
        problem = "cannot open a stream on";
    }
    if (problem != NULL) {
        close(fd);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: %s '%s' (%s)", func, problem, path, strerror(err));
    }
    *file = f;
    *size = (uint64_t)info.st_size;
    return SPCONV_OK;
}

spconv_status spconv__file_read_all(const char *func, const char *path, uint64_t max_bytes,
                                    char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f;
    uint64_t size;
    SPCONV_FORWARD_IF_ERROR(spconv__file_open_read(func, path, &f, &size));
    if (size > max_bytes || size >= SIZE_MAX) {
        fclose(f);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: '%s' has %" PRIu64 " bytes, more than the %" PRIu64
                            " this reader takes", func, path, size, max_bytes);
    }
    char *buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        fclose(f);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for the %" PRIu64
                            " bytes of '%s'", func, size, path);
    }
    spconv_status st = spconv__file_read_exact(func, path, f, buf, (size_t)size);
    fclose(f);
    if (st != SPCONV_OK) {
        free(buf);
        return st;
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return SPCONV_OK;
}

spconv_status spconv__file_read_exact(const char *func, const char *path, FILE *file, void *dst,
                                      size_t nbytes) {
    size_t got = nbytes == 0 ? 0 : fread(dst, 1, nbytes, file);
    SPCONV_RETURN_ERROR_IF(got != nbytes, SPCONV_ERR_IO,
                           "%s: reading '%s' stopped after %zu of %zu bytes (%s)", func, path, got,
                           nbytes, ferror(file) ? strerror(errno) : "end of file");
    return SPCONV_OK;
}

static char *concat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s == NULL) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

spconv_status spconv__file_writer_open(const char *func, const char *path,
                                       spconv__file_writer *w) {
    memset(w, 0, sizeof *w);
    SPCONV_CHECK_NOT_NULL(func, path);
    SPCONV_RETURN_ERROR_IF(path[0] == '\0', SPCONV_ERR_IO, "%s: the path is empty", func);
    /* The process id keeps concurrent writers of one path in different processes apart; O_EXCL
     * refuses to clobber a temporary that another writer is still using. */
    char suffix[48];
    snprintf(suffix, sizeof suffix, ".%ld.partial", (long)getpid());
    w->final_path = concat(path, "");
    w->temp_path = concat(path, suffix);
    if (w->final_path == NULL || w->temp_path == NULL) {
        spconv__file_writer_abort(w);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for a path", func);
    }
    int fd = open(w->temp_path, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd < 0) {
        int err = errno;
        free(w->temp_path);
        w->temp_path = NULL;
        spconv__file_writer_abort(w);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: cannot create '%s%s' (%s)", func, path, suffix,
                            strerror(err));
    }
    w->file = fdopen(fd, "wb");
    if (w->file == NULL) {
        int err = errno;
        close(fd);
        spconv__file_writer_abort(w);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: cannot open a stream on '%s%s' (%s)", func, path,
                            suffix, strerror(err));
    }
    return SPCONV_OK;
}

void spconv__file_writer_put(spconv__file_writer *w, const void *data, size_t nbytes) {
    if (nbytes > 0) fwrite(data, 1, nbytes, w->file);
}

spconv_status spconv__file_writer_commit(const char *func, spconv__file_writer *w) {
    int failed = fflush(w->file) != 0 || ferror(w->file);
    int err = errno;
    if (fclose(w->file) != 0 && !failed) {
        failed = 1;
        err = errno;
    }
    w->file = NULL;
    if (!failed && rename(w->temp_path, w->final_path) != 0) {
        failed = 1;
        err = errno;
    }
    if (failed) {
        char path[512];
        snprintf(path, sizeof path, "%s", w->final_path);
        spconv__file_writer_abort(w);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: writing '%s' failed (%s)", func, path,
                            strerror(err));
    }
    free(w->final_path);
    free(w->temp_path);
    memset(w, 0, sizeof *w);
    return SPCONV_OK;
}

void spconv__file_writer_abort(spconv__file_writer *w) {
    if (w->file != NULL) fclose(w->file);
    if (w->temp_path != NULL) remove(w->temp_path);
    free(w->final_path);
    free(w->temp_path);
    memset(w, 0, sizeof *w);
}
