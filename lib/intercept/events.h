/* SPDX-License-Identifier: MIT */
/*
 * Free events: what the intercepted CUDA free and allocation entry points (hooks.c) tell the
 * caches.
 *
 * One process-wide ring. An intercepted free publishes the freed range with gdr_events_push()
 * before it calls the driver: lock-free, no allocation, async-signal-safe. Every cache keeps the
 * number of the next event it has not applied; its hit path compares it with gdr_events_head()
 * (one load of a line that only frees write) and takes its slow path, which drains the ring under
 * the cache lock, when they differ. A cache that falls more than GDR_EVENTS_RING events behind
 * has lost some: it must treat every entry as stale. An intercepted allocation publishes the range
 * it got (GDR_EV_ALLOC): no cached tag can rightly overlap memory the driver just handed out.
 *
 * Frees in flight. Between the event and the driver's return, the buffer is still alive: a
 * registration that classified it then would cache memory about to be freed. So a free is also
 * announced in a small table for as long as it runs (gdr_events_free_begin / _end), and a
 * registration that classified memory a free in flight may concern does not cache it: it waits for
 * the free to return and classifies again (gdr_events_inflight). Together: an entry classified
 * before the free's announcement is dropped by its event, one classified during the free is never
 * made, one classified after it sees the driver's new state.
 */
#ifndef GDRCACHE_EVENTS_H
#define GDRCACHE_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#define GDR_EVENTS_RING 4096u        /* a power of two */
#define GDR_EVENT_ALL_LEN UINT64_MAX /* len of an event that frees everything (context destroyed) */
#define GDR_INFLIGHT_SLOTS 64u       /* frees announced at once; more count as "everything" */

enum gdr_event_kind {
	GDR_EV_FREE = 0,  /* [start, start+len) freed; len 0: the allocation at start */
	GDR_EV_ALLOC = 1, /* [start, start+len) newly allocated */
	GDR_EV_CTX = 2,   /* a context's memory was freed: every cached allocation is asked again */
};

struct gdr_event {
	uint64_t start, len;
	uint32_t kind;
};

/* Publish that [start, start+len) is being freed. len 0 is taken as "the allocation at start". */
void gdr_events_push(uint64_t start, uint64_t len);
/* Publish an event of any kind. */
void gdr_events_push_kind(uint32_t kind, uint64_t start, uint64_t len);
/* Events reserved so far (acquire); the next event's number. Inline: every hit in events mode
 * compares it. */
extern struct gdr_events_head_line {
	uint64_t head __attribute__((aligned(64)));
	char pad[56];
} gdr_events_head_line;
static inline uint64_t gdr_events_head(void)
{
	return __atomic_load_n(&gdr_events_head_line.head, __ATOMIC_ACQUIRE);
}
/* Event number seq. 0; -EAGAIN: reserved but not yet written (retry); -ERANGE: overwritten (lost). */
int gdr_events_get(uint64_t seq, struct gdr_event *ev);
/* A consumer that got -EAGAIN for seq: whether seq is now given up (lost, for every consumer: each
 * then drops everything, which is always safe). Given up where this thread is the one publishing
 * it (a signal handler, or exit() from one, interrupted the push: waiting would never end), or
 * where waited_long (its producer was stopped for good, as by a handler that never returns). */
bool gdr_events_give_up(uint64_t seq, bool waited_long);
/* gdr_events_get, waiting while seq is being written: its producer is a few instructions from
 * done, unless it is this thread (a signal handler interrupted the push) or was stopped for a
 * second (a handler that never returns): then seq is given up. 0; -ERANGE (overwritten, or given
 * up: *gave_up says which). */
int gdr_events_get_wait(uint64_t seq, struct gdr_event *ev, bool *gave_up);
/* For tests: called inside gdr_events_push_kind after event n is reserved (where 0) and before its
 * slot is published (where 1). NULL in the library. */
extern void (*gdr_events_push_hook)(int where, uint64_t n);

/* Announce a free of [start, start+len) (len 0: the allocation at start; GDR_EVENT_ALL_LEN:
 * everything) until gdr_events_free_end(the returned token). Lock-free, never fails. */
int gdr_events_free_begin(uint64_t start, uint64_t len);
void gdr_events_free_end(int token);
/* Whether a free in flight may concern what `overlaps` says it does, asked for each announced
 * (start, len); a free being announced right now, or beyond the table, concerns everything. */
bool gdr_events_inflight(bool (*overlaps)(uint64_t start, uint64_t len, const void *arg),
			 const void *arg);
/* The frees announced now, kept for a check made later (gdr_events_inflight_was): a registration
 * takes it once it has applied the events published so far, before it classifies, so that a free
 * that was already announced then (its event applied, the driver not yet called) but has ended by
 * the time the registration checks (gdr_events_inflight) is still seen. */
struct gdr_inflight_snap {
	bool all; /* a slot claimed but not yet published, or overflow: everything */
	unsigned n;
	struct {
		uint64_t start, len;
	} v[GDR_INFLIGHT_SLOTS];
};
void gdr_events_inflight_snap(struct gdr_inflight_snap *s);
/* Whether one of the frees in s may concern what `overlaps` says it does. */
bool gdr_events_inflight_was(const struct gdr_inflight_snap *s,
			     bool (*overlaps)(uint64_t start, uint64_t len, const void *arg),
			     const void *arg);
/* Frees announced now (for tests). */
unsigned gdr_events_inflight_count(void);

/* Who acts on the events on the freeing thread, before the free returns: the caches
 * (cache/apply.c) and the public monitors (monitor.c) register one handler each; the hooks
 * (hooks.c) dispatch to them and name neither. */
struct gdr_event_handler {
	/* Event ev was published. nested: inside another hook's driver call (the driver called its
	 * own exported entry point, holding its locks): nothing that may wait may be done now, only
	 * noted for end(). Returns the pins released; *deferred set where the work was left for
	 * later. */
	uint64_t (*event)(const struct gdr_event *ev, bool nested, bool *deferred);
	/* The outermost hook on this thread ends: what was left for later may be done. Returns the
	 * pins released. */
	uint64_t (*end)(void);
	/* An allocation ran out of GPU memory: release what can be; returns how many were. NULL:
	 * nothing to release. */
	uint64_t (*relieve)(void);
};
/* The library's locks this thread holds (the caches'): a handler must not wait for one then, and
 * the last one's release ends what the hooks left for later (gdr_events_dispatch_end). */
extern __thread int gdr_locks_held __attribute__((tls_model("initial-exec")));
#define GDR_EVENT_HANDLERS 4
/* Register h (static storage; never removed). At most GDR_EVENT_HANDLERS; idempotent. */
void gdr_events_add_handler(const struct gdr_event_handler *h);
/* What the hooks call: each handler in turn (sums of their results). */
uint64_t gdr_events_dispatch(const struct gdr_event *ev, bool nested, bool *deferred);
uint64_t gdr_events_dispatch_end(void);
uint64_t gdr_events_dispatch_relieve(void);

#endif /* GDRCACHE_EVENTS_H */
