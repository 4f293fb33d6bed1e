/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's cuGetProcAddress (v1 and v2): its table of entry points by base name,
 * with the CUDA version that introduced each and its variants, and the control API that hides a
 * symbol or raises a version.
 *
 * Measured on an H100, driver 580.159.04, CUDA 13.0 (probes run for the fake driver, fake_cuda.c),
 * and simulated:
 *  - cuGetProcAddress_v2: an unknown name returns CUDA_SUCCESS with *pfn = NULL and status
 *    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND (1), not CUDA_ERROR_NOT_FOUND; a name asked for with a
 *    cudaVersion below the one that introduced it (cuCtxSetFlags: 12010, so 12000 is too low)
 *    returns CUDA_SUCCESS, *pfn = NULL, status VERSION_NOT_SUFFICIENT (2). The v1 cuGetProcAddress
 *    returns CUDA_ERROR_NOT_FOUND in both cases and leaves *pfn alone. Names ending in _v2 are not
 *    found. flags > 2: CUDA_ERROR_INVALID_VALUE.
 *  - How the CUDA runtime reaches the driver (FACTS.md): dlsym(handle, "cuGetProcAddress_v2") once,
 *    then everything through it, by base name with a cudaVersion and flags: "cuGetProcAddress" at
 *    11030 (the v1 function) and 12000 (the v2 function), "cuMemFree" at 3020 (cuMemFree_v2),
 *    "cuMemFreeAsync" with flags 0 and 2 (PER_THREAD_DEFAULT_STREAM: the _ptsz function),
 *    "cuDevicePrimaryCtxRelease"/"Reset" at 7000 (the v1 functions; _v2 from 11000), "cuCtxDestroy"
 *    (_v2 from 4000). Simulated: that table; a flags-2 lookup of a function with a _ptsz variant
 *    returns it. cuMemUnmap is fake_cuda_vmm_unmap.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fake_cuda_internal.h"

static char g_hidden[32][64];
static unsigned g_nhidden;
static int g_min_version_override[E_COUNT]; /* 0: default */

static const struct {
	const char *base;
	enum entry e;
	void *fn;
	int min_version; /* the CUDA version that introduced it */
	void *ptsz;      /* the PER_THREAD_DEFAULT_STREAM variant, if any */
	void *v1;        /* the variant below v2_from, if any */
	int v2_from;
} g_procs[] = {
	{ "cuGetProcAddress", E_cuGetProcAddress_v2, (void *)cuGetProcAddress_v2, 11030,
	  .v1 = (void *)cuGetProcAddress, .v2_from = 12000 },
	{ "cuInit", E_cuInit, (void *)cuInit, 2000, NULL, NULL, 0 },
	{ "cuDriverGetVersion", E_cuDriverGetVersion, (void *)cuDriverGetVersion, 2020, NULL, NULL, 0 },
	{ "cuGetErrorName", E_cuGetErrorName, (void *)cuGetErrorName, 6000, NULL, NULL, 0 },
	{ "cuGetErrorString", E_cuGetErrorString, (void *)cuGetErrorString, 6000, NULL, NULL, 0 },
	{ "cuDeviceGet", E_cuDeviceGet, (void *)cuDeviceGet, 2000, NULL, NULL, 0 },
	{ "cuDeviceGetCount", E_cuDeviceGetCount, (void *)cuDeviceGetCount, 2000, NULL, NULL, 0 },
	{ "cuDeviceGetAttribute", E_cuDeviceGetAttribute, (void *)cuDeviceGetAttribute, 2000, NULL, NULL, 0 },
	{ "cuCtxGetCurrent", E_cuCtxGetCurrent, (void *)cuCtxGetCurrent, 4000, NULL, NULL, 0 },
	{ "cuCtxSetCurrent", E_cuCtxSetCurrent, (void *)cuCtxSetCurrent, 4000, NULL, NULL, 0 },
	{ "cuCtxGetDevice", E_cuCtxGetDevice, (void *)cuCtxGetDevice, 2000, NULL, NULL, 0 },
	{ "cuMemcpyHtoD", E_cuMemcpyHtoD_v2, (void *)cuMemcpyHtoD_v2, 3020, NULL, NULL, 0 },
	{ "cuMemcpyDtoH", E_cuMemcpyDtoH_v2, (void *)cuMemcpyDtoH_v2, 3020, NULL, NULL, 0 },
	{ "cuDevicePrimaryCtxRetain", E_cuDevicePrimaryCtxRetain, (void *)cuDevicePrimaryCtxRetain,
	  7000, NULL, NULL, 0 },
	{ "cuCtxGetFlags", E_cuCtxGetFlags, (void *)cuCtxGetFlags, 7000, NULL, NULL, 0 },
	{ "cuCtxSetFlags", E_cuCtxSetFlags, (void *)cuCtxSetFlags, 12010, NULL, NULL, 0 },
	{ "cuPointerGetAttribute", E_cuPointerGetAttribute, (void *)cuPointerGetAttribute, 4000, NULL, NULL, 0 },
	{ "cuPointerGetAttributes", E_cuPointerGetAttributes, (void *)cuPointerGetAttributes, 7000, NULL, NULL, 0 },
	{ "cuPointerSetAttribute", E_cuPointerSetAttribute, (void *)cuPointerSetAttribute, 6000, NULL, NULL, 0 },
	{ "cuMemGetAddressRange", E_cuMemGetAddressRange_v2, (void *)cuMemGetAddressRange_v2, 3020, NULL, NULL, 0 },
	{ "cuMemGetHandleForAddressRange", E_cuMemGetHandleForAddressRange,
	  (void *)cuMemGetHandleForAddressRange, 11070, NULL, NULL, 0 },
	{ "cuMemAlloc", E_cuMemAlloc_v2, (void *)cuMemAlloc_v2, 3020, NULL, NULL, 0 },
	{ "cuMemFree", E_cuMemFree_v2, (void *)cuMemFree_v2, 3020, NULL, NULL, 0 },
	{ "cuMemAllocHost", E_cuMemAllocHost_v2, (void *)cuMemAllocHost_v2, 3020, NULL, NULL, 0 },
	{ "cuMemFreeHost", E_cuMemFreeHost, (void *)cuMemFreeHost, 2000, NULL, NULL, 0 },
	{ "cuMemAllocManaged", E_cuMemAllocManaged, (void *)cuMemAllocManaged, 6000, NULL, NULL, 0 },
	{ "cuMemAllocAsync", E_cuMemAllocAsync, (void *)cuMemAllocAsync, 11020,
	  .ptsz = (void *)cuMemAllocAsync_ptsz },
	{ "cuMemFreeAsync", E_cuMemFreeAsync, (void *)cuMemFreeAsync, 11020,
	  .ptsz = (void *)cuMemFreeAsync_ptsz },
	{ "cuMemUnmap", E_cuMemUnmap, (void *)cuMemUnmap, 10020, NULL, NULL, 0 },
	{ "cuCtxDestroy", E_cuCtxDestroy_v2, (void *)cuCtxDestroy_v2, 2000,
	  .v1 = (void *)cuCtxDestroy, .v2_from = 4000 },
	{ "cuDevicePrimaryCtxReset", E_cuDevicePrimaryCtxReset_v2, (void *)cuDevicePrimaryCtxReset_v2,
	  7000, .v1 = (void *)cuDevicePrimaryCtxReset, .v2_from = 11000 },
	{ "cuDevicePrimaryCtxRelease", E_cuDevicePrimaryCtxRelease_v2,
	  (void *)cuDevicePrimaryCtxRelease_v2, 7000, .v1 = (void *)cuDevicePrimaryCtxRelease,
	  .v2_from = 11000 },
	{ "cuIpcOpenMemHandle", E_cuIpcOpenMemHandle_v2, (void *)cuIpcOpenMemHandle_v2, 11000, NULL, NULL, 0 },
	{ "cuIpcCloseMemHandle", E_cuIpcCloseMemHandle, (void *)cuIpcCloseMemHandle, 4010, NULL, NULL, 0 },
	{ "cuIpcGetMemHandle", E_cuIpcGetMemHandle, (void *)cuIpcGetMemHandle, 4010, NULL, NULL, 0 },
	{ "cuDevicePrimaryCtxGetState", E_cuDevicePrimaryCtxGetState,
	  (void *)cuDevicePrimaryCtxGetState, 7000, NULL, NULL, 0 },
	{ "cuCtxPushCurrent", E_cuCtxPushCurrent_v2, (void *)cuCtxPushCurrent_v2, 4000, NULL, NULL, 0 },
	{ "cuCtxPopCurrent", E_cuCtxPopCurrent_v2, (void *)cuCtxPopCurrent_v2, 4000, NULL, NULL, 0 },
	{ "cuCtxCreate", E_cuCtxCreate_v2, (void *)cuCtxCreate_v2, 3020, NULL, NULL, 0 },
	{ "cuDeviceGetDefaultMemPool", E_cuDeviceGetDefaultMemPool, (void *)cuDeviceGetDefaultMemPool,
	  11020, NULL, NULL, 0 },
	{ "cuMemAllocFromPoolAsync", E_cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync, 11020,
	  NULL, NULL, 0 },
	{ "cuMemCreate", E_cuMemCreate, (void *)cuMemCreate, 10020, NULL, NULL, 0 },
	{ "cuMemRelease", E_cuMemRelease, (void *)cuMemRelease, 10020, NULL, NULL, 0 },
	{ "cuMemAddressReserve", E_cuMemAddressReserve, (void *)cuMemAddressReserve, 10020, NULL, NULL, 0 },
	{ "cuMemAddressFree", E_cuMemAddressFree, (void *)cuMemAddressFree, 10020, NULL, NULL, 0 },
	{ "cuMemMap", E_cuMemMap, (void *)cuMemMap, 10020, NULL, NULL, 0 },
	{ "cuMemSetAccess", E_cuMemSetAccess, (void *)cuMemSetAccess, 10020, NULL, NULL, 0 },
	{ "cuMemGetAllocationGranularity", E_cuMemGetAllocationGranularity,
	  (void *)cuMemGetAllocationGranularity, 10020, NULL, NULL, 0 },
	{ "cuMemExportToShareableHandle", E_cuMemExportToShareableHandle,
	  (void *)cuMemExportToShareableHandle, 10020, NULL, NULL, 0 },
	{ "cuMemImportFromShareableHandle", E_cuMemImportFromShareableHandle,
	  (void *)cuMemImportFromShareableHandle, 10020, NULL, NULL, 0 },
};

/* Returns PROC_* and the function. The lock is not held. */
static int proc_find(const char *symbol, int version, cuuint64_t flags, void **fn)
{
	int status = PROC_SYMBOL_NOT_FOUND;

	*fn = NULL;
	lock();
	for (unsigned i = 0; i < g_nhidden; i++)
		if (!strcmp(g_hidden[i], symbol))
			goto out;
	for (size_t i = 0; i < sizeof(g_procs) / sizeof(g_procs[0]); i++) {
		if (strcmp(g_procs[i].base, symbol))
			continue;
		int min = g_min_version_override[g_procs[i].e];

		if (!min)
			min = g_procs[i].min_version;

		if (version < min) {
			status = PROC_VERSION_NOT_SUFFICIENT;
		} else {
			status = PROC_SUCCESS;
			*fn = g_procs[i].fn;
			if (g_procs[i].v1 && version < g_procs[i].v2_from)
				*fn = g_procs[i].v1;
			if (g_procs[i].ptsz && (flags & 2))
				*fn = g_procs[i].ptsz;
		}
		break;
	}
out:
	unlock();
	return status;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	ENTER(cuGetProcAddress_v2, false);
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags > 2) { /* DEFAULT, LEGACY_STREAM, PER_THREAD_DEFAULT_STREAM */
		*pfn = NULL;
		if (symbolStatus)
			*symbolStatus = PROC_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_INVALID_VALUE;
	}

	int status = proc_find(symbol, cudaVersion, flags, pfn);

	if (symbolStatus)
		*symbolStatus = status;
	return CUDA_SUCCESS; /* measured: success even when not found; look at *pfn / status */
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	void *fn;

	ENTER(cuGetProcAddress, false);
	if (!symbol || !pfn || flags > 2)
		return CUDA_ERROR_INVALID_VALUE;
	if (proc_find(symbol, cudaVersion, flags, &fn) != PROC_SUCCESS)
		return CUDA_ERROR_NOT_FOUND; /* *pfn untouched, as measured */
	*pfn = fn;
	return CUDA_SUCCESS;
}

/* ---- Control API ---------------------------------------------------------------------------- */

EXPORT int fake_cuda_hide_symbol(const char *name)
{
	int ret = 0;

	if (!name || strlen(name) >= sizeof(g_hidden[0]))
		return -EINVAL;
	lock();
	if (g_nhidden == sizeof(g_hidden) / sizeof(g_hidden[0]))
		ret = -ENOSPC;
	else
		strcpy(g_hidden[g_nhidden++], name);
	unlock();
	return ret;
}

EXPORT int fake_cuda_set_symbol_min_version(const char *name, int version)
{
	int e = entry_lookup(name);

	if (e < 0)
		return -EINVAL;
	lock();
	g_min_version_override[e] = version;
	unlock();
	return 0;
}

void proc_reset(void)
{
	g_nhidden = 0;
	memset(g_min_version_override, 0, sizeof(g_min_version_override));
}
