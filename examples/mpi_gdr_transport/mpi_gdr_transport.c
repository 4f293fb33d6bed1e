/* SPDX-License-Identifier: MIT */
/*
 * mpi_gdr_transport: an MPI program whose data path is libgdr_transport (gdr_transport.h): every
 * rank RDMA-writes a GPU buffer into its right neighbour's GPU buffer, registering both around every
 * message through libgdrcache, with MPI carrying only keys and barriers. The receiver verifies
 * every payload; every -r messages both buffers are freed and reallocated (at the same address, as
 * CUDA does), and every registration's buffer id is compared with the driver's (0 stale).
 * GPU memory comes from the CUDA driver API (dlopen of libcuda.so.1; the fake driver in the VM).
 *
 * Usage: mpirun -np N mpi_gdr_transport [-d device] [-g gid_index] [-n messages] [-s size] [-r N]
 *                                        [-u]
 * -u: without the cache (GT_NO_CACHE: ibv_reg_mr/ibv_dereg_mr around every message), to compare.
 * Exit status: 0 every payload right and no stale registration, 1 otherwise, 2 setup failed,
 * 77 no CUDA driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdr_transport.h"

typedef unsigned long long CUdeviceptr;
static int (*cuInit)(unsigned);
static int (*cuDeviceGet)(int *, int);
static int (*cuDevicePrimaryCtxRetain)(void **, int);
static int (*cuCtxSetCurrent)(void *);
static int (*cuMemAlloc)(CUdeviceptr *, size_t);
static int (*cuMemFree)(CUdeviceptr);
static int (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static int (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);

static int load_cuda(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	void *cuctx;
	int dev;

	if (!h)
		return -1;
#define SYM(f, n) (*(void **)&f = dlsym(h, n))
	if (!SYM(cuInit, "cuInit") || !SYM(cuDeviceGet, "cuDeviceGet") ||
	    !SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
	    !SYM(cuCtxSetCurrent, "cuCtxSetCurrent") || !SYM(cuMemAlloc, "cuMemAlloc_v2") ||
	    !SYM(cuMemFree, "cuMemFree_v2") || !SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2") ||
	    !SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2"))
		return -1;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&cuctx, dev) ||
	    cuCtxSetCurrent(cuctx))
		return -1;
	return 0;
}

static uint32_t word(int sender, int m, size_t i)
{
	return (uint32_t)sender * 0x9e3779b9u + (uint32_t)m * 2654435761u + (uint32_t)i;
}

int main(int argc, char **argv)
{
	const char *dev = NULL;
	int gid = 1, messages = 1000, every = 100, opt, rank, n, setup, all_setup;
	unsigned flags = 0;
	size_t size = 65536;
	/* enum gdr_validate's names (libgdrcache is the transport's: this file has no gdrcache.h) */
	static const char *const modes[] = { "auto", "tag", "events" };

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	while ((opt = getopt(argc, argv, "d:g:n:s:r:u")) != -1) {
		switch (opt) {
		case 'd': dev = optarg; break;
		case 'g': gid = atoi(optarg); break;
		case 'n': messages = atoi(optarg); break;
		case 's': size = strtoull(optarg, NULL, 0) & ~(size_t)3; break;
		case 'r': every = atoi(optarg); break;
		case 'u': flags |= GT_NO_CACHE; break;
		default: MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	setup = load_cuda() ? 77 : 0;
	MPI_Allreduce(&setup, &all_setup, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (all_setup) {
		if (!rank)
			printf("mpi_gdr_transport: no CUDA driver or GPU: skipped\n");
		MPI_Finalize();
		return 77;
	}
	if (n < 2) {
		if (!rank)
			fprintf(stderr, "mpi_gdr_transport: needs at least 2 ranks\n");
		MPI_Finalize();
		return 2;
	}
	struct gt_ctx *ctx = gt_open(MPI_COMM_WORLD, dev, gid, flags);
	if (!ctx) {
		MPI_Finalize();
		return 2;
	}
	int right = (rank + 1) % n, left = (rank + n - 1) % n, wrong = 0, same_va = 0, reallocs = 0;
	uint32_t *host = malloc(size), *check = malloc(size);
	CUdeviceptr src, dst;
	double t0;

	if (cuMemAlloc(&src, size) || cuMemAlloc(&dst, size))
		MPI_Abort(MPI_COMM_WORLD, 2);
	t0 = MPI_Wtime();
	for (int m = 0; m < messages; m++) {
		struct gt_key mine, theirs;

		if (m && every && m % every == 0) {
			CUdeviceptr os = src, od = dst;

			cuMemFree(src);
			cuMemFree(dst);
			if (cuMemAlloc(&src, size) || cuMemAlloc(&dst, size))
				MPI_Abort(MPI_COMM_WORLD, 2);
			same_va += (src == os) + (dst == od);
			reallocs += 2;
		}
		for (size_t i = 0; i < size / 4; i++)
			host[i] = word(rank, m, i);
		cuMemcpyHtoD(src, host, size);
		cuMemcpyHtoD(dst, (memset(check, 0xee, size), check), size);
		/* MPI carries the key of the receiving buffer to the writer on its left. */
		if (gt_expose(ctx, (void *)dst, size, &mine))
			MPI_Abort(MPI_COMM_WORLD, 2);
		MPI_Sendrecv(&mine, sizeof(mine), MPI_BYTE, left, m, &theirs, sizeof(theirs), MPI_BYTE,
			     right, m, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		if (gt_write(ctx, right, (void *)src, size, &theirs, 0))
			MPI_Abort(MPI_COMM_WORLD, 2);
		/* Writes are complete at the targets once every writer has its completion. */
		MPI_Barrier(MPI_COMM_WORLD);
		gt_unexpose(ctx);
		cuMemcpyDtoH(check, dst, size);
		for (size_t i = 0; i < size / 4; i++)
			if (check[i] != word(left, m, i)) {
				wrong++;
				break;
			}
	}
	double secs = MPI_Wtime() - t0;
	struct gt_stats s;
	uint64_t v[5], tot[5];

	gt_get_stats(ctx, &s);
	v[0] = (uint64_t)wrong;
	v[1] = s.stale;
	v[2] = s.writes;
	v[3] = (uint64_t)same_va;
	v[4] = s.regs;
	MPI_Reduce(v, tot, 5, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
	if (flags & GT_NO_CACHE)
		printf("mpi_gdr_transport: rank %d: %" PRIu64 " writes, %d payloads wrong, %" PRIu64
		       " registrations, %" PRIu64 " stale; cache: off (ibv_reg_mr each time); %d of %d "
		       "reallocations at the same address\n", rank, s.writes, wrong, s.regs, s.stale,
		       same_va, reallocs);
	else
		printf("mpi_gdr_transport: rank %d: %" PRIu64 " writes, %d payloads wrong, %" PRIu64
		       " registrations, %" PRIu64 " stale; cache: mode %s, %" PRIu64 " hits, %" PRIu64
		       " misses, %" PRIu64 " stale entries dropped, %" PRIu64 " free events; %d of %d "
		       "reallocations at the same address\n", rank, s.writes, wrong, s.regs, s.stale,
		       s.validate_mode < 3 ? modes[s.validate_mode] : "?", s.hits, s.misses,
		       s.cache_stale, s.events, same_va, reallocs);
	fflush(stdout);
	MPI_Barrier(MPI_COMM_WORLD);
	if (!rank)
		printf("mpi_gdr_transport: %d ranks, %d messages of %zu bytes each, %" PRIu64
		       " payloads wrong, %" PRIu64 " stale registrations of %" PRIu64 ", %" PRIu64
		       " reallocations at the same address; %.0f messages/s per rank\n", n, messages,
		       size, tot[0], tot[1], tot[4], tot[3], messages / secs);
	cuMemFree(src);
	cuMemFree(dst);
	free(host);
	free(check);
	gt_close(ctx);
	MPI_Finalize();
	return (rank == 0 && (tot[0] || tot[1] || tot[2] != (uint64_t)messages * n)) ? 1 : 0;
}
