/* SPDX-License-Identifier: MIT */
/*
 * Issue 11 against the fake driver (which simulates what was measured on two H200s,
 * tests/fake/fake_cuda_pool.c, fake_cuda_ctx.c, fake_cuda_ipc.c), dmabuf backend, mode events:
 *  - stream-ordered pool memory registers: pinned as the pool's 32 MiB chunks (the driver exports
 *    nothing less), the chunks of the whole allocation when it straddles two; GDR_MEM_POOL;
 *  - allocations sharing a chunk share its pin; a neighbour's free keeps it, the last tagged
 *    allocation's free releases it (nothing held hostage);
 *  - two GPUs: a reset of one drops only its entries; pool memory survives a primary release;
 *  - a thread with no context registers another GPU's memory and leaves no reference on that
 *    GPU's primary context;
 *  - a GPU without dma-buf support next to one with: refused (-EOPNOTSUPP, one warning) with the
 *    dmabuf backend asked for, the other GPU unaffected;
 *  - legacy IPC imports (no dma-buf from the driver): -EOPNOTSUPP, counted, nothing cached.
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

#define MiB (1024ULL * 1024)
#define CHUNK FAKE_CUDA_POOL_CHUNK_SIZE
#define DMA_BUF_SUPPORTED 124 /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */

/* The fake's exported entries (patched by the library when it loads the driver). */
gdr_CUresult cuMemFreeAsync(gdr_CUdeviceptr p, void *stream);
gdr_CUresult cuMemAllocAsync(gdr_CUdeviceptr *p, size_t n, void *stream);
gdr_CUresult cuDevicePrimaryCtxReset_v2(gdr_CUdevice d);
gdr_CUresult cuDevicePrimaryCtxRetain(gdr_CUcontext *c, gdr_CUdevice d);
gdr_CUresult cuDevicePrimaryCtxRelease_v2(gdr_CUdevice d);
gdr_CUresult cuCtxSetCurrent(gdr_CUcontext c);
gdr_CUresult cuPointerGetAttribute(void *data, int attribute, gdr_CUdeviceptr ptr);

static struct gdr_cache *cache;

static struct gdr_cache *make(int backend)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE,
				    .backend = backend,
				    .validate = GDR_VALIDATE_EVENTS };
	struct gdr_cache *c = NULL;

	assert_int_equal(gdr_cache_create(&a, &c), 0);
	return c;
}

static int setup(void **state)
{
	(void)state;
	fake_cuda_reset();
	cache = make(GDR_BACKEND_DMABUF);
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

static void range_of(struct gdr_region *r, uint64_t *base, uint64_t *len)
{
	assert_int_equal(gdr_region_range(r, base, len), 0);
}

static uint64_t id_of(struct gdr_region *r)
{
	uint64_t id = 0;

	assert_int_equal(gdr_region_buffer_id(r, &id), 0);
	return id;
}

/* ---- pools ----------------------------------------------------------------------------------- */

static void test_pool_registers_as_its_chunk(void **state)
{
	uint64_t a = fake_cuda_alloc_async(64 * 1024), base, len, dva = 0, dsz = 0, off;
	struct fake_cuda_alloc_info ai;
	struct gdr_region *r;
	enum gdr_mem_kind kind = GDR_MEM_HOST;
	int fd = -1;

	(void)state;
	assert_int_equal(fake_cuda_alloc_info(a, &ai), 0);
	r = reg(a + 4096, 4096); /* the old code: -EOPNOTSUPP, the driver exports no part-chunk */
	range_of(r, &base, &len);
	assert_int_equal(base, ai.chunk_va);
	assert_int_equal(len, CHUNK);
	assert_int_equal(gdr_region_mem_kind(r, &kind), 0);
	assert_int_equal(kind, GDR_MEM_POOL);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(a));
	assert_int_equal(gdr_region_dmabuf(r, &fd, &off), 0);
	assert_int_equal(fake_cuda_dmabuf_range(fd, &dva, &dsz), 0);
	assert_int_equal(dva, ai.chunk_va);
	assert_int_equal(dsz, CHUNK);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(cuMemFreeAsync(a, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0); /* released inside the free */
}

/* The physical chunk the driver reports at va (MAPPING_BASE_ADDR / MAPPING_SIZE). */
static void mapping(uint64_t va, uint64_t *base, uint64_t *size)
{
	assert_int_equal(cuPointerGetAttribute(base, 19, va), GDR_CUDA_SUCCESS);
	assert_int_equal(cuPointerGetAttribute(size, 18, va), GDR_CUDA_SUCCESS);
}

static void test_pool_straddling_allocation(void **state)
{
	uint64_t first = fake_cuda_alloc_async(20 * MiB); /* fills most of a chunk */
	uint64_t a = fake_cuda_alloc_async(40 * MiB), base, len, c0, s0, c1, s1;
	struct gdr_region *r;

	(void)state;
	mapping(a, &c0, &s0);
	mapping(a + 40 * MiB - 1, &c1, &s1);
	assert_true(c1 > c0); /* it straddles a chunk boundary */
	/* a piece inside the first chunk only: the pin is the whole allocation's chunks (the driver
	 * does not export the first alone: the old code pinned it alone, and was refused) */
	r = reg(a, 4096);
	range_of(r, &base, &len);
	assert_int_equal(base, c0);
	assert_int_equal(base + len, c1 + s1);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(cuMemFreeAsync(a, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFreeAsync(first, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
}

static void test_pool_chunk_shared_and_neighbour_free(void **state)
{
	uint64_t a = fake_cuda_alloc_async(64 * 1024), b = fake_cuda_alloc_async(64 * 1024);
	uint64_t c = fake_cuda_alloc_async(64 * 1024), exports, misses;
	struct gdr_region *r;

	(void)state;
	r = reg(a, 4096);
	assert_int_equal(gdr_dereg(r), 0);
	exports = fake_cuda_dmabuf_exports();
	misses = stats().misses;
	/* b shares a's chunk: served by its pin, tagged with its own BUFFER_ID */
	r = reg(b, 64 * 1024);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(b));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_cuda_dmabuf_exports(), exports);
	/* c, never registered, is freed: nothing the entry pinned changed */
	assert_int_equal(cuMemFreeAsync(c, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_open_dmabufs(), 1);
	r = reg(a, 4096);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(stats().misses, misses);
	/* b is freed and its VA given again: the new allocation is not served as b */
	assert_int_equal(cuMemFreeAsync(b, NULL), GDR_CUDA_SUCCESS);
	c = fake_cuda_alloc_async(64 * 1024);
	r = reg(c, 4096);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(c));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(cuMemFreeAsync(a, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFreeAsync(c, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
	assert_int_equal(stats().entries, 0);
}

/* ---- several GPUs ------------------------------------------------------------------------------ */

/* What GDR_ACCESS_WIDE_MR reaches on pool memory (issue 31 #6), as include/gdrcache.h says: the
 * MR of the whole pin, which for pool memory under the dmabuf backend is the pool's 32 MiB chunk,
 * and so the neighbour allocation in it and the chunk's free space; without the flag, remote
 * access reaches exactly the range asked. */
static void test_wide_mr_on_pool_reaches_its_chunk(void **state)
{
	struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE,
				     .backend = GDR_BACKEND_DMABUF,
				     .validate = GDR_VALIDATE_EVENTS };
	const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	uint64_t a = fake_cuda_alloc_async(64 * 1024), b = fake_cuda_alloc_async(64 * 1024);
	struct fake_cuda_alloc_info ai, bi;
	struct gdr_region *rw, *rx;
	struct gdr_cache *c;
	struct ibv_mr *mw, *mx;

	(void)state;
	assert_int_equal(fake_cuda_alloc_info(a, &ai), 0);
	assert_int_equal(fake_cuda_alloc_info(b, &bi), 0);
	assert_int_equal(bi.chunk_va, ai.chunk_va); /* b is a's neighbour in one chunk */
	fake_verbs_install();
	assert_int_equal(fake_cache_create(&at, NULL, &c), 0);
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)(a + 4096), 4096,
				 remote | GDR_ACCESS_WIDE_MR, &rw),
			 0);
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)(a + 4096), 4096, remote, &rx), 0);
	assert_int_equal(gdr_region_mr(rw, &mw), 0);
	assert_int_equal(gdr_region_mr(rx, &mx), 0);
	assert_int_equal((uintptr_t)mw->addr, ai.chunk_va);
	assert_int_equal(mw->length, CHUNK);
	assert_true(b >= (uintptr_t)mw->addr && b + 64 * 1024 <= (uintptr_t)mw->addr + mw->length);
	assert_int_equal((uintptr_t)mx->addr, a + 4096);
	assert_int_equal(mx->length, 4096);
	assert_int_equal(gdr_dereg(rw), 0);
	assert_int_equal(gdr_dereg(rx), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	assert_int_equal(cuMemFreeAsync(a, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(cuMemFreeAsync(b, NULL), GDR_CUDA_SUCCESS);
}

/* Issue 31 #4 (suspected): cuMemFreeAsync's event goes out at the call, the memory is freed when
 * the stream reaches the free; could a registration in between cache memory the program gave up?
 * No: the driver answers for the allocation no more from the call on (docs/FACTS.md,
 * "Stream-ordered frees", measured on the H100 with the stream held back), so the registration is
 * refused and nothing is pinned; the VA's next allocation, on that stream at once, is its own. */
static void test_free_async_gone_at_the_call(void **state)
{
	uint64_t a = fake_cuda_alloc_async(1 * MiB), id = fake_cuda_buffer_id(a);
	gdr_CUdeviceptr b = 0;
	struct gdr_region *r = NULL;

	(void)state;
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(stats().entries, 1);
	assert_int_equal(cuMemFreeAsync(a, (void *)(uintptr_t)0x5), GDR_CUDA_SUCCESS);
	assert_int_equal(stats().entries, 0); /* dropped inside the call */
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
	assert_int_not_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(cuMemAllocAsync(&b, 1 * MiB, (void *)(uintptr_t)0x5), GDR_CUDA_SUCCESS);
	r = reg(b, 4096);
	assert_int_not_equal(id_of(r), id);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(b));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(cuMemFreeAsync(b, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
}

static void test_reset_of_one_gpu_drops_only_its_entries(void **state)
{
	uint64_t a0, a1, p1, misses;
	struct gdr_region *r;
	struct gdr_cache_stats s;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	a0 = fake_cuda_alloc_on(0, 1 * MiB);
	a1 = fake_cuda_alloc_on(1, 1 * MiB);
	p1 = fake_cuda_alloc_async_on(1, 1 * MiB);
	assert_int_equal(gdr_dereg(reg(a0, 4096)), 0);
	assert_int_equal(gdr_dereg(reg(a1, 4096)), 0);
	assert_int_equal(gdr_dereg(reg(p1, 4096)), 0);
	assert_int_equal(stats().entries, 3);
	misses = stats().misses;
	assert_int_equal(cuDevicePrimaryCtxReset_v2(1), GDR_CUDA_SUCCESS);
	/* before the reset returned: GPU 1's context memory dropped; GPU 0's and the pool's stay
	 * (the old code dropped all three) */
	s = stats();
	assert_int_equal(fake_cuda_buffer_id(a1), 0);
	assert_int_equal(s.entries, 2);
	r = reg(a0, 4096);
	assert_int_equal(gdr_dereg(r), 0);
	r = reg(p1, 4096);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(p1));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(stats().misses, misses);
	assert_int_equal(cuMemFreeAsync(p1, NULL), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_free(a0), 0);
}

static void test_pool_survives_last_primary_release(void **state)
{
	gdr_CUcontext ctx = NULL;
	uint64_t a, p, misses;
	struct gdr_region *r;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 1), GDR_CUDA_SUCCESS);
	a = fake_cuda_alloc_on(1, 1 * MiB);
	p = fake_cuda_alloc_async_on(1, 1 * MiB);
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(gdr_dereg(reg(p, 4096)), 0);
	misses = stats().misses;
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(1), GDR_CUDA_SUCCESS); /* the last */
	assert_int_equal(fake_cuda_buffer_id(a), 0);
	assert_int_equal(stats().entries, 1);
	r = reg(p, 4096);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(p));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(stats().misses, misses);
	assert_int_equal(cuMemFreeAsync(p, NULL), GDR_CUDA_SUCCESS);
}

struct noctx {
	uint64_t a;
	int rc;
	uint64_t id;
};

static void *reg_without_context(void *arg)
{
	struct noctx *n = arg;
	struct gdr_region *r = NULL;

	cuCtxSetCurrent(NULL);
	n->rc = gdr_reg(cache, NULL, (void *)(uintptr_t)n->a, 4096, 0, &r);
	if (!n->rc) {
		gdr_region_buffer_id(r, &n->id);
		gdr_dereg(r);
	}
	return NULL;
}

static void test_borrowed_context_keeps_no_reference(void **state)
{
	gdr_CUcontext ctx = NULL;
	struct noctx n = { 0 };
	pthread_t t;
	unsigned refs;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 1), GDR_CUDA_SUCCESS);
	n.a = fake_cuda_alloc_on(1, 1 * MiB);
	refs = fake_cuda_primary_refs(1);
	assert_int_equal(pthread_create(&t, NULL, reg_without_context, &n), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(n.rc, 0); /* the export borrowed GPU 1's primary context */
	assert_int_equal(n.id, fake_cuda_buffer_id(n.a));
	/* and gave it back: the application's release is the last and frees (the old code kept a
	 * reference for good, so GPU 1's memory outlived the application's last release) */
	assert_int_equal(fake_cuda_primary_refs(1), refs);
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(1), GDR_CUDA_SUCCESS);
	assert_int_equal(fake_cuda_buffer_id(n.a), 0);
	assert_int_equal(stats().entries, 0);
}

/* Another thread retains the primary context as soon as the last release has freed its memory
 * (before the release returns to the hook: the free observer, once). */
static void retain_on_free(uint64_t va, uint64_t size, uint64_t id, int kind, void *arg)
{
	gdr_CUcontext ctx = NULL;
	int *armed = arg;

	(void)va, (void)size, (void)id, (void)kind;
	if (*armed) {
		*armed = 0;
		assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 1), GDR_CUDA_SUCCESS);
	}
}

static void test_last_release_then_retain_by_another_thread(void **state)
{
	gdr_CUcontext ctx = NULL;
	uint64_t a, b;
	struct gdr_region *r;
	int armed = 1;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 1), GDR_CUDA_SUCCESS);
	a = fake_cuda_alloc_on(1, 1 * MiB);
	assert_int_equal(gdr_dereg(reg(a, 4096)), 0);
	assert_int_equal(stats().entries, 1);
	fake_cuda_set_free_observer(retain_on_free, &armed);
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(1), GDR_CUDA_SUCCESS); /* the last */
	fake_cuda_set_free_observer(NULL, NULL);
	assert_int_equal(armed, 0);
	/* a was freed with the context, which is active again (the other thread's): a's pin went
	 * before the release returned (the old code took the active context for a release that was
	 * not the last) */
	assert_int_equal(fake_cuda_buffer_id(a), 0);
	assert_int_equal(stats().entries, 0);
	assert_int_equal(fake_cuda_dmabuf_held_bytes(), 0);
	/* the new context's allocation at a's address is not served as a */
	b = fake_cuda_alloc_on(1, 1 * MiB);
	r = reg(b, 4096);
	assert_int_equal(id_of(r), fake_cuda_buffer_id(b));
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(cuDevicePrimaryCtxRelease_v2(1), GDR_CUDA_SUCCESS);
}

static void test_gpu_without_dmabuf_next_to_one_with(void **state)
{
	uint64_t a0, a1;
	struct gdr_region *r = NULL;
	uint64_t fail0;

	(void)state;
	assert_int_equal(fake_cuda_set_device_count(2), 0);
	assert_int_equal(fake_cuda_set_device_attr_dev(1, DMA_BUF_SUPPORTED, 0), 0);
	a0 = fake_cuda_alloc_on(0, 1 * MiB);
	a1 = fake_cuda_alloc_on(1, 1 * MiB);
	fail0 = fake_cuda_dmabuf_exports();
	/* the dmabuf backend was asked for: GPU 1 is refused, without asking the driver */
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a1, 4096, 0, &r), -EOPNOTSUPP);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a1, 4096, 0, &r), -EOPNOTSUPP);
	assert_int_equal(fake_cuda_dmabuf_exports(), fail0);
	assert_int_equal(gdr_dereg(reg(a0, 4096)), 0);
	assert_int_equal(fake_cuda_free(a0), 0);
	assert_int_equal(fake_cuda_free(a1), 0);
}

/* ---- memory from another process --------------------------------------------------------------- */

static void test_legacy_ipc_refused(void **state)
{
	uint64_t a = fake_cuda_alloc(4 * MiB), imp = fake_cuda_ipc_import(a);
	struct gdr_region *r = NULL;
	struct gdr_cache_stats s;

	(void)state;
	assert_int_not_equal(imp, 0);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)imp, 4096, 0, &r), -EOPNOTSUPP);
	s = stats();
	assert_int_equal(s.fail_pin, 1);
	assert_int_equal(s.entries, 0);
	assert_int_equal(fake_cuda_ipc_close(imp), 0);
	assert_int_equal(fake_cuda_free(a), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_pool_registers_as_its_chunk, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pool_straddling_allocation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pool_chunk_shared_and_neighbour_free, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_reset_of_one_gpu_drops_only_its_entries, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_wide_mr_on_pool_reaches_its_chunk, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_free_async_gone_at_the_call, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pool_survives_last_primary_release, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_borrowed_context_keeps_no_reference, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_last_release_then_retain_by_another_thread,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_gpu_without_dmabuf_next_to_one_with, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_legacy_ipc_refused, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
