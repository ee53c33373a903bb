/* Scratch folders and whole-file helpers for tests (see test_files.h). */
#define _XOPEN_SOURCE 700

#include "common/test_files.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char *spconv_test_make_scratch(const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0') tmp = "/tmp";
    size_t size = strlen(tmp) + strlen(prefix) + 16;
    char *dir = malloc(size);
    if (dir == NULL) return NULL;
    snprintf(dir, size, "%s/%s_XXXXXX", tmp, prefix);
    if (mkdtemp(dir) == NULL) {
        printf("cannot create a scratch folder '%s': %s\n", dir, strerror(errno));
        free(dir);
        return NULL;
    }
    return dir;
}

static int remove_entry(const char *path, const struct stat *info, int flag, struct FTW *ftw) {
    (void)info;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int spconv_test_remove_tree(const char *path) {
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

char *spconv_test_join(const char *dir, const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s", dir, name);
    return buf;
}

int spconv_test_count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return -1;
    int count = 0;
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d))
        count += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return count;
}

int spconv_test_exists(const char *path) {
    struct stat info;
    return stat(path, &info) == 0;
}

int spconv_test_write_bytes(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f == NULL) return -1;
    size_t written = fwrite(bytes, 1, n, f);
    int closed = fclose(f);
    return written == n && closed == 0 ? 0 : -1;
}

char *spconv_test_read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    char *bytes = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size >= 0 && fseek(f, 0, SEEK_SET) == 0) bytes = malloc((size_t)size + 1);
    if (bytes != NULL && fread(bytes, 1, (size_t)size, f) != (size_t)size) {
        free(bytes);
        bytes = NULL;
    }
    fclose(f);
    if (bytes == NULL) return NULL;
    bytes[size] = '\0';
    *n = (size_t)size;
    return bytes;
}
