/* SPDX-License-Identifier: MIT */
/* Bad input: every public function refuses it with a clear -errno, without crashing or leaking. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)

static void test_create_bad_attributes(void **state)
{
	struct gdr_cache *c = (struct gdr_cache *)1;
	struct gdr_cache_attr a = { 0 };

	(void)state;
	assert_int_equal(gdr_cache_create(NULL, NULL), -EINVAL);
	a.field_mask = 1ULL << 40;
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	assert_null(c);
	/* intercept without its field bit: as the reserved field it was */
	a = (struct gdr_cache_attr){ .intercept = 1 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_INTERCEPT, .intercept = 3 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_INTERCEPT | GDR_CACHE_ATTR_VALIDATE,
				     .intercept = GDR_INTERCEPT_OFF,
				     .validate = GDR_VALIDATE_EVENTS };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_MAX_BYTES, .max_bytes = 0 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_MAX_ENTRIES };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_BACKEND, .backend = 9 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_BACKEND, .backend = -1 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_VALIDATE, .validate = 7 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	/* 0.1's log-level bit (gdr_set_log_level now): refused, even with a valid level. */
	a = (struct gdr_cache_attr){ .field_mask = 1u << 5 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	a = (struct gdr_cache_attr){ .reserved0 = GDR_LOG_NONE + 1 };
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	assert_null(c);
	assert_int_equal(gdr_set_log_level(GDR_LOG_DEBUG + 1), -EINVAL);
	assert_int_equal(gdr_set_log_level(GDR_LOG_NONE - 1), -EINVAL);
}

static void test_reg_bad_input(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r = (struct gdr_region *)1;
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_cache_stats s;

	(void)state;
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(NULL, NULL, (void *)(uintptr_t)a, 1, 0, &r), -EINVAL);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 1, 0, NULL), -EINVAL);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 0, 0, &r), -EINVAL);
	assert_null(r);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)(UINT64_MAX - 10), 100, 0, &r), -EINVAL);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, SIZE_MAX, 0, &r), -EINVAL);
	assert_int_equal(gdr_cache_get_stats(c, &s), 0);
	assert_int_equal(s.fail_input, 3);
	assert_int_equal(s.pins, 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
}

static void test_double_dereg_and_busy_destroy(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	uint64_t a = fake_cuda_alloc(2 * MiB);

	(void)state;
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
	assert_int_equal(gdr_cache_destroy(c), -EBUSY); /* a registration is held */
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_dereg(r), -EINVAL);          /* double dereg while cached */
	assert_int_equal(gdr_cache_flush(c), 1);
	assert_int_equal(gdr_dereg(r), -EINVAL);          /* and after its entry was evicted */
	assert_int_equal(gdr_dereg(NULL), -EINVAL);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(gdr_cache_destroy(NULL), -EINVAL);
	assert_int_equal(gdr_cache_flush(NULL), -EINVAL);
	assert_int_equal(fake_be.outstanding, 0);
	fake_cuda_free(a);
}

static void test_accessors_bad_input(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	uint64_t a = fake_cuda_alloc(2 * MiB), u64;
	uint32_t u32;
	struct ibv_mr *mr;
	enum gdr_mem_kind kind;
	enum gdr_backend be;
	struct gdr_cache_stats s;
	int fd;

	(void)state;
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_region_mr(NULL, &mr), -EINVAL);
	assert_int_equal(gdr_region_keys(NULL, &u32, &u32), -EINVAL);
	assert_int_equal(gdr_region_range(NULL, &u64, &u64), -EINVAL);
	assert_int_equal(gdr_region_buffer_id(NULL, &u64), -EINVAL);
	assert_int_equal(gdr_region_mem_kind(NULL, &kind), -EINVAL);
	assert_int_equal(gdr_region_kmod(NULL, &u64, &u32, &u32), -EINVAL);
	assert_int_equal(gdr_region_pages(NULL, &u64, 1), -EINVAL);
	assert_int_equal(gdr_region_dmabuf(NULL, &fd, &u64), -EINVAL);
	assert_int_equal(gdr_cache_get_stats(NULL, &s), -EINVAL);
	assert_int_equal(gdr_cache_get_stats(c, NULL), -EINVAL);
	assert_int_equal(gdr_cache_backend(NULL, &be), -EINVAL);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
	assert_int_equal(gdr_region_mr(r, NULL), -EINVAL);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_null(mr);                                         /* no PD, no MR */
	assert_int_equal(gdr_region_keys(r, &u32, &u32), -ENOENT);
	assert_int_equal(gdr_region_dmabuf(r, &fd, &u64), -ENOENT); /* not the dmabuf backend */
	assert_int_equal(gdr_region_pages(r, NULL, 4), -EINVAL);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_flush(c), 1);
	assert_int_equal(gdr_region_range(r, &u64, &u64), -EINVAL); /* its entry is gone */
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
}

static void test_version(void **state)
{
	(void)state;
	assert_int_equal(gdr_cache_version(), GDR_VERSION);
	assert_int_equal(GDR_VERSION >> 16, GDR_VERSION_MAJOR);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_bad_attributes),
		cmocka_unit_test(test_reg_bad_input),
		cmocka_unit_test(test_double_dereg_and_busy_destroy),
		cmocka_unit_test(test_accessors_bad_input),
		cmocka_unit_test(test_version),
	};

	fake_verbs_install();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
