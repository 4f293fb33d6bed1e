/* SPDX-License-Identifier: MIT */
/*
 * Self-test of the fake CUDA driver, stream-ordered pools (fake_cuda_pool.c), as measured on two
 * H200s with driver API 13000 (tests/gpu/probes/mem_probe.c): 32 MiB chunks, packing, straddling
 * allocations, whole-chunk dma-buf export, release of empty chunks, memory an open dma-buf holds.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "fake_cuda_selftest.h"

void test_pool(void)
{
	typedef CUresult (*pool_t)(void **, int);
	typedef CUresult (*fpa_t)(CUdeviceptr *, size_t, void *, void *);
	pool_t p_pool = (pool_t)resolve("cuDeviceGetDefaultMemPool", 12000);
	fpa_t p_from_pool = (fpa_t)resolve("cuMemAllocFromPoolAsync", 12000);
	unsigned one = 1;
	CUresult rc;

	fake_cuda_reset();
	/* a 1 MiB allocation at a chunk start: MAPPING is the 32 MiB chunk */
	uint64_t a = fake_cuda_alloc_async(MIB);

	CHECK(attr_u64(A_MAPPING_BASE, a, NULL) == a && a % POOL_CH == 0 &&
	      attr_u64(A_MAPPING_SIZE, a, NULL) == POOL_CH,
	      "pool: MAPPING is the 32 MiB chunk holding the address");
	/* small allocations packed in the chunk */
	uint64_t s[4];
	bool packed = true;

	for (int i = 0; i < 4; i++) {
		s[i] = fake_cuda_alloc_async(64 << 10);
		packed = packed && s[i] == s[0] + (uint64_t)i * (64 << 10) &&
			 attr_u64(A_MAPPING_BASE, s[i], NULL) == a;
	}
	CHECK(packed, "pool: four 64 KiB allocations packed 64 KiB apart in one chunk");
	CHECK(bufid(s[0], &rc) != bufid(s[1], &rc) && rc == SUCCESS, "pool: BUFFER_ID per allocation");
	CHECK_EQ(export_range(s[1] & ~0xffffull, 64 << 10, NULL), INVALID_VALUE,
		 "pool: the exact 64 KiB cover of an allocation is refused");
	CHECK_EQ(export_range(a, POOL_CH, NULL), SUCCESS,
		 "pool: a chunk shared by small allocations exports whole (free parts included)");
	CHECK_EQ(export_range(a, 16 * MIB, NULL), INVALID_VALUE, "pool: half a chunk is refused");

	/* a large allocation spans consecutive chunks, each its own */
	uint64_t l = fake_cuda_alloc_async(256 * MIB), last = l + 256 * MIB - 1;
	uint64_t lb = attr_u64(A_MAPPING_BASE, l, NULL), eb = attr_u64(A_MAPPING_BASE, last, NULL);

	CHECK(lb <= l && eb == (last & ~(POOL_CH - 1)) && attr_u64(A_MAPPING_SIZE, last, NULL) == POOL_CH &&
	      eb > lb, "pool: 256 MiB allocation: MAPPING at its last byte is the last chunk");
	CHECK(fake_cuda_phys_gen(l) != fake_cuda_phys_gen(last) && fake_cuda_phys_gen(last) != 0,
	      "pool: each chunk its own phys generation");
	CHECK(attr_u64(A_RANGE_START, l + 12345, NULL) == l &&
	      attr_u64(A_RANGE_SIZE, l + 12345, NULL) == 256 * MIB, "pool: RANGE is the allocation");
	CHECK_EQ(export_range(lb, eb + POOL_CH - lb, NULL), SUCCESS,
		 "pool: the cover of the chunks an allocation spans exports");
	CHECK_EQ(export_range(l, 256 * MIB, NULL), l == lb ? SUCCESS : INVALID_VALUE,
		 "pool: its exact range exports only if chunk-aligned at both ends");
	CHECK_EQ(export_range(lb + POOL_CH, 2 * POOL_CH, NULL), SUCCESS, "pool: interior chunks export");
	CHECK_EQ(export_range(lb, 2 * POOL_CH + 4096, NULL), INVALID_VALUE,
		 "pool: a range ending inside a chunk is refused");

	/* attributes */
	CUcontext ctx = (CUcontext)1;

	p_cuPointerGetAttribute(&ctx, A_CONTEXT, l);
	CHECK(ctx == NULL, "pool: CONTEXT NULL");
	CHECK_EQ(attr_u32(A_RDMA_CAPABLE, l), 0, "pool: IS_GPU_DIRECT_RDMA_CAPABLE 0");
	CHECK_EQ(attr_u32(A_MEMORY_TYPE, l), 2, "pool: MEMORY_TYPE DEVICE");
	CHECK_EQ(attr_u32(A_DEVICE_ORDINAL, l), 0, "pool: DEVICE_ORDINAL the pool's device");
	void *pool = NULL, *mp = NULL;

	p_cuPointerGetAttribute(&mp, A_MEMPOOL, l);
	CHECK(p_pool(&pool, 0) == SUCCESS && mp != NULL && mp == pool,
	      "pool: MEMPOOL_HANDLE non-NULL, the default pool");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, l), SUCCESS, "pool: SYNC_MEMOPS set succeeds");

	/* an explicit pool allocation behaves alike */
	CUdeviceptr e = 0;

	CHECK(p_from_pool(&e, MIB, pool, NULL) == SUCCESS && fake_cuda_alloc_info(e, &(struct fake_cuda_alloc_info){ 0 }) == 0 &&
	      attr_u64(A_MAPPING_SIZE, e, NULL) == POOL_CH, "cuMemAllocFromPoolAsync: pool memory alike");
	fake_cuda_free_async(e);

	/* straddling: an allocation across a chunk boundary has two MAPPINGs */
	fake_cuda_free_async(l);
	for (int i = 0; i < 4; i++)
		fake_cuda_free_async(s[i]);
	uint64_t f = fake_cuda_alloc_async(31 * MIB - MIB); /* after a: up to 31 MiB */
	uint64_t x = fake_cuda_alloc_async(2 * MIB);

	CHECK(x == a + 31 * MIB && attr_u64(A_MAPPING_BASE, x, NULL) == a &&
	      attr_u64(A_MAPPING_BASE, x + 2 * MIB - 1, NULL) == a + POOL_CH,
	      "pool: an allocation may straddle two chunks");
	fake_cuda_free_async(x);
	fake_cuda_free_async(f);

	/* release threshold 0: an empty chunk is released; same VA, new id, new memory */
	unsigned chunks = fake_cuda_pool_chunks(0);
	uint64_t id = fake_cuda_buffer_id(a), gen = fake_cuda_phys_gen(a);

	fake_cuda_free_async(a);
	CHECK_EQ(fake_cuda_pool_chunks(0), chunks - 1, "pool: a chunk with no allocation is released");
	CHECK_EQ(fake_cuda_phys_gen(a), 0, "pool: its memory is gone");
	uint64_t a2 = fake_cuda_alloc_async(MIB);

	CHECK(a2 == a && fake_cuda_buffer_id(a2) > id && fake_cuda_phys_gen(a2) != gen,
	      "pool: the VA is reused: new BUFFER_ID, new physical memory");

	/* an open dma-buf of a chunk holds its memory after the pool released it */
	int fd = -1;

	CHECK_EQ(export_range(a2, POOL_CH, &fd), SUCCESS, "pool: export the chunk");
	fake_cuda_free_async(a2);
	CHECK_EQ(fake_cuda_dmabuf_held_bytes(), POOL_CH,
		 "pool: freed chunk with an open dma-buf: exactly 32 MiB still allocated");
	uint64_t a3 = fake_cuda_alloc_async(MIB);

	CHECK(a3 == a && fake_cuda_phys_gen(a3) != 0, "pool: VA reused at once, new memory");
	close(fd);
	CHECK_EQ(fake_cuda_dmabuf_held_bytes(), 0, "pool: closing the dma-buf frees it");
	fake_cuda_free_async(a3);
	CHECK_EQ(fake_cuda_pool_chunks(0), 0, "pool: no chunk left");
}
