#include <moe.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    enum { H = 64, I = 32, E = 8, K = 2, T = 4 };
    moe_ctx *ctx; char err[256];
    if (moe_ctx_create(NULL, &ctx, err, sizeof err) != MOE_OK) { fprintf(stderr, "%s\n", err); return 1; }
    moe_layer_desc d; moe_layer_desc_init(&d);
    d.hidden_size = H; d.moe_intermediate_size = I; d.num_experts = E; d.top_k = K;
    d.renormalize = 1; d.weight_dtype = MOE_DTYPE_F32;          /* Mixtral-style routing */
    static float router[E * H], w1[E][I * H], w3[E][I * H], w2[E][H * I], x[T * H], out[T * H];
    const void *gate[E], *up[E], *down[E];
    for (int i = 0; i < T * H; i++) x[i] = (float)(i % 7) / 7.0f - 0.5f;
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < I * H; i++) w1[e][i] = w3[e][i] = w2[e][i] = (float)((i + e) % 5) * 0.01f;
        gate[e] = w1[e]; up[e] = w3[e]; down[e] = w2[e];
    }
    for (int i = 0; i < E * H; i++) router[i] = (float)(i % 11) * 0.1f;
    moe_weight_source src = {.router = router, .router_dtype = MOE_DTYPE_F32,
                             .gate_proj = gate, .up_proj = up, .down_proj = down};
    moe_plan *plan = NULL; moe_weights *w = NULL;
    moe_status st = moe_plan_create(ctx, &d, &plan);
    if (st == MOE_OK) st = moe_weights_create(plan, &src, &w);
    size_t ws_size = moe_plan_workspace_size(plan, T);           /* bytes for up to T tokens */
    void *ws = aligned_alloc(64, (ws_size + 63) / 64 * 64);
    if (st == MOE_OK) st = ws ? moe_plan_execute(plan, w, x, T, out, ws, ws_size) : MOE_ENOMEM;
    if (st != MOE_OK) fprintf(stderr, "%s: %s\n", moe_status_name(st), moe_ctx_last_error(ctx));
    printf("%s out[0] = %f\n", moe_status_name(st), out[0]);
    free(ws); moe_weights_free(w); moe_plan_free(plan); moe_ctx_free(ctx);
    return st == MOE_OK ? 0 : 1;
}
