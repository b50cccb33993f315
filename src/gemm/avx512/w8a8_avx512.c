/* AVX-512 W8A8 int8 kernel (AVX512-VNNI vpdpbusd), the MOE_QK_W8A8 branch of linear_q of
 * table "avx512": the same bits as src/gemm/linear_q_ref.c. Activations are quantized per row
 * (s = absmax / 127) to u8 = q + 128, weights s8, int32 sums; 128 * sum_k w[n][k]
 * (precomputed) is subtracted, which gives exactly sum_k q[k] w[n][k]: the ref's int32.
 * Without VNNI at run time the ref entry runs (identical bits). */
#include "core/kernels.h"
#include "quant/quant.h"

#include <immintrin.h>

/* ---- W8A8 int8 with VNNI ---- */

enum { KC = 1024, PB = 8 }; /* K chunk (bytes of quantized activations per row), panels per block */

/* u8 = q + 128 of x[kc, kc + len) into dst, then zeros (u8 128) up to a multiple of 4. */
static void quant_row(const float *x, int64_t len, float s, uint8_t *dst)
{
    const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    int64_t k = 0;
    for (; k + 16 <= len; k += 16) {
        __m512 qf = _mm512_div_ps(_mm512_loadu_ps(x + k), vs);
        qf = _mm512_min_ps(_mm512_max_ps(qf, lo), hi); /* max(NaN, lo) = lo, as the ref */
        __m512i qi = _mm512_add_epi32(_mm512_cvtps_epi32(qf), _mm512_set1_epi32(128));
        _mm_storeu_si128((__m128i *)(dst + k), _mm512_cvtepi32_epi8(qi));
    }
    for (; k < len; k++)
        dst[k] = (uint8_t)(moe_qact_i8(x[k], s) + 128);
    for (; k % 4; k++)
        dst[k] = 128;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static inline __attribute__((always_inline)) void
vnni_tile(const uint8_t *const *bp, const int *nw, const __mmask16 *mask, const int NP, const int MB,
          const uint8_t (*xq)[KC], int64_t k4n, int32_t (*acc)[PB * MOE_PANEL], int col0)
{
    __m512i a[4][4];
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            a[j][m] = _mm512_loadu_si512(&acc[m][col0 + j * MOE_PANEL]);
    for (int64_t k4 = 0; k4 < k4n; k4++) {
        __m512i wv[4];
        for (int j = 0; j < NP; j++)
            wv[j] = _mm512_maskz_loadu_epi32(mask[j], bp[j] + k4 * nw[j] * 4);
        for (int m = 0; m < MB; m++) {
            int32_t xv;
            __builtin_memcpy(&xv, &xq[m][4 * k4], 4);
            __m512i xb = _mm512_set1_epi32(xv);
            for (int j = 0; j < NP; j++)
                a[j][m] = _mm512_dpbusd_epi32(a[j][m], xb, wv[j]);
        }
    }
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            _mm512_storeu_si512(&acc[m][col0 + j * MOE_PANEL], a[j][m]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void
w8a8_vnni(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out, int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k, K4 = (K + 3) / 4 * 4;
    const uint8_t *d = w->data;
    uint8_t xq[4][KC] __attribute__((aligned(64)));
    int32_t acc[4][PB * MOE_PANEL] __attribute__((aligned(64)));
    for (int m0 = 0; m0 < mb; m0 += 4) {
        const int MB = mb - m0 < 4 ? mb - m0 : 4;
        float sx[4];
        for (int m = 0; m < MB; m++)
            sx[m] = moe_qact_i8_scale(x[m0 + m], K);
        for (int64_t pb = p0; pb < p1; pb += PB) {
            const int64_t pe = pb + PB < p1 ? pb + PB : p1;
            for (int m = 0; m < MB; m++)
                for (int c = 0; c < PB * MOE_PANEL; c++)
                    acc[m][c] = 0;
            for (int64_t kc = 0; kc < K; kc += KC) {
                const int64_t len = kc + KC < K ? KC : K - kc;
                for (int m = 0; m < MB; m++)
                    quant_row(x[m0 + m] + kc, len, sx[m], xq[m]);
                const int64_t k4n = (len + 3) / 4;
                for (int64_t p = pb; p < pe;) {
                    const int NP = pe - p >= 4 ? 4 : (pe - p >= 2 ? 2 : 1);
                    const uint8_t *bp[4];
                    int nw[4];
                    __mmask16 mask[4];
                    for (int j = 0; j < NP; j++) {
                        nw[j] = moe_pmat_panel_width(w->n, p + j);
                        bp[j] = d + (p + j) * 16 * K4 + (kc / 4) * nw[j] * 4;
                        mask[j] = (__mmask16)((1u << nw[j]) - 1u);
                    }
                    const int col0 = (int)(p - pb) * MOE_PANEL;
#define MOE_VT(np, mbv) vnni_tile(bp, nw, mask, np, mbv, (const uint8_t(*)[KC])xq, k4n, acc, col0)
                    if (NP == 4) {
                        switch (MB) { case 1: MOE_VT(4, 1); break; case 2: MOE_VT(4, 2); break;
                                      case 3: MOE_VT(4, 3); break; default: MOE_VT(4, 4); break; }
                    } else if (NP == 2) {
                        switch (MB) { case 1: MOE_VT(2, 1); break; case 2: MOE_VT(2, 2); break;
                                      case 3: MOE_VT(2, 3); break; default: MOE_VT(2, 4); break; }
                    } else {
                        switch (MB) { case 1: MOE_VT(1, 1); break; case 2: MOE_VT(1, 2); break;
                                      case 3: MOE_VT(1, 3); break; default: MOE_VT(1, 4); break; }
                    }
#undef MOE_VT
                    p += NP;
                }
            }
            /* out = ((float)(acc - 128 sum w) * s_x) * s_w */
            const int64_t n0 = pb * MOE_PANEL, n1 = pe * MOE_PANEL < w->n ? pe * MOE_PANEL : w->n;
            for (int m = 0; m < MB; m++) {
                const __m512 vsx = _mm512_set1_ps(sx[m]);
                for (int64_t n = n0; n < n1; n += 16) {
                    const __mmask16 mk = (__mmask16)(n1 - n >= 16 ? 0xffffu : (1u << (n1 - n)) - 1u);
                    __m512i a = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(mk, &acc[m][n - n0]),
                                                 _mm512_maskz_loadu_epi32(mk, q->comp + n));
                    __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), vsx),
                                             _mm512_maskz_loadu_ps(mk, q->scale + n));
                    _mm512_mask_storeu_ps(out + (int64_t)(m0 + m) * ldo + (n - p0 * MOE_PANEL), mk, r);
                }
            }
        }
    }
}

static int has_vnni(void)
{
    static int v = -1;
    if (v < 0) {
        unsigned a, b, c, dd;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(dd) : "a"(0), "c"(0));
        int r = 0;
        if (a >= 7) {
            __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(dd) : "a"(7), "c"(0));
            r = (c >> 11) & 1;
        }
        v = r;
    }
    return v;
}

void moe_linear_w8a8_avx512(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    if (has_vnni())
        w8a8_vnni(w, p0, p1, x, mb, out, ldo);
    else
        moe_linear_q_ref(w, p0, p1, x, mb, out, ldo);
}
