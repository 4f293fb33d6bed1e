/* SPDX-License-Identifier: MIT */
/*
 * The API that grows (0.2): statistics and settings copied to the caller's size (too small refused,
 * the library's size copied, zeros past it up to the caller's, nothing past the caller's), where
 * each setting came from, the process-wide log level, and enum gdr_validate's AUTO 0.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/log.h"
#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)
#define FILL 0xa5a5a5a5a5a5a5a5ULL
#define STATS_0_1 (offsetof(struct gdr_cache_stats, fast_hits) + sizeof(uint64_t))
#define ENV_PIN_BYTES (8 * MiB) /* GDRCACHE_MAX_PIN_BYTES, set by main before anything reads it */

_Static_assert(GDR_VALIDATE_AUTO == 0 && GDR_VALIDATE_TAG == 1 && GDR_VALIDATE_EVENTS == 2 &&
	       GDR_BACKEND_AUTO == 0, "AUTO is 0 in both enums, as in a zeroed attribute");
_Static_assert(STATS_0_1 == 27 * sizeof(uint64_t), "0.1's statistics: 27 counters");

static struct gdr_cache *make(const struct gdr_cache_attr *a)
{
	struct gdr_cache *c = NULL;

	assert_int_equal(fake_cache_create(a, &fake_backend_ops, &c), 0);
	return c;
}

static void test_set_log_level(void **state)
{
	struct gdr_cache_attr a = { .field_mask = 1u << 5 }; /* 0.1's log-level bit */
	struct gdr_cache *c = (struct gdr_cache *)1;

	(void)state;
	/* GDRCACHE_LOG=error (the test's environment) is read first: this overrides it. */
	assert_int_equal(gdr_set_log_level(GDR_LOG_INFO), GDR_LOG_ERROR);
	assert_int_equal(__atomic_load_n(&gdr_log_level, __ATOMIC_RELAXED), GDR_LOG_INFO);
	assert_int_equal(gdr_set_log_level(-1), -EINVAL);
	assert_int_equal(gdr_set_log_level(GDR_LOG_DEBUG + 1), -EINVAL);
	assert_int_equal(gdr_set_log_level(GDR_LOG_NONE), GDR_LOG_INFO); /* unchanged by refusals */
	assert_int_equal(gdr_set_log_level(GDR_LOG_ERROR), GDR_LOG_NONE);
	/* and no cache attribute sets it any more */
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
	assert_null(c);
	assert_int_equal(__atomic_load_n(&gdr_log_level, __ATOMIC_RELAXED), GDR_LOG_ERROR);
}

static void test_stats_ex_sizes(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				    .validate = GDR_VALIDATE_TAG };
	struct gdr_cache *c;
	struct gdr_region *r;
	uint64_t p = fake_cuda_alloc(2 * MiB);
	struct {
		struct gdr_cache_stats s;
		uint64_t more[4];
	} big;

	(void)state;
	fake_verbs = (struct fake_verbs_state){ 0 };
	c = make(&a);
	/* an MR of exactly one remote-access range: counted by a field 0.1 did not have */
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)p, 4096,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);

	assert_int_equal(gdr_cache_get_stats_ex(NULL, &big.s, sizeof(big.s)), -EINVAL);
	assert_int_equal(gdr_cache_get_stats_ex(c, NULL, sizeof(big.s)), -EINVAL);
	memset(&big, 0xa5, sizeof(big));
	assert_int_equal(gdr_cache_get_stats_ex(c, &big.s, STATS_0_1 - 1), -EINVAL);
	assert_int_equal(gdr_cache_get_stats_ex(c, &big.s, 0), -EINVAL);
	assert_int_equal(big.s.hits, FILL); /* refused: nothing written */

	/* 0.1's size: 0.1's fields, nothing past them */
	assert_int_equal(gdr_cache_get_stats_ex(c, &big.s, STATS_0_1), 0);
	assert_int_equal(big.s.misses, 1);
	assert_int_equal(big.s.validate_mode, GDR_VALIDATE_TAG);
	assert_int_equal(big.s.fast_hits, 0);
	assert_int_equal(big.s.exact_mrs, FILL);

	/* this library's size: every field */
	memset(&big, 0xa5, sizeof(big));
	assert_int_equal(gdr_cache_get_stats_ex(c, &big.s, sizeof(big.s)), 0);
	assert_int_equal(big.s.exact_mrs, 1);
	assert_int_equal(big.s.exact_replaced, 0);
	assert_int_equal(big.more[0], FILL);

	/* a newer caller's size: zeros past what this library knows, nothing past its size */
	memset(&big, 0xa5, sizeof(big));
	assert_int_equal(gdr_cache_get_stats_ex(c, &big.s, sizeof(big.s) + 2 * sizeof(uint64_t)), 0);
	assert_int_equal(big.s.exact_mrs, 1);
	assert_int_equal(big.more[0], 0);
	assert_int_equal(big.more[1], 0);
	assert_int_equal(big.more[2], FILL);

	/* gdr_cache_get_stats: 0.1's fields only, whatever the struct has grown to */
	memset(&big, 0xa5, sizeof(big));
	assert_int_equal(gdr_cache_get_stats(c, &big.s), 0);
	assert_int_equal(big.s.misses, 1);
	assert_int_equal(big.s.exact_mrs, FILL);
	assert_int_equal(big.s.exact_replaced, FILL);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(p);
}

static void test_settings(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_MAX_BYTES |
				    GDR_CACHE_ATTR_VALIDATE, .max_bytes = 64 * MiB,
				    .validate = GDR_VALIDATE_AUTO };
	struct gdr_cache *c;
	struct gdr_cache_stats st;
	struct {
		struct gdr_cache_settings s;
		char more[16];
	} big;
	enum gdr_backend be;

	(void)state;
	c = make(&a);
	assert_int_equal(gdr_cache_get_settings(NULL, &big.s, sizeof(big.s)), -EINVAL);
	assert_int_equal(gdr_cache_get_settings(c, NULL, sizeof(big.s)), -EINVAL);
	assert_int_equal(gdr_cache_get_settings(c, &big.s, sizeof(big.s) - 1), -EINVAL);

	memset(&big, 0xa5, sizeof(big));
	assert_int_equal(gdr_cache_get_settings(c, &big.s, sizeof(big.s) + 8), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal((unsigned char)big.more[i], 0);      /* zeros up to the size given */
	assert_int_equal((unsigned char)big.more[8], 0xa5);           /* nothing past it */

	assert_int_equal(big.s.max_bytes, 64 * MiB);
	assert_int_equal(big.s.max_bytes_from, GDR_SETTING_ATTR);
	assert_int_equal(big.s.max_pin_bytes, ENV_PIN_BYTES);
	assert_int_equal(big.s.max_pin_bytes_from, GDR_SETTING_ENV);
	/* not set: the fixed default, or derived from the fake GPUs (limits_why says which) */
	assert_true(big.s.max_entries_from == GDR_SETTING_DEFAULT ||
		    big.s.max_entries_from == GDR_SETTING_DEVICES);
	assert_true(big.s.max_entries >= 4096);
	assert_non_null(memchr(big.s.limits_why, '\0', sizeof(big.s.limits_why)));
	assert_true(strcmp(big.s.limits_why, "fixed defaults") == 0 ||
		    strncmp(big.s.limits_why, "from the devices (", 18) == 0);
	if (big.s.max_entries_from == GDR_SETTING_DEVICES)
		assert_int_equal(strncmp(big.s.limits_why, "from the devices (", 18), 0);
	/* AUTO resolved, and the same as the statistics and gdr_cache_backend say */
	assert_int_equal(big.s.validate_from, GDR_SETTING_ATTR);
	assert_int_not_equal(big.s.validate, GDR_VALIDATE_AUTO);
	assert_int_equal(gdr_cache_get_stats(c, &st), 0);
	assert_int_equal(big.s.validate, st.validate_mode);
	assert_int_equal(big.s.backend_from, GDR_SETTING_DEFAULT);
	assert_int_equal(gdr_cache_backend(c, &be), 0);
	assert_int_equal(big.s.backend, be);
	assert_int_equal(big.s.reserved, 0);
	assert_int_equal(gdr_cache_destroy(c), 0);

	/* the attribute over the environment */
	a = (struct gdr_cache_attr){ .field_mask = GDR_CACHE_ATTR_MAX_PIN_BYTES,
				     .max_pin_bytes = 3 * MiB };
	c = make(&a);
	assert_int_equal(gdr_cache_get_settings(c, &big.s, sizeof(big.s)), 0);
	assert_int_equal(big.s.max_pin_bytes, 3 * MiB);
	assert_int_equal(big.s.max_pin_bytes_from, GDR_SETTING_ATTR);
	assert_int_equal(big.s.validate_from, GDR_SETTING_DEFAULT);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

/* A zeroed attribute with the validate bit asks for AUTO, as a zeroed backend does. */
static void test_zero_is_auto(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE |
				    GDR_CACHE_ATTR_BACKEND };
	struct gdr_cache *c;
	struct gdr_cache_settings s;

	(void)state;
	c = make(&a);
	assert_int_equal(gdr_cache_get_settings(c, &s, sizeof(s)), 0);
	assert_true(s.validate == GDR_VALIDATE_TAG || s.validate == GDR_VALIDATE_EVENTS);
	assert_int_equal(gdr_cache_destroy(c), 0);
	a.validate = GDR_VALIDATE_EVENTS + 1;
	assert_int_equal(gdr_cache_create(&a, &c), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_set_log_level),
		cmocka_unit_test(test_stats_ex_sizes),
		cmocka_unit_test(test_settings),
		cmocka_unit_test(test_zero_is_auto),
	};

	setenv("GDRCACHE_MAX_PIN_BYTES", "8M", 1); /* read once, at the first call that needs it */
	fake_verbs_install();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
