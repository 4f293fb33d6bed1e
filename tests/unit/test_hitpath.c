/* SPDX-License-Identifier: MIT */
/* The lock-free hit path and the validation modes: hits served without the lock and, in mode events,
 * without a driver query; free events applied before any hit; lost events; the choice of mode;
 * holds across threads and double releases; releasing a PD's MRs. The interception that publishes
 * free events in a real process is simulated here by publishing them before each fake free (it is
 * tested on its own in test_events). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache/cache.h"
#include "cache/caches.h"
#include "intercept/events.h"
#include "deadline.h"
#include "shard.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "fixture.h"

#define MiB (1024ULL * 1024)

static struct gdr_cache *cache;
static int probe_rc;

static int probe_fake(const char **why)
{
	*why = "simulated probe failure";
	return probe_rc;
}

static struct gdr_cache *make(int mode)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE, .validate = mode };
	struct gdr_cache *c = NULL;

	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	return c;
}

static int setup(void **state)
{
	(void)state;
	fakes_reset();
	probe_rc = 0;
	fake_seams.events_probe = probe_fake;
	cache = make(GDR_VALIDATE_EVENTS);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fixture_end(&cache);
	return 0;
}

static struct gdr_cache_stats stats(void)
{
	return fixture_stats(cache);
}

static struct gdr_region *reg_pd(struct ibv_pd *pd, uint64_t a, uint64_t len)
{
	struct gdr_region *r = NULL;

	assert_int_equal(gdr_reg(cache, pd, (void *)(uintptr_t)a, len, pd ? 1 : 0, &r), 0);
	assert_non_null(r);
	return r;
}

static struct gdr_region *reg(uint64_t a, uint64_t len)
{
	return reg_pd(NULL, a, len);
}

static uint64_t region_id(struct gdr_region *r)
{
	uint64_t id;

	assert_int_equal(gdr_region_buffer_id(r, &id), 0);
	return id;
}

/* What the interception does around cuMemFree. */
static void free_evented(uint64_t a)
{
	gdr_events_push(a, 0);
	fake_cuda_free(a);
}

static void test_events_hit_makes_no_driver_call(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	uint64_t queries;

	(void)state;
	assert_int_equal(stats().validate_mode, GDR_VALIDATE_EVENTS);
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0); /* the miss */
	queries = fake_cuda_calls("cuPointerGetAttribute");
	for (int i = 0; i < 100; i++)
		assert_int_equal(gdr_dereg(reg(a + 4096 * (uint64_t)i, 4096)), 0);
	assert_int_equal(fake_cuda_calls("cuPointerGetAttribute"), queries);
	assert_int_equal(stats().fast_hits, 100);
	assert_int_equal(stats().tag_checks, 0);
	free_evented(a);
}

/* A zero length, or a range that wraps, at an address the cache holds (the thread's memo of its
 * last hit, and the hash, both name its record): -EINVAL from the general path's checks, counted,
 * never a hit (the hit path leaves those checks to gdr_record_serves), for a shared record and for
 * an exact one (remote access). */
static void test_bad_range_at_a_cached_address(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), wrap = UINT64_MAX - (a + 8192) + 4097, fails;
	struct gdr_region *held, *exact, *r;
	const int remote = 1 | 4; /* IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ */

	(void)state;
	held = reg(a, 2 * MiB);
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096, remote,
				 &exact),
			 0);
	fails = stats().fail_input;
	for (int i = 0; i < 2; i++) { /* the second time after a hit: the memo names the record */
		assert_int_equal(gdr_dereg(reg(a + 8192, 4096)), 0);
		r = (struct gdr_region *)1;
		assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 8192), 0, 0, &r),
				 -EINVAL);
		assert_null(r);
		assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 8192), wrap, 0, &r),
				 -EINVAL);
		assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 8192), SIZE_MAX, 0,
					 &r),
				 -EINVAL);
		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 0, remote,
					 &r),
				 -EINVAL);
		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), wrap,
					 remote, &r),
				 -EINVAL);
		assert_null(r);
	}
	assert_int_equal(stats().fail_input, fails + 10);
	assert_int_equal(gdr_dereg(exact), 0);
	assert_int_equal(gdr_dereg(held), 0);
	free_evented(a);
}

/* Without a pd there is no MR, so access means nothing (req_access: 0, as the locked path
 * records it): registrations of one range with any access share the record the first made, and
 * every one after the first is a lock-free hit, whether the first asked remote access or none. */
static void test_no_pd_ignores_access(void **state)
{
	static const int acc[] = { 0, 1, 1 | 2 | 4 | 8, 4 | GDR_ACCESS_WIDE_MR,
				   1 | GDR_REG_CACHED_ONLY };
	uint64_t a = fake_cuda_alloc(2 * MiB), b = fake_cuda_alloc(2 * MiB), hits;
	struct gdr_region *first[2], *r;

	(void)state;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &first[0]), 0);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)b, 4096, 1 | 2 | 4 | 8, &first[1]),
			 0);
	hits = stats().fast_hits;
	for (int k = 0; k < 2; k++) {
		uint64_t base = k ? b : a;

		for (size_t i = 0; i < sizeof(acc) / sizeof(acc[0]); i++) {
			r = NULL;
			assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(base + 8192),
						 4096, acc[i], &r),
					 0);
			assert_ptr_equal(r, first[k]);
			assert_int_equal(gdr_dereg(r), 0);
		}
	}
	assert_int_equal(stats().fast_hits, hits + 2 * sizeof(acc) / sizeof(acc[0]));
	assert_int_equal(gdr_dereg(first[0]), 0);
	assert_int_equal(gdr_dereg(first[1]), 0);
	free_evented(a);
	free_evented(b);
}

static void test_tag_hit_is_lock_free_but_queries(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	uint64_t queries;

	(void)state;
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = make(GDR_VALIDATE_TAG);
	assert_int_equal(stats().validate_mode, GDR_VALIDATE_TAG);
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	queries = fake_cuda_calls("cuPointerGetAttribute");
	for (int i = 0; i < 10; i++)
		assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(fake_cuda_calls("cuPointerGetAttribute"), queries + 10);
	assert_int_equal(stats().fast_hits, 10);
	fake_cuda_free(a);
}

static void test_event_drops_entry_before_next_hit(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), b, id;
	struct gdr_region *r;

	(void)state;
	r = reg(a, 4096);
	id = region_id(r);
	assert_int_equal(gdr_dereg(r), 0);
	free_evented(a);
	b = fake_cuda_alloc(2 * MiB);
	assert_int_equal(b, a); /* the VA comes back (docs/FACTS.md, "Address reuse") */
	r = reg(b, 4096);
	assert_true(region_id(r) > id);
	assert_int_equal(region_id(r), fake_cuda_buffer_id(b));
	assert_int_equal(stats().events, 1);
	assert_int_equal(stats().stale, 1);
	assert_int_equal(gdr_dereg(r), 0);
	free_evented(b);
}

/* A free announced (its event published) before a miss applies the events, whose driver free
 * then runs and ends while the miss classifies: the miss saw the freed buffer, and no free is in
 * flight any more when it checks. It must not cache what it saw. The fake driver's enter hook
 * runs the free (and the reallocation at the same address) between classify's two queries: a
 * request across two adjacent small allocations, the first the one being freed. */
static struct {
	uint64_t a, size, again;
	int tok, calls;
} mid;

static void free_ends_mid_classify(const char *entry, void *arg)
{
	(void)arg;
	if (strcmp(entry, "cuPointerGetAttributes") || ++mid.calls != 2)
		return;
	fake_cuda_free(mid.a); /* the driver's free, announced and evented before the miss */
	mid.again = fake_cuda_alloc(mid.size);
	gdr_events_free_end(mid.tok);
}

static void test_free_ending_while_miss_classifies(void **state)
{
	uint64_t a = fake_cuda_alloc(4096), b = fake_cuda_alloc(4096), id;
	struct gdr_region *r = NULL;

	(void)state;
	if (b != a + 4096) {
		fake_cuda_free(a);
		fake_cuda_free(b);
		skip(); /* the fake placed them apart */
	}
	mid = (typeof(mid)){ .a = a, .size = 4096 };
	mid.tok = gdr_events_free_begin(a, 0);
	gdr_events_push(a, 0);
	fake_cuda_set_enter_hook(free_ends_mid_classify, NULL);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 2048), 4096, 0, &r), 0);
	fake_cuda_set_enter_hook(NULL, NULL);
	assert_true(mid.calls >= 2);
	assert_int_equal(mid.again, a); /* the address came back, to another buffer */
	id = region_id(r);
	assert_int_equal(id, fake_cuda_buffer_id(a)); /* the buffer there now, not the freed one */
	assert_int_equal(gdr_dereg(r), 0);
	free_evented(a);
	free_evented(b);
}

static void test_unevented_free_is_missed_in_events_mode(void **state)
{
	/* Proves that mode events trusts its events alone: a free nobody reported is not seen (which
	 * is why mode auto uses events only where the interception is proven). */
	uint64_t a = fake_cuda_alloc(2 * MiB), b;
	struct gdr_region *r;

	(void)state;
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	fake_cuda_free(a);
	b = fake_cuda_alloc(2 * MiB);
	assert_int_equal(b, a);
	r = reg(b, 4096);
	assert_int_not_equal(region_id(r), fake_cuda_buffer_id(b));
	assert_int_equal(gdr_dereg(r), 0);
	free_evented(b);
}

static void test_event_range_and_context_destroy(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), b = fake_cuda_alloc(2 * MiB);

	(void)state;
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(gdr_dereg(reg(b, 4096)), 0);
	gdr_events_push(a + 4096, 4096); /* cuMemUnmap-style: a range inside the entry */
	assert_int_equal(gdr_dereg(reg(b, 4096)), 0);
	assert_int_equal(stats().stale, 1);
	assert_int_equal(stats().entries, 1);
	gdr_events_push(0, GDR_EVENT_ALL_LEN);       /* a context destroyed */
	assert_int_equal(gdr_cache_flush(cache), 0); /* the drain dropped everything first */
	assert_int_equal(stats().entries, 0);
	assert_int_equal(stats().stale, 2);
	fake_cuda_free(a);
	fake_cuda_free(b);
}

static void test_lost_events_drop_everything(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *held;

	(void)state;
	held = reg(a, 4096);
	for (unsigned i = 0; i < GDR_EVENTS_RING + 10; i++)
		gdr_events_push(0x1000, 0); /* nothing the cache has */
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(stats().events_lost, 1);
	assert_int_equal(stats().stale, 1);    /* dropped, though it was valid */
	assert_int_equal(stats().detached, 1); /* and held: pinned until released */
	assert_int_equal(gdr_dereg(held), 0);
	assert_int_equal(gdr_cache_flush(cache), 1);
	assert_int_equal(stats().detached, 0);
	free_evented(a);
}

/* A producer of the event ring delayed between reserving event n and writing its slot for a whole
 * lap: meanwhile event n + RING, a free of b, is published in the same slot. The delayed producer
 * then wrote its range over it, and a cache whose next event was past n (it had lost events and
 * jumped ahead) read event n + RING as the delayed one's range: the free of b was lost and the
 * cache served b's freed buffer. The ring's push hook (events.h) runs the other threads' events
 * inside the delayed producer's call. */
static struct {
	uint64_t n, b, drained;
	int tokq, in;
} late;

static void late_producer(int where, uint64_t n)
{
	if (late.in || n != late.n)
		return;
	late.in = 1;
	if (where == 0) {
		/* Event n reserved, not written: a few events, the lagging cache jumps past n when it
		 * applies them, b is registered, then events up to n + RING, a free of b. */
		for (int i = 0; i < 10; i++)
			gdr_events_push_kind(GDR_EV_ALLOC, 0x6000000000ull, 4096);
		assert_int_equal(gdr_cache_flush(cache), 0);
		assert_int_equal(gdr_dereg(reg(late.b, 4096)), 0);
		while (gdr_events_head() < n + GDR_EVENTS_RING)
			gdr_events_push_kind(GDR_EV_ALLOC, 0x6000000000ull, 4096);
		late.tokq =
			gdr_events_free_begin(late.b, 0); /* as the free hook: announce, publish, */
		gdr_events_push(late.b, 0);
	} else {
		/* Event n written, not yet published: the free's hook applies the events now. */
		late.drained = 1;
		gdr_caches_apply_events();
	}
	late.in = 0;
}

static void test_late_producer_of_an_earlier_lap(void **state)
{
	uint64_t id;
	struct gdr_region *r;

	(void)state;
	late = (typeof(late)){ .b = fake_cuda_alloc(2 * MiB) };
	for (unsigned i = 0; i < GDR_EVENTS_RING + 1; i++) /* the cache more than a ring behind */
		gdr_events_push_kind(GDR_EV_ALLOC, 0x6000000000ull, 4096);
	late.n = gdr_events_head();
	gdr_events_push_hook = late_producer;
	gdr_events_push(0x5000000000ull, 0); /* event n, delayed */
	gdr_events_push_hook = NULL;
	if (!late.drained)
		gdr_caches_apply_events(); /* (event n was given up: no slot to publish) */
	fake_cuda_free(late.b); /* the driver's free, the address handed out again, the hook ends */
	assert_int_equal(fake_cuda_alloc(2 * MiB), late.b);
	gdr_events_free_end(late.tokq);
	r = reg(late.b, 4096);
	id = region_id(r);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(id, fake_cuda_buffer_id(late.b)); /* the buffer there now */
	assert_int_equal(stats().events_lost, 1);          /* the jump alone */
	free_evented(late.b);
}

static void test_mode_choice(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE };
	struct gdr_cache *c = NULL;

	(void)state;
	probe_rc = -ENOSYS;
	a.validate = GDR_VALIDATE_EVENTS;
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), -EOPNOTSUPP);
	assert_null(c);
	a.validate = GDR_VALIDATE_AUTO;
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	assert_non_null(c);
	{
		struct gdr_cache_stats s;

		assert_int_equal(gdr_cache_get_stats(c, &s), 0);
		assert_int_equal(s.validate_mode, GDR_VALIDATE_TAG);
	}
	assert_int_equal(gdr_cache_destroy(c), 0);
	probe_rc = 0;
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	{
		struct gdr_cache_stats s;

		assert_int_equal(gdr_cache_get_stats(c, &s), 0);
		assert_int_equal(s.validate_mode, GDR_VALIDATE_EVENTS);
	}
	assert_int_equal(gdr_cache_destroy(c), 0);
}

struct xfer {
	struct gdr_region *r;
	int rc;
};

static void *dereg_thread(void *arg)
{
	struct xfer *x = arg;

	x->rc = gdr_dereg(x->r);
	return NULL;
}

static void test_release_on_another_thread_and_double_dereg(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r1, *r2;
	struct xfer x;
	pthread_t t;

	(void)state;
	r1 = reg(a, 4096);
	r2 = reg(a, 4096);
	assert_ptr_equal(r1, r2); /* one record per (allocation, pd, access) */
	x.r = r1;
	assert_int_equal(pthread_create(&t, NULL, dereg_thread, &x), 0);
	pthread_join(t, NULL);
	assert_int_equal(x.rc, 0);
	/* One hold is left: the entry is not evictable. */
	assert_int_equal(gdr_cache_flush(cache), 0);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(gdr_cache_flush(cache), 1);
	/* The record is retired with its entry: another release is refused. */
	assert_int_equal(gdr_dereg(r2), -EINVAL);
	/* A double release on one thread is refused while the record lives: the sum over threads
	 * would go below zero. */
	r1 = reg(a, 4096);
	assert_int_equal(gdr_dereg(r1), 0);
	assert_int_equal(gdr_dereg(r1), -EINVAL);
	assert_int_equal(stats().fail_input, 1);
	assert_int_equal(gdr_cache_flush(cache), 1);
	free_evented(a);
}

static void test_held_entry_survives_eviction_attempts(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), b = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;

	(void)state;
	assert_int_equal(gdr_cache_destroy(cache), 0);
	{
		struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_VALIDATE |
							   GDR_CACHE_ATTR_MAX_ENTRIES,
					     .validate = GDR_VALIDATE_EVENTS,
					     .max_entries = 1 };

		assert_int_equal(fake_cache_create(&at, &fake_backend_ops, &cache), 0);
	}
	r = reg(a, 4096);
	assert_int_equal(gdr_dereg(reg(b, 4096)), 0); /* over the limit: b (unheld) is evicted */
	assert_int_equal(stats().entries, 1);
	assert_int_equal(stats().evictions, 1);
	assert_int_equal(region_id(r), fake_cuda_buffer_id(a));
	assert_int_equal(gdr_dereg(r), 0);
	free_evented(a);
	free_evented(b);
}

static void test_release_pd(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;

	(void)state;
	assert_int_equal(gdr_cache_release_pd(NULL, FAKE_PD), -EINVAL);
	assert_int_equal(gdr_cache_release_pd(cache, NULL), -EINVAL);
	assert_int_equal(gdr_dereg(reg_pd(FAKE_PD, a, 4096)), 0);
	r = reg_pd(FAKE_PD2, a, 4096);
	assert_int_equal(fake_verbs.outstanding, 2);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD), 0);
	assert_int_equal(fake_verbs.outstanding, 1); /* FAKE_PD's MR is gone, the pin stays */
	assert_int_equal(stats().entries, 1);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD2), -EBUSY); /* r is held */
	assert_int_equal(fake_verbs.outstanding, 1);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD2), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	/* The PD can be used again: a new MR is made. */
	assert_int_equal(gdr_dereg(reg_pd(FAKE_PD, a, 4096)), 0);
	assert_int_equal(fake_verbs.outstanding, 1);
	free_evented(a);
}

/* A host registration made with a PD is an MR the cache made for it (passed through, in no entry):
 * while it is held, the PD is not released (-EBUSY), as with a held cached one; the program would
 * otherwise free the PD under it (ibv_dealloc_pd: EBUSY, or a PD freed under a live MR). */
static void test_release_pd_with_host_registration_held(void **state)
{
	char *buf = malloc(8192);
	struct gdr_region *r;

	(void)state;
	assert_non_null(buf);
	assert_int_equal(gdr_reg(cache, FAKE_PD, buf, 8192, 1, &r), 0);
	assert_int_equal(stats().passthrough, 1);
	assert_int_equal(fake_verbs.outstanding, 1);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD2), 0); /* not r's PD */
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD), -EBUSY);
	assert_int_equal(fake_verbs.outstanding, 1);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	free(buf);
}

#define NT 8
#define ITERS 20000
static uint64_t shared_a;
static uint64_t mine[NT];

static void *hitter(void *arg)
{
	int i = (int)(intptr_t)arg;

	for (int k = 0; k < ITERS; k++) {
		struct gdr_region *r1 = NULL, *r2 = NULL;

		if (gdr_reg(cache, NULL, (void *)(uintptr_t)shared_a, 4096, 0, &r1) ||
		    gdr_reg(cache, NULL, (void *)(uintptr_t)mine[i], 4096, 0, &r2) ||
		    gdr_dereg(r1) || gdr_dereg(r2))
			return (void *)1;
	}
	return NULL;
}

static void test_threads_share_and_own(void **state)
{
	pthread_t t[NT];
	void *ret;

	(void)state;
	shared_a = fake_cuda_alloc(2 * MiB);
	for (int i = 0; i < NT; i++)
		mine[i] = fake_cuda_alloc(2 * MiB);
	for (int i = 0; i < NT; i++)
		assert_int_equal(pthread_create(&t[i], NULL, hitter, (void *)(intptr_t)i), 0);
	for (int i = 0; i < NT; i++) {
		pthread_join(t[i], &ret);
		assert_null(ret);
	}
	assert_int_equal(stats().hits + stats().misses, 2 * NT * ITERS);
	assert_int_equal(stats().misses, NT + 1);
	/* Every hold was given back: everything can be flushed. */
	assert_int_equal(gdr_cache_flush(cache), NT + 1);
	free_evented(shared_a);
	for (int i = 0; i < NT; i++)
		free_evented(mine[i]);
}

static int spin_stop; /* __atomic */

static void *spinner(void *arg)
{
	uint64_t a = (uint64_t)(uintptr_t)arg;

	while (!__atomic_load_n(&spin_stop, __ATOMIC_RELAXED)) {
		struct gdr_region *r = NULL;

		if (!gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r))
			gdr_dereg(r);
	}
	return NULL;
}

static void test_fork_child_uses_cache(void **state)
{
	/* Another thread hits without pause while this one forks: the child, which has only this
	 * thread, must still be able to retire entries (a grace period must not wait for a thread
	 * the child does not have) and take the cache's lock. */
	uint64_t a = fake_cuda_alloc(2 * MiB), b = fake_cuda_alloc(2 * MiB);
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
	/* 20 forks, or at least 4 where they are slow: under qemu-user each child takes about 7 s
	 * of copy-on-write faults, 20 of them most of a ctest timeout. The count is printed. */
	int64_t enough = gdr_deadline_ms(20000);
	pthread_t t;
	int status = -1, i;
	pid_t pid;

	(void)state;
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(pthread_create(&t, NULL, spinner, (void *)(uintptr_t)a), 0);
	for (i = 0; i < 20 && (i < 4 || !gdr_deadline_passed(enough)); i++) {
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			struct gdr_region *r = NULL;
			int ok;

			alarm(alarm_s); /* a hang (a wait for a thread it does not have) fails */
			ok = gdr_reg(cache, NULL, (void *)(uintptr_t)b, 4096, 0, &r) == 0 &&
			     gdr_dereg(r) == 0 && gdr_cache_flush(cache) >= 1;
			_exit(ok ? 0 : 1);
		}
		assert_int_equal(waitpid(pid, &status, 0), pid);
		if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
			__atomic_store_n(&spin_stop, 1, __ATOMIC_RELAXED);
			pthread_join(t, NULL);
			fail_msg("fork %d: the child hung (killed by its alarm after %u s)", i,
				 alarm_s);
		}
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	print_message("%d forks, each child served by the cache\n", i);
	__atomic_store_n(&spin_stop, 1, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	free_evented(a);
	free_evented(b);
}

/* Random hits over many entries of mixed sizes (small allocations sharing pages, so entries with
 * many records) are all served lock-free by the lookup hash, each by the record of its own
 * allocation; entries dropped since (tombstones in the hash) are never served, their allocations'
 * next registrations miss, and the rest keep hitting. */
/* n registrations of a random 4 KiB page of a random one of the allocations va[0..nva) (sizes
 * size[]), each checked (the range and the allocation served), then released; *x: the generator's
 * state. */
static void hit_random(const uint64_t *va, const uint64_t *size, uint64_t nva, int n, uint64_t *x)
{
	for (int k = 0; k < n; k++) {
		uint64_t i, off, base, len;
		struct gdr_region *r;

		*x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
		i = *x % nva;
		off = (*x >> 32) % (size[i] / 4096) * 4096;
		r = reg(va[i] + off, 4096);
		assert_int_equal(gdr_region_range(r, &base, &len), 0);
		assert_true(base <= va[i] + off && va[i] + off + 4096 <= base + len);
		assert_int_equal(region_id(r), fake_cuda_buffer_id(va[i]));
		assert_int_equal(gdr_dereg(r), 0);
	}
}

static void test_random_hits_through_the_hash(void **state)
{
	enum { N = 1500 };
	static uint64_t va[N], size[N];
	uint64_t x = 0x9e3779b97f4a7c15ULL, hits, misses;
	struct gdr_region *r;

	(void)state;
	for (int i = 0; i < N; i++) {
		size[i] = 4096ULL << (i % 11); /* 4 KiB .. 4 MiB */
		va[i] = fake_cuda_alloc(size[i]);
		assert_int_equal(gdr_dereg(reg(va[i], size[i])), 0);
	}
	/* Entries merged as neighbours came (small allocations share pages): records of the entries
	 * taken over are made again at their allocation's next registration, under the lock. */
	for (int i = 0; i < N; i++)
		assert_int_equal(gdr_dereg(reg(va[i], size[i])), 0);
	hits = stats().fast_hits;
	misses = stats().misses;
	hit_random(va, size, N, 20000, &x);
	assert_int_equal(stats().fast_hits, hits + 20000);
	assert_int_equal(stats().misses, misses);
	/* Every third allocation freed and allocated again (a new id, often the same VA). */
	for (int i = 0; i < N; i += 3) {
		free_evented(va[i]);
		va[i] = fake_cuda_alloc(size[i]);
	}
	for (int i = 0; i < N; i++) {
		r = reg(va[i], 4096);
		assert_int_equal(region_id(r), fake_cuda_buffer_id(va[i]));
		assert_int_equal(gdr_dereg(r), 0);
	}
	for (int i = 0; i < N; i++) /* records of entries merged by the new ones, again */
		assert_int_equal(gdr_dereg(reg(va[i] + size[i] - 4096, 4096)), 0);
	hits = stats().fast_hits;
	misses = stats().misses;
	for (int i = 0; i < N; i++)
		assert_int_equal(gdr_dereg(reg(va[i] + size[i] - 4096, 4096)), 0);
	assert_int_equal(stats().fast_hits, hits + N);
	assert_int_equal(stats().misses, misses);
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
}

/* This thread's walks of probe runs in the cache (a bucket that decided nothing). */
static uint64_t walks(void)
{
	struct gdr_thr *t = gdr_thr_find(cache);

	assert_non_null(t);
	return __atomic_load_n(&t->walks, __ATOMIC_RELAXED);
}

/* Buffers of mixed sizes have their records at several levels of the hash: a hit is found by one
 * bucket of each level looked at, without walking a probe run. A bucket proves its key absent
 * where none of the key's slots covers the address and no run of its keys went past it, even
 * when it is full (of other keys or tombstones), so most hits away from the most populated level
 * walk nothing (they walked every other level before: three hits in four here, more than one
 * walk each). What is walked: keys whose own run left their bucket, and filters' false
 * positives. */
static void test_levels_found_without_walks(void **state)
{
	enum { N = 1024, HITS = 20000 };
	static uint64_t va[N], size[N];
	uint64_t x = 0x2545f4914f6cdd1dULL, hits, misses, w;
	unsigned nlev = 0;

	(void)state;
	for (int i = 0; i < N; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size[i] = 4096ULL << (x % 11); /* 4 KiB .. 4 MiB */
		va[i] = fake_cuda_alloc(size[i]);
		assert_int_equal(gdr_dereg(reg(va[i], size[i])), 0);
	}
	for (int i = 0; i < N; i++) /* records of entries merged by later neighbours, again */
		assert_int_equal(gdr_dereg(reg(va[i], size[i])), 0);
	for (unsigned k = 0; k < GDR_HIX_LEVELS; k++)
		nlev += cache->index.lev_n[k] > N / 16;
	assert_true(nlev >= 3);
	/* Some of the table's slots freed: tombstones fill buckets without overflowing them. */
	for (int i = 0; i < N; i += 7) {
		free_evented(va[i]);
		va[i] = fake_cuda_alloc(size[i]);
		assert_int_equal(gdr_dereg(reg(va[i], size[i])), 0);
	}
	/* Records of entries merged by new neighbours are made again at their allocation's next
	 * registration, under the lock: until a whole round is lock-free. */
	for (int round = 0;; round++) {
		hits = stats().fast_hits;
		for (int i = 0; i < N; i++)
			assert_int_equal(gdr_dereg(reg(va[i], size[i])), 0);
		if (stats().fast_hits == hits + N)
			break;
		assert_true(round < 4);
	}
	hits = stats().fast_hits;
	misses = stats().misses;
	w = walks();
	hit_random(va, size, N, HITS, &x);
	assert_int_equal(stats().fast_hits, hits + HITS);
	assert_int_equal(stats().misses, misses);
	print_message("%d hits over %u levels, %llu walks\n", HITS, nlev,
		      (unsigned long long)(walks() - w));
	assert_true(walks() - w <= HITS / 8);
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
}

/* The region a registration got serves what was asked: the range, and the PD of its MR. */
static void assert_serves(struct gdr_region *r, struct ibv_pd *pd, uint64_t a, uint64_t len,
			  bool exact)
{
	uint64_t base, rlen;
	struct ibv_mr *mr = NULL;

	assert_int_equal(gdr_region_range(r, &base, &rlen), 0);
	assert_true(base <= a && a + len <= base + rlen);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_true(!pd == !mr);
	if (pd) {
		assert_ptr_equal(mr->pd, pd);
		if (exact)
			assert_true((uint64_t)(uintptr_t)mr->addr == a && mr->length == len);
	}
}

/* The hash's cases besides one record a key: the bucket read whole finds the key's record among
 * neighbours of the same granule; a record of another PD or access of the same allocation, and
 * exact remote-access records inside the shared one, share its key and its range, so the first
 * candidate does not serve and the walk must; an exact record of the shared one's level that ends
 * before it is the bucket's candidate for the addresses before it, which only the shared one
 * holds (at the most populated level, where the bucket is read);
 * small allocations packed in one granule overflow its bucket. Each of them, asked again, is a
 * lock-free hit that serves what was asked. */
static void test_hash_keys_with_many_records(void **state)
{
	enum { NSMALL = 64, ROUNDS = 3 };
	struct ibv_pd *pds[3] = { NULL, FAKE_PD, FAKE_PD2 };
	uint64_t big[4], small[NSMALL], hits = 0, misses = 0;
	int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

	(void)state;
	for (int i = 0; i < 4; i++) /* 1 MiB each: two to a 2 MiB granule */
		big[i] = fake_cuda_alloc(MiB);
	for (int i = 0; i < NSMALL; i++) /* 512 B each: eight to a 4 KiB granule */
		small[i] = fake_cuda_alloc(512);
	for (int round = 0; round <= ROUNDS; round++) {
		if (round == 1) {
			hits = stats().fast_hits;
			misses = stats().misses;
		}
		for (int i = 0; i < 4; i++) {
			for (int p = 0; p < 3; p++) {
				struct gdr_region *r = reg_pd(pds[p], big[i] + 8192 * p, 4096);

				assert_serves(r, pds[p], big[i] + 8192 * p, 4096, false);
				assert_int_equal(gdr_dereg(r), 0);
			}
			for (int q = 0; q < 4; q++) { /* exact records, inside the shared one */
				/* The last one of the shared one's level (over 512 KiB), ending
				 * before it: the bucket's candidate for the addresses before it,
				 * which only the shared one holds. */
				uint64_t a = big[i] + 65536 * (q + 1),
					 len = q < 3 ? 65536 : 576 * 1024;
				struct gdr_region *r = NULL;

				assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)a, len,
							 remote, &r),
						 0);
				assert_serves(r, FAKE_PD, a, len, true);
				assert_int_equal(gdr_dereg(r), 0);
			}
		}
		for (int i = 0; i < NSMALL; i++) {
			struct gdr_region *r = reg(small[i], 512);

			assert_serves(r, NULL, small[i], 512, false);
			assert_int_equal(region_id(r), fake_cuda_buffer_id(small[i]));
			assert_int_equal(gdr_dereg(r), 0);
		}
	}
	assert_int_equal(stats().misses, misses);
	assert_int_equal(stats().fast_hits, hits + ROUNDS * (4 * 7 + NSMALL));
	/* The same in the most populated level's bucket, where the key is alone (a 4 KiB granule
	 * inside an 8 KiB allocation: the bucket has empty slots): a bucket that found no candidate
	 * holding the address took the key for absent, so the shared record was missed lock-free
	 * (and found under the lock). */
	{
		uint64_t eight = fake_cuda_alloc(8192), g = (eight + 4095) & ~4095ULL;
		struct gdr_region *r = NULL;

		assert_int_equal(gdr_dereg(reg(eight, 8192)), 0);
		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(g + 512), 1024, remote,
					 &r),
				 0);
		assert_int_equal(gdr_dereg(r), 0);
		hits = stats().fast_hits;
		for (int k = 0; k < 3; k++) {
			/* another buffer's hit between, so that the memo does not serve it */
			assert_int_equal(gdr_dereg(reg(small[k], 512)), 0);
			r = reg(g + 128 * k, 128);
			assert_serves(r, NULL, g + 128 * k, 128, false);
			assert_int_equal(gdr_dereg(r), 0);
		}
		assert_int_equal(stats().fast_hits, hits + 6);
		free_evented(eight);
	}
	for (int i = 0; i < 4; i++)
		free_evented(big[i]);
	for (int i = 0; i < NSMALL; i++)
		free_evented(small[i]);
}

/* An allocation or free event looks at the entries near the memory it names, not at every entry:
 * with 1,000 entries cached, an allocation elsewhere and the free of one of them look at a few
 * (they looked at all 1,000 before, under the lock, in the free and in the next registration). */
static void test_events_look_near(void **state)
{
	enum { N = 1000 };
	static uint64_t va[N];
	uint64_t far, before, misses;

	(void)state;
	for (int i = 0; i < N; i++) {
		va[i] = fake_cuda_alloc(MiB);
		assert_int_equal(gdr_dereg(reg(va[i], 4096)), 0);
	}
	far = fake_cuda_alloc(64 * MiB);
	before = cache->events_examined;
	gdr_events_push_kind(GDR_EV_ALLOC, far, 64 * MiB);
	assert_int_equal(gdr_dereg(reg(va[N / 2], 4096)), 0); /* drains it */
	assert_true(cache->events_examined - before <= 2);
	before = cache->events_examined;
	free_evented(va[N / 3]);
	va[N / 3] = fake_cuda_alloc(MiB);
	misses = stats().misses;
	for (int i = 0; i < N; i++)
		assert_int_equal(gdr_dereg(reg(va[i], 4096)), 0);
	assert_true(cache->events_examined - before <= 3);
	assert_int_equal(stats().misses, misses + 1); /* the freed one's new allocation only */
	assert_int_equal(stats().stale, 1);
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
	free_evented(far);
}

/* The window an event looks through reaches as far as cached tags reach beyond their pins: a
 * large allocation pinned only where it was asked (4 KiB, 64 KiB-aligned, half-way in) is dropped
 * by the free of its base address and by an allocation event over its other end, both far from
 * its pin. A window of the pins alone would keep it, stale. */
static void test_events_reach_beyond_pins(void **state)
{
	uint64_t size = 512 * MiB, big, again, id, base, len, stale;
	struct gdr_region *r;

	(void)state;
	for (int round = 0; round < 2; round++) {
		big = fake_cuda_alloc(size);
		r = reg(big + size / 2, 4096);
		assert_int_equal(gdr_region_range(r, &base, &len), 0);
		assert_true(len < size / 4); /* pinned by the request, not whole */
		id = region_id(r);
		assert_int_equal(gdr_dereg(r), 0);
		stale = stats().stale;
		if (round == 0) {
			free_evented(big); /* by its base address, 256 MiB from the pin */
			again = fake_cuda_alloc(size);
			r = reg(again + size / 2, 4096); /* applies the event first */
		} else {
			/* Its free unseen, the memory allocated again, and an allocation event for
			 * the first 64 MiB only, 192 MiB from the pin (as a driver's own allocation
			 * there would publish). */
			fake_cuda_free(big);
			again = fake_cuda_alloc(size);
			gdr_events_push_kind(GDR_EV_ALLOC, again, 64 * MiB);
			r = reg(again + size / 2, 4096);
		}
		assert_int_equal(again, big); /* the VA comes back */
		assert_int_equal(stats().stale, stale + 1);
		assert_int_not_equal(region_id(r), id);
		assert_int_equal(region_id(r), fake_cuda_buffer_id(again));
		assert_int_equal(gdr_dereg(r), 0);
		free_evented(again);
	}
}

/* The window narrows again: once the entries that reached far beyond their pins have left the
 * cache (freed, evicted), an event looks at the entries near it, not at every one (the window
 * only grew before, so one large allocation pinned in part, cached once, made every later event
 * look at every entry). Two such entries: the window stays wide until both have left. */
static void test_events_window_narrows(void **state)
{
	enum { N = 400 };
	static uint64_t va[N];
	uint64_t size = 512 * MiB, big[2], far, before;

	(void)state;
	for (int i = 0; i < N; i++) {
		va[i] = fake_cuda_alloc(MiB);
		assert_int_equal(gdr_dereg(reg(va[i], 4096)), 0);
	}
	for (int b = 0; b < 2; b++) {
		uint64_t base, len;
		struct gdr_region *r;

		big[b] = fake_cuda_alloc(size);
		r = reg(big[b] + size / 2, 4096);
		assert_int_equal(gdr_region_range(r, &base, &len), 0);
		assert_true(len < size / 4); /* pinned in part: its tags reach 256 MiB beyond */
		assert_int_equal(gdr_dereg(r), 0);
	}
	assert_true(cache->tag_reach >= size / 4);
	for (int b = 0; b < 2; b++) {
		free_evented(big[b]);
		assert_int_equal(gdr_dereg(reg(va[0], 4096)), 0); /* applies the event */
		if (b == 0) /* the other one still reaches as far */
			assert_true(cache->tag_reach >= size / 4);
	}
	assert_true(cache->tag_reach < size / 4);
	far = fake_cuda_alloc(64 * MiB);
	before = cache->events_examined;
	gdr_events_push_kind(GDR_EV_ALLOC, far, 64 * MiB);
	assert_int_equal(gdr_dereg(reg(va[N / 2], 4096)), 0); /* drains it */
	assert_true(cache->events_examined - before <= 2);
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
	free_evented(far);
}

/* A miss retires nothing: it runs no grace period (a membarrier, whose cost grows with the threads
 * of the process); before, every miss paid one to retire the index snapshot it replaced. */
static void test_miss_runs_no_grace_period(void **state)
{
	enum { N = 300 };
	static uint64_t va[N];
	uint64_t syncs;

	(void)state;
	for (int i = 0; i < N; i++)
		va[i] = fake_cuda_alloc(2 * MiB);
	assert_int_equal(gdr_dereg(reg(va[0], 4096)), 0);
	syncs = cache->nsyncs;
	for (int i = 1; i < N; i++)
		assert_int_equal(gdr_dereg(reg(va[i], 4096)), 0);
	assert_int_equal(stats().misses, N);
	assert_int_equal(cache->nsyncs, syncs);
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
}

/* Over the entry limit, an eviction pass goes 1/32 below it: one grace period for dozens of misses,
 * not one each. */
static void test_evictions_share_grace_periods(void **state)
{
	enum { N = 3000, LIMIT = 1024 };
	struct gdr_cache_attr a = { .field_mask =
					    GDR_CACHE_ATTR_VALIDATE | GDR_CACHE_ATTR_MAX_ENTRIES,
				    .validate = GDR_VALIDATE_EVENTS,
				    .max_entries = LIMIT };
	static uint64_t va[N];
	uint64_t syncs, evictions;

	(void)state;
	assert_int_equal(gdr_cache_destroy(cache), 0);
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &cache), 0);
	for (int i = 0; i < N; i++)
		va[i] = fake_cuda_alloc(2 * MiB);
	for (int i = 0; i < LIMIT; i++)
		assert_int_equal(gdr_dereg(reg(va[i], 4096)), 0);
	syncs = cache->nsyncs;
	evictions = stats().evictions;
	for (int i = LIMIT; i < N; i++)
		assert_int_equal(gdr_dereg(reg(va[i], 4096)), 0);
	assert_true(stats().entries <= LIMIT);
	assert_true(stats().evictions - evictions >= N - LIMIT - LIMIT / 32);
	assert_true(cache->nsyncs - syncs <= (N - LIMIT) / 16);
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
}

/* An allocation larger than the pin cap is pinned by the request; the record serves only what lies
 * in its entry's pin: a request running past the pin is not handed that pin lock-free. */
static void test_capped_allocation_served_within_its_pin(void **state)
{
	struct gdr_cache_attr a = { .field_mask =
					    GDR_CACHE_ATTR_VALIDATE | GDR_CACHE_ATTR_MAX_PIN_BYTES,
				    .validate = GDR_VALIDATE_EVENTS,
				    .max_pin_bytes = MiB };
	uint64_t va = fake_cuda_alloc(64 * MiB), base, len, hits;
	struct gdr_region *r1, *r2;

	(void)state;
	assert_int_equal(gdr_cache_destroy(cache), 0);
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &cache), 0);
	r1 = reg(va + 100 * 1024, 8192);
	assert_int_equal(gdr_region_range(r1, &base, &len), 0);
	assert_int_equal(base, va + 64 * 1024);
	assert_int_equal(len, 64 * 1024);
	hits = stats().fast_hits;
	assert_int_equal(gdr_dereg(reg(va + 120 * 1024, 8192)), 0); /* inside: lock-free */
	assert_int_equal(stats().fast_hits, hits + 1);
	r2 = reg(va + 120 * 1024, 16384); /* past the pin's end */
	assert_int_equal(stats().fast_hits, hits + 1);
	assert_int_equal(gdr_region_range(r2, &base, &len), 0);
	assert_true(base <= va + 120 * 1024 && va + 136 * 1024 <= base + len);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(gdr_dereg(r1), 0);
	free_evented(va);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_events_hit_makes_no_driver_call, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_pd_ignores_access, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_range_at_a_cached_address, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_tag_hit_is_lock_free_but_queries, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_free_ending_while_miss_classifies, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_event_drops_entry_before_next_hit, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_unevented_free_is_missed_in_events_mode, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_event_range_and_context_destroy, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_lost_events_drop_everything, setup, teardown),
		cmocka_unit_test_setup_teardown(test_late_producer_of_an_earlier_lap, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_mode_choice, setup, teardown),
		cmocka_unit_test_setup_teardown(test_release_on_another_thread_and_double_dereg,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_held_entry_survives_eviction_attempts, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_release_pd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_release_pd_with_host_registration_held, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_threads_share_and_own, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork_child_uses_cache, setup, teardown),
		cmocka_unit_test_setup_teardown(test_random_hits_through_the_hash, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hash_keys_with_many_records, setup, teardown),
		cmocka_unit_test_setup_teardown(test_levels_found_without_walks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_events_look_near, setup, teardown),
		cmocka_unit_test_setup_teardown(test_events_reach_beyond_pins, setup, teardown),
		cmocka_unit_test_setup_teardown(test_events_window_narrows, setup, teardown),
		cmocka_unit_test_setup_teardown(test_miss_runs_no_grace_period, setup, teardown),
		cmocka_unit_test_setup_teardown(test_evictions_share_grace_periods, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_capped_allocation_served_within_its_pin, setup,
						teardown),
	};

	return gdr_run_tests_sharded("tests", tests, sizeof(tests) / sizeof(tests[0]));
}
