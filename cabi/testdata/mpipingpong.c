// mpipingpong: a ping-pong between MPI ranks 0 and 1 of ITERATIONS round trips of SIZE bytes,
// every byte checked on both sides, then an allreduce over every rank. Rank 0 prints the round
// trips, the one-way time and the allreduce's sum; the exit status is non-zero when any byte
// came wrong. Usage: mpirun -np N mpipingpong ITERATIONS SIZE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(const char *buf, int size, int want) {
	int bad = 0;
	for (int j = 0; j < size; j++)
		bad += (unsigned char)buf[j] != (want & 0xff);
	return bad;
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, ranks;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &ranks);
	int iters = argc > 1 ? atoi(argv[1]) : 10000;
	int size = argc > 2 ? atoi(argv[2]) : 1;
	char *buf = malloc(size > 0 ? size : 1);
	int bad = 0;
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters && rank < 2; i++) { /* ranks past 1 take part in the allreduce only */
		if (rank == 0) {
			memset(buf, i & 0xff, size);
			MPI_Send(buf, size, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, size, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad += check(buf, size, i + 1);
		} else {
			MPI_Recv(buf, size, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad += check(buf, size, i);
			memset(buf, (i + 1) & 0xff, size);
			MPI_Send(buf, size, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
		}
	}
	double t = MPI_Wtime() - t0;
	int one = rank + 1, sum = 0, allbad = 0;
	MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Allreduce(&bad, &allbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("%s %d round trips of %d B, %.2f us one-way, %d bad bytes, allreduce %d of %d\n",
		       allbad ? "BAD" : "ok", iters, size, t / iters / 2 * 1e6, allbad, sum, ranks * (ranks + 1) / 2);
	free(buf);
	MPI_Finalize();
	return allbad != 0;
}
