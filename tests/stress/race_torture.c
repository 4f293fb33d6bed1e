/* SPDX-License-Identifier: MIT */
/*
 * Race torture: stale registrations and hold-count corruption under sharing.
 *
 * Several worker threads hit a handful of buffers (so they share the same records and their memos)
 * while churn threads free and reallocate those buffers at the same address (device memory through
 * cuMemFree, pool memory through cuMemFreeAsync, a VMM mapping unmapped and mapped again), a flush
 * thread empties the cache, and the limits are tiny, so eviction runs all the time. Registrations
 * are released on the thread that made them, on a progress thread (handed over), or both at once:
 * a worker registers the same range twice (the same record, two holds on its own counter), hands
 * one hold to the progress thread and releases the other itself, which drives the
 * GDR_REC_RELEASED protocol (lock-free vs locked release of one record by two threads).
 *
 * The checker, per buffer, is a sequence lock: its churn thread makes the buffer's sequence odd
 * before it starts a free and even again once the new buffer is allocated and its address published.
 * A worker reads the sequence (s1), registers, reads the region's buffer id, the fake driver's
 * current buffer id at the address and whether the region's pin still maps the memory now there
 * (fake_backend_pin_current), then reads the sequence again (s2). Only when s1 == s2 and s1 is even
 * did no free of that buffer begin before the registration returned, and none was in flight
 * while it ran: then gdr_reg must have succeeded, and both checks must hold (no false positive:
 * every free that happened completed, event published, before s1 was read). Otherwise the outcome
 * is not checked but the hold, if any, is still released and counted.
 * Holds: every registration that succeeded is released exactly once, and every such release must
 * succeed; before a release, a hold whose buffer's sequence has not moved since it was taken must
 * still be current (its pin not evicted: a lost hold shows up as an evicted pin or a reused record,
 * whose buffer id changes). At the end: nothing held, a flush leaves no pin, destroy returns 0, no
 * pin or MR is left.
 *
 * Modes: tag (BUFFER_ID checks), events (the test announces each free and publishes its event as
 * the library's hooks do: gdr_events_free_begin, gdr_events_push, the free, gdr_events_free_end),
 * intercept (frees through the fake driver's entry points cuMemFree_v2, cuMemFreeAsync and
 * cuMemUnmap, which the library patched). Environment: RACE_TORTURE_DIAG=1 prints the record and
 * entry behind a stale registration; RACE_TORTURE_ABORT=1 aborts at the first failure.
 *
 * Usage: race_torture [seconds] [seed] [tag|events|intercept] [workers]
 *        (default 2 s, seed 1, intercept, 4 workers)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "intercept/events.h"
#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"

#define KiB 1024ULL
#define MiB (1024 * KiB)
#define NSLOT 6
#define MAXW 32
#define QLEN 1024
#define KEEP 8

enum { M_TAG, M_EVENTS, M_INTERCEPT };
enum { K_DEV, K_SMALL, K_POOL, K_VMM };

/* The fake driver's entry points, patched by the library (mode intercept). */
int cuMemFree_v2(uint64_t p);
int cuMemFreeAsync(uint64_t p, void *stream);
int cuMemUnmap(uint64_t p, size_t size);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemAllocAsync(uint64_t *p, size_t size, void *stream);
int cuCtxSetCurrent(void *ctx);

struct slot {
	_Atomic uint64_t seq; /* odd: a free (and reallocation) in flight */
	_Atomic uint64_t va;
	uint64_t size;
	int kind;
	uint64_t resv; /* VMM: the reservation */
};

struct hold {
	struct gdr_region *r;
	uint64_t a, len, id;
	uint64_t seq; /* the slot's sequence when taken and proven current, or 1 (unknown) */
	int slot;
};

static struct slot slots[NSLOT];
static struct gdr_cache *cache;
static int mode = M_INTERCEPT, nworkers = 4;
static unsigned seed = 1;
static bool diag; /* RACE_TORTURE_DIAG set: the record and entry of a stale registration */
static atomic_int stop, workers_done, failures;
static atomic_ullong n_regs, n_deregs, n_checked, n_unchecked, n_fail_reg, n_churn, n_flush,
	n_handed, n_same, n_stable_hold_checks;

static struct hold q[QLEN];
static unsigned qhead, qlen;
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

static void fail(const char *what, uint64_t a, long v1, long v2)
{
	fprintf(stderr, "race_torture: FAILED (seed %u, mode %d, %d workers): %s at %#" PRIx64
		" (%ld, %ld)\n", seed, mode, nworkers, what, a, v1, v2);
	atomic_fetch_add(&failures, 1);
	if (getenv("RACE_TORTURE_ABORT"))
		abort();
}

static int probe_simulated(const char **why)
{
	(void)why;
	return 0;
}

/* ---- the churn: free and reallocate at (usually) the same address ---- */
static uint64_t slot_alloc(struct slot *s)
{
	uint64_t p = 0;

	switch (s->kind) {
	case K_DEV:
	case K_SMALL:
		if (mode == M_INTERCEPT)
			cuMemAlloc_v2(&p, s->size);
		else
			p = fake_cuda_alloc(s->size);
		return p;
	case K_POOL:
		if (mode == M_INTERCEPT)
			cuMemAllocAsync(&p, s->size, NULL);
		else
			p = fake_cuda_alloc_async(s->size);
		return p;
	default:
		return fake_cuda_vmm_map(s->resv, s->size) ? 0 : s->resv;
	}
}

static void slot_free(struct slot *s, uint64_t va)
{
	int rc, tok = 0;

	/* Mode events: what the library's hooks do around the driver's free (hooks.c): announce
	 * the free in flight, publish its event, free, end the announcement. */
	if (mode == M_EVENTS) {
		tok = gdr_events_free_begin(va, s->kind == K_VMM ? s->size : 0);
		gdr_events_push(va, s->kind == K_VMM ? s->size : 0);
	}
	switch (s->kind) {
	case K_DEV:
	case K_SMALL:
		rc = mode == M_INTERCEPT ? cuMemFree_v2(va) : fake_cuda_free(va);
		break;
	case K_POOL:
		rc = mode == M_INTERCEPT ? cuMemFreeAsync(va, NULL) : fake_cuda_free_async(va);
		break;
	default:
		rc = mode == M_INTERCEPT ? cuMemUnmap(va, s->size) : fake_cuda_vmm_unmap(va, s->size);
		break;
	}
	if (mode == M_EVENTS)
		gdr_events_free_end(tok);
	if (rc)
		fail("free", va, rc, s->kind);
}

static void *churner(void *arg)
{
	int first = (int)(uintptr_t)arg;
	uint64_t rs = seed * 0x9e3779b97f4a7c15ULL + 77 + (uint64_t)first;

	cuCtxSetCurrent(fake_cuda_primary_context(0));
	while (!atomic_load(&stop)) {
		struct slot *s = &slots[first + 2 * (int)(rnd(&rs) % (NSLOT / 2))];
		uint64_t va = atomic_load(&s->va), nva;

		atomic_fetch_add(&s->seq, 1); /* odd: a free begins */
		slot_free(s, va);
		nva = slot_alloc(s);
		if (!nva)
			fail("reallocation", va, 0, s->kind);
		atomic_store(&s->va, nva);
		atomic_fetch_add(&s->seq, 1); /* even: the buffer at s->va is stable */
		atomic_fetch_add(&n_churn, 1);
		/* Leave the workers windows with stable buffers. */
		for (unsigned k = (unsigned)(rnd(&rs) % 4); k; k--)
			sched_yield();
		if (rnd(&rs) % 8 == 0) {
			struct timespec ts = { 0, (long)(rnd(&rs) % 50000) };

			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

static void *flusher(void *arg)
{
	uint64_t rs = seed + 99;

	(void)arg;
	while (!atomic_load(&stop)) {
		int rc = gdr_cache_flush(cache);

		if (rc < 0)
			fail("gdr_cache_flush", 0, rc, 0);
		atomic_fetch_add(&n_flush, 1);
		struct timespec ts = { 0, (long)(rnd(&rs) % 200000) };

		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* ---- holds ---- */
/* Release h: first, if its buffer has not moved since it was taken (and proven current then),
 * check that the hold still holds (the same record, its pin not evicted). */
static void release(const struct hold *h, const char *who)
{
	uint64_t id = 0;
	int rc;

	if (!(h->seq & 1)) {
		struct slot *s = &slots[h->slot];
		bool pin_ok;
		int idrc;

		idrc = gdr_region_buffer_id(h->r, &id);
		pin_ok = fake_backend_pin_current(h->r, h->a, h->len);
		if (atomic_load(&s->seq) == h->seq) {
			atomic_fetch_add(&n_stable_hold_checks, 1);
			if (idrc || id != h->id)
				fail("a held registration's record changed (hold lost?)", h->a, idrc,
				     (long)(id - h->id));
			if (!pin_ok)
				fail("a held registration's pin was evicted or is stale (hold lost?)",
				     h->a, (long)h->len, 0);
		}
	}
	rc = gdr_dereg(h->r);
	if (rc)
		fail(who, h->a, rc, 0);
	else
		atomic_fetch_add(&n_deregs, 1);
}

/* A full queue has room again within this (times GDR_TEST_WAIT_SCALE): the progress thread's
 * releases take microseconds. */
#define QUEUE_WAIT_MS 60000

static void hand_over(const struct hold *h)
{
	int64_t deadline = gdr_deadline_ms(QUEUE_WAIT_MS);

	pthread_mutex_lock(&qlock);
	while (qlen == QLEN) {
		struct timespec ts = { deadline / 1000000000, deadline % 1000000000 };

		if (pthread_cond_clockwait(&qcond, &qlock, CLOCK_MONOTONIC, &ts) == ETIMEDOUT &&
		    qlen == QLEN) {
			fprintf(stderr,
				"race_torture: FAILED (seed %u, mode %d, %d workers): the "
				"progress thread released none of %d handed-over holds in %lld s "
				"(stuck in gdr_dereg?)\n",
				seed, mode, nworkers, QLEN,
				(long long)(QUEUE_WAIT_MS / 1000 * gdr_deadline_scale()));
			if (getenv("RACE_TORTURE_ABORT"))
				abort();
			_exit(1); /* not exit(): that thread may hold the library's locks */
		}
	}
	q[(qhead + qlen++) % QLEN] = *h;
	pthread_cond_broadcast(&qcond);
	pthread_mutex_unlock(&qlock);
	atomic_fetch_add(&n_handed, 1);
}

static void *progress(void *arg)
{
	(void)arg;
	for (;;) {
		struct hold h;

		pthread_mutex_lock(&qlock);
		while (!qlen && !atomic_load(&workers_done))
			pthread_cond_wait(&qcond, &qlock);
		if (!qlen) {
			pthread_mutex_unlock(&qlock);
			break;
		}
		h = q[qhead];
		qhead = (qhead + 1) % QLEN;
		qlen--;
		pthread_cond_broadcast(&qcond);
		pthread_mutex_unlock(&qlock);
		release(&h, "gdr_dereg on the progress thread");
	}
	return NULL;
}

/* One checked registration: 0 and *h (held), or -1 (none held). */
static int reg_one(uint64_t *rs, int si, struct ibv_pd *pd, int access, uint64_t off_pick,
		   uint64_t len_pick, struct hold *h)
{
	struct slot *s = &slots[si];
	uint64_t s1 = atomic_load(&s->seq), va = atomic_load(&s->va), s2, id = 0, cur;
	uint64_t off, len, a;
	struct gdr_region *r = NULL;
	bool pin_ok;
	int rc;

	(void)rs;
	off = (off_pick % (s->size / 4096)) * 4096;
	len = 1 + len_pick % (s->size - off);
	if (len > 64 * KiB)
		len = 64 * KiB;
	a = va + off;
	/* For the diagnosis of a failure (RACE_TORTURE_DIAG): whether the hit was lock-free, and
	 * the events as they stood. */
	struct gdr_thr *thr = diag ? gdr_thr_find(cache) : NULL;
	uint64_t fh0 = thr ? __atomic_load_n(&thr->fast_hits, __ATOMIC_RELAXED) : 0;
	uint64_t ev0 = gdr_events_head(), evn0 = __atomic_load_n(&cache->ev_next, __ATOMIC_ACQUIRE);

	rc = gdr_reg(cache, pd, (void *)(uintptr_t)a, len, access, &r);
	if (!rc)
		gdr_region_buffer_id(r, &id);
	cur = fake_cuda_buffer_id(a);
	pin_ok = !rc && fake_backend_pin_current(r, a, len);
	s2 = atomic_load(&s->seq);
	if (s1 == s2 && !(s1 & 1)) {
		atomic_fetch_add(&n_checked, 1);
		if (rc)
			fail("gdr_reg of a stable buffer failed", a, rc, s->kind);
		else if (id != cur)
			fail(s->kind == K_VMM ? "STALE registration (VMM): buffer id differs from the driver's" :
			     s->kind == K_POOL ? "STALE registration (pool): buffer id differs from the driver's" :
			     "STALE registration: buffer id differs from the driver's", a, (long)id,
			     (long)cur);
		else if (!pin_ok)
			fail("STALE registration: its pin does not map the memory now there", a,
			     (long)len, s->kind);
		if (diag && !rc && (id != cur || !pin_ok)) {
			uint64_t rb = 0, rl = 0;
			struct fake_cuda_alloc_info ai = { 0 };

			gdr_region_range(r, &rb, &rl);
			fake_cuda_alloc_info(a, &ai);
			fprintf(stderr, "  diag: slot %d kind %d size %#" PRIx64 " seq %" PRIu64
				" va %#" PRIx64 " a %#" PRIx64 " len %#" PRIx64 " pd %p r %p range [%#"
				PRIx64 ", +%#" PRIx64 ") id %" PRIu64 " alloc [%#" PRIx64 ", +%#" PRIx64
				") id %" PRIu64 " events head %" PRIu64 "\n", si, s->kind, s->size, s1, va,
				a, len, (void *)pd, (void *)r, rb, rl, id, ai.va, ai.size, ai.buffer_id,
				gdr_events_head());
			fprintf(stderr, "  diag: fast %d ev0 %" PRIu64 " ev_next0 %" PRIu64 " ev_next %"
				PRIu64 " rec [%#" PRIx64 ", +%#" PRIx64 ") exact %d estate %d magic %#x "
				"link %#x entry %p pin [%#" PRIx64 ", +%#" PRIx64 ") state %d tags:",
				thr && __atomic_load_n(&thr->fast_hits, __ATOMIC_RELAXED) != fh0, ev0, evn0,
				__atomic_load_n(&cache->ev_next, __ATOMIC_ACQUIRE), r->start, r->size,
				r->exact, r->estate, r->magic, r->link, (void *)r->entry,
				r->entry->pin.base, r->entry->pin.len, r->entry->state);
			for (uint32_t k = 0; k < r->entry->ntags; k++)
				fprintf(stderr, " [%#" PRIx64 ", +%#" PRIx64 ") id %" PRIu64,
					gdr_entry_tags(r->entry)[k].start,
					gdr_entry_tags(r->entry)[k].size,
					gdr_entry_tags(r->entry)[k].buffer_id);
			fprintf(stderr, "\n");
		}
	} else {
		atomic_fetch_add(&n_unchecked, 1);
		if (rc)
			atomic_fetch_add(&n_fail_reg, 1);
	}
	if (rc)
		return -1;
	atomic_fetch_add(&n_regs, 1);
	*h = (struct hold){ .r = r, .a = a, .len = len, .id = id, .slot = si,
			    .seq = (s1 == s2 && !(s1 & 1)) ? s1 : 1 };
	return 0;
}

static void *worker(void *arg)
{
	int w = (int)(uintptr_t)arg;
	uint64_t rs = (seed + 1) * 0x2545f4914f6cdd1dULL + (uint64_t)w * 7919;
	struct hold kept[KEEP];
	int nkept = 0;

	cuCtxSetCurrent(fake_cuda_primary_context(0));
	while (!atomic_load(&stop)) {
		uint64_t x = rnd(&rs);
		int si = (int)(x % NSLOT);
		struct ibv_pd *pd = (x >> 8) % 3 == 0 ? FAKE_PD : NULL;
		int access = pd ? 1 : 0;
		/* A few ranges per buffer, so that threads meet on one record. */
		uint64_t off_pick = (x >> 16) % 3, len_pick = ((x >> 24) % 2) ? 4095 : 8191;
		unsigned what = (unsigned)((x >> 32) % 100);
		struct hold h, h2;

		if (reg_one(&rs, si, pd, access, off_pick, len_pick, &h))
			continue;
		if (what < 35) {
			release(&h, "gdr_dereg of its own registration");
		} else if (what < 55) {
			if (nkept == KEEP) {
				int k = (int)(rnd(&rs) % KEEP);

				release(&kept[k], "gdr_dereg of a kept registration");
				kept[k] = h;
			} else {
				kept[nkept++] = h;
			}
		} else if (what < 75) {
			hand_over(&h);
		} else {
			/* Twice the same range: usually the same record, two holds of this thread;
			 * one goes to the progress thread, the other is released here, in either
			 * order, racing with the progress thread's release. */
			if (reg_one(&rs, si, pd, access, off_pick, len_pick, &h2)) {
				hand_over(&h);
				continue;
			}
			if (h2.r == h.r)
				atomic_fetch_add(&n_same, 1);
			if (what & 1) {
				hand_over(&h);
				release(&h2, "gdr_dereg racing a progress thread's release");
			} else {
				hand_over(&h2);
				if (what & 2)
					sched_yield();
				release(&h, "gdr_dereg racing a progress thread's release");
			}
		}
	}
	while (nkept)
		release(&kept[--nkept], "gdr_dereg of a kept registration at the end");
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 2.0;
	struct gdr_cache_attr attr = {
		.field_mask = GDR_CACHE_ATTR_MAX_BYTES | GDR_CACHE_ATTR_MAX_ENTRIES |
			      GDR_CACHE_ATTR_MAX_PIN_BYTES | GDR_CACHE_ATTR_VALIDATE,
		.max_bytes = 2 * MiB,
		.max_entries = 2,
		.max_pin_bytes = 2 * MiB,
	};
	struct timespec ts = { .tv_sec = (time_t)seconds,
			       .tv_nsec = (long)((seconds - (time_t)seconds) * 1e9) };
	pthread_t tw[MAXW], tc[2], tf, tp;
	struct gdr_cache_stats st;
	static const struct { int kind; uint64_t size; } layout[NSLOT] = {
		{ K_DEV, 256 * KiB }, { K_POOL, 512 * KiB }, { K_SMALL, 8 * KiB },
		{ K_VMM, 2 * MiB },   { K_DEV, 1536 * KiB }, { K_SMALL, 16 * KiB },
	};
	int rc;

	if (argc > 2)
		seed = (unsigned)strtoul(argv[2], NULL, 0);
	if (argc > 3)
		mode = !strcmp(argv[3], "tag") ? M_TAG : !strcmp(argv[3], "events") ? M_EVENTS :
										   M_INTERCEPT;
	if (argc > 4)
		nworkers = atoi(argv[4]);
	if (nworkers < 1 || nworkers > MAXW)
		return 2;
	diag = getenv("RACE_TORTURE_DIAG") != NULL;
	attr.validate = mode == M_TAG ? GDR_VALIDATE_TAG : GDR_VALIDATE_EVENTS;
	if (mode == M_INTERCEPT)
		setenv("GDRCACHE_KMOD_DEV", "/nonexistent/gdrcache", 0);
	else
		fake_seams.events_probe = probe_simulated;
	fake_verbs_install();
	fake_backend_reset();
	if ((rc = fake_cache_create(&attr, &fake_backend_ops, &cache))) {
		fprintf(stderr, "race_torture: gdr_cache_create: %d\n", rc);
		return 1;
	}
	cuCtxSetCurrent(fake_cuda_primary_context(0));
	for (int i = 0; i < NSLOT; i++) {
		struct slot *s = &slots[i];

		s->kind = layout[i].kind;
		s->size = layout[i].size;
		if (s->kind == K_VMM)
			s->resv = fake_cuda_vmm_reserve(s->size);
		atomic_store(&s->va, slot_alloc(s));
		if (!atomic_load(&s->va)) {
			fprintf(stderr, "race_torture: allocation %d failed\n", i);
			return 1;
		}
	}
	for (int i = 0; i < nworkers; i++)
		pthread_create(&tw[i], NULL, worker, (void *)(uintptr_t)i);
	pthread_create(&tp, NULL, progress, NULL);
	pthread_create(&tc[0], NULL, churner, (void *)(uintptr_t)0);
	pthread_create(&tc[1], NULL, churner, (void *)(uintptr_t)1);
	pthread_create(&tf, NULL, flusher, NULL);
	nanosleep(&ts, NULL);
	atomic_store(&stop, 1);
	for (int i = 0; i < nworkers; i++)
		pthread_join(tw[i], NULL);
	pthread_mutex_lock(&qlock);
	atomic_store(&workers_done, 1);
	pthread_cond_broadcast(&qcond);
	pthread_mutex_unlock(&qlock);
	pthread_join(tp, NULL);
	pthread_join(tc[0], NULL);
	pthread_join(tc[1], NULL);
	pthread_join(tf, NULL);

	if (atomic_load(&n_regs) != atomic_load(&n_deregs))
		fail("registrations not released", 0, (long)atomic_load(&n_regs),
		     (long)atomic_load(&n_deregs));
	if ((rc = gdr_cache_flush(cache)) < 0)
		fail("final flush", 0, rc, 0);
	if (gdr_cache_get_stats(cache, &st))
		fail("stats", 0, 0, 0);
	if (fake_be.outstanding)
		fail("pins left after every hold was released and the cache flushed (hold leaked)",
		     0, (long)fake_be.outstanding, 0);
	if ((rc = gdr_cache_release_pd(cache, FAKE_PD)))
		fail("gdr_cache_release_pd at the end", 0, rc, 0);
	if ((rc = gdr_cache_destroy(cache)))
		fail("gdr_cache_destroy", 0, rc, 0);
	if (fake_be.outstanding || fake_verbs.outstanding)
		fail("pins or MRs left", 0, (long)fake_be.outstanding, (long)fake_verbs.outstanding);
	printf("race_torture: seed %u, %s, %d workers, %.1f s: %llu regs (%llu checked, %llu "
	       "unchecked, %llu failed in a free's window), %llu deregs, %llu handed over, %llu "
	       "same-record pairs, %llu hold checks, %llu frees+reallocs, %llu flushes; cache: %"
	       PRIu64 " hits (%" PRIu64 " lock-free), %" PRIu64 " misses, %" PRIu64 " stale, %"
	       PRIu64 " events, %" PRIu64 " evictions; %d failures\n",
	       seed, mode == M_TAG ? "tag" : mode == M_EVENTS ? "events" : "intercept", nworkers,
	       seconds, atomic_load(&n_regs), atomic_load(&n_checked), atomic_load(&n_unchecked),
	       atomic_load(&n_fail_reg), atomic_load(&n_deregs), atomic_load(&n_handed),
	       atomic_load(&n_same), atomic_load(&n_stable_hold_checks), atomic_load(&n_churn),
	       atomic_load(&n_flush), st.hits, st.fast_hits, st.misses, st.stale, st.events,
	       st.evictions, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}
