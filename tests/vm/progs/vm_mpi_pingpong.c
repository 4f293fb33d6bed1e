/* SPDX-License-Identifier: MIT */
/*
 * vm_mpi_pingpong: a small MPI latency and bandwidth test for the VM (two ranks). Rank 0 sends,
 * rank 1 echoes; every payload is checked. Prints one line per test with the message count, which
 * the case compares with and without LD_PRELOAD=libgdrcache-preload.so, and the figures.
 * Usage: vm_mpi_pingpong [iterations]   Exit status: 0 every payload right, 1 otherwise.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int run(int rank, size_t size, int iters, double *secs)
{
	uint32_t *buf = malloc(size), *want = malloc(size);
	int wrong = 0;
	double t0;

	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int it = 0; it < iters; it++) {
		for (size_t i = 0; i < size / 4; i++)
			want[i] = (uint32_t)it * 2654435761u + (uint32_t)i + (uint32_t)size;
		if (rank == 0) {
			memcpy(buf, want, size);
			MPI_Send(buf, (int)size, MPI_BYTE, 1, it, MPI_COMM_WORLD);
			memset(buf, 0, size);
			MPI_Recv(buf, (int)size, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			memset(buf, 0, size);
			MPI_Recv(buf, (int)size, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			wrong += memcmp(buf, want, size) != 0;
			MPI_Send(buf, (int)size, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			continue;
		}
		wrong += memcmp(buf, want, size) != 0;
	}
	*secs = MPI_Wtime() - t0;
	free(buf);
	free(want);
	return wrong;
}

int main(int argc, char **argv)
{
	int rank, nranks, iters = argc > 1 ? atoi(argv[1]) : 200, wrong = 0, all;
	static const size_t sizes[] = { 8, 65536, 1 << 20 };

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks != 2) {
		if (!rank)
			fprintf(stderr, "vm_mpi_pingpong: needs exactly 2 ranks\n");
		MPI_Finalize();
		return 2;
	}
	for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		double secs;
		int n = sizes[s] >= (1 << 20) ? iters / 10 + 1 : iters;
		int w = run(rank, sizes[s], n, &secs);

		wrong += w;
		MPI_Allreduce(&w, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		if (!rank)
			printf("vm_mpi_pingpong: %zu bytes, %d round trips, %d payloads wrong; "
			       "%.1f us half round trip, %.1f MB/s\n", sizes[s], n, all,
			       secs / n / 2 * 1e6, 2.0 * n * sizes[s] / secs / 1e6);
	}
	MPI_Allreduce(&wrong, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Finalize();
	return all ? 1 : 0;
}
