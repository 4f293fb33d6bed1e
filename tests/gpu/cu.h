/* SPDX-License-Identifier: MIT */
/* The CUDA driver entry points the GPU tests call themselves, taken with dlopen so that a test
 * built on a machine without a GPU runs there and skips (exit 77) instead of failing to load. */
#ifndef GDR_TEST_CU_H
#define GDR_TEST_CU_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

#define CU_FUNCS(X)                                                                          \
	X(cuInit, (unsigned))                                                                \
	X(cuDeviceGet, (CUdevice *, int))                                                    \
	X(cuDeviceGetName, (char *, int, CUdevice))                                          \
	X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                 \
	X(cuCtxSetCurrent, (CUcontext))                                                      \
	X(cuCtxGetCurrent, (CUcontext *))                                                    \
	X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                            \
	X(cuMemFree_v2, (CUdeviceptr))                                                       \
	X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned))                              \
	X(cuMemAllocHost_v2, (void **, size_t))                                              \
	X(cuMemFreeHost, (void *))                                                           \
	X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
	X(cuMemAddressFree, (CUdeviceptr, size_t))                                           \
	X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,  \
			unsigned long long))                                                 \
	X(cuMemRelease, (CUmemGenericAllocationHandle))                                      \
	X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
	X(cuMemUnmap, (CUdeviceptr, size_t))                                                 \
	X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))            \
	X(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *,             \
					  CUmemAllocationGranularity_flags))                 \
	X(cuPointerGetAttribute, (void *, CUpointer_attribute, CUdeviceptr))                 \
	X(cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t))                              \
	X(cuMemGetHandleForAddressRange, (void *, CUdeviceptr, size_t, CUmemRangeHandleType,  \
					  unsigned long long))

#define CU_DECLARE(name, args) static CUresult(*p_##name) args;
CU_FUNCS(CU_DECLARE)

/* 0 with a current context on GPU 0, or 77 (skip) with the reason printed. */
static int cu_setup(char *gpu_name, int len)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	CUdevice dev;
	CUcontext ctx;

	if (!h) {
		printf("SKIP: no CUDA driver (%s)\n", dlerror());
		return 77;
	}
#define CU_RESOLVE(name, args)                                                               \
	if (!(*(void **)&p_##name = dlsym(h, #name))) {                                     \
		printf("SKIP: libcuda lacks %s\n", #name);                                   \
		return 77;                                                                   \
	}
	CU_FUNCS(CU_RESOLVE)
	if (p_cuInit(0) || p_cuDeviceGet(&dev, 0)) {
		printf("SKIP: no usable GPU (cuInit/cuDeviceGet failed)\n");
		return 77;
	}
	p_cuDeviceGetName(gpu_name, len, dev);
	if (p_cuDevicePrimaryCtxRetain(&ctx, dev) || p_cuCtxSetCurrent(ctx)) {
		printf("SKIP: cannot make a context on GPU 0\n");
		return 77;
	}
	return 0;
}

#endif
