/* SPDX-License-Identifier: MIT */
/*
 * The two paths of gdr_reg and gdr_dereg. The hit path takes no lock and writes no cache line that
 * other threads' hits write: it finds the registration record in the index's hash (or this thread's
 * memo of its last hit), adds one to its own thread's hold counter for it and validates; anything
 * else takes the cache's mutex (miss.c).
 */
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "cache/cache.h"
#include "intercept/monitor.h"
#include "common/testpoint.h"
#include "intercept/events.h"
#include "nic/verbs.h"

/* Finding the record serving (pd, access, [a, a+len)) in the index's hash (index.h). A slot gives
 * the record's number, so that the caller's hold counter is loaded beside the record rather than
 * after it. Records are c's rec_base[]. Inside a read-side section: records found are not retired
 * and reused under us. Levels are probed most populated first.
 *
 * A random hit must not branch on what it reads: a mispredicted branch costs as much as the rest of
 * the lookup, and the slot-by-slot walk of a probe run mispredicted on most random hits (callgrind's
 * branch model: 1.1 to 2.0 a hit over 128 to 4,096 random 1 MiB buffers, two to a 2 MiB granule,
 * their slots in no particular order). So a level's lookup reads the key's bucket (hix_bucket)
 * whole, without a branch, and the walk (hix_walk), which stops at the first empty slot, is left to
 * what a bucket cannot decide. And a hit is bound by its instruction count (no mispredicted branch,
 * five or six instructions a cycle at best on the H100 machine): gdr_reg's hit is reg_hot's first
 * case alone, inline, and every other case leaves it by a tail call (gdr_reg, below). */

/* The walk of key fp's probe run from slot j, slot by slot: decides every case. Out of line: the
 * general path's, for the cases a bucket leaves. */
static __attribute__((noinline)) struct gdr_region *
hix_walk(const struct gdr_hix *h, struct gdr_region *base, const struct ibv_pd *pd, int access,
	 uint64_t a, uint64_t len, bool exact, uint64_t j, uint64_t fp, uint64_t part,
	 uint32_t *slot)
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

/* What hix_bucket returns but a slot number: the key is not at this level; the bucket decides
 * nothing (the walk does); no slot of the bucket holds the address, but the key's run may go on
 * past it (the next bucket, or the walk, decides). */
#define HIX_ABSENT (-1)
#define HIX_WALK (-2)
#define HIX_NEXT (-3)

/* Whether slot x is of the key and covers the address (t and part as hix_bucket has them). */
static inline bool hix_holds(uint64_t x, uint64_t t, uint64_t part)
{
	uint64_t y = x - t;

	return (y >> 29 <= 511 - part) & (gdr_hix_first(y) <= part);
}

/* The bucket of key fp at slot j, read whole: the slot number of the only record of the key that
 * may hold the address, HIX_ABSENT, HIX_WALK or HIX_NEXT. A slot's top 35 bits are its fingerprint and its
 * last 512th; t is the key's fingerprint and the address's 512th, in place: the top 35 bits of
 * y = slot - t are (last 512th - address's 512th), in [0, 511 - part] only for the key's slots
 * that end at or after the address (any other slot's wrap or exceed it: another fingerprint
 * differs by 512 or more, an empty slot's by more than t), and y's low 29 bits are the slot's
 * own (first 512th, record). So the least y is the key's record that ends first at or after the
 * address, the only one that may hold it (records of one key do not overlap, but for another pd
 * or access of one allocation, or an exact range: the walk's cases, which the caller finds when
 * that record does not serve the request). Least of four: conditional moves, pairwise (a tree,
 * not a chain). A bucket that no run of the key went past (its filter, index.h) and that holds no
 * slot of the key covering the address proves it absent. */
static inline __attribute__((always_inline)) int64_t hix_bucket(const struct gdr_hix *h, uint64_t j,
								uint64_t fp, uint64_t part)
{
	const uint64_t *b = &h->v[j];
	uint64_t t = fp | part << 29, y0, y1, y2, y3;

	_Static_assert(GDR_HIX_BUCKET == 4, "hix_bucket reads four slots");
	_Static_assert(GDR_HIX_SLOT_BITS + 9 == 29 && GDR_HIX_FP_SHIFT == 38,
		       "a slot's last 512th is its bits 29..37, its fingerprint above");
	y0 = __atomic_load_n(&b[0], __ATOMIC_ACQUIRE) - t;
	y1 = __atomic_load_n(&b[1], __ATOMIC_ACQUIRE) - t;
	y2 = __atomic_load_n(&b[2], __ATOMIC_ACQUIRE) - t;
	y3 = __atomic_load_n(&b[3], __ATOMIC_ACQUIRE) - t;
	y0 = y1 < y0 ? y1 : y0;
	y2 = y3 < y2 ? y3 : y2;
	y0 = y2 < y0 ? y2 : y0;
	/* ... and it holds the address if it begins at or before it: one branch. */
	if (__builtin_expect((y0 >> 29 <= 511 - part) & (gdr_hix_first(y0) <= part), 1))
		return gdr_hix_slot(y0);
	/* Else, where no slot of the key ends at or after the address: none here holds it. */
	if (y0 >> 29 <= 511 - part) {
		/* One does but begins after it: read again whether another slot of the key holds
		 * it (another pd or access of one allocation, an exact range inside a shared one:
		 * the walk). Views torn between the two reads can only make a hit miss, and a miss
		 * takes the locked path. */
		y0 = __atomic_load_n(&b[0], __ATOMIC_RELAXED);
		y1 = __atomic_load_n(&b[1], __ATOMIC_RELAXED);
		y2 = __atomic_load_n(&b[2], __ATOMIC_RELAXED);
		y3 = __atomic_load_n(&b[3], __ATOMIC_RELAXED);
		if (hix_holds(y0, t, part) | hix_holds(y1, t, part) | hix_holds(y2, t, part) |
		    hix_holds(y3, t, part))
			return HIX_WALK;
	}
	/* None here holds it: not at this level, unless the key's run went on past the bucket. */
	return gdr_hix_overflowed(h, j, fp) ? HIX_NEXT : HIX_ABSENT;
}

/* The record serving the request at the levels from the from-th (most populated first), or NULL;
 * *slot: its number. Each level's bucket, the next bucket where the key's run went on past it, and
 * the walk (out of line, counted in *walks) where these decide nothing or their record does not
 * serve the request. */
static inline __attribute__((always_inline)) struct gdr_region *
hix_levels(const struct gdr_hix *h, struct gdr_region *base, const struct ibv_pd *pd, int access,
	   uint64_t a, uint64_t len, bool exact, unsigned from, uint32_t *slot, uint64_t *walks)
{
	uint64_t order = __atomic_load_n(&h->order, __ATOMIC_ACQUIRE);
	unsigned n = (unsigned)(order >> 60);
	struct gdr_region *r = NULL;

	order >>= 4 * from;
	for (unsigned i = from; !r && i < n; i++, order >>= 4) {
		unsigned k = (unsigned)(order & 15);
		uint64_t part, key = gdr_hix_key_part(a, k, &part);
		uint64_t fp = gdr_hix_fp(key), j = gdr_hix_pos(key, h->bits);
		int64_t s = hix_bucket(h, j, fp, part);

		if (s == HIX_NEXT) /* most runs that leave a bucket end in the next */
			s = hix_bucket(h, (j + GDR_HIX_BUCKET) & ((1ULL << h->bits) - 1), fp, part);
		if (s == HIX_ABSENT)
			continue;
		if (s >= 0 && gdr_record_serves(&base[s], pd, access, a, len, exact)) {
			r = &base[s];
			*slot = (uint32_t)s;
		} else {
			__atomic_store_n(walks, *walks + 1, __ATOMIC_RELAXED);
			r = hix_walk(h, base, pd, access, a, len, exact, j, fp, part, slot);
		}
	}
	return r;
}

/* A request's access as records keep it: without the library's own flags, and 0 without a pd (no
 * MR: access means nothing, and gdr_entry_take records 0); and whether it needs an exact MR:
 * remote access gets keys bounded by what was asked (a remote peer must not reach the rest of the
 * pin), unless the caller asked for the wide MR; a zero-based MR is one of exactly its range
 * always (its offsets count from the range's start, where the wide MR's count from the pin's). */
static inline int req_access(const struct ibv_pd *pd, int access)
{
	return pd ? access & ~(GDR_ACCESS_WIDE_MR | GDR_REG_CACHED_ONLY) : 0;
}

static inline bool req_exact(const struct ibv_pd *pd, int access)
{
	return pd && (((access & GDR_IBV_ACCESS_REMOTE) && !(access & GDR_ACCESS_WIDE_MR)) ||
		      (access & GDR_IBV_ACCESS_ZERO_BASED));
}

/* What the hit path found wrong with a held entry: the locked path retires it. */
struct stale_hit {
	struct gdr_entry *e;
	int64_t *ctr; /* the hold to give back once e is retired */
	bool revoked;
};

/* This thread's hold on r (NULL: none found), found at slot by a search that began at the cache's
 * gen: its hold counter one higher, and r its memo. Inside the read-side section. NULL where r is
 * not live (a record's range lies in its entry's: serving the request and live, it is inside the
 * pin) or the thread has no counter for its slot yet. */
static inline __attribute__((always_inline)) int64_t *
hold_take(struct gdr_thr *t, struct gdr_region *r, uint32_t slot, uint64_t gen)
{
	int64_t *ctr = NULL;

	if (r && __atomic_load_n(&r->estate, __ATOMIC_SEQ_CST) == GDR_LIVE &&
	    __atomic_load_n(&r->magic, __ATOMIC_SEQ_CST) == GDR_REGION_LIVE)
		ctr = gdr_thr_counter(t, slot);
	if (ctr) {
		__atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
		t->memo = r;
		t->memo_gen = gen;
	}
	return ctr;
}

/* What reg_hot leaves to the rest of gdr_reg. */
enum hot_miss {
	HOT_GENERAL, /* everything, from the start */
	HOT_REST,    /* the other levels (reg_rest), then everything */
	HOT_LEVELS,  /* every level, the first's next bucket too (reg_levels), then everything */
};

/* reg_hot's from that asks for the memo and the most populated level's bucket alone. */
#define HOT_FIRST (~0u)

/* The hit path: no lock, no shared write. The record found, held (this thread's hold counter for
 * it is one higher), or NULL and *how: nothing held, nothing written but this thread's epoch.
 * Only what most hits need: mode events, and, with from HOT_FIRST, the memo and the most
 * populated level's bucket alone, few values live (the caller's arguments wait in registers for
 * the tail call that takes any other case: *how says which); else the levels from the from-th,
 * each one's bucket, the next bucket where the key's run went on past it, and the walk (out of
 * line) where these decide nothing. The entry's checks are the caller's. */
static inline __attribute__((always_inline)) struct gdr_region *
reg_hot(struct gdr_cache *c, struct gdr_thr *t, const struct ibv_pd *pd, uint64_t a, uint64_t len,
	int access, bool exact, unsigned from, enum hot_miss *how)
{
	struct gdr_region *r = NULL;
	int64_t *ctr = NULL;
	uint64_t gen;
	uint32_t slot = 0;

	*how = HOT_GENERAL;
	if (__builtin_expect(!c->events, 0) ||
	    gdr_events_head() != __atomic_load_n(&c->ev_next, __ATOMIC_ACQUIRE))
		return NULL; /* hits need their check, or a free to apply first */
	gdr_thr_enter(t);
	gen = __atomic_load_n(&c->gen, __ATOMIC_SEQ_CST);
	if (from == HOT_FIRST) {
		r = t->memo;
		/* Whether a lies in the memo's range first: on random buffers that one test
		 * fails, and predictably, where the whole test of gdr_record_serves would be paid
		 * on every hit. */
		if (r && t->memo_gen == gen && a - r->start < r->size &&
		    gdr_record_serves(r, pd, access, a, len, exact)) {
			slot = gdr_rec_slot(r); /* this thread's last hit, nothing retired since */
		} else {
			const struct gdr_hix *h = __atomic_load_n(&c->hix, __ATOMIC_ACQUIRE);
			uint64_t order = __atomic_load_n(&h->order, __ATOMIC_ACQUIRE);
			unsigned k = (unsigned)(order & 15); /* level 0 of an empty hash: absent */
			uint64_t part, key = gdr_hix_key_part(a, k, &part);
			uint64_t fp = gdr_hix_fp(key), j = gdr_hix_pos(key, h->bits);
			int64_t s = hix_bucket(h, j, fp, part);

			r = NULL;
			if (__builtin_expect(s >= 0, 1)) {
				r = &c->rec_base[s];
				slot = (uint32_t)s;
				if (!gdr_record_serves(r, pd, access, a, len, exact))
					r = NULL;
			} else if (s == HIX_ABSENT) {
				*how = order >> 60 > 1 ? HOT_REST : HOT_GENERAL;
			} else if (s == HIX_NEXT) {
				*how = HOT_LEVELS;
			}
		}
	} else {
		r = hix_levels(__atomic_load_n(&c->hix, __ATOMIC_ACQUIRE), c->rec_base, pd, access,
			       a, len, exact, from, &slot, &t->walks);
	}
	ctr = hold_take(t, r, slot, gen);
	gdr_thr_leave(t);
	return ctr ? r : NULL;
}

/* The general path's lock-free attempt: every case reg_hot leaves (mode tag, revocation, a walk).
 * 0 and *out; 1: take the locked path; 2: the same, but the entry in *st failed validation (still
 * held). */
static int reg_fast(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		    uint64_t len, int access, bool exact, struct gdr_region **out,
		    struct stale_hit *st)
{
	struct gdr_entry *e = NULL;
	struct gdr_region *r = NULL;
	int64_t *ctr = NULL;
	uint64_t gen;
	uint32_t slot = 0;

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
		r = hix_levels(__atomic_load_n(&c->hix, __ATOMIC_ACQUIRE), c->rec_base, pd, access,
			       a, len, exact, 0, &slot, &t->walks);
		e = r ? r->entry : NULL;
	}
	/* An exact record over several allocations keeps the tag of the first alone: mode tag
	 * proves it under the lock, with every tag of its entry that it overlaps. */
	if (r && r->exact > 1 && !c->validator->events)
		r = NULL;
	ctr = hold_take(t, r, slot, gen);
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

/* A registration refused before or after the locked path (miss.c logs its own): its debug line,
 * the reason's own line (if any) logged at its level already. Out of line, off the hit path. */
static __attribute__((noinline, cold)) int reg_refuse(const struct gdr_cache *c, uint64_t a,
						      uint64_t len, int rc, const char *why)
{
	gdr_dbg("refuse cache=%llu addr=%#llx len=%llu rc=%d why=%s",
		(unsigned long long)(c ? c->id : 0), (unsigned long long)a, (unsigned long long)len,
		rc, why);
	return rc;
}

/* This thread's record in c, made at its first registration there (it allocates): errno kept. */
static __attribute__((noinline)) struct gdr_thr *thr_first(struct gdr_cache *c)
{
	GDR_KEEP_ERRNO();

	return gdr_thr_get(c);
}

/* gdr_reg whole: every case, checked from the start. */
static __attribute__((noinline)) int reg_general(struct gdr_cache *c, struct ibv_pd *pd, void *addr,
						 size_t len, int access, struct gdr_region **region)
{
	uint64_t a = (uintptr_t)addr;
	bool cached_only = access & GDR_REG_CACHED_ONLY, exact = req_exact(pd, access);
	struct stale_hit st;
	struct gdr_thr *t;
	int rc;

	if (!c || !region) {
		gdr_err("NULL %s", c ? "region pointer" : "cache");
		return reg_refuse(c, a, len, -EINVAL, c ? "null_region_pointer" : "null_cache");
	}
	*region = NULL;
	if (gdr_monitor_in_callback()) /* a miss would wait for the free this thread is making */
		return reg_refuse(c, a, len, gdr_monitor_refuse("gdr_reg (a miss)"),
				  "in_free_callback");
	access = req_access(pd, access);
	if (!len || a + len < a) {
		gdr_cache_lock(c);
		c->st.fail_input++;
		gdr_cache_unlock_plain(c);
		gdr_err("bad range [%p, +%zu): %s", addr, len,
			len ? "wraps around" : "zero length");
		return reg_refuse(c, a, len, -EINVAL, len ? "range_wraps" : "zero_length");
	}
	t = gdr_thr_find(c); /* no libc once this thread has its record */
	if (__builtin_expect(!t, 0) && !(t = thr_first(c)))
		return reg_refuse(c, a, len, -ENOMEM, "no_memory");
	rc = reg_fast(c, t, pd, a, len, access, exact, region, &st);
	if (!rc)
		return 0;
	if (rc == 1 && cached_only) /* nothing asked of the driver, nothing locked */
		return reg_refuse(c, a, len, -ENOENT, "not_cached");
	return reg_slow(c, t, pd, a, len, access, exact, cached_only, rc == 2 ? &st : NULL, region);
}

/* A hit reg_hot took (r, held by t) where a backend in use revokes. Revoked, it goes the general
 * path's way (retired, the hold given back); else it is the hit. */
static __attribute__((noinline)) int reg_held(struct gdr_cache *c, struct gdr_thr *t,
					      struct gdr_region *r, struct ibv_pd *pd, void *addr,
					      size_t len, int access, struct gdr_region **region)
{
	struct stale_hit st = { .e = r->entry,
				.ctr = gdr_thr_counter(t, gdr_rec_slot(r)),
				.revoked = true };

	if (!gdr_entry_revoked(c, st.e)) {
		if (!__atomic_load_n(&r->used, __ATOMIC_RELAXED))
			__atomic_store_n(&r->used, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&t->fast_hits, t->fast_hits + 1, __ATOMIC_RELAXED);
		*region = r;
		return 0;
	}
	*region = NULL;
	return reg_slow(c, t, pd, (uintptr_t)addr, len, req_access(pd, access),
			req_exact(pd, access), access & GDR_REG_CACHED_ONLY, &st, region);
}

/* A hit of reg_hot: the rest of gdr_reg's. */
static inline __attribute__((always_inline)) int reg_done(struct gdr_cache *c, struct gdr_thr *t,
							  struct gdr_region *r, struct ibv_pd *pd,
							  void *addr, size_t len, int access,
							  struct gdr_region **region)
{
	if (__builtin_expect(__atomic_load_n(&c->may_revoke, __ATOMIC_RELAXED), 0))
		return reg_held(c, t, r, pd, addr, len, access, region);
	if (!__atomic_load_n(&r->used, __ATOMIC_RELAXED))
		__atomic_store_n(&r->used, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&t->fast_hits, t->fast_hits + 1, __ATOMIC_RELAXED);
	*region = r;
	return 0;
}

/* reg_hot from the from-th level, then the general path: the request is checked, and the thread
 * has its record. */
static inline __attribute__((always_inline)) int reg_from(struct gdr_cache *c, struct ibv_pd *pd,
							  void *addr, size_t len, int access,
							  struct gdr_region **region, unsigned from)
{
	struct gdr_thr *t = gdr_thr_find(c); /* gdr_reg's, found again */
	enum hot_miss how;
	struct gdr_region *r;

	if (__builtin_expect(!t, 0))
		return reg_general(c, pd, addr, len, access, region);
	r = reg_hot(c, t, pd, (uintptr_t)addr, len, req_access(pd, access), req_exact(pd, access),
		    from, &how);
	if (__builtin_expect(!r, 0))
		return reg_general(c, pd, addr, len, access, region);
	return reg_done(c, t, r, pd, addr, len, access, region);
}

/* What reg_hot found absent at the most populated level: the other levels. */
static __attribute__((noinline)) int reg_rest(struct gdr_cache *c, struct ibv_pd *pd, void *addr,
					      size_t len, int access, struct gdr_region **region)
{
	return reg_from(c, pd, addr, len, access, region, 1);
}

/* What reg_hot found at the most populated level's bucket to have run on past it: every level. */
static __attribute__((noinline)) int reg_levels(struct gdr_cache *c, struct ibv_pd *pd, void *addr,
						size_t len, int access, struct gdr_region **region)
{
	return reg_from(c, pd, addr, len, access, region, 0);
}

/* The hit: reg_hot, inline, with what stays live in registers; anything else goes the general
 * path's way with the caller's arguments as they came (a tail call: the hit pays no prologue for
 * what it does not do). The request's own checks are the general path's: a hit of a zero length
 * or a wrapping range cannot be, since no record serves one (gdr_record_serves). */
GDR_EXPORT int gdr_reg(struct gdr_cache *c, struct ibv_pd *pd, void *addr, size_t len, int access,
		       struct gdr_region **region)
{
	uint64_t a = (uintptr_t)addr;
	bool exact = req_exact(pd, access);
	enum hot_miss how;
	struct gdr_region *r;
	struct gdr_thr *t;

	if (__builtin_expect(!c | !region, 0))
		return reg_general(c, pd, addr, len, access, region);
	t = gdr_thr_find(c);
	if (__builtin_expect(!t, 0))
		return reg_general(c, pd, addr, len, access, region);
	r = reg_hot(c, t, pd, a, len, req_access(pd, access), exact, HOT_FIRST, &how);
	if (__builtin_expect(!r, 0)) {
		if (how == HOT_REST)
			return reg_rest(c, pd, addr, len, access, region);
		if (how == HOT_LEVELS)
			return reg_levels(c, pd, addr, len, access, region);
		return reg_general(c, pd, addr, len, access, region);
	}
	return reg_done(c, t, r, pd, addr, len, access, region);
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

	if (gdr_monitor_in_callback()) { /* a miss would wait for the free this thread is making */
		if (st)
			__atomic_store_n(st->ctr, __atomic_load_n(st->ctr, __ATOMIC_RELAXED) - 1,
					 __ATOMIC_RELAXED);
		*region = NULL;
		return reg_refuse(c, a, len, gdr_monitor_refuse("gdr_reg (a miss)"),
				  "in_free_callback");
	}
	gdr_cache_lock(c);
	if (st) {
		/* Stale (or not provably valid): retired while our hold keeps it, then let go. */
		gdr_dbg("hit_refused cache=%llu addr=%#llx len=%llu why=%s",
			(unsigned long long)c->id, (unsigned long long)a, (unsigned long long)len,
			st->revoked ? "revoked" : "invalid");
		c->st.revoked += st->revoked;
		if (__atomic_load_n(&st->e->state, __ATOMIC_RELAXED) == GDR_LIVE)
			gdr_entry_stale(c, st->e);
		__atomic_store_n(st->ctr, __atomic_load_n(st->ctr, __ATOMIC_RELAXED) - 1,
				 __ATOMIC_RELAXED);
	}
	if (cached_only) {
		gdr_cache_unlock(c);
		return reg_refuse(c, a, len, -ENOENT, "not_cached");
	}
	for (unsigned tries = 0;; tries++) {
		rc = gdr_reg_locked(c, t, pd, a, len, access, exact, region);
		if (rc != -EINPROGRESS)
			break;
		if (!tries)
			gdr_dbg("wait cache=%llu addr=%#llx len=%llu why=free_in_flight",
				(unsigned long long)c->id, (unsigned long long)a,
				(unsigned long long)len);
		__atomic_add_fetch(&c->reg_waits, 1, __ATOMIC_RELAXED);
		gdr_cache_unlock(c);
		if (tries < 64)
			sched_yield();
		else
			nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);
		gdr_cache_lock(c);
	}
	/* After a failure too: a pin whose MR could not be made stays cached, unheld, and the call
	 * must still end within the limits (only held entries may exceed them). */
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

#ifdef GDR_TEST_POINTS
void (*gdr_test_point_fn)(enum gdr_test_point tp);
#endif

/* A release the lock-free path leaves: by a thread that holds none of r itself (another thread
 * registered it), or of a record some of whose holds other threads gave back (GDR_REC_RELEASED).
 * Under the lock, where r cannot be retired, and only while the holds summed over threads are
 * above zero: a second release of a registration another thread released is refused here. A
 * thread that holds r gives back its own hold and takes in what other threads gave back, up to
 * what it holds besides (the sum unchanged), so that its next release is lock-free again; one
 * that holds none gives the hold back in the cache's count for r's slot (thread.h). */
static __attribute__((noinline)) int dereg_locked(struct gdr_cache *c, struct gdr_thr *t,
						  struct gdr_region *r)
{
	GDR_KEEP_ERRNO(); /* eviction unpins */
	int64_t *rel, *own, v;
	uint32_t state;
	bool handed;

	gdr_cache_lock(c);
	rel = gdr_thr_released(c, gdr_rec_slot(r)); /* there for every slot ever held */
	handed = gdr_region_handed(r);
	GDR_TEST_POINT(GDR_TP_DEREG_MAGIC);
	if (!handed || !rel || gdr_region_holds(c, r) <= 0) {
		c->st.fail_input++;
		gdr_cache_unlock_plain(c);
		gdr_err("region %p holds no reference: double gdr_dereg", (void *)r);
		return -EINVAL;
	}
	own = t ? gdr_thr_counter(t, gdr_rec_slot(r)) : NULL;
	v = own ? __atomic_load_n(own, __ATOMIC_RELAXED) : 0;
	if (v > 0) {
		int64_t k = v - 1 < *rel ? v - 1 : *rel;

		__atomic_store_n(own, v - 1 - k, __ATOMIC_RELEASE);
		*rel -= k;
	} else {
		++*rel;
	}
	gdr_region_set_released(r, *rel != 0);
	state = __atomic_load_n(&r->estate, __ATOMIC_RELAXED);
	GDR_TEST_POINT(GDR_TP_DEREG_ESTATE);
	if (state != GDR_LIVE || __atomic_load_n(&c->over_limit, __ATOMIC_RELAXED))
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

	if (__builtin_expect(!r || !gdr_region_aligned(r), 0)) {
		gdr_err("%s region %p", r ? "misaligned (never handed out)" : "NULL", (void *)r);
		return -EINVAL;
	}
	/* Records are never freed while their cache lives: reading a released one is safe. */
	c = gdr_rec_cache_checked(r);
	if (__builtin_expect(!c, 0)) {
		gdr_err("region %p is no registration of a live cache (never handed out)",
			(void *)r);
		return -EINVAL;
	}
	if (__builtin_expect(!r->entry, 0)) {
		if (!gdr_region_handed(r))
			goto released;
		return host_put(c, r);
	}
	t = gdr_thr_find(c);
	if (__builtin_expect(t != NULL, 1)) {
		/* Inside a read-side section: r and its entry are not retired and reused under us,
		 * and nothing of them is read after the hold is given back but in it. */
		bool handed;

		gdr_thr_enter(t);
		handed = gdr_region_handed(r);
		GDR_TEST_POINT(GDR_TP_DEREG_MAGIC);
		if (__builtin_expect(handed, 1)) {
			int64_t *ctr = gdr_thr_counter(t, gdr_rec_slot(r));
			int64_t v = ctr ? __atomic_load_n(ctr, __ATOMIC_RELAXED) : 0;

			/* Not where other threads gave back some of its holds: this thread's
			 * count may then exceed what r still holds (dereg_locked decides). */
			if (__builtin_expect(v > 0 && !gdr_region_released(r), 1)) {
				__atomic_store_n(ctr, v - 1, __ATOMIC_RELEASE);
				/* The entry's state as mirrored in r (gdr_entry_set_state
				 * writes it before its grace period): no line of the entry. */
				state = __atomic_load_n(&r->estate, __ATOMIC_SEQ_CST);
				GDR_TEST_POINT(GDR_TP_DEREG_ESTATE);
				fast = true;
			}
		}
		gdr_thr_leave(t);
	}
	if (!fast) {
		bool handed = gdr_region_handed(r);

		GDR_TEST_POINT(GDR_TP_DEREG_MAGIC);
		if (!handed)
			goto released;
		return dereg_locked(c, t, r);
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
