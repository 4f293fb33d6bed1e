/* SPDX-License-Identifier: MIT */
/*
 * The few CUDA driver API types and constants libgdrcache uses, declared here so that the library
 * builds without cuda.h and loads libcuda.so.1 only at run time. Values are cuda.h's (CUDA 13.0);
 * tests/gpu/test_cuda_abi.c checks every one of them against the real cuda.h on a GPU machine.
 */
#ifndef GDR_CUDA_ABI_H
#define GDR_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int gdr_CUresult;
typedef unsigned long long gdr_CUdeviceptr;
typedef int gdr_CUdevice;
typedef struct gdr_CUctx_st *gdr_CUcontext;

enum {
	GDR_CUDA_SUCCESS = 0,
	GDR_CUDA_ERROR_INVALID_VALUE = 1,
	GDR_CUDA_ERROR_OUT_OF_MEMORY = 2,
	GDR_CUDA_ERROR_NOT_INITIALIZED = 3,
	GDR_CUDA_ERROR_DEINITIALIZED = 4,
	GDR_CUDA_ERROR_NO_DEVICE = 100,
	GDR_CUDA_ERROR_INVALID_DEVICE = 101,
	GDR_CUDA_ERROR_INVALID_CONTEXT = 201,
	GDR_CUDA_ERROR_NOT_FOUND = 500,
	GDR_CUDA_ERROR_NOT_PERMITTED = 800,
	GDR_CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* CUpointer_attribute */
enum {
	GDR_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	GDR_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,       /* unsigned int (CUmemorytype) */
	GDR_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,       /* set: unsigned int 1 */
	GDR_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,         /* unsigned long long */
	GDR_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,        /* bool */
	GDR_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,    /* int */
	GDR_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11, /* CUdeviceptr */
	GDR_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,       /* size_t */
	GDR_CU_POINTER_ATTRIBUTE_MAPPED = 13,           /* bool */
	GDR_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,   /* CUmemoryPool: non-NULL for pool memory */
	GDR_CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,     /* size_t (CUDA 12.x) */
	GDR_CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19, /* CUdeviceptr (CUDA 12.x) */
};

/* CUmemorytype */
enum {
	GDR_CU_MEMORYTYPE_HOST = 1,
	GDR_CU_MEMORYTYPE_DEVICE = 2,
	GDR_CU_MEMORYTYPE_ARRAY = 3,
	GDR_CU_MEMORYTYPE_UNIFIED = 4,
};

/* CUctx_flags */
#define GDR_CU_CTX_SYNC_MEMOPS 0x80u

/* CUmemRangeHandleType */
#define GDR_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 0x1

/* CUdevice_attribute */
enum {
	GDR_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	GDR_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
	GDR_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
};

/* cuGetProcAddress flags (CUdriverProcAddress_flags) */
#define GDR_CU_GET_PROC_ADDRESS_DEFAULT 0

/* The driver entry points the library resolves, with cuda.h's prototypes. */
typedef gdr_CUresult (*gdr_cuGetProcAddress_v2_t)(const char *symbol, void **pfn, int cudaVersion,
						  uint64_t flags, int *symbolStatus);
typedef gdr_CUresult (*gdr_cuGetProcAddress_v1_t)(const char *symbol, void **pfn, int cudaVersion,
						  uint64_t flags);
typedef gdr_CUresult (*gdr_cuInit_t)(unsigned int flags);
typedef gdr_CUresult (*gdr_cuDriverGetVersion_t)(int *version);
typedef gdr_CUresult (*gdr_cuPointerGetAttribute_t)(void *data, int attribute, gdr_CUdeviceptr ptr);
typedef gdr_CUresult (*gdr_cuPointerGetAttributes_t)(unsigned int n, int *attributes, void **data,
						     gdr_CUdeviceptr ptr);
typedef gdr_CUresult (*gdr_cuPointerSetAttribute_t)(const void *value, int attribute,
						    gdr_CUdeviceptr ptr);
typedef gdr_CUresult (*gdr_cuCtxGetCurrent_t)(gdr_CUcontext *ctx);
typedef gdr_CUresult (*gdr_cuCtxSetCurrent_t)(gdr_CUcontext ctx);
typedef gdr_CUresult (*gdr_cuDevicePrimaryCtxRetain_t)(gdr_CUcontext *ctx, gdr_CUdevice dev);
typedef gdr_CUresult (*gdr_cuDeviceGet_t)(gdr_CUdevice *dev, int ordinal);
typedef gdr_CUresult (*gdr_cuDeviceGetCount_t)(int *count);
typedef gdr_CUresult (*gdr_cuDevicePrimaryCtxRelease_t)(gdr_CUdevice dev);
typedef gdr_CUresult (*gdr_cuDevicePrimaryCtxGetState_t)(gdr_CUdevice dev, unsigned int *flags,
							 int *active);
typedef gdr_CUresult (*gdr_cuCtxGetDevice_t)(gdr_CUdevice *dev);
typedef gdr_CUresult (*gdr_cuCtxPushCurrent_t)(gdr_CUcontext ctx);
typedef gdr_CUresult (*gdr_cuCtxPopCurrent_t)(gdr_CUcontext *ctx);
typedef gdr_CUresult (*gdr_cuCtxGetFlags_t)(unsigned int *flags);
typedef gdr_CUresult (*gdr_cuCtxSetFlags_t)(unsigned int flags);
typedef gdr_CUresult (*gdr_cuDeviceGetAttribute_t)(int *value, int attribute, gdr_CUdevice dev);
typedef gdr_CUresult (*gdr_cuMemGetHandleForAddressRange_t)(void *handle, gdr_CUdeviceptr dptr,
							    size_t size, int handleType,
							    unsigned long long flags);
typedef gdr_CUresult (*gdr_cuGetErrorName_t)(gdr_CUresult error, const char **str);

/* The CUDA version the library asks cuGetProcAddress for: 12.1, the first with cuCtxSetFlags (a
 * driver does not return a symbol newer than the version asked for). None of the entry points used
 * changed its prototype between 12.1 and 13.0. */
#define GDR_CUDA_API_VERSION 12010
/* The oldest CUDA driver the library runs on: 11.3, the first with cuGetProcAddress. */
#define GDR_CUDA_MIN_DRIVER 11030

#endif /* GDR_CUDA_ABI_H */
