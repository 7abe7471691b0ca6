// mpipingpong: ping-pongs between MPI ranks 0 and 1 at each size from MINSIZE to MAXSIZE
// (multiplying by 4), every byte checked on both sides, then an allreduce over every rank of a
// vector whose every element is checked. ITERATIONS round trips are made at sizes up to 4 KiB,
// and fewer above (ITERATIONS * 4 KiB / size, at least 10). Rank 0 prints a line per size and
// one for the allreduce; the exit status is non-zero when any byte or element came wrong.
// Usage: mpirun -np N mpipingpong ITERATIONS MINSIZE [MAXSIZE]
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long check(const unsigned char *buf, long size, int want) {
	long bad = 0;
	for (long j = 0; j < size; j++)
		bad += buf[j] != (unsigned char)(want + j);
	return bad;
}

static void fill(unsigned char *buf, long size, int v) {
	for (long j = 0; j < size; j++)
		buf[j] = (unsigned char)(v + j);
}

// pingpong makes iters round trips of size bytes between ranks 0 and 1 and returns the bytes
// that came wrong on this rank; *secs is the time rank 0 took.
static long pingpong(unsigned char *buf, long size, long iters, int rank, double *secs) {
	long bad = 0;
	double t0 = MPI_Wtime();
	for (long i = 0; i < iters; i++) {
		if (rank == 0) {
			fill(buf, size, (int)i);
			MPI_Send(buf, (int)size, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, (int)size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad += check(buf, size, (int)i + 1);
		} else if (rank == 1) {
			MPI_Recv(buf, (int)size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad += check(buf, size, (int)i);
			fill(buf, size, (int)i + 1);
			MPI_Send(buf, (int)size, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
		}
	}
	*secs = MPI_Wtime() - t0;
	return bad;
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, ranks;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &ranks);
	long iters = argc > 1 ? atol(argv[1]) : 1000;
	long minsize = argc > 2 ? atol(argv[2]) : 1;
	long maxsize = argc > 3 ? atol(argv[3]) : minsize;
	unsigned char *buf = malloc(maxsize > 0 ? maxsize : 1);
	int failed = 0;
	for (long size = minsize; size <= maxsize; size = size > 0 ? size * 4 : 1) {
		long n = size <= 4096 ? iters : iters * 4096 / size;
		if (n < 10)
			n = 10;
		double secs;
		long bad = pingpong(buf, size, n, rank, &secs), allbad = 0;
		MPI_Allreduce(&bad, &allbad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		failed |= allbad != 0;
		if (rank == 0)
			printf("%s %ld round trips of %ld B, %.2f us one-way, %ld bad bytes\n", allbad ? "BAD" : "ok", n,
			       size, secs / n / 2 * 1e6, allbad);
	}

	// Every rank adds rank + j to element j: the sum is ranks*(ranks-1)/2 + ranks*j.
	enum { elems = 1 << 18 };
	int *in = malloc(elems * sizeof(int)), *out = malloc(elems * sizeof(int));
	for (int j = 0; j < elems; j++)
		in[j] = rank + j;
	MPI_Allreduce(in, out, elems, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	long bad = 0, allbad = 0;
	for (int j = 0; j < elems; j++)
		bad += out[j] != ranks * (ranks - 1) / 2 + ranks * j;
	MPI_Allreduce(&bad, &allbad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	failed |= allbad != 0;
	if (rank == 0)
		printf("%s allreduce of %d ints over %d ranks, %ld bad\n", allbad ? "BAD" : "ok", elems, ranks, allbad);
	free(in);
	free(out);
	free(buf);
	MPI_Finalize();
	return failed;
}
