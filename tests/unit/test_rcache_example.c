/* SPDX-License-Identifier: MIT */
/*
 * The example rcache (examples/mem_monitor_rcache/rcache.c, compiled in) over the fake CUDA driver
 * (tests/fake), the fake pinning backend and fake verbs (tests/support), under libgdrcache's
 * interception of the driver's frees:
 *  - a differential run: a model of which allocation (BUFFER_ID) lives at each VA against what the
 *    rcache returns, with random gets, puts, frees and reallocations at the VAs the driver reuses;
 *    every returned entry's pin and MR must be of the allocation live there (0 stale), and a free
 *    must leave no MR of the freed allocation that no one holds (10,000,000 operations in the plain
 *    build, 12 s on a 2-core machine; a twentieth under a sanitizer; RCACHE_OPS overrides);
 *  - the same with the dmabuf backend and dma-buf MRs, and pin only (no PD);
 *  - four threads, two freeing and reallocating while two get and put;
 *  - a free on a thread that holds the rcache lock (the queue path), a free while the entry is
 *    held, and a free by every route the fake driver has: a direct call, dlsym, cuGetProcAddress,
 *    and one the interception does not see (caught by the next allocation's event).
 * The test's verbs record, per MR, the BUFFER_ID of the memory it was made on: an MR is stale when
 * that is not the allocation the model has at the entry's VA.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "cuda/cuda_abi.h"
#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "shard.h"
#include "rcache.h"

#define KiB 1024ULL
#define MiB (1024ULL * KiB)

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* The fake's exported entries (patched by the library: these are intercepted frees). */
gdr_CUresult cuMemAlloc_v2(gdr_CUdeviceptr *p, size_t n);
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);
gdr_CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, uint64_t flags,
				 int *symbolStatus);

static struct gdr_cache *cache;
static struct rcache *rc;

/* ---- the test's verbs: the fakes', and what each MR was made on ---------------------------------- */

static pthread_mutex_t mrs_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *mr_id; /* by lkey / 2: BUFFER_ID the MR was made on; 0: deregistered */
static size_t mr_cap;
static uint32_t *live_of; /* by BUFFER_ID: MRs registered on it now */
static size_t live_cap;
static uint64_t mrs_live, mr_bad_dmabuf, mr_unknown;
/* Where set: the next MR registration (under the rcache lock) frees this allocation first. */
static uint64_t free_in_reg;

static void grow(void **v, size_t *cap, size_t need, size_t elem)
{
	size_t cap2 = *cap ? *cap : 4096;

	while (cap2 <= need)
		cap2 *= 2;
	if (cap2 == *cap)
		return;
	*v = realloc(*v, cap2 * elem);
	assert_non_null(*v);
	memset((char *)*v + *cap * elem, 0, (cap2 - *cap) * elem);
	*cap = cap2;
}

static void note_mr(struct ibv_mr *mr, uint64_t id)
{
	pthread_mutex_lock(&mrs_lock);
	grow((void **)&mr_id, &mr_cap, mr->lkey / 2, sizeof(*mr_id));
	grow((void **)&live_of, &live_cap, id, sizeof(*live_of));
	mr_id[mr->lkey / 2] = id;
	live_of[id]++;
	mrs_live++;
	pthread_mutex_unlock(&mrs_lock);
}

/* The BUFFER_ID an MR was made on, 0 once deregistered. */
static uint64_t mr_made_on(const struct ibv_mr *mr)
{
	uint64_t id;

	pthread_mutex_lock(&mrs_lock);
	id = mr->lkey / 2 < mr_cap ? mr_id[mr->lkey / 2] : 0;
	pthread_mutex_unlock(&mrs_lock);
	return id;
}

/* MRs registered now on allocation id. */
static unsigned mrs_on(uint64_t id)
{
	unsigned n;

	pthread_mutex_lock(&mrs_lock);
	n = id < live_cap ? live_of[id] : 0;
	pthread_mutex_unlock(&mrs_lock);
	return n;
}

static uint64_t mrs_now(void)
{
	uint64_t n;

	pthread_mutex_lock(&mrs_lock);
	n = mrs_live;
	pthread_mutex_unlock(&mrs_lock);
	return n;
}

static void maybe_free_in_reg(void)
{
	uint64_t va = free_in_reg;

	if (va) {
		free_in_reg = 0;
		assert_int_equal(cuMemFree_v2(va), GDR_CUDA_SUCCESS);
	}
}

static struct ibv_mr *t_reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	struct ibv_mr *mr;

	maybe_free_in_reg();
	mr = fake_seams.verbs->reg_mr(pd, addr, len, iova, access);
	if (mr)
		note_mr(mr, fake_cuda_buffer_id((uintptr_t)addr));
	return mr;
}

static struct ibv_mr *t_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova,
				      int fd, int access)
{
	uint64_t va = 0, size = 0;
	struct ibv_mr *mr;

	maybe_free_in_reg();
	mr = fake_seams.verbs->reg_dmabuf_mr(pd, off, len, iova, fd, access);
	if (!mr)
		return NULL;
	/* The memory the MR describes is the dma-buf's, at off: it must be the VA asked for. */
	if (fake_cuda_dmabuf_range(fd, &va, &size) || va + off != iova || off + len > size)
		__atomic_add_fetch(&mr_bad_dmabuf, 1, __ATOMIC_RELAXED);
	note_mr(mr, fake_cuda_buffer_id(va + off));
	return mr;
}

/* Where set: t_dereg_mr calls it first (on the releasing thread, under the rcache lock). */
static void (*dereg_pause)(void);

static int t_dereg_mr(struct ibv_mr *mr)
{
	if (dereg_pause)
		dereg_pause();
	pthread_mutex_lock(&mrs_lock);
	if (mr->lkey / 2 < mr_cap && mr_id[mr->lkey / 2]) {
		live_of[mr_id[mr->lkey / 2]]--;
		mr_id[mr->lkey / 2] = 0;
		mrs_live--;
	} else { /* not registered now (or made before this case began) */
		mr_unknown++;
	}
	pthread_mutex_unlock(&mrs_lock);
	return fake_seams.verbs->dereg_mr(mr);
}

static const struct rcache_verbs test_verbs = {
	.reg_mr = t_reg_mr,
	.reg_dmabuf_mr = t_reg_dmabuf_mr,
	.dereg_mr = t_dereg_mr,
};

/* ---- set-up ---------------------------------------------------------------------------------------- */

enum pins { PINS_FAKE, PINS_DMABUF };

static void make(enum pins pins, enum rcache_mr_route route, uint64_t max_unused)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				    .validate = GDR_VALIDATE_EVENTS };
	struct rcache_params p = { .route = route,
				   .max_unused_entries = max_unused,
				   .verbs = &test_verbs };

	if (pins == PINS_DMABUF) {
		a.field_mask |= GDR_CACHE_ATTR_BACKEND;
		a.backend = GDR_BACKEND_DMABUF;
	}
	assert_int_equal(fake_cache_create(&a, pins == PINS_FAKE ? &fake_backend_ops : NULL,
					   &cache),
			 0);
	p.cache = cache;
	assert_int_equal(rcache_create(&p, &rc), 0);
}

static int setup(void **state)
{
	(void)state;
	fakes_reset();
	free_in_reg = 0;
	mr_bad_dmabuf = 0;
	/* what a failed case left behind is not the next one's */
	pthread_mutex_lock(&mrs_lock);
	mrs_live = mr_unknown = 0;
	if (mr_id)
		memset(mr_id, 0, mr_cap * sizeof(*mr_id));
	if (live_of)
		memset(live_of, 0, live_cap * sizeof(*live_of));
	pthread_mutex_unlock(&mrs_lock);
	return 0;
}

static int teardown(void **state)
{
	struct rcache *r = rc;
	struct gdr_cache *c = cache;
	int r_rc = r ? rcache_destroy(r) : 0, c_rc = c ? gdr_cache_destroy(c) : 0;

	(void)state;
	rc = NULL;
	cache = NULL;
	assert_int_equal(r_rc, 0);
	assert_int_equal(c_rc, 0);
	assert_int_equal(mrs_now(), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	assert_int_equal(fake_be.outstanding, 0);
	return 0;
}

static struct rcache_stats stats(void)
{
	struct rcache_stats s;

	rcache_get_stats(rc, &s);
	return s;
}

static uint64_t alloc(size_t n)
{
	gdr_CUdeviceptr p = 0;

	assert_int_equal(cuMemAlloc_v2(&p, n), GDR_CUDA_SUCCESS);
	return p;
}

/* ---- the routes to a free -------------------------------------------------------------------------- */

typedef gdr_CUresult (*free_fn)(gdr_CUdeviceptr);
static free_fn free_by_dlsym, free_by_procaddr;

static void resolve_frees(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	int status = -1;

	assert_non_null(h);
	*(void **)&free_by_dlsym = dlsym(h, "cuMemFree_v2");
	assert_non_null(free_by_dlsym);
	assert_int_equal(cuGetProcAddress_v2("cuMemFree", (void **)&free_by_procaddr, 12000, 0,
					     &status),
			 GDR_CUDA_SUCCESS);
	assert_non_null(free_by_procaddr);
	dlclose(h);
}

enum route { BY_CALL, BY_DLSYM, BY_PROCADDR, ROUTES };

static void free_by(enum route r, uint64_t va)
{
	gdr_CUresult rc2 = r == BY_CALL    ? cuMemFree_v2(va)
			   : r == BY_DLSYM ? free_by_dlsym(va)
					   : free_by_procaddr(va);

	assert_int_equal(rc2, GDR_CUDA_SUCCESS);
}

/* ---- checking what the rcache returned ------------------------------------------------------------ */

static uint64_t stale_seen;

/* Whether r is a registration of [a, a+len) of allocation id (and says why not, for the first few). */
static bool fresh(const struct rcache_region *r, struct ibv_pd *pd, uint64_t a, uint64_t len,
		  uint64_t id)
{
	uint64_t pin_id = 0, mr_on = pd ? mr_made_on(r->mr) : id;
	bool ok = r->start <= a && a + len <= r->end && r->pd == pd && r->buffer_id == id &&
		  gdr_region_buffer_id(r->pin, &pin_id) == 0 && pin_id == id && mr_on == id &&
		  (pd ? r->mr != NULL : r->mr == NULL);

	if (ok && !pd && cache && fake_be.pins)
		ok = fake_backend_pin_current(r->pin, a, len);
	if (!ok && __atomic_add_fetch(&stale_seen, 1, __ATOMIC_RELAXED) <= 5)
		print_message("stale: [%#" PRIx64 ", +%#" PRIx64 ") of id %" PRIu64
			      " got [%#" PRIx64 ", %#" PRIx64 ") buffer %" PRIu64 " pin %" PRIu64
			      " mr %" PRIu64 "\n",
			      a, len, id, r->start, r->end, r->buffer_id, pin_id, mr_on);
	return ok;
}

/* ---- the differential run --------------------------------------------------------------------------- */

struct rng {
	uint64_t s;
};

static uint64_t next(struct rng *g)
{
	g->s ^= g->s << 13;
	g->s ^= g->s >> 7;
	g->s ^= g->s << 17;
	return g->s;
}

#define SLOTS 48
#define HOLDS 4
#define LOST 64 /* holds of freed allocations not yet put */

struct slot {
	uint64_t va, size, id;
	struct rcache_region *holds[HOLDS];
	unsigned nholds;
	pthread_rwlock_t lock; /* threaded run: gets read, a free writes */
};
struct lost_hold {
	struct rcache_region *r;
	uint64_t id;
};

static const uint64_t sizes[] = { 512, 4 * KiB, 48 * KiB, 256 * KiB, 2 * MiB, 6 * MiB };

static void slot_alloc(struct slot *s)
{
	s->va = alloc(s->size);
	s->id = fake_cuda_buffer_id(s->va);
	assert_int_not_equal(s->id, 0);
}

/* A request inside the slot: the whole of it, or one of its quarters, or its second half. */
static void pick_range(struct rng *g, const struct slot *s, uint64_t *a, uint64_t *len)
{
	unsigned k = next(g) % 6;
	uint64_t q = s->size / 4;

	*a = s->va;
	*len = s->size;
	if (k < 4) {
		*a = s->va + k * q;
		*len = q;
	} else if (k == 4) {
		*a = s->va + 2 * q;
		*len = 2 * q;
	}
}

static int pick_access(struct rng *g)
{
	return next(g) % 4 ? IBV_ACCESS_LOCAL_WRITE
			   : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
}

static void check_counts(bool with_mrs)
{
	struct rcache_stats s = stats();

	assert_int_equal(s.belt, 0);
	if (with_mrs)
		assert_int_equal(mrs_now(),
				 s.regions); /* every MR is an entry's, every entry has one */
	assert_int_equal(fake_verbs.outstanding, mrs_now());
	assert_int_equal(mr_bad_dmabuf, 0);
	assert_int_equal(mr_unknown, 0);
}

static uint64_t ops_for(uint64_t plain)
{
	const char *e = getenv("RCACHE_OPS");

	if (e)
		return strtoull(e, NULL, 0);
	return SANITIZED ? plain / 20 : plain;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void differential(enum pins pins, enum rcache_mr_route route, struct ibv_pd *pd,
			 uint64_t ops)
{
	static struct slot slot[SLOTS];
	struct lost_hold lost[LOST];
	unsigned nlost = 0;
	struct rng g = { 0x9e3779b97f4a7c15ull };
	uint64_t gets = 0, frees = 0, checked_frees = 0;
	int open0 = fake_cuda_open_dmabufs();
	double t0 = now_s();
	struct rcache_stats s;

	make(pins, route, 32);
	resolve_frees();
	stale_seen = 0;
	for (unsigned i = 0; i < SLOTS; i++) {
		slot[i] = (struct slot){ .size = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))] };
		slot_alloc(&slot[i]);
	}
	for (uint64_t op = 0; op < ops; op++) {
		struct slot *sl = &slot[next(&g) % SLOTS];
		unsigned what = next(&g) % 100;

		if (what < 55) { /* get, and hold it a while */
			struct rcache_region *r = NULL;
			uint64_t a, len;

			pick_range(&g, sl, &a, &len);
			if (sl->nholds == HOLDS) {
				rcache_put(sl->holds[0]);
				memmove(&sl->holds[0], &sl->holds[1],
					(HOLDS - 1) * sizeof(sl->holds[0]));
				sl->nholds--;
			}
			assert_int_equal(rcache_get(rc, pd, (void *)(uintptr_t)a, len,
						    pick_access(&g), &r),
					 0);
			fresh(r, pd, a, len, sl->id);
			sl->holds[sl->nholds++] = r;
			gets++;
		} else if (what < 95) { /* put one */
			if (sl->nholds) {
				unsigned k = next(&g) % sl->nholds;

				rcache_put(sl->holds[k]);
				sl->holds[k] = sl->holds[--sl->nholds];
			}
		} else { /* free by a route, then allocate the same size (the VA usually comes back) */
			uint64_t old = sl->id;
			bool held = false;

			if (next(&g) % 4 || nlost + HOLDS > LOST) {
				while (sl->nholds)
					rcache_put(sl->holds[--sl->nholds]);
			} else { /* held across the free: released at its put */
				held = sl->nholds > 0;
				while (sl->nholds)
					lost[nlost++] =
						(struct lost_hold){ sl->holds[--sl->nholds], old };
			}
			free_by((enum route)(next(&g) % ROUTES), sl->va);
			frees++;
			if (!held) {
				/* No MR of the freed allocation is left once its free returned. */
				assert_int_equal(mrs_on(old), 0);
				checked_frees++;
			}
			slot_alloc(sl);
			/* Now and then, the holds of freed memory are put: nothing of theirs is left. */
			if (nlost && next(&g) % 8 == 0) {
				while (nlost) {
					nlost--;
					rcache_put(lost[nlost].r);
					if (!nlost || lost[nlost - 1].id != lost[nlost].id)
						assert_int_equal(mrs_on(lost[nlost].id), 0);
				}
			}
		}
		if ((op & 0xffff) == 0)
			check_counts(pd != NULL);
	}
	check_counts(pd != NULL);
	s = stats();
	/* Everything put and freed: nothing registered, pinned or exported is left. */
	while (nlost)
		rcache_put(lost[--nlost].r);
	for (unsigned i = 0; i < SLOTS; i++) {
		while (slot[i].nholds)
			rcache_put(slot[i].holds[--slot[i].nholds]);
		assert_int_equal(cuMemFree_v2(slot[i].va), GDR_CUDA_SUCCESS);
	}
	assert_int_equal(mrs_now(), 0);
	assert_int_equal(stats().regions, 0);
	assert_int_equal(fake_be.outstanding, 0);
	assert_int_equal(fake_cuda_open_dmabufs(), open0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
	print_message("%" PRIu64 " operations%s in %.1f s: %" PRIu64 " gets (%" PRIu64
		      " hits, %" PRIu64 " misses, %" PRIu64 " retries), %" PRIu64 " frees (%" PRIu64
		      " checked), %" PRIu64 " entries invalidated, %" PRIu64 " evicted, %" PRIu64
		      " deferred, belt %" PRIu64 ", stale %" PRIu64 "\n",
		      ops, SANITIZED ? " (sanitizer build)" : "", now_s() - t0, gets, s.hits,
		      s.misses, s.retries, frees, checked_frees, s.invalidated, s.evicted,
		      s.deferred, s.belt, stale_seen);
	assert_int_equal(stale_seen, 0);
	assert_int_equal(s.misses + s.hits, s.gets);
	assert_true(s.invalidated > 0 && s.hits > 0);
}

static void test_diff_10m(void **state)
{
	(void)state;
	differential(PINS_FAKE, RCACHE_MR_VA, FAKE_PD, ops_for(10000000));
}

static void test_diff_short(void **state)
{
	(void)state;
	differential(PINS_FAKE, RCACHE_MR_VA, FAKE_PD, ops_for(200000));
}

static void test_diff_dmabuf(void **state)
{
	(void)state;
	differential(PINS_DMABUF, RCACHE_MR_DMABUF, FAKE_PD, ops_for(200000));
}

static void test_diff_pin_only(void **state)
{
	(void)state;
	differential(PINS_FAKE, RCACHE_MR_AUTO, NULL, ops_for(200000));
}

/* ---- four threads: two free and reallocate while two get and put --------------------------------- */

#define MT_SLOTS 24
static struct slot mt_slot[MT_SLOTS];
static uint64_t mt_ops, mt_frees, mt_gets, mt_left_mrs, mt_errors;

static void *mt_getter(void *arg)
{
	struct rng g = { (uintptr_t)arg * 0x2545f4914f6cdd1dull + 1 };

	for (uint64_t i = 0; i < mt_ops; i++) {
		struct slot *sl = &mt_slot[next(&g) % MT_SLOTS];
		struct rcache_region *r[2] = { NULL, NULL };
		uint64_t a, len;

		pthread_rwlock_rdlock(&sl->lock);
		for (int k = 0; k < 2; k++) {
			pick_range(&g, sl, &a, &len);
			if (rcache_get(rc, FAKE_PD, (void *)(uintptr_t)a, len, pick_access(&g),
				       &r[k])) {
				__atomic_add_fetch(&mt_errors, 1, __ATOMIC_RELAXED);
				r[k] = NULL;
				continue;
			}
			fresh(r[k], FAKE_PD, a, len, sl->id);
		}
		for (int k = 0; k < 2; k++)
			if (r[k])
				rcache_put(r[k]);
		pthread_rwlock_unlock(&sl->lock);
		__atomic_add_fetch(&mt_gets, 2, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void *mt_freer(void *arg)
{
	struct rng g = { (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 7 };

	for (uint64_t i = 0; i < mt_ops / 4; i++) {
		struct slot *sl = &mt_slot[next(&g) % MT_SLOTS];
		uint64_t old;

		pthread_rwlock_wrlock(&sl->lock);
		old = sl->id;
		free_by((enum route)(next(&g) % ROUTES), sl->va);
		/* no one held it: nothing of it may stay registered once the free returned */
		if (mrs_on(old))
			__atomic_add_fetch(&mt_left_mrs, 1, __ATOMIC_RELAXED);
		slot_alloc(sl);
		pthread_rwlock_unlock(&sl->lock);
		__atomic_add_fetch(&mt_frees, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_threads(void **state)
{
	pthread_t t[4];
	double t0 = now_s();
	struct rcache_stats s;

	(void)state;
	make(PINS_FAKE, RCACHE_MR_VA, 32);
	resolve_frees();
	stale_seen = mt_frees = mt_gets = mt_left_mrs = mt_errors = 0;
	mt_ops = ops_for(300000);
	for (unsigned i = 0; i < MT_SLOTS; i++) {
		mt_slot[i] = (struct slot){ .size = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))] };
		pthread_rwlock_init(&mt_slot[i].lock, NULL);
		slot_alloc(&mt_slot[i]);
	}
	for (uintptr_t i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL, i < 2 ? mt_getter : mt_freer,
						(void *)(i + 1)),
				 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	s = stats();
	check_counts(true);
	for (unsigned i = 0; i < MT_SLOTS; i++) {
		assert_int_equal(cuMemFree_v2(mt_slot[i].va), GDR_CUDA_SUCCESS);
		pthread_rwlock_destroy(&mt_slot[i].lock);
	}
	assert_int_equal(mrs_now(), 0);
	assert_int_equal(stats().regions, 0);
	print_message("4 threads in %.1f s: %" PRIu64 " gets (%" PRIu64 " hits), %" PRIu64
		      " frees, %" PRIu64 " invalidated, %" PRIu64 " deferred, belt %" PRIu64
		      ", MRs left after a free %" PRIu64 ", stale %" PRIu64 "\n",
		      now_s() - t0, mt_gets, s.hits, mt_frees, s.invalidated, s.deferred, s.belt,
		      mt_left_mrs, stale_seen);
	assert_int_equal(stale_seen, 0);
	assert_int_equal(mt_left_mrs, 0);
	assert_int_equal(mt_errors, 0);
}

/* ---- cases ---------------------------------------------------------------------------------------- */

/* An MR registration (under the rcache lock) frees another cached allocation on its thread: the
 * callback queues the event and the thread applies it before it unlocks, so the freed allocation's
 * MR is gone when rcache_get returns. */
static void test_free_under_rcache_lock(void **state)
{
	struct rcache_region *r;
	uint64_t a, b, b_id;
	struct rcache_stats s0, s;

	(void)state;
	make(PINS_FAKE, RCACHE_MR_VA, 64);
	a = alloc(4 * MiB);
	b = alloc(4 * MiB);
	b_id = fake_cuda_buffer_id(b);
	assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)b, 4 * MiB, 0, &r), 0);
	rcache_put(r);
	assert_int_equal(mrs_on(b_id), 1);
	s0 = stats();
	free_in_reg = b;
	assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)a, 4 * MiB, 0, &r), 0);
	assert_int_equal(free_in_reg, 0); /* it ran */
	s = stats();
	assert_int_equal(s.deferred, s0.deferred + 1);
	assert_int_equal(s.invalidated, s0.invalidated + 1);
	assert_int_equal(mrs_on(b_id), 0);
	assert_true(fresh(r, FAKE_PD, a, 4 * MiB, fake_cuda_buffer_id(a)));
	rcache_put(r);
	/* the VA comes back: a registration of the new allocation */
	assert_int_equal(alloc(4 * MiB), b);
	assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)b, 4 * MiB, 0, &r), 0);
	assert_true(fresh(r, FAKE_PD, b, 4 * MiB, fake_cuda_buffer_id(b)));
	rcache_put(r);
	assert_int_equal(stats().belt, 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
	assert_int_equal(mrs_now(), 0);
}

/* A free on one thread while another releases the freed memory's entry (a flush here; an eviction
 * the same): the free returns only once the MR is gone. The releasing thread stops inside the MR's
 * deregistration until the free has returned or 300 ms have passed, whichever is first: a free
 * that does not wait for the release (the entry's subscription already given up) returns while the
 * MR still exists. */
static int release_paused, free_returned;

static void pause_in_dereg(void)
{
	int64_t d = gdr_deadline_ms(300);

	__atomic_store_n(&release_paused, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&free_returned, __ATOMIC_ACQUIRE) && !gdr_deadline_passed(d))
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
}

static void *flusher(void *arg)
{
	(void)arg;
	rcache_flush(rc);
	return NULL;
}

static void test_free_during_release(void **state)
{
	struct rcache_region *r;
	uint64_t a, id;
	unsigned left;
	pthread_t t;

	(void)state;
	make(PINS_FAKE, RCACHE_MR_VA, 64);
	a = alloc(2 * MiB);
	id = fake_cuda_buffer_id(a);
	assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)a, 2 * MiB, 0, &r), 0);
	rcache_put(r);
	assert_int_equal(mrs_on(id), 1);
	release_paused = free_returned = 0;
	dereg_pause = pause_in_dereg;
	assert_int_equal(pthread_create(&t, NULL, flusher, NULL), 0);
	for (int64_t d = gdr_deadline_ms(10000); !__atomic_load_n(&release_paused, __ATOMIC_ACQUIRE);)
		if (gdr_deadline_passed(d))
			fail_msg("the flush never reached the MR's deregistration");
		else
			nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	left = mrs_on(id);
	__atomic_store_n(&free_returned, 1, __ATOMIC_RELEASE);
	assert_int_equal(gdr_join_until(t, gdr_deadline_ms(10000)), 0);
	dereg_pause = NULL;
	assert_int_equal(left, 0); /* no MR of the freed memory once its free returned */
	assert_int_equal(mrs_now(), 0);
	assert_int_equal(stats().regions, 0);
}

/* A free while the entry is held: out of the index at once, its MR kept until the put. */
static void test_free_while_held(void **state)
{
	struct rcache_region *r, *r2;
	uint64_t a, id;

	(void)state;
	make(PINS_FAKE, RCACHE_MR_VA, 64);
	a = alloc(64 * KiB);
	id = fake_cuda_buffer_id(a);
	assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)a, 64 * KiB, 0, &r), 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(mrs_on(id), 1);
	assert_int_equal(stats().cached, 0);
	assert_int_equal(alloc(64 * KiB), a);
	assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)a, 64 * KiB, 0, &r2), 0);
	assert_ptr_not_equal(r2, r);
	assert_true(fresh(r2, FAKE_PD, a, 64 * KiB, fake_cuda_buffer_id(a)));
	rcache_put(r);
	assert_int_equal(mrs_on(id), 0);
	rcache_put(r2);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(mrs_now(), 0);
}

/* Every route to a free reaches the callback; a free the interception never saw (the fake's own
 * control function) is caught by the allocation that reuses the VA. */
static void test_routes(void **state)
{
	struct rcache_region *r;

	(void)state;
	make(PINS_FAKE, RCACHE_MR_VA, 64);
	resolve_frees();
	for (int route = 0; route <= ROUTES; route++) {
		uint64_t a = alloc(4 * MiB), id = fake_cuda_buffer_id(a);

		assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)a, 4 * MiB, 0, &r), 0);
		rcache_put(r);
		assert_int_equal(mrs_on(id), 1);
		if (route < ROUTES) {
			free_by((enum route)route, a);
			assert_int_equal(mrs_on(id), 0);
			assert_int_equal(alloc(4 * MiB), a);
		} else {
			assert_int_equal(fake_cuda_free(a), 0);
			assert_int_equal(mrs_on(id), 1); /* nothing told it */
			assert_int_equal(alloc(4 * MiB), a);
			assert_int_equal(mrs_on(id), 0); /* the allocation's event did */
		}
		assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)a, 4 * MiB, 0, &r), 0);
		assert_true(fresh(r, FAKE_PD, a, 4 * MiB, fake_cuda_buffer_id(a)));
		rcache_put(r);
		assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	}
	assert_int_equal(stats().belt, 0);
	assert_int_equal(mrs_now(), 0);
}

/* Small allocations share a 2 MiB chunk: freeing one invalidates its entries, not its neighbours'. */
static void test_neighbours_kept(void **state)
{
	struct rcache_region *r;
	uint64_t a, b, c;
	struct rcache_stats s0;

	(void)state;
	make(PINS_FAKE, RCACHE_MR_VA, 64);
	a = alloc(4 * KiB);
	b = alloc(4 * KiB);
	c = alloc(4 * KiB);
	assert_int_equal(b, a + 4 * KiB);
	for (uint64_t p = a; p <= c; p += 4 * KiB) {
		assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)p, 4 * KiB, 0, &r), 0);
		rcache_put(r);
	}
	s0 = stats();
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().invalidated, s0.invalidated + 1);
	assert_int_equal(stats().cached, 2);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFree_v2(c), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().cached, 0);
	assert_int_equal(mrs_now(), 0);
}

/* The LRU keeps at most its bound of unreferenced entries; a flush releases them. */
static void test_lru_bound(void **state)
{
	struct rcache_region *r;
	uint64_t v[8];

	(void)state;
	make(PINS_FAKE, RCACHE_MR_VA, 4);
	for (int i = 0; i < 8; i++) {
		v[i] = alloc(64 * KiB);
		assert_int_equal(rcache_get(rc, FAKE_PD, (void *)(uintptr_t)v[i], 64 * KiB, 0, &r),
				 0);
		rcache_put(r);
	}
	assert_int_equal(stats().unused, 4);
	assert_int_equal(stats().evicted, 4);
	assert_int_equal(mrs_now(), 4);
	assert_int_equal(rcache_flush(rc), 4);
	assert_int_equal(mrs_now(), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(cuMemFree_v2(v[i]), GDR_CUDA_SUCCESS);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_free_under_rcache_lock, setup, teardown),
		cmocka_unit_test_setup_teardown(test_free_while_held, setup, teardown),
		cmocka_unit_test_setup_teardown(test_free_during_release, setup, teardown),
		cmocka_unit_test_setup_teardown(test_routes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_neighbours_kept, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lru_bound, setup, teardown),
		cmocka_unit_test_setup_teardown(test_diff_short, setup, teardown),
		cmocka_unit_test_setup_teardown(test_diff_dmabuf, setup, teardown),
		cmocka_unit_test_setup_teardown(test_diff_pin_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
		cmocka_unit_test_setup_teardown(test_diff_10m, setup, teardown),
	};

	return gdr_run_tests_sharded("rcache_example", tests, sizeof(tests) / sizeof(tests[0]));
}
