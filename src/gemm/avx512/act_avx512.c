/* AVX-512 rows of the gate/up epilogue (act_row of table "avx512"): SwiGLU and gpt-oss SwiGLU
 * 16 lanes at a time with exactly the operations of core/act.h (moe_expf: clamp, vroundscaleps
 * to nearest = rintf, vfnmadd = fmaf(-n, c, x), Horner vfmadd, vscalefps = ldexpf: one
 * rounding each), then the same division and multiplies, so the bits equal the scalar form.
 * GEGLU (erff / tanhf) runs the scalar form. */
#include "core/act.h"
#include "gemm/avx512/avx512.h"

#include <immintrin.h>

#define MOE_AI static inline __attribute__((always_inline))

MOE_AI __m512 expf16(__m512 x)
{
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_min_ps(x, _mm512_set1_ps(MOE_EXPF_HI));
    xc = _mm512_max_ps(xc, _mm512_set1_ps(MOE_EXPF_LO));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(MOE_EXPF_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MOE_EXPF_LN2_HI), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MOE_EXPF_LN2_LO), r);
    __m512 p = _mm512_set1_ps(MOE_EXPF_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MOE_EXPF_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MOE_EXPF_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MOE_EXPF_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MOE_EXPF_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MOE_EXPF_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_mask_mov_ps(_mm512_scalef_ps(p, n), nan, x);
}

/* -x exactly as C's unary minus (sign flip, NaN included). */
MOE_AI __m512 neg(__m512 x)
{
    return _mm512_xor_ps(x, _mm512_set1_ps(-0.0f));
}

/* The scalar ternaries of core/act.h with NaN kept: `g > limit ? limit : g` is a masked move
 * on an ordered compare (a NaN g compares false and stays). */
MOE_AI __m512 act16(const moe_layer_desc *d, __m512 g, __m512 u)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    if (d->activation == MOE_ACT_SWIGLU_OAI) {
        const __m512 lim = _mm512_set1_ps(d->swiglu_limit), nlim = _mm512_set1_ps(-d->swiglu_limit);
        const __m512 gc = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(g, lim, _CMP_GT_OQ), lim);
        __m512 uc = _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(u, nlim, _CMP_LT_OQ), nlim);
        uc = _mm512_mask_mov_ps(uc, _mm512_cmp_ps_mask(u, lim, _CMP_GT_OQ), lim);
        const __m512 ax = _mm512_mul_ps(_mm512_set1_ps(d->swiglu_alpha), gc);
        const __m512 e = expf16(neg(ax)); /* -(alpha gc) */
        const __m512 glu = _mm512_div_ps(gc, _mm512_add_ps(one, e));
        return _mm512_mul_ps(_mm512_add_ps(uc, one), glu);
    }
    const __m512 e = expf16(neg(g)); /* -g */
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
}

void moe_act_row_avx512(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                        float *h, int64_t n)
{
    if ((d->activation != MOE_ACT_SWIGLU && d->activation != MOE_ACT_SWIGLU_OAI) || !g) { /* !g: non-gated */
        moe_act_row_scalar(d, g, u, bg, bu, h, n);
        return;
    }
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = (__mmask16)(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1u);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + j), uv = _mm512_maskz_loadu_ps(m, u + j);
        if (bg) {
            gv = _mm512_add_ps(gv, _mm512_maskz_loadu_ps(m, bg + j));
            uv = _mm512_add_ps(uv, _mm512_maskz_loadu_ps(m, bu + j));
        }
        _mm512_mask_storeu_ps(h + j, m, act16(d, gv, uv));
    }
}
