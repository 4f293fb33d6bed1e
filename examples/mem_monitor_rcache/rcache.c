/* SPDX-License-Identifier: MIT */
/*
 * rcache: a middleware's own registration cache over libgdrcache's pins and free events (rcache.h
 * says what it keeps and promises).
 *
 * The lock and what runs under it. One mutex guards the index, the LRU, the queue and the counters.
 * Under it run the index's work, gdr_mem_monitor_unsubscribe / _valid, the MR registration (as
 * UCX's mem_reg: one MR a range when threads miss together) and the release of removed entries
 * (ibv_dereg_mr, gdr_dereg: collected while the index is walked, released before the unlock, so a
 * free whose callback waited for the lock never finds its memory on its way out on another thread).
 * Never under it: gdr_reg, which waits for a free in flight on another thread of the memory it
 * registers (that thread may be in this callback, waiting for the lock: a deadlock), nor
 * gdr_mem_monitor_subscribe (a driver query). So a thread that holds the lock waits for nothing a
 * freeing thread holds, and the callback of a free on another thread may wait for it.
 *
 * The callback on a thread that holds the lock (its MR registration freed GPU memory) must not
 * wait for it: it queues the event (a fixed array, no allocation: overflow drops every entry), and
 * rc_unlock applies the queue before it lets the lock go. Only the holder touches the queue, so it
 * needs no lock of its own, and it is empty whenever the mutex is free.
 *
 * An entry keeps its subscription until its MR and pin are released: a free of its memory on
 * another thread while this thread releases it (an eviction, a flush) is then delivered, and its
 * callback waits for the lock, so the free returns only once the MR is gone.
 *
 * A miss: subscribe the range first, then pin (gdr_reg), then under the lock make the MR and ask
 * gdr_mem_monitor_valid before inserting: a free of the range at any point after the subscription
 * is either seen there (the subscription was concerned: the entry is dropped and the miss begun
 * again) or finds the entry in the index when its callback takes the lock. A hit asks
 * gdr_mem_monitor_valid too (libfabric's valid), a belt that counts what the callbacks missed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rcache.h"

#define QUEUE_LEN 64  /* events queued by a thread that frees under the rcache lock */
#define MISS_TRIES 16 /* misses begun again before rcache_get gives up with -EAGAIN */

struct entry {
	struct rcache_region pub; /* what the caller reads; first, so a region is its entry */
	struct rcache *rc;
	unsigned refs;             /* rcache_get references not yet put */
	bool cached;               /* in the index; else released at refs 0 */
	struct entry *prev, *next; /* the LRU (unreferenced cached entries), oldest first */
	struct entry *dead;        /* the list of entries to release (rc_unlock) */
};

struct rcache {
	pthread_mutex_t lock;
	struct gdr_cache *cache;
	struct gdr_mem_monitor *monitor;
	enum rcache_mr_route route;
	struct rcache_verbs verbs;
	uint64_t max_unused, max_unused_bytes;
	struct entry **index; /* the cached entries, sorted by start; their ranges are disjoint */
	size_t n, cap;
	struct entry lru; /* the LRU's head: lru.next oldest, lru.prev newest */
	struct gdr_mem_event queue[QUEUE_LEN];
	unsigned queued;
	bool queue_overflow;
	uint64_t next_id; /* pin-only entries' mr_id */
	struct rcache_stats st;
};

/* The rcache whose lock this thread holds (the code never holds two). */
static __thread struct rcache *held_here;

static void on_event(void *arg, const struct gdr_mem_event *ev);

/* ---- verbs ------------------------------------------------------------------------------------ */

static struct ibv_mr *ibv_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	return ibv_reg_mr_iova(pd, addr, len, iova, access);
}

static const struct rcache_verbs libibverbs = {
	.reg_mr = ibv_reg,
	.reg_dmabuf_mr = ibv_reg_dmabuf_mr,
	.dereg_mr = ibv_dereg_mr,
};

/* Make e's MR by the rcache's route, or in pin-only mode its number. Under the lock. */
static int make_mr(struct rcache *rc, struct entry *e)
{
	struct rcache_region *r = &e->pub;
	uint64_t base, plen, off;
	int fd, err;

	if (!r->pd) {
		r->mr_id = ++rc->next_id;
		return 0;
	}
	errno = 0;
	if (rc->route != RCACHE_MR_VA && gdr_region_dmabuf(r->pin, &fd, &off) == 0 &&
	    gdr_region_range(r->pin, &base, &plen) == 0) {
		/* The dma-buf holds the pinned range from its offset off; the MR's addresses are
		 * the GPU VAs, as ibv_reg_mr's would be. */
		r->mr = rc->verbs.reg_dmabuf_mr(r->pd, off + (r->start - base), r->end - r->start,
						r->start, fd, r->access);
	} else if (rc->route == RCACHE_MR_DMABUF) {
		return -EOPNOTSUPP;
	} else {
		r->mr = rc->verbs.reg_mr(r->pd, (void *)(uintptr_t)r->start, r->end - r->start,
					 r->start, r->access);
	}
	if (!r->mr) {
		err = errno;
		return err > 0 ? -err : -EIO;
	}
	r->mr_id = r->mr->lkey;
	return 0;
}

/* Give back what an entry holds (every entry is subscribed from its making to here): what gives
 * freed memory back before its free returns. */
static void release(struct entry *e)
{
	if (e->pub.mr)
		e->rc->verbs.dereg_mr(e->pub.mr);
	if (e->pub.pin)
		gdr_dereg(e->pub.pin);
	/* Last: until the MR is gone, a free of its memory on another thread must find the
	 * subscription, so that its callback waits for this thread's lock (and with it for this
	 * release) before the free returns. */
	gdr_mem_monitor_unsubscribe(e->rc->monitor, (void *)(uintptr_t)e->pub.start,
				    e->pub.end - e->pub.start);
	free(e);
}

static void release_all(struct entry *dead)
{
	while (dead) {
		struct entry *next = dead->dead;

		release(dead);
		dead = next;
	}
}

/* ---- the index: cached entries sorted by start, disjoint ----------------------------------------- */

/* How many cached entries start at or below a. */
static size_t upto(const struct rcache *rc, uint64_t a)
{
	size_t lo = 0, hi = rc->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (rc->index[mid]->pub.start <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The cached entry whose range holds [a, a+len), or NULL. */
static struct entry *lookup(const struct rcache *rc, uint64_t a, uint64_t len)
{
	size_t i = upto(rc, a);
	struct entry *e = i ? rc->index[i - 1] : NULL;

	return e && a + len <= e->pub.end ? e : NULL;
}

static int index_insert(struct rcache *rc, struct entry *e)
{
	size_t i;

	if (rc->n == rc->cap) {
		size_t cap = rc->cap ? 2 * rc->cap : 64;
		struct entry **p = realloc(rc->index, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		rc->index = p;
		rc->cap = cap;
	}
	i = upto(rc, e->pub.start);
	memmove(&rc->index[i + 1], &rc->index[i], (rc->n - i) * sizeof(*rc->index));
	rc->index[i] = e;
	rc->n++;
	return 0;
}

static void index_remove(struct rcache *rc, struct entry *e)
{
	size_t i = upto(rc, e->pub.start) - 1; /* starts are unique: ranges are disjoint */

	memmove(&rc->index[i], &rc->index[i + 1], (rc->n - i - 1) * sizeof(*rc->index));
	rc->n--;
}

/* ---- the LRU of unreferenced cached entries ----------------------------------------------------- */

static void lru_add(struct rcache *rc, struct entry *e)
{
	e->prev = rc->lru.prev;
	e->next = &rc->lru;
	rc->lru.prev->next = e;
	rc->lru.prev = e;
	rc->st.unused++;
	rc->st.unused_bytes += e->pub.end - e->pub.start;
}

static void lru_del(struct rcache *rc, struct entry *e)
{
	e->prev->next = e->next;
	e->next->prev = e->prev;
	e->prev = e->next = NULL;
	rc->st.unused--;
	rc->st.unused_bytes -= e->pub.end - e->pub.start;
}

/* ---- removal, under the lock ---------------------------------------------------------------------- */

/* Take e out of the index; an unreferenced one goes on *dead, to be released by rc_unlock before
 * the mutex is let go; a referenced one at its last put. Its subscription goes with its release,
 * not here: a free of its memory meanwhile must still wait for the lock. */
static void uncache(struct rcache *rc, struct entry *e, struct entry **dead)
{
	index_remove(rc, e);
	e->cached = false;
	rc->st.cached--;
	if (e->refs == 0) {
		lru_del(rc, e);
		rc->st.regions--;
		e->dead = *dead;
		*dead = e;
	}
}

/* Remove every cached entry that [s, end) overlaps. */
static void invalidate_range(struct rcache *rc, uint64_t s, uint64_t end, struct entry **dead)
{
	size_t i = upto(rc, s);

	if (i && rc->index[i - 1]->pub.end > s)
		i--;
	while (i < rc->n && rc->index[i]->pub.start < end) {
		uncache(rc, rc->index[i], dead);
		rc->st.invalidated++;
	}
}

/*
 * A free without a size (cuMemFree): the allocation that starts at s, whose end the event does not
 * say. Its entries are the one that holds s and those that start after it, in order, up to the
 * first that the monitor still holds valid: every subscription inside the freed allocation was
 * concerned by this event before its callback ran.
 */
static void invalidate_allocation(struct rcache *rc, uint64_t s, struct entry **dead)
{
	size_t i = upto(rc, s);

	if (i && rc->index[i - 1]->pub.end > s)
		i--;
	while (i < rc->n) {
		struct entry *e = rc->index[i];

		if (e->pub.start > s &&
		    gdr_mem_monitor_valid(rc->monitor, (void *)(uintptr_t)e->pub.start,
					  e->pub.end - e->pub.start) == 1)
			break;
		uncache(rc, e, dead);
		rc->st.invalidated++;
	}
}

static void apply(struct rcache *rc, const struct gdr_mem_event *ev, struct entry **dead)
{
	uint64_t end = ev->start + ev->len < ev->start ? UINT64_MAX : ev->start + ev->len;

	if (ev->kind == GDR_MEM_EVENT_FREE && ev->len == 0)
		invalidate_allocation(rc, ev->start, dead);
	else if (ev->kind == GDR_MEM_EVENT_FREE || ev->kind == GDR_MEM_EVENT_ALLOC)
		invalidate_range(rc, ev->start, end, dead);
	else /* a context went, or a kind this program does not know: everything */
		invalidate_range(rc, 0, UINT64_MAX, dead);
}

/* Evict the oldest unreferenced entries past the limits. */
static void evict(struct rcache *rc, struct entry **dead)
{
	while (rc->st.unused > rc->max_unused || rc->st.unused_bytes > rc->max_unused_bytes) {
		uncache(rc, rc->lru.next, dead);
		rc->st.evicted++;
	}
}

/* ---- the lock ------------------------------------------------------------------------------------- */

static void rc_lock(struct rcache *rc)
{
	pthread_mutex_lock(&rc->lock);
	held_here = rc;
}

/* Apply what this thread's own frees queued while it held the lock. */
static void drain(struct rcache *rc, struct entry **dead)
{
	for (unsigned i = 0; i < rc->queued; i++)
		apply(rc, &rc->queue[i], dead);
	rc->queued = 0;
	if (rc->queue_overflow)
		invalidate_range(rc, 0, UINT64_MAX, dead);
	rc->queue_overflow = false;
}

/* Release what was removed and apply the queue (a release may free on this thread: queued
 * again), then unlock. Released under the lock: a free on another thread whose callback waits for
 * the lock then finds its entries gone, not on their way out. */
static void rc_unlock(struct rcache *rc, struct entry *dead)
{
	do {
		drain(rc, &dead);
		release_all(dead);
		dead = NULL;
	} while (rc->queued || rc->queue_overflow);
	held_here = NULL;
	pthread_mutex_unlock(&rc->lock);
}

/* The monitor's callback: on the freeing thread, before the driver frees. */
static void on_event(void *arg, const struct gdr_mem_event *ev)
{
	struct rcache *rc = arg;
	struct entry *dead = NULL;

	if (held_here == rc) {
		/* This thread freed under the lock: waiting for it would never end. */
		rc->st.events++;
		rc->st.deferred++;
		if (rc->queued < QUEUE_LEN)
			rc->queue[rc->queued++] = *ev;
		else
			rc->queue_overflow = true;
		return;
	}
	rc_lock(rc);
	rc->st.events++;
	apply(rc, ev, &dead);
	rc_unlock(rc, dead); /* released here: before the free returns */
}

/* ---- the API -------------------------------------------------------------------------------------- */

int rcache_create(const struct rcache_params *p, struct rcache **out)
{
	struct rcache *rc;
	int ret;

	if (!p || !p->cache || !out || p->route > RCACHE_MR_VA)
		return -EINVAL;
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	pthread_mutex_init(&rc->lock, NULL);
	rc->cache = p->cache;
	rc->route = p->route;
	rc->verbs = p->verbs ? *p->verbs : libibverbs;
	rc->max_unused = p->max_unused_entries ? p->max_unused_entries : 1024;
	rc->max_unused_bytes = p->max_unused_bytes ? p->max_unused_bytes : 1ull << 30;
	rc->lru.next = rc->lru.prev = &rc->lru;
	/* Flags 0: only events that overlap a subscribed range. */
	ret = gdr_mem_monitor_create(0, on_event, rc, &rc->monitor);
	if (ret) {
		pthread_mutex_destroy(&rc->lock);
		free(rc);
		return ret;
	}
	*out = rc;
	return 0;
}

int rcache_destroy(struct rcache *rc)
{
	struct entry *dead = NULL;

	if (!rc)
		return -EINVAL;
	rc_lock(rc);
	if (rc->st.regions != rc->st.unused) {
		rc_unlock(rc, NULL);
		return -EBUSY;
	}
	while (rc->n)
		uncache(rc, rc->index[0], &dead);
	rc_unlock(rc, dead);
	/* Nothing is subscribed now; when this returns, no callback of it runs any more. */
	gdr_mem_monitor_destroy(rc->monitor);
	free(rc->index);
	pthread_mutex_destroy(&rc->lock);
	free(rc);
	return 0;
}

/* Make an entry for [a, a+len): 0 and *out, -EAGAIN (begin again: a hit may be there now), or an
 * error. Called without the lock. */
static int miss(struct rcache *rc, struct ibv_pd *pd, uint64_t a, uint64_t len, int access,
		struct entry **out)
{
	struct entry *e = calloc(1, sizeof(*e)), *dead = NULL, *old;
	int ret;

	if (!e)
		return -ENOMEM;
	e->rc = rc;
	e->pub.start = a;
	e->pub.end = a + len;
	e->pub.pd = pd;
	e->pub.access = access;
	/* Subscribed before the pin: a free of the range from now on concerns the subscription. */
	ret = gdr_mem_monitor_subscribe(rc->monitor, (void *)(uintptr_t)a, len);
	if (ret) {
		free(e);
		return ret;
	}
	ret = gdr_reg(rc->cache, NULL, (void *)(uintptr_t)a, len, 0, &e->pub.pin);
	if (ret == 0)
		ret = gdr_region_buffer_id(e->pub.pin, &e->pub.buffer_id);
	if (ret)
		goto fail;

	rc_lock(rc);
	old = lookup(rc, a, len);
	if (old && old->pub.pd == pd && (old->pub.access & access) == access) {
		ret = -EAGAIN; /* another thread made it meanwhile */
		goto fail_locked;
	}
	if (gdr_mem_monitor_valid(rc->monitor, (void *)(uintptr_t)a, len) != 1) {
		ret = -EAGAIN; /* freed since the subscription: what was pinned may be gone */
		goto fail_locked;
	}
	ret = make_mr(rc, e);
	if (ret)
		goto fail_locked;
	invalidate_range(rc, a, a + len, &dead); /* what it overlaps (the entry it replaces) */
	ret = index_insert(rc, e);
	if (ret)
		goto fail_locked;
	e->cached = true;
	e->refs = 1;
	rc->st.cached++;
	rc->st.regions++;
	rc->st.misses++;
	drain(rc, &dead);
	if (!e->cached) {
		/* The registration's own work freed the memory (a queued event concerned it). */
		e->refs = 0;
		rc->st.regions--;
		e->dead = dead;
		dead = e;
		rc_unlock(rc, dead);
		return -EAGAIN;
	}
	rc_unlock(rc, dead);
	*out = e;
	return 0;

fail_locked:
	e->dead = dead; /* released (MR, pin, then the subscription) before the unlock */
	dead = e;
	if (ret == -EAGAIN)
		rc->st.retries++;
	rc_unlock(rc, dead);
	return ret;
fail:
	release(e); /* the pin, then the subscription */
	return ret;
}

int rcache_get(struct rcache *rc, struct ibv_pd *pd, void *addr, size_t len, int access,
	       struct rcache_region **region)
{
	uint64_t a = (uintptr_t)addr;
	int ret = -EAGAIN;

	if (!rc || !region || !len || a + len < a)
		return -EINVAL;
	for (int tries = 0; tries < MISS_TRIES && ret == -EAGAIN; tries++) {
		struct entry *e, *dead = NULL;

		rc_lock(rc);
		if (tries == 0)
			rc->st.gets++;
		e = lookup(rc, a, len);
		if (e && e->pub.pd == pd && (e->pub.access & access) == access) {
			if (gdr_mem_monitor_valid(rc->monitor, (void *)(uintptr_t)e->pub.start,
						  e->pub.end - e->pub.start) == 1) {
				if (e->refs++ == 0)
					lru_del(rc, e);
				rc->st.hits++;
				rc_unlock(rc, NULL);
				*region = &e->pub;
				return 0;
			}
			rc->st.belt++;
			uncache(rc, e, &dead);
			e = NULL;
		}
		if (e && e->pub.pd == pd)
			access |= e->pub.access; /* replaced by one MR for both */
		rc_unlock(rc, dead);
		ret = miss(rc, pd, a, len, access, &e);
		if (ret == 0)
			*region = &e->pub;
	}
	return ret;
}

void rcache_put(struct rcache_region *region)
{
	struct entry *e = (struct entry *)region, *dead = NULL;
	struct rcache *rc = e->rc;

	rc_lock(rc);
	if (--e->refs == 0) {
		if (e->cached) {
			lru_add(rc, e);
			evict(rc, &dead);
		} else {
			rc->st.regions--; /* removed while referenced: released at its last put */
			e->dead = dead;
			dead = e;
		}
	}
	rc_unlock(rc, dead);
}

int rcache_flush(struct rcache *rc)
{
	struct entry *dead = NULL;
	int n = 0;

	rc_lock(rc);
	while (rc->lru.next != &rc->lru) {
		uncache(rc, rc->lru.next, &dead);
		n++;
	}
	rc_unlock(rc, dead);
	return n;
}

void rcache_get_stats(struct rcache *rc, struct rcache_stats *stats)
{
	rc_lock(rc);
	*stats = rc->st;
	rc_unlock(rc, NULL);
}
