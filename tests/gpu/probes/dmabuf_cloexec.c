/* SPDX-License-Identifier: MIT */
/*
 * Probe (GPU machine): whether the dma-buf fd cuMemGetHandleForAddressRange hands out is
 * close-on-exec (the dmabuf backend keeps one per pin: one inherited across exec would keep freed
 * GPU memory allocated in the child). Build: cc -O2 -o dmabuf_cloexec dmabuf_cloexec.c
 * -I<cuda>/include -lcuda. Prints one line; exit 0, or 77 where the GPU exports no dma-buf.
 */
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(void)
{
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p;
	int fd = -1, ok = 0, flags;
	size_t size = 2 << 20;

	if (cuInit(0) || cuDeviceGet(&dev, 0) ||
	    cuDeviceGetAttribute(&ok, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) || !ok) {
		printf("no dma-buf export\n");
		return 77;
	}
	if (cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) || cuMemAlloc(&p, size) ||
	    cuMemGetHandleForAddressRange(&fd, p, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)) {
		printf("export failed\n");
		return 1;
	}
	flags = fcntl(fd, F_GETFD);
	printf("dma-buf fd %d: F_GETFD %#x, close-on-exec %s\n", fd, flags,
	       flags >= 0 && (flags & FD_CLOEXEC) ? "yes" : "no");
	close(fd);
	cuMemFree(p);
	return 0;
}
