/* SPDX-License-Identifier: MIT */
/*
 * libcuda loaded and in use first, threads already calling cuMemAlloc/cuMemFree, and only then
 * libgdrcache dlopen'ed: its patching of the driver's entries happens under the calling threads.
 * Run as it is (ASLR: the one-byte form where its stub address is free) and under setarch -R (no
 * ASLR: the stub addresses lie past the top, so every entry is written with the threads stopped).
 *
 * Checks: the threads' calls all succeed and go on after the patch; free events are in effect;
 * the hooks see the threads' frees; 2000 registrations of a buffer freed and reallocated at the
 * same VA each describe the live buffer (its BUFFER_ID). Prints how the entries were patched and
 * what the patch cost: gdr_cache_create's time (it loads and patches) and the median cuMemFree of
 * a 2 MiB buffer on this thread before and after the patch (the free path's added cost, in the
 * form in effect), with the machine named.
 *
 * Usage: busy_patch LIBGDRCACHE [threads=8]. Exit 0 pass, 1 fail, 77 no GPU.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <time.h>
#include <unistd.h>

#include <gdrcache.h>

#include "cu.h"

#define MAX_THREADS 64
#define WAIT_S 60

static CUcontext ctx;
static long calls, errors;
static int stop;

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void *caller(void *arg)
{
	(void)arg;
	p_cuCtxSetCurrent(ctx);
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		CUdeviceptr p = 0;

		if (p_cuMemAlloc_v2(&p, 1 << 20) || p_cuMemFree_v2(p))
			__atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static int more_calls(long n)
{
	long want = __atomic_load_n(&calls, __ATOMIC_RELAXED) + n;
	double end = now_us() + WAIT_S * 1e6;

	while (__atomic_load_n(&calls, __ATOMIC_RELAXED) < want)
		if (now_us() > end)
			return 1;
		else
			usleep(1000);
	return 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Median time of a 2 MiB cuMemFree on this thread (us). */
static double free_median(void)
{
	double t[200];

	for (int i = 0; i < 200; i++) {
		CUdeviceptr p = 0;
		double t0;

		p_cuMemAlloc_v2(&p, 2 << 20);
		t0 = now_us();
		p_cuMemFree_v2(p);
		t[i] = now_us() - t0;
	}
	qsort(t, 200, sizeof(t[0]), cmp);
	return t[100];
}

#define API(X)                                                                                     \
	X(create, int, (const struct gdr_cache_attr *, struct gdr_cache **), "gdr_cache_create")   \
	X(destroy, int, (struct gdr_cache *), "gdr_cache_destroy")                                 \
	X(reg, int,                                                                                \
	  (struct gdr_cache *, struct ibv_pd *, void *, size_t, int, struct gdr_region **),        \
	  "gdr_reg")                                                                               \
	X(dereg, int, (struct gdr_region *), "gdr_dereg")                                          \
	X(bid, int, (const struct gdr_region *, uint64_t *), "gdr_region_buffer_id")               \
	X(istats, int, (struct gdr_intercept_stats *, size_t), "gdr_intercept_get_stats")          \
	X(state, int, (const char **), "gdr_mem_events_state")

int main(int argc, char **argv)
{
#define DECL(n, r, a, s) r(*n) a;
	struct {
		API(DECL)
	} g;
	int nthreads = argc > 2 ? atoi(argv[2]) : 8, bad = 0, stale = 0, rc;
	char gpu[128] = "?", host[64] = "?";
	pthread_t th[MAX_THREADS];
	struct gdr_intercept_stats is;
	struct gdr_cache *c = NULL;
	double before, after, t0, create_ms;
	const char *why = "?";
	uint64_t frees0;
	CUdevice dev;
	void *h;

	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc < 2 || nthreads < 1 || nthreads > MAX_THREADS)
		return fprintf(stderr, "usage: busy_patch LIBGDRCACHE [threads 1-64]\n"), 1;
	rc = cu_setup(gpu, sizeof(gpu));
	if (rc)
		return rc;
	p_cuDeviceGet(&dev, 0);
	p_cuCtxGetCurrent(&ctx);
	gethostname(host, sizeof(host));
	printf("machine: %s, %s; ASLR %s; %d threads calling cuMemAlloc/cuMemFree\n", host, gpu,
	       personality(0xffffffff) & ADDR_NO_RANDOMIZE ? "off (setarch -R)" : "on", nthreads);
	before = free_median();
	for (int i = 0; i < nthreads; i++)
		if (pthread_create(&th[i], NULL, caller, NULL))
			return fprintf(stderr, "FAIL: pthread_create\n"), 1;
	if (more_calls(1000))
		return fprintf(stderr, "FAIL: the threads made too few calls\n"), 1;
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return fprintf(stderr, "FAIL: %s\n", dlerror()), 1;
#define RESOLVE(n, r, a, s)                                                                        \
	if (!(*(void **)&g.n = dlsym(h, s)))                                                       \
		return fprintf(stderr, "FAIL: no %s\n", s), 1;
	API(RESOLVE)
	t0 = now_us();
	if (g.create(NULL, &c))
		return fprintf(stderr, "FAIL: gdr_cache_create\n"), 1;
	create_ms = (now_us() - t0) / 1e3;
	g.istats(&is, sizeof(is));
	frees0 = is.frees[GDR_FREE_MEM_FREE];
	if (more_calls(2000)) {
		fprintf(stderr, "FAIL: the threads stopped calling once the driver was patched\n");
		_exit(1);
	}
	g.istats(&is, sizeof(is));
	rc = g.state(&why);
	printf("events: %s (%d: %s)\n", rc ? "NOT in effect" : "in effect", rc, why);
	printf("entries: %u in the one-byte form, %u with the other threads stopped; threads "
	       "stopped %u, moved out of an entry %u, stopped for %.3f ms in all\n",
	       is.entries_short, is.entries_stopped, is.threads_stopped, is.threads_moved,
	       is.stopped_ns / 1e6);
	printf("frees of the threads seen by the hooks since the patch: %llu\n",
	       (unsigned long long)(is.frees[GDR_FREE_MEM_FREE] - frees0));
	bad |= rc != 0 || is.frees[GDR_FREE_MEM_FREE] - frees0 < 1000;
	{
		CUdeviceptr p = 0;

		p_cuMemAlloc_v2(&p, 4 << 20);
		for (int i = 0; i < 2000 && p; i++) {
			struct gdr_region *r = NULL;
			uint64_t id = 0, live = 0;

			if (g.reg(c, NULL, (void *)(uintptr_t)p, 4096, 0, &r)) {
				bad = 1;
				break;
			}
			g.bid(r, &id);
			g.dereg(r);
			p_cuPointerGetAttribute(&live, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
			stale += id != live;
			p_cuMemFree_v2(p);
			p = 0;
			p_cuMemAlloc_v2(&p, 4 << 20);
		}
		if (p)
			p_cuMemFree_v2(p);
	}
	after = free_median();
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	printf("registrations checked: 2000, stale %d; thread calls %ld, failed %ld\n", stale,
	       calls, errors);
	printf("gdr_cache_create (loads and patches): %.2f ms; cuMemFree 2 MiB median: %.2f us "
	       "before the patch, %.2f us after (+%.2f us)\n",
	       create_ms, before, after, after - before);
	g.destroy(c);
	bad |= stale || errors;
	printf("%s\n", bad ? "FAIL" : "PASS");
	return bad;
}
