// mpipingpong: a ping-pong of one-byte messages between MPI ranks 0 and 1, every byte checked,
// then an allreduce over every rank; prints the round trips, the one-way time and the sum.
// Usage: mpirun -np N mpipingpong ITERATIONS
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	int iters = argc > 1 ? atoi(argv[1]) : 10000;
	char buf[64];
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters; i++) {
		if (rank > 1) {
			break; /* ranks past 1 take part in the allreduce only */
		} else if (rank == 0) {
			memset(buf, i & 0xff, 1);
			MPI_Send(buf, 1, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, 1, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			if ((unsigned char)buf[0] != ((i + 1) & 0xff)) { fprintf(stderr, "bad data at %d\n", i); MPI_Abort(MPI_COMM_WORLD, 1); }
		} else {
			MPI_Recv(buf, 1, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			buf[0]++;
			MPI_Send(buf, 1, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
		}
	}
	double t = MPI_Wtime() - t0;
	int sum = rank + 1, tot = 0;
	MPI_Allreduce(&sum, &tot, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	int size; MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (rank == 0) printf("ok %d round trips, %.2f us one-way, allreduce %d of %d\n", iters, t / iters / 2 * 1e6, tot, size * (size + 1) / 2);
	MPI_Finalize();
	return 0;
}
