/* How much memory this process can still take, asked before a large allocation (packed
 * weights, moe quantize's per-tensor buffers) so that a layer that cannot fit is refused with
 * the sizes, instead of the process being killed by the OOM killer half-way. */
#include "core/mem.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The value of `key` (a "Key:" line, in kB) of a /proc file, in bytes; 0 when absent. */
static int proc_kb(const char *path, const char *key, uint64_t *bytes)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[256];
    const size_t kl = strlen(key);
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (strncmp(line, key, kl) == 0 && line[kl] == ':' && sscanf(line + kl + 1, "%llu", &kb) == 1) {
            *bytes = (uint64_t)kb * 1024;
            found = 1;
            break;
        }
    }
    fclose(f);
    return found;
}

/* One unsigned number from a file ("max" or unreadable: 0). */
static int file_u64(const char *path, uint64_t *v)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    unsigned long long x;
    int ok = fscanf(f, "%llu", &x) == 1;
    fclose(f);
    if (ok)
        *v = (uint64_t)x;
    return ok;
}

/* Keep the smaller bound. */
static void bound(moe_mem_avail *out, uint64_t bytes, const char *fmt, ...) MOE_PRINTF(3, 4);
static void bound(moe_mem_avail *out, uint64_t bytes, const char *fmt, ...)
{
    if (out->known && bytes >= out->bytes)
        return;
    out->known = 1;
    out->bytes = bytes;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->source, sizeof out->source, fmt, ap);
    va_end(ap);
}

/* The memory cgroup of this process: v2 ("0::/path" in /proc/self/cgroup: memory.max,
 * memory.current) or v1 (the "memory" controller's line: memory.limit_in_bytes,
 * memory.usage_in_bytes). No limit ("max", or v1's huge value) is no bound. */
static void cgroup_bound(moe_mem_avail *out)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char dir[1200], lim_path[1300], cur_path[1300];
        const char *v1 = strstr(line, ":memory:");
        uint64_t lim = 0, cur = 0;
        if (strncmp(line, "0::", 3) == 0) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", line + 3);
            snprintf(lim_path, sizeof lim_path, "%s/memory.max", dir);
            snprintf(cur_path, sizeof cur_path, "%s/memory.current", dir);
        } else if (v1) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", v1 + strlen(":memory:"));
            snprintf(lim_path, sizeof lim_path, "%s/memory.limit_in_bytes", dir);
            snprintf(cur_path, sizeof cur_path, "%s/memory.usage_in_bytes", dir);
        } else {
            continue;
        }
        if (!file_u64(lim_path, &lim) || !file_u64(cur_path, &cur) || lim >= ((uint64_t)1 << 62))
            continue;
        bound(out, lim > cur ? lim - cur : 0, "cgroup limit %" PRIu64 " bytes minus %" PRIu64 " in use (%s)", lim, cur,
              lim_path);
    }
    fclose(f);
}

void moe_mem_available_from(const char *meminfo, moe_mem_avail *out)
{
    memset(out, 0, sizeof *out);
    uint64_t v;
    /* MemAvailable 0 is implausible on a running system (a misread or a kernel mid-update):
     * unknown, not a bound that refuses everything */
    if (proc_kb(meminfo, "MemAvailable", &v) && v > 0)
        bound(out, v, "MemAvailable in %s", meminfo);
    cgroup_bound(out);
    struct rlimit rl;
    uint64_t used;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && proc_kb("/proc/self/status", "VmSize", &used))
        bound(out, (uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 0,
              "RLIMIT_AS %" PRIu64 " bytes minus VmSize %" PRIu64 " in use", (uint64_t)rl.rlim_cur, used);
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && proc_kb("/proc/self/status", "VmData", &used))
        bound(out, (uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 0,
              "RLIMIT_DATA %" PRIu64 " bytes minus VmData %" PRIu64 " in use", (uint64_t)rl.rlim_cur, used);
}

void moe_mem_available(moe_mem_avail *out)
{
    moe_mem_available_from("/proc/meminfo", out);
}

moe_status moe_mem_check(moe_ctx *ctx, uint64_t need, const char *what)
{
    moe_mem_avail a;
    moe_mem_available(&a);
    if (!a.known || need <= a.bytes)
        return MOE_OK;
    /* about to refuse: read the bounds once more, so that one transient figure (memory freed
     * meanwhile, a file read mid-update) does not refuse a layer that fits */
    moe_mem_available(&a);
    if (!a.known || need <= a.bytes)
        return MOE_OK;
    return moe_set_error(ctx, MOE_ENOMEM,
                         "%s needs %" PRIu64 " bytes (%.1f MiB) but %" PRIu64 " bytes (%.1f MiB) are available (%s); "
                         "refused before allocating",
                         what, need, (double)need / 1048576.0, a.bytes, (double)a.bytes / 1048576.0, a.source);
}
