/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's memory from another process: legacy IPC handles (cuIpcGetMemHandle,
 * cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle) and VMM shareable handles (cuMemCreate,
 * cuMemExportToShareableHandle, cuMemImportFromShareableHandle), with the VMM entry points they
 * need (cuMemAddressReserve / Free, cuMemMap, cuMemSetAccess, cuMemRelease) over the VMM model of
 * fake_cuda_vmm.c. The fake is one process: it plays exporter and importer, and an import is new
 * memory at a new VA (its content is not the exporter's).
 *
 * Measured on an H200, driver API 13000, importer forked before cuInit (issue 11 probe
 * tests/gpu/probes/mem_probe.c, "ipc"), and simulated:
 *  - A legacy IPC import is a mapping with its own BUFFER_ID (not the exporter's), MEMORY_TYPE
 *    DEVICE, CONTEXT the importer's current context, IS_GPU_DIRECT_RDMA_CAPABLE 0, RANGE and
 *    MAPPING exactly the imported allocation; SYNC_MEMOPS set succeeds; dma-buf export fails
 *    (INVALID_VALUE). cuIpcCloseMemHandle makes it unknown (BUFFER_ID query INVALID_VALUE); a
 *    reopen gives the same VA and a new BUFFER_ID. Opening a handle that is open gives the same VA
 *    (reference counted); closing one of two opens leaves it valid.
 *  - A VMM POSIX-fd import (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
 *    cuMemSetAccess) is a VMM mapping like any other: own BUFFER_ID, CONTEXT NULL, SYNC_MEMOPS
 *    NOT_SUPPORTED, dma-buf export succeeds; cuMemUnmap makes it unknown; a remap of the same
 *    handle gives a new BUFFER_ID.
 * Assumed (not measured): an import lives on the exporter's device (DEVICE_ORDINAL) and goes with
 * the importer's context (release / reset / destroy free it, as DEVICE memory); it outlives the
 * exporter's free; IS_LEGACY_CUDA_IPC_CAPABLE 0 for it; phys_gen 0 (no P2P pages: the fake's
 * provider knows only the exporter's chunks). A handle without the fake's magic (a test's
 * hand-made handle, as before issue 11) maps a fresh DEVICE allocation of the size in its first
 * 8 bytes (2 MiB if 0) that cuIpcCloseMemHandle frees. cuIpcGetMemHandle needs a current context
 * and DEVICE memory (else INVALID_VALUE). The shareable fd is a memfd named
 * "fake-vmmfd:<handle>:<size>:<device>"; cuMemCreate accepts PINNED device memory in 2 MiB
 * multiples; cuMemMap maps the whole handle at offset 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda_internal.h"

static size_t g_nvmm; /* VMM handles made (fake_cuda_ipc.c's second half) */

/* ---- Legacy IPC ----------------------------------------------------------------------------- */

#define IPC_MAGIC "FAKEIPC"

struct ipc_handle {
	uint64_t size;     /* kept first: a hand-made handle holds only this */
	char magic[8];
	uint64_t key;      /* the exporter allocation's BUFFER_ID */
	int32_t dev;
	char pad[36];
};
_Static_assert(sizeof(struct ipc_handle) == sizeof(CUipcMemHandle), "IPC handle is 64 bytes");

struct ipc_import {
	uint64_t key;
	unsigned refs;
	struct alloc *a;
};

static struct ipc_import **g_imports;
static size_t g_nimports, g_capimports;

void ipc_forget(struct alloc *a)
{
	for (size_t i = 0; i < g_nimports; i++) {
		if (g_imports[i] == a->imp) {
			free(g_imports[i]);
			g_imports[i] = g_imports[--g_nimports];
			break;
		}
	}
	a->imp = NULL;
}

void ipc_reset(void)
{
	/* fake_cuda_reset freed every allocation, imports included (ipc_forget). */
	g_nimports = 0;
	g_nvmm = 0;
}

/* Map a new import of h in ctx; the lock is held. */
static struct ipc_import *ipc_map(const struct ipc_handle *h, CUcontext ctx)
{
	uint64_t rsize = (h->size + CHUNK - 1) & ~(CHUNK - 1);
	struct ipc_import *imp = calloc(1, sizeof(*imp));
	struct chunk *c = NULL;
	uint64_t va = 0;

	if (!imp)
		return NULL;
	if (g_nimports == g_capimports) {
		size_t cap = g_capimports ? g_capimports * 2 : 16;
		struct ipc_import **n = realloc(g_imports, cap * sizeof(*n));

		if (!n)
			goto err;
		g_imports = n;
		g_capimports = cap;
	}
	va = va_get(rsize);
	if (!va)
		goto err;
	/* The chunk is the import exactly: MAPPING = the allocation (measured). */
	c = chunk_create(FAKE_CUDA_KIND_IPC, va, h->size, false, NULL, h->dev, ctx);
	if (!c)
		goto err;
	c->va_size = rsize;
	imp->a = alloc_new(FAKE_CUDA_KIND_IPC, va, h->size, c, 0, 0);
	if (!imp->a)
		goto err;
	imp->a->imp = imp;
	imp->key = h->key;
	imp->refs = 1;
	g_imports[g_nimports++] = imp;
	return imp;

err:
	if (c)
		chunk_release(c); /* gives the VA back */
	else if (va)
		va_put(va, rsize);
	free(imp);
	return NULL;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	struct ipc_handle h = { 0 };
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuIpcGetMemHandle, true);
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	if (!has_context())
		return CUDA_ERROR_INVALID_CONTEXT;
	lock();
	const struct alloc *a = find_alloc(dptr);

	if (!a || a->kind != FAKE_CUDA_KIND_DEVICE) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		h.size = a->sp.size;
		memcpy(h.magic, IPC_MAGIC, sizeof(h.magic));
		h.key = a->id;
		h.dev = a->dev;
		memcpy(handle, &h, sizeof(h));
	}
	unlock();
	return rc;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	CUcontext ctx = NULL;
	struct ipc_handle h;
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuIpcOpenMemHandle_v2, true);
	memcpy(&h, &handle, sizeof(h));
	if (flags > 1) /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */
		return CUDA_ERROR_INVALID_VALUE;
	if (memcmp(h.magic, IPC_MAGIC, sizeof(h.magic)))
		return entry_alloc(FAKE_CUDA_KIND_DEVICE, pdptr, h.size ? h.size : CHUNK, -1);
	if (!pdptr)
		return CUDA_ERROR_INVALID_VALUE;
	ctx = current_ctx();
	if (!ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!h.size || h.dev < 0 || h.dev >= FAKE_CUDA_MAX_DEVICES)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	struct ipc_import *imp = NULL;

	for (size_t i = 0; i < g_nimports && !imp; i++)
		if (g_imports[i]->key == h.key)
			imp = g_imports[i];
	if (imp)
		imp->refs++;
	else
		imp = ipc_map(&h, ctx);
	if (imp)
		*pdptr = imp->a->sp.va;
	else
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	unlock();
	return rc;
}

/* Close one open of the import at va: 0, 1 (not an import: not handled), -EINVAL. */
static int ipc_close(uint64_t va)
{
	struct freed fr;
	bool freed = false;

	lock();
	struct alloc *a = find_alloc(va);

	if (!a || a->kind != FAKE_CUDA_KIND_IPC) {
		unlock();
		return 1;
	}
	if (a->sp.va != va) {
		unlock();
		return -EINVAL;
	}
	if (--a->imp->refs == 0) {
		do_free(a, &fr);
		freed = true;
	}
	unlock();
	if (freed)
		notify(&fr);
	return 0;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuIpcCloseMemHandle)(CUdeviceptr dptr)
{
	int ret;

	ENTER(cuIpcCloseMemHandle, true);
	ret = ipc_close(dptr);
	if (ret == 1) /* a hand-made handle's DEVICE allocation */
		ret = fake_cuda_free(dptr);
	return ret ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT uint64_t fake_cuda_ipc_import(uint64_t exporter_va)
{
	CUcontext ctx = control_ctx();
	struct ipc_handle h = { 0 };
	struct ipc_import *imp = NULL;
	uint64_t va = 0;

	lock();
	const struct alloc *a = find_alloc(exporter_va);

	if (a && a->kind == FAKE_CUDA_KIND_DEVICE) {
		h.size = a->sp.size;
		h.key = a->id;
		h.dev = a->dev;
		for (size_t i = 0; i < g_nimports && !imp; i++)
			if (g_imports[i]->key == h.key)
				imp = g_imports[i];
		if (imp)
			imp->refs++;
		else
			imp = ipc_map(&h, ctx);
		if (imp)
			va = imp->a->sp.va;
	}
	unlock();
	return va;
}

EXPORT int fake_cuda_ipc_close(uint64_t va)
{
	int ret = ipc_close(va);

	return ret == 1 ? -EINVAL : ret;
}

/* ---- VMM handles ---------------------------------------------------------------------------- */

#define VMMFD_NAME "fake-vmmfd"
#define HANDLE_TYPE_POSIX_FD 1
#define HANDLE_BASE 0x7a000000ull

/* cuda.h's CUmemAllocationProp, the fields read here. */
struct mem_prop {
	int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
	int requested_handle_types;
	struct {
		int type;         /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
		int id;
	} location;
	void *win32_meta;
	unsigned char alloc_flags[8];
};

struct vmm_handle {
	bool live;
	bool imported;
	int types;
	int dev;
	uint64_t size;
};

static struct vmm_handle *g_vmm;
static size_t g_capvmm;

/* The handle's entry, or NULL; the lock is held. */
static struct vmm_handle *vmm_handle(CUmemGenericAllocationHandle h)
{
	if (h < HANDLE_BASE || h - HANDLE_BASE >= g_nvmm || !g_vmm[h - HANDLE_BASE].live)
		return NULL;
	return &g_vmm[h - HANDLE_BASE];
}

/* A new handle; the lock is held. 0 on failure. */
static CUmemGenericAllocationHandle vmm_handle_new(uint64_t size, int dev, int types, bool imported)
{
	if (g_nvmm == g_capvmm) {
		size_t cap = g_capvmm ? g_capvmm * 2 : 16;
		struct vmm_handle *n = realloc(g_vmm, cap * sizeof(*n));

		if (!n)
			return 0;
		g_vmm = n;
		g_capvmm = cap;
	}
	g_vmm[g_nvmm] = (struct vmm_handle){ true, imported, types, dev, size };
	return HANDLE_BASE + g_nvmm++;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemCreate)(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
			    unsigned long long flags)
{
	const struct mem_prop *p = prop;
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuMemCreate, true);
	if (!handle || !p || flags || size == 0 || size % CHUNK || p->type != 1 ||
	    p->location.type != 1)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (p->location.id < 0 || p->location.id >= g_ndevices)
		rc = CUDA_ERROR_INVALID_DEVICE;
	else if (!(*handle = vmm_handle_new(size, p->location.id, p->requested_handle_types, false)))
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	unlock();
	return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct vmm_handle *h;
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuMemRelease, true);
	lock();
	h = vmm_handle(handle);
	if (h)
		h->live = false; /* its mappings stay until unmapped, as documented */
	else
		rc = CUDA_ERROR_INVALID_VALUE;
	unlock();
	return rc;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const void *prop, int option)
{
	ENTER(cuMemGetAllocationGranularity, true);
	if (!granularity || !prop || (option != 0 && option != 1))
		return CUDA_ERROR_INVALID_VALUE;
	*granularity = CHUNK;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				    CUdeviceptr addr, unsigned long long flags)
{
	uint64_t va;

	ENTER(cuMemAddressReserve, true);
	(void)addr; /* a hint */
	if (!ptr || size == 0 || size % CHUNK || flags || (alignment && CHUNK % alignment))
		return CUDA_ERROR_INVALID_VALUE;
	va = fake_cuda_vmm_reserve(size);
	if (!va)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*ptr = va;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	ENTER(cuMemAddressFree, true);
	return fake_cuda_vmm_free(ptr, size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemMap)(CUdeviceptr ptr, size_t size, size_t offset,
			 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	struct vmm_handle *h;
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuMemMap, true);
	if (flags || offset)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	h = vmm_handle(handle);
	if (!h)
		rc = CUDA_ERROR_INVALID_HANDLE;
	else if (size != h->size)
		rc = CUDA_ERROR_INVALID_VALUE;
	else if (vmm_map(ptr, size, h->dev))
		rc = CUDA_ERROR_INVALID_VALUE;
	unlock();
	return rc;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuMemSetAccess, true);
	if (!desc || !count || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	for (uint64_t p = ptr; p < ptr + size && !rc;) {
		const struct chunk *c = vec_find(&g_chunks, p);

		if (!c || c->kind != FAKE_CUDA_KIND_VMM)
			rc = CUDA_ERROR_INVALID_VALUE;
		else
			p = c->sp.va + c->sp.size;
	}
	unlock();
	return rc;
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
					     int handleType, unsigned long long flags)
{
	const struct vmm_handle *h;
	char name[96];
	CUresult rc = CUDA_SUCCESS;
	int fd;

	ENTER(cuMemExportToShareableHandle, true);
	if (!shareableHandle || flags || handleType != HANDLE_TYPE_POSIX_FD)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	h = vmm_handle(handle);
	if (!h) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (!(h->types & HANDLE_TYPE_POSIX_FD)) {
		rc = CUDA_ERROR_INVALID_VALUE; /* not requested at cuMemCreate */
	} else {
		snprintf(name, sizeof(name), VMMFD_NAME ":%llx:%llx:%d", handle,
			 (unsigned long long)h->size, h->dev);
		fd = memfd_create(name, MFD_CLOEXEC);
		if (fd < 0)
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*(int *)shareableHandle = fd;
	}
	unlock();
	return rc;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
					       int shHandleType)
{
	char path[64], target[PATH_MAX];
	unsigned long long id, size;
	CUresult rc = CUDA_SUCCESS;
	ssize_t len;
	int dev;

	ENTER(cuMemImportFromShareableHandle, true);
	if (!handle || shHandleType != HANDLE_TYPE_POSIX_FD)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", (int)(intptr_t)osHandle);
	len = readlink(path, target, sizeof(target) - 1);
	if (len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	target[len] = '\0';

	const char *m = strstr(target, "memfd:" VMMFD_NAME ":");

	if (!m || sscanf(m + strlen("memfd:" VMMFD_NAME ":"), "%llx:%llx:%d", &id, &size, &dev) != 3)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (dev < 0 || dev >= g_ndevices)
		rc = CUDA_ERROR_INVALID_DEVICE;
	else if (!(*handle = vmm_handle_new(size, dev, HANDLE_TYPE_POSIX_FD, true)))
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	unlock();
	return rc;
}
