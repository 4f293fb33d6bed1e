/* SPDX-License-Identifier: MIT */
/*
 * The cache: lookup, validation on reuse, pinning with eviction and retry, LRU lazy unpinning,
 * reference counts and limits. One mutex per cache guards the index, the LRU and the statistics.
 * A hit takes it once, to find the entry and take a reference, and validates after dropping it
 * (the driver's BUFFER_ID query is the slow part, and serialised by the driver: FACTS.md); a miss
 * holds it while it classifies and pins. gdr_dereg takes no lock in the common case (see the
 * reference counts below).
 *
 * Invariants, under c->lock:
 *  - indexed entries never overlap, so no 64 KiB page is pinned twice by indexed entries; an entry
 *    replaced while a caller still holds it is "detached": out of the index, pinned until its last
 *    gdr_dereg, never handed out again;
 *  - the LRU list holds exactly the indexed entries, least recently taken first;
 *  - after every call, pinned bytes and entries exceed their limits only by referenced entries.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <utlist.h>

#include "cuda_abi.h"
#include "gdrcache_int.h"

/* Buffer ids that got SYNC_MEMOPS (or proved VMM), so it is set once per allocation. */
struct gdr_sync_set {
	uint64_t id;
	uint8_t kind;
	UT_hash_handle hh;
};

#define ATTR_FIELDS_ALL                                                                         \
	(GDR_CACHE_ATTR_MAX_BYTES | GDR_CACHE_ATTR_MAX_ENTRIES | GDR_CACHE_ATTR_MAX_PIN_BYTES |   \
	 GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE | GDR_CACHE_ATTR_LOG_LEVEL)

static int apply_attr(struct gdr_config *cfg, const struct gdr_cache_attr *a)
{
	uint64_t m = a->field_mask;

	if (m & ~(uint64_t)ATTR_FIELDS_ALL) {
		gdr_err("unknown attribute field bits %#llx",
			(unsigned long long)(m & ~(uint64_t)ATTR_FIELDS_ALL));
		return -EINVAL;
	}
	if (a->reserved) {
		gdr_err("attribute reserved field is not zero");
		return -EINVAL;
	}
	if (((m & GDR_CACHE_ATTR_MAX_BYTES) && !a->max_bytes) ||
	    ((m & GDR_CACHE_ATTR_MAX_ENTRIES) && !a->max_entries) ||
	    ((m & GDR_CACHE_ATTR_MAX_PIN_BYTES) && !a->max_pin_bytes)) {
		gdr_err("a limit attribute is zero");
		return -EINVAL;
	}
	if ((m & GDR_CACHE_ATTR_BACKEND) &&
	    (a->backend < GDR_BACKEND_AUTO || a->backend > GDR_BACKEND_PEERMEM)) {
		gdr_err("unknown backend %d", a->backend);
		return -EINVAL;
	}
	if ((m & GDR_CACHE_ATTR_VALIDATE) && !gdr_validator_for(a->validate)) {
		gdr_err("unknown validation mode %d", a->validate);
		return -EINVAL;
	}
	if ((m & GDR_CACHE_ATTR_LOG_LEVEL) &&
	    (a->log_level < GDR_LOG_NONE || a->log_level > GDR_LOG_DEBUG)) {
		gdr_err("unknown log level %d", a->log_level);
		return -EINVAL;
	}
	if (m & GDR_CACHE_ATTR_MAX_BYTES)
		cfg->max_bytes = a->max_bytes;
	if (m & GDR_CACHE_ATTR_MAX_ENTRIES)
		cfg->max_entries = a->max_entries;
	if (m & GDR_CACHE_ATTR_MAX_PIN_BYTES)
		cfg->max_pin_bytes = a->max_pin_bytes;
	if (m & GDR_CACHE_ATTR_BACKEND)
		cfg->backend = a->backend;
	if (m & GDR_CACHE_ATTR_VALIDATE)
		cfg->validate = a->validate;
	if (m & GDR_CACHE_ATTR_LOG_LEVEL)
		cfg->log_level = a->log_level;
	return 0;
}

/* A hit holds the lock for well under a microsecond: spinning a little before sleeping beats a
 * futex hand-off when many threads hit at once (bench/RESULTS.md). */
static void lock_init(pthread_mutex_t *lock)
{
	pthread_mutexattr_t ma;

	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
	pthread_mutex_init(lock, &ma);
	pthread_mutexattr_destroy(&ma);
}

int gdr_cache_create_ops(const struct gdr_cache_attr *attr, const struct gdr_backend_ops *ops,
			 struct gdr_cache **out)
{
	struct gdr_config cfg;
	struct gdr_cache *c;
	const char *why = "";
	int rc;

	if (!out) {
		gdr_err("NULL cache pointer");
		return -EINVAL;
	}
	*out = NULL;
	cfg = *gdr_config_get();
	if (attr) {
		rc = apply_attr(&cfg, attr);
		if (rc)
			return rc;
		if (attr->field_mask & GDR_CACHE_ATTR_LOG_LEVEL)
			__atomic_store_n(&gdr_log_level, cfg.log_level, __ATOMIC_RELAXED);
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->cfg = cfg;
	c->validator = gdr_validator_for(cfg.validate);
	c->cuda_ok = gdr_cuda_load() == 0;
	rc = ops ? ops->open(&cfg, &c->backend, &why) : gdr_backend_select(&cfg, &c->backend);
	if (rc) {
		if (ops)
			gdr_err("backend %s unavailable: %s", ops->name, why);
		free(c);
		return rc;
	}
	lock_init(&c->lock);
	gdr_stats_track(c);
	*out = c;
	return 0;
}

GDR_EXPORT int gdr_cache_create(const struct gdr_cache_attr *attr, struct gdr_cache **cache)
{
	return gdr_cache_create_ops(attr, NULL, cache);
}

/* ---- region records ------------------------------------------------------------------------- */

static void quarantine(struct gdr_cache *c, struct gdr_region *r)
{
	/* A released record stays readable (magic DEAD) a while, so a late second gdr_dereg is
	 * refused instead of touching freed memory. */
	r->magic = GDR_REGION_DEAD;
	__atomic_store_n(&r->refs, 0, __ATOMIC_RELAXED);
	if (c->qlen == GDR_QUARANTINE) {
		free(c->quarantine[c->qhead]);
		c->quarantine[c->qhead] = r;
		c->qhead = (c->qhead + 1) % GDR_QUARANTINE;
	} else {
		c->quarantine[(c->qhead + c->qlen++) % GDR_QUARANTINE] = r;
	}
}

/* A new registration record (no reference yet). */
static struct gdr_region *region_new(struct gdr_cache *c, struct gdr_entry *e, struct ibv_pd *pd,
				     int access, uint8_t kind, uint64_t buffer_id)
{
	struct gdr_region *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->magic = GDR_REGION_LIVE;
	r->cache = c;
	r->entry = e;
	r->pd = pd;
	r->access = access;
	r->kind = kind;
	r->buffer_id = buffer_id;
	return r;
}

/* ---- SYNC_MEMOPS, once per allocation ------------------------------------------------------ */

static void synced_forget(struct gdr_cache *c, uint64_t id)
{
	struct gdr_sync_set *s;

	HASH_FIND(hh, c->synced, &id, sizeof(id), s);
	if (s) {
		HASH_DEL(c->synced, s);
		free(s);
		c->nsynced--;
	}
}

static int sync_memops(struct gdr_cache *c, struct gdr_tag *t)
{
	struct gdr_sync_set *s;
	int rc;

	HASH_FIND(hh, c->synced, &t->buffer_id, sizeof(t->buffer_id), s);
	if (s) {
		t->kind = s->kind;
		return 0;
	}
	rc = gdr_cuda_set_sync_memops(t->start);
	if (!rc) {
		t->kind = GDR_MEM_DEVICE;
		c->st.sync_memops_set++;
	} else if (rc == -EOPNOTSUPP) {
		/* VMM memory (cuMemMap) refuses the pointer attribute: FACTS.md. It is still device
		 * memory; the context-wide flag gives the same guarantee. */
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
				     rc == -EOPNOTSUPP ? "driver lacks cuCtxSetFlags" :
				     rc == -ENXIO ? "no current context" : "cuCtxSetFlags failed");
		}
	} else {
		c->st.fail_cuda++;
		return rc;
	}
	s = malloc(sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->id = t->buffer_id;
	s->kind = t->kind;
	HASH_ADD(hh, c->synced, id, sizeof(s->id), s);
	/* Bounded: forget the oldest ids (insertion order); repeating SYNC_MEMOPS is harmless. */
	if (++c->nsynced > 4 * c->cfg.max_entries + 1024) {
		struct gdr_sync_set *old = c->synced;

		HASH_DEL(c->synced, old);
		free(old);
		c->nsynced--;
	}
	return 0;
}

/* ---- entries -------------------------------------------------------------------------------
 * Reference counts: an entry in the index holds one reference of its own, and every registration
 * handed out holds one more. References are taken only under c->lock; gdr_dereg drops its own
 * without the lock, and whoever drops the last one (necessarily of an entry already out of the
 * index) destroys the entry under the lock. So, under the lock, an indexed entry whose count is 1
 * is held by nobody and nobody can take it: it may be evicted.
 */

static uint32_t entry_refs(const struct gdr_entry *e)
{
	return __atomic_load_n(&e->refs, __ATOMIC_ACQUIRE);
}

/* Whether the cache holds more than its limits; read by gdr_dereg without the lock. */
static void limits_update(struct gdr_cache *c)
{
	__atomic_store_n(&c->over_limit, c->st.pinned_bytes > c->cfg.max_bytes ||
			 c->st.entries > c->cfg.max_entries, __ATOMIC_RELAXED);
}

/* Unpin and free an entry nobody holds and the index no longer lists. */
static void entry_destroy(struct gdr_cache *c, struct gdr_entry *e)
{
	struct gdr_mrec *m, *mt;
	struct gdr_region *r, *rt;

	if (e->detached)
		c->st.detached--;
	LL_FOREACH_SAFE(e->mrecs, m, mt) {
		gdr_verbs_dereg(m->mr);
		free(m);
	}
	LL_FOREACH_SAFE(e->regions, r, rt)
		quarantine(c, r);
	c->backend->ops->unpin(c->backend, &e->pin);
	c->st.unpins++;
	c->st.entries--;
	gdr_stats_pinned(c, -(int64_t)e->len);
	free(e->tags);
	free(e);
}

/* Take an indexed entry out of service: unpinned now if nobody holds it, else "detached" until its
 * last holder lets go. */
static void entry_drop(struct gdr_cache *c, struct gdr_entry *e)
{
	gdr_index_remove(&c->index, e);
	DL_DELETE(c->lru, e);
	if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
		entry_destroy(c, e);
	} else {
		e->detached = true; /* read by entry_destroy, under this lock */
		c->st.detached++;
	}
}

static void entry_stale(struct gdr_cache *c, struct gdr_entry *e)
{
	c->st.stale++;
	for (uint32_t i = 0; i < e->ntags; i++)
		synced_forget(c, e->tags[i].buffer_id);
	gdr_dbg("entry [%#llx, +%llu) is stale: dropped", (unsigned long long)e->base,
		(unsigned long long)e->len);
	entry_drop(c, e);
}

/* Evict least recently used entries nobody holds while over the limits, or until `need` bytes
 * have been freed. Returns the number evicted. */
static int evict(struct gdr_cache *c, uint64_t need)
{
	struct gdr_entry *e, *tmp;
	uint64_t freed = 0;
	int n = 0;

	DL_FOREACH_SAFE(c->lru, e, tmp) {
		if (c->st.pinned_bytes <= c->cfg.max_bytes && c->st.entries <= c->cfg.max_entries &&
		    freed >= need)
			break;
		if (entry_refs(e) > 1)
			continue;
		freed += e->len;
		c->st.evictions++;
		entry_drop(c, e);
		n++;
	}
	limits_update(c);
	return n;
}

/* The kernel saw the memory freed: stale, proven without asking the CUDA driver. Lock-free. */
static bool entry_revoked(struct gdr_cache *c, const struct gdr_entry *e)
{
	return c->backend->ops->revoked(c->backend, &e->pin);
}

/* Validate the tags of e that overlap [a, a+len), or all of them (all = true).
 * 0: valid and covering [a, a+len); 1: valid but with a gap; -ESTALE: some tag is stale. */
static int entry_check(struct gdr_cache *c, struct gdr_entry *e, uint64_t a, uint64_t len, bool all)
{
	uint64_t covered = a, end = a + len;

	if (entry_revoked(c, e)) {
		c->st.revoked++;
		return -ESTALE;
	}
	for (uint32_t i = 0; i < e->ntags; i++) {
		const struct gdr_tag *t = &e->tags[i];
		uint64_t tend = t->start + t->size;
		bool overlaps = t->start < end && tend > a;

		if (!overlaps && !all)
			continue;
		c->st.tag_checks++;
		if (c->validator->check(c, t))
			return -ESTALE;
		if (overlaps && t->start <= covered && tend > covered)
			covered = tend;
	}
	return covered >= end ? 0 : 1;
}

/* Copy the tags of e that overlap [a, a+len) for validation outside the lock. Returns whether
 * they cover the whole range. */
static bool entry_cover(const struct gdr_entry *e, uint64_t a, uint64_t len, struct gdr_tag *out,
			uint32_t *n)
{
	uint64_t covered = a, end = a + len;

	*n = 0;
	for (uint32_t i = 0; i < e->ntags && *n < GDR_MAX_TAGS; i++) {
		const struct gdr_tag *t = &e->tags[i];
		uint64_t tend = t->start + t->size;

		if (t->start >= end || tend <= a)
			continue;
		out[(*n)++] = *t;
		if (t->start <= covered && tend > covered)
			covered = tend;
	}
	return covered >= end;
}

static const struct gdr_tag *entry_tag_at(const struct gdr_entry *e, uint64_t a)
{
	for (uint32_t i = 0; i < e->ntags; i++)
		if (e->tags[i].start <= a && a < e->tags[i].start + e->tags[i].size)
			return &e->tags[i];
	return NULL;
}

/* Add tags to e, keeping them sorted by start and unique by buffer id. */
static int entry_add_tags(struct gdr_entry *e, const struct gdr_tag *t, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i;

		for (i = 0; i < e->ntags; i++)
			if (e->tags[i].buffer_id == t[k].buffer_id)
				break;
		if (i < e->ntags)
			continue;
		if (e->ntags == e->tags_cap) {
			uint32_t cap = e->tags_cap ? e->tags_cap * 2 : 1;
			struct gdr_tag *v = realloc(e->tags, cap * sizeof(*v));

			if (!v)
				return -ENOMEM;
			e->tags = v;
			e->tags_cap = cap;
		}
		for (i = e->ntags; i > 0 && e->tags[i - 1].start > t[k].start; i--)
			e->tags[i] = e->tags[i - 1];
		e->tags[i] = t[k];
		e->ntags++;
	}
	return 0;
}

/* Hand out a reference on e for (pd, access), making its MR if needed. */
static int entry_take(struct gdr_cache *c, struct gdr_entry *e, struct ibv_pd *pd, int access,
		      uint64_t a, struct gdr_region **out)
{
	const struct gdr_tag *t = entry_tag_at(e, a);
	uint64_t id = t ? t->buffer_id : 0;
	struct gdr_region *r;
	struct gdr_mrec *m = NULL;
	int rc;

	if (!pd)
		access = 0;
	LL_FOREACH(e->regions, r)
		if (r->pd == pd && r->access == access && r->buffer_id == id)
			break;
	/* Hold e first: making the MR may evict, and must not evict e. Most recently used now. */
	__atomic_fetch_add(&e->refs, 1, __ATOMIC_ACQ_REL);
	DL_DELETE(c->lru, e);
	DL_APPEND(c->lru, e);
	if (!r) {
		if (pd) {
			LL_FOREACH(e->mrecs, m)
				if (m->pd == pd && m->access == access)
					break;
		}
		if (pd && !m) {
			m = calloc(1, sizeof(*m));
			if (!m) {
				rc = -ENOMEM;
				goto err_put;
			}
			for (;;) {
				rc = c->backend->ops->reg_mr(c->backend, &e->pin, pd, access, &m->mr);
				if ((rc != -ENOMEM && rc != -ENOSPC) || !evict(c, e->len))
					break;
				c->st.fail_pin_retried++;
			}
			if (rc) {
				c->st.fail_mr++;
				gdr_err("NIC registration of [%#llx, +%llu) failed: %d",
					(unsigned long long)e->base, (unsigned long long)e->len, rc);
				free(m);
				goto err_put;
			}
			m->pd = pd;
			m->access = access;
			LL_PREPEND(e->mrecs, m);
		}
		r = region_new(c, e, pd, access, t ? t->kind : GDR_MEM_DEVICE, id);
		if (!r) {
			rc = -ENOMEM;
			goto err_put;
		}
		r->mr = m ? m->mr : NULL;
		LL_PREPEND(e->regions, r);
	}
	__atomic_fetch_add(&r->refs, 1, __ATOMIC_RELAXED);
	*out = r;
	return 0;

err_put:
	__atomic_fetch_sub(&e->refs, 1, __ATOMIC_ACQ_REL); /* the index still holds it */
	return rc;
}

/* ---- classification and pinning --------------------------------------------------------------- */

/* Walk the CUDA allocations under [a, a+len). 0 with tags; 1: host memory (or unknown to CUDA);
 * -EOPNOTSUPP: managed; -EINVAL: the range mixes GPU and other memory or spans too many pieces. */
static int classify(struct gdr_cache *c, uint64_t a, uint64_t len, struct gdr_tag *tags,
		    uint32_t *ntags)
{
	uint64_t q = a, end = a + len;
	uint32_t n = 0;

	while (q < end) {
		struct gdr_ptr_info pi;
		int rc = gdr_cuda_classify(q, &pi);

		if (rc) {
			c->st.fail_cuda++;
			return rc;
		}
		if (pi.managed) {
			c->st.refused_managed++;
			gdr_warn("%#llx is CUDA managed memory: GPUDirect RDMA does not support it",
				 (unsigned long long)q);
			return -EOPNOTSUPP;
		}
		if (pi.mem_type != GDR_CU_MEMORYTYPE_DEVICE) {
			if (q == a)
				return 1;
			gdr_err("[%#llx, +%llu) mixes GPU memory and other memory",
				(unsigned long long)a, (unsigned long long)len);
			return -EINVAL;
		}
		if (!pi.size || pi.start > q || pi.start + pi.size <= q) {
			c->st.fail_cuda++;
			gdr_err("CUDA reports allocation [%#llx, +%llu) for %#llx",
				(unsigned long long)pi.start, (unsigned long long)pi.size,
				(unsigned long long)q);
			return -EIO;
		}
		if (n == GDR_MAX_TAGS) {
			gdr_err("[%#llx, +%llu) spans more than %d GPU allocations",
				(unsigned long long)a, (unsigned long long)len, GDR_MAX_TAGS);
			return -EINVAL;
		}
		tags[n++] = (struct gdr_tag){ .start = pi.start, .size = pi.size,
					      .buffer_id = pi.buffer_id, .kind = GDR_MEM_DEVICE,
					      .device = pi.device };
		q = pi.start + pi.size;
	}
	*ntags = n;
	return 0;
}

/* Pin [base, base+len), evicting unreferenced entries and retrying while the backend is short of
 * pinnable space (BAR exhaustion: -ENOMEM / -ENOSPC). */
static int pin_retry(struct gdr_cache *c, struct gdr_pin *pin)
{
	int rc;

	for (;;) {
		rc = c->backend->ops->pin(c->backend, pin);
		if (rc != -ENOMEM && rc != -ENOSPC)
			break;
		if (!evict(c, pin->len))
			break;
		c->st.fail_pin_retried++;
	}
	if (rc) {
		c->st.fail_pin++;
		gdr_err("pinning [%#llx, +%llu) failed: %d", (unsigned long long)pin->base,
			(unsigned long long)pin->len, rc);
		return rc;
	}
	c->st.pins++;
	return 0;
}

/* A miss: pin a new entry for tags, taking over the entries it overlaps. */
static int entry_create(struct gdr_cache *c, uint64_t a, uint64_t len, const struct gdr_tag *tags,
			uint32_t ntags, struct gdr_entry **out)
{
	uint64_t lo = tags[0].start, hi = tags[ntags - 1].start + tags[ntags - 1].size;
	uint64_t base, end;
	struct gdr_entry *e;
	size_t i;
	int rc;

	/* The whole allocation(s) up to the cap, else the requested range; 64 KiB-aligned. */
	if (hi - lo <= c->cfg.max_pin_bytes) {
		base = GDR_ALIGN_DOWN(lo);
		end = GDR_ALIGN_UP(hi);
	} else {
		base = GDR_ALIGN_DOWN(a);
		end = GDR_ALIGN_UP(a + len);
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	rc = entry_add_tags(e, tags, ntags);
	if (rc)
		goto err_free;

	/* Entries sharing pages with the new range: a valid one is merged into it (its range and
	 * tags), a stale one dropped; either way it leaves the index first, so no page is pinned
	 * twice by indexed entries. */
	i = gdr_index_lower(&c->index, base);
	while (i < c->index.n && c->index.v[i]->base < end) {
		struct gdr_entry *o = c->index.v[i];

		if (entry_check(c, o, o->base, o->len, true) < 0) {
			entry_stale(c, o);
			continue;
		}
		rc = entry_add_tags(e, o->tags, o->ntags);
		if (rc)
			goto err_free;
		if (o->base < base)
			base = o->base;
		if (o->base + o->len > end)
			end = o->base + o->len;
		c->st.overlap_merged++;
		entry_drop(c, o);
		i = gdr_index_lower(&c->index, base);
	}

	e->base = e->pin.base = base;
	e->len = e->pin.len = end - base;
	e->pin.dmabuf_fd = -1;
	e->pin.device = tags[0].device;
	rc = pin_retry(c, &e->pin);
	if (rc)
		goto err_free;
	rc = gdr_index_insert(&c->index, e);
	if (rc) {
		c->backend->ops->unpin(c->backend, &e->pin);
		goto err_free;
	}
	__atomic_store_n(&e->refs, 1, __ATOMIC_RELAXED); /* the index's own reference */
	DL_APPEND(c->lru, e);
	c->st.entries++;
	gdr_stats_pinned(c, (int64_t)e->len);
	*out = e;
	return 0;

err_free:
	free(e->tags);
	free(e);
	return rc;
}

static int reg_host(struct gdr_cache *c, struct ibv_pd *pd, uint64_t a, uint64_t len, int access,
		    struct gdr_region **out)
{
	struct gdr_region *r;
	int rc;

	if (!pd) {
		c->st.fail_input++;
		gdr_err("%#llx is not GPU memory%s and no PD was given: nothing to register",
			(unsigned long long)a, c->cuda_ok ? "" : " (no CUDA driver)");
		return c->cuda_ok ? -EINVAL : -ENODEV;
	}
	r = region_new(c, NULL, pd, access, GDR_MEM_HOST, 0);
	if (!r)
		return -ENOMEM;
	rc = gdr_verbs_reg(pd, (void *)(uintptr_t)a, len, a, access, &r->mr);
	if (rc) {
		c->st.fail_mr++;
		free(r);
		return rc;
	}
	__atomic_store_n(&r->refs, 1, __ATOMIC_RELAXED);
	c->st.passthrough++;
	c->nhost++;
	*out = r;
	return 0;
}

/* Returned by reg_locked: a reference is taken on a cached entry whose tags (copied to check[])
 * the caller must validate after dropping the lock. */
#define GDR_VALIDATE_UNLOCKED 1

static int reg_locked(struct gdr_cache *c, struct ibv_pd *pd, uint64_t a, uint64_t len, int access,
		      struct gdr_region **out, struct gdr_tag *check, uint32_t *ncheck)
{
	struct gdr_tag tags[GDR_MAX_TAGS];
	struct gdr_entry *e = gdr_index_find(&c->index, a);
	uint32_t ntags = 0;
	int rc;

	if (e && a + len <= e->base + e->len && check && entry_cover(e, a, len, check, ncheck)) {
		/* The common hit: the driver is asked outside the lock (it serialises the query
		 * anyway: FACTS.md), holding a reference so that e cannot go away meanwhile. */
		rc = entry_take(c, e, pd, access, a, out);
		if (rc)
			return rc;
		c->st.hits++;
		c->st.tag_checks += *ncheck;
		return GDR_VALIDATE_UNLOCKED;
	}
	if (e && a + len <= e->base + e->len) {
		rc = entry_check(c, e, a, len, false);
		if (rc == 0) {
			c->st.hits++;
			return entry_take(c, e, pd, access, a, out);
		}
		if (rc < 0) {
			entry_stale(c, e);
			e = NULL;
		}
	} else {
		e = NULL;
	}

	if (!c->cuda_ok)
		return reg_host(c, pd, a, len, access, out);
	rc = classify(c, a, len, tags, &ntags);
	if (rc == 1)
		return reg_host(c, pd, a, len, access, out);
	if (rc)
		return rc;
	if (!pd && !c->backend->ops->pins_without_pd) {
		c->st.fail_input++;
		gdr_err("backend %s registers GPU memory only with a PD", c->backend->ops->name);
		return -EOPNOTSUPP;
	}
	for (uint32_t i = 0; i < ntags; i++) {
		rc = sync_memops(c, &tags[i]);
		if (rc)
			return rc;
	}

	/* Inside a pinned range but partly outside its known allocations: another allocation that
	 * shares the entry's pages. If every allocation the entry already serves is still alive, the
	 * pinned pages have stayed what they were, so the entry serves the new one too. */
	if (e) {
		if (entry_check(c, e, e->base, e->len, true) < 0) {
			entry_stale(c, e);
		} else {
			rc = entry_add_tags(e, tags, ntags);
			if (rc)
				return rc;
			c->st.hits++;
			return entry_take(c, e, pd, access, a, out);
		}
	}

	c->st.misses++;
	rc = entry_create(c, a, len, tags, ntags, &e);
	if (rc)
		return rc;
	/* If the MR cannot be made the pin stays cached, valid, for the next caller. */
	return entry_take(c, e, pd, access, a, out);
}

/* Release a host registration (passed through, not cached); under c->lock. */
static void host_put(struct gdr_cache *c, struct gdr_region *r)
{
	gdr_verbs_dereg(r->mr);
	c->nhost--;
	quarantine(c, r);
}

/* Drop one reference of a cached registration, without c->lock. Returns whether it was the entry's
 * last reference: the entry is then detached and the caller must destroy it under the lock. After
 * the drop nothing of r or its entry may be touched otherwise: another thread may evict it. */
static bool region_put(struct gdr_region *r)
{
	struct gdr_entry *e = r->entry;

	__atomic_fetch_sub(&r->refs, 1, __ATOMIC_RELAXED);
	return __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0;
}

GDR_EXPORT int gdr_reg(struct gdr_cache *c, struct ibv_pd *pd, void *addr, size_t len, int access,
		       struct gdr_region **region)
{
	struct gdr_tag check[GDR_MAX_TAGS];
	uint64_t a = (uintptr_t)addr;
	struct gdr_entry *e;
	uint32_t ncheck = 0;
	bool revoked;
	int rc;

	if (!c || !region) {
		gdr_err("NULL %s", c ? "region pointer" : "cache");
		return -EINVAL;
	}
	*region = NULL;
	if (!len || a + len < a) {
		pthread_mutex_lock(&c->lock);
		c->st.fail_input++;
		pthread_mutex_unlock(&c->lock);
		gdr_err("bad range [%p, +%zu): %s", addr, len, len ? "wraps around" : "zero length");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->lock);
	rc = reg_locked(c, pd, a, len, access, region, check, &ncheck);
	if (!rc)
		evict(c, 0);
	pthread_mutex_unlock(&c->lock);
	if (rc != GDR_VALIDATE_UNLOCKED)
		return rc;

	revoked = entry_revoked(c, (*region)->entry);
	if (!revoked) {
		uint32_t i = 0;

		while (i < ncheck && !c->validator->check(c, &check[i]))
			i++;
		if (i == ncheck)
			return 0;
	}
	/* Stale after all: give the reference back, retire the entry, and take the locked path,
	 * which validates (and pins afresh) under the lock. */
	pthread_mutex_lock(&c->lock);
	c->st.hits--;
	c->st.revoked += revoked;
	e = (*region)->entry;
	if (e->in_index)
		entry_stale(c, e); /* detached: our reference keeps it */
	if (region_put(*region))
		entry_destroy(c, e);
	*region = NULL;
	rc = reg_locked(c, pd, a, len, access, region, NULL, NULL);
	if (!rc)
		evict(c, 0);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

GDR_EXPORT int gdr_dereg(struct gdr_region *r)
{
	struct gdr_cache *c;
	struct gdr_entry *e;
	uint32_t n;

	if (!r) {
		gdr_err("NULL region");
		return -EINVAL;
	}
	if (r->magic != GDR_REGION_LIVE) {
		gdr_err("region %p was already released (double gdr_dereg?)", (void *)r);
		return -EINVAL;
	}
	c = r->cache;
	e = r->entry;
	if (!e) {
		pthread_mutex_lock(&c->lock);
		host_put(c, r);
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	/* The common release takes no lock: one reference less on the record and the entry. */
	n = __atomic_load_n(&r->refs, __ATOMIC_RELAXED);
	do {
		if (!n) {
			pthread_mutex_lock(&c->lock);
			c->st.fail_input++;
			pthread_mutex_unlock(&c->lock);
			gdr_err("region %p holds no reference: double gdr_dereg", (void *)r);
			return -EINVAL;
		}
	} while (!__atomic_compare_exchange_n(&r->refs, &n, n - 1, true, __ATOMIC_RELAXED,
					      __ATOMIC_RELAXED));
	if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
		pthread_mutex_lock(&c->lock);
		entry_destroy(c, e); /* detached, and its last holder is gone */
		limits_update(c);
		pthread_mutex_unlock(&c->lock);
	} else if (__atomic_load_n(&c->over_limit, __ATOMIC_RELAXED)) {
		pthread_mutex_lock(&c->lock);
		evict(c, 0); /* what this release made evictable */
		pthread_mutex_unlock(&c->lock);
	}
	return 0;
}

GDR_EXPORT int gdr_cache_flush(struct gdr_cache *c)
{
	struct gdr_entry *e, *tmp;
	int n = 0;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	DL_FOREACH_SAFE(c->lru, e, tmp) {
		if (entry_refs(e) == 1) {
			entry_drop(c, e);
			n++;
		}
	}
	limits_update(c);
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* Whether a record of e for pd is held by a registration. Under c->lock. */
static bool entry_pd_held(const struct gdr_entry *e, const struct ibv_pd *pd)
{
	const struct gdr_region *r;

	LL_FOREACH(e->regions, r)
		if (r->pd == pd && __atomic_load_n(&r->refs, __ATOMIC_RELAXED))
			return true;
	return false;
}

/* Deregister e's MRs for pd and retire its records for pd. Under c->lock; nobody holds them. */
static void entry_release_pd(struct gdr_cache *c, struct gdr_entry *e, const struct ibv_pd *pd)
{
	struct gdr_region *r, *rt;
	struct gdr_mrec *m, *mt;

	LL_FOREACH_SAFE(e->regions, r, rt) {
		if (r->pd == pd) {
			LL_DELETE(e->regions, r);
			quarantine(c, r);
		}
	}
	LL_FOREACH_SAFE(e->mrecs, m, mt) {
		if (m->pd == pd) {
			LL_DELETE(e->mrecs, m);
			gdr_verbs_dereg(m->mr);
			free(m);
		}
	}
}

GDR_EXPORT int gdr_cache_release_pd(struct gdr_cache *c, struct ibv_pd *pd)
{
	struct gdr_entry *e;
	bool busy = false;

	if (!c || !pd) {
		gdr_err("NULL %s", c ? "pd" : "cache");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->lock);
	DL_FOREACH(c->lru, e) {
		if (entry_pd_held(e, pd))
			busy = true;
		else
			entry_release_pd(c, e, pd);
	}
	pthread_mutex_unlock(&c->lock);
	if (busy)
		gdr_warn("pd %p still has registrations held: their MRs stay", (void *)pd);
	return busy ? -EBUSY : 0;
}

GDR_EXPORT int gdr_cache_destroy(struct gdr_cache *c)
{
	struct gdr_sync_set *s, *st;
	uint64_t held = 0;

	if (!c) {
		gdr_err("NULL cache");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->index.n; i++)
		held += entry_refs(c->index.v[i]) - 1;
	if (held || c->nhost || c->st.detached) {
		pthread_mutex_unlock(&c->lock);
		gdr_err("cache %p still has registrations held: release them first", (void *)c);
		return -EBUSY;
	}
	while (c->index.n)
		entry_drop(c, c->index.v[0]);
	pthread_mutex_unlock(&c->lock);

	gdr_stats_untrack(c);
	c->backend->ops->close(c->backend);
	HASH_ITER(hh, c->synced, s, st) {
		HASH_DEL(c->synced, s);
		free(s);
	}
	for (unsigned i = 0; i < c->qlen; i++)
		free(c->quarantine[(c->qhead + i) % GDR_QUARANTINE]);
	gdr_index_free(&c->index);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return 0;
}

GDR_EXPORT int gdr_cache_get_stats(struct gdr_cache *c, struct gdr_cache_stats *stats)
{
	if (!c || !stats)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	*stats = c->st;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

GDR_EXPORT int gdr_cache_backend(const struct gdr_cache *c, enum gdr_backend *backend)
{
	if (!c || !backend)
		return -EINVAL;
	*backend = c->backend->ops->id;
	return 0;
}

GDR_EXPORT uint32_t gdr_cache_version(void)
{
	return GDR_VERSION_NUM(GDR_VERSION_MAJOR, GDR_VERSION_MINOR, GDR_VERSION_PATCH);
}
