/* Hugging Face checkpoints: config.json + model.safetensors (or shards listed in
 * model.safetensors.index.json), for every family of the family table (src/io/families.c).
 * This file is the orchestration; the concerns are below it:
 *   src/io/config.c     config.json, read through the family's row (fields.c: the readers)
 *   src/io/index.c      the safetensors files and tensor lookup by name
 *   src/io/layouts.c    the routed experts in each layout (tensors.c: the checked lookups)
 *   src/io/shared.c     the shared expert
 *   src/io/ckpt_ct.c    compressed-tensors experts, reached through the index's lookup
 * docs/checkpoints.md is the format reference. Per layer L the MoE block sits under a prefix
 * P, the first of the row's candidates that holds one of the row's router names; the router
 * biases the row names follow, then the experts and the shared expert. Every tensor found
 * while a layer is resolved is recorded; those under P that were not are named afterwards
 * (check_unread: a WARNING, or MOE_EFORMAT under moe_checkpoint_options.strict). */
#include "io/layouts.h"
#include "io/shared.h"
#include "quant/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct moe_checkpoint {
    moe_ctx *ctx;               /* borrowed */
    char *dir;
    char *config_path;          /* dir/config.json */
    moe_ck_config cfg;          /* config.json through the family's row */
    moe_ck_index ix;            /* the safetensors files */
    int strict;                 /* moe_checkpoint_options.strict */
    atomic_uchar *checked;      /* [num_layers] 1 once layer l's unread tensors were reported
                                   (or there were none): each WARNING is given once */
};

void moe_checkpoint_options_init(moe_checkpoint_options *opt)
{
    if (opt)
        memset(opt, 0, sizeof *opt);
}

void moe_checkpoint_free(moe_checkpoint *ck)
{
    if (!ck)
        return;
    moe_ck_index_free(&ck->ix);
    moe_ck_config_free(&ck->cfg);
    free(ck->checked);
    free(ck->config_path);
    free(ck->dir);
    free(ck);
}

moe_status moe_checkpoint_open(moe_ctx *ctx, const char *dir, moe_checkpoint **out)
{
    return moe_checkpoint_open_opts(ctx, dir, NULL, out);
}

moe_status moe_checkpoint_open_opts(moe_ctx *ctx, const char *dir, const moe_checkpoint_options *opt,
                                    moe_checkpoint **out)
{
    if (!out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_checkpoint_open: out is NULL");
    *out = NULL;
    if (!dir)
        return moe_set_error(ctx, MOE_EINVAL, "moe_checkpoint_open: dir is NULL");
    struct stat dst;
    if (stat(dir, &dst) != 0)
        return moe_set_error(ctx, MOE_ENOTFOUND, "%s: checkpoint folder does not exist (%s)", dir, strerror(errno));
    if (!S_ISDIR(dst.st_mode))
        return moe_set_error(ctx, MOE_EINVAL, "%s: not a folder (a checkpoint is a folder with config.json)", dir);

    moe_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    ck->ctx = ctx;
    ck->dir = strdup(dir);
    ck->config_path = moe_io_path_join(dir, "config.json");
    if (!ck->dir || !ck->config_path) {
        moe_checkpoint_free(ck);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    }

    json_t *cfg = NULL;
    moe_status st = moe_json_load_object(ctx, ck->config_path, MOE_CONFIG_MAX_BYTES, "(MOE_CONFIG_MAX_BYTES)", &cfg);
    if (st == MOE_OK) {
        st = moe_ck_config_parse(ctx, ck->config_path, cfg, opt ? opt->family : NULL, opt ? opt->expert_set : NULL,
                                 &ck->cfg);
        json_decref(cfg);
    }
    if (st == MOE_OK)
        st = moe_ck_index_open(ctx, ck->dir, &ck->ix);
    if (st == MOE_OK) {
        ck->strict = opt ? opt->strict : 0;
        ck->checked = calloc((size_t)ck->cfg.num_layers, sizeof *ck->checked); /* [num_layers] */
        if (!ck->checked)
            st = moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    }
    if (st != MOE_OK) {
        moe_checkpoint_free(ck);
        return st;
    }
    const moe_layer_desc *d = &ck->cfg.desc;
    moe_log(ctx, MOE_LOG_INFO,
            "%s: %s, %" PRId64 " layers, H=%" PRId64 " I=%" PRId64 " E=%" PRId64 " K=%" PRId64
            ", %zu safetensors file(s)",
            dir, moe_family_name(d->family), ck->cfg.num_layers, d->hidden_size, d->moe_intermediate_size,
            d->num_experts, d->top_k, ck->ix.n_files);
    *out = ck;
    return MOE_OK;
}

moe_family moe_checkpoint_family(const moe_checkpoint *ck)
{
    return ck ? ck->cfg.desc.family : MOE_FAMILY_CUSTOM;
}

const char *moe_checkpoint_expert_set(const moe_checkpoint *ck)
{
    return ck && ck->cfg.set ? ck->cfg.set->name : NULL;
}

int64_t moe_checkpoint_num_layers(const moe_checkpoint *ck)
{
    return ck ? ck->cfg.num_layers : 0;
}

int moe_checkpoint_is_moe_layer(const moe_checkpoint *ck, int64_t layer)
{
    return ck ? moe_ck_config_is_moe_layer(&ck->cfg, layer) : 0;
}

/* "l0, l1, ..., last" (the first eight and the last) of ck's MoE layers into list; returns
 * how many there are. */
static size_t moe_layer_list(const moe_checkpoint *ck, char *list, size_t len)
{
    size_t used = 0, shown = 0, total = 0;
    int64_t last = -1;
    list[0] = '\0';
    for (int64_t l = 0; l < ck->cfg.num_layers; l++) {
        if (!moe_checkpoint_is_moe_layer(ck, l))
            continue;
        total++;
        last = l;
        if (shown < 8 && used < len) {
            used += (size_t)snprintf(list + used, len - used, "%s%" PRId64, shown ? ", " : "", l);
            shown++;
        }
    }
    if (total > shown && used < len)
        snprintf(list + used, len - used, total > shown + 1 ? ", ..., %" PRId64 : ", %" PRId64, last);
    return total;
}

/* MOE_ERANGE for a layer outside [0, L), MOE_EDENSE (with the reason) for a dense one; both
 * name the MoE layers the user can ask for instead. */
static moe_status check_layer_index(const moe_checkpoint *ck, int64_t layer)
{
    const int64_t L = ck->cfg.num_layers;
    if (layer >= 0 && layer < L && moe_checkpoint_is_moe_layer(ck, layer)) {
        if (!moe_ck_config_layer_refused(&ck->cfg, layer))
            return MOE_OK;
        const moe_fam_row *row = ck->cfg.row;
        int64_t first = -1; /* the first MoE layer libmoe routes */
        for (int64_t l = 0; l < L && first < 0; l++)
            if (moe_checkpoint_is_moe_layer(ck, l) && !moe_ck_config_layer_refused(&ck->cfg, l))
                first = l;
        char alt[96];
        if (first >= 0)
            snprintf(alt, sizeof alt, "; layer %" PRId64 " is the first whose experts the router scores", first);
        else
            snprintf(alt, sizeof alt, "; no layer of this model is score-routed");
        return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                             "%s: layer %" PRId64 ": field '%s%s'[%" PRId64 "] = \"%s\": %s%s",
                             ck->config_path, layer, ck->cfg.prefix, row->refuse_layers.field, layer,
                             row->refuse_layers.value, row->refuse_layers.what, alt);
    }
    char list[160];
    const size_t total = moe_layer_list(ck, list, sizeof list);
    char moe_layers[200];
    if (total == 0)
        snprintf(moe_layers, sizeof moe_layers, "the model has no MoE layers");
    else if (total == (size_t)L)
        snprintf(moe_layers, sizeof moe_layers, "MoE layers: 0..%" PRId64 " (all %" PRId64 ")", L - 1, L);
    else
        snprintf(moe_layers, sizeof moe_layers, "MoE layers (%zu): %s", total, list);
    /* outside [0, L) is MOE_ERANGE whatever the layers are (the header's contract) */
    if (layer < 0 || layer >= L)
        return moe_set_error(ck->ctx, MOE_ERANGE,
                             "%s: layer %" PRId64 " out of range: num_hidden_layers is %" PRId64
                             ", valid layers are 0..%" PRId64 "; %s",
                             ck->config_path, layer, L, L - 1, moe_layers);
    char why[200];
    moe_ck_config_dense_reason(&ck->cfg, layer, why, sizeof why);
    if (total == 0)
        return moe_set_error(ck->ctx, MOE_EDENSE,
                             "%s: the model has no MoE layers (all %" PRId64 " are dense MLP layers; layer %" PRId64
                             ": %s)",
                             ck->config_path, L, layer, why);
    return moe_set_error(ck->ctx, MOE_EDENSE, "%s: layer %" PRId64 " is a dense MLP layer, not an MoE layer: %s; %s",
                         ck->config_path, layer, why, moe_layers);
}

/* Find the MoE block of `layer`: its prefix (the first of the row's candidates holding one of
 * the row's routers) and the router's name. When none holds one, the first candidate and
 * router name (moe_ck_get then reports the missing tensor). */
static void find_block(const moe_checkpoint *ck, int64_t layer, char prefix[MOE_CK_PREFIX_LEN],
                       char router_name[MOE_CK_NAME_LEN])
{
    const moe_fam_row *row = ck->cfg.row;
    /* an expert set's own router (ERNIE-4.5-VL's gate.weight / gate.weight_1), else the row's */
    const char *const set_router[MOE_FAM_MAX_ROUTERS] = {ck->cfg.set ? ck->cfg.set->router : NULL};
    const char *const *routers = ck->cfg.set ? set_router : row->router;
    char cand[MOE_CK_PREFIX_LEN];
    for (int p = 0; moe_fam_prefix(row, p, layer, cand, sizeof cand); p++) {
        for (int i = 0; i < MOE_FAM_MAX_ROUTERS && routers[i]; i++) {
            int len = snprintf(router_name, MOE_CK_NAME_LEN, "%s%s", cand, routers[i]);
            if (len > 0 && len < MOE_CK_NAME_LEN && moe_ck_has(&ck->ix, router_name)) {
                memcpy(prefix, cand, MOE_CK_PREFIX_LEN);
                return;
            }
        }
    }
    moe_fam_prefix(row, 0, layer, prefix, MOE_CK_PREFIX_LEN);
    snprintf(router_name, MOE_CK_NAME_LEN, "%s%s", prefix, routers[0]);
}

/* The router saved [H, E] (an expert set's router_transposed) as the [E, H] copy lt->router_t,
 * made once per load; lt->router then describes the copy. */
static moe_status router_transpose(const moe_ck_index *ix, moe_ck_layer *lt, int64_t layer)
{
    const int64_t H = lt->router.shape[0], E = lt->router.shape[1];
    const size_t es = moe_dtype_size(lt->router.dtype);
    unsigned char *t = malloc((size_t)(H * E) * es); /* [E, H] */
    if (!t)
        return moe_set_error(ix->ctx, MOE_ENOMEM, "%s: layer %" PRId64 ": out of memory transposing the router",
                             ix->dir, layer);
    const unsigned char *src = lt->router.data; /* [H, E] */
    for (int64_t h = 0; h < H; h++)
        for (int64_t e = 0; e < E; e++)
            memcpy(t + (size_t)(e * H + h) * es, src + (size_t)(h * E + e) * es, es);
    lt->router_t = t;
    lt->router.data = t;
    lt->router.shape[0] = E;
    lt->router.shape[1] = H;
    return MOE_OK;
}

/* Resolve MoE layer `layer` for experts [e_lo, e_hi): find every tensor the row names, check
 * dtypes and shapes against config.json, and fill lt (free with moe_ck_layer_free, also on
 * error). describe != 0 (moe_checkpoint_layer_desc): every tensor is validated but quantized
 * codes are not converted (compressed-tensors) nor shared experts dequantized. seen (or NULL)
 * gets the name of every tensor found; prefix the block prefix. */
static moe_status resolve_layer(const moe_checkpoint *ck, int64_t layer, moe_ck_layer *lt, int64_t e_lo, int64_t e_hi,
                                int describe, moe_ck_seen *seen, char prefix[MOE_CK_PREFIX_LEN])
{
    const moe_ck_config *c = &ck->cfg;
    moe_ck_index ix_rec = ck->ix; /* a copy whose lookups record into seen */
    ix_rec.seen = seen;
    const moe_ck_index *ix = &ix_rec;
    const moe_fam_row *row = c->row;
    const int64_t E = c->desc.num_experts, H = c->desc.hidden_size;
    memset(lt, 0, sizeof *lt);
    lt->e_lo = e_lo < 0 ? 0 : e_lo;
    lt->e_hi = e_hi > E ? E : e_hi;
    moe_status st = check_layer_index(ck, layer);
    if (st != MOE_OK)
        return st;

    char name[MOE_CK_NAME_LEN];
    const char *path = NULL;
    const int64_t R = E + c->desc.num_identity_experts; /* the router's rows: E + Z identity experts */
    const bool transposed = c->set && c->set->router_transposed; /* saved [H, E] (ERNIE-4.5-VL) */
    const int64_t router_shape[2] = {transposed ? H : R, transposed ? R : H};
    find_block(ck, layer, prefix, name);
    if ((st = moe_ck_get_checked(ix, name, "the router", MOE_CK_ANY_FLOAT,
                                 transposed ? "[H, E] (saved transposed)" : R > E ? "[E + Z, H]" : "[E, H]", 2,
                                 router_shape, &lt->router, &path)) != MOE_OK)
        return st;
    if (transposed && !describe && (st = router_transpose(ix, lt, layer)) != MOE_OK)
        return st;
    /* the selection bias only when the config turns it on (LFM2-MoE's use_expert_bias) */
    const char *const bias[2] = {row->router_bias, c->desc.has_selection_bias ? row->selection_bias : NULL};
    moe_tensor_info *bias_info[2] = {&lt->router_bias, &lt->sel_bias};
    for (int b = 0; b < 2; b++) {
        if (!bias[b])
            continue;
        if (!moe_fam_tensor_name(bias[b], prefix, layer, name, sizeof name))
            return moe_set_error(ck->ctx, MOE_EINVAL, "layer %" PRId64 ": tensor name %s%s too long", layer, prefix,
                                 bias[b]);
        if ((st = moe_ck_get_checked(ix, name, "a bias", MOE_CK_ANY_FLOAT, NULL, 0, NULL, bias_info[b], &path)) != MOE_OK)
            return st;
        const int64_t one_by_e[2] = {1, R};
        const int64_t set_row = b == 1 && c->set ? c->set->selection_bias_row : -1;
        if (set_row >= 0) {
            /* one row per expert set, [n_sets, E] (ERNIE-4.5-VL's moe_statics [2, E]): the set's */
            const int64_t sets_by_e[2] = {moe_fam_num_expert_sets(row), R};
            if ((st = moe_ck_check_shape(ix, path, bias_info[b], "[expert sets, E]", 2, sets_by_e)) != MOE_OK)
                return st;
            bias_info[b]->data = (const char *)bias_info[b]->data +
                                 (size_t)(set_row * R) * moe_dtype_size(bias_info[b]->dtype);
            bias_info[b]->nbytes = (size_t)R * moe_dtype_size(bias_info[b]->dtype);
            bias_info[b]->ndim = 1;
            bias_info[b]->shape[0] = R;
            bias_info[b]->shape[1] = 0;
        } else if (bias_info[b]->ndim == 2 && bias_info[b]->shape[0] == 1) { /* [1, E] (ERNIE-4.5's moe_statics): as [E] */
            if ((st = moe_ck_check_shape(ix, path, bias_info[b], "[1, E]", 2, one_by_e)) != MOE_OK)
                return st;
            bias_info[b]->ndim = 1;
            bias_info[b]->shape[0] = R;
            bias_info[b]->shape[1] = 0;
        } else if ((st = moe_ck_check_shape(ix, path, bias_info[b], R > E ? "[E + Z]" : "[E]", 1, &R)) != MOE_OK) {
            return st;
        }
    }
    if (row->output_bias) {
        snprintf(name, sizeof name, "%s%s", prefix, row->output_bias);
        if ((st = moe_ck_get_checked(ix, name, "the output bias", MOE_CK_ANY_FLOAT, "[H]", 1, &H, &lt->out_bias,
                                     &path)) != MOE_OK)
            return st;
    }
    if (row->output_norm) { /* A.X-K1: beside the block, model.layers.L.post_mlp_layernorm.weight */
        if (!moe_fam_tensor_name(row->output_norm, prefix, layer, name, sizeof name))
            return moe_set_error(ix->ctx, MOE_EINVAL, "%s: layer %" PRId64 ": the output norm's name is too long",
                                 ix->dir, layer);
        if ((st = moe_ck_get_checked(ix, name, "the output norm", MOE_CK_ANY_FLOAT, "[H]", 1, &H, &lt->out_norm,
                                     &path)) != MOE_OK)
            return st;
    }
    if ((st = moe_ck_experts_resolve(ix, c, layer, prefix, describe, lt)) != MOE_OK)
        return st;
    if (c->desc.shared_expert_intermediate_size > 0 &&
        (st = moe_ck_shared_resolve(ix, c, layer, prefix, describe, lt)) != MOE_OK)
        return st;
    if ((c->fp8 || lt->mxfp4 || lt->ckq) && !lt->have_weight_dtype) {
        /* FP8 / MXFP4 / compressed-tensors routed experts and no shared expert: weight_dtype
         * (which then types nothing but the description) follows the router */
        lt->have_weight_dtype = true;
        lt->weight_dtype = lt->router.dtype;
    }
    return MOE_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The tensors under a block prefix that a resolve did not read. */
typedef struct unread_list {
    const moe_ck_seen *seen;    /* sorted */
    size_t count;               /* unread tensors */
    size_t shown;               /* of them, named in `names` */
    char names[640];            /* [640] chars: "a, b, c" (the first few) */
    size_t used;
    bool shared;                /* one looks like a shared expert ("shared_expert") */
    const char *prefix;         /* the block prefix */
    int64_t E, R;               /* identity experts' slots [E, R): their stored tensors are
                                   expected unread (LongCat-Flash's gate_up_proj [E + Z, 2I, H]
                                   saves experts.e.{gate,up}_proj for e >= E; nothing reads them) */
    const moe_fam_row *row;     /* with expert sets: the other sets' routers and experts
                                   (ERNIE-4.5-VL's vision ones when the text set is read) are
                                   expected unread */
    const moe_fam_expert_set *set;
} unread_list;

/* 1 when `rest` (a name under the block prefix) is another expert set's router or expert. */
static int other_set_tensor(const unread_list *ul, const char *rest)
{
    if (!ul->set)
        return 0;
    const int64_t n_sets = moe_fam_num_expert_sets(ul->row);
    for (int64_t i = 0; i < n_sets; i++)
        if (&ul->row->sets[i] != ul->set && strcmp(rest, ul->row->sets[i].router) == 0)
            return 1;
    if (strncmp(rest, "experts.", 8) != 0)
        return 0;
    char *end = NULL;
    const long long e = strtoll(rest + 8, &end, 10);
    const int64_t lo = ul->set->expert_offset * ul->E;
    return end != rest + 8 && *end == '.' && e >= 0 && e < n_sets * ul->E && (e < lo || e >= lo + ul->E);
}

#define UNREAD_SHOWN 6 /* names a message lists before "and N more" */

static void note_unread(const char *name, void *u)
{
    unread_list *ul = u;
    if (bsearch(&name, ul->seen->names, ul->seen->n, sizeof *ul->seen->names, cmp_name))
        return;
    if (ul->R > ul->E) {
        const size_t pl = strlen(ul->prefix);
        if (strncmp(name, ul->prefix, pl) == 0 && strncmp(name + pl, "experts.", 8) == 0) {
            char *end = NULL;
            const long long e = strtoll(name + pl + 8, &end, 10);
            if (end != name + pl + 8 && *end == '.' && e >= ul->E && e < ul->R)
                return; /* an identity expert's slot */
        }
    }
    if (strncmp(name, ul->prefix, strlen(ul->prefix)) == 0 && other_set_tensor(ul, name + strlen(ul->prefix)))
        return; /* another expert set's (the modality the caller did not ask for) */
    ul->count++;
    if (strstr(name, "shared_expert"))
        ul->shared = true;
    if (ul->shown < UNREAD_SHOWN && ul->used < sizeof ul->names) {
        int len = snprintf(ul->names + ul->used, sizeof ul->names - ul->used, "%s%s", ul->shown ? ", " : "", name);
        if (len > 0)
            ul->used += (size_t)len;
        ul->shown++;
    }
}

/* Name the tensors under `prefix` that the resolve of `layer` (which recorded what it read in
 * seen) did not read: a WARNING, once per layer, or MOE_EFORMAT when strict. */
static moe_status check_unread(moe_checkpoint *ck, int64_t layer, moe_ck_seen *seen, const char *prefix)
{
    if (seen->oom)
        return moe_set_error(ck->ctx, MOE_ENOMEM, "%s: layer %" PRId64 ": out of memory listing its tensors", ck->dir,
                             layer);
    qsort(seen->names, seen->n, sizeof *seen->names, cmp_name);
    unread_list ul;
    memset(&ul, 0, sizeof ul);
    ul.seen = seen;
    ul.prefix = prefix;
    ul.E = ck->cfg.desc.num_experts;
    ul.R = ck->cfg.desc.num_experts + ck->cfg.desc.num_identity_experts;
    ul.row = ck->cfg.row;
    ul.set = ck->cfg.set;
    const moe_fam_row *frow = ck->cfg.row;
    if (frow->block_parts[0]) {
        /* the prefix is the whole decoder layer (Mistral's layers.L.): only the block's parts */
        char part[MOE_CK_NAME_LEN];
        for (int i = 0; i < MOE_FAM_MAX_PARTS && frow->block_parts[i]; i++) {
            snprintf(part, sizeof part, "%s%s", prefix, frow->block_parts[i]);
            moe_ck_each_with_prefix(&ck->ix, part, note_unread, &ul);
        }
    } else {
        moe_ck_each_with_prefix(&ck->ix, prefix, note_unread, &ul);
    }
    if (ul.count == 0) {
        atomic_store_explicit(&ck->checked[layer], 1, memory_order_relaxed);
        return MOE_OK;
    }
    const moe_fam_row *row = ck->cfg.row;
    char more[48] = "";
    if (ul.count > ul.shown)
        snprintf(more, sizeof more, ", and %zu more", ul.count - ul.shown);
    char hint[320];
    if (ul.shared && row->shared.rule == MOE_FAM_SHARED_NONE)
        snprintf(hint, sizeof hint,
                 "family %s has no shared expert, so these are not computed: is the family right? (moe "
                 "--family NAME, moe_checkpoint_options.family)",
                 row->name);
    else if (ul.shared && ck->cfg.desc.shared_expert_intermediate_size == 0)
        snprintf(hint, sizeof hint,
                 "config.json gives family %s no shared expert ('%s%s' is 0 or absent), so these are not "
                 "computed: is config.json right?",
                 row->name, ck->cfg.prefix, row->shared.field ? row->shared.field : "");
    else
        snprintf(hint, sizeof hint,
                 "family %s does not read them, so they do not take part in the output: is the family right? (moe "
                 "--family NAME, moe_checkpoint_options.family)",
                 row->name);
    if (ck->strict)
        return moe_set_error(ck->ctx, MOE_EFORMAT,
                             "%s: layer %" PRId64 ": %zu tensor(s) under '%s' not read (refused: strict): %s%s; %s",
                             ck->dir, layer, ul.count, prefix, ul.names, more, hint);
    moe_log(ck->ctx, MOE_LOG_WARN, "%s: layer %" PRId64 ": %zu tensor(s) under '%s' not read, ignored: %s%s; %s",
            ck->dir, layer, ul.count, prefix, ul.names, more, hint);
    atomic_store_explicit(&ck->checked[layer], 1, memory_order_relaxed);
    return MOE_OK;
}

/* resolve_layer, and the first time a layer is resolved, check_unread on what it read; for a
 * share of the experts (a parallel plan's rank), the check resolves the whole layer itself
 * (describe: every tensor looked up, nothing converted). */
static moe_status resolve_checked(moe_checkpoint *ck, int64_t layer, moe_ck_layer *lt, int64_t e_lo, int64_t e_hi,
                                  int describe)
{
    char prefix[MOE_CK_PREFIX_LEN];
    const int64_t E = ck->cfg.desc.num_experts;
    const bool done = layer >= 0 && layer < ck->cfg.num_layers &&
                      atomic_load_explicit(&ck->checked[layer], memory_order_relaxed);
    if (done)
        return resolve_layer(ck, layer, lt, e_lo, e_hi, describe, NULL, prefix);
    moe_ck_seen seen;
    memset(&seen, 0, sizeof seen);
    moe_status st;
    if (e_lo <= 0 && e_hi >= E) {
        st = resolve_layer(ck, layer, lt, e_lo, e_hi, describe, &seen, prefix);
        if (st == MOE_OK)
            st = check_unread(ck, layer, &seen, prefix);
    } else {
        moe_ck_layer whole;
        st = resolve_layer(ck, layer, &whole, 0, E, 1, &seen, prefix);
        moe_ck_layer_free(&whole);
        if (st == MOE_OK)
            st = check_unread(ck, layer, &seen, prefix);
        if (st == MOE_OK)
            st = resolve_layer(ck, layer, lt, e_lo, e_hi, describe, NULL, prefix);
        else
            memset(lt, 0, sizeof *lt);
    }
    free(seen.names);
    return st;
}

/* The layer description of a resolved layer: config.json's (ck->cfg.desc) with what the
 * tensors decide. */
static void fill_desc(const moe_checkpoint *ck, int64_t layer, const moe_ck_layer *lt, moe_layer_desc *d)
{
    const moe_ck_config *c = &ck->cfg;
    *d = c->desc;
    d->shared_expert_intermediate_size = lt->has_shared ? c->desc.shared_expert_intermediate_size : 0;
    d->shared_expert_gated = lt->has_shared ? c->desc.shared_expert_gated : 0;
    d->weight_dtype = lt->weight_dtype;
    d->n_group = c->desc.n_group > 1 ? c->desc.n_group : 0;
    d->topk_group = c->desc.n_group > 1 ? c->desc.topk_group : 0;
    if (c->fp8) {
        /* weight-only: the checkpoint's dynamic fp8 activations are run as f32 (config.c) */
        const moe_qweight qw = {.dtype = MOE_QTYPE_F8_E4M3, .scale = c->fp8_bn ? MOE_QSCALE_BLOCK : MOE_QSCALE_TENSOR,
                                .block_n = c->fp8_bn, .block_k = c->fp8_bk};
        d->quant.w13 = qw;
        d->quant.w2 = qw;
        d->quant.act = MOE_QACT_NONE;
    }
    if (lt->mxfp4) {
        /* MXFP4: e2m1 codes, one E8M0 scale per 32 inputs, f32 activations */
        const moe_qweight qw = {.dtype = MOE_QTYPE_MXFP4, .scale = MOE_QSCALE_GROUP, .group_size = 32};
        d->quant.w13 = qw;
        d->quant.w2 = qw;
        d->quant.act = MOE_QACT_NONE;
    }
    if (lt->ckq)
        moe_ckq_layer_quant(lt->ckq, &d->quant);
    moe_ck_config_layer_desc(c, layer, d); /* Step-3.7's per-layer limits */
}

moe_status moe_checkpoint_layer_desc(moe_checkpoint *ck, int64_t layer, moe_layer_desc *out)
{
    if (!ck)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(ck->ctx, MOE_EINVAL, "moe_checkpoint_layer_desc: out is NULL");
    moe_ck_layer lt;
    moe_status st = resolve_checked(ck, layer, &lt, 0, ck->cfg.desc.num_experts, 1);
    if (st == MOE_OK)
        fill_desc(ck, layer, &lt, out);
    moe_ck_layer_free(&lt);
    return st;
}

/* MOE_EINVAL naming the first field where the plan's description differs from `want`. */
static moe_status check_plan_desc(const moe_checkpoint *ck, int64_t layer, const moe_layer_desc *have,
                                  const moe_layer_desc *want)
{
    const struct {
        const char *field;
        long long h, w;
    } ints[] = {
        {"hidden_size", have->hidden_size, want->hidden_size},
        {"moe_intermediate_size", have->moe_intermediate_size, want->moe_intermediate_size},
        {"num_experts", have->num_experts, want->num_experts},
        {"top_k", have->top_k, want->top_k},
        {"renormalize", have->renormalize, want->renormalize},
        {"scoring_func", have->scoring_func, want->scoring_func},
        {"activation", have->activation, want->activation},
        {"shared_expert_intermediate_size", have->shared_expert_intermediate_size,
         want->shared_expert_intermediate_size},
        {"shared_expert_gated", have->shared_expert_gated, want->shared_expert_gated},
        {"n_group", have->n_group > 1 ? have->n_group : 0, want->n_group},
        {"topk_group", have->n_group > 1 ? have->topk_group : 0, want->topk_group},
        {"group_score", have->n_group > 1 ? have->group_score : want->group_score, want->group_score},
        {"has_selection_bias", !!have->has_selection_bias, want->has_selection_bias},
        {"has_router_bias", !!have->has_router_bias, want->has_router_bias},
        {"has_expert_bias", !!have->has_expert_bias, want->has_expert_bias},
        {"apply_router_weight_on_input", !!have->apply_router_weight_on_input, want->apply_router_weight_on_input},
        {"has_output_bias", !!have->has_output_bias, want->has_output_bias},
        {"has_shared_activation", !!have->has_shared_activation, want->has_shared_activation},
        {"has_output_norm", !!have->has_output_norm, want->has_output_norm},
        {"shared_activation", want->has_shared_activation ? have->shared_activation : 0,
         want->has_shared_activation ? want->shared_activation : 0},
        {"quant.w13.dtype", have->quant.w13.dtype, want->quant.w13.dtype},
        {"quant.w13.scale", have->quant.w13.scale, want->quant.w13.scale},
        {"quant.w13.block_n", want->quant.w13.dtype ? have->quant.w13.block_n : 0, want->quant.w13.block_n},
        {"quant.w13.block_k", want->quant.w13.dtype ? have->quant.w13.block_k : 0, want->quant.w13.block_k},
        {"quant.w2.dtype", have->quant.w2.dtype, want->quant.w2.dtype},
        {"quant.w2.scale", have->quant.w2.scale, want->quant.w2.scale},
        {"quant.w2.block_n", want->quant.w2.dtype ? have->quant.w2.block_n : 0, want->quant.w2.block_n},
        {"quant.w2.block_k", want->quant.w2.dtype ? have->quant.w2.block_k : 0, want->quant.w2.block_k},
        /* a static FP8 checkpoint may run weight-only on request: a plan with quant.act NONE */
        {"quant.act", have->quant.act == MOE_QACT_NONE && want->quant.act == MOE_QACT_STATIC ? want->quant.act
                                                                                           : have->quant.act,
         want->quant.act},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].h != ints[i].w)
            return moe_set_error(ck->ctx, MOE_EINVAL,
                                 "%s: plan does not match layer %" PRId64 ": desc field '%s' is %lld in the plan, %lld in the checkpoint",
                                 ck->dir, layer, ints[i].field, ints[i].h, ints[i].w);
    if (have->weight_dtype != want->weight_dtype)
        return moe_set_error(ck->ctx, MOE_EINVAL,
                             "%s: plan does not match layer %" PRId64 ": desc field 'weight_dtype' is %s in the plan, %s in the checkpoint",
                             ck->dir, layer, moe_dtype_name(have->weight_dtype), moe_dtype_name(want->weight_dtype));
    /* swiglu_limit matters when the routed or the shared expert's activation reads it */
    const moe_activation sact = want->has_shared_activation ? want->shared_activation : want->activation;
    const int limit_read = want->activation == MOE_ACT_SWIGLU_OAI || want->activation == MOE_ACT_SWIGLU_CLAMP ||
                           want->activation == MOE_ACT_SWIGLU_POSTCLAMP ||
                           (want->shared_expert_intermediate_size > 0 && want->shared_swiglu_limit == 0.0f &&
                            (sact == MOE_ACT_SWIGLU_OAI || sact == MOE_ACT_SWIGLU_CLAMP ||
                             sact == MOE_ACT_SWIGLU_POSTCLAMP));
    const struct {
        const char *field;
        float h, w;
    } floats[] = {
        {"routed_scaling_factor", have->routed_scaling_factor, want->routed_scaling_factor},
        {"swiglu_alpha", want->activation == MOE_ACT_SWIGLU_OAI ? have->swiglu_alpha : 0.0f,
         want->activation == MOE_ACT_SWIGLU_OAI ? want->swiglu_alpha : 0.0f},
        {"swiglu_limit", limit_read ? have->swiglu_limit : 0.0f, limit_read ? want->swiglu_limit : 0.0f},
        {"shared_swiglu_limit", have->shared_swiglu_limit, want->shared_swiglu_limit},
        {"output_norm_eps", want->has_output_norm ? have->output_norm_eps : 0.0f,
         want->has_output_norm ? want->output_norm_eps : 0.0f},
        {"softcap_gate", want->activation == MOE_ACT_SWIGLU_SOFTCAP ? have->softcap_gate : 0.0f,
         want->activation == MOE_ACT_SWIGLU_SOFTCAP ? want->softcap_gate : 0.0f},
        {"softcap_up", want->activation == MOE_ACT_SWIGLU_SOFTCAP ? have->softcap_up : 0.0f,
         want->activation == MOE_ACT_SWIGLU_SOFTCAP ? want->softcap_up : 0.0f},
        {"sparsemixer_jitter_eps", want->scoring_func == MOE_SCORING_SPARSEMIXER ? have->sparsemixer_jitter_eps : 0.0f,
         want->scoring_func == MOE_SCORING_SPARSEMIXER ? want->sparsemixer_jitter_eps : 0.0f},
        {"renormalize_eps", want->renormalize ? have->renormalize_eps : 0.0f, want->renormalize ? want->renormalize_eps : 0.0f},
        {"renormalize_p", want->renormalize ? have->renormalize_p : 1.0f, want->renormalize ? want->renormalize_p : 1.0f},
        {"shared_expert_scale", want->shared_expert_intermediate_size > 0 ? have->shared_expert_scale : 0.0f,
         want->shared_expert_intermediate_size > 0 ? want->shared_expert_scale : 0.0f},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (floats[i].h != floats[i].w)
            return moe_set_error(ck->ctx, MOE_EINVAL,
                                 "%s: plan does not match layer %" PRId64 ": desc field '%s' is %g in the plan, %g in the checkpoint",
                                 ck->dir, layer, floats[i].field, (double)floats[i].h, (double)floats[i].w);
    return MOE_OK;
}

moe_status moe_checkpoint_load_weights(moe_checkpoint *ck, int64_t layer, const moe_plan *plan,
                                       moe_weights **out)
{
    if (!ck)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(ck->ctx, MOE_EINVAL, "moe_checkpoint_load_weights: out is NULL");
    *out = NULL;
    if (!plan)
        return moe_set_error(ck->ctx, MOE_EINVAL, "moe_checkpoint_load_weights: plan is NULL");

    /* Only this rank's experts (a parallel plan's local range; all in one process). */
    const int64_t E = ck->cfg.desc.num_experts;
    int64_t e_lo = 0, e_hi = E;
    if (moe_plan_desc(plan)->num_experts == E) {
        int32_t *map = malloc(sizeof(int32_t) * (size_t)(E > 0 ? E : 1)); /* [E] */
        if (!map)
            return moe_set_error(ck->ctx, MOE_ENOMEM, "moe_checkpoint_load_weights: out of memory");
        moe_plan_expert_map(plan, map);
        e_lo = E;
        e_hi = 0;
        for (int64_t e = 0; e < E; e++)
            if (map[e] >= 0) {
                e_lo = e < e_lo ? e : e_lo;
                e_hi = e + 1;
            }
        free(map);
    }
    moe_ck_layer lt;
    moe_layer_desc want;
    moe_status st = resolve_checked(ck, layer, &lt, e_lo, e_hi, 0);
    if (st == MOE_OK) {
        fill_desc(ck, layer, &lt, &want);
        st = check_plan_desc(ck, layer, moe_plan_desc(plan), &want);
        if (st == MOE_OK && want.quant.act == MOE_QACT_STATIC && moe_plan_desc(plan)->quant.act == MOE_QACT_NONE)
            moe_log(ck->ctx, MOE_LOG_INFO,
                    "%s: layer %" PRId64 ": static FP8 checkpoint (%s) run weight-only as the plan asks (quant.act "
                    "NONE): f32 activations, the input_scale tensors read and checked but not applied",
                    ck->dir, layer, moe_quant_name(&want.quant));
    }
    if (st == MOE_OK && lt.mxfp4)
        st = moe_ck_mxfp4_split_gate_up(&ck->ix, &ck->cfg, &lt, layer);
    if (st == MOE_OK) {
        moe_weight_source src;
        memset(&src, 0, sizeof src);
        src.router = lt.router.data;           /* [E, H] */
        src.router_dtype = lt.router.dtype;
        src.gate_proj = lt.gate;               /* E x [I, H] (or strided) */
        src.up_proj = lt.up;                   /* E x [I, H] (or strided) */
        src.down_proj = lt.down;               /* E x [H, I] (or strided) */
        src.gate_up_stride_out = lt.gu_so;
        src.gate_up_stride_in = lt.gu_si;
        src.down_stride_out = lt.dn_so;
        src.down_stride_in = lt.dn_si;
        if (ck->cfg.fp8 || lt.mxfp4) {
            /* FP8: E x F32 [ceil(I/bn), ceil(H/bk)] (down [ceil(H/bn), ceil(I/bk)]);
             * MXFP4: E x U8 [I, H/32] (down [H, I/32]) */
            src.gate_scale = lt.gate_scale;
            src.up_scale = lt.up_scale;
            src.down_scale = lt.down_scale;
        }
        if (lt.ckq)
            moe_ckq_layer_source(lt.ckq, &src); /* scales (and int4 zero points) per expert */
        if (lt.has_shared) {
            src.shared_gate_proj = lt.sh_gate.data;     /* [I_s, H] */
            src.shared_up_proj = lt.sh_up.data;         /* [I_s, H] */
            src.shared_down_proj = lt.sh_down.data;     /* [H, I_s] */
            src.shared_expert_gate = lt.sh_gate_w.data; /* [1, H] or NULL when ungated */
        }
        if (want.has_router_bias) {
            src.router_bias = lt.router_bias.data;      /* [E] */
            src.router_bias_dtype = lt.router_bias.dtype;
        }
        if (want.has_selection_bias) {
            src.selection_bias = lt.sel_bias.data;      /* [E] */
            src.selection_bias_dtype = lt.sel_bias.dtype;
        }
        if (want.has_output_bias) {
            src.output_bias = lt.out_bias.data;         /* [H] */
            src.output_bias_dtype = lt.out_bias.dtype;
        }
        if (want.has_output_norm) {
            src.output_norm = lt.out_norm.data;         /* [H] */
            src.output_norm_dtype = lt.out_norm.dtype;
        }
        if (want.has_expert_bias) {
            src.gate_bias = lt.gate_bias;               /* E x [I], every gate_up_bias_stride-th */
            src.up_bias = lt.up_bias;
            src.down_bias = lt.down_bias;               /* E x [H] */
            src.expert_bias_dtype = lt.expert_bias_dtype;
            src.gate_up_bias_stride = lt.gate_up_bias_stride;
        }
        st = moe_weights_create(plan, &src, out);
    }
    moe_ck_layer_free(&lt);
    return st;
}
