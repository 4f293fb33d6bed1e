/* SPDX-License-Identifier: MIT */
/*
 * What the parts of the fake CUDA driver's self-test share (fake_cuda_selftest*.c): the driver's
 * entry points as fake_cuda_selftest.c resolved them through cuGetProcAddress_v2, its constants,
 * the TAP check macros, and the helpers and cases each part defines.
 */
#ifndef FAKE_CUDA_SELFTEST_H
#define FAKE_CUDA_SELFTEST_H

#include <stdint.h>
#include <stdio.h>

#include "fake_cuda.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

typedef CUresult (*gpa2_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*gpa1_t)(const char *, void **, int, uint64_t);
typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*ver_t)(int *);
typedef CUresult (*pga_t)(void *, int, CUdeviceptr);
typedef CUresult (*pgas_t)(unsigned int, int *, void **, CUdeviceptr);
typedef CUresult (*psa_t)(const void *, int, CUdeviceptr);
typedef CUresult (*ctxget_t)(CUcontext *);
typedef CUresult (*ctxset_t)(CUcontext);
typedef CUresult (*getflags_t)(unsigned int *);
typedef CUresult (*setflags_t)(unsigned int);
typedef CUresult (*devattr_t)(int *, int, int);
typedef CUresult (*handle_t)(void *, CUdeviceptr, size_t, int, unsigned long long);
typedef CUresult (*errname_t)(CUresult, const char **);
typedef CUresult (*memalloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*memfree_t)(CUdeviceptr);
typedef CUresult (*addrrange_t)(CUdeviceptr *, size_t *, CUdeviceptr);

extern gpa2_t gpa2;
extern gpa1_t gpa1;
extern init_t p_cuInit;
extern ver_t p_cuDriverGetVersion;
extern pga_t p_cuPointerGetAttribute;
extern pgas_t p_cuPointerGetAttributes;
extern psa_t p_cuPointerSetAttribute;
extern ctxget_t p_cuCtxGetCurrent;
extern ctxset_t p_cuCtxSetCurrent;
extern getflags_t p_cuCtxGetFlags;
extern setflags_t p_cuCtxSetFlags;
extern devattr_t p_cuDeviceGetAttribute;
extern handle_t p_cuMemGetHandleForAddressRange;
extern errname_t p_cuGetErrorName;
extern memalloc_t p_cuMemAlloc;
extern memfree_t p_cuMemFree;
extern addrrange_t p_cuMemGetAddressRange;
extern void *g_handle; /* dlopen("libcuda.so.1") */

enum {
	SUCCESS = 0,
	INVALID_VALUE = 1,
	NOT_INITIALIZED = 3,
	INVALID_DEVICE = 101,
	INVALID_CONTEXT = 201,
	NOT_FOUND = 500,
	NOT_SUPPORTED = 801,
};
enum {
	A_CONTEXT = 1, A_MEMORY_TYPE = 2, A_HOST_POINTER = 4, A_SYNC_MEMOPS = 6, A_BUFFER_ID = 7,
	A_IS_MANAGED = 8, A_DEVICE_ORDINAL = 9, A_RANGE_START = 11, A_RANGE_SIZE = 12, A_MAPPED = 13,
	A_RDMA_CAPABLE = 15, A_MAPPING_SIZE = 18, A_MAPPING_BASE = 19,
};
#define MIB (1ull << 20)
#define POOL_CH FAKE_CUDA_POOL_CHUNK_SIZE
enum { A_MEMPOOL = 17, A_LEGACY_IPC = 10 };

extern int g_tests, g_failed;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		g_tests++;                                                                         \
		if (cond) {                                                                        \
			printf("ok %d - ", g_tests);                                               \
		} else {                                                                           \
			g_failed++;                                                                \
			printf("not ok %d - %s:%d: ", g_tests, __FILE__, __LINE__);                \
		}                                                                                  \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
	} while (0)

#define CHECK_EQ(a, b, what)                                                                       \
	do {                                                                                       \
		unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);     \
		CHECK(a_ == b_, "%s (got 0x%llx, want 0x%llx)", what, a_, b_);                     \
	} while (0)

/* Helpers (fake_cuda_selftest.c). */
uint64_t h2u(const void *p);
/* cuGetProcAddress_v2(name, version); exits the test if the name is not found. */
void *resolve(const char *name, int version);
unsigned long long bufid(CUdeviceptr p, CUresult *rc);
uint64_t attr_u64(int attr, CUdeviceptr p, CUresult *rc);
unsigned attr_u32(int attr, CUdeviceptr p);
/* Export [va, va + size) as a dma-buf; the fd goes to *fdp, or is closed when fdp is NULL. */
CUresult export_range(uint64_t va, uint64_t size, int *fdp);

/* The cases, in the order main runs them (the fake's state carries from one to the next). */
/* fake_cuda_selftest.c: how the driver is reached */
void test_proc_address(void);
void test_entries(void);
void test_init(void);
/* fake_cuda_selftest_mem.c: device memory (fake_cuda.c) */
void test_va_reuse(void);
void test_attributes(void);
void test_sync_memops(void);
void test_vmm(void);
void test_dmabuf(void);
/* fake_cuda_selftest_ctl.c: the control API, threads */
void test_faults_and_counters(void);
void test_threads_and_reset(void);
void test_stress(void);
/* fake_cuda_selftest_pool.c: stream-ordered pools (fake_cuda_pool.c) */
void test_pool(void);
/* fake_cuda_selftest_ctx.c: several devices, contexts (fake_cuda_ctx.c) */
void test_devices(void);
/* fake_cuda_selftest_ipc.c: memory from another process (fake_cuda_ipc.c) */
void test_ipc(void);
void test_vmm_shareable(void);

#endif /* FAKE_CUDA_SELFTEST_H */
