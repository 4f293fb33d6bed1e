/* SPDX-License-Identifier: MIT */
/*
 * The cache against the real CUDA driver (run on a GPU machine; skips with 77 elsewhere): free and
 * reallocation at the same VA detected; VMM memory classified as device memory with SYNC_MEMOPS set
 * context-wide; managed memory refused; real dma-bufs exported, and closed on staleness and flush;
 * SYNC_MEMOPS set once per allocation; small neighbouring allocations pinned once. No NIC exists on
 * that machine, so no PD is given: the MR paths are proven in the VM on soft-RoCE.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu.h"
#include "gdrcache.h"

static int failed, passed;

#define OK(cond, ...)                                                                   \
	do {                                                                            \
		if (cond) {                                                             \
			passed++;                                                       \
			printf("ok %d - ", passed + failed);                            \
		} else {                                                                \
			failed++;                                                       \
			printf("not ok %d - (%s:%d: %s) ", passed + failed, __FILE__, __LINE__, #cond); \
		}                                                                       \
		printf(__VA_ARGS__);                                                    \
		printf("\n");                                                           \
	} while (0)

#define MiB (1024ULL * 1024)

static struct gdr_cache_stats stats(struct gdr_cache *c)
{
	struct gdr_cache_stats s;

	gdr_cache_get_stats(c, &s);
	return s;
}

static uint64_t buffer_id(CUdeviceptr p)
{
	unsigned long long id = 0;

	return p_cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) ? 0 : id;
}

static int fd_is_dmabuf(int fd)
{
	char path[64], link[128] = "";

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (readlink(path, link, sizeof(link) - 1) < 0)
		return 0;
	return strstr(link, "dmabuf") != NULL;
}

static bool fd_open(int fd)
{
	char path[64], link[128];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return readlink(path, link, sizeof(link)) > 0;
}

static void test_va_reuse(struct gdr_cache *c)
{
	CUdeviceptr a, b;
	struct gdr_region *r;
	uint64_t id, id_a, off;
	int fd = -1, fd2 = -1;
	struct gdr_cache_stats s0 = stats(c), s1;

	p_cuMemAlloc_v2(&a, 4 * MiB);
	id_a = buffer_id(a);
	OK(gdr_reg(c, NULL, (void *)a, 4 * MiB, 0, &r) == 0, "gdr_reg of a 4 MiB cuMemAlloc buffer");
	OK(gdr_region_dmabuf(r, &fd, &off) == 0 && fd_is_dmabuf(fd),
	   "the dmabuf backend exported a real dma-buf (fd %d)", fd);
	gdr_dereg(r);
	p_cuMemFree_v2(a);
	p_cuMemAlloc_v2(&b, 4 * MiB);
	OK(b == a && buffer_id(b) > id_a,
	   "cuMemFree + cuMemAlloc: VA %s, BUFFER_ID %" PRIu64 " -> %" PRIu64,
	   b == a ? "reused" : "NOT reused", id_a, buffer_id(b));
	OK(gdr_reg(c, NULL, (void *)b, 4 * MiB, 0, &r) == 0, "gdr_reg of the new buffer");
	gdr_region_buffer_id(r, &id);
	gdr_region_dmabuf(r, &fd2, &off);
	s1 = stats(c);
	OK(id == buffer_id(b) && s1.stale == s0.stale + 1,
	   "the stale entry was detected and replaced (stale +%" PRIu64 ", id %" PRIu64 ")",
	   s1.stale - s0.stale, id);
	OK(fd == fd2 || !fd_is_dmabuf(fd) || fd_open(fd2),
	   "the old dma-buf was closed before the new one was exported");
	gdr_dereg(r);
	p_cuMemFree_v2(b);
}

static void test_sync_memops_once(struct gdr_cache *c)
{
	CUdeviceptr a;
	struct gdr_region *r;
	unsigned int sync = 0;
	struct gdr_cache_stats s0 = stats(c), s1;

	p_cuMemAlloc_v2(&a, 2 * MiB);
	for (int i = 0; i < 5; i++) {
		gdr_reg(c, NULL, (void *)(a + 4096 * i), 4096, 0, &r);
		gdr_dereg(r);
	}
	gdr_cache_flush(c);
	gdr_reg(c, NULL, (void *)a, 4096, 0, &r); /* a new pin of the same allocation */
	gdr_dereg(r);
	p_cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a);
	s1 = stats(c);
	OK(sync == 1 && s1.sync_memops_set == s0.sync_memops_set + 1 && s1.hits == s0.hits + 4,
	   "SYNC_MEMOPS is set on the allocation (%u) once for 6 registrations, 4 hits", sync);
	p_cuMemFree_v2(a);
}

static void test_small_neighbours(struct gdr_cache *c)
{
	CUdeviceptr a1, a2;
	struct gdr_region *r1, *r2;
	uint64_t b1, l1, b2, l2;
	struct gdr_cache_stats s0 = stats(c), s1;
	int rc1, rc2;

	p_cuMemAlloc_v2(&a1, 4096);
	p_cuMemAlloc_v2(&a2, 4096);
	rc1 = gdr_reg(c, NULL, (void *)a1, 4096, 0, &r1);
	rc2 = gdr_reg(c, NULL, (void *)a2, 4096, 0, &r2);
	OK(!rc1 && !rc2, "two 4 KiB allocations %#llx and %#llx registered (%d, %d)",
	   (unsigned long long)a1, (unsigned long long)a2, rc1, rc2);
	if (!rc1 && !rc2) {
		gdr_region_range(r1, &b1, &l1);
		gdr_region_range(r2, &b2, &l2);
		s1 = stats(c);
		OK(a2 - a1 != 4096 || (b1 == b2 && s1.pins == s0.pins + 1),
		   "neighbours in one 64 KiB page share one pin [%#llx, +%llu)",
		   (unsigned long long)b1, (unsigned long long)l1);
		gdr_dereg(r1);
		gdr_dereg(r2);
	}
	p_cuMemFree_v2(a1);
	p_cuMemFree_v2(a2);
}

static void test_vmm(struct gdr_cache *c)
{
	CUmemAllocationProp prop = { 0 };
	CUmemAccessDesc acc = { 0 };
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	size_t gran = 0, size;
	struct gdr_region *r;
	enum gdr_mem_kind kind = GDR_MEM_HOST;
	struct gdr_cache_stats s0 = stats(c), s1;
	uint64_t id1, id2;
	int fd = -1;
	uint64_t off;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.allocFlags.gpuDirectRDMACapable = 1;
	p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	size = 2 * gran;
	OK(p_cuMemAddressReserve(&va, size, 0, 0, 0) == 0 && p_cuMemCreate(&h, size, &prop, 0) == 0 &&
	   p_cuMemMap(va, size, 0, h, 0) == 0, "VMM: reserve, create and map %zu bytes", size);
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	p_cuMemSetAccess(va, size, &acc, 1);
	id1 = buffer_id(va);
	OK(gdr_reg(c, NULL, (void *)va, size, 0, &r) == 0, "gdr_reg of VMM memory");
	gdr_region_mem_kind(r, &kind);
	gdr_region_dmabuf(r, &fd, &off);
	s1 = stats(c);
	OK(kind == GDR_MEM_VMM, "VMM memory is device memory (kind %d), not host memory", kind);
	OK(s1.sync_memops_ctx + s1.sync_memops_unavailable == s0.sync_memops_ctx +
	   s0.sync_memops_unavailable + 1, "SYNC_MEMOPS fell back to the context flag (ctx %" PRIu64
	   ", unavailable %" PRIu64 ")", s1.sync_memops_ctx, s1.sync_memops_unavailable);
	OK(fd_is_dmabuf(fd), "a dma-buf was exported for VMM memory");
	gdr_dereg(r);
	/* unmap and remap at the same VA: a new BUFFER_ID, detected */
	p_cuMemUnmap(va, size);
	p_cuMemMap(va, size, 0, h, 0);
	p_cuMemSetAccess(va, size, &acc, 1);
	id2 = buffer_id(va);
	OK(gdr_reg(c, NULL, (void *)va, 4096, 0, &r) == 0 && stats(c).stale == s1.stale + 1,
	   "remap at the same VA detected (BUFFER_ID %" PRIu64 " -> %" PRIu64 ")", id1, id2);
	gdr_dereg(r);
	gdr_cache_flush(c);
	p_cuMemUnmap(va, size);
	p_cuMemRelease(h);
	p_cuMemAddressFree(va, size);
}

/* Two mappings in one reservation: each is its own allocation (RANGE_* alone would give the whole
 * reservation, mapped or not: docs/FACTS.md, "VMM memory"), and one registration may span both. */
static void test_vmm_two_mappings(struct gdr_cache *c)
{
	CUmemAllocationProp prop = { 0 };
	CUmemAccessDesc acc = { 0 };
	CUmemGenericAllocationHandle h1, h2;
	CUdeviceptr va;
	size_t gran = 0, half;
	struct gdr_region *r;
	uint64_t base = 0, len = 0;
	int fd = -1, rc;
	uint64_t off;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.allocFlags.gpuDirectRDMACapable = 1;
	p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	half = 2 * gran;
	/* a reservation of three halves: two mapped, the last left unmapped */
	p_cuMemAddressReserve(&va, 3 * half, 0, 0, 0);
	p_cuMemCreate(&h1, half, &prop, 0);
	p_cuMemCreate(&h2, half, &prop, 0);
	p_cuMemMap(va, half, 0, h1, 0);
	p_cuMemMap(va + half, half, 0, h2, 0);
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	p_cuMemSetAccess(va, 2 * half, &acc, 1);

	rc = gdr_reg(c, NULL, (void *)va, 4096, 0, &r);
	if (!rc) {
		gdr_region_range(r, &base, &len);
		gdr_dereg(r);
	}
	OK(!rc && base == va && len == half,
	   "VMM: the pin covers the mapping [%#llx, +%zu), not the reservation (got %d, +%llu)",
	   (unsigned long long)va, half, rc, (unsigned long long)len);
	rc = gdr_reg(c, NULL, (void *)(va + half - 4096), 8192, 0, &r);
	if (!rc) {
		gdr_region_range(r, &base, &len);
		gdr_region_dmabuf(r, &fd, &off);
	}
	OK(!rc && base == va && len == 2 * half && fd_is_dmabuf(fd),
	   "a registration across two mappings: one pin of both, one dma-buf (%d, +%llu)", rc,
	   (unsigned long long)len);
	if (!rc)
		gdr_dereg(r);
	rc = gdr_reg(c, NULL, (void *)(va + 2 * half - 4096), 8192, 0, &r);
	OK(rc == -EINVAL, "a range running into the unmapped part is refused (%d)", rc);
	gdr_cache_flush(c);
	p_cuMemUnmap(va, 2 * half);
	p_cuMemRelease(h1);
	p_cuMemRelease(h2);
	p_cuMemAddressFree(va, 3 * half);
}

struct thread_reg {
	struct gdr_cache *c;
	CUdeviceptr p;
	int rc, had_ctx;
	int fd;
};

static void *reg_without_context(void *arg)
{
	struct thread_reg *t = arg;
	struct gdr_region *r;
	CUcontext cur = NULL;
	uint64_t off;

	p_cuCtxGetCurrent(&cur);
	t->had_ctx = cur != NULL;
	t->rc = gdr_reg(t->c, NULL, (void *)t->p, 4096, 0, &r);
	if (!t->rc) {
		gdr_region_dmabuf(r, &t->fd, &off);
		t->fd = fd_is_dmabuf(t->fd);
		gdr_dereg(r);
	}
	return NULL;
}

/* docs/FACTS.md, "Threads without a context": a thread without a current context cannot export
 * a dma-buf (an MPI progress thread usually has none); the cache borrows the device's primary
 * context. */
static void test_thread_without_context(struct gdr_cache *c)
{
	struct thread_reg t = { .c = c };
	pthread_t th;

	gdr_cache_flush(c);
	p_cuMemAlloc_v2(&t.p, 4 * MiB);
	pthread_create(&th, NULL, reg_without_context, &t);
	pthread_join(th, NULL);
	OK(!t.had_ctx && t.rc == 0 && t.fd,
	   "registration (a miss: dma-buf export) from a thread with no CUDA context (rc %d, context "
	   "%s)", t.rc, t.had_ctx ? "present" : "none");
	gdr_cache_flush(c);
	p_cuMemFree_v2(t.p);
}

static void test_managed_and_host(struct gdr_cache *c)
{
	CUdeviceptr m;
	void *h;
	char *plain = malloc(4096);
	struct gdr_region *r;
	int rc;

	p_cuMemAllocManaged(&m, 2 * MiB, 1 /* CU_MEM_ATTACH_GLOBAL */);
	rc = gdr_reg(c, NULL, (void *)m, 4096, 0, &r);
	OK(rc == -EOPNOTSUPP, "managed memory refused (%d)", rc);
	p_cuMemFree_v2(m);
	p_cuMemAllocHost_v2(&h, 4096);
	rc = gdr_reg(c, NULL, h, 4096, 0, &r);
	OK(rc == -EINVAL, "cuMemAllocHost memory is host memory: without a PD, -EINVAL (%d)", rc);
	p_cuMemFreeHost(h);
	rc = gdr_reg(c, NULL, plain, 4096, 0, &r);
	OK(rc == -EINVAL, "malloc memory without a PD: -EINVAL (%d)", rc);
	free(plain);
}

static void test_flush_closes_dmabufs(struct gdr_cache *c)
{
	CUdeviceptr a;
	struct gdr_region *r;
	int fd = -1;
	uint64_t off;

	p_cuMemAlloc_v2(&a, 8 * MiB);
	gdr_reg(c, NULL, (void *)a, 8 * MiB, 0, &r);
	gdr_region_dmabuf(r, &fd, &off);
	gdr_dereg(r);
	OK(fd_is_dmabuf(fd) && gdr_cache_flush(c) >= 1 && !fd_is_dmabuf(fd),
	   "flush unpins: the dma-buf fd %d is closed", fd);
	p_cuMemFree_v2(a);
}

/* The differential test's core property on the real driver: random allocations, frees and
 * reallocations at reused VAs, random sub-range registrations; every registration names the
 * allocation now at its address, and its pinned range covers the request. */
static void test_random_churn(struct gdr_cache *c, int ops)
{
	enum { N = 32 };
	CUdeviceptr buf[N] = { 0 };
	size_t size[N] = { 0 };
	unsigned seed = 12345;
	int bad = 0, regs = 0, reused = 0;
	struct gdr_cache_stats s0 = stats(c), s1;

	for (int op = 0; op < ops; op++) {
		int i = rand_r(&seed) % N;
		struct gdr_region *r;

		if (!buf[i]) {
			static const size_t sizes[] = { 4096, 65536, 1 << 20, 2 << 20, 4 << 20, 8 << 20 };

			size[i] = sizes[rand_r(&seed) % 6] - (rand_r(&seed) % 2) * 512;
			if (p_cuMemAlloc_v2(&buf[i], size[i]))
				buf[i] = 0;
			continue;
		}
		if (rand_r(&seed) % 4 == 0) {
			CUdeviceptr old = buf[i];

			p_cuMemFree_v2(buf[i]);
			if (p_cuMemAlloc_v2(&buf[i], size[i]))
				buf[i] = 0;
			reused += buf[i] == old;
			continue;
		}
		uint64_t off = rand_r(&seed) % size[i], len = 1 + rand_r(&seed) % (size[i] - off);
		uint64_t base, plen, id;

		if (gdr_reg(c, NULL, (void *)(buf[i] + off), len, 0, &r)) {
			bad++;
			continue;
		}
		regs++;
		gdr_region_buffer_id(r, &id);
		gdr_region_range(r, &base, &plen);
		if (id != buffer_id(buf[i] + off) || base > buf[i] + off ||
		    buf[i] + off + len > base + plen || base % 65536 || plen % 65536)
			bad++;
		gdr_dereg(r);
	}
	s1 = stats(c);
	OK(bad == 0, "random churn: %d ops, %d registrations, %d reallocations at the same VA, "
	   "%" PRIu64 " stale entries caught, %d wrong", ops, regs, reused, s1.stale - s0.stale, bad);
	for (int i = 0; i < N; i++)
		if (buf[i])
			p_cuMemFree_v2(buf[i]);
	gdr_cache_flush(c);
}

int main(void)
{
	char gpu[128] = "";
	struct gdr_cache *c;
	enum gdr_backend be;
	struct gdr_cache_stats s;
	int rc = cu_setup(gpu, sizeof(gpu));

	if (rc)
		return rc;
	printf("# GPU 0: %s; libgdrcache %#x\n", gpu, gdr_cache_version());
	OK(gdr_cache_create(NULL, &c) == 0, "gdr_cache_create");
	gdr_cache_backend(c, &be);
	OK(be == GDR_BACKEND_DMABUF, "auto chose the dmabuf backend (%d): no gdrcache.ko here", be);
	test_va_reuse(c);
	test_sync_memops_once(c);
	test_small_neighbours(c);
	test_vmm(c);
	test_vmm_two_mappings(c);
	test_thread_without_context(c);
	test_managed_and_host(c);
	test_flush_closes_dmabufs(c);
	test_random_churn(c, 20000);
	gdr_cache_get_stats(c, &s);
	printf("# stats: hits %" PRIu64 " misses %" PRIu64 " stale %" PRIu64 " pins %" PRIu64
	       " unpins %" PRIu64 " tag_checks %" PRIu64 " sync_memops %" PRIu64 " ctx %" PRIu64 "\n",
	       s.hits, s.misses, s.stale, s.pins, s.unpins, s.tag_checks, s.sync_memops_set,
	       s.sync_memops_ctx);
	OK(gdr_cache_destroy(c) == 0, "gdr_cache_destroy");
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
