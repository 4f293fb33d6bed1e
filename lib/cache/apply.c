/* SPDX-License-Identifier: MIT */
/*
 * Free events applied to a cache (mode events): each event drops exactly the entries whose memory
 * it freed or reallocated; a context's end revalidates every entry. And the process's caches as the
 * interception of the driver's frees sees them (caches.h). At level debug, a line for each event
 * that dropped entries and for each application of a hook's events that dropped or unpinned any
 * (an event that drops nothing, most frees, says nothing).
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cache/cache.h"
#include "cache/caches.h"
#include "common/log.h"
#include "intercept/events.h"
#include "intercept/hooks.h"

/* Its cancellation state before the outermost of them (cache.h: none acts while one is held). */
__thread int gdr_cache_cancel_state __attribute__((tls_model("initial-exec")));
/* Set while this thread applies events for the hooks (no recursion from gdr_cache_unlock). */
__thread int gdr_cache_applying __attribute__((tls_model("initial-exec")));
/* A free's pin release left for later (caches.h). */
int gdr_caches_release_pending;

/* ---- free events (mode events) ------------------------------------------------------------------ */

/* Drop every indexed entry sharing a byte with [lo, hi). */
static void drop_range(struct gdr_cache *c, uint64_t lo, uint64_t hi)
{
	size_t i = gdr_index_lower(&c->index, lo);

	while (i < c->index.n && c->index.v[i]->pin.base < hi) {
		gdr_entry_stale(c, c->index.v[i]);
		i = gdr_index_lower(&c->index, lo);
	}
}

static bool in_range(uint64_t x, uint64_t start, uint64_t size)
{
	return start <= x && x - start < size;
}

/* Whether x lies in the allocation a tag describes: its piece, or the whole range RANGE_* gave. */
static bool tag_holds(const struct gdr_tag *t, uint64_t x)
{
	return in_range(x, t->start, t->size) || in_range(x, t->alloc_start, t->alloc_size);
}

/* How far the tags of e reach beyond its pin, either way: a tag describes a whole allocation (its
 * piece, and the range RANGE_* gave) and a pin may hold only part of it (a large allocation pinned
 * by the request, a VMM reservation's mapping). */
uint64_t gdr_entry_reach(const struct gdr_entry *e)
{
	uint64_t lo = e->pin.base, hi = e->pin.base + e->pin.len;

	for (uint32_t k = 0; k < e->ntags; k++) {
		const struct gdr_tag *t = &gdr_entry_tags(e)[k];
		uint64_t s = t->start, end = t->start + t->size;

		if (t->alloc_size) {
			s = t->alloc_start < s ? t->alloc_start : s;
			end = t->alloc_start + t->alloc_size > end ? t->alloc_start + t->alloc_size
								   : end;
		}
		lo = s < lo ? s : lo;
		hi = end > hi ? end : hi;
	}
	return e->pin.base - lo > hi - (e->pin.base + e->pin.len) ? e->pin.base - lo
								  : hi - (e->pin.base + e->pin.len);
}

/* c->tag_reach_n counts the indexed entries reaching c->tag_reach: each counted when indexed and
 * when its tags grow (gdr_cache_track_reach, told how far they reached before), uncounted when it
 * leaves the index; at 0, the index is recounted. A path that grew an indexed entry's tags without
 * telling it would leave the window too narrow when the count runs out: every such path calls
 * gdr_cache_track_reach. */
static void count_reach(struct gdr_cache *c, uint64_t r)
{
	if (r > c->tag_reach) {
		c->tag_reach = r;
		c->tag_reach_n = 1;
	} else if (r && r == c->tag_reach) {
		c->tag_reach_n++;
	}
}

void gdr_cache_track_reach(struct gdr_cache *c, const struct gdr_entry *e, uint64_t before)
{
	uint64_t r = gdr_entry_reach(e);

	if (r == before)
		return;
	if (before != GDR_REACH_NEW && before && before == c->tag_reach && c->tag_reach_n > 1)
		c->tag_reach_n--; /* it reaches farther now (tags only grow) */
	count_reach(c, r);
}

void gdr_cache_untrack_reach(struct gdr_cache *c, const struct gdr_entry *e)
{
	uint64_t r = gdr_entry_reach(e);

	if (!r || r != c->tag_reach || (c->tag_reach_n && --c->tag_reach_n))
		return;
	c->tag_reach = 0;
	for (size_t i = 0; i < c->index.n; i++)
		count_reach(c, gdr_entry_reach(c->index.v[i]));
}

/* Drop every indexed entry that has a tag for which gone(c, tag, arg) holds, where such a tag can
 * only be one that touches [lo, hi): the entries whose pins lie within the tags' reach of it
 * (c->tag_reach: the most any indexed entry's tags reach beyond its pin), found in the sorted
 * index. An allocation or free event costs the entries near it, not every entry. */
static void drop_tagged(struct gdr_cache *c, uint64_t lo, uint64_t hi,
			bool (*gone)(struct gdr_cache *c, const struct gdr_tag *t, const void *arg),
			const void *arg)
{
	uint64_t wlo = lo > c->tag_reach ? lo - c->tag_reach : 0;
	uint64_t whi = hi < UINT64_MAX - c->tag_reach ? hi + c->tag_reach : UINT64_MAX;
	size_t i = gdr_index_lower(&c->index, wlo);

	if (!c->index.n)
		c->tag_reach = c->tag_reach_n = 0; /* nothing indexed reaches anywhere */
	while (i < c->index.n && c->index.v[i]->pin.base < whi) {
		struct gdr_entry *e = c->index.v[i];
		bool hit = false;

		c->events_examined++;
		for (uint32_t k = 0; !hit && k < e->ntags; k++)
			hit = gone(c, &gdr_entry_tags(e)[k], arg);
		if (hit)
			gdr_entry_stale(c, e); /* leaves the index: the next one is at i now */
		else
			i++;
	}
}

static bool tag_holds_start(struct gdr_cache *c, const struct gdr_tag *t, const void *arg)
{
	(void)c;
	return tag_holds(t, *(const uint64_t *)arg);
}

/* Drop every entry serving the allocation at `start` (a free that names only its base address:
 * cuMemFree, cuMemFreeAsync): those with a tag (the range the driver reported when the entry was
 * made) that holds it. An entry may serve part of an allocation that begins before the entry does,
 * and the range the driver reports may be wider than the allocation freed, so every entry is looked
 * at. A free of an allocation the entry has no tag for leaves it: an entry's pages all lie in
 * physical chunks that hold one of its tagged allocations, and a chunk stays mapped while any
 * allocation in it lives (docs/FACTS.md, "Pool memory"), so freeing a neighbour in the chunk (the
 * other allocations of a stream-ordered pool's 32 MiB chunk, a sub-allocated cuMemAlloc's
 * neighbours) changes no page the entry pinned. */
static void drop_allocation(struct gdr_cache *c, uint64_t start)
{
	drop_tagged(c, start, start + 1, tag_holds_start, &start);
}

/* Whether the part of tag t that is its own allocation, RANGE ∩ the tag (a pool allocation's piece
 * of a shared chunk, a VMM mapping inside its reservation), overlaps [range[0], range[1]). */
static bool tag_overlaps(struct gdr_cache *c, const struct gdr_tag *t, const void *arg)
{
	const uint64_t *range = arg;
	uint64_t s = t->start, end = t->start + t->size;

	(void)c;
	if (t->alloc_size) {
		if (t->alloc_start > s)
			s = t->alloc_start;
		if (t->alloc_start + t->alloc_size < end)
			end = t->alloc_start + t->alloc_size;
	}
	return s < range[1] && range[0] < end;
}

/* Drop every indexed entry with a tag whose allocation overlaps [lo, hi): memory the driver has just
 * handed out again (an allocation event) is no longer what any such tag described. */
static void drop_reallocated(struct gdr_cache *c, uint64_t lo, uint64_t hi)
{
	drop_tagged(c, lo, hi, tag_overlaps, (const uint64_t[2]){ lo, hi });
}

static bool tag_freed(struct gdr_cache *c, const struct gdr_tag *t, const void *arg)
{
	(void)arg;
	return gdr_validate_tag_ops.check(t) < 0;
}

/* A context's memory was freed (GDR_EV_CTX): ask the driver about every cached allocation and drop
 * the entries whose memory went. A freed allocation's BUFFER_ID query fails and ids are never
 * reused, so this drops exactly those: another device's entries, and pool and VMM memory, which
 * survive a context (docs/FACTS.md, "Several GPUs"), stay. */
static void revalidate_all(struct gdr_cache *c)
{
	drop_tagged(c, 0, UINT64_MAX, tag_freed, NULL);
}

/* Apply every free (and allocation) event published so far. Under the lock. */
void gdr_cache_drain_events(struct gdr_cache *c)
{
	uint64_t n = c->ev_next, head = gdr_events_head(), stale;

	while (n < head) {
		struct gdr_event ev;
		bool gave_up;
		/* A slot being written is waited for, but not where its producer is this thread
		 * (issue 31 #8: exit() from a handler that interrupted the push, then the program's
		 * clean-up at exit, waited for ever) or was stopped for a second. */
		int rc = gdr_events_get_wait(n, &ev, &gave_up);

		if (rc) {
			c->st.events_lost++;
			if (gave_up)
				gdr_warn(
					"a free event its producer never finished (a signal handler "
					"interrupted it): every entry is dropped");
			else
				gdr_warn("more than %u free events since this cache last looked: "
					 "every entry is dropped",
					 GDR_EVENTS_RING);
			drop_range(c, 0, UINT64_MAX);
			n = head = gdr_events_head();
			break;
		}
		c->st.events++;
		stale = c->st.stale;
		if (ev.kind == GDR_EV_CTX)
			revalidate_all(c);
		else if (ev.kind == GDR_EV_ALLOC)
			drop_reallocated(c, ev.start,
					 ev.start + ev.len < ev.start ? UINT64_MAX
								      : ev.start + ev.len);
		else if (ev.len == GDR_EVENT_ALL_LEN)
			drop_range(c, 0, UINT64_MAX);
		else if (ev.len)
			drop_range(c, ev.start,
				   ev.start + ev.len < ev.start ? UINT64_MAX : ev.start + ev.len);
		else
			drop_allocation(c, ev.start);
		if (c->st.stale != stale)
			gdr_dbg("event cache=%llu kind=%s %s=%#llx len=%llu dropped=%llu",
				(unsigned long long)c->id,
				ev.kind == GDR_EV_CTX     ? "context"
				: ev.kind == GDR_EV_ALLOC ? "alloc"
							  : "free",
				ev.len ? "range" : "addr", (unsigned long long)ev.start,
				(unsigned long long)ev.len,
				(unsigned long long)(c->st.stale - stale));
		n++;
	}
	__atomic_store_n(&c->ev_next, n, __ATOMIC_RELEASE);
}

/* What a registration classified, for the check against frees in flight. */
struct classified {
	uint64_t a, len;
	const struct gdr_tag *tags;
	uint32_t ntags;
};

/* Whether a free of [start, start+len) (len 0: the allocation at start) may concern it. */
static bool classified_overlaps(uint64_t start, uint64_t len, const void *arg)
{
	const struct classified *k = arg;

	if (!len) {
		if (in_range(start, k->a, k->len))
			return true;
		for (uint32_t i = 0; i < k->ntags; i++)
			if (tag_holds(&k->tags[i], start))
				return true;
		return false;
	}
	if (start < k->a + k->len && k->a < start + len)
		return true;
	for (uint32_t i = 0; i < k->ntags; i++)
		if (start < k->tags[i].start + k->tags[i].size && k->tags[i].start < start + len)
			return true;
	return false;
}

bool gdr_cache_free_inflight(uint64_t a, uint64_t len, const struct gdr_tag *tags, uint32_t ntags)
{
	return gdr_events_inflight(classified_overlaps,
				   &(struct classified){
					   .a = a, .len = len, .tags = tags, .ntags = ntags });
}

bool gdr_cache_free_was_inflight(const struct gdr_inflight_snap *s, uint64_t a, uint64_t len,
				 const struct gdr_tag *tags, uint32_t ntags)
{
	return gdr_events_inflight_was(s, classified_overlaps,
				       &(struct classified){
					       .a = a, .len = len, .tags = tags, .ntags = ntags });
}

/* ---- for the hooks of the driver's free and allocation functions (caches.h) ---------------------- */

static void apply_one(struct gdr_cache *c, void *arg)
{
	uint64_t before, stale, events;

	gdr_cache_lock(c);
	before = c->st.unpins;
	stale = c->st.stale;
	events = c->st.events;
	gdr_cache_drain_events(c);
	gdr_settle(c); /* the entries the events dropped, unpinned now (one grace period for all) */
	*(uint64_t *)arg += c->st.unpins - before;
	if (c->st.stale != stale || c->st.unpins != before)
		gdr_dbg("free_applied cache=%llu events=%llu dropped=%llu unpinned=%llu detached=%llu",
			(unsigned long long)c->id, (unsigned long long)(c->st.events - events),
			(unsigned long long)(c->st.stale - stale),
			(unsigned long long)(c->st.unpins - before),
			(unsigned long long)c->st.detached);
	gdr_cache_unlock(c);
}

uint64_t gdr_caches_apply_events(void)
{
	uint64_t n = 0;

	gdr_cache_applying++;
	__atomic_store_n(&gdr_caches_release_pending, 0, __ATOMIC_SEQ_CST);
	gdr_thr_foreach_cache(apply_one, &n);
	gdr_cache_applying--;
	return n;
}

static void relieve_one(struct gdr_cache *c, void *arg)
{
	int n;

	gdr_cache_lock(c);
	gdr_cache_drain_events(c);
	n = gdr_drop_unheld(c);
	if (n)
		gdr_dbg("relieve cache=%llu dropped=%d why=gpu_out_of_memory",
			(unsigned long long)c->id, n);
	c->st.evictions += (uint64_t)n;
	*(uint64_t *)arg += (uint64_t)n;
	gdr_cache_unlock(c);
}

uint64_t gdr_caches_relieve(void)
{
	uint64_t n = 0;

	gdr_cache_applying++;
	gdr_thr_foreach_cache(relieve_one, &n);
	gdr_cache_applying--;
	if (n)
		gdr_warn("an allocation ran out of GPU memory: %llu cached pins released, retrying",
			 (unsigned long long)n);
	return n;
}

/* The caches as one handler of the events (events.h): a free's event releases the unreferenced
 * pins of its range in every cache at once, unless this thread holds a cache lock (the library
 * itself called the driver) or the hook is nested in the driver's own call: then the release is
 * left to the lock's holder (gdr_cache_unlock) or to the outermost hook's end. A context's event
 * is published after the driver returned and applied at the hook's end. */
static void leave_for_later(bool *deferred)
{
	__atomic_store_n(&gdr_caches_release_pending, 1, __ATOMIC_SEQ_CST);
	*deferred = true;
}

static uint64_t caches_event(const struct gdr_event *ev, bool nested, bool *deferred)
{
	switch (ev->kind) {
	case GDR_EV_FREE:
		if (nested || gdr_locks_held) {
			leave_for_later(deferred);
			return 0;
		}
		return gdr_caches_apply_events();
	case GDR_EV_CTX:
		__atomic_store_n(&gdr_caches_release_pending, 1, __ATOMIC_SEQ_CST);
		if (nested || gdr_locks_held)
			*deferred = true;
		return 0;
	default: /* an allocation's: read from the ring at each cache's next miss */
		return 0;
	}
}

static uint64_t caches_end(void)
{
	if (gdr_locks_held || !__atomic_load_n(&gdr_caches_release_pending, __ATOMIC_SEQ_CST))
		return 0;
	return gdr_caches_apply_events();
}

static uint64_t caches_relieve(void)
{
	return gdr_locks_held ? 0 : gdr_caches_relieve();
}

static const struct gdr_event_handler caches_handler = {
	.event = caches_event,
	.end = caches_end,
	.relieve = caches_relieve,
};

void gdr_caches_listen(void)
{
	gdr_events_add_handler(&caches_handler);
}

static void sum_waits(struct gdr_cache *c, void *arg)
{
	*(uint64_t *)arg += __atomic_load_n(&c->reg_waits, __ATOMIC_RELAXED);
}

uint64_t gdr_caches_reg_waits(void)
{
	uint64_t n = 0;

	gdr_thr_foreach_cache(sum_waits, &n);
	return n;
}

/* The interception's statistics with the caches' part (intercept/hooks.c gives the rest): exported
 * here, above both, so that the interception never reads the caches. */
GDR_EXPORT int gdr_intercept_get_stats(struct gdr_intercept_stats *out, size_t size)
{
	struct gdr_intercept_stats s;

	if (!out || size < offsetof(struct gdr_intercept_stats, frees)) {
		gdr_err("NULL or too small statistics buffer");
		return -EINVAL;
	}
	gdr_hooks_get_stats(&s);
	s.reg_waits = gdr_caches_reg_waits();
	memcpy(out, &s, size < sizeof(s) ? size : sizeof(s));
	return 0;
}
