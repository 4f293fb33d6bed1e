/* SPDX-License-Identifier: MIT */
/*
 * rcache: a small registration cache of a middleware's own, in the shape of UCX's ucs_rcache and
 * libfabric's / Open MPI's MR caches, built on libgdrcache's free events (gdr_mem_monitor_*). It
 * makes its own MRs; libgdrcache gives it only the pin (gdr_reg with a NULL pd) and the word of
 * every free. An example: it includes only <gdrcache.h> and libibverbs.
 *
 * What it keeps: entries keyed by range [start, end), disjoint (a miss removes the entries its range
 * overlaps, as libfabric's cache does; UCX merges them instead), reference counted, and an LRU of
 * the unreferenced ones bounded by entries and bytes. Each entry holds
 *  - the pin: a gdr_region of libgdrcache's cache, taken with a NULL pd (a dma-buf fd of the
 *    dmabuf backend, or a page list of the kmod backend);
 *  - its MR, made by the rcache (route below), or none (pin only: pd NULL, a number for an id);
 *  - a subscription of its range to the rcache's gdr_mem_monitor.
 *
 * How an MR is made (struct rcache_params.route):
 *  - RCACHE_MR_DMABUF: ibv_reg_dmabuf_mr on the pin's dma-buf fd (gdr_region_dmabuf). The
 *    upstream-kernel path, no nvidia-peermem; the GPU memory is pinned once, by libgdrcache, and
 *    the MR rests on that pin. Needs libgdrcache's dmabuf backend.
 *  - RCACHE_MR_VA: ibv_reg_mr on the GPU VA, as nvidia-peermem serves it (the kernel pins again,
 *    for the MR). Works under every backend where nvidia-peermem is loaded.
 *  - RCACHE_MR_AUTO: the dma-buf where the pin has one, else the VA.
 *
 * Frees. The monitor's callback runs on the freeing thread before the driver frees. It removes the
 * entries the freed range overlaps and releases the unreferenced ones (MR deregistered, pin
 * released) before it returns, so freed memory comes back to the program when its free returns
 * (an open dma-buf, and an MR on one, keep freed GPU memory allocated). An entry still referenced
 * is removed from the index at once and released at its last rcache_put. Where the freeing thread
 * already holds the rcache lock (a free inside the rcache's own locked work: an MR registration
 * that frees GPU memory on its thread), the callback may not wait for that lock: it queues the
 * event, and the thread applies the queue before it unlocks (UCX's invalidation queue).
 *
 * Thread safety: every function may be called from any thread; one mutex guards the rcache. An
 * entry may be released from any thread, once per rcache_get.
 *
 * Errors: 0 or -errno, as libgdrcache's.
 */
#ifndef RCACHE_H
#define RCACHE_H

#include <stddef.h>
#include <stdint.h>

#include <gdrcache.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_pd;
struct ibv_mr;
struct rcache;

/* A registration handed out by rcache_get. Read its fields; give it back with rcache_put. */
struct rcache_region {
	uint64_t start, end;    /* the registered range [start, end) */
	struct ibv_pd *pd;      /* NULL: pin only */
	int access;             /* ibv_access_flags of the MR (those asked of it, or'ed) */
	struct ibv_mr *mr;      /* the MR the rcache made; NULL where pd is NULL */
	uint64_t mr_id;         /* mr's lkey, or where pd is NULL a number unique in the rcache */
	struct gdr_region *pin; /* libgdrcache's registration of the range, made with a NULL pd */
	uint64_t buffer_id;     /* CU_POINTER_ATTRIBUTE_BUFFER_ID of the memory pinned (at start) */
};

enum rcache_mr_route {
	RCACHE_MR_AUTO = 0,   /* dma-buf where the pin has one, else the VA */
	RCACHE_MR_DMABUF = 1, /* ibv_reg_dmabuf_mr on the pin's dma-buf fd; else -EOPNOTSUPP */
	RCACHE_MR_VA = 2,     /* ibv_reg_mr on the GPU VA (nvidia-peermem) */
};

/* The verbs calls the rcache makes: libibverbs' unless a test gives its own. */
struct rcache_verbs {
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				 int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
};

struct rcache_params {
	struct gdr_cache *cache;          /* where the pins come from (required) */
	enum rcache_mr_route route;       /* how MRs are made */
	uint64_t max_unused_entries;      /* unreferenced entries kept (0: 1024) */
	uint64_t max_unused_bytes;        /* bytes they may cover (0: 1 GiB) */
	const struct rcache_verbs *verbs; /* NULL: libibverbs */
};

struct rcache_stats {
	uint64_t gets, hits, misses;
	uint64_t retries;     /* misses begun again: another thread made the entry first, or an
				 event concerned the range while it was being made */
	uint64_t events;      /* monitor callbacks received */
	uint64_t deferred;    /* of those, queued: the freeing thread held the rcache lock */
	uint64_t invalidated; /* entries removed by events */
	uint64_t belt;        /* hits refused by gdr_mem_monitor_valid: an event concerned the entry
				 and no callback had removed it (should stay 0) */
	uint64_t evicted;     /* unreferenced entries removed to respect the limits */
	uint64_t regions;     /* entries alive now: cached, or removed but still referenced */
	uint64_t cached;      /* entries in the index now */
	uint64_t unused;      /* of those, unreferenced (in the LRU) */
	uint64_t unused_bytes;
};

/* Make an rcache and its monitor. Returns 0 and *rc, or -EINVAL (NULL params, cache or rc; an
 * unknown route), -ENOMEM, or gdr_mem_monitor_create's error (free events not in effect in this
 * process: gdr_mem_events_state says why; such a process validates by BUFFER_ID instead). */
int rcache_create(const struct rcache_params *params, struct rcache **rc);
/* Release every entry and the monitor. Returns 0, -EINVAL (NULL), or -EBUSY (entries still
 * referenced: nothing was released). */
int rcache_destroy(struct rcache *rc);

/*
 * Register [addr, addr+len) of GPU memory for pd (NULL: pin only) with at least access, and take a
 * reference. A hit is an entry whose range holds the request, with the same pd and every access
 * bit asked. Returns 0 and *region, or -EINVAL (NULL rc or region, len 0, overflow), gdr_reg's
 * error (memory libgdrcache does not register: host or managed memory), the verbs' error,
 * -EOPNOTSUPP (RCACHE_MR_DMABUF and the pin has no dma-buf), -EAGAIN (the memory was freed over
 * and over while the entry was being made), -ENOMEM.
 */
int rcache_get(struct rcache *rc, struct ibv_pd *pd, void *addr, size_t len, int access,
	       struct rcache_region **region);
/* Drop a reference taken by rcache_get. */
void rcache_put(struct rcache_region *region);

/* Release every unreferenced entry now. Returns how many. */
int rcache_flush(struct rcache *rc);
void rcache_get_stats(struct rcache *rc, struct rcache_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* RCACHE_H */
