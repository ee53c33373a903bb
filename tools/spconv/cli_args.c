/* Argument handling shared by the `spconv` subcommands (see cli_args.h). */
#define _POSIX_C_SOURCE 200809L

#include "cli_args.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- errors ---------------------------------------------------------------------------------- */

int cli_error(const char *cmd, const char *fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    /* The contract is one line per error, whatever a file name or library message contains. */
    for (char *c = message; *c != '\0'; ++c)
        if (*c == '\n' || *c == '\r') *c = ' ';
    fprintf(stderr, "spconv %s: %s\n", cmd, message);
    return CLI_EXIT_USAGE;
}

int cli_status_error(const char *cmd, spconv_status status, const char *what) {
    const char *detail = spconv_last_error();
    if (detail[0] == '\0') detail = spconv_status_string(status);
    cli_error(cmd, "%s: %s", what, detail);
    int blames_input = (status >= 100 && status < 200) || (status >= 300 && status < 400);
    return blames_input ? CLI_EXIT_USAGE : CLI_EXIT_FAILURE;
}

/* ---- value parsers --------------------------------------------------------------------------- */

/* What parse_int64_span found. */
#define SPAN_NOT_INTEGER 0
#define SPAN_OK 1
#define SPAN_OUT_OF_RANGE 2

/* Parse one decimal integer from text[0 .. len): an optional '-' and digits only (strtoll would
 * also take leading blanks and '+', which a value on a command line does not have). */
static int parse_int64_span(const char *text, size_t len, int64_t *out) {
    size_t first = len > 0 && text[0] == '-';
    if (len == first) return SPAN_NOT_INTEGER;
    for (size_t i = first; i < len; ++i)
        if (text[i] < '0' || text[i] > '9') return SPAN_NOT_INTEGER;
    /* Digits only from here: whatever does not fit int64 is a number out of range. */
    char buf[32];
    if (len >= sizeof buf) return SPAN_OUT_OF_RANGE;
    memcpy(buf, text, len);
    buf[len] = '\0';
    errno = 0;
    long long value = strtoll(buf, NULL, 10);
    if (errno == ERANGE) return SPAN_OUT_OF_RANGE;
    *out = (int64_t)value;
    return SPAN_OK;
}

/* The message for a span that parse_int64_span refused. */
static int span_error(const char *cmd, const char *flag, const char *text, const char *span,
                      size_t len, int found, const char *expected) {
    if (found == SPAN_OUT_OF_RANGE)
        return cli_error(cmd, "%s '%s': %.*s is out of range (a 64-bit integer holds at most "
                         "%lld)", flag, text, (int)len, span, (long long)INT64_MAX);
    return cli_error(cmd, "%s '%s': %s", flag, text, expected);
}

static int check_range(const char *cmd, const char *flag, const char *text, int64_t value,
                       int64_t min, int64_t max) {
    if (max > min && (value < min || value > max))
        return cli_error(cmd, "%s %s: value %lld is outside [%lld, %lld]", flag, text,
                         (long long)value, (long long)min, (long long)max);
    if (value < min)
        return cli_error(cmd, "%s %s: value %lld must be >= %lld", flag, text, (long long)value,
                         (long long)min);
    return 0;
}

int cli_parse_int(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max,
                  int64_t *out) {
    int64_t value;
    size_t len = strlen(text);
    int found = parse_int64_span(text, len, &value);
    if (found != SPAN_OK)
        return span_error(cmd, flag, text, text, len, found, "expected an integer");
    int rc = check_range(cmd, flag, text, value, min, max);
    if (rc != 0) return rc;
    *out = value;
    return 0;
}

int cli_parse_int_triple(const char *cmd, const char *flag, const char *text, int64_t min,
                         int64_t max, int64_t out[3]) {
    static const char expected[] = "expected one integer or three separated by commas";
    int64_t values[3];
    int count = 0;
    const char *start = text;
    for (;;) {
        const char *comma = strchr(start, ',');
        size_t len = comma ? (size_t)(comma - start) : strlen(start);
        if (count == 3) return cli_error(cmd, "%s '%s': %s, got more", flag, text, expected);
        int found = parse_int64_span(start, len, &values[count]);
        if (found != SPAN_OK) return span_error(cmd, flag, text, start, len, found, expected);
        ++count;
        if (comma == NULL) break;
        start = comma + 1;
    }
    if (count == 2) return cli_error(cmd, "%s '%s': %s, got two", flag, text, expected);
    if (count == 1) values[1] = values[2] = values[0];
    for (int i = 0; i < 3; ++i) {
        int rc = check_range(cmd, flag, text, values[i], min, max);
        if (rc != 0) return rc;
    }
    memcpy(out, values, sizeof values);
    return 0;
}

static const char *ordinal(int i) {
    static const char *const names[] = {"first", "second", "third", "fourth", "fifth", "sixth"};
    return i < 6 ? names[i] : "next";
}

int cli_parse_float_list(const char *cmd, const char *flag, const char *text, int count,
                         double *out) {
    const char *start = text;
    for (int i = 0; i < count; ++i) {
        char *end;
        errno = 0;
        double value = strtod(start, &end);
        int ends_right = (i + 1 < count) ? *end == ',' : *end == '\0';
        if (end == start || *start == ' ' || *start == '\t' || !ends_right)
            return cli_error(cmd, "%s '%s': expected %d numbers separated by commas", flag, text,
                             count);
        const int len = (int)(end - start);
        if (!isfinite(value) || (errno == ERANGE && fabs(value) > 1.0))
            return cli_error(cmd, "%s '%s': the %s number, %.*s, is not finite", flag, text,
                             ordinal(i), len, start);
        /* The values are float32 parameters of the library: say so rather than let a narrowing
         * turn 1e-300 into 0 or 1e300 into inf and blame the result. */
        float narrowed = (float)value;
        if (isinf(narrowed))
            return cli_error(cmd, "%s '%s': the %s number, %.*s, is too large for float32 "
                             "(at most %g)", flag, text, ordinal(i), len, start, (double)FLT_MAX);
        if (value != 0.0 && narrowed == 0.0f)
            return cli_error(cmd, "%s '%s': the %s number, %.*s, is too small for float32 "
                             "(it would become 0)", flag, text, ordinal(i), len, start);
        out[i] = value;
        start = end + 1;
    }
    return 0;
}

int cli_parse_path(const char *cmd, const char *flag, const char *text, const char **out) {
    if (text[0] == '\0') return cli_error(cmd, "%s: the path is empty", flag);
    *out = text;
    return 0;
}

int cli_parse_device(const char *cmd, const char *flag, const char *text, spconv_device *out) {
    *out = spconv_cpu();
    if (text == NULL || strcmp(text, "cpu") == 0) return 0;
    long long index = 0;
    if (strcmp(text, "cuda") != 0) {
        char *end = NULL;
        if (strncmp(text, "cuda:", 5) != 0 || text[5] < '0' || text[5] > '9')
            return cli_error(cmd, "%s '%s': expected cpu, cuda or cuda:N", flag, text);
        index = strtoll(text + 5, &end, 10);
        if (*end != '\0' || index > INT32_MAX)
            return cli_error(cmd, "%s '%s': expected cpu, cuda or cuda:N", flag, text);
    }
    if (!spconv_has_cuda())
        return cli_error(cmd, "%s %s: this build of spconv has no CUDA backend", flag, text);
    const int count = spconv_cuda_device_count();
    if (index >= count)
        return cli_error(cmd, "%s %s: no CUDA device %lld on this machine (%d found)", flag, text,
                         index, count);
    *out = spconv_cuda((int)index);
    return 0;
}

/* ---- option tables --------------------------------------------------------------------------- */

const cli_option *cli_find_option(const cli_spec *spec, const char *name) {
    for (int i = 0; i < spec->num_options; ++i)
        if (strcmp(spec->options[i].name, name) == 0) return &spec->options[i];
    return NULL;
}

/* The option whose name is arg up to '=' (or all of arg). */
static cli_option *match_option(cli_spec *spec, const char *arg, const char **inline_value) {
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    *inline_value = eq ? eq + 1 : NULL;
    for (int i = 0; i < spec->num_options; ++i) {
        const char *name = spec->options[i].name;
        if (strlen(name) == len && strncmp(name, arg, len) == 0) return &spec->options[i];
    }
    return NULL;
}

static int parse_choice(const char *cmd, const cli_option *opt, const char *text) {
    char names[256] = "";
    for (int i = 0; opt->choices[i] != NULL; ++i) {
        if (strcmp(opt->choices[i], text) == 0) {
            *(int *)opt->value = i;
            return 0;
        }
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", opt->choices[i]);
    }
    return cli_error(cmd, "%s '%s': expected one of %s", opt->name, text, names);
}

static int parse_value(const char *cmd, const cli_option *opt, const char *text) {
    switch (opt->kind) {
    case CLI_SWITCH: break;
    case CLI_PATH: return cli_parse_path(cmd, opt->name, text, (const char **)opt->value);
    case CLI_INT: return cli_parse_int(cmd, opt->name, text, opt->min, opt->max, opt->value);
    case CLI_TRIPLE:
        return cli_parse_int_triple(cmd, opt->name, text, opt->min, opt->max, opt->value);
    case CLI_FLOATS: return cli_parse_float_list(cmd, opt->name, text, opt->count, opt->value);
    case CLI_CHOICE: return parse_choice(cmd, opt, text);
    }
    return cli_error(cmd, "%s: option has an unknown kind %d", opt->name, (int)opt->kind);
}

/* Handle the option at argv[*i], advancing *i past its value. */
static int parse_one_option(cli_spec *spec, int argc, char **argv, int *i) {
    const char *cmd = spec->command;
    const char *arg = argv[*i];
    const char *inline_value;
    cli_option *opt = match_option(spec, arg, &inline_value);
    if (opt == NULL)
        return cli_error(cmd, "unknown option '%s' (see `spconv %s --help`)", arg, cmd);
    if (opt->given) return cli_error(cmd, "%s is given more than once", opt->name);
    opt->given = 1;
    if (opt->kind == CLI_SWITCH) {
        if (inline_value != NULL) return cli_error(cmd, "%s takes no value", opt->name);
        *(int *)opt->value = 1;
        return 0;
    }
    const char *text = inline_value;
    if (text == NULL) {
        /* "--bias --out DIR" forgot the bias path; "--flag=--x" can still pass such a value. */
        if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
            return cli_error(cmd, "%s needs a value (%s)", opt->name, opt->metavar);
        text = argv[++*i];
    }
    return parse_value(cmd, opt, text);
}

static int is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

int cli_parse(cli_spec *spec, int argc, char **argv, int *exit_status) {
    const char *cmd = spec->command;
    /* --help wins over every error, so that a half-typed command line can still ask for help. */
    for (int i = 0; i < argc; ++i) {
        if (is_help(argv[i])) {
            cli_print_help(spec, stdout);
            *exit_status = CLI_EXIT_OK;
            return 0;
        }
    }
    int positionals = 0;
    for (int i = 0; i < argc; ++i) {
        const char *arg = argv[i];
        int rc;
        if (strncmp(arg, "--", 2) == 0 && arg[2] != '\0') {
            rc = parse_one_option(spec, argc, argv, &i);
        } else if (spec->positional != NULL && arg[0] != '\0' && (arg[0] != '-' || arg[1] == '\0') &&
                   positionals < (spec->positional_max > 1 ? spec->positional_max : 1)) {
            if (positionals == 0) *spec->positional_value = arg;
            if (spec->positional_max > 1) spec->positional_values[positionals] = arg;
            ++positionals;
            rc = 0;
        } else if (spec->positional_max > 1 && positionals == spec->positional_max) {
            rc = cli_error(cmd, "more than %d %s arguments", spec->positional_max,
                           spec->positional);
        } else {
            rc = cli_error(cmd, "unexpected argument '%s' (see `spconv %s --help`)", arg, cmd);
        }
        if (rc != 0) {
            *exit_status = rc;
            return 0;
        }
    }
    if (spec->positional_max > 1) *spec->positional_count = positionals;
    if (spec->positional != NULL && positionals == 0 && !spec->positional_optional) {
        *exit_status = cli_error(cmd, "missing %s (see `spconv %s --help`)", spec->positional, cmd);
        return 0;
    }
    for (int i = 0; i < spec->num_options; ++i) {
        if (spec->options[i].required && !spec->options[i].given) {
            *exit_status =
                cli_error(cmd, "missing %s %s", spec->options[i].name, spec->options[i].metavar);
            return 0;
        }
    }
    return 1;
}

/* "--flag VALUE" (or "--flag" for a switch) into buf. */
static int option_synopsis(const cli_option *opt, char *buf, size_t cap) {
    if (opt->kind == CLI_SWITCH) return snprintf(buf, cap, "%s", opt->name);
    return snprintf(buf, cap, "%s %s", opt->name, opt->metavar);
}

/* The usage line, wrapped before 100 columns under the first option. */
static void print_usage_line(const cli_spec *spec, FILE *stream) {
    int indent = fprintf(stream, "usage: spconv %s", spec->command);
    int column = indent;
    if (spec->positional != NULL)
        column += fprintf(stream, spec->positional_optional ? " [%s%s]" : " %s%s",
                          spec->positional, spec->positional_max > 1 ? "..." : "");
    for (int i = 0; i < spec->num_options; ++i) {
        char item[128], synopsis[120];
        option_synopsis(&spec->options[i], synopsis, sizeof synopsis);
        int len = snprintf(item, sizeof item, spec->options[i].required ? "%s" : "[%s]", synopsis);
        if (column + 1 + len > 100) column = fprintf(stream, "\n%*s", indent, "") - 1;
        column += fprintf(stream, " %s", item);
    }
    fputc('\n', stream);
}

void cli_print_help(const cli_spec *spec, FILE *stream) {
    print_usage_line(spec, stream);
    fprintf(stream, "\n%s\n\noptions:\n", spec->summary);
    int width = (int)strlen("-h, --help");
    char left[128];
    for (int i = 0; i < spec->num_options; ++i) {
        int len = option_synopsis(&spec->options[i], left, sizeof left);
        if (len > width) width = len;
    }
    for (int i = 0; i < spec->num_options; ++i) {
        option_synopsis(&spec->options[i], left, sizeof left);
        fprintf(stream, "  %-*s  %s\n", width, left, spec->options[i].help);
    }
    fprintf(stream, "  %-*s  %s\n", width, "-h, --help", "print this help and exit");
    if (spec->epilog != NULL) fprintf(stream, "\n%s\n", spec->epilog);
}

/* ---- .npy files ------------------------------------------------------------------------------ */

void cli_describe_tensor(const spconv_tensor *t, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "%s [", spconv_dtype_name(spconv_tensor_dtype(t)));
    for (int i = 0; i < spconv_tensor_ndim(t) && used < cap; ++i)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "",
                                 (long long)spconv_tensor_size(t, i));
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

int cli_read_npy(const char *cmd, const char *flag, const char *path, spconv_tensor **out) {
    spconv_status st = spconv_npy_read(path, out);
    return st == SPCONV_OK ? 0 : cli_status_error(cmd, st, flag);
}

/* ---- output folder --------------------------------------------------------------------------- */

static char *copy_string(const char *text) {
    size_t len = strlen(text);
    char *copy = malloc(len + 1);
    if (copy != NULL) memcpy(copy, text, len + 1);
    return copy;
}

/* "'P' is a file, not a folder" (or "is not a folder" for a device, a socket ...). */
static int not_a_folder(const char *cmd, const char *flag, const char *path, const char *prefix,
                        const struct stat *info) {
    return cli_error(cmd, "%s '%s': '%s' %s", flag, path, prefix,
                     S_ISREG(info->st_mode) ? "is a file, not a folder" : "is not a folder");
}

/* Can this process make entries in folder @p dir? access() answers from the permission bits,
 * which root bypasses, and knows nothing of file systems that refuse every new entry (/sys,
 * /proc): so a probe folder is made and removed too. 0, or the errno that says why not. */
static int folder_writable(const char *dir) {
    if (access(dir, W_OK | X_OK) != 0) return errno;
    size_t size = strlen(dir) + 64;
    char *probe = malloc(size);
    if (probe == NULL) return ENOMEM;
    int err = 0;
    for (unsigned attempt = 0; attempt < 100; ++attempt) {
        snprintf(probe, size, "%s/.spconv-probe.%ld.%u", dir, (long)getpid(), attempt);
        if (mkdir(probe, 0700) == 0) {
            rmdir(probe);
            err = 0;
            break;
        }
        err = errno;
        if (err != EEXIST) break;
    }
    free(probe);
    return err;
}

/* What folder_writable's errno means for the user: a folder that exists but answers ENOENT to a
 * new entry (/proc) is one that takes none. */
static const char *why_not_writable(int err) {
    return err == ENOENT ? "it takes no new entries" : strerror(err);
}

/* Walk @p path from its first component down: every part that exists must be a folder. The
 * deepest existing one goes to *ancestor (malloc'd; "." or "/" when none does); *whole says
 * whether @p path itself exists. Messages name "@p flag '@p shown'". */
static int nearest_folder(const char *cmd, const char *flag, const char *shown, const char *path,
                          char **ancestor, int *whole) {
    *ancestor = NULL;
    *whole = 0;
    char *buf = copy_string(path);
    char *found = copy_string(path[0] == '/' ? "/" : ".");
    if (buf == NULL || found == NULL) {
        free(buf);
        free(found);
        return cli_error(cmd, "out of memory");
    }
    int rc = 0;
    size_t len = strlen(buf);
    for (size_t end = 1; end <= len; ++end) {
        if (end < len && (buf[end] != '/' || buf[end - 1] == '/')) continue;
        char saved = buf[end];
        buf[end] = '\0';
        struct stat info;
        int exists = stat(buf, &info) == 0, err = errno;
        if (exists && !S_ISDIR(info.st_mode)) rc = not_a_folder(cmd, flag, shown, buf, &info);
        else if (!exists && err != ENOENT)
            rc = cli_error(cmd, "%s '%s': cannot look at '%s': %s", flag, shown, buf,
                           strerror(err));
        if (exists && rc == 0) {
            free(found);
            found = copy_string(buf);
            if (found == NULL) rc = cli_error(cmd, "out of memory");
            *whole = end == len;
        }
        buf[end] = saved;
        /* Below a missing part nothing exists: the rest is what would be created. */
        if (rc != 0 || !exists) break;
    }
    free(buf);
    if (rc != 0) free(found);
    else *ancestor = found;
    return rc;
}

int cli_outdir_check(const char *cmd, const char *dir, const char *const *names) {
    if (dir[0] == '\0') return cli_error(cmd, "--out: the path is empty");
    char *ancestor;
    int whole;
    int rc = nearest_folder(cmd, "--out", dir, dir, &ancestor, &whole);
    if (rc != 0) return rc;
    int err = folder_writable(ancestor);
    if (err != 0 && whole)
        rc = cli_error(cmd, "--out '%s': cannot write in this folder: %s", dir,
                       why_not_writable(err));
    else if (err != 0)
        rc = cli_error(cmd, "--out '%s': cannot create it in '%s': %s", dir, ancestor,
                       why_not_writable(err));
    free(ancestor);
    /* A final name that is a folder would fail only at the commit, after all the work. */
    for (int i = 0; rc == 0 && whole && names != NULL && names[i] != NULL; ++i) {
        size_t size = strlen(dir) + strlen(names[i]) + 2;
        char *path = malloc(size);
        if (path == NULL) return cli_error(cmd, "out of memory");
        snprintf(path, size, "%s/%s", dir, names[i]);
        struct stat info;
        if (lstat(path, &info) == 0 && S_ISDIR(info.st_mode))
            rc = cli_error(cmd, "--out '%s': '%s' is a folder", dir, path);
        free(path);
    }
    return rc;
}

int cli_outfile_check(const char *cmd, const char *flag, const char *path) {
    if (path[0] == '\0') return cli_error(cmd, "%s: the path is empty", flag);
    struct stat info;
    if (stat(path, &info) == 0 && S_ISDIR(info.st_mode))
        return cli_error(cmd, "%s '%s': it is a folder", flag, path);
    /* The folder the file goes in: everything before the last '/' ("/" or "." if none). */
    const char *slash = strrchr(path, '/');
    size_t len = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
    char *parent = malloc(len + 1);
    if (parent == NULL) return cli_error(cmd, "out of memory");
    memcpy(parent, slash == NULL ? "." : path, len);
    parent[len] = '\0';
    char *ancestor;
    int whole;
    int rc = nearest_folder(cmd, flag, path, parent, &ancestor, &whole);
    if (rc == 0 && !whole)
        rc = cli_error(cmd, "%s '%s': folder '%s' does not exist", flag, path, parent);
    int err = rc == 0 ? folder_writable(parent) : 0;
    if (err != 0)
        rc = cli_error(cmd, "%s '%s': cannot write in folder '%s': %s", flag, path, parent,
                       why_not_writable(err));
    free(ancestor);
    free(parent);
    return rc;
}

/* mkdir one level of the path; record it when it is new. */
static int make_one_dir(cli_outdir *od, const char *path) {
    struct stat info;
    if (stat(path, &info) == 0) {
        if (S_ISDIR(info.st_mode)) return 0;
        return cli_error(od->cmd, "--out: '%s' exists and is not a folder", path);
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return cli_error(od->cmd, "--out: cannot create folder '%s': %s", path, strerror(errno));
    char *copy = copy_string(path);
    if (copy == NULL) return cli_error(od->cmd, "out of memory");
    od->created_dirs[od->num_created_dirs++] = copy;
    return 0;
}

int cli_outdir_open(cli_outdir *od, const char *cmd, const char *dir) {
    memset(od, 0, sizeof *od);
    od->cmd = cmd;
    int rc = cli_outdir_check(cmd, dir, NULL);
    if (rc != 0) return rc;
    od->dir = copy_string(dir);
    size_t levels = 1;
    for (const char *c = dir; *c != '\0'; ++c) levels += *c == '/';
    od->created_dirs = calloc(levels, sizeof *od->created_dirs);
    if (od->dir == NULL || od->created_dirs == NULL) return cli_error(cmd, "out of memory");
    /* Walk the parents outermost first, cutting the path at each '/' (a leading one is root). */
    char *path = od->dir;
    for (char *c = path + 1; *c != '\0'; ++c) {
        if (*c != '/' || c[-1] == '/') continue;
        *c = '\0';
        rc = make_one_dir(od, path);
        *c = '/';
        if (rc != 0) return rc;
    }
    return make_one_dir(od, path);
}

int cli_outdir_path(cli_outdir *od, const char *name, const char **path) {
    if (od->num_files == CLI_OUTDIR_MAX_FILES)
        return cli_error(od->cmd, "too many outputs (at most %d)", CLI_OUTDIR_MAX_FILES);
    size_t size = strlen(od->dir) + strlen(name) + 64;
    char *final_path = malloc(size);
    char *temp_path = malloc(size);
    if (final_path == NULL || temp_path == NULL) {
        free(final_path);
        free(temp_path);
        return cli_error(od->cmd, "out of memory");
    }
    snprintf(final_path, size, "%s/%s", od->dir, name);
    /* The pid keeps two runs writing into one folder from trading temporaries. */
    snprintf(temp_path, size, "%s/.%s.%ld.partial", od->dir, name, (long)getpid());
    od->final_paths[od->num_files] = final_path;
    od->temp_paths[od->num_files] = temp_path;
    ++od->num_files;
    *path = temp_path;
    return 0;
}

/* @p text with every occurrence of @p from replaced by @p to, cut to @p cap bytes. */
static void replace_all(const char *text, const char *from, const char *to, char *out,
                        size_t cap) {
    size_t used = 0, from_len = strlen(from), to_len = strlen(to);
    while (*text != '\0' && used + 1 < cap) {
        const char *piece = strncmp(text, from, from_len) == 0 ? to : text;
        size_t piece_len = piece == to ? to_len : 1;
        if (used + piece_len >= cap) break;
        memcpy(out + used, piece, piece_len);
        used += piece_len;
        text += piece == to ? from_len : 1;
    }
    out[used] = '\0';
}

int cli_outdir_write_error(const cli_outdir *od, const char *path, spconv_status status,
                           const char *name) {
    const char *detail = spconv_last_error();
    if (detail[0] == '\0') detail = spconv_status_string(status);
    char message[1024];
    snprintf(message, sizeof message, "%s", detail);
    /* The library names the hidden temporary it was handed; the user asked for the final name. */
    for (int i = 0; i < od->num_files; ++i)
        if (strcmp(od->temp_paths[i], path) == 0)
            replace_all(detail, od->temp_paths[i], od->final_paths[i], message, sizeof message);
    cli_error(od->cmd, "writing %s: %s", name, message);
    int blames_input = (status >= 100 && status < 200) || (status >= 300 && status < 400);
    return blames_input ? CLI_EXIT_USAGE : CLI_EXIT_FAILURE;
}

int cli_outdir_write_npy(cli_outdir *od, spconv_context *ctx, const char *name,
                         const spconv_tensor *t) {
    const char *path = NULL;
    int rc = cli_outdir_path(od, name, &path);
    if (rc != 0) return rc;
    spconv_status st = spconv_npy_write(ctx, path, t);
    return st == SPCONV_OK ? 0 : cli_outdir_write_error(od, path, st, name);
}

/* Before any rename: no final name may be a folder (a rename over it fails half-way). */
static int check_final_paths(const cli_outdir *od) {
    for (int i = 0; i < od->num_files; ++i) {
        struct stat info;
        if (lstat(od->final_paths[i], &info) == 0 && S_ISDIR(info.st_mode))
            return cli_error(od->cmd, "cannot write '%s': it is a folder", od->final_paths[i]);
    }
    return 0;
}

/* A second name (hard link) for the file now at od->final_paths[i], so that a failed commit can
 * put it back; *backup stays NULL when there is no such file. */
static int keep_old_file(const cli_outdir *od, int i, char **backup) {
    *backup = NULL;
    struct stat info;
    if (lstat(od->final_paths[i], &info) != 0) return 0;
    size_t size = strlen(od->final_paths[i]) + 64;
    char *name = malloc(size);
    if (name == NULL) return cli_error(od->cmd, "out of memory");
    for (unsigned attempt = 0; attempt < 100; ++attempt) {
        snprintf(name, size, "%s.%ld.%u.old", od->final_paths[i], (long)getpid(), attempt);
        /* link() never follows a symlink at the old name and fails on an existing new name. */
        if (link(od->final_paths[i], name) == 0) {
            *backup = name;
            return 0;
        }
        if (errno != EEXIST) break;
    }
    int err = errno;
    free(name);
    return cli_error(od->cmd, "cannot keep a copy of '%s' while replacing it: %s",
                     od->final_paths[i], strerror(err));
}

int cli_outdir_commit(cli_outdir *od) {
    char *backups[CLI_OUTDIR_MAX_FILES] = {NULL};
    int rc = check_final_paths(od), renamed = 0;
    for (int i = 0; rc == 0 && i < od->num_files; ++i) rc = keep_old_file(od, i, &backups[i]);
    for (; rc == 0 && renamed < od->num_files; ++renamed) {
        if (rename(od->temp_paths[renamed], od->final_paths[renamed]) == 0) continue;
        rc = cli_error(od->cmd, "cannot rename '%s' to '%s': %s", od->temp_paths[renamed],
                       od->final_paths[renamed], strerror(errno));
        break;
    }
    /* On failure every final name gets back what it had: the old file, or nothing. */
    for (int i = 0; i < od->num_files; ++i) {
        int restored = 0;
        if (rc != 0 && i < renamed) {
            if (backups[i] != NULL) restored = rename(backups[i], od->final_paths[i]) == 0;
            else unlink(od->final_paths[i]);
        }
        if (backups[i] != NULL && !restored) unlink(backups[i]);
        free(backups[i]);
    }
    if (rc == 0) od->committed = 1;
    return rc;
}

void cli_outdir_close(cli_outdir *od) {
    for (int i = 0; i < od->num_files; ++i) {
        if (!od->committed) unlink(od->temp_paths[i]);
        free(od->temp_paths[i]);
        free(od->final_paths[i]);
    }
    /* Innermost first; rmdir leaves a folder alone if anything else appeared in it meanwhile. */
    for (int i = od->num_created_dirs - 1; i >= 0; --i) {
        if (!od->committed) rmdir(od->created_dirs[i]);
        free(od->created_dirs[i]);
    }
    free(od->created_dirs);
    free(od->dir);
    memset(od, 0, sizeof *od);
}
