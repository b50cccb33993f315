/* What this CPU and OS support, read once from CPUID and XCR0: the one place libmoe asks the hardware. The kernel registry
 * (src/gemm/registry.c) decides from these flags which ISA rows can run and which sub-ISA
 * capabilities a row may use; a flag is set only when the CPU has the instructions AND the OS
 * saves their registers, so a binary never executes an instruction the machine cannot run. */
#ifndef MOE_CORE_CPU_H
#define MOE_CORE_CPU_H

typedef struct moe_cpu_features {
    const char *vendor;  /* static: "GenuineIntel", "AuthenticAMD", ... or "" */
    /* leaf 1 ECX */
    int fma, f16c;
    /* leaf 7 subleaf 0 EBX / ECX / EDX, leaf 7 subleaf 1 EAX */
    int avx2, avx512f, avx512dq, avx512bw, avx512vl, avx512_vnni, avx512_bf16, avx512_fp16;
    int amx_tile, amx_bf16, amx_int8;
    /* XCR0: the OS saves XMM+YMM (bits 1-2), opmask+ZMM (bits 5-7), AMX TILECFG+TILEDATA
     * (bits 17-18) */
    int os_ymm, os_zmm, os_amx;
} moe_cpu_features;

/* The features of this machine, read on the first call (thread-safe) and then cached. Never
 * NULL; on a CPU without CPUID every flag is 0. */
const moe_cpu_features *moe_cpu_features_get(void);

/* "avx2 fma f16c avx512f ..." of the set flags (static storage), for messages and logs. */
const char *moe_cpu_features_text(void);

/* The CPU's "model name" of /proc/cpuinfo, sanitized for a file name (static storage, read
 * once, thread-safe): letters, digits, '.' and '-' kept, every other run of characters one
 * '_', none leading or trailing; "unknown_cpu" when it cannot be read. Names tuning files
 * (docs/tuning.md). */
const char *moe_cpu_device_name(void);

#endif
