/* SPDX-License-Identifier: MIT */
/* The load-mode matrix's engine: see lm.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include <gdrcache.h>

#include "lm.h"

#define MiB ((uint64_t)1 << 20)
#define LM_EXPORT __attribute__((visibility("default")))

/* libgdrcache, however it was loaded. The two optional entry points are looked up by name, so that
 * the engine runs against libraries that have them and libraries that do not. */
static struct {
	int (*cache_create)(const struct gdr_cache_attr *, struct gdr_cache **);
	int (*cache_destroy)(struct gdr_cache *);
	int (*reg)(struct gdr_cache *, struct ibv_pd *, void *, size_t, int, struct gdr_region **);
	int (*dereg)(struct gdr_region *);
	int (*region_buffer_id)(const struct gdr_region *, uint64_t *);
	int (*get_stats)(struct gdr_cache *, struct gdr_cache_stats *);
	int (*intercept)(struct gdr_intercept_stats *, size_t);  /* NULL: not in this library */
	uint64_t (*ring_head)(void);  /* gdr_private_events_head; NULL: not in this library */
	char path[512];
	int bound;
} api;

static struct {
	CUresult (*get_attr)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*mem_info)(size_t *, size_t *);
	CUresult (*set_current)(CUcontext);
	CUcontext ctx;
} cu;

struct slot {
	pthread_rwlock_t lk; /* read: registering the buffer; write: freeing / reallocating it */
	uint64_t ptr, size;
};

/* One thread's counts, on their own cache lines. */
struct thr {
	pthread_t tid;
	int index;
	uint64_t quota;
	uint64_t attempts, regs, fails, refused, stale, frees, same_va, alloc_fail;
	char pad[64];
};

static struct {
	struct gdr_cache *cache;
	struct slot *slots;
	int nslots, nthreads, free_every;
	uint64_t target, max_ns, t_start;
	const struct lm_alloc_ops *ops;
	atomic_int stop, capped, printed;
	/* results */
	int ran;
	double secs;
	uint64_t attempts, regs, fails, refused, stale, frees, same_va, alloc_fail;
	struct gdr_cache_stats cs;
	int have_icpt, icpt_rc;
	struct gdr_intercept_stats i0, i1;
	int have_ring;
	uint64_t ring0, ring1;
} ch;

static struct {
	int ran, pass;
	uint64_t chunk, n, alloc_ok, reg_ok, reg_fail, realloc_ok, oom0, oom1, rel0, rel1;
	size_t free0, free_reg, free_after, free_realloc, total;
	int64_t diff;
	double secs;
	int first_err, first_realloc_err;
} mt;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : def;
}

static double env_double(const char *name, double def)
{
	const char *v = getenv(name);

	return v && *v ? strtod(v, NULL) : def;
}

static uint64_t xrand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* ---- binding ---- */

static int bind_from(void *h)
{
#define REQ(field, name)                                                                     \
	if (!(*(void **)&api.field = dlsym(h, name))) {                                      \
		printf("FAIL: libgdrcache lacks %s\n", name);                                \
		return -1;                                                                   \
	}
	REQ(cache_create, "gdr_cache_create");
	REQ(cache_destroy, "gdr_cache_destroy");
	REQ(reg, "gdr_reg");
	REQ(dereg, "gdr_dereg");
	REQ(region_buffer_id, "gdr_region_buffer_id");
	REQ(get_stats, "gdr_cache_get_stats");
#undef REQ
	*(void **)&api.intercept = dlsym(h, "gdr_intercept_get_stats");
	*(void **)&api.ring_head = dlsym(h, "gdr_private_events_head");
	return 0;
}

static void note_path(void *fn)
{
	Dl_info di;

	if (fn && dladdr(fn, &di) && di.dli_fname)
		snprintf(api.path, sizeof(api.path), "%s", di.dli_fname);
}

LM_EXPORT int lm_bind_handle(void *handle)
{
	if (!handle) {
		printf("FAIL: no libgdrcache handle\n");
		return -1;
	}
	if (bind_from(handle))
		return -1;
	note_path((void *)api.reg);
	api.bound = 1;
	return 0;
}

LM_EXPORT int lm_bind_loaded(void)
{
	/* Matches the loaded copy by its soname, wherever it came from; loads nothing. */
	void *h = dlopen("libgdrcache.so.0", RTLD_NOW | RTLD_NOLOAD);

	if (!h) {
		printf("SKIP: libgdrcache is not in the process (not preloaded?)\n");
		return -1;
	}
	return lm_bind_handle(h);
}

#ifdef LM_DIRECT
LM_EXPORT int lm_bind_direct(void)
{
	void *h = dlopen("libgdrcache.so.0", RTLD_NOW | RTLD_NOLOAD);

	api.cache_create = gdr_cache_create;
	api.cache_destroy = gdr_cache_destroy;
	api.reg = gdr_reg;
	api.dereg = gdr_dereg;
	api.region_buffer_id = gdr_region_buffer_id;
	api.get_stats = gdr_cache_get_stats;
	if (h) {
		*(void **)&api.intercept = dlsym(h, "gdr_intercept_get_stats");
		*(void **)&api.ring_head = dlsym(h, "gdr_private_events_head");
	}
	note_path((void *)api.reg);
	api.bound = 1;
	return 0;
}
#else
LM_EXPORT int lm_bind_direct(void)
{
	printf("FAIL: built without LM_DIRECT\n");
	return -1;
}
#endif

LM_EXPORT int lm_cuda_init(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	CUresult (*init)(unsigned);
	CUresult (*dev_get)(CUdevice *, int);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUdevice dev;

	if (!h) {
		printf("SKIP: no CUDA driver (%s)\n", dlerror());
		return -1;
	}
	*(void **)&init = dlsym(h, "cuInit");
	*(void **)&dev_get = dlsym(h, "cuDeviceGet");
	*(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
	*(void **)&cu.get_attr = dlsym(h, "cuPointerGetAttribute");
	*(void **)&cu.mem_info = dlsym(h, "cuMemGetInfo_v2");
	*(void **)&cu.set_current = dlsym(h, "cuCtxSetCurrent");
	if (!init || !dev_get || !retain || !cu.get_attr || !cu.mem_info || !cu.set_current) {
		printf("SKIP: libcuda lacks an entry point\n");
		return -1;
	}
	if (init(0) || dev_get(&dev, 0) || retain(&cu.ctx, dev) || cu.set_current(cu.ctx)) {
		printf("SKIP: no usable GPU\n");
		return -1;
	}
	return 0;
}

static uint64_t driver_buffer_id(uint64_t addr)
{
	unsigned long long id = 0;

	return cu.get_attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)addr) ? 0 : id;
}

static void intercept_snapshot(struct gdr_intercept_stats *s)
{
	memset(s, 0, sizeof(*s));
	if (api.intercept)
		ch.icpt_rc = api.intercept(s, sizeof(*s));
}

static uint64_t intercept_frees(const struct gdr_intercept_stats *s)
{
	uint64_t n = 0;

	for (int r = 0; r < GDR_FREE_ROUTES; r++)
		n += s->frees[r];
	return n;
}

/* ---- the churn ---- */

/* The buffers' sizes, slot i taking size i mod n: $LM_SIZES (comma-separated bytes) or these. */
static uint64_t slot_sizes[32] = { 4096, 60000, 65536, 1 << 20, 2 << 20, 3 << 20, 4 << 20, 16 << 20 };
static int nsizes = 8;

static void read_sizes(void)
{
	const char *v = getenv("LM_SIZES");
	char *end;
	int n = 0;

	while (v && *v && n < 32) {
		uint64_t x = strtoull(v, &end, 0);

		if (end == v || !x)
			break;
		slot_sizes[n++] = x;
		v = *end == ',' ? end + 1 : end;
	}
	if (n)
		nsizes = n;
}

/* Free the slot's buffer and allocate the same size again (write lock held by the caller). */
static void slot_replace(struct slot *sl, struct thr *t)
{
	uint64_t old = sl->ptr, p = 0;

	if (old) {
		ch.ops->free(old, sl->size);
		sl->ptr = 0;
		t->frees++;
	}
	if (ch.ops->alloc(sl->size, &p) == 0 && p) {
		sl->ptr = p;
		t->same_va += p == old;
	} else {
		t->alloc_fail++;
	}
}

static void reg_one(struct thr *t, uint64_t *rng, uint64_t ptr, uint64_t size)
{
	uint64_t addr = ptr, len = size, id = 0, cur;
	struct gdr_region *r;
	int rc;

	if (xrand(rng) % 4) { /* a random sub-range, 512-aligned start; else the whole buffer */
		uint64_t off = (xrand(rng) % size) & ~(uint64_t)511;

		addr = ptr + off;
		len = 1 + xrand(rng) % (size - off);
	}
	t->attempts++;
	rc = api.reg(ch.cache, NULL, (void *)(uintptr_t)addr, len, 0, &r);
	if (rc) {
		if (rc == -EOPNOTSUPP)
			t->refused++;
		else
			t->fails++;
		if (atomic_fetch_add(&ch.printed, 1) < 5)
			printf("# gdr_reg(%#" PRIx64 ", %" PRIu64 ") = %d\n", addr, len, rc);
		return;
	}
	t->regs++;
	api.region_buffer_id(r, &id);
	cur = driver_buffer_id(addr);
	if (!cur || id != cur) {
		t->stale++;
		if (atomic_fetch_add(&ch.printed, 1) < 5)
			printf("# STALE: %#" PRIx64 " region buffer id %" PRIu64 ", driver says %" PRIu64
			       "\n", addr, id, cur);
	}
	api.dereg(r);
}

static void *worker(void *arg)
{
	struct thr *t = arg;
	uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t->index + 1);

	cu.set_current(cu.ctx);
	/* Until quota registrations succeeded; refusals (pool memory the driver does not export)
	 * do not count, failures do; at most 10 x quota attempts. */
	while (t->regs + t->fails < t->quota && t->attempts < 10 * t->quota &&
	       !atomic_load_explicit(&ch.stop, memory_order_relaxed)) {
		struct slot *sl = &ch.slots[xrand(&rng) % (uint64_t)ch.nslots];

		if ((t->attempts & 255) == 0 && now_ns() - ch.t_start > ch.max_ns) {
			atomic_store(&ch.capped, 1);
			atomic_store(&ch.stop, 1);
			break;
		}
		if (xrand(&rng) % (uint64_t)ch.free_every == 0) {
			pthread_rwlock_wrlock(&sl->lk);
			slot_replace(sl, t);
			pthread_rwlock_unlock(&sl->lk);
			continue;
		}
		pthread_rwlock_rdlock(&sl->lk);
		if (sl->ptr) {
			reg_one(t, &rng, sl->ptr, sl->size);
			pthread_rwlock_unlock(&sl->lk);
			continue;
		}
		pthread_rwlock_unlock(&sl->lk); /* empty (an allocation failed): try again */
		pthread_rwlock_wrlock(&sl->lk);
		if (!sl->ptr)
			slot_replace(sl, t);
		pthread_rwlock_unlock(&sl->lk);
	}
	return NULL;
}

LM_EXPORT int lm_churn_setup(const struct lm_alloc_ops *ops)
{
	int rc;

	if (!api.bound) {
		printf("FAIL: lm_churn_setup before binding\n");
		return -1;
	}
	ch.ops = ops;
	ch.nthreads = (int)env_u64("LM_THREADS", 8);
	ch.target = env_u64("LM_REGS", 1000000);
	ch.free_every = (int)env_u64("LM_FREE_EVERY", 100);
	ch.nslots = (int)env_u64("LM_SLOTS", 64);
	ch.max_ns = (uint64_t)(env_double("LM_MAX_SECONDS", 60) * 1e9);
	if (ch.nthreads < 1 || ch.nslots < 1 || ch.free_every < 1)
		return -1;
	read_sizes();
	rc = api.cache_create(NULL, &ch.cache);
	if (rc) {
		printf("FAIL: gdr_cache_create = %d\n", rc);
		return -1;
	}
	ch.slots = calloc((size_t)ch.nslots, sizeof(*ch.slots));
	for (int s = 0; s < ch.nslots; s++) {
		pthread_rwlock_init(&ch.slots[s].lk, NULL);
		ch.slots[s].size = slot_sizes[s % nsizes];
		if (ops->alloc(ch.slots[s].size, &ch.slots[s].ptr))
			ch.slots[s].ptr = 0;
	}
	return 0;
}

LM_EXPORT int lm_churn_run(const struct lm_alloc_ops *ops)
{
	struct thr *t = calloc((size_t)ch.nthreads, sizeof(*t));
	uint64_t t0;

	(void)ops;
	ch.have_icpt = api.intercept != NULL;
	ch.have_ring = api.ring_head != NULL;
	intercept_snapshot(&ch.i0);
	ch.ring0 = ch.have_ring ? api.ring_head() : 0;
	t0 = ch.t_start = now_ns();
	for (int i = 0; i < ch.nthreads; i++) {
		t[i].index = i;
		t[i].quota = ch.target / (uint64_t)ch.nthreads + (i < (int)(ch.target % (uint64_t)ch.nthreads));
		pthread_create(&t[i].tid, NULL, worker, &t[i]);
	}
	for (int i = 0; i < ch.nthreads; i++) {
		pthread_join(t[i].tid, NULL);
		ch.attempts += t[i].attempts;
		ch.regs += t[i].regs;
		ch.fails += t[i].fails;
		ch.refused += t[i].refused;
		ch.stale += t[i].stale;
		ch.frees += t[i].frees;
		ch.same_va += t[i].same_va;
		ch.alloc_fail += t[i].alloc_fail;
	}
	ch.secs = (double)(now_ns() - t0) / 1e9;
	intercept_snapshot(&ch.i1);
	ch.ring1 = ch.have_ring ? api.ring_head() : 0;
	api.get_stats(ch.cache, &ch.cs);
	ch.ran = 1;
	free(t);
	return 0;
}

LM_EXPORT void lm_churn_teardown(const struct lm_alloc_ops *ops)
{
	int rc;

	for (int s = 0; s < ch.nslots; s++)
		if (ch.slots[s].ptr) {
			ops->free(ch.slots[s].ptr, ch.slots[s].size);
			ch.slots[s].ptr = 0;
		}
	if (ops->flush)
		ops->flush();
	rc = api.cache_destroy(ch.cache);
	if (rc)
		printf("# gdr_cache_destroy = %d\n", rc);
	ch.cache = NULL;
}

LM_EXPORT uint64_t lm_frees_made(void)
{
	return ch.frees;
}

/* ---- the memory test ---- */

LM_EXPORT int lm_memtest(const struct lm_alloc_ops *ops)
{
	struct gdr_cache_attr a;
	struct gdr_cache *c;
	struct gdr_intercept_stats s;
	uint64_t *p, t0 = now_ns();
	int rc;

	memset(&a, 0, sizeof(a));
	a.field_mask = GDR_CACHE_ATTR_MAX_BYTES; /* what GDRCACHE_MAX_BYTES=1T does */
	a.max_bytes = 1ull << 40;
	rc = api.cache_create(&a, &c);
	if (rc) {
		printf("# memtest: gdr_cache_create = %d\n", rc);
		return -1;
	}
	memset(&s, 0, sizeof(s));
	if (api.intercept && api.intercept(&s, sizeof(s)) == 0) {
		mt.oom0 = s.oom_relief;
		mt.rel0 = s.released;
	}
	mt.chunk = env_u64("LM_MEM_CHUNK_MIB", 1024) * MiB;
	if (ops->flush)
		ops->flush();
	cu.mem_info(&mt.free0, &mt.total);
	mt.n = (uint64_t)((double)mt.free0 * env_double("LM_MEM_FRACTION", 0.95)) / mt.chunk;
	p = calloc(mt.n ? mt.n : 1, sizeof(*p));
	for (uint64_t i = 0; i < mt.n; i++) {
		struct gdr_region *r;

		if ((rc = ops->alloc(mt.chunk, &p[i])) != 0) {
			p[i] = 0;
			if (!mt.first_err)
				mt.first_err = rc;
			continue;
		}
		mt.alloc_ok++;
		rc = api.reg(c, NULL, (void *)(uintptr_t)p[i], mt.chunk, 0, &r);
		if (rc) {
			if (mt.reg_fail++ < 3)
				printf("# memtest: gdr_reg(%#" PRIx64 ", %" PRIu64 ") = %d\n", p[i],
				       mt.chunk, rc);
			continue;
		}
		mt.reg_ok++;
		api.dereg(r);
	}
	cu.mem_info(&mt.free_reg, &mt.total);
	for (uint64_t i = 0; i < mt.n; i++)
		if (p[i]) {
			ops->free(p[i], mt.chunk);
			p[i] = 0;
		}
	if (ops->flush)
		ops->flush();
	cu.mem_info(&mt.free_after, &mt.total);
	for (uint64_t i = 0; i < mt.n; i++) {
		if ((rc = ops->alloc(mt.chunk, &p[i])) != 0) {
			p[i] = 0;
			if (!mt.first_realloc_err)
				mt.first_realloc_err = rc;
			continue;
		}
		mt.realloc_ok++;
	}
	cu.mem_info(&mt.free_realloc, &mt.total);
	for (uint64_t i = 0; i < mt.n; i++)
		if (p[i])
			ops->free(p[i], mt.chunk);
	if (ops->flush)
		ops->flush();
	free(p);
	memset(&s, 0, sizeof(s));
	if (api.intercept && api.intercept(&s, sizeof(s)) == 0) {
		mt.oom1 = s.oom_relief;
		mt.rel1 = s.released;
	}
	api.cache_destroy(c);
	mt.diff = ((int64_t)mt.free0 - (int64_t)mt.free_after) / (int64_t)MiB;
	mt.secs = (double)(now_ns() - t0) / 1e9;
	mt.ran = 1;
	mt.pass = mt.n > 0 && mt.alloc_ok == mt.n && mt.realloc_ok == mt.n &&
		  llabs(mt.diff) <= 64;
	return mt.pass ? 0 : 1;
}

/* ---- the report ---- */

static const char *vmode(uint64_t m)
{
	return m == GDR_VALIDATE_TAG ? "tag" : m == GDR_VALIDATE_EVENTS ? "events" : "auto?";
}

LM_EXPORT int lm_report(const char *mode, const char *alloc, int64_t frees_made,
			const char *frees_src)
{
	char seen[64] = "n/a", ring[32] = "n/a", mem[16] = "n/a", diff[32] = "n/a", rea[48] = "n/a";
	uint64_t made = frees_made < 0 ? ch.frees : (uint64_t)frees_made;

	if (ch.have_icpt && ch.icpt_rc == 0)
		snprintf(seen, sizeof(seen), "%" PRIu64,
			 intercept_frees(&ch.i1) - intercept_frees(&ch.i0));
	else if (ch.have_icpt)
		snprintf(seen, sizeof(seen), "err%d", ch.icpt_rc);
	if (ch.have_ring)
		snprintf(ring, sizeof(ring), "%" PRIu64, ch.ring1 - ch.ring0);
	if (mt.ran) {
		snprintf(mem, sizeof(mem), "%s", mt.pass ? "PASS" : "FAIL");
		snprintf(diff, sizeof(diff), "%" PRId64, mt.diff);
		snprintf(rea, sizeof(rea), "%" PRIu64 "/%" PRIu64, mt.realloc_ok, mt.n);
	}
	printf("LMROW mode=%s alloc=%s validate=%s regs=%" PRIu64 " attempts=%" PRIu64
	       " fails=%" PRIu64 " refused=%" PRIu64 " stale=%" PRIu64 " frees_made=%" PRIu64
	       " frees_src=%s frees_seen=%s ring=%s same_va=%" PRIu64 " mem=%s mem_diff_mib=%s"
	       " mem_realloc=%s secs=%.1f capped=%d\n",
	       mode, alloc, ch.ran ? vmode(ch.cs.validate_mode) : "n/a", ch.regs, ch.attempts,
	       ch.fails, ch.refused, ch.stale, made, frees_src ? frees_src : "program", seen, ring,
	       ch.same_va, mem, diff, rea, ch.secs, atomic_load(&ch.capped));
	printf("# library %s; intercept stats %s, events ring %s\n", api.path,
	       api.intercept ? "present" : "absent", api.ring_head ? "present" : "absent");
	printf("# churn: %d threads, %d buffers (%d sizes, %" PRIu64 " to %" PRIu64
	       " bytes), 1 free + reallocation in %d ops: %" PRIu64
	       " frees by the engine (same VA %" PRIu64 ", failed allocations %" PRIu64 ")\n",
	       ch.nthreads, ch.nslots, nsizes, slot_sizes[0], slot_sizes[nsizes - 1], ch.free_every,
	       ch.frees, ch.same_va, ch.alloc_fail);
	printf("# cache: hits %" PRIu64 " (fast %" PRIu64 "), misses %" PRIu64 ", stale %" PRIu64
	       ", events %" PRIu64 ", events_lost %" PRIu64 ", tag_checks %" PRIu64 ", pins %" PRIu64
	       ", unpins %" PRIu64 ", detached %" PRIu64 "\n",
	       ch.cs.hits, ch.cs.fast_hits, ch.cs.misses, ch.cs.stale, ch.cs.events,
	       ch.cs.events_lost, ch.cs.tag_checks, ch.cs.pins, ch.cs.unpins, ch.cs.detached);
	if (ch.have_icpt && ch.icpt_rc == 0) {
		const struct gdr_intercept_stats *a = &ch.i0, *b = &ch.i1;

		printf("# intercept: state %d (%.*s); frees in the churn: free %" PRIu64
		       ", free_async %" PRIu64 ", free_host %" PRIu64 ", unmap %" PRIu64
		       ", ipc_close %" PRIu64 ", ctx %" PRIu64 "; released %" PRIu64
		       ", deferred %" PRIu64 ", reg_waits %" PRIu64 ", oom_relief %" PRIu64
		       ", free_ns %" PRIu64 "\n",
		       b->state, (int)sizeof(b->reason), b->reason,
		       b->frees[0] - a->frees[0], b->frees[1] - a->frees[1],
		       b->frees[2] - a->frees[2], b->frees[3] - a->frees[3],
		       b->frees[4] - a->frees[4], b->frees[5] - a->frees[5],
		       b->released - a->released, b->deferred - a->deferred,
		       b->reg_waits - a->reg_waits, b->oom_relief - a->oom_relief,
		       b->free_ns - a->free_ns);
	}
	if (mt.ran)
		printf("# memtest: %" PRIu64 " x %" PRIu64 " MiB; free MiB: before %" PRIu64
		       ", registered %" PRIu64 ", after the frees %" PRIu64 " (diff %" PRId64
		       "), after reallocating %" PRIu64 "; allocated %"
		       PRIu64 "/%" PRIu64 " (first error %d), registered %" PRIu64 " (failed %" PRIu64
		       "), reallocated %" PRIu64 "/%" PRIu64 " (first error %d); released %" PRIu64
		       ", oom_relief %" PRIu64 "; %.1f s\n",
		       mt.n, mt.chunk / MiB, (uint64_t)(mt.free0 / MiB), (uint64_t)(mt.free_reg / MiB),
		       (uint64_t)(mt.free_after / MiB), mt.diff, (uint64_t)(mt.free_realloc / MiB), mt.alloc_ok, mt.n, mt.first_err, mt.reg_ok,
		       mt.reg_fail, mt.realloc_ok, mt.n, mt.first_realloc_err, mt.rel1 - mt.rel0,
		       mt.oom1 - mt.oom0, mt.secs);
	fflush(stdout);
	return ch.stale || (mt.ran && !mt.pass) ? 1 : 0;
}
