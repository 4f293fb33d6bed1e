/* SPDX-License-Identifier: MIT */
/*
 * The example rcache (examples/mem_monitor_rcache) under the torture pattern on a real GPU: threads
 * freeing and reallocating buffers (the driver hands the VA back at once, with a new BUFFER_ID)
 * while other threads register random ranges of them through the rcache, pin only (pd NULL: the GPU
 * machine has no NIC; the entry's pin, and its dma-buf fd where the backend has one, stand for the
 * MR). Every registration's CU_POINTER_ATTRIBUTE_BUFFER_ID, asked of the driver at the address, is
 * checked against the entry's and its pin's; the dma-buf fd must be open. At the end, with every
 * buffer freed, nothing may stay pinned (rcache entries, libgdrcache's pinned bytes).
 *
 * Usage: rcache_torture [seconds (20)] [getters (4)] [freers (2)]
 * Exit status: 0 no stale registration and nothing left pinned, 1 otherwise, 77 no GPU or no free
 * events in this process (then nothing is proven).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gdrcache.h>

#include "cu.h"
#include "rcache.h"

#define SLOTS 32

static const size_t sizes[] = { 4096, 65536, 1 << 20, 4 << 20, 3000, 6 << 20 };

static struct slot {
	pthread_rwlock_t lock; /* getters read; a free and its reallocation write */
	CUdeviceptr va;
	size_t size;
} slot[SLOTS];

static struct rcache *rc;
static CUcontext ctx;
static volatile int stop;
static uint64_t gets, stale, errors, frees, reused, dmabufs;

static uint64_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t driver_id(CUdeviceptr p)
{
	unsigned long long id = 0;

	return p_cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) ? 0 : id;
}

static void *getter(void *arg)
{
	uint64_t s = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;

	p_cuCtxSetCurrent(ctx);
	while (!stop) {
		struct slot *sl = &slot[next(&s) % SLOTS];
		struct rcache_region *r;
		uint64_t q, a, len, want, pin_id = 0, off;
		int fd, ret;

		pthread_rwlock_rdlock(&sl->lock);
		q = sl->size / 4;
		a = sl->va + (next(&s) % 2 ? 0 : (next(&s) % 4) * q);
		len = a == sl->va ? sl->size : q;
		want = driver_id(a);
		ret = rcache_get(rc, NULL, (void *)(uintptr_t)a, len, 0, &r);
		if (ret) {
			if (__atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED) <= 5)
				printf("rcache_get(%#" PRIx64 ", %" PRIu64 "): %s\n", a, len,
				       strerror(-ret));
			pthread_rwlock_unlock(&sl->lock);
			continue;
		}
		gdr_region_buffer_id(r->pin, &pin_id);
		if (!want || r->buffer_id != want || pin_id != want) {
			if (__atomic_add_fetch(&stale, 1, __ATOMIC_RELAXED) <= 5)
				printf("STALE: %#" PRIx64 " is BUFFER_ID %" PRIu64
				       ", entry %" PRIu64 ", pin %" PRIu64 "\n",
				       a, want, r->buffer_id, pin_id);
		}
		if (gdr_region_dmabuf(r->pin, &fd, &off) == 0) {
			if (fcntl(fd, F_GETFD) == -1)
				__atomic_add_fetch(&stale, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&dmabufs, 1, __ATOMIC_RELAXED);
		}
		rcache_put(r);
		pthread_rwlock_unlock(&sl->lock);
		__atomic_add_fetch(&gets, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void *freer(void *arg)
{
	uint64_t s = (uintptr_t)arg * 0x2545f4914f6cdd1dull + 7;

	p_cuCtxSetCurrent(ctx);
	while (!stop) {
		struct slot *sl = &slot[next(&s) % SLOTS];
		CUdeviceptr old;

		pthread_rwlock_wrlock(&sl->lock);
		old = sl->va;
		if (p_cuMemFree_v2(sl->va) || p_cuMemAlloc_v2(&sl->va, sl->size)) {
			__atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
			stop = 1;
		}
		pthread_rwlock_unlock(&sl->lock);
		__atomic_add_fetch(&frees, 1, __ATOMIC_RELAXED);
		if (sl->va == old)
			__atomic_add_fetch(&reused, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 20, ng = argc > 2 ? atoi(argv[2]) : 4;
	int nf = argc > 3 ? atoi(argv[3]) : 2, ret;
	char name[256] = "";
	pthread_t t[64];
	struct gdr_cache *cache;
	struct gdr_cache_stats cs;
	struct rcache_stats st;
	const char *why;
	struct timespec ts = { 0 };

	if (seconds < 1 || ng < 1 || nf < 1 || ng + nf > 64) {
		fprintf(stderr, "usage: rcache_torture [seconds] [getters] [freers]\n");
		return 2;
	}
	ret = cu_setup(name, sizeof(name));
	if (ret)
		return ret;
	p_cuCtxGetCurrent(&ctx);
	ret = gdr_mem_events_state(&why);
	if (ret) {
		printf("SKIP: free events not in effect (%s): %s\n", strerror(-ret), why);
		return 77;
	}
	if (gdr_cache_create(NULL, &cache) ||
	    rcache_create(&(struct rcache_params){ .cache = cache, .max_unused_entries = 64 },
			  &rc)) {
		printf("FAIL: cache or rcache could not be made\n");
		return 1;
	}
	for (int i = 0; i < SLOTS; i++) {
		slot[i].size = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
		pthread_rwlock_init(&slot[i].lock, NULL);
		if (p_cuMemAlloc_v2(&slot[i].va, slot[i].size)) {
			printf("FAIL: cuMemAlloc\n");
			return 1;
		}
	}
	for (int i = 0; i < ng + nf; i++)
		pthread_create(&t[i], NULL, i < ng ? getter : freer, (void *)(uintptr_t)(i + 1));
	ts.tv_sec = seconds;
	nanosleep(&ts, NULL);
	stop = 1;
	for (int i = 0; i < ng + nf; i++)
		pthread_join(t[i], NULL);

	rcache_get_stats(rc, &st);
	for (int i = 0; i < SLOTS; i++)
		p_cuMemFree_v2(slot[i].va);
	/* Every buffer freed: the callbacks released every entry, and libgdrcache its pins. */
	{
		struct rcache_stats end;

		rcache_get_stats(rc, &end);
		gdr_cache_get_stats(cache, &cs);
		printf("%s, %d s, %d getters, %d freers: %" PRIu64
		       " registrations checked (%" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
		       " with a dma-buf), %" PRIu64 " frees and reallocations (%" PRIu64
		       " at the same VA), %" PRIu64 " events, %" PRIu64 " invalidated, %" PRIu64
		       " deferred, %" PRIu64 " retries, belt %" PRIu64 ", errors %" PRIu64
		       "; stale %" PRIu64 "; after the last free: %" PRIu64
		       " rcache entries, %" PRIu64 " bytes pinned by libgdrcache\n",
		       name, seconds, ng, nf, gets, st.hits, st.misses, dmabufs, frees, reused,
		       st.events, st.invalidated, st.deferred, st.retries, st.belt, errors, stale,
		       end.regions, cs.pinned_bytes);
		ret = stale || errors || st.belt || end.regions || cs.pinned_bytes || !gets;
	}
	if (rcache_destroy(rc) || gdr_cache_destroy(cache))
		ret = 1;
	printf("%s\n", ret ? "FAIL" : "PASS: 0 stale");
	return ret;
}
