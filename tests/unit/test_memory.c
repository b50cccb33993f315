/* Resource bounds (docs/checkpoints.md "Memory"): the peak resident memory of loading a
 * checkpoint layer and of moe quantize, measured in a child process (VmHWM after resetting it
 * through /proc/self/clear_refs), against the bound the docs state; and a layer (or a tensor
 * of moe quantize) that cannot fit is refused with the bytes needed and the bytes available
 * before anything is allocated (a child under a low RLIMIT_AS / RLIMIT_DATA).
 * The checkpoint is generated here, sparse (the file's data is a hole: no disk, zero
 * weights): qwen3_moe, 1 layer, E = 16 experts of H = 512, I = 1024 in bf16, so the experts
 * are 48 MiB in the file and 48 MiB packed (bf16 stays bf16). Skipped under the sanitizers,
 * whose shadow memory owns the address space and the resident set. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/mem.h"
#include "moe.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEM_SANITIZED 1
#else
#define MEM_SANITIZED 0
#endif

enum { E = 16, H = 512, I = 1024, K = 2 };
#define MIB ((uint64_t)1 << 20)
/* What a load may hold beyond the mapped tensors and the packed bytes: the plan, the
 * checkpoint's tensor tables, malloc's arenas, the OpenMP runtime. Measured: about 0.3 MiB. */
#define LOAD_SLACK (8 * MIB)

/* bytes of the experts in the file, and packed (bf16 kept): 3 matrices of I x H per expert */
static const uint64_t EXPERT_BYTES = (uint64_t)3 * E * H * I * 2;
static const uint64_t ROUTER_F32 = (uint64_t)E * H * 4; /* the router, packed as f32 */

static char g_ck[512];

/* ---- the generated checkpoint ------------------------------------------------------------ */

static void make_sparse_checkpoint(char *dir, size_t len)
{
    tu_tmpdir(dir, len, "mem-ck");
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char cfg[1024];
    int n = snprintf(cfg, sizeof cfg,
                     "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
                     "\"hidden_size\": %d, \"intermediate_size\": %d, \"moe_intermediate_size\": %d, "
                     "\"num_experts\": %d, \"num_experts_per_tok\": %d, \"num_hidden_layers\": 1, "
                     "\"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], "
                     "\"torch_dtype\": \"bfloat16\", \"vocab_size\": 128, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06}\n",
                     H, 4 * H, I, E, K);
    assert_int_equal(tu_write_file(path, cfg, (size_t)n), 0);
    /* header: the router then every expert's gate, up, down, back to back */
    size_t cap = 16384, used = 0;
    char *hdr = malloc(cap);
    assert_non_null(hdr);
    uint64_t off = 0;
    used += (size_t)snprintf(hdr + used, cap - used,
                             "{\"model.layers.0.mlp.gate.weight\": {\"dtype\": \"BF16\", \"shape\": [%d, %d], "
                             "\"data_offsets\": [0, %d]}",
                             E, H, E * H * 2);
    off = (uint64_t)E * H * 2;
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            const uint64_t b = (uint64_t)I * H * 2;
            used += (size_t)snprintf(hdr + used, cap - used,
                                     ", \"model.layers.0.mlp.experts.%d.%s.weight\": {\"dtype\": \"BF16\", \"shape\": "
                                     "[%d, %d], \"data_offsets\": [%" PRIu64 ", %" PRIu64 "]}",
                                     e, proj[p], p == 2 ? H : I, p == 2 ? I : H, off, off + b);
            off += b;
        }
    used += (size_t)snprintf(hdr + used, cap - used, "}");
    assert_true(used + 8 < cap);
    while (used % 8)
        hdr[used++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)used >> (8 * i));
    assert_int_equal(write(fd, len8, 8), 8);
    assert_int_equal(write(fd, hdr, used), (ssize_t)used);
    assert_int_equal(ftruncate(fd, (off_t)(8 + used + off)), 0); /* the data: a hole of zeros */
    assert_int_equal(close(fd), 0);
    free(hdr);
}

static int group_setup(void **state)
{
    tu_group_tmp_setup(state);
    if (!MEM_SANITIZED)
        make_sparse_checkpoint(g_ck, sizeof g_ck);
    return 0;
}

/* ---- /proc/self/status and a child process ------------------------------------------------ */

/* Field `key` of /proc/self/status in bytes (it is in kB there); 0 when absent. */
static uint64_t status_bytes(const char *key)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return 0;
    char line[256];
    uint64_t v = 0;
    const size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (strncmp(line, key, kl) == 0 && line[kl] == ':' && sscanf(line + kl + 1, "%llu", &kb) == 1) {
            v = (uint64_t)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* Reset VmHWM to the current resident set (Linux >= 4.0); 0 on success. */
static int reset_peak(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    if (fd < 0)
        return -1;
    int ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok ? 0 : -1;
}

/* What a child reports back. */
typedef struct child_out {
    int ran;                 /* 0: the child could not measure (clear_refs refused) */
    moe_status st;
    uint64_t peak, rss_anon, rss_file, packed, base_rss;
    char msg[1024];
} child_out;

typedef void (*child_fn)(child_out *out, const void *arg);

/* Run fn in a forked child; its child_out comes back through a pipe. */
static void in_child(child_fn fn, const void *arg, child_out *out)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        child_out o;
        memset(&o, 0, sizeof o);
        fn(&o, arg);
        ssize_t w = write(p[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 1);
    }
    close(p[1]);
    memset(out, 0, sizeof *out);
    size_t got = 0;
    while (got < sizeof *out) {
        ssize_t r = read(p[0], (char *)out + got, sizeof *out - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(p[0]);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || got != sizeof *out)
        fail_msg("the child died (status %d) after %zu of %zu bytes", ws, got, sizeof *out);
}

/* ---- loading a layer ---------------------------------------------------------------------- */

typedef struct load_arg {
    int limit;          /* 0 none, 1 RLIMIT_AS, 2 RLIMIT_DATA: the current use + headroom */
    uint64_t headroom;
} load_arg;

static void load_child(child_out *o, const void *argp)
{
    const load_arg *a = argp;
    moe_ctx *ctx = tu_ctx();
    moe_checkpoint *ck = NULL;
    moe_layer_desc d;
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    if ((o->st = moe_checkpoint_open(ctx, g_ck, &ck)) != MOE_OK ||
        (o->st = moe_checkpoint_layer_desc(ck, 0, &d)) != MOE_OK || (o->st = moe_plan_create(ctx, &d, &plan)) != MOE_OK) {
        snprintf(o->msg, sizeof o->msg, "setup: %s", moe_ctx_last_error(ctx));
        o->ran = 1;
        return;
    }
    if (a->limit) {
        const int res = a->limit == 1 ? RLIMIT_AS : RLIMIT_DATA;
        struct rlimit rl = {.rlim_cur = status_bytes(a->limit == 1 ? "VmSize" : "VmData") + a->headroom};
        struct rlimit old;
        getrlimit(res, &old);
        rl.rlim_max = old.rlim_max;
        if (setrlimit(res, &rl) != 0) {
            snprintf(o->msg, sizeof o->msg, "setrlimit failed");
            return;
        }
    }
    const uint64_t anon0 = status_bytes("RssAnon"), file0 = status_bytes("RssFile");
    if (reset_peak() != 0)
        return; /* o->ran = 0: the parent skips */
    o->ran = 1;
    o->base_rss = status_bytes("VmRSS");
    o->st = moe_checkpoint_load_weights(ck, 0, plan, &w);
    o->peak = status_bytes("VmHWM") - o->base_rss;
    o->rss_anon = status_bytes("RssAnon") - anon0;
    o->rss_file = status_bytes("RssFile") - file0;
    snprintf(o->msg, sizeof o->msg, "%s", o->st == MOE_OK ? "" : moe_ctx_last_error(ctx));
    o->packed = w ? moe_weights_expert_bytes(w) : 0;
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* docs/checkpoints.md: peak RSS of a load <= the layer's tensor bytes in the file (mapped,
 * read once; reclaimable page cache, counted in VmHWM) + the packed bytes + LOAD_SLACK; the
 * anonymous memory it keeps <= packed + LOAD_SLACK (no whole-file or whole-tensor copies). */
static void test_load_peak_rss(void **state)
{
    (void)state;
    if (MEM_SANITIZED)
        skip();
    load_arg a = {0, 0};
    child_out o;
    in_child(load_child, &a, &o);
    if (!o.ran)
        skip(); /* no /proc/self/clear_refs */
    if (o.st != MOE_OK)
        fail_msg("load: %s: %s", moe_status_name(o.st), o.msg);
    /* the packed size, computed independently: bf16 experts stay bf16 */
    assert_int_equal(o.packed, EXPERT_BYTES);
    const uint64_t mapped = EXPERT_BYTES + (uint64_t)E * H * 2;
    const uint64_t bound = mapped + o.packed + ROUTER_F32 + LOAD_SLACK;
    print_message("load of one layer (E %d, H %d, I %d, bf16): packed %.2f MiB, peak RSS +%.2f MiB (bound %.2f MiB), "
                  "anonymous +%.2f MiB, file pages +%.2f MiB\n",
                  E, H, I, (double)o.packed / MIB, (double)o.peak / MIB, (double)bound / MIB,
                  (double)o.rss_anon / MIB, (double)o.rss_file / MIB);
    if (o.peak > bound)
        fail_msg("peak RSS grew by %" PRIu64 " bytes, over the bound %" PRIu64, o.peak, bound);
    if (o.rss_anon > o.packed + ROUTER_F32 + LOAD_SLACK)
        fail_msg("the load keeps %" PRIu64 " anonymous bytes, over packed %" PRIu64 " + slack", o.rss_anon, o.packed);
    /* and it really packed: the anonymous memory holds at least the packed bytes */
    assert_true(o.rss_anon + MIB >= o.packed);
}

/* The number after `key` in msg (e.g. "needs "), or 0. */
static uint64_t number_after(const char *msg, const char *key)
{
    const char *p = strstr(msg, key);
    return p ? strtoull(p + strlen(key), NULL, 10) : 0;
}

/* Under a limit leaving 16 MiB, the 48 MiB layer is refused before anything is allocated:
 * MOE_ENOMEM naming the bytes needed (packed experts + the f32 router), the bytes available
 * and the limit they come from. */
static void refused_under(int limit, const char *source)
{
    if (MEM_SANITIZED)
        skip();
    load_arg a = {limit, 16 * MIB};
    child_out o;
    in_child(load_child, &a, &o);
    if (!o.ran)
        skip();
    print_message("under %s: %s\n", source, o.msg);
    assert_int_equal(o.st, MOE_ENOMEM);
    const uint64_t need = EXPERT_BYTES + ROUTER_F32;
    char want[96];
    snprintf(want, sizeof want, "needs %" PRIu64 " bytes (48.0 MiB)", need);
    if (!strstr(o.msg, want) || !strstr(o.msg, source) || !strstr(o.msg, "refused before allocating"))
        fail_msg("message lacks \"%s\" or \"%s\": %s", want, source, o.msg);
    const uint64_t avail = number_after(o.msg, " but ");
    assert_true(avail > 0 && avail <= 16 * MIB);
    /* nothing was packed: the resident set did not grow by the layer */
    assert_true(o.rss_anon < 4 * MIB);
}

static void test_load_refused_rlimit_as(void **state)
{
    (void)state;
    refused_under(1, "RLIMIT_AS");
}

static void test_load_refused_rlimit_data(void **state)
{
    (void)state;
    refused_under(2, "RLIMIT_DATA");
}

/* ---- moe quantize ------------------------------------------------------------------------- */

typedef struct quant_arg {
    const char *out;
    uint64_t data_headroom; /* 0: no limit; else RLIMIT_DATA = VmData + this */
} quant_arg;

static void quant_child(child_out *o, const void *argp)
{
    const quant_arg *a = argp;
    moe_ctx *ctx = tu_ctx();
    moe_quantize_options q;
    memset(&q, 0, sizeof q);
    q.scheme = "int8-channel";
    moe_quantize_stats s;
    if (a->data_headroom) {
        struct rlimit old, rl;
        getrlimit(RLIMIT_DATA, &old);
        rl.rlim_cur = status_bytes("VmData") + a->data_headroom;
        rl.rlim_max = old.rlim_max;
        if (setrlimit(RLIMIT_DATA, &rl) != 0)
            return;
    }
    const uint64_t anon0 = status_bytes("RssAnon");
    if (reset_peak() != 0)
        return;
    o->ran = 1;
    o->base_rss = status_bytes("VmRSS");
    o->st = moe_checkpoint_quantize(ctx, g_ck, a->out, &q, &s);
    o->peak = status_bytes("VmHWM") - o->base_rss;
    o->rss_anon = status_bytes("RssAnon") - anon0;
    o->packed = s.output_code_bytes + s.output_scale_bytes + s.output_zero_bytes + s.other_bytes;
    snprintf(o->msg, sizeof o->msg, "%s", o->st == MOE_OK ? "" : moe_ctx_last_error(ctx));
    moe_ctx_free(ctx);
}

/* docs/checkpoints.md: peak RSS of moe quantize <= the input shard (mapped) + the output
 * shard being built (held until written) + 3 x the largest expert linear in f32 + slack. */
static void test_quantize_peak_rss(void **state)
{
    (void)state;
    if (MEM_SANITIZED)
        skip();
    char out[700];
    char root[600];
    tu_tmpdir(root, sizeof root, "mem-q");
    snprintf(out, sizeof out, "%s/int8", root);
    quant_arg a = {out, 0};
    child_out o;
    in_child(quant_child, &a, &o);
    if (!o.ran)
        skip();
    if (o.st != MOE_OK)
        fail_msg("quantize: %s: %s", moe_status_name(o.st), o.msg);
    /* int8-channel: one byte per weight, one f32 scale per output row (independent count) */
    const uint64_t out_bytes = (uint64_t)E * (2 * ((uint64_t)I * H + (uint64_t)I * 4) + (uint64_t)H * I + (uint64_t)H * 4);
    const uint64_t router = (uint64_t)E * H * 2;
    assert_true(o.packed >= out_bytes && o.packed <= out_bytes + router + 4096);
    const uint64_t f32_linear = (uint64_t)I * H * 4;
    const uint64_t in_shard = EXPERT_BYTES + router;
    const uint64_t bound = in_shard + o.packed + 3 * f32_linear + LOAD_SLACK;
    print_message("moe quantize int8-channel (input %.2f MiB, output %.2f MiB): peak RSS +%.2f MiB (bound %.2f MiB), "
                  "anonymous at the end +%.2f MiB\n",
                  (double)in_shard / MIB, (double)o.packed / MIB, (double)o.peak / MIB, (double)bound / MIB,
                  (double)o.rss_anon / MIB);
    if (o.peak > bound)
        fail_msg("peak RSS grew by %" PRIu64 " bytes, over the bound %" PRIu64, o.peak, bound);
    tu_rm_tree(out);
}

/* Under RLIMIT_DATA leaving 1 MiB, the first expert linear (2 MiB in f32) is refused with
 * its name and both sizes, and nothing is left at the output. */
static void test_quantize_refused(void **state)
{
    (void)state;
    if (MEM_SANITIZED)
        skip();
    char root[600], out[700];
    tu_tmpdir(root, sizeof root, "mem-qr");
    snprintf(out, sizeof out, "%s/int8", root);
    quant_arg a = {out, MIB};
    child_out o;
    in_child(quant_child, &a, &o);
    if (!o.ran)
        skip();
    print_message("quantize under RLIMIT_DATA: %s\n", o.msg);
    assert_int_equal(o.st, MOE_ENOMEM);
    /* f32 copy [I, H] + twice (codes I*H + scales I*4) */
    const uint64_t need = (uint64_t)I * H * 4 + 2 * ((uint64_t)I * H + (uint64_t)I * 4);
    char want[96];
    snprintf(want, sizeof want, "needs %" PRIu64 " bytes", need);
    if (!strstr(o.msg, want) || !strstr(o.msg, "RLIMIT_DATA") || !strstr(o.msg, "model.layers.0.mlp.experts.0.gate_proj"))
        fail_msg("message lacks \"%s\", RLIMIT_DATA or the tensor: %s", want, o.msg);
    const uint64_t avail = number_after(o.msg, " but ");
    assert_true(avail <= MIB);
    assert_int_equal(access(out, F_OK), -1);
}

/* MemAvailable 0 (seen once, transiently) is unknown, not a bound of 0 bytes that refuses
 * every layer; a plausible MemAvailable is a bound named by its file. */
static void test_meminfo_zero_is_unknown(void **state)
{
    (void)state;
    char dir[1024], path[1100];
    tu_tmpdir(dir, sizeof dir, "meminfo");
    snprintf(path, sizeof path, "%s/meminfo", dir);
    static const char zero[] = "MemTotal:       16000000 kB\nMemFree:          100 kB\nMemAvailable:          0 kB\n";
    assert_int_equal(tu_write_file(path, zero, sizeof zero - 1), 0);
    moe_mem_avail a;
    moe_mem_available_from(path, &a);
    assert_null(strstr(a.source, path)); /* not a bound (another one may be known) */
    assert_true(!a.known || a.bytes > 0 || strstr(a.source, "MemAvailable") == NULL);
    static const char two_mib[] = "MemTotal:       16000000 kB\nMemAvailable:       2048 kB\n";
    assert_int_equal(tu_write_file(path, two_mib, sizeof two_mib - 1), 0);
    moe_mem_available_from(path, &a);
    assert_true(a.known);
    assert_true(a.bytes <= 2048u * 1024u);
    if (a.bytes == 2048u * 1024u)
        assert_non_null(strstr(a.source, path));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_peak_rss),
        cmocka_unit_test(test_load_refused_rlimit_as),
        cmocka_unit_test(test_load_refused_rlimit_data),
        cmocka_unit_test(test_quantize_peak_rss),
        cmocka_unit_test(test_quantize_refused),
        cmocka_unit_test(test_meminfo_zero_is_unknown),
    };
    return cmocka_run_group_tests(tests, group_setup, tu_group_tmp_teardown);
}
