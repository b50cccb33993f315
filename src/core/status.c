/* Names of status codes, dtypes and compute modes; which activations are gated; the version.
 * (Family names are the family table's: src/io/families.c.) Here in src/core because every
 * stage reads them (src/gemm's grouped driver as much as src/layer). */
#include "core/internal.h"

#include <string.h>

/* moe.h: the gated activations have a gate and an up projection; the non-gated ones
 * (MOE_ACT_RELU .. MOE_ACT_GELU_TANH) pass W1 as up_proj */
int moe_activation_gated(moe_activation a)
{
    return a == MOE_ACT_SWIGLU || a == MOE_ACT_GEGLU || a == MOE_ACT_GEGLU_TANH || a == MOE_ACT_SWIGLU_OAI ||
           a == MOE_ACT_SWIGLU_CLAMP || a == MOE_ACT_SWIGLU_SOFTCAP || a == MOE_ACT_SWIGLU_POSTCLAMP;
}

int moe_version_number(void)
{
    return MOE_VERSION_NUMBER;
}

#define MOE_STR2(x) #x
#define MOE_STR(x) MOE_STR2(x)

const char *moe_version_string(void)
{
    return MOE_STR(MOE_VERSION_MAJOR) "." MOE_STR(MOE_VERSION_MINOR) "." MOE_STR(MOE_VERSION_PATCH);
}

const char *moe_status_name(moe_status s)
{
    switch (s) {
    case MOE_OK: return "MOE_OK";
    case MOE_EINVAL: return "MOE_EINVAL";
    case MOE_ENOMEM: return "MOE_ENOMEM";
    case MOE_EIO: return "MOE_EIO";
    case MOE_EFORMAT: return "MOE_EFORMAT";
    case MOE_ENOTFOUND: return "MOE_ENOTFOUND";
    case MOE_ESHAPE: return "MOE_ESHAPE";
    case MOE_EDTYPE: return "MOE_EDTYPE";
    case MOE_EUNSUPPORTED: return "MOE_EUNSUPPORTED";
    case MOE_ERANGE: return "MOE_ERANGE";
    case MOE_EDENSE: return "MOE_EDENSE";
    case MOE_EWORKSPACE: return "MOE_EWORKSPACE";
    case MOE_ETIMEOUT: return "MOE_ETIMEOUT";
    case MOE_EMPI: return "MOE_EMPI";
    case MOE_ECANCELED: return "MOE_ECANCELED";
    }
    return "MOE_E?";
}

size_t moe_dtype_size(moe_dtype dt)
{
    switch (dt) {
    case MOE_DTYPE_F32: return 4;
    case MOE_DTYPE_BF16: return 2;
    case MOE_DTYPE_F16: return 2;
    case MOE_DTYPE_I32: return 4;
    case MOE_DTYPE_I64: return 8;
    case MOE_DTYPE_F64: return 8;
    case MOE_DTYPE_U8: return 1;
    case MOE_DTYPE_I8: return 1;
    case MOE_DTYPE_F8_E4M3: return 1;
    case MOE_DTYPE_I16: return 2;
    case MOE_DTYPE_BOOL: return 1;
    case MOE_DTYPE_U16: return 2;
    case MOE_DTYPE_U32: return 4;
    case MOE_DTYPE_U64: return 8;
    case MOE_DTYPE_F8_E5M2: return 1;
    case MOE_DTYPE_COUNT: break;
    }
    return 0;
}

const char *moe_dtype_name(moe_dtype dt)
{
    switch (dt) {
    case MOE_DTYPE_F32: return "F32";
    case MOE_DTYPE_BF16: return "BF16";
    case MOE_DTYPE_F16: return "F16";
    case MOE_DTYPE_I32: return "I32";
    case MOE_DTYPE_I64: return "I64";
    case MOE_DTYPE_F64: return "F64";
    case MOE_DTYPE_U8: return "U8";
    case MOE_DTYPE_I8: return "I8";
    case MOE_DTYPE_F8_E4M3: return "F8_E4M3";
    case MOE_DTYPE_I16: return "I16";
    case MOE_DTYPE_BOOL: return "BOOL";
    case MOE_DTYPE_U16: return "U16";
    case MOE_DTYPE_U32: return "U32";
    case MOE_DTYPE_U64: return "U64";
    case MOE_DTYPE_F8_E5M2: return "F8_E5M2";
    case MOE_DTYPE_COUNT: break;
    }
    return "?";
}

/* moe_compute names (moe.h): here beside the status and dtype names, so every stage that
 * prints or parses a compute mode takes it from the ground floor. */
const char *moe_compute_name(moe_compute c)
{
    return c == MOE_COMPUTE_F32 ? "f32" : c == MOE_COMPUTE_BF16 ? "bf16" : "?";
}

moe_status moe_compute_from_name(const char *name, moe_compute *out)
{
    if (!name || !out)
        return MOE_EINVAL;
    if (strcmp(name, "f32") == 0)
        *out = MOE_COMPUTE_F32;
    else if (strcmp(name, "bf16") == 0)
        *out = MOE_COMPUTE_BF16;
    else
        return MOE_EINVAL;
    return MOE_OK;
}
