/* The knob table (DESIGN.md section 5). */
#ifndef MOE_CORE_KNOBS_H
#define MOE_CORE_KNOBS_H

#include "core/internal.h"

typedef enum moe_knob {
    MOE_KNOB_NUM_THREADS,
    MOE_KNOB_ISA,
    MOE_KNOB_CHUNK_SIZE,
    MOE_KNOB_PERMUTE,
    MOE_KNOB_ONEHOT_THRESHOLD,
    MOE_KNOB_TOPK,
    MOE_KNOB_LOWTOK_THRESHOLD,
    MOE_KNOB_SMALL_ALLREDUCE,
    MOE_KNOB_TP_REDUCE,
    MOE_KNOB_TUNING_DIR,
    MOE_KNOB_LOG_LEVEL,
    MOE_KNOB__COUNT
} moe_knob;

/* Values of the enum knobs, in the order of their accepted lists. MOE_ISA: 0 = auto, i + 1 =
 * row i of the kernel registry (src/gemm/registry.c). */
enum { MOE_ISA_AUTO = 0 };
enum { MOE_PERMUTE_AUTO, MOE_PERMUTE_SORT, MOE_PERMUTE_ONEHOT, MOE_PERMUTE_PACKED };
enum { MOE_TP_ALLREDUCE, MOE_TP_REDUCE_SCATTER };

/* The ISA knob's values, which core does not know: names [n + 1] NULL-terminated, "auto" first
 * then the registry's rows; accepted the same as text ("auto, ref, avx2, avx512"). */
typedef struct moe_knob_isa {
    const char *const *names;
    const char *accepted;
} moe_knob_isa;

/* Resolve knob k (API value, else environment, else default). Returns 1 with info->value and
 * *num (the integer, or the enum index) set, or 0 with info->error naming the field or
 * variable and what it accepts. */
int moe_knob_resolve(const moe_options *opts, moe_knob k, const moe_knob_isa *isa, moe_knob_info *info,
                     long long *num);

#endif
