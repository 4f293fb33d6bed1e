/* SPDX-License-Identifier: MIT */
/*
 * GDRCACHE_LOG=debug follows one registration (lib/cache/miss.c, entry.c, apply.c, reg.c): at level
 * debug a miss, its classification, the pin, the MR, an eviction (max_entries 1), a free event
 * (cuMemFree_v2 of the fake driver, intercepted), the unpin, and refusals (bad input; host memory
 * without a PD) each log a key=value line with the cache's id, and a lock-free hit logs nothing.
 * At level info none of these lines appear. Lines are taken with gdr_set_log_handler.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "cache/cache.h"
#include "cuda/cuda_abi.h"
#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)

/* The fake's exported entries (patched by the library: its frees are intercepted). */
gdr_CUresult cuMemAlloc_v2(gdr_CUdeviceptr *p, size_t n);
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);

#define LINES 512
static struct {
	unsigned n;
	int level[LINES];
	char msg[LINES][512];
} got;

static void collect(void *arg, int level, const char *msg)
{
	(void)arg;
	if (got.n < LINES) {
		got.level[got.n] = level;
		snprintf(got.msg[got.n], sizeof(got.msg[0]), "%s", msg);
	}
	got.n++;
}

/* The lines (from the first-th) containing needle. */
static unsigned seen(unsigned first, const char *needle)
{
	unsigned k = 0;

	for (unsigned i = first; i < got.n && i < LINES; i++)
		k += strstr(got.msg[i], needle) != NULL;
	return k;
}

static uint64_t alloc(size_t n)
{
	gdr_CUdeviceptr p = 0;

	assert_int_equal(cuMemAlloc_v2(&p, n), GDR_CUDA_SUCCESS);
	return p;
}

/* What one registration's life logged: expectations of the scenario, each a line's text. */
#define EXPECT 16
struct expect {
	unsigned n;
	char text[EXPECT][160];
};

static void expect(struct expect *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void expect(struct expect *x, const char *fmt, ...)
{
	va_list ap;

	assert_true(x->n < EXPECT);
	va_start(ap, fmt);
	vsnprintf(x->text[x->n++], sizeof(x->text[0]), fmt, ap);
	va_end(ap);
}

/* A miss then a hit of a, b registered (a evicted: max_entries 1), b freed, a refused request and
 * host memory without a PD, at the given level. *hit_lines: what the hit logged; *x: the lines
 * expected at level debug. */
static void scenario(int level, unsigned *hit_lines, struct expect *x)
{
	struct gdr_cache_attr attr = { .field_mask =
					       GDR_CACHE_ATTR_VALIDATE | GDR_CACHE_ATTR_MAX_ENTRIES,
				       .validate = GDR_VALIDATE_EVENTS,
				       .max_entries = 1 };
	struct gdr_cache_stats s0, s1;
	struct gdr_region *r = NULL, *r2 = NULL, *rb = NULL;
	struct gdr_cache *c = NULL;
	uint64_t a, b, id, host[4];
	unsigned mark;

	fakes_reset();
	assert_int_equal(fake_cache_create(&attr, &fake_backend_ops, &c), 0);
	id = c->id;
	a = alloc(2 * MiB);
	b = alloc(2 * MiB);
	gdr_set_log_level(level);
	got.n = 0;

	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)a, 4096, IBV_ACCESS_LOCAL_WRITE,
				 &r),
			 0);
	assert_int_equal(gdr_cache_get_stats(c, &s0), 0);
	mark = got.n;
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)a, 4096, IBV_ACCESS_LOCAL_WRITE,
				 &r2),
			 0);
	*hit_lines = got.n - mark;
	assert_int_equal(gdr_cache_get_stats(c, &s1), 0);
	assert_int_equal(s1.fast_hits,
			 s0.fast_hits + 1); /* the lock-free hit, not the locked one */
	assert_ptr_equal(r, r2);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_dereg(r2), 0);

	/* b's miss evicts a: one entry at most */
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)b, 4096, IBV_ACCESS_LOCAL_WRITE,
				 &rb),
			 0);
	assert_int_equal(fake_be.outstanding, 1);
	assert_int_equal(gdr_dereg(rb), 0);
	/* b's free drops its (unheld) entry before it returns */
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_be.outstanding, 0);
	/* refusals: before the lock, and in the locked path */
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)a, 0, 0, &r), -EINVAL);
	assert_int_equal(gdr_reg(c, NULL, host, sizeof(host), 0, &r), -EINVAL);

	gdr_set_log_level(GDR_LOG_ERROR);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);

	x->n = 0;
	expect(x, "miss cache=%llu addr=%#llx len=4096 why=none", (unsigned long long)id,
	       (unsigned long long)a);
	expect(x, "classify cache=%llu addr=%#llx kind=device dev=0 alloc=%#llx-%#llx id=",
	       (unsigned long long)id, (unsigned long long)a, (unsigned long long)a,
	       (unsigned long long)(a + 2 * MiB));
	expect(x, "pin cache=%llu be=fake dev=0 range=%#llx-%#llx bytes=%llu retries=0 us=",
	       (unsigned long long)id, (unsigned long long)a, (unsigned long long)(a + 2 * MiB),
	       2 * MiB);
	expect(x, "mr cache=%llu pd=%p access=%#x range=%#llx-%#llx lkey=", (unsigned long long)id,
	       (void *)FAKE_PD, (unsigned)IBV_ACCESS_LOCAL_WRITE, (unsigned long long)a,
	       (unsigned long long)(a + 2 * MiB));
	expect(x, " type=wide us=");
	expect(x, "miss cache=%llu addr=%#llx len=4096 why=none", (unsigned long long)id,
	       (unsigned long long)b);
	expect(x, "evict cache=%llu range=%#llx-%#llx bytes=%llu why=max_entries",
	       (unsigned long long)id, (unsigned long long)a, (unsigned long long)(a + 2 * MiB),
	       2 * MiB);
	expect(x, "unpin cache=%llu be=fake range=%#llx-%#llx bytes=%llu", (unsigned long long)id,
	       (unsigned long long)a, (unsigned long long)(a + 2 * MiB), 2 * MiB);
	expect(x, "mr_dereg cache=%llu pd=%p lkey=", (unsigned long long)id, (void *)FAKE_PD);
	expect(x, "event cache=%llu kind=free addr=%#llx len=0 dropped=1", (unsigned long long)id,
	       (unsigned long long)b);
	expect(x, "drop cache=%llu range=%#llx-%#llx id=", (unsigned long long)id,
	       (unsigned long long)b, (unsigned long long)(b + 2 * MiB));
	expect(x, " why=stale");
	expect(x, "free_applied cache=%llu events=1 dropped=1 unpinned=1", (unsigned long long)id);
	expect(x, "refuse cache=%llu addr=%#llx len=0 rc=%d why=zero_length",
	       (unsigned long long)id, (unsigned long long)a, -EINVAL);
	expect(x, "classify cache=%llu addr=%#llx len=%zu kind=host", (unsigned long long)id,
	       (unsigned long long)(uintptr_t)host, sizeof(host));
	expect(x, "refuse cache=%llu addr=%#llx len=%zu rc=%d why=host_without_pd",
	       (unsigned long long)id, (unsigned long long)(uintptr_t)host, sizeof(host), -EINVAL);
}

static void test_debug_follows_a_registration(void **state)
{
	struct expect x;
	char missing[2048] = "";
	unsigned hit_lines, lost = 0;

	(void)state;
	scenario(GDR_LOG_DEBUG, &hit_lines, &x);
	assert_true(got.n <= LINES);
	for (unsigned i = 0; i < x.n; i++) {
		if (seen(0, x.text[i]))
			continue;
		lost++;
		strncat(missing, "\n  ", sizeof(missing) - strlen(missing) - 1);
		strncat(missing, x.text[i], sizeof(missing) - strlen(missing) - 1);
	}
	for (unsigned i = 0; i < got.n; i++)
		if (got.level[i] == GDR_LOG_DEBUG)
			assert_true(strlen(got.msg[i]) < 160); /* short */
	if (lost || hit_lines) {
		for (unsigned i = 0; i < got.n; i++)
			print_message("logged: %s\n", got.msg[i]);
		fail_msg("%u debug line(s) missing:%s\nthe lock-free hit logged %u line(s)", lost,
			 missing, hit_lines);
	}
}

static void test_info_shows_none_of_them(void **state)
{
	struct expect x;
	unsigned hit_lines;

	(void)state;
	scenario(GDR_LOG_INFO, &hit_lines, &x);
	assert_int_equal(hit_lines, 0);
	for (unsigned i = 0; i < x.n; i++)
		if (seen(0, x.text[i]))
			fail_msg("at level info: %s", x.text[i]);
	for (unsigned i = 0; i < got.n && i < LINES; i++)
		assert_int_not_equal(got.level[i], GDR_LOG_DEBUG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_debug_follows_a_registration),
		cmocka_unit_test(test_info_shows_none_of_them),
	};
	int rc;

	assert_int_equal(gdr_set_log_handler(collect, NULL), 0);
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	gdr_set_log_handler(NULL, NULL);
	return rc;
}
