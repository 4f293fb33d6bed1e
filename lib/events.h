/* SPDX-License-Identifier: MIT */
/*
 * Free events: what the intercepted CUDA free entry points (hooks.c) tell the caches.
 *
 * One process-wide ring. A wrapper of a driver free function publishes the freed range with
 * gdr_events_push() before it calls the real function: lock-free, no allocation, async-signal-safe.
 * Every cache keeps the number of the next event it has not applied; its hit path compares it with
 * gdr_events_head() (one load of a line that only frees write) and takes its slow path, which drains
 * the ring under the cache lock, when they differ. A cache that falls more than GDR_EVENTS_RING
 * events behind has lost some: it must treat every entry as stale.
 */
#ifndef GDRCACHE_EVENTS_H
#define GDRCACHE_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#define GDR_EVENTS_RING 4096u          /* a power of two */
#define GDR_EVENT_ALL_LEN UINT64_MAX   /* len of an event that frees everything (context destroyed) */

struct gdr_event {
	uint64_t start, len;
};

/* Publish that [start, start+len) is being freed. len 0 is taken as "the allocation at start". */
void gdr_events_push(uint64_t start, uint64_t len);
/* Events reserved so far (acquire); the next event's number. */
uint64_t gdr_events_head(void);
/* Event number seq. 0; -EAGAIN: reserved but not yet written (retry); -ERANGE: overwritten (lost). */
int gdr_events_get(uint64_t seq, struct gdr_event *ev);

/* hooks.c: whether the free interception works in this process, proven once by a test allocation
 * freed through each path a program may use to reach the driver. 0, or -errno with *why (static
 * text). Needs gdr_cuda_load() to have succeeded. Cached after the first call. */
int gdr_events_probe(const char **why);
/* What gdr_cache_create asks (gdr_events_probe); tests that simulate the interception replace it. */
extern int (*gdr_events_prober)(const char **why);

#endif /* GDRCACHE_EVENTS_H */
