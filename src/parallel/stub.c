/* Without MPI (CMake option MOE_WITH_MPI off): the same symbols; only one-process plans exist,
 * so moe_plan_create_ex refuses every parallel configuration before reaching these. */
#include "parallel/parallel.h"

#if !MOE_WITH_MPI

#include <string.h>

int moe_mpi_available(void)
{
    return 0;
}

moe_status moe_par_create(moe_stage *p, const char *text, uint64_t hash, void *user_comm)
{
    (void)text;
    (void)hash;
    (void)user_comm;
    return moe_set_error(p->ctx, MOE_EUNSUPPORTED,
                         "plan config: parallel.ep_size = %d, tp_size = %d: libmoe was built without MPI "
                         "(CMake option MOE_WITH_MPI=OFF); rebuild with -DMOE_WITH_MPI=ON (OpenMPI: Debian "
                         "packages openmpi-bin libopenmpi-dev)",
                         p->par.ep_size, p->par.tp_size);
}

void moe_par_free(struct moe_par *m)
{
    (void)m;
}

size_t moe_par_workspace_bytes(const moe_stage *p, int64_t Tc)
{
    (void)p;
    (void)Tc;
    return 0;
}

moe_status moe_par_begin(const moe_stage *p, moe_status local, int64_t n_tokens, int64_t ws_tokens,
                         int64_t *tc_max, int64_t *n_chunks, int64_t *max_tokens)
{
    (void)local;
    (void)n_tokens;
    (void)ws_tokens;
    *tc_max = *n_chunks = *max_tokens = 0;
    return moe_set_error(p->ctx, MOE_EUNSUPPORTED, "parallel execute: libmoe was built without MPI (MOE_WITH_MPI=OFF)");
}

moe_status moe_par_tp_reduce(moe_chunk *c, int64_t t0, int64_t T, float *output)
{
    (void)t0;
    (void)T;
    (void)output;
    return moe_set_error(c->st->ctx, MOE_EUNSUPPORTED, "TP reduction: libmoe was built without MPI (MOE_WITH_MPI=OFF)");
}

moe_status moe_par_gather_load(const moe_stage *p, const int64_t *local, int64_t *total)
{
    /* only one-process plans exist without MPI: the group is this process */
    if (total != local)
        memmove(total, local, sizeof(int64_t) * (size_t)p->desc.num_experts);
    return MOE_OK;
}

moe_status moe_par_rebalance_usable(const moe_stage *p)
{
    (void)p;
    return MOE_OK;
}

moe_status moe_par_rebalance_agree(const moe_stage *p, const moe_placement *next, moe_status local)
{
    (void)next;
    (void)local;
    return moe_set_error(p->ctx, MOE_EUNSUPPORTED, "moe_plan_rebalance: libmoe was built without MPI (MOE_WITH_MPI=OFF)");
}

void moe_par_placement_changed(const moe_stage *p)
{
    (void)p;
}

static moe_status no_mpi_prepare(moe_chunk *c, moe_dispatch *d)
{
    (void)d;
    return moe_set_error(c->st->ctx, MOE_EUNSUPPORTED, "EP dispatch: libmoe was built without MPI (MOE_WITH_MPI=OFF)");
}

static moe_status no_mpi_finalize(moe_chunk *c, const moe_dispatch *d)
{
    (void)d;
    return moe_set_error(c->st->ctx, MOE_EUNSUPPORTED, "EP combine: libmoe was built without MPI (MOE_WITH_MPI=OFF)");
}

const moe_pf_impl moe_pf_ep_alltoall = {
    .name = "ep_alltoall", .format = MOE_FORMAT_STANDARD, .prepare = no_mpi_prepare, .finalize = no_mpi_finalize};
const moe_pf_impl moe_pf_ep_batched = {
    .name = "ep_batched", .format = MOE_FORMAT_BATCHED, .prepare = no_mpi_prepare, .finalize = no_mpi_finalize};

#else
typedef int moe_parallel_stub_unused; /* ISO C: a translation unit holds a declaration */
#endif
