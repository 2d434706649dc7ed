/* The transport's bound for the multi-node mdtest/IOR rows (issue 53,
 * bench/mdtest_bench.py): raw MPI request/reply in the pattern a file system
 * with per-path owners has, with no daemon. Every rank ITERS times asks a
 * random other rank (a REQ-byte request) and waits for its REPLY-byte answer,
 * one outstanding at a time, while answering the requests of the others
 * (nonblocking calls polled, yielding the CPU when nothing moved, as
 * fanstore-mpi-pingpong --all-pairs does).
 * Prints, on rank 0, one line of JSON: the aggregate requests/s (total
 * requests / the slowest rank's time) and the reply MiB/s.
 *
 * usage: mpi_rr ITERS [REPLY_BYTES [REQ_BYTES [SEED]]]
 *
 * MPICH 4.0.2 over UCX/TCP can hang in MPI_Finalize (scripts/mpi_finalize_check.c,
 * pmodels/mpich#6596): the result is printed and flushed before it, and the
 * ranks leave with _exit(0) after a barrier, as nothing is left to send.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#define TAG_REQ 1
#define TAG_REP 2

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: %s ITERS [REPLY_BYTES [REQ_BYTES [SEED]]]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long iters = atol(argv[1]);
    int reply = argc > 2 ? atoi(argv[2]) : 64;
    int req = argc > 3 ? atoi(argv[3]) : 64;
    unsigned seed = (argc > 4 ? (unsigned)atoi(argv[4]) : 1u) * 7919u + (unsigned)rank;
    if (n < 2) {
        if (rank == 0) fprintf(stderr, "mpi_rr needs at least 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char *reqbuf = calloc(1, req), *inreq = calloc(1, req);
    char *repbuf = calloc(1, reply), *outrep = calloc(1, reply);
    MPI_Request in = MPI_REQUEST_NULL, mine = MPI_REQUEST_NULL, bar = MPI_REQUEST_NULL;
    MPI_Status st;
    MPI_Irecv(inreq, req, MPI_BYTE, MPI_ANY_SOURCE, TAG_REQ, MPI_COMM_WORLD, &in);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime(), t1 = 0;
    long done = 0;
    int waiting = 0, finished = 0;
    for (;;) {
        if (!waiting && done < iters) {
            int peer = (int)(rand_r(&seed) % (unsigned)(n - 1));
            if (peer >= rank) peer++;
            MPI_Irecv(repbuf, reply, MPI_BYTE, peer, TAG_REP, MPI_COMM_WORLD, &mine);
            MPI_Send(reqbuf, req, MPI_BYTE, peer, TAG_REQ, MPI_COMM_WORLD);
            waiting = 1;
        }
        int flag = 0, moved = 0;
        MPI_Test(&in, &flag, &st);
        if (flag) {
            moved = 1;  /* answer a peer, then wait for the next request */
            MPI_Send(outrep, reply, MPI_BYTE, st.MPI_SOURCE, TAG_REP, MPI_COMM_WORLD);
            MPI_Irecv(inreq, req, MPI_BYTE, MPI_ANY_SOURCE, TAG_REQ, MPI_COMM_WORLD, &in);
        }
        if (waiting) {
            MPI_Test(&mine, &flag, MPI_STATUS_IGNORE);
            if (flag) {
                waiting = 0;
                moved = 1;
                if (++done == iters) {
                    t1 = MPI_Wtime() - t0;
                    MPI_Ibarrier(MPI_COMM_WORLD, &bar);
                }
            }
        }
        if (bar != MPI_REQUEST_NULL || finished) {
            MPI_Test(&bar, &flag, MPI_STATUS_IGNORE);
            if (flag) break;  /* every rank is done asking: nobody needs an answer any more */
        }
        if (iters == 0 && !finished) {
            finished = 1;
            MPI_Ibarrier(MPI_COMM_WORLD, &bar);
        }
        if (!moved)  /* more ranks than cores here: let the peer that must answer run */
            sched_yield();
    }
    double slowest = 0;
    MPI_Reduce(&t1, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        double ops = slowest > 0 ? (double)iters * n / slowest : 0;
        printf("{\"ranks\": %d, \"iters\": %ld, \"reply_bytes\": %d, \"req_bytes\": %d, \"seconds\": %.6f, "
               "\"ops_per_s\": %.1f, \"reply_mib_per_s\": %.1f}\n",
               n, iters, reply, req, slowest, ops, ops * reply / 1048576.0);
        fflush(stdout);
    }
    MPI_Cancel(&in);
    MPI_Wait(&in, MPI_STATUS_IGNORE);
    MPI_Barrier(MPI_COMM_WORLD);
    _exit(0);
}
