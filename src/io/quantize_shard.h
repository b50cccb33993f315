/* One shard of `moe quantize` (src/io/quantize_shard.c): which tensors are routed expert
 * linears, their quantized forms, the shard written. Used by src/io/quantize.c, which owns
 * the folders. Above the checkpoint loader: it reads through the public moe_checkpoint_* API.
 * Not installed; not API. */
#ifndef MOE_IO_QUANTIZE_SHARD_H
#define MOE_IO_QUANTIZE_SHARD_H

#include "io/families.h"

#include <jansson.h>

/* One moe_checkpoint_quantize call: the scheme and what is written so far. */
typedef struct qw_job {
    moe_ctx *ctx;
    const moe_quantize_options *opt;
    moe_quant_config q;
    int ct;                  /* compressed-tensors output (else fp8 block or mxfp4) */
    int mxfp4;               /* gpt-oss MXFP4 output (*_blocks / *_scales) */
    const moe_fam_row *row;  /* the input's family */
    moe_quantize_stats *stats;
    json_t *ignore;          /* non-expert Linear-like modules (2-D weights) */
    json_t *keep;            /* mxfp4: "<P>experts" of the layers left out by --layers */
} qw_job;

/* One progress line through opt->progress (if set). */
void moe_qw_progress(const qw_job *j, const char *fmt, ...) MOE_PRINTF(2, 3);

/* Convert shard `in_path` of checkpoint `ck` into `out_path`: the selected MoE layers' expert
 * linears quantized in j's scheme, every other tensor copied; record its tensor names in
 * weight_map (if not NULL) under `shard`. */
moe_status moe_qw_convert_shard(qw_job *j, moe_checkpoint *ck, const char *in_path, const char *out_path,
                                const char *shard, json_t *weight_map);

#endif
