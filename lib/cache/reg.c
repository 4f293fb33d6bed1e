/* SPDX-License-Identifier: MIT */
/*
 * The two paths of gdr_reg and gdr_dereg. The hit path takes no lock and writes no cache line that
 * other threads' hits write: it finds the registration record in the index's hash (or this thread's
 * memo of its last hit), adds one to its own thread's hold counter for it and validates; anything
 * else takes the cache's mutex (miss.c).
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "cache/cache.h"
#include "intercept/events.h"
#include "nic/verbs.h"

/* The record serving (pd, access, [a, a+len)) in the index's hash (index.h), or NULL; *slot: its
 * number, read from the hash's slot, so that the caller's hold counter is loaded beside the record
 * rather than after it. Records are c's rec_base[]. Inside a read-side section: records found are
 * not retired and reused under us. Levels are probed most populated first.
 *
 * A random hit must not branch on what it reads: a mispredicted branch costs as much as the rest of
 * the lookup, and the slot-by-slot walk of a probe run mispredicted on most random hits (callgrind's
 * branch model: 1.1 to 2.0 a hit over 128 to 4,096 random 1 MiB buffers, two to a 2 MiB granule,
 * their slots in no particular order). So the most populated level, where most hits are, reads the
 * key's bucket (hix_bucket) whole, without a branch; the others, probed only when it failed and
 * mostly to find the key absent, take the walk (hix_walk), which stops at the first empty slot. */

/* The walk of key fp's probe run from slot j, slot by slot: decides every case. */
static inline struct gdr_region *hix_walk(const struct gdr_hix *h, struct gdr_region *base,
					  const struct ibv_pd *pd, int access, uint64_t a,
					  uint64_t len, bool exact, uint64_t j, uint64_t fp,
					  uint64_t part, uint32_t *slot)
{
	uint64_t mask = (1ULL << h->bits) - 1;

	for (;; j = (j + 1) & mask) {
		uint64_t w = __atomic_load_n(&h->v[j], __ATOMIC_ACQUIRE);

		if (w == GDR_HIX_EMPTY)
			return NULL;
		if (gdr_hix_fp_of(w) == fp && gdr_hix_first(w) <= part && part <= gdr_hix_last(w)) {
			uint32_t s = gdr_hix_slot(w);

			if (gdr_record_serves(&base[s], pd, access, a, len, exact)) {
				*slot = s;
				return &base[s];
			}
		}
	}
}

/* Of (*x, *d) and (y, e), the one of least d into (*x, *d), the first on a tie: conditional moves
 * (of scalars, not of an array's elements, which a compiler keeps in memory and branches on). */
static inline void hix_least(uint64_t *x, uint64_t *d, uint64_t y, uint64_t e)
{
	bool less = e < *d;

	*x = less ? y : *x;
	*d = less ? e : *d;
}

/* The bucket of key fp at slot j, read whole. A slot's top 35 bits are its fingerprint and its
 * last 512th; t is the key's fingerprint and the address's 512th: d = (slot >> 29) - t lies in
 * [0, 511 - part] only for the key's slots that end at or after the address, and the one of them
 * that ends first (least d) is the only one that may hold it (records of one key do not overlap,
 * but for another pd or access of one allocation, or an exact range: the walk's cases). The
 * least is found pairwise (a tree, not a chain of dependent selections), written out (a compiler
 * keeps a loop's arrays in memory). A bucket with an empty slot and no slot of the key ending at
 * or after the address proves it absent; any other failure takes the walk. */
static inline struct gdr_region *hix_bucket(const struct gdr_hix *h, struct gdr_region *base,
					    const struct ibv_pd *pd, int access, uint64_t a,
					    uint64_t len, bool exact, uint64_t j, uint64_t fp,
					    uint64_t part, uint32_t *slot)
{
	const uint64_t *b = &h->v[j];
	uint64_t t = (fp >> 29) | part, x0, x1, x2, x3, d0, d1, d2, d3;

	_Static_assert(GDR_HIX_BUCKET == 4, "hix_bucket reads four slots");
	x0 = __atomic_load_n(&b[0], __ATOMIC_ACQUIRE);
	x1 = __atomic_load_n(&b[1], __ATOMIC_ACQUIRE);
	x2 = __atomic_load_n(&b[2], __ATOMIC_ACQUIRE);
	x3 = __atomic_load_n(&b[3], __ATOMIC_ACQUIRE);
	d0 = (x0 >> 29) - t;
	d1 = (x1 >> 29) - t;
	d2 = (x2 >> 29) - t;
	d3 = (x3 >> 29) - t;
	hix_least(&x0, &d0, x1, d1);
	hix_least(&x2, &d2, x3, d3);
	hix_least(&x0, &d0, x2, d2);
	/* ... and it holds the address if it begins at or before it: one branch. */
	if (__builtin_expect((d0 <= 511 - part) & (gdr_hix_first(x0) <= part), 1)) {
		uint32_t s = gdr_hix_slot(x0);

		if (__builtin_expect(gdr_record_serves(&base[s], pd, access, a, len, exact), 1)) {
			*slot = s;
			return &base[s];
		}
	} else if ((d0 > 511 - part) &
		   ((__atomic_load_n(&b[0], __ATOMIC_RELAXED) == GDR_HIX_EMPTY) |
		    (__atomic_load_n(&b[1], __ATOMIC_RELAXED) == GDR_HIX_EMPTY) |
		    (__atomic_load_n(&b[2], __ATOMIC_RELAXED) == GDR_HIX_EMPTY) |
		    (__atomic_load_n(&b[3], __ATOMIC_RELAXED) == GDR_HIX_EMPTY))) {
		/* Not at this level: no slot of the key ends at or after the address, and the run
		 * ends in this bucket. (A slot that does but begins after the address may hide one
		 * that overlaps it, ending later: an exact range inside a shared one. The walk.) */
		return NULL;
	}
	return hix_walk(h, base, pd, access, a, len, exact, j, fp, part, slot);
}

static inline struct gdr_region *hix_lookup(const struct gdr_hix *h, struct gdr_region *base,
					    const struct ibv_pd *pd, int access, uint64_t a,
					    uint64_t len, bool exact, uint32_t *slot)
{
	uint64_t order = __atomic_load_n(&h->order, __ATOMIC_ACQUIRE);

	for (unsigned n = (unsigned)(order >> 60), i = 0; i < n; i++, order >>= 4) {
		unsigned k = (unsigned)(order & 15);
		uint64_t key = gdr_hix_key(a, k), part = gdr_hix_part(a, k), fp = gdr_hix_fp(key);
		uint64_t j = gdr_hix_pos(key, h->bits);
		struct gdr_region *r =
			!i ? hix_bucket(h, base, pd, access, a, len, exact, j, fp, part, slot)
			   : hix_walk(h, base, pd, access, a, len, exact, j, fp, part, slot);

		if (r)
			return r;
	}
	return NULL;
}

/* What the hit path found wrong with a held entry: the locked path retires it. */
struct stale_hit {
	struct gdr_entry *e;
	int64_t *ctr; /* the hold to give back once e is retired */
	bool revoked;
};

/* The hit path: no lock, no shared write. 0 and *out; 1: take the locked path; 2: the same, but
 * the entry in *st failed validation (still held). */
static int reg_fast(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		    uint64_t len, int access, bool exact, struct gdr_region **out,
		    struct stale_hit *st)
{
	struct gdr_entry *e = NULL;
	struct gdr_region *r = NULL;
	int64_t *ctr = NULL;
	uint64_t gen;
	uint32_t slot = 0;

	if (!pd)
		access = 0;
	if (c->validator->events &&
	    gdr_events_head() != __atomic_load_n(&c->ev_next, __ATOMIC_ACQUIRE))
		return 1; /* a free to apply first */
	gdr_thr_enter(t);
	gen = __atomic_load_n(&c->gen, __ATOMIC_SEQ_CST);
	r = t->memo;
	/* Whether a lies in the memo's range first: on random buffers that one test fails, and
	 * predictably, where the whole test of gdr_record_serves would be paid on every hit. */
	if (r && t->memo_gen == gen && a - r->start < r->size &&
	    gdr_record_serves(r, pd, access, a, len, exact)) {
		/* The same record as this thread's last hit, and nothing retired since: no search. */
		e = r->entry;
		slot = gdr_rec_slot(r);
	} else {
		r = hix_lookup(__atomic_load_n(&c->hix, __ATOMIC_ACQUIRE), c->rec_base, pd, access,
			       a, len, exact, &slot);
		e = r ? r->entry : NULL;
	}
	/* A record's range lies in its entry's: serving the request, it is inside the pin. */
	if (r && __atomic_load_n(&r->estate, __ATOMIC_SEQ_CST) == GDR_LIVE &&
	    __atomic_load_n(&r->magic, __ATOMIC_SEQ_CST) == GDR_REGION_LIVE)
		ctr = gdr_thr_counter(t, slot);
	if (ctr) {
		__atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
		t->memo = r;
		t->memo_gen = gen;
	}
	gdr_thr_leave(t);
	if (!ctr)
		return 1;
	/* Held: e stays pinned and indexed or detached; now prove the memory is still the same. */
	*st = (struct stale_hit){ .e = e, .ctr = ctr, .revoked = gdr_entry_revoked(c, e) };
	if (st->revoked)
		return 2;
	if (!c->validator->events) {
		struct gdr_tag tag = { .start = r->start,
				       .size = r->size,
				       .buffer_id = r->buffer_id };

		__atomic_store_n(&t->tag_checks, t->tag_checks + 1, __ATOMIC_RELAXED);
		if (c->validator->check(&tag))
			return 2;
	}
	if (!__atomic_load_n(&r->used, __ATOMIC_RELAXED))
		__atomic_store_n(&r->used, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&t->fast_hits, t->fast_hits + 1, __ATOMIC_RELAXED);
	*out = r;
	return 0;
}

static int reg_slow(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		    uint64_t len, int access, bool exact, bool cached_only,
		    const struct stale_hit *st, struct gdr_region **region);

/* This thread's record in c, made at its first registration there (it allocates): errno kept. */
static __attribute__((noinline)) struct gdr_thr *thr_first(struct gdr_cache *c)
{
	GDR_KEEP_ERRNO();

	return gdr_thr_get(c);
}

GDR_EXPORT int gdr_reg(struct gdr_cache *c, struct ibv_pd *pd, void *addr, size_t len, int access,
		       struct gdr_region **region)
{
	uint64_t a = (uintptr_t)addr;
	bool wide = access & GDR_ACCESS_WIDE_MR, cached_only = access & GDR_REG_CACHED_ONLY, exact;
	struct stale_hit st;
	struct gdr_thr *t;
	int rc;

	if (!c || !region) {
		gdr_err("NULL %s", c ? "region pointer" : "cache");
		return -EINVAL;
	}
	*region = NULL;
	access &= ~(GDR_ACCESS_WIDE_MR | GDR_REG_CACHED_ONLY);
	/* Remote access gets keys bounded by what was asked (a remote peer must not reach the rest
	 * of the pin), unless the caller asked for the wide MR. */
	exact = pd && (access & GDR_IBV_ACCESS_REMOTE) && !wide;
	if (!len || a + len < a) {
		gdr_cache_lock(c);
		c->st.fail_input++;
		gdr_cache_unlock_plain(c);
		gdr_err("bad range [%p, +%zu): %s", addr, len,
			len ? "wraps around" : "zero length");
		return -EINVAL;
	}
	t = gdr_thr_find(c); /* no libc once this thread has its record */
	if (__builtin_expect(!t, 0) && !(t = thr_first(c)))
		return -ENOMEM;
	rc = reg_fast(c, t, pd, a, len, access, exact, region, &st);
	if (!rc)
		return 0;
	if (rc == 1 && cached_only)
		return -ENOENT; /* nothing asked of the driver, nothing locked */
	return reg_slow(c, t, pd, a, len, access, exact, cached_only, rc == 2 ? &st : NULL, region);
}

/* The locked path of gdr_reg: a miss, free events to apply first, or st: the stale entry a hit
 * found (still held). Out of line, so that the hit path keeps its registers; errno kept (pins,
 * MRs, eviction). */
static __attribute__((noinline)) int reg_slow(struct gdr_cache *c, struct gdr_thr *t,
					      struct ibv_pd *pd, uint64_t a, uint64_t len,
					      int access, bool exact, bool cached_only,
					      const struct stale_hit *st,
					      struct gdr_region **region)
{
	GDR_KEEP_ERRNO();
	int rc;

	gdr_cache_lock(c);
	if (st) {
		/* Stale (or not provably valid): retired while our hold keeps it, then let go. */
		c->st.revoked += st->revoked;
		if (__atomic_load_n(&st->e->state, __ATOMIC_RELAXED) == GDR_LIVE)
			gdr_entry_stale(c, st->e);
		__atomic_store_n(st->ctr, __atomic_load_n(st->ctr, __ATOMIC_RELAXED) - 1,
				 __ATOMIC_RELAXED);
	}
	if (cached_only) {
		gdr_cache_unlock(c);
		return -ENOENT;
	}
	for (unsigned tries = 0;; tries++) {
		rc = gdr_reg_locked(c, t, pd, a, len, access, exact, region);
		if (rc != -EINPROGRESS)
			break;
		__atomic_add_fetch(&c->reg_waits, 1, __ATOMIC_RELAXED);
		gdr_cache_unlock(c);
		if (tries < 64)
			sched_yield();
		else
			nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);
		gdr_cache_lock(c);
	}
	if (!rc)
		gdr_evict(c, 0);
	gdr_cache_unlock(c);
	return rc;
}

/* Release a host registration (passed through, not cached). */
static __attribute__((noinline)) int host_put(struct gdr_cache *c, struct gdr_region *r)
{
	GDR_KEEP_ERRNO(); /* ibv_dereg_mr */

	gdr_cache_lock(c);
	if (!gdr_region_handed(r) || !__atomic_exchange_n(&r->used, 0, __ATOMIC_RELAXED)) {
		c->st.fail_input++;
		gdr_cache_unlock_plain(c);
		gdr_err("region %p was already released (double gdr_dereg?)", (void *)r);
		return -EINVAL;
	}
	gdr_verbs_dereg(c->sys.verbs, r->mr);
	c->nhost--;
	gdr_record_retire(c, r);
	gdr_record_free(c, r); /* host records are never read without the lock */
	gdr_cache_unlock_plain(c);
	return 0;
}

/* A release by a thread that holds none of r itself (another thread registered it): under the
 * lock, where r cannot be retired, and only while the holds summed over threads are above zero.
 * Needs no memory: the hold is given back in the cache's count for r's slot (thread.h). */
static __attribute__((noinline)) int dereg_locked(struct gdr_cache *c, struct gdr_region *r)
{
	GDR_KEEP_ERRNO(); /* eviction unpins */
	int64_t *rel;

	gdr_cache_lock(c);
	rel = gdr_thr_released(c, gdr_rec_slot(r)); /* there for every slot ever held */
	if (!gdr_region_handed(r) || !rel || gdr_region_holds(c, r) <= 0) {
		c->st.fail_input++;
		gdr_cache_unlock_plain(c);
		gdr_err("region %p holds no reference: double gdr_dereg", (void *)r);
		return -EINVAL;
	}
	++*rel;
	if (__atomic_load_n(&r->estate, __ATOMIC_RELAXED) != GDR_LIVE ||
	    __atomic_load_n(&c->over_limit, __ATOMIC_RELAXED))
		gdr_evict(c, 0); /* what this release made evictable; detached entries are reaped */
	gdr_cache_unlock(c);
	return 0;
}

/* What a release made evictable (detached entries are reaped). Out of line; errno kept (unpins). */
static __attribute__((noinline)) void dereg_evict(struct gdr_cache *c)
{
	GDR_KEEP_ERRNO();

	gdr_cache_lock(c);
	gdr_evict(c, 0);
	gdr_cache_unlock(c);
}

GDR_EXPORT int gdr_dereg(struct gdr_region *r)
{
	struct gdr_cache *c;
	struct gdr_thr *t;
	uint32_t state = GDR_LIVE;
	bool fast = false;

	if (!r) {
		gdr_err("NULL region");
		return -EINVAL;
	}
	/* Records are never freed while their cache lives: reading a released one is safe. */
	c = gdr_rec_cache(r);
	if (__builtin_expect(!r->entry, 0)) {
		if (!gdr_region_handed(r))
			goto released;
		return host_put(c, r);
	}
	t = gdr_thr_find(c);
	if (__builtin_expect(t != NULL, 1)) {
		/* Inside a read-side section: r and its entry are not retired and reused under us,
		 * and nothing of them is read after the hold is given back but in it. */
		gdr_thr_enter(t);
		if (__builtin_expect(gdr_region_handed(r), 1)) {
			int64_t *ctr = gdr_thr_counter(t, gdr_rec_slot(r));
			int64_t v = ctr ? __atomic_load_n(ctr, __ATOMIC_RELAXED) : 0;

			if (__builtin_expect(v > 0, 1)) {
				__atomic_store_n(ctr, v - 1, __ATOMIC_RELEASE);
				/* The entry's state as mirrored in r (gdr_entry_set_state
				 * writes it before its grace period): no line of the entry. */
				state = __atomic_load_n(&r->estate, __ATOMIC_SEQ_CST);
				fast = true;
			}
		}
		gdr_thr_leave(t);
	}
	if (!fast) {
		if (!gdr_region_handed(r))
			goto released;
		return dereg_locked(c, r);
	}
	/* Detached (held when it left the index): reap it if this was its last hold. Dying: its
	 * retirer sums the holds after a grace period that waits for this release. */
	if (state == GDR_DETACHED || __atomic_load_n(&c->over_limit, __ATOMIC_RELAXED))
		dereg_evict(c);
	return 0;

released:
	gdr_err("region %p was already released (double gdr_dereg?)", (void *)r);
	return -EINVAL;
}
