/* Subcommands of the `spconv` tool. Each takes the arguments after its name and returns the
 * process exit status: 0 on success, 2 on bad arguments or files (after a one-line message on
 * stderr), 1 on any other failure. */
#ifndef SPCONV_TOOLS_COMMANDS_H
#define SPCONV_TOOLS_COMMANDS_H

typedef int (*spconv_command_fn)(int argc, char **argv);

typedef struct spconv_command {
    const char *name;
    const char *summary;
    spconv_command_fn run;
} spconv_command;

int spconv_cmd_version(int argc, char **argv);
int spconv_cmd_conv(int argc, char **argv);     /* cmd_conv.c */
int spconv_cmd_maxpool(int argc, char **argv);  /* cmd_conv.c */
int spconv_cmd_rulebook(int argc, char **argv); /* cmd_conv.c */
int spconv_cmd_voxelize(int argc, char **argv); /* cmd_pointcloud.c */
int spconv_cmd_info(int argc, char **argv);     /* cmd_pointcloud.c */
int spconv_cmd_run(int argc, char **argv);      /* cmd_run.c */
int spconv_cmd_bench(int argc, char **argv);    /* cmd_bench.c */

#endif
