/* SPDX-License-Identifier: MIT */
/*
 * The public free events (lib/intercept/monitor.c, gdrcache.h "Free events for middleware")
 * against the fake driver, whose exported entries the library patches:
 *  - a subscribed range freed through each route (a direct call, dlsym of libcuda, the pointer
 *    cuGetProcAddress hands out) reaches the callback before the driver frees, and is no longer
 *    valid after; an unsubscribed one does not (but with GDR_MONITOR_ALL); part of a VMM range
 *    unmapped and a context destroyed concern what they free;
 *  - the library's own cache and a monitor are both served by one free (one dispatch);
 *  - the callback's rules: a driver call from it is counted and its event comes after it; the
 *    calls that would wait or call the driver return -EDEADLK; destroy waits for a callback that
 *    runs on another thread;
 *  - the polled ring: head and get;
 *  - bad input is refused;
 *  - GDRCACHE_INTERCEPT=off and the first cache's attribute: nothing patched, a stated answer
 *    (the cases test_off_*, run by their own ctest entries with the variable set).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda/cuda_abi.h"
#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "shard.h"

#define MiB (1024ULL * 1024)

gdr_CUresult cuMemAlloc_v2(gdr_CUdeviceptr *p, size_t n);
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);
gdr_CUresult cuMemUnmap(gdr_CUdeviceptr p, size_t n);
gdr_CUresult cuCtxDestroy_v2(gdr_CUcontext c);
typedef gdr_CUresult (*gpa2_fn)(const char *sym, void **pfn, int ver, uint64_t flags, int *st);
typedef gdr_CUresult (*free_fn)(gdr_CUdeviceptr p);

/* What the callback saw. */
static struct {
	int n;
	struct gdr_mem_event last;
	uint64_t entered_after; /* callbacks seen when the driver's cuMemFree_v2 was entered */
	int (*also)(const struct gdr_mem_event *ev); /* more for a case to do inside */
	int also_rc;
} seen;

static void on_event(void *arg, const struct gdr_mem_event *ev)
{
	(void)arg;
	__atomic_add_fetch(&seen.n, 1, __ATOMIC_SEQ_CST);
	seen.last = *ev;
	if (seen.also)
		seen.also_rc = seen.also(ev);
}

static void enter_hook(const char *entry, void *arg)
{
	(void)arg;
	if (!strcmp(entry, "cuMemFree_v2"))
		seen.entered_after = (uint64_t)__atomic_load_n(&seen.n, __ATOMIC_SEQ_CST);
}

static uint64_t alloc(size_t n)
{
	gdr_CUdeviceptr p = 0;

	assert_int_equal(cuMemAlloc_v2(&p, n), GDR_CUDA_SUCCESS);
	return p;
}

static struct gdr_mem_monitor *mon;

static int setup(void **state)
{
	(void)state;
	if (getenv("GDRCACHE_INTERCEPT"))
		return 0; /* the test_off_* cases' own process */
	fake_cuda_reset();
	fake_backend_reset();
	memset(&seen, 0, sizeof(seen));
	assert_int_equal(gdr_mem_monitor_create(0, on_event, NULL, &mon), 0);
	fake_cuda_set_enter_hook(enter_hook, NULL);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fake_cuda_set_enter_hook(NULL, NULL);
	if (mon)
		assert_int_equal(gdr_mem_monitor_destroy(mon), 0);
	mon = NULL;
	return 0;
}

static void skip_if_off(void)
{
	if (getenv("GDRCACHE_INTERCEPT"))
		skip();
}

static void test_state_in_effect(void **state)
{
	const char *why = NULL;

	(void)state;
	skip_if_off();
	assert_int_equal(gdr_mem_events_state(&why), 0);
	assert_non_null(why);
}

/* One route's free of a subscribed buffer: the callback before the driver, invalid after. */
static void free_by(free_fn fr, const char *route)
{
	uint64_t a = alloc(2 * MiB);
	int n0 = seen.n;

	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)(a + 4096), 8192), 0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)(a + 4096), 8192), 1);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)(a + 8192), 4096), 1);
	seen.entered_after = 0;
	assert_int_equal(fr(a), GDR_CUDA_SUCCESS);
	if (seen.n != n0 + 1 || seen.entered_after != (uint64_t)n0 + 1)
		fail_msg("%s: %d callbacks (want 1), %llu of them before the driver was entered",
			 route, seen.n - n0, (unsigned long long)seen.entered_after - (uint64_t)n0);
	assert_int_equal(seen.last.kind, GDR_MEM_EVENT_FREE);
	assert_int_equal(seen.last.start, a);
	assert_int_equal(seen.last.len, 2 * MiB); /* the allocation's size, from the subscription */
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)(a + 4096), 8192), 0);
	assert_int_equal(gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)(a + 4096), 8192), 0);
}

static void test_subscribed_free_every_route(void **state)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	gpa2_fn gpa2;
	void *fr = NULL;
	int st = 0;

	(void)state;
	skip_if_off();
	assert_non_null(h);
	free_by(cuMemFree_v2, "a direct call");
	free_by((free_fn)dlsym(h, "cuMemFree_v2"), "dlsym(libcuda)");
	gpa2 = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
	assert_non_null(gpa2);
	assert_int_equal(gpa2("cuMemFree", &fr, 12000, 0, &st), GDR_CUDA_SUCCESS);
	free_by((free_fn)fr, "cuGetProcAddress");
	dlclose(h);
}

static void test_unsubscribed_free_not_delivered(void **state)
{
	struct gdr_mem_monitor *all = NULL;
	uint64_t a = alloc(MiB), b = alloc(MiB);
	int n0;

	(void)state;
	skip_if_off();
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	n0 = seen.n;
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS); /* not subscribed */
	assert_int_equal(seen.n, n0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)a, 4096), 1);
	/* a monitor of everything sees it */
	assert_int_equal(gdr_mem_monitor_create(GDR_MONITOR_ALL, on_event, NULL, &all), 0);
	b = alloc(MiB);
	n0 = seen.n;
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
	assert_int_equal(seen.n, n0 + 1);
	assert_int_equal(seen.last.start, b);
	assert_int_equal(seen.last.len, 0); /* not subscribed: the allocation at start */
	assert_int_equal(gdr_mem_monitor_destroy(all), 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
}

static void test_unmap_part_and_context(void **state)
{
	uint64_t resv = fake_cuda_vmm_reserve(4 * MiB), a;
	int n0;

	(void)state;
	skip_if_off();
	assert_int_equal(fake_cuda_vmm_map(resv, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_map(resv + 2 * MiB, 2 * MiB), 0);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)resv, 4096), 0);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)(resv + 3 * MiB), 4096),
			 0);
	n0 = seen.n;
	assert_int_equal(cuMemUnmap(resv + 2 * MiB, 2 * MiB), GDR_CUDA_SUCCESS);
	assert_int_equal(seen.n, n0 + 1);
	assert_int_equal(seen.last.start, resv + 2 * MiB);
	assert_int_equal(seen.last.len, 2 * MiB);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)(resv + 3 * MiB), 4096), 0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)resv, 4096), 1);
	/* a context's end: everything */
	a = alloc(MiB);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	n0 = seen.n;
	assert_int_equal(cuCtxDestroy_v2((gdr_CUcontext)fake_cuda_context()), GDR_CUDA_SUCCESS);
	assert_int_equal(seen.n, n0 + 1);
	assert_int_equal(seen.last.kind, GDR_MEM_EVENT_CONTEXT);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)resv, 4096), 0);
}

/* The library's cache and a monitor, one free: the cache's unreferenced pin is released inside
 * the free, and the monitor is told, both before the driver frees. */
static void test_cache_and_monitor_one_dispatch(void **state)
{
	struct gdr_cache *c = NULL;
	struct gdr_region *r = NULL;
	struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				     .validate = GDR_VALIDATE_EVENTS };
	uint64_t a = alloc(2 * MiB);
	int n0;

	(void)state;
	skip_if_off();
	assert_int_equal(fake_cache_create(&at, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_be.outstanding, 1);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	n0 = seen.n;
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(seen.n, n0 + 1);
	assert_int_equal(fake_be.outstanding, 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

/* ---- the callback's rules ------------------------------------------------------------------------ */

static struct gdr_cache *rule_cache;
static uint64_t rule_b;

static int break_rules(const struct gdr_mem_event *ev)
{
	struct gdr_region *r = (struct gdr_region *)1;
	struct gdr_mem_monitor *m2 = NULL;

	if (ev->kind != GDR_MEM_EVENT_FREE || !rule_b)
		return 0;
	/* the calls that would wait for this free, or call the driver */
	if (gdr_reg(rule_cache, NULL, (void *)(uintptr_t)rule_b, 4096, 0, &r) != -EDEADLK || r)
		return 1;
	if (gdr_mem_monitor_destroy(mon) != -EDEADLK)
		return 2;
	if (gdr_mem_monitor_create(0, NULL, NULL, &m2) != -EDEADLK)
		return 3;
	if (gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)rule_b, 4096) != -EDEADLK)
		return 4;
	if (gdr_cache_flush(rule_cache) != -EDEADLK)
		return 5;
	/* allowed: a question */
	if (gdr_mem_monitor_valid(mon, (void *)(uintptr_t)ev->start, 4096) != 0)
		return 6;
	/* a driver call: its event comes after this callback */
	{
		uint64_t b = rule_b;

		rule_b = 0;
		if (cuMemFree_v2(b) != GDR_CUDA_SUCCESS)
			return 7;
	}
	return 0;
}

static void test_callback_rules(void **state)
{
	struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				     .validate = GDR_VALIDATE_EVENTS };
	uint64_t a = alloc(MiB), v0 = gdr_mem_monitor_violations();
	int n0;

	(void)state;
	skip_if_off();
	assert_int_equal(fake_cache_create(&at, &fake_backend_ops, &rule_cache), 0);
	rule_b = alloc(MiB);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	n0 = seen.n;
	seen.also = break_rules;
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	seen.also = NULL;
	assert_int_equal(seen.also_rc, 0);
	assert_int_equal(gdr_mem_monitor_violations(), v0 + 1);
	/* the callback's own free, delivered after it returned: as everything */
	assert_int_equal(seen.n, n0 + 2);
	assert_int_equal(seen.last.kind, GDR_MEM_EVENT_CONTEXT);
	assert_int_equal(gdr_cache_destroy(rule_cache), 0);
}

/* destroy on one thread while the callback runs on another: it returns after the callback. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int inside, go, returned;
	int destroy_returned_first;
} blk = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0 };

static uint64_t blk_va;

static void blocking_cb(void *arg, const struct gdr_mem_event *ev)
{
	int64_t deadline = gdr_deadline_ms(30000);
	struct timespec ts = { deadline / 1000000000, deadline % 1000000000 };

	(void)arg;
	if (ev->kind != GDR_MEM_EVENT_FREE || ev->start != blk_va)
		return;
	pthread_mutex_lock(&blk.lock);
	blk.inside = 1;
	pthread_cond_broadcast(&blk.cond);
	while (!blk.go && pthread_cond_clockwait(&blk.cond, &blk.lock, CLOCK_MONOTONIC, &ts) == 0)
		;
	/* the destroyer must not have returned while this callback runs */
	blk.destroy_returned_first = blk.returned;
	pthread_mutex_unlock(&blk.lock);
}

static void *blk_freer(void *arg)
{
	(void)arg;
	cuMemFree_v2(blk_va);
	return NULL;
}

static void *blk_destroyer(void *arg)
{
	int rc = gdr_mem_monitor_destroy(arg);

	pthread_mutex_lock(&blk.lock);
	blk.returned = rc == 0 ? 1 : -1;
	pthread_mutex_unlock(&blk.lock);
	return NULL;
}

static void test_destroy_waits_for_callback(void **state)
{
	struct gdr_mem_monitor *m = NULL;
	int64_t deadline = gdr_deadline_ms(30000);
	struct timespec ts = { deadline / 1000000000, deadline % 1000000000 };
	pthread_t tf, td;

	(void)state;
	skip_if_off();
	assert_int_equal(gdr_mem_monitor_create(GDR_MONITOR_ALL, blocking_cb, NULL, &m), 0);
	blk_va = alloc(MiB);
	assert_int_equal(pthread_create(&tf, NULL, blk_freer, NULL), 0);
	pthread_mutex_lock(&blk.lock);
	while (!blk.inside &&
	       pthread_cond_clockwait(&blk.cond, &blk.lock, CLOCK_MONOTONIC, &ts) == 0)
		;
	pthread_mutex_unlock(&blk.lock);
	assert_int_equal(blk.inside, 1);
	assert_int_equal(pthread_create(&td, NULL, blk_destroyer, m), 0);
	usleep(100000); /* the destroyer is waiting (or, wrongly, returned) */
	pthread_mutex_lock(&blk.lock);
	blk.go = 1;
	pthread_cond_broadcast(&blk.cond);
	pthread_mutex_unlock(&blk.lock);
	pthread_join(tf, NULL);
	pthread_join(td, NULL);
	assert_int_equal(blk.returned, 1);
	assert_int_equal(blk.destroy_returned_first, 0);
}

/* ---- the polled ring ------------------------------------------------------------------------------ */

static void test_poll_cursor(void **state)
{
	struct gdr_mem_event ev;
	uint64_t a, cur, head;
	bool found = false;

	(void)state;
	skip_if_off();
	a = alloc(MiB);
	cur = gdr_mem_events_head();
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	head = gdr_mem_events_head();
	assert_true(head > cur);
	for (; cur < head; cur++) {
		assert_int_equal(gdr_mem_events_get(cur, &ev), 0);
		found |= ev.kind == GDR_MEM_EVENT_FREE && ev.start == a && ev.len == 0;
	}
	assert_true(found);
	assert_int_equal(gdr_mem_events_get(head, &ev), -EINVAL);
	assert_int_equal(gdr_mem_events_get(0, NULL), -EINVAL);
}

/* ---- bad input -------------------------------------------------------------------------------------- */

static void test_bad_input(void **state)
{
	struct gdr_mem_monitor *m = NULL, *fake = (struct gdr_mem_monitor *)&seen;
	uint64_t a = alloc(MiB);
	char host[64];

	(void)state;
	skip_if_off();
	assert_int_equal(gdr_mem_monitor_create(0, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(gdr_mem_monitor_create(2, NULL, NULL, &m), -EINVAL);
	assert_null(m);
	assert_int_equal(gdr_mem_monitor_destroy(NULL), -EINVAL);
	assert_int_equal(gdr_mem_monitor_destroy(fake), -EINVAL);
	assert_int_equal(gdr_mem_monitor_subscribe(fake, (void *)(uintptr_t)a, 4096), -EINVAL);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 0), -EINVAL);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)UINTPTR_MAX, 2), -EINVAL);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, host, sizeof(host)), -EINVAL);
	assert_int_equal(gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)a, 4096), -ENOENT);
	assert_int_equal(gdr_mem_monitor_valid(NULL, (void *)(uintptr_t)a, 4096), -EINVAL);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)a, 4096), 0);
	/* counted: two subscriptions need two unsubscribes */
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)a, 4096), 1);
	assert_int_equal(gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)a, 4096), -ENOENT);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
}

/* Reallocated at the same VA and subscribed again: the new one is valid, the stale one goes
 * first. */
static void test_resubscribe_after_reuse(void **state)
{
	uint64_t a = alloc(MiB), b;

	(void)state;
	skip_if_off();
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	b = alloc(MiB);
	if (b != a) {
		cuMemFree_v2(b);
		skip(); /* the fake gave another VA: nothing to prove here */
	}
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_subscribe(mon, (void *)(uintptr_t)b, 4096), 0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)b, 4096), 1);
	assert_int_equal(gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)a, 4096), 0);
	assert_int_equal(gdr_mem_monitor_valid(mon, (void *)(uintptr_t)b, 4096), 1);
	assert_int_equal(gdr_mem_monitor_unsubscribe(mon, (void *)(uintptr_t)b, 4096), 0);
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
}

/* ---- the interception off (own ctest entries) --------------------------------------------------- */

static void expect_off(const char *by)
{
	struct gdr_intercept_stats is;
	struct gdr_cache_settings set;
	struct gdr_mem_monitor *m = (struct gdr_mem_monitor *)1;
	struct gdr_cache *c = NULL;
	const char *why = NULL;
	uint64_t a, f0;

	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_cache_get_settings(c, &set, sizeof(set)), 0);
	assert_int_equal(set.validate, GDR_VALIDATE_TAG);
	assert_int_equal(gdr_mem_events_state(&why), -EOPNOTSUPP);
	if (!strstr(why, by))
		fail_msg("state says \"%s\", not turned off by %s", why, by);
	assert_int_equal(gdr_mem_monitor_create(0, NULL, NULL, &m), -EOPNOTSUPP);
	assert_null(m);
	assert_int_equal(gdr_intercept_get_stats(&is, sizeof(is)), 0);
	assert_int_equal(is.state, -EOPNOTSUPP);
	/* nothing patched: a free is not seen */
	f0 = is.frees[GDR_FREE_MEM_FREE];
	a = alloc(MiB);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(gdr_intercept_get_stats(&is, sizeof(is)), 0);
	assert_int_equal(is.frees[GDR_FREE_MEM_FREE], f0);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

static void test_off_by_variable(void **state)
{
	(void)state;
	if (!getenv("GDRCACHE_INTERCEPT") || strcmp(getenv("GDRCACHE_INTERCEPT"), "off") ||
	    getenv("TEST_OFF_ATTR"))
		skip();
	expect_off("GDRCACHE_INTERCEPT");
}

/* The first cache's attribute, before libcuda is loaded, overrides GDRCACHE_INTERCEPT=auto. */
static void test_off_by_attribute(void **state)
{
	struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_INTERCEPT,
				     .intercept = GDR_INTERCEPT_OFF };
	struct gdr_cache *c = NULL;

	(void)state;
	if (!getenv("TEST_OFF_ATTR"))
		skip();
	assert_int_equal(fake_cache_create(&at, &fake_backend_ops, &c), 0);
	expect_off("a cache's attribute");
	assert_int_equal(gdr_cache_destroy(c), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_state_in_effect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_subscribed_free_every_route, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unsubscribed_free_not_delivered, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_unmap_part_and_context, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cache_and_monitor_one_dispatch, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_callback_rules, setup, teardown),
		cmocka_unit_test_setup_teardown(test_destroy_waits_for_callback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_poll_cursor, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resubscribe_after_reuse, setup, teardown),
		cmocka_unit_test_setup_teardown(test_off_by_variable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_off_by_attribute, setup, teardown),
	};
	return gdr_run_tests_sharded("tests", tests, sizeof(tests) / sizeof(tests[0]));
}
