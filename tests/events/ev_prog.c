/* SPDX-License-Identifier: MIT */
/*
 * Free interception in every way a program can load libgdrcache, against the fake CUDA driver.
 *
 * One source, built once per load mode (EV_MODE):
 *   linked        the executable links libgdrcache.so
 *   via_so        the executable links only libev_mw.so (this file with EV_LIB), which links
 *                 libgdrcache.so: how libmpi, a UCX or libfabric provider would carry it
 *   dlopen_after  the program initialises "CUDA" and resolves the driver's functions first, then
 *                 dlopens libgdrcache (a plugin, a Python extension)
 *   dlopen_before libgdrcache is dlopen'ed and a cache created before the program touches CUDA
 *   preload       nothing linked; libgdrcache comes by LD_PRELOAD
 * (tests/events/ev_ctypes.py does the same from Python through ctypes.)
 *
 * The program is a CUDA program as the runtime is one: it takes cuGetProcAddress_v2 by dlsym on
 * libcuda's handle and everything else through it, plus a dlsym'ed cuMemFree_v2 (PyTorch's kind
 * of lookup). Several threads share slots of buffers: each step locks a slot, and either registers
 * its buffer, checks that the registration describes it (its BUFFER_ID, from the fake's control
 * API) and releases it, or frees it (by a route taken in turn) and allocates a new one, which the
 * driver usually places at a VA just freed by another slot. A stale registration (one describing
 * a freed buffer) fails the test, as does a mode other than events, or a count of frees seen by
 * the interception that differs from the frees made.
 *
 * Environment: GDRCACHE_LIBCUDA (the fake driver, required), EV_EXPECT=tag (the driver's entries
 * cannot be patched: expect mode tag, still no stale registration), EV_OPS (steps, default 200000).
 * Exit 0 pass, 1 fail, 77 skip.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrcache.h>

#include "cuda/cuda_abi.h"

#define NTHREADS 4
#define NSLOTS 64

#define MODE_LINKED 1
#define MODE_VIA_SO 2
#define MODE_DLOPEN_AFTER 3
#define MODE_DLOPEN_BEFORE 4
#define MODE_PRELOAD 5

#if EV_MODE == MODE_VIA_SO && !defined(EV_LIB)
/* The executable of mode via_so: everything is in libev_mw.so. */
int ev_mw_run(void);

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	return ev_mw_run();
}
#else
/* The library's API as this program reaches it. */
static struct {
	int (*create)(const struct gdr_cache_attr *, struct gdr_cache **);
	int (*destroy)(struct gdr_cache *);
	int (*reg)(struct gdr_cache *, struct ibv_pd *, void *, size_t, int, struct gdr_region **);
	int (*dereg)(struct gdr_region *);
	int (*buffer_id)(const struct gdr_region *, uint64_t *);
	int (*stats)(struct gdr_cache *, struct gdr_cache_stats *);
	int (*istats)(struct gdr_intercept_stats *, size_t);
} api;

/* The "CUDA program". */
typedef gdr_CUresult (*alloc_fn)(gdr_CUdeviceptr *, size_t);
typedef gdr_CUresult (*alloc_async_fn)(gdr_CUdeviceptr *, size_t, void *);
typedef gdr_CUresult (*free_fn)(gdr_CUdeviceptr);
typedef gdr_CUresult (*free_async_fn)(gdr_CUdeviceptr, void *);
static struct {
	void *h;
	alloc_fn alloc;
	alloc_async_fn alloc_async;
	free_fn free_gpa, free_dlsym;
	free_async_fn free_async, free_async_ptsz;
	uint64_t (*buffer_id)(uint64_t va);
} cu;

static int fail(const char *what)
{
	fprintf(stderr, "FAIL: %s\n", what);
	return 1;
}

static int cuda_init(void)
{
	const char *path = getenv("GDRCACHE_LIBCUDA");
	gdr_cuGetProcAddress_v2_t gpa;
	gdr_CUresult (*init)(unsigned);
	int st;

	if (!path)
		return fail("GDRCACHE_LIBCUDA is not set");
	cu.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!cu.h)
		return fail(dlerror());
	gpa = (gdr_cuGetProcAddress_v2_t)dlsym(cu.h, "cuGetProcAddress_v2");
	if (!gpa)
		return fail("no cuGetProcAddress_v2");
	gpa("cuInit", (void **)&init, 2000, 0, &st);
	gpa("cuMemAlloc", (void **)&cu.alloc, 3020, 0, &st);
	gpa("cuMemAllocAsync", (void **)&cu.alloc_async, 11020, 0, &st);
	gpa("cuMemFree", (void **)&cu.free_gpa, 3020, 0, &st);
	gpa("cuMemFreeAsync", (void **)&cu.free_async, 11020, 0, &st);
	gpa("cuMemFreeAsync", (void **)&cu.free_async_ptsz, 11020, 2, &st);
	cu.free_dlsym = (free_fn)dlsym(cu.h, "cuMemFree_v2");
	cu.buffer_id = (uint64_t(*)(uint64_t))dlsym(cu.h, "fake_cuda_buffer_id");
	if (!init || !cu.alloc || !cu.alloc_async || !cu.free_gpa || !cu.free_async ||
	    !cu.free_async_ptsz || !cu.free_dlsym || !cu.buffer_id)
		return fail("the driver lacks an entry point");
	return init(0) ? fail("cuInit") : 0;
}

static __attribute__((unused)) int api_find(void *h)
{
#define F(field, name)                                                                             \
	do {                                                                                       \
		*(void **)&api.field = dlsym(h, name);                                             \
		if (!api.field)                                                                    \
			return fail("libgdrcache lacks " name);                                    \
	} while (0)
	F(create, "gdr_cache_create");
	F(destroy, "gdr_cache_destroy");
	F(reg, "gdr_reg");
	F(dereg, "gdr_dereg");
	F(buffer_id, "gdr_region_buffer_id");
	F(stats, "gdr_cache_get_stats");
	F(istats, "gdr_intercept_get_stats");
#undef F
	return 0;
}

#if EV_MODE == MODE_LINKED || EV_MODE == MODE_VIA_SO

static int api_link(void)
{
	api.create = gdr_cache_create;
	api.destroy = gdr_cache_destroy;
	api.reg = gdr_reg;
	api.dereg = gdr_dereg;
	api.buffer_id = gdr_region_buffer_id;
	api.stats = gdr_cache_get_stats;
	api.istats = gdr_intercept_get_stats;
	return 0;
}
#endif

/* ---- The churn ---------------------------------------------------------------------------------- */

static struct slot {
	pthread_mutex_t lock;
	gdr_CUdeviceptr va;
	size_t size;
} slots[NSLOTS];

static struct gdr_cache *cache;
static uint64_t ops_per_thread;
static uint64_t n_stale, n_regs, n_frees, n_errors;

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static const size_t sizes[] = { 4096, 100, 64 << 10, 1 << 20, 3 << 20 };

static void slot_alloc(struct slot *sl, uint64_t r)
{
	sl->size = sizes[r % 5];
	sl->va = 0;
	if ((r >> 8) & 1)
		cu.alloc_async(&sl->va, sl->size, NULL);
	else
		cu.alloc(&sl->va, sl->size);
	if (!sl->va)
		__atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
}

static void slot_free(struct slot *sl, uint64_t r)
{
	gdr_CUresult rc;

	switch (r % 4) {
	case 0: rc = cu.free_gpa(sl->va); break;
	case 1: rc = cu.free_dlsym(sl->va); break;
	case 2: rc = cu.free_async(sl->va, NULL); break;
	default: rc = cu.free_async_ptsz(sl->va, NULL); break;
	}
	if (rc)
		__atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&n_frees, 1, __ATOMIC_RELAXED);
	sl->va = 0;
}

/* Register, prove the registration describes the live buffer, release. */
static void slot_reg(struct slot *sl, uint64_t r)
{
	size_t off = sl->size > 4096 ? (r % (sl->size / 4096)) * 4096 : 0;
	size_t len = sl->size - off < 4096 ? sl->size - off : 4096;
	struct gdr_region *g;
	uint64_t id = 0;

	if (api.reg(cache, NULL, (void *)(uintptr_t)(sl->va + off), len, 0, &g)) {
		__atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
		return;
	}
	__atomic_add_fetch(&n_regs, 1, __ATOMIC_RELAXED);
	if (api.buffer_id(g, &id) || id != cu.buffer_id(sl->va)) {
		if (__atomic_add_fetch(&n_stale, 1, __ATOMIC_RELAXED) < 5)
			fprintf(stderr, "STALE: %#" PRIx64 "+%zu: registration of buffer %" PRIu64
				", the buffer there is %" PRIu64 "\n", (uint64_t)sl->va, off, id,
				cu.buffer_id(sl->va));
	}
	api.dereg(g);
}

static void *worker(void *arg)
{
	uint64_t s = 0x9e3779b97f4a7c15ull * ((uintptr_t)arg + 1);

	for (uint64_t i = 0; i < ops_per_thread; i++) {
		uint64_t r = rnd(&s);
		struct slot *sl = &slots[r % NSLOTS];

		r >>= 8;
		pthread_mutex_lock(&sl->lock);
		if (r % 8 == 0) {
			slot_free(sl, r >> 3);
			slot_alloc(sl, r >> 5);
		} else {
			slot_reg(sl, r >> 3);
		}
		pthread_mutex_unlock(&sl->lock);
	}
	return NULL;
}

static uint64_t frees_seen(void)
{
	struct gdr_intercept_stats is;

	if (api.istats(&is, sizeof(is)))
		return 0;
	return is.frees[GDR_FREE_MEM_FREE] + is.frees[GDR_FREE_MEM_FREE_ASYNC];
}

static int run(void)
{
	bool expect_tag = getenv("EV_EXPECT") && !strcmp(getenv("EV_EXPECT"), "tag");
	struct gdr_intercept_stats is;
	struct gdr_cache_stats st;
	pthread_t th[NTHREADS];
	uint64_t seen0, seen;
	int rc;

	ops_per_thread = (getenv("EV_OPS") ? strtoull(getenv("EV_OPS"), NULL, 0) : 200000) /
			 NTHREADS;
	rc = cache ? 0 : api.create(NULL, &cache);
	if (rc) {
		fprintf(stderr, "gdr_cache_create: %d\n", rc);
		return 1;
	}
	api.stats(cache, &st);
	api.istats(&is, sizeof(is));
	printf("validation mode %s; interception: %d (%s)\n",
	       st.validate_mode == GDR_VALIDATE_EVENTS ? "events" : "tag", is.state, is.reason);
	if (expect_tag ? st.validate_mode != GDR_VALIDATE_TAG || !is.state
		       : st.validate_mode != GDR_VALIDATE_EVENTS || is.state)
		return fail("unexpected validation mode");

	for (int i = 0; i < NSLOTS; i++) {
		pthread_mutex_init(&slots[i].lock, NULL);
		slot_alloc(&slots[i], (uint64_t)i * 7);
	}
	seen0 = frees_seen();
	for (uintptr_t i = 0; i < NTHREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)i);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < NSLOTS; i++)
		slot_free(&slots[i], (uint64_t)i);
	seen = frees_seen() - seen0;
	api.stats(cache, &st);
	printf("%" PRIu64 " registrations, %" PRIu64 " stale, %" PRIu64 " frees made, %" PRIu64
	       " seen, %" PRIu64 " errors; cache: hits %" PRIu64 " misses %" PRIu64 " stale %" PRIu64
	       " events %" PRIu64 "\n", n_regs, n_stale, n_frees, seen, n_errors, st.hits, st.misses,
	       st.stale, st.events);
	if (api.destroy(cache))
		return fail("gdr_cache_destroy");
	if (n_stale)
		return fail("stale registrations");
	if (n_errors)
		return fail("failed driver or library calls");
	if (!expect_tag && seen != n_frees)
		return fail("frees seen differ from frees made");
	if (n_regs < ops_per_thread * NTHREADS / 2)
		return fail("too few registrations");
	return 0;
}

#ifdef EV_LIB
/* libev_mw.so: the "middleware" that carries libgdrcache. */
int ev_mw_run(void);
int ev_mw_run(void)
{
	return api_link() || cuda_init() || run();
}
#else
int main(int argc, char **argv)
{
	(void)argc, (void)argv;
	setvbuf(stdout, NULL, _IONBF, 0);
#if EV_MODE == MODE_LINKED
	return api_link() || cuda_init() || run();
#elif EV_MODE == MODE_DLOPEN_AFTER
	/* "CUDA" first: pointers resolved and memory allocated before libgdrcache exists here. */
	void *h;
	gdr_CUdeviceptr early = 0;

	if (cuda_init() || cu.alloc(&early, 1 << 20))
		return 1;
	h = dlopen(argc > 1 ? argv[1] : "libgdrcache.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return fail(dlerror());
	if (api_find(h))
		return 1;
	int rc = run();
	/* a pointer resolved before the library was loaded, freeing memory allocated before too */
	uint64_t seen = frees_seen();

	if (cu.free_gpa(early))
		return fail("free of the early buffer");
	if (frees_seen() != seen + 1)
		return fail("a free through a pointer resolved before libgdrcache was loaded was not seen");
	return rc;
#elif EV_MODE == MODE_DLOPEN_BEFORE
	void *h = dlopen(argc > 1 ? argv[1] : "libgdrcache.so.0", RTLD_NOW | RTLD_LOCAL);

	if (!h)
		return fail(dlerror());
	if (api_find(h))
		return 1;
	/* The cache loads the driver itself, before the program has touched it. */
	if (api.create(NULL, &cache))
		return fail("gdr_cache_create");
	return cuda_init() || run();
#elif EV_MODE == MODE_PRELOAD
	if (!dlsym(RTLD_DEFAULT, "gdr_cache_create"))
		return 77; /* not preloaded (e.g. under a sanitizer) */
	return api_find(RTLD_DEFAULT) || cuda_init() || run();
#else
#error "EV_MODE"
#endif
}
#endif
#endif /* mode via_so, the executable */
