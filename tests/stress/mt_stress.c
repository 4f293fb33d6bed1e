/* SPDX-License-Identifier: MIT */
/*
 * Multi-threaded stress, meant to run under ThreadSanitizer: threads register and release their own
 * buffers and one shared buffer, while a churn thread frees and reallocates buffers at the same VA
 * and flushes. Every registration must name the allocation now at its address; at the end nothing
 * is pinned or registered. In mode events the frees publish free events first, as the library's
 * interception of the driver's free functions does (tests/stress/diff_test.c says why).
 * Usage: mt_stress [threads] [iterations per thread] [tag|events]
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "intercept/events.h"
#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)
#define PER_THREAD 4

static struct gdr_cache *cache;
static uint64_t shared_buf;
static int iters = 20000;
static atomic_int stop, failures;
static uint64_t churn[8];
static pthread_mutex_t churn_lock = PTHREAD_MUTEX_INITIALIZER;
static bool events_mode;

static void xfree(uint64_t a)
{
	if (events_mode)
		gdr_events_push(a, 0);
	fake_cuda_free(a);
}

static int probe_simulated(const char **why)
{
	(void)why;
	return 0;
}

static void fail(const char *what, uint64_t a)
{
	fprintf(stderr, "mt_stress: %s at %#" PRIx64 "\n", what, a);
	atomic_fetch_add(&failures, 1);
}

static void reg_check(uint64_t a, uint64_t len, struct ibv_pd *pd, bool must_match)
{
	struct gdr_region *r;
	uint64_t id;
	int rc = gdr_reg(cache, pd, (void *)(uintptr_t)a, len, pd ? 1 : 0, &r);

	if (rc) {
		if (must_match)
			fail("gdr_reg failed", a);
		return;
	}
	gdr_region_buffer_id(r, &id);
	/* Buffers only this thread frees never change under it: the id must be the current one. */
	if (must_match && id != fake_cuda_buffer_id(a))
		fail("stale registration", a);
	if (gdr_dereg(r))
		fail("gdr_dereg failed", a);
}

static void *worker(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;
	uint64_t mine[PER_THREAD];

	for (int i = 0; i < PER_THREAD; i++)
		mine[i] = fake_cuda_alloc((size_t)(1 + i) * 256 * 1024);
	for (int it = 0; it < iters; it++) {
		int i = rand_r(&seed) % PER_THREAD;

		reg_check(mine[i] + 4096 * (rand_r(&seed) % 8), 4096, (it & 3) ? NULL : FAKE_PD, true);
		reg_check(shared_buf, 8192, NULL, true);
		if (it % 64 == 0) {
			/* free and reallocate one of ours: same size, usually the same VA */
			xfree(mine[i]);
			mine[i] = fake_cuda_alloc((size_t)(1 + i) * 256 * 1024);
			reg_check(mine[i], 4096, NULL, true);
		}
		if (it % 16 == 0) {
			uint64_t a;

			pthread_mutex_lock(&churn_lock);
			a = churn[rand_r(&seed) % 8];
			pthread_mutex_unlock(&churn_lock);
			/* the churn thread may free it under us: any outcome but a crash is fine */
			reg_check(a, 4096, NULL, false);
		}
	}
	for (int i = 0; i < PER_THREAD; i++)
		xfree(mine[i]);
	return NULL;
}

static void *churner(void *arg)
{
	unsigned seed = 7;

	(void)arg;
	while (!atomic_load(&stop)) {
		int i = rand_r(&seed) % 8;

		pthread_mutex_lock(&churn_lock);
		xfree(churn[i]);
		churn[i] = fake_cuda_alloc(2 * MiB);
		pthread_mutex_unlock(&churn_lock);
		if (rand_r(&seed) % 32 == 0)
			gdr_cache_flush(cache);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int nthreads = argc > 1 ? atoi(argv[1]) : 8;
	struct gdr_cache_attr attr = {
		.field_mask = GDR_CACHE_ATTR_MAX_ENTRIES,
		.max_entries = 16,
	};
	pthread_t t[64], ch;
	struct gdr_cache_stats st;

	if (argc > 2)
		iters = atoi(argv[2]);
	events_mode = argc > 3 && !strcmp(argv[3], "events");
	attr.field_mask |= GDR_CACHE_ATTR_VALIDATE;
	attr.validate = events_mode ? GDR_VALIDATE_EVENTS : GDR_VALIDATE_TAG;
	fake_seams.events_probe = probe_simulated;
	if (nthreads < 1 || nthreads > 64)
		return 2;
	fake_verbs_install();
	if (fake_cache_create(&attr, &fake_backend_ops, &cache))
		return 1;
	shared_buf = fake_cuda_alloc(1 * MiB);
	for (int i = 0; i < 8; i++)
		churn[i] = fake_cuda_alloc(2 * MiB);
	pthread_create(&ch, NULL, churner, NULL);
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	atomic_store(&stop, 1);
	pthread_join(ch, NULL);
	gdr_cache_get_stats(cache, &st);
	if (gdr_cache_destroy(cache) || fake_be.outstanding || fake_verbs.outstanding)
		fail("leak at the end", 0);
	printf("mt_stress: %d threads x %d iterations (validation %s): %" PRIu64 " hits (%" PRIu64
	       " lock-free), %" PRIu64 " misses, %" PRIu64 " stale, %" PRIu64 " free events, %" PRIu64
	       " evictions, %d failures\n", nthreads, iters, events_mode ? "events" : "tag", st.hits,
	       st.fast_hits, st.misses, st.stale, st.events, st.evictions, atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}
