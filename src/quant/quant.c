/* Quantized schemes: encoders, scheme names and text of moe_quant_config, and the source layout
 * of moe_quant.h ("Quantized experts") read and written element by element: sizes,
 * dequantization, quantization, TP slicing. Validation and packing are the format rows'
 * (quant/format.c). */
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float moe_e4m3_x256[256]; /* quant.h */
__attribute__((constructor)) static void e4m3_x256_init(void)
{
    for (int c = 0; c < 256; c++)
        moe_e4m3_x256[c] = moe_e4m3_to_f32((uint8_t)c) * 256.0f;
}

unsigned moe_f32_to_e2m1(float f)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (isnan(f))
        return 0;
    unsigned s = signbit(f) ? 8u : 0u;
    float a = fabsf(f);
    unsigned best = 0;
    for (unsigned c = 1; c < 8; c++) {
        float dc = fabsf(a - mag[c]), db = fabsf(a - mag[best]);
        if (dc < db || (dc == db && (c & 1u) == 0))
            best = c;
    }
    return s | best;
}

int moe_quant_active(const moe_quant_config *q)
{
    return q->w13.dtype != MOE_QTYPE_NONE || q->w2.dtype != MOE_QTYPE_NONE;
}

const char *moe_qtype_name(moe_qtype t)
{
    switch (t) {
    case MOE_QTYPE_NONE: return "none";
    case MOE_QTYPE_F8_E4M3: return "fp8";
    case MOE_QTYPE_I8: return "int8";
    case MOE_QTYPE_INT4: return "int4";
    case MOE_QTYPE_MXFP4: return "mxfp4";
    }
    return "?";
}

/* The named schemes. */
static const struct {
    const char *name;
    moe_qtype t;
    moe_qscale s;
    int64_t bn, bk, g;
    int zp;
    moe_qact act;
    int64_t ag; /* act_group_size */
} schemes[] = {
    {"fp8-tensor", MOE_QTYPE_F8_E4M3, MOE_QSCALE_TENSOR, 0, 0, 0, 0, MOE_QACT_NONE, 0},
    {"fp8-channel", MOE_QTYPE_F8_E4M3, MOE_QSCALE_CHANNEL, 0, 0, 0, 0, MOE_QACT_NONE, 0},
    {"fp8-block", MOE_QTYPE_F8_E4M3, MOE_QSCALE_BLOCK, 128, 128, 0, 0, MOE_QACT_NONE, 0},
    {"fp8-block-w8a8", MOE_QTYPE_F8_E4M3, MOE_QSCALE_BLOCK, 128, 128, 0, 0, MOE_QACT_TOKEN_GROUP, 128},
    {"int8-channel", MOE_QTYPE_I8, MOE_QSCALE_CHANNEL, 0, 0, 0, 0, MOE_QACT_NONE, 0},
    {"int8-w8a8", MOE_QTYPE_I8, MOE_QSCALE_CHANNEL, 0, 0, 0, 0, MOE_QACT_TOKEN, 0},
    {"int4-g32", MOE_QTYPE_INT4, MOE_QSCALE_GROUP, 0, 0, 32, 0, MOE_QACT_NONE, 0},
    {"int4-g64", MOE_QTYPE_INT4, MOE_QSCALE_GROUP, 0, 0, 64, 0, MOE_QACT_NONE, 0},
    {"int4-g128", MOE_QTYPE_INT4, MOE_QSCALE_GROUP, 0, 0, 128, 0, MOE_QACT_NONE, 0},
    {"int4-g32-zp", MOE_QTYPE_INT4, MOE_QSCALE_GROUP, 0, 0, 32, 1, MOE_QACT_NONE, 0},
    {"int4-g64-zp", MOE_QTYPE_INT4, MOE_QSCALE_GROUP, 0, 0, 64, 1, MOE_QACT_NONE, 0},
    {"int4-g128-zp", MOE_QTYPE_INT4, MOE_QSCALE_GROUP, 0, 0, 128, 1, MOE_QACT_NONE, 0},
    {"mxfp4", MOE_QTYPE_MXFP4, MOE_QSCALE_GROUP, 0, 0, 32, 0, MOE_QACT_NONE, 0},
    /* static FP8 activations (caller-given input scales per expert, moe_weight_source): last,
     * so the lists of the schemes a checkpoint can be quantized to keep their order */
    {"fp8-tensor-static", MOE_QTYPE_F8_E4M3, MOE_QSCALE_TENSOR, 0, 0, 0, 0, MOE_QACT_STATIC, 0},
    {"fp8-channel-static", MOE_QTYPE_F8_E4M3, MOE_QSCALE_CHANNEL, 0, 0, 0, 0, MOE_QACT_STATIC, 0},
    {"fp8-block-static", MOE_QTYPE_F8_E4M3, MOE_QSCALE_BLOCK, 128, 128, 0, 0, MOE_QACT_STATIC, 0},
};

moe_status moe_quant_from_name(const char *name, moe_quant_config *q)
{
    if (!name || !q)
        return MOE_EINVAL;
    memset(q, 0, sizeof *q);
    if (strcmp(name, "none") == 0)
        return MOE_OK;
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        if (strcmp(name, schemes[i].name) == 0) {
            moe_qweight w = {.dtype = schemes[i].t, .scale = schemes[i].s, .block_n = schemes[i].bn,
                             .block_k = schemes[i].bk, .group_size = schemes[i].g, .has_zero_point = schemes[i].zp};
            q->w13 = q->w2 = w;
            q->act = schemes[i].act;
            q->act_group_size = schemes[i].ag;
            return MOE_OK;
        }
    }
    return MOE_EINVAL;
}

const char *moe_quant_scheme_name(size_t i)
{
    return i < sizeof schemes / sizeof schemes[0] ? schemes[i].name : NULL;
}

static int qweight_eq(const moe_qweight *a, const moe_qweight *b)
{
    return a->dtype == b->dtype && a->scale == b->scale && a->block_n == b->block_n && a->block_k == b->block_k &&
           a->group_size == b->group_size && a->has_zero_point == b->has_zero_point;
}

int moe_quant_equal(const moe_quant_config *a, const moe_quant_config *b)
{
    return qweight_eq(&a->w13, &b->w13) && qweight_eq(&a->w2, &b->w2) && a->act == b->act &&
           a->act_group_size == b->act_group_size;
}

const char *moe_quant_name(const moe_quant_config *q)
{
    if (!q || !moe_quant_active(q))
        return "none";
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        moe_quant_config c;
        moe_quant_from_name(schemes[i].name, &c);
        if (moe_quant_equal(&c, q))
            return schemes[i].name;
    }
    return "custom";
}

void moe_quant_text(const moe_quant_config *q, char *buf, size_t n)
{
    snprintf(buf, n,
             "quant_w13=%s/%d/%lld/%lld/%lld/%d;quant_w2=%s/%d/%lld/%lld/%lld/%d;quant_act=%d/%lld;",
             moe_qtype_name(q->w13.dtype), (int)q->w13.scale, (long long)q->w13.block_n, (long long)q->w13.block_k,
             (long long)q->w13.group_size, q->w13.has_zero_point, moe_qtype_name(q->w2.dtype), (int)q->w2.scale,
             (long long)q->w2.block_n, (long long)q->w2.block_k, (long long)q->w2.group_size,
             q->w2.has_zero_point, (int)q->act, (long long)q->act_group_size);
}

/* ---- the source layout ---- */

static int is4(const moe_qweight *qw)
{
    return qw->dtype == MOE_QTYPE_INT4 || qw->dtype == MOE_QTYPE_MXFP4;
}

/* Scale grid [rows, cols] of the source and the K-extent of one scale. */
void moe_quant_grid(const moe_qweight *qw, int64_t N, int64_t K, int64_t *rows, int64_t *cols)
{
    switch (qw->scale) {
    case MOE_QSCALE_TENSOR: *rows = 1; *cols = 1; break;
    case MOE_QSCALE_CHANNEL: *rows = N; *cols = 1; break;
    case MOE_QSCALE_BLOCK:
        *rows = (N + qw->block_n - 1) / qw->block_n;
        *cols = (K + qw->block_k - 1) / qw->block_k;
        break;
    default:
        *rows = N;
        *cols = (K + qw->group_size - 1) / qw->group_size;
        break;
    }
}

void moe_quant_source_sizes(const moe_qweight *qw, int64_t N, int64_t K, size_t *code_bytes, size_t *scale_bytes,
                            size_t *zero_bytes)
{
    int64_t r, c;
    moe_quant_grid(qw, N, K, &r, &c);
    *code_bytes = (size_t)(is4(qw) ? N * K / 2 : N * K);
    *scale_bytes = (size_t)(r * c) * (qw->dtype == MOE_QTYPE_MXFP4 ? 1 : 4);
    *zero_bytes = qw->has_zero_point ? (size_t)(r * c) : 0;
}

/* Index into the scale grid of element (n, k). */
int64_t moe_quant_scale_index(const moe_qweight *qw, int64_t N, int64_t K, int64_t n, int64_t k)
{
    int64_t r, c;
    moe_quant_grid(qw, N, K, &r, &c);
    switch (qw->scale) {
    case MOE_QSCALE_TENSOR: return 0;
    case MOE_QSCALE_CHANNEL: return n;
    case MOE_QSCALE_BLOCK: return (n / qw->block_n) * c + k / qw->block_k;
    default: return n * c + k / qw->group_size;
    }
}

float moe_quant_src_scale(const moe_qweight *qw, const void *scale, int64_t N, int64_t K, int64_t n, int64_t k)
{
    int64_t i = moe_quant_scale_index(qw, N, K, n, k);
    if (qw->dtype == MOE_QTYPE_MXFP4)
        return moe_e8m0_to_f32(((const uint8_t *)scale)[i]);
    float s;
    memcpy(&s, (const unsigned char *)scale + 4 * i, 4);
    return s;
}

/* Quantize an f32 matrix into qw's source format (quant.h). */
int moe_quant_quantize_source(const moe_qweight *qw, const float *w, int64_t N, int64_t K, void *codes, void *scale,
                              uint8_t *zero)
{
    int64_t r, c;
    moe_quant_grid(qw, N, K, &r, &c);
    /* per scale cell: max |w| (and min / max for zero points) */
    float *amax = calloc((size_t)(r * c), sizeof(float));
    float *mn = calloc((size_t)(r * c), sizeof(float));
    float *mx = calloc((size_t)(r * c), sizeof(float));
    float *sf = malloc(sizeof(float) * (size_t)(r * c)); /* the f32 scale of each cell */
    if (!amax || !mn || !mx || !sf) {
        free(amax);
        free(mn);
        free(mx);
        free(sf);
        return -1;
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int64_t i = moe_quant_scale_index(qw, N, K, n, k);
            float v = w[n * K + k];
            amax[i] = fabsf(v) > amax[i] ? fabsf(v) : amax[i];
            mn[i] = v < mn[i] ? v : mn[i];
            mx[i] = v > mx[i] ? v : mx[i];
        }
    for (int64_t i = 0; i < r * c; i++) {
        float s;
        switch (qw->dtype) {
        case MOE_QTYPE_F8_E4M3: s = amax[i] / 448.0f; break;
        case MOE_QTYPE_I8: s = amax[i] / 127.0f; break;
        case MOE_QTYPE_INT4: s = qw->has_zero_point ? (mx[i] - mn[i]) / 15.0f : amax[i] / 7.0f; break;
        default: {
            /* OCP MX: shared exponent floor(log2(amax)) - 2 (e2m1's largest exponent) */
            int e = amax[i] > 0.0f ? ilogbf(amax[i]) - 2 : -127;
            int be = e + 127;
            be = be < 0 ? 0 : (be > 254 ? 254 : be);
            ((uint8_t *)scale)[i] = (uint8_t)be;
            s = moe_e8m0_to_f32((uint8_t)be);
            break;
        }
        }
        if (!(s > 0.0f))
            s = 1.0f;
        sf[i] = s;
        if (qw->dtype != MOE_QTYPE_MXFP4)
            memcpy((unsigned char *)scale + 4 * i, &s, 4);
        if (qw->has_zero_point) {
            float z = nearbyintf(-mn[i] / s);
            zero[i] = (uint8_t)(z < 0.0f ? 0 : (z > 15.0f ? 15 : z));
        }
    }
    uint8_t *cb = codes;
    if (is4(qw))
        memset(cb, 0, (size_t)N * (size_t)K / 2);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int64_t i = moe_quant_scale_index(qw, N, K, n, k);
            float v = w[n * K + k] / sf[i];
            unsigned code;
            switch (qw->dtype) {
            case MOE_QTYPE_F8_E4M3: cb[n * K + k] = moe_f32_to_e4m3(v); continue;
            case MOE_QTYPE_I8: {
                float q = nearbyintf(v);
                q = q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q);
                cb[n * K + k] = (uint8_t)(int8_t)q;
                continue;
            }
            case MOE_QTYPE_INT4: {
                float q = nearbyintf(v);
                if (qw->has_zero_point) {
                    q += (float)zero[i];
                    q = q < 0.0f ? 0.0f : (q > 15.0f ? 15.0f : q);
                } else {
                    q = q < -8.0f ? -8.0f : (q > 7.0f ? 7.0f : q);
                }
                code = (unsigned)(int)q & 15u;
                break;
            }
            default: code = moe_f32_to_e2m1(v); break;
            }
            cb[(n * K + k) / 2] |= (uint8_t)((k & 1) ? code << 4 : code);
        }
    free(amax);
    free(mn);
    free(mx);
    free(sf);
    return 0;
}

static int quantize_args_ok(const moe_qweight *qw, int64_t N, int64_t K)
{
    if (!qw || qw->dtype < MOE_QTYPE_F8_E4M3 || qw->dtype > MOE_QTYPE_MXFP4 || N <= 0 || K <= 0)
        return 0;
    if (is4(qw) && K % 2)
        return 0;
    if (qw->scale == MOE_QSCALE_BLOCK && (qw->block_n < 1 || qw->block_k < 1))
        return 0;
    if (qw->scale == MOE_QSCALE_GROUP && qw->group_size < 1)
        return 0;
    if (qw->scale < MOE_QSCALE_TENSOR || qw->scale > MOE_QSCALE_GROUP)
        return 0;
    if (qw->has_zero_point && !(qw->dtype == MOE_QTYPE_INT4 && qw->scale == MOE_QSCALE_GROUP))
        return 0;
    if (qw->dtype == MOE_QTYPE_MXFP4 && qw->scale != MOE_QSCALE_GROUP)
        return 0; /* E8M0 scales exist only per group */
    return 1;
}

moe_status moe_quantize_matrix_sizes(const moe_qweight *qw, int64_t N, int64_t K, size_t *code_bytes,
                                     size_t *scale_bytes, size_t *zero_bytes)
{
    if (!quantize_args_ok(qw, N, K) || !code_bytes || !scale_bytes || !zero_bytes)
        return MOE_EINVAL;
    moe_quant_source_sizes(qw, N, K, code_bytes, scale_bytes, zero_bytes);
    return MOE_OK;
}

moe_status moe_quantize_matrix(const moe_qweight *qw, const float *w, int64_t N, int64_t K, void *codes,
                               void *scale, uint8_t *zero)
{
    if (!quantize_args_ok(qw, N, K) || !w || !codes || !scale || (qw->has_zero_point && !zero))
        return MOE_EINVAL;
    return moe_quant_quantize_source(qw, w, N, K, codes, scale, qw->has_zero_point ? zero : NULL) ? MOE_ENOMEM
                                                                                                  : MOE_OK;
}

/* Raw nibble / byte of source element (n, k). */
unsigned moe_quant_src_raw(const moe_qweight *qw, const uint8_t *c, int64_t K, int64_t n, int64_t k)
{
    if (is4(qw)) {
        unsigned b = c[(n * K + k) / 2];
        return (k & 1) ? (b >> 4) : (b & 15u);
    }
    return c[n * K + k];
}

/* ---- the scale group length of the packed layout ---- */

int64_t moe_quant_gk(const moe_qweight *qw, int64_t K)
{
    switch (qw->scale) {
    case MOE_QSCALE_BLOCK: return qw->block_k;
    case MOE_QSCALE_GROUP: return qw->group_size;
    default: return K;
    }
}

/* ---- slicing a source matrix (TP shards: the format rows' slice, src/quant/format.c) ---- */

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Cell length of a slice [off, off + len) cut from cells of length `cell` starting at 0: the
 * same cell when the slice starts on a cell boundary or lies inside one cell, otherwise
 * gcd(cell, off), so every local cell lies inside one source cell and the cut ones repeat
 * their source cell's scale. */
static int64_t rebase_cell(int64_t cell, int64_t off, int64_t len)
{
    const int64_t r = off % cell;
    if (r == 0 || r + len <= cell)
        return cell;
    return gcd64(cell, r);
}

int moe_quant_slice_qweight(const moe_qweight *qw, int64_t n0, int64_t Ns, int64_t k0, int64_t Ks, moe_qweight *out)
{
    *out = *qw;
    if (Ns < 1 || Ks < 1 || n0 < 0 || k0 < 0 || (is4(qw) && Ks % 2))
        return -1;
    if (qw->scale == MOE_QSCALE_BLOCK) {
        out->block_n = rebase_cell(qw->block_n, n0, Ns);
        out->block_k = rebase_cell(qw->block_k, k0, Ks);
    } else if (qw->scale == MOE_QSCALE_GROUP) {
        out->group_size = rebase_cell(qw->group_size, k0, Ks);
    }
    return 0;
}

void moe_quant_slice_source(const moe_qweight *qw, const void *codes, const void *scale, const uint8_t *zero,
                            int64_t N, int64_t K, int64_t n0, int64_t k0, const moe_qweight *sq, int64_t Ns,
                            int64_t Ks, void *scodes, void *sscale, uint8_t *szero)
{
    const uint8_t *c = codes; /* [N, K] bytes, or [N, K/2] nibble pairs */
    uint8_t *sc = scodes;     /* [Ns, Ks] bytes, or [Ns, Ks/2] nibble pairs */
    for (int64_t n = 0; n < Ns; n++) {
        if (!is4(qw)) {
            memcpy(sc + n * Ks, c + (n0 + n) * K + k0, (size_t)Ks);
        } else if (k0 % 2 == 0) {
            memcpy(sc + n * Ks / 2, c + ((n0 + n) * K + k0) / 2, (size_t)(Ks / 2));
        } else { /* the pairs shift by one nibble: rebuild them */
            for (int64_t k = 0; k < Ks; k += 2) {
                unsigned lo = moe_quant_src_raw(qw, c, K, n0 + n, k0 + k), hi = moe_quant_src_raw(qw, c, K, n0 + n, k0 + k + 1);
                sc[(n * Ks + k) / 2] = (uint8_t)(lo | hi << 4);
            }
        }
    }
    /* every cell of the slice's grid takes the scale (and zero point) of the source cell
     * holding its first element */
    int64_t rows, cols;
    moe_quant_grid(sq, Ns, Ks, &rows, &cols);
    const size_t ss = qw->dtype == MOE_QTYPE_MXFP4 ? 1 : 4;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t n = 0, k = 0; /* the cell's first element, slice coordinates */
            switch (sq->scale) {
            case MOE_QSCALE_TENSOR: break;
            case MOE_QSCALE_CHANNEL: n = i; break;
            case MOE_QSCALE_BLOCK: n = i * sq->block_n; k = j * sq->block_k; break;
            default: n = i; k = j * sq->group_size; break;
            }
            const int64_t from = moe_quant_scale_index(qw, N, K, n0 + n, k0 + k);
            memcpy((unsigned char *)sscale + (size_t)(i * cols + j) * ss, (const unsigned char *)scale + (size_t)from * ss,
                   ss);
            if (qw->has_zero_point)
                szero[i * cols + j] = zero[from];
        }
}
