/* The hostile-input corpus: small files that each attack one mechanism of the engine (a valid file
 * that used to abort inside PCL, a named pipe where a file is expected, a scan crafted to flood a
 * hash table, a kernel far larger than the input, a planted symlink, ...), written by code rather
 * than kept as hand-edited binaries, and the command line that feeds each one to `spconv`.
 *
 * `gen_hostile_corpus DIR` writes the files alone (for fuzzing seeds or a look by hand);
 * test_hostile writes them into a scratch folder and runs every case under a wall-clock and an
 * address-space limit (see tests/hostile/README.md). */
#ifndef SPCONV_TEST_HOSTILE_CORPUS_H
#define SPCONV_TEST_HOSTILE_CORPUS_H

#include <stddef.h>

#define HOSTILE_MAX_ARGS 32
#define HOSTILE_PATH_CAP 1024

/* What a case must end with. */
typedef enum hostile_expect {
    HOSTILE_REFUSED,  /* exit status 2, one line on stderr naming the problem */
    HOSTILE_SUCCEEDS, /* exit status 0: the input is hostile to resources, not invalid */
} hostile_expect;

typedef struct hostile_case {
    const char *name;     /* "fifo-as-scan" */
    const char *defect;   /* the class of defect it guards against, for the failure message */
    hostile_expect expect;
    const char *message;  /* substring of the one stderr line (HOSTILE_REFUSED) */
    /* argv after the tool's path; "@" at the start of an argument is replaced by the corpus
     * folder ("@/scan.bin"), and "@out" names the case's own output folder */
    const char *args[HOSTILE_MAX_ARGS];
    double seconds;       /* wall-clock bound on a quiet machine (scaled for sanitizer builds) */
    size_t address_space_mib; /* RLIMIT_AS of the child; 0 for the default */
    /* a symlink planted at "<target>.<pid>.partial" and "<target>.<pid>.0.partial" (the child's
     * pid, planted between fork and exec) pointing at the corpus's victim file, or NULL */
    const char *plant_symlink_beside;
    /* the case is about OpenMP threads under address_space_mib: skipped where that limit is not
     * set (ASan builds) or there are no OpenMP threads (the no-OpenMP build) */
    int needs_threads_and_limit;
} hostile_case;

/** Write every input of the corpus into @p dir (which must exist). Returns 0, or -1 after printing
 *  what failed. */
int hostile_corpus_write(const char *dir);

/** The cases, and how many. */
const hostile_case *hostile_cases(size_t *count);

/** Name of the file that no case may touch (pre-existing outputs are copies of it). */
#define HOSTILE_VICTIM "victim.txt"

#endif /* SPCONV_TEST_HOSTILE_CORPUS_H */
