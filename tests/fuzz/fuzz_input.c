/* libFuzzer target: the `moe run --input` file. The input is the safetensors file that holds
 * hidden_states [T, H] (F32 or BF16); it goes through what `moe run` does with it: the reader,
 * the lookup of hidden_states, the command's own check (tools/run_input.c) and, when all
 * pass, one execute of layer 0 of the tests/fixtures/olmoe_gelu_f32 checkpoint (opened,
 * planned and packed once) with the outputs checked finite for finite inputs. */
#include "fuzz_util.h"
#include "run_input.h"

#include <math.h>

#define CKPT MOE_FUZZ_FIXTURES "/olmoe_gelu_f32"

static moe_ctx *ctx;
static moe_layer_desc desc;
static moe_plan *plan;
static moe_weights *weights;
static char path[PATH_MAX];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ctx = fz_ctx();
    fz_join(path, fz_dir(), "input.safetensors");
    moe_checkpoint *ck = NULL;
    if (moe_checkpoint_open(ctx, CKPT, &ck) != MOE_OK || moe_checkpoint_layer_desc(ck, 0, &desc) != MOE_OK ||
        moe_plan_create(ctx, &desc, &plan) != MOE_OK || moe_checkpoint_load_weights(ck, 0, plan, &weights) != MOE_OK) {
        fprintf(stderr, "fuzz_input: %s: %s\n", CKPT, moe_ctx_last_error(ctx));
        abort();
    }
    moe_checkpoint_free(ck);
    return 0;
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(path, data, size);
    moe_safetensors *in = NULL;
    moe_status st = moe_safetensors_open(ctx, path, &in);
    if (st != MOE_OK) {
        fz_check_error(ctx, st, "moe_safetensors_open");
        return 0;
    }
    moe_tensor_info ti;
    st = moe_safetensors_get(in, "hidden_states", &ti);
    char msg[2 * PATH_MAX + 512];
    if (st != MOE_OK) {
        fz_check_error(ctx, st, "moe_safetensors_get");
    } else if (run_check_input(&ti, path, CKPT, 0, desc.hidden_size, msg, sizeof msg) != 0) {
        if (!msg[0] || !strstr(msg, path))
            abort();
    } else {
        const int64_t T = ti.shape[0], H = desc.hidden_size, K = desc.top_k;
        const size_t xes = moe_dtype_size(ti.dtype);
        /* buffers as `moe run` has them: x [T, H] (a private aligned copy), out [T, H] f32,
         * topk_ids / topk_weights [T, K] */
        void *x = malloc(ti.nbytes ? ti.nbytes : 1);
        float *out = calloc((size_t)(T * H) + 1, sizeof *out);
        int32_t *ids = calloc((size_t)(T * K) + 1, sizeof *ids);
        float *tw = calloc((size_t)(T * K) + 1, sizeof *tw);
        size_t ws_size = moe_plan_workspace_size(plan, T > 0 ? T : 1);
        void *ws = ws_size ? aligned_alloc(64, (ws_size + 63) / 64 * 64) : NULL;
        if (!x || !out || !ids || !tw || (ws_size && !ws))
            abort();
        memcpy(x, ti.data, ti.nbytes);
        moe_exec_args ea;
        memset(&ea, 0, sizeof ea);
        ea.hidden_states = x;
        ea.hidden_dtype = ti.dtype;
        ea.n_tokens = T;
        ea.output = out;
        ea.topk_ids = ids;
        ea.topk_weights = tw;
        ea.workspace = ws;
        ea.workspace_size = ws_size;
        st = moe_plan_execute_ex(plan, weights, &ea);
        if (st != MOE_OK) {
            fprintf(stderr, "fuzz_input: execute failed on a valid input: %s\n", moe_ctx_last_error(ctx));
            abort();
        }
        /* a row of finite inputs routes to K distinct experts in [0, E) */
        for (int64_t t = 0; t < T; t++) {
            int finite = 1;
            for (int64_t h = 0; h < H && finite; h++) {
                float v;
                if (ti.dtype == MOE_DTYPE_F32)
                    memcpy(&v, (const unsigned char *)x + (size_t)(t * H + h) * xes, sizeof v);
                else {
                    uint16_t b;
                    memcpy(&b, (const unsigned char *)x + (size_t)(t * H + h) * xes, sizeof b);
                    v = bf16_to_f32(b);
                }
                finite = isfinite(v) && fabsf(v) < 1e6f;
            }
            if (!finite)
                continue;
            for (int64_t k = 0; k < K; k++) {
                if (ids[t * K + k] < 0 || ids[t * K + k] >= desc.num_experts)
                    abort();
                for (int64_t j = 0; j < k; j++)
                    if (ids[t * K + j] == ids[t * K + k])
                        abort();
            }
        }
        free(ws);
        free(tw);
        free(ids);
        free(out);
        free(x);
    }
    moe_safetensors_free(in);
    return 0;
}
