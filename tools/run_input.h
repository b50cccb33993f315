/* The check `moe run` makes of its --input tensor (tools/run_input.c); also compiled into
 * tests/fuzz/fuzz_input.c, so the fuzzer runs the command's own check. */
#ifndef MOE_TOOLS_RUN_INPUT_H
#define MOE_TOOLS_RUN_INPUT_H

#include "moe.h"

#include <stddef.h>
#include <stdint.h>

/* Is `ti` (tensor hidden_states of file in_path) [T, H] F32 or BF16 with H = hidden_size of
 * layer `layer` of checkpoint ckdir? 0 if so; else -1 with the message `moe run` prints (the
 * file, the tensor, what it has and what is expected) in msg [msg_len], always NUL-terminated. */
int run_check_input(const moe_tensor_info *ti, const char *in_path, const char *ckdir, int64_t layer,
                    int64_t hidden_size, char *msg, size_t msg_len);

#endif
