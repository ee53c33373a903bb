/* `spconv`: the command-line front of the engine. One subcommand per job; see `spconv help`. */
#include <stdio.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "spconv/spconv.h"
#include "cli_args.h"
#include "commands.h"

static const spconv_command commands[] = {
    {"version", "print the version, the build and the CUDA devices", spconv_cmd_version},
    {"conv", "one sparse conv layer (regular, subm, transposed or inverse), forward and backward",
     spconv_cmd_conv},
    {"maxpool", "one sparse max pooling layer, forward and backward", spconv_cmd_maxpool},
    {"rulebook", "the rulebook (pairs per kernel offset) of a sparse conv", spconv_cmd_rulebook},
    {"voxelize", "points of a LiDAR scan (.bin, .pcd, .ply) to voxels in .npy files",
     spconv_cmd_voxelize},
    {"info", "what a point-cloud file holds: format, points, fields, bounds", spconv_cmd_info},
    {"run", "a LiDAR backbone on a scan: per-layer account, output .npy and a picture",
     spconv_cmd_run},
    {"bench", "time a zoo network forward (and backward), per layer and per phase",
     spconv_cmd_bench},
};

#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static void print_usage(FILE *stream) {
    fprintf(stream, "usage: spconv <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < COMMAND_COUNT; ++i)
        fprintf(stream, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(stream, "\n`spconv <command> --help` describes a command's options.\n");
}

int spconv_cmd_version(int argc, char **argv) {
    cli_spec spec = {.command = "version",
                     .summary = "print the version, what this build contains and the CUDA devices"};
    int status;
    if (!cli_parse(&spec, argc, argv, &status)) return status;
    char report[1024];
    spconv_build_report(report, sizeof report);
    fputs(report, stdout);
    return 0;
}

/* A network pass allocates and frees tensors of tens of MB per layer. glibc serves blocks above
 * its mmap threshold (at most 32 MiB) with fresh mmaps, which fault in page by page on first
 * touch and are unmapped on free: tens of thousands of page faults per pass. This process is
 * ours, so it keeps freed memory for reuse instead (the library never changes malloc settings;
 * a program embedding it decides for itself). */
static void keep_freed_memory(void) {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

int main(int argc, char **argv) {
    keep_freed_memory();
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "help") == 0 && argc > 2) {
        /* `spconv help conv` is `spconv conv --help`. */
        if (argc > 3) {
            fprintf(stderr, "spconv help: takes one command name, got %d\n", argc - 2);
            return 2;
        }
        for (size_t i = 0; i < COMMAND_COUNT; ++i) {
            if (strcmp(argv[2], commands[i].name) != 0) continue;
            static char help_flag[] = "--help";
            char *help_argv[] = {help_flag, NULL};
            return commands[i].run(1, help_argv);
        }
        fprintf(stderr, "spconv help: unknown command '%s' (see `spconv help`)\n", argv[2]);
        return 2;
    }
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < COMMAND_COUNT; ++i)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "spconv: unknown command '%s' (see `spconv help`)\n", argv[1]);
    return 2;
}
