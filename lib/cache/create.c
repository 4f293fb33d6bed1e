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
 * This file: attributes and limits, create and destroy, statistics and settings (0.1's versions:
 * compat-0_1.c). Records and grace periods: record.c; entries and eviction: entry.c; the miss
 * path: miss.c; the two paths of a registration: reg.c; free events: apply.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <utlist.h>

#include "cache/cache.h"
#include "intercept/monitor.h"
#include "cache/caches.h"
#include "cache/seams.h"
#include "cuda/cuda.h"
#include "intercept/events.h"
#include "intercept/hooks.h"
#include "nic/verbs.h"

#define ATTR_FIELDS_ALL                                                                            \
	(GDR_CACHE_ATTR_MAX_BYTES | GDR_CACHE_ATTR_MAX_ENTRIES | GDR_CACHE_ATTR_MAX_PIN_BYTES |    \
	 GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE | GDR_CACHE_ATTR_INTERCEPT)

static int apply_attr(struct gdr_config *cfg, const struct gdr_cache_attr *a)
{
	uint64_t m = a->field_mask;

	if (m & ~(uint64_t)ATTR_FIELDS_ALL) {
		gdr_err("unknown attribute field bits %#llx",
			(unsigned long long)(m & ~(uint64_t)ATTR_FIELDS_ALL));
		return -EINVAL;
	}
	if (a->reserved0 || (!(m & GDR_CACHE_ATTR_INTERCEPT) && a->intercept)) {
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
	if ((m & GDR_CACHE_ATTR_INTERCEPT) && a->intercept > GDR_INTERCEPT_YIELD) {
		gdr_err("unknown interception mode %u", a->intercept);
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
	if (m & GDR_CACHE_ATTR_INTERCEPT)
		cfg->intercept = (int)a->intercept;
	if (cfg->intercept == GDR_INTERCEPT_OFF && cfg->validate == GDR_VALIDATE_EVENTS) {
		gdr_err("validation mode events asked with the interception off");
		return -EINVAL;
	}
	return 0;
}

int gdr_cache_attr_check(const struct gdr_cache_attr *attr)
{
	struct gdr_config cfg = *gdr_config_get();

	if (cfg.bad) {
		gdr_err("%s is malformed (see above): no cache is created", cfg.bad);
		return -EINVAL;
	}
	return attr ? apply_attr(&cfg, attr) : 0;
}

/* A hit holds the lock for well under a microsecond: spinning a little before sleeping beats a
 * futex hand-off when many threads hit at once (measured on the H100: git show
 * d00efd9:bench/RESULTS.md). */
static void lock_init(pthread_mutex_t *lock)
{
	pthread_mutexattr_t ma;

	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
	pthread_mutex_init(lock, &ma);
	pthread_mutexattr_destroy(&ma);
}

/* The settings the environment sets. */
struct env_set {
	bool max_bytes, max_entries, max_pin_bytes, backend, validate;
};

static void setting_set_by_env(const char *name, const char *form, const char *value,
			       const char *dflt, bool set, void *arg)
{
	struct env_set *es = arg;

	(void)form, (void)value, (void)dflt;
	if (!set)
		return;
	if (!strcmp(name, "GDRCACHE_MAX_BYTES"))
		es->max_bytes = true;
	else if (!strcmp(name, "GDRCACHE_MAX_ENTRIES"))
		es->max_entries = true;
	else if (!strcmp(name, "GDRCACHE_MAX_PIN_BYTES"))
		es->max_pin_bytes = true;
	else if (!strcmp(name, "GDRCACHE_BACKEND"))
		es->backend = true;
	else if (!strcmp(name, "GDRCACHE_VALIDATE"))
		es->validate = true;
}

/* Where each setting came from, before any is derived from the devices. */
static void settings_sources(struct gdr_cache_settings *set, uint64_t attr_mask)
{
	struct env_set es = { 0 };

	gdr_config_each(setting_set_by_env, &es);
#define FROM(bit, env)                                                                             \
	((attr_mask & (bit)) ? GDR_SETTING_ATTR : (env) ? GDR_SETTING_ENV : GDR_SETTING_DEFAULT)
	set->max_bytes_from = FROM(GDR_CACHE_ATTR_MAX_BYTES, es.max_bytes);
	set->max_entries_from = FROM(GDR_CACHE_ATTR_MAX_ENTRIES, es.max_entries);
	set->max_pin_bytes_from = FROM(GDR_CACHE_ATTR_MAX_PIN_BYTES, es.max_pin_bytes);
	set->backend_from = FROM(GDR_CACHE_ATTR_BACKEND, es.backend);
	set->validate_from = FROM(GDR_CACHE_ATTR_VALIDATE, es.validate);
#undef FROM
	snprintf(set->limits_why, sizeof(set->limits_why), "fixed defaults");
}

/* The limits neither the environment nor the attributes set (set's *_from: DEFAULT), from the
 * devices: unreferenced pins up to half of what the GPUs can have pinned (each GPU the smaller of
 * its BAR1 and memory, summed: an 80 GB H100 with 128 GiB of BAR1 gets 40 GiB); an entry per MiB of
 * that, never fewer than the fixed default; a whole allocation pinned up to an eighth of the budget
 * where that is more than the fixed default, and never more than an eighth of what the smallest GPU
 * can have pinned (5 GiB pins would take the whole BAR1 of a GPU with 256 MiB beside an H100: 32 MiB
 * there). Without device facts the fixed defaults stay. Marks those it set DEVICES, and writes what
 * they came from into set->limits_why. */
void gdr_derive_limits(struct gdr_config *cfg, struct gdr_cache_settings *set,
		       const struct gdr_cuda_devices *dev)
{
	uint64_t pin;

	if (!dev->pinnable)
		return;
	if (set->max_bytes_from == GDR_SETTING_DEFAULT) {
		cfg->max_bytes = dev->pinnable / 2;
		set->max_bytes_from = GDR_SETTING_DEVICES;
	}
	if (set->max_entries_from == GDR_SETTING_DEFAULT) {
		uint64_t e = cfg->max_bytes >> 20;

		if (e > cfg->max_entries) {
			cfg->max_entries = e < GDR_SLOT_MAX / 2 ? e : GDR_SLOT_MAX / 2;
			set->max_entries_from = GDR_SETTING_DEVICES;
		}
	}
	pin = cfg->max_bytes / 8 > cfg->max_pin_bytes ? cfg->max_bytes / 8 : cfg->max_pin_bytes;
	if (pin > dev->pinnable_min / 8)
		pin = dev->pinnable_min / 8;
	if (set->max_pin_bytes_from == GDR_SETTING_DEFAULT && pin && pin != cfg->max_pin_bytes) {
		cfg->max_pin_bytes = pin;
		set->max_pin_bytes_from = GDR_SETTING_DEVICES;
	}
	snprintf(set->limits_why, sizeof(set->limits_why), "from the devices (%s)", dev->why);
}

/* Resolve the validation mode: events only where the interception is proven in this process. */
static int choose_validation(struct gdr_cache *c)
{
	const char *why = "no CUDA driver";
	int mode = c->cfg.validate, rc = -ENODEV;
	bool events = false;

	if (c->cfg.intercept == GDR_INTERCEPT_OFF && gdr_hooks_mode() != GDR_INTERCEPT_OFF) {
		/* asked of a cache after libcuda was patched: this cache takes no events */
		gdr_info("interception off asked of a cache after libcuda was patched: this cache "
			 "validates by BUFFER_ID queries");
		mode = GDR_VALIDATE_TAG;
	}
	if (mode != GDR_VALIDATE_TAG) {
		if (c->cuda_ok)
			rc = c->events_probe(&why);
		if (!rc || (!c->cuda_ok && mode == GDR_VALIDATE_EVENTS)) {
			events = true;
			gdr_log_once(GDR_LOG_INFO,
				     "validation by free events: hits make no driver call");
		} else if (mode == GDR_VALIDATE_EVENTS) {
			gdr_err("validation mode events is unavailable: %s", why);
			return -EOPNOTSUPP;
		} else {
			/* turned off by the operator (said at the install): no warning */
			gdr_log_once(rc == -EOPNOTSUPP || rc == -EBUSY ? GDR_LOG_INFO
								       : GDR_LOG_WARN,
				     "free events unavailable (%s): hits are validated "
				     "by BUFFER_ID queries (about 5 M/s for the whole process)",
				     why);
		}
	}
	c->validator = gdr_validator_for(events ? GDR_VALIDATE_EVENTS : GDR_VALIDATE_TAG);
	c->events = c->validator->events;
	c->st.validate_mode = (uint64_t)c->validator->mode;
	c->ev_next = gdr_events_head();
	return 0;
}

static int create(const struct gdr_cache_attr *attr, const struct gdr_cache_seams *seams,
		  struct gdr_cache **out)
{
	const struct gdr_backend_ops *ops = seams ? seams->backend : NULL;
	struct gdr_config cfg;
	struct gdr_cache *c;
	const char *why = "";
	int rc;

	if (!out) {
		gdr_err("NULL cache pointer");
		return -EINVAL;
	}
	*out = NULL;
	if (gdr_monitor_in_callback())
		return gdr_monitor_refuse("gdr_cache_create");
	cfg = *gdr_config_get();
	if (cfg.bad) {
		gdr_err("%s is malformed (see above): no cache is created", cfg.bad);
		return -EINVAL;
	}
	if (attr) {
		rc = apply_attr(&cfg, attr);
		if (rc)
			return rc;
	}
	if (posix_memalign((void **)&c, 64, sizeof(*c)))
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	c->cfg = cfg;
	c->sys.verbs = seams && seams->verbs ? seams->verbs : &gdr_verbs_libibverbs;
	c->sys.kmod = seams && seams->kmod ? seams->kmod : &gdr_kmod_sys_libc;
	c->events_probe = seams && seams->events_probe ? seams->events_probe : gdr_events_probe;
	if (attr && (attr->field_mask & GDR_CACHE_ATTR_INTERCEPT))
		(void)gdr_hooks_ask(
			cfg.intercept); /* decides if it comes before libcuda is loaded */
	c->cuda_ok = gdr_driver_load() == 0;
	settings_sources(&c->set, attr ? attr->field_mask : 0);
	if (c->cuda_ok)
		gdr_derive_limits(&c->cfg, &c->set, gdr_cuda_devices());
	rc = choose_validation(c);
	if (rc) {
		free(c);
		return rc;
	}
	rc = ops ? ops->open(&cfg, &c->sys, &c->backend, &why)
		 : gdr_backend_select(&cfg, &c->sys, &c->backend);
	if (rc) {
		if (ops)
			gdr_err("backend %s unavailable: %s", ops->name, why);
		free(c);
		return rc;
	}
	c->may_revoke = c->backend->ops->revokes;
	if (gdr_index_init(&c->index, &c->hix) || gdr_records_init(c)) {
		gdr_index_free(&c->index);
		c->backend->ops->close(c->backend);
		free(c);
		return -ENOMEM;
	}
	lock_init(&c->lock);
	gdr_caches_listen();
	gdr_thr_cache_init(c);
	gdr_log_once(GDR_LOG_INFO,
		     "libgdrcache %d.%d.%d: CUDA driver %s, backend %s, validation %s; "
		     "max_bytes %llu, max_entries %llu, max_pin_bytes %llu (%s)",
		     GDR_VERSION_MAJOR, GDR_VERSION_MINOR, GDR_VERSION_PATCH,
		     c->cuda_ok ? "loaded" : "absent", c->backend->ops->name, c->validator->name,
		     (unsigned long long)c->cfg.max_bytes, (unsigned long long)c->cfg.max_entries,
		     (unsigned long long)c->cfg.max_pin_bytes, c->set.limits_why);
	c->set.max_bytes = c->cfg.max_bytes;
	c->set.max_entries = c->cfg.max_entries;
	c->set.max_pin_bytes = c->cfg.max_pin_bytes;
	c->set.backend = c->backend->ops->id;
	c->set.validate = c->validator->mode;
	gdr_stats_track(c);
	*out = c;
	return 0;
}

/* No cancellation point acts in a cache's creation or destruction (their log lines and statistics
 * are writes): a thread cancelled there would leave the cache made and listed but never returned,
 * or half destroyed and still listed. A pending cancellation acts at the caller's next one. */
int gdr_cache_create_seams(const struct gdr_cache_attr *attr, const struct gdr_cache_seams *seams,
			   struct gdr_cache **out)
{
	int cancel, rc;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	rc = create(attr, seams, out);
	pthread_setcancelstate(cancel, NULL);
	return rc;
}

/* gdr_cache_create of 0.2 on: no log level, validate AUTO 0 (0.1's: compat-0_1.c). */
GDR_SYMVER("gdr_cache_create@@GDRCACHE_0.2")
int gdr_cache_create_0_2(const struct gdr_cache_attr *attr, struct gdr_cache **cache);
int gdr_cache_create_0_2(const struct gdr_cache_attr *attr, struct gdr_cache **cache)
{
	GDR_KEEP_ERRNO();

	return gdr_cache_create_seams(attr, NULL, cache);
}

static int destroy(struct gdr_cache *c);

GDR_EXPORT int gdr_cache_destroy(struct gdr_cache *c)
{
	GDR_KEEP_ERRNO();
	int cancel, rc;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel); /* as gdr_cache_create_seams */
	rc = destroy(c);
	pthread_setcancelstate(cancel, NULL);
	return rc;
}

static int destroy(struct gdr_cache *c)
{
	struct gdr_entry *e, *next, *cand = NULL;
	int64_t held = 0;

	if (!c) {
		gdr_err("NULL cache");
		return -EINVAL;
	}
	if (gdr_monitor_in_callback())
		return gdr_monitor_refuse("gdr_cache_destroy");
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
	gdr_records_fini(c);
	gdr_entries_fini(c);
	gdr_index_free(&c->index);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return 0;
}

int gdr_cache_stats_get(struct gdr_cache *c, struct gdr_cache_stats *s)
{
	if (!c || !s) {
		gdr_err("NULL %s", c ? "statistics" : "cache");
		return -EINVAL;
	}
	gdr_cache_lock(c);
	gdr_stats_collect(c, s);
	gdr_cache_unlock_plain(c);
	return 0;
}

/* Copy what this library knows of a growable structure into a caller's of size bytes: the common
 * part, zeros past it. */
static void copy_sized(void *dst, size_t size, const void *src, size_t known)
{
	memcpy(dst, src, size < known ? size : known);
	if (size > known)
		memset((char *)dst + known, 0, size - known);
}

GDR_EXPORT int gdr_cache_get_stats_ex(struct gdr_cache *c, struct gdr_cache_stats *stats,
				      size_t size)
{
	GDR_KEEP_ERRNO();
	struct gdr_cache_stats s;
	int rc;

	if (size < GDR_STATS_SIZE_0_1) {
		gdr_err("statistics size %zu is below 0.1's %zu", size, GDR_STATS_SIZE_0_1);
		return -EINVAL;
	}
	rc = gdr_cache_stats_get(c, stats ? &s : NULL);
	if (!rc)
		copy_sized(stats, size, &s, sizeof(s));
	return rc;
}

/* The fields of 0.1, in a struct that grows: never more (a program built against 0.2 that calls
 * it keeps working with every later library). */
GDR_SYMVER("gdr_cache_get_stats@@GDRCACHE_0.2")
int gdr_cache_get_stats_0_2(struct gdr_cache *c, struct gdr_cache_stats *stats);
int gdr_cache_get_stats_0_2(struct gdr_cache *c, struct gdr_cache_stats *stats)
{
	return gdr_cache_get_stats_ex(c, stats, GDR_STATS_SIZE_0_1);
}

GDR_EXPORT int gdr_cache_get_settings(const struct gdr_cache *c, struct gdr_cache_settings *s,
				      size_t size)
{
	GDR_KEEP_ERRNO();

	if (!c || !s || size < GDR_SETTINGS_SIZE_0_2) {
		gdr_err("NULL cache or settings, or size %zu below 0.2's %zu", size,
			GDR_SETTINGS_SIZE_0_2);
		return -EINVAL;
	}
	copy_sized(s, size, &c->set, sizeof(c->set));
	return 0;
}

GDR_EXPORT int gdr_cache_backend(const struct gdr_cache *c, enum gdr_backend *backend)
{
	if (!c || !backend) {
		gdr_err("NULL %s", c ? "backend pointer" : "cache");
		return -EINVAL;
	}
	*backend = c->backend->ops->id;
	return 0;
}

GDR_EXPORT uint32_t gdr_cache_version(void)
{
	return GDR_VERSION_NUM(GDR_VERSION_MAJOR, GDR_VERSION_MINOR, GDR_VERSION_PATCH);
}
