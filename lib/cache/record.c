/* SPDX-License-Identifier: MIT */
/*
 * Registration records and grace periods: records are made, handed to entries, retired and reused
 * late (never freed while the cache lives); retired entries and outgrown hash tables are freed after
 * a grace period (thread.c). Every locked operation ends in gdr_cache_unlock().
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <utlist.h>

#include "cache/cache.h"
#include "cache/caches.h"
#include "nic/verbs.h"

/* Put a retired record (DEAD, unreachable by lookups, after a grace period) in the reuse queue. */
void gdr_record_free(struct gdr_cache *c, struct gdr_region *r)
{
	/* Zeroed: +1 on one thread and -1 on another leave non-zero counters. */
	if (r->entry)
		gdr_thr_zero(c, gdr_rec_slot(r));
	__atomic_store_n(&r->link, 0, __ATOMIC_RELAXED); /* GDR_REC_RELEASED too: counts zeroed */
	if (c->reuse_tail)
		gdr_region_set_next(c->reuse_tail, r);
	else
		c->reuse_head = r;
	c->reuse_tail = r;
	c->reuse_len++;
}

/* The records' arena: GDR_SLOT_MAX records of address space reserved at create (no memory:
 * PROT_NONE, MAP_NORESERVE; 32 MiB), aligned to its size, made usable GDR_REC_MAP_STEP bytes at a
 * time as records are made, given back at destroy. Record n is slot n, so that a slot number in
 * the index's hash is the record's address (index.h), and no record ever moves or is freed while
 * the cache lives. Slot 0 holds the cache's address: a record's cache is read from its arena. */
uintptr_t gdr_arenas[GDR_ARENAS];
static pthread_mutex_t arenas_lock = PTHREAD_MUTEX_INITIALIZER;

/* The table's home slot of arena a, as gdr_rec_cache_checked probes from it. */
static uint32_t arena_home(uintptr_t a)
{
	return (uint32_t)(a / GDR_REC_ARENA) % GDR_ARENAS;
}

/* Enter arena a in the table: a slot no arena ever had, or one an arena left. -ENOSPC: full. */
static int arena_add(uintptr_t a)
{
	uint32_t i = arena_home(a);
	int rc = -ENOSPC;

	pthread_mutex_lock(&arenas_lock);
	for (uint32_t n = 0; n < GDR_ARENAS; n++, i = (i + 1) % GDR_ARENAS) {
		uintptr_t v = gdr_arenas[i];

		if (!v || v == GDR_ARENA_GONE) {
			__atomic_store_n(&gdr_arenas[i], a,
					 __ATOMIC_RELEASE); /* its head written */
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&arenas_lock);
	return rc;
}

/* Take arena a out: its slot says GONE, so that probes for arenas entered after it go on. */
static void arena_remove(uintptr_t a)
{
	uint32_t i = arena_home(a);

	pthread_mutex_lock(&arenas_lock);
	for (uint32_t n = 0; n < GDR_ARENAS && gdr_arenas[i]; n++, i = (i + 1) % GDR_ARENAS) {
		if (gdr_arenas[i] == a) {
			__atomic_store_n(&gdr_arenas[i], GDR_ARENA_GONE, __ATOMIC_RELEASE);
			break;
		}
	}
	pthread_mutex_unlock(&arenas_lock);
}

int gdr_records_init(struct gdr_cache *c)
{
	size_t size = GDR_REC_ARENA, head;
	char *p =
		mmap(NULL, 2 * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED) {
		gdr_err("cannot reserve the registration records' address space: %s",
			gdr_strerror(errno));
		return -ENOMEM;
	}
	head = (size - ((uintptr_t)p & (size - 1))) & (size - 1);
	if (head)
		munmap(p, head);
	munmap(p + head + size, size - head);
	p += head;
	if (mprotect(p, GDR_REC_MAP_STEP, PROT_READ | PROT_WRITE)) {
		gdr_err("cannot make the registration records' first %u bytes usable: %s",
			GDR_REC_MAP_STEP, gdr_strerror(errno));
		munmap(p, size);
		return -ENOMEM;
	}
	c->rec_base = (struct gdr_region *)(void *)p;
	((struct gdr_rec_head *)(void *)p)->cache = c;
	c->rec_mapped = GDR_REC_MAP_STEP;
	c->slot_next = 1;
	if (arena_add((uintptr_t)p)) {
		gdr_err("more than %u caches at once: no cache is created", GDR_ARENAS);
		munmap(p, size);
		c->rec_base = NULL;
		return -ENOSPC;
	}
	return 0;
}

void gdr_records_fini(struct gdr_cache *c)
{
	if (c->rec_base) {
		arena_remove((uintptr_t)c->rec_base);
		munmap(c->rec_base, GDR_REC_ARENA);
	}
	c->rec_base = NULL;
}

/* A record to fill: the oldest retired one once GDR_REUSE_DELAY others were retired after it (or
 * all slots are taken), else a new one. 0, -ENOSPC (GDR_SLOT_MAX records held), -ENOMEM. */
static int record_alloc(struct gdr_cache *c, struct gdr_region **out)
{
	struct gdr_region *r;
	uint32_t slot;

	if (c->reuse_len > GDR_REUSE_DELAY || (c->reuse_len && c->slot_next == GDR_SLOT_MAX)) {
		r = c->reuse_head;
		c->reuse_head = gdr_region_next(r);
		if (!c->reuse_head)
			c->reuse_tail = NULL;
		c->reuse_len--;
		*out = r;
		return 0;
	}
	if (c->slot_next == GDR_SLOT_MAX) {
		gdr_err("more than %u registration records held", GDR_SLOT_MAX);
		return -ENOSPC;
	}
	slot = c->slot_next;
	if ((size_t)(slot + 1) * sizeof(*r) > c->rec_mapped) {
		size_t end = ((size_t)(slot + 1) * sizeof(*r) + GDR_REC_MAP_STEP - 1) &
			     ~(size_t)(GDR_REC_MAP_STEP - 1);

		if (mprotect((char *)c->rec_base + c->rec_mapped, end - c->rec_mapped,
			     PROT_READ | PROT_WRITE))
			return -ENOMEM;
		c->rec_mapped = end;
	}
	r = &c->rec_base[slot]; /* zeroed: fresh anonymous memory */
	__atomic_store_n(&c->slot_next, slot + 1, __ATOMIC_RELEASE); /* its page made first */
	*out = r;
	return 0;
}

/* Whether another record of r's entry, not retired, shares r's MR (a shared one: the entry's MR
 * for (pd, access), owned by its records for that pair together). */
static bool mr_shared(const struct gdr_region *r)
{
	for (const struct gdr_region *q = r->entry->regions; q; q = gdr_region_next(q))
		if (q != r && !q->exact && q->mr == r->mr &&
		    __atomic_load_n(&q->magic, __ATOMIC_RELAXED) != GDR_REGION_DEAD)
			return true;
	return false;
}

/* A record leaves service: every later gdr_dereg of it is refused. Its counters are reset and it
 * is queued for reuse after a grace period (reclaim), when no release that saw it alive is left.
 * Its MR goes with it if it is its own, or the last record of its entry's (pd, access). */
void gdr_record_retire(struct gdr_cache *c, struct gdr_region *r)
{
	__atomic_add_fetch(&c->gen, 1, __ATOMIC_SEQ_CST); /* memos of it are void */
	__atomic_store_n(&r->magic, GDR_REGION_DEAD, __ATOMIC_SEQ_CST);
	if (r->entry && r->mr && (r->exact || !mr_shared(r))) {
		/* Nobody holds the record (or any of its entry's for that pair) any more. */
		gdr_dbg("mr_dereg cache=%llu pd=%p lkey=%#x rkey=%#x", (unsigned long long)c->id,
			(void *)r->pd, r->mr->lkey, r->mr->rkey);
		gdr_verbs_dereg(c->sys.verbs, r->mr);
		r->mr = NULL;
	}
	if (r->exact && r->entry && r->entry->nexact)
		r->entry->nexact--;
}

/* Free what was retired: no lookup can still be reading it once a grace period that began after
 * its retirement has ended. Called right after one. */
static void free_deferred(struct gdr_cache *c)
{
	struct gdr_entry *e;
	struct gdr_region *r;

	while ((e = c->deferred)) {
		c->deferred = e->defer;
		while ((r = e->regions)) {
			e->regions = gdr_region_next(r);
			gdr_record_free(c, r);
		}
		gdr_entry_free(c, e);
	}
	while ((r = c->deferred_regions)) {
		c->deferred_regions = gdr_region_next(r);
		gdr_record_free(c, r);
	}
	gdr_index_reclaim(&c->index);
	c->ndeferred = 0;
}

/* A grace period (thread.c), and what was retired before it freed. */
void gdr_cache_sync(struct gdr_cache *c)
{
	gdr_thr_sync(c);
	c->nsyncs++;
	free_deferred(c);
}

/* Retired memory waits for the next grace period that happens anyway (a drop, an eviction); one
 * is run for it alone only once this many items wait, so that a miss, which retires nothing but
 * an outgrown hash table now and then, pays no grace period (membarrier: an IPI to every CPU
 * running a thread of the process). */
#define GDR_RECLAIM_BATCH 256

void gdr_reclaim(struct gdr_cache *c, bool force)
{
	if (!c->deferred && !c->deferred_regions && !c->index.retired)
		return;
	if (force || c->ndeferred + c->index.nretired * 16 >= GDR_RECLAIM_BATCH)
		gdr_cache_sync(c);
}

/* Every locked operation ends here. A free whose pin release was left to a lock holder (hooks.c)
 * is acted on now. */
void gdr_cache_unlock(struct gdr_cache *c)
{
	gdr_settle(c);
	if (c->detached)
		gdr_reap_detached(c);
	gdr_reclaim(c, false);
	gdr_cache_unlock_plain(c);
	if (!gdr_locks_held && !gdr_cache_applying)
		gdr_events_dispatch_end(); /* what the hooks left to the lock's holder */
}

/* ---- registration records ------------------------------------------------------------------- */

/* The range a record of allocation t in e serves: t within e (all of t, unless t is larger than
 * what the cap let e pin), so that a request inside it is inside the pin. */
void gdr_record_range(const struct gdr_entry *e, const struct gdr_tag *t, uint64_t *start,
		      uint64_t *size)
{
	uint64_t lo = t->start, hi = t->start + t->size;

	if (e && lo < e->pin.base)
		lo = e->pin.base;
	if (e && hi > e->pin.base + e->pin.len)
		hi = e->pin.base + e->pin.len;
	*start = lo;
	*size = hi > lo ? hi - lo : 0;
}

/* A new record (not held, not linked), or -ENOSPC / -ENOMEM. Where every record slot is taken
 * (GDR_SLOT_MAX; a max_entries above it lets unheld entries take them all), unheld entries are
 * evicted (e's pin's worth; one for a host record), whose records are reusable after a grace
 * period, and it tries again. Under the cache's lock. */
int gdr_region_new(struct gdr_cache *c, struct gdr_entry *e, struct ibv_pd *pd, int access,
		   uint8_t kind, const struct gdr_tag *t, struct gdr_region **out)
{
	struct gdr_region *r;
	int rc = record_alloc(c, &r);

	while (rc == -ENOSPC && gdr_evict(c, e ? e->pin.len : 1)) {
		gdr_reclaim(c, true);
		rc = record_alloc(c, &r);
	}
	if (rc)
		return rc;
	memset(r, 0, sizeof(*r));
	r->entry = e;
	r->pd = pd;
	r->access = access;
	r->kind = kind;
	if (t) {
		gdr_record_range(e, t, &r->start, &r->size);
		r->buffer_id = t->buffer_id;
	}
	if (e)
		r->estate = (uint8_t)__atomic_load_n(&e->state, __ATOMIC_RELAXED);
	__atomic_store_n(&r->magic, GDR_REGION_LIVE, __ATOMIC_RELEASE);
	*out = r;
	return 0;
}

/* Link a new record to e, and into the index's hash where lookups find it if e is indexed. */
void gdr_region_link(struct gdr_cache *c, struct gdr_entry *e, struct gdr_region *r)
{
	/* Into the hash first: a table it grows is rebuilt from the entries' lists. */
	if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) == GDR_LIVE)
		gdr_index_add_record(&c->index, r);
	gdr_region_set_next(r, e->regions);
	e->regions = r;
}

void gdr_region_unlink(struct gdr_cache *c, struct gdr_entry *e, struct gdr_region *r)
{
	struct gdr_region *p;

	gdr_index_del_record(&c->index, r);
	if (e->regions == r) {
		e->regions = gdr_region_next(r);
		return;
	}
	for (p = e->regions; p; p = gdr_region_next(p)) {
		if (gdr_region_next(p) == r) {
			gdr_region_set_next(p, gdr_region_next(r));
			return;
		}
	}
}

/* Under the lock. */
int64_t gdr_region_holds(struct gdr_cache *c, const struct gdr_region *r)
{
	uint32_t slot = gdr_rec_slot(r);
	int64_t *rel = gdr_thr_released(c, slot);

	return (int64_t)((uint64_t)gdr_thr_sum(c, slot) - (uint64_t)(rel ? *rel : 0));
}
