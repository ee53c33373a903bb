/* `spconv`: the command-line front of the engine. One subcommand per job; see `spconv help`. */
#include <stdio.h>
#include <string.h>

#include "spconv/spconv.h"
#include "commands.h"

static const spconv_command commands[] = {
    {"version", "print the version, the build and the CUDA devices", spconv_cmd_version},
};

#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static void print_usage(FILE *stream) {
    fprintf(stream, "usage: spconv <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < COMMAND_COUNT; ++i)
        fprintf(stream, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(stream, "\n`spconv <command> --help` describes a command's options.\n");
}

int spconv_cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char report[1024];
    spconv_build_report(report, sizeof report);
    fputs(report, stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
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
