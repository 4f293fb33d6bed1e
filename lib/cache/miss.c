/* SPDX-License-Identifier: MIT */
/*
 * The locked path of gdr_reg, and what a miss does: classify the range with the driver, choose the
 * backend of its device, set SYNC_MEMOPS once per allocation, decide how much to pin, pin (evicting
 * and retrying while the backend is short of space) and take over the entries it overlaps. Host
 * memory is passed through to the NIC, never cached.
 *
 * At level debug, one short key=value line for each step of a miss (miss, classify, pin, mr, join,
 * refuse; entry.c and apply.c log the rest), cache=N its id (thread.c). Debug lines are not
 * rate-limited (log.c): a job missing a million times a second writes lines as fast.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utlist.h>

#include "cache/cache.h"
#include "cuda/cuda.h"
#include "cuda/cuda_abi.h"
#include "intercept/events.h"
#include "nic/verbs.h"

/* The SYNC_MEMOPS set (c->synced, idset.h): buffer ids that got SYNC_MEMOPS (or proved VMM), so
 * that it is set once per allocation; each id's byte holds its memory kind and how many pins were
 * made for it (the pin extent's history), saturating. */
#define SYNCED_KIND(v) ((uint8_t)((v)&15))
#define SYNCED_MISSES(v) ((uint8_t)((v) >> 4))
#define SYNCED_VAL(kind, misses) ((uint8_t)((kind) | (misses) << 4))
_Static_assert(GDR_MEM_POOL < 16, "a memory kind fits 4 bits");

/* Microseconds of the monotonic clock, for the debug lines' durations; 0 below level debug (no
 * clock read). */
static uint64_t dbg_us(void)
{
	struct timespec ts;

	if (__atomic_load_n(&gdr_log_level, __ATOMIC_RELAXED) < GDR_LOG_DEBUG)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static const char *kind_name(uint8_t kind)
{
	static const char *const names[] = { [GDR_MEM_HOST] = "host",
					     [GDR_MEM_DEVICE] = "device",
					     [GDR_MEM_VMM] = "vmm",
					     [GDR_MEM_POOL] = "pool" };

	return kind < sizeof(names) / sizeof(names[0]) && names[kind] ? names[kind] : "?";
}

/* ---- SYNC_MEMOPS, once per allocation ------------------------------------------------------ */

void gdr_synced_forget(struct gdr_cache *c, uint64_t id)
{
	gdr_idset_del(&c->synced, id);
}

void gdr_synced_free(struct gdr_cache *c)
{
	gdr_idset_free(&c->synced);
}

static int sync_memops(struct gdr_cache *c, struct gdr_tag *t)
{
	uint8_t v;
	int rc;

	if (gdr_idset_get(&c->synced, t->buffer_id, &v)) {
		t->kind = SYNCED_KIND(v);
		return 0;
	}
	rc = gdr_cuda_set_sync_memops(t->start);
	if (!rc) {
		if (t->kind != GDR_MEM_POOL)
			t->kind = GDR_MEM_DEVICE;
		c->st.sync_memops_set++;
	} else if (rc == -EOPNOTSUPP) {
		/* VMM memory (cuMemMap) refuses the pointer attribute: docs/FACTS.md, "VMM memory".
		 * It is still device memory; the context-wide flag gives the same guarantee. */
		t->kind = GDR_MEM_VMM;
		rc = gdr_cuda_ctx_sync_memops(t->device);
		if (rc > 0) {
			c->st.sync_memops_ctx++;
		} else if (rc < 0) {
			c->st.sync_memops_unavailable++;
			gdr_log_once(GDR_LOG_WARN,
				     "SYNC_MEMOPS unavailable for VMM memory at %#llx (%s): RDMA "
				     "reads may race with cudaMemcpy; counted in stats",
				     (unsigned long long)t->start,
				     rc == -EOPNOTSUPP ? "driver lacks cuCtxSetFlags"
				     : rc == -ENXIO    ? "no current context"
						       : "cuCtxSetFlags failed");
		}
	} else {
		c->st.fail_cuda++;
		return rc;
	}
	/* Bounded: an id is forgotten for each past the bound; repeating SYNC_MEMOPS is harmless. */
	return gdr_idset_put(&c->synced, t->buffer_id, SYNCED_VAL(t->kind, 0),
			     c->cfg.max_entries < UINT32_MAX / 8 ? 4 * c->cfg.max_entries + 1024
								 : UINT32_MAX / 2);
}

/* ---- classification and pinning --------------------------------------------------------------- */

/* What the pieces of a classified range need pinned when pool memory is pinned by chunks: the
 * physical chunks of the pool that hold its pool pieces, and the 64 KiB-aligned other pieces. */
struct pin_cover {
	uint64_t lo, hi;
	bool pool; /* some piece is stream-ordered pool memory */
};

static void cover_add(struct pin_cover *cv, uint64_t lo, uint64_t hi)
{
	if (!cv->hi || lo < cv->lo)
		cv->lo = lo;
	if (hi > cv->hi)
		cv->hi = hi;
}

/* Every chunk of the pool allocation pi describes. The driver exports a chunk that a pool
 * allocation shares with the next one only together with it (measured on H200s: a 4 KiB piece at
 * the start of a 50 MiB allocation straddling two 32 MiB chunks was refused as its own chunk, the
 * two chunks exported; docs/FACTS.md, "Pool memory"). So the pin is the cover of the whole
 * allocation's chunks. */
static int cover_pool_allocation(struct gdr_cache *c, struct pin_cover *cv,
				 const struct gdr_ptr_info *pi)
{
	uint64_t q = pi->alloc_start, end = pi->alloc_start + pi->alloc_size;

	if (cv->lo <= q && end <= cv->hi)
		return 0;
	while (q < end) {
		uint64_t base, size;

		if (gdr_cuda_mapping(q, &base, &size)) {
			c->st.fail_cuda++;
			gdr_err("CUDA reports no physical chunk for pool memory at %#llx",
				(unsigned long long)q);
			return -EIO;
		}
		cover_add(cv, base, base + size);
		q = base + size;
	}
	return 0;
}

/* Walk the CUDA allocations under [a, a+len). 0 with tags and *cv; 1: host memory (or unknown to
 * CUDA); -EOPNOTSUPP: managed; -EINVAL: the range mixes GPU and other memory or spans too many
 * pieces. *why: a refusal's reason, for its debug line. */
static int classify(struct gdr_cache *c, uint64_t a, uint64_t len, struct gdr_tag *tags,
		    uint32_t *ntags, struct pin_cover *cv, const char **why)
{
	uint64_t q = a, end = a + len;
	uint32_t n = 0;

	memset(cv, 0, sizeof(*cv));

	while (q < end) {
		struct gdr_ptr_info pi;
		int rc = gdr_cuda_classify(q, &pi);

		if (rc) {
			c->st.fail_cuda++;
			*why = "cuda_classify";
			return rc;
		}
		if (pi.managed) {
			c->st.refused_managed++;
			gdr_warn("%#llx is CUDA managed memory: GPUDirect RDMA does not support it",
				 (unsigned long long)q);
			*why = "managed";
			return -EOPNOTSUPP;
		}
		if (pi.mem_type != GDR_CU_MEMORYTYPE_DEVICE) {
			/* Host memory (or memory CUDA does not know) first: the driver gives no
			 * extent for unknown memory, so the last byte is asked too; a range that
			 * runs into GPU (or managed) memory is refused as in the other order, never
			 * handed to ibv_reg_mr as host memory. */
			if (q == a && (len == 1 || gdr_cuda_classify(a + len - 1, &pi) ||
				       (pi.mem_type != GDR_CU_MEMORYTYPE_DEVICE && !pi.managed)))
				return 1;
			c->st.fail_input++;
			gdr_err("[%#llx, +%llu) mixes GPU memory and other memory",
				(unsigned long long)a, (unsigned long long)len);
			*why = "mixed_memory";
			return -EINVAL;
		}
		if (!pi.size || pi.start > q || pi.start + pi.size <= q) {
			c->st.fail_cuda++;
			gdr_err("CUDA reports allocation [%#llx, +%llu) for %#llx",
				(unsigned long long)pi.start, (unsigned long long)pi.size,
				(unsigned long long)q);
			*why = "cuda_range";
			return -EIO;
		}
		if (n == GDR_MAX_TAGS) {
			gdr_err("[%#llx, +%llu) spans more than %d GPU allocations",
				(unsigned long long)a, (unsigned long long)len, GDR_MAX_TAGS);
			*why = "too_many_allocations";
			return -EINVAL;
		}
		tags[n++] = (struct gdr_tag){ .start = pi.start,
					      .size = pi.size,
					      .alloc_start = pi.alloc_start,
					      .alloc_size = pi.alloc_size,
					      .buffer_id = pi.buffer_id,
					      .kind = pi.pool ? GDR_MEM_POOL : GDR_MEM_DEVICE,
					      .device = pi.device };
		if (pi.pool && pi.map_size) {
			cv->pool = true;
			cover_add(cv, pi.map_start, pi.map_start + pi.map_size);
			rc = cover_pool_allocation(c, cv, &pi);
			if (rc) {
				*why = "cuda_pool_chunk";
				return rc;
			}
		} else {
			cover_add(cv, GDR_ALIGN_DOWN(pi.start), GDR_ALIGN_UP(pi.start + pi.size));
		}
		q = pi.start + pi.size;
	}
	*ntags = n;
	return 0;
}

/* Pin [base, base+len), evicting unreferenced entries and retrying while the backend is short of
 * pinnable space (BAR exhaustion: -ENOMEM / -ENOSPC). */
static int pin_retry(struct gdr_cache *c, struct gdr_pin *pin)
{
	uint64_t t0, retries = 0;
	int rc;

	/* What was dropped is unpinned first: no page pinned twice by indexed entries. */
	gdr_settle(c);
	t0 = dbg_us();
	for (;;) {
		rc = pin->be->ops->pin(pin->be, pin);
		if (rc != -ENOMEM && rc != -ENOSPC)
			break;
		if (!gdr_evict(c, pin->len))
			break;
		c->st.fail_pin_retried++;
		retries++;
	}
	if (rc == -EOPNOTSUPP) {
		c->st.fail_pin++;
		gdr_err("the %s backend cannot pin [%#llx, +%llu): the CUDA driver refuses it (e.g. memory "
			"imported with cuIpcOpenMemHandle is not exported as a dma-buf; counted in "
			"fail_pin)",
			pin->be->ops->name, (unsigned long long)pin->base,
			(unsigned long long)pin->len);
		return rc;
	}
	if (rc) {
		c->st.fail_pin++;
		gdr_err("pinning [%#llx, +%llu) failed: %d", (unsigned long long)pin->base,
			(unsigned long long)pin->len, rc);
		return rc;
	}
	c->st.pins++;
	gdr_dbg("pin cache=%llu be=%s dev=%d range=%#llx-%#llx bytes=%llu retries=%llu us=%llu",
		(unsigned long long)c->id, pin->be->ops->name, pin->device,
		(unsigned long long)pin->base, (unsigned long long)(pin->base + pin->len),
		(unsigned long long)pin->len, (unsigned long long)retries,
		(unsigned long long)(dbg_us() - t0));
	return 0;
}

/* How much of an allocation [lo, hi) a miss for [a, a+len) pins, from what is known: the
 * allocation's size against the budget of unreferenced pinned bytes, and how often it missed before.
 *  - Small against the budget (1/32 of max_bytes), within max_pin_bytes: all of it. Its later
 *    requests, and its neighbours' in the same pages, hit; it costs the budget little.
 *  - Larger: the request, 64 KiB-aligned, unless the allocation has missed PIN_WHOLE_AFTER times
 *    before (requests keep landing in different parts of it): then all of it, if that fits 1/16
 *    of the budget and max_pin_bytes. Pinning large allocations whole under a tight budget evicts
 *    everything else: the churn trace of bench/bench_hit.c went from 31 % to 65 % hits so, and
 *    widening the request (256 KiB, 1 MiB windows) only lowered it.
 *  - Larger still (a KV-cache pool, a caching allocator's segment bigger than max_pin_bytes) that
 *    missed PIN_WHOLE_AFTER times: the windows of max_pin_bytes (counted from the allocation's
 *    start) the request touches. Tensors registered one after the other then cost a pin a window,
 *    not a pin a tensor: their request-sized pins share pages with their neighbours', and merging
 *    each into the next re-pinned everything before it (1,000 tensors of one 1 GiB allocation,
 *    fake driver, max_pin_bytes 256 MiB: 3,520 pins, 67 GB pinned in all; windows: 6 pins). */
#define PIN_WHOLE_AFTER 2
static void pin_extent(struct gdr_cache *c, uint64_t a, uint64_t len, uint64_t lo, uint64_t hi,
		       const struct gdr_tag *tags, uint64_t *base, uint64_t *end)
{
	uint64_t size = hi - lo, misses = 0;
	uint8_t v;

	if (size <= c->cfg.max_pin_bytes && size <= c->cfg.max_bytes / 32)
		goto whole;
	if (gdr_idset_get(&c->synced, tags[0].buffer_id, &v)) {
		misses = SYNCED_MISSES(v);
		if (misses < 15) /* a byte changed in place: allocates nothing */
			gdr_idset_put(&c->synced, tags[0].buffer_id,
				      SYNCED_VAL(SYNCED_KIND(v), misses + 1), 0);
	}
	if (misses >= PIN_WHOLE_AFTER && size <= c->cfg.max_pin_bytes &&
	    size <= c->cfg.max_bytes / 16)
		goto whole;
	*base = GDR_ALIGN_DOWN(a);
	*end = GDR_ALIGN_UP(a + len);
	if (misses >= PIN_WHOLE_AFTER && size > c->cfg.max_pin_bytes) {
		uint64_t w = GDR_ALIGN_UP(c->cfg.max_pin_bytes), wlo = GDR_ALIGN_DOWN(lo);
		uint64_t we = wlo + (*end - wlo + w - 1) / w * w;

		*base = wlo + (*base - wlo) / w * w;
		*end = we < GDR_ALIGN_UP(hi) ? we : GDR_ALIGN_UP(hi);
	}
	return;
whole:
	*base = GDR_ALIGN_DOWN(lo);
	*end = GDR_ALIGN_UP(hi);
}

/* A miss: pin a new entry for tags, taking over the entries it overlaps. */
static int entry_create(struct gdr_cache *c, struct gdr_be *be, uint64_t a, uint64_t len,
			const struct gdr_tag *tags, uint32_t ntags, const struct pin_cover *cv,
			struct gdr_entry **out, const char **why)
{
	uint64_t lo = tags[0].start, hi = tags[ntags - 1].start + tags[ntags - 1].size;
	uint64_t base, end;
	struct gdr_entry *e;
	size_t i;
	int rc;

	/* Pool memory on a backend that pins it by chunks: the chunks holding the range (the
	 * least the driver exports); else the whole allocation(s) up to the cap, else the requested
	 * range; 64 KiB-aligned. */
	if (cv->pool && be->ops->pool_by_chunk) {
		base = cv->lo;
		end = cv->hi;
	} else {
		pin_extent(c, a, len, lo, hi, tags, &base, &end);
	}
	*why = "no_memory";
	e = gdr_entry_alloc(c);
	if (!e)
		return -ENOMEM;
	rc = gdr_entry_add_tags(e, tags, ntags);
	if (rc)
		goto err_free;

	/* Entries sharing pages with the new range: a valid one is merged into it (its range and
	 * tags), a stale one dropped; either way it leaves the index first, so no page is pinned
	 * twice by indexed entries. A valid one that would grow the pin past max_pin_bytes (and past
	 * what this miss pins anyway) is dropped unmerged: its pages stay pinned while it is held,
	 * and merging it would re-pin all of it for each neighbour (pin_extent's windows). */
	i = gdr_index_lower(&c->index, base);
	while (i < c->index.n && c->index.v[i]->pin.base < end) {
		struct gdr_entry *o = c->index.v[i];
		uint64_t ub, ue;

		if (gdr_entry_check(c, o, o->pin.base, o->pin.len, true) < 0) {
			gdr_entry_stale(c, o);
			continue;
		}
		ub = o->pin.base < base ? o->pin.base : base;
		ue = o->pin.base + o->pin.len > end ? o->pin.base + o->pin.len : end;
		if (ue - ub > c->cfg.max_pin_bytes && ue - ub > end - base) {
			c->st.overlap_split++;
			gdr_entry_drop(c, o);
			i = gdr_index_lower(&c->index, base);
			continue;
		}
		rc = gdr_entry_add_tags(e, gdr_entry_tags(o), o->ntags);
		if (rc)
			goto err_free;
		base = ub;
		end = ue;
		c->st.overlap_merged++;
		gdr_entry_drop(c, o);
		i = gdr_index_lower(&c->index, base);
	}

	e->pin.base = base;
	e->pin.len = end - base;
	e->pin.dmabuf_fd = -1;
	e->pin.device = tags[0].device;
	e->pin.be = be;
	*why = "pin";
	rc = pin_retry(c, &e->pin);
	if (rc)
		goto err_free;
	*why = "no_memory";
	rc = gdr_index_insert(&c->index, e);
	if (rc) {
		e->pin.be->ops->unpin(e->pin.be, &e->pin);
		c->st.unpins++; /* pin_retry counted the pin: pins - unpins stays the entries */
		goto err_free;
	}
	gdr_cache_track_reach(c, e, GDR_REACH_NEW);
	DL_APPEND(c->lru, e);
	c->st.entries++;
	gdr_stats_pinned(c, (int64_t)e->pin.len);
	*out = e;
	return 0;

err_free:
	gdr_entry_free(c, e);
	return rc;
}

static int reg_host(struct gdr_cache *c, struct ibv_pd *pd, uint64_t a, uint64_t len, int access,
		    struct gdr_region **out, const char **why)
{
	struct gdr_region *r;
	uint32_t lkey, rkey;
	uint64_t t0;
	int rc;

	gdr_dbg("classify cache=%llu addr=%#llx len=%llu kind=host%s", (unsigned long long)c->id,
		(unsigned long long)a, (unsigned long long)len, c->cuda_ok ? "" : " cuda=none");
	if (!pd) {
		c->st.fail_input++;
		gdr_err("%#llx is not GPU memory%s and no PD was given: nothing to register",
			(unsigned long long)a, c->cuda_ok ? "" : " (no CUDA driver)");
		*why = "host_without_pd";
		return c->cuda_ok ? -EINVAL : -ENODEV;
	}
	*why = "no_record";
	rc = gdr_region_new(c, NULL, pd, access, GDR_MEM_HOST, NULL, &r);
	if (rc)
		return rc;
	t0 = dbg_us();
	rc = gdr_verbs_reg(c->sys.verbs, pd, (void *)(uintptr_t)a, len, a, access, &r->mr);
	if (rc) {
		c->st.fail_mr++;
		gdr_record_retire(c, r);
		gdr_record_free(c, r);
		*why = "mr";
		return rc;
	}
	gdr_mr_keys(r->mr, &lkey, &rkey);
	gdr_dbg("mr cache=%llu pd=%p access=%#x range=%#llx-%#llx lkey=%#x rkey=%#x type=host us=%llu",
		(unsigned long long)c->id, (void *)pd, (unsigned)access, (unsigned long long)a,
		(unsigned long long)(a + len), lkey, rkey, (unsigned long long)(dbg_us() - t0));
	__atomic_store_n(&r->used, 1, __ATOMIC_RELAXED); /* held */
	c->st.passthrough++;
	c->nhost++;
	*out = r;
	return 0;
}

/* ---- the backend of a device ---------------------------------------------------------------------- */

/* The backend that pins memory of the device the tags are on: the cache's own when it serves that
 * device, else (mode AUTO) the next one in the automatic order that does, chosen once per device.
 * 0 and *be; -EOPNOTSUPP when none does (logged once a device); -EINVAL: the range spans GPUs. */
static int backend_for(struct gdr_cache *c, const struct gdr_tag *tags, uint32_t ntags,
		       struct gdr_be **be, const char **why_refused)
{
	int d = tags[0].device;
	const char *why = "";

	for (uint32_t i = 1; i < ntags; i++)
		if (tags[i].device != d) {
			c->st.fail_input++;
			gdr_err("the range at %#llx spans CUDA devices %d and %d",
				(unsigned long long)tags[0].start, d, tags[i].device);
			*why_refused = "spans_devices";
			return -EINVAL;
		}
	if (d < 0 || d >= GDR_MAX_DEVICES)
		d = 0; /* not a device ordinal the driver reports: the cache's backend decides */
	if (c->dev_be[d]) {
		*be = c->dev_be[d];
		return 0;
	}
	*why_refused = "no_backend_for_device";
	if (c->dev_refused[d])
		return -EOPNOTSUPP;
	if (!c->backend->ops->serves || c->backend->ops->serves(c->backend, d, &why)) {
		c->dev_be[d] = c->backend;
	} else if (gdr_backend_for_device(&c->cfg, c->backend, d, be) == 0) {
		c->extra_be[c->nextra_be++] = *be;
		c->dev_be[d] = *be;
		if ((*be)->ops->revokes)
			__atomic_store_n(&c->may_revoke, true, __ATOMIC_RELAXED);
	} else {
		c->dev_refused[d] = true;
		gdr_warn(
			"CUDA device %d: backend %s cannot pin its memory (%s)%s; its registrations "
			"fail with -EOPNOTSUPP",
			d, c->backend->ops->name, why,
			c->cfg.backend == GDR_BACKEND_AUTO ? " and no other backend can" : "");
		return -EOPNOTSUPP;
	}
	*be = c->dev_be[d];
	return 0;
}

/* ---- the two paths of gdr_reg ------------------------------------------------------------------- */

/* gdr_entry_take, and the reason it refused, for the debug line (from what it counted). */
static int take(struct gdr_cache *c, struct gdr_thr *t, struct gdr_entry *e, struct ibv_pd *pd,
		int access, uint64_t a, uint64_t len, bool exact, struct gdr_region **out,
		const char **why)
{
	uint64_t fail_mr = c->st.fail_mr, fail_input = c->st.fail_input;
	int rc = gdr_entry_take(c, t, e, pd, access, a, len, exact, out);

	if (rc)
		*why = c->st.fail_mr != fail_mr         ? "mr"
		       : c->st.fail_input != fail_input ? "backend_needs_pd"
		       : rc == -EIO                     ? "no_allocation_at_addr"
							: "no_memory";
	return rc;
}

/* The locked path: misses, stale entries, new records, pending events. *why: a refusal's reason. */
static int reg_locked(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		      uint64_t len, int access, bool exact, struct gdr_region **out,
		      const char **why)
{
	struct gdr_tag tags[GDR_MAX_TAGS];
	struct pin_cover cover;
	struct gdr_be *be = NULL;
	struct gdr_inflight_snap snap;
	struct gdr_entry *e;
	const char *miss = "none"; /* what the index had at a */
	uint32_t ntags = 0;
	int rc;

	gdr_cache_drain_events(c);
	/* Frees announced by now whose events were just applied: one may still be before the
	 * driver's free while classify() asks the driver, and be over by the check below. */
	gdr_events_inflight_snap(&snap);
	e = gdr_index_find(&c->index, a);
	if (e && gdr_entry_exact_full(c, e, pd, access, a, len, exact)) {
		/* As many remote-access ranges as an entry keeps: it is replaced (held, it is detached
		 * with its MRs until released); the new one starts with none. */
		c->exact_replaced++;
		gdr_entry_drop(c, e);
		gdr_settle(c);
		e = NULL;
		miss = "exact_full";
	}
	if (e && a + len <= e->pin.base + e->pin.len) {
		uint64_t revoked = c->st.revoked;

		rc = gdr_entry_check(c, e, a, len, false);
		if (rc == 0) {
			c->st.hits++;
			return take(c, t, e, pd, access, a, len, exact, out, why);
		}
		if (rc < 0) {
			miss = c->st.revoked != revoked ? "revoked" : "stale";
			gdr_entry_stale(c, e);
			e = NULL;
		} else {
			miss = "gap"; /* inside the pin, not inside its known allocations */
		}
	} else {
		if (e && a < e->pin.base + e->pin.len)
			miss = "past_pin";
		e = NULL;
	}

	if (!c->cuda_ok) {
		gdr_dbg("miss cache=%llu addr=%#llx len=%llu why=%s", (unsigned long long)c->id,
			(unsigned long long)a, (unsigned long long)len, miss);
		return reg_host(c, pd, a, len, access, out, why);
	}
	rc = classify(c, a, len, tags, &ntags, &cover, why);
	if (rc < 0)
		return rc;
	/* Classified while a free of this memory may be running: it may be gone when the driver
	 * returns. Nothing is cached; the caller waits for the free and starts again. A free in
	 * flight now, or one that was when its event was applied above (it may have ended since:
	 * its event is gone, and what classify() saw may be the memory it freed). Host memory is
	 * not cached: it needs no wait. */
	if (!rc && (gdr_cache_free_inflight(a, len, tags, ntags) ||
		    gdr_cache_free_was_inflight(&snap, a, len, tags, ntags)))
		return -EINPROGRESS;
	gdr_dbg("miss cache=%llu addr=%#llx len=%llu why=%s", (unsigned long long)c->id,
		(unsigned long long)a, (unsigned long long)len, miss);
	if (rc == 1)
		return reg_host(c, pd, a, len, access, out, why);
	rc = backend_for(c, tags, ntags, &be, why);
	if (rc)
		return rc;
	if (!pd && !be->ops->pins_without_pd) {
		c->st.fail_input++;
		gdr_err("backend %s registers GPU memory only with a PD", be->ops->name);
		*why = "backend_needs_pd";
		return -EOPNOTSUPP;
	}
	for (uint32_t i = 0; i < ntags; i++) {
		rc = sync_memops(c, &tags[i]);
		if (rc) {
			*why = "sync_memops";
			return rc;
		}
	}
	gdr_dbg("classify cache=%llu addr=%#llx kind=%s dev=%d alloc=%#llx-%#llx id=%llu allocs=%u "
		"be=%s",
		(unsigned long long)c->id, (unsigned long long)a, kind_name(tags[0].kind),
		tags[0].device, (unsigned long long)tags[0].start,
		(unsigned long long)(tags[0].start + tags[0].size),
		(unsigned long long)tags[0].buffer_id, ntags, be->ops->name);

	/* Inside a pinned range but partly outside its known allocations: another allocation that
	 * shares the entry's pages. If every allocation the entry already serves is still alive, the
	 * pinned pages have stayed what they were, so the entry serves the new one too. */
	if (e) {
		if (gdr_entry_check(c, e, e->pin.base, e->pin.len, true) < 0) {
			gdr_entry_stale(c, e);
		} else {
			uint64_t before = gdr_entry_reach(e);

			rc = gdr_entry_add_tags(e, tags, ntags);
			gdr_cache_track_reach(c, e, before); /* what was added, even if not all */
			if (rc) {
				*why = "no_memory";
				return rc;
			}
			c->st.hits++;
			gdr_dbg("join cache=%llu addr=%#llx pin=%#llx-%#llx id=%llu",
				(unsigned long long)c->id, (unsigned long long)a,
				(unsigned long long)e->pin.base,
				(unsigned long long)(e->pin.base + e->pin.len),
				(unsigned long long)tags[0].buffer_id);
			return take(c, t, e, pd, access, a, len, exact, out, why);
		}
	}

	c->st.misses++;
	rc = entry_create(c, be, a, len, tags, ntags, &cover, &e, why);
	if (rc)
		return rc;
	/* If the MR cannot be made the pin stays cached, valid, for the next caller. */
	return take(c, t, e, pd, access, a, len, exact, out, why);
}

int gdr_reg_locked(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		   uint64_t len, int access, bool exact, struct gdr_region **out)
{
	const char *why = "?";
	int rc = reg_locked(c, t, pd, a, len, access, exact, out, &why);

	if (rc && rc != -EINPROGRESS)
		gdr_dbg("refuse cache=%llu addr=%#llx len=%llu rc=%d why=%s",
			(unsigned long long)c->id, (unsigned long long)a, (unsigned long long)len,
			rc, why);
	return rc;
}
