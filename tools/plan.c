/* `moe plan`: what a layer costs per rank before anything is loaded: expert weight bytes,
 * padding and its cost, workspace, FLOPs and bytes per token, the kernel path each token
 * count takes, and warnings for every cost the user did not ask for. */
#include "cli.h"
#include "models.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const CMD = "moe plan";

static void plan_usage(FILE *f)
{
    fputs("usage: moe plan (--model NAME | --checkpoint DIR [--layer L]) [--tp N] [--ep N]\n"
          "                [--quant SCHEME] [--tokens LIST]\n"
          "\n"
          "Reports, per rank, for one MoE layer: expert weight bytes, padding and its cost,\n"
          "workspace bytes at each T, FLOPs and weight bytes per token, the kernel path each\n"
          "T takes, and a WARNING line for every cost not asked for (padding, duplicated\n"
          "memory, fallback kernels). Nothing is allocated or loaded beyond config.json and\n"
          "the safetensors headers.\n"
          "\n"
          "Options:\n"
          "  --model NAME       an embedded model shape (moe bench --list-models)\n"
          "  --checkpoint DIR   a Hugging Face checkpoint; --layer L (default: first MoE layer)\n"
          "  --tp N             tensor-parallel ranks: I is split across them (default 1)\n"
          "  --ep N             expert-parallel groups: experts placed E/N per group, the first\n"
          "                     E % N groups holding one more (default 1)\n"
          "  --quant SCHEME     expert weights: bf16 (default for --model), f16, f32, or a\n"
          "                     quantization scheme of moe bench --quant (fp8-block, int8-w8a8,\n"
          "                     int4-g128, mxfp4, ...); default for --checkpoint: its own\n"
          "  --tokens LIST      token counts for workspace and kernel path (default\n"
          "                     1,16,256,2048,32768)\n"
          "  -h, --help         this text\n",
          f);
}

/* The resolved value of knob `field` (as moe_ctx_create would resolve it). */
static long long knob_ll(const char *field)
{
    for (size_t i = 0; i < moe_knob_count(); i++) {
        moe_knob_info k;
        if (moe_knob_describe(NULL, i, &k) == MOE_OK && strcmp(k.field, field) == 0)
            return atoll(k.value);
    }
    return 0;
}

/* "WARNING: <what>: <size>" */
static void warn(const char *what, double bytes)
{
    char b[32];
    printf("WARNING: %s: %s\n", what, cli_fmt_bytes(b, sizeof b, bytes));
}

int cli_cmd_plan(int argc, char **argv)
{
    const char *model = NULL, *ckdir = NULL, *quant = NULL, *tokens = "1,16,256,2048,32768";
    int64_t tp = 1, ep = 1, layer = -1;
    const cli_opt opts[] = {
        /* the layer: exactly one of an embedded model (by name) or a checkpoint folder */
        {.name = "--model", .kind = CLI_STR, .dst = &model},
        {.name = "--checkpoint", .kind = CLI_STR, .dst = &ckdir},
        /* the checkpoint's layer; -1 (the default): its first MoE layer */
        {.name = "--layer", .kind = CLI_I64, .dst = &layer, .lo = 0, .hi = INT32_MAX},
        {.name = "--tp", .kind = CLI_I64, .dst = &tp, .lo = 1, .hi = 4096},
        {.name = "--ep", .kind = CLI_I64, .dst = &ep, .lo = 1, .hi = 4096},
        /* a dtype or a quantization scheme, checked below */
        {.name = "--quant", .kind = CLI_STR, .dst = &quant},
        /* a comma-separated list of token counts, parsed below */
        {.name = "--tokens", .kind = CLI_STR, .dst = &tokens},
    };
    const int prc = cli_parse_opts(argc, argv, CMD, opts, CLI_NOPTS(opts), plan_usage);
    if (prc != CLI_GO_ON)
        return prc;
    if (!model == !ckdir) {
        cli_err(CMD, "give exactly one of --model NAME or --checkpoint DIR (see 'moe plan --help')");
        return CLI_USAGE;
    }
    moe_quant_config qarg; /* --quant SCHEME (a moe_quant_from_name name), else unused */
    memset(&qarg, 0, sizeof qarg);
    const int qdtype = quant && (!strcmp(quant, "bf16") || !strcmp(quant, "f16") || !strcmp(quant, "f32"));
    if (quant && !qdtype && moe_quant_from_name(quant, &qarg) != MOE_OK) {
        cli_err(CMD, "--quant %s: accepted values are bf16, f16, f32 and the schemes of moe bench --quant "
                "(fp8-block, fp8-block-w8a8, fp8-channel, fp8-tensor, int8-channel, int8-w8a8, "
                "int4-g32/g64/g128[-zp], mxfp4, none)", quant);
        return CLI_USAGE;
    }
    /* token counts */
    int64_t Ts[32];
    int nT = 0;
    {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", tokens);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (nT == 32 || cli_parse_i64(CMD, "--tokens", tok, 1, (int64_t)1 << 40, &Ts[nT]) < 0)
                return CLI_USAGE;
            nT++;
        }
        if (nT == 0) {
            cli_err(CMD, "--tokens: give at least one token count");
            return CLI_USAGE;
        }
    }

    moe_layer_desc d;
    moe_layer_desc_init(&d);
    const char *name = model;
    moe_ctx *ctx = NULL;
    char err[1024] = "";
    if (moe_ctx_create(NULL, &ctx, err, sizeof err) != MOE_OK) {
        cli_err(CMD, "%s", err);
        return CLI_FAIL;
    }
    int rc = CLI_FAIL;
    if (model) {
        const cli_model *m = cli_model_find(model);
        if (!m) {
            cli_err(CMD, "--model %s: unknown model (moe bench --list-models lists them)", model);
            moe_ctx_free(ctx);
            return CLI_USAGE;
        }
        d.hidden_size = m->hidden_size;
        d.moe_intermediate_size = m->intermediate_size;
        d.num_experts = m->num_experts;
        d.top_k = m->top_k;
        d.shared_expert_intermediate_size = m->shared_intermediate_size;
        d.shared_expert_gated = m->shared_gated;
        d.weight_dtype = MOE_DTYPE_BF16;
    } else {
        moe_checkpoint *ck = NULL;
        if (moe_checkpoint_open(ctx, ckdir, &ck) != MOE_OK) {
            cli_err(CMD, "%s", moe_ctx_last_error(ctx));
            goto done;
        }
        if (layer < 0)
            for (int64_t l = 0; l < moe_checkpoint_num_layers(ck) && layer < 0; l++)
                if (moe_checkpoint_is_moe_layer(ck, l))
                    layer = l;
        moe_status st = moe_checkpoint_layer_desc(ck, layer, &d);
        moe_checkpoint_free(ck);
        if (st != MOE_OK) {
            cli_err(CMD, "%s", moe_ctx_last_error(ctx));
            goto done;
        }
        name = ckdir;
    }
    const int64_t H = d.hidden_size, I = d.moe_intermediate_size, E = d.num_experts, K = d.top_k;
    const int64_t Is = d.shared_expert_intermediate_size;
    if (qdtype)
        d.weight_dtype = strcmp(quant, "f32") == 0 ? MOE_DTYPE_F32 : strcmp(quant, "f16") == 0 ? MOE_DTYPE_F16
                                                                                               : MOE_DTYPE_BF16;
    if (quant && !qdtype)
        d.quant = qarg; /* --quant SCHEME replaces the checkpoint's own scheme */
    else if (qdtype)
        memset(&d.quant, 0, sizeof d.quant);
    /* quantized routed experts (--quant SCHEME, or the checkpoint's own: FP8 block,
     * compressed-tensors, MXFP4): codes of `qbits` bits, plus f32 scales (src/quant/qweights.c
     * packs one f32 per output feature per scale cell along the input; zero points the same;
     * w8a8 one int32 per output feature) */
    const moe_quant_config *qc = &d.quant;
    const int qz = strcmp(moe_quant_name(qc), "none") != 0;
    const int qbits = !qz ? 0 : (qc->w13.dtype == MOE_QTYPE_INT4 || qc->w13.dtype == MOE_QTYPE_MXFP4) ? 4 : 8;
    const int fp8 = qz && qc->w13.dtype == MOE_QTYPE_F8_E4M3 && qc->w13.scale == MOE_QSCALE_BLOCK;
    const double es = (double)moe_dtype_size(d.weight_dtype);
    const double ees = qz ? qbits / 8.0 : es; /* bytes per routed-expert weight (codes only) */
    char dtbuf[160];
    if (qz)
        snprintf(dtbuf, sizeof dtbuf, "%s (routed experts: %d-bit codes + f32 scales%s; the rest %s)", moe_quant_name(qc),
                 qbits, quant ? "" : ", from the checkpoint", moe_dtype_name(d.weight_dtype));
    const char *dtname = qz ? dtbuf : moe_dtype_name(d.weight_dtype);
    if (tp > I) {
        cli_err(CMD, "--tp %lld exceeds the intermediate size %lld: some ranks would hold no columns",
                (long long)tp, (long long)I);
        rc = CLI_USAGE;
        goto done;
    }
    if (ep > E) {
        cli_err(CMD, "--ep %lld exceeds the %lld experts: some groups would hold none", (long long)ep, (long long)E);
        rc = CLI_USAGE;
        goto done;
    }

    char b1[32], b2[32];
    if (ckdir)
        printf("plan: %s layer %lld: H %lld, I %lld, E %lld, K %lld", name, (long long)layer, (long long)H,
               (long long)I, (long long)E, (long long)K);
    else
        printf("plan: %s layer: H %lld, I %lld, E %lld, K %lld", name, (long long)H, (long long)I,
               (long long)E, (long long)K);
    if (Is)
        printf(", shared expert I %lld%s", (long long)Is, d.shared_expert_gated ? " (gated)" : "");
    printf(", weights %s\n", dtname);
    printf("ranks: tp %lld x ep %lld = %lld; kernel table %s; options hash %016llx\n", (long long)tp, (long long)ep,
           (long long)(tp * ep), moe_ctx_isa(ctx), (unsigned long long)moe_ctx_options_hash(ctx));
    if (tp * ep > 1)
        printf("placement: the library's (moe.h \"Parallelism\"): experts split E/ep with the remainder on the first "
               "EP ranks, I (and the shared expert's I) split I/tp the same way; 'expert bytes' + 'shared bytes' is "
               "what moe_weights_expert_bytes reports on that rank once packed (mpirun -np %lld moe bench --ep %lld "
               "--tp %lld measures it)%s\n",
               (long long)(tp * ep), (long long)ep, (long long)tp, moe_mpi_available() ? "" : "; this build has no MPI");
    if (qz && tp * ep > 1)
        printf("note: quantized experts (%s): under EP each rank packs its experts, under TP its rows of gate/up and "
               "columns of down; a scale block or group cut by the shard boundary is re-expressed with a finer cell "
               "that repeats its scale (no code padding)%s; 'scale bytes' are the packed f32 scales (one per output "
               "feature and cell along the input, zero points alike), included in moe_weights_expert_bytes\n",
               moe_quant_name(qc), qbits == 4 ? "; 4-bit codes need an even I shard on every rank" : "");
    /* Per rank: EP group g holds experts [e0, e0 + ne); TP rank t holds I columns [i0, i0 + ni). */
    double total_bytes = 0, max_dup = 0, total_dup = 0;
    int64_t e0 = 0, cut_cell = 0;
    printf("\n%5s %5s %14s %10s %16s %14s %14s %12s %10s\n", "ep", "tp", "experts", "I shard", "expert bytes",
           "shared bytes", "scale bytes", "dup scales", "padding");
    /* 'dup scales': scale bytes beyond the blocks whose first column lies in the shard (summed over the TP ranks:
     * what TP adds to the one-process scale bytes) */
    for (int64_t g = 0; g < ep; g++) {
        int64_t ne = E / ep + (g < E % ep ? 1 : 0);
        int64_t i0 = 0;
        for (int64_t t = 0; t < tp; t++) {
            int64_t ni = I / tp + (t < I % tp ? 1 : 0);
            int64_t nis = Is ? Is / tp + (t < Is % tp ? 1 : 0) : 0;
            double wb = (double)ne * 3.0 * (double)H * (double)ni * ees;
            double sb = 3.0 * (double)H * (double)nis * es;
            double scales = 0, dup = 0;
            if (qz) {
                /* per matrix [N, K]: one f32 per output feature per cell of gk inputs (BLOCK: block_k; GROUP:
                 * group_size; CHANNEL / TENSOR: the whole K), doubled with zero points, + N int32 with w8a8.
                 * gate and up [ni, H] cut along N; down [H, ni] along K: a shard that starts inside a cell and
                 * leaves it keeps the cells of gcd(gk, i0 mod gk) (src/quant/qweights.c); the duplicate is what
                 * exceeds the cells whose first column lies in the shard. */
                const moe_qweight *q13 = &qc->w13, *q2 = &qc->w2;
                const int64_t g13 = q13->scale == MOE_QSCALE_BLOCK ? q13->block_k
                                    : q13->scale == MOE_QSCALE_GROUP ? q13->group_size : H;
                const int64_t c2 = q2->scale == MOE_QSCALE_BLOCK ? q2->block_k
                                   : q2->scale == MOE_QSCALE_GROUP ? q2->group_size : I;
                const int64_t r = i0 % c2;
                int64_t gk = c2 < ni || r ? c2 : ni;
                if (q2->scale != MOE_QSCALE_BLOCK && q2->scale != MOE_QSCALE_GROUP)
                    gk = ni; /* one cell over the shard's whole K */
                else if (r != 0 && r + ni > c2)
                    for (gk = r; c2 % gk != 0 || r % gk != 0; gk--)
                        ;
                else
                    gk = c2;
                const double z13 = q13->has_zero_point ? 2.0 : 1.0, z2 = q2->has_zero_point ? 2.0 : 1.0;
                const int64_t ng = (ni + gk - 1) / gk;
                scales = (double)ne * (2.0 * (double)ni * (double)((H + g13 - 1) / g13) * z13 + (double)H * (double)ng * z2) * 4.0;
                if (qc->act == MOE_QACT_TOKEN)
                    scales += (double)ne * (2.0 * (double)ni + (double)H) * 4.0;
                if (q2->scale == MOE_QSCALE_BLOCK || q2->scale == MOE_QSCALE_GROUP) {
                    const int64_t own = (i0 + ni - 1) / c2 - (i0 + c2 - 1) / c2 + 1;
                    dup = (double)ne * (double)H * (double)(ng - (own > 0 ? own : 0)) * 4.0 * z2;
                }
                total_dup += dup;
                if (gk != c2 && gk != ni && tp > 1) {
                    printf("  cut: tp rank %lld holds I %lld..%lld, which starts inside the %lld-column scale cell "
                           "%lld..%lld: its down projection's scales are kept per %lld columns\n",
                           (long long)t, (long long)i0, (long long)(i0 + ni - 1), (long long)c2, (long long)(i0 - r),
                           (long long)(i0 - r + c2 - 1), (long long)gk);
                    cut_cell = gk;
                }
            }
            char ex[32];
            snprintf(ex, sizeof ex, "%lld..%lld", (long long)e0, (long long)(e0 + ne - 1));
            printf("%5lld %5lld %14s %10lld %16.0f %14.0f %14.0f %12.0f %10s\n", (long long)g, (long long)t, ex,
                   (long long)ni, wb, sb, scales, dup, "0");
            total_bytes += wb + sb + scales;
            max_dup = dup > max_dup ? dup : max_dup;
            i0 += ni;
        }
        e0 += ne;
    }
    printf("(bytes exact) all ranks: %s of expert weights (the layer's weights%s: %s)\n",
           cli_fmt_bytes(b1, sizeof b1, total_bytes), qz ? ", codes without scales" : "",
           cli_fmt_bytes(b2, sizeof b2, (double)E * 3.0 * (double)H * (double)I * ees + 3.0 * (double)H * (double)Is * es));

    /* warnings: every cost not asked for */
    int warnings = 0;
    if (Is && ep > 1) {
        warn("shared expert replicated on every expert-parallel group (each adds it once, for its own tokens); "
             "bytes per replica",
             3.0 * (double)H * (double)(Is / tp + (Is % tp ? 1 : 0)) * es);
        warnings++;
    }
    if (ep > 1 || tp > 1) {
        warn("router weight [E, H] f32 replicated on every rank; bytes per rank", 4.0 * (double)E * (double)H);
        warnings++;
    }
    if (qz && max_dup > 0) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "%s scale cells cut by the TP split (I %lld per shard): the down projection's scales of a cut cell "
                 "are held by both shards%s; no code padding, no extra FLOPs; duplicated scale bytes (all ranks %.0f), "
                 "on the worst rank",
                 moe_quant_name(qc), (long long)(I / tp),
                 cut_cell ? ", and a shard starting inside a cell and leaving it keeps them per finer cells (listed "
                            "above)"
                          : "",
                 total_dup);
        warn(msg, max_dup);
        warnings++;
    }
    if (fp8 && (H % qc->w13.block_k != 0 || I % qc->w2.block_k != 0 || I % qc->w13.block_n != 0 ||
                H % qc->w2.block_n != 0)) {
        warn("fp8 blocks: partial trailing blocks (H or I not a multiple of the block) are masked, not padded; padding",
             0);
        warnings++;
    }
    if (strcmp(moe_ctx_isa(ctx), "avx2") == 0 && ((I / tp) % 16 != 0 || H % 16 != 0)) {
        warn("avx2 table: the last partial panel of 16 features runs the scalar fallback kernel; weights per "
             "expert on it at most",
             15.0 * (double)H * 3.0 * ees);
        warnings++;
    }
    if (!warnings)
        printf("no padding, no duplicated memory, no fallback kernels\n");

    /* per token */
    double flops = 2.0 * (double)K * 3.0 * (double)H * (double)I + 2.0 * 3.0 * (double)H * (double)Is +
                   2.0 * (double)E * (double)H;
    double bytes = (double)K * 3.0 * (double)H * (double)I * ees + 3.0 * (double)H * (double)Is * es;
    printf("\nper token: %.1f MFLOP (router + %lld experts%s); decode reads %s of expert weights (all ranks)\n",
           flops / 1e6, (long long)K, Is ? " + shared" : "", cli_fmt_bytes(b1, sizeof b1, bytes));

    /* workspace and kernel path per T, for the rank shard (E local experts, I shard) */
    long long chunk = knob_ll("chunk_size"), onehot = knob_ll("onehot_threshold");
    long long lowtok = knob_ll("lowtok_threshold");
    moe_layer_desc shard = d;
    shard.moe_intermediate_size = I / tp + (I % tp ? 1 : 0);
    if (Is)
        shard.shared_expert_intermediate_size = Is / tp + (Is % tp ? 1 : 0);
    if (qz) { /* the workspace does not depend on the expert weights' format */
        memset(&shard.quant, 0, sizeof shard.quant);
        shard.weight_dtype = MOE_DTYPE_BF16;
    }
    moe_plan *p = NULL;
    if (moe_plan_create(ctx, &shard, &p) != MOE_OK) {
        cli_err(CMD, "%s", moe_ctx_last_error(ctx));
        goto done;
    }
    printf("\n%10s %14s %8s %14s %10s  %s\n", "T", "workspace", "chunks", "rows/expert", "permute", "experts path");
    for (int i = 0; i < nT; i++) {
        int64_t T = Ts[i];
        int64_t tc = T < chunk ? T : chunk;
        double rows = (double)tc * (double)K / (double)E;
        const char *perm = (double)tc * (double)K <= (double)onehot ? "onehot" : "sort";
        printf("%10lld %14s %8lld %14.2f %10s  %s\n", (long long)T,
               cli_fmt_bytes(b1, sizeof b1, (double)moe_plan_workspace_size(p, T)),
               (long long)((T + chunk - 1) / chunk), rows, perm,
               rows < (double)lowtok ? "few-token streaming (rows per expert < MOE_LOWTOK_THRESHOLD)" : "tiled GEMM");
    }
    moe_plan_free(p);
    rc = CLI_OK;
done:
    moe_ctx_free(ctx);
    return rc;
}
