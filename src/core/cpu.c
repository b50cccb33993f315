/* Run-time ISA detection from CPUID and XCR0: an ISA counts only when the CPU has its
 * instructions AND the OS saves its registers (XCR0), so a binary never executes an
 * instruction the machine cannot run. */
#include "core/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void)
{
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

typedef struct cpu_bits {
    int avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, os_ymm, os_zmm;
} cpu_bits;

static cpu_bits detect(void)
{
    cpu_bits b = {0};
    unsigned a, bx, c, d;
    if (!__get_cpuid(1, &a, &bx, &c, &d))
        return b;
    int osxsave = (c >> 27) & 1;
    int avx = (c >> 28) & 1;
    b.fma = (c >> 12) & 1;
    b.f16c = (c >> 29) & 1;
    if (osxsave) {
        uint64_t xcr0 = read_xcr0();
        b.os_ymm = avx && ((xcr0 & 0x6) == 0x6);          /* XMM and YMM state */
        b.os_zmm = b.os_ymm && ((xcr0 & 0xe0) == 0xe0);   /* opmask, ZMM_Hi256, Hi16_ZMM */
    }
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, bx, c, d);
        b.avx2 = (bx >> 5) & 1;
        b.avx512f = (bx >> 16) & 1;
        b.avx512dq = (bx >> 17) & 1;
        b.avx512bw = (bx >> 30) & 1;
        b.avx512vl = (bx >> 31) & 1;
    }
    return b;
}

int moe_cpu_has_avx2(void)
{
    cpu_bits b = detect();
    return b.os_ymm && b.avx2 && b.fma && b.f16c;
}

int moe_cpu_has_avx512(void)
{
    cpu_bits b = detect();
    return moe_cpu_has_avx2() && b.os_zmm && b.avx512f && b.avx512bw && b.avx512vl && b.avx512dq;
}
#else
int moe_cpu_has_avx2(void)
{
    return 0;
}
int moe_cpu_has_avx512(void)
{
    return 0;
}
#endif
