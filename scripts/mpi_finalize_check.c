/* Does this MPI stack hang in MPI_Finalize?  (scripts/mpi_finalize_check.sh)
 *
 * The smallest program that shows it on Debian 12's MPICH 4.0.2 over UCX
 * 1.13 with UCX_TLS=tcp: MPI_Init, one MPI_Barrier, MPI_Finalize, on 4
 * ranks. MPICH's UCX finalize closes every endpoint, then waits in a PMI
 * barrier without driving UCX; a rank whose endpoint close still needs a
 * peer that already waits there never returns (fixed upstream by
 * pmodels/mpich#6596). DELAY_US=N makes rank WHO (default 0) wait N
 * microseconds before MPI_Finalize, as a rank with more to clean up does.
 */
#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    const char *delay = getenv("DELAY_US"), *who = getenv("WHO");
    if (delay && rank == (who ? atoi(who) : 0))
        usleep((useconds_t)atoi(delay));
    MPI_Finalize();
    return 0;
}
