/* The `moe` command line: entry point, `help` and `version`. Uses only moe.h. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: moe <command> [options]\n"
          "\n"
          "Commands:\n"
          "  run       run one MoE layer of a Hugging Face checkpoint on hidden states from a\n"
          "            safetensors file and write the output (moe run --help)\n"
          "  bench     benchmark MoE layers: embedded model shapes or a checkpoint's layer\n"
          "            (moe bench --help)\n"
          "  plan      per-rank memory, padding, workspace, FLOPs and kernel paths of a layer\n"
          "            (moe plan --help)\n"
          "  quantize  convert a checkpoint's routed experts to fp8 / int8 / int4 (mxfp4 for\n"
          "            gpt-oss) and write a\n"
          "            checkpoint libmoe and vLLM load (moe quantize --help)\n"
          "  env       every knob, its value and where it came from (moe env --help)\n"
          "  version   library version and kernel tables\n"
          "  help      this text; 'moe help COMMAND' for a command's options\n"
          "\n"
          "Exit status: 0 success, 1 failure, 2 bad command line.\n",
          f);
}

static void quiet_log(moe_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)msg;
    (void)user;
}

static void version_usage(FILE *f)
{
    fputs("usage: moe version\n"
          "\n"
          "Print the library version, the kernel table this machine selects (after\n"
          "MOE_ISA) and which kernel tables this machine can run.\n",
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

    /* Which tables this machine runs: a forced ISA the CPU lacks fails ctx creation. */
    static const char *const isas[] = {"ref", "avx2", "avx512"};
    printf("kernel tables runnable here:");
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        moe_options o;
        moe_options_init(&o);
        o.isa = isas[i];
        o.num_threads = 1;
        o.log_fn = quiet_log;
        moe_ctx *c = NULL;
        char e2[512];
        if (moe_ctx_create(&o, &c, e2, sizeof e2) == MOE_OK && strcmp(moe_ctx_isa(c), isas[i]) == 0)
            printf(" %s", isas[i]);
        moe_ctx_free(c);
    }
    printf("\n");
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
    /* one rank's failure must not leave its peers waiting in a collective: end the job */
    if (rc != CLI_OK)
        cli_mpi_abort(rc);
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
            if (strcmp(argv[2], "help") != 0) {
                cli_err("moe help", "unknown command '%s'", argv[2]);
                usage(stderr);
                return CLI_USAGE;
            }
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
    fprintf(stderr, "moe: unknown command '%s'\n\n", sub);
    usage(stderr);
    return CLI_USAGE;
}
