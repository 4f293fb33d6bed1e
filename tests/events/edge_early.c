/* SPDX-License-Identifier: MIT */
/*
 * A cache created before the program has made any CUDA context (middleware that creates its cache
 * at its own initialisation, MPI_Init, before the application calls cudaSetDevice), against the
 * fake driver (GDRCACHE_LIBCUDA) in the real driver API's default: a new thread has no current
 * context and no primary context is active until the program retains one.
 *
 * The entries are patched all the same (the interception does not need a context): once the
 * program has a context, a cache created then must validate by free events, and frees through
 * every route must be seen. Then the buffers churn: no registration may describe a freed buffer.
 *
 * With argv[2] "otherdev" the program's one context is device 1's, made current on its main thread,
 * and the caches are created on another thread (a progress thread, which has no context): one
 * rank per GPU on a node, every rank but device 0's. Its caches must validate by events too.
 *
 * argv[1]: libgdrcache's path. Exit 0 pass, 1 fail.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrcache.h>

#include "cuda/cuda_abi.h"

static int fail(const char *what)
{
	fprintf(stderr, "FAIL: %s\n", what);
	return 1;
}

static struct {
	int (*create)(const struct gdr_cache_attr *, struct gdr_cache **);
	int (*destroy)(struct gdr_cache *);
	int (*reg)(struct gdr_cache *, struct ibv_pd *, void *, size_t, int, struct gdr_region **);
	int (*dereg)(struct gdr_region *);
	int (*buffer_id)(const struct gdr_region *, uint64_t *);
	int (*stats)(struct gdr_cache *, struct gdr_cache_stats *);
	int (*istats)(struct gdr_intercept_stats *, size_t);
} api;

static struct gdr_cache *made_on_thread;

static void *create_on_thread(void *arg)
{
	(void)arg;
	if (api.create(NULL, &made_on_thread))
		made_on_thread = NULL;
	return NULL;
}

static bool events_mode(struct gdr_cache *c, const char *when)
{
	struct gdr_cache_stats st;
	struct gdr_intercept_stats is;

	api.stats(c, &st);
	api.istats(&is, sizeof(is));
	printf("%s: validation mode %s; interception %d (%s)\n", when,
	       st.validate_mode == GDR_VALIDATE_EVENTS ? "events" : "tag", is.state, is.reason);
	return st.validate_mode == GDR_VALIDATE_EVENTS;
}

int main(int argc, char **argv)
{
	const char *path = getenv("GDRCACHE_LIBCUDA");
	gdr_cuGetProcAddress_v2_t gpa;
	gdr_CUresult (*init)(unsigned) = NULL, (*retain)(gdr_CUcontext *, int) = NULL;
	gdr_CUresult (*set_current)(gdr_CUcontext) = NULL,
		     (*alloc)(gdr_CUdeviceptr *, size_t) = NULL;
	gdr_CUresult (*free_gpa)(gdr_CUdeviceptr) = NULL;
	void (*threads_have_context)(bool);
	int (*device_count)(int);
	bool otherdev = argc > 2 && !strcmp(argv[2], "otherdev");
	pthread_t th;
	uint64_t (*fake_id)(uint64_t);
	struct gdr_cache *early = NULL, *late = NULL;
	gdr_CUcontext ctx = NULL;
	gdr_CUdeviceptr va = 0;
	void *h, *g;
	int st, stale = 0;

	setvbuf(stdout, NULL, _IONBF, 0);
	if (!path || argc < 2)
		return fail("GDRCACHE_LIBCUDA and argv[1] (libgdrcache) are needed");
	/* The driver as a real one behaves: no context anywhere until the program makes one. */
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return fail(dlerror());
	threads_have_context = (void (*)(bool))dlsym(h, "fake_cuda_set_threads_have_context");
	fake_id = (uint64_t(*)(uint64_t))dlsym(h, "fake_cuda_buffer_id");
	gpa = (gdr_cuGetProcAddress_v2_t)dlsym(h, "cuGetProcAddress_v2");
	device_count = (int (*)(int))dlsym(h, "fake_cuda_set_device_count");
	if (!threads_have_context || !fake_id || !gpa || !device_count)
		return fail("the fake driver lacks a control entry");
	threads_have_context(false);
	if (otherdev && device_count(2))
		return fail("two devices");

	/* 1. the middleware's initialisation: its cache, before the program touches CUDA */
	g = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!g)
		return fail(dlerror());
#define F(field, name)                                                                             \
	if (!(*(void **)&api.field = dlsym(g, name)))                                              \
		return fail("libgdrcache lacks " name);
	F(create, "gdr_cache_create");
	F(destroy, "gdr_cache_destroy");
	F(reg, "gdr_reg");
	F(dereg, "gdr_dereg");
	F(buffer_id, "gdr_region_buffer_id");
	F(stats, "gdr_cache_get_stats");
	F(istats, "gdr_intercept_get_stats");
#undef F
	if (!otherdev) {
		if (api.create(NULL, &early))
			return fail("gdr_cache_create before CUDA");
		events_mode(early, "cache made before the program's context");
	}

	/* 2. the application: cudaSetDevice(0) as the runtime does it */
	gpa("cuInit", (void **)&init, 2000, 0, &st);
	gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 7000, 0, &st);
	gpa("cuCtxSetCurrent", (void **)&set_current, 4000, 0, &st);
	gpa("cuMemAlloc", (void **)&alloc, 3020, 0, &st);
	gpa("cuMemFree", (void **)&free_gpa, 3020, 0, &st);
	if (!init || !retain || !set_current || !alloc || !free_gpa)
		return fail("cuGetProcAddress");
	if (init(0) || retain(&ctx, otherdev ? 1 : 0) || set_current(ctx))
		return fail("the program's context");

	/* 3. a cache made now: the free interception is in place, the fast path must be on */
	if (otherdev) {
		pthread_create(&th, NULL, create_on_thread, NULL);
		pthread_join(th, NULL);
		late = made_on_thread;
		if (api.create(NULL, &early)) /* and one on the main thread, for the churn */
			return fail("gdr_cache_create");
	} else if (api.create(NULL, &late)) {
		late = NULL;
	}
	if (!late)
		return fail("gdr_cache_create after CUDA");
	bool ok = events_mode(late, otherdev ? "cache made on a thread without a context"
					     : "cache made after the program's context");

	/* and, whatever the mode, nothing stale */
	if (alloc(&va, 4 << 20))
		return fail("cuMemAlloc");
	for (int i = 0; i < 20; i++) {
		struct gdr_cache *cs[2] = { early, late };

		for (int k = 0; k < 2; k++) {
			struct gdr_region *r = NULL;
			uint64_t id = 0;

			if (api.reg(cs[k], NULL, (void *)(uintptr_t)va, 4096, 0, &r))
				return fail("gdr_reg");
			api.buffer_id(r, &id);
			api.dereg(r);
			stale += id != fake_id(va);
		}
		free_gpa(va);
		va = 0;
		if (alloc(&va, 4 << 20))
			return fail("cuMemAlloc");
	}
	free_gpa(va);
	api.destroy(early);
	api.destroy(late);
	if (stale)
		return fail("stale registrations");
	if (!ok)
		return fail(
			otherdev ? "a cache created on a thread without a context validates by "
				   "tag though the free interception is in place (the probe "
				   "borrows device 0's primary context, inactive here)"
				 : "a cache created once the program has a CUDA context validates "
				   "by tag: the probe's failure before any context existed was "
				   "kept for good");
	return 0;
}
