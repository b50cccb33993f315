/* config.json, read through the family's row (src/io/families.c): which family, where its
 * decoder fields are, the sizes, the routing and expert math, which layers are MoE, and the
 * quantization_config. Nothing here branches on the family: what differs is in the row.
 *
 * Multimodal wrappers (Llama4ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration)
 * keep the decoder's fields in "text_config"; those are read from there, and messages name
 * them "text_config.<field>". A row's config_path reaches deeper wrappers the same way
 * (Qwen3-Omni: "thinker_config.text_config.<field>"). A row's moe_object keeps the MoE block's
 * own fields in a sub-object of the decoder's (DBRX: "ffn_config.<field>"). */
#include "io/config.h"
#include "io/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Decide the family from "architectures"[0], falling back to "model_type" when the
 * architecture is absent or not one of ours (e.g. a *ForSequenceClassification head over the
 * same decoder). MOE_EUNSUPPORTED names both and lists the supported ones. `family` (or NULL)
 * names the row to use instead (moe_checkpoint_options.family): MOE_EINVAL when no row has
 * that name; *arch_out / *model_type_out / *named_out get what config.json names, for the
 * WARNING moe_ck_config_parse gives when the rows differ. */
static moe_status config_family(moe_ck_config *c, const json_t *root, const char *family, const char **arch_out,
                                const char **model_type_out, const moe_fam_row **named_out)
{
    const char *arch = NULL, *model_type = NULL;
    const json_t *archs = json_object_get(root, "architectures");
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs))
            return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field 'architectures' must be an array, found %s", c->path,
                                 moe_io_json_found(archs));
        if (json_array_size(archs) > 0) {
            const json_t *a0 = json_array_get(archs, 0);
            if (!json_is_string(a0))
                return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field 'architectures'[0] must be a string, found %s",
                                     c->path, moe_io_json_found(a0));
            arch = json_string_value(a0);
        }
    }
    const json_t *mt = json_object_get(root, "model_type");
    if (mt && json_is_string(mt))
        model_type = json_string_value(mt);
    *arch_out = arch;
    *model_type_out = model_type;

    if (family) {
        const moe_fam_row *named = arch ? moe_fam_by_arch(arch) : NULL;
        *named_out = named ? named : model_type ? moe_fam_by_model_type(model_type) : NULL;
        if (!(c->row = moe_fam_by_name(family))) {
            char names[2048]; /* [2048] chars: every row's name (67 rows: about 1000) */
            const char *close = moe_fam_suggest(family);
            return moe_set_error(c->ctx, MOE_EINVAL,
                                 "%s: unknown family '%s'%s%s%s (moe_checkpoint_options.family, --family); families: %s",
                                 c->path, family, close ? "; did you mean " : "", close ? close : "", close ? "?" : "",
                                 moe_fam_row_names(names, sizeof names));
        }
        return MOE_OK;
    }
    if (arch && (c->row = moe_fam_by_arch(arch)))
        return MOE_OK;
    if (model_type && (c->row = moe_fam_by_model_type(model_type))) {
        if (arch)
            moe_log(c->ctx, MOE_LOG_WARN,
                    "%s: architecture '%s' is not one libmoe knows; reading it as family '%s' by its model_type "
                    "(--family %s says so and silences this)",
                    c->path, arch, c->row->name, c->row->name);
        return MOE_OK;
    }
    char names[2048]; /* [2048] chars: every row's name (67 rows: about 1000) */
    if (!arch && !model_type)
        return moe_set_error(c->ctx, MOE_ENOTFOUND,
                             "%s: neither 'architectures' nor 'model_type' is given; supported families: %s "
                             "(docs/families.md lists their architecture classes)",
                             c->path, moe_fam_row_names(names, sizeof names));
    const char *close = model_type ? moe_fam_suggest(model_type) : NULL;
    return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                         "%s: architecture '%s' (model_type '%s') is not supported%s%s%s; a model with one of the "
                         "supported families' MoE block can be read as that family with --family NAME "
                         "(moe_checkpoint_options.family: %s); docs/families.md lists every transformers MoE model "
                         "type with its status and each family's architecture classes",
                         c->path, arch ? arch : "(none)", model_type ? model_type : "(none)",
                         close ? " (nearest family name: " : "", close ? close : "", close ? ")" : "",
                         moe_fam_row_names(names, sizeof names));
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* MOE_FAM_LAYERS_BLOCK_TYPES (Nemotron-H): the layer count and the MoE layers from the
 * per-layer list_field (layers_block_type: entries "moe"), else the legacy pattern_field string
 * (hybrid_override_pattern: characters 'E'), else the config class's default list; the
 * NemotronHConfig property num_hidden_layers is the list's length and is not read. */
static moe_status config_block_types(moe_ck_config *c, const moe_cfg_fields *f)
{
    const moe_fam_row *row = c->row;
    const json_t *lst = json_object_get(f->obj, row->layers.list_field);
    const json_t *pat = row->layers.pattern_field ? json_object_get(f->obj, row->layers.pattern_field) : NULL;
    if (lst && json_is_null(lst))
        lst = NULL;
    if (pat && json_is_null(pat))
        pat = NULL;
    if (lst && !json_is_array(lst))
        return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s' must be an array of strings (one per layer)",
                             c->path, c->prefix, row->layers.list_field);
    if (!lst && pat && !json_is_string(pat))
        return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s' must be a string (one character per layer)",
                             c->path, c->prefix, row->layers.pattern_field);
    const size_t n = lst ? json_array_size(lst)
                     : pat ? strlen(json_string_value(pat))
                           : (size_t)row->layers.n_layers_default;
    if (n == 0)
        return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s' lists no layer", c->path, c->prefix,
                             lst ? row->layers.list_field : row->layers.pattern_field);
    if (n > (size_t)MOE_MAX_LAYERS)
        return moe_set_error(c->ctx, MOE_EFORMAT,
                             "%s: field '%s%s' has %zu layers, beyond libmoe's limit of %" PRId64 " (MOE_MAX_LAYERS)",
                             c->path, c->prefix, lst ? row->layers.list_field : row->layers.pattern_field, n,
                             MOE_MAX_LAYERS);
    int64_t *a = calloc(n, sizeof *a); /* [n]: at most every layer */
    if (!a)
        return moe_set_error(c->ctx, MOE_ENOMEM, "%s: out of memory", c->path);
    size_t m = 0;
    if (lst) {
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(lst, i);
            if (!json_is_string(x)) {
                free(a);
                return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] must be a string, found %s", c->path,
                                     c->prefix, row->layers.list_field, i, moe_io_json_found(x));
            }
            if (strcmp(json_string_value(x), "moe") == 0)
                a[m++] = (int64_t)i;
        }
    } else if (pat) {
        const char *p = json_string_value(pat);
        for (size_t i = 0; i < n; i++)
            if (p[i] == 'E')
                a[m++] = (int64_t)i;
    } else {
        for (int i = 0; i < row->layers.n_list_default; i++)
            a[m++] = row->layers.list_default[i];
        moe_cfg_note_default(f, row->layers.list_field, "the config class's %" PRId64 "-layer list",
                             row->layers.n_layers_default);
    }
    c->num_layers = (int64_t)n;
    c->layer_list = a;
    c->n_layer_list = m;
    c->have_layer_list = lst || pat;
    return MOE_OK;
}

/* The fields of the row's MoE-layer rule (first, step, list: the order every rule reads
 * them in), with the row's defaults. */
static moe_status config_layer_rule(moe_ck_config *c, const moe_cfg_fields *f)
{
    const moe_fam_row *row = c->row;
    moe_status st;
    if (row->layers.rule == MOE_FAM_LAYERS_BLOCK_TYPES)
        return MOE_OK; /* read with the layer count (config_block_types) */
    if (row->layers.first_field &&
        (st = moe_cfg_int(f, row->layers.first_field, false, row->layers.first_default, 0, &c->layer_first)) != MOE_OK)
        return st;
    const char *skey = row->layers.step_field;
    const json_t *sv = skey ? moe_cfg_get(f, &skey) : NULL;
    if (row->layers.step_list && json_is_array(sv)) {
        /* Dots3Note's legacy moe_layer_freq as a per-layer list: read below, with the rule */
        c->layer_step = 1;
    } else if (row->layers.step_field &&
               (st = moe_cfg_int(f, row->layers.step_field, false, row->layers.step_default, 1, &c->layer_step)) !=
                   MOE_OK) {
        return st;
    }
    if (row->layers.last_field) {
        if ((st = moe_cfg_int(f, row->layers.last_field, false, -1, -1, &c->layer_last)) != MOE_OK)
            return st;
        if (c->layer_last < 0)
            c->layer_last = c->num_layers - 1;
    }
    if (row->layers.rule == MOE_FAM_LAYERS_PERIOD_OFFSET && c->layer_first >= c->layer_step)
        return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s' = %" PRId64 " must be < '%s%s' = %" PRId64, c->path,
                             c->prefix, row->layers.first_field, c->layer_first, c->prefix, row->layers.step_field,
                             c->layer_step);
    if (row->layers.rule == MOE_FAM_LAYERS_TYPES_ELSE_PREFIX) {
        c->layer_first = row->layers.first_default;
        if (row->layers.first_field &&
            (st = moe_cfg_int(f, row->layers.first_field, false, row->layers.first_default, 0, &c->layer_first)) != MOE_OK)
            return st;
        if ((st = moe_cfg_index_list_of(f, row->layers.list_field, "sparse", "dense", c->num_layers, &c->layer_list,
                                        &c->n_layer_list, &c->have_layer_list)) != MOE_OK) /* ascending: no sort needed */
            return st;
        if (!c->have_layer_list && row->layers.step_list && json_is_array(sv)) {
            /* no mlp_layer_types: layer >= first and bool(step_field[layer]) (Dots3NoteTextConfig's
             * __post_init__), as a list of the MoE layers, one entry per layer required */
            if (json_array_size(sv) < (size_t)c->num_layers)
                return moe_set_error(c->ctx, MOE_EFORMAT,
                                     "%s: field '%s%s' has %zu entries for %" PRId64 " layers: the per-layer list "
                                     "must cover every layer",
                                     c->path, c->prefix, skey, json_array_size(sv), c->num_layers);
            if (!(c->layer_list = calloc((size_t)c->num_layers + 1, sizeof *c->layer_list)))
                return moe_set_error(c->ctx, MOE_ENOMEM, "%s: out of memory", c->path);
            c->n_layer_list = 0;
            for (int64_t i = 0; i < c->num_layers; i++) {
                const json_t *x = json_array_get(sv, (size_t)i);
                if (!json_is_boolean(x) && !json_is_integer(x))
                    return moe_set_error(c->ctx, MOE_EFORMAT,
                                         "%s: field '%s%s'[%" PRId64 "] must be a boolean or an integer, found %s",
                                         c->path, c->prefix, skey, i, moe_io_json_found(x));
                if (i >= c->layer_first && (json_is_true(x) || (json_is_integer(x) && json_integer_value(x) != 0)))
                    c->layer_list[c->n_layer_list++] = i;
            }
            c->have_layer_list = true;
            c->layer_list_from_step = true;
            return MOE_OK;
        }
        if (row->layers.list_required && !c->have_layer_list)
            return moe_set_error(c->ctx, MOE_EFORMAT,
                                 "%s: field '%s%s' is absent or null: family %s's decoder layers read it per layer "
                                 "(\"dense\" / \"sparse\") and its config class has no default, so which layers are "
                                 "MoE is not known; config.json must list one entry per layer",
                                 c->path, c->prefix, row->layers.list_field, row->name);
        return MOE_OK;
    }
    if (row->layers.list_field &&
        (st = moe_cfg_int_list(f, row->layers.list_field, &c->layer_list, &c->n_layer_list, &c->have_layer_list)) !=
            MOE_OK)
        return st;
    if (row->layers.list_field && !c->have_layer_list && row->layers.n_list_default > 0) {
        /* the config class fills an absent list (FlintConfig: mlp_only_layers [0, 1]) */
        const size_t n = (size_t)row->layers.n_list_default;
        if (!(c->layer_list = malloc(n * sizeof *c->layer_list)))
            return moe_set_error(c->ctx, MOE_ENOMEM, "out of memory reading '%s%s'", c->prefix, row->layers.list_field);
        memcpy(c->layer_list, row->layers.list_default, n * sizeof *c->layer_list);
        c->n_layer_list = n;
        c->have_layer_list = true;
    }
    /* sorted, so a layer is looked up in log time (listed()): walking the layers to list the
     * MoE ones then costs L log n, not L n */
    if (c->n_layer_list > 1)
        qsort(c->layer_list, c->n_layer_list, sizeof *c->layer_list, cmp_i64);
    return MOE_OK;
}

/* The row's refused config values (moe_fam_refuse): a field that is true or a number other
 * than 0 is MOE_EUNSUPPORTED naming it, its value and what it asks for; absent, null, false
 * or 0 passes. Another JSON type is MOE_EFORMAT. */
static moe_status config_refused(const moe_cfg_fields *f, const moe_fam_row *row)
{
    for (int i = 0; i < MOE_FAM_MAX_REFUSE && row->refuse[i].field; i++) {
        const char *key = row->refuse[i].field;
        const json_t *v = json_object_get(f->obj, key);
        if (!v || json_is_null(v) || json_is_false(v))
            continue;
        if (!json_is_true(v) && !json_is_number(v))
            return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s' must be a number or a boolean", f->path,
                                 f->prefix, key);
        if (json_is_number(v) && json_number_value(v) == 0.0)
            continue;
        char val[40];
        if (json_is_true(v))
            snprintf(val, sizeof val, "true");
        else
            snprintf(val, sizeof val, "%.17g", json_number_value(v));
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s%s' = %s asks for %s, which libmoe does not compute for %s (it reads %s "
                             "checkpoints with '%s' absent, false or 0)",
                             f->path, f->prefix, key, val, row->refuse[i].what, row->name, row->name, key);
    }
    return MOE_OK;
}

/* A config string field `field` (absent or null: dflt) that must be one of the row's listed
 * values (the `n` strings of vals, spaced `stride` bytes apart): its index into *idx, or
 * MOE_EUNSUPPORTED naming the field, the value and those libmoe reads. */
static moe_status config_choice(const moe_cfg_fields *f, const moe_fam_row *row, const char *field, const char *dflt,
                                const char *const *vals, size_t stride, int *idx)
{
    const char *v = NULL;
    moe_status st = moe_cfg_str(f, field, dflt, &v);
    if (st != MOE_OK)
        return st;
    char list[160] = "";
    for (int i = 0; i < MOE_FAM_MAX_CHOICES; i++) {
        const char *c = *(const char *const *)((const char *)vals + (size_t)i * stride);
        if (!c)
            break;
        if (strcmp(c, v) == 0) {
            *idx = i;
            return MOE_OK;
        }
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s\"%s\"", i ? " or " : "", c);
    }
    return moe_set_error(f->ctx, MOE_EUNSUPPORTED, "%s: field '%s%s' = \"%s\": libmoe reads %s with %s only", f->path,
                         f->prefix, field, v, row->name, list);
}

/* Entry `index` of the row's intermediate_field list (ERNIE-4.5-VL's moe_intermediate_size
 * [text, vision], one I per expert set) into *out; absent or null: the config class's list
 * (row->intermediate_list). A number or a list without that entry is MOE_EFORMAT: the modeling
 * code indexes the list. */
static moe_status config_intermediate_entry(const moe_ck_config *c, const moe_cfg_fields *f, int64_t index,
                                            int64_t *out)
{
    const moe_fam_row *row = c->row;
    const char *key = row->intermediate_field;
    const json_t *v = moe_cfg_get(f, &key);
    if (!v || json_is_null(v)) {
        *out = row->intermediate_list[index];
        moe_cfg_note_default(f, key, "[%" PRId64 ", %" PRId64 "]", row->intermediate_list[0],
                             row->intermediate_list[1]);
        return MOE_OK;
    }
    char sets[64];
    if (!json_is_array(v) || (int64_t)json_array_size(v) <= index)
        return moe_set_error(c->ctx, MOE_EFORMAT,
                             "%s: field '%s%s' must be a list of one intermediate size per expert set (%s), found %s",
                             c->path, c->prefix, key, moe_fam_expert_set_names(row, sets, sizeof sets),
                             json_is_array(v) ? "a shorter list" : moe_io_json_found(v));
    const json_t *x = json_array_get(v, (size_t)index);
    if (!json_is_integer(x) || json_integer_value(x) < 1)
        return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s'[%" PRId64 "] must be an integer >= 1, found %s",
                             c->path, c->prefix, key, index, moe_io_json_found(x));
    *out = (int64_t)json_integer_value(x);
    return MOE_OK;
}

/* MOE_FAM_RENORM_PNORM (DBRX's moe_normalize_expert_weights): a number p > 0 divides the top-k
 * weights by their p-norm (DbrxFFN.route_tokens_to_experts: torch.norm(w, p)), rounded to the
 * f32 of moe_layer_desc.renormalize_p; null: not renormalized; absent: the row's p. */
static moe_status config_pnorm(moe_ck_config *c, const moe_cfg_fields *fm)
{
    const moe_fam_row *row = c->row;
    moe_layer_desc *d = &c->desc;
    const char *key = row->renormalize.field;
    const json_t *v = moe_cfg_get(fm, &key);
    if (!v) {
        d->renormalize = 1;
        d->renormalize_p = (float)row->renormalize.p;
        moe_cfg_note_default(fm, row->renormalize.field, "%g", row->renormalize.p);
        return MOE_OK;
    }
    if (json_is_null(v)) { /* "if self.moe_normalize_expert_weights is not None" */
        d->renormalize = 0;
        return MOE_OK;
    }
    if (!json_is_number(v))
        return moe_set_error(c->ctx, MOE_EFORMAT,
                             "%s: field '%s%s' must be a number (the p of the norm the top-k weights are divided "
                             "by) or null (not renormalized), found %s",
                             c->path, fm->prefix, key, moe_io_json_found(v));
    const double p = json_number_value(v);
    if (!(p > 0.0) || !((float)p > 0.0f))
        return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s%s' = %g: %s divides the top-k weights by torch.norm(w, p); libmoe "
                             "computes p > 0 (moe_layer_desc.renormalize_p: 1 the sum, 2 the Euclidean norm, ...), "
                             "not p <= 0 (0 counts the non-zero weights)",
                             c->path, fm->prefix, key, p, row->name);
    d->renormalize = 1;
    d->renormalize_p = (float)p; /* +inf when p exceeds FLT_MAX: the max, as torch.norm's limit */
    return MOE_OK;
}

/* The sizes, routing and MoE-layer fields of the row, into c->desc and c->layer_*. The reads
 * keep one order (it decides which of two bad fields a message names): I, E, a shared-expert
 * count, a dense-prefix layer rule, routed_scaling_factor, norm_topk_prob, the other layer
 * rules, a shared-expert size, then the row's routing hook. The layer rules (and DeepSeek-V4's
 * refused layers) read the decoder's object f, everything else fm: f itself, or the row's
 * moe_object (DBRX's ffn_config). */
static moe_status config_decoder(moe_ck_config *c, const moe_cfg_fields *f, const moe_cfg_fields *fm)
{
    const moe_fam_row *row = c->row;
    moe_layer_desc *d = &c->desc;
    moe_status st;
    int64_t n_shared = 0;
    int64_t i_shared = 0; /* MOE_FAM_SHARED_COUNT's I (an expert set's list entry; else I) */
    /* I (an expert set's entry of the I list) and E: required, unless the row gives the config
     * class's default (DbrxFFNConfig) */
    if ((st = c->set ? config_intermediate_entry(c, fm, c->set->intermediate_index, &d->moe_intermediate_size)
                     : moe_cfg_int(fm, row->intermediate_field, row->intermediate_default == 0,
                                   row->intermediate_default, 1, &d->moe_intermediate_size)) != MOE_OK ||
        (c->set && (st = config_intermediate_entry(c, fm, c->set->shared_intermediate_index, &i_shared)) != MOE_OK) ||
        (st = row->experts_default > 0
                  ? moe_cfg_int(fm, row->experts_field, false, row->experts_default, row->experts_min, &d->num_experts)
              : row->per_layer_lists
                  ? moe_cfg_int_uniform(fm, row->experts_field, row->experts_alias, row->experts_min, c->num_layers,
                                        &d->num_experts)
                  : moe_cfg_int_alias(fm, row->experts_field, row->experts_alias, row->experts_min, &d->num_experts)) !=
            MOE_OK)
        return st;
    if (row->shared.rule == MOE_FAM_SHARED_COUNT) {
        /* the class default when absent; null means none, as the published code's "if
         * config.n_shared_experts is not None" */
        const char *key = row->shared.field;
        if (!moe_cfg_get(fm, &key)) {
            n_shared = row->shared.count_default;
            moe_cfg_note_default(fm, row->shared.field, "%" PRId64, n_shared);
        } else if ((st = moe_cfg_int(fm, row->shared.field, false, 0, 0, &n_shared)) != MOE_OK) {
            return st;
        }
    }
    if (row->layers.rule == MOE_FAM_LAYERS_DENSE_PREFIX && (st = config_layer_rule(c, f)) != MOE_OK)
        return st;
    if (row->routed_scaling.field &&
        (st = moe_cfg_float(fm, row->routed_scaling.field, row->routed_scaling.dflt, true, 0.0,
                            &d->routed_scaling_factor)) != MOE_OK)
        return st;
    if (row->renormalize.rule == MOE_FAM_RENORM_FIELD &&
        (st = moe_cfg_bool(fm, row->renormalize.field, row->renormalize.dflt, &d->renormalize)) != MOE_OK)
        return st;
    if (row->renormalize.rule == MOE_FAM_RENORM_PNORM && (st = config_pnorm(c, fm)) != MOE_OK)
        return st;
    if (row->scoring_by.field) { /* Cohere2-MoE's expert_selection_fn: softmax of the k, or sigmoid */
        int i = 0;
        if ((st = config_choice(fm, row, row->scoring_by.field, row->scoring_by.dflt, &row->scoring_by.choices[0].value,
                                sizeof row->scoring_by.choices[0], &i)) != MOE_OK)
            return st;
        d->scoring_func = row->scoring_by.choices[i].scoring;
        if (!row->scoring_by.choices[i].renormalize_field)
            d->renormalize = 0;
    }
    if (row->selection_bias_on.field) { /* LFM2-MoE's use_expert_bias */
        int on = 0;
        if ((st = moe_cfg_bool(fm, row->selection_bias_on.field, row->selection_bias_on.dflt, &on)) != MOE_OK)
            return st;
        d->has_selection_bias = row->selection_bias != NULL && on;
    }
    if (row->output_norm_eps.field && /* A.X-K1's post_mlp_layernorm eps */
        (st = moe_cfg_float(fm, row->output_norm_eps.field, row->output_norm_eps.dflt, false, 0.0,
                            &d->output_norm_eps)) != MOE_OK)
        return st;
    if (row->sparsemixer_eps.field &&
        (st = moe_cfg_float(fm, row->sparsemixer_eps.field, row->sparsemixer_eps.dflt, false, 0.0,
                            &d->sparsemixer_jitter_eps)) != MOE_OK)
        return st;
    if (row->layers.rule != MOE_FAM_LAYERS_DENSE_PREFIX && (st = config_layer_rule(c, f)) != MOE_OK)
        return st;
    switch (row->shared.rule) {
    case MOE_FAM_SHARED_NONE: d->shared_expert_intermediate_size = 0; break;
    case MOE_FAM_SHARED_FIELD:
        if ((st = moe_cfg_int(fm, row->shared.field, !row->shared.field_optional, row->shared.field_default, 0,
                              &d->shared_expert_intermediate_size)) != MOE_OK)
            return st;
        break;
    case MOE_FAM_SHARED_COUNT:
        d->shared_expert_intermediate_size = n_shared * (c->set ? i_shared : d->moe_intermediate_size);
        break;
    case MOE_FAM_SHARED_SAME_AS_I: d->shared_expert_intermediate_size = d->moe_intermediate_size; break;
    case MOE_FAM_SHARED_FIELD_TIMES_COUNT: {
        /* Dots3NoteTextMoE: shared_experts_intermediate_size * n_shared_experts (a null count:
         * none, the config class's validate_architecture would refuse it anyway) */
        int64_t size = 0, count = 0;
        const char *key = row->shared.count_field;
        if ((st = moe_cfg_int(fm, row->shared.field, false, row->shared.field_default, 1, &size)) != MOE_OK)
            return st;
        if (!moe_cfg_get(fm, &key)) {
            count = row->shared.count_default;
            moe_cfg_note_default(fm, row->shared.count_field, "%" PRId64, count);
        } else if ((st = moe_cfg_int(fm, row->shared.count_field, false, 0, 0, &count)) != MOE_OK) {
            return st;
        }
        const int64_t lim = (int64_t)1 << 24; /* moe_layer_desc's bound on a size */
        if (count > 0 && size > lim / count)
            return moe_set_error(c->ctx, MOE_EFORMAT, "%s: '%s%s' = %" PRId64 " times '%s%s' = %" PRId64 " exceeds %lld",
                                 c->path, c->prefix, row->shared.field, size, c->prefix, row->shared.count_field,
                                 count, (long long)lim);
        d->shared_expert_intermediate_size = size * count;
        break;
    }
    }
    d->shared_expert_gated = row->shared.gated && d->shared_expert_intermediate_size > 0;
    d->shared_expert_scale = 1.0f;
    if (row->shared.combine.field && d->shared_expert_intermediate_size > 0) {
        /* Cohere2-MoE's shared_expert_combination_strategy: "average" halves both sums */
        int i = 0;
        if ((st = config_choice(fm, row, row->shared.combine.field, row->shared.combine.dflt,
                                &row->shared.combine.choices[0].value, sizeof row->shared.combine.choices[0], &i)) !=
            MOE_OK)
            return st;
        d->routed_scaling_factor = (float)((double)d->routed_scaling_factor * row->shared.combine.choices[i].routed_scale);
        d->shared_expert_scale = (float)row->shared.combine.choices[i].shared_scale;
    }
    if ((st = config_refused(fm, row)) != MOE_OK)
        return st;
    if (row->routing_hook && (st = row->routing_hook(fm, row, &d->n_group, &d->topk_group)) != MOE_OK)
        return st;
    if (row->renorm_min_field && d->num_experts > 0) {
        float m = 0.0f;
        if ((st = moe_cfg_float(fm, row->renorm_min_field, row->renorm_min, false, 0.0, &m)) != MOE_OK)
            return st;
        if (m > 1.0 / (double)d->num_experts)
            return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s%s' = %g exceeds 1 / %s = %g: the router's clamp of the top-k sum "
                                 "could then bind, which libmoe's renormalization (sum + 1e-20) does not do",
                                 c->path, fm->prefix, row->renorm_min_field, m, row->experts_field,
                                 1.0 / (double)d->num_experts);
    }
    if (row->identity.field) {
        /* LongCat-Flash: zero_expert_num identity experts (LongcatFlashExperts `identity_expert`;
         * `config.zero_expert_num or 0`: null is none) */
        const char *key = row->identity.field;
        const json_t *v = moe_cfg_get(fm, &key);
        if (!v) {
            d->num_identity_experts = row->identity.dflt;
            moe_cfg_note_default(fm, row->identity.field, "%" PRId64, row->identity.dflt);
        } else if (json_is_null(v)) {
            d->num_identity_experts = 0;
        } else if ((st = moe_cfg_int(fm, row->identity.field, false, 0, 0, &d->num_identity_experts)) != MOE_OK) {
            return st;
        }
        if (d->num_identity_experts > (int64_t)1 << 24)
            return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s' = %" PRId64 " exceeds libmoe's limit of 2^24",
                                 c->path, fm->prefix, row->identity.field, d->num_identity_experts);
        const char *type = NULL;
        if (row->identity.type_field &&
            (st = moe_cfg_str(fm, row->identity.type_field, NULL, &type)) != MOE_OK)
            return st;
        if (type && d->num_identity_experts > 0 && strcmp(type, row->identity.type_value) != 0)
            return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s%s' = \"%s\": libmoe computes %s zero experts only (the term w * x, "
                                 "LongcatFlashExperts' identity_expert); another zero-expert function is not computed",
                                 c->path, fm->prefix, row->identity.type_field, type, row->identity.type_value);
    }
    if (row->refuse_layers.field) {
        /* DeepSeek-V4: the layers whose router libmoe cannot compute (hash_moe), refused per layer */
        bool present = false;
        if ((st = moe_cfg_index_list_of(f, row->refuse_layers.field, row->refuse_layers.value,
                                        row->refuse_layers.other, c->num_layers, &c->refused_layers,
                                        &c->n_refused_layers, &present)) != MOE_OK)
            return st;
        if (!present) {
            int64_t n = 0;
            if ((st = moe_cfg_int(f, row->refuse_layers.count_field, false, row->refuse_layers.count_default, 0, &n)) !=
                MOE_OK)
                return st;
            n = n < c->num_layers ? n : c->num_layers;
            if (n > 0) {
                if (!(c->refused_layers = malloc((size_t)n * sizeof *c->refused_layers)))
                    return moe_set_error(c->ctx, MOE_ENOMEM, "%s: out of memory", c->path);
                for (int64_t l = 0; l < n; l++)
                    c->refused_layers[l] = l;
                c->n_refused_layers = (size_t)n;
            }
        }
    }
    if (row->refuse_true.field) {
        int on = 0;
        if ((st = moe_cfg_bool(fm, row->refuse_true.field, 0, &on)) != MOE_OK)
            return st;
        if (on)
            return moe_set_error(c->ctx, MOE_EUNSUPPORTED, "%s: field '%s%s' is true: %s, which libmoe does not compute",
                                 c->path, fm->prefix, row->refuse_true.field, row->refuse_true.what);
    }
    if (d->n_group > 1 && d->num_experts > 0) {
        const int64_t E = d->num_experts, G = d->n_group;
        if (E % G != 0)
            return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s' = %" PRId64 " is not a multiple of '%s' = %" PRId64,
                                 c->path, fm->prefix, row->experts_field, E, row->groups.n_group_field, G);
        if (d->topk_group > G || d->topk_group * (E / G) < d->top_k)
            return moe_set_error(c->ctx, MOE_EFORMAT,
                                 "%s: field '%s%s' = %" PRId64 ": must be <= %s = %" PRId64
                                 " and keep at least %s = %" PRId64 " experts (%" PRId64 " per group)",
                                 c->path, fm->prefix, row->groups.topk_group_field, d->topk_group,
                                 row->groups.n_group_field, G, row->top_k_field ? row->top_k_field : "num_experts_per_tok",
                                 d->top_k, E / G);
    }
    return MOE_OK;
}

/* The expert activation: the row's clamped SwiGLU with its alpha and limit fields, or config
 * `hidden_act` (transformers' ACT2FN name; absent means the config classes' default, silu). */
static moe_status config_activation(moe_ck_config *c, const moe_cfg_fields *f)
{
    const moe_fam_row *row = c->row;
    moe_layer_desc *d = &c->desc;
    if (row->activation.rule == MOE_FAM_ACT_CLAMPED_SWIGLU) {
        d->activation = MOE_ACT_SWIGLU_OAI;
        moe_status st = moe_cfg_float(f, row->activation.alpha_field, row->activation.alpha, false, 0.0, &d->swiglu_alpha);
        if (st == MOE_OK)
            st = moe_cfg_float(f, row->activation.limit_field, row->activation.limit, true, 0.0, &d->swiglu_limit);
        return st;
    }
    if (row->activation.rule == MOE_FAM_ACT_SOFTCAPPED_SWIGLU) {
        /* Inkling2SoftcappedSwiGLU: the two softcaps (finite, > 0); hidden_act is not read */
        d->activation = MOE_ACT_SWIGLU_SOFTCAP;
        moe_status st = moe_cfg_float(f, row->activation.alpha_field, row->activation.alpha, true, 0.0, &d->softcap_gate);
        if (st == MOE_OK)
            st = moe_cfg_float(f, row->activation.limit_field, row->activation.limit, true, 0.0, &d->softcap_up);
        return st;
    }
    if (row->activation.rule == MOE_FAM_ACT_NONGATED) {
        /* ACT2FN[mlp_hidden_act] on u = W1 x: the routed experts and the shared MLP alike */
        const char *a = NULL;
        moe_status st = moe_cfg_str(f, row->activation.field, "relu2", &a);
        if (st != MOE_OK)
            return st;
        if (strcmp(a, "relu") == 0)
            d->activation = MOE_ACT_RELU;
        else if (strcmp(a, "relu2") == 0)
            d->activation = MOE_ACT_RELU2;
        else if (strcmp(a, "gelu") == 0)
            d->activation = MOE_ACT_GELU;
        else if (strcmp(a, "gelu_pytorch_tanh") == 0 || strcmp(a, "gelu_new") == 0)
            d->activation = MOE_ACT_GELU_TANH;
        else
            return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s%s' = \"%s\": family %s's experts are non-gated (h = act(W1 x)); "
                                 "libmoe computes relu, relu2, gelu and gelu_pytorch_tanh / gelu_new there",
                                 c->path, c->prefix, row->activation.field, a, row->name);
        return MOE_OK;
    }
    const char *a = NULL;
    const char *field = row->activation.field ? row->activation.field : "hidden_act";
    const char *apre = f->prefix; /* how the message spells the activation field */
    moe_status st = MOE_OK;
    char kpre[200];
    if (row->activation.key) {
        /* DbrxExpertGLU: ACT2FN[ffn_act_fn.get("name", "silu")], ffn_act_fn None -> {"name": "silu"} */
        const json_t *o = json_object_get(f->obj, field);
        a = "silu";
        if (o && !json_is_null(o) && !json_is_object(o))
            return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%s%s' must be an object ({\"%s\": ...}), found %s",
                                 c->path, f->prefix, field, row->activation.key, moe_io_json_found(o));
        snprintf(kpre, sizeof kpre, "%s%s.", f->prefix, field);
        if (o && json_is_object(o)) {
            const moe_cfg_fields fo = {f->ctx, f->path, kpre, o, f->assumed, NULL, 0};
            st = moe_cfg_str(&fo, row->activation.key, "silu", &a);
        } else {
            moe_cfg_note_default(f, field, "{\"%s\": \"silu\"}", row->activation.key);
        }
        apre = kpre;
        field = row->activation.key;
    } else {
        st = moe_cfg_str(f, field, "silu", &a);
    }
    if (st != MOE_OK)
        return st;
    if (row->activation.rule == MOE_FAM_ACT_POSTCLAMP_LAYER_LISTS) {
        /* Step-3.7: act_fn(gate).clamp(max=limit) * up.clamp(+-limit), a limit per layer for the
         * routed and for the shared expert (moe_ck_config_layer_desc); plain SwiGLU where none */
        if (strcmp(a, "silu") != 0 && strcmp(a, "swish") != 0)
            return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s%s' = \"%s\": family %s clamps ACT2FN[hidden_act](gate) after the "
                                 "activation; libmoe computes that clamp for silu / swish only "
                                 "(MOE_ACT_SWIGLU_POSTCLAMP)",
                                 c->path, c->prefix, field, a, row->name);
        d->activation = MOE_ACT_SWIGLU;
        bool present = false;
        if ((st = moe_cfg_limit_list(f, row->activation.limit_field, &c->limits, &c->n_limits, &present)) != MOE_OK)
            return st;
        return moe_cfg_limit_list(f, row->activation.shared_limit_field, &c->limits_shared, &c->n_limits_shared,
                                  &present);
    }
    if (row->activation.rule == MOE_FAM_ACT_SILU_ONLY && strcmp(a, "silu") != 0 && strcmp(a, "swish") != 0)
        return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%shidden_act' = \"%s\": family %s's routed experts are always SiLU-gated "
                             "while its shared expert follows hidden_act; libmoe runs both with one activation, so "
                             "only silu is read",
                             c->path, c->prefix, a, row->name);
    if (row->activation.rule == MOE_FAM_ACT_CLAMPED_SILU) {
        if (strcmp(a, "silu") != 0 && strcmp(a, "swish") != 0)
            return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%shidden_act' = \"%s\": family %s's experts clamp the gate before the "
                                 "activation (GLM-5-Next's routed experts apply silu whatever hidden_act says, its "
                                 "shared expert and DeepSeek-V4's experts apply hidden_act); libmoe computes that clamp "
                                 "for silu only (MOE_ACT_SWIGLU_CLAMP), so only silu / swish is read",
                                 c->path, c->prefix, a, row->name);
        d->activation = MOE_ACT_SWIGLU_CLAMP;
        return moe_cfg_float(f, row->activation.limit_field, row->activation.limit, true, 0.0, &d->swiglu_limit);
    }
    /* hidden_act's function: the experts' one, or (CLAMPED_SILU_OWN_SHARED) the shared expert's */
    const int own_shared = row->activation.rule == MOE_FAM_ACT_CLAMPED_SILU_OWN_SHARED;
    moe_activation *act = own_shared ? &d->shared_activation : &d->activation;
    if (own_shared) {
        /* HY-V4: HYV4Experts._apply_gate clamps and calls F.silu; HYV4MLP applies hidden_act */
        d->activation = MOE_ACT_SWIGLU_CLAMP;
        d->has_shared_activation = d->shared_expert_intermediate_size > 0; /* (config_decoder set I_s) */
        st = moe_cfg_float(f, row->activation.limit_field, row->activation.limit, true, 0.0, &d->swiglu_limit);
        if (st != MOE_OK)
            return st;
    }
    if (strcmp(a, "silu") == 0 || strcmp(a, "swish") == 0)
        *act = MOE_ACT_SWIGLU;
    else if (strcmp(a, "gelu") == 0)
        *act = MOE_ACT_GEGLU;
    else if (strcmp(a, "gelu_pytorch_tanh") == 0 || strcmp(a, "gelu_new") == 0)
        *act = MOE_ACT_GEGLU_TANH;
    else
        return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s%s' = \"%s\": libmoe's experts support silu / swish (SwiGLU), "
                             "gelu and gelu_pytorch_tanh / gelu_new (GEGLU)",
                             c->path, apre, field, a);
    return MOE_OK;
}

/* quantization_config (top level, else in text_config). quant_method "fp8" (FP8 block
 * checkpoints, docs/checkpoints.md) and "mxfp4" (the families whose row has an MXFP4 layout)
 * are read here, "compressed-tensors" by src/io/ckpt_ct.c, "gptq" / "awq" by src/io/ckpt_gptq.c
 * (through ckpt_ct.c); other methods are refused. */
static moe_status config_quant(moe_ck_config *c, const json_t *root, const json_t *cfg)
{
    const char *qpre = "";
    const json_t *qc = json_object_get(root, "quantization_config");
    if ((!qc || json_is_null(qc)) && cfg != root) {
        qc = json_object_get(cfg, "quantization_config");
        qpre = c->prefix;
    }
    if (!qc || json_is_null(qc))
        return MOE_OK;
    if (c->row->float_only) {
        const json_t *qm = json_is_object(qc) ? json_object_get(qc, "quant_method") : NULL;
        return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config' (quant_method %s): %s; dequantize it to bf16 first",
                             c->path, qpre, qm && json_is_string(qm) ? json_string_value(qm) : "not given",
                             c->row->float_only);
    }
    if (!json_is_object(qc))
        return moe_set_error(c->ctx, MOE_EFORMAT, "%s: field '%squantization_config' must be an object, found %s",
                             c->path, qpre, moe_io_json_found(qc));
    const json_t *m = json_object_get(qc, "quant_method");
    if (m && json_is_string(m) && strcmp(json_string_value(m), "mxfp4") == 0) {
        /* transformers' Mxfp4Config: {quant_method, modules_to_not_convert}; which layers are
         * quantized is read from the tensors (*_blocks present or not), so a layer named in
         * modules_to_not_convert and saved in bf16 loads as bf16. */
        if (!c->row->mxfp4.gate_up_blocks) {
            char fams[256]; /* [256] chars: "gpt_oss (GptOssForCausalLM)", the rows with an MXFP4 layout */
            return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.quant_method' = mxfp4: MXFP4 checkpoints are "
                                 "read for %s only, not %s",
                                 c->path, qpre, moe_fam_names_with(MOE_FAM_HAS_MXFP4, ", ", true, fams, sizeof fams),
                                 c->row->name);
        }
        c->mxfp4 = 1;
        moe_log(c->ctx, MOE_LOG_INFO,
                "%s: MXFP4 checkpoint (e2m1 codes, one E8M0 scale per 32 inputs): routed experts run "
                "weight-only (mxfp4) with f32 activations",
                c->path);
        return MOE_OK;
    }
    if (m && json_is_string(m) &&
        (strcmp(json_string_value(m), "compressed-tensors") == 0 || strcmp(json_string_value(m), "gptq") == 0 ||
         strcmp(json_string_value(m), "awq") == 0)) /* gptq / awq: src/io/ckpt_gptq.c through the same reader */
        return moe_ckq_parse(c->ctx, c->path, qpre, qc, &c->ct);
    if (!m || json_is_null(m))
        return MOE_OK; /* no method: nothing quantized */
    if (!json_is_string(m))
        return moe_set_error(c->ctx, MOE_EFORMAT,
                             "%s: field '%squantization_config.quant_method' must be a string (\"fp8\", \"gptq\", ...), "
                             "found %s",
                             c->path, qpre, moe_io_json_found(m));
    if (strcmp(json_string_value(m), "fp8") != 0) {
        char fams[256]; /* [256] chars: "gpt_oss", the rows with an MXFP4 layout */
        /* transformers matches quant_method exactly (quantizers/auto.py looks it up in
         * AUTO_QUANTIZATION_CONFIG_MAPPING as written), so "GPTQ" or "Fp8" is refused there
         * too: libmoe refuses it the same way and names the spelling meant */
        static const char *const methods[] = {"fp8", "mxfp4", "compressed-tensors", "gptq", "awq"};
        const char *mv = json_string_value(m);
        const char *near = moe_suggest(mv, strlen(mv), methods, sizeof methods / sizeof methods[0]);
        char hint[160] = "";
        if (near)
            snprintf(hint, sizeof hint, " (did you mean '%s'? quant_method is matched exactly, as transformers' "
                     "quantizers/auto.py does)", near);
        return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.quant_method' = '%s'%s: libmoe reads fp8 (block, per-tensor), mxfp4 "
                             "(%s), compressed-tensors (int8 / int4 / fp8), gptq (int4 / int8) and awq (int4) checkpoints; dequantize this one to "
                             "bf16 first or convert a bf16 checkpoint with moe quantize",
                             c->path, qpre, mv, hint,
                             moe_fam_names_with(MOE_FAM_HAS_MXFP4, ", ", false, fams, sizeof fams));
    }
    const json_t *fmt = json_object_get(qc, "fmt");
    if (fmt && !json_is_null(fmt) && (!json_is_string(fmt) || strcmp(json_string_value(fmt), "e4m3") != 0))
        return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.fmt' = %s: only e4m3 FP8 checkpoints are supported",
                             c->path, qpre, json_is_string(fmt) ? json_string_value(fmt) : moe_io_json_found(fmt));
    const json_t *as = json_object_get(qc, "activation_scheme");
    if (as && !json_is_null(as) && (!json_is_string(as) || strcasecmp(json_string_value(as), "dynamic") != 0))
        return moe_set_error(c->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.activation_scheme' = %s: only dynamic is supported (static "
                             "FP8 activation scales, transformers' activation_scale / vLLM's input_scale tensors, are "
                             "not read for quant_method fp8; compressed-tensors static FP8 (input_scale per linear) "
                             "loads as fp8-tensor-static / fp8-channel-static)",
                             c->path, qpre, json_is_string(as) ? json_string_value(as) : moe_io_json_found(as));
    const json_t *bs = json_object_get(qc, "weight_block_size");
    if (!bs || json_is_null(bs)) {
        /* per-tensor FP8 (FineGrainedFP8Config weight_block_size None): one scalar scale per matrix */
        c->fp8 = 1;
        c->fp8_bn = c->fp8_bk = 0;
        moe_log(c->ctx, MOE_LOG_INFO,
                "%s: FP8 per-tensor checkpoint (e4m3, weight_block_size %s: one scale per matrix): routed experts "
                "run weight-only (fp8-tensor) with f32 activations",
                c->path, bs ? "null" : "absent");
        return MOE_OK;
    }
    int64_t b[2] = {0, 0};
    bool ok = json_is_array(bs) && json_array_size(bs) == 2;
    for (size_t i = 0; ok && i < 2; i++) {
        const json_t *x = json_array_get(bs, i);
        ok = json_is_integer(x) && json_integer_value(x) >= 1 && json_integer_value(x) <= ((json_int_t)1 << 20);
        if (ok)
            b[i] = (int64_t)json_integer_value(x);
    }
    if (!ok)
        return moe_set_error(c->ctx, MOE_EFORMAT,
                             "%s: field '%squantization_config.weight_block_size' must be [bn, bk], two integers "
                             "in 1..1048576",
                             c->path, qpre);
    c->fp8 = 1;
    c->fp8_bn = b[0];
    c->fp8_bk = b[1];
    /* The checkpoint's dynamic activation scheme (e4m3 activations, one scale per token per
     * bk channels) is run weight-only: f32 activations times the exactly dequantized weights,
     * which is more exact than the fp8 x fp8 products the model was served with. */
    moe_log(c->ctx, MOE_LOG_INFO,
            "%s: FP8 block checkpoint (e4m3, %" PRId64 "x%" PRId64 " blocks): routed experts run weight-only "
            "(fp8-block); the checkpoint's dynamic activation scheme is run with f32 activations, which is "
            "more exact",
            c->path, b[0], b[1]);
    return MOE_OK;
}

/* The object at `path` ("a.b.", each key followed by a dot) under root, or NULL when path is
 * NULL or one of its keys is absent or not an object. */
static const json_t *config_nested(const json_t *root, const char *path)
{
    const json_t *o = root;
    char key[64];
    for (const char *p = path, *dot; p && *p; p = dot + 1) {
        if (!(dot = strchr(p, '.')) || (size_t)(dot - p) >= sizeof key)
            return NULL;
        memcpy(key, p, (size_t)(dot - p));
        key[dot - p] = '\0';
        if (!(o = json_object_get(o, key)) || !json_is_object(o))
            return NULL;
    }
    return path && *path ? o : NULL;
}

/* The WARNING of a checkpoint read as family c->row although config.json names `arch` /
 * `model_type` (family `named`, or none libmoe knows): both, and the defaults assumed. */
static void warn_family(const moe_ck_config *c, const char *arch, const char *model_type, const moe_fam_row *named,
                        const moe_cfg_assumed *assumed)
{
    char what[200];
    if (named)
        snprintf(what, sizeof what, "family %s", named->name);
    else
        snprintf(what, sizeof what, "%s", arch || model_type ? "a family libmoe does not know" : "no family");
    moe_log(c->ctx, MOE_LOG_WARN,
            "%s: names architecture '%s' (model_type '%s'), %s; reading it as family %s, as asked "
            "(--family, moe_checkpoint_options.family); %s%s%s%s",
            c->path, arch ? arch : "(none)", model_type ? model_type : "(none)", what, c->row->name,
            assumed->n ? "config fields absent, so taking family " : "no config field was absent (no default assumed)",
            assumed->n ? c->row->name : "", assumed->n ? "'s defaults: " : "", assumed->n ? assumed->text : "");
}

moe_status moe_ck_config_parse(moe_ctx *ctx, const char *path, const json_t *root, const char *family,
                               const char *expert_set, moe_ck_config *c)
{
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->path = path;
    c->prefix = "";
    const char *arch = NULL, *model_type = NULL;
    const moe_fam_row *named = NULL;
    moe_status st = config_family(c, root, family, &arch, &model_type, &named);
    if (st != MOE_OK)
        return st;
    /* the expert set of a modality-isolated block (ERNIE-4.5-VL): the row's first unless named */
    c->set = moe_fam_expert_set_of(c->row, expert_set);
    if (expert_set && !c->set) {
        char sets[64];
        moe_fam_expert_set_names(c->row, sets, sizeof sets);
        if (!sets[0])
            return moe_set_error(ctx, MOE_EINVAL,
                                 "%s: expert set '%s' asked for (moe_checkpoint_options.expert_set, --experts), but "
                                 "family %s's MoE block has one set of experts; expert sets are read for "
                                 "ernie4_5_vl_moe (text, vision)",
                                 path, expert_set, c->row->name);
        return moe_set_error(ctx, MOE_EINVAL,
                             "%s: unknown expert set '%s' (moe_checkpoint_options.expert_set, --experts) of family %s: "
                             "its sets are %s",
                             path, expert_set, c->row->name, sets);
    }
    moe_cfg_assumed assumed;
    memset(&assumed, 0, sizeof assumed);
    const bool forced = family && named != c->row;
    const json_t *cfg = root;
    const json_t *tc = json_object_get(root, "text_config");
    const json_t *nested = config_nested(root, c->row->config_path);
    if (nested) {
        cfg = nested;
        c->prefix = c->row->config_path;
    } else if (tc && json_is_object(tc) && c->row->text_config) {
        cfg = tc;
        c->prefix = "text_config.";
    }
    size_t n_alias = 0;
    while (n_alias < MOE_FAM_MAX_ALIASES && c->row->aliases[n_alias][0])
        n_alias++;
    const moe_cfg_fields f = {ctx, path, c->prefix, cfg, forced ? &assumed : NULL, c->row->aliases, n_alias};
    /* the MoE block's fields: the decoder's object, or the row's sub-object of it (DBRX's ffn_config) */
    const json_t *mo = cfg;
    if (c->row->moe_object) {
        snprintf(c->moe_prefix, sizeof c->moe_prefix, "%s%s.", c->prefix, c->row->moe_object);
        mo = json_object_get(cfg, c->row->moe_object);
        if (mo && !json_is_null(mo) && !json_is_object(mo))
            return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s%s' must be an object (%s's MoE fields), found %s",
                                 path, c->prefix, c->row->moe_object, c->row->name, moe_io_json_found(mo));
        if (!mo || json_is_null(mo)) { /* the sub-config class's defaults, field by field */
            if (!(c->moe_empty = json_object()))
                return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
            mo = c->moe_empty;
        }
    }
    const moe_cfg_fields fm = {ctx, path, c->row->moe_object ? c->moe_prefix : c->prefix, mo,
                               forced ? &assumed : NULL, c->row->aliases, n_alias};
    moe_layer_desc *d = &c->desc;
    moe_layer_desc_init(d);
    moe_fam_layer_defaults(c->row, d);
    c->layer_step = 1;
    /* a multimodal wrapper without its text_config object: transformers would build the text
     * model from the text config class's defaults, which libmoe does not guess; say where
     * the fields were looked for */
    if (c->row->text_config && cfg == root && !json_object_get(root, "hidden_size"))
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: %s keeps its text model's fields (hidden_size, the experts, top-k) in "
                             "'text_config', which this config.json does not have (%s), nor are they at the top "
                             "level: add the text_config object save_pretrained writes",
                             path, c->row->name, tc ? "not an object" : "absent");
    if ((st = moe_cfg_int(&f, "hidden_size", true, 0, 1, &d->hidden_size)) != MOE_OK ||
        (st = c->row->layers.rule == MOE_FAM_LAYERS_BLOCK_TYPES
                  ? config_block_types(c, &f)
                  : moe_cfg_int(&f, c->row->num_layers_field ? c->row->num_layers_field : "num_hidden_layers", true,
                                0, 1, &c->num_layers)) != MOE_OK)
        return st;
    if (c->num_layers > MOE_MAX_LAYERS)
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: field '%s%s' = %" PRId64 " exceeds libmoe's limit of %" PRId64
                             " layers (MOE_MAX_LAYERS, 2^20)",
                             path, c->prefix, c->row->num_layers_field ? c->row->num_layers_field : "num_hidden_layers",
                             c->num_layers, MOE_MAX_LAYERS);
    /* K: num_experts_per_tok, or the row's own field (then its alias: num_experts_per_tok
     * unless the row names another) */
    const char *k_field = c->row->top_k_field ? c->row->top_k_field : "num_experts_per_tok";
    const char *k_alias = c->row->top_k_alias ? c->row->top_k_alias : c->row->top_k_field ? "num_experts_per_tok" : NULL;
    if (k_alias && !json_object_get(mo, k_field) && json_object_get(mo, k_alias))
        k_field = k_alias;
    st = c->row->top_k_default > 0 ? moe_cfg_int(&fm, k_field, false, c->row->top_k_default, 1, &d->top_k)
         : c->row->per_layer_lists ? moe_cfg_int_uniform(&fm, k_field, k_alias, 1, c->num_layers, &d->top_k)
         : k_alias                 ? moe_cfg_int_alias(&fm, k_field, k_alias, 1, &d->top_k)
                                   : moe_cfg_int(&fm, k_field, true, 0, 1, &d->top_k);
    if (st != MOE_OK || (st = config_decoder(c, &f, &fm)) != MOE_OK || (st = config_activation(c, &fm)) != MOE_OK ||
        (st = config_quant(c, root, cfg)) != MOE_OK)
        return st;
    if (d->num_experts > 0 && d->top_k > d->num_experts + d->num_identity_experts)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s%s' = %" PRId64 " exceeds the %" PRId64 " experts%s", path,
                             fm.prefix, k_field, d->top_k, d->num_experts + d->num_identity_experts,
                             d->num_identity_experts ? " (routed and identity)" : "");
    /* the sparsemixer (Phi-MoE's PhimoeSparseMoeBlock: sparsemixer()) takes the top 1 and then the
     * top 1 of the rest: K = 2 whatever the config says; named here as the config's field */
    if (d->scoring_func == MOE_SCORING_SPARSEMIXER && d->top_k != 2)
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: field '%s%s' = %" PRId64 ": %s routes with the sparsemixer, which selects exactly 2 "
                             "experts per token (PhimoeSparseMoeBlock); give 2",
                             path, c->prefix, k_field, d->top_k, c->row->name);
    if (!moe_activation_gated(d->activation) && (c->fp8 || c->ct || c->mxfp4))
        /* src/io's quantized layouts (fp8 block, compressed-tensors, GPTQ, AWQ, MXFP4) are read
         * with a gate projection per expert */
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: family %s has non-gated experts (moe_activation %d: up_proj, down_proj, no gate_proj) "
                             "and config.json has a quantization_config: libmoe does not read quantized non-gated "
                             "checkpoints (fp8, compressed-tensors, GPTQ, AWQ, MXFP4); load the f32 / bf16 "
                             "checkpoint and quantize with the plan (moe_layer_desc.quant) instead",
                             path, c->row->name, (int)d->activation);
    if (moe_fam_flat_experts(c->row) && (c->fp8 || c->ct || c->mxfp4))
        /* the experts are 2-D concatenations ([E I, H]) that no quantized format libmoe reads has */
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: family %s stores its experts as [E I, H] concatenations (%s, %s, %s) and config.json "
                             "has a quantization_config: libmoe reads no quantized checkpoint in that layout (fp8, "
                             "compressed-tensors, GPTQ, AWQ, MXFP4); load the f32 / bf16 checkpoint and quantize with "
                             "the plan (moe_layer_desc.quant) instead",
                             path, c->row->name, c->row->stacked[0].gate_up, c->row->stacked[0].up,
                             c->row->stacked[0].down);
    if (forced)
        warn_family(c, arch, model_type, named, &assumed);
    return MOE_OK;
}

void moe_ck_config_free(moe_ck_config *c)
{
    if (!c)
        return;
    free(c->layer_list);
    free(c->limits);
    free(c->limits_shared);
    free(c->refused_layers);
    moe_ckq_free(c->ct);
    if (c->moe_empty)
        json_decref(c->moe_empty);
    c->moe_empty = NULL;
    c->layer_list = NULL;
    c->limits = c->limits_shared = NULL;
    c->refused_layers = NULL;
    c->ct = NULL;
}

int moe_ck_config_layer_refused(const moe_ck_config *c, int64_t layer)
{
    for (size_t i = 0; i < c->n_refused_layers; i++)
        if (c->refused_layers[i] == layer)
            return 1;
    return 0;
}

void moe_ck_config_layer_desc(const moe_ck_config *c, int64_t layer, moe_layer_desc *d)
{
    if (c->row->activation.rule != MOE_FAM_ACT_POSTCLAMP_LAYER_LISTS)
        return;
    /* Step3p7SparseMoeBlock: swiglu_limits[L] or None -> inf; Step3p7MLP: swiglu_limits_shared[L]
     * or 0 -> inf: no clamp is plain SwiGLU */
    const float lr = layer >= 0 && (size_t)layer < c->n_limits ? c->limits[layer] : 0.0f;
    const float ls = layer >= 0 && (size_t)layer < c->n_limits_shared ? c->limits_shared[layer] : 0.0f;
    const int has_shared = d->shared_expert_intermediate_size > 0;
    d->activation = lr > 0.0f ? MOE_ACT_SWIGLU_POSTCLAMP : MOE_ACT_SWIGLU;
    d->swiglu_limit = lr > 0.0f ? lr : 7.0f; /* moe_layer_desc_init's when unread */
    d->has_shared_activation = 0;
    d->shared_activation = MOE_ACT_SWIGLU;
    d->shared_swiglu_limit = 0.0f;
    if (!has_shared)
        return;
    if ((ls > 0.0f) != (lr > 0.0f)) { /* one of the two clamps: the shared expert's activation of its own */
        d->has_shared_activation = 1;
        d->shared_activation = ls > 0.0f ? MOE_ACT_SWIGLU_POSTCLAMP : MOE_ACT_SWIGLU;
    }
    if (ls > 0.0f)
        d->shared_swiglu_limit = ls;
}

/* 1 if `layer` is in the row's layer list (sorted by config_layer_rule). */
static int listed(const moe_ck_config *c, int64_t layer)
{
    return c->n_layer_list && bsearch(&layer, c->layer_list, c->n_layer_list, sizeof *c->layer_list, cmp_i64);
}

int moe_ck_config_is_moe_layer(const moe_ck_config *c, int64_t layer)
{
    if (layer < 0 || layer >= c->num_layers || c->desc.num_experts <= 0)
        return 0;
    switch (c->row->layers.rule) {
    case MOE_FAM_LAYERS_EVERY: return 1;
    case MOE_FAM_LAYERS_SPARSE_STEP: return !listed(c, layer) && (layer + 1) % c->layer_step == 0;
    case MOE_FAM_LAYERS_DENSE_PREFIX: return layer >= c->layer_first && layer % c->layer_step == 0;
    case MOE_FAM_LAYERS_LISTED_ELSE_STEP:
        return c->have_layer_list ? listed(c, layer) : (layer + 1) % c->layer_step == 0;
    case MOE_FAM_LAYERS_TYPES_ELSE_PREFIX:
        return c->have_layer_list ? listed(c, layer) : layer >= c->layer_first && layer % c->layer_step == 0;
    case MOE_FAM_LAYERS_PERIOD_OFFSET: return c->desc.num_experts > 1 && layer % c->layer_step == c->layer_first;
    case MOE_FAM_LAYERS_INTERVAL_RANGE:
        return (layer + 1) % c->layer_step == 0 && layer >= c->layer_first && layer <= c->layer_last;
    case MOE_FAM_LAYERS_BLOCK_TYPES: return listed(c, layer);
    }
    return 0;
}

void moe_ck_config_dense_reason(const moe_ck_config *c, int64_t layer, char *why, size_t n)
{
    const moe_fam_row *row = c->row;
    const char *pre = c->prefix;
    /* every rule's layers are dense without experts (the only way under MOE_FAM_LAYERS_EVERY) */
    if (c->desc.num_experts == 0 || row->layers.rule == MOE_FAM_LAYERS_EVERY) {
        snprintf(why, n, "%s%s is 0", pre, row->experts_field);
    } else if (row->layers.rule == MOE_FAM_LAYERS_DENSE_PREFIX) {
        if (layer < c->layer_first)
            snprintf(why, n, "layer %" PRId64 " < %s%s = %" PRId64, layer, pre, row->layers.first_field, c->layer_first);
        else
            snprintf(why, n, "layer %" PRId64 " %% %s%s = %" PRId64 " != 0", layer, pre, row->layers.step_field,
                     c->layer_step);
    } else if (row->layers.rule == MOE_FAM_LAYERS_INTERVAL_RANGE) {
        if (layer < c->layer_first)
            snprintf(why, n, "layer %" PRId64 " < %s%s = %" PRId64, layer, pre, row->layers.first_field, c->layer_first);
        else if (layer > c->layer_last)
            snprintf(why, n, "layer %" PRId64 " > %s%s = %" PRId64, layer, pre, row->layers.last_field, c->layer_last);
        else
            snprintf(why, n, "(layer + 1) %% %s%s = (%" PRId64 " + 1) %% %" PRId64 " != 0", pre, row->layers.step_field,
                     layer, c->layer_step);
    } else if (row->layers.rule == MOE_FAM_LAYERS_PERIOD_OFFSET) {
        if (c->desc.num_experts == 1)
            snprintf(why, n, "%s%s is 1 (one expert is a dense MLP)", pre, row->experts_field);
        else
            snprintf(why, n, "layer %" PRId64 " %% %s%s = %" PRId64 " != %s%s = %" PRId64, layer, pre,
                     row->layers.step_field, layer % c->layer_step, pre, row->layers.first_field, c->layer_first);
    } else if (row->layers.rule == MOE_FAM_LAYERS_TYPES_ELSE_PREFIX) {
        if (c->layer_list_from_step && layer < c->layer_first)
            snprintf(why, n, "layer %" PRId64 " < %s%s = %" PRId64 " (%s%s absent)", layer, pre,
                     row->layers.first_field, c->layer_first, pre, row->layers.list_field);
        else if (c->layer_list_from_step)
            snprintf(why, n, "%s%s[%" PRId64 "] is false (%s%s absent)", pre, row->layers.step_field, layer, pre,
                     row->layers.list_field);
        else if (c->have_layer_list)
            snprintf(why, n, "%s%s[%" PRId64 "] is not \"sparse\"", pre, row->layers.list_field, layer);
        else if (layer >= c->layer_first && row->layers.step_field)
            snprintf(why, n, "layer %" PRId64 " %% %s%s = %" PRId64 " != 0 (%s%s absent)", layer, pre,
                     row->layers.step_field, c->layer_step, pre, row->layers.list_field);
        else
            snprintf(why, n, "layer %" PRId64 " < %s%s = %" PRId64 " (%s%s absent)", layer, pre,
                     row->layers.first_field ? row->layers.first_field : "the first MoE layer", c->layer_first, pre,
                     row->layers.list_field);
    } else if (row->layers.rule == MOE_FAM_LAYERS_BLOCK_TYPES) {
        if (c->have_layer_list)
            snprintf(why, n, "its entry of %s%s (or %s%s) is not \"moe\" ('E')", pre, row->layers.list_field, pre,
                     row->layers.pattern_field ? row->layers.pattern_field : row->layers.list_field);
        else
            snprintf(why, n, "it is not an MoE layer of the config class's default %s", row->layers.list_field);
    } else if (row->layers.rule == MOE_FAM_LAYERS_LISTED_ELSE_STEP && c->have_layer_list) {
        snprintf(why, n, "it is not listed in %s%s", pre, row->layers.list_field);
    } else if (row->layers.rule == MOE_FAM_LAYERS_SPARSE_STEP && listed(c, layer)) {
        snprintf(why, n, "it is listed in %s%s", pre, row->layers.list_field);
    } else {
        snprintf(why, n, "(layer + 1) %% %s%s = (%" PRId64 " + 1) %% %" PRId64 " != 0", pre, row->layers.step_field,
                 layer, c->layer_step);
    }
}
