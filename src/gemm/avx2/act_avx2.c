/* AVX2 rows of the gate/up epilogue (act_row of table "avx2"): SwiGLU and gpt-oss SwiGLU 8
 * lanes at a time with exactly the operations of core/act.h. AVX2 has no vscalefps, so the
 * final p * 2^n is one multiply by the f32 2^n, built from the exponent bits: the same single
 * rounding as ldexpf while 2^n is a normal f32 (n in [-126, 127]); a group of 8 with any n
 * outside that range (|x| > ~87, or NaN) runs the scalar form (compiled here with FMA). */
#include "core/act.h"
#include "gemm/avx2/avx2.h"

#include <immintrin.h>

#define MOE_AI static inline __attribute__((always_inline))

/* e^x for 8 lanes; *ok = 0 when some lane needs the scalar form. */
MOE_AI __m256 expf8(__m256 x, int *ok)
{
    __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(MOE_EXPF_HI));
    xc = _mm256_max_ps(xc, _mm256_set1_ps(MOE_EXPF_LO));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(MOE_EXPF_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 inr = _mm256_and_ps(_mm256_cmp_ps(n, _mm256_set1_ps(-126.0f), _CMP_GE_OQ),
                                     _mm256_cmp_ps(n, _mm256_set1_ps(127.0f), _CMP_LE_OQ));
    const __m256 notnan = _mm256_cmp_ps(x, x, _CMP_ORD_Q);
    *ok = _mm256_movemask_ps(_mm256_and_ps(inr, notnan)) == 0xff;
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(MOE_EXPF_LN2_HI), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(MOE_EXPF_LN2_LO), r);
    __m256 p = _mm256_set1_ps(MOE_EXPF_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MOE_EXPF_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MOE_EXPF_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MOE_EXPF_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MOE_EXPF_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MOE_EXPF_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* -x exactly as C's unary minus. */
MOE_AI __m256 neg(__m256 x)
{
    return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

/* 8 lanes of act(g, u); *ok = 0: the caller runs the scalar form instead. */
MOE_AI __m256 act8(const moe_layer_desc *d, __m256 g, __m256 u, int *ok)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    if (d->activation == MOE_ACT_SWIGLU_OAI) {
        const __m256 lim = _mm256_set1_ps(d->swiglu_limit), nlim = _mm256_set1_ps(-d->swiglu_limit);
        const __m256 gc = _mm256_blendv_ps(g, lim, _mm256_cmp_ps(g, lim, _CMP_GT_OQ));
        __m256 uc = _mm256_blendv_ps(u, nlim, _mm256_cmp_ps(u, nlim, _CMP_LT_OQ));
        uc = _mm256_blendv_ps(uc, lim, _mm256_cmp_ps(u, lim, _CMP_GT_OQ));
        const __m256 e = expf8(neg(_mm256_mul_ps(_mm256_set1_ps(d->swiglu_alpha), gc)), ok);
        const __m256 glu = _mm256_div_ps(gc, _mm256_add_ps(one, e));
        return _mm256_mul_ps(_mm256_add_ps(uc, one), glu);
    }
    const __m256 e = expf8(neg(g), ok);
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

void moe_act_row_avx2(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                      float *h, int64_t n)
{
    int64_t j = 0;
    if (g && (d->activation == MOE_ACT_SWIGLU || d->activation == MOE_ACT_SWIGLU_OAI)) { /* !g: non-gated */
        for (; j + 8 <= n; j += 8) {
            __m256 gv = _mm256_loadu_ps(g + j), uv = _mm256_loadu_ps(u + j);
            if (bg) {
                gv = _mm256_add_ps(gv, _mm256_loadu_ps(bg + j));
                uv = _mm256_add_ps(uv, _mm256_loadu_ps(bu + j));
            }
            int ok;
            const __m256 hv = act8(d, gv, uv, &ok);
            if (ok)
                _mm256_storeu_ps(h + j, hv);
            else
                moe_act_row_scalar(d, g + j, u + j, bg ? bg + j : NULL, bu ? bu + j : NULL, h + j, 8);
        }
    }
    moe_act_row_scalar(d, g ? g + j : NULL, u + j, bg ? bg + j : NULL, bu ? bu + j : NULL, h + j, n - j);
}
