/* Expert-parallel prepare/finalize over MPI (moe_parallel.h "Parallelism", DESIGN.md sections 6-7).
 *
 * ep_alltoall (standard format, high throughput), per chunk of Tc tokens on this rank:
 *   1. route locally (done by the caller: the router is replicated); each (t, k) row goes to
 *      one physical expert of its logical expert (replica (t + ep_rank) mod c, moe_parallel.h
 *      "Expert placement"); group the T*K rows by destination rank - the send order (the
 *      contiguous placement groups by logical expert id with MOE_PERMUTE, which orders them by
 *      owning rank, then local expert, then row id; any other placement counts rows per
 *      destination in row-id order);
 *   2. MPI_Ialltoall of the row counts per destination (-1 flags an expert id outside every
 *      rank's range: every rank then fails, nothing is dropped);
 *   3. MPI_Ialltoallv of the rows as records {int32 local expert id, f32 scale, H activations in
 *      dispatch_dtype} (with apply_router_weight_on_input the sender scales x by its weight,
 *      one f32 multiply per element, exactly as the local path does);
 *   4. group the received rows by local expert, stable in receive order (source rank, then
 *      the source's order), into x [R, H]; the experts run on [begin, end) per local expert;
 *   5. the outputs go back in receive order (MPI_Ialltoallv of f32 rows), and the sender
 *      combines them in top-k order with moe_combine.
 * Each row's output is computed by the same kernel in the same order as in one process and
 * the combine order is unchanged, so the output is bit-identical to one process (F32).
 *
 * ep_batched (batched format, low latency): no count exchange; one MPI_Ialltoall of
 * fixed-size blocks, one per destination: a header record (the row count), then
 * cap * min(K, emax) row slots (emax = the most physical experts one rank holds; cap = the
 * longest chunk of the execute, at most
 * batched_capacity: chunks are cut to it at plan creation). A source chunk of Tc <= cap tokens
 * sends at most Tc * min(K, E_dest) rows to one rank and at most Tc <= cap rows to one expert
 * (a token picks an expert at most once), so neither the block nor an expert's slots can
 * overflow (checked anyway: an overflow fails every rank, nothing is dropped). The receiver
 * places each row into the batched slots [E_local][ep * cap] of its local expert (source
 * order, then the source's order), the experts run, and the outputs return in the senders'
 * block layout by one MPI_Ialltoall. One collective each way instead of two and one, at the
 * price of sending the whole block.
 *
 * All collectives are nonblocking and polled against parallel.timeout_s (moe_par_wait). */
#include "parallel/parallel.h"

#if MOE_WITH_MPI

#include "parallel/mpi_internal.h"

#include "permute/permute.h"
#include "quant/convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

/* The EP workspace of a chunk of up to Tc tokens (positions: the rows this rank's experts
 * run; R = ep * Tc * min(K, E_local) for the standard format, E_local * ep * cap batched). */
typedef struct ep_ws {
    unsigned char *send; /* standard: [Tc*K] records in send order; batched: [ep][1 + rows] records */
    unsigned char *recv; /* standard: [R] records in receive order; batched: [ep][1 + rows] records */
    float *x;            /* expert inputs by position: standard [R, H] grouped by local expert
                            (reused for the outputs in receive order on the way back);
                            batched: slots [E_local * ep * cap, H] */
    float *h;            /* [positions, I_local] */
    float *y;            /* [positions, H] expert outputs by position */
    float *yret;         /* batched: [ep, rows, H] outputs in the senders' block layout;
                            standard: = x */
    float *yback;        /* outputs of this rank's rows: standard [Tc*K, H] in send order;
                            batched [ep, rows, H] */
    int32_t *map;        /* standard: [R] receive index of each position; batched:
                            [E_local * ep * cap] row of yret of each slot */
    int64_t positions;   /* R, or E_local * ep * cap */
    int64_t cap;         /* batched: slots per (source, expert) = Tc */
    int64_t rows;        /* batched: row slots per block, cap * min(K, emax) */
} ep_ws;

static int is_batched(const moe_stage *p)
{
    return p->batched;
}

/* Lay out the EP workspace for chunks of Tc tokens at base (NULL: sizes only). Returns bytes. */
static size_t ep_layout(const moe_stage *p, int64_t Tc, unsigned char *base, ep_ws *w)
{
    const moe_par *m = p->mpi;
    const size_t H = (size_t)p->desc.hidden_size, K = (size_t)p->desc.top_k;
    const size_t El = (size_t)p->shard.n_experts, Il = (size_t)p->shard.I;
    const size_t ep = (size_t)p->par.ep_size, rb = m->rec_bytes, T = (size_t)Tc;
    size_t cur = 0;
    size_t off[8];
    memset(w, 0, sizeof *w);
    if (is_batched(p)) {
        const size_t cap = T, emax = (size_t)m->emax, kk = K < emax ? K : emax;
        const size_t rows = cap * kk, blk = 1 + rows, pos = El * ep * cap, nret = ep * rows;
        w->cap = (int64_t)cap;
        w->rows = (int64_t)rows;
        w->positions = (int64_t)pos;
        const size_t sz[8] = {ep * blk * rb, ep * blk * rb, pos * H * 4, pos * Il * 4, pos * H * 4, nret * H * 4,
                              nret * H * 4, pos * 4};
        for (int i = 0; i < 8; i++) {
            off[i] = cur;
            cur += moe_par_align(sz[i] ? sz[i] : 1); /* never empty: distinct send and receive
                                                        buffers even on a rank without experts
                                                        (an MPI may take sendbuf == recvbuf as
                                                        in place) */
        }
        if (base) {
            w->send = base + off[0];
            w->recv = base + off[1];
            w->x = (float *)(base + off[2]);
            w->h = (float *)(base + off[3]);
            w->y = (float *)(base + off[4]);
            w->yret = (float *)(base + off[5]);
            w->yback = (float *)(base + off[6]);
            w->map = (int32_t *)(base + off[7]);
        }
    } else {
        const size_t kk = K < El ? K : El;
        const size_t R = ep * T * kk;
        w->positions = (int64_t)R;
        const size_t sz[7] = {T * K * rb, R * rb, R * H * 4, R * Il * 4, R * H * 4, T * K * H * 4, R * 4};
        for (int i = 0; i < 7; i++) {
            off[i] = cur;
            cur += moe_par_align(sz[i] ? sz[i] : 1); /* never empty: distinct send and receive
                                                        buffers even on a rank without experts
                                                        (an MPI may take sendbuf == recvbuf as
                                                        in place) */
        }
        if (base) {
            w->send = base + off[0];
            w->recv = base + off[1];
            w->x = (float *)(base + off[2]);
            w->h = (float *)(base + off[3]);
            w->y = (float *)(base + off[4]);
            w->yret = w->x;
            w->yback = (float *)(base + off[5]);
            w->map = (int32_t *)(base + off[6]);
        }
    }
    return cur;
}

/* The parallel workspace: the TP gather buffer (the transport's), then the EP buffers above.
 * Here, not in mpi.c, so that the transport never calls the dispatch/combine. */
size_t moe_par_workspace_bytes(const moe_stage *p, int64_t Tc)
{
    if (!p->parallel)
        return 0;
    ep_ws w;
    return moe_par_tp_bytes(p, Tc) + (p->par.ep_size > 1 ? ep_layout(p, Tc, NULL, &w) : 0);
}

/* One dispatch record: int32 local expert id, f32 scale, then the row's H activations (times
 * *wr when wr is non-NULL: apply_router_weight_on_input) in dispatch dtype dt. F8_E4M3 and
 * I8 use a per-row scale max|v| / 448 or / 127; a row holding Inf or NaN gets scale NaN. */
static void pack_rec(moe_dtype dt, unsigned char *rec, int32_t lid, const float *x, const float *wr, int64_t H)
{
    memcpy(rec, &lid, sizeof lid);
    float scale = 1.0f;
    unsigned char *pl = rec + 8; /* payload: 8-byte aligned */
    if (dt == MOE_DTYPE_F32) {
        float *o = (float *)pl; /* [H] */
        if (wr) {
            const float w = *wr;
            for (int64_t k = 0; k < H; k++)
                o[k] = w * x[k];
        } else {
            memcpy(o, x, sizeof(float) * (size_t)H);
        }
    } else {
        const float w = wr ? *wr : 1.0f;
        float amax = 0.0f;
        int bad = 0;
        for (int64_t k = 0; k < H; k++) {
            const float v = wr ? w * x[k] : x[k];
            if (!isfinite(v))
                bad = 1;
            else if (fabsf(v) > amax)
                amax = fabsf(v);
        }
        const float qmax = dt == MOE_DTYPE_F8_E4M3 ? 448.0f : 127.0f;
        scale = bad ? NAN : amax > 0.0f ? amax / qmax : 1.0f;
        for (int64_t k = 0; k < H; k++) {
            const float v = wr ? w * x[k] : x[k];
            if (bad) {
                pl[k] = 0;
            } else if (dt == MOE_DTYPE_F8_E4M3) {
                pl[k] = moe_f32_to_e4m3(v / scale);
            } else {
                long q = lrintf(v / scale); /* nearest, ties to even */
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                int8_t s8 = (int8_t)q;
                memcpy(pl + k, &s8, 1);
            }
        }
    }
    memcpy(rec + 4, &scale, sizeof scale);
}

/* A record's activations as f32 into dst [H]. */
static void unpack_rec(moe_dtype dt, const unsigned char *rec, int64_t H, float *dst)
{
    const unsigned char *pl = rec + 8;
    if (dt == MOE_DTYPE_F32) {
        memcpy(dst, pl, sizeof(float) * (size_t)H);
        return;
    }
    float scale;
    memcpy(&scale, rec + 4, sizeof scale);
    for (int64_t k = 0; k < H; k++) {
        if (dt == MOE_DTYPE_F8_E4M3) {
            dst[k] = moe_e4m3_to_f32(pl[k]) * scale;
        } else {
            int8_t s8;
            memcpy(&s8, pl + k, 1);
            dst[k] = (float)s8 * scale;
        }
    }
}

static int32_t rec_lid(const unsigned char *rec)
{
    int32_t lid;
    memcpy(&lid, rec, sizeof lid);
    return lid;
}

/* The first routed row whose id is outside [-1, E + Z), or -1 (ids in [E, E + Z) are identity
 * experts: never sent, added by the sender's combine; id -1 is an empty slot (dropped by
 * expert_capacity, or given as -1): never sent, adds nothing). */
static int64_t bad_row(const moe_chunk *c)
{
    const int64_t E = moe_route_width(&c->st->desc), n = c->T * c->st->desc.top_k;
    for (int64_t r = 0; r < n; r++)
        if (c->ids[r] < -1 || c->ids[r] >= E)
            return r;
    return -1;
}

/* The physical expert that row r (token c->t0 + r / K of the execute, slot r % K) goes to:
 * replica (t + ep_rank) mod c of its logical expert (moe_parallel.h "Expert placement"). */
static inline int32_t row_phys(const moe_chunk *c, int64_t r)
{
    const moe_ep_map *mp = &c->st->epmap;
    const int32_t e = c->ids[r], a = mp->replica_off[e], nrep = mp->replica_off[e + 1] - a;
    if (nrep == 1)
        return mp->replica_phys[a];
    const int64_t t = c->t0 + r / c->st->desc.top_k;
    return mp->replica_phys[a + (int32_t)((t + c->st->par.ep_rank) % nrep)];
}

/* Group this rank's rows by destination rank into send order (c->rows [n] row ids by send
 * index, c->pos [n] the send index of each row) and fill dcount / ddispl [ep] (rows and first
 * send index per destination). The contiguous placement groups by logical expert
 * (MOE_PERMUTE: expert order is rank order); any other counts rows per destination, stable
 * in row-id order. Either way the rows one source sends to one local expert keep row-id
 * order, so the receiver's grouping (stable in receive order) is the same. */
static void group_send(moe_chunk *c, int *dcount, int *ddispl)
{
    const moe_stage *p = c->st;
    const moe_ep_map *mp = &p->epmap;
    const int64_t E = p->desc.num_experts, n = c->T * p->desc.top_k;
    const int ep = p->par.ep_size;
    if (mp->contiguous) {
        if (c->T > 0) {
            moe_pf_group_rows(c);
        } else {
            for (int64_t e = 0; e <= E; e++)
                c->offsets[e] = 0;
        }
        for (int dd = 0; dd < ep; dd++) {
            const int64_t f = moe_split_first(E, ep, dd), l = f + moe_split_count(E, ep, dd);
            ddispl[dd] = (int)c->offsets[f];
            dcount[dd] = (int)(c->offsets[l] - c->offsets[f]);
        }
        return;
    }
    int64_t *cur = c->offsets; /* [ep + 1] (ep <= E): send cursors per destination */
    for (int dd = 0; dd <= ep; dd++)
        cur[dd] = 0;
    for (int64_t r = 0; r < n; r++)
        if (c->ids[r] >= 0 && c->ids[r] < E) /* identity experts' and empty slots' rows are not sent */
            cur[mp->phys_rank[row_phys(c, r)] + 1]++;
    for (int dd = 0; dd < ep; dd++) {
        dcount[dd] = (int)cur[dd + 1];
        cur[dd + 1] += cur[dd];
        ddispl[dd] = (int)cur[dd];
    }
    for (int64_t r = 0; r < n; r++) {
        if (c->ids[r] < 0 || c->ids[r] >= E)
            continue;
        const int64_t i = cur[mp->phys_rank[row_phys(c, r)]]++;
        c->rows[i] = (int32_t)r;
        c->pos[r] = (int32_t)i;
    }
}

/* The rows this rank sends (group_send's counts summed): T*K less the identity experts' rows
 * and the empty slots. */
static int64_t sent_rows(const int *dcount, int ep)
{
    int64_t n = 0;
    for (int dd = 0; dd < ep; dd++)
        n += dcount[dd];
    return n;
}

static moe_status bad_id_error(moe_chunk *c, int64_t r)
{
    const int64_t K = c->st->desc.top_k;
    return moe_set_error(c->st->ctx, MOE_EINVAL,
                         "EP dispatch: token %lld slot %lld is routed to expert id %d, outside every rank's range [0, %lld); "
                         "no row is dropped: the execute fails on every rank",
                         (long long)(r / K), (long long)(r % K), c->ids[r], (long long)c->st->desc.num_experts);
}

static moe_status peer_bad_error(moe_chunk *c, int src, int code)
{
    return moe_set_error(c->st->ctx, MOE_EINVAL,
                         "EP dispatch: EP rank %d %s; no row is dropped: the execute fails on every rank", src,
                         code == -2 ? "would overflow a batched block (more rows than its slots)"
                                    : "routed a row to an expert id outside every rank's range");
}

/* Weighted sum over K in top-k order of the returned outputs y (rows by c->pos), threaded
 * over tokens. */
static void combine(moe_chunk *c, const float *y)
{
    const moe_layer_desc *ds = &c->st->desc;
    if (c->T == 0)
        return;
#pragma omp parallel num_threads(c->st->ctx->num_threads)
    {
        int tid = omp_get_thread_num(), n = omp_get_num_threads();
        int64_t a0 = c->T * tid / n, a1 = c->T * (tid + 1) / n;
        moe_combine(ds, a0, a1, c->wts, y, c->pos, c->ids, (c->st->par.tp_size <= 1 || c->st->par.tp_rank == 0) ? c->x : NULL, c->has_shared,
                    c->sgate, c->out);
    }
}

/* ---- standard format: MPI_Alltoallv ------------------------------------------------------ */

static moe_status std_prepare(moe_chunk *c, moe_dispatch *d)
{
    const moe_stage *p = c->st;
    moe_par *m = p->mpi;
    moe_ctx *ctx = p->ctx;
    moe_status st = moe_par_usable(p);
    if (st != MOE_OK)
        return st;
    const double t_start = MPI_Wtime();
    const int64_t K = p->desc.top_k, H = p->desc.hidden_size;
    const int64_t El = p->shard.n_experts;
    const int ep = m->ep_size, me = m->ep_rank;
    const size_t rb = m->rec_bytes;
    const int threads = ctx->num_threads;
    ep_ws w;
    ep_layout(p, c->tc_max, c->par_ws + moe_par_tp_bytes(p, c->tc_max), &w);

    /* 1. rows by destination (each row to its logical expert's replica); counts per
     *    destination */
    const int64_t bad = bad_row(c);
    if (bad < 0)
        group_send(c, m->scount, m->sdispl);
    else
        for (int dd = 0; dd < ep; dd++)
            m->scount[dd] = -1;
    const int64_t ns = bad < 0 ? sent_rows(m->scount, ep) : 0; /* rows sent: identity rows stay */
    /* 2. counts */
    MPI_Request req;
    int rc = MPI_Ialltoall(m->scount, 1, MPI_INT, m->rcount, 1, MPI_INT, m->ep, &req);
    if (rc != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "EP dispatch: row counts");
    if ((st = moe_par_wait(p, &req, "EP dispatch: row counts")) != MOE_OK)
        return st;
    if (bad >= 0)
        return bad_id_error(c, bad);
    int64_t R = 0;
    for (int s = 0; s < ep; s++) {
        if (m->rcount[s] < 0)
            return peer_bad_error(c, s, m->rcount[s]);
        m->rdispl[s] = (int)R;
        R += m->rcount[s];
    }
    if (R > w.positions)
        return moe_set_error(ctx, MOE_EINVAL, "EP dispatch: %lld rows received, more than the %lld the workspace holds",
                             (long long)R, (long long)w.positions);

    /* 3. records in send order (position i = c->pos of its row) */
    const moe_dtype dt = m->dispatch_dtype;
    const int on_input = p->desc.apply_router_weight_on_input;
#pragma omp parallel for schedule(static) num_threads(threads) if (ns * H > 32768)
    for (int64_t i = 0; i < ns; i++) {
        const int64_t r = c->rows[i];
        const int32_t lid = p->epmap.phys_local[row_phys(c, r)];
        pack_rec(dt, w.send + (size_t)i * rb, lid, c->x + (r / K) * H, on_input ? &c->wts[r] : NULL, H);
    }
    rc = MPI_Ialltoallv(w.send, m->scount, m->sdispl, m->rec, w.recv, m->rcount, m->rdispl, m->rec, m->ep, &req);
    if (rc != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "EP dispatch: rows");
    if ((st = moe_par_wait(p, &req, "EP dispatch: rows")) != MOE_OK)
        return st;

    /* 4. group the received rows by local expert, stable in receive order */
    int64_t *cur = c->offsets; /* [El + 1] cursors */
    for (int64_t e = 0; e <= El; e++)
        cur[e] = 0;
    for (int64_t i = 0; i < R; i++) {
        const int32_t lid = rec_lid(w.recv + (size_t)i * rb);
        if (lid < 0 || lid >= El)
            return moe_set_error(ctx, MOE_EINVAL, "EP dispatch: received local expert id %d outside [0, %lld)", lid,
                                 (long long)El);
        cur[lid + 1]++;
    }
    for (int64_t e = 0; e < El; e++)
        cur[e + 1] += cur[e];
    for (int64_t e = 0; e < El; e++) {
        c->begin[e] = cur[e];
        c->end[e] = cur[e + 1];
    }
    for (int64_t i = 0; i < R; i++) {
        const int32_t lid = rec_lid(w.recv + (size_t)i * rb);
        w.map[cur[lid]++] = (int32_t)i; /* cur[lid] ends at end[lid] */
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (R * H > 32768)
    for (int64_t q = 0; q < R; q++)
        unpack_rec(dt, w.recv + (size_t)w.map[q] * rb, H, w.x + q * H);

    *d = (moe_dispatch){.format = MOE_FORMAT_STANDARD, .x = w.x, .n_groups = El, .begin = c->begin, .end = c->end,
                        .rows = NULL, .row_div = 1, .pos = NULL, .h = w.h, .y = w.y, .in_scale = NULL};
    c->stats->dispatch_seconds += MPI_Wtime() - t_start;
    c->stats->dispatch_bytes += (ns - m->scount[me]) * (int64_t)rb;
    c->stats->received_rows += R;
    return MOE_OK;
}

static moe_status std_finalize(moe_chunk *c, const moe_dispatch *d)
{
    const moe_stage *p = c->st;
    moe_par *m = p->mpi;
    const double t_start = MPI_Wtime();
    const int64_t H = p->desc.hidden_size;
    const int ep = m->ep_size, me = m->ep_rank;
    ep_ws w;
    ep_layout(p, c->tc_max, c->par_ws + moe_par_tp_bytes(p, c->tc_max), &w);
    const int64_t R = (int64_t)m->rdispl[ep - 1] + m->rcount[ep - 1];
    /* outputs back into receive order (yret aliases x, free once the experts ran) */
#pragma omp parallel for schedule(static) num_threads(p->ctx->num_threads) if (R * H > 32768)
    for (int64_t q = 0; q < R; q++)
        memcpy(w.yret + (int64_t)w.map[q] * H, d->y + q * H, sizeof(float) * (size_t)H);
    MPI_Request req;
    int rc = MPI_Ialltoallv(w.yret, m->rcount, m->rdispl, m->yrow, w.yback, m->scount, m->sdispl, m->yrow, m->ep, &req);
    if (rc != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "EP combine: expert outputs");
    moe_status st = moe_par_wait(p, &req, "EP combine: expert outputs");
    if (st != MOE_OK)
        return st;
    combine(c, w.yback);
    c->stats->combine_seconds += MPI_Wtime() - t_start;
    c->stats->combine_bytes += (R - m->rcount[me]) * H * (int64_t)sizeof(float);
    return MOE_OK;
}

/* ---- batched format: one MPI_Alltoall of fixed-size slot blocks -------------------------- */

static moe_status bat_prepare(moe_chunk *c, moe_dispatch *d)
{
    const moe_stage *p = c->st;
    moe_par *m = p->mpi;
    moe_ctx *ctx = p->ctx;
    moe_status st = moe_par_usable(p);
    if (st != MOE_OK)
        return st;
    const double t_start = MPI_Wtime();
    const int64_t K = p->desc.top_k, H = p->desc.hidden_size;
    const int64_t El = p->shard.n_experts;
    const int ep = m->ep_size;
    const size_t rb = m->rec_bytes;
    const int threads = ctx->num_threads;
    ep_ws w;
    ep_layout(p, c->tc_max, c->par_ws + moe_par_tp_bytes(p, c->tc_max), &w);
    const int64_t cap = w.cap, rows = w.rows, blk = 1 + rows;

    /* 1. header record of each block: its row count (-1: an id outside every range,
     *    -2: more rows than the block or than an expert's slots hold) */
    const int64_t bad = bad_row(c);
    int *dcount = m->scount, *ddispl = m->sdispl; /* [ep] rows and first send index per destination */
    if (bad < 0)
        group_send(c, dcount, ddispl);
    int flag = bad >= 0 ? -1 : 0;
    /* cannot happen (chunks are cut to the capacity; a token sends at most one row per logical
     * expert, to one replica): an expert's slots overflowing is caught by the receiver */
    for (int dd = 0; dd < ep && !flag; dd++)
        if (dcount[dd] > rows)
            flag = -2;
    for (int dd = 0; dd < ep; dd++) {
        const int32_t count = flag ? flag : (int32_t)dcount[dd];
        memcpy(w.send + (size_t)(dd * blk) * rb, &count, sizeof count);
    }
    /* 2. rows into their block slots, in send order; pos = the row of the returned block */
    const moe_dtype dt = m->dispatch_dtype;
    const int on_input = p->desc.apply_router_weight_on_input;
    const int64_t ns = flag ? 0 : sent_rows(dcount, ep); /* rows sent: identity rows stay */
    if (!flag) {
#pragma omp parallel for schedule(static) num_threads(threads) if (ns * H > 32768)
        for (int64_t i = 0; i < ns; i++) {
            const int64_t r = c->rows[i];
            const int32_t q = row_phys(c, r);
            const int64_t owner = p->epmap.phys_rank[q];
            const int64_t j = i - ddispl[owner]; /* row within the block to `owner` */
            pack_rec(dt, w.send + (size_t)(owner * blk + 1 + j) * rb, p->epmap.phys_local[q], c->x + (r / K) * H,
                     on_input ? &c->wts[r] : NULL, H);
            c->pos[r] = (int32_t)(owner * rows + j);
        }
    }
    MPI_Request req;
    int rc = MPI_Ialltoall(w.send, (int)blk, m->rec, w.recv, (int)blk, m->rec, m->ep, &req);
    if (rc != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "EP batched dispatch");
    if ((st = moe_par_wait(p, &req, "EP batched dispatch")) != MOE_OK)
        return st;
    if (bad >= 0)
        return bad_id_error(c, bad);
    for (int s = 0; s < ep; s++) {
        int32_t count;
        memcpy(&count, w.recv + (size_t)(s * blk) * rb, sizeof count);
        if (count < 0)
            return peer_bad_error(c, s, count);
    }

    /* 3. every received row into its local expert's batched slots, source order */
    int64_t *cnt = c->offsets; /* [El] rows per local expert so far */
    for (int64_t l = 0; l < El; l++)
        cnt[l] = 0;
    int64_t R = 0;
    for (int s = 0; s < ep; s++) {
        int32_t count;
        memcpy(&count, w.recv + (size_t)(s * blk) * rb, sizeof count);
        for (int32_t j = 0; j < count; j++) {
            const int32_t lid = rec_lid(w.recv + (size_t)(s * blk + 1 + j) * rb);
            if (lid < 0 || lid >= El || cnt[lid] >= ep * cap)
                return moe_set_error(ctx, MOE_EINVAL, "EP batched dispatch: received a row for local expert %d "
                                     "(of %lld) beyond its slots", lid, (long long)El);
            w.map[lid * ep * cap + cnt[lid]++] = (int32_t)(s * rows + j);
        }
        R += count;
    }
    for (int64_t l = 0; l < El; l++) {
        c->begin[l] = l * ep * cap;
        c->end[l] = c->begin[l] + cnt[l];
    }
    const int64_t P = w.positions, per = ep * cap;
#pragma omp parallel for schedule(static) num_threads(threads) if (P * H > 32768)
    for (int64_t q = 0; q < P; q++) {
        if (q >= c->end[q / per])
            continue;
        const int64_t row = w.map[q], s = row / rows;
        unpack_rec(dt, w.recv + (size_t)(s * blk + 1 + (row - s * rows)) * rb, H, w.x + q * H);
    }
    *d = (moe_dispatch){.format = MOE_FORMAT_BATCHED, .x = w.x, .n_groups = El, .begin = c->begin, .end = c->end,
                        .rows = NULL, .row_div = 1, .pos = c->pos, .h = w.h, .y = w.y, .in_scale = NULL};
    c->stats->dispatch_seconds += MPI_Wtime() - t_start;
    c->stats->dispatch_bytes += (int64_t)(ep - 1) * blk * (int64_t)rb;
    c->stats->received_rows += R;
    return MOE_OK;
}

static moe_status bat_finalize(moe_chunk *c, const moe_dispatch *d)
{
    const moe_stage *p = c->st;
    moe_par *m = p->mpi;
    const double t_start = MPI_Wtime();
    const int64_t H = p->desc.hidden_size;
    const int ep = m->ep_size;
    ep_ws w;
    ep_layout(p, c->tc_max, c->par_ws + moe_par_tp_bytes(p, c->tc_max), &w);
    const int64_t cap = w.cap, rows = w.rows, P = w.positions, per = ep * cap;
#pragma omp parallel for schedule(static) num_threads(p->ctx->num_threads) if (P * H > 32768)
    for (int64_t q = 0; q < P; q++) {
        if (q >= c->end[q / per])
            continue;
        memcpy(w.yret + (int64_t)w.map[q] * H, d->y + q * H, sizeof(float) * (size_t)H);
    }
    MPI_Request req;
    int rc = MPI_Ialltoall(w.yret, (int)rows, m->yrow, w.yback, (int)rows, m->yrow, m->ep, &req);
    if (rc != MPI_SUCCESS)
        return moe_par_mpi_fail(p, rc, "EP batched combine");
    moe_status st = moe_par_wait(p, &req, "EP batched combine");
    if (st != MOE_OK)
        return st;
    combine(c, w.yback);
    c->stats->combine_seconds += MPI_Wtime() - t_start;
    c->stats->combine_bytes += (int64_t)(ep - 1) * rows * H * (int64_t)sizeof(float);
    return MOE_OK;
}

const moe_pf_impl moe_pf_ep_alltoall = {.name = "ep_alltoall", .format = MOE_FORMAT_STANDARD,
                                        .prepare = std_prepare, .finalize = std_finalize};

const moe_pf_impl moe_pf_ep_batched = {.name = "ep_batched", .format = MOE_FORMAT_BATCHED,
                                       .prepare = bat_prepare, .finalize = bat_finalize};

#else
typedef int moe_parallel_ep_unused; /* ISO C: a translation unit holds a declaration */
#endif
