/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's answers about pointers: pointer attributes, address ranges, dma-buf export
 * by address range (the export rule itself: fake_cuda_pool.c), and the control API's inspection of
 * allocations and of the fake dma-bufs.
 *
 * Measured on an H100, driver 580.159.04, CUDA 13.0 (probes run for the fake driver, fake_cuda.c),
 * and simulated:
 *  - Before cuInit, pointer queries return CUDA_ERROR_NOT_INITIALIZED.
 *  - cuPointerGetAttributes on memory CUDA does not know (malloc, NULL, a freed buffer, an unmapped
 *    VMM address): CUDA_SUCCESS; CONTEXT NULL, MEMORY_TYPE 0, BUFFER_ID 0, IS_MANAGED 0,
 *    DEVICE_ORDINAL -2, MAPPED 0, HOST_POINTER = ptr, DEVICE_POINTER 0, the rest 0, and
 *    RANGE_START_ADDR / RANGE_SIZE left untouched (inside a VMM reservation: the reservation).
 *    cuPointerGetAttribute of any attribute there: CUDA_ERROR_INVALID_VALUE; SYNC_MEMOPS set:
 *    CUDA_ERROR_INVALID_VALUE; cuMemGetAddressRange: CUDA_ERROR_NOT_FOUND.
 *  - Bool attributes are written as 4 bytes. numAttributes 0 or an unknown attribute:
 *    CUDA_ERROR_INVALID_VALUE.
 *  - Managed memory: MEMORY_TYPE DEVICE (2), IS_MANAGED 1, HOST_POINTER = DEVICE_POINTER = ptr,
 *    IS_GPU_DIRECT_RDMA_CAPABLE 0, SYNC_MEMOPS succeeds, dma-buf export fails (INVALID_VALUE).
 *  - cuMemAllocHost: MEMORY_TYPE HOST (1), a BUFFER_ID, CONTEXT the context, RANGE_SIZE the request,
 *    SYNC_MEMOPS succeeds, dma-buf export fails; its VAs come from the same space as device memory.
 *  - Pool (cuMemAllocAsync): CONTEXT NULL, IS_GPU_DIRECT_RDMA_CAPABLE 0, MEMPOOL_HANDLE set,
 *    SYNC_MEMOPS succeeds. Its 32 MiB chunks, their MAPPING attributes and their export rule
 *    (measured on H200s for issue 11): fake_cuda_pool.c.
 *  - Device memory: MAPPING_BASE_ADDR / MAPPING_SIZE = the 2 MiB chunk, MEMORY_BLOCK_ID = the chunk.
 *  - cuMemGetHandleForAddressRange(DMA_BUF_FD): dptr and size multiples of 4096, size > 0, else
 *    INVALID_VALUE; flags != 0: NOT_SUPPORTED; no current context: INVALID_CONTEXT. Export is by
 *    VA range: a range that overlaps no live allocation fails (a freed small buffer's page, free
 *    space after the last buffer of a chunk, the unused tail of a 3 MiB buffer's 4 MiB chunk),
 *    while one that overlaps a live allocation succeeds even when it starts or ends in free space
 *    of live chunks (a 64 KiB range starting in a freed buffer and covering a live one, the whole
 *    2 MiB chunk holding three 4 KiB buffers, a 3 MiB buffer's last 1 MiB plus its chunk's tail)
 *    or spans chunks (4 MiB over two 2 MiB buffers); one running into an unmapped VMM range
 *    fails. Simulated rule: every byte inside live DEVICE, POOL or VMM chunks, and at least one
 *    live DEVICE, POOL or VMM allocation overlapping the range; pool chunks only whole (H200,
 *    fake_cuda_pool.c); the memory's device must have DMA_BUF_SUPPORTED.
 * VMM memory's attributes: fake_cuda_vmm.c.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda_internal.h"

#define DMABUF_NAME "fake-dmabuf"

static uint64_t g_dmabuf_exports;

/* ---- Entry points --------------------------------------------------------------------------- */

/* One attribute of ptr into data. a: the allocation holding ptr, or NULL when unknown (then, in a
 * cuPointerGetAttributes call, the unknown-pointer defaults). The lock is held. */
static CUresult attr_get(const struct alloc *a, uint64_t ptr, int attr, void *data, bool multi)
{
	const struct resv *r = NULL;
	int kind = a ? a->kind : FAKE_CUDA_KIND_NONE;
	bool vmm = kind == FAKE_CUDA_KIND_VMM;
	/* The chunk holding ptr itself: a pool allocation spans several (measured, H200). */
	const struct chunk *c = a ? vec_find(&g_chunks, ptr) : NULL;

	if (!a) {
		if (!multi)
			return CUDA_ERROR_INVALID_VALUE;
		r = vec_find(&g_resvs, ptr);
	} else if (vmm) {
		r = a->chunk->resv;
	}

#define PUT(type, value) (*(type *)data = (type)(value))
	switch (attr) {
	case ATTR_CONTEXT:
		PUT(CUcontext, a ? a->ctx : NULL);
		break;
	case ATTR_MEMORY_TYPE:
		PUT(unsigned int, !a ? 0 : kind == FAKE_CUDA_KIND_HOST ? MEMORYTYPE_HOST
								   : MEMORYTYPE_DEVICE);
		break;
	case ATTR_DEVICE_POINTER:
		if (a && !has_context()) {
			if (!multi)
				return CUDA_ERROR_INVALID_CONTEXT;
			a = NULL;
		}
		PUT(CUdeviceptr, a ? ptr : 0);
		break;
	case ATTR_HOST_POINTER:
		if (a && kind != FAKE_CUDA_KIND_HOST && kind != FAKE_CUDA_KIND_MANAGED) {
			if (!multi)
				return CUDA_ERROR_INVALID_VALUE;
			PUT(void *, NULL);
		} else {
			PUT(void *, (uintptr_t)ptr);
		}
		break;
	case ATTR_P2P_TOKENS: {
		struct {
			unsigned long long p2pToken;
			unsigned int vaSpaceToken;
		} *t = data;
		t->p2pToken = c ? c->block_id : 0;
		t->vaSpaceToken = a ? 1 : 0;
		break;
	}
	case ATTR_SYNC_MEMOPS:
		PUT(unsigned int, a && a->sync);
		break;
	case ATTR_BUFFER_ID:
		PUT(unsigned long long, a ? a->id : 0);
		break;
	case ATTR_IS_MANAGED:
		PUT(unsigned int, kind == FAKE_CUDA_KIND_MANAGED);
		break;
	case ATTR_DEVICE_ORDINAL:
		PUT(int, a ? a->dev : -2);
		break;
	case ATTR_IS_LEGACY_CUDA_IPC_CAPABLE:
		PUT(unsigned int, kind == FAKE_CUDA_KIND_DEVICE);
		break;
	case ATTR_RANGE_START_ADDR:
		if (r)
			PUT(CUdeviceptr, r->sp.va);
		else if (a)
			PUT(CUdeviceptr, a->sp.va);
		break; /* unknown pointer: left untouched, as measured */
	case ATTR_RANGE_SIZE:
		if (r)
			PUT(size_t, r->sp.size);
		else if (a)
			PUT(size_t, a->sp.size);
		break;
	case ATTR_MAPPED:
		PUT(unsigned int, a != NULL);
		break;
	case ATTR_ALLOWED_HANDLE_TYPES:
		PUT(unsigned long long, 0);
		break;
	case ATTR_IS_GPU_DIRECT_RDMA_CAPABLE:
		PUT(unsigned int, kind == FAKE_CUDA_KIND_DEVICE || vmm);
		break;
	case ATTR_ACCESS_FLAGS:
		PUT(unsigned int, a ? 3 : 0); /* CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE */
		break;
	case ATTR_MEMPOOL_HANDLE:
		PUT(void *, kind == FAKE_CUDA_KIND_POOL ? &g_pool_handle[a->dev] : NULL);
		break;
	case ATTR_MAPPING_SIZE:
		PUT(size_t, c ? c->sp.size : 0);
		break;
	case ATTR_MAPPING_BASE_ADDR:
		PUT(CUdeviceptr, c ? c->sp.va : 0);
		break;
	case ATTR_MEMORY_BLOCK_ID:
		PUT(unsigned long long, c ? c->block_id : 0);
		break;
	case ATTR_IS_HW_DECOMPRESS_CAPABLE:
		PUT(unsigned int, 0);
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
#undef PUT
	return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
	CUresult rc;

	ENTER(cuPointerGetAttribute, true);
	if (!data || attribute < 1 || attribute > ATTR_LAST)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	rc = attr_get(find_alloc(ptr), ptr, attribute, data, false);
	unlock();
	return rc;
}

EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, int *attributes, void **data,
				       CUdeviceptr ptr)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuPointerGetAttributes, true);
	if (numAttributes == 0 || !attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < numAttributes; i++)
		if (attributes[i] < 1 || attributes[i] > ATTR_LAST || !data[i])
			return CUDA_ERROR_INVALID_VALUE;
	lock();
	const struct alloc *a = find_alloc(ptr);

	for (unsigned i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++)
		rc = attr_get(a, ptr, attributes[i], data[i], true);
	unlock();
	return rc;
}

EXPORT CUresult cuPointerSetAttribute(const void *value, int attribute, CUdeviceptr ptr)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuPointerSetAttribute, true);
	if (!value || attribute != ATTR_SYNC_MEMOPS)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	struct alloc *a = find_alloc(ptr);

	if (!a) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (a->kind == FAKE_CUDA_KIND_VMM) {
		rc = CUDA_ERROR_NOT_SUPPORTED;
	} else {
		/* cuda.h: the value is an unsigned int (0 or 1); any value was accepted (measured) */
		a->sync = *(const unsigned int *)value != 0;
		a->sync_count++;
	}
	unlock();
	return rc;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuMemGetAddressRange_v2, true);
	if (!has_context())
		return CUDA_ERROR_INVALID_CONTEXT;
	lock();
	struct alloc *a = find_alloc(dptr);

	if (!a) {
		rc = CUDA_ERROR_NOT_FOUND;
	} else {
		if (pbase)
			*pbase = a->sp.va;
		if (psize)
			*psize = a->sp.size;
	}
	unlock();
	return rc;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemGetHandleForAddressRange)(void *handle, CUdeviceptr dptr,
							       size_t size, int handleType,
							       unsigned long long flags)
{
	CUresult rc = CUDA_SUCCESS;
	char name[80];
	int fd;

	ENTER(cuMemGetHandleForAddressRange, true);
	if (!handle || handleType != DMA_BUF_FD)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!has_context())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (size == 0 || dptr % PAGE || size % PAGE || dptr + size < dptr)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	rc = export_check(dptr, size);
	if (rc)
		goto out;
	snprintf(name, sizeof(name), DMABUF_NAME ":%llx+%zx", dptr, size);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if (ftruncate(fd, (off_t)size)) {
		close(fd);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	*(int *)handle = fd;
	export_record(fd, dptr, size);
	g_dmabuf_exports++;
out:
	unlock();
	return rc;
}

/* ---- Control API: inspection ---------------------------------------------------------------- */

EXPORT uint64_t fake_cuda_buffer_id(uint64_t va)
{
	uint64_t id = 0;

	lock();
	struct alloc *a = find_alloc(va);

	if (a)
		id = a->id;
	unlock();
	return id;
}

EXPORT int fake_cuda_alloc_info(uint64_t va, struct fake_cuda_alloc_info *out)
{
	int ret = -ENOENT;

	lock();
	struct alloc *a = find_alloc(va);

	if (a && out) {
		*out = (struct fake_cuda_alloc_info){
			.va = a->sp.va,
			.size = a->sp.size,
			.buffer_id = a->id,
			.kind = a->kind,
			.chunk_va = a->chunk->sp.va,
			.chunk_size = a->chunk->sp.size,
			.reservation_va = a->chunk->resv ? a->chunk->resv->sp.va : 0,
			.reservation_size = a->chunk->resv ? a->chunk->resv->sp.size : 0,
			.sync_memops_count = a->sync_count,
			.sync_memops = a->sync,
			.device = a->dev,
			.context = a->ctx,
		};
		ret = 0;
	}
	unlock();
	return ret;
}

EXPORT unsigned fake_cuda_sync_memops_count(uint64_t va)
{
	unsigned n = 0;

	lock();
	struct alloc *a = find_alloc(va);

	if (a)
		n = a->sync_count;
	unlock();
	return n;
}

EXPORT uint64_t fake_cuda_phys_gen(uint64_t va)
{
	uint64_t gen = 0;

	lock();
	struct chunk *c = vec_find(&g_chunks, va);

	if (c && kind_is_gpu(c->kind))
		gen = c->block_id;
	unlock();
	return gen;
}

EXPORT unsigned fake_cuda_live_allocations(void)
{
	unsigned n;

	lock();
	n = (unsigned)g_allocs.n;
	unlock();
	return n;
}

EXPORT unsigned fake_cuda_live_chunks(void)
{
	unsigned n;

	lock();
	n = (unsigned)g_chunks.n;
	unlock();
	return n;
}

EXPORT uint64_t fake_cuda_last_buffer_id(void)
{
	uint64_t id;

	lock();
	id = g_last_id;
	unlock();
	return id;
}

int fake_dmabuf_fds(bool (*fn)(const char *path, void *arg), void *arg)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		char path[sizeof("/proc/self/fd/") + sizeof(de->d_name)], target[PATH_MAX];
		ssize_t len;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		len = readlink(path, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		if (!strstr(target, "memfd:" DMABUF_NAME))
			continue;
		n++;
		if (fn && !fn(path, arg))
			break;
	}
	closedir(d);
	return n;
}

EXPORT int fake_cuda_open_dmabufs(void)
{
	return fake_dmabuf_fds(NULL, NULL);
}

EXPORT int fake_cuda_dmabuf_range(int fd, uint64_t *va, uint64_t *size)
{
	char path[64], target[PATH_MAX];
	unsigned long long v, s;
	ssize_t len;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	len = readlink(path, target, sizeof(target) - 1);
	if (len <= 0)
		return -EBADF;
	target[len] = '\0';

	const char *m = strstr(target, "memfd:" DMABUF_NAME ":");

	if (!m || sscanf(m + strlen("memfd:" DMABUF_NAME ":"), "%llx+%llx", &v, &s) != 2)
		return -EINVAL;
	if (va)
		*va = v;
	if (size)
		*size = s;
	return 0;
}

EXPORT uint64_t fake_cuda_dmabuf_exports(void)
{
	uint64_t n;

	lock();
	n = g_dmabuf_exports;
	unlock();
	return n;
}

void dmabuf_reset(void)
{
	g_dmabuf_exports = 0;
}
