/* SPDX-License-Identifier: MIT */
/*
 * The public free events (gdr_mem_monitor_*, gdr_mem_events_*) against the real CUDA driver
 * (skips with 77 without a GPU). libcuda is loaded by the program before the library, as a
 * middleware's process has it:
 *   - a subscribed allocation freed through each route a program takes (the exported entry from
 *     dlsym, the pointer cuGetProcAddress hands out as the runtime takes it, cuMemFreeAsync, a VMM
 *     range's cuMemUnmap) reaches the callback before the free returns, and is invalid after;
 *   - 8 threads allocating, subscribing and freeing at once: every free's callback came before
 *     its free returned (each thread checks its own), and a monitor of everything saw at least
 *     every free;
 *   - the ring: each free's event is there after it returns.
 * With GDRCACHE_INTERCEPT=off (argv[1] "off"): the state is -EOPNOTSUPP and no monitor is made.
 * TAP-like lines; exit 0 all passed, 1 a failure, 77 no GPU.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu.h"
#include "gdrcache.h"

static int failed, passed;

#define OK(cond, ...)                                                                              \
	do {                                                                                       \
		if (cond) {                                                                        \
			__atomic_add_fetch(&passed, 1, __ATOMIC_RELAXED);                          \
			printf("ok - ");                                                           \
		} else {                                                                           \
			__atomic_add_fetch(&failed, 1, __ATOMIC_RELAXED);                          \
			printf("not ok - (%s:%d: %s) ", __FILE__, __LINE__, #cond);                \
		}                                                                                  \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
	} while (0)

#define MiB (1024ULL * 1024)
#define THREADS 8
#define ROUNDS 2000

typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
			   CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*sync_fn)(void);

/* Callbacks seen: all of them, and per thread the one of its own current free. */
static uint64_t seen_all;
static __thread uint64_t my_va, my_seen;

static void on_event(void *arg, const struct gdr_mem_event *ev)
{
	(void)arg;
	__atomic_add_fetch(&seen_all, 1, __ATOMIC_RELAXED);
	if (ev->kind == GDR_MEM_EVENT_CONTEXT ||
	    (my_va && ev->start <= my_va &&
	     (ev->len == 0 ? ev->start == my_va : my_va - ev->start < ev->len)))
		my_seen++;
}

static struct gdr_mem_monitor *mon;

static void one_free(free_fn fr, CUdeviceptr p, const char *route)
{
	int v0, v1;

	OK(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)p, 4096) == 0, "%s: subscribed",
	   route);
	v0 = gdr_mem_monitor_valid(mon, (void *)(uintptr_t)p, 4096);
	my_va = p;
	my_seen = 0;
	OK(fr(p) == CUDA_SUCCESS, "%s: freed", route);
	OK(my_seen == 1, "%s: the callback came before the free returned (%llu)", route,
	   (unsigned long long)my_seen);
	v1 = gdr_mem_monitor_valid(mon, (void *)(uintptr_t)p, 4096);
	OK(v0 == 1 && v1 == 0, "%s: valid %d before, %d after", route, v0, v1);
	gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)p, 4096);
	my_va = 0;
}

static free_fn async_free;
static CUresult free_async_default(CUdeviceptr p)
{
	return ((free_async_fn)(void *)async_free)(p, NULL);
}

static CUcontext main_ctx; /* the churning threads' context (a new thread has none) */

static void *churn(void *arg)
{
	unsigned bad = 0;

	(void)arg;
	if (p_cuCtxSetCurrent(main_ctx) != CUDA_SUCCESS)
		return (void *)(uintptr_t)ROUNDS;
	for (int i = 0; i < ROUNDS; i++) {
		CUdeviceptr p = 0;

		if (p_cuMemAlloc_v2(&p, (size_t)(64 << 10) << (i % 5)) != CUDA_SUCCESS) {
			bad++;
			continue;
		}
		if (gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)p, 4096)) {
			bad++;
			continue;
		}
		my_va = p;
		my_seen = 0;
		p_cuMemFree_v2(p);
		bad += my_seen == 0 || gdr_mem_monitor_valid(mon, (void *)(uintptr_t)p, 4096) != 0;
		gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)p, 4096);
		my_va = 0;
	}
	return (void *)(uintptr_t)bad;
}

int main(int argc, char **argv)
{
	char name[128] = "";
	const char *why = NULL;
	void *h, *fr = NULL;
	int rc = cu_setup(name, sizeof(name)), st;
	struct gdr_mem_monitor *all = NULL;
	pthread_t th[THREADS];
	uint64_t bad = 0, head, all0;
	CUdeviceptr p;

	if (rc)
		return rc;
	printf("# GPU 0: %s\n", name);
	st = gdr_mem_events_state(&why);
	printf("# free events: %d (%s)\n", st, why);
	if (argc > 1 && !strcmp(argv[1], "off")) {
		OK(st == -EOPNOTSUPP, "GDRCACHE_INTERCEPT=off: state %d", st);
		OK(gdr_mem_monitor_create(0, NULL, NULL, &mon) == -EOPNOTSUPP, "no monitor");
		printf("# %d passed, %d failed\n", passed, failed);
		return failed ? 1 : 0;
	}
	OK(st == 0, "free events in effect");
	if (st)
		return 1;
	OK(gdr_mem_monitor_create(0, on_event, NULL, &mon) == 0, "monitor");
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	OK(p_cuMemAlloc_v2(&p, 2 * MiB) == CUDA_SUCCESS, "cuMemAlloc");
	one_free(p_cuMemFree_v2, p, "dlsym(libcuda, cuMemFree_v2)");
	{
		gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
		CUdriverProcAddressQueryResult q;

		if (gpa && gpa("cuMemFree", &fr, 12000, 0, &q) == CUDA_SUCCESS && fr) {
			OK(p_cuMemAlloc_v2(&p, 2 * MiB) == CUDA_SUCCESS, "cuMemAlloc");
			one_free((free_fn)fr, p,
				 "cuGetProcAddress(cuMemFree) (the runtime's route)");
		} else {
			printf("# no cuGetProcAddress_v2: that route not tried\n");
		}
	}
	{
		alloc_async_fn aa = (alloc_async_fn)dlsym(h, "cuMemAllocAsync");
		sync_fn sync = (sync_fn)dlsym(h, "cuCtxSynchronize");

		async_free = (free_fn)dlsym(h, "cuMemFreeAsync");
		if (aa && async_free && sync && aa(&p, 2 * MiB, NULL) == CUDA_SUCCESS) {
			sync();
			one_free(free_async_default, p, "cuMemFreeAsync");
			sync();
		} else {
			printf("# no pool allocations here: cuMemFreeAsync not tried\n");
		}
	}
	{
		CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
					     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE,
							   .id = 0 } };
		CUmemAccessDesc acc = { .location = prop.location,
					.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		CUmemGenericAllocationHandle mh;
		CUdeviceptr va = 0;
		size_t g = 0;
		int n0;

		p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
		if (g && !p_cuMemAddressReserve(&va, 2 * g, 0, 0, 0) &&
		    !p_cuMemCreate(&mh, 2 * g, &prop, 0) && !p_cuMemMap(va, 2 * g, 0, mh, 0) &&
		    !p_cuMemSetAccess(va, 2 * g, &acc, 1)) {
			OK(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)(va + g), 4096) == 0,
			   "VMM: subscribed");
			my_va = va + g;
			my_seen = 0;
			n0 = gdr_mem_monitor_valid(mon, (void *)(uintptr_t)(va + g), 4096);
			OK(p_cuMemUnmap(va, 2 * g) == CUDA_SUCCESS, "VMM: unmapped");
			OK(n0 == 1 && my_seen == 1 &&
				   gdr_mem_monitor_valid(mon, (void *)(uintptr_t)(va + g), 4096) ==
					   0,
			   "VMM: cuMemUnmap reached the callback before it returned");
			gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)(va + g), 4096);
			my_va = 0;
			p_cuMemRelease(mh);
			p_cuMemAddressFree(va, 2 * g);
		} else {
			printf("# VMM not tried\n");
		}
	}

	/* threads at once; a monitor of everything beside */
	OK(gdr_mem_monitor_create(GDR_MONITOR_ALL, on_event, NULL, &all) == 0, "monitor of all");
	all0 = __atomic_load_n(&seen_all, __ATOMIC_RELAXED);
	head = gdr_mem_events_head();
	p_cuCtxGetCurrent(&main_ctx);
	for (int i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, churn, NULL);
	for (int i = 0; i < THREADS; i++) {
		void *r;

		pthread_join(th[i], &r);
		bad += (uintptr_t)r;
	}
	printf("# %d threads x %d frees: %llu callbacks, %llu ring events\n", THREADS, ROUNDS,
	       (unsigned long long)(__atomic_load_n(&seen_all, __ATOMIC_RELAXED) - all0),
	       (unsigned long long)(gdr_mem_events_head() - head));
	OK(bad == 0, "every free's callback before it returned, invalid after (%llu misses)",
	   (unsigned long long)bad);
	OK(__atomic_load_n(&seen_all, __ATOMIC_RELAXED) - all0 >= 2ull * THREADS * ROUNDS,
	   "the monitor of everything saw every free (and the subscribed one each of its own)");
	OK(gdr_mem_monitor_violations() == 0, "no callback rule broken");
	gdr_mem_monitor_destroy(all);
	gdr_mem_monitor_destroy(mon);
	printf("# %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
