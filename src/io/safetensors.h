/* The safetensors reader's internal face (src/io/safetensors.c), and the message helper
 * every reader of src/io shares (the file and JSON helpers are core/file.h's). Not installed; not API. */
#ifndef MOE_IO_SAFETENSORS_H
#define MOE_IO_SAFETENSORS_H

#include "core/file.h"
#include "core/internal.h"

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* Index (header order) of tensor `name` in `f`, or -1 when absent. Silent: records no error. */
long moe_st_find(const moe_safetensors *f, const char *name);

/* The path `f` was opened with (as the caller spelled it). */
const char *moe_st_path(const moe_safetensors *f);

/* Write "[d0, d1, ...]" for a shape into buf (always NUL-terminated). Returns buf. */
char *moe_io_format_shape(char *buf, size_t len, int ndim, const int64_t *shape);

/* Refuse a weight-scale tensor holding a value that is NaN, infinite, zero or negative: every
 * quantizer that writes these formats (llm-compressor / compressed-tensors, transformers' and
 * vLLM's FP8, AutoGPTQ / GPTQModel, AutoAWQ) writes finite scales clamped above zero, so such a
 * value is a corrupt or hand-edited checkpoint, and loading it would silently give NaN, infinite
 * or zero rows. `data` is `rows * cols` values of dtype `dt` (F32, BF16 or F16; any other dtype
 * is not checked), row-major as stored (possibly unaligned). MOE_EFORMAT naming `path`, tensor
 * `name`, the first bad entry as [r, c] (or [i] when cols is 0: a vector), its value and the
 * count of bad entries; `what` names the format (e.g. "compressed-tensors weight_scale"). */
moe_status moe_io_check_scales(moe_ctx *ctx, const char *path, const char *name, moe_dtype dt, const void *data,
                               int64_t rows, int64_t cols, const char *what);

#endif
