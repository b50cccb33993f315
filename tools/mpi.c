/* The tool's MPI (the library never initializes MPI; the caller does): `moe run` and `moe bench`
 * initialize it when asked for --ep / --tp > 1 or when launched by mpirun, and use it for the
 * few things a command line needs across ranks: gathering output rows to rank 0, per-rank
 * lines, barriers, and ending the whole job when one rank fails (a tool may call MPI_Abort;
 * the library never does). Without MPI (MOE_WITH_MPI off) every helper is a one-process no-op. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

#if MOE_WITH_MPI
#include <mpi.h>
#endif

static int g_active, g_rank, g_size = 1;

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
    if (g_active)
        MPI_Finalize();
#endif
    g_active = 0;
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
