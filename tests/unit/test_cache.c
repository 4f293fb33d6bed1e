/* SPDX-License-Identifier: MIT */
/* The cache's behaviour against the fake CUDA driver and a fake pinning backend: hits, stale
 * detection on VA reuse, 64 KiB pages shared by small allocations, whole-allocation pinning and its
 * cap, LRU limits, eviction and retry on pin failure, NIC failures, classification, SYNC_MEMOPS. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <cmocka.h>

#include "fake_cuda.h"
#include "fakes.h"
#include "fixture.h"

#define MiB (1024ULL * 1024)
#define KiB 1024ULL

static struct gdr_cache *cache;

static struct gdr_cache *make(uint64_t mask, uint64_t max_bytes, uint64_t max_entries,
			      uint64_t max_pin)
{
	/* Mode tag: these tests free through the fake's control calls, which no hook sees (the
	 * interception is test_intercept's and tests/events'). */
	struct gdr_cache_attr a = { .field_mask = mask | GDR_CACHE_ATTR_VALIDATE,
				    .max_bytes = max_bytes,
				    .max_entries = max_entries,
				    .max_pin_bytes = max_pin,
				    .validate = GDR_VALIDATE_TAG };
	struct gdr_cache *c = NULL;

	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	return c;
}

static int setup(void **state)
{
	(void)state;
	fakes_reset();
	cache = make(0, 0, 0, 0);
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

static struct gdr_region *reg(uint64_t a, uint64_t len)
{
	struct gdr_region *r = NULL;

	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, len, 0, &r), 0);
	assert_non_null(r);
	return r;
}

static void check_region(struct gdr_region *r, uint64_t a, uint64_t len)
{
	uint64_t base, plen, id;

	assert_int_equal(gdr_region_range(r, &base, &plen), 0);
	assert_int_equal(base % (64 * KiB), 0);
	assert_int_equal(plen % (64 * KiB), 0);
	assert_true(base <= a && a + len <= base + plen);
	assert_int_equal(gdr_region_buffer_id(r, &id), 0);
	assert_int_equal(id, fake_cuda_buffer_id(a));
	/* The pin still maps the memory that is at these addresses now. */
	assert_true(fake_backend_pin_current(r, a, len));
}

static void test_hit_after_miss(void **state)
{
	uint64_t a = fake_cuda_alloc(1 * MiB);
	struct gdr_region *r;
	struct gdr_cache_stats s;

	(void)state;
	r = reg(a, 1 * MiB);
	check_region(r, a, 1 * MiB);
	assert_int_equal(gdr_dereg(r), 0);
	r = reg(a + 4096, 100); /* inside the pinned allocation */
	check_region(r, a + 4096, 100);
	assert_int_equal(gdr_dereg(r), 0);
	s = stats();
	assert_int_equal(s.misses, 1);
	assert_int_equal(s.hits, 1);
	assert_int_equal(s.pins, 1);
	assert_int_equal(s.entries, 1);
	assert_int_equal(s.pinned_bytes, 1 * MiB);
	assert_int_equal(s.tag_checks, 1);
	fake_cuda_free(a);
}

static void test_va_reuse_is_stale(void **state)
{
	uint64_t a = fake_cuda_alloc(4 * MiB), b, ida = fake_cuda_buffer_id(a);
	struct gdr_region *r = reg(a, 4 * MiB);

	(void)state;
	assert_int_equal(gdr_dereg(r), 0);
	fake_cuda_free(a);
	b = fake_cuda_alloc(4 * MiB);
	/* docs/FACTS.md, "Address reuse": */
	assert_int_equal(b, a);                    /* same VA ... */
	assert_true(fake_cuda_buffer_id(b) > ida); /* ... new, larger BUFFER_ID */
	r = reg(b, 4 * MiB);
	check_region(r, b, 4 * MiB);
	assert_int_equal(stats().stale, 1);
	assert_int_equal(stats().pins, 2);
	assert_int_equal(stats().unpins, 1);
	assert_int_equal(gdr_dereg(r), 0);
	fake_cuda_free(b);
}

static void test_freed_buffer_not_served(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r = reg(a, 2 * MiB);

	(void)state;
	assert_int_equal(gdr_dereg(r), 0);
	fake_cuda_free(a);
	/* Nothing is there now: CUDA does not know the address, so it is host memory, and host memory
	 * without a PD cannot be registered. The stale entry is gone. */
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), -EINVAL);
	assert_null(r);
	assert_int_equal(stats().stale, 1);
	assert_int_equal(fake_be.outstanding, 0);
}

static void test_held_stale_entry_detached(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), b;
	struct gdr_region *old = reg(a, 2 * MiB), *r;

	(void)state;
	fake_cuda_free(a); /* freed while a registration is still held: a caller bug, survived */
	b = fake_cuda_alloc(2 * MiB);
	assert_int_equal(a, b);
	r = reg(b, 2 * MiB);
	assert_ptr_not_equal(r, old);
	check_region(r, b, 2 * MiB);
	assert_int_equal(stats().entries, 2); /* the old one stays pinned until released */
	assert_int_equal(gdr_dereg(old), 0);
	assert_int_equal(stats().entries, 1);
	assert_int_equal(gdr_dereg(r), 0);
	fake_cuda_free(b);
}

static void test_small_allocations_share_a_page(void **state)
{
	uint64_t a1 = fake_cuda_alloc(4096), a2 = fake_cuda_alloc(4096);
	struct gdr_region *r1, *r2;
	uint64_t b1, l1, b2, l2;

	(void)state;
	assert_int_equal(a2, a1 + 4096); /* adjacent: docs/FACTS.md, "Small allocations" */
	r1 = reg(a1, 4096);
	r2 = reg(a2, 4096);
	check_region(r1, a1, 4096);
	check_region(r2, a2, 4096);
	gdr_region_range(r1, &b1, &l1);
	gdr_region_range(r2, &b2, &l2);
	assert_int_equal(b1, b2);          /* one pin serves both ... */
	assert_int_equal(stats().pins, 1); /* ... and the page is pinned once */
	assert_int_equal(fake_be.double_pinned_now, 0);
	assert_int_equal(gdr_dereg(r1), 0);
	assert_int_equal(gdr_dereg(r2), 0);

	/* a1 freed, a new small buffer at its VA: the entry can no longer be trusted. */
	fake_cuda_free(a1);
	a1 = fake_cuda_alloc(4096);
	r1 = reg(a1, 4096);
	check_region(r1, a1, 4096);
	assert_int_equal(stats().stale, 1);
	assert_int_equal(gdr_dereg(r1), 0);
	fake_cuda_free(a1);
	fake_cuda_free(a2);
}

static void test_cap_and_merge(void **state)
{
	uint64_t a;
	struct gdr_region *r1, *r2, *r3;
	uint64_t base, len;

	(void)state;
	gdr_cache_destroy(cache);
	cache = make(GDR_CACHE_ATTR_MAX_PIN_BYTES, 0, 0, 1 * MiB);
	a = fake_cuda_alloc(8 * MiB);
	/* Above the cap: only the aligned requested range is pinned. */
	r1 = reg(a + 100 * KiB, 8 * KiB);
	gdr_region_range(r1, &base, &len);
	assert_int_equal(base, a + 64 * KiB);
	assert_int_equal(len, 64 * KiB);
	r2 = reg(a + 1 * MiB, 64 * KiB);
	assert_int_equal(stats().pins, 2);
	/* A request spanning both takes them over into one pin: no page pinned twice by entries. */
	assert_int_equal(gdr_dereg(r1), 0);
	assert_int_equal(gdr_dereg(r2), 0);
	r3 = reg(a + 100 * KiB, 1 * MiB);
	check_region(r3, a + 100 * KiB, 1 * MiB);
	assert_int_equal(stats().overlap_merged, 2);
	assert_int_equal(stats().entries, 1);
	assert_int_equal(fake_be.outstanding, 1);
	assert_int_equal(gdr_dereg(r3), 0);
	fake_cuda_free(a);
}

static void test_lru_bytes_limit(void **state)
{
	uint64_t a[4];
	struct gdr_cache_stats s;

	(void)state;
	gdr_cache_destroy(cache);
	cache = make(GDR_CACHE_ATTR_MAX_BYTES, 4 * MiB, 0, 0);
	for (int i = 0; i < 4; i++) {
		a[i] = fake_cuda_alloc(2 * MiB);
		assert_int_equal(gdr_dereg(reg(a[i], 2 * MiB)), 0);
		assert_true(stats().pinned_bytes <= 4 * MiB);
	}
	s = stats();
	assert_int_equal(s.evictions, 2);
	assert_int_equal(s.entries, 2);
	/* The least recently used went first: a[0], a[1] are misses again, a[3] is a hit. */
	assert_int_equal(gdr_dereg(reg(a[3], 4096)), 0);
	assert_int_equal(stats().hits, 1);
	assert_int_equal(gdr_dereg(reg(a[0], 4096)), 0);
	assert_int_equal(stats().misses, 5);
	for (int i = 0; i < 4; i++)
		fake_cuda_free(a[i]);
}

static void test_lru_entries_limit_and_refs(void **state)
{
	uint64_t a[3];
	struct gdr_region *r[3];

	(void)state;
	gdr_cache_destroy(cache);
	cache = make(GDR_CACHE_ATTR_MAX_ENTRIES, 0, 1, 0);
	for (int i = 0; i < 3; i++) {
		a[i] = fake_cuda_alloc(2 * MiB);
		r[i] = reg(a[i], 2 * MiB);
	}
	/* Referenced entries are never evicted, whatever the limit. */
	assert_int_equal(stats().entries, 3);
	assert_int_equal(stats().evictions, 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(gdr_dereg(r[i]), 0);
	assert_int_equal(stats().entries, 1);
	assert_int_equal(stats().evictions, 2);
	for (int i = 0; i < 3; i++)
		fake_cuda_free(a[i]);
}

static void test_pin_enomem_evicts_and_retries(void **state)
{
	uint64_t a[3];
	struct gdr_region *r;

	(void)state;
	fake_be.enomem_after = 2; /* BAR space for two pins */
	for (int i = 0; i < 3; i++) {
		a[i] = fake_cuda_alloc(2 * MiB);
		assert_int_equal(gdr_dereg(reg(a[i], 2 * MiB)), 0);
	}
	assert_int_equal(stats().fail_pin_retried, 1);
	assert_int_equal(stats().evictions, 1);
	assert_int_equal(fake_be.outstanding, 2);

	/* With everything referenced there is nothing to evict: the error reaches the caller. */
	gdr_cache_flush(cache);
	struct gdr_region *h0 = reg(a[0], 4096), *h1 = reg(a[1], 4096);

	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a[2], 4096, 0, &r), -ENOMEM);
	assert_null(r);
	assert_int_equal(stats().fail_pin, 1);
	assert_int_equal(gdr_dereg(h0), 0);
	assert_int_equal(gdr_dereg(h1), 0);

	/* -ENOSPC is treated alike. */
	fake_be.enomem_after = 0;
	fake_be.bar_bytes = 4 * MiB;
	assert_int_equal(gdr_dereg(reg(a[2], 4096)), 0);
	assert_int_equal(fake_be.outstanding_bytes <= 4 * MiB, 1);
	for (int i = 0; i < 3; i++)
		fake_cuda_free(a[i]);
}

static void test_pin_other_error_fails(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;

	(void)state;
	fake_be.fail_next_rc = -EIO;
	fake_be.fail_next_n = 1;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), -EIO);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0); /* and works next time */
	fake_cuda_free(a);
}

static void test_nic_registration(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r, *r2, *r3;
	struct ibv_mr *mr, *mr2;
	uint32_t lkey, rkey;

	(void)state;
	fake_verbs.fail_next_errno = EFAULT;
	fake_verbs.fail_next_n = 1;
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)a, 4096, 1, &r), -EFAULT);
	assert_int_equal(stats().fail_mr, 1);
	assert_int_equal(stats().entries, 1); /* the pin is good and kept */

	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)a, 4096, 1, &r), 0);
	assert_int_equal(stats().pins, 1);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_non_null(mr);
	assert_int_equal(gdr_region_keys(r, &lkey, &rkey), 0);
	assert_int_equal(lkey, mr->lkey);
	assert_int_equal(rkey, mr->rkey);
	/* Same PD and access: the same MR; another PD: another MR on the same pin. */
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 64, 1, &r2), 0);
	assert_int_equal(gdr_region_mr(r2, &mr2), 0);
	assert_ptr_equal(mr, mr2);
	assert_int_equal(gdr_reg(cache, FAKE_PD2, (void *)(uintptr_t)a, 4096, 1, &r3), 0);
	assert_int_equal(gdr_region_mr(r3, &mr2), 0);
	assert_ptr_not_equal(mr, mr2);
	assert_int_equal(fake_verbs.outstanding, 2);
	assert_int_equal(stats().pins, 1);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(gdr_dereg(r3), 0);
	/* Eviction deregisters the MRs with the pin. */
	assert_int_equal(gdr_cache_flush(cache), 1);
	assert_int_equal(fake_verbs.outstanding, 0);
	fake_cuda_free(a);
}

static void test_managed_refused(void **state)
{
	uint64_t a = fake_cuda_alloc_managed(1 * MiB);
	struct gdr_region *r;

	(void)state;
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)a, 4096, 0, &r), -EOPNOTSUPP);
	assert_null(r);
	assert_int_equal(stats().refused_managed, 1);
	assert_int_equal(fake_be.pins, 0);
	fake_cuda_free(a);
}

static void test_host_passthrough(void **state)
{
	char *buf = malloc(8192);
	void *pinned = fake_cuda_alloc_host(8192);
	struct gdr_region *r, *r2;
	enum gdr_mem_kind kind;
	struct ibv_mr *mr;

	(void)state;
	assert_int_equal(gdr_reg(cache, FAKE_PD, buf, 8192, 1, &r), 0);
	assert_int_equal(gdr_region_mem_kind(r, &kind), 0);
	assert_int_equal(kind, GDR_MEM_HOST);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_ptr_equal(mr->addr, buf);
	assert_int_equal(gdr_reg(cache, FAKE_PD, pinned, 8192, 1, &r2), 0); /* cuMemAllocHost */
	assert_int_equal(stats().passthrough, 2);
	assert_int_equal(fake_be.pins, 0); /* host memory is not cached */
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_reg(cache, NULL, buf, 8192, 1, &r), -EINVAL); /* nothing to make */
	assert_int_equal(gdr_dereg(r2), 0);
	/* held host registrations keep the cache alive */
	struct gdr_region *r3;
	assert_int_equal(gdr_reg(cache, FAKE_PD, buf, 8192, 1, &r3), 0);
	assert_int_equal(gdr_cache_destroy(cache), -EBUSY);
	assert_int_equal(gdr_dereg(r3), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	fake_cuda_free_host(pinned);
	free(buf);
}

/* GDR_REG_CACHED_ONLY (the preload's hit): a miss fails with -ENOENT having pinned, registered and
 * asked the driver nothing; a hit serves the cached registration; host memory, even while a
 * pass-through registration of it is held, is never served (what it serves is GPU memory, which
 * the preload takes on trust without asking the region's kind). */
static void test_cached_only(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), calls;
	char *buf = malloc(8192);
	void *pinned = fake_cuda_alloc_host(8192);
	struct gdr_region *r, *held, *h, *hp;
	enum gdr_mem_kind kind = GDR_MEM_HOST;
	struct ibv_mr *mr, *mr2;
	const int only = 1 | GDR_REG_CACHED_ONLY;

	(void)state;
	calls = fake_cuda_calls_total();
	r = (struct gdr_region *)1;
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)a, 4096, only, &r), -ENOENT);
	assert_null(r);
	assert_int_equal(fake_cuda_calls_total(), calls);
	assert_int_equal(fake_be.pins, 0);
	assert_int_equal(fake_verbs.regs, 0);
	assert_int_equal(stats().misses, 0);
	/* cached by a plain registration, then served */
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)a, 4096, 1, &held), 0);
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096, only, &r), 0);
	assert_int_equal(gdr_region_mem_kind(r, &kind), 0);
	assert_int_equal(kind, GDR_MEM_DEVICE);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_int_equal(gdr_region_mr(held, &mr2), 0);
	assert_non_null(mr);
	assert_ptr_equal(mr, mr2);
	assert_int_equal(fake_be.pins, 1);
	assert_int_equal(gdr_dereg(r), 0);
	/* another pd: not cached for it */
	assert_int_equal(gdr_reg(cache, FAKE_PD2, (void *)(uintptr_t)a, 4096, only, &r), -ENOENT);
	assert_int_equal(fake_verbs.regs, 1);
	/* host memory: registered through while held, never served from the cache */
	assert_int_equal(gdr_reg(cache, FAKE_PD, buf, 8192, 1, &h), 0);
	assert_int_equal(gdr_reg(cache, FAKE_PD, pinned, 8192, 1, &hp), 0);
	assert_int_equal(stats().passthrough, 2);
	assert_int_equal(gdr_reg(cache, FAKE_PD, buf, 4096, only, &r), -ENOENT);
	assert_int_equal(gdr_reg(cache, FAKE_PD, pinned, 4096, only, &r), -ENOENT);
	assert_null(r);
	assert_int_equal(stats().passthrough, 2);
	assert_int_equal(gdr_dereg(h), 0);
	assert_int_equal(gdr_dereg(hp), 0);
	assert_int_equal(gdr_dereg(held), 0);
	fake_cuda_free_host(pinned);
	free(buf);
	fake_cuda_free(a);
}

static void test_sync_memops_once_per_allocation(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB), p = fake_cuda_alloc_async(1 * MiB);

	(void)state;
	for (int i = 0; i < 3; i++) {
		assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
		assert_int_equal(gdr_dereg(reg(p, 4096)), 0);
	}
	gdr_cache_flush(cache); /* even after eviction and a new pin ... */
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(fake_cuda_sync_memops_count(a), 1); /* ... set once */
	assert_int_equal(fake_cuda_sync_memops_count(p), 1);
	assert_int_equal(stats().sync_memops_set, 2);
	fake_cuda_free(a);
	fake_cuda_free_async(p);
}

static void test_vmm(void **state)
{
	uint64_t va = fake_cuda_vmm_reserve(8 * MiB), id1;
	struct gdr_region *r;
	enum gdr_mem_kind kind;

	(void)state;
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_map(va + 2 * MiB, 2 * MiB), 0);
	r = reg(va, 2 * MiB);
	assert_int_equal(gdr_region_mem_kind(r, &kind), 0);
	assert_int_equal(kind, GDR_MEM_VMM); /* device memory, not mistaken for host memory */
	check_region(r, va, 2 * MiB);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(stats().sync_memops_ctx, 1);
	assert_int_equal(fake_cuda_ctx_sync_memops_set_count(), 1);

	/* A request over two mappings: one registration, both allocations tracked. */
	r = reg(va + 2 * MiB - 4096, 8192);
	check_region(r, va + 2 * MiB - 4096, 8192);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_cuda_ctx_sync_memops_set_count(), 1); /* once per context */

	/* Unmap and remap at the same VA: a new id, detected. */
	id1 = fake_cuda_buffer_id(va);
	assert_int_equal(fake_cuda_vmm_unmap(va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	assert_true(fake_cuda_buffer_id(va) > id1);
	r = reg(va, 4096);
	check_region(r, va, 4096);
	assert_true(stats().stale >= 1);
	assert_int_equal(gdr_dereg(r), 0);
	gdr_cache_flush(cache);
	fake_cuda_vmm_unmap(va, 4 * MiB);
	fake_cuda_vmm_free(va, 8 * MiB);
}

static void *reg_vmm_thread(void *arg)
{
	struct gdr_region *r;
	uint64_t va = *(uint64_t *)arg;

	if (gdr_reg(cache, NULL, (void *)(uintptr_t)va, 4096, 0, &r) == 0)
		gdr_dereg(r);
	return NULL;
}

/* An MPI progress thread has no current context: the context-wide SYNC_MEMOPS for VMM memory is
 * still set, on the device's primary context. */
static void test_vmm_from_thread_without_context(void **state)
{
	uint64_t va = fake_cuda_vmm_reserve(2 * MiB);
	pthread_t th;

	(void)state;
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	fake_cuda_set_threads_have_context(false);
	pthread_create(&th, NULL, reg_vmm_thread, &va);
	pthread_join(th, NULL);
	fake_cuda_set_threads_have_context(true);
	assert_int_equal(stats().misses, 1);
	/* Without a context to borrow this would count as unavailable (-ENXIO). The flag itself may
	 * have been set by an earlier test of this process: the library sets it once per context. */
	assert_int_equal(stats().sync_memops_unavailable, 0);
	gdr_cache_flush(cache);
	fake_cuda_vmm_unmap(va, 2 * MiB);
	fake_cuda_vmm_free(va, 2 * MiB);
}

static void test_mixed_range_refused(void **state)
{
	uint64_t va = fake_cuda_vmm_reserve(8 * MiB);
	struct gdr_region *r;

	(void)state;
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	/* The second half is reserved but unmapped: not GPU memory. */
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(va + 1 * MiB), 2 * MiB, 0, &r),
			 -EINVAL);
	assert_int_equal(fake_be.pins, 0);
	fake_cuda_vmm_unmap(va, 2 * MiB);
	fake_cuda_vmm_free(va, 8 * MiB);
}

static void test_cuda_query_failure(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;

	(void)state;
	fake_cuda_fail_next("cuPointerGetAttributes", 999, 1);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), -EIO);
	assert_int_equal(stats().fail_cuda, 1);
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	/* A failing tag check means "cannot prove valid": the entry is re-pinned, never trusted. */
	fake_cuda_fail_next("cuPointerGetAttribute", 999, 1);
	r = reg(a, 4096);
	check_region(r, a, 4096);
	assert_int_equal(stats().stale, 1);
	assert_int_equal(gdr_dereg(r), 0);
	fake_cuda_free(a);
}

/* Issue 10 item 16: a registration that grants remote access gets an MR (so an rkey) bounded by
 * what it asked for, not the whole pinned range; repeated, the same range is a cache hit on the
 * same MR; local access and GDR_ACCESS_WIDE_MR share the pin-wide MR; an entry keeps at most
 * GDR_EXACT_PER_ENTRY remote ranges, then is replaced (held ones stay valid until released). */
#define REMOTE (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
static void mr_bounds(struct gdr_region *r, uint64_t *base, uint64_t *len)
{
	struct ibv_mr *mr = NULL;

	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_non_null(mr);
	*base = (uintptr_t)mr->addr;
	*len = mr->length;
}

static void test_remote_access_mr_is_exact(void **state)
{
	uint64_t a = fake_cuda_alloc(1 * MiB), base, len, regs0;
	struct gdr_region *r, *r2, *w, *l, *held;
	uint32_t lk, lk2;

	(void)state;
	/* remote access: exactly [a + 8192, +4096) */
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096, REMOTE, &r),
			 0);
	mr_bounds(r, &base, &len);
	assert_int_equal(base, a + 8192);
	assert_int_equal(len, 4096);
	assert_int_equal(gdr_region_keys(r, &lk, NULL), 0);
	regs0 = fake_verbs.regs;
	/* the same range again: a hit on the same MR, no NIC registration */
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096, REMOTE, &r2),
			 0);
	assert_int_equal(gdr_region_keys(r2, &lk2, NULL), 0);
	assert_int_equal(lk2, lk);
	assert_int_equal(fake_verbs.regs, regs0);
	assert_int_equal(gdr_dereg(r2), 0);
	/* a sub-range is not served by the wider exact MR: its own */
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 100, REMOTE, &r2),
			 0);
	mr_bounds(r2, &base, &len);
	assert_int_equal(base, a + 8192);
	assert_int_equal(len, 100);
	assert_int_equal(gdr_dereg(r2), 0);
	/* local access: the pin-wide MR */
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096,
				 IBV_ACCESS_LOCAL_WRITE, &l),
			 0);
	mr_bounds(l, &base, &len);
	assert_int_equal(base, a);
	assert_int_equal(len, 1 * MiB);
	/* the wide MR on request */
	assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096,
				 REMOTE | GDR_ACCESS_WIDE_MR, &w),
			 0);
	mr_bounds(w, &base, &len);
	assert_int_equal(base, a);
	assert_int_equal(len, 1 * MiB);
	assert_int_equal(gdr_dereg(w), 0);
	assert_int_equal(gdr_dereg(l), 0);
	/* past GDR_EXACT_PER_ENTRY distinct ranges the entry is replaced; a held registration of the
	 * old one stays usable (its MR still registered) until released */
	held = r;
	for (uint64_t i = 0; i < GDR_EXACT_PER_ENTRY + 4; i++) {
		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 65536 + i * 256),
					 256, REMOTE, &r2),
				 0);
		mr_bounds(r2, &base, &len);
		assert_int_equal(base, a + 65536 + i * 256);
		assert_int_equal(len, 256);
		assert_int_equal(gdr_dereg(r2), 0);
	}
	/* the old entry had 2 exact ranges before the loop: the loop's first 30 filled it to 32, the
	 * other 6 went to the new entry. Detached, the old one keeps its 32 exact MRs and 2 wide ones
	 * while held. */
	assert_int_equal(fake_verbs.outstanding, GDR_EXACT_PER_ENTRY + 2 + 6);
	mr_bounds(held, &base, &len);
	assert_int_equal(base, a + 8192);
	assert_int_equal(gdr_dereg(held), 0);
	/* released, it goes with all of them: the new entry's 6 are left */
	assert_int_equal(fake_verbs.outstanding, 6);
	fake_cuda_free(a);
}

/* NIXL's shape: many tensors, one after the other, of one allocation larger than max_pin_bytes,
 * each registered with remote access and held. Pins go by windows of max_pin_bytes, not one a
 * tensor (their request-sized pins shared pages with the neighbours', and merging each into the
 * next pinned all before it again); an entry holding its tensors' exact MRs is not replaced every
 * GDR_EXACT_PER_ENTRY of them (a held record stays where it is: replacing only re-pinned). */
static void test_tensors_of_one_allocation(void **state)
{
	enum { N = 200 };
	const uint64_t total = 64 * MiB, each = total / N & ~255ull;
	struct gdr_region *r[N];
	struct gdr_cache_stats s;
	uint64_t a, base, len;

	(void)state;
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = make(GDR_CACHE_ATTR_MAX_BYTES | GDR_CACHE_ATTR_MAX_PIN_BYTES, 1024 * MiB, 0,
		     4 * MiB);
	a = fake_cuda_alloc(total);
	for (int i = 0; i < N; i++) {
		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + i * each), each,
					 REMOTE, &r[i]),
				 0);
		mr_bounds(r[i], &base, &len);
		assert_int_equal(base, a + i * each);
		assert_int_equal(len, each);
	}
	assert_int_equal(gdr_cache_get_stats_ex(cache, &s, sizeof(s)), 0);
	/* 16 windows of 4 MiB: a tensor across a window's end pins the two it touches */
	assert_true(s.pins <= 2 * (total / (4 * MiB)) + 2);
	assert_int_equal(s.exact_replaced, 0);
	assert_int_equal(s.exact_mrs, N);
	assert_int_equal(fake_be.bad_pins, 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(gdr_dereg(r[i]), 0);
	fake_cuda_free(a);
}

/* A zero-based MR is addressed by offsets from the start of its own range: two of different ranges
 * of one allocation are two MRs, each beginning where it was asked, with local access as with
 * remote, GDR_ACCESS_WIDE_MR or not (the pin-wide MR's offset 0 is the allocation's start: a
 * NIC given its key would read and write the wrong bytes). And the remote flush bits of newer
 * rdma-core (FLUSH_GLOBAL 1 << 8, FLUSH_PERSISTENT 1 << 9) are remote access: an exact MR. */
#define ZERO_BASED 0x20 /* IBV_ACCESS_ZERO_BASED */
static void test_zero_based_and_flush_mr_are_exact(void **state)
{
	static const int acc[] = { IBV_ACCESS_LOCAL_WRITE | ZERO_BASED, REMOTE | ZERO_BASED,
				   IBV_ACCESS_LOCAL_WRITE | ZERO_BASED | GDR_ACCESS_WIDE_MR,
				   IBV_ACCESS_LOCAL_WRITE | 0x100, IBV_ACCESS_LOCAL_WRITE | 0x200 };
	uint64_t a = fake_cuda_alloc(1 * MiB), base, len;

	(void)state;
	for (unsigned i = 0; i < sizeof(acc) / sizeof(acc[0]); i++) {
		struct gdr_region *r, *r2, *again;
		uint32_t k, k2, kagain;

		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096,
					 acc[i], &r),
				 0);
		mr_bounds(r, &base, &len);
		assert_int_equal(base, a + 8192);
		assert_int_equal(len, 4096);
		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 65536), 8192,
					 acc[i], &r2),
				 0);
		mr_bounds(r2, &base, &len);
		assert_int_equal(base, a + 65536);
		assert_int_equal(len, 8192);
		assert_int_equal(gdr_region_keys(r, &k, NULL), 0);
		assert_int_equal(gdr_region_keys(r2, &k2, NULL), 0);
		assert_int_not_equal(k, k2);
		/* the same range and access again: a hit on its own MR */
		assert_int_equal(gdr_reg(cache, FAKE_PD, (void *)(uintptr_t)(a + 8192), 4096,
					 acc[i], &again),
				 0);
		assert_int_equal(gdr_region_keys(again, &kagain, NULL), 0);
		assert_int_equal(kagain, k);
		assert_int_equal(gdr_dereg(again), 0);
		assert_int_equal(gdr_dereg(r2), 0);
		assert_int_equal(gdr_dereg(r), 0);
	}
	fake_cuda_free(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hit_after_miss, setup, teardown),
		cmocka_unit_test_setup_teardown(test_remote_access_mr_is_exact, setup, teardown),
		cmocka_unit_test_setup_teardown(test_zero_based_and_flush_mr_are_exact, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_tensors_of_one_allocation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_va_reuse_is_stale, setup, teardown),
		cmocka_unit_test_setup_teardown(test_freed_buffer_not_served, setup, teardown),
		cmocka_unit_test_setup_teardown(test_held_stale_entry_detached, setup, teardown),
		cmocka_unit_test_setup_teardown(test_small_allocations_share_a_page, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_cap_and_merge, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lru_bytes_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lru_entries_limit_and_refs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_enomem_evicts_and_retries, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_pin_other_error_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nic_registration, setup, teardown),
		cmocka_unit_test_setup_teardown(test_managed_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_host_passthrough, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cached_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sync_memops_once_per_allocation, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_vmm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_from_thread_without_context, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_mixed_range_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cuda_query_failure, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
