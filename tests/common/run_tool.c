#define _XOPEN_SOURCE 700

#include "common/run_tool.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/test_files.h"
#include "common/test_util.h"

extern char **environ;

int spconv_tool_setup(void **state, const char *scratch_prefix) {
    spconv_tool_fixture *f = calloc(1, sizeof *f);
    if (f == NULL) return -1;
    f->tool = getenv("SPCONV_TOOL");
    f->dir = spconv_test_make_scratch(scratch_prefix);
    if (f->dir == NULL) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

int spconv_tool_teardown(void **state) {
    spconv_tool_fixture *f = *state;
    int rc = spconv_test_remove_tree(f->dir);
    free(f->dir);
    free(f->out_text);
    free(f->err_text);
    free(f);
    return rc;
}

spconv_tool_fixture *spconv_tool_or_skip(void **state) {
    spconv_tool_fixture *f = *state;
    if (f->tool == NULL || f->tool[0] == '\0') {
        print_message("skip: SPCONV_TOOL is not set (CTest sets it to the built `spconv`)\n");
        skip();
    }
    return f;
}

const char *spconv_tool_scratch_path(const spconv_tool_fixture *f, const char *name, char *buf) {
    return spconv_test_join(f->dir, name, buf, SPCONV_TOOL_PATH_CAP);
}

/* Our environment plus f->extra_env, in a malloc'd array (the strings are borrowed). */
static char **tool_environment(const spconv_tool_fixture *f) {
    size_t n = 0;
    while (environ[n] != NULL) ++n;
    char **env = malloc((n + 2) * sizeof *env);
    assert_non_null(env);
    memcpy(env, environ, n * sizeof *env);
    env[n++] = (char *)f->extra_env;
    env[n] = NULL;
    return env;
}

int spconv_tool_run(spconv_tool_fixture *f, const char *const *args) {
    size_t argc = 0;
    while (args[argc] != NULL) ++argc;
    const char **argv = malloc((argc + 2) * sizeof *argv);
    assert_non_null(argv);
    argv[0] = f->tool;
    memcpy(argv + 1, args, (argc + 1) * sizeof *argv);
    char out_path[SPCONV_TOOL_PATH_CAP], err_path[SPCONV_TOOL_PATH_CAP];
    spconv_tool_scratch_path(f, "stdout.txt", out_path);
    spconv_tool_scratch_path(f, "stderr.txt", err_path);
    posix_spawn_file_actions_t actions;
    assert_int_equal(posix_spawn_file_actions_init(&actions), 0);
    assert_int_equal(
        posix_spawn_file_actions_addopen(&actions, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644),
        0);
    assert_int_equal(
        posix_spawn_file_actions_addopen(&actions, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644),
        0);
    char **env = f->extra_env != NULL ? tool_environment(f) : environ;
    pid_t pid;
    int rc = posix_spawn(&pid, f->tool, &actions, NULL, (char *const *)argv, env);
    posix_spawn_file_actions_destroy(&actions);
    if (env != environ) free(env);
    free(argv);
    assert_int_equal(rc, 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    free(f->out_text);
    free(f->err_text);
    size_t n;
    f->out_text = spconv_test_read_bytes(out_path, &n);
    f->err_text = spconv_test_read_bytes(err_path, &n);
    assert_non_null(f->out_text);
    assert_non_null(f->err_text);
    if (!WIFEXITED(status))
        fail_msg("the tool died by signal %d: %s", WTERMSIG(status), f->err_text);
    return WEXITSTATUS(status);
}

void spconv_tool_expect_usage_error(spconv_tool_fixture *f, const char *const *args,
                                    const char *substring) {
    assert_int_equal(spconv_tool_run(f, args), 2);
    if (strstr(f->err_text, substring) == NULL)
        fail_msg("stderr \"%s\" does not contain \"%s\"", f->err_text, substring);
    int lines = 0;
    for (const char *c = f->err_text; *c != '\0'; ++c) lines += *c == '\n';
    assert_int_equal(lines, 1);
}
