/* SPDX-License-Identifier: MIT */
/*
 * Randomized differential test of the cache against a simple oracle.
 *
 * It drives the fake CUDA driver (allocations of every kind, frees, reallocation at the same VA, VMM
 * unmap and remap) and the cache (gdr_reg on random sub-ranges, gdr_dereg, flush) with small limits,
 * so eviction runs all the time. After every operation it checks:
 *  - a registration names the allocation now at its address (BUFFER_ID) and its pin still maps the
 *    memory now at every page it was asked for (the fake backend's record of physical generations):
 *    no stale registration is ever returned;
 *  - the pinned range is 64 KiB-aligned and covers the request, and the MR (with a PD) covers it;
 *  - the cache's pinned bytes equal what the backend has pinned;
 *  - pinned bytes and entries exceed their limits only while no unreferenced entry is left;
 *  - no 64 KiB page is pinned twice, except while a replaced ("detached") entry is still held;
 * and at the end, after the last dereg and destroy, that no pin and no MR is left.
 *
 * Validation modes: "tag" (BUFFER_ID on every hit) and "events". In mode events the cache makes no
 * driver call on a hit and relies on free events: here the test publishes them itself, just before
 * each free, remap and unmap, as the library's interception of the driver's free functions does in
 * a real process. Mode "intercept" is events with that interception itself: frees, unmaps and
 * allocations go through the fake driver's entry points, which the library patched, and the frees
 * run on another thread (handed over and waited for, so the oracle's order holds), as an MPI
 * progress thread or PyTorch's allocator would free.
 *
 * With "chunks" after the mode (issue 11): two GPUs, allocations on either, stream-ordered pool
 * memory pinned as the pool's 32 MiB physical chunks (the fake backend then pins as the dmabuf
 * backend does: pool_by_chunk), and now and then a reset of GPU 1's primary context (through the
 * driver entry point, which the library intercepts), which frees GPU 1's context memory but not
 * pool or VMM memory; the oracle follows each slot's device. Limits are larger (a pin is 32 MiB).
 *
 * Usage: diff_test [operations] [seed] [tag|events|intercept] [chunks]
 *        (default 10,000,000, tag)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cache/cache.h"
#include "intercept/events.h"
#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"

#define KiB 1024ULL
#define MiB (1024 * KiB)
#define NSLOTS 24
#define NHELD 16

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "diff_test: FAILED at op %" PRIu64 " (seed %u): %s (%s:%d)\n", \
				op, seed, #cond, __FILE__, __LINE__);                      \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

enum kind { K_NONE, K_SMALL, K_MEDIUM, K_LARGE, K_POOL, K_VMM };

struct slot {
	enum kind kind;
	uint64_t va, size;      /* VMM: the reservation (two 2 MiB mappings) */
	int dev;                /* GPU (mode chunks: 0 or 1; VMM: 0) */
};

struct held {
	struct gdr_region *r;
	int slot;
	uint64_t a, len;
};

static struct slot slots[NSLOTS];
static struct held held[NHELD];
static int nheld;
static struct gdr_cache *cache;
static uint64_t op;
static unsigned seed;
static uint64_t rng_state;
static int orphans;            /* held registrations whose buffer was freed (a caller bug, survived) */
static uint64_t max_bytes = 8 * MiB, max_entries = 8;
static bool events_mode, intercept_mode, chunks_mode;
static struct gdr_backend_ops chunk_backend_ops; /* fake_backend_ops, pinning pools by chunk */

/* Mode events: what the interception of cuMemFree / cuMemUnmap / ... publishes. */
static void freeing(uint64_t va, uint64_t size)
{
	if (events_mode && !intercept_mode)
		gdr_events_push(va, size);
}

/* Mode intercept: the fake driver's entry points (patched by the library), on the free thread. */
int cuMemFree_v2(uint64_t p);
int cuMemFreeAsync(uint64_t p, void *stream);
int cuMemUnmap(uint64_t p, size_t size);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemAllocAsync(uint64_t *p, size_t size, void *stream);
int cuDevicePrimaryCtxReset_v2(int dev);
int cuCtxSetCurrent(void *ctx);

enum { F_NONE, F_FREE, F_FREE_ASYNC, F_UNMAP, F_RESET, F_QUIT };
static const char *const free_fn[] = { [F_FREE] = "cuMemFree_v2",
				       [F_FREE_ASYNC] = "cuMemFreeAsync",
				       [F_UNMAP] = "cuMemUnmap",
				       [F_RESET] = "cuDevicePrimaryCtxReset_v2" };
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int what, rc;
	uint64_t va, size;
} ft = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, F_NONE, 0, 0, 0 };

static void *free_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&ft.lock);
	for (;;) {
		while (ft.what == F_NONE)
			pthread_cond_wait(&ft.cond, &ft.lock);
		if (ft.what == F_QUIT)
			break;
		ft.rc = ft.what == F_FREE ? cuMemFree_v2(ft.va) :
			ft.what == F_FREE_ASYNC ? cuMemFreeAsync(ft.va, NULL) :
			ft.what == F_RESET ? cuDevicePrimaryCtxReset_v2((int)ft.va) :
			cuMemUnmap(ft.va, ft.size);
		ft.what = F_NONE;
		pthread_cond_broadcast(&ft.cond);
	}
	pthread_mutex_unlock(&ft.lock);
	return NULL;
}

/* A free handed to the free thread returns in microseconds: its deadline (GDR_TEST_WAIT_SCALE). */
#define FREE_WAIT_MS 60000

/* A free as the program makes it: the fake's control call, or the driver entry on the free thread. */
static int free_call(int what, uint64_t va, uint64_t size)
{
	int64_t deadline = gdr_deadline_ms(FREE_WAIT_MS);
	int rc;

	if (!intercept_mode && what == F_RESET) /* the entry point: the library sees it in any mode */
		return cuDevicePrimaryCtxReset_v2((int)va);
	if (!intercept_mode)
		return what == F_FREE ? fake_cuda_free(va) : what == F_FREE_ASYNC ?
			fake_cuda_free_async(va) : fake_cuda_vmm_unmap(va, size);
	pthread_mutex_lock(&ft.lock);
	ft.what = what, ft.va = va, ft.size = size;
	pthread_cond_broadcast(&ft.cond);
	while (ft.what != F_NONE) {
		struct timespec ts = { deadline / 1000000000, deadline % 1000000000 };

		if (pthread_cond_clockwait(&ft.cond, &ft.lock, CLOCK_MONOTONIC, &ts) == ETIMEDOUT &&
		    ft.what != F_NONE) {
			fprintf(stderr,
				"diff_test: FAILED at op %" PRIu64
				" (seed %u): the free thread's %s(%#" PRIx64
				") did not return within %lld s\n",
				op, seed, free_fn[what], va,
				(long long)(FREE_WAIT_MS / 1000 * gdr_deadline_scale()));
			_exit(1); /* not exit(): that thread may hold the library's locks */
		}
	}
	rc = ft.rc;
	pthread_mutex_unlock(&ft.lock);
	return rc;
}

static int probe_simulated(const char **why)
{
	(void)why;
	return 0;
}
static struct {
	uint64_t allocs, frees, reallocs, remaps, regs, reg_fail, deregs, flushes, with_pd, resets;
} n;

static uint64_t rnd(void)
{
	/* xorshift64*: fast and good enough to explore orders */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

static uint64_t rnd_range(uint64_t lo, uint64_t hi)
{
	return lo + rnd() % (hi - lo + 1);
}

static uint64_t alloc_kind(enum kind k, uint64_t size, int dev)
{
	uint64_t p = 0;

	if (!intercept_mode)
		return k == K_POOL ? fake_cuda_alloc_async_on(dev, size) : fake_cuda_alloc_on(dev, size);
	if (dev)
		cuCtxSetCurrent(fake_cuda_primary_context(dev));
	if (k == K_POOL)
		cuMemAllocAsync(&p, size, NULL);
	else
		cuMemAlloc_v2(&p, size);
	if (dev)
		cuCtxSetCurrent(fake_cuda_primary_context(0));
	return p;
}

static void slot_alloc(int i)
{
	struct slot *s = &slots[i];
	static const uint64_t small[] = { 512, 4096, 8192, 12288, 65536 };

	s->kind = (enum kind)rnd_range(K_SMALL, K_VMM);
	s->dev = chunks_mode && s->kind != K_VMM ? (int)(rnd() % 2) : 0;
	switch (s->kind) {
	case K_SMALL: s->size = small[rnd() % 5]; break;
	case K_MEDIUM: s->size = rnd_range(64, 1024) * KiB; break;
	case K_LARGE: s->size = rnd_range(2, 6) * MiB; break; /* some above the 2 MiB pin cap */
	case K_POOL: /* chunks: now and then one that straddles two 32 MiB chunks */
		s->size = chunks_mode && rnd() % 8 == 0 ? rnd_range(8, 40) * MiB :
							 rnd_range(1, 512) * KiB;
		break;
	case K_VMM:
		s->size = 4 * MiB;
		s->va = fake_cuda_vmm_reserve(s->size);
		CHECK(s->va);
		CHECK(fake_cuda_vmm_map(s->va, 2 * MiB) == 0);
		CHECK(fake_cuda_vmm_map(s->va + 2 * MiB, 2 * MiB) == 0);
		n.allocs++;
		return;
	default: break;
	}
	s->va = alloc_kind(s->kind, s->size, s->dev);
	CHECK(s->va);
	n.allocs++;
}

/* Mode chunks: GPU 1's primary context reset. Its context memory goes (a held registration of it
 * becomes a caller's bug, survived); its pool memory, and everything on GPU 0, stays. */
static void gpu1_reset(void)
{
	for (int i = 0; i < NSLOTS; i++) {
		struct slot *s = &slots[i];

		if (s->kind == K_NONE || s->kind == K_POOL || s->kind == K_VMM || s->dev != 1)
			continue;
		for (int h = 0; h < nheld; h++)
			if (held[h].slot == i) {
				held[h].slot = -1;
				orphans++;
			}
		s->kind = K_NONE;
	}
	CHECK(free_call(F_RESET, 1, 0) == 0);
	for (int i = 0; i < NSLOTS; i++)
		if (slots[i].kind != K_NONE)
			CHECK(fake_cuda_buffer_id(slots[i].va) != 0);
	n.resets++;
}

static void slot_free(int i)
{
	struct slot *s = &slots[i];

	for (int h = 0; h < nheld; h++)
		if (held[h].slot == i) {
			held[h].slot = -1; /* the caller freed a buffer it still has registered */
			orphans++;
		}
	freeing(s->va, s->kind == K_POOL ? 0 : s->size);
	if (s->kind == K_VMM) {
		CHECK(free_call(F_UNMAP, s->va, 2 * MiB) == 0);
		CHECK(free_call(F_UNMAP, s->va + 2 * MiB, 2 * MiB) == 0);
		CHECK(fake_cuda_vmm_free(s->va, s->size) == 0);
	} else if (s->kind == K_POOL) {
		CHECK(free_call(F_FREE_ASYNC, s->va, 0) == 0);
	} else {
		CHECK(free_call(F_FREE, s->va, 0) == 0);
	}
	s->kind = K_NONE;
	n.frees++;
}

static void slot_realloc(int i)
{
	struct slot *s = &slots[i];
	enum kind k = s->kind;
	uint64_t va = s->va, size = s->size, old = fake_cuda_buffer_id(va);

	if (k == K_VMM) {
		/* unmap and remap one mapping at the same VA: a new id for the same addresses */
		uint64_t m = va + (rnd() & 1) * 2 * MiB;

		for (int h = 0; h < nheld; h++)
			if (held[h].slot == i) {
				held[h].slot = -1;
				orphans++;
			}
		freeing(m, 2 * MiB);
		CHECK(free_call(F_UNMAP, m, 2 * MiB) == 0);
		CHECK(fake_cuda_vmm_map(m, 2 * MiB) == 0);
		n.remaps++;
		return;
	}
	slot_free(i);
	s->kind = k;
	s->size = size;
	s->va = alloc_kind(k, size, s->dev);
	CHECK(s->va);
	CHECK(fake_cuda_buffer_id(s->va) > old);
	n.reallocs++;
	(void)va;
}

static bool slot_held(int i)
{
	for (int h = 0; h < nheld; h++)
		if (held[h].slot == i)
			return true;
	return false;
}

static void do_reg(void)
{
	int i = (int)(rnd() % NSLOTS), h;
	struct slot *s = &slots[i];
	struct gdr_region *r = NULL;
	struct ibv_pd *pd = (rnd() % 4 == 0) ? FAKE_PD : NULL;
	uint64_t a, len, base, plen, id;
	int rc;

	if (s->kind == K_NONE || nheld == NHELD)
		return;
	a = s->va + rnd() % s->size;
	len = 1 + rnd() % (s->va + s->size - a);
	if (rnd() % 2)
		len = len > 64 * KiB ? rnd_range(1, 64 * KiB) : len;
	rc = gdr_reg(cache, pd, (void *)(uintptr_t)a, len, pd ? 1 : 0, &r);
	n.regs++;
	if (rc) {
		/* The only acceptable failure: nothing left to evict, every pin referenced. */
		CHECK(rc == -ENOMEM || rc == -ENOSPC);
		CHECK(r == NULL);
		n.reg_fail++;
		return;
	}
	n.with_pd += pd != NULL;
	CHECK(gdr_region_range(r, &base, &plen) == 0);
	CHECK(base % (64 * KiB) == 0 && plen % (64 * KiB) == 0);
	CHECK(base <= a && a + len <= base + plen);
	CHECK(gdr_region_buffer_id(r, &id) == 0);
	if (id != fake_cuda_buffer_id(a))
		fprintf(stderr, "slot %d kind %d va %#llx size %#llx a %#llx len %#llx: id %llu now %llu "
			"record [%#llx +%#llx) magic %#x entry [%#llx +%#llx) state %u\n", i,
			s->kind, (unsigned long long)s->va, (unsigned long long)s->size,
			(unsigned long long)a, (unsigned long long)len, (unsigned long long)id,
			(unsigned long long)fake_cuda_buffer_id(a), (unsigned long long)r->start,
			(unsigned long long)r->size, r->magic, (unsigned long long)r->entry->pin.base,
			(unsigned long long)r->entry->pin.len, r->entry->state);
	CHECK(id == fake_cuda_buffer_id(a));                  /* not a stale allocation */
	CHECK(fake_backend_pin_current(r, a, len));         /* not stale memory */
	if (pd) {
		struct ibv_mr *mr;

		CHECK(gdr_region_mr(r, &mr) == 0 && mr);
		CHECK((uintptr_t)mr->addr <= a && a + len <= (uintptr_t)mr->addr + mr->length);
	}
	h = nheld++;
	held[h] = (struct held){ .r = r, .slot = i, .a = a, .len = len };
}

static void do_dereg(void)
{
	int h;

	if (!nheld)
		return;
	h = (int)(rnd() % nheld);
	if (held[h].slot < 0)
		orphans--;
	CHECK(gdr_dereg(held[h].r) == 0);
	held[h] = held[--nheld];
	n.deregs++;
}

static void check_invariants(void)
{
	struct gdr_cache_stats st;

	CHECK(gdr_cache_get_stats(cache, &st) == 0);
	CHECK(st.pinned_bytes == fake_be.outstanding_bytes);
	CHECK(st.entries == fake_be.outstanding);
	if (st.pinned_bytes > max_bytes || st.entries > max_entries) {
		/* over the limits only by held entries */
		for (struct gdr_entry *e = cache->lru; e; e = e->next)
			CHECK(gdr_entry_holds(cache, e) > 0);
	}
	/* A page is pinned twice only while a replaced (detached) entry is still held. */
	if (!st.detached)
		CHECK(fake_be.double_pinned_now == 0);
	CHECK(fake_be.bad_pins == 0);
}

int main(int argc, char **argv)
{
	uint64_t ops = argc > 1 ? strtoull(argv[1], NULL, 0) : 10000000ULL;
	struct gdr_cache_attr attr = {
		.field_mask = GDR_CACHE_ATTR_MAX_BYTES | GDR_CACHE_ATTR_MAX_ENTRIES |
			      GDR_CACHE_ATTR_MAX_PIN_BYTES,
		.max_bytes = max_bytes,
		.max_entries = max_entries,
		.max_pin_bytes = 2 * MiB,
	};
	struct gdr_cache_stats st;

	seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 0) : 20261121u;
	chunks_mode = argc > 4 && !strcmp(argv[4], "chunks");
	if (chunks_mode) {
		max_bytes = 160 * MiB;
		max_entries = 8;
		attr.max_bytes = max_bytes;
		chunk_backend_ops = fake_backend_ops;
		chunk_backend_ops.pool_by_chunk = true;
	}
	intercept_mode = argc > 3 && !strcmp(argv[3], "intercept");
	events_mode = intercept_mode || (argc > 3 && !strcmp(argv[3], "events"));
	attr.field_mask |= GDR_CACHE_ATTR_VALIDATE;
	attr.validate = events_mode ? GDR_VALIDATE_EVENTS : GDR_VALIDATE_TAG;
	pthread_t freer;

	if (intercept_mode)
		pthread_create(&freer, NULL, free_thread, NULL);
	else
		fake_seams.events_probe = probe_simulated;
	rng_state = 0x9e3779b97f4a7c15ULL ^ seed;
	fake_verbs_install();
	fake_backend_reset();
	fake_be.bar_bytes = chunks_mode ? 200 * MiB : 10 * MiB; /* BAR exhaustion: evict, retry */
	if (chunks_mode)
		CHECK(fake_cuda_set_device_count(2) == 0);
	if (fake_cache_create(&attr, chunks_mode ? &chunk_backend_ops : &fake_backend_ops,
				 &cache)) {
		fprintf(stderr, "diff_test: cannot create the cache\n");
		return 1;
	}
	for (int i = 0; i < NSLOTS / 2; i++)
		slot_alloc(i);

	for (op = 0; op < ops; op++) {
		unsigned k = (unsigned)(rnd() % 100);
		int i = (int)(rnd() % NSLOTS);

		if (k < 40)
			do_reg();
		else if (k < 80)
			do_dereg();
		else if (k < 87) {
			if (slots[i].kind == K_NONE)
				slot_alloc(i);
		} else if (k < 99) {
			/* Free (or reallocate) mostly buffers nobody holds; now and then a held one. */
			if (slots[i].kind != K_NONE && (!slot_held(i) || rnd() % 50 == 0)) {
				if (k < 93)
					slot_free(i);
				else
					slot_realloc(i);
			}
		} else if (chunks_mode && rnd() % 40 == 0) {
			gpu1_reset();
		} else if (rnd() % 20 == 0) {
			CHECK(gdr_cache_flush(cache) >= 0);
			n.flushes++;
		}
		check_invariants();
	}

	while (nheld)
		do_dereg();
	CHECK(gdr_cache_get_stats(cache, &st) == 0);
	CHECK(gdr_cache_destroy(cache) == 0);
	if (intercept_mode) {
		pthread_mutex_lock(&ft.lock);
		ft.what = F_QUIT;
		pthread_cond_broadcast(&ft.cond);
		pthread_mutex_unlock(&ft.lock);
		pthread_join(freer, NULL);
	}
	CHECK(fake_be.outstanding == 0);          /* no pin leaked */
	CHECK(fake_be.outstanding_bytes == 0);
	CHECK(fake_verbs.outstanding == 0);       /* no MR leaked */
	CHECK(st.validate_mode == (uint64_t)attr.validate);
	/* (a reset goes through the intercepted entry point in every mode: a tag cache applies it) */
	CHECK(events_mode ? st.tag_checks == 0 : chunks_mode || st.events == 0);
	printf("diff_test: %" PRIu64 " operations (seed %u, validation %s): %" PRIu64 " gdr_reg (%" PRIu64
	       " with a PD, %" PRIu64 " refused for lack of pinnable space), %" PRIu64 " gdr_dereg, %"
	       PRIu64 " allocs, %" PRIu64 " frees, %" PRIu64 " reallocs at the same VA, %" PRIu64
	       " VMM remaps, %" PRIu64 " flushes\n",
	       ops, seed, intercept_mode ? "events, intercepted" : events_mode ? "events" : "tag", n.regs, n.with_pd, n.reg_fail, n.deregs, n.allocs, n.frees, n.reallocs,
	       n.remaps, n.flushes);
	if (chunks_mode)
		printf("diff_test: two GPUs, pools pinned by 32 MiB chunk: %" PRIu64 " resets of GPU 1's "
		       "primary context\n", n.resets);
	printf("diff_test: cache: %" PRIu64 " hits (%" PRIu64 " lock-free), %" PRIu64 " misses, %"
	       PRIu64 " stale, %" PRIu64 " free events, %" PRIu64 " tag checks, %" PRIu64
	       " evictions, %" PRIu64 " pins, %" PRIu64 " retried after BAR exhaustion, %" PRIu64
	       " merged; peak pinned %" PRIu64 " bytes; 0 stale registrations returned, 0 pins "
	       "leaked\n",
	       st.hits, st.fast_hits, st.misses, st.stale, st.events, st.tag_checks, st.evictions, st.pins, st.fail_pin_retried,
	       st.overlap_merged, st.pinned_bytes_peak);
	return 0;
}
