/* One shard of `moe quantize`: each tensor of an input safetensors file is either a routed
 * expert linear of a selected MoE layer, quantized with moe_quantize_matrix into the names of
 * the job's format (docs/checkpoints.md "Writing"), or copied as it is. Memory: one expert
 * tensor in f32 at a time plus the quantized tensors of the shard being written. */
#include "core/mem.h"
#include "io/quantize_shard.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layer number L of the last "layers.<L>." of name that starts before x. 1 when there is
 * one. */
static int layer_before(const char *name, const char *x, int64_t *layer)
{
    const char *l = NULL;
    for (const char *s = name; (s = strstr(s, "layers.")) && s < x; s++)
        l = s;
    if (!l)
        return 0;
    char *end;
    long long v = strtoll(l + strlen("layers."), &end, 10);
    if (end == l + strlen("layers.") || *end != '.')
        return 0;
    *layer = v;
    return 1;
}

/* A routed expert linear: "<P>experts.<e>.<proj>.weight" with proj one of the per-expert names,
 * and the layer number L from the last "layers.<L>." of P. 1 when `name` is one. */
static int expert_linear(const char *name, int64_t *layer)
{
    static const char *const projs[] = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"};
    const char *x = strstr(name, ".experts.");
    if (!x)
        return 0;
    const char *p = x + strlen(".experts.");
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p++ != '.')
        return 0;
    int hit = 0;
    for (size_t i = 0; i < sizeof projs / sizeof projs[0]; i++) {
        size_t n = strlen(projs[i]);
        if (strncmp(p, projs[i], n) == 0 && strcmp(p + n, ".weight") == 0)
            hit = 1;
    }
    if (!hit)
        return 0;
    return layer_before(name, x, layer);
}

/* A stacked input-major expert tensor "<P>experts.gate_up_proj" (*which 0) or
 * "<P>experts.down_proj" (*which 1) of gpt-oss / Llama-4, and the layer number L from the last
 * "layers.<L>." of P. 1 when `name` is one. */
static int stacked_linear(const char *name, int64_t *layer, int *which)
{
    const char *x = strstr(name, ".experts.");
    if (!x)
        return 0;
    const char *p = x + strlen(".experts.");
    if (strcmp(p, "gate_up_proj") == 0)
        *which = 0;
    else if (strcmp(p, "down_proj") == 0)
        *which = 1;
    else
        return 0;
    return layer_before(name, x, layer);
}

/* The output tensors of one shard under construction. */
typedef struct qw_shard {
    moe_tensor_out *t;   /* [n] */
    size_t n, cap;
    void **bufs;         /* [nb] owned buffers */
    size_t nb, capb;
} qw_shard;

static moe_tensor_out *shard_add(qw_shard *s)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? 2 * s->cap : 256;
        moe_tensor_out *p = realloc(s->t, c * sizeof *p);
        if (!p)
            return NULL;
        s->t = p;
        s->cap = c;
    }
    moe_tensor_out *o = &s->t[s->n++];
    memset(o, 0, sizeof *o);
    return o;
}

/* An owned zeroed buffer of n bytes kept until the shard is written; its name too. */
static void *shard_buf(qw_shard *s, size_t n)
{
    if (s->nb == s->capb) {
        size_t c = s->capb ? 2 * s->capb : 256;
        void **p = realloc(s->bufs, c * sizeof *p);
        if (!p)
            return NULL;
        s->bufs = p;
        s->capb = c;
    }
    void *b = calloc(1, n ? n : 1);
    if (b)
        s->bufs[s->nb++] = b;
    return b;
}

static void shard_clear(qw_shard *s)
{
    for (size_t i = 0; i < s->nb; i++)
        free(s->bufs[i]);
    s->nb = 0;
    s->n = 0;
}

static char *shard_name(qw_shard *s, const char *base, const char *suffix)
{
    size_t n = strlen(base) + strlen(suffix) + 1;
    char *p = shard_buf(s, n);
    if (p)
        snprintf(p, n, "%s%s", base, suffix);
    return p;
}

void moe_qw_progress(const qw_job *j, const char *fmt, ...)
{
    if (!j->opt->progress)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    moe_escape_controls(msg, sizeof msg);
    j->opt->progress(msg, j->opt->progress_user);
}

/* Element i of a F32 / BF16 / F16 tensor, in f32 (exact). */
static float elem_f32(const moe_tensor_info *t, size_t i)
{
    const uint8_t *src = t->data;
    if (t->dtype == MOE_DTYPE_F32) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, src + 2 * i, 2);
    return t->dtype == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
}

/* Refuse a non-finite expert weight: int codes cannot hold NaN / Inf (moe_quantize_matrix would
 * turn a NaN into code 0, and an Inf makes its cell's absmax scale Inf, so every weight of that
 * scale cell decodes to NaN), so the output would silently differ from the input. w is f32
 * [N, K] (expert `e` of `name` for stacked tensors, e < 0 otherwise). MOE_EINVAL naming the
 * tensor, the count and the first [n, k]. */
static moe_status check_finite(qw_job *j, const char *path, const char *name, int64_t e, const float *w, int64_t N,
                               int64_t K)
{
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < N * K; i++)
        if (!isfinite(w[i]) && bad++ == 0)
            first = i;
    if (bad == 0)
        return MOE_OK;
    char where[48] = "";
    if (e >= 0)
        snprintf(where, sizeof where, " (expert %" PRId64 ")", e);
    return moe_set_error(j->ctx, MOE_EINVAL,
                         "%s: tensor '%s'%s has %" PRId64 " non-finite value(s) (the first, %g, at [n, k] = [%" PRId64
                         ", %" PRId64 "] of the [%" PRId64 ", %" PRId64 "] = [out, in] matrix): %s cannot represent "
                         "NaN / Inf weights (a NaN would become 0, an Inf would turn its whole scale cell into NaN); "
                         "fix the input checkpoint",
                         path, name, where, bad, (double)w[first], first / K, first % K, N, K, moe_quant_name(&j->q));
}

/* Refuse tensor `name` of `path` before allocating for it when its f32 copy [N, K] and
 * `out_bytes` of quantized output buffers do not fit in the memory left (core/mem.c): the
 * message gives both sizes instead of the OOM killer ending the run. */
static moe_status tensor_fits(qw_job *j, const char *path, const char *name, int64_t N, int64_t K, uint64_t out_bytes)
{
    char what[400];
    snprintf(what, sizeof what, "%s: quantizing tensor '%s' (its f32 copy and its codes and scales)", path, name);
    return moe_mem_check(j->ctx, sizeof(float) * (uint64_t)N * (uint64_t)K + out_bytes, what);
}

/* Output buffers of one [N, K] matrix in the job's format, counted twice (quantize_f32's
 * codes, scales, zero points and their copy in the shard); 0 when it cannot be quantized
 * (quantize_f32 says why). */
static uint64_t matrix_out_bytes(const qw_job *j, int64_t N, int64_t K)
{
    size_t cb, sb, zb;
    if (moe_quantize_matrix_sizes(&j->q.w13, N, K, &cb, &sb, &zb) != MOE_OK)
        return 0;
    return 2 * ((uint64_t)cb + sb + zb);
}

/* Quantize one expert linear w (f32 [N, K], the weight "<base>.weight", `in_bytes` bytes in
 * the input) into shard s under the names of the job's format. */
static moe_status quantize_f32(qw_job *j, qw_shard *s, const char *path, const char *base, const float *w, int64_t N,
                               int64_t K, size_t in_bytes)
{
    const moe_qweight *qw = &j->q.w13;
    size_t cb, sb, zb;
    if (moe_quantize_matrix_sizes(qw, N, K, &cb, &sb, &zb) != MOE_OK)
        return moe_set_error(j->ctx, MOE_ESHAPE, "%s: tensor '%s.weight' [%" PRId64 ", %" PRId64 "] cannot be quantized "
                             "to %s", path, base, N, K, moe_quant_name(&j->q));
    if (j->ct && qw->scale == MOE_QSCALE_GROUP && K % qw->group_size != 0)
        return moe_set_error(j->ctx, MOE_ESHAPE,
                             "%s: tensor '%s.weight': input size %" PRId64 " is not a multiple of the group size %" PRId64
                             " (compressed-tensors and vLLM need whole groups); use a smaller group",
                             path, base, K, qw->group_size);
    char wname[320];
    snprintf(wname, sizeof wname, "%s.weight", base);
    moe_status fin = check_finite(j, path, wname, -1, w, N, K);
    if (fin != MOE_OK)
        return fin;
    uint8_t *codes = malloc(cb ? cb : 1), *zero = malloc(zb ? zb : 1);
    float *scale = malloc(sb ? sb : 1);
    if (!codes || !zero || !scale) {
        free(codes), free(zero), free(scale);
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s.weight'", path, base);
    }
    moe_status st = moe_quantize_matrix(qw, w, N, K, codes, scale, zero);
    if (st != MOE_OK) {
        free(codes), free(zero), free(scale);
        return moe_set_error(j->ctx, st, "%s: tensor '%s.weight': quantization failed", path, base);
    }
    moe_tensor_out *o;
    st = MOE_ENOMEM;
    int64_t rows = 1, cols = 1; /* the scale grid */
    if (qw->scale == MOE_QSCALE_BLOCK) {
        rows = (N + qw->block_n - 1) / qw->block_n;
        cols = (K + qw->block_k - 1) / qw->block_k;
    } else if (qw->scale == MOE_QSCALE_GROUP) {
        rows = N;
        cols = (K + qw->group_size - 1) / qw->group_size;
    } else if (qw->scale == MOE_QSCALE_CHANNEL) {
        rows = N;
    }
    const bool fp8 = qw->dtype == MOE_QTYPE_F8_E4M3;
    float *sc = shard_buf(s, sb);
    if (!sc)
        goto done;
    memcpy(sc, scale, sb);
    if (!j->ct || j->q.act == MOE_QACT_TOKEN || fp8) {
        /* FP8 block: weight F8_E4M3 [N, K], weight_scale_inv F32 [ceil(N/bn), ceil(K/bk)];
         * compressed-tensors float-quantized: weight F8_E4M3 [N, K], weight_scale F32 [1]
         * (tensor) or [N, 1] (channel); int-quantized: weight I8 [N, K] (q), weight_scale F32
         * [N, 1] (channel scales) */
        uint8_t *c = shard_buf(s, cb);
        const char *wn = shard_name(s, base, ".weight");
        if (!c || !wn || !(o = shard_add(s)))
            goto done;
        memcpy(c, codes, cb);
        *o = (moe_tensor_out){.name = wn, .dtype = fp8 ? MOE_DTYPE_F8_E4M3 : MOE_DTYPE_I8, .ndim = 2, .shape = {N, K},
                              .data = c};
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, !j->ct ? ".weight_scale_inv" : ".weight_scale")))
            goto done;
        o->dtype = MOE_DTYPE_F32, o->ndim = 2, o->shape[0] = rows, o->shape[1] = cols, o->data = sc;
        if (qw->scale == MOE_QSCALE_TENSOR)
            o->ndim = 1; /* [1], as llm-compressor writes a per-tensor scale */
        j->stats->output_code_bytes += cb;
    } else {
        /* pack-quantized: weight_packed I32 [N, ceil(K / per)], stored q + 2^(b-1), rows padded
         * with zero bits; weight_scale F32 [N, cols]; weight_shape I64 [2] */
        const int bits = qw->dtype == MOE_QTYPE_INT4 ? 4 : 8;
        const int64_t per = 32 / bits, words = (K + per - 1) / per;
        const size_t row_in = bits == 4 ? (size_t)K / 2 : (size_t)K, row_out = (size_t)words * 4;
        const uint8_t flip = bits == 8 ? 0x80 : (qw->has_zero_point ? 0x00 : 0x88);
        uint8_t *c = shard_buf(s, (size_t)N * row_out); /* [N, words] int32, little-endian */
        if (!c)
            goto done;
        for (int64_t n = 0; n < N; n++)
            for (size_t b = 0; b < row_in; b++)
                c[(size_t)n * row_out + b] = codes[(size_t)n * row_in + b] ^ flip;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_packed")))
            goto done;
        o->dtype = MOE_DTYPE_I32, o->ndim = 2, o->shape[0] = N, o->shape[1] = words, o->data = c;
        j->stats->output_code_bytes += (uint64_t)N * row_out;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_scale")))
            goto done;
        o->dtype = MOE_DTYPE_F32, o->ndim = 2, o->shape[0] = rows, o->shape[1] = cols, o->data = sc;
        int64_t *shape = shard_buf(s, 2 * sizeof(int64_t));
        if (!shape || !(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_shape")))
            goto done;
        shape[0] = N, shape[1] = K;
        o->dtype = MOE_DTYPE_I64, o->ndim = 1, o->shape[0] = 2, o->data = shape;
        j->stats->output_scale_bytes += 2 * sizeof(int64_t);
        if (qw->has_zero_point) {
            /* weight_zero_point I32 [ceil(N/8), cols]: zero nibble z (= zp + 8) of row n at bits
             * 4 (n % 8) of word (n / 8, g) */
            const int64_t zr = (N + 7) / 8;
            uint32_t *zw = shard_buf(s, sizeof(uint32_t) * (size_t)(zr * cols));
            if (!zw || !(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_zero_point")))
                goto done;
            for (int64_t n = 0; n < N; n++)
                for (int64_t g = 0; g < cols; g++)
                    zw[(n / 8) * cols + g] |= (uint32_t)(zero[n * cols + g] & 15u) << (4 * (n % 8));
            /* the file is little-endian: store the words byte by byte */
            uint8_t *zb8 = (uint8_t *)zw;
            for (int64_t i = 0; i < zr * cols; i++) {
                uint32_t v = zw[i];
                zb8[4 * i] = (uint8_t)v, zb8[4 * i + 1] = (uint8_t)(v >> 8), zb8[4 * i + 2] = (uint8_t)(v >> 16),
                         zb8[4 * i + 3] = (uint8_t)(v >> 24);
            }
            o->dtype = MOE_DTYPE_I32, o->ndim = 2, o->shape[0] = zr, o->shape[1] = cols, o->data = zw;
            j->stats->output_zero_bytes += sizeof(uint32_t) * (size_t)(zr * cols);
        }
    }
    j->stats->output_scale_bytes += sb;
    j->stats->input_expert_bytes += in_bytes;
    j->stats->expert_tensors++;
    st = MOE_OK;
done:
    free(codes), free(zero), free(scale);
    if (st != MOE_OK)
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory writing tensor '%s.weight'", path, base);
    return MOE_OK;
}

/* Quantize one per-expert linear t ("<base>.weight", [N, K] F32 / BF16 / F16) into shard s. */
static moe_status quantize_linear(qw_job *j, qw_shard *s, const char *path, const moe_tensor_info *t)
{
    const int64_t N = t->shape[0], K = t->shape[1];
    moe_status fit = tensor_fits(j, path, t->name, N, K, matrix_out_bytes(j, N, K));
    if (fit != MOE_OK)
        return fit;
    float *w = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] f32: one tensor at a time */
    if (!w)
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s' (%zu bytes in f32)", path, t->name,
                             sizeof(float) * (size_t)(N * K));
    for (int64_t i = 0; i < N * K; i++)
        w[i] = elem_f32(t, (size_t)i);
    char base[300];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    moe_status st = quantize_f32(j, s, path, base, w, N, K, t->nbytes);
    free(w);
    return st;
}

/* Quantize a stacked input-major expert tensor t of layer `layer` (docs/checkpoints.md):
 * "<P>experts.gate_up_proj" [E, H, 2I] (which 0; gpt-oss: gate = even columns, Llama-4: gate =
 * the first I) or "<P>experts.down_proj" [E, I, H] (which 1). Expert e's linear is column-major
 * there: output n is column n. Written as
 *  - mxfp4 (gpt-oss, the released openai/gpt-oss layout the MXFP4 loader reads):
 *    "<P>experts.gate_up_proj_blocks" U8 [E, 2I, H/32, 16] + "_scales" U8 [E, 2I, H/32] (row n
 *    = column n of the bf16 tensor, so gate / up stay interleaved as in the input), and
 *    "<P>experts.down_proj_blocks" U8 [E, H, I/32, 16] + "_scales" U8 [E, H, I/32]: per expert
 *    moe_quantize_matrix's MXFP4 codes [N, K/2] (low nibble = even k) and E8M0 exponents;
 *  - otherwise (Llama-4) per expert: "<P>experts.<e>.{gate,up,down}_proj" [N, K] in the job's
 *    format, as llm-compressor saves Llama-4 (one Linear per expert) and vLLM's llama4 loads. */
static moe_status quantize_stacked(qw_job *j, moe_checkpoint *ck, qw_shard *s, const char *path,
                                   const moe_tensor_info *t, int64_t layer, int which)
{
    moe_layer_desc d;
    moe_status st = moe_checkpoint_layer_desc(ck, layer, &d);
    if (st != MOE_OK)
        return st;
    const int64_t E = d.num_experts, H = d.hidden_size, I = d.moe_intermediate_size;
    const int64_t K = which == 0 ? H : I, C = which == 0 ? 2 * I : H; /* t is [E, K, C] */
    if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != K || t->shape[2] != C ||
        (t->dtype != MOE_DTYPE_F32 && t->dtype != MOE_DTYPE_BF16 && t->dtype != MOE_DTYPE_F16))
        return moe_set_error(j->ctx, MOE_ESHAPE,
                             "%s: tensor '%s': expected an F32, BF16 or F16 tensor of shape %s = [%" PRId64 ", %" PRId64
                             ", %" PRId64 "], found %s with %d dimensions",
                             path, t->name, which == 0 ? "[E, H, 2I]" : "[E, I, H]", E, K, C, moe_dtype_name(t->dtype),
                             t->ndim);
    const size_t plen = strlen(t->name) - strlen(which == 0 ? "gate_up_proj" : "down_proj"); /* "<P>experts." */
    char base[300];
    if (j->mxfp4) {
        const int64_t N = C;
        size_t cb, sb, zb;
        if (K % 32 != 0 || moe_quantize_matrix_sizes(&j->q.w13, N, K, &cb, &sb, &zb) != MOE_OK)
            return moe_set_error(j->ctx, MOE_ESHAPE,
                                 "%s: tensor '%s': MXFP4 needs the input size (%s = %" PRId64 ") to be a multiple of 32, "
                                 "the MXFP4 group",
                                 path, t->name, which == 0 ? "hidden_size" : "intermediate_size", K);
        if ((st = tensor_fits(j, path, t->name, N, K, (uint64_t)E * (cb + sb))) != MOE_OK)
            return st;
        uint8_t *blocks = shard_buf(s, (size_t)E * cb); /* [E, N, K/32, 16] */
        uint8_t *scales = shard_buf(s, (size_t)E * sb); /* [E, N, K/32] E8M0 */
        float *w = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] one expert */
        uint8_t zero_unused = 0;
        if (!blocks || !scales || !w) {
            free(w);
            return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s'", path, t->name);
        }
        for (int64_t e = 0; e < E && st == MOE_OK; e++) {
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    w[n * K + k] = elem_f32(t, (size_t)((e * K + k) * C + n));
            if ((st = check_finite(j, path, t->name, e, w, N, K)) != MOE_OK) {
                free(w);
                return st;
            }
            st = moe_quantize_matrix(&j->q.w13, w, N, K, blocks + (size_t)e * cb, scales + (size_t)e * sb,
                                     &zero_unused);
        }
        free(w);
        if (st != MOE_OK)
            return moe_set_error(j->ctx, st, "%s: tensor '%s': quantization failed", path, t->name);
        snprintf(base, sizeof base, "%s", t->name);
        moe_tensor_out *o;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, "_blocks")))
            return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory", path);
        o->dtype = MOE_DTYPE_U8, o->ndim = 4, o->shape[0] = E, o->shape[1] = N, o->shape[2] = K / 32, o->shape[3] = 16;
        o->data = blocks;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, "_scales")))
            return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory", path);
        o->dtype = MOE_DTYPE_U8, o->ndim = 3, o->shape[0] = E, o->shape[1] = N, o->shape[2] = K / 32;
        o->data = scales;
        j->stats->output_code_bytes += (uint64_t)E * cb;
        j->stats->output_scale_bytes += (uint64_t)E * sb;
        j->stats->input_expert_bytes += t->nbytes;
        j->stats->expert_tensors += E * (which == 0 ? 2 : 1);
        return MOE_OK;
    }
    /* per expert: gate_up gives gate (columns [0, I)) and up ([I, 2I)), down gives down */
    static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
    const int64_t N = which == 0 ? I : H;
    if ((st = tensor_fits(j, path, t->name, N, K, matrix_out_bytes(j, N, K))) != MOE_OK)
        return st;
    float *w = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] one expert linear */
    if (!w)
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s'", path, t->name);
    const size_t in_bytes = t->nbytes / (size_t)(E * (which == 0 ? 2 : 1));
    for (int64_t e = 0; e < E && st == MOE_OK; e++)
        for (int m = which == 0 ? 0 : 2; m < (which == 0 ? 2 : 3) && st == MOE_OK; m++) {
            const int64_t c0 = m == 1 ? I : 0; /* the column of output 0 */
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    w[n * K + k] = elem_f32(t, (size_t)((e * K + k) * C + c0 + n));
            snprintf(base, sizeof base, "%.*s%" PRId64 ".%s", (int)plen, t->name, e, names[m]);
            st = quantize_f32(j, s, path, base, w, N, K, in_bytes);
        }
    free(w);
    return st;
}

static bool layer_selected(const moe_quantize_options *o, int64_t layer)
{
    if (!o->layers || o->n_layers == 0)
        return true;
    for (size_t i = 0; i < o->n_layers; i++)
        if (o->layers[i] == layer)
            return true;
    return false;
}

moe_status moe_qw_convert_shard(qw_job *j, moe_checkpoint *ck, const char *in_path, const char *out_path,
                                const char *shard, json_t *weight_map)
{
    moe_safetensors *f = NULL;
    moe_status st = moe_safetensors_open(j->ctx, in_path, &f);
    if (st != MOE_OK)
        return st;
    qw_shard s = {0};
    size_t nq = 0;
    for (size_t i = 0; i < moe_safetensors_count(f) && st == MOE_OK; i++) {
        if (j->opt->cancel && *j->opt->cancel) {
            st = moe_set_error(j->ctx, MOE_ECANCELED, "%s: interrupted; the partial output is removed", in_path);
            break;
        }
        moe_tensor_info t;
        moe_safetensors_at(f, i, &t);
        int64_t layer = -1;
        const bool ex = expert_linear(t.name, &layer) && layer >= 0 && layer < moe_checkpoint_num_layers(ck) &&
                        moe_checkpoint_is_moe_layer(ck, layer);
        int which = -1;
        const bool stk = !ex && j->row && j->row->input_major.gate_up &&
                         stacked_linear(t.name, &layer, &which) && layer >= 0 &&
                         layer < moe_checkpoint_num_layers(ck) && moe_checkpoint_is_moe_layer(ck, layer);
        if (stk && layer_selected(j->opt, layer)) {
            st = quantize_stacked(j, ck, &s, in_path, &t, layer, which);
            nq++;
            continue;
        }
        if (stk && which == 0) {
            /* a layer left out by --layers keeps its stacked float experts: named in the config
             * as a module not to convert ("<P>experts") */
            const size_t len = strlen(t.name) - strlen(".gate_up_proj");
            json_array_append_new(j->mxfp4 ? j->keep : j->ignore, json_stringn(t.name, len));
        }
        if (ex && layer_selected(j->opt, layer)) {
            if (t.ndim != 2 || (t.dtype != MOE_DTYPE_F32 && t.dtype != MOE_DTYPE_BF16 && t.dtype != MOE_DTYPE_F16)) {
                st = moe_set_error(j->ctx, MOE_EDTYPE, "%s: tensor '%s': expected a 2-D F32, BF16 or F16 expert weight, "
                                   "found %s with %d dimensions", in_path, t.name, moe_dtype_name(t.dtype), t.ndim);
                break;
            }
            st = quantize_linear(j, &s, in_path, &t);
            nq++;
            continue;
        }
        moe_tensor_out *o = shard_add(&s);
        if (!o) {
            st = moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory", in_path);
            break;
        }
        o->name = t.name, o->dtype = t.dtype, o->ndim = t.ndim, o->data = t.data;
        memcpy(o->shape, t.shape, sizeof o->shape);
        j->stats->other_bytes += t.nbytes;
        size_t len = strlen(t.name);
        if (t.ndim == 2 && len > 7 && strcmp(t.name + len - 7, ".weight") == 0)
            json_array_append_new(j->ignore, json_stringn(t.name, len - 7));
    }
    if (st == MOE_OK)
        st = moe_safetensors_write(j->ctx, out_path, s.t, s.n);
    for (size_t i = 0; st == MOE_OK && weight_map && i < s.n; i++)
        if (json_object_set_new(weight_map, s.t[i].name, json_string(shard)) != 0)
            st = moe_set_error(j->ctx, MOE_ENOMEM, "out of memory");
    if (st == MOE_OK)
        moe_qw_progress(j, "%s: %zu expert tensors quantized, %zu tensors written", shard, nq, s.n);
    shard_clear(&s);
    free(s.t);
    free(s.bufs);
    moe_safetensors_free(f);
    return st;
}
