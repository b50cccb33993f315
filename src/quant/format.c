/* The format table (quant/format.h): one row per packed weight format, with its sizes,
 * validation, TP slicing, packing and exact decode. The plain rows pack f32 / bf16 / f16
 * panels (quant/pack.c); the quantized rows pack the source codes of moe_quant.h. */
#include "quant/format.h"
#include "quant/pack.h"
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- sizes ---- */

static int64_t feature_bytes_f32(int64_t K)
{
    return 4 * K;
}

static int64_t feature_bytes_16(int64_t K)
{
    return 2 * K;
}

static int64_t feature_bytes_8(int64_t K)
{
    return K;
}

static int64_t feature_bytes_w8a8(int64_t K)
{
    return (K + 3) / 4 * 4;
}

static int64_t feature_bytes_4(int64_t K)
{
    return K / 2;
}

static int64_t feature_bytes_pairs(int64_t K)
{
    return 4 * ((K + 1) / 2);
}

static size_t packed_bytes_f32(int64_t N, int64_t K)
{
    return (size_t)(N * K) * 4;
}

static size_t packed_bytes_16(int64_t N, int64_t K)
{
    return (size_t)(N * K) * 2;
}

static size_t packed_bytes_pairs(int64_t N, int64_t K)
{
    return (size_t)N * (size_t)feature_bytes_pairs(K);
}

static size_t packed_bytes_8(int64_t N, int64_t K)
{
    return (size_t)(N * K);
}

static size_t packed_bytes_w8a8(int64_t N, int64_t K)
{
    return sizeof(moe_w8a8_quad) * (size_t)(N * ((K + 3) / 4)); /* [K4 / 4][N] quads */
}

/* per panel: body [K / 8][nw] words, tail (K % 8) rows of ceil(nw / 2) bytes */
static size_t packed_bytes_4(int64_t N, int64_t K)
{
    size_t b = 0;
    for (int64_t p = 0; p < moe_pmat_panels(N); p++) {
        const int nw = moe_pmat_panel_width(N, p);
        b += sizeof(moe_q4_word) * (size_t)nw * (size_t)(K / 8) + (size_t)((nw + 1) / 2) * (size_t)(K % 8);
    }
    return b;
}

/* ---- validation of quant.w13 / quant.w2 per scheme (the generic checks: check_weight below) ---- */

static moe_status validate_fp8(moe_ctx *ctx, const char *which, const moe_qweight *w, moe_qact act, int64_t act_group,
                               int64_t K)
{
    (void)K;
    if (w->scale == MOE_QSCALE_GROUP)
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: quant.%s: fp8 takes TENSOR, CHANNEL or BLOCK scales, not GROUP", which);
    if (act == MOE_QACT_TOKEN)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.act = TOKEN with fp8 weights (per-token fp8 w8a8) is not "
                             "implemented; use TOKEN_GROUP with BLOCK scales (fp8-block-w8a8) or act NONE");
    if (act == MOE_QACT_STATIC) /* TENSOR, CHANNEL or BLOCK weights: the groups are the weights' */
        return MOE_OK;
    if (act == MOE_QACT_TOKEN_GROUP && w->scale != MOE_QSCALE_BLOCK)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.act = TOKEN_GROUP with quant.%s.scale = %s: fp8 w8a8 needs "
                             "BLOCK weight scales (DeepSeek-V3 / Qwen3-FP8 style)",
                             which, w->scale == MOE_QSCALE_TENSOR ? "TENSOR" : "CHANNEL");
    if (act == MOE_QACT_TOKEN_GROUP && w->block_k != act_group)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.act_group_size = %lld but quant.%s.block_k = %lld: fp8 "
                             "w8a8 needs the activation groups equal to the weight blocks along K",
                             (long long)act_group, which, (long long)w->block_k);
    return MOE_OK;
}

static moe_status validate_i8(moe_ctx *ctx, const char *which, const moe_qweight *w, moe_qact act, int64_t act_group,
                              int64_t K)
{
    (void)act_group;
    if (act == MOE_QACT_TOKEN && (w->scale == MOE_QSCALE_BLOCK || w->scale == MOE_QSCALE_GROUP))
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: quant.act = TOKEN (one scale per token) with quant.%s.scale = %s: "
                             "block/group weight scales need per-token-group activations (TOKEN_GROUP with "
                             "act_group_size = the block's K), which int8 does not implement; use CHANNEL weights",
                             which, w->scale == MOE_QSCALE_BLOCK ? "BLOCK" : "GROUP");
    if (act == MOE_QACT_TOKEN && K > 65536)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.%s: int8 w8a8 with an input dimension of %lld (> 65536) "
                             "could overflow the int32 sums",
                             which, (long long)K);
    if (act == MOE_QACT_TOKEN_GROUP)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.act = TOKEN_GROUP with int8 weights is not implemented; use "
                             "TOKEN with CHANNEL weight scales");
    return MOE_OK;
}

static moe_status validate_4bit(moe_ctx *ctx, const char *which, const moe_qweight *w, moe_qact act,
                                int64_t act_group, int64_t K)
{
    (void)act_group;
    const char *tn = w->dtype == MOE_QTYPE_MXFP4 ? "mxfp4" : "int4";
    if (act != MOE_QACT_NONE)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.act must be NONE with %s weights (weight-only)",
                             tn);
    if (w->dtype == MOE_QTYPE_MXFP4 && !(w->scale == MOE_QSCALE_GROUP && w->group_size == 32))
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: quant.%s: mxfp4 needs GROUP scales with group_size 32 (got "
                             "scale %d, group_size %lld)",
                             which, (int)w->scale, (long long)w->group_size);
    if (w->dtype == MOE_QTYPE_INT4 && w->scale != MOE_QSCALE_GROUP && w->scale != MOE_QSCALE_CHANNEL)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.%s: int4 takes GROUP or CHANNEL scales", which);
    if (w->scale == MOE_QSCALE_GROUP && w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.%s.group_size = %lld, must be 32, 64 or 128",
                             which, (long long)w->group_size);
    if (K % 2 != 0)
        return moe_set_error(ctx, MOE_ESHAPE,
                             "layer description: quant.%s: %s packs two codes per byte along the input dimension, "
                             "which is %lld (odd)",
                             which, tn, (long long)K);
    return MOE_OK;
}

/* ---- exact decode of a packed code (the rows' code: moe_qmat_code) ---- */

/* byte (n, k) of the [K][nw]-per-panel byte layouts (F8, I8, F8A8) */
static uint8_t byte_at(const moe_pmat *w, int64_t n, int64_t k)
{
    const int64_t p = n / MOE_PANEL;
    const int nw = moe_pmat_panel_width(w->n, p);
    return ((const uint8_t *)w->data)[p * 16 * w->k + k * nw + n % MOE_PANEL];
}

/* nibble (n, k) of the 4-bit layout (MOE_WF_I4): body words [K/8][nw], then tail rows
 * [K%8][ceil(nw/2)] */
static unsigned nibble_at(const moe_pmat *w, int64_t n, int64_t k)
{
    const int64_t K = w->k, p = n / MOE_PANEL, K8 = K / 8;
    const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
    const uint8_t *panel = (const uint8_t *)w->data + p * 8 * K;
    if (k < 8 * K8) {
        unsigned b = panel[4 * ((k / 8) * nw + j) + (k % 8) / 2];
        return (k & 1) ? (b >> 4) : (b & 15u);
    }
    unsigned b = panel[4 * nw * K8 + (k - 8 * K8) * ((nw + 1) / 2) + j / 2];
    return (j & 1) ? (b >> 4) : (b & 15u);
}

/* f8h: the f16 value e4m3 * 2^-8 (exact in f32), scale = s * 256 (format.h moe_qmat.f8h) */
static float code_f8(const moe_pmat *w, int64_t n, int64_t k)
{
    return moe_e4m3_to_f32(byte_at(w, n, k)) * (w->q->f8h ? 0x1p-8f : 1.0f);
}

static float code_f8a8(const moe_pmat *w, int64_t n, int64_t k)
{
    return moe_e4m3_to_f32(byte_at(w, n, k)); /* scale holds s */
}

static float code_i8(const moe_pmat *w, int64_t n, int64_t k)
{
    return (float)(int8_t)byte_at(w, n, k);
}

static float code_w8a8(const moe_pmat *w, int64_t n, int64_t k)
{
    const int64_t K4 = (w->k + 3) / 4 * 4, p = n / MOE_PANEL;
    const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
    return (float)(int8_t)((const uint8_t *)w->data)[p * 16 * K4 + (k / 4) * nw * 4 + j * 4 + k % 4];
}

static float code_i4(const moe_pmat *w, int64_t n, int64_t k)
{
    return (float)((int)(nibble_at(w, n, k) ^ 8u) - 8);
}

static float code_i4zp(const moe_pmat *w, int64_t n, int64_t k)
{
    return (float)nibble_at(w, n, k); /* the zero point is not subtracted */
}

static float code_fp4(const moe_pmat *w, int64_t n, int64_t k)
{
    return moe_e2m1_to_f32(nibble_at(w, n, k));
}

/* The exact value of a raw source code (byte or nibble, moe_quant_src_raw) before its scale. */
static float value_e4m3(unsigned raw)
{
    return moe_e4m3_to_f32((uint8_t)raw);
}

static float value_i8(unsigned raw)
{
    return (float)(int8_t)raw;
}

static float value_i4(unsigned raw)
{
    return (float)((int)(raw ^ 8u) - 8);
}

static float value_u4(unsigned raw)
{
    return (float)raw; /* the zero point is subtracted by the caller */
}

static float value_e2m1(unsigned raw)
{
    return moe_e2m1_to_f32(raw);
}

float moe_qmat_code(const moe_pmat *w, int64_t n, int64_t k)
{
    return moe_format_row((moe_wfmt)w->q->kind)->code(w, n, k);
}

void moe_quant_dequant_source(const moe_qweight *qw, const void *codes, const void *scale, const uint8_t *zero,
                              int64_t N, int64_t K, float *out)
{
    float (*value)(unsigned) = moe_format_row(moe_quant_kind(qw, MOE_QACT_NONE))->value;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            float v = value(moe_quant_src_raw(qw, codes, K, n, k));
            float s = moe_quant_src_scale(qw, scale, N, K, n, k);
            if (qw->has_zero_point)
                out[n * K + k] = (v - (float)zero[moe_quant_scale_index(qw, N, K, n, k)]) * s;
            else
                out[n * K + k] = v * s;
        }
}

/* ---- packing ---- */

static int pack_f32(const moe_pack_src *s, int64_t N, int64_t K, const moe_pack_dst *d)
{
    moe_pack_strided(d->data, s->data, MOE_DTYPE_F32, N, K, s->so ? s->so : K, s->so ? s->si : 1);
    return 0;
}

static int pack_bf16(const moe_pack_src *s, int64_t N, int64_t K, const moe_pack_dst *d)
{
    moe_pack_strided(d->data, s->data, MOE_DTYPE_BF16, N, K, s->so ? s->so : K, s->so ? s->si : 1);
    return 0;
}

static int pack_f16(const moe_pack_src *s, int64_t N, int64_t K, const moe_pack_dst *d)
{
    moe_pack_strided(d->data, s->data, MOE_DTYPE_F16, N, K, s->so ? s->so : K, s->so ? s->si : 1);
    return 0;
}

/* The quantized rows share one packer (moe_quant_pack); the format decides the layout. */
static int pack_quant(const moe_pack_src *s, int64_t N, int64_t K, const moe_pack_dst *d)
{
    return moe_quant_pack(&s->qw, s->act, s->data, s->scale, s->zero, N, K, d->data, d->scale, d->zero, d->comp);
}

static int pack_pairs(const moe_pack_src *s, int64_t N, int64_t K, const moe_pack_dst *d)
{
    moe_pack_bf16_pairs(d->data, s->data, s->dt, N, K, s->so ? s->so : K, s->so ? s->si : 1);
    return 0;
}

/* ---- TP slicing: rows [n0, n0 + Ns) and columns [k0, k0 + Ks) of the source [N, K] ---- */

static int slice_plain(const moe_format *f, const moe_pack_src *s, int64_t N, int64_t K, int64_t n0, int64_t Ns,
                       int64_t k0, int64_t Ks, moe_pack_src *out, void *bufs[3])
{
    (void)f, (void)N, (void)Ns, (void)Ks;
    bufs[0] = bufs[1] = bufs[2] = NULL;
    *out = *s;
    const int64_t so = s->so ? s->so : K, si = s->so ? s->si : 1;
    out->so = so;
    out->si = si;
    out->data = (const unsigned char *)s->data + (size_t)(n0 * so + k0 * si) * moe_dtype_size(s->dt);
    return 0;
}

static int slice_quant(const moe_format *f, const moe_pack_src *s, int64_t N, int64_t K, int64_t n0, int64_t Ns,
                       int64_t k0, int64_t Ks, moe_pack_src *out, void *bufs[3])
{
    (void)f;
    bufs[0] = bufs[1] = bufs[2] = NULL;
    *out = *s;
    if (n0 == 0 && Ns == N && k0 == 0 && Ks == K)
        return 0; /* the whole matrix */
    if (moe_quant_slice_qweight(&s->qw, n0, Ns, k0, Ks, &out->qw) != 0)
        return -1;
    size_t cb, sb, zb;
    moe_quant_source_sizes(&out->qw, Ns, Ks, &cb, &sb, &zb);
    /* the slice [Ns, Ks] as a source of its own (moe_quant.h shapes): codes [Ns, Ks] bytes
     * ([Ns, Ks / 2] for 4-bit), scales and zero points [rows, cols] of out->qw's grid */
    void *lc = malloc(cb), *ls = malloc(sb);
    uint8_t *lz = zb ? malloc(zb) : NULL;
    if (!lc || !ls || (zb && !lz)) {
        free(lc), free(ls), free(lz);
        return -1;
    }
    moe_quant_slice_source(&s->qw, s->data, s->scale, s->zero, N, K, n0, k0, &out->qw, Ns, Ks, lc, ls, lz);
    out->data = lc;
    out->scale = ls;
    out->zero = lz;
    bufs[0] = lc;
    bufs[1] = ls;
    bufs[2] = lz;
    return 0;
}

static const moe_format rows[MOE_WF__COUNT] = {
    [MOE_WF_F32] = {.fmt = MOE_WF_F32, .name = "f32", .bits = 32, .act = MOE_QACT_NONE,
                    .feature_bytes = feature_bytes_f32, .packed_bytes = packed_bytes_f32, .pack = pack_f32,
                    .slice = slice_plain, .claim = 1},
    [MOE_WF_BF16] = {.fmt = MOE_WF_BF16, .name = "bf16", .bits = 16, .act = MOE_QACT_NONE,
                     .feature_bytes = feature_bytes_16, .packed_bytes = packed_bytes_16, .pack = pack_bf16,
                     .slice = slice_plain, .claim = 1},
    [MOE_WF_F16] = {.fmt = MOE_WF_F16, .name = "f16", .bits = 16, .act = MOE_QACT_NONE,
                    .feature_bytes = feature_bytes_16, .packed_bytes = packed_bytes_16, .pack = pack_f16,
                    .slice = slice_plain, .claim = 1},
    [MOE_WF_F8] = {.fmt = MOE_WF_F8, .name = "fp8", .bits = 8, .act = MOE_QACT_NONE,
                   .feature_bytes = feature_bytes_8, .packed_bytes = packed_bytes_8, .validate = validate_fp8,
                   .value = value_e4m3, .code = code_f8, .pack = pack_quant, .slice = slice_quant, .claim = 1,
                   .fast_decode = 1},
    [MOE_WF_I8] = {.fmt = MOE_WF_I8, .name = "int8", .bits = 8, .act = MOE_QACT_NONE,
                   .feature_bytes = feature_bytes_8, .packed_bytes = packed_bytes_8, .validate = validate_i8,
                   .value = value_i8, .code = code_i8, .pack = pack_quant, .slice = slice_quant, .claim = 1},
    [MOE_WF_I4] = {.fmt = MOE_WF_I4, .name = "int4", .bits = 4, .act = MOE_QACT_NONE, .four_bit = 1,
                   .feature_bytes = feature_bytes_4, .packed_bytes = packed_bytes_4, .validate = validate_4bit,
                   .value = value_i4, .code = code_i4, .pack = pack_quant, .slice = slice_quant, .claim = 1},
    [MOE_WF_I4ZP] = {.fmt = MOE_WF_I4ZP, .name = "int4-zp", .bits = 4, .act = MOE_QACT_NONE,
                     .four_bit = 1, .feature_bytes = feature_bytes_4, .packed_bytes = packed_bytes_4,
                     .validate = validate_4bit, .value = value_u4, .code = code_i4zp, .pack = pack_quant, .slice = slice_quant,
                     .claim = 1},
    [MOE_WF_FP4] = {.fmt = MOE_WF_FP4, .name = "mxfp4", .bits = 4, .act = MOE_QACT_NONE,
                    .four_bit = 1, .feature_bytes = feature_bytes_4, .packed_bytes = packed_bytes_4,
                    .validate = validate_4bit, .value = value_e2m1, .code = code_fp4, .pack = pack_quant, .slice = slice_quant,
                    .claim = 1},
    /* W8A8: 4 items per claim, so a thread knows its next item and prefetches its weights */
    [MOE_WF_W8A8] = {.fmt = MOE_WF_W8A8, .name = "int8-w8a8", .bits = 8, .pads = "K rounded up to 4 for the 4-byte dot products", .comp_bytes = sizeof(int32_t), .act = MOE_QACT_TOKEN,
                     .feature_bytes = feature_bytes_w8a8, .packed_bytes = packed_bytes_w8a8, .validate = validate_i8,
                     .value = value_i8, .code = code_w8a8, .pack = pack_quant, .slice = slice_quant, .claim = 4, .prefetch = 1},
    [MOE_WF_F8A8] = {.fmt = MOE_WF_F8A8, .name = "fp8-w8a8", .bits = 8,
                     .act = MOE_QACT_TOKEN_GROUP, .feature_bytes = feature_bytes_8, .packed_bytes = packed_bytes_8,
                     .validate = validate_fp8, .value = value_e4m3, .code = code_f8a8, .pack = pack_quant, .slice = slice_quant,
                     .claim = 1, .fast_decode = 1},
    /* compute bf16: plain weights of any dtype rounded to bf16 pairs (2 bytes per weight);
     * like W8A8, 4 items a claim and the next item's weights as a prefetch hint */
    [MOE_WF_BF16P] = {.fmt = MOE_WF_BF16P, .name = "bf16-pairs", .bits = 16, .act = MOE_QACT_NONE,
                      .pads = "K rounded up to 2: one +0 per feature for odd K",
                      .feature_bytes = feature_bytes_pairs, .packed_bytes = packed_bytes_pairs, .pack = pack_pairs,
                      .slice = slice_plain, .claim = 4, .prefetch = 1},
};

const moe_format *moe_format_row(moe_wfmt f)
{
    return &rows[(unsigned)f < MOE_WF__COUNT ? f : MOE_WF_F32];
}

moe_wfmt moe_quant_kind(const moe_qweight *qw, moe_qact act)
{
    switch (qw->dtype) {
    case MOE_QTYPE_F8_E4M3: return act == MOE_QACT_TOKEN_GROUP || act == MOE_QACT_STATIC ? MOE_WF_F8A8 : MOE_WF_F8;
    case MOE_QTYPE_I8: return act == MOE_QACT_TOKEN ? MOE_WF_W8A8 : MOE_WF_I8;
    case MOE_QTYPE_INT4: return qw->has_zero_point ? MOE_WF_I4ZP : MOE_WF_I4;
    default: return MOE_WF_FP4;
    }
}

size_t moe_quant_packed_bytes(moe_wfmt kind, int64_t N, int64_t K)
{
    return moe_format_row(kind)->packed_bytes(N, K);
}

/* fp8: may the matrix be decoded through f16 (moe_qmat.f8h)? No NaN code, and s * 256 finite
 * for every finite scale s (an infinite or NaN scale gives the same product either way). */
static int f8_codes_ok(const uint8_t *codes, int64_t N, int64_t K)
{
    for (int64_t i = 0; i < N * K; i++)
        if ((codes[i] & 0x7fu) == 0x7fu)
            return 0;
    return 1;
}

static int f8_half_ok(const moe_qweight *qw, const uint8_t *codes, const void *scale, int64_t N, int64_t K)
{
    if (!f8_codes_ok(codes, N, K))
        return 0;
    int64_t r, c;
    moe_quant_grid(qw, N, K, &r, &c);
    for (int64_t i = 0; i < r * c; i++) {
        float s;
        memcpy(&s, (const unsigned char *)scale + 4 * i, 4);
        if (isfinite(s) && !isfinite(s * 256.0f))
            return 0;
    }
    return 1;
}

int moe_quant_pack(const moe_qweight *qw, moe_qact act, const void *codes, const void *scale, const uint8_t *zero,
                   int64_t N, int64_t K, uint8_t *dst, float *dscale, float *dzero, int32_t *comp)
{
    const moe_wfmt kind = moe_quant_kind(qw, act);
    const int four = moe_format_row(kind)->four_bit;
    const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
    const int64_t K4 = (K + 3) / 4 * 4, K8 = K / 8;
    /* F8A8 keeps s (no scale product in the f16 path): only NaN codes need the exact decode */
    const int f8h = (kind == MOE_WF_F8 && f8_half_ok(qw, codes, scale, N, K)) ||
                    (kind == MOE_WF_F8A8 && f8_codes_ok(codes, N, K));
    const float smul = kind == MOE_WF_F8 && f8h ? 256.0f : 1.0f; /* exact: a power of two, no overflow (f8_half_ok) */
    for (int64_t p = 0; p < moe_pmat_panels(N); p++) {
        const int nw = moe_pmat_panel_width(N, p);
        const int rb = (nw + 1) / 2;                      /* bytes per 4-bit tail row */
        uint8_t *p4 = dst + p * 8 * K;                    /* 4-bit panel: body [K8][nw] words */
        uint8_t *t4 = p4 + (size_t)(4 * nw) * (size_t)K8; /* tail [K % 8][rb] */
        if (four)
            memset(t4, 0, (size_t)rb * (size_t)(K % 8));
        else if (kind == MOE_WF_W8A8)
            memset(dst + p * 16 * K4, 0, (size_t)(nw * K4));
        for (int j = 0; j < nw; j++) {
            const int64_t n = p * MOE_PANEL + j;
            int64_t sum = 0;
            if (four) {
                /* body: word (kb, j) = source bytes of k = 8kb .. 8kb+7 (K even: row n starts on a byte) */
                const uint8_t *row = (const uint8_t *)codes + n * K / 2;
                moe_q4_word *words = (moe_q4_word *)p4; /* [K8][nw] */
                for (int64_t kb = 0; kb < K8; kb++)
                    memcpy(words[kb * nw + j].b, row + sizeof(moe_q4_word) * (size_t)kb, sizeof(moe_q4_word));
                for (int64_t k = 8 * K8; k < K; k++) {
                    unsigned v = moe_quant_src_raw(qw, codes, K, n, k);
                    t4[(size_t)((k - 8 * K8) * rb + j / 2)] |= (uint8_t)((j & 1) ? v << 4 : v);
                }
            } else {
                for (int64_t k = 0; k < K; k++) {
                    unsigned v = moe_quant_src_raw(qw, codes, K, n, k);
                    if (kind == MOE_WF_W8A8) {
                        dst[p * 16 * K4 + (k / 4) * nw * 4 + j * 4 + k % 4] = (uint8_t)v;
                        sum += (int8_t)v;
                    } else {
                        dst[p * 16 * K + k * nw + j] = (uint8_t)v;
                    }
                }
            }
            if (comp)
                comp[n] = (int32_t)(128 * sum); /* |sum| <= 128 K: fits for K < 2^17 */
            for (int64_t g = 0; g < ng; g++) {
                dscale[p * 16 * ng + g * nw + j] = moe_quant_src_scale(qw, scale, N, K, n, g * gk) * smul;
                if (dzero)
                    dzero[p * 16 * ng + g * nw + j] = (float)zero[moe_quant_scale_index(qw, N, K, n, g * gk)];
            }
        }
    }
    return f8h;
}

/* ---- validation of desc->quant ---- */

static moe_status check_weight(moe_ctx *ctx, const char *which, const moe_qweight *w, moe_qact act, int64_t act_group,
                               int64_t K)
{
    if ((int)w->dtype < 0 || w->dtype > MOE_QTYPE_MXFP4)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.%s.dtype = %d is not a moe_qtype value", which,
                             (int)w->dtype);
    if ((int)w->scale < 0 || w->scale > MOE_QSCALE_GROUP)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.%s.scale = %d is not a moe_qscale value", which,
                             (int)w->scale);
    const char *tn = moe_qtype_name(w->dtype);
    if (w->scale == MOE_QSCALE_BLOCK &&
        (w->block_n < 1 || w->block_k < 1 || w->block_n > (1 << 20) || w->block_k > (1 << 20)))
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: quant.%s block shape [%lld, %lld]: block_n and block_k must be in "
                             "[1, 2^20]",
                             which, (long long)w->block_n, (long long)w->block_k);
    if (w->has_zero_point && !(w->dtype == MOE_QTYPE_INT4 && w->scale == MOE_QSCALE_GROUP))
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: quant.%s.has_zero_point is only for INT4 with GROUP scales (%s given)",
                             which, tn);
    /* the scheme's own rules: its format row (quant/format.c) */
    if (w->dtype != MOE_QTYPE_NONE) {
        const moe_format *f = moe_format_row(moe_quant_kind(w, act));
        moe_status st = f->validate ? f->validate(ctx, which, w, act, act_group, K) : MOE_OK;
        if (st != MOE_OK)
            return st;
    }
    if (w->dtype != MOE_QTYPE_NONE && w->scale == MOE_QSCALE_GROUP && w->dtype == MOE_QTYPE_I8 &&
        w->group_size < 1)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.%s.group_size = %lld, must be >= 1", which,
                             (long long)w->group_size);
    return MOE_OK;
}

moe_status moe_quant_validate(moe_ctx *ctx, const moe_layer_desc *d)
{
    const moe_quant_config *q = &d->quant;
    if ((int)q->act < 0 || q->act > MOE_QACT_STATIC)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.act = %d is not a moe_qact value", (int)q->act);
    if (!moe_quant_active(q)) {
        if (q->act != MOE_QACT_NONE)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: quant.act is set but quant.w13 and quant.w2 are NONE");
        return MOE_OK;
    }
    if ((q->w13.dtype == MOE_QTYPE_NONE) != (q->w2.dtype == MOE_QTYPE_NONE))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.w13.dtype = %s but quant.w2.dtype = %s: both quantized or both "
                             "NONE",
                             moe_qtype_name(q->w13.dtype), moe_qtype_name(q->w2.dtype));
    if (q->act == MOE_QACT_TOKEN && (q->w13.dtype != MOE_QTYPE_I8 || q->w2.dtype != MOE_QTYPE_I8))
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: quant.act = TOKEN (w8a8) needs int8 w13 and w2 (got %s, %s)",
                             moe_qtype_name(q->w13.dtype), moe_qtype_name(q->w2.dtype));
    if (q->act == MOE_QACT_TOKEN_GROUP && (q->w13.dtype != MOE_QTYPE_F8_E4M3 || q->w2.dtype != MOE_QTYPE_F8_E4M3))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.act = TOKEN_GROUP (fp8 w8a8) needs fp8 w13 and w2 (got %s, %s)",
                             moe_qtype_name(q->w13.dtype), moe_qtype_name(q->w2.dtype));
    if (q->act == MOE_QACT_STATIC && (q->w13.dtype != MOE_QTYPE_F8_E4M3 || q->w2.dtype != MOE_QTYPE_F8_E4M3))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "layer description: quant.act = STATIC (static FP8 activations) needs fp8 w13 and w2 "
                             "(got %s, %s)",
                             moe_qtype_name(q->w13.dtype), moe_qtype_name(q->w2.dtype));
    if (q->act == MOE_QACT_TOKEN_GROUP && (q->act_group_size < 1 || q->act_group_size > (1 << 20)))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: quant.act_group_size = %lld, must be in [1, 2^20]",
                             (long long)q->act_group_size);
    moe_status st = check_weight(ctx, "w13", &q->w13, q->act, q->act_group_size, d->hidden_size);
    if (st == MOE_OK)
        st = check_weight(ctx, "w2", &q->w2, q->act, q->act_group_size, d->moe_intermediate_size);
    if (st != MOE_OK)
        return st;
    return MOE_OK;
}
