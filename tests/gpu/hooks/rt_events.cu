// SPDX-License-Identifier: MIT
// Proof on a real GPU that libgdrcache sees every free a CUDA runtime program makes (lib/intercept/hooks.c):
// cudaMalloc/cudaFree, cudaMallocAsync/cudaFreeAsync, cudaMallocHost/cudaFreeHost, cudaDeviceReset.
// Run with libgdrcache.so linked or LD_PRELOADed; built with static or shared cudart (run.sh).
// Prints "frees N seen M" per kind; exit 0 only if every free was seen; 77 without a GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

static uint64_t (*ev_head)(void);
static int (*ev_get)(uint64_t, uint64_t *, uint64_t *);
static int (*ev_probe)(const char **);

// Events published at or after seq for [start, len).
static int seen(uint64_t seq, uint64_t start, uint64_t len)
{
	uint64_t s, l;
	int n = 0;

	for (uint64_t head = ev_head(); seq < head; seq++) {
		int rc;

		while ((rc = ev_get(seq, &s, &l)) == -11)
			;
		n += rc == 0 && s == start && l == len;
	}
	return n;
}

int main(int argc, char **argv)
{
	const char *tag = argc > 1 ? argv[1] : "?", *why = "";
	int ndev = 0, bad = 0, frees, hits;
	cudaStream_t st;

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("%s: no GPU: skip\n", tag);
		return 77;
	}
	ev_head = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "gdr_private_events_head");
	ev_get = (int (*)(uint64_t, uint64_t *, uint64_t *))dlsym(RTLD_DEFAULT, "gdr_private_events_get");
	ev_probe = (int (*)(const char **))dlsym(RTLD_DEFAULT, "gdr_private_events_probe");
	if (!ev_head || !ev_get || !ev_probe) {
		printf("%s: libgdrcache not loaded\n", tag);
		return 1;
	}
	int prc = ev_probe(&why);

	printf("%s: probe %d (%s)\n", tag, prc, why);
	bad |= prc != 0;

	frees = hits = 0;
	for (int i = 0; i < 100; i++) {
		void *p;
		size_t sz = (size_t)4096 << (i % 12); // 4 KiB .. 8 MiB: sub-allocated and own chunks

		if (cudaMalloc(&p, sz) != cudaSuccess)
			return 1;
		uint64_t seq = ev_head();

		cudaFree(p);
		frees++;
		hits += seen(seq, (uintptr_t)p, 0) == 1;
	}
	printf("%s: cudaFree frees %d seen %d\n", tag, frees, hits);
	bad |= hits != frees;

	cudaStreamCreate(&st);
	frees = hits = 0;
	for (int i = 0; i < 100; i++) {
		void *p;

		if (cudaMallocAsync(&p, (size_t)1 << 20, st) != cudaSuccess)
			return 1;
		uint64_t seq = ev_head();

		cudaFreeAsync(p, st);
		frees++;
		hits += seen(seq, (uintptr_t)p, 0) == 1;
	}
	cudaStreamSynchronize(st);
	printf("%s: cudaFreeAsync frees %d seen %d\n", tag, frees, hits);
	bad |= hits != frees;

	// the per-thread default stream: cudaFreeAsync(p, cudaStreamPerThread) -> cuMemFreeAsync_ptsz
	frees = hits = 0;
	for (int i = 0; i < 20; i++) {
		void *p;

		if (cudaMallocAsync(&p, (size_t)1 << 20, cudaStreamPerThread) != cudaSuccess)
			return 1;
		uint64_t seq = ev_head();

		cudaFreeAsync(p, cudaStreamPerThread);
		frees++;
		hits += seen(seq, (uintptr_t)p, 0) == 1;
	}
	cudaStreamSynchronize(cudaStreamPerThread);
	printf("%s: cudaFreeAsync(per-thread stream) frees %d seen %d\n", tag, frees, hits);
	bad |= hits != frees;

	frees = hits = 0;
	for (int i = 0; i < 10; i++) {
		void *p;

		if (cudaMallocHost(&p, 65536) != cudaSuccess)
			return 1;
		uint64_t seq = ev_head();

		cudaFreeHost(p);
		frees++;
		hits += seen(seq, (uintptr_t)p, 0) == 1;
	}
	printf("%s: cudaFreeHost frees %d seen %d\n", tag, frees, hits);
	bad |= hits != frees;

	uint64_t seq = ev_head();

	cudaDeviceReset();
	hits = seen(seq, 0, UINT64_MAX);
	printf("%s: cudaDeviceReset 1, context-wide events seen %d\n", tag, hits);
	bad |= hits < 1;
	printf("%s: %s\n", tag, bad ? "FAIL" : "ok");
	return bad;
}
