/* SPDX-License-Identifier: MIT */
/* Per-thread hold counters and read-side epochs of the caches (thread.c). */
#ifndef GDR_CACHE_THREAD_H
#define GDR_CACHE_THREAD_H

#include <stdint.h>

struct gdr_cache;
struct gdr_region;

/* thread.c: per-thread hold counters and read-side epochs (see there). Counters are 64 bits: one
 * moves one way for a thread that only registers (or only releases) a record, and at one step per
 * nanosecond it would take 292 years to wrap. 512 counters (4 KiB) a chunk, allocated as a thread
 * first holds a slot of it; GDR_SLOT_MAX records per cache. */
#define GDR_SLOT_CHUNK 512u
#define GDR_SLOT_CHUNKS 1024u
#define GDR_SLOT_MAX (GDR_SLOT_CHUNK * GDR_SLOT_CHUNKS)
struct gdr_thr {
	uint64_t epoch; /* odd while looking up without the lock; written by its thread */
	uint64_t fast_hits, tag_checks; /* counted by its thread */
	uint64_t walks; /* probe runs walked (a bucket decided nothing): by its thread, for tests */
	struct gdr_region *memo; /* the record of its last lock-free hit, valid while memo_gen is */
	uint64_t memo_gen;       /* the cache's gen then */
	int dead;                /* its thread exited: the next new thread takes the record over */
	struct gdr_thr *next;
	int64_t *chunk[GDR_SLOT_CHUNKS];
} __attribute__((aligned(64)));
/* This thread's record for c, made on first use (NULL: out of memory). Any number of caches per
 * thread: one record per (thread, cache) for the cache's life, found through a small direct-mapped
 * TLS table and, behind it, a per-thread hash. */
struct gdr_thr *gdr_thr_get(struct gdr_cache *c);
/* The same, but NULL where this thread has no record for c yet (never allocates). Inline: the
 * direct-mapped TLS table (thread.c) first, every hit and release asks: cache.h. */
#define GDR_THR_TLS_SLOTS 4
extern __thread struct gdr_thr_tls {
	uint64_t id;
	struct gdr_thr *t;
} gdr_thr_tls[GDR_THR_TLS_SLOTS] __attribute__((tls_model("initial-exec")));
struct gdr_thr *gdr_thr_find_slow(struct gdr_cache *c);
/* This thread's counter of slot, or NULL if its chunk is not there yet (see _alloc). */
static inline int64_t *gdr_thr_counter(struct gdr_thr *t, uint32_t slot)
{
	int64_t *ch = __atomic_load_n(&t->chunk[slot / GDR_SLOT_CHUNK], __ATOMIC_ACQUIRE);

	return ch ? &ch[slot % GDR_SLOT_CHUNK] : NULL;
}
/* This thread's counter of slot, its chunk allocated if need be, and the cache's count of holds
 * given back under the lock for the chunk too (so that such a release needs no memory). Under the
 * cache's lock. NULL: out of memory. */
int64_t *gdr_thr_counter_alloc(struct gdr_cache *c, struct gdr_thr *t, uint32_t slot);
/* The cache's count of slot's holds given back under the lock (a release by a thread with no hold
 * of its own on it), or NULL where no thread ever held slot's chunk. Under the cache's lock. */
int64_t *gdr_thr_released(struct gdr_cache *c, uint32_t slot);
/* The counters of slot summed over threads (modulo 2^64: exact while the true sum fits). */
int64_t gdr_thr_sum(struct gdr_cache *c, uint32_t slot);
void gdr_thr_zero(struct gdr_cache *c, uint32_t slot);
void gdr_thr_sync(struct gdr_cache *c); /* a grace period */
void gdr_thr_totals(struct gdr_cache *c, uint64_t *fast_hits, uint64_t *tag_checks);
void gdr_thr_cache_init(struct gdr_cache *c); /* also decides gdr_thr_asym, once */
void gdr_thr_atfork_init(void); /* the fork handlers (statistics' lock included), once */
void gdr_thr_cache_fini(struct gdr_cache *c);
/* fn(cache, arg) for every live cache, under the list's lock (taken before any cache lock). */
void gdr_thr_foreach_cache(void (*fn)(struct gdr_cache *c, void *arg), void *arg);
/* Whether grace periods use membarrier(PRIVATE_EXPEDITED): the writer then makes every running
 * thread of the process execute a full barrier, so a lookup needs no barrier of its own. */
extern int gdr_thr_asym;
static inline void gdr_thr_enter(struct gdr_thr *t)
{
	if (__builtin_expect(__atomic_load_n(&gdr_thr_asym, __ATOMIC_RELAXED), 1)) {
		__atomic_store_n(&t->epoch, t->epoch + 1, __ATOMIC_RELAXED);
		__atomic_signal_fence(__ATOMIC_SEQ_CST); /* the compiler's order; the CPU's: sync */
	} else {
		__atomic_add_fetch(&t->epoch, 1, __ATOMIC_SEQ_CST);
	}
}
static inline void gdr_thr_leave(struct gdr_thr *t)
{
	__atomic_store_n(&t->epoch, t->epoch + 1, __ATOMIC_RELEASE);
}

#endif /* GDR_CACHE_THREAD_H */
