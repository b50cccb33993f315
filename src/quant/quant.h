/* Quantized schemes (fp8 e4m3, int8, int4, mxfp4 e2m1 + E8M0): the scalar codecs, dynamic
 * activation quantization, names and text of moe_quant_config, and the source layout of
 * moe_quant.h (sizes, quantization, TP slicing). The packed layouts are in
 * quant/layout.h, the per-format rows (validation, packing, decode) in quant/format.h. */
#ifndef MOE_QUANT_QUANT_H
#define MOE_QUANT_QUANT_H

#include "quant/convert.h"
#include "quant/layout.h"

#include <math.h>

/* ---- scalar decoders: exact ---- */

/* moe_e4m3_x256[c] = dec(c) * 256 for every e4m3 code c (NaN codes NaN): the fp8 w8a8 AVX-512
 * kernel's activation table. Filled by a constructor in quant.c, a file compiled without
 * AVX-512 flags: a constructor runs at load on every CPU, so it must not live in src/gemm/avx512
 * (the compiler vectorizes it with AVX-512 there: SIGILL before main on an AVX2-only CPU and
 * under valgrind; tests/CMakeLists.txt isa_objects_no_constructors checks). */
extern float moe_e4m3_x256[256];

/* e4m3fn <-> f32: moe_e4m3_to_f32 (exact) and moe_f32_to_e4m3 (nearest even, saturating) are in
 * quant/convert.h. */

/* e2m1 code (4 bits) -> f32: {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign. */
static inline float moe_e2m1_to_f32(unsigned c)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[c & 7u];
    return (c & 8u) ? -v : v;
}

/* f32 -> e2m1 code, round to nearest (ties to even code), saturating to +-6. */
unsigned moe_f32_to_e2m1(float f);

/* E8M0 exponent -> f32 2^(e - 127) exactly (e = 0: 2^-127, an f32 subnormal); e = 255 NaN. */
static inline float moe_e8m0_to_f32(uint8_t e)
{
    if (e == 255)
        return moe_bits_to_f32(0x7fc00000u);
    if (e == 0)
        return moe_bits_to_f32(0x00400000u);
    return moe_bits_to_f32((uint32_t)e << 23);
}

/* ---- dynamic int8 activation quantization (moe_quant.h "Quantized experts") ---- */

/* Scale of a row: a = max |x| (NaN ignored), s = a / 127, s = 1 when a == 0. */
static inline float moe_qact_i8_scale(const float *x, int64_t n)
{
    float a = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        float v = fabsf(x[k]);
        a = v > a ? v : a;
    }
    return a == 0.0f ? 1.0f : a / 127.0f;
}

/* q = rint(clamp(x / s, -127, 127)); a NaN quotient gives -127 (the same as vmaxps). */
static inline int8_t moe_qact_i8(float x, float s)
{
    float q = x / s;
    q = q > -127.0f ? q : -127.0f;
    q = q < 127.0f ? q : 127.0f;
    return (int8_t)nearbyintf(q);
}

int moe_quant_active(const moe_quant_config *q);
/* "none", "fp8", "int8", "int4", "mxfp4" (static). */
const char *moe_qtype_name(moe_qtype t);
/* Canonical "key=value;" text of desc->quant (appended to the plan text). */
void moe_quant_text(const moe_quant_config *q, char *buf, size_t n);
int moe_quant_equal(const moe_quant_config *a, const moe_quant_config *b);

/* Quantize an f32 [N, K] row-major matrix into the source format of qw (codes, scales,
 * zero points in the shapes of moe_quant.h). Sizes: moe_quant_source_sizes. For tests and tools. */
void moe_quant_source_sizes(const moe_qweight *qw, int64_t N, int64_t K, size_t *code_bytes,
                            size_t *scale_bytes, size_t *zero_bytes);
int moe_quant_quantize_source(const moe_qweight *qw, const float *w, int64_t N, int64_t K, void *codes,
                              void *scale, uint8_t *zero); /* 0, or -1 out of memory */

/* A TP shard of a source matrix: rows [n0, n0 + Ns) and columns [k0, k0 + Ks) of [N, K].
 * moe_quant_slice_qweight gives the granularity the slice is expressed in (*out = *qw except:
 * BLOCK block_n / block_k and GROUP group_size become gcd(size, offset mod size) where the
 * slice cuts a block or group, so that each cell of the slice lies inside one source cell;
 * unchanged when the slice starts on a boundary or lies inside one cell); -1 when the slice
 * cannot be expressed (INT4 / MXFP4 with odd Ks, empty or negative ranges). Sizes of the
 * slice's buffers: moe_quant_source_sizes(out, Ns, Ks). moe_quant_slice_source copies the codes
 * (4-bit pairs re-paired when k0 is odd) and gives every cell of the slice's grid the scale
 * and zero point of the source cell holding its first element: the slice dequantizes to
 * exactly the slice of the dequantized matrix. */
int moe_quant_slice_qweight(const moe_qweight *qw, int64_t n0, int64_t Ns, int64_t k0, int64_t Ks, moe_qweight *out);
void moe_quant_slice_source(const moe_qweight *qw, const void *codes, const void *scale, const uint8_t *zero,
                            int64_t N, int64_t K, int64_t n0, int64_t k0, const moe_qweight *sq, int64_t Ns,
                            int64_t Ks, void *scodes, void *sscale, uint8_t *szero);

/* The source's scale grid [rows, cols] (moe_quant.h "Quantized experts"), the grid index of
 * element (n, k), and the scale of element (n, k) as f32 (E8M0 exponents decoded). */
void moe_quant_grid(const moe_qweight *qw, int64_t N, int64_t K, int64_t *rows, int64_t *cols);
int64_t moe_quant_scale_index(const moe_qweight *qw, int64_t N, int64_t K, int64_t n, int64_t k);
float moe_quant_src_scale(const moe_qweight *qw, const void *scale, int64_t N, int64_t K, int64_t n, int64_t k);
/* The raw byte (8-bit) or nibble (4-bit) of source element (n, k) of codes [N, K]. */
unsigned moe_quant_src_raw(const moe_qweight *qw, const uint8_t *codes, int64_t K, int64_t n, int64_t k);

/* The scale group length along K of qw (K for TENSOR / CHANNEL). */
int64_t moe_quant_gk(const moe_qweight *qw, int64_t K);

/* fp8 activation scale of one group of n values (the F8A8 quant_row, gemm/kernels.h moe_quant_row_fn): max(a, 1e-10) / 448,
 * a = max |x| (NaN ignored). */
static inline float moe_qact_f8_scale(const float *x, int64_t n)
{
    float a = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        float v = fabsf(x[k]);
        a = v > a ? v : a;
    }
    return (a > 1e-10f ? a : 1e-10f) / 448.0f;
}

/* ---- static fp8 activation quantization (moe_quant.h MOE_QACT_STATIC) ---- */

/* The code of v under the static scale s (finite, > 0): e4m3(clamp(v / s, -448, 448)), the
 * quotient rounded once in f32, then nearest even; moe_f32_to_e4m3 saturates (|v / s| >= 448,
 * inf included, gives +-448: the clamp) and keeps NaN (the NaN code). */
static inline uint8_t moe_qact_f8_static(float v, float s)
{
    return moe_f32_to_e4m3(v / s);
}

/* One GEMM input row under the static scale s: dst[k] = moe_qact_f8_static(v[k], s) with
 * v[k] = x[k], or *mul * x[k] (the product rounded to f32 first: apply_router_weight_on_input),
 * and scales[0 .. ng) = s (every activation group of the fp8 w8a8 GEMM has the scale s). In
 * place allowed (dst == (uint8_t *)x: byte k is written after x[k] is read). The one static
 * quantizer: the grouped driver calls it for every kernel table, so the codes are the same on
 * all of them. */
static inline void moe_quant_row_f8_static(const float *x, int64_t n, int64_t ng, const float *mul, float s,
                                           uint8_t *dst, float *scales)
{
    for (int64_t k = 0; k < n; k++) {
        const float v = mul ? *mul * x[k] : x[k];
        dst[k] = moe_qact_f8_static(v, s);
    }
    for (int64_t g = 0; g < ng; g++)
        scales[g] = s;
}
#endif
