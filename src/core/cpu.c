/* Run-time CPU features from CPUID and XCR0, in one place (core/cpu.h). An ISA counts only
 * when the CPU has its instructions AND the OS saves its registers (XCR0). Reading them has no
 * side effect on the process: the Linux AMX tile-data permission (arch_prctl
 * ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), which enlarges every thread's signal frame, is left
 * to an AMX row's detect (docs/adding-an-isa.md), so it is requested only where AMX runs. */
#include "core/cpu.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void)
{
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}
#endif

static moe_cpu_features g_features;
static char g_vendor[16];
static char g_text[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect(void)
{
    moe_cpu_features *f = &g_features;
    memset(f, 0, sizeof *f);
    f->vendor = g_vendor;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return;
    const unsigned max_leaf = a;
    memcpy(g_vendor, &b, 4);
    memcpy(g_vendor + 4, &d, 4);
    memcpy(g_vendor + 8, &c, 4);
    g_vendor[12] = '\0';
    if (max_leaf < 1)
        return;
    __cpuid(1, a, b, c, d);
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    f->os_ymm = avx && (xcr0 & 0x6) == 0x6;            /* XMM and YMM state */
    f->os_zmm = f->os_ymm && (xcr0 & 0xe0) == 0xe0;    /* opmask, ZMM_Hi256, Hi16_ZMM */
    f->os_amx = (xcr0 & 0x60000) == 0x60000;            /* TILECFG, TILEDATA */
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f->avx2 = (b >> 5) & 1;
        f->avx512f = (b >> 16) & 1;
        f->avx512dq = (b >> 17) & 1;
        f->avx512bw = (b >> 30) & 1;
        f->avx512vl = (b >> 31) & 1;
        f->avx512_vnni = (c >> 11) & 1;
        f->avx512_fp16 = (d >> 23) & 1;
        f->amx_bf16 = (d >> 22) & 1;
        f->amx_tile = (d >> 24) & 1;
        f->amx_int8 = (d >> 25) & 1;
        const unsigned sub = a;
        if (sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            f->avx512_bf16 = (a >> 5) & 1;
        }
    }
#endif
    static const struct {
        const char *name;
        size_t off;
    } names[] = {
        {"fma", offsetof(moe_cpu_features, fma)},           {"f16c", offsetof(moe_cpu_features, f16c)},
        {"avx2", offsetof(moe_cpu_features, avx2)},         {"avx512f", offsetof(moe_cpu_features, avx512f)},
        {"avx512dq", offsetof(moe_cpu_features, avx512dq)}, {"avx512bw", offsetof(moe_cpu_features, avx512bw)},
        {"avx512vl", offsetof(moe_cpu_features, avx512vl)}, {"avx512_vnni", offsetof(moe_cpu_features, avx512_vnni)},
        {"avx512_bf16", offsetof(moe_cpu_features, avx512_bf16)},
        {"avx512_fp16", offsetof(moe_cpu_features, avx512_fp16)},
        {"amx_tile", offsetof(moe_cpu_features, amx_tile)}, {"amx_bf16", offsetof(moe_cpu_features, amx_bf16)},
        {"amx_int8", offsetof(moe_cpu_features, amx_int8)}, {"os_ymm", offsetof(moe_cpu_features, os_ymm)},
        {"os_zmm", offsetof(moe_cpu_features, os_zmm)},     {"os_amx", offsetof(moe_cpu_features, os_amx)},
    };
    size_t used = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int on;
        memcpy(&on, (const char *)f + names[i].off, sizeof on);
        if (on && used < sizeof g_text) {
            int n = snprintf(g_text + used, sizeof g_text - used, "%s%s", used ? " " : "", names[i].name);
            if (n > 0)
                used += (size_t)n;
        }
    }
}

const moe_cpu_features *moe_cpu_features_get(void)
{
    pthread_once(&g_once, detect);
    return &g_features;
}

const char *moe_cpu_features_text(void)
{
    pthread_once(&g_once, detect);
    return g_text;
}

static char g_device[128];
static pthread_once_t g_device_once = PTHREAD_ONCE_INIT;

static void read_device_name(void)
{
    char line[512];
    const char *model = NULL;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *colon = strchr(line, ':');
        if (colon) {
            model = colon + 1;
            break;
        }
    }
    size_t n = 0;
    int gap = 0; /* a run of other characters since the last kept one */
    for (const char *c = model; c && *c && n + 2 < sizeof g_device; c++) {
        const int keep = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                         *c == '.' || *c == '-';
        if (!keep) {
            gap = 1;
            continue;
        }
        if (gap && n > 0)
            g_device[n++] = '_';
        gap = 0;
        g_device[n++] = *c;
    }
    g_device[n] = '\0';
    if (f)
        fclose(f);
    if (n == 0)
        snprintf(g_device, sizeof g_device, "unknown_cpu");
}

const char *moe_cpu_device_name(void)
{
    pthread_once(&g_device_once, read_device_name);
    return g_device;
}
