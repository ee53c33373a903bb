/* Argument handling shared by the `spconv` subcommands: value parsers, a declarative option table
 * with --help, uniform one-line errors, .npy input/output and an output folder whose files appear
 * only when a command succeeded.
 *
 * Conventions: every function that can fail prints one line "spconv <cmd>: <problem>" on stderr
 * and returns the exit status the command should return (CLI_EXIT_USAGE for bad arguments or
 * files, CLI_EXIT_FAILURE for anything else); 0 means success. So a call site reads
 *     int rc = cli_parse_int(cmd, "--threads", text, 1, 0, &threads);
 *     if (rc != 0) return rc;
 */
#ifndef SPCONV_TOOLS_CLI_ARGS_H
#define SPCONV_TOOLS_CLI_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "spconv/spconv.h"

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAILURE 1 /* out of memory, internal errors, missing device */
#define CLI_EXIT_USAGE 2   /* bad arguments or files */

#if defined(__GNUC__)
#define CLI_PRINTF_LIKE(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define CLI_PRINTF_LIKE(fmt_index, first_arg)
#endif

/* ---- errors ---------------------------------------------------------------------------------- */

/** Print "spconv <cmd>: <message>" (one line) on stderr; returns CLI_EXIT_USAGE. */
int cli_error(const char *cmd, const char *fmt, ...) CLI_PRINTF_LIKE(2, 3);

/** Report a failed library call as "spconv <cmd>: <what>: <spconv_last_error()>". Returns
 *  CLI_EXIT_USAGE when the status blames the input (1xx arguments, 3xx files), else
 *  CLI_EXIT_FAILURE. */
int cli_status_error(const char *cmd, spconv_status status, const char *what);

/* ---- value parsers: @p flag names the option in the message ---------------------------------- */

/** A decimal integer in [min, max]; max <= min means no upper bound. */
int cli_parse_int(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max,
                  int64_t *out);
/** "K" (the same on every axis) or "KD,KH,KW", each in [min, max] (max <= min: no upper bound). */
int cli_parse_int_triple(const char *cmd, const char *flag, const char *text, int64_t min,
                         int64_t max, int64_t out[3]);
/** Exactly @p count finite comma-separated numbers, "X,Y,Z" for count 3, each representable as a
 *  float32 (neither overflowing to inf nor a non-zero value that would become 0). */
int cli_parse_float_list(const char *cmd, const char *flag, const char *text, int count,
                         double *out);
/** "cpu" (or NULL: the default), "cuda" (device 0) or "cuda:N", present in this build and on this
 *  machine (the host emulation's device counts). */
int cli_parse_device(const char *cmd, const char *flag, const char *text, spconv_device *out);
/** A non-empty path. */
int cli_parse_path(const char *cmd, const char *flag, const char *text, const char **out);

/* ---- option tables --------------------------------------------------------------------------- */

typedef enum cli_kind {
    CLI_SWITCH, /* no value; value: int, set to 1 */
    CLI_PATH,   /* value: const char *, points into argv */
    CLI_INT,    /* value: int64_t, in [min, max] */
    CLI_TRIPLE, /* value: int64_t[3], each in [min, max] */
    CLI_FLOATS, /* value: double[count] */
    CLI_CHOICE  /* value: int, index into choices */
} cli_kind;

/** One option. Defaults are whatever the caller stored in *value before parsing; `given` tells
 *  whether the command line set it. */
typedef struct cli_option {
    const char *name;           /* "--kernel" */
    cli_kind kind;
    void *value;
    const char *metavar;        /* for --help: "K|KD,KH,KW" */
    const char *help;           /* one line for --help, mentioning the default */
    int64_t min, max;           /* CLI_INT, CLI_TRIPLE (max <= min: no upper bound) */
    int count;                  /* CLI_FLOATS */
    const char *const *choices; /* CLI_CHOICE: NULL-terminated */
    int required;
    int given;                  /* output of cli_parse */
} cli_option;

typedef struct cli_spec {
    const char *command;           /* "conv" */
    const char *summary;           /* one line for --help */
    const char *positional;        /* name of one required positional argument ("SCAN"), or NULL */
    const char **positional_value; /* receives it */
    int positional_optional;       /* 1: the positional argument may be left out */
    int positional_max;            /* > 1: up to this many positional arguments ("SCAN..."),
                                    * stored in order in positional_values; the first also in
                                    * *positional_value */
    const char **positional_values;
    int *positional_count;         /* receives how many were given (with positional_max > 1) */
    cli_option *options;
    int num_options;
    const char *epilog;            /* more --help text (what the command writes), or NULL */
} cli_spec;

/**
 * Parse @p argc / @p argv (the arguments after the command name) against @p spec. Accepts
 * "--flag value" and "--flag=value"; "--help"/"-h" prints the help on stdout. Rejects unknown
 * options, repeated options, missing values and missing required options, with one line each.
 * Returns 1 when the command should run; 0 when it should return *exit_status right away
 * (0 after --help, CLI_EXIT_USAGE after an error).
 */
int cli_parse(cli_spec *spec, int argc, char **argv, int *exit_status);

/** The --help text of @p spec. */
void cli_print_help(const cli_spec *spec, FILE *stream);

/** The option of @p spec called @p name (NULL if none): to ask whether it was given. */
const cli_option *cli_find_option(const cli_spec *spec, const char *name);

/* ---- .npy files ------------------------------------------------------------------------------ */

/** "f32 [4, 2]": the dtype and shape of @p t, for messages. */
void cli_describe_tensor(const spconv_tensor *t, char *buf, size_t cap);

/** Read the .npy file @p path given by option @p flag into *out (a new reference). */
int cli_read_npy(const char *cmd, const char *flag, const char *path, spconv_tensor **out);

/* ---- output folder: all files appear together, or none --------------------------------------- */

#define CLI_OUTDIR_MAX_FILES 16

/**
 * An output folder. Files are written under temporary names ("DIR/.NAME.<pid>.partial") and renamed
 * to their final names by cli_outdir_commit only when every output was written. Closing without a
 * commit removes the temporaries and the folders that open created. Files already in the folder
 * that the command does not write are left alone.
 */
typedef struct cli_outdir {
    const char *cmd;
    char *dir;
    char **created_dirs; /* folders that open made, outermost first */
    int num_created_dirs;
    char *final_paths[CLI_OUTDIR_MAX_FILES];
    char *temp_paths[CLI_OUTDIR_MAX_FILES];
    int num_files;
    int committed;
} cli_outdir;

/** Check, before any work, that --out @p dir can receive the outputs: every part of the path
 *  that exists is a folder, the nearest existing one is writable, and (when @p dir exists) none
 *  of the NULL-terminated final @p names (may be NULL) inside it is a folder. Creates nothing. */
int cli_outdir_check(const char *cmd, const char *dir, const char *const *names);

/** The same check for one output file given by option @p flag (bench --json): not a folder, and
 *  its folder exists and is writable. */
int cli_outfile_check(const char *cmd, const char *flag, const char *path);

/** Create @p dir and any missing parents. *od must be closed with cli_outdir_close, even when
 *  this fails. */
int cli_outdir_open(cli_outdir *od, const char *cmd, const char *dir);

/** The temporary path to write output @p name ("features.npy") to; valid until close. */
int cli_outdir_path(cli_outdir *od, const char *name, const char **path);

/** Write @p t as the .npy output @p name. */
int cli_outdir_write_npy(cli_outdir *od, spconv_context *ctx, const char *name,
                         const spconv_tensor *t);

/** Report a failed library write to @p path (a temporary from cli_outdir_path) of output
 *  @p name, naming the final path wherever the library's message names the temporary. Returns
 *  the exit status as cli_status_error does. */
int cli_outdir_write_error(const cli_outdir *od, const char *path, spconv_status status,
                           const char *name);

/** Give every output its final name. Refuses (before renaming anything) when a final name is a
 *  folder. If a rename fails, every final name gets back what it held before: a file that was
 *  there (kept under a second hard-linked name until the commit is done), or nothing. */
int cli_outdir_commit(cli_outdir *od);

/** Remove uncommitted temporaries and, without a commit, the folders that open created; free. */
void cli_outdir_close(cli_outdir *od);

#endif /* SPCONV_TOOLS_CLI_ARGS_H */
