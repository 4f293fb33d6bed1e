/* SPDX-License-Identifier: MIT */
/*
 * The unit tests' one fixture for a test's cache (include after cmocka.h and fakes.h): its
 * statistics, and its end, which proves that nothing the test pinned, registered or exported
 * through the fakes is left behind.
 */
#ifndef GDR_TEST_FIXTURE_H
#define GDR_TEST_FIXTURE_H

#include "gdrcache.h"
#include "fake_cuda.h"
#include "fakes.h"

/* c's statistics; the test fails if they cannot be read. */
static inline struct gdr_cache_stats fixture_stats(struct gdr_cache *c)
{
	struct gdr_cache_stats s;

	assert_int_equal(gdr_cache_get_stats(c, &s), 0);
	return s;
}

/* Destroys *c (when there is one) and sets it NULL; then nothing may be left: no pin, no page
 * pinned twice, no pin of memory CUDA does not back, no MR, no dma-buf open. */
static inline void fixture_end(struct gdr_cache **c)
{
	if (*c)
		assert_int_equal(gdr_cache_destroy(*c), 0);
	*c = NULL;
	assert_int_equal(fake_be.outstanding, 0);
	assert_int_equal(fake_be.double_pinned_now, 0);
	assert_int_equal(fake_be.bad_pins, 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	assert_int_equal(fake_cuda_open_dmabufs(), 0);
}

#endif /* GDR_TEST_FIXTURE_H */
