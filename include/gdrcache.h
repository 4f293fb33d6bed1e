/* SPDX-License-Identifier: MIT */
/*
 * libgdrcache: a registration cache for GPUDirect RDMA.
 *
 * A cache pins each GPU buffer once (64 KiB-aligned, after CU_POINTER_ATTRIBUTE_SYNC_MEMOPS), keeps
 * it pinned in an LRU bounded by bytes and entries (lazy unpinning), and proves on every reuse that
 * the buffer behind the address is still the one it pinned: by the free events it intercepts from the
 * CUDA driver and gdrcache.ko (mode events: no driver call on a hit), or by a
 * CU_POINTER_ATTRIBUTE_BUFFER_ID query on every hit (mode tag). With an ibv_pd the cache also owns the
 * NIC memory region.
 *
 * Thread safety: every function may be called from any thread on the same or different caches at the
 * same time; a registration may be released from any thread, once. A hit takes no lock and writes no
 * memory that another thread's hit writes. A thread cancelled (pthread_cancel) inside the library,
 * or inside a CUDA free it intercepts, is never cancelled while the library holds a lock or
 * announces the free: the cancellation then acts at the thread's next cancellation point.
 *
 * Free events and a buffer freed while it is being registered: a gdr_reg that meets a free of its
 * own buffer in progress on another thread waits for the free to return, then registers what is at
 * the address then (or refuses freed memory); a registration taken before the free began keeps
 * its pin until its gdr_dereg (with the kmod backend the driver may revoke it), as with any use
 * after free. Every registration made after the free returned is of the new buffer. Unreferenced pins of
 * freed memory are released inside the free, before it returns (gdr_intercept_get_stats).
 *
 * Errors: every function returns 0 (or a count) on success and a negative errno on failure, and
 * leaves errno as it found it: what it calls that may set errno (libc, libibverbs, gdrcache.ko, the
 * CUDA driver) runs with errno saved and restored, but for the CUDA driver's one BUFFER_ID query of
 * a hit in mode tag, which the lock-free hit path makes as it is. Bad input is refused with the
 * error named in its comment and a log line.
 *
 * Growth: structures filled by the library (struct gdr_cache_stats, struct gdr_cache_settings,
 * struct gdr_intercept_stats) may grow at their end in later releases; their functions take the
 * size the caller knows (sizeof as compiled). Programs built against 0.1 keep 0.1's behaviour
 * (symbol versions: lib/libgdrcache.map, lib/cache/compat-0_1.c).
 *
 * Environment (read once, at the first gdr_cache_create; explicit attributes override it; a
 * malformed value makes gdr_cache_create fail with -EINVAL and a log line naming it; sizes take a
 * K, M, G or T suffix). One table, lib/common/config.c's, names, defaults and describes them:
 *   GDRCACHE_LOG_FILE      append log lines to this file instead of stderr; %p is the process id
 *                          (default stderr)
 *   GDRCACHE_LOG           the lowest level logged: none, error, warn, info or debug (or 0-4)
 *                          (default warn)
 *   GDRCACHE_MAX_BYTES     most bytes kept pinned by unreferenced entries (default half of
 *                          min(BAR1, memory) summed over the GPUs, else 4G)
 *   GDRCACHE_MAX_ENTRIES   most cached entries (default one per MiB of GDRCACHE_MAX_BYTES, at least
 *                          4096)
 *   GDRCACHE_MAX_PIN_BYTES allocations up to this size may be pinned whole, larger ones in the
 *                          requested range (default the larger of an eighth of GDRCACHE_MAX_BYTES
 *                          and 256M, at most an eighth of the smallest GPU's min(BAR1, memory),
 *                          else 256M)
 *   GDRCACHE_BACKEND       how ranges are pinned: auto, kmod, dmabuf or peermem (default auto)
 *   GDRCACHE_VALIDATE      how a hit is proven: auto, tag or events (default auto)
 *   GDRCACHE_INTERCEPT     patch libcuda's free entry points: auto; off (no free events, hits
 *                          validated by tag, no out-of-memory relief); yield (off where another
 *                          tool patched one) (default auto)
 *   GDRCACHE_STATS         write the statistics at destroy, at exit and on GDRCACHE_STATS_SIGNAL: 1
 *                          or stderr, or appended to file:PATH (default 0)
 *   GDRCACHE_STATS_FORMAT  how the statistics are written: auto (text on stderr, json in a file),
 *                          text, kv or json (default auto)
 *   GDRCACHE_STATS_SIGNAL  also write the statistics on this signal: none, USR1, USR2, HUP or
 *                          RTMIN+n (default none)
 *   GDRCACHE_STATS_INTERVAL also write the statistics every this many seconds, from a thread of
 *                          the library (0: never) (default 0)
 *   GDRCACHE_KMOD_DEV      the kernel module's device (default /dev/gdrcache)
 *   GDRCACHE_LIBCUDA       the CUDA driver library to dlopen, for tests and debugging (default
 *                          libcuda.so.1)
 *   GDRCACHE_DISABLE       1: the preload passes every call through untouched (default 0)
 * Every variable, its form and default: gdrcache(7).
 */
#ifndef GDRCACHE_H
#define GDRCACHE_H

#include <stddef.h>
#include <stdint.h>

#include <gdrcache/version.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_pd;
struct ibv_mr;

/* A cache. Opaque. */
struct gdr_cache;
/* One registration handed out by gdr_reg(): a reference on a pinned range (and its MR for one PD and
 * access mask). Opaque; read it through the gdr_region_* accessors; give it back with gdr_dereg(). */
struct gdr_region;

enum gdr_backend {
	/* kmod if /dev/gdrcache opens, else dmabuf if the GPU exports dma-bufs, else peermem */
	GDR_BACKEND_AUTO = 0,
	/* gdrcache.ko: nvidia_p2p_get_pages; page list; kernel revocation events */
	GDR_BACKEND_KMOD = 1,
	/* cuMemGetHandleForAddressRange(DMA_BUF_FD) + ibv_reg_dmabuf_mr */
	GDR_BACKEND_DMABUF = 2,
	/* ibv_reg_mr on the GPU VA (nvidia-peermem); needs a PD */
	GDR_BACKEND_PEERMEM = 3,
};

/* (0.1 numbered these TAG 0, EVENTS 1, AUTO 2; its binaries keep that: compat-0_1.c.) */
enum gdr_validate {
	/* events where proven at start-up, else tag (logged once, in stats) */
	GDR_VALIDATE_AUTO = 0,
	/* CU_POINTER_ATTRIBUTE_BUFFER_ID compared on every hit */
	GDR_VALIDATE_TAG = 1,
	/* no driver call on a hit: the library learns of every free from the driver's free entry
	 * points (intercepted) and from gdrcache.ko's revocation page; gdr_cache_create fails with
	 * -EOPNOTSUPP when the interception is not proven to work in this process */
	GDR_VALIDATE_EVENTS = 2,
};

enum gdr_log_level {
	GDR_LOG_NONE = 0,
	GDR_LOG_ERROR = 1,
	GDR_LOG_WARN = 2,
	GDR_LOG_INFO = 3,
	GDR_LOG_DEBUG = 4,
};

/*
 * Set the lowest level logged, for the whole process (logging is per process, not per cache); it
 * overrides GDRCACHE_LOG, which is read first. Returns the previous level, or -EINVAL (a level
 * outside GDR_LOG_NONE..GDR_LOG_DEBUG: nothing changed).
 */
int gdr_set_log_level(int level);

/*
 * Route the library's log lines (and the preload's) into the caller's logger, for middleware whose
 * users should see one format (NCCL's ncclDebugLogger_t, UCX's ucs_log): fn(arg, level, msg) is
 * called for each line that passes the level and the per-site rate limit, with level a
 * gdr_log_level and msg the text alone (no prefix, no newline; the default sink writes
 * "gdrcache[pid:tid] time level: msg"). fn NULL restores the default sink (stderr or
 * GDRCACHE_LOG_FILE). Process-wide; returns 0, or -ENOMEM (nothing changed). fn may be called
 * from any thread at once, from inside an intercepted CUDA free and from the library's locked
 * paths: it must not call the CUDA driver or libgdrcache, nor wait for a lock the calling thread
 * may hold. msg lives until fn returns.
 */
typedef void (*gdr_log_fn)(void *arg, int level, const char *msg);
int gdr_set_log_handler(gdr_log_fn fn, void *arg);

/* Whether the library patches libcuda's free and allocation entry points (process-wide: decided
 * when libcuda is first loaded, by GDRCACHE_INTERCEPT or the first cache's attribute). */
enum gdr_intercept {
	/* patch them, alongside another tool's patch at an entry (UCX's) where one is there */
	GDR_INTERCEPT_AUTO = 0,
	/* patch nothing: hits are validated by tag, no out-of-memory relief, no free events */
	GDR_INTERCEPT_OFF = 1,
	/* patch, unless another tool already patched an entry: then patch nothing (as OFF) and
	 * say which tool's jump was found */
	GDR_INTERCEPT_YIELD = 2,
};

/* Which fields of struct gdr_cache_attr are set; others take the environment or the default. */
enum gdr_cache_attr_field {
	GDR_CACHE_ATTR_MAX_BYTES = 1u << 0,
	GDR_CACHE_ATTR_MAX_ENTRIES = 1u << 1,
	GDR_CACHE_ATTR_MAX_PIN_BYTES = 1u << 2,
	GDR_CACHE_ATTR_BACKEND = 1u << 3,
	GDR_CACHE_ATTR_VALIDATE = 1u << 4,
	/* 1u << 5 was 0.1's log level: refused (unknown bit); use gdr_set_log_level */
	GDR_CACHE_ATTR_INTERCEPT = 1u << 6,
};

struct gdr_cache_attr {
	uint64_t field_mask;  /* GDR_CACHE_ATTR_*; unknown bits: -EINVAL */
	uint64_t max_bytes;   /* pinned bytes above which unreferenced entries are evicted (> 0) */
	uint64_t max_entries; /* entries above which unreferenced entries are evicted (> 0) */
	uint64_t max_pin_bytes; /* allocations up to this size are pinned whole */
	int32_t backend;        /* enum gdr_backend */
	int32_t validate;       /* enum gdr_validate */
	uint32_t reserved0;     /* must be 0 (0.1's log_level: now gdr_set_log_level) */
	/* enum gdr_intercept, with GDR_CACHE_ATTR_INTERCEPT (was reserved: 0 is AUTO). It decides
	 * only where it comes before libcuda is loaded (the first cache, before any other call that
	 * loads it); a later cache that asks OFF validates by tag, takes no events, and is logged. */
	uint32_t intercept;
};

/* What a registration's memory is. */
enum gdr_mem_kind {
	GDR_MEM_HOST = 0, /* not GPU memory: registered straight through ibv_reg_mr, never cached */
	GDR_MEM_DEVICE = 1, /* cuMemAlloc / cudaMalloc (and pool memory where the driver predates
			       CU_POINTER_ATTRIBUTE_MAPPING_*), legacy CUDA IPC imports */
	GDR_MEM_VMM = 2,    /* device memory mapped with cuMemMap (SYNC_MEMOPS set context-wide) */
	GDR_MEM_POOL = 3,   /* stream-ordered pool memory (cuMemAllocAsync, cudaMallocAsync): the
			       dmabuf backend pins the pool's physical chunks that hold it */
};

/*
 * Create a cache. attr may be NULL (environment and defaults). Returns 0 and *cache, or
 * -EINVAL (NULL cache, unknown field bits, reserved0 or reserved != 0, a zero limit, an unknown
 * backend or mode, a malformed GDRCACHE_* variable),
 * -ENODEV (the backend asked for explicitly is unavailable: module not loaded, no CUDA driver),
 * -ENOMEM.
 * A process without libcuda gets a working cache: host memory passes through; GPU paths report
 * -ENODEV (see gdr_reg).
 */
int gdr_cache_create(const struct gdr_cache_attr *attr, struct gdr_cache **cache);

/*
 * Destroy a cache: unpins everything, deregisters its MRs, closes its dma-bufs.
 * Returns 0, -EINVAL (NULL), or -EBUSY (registrations are still held: nothing is destroyed, the
 * cache stays usable; release them first).
 */
int gdr_cache_destroy(struct gdr_cache *cache);

/* Or'ed into gdr_reg's access: a registration with remote access may use the cached MR of the whole
 * pinned range, as MPI and UCX use their registration caches. Its rkey reaches every byte of that
 * range (the MR's addr and length, gdr_region_mr), which is more than the allocation:
 *  - device and VMM memory: the allocation's 64 KiB-aligned cover, and so whatever shares those
 *    64 KiB pages (the driver packs small allocations) or was pinned in one range with it;
 *  - stream-ordered pool memory under the dmabuf backend: the pool's whole 32 MiB chunks that hold
 *    the allocation, with the pool's other allocations and free space in them (the driver exports
 *    no smaller piece: docs/FACTS.md, "Pool memory");
 *  - an allocation larger than max_pin_bytes: the window of it that was pinned.
 * A peer given that rkey can read and write all of it: pass the flag only for peers trusted with
 * the process's GPU memory. Without it, remote access gets an MR of exactly [addr, addr+len). */
#define GDR_ACCESS_WIDE_MR (1 << 30)
/* Or'ed into gdr_reg's access: serve the registration only if the cache already holds it (a hit),
 * else fail at once with -ENOENT, having classified, pinned and registered nothing; in mode events
 * no driver call is made either way. What it serves is GPU memory (never GDR_MEM_HOST: host
 * memory is registered through, not cached). For a caller that decides host or GPU memory only on
 * a miss (libgdrcache-preload.so: a hit costs no cuPointerGetAttribute). */
#define GDR_REG_CACHED_ONLY (1 << 29)

/*
 * Register [addr, addr+len) and take a reference. pd may be NULL: then the registration carries the
 * pinned range (kmod page list or dma-buf fd) but no MR. access is an ibv_access_flags mask, used only
 * with a pd. With remote access (IBV_ACCESS_REMOTE_WRITE / _READ / _ATOMIC, MW_BIND, FLUSH_GLOBAL /
 * _PERSISTENT) the MR, and so the rkey a peer gets, covers exactly [addr, addr+len) (one NIC
 * registration per distinct range, cached over the shared pin; an entry keeps at most 32 such
 * ranges, then is replaced); so does IBV_ACCESS_ZERO_BASED, always (its offsets count from addr);
 * other local access, or GDR_ACCESS_WIDE_MR, shares one MR of the whole pinned range. GPU device memory is served from the cache (a hit takes no lock; in mode tag it
 * costs one BUFFER_ID query); host memory and
 * memory CUDA does not know go straight to ibv_reg_mr (needs a pd).
 * Returns 0 and *region, or
 * -ENOENT (GDR_REG_CACHED_ONLY and not a hit),
 * -EINVAL (NULL cache/region, len 0, addr+len overflows, host memory without a pd),
 * -EOPNOTSUPP (managed memory; memory the driver will not export, such as legacy CUDA IPC imports
 * under the dmabuf backend; a GPU no backend serves; peermem backend without a pd),
 * -ENODEV (GPU memory asked of a process with no CUDA driver),
 * -ENOMEM / -ENOSPC (nothing left to evict and the backend still cannot pin),
 * or the backend's or libibverbs' error.
 */
int gdr_reg(struct gdr_cache *cache, struct ibv_pd *pd, void *addr, size_t len, int access,
	    struct gdr_region **region);

/*
 * Release a reference taken by gdr_reg(), on any thread. The range stays pinned in the cache until
 * evicted. Returns 0, or -EINVAL (NULL, or a release refused and logged). A legitimate release
 * never fails: it allocates nothing.
 * A release is refused, exactly, when the region's record has been retired (its entry was dropped
 * after its last release, or its PD released) and not yet reused, or when it would make the
 * releases of the record exceed its registrations summed over all threads. Records are never freed
 * while the cache lives, so a late release reads no freed memory. Not detected: registrations of
 * one allocation with the same pd and access share one record (gdr_reg returns the same pointer),
 * so a second release of one of them while another is held releases that other's hold; and a
 * retired record is reused for a new registration once 1024 more records of the cache were retired
 * after it, so a release of the old region then counts against the new one if that one is held.
 * A region must not be used after its release, nor after gdr_cache_destroy: the accessors check
 * only that its record is live, since registrations of the same buffer share it.
 */
int gdr_dereg(struct gdr_region *region);

/* Unpin every unreferenced entry. Returns the number of entries dropped, or -EINVAL. */
int gdr_cache_flush(struct gdr_cache *cache);

/*
 * Deregister every MR the cache made for pd (the pins stay cached), so that the caller may
 * ibv_dealloc_pd it. Returns 0, -EINVAL (NULL cache or pd), or -EBUSY (registrations made with pd
 * are still held: only the unheld MRs were released).
 */
int gdr_cache_release_pd(struct gdr_cache *cache, struct ibv_pd *pd);

/* Accessors of a held registration. Each returns 0 or -EINVAL (NULL argument). */
/* The MR (NULL without a pd). */
int gdr_region_mr(const struct gdr_region *region, struct ibv_mr **mr);
/* Its keys; -ENOENT without a pd. */
int gdr_region_keys(const struct gdr_region *region, uint32_t *lkey, uint32_t *rkey);
/* The pinned range. */
int gdr_region_range(const struct gdr_region *region, uint64_t *base, uint64_t *len);
/* The BUFFER_ID of the allocation holding the requested address; 0 for host memory. */
int gdr_region_buffer_id(const struct gdr_region *region, uint64_t *buffer_id);
int gdr_region_mem_kind(const struct gdr_region *region, enum gdr_mem_kind *kind);
/* kmod backend: the module's handle, GPU page size and count. -ENOENT for other backends. */
int gdr_region_kmod(const struct gdr_region *region, uint64_t *handle, uint32_t *page_size,
		    uint32_t *page_count);
/* kmod backend: copies up to max physical page addresses; returns the page count, or -errno. */
int gdr_region_pages(const struct gdr_region *region, uint64_t *pages, uint32_t max);
/* dmabuf backend: the dma-buf fd (owned by the cache: do not close it) and the offset of the pinned
 * range's base inside it. -ENOENT for other backends. */
int gdr_region_dmabuf(const struct gdr_region *region, int *fd, uint64_t *offset);

/* Counters of a cache. It may grow at its end: gdr_cache_get_stats_ex. */
struct gdr_cache_stats {
	uint64_t hits;      /* gdr_reg served from a valid cached entry */
	uint64_t misses;    /* gdr_reg that had to pin */
	uint64_t stale;     /* entries found invalid (freed or reallocated buffer) and dropped */
	uint64_t evictions; /* entries unpinned to respect limits or to make room after a failure */
	uint64_t pins;      /* backend pins made */
	uint64_t unpins;    /* backend pins released */
	uint64_t pinned_bytes; /* pinned now */
	uint64_t pinned_bytes_peak;
	uint64_t entries;         /* entries pinned now: those cached and those detached */
	uint64_t passthrough;     /* host-memory registrations passed to ibv_reg_mr */
	uint64_t tag_checks;      /* BUFFER_ID queries made to validate hits */
	uint64_t revoked;         /* entries the kernel module reported freed (no driver query) */
	uint64_t sync_memops_set; /* allocations given SYNC_MEMOPS */
	uint64_t sync_memops_ctx; /* times the context-wide CU_CTX_SYNC_MEMOPS was set instead */
	uint64_t sync_memops_unavailable; /* allocations for which neither could be set */
	uint64_t fail_pin;                /* pins that failed for good */
	uint64_t fail_pin_retried; /* pins that failed for lack of resources, evicted and retried */
	uint64_t fail_mr;          /* NIC registrations that failed */
	uint64_t fail_cuda;        /* CUDA queries that failed unexpectedly */
	uint64_t fail_input;       /* calls refused for bad input */
	uint64_t refused_managed;  /* managed memory refused */
	uint64_t
		overlap_merged; /* entries merged into a larger pin because a request spanned them */
	uint64_t detached;      /* entries replaced (stale or merged) while still held: pinned until
				   their last gdr_dereg, never handed out again; now */
	uint64_t validate_mode; /* enum gdr_validate in effect (AUTO resolved) */
	uint64_t events;        /* free events applied (intercepted driver frees) */
	uint64_t events_lost; /* times events were lost (queue overrun): every entry was dropped */
	uint64_t fast_hits;   /* hits served without the cache lock (the last field of 0.1) */
	/* 0.2 (gdr_cache_get_stats_ex only); fields added later go after these, and only there. */
	uint64_t exact_mrs;      /* MRs made of exactly one remote-access range (see gdr_reg) */
	uint64_t exact_replaced; /* entries replaced for holding 32 such MRs, half of them unheld */
	/* entries a miss's pin overlapped but did not merge, the union being past max_pin_bytes
	 * (pinned while held, no longer handed out) */
	uint64_t overlap_split;
};

/*
 * Copy the cache's statistics: min(size, sizeof(struct gdr_cache_stats)) bytes, and zeros in the
 * bytes past that up to size (a field of a newer header reads 0). size is sizeof(*stats) as the
 * caller compiled it. Returns 0, or -EINVAL (NULL cache or stats, size smaller than 0.1's struct:
 * the fields up to fast_hits).
 */
int gdr_cache_get_stats_ex(struct gdr_cache *cache, struct gdr_cache_stats *stats, size_t size);
/* The fields of 0.1 only (hits to fast_hits), whatever the struct has grown to: later fields are
 * not written. Returns 0 or -EINVAL. */
int gdr_cache_get_stats(struct gdr_cache *cache, struct gdr_cache_stats *stats);

/* Where a setting of a cache came from. */
enum gdr_setting_source {
	GDR_SETTING_DEFAULT = 0, /* the fixed default (GDRCACHE_* variable's documented fallback) */
	GDR_SETTING_DEVICES = 1, /* derived from the GPUs' BAR1 and memory (limits_why says how) */
	GDR_SETTING_ENV = 2,     /* its GDRCACHE_* variable */
	GDR_SETTING_ATTR = 3,    /* struct gdr_cache_attr */
};

/* What a cache runs with, every default and AUTO resolved. It may grow at its end. */
struct gdr_cache_settings {
	uint64_t max_bytes;
	uint64_t max_entries;
	uint64_t max_pin_bytes;
	int32_t backend;        /* enum gdr_backend in use (as gdr_cache_backend) */
	int32_t validate;       /* enum gdr_validate in effect (never AUTO) */
	int32_t max_bytes_from; /* enum gdr_setting_source, of each */
	int32_t max_entries_from;
	int32_t max_pin_bytes_from;
	int32_t backend_from; /* where what was asked came from (DEFAULT: auto) */
	int32_t validate_from;
	uint32_t reserved;    /* 0 */
	char limits_why[192]; /* how the limits not set were chosen, NUL-terminated: "fixed
				 defaults", or "from the devices (N GPUs: BAR1 ..., memory ...)" */
};

/*
 * Copy the cache's resolved settings: min(size, sizeof(struct gdr_cache_settings)) bytes, and zeros
 * past that up to size. Returns 0, or -EINVAL (NULL cache or s, size smaller than 0.2's struct).
 */
int gdr_cache_get_settings(const struct gdr_cache *cache, struct gdr_cache_settings *s,
			   size_t size);

/* The interception of the CUDA driver's free and allocation entry points, process-wide (what mode
 * events rests on). Entry points, in the order of gdr_intercept_stats.frees[]: */
enum gdr_free_route {
	GDR_FREE_MEM_FREE = 0,   /* cuMemFree_v2, cuMemFree (cudaFree) */
	GDR_FREE_MEM_FREE_ASYNC, /* cuMemFreeAsync, cuMemFreeAsync_ptsz (cudaFreeAsync) */
	GDR_FREE_MEM_FREE_HOST,  /* cuMemFreeHost */
	GDR_FREE_MEM_UNMAP,      /* cuMemUnmap (VMM, PyTorch expandable segments) */
	GDR_FREE_IPC_CLOSE,      /* cuIpcCloseMemHandle */
	GDR_FREE_CTX,            /* cuCtxDestroy, cuDevicePrimaryCtxReset / Release: everything */
	GDR_FREE_ROUTES
};
struct gdr_intercept_stats {
	int32_t state;    /* 0: every route proven (mode events possible); else -errno */
	char reason[116]; /* why, NUL-terminated */
	uint64_t frees[GDR_FREE_ROUTES]; /* frees seen per entry point */
	uint64_t released;   /* unreferenced pins released inside a free, before it returned */
	uint64_t deferred;   /* frees whose release was left to the lock's holder (busy cache) */
	uint64_t reg_waits;  /* registrations that waited for a free of their buffer in flight */
	uint64_t oom_relief; /* failed allocations (out of memory) after which pins were released */
	uint64_t oom_retry_ok; /* of those, retries that then succeeded */
	uint64_t free_ns;      /* time spent in the interception of frees, in total (ns) */
	/* The library's own releases of a primary context it borrowed for a call (a dma-buf export
	 * on a thread without that device's context) that could not be proven not the last, and
	 * were handled as context releases (not counted in frees[]). */
	uint64_t own_releases;
	/* How libcuda's entry points were patched: entries in the one-byte form, and
	 * entries written while every other thread was stopped (libcuda already in use, the one-byte
	 * form's stub address taken or out of reach: docs/events.md); over those stops, threads
	 * stopped, and threads found inside an entry's first instructions and moved out. */
	uint32_t entries_short, entries_stopped;
	uint32_t threads_stopped, threads_moved;
	uint64_t stopped_ns; /* how long the other threads were stopped, in all */
};
/* Copy what the interception saw; size is sizeof(*stats) as the caller knows it (the structure
 * may grow at its end: fields past size are not written). Loads libcuda and installs the
 * interception if that was not done yet. Returns 0, or -EINVAL (stats NULL or size too small). */
int gdr_intercept_get_stats(struct gdr_intercept_stats *stats, size_t size);

/* ---- Free events for middleware that keeps its own cache -----------------------------------------
 * What the library's caches rest on, for a registration cache of the caller's that makes its own MRs
 * (DEVX, relaxed ordering, its own PD rules): learn, on the freeing thread and before the free
 * returns, that GPU memory it registered is being freed. The events come from the interception of
 * the driver's free entry points (every route a program reaches them by, in every way the library
 * is loaded: gdr_intercept_get_stats); the library's own caches are one consumer of the same
 * dispatch. Where the interception is not in effect (turned off by GDRCACHE_INTERCEPT, refused at
 * start-up, no CUDA driver) nothing is ever reported: gdr_mem_events_state says so and why,
 * gdr_mem_monitor_create fails with its error, and a caller validates by BUFFER_ID itself.
 * How the anchors' interfaces map:
 *   UCX  ucm_set_event_handler(UCM_EVENT_MEM_TYPE_FREE, cb)  a monitor with GDR_MONITOR_ALL and fn
 *   libfabric fi_ops_mem_monitor subscribe / unsubscribe /   gdr_mem_monitor_subscribe /
 *        valid, ofi_monitor_notify(addr, len)               _unsubscribe / _valid, fn
 *   Open MPI rcache_invalidate_range(base, size)             what fn calls
 *   a lock-free cursor of invalidations (no system call)   gdr_mem_events_head / _get
 */
enum gdr_mem_event_kind {
	/* [start, start+len) is being freed. cuMemFree, cuMemFreeAsync, cuMemFreeHost and
	 * cuIpcCloseMemHandle give no size: to a monitor that subscribed part of the allocation,
	 * len is the allocation's size (as the driver said at the subscription); elsewhere (the
	 * ring, a monitor of everything) len 0, meaning the whole allocation that starts at start */
	GDR_MEM_EVENT_FREE = 0,
	/* [start, start+len) was just allocated: nothing registered before can rightly be there */
	GDR_MEM_EVENT_ALLOC = 1,
	/* a context was destroyed or reset, or a primary context's last reference may have been
	 * released: any GPU memory may be gone (start 0, len UINT64_MAX) */
	GDR_MEM_EVENT_CONTEXT = 2,
};
struct gdr_mem_event {
	uint64_t start, len;
	uint32_t kind; /* enum gdr_mem_event_kind */
	uint32_t reserved;
};

/* Whether free events are in effect in this process: 0, or -errno with *why (static text, may be
 * NULL): -EOPNOTSUPP (turned off: GDRCACHE_INTERCEPT=off, or the first cache's attribute),
 * -EBUSY (GDRCACHE_INTERCEPT=yield found another tool's patch), -ENODEV (no CUDA driver), or the
 * start-up probe's error (-ENOSYS: a route to a free is not intercepted). Loads libcuda and installs the interception if not done yet. */
int gdr_mem_events_state(const char **why);

/* Polling. Events are numbered from 0 in one process-wide ring of 4096; a consumer keeps the number
 * of the next it has not read. gdr_mem_events_head() is one load (no system call, no lock): the
 * number of the next event to come. gdr_mem_events_get(seq) copies event seq: 0; -ERANGE (lost:
 * overwritten, the consumer fell more than 4096 behind, or given up by a free that never finished
 * writing it: the consumer must treat everything it holds as freed); -EINVAL (ev NULL, or seq not
 * yet reserved). An event is in the ring before the free it reports calls the driver; one being
 * written by a free on another thread is waited for (a few instructions; at most 1 s). */
uint64_t gdr_mem_events_head(void);
int gdr_mem_events_get(uint64_t seq, struct gdr_mem_event *ev);

/* A monitor: subscribed GPU ranges (or all GPU memory) and a callback. Opaque. At most 64 at once. */
struct gdr_mem_monitor;
/*
 * The callback: called for each event that concerns the monitor (GDR_MONITOR_ALL: every event; else
 * an event that overlaps a subscribed range, once per event), on the thread that frees, before the
 * driver frees (a context event: just after the driver returned, before the call returns to the
 * program), never inside a driver call (an event of a free the driver makes from inside one of its
 * own calls is delivered when that outer call's hook ends). Monitors' callbacks run one after
 * another; several threads may run one monitor's callback at once.
 * Its rules:
 *  - no CUDA driver call: a free or allocation the callback makes on its thread is not delivered to
 *    it again, and is counted (gdr_mem_monitor_violations) and logged;
 *  - no wait for a lock the freeing thread may hold: the program may free with any of its own locks
 *    held, the caller's cache lock included (a thread that frees under its cache's lock gets its
 *    own callback there). Record the event for later (a queue, a flag) where this thread already
 *    holds the lock (examples/mem_monitor_rcache/rcache.c). And the other way: do not hold a
 *    lock the callback may wait for across gdr_reg or gdr_mem_monitor_subscribe (a gdr_reg miss
 *    may wait for a free in flight on another thread, whose callback may be waiting for it);
 *  - it may call ibv_dereg_mr and close a dma-buf fd (what gives freed memory back before the free
 *    returns: an open dma-buf keeps it allocated), gdr_dereg, a gdr_reg that hits, and
 *    gdr_mem_monitor_unsubscribe and _valid. A gdr_reg that misses (it would wait for the very
 *    free being made), gdr_cache_create / _destroy / _flush / _release_pd and
 *    gdr_mem_monitor_create / _destroy / _subscribe (a driver query) return -EDEADLK, logged.
 * A free the library itself makes while it holds a cache's lock (its own release of a primary
 * context it borrowed) is delivered when that lock is released, before the library's call returns.
 */
typedef void (*gdr_mem_event_fn)(void *arg, const struct gdr_mem_event *ev);
#define GDR_MONITOR_ALL (1u << 0) /* every event, subscribed or not (UCX's UCM handler) */
/*
 * Create a monitor. fn may be NULL (a monitor that is only asked: gdr_mem_monitor_valid). Returns 0
 * and *monitor, or -EINVAL (monitor NULL, unknown flags), -EMFILE (64 monitors live), -ENOMEM,
 * -EDEADLK (from a callback), or gdr_mem_events_state's error (events not in effect: nothing would
 * ever be reported).
 */
int gdr_mem_monitor_create(unsigned flags, gdr_mem_event_fn fn, void *arg,
			   struct gdr_mem_monitor **monitor);
/* Destroy a monitor: when it returns, no callback of it runs any more. Returns 0, -EINVAL (NULL,
 * not a live monitor), -EDEADLK (called from its own callback). */
int gdr_mem_monitor_destroy(struct gdr_mem_monitor *monitor);
/*
 * Subscribe [addr, addr+len) of GPU memory (libfabric's subscribe): the callback learns of events
 * that overlap it (a free given without a size overlaps it when it frees the allocation that holds
 * addr), and gdr_mem_monitor_valid answers for it. Subscriptions count: the same range subscribed
 * twice needs two unsubscribes; a range subscribed again after an event concerned it is a new,
 * fresh subscription beside the stale one (unsubscribe drops the stale one first). One driver query
 * (the allocation that holds addr) per call; no system call. Returns 0, or -EINVAL (NULL, not a
 * live monitor, len 0, overflow, memory the CUDA driver does not know), -ENOMEM, -EDEADLK (from a
 * callback).
 */
int gdr_mem_monitor_subscribe(struct gdr_mem_monitor *monitor, const void *addr, size_t len);
/* Drop one subscription of exactly [addr, addr+len). Returns 0, -EINVAL (NULL), -ENOENT (not
 * subscribed). */
int gdr_mem_monitor_unsubscribe(struct gdr_mem_monitor *monitor, const void *addr, size_t len);
/*
 * Whether [addr, addr+len) is still the memory subscribed (libfabric's valid): 1 where it is
 * covered by one subscription that no event has concerned since it was made; 0 where an event did
 * (freed, reallocated, or a context went), or where no subscription covers it. No driver call, no
 * system call (one uncontended lock). Returns 1, 0, or -EINVAL (NULL, not a live monitor, len 0,
 * overflow).
 */
int gdr_mem_monitor_valid(struct gdr_mem_monitor *monitor, const void *addr, size_t len);
/* Callback rule breaks seen so far (driver calls from a callback), process-wide. */
uint64_t gdr_mem_monitor_violations(void);

/* The backend the cache uses (after AUTO was resolved). Returns 0 or -EINVAL. */
int gdr_cache_backend(const struct gdr_cache *cache, enum gdr_backend *backend);

/* Run-time version: GDR_VERSION_NUM(major, minor, patch) of the loaded library. */
uint32_t gdr_cache_version(void);

#ifdef __cplusplus
}
#endif

#endif /* GDRCACHE_H */
