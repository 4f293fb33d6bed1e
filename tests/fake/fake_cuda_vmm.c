/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's VMM model: reservations of VA and the mappings in them (the control API's
 * fake_cuda_vmm_*, which fake_cuda_ipc.c's VMM entry points use), and cuMemUnmap.
 *
 * Measured on an H100, driver 580.159.04, CUDA 13.0 (probes run for the fake driver, fake_cuda.c),
 * and simulated:
 *  - VMM: CONTEXT NULL, RANGE_START_ADDR / RANGE_SIZE = the whole *reservation* (not the mapping),
 *    MAPPING_BASE_ADDR / MAPPING_SIZE and cuMemGetAddressRange = the mapping, SYNC_MEMOPS set:
 *    CUDA_ERROR_NOT_SUPPORTED; unmap + map gives a new BUFFER_ID; a partial cuMemUnmap and a
 *    cuMemAddressFree with a live mapping: CUDA_ERROR_INVALID_VALUE.
 */
#include <errno.h>
#include <stdlib.h>

#include "fake_cuda_internal.h"

EXPORT uint64_t fake_cuda_vmm_reserve(size_t size)
{
	uint64_t rsize = ((uint64_t)size + CHUNK - 1) & ~(CHUNK - 1);
	uint64_t va = 0;

	if (size == 0 || size > ARENA_SIZE)
		return 0;
	lock();
	struct resv *r = calloc(1, sizeof(*r));

	if (r) {
		va = va_get(rsize);
		if (va) {
			r->sp = (struct span){ va, rsize };
			r->asked = size;
			if (vec_insert(&g_resvs, r)) {
				va_put(va, rsize);
				va = 0;
			}
		}
		if (!va)
			free(r);
	}
	unlock();
	return va;
}

/* The lock is held. */
int vmm_map(uint64_t va, uint64_t size, int dev)
{
	int ret = 0;

	if (size == 0 || va % CHUNK || size % CHUNK)
		return -EINVAL;
	struct resv *r = vec_find(&g_resvs, va);

	if (!r || va + size > r->sp.va + r->sp.size || va + size < va) {
		ret = -EINVAL;
		goto out;
	}
	for (uint64_t p = va; p < va + size; p += CHUNK) {
		if (vec_find(&g_chunks, p)) {
			ret = -EINVAL;
			goto out;
		}
	}
	ctx_used(NULL, dev);
	struct chunk *c = chunk_create(FAKE_CUDA_KIND_VMM, va, size, false, r, dev, NULL);

	if (!c) {
		ret = -ENOMEM;
		goto out;
	}
	if (!alloc_new(FAKE_CUDA_KIND_VMM, va, size, c, 0, 0)) {
		chunk_release(c);
		ret = -ENOMEM;
		goto out;
	}
	r->nmaps++;
out:
	return ret;
}

EXPORT int fake_cuda_vmm_map(uint64_t va, size_t size)
{
	CUcontext ctx = control_ctx();
	int ret;

	lock();
	ret = vmm_map(va, size, ctx->dev);
	unlock();
	return ret;
}

EXPORT int fake_cuda_vmm_unmap(uint64_t va, size_t size)
{
	struct freed fr[64];
	unsigned nfr = 0;
	int ret = 0;

	if (size == 0)
		return -EINVAL;
	lock();
	/* Check first: [va, va+size) must be exactly a run of whole mappings. */
	for (uint64_t p = va; p < va + size;) {
		struct alloc *a = find_alloc(p);

		if (!a || a->kind != FAKE_CUDA_KIND_VMM || a->sp.va != p ||
		    a->sp.va + a->sp.size > va + size) {
			ret = -EINVAL;
			goto out;
		}
		p += a->sp.size;
	}
	for (uint64_t p = va; p < va + size;) {
		struct alloc *a = find_alloc(p);
		uint64_t next = p + a->sp.size;

		do_free(a, nfr < 64 ? &fr[nfr++] : NULL);
		p = next;
	}
out:
	unlock();
	for (unsigned i = 0; i < nfr; i++)
		notify(&fr[i]);
	return ret;
}

EXPORT int fake_cuda_vmm_free(uint64_t va, size_t size)
{
	int ret = 0;

	lock();
	struct resv *r = vec_find(&g_resvs, va);

	if (!r || r->sp.va != va || (size != r->sp.size && size != r->asked)) {
		ret = -EINVAL;
	} else if (r->nmaps) {
		ret = -EBUSY;
	} else {
		vec_remove(&g_resvs, r);
		va_put(r->sp.va, r->sp.size);
		free(r);
	}
	unlock();
	return ret;
}

/* The lock is held; every allocation is gone. */
void vmm_reset(void)
{
	while (g_resvs.n) {
		struct resv *r = (struct resv *)g_resvs.v[g_resvs.n - 1];

		vec_remove(&g_resvs, r);
		va_put(r->sp.va, r->sp.size);
		free(r);
	}
}

/* ---- Entry point ---------------------------------------------------------------------------- */

ENTRY_EXPORT CUresult ENTRY_FN(cuMemUnmap)(CUdeviceptr ptr, size_t size)
{
	ENTER(cuMemUnmap, true);
	return fake_cuda_vmm_unmap(ptr, size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
