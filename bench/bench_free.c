/* SPDX-License-Identifier: MIT */
/*
 * What the free interception adds to a free, side by side in one process, on the machine it runs
 * on (it names it). cuMemAlloc + cuMemFree of SIZE, timed around the free only, median of N:
 *   1. libcuda untouched (before libgdrcache has loaded the driver: nothing is patched yet)
 *   2. patched, a cache exists, the buffer was never registered (the hook's own cost: announce,
 *      publish, look through the caches, withdraw)
 *   3. patched, the buffer registered and released before the free: its pin (a dma-buf on this
 *      machine) is released inside the free, before it returns, so the free returns the memory
 *   4. the same with the library's release done the old way, by hand, after the free (a flush):
 *      what the free plus the later release cost together
 * Also the time the free of a 1 GiB buffer takes to make cuMemGetInfo show it back in (3), and,
 * with 4096 other buffers cached, the free (2) and an allocation followed by a registration hit
 * (which applies the allocation's event), against the same with one buffer cached.
 *
 * Usage: bench_free [size_MiB=2] [iterations=200]. Needs a GPU; exits 77 without one.
 * Includes only the public header; the CUDA driver is reached with dlopen.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <gdrcache.h>

#include "machine.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGetName)(char *, int, int);
static CUresult (*cuDriverGetVersion)(int *);
static CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*cuCtxSetCurrent)(void *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemGetInfo)(size_t *, size_t *);

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Median time of a free, in us; reg: register + release before the free; flush: flush after. */
static double frees(struct gdr_cache *c, size_t size, int n, int reg, int flush)
{
	double *t = calloc((size_t)n, sizeof(*t)), m;

	for (int i = 0; i < n; i++) {
		CUdeviceptr p = 0;
		struct gdr_region *r;
		double t0;

		if (cuMemAlloc(&p, size))
			return -1;
		if (reg) {
			if (gdr_reg(c, NULL, (void *)(uintptr_t)p, size, 0, &r))
				return -1;
			gdr_dereg(r);
		}
		t0 = now_us();
		cuMemFree(p);
		if (flush)
			gdr_cache_flush(c);
		t[i] = now_us() - t0;
	}
	qsort(t, (size_t)n, sizeof(*t), cmp);
	m = t[n / 2];
	free(t);
	return m;
}

/* Median time of cuMemAlloc(size) and then a registration + release of the cached buffer hit (the
 * first registration after an allocation applies its event), in us; the allocation is freed
 * untimed. */
static double alloc_then_hit(struct gdr_cache *c, size_t size, int n, CUdeviceptr hit)
{
	double *t = calloc((size_t)n, sizeof(*t)), m;

	for (int i = 0; i < n; i++) {
		CUdeviceptr p = 0;
		struct gdr_region *r;
		double t0 = now_us();

		if (cuMemAlloc(&p, size) || gdr_reg(c, NULL, (void *)(uintptr_t)hit, 4096, 0, &r))
			return -1;
		gdr_dereg(r);
		t[i] = now_us() - t0;
		cuMemFree(p);
	}
	qsort(t, (size_t)n, sizeof(*t), cmp);
	m = t[n / 2];
	free(t);
	return m;
}

/* k buffers of 1 MiB allocated and registered once (cached), into bufs. 0 or -1. */
static int crowd(struct gdr_cache *c, CUdeviceptr *bufs, int k)
{
	for (int i = 0; i < k; i++) {
		struct gdr_region *r;

		if (cuMemAlloc(&bufs[i], 1 << 20) ||
		    gdr_reg(c, NULL, (void *)(uintptr_t)bufs[i], 4096, 0, &r))
			return -1;
		gdr_dereg(r);
	}
	return 0;
}

int main(int argc, char **argv)
{
	size_t size = (argc > 1 ? strtoull(argv[1], NULL, 0) : 2) << 20;
	int n = argc > 2 ? atoi(argv[2]) : 200, drv = 0;
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				    .validate = GDR_VALIDATE_AUTO };
	struct gdr_intercept_stats is;
	struct gdr_cache *c;
	char gpu[128] = "?", cpu[128];
	void *h = dlopen("libcuda.so.1", RTLD_NOW), *ctx = NULL;
	double base, hook, rel, later;

	if (!h) {
		printf("bench_free: no CUDA driver\n");
		return 77;
	}
#define L(f, s) *(void **)&f = dlsym(h, s)
	L(cuInit, "cuInit");
	L(cuDeviceGetName, "cuDeviceGetName");
	L(cuDriverGetVersion, "cuDriverGetVersion");
	L(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	L(cuCtxSetCurrent, "cuCtxSetCurrent");
	L(cuMemAlloc, "cuMemAlloc_v2");
	L(cuMemFree, "cuMemFree_v2");
	L(cuMemGetInfo, "cuMemGetInfo_v2");
#undef L
	if (!cuInit || cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
		printf("bench_free: no GPU\n");
		return 77;
	}
	if (cuDeviceGetName)
		cuDeviceGetName(gpu, sizeof(gpu), 0);
	else
		snprintf(gpu, sizeof(gpu), "no cuDeviceGetName: the fake driver (SIMULATION)?");
	if (cuDriverGetVersion)
		cuDriverGetVersion(&drv);
	bench_cpu_model(cpu, sizeof(cpu));
	printf("# bench_free: the cost the free interception adds to cuMemFree, one run\n");
	printf("# machine: GPU 0 %s; CUDA driver API %d; CPU %s\n", gpu, drv, cpu);
	printf("# cuMemAlloc + cuMemFree of %zu MiB, the free timed, median of %d\n", size >> 20, n);

	base = frees(NULL, size, n, 0, 0);
	if (gdr_cache_create(&a, &c)) {
		printf("bench_free: gdr_cache_create failed\n");
		return 1;
	}
	gdr_intercept_get_stats(&is, sizeof(is));
	printf("# interception: %d (%s)\n", is.state, is.reason);
	hook = frees(c, size, n, 0, 0);
	rel = frees(c, size, n, 1, 0);
	/* the old way: tag validation, nothing released in the free; the pin goes at a flush */
	later = -1;
	{
		struct gdr_cache_attr t = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
					    .validate = GDR_VALIDATE_TAG };
		struct gdr_cache *ct;

		if (!gdr_cache_create(&t, &ct)) {
			later = frees(ct, size, n, 1, 1);
			gdr_cache_destroy(ct);
		}
	}
	printf("%-62s %8.1f us\n", "cuMemFree, libcuda untouched", base);
	printf("%-62s %8.1f us  (+%.1f)\n", "cuMemFree, patched, nothing registered", hook,
	       hook - base);
	printf("%-62s %8.1f us  (+%.1f)\n", "cuMemFree, patched, its pin released inside the free", rel,
	       rel - base);
	printf("%-62s %8.1f us  (+%.1f)\n", "cuMemFree then a flush releasing the pin (a later op)",
	       later, later - base);

	/* With many other buffers cached: what an intercepted free, and an allocation (whose event
	 * the next registration applies), cost then. Events used to look at every cached entry. */
	{
		enum { CROWD = 4096 };
		static CUdeviceptr bufs[CROWD];
		struct gdr_cache_attr big = { .field_mask = GDR_CACHE_ATTR_VALIDATE |
							    GDR_CACHE_ATTR_MAX_ENTRIES |
							    GDR_CACHE_ATTR_MAX_BYTES,
					      .validate = GDR_VALIDATE_AUTO,
					      .max_entries = 2 * CROWD,
					      .max_bytes = 1ULL << 40 };
		struct gdr_cache *cb;
		CUdeviceptr one;

		if (!crowd(c, &one, 1)) {
			printf("%-62s %8.1f us\n", "cuMemAlloc + a cached buffer's reg/dereg, 1 cached",
			       alloc_then_hit(c, size, n, one));
			cuMemFree(one);
		}
		if (!gdr_cache_create(&big, &cb)) {
			if (!crowd(cb, bufs, CROWD)) {
				double freek = frees(cb, size, n, 0, 0);

				printf("%-62s %8.1f us\n",
				       "cuMemAlloc + a cached buffer's reg/dereg, 4096 cached",
				       alloc_then_hit(cb, size, n, bufs[CROWD / 2]));
				printf("%-62s %8.1f us  (+%.1f)\n",
				       "cuMemFree, patched, nothing registered, 4096 cached", freek,
				       freek - base);
			}
			for (int i = 0; i < CROWD && bufs[i]; i++)
				cuMemFree(bufs[i]);
			gdr_cache_destroy(cb);
		}
	}

	/* 1 GiB registered, released, freed: cuMemGetInfo right after */
	if (cuMemGetInfo) {
		size_t f0, f1, f2, tot;
		CUdeviceptr p = 0;
		struct gdr_region *r;

		cuMemGetInfo(&f0, &tot);
		if (!cuMemAlloc(&p, 1ULL << 30) && !gdr_reg(c, NULL, (void *)(uintptr_t)p, 1ULL << 30, 0, &r)) {
			gdr_dereg(r);
			cuMemGetInfo(&f1, &tot);
			cuMemFree(p);
			cuMemGetInfo(&f2, &tot);
			printf("1 GiB registered, released, freed: free memory %zu MiB before, %zu MiB "
			       "allocated, %zu MiB right after the free (difference %lld MiB)\n",
			       f0 >> 20, f1 >> 20, f2 >> 20, ((long long)f0 - (long long)f2) >> 20);
		}
	}
	gdr_intercept_get_stats(&is, sizeof(is));
	printf("# frees seen %llu, pins released inside frees %llu, %.1f us in free hooks per free\n",
	       (unsigned long long)is.frees[GDR_FREE_MEM_FREE], (unsigned long long)is.released,
	       is.frees[GDR_FREE_MEM_FREE] ? is.free_ns / 1e3 / is.frees[GDR_FREE_MEM_FREE] : 0.0);
	gdr_cache_destroy(c);
	return 0;
}
