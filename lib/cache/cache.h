/* SPDX-License-Identifier: MIT */
/* The cache's own types: registration records, entries and struct gdr_cache. Only the files of lib/cache/ include it. */
#ifndef GDR_CACHE_CACHE_H
#define GDR_CACHE_CACHE_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "gdrcache.h"
#include "common/config.h"
#include "common/defs.h"
#include "common/ident.h"
#include "common/log.h"
#include "backend/backend.h"
#include "validate/validate.h"
#include "cache/caches.h"
#include "cache/idset.h"
#include "cache/index.h"
#include "cache/thread.h"

struct gdr_entry;
#define GDR_REGION_LIVE 0x6c697665u  /* "live" */
#define GDR_REGION_DEAD 0x64656164u  /* "dead" */
#define GDR_REGION_DYING 0x6479696eu /* "dyin" */
/* State of an entry (and its mirror in its records' estate), read by the lock-free hit path. */
enum { GDR_LIVE = 0, GDR_DYING = 1, GDR_DETACHED = 2 };

/* A registration record: what gdr_reg hands out, shared by every registration of one allocation
 * of an entry for one (pd, access). Immutable while published, but for magic, estate and used.
 * Held through the per-thread counters of its slot (thread.c) plus the cache's count of holds given
 * back under the lock (gdr_thr_released). Records are never given back while their cache lives:
 * they live in one arena per cache (record.c), record n at slot n, and the arena's alignment gives
 * a record's slot and cache (gdr_rec_slot, gdr_rec_cache) without storing them. A retired record is
 * marked DEAD and reused, with its slot, only after GDR_REUSE_DELAY others were retired after it,
 * so a late gdr_dereg of a released region reads a record, never freed memory. One cache line
 * (64 bytes, 64-byte aligned): all of it is what a hit and a release read. */
struct gdr_region {
	uint32_t magic; /* GDR_REGION_LIVE; DYING while its PD is being released (no new hold
			   is taken, holds are still given back); DEAD once retired */
	int access;
	struct gdr_entry *entry; /* NULL: host memory passed through */
	struct ibv_pd *pd;
	uint64_t start, size; /* the allocation it serves, within its entry's range (requests
				 inside it hit lock-free); for an exact record, exactly the range
				 registered */
	struct ibv_mr *mr;    /* an exact record's own; a shared one's is the MR of its entry for
				 (pd, access), owned by all its records for that pair (entry.c) */
	uint64_t buffer_id;   /* of that allocation */
	uint8_t exact;        /* owns an MR of exactly [start, start+size) (remote access); 2:
				 the range goes past the allocation of buffer_id (mode tag: never
				 a lock-free hit) */
	uint8_t kind;
	uint8_t estate; /* its entry's state, mirrored here (entry.c: gdr_entry_set_state) so
			   that a hit and a release read no line of the entry */
	uint8_t used;   /* cached: taken lock-free since the evictor last looked at its entry;
			   host memory: 1 while held */
	uint32_t link;  /* slot of the next record: in its entry's list (under the lock only), or,
			   once retired, in the list it waits in for reuse (0: none); and
			   GDR_REC_RELEASED. Written under the lock, atomically */
};
_Static_assert(sizeof(struct gdr_region) == 64, "a record is one cache line");

/* The records' arena of a cache: GDR_SLOT_MAX records, aligned to its size; slot 0 is this. */
#define GDR_REC_ARENA ((uintptr_t)GDR_SLOT_MAX * sizeof(struct gdr_region))
_Static_assert((GDR_REC_ARENA & (GDR_REC_ARENA - 1)) == 0, "the arena's size is a power of two");
struct gdr_rec_head {
	struct gdr_cache *cache;
};

static inline uintptr_t gdr_rec_arena(const struct gdr_region *r)
{
	return (uintptr_t)r & ~(GDR_REC_ARENA - 1);
}

/* A record's number in its cache (never 0), and its cache: from its address alone. */
static inline uint32_t gdr_rec_slot(const struct gdr_region *r)
{
	return (uint32_t)(((uintptr_t)r & (GDR_REC_ARENA - 1)) / sizeof(*r));
}

static inline struct gdr_cache *gdr_rec_cache(const struct gdr_region *r)
{
	return ((const struct gdr_rec_head *)gdr_rec_arena(r))->cache;
}

/* A flag of a record's link word: some of its holds were given back under the lock by threads
 * that held none (gdr_thr_released's count of its slot is not 0). A thread's own count of the
 * record may then exceed what the record still holds (a second release of what another thread
 * released), which only the sum tells: a lock-free release leaves it to the locked path. */
#define GDR_REC_RELEASED (1u << 31)
_Static_assert(GDR_SLOT_MAX < GDR_REC_RELEASED, "a slot number leaves the link's flag free");

/* The record that r's link names, or NULL; and r's link set to q (NULL: none), its flag kept. */
static inline struct gdr_region *gdr_region_next(const struct gdr_region *r)
{
	uint32_t l = __atomic_load_n(&r->link, __ATOMIC_RELAXED) & ~GDR_REC_RELEASED;

	return l ? (struct gdr_region *)gdr_rec_arena(r) + l : NULL;
}

static inline void gdr_region_set_next(struct gdr_region *r, const struct gdr_region *q)
{
	uint32_t f = __atomic_load_n(&r->link, __ATOMIC_RELAXED) & GDR_REC_RELEASED;

	__atomic_store_n(&r->link, f | (q ? gdr_rec_slot(q) : 0), __ATOMIC_RELAXED);
}

/* GDR_REC_RELEASED of r: whether it is set; set or cleared (under the lock). */
static inline bool gdr_region_released(const struct gdr_region *r)
{
	return __atomic_load_n(&r->link, __ATOMIC_RELAXED) & GDR_REC_RELEASED;
}

static inline void gdr_region_set_released(struct gdr_region *r, bool on)
{
	uint32_t l = __atomic_load_n(&r->link, __ATOMIC_RELAXED) & ~GDR_REC_RELEASED;

	__atomic_store_n(&r->link, l | (on ? GDR_REC_RELEASED : 0), __ATOMIC_RELAXED);
}

/* Whether r may name a record at all: records are one cache line each, aligned to it. A pointer
 * into a record (whose fields the caller chose in part: an exact record's start and size) is none,
 * and reading its fields would be a misaligned access. Checked before anything else is read. */
static inline bool gdr_region_aligned(const struct gdr_region *r)
{
	return ((uintptr_t)r & (sizeof(*r) - 1)) == 0;
}

/* The arenas of the live caches (record.c): an open-addressed table of their base addresses,
 * written under a lock at create and destroy, read without one. 0: never used; 1 (no arena is
 * at 1): an arena was there. At most GDR_ARENAS caches live at once. */
#define GDR_ARENAS 4096u
#define GDR_ARENA_GONE ((uintptr_t)1)
extern GDR_HIDDEN uintptr_t gdr_arenas[GDR_ARENAS];

/* Whether r is handed out: a gdr_dereg of it is accepted (LIVE, or DYING). */
static inline bool gdr_region_handed(const struct gdr_region *r)
{
	uint32_t m = __atomic_load_n(&r->magic, __ATOMIC_RELAXED);

	return m == GDR_REGION_LIVE || m == GDR_REGION_DYING;
}

struct gdr_entry { /* 128 bytes, from the cache's chunks (entry.c; a hit reads no line of it
		      but pin.be where the backend may revoke) */
	struct gdr_region *regions;   /* its records, linked through their slots (under the lock) */
	struct gdr_pin pin;           /* what it pins: [pin.base, pin.base + pin.len) */
	union {                       /* its tags (gdr_entry_tags): sorted by start, non-overlapping
					 (under the lock only) */
		struct gdr_tag tag0;  /* while it has one (or none) */
		struct gdr_tag *tagv; /* from its second on: an array whose capacity is ntags
					 rounded up to a power of two */
	} t;
	struct gdr_entry *prev, *next; /* LRU (indexed entries) or the detached list */
	struct gdr_entry *defer;       /* retired, freed after the next grace period */
	uint32_t ntags;
	uint16_t nexact; /* exact records (remote-access MRs of one range each), at most
			    GDR_EXACT_PER_ENTRY */
	uint8_t state;   /* GDR_LIVE in the index; DYING being retired; DETACHED held, out */
	uint8_t used;    /* taken under the lock since the evictor last looked (CLOCK second
			    chance; a lock-free hit marks its record's instead) */
};
_Static_assert(sizeof(struct gdr_entry) == 128, "an entry is 128 bytes: 32 to a chunk (entry.c)");

/* e's tags, e->ntags of them (changed only by gdr_entry_add_tags). */
static inline const struct gdr_tag *gdr_entry_tags(const struct gdr_entry *e)
{
	return e->ntags > 1 ? e->t.tagv : &e->t.tag0;
}
_Static_assert(GDR_EXACT_MAX < UINT16_MAX, "nexact fits its field");

/* A retired record is reused only after this many others were retired after it. */
#define GDR_REUSE_DELAY 1024
/* The records' array is made usable this many bytes at a time (a multiple of every page size). */
#define GDR_REC_MAP_STEP (64u * 1024)
_Static_assert(GDR_SLOT_MAX + 2 <= 1u << GDR_HIX_SLOT_BITS, "a slot number fits a hash slot");
struct gdr_cache {
	/* Read by every hit: written only by writers, rarely. */
	struct gdr_hix *hix __attribute__((aligned(64))); /* the index's hash, published with
							     release (index.c) */
	uint64_t ev_next;        /* next free event to apply (events mode) */
	uint64_t gen;            /* bumped before a record is retired (memo) */
	bool may_revoke;         /* a backend in use revokes (its ops table says so) */
	bool events;             /* validator->events: hits need no check of their own */
	int over_limit;          /* limits exceeded (by held entries): __atomic */
	uint64_t id;             /* unique in the process (thread.c) */
	struct gdr_thr *threads; /* pushed lock-free, freed at destroy */
	const struct gdr_validator_ops *validator;
	struct gdr_be *backend;      /* the cache's backend; the one for a device that it
					serves (gdr_cache_backend reports it) */
	struct gdr_region *rec_base; /* the records' arena: record n (slot n) is rec_base[n] */

	pthread_mutex_t lock __attribute__((aligned(64)));
	struct gdr_config cfg;
	struct gdr_sys sys; /* the NIC and gdrcache.ko: real, or a test's (seams.h) */
	int (*events_probe)(const char **why); /* proves the interception (seams.h) */
	bool cuda_ok;
	struct gdr_index index;
	struct gdr_entry *lru;               /* utlist DL: head = least recently used */
	struct gdr_entry *detached;          /* utlist DL: held entries out of the index */
	struct gdr_entry *deferred;          /* retired entries waiting for a grace period */
	uint32_t ndeferred;                  /* entries and records waiting for a grace period */
	uint64_t nsyncs;                     /* grace periods run (statistics) */
	struct gdr_region *deferred_regions; /* records retired from live entries, likewise */
	struct gdr_entry *dying;             /* utlist DL: out of the index, holds not yet final */
	bool dying_unsynced;      /* one of them was marked dying since the last grace period */
	struct gdr_entry *taking; /* being handed out under the lock: not to be evicted */
	uint32_t slot_next;       /* records made: rec_base[1 .. slot_next); read without the
				     lock (gdr_rec_cache_checked) */
	size_t rec_mapped;        /* bytes of the records' array made usable */
	struct gdr_region *reuse_head, *reuse_tail; /* retired records, oldest first (FIFO) */
	uint32_t reuse_len;
	struct gdr_idset synced;              /* allocations given SYNC_MEMOPS (miss.c) */
	struct gdr_entry_chunk *entry_chunks; /* where entries come from (entry.c) */
	struct gdr_entry *entry_free;         /* entries given back, linked by defer */
	uint32_t entry_chunk_n;               /* chunks allocated */
	struct gdr_cache_stats st;
	struct gdr_cache_settings set; /* resolved at create, then immutable (get_settings) */
	uint64_t nhost;                /* host registrations held (passed through, not cached) */
	uint64_t reg_waits;            /* registrations that waited for a free in flight (atomic) */
	uint64_t exact_mrs;            /* MRs made for one remote-access range (exact records) */
	/* The backend of each CUDA device, chosen at its first pin (NULL: not yet); dev_refused:
	 * no backend serves it. Under the lock. */
	struct gdr_be *dev_be[GDR_MAX_DEVICES];
	bool dev_refused[GDR_MAX_DEVICES];
	struct gdr_be *extra_be[GDR_MAX_DEVICES]; /* opened for a device the first did not serve */
	uint32_t nextra_be;
	uint64_t exact_replaced; /* entries replaced for holding GDR_EXACT_PER_ENTRY of them */
	uint64_t tag_reach;   /* how far indexed entries' tags reach beyond their pins (apply.c) */
	uint32_t tag_reach_n; /* indexed entries that reach that far (at least: a recount at 0) */
	uint64_t events_examined;     /* entries looked at by events (white-box tests) */
	struct gdr_cache *next_live;  /* the process's live caches, for GDRCACHE_STATS at exit */
	int stats_pid;                /* the process that made it (its records in a fork child) */
	struct gdr_cache *next_alive; /* every live cache (thread.c) */
	/* Holds given back under the lock by a thread that held none of the record itself, by
	 * slot (thread.c), a chunk allocated with the first thread's counters of it. */
	int64_t *released[GDR_SLOT_CHUNKS];
};

/* r's cache if r is a record a live cache made, else NULL; nothing at r is read before its arena
 * is found to be a live cache's and its slot one that cache made (the arena's unmade slots are
 * PROT_NONE, and the memory around a pointer gdr_reg never returned may be unmapped: issue 31 #3).
 * A few loads, usually the table's first probe: the hit path and every accessor ask. */
static inline struct gdr_cache *gdr_rec_cache_checked(const struct gdr_region *r)
{
	uintptr_t a = gdr_rec_arena(r), v;
	uint32_t i = (uint32_t)(a / GDR_REC_ARENA) % GDR_ARENAS, slot = gdr_rec_slot(r);

	for (uint32_t n = 0; n < GDR_ARENAS; n++, i = (i + 1) % GDR_ARENAS) {
		v = __atomic_load_n(&gdr_arenas[i], __ATOMIC_ACQUIRE);
		if (v == a) {
			struct gdr_cache *c = gdr_rec_cache(r);

			return slot && slot < __atomic_load_n(&c->slot_next, __ATOMIC_ACQUIRE)
				       ? c
				       : NULL;
		}
		if (!v)
			break;
	}
	return NULL;
}

/* thread.h's gdr_thr_find: this thread's record for c, or NULL (no record yet). */
static inline struct gdr_thr *gdr_thr_find(struct gdr_cache *c)
{
	struct gdr_thr_tls *s = &gdr_thr_tls[c->id % GDR_THR_TLS_SLOTS];

	if (__builtin_expect(s->id == c->id, 1))
		return s->t;
	return gdr_thr_find_slow(c);
}

/* ---- between the cache's files ---------------------------------------------------------------- */
/* The lock. gdr_cache_unlock (record.c) ends every locked operation: it settles what was dropped,
 * reclaims, and applies the free events a hook left to this lock's holder; _plain only unlocks.
 * No cancellation point acts while a thread holds a cache lock: a log line's write, a dma-buf's
 * close, libibverbs' command write are ones, and a thread cancelled there (pthread_cancel of a
 * thread in gdr_reg, or in a cuMemFree whose hook releases pins) would leave the lock held and
 * every other thread waiting for it for ever. A pending cancellation acts at the caller's next
 * cancellation point. The count goes up before the wait: a signal handler on this thread (stats.c,
 * exit() from one) then knows the lock may be its own. */
static inline void gdr_cache_lock(struct gdr_cache *c)
{
	if (!gdr_locks_held++) {
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &gdr_cache_cancel_state);
		gdr_ident_cache = c->id; /* log lines made under it say cache=N (common/ident.h) */
	}
	pthread_mutex_lock(&c->lock);
}

static inline void gdr_cache_unlock_plain(struct gdr_cache *c)
{
	pthread_mutex_unlock(&c->lock);
	if (!--gdr_locks_held) {
		gdr_ident_cache = 0;
		pthread_setcancelstate(gdr_cache_cancel_state, NULL);
	}
}

void gdr_cache_unlock(struct gdr_cache *c);
/* Set while this thread applies events for the hooks (no recursion from gdr_cache_unlock). */
extern __thread int gdr_cache_applying __attribute__((tls_model("initial-exec")));

/* record.c: registration records and grace periods. */
int gdr_records_init(struct gdr_cache *c); /* 0 or -ENOMEM */
void gdr_records_fini(struct gdr_cache *c);
int gdr_region_new(struct gdr_cache *c, struct gdr_entry *e, struct ibv_pd *pd, int access,
		   uint8_t kind, const struct gdr_tag *t, struct gdr_region **out);
void gdr_region_link(struct gdr_cache *c, struct gdr_entry *e, struct gdr_region *r);
void gdr_region_unlink(struct gdr_cache *c, struct gdr_entry *e, struct gdr_region *r);
void gdr_record_range(const struct gdr_entry *e, const struct gdr_tag *t, uint64_t *start,
		      uint64_t *size);
void gdr_record_retire(struct gdr_cache *c, struct gdr_region *r);
void gdr_record_free(struct gdr_cache *c, struct gdr_region *r);
int64_t gdr_region_holds(struct gdr_cache *c, const struct gdr_region *r);
void gdr_cache_sync(struct gdr_cache *c);
void gdr_reclaim(struct gdr_cache *c, bool force);

/* entry.c: entries, eviction, holds. Entries come from chunks of GDR_ENTRY_CHUNK_N entries (and a
 * link: GDR_ENTRY_CHUNK bytes) kept by the cache until it is destroyed, given back to it (never to
 * malloc) once freed: an entry then costs its size and a 32nd of a link and a malloc header, not a
 * malloc chunk's (8 bytes of header, 16-byte granules). Under the lock. */
#define GDR_ENTRY_CHUNK_N 32u
#define GDR_ENTRY_CHUNK (sizeof(void *) + GDR_ENTRY_CHUNK_N * sizeof(struct gdr_entry))
struct gdr_entry *gdr_entry_alloc(struct gdr_cache *c);        /* zeroed; NULL: out of memory */
void gdr_entry_free(struct gdr_cache *c, struct gdr_entry *e); /* its tags array too */
void gdr_entries_fini(struct gdr_cache *c);
void gdr_entry_set_state(struct gdr_entry *e, uint8_t state);
void gdr_entry_drop(struct gdr_cache *c, struct gdr_entry *e);
void gdr_entry_stale(struct gdr_cache *c, struct gdr_entry *e);
void gdr_settle(struct gdr_cache *c);
void gdr_reap_detached(struct gdr_cache *c);
void gdr_quiesce_mark(struct gdr_entry *e, struct gdr_entry **cand);
int gdr_evict(struct gdr_cache *c, uint64_t need);
/* create.c: the limits the settings left DEFAULT, from the devices (apart for the tests). */
struct gdr_cuda_devices;
void gdr_derive_limits(struct gdr_config *cfg, struct gdr_cache_settings *set,
		       const struct gdr_cuda_devices *dev);
int gdr_drop_unheld(struct gdr_cache *c);
int gdr_entry_check(struct gdr_cache *c, struct gdr_entry *e, uint64_t a, uint64_t len, bool all);
int gdr_entry_add_tags(struct gdr_entry *e, const struct gdr_tag *t, uint32_t n);
bool gdr_entry_exact_full(struct gdr_cache *c, const struct gdr_entry *e, const struct ibv_pd *pd,
			  int access, uint64_t a, uint64_t len, bool exact);
int gdr_entry_take(struct gdr_cache *c, struct gdr_thr *t, struct gdr_entry *e, struct ibv_pd *pd,
		   int access, uint64_t a, uint64_t len, bool exact, struct gdr_region **out);
/* What a hit and the locked path share. */
/* The kernel saw the memory freed: stale, proven without asking the CUDA driver. Lock-free. */
static inline bool gdr_entry_revoked(struct gdr_cache *c, const struct gdr_entry *e)
{
	return c->may_revoke && e->pin.be->ops->revokes &&
	       e->pin.be->ops->revoked(e->pin.be, &e->pin);
}

/* Whether record q serves (pd, access, [a, a+len)): an exact record only an exact request of that
 * very range, a shared one any range inside its allocation unless the request needs an exact MR.
 * Branches: a hit asks it of a record that nearly always serves (the one its hash slot names, or
 * its memo once the address is known to lie in the memo's range), so they are predicted, and
 * cost fewer instructions than a test without them. */
static inline bool gdr_record_serves(const struct gdr_region *q, const struct ibv_pd *pd,
				     int access, uint64_t a, uint64_t len, bool exact)
{
	if (q->pd != pd || q->access != access)
		return false;
	if (q->exact) /* never for a wide request: its rkey must reach the whole pin */
		return exact && q->start == a && q->size == len;
	/* a in the range, and 1 <= len <= what is left of it from a: never a zero length or a range
	 * that wraps (the hit path leaves those to the general path's checks) */
	return !exact && a - q->start < q->size && len - 1 < q->start + q->size - a;
}

/* miss.c: the locked path of gdr_reg. -EINPROGRESS: a free of the memory is in flight (the caller
 * waits for it and calls again). */
int gdr_reg_locked(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		   uint64_t len, int access, bool exact, struct gdr_region **out);
/* Forget that an allocation has SYNC_MEMOPS (it was found stale); free the whole set. */
void gdr_synced_forget(struct gdr_cache *c, uint64_t id);
void gdr_synced_free(struct gdr_cache *c);

/* apply.c: free events. Apply every event published so far (under the lock). */
void gdr_cache_drain_events(struct gdr_cache *c);
/* How far e's tags reach beyond its pin. An indexed entry's tags are what they will be (made:
 * before = GDR_REACH_NEW, or grown from reaching before): how far they reach widens the window an
 * event looks through (c->tag_reach); an entry out of the index narrows it again once no other
 * reaches as far (a recount of the index). Under the lock. */
#define GDR_REACH_NEW UINT64_MAX
uint64_t gdr_entry_reach(const struct gdr_entry *e);
void gdr_cache_track_reach(struct gdr_cache *c, const struct gdr_entry *e, uint64_t before);
void gdr_cache_untrack_reach(struct gdr_cache *c, const struct gdr_entry *e);
/* Whether a free in flight may concern a registration that classified [a, a+len) as tags. */
bool gdr_cache_free_inflight(uint64_t a, uint64_t len, const struct gdr_tag *tags, uint32_t ntags);
/* The same, for the frees a snapshot (gdr_events_inflight_snap) found in flight. */
struct gdr_inflight_snap;
bool gdr_cache_free_was_inflight(const struct gdr_inflight_snap *s, uint64_t a, uint64_t len,
				 const struct gdr_tag *tags, uint32_t ntags);

/* Holds on e summed over threads (final only for an entry that is not LIVE). Under c->lock. */
int64_t gdr_entry_holds(struct gdr_cache *c, const struct gdr_entry *e);

/* A definition bound to one symbol version of lib/libgdrcache.map (rdma-core's habit): "NAME@@V"
 * is the one programs link now, "NAME@V" an older one kept for the programs built against it
 * (compat-0_1.c). The C name of such a definition is NAME_x_y, never NAME. */
#define GDR_SYMVER(v) GDR_EXPORT __attribute__((symver(v)))

/* struct gdr_cache_stats as 0.1 knew it (hits to fast_hits): what gdr_cache_get_stats writes, and
 * the least gdr_cache_get_stats_ex accepts. The struct grows only past it. */
#define GDR_STATS_SIZE_0_1 (offsetof(struct gdr_cache_stats, fast_hits) + sizeof(uint64_t))
/* struct gdr_cache_settings as 0.2 made it: the least gdr_cache_get_settings accepts. */
#define GDR_SETTINGS_SIZE_0_2                                                                      \
	(offsetof(struct gdr_cache_settings, limits_why) +                                         \
	 sizeof(((struct gdr_cache_settings *)0)->limits_why))

/* create.c. Whether gdr_cache_create would accept attr (the environment, then attr), logged as it
 * would; creates nothing (compat-0_1.c: 0.1's log level is set only for accepted attributes). */
int gdr_cache_attr_check(const struct gdr_cache_attr *attr);
/* The statistics into s (under the lock), sizeof(*s) bytes. Returns 0 or -EINVAL. */
int gdr_cache_stats_get(struct gdr_cache *c, struct gdr_cache_stats *s);

/* stats.c */
void gdr_stats_print(struct gdr_cache *c, const char *why);
/* The statistics, per-thread counters summed. Under c->lock. */
void gdr_stats_collect(struct gdr_cache *c, struct gdr_cache_stats *s);
void gdr_stats_track(struct gdr_cache *c);
/* Around fork() (thread.c's handlers): the list of caches the statistics print, locked. */
void gdr_stats_fork_prepare(void);
void gdr_stats_fork_done(void);
void gdr_stats_untrack(struct gdr_cache *c);
void gdr_stats_pinned(struct gdr_cache *c, int64_t delta);

#endif /* GDR_CACHE_CACHE_H */
