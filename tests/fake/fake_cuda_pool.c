/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's stream-ordered pools (cuMemAllocAsync, cuMemAllocFromPoolAsync of a
 * device's default pool) and the dma-buf export rule, with the memory an open dma-buf keeps.
 *
 * Measured on two H200s, driver API 13000 (issue 11 probe tests/gpu/probes/mem_probe.c, "pool"),
 * and simulated:
 *  - The pool maps physical memory in 32 MiB chunks (FAKE_CUDA_POOL_CHUNK_SIZE):
 *    MAPPING_BASE_ADDR / MAPPING_SIZE at an address are the chunk holding it (a 1 MiB allocation
 *    at a chunk start: [chunk, +32 MiB)). Small allocations share a chunk, packed (four 64 KiB
 *    allocations at chunk +0, +64 KiB, +128 KiB, +192 KiB). A large allocation spans consecutive
 *    chunks, each its own physical chunk (own MAPPING, own phys generation, own P2P provider
 *    id); under a mixed-size churn some allocations straddle a chunk boundary.
 *  - RANGE_START_ADDR / RANGE_SIZE = the allocation; CONTEXT NULL, IS_GPU_DIRECT_RDMA_CAPABLE 0,
 *    MEMPOOL_HANDLE the pool, MEMORY_TYPE DEVICE, DEVICE_ORDINAL the pool's device, SYNC_MEMOPS
 *    set succeeds (fake_cuda_attr.c). A default pool and an explicit one behave alike.
 *  - Release threshold 0: a chunk that holds no allocation any more is released (here at free
 *    time: the fake has no streams); the next allocation there gets the same VA, a new BUFFER_ID
 *    and new physical memory (a new phys generation).
 *  - dma-buf export of pool memory succeeds only for whole chunks: [start, end) must start at a
 *    chunk start and end at a chunk end of consecutive live pool chunks (the cover of the chunks an
 *    allocation spans exported in 100 % of 19,200 tries; its exact 64 KiB-aligned cover in ~6 %:
 *    the fake refuses it always, CUDA_ERROR_INVALID_VALUE). One chunk shared by small
 *    allocations exports whole, free parts included.
 *  - An open dma-buf of a chunk keeps that chunk's memory allocated after its allocations are
 *    freed and the pool trimmed (free memory exactly 32 MiB lower) until the dma-buf is closed,
 *    while the VA is reused at once: fake_cuda_dmabuf_held_bytes() reports such memory.
 * Chosen (not measured): allocations are rounded to 512 bytes (FAKE_CUDA_SUBALLOC_UNIT) and
 * placed first fit in the device's pool region (FAKE_CUDA_POOL_REGION of VA, taken on first use):
 * the unit cuMemAlloc was measured to use, and the harder case for a cache (several allocations
 * in one 4 KiB page); the 64 KiB packing measured is the same under both. Assumed: the memory an
 * open dma-buf holds is held for DEVICE and VMM chunks too (docs/FACTS.md, "dma-buf and freed
 * memory", measured it for cuMemFree).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cuda_internal.h"

#define POOL_SLOTS (FAKE_CUDA_POOL_REGION / POOL_CHUNK)

struct pool {
	uint64_t base; /* 0 until first use */
	uint64_t top;  /* end of the highest allocation made since the reset (force-new-VA) */
	struct span *ext; /* free extents, sorted, coalesced */
	size_t next, capext;
	struct chunk *ch[POOL_SLOTS];
};

static struct pool g_pools[FAKE_CUDA_MAX_DEVICES];

/* Memory of GPU chunks that open fake dma-bufs cover: one entry per chunk per export. */
struct held {
	ino_t ino;    /* the dma-buf memfd's inode */
	uint64_t gen; /* the chunk's block id (phys generation) */
	uint64_t size;
};

static struct held *g_held;
static size_t g_nheld, g_capheld;

static int ext_insert_at(struct pool *p, size_t i, uint64_t va, uint64_t size)
{
	if (p->next == p->capext) {
		size_t cap = p->capext ? p->capext * 2 : 16;
		struct span *n = realloc(p->ext, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		p->ext = n;
		p->capext = cap;
	}
	memmove(&p->ext[i + 1], &p->ext[i], (p->next - i) * sizeof(*p->ext));
	p->ext[i] = (struct span){ va, size };
	p->next++;
	return 0;
}

static void ext_remove_at(struct pool *p, size_t i)
{
	memmove(&p->ext[i], &p->ext[i + 1], (p->next - i - 1) * sizeof(*p->ext));
	p->next--;
}

/* Give [va, va+size) back to the free extents, merging with its neighbours. */
static void ext_put(struct pool *p, uint64_t va, uint64_t size)
{
	size_t i = 0;

	while (i < p->next && p->ext[i].va < va)
		i++;
	if (i > 0 && p->ext[i - 1].va + p->ext[i - 1].size == va) {
		p->ext[i - 1].size += size;
		if (i < p->next && va + size == p->ext[i].va) {
			p->ext[i - 1].size += p->ext[i].size;
			ext_remove_at(p, i);
		}
		return;
	}
	if (i < p->next && va + size == p->ext[i].va) {
		p->ext[i].va = va;
		p->ext[i].size += size;
		return;
	}
	(void)ext_insert_at(p, i, va, size); /* on ENOMEM the VA leaks: harmless */
}

/* First fit (above p->top when VAs must not be reused). Returns the VA or 0. */
static uint64_t ext_take(struct pool *p, uint64_t n)
{
	for (size_t i = 0; i < p->next; i++) {
		uint64_t start = p->ext[i].va, end = start + p->ext[i].size;

		if (g_force_new_va && start < p->top)
			start = p->top;
		if (start >= end || end - start < n)
			continue;
		if (start == p->ext[i].va) {
			p->ext[i].va += n;
			p->ext[i].size -= n;
			if (!p->ext[i].size)
				ext_remove_at(p, i);
		} else {
			p->ext[i].size = start - p->ext[i].va;
			if (end > start + n && ext_insert_at(p, i + 1, start + n, end - start - n))
				return 0;
		}
		return start;
	}
	return 0;
}

static bool pool_ready(struct pool *p)
{
	uint64_t va;

	if (p->base)
		return true;
	va = va_get(FAKE_CUDA_POOL_REGION + POOL_CHUNK);
	if (!va)
		return false;
	p->base = (va + POOL_CHUNK - 1) & ~(POOL_CHUNK - 1);
	if (ext_insert_at(p, 0, p->base, FAKE_CUDA_POOL_REGION)) {
		p->base = 0;
		return false;
	}
	return true;
}

/* Release the chunks [first, last] that no allocation uses. */
static void pool_trim(struct pool *p, size_t first, size_t last)
{
	for (size_t i = first; i <= last; i++) {
		if (p->ch[i] && !p->ch[i]->live) {
			chunk_release(p->ch[i]);
			p->ch[i] = NULL;
		}
	}
}

uint64_t pool_alloc(int dev, uint64_t size)
{
	struct pool *p = &g_pools[dev];
	uint64_t n = (size + UNIT - 1) / UNIT * UNIT, va;
	size_t first, last;
	struct alloc *a;

	if (n > FAKE_CUDA_POOL_REGION || !pool_ready(p))
		return 0;
	va = ext_take(p, n);
	if (!va)
		return 0;
	first = (va - p->base) / POOL_CHUNK;
	last = (va + n - 1 - p->base) / POOL_CHUNK;
	for (size_t i = first; i <= last; i++) {
		if (p->ch[i])
			continue;
		p->ch[i] = chunk_create(FAKE_CUDA_KIND_POOL, p->base + i * POOL_CHUNK, POOL_CHUNK,
					false, NULL, dev, NULL);
		if (!p->ch[i])
			goto err;
		p->ch[i]->pooled = true;
	}
	a = alloc_new(FAKE_CUDA_KIND_POOL, va, size, p->ch[first], 0, (unsigned)(n / UNIT));
	if (!a)
		goto err;
	for (size_t i = first + 1; i <= last; i++)
		p->ch[i]->live++;
	if (va + n > p->top)
		p->top = va + n;
	return va;

err:
	pool_trim(p, first, last);
	ext_put(p, va, n);
	return 0;
}

void pool_free(struct alloc *a)
{
	struct pool *p = &g_pools[a->dev];
	uint64_t n = (uint64_t)a->nunits * UNIT;
	size_t first = (a->sp.va - p->base) / POOL_CHUNK;
	size_t last = (a->sp.va + n - 1 - p->base) / POOL_CHUNK;

	for (size_t i = first; i <= last; i++)
		p->ch[i]->live--;
	pool_trim(p, first, last);
	ext_put(p, a->sp.va, n);
}

void pool_reset(void)
{
	for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
		struct pool *p = &g_pools[d];

		memset(p->ch, 0, sizeof(p->ch)); /* every chunk is gone with the allocations */
		p->top = 0;
	}
}

/* Whether a live GPU allocation overlaps [va, va+size). */
static bool range_has_gpu_alloc(uint64_t va, uint64_t size)
{
	size_t i = vec_upper(&g_allocs, va + size - 1);

	while (i-- > 0) {
		const struct alloc *a = (const struct alloc *)g_allocs.v[i];

		if (a->sp.va + a->sp.size <= va)
			return false; /* disjoint and sorted: all the rest end below va too */
		if (kind_is_gpu(a->kind))
			return true;
	}
	return false;
}

CUresult export_check(uint64_t va, uint64_t size)
{
	const struct chunk *c = vec_find(&g_chunks, va);
	uint64_t end = va + size;
	int dev = c ? c->dev : control_ctx()->dev;

	if (!g_devattr[dev][DEVATTR_DMA_BUF_SUPPORTED])
		return CUDA_ERROR_NOT_SUPPORTED;
	/* Every byte in live DEVICE, POOL or VMM chunks (H100, fake_cuda_attr.c), pool chunks whole. */
	for (uint64_t p = va; p < end; p = c->sp.va + c->sp.size) {
		c = vec_find(&g_chunks, p);
		if (!c || !kind_is_gpu(c->kind))
			return CUDA_ERROR_INVALID_VALUE;
		if (c->pooled && (c->sp.va != p || c->sp.va + c->sp.size > end))
			return CUDA_ERROR_INVALID_VALUE;
	}
	return range_has_gpu_alloc(va, size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

void export_record(int fd, uint64_t va, uint64_t size)
{
	struct stat st;
	size_t j = 0;

	if (fstat(fd, &st))
		return;
	/* An inode number seen again is a new file: the dma-buf it named before was closed. */
	for (size_t i = 0; i < g_nheld; i++)
		if (g_held[i].ino != st.st_ino)
			g_held[j++] = g_held[i];
	g_nheld = j;
	for (uint64_t p = va; p < va + size;) {
		const struct chunk *c = vec_find(&g_chunks, p);

		if (!c)
			return;
		if (g_nheld == g_capheld) {
			size_t cap = g_capheld ? g_capheld * 2 : 16;
			struct held *n = realloc(g_held, cap * sizeof(*n));

			if (!n)
				return;
			g_held = n;
			g_capheld = cap;
		}
		g_held[g_nheld++] = (struct held){ st.st_ino, c->block_id, c->sp.size };
		p = c->sp.va + c->sp.size;
	}
}

static bool gen_live(uint64_t gen)
{
	for (size_t i = 0; i < g_chunks.n; i++)
		if (((const struct chunk *)g_chunks.v[i])->block_id == gen)
			return true;
	return false;
}

/* The inodes of the dma-bufs open now (fake_dmabuf_fds), up to 1024. */
struct open_inodes {
	ino_t ino[1024];
	size_t n;
};

static bool note_inode(const char *path, void *arg)
{
	struct open_inodes *o = arg;
	struct stat st;

	if (!stat(path, &st))
		o->ino[o->n++] = st.st_ino;
	return o->n < sizeof(o->ino) / sizeof(o->ino[0]);
}

EXPORT uint64_t fake_cuda_dmabuf_held_bytes(void)
{
	struct open_inodes o = { .n = 0 };
	size_t j = 0;
	uint64_t bytes = 0;

	if (fake_dmabuf_fds(note_inode, &o) < 0)
		return 0;
	lock();
	for (size_t i = 0; i < g_nheld; i++) {
		bool open = false, seen = false;

		for (size_t k = 0; k < o.n && !open; k++)
			open = o.ino[k] == g_held[i].ino;
		if (!open)
			continue; /* closed: the memory went with it */
		g_held[j++] = g_held[i];
		for (size_t k = 0; k + 1 < j && !seen; k++)
			seen = g_held[k].gen == g_held[i].gen;
		if (!seen && !gen_live(g_held[i].gen))
			bytes += g_held[i].size;
	}
	g_nheld = j;
	unlock();
	return bytes;
}

EXPORT unsigned fake_cuda_pool_chunks(int dev)
{
	unsigned n = 0;

	if (dev < 0 || dev >= FAKE_CUDA_MAX_DEVICES)
		return 0;
	lock();
	for (size_t i = 0; i < POOL_SLOTS; i++)
		n += g_pools[dev].ch[i] != NULL;
	unlock();
	return n;
}

/* ---- Entry points --------------------------------------------------------------------------- */

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuDeviceGetDefaultMemPool, true);
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (dev < 0 || dev >= g_ndevices)
		rc = CUDA_ERROR_INVALID_DEVICE;
	else
		*pool = (CUmemoryPool)(void *)&g_pool_handle[dev];
	unlock();
	return rc;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocFromPoolAsync)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					CUstream hStream)
{
	int dev = -1;

	(void)hStream;
	ENTER(cuMemAllocFromPoolAsync, true);
	lock();
	for (int d = 0; d < g_ndevices; d++)
		if ((void *)pool == (void *)&g_pool_handle[d])
			dev = d;
	unlock();
	if (dev < 0)
		return CUDA_ERROR_INVALID_VALUE; /* only default pools are simulated */
	return entry_alloc(FAKE_CUDA_KIND_POOL, dptr, bytesize, dev);
}
