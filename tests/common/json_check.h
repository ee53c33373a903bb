/* A strict JSON syntax check for tests of tools that write JSON (RFC 8259 grammar: objects,
 * arrays, strings with escapes, numbers, true/false/null; one value, white space around). It
 * validates only; tests then look for the keys they expect with strstr. */
#ifndef SPCONV_TEST_JSON_CHECK_H
#define SPCONV_TEST_JSON_CHECK_H

#include <stddef.h>

/** 1 when @p text is one valid JSON value, else 0 with the byte offset of the first problem in
 *  *error_at. Nesting deeper than 64 levels counts as invalid. */
int spconv_test_json_valid(const char *text, size_t *error_at);

#endif /* SPCONV_TEST_JSON_CHECK_H */
