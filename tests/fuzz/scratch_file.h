/* The fuzz targets' scratch file: the readers take paths, so each input is written to one file
 * per process (its name keeps the extension that selects the reader). */
#ifndef SPCONV_FUZZ_SCRATCH_FILE_H
#define SPCONV_FUZZ_SCRATCH_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Write @p data to this process's scratch file ending in @p extension (".pcd", ...) and return its
 * path; aborts when the file cannot be written (a harness failure, not a finding). */
const char *fuzz_write_input(const char *extension, const uint8_t *data, size_t size);

#endif
