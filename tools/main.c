/* The `moe` command line: entry point, `help` and `version`. Uses only moe.h. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* The commands, in the order `moe help` lists them, with what each does. */
static const struct {
    const char *name, *what;
} commands[] = {
    {"run", "run one MoE layer of a Hugging Face checkpoint on hidden states from a safetensors file and write "
            "the output (moe run --help)"},
    {"bench", "benchmark MoE layers: embedded model shapes or a checkpoint's layer (moe bench --help)"},
    {"plan", "per-rank memory, padding, workspace, FLOPs and kernel paths of a layer (moe plan --help)"},
    {"quantize", "convert a checkpoint's routed experts to fp8 / int8 / int4 (mxfp4 for gpt-oss) and write a "
                 "checkpoint libmoe and vLLM load (moe quantize --help)"},
    {"tune", "measure the knobs that never change the output bits for a layer shape and write the tuning file "
             "MOE_TUNING_DIR reads (moe tune --help)"},
    {"env", "every knob, its value and where it came from (moe env --help)"},
    {"version", "library version and kernel tables"},
    {"help", "this text; 'moe help COMMAND' for a command's options"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *f)
{
    fputs("usage: moe <command> [options]\n"
          "\n"
          "Commands:\n",
          f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        fprintf(f, "  %-10s", commands[i].name);
        cli_print_wrapped(f, commands[i].what, 12, CLI_HELP_WIDTH);
    }
    fputs("\n"
          "Exit status: 0 success, 1 failure, 2 bad command line.\n",
          f);
}

/* "moe: unknown command 'X'; did you mean Y?" and the usage, on stderr. */
static int unknown_command(const char *cmd, const char *word)
{
    const char *names[N_COMMANDS + 3];
    size_t n = 0;
    for (size_t i = 0; i < N_COMMANDS; i++)
        names[n++] = commands[i].name;
    names[n++] = "--help";
    names[n++] = "--version";
    char hint[96];
    cli_err(cmd, "unknown command '%s'%s", word, cli_did_you_mean(hint, sizeof hint, word, names, n));
    fputc('\n', stderr);
    usage(stderr);
    return CLI_USAGE;
}

static void version_usage(FILE *f)
{
    fputs("usage: moe version\n"
          "\n"
          "Print the library version, the kernel table this machine selects (after\n"
          "MOE_ISA) and the kernel registry: every table, whether this machine can run it,\n"
          "and the sub-ISA capabilities it uses here.\n",
          f);
}

static int cmd_version(int argc, char **argv)
{
    const int prc = cli_parse_opts(argc, argv, "moe version", NULL, 0, version_usage); /* no options */
    if (prc != CLI_GO_ON)
        return prc;
    printf("libmoe %s (library), moe tool built against %d.%d.%d\n", moe_version_string(),
           MOE_VERSION_MAJOR, MOE_VERSION_MINOR, MOE_VERSION_PATCH);
    moe_ctx *ctx = NULL;
    char err[512] = "";
    moe_status st = moe_ctx_create(NULL, &ctx, err, sizeof err);
    if (st != MOE_OK) {
        cli_err("moe version", "%s", err[0] ? err : moe_status_name(st));
        return CLI_FAIL;
    }
    printf("kernel table: %s (threads %d)\n", moe_ctx_isa(ctx), moe_ctx_num_threads(ctx));
    moe_ctx_free(ctx);

    /* The kernel registry, row by row: which tables this machine runs, with the sub-ISA
     * capabilities each uses here. */
    printf("kernel tables runnable here:");
    for (size_t i = 0; i < moe_isa_count(); i++) {
        moe_isa_info info;
        if (moe_isa_describe(i, &info) == MOE_OK && info.runnable)
            printf(" %s", info.name);
    }
    printf("\n");
    for (size_t i = 0; i < moe_isa_count(); i++) {
        moe_isa_info info;
        if (moe_isa_describe(i, &info) != MOE_OK)
            continue;
        printf("  %-12s %s (needs %s)%s%s\n", info.name, info.runnable ? "runnable" : "not runnable here",
               info.requires, info.capabilities[0] ? ": " : "", info.capabilities);
        if (info.notes[0])
            printf("  %-12s %s\n", "", info.notes);
    }
    return CLI_OK;
}

static int dispatch(int argc, char **argv);

/* A lost stdout (a full disk, a closed pipe) is a failure, never a silent exit 0. */
int main(int argc, char **argv)
{
    /* run and bench use MPI for --ep / --tp > 1 (or under mpirun); the rest never do */
    if (argc >= 2 && (strcmp(argv[1], "run") == 0 || strcmp(argv[1], "bench") == 0) &&
        cli_mpi_init(&argc, &argv) != 0)
        return CLI_FAIL;
    int rc = dispatch(argc, argv);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "moe: writing standard output failed\n");
        rc = CLI_FAIL;
    }
    /* the ranks agree on the exit status and end with MPI_Finalize; a failing rank whose peers
     * wait in a collective for it ends the job with MPI_Abort (cli_mpi_exit) */
    rc = cli_mpi_exit(rc);
    cli_mpi_finalize();
    return rc;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "help") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
        if (argc >= 3) {
            char help[] = "--help";
            char *hv[2] = {argv[2], help};
            if (strcmp(argv[2], "run") == 0)
                return cli_cmd_run(2, hv);
            if (strcmp(argv[2], "bench") == 0)
                return cli_cmd_bench(2, hv);
            if (strcmp(argv[2], "version") == 0)
                return cmd_version(2, hv);
            if (strcmp(argv[2], "env") == 0)
                return cli_cmd_env(2, hv);
            if (strcmp(argv[2], "plan") == 0)
                return cli_cmd_plan(2, hv);
            if (strcmp(argv[2], "quantize") == 0)
                return cli_cmd_quantize(2, hv);
            if (strcmp(argv[2], "tune") == 0)
                return cli_cmd_tune(2, hv);
            if (strcmp(argv[2], "help") != 0)
                return unknown_command("moe help", argv[2]);
        }
        usage(stdout);
        return CLI_OK;
    }
    if (strcmp(sub, "--version") == 0 || strcmp(sub, "version") == 0)
        return cmd_version(argc - 1, argv + 1);
    if (strcmp(sub, "run") == 0)
        return cli_cmd_run(argc - 1, argv + 1);
    if (strcmp(sub, "bench") == 0) /* --ep / --tp: the parallel bench (tools/bench_par.c) */
        return cli_bench_parallel_wanted(argc - 1, argv + 1) ? cli_bench_parallel(argc - 1, argv + 1)
                                                             : cli_cmd_bench(argc - 1, argv + 1);
    if (strcmp(sub, "env") == 0)
        return cli_cmd_env(argc - 1, argv + 1);
    if (strcmp(sub, "plan") == 0)
        return cli_cmd_plan(argc - 1, argv + 1);
    if (strcmp(sub, "quantize") == 0)
        return cli_cmd_quantize(argc - 1, argv + 1);
    if (strcmp(sub, "tune") == 0)
        return cli_cmd_tune(argc - 1, argv + 1);
    return unknown_command("moe", sub);
}
