/* SPDX-License-Identifier: MIT */
/*
 * Probe (not a test): what cuMemFreeAsync does before the stream reaches it (issue 31 #4). A
 * stream is held back by a host function that waits for the probe; meanwhile the memory freed on
 * it is asked for its BUFFER_ID and RANGE, exported as a dma-buf, and allocations on the same
 * stream, on another stream and synchronously are made and their addresses compared. Prints facts
 * for docs/FACTS.md, "Pool memory"; exits 77 without a GPU.
 * Build on the GPU machine: gcc -I$CUDA_HOME/include free_async.c -lcuda -lpthread
 */
#include <cuda.h>
#include <stdio.h>
#include <unistd.h>

static volatile int release_stream;

static void CUDA_CB hold(void *arg)
{
	(void)arg;
	for (int i = 0; i < 5000 && !release_stream; i++)
		usleep(1000); /* at most 5 s */
}

static void ask(const char *when, CUdeviceptr p)
{
	unsigned long long id = 0;
	CUdeviceptr rs = 0;
	size_t rsz = 0;
	CUresult r1 = cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
	CUresult r2 = cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
	CUresult r3 = cuPointerGetAttribute(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
	int fd = -1;
	CUresult r4 = cuMemGetHandleForAddressRange(&fd, p & ~0x1fffffULL, 2 << 20,
						    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);

	printf("  %-44s BUFFER_ID rc %d id %llu; RANGE rc %d/%d [%#llx +%#zx); export of its 2 MiB rc %d\n",
	       when, r1, id, r2, r3, (unsigned long long)rs, rsz, r4);
	if (fd >= 0)
		close(fd);
}

int main(void)
{
	CUdevice dev;
	CUcontext ctx;
	CUstream s, s2;
	CUdeviceptr p = 0, q = 0, q2 = 0, q3 = 0;
	const size_t n = 1 << 20;
	int count = 0;

	if (cuInit(0) || cuDeviceGetCount(&count) || !count) {
		printf("no GPU\n");
		return 77;
	}
	cuDeviceGet(&dev, 0);
	cuDevicePrimaryCtxRetain(&ctx, dev);
	cuCtxSetCurrent(ctx);
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING);
	for (int round = 0; round < 2; round++) {
		release_stream = 0;
		cuMemAllocAsync(&p, n, s);
		cuStreamSynchronize(s);
		printf("round %d: p = %#llx (1 MiB from the default pool)\n", round,
		       (unsigned long long)p);
		ask("allocated, stream idle", p);
		cuLaunchHostFunc(s, hold, NULL);
		printf("  cuMemFreeAsync(p, s) with s held back: rc %d\n", cuMemFreeAsync(p, s));
		ask("after cuMemFreeAsync, before the stream", p);
		if (round == 0) {
			cuMemAllocAsync(&q, n, s);
			printf("  cuMemAllocAsync(s) then: %#llx (%s p)\n", (unsigned long long)q,
			       q == p ? "same VA as" : "not");
			ask("p after that allocation on s", p);
		} else {
			cuMemAllocAsync(&q2, n, s2);
			cuMemAlloc(&q3, n);
			printf("  cuMemAllocAsync(s2): %#llx (%s p); cuMemAlloc: %#llx\n",
			       (unsigned long long)q2, q2 == p ? "same VA as" : "not",
			       (unsigned long long)q3);
		}
		release_stream = 1;
		cuStreamSynchronize(s);
		ask("after the stream reached the free", p);
		if (q)
			cuMemFreeAsync(q, s), q = 0;
		if (q2)
			cuMemFreeAsync(q2, s2), q2 = 0;
		if (q3)
			cuMemFree(q3), q3 = 0;
		cuStreamSynchronize(s);
		cuStreamSynchronize(s2);
	}
	return 0;
}
