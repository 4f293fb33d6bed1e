/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's allocations: sub-allocation of shared chunks, allocations of their own
 * chunks, frees and the free observer, the control API's allocations and frees, and the
 * allocation and free entry points (the pool's: fake_cuda_pool.c; VMM: fake_cuda_vmm.c).
 *
 * Measured on an H100, driver 580.159.04, CUDA 13.0 (probes run for the fake driver, fake_cuda.c),
 * and simulated:
 *  - cuMemAlloc: sizes are rounded to 512 bytes and sub-allocated first-fit (1 and 100 bytes: 512
 *    apart, 513: 1024, 4096: 4096, 5000: 5120, 64 KiB: 64 KiB apart and not 64 KiB aligned); 1 MiB
 *    was still sub-allocated, 2 MiB - 4 KiB and more got their own 2 MiB-aligned chunks. Freeing
 *    a small buffer and allocating any size that fits gives its VA back (first fit); a 4 MiB
 *    free + alloc gave the same VA 20 of 20 times. RANGE_SIZE and cuMemGetAddressRange give the
 *    requested size. cuMemAlloc(0): CUDA_ERROR_INVALID_VALUE. (Not simulated: the driver also
 *    places small buffers in the unused tail of a large buffer's last chunk.)
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_internal.h"

static uint64_t g_next_id = 1000; /* BUFFER_IDs: never reset */
uint64_t g_last_id;
static fake_cuda_free_observer_t g_observer;
static void *g_observer_arg;

/* ---- Units of shared chunks ---------------------------------------------------------------- */

static bool bm_test(const struct chunk *c, unsigned i)
{
	return c->bitmap[i / 64] >> (i % 64) & 1;
}

static void bm_set(struct chunk *c, unsigned first, unsigned n, bool on)
{
	for (unsigned i = first; i < first + n; i++) {
		if (on)
			c->bitmap[i / 64] |= 1ull << (i % 64);
		else
			c->bitmap[i / 64] &= ~(1ull << (i % 64));
	}
}

/* First run of n free units at or after `from`, or -1. */
static long bm_find(const struct chunk *c, unsigned n, unsigned from)
{
	unsigned run = 0;

	for (unsigned i = from; i < UNITS_PER_CHUNK; i++) {
		if (bm_test(c, i))
			run = 0;
		else if (++run == n)
			return (long)(i + 1 - n);
	}
	return -1;
}

/* ---- Allocations ---------------------------------------------------------------------------- */

struct alloc *alloc_new(int kind, uint64_t va, uint64_t size, struct chunk *c, unsigned first,
			unsigned n)
{
	struct alloc *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	a->sp = (struct span){ va, size };
	a->kind = kind;
	a->dev = c->dev;
	a->ctx = c->ctx;
	a->chunk = c;
	a->first_unit = first;
	a->nunits = n;
	if (vec_insert(&g_allocs, a)) {
		free(a);
		return NULL;
	}
	a->id = g_last_id = g_next_id++;
	c->live++;
	return a;
}

uint64_t do_alloc(int kind, uint64_t size, int dev, CUcontext ctx)
{
	if (size == 0 || size > ARENA_SIZE || dev < 0 || dev >= g_ndevices)
		return 0;
	if (kind == FAKE_CUDA_KIND_POOL)
		return pool_alloc(dev, size);
	ctx_used(ctx, dev);
	if (size <= FAKE_CUDA_SUBALLOC_MAX) {
		unsigned n = (unsigned)((size + UNIT - 1) / UNIT);

		for (size_t i = 0; i < g_chunks.n; i++) {
			struct chunk *c = (struct chunk *)g_chunks.v[i];

			if (c->kind != kind || c->dev != dev || c->ctx != ctx || !c->shared ||
			    c->free_units < n)
				continue;
			long at = bm_find(c, n, g_force_new_va ? c->hiwater : 0);

			if (at < 0)
				continue;
			struct alloc *a = alloc_new(kind, c->sp.va + (uint64_t)at * UNIT, size, c,
						    (unsigned)at, n);

			if (!a)
				return 0;
			bm_set(c, (unsigned)at, n, true);
			c->free_units -= n;
			if ((unsigned)at + n > c->hiwater)
				c->hiwater = (unsigned)at + n;
			return a->sp.va;
		}
		uint64_t va = va_get(CHUNK);

		if (!va)
			return 0;
		struct chunk *c = chunk_create(kind, va, CHUNK, true, NULL, dev, ctx);

		if (!c) {
			va_put(va, CHUNK);
			return 0;
		}
		struct alloc *a = alloc_new(kind, va, size, c, 0, n);

		if (!a) {
			chunk_release(c);
			return 0;
		}
		bm_set(c, 0, n, true);
		c->free_units -= n;
		c->hiwater = n;
		return va;
	}

	uint64_t csize = (size + CHUNK - 1) & ~(CHUNK - 1);
	uint64_t va = va_get(csize);

	if (!va)
		return 0;
	struct chunk *c = chunk_create(kind, va, csize, false, NULL, dev, ctx);

	if (!c) {
		va_put(va, csize);
		return 0;
	}
	if (!alloc_new(kind, va, size, c, 0, 0)) {
		chunk_release(c);
		return 0;
	}
	return va;
}

/* Drop one allocation; the lock is held. Records it in *fr for the observer. */
void do_free(struct alloc *a, struct freed *fr)
{
	struct chunk *c = a->chunk;

	if (fr)
		*fr = (struct freed){ a->sp.va, a->sp.size, a->id, a->kind };
	vec_remove(&g_allocs, a);
	if (a->kind == FAKE_CUDA_KIND_POOL) {
		pool_free(a);
		free(a);
		return;
	}
	if (a->kind == FAKE_CUDA_KIND_IPC)
		ipc_forget(a);
	if (c->shared) {
		bm_set(c, a->first_unit, a->nunits, false);
		c->free_units += a->nunits;
	}
	free(a);
	if (--c->live == 0) {
		if (c->resv)
			c->resv->nmaps--;
		chunk_release(c);
	}
}

void notify(const struct freed *fr)
{
	fake_cuda_free_observer_t cb;
	void *arg;

	lock();
	cb = g_observer;
	arg = g_observer_arg;
	unlock();
	if (cb)
		cb(fr->va, fr->size, fr->id, fr->kind, arg);
}

struct alloc *find_alloc(uint64_t addr)
{
	return vec_find(&g_allocs, addr);
}

/* Free the allocation starting at va if its kind is allowed. 0 or -EINVAL. */
int free_kind(uint64_t va, unsigned kinds_mask)
{
	struct freed fr;
	struct alloc *a;

	lock();
	a = find_alloc(va);
	if (!a || a->sp.va != va || !(kinds_mask & (1u << a->kind))) {
		unlock();
		return -EINVAL;
	}
	do_free(a, &fr);
	unlock();
	notify(&fr);
	return 0;
}

/* A control function's allocation: in ctx (NULL: the current context, else device 0's primary),
 * on its device; POOL: on dev (-1: the current context's device, else 0). */
static uint64_t alloc_kind(int kind, size_t size, int dev, CUcontext ctx)
{
	uint64_t va;

	if (!ctx)
		ctx = control_ctx();
	if (dev < 0)
		dev = ctx->dev;
	lock();
	va = do_alloc(kind, size, dev, kind == FAKE_CUDA_KIND_POOL ? NULL : ctx);
	unlock();
	return va;
}

/* ---- Control API: allocations --------------------------------------------------------------- */

EXPORT uint64_t fake_cuda_alloc(size_t size)
{
	return alloc_kind(FAKE_CUDA_KIND_DEVICE, size, -1, NULL);
}

EXPORT uint64_t fake_cuda_alloc_on(int dev, size_t size)
{
	if (dev < 0 || dev >= FAKE_CUDA_MAX_DEVICES)
		return 0;
	return alloc_kind(FAKE_CUDA_KIND_DEVICE, size, dev, &g_primary[dev]);
}

EXPORT uint64_t fake_cuda_alloc_async_on(int dev, size_t size)
{
	if (dev < 0 || dev >= FAKE_CUDA_MAX_DEVICES)
		return 0;
	return alloc_kind(FAKE_CUDA_KIND_POOL, size, dev, &g_primary[dev]);
}

EXPORT int fake_cuda_free(uint64_t va)
{
	return free_kind(va, K(DEVICE) | K(POOL) | K(MANAGED));
}

EXPORT uint64_t fake_cuda_alloc_async(size_t size)
{
	return alloc_kind(FAKE_CUDA_KIND_POOL, size, -1, NULL);
}

EXPORT int fake_cuda_free_async(uint64_t va)
{
	return free_kind(va, K(DEVICE) | K(POOL));
}

EXPORT uint64_t fake_cuda_alloc_managed(size_t size)
{
	return alloc_kind(FAKE_CUDA_KIND_MANAGED, size, -1, NULL);
}

EXPORT void *fake_cuda_alloc_host(size_t size)
{
	return (void *)(uintptr_t)alloc_kind(FAKE_CUDA_KIND_HOST, size, -1, NULL);
}

EXPORT int fake_cuda_free_host(void *p)
{
	return free_kind((uint64_t)(uintptr_t)p, K(HOST));
}

EXPORT void fake_cuda_set_free_observer(fake_cuda_free_observer_t cb, void *arg)
{
	lock();
	g_observer = cb;
	g_observer_arg = arg;
	unlock();
}

/* The lock is held. */
void alloc_reset(void)
{
	while (g_allocs.n)
		do_free((struct alloc *)g_allocs.v[g_allocs.n - 1], NULL);
	g_observer = NULL;
	g_observer_arg = NULL;
}

/* ---- Entry points --------------------------------------------------------------------------- */

/* An entry point's allocation, in the current context, on its device (POOL: on dev, or the
 * current context's device when dev < 0). */
CUresult entry_alloc(int kind, CUdeviceptr *dptr, size_t size, int dev)
{
	CUcontext ctx = current_ctx();
	uint64_t va;

	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	*dptr = 0;
	if (!ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	va = alloc_kind(kind, size, dev, ctx);
	if (!va)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*dptr = va;
	return CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAlloc_v2)(CUdeviceptr *dptr, size_t bytesize)
{
	ENTER(cuMemAlloc_v2, true);
	return entry_alloc(FAKE_CUDA_KIND_DEVICE, dptr, bytesize, -1);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemFree_v2)(CUdeviceptr dptr)
{
	ENTER(cuMemFree_v2, true);
	return fake_cuda_free(dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Copies between host memory and fake device memory, which the CPU can reach: the range must lie
 * in one live allocation, as the real driver requires of a device pointer range. */
static CUresult copy_check(CUdeviceptr d, size_t n)
{
	struct alloc *a;
	CUresult rc = CUDA_SUCCESS;

	lock();
	a = find_alloc(d);
	if (!a || !(kind_is_gpu(a->kind) || a->kind == FAKE_CUDA_KIND_IPC) ||
	    d + n > a->sp.va + a->sp.size)
		rc = CUDA_ERROR_INVALID_VALUE;
	unlock();
	return rc;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	CUresult rc;

	ENTER(cuMemcpyHtoD_v2, true);
	rc = copy_check(dst, n);
	if (!rc)
		memcpy((void *)(uintptr_t)dst, src, n);
	return rc;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	CUresult rc;

	ENTER(cuMemcpyDtoH_v2, true);
	rc = copy_check(src, n);
	if (!rc)
		memcpy(dst, (const void *)(uintptr_t)src, n);
	return rc;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocHost_v2)(void **pp, size_t bytesize)
{
	CUdeviceptr d;
	CUresult rc;

	ENTER(cuMemAllocHost_v2, true);
	if (!pp)
		return CUDA_ERROR_INVALID_VALUE;
	rc = entry_alloc(FAKE_CUDA_KIND_HOST, &d, bytesize, -1);
	*pp = (void *)(uintptr_t)d;
	return rc;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemFreeHost)(void *p)
{
	ENTER(cuMemFreeHost, true);
	return fake_cuda_free_host(p) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocManaged)(CUdeviceptr *dptr, size_t bytesize,
						  unsigned int flags)
{
	ENTER(cuMemAllocManaged, true);
	if (flags != 1 && flags != 2) /* CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST */
		return CUDA_ERROR_INVALID_VALUE;
	return entry_alloc(FAKE_CUDA_KIND_MANAGED, dptr, bytesize, -1);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocAsync)(CUdeviceptr *dptr, size_t bytesize,
						CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemAllocAsync, true);
	return entry_alloc(FAKE_CUDA_KIND_POOL, dptr, bytesize, -1);
}

/* The stream is not simulated: the allocation is gone at the call, whatever its stream still has
 * to run, as the real driver answers (docs/FACTS.md, "Stream-ordered frees": BUFFER_ID, RANGE and
 * the export fail at once, and the next cuMemAllocAsync on the stream may get the VA back). */
ENTRY_EXPORT CUresult ENTRY_FN(cuMemFreeAsync)(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemFreeAsync, true);
	return fake_cuda_free_async(dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize,
						     CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemAllocAsync_ptsz, true);
	return entry_alloc(FAKE_CUDA_KIND_POOL, dptr, bytesize, -1);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemFreeAsync_ptsz)(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemFreeAsync_ptsz, true);
	return fake_cuda_free_async(dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
