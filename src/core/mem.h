/* Available memory, checked before large allocations (core/mem.c). */
#ifndef MOE_CORE_MEM_H
#define MOE_CORE_MEM_H

#include "core/internal.h"

/* The least of the bounds this process is under, in bytes: MemAvailable (/proc/meminfo), the
 * memory cgroup's limit minus its usage (v2 memory.max - memory.current, or v1
 * memory.limit_in_bytes - memory.usage_in_bytes), RLIMIT_AS minus VmSize, RLIMIT_DATA minus
 * VmData. known = 0 when none could be read (then nothing is refused). */
typedef struct moe_mem_avail {
    int known;
    uint64_t bytes;
    char source[1500]; /* which bound, with its figures, e.g. "MemAvailable in /proc/meminfo" */
} moe_mem_avail;

void moe_mem_available(moe_mem_avail *out);
/* The same with MemAvailable read from `meminfo` (a /proc/meminfo-format file; tests). A
 * MemAvailable of 0 is taken as unknown (implausible on a running system), not as a bound. */
void moe_mem_available_from(const char *meminfo, moe_mem_avail *out);

/* MOE_OK when `need` bytes fit in moe_mem_available (read a second time before refusing, so
 * that one transient figure refuses nothing); else MOE_ENOMEM recorded on ctx: "<what>
 * needs N bytes (X MiB) but M bytes (Y MiB) are available (<source>); refused before
 * allocating". */
moe_status moe_mem_check(moe_ctx *ctx, uint64_t need, const char *what);

#endif
