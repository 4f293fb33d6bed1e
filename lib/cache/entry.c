/* SPDX-License-Identifier: MIT */
/*
 * Entries: their state, retirement with one grace period for many (settle), detachment of held
 * ones, eviction (CLOCK), validation under the lock, taking a hold (making the record and the MR),
 * flushing, and releasing a PD's MRs. At level debug: a line for each MR made, entry dropped
 * (stale, evicted) and pin released (key=value, as miss.c's).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utlist.h>

#include "cache/cache.h"
#include "intercept/monitor.h"
#include "nic/verbs.h"

/* Microseconds of the monotonic clock, for the debug lines' durations; 0 below level debug (no
 * clock read). */
static uint64_t dbg_us(void)
{
	struct timespec ts;

	if (__atomic_load_n(&gdr_log_level, __ATOMIC_RELAXED) < GDR_LOG_DEBUG)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Set an entry's state, and its mirror in each of its records (what a hit reads). Seq_cst: a
 * grace period after it orders it before every lookup that may still take a hold (thread.c). */
void gdr_entry_set_state(struct gdr_entry *e, uint8_t state)
{
	__atomic_store_n(&e->state, state, __ATOMIC_SEQ_CST);
	for (struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		__atomic_store_n(&r->estate, state, __ATOMIC_SEQ_CST);
}

/* Whether e was taken since the evictor last looked (by the locked path, or by a hit of one of
 * its records), and forget it. */
static bool entry_used_clear(struct gdr_entry *e)
{
	bool used = __atomic_load_n(&e->used, __ATOMIC_RELAXED);

	__atomic_store_n(&e->used, 0, __ATOMIC_RELAXED);
	for (struct gdr_region *r = e->regions; r; r = gdr_region_next(r)) {
		if (__atomic_load_n(&r->used, __ATOMIC_RELAXED)) {
			used = true;
			__atomic_store_n(&r->used, 0, __ATOMIC_RELAXED);
		}
	}
	return used;
}

/* ---- entries ------------------------------------------------------------------------------- */

/* Under AddressSanitizer a free entry is poisoned, as malloc's would be: a use after free is
 * still reported though the memory stays the cache's. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ENTRY_POISON(e) ASAN_POISON_MEMORY_REGION((e), sizeof(*(e)))
#define ENTRY_UNPOISON(e) ASAN_UNPOISON_MEMORY_REGION((e), sizeof(*(e)))
#else
#define ENTRY_POISON(e) ((void)(e))
#define ENTRY_UNPOISON(e) ((void)(e))
#endif

struct gdr_entry_chunk {
	struct gdr_entry_chunk *next;
	struct gdr_entry e[GDR_ENTRY_CHUNK_N];
};
_Static_assert(sizeof(struct gdr_entry_chunk) == GDR_ENTRY_CHUNK,
	       "a chunk is its link and entries");

struct gdr_entry *gdr_entry_alloc(struct gdr_cache *c)
{
	struct gdr_entry *e = c->entry_free;

	if (!e) {
		struct gdr_entry_chunk *k = malloc(sizeof(*k));

		if (!k)
			return NULL;
		k->next = c->entry_chunks;
		c->entry_chunks = k;
		c->entry_chunk_n++;
		for (size_t i = GDR_ENTRY_CHUNK_N; i-- > 0;) {
			k->e[i].defer = c->entry_free;
			c->entry_free = &k->e[i];
			ENTRY_POISON(&k->e[i]);
		}
		e = c->entry_free;
	}
	ENTRY_UNPOISON(e);
	c->entry_free = e->defer;
	memset(e, 0, sizeof(*e));
	return e;
}

void gdr_entry_free(struct gdr_cache *c, struct gdr_entry *e)
{
	if (e->ntags > 1)
		free(e->t.tagv);
	e->ntags = 0;
	e->defer = c->entry_free;
	c->entry_free = e;
	ENTRY_POISON(e);
}

void gdr_entries_fini(struct gdr_cache *c)
{
	struct gdr_entry_chunk *k;

	while ((k = c->entry_chunks)) {
		c->entry_chunks = k->next;
		for (size_t i = 0; i < GDR_ENTRY_CHUNK_N; i++)
			ENTRY_UNPOISON(&k->e[i]); /* malloc's own memory again */
		free(k);
	}
	c->entry_free = NULL;
	c->entry_chunk_n = 0;
}

int64_t gdr_entry_holds(struct gdr_cache *c, const struct gdr_entry *e)
{
	int64_t n = 0;

	for (const struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		n += gdr_region_holds(c, r);
	return n;
}

/* Whether the cache holds more than its limits; read by gdr_dereg without the lock. */
static void limits_update(struct gdr_cache *c)
{
	__atomic_store_n(&c->over_limit,
			 c->st.pinned_bytes > c->cfg.max_bytes ||
				 c->st.entries > c->cfg.max_entries,
			 __ATOMIC_RELAXED);
}

/* Unpin an entry nobody holds or can take a hold on, out of the index; its memory is freed after
 * the next grace period, its records are retired. */
static void entry_destroy(struct gdr_cache *c, struct gdr_entry *e)
{
	for (struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		gdr_record_retire(c, r);
	e->pin.be->ops->unpin(e->pin.be, &e->pin);
	gdr_dbg("unpin cache=%llu be=%s range=%#llx-%#llx bytes=%llu", (unsigned long long)c->id,
		e->pin.be->ops->name, (unsigned long long)e->pin.base,
		(unsigned long long)(e->pin.base + e->pin.len), (unsigned long long)e->pin.len);
	c->st.unpins++;
	c->st.entries--;
	gdr_stats_pinned(c, -(int64_t)e->pin.len);
	e->defer = c->deferred;
	c->deferred = e;
	c->ndeferred++;
}

/* Take an indexed entry out of service: out of the index now, marked dying; unpinned at the next
 * gdr_settle() if nobody holds it then, else detached until its holders let go. */
void gdr_entry_drop(struct gdr_cache *c, struct gdr_entry *e)
{
	if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) != GDR_DYING) {
		gdr_entry_set_state(e, GDR_DYING);
		c->dying_unsynced = true;
	}
	gdr_index_remove(&c->index, e);
	gdr_cache_untrack_reach(c, e);
	DL_DELETE(c->lru, e);
	DL_APPEND(c->dying, e);
}

/* Decide the entries dropped since the last call, with one grace period for all of them: then no
 * lookup can take a new hold on them and their holds are final. Unheld ones are unpinned; held
 * ones are detached, and after a further grace period summed again: a release that read the entry
 * as indexed has given its hold back by then, and any later one sees it detached and reaps it. */
void gdr_settle(struct gdr_cache *c)
{
	struct gdr_entry *e, *tmp;
	bool detached = false;

	if (!c->dying)
		return;
	if (c->dying_unsynced)
		gdr_cache_sync(c);
	c->dying_unsynced = false;
	DL_FOREACH_SAFE(c->dying, e, tmp) {
		DL_DELETE(c->dying, e);
		if (gdr_entry_holds(c, e) > 0) {
			gdr_entry_set_state(e, GDR_DETACHED);
			DL_APPEND(c->detached, e);
			c->st.detached++;
			detached = true;
		} else {
			entry_destroy(c, e);
		}
	}
	if (detached) {
		gdr_cache_sync(c);
		gdr_reap_detached(c);
	}
	limits_update(c);
}

/* Destroy the detached entries whose last holder has let go. */
void gdr_reap_detached(struct gdr_cache *c)
{
	struct gdr_entry *e, *tmp;

	DL_FOREACH_SAFE(c->detached, e, tmp) {
		if (gdr_entry_holds(c, e) > 0)
			continue;
		DL_DELETE(c->detached, e);
		c->st.detached--;
		entry_destroy(c, e);
	}
	limits_update(c);
}

void gdr_entry_stale(struct gdr_cache *c, struct gdr_entry *e)
{
	c->st.stale++;
	for (uint32_t i = 0; i < e->ntags; i++)
		gdr_synced_forget(c, gdr_entry_tags(e)[i].buffer_id);
	gdr_dbg("drop cache=%llu range=%#llx-%#llx id=%llu allocs=%u why=stale",
		(unsigned long long)c->id, (unsigned long long)e->pin.base,
		(unsigned long long)(e->pin.base + e->pin.len),
		(unsigned long long)gdr_entry_tags(e)[0].buffer_id, e->ntags);
	gdr_entry_drop(c, e);
}

/* Whether e may be taken out as unheld: not being handed out, no hold seen. */
static bool entry_unheld_now(struct gdr_cache *c, struct gdr_entry *e)
{
	return e != c->taking && __atomic_load_n(&e->state, __ATOMIC_RELAXED) == GDR_LIVE &&
	       gdr_entry_holds(c, e) <= 0;
}

/* Mark e dying as a candidate for removal (its holds are decided by quiesce_finish). */
void gdr_quiesce_mark(struct gdr_entry *e, struct gdr_entry **cand)
{
	gdr_entry_set_state(e, GDR_DYING);
	e->defer = *cand;
	*cand = e;
}

/* After one grace period for all the candidates: drop those still unheld, give the others back to
 * lookups. Returns the number dropped; *bytes += what they pin. why: the reason, for the debug
 * line of each. */
static int quiesce_finish(struct gdr_cache *c, struct gdr_entry *cand, uint64_t *bytes,
			  const char *why)
{
	struct gdr_entry *e, *next;
	int n = 0;

	if (!cand)
		return 0;
	gdr_cache_sync(c);
	for (e = cand; e; e = next) {
		next = e->defer;
		e->defer = NULL;
		if (gdr_entry_holds(c, e) > 0) {
			gdr_entry_set_state(e, GDR_LIVE);
			continue;
		}
		if (bytes)
			*bytes += e->pin.len;
		gdr_dbg("evict cache=%llu range=%#llx-%#llx bytes=%llu why=%s",
			(unsigned long long)c->id, (unsigned long long)e->pin.base,
			(unsigned long long)(e->pin.base + e->pin.len),
			(unsigned long long)e->pin.len, why);
		/* Dying already, holds final: gdr_settle() needs no grace period. */
		gdr_entry_drop(c, e);
		n++;
	}
	gdr_settle(c);
	return n;
}

/* Evict entries nobody holds while over the limits, or until `need` bytes have been freed: least
 * recently listed first, entries used since the last pass moved to the tail once (CLOCK). The
 * entries chosen in one pass share one grace period (a membarrier: an IPI to every CPU running a
 * thread of the process), so once over a limit a pass goes 1/32 below it: under churn a grace
 * period is paid every few dozen misses, not at each. Returns the number evicted. */
int gdr_evict(struct gdr_cache *c, uint64_t need)
{
	bool over = c->st.pinned_bytes > c->cfg.max_bytes || c->st.entries > c->cfg.max_entries;
	uint64_t max_bytes = over ? c->cfg.max_bytes - c->cfg.max_bytes / 32 : c->cfg.max_bytes;
	uint64_t max_entries =
		over ? c->cfg.max_entries - c->cfg.max_entries / 32 : c->cfg.max_entries;
	uint64_t freed = 0;
	/* Why entries go (least recently used first): a limit, or room a pin or MR needs. */
	const char *why = c->st.pinned_bytes > c->cfg.max_bytes ? "max_bytes"
			  : c->st.entries > c->cfg.max_entries  ? "max_entries"
								: "need_space";
	int n = 0;

	for (;;) {
		uint64_t budget = 2 * c->st.entries + 1, bytes = c->st.pinned_bytes;
		uint64_t entries = c->st.entries, picked = 0;
		struct gdr_entry *e = c->lru, *next, *cand = NULL;
		int got;

		while (e && budget--) {
			if (bytes <= max_bytes && entries <= max_entries && freed + picked >= need)
				break;
			next = e->next ? e->next : c->lru; /* round and round, within the budget */
			if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) != GDR_LIVE) {
				/* a candidate already */
			} else if (entry_used_clear(e)) {
				DL_DELETE(c->lru, e);
				DL_APPEND(c->lru, e);
			} else if (entry_unheld_now(c, e)) {
				gdr_quiesce_mark(e, &cand);
				picked += e->pin.len;
				bytes -= e->pin.len;
				entries--;
			}
			e = next;
		}
		got = quiesce_finish(c, cand, &freed, why);
		c->st.evictions += (uint64_t)got;
		n += got;
		if (!got || (c->st.pinned_bytes <= max_bytes && c->st.entries <= max_entries &&
			     freed >= need))
			break;
	}
	limits_update(c);
	return n;
}

/* Validate the tags of e that overlap [a, a+len), or all of them (all = true). Under the lock.
 * 0: valid and covering [a, a+len); 1: valid but with a gap; -ESTALE: some tag is stale. */
int gdr_entry_check(struct gdr_cache *c, struct gdr_entry *e, uint64_t a, uint64_t len, bool all)
{
	uint64_t covered = a, end = a + len;

	if (gdr_entry_revoked(c, e)) {
		c->st.revoked++;
		return -ESTALE;
	}
	for (uint32_t i = 0; i < e->ntags; i++) {
		const struct gdr_tag *t = &gdr_entry_tags(e)[i];
		uint64_t tend = t->start + t->size;
		bool overlaps = t->start < end && tend > a;

		if (!overlaps && !all)
			continue;
		if (!c->validator->events)
			c->st.tag_checks++;
		if (c->validator->check(t))
			return -ESTALE;
		if (overlaps && t->start <= covered && tend > covered)
			covered = tend;
	}
	return covered >= end ? 0 : 1;
}

static const struct gdr_tag *entry_tag_at(const struct gdr_entry *e, uint64_t a)
{
	const struct gdr_tag *tv = gdr_entry_tags(e);

	for (uint32_t i = 0; i < e->ntags; i++)
		if (tv[i].start <= a && a < tv[i].start + tv[i].size)
			return &tv[i];
	return NULL;
}

/* Add tags to e, keeping them sorted by start and unique. One allocation may have several tags:
 * the pieces of a pool allocation that spans several of the pool's physical chunks. */
int gdr_entry_add_tags(struct gdr_entry *e, const struct gdr_tag *t, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++) {
		/* The tags, written here through tv (e is ours to change): tag0 up to one, the
		 * array from two on (its capacity ntags rounded up to a power of two). */
		struct gdr_tag *tv = (struct gdr_tag *)gdr_entry_tags(e);
		uint32_t i;

		for (i = 0; i < e->ntags; i++)
			if (tv[i].buffer_id == t[k].buffer_id && tv[i].start == t[k].start &&
			    tv[i].size == t[k].size)
				break;
		if (i < e->ntags)
			continue;
		if (e->ntags && !(e->ntags & (e->ntags - 1))) { /* full */
			struct gdr_tag *v;

			if (e->ntags > UINT32_MAX / 2)
				return -ENOMEM;
			v = e->ntags == 1 ? malloc(2 * sizeof(*v))
					  : realloc(tv, 2 * e->ntags * sizeof(*v));
			if (!v)
				return -ENOMEM;
			if (e->ntags == 1)
				v[0] = e->t.tag0;
			/* From here to ntags' increment the array is e's, ntags still 1: nothing
			 * reads e's tags in between (under the lock, no return). */
			e->t.tagv = tv = v;
		}
		for (i = e->ntags; i > 0 && tv[i - 1].start > t[k].start; i--)
			tv[i] = tv[i - 1];
		tv[i] = t[k];
		e->ntags++;
	}
	return 0;
}

/* Whether taking [a, a+len) exactly from e would make a new exact record past the bound: the
 * entry has GDR_EXACT_PER_ENTRY exact records, or a multiple, and at least half of them nobody
 * holds (MRs cached for ranges registered before), or GDR_EXACT_MAX. Held ones alone never make it
 * full: a held registration keeps its record wherever its entry goes, so replacing the entry for
 * them would only pin its range again, for every GDR_EXACT_PER_ENTRY tensors of an engine that
 * registers (and holds) an MR per tensor of one allocation. The holds are summed at multiples of
 * the bound only: a miss costs them once in GDR_EXACT_PER_ENTRY. Under the lock. */
bool gdr_entry_exact_full(struct gdr_cache *c, const struct gdr_entry *e, const struct ibv_pd *pd,
			  int access, uint64_t a, uint64_t len, bool exact)
{
	unsigned idle = 0;

	if (!exact || e->nexact < GDR_EXACT_PER_ENTRY)
		return false;
	for (const struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		if (gdr_record_serves(r, pd, access, a, len, true))
			return false;
	if (e->nexact >= GDR_EXACT_MAX)
		return true;
	if (e->nexact % GDR_EXACT_PER_ENTRY)
		return false;
	for (const struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		idle += r->exact && gdr_region_holds(c, r) <= 0;
	return 2 * idle >= e->nexact;
}

/* Take a hold on e for [a, a+len), making the record (and the MR) if there is none. exact: the MR
 * must be bounded to [a, a+len) (remote access): a record of its own, its MR of that range. */
int gdr_entry_take(struct gdr_cache *c, struct gdr_thr *t, struct gdr_entry *e, struct ibv_pd *pd,
		   int access, uint64_t a, uint64_t len, bool exact, struct gdr_region **out)
{
	const struct gdr_tag *tag = entry_tag_at(e, a);
	uint64_t id = tag ? tag->buffer_id : 0, rstart, rsize;
	struct gdr_region *r, *m = NULL;
	struct ibv_mr *own = NULL;
	int64_t *ctr;
	int rc = 0;

	if (!tag) {
		gdr_err("no allocation of entry [%#llx, +%llu) holds %#llx",
			(unsigned long long)e->pin.base, (unsigned long long)e->pin.len,
			(unsigned long long)a);
		return -EIO;
	}
	if (!pd && !e->pin.be->ops->pins_without_pd) {
		/* peermem: the MR is the pin; a registration without a PD would hold nothing pinned
		 * (the MR of another PD's record can go under it), on a hit as on a miss. */
		c->st.fail_input++;
		gdr_err("backend %s registers GPU memory only with a PD", e->pin.be->ops->name);
		return -EOPNOTSUPP;
	}
	if (!pd)
		access = 0, exact = false;
	gdr_record_range(e, tag, &rstart, &rsize);
	/* An exact request takes the record of exactly its range; any other, the record of the
	 * allocation at a (the one it would make), even where the request goes on past that
	 * allocation into the next (several tags): such a request is served under the lock
	 * every time, and must not make a new record every time. */
	for (r = e->regions; r; r = gdr_region_next(r))
		if (r->buffer_id == id &&
		    (exact ? gdr_record_serves(r, pd, access, a, len, true)
			   : !r->exact && r->pd == pd && r->access == access &&
				     r->start == rstart && r->size == rsize))
			break;
	__atomic_store_n(&e->used, 1, __ATOMIC_RELAXED);
	DL_DELETE(c->lru, e);
	DL_APPEND(c->lru, e);
	c->taking = e; /* making the MR may evict, and must not evict e */
	if (!r) {
		if (pd && !exact) /* the entry's MR for (pd, access), if it has one */
			for (m = e->regions; m; m = gdr_region_next(m))
				if (!m->exact && m->mr && m->pd == pd && m->access == access)
					break;
		if (pd && !m) {
			uint64_t base = exact ? a : e->pin.base, n = exact ? len : e->pin.len;
			uint64_t t0 = dbg_us();

			for (;;) {
				rc = e->pin.be->ops->reg_mr(e->pin.be, &e->pin, pd, access, base, n,
							    &own);
				if ((rc != -ENOMEM && rc != -ENOSPC) || !gdr_evict(c, e->pin.len))
					break;
				c->st.fail_pin_retried++;
			}
			if (rc) {
				c->st.fail_mr++;
				gdr_err("NIC registration of [%#llx, +%llu) failed: %d",
					(unsigned long long)base, (unsigned long long)n, rc);
				goto out;
			}
			gdr_dbg("mr cache=%llu pd=%p access=%#x range=%#llx-%#llx lkey=%#x rkey=%#x "
				"type=%s us=%llu",
				(unsigned long long)c->id, (void *)pd, (unsigned)access,
				(unsigned long long)base, (unsigned long long)(base + n), own->lkey,
				own->rkey, exact ? "exact" : "wide",
				(unsigned long long)(dbg_us() - t0));
		}
		rc = gdr_region_new(c, e, pd, access, tag ? tag->kind : GDR_MEM_DEVICE, tag, &r);
		if (rc) {
			if (own)
				gdr_verbs_dereg(c->sys.verbs, own);
			goto out;
		}
		if (exact) {
			/* 2: the range goes on past the allocation at a, whose tag alone the
			 * record keeps: a lock-free hit in mode tag could not prove the rest. */
			r->exact = tag && a + len > tag->start + tag->size ? 2 : 1;
			r->start = a;
			r->size = len;
			r->mr = own;
			e->nexact++;
			c->exact_mrs++;
		} else {
			r->exact = 0;
			r->mr = m ? m->mr : own; /* own: the first record of (pd, access) */
		}
		gdr_region_link(c, e, r);
	}
	ctr = gdr_thr_counter_alloc(c, t, gdr_rec_slot(r));
	if (!ctr) {
		rc = -ENOMEM;
		goto out;
	}
	__atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
	*out = r;
out:
	c->taking = NULL;
	return rc;
}

/* Drop every indexed entry nobody holds, with one grace period for all. The number dropped. */
int gdr_drop_unheld(struct gdr_cache *c)
{
	struct gdr_entry *e, *cand = NULL;
	int n;

	DL_FOREACH(c->lru, e)
		if (entry_unheld_now(c, e))
			gdr_quiesce_mark(e, &cand);
	n = quiesce_finish(c, cand, NULL, gdr_cache_applying ? "gpu_out_of_memory" : "flush");
	limits_update(c);
	return n;
}

GDR_EXPORT int gdr_cache_flush(struct gdr_cache *c)
{
	GDR_KEEP_ERRNO(); /* unpins */
	int n = 0;

	if (!c) {
		gdr_err("NULL cache");
		return -EINVAL;
	}
	if (gdr_monitor_in_callback())
		return gdr_monitor_refuse("gdr_cache_flush");
	gdr_cache_lock(c);
	gdr_cache_drain_events(c);
	n = gdr_drop_unheld(c);
	gdr_dbg("flush cache=%llu dropped=%d", (unsigned long long)c->id, n);
	gdr_cache_unlock(c);
	return n;
}

/* Release a PD, first step: unless one of e's records for pd is held, mark them all dying (no
 * lookup takes a new hold after the next grace period). 1: marked; 0: none for pd; -EBUSY: held,
 * none marked. Under the lock. */
static int entry_pd_mark(struct gdr_cache *c, struct gdr_entry *e, const struct ibv_pd *pd)
{
	struct gdr_region *r;
	int any = 0;

	for (r = e->regions; r; r = gdr_region_next(r)) {
		if (r->pd == pd && gdr_region_holds(c, r) > 0)
			return -EBUSY; /* before any is marked: a refusal leaves every record LIVE */
		any |= r->pd == pd;
	}
	for (r = e->regions; r; r = gdr_region_next(r))
		if (r->pd == pd)
			__atomic_store_n(&r->magic, GDR_REGION_DYING, __ATOMIC_SEQ_CST);
	return any;
}

/* Second step, after the grace period: retire e's records and MRs for pd, or, if a hold was taken
 * before they were marked, give them all back to lookups. Whether they were retired. */
static bool entry_pd_finish(struct gdr_cache *c, struct gdr_entry *e, const struct ibv_pd *pd)
{
	struct gdr_region *r, *rt;

	for (r = e->regions; r; r = gdr_region_next(r)) {
		if (r->pd == pd && gdr_region_holds(c, r) > 0) {
			for (r = e->regions; r; r = gdr_region_next(r))
				if (r->pd == pd)
					__atomic_store_n(&r->magic, GDR_REGION_LIVE,
							 __ATOMIC_SEQ_CST);
			return false;
		}
	}
	__atomic_add_fetch(&c->gen, 1, __ATOMIC_SEQ_CST); /* memos of these records are void */
	for (r = e->regions; r; r = rt) {
		rt = gdr_region_next(r);
		if (r->pd == pd) {
			/* The MR of (pd, access) goes with the last of its records. */
			gdr_region_unlink(c, e, r);
			gdr_record_retire(c, r);
			gdr_region_set_next(r, c->deferred_regions);
			c->deferred_regions = r;
			c->ndeferred++;
		}
	}
	return true;
}

static void pd_mark_list(struct gdr_cache *c, struct gdr_entry *list, const struct ibv_pd *pd,
			 bool *any, bool *busy)
{
	struct gdr_entry *e;

	DL_FOREACH(list, e) {
		int rc = entry_pd_mark(c, e, pd);

		*any |= rc > 0;
		*busy |= rc < 0;
	}
}

static void pd_finish_list(struct gdr_cache *c, struct gdr_entry *list, const struct ibv_pd *pd,
			   bool *busy)
{
	struct gdr_entry *e;

	DL_FOREACH(list, e) {
		bool mine = false;

		for (struct gdr_region *r = e->regions; r && !mine; r = gdr_region_next(r))
			mine = r->pd == pd &&
			       __atomic_load_n(&r->magic, __ATOMIC_RELAXED) == GDR_REGION_DYING;
		if (mine && !entry_pd_finish(c, e, pd))
			*busy = true;
	}
}

/* Whether a host registration made with pd is held: its MR is the cache's too, in no entry (passed
 * through). Records of host memory change only under the lock. */
static bool pd_host_held(struct gdr_cache *c, const struct ibv_pd *pd)
{
	for (uint32_t s = 1; c->nhost && s < c->slot_next; s++) {
		const struct gdr_region *r = &c->rec_base[s];

		if (!r->entry && r->pd == pd && gdr_region_handed(r) &&
		    __atomic_load_n(&r->used, __ATOMIC_RELAXED))
			return true;
	}
	return false;
}

GDR_EXPORT int gdr_cache_release_pd(struct gdr_cache *c, struct ibv_pd *pd)
{
	GDR_KEEP_ERRNO(); /* ibv_dereg_mr, a grace period's membarrier */
	bool busy = false, any = false;

	if (!c || !pd) {
		gdr_err("NULL %s", c ? "pd" : "cache");
		return -EINVAL;
	}
	if (gdr_monitor_in_callback())
		return gdr_monitor_refuse("gdr_cache_release_pd");
	gdr_cache_lock(c);
	pd_mark_list(c, c->lru, pd, &any, &busy);
	pd_mark_list(c, c->detached, pd, &any, &busy);
	if (any) {
		gdr_cache_sync(c); /* one grace period for every entry */
		pd_finish_list(c, c->lru, pd, &busy);
		pd_finish_list(c, c->detached, pd, &busy);
	}
	busy |= pd_host_held(c, pd);
	gdr_cache_unlock(c);
	if (busy)
		gdr_warn("pd %p still has registrations held: their MRs stay", (void *)pd);
	return busy ? -EBUSY : 0;
}
