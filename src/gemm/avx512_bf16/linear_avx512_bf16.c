/* Compute bf16 on vdpbf16ps (table "avx512_bf16"): the GEMM on bf16 pair panels
 * (quant/layout.h MOE_WF_BF16P), the same bits as src/gemm/linear_bf16_ref.c (the row rounder
 * is the avx512 row's, src/gemm/avx512/bf16_avx512.c). One
 * vdpbf16ps lane is one output feature: it adds x[2i+1] w[2i+1], then x[2i] w[2i], each
 * rounded with DAZ and FTZ (core/bf16.h moe_bf16_dp, checked at registration by
 * moe_avx512_bf16_probe), in increasing i from +0: exactly the ref's chain. Tiles of 6 rows by
 * 4 panels keep 24 zmm accumulators over all of K; per pair step 4 weight loads (16 features
 * x 2 k each) and 6 broadcast pairs, and a prefetch of the caller's next weights (one line a
 * step). Partial panels load and store masked, never padded. */
#include "gemm/avx512_bf16/avx512_bf16.h"

#include <immintrin.h>
#include <string.h>

#define MOE_AI static inline __attribute__((always_inline))

/* The caller's prefetch region (gemm/kernels.h moe_linear_rows_fn's pf, pf_bytes: the
 * weights its next call reads), walked one 64-byte line per pair step over the tiles in order
 * until covered. */
typedef struct prefetch_walk {
    const uint8_t *at, *end;
} prefetch_walk;

/* A tile of NP panels (starting at panel p) by MB rows. */
MOE_AI void tile(const moe_pmat *w, int64_t p, int64_t p0, const int NP, const int MB, const uint8_t *const *x,
                 float *out, int64_t ldo, prefetch_walk *pw)
{
    const int64_t K2 = (w->k + 1) / 2;
    const uint32_t *d = w->data;
    __m512 acc[4][6];        /* [panel][row] */
    const uint32_t *wp[4];   /* each panel's [K2][nw] pairs */
    int nw[4];
    __mmask16 mask[4];
    for (int j = 0; j < NP; j++) {
        nw[j] = moe_pmat_panel_width(w->n, p + j);
        wp[j] = d + (p + j) * MOE_PANEL * K2;
        mask[j] = (__mmask16)((1u << nw[j]) - 1u);
        for (int m = 0; m < MB; m++)
            acc[j][m] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < K2; i++) {
        __m512i wv[4];
        if (pw->at < pw->end) { /* one line of the next weights per step (into L2) */
            _mm_prefetch((const char *)pw->at, _MM_HINT_T1);
            pw->at += 64;
        }
        for (int j = 0; j < NP; j++)
            wv[j] = _mm512_maskz_loadu_epi32(mask[j], wp[j] + i * nw[j]);
        for (int m = 0; m < MB; m++) {
            int32_t pair;
            memcpy(&pair, x[m] + 4 * i, sizeof pair);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            for (int j = 0; j < NP; j++)
                acc[j][m] = _mm512_dpbf16_ps(acc[j][m], (__m512bh)wv[j], xb);
        }
    }
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            _mm512_mask_storeu_ps(out + m * ldo + (p + j - p0) * MOE_PANEL, mask[j], acc[j][m]);
}

void moe_ukr_bf16p_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                         const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                         int64_t pf_bytes)
{
    (void)xs;
    prefetch_walk pw = {.at = pf, .end = pf ? (const uint8_t *)pf + pf_bytes : NULL};
    int m0 = 0;
    while (m0 < mb) {
        const int rows = mb - m0;
        const uint8_t *const *xr = xq + m0;
        float *o = out + (int64_t)m0 * ldo;
        if (rows >= 6) {
            int64_t p = p0;
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 6, xr, o, ldo, &pw);
            for (; p + 2 <= p1; p += 2)
                tile(w, p, p0, 2, 6, xr, o, ldo, &pw);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 6, xr, o, ldo, &pw);
            m0 += 6;
            continue;
        }
        /* 1..5 rows left: against 4 panels at a time, then one */
        int64_t p = p0;
        switch (rows) {
        case 1:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 1, xr, o, ldo, &pw);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 1, xr, o, ldo, &pw);
            break;
        case 2:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 2, xr, o, ldo, &pw);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 2, xr, o, ldo, &pw);
            break;
        case 3:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 3, xr, o, ldo, &pw);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 3, xr, o, ldo, &pw);
            break;
        case 4:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 4, xr, o, ldo, &pw);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 4, xr, o, ldo, &pw);
            break;
        default:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 5, xr, o, ldo, &pw);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 5, xr, o, ldo, &pw);
            break;
        }
        m0 = mb;
    }
}
