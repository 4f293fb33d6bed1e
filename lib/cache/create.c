/* SPDX-License-Identifier: MIT */
/*
 * The cache: lookup, validation on reuse, pinning with eviction and retry, lazy unpinning under
 * limits, holds and statistics.
 *
 * Two paths. The hit path takes no lock and writes no cache line that other threads' hits write:
 * it searches the index's hash (index.c: O(1), no branch on the key's bits that a random address
 * makes unpredictable), finds the registration record of the entry for
 * (pd, access, allocation), adds one to its own thread's hold counter for the record (thread.c) and
 * validates: in mode "events" with no driver call (the free events were applied before, and
 * gdrcache.ko's revocation page is one load), in mode "tag" with one BUFFER_ID query. Everything
 * else (misses, stale entries, new records, pending free events, eviction) takes the cache's mutex.
 *
 * Retiring an entry (eviction, staleness, merge, flush) marks it dying and waits out a grace period
 * (thread.c) before summing its holds: a lookup either saw it alive and its hold is counted, or sees
 * it dying and takes the locked path. Entries retired together share one grace period (a flush of
 * N entries, or a context destroyed, costs one, not N). A held entry that must leave the index is
 * "detached": out of the index, pinned until it is no longer held, never handed out again; a
 * release races the detachment safely (a further grace period, then the holds are summed again).
 * Memory a lookup may still read (outgrown hash tables, retired entries) is freed after a later
 * grace period, batched (reclaim); registration records are never freed while the cache lives, but reused late (a late
 * gdr_dereg of a released region reads a record, never freed memory).
 *
 * Invariants, under c->lock:
 *  - indexed entries never overlap, so no 64 KiB page is pinned twice by indexed entries;
 *  - the LRU list holds exactly the indexed entries; hits mark them used, eviction gives used
 *    entries a second chance (CLOCK) instead of the hit moving them (a write every hit would share);
 *  - after every call, pinned bytes and entries exceed their limits only by held entries;
 *  - in mode events, no entry is handed out before every free event published so far is applied.
 *
 * This file: attributes and limits, create and destroy, statistics. Records and grace periods:
 * record.c; entries and eviction: entry.c; the miss path: miss.c; the two paths of a registration:
 * reg.c; free events: apply.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <utlist.h>

#include "cache/cache.h"
#include "cuda/cuda.h"
#include "intercept/events.h"

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

struct limits_set {
	bool max_bytes, max_entries, max_pin_bytes;
};

static void limit_set_by_env(const char *name, const char *form, const char *value,
			     const char *dflt, bool set, void *arg)
{
	struct limits_set *ls = arg;

	(void)form, (void)value, (void)dflt;
	if (!set)
		return;
	if (!strcmp(name, "GDRCACHE_MAX_BYTES"))
		ls->max_bytes = true;
	else if (!strcmp(name, "GDRCACHE_MAX_ENTRIES"))
		ls->max_entries = true;
	else if (!strcmp(name, "GDRCACHE_MAX_PIN_BYTES"))
		ls->max_pin_bytes = true;
}

/* The limits neither the environment nor the attributes set, from the devices: unreferenced pins
 * up to half of what the GPUs can have pinned (the smaller of BAR1 and memory: an 80 GB H100 with
 * 128 GiB of BAR1 gets 40 GiB), an entry per MiB of that (at least the fixed default), a whole
 * allocation pinned up to an eighth of it. Without device facts the fixed defaults stay. Writes
 * what they came from into why. */
static void derive_limits(struct gdr_config *cfg, uint64_t attr_mask, char *why, size_t n)
{
	const struct gdr_cuda_devices *dev = gdr_cuda_devices();
	struct limits_set ls = { 0 };
	uint64_t pinnable;

	snprintf(why, n, "fixed defaults");
	pinnable = dev->bar1 && dev->mem ? (dev->bar1 < dev->mem ? dev->bar1 : dev->mem) :
		dev->bar1 ? dev->bar1 : dev->mem;
	if (!pinnable)
		return;
	gdr_config_each(limit_set_by_env, &ls);
	if (!ls.max_bytes && !(attr_mask & GDR_CACHE_ATTR_MAX_BYTES))
		cfg->max_bytes = pinnable / 2;
	if (!ls.max_entries && !(attr_mask & GDR_CACHE_ATTR_MAX_ENTRIES)) {
		uint64_t e = cfg->max_bytes >> 20;

		if (e > cfg->max_entries)
			cfg->max_entries = e < GDR_SLOT_MAX / 2 ? e : GDR_SLOT_MAX / 2;
	}
	if (!ls.max_pin_bytes && !(attr_mask & GDR_CACHE_ATTR_MAX_PIN_BYTES) &&
	    cfg->max_bytes / 8 > cfg->max_pin_bytes)
		cfg->max_pin_bytes = cfg->max_bytes / 8;
	snprintf(why, n, "from the devices (%s)", dev->why);
}

/* Resolve the validation mode: events only where the interception is proven in this process. */
static int choose_validation(struct gdr_cache *c)
{
	const char *why = "no CUDA driver";
	int mode = c->cfg.validate, rc = -ENODEV;
	bool events = false;

	if (mode != GDR_VALIDATE_TAG) {
		if (c->cuda_ok)
			rc = gdr_events_prober(&why);
		if (!rc || (!c->cuda_ok && mode == GDR_VALIDATE_EVENTS)) {
			events = true;
			gdr_log_once(GDR_LOG_INFO, "validation by free events: hits make no driver call");
		} else if (mode == GDR_VALIDATE_EVENTS) {
			gdr_err("validation mode events is unavailable: %s", why);
			return -EOPNOTSUPP;
		} else {
			gdr_log_once(GDR_LOG_WARN, "free events unavailable (%s): hits are validated "
				     "by BUFFER_ID queries (about 5 M/s for the whole process)", why);
		}
	}
	c->validator = gdr_validator_for(events ? GDR_VALIDATE_EVENTS : GDR_VALIDATE_TAG);
	c->st.validate_mode = (uint64_t)c->validator->mode;
	c->ev_next = gdr_events_head();
	return 0;
}

int gdr_cache_create_ops(const struct gdr_cache_attr *attr, const struct gdr_backend_ops *ops,
			 struct gdr_cache **out)
{
	struct gdr_config cfg;
	struct gdr_cache *c;
	const char *why = "";
	char limits_why[200] = "fixed defaults";
	int rc;

	if (!out) {
		gdr_err("NULL cache pointer");
		return -EINVAL;
	}
	*out = NULL;
	cfg = *gdr_config_get();
	if (cfg.bad) {
		gdr_err("%s is malformed (see above): no cache is created", cfg.bad);
		return -EINVAL;
	}
	if (attr) {
		rc = apply_attr(&cfg, attr);
		if (rc)
			return rc;
		if (attr->field_mask & GDR_CACHE_ATTR_LOG_LEVEL)
			__atomic_store_n(&gdr_log_level, cfg.log_level, __ATOMIC_RELAXED);
	}
	if (posix_memalign((void **)&c, 64, sizeof(*c)))
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	c->cfg = cfg;
	c->cuda_ok = gdr_cuda_load() == 0;
	if (c->cuda_ok)
		derive_limits(&c->cfg, attr ? attr->field_mask : 0, limits_why, sizeof(limits_why));
	rc = choose_validation(c);
	if (rc) {
		free(c);
		return rc;
	}
	rc = ops ? ops->open(&cfg, &c->backend, &why) : gdr_backend_select(&cfg, &c->backend);
	if (rc) {
		if (ops)
			gdr_err("backend %s unavailable: %s", ops->name, why);
		free(c);
		return rc;
	}
	c->may_revoke = c->backend->ops->revokes;
	if (gdr_index_init(&c->index, &c->hix)) {
		c->backend->ops->close(c->backend);
		free(c);
		return -ENOMEM;
	}
	lock_init(&c->lock);
	gdr_thr_cache_init(c);
	gdr_log_once(GDR_LOG_INFO, "libgdrcache %d.%d.%d: CUDA driver %s, backend %s, validation %s; "
		     "max_bytes %llu, max_entries %llu, max_pin_bytes %llu (%s)", GDR_VERSION_MAJOR,
		     GDR_VERSION_MINOR, GDR_VERSION_PATCH, c->cuda_ok ? "loaded" : "absent",
		     c->backend->ops->name, c->validator->name,
		     (unsigned long long)c->cfg.max_bytes, (unsigned long long)c->cfg.max_entries,
		     (unsigned long long)c->cfg.max_pin_bytes, limits_why);
	gdr_stats_track(c);
	*out = c;
	return 0;
}

GDR_EXPORT int gdr_cache_create(const struct gdr_cache_attr *attr, struct gdr_cache **cache)
{
	return gdr_cache_create_ops(attr, NULL, cache);
}

GDR_EXPORT int gdr_cache_destroy(struct gdr_cache *c)
{
	struct gdr_entry *e, *next, *cand = NULL;
	int64_t held = 0;

	if (!c) {
		gdr_err("NULL cache");
		return -EINVAL;
	}
	gdr_cache_lock(c);
	gdr_settle(c);
	gdr_reap_detached(c);
	/* Quiesce first, then count: a lookup that saw an entry alive has its hold counted, every
	 * later one takes the locked path. Counted first, a hit in between would be detached. */
	DL_FOREACH(c->lru, e)
		gdr_quiesce_mark(e, &cand);
	if (cand)
		gdr_cache_sync(c);
	for (e = cand; e; e = e->defer)
		held += gdr_entry_holds(c, e);
	if (held > 0 || c->nhost || c->detached) {
		for (e = cand; e; e = next) {
			next = e->defer;
			e->defer = NULL;
			gdr_entry_set_state(e, GDR_LIVE);
		}
		gdr_cache_unlock(c);
		gdr_err("cache %p still has registrations held: release them first", (void *)c);
		return -EBUSY;
	}
	for (e = cand; e; e = next) {
		next = e->defer;
		e->defer = NULL;
		gdr_entry_drop(c, e);
	}
	gdr_settle(c);
	gdr_reclaim(c, true);
	gdr_cache_unlock_plain(c);

	/* The statistics first (they sum the per-thread counters that fini frees), then out of the
	 * live list: the hooks of the driver's frees walk it (under its lock). */
	gdr_stats_untrack(c);
	gdr_thr_cache_fini(c);
	for (uint32_t i = 0; i < c->nextra_be; i++)
		c->extra_be[i]->ops->close(c->extra_be[i]);
	c->backend->ops->close(c->backend);
	gdr_synced_free(c);
	for (uint32_t i = 0; i < c->rec_nchunks; i++)
		free(c->rec_chunks[i]);
	free(c->rec_chunks);
	gdr_index_free(&c->index);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return 0;
}

GDR_EXPORT int gdr_cache_get_stats(struct gdr_cache *c, struct gdr_cache_stats *stats)
{
	if (!c || !stats)
		return -EINVAL;
	gdr_cache_lock(c);
	gdr_stats_collect(c, stats);
	gdr_cache_unlock_plain(c);
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
