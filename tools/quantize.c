/* `moe quantize`: convert a bf16 / f16 / f32 checkpoint's routed experts to a quantization
 * scheme and write a checkpoint libmoe (and vLLM) loads (moe_checkpoint_quantize). */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const CMD = "moe quantize";

static void quantize_usage(FILE *f)
{
    fputs("usage: moe quantize --checkpoint IN --output OUT --quant SCHEME [--layers all|L,...]\n"
          "                    [--force]\n"
          "\n"
          "Quantizes the routed experts of a Hugging Face MoE checkpoint (per-expert layout:\n"
          "Mixtral, Qwen2/3-MoE, Qwen3-Next, OLMoE, DeepSeek-V2/V3; stacked: gpt-oss (mxfp4\n"
          "only), Llama-4 (written per expert)) and writes a checkpoint\n"
          "that moe run / moe bench load, and vLLM too: everything else (attention, router,\n"
          "norms, shared experts, embeddings, tokenizer files) is copied unchanged. The output\n"
          "appears complete or not at all. Memory: one expert tensor in f32 at a time plus the\n"
          "quantized tensors of one shard.\n"
          "\n"
          "Options:\n"
          "  --checkpoint IN    the bf16 / f16 / f32 checkpoint folder\n"
          "  --output OUT       the folder to write (must not exist or be empty; not IN)\n"
          "  --quant SCHEME     fp8-block         Hugging Face FP8 (e4m3, 128x128 block scales)\n"
          "                     fp8-tensor|fp8-channel  compressed-tensors float-quantized\n"
          "                                       (e4m3, one scale per matrix / per row)\n"
          "                     int8-channel      compressed-tensors pack-quantized, weight-only\n"
          "                     int8-w8a8         compressed-tensors int-quantized, dynamic\n"
          "                                       per-token int8 activations\n"
          "                     int4-g32|g64|g128 compressed-tensors pack-quantized, symmetric\n"
          "                     int4-g32-zp|g64-zp|g128-zp   the same with zero points\n"
          "                     mxfp4             gpt-oss only: the released openai/gpt-oss\n"
          "                                       MXFP4 layout (*_blocks e2m1 + *_scales E8M0\n"
          "                                       per 32 inputs; biases stay bf16)\n"
          "  --layers LIST      MoE layers to quantize, comma-separated, or all (default all;\n"
          "                     fp8-block: all only); the others stay as they are (mxfp4:\n"
          "                     named in modules_to_not_convert)\n"
          "  --force            replace OUT when it exists and is not empty, only if it looks\n"
          "                     like a checkpoint: config.json present, only regular files\n"
          "                     that a checkpoint holds (*.safetensors, *.json, *.jinja,\n"
          "                     *.model, *.tiktoken, *.py, vocab.txt, merges.txt, README*,\n"
          "                     LICENSE*, NOTICE*, USE_POLICY*, .gitattributes), and not\n"
          "                     holding the current folder or IN; else refused (exit 1)\n"
          "  -h, --help         this text\n",
          f);
}

static void show_progress(const char *msg, void *user)
{
    (void)user;
    printf("%s\n", msg);
    fflush(stdout);
}

/* The schemes moe_checkpoint_quantize writes: every named one (fp8-tensor / fp8-channel as
 * compressed-tensors float-quantized). */
static int written(const char *scheme)
{
    moe_quant_config q;
    /* static FP8 activations need calibrated input scales, which moe quantize does not compute */
    return moe_quant_from_name(scheme, &q) == MOE_OK && q.act != MOE_QACT_STATIC;
}

int cli_cmd_quantize(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *scheme = NULL, *layers_s = NULL;
    int force = 0;
    const cli_opt opts[] = {
        /* the three required ones (checked below) */
        {.name = "--checkpoint", .kind = CLI_STR, .dst = &in},
        {.name = "--output", .kind = CLI_STR, .dst = &out},
        /* a scheme name, checked below against the library (moe_quant_from_name) */
        {.name = "--quant", .kind = CLI_STR, .dst = &scheme},
        /* all, or comma-separated layer numbers, parsed below */
        {.name = "--layers", .kind = CLI_STR, .dst = &layers_s},
        {.name = "--force", .kind = CLI_FLAG, .dst = &force},
    };
    const int prc = cli_parse_opts(argc, argv, CMD, opts, CLI_NOPTS(opts), quantize_usage);
    if (prc != CLI_GO_ON)
        return prc;
    if (!in || !out || !scheme) {
        cli_err(CMD, "--checkpoint, --output and --quant are required (see 'moe quantize --help')");
        return CLI_USAGE;
    }
    moe_quant_config qc;
    if (moe_quant_from_name(scheme, &qc) == MOE_OK && qc.act == MOE_QACT_STATIC) {
        cli_err(CMD, "--quant %s: static FP8 activations need input scales calibrated on real inputs, which moe "
                     "quantize does not compute (llm-compressor's FP8 scheme writes them); use fp8-tensor or "
                     "fp8-channel (weight-only)",
                scheme);
        return CLI_USAGE;
    }
    if (moe_quant_from_name(scheme, &qc) != MOE_OK || !strcmp(moe_quant_name(&qc), "none")) {
        cli_scheme_unknown(CMD, "--quant", scheme, NULL, 0, written);
        return CLI_USAGE;
    }
    int64_t layers[4096]; /* [n_layers] the --layers numbers, in the order given */
    int n_layers = 0;
    if (layers_s && strcmp(layers_s, "all") != 0) {
        /* the shared list parser: an empty list or item ("1,,2", "1,") is a usage error */
        if (cli_parse_i64_list(CMD, "--layers", layers_s, INT64_MIN, INT64_MAX, layers, (int)(sizeof layers / sizeof layers[0]),
                               &n_layers) != 0)
            return CLI_USAGE;
        for (int i = 0; i < n_layers; i++)
            for (int j = 0; j < i; j++)
                if (layers[j] == layers[i]) {
                    cli_err(CMD, "--layers: layer %lld is listed twice", (long long)layers[i]);
                    return CLI_USAGE;
                }
    }
    /* --force: the library checks that OUT looks like a checkpoint before replacing it
     * (moe_quantize_options.force) */
    moe_ctx *ctx = NULL;
    char err[512] = "";
    moe_status st = moe_ctx_create(NULL, &ctx, err, sizeof err);
    if (st != MOE_OK) {
        cli_err(CMD, "%s", err[0] ? err : moe_status_name(st));
        return CLI_FAIL;
    }
    /* SIGINT / SIGTERM / SIGHUP: the library stops before the next tensor and removes its
     * temporary folder (moe_quantize_options.cancel) */
    cli_signal_catch(0);
    moe_quantize_options o = {.scheme = scheme, .layers = n_layers ? layers : NULL, .n_layers = (size_t)n_layers,
                              .force = force, .progress = show_progress, .cancel = &cli_interrupted};
    moe_quantize_stats s;
    double t0 = cli_now();
    st = moe_checkpoint_quantize(ctx, in, out, &o, &s);
    if (st != MOE_OK) {
        const char *m = moe_ctx_last_error(ctx);
        cli_err(CMD, "%s", m && m[0] ? m : moe_status_name(st));
        moe_ctx_free(ctx);
        return CLI_FAIL;
    }
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    printf("expert tensors: %lld\n", (long long)s.expert_tensors);
    printf("input expert bytes: %llu (%s)\n", (unsigned long long)s.input_expert_bytes,
           cli_fmt_bytes(b1, sizeof b1, (double)s.input_expert_bytes));
    printf("output expert bytes: %llu (%s): codes %s, scales %s, zero points %s\n",
           (unsigned long long)(s.output_code_bytes + s.output_scale_bytes + s.output_zero_bytes),
           cli_fmt_bytes(b2, sizeof b2, (double)(s.output_code_bytes + s.output_scale_bytes + s.output_zero_bytes)),
           cli_fmt_bytes(b3, sizeof b3, (double)s.output_code_bytes),
           cli_fmt_bytes(b4, sizeof b4, (double)s.output_scale_bytes),
           cli_fmt_bytes(b5, sizeof b5, (double)s.output_zero_bytes));
    printf("scale bytes: %llu\n", (unsigned long long)(s.output_scale_bytes + s.output_zero_bytes));
    printf("other tensors copied: %s; other files copied: %d; shards: %d; %.2f s\n",
           cli_fmt_bytes(b1, sizeof b1, (double)s.other_bytes), s.copied_files, s.shards, cli_now() - t0);
    moe_ctx_free(ctx);
    return CLI_OK;
}
