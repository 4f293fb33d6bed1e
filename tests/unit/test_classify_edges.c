/* SPDX-License-Identifier: MIT */
/*
 * Classification edges of a miss (lib/cache/miss.c classify, lib/cuda/cuda.c) against the fake
 * CUDA driver and the fake backend, mode tag unless a test says otherwise:
 *  - a range that mixes GPU memory and memory CUDA does not back is refused (-EINVAL) whichever
 *    part comes first, with or without a PD: never handed to ibv_reg_mr as "host memory";
 *  - a range over two GPUs' memory: -EINVAL, nothing pinned;
 *  - managed memory: -EOPNOTSUPP every time, never cached, with and without a PD;
 *  - cuMemAllocHost memory: passed through with a PD, -EINVAL without, never pinned;
 *  - SYNC_MEMOPS failing: -EIO, nothing pinned, the next registration sets it and succeeds;
 *  - VMM memory registered from a thread whose current context is another GPU's: the context-wide
 *    SYNC_MEMOPS goes to the memory's device's context;
 *  - validation: events forced where the probe fails is refused, AUTO falls back to tag.
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
#include "fake_cuda.h"
#include "fakes.h"
#include "fixture.h"

#define MiB (1024ULL * 1024)
#define KiB 1024ULL

gdr_CUresult cuCtxSetCurrent(gdr_CUcontext c);
gdr_CUresult cuDevicePrimaryCtxRetain(gdr_CUcontext *c, gdr_CUdevice d);
gdr_CUresult cuDevicePrimaryCtxRelease_v2(gdr_CUdevice d);
gdr_CUresult cuDevicePrimaryCtxReset_v2(gdr_CUdevice d);
gdr_CUresult cuDevicePrimaryCtxGetState(gdr_CUdevice d, unsigned int *flags, int *active);

static struct gdr_cache *cache;

static struct gdr_cache *make(int validate)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE, .validate = validate };
	struct gdr_cache *c = NULL;

	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	return c;
}

static int setup(void **state)
{
	(void)state;
	fakes_reset();
	cache = make(GDR_VALIDATE_TAG);
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

static int try_reg(struct ibv_pd *pd, uint64_t a, uint64_t len, struct gdr_region **r)
{
	*r = NULL;
	return gdr_reg(cache, pd, (void *)(uintptr_t)a, len, 0, r);
}

/* Refused with -EINVAL, nothing pinned and nothing registered with the NIC; a region handed out
 * by mistake is released so that teardown's checks stay about this defect. */
static void assert_mixed_refused(struct ibv_pd *pd, uint64_t a, uint64_t len)
{
	struct gdr_region *r = NULL;
	uint64_t regs = fake_verbs.regs, pins = fake_be.pins;
	int rc = try_reg(pd, a, len, &r);

	if (rc == 0 && r)
		gdr_dereg(r);
	assert_int_equal(rc, -EINVAL);
	assert_int_equal(fake_be.pins, pins);
	assert_int_equal(fake_verbs.regs, regs);
}

/* ---- ranges that mix GPU memory and other memory ----------------------------------------------- */

/* A VMM reservation, its first half unmapped, its second mapped: a range from the unmapped part
 * into the mapped one. The mapped-first order is refused (test_cache's test_mixed_range_refused);
 * this order must be too, also with a PD (else ibv_reg_mr gets GPU memory as host memory). */
static void test_vmm_unmapped_then_mapped(void **state)
{
	uint64_t va = fake_cuda_vmm_reserve(4 * MiB);

	(void)state;
	assert_true(va != 0);
	assert_int_equal(fake_cuda_vmm_map(va + 2 * MiB, 2 * MiB), 0);
	assert_mixed_refused(NULL, va + 1 * MiB, 2 * MiB);
	assert_mixed_refused(FAKE_PD, va + 1 * MiB, 2 * MiB);
	assert_int_equal(stats().passthrough, 0);
	assert_int_equal(fake_cuda_vmm_unmap(va + 2 * MiB, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_free(va, 4 * MiB), 0);
}

/* The mapped-then-unmapped order, with a PD: refused (the baseline of the test above). */
static void test_vmm_mapped_then_unmapped_with_pd(void **state)
{
	uint64_t va = fake_cuda_vmm_reserve(4 * MiB);

	(void)state;
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	assert_mixed_refused(FAKE_PD, va + 1 * MiB, 2 * MiB);
	assert_int_equal(fake_cuda_vmm_unmap(va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_free(va, 4 * MiB), 0);
}

/* Memory CUDA does not know (a freed neighbour's place in a live chunk) followed by a live
 * cuMemAlloc buffer: refused, with a PD too. */
static void test_unknown_then_device(void **state)
{
	uint64_t a = fake_cuda_alloc(4096), b = fake_cuda_alloc(4096);

	(void)state;
	assert_int_equal(b, a + 4096);
	assert_int_equal(fake_cuda_free(a), 0);
	assert_int_equal(fake_cuda_buffer_id(a), 0);
	assert_mixed_refused(FAKE_PD, a, 8192);
	assert_mixed_refused(FAKE_PD, b, 8192); /* the other order */
	assert_int_equal(fake_cuda_free(b), 0);
}

/* Two GPUs' memory side by side: -EINVAL, nothing pinned, with or without a PD. */
static void test_two_gpus(void **state)
{
	uint64_t a, b;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	fake_cuda_force_new_va(true);
	a = fake_cuda_alloc_on(0, 2 * MiB);
	b = fake_cuda_alloc_on(1, 2 * MiB);
	assert_true(a && b);
	assert_int_equal(b, a + 2 * MiB); /* adjacent: one range spans both */
	assert_mixed_refused(NULL, a + 1 * MiB, 2 * MiB);
	assert_mixed_refused(FAKE_PD, a + 1 * MiB, 2 * MiB);
	/* each alone registers */
	struct gdr_region *r;
	assert_int_equal(try_reg(NULL, a, 4096, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(try_reg(NULL, b, 4096, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	fake_cuda_force_new_va(false);
	assert_int_equal(fake_cuda_free(a), 0);
	assert_int_equal(fake_cuda_free(b), 0);
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = NULL;
}

/* ---- managed and pinned host memory ------------------------------------------------------------ */

static void test_managed_never_cached(void **state)
{
	uint64_t m = fake_cuda_alloc_managed(2 * MiB);
	struct gdr_region *r;

	(void)state;
	for (int i = 0; i < 2; i++) {
		assert_int_equal(try_reg(NULL, m, 4096, &r), -EOPNOTSUPP);
		assert_null(r);
		assert_int_equal(try_reg(FAKE_PD, m + 8192, 4096, &r), -EOPNOTSUPP);
		assert_null(r);
	}
	assert_int_equal(stats().refused_managed, 4);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_be.pins, 0);
	assert_int_equal(fake_verbs.regs, 0);
	assert_int_equal(fake_cuda_sync_memops_count(m), 0);
	assert_int_equal(fake_cuda_free(m), 0);
}

static void test_pinned_host(void **state)
{
	void *h = fake_cuda_alloc_host(64 * KiB);
	struct gdr_region *r;
	enum gdr_mem_kind kind = GDR_MEM_DEVICE;

	(void)state;
	assert_non_null(h);
	assert_int_equal(try_reg(NULL, (uintptr_t)h, 4096, &r), -EINVAL);
	assert_null(r);
	assert_int_equal(try_reg(FAKE_PD, (uintptr_t)h, 4096, &r), 0);
	assert_int_equal(gdr_region_mem_kind(r, &kind), 0);
	assert_int_equal(kind, GDR_MEM_HOST);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_be.pins, 0);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_free_host(h), 0);
}

/* ---- SYNC_MEMOPS ------------------------------------------------------------------------------- */

static void test_sync_memops_failure(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;

	(void)state;
	fake_cuda_fail_next("cuPointerSetAttribute", 999, 1);
	assert_int_equal(try_reg(NULL, a, 4096, &r), -EIO);
	assert_null(r);
	assert_int_equal(fake_be.pins, 0);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_sync_memops_count(a), 0);
	assert_int_equal(try_reg(NULL, a, 4096, &r), 0);
	assert_int_equal(fake_cuda_sync_memops_count(a), 1);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_cuda_free(a), 0);
}

/* VMM memory of device 0 registered by a thread whose current context is device 1's primary:
 * CU_CTX_SYNC_MEMOPS is set on device 0's context (the memory's), not on device 1's. */
struct other_ctx_arg {
	uint64_t va;
	int rc;
};

static void *reg_from_dev1(void *p)
{
	struct other_ctx_arg *arg = p;
	struct gdr_region *r = NULL;
	gdr_CUcontext c1 = NULL;

	if (cuDevicePrimaryCtxRetain(&c1, 1) || cuCtxSetCurrent(c1)) {
		arg->rc = -1000;
		return NULL;
	}
	arg->rc = gdr_reg(cache, NULL, (void *)(uintptr_t)arg->va, 4096, 0, &r);
	if (!arg->rc)
		gdr_dereg(r);
	cuCtxSetCurrent(NULL);
	cuDevicePrimaryCtxRelease_v2(1);
	return NULL;
}

static void test_vmm_from_other_device_context(void **state)
{
	struct other_ctx_arg arg = { 0 };
	pthread_t t;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	arg.va = fake_cuda_vmm_reserve(2 * MiB);
	assert_int_equal(fake_cuda_vmm_map(arg.va, 2 * MiB), 0); /* this thread: device 0 */
	struct fake_cuda_alloc_info ai;
	assert_int_equal(fake_cuda_alloc_info(arg.va, &ai), 0);
	assert_int_equal(ai.device, 0);
	assert_int_equal(pthread_create(&t, NULL, reg_from_dev1, &arg), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(arg.rc, 0);
	assert_true(fake_cuda_ctx_flags_of(fake_cuda_primary_context(0)) & GDR_CU_CTX_SYNC_MEMOPS);
	assert_false(fake_cuda_ctx_flags_of(fake_cuda_primary_context(1)) & GDR_CU_CTX_SYNC_MEMOPS);
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = NULL;
	assert_int_equal(fake_cuda_vmm_unmap(arg.va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_free(arg.va, 2 * MiB), 0);
}

/* The same with device 0's primary context inactive (reset after the mapping; VMM memory
 * survives it): the flag must not land on device 1's context, which holds none of the memory. */
static void test_vmm_other_device_context_primary_inactive(void **state)
{
	struct other_ctx_arg arg = { 0 };
	unsigned flags = 0;
	int active = 1;
	pthread_t t;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	arg.va = fake_cuda_vmm_reserve(2 * MiB);
	assert_int_equal(fake_cuda_vmm_map(arg.va, 2 * MiB), 0);
	assert_int_equal(cuDevicePrimaryCtxReset_v2(0), GDR_CUDA_SUCCESS);
	assert_int_equal(cuDevicePrimaryCtxGetState(0, &flags, &active), GDR_CUDA_SUCCESS);
	assert_int_equal(active, 0);
	assert_true(fake_cuda_buffer_id(arg.va) != 0);
	assert_int_equal(pthread_create(&t, NULL, reg_from_dev1, &arg), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(arg.rc, 0);
	assert_false(fake_cuda_ctx_flags_of(fake_cuda_primary_context(1)) & GDR_CU_CTX_SYNC_MEMOPS);
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = NULL;
	assert_int_equal(fake_cuda_vmm_unmap(arg.va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_free(arg.va, 2 * MiB), 0);
}

/* ---- the validation mode ----------------------------------------------------------------------- */

static int probe_fails(const char **why)
{
	*why = "test: the probe failed";
	return -ENOSYS;
}

static void test_validation_when_probe_fails(void **state)
{
	int (*probe)(const char **) = fake_seams.events_probe;
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE };
	struct gdr_cache_settings s;
	struct gdr_cache *c = NULL;

	(void)state;
	fake_seams.events_probe = probe_fails;
	a.validate = GDR_VALIDATE_EVENTS;
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), -EOPNOTSUPP);
	assert_null(c);
	a.validate = GDR_VALIDATE_AUTO;
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_cache_get_settings(c, &s, sizeof(s)), 0);
	assert_int_equal(s.validate, GDR_VALIDATE_TAG);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_seams.events_probe = probe;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_vmm_unmapped_then_mapped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_mapped_then_unmapped_with_pd, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_unknown_then_device, setup, teardown),
		cmocka_unit_test_setup_teardown(test_two_gpus, setup, teardown),
		cmocka_unit_test_setup_teardown(test_managed_never_cached, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pinned_host, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sync_memops_failure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_from_other_device_context, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_vmm_other_device_context_primary_inactive,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_validation_when_probe_fails, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
