/* SPDX-License-Identifier: MIT */
/*
 * The 128-byte entry (tags in tag0 up to one, an array from two), free events against
 * multi-tag entries, and pins never lost track of. Fake CUDA driver, dmabuf backend; each case in
 * mode events (frees through the patched driver entry points) and, where it says so, mode tag:
 *  - an entry that grows to many tags (allocations sharing one 64 KiB page / one pool chunk) keeps
 *    every tag right through the growth 1 -> 2 -> 4 -> ... -> 16 and beyond; a free of one of them
 *    retires the entry before the next gdr_reg; the reallocated VA gets its own id;
 *  - VMM: an entry spanning two mappings of one reservation; one unmapped while the entry is held;
 *    an unmap of several mappings retires every entry it touches;
 *  - a large allocation pinned only around the request: its free (named by its base, outside the
 *    pin) retires the entry;
 *  - gdr_cache_destroy refuses while a hold is out, and unpins everything once it is given back.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "cuda/cuda_abi.h"
#include "intercept/events.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "fixture.h"

#define KiB 1024ULL
#define MiB (1024ULL * 1024)

/* The fake's exported entries (patched by the library when it loads the driver). */
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);
gdr_CUresult cuMemFreeAsync(gdr_CUdeviceptr p, void *stream);
gdr_CUresult cuMemUnmap(gdr_CUdeviceptr p, size_t n);
gdr_CUresult cuMemAlloc_v2(gdr_CUdeviceptr *p, size_t n);

static struct gdr_cache *cache;

static struct gdr_cache *make(int validate, uint64_t max_bytes)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE,
				    .backend = GDR_BACKEND_DMABUF,
				    .validate = validate };
	struct gdr_cache *c = NULL;

	if (max_bytes) {
		a.field_mask |= GDR_CACHE_ATTR_MAX_BYTES;
		a.max_bytes = max_bytes;
	}
	assert_int_equal(gdr_cache_create(&a, &c), 0);
	return c;
}

static int setup_events(void **state)
{
	(void)state;
	fake_cuda_reset();
	cache = make(GDR_VALIDATE_EVENTS, 0);
	return 0;
}

static int setup_tag(void **state)
{
	(void)state;
	fake_cuda_reset();
	cache = make(GDR_VALIDATE_TAG, 0);
	return 0;
}

static int setup_events_small(void **state)
{
	(void)state;
	fake_cuda_reset();
	cache = make(GDR_VALIDATE_EVENTS, 64 * MiB); /* 1/32: 2 MiB pinned whole at most */
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

static struct gdr_region *reg(uint64_t a, size_t n)
{
	struct gdr_region *r = NULL;

	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, n, 0, &r), 0);
	return r;
}

static uint64_t id_of(struct gdr_region *r)
{
	uint64_t id = 0;

	assert_int_equal(gdr_region_buffer_id(r, &id), 0);
	return id;
}

/* Register [a, a+n), check it is served as the allocation now there, release it. */
static void reg_check(uint64_t a, size_t n)
{
	struct gdr_region *r = reg(a, n);

	assert_true(fake_cuda_buffer_id(a) != 0);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(a));
	assert_int_equal(gdr_dereg(r), 0);
}

static uint64_t dev_alloc(size_t n)
{
	gdr_CUdeviceptr p = 0;

	assert_int_equal(cuMemAlloc_v2(&p, n), GDR_CUDA_SUCCESS);
	return p;
}

/* ---- many tags in one entry ---------------------------------------------------------------------- */

#define NSMALL 16
static void many_small_then_free(bool events)
{
	uint64_t v[NSMALL], misses, again;

	for (int i = 0; i < NSMALL; i++)
		v[i] = dev_alloc(4 * KiB);
	for (int i = 1; i < NSMALL; i++)
		assert_int_equal(v[i], v[i - 1] + 4 * KiB); /* adjacent: one 64 KiB page */
	assert_int_equal(v[0] % (64 * KiB), 0);
	/* In a scrambled order: every insertion place in the sorted tags, growth at 1, 2, 4, 8. */
	for (int k = 0; k < NSMALL; k++)
		reg_check(v[(k * 7 + 3) % NSMALL], 4 * KiB);
	assert_int_equal(stats().entries, 1);
	misses = stats().misses;
	for (int i = 0; i < NSMALL; i++) /* all served by the one entry, each as itself */
		reg_check(v[i], 4 * KiB);
	assert_int_equal(stats().misses, misses);
	/* One allocation in the middle goes: the entry is retired (events), or found stale on use. */
	assert_int_equal(cuMemFree_v2(v[9]), GDR_CUDA_SUCCESS);
	if (events)
		assert_int_equal(stats().entries, 0);
	again = dev_alloc(4 * KiB);
	assert_int_equal(again, v[9]); /* the VA comes back, with a new id */
	v[9] = again;
	for (int k = 0; k < NSMALL; k++)
		reg_check(v[(k * 5 + 1) % NSMALL], 4 * KiB);
	/* A range spanning several of them. */
	{
		struct gdr_region *r = reg(v[3] + 100, 5 * 4 * KiB);

		assert_int_equal(id_of(r), fake_cuda_buffer_id(v[3]));
		assert_int_equal(gdr_dereg(r), 0);
	}
	for (int i = 0; i < NSMALL; i++)
		assert_int_equal(cuMemFree_v2(v[i]), GDR_CUDA_SUCCESS);
	if (events)
		assert_int_equal(stats().entries, 0);
}

static void test_many_tags_events(void **state)
{
	(void)state;
	many_small_then_free(true);
}

static void test_many_tags_tag(void **state)
{
	(void)state;
	many_small_then_free(false);
}

/* Pool memory: 40 allocations of one 32 MiB chunk share its pin; the tags array grows to 64. */
static void test_pool_chunk_many_tags(void **state)
{
	enum { N = 40 };
	uint64_t v[N], c;
	struct gdr_region *held;

	(void)state;
	for (int i = 0; i < N; i++)
		v[i] = fake_cuda_alloc_async(64 * KiB);
	for (int i = N; i-- > 0;)
		reg_check(v[i] + 512, 512);
	assert_int_equal(stats().entries, 1);
	held = reg(v[20], 64 * KiB); /* held across the free of another tagged allocation */
	assert_int_equal(cuMemFreeAsync(v[33], NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 1); /* detached: pinned until held is given back */
	assert_int_equal(stats().detached, 1);
	c = fake_cuda_alloc_async(64 * KiB);
	reg_check(c, 64 * KiB);
	reg_check(v[20], 64 * KiB);
	assert_int_equal(gdr_dereg(held), 0);
	assert_int_equal(stats().detached, 0);
	for (int i = 0; i < N; i++)
		if (i != 33)
			assert_int_equal(cuMemFreeAsync(v[i], NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFreeAsync(c, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
}

/* ---- VMM ----------------------------------------------------------------------------------------- */

static void test_vmm_two_mappings_one_unmapped_held(void **state)
{
	uint64_t va = fake_cuda_vmm_reserve(8 * MiB);
	struct gdr_region *span, *r;
	uint64_t id0, id1;

	(void)state;
	assert_true(va != 0);
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_map(va + 2 * MiB, 2 * MiB), 0);
	id0 = fake_cuda_buffer_id(va);
	id1 = fake_cuda_buffer_id(va + 2 * MiB);
	assert_true(id0 && id1 && id0 != id1);
	span = reg(va + 2 * MiB - 4 * KiB, 8 * KiB); /* one entry, two tags */
	assert_int_equal(id_of(span), id0);
	reg_check(va + 2 * MiB + 4 * KiB, 4 * KiB);
	reg_check(va + 4 * KiB, 4 * KiB);
	/* the second mapping goes while the spanning registration is held */
	assert_int_equal(cuMemUnmap(va + 2 * MiB, 2 * MiB), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_vmm_map(va + 2 * MiB, 2 * MiB), 0);
	assert_true(fake_cuda_buffer_id(va + 2 * MiB) != id1);
	reg_check(va + 2 * MiB + 4 * KiB, 4 * KiB);
	reg_check(va + 4 * KiB, 4 * KiB);
	r = reg(va + 2 * MiB - 4 * KiB, 8 * KiB);
	assert_int_equal(id_of(r), id0);
	assert_true(r != span);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(cache), -EBUSY); /* span is still held */
	assert_int_equal(gdr_dereg(span), 0);
	assert_int_equal(cuMemUnmap(va, 4 * MiB), GDR_CUDA_SUCCESS); /* both at once */
	assert_int_equal(stats().entries, 0);
	assert_int_equal(stats().detached, 0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
	assert_int_equal(fake_cuda_vmm_free(va, 8 * MiB), 0);
}

static void test_vmm_unmap_spans_several_entries(void **state)
{
	uint64_t va = fake_cuda_vmm_reserve(8 * MiB), ids[4];

	(void)state;
	for (int i = 0; i < 4; i++) {
		assert_int_equal(fake_cuda_vmm_map(va + (uint64_t)i * 2 * MiB, 2 * MiB), 0);
		ids[i] = fake_cuda_buffer_id(va + (uint64_t)i * 2 * MiB);
	}
	for (int i = 0; i < 4; i++)
		reg_check(va + (uint64_t)i * 2 * MiB + 64 * KiB, 4 * KiB);
	assert_true(stats().entries >= 1);
	/* mappings 1 and 2 go in one call */
	assert_int_equal(cuMemUnmap(va + 2 * MiB, 4 * MiB), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_vmm_map(va + 2 * MiB, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_map(va + 4 * MiB, 2 * MiB), 0);
	assert_true(fake_cuda_buffer_id(va + 2 * MiB) != ids[1]);
	assert_true(fake_cuda_buffer_id(va + 4 * MiB) != ids[2]);
	for (int i = 0; i < 4; i++)
		reg_check(va + (uint64_t)i * 2 * MiB + 64 * KiB, 4 * KiB);
	assert_int_equal(cuMemUnmap(va, 8 * MiB), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
	assert_int_equal(fake_cuda_vmm_free(va, 8 * MiB), 0);
}

/* ---- a large allocation pinned around the request ------------------------------------------------ */

static void test_partial_pin_freed_by_base(void **state)
{
	uint64_t a = dev_alloc(16 * MiB), b, x;
	struct gdr_region *r;

	(void)state;
	x = a + 9 * MiB + 4 * KiB;
	r = reg(x, 4 * KiB);
	{
		uint64_t base = 0, len = 0;

		assert_int_equal(gdr_region_range(r, &base, &len), 0);
		assert_true(base > a); /* pinned around the request, not from the base */
	}
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
	b = dev_alloc(16 * MiB);
	assert_int_equal(b, a);
	reg_check(x, 4 * KiB);
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
}

/* Several partial pins of one allocation, the reach window shrinking in between. */
static void test_partial_pins_reach_recount(void **state)
{
	uint64_t a = dev_alloc(32 * MiB), s = dev_alloc(4 * KiB), b;

	(void)state;
	reg_check(s, 4 * KiB);
	reg_check(a + 30 * MiB, 4 * KiB); /* reaches 30 MiB back */
	reg_check(a + 2 * MiB, 4 * KiB);
	reg_check(a + 17 * MiB, 4 * KiB);
	assert_int_equal(cuMemFree_v2(s), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
	b = dev_alloc(32 * MiB);
	assert_int_equal(b, a);
	reg_check(a + 30 * MiB, 4 * KiB);
	reg_check(a + 2 * MiB, 4 * KiB);
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
}

/* ---- holds and destroy --------------------------------------------------------------------------- */

static void test_destroy_refuses_while_held(void **state)
{
	uint64_t a = dev_alloc(64 * KiB), b = dev_alloc(64 * KiB);
	struct gdr_region *r1, *r2;

	(void)state;
	r1 = reg(a, 4 * KiB);
	r2 = reg(b, 4 * KiB);
	assert_int_equal(cuMemFree_v2(b), GDR_CUDA_SUCCESS); /* r2's entry detached, held */
	assert_int_equal(gdr_cache_destroy(cache), -EBUSY);
	assert_int_equal(gdr_dereg(r1), 0);
	assert_int_equal(gdr_cache_destroy(cache), -EBUSY);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(gdr_dereg(r2), -EINVAL);
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = NULL;
	assert_int_equal(fake_cuda_open_dmabufs(), 0);
	assert_int_equal(cuMemFree_v2(a), GDR_CUDA_SUCCESS);
}

/* ---- limits, lost events, growth beside lock-free hits -------------------------------------------- */

static int setup_events_4(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE |
						  GDR_CACHE_ATTR_MAX_ENTRIES,
				    .backend = GDR_BACKEND_DMABUF,
				    .validate = GDR_VALIDATE_EVENTS,
				    .max_entries = 4 };

	(void)state;
	fake_cuda_reset();
	assert_int_equal(gdr_cache_create(&a, &cache), 0);
	return 0;
}

/* Multi-tag entries under an entry limit: never more than 4 unheld entries after a call. */
static void test_entry_limit_multi_tag(void **state)
{
	enum { N = 12, PER = 4 };
	uint64_t v[N][PER];

	(void)state;
	for (int i = 0; i < N; i++)
		for (int k = 0; k < PER; k++)
			v[i][k] = dev_alloc(k == 0 ? 2 * MiB : 4 * KiB); /* big: own chunks */
	for (int round = 0; round < 3; round++)
		for (int i = 0; i < N; i++) {
			reg_check(v[i][0], 4 * KiB);
			assert_true(stats().entries <= 4);
		}
	for (int i = 0; i < N; i++)
		for (int k = 0; k < PER; k++)
			assert_int_equal(cuMemFree_v2(v[i][k]), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
}

/* More events than the ring holds: every entry is dropped, a held one detached, nothing lost. */
static void test_events_lost_with_multi_tag_held(void **state)
{
	uint64_t v[4];
	struct gdr_region *held;

	(void)state;
	for (int i = 0; i < 4; i++)
		v[i] = dev_alloc(4 * KiB);
	for (int i = 0; i < 4; i++)
		reg_check(v[i], 4 * KiB);
	held = reg(v[2], 4 * KiB);
	assert_int_equal(stats().entries, 1);
	for (unsigned i = 0; i < GDR_EVENTS_RING + 8; i++)
		gdr_events_push(0x10, 0); /* nothing of ours, but too many to look at */
	reg_check(v[1], 4 * KiB);
	assert_true(stats().events_lost >= 1);
	assert_int_equal(stats().detached, 1);
	assert_int_equal(gdr_dereg(held), 0);
	assert_int_equal(stats().detached, 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(cuMemFree_v2(v[i]), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
}

/* One thread hits an entry lock-free while another grows its tags 1 -> 16 under the lock. */
static uint64_t grow_v[NSMALL];
static volatile int grow_stop;

static void *hitter(void *arg)
{
	uint64_t n = 0;

	(void)arg;
	while (!__atomic_load_n(&grow_stop, __ATOMIC_ACQUIRE)) {
		struct gdr_region *r = NULL;
		uint64_t id = 0;

		if (gdr_reg(cache, NULL, (void *)(uintptr_t)grow_v[0], 4 * KiB, 0, &r))
			abort();
		if (gdr_region_buffer_id(r, &id) || id != fake_cuda_buffer_id(grow_v[0]))
			abort();
		if (gdr_dereg(r))
			abort();
		n++;
	}
	return (void *)(uintptr_t)n;
}

static void test_growth_beside_hits(void **state)
{
	pthread_t th;

	(void)state;
	for (int round = 0; round < 20; round++) {
		void *n;

		for (int i = 0; i < NSMALL; i++)
			grow_v[i] = dev_alloc(4 * KiB);
		reg_check(grow_v[0], 4 * KiB);
		__atomic_store_n(&grow_stop, 0, __ATOMIC_RELEASE);
		assert_int_equal(pthread_create(&th, NULL, hitter, NULL), 0);
		for (int i = 1; i < NSMALL; i++)
			reg_check(grow_v[i], 4 * KiB);
		assert_int_equal(cuMemFree_v2(grow_v[NSMALL - 1]), GDR_CUDA_SUCCESS);
		grow_v[NSMALL - 1] = dev_alloc(4 * KiB);
		for (int i = 1; i < NSMALL; i++)
			reg_check(grow_v[i], 4 * KiB);
		__atomic_store_n(&grow_stop, 1, __ATOMIC_RELEASE);
		assert_int_equal(pthread_join(th, &n), 0);
		for (int i = 0; i < NSMALL; i++)
			assert_int_equal(cuMemFree_v2(grow_v[i]), GDR_CUDA_SUCCESS);
		assert_int_equal(stats().entries, 0);
	}
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_many_tags_events, setup_events, teardown),
		cmocka_unit_test_setup_teardown(test_many_tags_tag, setup_tag, teardown),
		cmocka_unit_test_setup_teardown(test_pool_chunk_many_tags, setup_events, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_two_mappings_one_unmapped_held,
						setup_events, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_unmap_spans_several_entries, setup_events,
						teardown),
		cmocka_unit_test_setup_teardown(test_partial_pin_freed_by_base, setup_events_small,
						teardown),
		cmocka_unit_test_setup_teardown(test_partial_pins_reach_recount, setup_events_small,
						teardown),
		cmocka_unit_test_setup_teardown(test_destroy_refuses_while_held, setup_events,
						teardown),
		cmocka_unit_test_setup_teardown(test_entry_limit_multi_tag, setup_events_4,
						teardown),
		cmocka_unit_test_setup_teardown(test_events_lost_with_multi_tag_held, setup_events,
						teardown),
		cmocka_unit_test_setup_teardown(test_growth_beside_hits, setup_events, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
