/* SPDX-License-Identifier: MIT */
/*
 * Free events for middleware that keeps its own cache (gdrcache.h, "Free events for middleware"):
 * the public ring cursor, and monitors, one handler of the events (events.h) beside the caches'.
 *
 * A monitor is a sorted array of subscriptions under its own mutex, and a callback. The hooks call
 * the handler on the freeing thread: it marks the subscriptions the event concerns stale (what
 * gdr_mem_monitor_valid answers from) and calls the callback, outside the mutex. Where a callback
 * may not run now (nested in the driver's own call: the driver frees through its exported entry
 * while holding its locks; or this thread holds a lock of the library's: a monitor's mutex, a
 * cache's; or a callback is running on this thread and called the driver), the event is not kept:
 * the thread notes "something was freed" (one byte: the library's static TLS is within glibc's
 * share per library, tests/events/edge_tls.c) and, when the outermost hook ends or the last lock is
 * released, every monitor gets a context event (everything may be gone) and marks all its
 * subscriptions stale. Those cases are rare (the library's own context release, a callback that
 * breaks its rules, a free in a signal handler), and too much invalidated is always safe.
 *
 * Monitors live in a table of GDR_MONITORS slots, each with a count of the handlers inside it: a
 * handler counts itself in, then loads the slot; destroy empties the slot, then waits until the
 * count is 0. So no handler uses a monitor after gdr_mem_monitor_destroy returned.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/defs.h"
#include "common/log.h"
#include "cuda/cuda.h"
#include "intercept/events.h"
#include "intercept/hooks.h"
#include "intercept/monitor.h"

#define GDR_TLS __thread __attribute__((tls_model("initial-exec")))
#define GDR_MONITORS 64u

_Static_assert((int)GDR_MEM_EVENT_FREE == (int)GDR_EV_FREE &&
		       (int)GDR_MEM_EVENT_ALLOC == (int)GDR_EV_ALLOC &&
		       (int)GDR_MEM_EVENT_CONTEXT == (int)GDR_EV_CTX,
	       "the public event kinds are the ring's");

struct sub {
	uint64_t a, len;     /* the range subscribed */
	uint64_t base, blen; /* the allocation (or VMM mapping) that held a when subscribed */
	uint32_t count;      /* subscriptions of exactly [a, a+len) made while it was fresh */
	bool stale;          /* an event concerned it since */
};

struct gdr_mem_monitor {
	unsigned flags;
	gdr_mem_event_fn fn;
	void *arg;
	pthread_mutex_t lock;
	struct sub *v; /* sorted by a */
	size_t n, cap;
	uint64_t max_len, max_blen; /* the largest of each over v (never shrink: only a bound) */
};

static struct {
	struct gdr_mem_monitor *m;
	unsigned inside; /* handlers using m now */
} slots[GDR_MONITORS];
static unsigned live; /* monitors in slots: the handler's fast way out */
static uint64_t violations;

/* The slot + 1 of the monitor whose callback runs on this thread (0: none); whether an event
 * came that could not be delivered then (see above). */
static GDR_TLS uint8_t running;
static GDR_TLS uint8_t undelivered;

bool gdr_monitor_in_callback(void)
{
	return running != 0;
}

int gdr_monitor_refuse(const char *what)
{
	gdr_err("%s called from a free-event callback: refused (the freeing thread may hold the "
		"locks it takes)",
		what);
	return -EDEADLK;
}

/* ---- subscriptions (under the monitor's lock) ----------------------------------------------------- */

/* A library lock (gdr_locks_held): a free on this thread meanwhile, in a signal handler, is not
 * delivered until the last one is released. */
static void lock(struct gdr_mem_monitor *m)
{
	gdr_locks_held++;
	pthread_mutex_lock(&m->lock);
}

static void unlock(struct gdr_mem_monitor *m)
{
	pthread_mutex_unlock(&m->lock);
	if (!--gdr_locks_held)
		gdr_events_dispatch_end();
}

/* The first subscription with a >= x. */
static size_t lower(const struct gdr_mem_monitor *m, uint64_t x)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m->v[mid].a < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static uint64_t end_of(uint64_t a, uint64_t len)
{
	return len > UINT64_MAX - a ? UINT64_MAX : a + len;
}

/* Mark what ev concerns stale; whether anything was concerned. *extent: for a free without a size,
 * the size of the allocation it frees, where a subscription knew it (else left 0). */
static bool mark(struct gdr_mem_monitor *m, const struct gdr_event *ev, uint64_t *extent)
{
	bool hit = false;

	if (ev->kind == GDR_EV_CTX) {
		for (size_t i = 0; i < m->n; i++)
			m->v[i].stale = true;
		return m->n > 0;
	}
	if (ev->kind == GDR_EV_FREE && ev->len == 0) { /* the allocation that starts at start */
		uint64_t hi = end_of(ev->start, m->max_blen);

		for (size_t i = lower(m, ev->start); i < m->n && m->v[i].a < hi; i++) {
			if (m->v[i].base == ev->start) {
				hit = m->v[i].stale = true;
				if (m->v[i].blen > *extent)
					*extent = m->v[i].blen;
			}
		}
		return hit;
	}
	uint64_t lo = ev->start > m->max_len ? ev->start - m->max_len : 0;
	uint64_t hi = end_of(ev->start, ev->len);

	for (size_t i = lower(m, lo); i < m->n && m->v[i].a < hi; i++)
		if (end_of(m->v[i].a, m->v[i].len) > ev->start)
			hit = m->v[i].stale = true;
	return hit;
}

/* ---- the handler (events.h) ---------------------------------------------------------------------- */

/* Whether ev concerns m, marking its subscriptions; *extent as mark's. No library lock is held on
 * this thread. */
static bool concerns(struct gdr_mem_monitor *m, const struct gdr_event *ev, uint64_t *extent)
{
	bool hit;

	pthread_mutex_lock(&m->lock);
	hit = mark(m, ev, extent);
	pthread_mutex_unlock(&m->lock);
	return hit || (m->flags & GDR_MONITOR_ALL);
}

static void deliver(const struct gdr_event *ev)
{
	for (unsigned i = 0; i < GDR_MONITORS; i++) {
		struct gdr_mem_event pub = { .start = ev->start, .len = ev->len, .kind = ev->kind };
		struct gdr_mem_monitor *m;

		__atomic_add_fetch(&slots[i].inside, 1, __ATOMIC_SEQ_CST);
		m = __atomic_load_n(&slots[i].m, __ATOMIC_SEQ_CST);
		if (m && concerns(m, ev, &pub.len) && m->fn) {
			running = (uint8_t)(i + 1);
			m->fn(m->arg, &pub);
			running = 0;
		}
		__atomic_sub_fetch(&slots[i].inside, 1, __ATOMIC_SEQ_CST);
	}
}

static uint64_t monitors_event(const struct gdr_event *ev, bool nested, bool *deferred)
{
	if (!__atomic_load_n(&live, __ATOMIC_SEQ_CST))
		return 0;
	if (running) { /* a callback called the driver: delivered after it */
		__atomic_add_fetch(&violations, 1, __ATOMIC_RELAXED);
		gdr_err("a free-event callback called the CUDA driver (a %s): it breaks the "
			"callback's rules (gdrcache.h); its event is delivered after the callback",
			ev->kind == GDR_EV_ALLOC ? "allocation" : "free");
		nested = true;
	}
	if (!nested && !gdr_locks_held) {
		deliver(ev);
		return 0;
	}
	undelivered = 1;
	*deferred = true;
	return 0;
}

/* The outermost hook ends, or the last library lock is released. */
static uint64_t monitors_end(void)
{
	if (!undelivered || gdr_locks_held || running)
		return 0;
	undelivered = 0;
	deliver(&(struct gdr_event){ .start = 0, .len = GDR_EVENT_ALL_LEN, .kind = GDR_EV_CTX });
	return 0;
}

static const struct gdr_event_handler monitors_handler = {
	.event = monitors_event,
	.end = monitors_end,
};

/* ---- the API ---------------------------------------------------------------------------------------- */

GDR_EXPORT int gdr_mem_events_state(const char **why)
{
	GDR_KEEP_ERRNO();
	const char *w = "no CUDA driver";
	int rc = gdr_driver_load() ? -ENODEV : gdr_events_probe(&w);

	if (why)
		*why = rc ? w : "free events in effect";
	return rc;
}

GDR_EXPORT uint64_t gdr_mem_events_head(void)
{
	return gdr_events_head();
}

GDR_EXPORT int gdr_mem_events_get(uint64_t seq, struct gdr_mem_event *out)
{
	struct gdr_event e;
	bool gave_up;
	int rc;

	if (!out || seq >= gdr_events_head())
		return -EINVAL;
	rc = gdr_events_get_wait(seq, &e, &gave_up);
	if (rc)
		return rc;
	*out = (struct gdr_mem_event){ .start = e.start, .len = e.len, .kind = e.kind };
	return 0;
}

static bool is_live(const struct gdr_mem_monitor *m)
{
	for (unsigned i = 0; m && i < GDR_MONITORS; i++)
		if (__atomic_load_n(&slots[i].m, __ATOMIC_ACQUIRE) == m)
			return true;
	return false;
}

GDR_EXPORT int gdr_mem_monitor_create(unsigned flags, gdr_mem_event_fn fn, void *arg,
				      struct gdr_mem_monitor **out)
{
	GDR_KEEP_ERRNO();
	struct gdr_mem_monitor *m;
	const char *why;
	int rc;

	if (!out || (flags & ~GDR_MONITOR_ALL)) {
		if (!out)
			gdr_err("NULL monitor pointer");
		else
			gdr_err("unknown monitor flags %#x", flags & ~GDR_MONITOR_ALL);
		return -EINVAL;
	}
	*out = NULL;
	if (running)
		return gdr_monitor_refuse("gdr_mem_monitor_create");
	rc = gdr_mem_events_state(&why);
	if (rc) {
		gdr_err("no free-event monitor: free events are not in effect (%s)", why);
		return rc;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->flags = flags;
	m->fn = fn;
	m->arg = arg;
	pthread_mutex_init(&m->lock, NULL);
	gdr_events_add_handler(&monitors_handler);
	for (unsigned i = 0; i < GDR_MONITORS; i++) {
		struct gdr_mem_monitor *none = NULL;

		if (__atomic_compare_exchange_n(&slots[i].m, &none, m, false, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST)) {
			__atomic_add_fetch(&live, 1, __ATOMIC_SEQ_CST);
			*out = m;
			return 0;
		}
	}
	pthread_mutex_destroy(&m->lock);
	free(m);
	gdr_err("%u free-event monitors live already", GDR_MONITORS);
	return -EMFILE;
}

GDR_EXPORT int gdr_mem_monitor_destroy(struct gdr_mem_monitor *m)
{
	GDR_KEEP_ERRNO();
	unsigned i;

	if (running)
		return gdr_monitor_refuse("gdr_mem_monitor_destroy");
	for (i = 0; m && i < GDR_MONITORS; i++) {
		struct gdr_mem_monitor *cur = m;

		if (__atomic_compare_exchange_n(&slots[i].m, &cur, NULL, false, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST))
			break;
	}
	if (!m || i == GDR_MONITORS) {
		gdr_err("%p is not a live free-event monitor", (void *)m);
		return -EINVAL;
	}
	__atomic_sub_fetch(&live, 1, __ATOMIC_SEQ_CST);
	/* Handlers inside the slot finish their callback (which keeps the callback's rules: it
	 * waits for nothing this thread holds). */
	while (__atomic_load_n(&slots[i].inside, __ATOMIC_SEQ_CST))
		sched_yield();
	pthread_mutex_destroy(&m->lock);
	free(m->v);
	free(m);
	return 0;
}

static int check_range(const struct gdr_mem_monitor *m, const void *addr, size_t len,
		       const char *what)
{
	if (!is_live(m) || !len || (uint64_t)(uintptr_t)addr > UINT64_MAX - len) {
		gdr_err("%s: %s", what,
			!is_live(m) ? "not a live free-event monitor"
				    : "empty or overflowing range");
		return -EINVAL;
	}
	return 0;
}

GDR_EXPORT int gdr_mem_monitor_subscribe(struct gdr_mem_monitor *m, const void *addr, size_t len)
{
	GDR_KEEP_ERRNO();
	uint64_t a = (uint64_t)(uintptr_t)addr;
	struct gdr_ptr_info pi;
	size_t i;
	int rc = check_range(m, addr, len, "gdr_mem_monitor_subscribe");

	if (rc)
		return rc;
	if (running) /* its driver query would be a driver call inside a free */
		return gdr_monitor_refuse("gdr_mem_monitor_subscribe");
	if (gdr_cuda_classify(a, &pi) || !pi.mem_type || !pi.size) {
		gdr_err("gdr_mem_monitor_subscribe: %#llx is not memory the CUDA driver knows",
			(unsigned long long)a);
		return -EINVAL;
	}
	lock(m);
	for (i = lower(m, a); i < m->n && m->v[i].a == a; i++) {
		if (m->v[i].len == len && !m->v[i].stale && m->v[i].base == pi.start) {
			m->v[i].count++;
			unlock(m);
			return 0;
		}
	}
	if (m->n == m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 64;
		struct sub *v = realloc(m->v, cap * sizeof(*v));

		if (!v) {
			unlock(m);
			return -ENOMEM;
		}
		m->v = v;
		m->cap = cap;
	}
	i = lower(m, a);
	memmove(&m->v[i + 1], &m->v[i], (m->n - i) * sizeof(*m->v));
	m->v[i] = (struct sub){ .a = a, .len = len, .base = pi.start, .blen = pi.size, .count = 1 };
	m->n++;
	if (len > m->max_len)
		m->max_len = len;
	if (pi.size > m->max_blen)
		m->max_blen = pi.size;
	unlock(m);
	return 0;
}

GDR_EXPORT int gdr_mem_monitor_unsubscribe(struct gdr_mem_monitor *m, const void *addr, size_t len)
{
	GDR_KEEP_ERRNO();
	uint64_t a = (uint64_t)(uintptr_t)addr;
	size_t i, found = SIZE_MAX;
	int rc = check_range(m, addr, len, "gdr_mem_monitor_unsubscribe");

	if (rc)
		return rc;
	lock(m);
	/* a stale one first: the holder of the older registration gives it up first */
	for (i = lower(m, a); i < m->n && m->v[i].a == a; i++)
		if (m->v[i].len == len && (found == SIZE_MAX || m->v[i].stale))
			found = i;
	if (found == SIZE_MAX) {
		unlock(m);
		return -ENOENT;
	}
	if (--m->v[found].count == 0) {
		memmove(&m->v[found], &m->v[found + 1], (m->n - found - 1) * sizeof(*m->v));
		m->n--;
	}
	unlock(m);
	return 0;
}

GDR_EXPORT int gdr_mem_monitor_valid(struct gdr_mem_monitor *m, const void *addr, size_t len)
{
	uint64_t a = (uint64_t)(uintptr_t)addr, e;
	int rc = check_range(m, addr, len, "gdr_mem_monitor_valid"), ok = 0;

	if (rc)
		return rc;
	e = a + len;
	lock(m);
	for (size_t i = lower(m, a > m->max_len ? a - m->max_len : 0); i < m->n && m->v[i].a <= a;
	     i++)
		if (!m->v[i].stale && end_of(m->v[i].a, m->v[i].len) >= e) {
			ok = 1;
			break;
		}
	unlock(m);
	return ok;
}

GDR_EXPORT uint64_t gdr_mem_monitor_violations(void)
{
	return __atomic_load_n(&violations, __ATOMIC_RELAXED);
}
