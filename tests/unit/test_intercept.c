/* SPDX-License-Identifier: MIT */
/*
 * The interception of the driver's free and allocation functions (lib/intercept/hooks.c) inside one process,
 * against the fake driver, whose exported entries begin with libcuda's real prologue and are
 * patched by the library when it loads the driver:
 *  - a registration made while a free of its buffer is inside the driver is not cached: it waits
 *    for the free, and the next allocation at that VA gets a registration of the new buffer (the
 *    interleaving is forced: the fake stops inside cuMemFree_v2 until the test lets it go);
 *  - unreferenced pins of freed memory are released before the free returns, held ones at their
 *    last release;
 *  - an allocation that runs out of memory releases unreferenced pins and is retried once, in
 *    modes events and tag;
 *  - an allocation at a VA that a cached tag still describes (the driver freed it on its own)
 *    drops the entry;
 *  - every free entry point is counted under its route;
 *  - a free of an allocation that shares a chunk with a cached one, and a primary-context release
 *    that is not the last, drop nothing (issue 11); the last release drops what it freed.
 * Simulated: the fake's out-of-memory failure is injected (fake_cuda_fail_next), not real.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda/cuda_abi.h"
#include "intercept/events.h"
#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "fixture.h"

#define MiB (1024ULL * 1024)

/* A wait for another thread of this test, for what takes microseconds: its deadline (times
 * GDR_TEST_WAIT_SCALE, as gdr_deadline_s(WAIT_MS) says it). */
#define WAIT_MS 60000

/* pthread_cond_wait until deadline (gdr_deadline_ms): whether the deadline passed. */
static bool cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline)
{
	struct timespec ts = { deadline / 1000000000, deadline % 1000000000 };

	return pthread_cond_clockwait(c, m, CLOCK_MONOTONIC, &ts) == ETIMEDOUT;
}

/* The fake's exported entries (their first bytes are libcuda's; the library patched them). */
gdr_CUresult cuMemAlloc_v2(gdr_CUdeviceptr *p, size_t n);
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);
gdr_CUresult cuMemFreeHost(void *p);
gdr_CUresult cuMemAllocHost_v2(void **p, size_t n);
gdr_CUresult cuMemUnmap(gdr_CUdeviceptr p, size_t n);
gdr_CUresult cuCtxDestroy_v2(gdr_CUcontext c);
gdr_CUresult cuDevicePrimaryCtxRetain(gdr_CUcontext *c, gdr_CUdevice d);
gdr_CUresult cuDevicePrimaryCtxRelease_v2(gdr_CUdevice d);

static struct gdr_cache *cache;

static struct gdr_cache *make(int mode)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE, .validate = mode };
	struct gdr_cache *c = NULL;

	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	return c;
}

static int setup(void **state)
{
	(void)state;
	fake_cuda_reset();
	fake_backend_reset();
	cache = make(GDR_VALIDATE_EVENTS);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fake_cuda_set_enter_hook(NULL, NULL);
	fixture_end(&cache);
	return 0;
}

static struct gdr_intercept_stats istats(void)
{
	struct gdr_intercept_stats s;

	assert_int_equal(gdr_intercept_get_stats(&s, sizeof(s)), 0);
	return s;
}

static uint64_t region_id(struct gdr_region *r)
{
	uint64_t id;

	assert_int_equal(gdr_region_buffer_id(r, &id), 0);
	return id;
}

static uint64_t alloc(size_t n)
{
	gdr_CUdeviceptr p = 0;

	assert_int_equal(cuMemAlloc_v2(&p, n), GDR_CUDA_SUCCESS);
	return p;
}

static void test_probe_proves_every_route(void **state)
{
	struct gdr_cache_stats st;
	struct gdr_intercept_stats is = istats();

	(void)state;
	assert_int_equal(is.state, 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st), 0);
	assert_int_equal(st.validate_mode, GDR_VALIDATE_EVENTS);
}

/* ---- the forced interleaving ---------------------------------------------------------------------- */

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int inside; /* the freeing thread is inside the driver's cuMemFree_v2 */
	int go;     /* let it free */
	uint64_t va;
	int reg_rc, reg_done;
	uint64_t reg_id;
} pause_ = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0 };

static void enter_hook(const char *entry, void *arg)
{
	int64_t deadline = gdr_deadline_ms(WAIT_MS);

	(void)arg;
	if (strcmp(entry, "cuMemFree_v2"))
		return;
	pthread_mutex_lock(&pause_.lock);
	pause_.inside = 1;
	pthread_cond_broadcast(&pause_.cond);
	while (!pause_.go && !cond_wait_until(&pause_.cond, &pause_.lock, deadline))
		;
	if (!pause_.go) /* the test that stopped it failed before it let it go */
		fprintf(stderr,
			"the free stopped inside cuMemFree_v2 was not let go within %lld s: "
			"it goes on\n",
			gdr_deadline_s(WAIT_MS));
	pthread_mutex_unlock(&pause_.lock);
}

static void *freer(void *arg)
{
	(void)arg;
	assert_int_equal(cuMemFree_v2(pause_.va), GDR_CUDA_SUCCESS);
	return NULL;
}

/* Let the stopped free go on (or one that gets there later pass). */
static void free_let_go(void)
{
	pthread_mutex_lock(&pause_.lock);
	pause_.go = 1;
	pthread_cond_broadcast(&pause_.cond);
	pthread_mutex_unlock(&pause_.lock);
}

/* Start a thread freeing pause_.va (allocated here) and wait until it is stopped in the driver. */
static void free_paused(pthread_t *tf, size_t size)
{
	int64_t deadline;
	int inside;

	pause_.va = alloc(size);
	pause_.inside = pause_.go = pause_.reg_done = 0;
	fake_cuda_set_enter_hook(enter_hook, NULL);
	assert_int_equal(pthread_create(tf, NULL, freer, NULL), 0);
	deadline = gdr_deadline_ms(WAIT_MS);
	pthread_mutex_lock(&pause_.lock);
	while (!pause_.inside && !cond_wait_until(&pause_.cond, &pause_.lock, deadline))
		;
	inside = pause_.inside;
	pthread_mutex_unlock(&pause_.lock);
	if (!inside) {
		free_let_go();
		fail_msg("the freeing thread did not reach the driver's cuMemFree_v2 within %lld s "
			 "(stuck in the library's free hook?)",
			 gdr_deadline_s(WAIT_MS));
	}
}

/* Let the free go on and wait for it. */
static void free_resume(pthread_t tf)
{
	free_let_go();
	pthread_join(tf, NULL);
	fake_cuda_set_enter_hook(NULL, NULL);
}

static void *registrar(void *arg)
{
	struct gdr_region *r = NULL;

	(void)arg;
	pause_.reg_rc = gdr_reg(cache, NULL, (void *)(uintptr_t)pause_.va, 4096, 0, &r);
	if (!pause_.reg_rc) {
		pause_.reg_id = region_id(r);
		gdr_dereg(r);
	}
	__atomic_store_n(&pause_.reg_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_registration_during_free_is_not_cached(void **state)
{
	pthread_t tf, tr;
	struct gdr_region *r;
	uint64_t waits0 = istats().reg_waits, old_id, va2;
	int64_t deadline;

	(void)state;
	/* 1. a thread frees the buffer; the driver stops inside the free, the buffer still alive */
	free_paused(&tf, 4 * MiB);
	old_id = fake_cuda_buffer_id(pause_.va);
	assert_int_equal(gdr_events_inflight_count(), 1);
	/* 2. another registers it now: it classifies a live buffer, so it must wait, not cache (a
	 * registration that returns while the free is stopped has cached the dying buffer) */
	assert_int_equal(pthread_create(&tr, NULL, registrar, NULL), 0);
	deadline = gdr_deadline_ms(WAIT_MS);
	while (istats().reg_waits == waits0 &&
	       !__atomic_load_n(&pause_.reg_done, __ATOMIC_ACQUIRE)) {
		if (gdr_deadline_passed(deadline)) {
			free_let_go();
			fail_msg(
				"a registration during the free neither waited for it nor returned "
				"within %lld s",
				gdr_deadline_s(WAIT_MS));
		}
		sched_yield();
	}
	/* 3. the free goes on and returns */
	free_resume(tf);
	if (gdr_join_until(tr, gdr_deadline_ms(WAIT_MS)))
		fail_msg(
			"the registration that waited for the free did not return within %lld s of "
			"the free's end",
			gdr_deadline_s(WAIT_MS));
	/* the waiting registration saw the freed memory: refused (not GPU memory, no PD), or the
	 * buffer of a later allocation; never the freed one */
	assert_true(pause_.reg_rc != 0 || pause_.reg_id != old_id);
	/* 4. the next allocation of that size lands at the same VA: its registration is its own.
	 * Made through the fake's control call, which no hook sees: an intercepted allocation's own
	 * event would drop a stale entry too, and this test proves the rule of frees in flight alone
	 * (an allocation the driver makes for a graph is not intercepted either). */
	va2 = fake_cuda_alloc(4 * MiB);
	assert_int_equal(va2, pause_.va);
	r = NULL;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)va2, 4096, 0, &r), 0);
	assert_int_equal(region_id(r), fake_cuda_buffer_id(va2));
	assert_int_not_equal(region_id(r), old_id);
	assert_true(fake_backend_pin_current(r, va2, 4096));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(cuMemFree_v2(va2), GDR_CUDA_SUCCESS);
	assert_int_equal(gdr_events_inflight_count(), 0);
}

/* fork() while another thread is inside a free: the child has no such thread, so the free it had
 * announced never ends there; the child must still register (not wait for ever). */
static void test_fork_during_free(void **state)
{
	struct gdr_region *r = NULL;
	unsigned alarm_s = 20 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
	pthread_t tf;
	int status = -1;
	pid_t pid;

	(void)state;
	free_paused(&tf, 4 * MiB);
	pid = fork();
	if (pid == 0) {
		alarm(alarm_s); /* a hang fails the test instead of stalling it */
		_exit(gdr_reg(cache, NULL, (void *)(uintptr_t)pause_.va, 4096, 0, &r) == 0 &&
				      gdr_dereg(r) == 0
			      ? 0
			      : 1);
	}
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	free_resume(tf);
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
		fail_msg(
			"the child of fork() hung registering (killed by its alarm after %u s): it "
			"waited for a free its parent's other thread had in flight",
			alarm_s);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- acting before the free returns ------------------------------------------------------------ */

static void test_unreferenced_pin_released_inside_free(void **state)
{
	uint64_t a = alloc(2 * MiB), released0 = istats().released;
	struct gdr_region *r = NULL;

	(void)state;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_be.outstanding, 1); /* cached, unreferenced */
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	/* no cache operation since: the free itself released it */
	assert_int_equal(fake_be.outstanding, 0);
	assert_int_equal(istats().released, released0 + 1);
}

static void test_held_pin_released_at_last_dereg(void **state)
{
	uint64_t a = alloc(2 * MiB);
	struct gdr_region *r = NULL, *r2 = NULL;

	(void)state;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 8192, 0, &r2), 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_be.outstanding, 1); /* the program still holds it */
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_be.outstanding, 1);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(fake_be.outstanding, 0);
}

static void test_dmabuf_closed_before_free_returns(void **state)
{
	struct gdr_cache *c = NULL;
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND,
				    .backend = GDR_BACKEND_DMABUF };
	struct gdr_region *r = NULL;
	uint64_t p = alloc(4 * MiB);
	int open0 = fake_cuda_open_dmabufs();

	(void)state;
	assert_int_equal(gdr_cache_create(&a, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)p, 1 * MiB, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_cuda_open_dmabufs(), open0 + 1);
	assert_int_equal(cuMemFree_v2(p), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_open_dmabufs(), open0);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

/* ---- out-of-memory relief ------------------------------------------------------------------------ */

static void oom_relief(int mode)
{
	struct gdr_intercept_stats s0 = istats(), s1;
	struct gdr_cache *c = make(mode);
	gdr_CUdeviceptr p = 0;
	uint64_t a[4];

	for (int i = 0; i < 4; i++) {
		struct gdr_region *r = NULL;

		a[i] = alloc(2 * MiB);
		assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a[i], 4096, 0, &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
	}
	assert_int_equal(fake_be.outstanding, 4);
	/* SIMULATED: the next allocation fails for lack of memory, once */
	assert_int_equal(fake_cuda_fail_next("cuMemAlloc_v2", GDR_CUDA_ERROR_OUT_OF_MEMORY, 1), 0);
	assert_int_equal(cuMemAlloc_v2(&p, 2 * MiB), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_be.outstanding, 0);
	s1 = istats();
	assert_int_equal(s1.oom_relief, s0.oom_relief + 1);
	assert_int_equal(s1.oom_retry_ok, s0.oom_retry_ok + 1);
	/* nothing to release: the failure stands, no retry */
	assert_int_equal(fake_cuda_fail_next("cuMemAlloc_v2", GDR_CUDA_ERROR_OUT_OF_MEMORY, 1), 0);
	gdr_CUdeviceptr q = 0;

	assert_int_equal(cuMemAlloc_v2(&q, 2 * MiB), GDR_CUDA_ERROR_OUT_OF_MEMORY);
	assert_int_equal(istats().oom_retry_ok, s1.oom_retry_ok);
	for (int i = 0; i < 4; i++)
		assert_int_equal(cuMemFree_v2(a[i]), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFree_v2(p), GDR_CUDA_SUCCESS);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

static void test_oom_relief_events(void **state)
{
	(void)state;
	oom_relief(GDR_VALIDATE_EVENTS);
}

static void test_oom_relief_tag(void **state)
{
	(void)state;
	oom_relief(GDR_VALIDATE_TAG);
}

/* ---- allocation events ------------------------------------------------------------------------- */

static void test_allocation_at_cached_va_drops_entry(void **state)
{
	uint64_t a = alloc(4096), b, stale0;
	struct gdr_region *r = NULL;
	struct gdr_cache_stats st;

	(void)state;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st), 0);
	stale0 = st.stale;
	/* freed without an intercepted free (as the driver frees graph memory on its own) */
	assert_int_equal(fake_cuda_free(a), 0);
	b = alloc(4096);
	assert_int_equal(b, a);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)b, 4096, 0, &r), 0);
	assert_int_equal(region_id(r), fake_cuda_buffer_id(b));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st), 0);
	assert_int_equal(st.stale, stale0 + 1);
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
}

/* ---- frees that leave an entry's pages as they were (issue 11) ---------------------------------- */

static void test_neighbour_free_keeps_entry(void **state)
{
	uint64_t a = alloc(4096), b = alloc(4096);
	struct gdr_region *r = NULL;
	struct gdr_cache_stats st0, st;

	(void)state;
	/* b shares a's 2 MiB chunk and its first 64 KiB page: pinned with a, never registered */
	assert_true(b > a && b < a + 65536);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st0), 0);
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_be.outstanding, 1); /* a's chunk stays mapped: nothing to drop */
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(region_id(r), fake_cuda_buffer_id(a));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st), 0);
	assert_int_equal(st.misses, st0.misses);
	assert_int_equal(st.stale, st0.stale);
	/* a's own free still drops it, inside the free */
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_be.outstanding, 0);
}

static void test_primary_release_drops_only_freed(void **state)
{
	gdr_CUcontext ctx = NULL;
	uint64_t a;
	struct gdr_region *r = NULL;
	struct gdr_cache_stats st0, st;

	(void)state;
	/* the application's two references (the fake counts them from 0 in this process) */
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), GDR_CUDA_SUCCESS);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), GDR_CUDA_SUCCESS);
	a = alloc(4096);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st0), 0);
	/* not the last: the context and its memory live on, and so does the entry */
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(0), GDR_CUDA_SUCCESS);
	assert_int_not_equal(fake_cuda_buffer_id(a), 0);
	assert_int_equal(fake_be.outstanding, 1);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st), 0);
	assert_int_equal(st.misses, st0.misses);
	/* the last: the memory goes, and the entry with it, before the release returns */
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(0), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_buffer_id(a), 0);
	assert_int_equal(fake_be.outstanding, 0);
}

/* ---- the library's own release of a borrowed primary context ------------------------------- */

/* cuda.c's borrow (a dma-buf export on a thread without the device's context), as internal API. */
void *gdr_cuda_context_borrow(int device, int *err);
void gdr_cuda_context_return(void *borrowed);

static struct {
	int armed;         /* retain device 0's primary at the next state look */
	int retained;      /* done: the test owes a release */
	unsigned inflight; /* frees announced when the driver's release was entered */
	int at_release;    /* armed for that look */
} own;

/* Another thread's retain at once after the driver's release: at the hook's look at the state
 * (the old code looked), here on the releasing thread, which is the same to the driver. */
static void own_on_enter(const char *entry, void *arg)
{
	gdr_CUcontext c;

	(void)arg;
	if (own.armed && !strcmp(entry, "cuDevicePrimaryCtxGetState")) {
		own.armed = 0;
		if (cuDevicePrimaryCtxRetain(&c, 0) == GDR_CUDA_SUCCESS)
			own.retained = 1;
	}
	if (own.at_release && !strcmp(entry, "cuDevicePrimaryCtxRelease_v2")) {
		own.at_release = 0;
		own.inflight = gdr_events_inflight_count();
	}
}

/* A thread without a context (an MPI progress thread) borrows device 0's primary context as a
 * dma-buf export does, optionally lets the application release its reference meanwhile (on this
 * thread: the same to the driver), and gives the borrow back with own_on_enter watching. */
struct own_run {
	bool app_release; /* the application's release, between the borrow and its return */
	int borrowed, released_rc;
	uint64_t va, id_between; /* the BUFFER_ID of va after the application's release */
};

static void *own_thread(void *p)
{
	struct own_run *o = p;
	void *b;
	int err;

	b = gdr_cuda_context_borrow(0, &err);
	o->borrowed = b != NULL;
	if (!b)
		return NULL;
	if (o->app_release) {
		o->released_rc = cuDevicePrimaryCtxRelease_v2(0);
		o->id_between = fake_cuda_buffer_id(o->va);
	}
	fake_cuda_set_enter_hook(own_on_enter, NULL);
	gdr_cuda_context_return(b);
	fake_cuda_set_enter_hook(NULL, NULL);
	return NULL;
}

static void own_run(struct own_run *o)
{
	pthread_t th;

	fake_cuda_set_threads_have_context(false);
	assert_int_equal(pthread_create(&th, NULL, own_thread, o), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	fake_cuda_set_threads_have_context(true);
	assert_true(o->borrowed);
}

/* Issue 31 #1: the application releases its reference while the library holds a borrowed one;
 * the library's release is then the last and frees the context's memory, and another thread
 * retains the context at once. The cached entry of that memory must be gone before the library's
 * release returns (the old hook took "active again" for "not the last": the pin stayed, 2 MiB). */
static void test_own_release_last_drops_memory(void **state)
{
	gdr_CUcontext ctx = NULL;
	struct gdr_region *r = NULL;
	struct gdr_intercept_stats s0, s1;
	struct own_run o = { .app_release = true };

	(void)state;
	/* so that the application's release below can leave the borrow's the last */
	assert_int_equal(fake_cuda_primary_refs(0), 0);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0),
			 GDR_CUDA_SUCCESS); /* the application's */
	o.va = alloc(2 * MiB);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)o.va, 2 * MiB, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_be.outstanding, 1);
	s0 = istats();
	own.armed = 1;
	own_run(&o);
	assert_int_equal(o.released_rc, GDR_CUDA_SUCCESS);
	assert_int_not_equal(o.id_between, 0); /* the application's release was not the last */
	if (!own.retained) { /* the hook no longer looks: the same retain, just after */
		own.armed = 0;
		assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), GDR_CUDA_SUCCESS);
		own.retained = 1;
	}
	s1 = istats();
	assert_int_equal(fake_cuda_buffer_id(o.va), 0); /* the library's was */
	assert_int_equal(fake_be.outstanding, 0);       /* released inside the library's release */
	assert_int_equal(s1.own_releases, s0.own_releases + 1);
	/* the application's release counted, the library's not */
	assert_int_equal(s1.frees[GDR_FREE_CTX], s0.frees[GDR_FREE_CTX] + 1);
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(0), GDR_CUDA_SUCCESS);
	own.retained = 0;
}

/* Issue 31 #2: the library's release of a borrowed reference while the application holds its own
 * frees nothing, and so announces no free (registrations of every cache would wait for it) and
 * counts none. The old hook announced "everything is being freed" and counted a context free. */
static void test_own_release_not_last_is_no_free(void **state)
{
	gdr_CUcontext ctx = NULL;
	struct gdr_region *r = NULL;
	struct gdr_intercept_stats s0, s1;
	struct gdr_cache_stats st0, st;
	uint64_t a;

	(void)state;
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), GDR_CUDA_SUCCESS);
	a = alloc(4096);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st0), 0);
	s0 = istats();
	for (int i = 0; i < 3; i++) {
		struct own_run o = { .app_release = false };

		own.at_release = 1;
		own.inflight = 99;
		own_run(&o);
		assert_int_equal(own.inflight, 0); /* nothing announced while it ran */
	}
	s1 = istats();
	assert_int_equal(s1.frees[GDR_FREE_CTX], s0.frees[GDR_FREE_CTX]);
	assert_int_equal(s1.own_releases, s0.own_releases);
	/* the entry was not asked again: still a hit */
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_get_stats(cache, &st), 0);
	assert_int_equal(st.misses, st0.misses);
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(0), GDR_CUDA_SUCCESS);
}

/* ---- routes --------------------------------------------------------------------------------------- */

static void test_routes_counted(void **state)
{
	struct gdr_intercept_stats s0 = istats(), s1;
	void *h = NULL;
	uint64_t resv, a;

	(void)state;
	assert_int_equal(cuMemFree_v2(alloc(4096)), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemAllocHost_v2(&h, 4096), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFreeHost(h), GDR_CUDA_SUCCESS);
	resv = fake_cuda_vmm_reserve(2 * MiB);
	assert_int_equal(fake_cuda_vmm_map(resv, 2 * MiB), 0);
	assert_int_equal(cuMemUnmap(resv, 2 * MiB), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_vmm_free(resv, 2 * MiB), 0);
	a = alloc(4096);
	assert_int_equal(cuCtxDestroy_v2((gdr_CUcontext)fake_cuda_context()), GDR_CUDA_SUCCESS);
	(void)a; /* freed with the context */
	s1 = istats();
	assert_int_equal(s1.frees[GDR_FREE_MEM_FREE], s0.frees[GDR_FREE_MEM_FREE] + 1);
	assert_int_equal(s1.frees[GDR_FREE_MEM_FREE_HOST], s0.frees[GDR_FREE_MEM_FREE_HOST] + 1);
	assert_int_equal(s1.frees[GDR_FREE_MEM_UNMAP], s0.frees[GDR_FREE_MEM_UNMAP] + 1);
	assert_int_equal(s1.frees[GDR_FREE_CTX], s0.frees[GDR_FREE_CTX] + 1);
	assert_true(s1.free_ns > s0.free_ns);
}

/* ---- the table of frees in flight ------------------------------------------------------------------ */

static bool overlaps_0x1000(uint64_t start, uint64_t len, const void *arg)
{
	(void)arg;
	return len ? start <= 0x1000 && 0x1000 - start < len : start == 0x1000;
}

static void test_inflight_table(void **state)
{
	int tok[GDR_INFLIGHT_SLOTS + 1];

	(void)state;
	assert_false(gdr_events_inflight(overlaps_0x1000, NULL));
	tok[0] = gdr_events_free_begin(0x5000, 0);
	assert_false(gdr_events_inflight(overlaps_0x1000, NULL));
	tok[1] = gdr_events_free_begin(0x1000, 0);
	assert_true(gdr_events_inflight(overlaps_0x1000, NULL));
	gdr_events_free_end(tok[1]);
	assert_false(gdr_events_inflight(overlaps_0x1000, NULL));
	tok[1] = gdr_events_free_begin(0, GDR_EVENT_ALL_LEN); /* a context: everything */
	assert_true(gdr_events_inflight(overlaps_0x1000, NULL));
	gdr_events_free_end(tok[1]);
	/* more frees at once than slots: the extra ones count as everything */
	for (unsigned i = 1; i <= GDR_INFLIGHT_SLOTS; i++)
		tok[i] = gdr_events_free_begin(0x100000 * (i + 1), 4096);
	assert_int_equal(tok[GDR_INFLIGHT_SLOTS], -1);
	assert_true(gdr_events_inflight(overlaps_0x1000, NULL));
	gdr_events_free_end(tok[GDR_INFLIGHT_SLOTS]);
	assert_false(gdr_events_inflight(overlaps_0x1000, NULL));
	for (unsigned i = 0; i < GDR_INFLIGHT_SLOTS; i++)
		gdr_events_free_end(tok[i]);
	assert_int_equal(gdr_events_inflight_count(), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_probe_proves_every_route, setup, teardown),
		cmocka_unit_test_setup_teardown(test_registration_during_free_is_not_cached, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fork_during_free, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unreferenced_pin_released_inside_free, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_held_pin_released_at_last_dereg, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_dmabuf_closed_before_free_returns, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_oom_relief_events, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oom_relief_tag, setup, teardown),
		cmocka_unit_test_setup_teardown(test_allocation_at_cached_va_drops_entry, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_neighbour_free_keeps_entry, setup, teardown),
		cmocka_unit_test_setup_teardown(test_primary_release_drops_only_freed, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_own_release_last_drops_memory, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_own_release_not_last_is_no_free, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_routes_counted, setup, teardown),
		cmocka_unit_test(test_inflight_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
