/* SPDX-License-Identifier: MIT */
/*
 * Holds and registration records under an adversary (issue 10): per-thread hold counters that must
 * never wrap, releases on a thread other than the registering one, any number of caches per thread,
 * a refused PD release, a release racing its entry's detachment, double releases long after the
 * record was retired, destroy racing a hit, one grace period per batch of retired entries, running
 * out of record numbers.
 *
 * Some cases reach into the library's internals (the per-thread counters, the cache's thread list)
 * to set a state that would take hours to reach, or to stand in for a lookup caught at one precise
 * instant; each says where. The race with detachment is provoked by stopping the releasing thread
 * just after it reads its entry's state (as its record mirrors it) or its record's magic: at the
 * library's test points (this program links gdrcache_internal_tp), and again with a hardware
 * watchpoint where the machine delivers one (skipped where it does not).
 */
#include <errno.h>
#include <linux/hw_breakpoint.h>
#include <linux/membarrier.h>
#include <linux/perf_event.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache/cache.h"
#include "cache/thread.h"
#include "common/testpoint.h"
#include "intercept/events.h"
#include "fake_cuda.h"
#include "deadline.h"
#include "shard.h"
#include "fakes.h"
#include "fixture.h"

#define MiB (1024ULL * 1024)

/* ---- membarrier calls, counted: the library's syscall() resolves to this one ------------------ */

static long membarriers; /* __atomic */

long syscall(long nr, ...)
{
	static long (*real)(long, ...);
	long a[6];
	va_list ap;

	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == __NR_membarrier && a[0] == MEMBARRIER_CMD_PRIVATE_EXPEDITED)
		__atomic_add_fetch(&membarriers, 1, __ATOMIC_RELAXED);
	if (!real)
		real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	return real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* ---- fixture ------------------------------------------------------------------------------------ */

static struct gdr_cache *cache;

static int probe_ok(const char **why)
{
	(void)why;
	return 0;
}

static struct gdr_cache *make(void)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				    .validate = GDR_VALIDATE_EVENTS };
	struct gdr_cache *c = NULL;

	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	return c;
}

static int setup(void **state)
{
	(void)state;
	fakes_reset();
	fake_seams.events_probe = probe_ok;
	cache = make();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fixture_end(&cache);
	return 0;
}

static struct gdr_cache_stats stats(void)
{
	return fixture_stats(cache);
}

static struct gdr_region *reg_pd(struct ibv_pd *pd, int access, uint64_t a)
{
	struct gdr_region *r = NULL;

	assert_int_equal(gdr_reg(cache, pd, (void *)(uintptr_t)a, 4096, pd ? access : 0, &r), 0);
	assert_non_null(r);
	return r;
}

static struct gdr_region *reg(uint64_t a)
{
	return reg_pd(NULL, 0, a);
}

static void free_evented(uint64_t a)
{
	gdr_events_push(a, 0);
	fake_cuda_free(a);
}

/* Thread records of a cache (internal: the cache's list). */
static unsigned thread_records(struct gdr_cache *c)
{
	unsigned n = 0;

	for (struct gdr_thr *t = __atomic_load_n(&c->threads, __ATOMIC_ACQUIRE); t; t = t->next)
		n++;
	return n;
}

/* Run fn(arg) on a thread of its own and wait for it. */
static void on_thread(void *(*fn)(void *), void *arg)
{
	pthread_t t;

	assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
}

/* ---- 1: hold counters never wrap ----------------------------------------------------------------- */

struct xfer {
	struct gdr_region *r;
	int rc;
	long long set; /* value to give this thread's counter of r first (0: leave it) */
};

static void set_my_counter(struct gdr_region *r, long long v)
{
	/* Test-only initialiser (internal): this thread's counter of r, as if v registrations (or,
	 * negative, releases) had been made on this thread. Typed as the library types it. */
	struct gdr_thr *t = gdr_thr_get(cache);
	__typeof__(gdr_thr_counter(t, 0)) ctr;

	assert_non_null(t);
	gdr_cache_lock(cache); /* gdr_thr_counter_alloc's contract: under the cache's lock */
	ctr = gdr_thr_counter_alloc(cache, t, gdr_rec_slot(r));
	gdr_cache_unlock_plain(cache);
	assert_non_null(ctr);
	__atomic_store_n(ctr, (__typeof__(*ctr))v, __ATOMIC_RELAXED);
}

static void *dereg_there(void *arg)
{
	struct xfer *x = arg;

	if (x->set)
		set_my_counter(x->r, x->set);
	else
		x->rc = gdr_dereg(x->r);
	return NULL;
}

static void test_hold_counters_do_not_wrap(void **state)
{
	/* Register on this thread, release on another: the registering thread's counter only grows,
	 * the releasing one's only falls. 2^31 - 8 such messages are set through the test-only
	 * initialiser (at the 1.7 M msg/s, 21 minutes of traffic); 16 more cross 2^31
	 * through the real code path. Holds must stay exact: every release accepted, a held entry
	 * never flushed, destroy refused while one is held. 64-bit counters need 2^63 steps to wrap:
	 * 292 years at one per nanosecond. */
	const long long n = 0x7fffffffLL - 8;
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;
	struct xfer x = { 0 };

	(void)state;
	r = reg(a); /* the miss: the record exists */
	assert_int_equal(gdr_dereg(r), 0);
	set_my_counter(r, n); /* n registrations here ... */
	x = (struct xfer){ .r = r, .set = -n };
	on_thread(dereg_there, &x); /* ... released over there */
	for (int i = 0; i < 16; i++) {
		assert_ptr_equal(reg(a), r); /* a lock-free hit: this thread's counter + 1 */
		assert_int_equal(gdr_cache_flush(cache), 0); /* held: never unpinned */
		x = (struct xfer){ .r = r };
		on_thread(dereg_there, &x);
		assert_int_equal(x.rc, 0); /* a legitimate release is never refused */
	}
	assert_ptr_equal(reg(a), r);
	assert_int_equal(gdr_cache_destroy(cache), -EBUSY);
	x = (struct xfer){ .r = r };
	on_thread(dereg_there, &x);
	assert_int_equal(x.rc, 0);
	x = (struct xfer){ .r = r };
	on_thread(dereg_there, &x);
	assert_int_equal(x.rc, -EINVAL); /* one too many: refused */
	assert_int_equal(gdr_cache_flush(cache), 1);
	free_evented(a);
}

/* ---- 2, 7: releases on another thread need no memory; released records stay readable ---------- */

static void test_release_elsewhere_allocates_nothing(void **state)
{
	/* A thread that never used the cache releases a registration: it must not need a thread
	 * record or counters of its own (what made gdr_dereg fail with -ENOMEM). */
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct xfer x;

	(void)state;
	x = (struct xfer){ .r = reg(a) };
	assert_int_equal(thread_records(cache), 1);
	on_thread(dereg_there, &x);
	assert_int_equal(x.rc, 0);
	assert_int_equal(thread_records(cache), 1);
	assert_int_equal(gdr_cache_flush(cache), 1);
	free_evented(a);
}

static void retire_records(unsigned n)
{
	/* n records registered, released and retired (their entries flushed). */
	uint64_t b = fake_cuda_alloc(2 * MiB);

	for (unsigned i = 0; i < n; i += 8) {
		for (int k = 0; k < 8; k++)
			assert_int_equal(gdr_dereg(reg_pd(FAKE_PD, k + 1, b)), 0);
		assert_int_equal(gdr_cache_flush(cache), 1);
	}
	free_evented(b);
}

static void test_double_dereg_long_after_retirement(void **state)
{
	/* A region released, its record retired, then 300 more records retired: a second release
	 * must be refused without touching freed memory (ASan sees the read). */
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;

	(void)state;
	r = reg(a);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_flush(cache), 1);
	assert_int_equal(gdr_dereg(r), -EINVAL);
	retire_records(300);
	assert_int_equal(gdr_dereg(r), -EINVAL);
	/* And after so many that its record may have been reused for another registration that
	 * is not held: the release would take the holds below zero, still refused. */
	retire_records(4096);
	assert_int_equal(gdr_dereg(r), -EINVAL);
	{
		uint64_t b = fake_cuda_alloc(2 * MiB);

		for (int k = 0; k < 8; k++)
			assert_int_equal(gdr_dereg(reg_pd(FAKE_PD, k + 1, b)), 0);
		assert_int_equal(gdr_dereg(r), -EINVAL);
		assert_int_equal(gdr_cache_flush(cache), 1);
		free_evented(b);
	}
	free_evented(a);
}

/* ---- 3: any number of caches per thread, constant memory ---------------------------------------- */

static void test_many_caches_per_thread(void **state)
{
	enum { NC = 7, ROUNDS = 300 };
	struct gdr_cache *cs[NC];
	uint64_t a = fake_cuda_alloc(2 * MiB);

	(void)state;
	for (int i = 0; i < NC; i++)
		cs[i] = make();
	for (int k = 0; k < ROUNDS; k++) {
		for (int i = 0; i < NC; i++) {
			struct gdr_region *r = NULL;

			assert_int_equal(gdr_reg(cs[i], NULL, (void *)(uintptr_t)a, 4096, 0, &r),
					 0);
			assert_int_equal(gdr_dereg(r), 0);
		}
	}
	for (int i = 0; i < NC; i++) {
		assert_int_equal(thread_records(cs[i]), 1); /* one per (thread, cache), ever */
		assert_int_equal(gdr_cache_destroy(cs[i]), 0);
	}
	/* Caches made and destroyed for ever: still one record each. */
	for (int k = 0; k < 200; k++) {
		struct gdr_cache *c = make();
		struct gdr_region *r = NULL;

		for (int j = 0; j < 3; j++) {
			assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
			assert_int_equal(gdr_dereg(r), 0);
			assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r),
					 0);
			assert_int_equal(gdr_dereg(r), 0);
		}
		assert_int_equal(thread_records(c), 1);
		assert_int_equal(gdr_cache_destroy(c), 0);
	}
	assert_int_equal(thread_records(cache), 1);
	free_evented(a);
}

/* ---- 5: a refused PD release leaves every record live --------------------------------------------- */

static void test_refused_release_pd_leaves_records_live(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), hits;
	struct gdr_region *held, *r;

	(void)state;
	held = reg_pd(FAKE_PD, 1, a); /* listed second in its entry */
	r = reg_pd(FAKE_PD, 3, a);    /* listed first, not held */
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD), -EBUSY);
	hits = stats().fast_hits;
	assert_ptr_equal(reg_pd(FAKE_PD, 3, a), r);
	assert_int_equal(stats().fast_hits, hits + 1); /* still served without the lock */
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_dereg(held), 0);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	free_evented(a);
}

/* ---- 6: a release racing its entry's detachment ------------------------------------------------- */

/* The releasing thread is stopped just after it first reads its record's magic, or its entry's
 * state as the record mirrors it, in one of two ways: at the library's test point there
 * (common/testpoint.h: on every CPU and under qemu), or by a hardware watchpoint on the field
 * (perf_event_open with sigtrap: it also catches an access no test point names, but some CPUs and
 * hypervisors arm it and never deliver the trap, AMD EPYC under Firecracker among them). Every
 * wait here has a deadline: a watchpoint that never fires skips its case; a release that neither
 * stops nor returns fails it. GDR_TEST_WATCHPOINT=never arms a watchpoint that cannot fire (an
 * eventfd in its place): the seam by which unit_holds_never_fires proves that such a case skips. */
enum stop_by { BY_TEST_POINT, BY_WATCHPOINT };

static volatile sig_atomic_t wp_armed; /* its thread and its handler only */
static __thread int tp_armed = -1;     /* the test point this thread stops at, once */
static int wp_paused, wp_go;           /* __atomic */

/* Stops the calling thread until the test lets go (bounded, in case it cannot). */
static void stand_still(void)
{
	int64_t end = gdr_deadline_ms(5000);

	__atomic_store_n(&wp_paused, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&wp_go, __ATOMIC_ACQUIRE) && !gdr_deadline_passed(end))
		;
}

static void on_trap(int sig, siginfo_t *si, void *uc)
{
	(void)sig, (void)si, (void)uc;
	if (!wp_armed)
		return;
	wp_armed = 0;
	stand_still();
}

static void on_test_point(enum gdr_test_point tp)
{
	if (tp_armed != (int)tp)
		return;
	tp_armed = -1;
	stand_still();
}

/* A watchpoint on [addr, +len) (1 or 4) for this thread: SIGTRAP just after the access. -errno if
 * refused. */
static int watch(const void *addr, int len)
{
	struct perf_event_attr pa;
	const char *sim = getenv("GDR_TEST_WATCHPOINT");
	int fd;

	if (sim && !strcmp(sim, "never")) /* the seam: armed, and nothing ever fires */
		return eventfd(0, EFD_CLOEXEC);
	memset(&pa, 0, sizeof(pa));
	pa.type = PERF_TYPE_BREAKPOINT;
	pa.size = sizeof(pa);
	pa.bp_type = HW_BREAKPOINT_RW;
	pa.bp_addr = (uintptr_t)addr;
	pa.bp_len = len == 1 ? HW_BREAKPOINT_LEN_1 : HW_BREAKPOINT_LEN_4;
	pa.sample_period = 1;
	pa.exclude_kernel = 1;
	pa.exclude_hv = 1;
	pa.sigtrap = 1;
	pa.remove_on_exec = 1;
	fd = (int)syscall(__NR_perf_event_open, &pa, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

struct race {
	struct gdr_region *r; /* registered by the test's thread (NULL: by the releaser) */
	bool watch_magic;     /* stop at the record's magic, else at its entry's state as the
				 record mirrors it (estate: what a release reads) */
	enum stop_by by;
	int rc, watch_fd;
	uint64_t a;
	int returned; /* __atomic: the releaser's gdr_dereg returned (or it gave up) */
	int done;     /* __atomic */
};

static void *race_releaser(void *arg)
{
	struct race *x = arg;
	const void *at;

	if (!x->r && gdr_reg(cache, NULL, (void *)(uintptr_t)x->a, 4096, 0, &x->r)) {
		x->rc = -1;
		__atomic_store_n(&x->returned, 1, __ATOMIC_RELEASE);
		return NULL;
	}
	if (x->by == BY_TEST_POINT) {
		tp_armed = x->watch_magic ? GDR_TP_DEREG_MAGIC : GDR_TP_DEREG_ESTATE;
		x->rc = gdr_dereg(x->r);
		tp_armed = -1;
		__atomic_store_n(&x->returned, 1, __ATOMIC_RELEASE);
		return NULL;
	}
	at = x->watch_magic ? (const void *)&x->r->magic : (const void *)&x->r->estate;
	x->watch_fd = watch(at, x->watch_magic ? 4 : 1);
	if (x->watch_fd < 0) {
		x->rc = gdr_dereg(x->r);
		__atomic_store_n(&x->returned, 1, __ATOMIC_RELEASE); /* nothing to wait for */
		return NULL;
	}
	wp_armed = 1;
	x->rc = gdr_dereg(x->r);
	wp_armed = 0;
	close(x->watch_fd);
	__atomic_store_n(&x->returned, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *race_dropper(void *arg)
{
	struct race *x = arg;

	free_evented(x->a);     /* the entry goes stale ... */
	gdr_cache_flush(cache); /* ... and is dropped */
	__atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* The test's whole wait for the releaser to stop or return: far above what either takes on a
 * loaded 2-core machine under qemu-user or TSan (milliseconds). */
#define RACE_WAIT_MS 60000

/* r is held once; a thread releases it and stops just after it first touches the record's magic
 * or its entry's state (mirrored in the record: estate), in the registering thread or in another;
 * meanwhile a third drops the entry (stale). Without any further locked operation, nothing may
 * stay pinned or detached. */
static void release_against_detach(bool elsewhere, bool watch_magic, enum stop_by by)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct sigaction sa = { .sa_sigaction = on_trap, .sa_flags = SA_SIGINFO }, old;
	struct race x = { .a = a, .watch_magic = watch_magic, .by = by };
	pthread_t rel, drop;
	int64_t end;

	if (elsewhere)
		x.r = reg(a);
	__atomic_store_n(&wp_paused, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&wp_go, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&gdr_test_point_fn, on_test_point, __ATOMIC_RELEASE);
	assert_int_equal(sigaction(SIGTRAP, &sa, &old), 0);
	assert_int_equal(pthread_create(&rel, NULL, race_releaser, &x), 0);
	end = gdr_deadline_ms(RACE_WAIT_MS);
	while (!__atomic_load_n(&wp_paused, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&x.returned, __ATOMIC_ACQUIRE) && !gdr_deadline_passed(end))
		sched_yield();
	if (!__atomic_load_n(&wp_paused, __ATOMIC_ACQUIRE)) {
		bool returned = __atomic_load_n(&x.returned, __ATOMIC_ACQUIRE);

		if (!returned) /* the thread is left behind: the process ends with the failure */
			fail_msg("the releaser neither stopped nor returned from gdr_dereg in %d s",
				 RACE_WAIT_MS / 1000);
		pthread_join(rel, NULL);
		sigaction(SIGTRAP, &old, NULL);
		assert_int_equal(x.rc, 0);
		if (by == BY_TEST_POINT)
			fail_msg("gdr_dereg returned without passing its test point %s",
				 watch_magic ? "GDR_TP_DEREG_MAGIC" : "GDR_TP_DEREG_ESTATE");
		free_evented(a);
		if (x.watch_fd < 0)
			print_message("no hardware watchpoint here (perf_event_open: %s)\n",
				      strerror(-x.watch_fd));
		else
			print_message("the hardware watchpoint was armed but never fired (this CPU "
				      "or hypervisor does not deliver it); the test-point case "
				      "forces the same interleaving\n");
		skip();
	}
	/* The releaser stands just after its access: drop the entry now (the dropper may have to
	 * wait for it, if it stopped inside a read-side section or holding the lock: then let it go
	 * after a while). */
	assert_int_equal(pthread_create(&drop, NULL, race_dropper, &x), 0);
	end = gdr_deadline_ms(300);
	while (!__atomic_load_n(&x.done, __ATOMIC_ACQUIRE) && !gdr_deadline_passed(end))
		;
	__atomic_store_n(&wp_go, 1, __ATOMIC_RELEASE);
	end = gdr_deadline_ms(RACE_WAIT_MS);
	if (!gdr_wait_flag(&x.returned, end) || !gdr_wait_flag(&x.done, end))
		fail_msg("%s did not finish in %d s after the releaser was let go",
			 __atomic_load_n(&x.returned, __ATOMIC_ACQUIRE) ? "the drop"
									: "the release",
			 RACE_WAIT_MS / 1000);
	pthread_join(rel, NULL);
	pthread_join(drop, NULL);
	sigaction(SIGTRAP, &old, NULL);
	assert_int_equal(x.rc, 0);
	assert_int_equal(stats().stale, 1);
	assert_int_equal(stats().detached, 0);    /* (gdr_cache_get_stats reaps nothing) */
	assert_int_equal(fake_be.outstanding, 0); /* unpinned: nobody holds it */
}

#define RACE_CASE(name, elsewhere, magic)                                                          \
	static void test_##name(void **state)                                                      \
	{                                                                                          \
		(void)state;                                                                       \
		release_against_detach(elsewhere, magic, BY_TEST_POINT);                           \
	}                                                                                          \
	static void test_wp_##name(void **state)                                                   \
	{                                                                                          \
		(void)state;                                                                       \
		release_against_detach(elsewhere, magic, BY_WATCHPOINT);                           \
	}
RACE_CASE(release_racing_detach_state, false, false)
RACE_CASE(release_racing_detach_magic, false, true)
RACE_CASE(release_elsewhere_racing_detach_state, true, false)
RACE_CASE(release_elsewhere_racing_detach_magic, true, true)

/* ---- suspected: destroy counting holds before quiescing ------------------------------------------ */

struct stall {
	struct gdr_region *r;
	volatile int inside, destroy_rc, destroyed;
};

static void *destroyer(void *arg)
{
	struct stall *s = arg;

	s->destroy_rc = gdr_cache_destroy(cache);
	__atomic_store_n(&s->destroyed, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_destroy_quiesces_before_counting(void **state)
{
	/* This thread stands in for a lookup (internal: its read-side section and counter) that
	 * found the entry alive just before destroy began, and takes its hold while destroy runs.
	 * Destroy must count that hold and refuse, not detach the entry and free the cache. */
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct stall s = { 0 };
	struct gdr_thr *t;
	__typeof__(gdr_thr_counter(t, 0)) ctr;
	pthread_t d;

	(void)state;
	s.r = reg(a);
	assert_int_equal(gdr_dereg(s.r), 0);
	t = gdr_thr_get(cache);
	gdr_cache_lock(cache); /* gdr_thr_counter_alloc's contract */
	ctr = gdr_thr_counter_alloc(cache, t, gdr_rec_slot(s.r));
	gdr_cache_unlock_plain(cache);
	assert_non_null(ctr);
	gdr_thr_enter(t); /* the lookup begins: the entry is LIVE */
	assert_int_equal(pthread_create(&d, NULL, destroyer, &s), 0);
	usleep(100000); /* destroy runs (and waits for this lookup) */
	__atomic_store_n(ctr, *ctr + 1, __ATOMIC_RELAXED); /* the hold the lookup takes */
	gdr_thr_leave(t);
	pthread_join(d, NULL);
	assert_int_equal(s.destroy_rc, -EBUSY);
	assert_int_equal(stats().detached, 0);
	assert_ptr_equal(reg(a), s.r); /* still served */
	assert_int_equal(gdr_dereg(s.r), 0);
	assert_int_equal(gdr_dereg(s.r), 0);
	assert_int_equal(gdr_cache_flush(cache), 1);
	free_evented(a);
}

/* ---- suspected: one grace period per retired entry ---------------------------------------------- */

static void test_grace_periods_are_batched(void **state)
{
	enum { N = 64 };
	uint64_t v[N];
	long before;

	(void)state;
	if (!__atomic_load_n(&gdr_thr_asym, __ATOMIC_RELAXED))
		skip(); /* no membarrier here: nothing to count */
	for (int i = 0; i < N; i++) {
		v[i] = fake_cuda_alloc(2 * MiB);
		assert_int_equal(gdr_dereg(reg_pd(FAKE_PD, 1, v[i])), 0);
	}
	before = __atomic_load_n(&membarriers, __ATOMIC_RELAXED);
	assert_int_equal(gdr_cache_release_pd(cache, FAKE_PD), 0);
	assert_true(__atomic_load_n(&membarriers, __ATOMIC_RELAXED) - before <= 3);
	before = __atomic_load_n(&membarriers, __ATOMIC_RELAXED);
	assert_int_equal(gdr_cache_flush(cache), N);
	assert_true(__atomic_load_n(&membarriers, __ATOMIC_RELAXED) - before <= 3);
	/* A context destroyed drops every entry at once. */
	for (int i = 0; i < N; i++)
		assert_int_equal(gdr_dereg(reg(v[i])), 0);
	before = __atomic_load_n(&membarriers, __ATOMIC_RELAXED);
	gdr_events_push(0, GDR_EVENT_ALL_LEN);
	assert_int_equal(gdr_cache_flush(cache), 0);
	assert_int_equal(stats().entries, 0);
	assert_true(__atomic_load_n(&membarriers, __ATOMIC_RELAXED) - before <= 3);
	for (int i = 0; i < N; i++)
		fake_cuda_free(v[i]);
}

/* ---- suspected: out of record numbers ------------------------------------------------------------ */

static void test_out_of_records_is_enospc(void **state)
{
	/* Internal: start numbering 4 records short of the most a cache has. */
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r[4], *x = NULL;

	(void)state;
	cache->slot_next = GDR_SLOT_CHUNK * GDR_SLOT_CHUNKS - 4;
	for (int i = 0; i < 4; i++)
		r[i] = reg_pd(FAKE_PD, i + 1, a);
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)a, 4096, 5, &x), -ENOSPC);
	for (int i = 0; i < 4; i++)
		assert_int_equal(gdr_dereg(r[i]), 0);
	free_evented(a);
}

/* exit() from a signal handler that interrupted a lock-free release inside its read-side section
 * (issue 31 #8's class): the program's clean-up at exit, on that thread, flushes the cache, whose
 * grace period waited for that thread's section to end, which it never would. In a child, with a
 * deadline: a hang is a failure. */
static void exit_at_test_point(enum gdr_test_point tp)
{
	if (tp == GDR_TP_DEREG_MAGIC) {
		__atomic_store_n(&gdr_test_point_fn, NULL, __ATOMIC_RELEASE);
		raise(SIGINT);
	}
}

static void on_int_exit(int sig)
{
	(void)sig;
	exit(0);
}

static void flush_at_exit(void)
{
	/* another entry, unheld, dropped: a grace period */
	if (gdr_cache_flush(cache) < 1)
		_exit(4);
	_exit(0);
}

static void test_exit_from_handler_inside_release(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), b = fake_cuda_alloc(2 * MiB);
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale();
	int st;
	pid_t pid;

	(void)state;
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		struct sigaction sa = { .sa_handler = on_int_exit };
		struct gdr_region *ra, *rb;

		alarm(alarm_s);
		ra = reg(a);
		rb = reg(b);
		if (gdr_dereg(rb))
			_exit(2);
		ra = reg(a); /* held twice: the next release is lock-free */
		sigemptyset(&sa.sa_mask);
		sigaction(SIGINT, &sa, NULL);
		atexit(flush_at_exit);
		__atomic_store_n(&gdr_test_point_fn, exit_at_test_point, __ATOMIC_RELEASE);
		gdr_dereg(ra); /* exits inside */
		_exit(3);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (WIFSIGNALED(st))
		fail_msg("the clean-up at exit %s (signal %d)",
			 WTERMSIG(st) == SIGALRM ? "hung" : "died", WTERMSIG(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	fake_cuda_free(a);
	fake_cuda_free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hold_counters_do_not_wrap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_exit_from_handler_inside_release, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_release_elsewhere_allocates_nothing, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_double_dereg_long_after_retirement, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_many_caches_per_thread, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused_release_pd_leaves_records_live, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_release_racing_detach_state, setup, teardown),
		cmocka_unit_test_setup_teardown(test_release_racing_detach_magic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_release_elsewhere_racing_detach_state, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_release_elsewhere_racing_detach_magic, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_wp_release_racing_detach_state, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_wp_release_racing_detach_magic, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_wp_release_elsewhere_racing_detach_state,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_wp_release_elsewhere_racing_detach_magic,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_destroy_quiesces_before_counting, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_grace_periods_are_batched, setup, teardown),
		cmocka_unit_test_setup_teardown(test_out_of_records_is_enospc, setup, teardown),
	};
	return gdr_run_tests_sharded("tests", tests, sizeof(tests) / sizeof(tests[0]));
}
