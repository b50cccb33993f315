/* `moe plan`: what a layer costs per rank before anything is loaded: expert weight bytes,
 * padding and its cost, workspace, FLOPs and bytes per token, the kernel path each token
 * count takes, and warnings for every cost the user did not ask for. */
#include "cli.h"
#include "models.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* "name (parameters)" of an expert activation (moe.h moe_activation), the parameters those of
 * `d` it reads, `limit` the clamp (swiglu_limit, or the shared expert's own) */
static void activation_text(moe_activation a, const moe_layer_desc *d, float limit, char *out, size_t len)
{
    switch (a) {
    case MOE_ACT_SWIGLU: snprintf(out, len, "swiglu (silu(g) * u)"); break;
    case MOE_ACT_GEGLU: snprintf(out, len, "geglu (gelu(g) * u)"); break;
    case MOE_ACT_GEGLU_TANH: snprintf(out, len, "geglu_tanh (gelu_tanh(g) * u)"); break;
    case MOE_ACT_SWIGLU_OAI:
        snprintf(out, len, "swiglu_oai (alpha %g, limit %g)", (double)d->swiglu_alpha, (double)limit);
        break;
    case MOE_ACT_SWIGLU_CLAMP: snprintf(out, len, "swiglu_clamp (silu(min(g, L)) * clamp(u, +-L), L %g)", (double)limit); break;
    case MOE_ACT_SWIGLU_SOFTCAP:
        snprintf(out, len, "swiglu_softcap (gate cap %g, up cap %g)", (double)d->softcap_gate, (double)d->softcap_up);
        break;
    case MOE_ACT_SWIGLU_POSTCLAMP:
        snprintf(out, len, "swiglu_postclamp (min(silu(g), L) * clamp(u, +-L), L %g)", (double)limit);
        break;
    case MOE_ACT_RELU: snprintf(out, len, "relu (non-gated)"); break;
    case MOE_ACT_RELU2: snprintf(out, len, "relu2 (non-gated, relu(u)^2)"); break;
    case MOE_ACT_GELU: snprintf(out, len, "gelu (non-gated)"); break;
    case MOE_ACT_GELU_TANH: snprintf(out, len, "gelu_tanh (non-gated)"); break;
    default: snprintf(out, len, "activation %d", (int)a); break;
    }
}

static const char *const CMD = "moe plan";

static void plan_usage(FILE *f)
{
    fputs("usage: moe plan (--model NAME | --checkpoint DIR [--layer L] [--strict]\n"
          "                [--family NAME]) [--tp N] [--ep N]\n"
          "                [--quant SCHEME] [--compute f32|bf16] [--tokens LIST]\n"
          "       moe plan --list-models\n"
          "\n"
          "Reports, per rank, for one MoE layer: expert weight bytes, padding and its cost,\n"
          "workspace bytes at each T, FLOPs and weight bytes per token, the kernel path each\n"
          "T takes, and a WARNING line for every cost not asked for (padding, duplicated\n"
          "memory, fallback kernels); a memory cost under 1% of a rank's expert bytes is an\n"
          "INFO line instead. Nothing is allocated or loaded beyond config.json and the\n"
          "safetensors headers.\n"
          "\n"
          "Options:\n"
          "  --model NAME       an embedded model shape (--list-models)\n"
          "  --list-models      list the embedded models (as moe bench --list-models) and exit\n"
          "  --checkpoint DIR   a Hugging Face checkpoint; --layer L (default: first MoE layer)\n"
          "  --strict           with --checkpoint: refuse (exit 1) tensors under the layer's MoE\n"
          "                     block that libmoe does not read (default: a WARNING names them)\n"
          "  --family NAME      with --checkpoint: read it as family NAME whatever config.json\n"
          "                     names (moe run --help; a WARNING names both)\n"
          "  --experts SET      with --checkpoint: the expert set of a block with one per\n"
          "                     modality (ernie4_5_vl_moe: text, the default, or vision)\n"
          "  --tp N             tensor-parallel ranks: I is split across them (default 1)\n"
          "  --ep N             expert-parallel groups: experts placed E/N per group, the first\n"
          "                     E % N groups holding one more (default 1)\n"
          "  --quant SCHEME     expert weights: bf16 (default for --model), f16, f32, or a\n"
          "                     quantization scheme of moe bench --quant (fp8-block, int8-w8a8,\n"
          "                     int4-g128, mxfp4, ...); default for --checkpoint: its own\n"
          "  --compute C        the expert GEMMs' arithmetic: f32 (default) or bf16 (bf16\n"
          "                     activations and weights, f32 accumulation; moe.h moe_compute)\n"
          "  --tokens LIST      token counts for workspace and kernel path (default\n"
          "                     1,16,256,2048,32768)\n"
          "  --placement P      with --ep: the expert placement to report: contiguous\n"
          "                     (default), round_robin, balanced (needs --load), or a\n"
          "                     placement file (docs/parallel.md)\n"
          "  --redundant N      with --placement balanced: N replicas of the hottest experts\n"
          "  --load FILE        the measured expert load (moe bench --ep N --load-out FILE)\n"
          "  --placement-out F  write the placement reported to F, the file moe run --ep N\n"
          "                     --placement F runs\n"
          "  -h, --help         this text\n",
          f);
}

/* "WARNING: <what>: <size>", or "INFO: ..." for a cost under MOE_REPORT_SMALL_FRACTION of a
 * rank's expert bytes (moe_cost.level) */
static void print_cost(const moe_cost *c)
{
    char b[32];
    const char *tag = c->level == MOE_LOG_INFO ? "INFO" : "WARNING";
    if (c->bytes >= 0)
        printf("%s: %s: %s\n", tag, c->what, cli_fmt_bytes(b, sizeof b, c->bytes));
    else
        printf("%s: %s\n", tag, c->what);
}

/* "0..21,30,45..47": the logical ids ids [n] (rank order) with consecutive runs collapsed */
static void print_ranges(const int32_t *ids, int32_t n)
{
    for (int32_t i = 0; i < n;) {
        int32_t j = i;
        while (j + 1 < n && ids[j + 1] == ids[j] + 1)
            j++;
        if (j > i)
            printf("%s%d..%d", i ? "," : "", ids[i], ids[j]);
        else
            printf("%s%d", i ? "," : "", ids[i]);
        i = j + 1;
    }
}

/* The --placement / --load section: each EP rank's physical experts (logical ids), expected
 * rows per rank from the load and the imbalance, resident expert bytes per rank with the
 * replicas, and the redundancy's memory as a WARNING line; with placement_out, the placement
 * written there (moe_placement_write: atomic) once printed. CLI_OK, or CLI_USAGE after an
 * error naming the argument (CLI_FAIL when the file cannot be written). */
static int plan_placement(moe_ctx *ctx, const moe_layer_desc *d, moe_plan_config *pc, const char *arg,
                          const char *load_path, int64_t redundant, const char *placement_out, int print)
{
    const int64_t E = d->num_experts;
    const int ep = pc->parallel.ep_size, tp = pc->parallel.tp_size;
    const char *name = arg ? arg : "contiguous";
    int64_t *load = load_path ? malloc(sizeof(int64_t) * (size_t)E) : NULL; /* [E] rows per logical expert */
    int32_t *p2l = malloc(sizeof(int32_t) * (size_t)(E * ep));              /* [P <= E * ep] */
    int32_t *rn = malloc(sizeof(int32_t) * (size_t)ep);                      /* [ep] */
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)ep);                    /* [ep] expected rows */
    moe_placement pl, file_pl;
    memset(&file_pl, 0, sizeof file_pl);
    int rc = CLI_USAGE;
    if ((load_path && !load) || !p2l || !rn || !rows) {
        cli_err(CMD, "out of memory");
        goto out;
    }
    if (load_path && !*load_path) {
        cli_err(CMD, "--load: an empty value; give the path of a load file (moe bench --ep N --load-out FILE writes one)");
        goto out;
    }
    if (load_path && moe_load_read(ctx, load_path, E, load) != MOE_OK) {
        cli_err(CMD, "--load: %s", moe_ctx_last_error(ctx));
        goto out;
    }
    if (!*name) {
        cli_err(CMD, "--placement: an empty value; give a policy (contiguous, round_robin or balanced) or the path "
                     "of a placement file");
        goto out;
    }
    moe_placement_policy pol = MOE_PLACEMENT_CONTIGUOUS;
    int is_policy = 1;
    if (!strcmp(name, "round_robin"))
        pol = MOE_PLACEMENT_ROUND_ROBIN;
    else if (!strcmp(name, "balanced"))
        pol = MOE_PLACEMENT_BALANCED;
    else if (strcmp(name, "contiguous") != 0)
        is_policy = 0;
    if (is_policy) {
        if (moe_placement_build(ctx, pol, E, ep, pol == MOE_PLACEMENT_BALANCED ? redundant : 0, load, p2l, rn, &pl) !=
            MOE_OK) {
            cli_err(CMD, "--placement %s: %s", name, moe_ctx_last_error(ctx));
            goto out;
        }
    } else {
        const moe_status rst = moe_placement_read(ctx, name, &file_pl);
        if (rst == MOE_ENOTFOUND) {
            /* no such file: perhaps a policy name mistyped */
            static const char *const policies[] = {"contiguous", "round_robin", "balanced"};
            const char *near = moe_suggest(name, strlen(name), policies, 3);
            cli_err(CMD, "--placement %s: %s; it is not a policy name either (did you mean %s?)", name,
                    moe_ctx_last_error(ctx), near ? near : "contiguous, round_robin or balanced");
            goto out;
        }
        if (rst != MOE_OK) { /* the file's own error, which names it */
            cli_err(CMD, "--placement: %s", moe_ctx_last_error(ctx));
            goto out;
        }
        if (file_pl.ep_size != ep || file_pl.num_logical_experts != E) {
            cli_err(CMD, "--placement %s: the file places %d logical experts on %d ranks, this layout has E %lld on "
                         "--ep %d",
                    name, file_pl.num_logical_experts, file_pl.ep_size, (long long)E, ep);
            goto out;
        }
        pl = file_pl;
    }
    const int64_t P = pl.num_physical_experts, R = P - E;

    /* bytes of one routed expert on one TP rank, as packed (codes + scales): the library's
     * report of EP rank 0 divided by its expert count */
    moe_rank_report r;
    pc->parallel.ep_rank = 0;
    pc->parallel.tp_rank = 0;
    if (moe_plan_report_for(ctx, d, pc, &r) != MOE_OK || r.n_experts < 1) {
        cli_err(CMD, "%s", moe_ctx_last_error(ctx));
        goto out;
    }
    const double per_expert = (double)(r.code_bytes + r.scale_bytes) / (double)r.n_experts;
    double imb = 1.0, imb_c = 1.0;
    if (load) {
        int32_t *c2l = malloc(sizeof(int32_t) * (size_t)E), *crn = malloc(sizeof(int32_t) * (size_t)ep);
        int64_t *crows = malloc(sizeof(int64_t) * (size_t)ep);
        moe_placement cp;
        moe_status st = !c2l || !crn || !crows ? MOE_ENOMEM
                        : moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, E, ep, 0, NULL, c2l, crn, &cp);
        if (st == MOE_OK)
            st = moe_placement_rank_rows(ctx, &cp, load, crows, &imb_c);
        if (st == MOE_OK)
            st = moe_placement_rank_rows(ctx, &pl, load, rows, &imb);
        free(c2l);
        free(crn);
        free(crows);
        if (st != MOE_OK) {
            cli_err(CMD, "--load %s: %s", load_path, moe_ctx_last_error(ctx));
            goto out;
        }
    }
    if (!print) { /* the check before anything is printed: no partial output on a bad argument */
        char resolved[PATH_MAX];
        if (placement_out && cli_check_output_path(CMD, "--placement-out", placement_out, resolved, sizeof resolved))
            goto out;
        rc = CLI_OK;
        goto out;
    }
    char b[32];
    printf("\nexpert placement %s: %lld physical experts = %lld logical + %lld redundant on %d EP ranks%s\n", name,
           (long long)P, (long long)E, (long long)R, ep, tp > 1 ? " (bytes per TP rank of each EP rank)" : "");
    int64_t total_rows = 0;
    if (load)
        for (int i = 0; i < ep; i++)
            total_rows += rows[i];
    printf("%5s %8s %16s %14s  %s\n", "ep", "experts", "expert bytes", load ? "rows (share)" : "", "logical experts");
    int64_t at = 0, max_n = 0;
    for (int i = 0; i < ep; i++) {
        char share[48] = "";
        if (load)
            snprintf(share, sizeof share, "%lld (%.1f%%)", (long long)rows[i],
                     total_rows ? 100.0 * (double)rows[i] / (double)total_rows : 0.0);
        printf("%5d %8d %16.0f %14s  ", i, pl.rank_num_physical[i], per_expert * pl.rank_num_physical[i], share);
        print_ranges(pl.physical_to_logical + at, pl.rank_num_physical[i]);
        printf("\n");
        at += pl.rank_num_physical[i];
        if (pl.rank_num_physical[i] > max_n)
            max_n = pl.rank_num_physical[i];
    }
    if (load)
        printf("imbalance (max rank rows / mean) from %s: %.3f with %s; contiguous: %.3f\n", load_path, imb, name,
               imb_c);
    if (R > 0) { /* the cost of redundancy, as every cost of moe plan: over all ranks, and the fullest rank's share */
        char b2[32];
        const int64_t base = (E + ep - 1) / ep; /* the most experts a rank holds without replicas */
        printf("WARNING: %lld redundant experts (replicas) add expert weights: %s over all ranks (the fullest EP rank "
               "holds %lld experts, %s more than contiguous's %lld)\n",
               (long long)R, cli_fmt_bytes(b, sizeof b, per_expert * (double)R * tp), (long long)max_n,
               cli_fmt_bytes(b2, sizeof b2, per_expert * (double)(max_n > base ? max_n - base : 0)), (long long)base);
    }
    if (placement_out) {
        if (moe_placement_write(ctx, placement_out, &pl) != MOE_OK) {
            cli_err(CMD, "--placement-out: %s", moe_ctx_last_error(ctx));
            rc = CLI_FAIL;
            goto out;
        }
        printf("placement %s written to %s (run it: mpirun -np %d moe run --ep %d --placement %s ...)\n", name,
               placement_out, ep * tp, ep, placement_out);
    }
    rc = CLI_OK;
out:
    moe_placement_clear(&file_pl);
    free(load);
    free(p2l);
    free(rn);
    free(rows);
    return rc;
}

int cli_cmd_plan(int argc, char **argv)
{
    const char *model = NULL, *ckdir = NULL, *quant = NULL, *tokens = "1,16,256,2048,32768";
    int64_t tp = 1, ep = 1, layer = -1, redundant = 0;
    int list = 0, have_layer = 0, have_redundant = 0;
    const char *placement_arg = NULL, *load_path = NULL, *placement_out = NULL;
    moe_compute compute = MOE_COMPUTE_F32;
    moe_checkpoint_options ck_opt;
    moe_checkpoint_options_init(&ck_opt);
    int have_ck_opt = 0, have_family = 0;
    const char *expert_set = NULL; /* the checkpoint's expert set read (moe_checkpoint_expert_set) */
    const cli_opt opts[] = {
        /* the layer: exactly one of an embedded model (by name) or a checkpoint folder */
        {.name = "--model", .kind = CLI_STR, .dst = &model},
        {.name = "--list-models", .kind = CLI_FLAG, .dst = &list},
        {.name = "--checkpoint", .kind = CLI_STR, .dst = &ckdir},
        /* the checkpoint's layer (any integer: the checkpoint says which are MoE layers);
         * not given: its first MoE layer */
        {.name = "--layer", .kind = CLI_I64, .dst = &layer, .lo = INT64_MIN, .hi = INT64_MAX, .seen = &have_layer},
        {.name = "--tp", .kind = CLI_I64, .dst = &tp, .lo = 1, .hi = 4096},
        {.name = "--ep", .kind = CLI_I64, .dst = &ep, .lo = 1, .hi = 4096},
        /* a policy name or a placement file, checked below */
        {.name = "--placement", .kind = CLI_STR, .dst = &placement_arg},
        {.name = "--redundant", .kind = CLI_I64, .dst = &redundant, .lo = 0, .hi = INT32_MAX, .seen = &have_redundant},
        {.name = "--load", .kind = CLI_STR, .dst = &load_path},
        {.name = "--placement-out", .kind = CLI_STR, .dst = &placement_out, .nonempty = 1},
        /* a dtype or a quantization scheme, checked below */
        {.name = "--quant", .kind = CLI_STR, .dst = &quant},
        /* a comma-separated list of token counts, parsed below */
        {.name = "--tokens", .kind = CLI_STR, .dst = &tokens},
        {.name = "--compute", .kind = CLI_CUSTOM, .dst = &compute, .parse = cli_parse_compute},
        /* how --checkpoint is read (moe_checkpoint_options) */
        {.name = "--strict", .kind = CLI_FLAG, .dst = &ck_opt.strict, .seen = &have_ck_opt},
        {.name = "--family", .kind = CLI_CUSTOM, .dst = &ck_opt.family, .parse = cli_parse_family, .seen = &have_family},
        /* the expert set (ERNIE-4.5-VL's text / vision); the library checks the name */
        {.name = "--experts", .kind = CLI_STR, .dst = &ck_opt.expert_set, .nonempty = 1, .seen = &have_ck_opt},
    };
    const int prc = cli_parse_opts(argc, argv, CMD, opts, CLI_NOPTS(opts), plan_usage);
    if (prc != CLI_GO_ON)
        return prc;
    if (list) {
        cli_model_list(stdout);
        return CLI_OK;
    }
    if (!model == !ckdir) {
        cli_err(CMD, "give exactly one of --model NAME or --checkpoint DIR (see 'moe plan --help')");
        return CLI_USAGE;
    }
    if (have_layer && !ckdir) {
        cli_err(CMD, "--layer needs --checkpoint (an embedded model is one layer)");
        return CLI_USAGE;
    }
    if (!ckdir && (have_ck_opt || have_family)) {
        cli_err(CMD, "%s needs --checkpoint (an embedded --model has no checkpoint to read)",
                have_ck_opt ? (ck_opt.strict ? "--strict" : "--experts") : "--family");
        return CLI_USAGE;
    }
    const int policy_balanced = placement_arg && !strcmp(placement_arg, "balanced");
    if (policy_balanced && !load_path) {
        cli_err(CMD, "--placement balanced needs --load FILE: the measured expert load it balances (mpirun -np N moe "
                     "bench --ep N --load-out FILE writes one)");
        return CLI_USAGE;
    }
    if (have_redundant && !policy_balanced) {
        cli_err(CMD, "--redundant needs --placement balanced (only the balanced policy places replicas; a placement "
                     "file brings its own)");
        return CLI_USAGE;
    }
    moe_quant_config qarg; /* --quant SCHEME (a moe_quant_from_name name), else unused */
    memset(&qarg, 0, sizeof qarg);
    const int qdtype = quant && (!strcmp(quant, "bf16") || !strcmp(quant, "f16") || !strcmp(quant, "f32"));
    if (quant && !qdtype && moe_quant_from_name(quant, &qarg) != MOE_OK) {
        static const char *const dtypes[] = {"bf16", "f16", "f32", "none"};
        cli_scheme_unknown(CMD, "--quant", quant, dtypes, 4, NULL);
        return CLI_USAGE;
    }
    /* token counts */
    int64_t Ts[32];
    int nT = 0;
    if (cli_parse_i64_list(CMD, "--tokens", tokens, 1, (int64_t)1 << 40, Ts, 32, &nT) != 0)
        return CLI_USAGE;

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
            moe_ctx_free(ctx);
            return cli_model_unknown(CMD, model);
        }
        /* the preset's family, routing and expert math, as moe bench runs it (a non-gated
         * activation packs two matrices per expert: the bytes below depend on it) */
        d.family = m->family;
        d.hidden_size = m->hidden_size;
        d.moe_intermediate_size = m->intermediate_size;
        d.num_experts = m->num_experts;
        d.top_k = m->top_k;
        d.renormalize = m->renormalize;
        d.routed_scaling_factor = m->routed_scaling_factor;
        d.shared_expert_intermediate_size = m->shared_intermediate_size;
        d.shared_expert_gated = m->shared_gated;
        d.weight_dtype = MOE_DTYPE_BF16;
        (void)cli_model_routing(m, &d);
    } else {
        moe_checkpoint *ck = NULL;
        if (moe_checkpoint_open_opts(ctx, ckdir, &ck_opt, &ck) != MOE_OK) {
            cli_err(CMD, "%s", moe_ctx_last_error(ctx));
            goto done;
        }
        if (!have_layer) {
            /* the first MoE layer libmoe runs (a DeepSeek-V4 hash_moe layer is refused: the next
             * one); when none runs, the first, whose refusal is then reported */
            int64_t first = -1;
            for (int64_t l = 0; l < moe_checkpoint_num_layers(ck) && layer < 0; l++) {
                if (!moe_checkpoint_is_moe_layer(ck, l))
                    continue;
                if (first < 0)
                    first = l;
                if (moe_checkpoint_layer_desc(ck, l, &d) != MOE_EUNSUPPORTED)
                    layer = l;
            }
            if (layer < 0) /* none runs: the first's refusal; none at all: layer 0's error says so */
                layer = first >= 0 ? first : 0;
        }
        moe_status st = moe_checkpoint_layer_desc(ck, layer, &d);
        expert_set = moe_checkpoint_expert_set(ck); /* static */
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
    /* Every number below is the library's (moe_plan_report_for: the weight builder's packed sizes
     * and TP slicing, the kernel table's fallbacks), one report per rank of the layout. */
    moe_plan_config pc;
    moe_plan_config_init(&pc);
    pc.compute = compute;
    moe_parallel_config *const par = &pc.parallel;
    par->ep_size = (int)ep;
    par->tp_size = (int)tp;
    moe_rank_report r0;
    moe_status rst = moe_plan_report_for(ctx, &d, &pc, &r0);
    if (rst != MOE_OK) {
        cli_err(CMD, "%s", moe_ctx_last_error(ctx));
        /* a layout no rank can pack (odd 4-bit or misaligned fp8 w8a8 TP shard): the command line's choice */
        if (rst == MOE_ESHAPE || rst == MOE_EUNSUPPORTED)
            rc = CLI_USAGE;
        goto done;
    }
    if ((placement_arg || load_path || placement_out) &&
        plan_placement(ctx, &d, &pc, placement_arg, load_path, redundant, placement_out, 0) != CLI_OK) {
        rc = CLI_USAGE;
        goto done;
    }
    const int qz = r0.quantized;
    char dtbuf[160];
    if (qz)
        snprintf(dtbuf, sizeof dtbuf, "%s (routed experts: %d-bit codes + f32 scales%s; the rest %s)", r0.experts_format,
                 r0.code_bits, quant ? "" : ", from the checkpoint", moe_dtype_name(d.weight_dtype));
    const char *dtname = qz ? dtbuf : moe_dtype_name(d.weight_dtype);

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
    if (ckdir) {
        /* the family row the checkpoint was read with (docs/families.md) and the routing it gave */
        static const char *const scoring[] = {"softmax", "sigmoid", "topk_softmax", "topk_sigmoid", "sparsemixer",
                                              "sqrtsoftplus"};
        const unsigned sc = (unsigned)d.scoring_func;
        printf("family: %s (scoring %s, renormalize %s", moe_family_name(d.family),
               sc < sizeof scoring / sizeof scoring[0] ? scoring[sc] : "?", d.renormalize ? "yes" : "no");
        if (d.renormalize && d.renormalize_p != 1.0f) /* DBRX's moe_normalize_expert_weights */
            printf(" (by the %g-norm%s)", (double)d.renormalize_p, isinf(d.renormalize_p) ? ": the max" : "");
        if (d.renormalize && d.renormalize_eps != 1e-20f) /* LFM2-MoE's 1e-6, Cohere2-MoE's 0 */
            printf(" (%s + %g)", d.renormalize_p != 1.0f ? "norm" : "sum", (double)d.renormalize_eps);
        printf(", routed_scaling_factor %g", (double)d.routed_scaling_factor);
        if (d.n_group > 1)
            printf(", groups %lld keep %lld by %s", (long long)d.n_group, (long long)d.topk_group,
                   d.group_score == MOE_GROUP_SCORE_TOP2_SUM ? "top-2 sum" : "max");
        if (d.num_identity_experts > 0) /* LongCat-Flash: the router scores E + Z */
            printf(", %lld identity experts (ids %lld..%lld: w * x)", (long long)d.num_identity_experts, (long long)E,
                   (long long)(E + d.num_identity_experts - 1));
        printf("%s%s%s%s; shared expert %s)\n", d.has_selection_bias ? ", selection bias" : "",
               d.has_router_bias ? ", router bias" : "", d.has_output_bias ? ", output bias" : "",
               d.apply_router_weight_on_input ? ", weight on the input" : "",
               Is ? (d.shared_expert_gated ? "gated" : "ungated") : "none");
        if (Is && d.shared_expert_scale != 1.0f) /* Cohere2-MoE's "average" */
            printf("shared expert scale: %g\n", (double)d.shared_expert_scale);
        /* the experts' MLP (moe.h moe_activation) with the parameters it reads */
        char act[128], sact[128];
        activation_text(d.activation, &d, d.swiglu_limit, act, sizeof act);
        printf("experts: %s%s%s%s", act, d.has_expert_bias ? ", biases" : "", d.has_output_bias ? ", output bias" : "",
               d.has_output_norm ? ", output RMSNorm" : "");
        if (Is) {
            const float slim = d.shared_swiglu_limit > 0.0f ? d.shared_swiglu_limit : d.swiglu_limit;
            activation_text(d.has_shared_activation ? d.shared_activation : d.activation, &d, slim, sact, sizeof sact);
            printf("; shared expert %s", sact);
        }
        printf("\n");
        if (expert_set) /* a modality-isolated block (ERNIE-4.5-VL): the set this layer is */
            printf("expert set: %s (the block's experts for %s tokens; the others are another layer: --experts "
                   "NAME)\n", expert_set, expert_set);
    }
    printf("ranks: tp %lld x ep %lld = %lld; kernel table %s; compute %s; options hash %016llx\n", (long long)tp,
           (long long)ep, (long long)(tp * ep), r0.kernel_table, moe_compute_name(compute),
           (unsigned long long)moe_ctx_options_hash(ctx));
    if (tp * ep > 1)
        printf("placement: the library's (moe_parallel.h \"Parallelism\"): experts split E/ep with the remainder on the first "
               "EP ranks, I (and the shared expert's I) split I/tp the same way; 'expert bytes' + 'shared bytes' is "
               "what moe_weights_expert_bytes reports on that rank once packed (mpirun -np %lld moe bench --ep %lld "
               "--tp %lld measures it)%s\n",
               (long long)(tp * ep), (long long)ep, (long long)tp, moe_mpi_available() ? "" : "; this build has no MPI");
    if (ep > 1 && placement_arg && strcmp(placement_arg, "contiguous") != 0)
        printf("placement: the table below is that contiguous split; the 'expert placement %s' section after it gives "
               "the experts and bytes of each EP rank under --placement %s\n",
               placement_arg, placement_arg);
    if (qz && tp * ep > 1)
        printf("note: quantized experts (%s): under EP each rank packs its experts, under TP its rows of gate/up and "
               "columns of down; a scale block or group cut by the shard boundary is re-expressed with a finer cell "
               "that repeats its scale (the codes are not copied)%s; 'scale bytes' are the packed f32 scales (one per output "
               "feature and cell along the input, zero points alike), included in moe_weights_expert_bytes\n",
               r0.experts_format, r0.code_bits == 4 ? "; 4-bit codes need an even I shard on every rank" : "");
    /* Per rank: EP group g holds experts [e0, e0 + ne); TP rank t holds I columns [i0, i0 + ni). */
    printf("\n%5s %5s %14s %10s %16s %14s %14s %12s %10s\n", "ep", "tp", "experts", "I shard", "expert bytes",
           "shared bytes", "scale bytes", "dup scales", "padding");
    /* 'dup scales': scale bytes beyond the cells whose first column lies in the shard (summed over the TP ranks:
     * what TP adds to the one-process scale bytes) */
    for (int64_t g = 0; g < ep; g++) {
        for (int64_t t = 0; t < tp; t++) {
            moe_rank_report r;
            par->ep_rank = (int)g;
            par->tp_rank = (int)t;
            if (moe_plan_report_for(ctx, &d, &pc, &r) != MOE_OK) {
                cli_err(CMD, "%s", moe_ctx_last_error(ctx));
                goto done;
            }
            const int64_t cell = r.w2_scale_cell, kept = r.w2_scale_cell_kept, i0 = r.i_first;
            if (qz && tp > 1 && kept != cell && kept != r.i_cols)
                printf("  cut: tp rank %lld holds I %lld..%lld, which starts inside the %lld-column scale cell "
                       "%lld..%lld: its down projection's scales are kept per %lld columns\n",
                       (long long)t, (long long)i0, (long long)(i0 + r.i_cols - 1), (long long)cell,
                       (long long)(i0 - i0 % cell), (long long)(i0 - i0 % cell + cell - 1), (long long)kept);
            char ex[32];
            snprintf(ex, sizeof ex, "%lld..%lld", (long long)r.expert_first, (long long)(r.expert_first + r.n_experts - 1));
            printf("%5lld %5lld %14s %10lld %16.0f %14.0f %14.0f %12.0f %10.0f\n", (long long)g, (long long)t, ex,
                   (long long)r.i_cols, (double)r.code_bytes, (double)r.shared_bytes, (double)r.scale_bytes,
                   (double)r.dup_scale_bytes, (double)r.padding_bytes);
        }
    }
    printf("(bytes exact) all ranks: %s of expert weights (the layer's weights%s: %s)\n",
           cli_fmt_bytes(b1, sizeof b1, (double)r0.total_bytes), qz ? ", codes without scales" : "",
           cli_fmt_bytes(b2, sizeof b2, (double)r0.layer_bytes));

    /* every cost not asked for, as the library reports them: WARNING, or INFO under
     * MOE_REPORT_SMALL_FRACTION of a rank's expert bytes */
    int warned = 0;
    for (size_t i = 0; i < r0.n_costs; i++) {
        print_cost(&r0.costs[i]);
        warned += r0.costs[i].level != MOE_LOG_INFO;
    }
    if (!r0.n_costs)
        printf("no padding, no duplicated memory, no fallback kernels\n");
    else if (!warned)
        printf("no cost of %.0f%% or more of a rank's expert bytes, no fallback kernels\n",
               100.0 * MOE_REPORT_SMALL_FRACTION);

    if (placement_arg || load_path || placement_out) {
        const int prc = plan_placement(ctx, &d, &pc, placement_arg, load_path, redundant, placement_out, 1);
        if (prc != CLI_OK) {
            rc = prc;
            goto done;
        }
    }

    /* per token */
    printf("\nper token: %.1f MFLOP (router + %lld experts%s); decode reads %s of expert weights (all ranks)\n",
           r0.flops_per_token / 1e6, (long long)K, Is ? " + shared" : "",
           cli_fmt_bytes(b1, sizeof b1, r0.decode_bytes_per_token));

    /* workspace and kernel path per T, for the largest rank shard (E local experts, I shard) */
    moe_layer_desc shard = d;
    shard.moe_intermediate_size = I / tp + (I % tp ? 1 : 0);
    if (Is)
        shard.shared_expert_intermediate_size = Is / tp + (Is % tp ? 1 : 0);
    if (qz && tp > 1) { /* the workspace does not depend on the expert weights' format */
        memset(&shard.quant, 0, sizeof shard.quant);
        shard.weight_dtype = MOE_DTYPE_BF16;
    }
    /* one rank: the layer itself, so a tuning file (MOE_TUNING_DIR) is looked up for its shape */
    moe_plan_config pc1;
    moe_plan_config_init(&pc1);
    pc1.compute = tp * ep == 1 ? compute : MOE_COMPUTE_F32;
    moe_plan *p = NULL;
    if (moe_plan_create_ex(ctx, &shard, &pc1, &p) != MOE_OK) {
        cli_err(CMD, "%s", moe_ctx_last_error(ctx));
        goto done;
    }
    const char *tdir = getenv("MOE_TUNING_DIR");
    if (moe_plan_tuning_file(p)[0]) {
        printf("\ntuning: %s (each T runs the entry of the nearest token count: column 'entry'; knobs set in the "
               "environment keep their value)\n", moe_plan_tuning_file(p));
        const char *tt = strstr(moe_plan_text(p), "tuned=");
        if (tt) /* the plan text's entries: T:chunk_size/permute/onehot_threshold/topk/lowtok_threshold */
            printf("plan text: %s\n", tt);
    } else if (tdir && *tdir) {
        char tn[1024] = "";
        moe_plan_tuning_name(p, tn, sizeof tn);
        printf("\ntuning: no file %s in %s (MOE_TUNING_DIR); the context's knobs are used\n", tn,
               tp * ep == 1 ? tdir : "(parallel layouts are not tuned)");
    }
    printf("\n%10s %14s %8s %14s %10s %7s %7s %7s  %s\n", "T", "workspace", "chunks", "rows/expert", "permute", "topk",
           "lowtok", "entry", "experts path");
    for (int i = 0; i < nT; i++) {
        moe_plan_path path;
        if (moe_plan_path_for(p, Ts[i], &path) != MOE_OK) {
            cli_err(CMD, "%s", moe_ctx_last_error(ctx));
            moe_plan_free(p);
            goto done;
        }
        const int few = strcmp(path.experts_path, "few-token streaming") == 0;
        char entry[24] = "-";
        if (path.tuned_tokens > 0)
            snprintf(entry, sizeof entry, "%lld", (long long)path.tuned_tokens);
        printf("%10lld %14s %8lld %14.2f %10s %7s %7lld %7s  %s%s\n", (long long)Ts[i],
               cli_fmt_bytes(b1, sizeof b1, (double)path.workspace_bytes), (long long)path.chunks,
               path.rows_per_expert, path.permute, path.topk, (long long)path.lowtok_threshold, entry,
               path.experts_path, few ? " (rows per expert < the lowtok threshold)" : "");
    }
    moe_plan_free(p);
    rc = CLI_OK;
done:
    moe_ctx_free(ctx);
    return rc;
}
