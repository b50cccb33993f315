/* The ISA registry (gemm/kernels.h): one row per kernel table, in order of preference. A row
 * is runnable when its detect() accepts this machine's features (core/cpu.h: CPUID and XCR0,
 * read in one place); its table is the reference entries overwritten by the row's init. This
 * file is compiled without ISA flags: detect() and the table building run on every CPU, and
 * an ISA's own code runs only after its detect() passed. A new ISA is one folder under
 * src/gemm (its init and kernels, compiled with its flags: one CMake line), one detect
 * function and one row here (docs/adding-an-isa.md). */
#include "gemm/kernels.h"

#include <pthread.h>
#include <string.h>

static int detect_ref(const moe_cpu_features *f)
{
    (void)f;
    return 1;
}

static int detect_avx2(const moe_cpu_features *f)
{
    return f->os_ymm && f->avx2 && f->fma && f->f16c;
}

static int detect_avx512(const moe_cpu_features *f)
{
    return detect_avx2(f) && f->os_zmm && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
}

/* The avx512 row's features plus vdpbf16ps (CPUID leaf 7 subleaf 1 EAX bit 5), and the
 * instruction computing core/bf16.h's rule (the probe runs it: only after the features said
 * the CPU has it). */
int moe_avx512_bf16_probe(void);
static int detect_avx512_bf16(const moe_cpu_features *f)
{
    return detect_avx512(f) && f->avx512_bf16 && moe_avx512_bf16_probe();
}

/* The reference row: its entries are the reference entries, all its own. */
static void init_ref_row(moe_kernels *k, const moe_cpu_features *f)
{
    (void)f;
    k->native = k->native_bf16 = (1u << MOE_WF__COUNT) - 1u;
}

static const moe_isa_row rows[] = {
    {.name = "ref", .requires = "nothing", .detect = detect_ref, .init = init_ref_row},
    {.name = "avx2", .requires = "AVX2+FMA+F16C", .detect = detect_avx2, .init = moe_kernels_init_avx2},
    {.name = "avx512", .requires = "AVX-512 F/BW/VL/DQ", .detect = detect_avx512, .init = moe_kernels_init_avx512},
    {.name = "avx512_bf16", .requires = "AVX-512 F/BW/VL/DQ + AVX512_BF16 (vdpbf16ps with the DAZ/FTZ pair rule)",
     .detect = detect_avx512_bf16, .init = moe_kernels_init_avx512_bf16},
};
#define N_ROWS (sizeof rows / sizeof rows[0])
_Static_assert(N_ROWS <= MOE_ISA_MAX_ROWS, "raise MOE_ISA_MAX_ROWS (gemm/kernels.h)");

static moe_kernels tables[N_ROWS];
static int runnable[N_ROWS];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void)
{
    const moe_cpu_features *f = moe_cpu_features_get();
    for (size_t i = 0; i < N_ROWS; i++) {
        runnable[i] = rows[i].detect(f);
        if (!runnable[i])
            continue;
        moe_kernels *k = &tables[i];
        moe_kernels_init_ref(k); /* every table starts from the reference entries */
        rows[i].init(k, f);
        k->name = rows[i].name;
    }
}

size_t moe_isa_rows(void)
{
    return N_ROWS;
}

const moe_isa_row *moe_isa_row_at(size_t i)
{
    return i < N_ROWS ? &rows[i] : NULL;
}

const moe_kernels *moe_isa_kernels(size_t i)
{
    pthread_once(&once, build);
    return i < N_ROWS && runnable[i] ? &tables[i] : NULL;
}

int moe_isa_find(const char *name)
{
    for (size_t i = 0; name && i < N_ROWS; i++)
        if (strcmp(rows[i].name, name) == 0)
            return (int)i;
    return -1;
}

size_t moe_isa_best(void)
{
    pthread_once(&once, build);
    size_t best = 0;
    for (size_t i = 0; i < N_ROWS; i++)
        if (runnable[i])
            best = i;
    return best;
}
