/* The tool's MPI (the library never initializes MPI; the caller does): `moe run` and `moe bench`
 * initialize it when asked for --ep / --tp > 1 or when launched by mpirun, and use it for the
 * few things a command line needs across ranks: gathering output rows to rank 0, per-rank
 * lines, barriers, and ending the whole job when one rank fails (a tool may call MPI_Abort;
 * the library never does). Without MPI (MOE_WITH_MPI off) every helper is a one-process no-op. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#if MOE_WITH_MPI
#include <mpi.h>
#endif

static int g_active, g_rank, g_size = 1;
#if MOE_WITH_MPI
static MPI_Comm g_exit_comm = MPI_COMM_NULL; /* a duplicate of MPI_COMM_WORLD for cli_mpi_exit only */
#endif

/* Error lines of cli_err held back on a multi-rank run (cli_mpi_defer_err) until cli_mpi_exit
 * decides who prints them; the rest of a long one is cut. */
enum { ERR_BYTES = 1024 };
static char g_err[ERR_BYTES];
static size_t g_err_len;

/* How long a failing rank waits at exit for the others to reach it too (so the job can end
 * with MPI_Finalize) before it ends the job with MPI_Abort: a peer still waiting in a
 * collective for the failed rank never arrives. */
#define EXIT_AGREE_S 10.0

/* "--ep N" / "--ep=N" / "--tp ..." with N > 1 among argv. */
static int wants_parallel(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strncmp(a, "--ep=", 5) || !strncmp(a, "--tp=", 5))
            v = a + 5;
        else if ((!strcmp(a, "--ep") || !strcmp(a, "--tp")) && i + 1 < argc)
            v = argv[i + 1];
        if (v && atol(v) > 1)
            return 1;
    }
    return 0;
}

/* Launched by an MPI launcher (OpenMPI, PMI, PMIx)? */
static int under_launcher(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int cli_mpi_init(int *argc, char ***argv)
{
    if (!wants_parallel(*argc, *argv) && !under_launcher())
        return 0;
#if MOE_WITH_MPI
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "moe: MPI_Init_thread failed\n");
        return -1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm) != MPI_SUCCESS)
        g_exit_comm = MPI_COMM_NULL;
    g_active = 1;
    return 0;
#else
    if (wants_parallel(*argc, *argv)) {
        fprintf(stderr, "moe: --ep / --tp > 1 need MPI, and this moe was built without it (CMake option "
                        "MOE_WITH_MPI=OFF); rebuild with -DMOE_WITH_MPI=ON (OpenMPI: openmpi-bin libopenmpi-dev)\n");
        return -1;
    }
    return 0;
#endif
}

void cli_mpi_finalize(void)
{
#if MOE_WITH_MPI
    if (g_active) {
        if (g_exit_comm != MPI_COMM_NULL)
            MPI_Comm_free(&g_exit_comm);
        MPI_Finalize();
    }
#endif
    g_active = 0;
}

int cli_mpi_defer_err(const char *line)
{
#if MOE_WITH_MPI
    if (g_active && g_size > 1 && g_exit_comm != MPI_COMM_NULL) {
        const size_t n = strlen(line);
        const size_t room = sizeof g_err - 1 - g_err_len;
        memcpy(g_err + g_err_len, line, n < room ? n : room);
        g_err_len += n < room ? n : room;
        g_err[g_err_len] = '\0';
        return 1;
    }
#endif
    (void)line;
    return 0;
}

/* This rank's held-back lines on stderr, each with a "rank N: " prefix. */
static void print_own_errors(void)
{
    const char *p = g_err;
    while (*p) {
        const char *nl = strchr(p, '\n');
        const size_t n = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(stderr, "rank %d: %.*s\n", g_rank, (int)n, p);
        p += n + (nl != NULL);
    }
    g_err_len = 0;
    g_err[0] = '\0';
}

int cli_mpi_exit(int rc)
{
    fflush(stdout);
#if MOE_WITH_MPI
    if (g_active && g_size > 1 && g_exit_comm != MPI_COMM_NULL) {
        /* agree on the worst exit status over every rank, on a communicator no other collective
         * uses: a failing rank waits at most EXIT_AGREE_S for the others (a peer blocked in a
         * collective for it never comes), a succeeding one as long as it takes */
        int mine = rc, worst = 0, done = 0;
        MPI_Request req;
        MPI_Iallreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, g_exit_comm, &req);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            if (done)
                break;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (rc != 0 && (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > EXIT_AGREE_S) {
                print_own_errors();
                fprintf(stderr, "rank %d: the other ranks did not reach the exit within %.0f s (waiting in a "
                        "collective for this rank?); ending the job (MPI_Abort)\n", g_rank, EXIT_AGREE_S);
                cli_mpi_abort(rc);
                return rc;
            }
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
        /* every rank is here: rank 0 prints the held-back lines, once when every rank has the
         * same ones, else each rank's with its "rank N: " prefix, in rank order */
        char *all = g_rank == 0 ? malloc((size_t)g_size * sizeof g_err) : NULL; /* [size][ERR_BYTES] */
        MPI_Gather(g_err, (int)sizeof g_err, MPI_CHAR, all, (int)sizeof g_err, MPI_CHAR, 0, g_exit_comm);
        if (g_rank == 0 && all) {
            int same = 1;
            for (int r = 1; r < g_size && same; r++)
                same = strcmp(all + (size_t)r * sizeof g_err, all) == 0;
            for (int r = 0; r < (same ? 1 : g_size); r++) {
                const char *p = all + (size_t)r * sizeof g_err;
                while (*p) {
                    const char *nl = strchr(p, '\n');
                    const size_t n = nl ? (size_t)(nl - p) : strlen(p);
                    if (same)
                        fprintf(stderr, "%.*s\n", (int)n, p);
                    else
                        fprintf(stderr, "rank %d: %.*s\n", r, (int)n, p);
                    p += n + (nl != NULL);
                }
            }
            fflush(stderr);
        } else if (g_rank == 0) {
            print_own_errors();
        }
        free(all);
        g_err_len = 0;
        g_err[0] = '\0';
        return worst;
    }
#endif
    if (g_err_len) /* held back but no exit agreement possible: print them here */
        print_own_errors();
    if (rc != 0)
        cli_mpi_abort(rc);
    return rc;
}

int cli_mpi_rank(void)
{
    return g_rank;
}

int cli_mpi_size(void)
{
    return g_size;
}

void cli_mpi_abort(int code)
{
    fflush(stdout);
    fflush(stderr);
#if MOE_WITH_MPI
    if (g_active && g_size > 1)
        MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)code;
}

void cli_mpi_barrier(void)
{
#if MOE_WITH_MPI
    if (g_active)
        MPI_Barrier(MPI_COMM_WORLD);
#endif
}

void cli_mpi_gather_doubles(const double *v, int n, double *all)
{
#if MOE_WITH_MPI
    if (g_active) {
        MPI_Gather(v, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        return;
    }
#endif
    memcpy(all, v, sizeof(double) * (size_t)n);
}

int cli_mpi_gather_rows(void *buf, size_t row_bytes, int64_t row0, int64_t nrows)
{
#if MOE_WITH_MPI
    if (g_active && g_size > 1) {
        MPI_Datatype row;
        if (row_bytes > (size_t)INT32_MAX || MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row) != MPI_SUCCESS)
            return -1;
        MPI_Type_commit(&row);
        int64_t mine[2] = {row0, nrows};
        int64_t *all = g_rank == 0 ? malloc(sizeof(int64_t) * 2 * (size_t)g_size) : NULL; /* [size][2] */
        MPI_Gather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
        int rc = 0;
        if (g_rank == 0) {
            for (int r = 1; r < g_size; r++)
                if (all[2 * r + 1] > 0)
                    MPI_Recv((unsigned char *)buf + (size_t)all[2 * r] * row_bytes, (int)all[2 * r + 1], row, r, 7,
                             MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            free(all);
        } else if (nrows > 0) {
            rc = MPI_Send((unsigned char *)buf + (size_t)row0 * row_bytes, (int)nrows, row, 0, 7, MPI_COMM_WORLD) ==
                         MPI_SUCCESS
                     ? 0
                     : -1;
        }
        MPI_Type_free(&row);
        return rc;
    }
#endif
    (void)buf;
    (void)row_bytes;
    (void)row0;
    (void)nrows;
    return 0;
}

void cli_mpi_print_ordered(const char *line)
{
#if MOE_WITH_MPI
    if (g_active && g_size > 1) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", line);
        char *all = g_rank == 0 ? malloc(sizeof buf * (size_t)g_size) : NULL;
        MPI_Gather(buf, (int)sizeof buf, MPI_CHAR, all, (int)sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (g_rank == 0) {
            for (int r = 0; r < g_size; r++)
                fputs(all + (size_t)r * sizeof buf, stdout);
            fflush(stdout);
            free(all);
        }
        return;
    }
#endif
    fputs(line, stdout);
}
