/* The MPI state of a parallel plan: the transport (mpi.c: the communicators, the plan check,
 * the polled waits, the execute start, the TP sum), which ep.c (the expert-parallel
 * dispatch/combine) uses; mpi.c never calls ep.c. Only src/parallel includes this. */
#ifndef MOE_PARALLEL_MPI_INTERNAL_H
#define MOE_PARALLEL_MPI_INTERNAL_H

#include "parallel/parallel.h"

#include <mpi.h>

/* What each rank contributes at the start of an execute (moe_par_begin). */
typedef struct moe_par_hello {
    int64_t n_tokens;  /* this rank's T */
    int64_t ws_tokens; /* the longest chunk its workspace fits */
    int32_t status;    /* its moe_status so far */
    int32_t pad;
} moe_par_hello;

typedef struct moe_par moe_par;

struct moe_par {
    MPI_Comm world;        /* duplicate of the caller's communicator: all ep*tp ranks */
    MPI_Comm ep;           /* the ranks with this tp_rank, ordered by ep_rank (EP dispatch) */
    MPI_Comm tp;           /* the ranks with this ep_rank, ordered by tp_rank (TP sum) */
    int world_rank, world_size;
    int ep_rank, ep_size, tp_rank, tp_size;
    double timeout;        /* seconds, parallel.timeout_s */
    int broken;            /* a collective timed out or failed: no further MPI on this plan */
    MPI_Comm rebal;        /* moe_plan_rebalance's own duplicate of `world`: a rebalance that
                              times out leaves its collective pending there, never where an
                              execute's collectives could match it */
    int rebal_broken;      /* a rebalance timed out: `rebal` holds a pending collective */
    moe_dtype dispatch_dtype; /* F32, F8_E4M3 or I8 */
    size_t rec_bytes;      /* one dispatch record: int32 local expert id, f32 scale, then H
                              activations of dispatch_dtype; a multiple of 8 */
    MPI_Datatype rec;      /* rec_bytes contiguous bytes */
    MPI_Datatype yrow;     /* H contiguous floats: one expert-output (or output) row */
    int64_t emax;          /* ceil(E / ep_size): the most experts one EP rank holds */
    int *coords;           /* [world_size * 2]: (ep_rank, tp_rank) of every world rank */
    moe_par_hello *hello;  /* [world_size] execute-start exchange */
    int *scount, *rcount, *sdispl, *rdispl; /* [ep_size] EP exchange, in records / rows */
    int *tcount, *tdispl, *rcount2, *rdispl2; /* [tp_size] TP exchange, in rows */
};

/* Wait for `req` by polling MPI_Test against the plan's timeout (sched_yield, then short
 * sleeps, between polls so oversubscribed ranks progress). `what` names the step in
 * messages. A timeout or MPI error marks the plan broken. */
moe_status moe_par_wait(const moe_stage *p, MPI_Request *req, const char *what);
/* Record MPI error `rc` of step `what` (MOE_EMPI) and mark the plan broken. */
moe_status moe_par_mpi_fail(const moe_stage *p, int rc, const char *what);
/* MOE_EMPI when the plan is broken, else MOE_OK. */
moe_status moe_par_usable(const moe_stage *p);

/* A workspace slice rounded up to 64 bytes. */
static inline size_t moe_par_align(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

/* Bytes of the TP gather buffer [tp_size, Tc, H] f32 at the start of the parallel workspace
 * (0 without TP). */
static inline size_t moe_par_tp_bytes(const moe_stage *p, int64_t Tc)
{
    return p->par.tp_size > 1
               ? moe_par_align((size_t)p->par.tp_size * (size_t)Tc * (size_t)p->desc.hidden_size * sizeof(float))
               : 0;
}


#endif
