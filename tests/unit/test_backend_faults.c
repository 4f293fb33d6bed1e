/* SPDX-License-Identifier: MIT */
/* Fault paths of the backends and of eviction: every failure leaves nothing pinned, no fd open, no
 * MR registered, and the statistics consistent (pins - unpins = entries, pinned_bytes exact); the
 * limits are exceeded only by held entries after every call, failed ones included; a pin that fails
 * for lack of space evicts and retries, and stops when nothing is left to evict; dma-buf fds are
 * each closed once, and running out of fds is an error, not a leak. */
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <cmocka.h>

#include "fake_cuda.h"
#include "fakes.h"
#include "cache/thread.h" /* GDR_SLOT_MAX */

#define MiB (1024ULL * 1024)
#define KiB 1024ULL
#define P(a) ((void *)(uintptr_t)(a))

static struct gdr_cache *make(const struct gdr_backend_ops *ops, int backend, uint64_t mask,
			      uint64_t max_bytes, uint64_t max_entries, uint64_t max_pin)
{
	/* Mode tag: frees here go through the fake's control calls, which no hook sees. */
	struct gdr_cache_attr a = { .field_mask = mask | GDR_CACHE_ATTR_VALIDATE,
				    .max_bytes = max_bytes,
				    .max_entries = max_entries,
				    .max_pin_bytes = max_pin,
				    .validate = GDR_VALIDATE_TAG };
	struct gdr_cache *c = NULL;

	if (!ops) {
		a.field_mask |= GDR_CACHE_ATTR_BACKEND;
		a.backend = backend;
	}
	assert_int_equal(fake_cache_create(&a, ops, &c), 0);
	return c;
}

static struct gdr_cache_stats stats(struct gdr_cache *c)
{
	struct gdr_cache_stats s;

	assert_int_equal(gdr_cache_get_stats(c, &s), 0);
	return s;
}

/* pins - unpins == entries; the fake backend agrees on count and bytes. */
static void check_fake_consistent(struct gdr_cache *c)
{
	struct gdr_cache_stats s = stats(c);

	assert_int_equal(s.pins - s.unpins, s.entries);
	assert_int_equal(fake_be.outstanding, s.entries);
	assert_int_equal(fake_be.outstanding_bytes, s.pinned_bytes);
	assert_int_equal(fake_be.double_pinned_now, 0);
	assert_int_equal(fake_be.bad_pins, 0);
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own */
}

static struct rlimit saved_nofile;
static bool have_saved_nofile;

static int setup(void **state)
{
	(void)state;
	fake_cuda_reset();
	fake_backend_reset();
	fake_verbs = (struct fake_verbs_state){ 0 };
	fake_kmod = (struct fake_kmod_state){ .present = true, .major = GDRCACHE_UAPI_VERSION_MAJOR };
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (have_saved_nofile)
		setrlimit(RLIMIT_NOFILE, &saved_nofile);
	have_saved_nofile = false;
	assert_int_equal(fake_be.outstanding, 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	assert_int_equal(fake_kmod.outstanding, 0);
	assert_int_equal(fake_cuda_open_dmabufs(), 0);
	return 0;
}

/* A NIC registration that fails after a fresh pin leaves the pin cached unheld: the call must still
 * end within the limits (create.c: "after every call, pinned bytes and entries exceed their limits
 * only by held entries"). With max_entries 2 and ten failed registrations of ten buffers, at most
 * two unheld entries may stay pinned; with the dmabuf backend each keeps a dma-buf fd open and the
 * freed GPU memory behind it allocated. */
static void test_failed_mr_respects_limits(void **state)
{
	struct gdr_cache *c = make(&fake_backend_ops, 0, GDR_CACHE_ATTR_MAX_ENTRIES, 0, 2, 0);
	uint64_t a[10];
	struct gdr_region *r;
	struct gdr_cache_stats s;

	(void)state;
	for (int i = 0; i < 10; i++) {
		a[i] = fake_cuda_alloc(2 * MiB);
		fake_verbs.fail_next_errno = EFAULT;
		fake_verbs.fail_next_n = 1;
		assert_int_equal(gdr_reg(c, FAKE_PD, P(a[i]), 4096, 1, &r), -EFAULT);
	}
	s = stats(c);
	assert_int_equal(s.fail_mr, 10);
	check_fake_consistent(c);
	assert_int_equal(gdr_cache_destroy(c), 0);
	for (int i = 0; i < 10; i++)
		fake_cuda_free(a[i]);
	/* none held: within max_entries */
	assert_true(s.entries <= 2);
}

/* The same through the dmabuf backend with a byte limit: every failed ibv_reg_dmabuf_mr leaves an
 * exported dma-buf (an fd, and GPU memory the program may free but not get back). */
static void test_failed_dmabuf_mr_keeps_fds(void **state)
{
	struct gdr_cache *c = make(NULL, GDR_BACKEND_DMABUF, GDR_CACHE_ATTR_MAX_BYTES, 256 * KiB, 0, 0);
	int fds0 = count_fds();
	uint64_t a[16];
	struct gdr_region *r;
	struct gdr_cache_stats s;

	(void)state;
	for (int i = 0; i < 16; i++) {
		a[i] = fake_cuda_alloc(2 * MiB);
		fake_verbs.fail_next_errno = EFAULT;
		fake_verbs.fail_next_n = 1;
		assert_int_equal(gdr_reg(c, FAKE_PD, P(a[i]), 4096, 1, &r), -EFAULT);
	}
	s = stats(c);
	assert_int_equal(s.pins - s.unpins, s.entries);
	assert_int_equal((uint64_t)fake_cuda_open_dmabufs(), s.entries);
	assert_int_equal(count_fds() - fds0, (int)s.entries);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(count_fds(), fds0);
	for (int i = 0; i < 16; i++)
		fake_cuda_free(a[i]);
	/* 256 KiB of limit, 64 KiB pins (2 MiB > 1/32 of the limit: windows), none held. */
	assert_true(s.pinned_bytes <= 256 * KiB);
}

/* Every failure the fake backend injects at pin time: -ENOMEM/-ENOSPC with nothing evictable stops
 * (no infinite loop) and reports the error; other errors are not retried; nothing leaks. */
static void test_pin_failure_nothing_evictable(void **state)
{
	struct gdr_cache *c = make(&fake_backend_ops, 0, 0, 0, 0, 0);
	uint64_t a = fake_cuda_alloc(2 * MiB), b = fake_cuda_alloc(2 * MiB);
	struct gdr_region *ra, *rb;
	struct gdr_cache_stats s;
	const int rcs[] = { -ENOMEM, -ENOSPC, -EIO, -EFAULT, -EOPNOTSUPP };

	(void)state;
	assert_int_equal(gdr_reg(c, NULL, P(a), 4096, 0, &ra), 0); /* held: not evictable */
	for (size_t i = 0; i < sizeof(rcs) / sizeof(rcs[0]); i++) {
		fake_be.fail_next_rc = rcs[i];
		fake_be.fail_next_n = 1000000; /* fails for ever */
		assert_int_equal(gdr_reg(c, NULL, P(b), 4096, 0, &rb), rcs[i]);
		/* One try, plus one per eviction: here nothing evictable, so exactly one. */
		assert_int_equal(fake_be.fail_next_n, 1000000 - 1);
		fake_be.fail_next_n = 0;
		check_fake_consistent(c);
		s = stats(c);
		assert_int_equal(s.entries, 1);
	}
	s = stats(c);
	assert_int_equal(s.fail_pin_retried, 0);
	assert_int_equal(s.fail_pin, 5);
	/* Evictable now: -ENOSPC once, evict a, retry, succeed. */
	assert_int_equal(gdr_dereg(ra), 0);
	fake_be.fail_next_rc = -ENOSPC;
	fake_be.fail_next_n = 1;
	assert_int_equal(gdr_reg(c, NULL, P(b), 4096, 0, &rb), 0);
	s = stats(c);
	assert_int_equal(s.fail_pin_retried, 1);
	assert_int_equal(s.entries, 1);
	check_fake_consistent(c);
	assert_int_equal(gdr_dereg(rb), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
	fake_cuda_free(b);
}

/* Held entries are never evicted, under an entry limit of 1 and a byte limit of 1; the counts come
 * back within the limits as they are released. */
static void test_held_never_evicted_tiny_limits(void **state)
{
	for (int which = 0; which < 2; which++) {
		struct gdr_cache *c =
			which ? make(&fake_backend_ops, 0, GDR_CACHE_ATTR_MAX_BYTES, 1, 0, 0)
			      : make(&fake_backend_ops, 0, GDR_CACHE_ATTR_MAX_ENTRIES, 0, 1, 0);
		uint64_t a[8];
		struct gdr_region *r[8];
		struct gdr_cache_stats s;

		for (int i = 0; i < 8; i++) {
			a[i] = fake_cuda_alloc(1 * MiB);
			assert_int_equal(gdr_reg(c, NULL, P(a[i] + 100), 1000, 0, &r[i]), 0);
			s = stats(c);
			assert_int_equal(s.entries, (uint64_t)i + 1); /* every one held: none evicted */
			assert_int_equal(s.evictions, 0);
			check_fake_consistent(c);
		}
		/* The held ones still serve: a second hold is a hit on the same entry. */
		for (int i = 0; i < 8; i++) {
			struct gdr_region *r2;

			assert_int_equal(gdr_reg(c, NULL, P(a[i] + 100), 1000, 0, &r2), 0);
			assert_int_equal(gdr_dereg(r2), 0);
		}
		s = stats(c);
		assert_int_equal(s.entries, 8);
		for (int i = 0; i < 8; i++) {
			assert_int_equal(gdr_dereg(r[i]), 0);
			s = stats(c);
			/* Only the 7 - i still held may exceed the limit. */
			assert_int_equal(s.entries, (uint64_t)(which ? 7 - i : (7 - i ? 7 - i : 1)));
			check_fake_consistent(c);
		}
		assert_int_equal(gdr_cache_destroy(c), 0);
		for (int i = 0; i < 8; i++)
			fake_cuda_free(a[i]);
	}
	(void)state;
}

/* UINT64_MAX limits: no overflow in the 1/32 arithmetic; whole allocations pinned. */
static void test_max_limits(void **state)
{
	struct gdr_cache *c = make(&fake_backend_ops, 0,
				   GDR_CACHE_ATTR_MAX_BYTES | GDR_CACHE_ATTR_MAX_ENTRIES |
					   GDR_CACHE_ATTR_MAX_PIN_BYTES,
				   UINT64_MAX, UINT64_MAX, UINT64_MAX);
	uint64_t a = fake_cuda_alloc(64 * MiB), base, len;
	struct gdr_region *r;

	(void)state;
	assert_int_equal(gdr_reg(c, NULL, P(a + 10 * MiB), 4096, 0, &r), 0);
	assert_int_equal(gdr_region_range(r, &base, &len), 0);
	assert_int_equal(base, a);
	assert_int_equal(len, 64 * MiB);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(stats(c).entries, 1);
	check_fake_consistent(c);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
}

/* Pin extent: an allocation larger than the byte limit, requests at its very end and spanning two
 * allocations: the pin is 64 KiB-aligned, covers the request, stays within CUDA-backed memory
 * (the fake backend counts bad pins) and nothing leaks. */
static void test_pin_extent_edges(void **state)
{
	struct gdr_cache *c = make(&fake_backend_ops, 0, GDR_CACHE_ATTR_MAX_BYTES, 8 * MiB, 0, 0);
	uint64_t big = fake_cuda_alloc(64 * MiB), x = fake_cuda_alloc(2 * MiB),
		 y = fake_cuda_alloc(2 * MiB), base, len;
	struct gdr_region *r;

	(void)state;
	/* the last byte of the big allocation */
	assert_int_equal(gdr_reg(c, NULL, P(big + 64 * MiB - 1), 1, 0, &r), 0);
	assert_int_equal(gdr_region_range(r, &base, &len), 0);
	assert_true(base <= big + 64 * MiB - 1 && base + len >= big + 64 * MiB);
	assert_true(len <= 8 * MiB);
	assert_int_equal(base % (64 * KiB), 0);
	assert_int_equal(len % (64 * KiB), 0);
	assert_int_equal(gdr_dereg(r), 0);
	/* whole request bigger than the byte limit: pinned, held, then evicted when released */
	assert_int_equal(gdr_reg(c, NULL, P(big), 64 * MiB, 0, &r), 0);
	assert_int_equal(gdr_region_range(r, &base, &len), 0);
	assert_int_equal(len, 64 * MiB);
	check_fake_consistent(c);
	assert_int_equal(gdr_dereg(r), 0);
	assert_true(stats(c).pinned_bytes <= 8 * MiB);
	check_fake_consistent(c);
	/* spanning two allocations, if they are adjacent */
	if (y == x + 2 * MiB) {
		assert_int_equal(gdr_reg(c, NULL, P(x + 2 * MiB - 4096), 8192, 0, &r), 0);
		assert_int_equal(gdr_region_range(r, &base, &len), 0);
		assert_true(base <= x + 2 * MiB - 4096 && base + len >= x + 2 * MiB + 4096);
		assert_int_equal(gdr_dereg(r), 0);
	}
	check_fake_consistent(c);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(big);
	fake_cuda_free(x);
	fake_cuda_free(y);
}

/* dmabuf: a long loop of registrations, staleness, eviction and flushes closes every fd exactly
 * once (the count of open fds comes back; a double close would close an fd the test opened). */
static void test_dmabuf_fds_closed_once(void **state)
{
	struct gdr_cache *c =
		make(NULL, GDR_BACKEND_DMABUF, GDR_CACHE_ATTR_MAX_ENTRIES, 0, 4, 0);
	int fds0 = count_fds();
	int sentinel = dup(2); /* an fd a double close would likely take */
	uint64_t a[8];
	struct gdr_region *r;

	(void)state;
	assert_true(sentinel >= 0);
	for (int i = 0; i < 8; i++)
		a[i] = fake_cuda_alloc(2 * MiB);
	for (int round = 0; round < 200; round++) {
		int i = round % 8;

		assert_int_equal(gdr_reg(c, round & 1 ? FAKE_PD : NULL, P(a[i] + 4096), 4096, 1,
					 &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
		if (round % 13 == 0) { /* stale: free and reallocate at the same VA */
			fake_cuda_free(a[i]);
			a[i] = fake_cuda_alloc(2 * MiB);
		}
		if (round % 50 == 49)
			gdr_cache_flush(c);
		assert_true((uint64_t)fake_cuda_open_dmabufs() == stats(c).entries);
		assert_true(stats(c).entries <= 4);
	}
	/* Stale while held: the held entry is detached (its fd open while held), the new one gets
	 * its own; releasing the old closes its fd, once. */
	{
		struct gdr_region *h, *h2;

		assert_int_equal(gdr_reg(c, NULL, P(a[0]), 4096, 1, &h), 0);
		fake_cuda_free(a[0]);
		a[0] = fake_cuda_alloc(2 * MiB);
		assert_int_equal(gdr_reg(c, NULL, P(a[0]), 4096, 1, &h2), 0);
		assert_int_equal((uint64_t)fake_cuda_open_dmabufs(), stats(c).entries);
		assert_int_equal(stats(c).detached, 1);
		assert_int_equal(gdr_dereg(h), 0);
		assert_int_equal(stats(c).detached, 0);
		assert_int_equal((uint64_t)fake_cuda_open_dmabufs(), stats(c).entries);
		assert_int_equal(gdr_dereg(h2), 0);
	}
	assert_true(fcntl(sentinel, F_GETFD) != -1); /* not closed by the library */
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(count_fds(), fds0 + 1);
	close(sentinel);
	for (int i = 0; i < 8; i++)
		fake_cuda_free(a[i]);
}

/* RLIMIT_NOFILE low, dmabuf backend: exporting fails for want of fds. With every entry held that is
 * an error (no crash, no leak); with unheld entries it evicts (closing their fds) and succeeds. */
static void test_dmabuf_fd_exhaustion(void **state)
{
	struct gdr_cache *c = make(NULL, GDR_BACKEND_DMABUF, 0, 0, 0, 0);
	struct rlimit old, lim;
	int fds0 = count_fds(), held = 0, rc = 0;
	uint64_t a[32];
	struct gdr_region *r[32];
	struct gdr_cache_stats s;

	(void)state;
	for (int i = 0; i < 32; i++)
		a[i] = fake_cuda_alloc(2 * MiB);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	saved_nofile = old;
	have_saved_nofile = true;
	lim = old;
	lim.rlim_cur = (rlim_t)fds0 + 8 + 3; /* opendir's and a few spare */
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
	for (held = 0; held < 32; held++) {
		rc = gdr_reg(c, NULL, P(a[held]), 4096, 0, &r[held]);
		if (rc)
			break;
	}
	assert_true(held < 32);
	assert_true(rc < 0);
	s = stats(c);
	assert_int_equal(s.entries, (uint64_t)held);
	assert_int_equal(s.pins - s.unpins, s.entries);
	/* release them: the next ones evict (closing fds) and succeed, every time */
	for (int i = 0; i < held; i++)
		assert_int_equal(gdr_dereg(r[i]), 0);
	for (int i = held; i < 32; i++) {
		struct gdr_region *x;

		assert_int_equal(gdr_reg(c, NULL, P(a[i]), 4096, 0, &x), 0);
		assert_int_equal(gdr_dereg(x), 0);
	}
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	s = stats(c);
	assert_true(s.fail_pin_retried > 0);
	assert_int_equal(s.pins - s.unpins, s.entries);
	assert_int_equal((uint64_t)fake_cuda_open_dmabufs(), s.entries);
	assert_int_equal(count_fds() - fds0, (int)s.entries);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(count_fds(), fds0);
	for (int i = 0; i < 32; i++)
		fake_cuda_free(a[i]);
}

/* kmod: a module with another ABI major is closed again; a pin the module refuses leaves nothing;
 * the module's slot table full (-ENOSPC) evicts and retries. */
static void test_kmod_faults(void **state)
{
	struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_BACKEND, .backend = GDR_BACKEND_KMOD };
	struct gdr_cache *c = NULL;
	enum { N = 1100 };
	static uint64_t a[N];
	struct gdr_region *r;
	struct gdr_cache_stats s;

	(void)state;
	fake_kmod.major = GDRCACHE_UAPI_VERSION_MAJOR + 1;
	assert_int_equal(fake_cache_create(&at, NULL, &c), -ENODEV);
	assert_true(fake_kmod.closed);
	fake_kmod.major = GDRCACHE_UAPI_VERSION_MAJOR;
	c = make(NULL, GDR_BACKEND_KMOD, 0, 0, 0, 0);
	a[0] = fake_cuda_alloc(2 * MiB);
	fake_kmod.pin_fail_rc = -EIO;
	fake_kmod.pin_fail_n = 1;
	assert_int_equal(gdr_reg(c, NULL, P(a[0]), 4096, 0, &r), -EIO);
	assert_int_equal(fake_kmod.outstanding, 0);
	fake_kmod.pin_fail_rc = -ENOMEM;
	fake_kmod.pin_fail_n = 100;
	assert_int_equal(gdr_reg(c, NULL, P(a[0]), 4096, 0, &r), -ENOMEM);
	assert_int_equal(fake_kmod.pin_fail_n, 99); /* nothing to evict: one try */
	fake_kmod.pin_fail_n = 0;
	for (int i = 1; i < N; i++)
		a[i] = fake_cuda_alloc(2 * MiB);
	for (int i = 0; i < N; i++) {
		assert_int_equal(gdr_reg(c, NULL, P(a[i]), 4096, 0, &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
	}
	s = stats(c);
	assert_true(s.fail_pin_retried > 0);
	assert_int_equal(s.pins - s.unpins, s.entries);
	assert_int_equal(fake_kmod.outstanding, s.entries);
	assert_int_equal(fake_kmod.ioctls_bad, 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_kmod.outstanding, 0);
	for (int i = 0; i < N; i++)
		fake_cuda_free(a[i]);
}

/* peermem: the MR is the pin; a failed MR leaves no MR, and the registration is an error. */
static void test_peermem_faults(void **state)
{
	struct gdr_cache *c = make(NULL, GDR_BACKEND_PEERMEM, 0, 0, 0, 0);
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;

	(void)state;
	fake_verbs.fail_next_errno = EFAULT;
	fake_verbs.fail_next_n = 1;
	assert_int_equal(gdr_reg(c, FAKE_PD, P(a), 4096, 1, &r), -EFAULT);
	assert_int_equal(fake_verbs.outstanding, 0);
	assert_int_equal(gdr_reg(c, FAKE_PD, P(a), 4096, 1, &r), 0);
	assert_int_equal(fake_verbs.outstanding, 1);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
}

/* SYNC_MEMOPS or classification failing leaves nothing pinned and is retried next time. */
static void test_cuda_faults(void **state)
{
	struct gdr_cache *c = make(NULL, GDR_BACKEND_DMABUF, 0, 0, 0, 0);
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;
	const char *entries[] = { "cuPointerGetAttributes", "cuPointerSetAttribute",
				  "cuMemGetHandleForAddressRange" };

	(void)state;
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(fake_cuda_fail_next(entries[i], 999, 1), 0);
		assert_true(gdr_reg(c, FAKE_PD, P(a), 4096, 1, &r) < 0);
		assert_int_equal(fake_cuda_open_dmabufs(), 0);
		assert_int_equal(fake_verbs.outstanding, 0);
		assert_int_equal(stats(c).entries, 0);
		assert_int_equal(stats(c).pinned_bytes, 0);
	}
	assert_int_equal(gdr_reg(c, FAKE_PD, P(a), 4096, 1, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
}


/* UINT64_MAX entry limit: a cache holds at most GDR_SLOT_MAX registration records (thread.h), one
 * at least per entry. Once that many unheld entries are cached, a new registration must evict one
 * (they are all unheld), not fail; a host registration (a record too) as well as a GPU one. */
static void test_unbounded_entries_records(void **state)
{
	struct gdr_cache *c = make(&fake_backend_ops, 0,
				   GDR_CACHE_ATTR_MAX_BYTES | GDR_CACHE_ATTR_MAX_ENTRIES |
					   GDR_CACHE_ATTR_MAX_PIN_BYTES,
				   UINT64_MAX, UINT64_MAX, 64 * KiB);
	const uint64_t n = GDR_SLOT_MAX + 16;
	uint64_t a = fake_cuda_alloc(n * 64 * KiB);
	uint64_t failed_at = 0;
	int rc = 0, rc_host = 0;
	struct gdr_region *r;
	static char buf[8192];

	(void)state;
	assert_int_not_equal(a, 0);
	if (!getenv("TBF_RECORDS")) { /* half a million misses: its own ctest, unit_backend_records */
		gdr_cache_destroy(c);
		fake_cuda_free(a);
		skip();
	}
	for (uint64_t i = 0; i < n; i++) {
		rc = gdr_reg(c, NULL, P(a + i * 64 * KiB), 4096, 0, &r);
		if (rc) {
			failed_at = i;
			break;
		}
		assert_int_equal(gdr_dereg(r), 0);
	}
	/* Host memory's record comes from the same arena: an unheld entry makes way for it too. */
	if (!rc) {
		rc_host = gdr_reg(c, FAKE_PD, buf, sizeof(buf), 1, &r);
		if (!rc_host)
			assert_int_equal(gdr_dereg(r), 0);
	}
	check_fake_consistent(c);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
	if (rc)
		print_error("registration %llu of %llu distinct unheld ranges failed: %d\n",
			    (unsigned long long)failed_at, (unsigned long long)n, rc);
	assert_int_equal(rc, 0);
	if (rc_host)
		print_error("host registration with every record taken by unheld entries: %d\n",
			    rc_host);
	assert_int_equal(rc_host, 0);
}

/* peermem has no pin apart from an MR: "gdr_reg without [a PD]: -EOPNOTSUPP" (peermem.c), also
 * when an entry of the same memory is already cached from a registration with a PD; else the
 * caller holds a registration with nothing pinned for it (the PD's MR can be released under it:
 * gdr_cache_release_pd). */
static void test_peermem_no_pd_on_cached_entry(void **state)
{
	struct gdr_cache *c = make(NULL, GDR_BACKEND_PEERMEM, 0, 0, 0, 0);
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r, *r0 = NULL;
	int rc;

	(void)state;
	assert_int_equal(gdr_reg(c, NULL, P(a), 4096, 0, &r0), -EOPNOTSUPP);
	assert_int_equal(gdr_reg(c, FAKE_PD, P(a), 4096, 1, &r), 0);
	rc = gdr_reg(c, NULL, P(a), 4096, 0, &r0);
	assert_int_equal(gdr_dereg(r), 0);
	if (!rc) {
		struct ibv_mr *mr = (struct ibv_mr *)1;

		/* what the caller got: no MR, no page list, no dma-buf */
		assert_int_equal(gdr_region_mr(r0, &mr), 0);
		assert_null(mr);
		assert_int_equal(gdr_cache_release_pd(c, FAKE_PD), 0);
		assert_int_equal(fake_verbs.outstanding, 0); /* nothing pins it now, yet it is held */
		assert_int_equal(gdr_dereg(r0), 0);
	}
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
	assert_int_equal(rc, -EOPNOTSUPP);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_failed_mr_respects_limits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_dmabuf_mr_keeps_fds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_failure_nothing_evictable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_held_never_evicted_tiny_limits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_max_limits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_extent_edges, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dmabuf_fds_closed_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dmabuf_fd_exhaustion, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kmod_faults, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peermem_faults, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peermem_no_pd_on_cached_entry, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cuda_faults, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unbounded_entries_records, setup, teardown),
	};

	fake_kmod_install();
	fake_verbs_install();
	if (getenv("TBF_FILTER"))
		cmocka_set_test_filter(getenv("TBF_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
