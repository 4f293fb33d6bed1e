/* SPDX-License-Identifier: MIT */
/*
 * A program built against 0.1 still works (lib/cache/compat-0_1.c): this one binds
 * gdr_cache_create@GDRCACHE_0.1 and gdr_cache_get_stats@GDRCACHE_0.1 explicitly, as the linker did
 * for 0.1's programs, and passes what they passed: 0.1's struct gdr_cache_attr (a log level, bit
 * 1 << 5), 0.1's enum gdr_validate (TAG 0, EVENTS 1, AUTO 2), and 0.1's statistics buffer, after
 * which a canary must stay untouched. Linked against libgdrcache.so itself; no CUDA driver
 * (GDRCACHE_LIBCUDA names none): mode events is then granted when asked and AUTO resolves to tag.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <gdrcache.h>

/* ---- 0.1's declarations, as its header had them ---- */
struct gdr_cache_attr_0_1 {
	uint64_t field_mask;
	uint64_t max_bytes;
	uint64_t max_entries;
	uint64_t max_pin_bytes;
	int32_t backend;
	int32_t validate;
	int32_t log_level;
	uint32_t reserved;
};
#define V01_ATTR_MAX_ENTRIES (1u << 1)
#define V01_ATTR_VALIDATE (1u << 4)
#define V01_ATTR_LOG_LEVEL (1u << 5)
enum { V01_VALIDATE_TAG = 0, V01_VALIDATE_EVENTS = 1, V01_VALIDATE_AUTO = 2 };
#define V01_STATS_WORDS 27   /* hits .. fast_hits */
#define V01_VALIDATE_MODE 23 /* validate_mode: the 24th counter */

int create_0_1(const struct gdr_cache_attr_0_1 *attr, struct gdr_cache **cache);
int get_stats_0_1(struct gdr_cache *cache, uint64_t *stats);
__asm__(".symver create_0_1, gdr_cache_create@GDRCACHE_0.1");
__asm__(".symver get_stats_0_1, gdr_cache_get_stats@GDRCACHE_0.1");

#define CANARY 0x5ca1ab1e5ca1ab1eULL

/* 0.1's statistics buffer with a canary after it. */
struct stats_0_1 {
	uint64_t s[V01_STATS_WORDS];
	uint64_t canary[8];
};

static uint64_t mode_0_1(struct gdr_cache *c)
{
	struct stats_0_1 b;

	for (unsigned i = 0; i < 8; i++)
		b.canary[i] = CANARY;
	memset(b.s, 0xff, sizeof(b.s));
	assert_int_equal(get_stats_0_1(c, b.s), 0);
	for (unsigned i = 0; i < 8; i++)
		assert_int_equal(b.canary[i], CANARY); /* not a byte past 0.1's struct */
	assert_int_equal(b.s[0], 0);                    /* hits: written */
	return b.s[V01_VALIDATE_MODE];
}

static void test_both_versions_exported(void **state)
{
	(void)state;
	assert_non_null(dlvsym(RTLD_DEFAULT, "gdr_cache_create", "GDRCACHE_0.1"));
	assert_non_null(dlvsym(RTLD_DEFAULT, "gdr_cache_create", "GDRCACHE_0.2"));
	assert_ptr_not_equal(dlvsym(RTLD_DEFAULT, "gdr_cache_create", "GDRCACHE_0.1"),
			     dlvsym(RTLD_DEFAULT, "gdr_cache_create", "GDRCACHE_0.2"));
	assert_ptr_not_equal(dlvsym(RTLD_DEFAULT, "gdr_cache_get_stats", "GDRCACHE_0.1"),
			     dlvsym(RTLD_DEFAULT, "gdr_cache_get_stats", "GDRCACHE_0.2"));
	/* an unversioned lookup (dlsym, ctypes) gets the newest */
	assert_ptr_equal(dlsym(RTLD_DEFAULT, "gdr_cache_create"),
			 dlvsym(RTLD_DEFAULT, "gdr_cache_create", "GDRCACHE_0.2"));
}

/* 0.1's numbers are translated both ways. */
static void test_validate_values_0_1(void **state)
{
	struct gdr_cache_attr_0_1 a = { .field_mask = V01_ATTR_VALIDATE };
	struct gdr_cache *c;
	struct gdr_cache_settings set;

	(void)state;
	a.validate = V01_VALIDATE_TAG; /* 0: tag in 0.1, auto in 0.2 */
	assert_int_equal(create_0_1(&a, &c), 0);
	assert_int_equal(mode_0_1(c), V01_VALIDATE_TAG);
	assert_int_equal(gdr_cache_get_settings(c, &set, sizeof(set)), 0);
	assert_int_equal(set.validate, GDR_VALIDATE_TAG);
	assert_int_equal(set.validate_from, GDR_SETTING_ATTR);
	assert_int_equal(gdr_cache_destroy(c), 0);

	a.validate = V01_VALIDATE_EVENTS; /* 1: events in 0.1, tag in 0.2 */
	assert_int_equal(create_0_1(&a, &c), 0);
	assert_int_equal(mode_0_1(c), V01_VALIDATE_EVENTS);
	assert_int_equal(gdr_cache_get_settings(c, &set, sizeof(set)), 0);
	assert_int_equal(set.validate, GDR_VALIDATE_EVENTS);
	assert_int_equal(gdr_cache_destroy(c), 0);

	a.validate = V01_VALIDATE_AUTO; /* 2: auto in 0.1 (tag here), events in 0.2 */
	assert_int_equal(create_0_1(&a, &c), 0);
	assert_int_equal(mode_0_1(c), V01_VALIDATE_TAG);
	assert_int_equal(gdr_cache_destroy(c), 0);

	a.validate = 3;
	c = (struct gdr_cache *)1;
	assert_int_equal(create_0_1(&a, &c), -EINVAL);
	assert_null(c);
	assert_int_equal(create_0_1(NULL, &c), 0); /* no attributes */
	assert_int_equal(mode_0_1(c), V01_VALIDATE_TAG);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

/* 0.1's log level: accepted, set for the whole process once the attributes are. */
static void test_log_level_0_1(void **state)
{
	struct gdr_cache_attr_0_1 a = { .field_mask = V01_ATTR_LOG_LEVEL | V01_ATTR_MAX_ENTRIES,
					.max_entries = 100, .log_level = GDR_LOG_NONE };
	struct gdr_cache *c;
	struct gdr_cache_settings set;

	(void)state;
	assert_int_equal(gdr_set_log_level(GDR_LOG_ERROR), GDR_LOG_ERROR);
	assert_int_equal(create_0_1(&a, &c), 0);
	assert_int_equal(gdr_set_log_level(GDR_LOG_ERROR), GDR_LOG_NONE);
	assert_int_equal(gdr_cache_get_settings(c, &set, sizeof(set)), 0);
	assert_int_equal(set.max_entries, 100);
	assert_int_equal(mode_0_1(c), V01_VALIDATE_TAG);
	assert_int_equal(gdr_cache_destroy(c), 0);

	/* refused: an unknown level, or other attributes refused (the level then stays) */
	a.log_level = GDR_LOG_DEBUG + 1;
	c = (struct gdr_cache *)1;
	assert_int_equal(create_0_1(&a, &c), -EINVAL);
	assert_null(c);
	a.log_level = GDR_LOG_NONE;
	a.max_entries = 0;
	assert_int_equal(create_0_1(&a, &c), -EINVAL);
	assert_int_equal(gdr_set_log_level(GDR_LOG_ERROR), GDR_LOG_ERROR);

	/* a level without its bit: ignored, as 0.1 ignored it */
	a = (struct gdr_cache_attr_0_1){ .log_level = GDR_LOG_DEBUG };
	assert_int_equal(create_0_1(&a, &c), 0);
	assert_int_equal(gdr_set_log_level(GDR_LOG_ERROR), GDR_LOG_ERROR);
	assert_int_equal(gdr_cache_destroy(c), 0);

	/* what 0.2's gdr_cache_create refuses */
	assert_int_equal(gdr_cache_create((const struct gdr_cache_attr *)&(struct gdr_cache_attr_0_1){
		.field_mask = V01_ATTR_LOG_LEVEL }, &c), -EINVAL);
}

/* The newest gdr_cache_get_stats writes 0.1's fields too, never more; _ex the rest. */
static void test_stats_0_2(void **state)
{
	struct gdr_cache *c;
	struct {
		struct gdr_cache_stats s;
		uint64_t canary;
	} b;

	(void)state;
	assert_int_equal(gdr_cache_create(NULL, &c), 0);
	memset(&b, 0xee, sizeof(b));
	assert_int_equal(gdr_cache_get_stats(c, &b.s), 0);
	assert_int_equal(b.s.validate_mode, GDR_VALIDATE_TAG);
	assert_int_equal(b.s.exact_mrs, 0xeeeeeeeeeeeeeeeeULL);
	assert_int_equal(gdr_cache_get_stats_ex(c, &b.s, sizeof(b.s)), 0);
	assert_int_equal(b.s.exact_mrs, 0);
	assert_int_equal(b.canary, 0xeeeeeeeeeeeeeeeeULL);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_both_versions_exported),
		cmocka_unit_test(test_validate_values_0_1),
		cmocka_unit_test(test_log_level_0_1),
		cmocka_unit_test(test_stats_0_2),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
