/* Scratch folders and whole-file helpers for tests that write files (the .npy and CLI tests). */
#ifndef SPCONV_TEST_FILES_H
#define SPCONV_TEST_FILES_H

#include <stddef.h>

/** A fresh folder under $TMPDIR (or /tmp); NULL after printing why when it cannot be made.
 *  free() the result after spconv_test_remove_tree. */
char *spconv_test_make_scratch(const char *prefix);

/** Remove @p path and everything below it; 0 on success. */
int spconv_test_remove_tree(const char *path);

/** "dir/name" into @p buf (truncated to @p cap). Returns @p buf. */
char *spconv_test_join(const char *dir, const char *name, char *buf, size_t cap);

/** Entries in folder @p dir other than "." and ".."; -1 when it does not exist. */
int spconv_test_count_entries(const char *dir);

/** 1 when @p path exists (as anything). */
int spconv_test_exists(const char *path);

/** Write @p n bytes to @p path (replacing it); 0 on success. */
int spconv_test_write_bytes(const char *path, const void *bytes, size_t n);

/** The whole file as a malloc'd buffer with a '\0' after the last byte, its size in *n; NULL when
 *  it cannot be read. */
char *spconv_test_read_bytes(const char *path, size_t *n);

#endif /* SPCONV_TEST_FILES_H */
