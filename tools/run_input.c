/* `moe run`: the check of the --input tensor hidden_states (tools/run_input.h). */
#include "run_input.h"

#include <stdio.h>

int run_check_input(const moe_tensor_info *ti, const char *in_path, const char *ckdir, int64_t layer,
                    int64_t hidden_size, char *msg, size_t msg_len)
{
    const int64_t H = hidden_size;
    if (ti->dtype != MOE_DTYPE_F32 && ti->dtype != MOE_DTYPE_BF16) {
        snprintf(msg, msg_len, "%s: tensor hidden_states has dtype %s; expected F32 or BF16", in_path,
                 moe_dtype_name(ti->dtype));
        return -1;
    }
    if (ti->ndim != 2) {
        char shp[160] = "";
        size_t n = 0;
        for (int d = 0; d < ti->ndim && d < MOE_MAX_DIMS && n < sizeof shp - 24; d++)
            n += (size_t)snprintf(shp + n, sizeof shp - n, "%s%lld", d ? ", " : "", (long long)ti->shape[d]);
        snprintf(msg, msg_len, "%s: tensor hidden_states has shape [%s] (rank %d); expected [T, %lld] "
                 "(rank 2, H = hidden_size of %s)", in_path, shp, ti->ndim, (long long)H, ckdir);
        return -1;
    }
    if (ti->shape[1] != H) {
        snprintf(msg, msg_len, "%s: tensor hidden_states has width %lld; expected H = %lld "
                 "(hidden_size of layer %lld in %s)", in_path, (long long)ti->shape[1], (long long)H,
                 (long long)layer, ckdir);
        return -1;
    }
    if (msg_len)
        msg[0] = '\0';
    return 0;
}
