/* SPDX-License-Identifier: MIT */
/*
 * Self-test of the fake CUDA driver, device memory (fake_cuda.c): VA reuse and placement, pointer
 * attributes, SYNC_MEMOPS, VMM mappings and dma-buf export, against the measured facts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cuda_selftest.h"

void test_va_reuse(void)
{
	CUresult rc;
	CUdeviceptr d;

	CHECK_EQ(p_cuMemAlloc(&d, 4 * MIB), SUCCESS, "cuMemAlloc 4 MiB");
	CHECK_EQ(d % (2 * MIB), 0, "large allocation 2 MiB aligned");
	unsigned long long id = bufid(d, &rc);

	for (int i = 0; i < 5; i++) {
		CUdeviceptr d2;

		p_cuMemFree(d);
		p_cuMemAlloc(&d2, 4 * MIB);
		unsigned long long id2 = bufid(d2, &rc);

		CHECK(d2 == d && id2 > id, "free + alloc 4 MiB: same VA, larger id (%llu > %llu)",
		      id2, id);
		id = id2;
	}
	p_cuMemFree(d);

	uint64_t a = fake_cuda_alloc(4096), b = fake_cuda_alloc(4096);

	CHECK_EQ(b - a, 4096, "two 4 KiB allocations are adjacent, 4096 apart");
	id = fake_cuda_buffer_id(b);
	fake_cuda_free(b);
	uint64_t b2 = fake_cuda_alloc(4096);

	CHECK(b2 == b && fake_cuda_buffer_id(b2) > id, "small free + alloc: same VA, larger id");
	fake_cuda_free(b2);
	uint64_t c = fake_cuda_alloc(2048);

	CHECK_EQ(c, b, "first fit: a 2 KiB allocation takes the freed 4 KiB hole");
	fake_cuda_free(c);
	fake_cuda_free(a);

	uint64_t s1 = fake_cuda_alloc(100), s2 = fake_cuda_alloc(100);

	CHECK_EQ(s2 - s1, 512, "100-byte allocations 512 apart");
	uint64_t f1 = fake_cuda_alloc(5000), f2 = fake_cuda_alloc(5000);

	CHECK_EQ(f2 - f1, 5120, "5000-byte allocations 5120 apart");
	fake_cuda_free(s1);
	fake_cuda_free(s2);
	fake_cuda_free(f1);
	fake_cuda_free(f2);
	CHECK_EQ(fake_cuda_live_chunks(), 0, "chunks released when empty");

	fake_cuda_force_new_va(true);
	a = fake_cuda_alloc(4096);
	fake_cuda_free(a);
	b = fake_cuda_alloc(4096);
	CHECK(a != b, "force_new_va: a different VA");
	fake_cuda_free(b);
	a = fake_cuda_alloc(4 * MIB);
	fake_cuda_free(a);
	b = fake_cuda_alloc(4 * MIB);
	CHECK(a != b, "force_new_va: a different large VA");
	fake_cuda_free(b);
	fake_cuda_force_new_va(false);
}

void test_attributes(void)
{
	CUresult rc;
	uint64_t d = fake_cuda_alloc(5000);
	unsigned long long id = fake_cuda_buffer_id(d);
	CUcontext ctx = NULL;

	memset((void *)(uintptr_t)d, 0x5a, 5000);
	CHECK(((unsigned char *)(uintptr_t)d)[4999] == 0x5a, "device memory is readable/writable");
	CHECK_EQ(bufid(d + 4000, &rc), id, "interior pointer has the allocation's id");

	int attrs[] = { A_CONTEXT, A_MEMORY_TYPE, A_BUFFER_ID, A_IS_MANAGED, A_RANGE_START,
			A_RANGE_SIZE, A_DEVICE_ORDINAL, A_MAPPED, A_RDMA_CAPABLE, A_MAPPING_SIZE };
	CUcontext c_ctx;
	unsigned int memtype, managed, mapped, rdma;
	unsigned long long bid;
	CUdeviceptr start;
	size_t size, msize;
	int ordinal;
	void *data[] = { &c_ctx, &memtype, &bid, &managed, &start, &size, &ordinal, &mapped, &rdma,
			 &msize };

	CHECK_EQ(p_cuPointerGetAttributes(10, attrs, data, d + 100), SUCCESS, "cuPointerGetAttributes");
	p_cuCtxGetCurrent(&ctx);
	CHECK(c_ctx == ctx && ctx == fake_cuda_context(), "CONTEXT is the current context");
	CHECK_EQ(memtype, 2, "MEMORY_TYPE DEVICE");
	CHECK_EQ(bid, id, "BUFFER_ID");
	CHECK_EQ(managed, 0, "IS_MANAGED 0");
	CHECK_EQ(start, d, "RANGE_START_ADDR");
	CHECK_EQ(size, 5000, "RANGE_SIZE: the requested size");
	CHECK_EQ(ordinal, 0, "DEVICE_ORDINAL 0");
	CHECK_EQ(mapped, 1, "MAPPED");
	CHECK_EQ(rdma, 1, "IS_GPU_DIRECT_RDMA_CAPABLE");
	CHECK_EQ(msize, 2 * MIB, "MAPPING_SIZE: the chunk");
	CUdeviceptr base;
	size_t len;

	CHECK(p_cuMemGetAddressRange(&base, &len, d + 1) == SUCCESS && base == d && len == 5000,
	      "cuMemGetAddressRange");

	fake_cuda_free(d);
	bufid(d, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "BUFFER_ID after free: INVALID_VALUE");
	CHECK_EQ(p_cuMemGetAddressRange(&base, &len, d), NOT_FOUND, "address range after free");

	/* a pointer CUDA does not know: malloc memory */
	char *m = malloc(4096);

	start = 0x1234;
	size = 0x5678;
	bid = 77;
	memtype = 9;
	ordinal = 9;
	c_ctx = (CUcontext)1;
	CHECK_EQ(p_cuPointerGetAttributes(10, attrs, data, (CUdeviceptr)(uintptr_t)m), SUCCESS,
		 "cuPointerGetAttributes on malloc memory: SUCCESS");
	CHECK(bid == 0 && memtype == 0 && c_ctx == NULL && managed == 0 && mapped == 0,
	      "malloc memory: id 0, type 0, context NULL, not managed, not mapped");
	CHECK_EQ(ordinal, -2, "malloc memory: DEVICE_ORDINAL -2 (measured)");
	CHECK(start == 0x1234 && size == 0x5678, "malloc memory: RANGE_* untouched (measured)");
	void *hp = NULL;

	p_cuPointerGetAttributes(1, (int[]){ A_HOST_POINTER }, (void *[]){ &hp },
				 (CUdeviceptr)(uintptr_t)m);
	CHECK(hp == m, "malloc memory: HOST_POINTER = ptr (measured)");
	bufid((CUdeviceptr)(uintptr_t)m, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "BUFFER_ID on malloc memory: INVALID_VALUE");
	unsigned one = 1;

	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)m),
		 INVALID_VALUE, "SYNC_MEMOPS on malloc memory: INVALID_VALUE");
	free(m);

	CHECK_EQ(p_cuPointerGetAttributes(0, attrs, data, d), INVALID_VALUE, "0 attributes");
	CHECK_EQ(p_cuPointerGetAttribute(&bid, 99, d), INVALID_VALUE, "unknown attribute");

	/* bool attributes are written as 4 bytes */
	uint64_t md = fake_cuda_alloc_managed(MIB);
	unsigned long long wide = ~0ull;

	p_cuPointerGetAttribute(&wide, A_IS_MANAGED, md);
	CHECK_EQ(wide, 0xffffffff00000001ull, "IS_MANAGED written as 4 bytes (measured)");
	p_cuPointerGetAttribute(&memtype, A_MEMORY_TYPE, md);
	CHECK_EQ(memtype, 2, "managed: MEMORY_TYPE DEVICE (measured)");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, md), SUCCESS, "managed: SYNC_MEMOPS ok");
	p_cuPointerGetAttribute(&rdma, A_RDMA_CAPABLE, md);
	CHECK_EQ(rdma, 0, "managed: not GPUDirect RDMA capable");
	fake_cuda_free(md);

	void *h = fake_cuda_alloc_host(10000);

	p_cuPointerGetAttribute(&memtype, A_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h);
	CHECK_EQ(memtype, 1, "host: MEMORY_TYPE HOST");
	CHECK(bufid((CUdeviceptr)(uintptr_t)h, &rc) > 0 && rc == SUCCESS, "host: has a BUFFER_ID");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)h), SUCCESS,
		 "host: SYNC_MEMOPS ok");
	CHECK_EQ(fake_cuda_free(h2u(h)), -EINVAL, "fake_cuda_free refuses host memory");
	CHECK_EQ(fake_cuda_free_host(h), 0, "fake_cuda_free_host");
}

void test_sync_memops(void)
{
	unsigned one = 1;
	uint64_t d = fake_cuda_alloc(4 * MIB);
	uint64_t p = fake_cuda_alloc_async(MIB);

	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, d + 8), SUCCESS, "SYNC_MEMOPS on cuMemAlloc");
	p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, d);
	CHECK_EQ(fake_cuda_sync_memops_count(d), 2, "SYNC_MEMOPS counted per allocation");
	unsigned int v = 0;

	p_cuPointerGetAttribute(&v, A_SYNC_MEMOPS, d);
	CHECK_EQ(v, 1, "SYNC_MEMOPS reads back 1");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, p), SUCCESS, "SYNC_MEMOPS on pool memory");
	CUcontext c = (CUcontext)1;

	p_cuPointerGetAttribute(&c, A_CONTEXT, p);
	CHECK(c == NULL, "pool memory: CONTEXT NULL (measured)");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_BUFFER_ID, d), INVALID_VALUE, "set BUFFER_ID: INVALID_VALUE");

	/* pool: same VA, new id */
	unsigned long long id = fake_cuda_buffer_id(p);

	fake_cuda_free_async(p);
	uint64_t p2 = fake_cuda_alloc_async(MIB);

	CHECK(p2 == p && fake_cuda_buffer_id(p2) > id, "pool free + alloc: same VA, larger id");
	fake_cuda_free_async(p2);
	fake_cuda_free(d);

	/* context-wide fallback */
	unsigned flags = 0;

	CHECK_EQ(p_cuCtxSetFlags(0x80), SUCCESS, "cuCtxSetFlags(SYNC_MEMOPS)");
	p_cuCtxGetFlags(&flags);
	CHECK_EQ(flags, 0x88, "flags read back (| MAP_HOST, as measured)");
	CHECK_EQ(fake_cuda_ctx_sync_memops_set_count(), 1, "context SYNC_MEMOPS counted");
}

void test_vmm(void)
{
	CUresult rc;
	unsigned one = 1;
	uint64_t va = fake_cuda_vmm_reserve(8 * MIB);

	CHECK(va && va % (2 * MIB) == 0, "vmm reserve");
	CHECK_EQ(fake_cuda_vmm_map(va, 4 * MIB), 0, "vmm map 4 MiB");
	CHECK_EQ(fake_cuda_vmm_map(va + 4 * MIB, 2 * MIB), 0, "vmm map 2 MiB");
	CHECK_EQ(fake_cuda_vmm_map(va + 2 * MIB, 2 * MIB), -EINVAL, "overlapping map refused");
	CHECK_EQ(fake_cuda_vmm_map(va + MIB, 2 * MIB), -EINVAL, "unaligned map refused");
	unsigned long long id = bufid(va + 4096, &rc);

	CHECK(rc == SUCCESS && id > 0, "VMM memory has a BUFFER_ID");
	CHECK(bufid(va + 4 * MIB, &rc) != id, "each mapping has its own id");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, va), NOT_SUPPORTED,
		 "SYNC_MEMOPS on VMM memory: NOT_SUPPORTED");
	unsigned int memtype = 0;

	p_cuPointerGetAttribute(&memtype, A_MEMORY_TYPE, va);
	CHECK_EQ(memtype, 2, "VMM: MEMORY_TYPE DEVICE");
	CUdeviceptr start = 0, mbase = 0;
	size_t size = 0, msize = 0;

	p_cuPointerGetAttribute(&start, A_RANGE_START, va + 4 * MIB + 8);
	p_cuPointerGetAttribute(&size, A_RANGE_SIZE, va + 4 * MIB + 8);
	CHECK(start == va && size == 8 * MIB, "VMM: RANGE_* = the reservation (measured)");
	p_cuPointerGetAttribute(&mbase, A_MAPPING_BASE, va + 4 * MIB + 8);
	p_cuPointerGetAttribute(&msize, A_MAPPING_SIZE, va + 4 * MIB + 8);
	CHECK(mbase == va + 4 * MIB && msize == 2 * MIB, "VMM: MAPPING_* = the mapping");
	bufid(va + 7 * MIB, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "unmapped part of a reservation: INVALID_VALUE");

	int fd = -1;

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, va, 6 * MIB, 1, 0), SUCCESS,
		 "dma-buf across two mappings");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, va, 8 * MIB, 1, 0), INVALID_VALUE,
		 "dma-buf into unmapped VA");

	CHECK_EQ(fake_cuda_vmm_unmap(va, 2 * MIB), -EINVAL, "partial unmap refused");
	CHECK_EQ(fake_cuda_vmm_free(va, 8 * MIB), -EBUSY, "free with live mappings refused");
	CHECK_EQ(fake_cuda_vmm_unmap(va, 4 * MIB), 0, "unmap");
	bufid(va + 4096, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "unmapped: INVALID_VALUE");
	uint64_t vgen = fake_cuda_phys_gen(va + 4 * MIB);

	CHECK_EQ(fake_cuda_phys_gen(va), 0, "phys_gen: unmapped VMM range: 0");
	CHECK_EQ(fake_cuda_vmm_map(va, 4 * MIB), 0, "remap");
	CHECK(fake_cuda_phys_gen(va) != 0 && fake_cuda_phys_gen(va) != vgen, "phys_gen: remapped");
	CHECK(bufid(va + 4096, &rc) > id && rc == SUCCESS, "remap at the same VA: new, larger id");
	CHECK_EQ(fake_cuda_vmm_unmap(va, 6 * MIB), 0, "unmap two mappings at once");
	CHECK_EQ(fake_cuda_vmm_free(va, 8 * MIB), 0, "vmm free");
}

void test_dmabuf(void)
{
	int base = fake_cuda_open_dmabufs();
	uint64_t a, b;

	fake_cuda_force_new_va(true); /* fresh VA: the two chunks are adjacent */
	a = fake_cuda_alloc(2 * MIB);
	b = fake_cuda_alloc(2 * MIB);
	fake_cuda_force_new_va(false);
	int fd = -1, fd2 = -1;
	uint64_t va = 0, size = 0;
	struct stat st;

	CHECK(base >= 0, "open_dmabufs works (%d)", base);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 2 * MIB, 1, 0), SUCCESS, "export 2 MiB");
	CHECK(fd >= 0, "a real fd");
	CHECK_EQ(fake_cuda_open_dmabufs(), base + 1, "one fake dma-buf open");
	CHECK(fake_cuda_dmabuf_range(fd, &va, &size) == 0 && va == a && size == 2 * MIB,
	      "dmabuf_range gives the exported range");
	CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == 2 * MIB, "dma-buf fd has the range's size");
	CHECK_EQ(b, a + 2 * MIB, "fresh 2 MiB allocations are adjacent");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd2, a, 4 * MIB, 1, 0), SUCCESS,
		 "export 4 MiB over two adjacent 2 MiB allocations");
	close(fd2);
	close(fd);
	CHECK_EQ(fake_cuda_open_dmabufs(), base, "closed: count back");
	CHECK_EQ(fake_cuda_dmabuf_range(0, &va, &size), -EINVAL, "stdin is not a fake dma-buf");

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a + 512, 4096, 1, 0), INVALID_VALUE, "unaligned VA");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4096 + 512, 1, 0), INVALID_VALUE, "unaligned size");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 0, 1, 0), INVALID_VALUE, "size 0");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4096, 2, 0), INVALID_VALUE, "handle type 2");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4096, 1, 1), NOT_SUPPORTED, "flags 1");
	fake_cuda_free(b);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 4 * MIB, 1, 0), INVALID_VALUE,
		 "range over a freed chunk");
	fake_cuda_free(a);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, a, 2 * MIB, 1, 0), INVALID_VALUE, "freed");

	/* small allocations: by VA range, not by allocation (measured) */
	uint64_t s1 = fake_cuda_alloc(4096), s2 = fake_cuda_alloc(4096), s3 = fake_cuda_alloc(4096);

	CHECK_EQ(s1 % (2 * MIB), 0, "first small allocation at a chunk start");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1, 65536, 1, 0), SUCCESS,
		 "the 64 KiB page holding small allocations");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1, 8192, 1, 0), SUCCESS, "8 KiB over two allocations");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1 + 5 * 4096, 4096, 1, 0), INVALID_VALUE,
		 "a page with no allocation in it");
	fake_cuda_free(s2);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s2, 4096, 1, 0), INVALID_VALUE, "a freed small buffer");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s1, 3 * 4096, 1, 0), SUCCESS, "over a freed hole");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s2, 2 * 4096, 1, 0), SUCCESS,
		 "starting in a freed buffer, covering a live one (measured)");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, s3 + 4096, 2 * MIB - 4 * 4096, 1, 0), INVALID_VALUE,
		 "free space after the last buffer of a chunk");
	uint64_t big = fake_cuda_alloc(3 * MIB);

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, big + 3 * MIB, MIB, 1, 0), INVALID_VALUE,
		 "the unused tail of a 3 MiB buffer's chunk (measured)");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, big + 2 * MIB, 2 * MIB, 1, 0), SUCCESS,
		 "a 3 MiB buffer's last 1 MiB plus its chunk's tail (measured)");
	close(fd);
	fake_cuda_free(big);
	uint64_t gen = fake_cuda_phys_gen(s1);

	CHECK(gen != 0 && fake_cuda_phys_gen(s1 + MIB) == gen, "phys_gen: per chunk, free space too");
	s2 = fake_cuda_alloc(4096);
	CHECK_EQ(fake_cuda_phys_gen(s2), gen, "phys_gen: reallocated in a live chunk: same pages");
	fake_cuda_free(s1);
	fake_cuda_free(s2);
	fake_cuda_free(s3);
	CHECK_EQ(fake_cuda_phys_gen(s1), 0, "phys_gen: released chunk: 0");
	s1 = fake_cuda_alloc(4096);
	CHECK(fake_cuda_phys_gen(s1) != 0 && fake_cuda_phys_gen(s1) != gen,
	      "phys_gen: new chunk at the same VA: new generation");
	fake_cuda_free(s1);

	void *h = fake_cuda_alloc_host(8192);
	uint64_t m = fake_cuda_alloc_managed(2 * MIB);

	CHECK(fake_cuda_phys_gen(h2u(h)) == 0 && fake_cuda_phys_gen(m) == 0,
	      "phys_gen: 0 for host and managed memory");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, h2u(h), 8192, 1, 0), INVALID_VALUE, "host memory");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, m, 2 * MIB, 1, 0), INVALID_VALUE, "managed memory");
	fake_cuda_free_host(h);
	fake_cuda_free(m);

	uint64_t p = fake_cuda_alloc_async(2 * MIB);
	struct fake_cuda_alloc_info pi = { 0 };

	fake_cuda_alloc_info(p, &pi);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, pi.chunk_va, pi.chunk_size, 1, 0), SUCCESS,
		 "pool memory: its whole chunk");
	close(fd);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, pi.chunk_va, 2 * MIB, 1, 0), INVALID_VALUE,
		 "pool memory: part of a chunk is refused (H200)");
	fake_cuda_set_device_attr(124, 0);
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, pi.chunk_va, pi.chunk_size, 1, 0), NOT_SUPPORTED,
		 "DMA_BUF_SUPPORTED 0: NOT_SUPPORTED");
	fake_cuda_set_device_attr(124, 1);
	fake_cuda_free_async(p);
	CHECK_EQ(fake_cuda_open_dmabufs(), base, "no fake dma-buf left open");
}
