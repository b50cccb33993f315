/* libFuzzer target: model.safetensors of a checkpoint with a valid config.json (that of
 * tests/fixtures/olmoe_gelu_f32: H 16, I 8, E 4, K 2). The input is model.safetensors; it goes
 * through moe_checkpoint_open, moe_checkpoint_layer_desc of layer 0, moe_plan_create,
 * moe_checkpoint_load_weights and, when all succeed, one execute of 3 tokens whose top-k ids
 * must be K distinct experts in [0, E).
 *
 * The custom mutator knows the file's structure: an 8-byte little-endian header length, the
 * JSON header, the data section. It edits the header as JSON (a tensor's dtype, a dimension of
 * its shape, its data_offsets, its name; removes or duplicates an entry) and writes the length
 * word back, or edits the length word itself, or mutates the header's bytes or the data
 * section's bytes (libFuzzer's mutator), or the whole input. */
#include "fuzz_util.h"

#include <jansson.h>

#define CKPT MOE_FUZZ_FIXTURES "/olmoe_gelu_f32"
#define N_TOK 3

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static moe_ctx *ctx;
static char dir[PATH_MAX], model_path[PATH_MAX];
static float x[N_TOK * 16]; /* [N_TOK, H] the fixture's first input rows */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ctx = fz_ctx();
    snprintf(dir, sizeof dir, "%s", fz_dir());
    size_t n;
    unsigned char *cfg = fz_read(CKPT "/config.json", &n);
    char p[PATH_MAX];
    fz_write(fz_join(p, dir, "config.json"), cfg, n);
    free(cfg);
    moe_safetensors *in = NULL;
    moe_tensor_info ti;
    if (moe_safetensors_open(ctx, CKPT "/input.safetensors", &in) != MOE_OK ||
        moe_safetensors_get(in, "hidden_states", &ti) != MOE_OK || ti.nbytes < sizeof x)
        abort();
    memcpy(x, ti.data, sizeof x);
    moe_safetensors_free(in);
    fz_join(model_path, dir, "model.safetensors");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(model_path, data, size);
    moe_checkpoint *ck = NULL;
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    moe_layer_desc d;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) {
        st = moe_checkpoint_layer_desc(ck, 0, &d);
        if (st == MOE_OK)
            st = moe_plan_create(ctx, &d, &plan);
        if (st == MOE_OK)
            st = moe_checkpoint_load_weights(ck, 0, plan, &w);
    }
    fz_check_error(ctx, st, "opening and loading layer 0");
    moe_checkpoint_free(ck);
    if (st == MOE_OK) {
        if (d.hidden_size != 16 || d.num_experts != 4 || d.top_k != 2)
            abort(); /* config.json's sizes, which the tensors were checked against */
        float out[N_TOK * 16];           /* [N_TOK, H] */
        int32_t ids[N_TOK * 2];          /* [N_TOK, K] */
        float tw[N_TOK * 2];             /* [N_TOK, K] */
        size_t ws_size = moe_plan_workspace_size(plan, N_TOK);
        void *ws = ws_size ? aligned_alloc(64, (ws_size + 63) / 64 * 64) : NULL;
        if (ws_size && !ws)
            abort();
        moe_exec_args ea;
        memset(&ea, 0, sizeof ea);
        ea.hidden_states = x;
        ea.hidden_dtype = MOE_DTYPE_F32;
        ea.n_tokens = N_TOK;
        ea.output = out;
        ea.topk_ids = ids;
        ea.topk_weights = tw;
        ea.workspace = ws;
        ea.workspace_size = ws_size;
        st = moe_plan_execute_ex(plan, w, &ea);
        if (st != MOE_OK) {
            fprintf(stderr, "fuzz_model: execute failed on loaded weights: %s\n", moe_ctx_last_error(ctx));
            abort();
        }
        for (int t = 0; t < N_TOK; t++) /* router logits may be NaN (fuzzed weights): ids still valid */
            for (int k = 0; k < 2; k++)
                if (ids[t * 2 + k] < 0 || ids[t * 2 + k] >= 4 || (k && ids[t * 2] == ids[t * 2 + 1]))
                    abort();
        free(ws);
    }
    moe_weights_free(w);
    moe_plan_free(plan);
    return 0;
}

/* ---- structure-aware mutator ---- */

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static unsigned rnd(uint64_t *s, unsigned n) { return (unsigned)(rng_next(s) % n); }

static uint64_t rd_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static void wr_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* An integer near v or at an edge: what length words, dimensions and offsets get. */
static json_int_t edge_int(uint64_t *s, json_int_t v, json_int_t end)
{
    const uint64_t u = (uint64_t)v; /* wrapping arithmetic: the edits may overflow on purpose */
    switch (rnd(s, 9)) {
    case 0: return (json_int_t)(u + 1);
    case 1: return (json_int_t)(u - 1);
    case 2: return (json_int_t)(u + rnd(s, 64) - 32);
    case 3: return 0;
    case 4: return end;
    case 5: return (json_int_t)(u * 2);
    case 6: return (json_int_t)((uint64_t)1 << rnd(s, 63));
    case 7: return -1 - (json_int_t)rnd(s, 4);
    default: return INT64_MAX - (json_int_t)rnd(s, 2);
    }
}

/* A random tensor entry (not __metadata__) of the header object, or NULL. */
static const char *pick_key(uint64_t *s, json_t *hdr)
{
    size_t n = json_object_size(hdr);
    if (n == 0)
        return NULL;
    size_t want = rnd(s, (unsigned)n), i = 0;
    const char *key;
    json_t *v;
    json_object_foreach(hdr, key, v) {
        if (i++ == want)
            return strcmp(key, "__metadata__") == 0 ? NULL : key;
    }
    return NULL;
}

static const char *const DTYPES[] = {"F32", "BF16", "F16", "F64", "I8", "U8", "I16", "I32", "I64",
                                     "BOOL", "F8_E4M3", "F8_E4M3FN", "F8_E5M2", "f32", "", "U64"};

/* One edit of the header object; returns 0 if nothing could be edited. */
static int edit_header(uint64_t *s, json_t *hdr, json_int_t data_len)
{
    const char *key = pick_key(s, hdr);
    if (!key) {
        json_object_set_new(hdr, "__metadata__", rnd(s, 2) ? json_integer(1) : json_object());
        return 1;
    }
    json_t *e = json_object_get(hdr, key);
    if (!json_is_object(e))
        return json_object_del(hdr, key) == 0;
    json_t *shape = json_object_get(e, "shape"), *off = json_object_get(e, "data_offsets");
    switch (rnd(s, 8)) {
    case 0: /* dtype */
        if (rnd(s, 8) == 0)
            json_object_set_new(e, "dtype", json_integer(4));
        else
            json_object_set_new(e, "dtype", json_string(DTYPES[rnd(s, sizeof DTYPES / sizeof DTYPES[0])]));
        return 1;
    case 1: /* one dimension */
        if (json_is_array(shape) && json_array_size(shape) > 0) {
            size_t i = rnd(s, (unsigned)json_array_size(shape));
            json_int_t v = json_integer_value(json_array_get(shape, i));
            json_array_set_new(shape, i, json_integer(edge_int(s, v, data_len)));
            return 1;
        }
        json_object_set_new(e, "shape", json_array());
        return 1;
    case 2: /* rank: a dimension more or fewer, or the dimensions swapped */
        if (!json_is_array(shape))
            return 0;
        if (rnd(s, 3) == 0 && json_array_size(shape) >= 2) {
            json_t *a = json_incref(json_array_get(shape, 0));
            json_array_set(shape, 0, json_array_get(shape, 1));
            json_array_set_new(shape, 1, a);
        } else if (rnd(s, 2) && json_array_size(shape) > 0)
            json_array_remove(shape, json_array_size(shape) - 1);
        else
            json_array_append_new(shape, json_integer(rnd(s, 3)));
        return 1;
    case 3: /* data_offsets */
        if (json_is_array(off) && json_array_size(off) == 2) {
            if (rnd(s, 4) == 0) { /* swapped */
                json_t *a = json_incref(json_array_get(off, 0));
                json_array_set(off, 0, json_array_get(off, 1));
                json_array_set_new(off, 1, a);
            } else {
                size_t i = rnd(s, 2);
                json_int_t v = json_integer_value(json_array_get(off, i));
                json_array_set_new(off, i, json_integer(edge_int(s, v, data_len)));
            }
            return 1;
        }
        return 0;
    case 4: { /* both offsets shifted together (the size kept): overlap or past the end */
        if (!json_is_array(off) || json_array_size(off) != 2)
            return 0;
        json_int_t d = edge_int(s, 0, data_len);
        json_int_t a = json_integer_value(json_array_get(off, 0)), b = json_integer_value(json_array_get(off, 1));
        json_array_set_new(off, 0, json_integer((json_int_t)((uint64_t)a + (uint64_t)d)));
        json_array_set_new(off, 1, json_integer((json_int_t)((uint64_t)b + (uint64_t)d)));
        return 1;
    }
    case 5: { /* renamed: one character changed (an expert number, a projection) */
        char name[512];
        snprintf(name, sizeof name, "%s", key);
        size_t n = strlen(name);
        if (n == 0)
            return 0;
        size_t i = rnd(s, (unsigned)n);
        name[i] = (name[i] >= '0' && name[i] <= '9') ? (char)('0' + rnd(s, 10)) : "._0123xyz"[rnd(s, 9)];
        json_t *keep = json_incref(e);
        json_object_del(hdr, key);
        json_object_set_new(hdr, name, keep);
        return 1;
    }
    case 6: /* removed */
        json_object_del(hdr, key);
        return 1;
    default: { /* duplicated under another name (a fifth expert, a same-range twin) */
        char name[520];
        snprintf(name, sizeof name, "%s%s", key, rnd(s, 2) ? "" : "_");
        char *dot = strstr(name, "experts.");
        if (dot && rnd(s, 2))
            dot[8] = (char)('0' + rnd(s, 10));
        json_object_set_new(hdr, name, json_deep_copy(e));
        return 1;
    }
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    uint64_t hlen = size >= 8 ? rd_le64(data) : UINT64_MAX;
    const int framed = size >= 8 && hlen <= size - 8;
    unsigned what = rnd(&s, 16);
    if (!framed || what == 0)
        return LLVMFuzzerMutate(data, size, max_size);
    const size_t data_len = size - 8 - (size_t)hlen;
    if (what == 1) { /* the length word */
        wr_le64(data, (uint64_t)edge_int(&s, (json_int_t)hlen, (json_int_t)(size - 8)));
        return size;
    }
    if (what == 2 && data_len > 0) { /* the data section's bytes (tensor values) */
        return 8 + (size_t)hlen + LLVMFuzzerMutate(data + 8 + hlen, data_len, data_len);
    }
    /* the header: as JSON (most often) or as bytes; the length word written back */
    char *text = NULL;
    size_t tlen = 0;
    if (what == 3) {
        size_t cap = (size_t)hlen + 64;
        text = malloc(cap);
        if (!text)
            return size;
        memcpy(text, data + 8, (size_t)hlen);
        tlen = LLVMFuzzerMutate((uint8_t *)text, (size_t)hlen, cap);
    } else {
        json_t *hdr = json_loadb((const char *)data + 8, (size_t)hlen, 0, NULL);
        if (!json_is_object(hdr)) {
            json_decref(hdr);
            return LLVMFuzzerMutate(data, size, max_size);
        }
        int edits = 1 + (int)rnd(&s, 3);
        for (int i = 0; i < edits; i++)
            edit_header(&s, hdr, (json_int_t)data_len);
        text = json_dumps(hdr, JSON_COMPACT);
        json_decref(hdr);
        if (!text)
            return size;
        tlen = strlen(text);
        while (rnd(&s, 2) && tlen % 8 != 0) { /* sometimes padded with spaces, as writers do */
            char *t2 = realloc(text, tlen + 2);
            if (!t2)
                break;
            text = t2;
            text[tlen++] = ' ';
            text[tlen] = '\0';
        }
    }
    size_t total = 8 + tlen + data_len;
    if (total > max_size) {
        free(text);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    memmove(data + 8 + tlen, data + 8 + hlen, data_len);
    memcpy(data + 8, text, tlen);
    wr_le64(data, rnd(&s, 8) == 0 ? (uint64_t)edge_int(&s, (json_int_t)tlen, (json_int_t)total) : (uint64_t)tlen);
    free(text);
    return total;
}
