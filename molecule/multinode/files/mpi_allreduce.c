/* Test program: every rank reports where it runs, then the ranks sum
 * rank+1 with MPI_Allreduce; rank 0 prints the total, N*(N+1)/2. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, value, total;
    char host[MPI_MAX_PROCESSOR_NAME];
    int host_len;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &host_len);
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    value = rank + 1;
    MPI_Allreduce(&value, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("allreduce sum %d\n", total);
    MPI_Finalize();
    return 0;
}
