/* SPDX-License-Identifier: MIT */
/* Internal interfaces between the library's concerns (never installed). */
#ifndef GDRCACHE_INT_H
#define GDRCACHE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "gdrcache.h"

#define GDR_EXPORT __attribute__((visibility("default")))
#define GDR_GPU_PAGE (64ULL * 1024)
#define GDR_ALIGN_DOWN(x) ((x) & ~(GDR_GPU_PAGE - 1))
#define GDR_ALIGN_UP(x) (((x) + GDR_GPU_PAGE - 1) & ~(GDR_GPU_PAGE - 1))
/* ibv_access_flags that let a remote peer reach the memory: REMOTE_WRITE, _READ, _ATOMIC, MW_BIND
 * (a window can be bound anywhere in its MR). Such registrations get an MR of exactly their range. */
#define GDR_IBV_ACCESS_REMOTE (0x2 | 0x4 | 0x8 | 0x10)
/* Exact (remote-access) records an entry keeps before it is replaced. */
#define GDR_EXACT_PER_ENTRY 32
/* Most CUDA allocations one registration may span (a request over several cuMemMap'ed chunks). */
#define GDR_MAX_TAGS 64
#define GDR_MAX_DEVICES 64       /* CUDA devices a cache tells apart */

/* ---- log.c ---------------------------------------------------------------------------------- */
extern int gdr_log_level;  /* process-wide; read and written with __atomic */
/* Per call site: the first GDR_LOG_BURST lines, then one per GDR_LOG_INTERVAL_S seconds (log.c). */
#define GDR_LOG_BURST 10
#define GDR_LOG_INTERVAL_S 5
void gdr_log_write(int level, const char *func, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
#define gdr_log(level, ...)                                                    \
	do {                                                                   \
		if ((level) <= __atomic_load_n(&gdr_log_level, __ATOMIC_RELAXED)) \
			gdr_log_write((level), __func__, __LINE__, __VA_ARGS__); \
	} while (0)
#define gdr_err(...) gdr_log(GDR_LOG_ERROR, __VA_ARGS__)
#define gdr_warn(...) gdr_log(GDR_LOG_WARN, __VA_ARGS__)
#define gdr_info(...) gdr_log(GDR_LOG_INFO, __VA_ARGS__)
#define gdr_dbg(...) gdr_log(GDR_LOG_DEBUG, __VA_ARGS__)
/* Log once per process (per call site). */
#define gdr_log_once(level, ...)                                                     \
	do {                                                                         \
		static int logged_;                                                  \
		if (!__atomic_exchange_n(&logged_, 1, __ATOMIC_RELAXED))             \
			gdr_log(level, __VA_ARGS__);                                 \
	} while (0)

/* ---- config.c ------------------------------------------------------------------------------- */
struct gdr_config {
	uint64_t max_bytes;
	uint64_t max_entries;
	uint64_t max_pin_bytes;
	int backend;
	int validate;
	int log_level;
	bool stats;
	char kmod_dev[256];
	char libcuda[256];
	const char *bad;           /* the first malformed variable's name: caches are refused */
};
/* The environment, parsed once. A malformed value is logged (naming the variable and the form it
 * must take) and recorded in ->bad: gdr_cache_create then fails with -EINVAL. Unknown GDRCACHE_*
 * names are warned about once. */
const struct gdr_config *gdr_config_get(void);
/* fn for every variable of the table: its name, the form it takes, its effective value and its
 * default as text, and whether the environment sets it (gdrcache_info). */
void gdr_config_each(void (*fn)(const char *name, const char *form, const char *value,
				const char *dflt, bool set, void *arg), void *arg);
/* Parse a size with optional K/M/G/T suffix. Returns 0 or -EINVAL. */
int gdr_parse_size(const char *s, uint64_t *out);

/* ---- cuda.c: the CUDA driver, loaded at run time ---------------------------------------------- */
struct gdr_ptr_info {
	int mem_type;          /* CUmemorytype, 0 when CUDA does not know the pointer */
	bool managed;
	int device;            /* ordinal */
	uint64_t buffer_id;
	uint64_t start, size;  /* the allocation (or VMM mapping) holding the pointer */
	uint64_t alloc_start, alloc_size; /* RANGE_*: the whole allocation (a VMM reservation) */
	uint64_t map_start, map_size; /* MAPPING_*: the physical chunk holding it (0: unknown) */
	bool pool;             /* stream-ordered pool memory (MEMPOOL_HANDLE set) */
};
/* Load libcuda (once per process). 0, or -ENODEV (no driver, no entry point, cuInit failed). */
int gdr_cuda_load(void);
/* One cuPointerGetAttributes query. 0 (mem_type 0 = unknown to CUDA), -ENODEV, -EIO. */
int gdr_cuda_classify(uint64_t addr, struct gdr_ptr_info *info);
/* MAPPING_BASE_ADDR / MAPPING_SIZE of addr: the physical chunk holding it. 0, -EIO, -ENODEV. */
int gdr_cuda_mapping(uint64_t addr, uint64_t *base, uint64_t *size);
/* cuPointerGetAttribute(BUFFER_ID). 0, -ESTALE (CUDA no longer knows the address), -EIO. */
int gdr_cuda_buffer_id(uint64_t addr, uint64_t *id);
/* SYNC_MEMOPS on the allocation. 0, -EOPNOTSUPP (NOT_SUPPORTED: VMM memory), -EIO. */
int gdr_cuda_set_sync_memops(uint64_t addr);
/* CU_CTX_SYNC_MEMOPS on the current context (the device's primary context on a thread with none),
 * once per context. 1 (set now), 0 (set before), -EOPNOTSUPP (driver without cuCtxSetFlags),
 * -ENXIO (no context to be had), -EIO. */
int gdr_cuda_ctx_sync_memops(int device);
/* cuMemGetHandleForAddressRange(DMA_BUF_FD), in the device's primary context when the calling
 * thread has none. 0 and *fd, or -errno. */
int gdr_cuda_dmabuf_export(uint64_t base, uint64_t len, int device, int *fd);
/* cuDeviceGetAttribute. 0 or -errno. */
int gdr_cuda_device_attr(int device, int attr, int *value);
/* CUDA devices (cuDeviceGetCount); 0 without a driver. */
int gdr_cuda_device_count(void);

/* ---- verbs.c: NIC memory regions, through a table tests can replace --------------------------- */
struct gdr_verbs_ops {
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
					int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
};
extern const struct gdr_verbs_ops *gdr_verbs;
extern const struct gdr_verbs_ops gdr_verbs_libibverbs;
/* Wrappers returning 0 / -errno. */
int gdr_verbs_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access,
		  struct ibv_mr **mr);
int gdr_verbs_reg_dmabuf(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
			 int access, struct ibv_mr **mr);
int gdr_verbs_dereg(struct ibv_mr *mr);
void gdr_mr_keys(const struct ibv_mr *mr, uint32_t *lkey, uint32_t *rkey);
void gdr_mr_range(const struct ibv_mr *mr, uint64_t *base, uint64_t *len);

/* ---- backends ------------------------------------------------------------------------------ */
/* One pinned range, as a backend made it. */
struct gdr_be;
struct gdr_pin {
	uint64_t base, len;          /* 64 KiB-aligned */
	int device;                  /* CUDA ordinal of the memory */
	struct gdr_be *be;           /* the backend that pinned it (its device's) */
	bool has_kmod;
	uint64_t kmod_handle;
	uint32_t page_size, page_count;
	bool has_dmabuf;
	int dmabuf_fd;
	uint64_t dmabuf_offset;
};

struct gdr_be;
struct gdr_backend_ops {
	const char *name;
	enum gdr_backend id;
	/* Open the backend; 0, or -ENODEV with *why saying what is missing. */
	int (*open)(const struct gdr_config *cfg, struct gdr_be **b, const char **why);
	void (*close)(struct gdr_be *b);
	/* Pin pin->base/len. 0 or -errno (-ENOMEM / -ENOSPC: out of pinnable space, worth evicting). */
	int (*pin)(struct gdr_be *b, struct gdr_pin *pin);
	void (*unpin)(struct gdr_be *b, struct gdr_pin *pin);
	/* Register [base, base+len) of the pinned range with a NIC (the whole pin, or exactly what a
	 * remote-access registration asked). 0 or -errno. */
	int (*reg_mr)(struct gdr_be *b, const struct gdr_pin *pin, struct ibv_pd *pd, int access,
		      uint64_t base, uint64_t len, struct ibv_mr **mr);
	/* Physical page addresses (kmod); the count, or -errno (-ENOENT when the backend has none). */
	int (*pages)(struct gdr_be *b, const struct gdr_pin *pin, uint64_t *pages, uint32_t max);
	/* Whether the kernel has revoked the pin (its memory was freed): a load from memory the
	 * kernel shares, no system call; safe without the cache lock. */
	bool (*revoked)(struct gdr_be *b, const struct gdr_pin *pin);
	/* Whether the backend can pin memory of CUDA device `device` (NULL: every device). 1, or 0
	 * with *why. */
	int (*serves)(struct gdr_be *b, int device, const char **why);
	/* Whether this backend works without a PD (a pin exists before any MR). */
	bool pins_without_pd;
	/* Stream-ordered pool memory is pinned as the whole physical chunks of the pool that hold
	 * the range (the driver exports a dma-buf of pool memory only so: docs/FACTS); else as the
	 * 64 KiB-aligned range, like other memory. */
	bool pool_by_chunk;
};
/* Every backend embeds this first. */
struct gdr_be {
	const struct gdr_backend_ops *ops;
};

extern const struct gdr_backend_ops gdr_backend_kmod_ops;
extern const struct gdr_backend_ops gdr_backend_dmabuf_ops;
extern const struct gdr_backend_ops gdr_backend_peermem_ops;
/* backend.c: choose and open (cfg->backend, AUTO resolved with the reason logged). */
int gdr_backend_select(const struct gdr_config *cfg, struct gdr_be **b);
/* For mode AUTO: open the first backend after `primary` in the automatic order that serves CUDA
 * device `device` (a GPU without dma-buf support next to one with). 0, or -EOPNOTSUPP (logged). */
int gdr_backend_for_device(const struct gdr_config *cfg, const struct gdr_be *primary, int device,
			   struct gdr_be **b);
/* Shared default for backends without a page list. */
int gdr_backend_no_pages(struct gdr_be *b, const struct gdr_pin *pin, uint64_t *pages,
			 uint32_t max);
/* For backends with no state of their own: a bare struct gdr_be, and its release. */
int gdr_backend_alloc(const struct gdr_backend_ops *ops, struct gdr_be **out, const char **why);
void gdr_backend_free(struct gdr_be *b);
/* Shared default for backends the kernel never revokes from. */
bool gdr_backend_never_revoked(struct gdr_be *b, const struct gdr_pin *pin);
/* kmod's system calls, replaceable by unit tests (tests/unit/fake_kmod.c). */
struct gdr_kmod_sys {
	int (*open)(const char *path, int flags);
	int (*close)(int fd);
	int (*ioctl)(int fd, unsigned long req, void *arg);
	void *(*mmap)(size_t len, int fd);
	int (*munmap)(void *addr, size_t len);
};
extern const struct gdr_kmod_sys *gdr_kmod_sys;

/* ---- validate.c: is a cached allocation still the one that was pinned? ----------------------- */
struct gdr_tag {
	uint64_t start, size;  /* the CUDA allocation (or VMM mapping, or the physical chunk of a
				  stream-ordered pool allocation that holds the address asked for) */
	uint64_t alloc_start, alloc_size; /* the whole allocation as RANGE_* reports it */
	uint64_t buffer_id;
	uint8_t kind;          /* enum gdr_mem_kind */
	int device;            /* CUDA ordinal */
};
struct gdr_cache;
struct gdr_validator_ops {
	const char *name;
	/* 0 = still valid, -ESTALE = freed or replaced, other -errno = could not tell (treated stale).
	 * Called with or without c->lock held: it must not touch the cache's state. */
	int (*check)(struct gdr_cache *c, const struct gdr_tag *tag);
};
extern const struct gdr_validator_ops gdr_validate_tag_ops;
extern const struct gdr_validator_ops gdr_validate_events_ops;
const struct gdr_validator_ops *gdr_validator_for(int mode);

/* ---- cache.c ----------------------------------------------------------------------------------- */
struct gdr_entry;
#define GDR_REGION_LIVE 0x6c697665u  /* "live" */
#define GDR_REGION_DEAD 0x64656164u  /* "dead" */
/* State of an entry or a record, read by the lock-free hit path (__atomic). */
enum { GDR_LIVE = 0, GDR_DYING = 1, GDR_DETACHED = 2 };

/* A registration record: what gdr_reg hands out, shared by every registration of one allocation
 * of an entry for one (pd, access). Immutable while published, but for state, estate and used.
 * Held through the per-thread counters at `slot` (thread.c) plus `released`. Records are never
 * given back to malloc while their cache lives: a retired record is marked DEAD and reused, with
 * its slot, only after GDR_REUSE_DELAY others were retired after it (cache.c), so a late gdr_dereg
 * of a released region reads a record, never freed memory. The first 64 bytes are what a hit and a release read (one
 * cache line: records are 64-byte aligned); the rest is read under the lock. */
struct gdr_region {
	uint32_t magic;            /* GDR_REGION_LIVE while handed out, GDR_REGION_DEAD once retired */
	uint32_t state;            /* GDR_LIVE, or GDR_DYING while being retired */
	struct gdr_cache *cache;   /* the record's cache, for its whole life */
	struct gdr_entry *entry;   /* NULL: host memory passed through */
	struct ibv_pd *pd;
	uint64_t start, size;      /* the allocation it serves, within its entry's range (requests
				      inside it hit lock-free); for an exact record, exactly the range
				      registered */
	int access;
	uint32_t slot;             /* hold counters; also the record's number in its cache */
	uint8_t exact;             /* owns an MR of exactly [start, start+size) (remote access) */
	uint8_t kind;
	uint8_t estate;            /* its entry's state, mirrored here (cache.c: entry_set_state) so
				      that a hit reads no line of the entry */
	uint8_t used;              /* taken lock-free since the evictor last looked at its entry */
	/* ---- second line ---- */
	struct gdr_region *next __attribute__((aligned(64))); /* in the entry's list (published with
								release: lookups walk it) */
	struct gdr_region *defer;  /* retired: waiting for a grace period, then in the reuse queue */
	struct ibv_mr *mr;
	uint64_t buffer_id;        /* of that allocation */
	int64_t released;          /* holds given back under the lock (by a thread with no hold of
				      its own on it); read and written under the lock only */
	uint32_t refs;             /* host records only: 1 while held */
};

/* One NIC memory region of an entry, per (pd, access), shared by its region records. */
struct gdr_mrec {
	struct ibv_pd *pd;
	int access;
	struct ibv_mr *mr;
	struct gdr_mrec *next;
};

struct gdr_entry {
	/* What a hit reads, in the first line (entries are 64-byte aligned). */
	uint64_t base, len;        /* == pin.base/len */
	struct gdr_region *regions;
	uint32_t state;            /* GDR_LIVE in the index; DYING being retired; DETACHED held, out */
	uint32_t used;             /* taken under the lock since the evictor last looked (CLOCK
				      second chance; a lock-free hit marks its record's instead) */
	struct gdr_pin pin;        /* pin.be: read by a hit where the backend may revoke */
	uint32_t ntags, tags_cap;
	uint32_t nexact;           /* exact records (remote-access MRs of one range each) */
	struct gdr_tag *tags;      /* sorted by start, non-overlapping (under the lock only); the
				      first one in tag0 while there is only one */
	struct gdr_tag tag0;
	struct gdr_mrec *mrecs;
	struct gdr_entry *prev, *next; /* LRU (indexed entries) or the detached list */
	struct gdr_entry *defer;   /* retired, freed after the next grace period */
};

/* index.c: the non-overlapping cached entries, sorted by base (under the lock), and a hash of the
 * registration records of those entries, which the lock-free hit path searches in O(1), changed in
 * place under the lock.
 *
 * The hash: a record [start, start+size) is put in level k (granule 2^(12+3k): 4 KiB, 32 KiB,
 * 256 KiB, 2 MiB, ... 512 GiB), the smallest whose granule is at least half its size, once for
 * every granule it touches (one to three). A slot holds the key (granule, level) and a word: the
 * record's address and the part of the granule it covers, in 512ths (so that a lookup reads only a
 * record that may hold the address, where several records share a granule). A lookup of an
 * address probes, for each level that holds records (most populated first), its key: open
 * addressing, linear probing, 16-byte slots, at most half full. A slot's word is written before
 * its key (release) and never changes while the key is there; removal writes a tombstone key. A
 * reader trusts a record only after checking that it serves the request (its range lies in its
 * entry's), then checks its state: a torn or stale view can only make it miss, and a miss takes
 * the locked path. A record leaves the hash before it is retired, and records are reused only
 * after a grace period (cache.c). Growing or compacting makes a new table; the old one is freed
 * after a grace period. */
#define GDR_HIX_LEVELS 10
#define GDR_HIX_EMPTY 0ULL
#define GDR_HIX_TOMB 1ULL
#define GDR_HIX_PTR_BITS 46        /* record address >> 6 (records are 64-byte aligned) */
struct gdr_hslot {
	uint64_t key;
	uint64_t word;             /* record >> 6 | first 512th << 46 | last 512th << 55 */
};
struct gdr_hix {
	uint64_t order;            /* the levels holding records, most populated first: 4 bits
				      each from bit 0, their number in bits 60..63 (__atomic) */
	uint32_t bits;             /* 1 << bits slots */
	uint32_t used, dead;       /* live keys, tombstones (under the lock) */
	struct gdr_hix *defer;     /* retired: freed after a grace period */
	struct gdr_hslot v[] __attribute__((aligned(64))); /* four to a cache line */
};
struct gdr_index {
	struct gdr_entry **v;
	size_t n, cap;
	struct gdr_hix *hix;       /* never NULL once initialised */
	struct gdr_hix **pub;      /* where lookups read it: stored with release at every change */
	struct gdr_hix *retired;   /* old tables a lookup may still read */
	uint32_t nretired;
	uint32_t lev_n[GDR_HIX_LEVELS]; /* records per level */
};
static inline unsigned gdr_hix_shift(unsigned k)
{
	return 12 + 3 * k;
}
static inline unsigned gdr_hix_level(uint64_t size)
{
	unsigned k = 0;

	while (k < GDR_HIX_LEVELS - 1 && size > (2ULL << gdr_hix_shift(k)))
		k++;
	return k;
}
static inline uint64_t gdr_hix_key(uint64_t addr, unsigned k)
{
	return ((addr >> gdr_hix_shift(k)) << 4 | k) + 2;
}
static inline uint64_t gdr_hix_pos(uint64_t key, uint32_t bits)
{
	return (key * 0x9e3779b97f4a7c15ULL) >> (64 - bits);
}
/* Which 512th of its level-k granule addr lies in. */
static inline uint64_t gdr_hix_part(uint64_t addr, unsigned k)
{
	return (addr >> (gdr_hix_shift(k) - 9)) & 511;
}
/* The entry whose range holds addr, or NULL. Under the lock. */
struct gdr_entry *gdr_index_find(const struct gdr_index *ix, uint64_t addr);
/* Position of the first entry that ends after addr. */
size_t gdr_index_lower(const struct gdr_index *ix, uint64_t addr);
int gdr_index_init(struct gdr_index *ix, struct gdr_hix **pub);
int gdr_index_insert(struct gdr_index *ix, struct gdr_entry *e);
/* Take e out, and its records out of the hash. */
void gdr_index_remove(struct gdr_index *ix, struct gdr_entry *e);
/* A record of an indexed entry into the hash (out of memory: it is left out, and found by the
 * locked path only), and out of it. */
void gdr_index_add_record(struct gdr_index *ix, struct gdr_region *r);
void gdr_index_del_record(struct gdr_index *ix, struct gdr_region *r);
/* Free the retired tables: only after a grace period that began after they were retired. */
void gdr_index_reclaim(struct gdr_index *ix);
void gdr_index_free(struct gdr_index *ix);
/* Bytes the index uses now (sorted array and hash). */
size_t gdr_index_bytes(const struct gdr_index *ix);

/* thread.c: per-thread hold counters and read-side epochs (see there). Counters are 64 bits: one
 * moves one way for a thread that only registers (or only releases) a record, and at one step per
 * nanosecond it would take 292 years to wrap. 512 counters (4 KiB) a chunk, allocated as a thread
 * first holds a slot of it; GDR_SLOT_MAX records per cache. */
#define GDR_SLOT_CHUNK 512u
#define GDR_SLOT_CHUNKS 1024u
#define GDR_SLOT_MAX (GDR_SLOT_CHUNK * GDR_SLOT_CHUNKS)
struct gdr_thr {
	uint64_t epoch;            /* odd while looking up without the lock; written by its thread */
	uint64_t fast_hits, tag_checks; /* counted by its thread */
	struct gdr_region *memo;   /* the record of its last lock-free hit, valid while memo_gen is */
	uint64_t memo_gen;         /* the cache's gen then */
	int dead;                  /* its thread exited: the next new thread takes the record over */
	struct gdr_thr *next;
	int64_t *chunk[GDR_SLOT_CHUNKS];
} __attribute__((aligned(64)));
/* This thread's record for c, made on first use (NULL: out of memory). Any number of caches per
 * thread: one record per (thread, cache) for the cache's life, found through a small direct-mapped
 * TLS table and, behind it, a per-thread hash. */
struct gdr_thr *gdr_thr_get(struct gdr_cache *c);
/* The same, but NULL where this thread has no record for c yet (never allocates). */
struct gdr_thr *gdr_thr_find(struct gdr_cache *c);
/* This thread's counter of slot, or NULL if its chunk is not there yet (see _alloc). */
static inline int64_t *gdr_thr_counter(struct gdr_thr *t, uint32_t slot)
{
	int64_t *ch = __atomic_load_n(&t->chunk[slot / GDR_SLOT_CHUNK], __ATOMIC_ACQUIRE);

	return ch ? &ch[slot % GDR_SLOT_CHUNK] : NULL;
}
int64_t *gdr_thr_counter_alloc(struct gdr_thr *t, uint32_t slot);  /* NULL: out of memory */
/* The counters of slot summed over threads (modulo 2^64: exact while the true sum fits). */
int64_t gdr_thr_sum(struct gdr_cache *c, uint32_t slot);
void gdr_thr_zero(struct gdr_cache *c, uint32_t slot);
void gdr_thr_sync(struct gdr_cache *c);             /* a grace period */
void gdr_thr_totals(struct gdr_cache *c, uint64_t *fast_hits, uint64_t *tag_checks);
void gdr_thr_cache_init(struct gdr_cache *c);  /* also decides gdr_thr_asym, once */
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

struct gdr_sync_set;  /* buffer ids given SYNC_MEMOPS (uthash) */

/* A retired record is reused only after this many others were retired after it. */
#define GDR_REUSE_DELAY 1024
#define GDR_REC_CHUNK 64u          /* records allocated together */
struct gdr_cache {
	/* Read by every hit: written only by writers, rarely. */
	struct gdr_hix *hix __attribute__((aligned(64)));  /* the index's hash, published with
							      release (index.c) */
	uint64_t ev_next;                /* next free event to apply (events mode) */
	uint64_t gen;                    /* bumped before a record is retired (memo) */
	bool events;                     /* validation by events: no driver call on a hit */
	bool may_revoke;                 /* the backend has a revocation source (kmod) */
	int over_limit;                  /* limits exceeded (by held entries): __atomic */
	uint64_t id;                     /* unique in the process (thread.c) */
	struct gdr_thr *threads;         /* pushed lock-free, freed at destroy */
	const struct gdr_validator_ops *validator;
	struct gdr_be *backend;          /* the cache's backend; the one for a device that it
					    serves (gdr_cache_backend reports it) */

	pthread_mutex_t lock __attribute__((aligned(64)));
	struct gdr_config cfg;
	bool cuda_ok;
	struct gdr_index index;
	struct gdr_entry *lru;           /* utlist DL: head = least recently used */
	struct gdr_entry *detached;      /* utlist DL: held entries out of the index */
	struct gdr_entry *deferred;      /* retired entries waiting for a grace period */
	uint32_t ndeferred;              /* entries and records waiting for a grace period */
	uint64_t nsyncs;                 /* grace periods run (statistics) */
	struct gdr_region *deferred_regions; /* records retired from live entries, likewise */
	struct gdr_entry *dying;         /* utlist DL: out of the index, holds not yet final */
	bool dying_unsynced;             /* one of them was marked dying since the last grace period */
	struct gdr_entry *taking;        /* being handed out under the lock: not to be evicted */
	struct gdr_region **rec_chunks;  /* every record, GDR_REC_CHUNK a chunk: record n is slot n */
	uint32_t rec_nchunks, slot_next;
	struct gdr_region *reuse_head, *reuse_tail; /* retired records, oldest first (FIFO) */
	uint32_t reuse_len;
	struct gdr_sync_set *synced;
	uint64_t nsynced;
	struct gdr_cache_stats st;
	uint64_t nhost;                  /* host registrations held (passed through, not cached) */
	uint64_t reg_waits;              /* registrations that waited for a free in flight (atomic) */
	uint64_t exact_mrs;              /* MRs made for one remote-access range (exact records) */
	/* The backend of each CUDA device, chosen at its first pin (NULL: not yet); dev_refused:
	 * no backend serves it. Under the lock. */
	struct gdr_be *dev_be[GDR_MAX_DEVICES];
	bool dev_refused[GDR_MAX_DEVICES];
	struct gdr_be *extra_be[GDR_MAX_DEVICES]; /* opened for a device the first did not serve */
	uint32_t nextra_be;
	uint64_t exact_replaced;         /* entries replaced for holding GDR_EXACT_PER_ENTRY of them */
	struct gdr_cache *next_live;     /* the process's live caches, for GDRCACHE_STATS at exit */
	struct gdr_cache *next_alive;    /* every live cache (thread.c) */
};

/* Holds on e summed over threads (final only for an entry that is not LIVE). Under c->lock. */
int64_t gdr_entry_holds(struct gdr_cache *c, const struct gdr_entry *e);

/* Create with an explicit backend (NULL ops: the configured one); what unit tests use. */
int gdr_cache_create_ops(const struct gdr_cache_attr *attr, const struct gdr_backend_ops *ops,
			 struct gdr_cache **cache);

/* stats.c */
void gdr_stats_print(struct gdr_cache *c, const char *why);
/* The statistics, per-thread counters summed. Under c->lock. */
void gdr_stats_collect(struct gdr_cache *c, struct gdr_cache_stats *s);
void gdr_stats_track(struct gdr_cache *c);
void gdr_stats_untrack(struct gdr_cache *c);
void gdr_stats_pinned(struct gdr_cache *c, int64_t delta);

#endif /* GDRCACHE_INT_H */
