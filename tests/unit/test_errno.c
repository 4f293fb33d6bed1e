/* SPDX-License-Identifier: MIT */
/*
 * No public function changes errno (include/gdrcache.h): errno holds a sentinel before every call
 * of a realistic sequence and still holds it after, through calls that succeed, calls refused for
 * bad input, and calls whose libc or libibverbs calls fail inside: a kmod device that does not
 * exist (open), a log file and a statistics file that cannot be opened, an MR the NIC refuses, a
 * thread's first registration (it allocates).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)
#define SENTINEL 4242
#define REMOTE (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

/* call returns rc, and errno is what it was. */
#define KEEPS(call, rc)                                      \
	do {                                                 \
		errno = SENTINEL;                            \
		assert_int_equal((call), (rc));              \
		assert_int_equal(errno, SENTINEL);           \
	} while (0)

static void test_create_and_process_wide(void **state)
{
	struct gdr_cache_attr kmod = { .field_mask = GDR_CACHE_ATTR_BACKEND,
				       .backend = GDR_BACKEND_KMOD };
	struct gdr_cache_attr bad = { .field_mask = 1ULL << 40 };
	struct gdr_intercept_stats is;
	struct gdr_cache *c = NULL;

	(void)state;
	/* The first call reads the environment (getenv, strtoull, an unopenable log file). */
	KEEPS(gdr_set_log_level(GDR_LOG_WARN), GDR_LOG_ERROR);
	KEEPS(gdr_set_log_level(GDR_LOG_DEBUG + 3), -EINVAL);
	/* GDRCACHE_KMOD_DEV=/nonexistent/gdrcache: open fails (ENOENT) */
	KEEPS(gdr_cache_create(&kmod, &c), -ENODEV);
	KEEPS(gdr_cache_create(&bad, &c), -EINVAL);
	KEEPS(gdr_cache_create(NULL, NULL), -EINVAL);
	KEEPS(gdr_intercept_get_stats(&is, sizeof(is)), 0);
	KEEPS(gdr_intercept_get_stats(&is, 1), -EINVAL);
	KEEPS(gdr_set_log_level(GDR_LOG_ERROR), GDR_LOG_WARN);
	/* The configured backend: kmod fails to open first, then what serves the fake driver. */
	errno = SENTINEL;
	if (gdr_cache_create(NULL, &c) == 0) {
		assert_int_equal(errno, SENTINEL);
		KEEPS(gdr_cache_destroy(c), 0);
	} else {
		assert_int_equal(errno, SENTINEL);
	}
	KEEPS(gdr_cache_destroy(NULL), -EINVAL);
}

static void *thread_regs(void *arg)
{
	struct gdr_cache *c = arg;
	struct gdr_region *r;
	uint64_t a = fake_cuda_alloc(MiB);
	long bad = 0;

	errno = SENTINEL;
	bad += gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r) != 0; /* this thread's first */
	bad += errno != SENTINEL;
	bad += gdr_dereg(r) != 0;
	bad += errno != SENTINEL;
	fake_cuda_free(a);
	return (void *)bad;
}

static void test_cache_sequence(void **state)
{
	struct gdr_cache_attr attr = { .field_mask = GDR_CACHE_ATTR_MAX_ENTRIES |
				       GDR_CACHE_ATTR_VALIDATE, .max_entries = 2,
				       .validate = GDR_VALIDATE_TAG };
	uint64_t a = fake_cuda_alloc(2 * MiB), b = fake_cuda_alloc(2 * MiB);
	uint64_t d = fake_cuda_alloc(2 * MiB), e = fake_cuda_alloc(2 * MiB), u64, pages[4];
	struct gdr_region *r, *r2, *rh, *rb, *rd, *re;
	struct gdr_cache_stats st;
	struct gdr_cache_settings set;
	struct gdr_cache *c;
	struct ibv_mr *mr;
	enum gdr_mem_kind kind;
	enum gdr_backend be;
	uint32_t lk, rk, u32;
	char host[8192];
	pthread_t th;
	void *bad;
	int fd;

	(void)state;
	fake_verbs_install();
	assert_int_equal(fake_cache_create(&attr, &fake_backend_ops, &c), 0);
	/* a miss, a hit, releases */
	KEEPS(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	KEEPS(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r2), 0);
	KEEPS(gdr_dereg(r2), 0);
	KEEPS(gdr_region_range(r, &u64, &u64), 0);
	KEEPS(gdr_region_buffer_id(r, &u64), 0);
	KEEPS(gdr_region_mem_kind(r, &kind), 0);
	KEEPS(gdr_region_mr(r, &mr), 0);
	KEEPS(gdr_region_keys(r, &lk, &rk), -ENOENT);
	KEEPS(gdr_region_kmod(r, &u64, &u32, &u32), -ENOENT);
	KEEPS(gdr_region_dmabuf(r, &fd, &u64), -ENOENT);
	errno = SENTINEL;
	(void)gdr_region_pages(r, pages, 4);
	assert_int_equal(errno, SENTINEL);
	KEEPS(gdr_dereg(r), 0);
	KEEPS(gdr_dereg(r), -EINVAL); /* twice */
	/* MRs: made (libibverbs' wrappers clear errno first), and refused by the NIC */
	KEEPS(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)a, 4096, REMOTE, &r), 0);
	KEEPS(gdr_region_keys(r, &lk, &rk), 0);
	fake_verbs.fail_next_errno = EFAULT;
	fake_verbs.fail_next_n = 1;
	KEEPS(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096, REMOTE, &r2), -EFAULT);
	/* host memory: passed through to ibv_reg_mr, refused without a PD */
	KEEPS(gdr_reg(c, NULL, host, sizeof(host), 0, &rh), -EINVAL);
	KEEPS(gdr_reg(c, FAKE_PD, host, sizeof(host), IBV_ACCESS_LOCAL_WRITE, &rh), 0);
	KEEPS(gdr_dereg(rh), 0);
	/* bad input */
	KEEPS(gdr_reg(c, NULL, (void *)(uintptr_t)a, 0, 0, &r2), -EINVAL);
	KEEPS(gdr_reg(NULL, NULL, (void *)(uintptr_t)a, 1, 0, &r2), -EINVAL);
	KEEPS(gdr_dereg(NULL), -EINVAL);
	/* over the entry limit while held, then releases that evict */
	KEEPS(gdr_reg(c, NULL, (void *)(uintptr_t)b, 4096, 0, &rb), 0);
	KEEPS(gdr_reg(c, NULL, (void *)(uintptr_t)d, 4096, 0, &rd), 0);
	KEEPS(gdr_reg(c, NULL, (void *)(uintptr_t)e, 4096, 0, &re), 0);
	KEEPS(gdr_dereg(rb), 0);
	KEEPS(gdr_dereg(rd), 0);
	KEEPS(gdr_dereg(re), 0);
	/* a pin the backend refuses */
	fake_be.fail_next_rc = -EIO;
	fake_be.fail_next_n = 1;
	KEEPS(gdr_cache_flush(c) >= 0, 1);
	KEEPS(gdr_reg(c, NULL, (void *)(uintptr_t)b, 4096, 0, &rb), -EIO);
	/* another thread's first registration */
	assert_int_equal(pthread_create(&th, NULL, thread_regs, c), 0);
	assert_int_equal(pthread_join(th, &bad), 0);
	assert_int_equal((long)bad, 0);
	/* what the cache says */
	KEEPS(gdr_cache_get_stats(c, &st), 0);
	KEEPS(gdr_cache_get_stats_ex(c, &st, sizeof(st)), 0);
	KEEPS(gdr_cache_get_stats_ex(c, &st, 8), -EINVAL);
	KEEPS(gdr_cache_get_settings(c, &set, sizeof(set)), 0);
	KEEPS(gdr_cache_get_settings(c, &set, 8), -EINVAL);
	KEEPS(gdr_cache_backend(c, &be), 0);
	KEEPS(gdr_cache_version() != 0, 1);
	/* teardown: busy, the PD, flush, destroy (GDRCACHE_STATS=file: in a missing folder) */
	KEEPS(gdr_cache_destroy(c), -EBUSY);
	KEEPS(gdr_cache_release_pd(c, FAKE_PD), -EBUSY);
	KEEPS(gdr_dereg(r), 0);
	KEEPS(gdr_cache_release_pd(c, FAKE_PD), 0);
	KEEPS(gdr_cache_release_pd(c, NULL), -EINVAL);
	KEEPS(gdr_cache_flush(c) >= 0, 1);
	KEEPS(gdr_cache_flush(NULL), -EINVAL);
	KEEPS(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
	fake_cuda_free(b);
	fake_cuda_free(d);
	fake_cuda_free(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_and_process_wide),
		cmocka_unit_test(test_cache_sequence),
	};

	/* Read at the first call: a size to parse, files that cannot be opened. */
	setenv("GDRCACHE_MAX_BYTES", "1G", 1);
	setenv("GDRCACHE_LOG_FILE", "/nonexistent/gdrcache-test/log", 1);
	setenv("GDRCACHE_STATS", "file:/nonexistent/gdrcache-test/stats.json", 1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
