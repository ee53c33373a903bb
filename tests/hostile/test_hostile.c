/* Every case of the hostile corpus (corpus.c) through the `spconv` tool (env SPCONV_TOOL), each
 * as its own CMocka test: the child runs under an address-space limit (setrlimit) and a wall-clock
 * limit, and must end as the case says: refused with exit status 2 and one line on stderr naming
 * the problem, or succeed. Either way no output folder of a refused command is left behind, no
 * file appears in the corpus folder, and no pre-existing file changes.
 *
 * The time bounds are loose for a loaded 2-core machine and far below what the old mechanisms
 * took (a blocked open never ends; the crafted scans took 30-40 s). Sanitizer builds run 5x
 * longer bounds and no address-space limit (ASan reserves terabytes of shadow address space). */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/test_files.h"
#include "common/test_util.h"
#include "hostile/corpus.h"
#include "spconv/config.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

typedef struct corpus_state {
    const char *tool;
    char *dir;
    char *victim_text;   /* HOSTILE_VICTIM's bytes */
    char *existing_text; /* existing_out/coords.npy's bytes */
} corpus_state;

static corpus_state corpus;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_corpus_file(const char *name) {
    char path[HOSTILE_PATH_CAP];
    snprintf(path, sizeof path, "%s/%s", corpus.dir, name);
    size_t n;
    return spconv_test_read_bytes(path, &n);
}

static int group_setup(void **state) {
    (void)state;
    corpus.tool = getenv("SPCONV_TOOL");
    corpus.dir = spconv_test_make_scratch("hostile");
    if (corpus.dir == NULL || hostile_corpus_write(corpus.dir) != 0) return -1;
    corpus.victim_text = read_corpus_file(HOSTILE_VICTIM);
    corpus.existing_text = read_corpus_file("existing_out/coords.npy");
    return corpus.victim_text != NULL && corpus.existing_text != NULL ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    int rc = corpus.dir != NULL ? spconv_test_remove_tree(corpus.dir) : 0;
    free(corpus.dir);
    free(corpus.victim_text);
    free(corpus.existing_text);
    return rc;
}

/* "@..." -> corpus folder + "...", "@out" -> the case's output folder. */
static void expand_args(const hostile_case *c, const char *out_dir,
                        char storage[HOSTILE_MAX_ARGS][HOSTILE_PATH_CAP], const char **argv) {
    int n = 0;
    argv[n++] = corpus.tool;
    for (int i = 0; c->args[i] != NULL; ++i) {
        const char *a = c->args[i];
        if (strcmp(a, "@out") == 0) snprintf(storage[i], HOSTILE_PATH_CAP, "%s", out_dir);
        else if (a[0] == '@') snprintf(storage[i], HOSTILE_PATH_CAP, "%s%s", corpus.dir, a + 1);
        else snprintf(storage[i], HOSTILE_PATH_CAP, "%s", a);
        argv[n++] = storage[i];
    }
    argv[n] = NULL;
}

/* In the child, before exec: the symlinks that a predictable temporary name would follow. */
static void plant_symlinks(const char *target) {
    char victim[HOSTILE_PATH_CAP], link_path[HOSTILE_PATH_CAP + 64];
    snprintf(victim, sizeof victim, "%s/%s", corpus.dir, HOSTILE_VICTIM);
    snprintf(link_path, sizeof link_path, "%s.%ld.partial", target, (long)getpid());
    if (symlink(victim, link_path) != 0) _exit(125);
    snprintf(link_path, sizeof link_path, "%s.%ld.0.partial", target, (long)getpid());
    if (symlink(victim, link_path) != 0) _exit(125);
}

static void remove_planted(const char *target, pid_t pid) {
    char link_path[HOSTILE_PATH_CAP + 64];
    snprintf(link_path, sizeof link_path, "%s.%ld.partial", target, (long)pid);
    unlink(link_path);
    snprintf(link_path, sizeof link_path, "%s.%ld.0.partial", target, (long)pid);
    unlink(link_path);
}

typedef struct child_result {
    int exited, status, signal, timed_out;
    double seconds;
    char *err_text;
} child_result;

static child_result run_child(const hostile_case *c, const char *const *argv, const char *plant,
                              double limit_s) {
    char err_path[HOSTILE_PATH_CAP + 32];
    snprintf(err_path, sizeof err_path, "%s.stderr", corpus.dir);
    child_result r = {0};
    const double start = now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null_fd = open("/dev/null", O_WRONLY);
        int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (null_fd < 0 || err_fd < 0) _exit(126);
        dup2(null_fd, 1);
        dup2(err_fd, 2);
        if (c->address_space_mib > 0 && !UNDER_ASAN) {
            struct rlimit limit = {(rlim_t)c->address_space_mib << 20,
                                   (rlim_t)c->address_space_mib << 20};
            if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(126);
        }
        if (plant != NULL) plant_symlinks(plant);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    for (;;) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        assert_true(done >= 0);
        if (done == pid) break;
        if (now_s() - start > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            r.timed_out = 1;
            break;
        }
        struct timespec pause = {0, 5 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    r.seconds = now_s() - start;
    r.exited = WIFEXITED(status);
    r.status = r.exited ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    size_t n;
    r.err_text = spconv_test_read_bytes(err_path, &n);
    assert_non_null(r.err_text);
    unlink(err_path);
    if (plant != NULL) remove_planted(plant, pid);
    return r;
}

static int count_lines(const char *text) {
    int lines = 0;
    for (const char *c = text; *c != '\0'; ++c) lines += *c == '\n';
    return lines;
}

static void check_untouched(const hostile_case *c) {
    char *victim = read_corpus_file(HOSTILE_VICTIM);
    char *existing = read_corpus_file("existing_out/coords.npy");
    if (victim == NULL || strcmp(victim, corpus.victim_text) != 0)
        fail_msg("%s (%s): %s was changed", c->name, c->defect, HOSTILE_VICTIM);
    if (existing == NULL || strcmp(existing, corpus.existing_text) != 0)
        fail_msg("%s (%s): the pre-existing existing_out/coords.npy was %s", c->name, c->defect,
                 existing == NULL ? "removed" : "changed");
    free(victim);
    free(existing);
}

static void run_case(void **state) {
    const hostile_case *c = *state;
    if (corpus.tool == NULL || corpus.tool[0] == '\0') {
        print_message("skip: SPCONV_TOOL is not set (CTest sets it to the built `spconv`)\n");
        skip();
    }
    if (c->needs_threads_and_limit && (UNDER_ASAN || !SPCONV_HAVE_OPENMP)) {
        print_message("skip: the case needs OpenMP threads and an address-space limit (%s)\n",
                      UNDER_ASAN ? "ASan builds cannot set one" : "built without OpenMP");
        skip();
    }
    char out_dir[HOSTILE_PATH_CAP], plant[HOSTILE_PATH_CAP] = "";
    snprintf(out_dir, sizeof out_dir, "%s/out-%s", corpus.dir, c->name);
    if (c->plant_symlink_beside != NULL)
        snprintf(plant, sizeof plant, "%s%s", corpus.dir, c->plant_symlink_beside + 1);
    static char storage[HOSTILE_MAX_ARGS][HOSTILE_PATH_CAP];
    const char *argv[HOSTILE_MAX_ARGS + 2];
    expand_args(c, out_dir, storage, argv);
    const int entries_before = spconv_test_count_entries(corpus.dir);
    const double limit = c->seconds * (UNDER_ASAN ? 5.0 : 1.0);
    child_result r = run_child(c, argv, plant[0] ? plant : NULL, limit);
    print_message("%-30s %.2f s, exit %d: %s", c->name, r.seconds, r.status,
                  r.err_text[0] ? r.err_text : "(no message)\n");
    if (r.timed_out)
        fail_msg("%s (%s): still running after %.0f s (a blocked read or quadratic time)", c->name,
                 c->defect, limit);
    if (!r.exited) fail_msg("%s (%s): killed by signal %d: %s", c->name, c->defect, r.signal, r.err_text);
    if (c->expect == HOSTILE_REFUSED) {
        if (r.status != 2) fail_msg("%s (%s): exit status %d, not 2", c->name, c->defect, r.status);
        if (count_lines(r.err_text) != 1 || strstr(r.err_text, c->message) == NULL)
            fail_msg("%s (%s): stderr \"%s\" is not one line containing \"%s\"", c->name,
                     c->defect, r.err_text, c->message);
        if (spconv_test_exists(out_dir))
            fail_msg("%s (%s): the output folder was left behind", c->name, c->defect);
        if (spconv_test_count_entries(corpus.dir) != entries_before)
            fail_msg("%s (%s): a file appeared in or vanished from the corpus folder", c->name,
                     c->defect);
    } else if (r.status != 0) {
        fail_msg("%s (%s): exit status %d: %s", c->name, c->defect, r.status, r.err_text);
    }
    check_untouched(c);
    free(r.err_text);
}

int main(void) {
    size_t count;
    const hostile_case *cases = hostile_cases(&count);
    struct CMUnitTest *tests = calloc(count, sizeof *tests);
    if (tests == NULL) return 1;
    for (size_t i = 0; i < count; ++i) {
        tests[i].name = cases[i].name;
        tests[i].test_func = run_case;
        tests[i].initial_state = (void *)&cases[i];
    }
    int failed = _cmocka_run_group_tests("hostile", tests, count, group_setup, group_teardown);
    free(tests);
    return failed;
}
