/* SPDX-License-Identifier: MIT */
/*
 * The free-event source (lib/hooks.c) against the fake driver, in a program linked with
 * libgdrcache.so as a user's would be: a runtime-like client (dlsym "cuGetProcAddress_v2", then
 * everything through it) is seen, so is one that dlsyms "cuMemFree_v2" and one that calls the
 * exported symbol; every free entry point publishes the right range; the probe passes; dlsym's
 * pass-through keeps RTLD_NEXT relative to its real caller; concurrent frees lose no event.
 *
 * Built a second time as test_events_late (GDR_TEST_LATE): a program NOT linked with libgdrcache
 * that dlopens it (argv[1]) at run time, where the probe must fail, unless LD_PRELOAD put it ahead
 * of libc (then GDR_TEST_EXPECT=pass and a runtime-like client must be seen).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"
#include "fake_cuda.h"

#define MiB (1024ULL * 1024)
#define ALL_LEN UINT64_MAX
#define RING 4096u

typedef gdr_CUresult (*alloc_fn)(gdr_CUdeviceptr *, size_t);
typedef gdr_CUresult (*alloc_async_fn)(gdr_CUdeviceptr *, size_t, void *);
typedef gdr_CUresult (*alloc_host_fn)(void **, size_t);
typedef gdr_CUresult (*free_fn)(gdr_CUdeviceptr);
typedef gdr_CUresult (*free_async_fn)(gdr_CUdeviceptr, void *);
typedef gdr_CUresult (*free_host_fn)(void *);
typedef gdr_CUresult (*unmap_fn)(gdr_CUdeviceptr, size_t);
typedef gdr_CUresult (*ctx_fn)(gdr_CUcontext);
typedef gdr_CUresult (*dev_fn)(gdr_CUdevice);
struct ipc_handle {
	char b[64];
};
typedef gdr_CUresult (*ipc_open_fn)(gdr_CUdeviceptr *, struct ipc_handle, unsigned);

/* libgdrcache's private entry points, found at run time (both builds of this file). */
static int (*ev_probe)(const char **why);
static uint64_t (*ev_head)(void);
static int (*ev_get)(uint64_t seq, uint64_t *start, uint64_t *len);

static void *libcuda;
static gdr_cuGetProcAddress_v2_t gpa2;

static int find_private(void *h)
{
	ev_probe = (int (*)(const char **))dlsym(h, "gdr_private_events_probe");
	ev_head = (uint64_t(*)(void))dlsym(h, "gdr_private_events_head");
	ev_get = (int (*)(uint64_t, uint64_t *, uint64_t *))dlsym(h, "gdr_private_events_get");
	return ev_probe && ev_head && ev_get ? 0 : -1;
}

/* Events published at or after seq for exactly [start, len). */
static unsigned events_for(uint64_t seq, uint64_t start, uint64_t len)
{
	uint64_t s, l, head = ev_head();
	unsigned n = 0;

	for (; seq < head; seq++) {
		int rc;

		while ((rc = ev_get(seq, &s, &l)) == -11 /* -EAGAIN */)
			;
		if (rc == 0 && s == start && l == len)
			n++;
	}
	return n;
}

static void *proc(const char *name, int version, uint64_t flags)
{
	void *fn = NULL;
	int st = 0;

	if (gpa2(name, &fn, version, flags, &st) != GDR_CUDA_SUCCESS)
		return NULL;
	return fn;
}

/* The CUDA runtime's way in: dlopen libcuda, dlsym cuGetProcAddress_v2, cuInit through it. */
static int runtime_like_open(void)
{
	gdr_cuInit_t init;

	libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!libcuda)
		return -1;
	gpa2 = (gdr_cuGetProcAddress_v2_t)dlsym(libcuda, "cuGetProcAddress_v2");
	if (!gpa2)
		return -1;
	init = (gdr_cuInit_t)proc("cuInit", 12000, 0);
	return init && init(0) == GDR_CUDA_SUCCESS ? 0 : -1;
}

/* A runtime-like client's cudaMalloc/cudaFree, cudaMallocAsync/cudaFreeAsync (both stream
 * flavours) and cudaMallocHost/cudaFreeHost: how many of the 4 frees were seen. */
static unsigned runtime_like_frees(void)
{
	alloc_fn alloc = (alloc_fn)proc("cuMemAlloc", 3020, 0);
	free_fn fr = (free_fn)proc("cuMemFree", 3020, 0);
	alloc_async_fn alloc_a = (alloc_async_fn)proc("cuMemAllocAsync", 11020, 0);
	free_async_fn fr_a = (free_async_fn)proc("cuMemFreeAsync", 11020, 0);
	free_async_fn fr_pt = (free_async_fn)proc("cuMemFreeAsync", 11020, 2);
	alloc_host_fn alloc_h = (alloc_host_fn)proc("cuMemAllocHost", 3020, 0);
	free_host_fn fr_h = (free_host_fn)proc("cuMemFreeHost", 2000, 0);
	gdr_CUdeviceptr p = 0;
	void *hp = NULL;
	uint64_t seq;
	unsigned seen = 0;

	if (!alloc || !fr || !alloc_a || !fr_a || !fr_pt || !alloc_h || !fr_h)
		return 0;
	if (alloc(&p, MiB) == GDR_CUDA_SUCCESS) {
		seq = ev_head();
		if (fr(p) == GDR_CUDA_SUCCESS)
			seen += events_for(seq, p, 0);
	}
	if (alloc_a(&p, MiB, NULL) == GDR_CUDA_SUCCESS) {
		seq = ev_head();
		if (fr_a(p, NULL) == GDR_CUDA_SUCCESS)
			seen += events_for(seq, p, 0);
	}
	if (alloc_a(&p, MiB, NULL) == GDR_CUDA_SUCCESS) {
		uint64_t ptsz = fake_cuda_calls("cuMemFreeAsync_ptsz");

		seq = ev_head();
		if (fr_pt(p, NULL) == GDR_CUDA_SUCCESS &&
		    fake_cuda_calls("cuMemFreeAsync_ptsz") == ptsz + 1)
			seen += events_for(seq, p, 0);
	}
	if (alloc_h(&hp, 4096) == GDR_CUDA_SUCCESS) {
		seq = ev_head();
		if (fr_h(hp) == GDR_CUDA_SUCCESS)
			seen += events_for(seq, (uintptr_t)hp, 0);
	}
	return seen;
}

#ifdef GDR_TEST_LATE

int main(int argc, char **argv)
{
	const char *expect = getenv("GDR_TEST_EXPECT"), *why = NULL;
	bool pass = expect && !strcmp(expect, "pass");
	void *h;
	int rc;

	if (argc < 2) {
		fprintf(stderr, "usage: %s path/to/libgdrcache.so\n", argv[0]);
		return 2;
	}
	setenv("GDRCACHE_LOG", "error", 0);
	h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
	if (!h || find_private(h)) {
		fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
		return 1;
	}
	rc = ev_probe(&why);
	printf("probe with libgdrcache %s: %d (%s)\n", pass ? "preloaded" : "dlopen'ed late", rc, why);
	if (pass ? rc != 0 : rc == 0)
		return 1;
	if (runtime_like_open())
		return 1;
	unsigned seen = runtime_like_frees();

	printf("runtime-like client: 4 frees, %u seen\n", seen);
	return pass ? (seen == 4 ? 0 : 1) : (seen == 0 ? 0 : 1);
}

#else /* the program linked with libgdrcache */

#include <cmocka.h>

/* The exported forwarder (libgdrcache comes before libcuda on this program's link line). */
extern gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr dptr);
/* tests/unit/events_next.c, built twice: libgdr_test_next_a.so then libgdr_test_next_b.so */
extern int gdr_test_next_which(void);
extern int gdr_test_next_from_a(void);
extern int gdr_test_next_b_marker(void);

static int setup(void **state)
{
	(void)state;
	if (find_private(RTLD_DEFAULT) || runtime_like_open())
		return -1;
	return 0;
}

static void test_runtime_like(void **state)
{
	(void)state;
	assert_int_equal(runtime_like_frees(), 4);
}

/* Through cuGetProcAddress itself as returned by cuGetProcAddress (v2 from 12000, v1 below). */
static void test_gpa_of_gpa(void **state)
{
	gdr_cuGetProcAddress_v2_t g2 = (gdr_cuGetProcAddress_v2_t)proc("cuGetProcAddress", 12000, 0);
	gdr_cuGetProcAddress_v1_t g1 = (gdr_cuGetProcAddress_v1_t)proc("cuGetProcAddress", 11030, 0);
	alloc_fn alloc = (alloc_fn)proc("cuMemAlloc", 3020, 0);
	void *f2 = NULL, *f1 = NULL;
	gdr_CUdeviceptr p;
	uint64_t seq;
	int st;

	(void)state;
	assert_non_null(g2);
	assert_non_null(g1);
	assert_ptr_equal((void *)g2, (void *)gpa2); /* our wrapper hands itself out */
	assert_int_equal(g2("cuMemFree", &f2, 12000, 0, &st), 0);
	assert_int_equal(g1("cuMemFree", &f1, 11030, 0), 0);
	assert_int_equal(alloc(&p, 3 * MiB), 0);
	seq = ev_head();
	assert_int_equal(((free_fn)f2)(p), 0);
	assert_int_equal(events_for(seq, p, 0), 1);
	assert_int_equal(alloc(&p, 3 * MiB), 0);
	seq = ev_head();
	assert_int_equal(((free_fn)f1)(p), 0);
	assert_int_equal(events_for(seq, p, 0), 1);
}

static void test_dlsym_clients(void **state)
{
	alloc_fn alloc = (alloc_fn)proc("cuMemAlloc", 3020, 0);
	free_fn by_handle = (free_fn)dlsym(libcuda, "cuMemFree_v2");
	free_fn by_default = (free_fn)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
	free_fn fns[] = { by_handle, by_default, cuMemFree_v2 };
	gdr_CUdeviceptr p;
	uint64_t seq;

	(void)state;
	/* dlvsym passes through (libcuda has no symbol versions: no driver lookup goes by dlvsym) */
	assert_non_null(dlvsym(RTLD_DEFAULT, "strlen", "GLIBC_2.2.5"));
	for (unsigned i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		assert_non_null(fns[i]);
		assert_int_equal(alloc(&p, MiB), 0);
		seq = ev_head();
		assert_int_equal(fns[i](p), 0);
		assert_int_equal(events_for(seq, p, 0), 1); /* once: not wrapped twice */
		assert_int_equal(fake_cuda_buffer_id(p), 0); /* and really freed */
	}
}

static void test_every_entry_point(void **state)
{
	alloc_fn alloc = (alloc_fn)proc("cuMemAlloc", 3020, 0);
	ipc_open_fn ipc_open = (ipc_open_fn)proc("cuIpcOpenMemHandle", 11000, 0);
	free_fn ipc_close = (free_fn)proc("cuIpcCloseMemHandle", 4010, 0);
	unmap_fn unmap = (unmap_fn)proc("cuMemUnmap", 10020, 0);
	struct ipc_handle handle = { { 0 } };
	static const struct {
		const char *name;
		int version;
	} all[] = {
		{ "cuCtxDestroy", 4000 },           { "cuCtxDestroy", 3020 },
		{ "cuDevicePrimaryCtxReset", 11000 }, { "cuDevicePrimaryCtxReset", 7000 },
		{ "cuDevicePrimaryCtxRelease", 11000 }, { "cuDevicePrimaryCtxRelease", 7000 },
	};
	gdr_CUdeviceptr p;
	uint64_t seq, va;

	(void)state;
	assert_int_equal(ipc_open(&p, handle, 0), 0);
	seq = ev_head();
	assert_int_equal(ipc_close(p), 0);
	assert_int_equal(events_for(seq, p, 0), 1);

	va = fake_cuda_vmm_reserve(4 * MiB);
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_map(va + 2 * MiB, 2 * MiB), 0);
	seq = ev_head();
	assert_int_equal(unmap(va + 2 * MiB, 2 * MiB), 0);
	assert_int_equal(events_for(seq, va + 2 * MiB, 2 * MiB), 1);
	assert_int_equal(unmap(va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_free(va, 4 * MiB), 0);

	for (unsigned i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		void *fn = proc(all[i].name, all[i].version, 0);
		gdr_CUcontext ctx = NULL;

		assert_non_null(fn);
		assert_int_equal(alloc(&p, MiB), 0);
		if (strstr(all[i].name, "Release")) /* the last reference destroys it */
			assert_int_equal(((gdr_cuDevicePrimaryCtxRetain_t)proc(
						  "cuDevicePrimaryCtxRetain", 7000, 0))(&ctx, 0), 0);
		seq = ev_head();
		if (strstr(all[i].name, "CtxDestroy"))
			assert_int_equal(((ctx_fn)fn)((gdr_CUcontext)fake_cuda_context()), 0);
		else
			assert_int_equal(((dev_fn)fn)(0), 0);
		assert_int_equal(events_for(seq, 0, ALL_LEN), 1);
		if (!strstr(all[i].name, "Release"))
			assert_int_equal(fake_cuda_buffer_id(p), 0); /* the context's memory went */
	}
}

static void test_probe(void **state)
{
	const char *why = NULL;

	(void)state;
	assert_int_equal(ev_probe(&why), 0);
	assert_non_null(why);
	assert_int_equal(ev_probe(NULL), 0); /* cached */
}

/* libgdr_test_next_a's dlsym(RTLD_NEXT, "gdr_test_next_which") must find b's: through the
 * trampoline, libc sees a's return address. Were it libgdrcache's or this program's, it would
 * find a's own. */
static void test_rtld_next(void **state)
{
	(void)state;
	assert_int_equal(gdr_test_next_which(), 'a');
	assert_int_equal(gdr_test_next_b_marker(), 'b');
	assert_int_equal(gdr_test_next_from_a(), 'b');
	/* RTLD_NEXT lookups of driver names pass through unwrapped, as asked */
	assert_null(dlsym(RTLD_NEXT, "gdr_no_such_symbol"));
}

#define THREADS 8
#define PER_THREAD 400 /* THREADS * PER_THREAD < RING: nothing may be lost */

struct worker {
	free_fn fr;
	alloc_fn alloc;
	gdr_CUdeviceptr freed[PER_THREAD];
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	for (unsigned i = 0; i < PER_THREAD; i++) {
		gdr_CUdeviceptr p = 0;

		if (w->alloc(&p, 4096) || w->fr(p))
			return (void *)1;
		w->freed[i] = p;
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void test_concurrent(void **state)
{
	static struct worker w[THREADS];
	static uint64_t want[THREADS * PER_THREAD], got[THREADS * PER_THREAD];
	pthread_t t[THREADS];
	uint64_t seq = ev_head(), s, l;
	unsigned n = 0;

	(void)state;
	for (int i = 0; i < THREADS; i++) {
		w[i].alloc = (alloc_fn)proc("cuMemAlloc", 3020, 0);
		w[i].fr = (free_fn)(i & 1 ? proc("cuMemFree", 3020, 0) : dlsym(libcuda, "cuMemFree_v2"));
		assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < THREADS; i++) {
		void *ret;

		assert_int_equal(pthread_join(t[i], &ret), 0);
		assert_null(ret);
		memcpy(&want[i * PER_THREAD], w[i].freed, sizeof(w[i].freed));
	}
	assert_int_equal(ev_head() - seq, THREADS * PER_THREAD);
	for (; seq < ev_head(); seq++) {
		assert_int_equal(ev_get(seq, &s, &l), 0);
		assert_int_equal(l, 0);
		got[n++] = s;
	}
	qsort(want, n, sizeof(want[0]), cmp_u64);
	qsort(got, n, sizeof(got[0]), cmp_u64);
	assert_memory_equal(want, got, sizeof(want));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_probe),
		cmocka_unit_test(test_runtime_like),
		cmocka_unit_test(test_gpa_of_gpa),
		cmocka_unit_test(test_dlsym_clients),
		cmocka_unit_test(test_every_entry_point),
		cmocka_unit_test(test_rtld_next),
		cmocka_unit_test(test_concurrent),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}

#endif
