// An MPI ping-pong of 1000 round trips of 4 KiB between ranks 0 and 1, every byte checked: the
// exit status is non-zero when any byte came wrong (TestOpenMPI).
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	char buf[4096];
	int bad = 0;
	double t0 = MPI_Wtime();
	for (int i = 0; i < 1000; i++) {
		if (rank == 0) {
			memset(buf, i & 0xff, sizeof buf);
			MPI_Send(buf, sizeof buf, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, sizeof buf, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (int j = 0; j < (int)sizeof buf; j++) if ((unsigned char)buf[j] != ((i + 1) & 0xff)) bad++;
		} else {
			MPI_Recv(buf, sizeof buf, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (int j = 0; j < (int)sizeof buf; j++) if ((unsigned char)buf[j] != (i & 0xff)) bad++;
			memset(buf, (i + 1) & 0xff, sizeof buf);
			MPI_Send(buf, sizeof buf, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
		}
	}
	double t = MPI_Wtime() - t0;
	printf("rank %d: %d bad bytes, %.1f us per round trip\n", rank, bad, t / 1000 * 1e6);
	MPI_Finalize();
	return bad != 0;
}
