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
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uthash.h>
#include <utlist.h>

#include "backend/backend.h"
#include "cache/cache.h"
#include "cache/caches.h"
#include "cache/index.h"
#include "cache/thread.h"
#include "common/config.h"
#include "common/defs.h"
#include "common/log.h"
#include "cuda/cuda.h"
#include "cuda/cuda_abi.h"
#include "intercept/events.h"
#include "intercept/hooks.h"
#include "nic/verbs.h"
#include "validate/validate.h"

/* Cache locks this thread holds: an intercepted free on this thread must not wait for one. */
__thread int gdr_cache_locks_held __attribute__((tls_model("initial-exec")));
/* Set while this thread applies events for the hooks (no recursion from cache_unlock). */
static __thread int applying __attribute__((tls_model("initial-exec")));

static void cache_lock(struct gdr_cache *c)
{
	pthread_mutex_lock(&c->lock);
	gdr_cache_locks_held++;
}

static void cache_unlock_plain(struct gdr_cache *c)
{
	gdr_cache_locks_held--;
	pthread_mutex_unlock(&c->lock);
}

/* Buffer ids that got SYNC_MEMOPS (or proved VMM), so it is set once per allocation. */
struct gdr_sync_set {
	uint64_t id;
	uint8_t kind;
	uint32_t misses;           /* pins made for this allocation (the pin extent's history) */
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

/* ---- default limits, from the devices ------------------------------------------------------------ */

/* What the GPUs offer to pins: BAR1 (what GPUDirect RDMA maps: nvidia_p2p_get_pages and a NIC's
 * peer-to-peer access to a dma-buf both take BAR1 space) and memory. Found without NVML: the PCI
 * address from cuDeviceGetAttribute, BAR1's size from sysfs (resource, second line), memory from
 * cuDeviceTotalMem_v2. Once per process. */
static struct {
	uint64_t bar1, mem;        /* summed over the devices that told (0: none did) */
	int ndev;
	char why[160];             /* what they were derived from, for the info line */
	char bar1_miss[96];        /* the first sysfs file that gave no BAR1 size */
} dev_facts;

static uint64_t bar1_size(int dev)
{
	int domain = 0, bus = -1, slot = -1;
	unsigned long long lo = 0, hi = 0, flags = 0;
	char path[96], line[160];
	uint64_t size = 0;
	FILE *f;

	if (gdr_cuda_device_attr(dev, 33 /* PCI_BUS_ID */, &bus) ||
	    gdr_cuda_device_attr(dev, 34 /* PCI_DEVICE_ID */, &slot) || bus < 0 || slot < 0)
		return 0;
	gdr_cuda_device_attr(dev, 50 /* PCI_DOMAIN_ID */, &domain);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.0/resource", domain, bus,
		 slot);
	/* BAR1 is the framebuffer aperture: the largest BAR after BAR0 (which line it is on depends
	 * on whether BAR0 is a 64-bit BAR: on the H100 VM it is, and BAR1 is the third line). */
	f = fopen(path, "re");
	if (f) {
		for (int i = 0; i < 6 && fgets(line, sizeof(line), f); i++)
			if (i && sscanf(line, "%llx %llx %llx", &lo, &hi, &flags) == 3 && hi > lo &&
			    hi - lo + 1 > size)
				size = hi - lo + 1;
		fclose(f);
	}
	if (!size && !dev_facts.bar1_miss[0])
		snprintf(dev_facts.bar1_miss, sizeof(dev_facts.bar1_miss), "%s", path);
	return size;
}

static void dev_facts_init(void)
{
	int (*total_mem)(size_t *bytes, int dev) = NULL;
	void *h = gdr_cuda_libcuda_handle();
	int n = gdr_cuda_device_count();

	if (h)
		*(void **)&total_mem = dlsym(h, "cuDeviceTotalMem_v2");
	for (int d = 0; d < n && d < GDR_MAX_DEVICES; d++) {
		uint64_t bar1 = bar1_size(d);
		size_t mem = 0;

		if (total_mem && total_mem(&mem, d) != 0)
			mem = 0;
		dev_facts.bar1 += bar1;
		dev_facts.mem += mem;
		dev_facts.ndev += bar1 || mem;
	}
	snprintf(dev_facts.why, sizeof(dev_facts.why), "%d GPU%s: BAR1 %" PRIu64 " MiB%s%s, memory %"
		 PRIu64 " MiB", dev_facts.ndev, dev_facts.ndev == 1 ? "" : "s", dev_facts.bar1 >> 20,
		 dev_facts.bar1_miss[0] ? " (not in " : "", dev_facts.bar1_miss[0] ? "sysfs)" : "",
		 dev_facts.mem >> 20);
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
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	struct limits_set ls = { 0 };
	uint64_t pinnable;

	snprintf(why, n, "fixed defaults");
	pthread_once(&once, dev_facts_init);
	pinnable = dev_facts.bar1 && dev_facts.mem ?
		(dev_facts.bar1 < dev_facts.mem ? dev_facts.bar1 : dev_facts.mem) :
		dev_facts.bar1 ? dev_facts.bar1 : dev_facts.mem;
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
	snprintf(why, n, "from the devices (%s)", dev_facts.why);
}

/* Resolve the validation mode: events only where the interception is proven in this process. */
static int choose_validation(struct gdr_cache *c)
{
	const char *why = "no CUDA driver";
	int mode = c->cfg.validate, rc = -ENODEV;

	if (mode == GDR_VALIDATE_TAG) {
		c->events = false;
	} else {
		if (c->cuda_ok)
			rc = gdr_events_prober(&why);
		if (!rc || (!c->cuda_ok && mode == GDR_VALIDATE_EVENTS)) {
			c->events = true;
			gdr_log_once(GDR_LOG_INFO, "validation by free events: hits make no driver call");
		} else if (mode == GDR_VALIDATE_EVENTS) {
			gdr_err("validation mode events is unavailable: %s", why);
			return -EOPNOTSUPP;
		} else {
			c->events = false;
			gdr_log_once(GDR_LOG_WARN, "free events unavailable (%s): hits are validated "
				     "by BUFFER_ID queries (about 5 M/s for the whole process)", why);
		}
	}
	c->validator = c->events ? &gdr_validate_events_ops : &gdr_validate_tag_ops;
	c->st.validate_mode = c->events ? GDR_VALIDATE_EVENTS : GDR_VALIDATE_TAG;
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
	c->may_revoke = c->backend->ops->revoked != gdr_backend_never_revoked;
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

/* ---- grace periods: freeing what lookups may still read ------------------------------------ */

/* ---- registration records: never freed while the cache lives, reused late ------------------- */

/* Put a retired record (DEAD, unreachable by lookups, after a grace period) in the reuse queue. */
static void record_free(struct gdr_cache *c, struct gdr_region *r)
{
	if (r->entry)
		gdr_thr_zero(c, r->slot); /* +1 on one thread and -1 on another leave non-zero counters */
	r->released = 0;
	r->defer = NULL;
	if (c->reuse_tail)
		c->reuse_tail->defer = r;
	else
		c->reuse_head = r;
	c->reuse_tail = r;
	c->reuse_len++;
}

/* A record to fill: the oldest retired one once GDR_REUSE_DELAY others were retired after it (or
 * all slots are taken), else a new one. 0, -ENOSPC (GDR_SLOT_MAX records held), -ENOMEM. */
static int record_alloc(struct gdr_cache *c, struct gdr_region **out)
{
	struct gdr_region *r;
	uint32_t slot;

	if (c->reuse_len > GDR_REUSE_DELAY || (c->reuse_len && c->slot_next == GDR_SLOT_MAX)) {
		r = c->reuse_head;
		c->reuse_head = r->defer;
		if (!c->reuse_head)
			c->reuse_tail = NULL;
		c->reuse_len--;
		*out = r;
		return 0;
	}
	if (c->slot_next == GDR_SLOT_MAX) {
		gdr_err("more than %u registration records held", GDR_SLOT_MAX);
		return -ENOSPC;
	}
	slot = c->slot_next;
	if (slot / GDR_REC_CHUNK >= c->rec_nchunks) {
		uint32_t n = slot / GDR_REC_CHUNK + 1, cap = c->rec_nchunks;
		struct gdr_region **v = c->rec_chunks;

		if (n > cap) {
			cap = cap ? cap : 16;
			while (cap < n)
				cap *= 2;
			v = realloc(v, cap * sizeof(*v));
			if (!v)
				return -ENOMEM;
			memset(v + c->rec_nchunks, 0, (cap - c->rec_nchunks) * sizeof(*v));
			c->rec_chunks = v;
			c->rec_nchunks = cap;
		}
	}
	if (!c->rec_chunks[slot / GDR_REC_CHUNK]) {
		void *ch;

		if (posix_memalign(&ch, 64, GDR_REC_CHUNK * sizeof(struct gdr_region)))
			return -ENOMEM;
		memset(ch, 0, GDR_REC_CHUNK * sizeof(struct gdr_region));
		c->rec_chunks[slot / GDR_REC_CHUNK] = ch;
	}
	r = &c->rec_chunks[slot / GDR_REC_CHUNK][slot % GDR_REC_CHUNK];
	r->slot = slot;
	c->slot_next++;
	*out = r;
	return 0;
}

/* A record leaves service: every later gdr_dereg of it is refused. Its counters are reset and it
 * is queued for reuse after a grace period (reclaim), when no release that saw it alive is left. */
static void record_retire(struct gdr_cache *c, struct gdr_region *r)
{
	__atomic_add_fetch(&c->gen, 1, __ATOMIC_SEQ_CST); /* memos of it are void */
	__atomic_store_n(&r->magic, GDR_REGION_DEAD, __ATOMIC_SEQ_CST);
	if (r->exact && r->mr) {
		gdr_verbs_dereg(r->mr); /* its own MR: nobody holds the record any more */
		r->mr = NULL;
		if (r->entry && r->entry->nexact)
			r->entry->nexact--;
	}
}

/* Free what was retired: no lookup can still be reading it once a grace period that began after
 * its retirement has ended. Called right after one. */
static void free_deferred(struct gdr_cache *c)
{
	struct gdr_entry *e;
	struct gdr_region *r;

	while ((e = c->deferred)) {
		c->deferred = e->defer;
		while ((r = e->regions)) {
			e->regions = r->next;
			record_free(c, r);
		}
		if (e->tags != &e->tag0)
			free(e->tags);
		free(e);
	}
	while ((r = c->deferred_regions)) {
		c->deferred_regions = r->defer;
		record_free(c, r);
	}
	gdr_index_reclaim(&c->index);
	c->ndeferred = 0;
}

/* A grace period (thread.c), and what was retired before it freed. */
static void cache_sync(struct gdr_cache *c)
{
	gdr_thr_sync(c);
	c->nsyncs++;
	free_deferred(c);
}

/* Retired memory waits for the next grace period that happens anyway (a drop, an eviction); one
 * is run for it alone only once this many items wait, so that a miss, which retires nothing but
 * an outgrown hash table now and then, pays no grace period (membarrier: an IPI to every CPU
 * running a thread of the process). */
#define GDR_RECLAIM_BATCH 256

static void reclaim(struct gdr_cache *c, bool force)
{
	if (!c->deferred && !c->deferred_regions && !c->index.retired)
		return;
	if (force || c->ndeferred + c->index.nretired * 16 >= GDR_RECLAIM_BATCH)
		cache_sync(c);
}

static void reap_detached(struct gdr_cache *c);
static void settle(struct gdr_cache *c);

/* Every locked operation ends here. A free whose pin release was left to a lock holder (hooks.c)
 * is acted on now. */
static void cache_unlock(struct gdr_cache *c)
{
	settle(c);
	if (c->detached)
		reap_detached(c);
	reclaim(c, false);
	cache_unlock_plain(c);
	if (!gdr_cache_locks_held && !applying &&
	    __atomic_load_n(&gdr_hooks_release_pending, __ATOMIC_SEQ_CST))
		gdr_caches_apply_events();
}

/* ---- registration records ------------------------------------------------------------------- */

/* The range a record of allocation t in e serves: t within e (all of t, unless t is larger than
 * what the cap let e pin), so that a request inside it is inside the pin. */
static void record_range(const struct gdr_entry *e, const struct gdr_tag *t, uint64_t *start,
			 uint64_t *size)
{
	uint64_t lo = t->start, hi = t->start + t->size;

	if (e && lo < e->base)
		lo = e->base;
	if (e && hi > e->base + e->len)
		hi = e->base + e->len;
	*start = lo;
	*size = hi > lo ? hi - lo : 0;
}

/* A new record (not held, not linked), or -ENOSPC / -ENOMEM. */
static int region_new(struct gdr_cache *c, struct gdr_entry *e, struct ibv_pd *pd, int access,
		      uint8_t kind, const struct gdr_tag *t, struct gdr_region **out)
{
	struct gdr_region *r;
	uint32_t slot;
	int rc = record_alloc(c, &r);

	if (rc)
		return rc;
	slot = r->slot;
	memset(r, 0, sizeof(*r));
	r->slot = slot;
	r->cache = c;
	r->entry = e;
	r->pd = pd;
	r->access = access;
	r->kind = kind;
	if (t) {
		record_range(e, t, &r->start, &r->size);
		r->buffer_id = t->buffer_id;
	}
	if (e)
		r->estate = (uint8_t)__atomic_load_n(&e->state, __ATOMIC_RELAXED);
	__atomic_store_n(&r->magic, GDR_REGION_LIVE, __ATOMIC_RELEASE);
	*out = r;
	return 0;
}

/* Link a new record to e, and into the index's hash where lookups find it if e is indexed. */
static void region_link(struct gdr_cache *c, struct gdr_entry *e, struct gdr_region *r)
{
	/* Into the hash first: a table it grows is rebuilt from the entries' lists. */
	if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) == GDR_LIVE)
		gdr_index_add_record(&c->index, r);
	r->next = e->regions;
	__atomic_store_n(&e->regions, r, __ATOMIC_RELEASE);
}

static void region_unlink(struct gdr_cache *c, struct gdr_entry *e, struct gdr_region *r)
{
	struct gdr_region **p;

	gdr_index_del_record(&c->index, r);
	for (p = &e->regions; *p; p = &(*p)->next) {
		if (*p == r) {
			__atomic_store_n(p, r->next, __ATOMIC_RELEASE);
			return;
		}
	}
}

/* Set an entry's state, and its mirror in each of its records (what a hit reads). Seq_cst: a
 * grace period after it orders it before every lookup that may still take a hold (thread.c). */
static void entry_set_state(struct gdr_entry *e, uint32_t state)
{
	__atomic_store_n(&e->state, state, __ATOMIC_SEQ_CST);
	for (struct gdr_region *r = e->regions; r; r = r->next)
		__atomic_store_n(&r->estate, (uint8_t)state, __ATOMIC_SEQ_CST);
}

/* Whether e was taken since the evictor last looked (by the locked path, or by a hit of one of
 * its records), and forget it. */
static bool entry_used_clear(struct gdr_entry *e)
{
	bool used = __atomic_load_n(&e->used, __ATOMIC_RELAXED);

	__atomic_store_n(&e->used, 0, __ATOMIC_RELAXED);
	for (struct gdr_region *r = e->regions; r; r = r->next) {
		if (__atomic_load_n(&r->used, __ATOMIC_RELAXED)) {
			used = true;
			__atomic_store_n(&r->used, 0, __ATOMIC_RELAXED);
		}
	}
	return used;
}

/* Under the lock. */
static int64_t region_holds(struct gdr_cache *c, const struct gdr_region *r)
{
	return (int64_t)((uint64_t)gdr_thr_sum(c, r->slot) - (uint64_t)r->released);
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
		if (t->kind != GDR_MEM_POOL)
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
	s->misses = 0;
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

/* ---- entries ------------------------------------------------------------------------------- */

int64_t gdr_entry_holds(struct gdr_cache *c, const struct gdr_entry *e)
{
	int64_t n = 0;

	for (const struct gdr_region *r = e->regions; r; r = r->next)
		n += region_holds(c, r);
	return n;
}

/* Whether the cache holds more than its limits; read by gdr_dereg without the lock. */
static void limits_update(struct gdr_cache *c)
{
	__atomic_store_n(&c->over_limit, c->st.pinned_bytes > c->cfg.max_bytes ||
			 c->st.entries > c->cfg.max_entries, __ATOMIC_RELAXED);
}

/* Unpin an entry nobody holds or can take a hold on, out of the index; its memory is freed after
 * the next grace period, its records are retired. */
static void entry_destroy(struct gdr_cache *c, struct gdr_entry *e)
{
	struct gdr_mrec *m, *mt;

	LL_FOREACH_SAFE(e->mrecs, m, mt) {
		gdr_verbs_dereg(m->mr);
		free(m);
	}
	e->mrecs = NULL;
	for (struct gdr_region *r = e->regions; r; r = r->next)
		record_retire(c, r);
	e->pin.be->ops->unpin(e->pin.be, &e->pin);
	c->st.unpins++;
	c->st.entries--;
	gdr_stats_pinned(c, -(int64_t)e->len);
	e->defer = c->deferred;
	c->deferred = e;
	c->ndeferred++;
}

/* Take an indexed entry out of service: out of the index now, marked dying; unpinned at the next
 * settle() if nobody holds it then, else detached until its holders let go. */
static void entry_drop(struct gdr_cache *c, struct gdr_entry *e)
{
	if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) != GDR_DYING) {
		entry_set_state(e, GDR_DYING);
		c->dying_unsynced = true;
	}
	gdr_index_remove(&c->index, e);
	DL_DELETE(c->lru, e);
	DL_APPEND(c->dying, e);
}

/* Decide the entries dropped since the last call, with one grace period for all of them: then no
 * lookup can take a new hold on them and their holds are final. Unheld ones are unpinned; held
 * ones are detached, and after a further grace period summed again: a release that read the entry
 * as indexed has given its hold back by then, and any later one sees it detached and reaps it. */
static void settle(struct gdr_cache *c)
{
	struct gdr_entry *e, *tmp;
	bool detached = false;

	if (!c->dying)
		return;
	if (c->dying_unsynced)
		cache_sync(c);
	c->dying_unsynced = false;
	DL_FOREACH_SAFE(c->dying, e, tmp) {
		DL_DELETE(c->dying, e);
		if (gdr_entry_holds(c, e) > 0) {
			entry_set_state(e, GDR_DETACHED);
			DL_APPEND(c->detached, e);
			c->st.detached++;
			detached = true;
		} else {
			entry_destroy(c, e);
		}
	}
	if (detached) {
		cache_sync(c);
		reap_detached(c);
	}
	limits_update(c);
}

/* Destroy the detached entries whose last holder has let go. */
static void reap_detached(struct gdr_cache *c)
{
	struct gdr_entry *e, *tmp;

	DL_FOREACH_SAFE(c->detached, e, tmp) {
		if (gdr_entry_holds(c, e) > 0)
			continue;
		DL_DELETE(c->detached, e);
		c->st.detached--;
		entry_destroy(c, e);
	}
	limits_update(c);
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

/* Whether e may be taken out as unheld: not being handed out, no hold seen. */
static bool entry_unheld_now(struct gdr_cache *c, struct gdr_entry *e)
{
	return e != c->taking && __atomic_load_n(&e->state, __ATOMIC_RELAXED) == GDR_LIVE &&
	       gdr_entry_holds(c, e) <= 0;
}

/* Mark e dying as a candidate for removal (its holds are decided by quiesce_finish). */
static void quiesce_mark(struct gdr_entry *e, struct gdr_entry **cand)
{
	entry_set_state(e, GDR_DYING);
	e->defer = *cand;
	*cand = e;
}

/* After one grace period for all the candidates: drop those still unheld, give the others back to
 * lookups. Returns the number dropped; *bytes += what they pin. */
static int quiesce_finish(struct gdr_cache *c, struct gdr_entry *cand, uint64_t *bytes)
{
	struct gdr_entry *e, *next;
	int n = 0;

	if (!cand)
		return 0;
	cache_sync(c);
	for (e = cand; e; e = next) {
		next = e->defer;
		e->defer = NULL;
		if (gdr_entry_holds(c, e) > 0) {
			entry_set_state(e, GDR_LIVE);
			continue;
		}
		if (bytes)
			*bytes += e->len;
		entry_drop(c, e); /* dying already, holds final: settle() needs no grace period */
		n++;
	}
	settle(c);
	return n;
}

/* Evict entries nobody holds while over the limits, or until `need` bytes have been freed: least
 * recently listed first, entries used since the last pass moved to the tail once (CLOCK). The
 * entries chosen in one pass share one grace period (a membarrier: an IPI to every CPU running a
 * thread of the process), so once over a limit a pass goes 1/32 below it: under churn a grace
 * period is paid every few dozen misses, not at each. Returns the number evicted. */
static int evict(struct gdr_cache *c, uint64_t need)
{
	bool over = c->st.pinned_bytes > c->cfg.max_bytes || c->st.entries > c->cfg.max_entries;
	uint64_t max_bytes = over ? c->cfg.max_bytes - c->cfg.max_bytes / 32 : c->cfg.max_bytes;
	uint64_t max_entries = over ? c->cfg.max_entries - c->cfg.max_entries / 32 :
		c->cfg.max_entries;
	uint64_t freed = 0;
	int n = 0;

	for (;;) {
		uint64_t budget = 2 * c->st.entries + 1, bytes = c->st.pinned_bytes;
		uint64_t entries = c->st.entries, picked = 0;
		struct gdr_entry *e = c->lru, *next, *cand = NULL;
		int got;

		while (e && budget--) {
			if (bytes <= max_bytes && entries <= max_entries && freed + picked >= need)
				break;
			next = e->next ? e->next : c->lru; /* round and round, within the budget */
			if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) != GDR_LIVE) {
				/* a candidate already */
			} else if (entry_used_clear(e)) {
				DL_DELETE(c->lru, e);
				DL_APPEND(c->lru, e);
			} else if (entry_unheld_now(c, e)) {
				quiesce_mark(e, &cand);
				picked += e->len;
				bytes -= e->len;
				entries--;
			}
			e = next;
		}
		got = quiesce_finish(c, cand, &freed);
		c->st.evictions += (uint64_t)got;
		n += got;
		if (!got || (c->st.pinned_bytes <= max_bytes && c->st.entries <= max_entries &&
			     freed >= need))
			break;
	}
	limits_update(c);
	return n;
}

/* The kernel saw the memory freed: stale, proven without asking the CUDA driver. Lock-free. */
static bool entry_revoked(struct gdr_cache *c, const struct gdr_entry *e)
{
	return c->may_revoke && e->pin.be->ops->revoked(e->pin.be, &e->pin);
}

/* Validate the tags of e that overlap [a, a+len), or all of them (all = true). Under the lock.
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
		if (!c->events)
			c->st.tag_checks++;
		if (c->validator->check(c, t))
			return -ESTALE;
		if (overlaps && t->start <= covered && tend > covered)
			covered = tend;
	}
	return covered >= end ? 0 : 1;
}

static const struct gdr_tag *entry_tag_at(const struct gdr_entry *e, uint64_t a)
{
	for (uint32_t i = 0; i < e->ntags; i++)
		if (e->tags[i].start <= a && a < e->tags[i].start + e->tags[i].size)
			return &e->tags[i];
	return NULL;
}

/* Add tags to e, keeping them sorted by start and unique. One allocation may have several tags:
 * the pieces of a pool allocation that spans several of the pool's physical chunks. */
static int entry_add_tags(struct gdr_entry *e, const struct gdr_tag *t, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i;

		for (i = 0; i < e->ntags; i++)
			if (e->tags[i].buffer_id == t[k].buffer_id && e->tags[i].start == t[k].start &&
			    e->tags[i].size == t[k].size)
				break;
		if (i < e->ntags)
			continue;
		if (!e->tags_cap) {
			e->tags = &e->tag0; /* one allocation: no memory of its own */
			e->tags_cap = 1;
		} else if (e->ntags == e->tags_cap) {
			uint32_t cap = e->tags_cap * 2;
			struct gdr_tag *v = e->tags == &e->tag0 ? malloc(cap * sizeof(*v)) :
				realloc(e->tags, cap * sizeof(*v));

			if (!v)
				return -ENOMEM;
			if (e->tags == &e->tag0)
				v[0] = e->tag0;
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

/* Hand out a hold on e for (pd, access), on this thread, making its record and MR if needed. */
/* Whether record q serves (pd, access, [a, a+len)): an exact record only an exact request of that
 * very range, a shared one any range inside its allocation unless the request needs an exact MR. */
static inline bool record_serves(const struct gdr_region *q, const struct ibv_pd *pd, int access,
				 uint64_t a, uint64_t len, bool exact)
{
	if (q->pd != pd || q->access != access)
		return false;
	if (q->exact) /* never for a wide request: its rkey must reach the whole pin */
		return exact && q->start == a && q->size == len;
	return !exact && q->start <= a && a + len <= q->start + q->size;
}

/* Whether taking [a, a+len) exactly from e would make a new exact record past the bound. */
static bool entry_exact_full(const struct gdr_entry *e, const struct ibv_pd *pd, int access,
			     uint64_t a, uint64_t len, bool exact)
{
	if (!exact || e->nexact < GDR_EXACT_PER_ENTRY)
		return false;
	for (const struct gdr_region *r = e->regions; r; r = r->next)
		if (record_serves(r, pd, access, a, len, true))
			return false;
	return true;
}

/* Take a hold on e for [a, a+len), making the record (and the MR) if there is none. exact: the MR
 * must be bounded to [a, a+len) (remote access): a record of its own, its MR of that range. */
static int entry_take(struct gdr_cache *c, struct gdr_thr *t, struct gdr_entry *e,
		      struct ibv_pd *pd, int access, uint64_t a, uint64_t len, bool exact,
		      struct gdr_region **out)
{
	const struct gdr_tag *tag = entry_tag_at(e, a);
	uint64_t id = tag ? tag->buffer_id : 0, rstart, rsize;
	struct gdr_region *r;
	struct gdr_mrec *m = NULL;
	struct ibv_mr *own = NULL;
	int64_t *ctr;
	int rc = 0;

	if (!tag) {
		gdr_err("no allocation of entry [%#llx, +%llu) holds %#llx", (unsigned long long)e->base,
			(unsigned long long)e->len, (unsigned long long)a);
		return -EIO;
	}
	if (!pd)
		access = 0, exact = false;
	record_range(e, tag, &rstart, &rsize);
	for (r = e->regions; r; r = r->next)
		if (r->buffer_id == id && record_serves(r, pd, access, a, len, exact) &&
		    (r->exact || (r->start == rstart && r->size == rsize)))
			break;
	__atomic_store_n(&e->used, 1, __ATOMIC_RELAXED);
	DL_DELETE(c->lru, e);
	DL_APPEND(c->lru, e);
	c->taking = e; /* making the MR may evict, and must not evict e */
	if (!r) {
		if (pd && !exact) {
			LL_FOREACH(e->mrecs, m)
				if (m->pd == pd && m->access == access)
					break;
		}
		if (pd && !m) {
			uint64_t base = exact ? a : e->base, n = exact ? len : e->len;

			for (;;) {
				rc = e->pin.be->ops->reg_mr(e->pin.be, &e->pin, pd, access, base, n,
							     &own);
				if ((rc != -ENOMEM && rc != -ENOSPC) || !evict(c, e->len))
					break;
				c->st.fail_pin_retried++;
			}
			if (rc) {
				c->st.fail_mr++;
				gdr_err("NIC registration of [%#llx, +%llu) failed: %d",
					(unsigned long long)base, (unsigned long long)n, rc);
				goto out;
			}
			if (!exact) {
				m = calloc(1, sizeof(*m));
				if (!m) {
					gdr_verbs_dereg(own);
					rc = -ENOMEM;
					goto out;
				}
				m->pd = pd;
				m->access = access;
				m->mr = own;
				own = NULL;
				LL_PREPEND(e->mrecs, m);
			}
		}
		rc = region_new(c, e, pd, access, tag ? tag->kind : GDR_MEM_DEVICE, tag, &r);
		if (rc) {
			if (own)
				gdr_verbs_dereg(own);
			goto out;
		}
		if (exact) {
			r->exact = 1;
			r->start = a;
			r->size = len;
			r->mr = own;
			e->nexact++;
			c->exact_mrs++;
		} else {
			r->exact = 0;
			r->mr = m ? m->mr : NULL;
		}
		region_link(c, e, r);
	}
	ctr = gdr_thr_counter_alloc(t, r->slot);
	if (!ctr) {
		rc = -ENOMEM;
		goto out;
	}
	__atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
	*out = r;
out:
	c->taking = NULL;
	return rc;
}

/* ---- classification and pinning --------------------------------------------------------------- */

/* What the pieces of a classified range need pinned when pool memory is pinned by chunks: the
 * physical chunks of the pool that hold its pool pieces, and the 64 KiB-aligned other pieces. */
struct pin_cover {
	uint64_t lo, hi;
	bool pool;             /* some piece is stream-ordered pool memory */
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
 * two chunks exported; docs/FACTS). So the pin is the cover of the whole allocation's chunks. */
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
 * pieces. */
static int classify(struct gdr_cache *c, uint64_t a, uint64_t len, struct gdr_tag *tags,
		    uint32_t *ntags, struct pin_cover *cv)
{
	uint64_t q = a, end = a + len;
	uint32_t n = 0;

	memset(cv, 0, sizeof(*cv));

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
					      .alloc_start = pi.alloc_start,
					      .alloc_size = pi.alloc_size,
					      .buffer_id = pi.buffer_id,
					      .kind = pi.pool ? GDR_MEM_POOL : GDR_MEM_DEVICE,
					      .device = pi.device };
		if (pi.pool && pi.map_size) {
			cv->pool = true;
			cover_add(cv, pi.map_start, pi.map_start + pi.map_size);
			rc = cover_pool_allocation(c, cv, &pi);
			if (rc)
				return rc;
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
	int rc;

	settle(c); /* what was dropped is unpinned first: no page pinned twice by indexed entries */
	for (;;) {
		rc = pin->be->ops->pin(pin->be, pin);
		if (rc != -ENOMEM && rc != -ENOSPC)
			break;
		if (!evict(c, pin->len))
			break;
		c->st.fail_pin_retried++;
	}
	if (rc == -EOPNOTSUPP) {
		c->st.fail_pin++;
		gdr_err("the %s backend cannot pin [%#llx, +%llu): the CUDA driver refuses it (e.g. memory "
			"imported with cuIpcOpenMemHandle is not exported as a dma-buf; counted in "
			"fail_pin)", pin->be->ops->name, (unsigned long long)pin->base,
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
 *    widening the request (256 KiB, 1 MiB windows) only lowered it. */
#define PIN_WHOLE_AFTER 2
static void pin_extent(struct gdr_cache *c, uint64_t a, uint64_t len, uint64_t lo, uint64_t hi,
		       const struct gdr_tag *tags, uint64_t *base, uint64_t *end)
{
	uint64_t size = hi - lo, misses = 0;
	struct gdr_sync_set *s;

	if (size <= c->cfg.max_pin_bytes && size <= c->cfg.max_bytes / 32)
		goto whole;
	HASH_FIND(hh, c->synced, &tags[0].buffer_id, sizeof(tags[0].buffer_id), s);
	if (s)
		misses = s->misses++;
	if (misses >= PIN_WHOLE_AFTER && size <= c->cfg.max_pin_bytes &&
	    size <= c->cfg.max_bytes / 16)
		goto whole;
	*base = GDR_ALIGN_DOWN(a);
	*end = GDR_ALIGN_UP(a + len);
	return;
whole:
	*base = GDR_ALIGN_DOWN(lo);
	*end = GDR_ALIGN_UP(hi);
}

/* A miss: pin a new entry for tags, taking over the entries it overlaps. */
static int entry_create(struct gdr_cache *c, struct gdr_be *be, uint64_t a, uint64_t len,
			const struct gdr_tag *tags, uint32_t ntags, const struct pin_cover *cv,
			struct gdr_entry **out)
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
	if (posix_memalign((void **)&e, 64, sizeof(*e)))
		return -ENOMEM;
	memset(e, 0, sizeof(*e));
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
	e->pin.be = be;
	rc = pin_retry(c, &e->pin);
	if (rc)
		goto err_free;
	rc = gdr_index_insert(&c->index, e);
	if (rc) {
		e->pin.be->ops->unpin(e->pin.be, &e->pin);
		goto err_free;
	}
	DL_APPEND(c->lru, e);
	c->st.entries++;
	gdr_stats_pinned(c, (int64_t)e->len);
	*out = e;
	return 0;

err_free:
	if (e->tags != &e->tag0)
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
	rc = region_new(c, NULL, pd, access, GDR_MEM_HOST, NULL, &r);
	if (rc)
		return rc;
	rc = gdr_verbs_reg(pd, (void *)(uintptr_t)a, len, a, access, &r->mr);
	if (rc) {
		c->st.fail_mr++;
		record_retire(c, r);
		record_free(c, r);
		return rc;
	}
	__atomic_store_n(&r->refs, 1, __ATOMIC_RELAXED);
	c->st.passthrough++;
	c->nhost++;
	*out = r;
	return 0;
}

/* ---- free events (mode events) ------------------------------------------------------------------ */

/* Drop every indexed entry sharing a byte with [lo, hi). */
static void drop_range(struct gdr_cache *c, uint64_t lo, uint64_t hi)
{
	size_t i = gdr_index_lower(&c->index, lo);

	while (i < c->index.n && c->index.v[i]->base < hi) {
		entry_stale(c, c->index.v[i]);
		i = gdr_index_lower(&c->index, lo);
	}
}

static bool in_range(uint64_t x, uint64_t start, uint64_t size)
{
	return start <= x && x - start < size;
}

/* Whether x lies in the allocation a tag describes: its piece, or the whole range RANGE_* gave. */
static bool tag_holds(const struct gdr_tag *t, uint64_t x)
{
	return in_range(x, t->start, t->size) || in_range(x, t->alloc_start, t->alloc_size);
}

/* Drop every indexed entry that has a tag for which gone(c, tag, arg) holds. Every entry is
 * looked at (events are rare next to hits). */
static void drop_tagged(struct gdr_cache *c,
			bool (*gone)(struct gdr_cache *c, const struct gdr_tag *t, const void *arg),
			const void *arg)
{
	size_t i = 0;

	while (i < c->index.n) {
		struct gdr_entry *e = c->index.v[i];
		bool hit = false;

		for (uint32_t k = 0; !hit && k < e->ntags; k++)
			hit = gone(c, &e->tags[k], arg);
		if (hit)
			entry_stale(c, e); /* leaves the index: the next one is at i now */
		else
			i++;
	}
}

static bool tag_holds_start(struct gdr_cache *c, const struct gdr_tag *t, const void *arg)
{
	(void)c;
	return tag_holds(t, *(const uint64_t *)arg);
}

/* Drop every entry serving the allocation at `start` (a free that names only its base address:
 * cuMemFree, cuMemFreeAsync): those with a tag (the range the driver reported when the entry was
 * made) that holds it. An entry may serve part of an allocation that begins before the entry does,
 * and the range the driver reports may be wider than the allocation freed, so every entry is looked
 * at. A free of an allocation the entry has no tag for leaves it: an entry's pages all lie in
 * physical chunks that hold one of its tagged allocations, and a chunk stays mapped while any
 * allocation in it lives (docs/FACTS), so freeing a neighbour in the chunk (the other allocations
 * of a stream-ordered pool's 32 MiB chunk, a sub-allocated cuMemAlloc's neighbours) changes no page
 * the entry pinned. */
static void drop_allocation(struct gdr_cache *c, uint64_t start)
{
	drop_tagged(c, tag_holds_start, &start);
}

/* Whether the part of tag t that is its own allocation, RANGE ∩ the tag (a pool allocation's piece
 * of a shared chunk, a VMM mapping inside its reservation), overlaps [range[0], range[1]). */
static bool tag_overlaps(struct gdr_cache *c, const struct gdr_tag *t, const void *arg)
{
	const uint64_t *range = arg;
	uint64_t s = t->start, end = t->start + t->size;

	(void)c;
	if (t->alloc_size) {
		if (t->alloc_start > s)
			s = t->alloc_start;
		if (t->alloc_start + t->alloc_size < end)
			end = t->alloc_start + t->alloc_size;
	}
	return s < range[1] && range[0] < end;
}

/* Drop every indexed entry with a tag whose allocation overlaps [lo, hi): memory the driver has just
 * handed out again (an allocation event) is no longer what any such tag described. */
static void drop_reallocated(struct gdr_cache *c, uint64_t lo, uint64_t hi)
{
	drop_tagged(c, tag_overlaps, (const uint64_t[2]){ lo, hi });
}

static bool tag_freed(struct gdr_cache *c, const struct gdr_tag *t, const void *arg)
{
	(void)arg;
	return gdr_validate_tag_ops.check(c, t) < 0;
}

/* A context's memory was freed (GDR_EV_CTX): ask the driver about every cached allocation and drop
 * the entries whose memory went. A freed allocation's BUFFER_ID query fails and ids are never
 * reused, so this drops exactly those: another device's entries, and pool and VMM memory, which
 * survive a context (docs/FACTS), stay. */
static void revalidate_all(struct gdr_cache *c)
{
	drop_tagged(c, tag_freed, NULL);
}

/* Apply every free (and allocation) event published so far. Under the lock. */
static void events_drain(struct gdr_cache *c)
{
	uint64_t n = c->ev_next, head = gdr_events_head();

	while (n < head) {
		struct gdr_event ev;
		int rc = gdr_events_get(n, &ev);

		if (rc == -EAGAIN) {
			sched_yield(); /* its producer is between reserving and writing the slot */
			continue;
		}
		if (rc) {
			c->st.events_lost++;
			gdr_warn("more than %u free events since this cache last looked: every entry "
				 "is dropped", GDR_EVENTS_RING);
			drop_range(c, 0, UINT64_MAX);
			n = head = gdr_events_head();
			break;
		}
		c->st.events++;
		if (ev.kind == GDR_EV_CTX)
			revalidate_all(c);
		else if (ev.kind == GDR_EV_ALLOC)
			drop_reallocated(c, ev.start, ev.start + ev.len < ev.start ? UINT64_MAX :
					 ev.start + ev.len);
		else if (ev.len == GDR_EVENT_ALL_LEN)
			drop_range(c, 0, UINT64_MAX);
		else if (ev.len)
			drop_range(c, ev.start, ev.start + ev.len < ev.start ? UINT64_MAX :
				   ev.start + ev.len);
		else
			drop_allocation(c, ev.start);
		n++;
	}
	__atomic_store_n(&c->ev_next, n, __ATOMIC_RELEASE);
}

/* What a registration classified, for the check against frees in flight. */
struct classified {
	uint64_t a, len;
	const struct gdr_tag *tags;
	uint32_t ntags;
};

/* Whether a free of [start, start+len) (len 0: the allocation at start) may concern it. */
static bool classified_overlaps(uint64_t start, uint64_t len, const void *arg)
{
	const struct classified *k = arg;

	if (!len) {
		if (in_range(start, k->a, k->len))
			return true;
		for (uint32_t i = 0; i < k->ntags; i++)
			if (tag_holds(&k->tags[i], start))
				return true;
		return false;
	}
	if (start < k->a + k->len && k->a < start + len)
		return true;
	for (uint32_t i = 0; i < k->ntags; i++)
		if (start < k->tags[i].start + k->tags[i].size && k->tags[i].start < start + len)
			return true;
	return false;
}

/* ---- the backend of a device ---------------------------------------------------------------------- */

/* The backend that pins memory of the device the tags are on: the cache's own when it serves that
 * device, else (mode AUTO) the next one in the automatic order that does, chosen once per device.
 * 0 and *be; -EOPNOTSUPP when none does (logged once a device); -EINVAL: the range spans GPUs. */
static int backend_for(struct gdr_cache *c, const struct gdr_tag *tags, uint32_t ntags,
		       struct gdr_be **be)
{
	int d = tags[0].device;
	const char *why = "";

	for (uint32_t i = 1; i < ntags; i++)
		if (tags[i].device != d) {
			c->st.fail_input++;
			gdr_err("the range at %#llx spans CUDA devices %d and %d",
				(unsigned long long)tags[0].start, d, tags[i].device);
			return -EINVAL;
		}
	if (d < 0 || d >= GDR_MAX_DEVICES)
		d = 0; /* not a device ordinal the driver reports: the cache's backend decides */
	if (c->dev_be[d]) {
		*be = c->dev_be[d];
		return 0;
	}
	if (c->dev_refused[d])
		return -EOPNOTSUPP;
	if (!c->backend->ops->serves || c->backend->ops->serves(c->backend, d, &why)) {
		c->dev_be[d] = c->backend;
	} else if (gdr_backend_for_device(&c->cfg, c->backend, d, be) == 0) {
		c->extra_be[c->nextra_be++] = *be;
		c->dev_be[d] = *be;
		if ((*be)->ops->revoked != gdr_backend_never_revoked)
			__atomic_store_n(&c->may_revoke, true, __ATOMIC_RELAXED);
	} else {
		c->dev_refused[d] = true;
		gdr_warn("CUDA device %d: backend %s cannot pin its memory (%s)%s; its registrations "
			 "fail with -EOPNOTSUPP", d, c->backend->ops->name, why,
			 c->cfg.backend == GDR_BACKEND_AUTO ? " and no other backend can" : "");
		return -EOPNOTSUPP;
	}
	*be = c->dev_be[d];
	return 0;
}

/* ---- the two paths of gdr_reg ------------------------------------------------------------------- */

/* The locked path: misses, stale entries, new records, pending events. */
static int reg_locked(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		      uint64_t len, int access, bool exact, struct gdr_region **out)
{
	struct gdr_tag tags[GDR_MAX_TAGS];
	struct pin_cover cover;
	struct gdr_be *be = NULL;
	struct gdr_entry *e;
	uint32_t ntags = 0;
	int rc;

	events_drain(c);
	e = gdr_index_find(&c->index, a);
	if (e && entry_exact_full(e, pd, access, a, len, exact)) {
		/* As many remote-access ranges as an entry keeps: it is replaced (held, it is detached
		 * with its MRs until released); the new one starts with none. */
		c->exact_replaced++;
		entry_drop(c, e);
		settle(c);
		e = NULL;
	}
	if (e && a + len <= e->base + e->len) {
		rc = entry_check(c, e, a, len, false);
		if (rc == 0) {
			c->st.hits++;
			return entry_take(c, t, e, pd, access, a, len, exact, out);
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
	rc = classify(c, a, len, tags, &ntags, &cover);
	if (rc == 1)
		return reg_host(c, pd, a, len, access, out);
	if (rc)
		return rc;
	/* Classified while a free of this memory may be running: it may be gone when the driver
	 * returns. Nothing is cached; the caller waits for the free and starts again. */
	if (gdr_events_inflight(classified_overlaps,
				&(struct classified){ .a = a, .len = len, .tags = tags, .ntags = ntags }))
		return -EINPROGRESS;
	rc = backend_for(c, tags, ntags, &be);
	if (rc)
		return rc;
	if (!pd && !be->ops->pins_without_pd) {
		c->st.fail_input++;
		gdr_err("backend %s registers GPU memory only with a PD", be->ops->name);
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
			return entry_take(c, t, e, pd, access, a, len, exact, out);
		}
	}

	c->st.misses++;
	rc = entry_create(c, be, a, len, tags, ntags, &cover, &e);
	if (rc)
		return rc;
	/* If the MR cannot be made the pin stays cached, valid, for the next caller. */
	return entry_take(c, t, e, pd, access, a, len, exact, out);
}

/* The record serving (pd, access, [a, a+len)) in the index's hash (index.h), or NULL. Inside
 * a read-side section: records found are not retired and reused under us. Levels are probed most
 * populated first, a slot at a time. (Measured on the H100 against this: reading every level's
 * first group of four slots up front, or a group at a time with a branch-free match mask, to spare
 * the branches on which level and slot hold the record, made random hits 12-18 ns slower.) */
static inline struct gdr_region *hix_lookup(const struct gdr_hix *h, const struct ibv_pd *pd,
					    int access, uint64_t a, uint64_t len, bool exact)
{
	uint64_t order = __atomic_load_n(&h->order, __ATOMIC_ACQUIRE), mask = (1ULL << h->bits) - 1;

	for (unsigned n = (unsigned)(order >> 60); n; n--, order >>= 4) {
		uint64_t key = gdr_hix_key(a, (unsigned)(order & 15));
		uint64_t part = gdr_hix_part(a, (unsigned)(order & 15));

		for (uint64_t j = gdr_hix_pos(key, h->bits);; j = (j + 1) & mask) {
			uint64_t sk = __atomic_load_n(&h->v[j].key, __ATOMIC_ACQUIRE);

			if (sk == key) {
				uint64_t w = __atomic_load_n(&h->v[j].word, __ATOMIC_ACQUIRE);
				struct gdr_region *r = (struct gdr_region *)(uintptr_t)
					((w & ((1ULL << GDR_HIX_PTR_BITS) - 1)) << 6);

				if (((w >> GDR_HIX_PTR_BITS) & 511) <= part &&
				    part <= w >> (GDR_HIX_PTR_BITS + 9) &&
				    record_serves(r, pd, access, a, len, exact))
					return r;
			} else if (sk == GDR_HIX_EMPTY) {
				break;
			}
		}
	}
	return NULL;
}

/* What the hit path found wrong with a held entry: the locked path retires it. */
struct stale_hit {
	struct gdr_entry *e;
	int64_t *ctr;          /* the hold to give back once e is retired */
	bool revoked;
};

/* The hit path: no lock, no shared write. 0 and *out; 1: take the locked path; 2: the same, but
 * the entry in *st failed validation (still held). */
static int reg_fast(struct gdr_cache *c, struct gdr_thr *t, struct ibv_pd *pd, uint64_t a,
		    uint64_t len, int access, bool exact, struct gdr_region **out,
		    struct stale_hit *st)
{
	struct gdr_entry *e = NULL;
	struct gdr_region *r = NULL;
	int64_t *ctr = NULL;
	uint64_t gen;

	if (!pd)
		access = 0;
	if (c->events && gdr_events_head() != __atomic_load_n(&c->ev_next, __ATOMIC_ACQUIRE))
		return 1; /* a free to apply first */
	gdr_thr_enter(t);
	gen = __atomic_load_n(&c->gen, __ATOMIC_SEQ_CST);
	r = t->memo;
	if (t->memo_gen == gen && r && record_serves(r, pd, access, a, len, exact)) {
		/* The same record as this thread's last hit, and nothing retired since: no search. */
		e = r->entry;
	} else {
		r = hix_lookup(__atomic_load_n(&c->hix, __ATOMIC_ACQUIRE), pd, access, a, len, exact);
		e = r ? r->entry : NULL;
	}
	/* A record's range lies in its entry's: serving the request, it is inside the pin. */
	if (r && __atomic_load_n(&r->estate, __ATOMIC_SEQ_CST) == GDR_LIVE &&
	    __atomic_load_n(&r->state, __ATOMIC_SEQ_CST) == GDR_LIVE)
		ctr = gdr_thr_counter(t, r->slot);
	if (ctr) {
		__atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
		t->memo = r;
		t->memo_gen = gen;
	}
	gdr_thr_leave(t);
	if (!ctr)
		return 1;
	/* Held: e stays pinned and indexed or detached; now prove the memory is still the same. */
	*st = (struct stale_hit){ .e = e, .ctr = ctr, .revoked = entry_revoked(c, e) };
	if (st->revoked)
		return 2;
	if (!c->events) {
		struct gdr_tag tag = { .start = r->start, .size = r->size, .buffer_id = r->buffer_id };

		__atomic_store_n(&t->tag_checks, t->tag_checks + 1, __ATOMIC_RELAXED);
		if (c->validator->check(c, &tag))
			return 2;
	}
	if (!__atomic_load_n(&r->used, __ATOMIC_RELAXED))
		__atomic_store_n(&r->used, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&t->fast_hits, t->fast_hits + 1, __ATOMIC_RELAXED);
	*out = r;
	return 0;
}

GDR_EXPORT int gdr_reg(struct gdr_cache *c, struct ibv_pd *pd, void *addr, size_t len, int access,
		       struct gdr_region **region)
{
	uint64_t a = (uintptr_t)addr;
	bool wide = access & GDR_ACCESS_WIDE_MR, cached_only = access & GDR_REG_CACHED_ONLY, exact;
	struct stale_hit st;
	struct gdr_thr *t;
	int rc;

	if (!c || !region) {
		gdr_err("NULL %s", c ? "region pointer" : "cache");
		return -EINVAL;
	}
	*region = NULL;
	access &= ~(GDR_ACCESS_WIDE_MR | GDR_REG_CACHED_ONLY);
	/* Remote access gets keys bounded by what was asked (a remote peer must not reach the rest
	 * of the pin), unless the caller asked for the wide MR. */
	exact = pd && (access & GDR_IBV_ACCESS_REMOTE) && !wide;
	if (!len || a + len < a) {
		cache_lock(c);
		c->st.fail_input++;
		cache_unlock_plain(c);
		gdr_err("bad range [%p, +%zu): %s", addr, len, len ? "wraps around" : "zero length");
		return -EINVAL;
	}
	t = gdr_thr_get(c);
	if (!t)
		return -ENOMEM;
	rc = reg_fast(c, t, pd, a, len, access, exact, region, &st);
	if (!rc)
		return 0;
	if (rc == 1 && cached_only)
		return -ENOENT; /* nothing asked of the driver, nothing locked */
	cache_lock(c);
	if (rc == 2) {
		/* Stale (or not provably valid): retired while our hold keeps it, then let go. */
		c->st.revoked += st.revoked;
		if (__atomic_load_n(&st.e->state, __ATOMIC_RELAXED) == GDR_LIVE)
			entry_stale(c, st.e);
		__atomic_store_n(st.ctr, __atomic_load_n(st.ctr, __ATOMIC_RELAXED) - 1,
				 __ATOMIC_RELAXED);
	}
	if (cached_only) {
		cache_unlock(c);
		return -ENOENT;
	}
	for (unsigned tries = 0;; tries++) {
		rc = reg_locked(c, t, pd, a, len, access, exact, region);
		if (rc != -EINPROGRESS)
			break;
		__atomic_add_fetch(&c->reg_waits, 1, __ATOMIC_RELAXED);
		cache_unlock(c);
		if (tries < 64)
			sched_yield();
		else
			nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);
		cache_lock(c);
	}
	if (!rc)
		evict(c, 0);
	cache_unlock(c);
	return rc;
}

/* Release a host registration (passed through, not cached). */
static int host_put(struct gdr_cache *c, struct gdr_region *r)
{
	cache_lock(c);
	if (__atomic_load_n(&r->magic, __ATOMIC_RELAXED) != GDR_REGION_LIVE ||
	    !__atomic_exchange_n(&r->refs, 0, __ATOMIC_RELAXED)) {
		c->st.fail_input++;
		cache_unlock_plain(c);
		gdr_err("region %p was already released (double gdr_dereg?)", (void *)r);
		return -EINVAL;
	}
	gdr_verbs_dereg(r->mr);
	c->nhost--;
	record_retire(c, r);
	record_free(c, r); /* host records are never read without the lock */
	cache_unlock_plain(c);
	return 0;
}

/* A release by a thread that holds none of r itself (another thread registered it): under the
 * lock, where r cannot be retired, and only while the holds summed over threads are above zero.
 * Needs no memory: the hold is given back in the record. */
static int dereg_locked(struct gdr_cache *c, struct gdr_region *r)
{
	cache_lock(c);
	if (__atomic_load_n(&r->magic, __ATOMIC_RELAXED) != GDR_REGION_LIVE ||
	    region_holds(c, r) <= 0) {
		c->st.fail_input++;
		cache_unlock_plain(c);
		gdr_err("region %p holds no reference: double gdr_dereg", (void *)r);
		return -EINVAL;
	}
	r->released++;
	if (__atomic_load_n(&r->entry->state, __ATOMIC_RELAXED) != GDR_LIVE ||
	    __atomic_load_n(&c->over_limit, __ATOMIC_RELAXED))
		evict(c, 0); /* what this release made evictable; detached entries are reaped */
	cache_unlock(c);
	return 0;
}

GDR_EXPORT int gdr_dereg(struct gdr_region *r)
{
	struct gdr_cache *c;
	struct gdr_thr *t;
	uint32_t state = GDR_LIVE;
	bool fast = false;

	if (!r) {
		gdr_err("NULL region");
		return -EINVAL;
	}
	/* Records are never freed while their cache lives: reading a released one is safe. */
	c = r->cache;
	if (__builtin_expect(!r->entry, 0)) {
		if (__atomic_load_n(&r->magic, __ATOMIC_RELAXED) != GDR_REGION_LIVE)
			goto released;
		return host_put(c, r);
	}
	t = gdr_thr_find(c);
	if (__builtin_expect(t != NULL, 1)) {
		/* Inside a read-side section: r and its entry are not retired and reused under us,
		 * and nothing of them is read after the hold is given back but in it. */
		gdr_thr_enter(t);
		if (__builtin_expect(__atomic_load_n(&r->magic, __ATOMIC_RELAXED) ==
				     GDR_REGION_LIVE, 1)) {
			int64_t *ctr = gdr_thr_counter(t, r->slot);
			int64_t v = ctr ? __atomic_load_n(ctr, __ATOMIC_RELAXED) : 0;

			if (__builtin_expect(v > 0, 1)) {
				__atomic_store_n(ctr, v - 1, __ATOMIC_RELEASE);
				state = __atomic_load_n(&r->entry->state, __ATOMIC_SEQ_CST);
				fast = true;
			}
		}
		gdr_thr_leave(t);
	}
	if (!fast) {
		if (__atomic_load_n(&r->magic, __ATOMIC_RELAXED) != GDR_REGION_LIVE)
			goto released;
		return dereg_locked(c, r);
	}
	/* Detached (held when it left the index): reap it if this was its last hold. Dying: its
	 * retirer sums the holds after a grace period that waits for this release. */
	if (state == GDR_DETACHED || __atomic_load_n(&c->over_limit, __ATOMIC_RELAXED)) {
		cache_lock(c);
		evict(c, 0); /* what this release made evictable; detached entries are reaped */
		cache_unlock(c);
	}
	return 0;

released:
	gdr_err("region %p was already released (double gdr_dereg?)", (void *)r);
	return -EINVAL;
}

/* Drop every indexed entry nobody holds, with one grace period for all. The number dropped. */
static int drop_unheld(struct gdr_cache *c)
{
	struct gdr_entry *e, *cand = NULL;
	int n;

	DL_FOREACH(c->lru, e)
		if (entry_unheld_now(c, e))
			quiesce_mark(e, &cand);
	n = quiesce_finish(c, cand, NULL);
	limits_update(c);
	return n;
}

GDR_EXPORT int gdr_cache_flush(struct gdr_cache *c)
{
	int n = 0;

	if (!c)
		return -EINVAL;
	cache_lock(c);
	events_drain(c);
	n = drop_unheld(c);
	cache_unlock(c);
	return n;
}

/* Release a PD, first step: unless one of e's records for pd is held, mark them all dying (no
 * lookup takes a new hold after the next grace period). 1: marked; 0: none for pd; -EBUSY: held,
 * none marked. Under the lock. */
static int entry_pd_mark(struct gdr_cache *c, struct gdr_entry *e, const struct ibv_pd *pd)
{
	struct gdr_region *r;
	int any = 0;

	for (r = e->regions; r; r = r->next) {
		if (r->pd == pd && region_holds(c, r) > 0)
			return -EBUSY; /* before any is marked: a refusal leaves every record LIVE */
		any |= r->pd == pd;
	}
	for (r = e->regions; r; r = r->next)
		if (r->pd == pd)
			__atomic_store_n(&r->state, GDR_DYING, __ATOMIC_SEQ_CST);
	return any;
}

/* Second step, after the grace period: retire e's records and MRs for pd, or, if a hold was taken
 * before they were marked, give them all back to lookups. Whether they were retired. */
static bool entry_pd_finish(struct gdr_cache *c, struct gdr_entry *e, const struct ibv_pd *pd)
{
	struct gdr_region *r, *rt;
	struct gdr_mrec *m, *mt;

	for (r = e->regions; r; r = r->next) {
		if (r->pd == pd && region_holds(c, r) > 0) {
			for (r = e->regions; r; r = r->next)
				if (r->pd == pd)
					__atomic_store_n(&r->state, GDR_LIVE, __ATOMIC_SEQ_CST);
			return false;
		}
	}
	__atomic_add_fetch(&c->gen, 1, __ATOMIC_SEQ_CST); /* memos of these records are void */
	for (r = e->regions; r; r = rt) {
		rt = r->next;
		if (r->pd == pd) {
			region_unlink(c, e, r);
			record_retire(c, r);
			r->defer = c->deferred_regions;
			c->deferred_regions = r;
			c->ndeferred++;
		}
	}
	LL_FOREACH_SAFE(e->mrecs, m, mt) {
		if (m->pd == pd) {
			LL_DELETE(e->mrecs, m);
			gdr_verbs_dereg(m->mr);
			free(m);
		}
	}
	return true;
}

static void pd_mark_list(struct gdr_cache *c, struct gdr_entry *list, const struct ibv_pd *pd,
			 bool *any, bool *busy)
{
	struct gdr_entry *e;

	DL_FOREACH(list, e) {
		int rc = entry_pd_mark(c, e, pd);

		*any |= rc > 0;
		*busy |= rc < 0;
	}
}

static void pd_finish_list(struct gdr_cache *c, struct gdr_entry *list, const struct ibv_pd *pd,
			   bool *busy)
{
	struct gdr_entry *e;

	DL_FOREACH(list, e) {
		bool mine = false;

		for (struct gdr_region *r = e->regions; r && !mine; r = r->next)
			mine = r->pd == pd && __atomic_load_n(&r->state, __ATOMIC_RELAXED) == GDR_DYING;
		if (mine && !entry_pd_finish(c, e, pd))
			*busy = true;
	}
}

GDR_EXPORT int gdr_cache_release_pd(struct gdr_cache *c, struct ibv_pd *pd)
{
	bool busy = false, any = false;

	if (!c || !pd) {
		gdr_err("NULL %s", c ? "pd" : "cache");
		return -EINVAL;
	}
	cache_lock(c);
	pd_mark_list(c, c->lru, pd, &any, &busy);
	pd_mark_list(c, c->detached, pd, &any, &busy);
	if (any) {
		cache_sync(c); /* one grace period for every entry */
		pd_finish_list(c, c->lru, pd, &busy);
		pd_finish_list(c, c->detached, pd, &busy);
	}
	cache_unlock(c);
	if (busy)
		gdr_warn("pd %p still has registrations held: their MRs stay", (void *)pd);
	return busy ? -EBUSY : 0;
}

GDR_EXPORT int gdr_cache_destroy(struct gdr_cache *c)
{
	struct gdr_sync_set *s, *st;
	struct gdr_entry *e, *next, *cand = NULL;
	int64_t held = 0;

	if (!c) {
		gdr_err("NULL cache");
		return -EINVAL;
	}
	cache_lock(c);
	settle(c);
	reap_detached(c);
	/* Quiesce first, then count: a lookup that saw an entry alive has its hold counted, every
	 * later one takes the locked path. Counted first, a hit in between would be detached. */
	DL_FOREACH(c->lru, e)
		quiesce_mark(e, &cand);
	if (cand)
		cache_sync(c);
	for (e = cand; e; e = e->defer)
		held += gdr_entry_holds(c, e);
	if (held > 0 || c->nhost || c->detached) {
		for (e = cand; e; e = next) {
			next = e->defer;
			e->defer = NULL;
			entry_set_state(e, GDR_LIVE);
		}
		cache_unlock(c);
		gdr_err("cache %p still has registrations held: release them first", (void *)c);
		return -EBUSY;
	}
	for (e = cand; e; e = next) {
		next = e->defer;
		e->defer = NULL;
		entry_drop(c, e);
	}
	settle(c);
	reclaim(c, true);
	cache_unlock_plain(c);

	/* The statistics first (they sum the per-thread counters that fini frees), then out of the
	 * live list: the hooks of the driver's frees walk it (under its lock). */
	gdr_stats_untrack(c);
	gdr_thr_cache_fini(c);
	for (uint32_t i = 0; i < c->nextra_be; i++)
		c->extra_be[i]->ops->close(c->extra_be[i]);
	c->backend->ops->close(c->backend);
	HASH_ITER(hh, c->synced, s, st) {
		HASH_DEL(c->synced, s);
		free(s);
	}
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
	cache_lock(c);
	gdr_stats_collect(c, stats);
	cache_unlock_plain(c);
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

/* ---- for the hooks of the driver's free and allocation functions (caches.h) ---------------------- */

static void apply_one(struct gdr_cache *c, void *arg)
{
	uint64_t before;

	cache_lock(c);
	before = c->st.unpins;
	events_drain(c);
	settle(c); /* the entries the events dropped, unpinned now (one grace period for all) */
	*(uint64_t *)arg += c->st.unpins - before;
	cache_unlock(c);
}

uint64_t gdr_caches_apply_events(void)
{
	uint64_t n = 0;

	applying++;
	__atomic_store_n(&gdr_hooks_release_pending, 0, __ATOMIC_SEQ_CST);
	gdr_thr_foreach_cache(apply_one, &n);
	applying--;
	return n;
}

static void relieve_one(struct gdr_cache *c, void *arg)
{
	int n;

	cache_lock(c);
	events_drain(c);
	n = drop_unheld(c);
	c->st.evictions += (uint64_t)n;
	*(uint64_t *)arg += (uint64_t)n;
	cache_unlock(c);
}

uint64_t gdr_caches_relieve(void)
{
	uint64_t n = 0;

	applying++;
	gdr_thr_foreach_cache(relieve_one, &n);
	applying--;
	if (n)
		gdr_warn("an allocation ran out of GPU memory: %llu cached pins released, retrying",
			 (unsigned long long)n);
	return n;
}

static void sum_waits(struct gdr_cache *c, void *arg)
{
	*(uint64_t *)arg += __atomic_load_n(&c->reg_waits, __ATOMIC_RELAXED);
}

uint64_t gdr_caches_reg_waits(void)
{
	uint64_t n = 0;

	gdr_thr_foreach_cache(sum_waits, &n);
	return n;
}
