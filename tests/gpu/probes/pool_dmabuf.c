/* SPDX-License-Identifier: MIT */
/*
 * Probe (not a test): what the driver reports for stream-ordered pool memory (cuMemAllocAsync), and
 * which ranges of it it exports as a dma-buf. Prints facts for docs/FACTS.md, "Pool memory";
 * exits 77 without a GPU. Build on the GPU machine: gcc -I$CUDA_HOME/include pool_dmabuf.c -lcuda
 */
#include <cuda.h>
#include <stdio.h>
#include <unistd.h>

static void try_export(const char *what, CUdeviceptr p, size_t len)
{
	int fd = -1;
	CUresult rc = cuMemGetHandleForAddressRange(&fd, p, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);

	printf("  export %-34s [%#llx, +%#zx): %s (%d)\n", what, (unsigned long long)p, len,
	       rc == CUDA_SUCCESS ? "ok" : "FAILED", (int)rc);
	if (fd >= 0)
		close(fd);
}

static void report(const char *name, CUdeviceptr p, size_t size)
{
	CUdeviceptr rs = 0, base = 0;
	size_t rsz = 0, asz = 0;
	unsigned long long id = 0;
	CUmemoryPool pool = 0;
	CUdeviceptr a64 = p & ~(CUdeviceptr)0xffff, a2m = p & ~(CUdeviceptr)0x1fffff;

	cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
	cuPointerGetAttribute(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
	cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
	cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p);
	cuMemGetAddressRange(&base, &asz, p);
	printf("%s: ptr %#llx size %#zx | RANGE [%#llx, +%#zx) | cuMemGetAddressRange [%#llx, +%#zx) | "
	       "buffer id %llu | mempool %p\n", name, (unsigned long long)p, size,
	       (unsigned long long)rs, rsz, (unsigned long long)base, asz, id, (void *)pool);
	try_export("exact allocation", p, size);
	try_export("64 KiB-aligned cover", a64, ((p + size + 0xffff) & ~(CUdeviceptr)0xffff) - a64);
	try_export("2 MiB-aligned cover", a2m, ((p + size + 0x1fffff) & ~(CUdeviceptr)0x1fffff) - a2m);
	if (rsz)
		try_export("reported range", rs, rsz);
}

int main(void)
{
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p[3], q;
	int n = 0;

	if (cuInit(0) || cuDeviceGetCount(&n) || !n) {
		printf("no GPU\n");
		return 77;
	}
	cuDeviceGet(&dev, 0);
	cuDevicePrimaryCtxRetain(&ctx, dev);
	cuCtxSetCurrent(ctx);
	cuMemAllocAsync(&p[0], 1 << 20, 0);
	cuMemAllocAsync(&p[1], 4 << 20, 0);
	cuMemAllocAsync(&p[2], 64 << 10, 0);
	cuStreamSynchronize(0);
	report("pool 1 MiB", p[0], 1 << 20);
	report("pool 4 MiB", p[1], 4 << 20);
	report("pool 64 KiB", p[2], 64 << 10);
	cuMemAlloc(&q, 1 << 20);
	report("cuMemAlloc 1 MiB", q, 1 << 20);
	cuMemFreeAsync(p[0], 0);
	cuStreamSynchronize(0);
	cuMemAllocAsync(&p[0], 1 << 20, 0);
	cuStreamSynchronize(0);
	report("pool 1 MiB again", p[0], 1 << 20);
	return 0;
}
