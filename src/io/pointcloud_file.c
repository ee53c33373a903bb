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

/* The final path must be absent or a file that a rename can replace; a folder is refused now,
 * before the caller spends any work on what it would write (rename would fail with EISDIR). */
static spconv_status check_target(const char *func, const char *path) {
    struct stat info;
    if (lstat(path, &info) != 0) return SPCONV_OK;
    SPCONV_RETURN_ERROR_IF(S_ISDIR(info.st_mode), SPCONV_ERR_IO,
                           "%s: cannot write '%s': it is a folder", func, path);
    return SPCONV_OK;
}

/* Why the temporary beside @p path could not be made, in terms of @p path (the name the caller
 * knows; the temporary is an implementation detail) and, where the cause lies there, of the
 * folder it goes in. */
static spconv_status creation_error(const char *func, const char *path, int err) {
    const char *slash = strrchr(path, '/');
    char folder[512];
    if (slash == NULL) snprintf(folder, sizeof folder, ".");
    else if (slash == path) snprintf(folder, sizeof folder, "/");
    else snprintf(folder, sizeof folder, "%.*s", (int)(slash - path), path);
    if (err == ENOENT)
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: cannot create '%s': folder '%s' does not exist "
                            "(%s)", func, path, folder, strerror(err));
    if (err == ENOTDIR)
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: cannot create '%s': '%s' is not a folder (%s)",
                            func, path, folder, strerror(err));
    if (err == EACCES)
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: cannot create '%s': cannot write in folder '%s' "
                            "(%s)", func, path, folder, strerror(err));
    SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: cannot create '%s' (%s)", func, path, strerror(err));
}

spconv_status spconv__file_writer_open(const char *func, const char *path,
                                       spconv__file_writer *w) {
    memset(w, 0, sizeof *w);
    SPCONV_CHECK_NOT_NULL(func, path);
    SPCONV_RETURN_ERROR_IF(path[0] == '\0', SPCONV_ERR_IO, "%s: the path is empty", func);
    SPCONV_FORWARD_IF_ERROR(check_target(func, path));
    w->final_path = concat(path, "");
    w->temp_path = malloc(strlen(path) + 64);
    if (w->final_path == NULL || w->temp_path == NULL) {
        spconv__file_writer_abort(w);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for a path", func);
    }
    /* The temporary sits beside the target so that the final rename is atomic. O_EXCL creates it
     * or fails, and fails on any existing name, a planted symlink included (O_NOFOLLOW says so
     * twice), so a writer never writes through a name somebody else prepared; the pid and a
     * counter give each attempt a fresh name. */
    int fd = -1, err = 0;
    for (unsigned attempt = 0; attempt < 100 && fd < 0; ++attempt) {
        sprintf(w->temp_path, "%s.%ld.%u.partial", path, (long)getpid(), attempt);
        fd = open(w->temp_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        err = errno;
        if (fd < 0 && err != EEXIST) break;
    }
    if (fd < 0) {
        free(w->temp_path);
        w->temp_path = NULL;
        spconv__file_writer_abort(w);
        return creation_error(func, path, err);
    }
    w->file = fdopen(fd, "wb");
    if (w->file == NULL) {
        err = errno;
        close(fd);
        spconv__file_writer_abort(w);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: cannot write '%s' (%s)", func, path,
                            strerror(err));
    }
    return SPCONV_OK;
}

void spconv__file_writer_put(spconv__file_writer *w, const void *data, size_t nbytes) {
    if (nbytes > 0) fwrite(data, 1, nbytes, w->file);
}

spconv_status spconv__file_writer_commit(const char *func, spconv__file_writer *w) {
    /* fsync before the rename: after a crash the final name holds the whole file or the old one. */
    int failed = fflush(w->file) != 0 || ferror(w->file) || fsync(fileno(w->file)) != 0;
    int err = failed && errno == 0 ? EIO : errno;
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
