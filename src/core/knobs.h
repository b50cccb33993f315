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

/* Whether knob k's value cannot act (an idle knob): only a value that was given (API or
 * environment) is judged, against the other resolved knobs (info[], num[]: every knob, as
 * moe_knob_resolve gave them). `tp`: what is known of tensor parallelism, which a plan decides:
 *   MOE_INERT_TP_UNKNOWN  knob-vs-knob cases only (moe_ctx_create logs these)
 *   MOE_INERT_NO_TP       plus the TP knobs, given to a plan with tp_size = 1
 *   MOE_INERT_TP_NOTE     plus the TP knobs with the condition they need (moe env, which has no
 *                         plan)
 * Returns 1 with the reason in why ("acts only ...") or 0 with why = "". */
enum { MOE_INERT_TP_UNKNOWN, MOE_INERT_NO_TP, MOE_INERT_TP_NOTE };
int moe_knob_inert(const moe_knob_info *info, const long long *num, moe_knob k, int tp, char *why, size_t len);
/* How the user named knob k: its environment variable, or "moe_options.<field>". */
const char *moe_knob_where(const moe_knob_info *info, char *buf, size_t len);

#endif
