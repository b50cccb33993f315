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

#endif
