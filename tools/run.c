/* `moe run`: one MoE layer of a checkpoint on hidden states read from a safetensors file. */
#include "cli.h"
#include "run_input.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const CMD = "moe run";

static void run_usage(FILE *f)
{
    fputs("usage: moe run --checkpoint DIR --layer L --input IN.safetensors\n"
          "               --output OUT.safetensors [--threads N] [--compute f32|bf16]\n"
          "               [--ep N] [--tp N] [--placement FILE] [--strict] [--family NAME]\n"
          "               [--experts SET] [--sequence-length S]\n"
          "\n"
          "Runs MoE layer L of the Hugging Face checkpoint in DIR (config.json plus\n"
          "model.safetensors or shards) on the tensor `hidden_states` [T, H] (F32 or BF16) of\n"
          "IN, and writes OUT with three tensors:\n"
          "  output        [T, H] F32   the layer's output (routed sum + shared expert)\n"
          "  topk_ids      [T, K] I32   the selected experts, in top-k order\n"
          "  topk_weights  [T, K] F32   their weights (after renormalization, before\n"
          "                             routed_scaling_factor)\n"
          "OUT is written atomically, and only once everything else has succeeded. OUT may\n"
          "not be the input, one of the checkpoint's files, or an existing non-regular file\n"
          "(device, FIFO, folder); a symlink is followed and its target replaced; its folder\n"
          "must exist. SIGINT, SIGTERM or SIGHUP ends the run by that signal leaving no OUT and\n"
          "no temporary file (during the write itself the signal waits for the write to end).\n"
          "\n"
          "Options:\n"
          "  --checkpoint DIR   checkpoint folder\n"
          "  --layer L          layer index, 0 <= L < num_hidden_layers (an MoE layer)\n"
          "  --input PATH       safetensors file holding hidden_states [T, H]\n"
          "  --output PATH      safetensors file to write\n"
          "  --threads N        worker threads (default: MOE_NUM_THREADS, OMP_NUM_THREADS,\n"
          "                     else all cores)\n"
          "  --compute C        the expert GEMMs' arithmetic (moe.h moe_compute): f32 (default)\n"
          "                     or bf16, what a bf16 model computes: the activations entering\n"
          "                     the expert GEMMs rounded to bf16, f32 accumulation\n"
          "                     (the same bits on every table; a WARNING names a missing\n"
          "                     avx512_bf16); routing stays f32 (docs/numerics.md section 7)\n"
          "  --ep N             expert parallelism over N ranks, under mpirun -np N*TP: each\n"
          "                     rank loads only its experts (E/N, the first E%N ranks one\n"
          "                     more) and brings its own contiguous slice of the T tokens\n"
          "                     (T/N, the first T%N ranks one more); output bit-identical to\n"
          "                     one process\n"
          "  --placement FILE   with --ep: the expert placement file to run (docs/parallel.md:\n"
          "                     physical experts per rank, replicas allowed); each rank loads\n"
          "                     only its physical experts' weights; output bit-identical to one\n"
          "                     process (default: the contiguous split above)\n"
          "  --tp N             tensor parallelism: each rank holds I/N columns of every expert;\n"
          "                     outputs summed in rank order (within the f32 bound of one\n"
          "                     process; bit-reproducible). Under mpirun -np EP*TP, rank r is\n"
          "                     (ep_rank r / TP, tp_rank r % TP)\n"
          "  --strict           refuse (exit 1) a checkpoint with tensors under the layer's\n"
          "                     MoE block that libmoe does not read (e.g. a shared expert the\n"
          "                     family has not); without it they are named in a WARNING and\n"
          "                     ignored\n"
          "  --family NAME      read the checkpoint as family NAME (mixtral, qwen2_moe,\n"
          "                     qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, llama4, olmoe,\n"
          "                     granitemoe, qwen3_5_moe, qwen3_next) whatever config.json's\n"
          "                     architectures / model_type say; a WARNING names both and the\n"
          "                     config defaults assumed (docs/checkpoints.md)\n"
          "  --experts SET      the expert set of a block with one per token modality\n"
          "                     (ernie4_5_vl_moe: text, the default, or vision): the layer\n"
          "                     computes that set's block for every input token\n"
          "  --sequence-length S  the T tokens are T/S sequences of S (transformers' [B, S, H]\n"
          "                     batch flattened): the sequences an expert capacity counts in\n"
          "                     (switch_transformers' expert_capacity, per sequence); T must\n"
          "                     be a multiple of S, and under --ep each rank's slice too.\n"
          "                     Needed when the layer has a capacity and T exceeds it; read\n"
          "                     by no other layer. Dropped tokens get output 0, topk_ids -1\n"
          "                     and topk_weights 0; the summary line counts them\n"
          "  -h, --help         this text\n"
          "\n"
          "A one-line summary goes to stderr. With --ep / --tp every rank prints its resident\n"
          "expert bytes (stdout, in rank order) and rank 0 gathers the rows and writes OUT.\n"
          "Exit status: 0 success, 1 failure, 2 bad command line.\n",
          f);
}

/* Refuse an --output that must not be replaced: something that is not a regular file (a
 * device, FIFO or folder would be swapped for a regular file by the atomic rename), the
 * input, or one of the checkpoint's own files. A symlink to a regular file is followed:
 * the file it points to is written and the link stays. *resolved gets the path to write. */
static int check_output(const char *out_path, const char *in_path, const char *ckdir, char *resolved,
                        size_t len)
{
    struct stat so;
    if (cli_check_output_path(CMD, "--output", out_path, resolved, len) != 0)
        return -1;
    if (stat(resolved, &so) != 0)
        return 0; /* not there yet: its folder exists (checked) */
    struct stat si;
    if (stat(in_path, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        cli_err(CMD, "--output %s is the input file %s; write the output elsewhere", out_path, in_path);
        return -1;
    }
    DIR *d = opendir(ckdir);
    if (d) {
        struct dirent *de;
        char p[PATH_MAX];
        while ((de = readdir(d)) != NULL) {
            struct stat sc;
            snprintf(p, sizeof p, "%s/%s", ckdir, de->d_name);
            if (stat(p, &sc) == 0 && S_ISREG(sc.st_mode) && sc.st_dev == so.st_dev && sc.st_ino == so.st_ino) {
                cli_err(CMD, "--output %s is the checkpoint's file %s; write the output elsewhere", out_path, p);
                closedir(d);
                return -1;
            }
        }
        closedir(d);
    }
    return 0;
}

static void *alloc64(size_t bytes)
{
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0)
        n = 64;
    return aligned_alloc(64, n);
}

int cli_cmd_run(int argc, char **argv)
{
    const char *ckdir = NULL, *in_path = NULL, *out_path = NULL, *placement_path = NULL;
    int64_t layer = -1, threads = 0, ep = 1, tp = 1, seq_len = 0;
    int have_layer = 0;
    int64_t *seq_lens = NULL; /* [this rank's tokens / seq_len] with --sequence-length */
    moe_checkpoint_options ck_opt;
    moe_checkpoint_options_init(&ck_opt);
    moe_compute compute = MOE_COMPUTE_F32;

    const cli_opt opts[] = {
        /* the three paths: required (checked below), never empty */
        {.name = "--checkpoint", .kind = CLI_STR, .dst = &ckdir, .nonempty = 1},
        {.name = "--input", .kind = CLI_STR, .dst = &in_path, .nonempty = 1},
        {.name = "--output", .kind = CLI_STR, .dst = &out_path, .nonempty = 1},
        /* required too; its upper bound is the checkpoint's (the library checks it) */
        {.name = "--layer", .kind = CLI_I64, .dst = &layer, .lo = INT64_MIN, .hi = INT64_MAX, .seen = &have_layer},
        {.name = "--threads", .kind = CLI_I64, .dst = &threads, .lo = 1, .hi = 4096},
        /* ep x tp must be the number of MPI ranks (checked below) */
        {.name = "--ep", .kind = CLI_I64, .dst = &ep, .lo = 1, .hi = 4096},
        {.name = "--tp", .kind = CLI_I64, .dst = &tp, .lo = 1, .hi = 4096},
        /* a placement file (moe_placement_read), checked against --ep and the layer below */
        {.name = "--placement", .kind = CLI_STR, .dst = &placement_path, .nonempty = 1},
        /* f32 / bf16 (cli_parse_compute names the accepted values) */
        {.name = "--compute", .kind = CLI_CUSTOM, .dst = &compute, .parse = cli_parse_compute},
        /* how the checkpoint is read (moe_checkpoint_options); the family name is checked by
         * the library, which lists the families */
        {.name = "--strict", .kind = CLI_FLAG, .dst = &ck_opt.strict},
        {.name = "--family", .kind = CLI_CUSTOM, .dst = &ck_opt.family, .parse = cli_parse_family},
        /* the expert set (ERNIE-4.5-VL's text / vision); the library checks the name */
        {.name = "--experts", .kind = CLI_STR, .dst = &ck_opt.expert_set, .nonempty = 1},
        /* equal sequence lengths for an expert capacity (moe_exec_args.sequence_lengths) */
        {.name = "--sequence-length", .kind = CLI_I64, .dst = &seq_len, .lo = 1, .hi = INT64_MAX},
    };
    const int prc = cli_parse_opts(argc, argv, CMD, opts, CLI_NOPTS(opts), run_usage);
    if (prc != CLI_GO_ON)
        return prc;
    const char *missing = !ckdir ? "--checkpoint" : !have_layer ? "--layer"
                        : !in_path ? "--input" : !out_path ? "--output" : NULL;
    if (missing) {
        cli_err(CMD, "missing required option %s (see 'moe run --help')", missing);
        return CLI_USAGE;
    }
    const int nranks = (int)(ep * tp), rank = cli_mpi_rank();
    if (nranks != cli_mpi_size()) {
        cli_err(CMD, "--ep %lld x --tp %lld = %d ranks, but %d %s running: launch with mpirun -np %d", (long long)ep,
                (long long)tp, nranks, cli_mpi_size(), cli_mpi_size() == 1 ? "process is" : "are", nranks);
        return CLI_USAGE;
    }
    char out_resolved[PATH_MAX];
    if (check_output(out_path, in_path, ckdir, out_resolved, sizeof out_resolved) != 0)
        return CLI_FAIL;
    out_path = out_resolved;
    /* SIGINT / SIGTERM / SIGHUP end the run leaving no output (see the write below) */
    cli_signal_catch(1);

    int rc = CLI_FAIL;
    moe_ctx *ctx = NULL;
    moe_checkpoint *ck = NULL;
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    moe_safetensors *in = NULL;
    void *x = NULL;
    float *out = NULL, *topk_w = NULL;
    int32_t *topk_ids = NULL;
    void *ws = NULL;
    moe_placement placement;
    memset(&placement, 0, sizeof placement);

    moe_options o;
    moe_options_init(&o);
    o.num_threads = (int)threads;
    char err[1024] = "";
    moe_status st = moe_ctx_create(&o, &ctx, err, sizeof err);
    if (st != MOE_OK) {
        cli_err(CMD, "%s", err[0] ? err : moe_status_name(st));
        return CLI_FAIL;
    }

#define LIBFAIL()                                                                        \
    do {                                                                                 \
        const char *m_ = moe_ctx_last_error(ctx);                                        \
        cli_err(CMD, "%s", (m_ && m_[0]) ? m_ : moe_status_name(st));                    \
        goto done;                                                                       \
    } while (0)

    if ((st = moe_checkpoint_open_opts(ctx, ckdir, &ck_opt, &ck)) != MOE_OK)
        LIBFAIL();
    moe_layer_desc desc;
    if ((st = moe_checkpoint_layer_desc(ck, layer, &desc)) != MOE_OK)
        LIBFAIL();
    if ((st = moe_safetensors_open(ctx, in_path, &in)) != MOE_OK)
        LIBFAIL();
    moe_tensor_info ti;
    if ((st = moe_safetensors_get(in, "hidden_states", &ti)) != MOE_OK)
        LIBFAIL();
    const int64_t H = desc.hidden_size, K = desc.top_k;
    char bad[2 * PATH_MAX + 512]; /* two paths and the shapes */
    if (run_check_input(&ti, in_path, ckdir, layer, H, bad, sizeof bad) != 0) {
        cli_err(CMD, "%s", bad);
        goto done;
    }
    /* The input is valid: now the (slower) packing of the layer's weights (under --ep / --tp
     * only this rank's share: its experts, its I columns). */
    moe_plan_config pcfg;
    moe_plan_config_init(&pcfg);
    pcfg.parallel.ep_size = (int)ep;
    pcfg.parallel.tp_size = (int)tp;
    pcfg.parallel.ep_rank = -1; /* from the MPI rank: r / tp */
    pcfg.parallel.tp_rank = -1; /* r % tp */
    /* a rank that fails ends the whole job (main: MPI_Abort), so a long timeout only has to
     * cover the slowest rank's packing of a large checkpoint before the first collective */
    pcfg.parallel.timeout_s = 3600;
    pcfg.compute = compute;
    if (placement_path) {
        if ((st = moe_placement_read(ctx, placement_path, &placement)) != MOE_OK) {
            const int policy = !strcmp(placement_path, "contiguous") || !strcmp(placement_path, "round_robin") ||
                               !strcmp(placement_path, "balanced");
            if (st == MOE_ENOTFOUND && policy) { /* a policy name where moe run takes a file */
                cli_err(CMD, "--placement %s: moe run takes a placement file, not a policy name; write one with "
                             "moe plan --checkpoint %s --layer %lld --ep %lld --placement %s%s --placement-out FILE",
                        placement_path, ckdir, (long long)layer, (long long)ep, placement_path,
                        !strcmp(placement_path, "balanced") ? " --load LOAD" : "");
                rc = CLI_USAGE;
                goto done;
            }
            cli_err(CMD, "--placement: %s", moe_ctx_last_error(ctx));
            goto done;
        }
        if (placement.ep_size != ep || placement.num_logical_experts != desc.num_experts) {
            cli_err(CMD, "--placement %s: the file places %d logical experts on %d ranks, but layer %lld has %lld "
                         "experts on --ep %lld",
                    placement_path, placement.num_logical_experts, placement.ep_size, (long long)layer,
                    (long long)desc.num_experts, (long long)ep);
            rc = CLI_USAGE;
            goto done;
        }
        pcfg.parallel.placement = &placement;
    }
    if ((st = moe_plan_create_ex(ctx, &desc, &pcfg, &plan)) != MOE_OK) {
        if (st == MOE_EUNSUPPORTED && compute == MOE_COMPUTE_BF16) /* a w8a8 checkpoint */
            rc = CLI_USAGE;
        LIBFAIL();
    }
    if ((st = moe_checkpoint_load_weights(ck, layer, plan, &w)) != MOE_OK)
        LIBFAIL();
    moe_checkpoint_free(ck);
    ck = NULL;
    const moe_parallel_config *par = moe_plan_parallel(plan);
    if (nranks > 1) {
        int32_t *map = malloc(sizeof(int32_t) * (size_t)desc.num_experts);
        int64_t e0 = -1, ne = 0;
        if (map && moe_plan_expert_map(plan, map) == MOE_OK)
            for (int64_t e = 0; e < desc.num_experts; e++)
                if (map[e] >= 0) {
                    e0 = e0 < 0 ? e : e0;
                    ne++;
                }
        free(map);
        char line[256], b1[32];
        char which[64]; /* the logical experts held: a range, or how many of a placement's */
        if (placement_path)
            snprintf(which, sizeof which, "%lld experts of placement", (long long)ne);
        else
            snprintf(which, sizeof which, "experts %lld..%lld", (long long)e0, (long long)(e0 + ne - 1));
        snprintf(line, sizeof line, "moe run: rank %d (ep_rank %d, tp_rank %d): %s (%lld of %lld), "
                 "I shard %lld of %lld, resident expert bytes %zu (%s)\n", rank, par->ep_rank, par->tp_rank,
                 which, (long long)ne, (long long)desc.num_experts,
                 (long long)(desc.moe_intermediate_size / tp + (par->tp_rank < desc.moe_intermediate_size % tp)),
                 (long long)desc.moe_intermediate_size, moe_weights_expert_bytes(w),
                 cli_fmt_bytes(b1, sizeof b1, (double)moe_weights_expert_bytes(w)));
        cli_mpi_print_ordered(line);
    }

    const int64_t T = ti.shape[0];
    /* this rank's tokens: its EP rank's contiguous slice (a TP group shares it) */
    const int64_t q = T / ep, rem = T % ep, er = par->ep_rank;
    const int64_t tb = er * q + (er < rem ? er : rem), te = tb + q + (er < rem ? 1 : 0);
    const int64_t max_slice = q + (rem ? 1 : 0);
    const size_t nx = (size_t)T * (size_t)H, nk = (size_t)T * (size_t)K;
    /* A private aligned copy: the mapped data need not be aligned for its dtype. */
    x = alloc64(ti.nbytes);
    out = alloc64(nx * sizeof(float));
    topk_ids = alloc64(nk * sizeof(int32_t));
    topk_w = alloc64(nk * sizeof(float));
    size_t ws_size = moe_plan_workspace_size(plan, max_slice > 0 ? max_slice : 1);
    ws = ws_size ? alloc64(ws_size) : NULL;
    if (!x || !out || !topk_ids || !topk_w || (ws_size && !ws)) {
        char b1[32];
        cli_err(CMD, "out of memory allocating buffers for T = %lld tokens (%s of workspace)",
                (long long)T, cli_fmt_bytes(b1, sizeof b1, (double)ws_size));
        goto done;
    }
    if (ti.nbytes)
        memcpy(x, ti.data, ti.nbytes);
    memset(out, 0, nx * sizeof(float));
    memset(topk_ids, 0, nk * sizeof(int32_t));
    memset(topk_w, 0, nk * sizeof(float));

    moe_exec_args ea;
    memset(&ea, 0, sizeof ea);
    if (seq_len > 0 && desc.expert_capacity == 0 && rank == 0)
        fprintf(stderr, "moe run: WARNING: --sequence-length %lld has no effect: layer %lld (%s) has no expert "
                        "capacity\n", (long long)seq_len, (long long)layer, moe_family_name(desc.family));
    if (seq_len > 0) {
        /* every EP rank's slice checked on every rank, so all ranks fail together */
        int64_t cut = -1; /* an EP rank whose slice starts inside a sequence */
        for (int64_t r = 0; r < ep && cut < 0; r++)
            if ((r * q + (r < rem ? r : rem)) % seq_len != 0)
                cut = r;
        if (T % seq_len != 0 || cut >= 0) {
            if (T % seq_len != 0)
                cli_err(CMD, "--sequence-length %lld: T = %lld tokens of %s are not a whole number of sequences",
                        (long long)seq_len, (long long)T, in_path);
            else
                cli_err(CMD, "--sequence-length %lld: EP rank %lld's slice of the T = %lld tokens under --ep %lld "
                             "starts inside a sequence; give T a multiple of S * ep, or run without --ep",
                        (long long)seq_len, (long long)cut, (long long)T, (long long)ep);
            goto done;
        }
        const int64_t ns = (te - tb) / seq_len;
        seq_lens = malloc(sizeof(int64_t) * (size_t)(ns > 0 ? ns : 1));
        if (!seq_lens) {
            cli_err(CMD, "out of memory for %lld sequence lengths", (long long)ns);
            goto done;
        }
        for (int64_t i = 0; i < ns; i++)
            seq_lens[i] = seq_len;
        ea.sequence_lengths = ns > 0 ? seq_lens : NULL;
        ea.n_sequences = ns;
    }
    const size_t xes = moe_dtype_size(ti.dtype);
    ea.hidden_states = te > tb ? (const unsigned char *)x + (size_t)(tb * H) * xes : NULL;
    ea.hidden_dtype = ti.dtype;
    ea.n_tokens = te - tb;
    ea.router_logits = NULL;
    ea.output = te > tb ? out + tb * H : NULL;
    ea.topk_ids = te > tb ? topk_ids + tb * K : NULL;
    ea.topk_weights = te > tb ? topk_w + tb * K : NULL;
    ea.workspace = ws;
    ea.workspace_size = ws_size;
    moe_exec_stats stats;
    memset(&stats, 0, sizeof stats);
    ea.stats = &stats;
    double t0 = cli_now();
    st = moe_plan_execute_ex(plan, w, &ea);
    double ms = (cli_now() - t0) * 1e3;
    if (st != MOE_OK)
        LIBFAIL();
    if (nranks > 1) {
        /* rank 0 gathers the final rows: each TP group's rows from its tp_rank 0 (all-reduce
         * leaves every rank of the group the same rows), or under MOE_TP_REDUCE=reduce_scatter
         * each rank's own share (moe_plan_tp_rows) */
        int64_t o0 = 0, o1 = te - tb;
        moe_plan_tp_rows(plan, te - tb, &o0, &o1);
        const int scatter = tp > 1 && (o1 - o0) != (te - tb);
        const int64_t r0 = scatter ? tb + o0 : tb, nr = scatter ? o1 - o0 : par->tp_rank == 0 ? te - tb : 0;
        const int64_t k0 = tb, nk = par->tp_rank == 0 ? te - tb : 0;
        if (cli_mpi_gather_rows(out, (size_t)H * sizeof(float), r0, nr) != 0 ||
            cli_mpi_gather_rows(topk_ids, (size_t)K * sizeof(int32_t), k0, nk) != 0 ||
            cli_mpi_gather_rows(topk_w, (size_t)K * sizeof(float), k0, nk) != 0) {
            cli_err(CMD, "gathering the output rows to rank 0 failed");
            goto done;
        }
        if (rank != 0) { /* rank 0 writes OUT */
            rc = CLI_OK;
            goto done;
        }
    }

    moe_tensor_out to[3];
    memset(to, 0, sizeof to);
    to[0].name = "output";
    to[0].dtype = MOE_DTYPE_F32;
    to[0].ndim = 2;
    to[0].shape[0] = T;
    to[0].shape[1] = H;
    to[0].data = out;
    to[1].name = "topk_ids";
    to[1].dtype = MOE_DTYPE_I32;
    to[1].ndim = 2;
    to[1].shape[0] = T;
    to[1].shape[1] = K;
    to[1].data = topk_ids;
    to[2].name = "topk_weights";
    to[2].dtype = MOE_DTYPE_F32;
    to[2].ndim = 2;
    to[2].shape[0] = T;
    to[2].shape[1] = K;
    to[2].data = topk_w;
    /* IN may be the same file as OUT: the atomic rename leaves our mapping intact.
     * The library writes `part` (through its own part.tmp.XXXXXX, whose name only it knows),
     * so a signal is deferred while it writes; the handler then removes `part` and ends the
     * process by the signal. `part` is renamed onto OUT only after that point. */
    char part[PATH_MAX + 64];
    if (snprintf(part, sizeof part, "%s.part.%ld", out_path, (long)getpid()) >= (int)sizeof part ||
        cli_signal_cleanup(part) != 0) {
        cli_err(CMD, "--output %s: path too long", out_path);
        goto done;
    }
    cli_signal_defer(1);
    st = moe_safetensors_write(ctx, part, to, 3);
    cli_signal_defer(0); /* a signal caught meanwhile: part removed, the process ends here */
    if (st != MOE_OK) {
        cli_signal_cleanup(NULL);
        LIBFAIL();
    }
    if (rename(part, out_path) != 0) {
        cli_err(CMD, "--output %s: cannot rename %s into place: %s", out_path, part, strerror(errno));
        unlink(part);
        cli_signal_cleanup(NULL);
        goto done;
    }
    cli_signal_cleanup(NULL);

    /* quantized routed experts (FP8 / MXFP4 checkpoints): their scheme after the dtype */
    const int quantized = strcmp(moe_quant_name(&desc.quant), "none") != 0;
    fprintf(stderr,
            "moe run: family %s layer %lld T %lld H %lld I %lld E %lld K %lld dtype %s%s%s compute %s "
            "ms %.3f (threads %d, %s%s)\n",
            moe_family_name(desc.family), (long long)layer, (long long)T, (long long)H,
            (long long)desc.moe_intermediate_size, (long long)desc.num_experts, (long long)K,
            moe_dtype_name(desc.weight_dtype), quantized ? " experts " : "", quantized ? moe_quant_name(&desc.quant) : "",
            moe_compute_name(compute), ms, moe_ctx_num_threads(ctx), moe_ctx_isa(ctx),
            nranks > 1 ? (tp > 1 ? (ep > 1 ? ", ep x tp over MPI" : ", tp over MPI") : ", ep over MPI") : "");
    if (moe_plan_tuning_file(plan)[0]) /* MOE_TUNING_DIR: the file and the entry this T ran */
        fprintf(stderr, "moe run: tuning file %s, entry %lld (permute %s, topk %s, chunk %lld tokens)\n",
                moe_plan_tuning_file(plan), (long long)stats.tuned_tokens, stats.permute ? stats.permute : "-",
                stats.topk, (long long)stats.chunk_tokens);
    if (desc.expert_capacity > 0) { /* Switch's capacity: how many tokens it dropped */
        int64_t dropped = 0;
        for (size_t i = 0; i < nk; i++)
            dropped += topk_ids[i] == -1;
        fprintf(stderr, "moe run: expert_capacity %lld dropped %lld of %lld tokens (%s)\n",
                (long long)desc.expert_capacity, (long long)dropped, (long long)T,
                seq_len > 0 ? "sequences of --sequence-length" : "one sequence");
    }
    rc = CLI_OK;
#undef LIBFAIL
done:
    free(seq_lens);
    free(ws);
    free(topk_w);
    free(topk_ids);
    free(out);
    free(x);
    moe_safetensors_free(in);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_placement_clear(&placement);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
    return rc;
}
