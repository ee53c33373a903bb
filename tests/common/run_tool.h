/* Running the `spconv` command-line tool from a test (path in env SPCONV_TOOL, set by CTest):
 * a CMocka fixture with a scratch folder, the child process with its stdout/stderr captured, and
 * the check every CLI test makes of an error exit. Used by test_cli, test_pointcloud_cli and
 * test_run. */
#ifndef SPCONV_TEST_RUN_TOOL_H
#define SPCONV_TEST_RUN_TOOL_H

#include <stddef.h>

#define SPCONV_TOOL_PATH_CAP 1024

typedef struct spconv_tool_fixture {
    const char *tool;      /* env SPCONV_TOOL, NULL or "" when unset */
    char *dir;             /* scratch folder, removed by the teardown */
    char *out_text;        /* stdout of the last run ("" before the first) */
    char *err_text;        /* stderr of the last run */
    const char *extra_env; /* "NAME=value" added to the tool's environment, or NULL */
} spconv_tool_fixture;

/** CMocka setup: a fixture with a fresh scratch folder named after @p scratch_prefix. */
int spconv_tool_setup(void **state, const char *scratch_prefix);

/** CMocka teardown: removes the scratch folder and frees the fixture. */
int spconv_tool_teardown(void **state);

/** The fixture of @p state; skips the test (with a message) when SPCONV_TOOL is not set. */
spconv_tool_fixture *spconv_tool_or_skip(void **state);

/** "scratch/name" into @p buf (SPCONV_TOOL_PATH_CAP bytes). Returns @p buf. */
const char *spconv_tool_scratch_path(const spconv_tool_fixture *f, const char *name, char *buf);

/** Run the tool with the NULL-terminated @p args (argv[0] is the tool); returns its exit status.
 *  stdout and stderr are kept in f->out_text / f->err_text. Fails the test when the tool cannot be
 *  started or dies by a signal. */
int spconv_tool_run(spconv_tool_fixture *f, const char *const *args);

/** Exit status 2 with exactly one line on stderr that contains @p substring. */
void spconv_tool_expect_usage_error(spconv_tool_fixture *f, const char *const *args,
                                    const char *substring);

#endif /* SPCONV_TEST_RUN_TOOL_H */
