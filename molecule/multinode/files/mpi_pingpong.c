/* Test program: ranks 0 and 1 bounce a message back and forth. Prints the
 * one-way latency of a small message and the bandwidth of a large one:
 *   latency_us 3.21
 *   bandwidth_MBps 1234.5 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static double round_trip(char *buf, int bytes, int iterations, int rank)
{
    double start;

    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    for (int i = 0; i < iterations; i++) {
        if (rank == 0) {
            MPI_Send(buf, bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - start) / iterations;
}

int main(int argc, char **argv)
{
    const int large = 4 << 20;
    int rank;
    char *buf = calloc(1, large);

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (buf == NULL)
        MPI_Abort(MPI_COMM_WORLD, 1);
    round_trip(buf, 8, 100, rank); /* warm-up */
    double small = round_trip(buf, 8, 2000, rank);
    double big = round_trip(buf, large, 20, rank);
    if (rank == 0) {
        printf("latency_us %.2f\n", small / 2 * 1e6);
        printf("bandwidth_MBps %.1f\n", 2.0 * large / big / 1e6);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
