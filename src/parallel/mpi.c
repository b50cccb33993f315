/* MPI machinery of parallel plans: the collective plan check, the start of an execute, the
 * deterministic TP sum, and the polled wait that turns a dead or absent peer into
 * MOE_ETIMEOUT instead of a hang. Every collective is nonblocking and polled against
 * parallel.timeout_s; the library never calls MPI_Abort. */
#include "core/knobs.h"
#include "parallel/parallel.h"

#if MOE_WITH_MPI

#include "parallel/mpi_internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

int moe_mpi_available(void)
{
    return 1;
}

static void mpi_errstr(int rc, char *buf, size_t len)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(buf, len, "MPI error code %d", rc);
    else
        snprintf(buf, len, "%s", s);
}

moe_status moe_par_mpi_fail(const moe_stage *p, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING + 32];
    mpi_errstr(rc, s, sizeof s);
    if (p->mpi)
        p->mpi->broken = 1;
    return moe_set_error(p->ctx, MOE_EMPI,
                         "%s: MPI failed: %s; the plan's communicator is unusable now (abort the job: MPI_Abort)", what,
                         s);
}

moe_status moe_par_usable(const moe_stage *p)
{
    if (p->mpi && p->mpi->broken)
        return moe_set_error(p->ctx, MOE_EMPI,
                             "parallel plan: an earlier collective on this plan timed out or failed, so its "
                             "communicator is in an undefined state (collectives cannot be cancelled); abort the job "
                             "(MPI_Abort) or create the ranks' plans anew");
    return MOE_OK;
}

/* Poll req against the plan's timeout; on a timeout set *broken and say `after` (what the
 * timeout leaves behind). */
static moe_status wait_req(const moe_stage *p, MPI_Request *req, const char *what, int *broken, const char *after)
{
    moe_par *m = p->mpi;
    const double t0 = MPI_Wtime();
    long polls = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return moe_par_mpi_fail(p, rc, what);
        if (flag)
            return MOE_OK;
        const double waited = MPI_Wtime() - t0;
        if (waited > m->timeout) {
            *broken = 1;
            return moe_set_error(p->ctx, MOE_ETIMEOUT,
                                 "%s: rank %d (ep_rank %d, tp_rank %d) waited %.1f s (parallel.timeout_s = %g) for its "
                                 "peers: a rank died, hung, or did not make the same call; collectives cannot be "
                                 "cancelled, so %s",
                                 what, m->world_rank, p->par.ep_rank, p->par.tp_rank, waited, m->timeout, after);
        }
        /* Spin briefly (lowest latency), then yield, then sleep: oversubscribed ranks (more
         * ranks than cores) must let their peers run to make progress. */
        if (++polls < 2000)
            continue;
        if (waited < 0.01) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

moe_status moe_par_wait(const moe_stage *p, MPI_Request *req, const char *what)
{
    return wait_req(p, req, what, &p->mpi->broken, "this plan is unusable now (abort the job: MPI_Abort)");
}

/* ---- plan creation ---------------------------------------------------------------------- */

/* What each rank contributes to the plan check. */
typedef struct hello_plan {
    uint64_t hash;        /* moe_plan_hash */
    int32_t ep_rank, tp_rank, dp_size, dp_rank;
    int32_t comm_size;    /* the communicator's size as this rank sees it */
    int32_t pad;
    char text[MOE_PLAN_TEXT_LEN]; /* moe_plan_text */
} hello_plan;

/* The first "key=value;" pair where texts a and b differ, copied into pa and pb (the whole
 * pairs) and its key into key. Returns 0 when the texts are equal. */
static int text_diff(const char *a, const char *b, char *key, size_t klen, char *pa, char *pb, size_t plen)
{
    while (*a || *b) {
        const char *ea = strchr(a, ';'), *eb = strchr(b, ';');
        size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
        if (la != lb || memcmp(a, b, la) != 0) {
            const char *src = la ? a : b;
            size_t ls = la ? la : lb;
            const char *eq = memchr(src, '=', ls);
            size_t kl = eq ? (size_t)(eq - src) : ls;
            snprintf(key, klen, "%.*s", (int)kl, src);
            snprintf(pa, plen, "%.*s", (int)la, a);
            snprintf(pb, plen, "%.*s", (int)lb, b);
            return 1;
        }
        a += la + (ea ? 1 : 0);
        b += lb + (eb ? 1 : 0);
    }
    return 0;
}

/* Every rank runs this on the same gathered data, so every rank reaches the same verdict
 * and the same message. */
static moe_status check_ranks(moe_stage *p, const hello_plan *all, int n)
{
    moe_ctx *ctx = p->ctx;
    const int ep = p->par.ep_size, tp = p->par.tp_size;
    for (int i = 1; i < n; i++) {
        char key[128], pa[512], pb[512];
        if (text_diff(all[0].text, all[i].text, key, sizeof key, pa, pb, sizeof pa))
            return moe_set_error(ctx, MOE_EINVAL,
                                 "moe_plan_create: the ranks' plans differ in '%s': rank 0 has '%s', rank %d has '%s' "
                                 "(plan hash %016llx vs %016llx); every rank must create the plan from the same layer "
                                 "description, knobs (moe_ctx_options_text) and composition",
                                 key, pa, i, pb, (unsigned long long)all[0].hash, (unsigned long long)all[i].hash);
        if (all[i].hash != all[0].hash)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "moe_plan_create: rank %d's plan hash %016llx differs from rank 0's %016llx although "
                                 "the texts agree (different libmoe builds?)",
                                 i, (unsigned long long)all[i].hash, (unsigned long long)all[0].hash);
    }
    if (n != ep * tp)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_create: the communicator holds %d ranks but parallel.ep_size * tp_size = %d * %d "
                             "= %d; launch ep_size * tp_size ranks (mpirun -np %d) or pass a communicator of that size",
                             n, ep, tp, ep * tp, ep * tp);
    int *grid = malloc(sizeof(int) * (size_t)(ep * tp)); /* [ep][tp]: world rank holding the cell, or -1 */
    if (!grid)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory");
    for (int c = 0; c < ep * tp; c++)
        grid[c] = -1;
    moe_status st = MOE_OK;
    for (int i = 0; i < n && st == MOE_OK; i++) {
        const hello_plan *h = &all[i];
        if (h->ep_rank < 0 || h->ep_rank >= ep)
            st = moe_set_error(ctx, MOE_EINVAL, "moe_plan_create: rank %d has parallel.ep_rank = %d, outside [0, %d)", i,
                               h->ep_rank, ep);
        else if (h->tp_rank < 0 || h->tp_rank >= tp)
            st = moe_set_error(ctx, MOE_EINVAL, "moe_plan_create: rank %d has parallel.tp_rank = %d, outside [0, %d)", i,
                               h->tp_rank, tp);
        else if (h->dp_size < 1 || h->dp_rank < 0 || h->dp_rank >= h->dp_size)
            st = moe_set_error(ctx, MOE_EINVAL,
                               "moe_plan_create: rank %d has parallel.dp_rank = %d with dp_size = %d; need dp_size >= 1 "
                               "and 0 <= dp_rank < dp_size",
                               i, h->dp_rank, h->dp_size);
        else if (grid[h->ep_rank * tp + h->tp_rank] >= 0)
            st = moe_set_error(ctx, MOE_EINVAL,
                               "moe_plan_create: ranks %d and %d both have (ep_rank %d, tp_rank %d); give each rank its "
                               "own coordinates, or -1 to derive them from the communicator rank",
                               grid[h->ep_rank * tp + h->tp_rank], i, h->ep_rank, h->tp_rank);
        else
            grid[h->ep_rank * tp + h->tp_rank] = i;
    }
    free(grid);
    return st;
}

/* Ranks whose plans first differ in their placement= entry (found by check_ranks' order: the
 * first rank i whose text differs from rank 0's, in the key "placement"): exchange the
 * placements themselves over m->world (every rank takes part, as every rank reached the same
 * verdict from the same data) and name the first rank count or physical expert that differs
 * between rank 0 and rank i, with both values. Returns the error (always: the plans differ). */
static moe_status placement_diff_on(const moe_stage *p, MPI_Comm comm, int *broken, const char *after,
                                    const moe_placement *pl, const char *fn, const char *whose, int i, int size);

static moe_status placement_diff(moe_stage *p, moe_par *m, int i, int size)
{
    return placement_diff_on(p, m->world, &m->broken, "this plan is unusable now (abort the job: MPI_Abort)",
                             &p->placement, "moe_plan_create", "parallel.placement", i, size);
}

/* placement_diff over `comm` for placement pl (fn names the call, whose the argument; waits
 * that time out set *broken and say `after`). */
static moe_status placement_diff_on(const moe_stage *p, MPI_Comm comm, int *broken, const char *after,
                                    const moe_placement *pl, const char *fn, const char *whose, int i, int size)
{
    moe_ctx *ctx = p->ctx;
    const int ep = p->par.ep_size; /* equal on every rank: ep_size precedes placement in the text */
    char what[160];
    int32_t *counts = malloc(sizeof(int32_t) * (size_t)ep * (size_t)size); /* [size][ep] */
    moe_status st = MOE_OK;
    MPI_Request req;
    int rc;
    if (!counts)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory comparing the placements", fn);
    snprintf(what, sizeof what, "%s: exchanging the placements", fn);
    if ((rc = MPI_Iallgather(pl->rank_num_physical, ep, MPI_INT32_T, counts, ep, MPI_INT32_T, comm, &req)) !=
        MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, what);
    snprintf(what, sizeof what, "%s: exchanging the placements (rank counts)", fn);
    if ((st = wait_req(p, &req, what, broken, after)) != MOE_OK)
        return st; /* counts left allocated: MPI may still write into them */
    /* rank i first, then every other (all must agree before the arrays of P entries are
     * gathered: the gather needs one P) */
    for (int k = 0; k < size; k++) {
        const int j = k == 0 ? i : k == i ? 0 : k;
        for (int r = 0; j > 0 && r < ep; r++)
            if (counts[r] != counts[(size_t)j * ep + r]) {
                st = moe_set_error(ctx, MOE_EINVAL,
                                   "%s: the ranks' expert placements differ (%s): EP rank "
                                   "%d holds %d physical experts in rank 0's placement, %d in rank %d's; every rank "
                                   "must pass the same placement",
                                   fn, whose, r, (int)counts[r], (int)counts[(size_t)j * ep + r], j);
                free(counts);
                return st;
            }
    }
    free(counts);
    /* the same rank counts, so the same P: compare the physical experts */
    const int P = pl->num_physical_experts;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)P * (size_t)size); /* [size][P] */
    if (!all)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory comparing the placements", fn);
    snprintf(what, sizeof what, "%s: exchanging the placements", fn);
    if ((rc = MPI_Iallgather(pl->physical_to_logical, P, MPI_INT32_T, all, P, MPI_INT32_T, comm, &req)) !=
        MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, what);
    snprintf(what, sizeof what, "%s: exchanging the placements (physical experts)", fn);
    if ((st = wait_req(p, &req, what, broken, after)) != MOE_OK)
        return st;
    for (int q = 0; q < P; q++)
        if (all[q] != all[(size_t)i * P + q]) {
            int r = 0, first = 0; /* the EP rank holding physical expert q */
            while (r < ep - 1 && q >= first + pl->rank_num_physical[r])
                first += pl->rank_num_physical[r++];
            st = moe_set_error(ctx, MOE_EINVAL,
                               "%s: the ranks' expert placements differ (%s): physical "
                               "expert %d (EP rank %d's local expert %d) holds logical expert %d in rank 0's placement, "
                               "%d in rank %d's; every rank must pass the same placement",
                               fn, whose, q, r, q - first, (int)all[q], (int)all[(size_t)i * P + q], i);
            free(all);
            return st;
        }
    free(all);
    return moe_set_error(ctx, MOE_EINVAL,
                         "%s: the ranks' placement hashes differ but their placements agree entry by "
                         "entry (different libmoe builds?)", fn);
}

/* The first rank whose plan text differs from rank 0's when the first differing key is
 * "placement", else -1. */
static int placement_first_diff(const hello_plan *all, int n)
{
    for (int i = 1; i < n; i++) {
        char key[128], pa[512], pb[512];
        if (text_diff(all[0].text, all[i].text, key, sizeof key, pa, pb, sizeof pa))
            return strcmp(key, "placement") == 0 ? i : -1;
    }
    return -1;
}

void moe_par_free(moe_par *m)
{
    if (!m)
        return;
    int fin = 0;
    MPI_Finalized(&fin);
    /* A broken plan may still have collectives in flight on its communicators: leave them. */
    if (!fin && !m->broken) {
        if (m->rec != MPI_DATATYPE_NULL)
            MPI_Type_free(&m->rec);
        if (m->yrow != MPI_DATATYPE_NULL)
            MPI_Type_free(&m->yrow);
        if (m->ep != MPI_COMM_NULL)
            MPI_Comm_free(&m->ep);
        if (m->tp != MPI_COMM_NULL)
            MPI_Comm_free(&m->tp);
        if (m->world != MPI_COMM_NULL)
            MPI_Comm_free(&m->world);
    }
    /* A rebalance that timed out left its collective pending on m->rebal: leave that one. */
    if (!fin && !m->broken && !m->rebal_broken && m->rebal != MPI_COMM_NULL)
        MPI_Comm_free(&m->rebal);
    free(m->coords);
    free(m->hello);
    free(m->scount);
    free(m->rcount);
    free(m->sdispl);
    free(m->rdispl);
    free(m->tcount);
    free(m->tdispl);
    free(m->rcount2);
    free(m->rdispl2);
    free(m);
}

moe_status moe_par_create(moe_stage *p, const char *text, uint64_t hash, void *user_comm)
{
    moe_ctx *ctx = p->ctx;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_create: parallel.ep_size = %d, tp_size = %d needs MPI, which is %s: call MPI_Init "
                             "(or MPI_Init_thread with MPI_THREAD_FUNNELED) before creating the plan",
                             p->par.ep_size, p->par.tp_size, fin ? "already finalized" : "not initialized");
    MPI_Comm uc = user_comm ? *(MPI_Comm *)user_comm : MPI_COMM_WORLD;
    int rank = 0, size = 0, rc;
    if ((rc = MPI_Comm_rank(uc, &rank)) != MPI_SUCCESS || (rc = MPI_Comm_size(uc, &size)) != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "moe_plan_create: parallel.comm");

    moe_par *m = calloc(1, sizeof *m);
    if (!m)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory");
    m->world = m->ep = m->tp = m->rebal = MPI_COMM_NULL;
    m->rec = m->yrow = MPI_DATATYPE_NULL;
    m->world_rank = rank;
    m->world_size = size;
    m->timeout = p->par.timeout_s;
    m->dispatch_dtype = p->par.dispatch_dtype;
    p->mpi = m;
    if (p->par.ep_rank < 0)
        p->par.ep_rank = rank / p->par.tp_size;
    if (p->par.tp_rank < 0)
        p->par.tp_rank = rank % p->par.tp_size;

    /* 1. Our own communicator: the caller's traffic never mixes with ours, and errors return. */
    MPI_Request req;
    if ((rc = MPI_Comm_idup(uc, &m->world, &req)) != MPI_SUCCESS) {
        moe_status st = moe_par_mpi_fail(p, rc, "moe_plan_create: duplicating parallel.comm");
        p->mpi = NULL;
        moe_par_free(m);
        return st;
    }
    moe_status st = moe_par_wait(p, &req, "moe_plan_create: duplicating parallel.comm");
    if (st != MOE_OK) {
        p->mpi = NULL; /* left allocated: MPI may still complete the request into it */
        return st;
    }
    MPI_Comm_set_errhandler(m->world, MPI_ERRORS_RETURN);

    /* 2. Exchange the plans and coordinates. */
    hello_plan *all = malloc(sizeof(hello_plan) * (size_t)size); /* [size] */
    hello_plan mine;
    memset(&mine, 0, sizeof mine);
    mine.hash = hash;
    mine.ep_rank = p->par.ep_rank;
    mine.tp_rank = p->par.tp_rank;
    mine.dp_size = p->par.dp_size;
    mine.dp_rank = p->par.dp_rank;
    mine.comm_size = size;
    snprintf(mine.text, sizeof mine.text, "%s", text);
    if (!all) {
        p->mpi = NULL;
        moe_par_free(m);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory");
    }
    if ((rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, m->world, &req)) !=
        MPI_SUCCESS) {
        st = moe_par_mpi_fail(p, rc, "moe_plan_create: exchanging the plans");
        p->mpi = NULL;
        free(all);
        return st;
    }
    st = moe_par_wait(p, &req, "moe_plan_create: exchanging the plans (moe_plan_hash, moe_plan_text)");
    if (st != MOE_OK) {
        p->mpi = NULL; /* `all` and `m` left allocated: MPI may still write into them */
        return st;
    }
    const int pl_rank = placement_first_diff(all, size);
    if (pl_rank > 0) {
        free(all);
        st = placement_diff(p, m, pl_rank, size);
        p->mpi = NULL;
        if (!m->broken)
            moe_par_free(m);
        return st;
    }
    st = check_ranks(p, all, size);
    if (st == MOE_OK) {
        m->coords = malloc(sizeof(int) * 2 * (size_t)size); /* [size][2] */
        if (!m->coords)
            st = moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory");
        else
            for (int i = 0; i < size; i++) {
                m->coords[2 * i] = all[i].ep_rank;
                m->coords[2 * i + 1] = all[i].tp_rank;
            }
    }
    free(all);
    if (st != MOE_OK) {
        p->mpi = NULL;
        moe_par_free(m);
        return st;
    }

    /* 3. Sub-communicators (every rank has arrived, so these blocking splits cannot hang on an
     * absent peer): EP among the ranks with our tp_rank, TP among those with our ep_rank. */
    m->ep_size = p->par.ep_size;
    m->tp_size = p->par.tp_size;
    if ((rc = MPI_Comm_split(m->world, p->par.tp_rank, p->par.ep_rank, &m->ep)) != MPI_SUCCESS ||
        (rc = MPI_Comm_split(m->world, p->par.ep_rank, p->par.tp_rank, &m->tp)) != MPI_SUCCESS) {
        st = moe_par_mpi_fail(p, rc, "moe_plan_create: splitting the EP and TP communicators");
        m->broken = 0; /* nothing is in flight: free what exists */
        p->mpi = NULL;
        moe_par_free(m);
        return st;
    }
    /* moe_plan_rebalance's own communicator (every rank has arrived: the dup cannot hang) */
    if ((rc = MPI_Comm_dup(m->world, &m->rebal)) != MPI_SUCCESS) {
        st = moe_par_mpi_fail(p, rc, "moe_plan_create: duplicating the communicator for moe_plan_rebalance");
        m->broken = 0;
        p->mpi = NULL;
        moe_par_free(m);
        return st;
    }
    MPI_Comm_set_errhandler(m->rebal, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(m->ep, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(m->tp, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->ep, &m->ep_rank);
    MPI_Comm_rank(m->tp, &m->tp_rank);

    /* 4. Record types and the exchange scratch. */
    const int64_t H = p->desc.hidden_size, E = p->desc.num_experts;
    const size_t es = moe_dtype_size(m->dispatch_dtype);
    m->rec_bytes = (8 + (size_t)H * es + 7) & ~(size_t)7;
    m->emax = p->epmap.emax > 0 ? p->epmap.emax : (E + m->ep_size - 1) / m->ep_size; /* the fullest rank's physical experts */
    if (m->rec_bytes > (size_t)INT32_MAX || H > INT32_MAX) {
        p->mpi = NULL;
        moe_par_free(m);
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_create: hidden_size %lld too large for one MPI record",
                             (long long)H);
    }
    if ((rc = MPI_Type_contiguous((int)m->rec_bytes, MPI_BYTE, &m->rec)) != MPI_SUCCESS ||
        (rc = MPI_Type_commit(&m->rec)) != MPI_SUCCESS ||
        (rc = MPI_Type_contiguous((int)H, MPI_FLOAT, &m->yrow)) != MPI_SUCCESS ||
        (rc = MPI_Type_commit(&m->yrow)) != MPI_SUCCESS) {
        st = moe_par_mpi_fail(p, rc, "moe_plan_create: MPI datatypes");
        m->broken = 0;
        p->mpi = NULL;
        moe_par_free(m);
        return st;
    }
    m->hello = calloc((size_t)size, sizeof *m->hello);
    m->scount = calloc((size_t)m->ep_size, sizeof(int));
    m->rcount = calloc((size_t)m->ep_size, sizeof(int));
    m->sdispl = calloc((size_t)m->ep_size, sizeof(int));
    m->rdispl = calloc((size_t)m->ep_size, sizeof(int));
    m->tcount = calloc((size_t)m->tp_size, sizeof(int));
    m->tdispl = calloc((size_t)m->tp_size, sizeof(int));
    m->rcount2 = calloc((size_t)m->tp_size, sizeof(int));
    m->rdispl2 = calloc((size_t)m->tp_size, sizeof(int));
    if (!m->hello || !m->scount || !m->rcount || !m->sdispl || !m->rdispl || !m->tcount || !m->tdispl ||
        !m->rcount2 || !m->rdispl2) {
        p->mpi = NULL;
        moe_par_free(m);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory");
    }
    moe_log(ctx, MOE_LOG_INFO,
            "parallel plan: rank %d of %d = (ep_rank %d of %d, tp_rank %d of %d), plan hash %016llx agreed by every rank",
            rank, size, p->par.ep_rank, p->par.ep_size, p->par.tp_rank, p->par.tp_size, (unsigned long long)hash);
    return MOE_OK;
}

/* ---- rebalance --------------------------------------------------------------------------- */

/* What each rank contributes to a rebalance's agreement, and the buffers of that exchange: a
 * timed-out exchange leaves them to MPI (it may still write into them), kept reachable on
 * the orphan list (never freed). */
typedef struct rebal_hello {
    uint64_t hash;   /* moe_placement_hash(next), 0 when next was not valid here */
    int32_t status;  /* this rank's status so far */
    int32_t pad;
} rebal_hello;

typedef struct rebal_xchg {
    struct rebal_xchg *next_orphan;
    rebal_hello mine;
    rebal_hello all[]; /* [world_size] */
} rebal_xchg;

static rebal_xchg *g_rebal_orphans; /* exchanges a timeout left pending (MPI calls come from one thread) */

moe_status moe_par_rebalance_usable(const moe_stage *p)
{
    moe_par *m = p->mpi;
    if (m && m->rebal_broken)
        return moe_set_error(p->ctx, MOE_ETIMEOUT,
                             "moe_plan_rebalance: an earlier rebalance on this plan timed out, so its rebalance "
                             "communicator holds a collective that cannot be cancelled and no rebalance can run on "
                             "this plan any more (the plan still executes with its current placement; create a new "
                             "plan with parallel.placement to move experts)");
    return moe_par_usable(p);
}

moe_status moe_par_rebalance_agree(const moe_stage *p, const moe_placement *next, moe_status local)
{
    moe_par *m = p->mpi;
    moe_ctx *ctx = p->ctx;
    const int n = m->world_size;
    rebal_xchg *x = calloc(1, sizeof *x + sizeof(rebal_hello) * (size_t)n);
    if (!x) /* the peers then time out: say so */
        return moe_set_error(ctx, MOE_ENOMEM,
                             "moe_plan_rebalance: out of memory for the agreement (the peers will time out)");
    x->mine.hash = local == MOE_OK ? moe_placement_hash(next) : 0;
    x->mine.status = (int32_t)local;
    MPI_Request req;
    int rc = MPI_Iallgather(&x->mine, (int)sizeof x->mine, MPI_BYTE, x->all, (int)sizeof x->mine, MPI_BYTE, m->rebal,
                            &req);
    if (rc != MPI_SUCCESS) {
        free(x);
        return moe_par_mpi_fail(p, rc, "moe_plan_rebalance: agreement");
    }
    moe_status st = wait_req(p, &req, "moe_plan_rebalance: agreement (every rank's placement hash and staging status)",
                             &m->rebal_broken,
                             "every rank that returns keeps its old placement and weights (staging freed) and "
                             "executes still run, but later rebalances on this plan fail (MOE_ETIMEOUT)");
    if (st != MOE_OK) {
        x->next_orphan = g_rebal_orphans; /* MPI may still write into x */
        g_rebal_orphans = x;
        return st;
    }
    if (local != MOE_OK) {
        free(x);
        return local; /* this rank's own message stands; the peers name it */
    }
    for (int i = 0; i < n; i++)
        if (x->all[i].status != MOE_OK) {
            st = moe_set_error(ctx, (moe_status)x->all[i].status,
                               "moe_plan_rebalance: rank %d (ep_rank %d, tp_rank %d) failed with %s (its own error "
                               "says why); no rank switched: every rank keeps its old placement and weights",
                               i, m->coords[2 * i], m->coords[2 * i + 1],
                               moe_status_name((moe_status)x->all[i].status));
            free(x);
            return st;
        }
    for (int i = 1; i < n; i++)
        if (x->all[i].hash != x->all[0].hash) {
            free(x);
            /* every rank reached the same verdict from the same data: all exchange */
            st = placement_diff_on(p, m->rebal, &m->rebal_broken,
                                   "every rank that returns keeps its old placement and weights, but later "
                                   "rebalances on this plan fail (MOE_ETIMEOUT)",
                                   next, "moe_plan_rebalance", "next", i, n);
            return st;
        }
    free(x);
    /* The commit round: a rank that timed out above (its exchange pending, maybe matched later
     * by its peers' next rebalance) never arrives here, so its stale contribution can never
     * make the peers switch without it. */
    if ((rc = MPI_Ibarrier(m->rebal, &req)) != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "moe_plan_rebalance: commit");
    int dummy = 0;
    st = wait_req(p, &req, "moe_plan_rebalance: commit (every rank agreed, waiting for every rank to confirm)",
                  &dummy,
                  "a peer may have switched to the new placement while this rank did not: this plan is unusable now "
                  "(abort the job: MPI_Abort)");
    if (st != MOE_OK) {
        m->broken = 1;
        m->rebal_broken = 1;
    }
    return st;
}

void moe_par_placement_changed(const moe_stage *p)
{
    moe_par *m = p->mpi;
    const int64_t E = p->desc.num_experts;
    m->emax = p->epmap.emax > 0 ? p->epmap.emax : (E + m->ep_size - 1) / m->ep_size;
}

/* ---- execute ----------------------------------------------------------------------------- */

moe_status moe_par_begin(const moe_stage *p, moe_status local, int64_t n_tokens, int64_t ws_tokens,
                         int64_t *tc_max, int64_t *n_chunks, int64_t *max_tokens)
{
    moe_par *m = p->mpi;
    moe_ctx *ctx = p->ctx;
    *tc_max = *n_chunks = *max_tokens = 0;
    moe_status st = moe_par_usable(p);
    if (st != MOE_OK)
        return st;
    moe_par_hello mine = {.n_tokens = local == MOE_OK ? n_tokens : 0, .ws_tokens = ws_tokens, .status = (int32_t)local};
    MPI_Request req;
    int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, m->hello, (int)sizeof mine, MPI_BYTE, m->world, &req);
    if (rc != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "moe_plan_execute: start");
    if ((st = moe_par_wait(p, &req, "moe_plan_execute: start (every rank's token count)")) != MOE_OK)
        return st;
    if (local != MOE_OK)
        return local; /* this rank's own message stands; the peers name it */
    const moe_par_hello *h = m->hello;
    for (int i = 0; i < m->world_size; i++)
        if (h[i].status != MOE_OK)
            return moe_set_error(ctx, (moe_status)h[i].status,
                                 "moe_plan_execute: rank %d (ep_rank %d, tp_rank %d) failed with %s before any data "
                                 "moved (its own error says why); no rank ran the layer",
                                 i, m->coords[2 * i], m->coords[2 * i + 1], moe_status_name((moe_status)h[i].status));
    int64_t maxT = 0;
    for (int i = 0; i < m->world_size; i++) {
        if (h[i].n_tokens > maxT)
            maxT = h[i].n_tokens;
        for (int j = 0; j < i; j++)
            if (m->coords[2 * j] == m->coords[2 * i] && h[j].n_tokens != h[i].n_tokens)
                return moe_set_error(ctx, MOE_EINVAL,
                                     "moe_plan_execute: ranks %d and %d form a TP group (ep_rank %d) but passed n_tokens "
                                     "%lld and %lld; the ranks of a TP group share their tokens",
                                     j, i, m->coords[2 * i], (long long)h[j].n_tokens, (long long)h[i].n_tokens);
    }
    const int64_t tc = maxT < p->chunk_size ? maxT : p->chunk_size;
    for (int i = 0; i < m->world_size; i++)
        if (h[i].ws_tokens < tc)
            return moe_set_error(ctx, MOE_EWORKSPACE,
                                 "moe_plan_execute: rank %d's workspace fits chunks of %lld tokens, but this execute "
                                 "runs chunks of %lld (the most tokens a rank passed is %lld): size every rank's "
                                 "workspace with moe_plan_workspace_size(plan, M), M >= the most tokens any rank passes",
                                 i, (long long)h[i].ws_tokens, (long long)tc, (long long)maxT);
    *tc_max = tc;
    *n_chunks = tc > 0 ? (maxT + tc - 1) / tc : 0;
    *max_tokens = maxT;
    return MOE_OK;
}

moe_status moe_par_gather_load(const moe_stage *p, const int64_t *local, int64_t *total)
{
    const int64_t E = p->desc.num_experts;
    moe_par *m = p->mpi;
    if (!m) { /* a one-process plan: the group is this process */
        if (total != local)
            memmove(total, local, sizeof(int64_t) * (size_t)E);
        return MOE_OK;
    }
    moe_status st = moe_par_usable(p);
    if (st != MOE_OK)
        return st;
    if (E > INT32_MAX)
        return moe_set_error(p->ctx, MOE_EINVAL, "moe_plan_gather_load: num_experts %lld too large for one MPI call",
                             (long long)E);
    /* the EP communicator: the ranks with this tp_rank, so each token counts once (the
     * ranks of a TP group route the same tokens) */
    MPI_Request req;
    const void *send = local == total ? MPI_IN_PLACE : (const void *)local;
    int rc = MPI_Iallreduce(send, total, (int)E, MPI_INT64_T, MPI_SUM, m->ep, &req);
    if (rc != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "moe_plan_gather_load");
    return moe_par_wait(p, &req, "moe_plan_gather_load: summing the expert load over the EP group");
}

/* acc = ((g_0 + g_1) + g_2) + ... element by element: g [tp][ld] (slices at stride ld),
 * elements [0, n) of each, into out [n]. The same expression on every rank. */
static void sum_in_rank_order(const float *g, int tp, size_t ld, size_t n, float *out, int threads)
{
#pragma omp parallel for schedule(static) num_threads(threads) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float acc = g[i];
        for (int s = 1; s < tp; s++)
            acc = acc + g[(size_t)s * ld + i];
        out[i] = acc;
    }
}

moe_status moe_par_tp_reduce(moe_chunk *c, int64_t t0, int64_t T, float *rows)
{
    const moe_stage *p = c->st;
    moe_par *m = p->mpi;
    const int64_t H = p->desc.hidden_size, Tc = c->T;
    const int tp = m->tp_size, me = m->tp_rank;
    const int threads = p->ctx->num_threads;
    float *part = c->out;                 /* [Tc, H] this rank's partial output */
    float *gather = (float *)c->par_ws;   /* [tp, c->tc_max, H] */
    const size_t ld = (size_t)c->tc_max * (size_t)H; /* reduce-scatter: rank s's rows at s * ld */
    const double w0 = MPI_Wtime();
    MPI_Request req;
    int rc;
    moe_status st;
    const size_t row_bytes = (size_t)H * sizeof(float);
    int64_t sent_rows = 0;

    if (p->ctx->tp_reduce == MOE_TP_REDUCE_SCATTER || (size_t)Tc * row_bytes >= (size_t)p->ctx->small_allreduce) {
        /* Reduce-scatter: rank j sums rows [a_j, b_j) of the chunk. reduce_scatter output:
         * the rows of T that rank j owns (split of T), intersected with the chunk; large
         * all-reduce: the split of the chunk's Tc rows. */
        const int scatter = p->ctx->tp_reduce == MOE_TP_REDUCE_SCATTER;
        for (int j = 0; j < tp; j++) {
            int64_t a, b;
            if (scatter) {
                int64_t g0 = moe_split_first(T, tp, j), g1 = g0 + moe_split_count(T, tp, j);
                a = g0 - t0 < 0 ? 0 : (g0 - t0 > Tc ? Tc : g0 - t0);
                b = g1 - t0 < 0 ? 0 : (g1 - t0 > Tc ? Tc : g1 - t0);
            } else {
                a = moe_split_first(Tc, tp, j);
                b = a + moe_split_count(Tc, tp, j);
            }
            m->tcount[j] = (int)(b - a); /* rows of my partial that rank j sums */
            m->tdispl[j] = (int)a;
            if (j != me)
                sent_rows += b - a;
        }
        const int mine = m->tcount[me], my0 = m->tdispl[me];
        for (int s = 0; s < tp; s++) {
            m->rcount2[s] = mine;                      /* rows of s's partial that I sum */
            m->rdispl2[s] = (int)((size_t)s * (size_t)c->tc_max); /* in rows of gather */
        }
        rc = MPI_Ialltoallv(part, m->tcount, m->tdispl, m->yrow, gather, m->rcount2, m->rdispl2, m->yrow, m->tp, &req);
        if (rc != MPI_SUCCESS)
            return moe_par_mpi_fail(p, rc, "TP reduce-scatter");
        if ((st = moe_par_wait(p, &req, "TP reduce-scatter")) != MOE_OK)
            return st;
        float *dst = rows + my0 * H; /* [mine, H] */
        sum_in_rank_order(gather, tp, ld, (size_t)mine * (size_t)H, dst, threads);
        if (!scatter) {
            /* all-gather the summed slices into the output rows of the chunk */
            rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rows, m->tcount, m->tdispl, m->yrow,
                                 m->tp, &req);
            if (rc != MPI_SUCCESS)
                return moe_par_mpi_fail(p, rc, "TP all-gather");
            if ((st = moe_par_wait(p, &req, "TP all-gather")) != MOE_OK)
                return st;
            sent_rows += (int64_t)mine * (tp - 1);
        }
    } else {
        /* Small messages: all-gather the partials; every rank sums all of them. */
        /* gather [tp, Tc, H]: the ranks of a TP group share Tc */
        rc = MPI_Iallgather(part, (int)Tc, m->yrow, gather, (int)Tc, m->yrow, m->tp, &req);
        if (rc != MPI_SUCCESS)
            return moe_par_mpi_fail(p, rc, "TP all-gather of the partial outputs");
        if ((st = moe_par_wait(p, &req, "TP all-gather of the partial outputs")) != MOE_OK)
            return st;
        sum_in_rank_order(gather, tp, (size_t)Tc * (size_t)H, (size_t)Tc * (size_t)H, rows, threads);
        sent_rows += Tc * (tp - 1);
    }
    c->stats->tp_reduce_seconds += MPI_Wtime() - w0;
    c->stats->tp_reduce_bytes += sent_rows * (int64_t)row_bytes;
    return MOE_OK;
}

#else
typedef int moe_parallel_mpi_unused; /* ISO C: a translation unit holds a declaration */
#endif
