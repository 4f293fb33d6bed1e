/* SPDX-License-Identifier: MIT */
/*
 * Self-test of the fake CUDA driver: proves that it behaves as FACTS.md and the probes in
 * fake_cuda.c say the real driver does. Reaches the entry points the way libgdrcache does:
 * dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then cuGetProcAddress_v2 for the rest.
 * TAP output; exit 0 only if every check passes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static gpa2_t gpa2;
static gpa1_t gpa1;
static init_t p_cuInit;
static ver_t p_cuDriverGetVersion;
static pga_t p_cuPointerGetAttribute;
static pgas_t p_cuPointerGetAttributes;
static psa_t p_cuPointerSetAttribute;
static ctxget_t p_cuCtxGetCurrent;
static ctxset_t p_cuCtxSetCurrent;
static getflags_t p_cuCtxGetFlags;
static setflags_t p_cuCtxSetFlags;
static devattr_t p_cuDeviceGetAttribute;
static handle_t p_cuMemGetHandleForAddressRange;
static errname_t p_cuGetErrorName;
static memalloc_t p_cuMemAlloc;
static memfree_t p_cuMemFree;
static addrrange_t p_cuMemGetAddressRange;

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

static int g_tests, g_failed;

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

static uint64_t h2u(const void *p)
{
	return (uint64_t)(uintptr_t)p;
}

static void *resolve(const char *name, int version)
{
	void *fn = NULL;
	int status = -1;
	CUresult rc = gpa2(name, &fn, version, 0, &status);

	if (rc || status || !fn) {
		printf("# cannot resolve %s: rc %d status %d\n", name, rc, status);
		exit(1);
	}
	return fn;
}

static void *g_handle;

static void load(void)
{
	void *h = g_handle = dlopen("libcuda.so.1", RTLD_NOW);

	if (!h) {
		printf("Bail out! dlopen libcuda.so.1: %s\n", dlerror());
		exit(1);
	}
	gpa2 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
	gpa1 = (gpa1_t)dlsym(h, "cuGetProcAddress");
	if (!gpa2 || !gpa1) {
		printf("Bail out! no cuGetProcAddress_v2\n");
		exit(1);
	}
	p_cuInit = (init_t)resolve("cuInit", 12000);
	p_cuDriverGetVersion = (ver_t)resolve("cuDriverGetVersion", 12000);
	p_cuPointerGetAttribute = (pga_t)resolve("cuPointerGetAttribute", 12000);
	p_cuPointerGetAttributes = (pgas_t)resolve("cuPointerGetAttributes", 12000);
	p_cuPointerSetAttribute = (psa_t)resolve("cuPointerSetAttribute", 12000);
	p_cuCtxGetCurrent = (ctxget_t)resolve("cuCtxGetCurrent", 12000);
	p_cuCtxSetCurrent = (ctxset_t)resolve("cuCtxSetCurrent", 12000);
	p_cuCtxGetFlags = (getflags_t)resolve("cuCtxGetFlags", 12000);
	p_cuCtxSetFlags = (setflags_t)resolve("cuCtxSetFlags", 12010);
	p_cuDeviceGetAttribute = (devattr_t)resolve("cuDeviceGetAttribute", 12000);
	p_cuMemGetHandleForAddressRange = (handle_t)resolve("cuMemGetHandleForAddressRange", 12000);
	p_cuGetErrorName = (errname_t)resolve("cuGetErrorName", 12000);
	p_cuMemAlloc = (memalloc_t)resolve("cuMemAlloc", 12000);
	p_cuMemFree = (memfree_t)resolve("cuMemFree", 12000);
	p_cuMemGetAddressRange = (addrrange_t)resolve("cuMemGetAddressRange", 12000);
}

static unsigned long long bufid(CUdeviceptr p, CUresult *rc)
{
	unsigned long long id = 0;

	*rc = p_cuPointerGetAttribute(&id, A_BUFFER_ID, p);
	return id;
}

static void test_proc_address(void)
{
	void *fn = (void *)1;
	int status = -1;

	CHECK_EQ(gpa2("cuNoSuchFunction", &fn, 13000, 0, &status), SUCCESS,
		 "v2, unknown name: CUDA_SUCCESS (as measured)");
	CHECK(fn == NULL && status == 1, "v2, unknown name: NULL and SYMBOL_NOT_FOUND");
	fn = (void *)1;
	CHECK_EQ(gpa2("cuNoSuchFunction", &fn, 13000, 0, NULL), SUCCESS, "v2, NULL status");
	fn = (void *)1;
	gpa2("cuCtxSetFlags", &fn, 12000, 0, &status);
	CHECK(fn == NULL && status == 2, "cuCtxSetFlags asked for 12000: VERSION_NOT_SUFFICIENT");
	gpa2("cuCtxSetFlags", &fn, 12010, 0, &status);
	CHECK(fn != NULL && status == 0, "cuCtxSetFlags asked for 12010: found");
	gpa2("cuMemAlloc_v2", &fn, 13000, 0, &status);
	CHECK(fn == NULL && status == 1, "names with _v2 are not found");
	fn = (void *)1;
	CHECK_EQ(gpa2("cuInit", &fn, 13000, 7, &status), INVALID_VALUE, "flags 7: INVALID_VALUE");
	fn = (void *)1;
	CHECK_EQ(gpa1("cuNoSuchFunction", &fn, 13000, 0), NOT_FOUND, "v1, unknown: NOT_FOUND");
	CHECK(fn == (void *)1, "v1 leaves *pfn alone");
	CHECK_EQ(gpa1("cuPointerGetAttribute", &fn, 12000, 0), SUCCESS, "v1 finds a name");
	CHECK(fn == (void *)p_cuPointerGetAttribute, "v1 and v2 give the same function");

	fake_cuda_hide_symbol("cuCtxSetFlags");
	fn = (void *)1;
	gpa2("cuCtxSetFlags", &fn, 13000, 0, &status);
	CHECK(fn == NULL && status == 1, "hidden symbol: not found");
	fake_cuda_set_symbol_min_version("cuMemGetHandleForAddressRange", 14000);
	gpa2("cuMemGetHandleForAddressRange", &fn, 13000, 0, &status);
	CHECK(fn == NULL && status == 2, "min version override: VERSION_NOT_SUFFICIENT");
	fake_cuda_reset();
	gpa2("cuCtxSetFlags", &fn, 13000, 0, &status);
	CHECK(fn != NULL && status == 0, "reset unhides");
}

/* The free and allocation entries begin as libcuda 580.159.04's do (fake_entry_<arch>.S), and
 * cuGetProcAddress hands out those exported entries, as dlsym does (FACTS.md). */
static void test_entries(void)
{
	static const struct {
		const char *exported, *base;
		int version, flags;
	} e[] = {
		{ "cuMemFree_v2", "cuMemFree", 12000, 0 },
		{ "cuMemFreeAsync", "cuMemFreeAsync", 12000, 0 },
		{ "cuMemFreeAsync_ptsz", "cuMemFreeAsync", 12000, 2 },
		{ "cuMemFreeHost", "cuMemFreeHost", 12000, 0 },
		{ "cuMemUnmap", "cuMemUnmap", 12000, 0 },
		{ "cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 12000, 0 },
		{ "cuCtxDestroy", "cuCtxDestroy", 3000, 0 },
		{ "cuCtxDestroy_v2", "cuCtxDestroy", 12000, 0 },
		{ "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", 7000, 0 },
		{ "cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset", 12000, 0 },
		{ "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", 7000, 0 },
		{ "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", 12000, 0 },
		{ "cuMemAlloc_v2", "cuMemAlloc", 12000, 0 },
		{ "cuMemAllocAsync", "cuMemAllocAsync", 12000, 0 },
		{ "cuMemAllocAsync_ptsz", "cuMemAllocAsync", 12000, 2 },
		{ "cuMemAllocHost_v2", "cuMemAllocHost", 12000, 0 },
		{ "cuMemAllocManaged", "cuMemAllocManaged", 12000, 0 },
	};
#if defined(__x86_64__)
	static const unsigned char prologue[] = { 0x55, 0x48, 0x89, 0xe5, 0x41, 0x54,
						  0x48, 0x83, 0xec, 0x08, 0x81, 0x3d };
#elif defined(__aarch64__)
	static const unsigned char prologue[] = { 0xfd, 0x7b, 0xbf, 0xa9, 0xfd, 0x03, 0x00, 0x91 };
#endif

	for (size_t i = 0; i < sizeof(e) / sizeof(e[0]); i++) {
		void *sym = dlsym(g_handle, e[i].exported), *fn = NULL;
		int status = -1;

		gpa2(e[i].base, &fn, e[i].version, e[i].flags, &status);
		CHECK(sym && fn == sym, "cuGetProcAddress(%s, %d, %d) is dlsym's %s", e[i].base,
		      e[i].version, e[i].flags, e[i].exported);
#if defined(__x86_64__) || defined(__aarch64__)
		CHECK(sym && !memcmp(sym, prologue, sizeof(prologue)), "%s begins as libcuda's",
		      e[i].exported);
#endif
	}
}

static void test_init(void)
{
	CUresult rc;
	int v = 0;
	uint64_t d = fake_cuda_alloc(4096);

	CHECK(!fake_cuda_initialized(), "not initialised at start");
	bufid(d, &rc);
	CHECK_EQ(rc, NOT_INITIALIZED, "query before cuInit: NOT_INITIALIZED");
	CHECK_EQ(p_cuDriverGetVersion(&v), SUCCESS, "cuDriverGetVersion before cuInit");
	CHECK_EQ(v, 13000, "driver version");
	fake_cuda_set_init_error(100);
	CHECK_EQ(p_cuInit(0), 100, "injected cuInit error");
	CHECK(!fake_cuda_initialized(), "still not initialised");
	fake_cuda_set_init_error(0);
	CHECK_EQ(p_cuInit(1), INVALID_VALUE, "cuInit(1): INVALID_VALUE");
	CHECK_EQ(p_cuInit(0), SUCCESS, "cuInit");
	CHECK(bufid(d, &rc) == fake_cuda_buffer_id(d) && rc == SUCCESS, "query after cuInit");
	fake_cuda_free(d);
}

static void test_va_reuse(void)
{
	CUresult rc;
	CUdeviceptr d;

	CHECK_EQ(p_cuMemAlloc(&d, 4 * MIB), SUCCESS, "cuMemAlloc 4 MiB");
	CHECK_EQ(d % (2 * MIB), 0, "large allocation 2 MiB aligned");
	unsigned long long id = bufid(d, &rc);

	for (int i = 0; i < 5; i++) {
		CUdeviceptr d2;

		p_cuMemFree(d);
		p_cuMemAlloc(&d2, 4 * MIB);
		unsigned long long id2 = bufid(d2, &rc);

		CHECK(d2 == d && id2 > id, "free + alloc 4 MiB: same VA, larger id (%llu > %llu)",
		      id2, id);
		id = id2;
	}
	p_cuMemFree(d);

	uint64_t a = fake_cuda_alloc(4096), b = fake_cuda_alloc(4096);

	CHECK_EQ(b - a, 4096, "two 4 KiB allocations are adjacent, 4096 apart");
	id = fake_cuda_buffer_id(b);
	fake_cuda_free(b);
	uint64_t b2 = fake_cuda_alloc(4096);

	CHECK(b2 == b && fake_cuda_buffer_id(b2) > id, "small free + alloc: same VA, larger id");
	fake_cuda_free(b2);
	uint64_t c = fake_cuda_alloc(2048);

	CHECK_EQ(c, b, "first fit: a 2 KiB allocation takes the freed 4 KiB hole");
	fake_cuda_free(c);
	fake_cuda_free(a);

	uint64_t s1 = fake_cuda_alloc(100), s2 = fake_cuda_alloc(100);

	CHECK_EQ(s2 - s1, 512, "100-byte allocations 512 apart");
	uint64_t f1 = fake_cuda_alloc(5000), f2 = fake_cuda_alloc(5000);

	CHECK_EQ(f2 - f1, 5120, "5000-byte allocations 5120 apart");
	fake_cuda_free(s1);
	fake_cuda_free(s2);
	fake_cuda_free(f1);
	fake_cuda_free(f2);
	CHECK_EQ(fake_cuda_live_chunks(), 0, "chunks released when empty");

	fake_cuda_force_new_va(true);
	a = fake_cuda_alloc(4096);
	fake_cuda_free(a);
	b = fake_cuda_alloc(4096);
	CHECK(a != b, "force_new_va: a different VA");
	fake_cuda_free(b);
	a = fake_cuda_alloc(4 * MIB);
	fake_cuda_free(a);
	b = fake_cuda_alloc(4 * MIB);
	CHECK(a != b, "force_new_va: a different large VA");
	fake_cuda_free(b);
	fake_cuda_force_new_va(false);
}

static void test_attributes(void)
{
	CUresult rc;
	uint64_t d = fake_cuda_alloc(5000);
	unsigned long long id = fake_cuda_buffer_id(d);
	CUcontext ctx = NULL;

	memset((void *)(uintptr_t)d, 0x5a, 5000);
	CHECK(((unsigned char *)(uintptr_t)d)[4999] == 0x5a, "device memory is readable/writable");
	CHECK_EQ(bufid(d + 4000, &rc), id, "interior pointer has the allocation's id");

	int attrs[] = { A_CONTEXT, A_MEMORY_TYPE, A_BUFFER_ID, A_IS_MANAGED, A_RANGE_START,
			A_RANGE_SIZE, A_DEVICE_ORDINAL, A_MAPPED, A_RDMA_CAPABLE, A_MAPPING_SIZE };
	CUcontext c_ctx;
	unsigned int memtype, managed, mapped, rdma;
	unsigned long long bid;
	CUdeviceptr start;
	size_t size, msize;
	int ordinal;
	void *data[] = { &c_ctx, &memtype, &bid, &managed, &start, &size, &ordinal, &mapped, &rdma,
			 &msize };

	CHECK_EQ(p_cuPointerGetAttributes(10, attrs, data, d + 100), SUCCESS, "cuPointerGetAttributes");
	p_cuCtxGetCurrent(&ctx);
	CHECK(c_ctx == ctx && ctx == fake_cuda_context(), "CONTEXT is the current context");
	CHECK_EQ(memtype, 2, "MEMORY_TYPE DEVICE");
	CHECK_EQ(bid, id, "BUFFER_ID");
	CHECK_EQ(managed, 0, "IS_MANAGED 0");
	CHECK_EQ(start, d, "RANGE_START_ADDR");
	CHECK_EQ(size, 5000, "RANGE_SIZE: the requested size");
	CHECK_EQ(ordinal, 0, "DEVICE_ORDINAL 0");
	CHECK_EQ(mapped, 1, "MAPPED");
	CHECK_EQ(rdma, 1, "IS_GPU_DIRECT_RDMA_CAPABLE");
	CHECK_EQ(msize, 2 * MIB, "MAPPING_SIZE: the chunk");
	CUdeviceptr base;
	size_t len;

	CHECK(p_cuMemGetAddressRange(&base, &len, d + 1) == SUCCESS && base == d && len == 5000,
	      "cuMemGetAddressRange");

	fake_cuda_free(d);
	bufid(d, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "BUFFER_ID after free: INVALID_VALUE");
	CHECK_EQ(p_cuMemGetAddressRange(&base, &len, d), NOT_FOUND, "address range after free");

	/* a pointer CUDA does not know: malloc memory */
	char *m = malloc(4096);

	start = 0x1234;
	size = 0x5678;
	bid = 77;
	memtype = 9;
	ordinal = 9;
	c_ctx = (CUcontext)1;
	CHECK_EQ(p_cuPointerGetAttributes(10, attrs, data, (CUdeviceptr)(uintptr_t)m), SUCCESS,
		 "cuPointerGetAttributes on malloc memory: SUCCESS");
	CHECK(bid == 0 && memtype == 0 && c_ctx == NULL && managed == 0 && mapped == 0,
	      "malloc memory: id 0, type 0, context NULL, not managed, not mapped");
	CHECK_EQ(ordinal, -2, "malloc memory: DEVICE_ORDINAL -2 (measured)");
	CHECK(start == 0x1234 && size == 0x5678, "malloc memory: RANGE_* untouched (measured)");
	void *hp = NULL;

	p_cuPointerGetAttributes(1, (int[]){ A_HOST_POINTER }, (void *[]){ &hp },
				 (CUdeviceptr)(uintptr_t)m);
	CHECK(hp == m, "malloc memory: HOST_POINTER = ptr (measured)");
	bufid((CUdeviceptr)(uintptr_t)m, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "BUFFER_ID on malloc memory: INVALID_VALUE");
	unsigned one = 1;

	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)m),
		 INVALID_VALUE, "SYNC_MEMOPS on malloc memory: INVALID_VALUE");
	free(m);

	CHECK_EQ(p_cuPointerGetAttributes(0, attrs, data, d), INVALID_VALUE, "0 attributes");
	CHECK_EQ(p_cuPointerGetAttribute(&bid, 99, d), INVALID_VALUE, "unknown attribute");

	/* bool attributes are written as 4 bytes */
	uint64_t md = fake_cuda_alloc_managed(MIB);
	unsigned long long wide = ~0ull;

	p_cuPointerGetAttribute(&wide, A_IS_MANAGED, md);
	CHECK_EQ(wide, 0xffffffff00000001ull, "IS_MANAGED written as 4 bytes (measured)");
	p_cuPointerGetAttribute(&memtype, A_MEMORY_TYPE, md);
	CHECK_EQ(memtype, 2, "managed: MEMORY_TYPE DEVICE (measured)");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, md), SUCCESS, "managed: SYNC_MEMOPS ok");
	p_cuPointerGetAttribute(&rdma, A_RDMA_CAPABLE, md);
	CHECK_EQ(rdma, 0, "managed: not GPUDirect RDMA capable");
	fake_cuda_free(md);

	void *h = fake_cuda_alloc_host(10000);

	p_cuPointerGetAttribute(&memtype, A_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h);
	CHECK_EQ(memtype, 1, "host: MEMORY_TYPE HOST");
	CHECK(bufid((CUdeviceptr)(uintptr_t)h, &rc) > 0 && rc == SUCCESS, "host: has a BUFFER_ID");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)h), SUCCESS,
		 "host: SYNC_MEMOPS ok");
	CHECK_EQ(fake_cuda_free(h2u(h)), -EINVAL, "fake_cuda_free refuses host memory");
	CHECK_EQ(fake_cuda_free_host(h), 0, "fake_cuda_free_host");
}

static void test_sync_memops(void)
{
	unsigned one = 1;
	uint64_t d = fake_cuda_alloc(4 * MIB);
	uint64_t p = fake_cuda_alloc_async(MIB);

	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, d + 8), SUCCESS, "SYNC_MEMOPS on cuMemAlloc");
	p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, d);
	CHECK_EQ(fake_cuda_sync_memops_count(d), 2, "SYNC_MEMOPS counted per allocation");
	unsigned int v = 0;

	p_cuPointerGetAttribute(&v, A_SYNC_MEMOPS, d);
	CHECK_EQ(v, 1, "SYNC_MEMOPS reads back 1");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, p), SUCCESS, "SYNC_MEMOPS on pool memory");
	CUcontext c = (CUcontext)1;

	p_cuPointerGetAttribute(&c, A_CONTEXT, p);
	CHECK(c == NULL, "pool memory: CONTEXT NULL (measured)");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_BUFFER_ID, d), INVALID_VALUE, "set BUFFER_ID: INVALID_VALUE");

	/* pool: same VA, new id */
	unsigned long long id = fake_cuda_buffer_id(p);

	fake_cuda_free_async(p);
	uint64_t p2 = fake_cuda_alloc_async(MIB);

	CHECK(p2 == p && fake_cuda_buffer_id(p2) > id, "pool free + alloc: same VA, larger id");
	fake_cuda_free_async(p2);
	fake_cuda_free(d);

	/* context-wide fallback */
	unsigned flags = 0;

	CHECK_EQ(p_cuCtxSetFlags(0x80), SUCCESS, "cuCtxSetFlags(SYNC_MEMOPS)");
	p_cuCtxGetFlags(&flags);
	CHECK_EQ(flags, 0x88, "flags read back (| MAP_HOST, as measured)");
	CHECK_EQ(fake_cuda_ctx_sync_memops_set_count(), 1, "context SYNC_MEMOPS counted");
}

static void test_vmm(void)
{
	CUresult rc;
	unsigned one = 1;
	uint64_t va = fake_cuda_vmm_reserve(8 * MIB);

	CHECK(va && va % (2 * MIB) == 0, "vmm reserve");
	CHECK_EQ(fake_cuda_vmm_map(va, 4 * MIB), 0, "vmm map 4 MiB");
	CHECK_EQ(fake_cuda_vmm_map(va + 4 * MIB, 2 * MIB), 0, "vmm map 2 MiB");
	CHECK_EQ(fake_cuda_vmm_map(va + 2 * MIB, 2 * MIB), -EINVAL, "overlapping map refused");
	CHECK_EQ(fake_cuda_vmm_map(va + MIB, 2 * MIB), -EINVAL, "unaligned map refused");
	unsigned long long id = bufid(va + 4096, &rc);

	CHECK(rc == SUCCESS && id > 0, "VMM memory has a BUFFER_ID");
	CHECK(bufid(va + 4 * MIB, &rc) != id, "each mapping has its own id");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, va), NOT_SUPPORTED,
		 "SYNC_MEMOPS on VMM memory: NOT_SUPPORTED");
	unsigned int memtype = 0;

	p_cuPointerGetAttribute(&memtype, A_MEMORY_TYPE, va);
	CHECK_EQ(memtype, 2, "VMM: MEMORY_TYPE DEVICE");
	CUdeviceptr start = 0, mbase = 0;
	size_t size = 0, msize = 0;

	p_cuPointerGetAttribute(&start, A_RANGE_START, va + 4 * MIB + 8);
	p_cuPointerGetAttribute(&size, A_RANGE_SIZE, va + 4 * MIB + 8);
	CHECK(start == va && size == 8 * MIB, "VMM: RANGE_* = the reservation (measured)");
	p_cuPointerGetAttribute(&mbase, A_MAPPING_BASE, va + 4 * MIB + 8);
	p_cuPointerGetAttribute(&msize, A_MAPPING_SIZE, va + 4 * MIB + 8);
	CHECK(mbase == va + 4 * MIB && msize == 2 * MIB, "VMM: MAPPING_* = the mapping");
	bufid(va + 7 * MIB, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "unmapped part of a reservation: INVALID_VALUE");

	int fd = -1;

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, va, 6 * MIB, 1, 0), SUCCESS,
		 "dma-buf across two mappings");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, va, 8 * MIB, 1, 0), INVALID_VALUE,
		 "dma-buf into unmapped VA");

	CHECK_EQ(fake_cuda_vmm_unmap(va, 2 * MIB), -EINVAL, "partial unmap refused");
	CHECK_EQ(fake_cuda_vmm_free(va, 8 * MIB), -EBUSY, "free with live mappings refused");
	CHECK_EQ(fake_cuda_vmm_unmap(va, 4 * MIB), 0, "unmap");
	bufid(va + 4096, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "unmapped: INVALID_VALUE");
	uint64_t vgen = fake_cuda_phys_gen(va + 4 * MIB);

	CHECK_EQ(fake_cuda_phys_gen(va), 0, "phys_gen: unmapped VMM range: 0");
	CHECK_EQ(fake_cuda_vmm_map(va, 4 * MIB), 0, "remap");
	CHECK(fake_cuda_phys_gen(va) != 0 && fake_cuda_phys_gen(va) != vgen, "phys_gen: remapped");
	CHECK(bufid(va + 4096, &rc) > id && rc == SUCCESS, "remap at the same VA: new, larger id");
	CHECK_EQ(fake_cuda_vmm_unmap(va, 6 * MIB), 0, "unmap two mappings at once");
	CHECK_EQ(fake_cuda_vmm_free(va, 8 * MIB), 0, "vmm free");
}

static void test_dmabuf(void)
{
	int base = fake_cuda_open_dmabufs();
	uint64_t a, b;

	fake_cuda_force_new_va(true); /* fresh VA: the two chunks are adjacent */
	a = fake_cuda_alloc(2 * MIB);
	b = fake_cuda_alloc(2 * MIB);
	fake_cuda_force_new_va(false);
	int fd = -1, fd2 = -1;
	uint64_t va = 0, size = 0;
	struct stat st;

	CHECK(base >= 0, "open_dmabufs works (%d)", base);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 2 * MIB, 1, 0), SUCCESS, "export 2 MiB");
	CHECK(fd >= 0, "a real fd");
	CHECK_EQ(fake_cuda_open_dmabufs(), base + 1, "one fake dma-buf open");
	CHECK(fake_cuda_dmabuf_range(fd, &va, &size) == 0 && va == a && size == 2 * MIB,
	      "dmabuf_range gives the exported range");
	CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == 2 * MIB, "dma-buf fd has the range's size");
	CHECK_EQ(b, a + 2 * MIB, "fresh 2 MiB allocations are adjacent");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd2, a, 4 * MIB, 1, 0), SUCCESS,
		 "export 4 MiB over two adjacent 2 MiB allocations");
	close(fd2);
	close(fd);
	CHECK_EQ(fake_cuda_open_dmabufs(), base, "closed: count back");
	CHECK_EQ(fake_cuda_dmabuf_range(0, &va, &size), -EINVAL, "stdin is not a fake dma-buf");

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a + 512, 4096, 1, 0), INVALID_VALUE, "unaligned VA");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4096 + 512, 1, 0), INVALID_VALUE, "unaligned size");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 0, 1, 0), INVALID_VALUE, "size 0");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4096, 2, 0), INVALID_VALUE, "handle type 2");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4096, 1, 1), NOT_SUPPORTED, "flags 1");
	fake_cuda_free(b);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4 * MIB, 1, 0), INVALID_VALUE,
		 "range over a freed chunk");
	fake_cuda_free(a);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 2 * MIB, 1, 0), INVALID_VALUE, "freed");

	/* small allocations: by VA range, not by allocation (measured) */
	uint64_t s1 = fake_cuda_alloc(4096), s2 = fake_cuda_alloc(4096), s3 = fake_cuda_alloc(4096);

	CHECK_EQ(s1 % (2 * MIB), 0, "first small allocation at a chunk start");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1, 65536, 1, 0), SUCCESS,
		 "the 64 KiB page holding small allocations");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1, 8192, 1, 0), SUCCESS, "8 KiB over two allocations");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1 + 5 * 4096, 4096, 1, 0), INVALID_VALUE,
		 "a page with no allocation in it");
	fake_cuda_free(s2);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s2, 4096, 1, 0), INVALID_VALUE, "a freed small buffer");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1, 3 * 4096, 1, 0), SUCCESS, "over a freed hole");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s2, 2 * 4096, 1, 0), SUCCESS,
		 "starting in a freed buffer, covering a live one (measured)");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s3 + 4096, 2 * MIB - 4 * 4096, 1, 0), INVALID_VALUE,
		 "free space after the last buffer of a chunk");
	uint64_t big = fake_cuda_alloc(3 * MIB);

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, big + 3 * MIB, MIB, 1, 0), INVALID_VALUE,
		 "the unused tail of a 3 MiB buffer's chunk (measured)");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, big + 2 * MIB, 2 * MIB, 1, 0), SUCCESS,
		 "a 3 MiB buffer's last 1 MiB plus its chunk's tail (measured)");
	close(fd);
	fake_cuda_free(big);
	uint64_t gen = fake_cuda_phys_gen(s1);

	CHECK(gen != 0 && fake_cuda_phys_gen(s1 + MIB) == gen, "phys_gen: per chunk, free space too");
	s2 = fake_cuda_alloc(4096);
	CHECK_EQ(fake_cuda_phys_gen(s2), gen, "phys_gen: reallocated in a live chunk: same pages");
	fake_cuda_free(s1);
	fake_cuda_free(s2);
	fake_cuda_free(s3);
	CHECK_EQ(fake_cuda_phys_gen(s1), 0, "phys_gen: released chunk: 0");
	s1 = fake_cuda_alloc(4096);
	CHECK(fake_cuda_phys_gen(s1) != 0 && fake_cuda_phys_gen(s1) != gen,
	      "phys_gen: new chunk at the same VA: new generation");
	fake_cuda_free(s1);

	void *h = fake_cuda_alloc_host(8192);
	uint64_t m = fake_cuda_alloc_managed(2 * MIB);

	CHECK(fake_cuda_phys_gen(h2u(h)) == 0 && fake_cuda_phys_gen(m) == 0,
	      "phys_gen: 0 for host and managed memory");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, h2u(h), 8192, 1, 0), INVALID_VALUE, "host memory");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, m, 2 * MIB, 1, 0), INVALID_VALUE, "managed memory");
	fake_cuda_free_host(h);
	fake_cuda_free(m);

	uint64_t p = fake_cuda_alloc_async(2 * MIB);
	struct fake_cuda_alloc_info pi = { 0 };

	fake_cuda_alloc_info(p, &pi);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, pi.chunk_va, pi.chunk_size, 1, 0), SUCCESS,
		 "pool memory: its whole chunk");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, pi.chunk_va, 2 * MIB, 1, 0), INVALID_VALUE,
		 "pool memory: part of a chunk is refused (H200)");
	fake_cuda_set_device_attr(124, 0);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, pi.chunk_va, pi.chunk_size, 1, 0), NOT_SUPPORTED,
		 "DMA_BUF_SUPPORTED 0: NOT_SUPPORTED");
	fake_cuda_set_device_attr(124, 1);
	fake_cuda_free_async(p);
	CHECK_EQ(fake_cuda_open_dmabufs(), base, "no fake dma-buf left open");
}

static void test_faults_and_counters(void)
{
	CUresult rc;
	uint64_t d = fake_cuda_alloc(4096);

	fake_cuda_reset_counters();
	CHECK_EQ(fake_cuda_fail_next("cuPointerGetAttribute", 999, 2), 0, "arm a fault");
	bufid(d, &rc);
	CHECK_EQ(rc, 999, "first call fails");
	bufid(d, &rc);
	CHECK_EQ(rc, 999, "second call fails");
	bufid(d, &rc);
	CHECK_EQ(rc, SUCCESS, "third call succeeds");
	CHECK_EQ(fake_cuda_calls("cuPointerGetAttribute"), 3, "calls counted, failed ones too");
	CHECK_EQ(fake_cuda_fail_after("cuMemAlloc", 1, 2, 1), 0, "fail_after by base name");
	CUdeviceptr x, y;

	CHECK_EQ(p_cuMemAlloc(&x, 4096), SUCCESS, "skipped call passes");
	CHECK_EQ(p_cuMemAlloc(&y, 4096), 2, "then OUT_OF_MEMORY");
	CHECK_EQ(fake_cuda_calls("cuMemAlloc_v2"), 2, "counted under both names");
	p_cuMemFree(x);
	CHECK_EQ(fake_cuda_fail_next("cuNoSuch", 1, 1), -EINVAL, "unknown entry refused");
	fake_cuda_fail_next("cuMemGetHandleForAddressRange", 2, 1);
	int fd = -1, before = fake_cuda_open_dmabufs();

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, d & ~4095ull, 4096, 1, 0), 2, "export fault");
	CHECK_EQ(fake_cuda_open_dmabufs(), before, "a failed export leaves no fd");

	CUcontext c = (CUcontext)1;
	unsigned flags;

	fake_cuda_set_no_context(true);
	p_cuCtxGetCurrent(&c);
	CHECK(c == NULL, "no context: cuCtxGetCurrent NULL");
	CHECK_EQ(p_cuCtxGetFlags(&flags), INVALID_CONTEXT, "no context: cuCtxGetFlags");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, d & ~4095ull, 4096, 1, 0), INVALID_CONTEXT,
		 "no context: export");
	CHECK(bufid(d, &rc) > 0 && rc == SUCCESS, "no context: pointer queries still work (measured)");
	fake_cuda_set_no_context(false);
	CHECK_EQ(p_cuCtxSetCurrent(NULL), SUCCESS, "cuCtxSetCurrent(NULL)");
	p_cuCtxGetCurrent(&c);
	CHECK(c == NULL, "this thread now has no context");
	p_cuCtxSetCurrent(fake_cuda_context());
	p_cuCtxGetCurrent(&c);
	CHECK(c == fake_cuda_context(), "context back");

	int v = 0;

	CHECK(p_cuDeviceGetAttribute(&v, 116, 0) == SUCCESS && v == 1, "GPU_DIRECT_RDMA_SUPPORTED 1");
	CHECK(p_cuDeviceGetAttribute(&v, 124, 0) == SUCCESS && v == 1, "DMA_BUF_SUPPORTED 1");
	CHECK(p_cuDeviceGetAttribute(&v, 102, 0) == SUCCESS && v == 1, "VMM supported 1");
	fake_cuda_set_device_attr(116, 0);
	CHECK(p_cuDeviceGetAttribute(&v, 116, 0) == SUCCESS && v == 0, "device attribute controllable");
	CHECK_EQ(p_cuDeviceGetAttribute(&v, 148, 0), INVALID_VALUE, "attribute 148: INVALID_VALUE");
	CHECK_EQ(p_cuDeviceGetAttribute(&v, 116, 1), INVALID_DEVICE, "device 1: INVALID_DEVICE");
	const char *name = NULL;

	CHECK(p_cuGetErrorName(801, &name) == SUCCESS && !strcmp(name, "CUDA_ERROR_NOT_SUPPORTED"),
	      "cuGetErrorName");
	CHECK(p_cuGetErrorName(12345, &name) == INVALID_VALUE && name == NULL, "unknown error name");
	fake_cuda_free(d);
}

static void *no_ctx_thread(void *arg)
{
	CUcontext c = (CUcontext)1;

	p_cuCtxGetCurrent(&c);
	*(CUcontext *)arg = c;
	return NULL;
}

static unsigned g_observed;
static uint64_t g_observed_id;

static void observer(uint64_t va, uint64_t size, uint64_t id, int kind, void *arg)
{
	(void)va;
	(void)size;
	(void)arg;
	if (kind == FAKE_CUDA_KIND_DEVICE) {
		g_observed++;
		g_observed_id = id;
	}
}

static void test_threads_and_reset(void)
{
	pthread_t t;
	CUcontext c = (CUcontext)1;

	fake_cuda_set_threads_have_context(false);
	pthread_create(&t, NULL, no_ctx_thread, &c);
	pthread_join(t, NULL);
	CHECK(c == NULL, "strict mode: a new thread has no current context");
	fake_cuda_set_threads_have_context(true);
	pthread_create(&t, NULL, no_ctx_thread, &c);
	pthread_join(t, NULL);
	CHECK(c == fake_cuda_context(), "default: a new thread has the context");

	fake_cuda_set_free_observer(observer, NULL);
	uint64_t d = fake_cuda_alloc(4096);
	uint64_t id = fake_cuda_buffer_id(d);

	p_cuMemFree(d);
	CHECK(g_observed == 1 && g_observed_id == id, "free observer called with the id");
	fake_cuda_set_free_observer(NULL, NULL);

	d = fake_cuda_alloc(4096);
	fake_cuda_alloc(3 * MIB);
	fake_cuda_vmm_map(fake_cuda_vmm_reserve(2 * MIB), 2 * MIB);
	uint64_t last = fake_cuda_last_buffer_id();

	fake_cuda_reset();
	CHECK_EQ(fake_cuda_live_allocations(), 0, "reset frees everything");
	CHECK_EQ(fake_cuda_live_chunks(), 0, "no chunk left");
	CHECK_EQ(fake_cuda_calls_total(), 0, "counters zero");
	uint64_t d2 = fake_cuda_alloc(4096);

	CHECK(fake_cuda_buffer_id(d2) > last, "ids keep increasing across reset");
	fake_cuda_free(d2);
	CHECK_EQ(fake_cuda_sim_fd(), -1, "sim mode off without FAKE_CUDA_P2P_SIM");
}

struct stress {
	int seed;
	int errors;
};

static void *stress_thread(void *arg)
{
	struct stress *s = arg;
	unsigned seed = (unsigned)s->seed;

	for (int i = 0; i < 2000; i++) {
		size_t size = (rand_r(&seed) % 3 == 0) ? 3 * MIB : 512u * (1 + rand_r(&seed) % 64);
		CUdeviceptr d;
		CUresult rc;

		if (p_cuMemAlloc(&d, size) != SUCCESS) {
			s->errors++;
			continue;
		}
		unsigned long long id = bufid(d + size - 1, &rc);

		if (rc != SUCCESS || id != fake_cuda_buffer_id(d))
			s->errors++;
		((volatile char *)(uintptr_t)d)[size - 1] = 1;
		if (p_cuMemFree(d) != SUCCESS)
			s->errors++;
	}
	return NULL;
}

static void test_stress(void)
{
	enum { N = 8 };
	pthread_t t[N];
	struct stress s[N];
	int errors = 0;

	for (int i = 0; i < N; i++) {
		s[i] = (struct stress){ .seed = i + 1 };
		pthread_create(&t[i], NULL, stress_thread, &s[i]);
	}
	for (int i = 0; i < N; i++) {
		pthread_join(t[i], NULL);
		errors += s[i].errors;
	}
	CHECK_EQ(errors, 0, "8 threads allocating, querying and freeing");
	CHECK_EQ(fake_cuda_live_allocations(), 0, "nothing left");
}

/* ---- Issue 11: facts measured on two H200s, driver API 13000 (tests/gpu/probes/mem_probe.c) -- */

#define POOL_CH FAKE_CUDA_POOL_CHUNK_SIZE
enum { A_MEMPOOL = 17, A_LEGACY_IPC = 10 };

static uint64_t attr_u64(int attr, CUdeviceptr p, CUresult *rc)
{
	uint64_t v = 0;
	CUresult r = p_cuPointerGetAttribute(&v, attr, p);

	if (rc)
		*rc = r;
	return v;
}

static unsigned attr_u32(int attr, CUdeviceptr p)
{
	unsigned v = 0xdead;

	p_cuPointerGetAttribute(&v, attr, p);
	return v;
}

static CUresult export_range(uint64_t va, uint64_t size, int *fdp)
{
	int fd = -1;
	CUresult rc = p_cuMemGetHandleForAddressRange(&fd, va, size, 1, 0);

	if (fdp)
		*fdp = fd;
	else if (rc == SUCCESS)
		close(fd);
	return rc;
}

static void test_pool(void)
{
	typedef CUresult (*pool_t)(void **, int);
	typedef CUresult (*fpa_t)(CUdeviceptr *, size_t, void *, void *);
	pool_t p_pool = (pool_t)resolve("cuDeviceGetDefaultMemPool", 12000);
	fpa_t p_from_pool = (fpa_t)resolve("cuMemAllocFromPoolAsync", 12000);
	unsigned one = 1;
	CUresult rc;

	fake_cuda_reset();
	/* a 1 MiB allocation at a chunk start: MAPPING is the 32 MiB chunk */
	uint64_t a = fake_cuda_alloc_async(MIB);

	CHECK(attr_u64(A_MAPPING_BASE, a, NULL) == a && a % POOL_CH == 0 &&
	      attr_u64(A_MAPPING_SIZE, a, NULL) == POOL_CH,
	      "pool: MAPPING is the 32 MiB chunk holding the address");
	/* small allocations packed in the chunk */
	uint64_t s[4];
	bool packed = true;

	for (int i = 0; i < 4; i++) {
		s[i] = fake_cuda_alloc_async(64 << 10);
		packed = packed && s[i] == s[0] + (uint64_t)i * (64 << 10) &&
			 attr_u64(A_MAPPING_BASE, s[i], NULL) == a;
	}
	CHECK(packed, "pool: four 64 KiB allocations packed 64 KiB apart in one chunk");
	CHECK(bufid(s[0], &rc) != bufid(s[1], &rc) && rc == SUCCESS, "pool: BUFFER_ID per allocation");
	CHECK_EQ(export_range(s[1] & ~0xffffull, 64 << 10, NULL), INVALID_VALUE,
		 "pool: the exact 64 KiB cover of an allocation is refused");
	CHECK_EQ(export_range(a, POOL_CH, NULL), SUCCESS,
		 "pool: a chunk shared by small allocations exports whole (free parts included)");
	CHECK_EQ(export_range(a, 16 * MIB, NULL), INVALID_VALUE, "pool: half a chunk is refused");

	/* a large allocation spans consecutive chunks, each its own */
	uint64_t l = fake_cuda_alloc_async(256 * MIB), last = l + 256 * MIB - 1;
	uint64_t lb = attr_u64(A_MAPPING_BASE, l, NULL), eb = attr_u64(A_MAPPING_BASE, last, NULL);

	CHECK(lb <= l && eb == (last & ~(POOL_CH - 1)) && attr_u64(A_MAPPING_SIZE, last, NULL) == POOL_CH &&
	      eb > lb, "pool: 256 MiB allocation: MAPPING at its last byte is the last chunk");
	CHECK(fake_cuda_phys_gen(l) != fake_cuda_phys_gen(last) && fake_cuda_phys_gen(last) != 0,
	      "pool: each chunk its own phys generation");
	CHECK(attr_u64(A_RANGE_START, l + 12345, NULL) == l &&
	      attr_u64(A_RANGE_SIZE, l + 12345, NULL) == 256 * MIB, "pool: RANGE is the allocation");
	CHECK_EQ(export_range(lb, eb + POOL_CH - lb, NULL), SUCCESS,
		 "pool: the cover of the chunks an allocation spans exports");
	CHECK_EQ(export_range(l, 256 * MIB, NULL), l == lb ? SUCCESS : INVALID_VALUE,
		 "pool: its exact range exports only if chunk-aligned at both ends");
	CHECK_EQ(export_range(lb + POOL_CH, 2 * POOL_CH, NULL), SUCCESS, "pool: interior chunks export");
	CHECK_EQ(export_range(lb, 2 * POOL_CH + 4096, NULL), INVALID_VALUE,
		 "pool: a range ending inside a chunk is refused");

	/* attributes */
	CUcontext ctx = (CUcontext)1;

	p_cuPointerGetAttribute(&ctx, A_CONTEXT, l);
	CHECK(ctx == NULL, "pool: CONTEXT NULL");
	CHECK_EQ(attr_u32(A_RDMA_CAPABLE, l), 0, "pool: IS_GPU_DIRECT_RDMA_CAPABLE 0");
	CHECK_EQ(attr_u32(A_MEMORY_TYPE, l), 2, "pool: MEMORY_TYPE DEVICE");
	CHECK_EQ(attr_u32(A_DEVICE_ORDINAL, l), 0, "pool: DEVICE_ORDINAL the pool's device");
	void *pool = NULL, *mp = NULL;

	p_cuPointerGetAttribute(&mp, A_MEMPOOL, l);
	CHECK(p_pool(&pool, 0) == SUCCESS && mp != NULL && mp == pool,
	      "pool: MEMPOOL_HANDLE non-NULL, the default pool");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, l), SUCCESS, "pool: SYNC_MEMOPS set succeeds");

	/* an explicit pool allocation behaves alike */
	CUdeviceptr e = 0;

	CHECK(p_from_pool(&e, MIB, pool, NULL) == SUCCESS && fake_cuda_alloc_info(e, &(struct fake_cuda_alloc_info){ 0 }) == 0 &&
	      attr_u64(A_MAPPING_SIZE, e, NULL) == POOL_CH, "cuMemAllocFromPoolAsync: pool memory alike");
	fake_cuda_free_async(e);

	/* straddling: an allocation across a chunk boundary has two MAPPINGs */
	fake_cuda_free_async(l);
	for (int i = 0; i < 4; i++)
		fake_cuda_free_async(s[i]);
	uint64_t f = fake_cuda_alloc_async(31 * MIB - MIB); /* after a: up to 31 MiB */
	uint64_t x = fake_cuda_alloc_async(2 * MIB);

	CHECK(x == a + 31 * MIB && attr_u64(A_MAPPING_BASE, x, NULL) == a &&
	      attr_u64(A_MAPPING_BASE, x + 2 * MIB - 1, NULL) == a + POOL_CH,
	      "pool: an allocation may straddle two chunks");
	fake_cuda_free_async(x);
	fake_cuda_free_async(f);

	/* release threshold 0: an empty chunk is released; same VA, new id, new memory */
	unsigned chunks = fake_cuda_pool_chunks(0);
	uint64_t id = fake_cuda_buffer_id(a), gen = fake_cuda_phys_gen(a);

	fake_cuda_free_async(a);
	CHECK_EQ(fake_cuda_pool_chunks(0), chunks - 1, "pool: a chunk with no allocation is released");
	CHECK_EQ(fake_cuda_phys_gen(a), 0, "pool: its memory is gone");
	uint64_t a2 = fake_cuda_alloc_async(MIB);

	CHECK(a2 == a && fake_cuda_buffer_id(a2) > id && fake_cuda_phys_gen(a2) != gen,
	      "pool: the VA is reused: new BUFFER_ID, new physical memory");

	/* an open dma-buf of a chunk holds its memory after the pool released it */
	int fd = -1;

	CHECK_EQ(export_range(a2, POOL_CH, &fd), SUCCESS, "pool: export the chunk");
	fake_cuda_free_async(a2);
	CHECK_EQ(fake_cuda_dmabuf_held_bytes(), POOL_CH,
		 "pool: freed chunk with an open dma-buf: exactly 32 MiB still allocated");
	uint64_t a3 = fake_cuda_alloc_async(MIB);

	CHECK(a3 == a && fake_cuda_phys_gen(a3) != 0, "pool: VA reused at once, new memory");
	close(fd);
	CHECK_EQ(fake_cuda_dmabuf_held_bytes(), 0, "pool: closing the dma-buf frees it");
	fake_cuda_free_async(a3);
	CHECK_EQ(fake_cuda_pool_chunks(0), 0, "pool: no chunk left");
}

typedef CUresult (*retain_t)(CUcontext *, int);
typedef CUresult (*devop_t)(int);
typedef CUresult (*state_t)(int, unsigned *, int *);
typedef CUresult (*ctxdev_t)(int *);
typedef CUresult (*ctxpop_t)(CUcontext *);
typedef CUresult (*ctxcreate_t)(CUcontext *, unsigned, int);
typedef CUresult (*count_t)(int *);
typedef CUresult (*devget_t)(int *, int);

static unsigned g_ctx_frees;

static void ctx_observer(uint64_t va, uint64_t size, uint64_t id, int kind, void *arg)
{
	(void)va;
	(void)size;
	(void)id;
	(void)kind;
	(void)arg;
	g_ctx_frees++;
}

static void test_devices(void)
{
	retain_t retain = (retain_t)resolve("cuDevicePrimaryCtxRetain", 12000);
	devop_t release = (devop_t)resolve("cuDevicePrimaryCtxRelease", 12000);
	devop_t preset = (devop_t)resolve("cuDevicePrimaryCtxReset", 12000);
	state_t getstate = (state_t)resolve("cuDevicePrimaryCtxGetState", 12000);
	ctxdev_t getdev = (ctxdev_t)resolve("cuCtxGetDevice", 12000);
	ctxset_t push = (ctxset_t)resolve("cuCtxPushCurrent", 12000);
	ctxpop_t pop = (ctxpop_t)resolve("cuCtxPopCurrent", 12000);
	ctxcreate_t create = (ctxcreate_t)resolve("cuCtxCreate", 12000);
	ctxset_t destroy = (ctxset_t)resolve("cuCtxDestroy", 12000);
	count_t getcount = (count_t)resolve("cuDeviceGetCount", 12000);
	devget_t devget = (devget_t)resolve("cuDeviceGet", 12000);
	CUcontext c0 = NULL, c1 = NULL, c = NULL;
	CUdeviceptr d0, d1;
	CUresult rc;
	int n = 0, dev = -1, active = -1;
	unsigned flags;

	fake_cuda_reset();
	CHECK_EQ(fake_cuda_set_device_count(5), -EINVAL, "device count: at most 4");
	CHECK_EQ(fake_cuda_set_device_count(2), 0, "two devices");
	CHECK(getcount(&n) == SUCCESS && n == 2, "cuDeviceGetCount 2");
	CHECK(devget(&dev, 1) == SUCCESS && dev == 1 && devget(&dev, 2) == INVALID_DEVICE,
	      "cuDeviceGet: 1 exists, 2 does not");
	/* driver-API style: retained before use */
	CHECK(retain(&c0, 0) == SUCCESS && retain(&c1, 1) == SUCCESS && c0 && c1 && c0 != c1,
	      "each device its own primary context");
	CHECK(c1 == fake_cuda_primary_context(1), "fake_cuda_primary_context");
	p_cuCtxSetCurrent(c1);
	CHECK(getdev(&dev) == SUCCESS && dev == 1, "cuCtxGetDevice: the current context's device");
	CHECK_EQ(p_cuMemAlloc(&d1, 4 * MIB), SUCCESS, "cuMemAlloc with GPU1's context current");
	p_cuPointerGetAttribute(&c, A_CONTEXT, d1);
	CHECK(attr_u32(A_DEVICE_ORDINAL, d1) == 1 && c == c1,
	      "GPU1 memory: DEVICE_ORDINAL 1, CONTEXT GPU1's context");
	p_cuCtxSetCurrent(c0);
	CHECK_EQ(p_cuMemAlloc(&d0, 4 * MIB), SUCCESS, "cuMemAlloc on GPU0");
	CHECK_EQ(attr_u32(A_DEVICE_ORDINAL, d0), 0, "GPU0 memory: DEVICE_ORDINAL 0");
	uint64_t h0 = fake_cuda_alloc_on(0, 4096), h1 = fake_cuda_alloc_on(1, 4096);

	CHECK(attr_u32(A_DEVICE_ORDINAL, h0) == 0 && attr_u32(A_DEVICE_ORDINAL, h1) == 1 &&
	      fake_cuda_alloc_on(2, 4096) == 0, "fake_cuda_alloc_on: on the device asked, existing only");
	uint64_t q1 = fake_cuda_alloc_async_on(1, MIB);

	CHECK_EQ(attr_u32(A_DEVICE_ORDINAL, q1), 1, "fake_cuda_alloc_async_on: the pool's device");

	/* export of GPU1 memory: any current context works, none does not */
	p_cuCtxSetCurrent(NULL);
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), INVALID_CONTEXT, "export GPU1 memory, no context");
	p_cuCtxSetCurrent(c0);
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), SUCCESS, "export GPU1 memory, GPU0's context");
	CHECK(push(c1) == SUCCESS && getdev(&dev) == SUCCESS && dev == 1, "cuCtxPushCurrent");
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), SUCCESS, "export GPU1 memory, GPU1's context");
	CHECK(pop(&c) == SUCCESS && c == c1 && getdev(&dev) == SUCCESS && dev == 0,
	      "cuCtxPopCurrent: back to GPU0's");

	/* a created context: its memory exports with GPU0's primary; destroy frees only it */
	CUcontext own = NULL;
	CUdeviceptr o;

	CHECK(create(&own, 0, 1) == SUCCESS && own != c1, "cuCtxCreate on GPU1");
	CHECK_EQ(p_cuMemAlloc(&o, 2 * MIB), SUCCESS, "allocate in it (it is current)");
	p_cuPointerGetAttribute(&c, A_CONTEXT, o);
	CHECK(c == own, "its memory reports it as CONTEXT");
	CHECK(pop(&c) == SUCCESS && c == own, "pop it: GPU0's primary again");
	CHECK_EQ(export_range(o, 2 * MIB, NULL), SUCCESS, "export a created context's memory, GPU0's current");
	CHECK_EQ(destroy(own), SUCCESS, "cuCtxDestroy");
	bufid(o, &rc);
	CHECK(rc == INVALID_VALUE && bufid(d1, &rc) && rc == SUCCESS,
	      "cuCtxDestroy frees its memory only");

	/* per-device attributes */
	CHECK_EQ(fake_cuda_set_device_attr_dev(1, 124, 0), 0, "set DMA_BUF_SUPPORTED 0 on GPU1");
	int v0 = -1, v1 = -1;

	p_cuDeviceGetAttribute(&v0, 124, 0);
	p_cuDeviceGetAttribute(&v1, 124, 1);
	CHECK(v0 == 1 && v1 == 0, "per-device attribute");
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), NOT_SUPPORTED, "export checks the memory's device");
	fake_cuda_set_device_attr_dev(1, 124, 1);

	/* GPU1's primary context: a release that is not the last frees nothing; the last does */
	fake_cuda_set_free_observer(ctx_observer, NULL);
	g_ctx_frees = 0;
	CHECK(retain(&c, 1) == SUCCESS && release(1) == SUCCESS && bufid(d1, &rc) && rc == SUCCESS,
	      "primary release, not the last: memory valid");
	CHECK_EQ(release(1), SUCCESS, "the last release of GPU1's primary context");
	bufid(d1, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "GPU1's context memory freed (BUFFER_ID query INVALID_VALUE)");
	CHECK_EQ(fake_cuda_buffer_id(h1), 0, "all of it");
	CHECK_EQ(g_ctx_frees, 2, "free observer called for each");
	CHECK(bufid(q1, &rc) && rc == SUCCESS, "GPU1's pool memory stays valid");
	CHECK(bufid(d0, &rc) && rc == SUCCESS && fake_cuda_buffer_id(h0), "GPU0's memory untouched");
	CHECK(getstate(1, &flags, &active) == SUCCESS && active == 0, "GetState: active 0 after the last release");
	CHECK(getstate(0, &flags, &active) == SUCCESS && active == 1, "GPU0's still active");
	fake_cuda_set_free_observer(NULL, NULL);

	/* reset of GPU1: its context memory goes, GPU0's and VMM memory stay */
	uint64_t r = fake_cuda_vmm_reserve(2 * MIB);

	p_cuCtxSetCurrent(c1);
	p_cuMemAlloc(&d1, MIB);
	CHECK_EQ(fake_cuda_vmm_map(r, 2 * MIB), 0, "VMM memory on GPU1");
	CHECK_EQ(preset(1), SUCCESS, "cuDevicePrimaryCtxReset(GPU1)");
	CHECK(fake_cuda_buffer_id(d1) == 0 && fake_cuda_buffer_id(d0) != 0,
	      "reset frees GPU1's context memory, GPU0's stays");
	CHECK(fake_cuda_buffer_id(r) != 0, "VMM memory survives the reset (assumed)");
	fake_cuda_vmm_unmap(r, 2 * MIB);
	fake_cuda_vmm_free(r, 2 * MIB);
	p_cuCtxSetCurrent(c0);
	release(0);
	fake_cuda_reset();
	CHECK(getcount(&n) == SUCCESS && n == 1, "reset: one device again");
}

static void test_ipc(void)
{
	typedef struct {
		char reserved[64];
	} ipch_t;
	typedef CUresult (*getmh_t)(ipch_t *, CUdeviceptr);
	typedef CUresult (*openmh_t)(CUdeviceptr *, ipch_t, unsigned);
	typedef CUresult (*closemh_t)(CUdeviceptr);
	getmh_t getmh = (getmh_t)resolve("cuIpcGetMemHandle", 12000);
	openmh_t openmh = (openmh_t)resolve("cuIpcOpenMemHandle", 12000);
	closemh_t closemh = (closemh_t)resolve("cuIpcCloseMemHandle", 12000);
	ipch_t h;
	CUdeviceptr p = 0, p2 = 0, p3 = 0;
	CUcontext c = NULL;
	struct fake_cuda_alloc_info info = { 0 };
	unsigned one = 1;
	CUresult rc;

	fake_cuda_reset();
	uint64_t e = fake_cuda_alloc(3 * MIB);

	CHECK_EQ(getmh(&h, e), SUCCESS, "cuIpcGetMemHandle of cuMemAlloc memory");
	CHECK_EQ(openmh(&p, h, 1), SUCCESS, "cuIpcOpenMemHandle (the importer)");
	CHECK(p && p != e && bufid(p, &rc) != bufid(e, &rc) && rc == SUCCESS,
	      "IPC import: its own BUFFER_ID");
	p_cuPointerGetAttribute(&c, A_CONTEXT, p);
	CHECK(c == fake_cuda_context() && attr_u32(A_MEMORY_TYPE, p) == 2 &&
	      attr_u32(A_RDMA_CAPABLE, p) == 0,
	      "IPC import: CONTEXT the importer's, MEMORY_TYPE DEVICE, RDMA_CAPABLE 0");
	CHECK(attr_u64(A_RANGE_START, p + 100, NULL) == p && attr_u64(A_RANGE_SIZE, p, NULL) == 3 * MIB &&
	      attr_u64(A_MAPPING_BASE, p + 100, NULL) == p && attr_u64(A_MAPPING_SIZE, p, NULL) == 3 * MIB,
	      "IPC import: RANGE and MAPPING exactly the allocation");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, p), SUCCESS, "IPC import: SYNC_MEMOPS ok");
	CHECK_EQ(export_range(p, 2 * MIB, NULL), INVALID_VALUE, "IPC import: dma-buf export fails");
	CHECK(fake_cuda_alloc_info(p, &info) == 0 && info.kind == FAKE_CUDA_KIND_IPC, "kind IPC");
	unsigned long long id = bufid(p, &rc);

	CHECK(openmh(&p2, h, 1) == SUCCESS && p2 == p, "open twice: same VA");
	CHECK(closemh(p2) == SUCCESS && bufid(p, &rc) == id && rc == SUCCESS,
	      "close one of two: still valid");
	CHECK_EQ(closemh(p), SUCCESS, "close the last");
	bufid(p, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "closed: BUFFER_ID query INVALID_VALUE");
	CHECK(openmh(&p3, h, 1) == SUCCESS && p3 == p && bufid(p3, &rc) > id,
	      "reopen: same VA, new BUFFER_ID");
	closemh(p3);
	uint64_t i1 = fake_cuda_ipc_import(e), i2 = fake_cuda_ipc_import(e);

	CHECK(i1 && i1 == i2 && fake_cuda_ipc_close(i1) == 0 && fake_cuda_buffer_id(i1) &&
	      fake_cuda_ipc_close(i1) == 0 && !fake_cuda_buffer_id(i1) && fake_cuda_ipc_close(i1) == -EINVAL,
	      "fake_cuda_ipc_import / close: reference counted");

	ipch_t old = { { 0 } };
	uint64_t size = 8192;

	memcpy(old.reserved, &size, sizeof(size));
	CHECK(openmh(&p, old, 0) == SUCCESS && fake_cuda_alloc_info(p, &info) == 0 &&
	      info.kind == FAKE_CUDA_KIND_DEVICE && info.size == 8192 && closemh(p) == SUCCESS &&
	      !fake_cuda_buffer_id(p), "a hand-made handle: a fresh DEVICE allocation (kept)");
	fake_cuda_free(e);
}

static void test_vmm_shareable(void)
{
	struct {
		int type, handle_types;
		struct {
			int type, id;
		} loc;
		void *win32;
		unsigned char flags[8];
	} prop = { 1, 1, { 1, 0 }, NULL, { 0 } };
	struct {
		struct {
			int type, id;
		} loc;
		int flags;
	} access = { { 1, 0 }, 3 };
	typedef CUresult (*create_t)(unsigned long long *, size_t, const void *, unsigned long long);
	typedef CUresult (*rel_t)(unsigned long long);
	typedef CUresult (*exp_t)(void *, unsigned long long, int, unsigned long long);
	typedef CUresult (*imp_t)(unsigned long long *, void *, int);
	typedef CUresult (*resv_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	typedef CUresult (*afree_t)(CUdeviceptr, size_t);
	typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
	typedef CUresult (*acc_t)(CUdeviceptr, size_t, const void *, size_t);
	typedef CUresult (*unmap_t)(CUdeviceptr, size_t);
	create_t mcreate = (create_t)resolve("cuMemCreate", 12000);
	rel_t mrelease = (rel_t)resolve("cuMemRelease", 12000);
	exp_t mexport = (exp_t)resolve("cuMemExportToShareableHandle", 12000);
	imp_t mimport = (imp_t)resolve("cuMemImportFromShareableHandle", 12000);
	resv_t reserve = (resv_t)resolve("cuMemAddressReserve", 12000);
	afree_t afree = (afree_t)resolve("cuMemAddressFree", 12000);
	map_t map = (map_t)resolve("cuMemMap", 12000);
	acc_t setaccess = (acc_t)resolve("cuMemSetAccess", 12000);
	unmap_t unmap = (unmap_t)resolve("cuMemUnmap", 12000);
	unsigned long long hx = 0, hi = 0;
	CUdeviceptr va = 0;
	CUcontext c = (CUcontext)1;
	unsigned one = 1;
	int fd = -1;
	CUresult rc;

	fake_cuda_reset();
	CHECK_EQ(mcreate(&hx, 2 * MIB, &prop, 0), SUCCESS, "cuMemCreate (POSIX fd requested)");
	CHECK(mexport(&fd, hx, 1, 0) == SUCCESS && fd >= 0, "cuMemExportToShareableHandle: an fd");
	CHECK_EQ(mimport(&hi, (void *)(intptr_t)fd, 1), SUCCESS, "cuMemImportFromShareableHandle");
	CHECK(reserve(&va, 2 * MIB, 0, 0, 0) == SUCCESS && map(va, 2 * MIB, 0, hi, 0) == SUCCESS &&
	      setaccess(va, 2 * MIB, &access, 1) == SUCCESS, "importer: reserve, map, set access");
	unsigned long long id = bufid(va, &rc);

	p_cuPointerGetAttribute(&c, A_CONTEXT, va);
	CHECK(id && rc == SUCCESS && c == NULL, "VMM import: own BUFFER_ID, CONTEXT NULL");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, va), NOT_SUPPORTED,
		 "VMM import: SYNC_MEMOPS NOT_SUPPORTED");
	CHECK_EQ(export_range(va, 2 * MIB, NULL), SUCCESS, "VMM import: dma-buf export succeeds");
	CHECK_EQ(unmap(va, 2 * MIB), SUCCESS, "cuMemUnmap");
	bufid(va, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "unmapped: BUFFER_ID query INVALID_VALUE");
	CHECK(map(va, 2 * MIB, 0, hi, 0) == SUCCESS && bufid(va, &rc) > id,
	      "remap of the same handle: new BUFFER_ID");
	unmap(va, 2 * MIB);
	CHECK_EQ(afree(va, 2 * MIB), SUCCESS, "cuMemAddressFree");
	prop.handle_types = 0;
	unsigned long long hn = 0;
	int fd2 = -1;

	CHECK(mcreate(&hn, 2 * MIB, &prop, 0) == SUCCESS && mexport(&fd2, hn, 1, 0) == INVALID_VALUE,
	      "export without the handle type requested: refused");
	CHECK(mrelease(hx) == SUCCESS && mrelease(hi) == SUCCESS && mrelease(hn) == SUCCESS &&
	      mrelease(hx) == INVALID_VALUE, "cuMemRelease");
	close(fd);
}

int main(void)
{
	load();
	test_proc_address();
	test_entries();
	test_init();
	test_va_reuse();
	test_attributes();
	test_sync_memops();
	test_vmm();
	test_dmabuf();
	test_faults_and_counters();
	test_threads_and_reset();
	test_stress();
	test_pool();
	test_devices();
	test_ipc();
	test_vmm_shareable();
	printf("1..%d\n", g_tests);
	if (g_failed)
		printf("# %d of %d checks failed\n", g_failed, g_tests);
	return g_failed ? 1 : 0;
}
