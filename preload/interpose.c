/* SPDX-License-Identifier: MIT */
/*
 * libgdrcache-preload.so: LD_PRELOAD it and an unmodified verbs program's GPU buffers are
 * registered through one libgdrcache cache per process.
 *
 * It defines libibverbs' registration entry points with libibverbs' own symbol versions, so that
 * every reference binds here first: a program built against today's headers refers to
 * ibv_reg_mr@IBVERBS_1.1 (rdma-core's inline ibv_reg_mr) or ibv_reg_mr_iova2@IBVERBS_1.8; one built
 * without versions (against an old, unversioned libibverbs) gets the oldest node, IBVERBS_1.0,
 * libibverbs' 1.0 compatibility layer, exactly as it would without the preload. A versioned reference
 * never binds to a definition of another version node, so each symbol carries its node
 * (libgdrcache-preload.map); the real ones are found with dlvsym(RTLD_NEXT).
 *
 *   ibv_reg_mr@IBVERBS_1.1, ibv_reg_mr_iova@IBVERBS_1.7, ibv_reg_mr_iova2@IBVERBS_1.8
 *        device memory (the CUDA driver the program loaded says so) with iova == addr, not ODP:
 *        gdr_reg on the cache; the program gets a shadow struct ibv_mr of its own (its addr and
 *        length, the cached MR's context, pd, handle and keys) holding one reference. Anything else,
 *        or a cache that fails, goes to libibverbs unchanged.
 *   ibv_dereg_mr@IBVERBS_1.1       a shadow: drop the reference (the MR stays cached), return 0;
 *                                  one released already: EINVAL, never passed to libibverbs
 *   ibv_rereg_mr@IBVERBS_1.1       a shadow: the provider is asked first (the same request on an
 *                                  MR of the preload's own): what it refuses is refused with its
 *                                  answer; otherwise register the new range, then drop the old one
 *   ibv_reg_mr_ex@IBVERBS_1.15     (rdma-core 58 and later) an address registration (comp_mask
 *                                  ADDR, with IOVA == addr or none) is served like ibv_reg_mr; a
 *                                  dma-buf fd, a DMA handle, a provider buffer pass through
 *   ibv_reg_dmabuf_mr@IBVERBS_1.12 a dma-buf the CUDA driver exported in this process while the
 *                                  library watched (lib/intercept/dmabufs.c vouches for its range),
 *                                  with iova == the range's address at offset (what NCCL, UCX, NIXL
 *                                  pass): served like ibv_reg_mr of that address; the shadow's addr
 *                                  is the offset, as libibverbs sets it. Any other dma-buf passes
 *                                  through (counted: passthrough_dmabuf)
 *   ibv_reg_buf_mr@IBVERBS_1.17    passes through: a buffer ibv_alloc_buf made (the provider's memory)
 *   ibv_dealloc_pd@IBVERBS_1.1     gdr_cache_release_pd first: the cache's idle MRs never make it fail
 *   ibv_close_device@IBVERBS_1.1   the same for every PD of the context; shadows the program still
 *                                  holds on it become orphans (their release is a no-op)
 *   the IBVERBS_1.0 symbols        forward to libibverbs' 1.0 compatibility functions, whose own
 *                                  calls of the 1.1 symbols come back here
 *
 * An entry point the running libibverbs lacks (rdma-core 44 has nothing after IBVERBS_1.14) is
 * never bound by anyone: the preload resolves libibverbs' definitions at run time, by version, and
 * binds what is there; dlsym/dlvsym(RTLD_DEFAULT) of the missing ones find nothing, as without it.
 *
 * Programs that dlopen libibverbs and resolve it themselves (NCCL: dlvsym(handle, name,
 * "IBVERBS_1.1")) get these definitions through the preload's dlsym and dlvsym (dlsym.c), which
 * hand them out in place of libibverbs' own (gdrp_verbs_lookup, below).
 *
 * The library's own libibverbs calls (it registers the cache's MRs) pass through: a per-thread
 * depth counter marks them. After fork() the child passes everything through; the MRs it inherited
 * are the parent's: their release only forgets them. GDRCACHE_DISABLE=1: pure pass-through.
 * GDRCACHE_STATS=1: the library prints the cache's statistics at exit, this its own counters.
 * Every GDRCACHE_* variable is parsed by the library's table (gdr_private_config), and lines go
 * through its logger, so that each means the same here as there.
 *
 * Nothing is printed for a call that ends as it would without the preload (a program's stderr is
 * its own): such events are logged at info or debug, and unless GDRCACHE_LOG is set, or a program
 * that links the library chose a level itself, the preload creates its cache with the library's
 * logging off (gdr_private_log_quiet: the library logs the cache's own failures, after which the
 * preload registers the buffer directly).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "mrtab.h"
#include "preload.h"

/*
 * rdma-core's struct ibv_mr_init_attr (ibv_reg_mr_ex, IBVERBS_1.15), which Debian 12's headers
 * (rdma-core 44) lack. Only the fields up to addr are read; each one only when comp_mask says the
 * caller set it. Later fields (fd, fd_offset, dmah, buf) mean the registration passes through.
 */
struct gdrp_mr_init_attr {
	size_t length;
	int access;
	uint64_t comp_mask;
	uint64_t iova;
	void *addr;
};
#define GDRP_REG_MR_MASK_IOVA (1u << 0)
#define GDRP_REG_MR_MASK_ADDR (1u << 1)

/* The libibverbs definitions of what we interpose (the 1.0 ones: compat-1_0.c). */
static struct {
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	struct ibv_mr *(*reg_mr_iova)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				      int access);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				       unsigned int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access);
	int (*rereg_mr)(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len,
			int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	int (*dealloc_pd)(struct ibv_pd *pd);
	int (*close_device)(struct ibv_context *ctx);
	struct ibv_mr *(*reg_mr_ex)(struct ibv_pd *pd, struct gdrp_mr_init_attr *attr);
	struct ibv_mr *(*reg_buf_mr)(struct ibv_pd *pd, void *buf, void *addr, size_t len,
				     int access);
} real;

/* Nonzero while this thread is inside libgdrcache or a real libibverbs call made for the
 * program: libibverbs entry points reached from there pass straight through. */
static __thread unsigned in_lib __attribute__((tls_model("initial-exec")));

/* Nonzero while this thread is inside libibverbs' IBVERBS_1.0 ibv_reg_mr (compat-1_0.c): its call
 * of ibv_reg_mr_iova2 is an old program's registration (own_reg_mr_iova2). */
__thread unsigned gdrp_in_1_0 __attribute__((tls_model("initial-exec")));

static bool disabled = true;        /* GDRCACHE_DISABLE=1; and until the environment is read */
static bool configured;             /* the environment was read (configure) */
struct gdr_private_config gdrp_cfg; /* the library's parse of GDRCACHE_* (configure) */
static bool forked;                 /* this process is a child of fork(): pass-through */
static struct gdr_cache *cache;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
int gdrp_log_level = GDR_LOG_WARN;

/* Counters printed with GDRCACHE_STATS=1: one set a thread (a hit writes no line another thread
 * writes), summed when read. A thread's own set is only written by it: a relaxed load and store
 * (no locked instruction on the hit path); the shared set, where a thread's could not be
 * allocated, is added to atomically. */
struct counters {
	uint64_t cached;   /* registrations served through the cache (shadow MRs handed out) */
	uint64_t host;     /* passed through: not device memory */
	uint64_t iova;     /* passed through: iova != addr, or IBV_ACCESS_ZERO_BASED */
	uint64_t odp;      /* passed through: IBV_ACCESS_ON_DEMAND */
	uint64_t fallback; /* passed through: the cache refused or failed */
	uint64_t dmabuf;   /* ibv_reg_dmabuf_mr, passed through: a dma-buf nobody vouches for */
	uint64_t dmabuf_cached; /* ibv_reg_dmabuf_mr served through the cache (in cached too) */
	uint64_t other;    /* passed through: ibv_reg_mr_ex of an fd, a DMA handle or a provider
			      buffer, ibv_reg_buf_mr; access bits libgdrcache reads as its own */
	uint64_t released; /* shadow MRs released */
	uint64_t rereg;    /* shadow MRs re-registered */
	uint64_t rereg_refused; /* ibv_rereg_mr of a shadow refused as the provider refused it */
	uint64_t orphaned;      /* shadow MRs whose device was closed under them */
	uint64_t
		pd_released; /* gdr_cache_release_pd calls before ibv_dealloc_pd/ibv_close_device */
	uint64_t after_fork; /* inherited shadow MRs forgotten in a child */
};
struct thread_counters {
	struct counters c;
	struct thread_counters *next;      /* all_counters: every set ever made, summed */
	struct thread_counters *free_next; /* free_counters, while no thread owns it */
} __attribute__((aligned(64)));

static struct thread_counters *all_counters; /* pushed once a set, never freed */
static struct counters shared_counters;      /* a thread whose set could not be allocated */
static __thread struct thread_counters *my_counters __attribute__((tls_model("initial-exec")));
/* Sets of threads that exited: still in all_counters (their counts stay summed), adopted by the
 * next new thread, which counts on from them; so the sets are bounded by the threads alive at
 * once, not by the threads ever made. */
static pthread_mutex_t counters_lock = PTHREAD_MUTEX_INITIALIZER;
static struct thread_counters *free_counters; /* under counters_lock */
static pthread_key_t counters_key;
static bool counters_key_ok;
static pthread_once_t counters_key_once = PTHREAD_ONCE_INIT;
/* The thread's set went back at its exit: later counts (another destructor's) are shared. */
static __thread bool counters_gone __attribute__((tls_model("initial-exec")));

static void counters_exit(void *arg)
{
	struct thread_counters *t = arg;

	my_counters = NULL;
	counters_gone = true;
	pthread_mutex_lock(&counters_lock);
	t->free_next = free_counters;
	free_counters = t;
	pthread_mutex_unlock(&counters_lock);
}

static void counters_key_make(void)
{
	counters_key_ok = !pthread_key_create(&counters_key, counters_exit);
}

/* A thread's first count (on the hit path too, which touches no errno: kept here). */
static __attribute__((noinline)) struct counters *counters_slow(void)
{
	int saved = errno;
	struct thread_counters *t = NULL;

	if (counters_gone)
		return NULL;
	pthread_once(&counters_key_once, counters_key_make);
	/* trylock: never wait here (a child of fork() may find it taken by a thread it lacks) */
	if (counters_key_ok && !pthread_mutex_trylock(&counters_lock)) {
		t = free_counters;
		if (t)
			free_counters = t->free_next;
		pthread_mutex_unlock(&counters_lock);
	}
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t) {
			errno = saved;
			return NULL;
		}
		t->next = __atomic_load_n(&all_counters, __ATOMIC_RELAXED);
		while (!__atomic_compare_exchange_n(&all_counters, &t->next, t, true,
						    __ATOMIC_RELEASE, __ATOMIC_RELAXED))
			;
	}
	if (counters_key_ok)
		pthread_setspecific(counters_key, t); /* else it is never given back: as before */
	errno = saved;
	my_counters = t;
	return &t->c;
}

static inline void count_add(size_t off)
{
	struct counters *c = my_counters ? &my_counters->c : counters_slow();
	uint64_t *p;

	if (!c) {
		__atomic_fetch_add((uint64_t *)((char *)&shared_counters + off), 1,
				   __ATOMIC_RELAXED);
		return;
	}
	p = (uint64_t *)((char *)c + off);
	__atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

static uint64_t counters_sum(size_t off)
{
	uint64_t n =
		__atomic_load_n((uint64_t *)((char *)&shared_counters + off), __ATOMIC_RELAXED);

	for (struct thread_counters *t = __atomic_load_n(&all_counters, __ATOMIC_ACQUIRE); t;
	     t = t->next)
		n += __atomic_load_n((uint64_t *)((char *)&t->c + off), __ATOMIC_RELAXED);
	return n;
}

#define COUNT(field) count_add(offsetof(struct counters, field))
#define LOAD(field) counters_sum(offsetof(struct counters, field))

static const char *err_name(int err)
{
	const char *s = strerrorname_np(err < 0 ? -err : err);

	return s ? s : "unknown error";
}

static void resolve_all(void);
static void print_stats(const char *why);

/* counters_lock around fork(): a thread's exit takes it blocking (counters_exit), so a child must
 * not inherit it held by a thread it does not have. A leaf: nothing is taken while it is held, and
 * nobody waits for it while holding another lock (counters_slow only tries it). */
static void counters_fork_prepare(void)
{
	pthread_mutex_lock(&counters_lock);
}

static void counters_fork_parent(void)
{
	pthread_mutex_unlock(&counters_lock);
}

static void child_after_fork(void)
{
	pthread_mutex_unlock(&counters_lock);
	__atomic_store_n(&forked, true, __ATOMIC_RELAXED);
}

/* libibverbs' definitions: on first use, which may come before any constructor (a
 * dlsym in a program's DT_PREINIT_ARRAY, or in a sanitizer runtime's start-up). */
static void init(void)
{
	resolve_all();
	gdrp_mrtab_atfork();
	pthread_atfork(counters_fork_prepare, counters_fork_parent, child_after_fork);
}

/* The environment, once libc has one: not before its own initialisation, which a program's
 * DT_PREINIT_ARRAY precedes. Until then every call passes through (disabled). */
static void configure(void)
{
	bool off;

	gdr_private_config(&gdrp_cfg, sizeof(gdrp_cfg));
	off = gdrp_cfg.disable;
	gdrp_log_level = gdrp_cfg.log_level;
	if (gdrp_cfg.stats)
		gdr_private_stats_on_signal(print_stats);
	__atomic_store_n(&disabled, off, __ATOMIC_RELAXED);
	__atomic_store_n(&configured, true, __ATOMIC_RELEASE);
	gdrp_debug("loaded%s", off ? " (GDRCACHE_DISABLE: pass-through)" : "");
}

/* Once configured (every call after start-up), one load: the thread that configured had run
 * init first, so its store-release of configured publishes both. */
static inline void setup(void)
{
	if (__atomic_load_n(&configured, __ATOMIC_ACQUIRE))
		return;
	pthread_once(&init_once, init);
	if (environ)
		pthread_once(&config_once, configure);
}

void gdrp_setup(void)
{
	setup();
}

__attribute__((constructor)) static void preload_ctor(void)
{
	setup();
}

/* The preload's counters, where GDRCACHE_STATS says (at exit, on GDRCACHE_STATS_SIGNAL). */
static void print_stats(const char *why)
{
	const char *mode = __atomic_load_n(&disabled, __ATOMIC_RELAXED) ? "disabled"
			   : __atomic_load_n(&forked, __ATOMIC_RELAXED) ? "child of fork"
									: "on";
	const struct gdr_stat v[] = {
		{ "mode", mode, 0 },
		{ "cached", NULL, LOAD(cached) },
		{ "released", NULL, LOAD(released) },
		{ "passthrough_host", NULL, LOAD(host) },
		{ "passthrough_iova", NULL, LOAD(iova) },
		{ "passthrough_odp", NULL, LOAD(odp) },
		{ "passthrough_dmabuf", NULL, LOAD(dmabuf) },
		{ "fallback", NULL, LOAD(fallback) },
		{ "rereg", NULL, LOAD(rereg) },
		{ "orphaned", NULL, LOAD(orphaned) },
		{ "pd_released", NULL, LOAD(pd_released) },
		{ "after_fork", NULL, LOAD(after_fork) },
		{ "passthrough_other", NULL, LOAD(other) },
		{ "rereg_refused", NULL, LOAD(rereg_refused) },
		{ "records", NULL, gdrp_rec_count() },
		{ "dmabuf_cached", NULL, LOAD(dmabuf_cached) },
	};
	char head[64];

	if (!strcmp(why, "at exit"))
		snprintf(head, sizeof(head), "%s", strcmp(mode, "on") ? " (" : "");
	else
		snprintf(head, sizeof(head), " (%s%s", why, strcmp(mode, "on") ? ", " : ")");
	if (strcmp(mode, "on"))
		snprintf(head + strlen(head), sizeof(head) - strlen(head), "%s)", mode);
	gdr_private_stats_emit("preload", why, "gdrcache-preload", head, v,
			       sizeof(v) / sizeof(v[0]));
}

__attribute__((destructor)) static void preload_dtor(void)
{
	if (gdrp_cfg.stats)
		print_stats("at exit");
}

/* A real libibverbs call for the program: what it reaches of our symbols passes through. */
#define PASS(result, fn, ...)                                                                      \
	do {                                                                                       \
		if (!real.fn) {                                                                    \
			errno = ENOSYS;                                                            \
			result = 0;                                                                \
			break;                                                                     \
		}                                                                                  \
		in_lib++;                                                                          \
		result = real.fn(__VA_ARGS__);                                                     \
		in_lib--;                                                                          \
	} while (0)

static void cache_create(void)
{
	struct gdr_cache_attr attr = { 0 };
	struct gdr_cache *c = NULL;
	int rc;

	/* Whatever the library reports on the preload's path ends in a direct registration: the
	 * program sees libibverbs' answer, so its stderr stays its own unless logging was asked for
	 * (GDRCACHE_LOG, or a program linking the library that chose a level itself). */
	(void)gdr_private_log_quiet();
	in_lib++;
	rc = gdr_cache_create(&attr, &c);
	in_lib--;
	__atomic_store_n(&cache, rc ? NULL : c, __ATOMIC_RELEASE);
	if (rc) {
		gdrp_info("gdr_cache_create: %s: GPU buffers are registered directly, uncached",
			  err_name(rc));
	}
}

/* The hit path's helpers (a cached registration and its release) are inlined into the entry
 * points: each call and frame there is a fair part of a hit's cost. */
#define HIT_PATH static inline __attribute__((always_inline))

/* Access bits the cache can not serve: ODP; ZERO_BASED, whose keys address the MR by offset from
 * the start of the caller's range (a shared MR of the whole pin starts elsewhere: iova != addr in
 * another form); and bits libgdrcache reads as its own (GDR_ACCESS_WIDE_MR, GDR_REG_CACHED_ONLY),
 * which are the program's here (bit 29 lies in IBV_ACCESS_OPTIONAL_RANGE): passed through, they
 * mean to libibverbs what they meant without the preload. */
#define GDRP_ACCESS_UNCACHED                                                                       \
	(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED | GDR_ACCESS_WIDE_MR | GDR_REG_CACHED_ONLY)

/* Whether the cache may serve this registration at all: cacheable's test, counting nothing. */
HIT_PATH bool may_cache(struct ibv_pd *pd, size_t len, bool iova_ok, unsigned access)
{
	return !in_lib && !disabled && !__atomic_load_n(&forked, __ATOMIC_RELAXED) && pd && len &&
	       iova_ok && !(access & GDRP_ACCESS_UNCACHED);
}

/* The same, counting why an address registration is not. */
static bool cacheable(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access)
{
	if (may_cache(pd, len, iova == (uintptr_t)addr, access))
		return true;
	if (in_lib || disabled || __atomic_load_n(&forked, __ATOMIC_RELAXED) || !pd || !len)
		return false;
	if (iova != (uintptr_t)addr || (access & IBV_ACCESS_ZERO_BASED))
		COUNT(iova);
	else if (access & IBV_ACCESS_ON_DEMAND)
		COUNT(odp);
	else
		COUNT(other);
	return false;
}

/* gdr_reg on c for a cacheable request that missed (the library classifies it). 0: *region holds
 * a reference and *cmr is the cached MR. */
static int cache_get(struct gdr_cache *c, struct ibv_pd *pd, void *addr, size_t len,
		     unsigned access, struct gdr_region **region, struct ibv_mr **cmr)
{
	enum gdr_mem_kind kind = GDR_MEM_HOST;
	int rc;

	in_lib++;
	rc = gdr_reg(c, pd, addr, len, (int)access, region);
	if (!rc) {
		*cmr = NULL;
		gdr_region_mem_kind(*region, &kind);
		gdr_region_mr(*region, cmr);
		if (kind == GDR_MEM_HOST || !*cmr) {
			/* The library saw host memory after all (freed meanwhile): not ours to keep. */
			gdr_dereg(*region);
			rc = -ENOTSUP;
		}
	}
	in_lib--;
	return rc;
}

/* Not a hit: the driver says whether it is GPU memory, and GPU memory is registered through the
 * cache (made on first use). As cache_reg. */
static __attribute__((noinline)) int cache_miss(struct ibv_pd *pd, void *addr, size_t len,
						unsigned access, struct gdr_region **region,
						struct ibv_mr **cmr)
{
	int rc;

	if (!gdrp_is_gpu(addr)) {
		COUNT(host);
		return 1;
	}
	pthread_once(&cache_once, cache_create);
	if (!cache)
		return -ENODEV;
	/* Known before the cache can hold an MR for it, so that ibv_dealloc_pd releases them. */
	rc = gdrp_pd_note(pd);
	if (rc)
		return rc;
	return cache_get(cache, pd, addr, len, access, region, cmr);
}

HIT_PATH void shadow_fill(struct ibv_mr *s, const struct ibv_mr *m, struct ibv_pd *pd, void *addr,
			  size_t len)
{
	s->context = m->context;
	s->pd = pd;
	s->addr = addr;
	s->length = len;
	s->handle = m->handle;
	s->lkey = m->lkey;
	s->rkey = m->rkey;
}

HIT_PATH void region_put(struct gdr_region *region)
{
	int rc;

	in_lib++;
	rc = gdr_dereg(region);
	in_lib--;
	if (rc)
		gdrp_info("gdr_dereg: %s", err_name(rc));
}

/* A shadow record for the cached MR cmr, holding region's reference: published, counted. NULL:
 * out of memory (the reference is still the caller's). errno kept. */
HIT_PATH struct ibv_mr *shadow_new(struct gdr_region *region, const struct ibv_mr *cmr,
				   struct ibv_pd *pd, void *addr, size_t len, unsigned access)
{
	struct gdrp_rec *r = gdrp_rec_new();

	if (__builtin_expect(!r, 0))
		return NULL;
	r->kind = GDRP_CACHED;
	r->region = region;
	r->real = NULL;
	r->access = (int)access;
	r->dmabuf = false;
	shadow_fill(&r->mr, cmr, pd, addr, len);
	gdrp_rec_publish(r);
	COUNT(cached);
	return &r->mr;
}

/* The cache's registration of a request it already holds (GDR_REG_CACHED_ONLY: no driver call,
 * nothing classified; what it serves is GPU memory, gdrcache.h; a hit has an MR of this pd, noted
 * when that MR was made). 0: *region holds a reference and *cmr is the cached MR; else nothing is
 * held. Touches no errno: the library's hit does not. */
HIT_PATH int cache_hit(struct ibv_pd *pd, void *addr, size_t len, unsigned access,
		       struct gdr_region **region, struct ibv_mr **cmr)
{
	struct gdr_cache *c = __atomic_load_n(&cache, __ATOMIC_ACQUIRE);
	int rc;

	if (__builtin_expect(!c, 0))
		return -ENOENT; /* no GPU registration yet */
	in_lib++;
	rc = gdr_reg(c, pd, addr, len, (int)access | GDR_REG_CACHED_ONLY, region);
	in_lib--;
	if (rc)
		return rc;
	*cmr = NULL;
	gdr_region_mr(*region, cmr);
	if (__builtin_expect(*cmr != NULL, 1))
		return 0;
	region_put(*region);
	return -ENOTSUP;
}

/* A cacheable request (ibv_rereg_mr's new range): cache_hit, else cache_miss. 0: *region holds a
 * reference and *cmr is the cached MR; 1: host memory (counted; the caller passes it through);
 * else an error of the cache. */
static int cache_reg(struct ibv_pd *pd, void *addr, size_t len, unsigned access,
		     struct gdr_region **region, struct ibv_mr **cmr)
{
	if (!cache_hit(pd, addr, len, access, region, cmr))
		return 0;
	return cache_miss(pd, addr, len, access, region, cmr);
}

/* The hit of every registration entry point, inline: a shadow of a registration the cache already
 * holds (cache_hit), or NULL: anything else, which reg_cached decides. Touches no errno: the
 * preload's own allocations on the way keep it (mrtab.c, counters_slow). */
HIT_PATH struct ibv_mr *reg_hit(struct ibv_pd *pd, void *addr, size_t len, unsigned access)
{
	struct gdr_region *region;
	struct ibv_mr *cmr, *mr;

	if (cache_hit(pd, addr, len, access, &region, &cmr))
		return NULL;
	mr = shadow_new(region, cmr, pd, addr, len, access);
	if (__builtin_expect(!mr, 0))
		region_put(region); /* reg_cached decides (and logs) */
	return mr;
}

/* Everything but a hit, for every registration entry point (reg_hit was tried where the request
 * may be cached): a shadow MR, or NULL (pass it through). */
static __attribute__((noinline)) struct ibv_mr *
reg_cached(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned access)
{
	struct gdr_region *region;
	struct ibv_mr *cmr, *mr;
	int saved = errno, rc;

	if (!cacheable(pd, addr, len, iova, access))
		return NULL;
	rc = cache_miss(pd, addr, len, access, &region, &cmr);
	if (rc == 1)
		return NULL; /* host memory */
	if (rc) {
		COUNT(fallback);
		gdrp_info("gdr_reg(%p, +%zu, access %#x): %s: registering it directly", addr, len,
			  access, err_name(rc));
		errno = saved;
		return NULL;
	}
	mr = shadow_new(region, cmr, pd, addr, len, access);
	if (!mr) {
		gdrp_info("out of memory for an MR record: registering %p directly", addr);
		region_put(region);
		COUNT(fallback);
	}
	errno = saved;
	return mr;
}

/* A registration entry point's cached path: the hit inline, anything else out of line. */
HIT_PATH struct ibv_mr *reg_any(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				unsigned access)
{
	struct ibv_mr *mr = NULL;

	if (__builtin_expect(may_cache(pd, len, iova == (uintptr_t)addr, access), 1))
		mr = reg_hit(pd, addr, len, access);
	return __builtin_expect(mr != NULL, 1) ? mr : reg_cached(pd, addr, len, iova, access);
}

/* ---- Registration ---------------------------------------------------------------------------- */

GDRP_SYMBOL("ibv_reg_mr@@IBVERBS_1.1")
struct ibv_mr *gdrp_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	struct ibv_mr *mr;

	setup();
	mr = reg_any(pd, addr, len, (uintptr_t)addr, (unsigned)access);
	if (!mr)
		PASS(mr, reg_mr, pd, addr, len, access);
	return mr;
}

GDRP_SYMBOL("ibv_reg_mr_iova@@IBVERBS_1.7")
struct ibv_mr *gdrp_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				int access)
{
	struct ibv_mr *mr;

	setup();
	mr = reg_any(pd, addr, len, iova, (unsigned)access);
	if (!mr)
		PASS(mr, reg_mr_iova, pd, addr, len, iova, access);
	return mr;
}

GDRP_SYMBOL("ibv_reg_mr_iova2@@IBVERBS_1.8")
struct ibv_mr *gdrp_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				 unsigned int access)
{
	struct ibv_mr *mr;

	setup();
	mr = reg_any(pd, addr, len, iova, access);
	if (!mr)
		PASS(mr, reg_mr_iova2, pd, addr, len, iova, access);
	return mr;
}

/* A dma-buf registration through the cache: the library vouches for the GPU range the fd holds
 * (exported by the driver in this process, the same memory still there), the request lies inside
 * it, and iova is the range's own address at offset; then it is ibv_reg_mr of that address, whose
 * MR answers for exactly the same bytes. The shadow's addr is offset, as libibverbs sets a dma-buf
 * MR's. NULL: pass it through (counted). */
static __attribute__((noinline)) struct ibv_mr *
reg_dmabuf(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd, unsigned access)
{
	uint64_t va = 0, size = 0;
	struct ibv_mr *mr;
	int saved = errno, rc;

	in_lib++;
	rc = fd < 0 ? -EBADF : gdr_private_dmabuf_range(fd, &va, &size);
	in_lib--;
	errno = saved;
	if (rc || offset > size || len > size - offset) {
		COUNT(dmabuf);
		gdrp_debug("ibv_reg_dmabuf_mr(fd %d, +%" PRIu64 ", %zu): %s: passed through", fd,
			   offset, len, rc ? err_name(rc) : "outside the exported range");
		return NULL;
	}
	if (iova != va + offset) {
		COUNT(iova);
		return NULL;
	}
	mr = reg_any(pd, (void *)(uintptr_t)iova, len, iova, access);
	if (!mr)
		return NULL; /* counted as the same ibv_reg_mr would be */
	mr->addr = (void *)(uintptr_t)offset;
	((struct gdrp_rec *)(void *)mr)->dmabuf = true;
	COUNT(dmabuf_cached);
	return mr;
}

GDRP_SYMBOL("ibv_reg_dmabuf_mr@@IBVERBS_1.12")
struct ibv_mr *gdrp_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
				  int fd, int access)
{
	struct ibv_mr *mr = NULL;

	setup();
	/* The cache (and with it the watch on the driver's exports) from the first call on, whatever
	 * it asks: NCCL's probe (fd -1, length 0) comes before its first export. */
	if (!in_lib && !disabled && !__atomic_load_n(&forked, __ATOMIC_RELAXED) &&
	    !__atomic_load_n(&cache, __ATOMIC_ACQUIRE) && gdrp_cuda_loaded())
		pthread_once(&cache_once, cache_create);
	if (may_cache(pd, len, true, (unsigned)access))
		mr = reg_dmabuf(pd, offset, len, iova, fd, (unsigned)access);
	else if (!in_lib)
		COUNT(dmabuf);
	if (!mr)
		PASS(mr, reg_dmabuf_mr, pd, offset, len, iova, fd, access);
	return mr;
}

/* Only an address registration is served from the cache: comp_mask ADDR, IOVA (== addr) or not,
 * nothing else; a dma-buf fd, a DMA handle (TPH hints the cache's MR would not carry), a provider
 * buffer, or a mask bit this preload does not know pass through. */
GDRP_SYMBOL("ibv_reg_mr_ex@@IBVERBS_1.15")
struct ibv_mr *gdrp_reg_mr_ex(struct ibv_pd *pd, struct gdrp_mr_init_attr *attr)
{
	const uint64_t plain = GDRP_REG_MR_MASK_IOVA | GDRP_REG_MR_MASK_ADDR;
	struct ibv_mr *mr = NULL;

	setup();
	if (attr && (attr->comp_mask & GDRP_REG_MR_MASK_ADDR) && !(attr->comp_mask & ~plain)) {
		mr = reg_any(pd, attr->addr, attr->length,
			     attr->comp_mask & GDRP_REG_MR_MASK_IOVA ? attr->iova
								     : (uintptr_t)attr->addr,
			     (unsigned)attr->access);
	} else if (!in_lib) {
		COUNT(other);
	}
	if (!mr)
		PASS(mr, reg_mr_ex, pd, attr);
	return mr;
}

/* A buffer ibv_alloc_buf made is the provider's memory (host pages or its dma-buf heap), never
 * CUDA's: pass it through, with libibverbs' own ibv_reg_mr_ex call under it. */
GDRP_SYMBOL("ibv_reg_buf_mr@@IBVERBS_1.17")
struct ibv_mr *gdrp_reg_buf_mr(struct ibv_pd *pd, void *buf, void *addr, size_t len, int access)
{
	struct ibv_mr *mr;

	setup();
	if (!in_lib)
		COUNT(other);
	PASS(mr, reg_buf_mr, pd, buf, addr, len, access);
	return mr;
}

/* ---- Release --------------------------------------------------------------------------------- */

static int real_dereg(struct ibv_mr *mr)
{
	int rc;

	PASS(rc, dereg_mr, mr);
	return real.dereg_mr ? rc : ENOSYS;
}

/* Release what a record stands for and free it. Returns what ibv_dereg_mr returns. */
HIT_PATH int rec_release(struct gdrp_rec *r)
{
	int rc;

	switch (r->kind) {
	case GDRP_CACHED:
		if (__atomic_load_n(&forked, __ATOMIC_RELAXED)) {
			/* The parent's registration: its cache is not the child's to touch. */
			COUNT(after_fork);
			break;
		}
		region_put(r->region);
		COUNT(released);
		break;
	case GDRP_WRAPPED:
		rc = real_dereg(r->real);
		if (rc) {
			gdrp_rec_publish(r); /* still the program's, as libibverbs leaves it */
			return rc;
		}
		COUNT(released);
		break;
	case GDRP_ORPHAN:
		COUNT(released);
		break;
	}
	gdrp_rec_free(r);
	return 0;
}

/* A shadow released already (or being released on another thread) is refused as libibverbs refuses
 * an MR it does not know, EINVAL; it never reaches libibverbs, whose provider would release the
 * cached MR by the shadow's handle. */
GDRP_SYMBOL("ibv_dereg_mr@@IBVERBS_1.1")
int gdrp_dereg_mr(struct ibv_mr *mr)
{
	struct gdrp_rec *r;
	int rc;

	setup();
	if (!in_lib && !disabled && mr) {
		rc = gdrp_rec_take(mr, &r);
		if (!rc)
			return rec_release(r);
		if (rc == -EINVAL) {
			gdrp_info("ibv_dereg_mr(%p): a cached MR released already", (void *)mr);
			return EINVAL;
		}
	}
	return real_dereg(mr);
}

/* ---- Re-registration ------------------------------------------------------------------------- */

static int rereg_input_error(const char *why)
{
	gdrp_info("ibv_rereg_mr of a cached MR: %s", why);
	errno = EINVAL;
	return IBV_REREG_MR_ERR_INPUT;
}

/*
 * What the provider answers to this re-registration: the same request on an MR of the preload's
 * own, one private page standing in for the new range. A shadow's MR is the cache's, shared, so the
 * request itself can not go to the provider; but whether the provider re-registers at all must not
 * change with the preload: rxe and siw have no rereg and answer every request IBV_REREG_MR_ERR_CMD,
 * errno EOPNOTSUPP (libibverbs' stub); mlx5 asks the kernel, which refuses flags 0 with EINVAL.
 * 0: the provider would do it; else what ibv_rereg_mr returned, errno as it left it.
 */
static int rereg_ask_provider(struct gdrp_rec *r, int flags, struct ibv_pd *pd, void *addr,
			      size_t len, int access)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct ibv_mr *probe = NULL;
	int rc, err;
	void *p;

	if (!real.rereg_mr) {
		errno = ENOSYS;
		return IBV_REREG_MR_ERR_INPUT;
	}
	p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		errno = ENOMEM;
		return IBV_REREG_MR_ERR_CMD;
	}
	PASS(probe, reg_mr_iova2, r->mr.pd, p, page, (uintptr_t)p, (unsigned)r->access);
	if (!probe) {
		/* Not even a registration on this PD: a re-registration would not fare better. */
		err = errno;
		munmap(p, page);
		errno = err;
		return IBV_REREG_MR_ERR_CMD;
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION)
		addr = p, len = page;
	PASS(rc, rereg_mr, probe, flags, pd, addr, len, access);
	err = errno;
	real_dereg(probe);
	munmap(p, page);
	errno = err;
	return rc == IBV_REREG_MR_ERR_DO_FORK_OLD ? 0 : rc; /* DO_FORK_OLD: the new MR is valid */
}

/* ibv_rereg_mr of a shadow: the struct stays where it is; what backs it is registered anew (cached
 * when it can be), then the old backing is released. On failure the old registration is intact.
 * Input libibverbs refuses is refused as it does; then the provider is asked (above). */
static int rereg_shadow(struct gdrp_rec *r, int flags, struct ibv_pd *pd, void *addr, size_t len,
			int access)
{
	struct ibv_pd *npd = flags & IBV_REREG_MR_CHANGE_PD ? pd : r->mr.pd;
	void *naddr = flags & IBV_REREG_MR_CHANGE_TRANSLATION ? addr : r->mr.addr;
	size_t nlen = flags & IBV_REREG_MR_CHANGE_TRANSLATION ? len : r->mr.length;
	int naccess = flags & IBV_REREG_MR_CHANGE_ACCESS ? access : r->access;
	struct gdr_region *region = NULL;
	struct ibv_mr *nmr = NULL;
	struct gdrp_rec old = *r;
	int rc;

	if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)
		return rereg_input_error("unknown flags");
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !len))
		return rereg_input_error("no address or length");
	if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))
		return rereg_input_error("access without IBV_REREG_MR_CHANGE_ACCESS");
	if ((flags & IBV_REREG_MR_CHANGE_PD) && !pd)
		return rereg_input_error("no PD");
	if (r->kind == GDRP_ORPHAN)
		return rereg_input_error("its device was closed");
	if (r->dmabuf) {
		/* Its translation is a dma-buf's, which ibv_rereg_mr has no way to name. */
		gdrp_info("ibv_rereg_mr of a cached dma-buf MR: not supported");
		errno = EOPNOTSUPP;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (__atomic_load_n(&forked, __ATOMIC_RELAXED))
		return rereg_input_error("inherited from the parent process");
	rc = rereg_ask_provider(r, flags, pd, addr, len, access);
	if (rc) {
		COUNT(rereg_refused);
		gdrp_info("ibv_rereg_mr of a cached MR: the provider refuses it (%d, %s)", rc,
			  err_name(errno));
		return rc;
	}
	if (!flags)
		return 0;

	if (cacheable(npd, naddr, nlen, (uintptr_t)naddr, (unsigned)naccess) &&
	    cache_reg(npd, naddr, nlen, (unsigned)naccess, &region, &nmr) == 0) {
		r->kind = GDRP_CACHED;
		r->region = region;
		r->real = NULL;
	} else {
		PASS(nmr, reg_mr_iova2, npd, naddr, nlen, (uintptr_t)naddr, (unsigned)naccess);
		if (!nmr)
			return IBV_REREG_MR_ERR_CMD; /* errno from libibverbs */
		r->kind = GDRP_WRAPPED;
		r->region = NULL;
		r->real = nmr;
	}
	r->access = naccess;
	shadow_fill(&r->mr, nmr, npd, naddr, nlen);
	COUNT(rereg);

	if (old.kind == GDRP_CACHED) {
		region_put(old.region);
	} else {
		rc = real_dereg(old.real);
		if (rc)
			gdrp_info("ibv_rereg_mr: releasing the previous MR failed (%s): it stays "
				  "registered",
				  err_name(rc));
	}
	return 0;
}

GDRP_SYMBOL("ibv_rereg_mr@@IBVERBS_1.1")
int gdrp_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len,
		  int access)
{
	struct gdrp_rec *r;
	int rc;

	setup();
	if (!in_lib && !disabled && mr) {
		rc = gdrp_rec_take(mr, &r);
		if (!rc) {
			rc = rereg_shadow(r, flags, pd, addr, len, access);
			gdrp_rec_publish(r);
			return rc;
		}
		if (rc == -EINVAL)
			return rereg_input_error("released already");
	}
	PASS(rc, rereg_mr, mr, flags, pd, addr, len, access);
	return real.rereg_mr ? rc : IBV_REREG_MR_ERR_INPUT;
}

/* ---- Protection domains and devices ------------------------------------------------------------ */

/* Deregister the cache's idle MRs for pd. -EBUSY: the program still holds some. */
static int release_pd(struct ibv_pd *pd)
{
	int rc;

	in_lib++;
	rc = gdr_cache_release_pd(cache, pd);
	in_lib--;
	COUNT(pd_released);
	return rc;
}

static bool cache_in_use(void)
{
	return !in_lib && !disabled && !__atomic_load_n(&forked, __ATOMIC_RELAXED) &&
	       __atomic_load_n(&cache, __ATOMIC_ACQUIRE);
}

/* Once libibverbs has freed pd, another thread may allocate a PD at its address and register GPU
 * memory with it before this returns: pd is forgotten only if nobody noted it since. */
GDRP_SYMBOL("ibv_dealloc_pd@@IBVERBS_1.1")
int gdrp_dealloc_pd(struct ibv_pd *pd)
{
	bool known = false;
	uint64_t notes;
	int rc;

	setup();
	if (cache_in_use() && pd && gdrp_pd_known(pd, &notes)) {
		known = true;
		rc = release_pd(pd);
		if (rc == -EBUSY)
			gdrp_info(
				"pd %p: the program still holds MRs on it: ibv_dealloc_pd says EBUSY",
				(void *)pd);
		else if (rc)
			gdrp_err("gdr_cache_release_pd(%p): %s", (void *)pd, err_name(rc));
	}
	PASS(rc, dealloc_pd, pd);
	if (!real.dealloc_pd)
		return ENOSYS;
	if (!rc && known)
		gdrp_pd_forget(pd, &notes);
	return rc;
}

#define GDRP_BATCH 64
/* How long ibv_close_device waits, at most, for holds on its PDs that calls on other threads still
 * have (GDRP_CLOSE_WAIT_MS tries, a millisecond apart). */
#define GDRP_CLOSE_WAIT_MS 5000

/* pd's shadows the program holds become orphans; their holds are given back. */
static void orphan_pd(struct ibv_pd *pd)
{
	struct gdr_region *regions[GDRP_BATCH];
	unsigned k;

	do {
		k = gdrp_orphan_pd(pd, regions, GDRP_BATCH);
		for (unsigned j = 0; j < k && j < GDRP_BATCH; j++) {
			region_put(regions[j]);
			COUNT(orphaned);
		}
	} while (k > GDRP_BATCH);
}

/* Before ctx goes away: no MR of the cache may outlive it. Shadows the program still holds on it
 * are dropped from the cache (the program's later ibv_dereg_mr of them only frees them). A hold
 * left after that is a call in flight on another thread (an ibv_dereg_mr or ibv_rereg_mr that took
 * its shadow before orphan_pd looked, a registration not yet handed out): it is waited for, and
 * what it publishes orphaned, so that the cache deregisters the MR while the device is open: an MR
 * left in the cache would outlive its device, and be served to the next PD at the same address. */
static void release_context(struct ibv_context *ctx)
{
	struct timespec ms = { 0, 1000000 };
	struct ibv_pd *pds[GDRP_BATCH];
	unsigned n;
	int rc;

	n = gdrp_pds_of(ctx, pds, GDRP_BATCH);
	for (unsigned i = 0; i < n && i < GDRP_BATCH; i++) {
		if (release_pd(pds[i]) == -EBUSY) {
			/* As without the cache: the kernel releases them with the device. */
			gdrp_info("ibv_close_device(%p): the program still held MRs of pd %p; "
				  "they are released with the device",
				  (void *)ctx, (void *)pds[i]);
			for (unsigned t = 0;; t++) {
				orphan_pd(pds[i]);
				rc = release_pd(pds[i]);
				if (rc != -EBUSY || t == GDRP_CLOSE_WAIT_MS)
					break;
				nanosleep(&ms, NULL);
			}
			if (rc)
				gdrp_info("pd %p: the cache still holds MRs as the device closes",
					  (void *)pds[i]);
		}
		gdrp_pd_forget(pds[i], NULL);
	}
	if (n > GDRP_BATCH)
		release_context(ctx); /* the next batch */
}

GDRP_SYMBOL("ibv_close_device@@IBVERBS_1.1")
int gdrp_close_device(struct ibv_context *ctx)
{
	int rc;

	setup();
	if (cache_in_use() && ctx)
		release_context(ctx);
	PASS(rc, close_device, ctx);
	return real.close_device ? rc : ENOSYS;
}

/* ---- Binding: libibverbs' definitions, and which interposer stands for each ------------------ */

static const struct gdrp_entry {
	const char *name, *version;
	void **real; /* libibverbs' definition (real.*), NULL where this libibverbs lacks it */
	void *own;   /* the interposer exported under the same name and version */
} entries[] = {
#define E0(name, field, own)                                                                       \
	{                                                                                          \
		name, "IBVERBS_1.0", (void **)&gdrp_real_1_0.field, (void *)own                    \
	}
	E0("ibv_reg_mr", reg_mr, gdrp_reg_mr_1_0),
	E0("ibv_dereg_mr", dereg_mr, gdrp_dereg_mr_1_0),
	E0("ibv_dealloc_pd", dealloc_pd, gdrp_dealloc_pd_1_0),
	E0("ibv_close_device", close_device, gdrp_close_device_1_0),
#undef E0
#define E(name, version, field, own)                                                               \
	{                                                                                          \
		name, version, (void **)&real.field, (void *)own                                   \
	}
	E("ibv_reg_mr", "IBVERBS_1.1", reg_mr, gdrp_reg_mr),
	E("ibv_reg_mr_iova", "IBVERBS_1.7", reg_mr_iova, gdrp_reg_mr_iova),
	E("ibv_reg_mr_iova2", "IBVERBS_1.8", reg_mr_iova2, gdrp_reg_mr_iova2),
	E("ibv_reg_dmabuf_mr", "IBVERBS_1.12", reg_dmabuf_mr, gdrp_reg_dmabuf_mr),
	E("ibv_reg_mr_ex", "IBVERBS_1.15", reg_mr_ex, gdrp_reg_mr_ex),
	E("ibv_reg_buf_mr", "IBVERBS_1.17", reg_buf_mr, gdrp_reg_buf_mr),
	E("ibv_rereg_mr", "IBVERBS_1.1", rereg_mr, gdrp_rereg_mr),
	E("ibv_dereg_mr", "IBVERBS_1.1", dereg_mr, gdrp_dereg_mr),
	E("ibv_dealloc_pd", "IBVERBS_1.1", dealloc_pd, gdrp_dealloc_pd),
	E("ibv_close_device", "IBVERBS_1.1", close_device, gdrp_close_device),
#undef E
};

#define N_ENTRIES (sizeof(entries) / sizeof(entries[0]))

/*
 * libibverbs' own calls of ibv_reg_mr_iova2: its ibv_reg_mr and ibv_reg_mr_iova (tail-)call it
 * through libibverbs' PLT, which the global scope binds to the preload. Whoever reached those past
 * the preload (a plugin dlopened with RTLD_DEEPBIND binds its verbs to libibverbs first; libc's own
 * dlvsym) releases what they return with libibverbs' ibv_dereg_mr, which must never meet a shadow
 * (a provider destroys the cached MR by its handle, then frees the shadow). So libibverbs' slot for
 * ibv_reg_mr_iova2 is pointed here: libibverbs' own definition, except inside its 1.0 layer, whose
 * registration is an old program's (released through the preload: compat-1_0.c).
 */
static struct ibv_mr *own_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				       unsigned int access)
{
	if (gdrp_in_1_0)
		return gdrp_reg_mr_iova2(pd, addr, len, iova, access);
	return real.reg_mr_iova2(pd, addr, len, iova, access);
}

#if defined(__x86_64__)
#define GDRP_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define GDRP_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define GDRP_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define GDRP_R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

struct relro {
	const struct link_map *l;
	uintptr_t start, end; /* made read-only once relocated (PT_GNU_RELRO) */
};

static int find_relro(struct dl_phdr_info *info, size_t size, void *data)
{
	struct relro *r = data;

	(void)size;
	if (info->dlpi_addr != r->l->l_addr || !info->dlpi_name ||
	    strcmp(info->dlpi_name, r->l->l_name))
		return 0;
	for (unsigned i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
			r->start = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
			r->end = r->start + info->dlpi_phdr[i].p_memsz;
		}
	}
	return 1;
}

/* The protection the mapping holding address a has now (PROT_* bits), read from /proc/self/maps;
 * -1 if it cannot be told. Without stdio or allocation: this runs before anything else is set up.
 * A line: "start-end perms offset dev inode path", start and end in hex. */
static int page_prot(uintptr_t a)
{
	char buf[4096], line[512];
	size_t n = 0;
	ssize_t got;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC), prot = -1;

	if (fd < 0)
		return -1;
	while (prot < 0 && (got = read(fd, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < got && prot < 0; i++) {
			uintptr_t lo, hi;
			char *e;

			if (buf[i] != '\n') {
				if (n < sizeof(line) - 1)
					line[n++] = buf[i];
				continue;
			}
			line[n] = 0;
			n = 0;
			lo = (uintptr_t)strtoull(line, &e, 16);
			if (*e != '-')
				continue;
			hi = (uintptr_t)strtoull(e + 1, &e, 16);
			if (a < lo || a >= hi || *e != ' ' || strlen(e) < 4)
				continue;
			prot = (e[1] == 'r' ? PROT_READ : 0) | (e[2] == 'w' ? PROT_WRITE : 0) |
			       (e[3] == 'x' ? PROT_EXEC : 0);
		}
	}
	close(fd);
	return prot;
}

/* Point a relocation slot of libibverbs at fn. A slot in its RELRO segment lies on a page the
 * loader made read-only, unless that page also holds writable data: the loader protects only the
 * whole pages of the segment, and with 64 KiB pages (aarch64 kernels) the segment's last page
 * often holds .data too. So the page's protection is read, not assumed, and given back as it was
 * (issue 31 #5: setting it read-only after the write made libibverbs' data fault). */
static void slot_set(void **slot, void *fn, const struct relro *r)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)slot;
	void *p = (void *)(a & ~(page - 1));
	int prot = a >= r->start && a < r->end ? page_prot(a) : PROT_READ | PROT_WRITE;

	if (prot < 0)
		prot = PROT_READ; /* cannot tell: as the loader leaves a page wholly in RELRO */
	if (!(prot & PROT_WRITE) && mprotect(p, page, prot | PROT_WRITE)) {
		gdrp_info("libibverbs' relocations can not be written: its own ibv_reg_mr reaches "
			  "the preload");
		return;
	}
	__atomic_store_n(slot, fn, __ATOMIC_RELAXED);
	if (!(prot & PROT_WRITE))
		mprotect(p, page, prot);
}

static void own_calls_bypass(void)
{
#ifdef GDRP_R_JUMP_SLOT
	const ElfW(Rela) * rel[2];
	size_t relsz[2];
	const ElfW(Sym) * symtab;
	const char *strtab;
	struct relro r = { NULL, 0, 0 };
	struct link_map *l = NULL;
	Dl_info info;

	if (!real.reg_mr_iova2 ||
	    !dladdr1((void *)real.reg_mr_iova2, &info, (void **)&l, RTLD_DL_LINKMAP) || !l)
		return;
	rel[0] = (const void *)gdrp_dyn(l, DT_JMPREL, true);
	relsz[0] = gdrp_dyn(l, DT_PLTRELSZ, false);
	rel[1] = (const void *)gdrp_dyn(l, DT_RELA, true);
	relsz[1] = gdrp_dyn(l, DT_RELASZ, false);
	symtab = (const void *)gdrp_dyn(l, DT_SYMTAB, true);
	strtab = (const void *)gdrp_dyn(l, DT_STRTAB, true);
	if (!symtab || !strtab)
		return;
	r.l = l;
	dl_iterate_phdr(find_relro, &r);
	for (unsigned t = 0; t < 2; t++) {
		for (size_t i = 0; rel[t] && i < relsz[t] / sizeof(ElfW(Rela)); i++) {
			const ElfW(Rela) *e = &rel[t][i];
			unsigned long type = ELF64_R_TYPE(e->r_info), sym = ELF64_R_SYM(e->r_info);

			if ((type == GDRP_R_JUMP_SLOT || type == GDRP_R_GLOB_DAT) && sym &&
			    !strcmp(strtab + symtab[sym].st_name, "ibv_reg_mr_iova2"))
				slot_set((void **)(l->l_addr + e->r_offset),
					 (void *)own_reg_mr_iova2, &r);
		}
	}
#endif
}

/* The next definitions after the preload, by version: libibverbs' (another interposer's, if one
 * comes between). A node this libibverbs lacks leaves its slot NULL, quietly: nothing can refer to
 * it, and the program runs as it would without the preload. Then libibverbs' own calls of
 * ibv_reg_mr_iova2 are pointed past the preload (own_reg_mr_iova2). */
static void resolve_all(void)
{
	for (unsigned i = 0; i < N_ENTRIES; i++) {
		*entries[i].real = gdrp_real_dlvsym(RTLD_NEXT, entries[i].name, entries[i].version);
		if (!*entries[i].real)
			gdrp_debug("libibverbs has no %s@%s", entries[i].name, entries[i].version);
	}
	own_calls_bypass();
}

void *gdrp_verbs_lookup(void *found, const char *name, const char *version)
{
	if (!found)
		return NULL;
	setup();
	for (unsigned i = 0; i < N_ENTRIES; i++) {
		const struct gdrp_entry *e = &entries[i];

		if (*e->real && found == *e->real)
			return e->own; /* GDRCACHE_DISABLE: it passes through */
		if (!*e->real && found == e->own) {
			/* RTLD_DEFAULT met the preload's stand-in for what libibverbs lacks: answer
			 * (dlerror included) as the lookup would without the preload. */
			return version ? gdrp_real_dlvsym(RTLD_NEXT, name, version)
				       : gdrp_real_dlsym(RTLD_NEXT, name);
		}
	}
	return found;
}
