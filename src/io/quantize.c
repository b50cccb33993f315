/* `moe quantize`'s writer, moe_checkpoint_quantize: the folders (the input checked, a
 * temporary output folder beside the destination, renamed into place once complete), the
 * shards (src/io/quantize_shard.c converts each), config.json's quantization_config, the index
 * and the other files. It reads the input through the public moe_checkpoint_* API: nothing
 * below it calls it. */
#include "io/fields.h"
#include "io/quantize_shard.h"
#include "quant/quant.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* malloc'd "a/b". */
static char *pjoin(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            char *p = pjoin(dir, de->d_name);
            struct stat sb;
            if (p && lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
                rm_tree(p);
            else if (p)
                unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Copy file src to dst (created, 0644). 0 or an errno value. */
static int copy_file(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return errno;
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
        int e = errno;
        close(in);
        return e;
    }
    char buf[1 << 16];
    int err = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        if (r == 0)
            break;
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                err = errno;
                break;
            }
            off += w;
        }
        if (err)
            break;
    }
    if (close(out) != 0 && !err)
        err = errno;
    close(in);
    return err;
}

/* The quantization_config written into config.json. */
static json_t *quant_config_json(const qw_job *j)
{
    const moe_qweight *qw = &j->q.w13;
    if (j->mxfp4) {
        /* transformers' Mxfp4Config as openai/gpt-oss-20b / -120b's config.json has it: the
         * released modules_to_not_convert (patterns), plus "<P>experts" of each layer left
         * out by --layers (transformers' should_convert_module matches at module boundaries) */
        json_t *keep = json_pack("[s, s, s, s]", "model.layers.*.self_attn", "model.layers.*.mlp.router",
                                 "model.embed_tokens", "lm_head");
        if (!keep || json_array_extend(keep, j->keep) != 0) {
            json_decref(keep);
            return NULL;
        }
        return json_pack("{s:o, s:s}", "modules_to_not_convert", keep, "quant_method", "mxfp4");
    }
    if (!j->ct)
        return json_pack("{s:s, s:s, s:s, s:[I,I], s:O, s:O}", "quant_method", "fp8", "fmt", "e4m3",
                         "activation_scheme", "dynamic", "weight_block_size", (json_int_t)qw->block_n,
                         (json_int_t)qw->block_k, "ignored_layers", j->ignore, "modules_to_not_convert", j->ignore);
    const int bits = qw->dtype == MOE_QTYPE_INT4 ? 4 : 8;
    const bool fp8 = qw->dtype == MOE_QTYPE_F8_E4M3; /* fp8-tensor / fp8-channel: float-quantized */
    const char *format = fp8 ? "float-quantized" : j->q.act == MOE_QACT_TOKEN ? "int-quantized" : "pack-quantized";
    const char *strategy = qw->scale == MOE_QSCALE_GROUP ? "group" : qw->scale == MOE_QSCALE_TENSOR ? "tensor" : "channel";
    json_t *w = json_pack("{s:i, s:s, s:b, s:s, s:o, s:b, s:n, s:s}", "num_bits", bits, "type", fp8 ? "float" : "int",
                          "symmetric", !qw->has_zero_point, "strategy", strategy,
                          "group_size", qw->scale == MOE_QSCALE_GROUP ? json_integer(qw->group_size) : json_null(),
                          "dynamic", 0, "actorder", "observer", "minmax");
    json_t *ia = j->q.act == MOE_QACT_TOKEN
                     ? json_pack("{s:i, s:s, s:b, s:s, s:n, s:b, s:s}", "num_bits", 8, "type", "int", "symmetric", 1,
                                 "strategy", "token", "group_size", "dynamic", 1, "observer", "memoryless")
                     : json_null();
    json_t *g0 = json_pack("{s:[s], s:o, s:o, s:n, s:s}", "targets", "Linear", "weights", w, "input_activations", ia,
                           "output_activations", "format", format);
    return json_pack("{s:s, s:s, s:s, s:{s:o}, s:O, s:n, s:n}", "quant_method", "compressed-tensors", "format", format,
                     "quantization_status", "compressed", "config_groups", "group_0", g0, "ignore", j->ignore,
                     "kv_cache_scheme", "sparsity_config");
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A file name a checkpoint folder holds (what moe quantize copies from a Hugging Face
 * checkpoint or writes): weights, configs, tokenizer files, model cards, licenses. */
static int checkpoint_file_name(const char *n)
{
    static const char *const suffixes[] = {".safetensors", ".json", ".jinja", ".model", ".tiktoken", ".py"};
    static const char *const names[] = {"vocab.txt", "merges.txt", ".gitattributes"};
    static const char *const prefixes[] = {"README", "LICENSE", "NOTICE", "USE_POLICY"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (ends_with(n, suffixes[i]))
            return 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(n, names[i]))
            return 1;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(n, prefixes[i], strlen(prefixes[i])))
            return 1;
    return 0;
}

/* 1 when the absolute path `inner` is `outer` or inside it. */
static int path_within(const char *inner, const char *outer)
{
    size_t n = strlen(outer);
    if (n == 1 && outer[0] == '/')
        return 1;
    return strncmp(inner, outer, n) == 0 && (inner[n] == '/' || inner[n] == '\0');
}

/* moe_quantize_options.force deletes out_dir (`out_abs`, an existing non-empty folder): allowed
 * only when it looks like a checkpoint libmoe could have written -- a config.json, and only
 * regular files with a checkpoint's names (checkpoint_file_name) -- and it does not hold the
 * current folder (the input is checked before). MOE_EINVAL naming the reason otherwise
 * (nothing touched). */
static moe_status force_allowed(moe_ctx *ctx, const char *out_dir, const char *out_abs)
{
    char out_real[PATH_MAX], cwd[PATH_MAX];
    if (!realpath(out_abs, out_real))
        return moe_set_error(ctx, MOE_EINVAL, "%s: force: cannot resolve it: %s; refusing to replace it", out_dir,
                             strerror(errno));
    DIR *d = opendir(out_abs);
    if (!d)
        return moe_set_error(ctx, MOE_EINVAL, "%s: force: cannot list it: %s; refusing to replace it", out_dir,
                             strerror(errno));
    char foreign[NAME_MAX + 1] = ""; /* the first (by name) entry a checkpoint does not hold */
    int config = 0;
    for (struct dirent *de = readdir(d); de; de = readdir(d)) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, ".."))
            continue;
        char p[PATH_MAX + NAME_MAX + 2];
        snprintf(p, sizeof p, "%s/%s", out_abs, n);
        struct stat fs;
        const int regular = lstat(p, &fs) == 0 && S_ISREG(fs.st_mode);
        if (regular && !strcmp(n, "config.json"))
            config = 1;
        if ((!regular || !checkpoint_file_name(n)) && (!foreign[0] || strcmp(n, foreign) < 0))
            snprintf(foreign, sizeof foreign, "%s", n);
    }
    closedir(d);
    if (getcwd(cwd, sizeof cwd) && path_within(cwd, out_real))
        return moe_set_error(ctx, MOE_EINVAL, "%s: force: it holds the current folder %s; refusing to delete it",
                             out_dir, cwd);
    if (!config)
        return moe_set_error(ctx, MOE_EINVAL, "%s: force: it does not look like a checkpoint (no config.json); "
                             "refusing to delete it (remove it yourself or choose another output)", out_dir);
    if (foreign[0])
        return moe_set_error(ctx, MOE_EINVAL, "%s: force: it holds '%s', which is not a checkpoint file (a "
                             "checkpoint holds regular files named *.safetensors, *.json, *.jinja, *.model, "
                             "*.tiktoken, *.py, vocab.txt, merges.txt, .gitattributes, README*, LICENSE*, NOTICE*, "
                             "USE_POLICY*); refusing to delete it (remove it yourself or choose another output)",
                             out_dir, foreign);
    return MOE_OK;
}

moe_status moe_checkpoint_quantize(moe_ctx *ctx, const char *in_dir, const char *out_dir,
                                   const moe_quantize_options *opt, moe_quantize_stats *stats)
{
    if (!in_dir || !out_dir || !opt || !opt->scheme)
        return moe_set_error(ctx, MOE_EINVAL, "moe_checkpoint_quantize: %s is NULL",
                             !in_dir ? "in_dir" : !out_dir ? "out_dir" : !opt ? "opt" : "opt->scheme");
    moe_quantize_stats local;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    qw_job j = {.ctx = ctx, .opt = opt, .stats = stats};
    if (moe_quant_from_name(opt->scheme, &j.q) == MOE_OK && j.q.act == MOE_QACT_STATIC)
        return moe_set_error(ctx, MOE_EINVAL,
                             "quantization scheme '%s': static FP8 activations need input scales calibrated on real "
                             "inputs, which moe_checkpoint_quantize does not compute; use fp8-tensor or fp8-channel",
                             opt->scheme);
    if (moe_quant_from_name(opt->scheme, &j.q) != MOE_OK || !moe_quant_active(&j.q))
        return moe_set_error(ctx, MOE_EINVAL,
                             "unknown quantization scheme '%s' (accepted: fp8-block, fp8-tensor, fp8-channel, int8-channel, int8-w8a8, int4-g32, "
                             "int4-g64, int4-g128, int4-g32-zp, int4-g64-zp, int4-g128-zp, mxfp4)",
                             opt->scheme);
j.mxfp4 = j.q.w13.dtype == MOE_QTYPE_MXFP4;
    /* fp8-block: the Hugging Face FP8 layout; fp8-tensor / fp8-channel: compressed-tensors
     * float-quantized (weight F8_E4M3 + weight_scale [1] / [N, 1]) */
    j.ct = !(j.q.w13.dtype == MOE_QTYPE_F8_E4M3 && j.q.w13.scale == MOE_QSCALE_BLOCK) && !j.mxfp4;
    if (j.q.w13.has_zero_point)
        moe_log(ctx, MOE_LOG_WARN,
                "scheme %s: zero points (symmetric: false) load in libmoe and compressed-tensors, but vLLM's "
                "Marlin WNA16 MoE path accepts symmetric int4 only (compressed_tensors_moe.py asserts "
                "weight_quant.symmetric); use %.*s for vLLM",
                opt->scheme, (int)(strlen(opt->scheme) - 3), opt->scheme);
    if (j.q.w13.dtype == MOE_QTYPE_F8_E4M3 && !j.ct && opt->layers && opt->n_layers > 0)
        return moe_set_error(ctx, MOE_EINVAL, "scheme fp8-block: --layers must be all (FP8 block checkpoints are loaded "
                             "with every MoE layer quantized)");

    /* paths: the input must exist; the output may not be the input, nor inside it (or hold it) */
    char in_real[PATH_MAX], out_parent_real[PATH_MAX], out_abs[PATH_MAX + 256];
    if (!realpath(in_dir, in_real))
        return moe_set_error(ctx, errno == ENOENT ? MOE_ENOTFOUND : MOE_EIO, "%s: cannot open the input checkpoint: %s",
                             in_dir, strerror(errno));
    char *dup = strdup(out_dir);
    if (!dup)
        return moe_set_error(ctx, MOE_ENOMEM, "out of memory");
    size_t ol = strlen(dup);
    while (ol > 1 && dup[ol - 1] == '/')
        dup[--ol] = '\0';
    char *slash = strrchr(dup, '/');
    const char *parent = slash ? (slash == dup ? "/" : dup) : ".";
    char leaf[NAME_MAX + 1];
    snprintf(leaf, sizeof leaf, "%s", slash ? slash + 1 : dup);
    if (slash && slash != dup)
        *slash = '\0';
    if (!strcmp(leaf, ".") || !strcmp(leaf, "..") || !realpath(parent, out_parent_real)) {
        moe_status st = moe_set_error(ctx, MOE_EINVAL, "%s: the output's parent folder must exist (and the output "
                                      "must name a folder in it)", out_dir);
        free(dup);
        return st;
    }
    snprintf(out_abs, sizeof out_abs, "%s/%s", strcmp(out_parent_real, "/") ? out_parent_real : "", leaf);
    free(dup);
    size_t il = strlen(in_real), al = strlen(out_abs);
    if ((al >= il && strncmp(out_abs, in_real, il) == 0 && (out_abs[il] == '/' || out_abs[il] == '\0')) ||
        (il > al && strncmp(in_real, out_abs, al) == 0 && in_real[al] == '/'))
        return moe_set_error(ctx, MOE_EINVAL, "%s: the output is the input checkpoint %s, inside it, or holds it",
                             out_dir, in_dir);
    struct stat sb;
    /* a symbolic link at OUT (dangling or not) would fail only at the final rename, after all
     * the work: refuse it now */
    if (lstat(out_abs, &sb) == 0 && S_ISLNK(sb.st_mode))
        return moe_set_error(ctx, MOE_EINVAL, "%s: is a symbolic link; give the folder itself (the output is "
                             "published by renaming a finished folder into place)", out_dir);
    int exists = stat(out_abs, &sb) == 0;
    if (exists) {
        int empty = 0;
        if (S_ISDIR(sb.st_mode)) {
            DIR *d = opendir(out_abs);
            empty = 1;
            struct dirent *de;
            while (d && (de = readdir(d)))
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                    empty = 0;
            if (d)
                closedir(d);
        }
        if (!S_ISDIR(sb.st_mode))
            return moe_set_error(ctx, MOE_EINVAL, "%s: exists and is not a folder", out_dir);
        if (!empty && !opt->force)
            return moe_set_error(ctx, MOE_EINVAL, "%s: exists and is not empty (force / --force replaces it when it "
                                 "looks like a checkpoint)", out_dir);
        moe_status fst;
        if (!empty && (fst = force_allowed(ctx, out_dir, out_abs)) != MOE_OK)
            return fst;
    }

    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, in_real, &ck);
    if (st != MOE_OK)
        return st;
    char *cfg_path = pjoin(in_real, "config.json"), *idx_path = pjoin(in_real, "model.safetensors.index.json");
    char tmp[PATH_MAX + 300];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp.XXXXXX", out_parent_real, leaf);
    json_t *cfg = NULL, *index = NULL, *weight_map = NULL;
    j.ignore = json_array();
    j.keep = json_array();
    bool made_tmp = false;
    if (!cfg_path || !idx_path || !j.ignore || !j.keep) {
        st = moe_set_error(ctx, MOE_ENOMEM, "out of memory");
        goto out;
    }
    /* read again as moe_checkpoint_open did: a regular file, within its size limit */
    if ((st = moe_json_load_object(ctx, cfg_path, MOE_CONFIG_MAX_BYTES, "(MOE_CONFIG_MAX_BYTES)", &cfg)) != MOE_OK)
        goto out;
    const json_t *have_qc = json_object_get(cfg, "quantization_config");
    if (have_qc && !json_is_null(have_qc)) {
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: the checkpoint is already quantized (quantization_config is "
                           "set); quantize a bf16 / f32 checkpoint", cfg_path);
        goto out;
    }
    /* what the family's row stores its experts as decides what can be written */
    const moe_family fam = moe_checkpoint_family(ck);
    j.row = moe_fam_row_of(fam);
    const bool writes_mxfp4 = j.row && j.row->mxfp4.gate_up_blocks;
    char fams[256]; /* [256] chars: the names of the rows a refusal below applies to */
    if (j.row && j.row->input_major.gate_up_bias && !writes_mxfp4) {
        /* input-major experts with biases and no MXFP4 layout (openai_privacy_filter): the
         * per-expert quantized formats have no place for the gate_up / down biases */
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: %s's experts have biases (%s, %s): no quantized checkpoint "
                           "format libmoe writes carries them; moe quantize writes %s and the per-expert layout",
                           in_dir, j.row->name, j.row->input_major.gate_up_bias,
                           j.row->input_major.down_bias ? j.row->input_major.down_bias : "?",
                           moe_fam_names_with(MOE_FAM_QUANTIZE_INPUT_MAJOR, ", ", false, fams, sizeof fams));
        goto out;
    }
    if (j.row && !j.row->per_expert.proj[1] && !moe_fam_quantize_input_major(j.row)) {
        /* the layout read without per_expert is the row's input-major one, else its last
         * stacked one (families.h) */
        const moe_fam_stacked *sk = &j.row->stacked[0];
        for (int i = 1; i < MOE_FAM_MAX_STACKED && j.row->stacked[i].gate_up; i++)
            sk = &j.row->stacked[i];
        const bool im = j.row->input_major.gate_up != NULL;
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: %s stores its experts %s (%s / %s); "
                           "moe quantize writes %s and the per-expert layout (experts.<e>.<proj>.weight) only",
                           in_dir, j.row->name, im ? "input-major" : "stacked",
                           im ? j.row->input_major.gate_up : sk->gate_up ? sk->gate_up : "?",
                           im ? j.row->input_major.down : sk->down ? sk->down : "?",
                           moe_fam_names_with(MOE_FAM_QUANTIZE_INPUT_MAJOR, ", ", false, fams, sizeof fams));
        goto out;
    }
    if (j.row && j.row->float_only) {
        /* ERNIE-4.5-VL: libmoe reads no quantized checkpoint of the family, so writes none */
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: family %s: moe quantize does not write it, as libmoe does not "
                           "read it quantized (%s); run the f32 / bf16 checkpoint with a quantized plan "
                           "(moe_layer_desc.quant) instead", in_dir, j.row->name, j.row->float_only);
        goto out;
    }
    if (j.row && j.row->activation.rule == MOE_FAM_ACT_NONGATED) {
        /* src/io reads quantized checkpoints with a gate projection per expert only */
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: %s's experts are non-gated (up_proj, down_proj; no gate_proj): "
                           "moe quantize does not write them and libmoe does not read quantized non-gated "
                           "checkpoints; run the f32 / bf16 checkpoint with a quantized plan (moe_layer_desc.quant) "
                           "instead", in_dir, j.row->name);
        goto out;
    }
    if (writes_mxfp4 && !j.mxfp4) {
        /* a row with an MXFP4 layout (gpt-oss: one fused expert module with biases, no
         * per-expert Linear that compressed-tensors or the HF FP8 format could target) is read
         * as its stacked bf16 or its MXFP4 tensors only */
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: %s experts are written as MXFP4 only (--quant mxfp4, the "
                           "layout of its released checkpoints: %s / %s); scheme '%s' has no %s checkpoint "
                           "format%s that libmoe or transformers load", in_dir, j.row->name,
                           j.row->mxfp4.gate_up_blocks, j.row->mxfp4.gate_up_scales ? j.row->mxfp4.gate_up_scales : "?",
                           opt->scheme, j.row->name, j.row->input_major.gate_up_bias ? " with expert biases" : "");
        goto out;
    }
    if (!writes_mxfp4 && j.mxfp4) {
        moe_fam_names_with(MOE_FAM_HAS_MXFP4, ", ", false, fams, sizeof fams);
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: scheme 'mxfp4' is written for %s only (its released "
                           "*_blocks / *_scales layout; transformers and libmoe read MXFP4 checkpoints for %s "
                           "only); for %s use int4-g32 (compressed-tensors, vLLM-loadable)", in_dir, fams, fams,
                           moe_family_name(fam));
        goto out;
    }
    for (size_t i = 0; i < opt->n_layers && opt->layers; i++)
        if (opt->layers[i] < 0 || opt->layers[i] >= moe_checkpoint_num_layers(ck) ||
            !moe_checkpoint_is_moe_layer(ck, opt->layers[i])) {
            /* the checkpoint's own message: the valid range and the MoE layers to ask for */
            moe_layer_desc unused;
            char why[MOE_ERRMSG_LEN / 2] = "not quantizable"; /* a copy: the message is formatted into the same buffer */
            if (moe_checkpoint_layer_desc(ck, opt->layers[i], &unused) != MOE_OK)
                snprintf(why, sizeof why, "%s", moe_ctx_last_error(ctx));
            st = moe_set_error(ctx, MOE_ERANGE, "layer %" PRId64 " is not an MoE layer of %s: %s", opt->layers[i],
                               in_dir, why);
            goto out;
        }
    {
        /* a run killed outright (SIGKILL, power loss) cannot remove its temporary folder: name
         * any that are there (not removed: another run may be writing one now) */
        DIR *pd = opendir(out_parent_real);
        char pre[NAME_MAX + 16];
        snprintf(pre, sizeof pre, ".%s.tmp.", leaf);
        for (struct dirent *de = pd ? readdir(pd) : NULL; de; de = readdir(pd))
            if (strncmp(de->d_name, pre, strlen(pre)) == 0)
                moe_log(ctx, MOE_LOG_WARN, "%s/%s: a temporary folder of an earlier moe quantize of %s that did not "
                        "finish (killed?); remove it if no other run is writing it", out_parent_real, de->d_name,
                        out_dir);
        if (pd)
            closedir(pd);
    }
    if (!mkdtemp(tmp)) {
        st = moe_set_error(ctx, MOE_EIO, "%s: cannot create a temporary folder: %s", tmp, strerror(errno));
        goto out;
    }
    made_tmp = true;
    {
        /* mkdtemp makes the folder 0700; the published checkpoint gets the mode mkdir would give
         * (0777 less the umask), so other users (e.g. a serving process) can read it */
        const mode_t um = umask(0);
        umask(um);
        if (chmod(tmp, 0777 & ~um) != 0) {
            st = moe_set_error(ctx, MOE_EIO, "%s: cannot set the folder's mode: %s", tmp, strerror(errno));
            goto out;
        }
    }
    const bool sharded = access(idx_path, F_OK) == 0;
    if (sharded) {
        if ((st = moe_json_load_object(ctx, idx_path, MOE_INDEX_MAX_BYTES, "(MOE_INDEX_MAX_BYTES)", &index)) != MOE_OK)
            goto out;
        const json_t *wm = json_object_get(index, "weight_map");
        if (!wm || !json_is_object(wm)) {
            st = moe_set_error(ctx, MOE_EFORMAT, "%s: no weight_map object", idx_path);
            goto out;
        }
        weight_map = json_object();
        /* the distinct shards, in order of first appearance */
        json_t *done = json_object();
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)wm, k, v) {
            const char *sh = json_string_value(v);
            if (!sh || json_object_get(done, sh))
                continue;
            json_object_set_new(done, sh, json_true());
            char *ip = pjoin(in_real, sh), *op = pjoin(tmp, sh);
            st = ip && op ? moe_qw_convert_shard(&j, ck, ip, op, sh, weight_map) : moe_set_error(ctx, MOE_ENOMEM, "oom");
            free(ip), free(op);
            if (st != MOE_OK)
                break;
            stats->shards++;
        }
        json_decref(done);
        if (st != MOE_OK)
            goto out;
    } else {
        char *ip = pjoin(in_real, "model.safetensors"), *op = pjoin(tmp, "model.safetensors");
        st = ip && op ? moe_qw_convert_shard(&j, ck, ip, op, "model.safetensors", NULL) : moe_set_error(ctx, MOE_ENOMEM, "oom");
        free(ip), free(op);
        if (st != MOE_OK)
            goto out;
        stats->shards = 1;
    }
    if (stats->expert_tensors == 0) {
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: no expert weights in the selected MoE layers "
                           "(<prefix>experts.<e>.<proj>.weight, or %s's experts.gate_up_proj and "
                           "down_proj): other stacked expert layouts are not written", in_dir,
                           moe_fam_names_with(MOE_FAM_QUANTIZE_INPUT_MAJOR, " / ", false, fams, sizeof fams));
        goto out;
    }
    /* config.json with quantization_config; the index with the new names */
    json_t *qc = quant_config_json(&j);
    if (!qc || json_object_set_new(cfg, "quantization_config", qc) != 0) {
        st = moe_set_error(ctx, MOE_ENOMEM, "out of memory");
        goto out;
    }
    char *p = pjoin(tmp, "config.json");
    if (!p || json_dump_file(cfg, p, JSON_INDENT(2)) != 0)
        st = moe_set_error(ctx, MOE_EIO, "%s: cannot write", p ? p : "config.json");
    free(p);
    if (st == MOE_OK && sharded) {
        uint64_t total = 0;
        DIR *d = opendir(tmp);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            size_t n = strlen(de->d_name);
            char *fp = pjoin(tmp, de->d_name);
            struct stat fs;
            if (fp && n > 12 && !strcmp(de->d_name + n - 12, ".safetensors") && stat(fp, &fs) == 0)
                total += (uint64_t)fs.st_size;
            free(fp);
        }
        if (d)
            closedir(d);
        json_t *meta = json_object_get(index, "metadata");
        if (!meta || !json_is_object(meta)) {
            meta = json_object();
            json_object_set_new(index, "metadata", meta);
        }
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set(index, "weight_map", weight_map);
        p = pjoin(tmp, "model.safetensors.index.json");
        if (!p || json_dump_file(index, p, JSON_INDENT(2)) != 0)
            st = moe_set_error(ctx, MOE_EIO, "%s: cannot write", p ? p : "index");
        free(p);
    }
    /* every other regular file (tokenizer, generation_config, ...) as it is */
    DIR *d = st == MOE_OK ? opendir(in_real) : NULL;
    struct dirent *de;
    while (d && st == MOE_OK && (de = readdir(d))) {
        const char *n = de->d_name;
        size_t nl = strlen(n);
        (void)nl;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "config.json") ||
            !strcmp(n, "model.safetensors.index.json"))
            continue;
        char *ip = pjoin(in_real, n), *op = pjoin(tmp, n);
        struct stat fs;
        if (ip && op && stat(ip, &fs) == 0 && S_ISREG(fs.st_mode)) {
            int e = access(op, F_OK) == 0 ? 0 : copy_file(ip, op);
            if (e)
                st = moe_set_error(ctx, MOE_EIO, "%s: cannot copy to %s: %s", ip, op, strerror(e));
            else
                stats->copied_files++;
        } else if (ip && stat(ip, &fs) == 0 && S_ISDIR(fs.st_mode)) {
            moe_log(ctx, MOE_LOG_WARN, "%s: a folder, not copied into the quantized checkpoint", ip);
        }
        free(ip), free(op);
    }
    if (d)
        closedir(d);
    if (st != MOE_OK)
        goto out;
    /* publish: the finished folder replaces out_dir in one rename (the old one, with --force,
     * moved aside first and removed after) */
    char old[PATH_MAX + 300] = "";
    if (exists) {
        snprintf(old, sizeof old, "%s/.%s.old.XXXXXX", out_parent_real, leaf);
        if (!mkdtemp(old) || rename(out_abs, old) != 0) {
            st = moe_set_error(ctx, MOE_EIO, "%s: cannot move the existing output aside: %s", out_dir, strerror(errno));
            if (old[0])
                rmdir(old);
            goto out;
        }
    }
    if (rename(tmp, out_abs) != 0) {
        st = moe_set_error(ctx, MOE_EIO, "%s: cannot rename %s into place: %s", out_dir, tmp, strerror(errno));
        if (exists)
            (void)rename(old, out_abs);
        goto out;
    }
    made_tmp = false;
    if (exists)
        rm_tree(old);
    moe_qw_progress(&j, "wrote %s: %s, %" PRId64 " expert tensors in %d shard(s)", out_dir, opt->scheme, stats->expert_tensors,
             stats->shards);
out:
    if (made_tmp)
        rm_tree(tmp);
    json_decref(cfg);
    json_decref(index);
    json_decref(weight_map);
    json_decref(j.ignore);
    json_decref(j.keep);
    free(cfg_path);
    free(idx_path);
    moe_checkpoint_free(ck);
    return st;
}
