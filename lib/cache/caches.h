/* SPDX-License-Identifier: MIT */
/* The process's caches, as the interception of the driver's frees (lib/intercept/) sees them. */
#ifndef GDR_CACHE_CACHES_H
#define GDR_CACHE_CACHES_H

#include <stdint.h>
#include "common/defs.h"

#include "intercept/events.h" /* gdr_locks_held: the cache locks this thread holds */
/* This thread's cancellation state before its outermost cache lock (cache.h, gdr_cache_lock). */
extern GDR_HIDDEN __thread int gdr_cache_cancel_state __attribute__((tls_model("initial-exec")));
/* Apply pending free events in every cache now, releasing unreferenced pins of freed memory.
 * Returns the number of pins released. Takes each cache's lock in turn. */
GDR_HIDDEN uint64_t gdr_caches_apply_events(void);
/* Release every unreferenced pin of every cache (out-of-memory relief). Returns how many. */
GDR_HIDDEN uint64_t gdr_caches_relieve(void);
/* Set when a free's pin release was left for later (a thread holding a cache lock, or a hook
 * nested in the driver's call): gdr_cache_unlock() and the outermost hook's end apply events while
 * it is set. */
extern GDR_HIDDEN int gdr_caches_release_pending;
/* The caches become a handler of the free events (events.h); at each cache's creation. */
GDR_HIDDEN void gdr_caches_listen(void);
/* Registrations that waited for a free in flight, summed over caches. */
GDR_HIDDEN uint64_t gdr_caches_reg_waits(void);

#endif /* GDR_CACHE_CACHES_H */
