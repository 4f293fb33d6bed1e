/* SPDX-License-Identifier: MIT */
/*
 * Self-test of the fake CUDA driver: proves that it behaves as docs/FACTS.md and the probes in
 * fake_cuda.c say the real driver does. Reaches the entry points the way libgdrcache does:
 * dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then cuGetProcAddress_v2 for the rest.
 * TAP output; exit 0 only if every check passes.
 *
 * This file loads the driver, holds the helpers and main (the cases run in one order: the fake's
 * state carries from one to the next) and the cases of how the driver is reached; the other cases
 * are in fake_cuda_selftest_{mem,ctl,pool,ctx,ipc}.c, declared in fake_cuda_selftest.h.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda_selftest.h"

gpa2_t gpa2;
gpa1_t gpa1;
init_t p_cuInit;
ver_t p_cuDriverGetVersion;
pga_t p_cuPointerGetAttribute;
pgas_t p_cuPointerGetAttributes;
psa_t p_cuPointerSetAttribute;
ctxget_t p_cuCtxGetCurrent;
ctxset_t p_cuCtxSetCurrent;
getflags_t p_cuCtxGetFlags;
setflags_t p_cuCtxSetFlags;
devattr_t p_cuDeviceGetAttribute;
handle_t p_cuMemGetHandleForAddressRange;
errname_t p_cuGetErrorName;
memalloc_t p_cuMemAlloc;
memfree_t p_cuMemFree;
addrrange_t p_cuMemGetAddressRange;
void *g_handle;
int g_tests, g_failed;

uint64_t h2u(const void *p)
{
	return (uint64_t)(uintptr_t)p;
}

void *resolve(const char *name, int version)
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

unsigned long long bufid(CUdeviceptr p, CUresult *rc)
{
	unsigned long long id = 0;

	*rc = p_cuPointerGetAttribute(&id, A_BUFFER_ID, p);
	return id;
}

uint64_t attr_u64(int attr, CUdeviceptr p, CUresult *rc)
{
	uint64_t v = 0;
	CUresult r = p_cuPointerGetAttribute(&v, attr, p);

	if (rc)
		*rc = r;
	return v;
}

unsigned attr_u32(int attr, CUdeviceptr p)
{
	unsigned v = 0xdead;

	p_cuPointerGetAttribute(&v, attr, p);
	return v;
}

CUresult export_range(uint64_t va, uint64_t size, int *fdp)
{
	int fd = -1;
	CUresult rc = p_cuMemGetHandleForAddressRange(&fd, va, size, 1, 0);

	if (fdp)
		*fdp = fd;
	else if (rc == SUCCESS)
		close(fd);
	return rc;
}

void test_proc_address(void)
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
 * cuGetProcAddress hands out those exported entries, as dlsym does (docs/FACTS.md,
 * "cuGetProcAddress"). */
void test_entries(void)
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

void test_init(void)
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
