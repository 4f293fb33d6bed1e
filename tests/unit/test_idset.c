/* SPDX-License-Identifier: MIT */
/* The SYNC_MEMOPS set (lib/cache/idset.c) against a plain array: random puts, deletes and lookups,
 * through growth, deletions that shift runs back across the table's end, and the bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "cache/idset.h"

#define M 3000

static uint64_t ref_id[M];
static uint8_t ref_val[M];
static uint32_t ref_n;

static int ref_find(uint64_t id)
{
	for (uint32_t i = 0; i < ref_n; i++)
		if (ref_id[i] == id)
			return (int)i;
	return -1;
}

static void ref_del_at(int i)
{
	ref_id[i] = ref_id[--ref_n];
	ref_val[i] = ref_val[ref_n];
}

static uint64_t xs(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* Every id of the reference is found with its byte, and the set holds no other. */
static void check_same(const struct gdr_idset *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < ref_n; i++) {
		uint8_t v;

		assert_int_equal(gdr_idset_get(s, ref_id[i], &v), 1);
		assert_int_equal(v, ref_val[i]);
	}
	for (uint32_t i = 0; i < s->cap; i++)
		n += s->w[i] != 0;
	assert_int_equal(n, ref_n);
	assert_int_equal(s->n, ref_n);
}

/* ids from a small range, so that runs form and deletions shift them, wrapping the table */
static void run(uint64_t range, uint32_t max, uint64_t seed)
{
	struct gdr_idset s = { 0 };
	uint64_t x = seed;

	ref_n = 0;
	for (int op = 0; op < 200000; op++) {
		uint64_t r = xs(&x), id = r % range + 1;
		int i = ref_find(id);

		if (r >> 62 == 0) { /* delete */
			gdr_idset_del(&s, id);
			if (i >= 0)
				ref_del_at(i);
		} else if (r >> 62 == 1) { /* look up */
			uint8_t v;
			int in = gdr_idset_get(&s, id, &v);

			assert_int_equal(in, i >= 0);
			if (in)
				assert_int_equal(v, ref_val[i]);
		} else { /* put */
			uint8_t val = (uint8_t)(r >> 8);

			if (i < 0 && max && ref_n >= max) {
				/* the set forgets one id of its choice: find which */
				assert_int_equal(gdr_idset_put(&s, id, val, max), 0);
				for (uint32_t k = 0; k < ref_n; k++) {
					uint8_t v;

					if (!gdr_idset_get(&s, ref_id[k], &v)) {
						ref_del_at((int)k);
						break;
					}
				}
				assert_int_equal(ref_n, max - 1);
			} else {
				assert_int_equal(gdr_idset_put(&s, id, val, max), 0);
			}
			i = ref_find(id);
			if (i < 0) {
				ref_id[ref_n] = id;
				ref_val[ref_n++] = val;
			} else {
				ref_val[i] = val;
			}
		}
		if (op % 997 == 0)
			check_same(&s);
		if (max)
			assert_true(s.n <= max);
	}
	check_same(&s);
	assert_true(s.n * 4 <= s.cap * 3); /* at most 3/4 full */
	gdr_idset_free(&s);
}

static void test_matches_reference(void **state)
{
	(void)state;
	run(64, 0, 0x9e3779b97f4a7c15ULL);   /* dense: long runs, many shifts */
	run(2500, 0, 0x2545f4914f6cdd1dULL); /* sparse, growing to thousands */
}

static void test_bound_forgets_one_per_put(void **state)
{
	(void)state;
	run(5000, 100, 0x1234567887654321ULL);
}

/* Id 0, and an id too large for a slot's 56 bits, are never kept (the set is a memo); the
 * largest that fits is, with its byte, beside one that does not fit it by one bit. */
static void test_ids_not_kept(void **state)
{
	struct gdr_idset s = { 0 };
	uint8_t v = 0;

	(void)state;
	assert_int_equal(gdr_idset_get(&s, 0, &v), 0);
	assert_int_equal(gdr_idset_put(&s, 0, 7, 0), 0);
	assert_int_equal(gdr_idset_get(&s, 0, &v), 0);
	assert_int_equal(s.n, 0);
	gdr_idset_del(&s, 0);
	gdr_idset_del(&s, 5); /* empty, never allocated */
	assert_int_equal(gdr_idset_put(&s, GDR_IDSET_ID_MAX + 1, 9, 0), 0);
	assert_int_equal(gdr_idset_get(&s, GDR_IDSET_ID_MAX + 1, &v), 0);
	assert_int_equal(gdr_idset_put(&s, UINT64_MAX, 9, 0), 0);
	assert_int_equal(s.n, 0);
	assert_int_equal(gdr_idset_put(&s, GDR_IDSET_ID_MAX, 0xab, 0), 0);
	assert_int_equal(gdr_idset_put(&s, (GDR_IDSET_ID_MAX >> 1) + 1, 0xff, 0), 0);
	assert_int_equal(gdr_idset_get(&s, GDR_IDSET_ID_MAX, &v), 1);
	assert_int_equal(v, 0xab);
	assert_int_equal(gdr_idset_get(&s, (GDR_IDSET_ID_MAX >> 1) + 1, &v), 1);
	assert_int_equal(v, 0xff);
	assert_int_equal(gdr_idset_get(&s, GDR_IDSET_ID_MAX + 1, &v), 0);
	assert_int_equal(s.n, 2);
	gdr_idset_del(&s, GDR_IDSET_ID_MAX);
	assert_int_equal(gdr_idset_get(&s, GDR_IDSET_ID_MAX, &v), 0);
	assert_int_equal(s.n, 1);
	gdr_idset_free(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_matches_reference),
		cmocka_unit_test(test_bound_forgets_one_per_put),
		cmocka_unit_test(test_ids_not_kept),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
