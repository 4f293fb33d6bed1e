/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's devices and contexts: device count and attributes, one primary context
 * per device with a reference count, created (non-primary) contexts, each thread's context stack,
 * and what destroying, resetting or releasing a context does to memory.
 *
 * Measured on two H200s, driver API 13000 (issue 11 probe tests/gpu/probes/mem_probe.c, "multi"),
 * and simulated:
 *  - Each device has its own primary context (distinct CUcontext); cuMemAlloc memory reports
 *    DEVICE_ORDINAL = the context's device and CONTEXT = that context.
 *  - cuDevicePrimaryCtxRetain / Release are reference counted per device: a release that is not
 *    the last leaves the memory valid; the last frees that device's context memory (its pointers
 *    become unknown: BUFFER_ID query INVALID_VALUE) but not its pool memory, and not the other
 *    device's memory; cuDevicePrimaryCtxGetState then reports active 0. cuDevicePrimaryCtxReset of
 *    one device frees that device's context memory only. cuCtxDestroy of a cuCtxCreate'd context
 *    frees its memory only.
 *  - dma-buf export (fake_cuda_attr.c) needs a current context, any device's: none gives
 *    INVALID_CONTEXT, either GPU's primary or a created context works.
 * Assumed (not measured):
 *  - VMM memory (cuMemCreate + cuMemMap) survives context release / reset / destroy, like pool
 *    memory. Managed and pinned host memory, and legacy IPC imports, go with their context (as
 *    DEVICE memory; the fake did so before issue 11 for managed and host memory).
 *  - cuDevicePrimaryCtxReset leaves the retain count alone; a released or reset primary context
 *    stays usable (the next retain or use makes it active again with the same handle).
 *  - The CUDA runtime's implicit reference (ctx_used below).
 *  - cuCtxDestroy of a primary context frees its memory like a reset (kept from before).
 *  - cuCtxCreate_v2 (three arguments) is what cuGetProcAddress("cuCtxCreate") gives; the new
 *    context is pushed on the calling thread's stack, as the documentation says.
 *  - cuCtxSetCurrent replaces the top of the thread's stack (pushes on an empty one); NULL pops.
 *  - Device attributes are the same on every device unless a test sets them per device.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_internal.h"

#define CTX_STACK 16

struct CUctx_st g_primary[FAKE_CUDA_MAX_DEVICES] = {
	{ .dev = 0, .primary = true },
	{ .dev = 1, .primary = true },
	{ .dev = 2, .primary = true },
	{ .dev = 3, .primary = true },
};
struct CUctx_st g_created[MAX_CREATED_CTX];
int g_ndevices = 1;
int g_devattr[FAKE_CUDA_MAX_DEVICES][DEVICE_ATTRIBUTE_MAX];
unsigned g_ctx_sync_sets;
atomic_bool g_no_context;
atomic_bool g_threads_have_context = true;
static unsigned g_primary_refs[FAKE_CUDA_MAX_DEVICES]; /* retains minus releases; never reset */

/* The calling thread's context stack. Until the thread first sets, pushes or pops, it has the
 * default: device 0's primary context when threads have a context (fake_cuda.h), else none. */
static _Thread_local CUcontext t_stack[CTX_STACK];
static _Thread_local unsigned t_depth;
static _Thread_local bool t_touched;

void default_devattrs(void)
{
	for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
		int *a = g_devattr[d];

		memset(a, 0, sizeof(g_devattr[d]));
		a[1] = 1024;  /* MAX_THREADS_PER_BLOCK */
		a[16] = 132;  /* MULTIPROCESSOR_COUNT */
		a[41] = 1;    /* UNIFIED_ADDRESSING */
		a[75] = 9;    /* COMPUTE_CAPABILITY_MAJOR */
		a[76] = 0;    /* COMPUTE_CAPABILITY_MINOR */
		a[83] = 1;    /* MANAGED_MEMORY */
		a[102] = 1;   /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
		a[110] = 1;   /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
		a[115] = 1;   /* MEMORY_POOLS_SUPPORTED */
		a[116] = 1;   /* GPU_DIRECT_RDMA_SUPPORTED */
		a[117] = 1;   /* GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS */
		a[118] = 100; /* GPU_DIRECT_RDMA_WRITES_ORDERING (OWNER), measured */
		a[119] = 9;   /* MEMPOOL_SUPPORTED_HANDLE_TYPES, measured */
		a[124] = 1;   /* DMA_BUF_SUPPORTED */
	}
}

void ctx_reset_state(void)
{
	default_devattrs();
	g_ndevices = 1;
	for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
		g_primary[d].flags = 0;
		g_primary[d].runtime_ref = false;
	}
	for (int i = 0; i < MAX_CREATED_CTX; i++)
		g_created[i].live = false;
	g_ctx_sync_sets = 0;
	atomic_store(&g_no_context, false);
	atomic_store(&g_threads_have_context, true);
}

static void t_touch(void)
{
	if (t_touched)
		return;
	t_touched = true;
	t_depth = 0;
	if (atomic_load(&g_threads_have_context))
		t_stack[t_depth++] = &g_primary[0];
}

CUcontext current_ctx(void)
{
	CUcontext c;

	if (atomic_load(&g_no_context))
		return NULL;
	if (!t_touched)
		return atomic_load(&g_threads_have_context) ? &g_primary[0] : NULL;
	if (!t_depth)
		return NULL;
	c = t_stack[t_depth - 1];
	return c->primary || c->live ? c : NULL;
}

bool has_context(void)
{
	return current_ctx() != NULL;
}

CUcontext control_ctx(void)
{
	CUcontext c = current_ctx();

	return c ? c : &g_primary[0];
}

bool ctx_valid(CUcontext ctx)
{
	if (ctx >= &g_primary[0] && ctx < &g_primary[g_ndevices])
		return true;
	return ctx >= &g_created[0] && ctx < &g_created[MAX_CREATED_CTX] && ctx->live;
}

/*
 * The CUDA runtime's reference (assumed, to model what the fake's default context stands for: a
 * program whose threads all used the CUDA runtime, which retains device 0's primary context on
 * first use): a primary context that memory is allocated in while nobody holds a retain on it is
 * held by an implicit reference. It makes cuDevicePrimaryCtxGetState report active, and keeps
 * the memory when a retain + release pair (a library borrowing the context) brings the count back
 * to 0. cuDevicePrimaryCtxReset, cuCtxDestroy of the primary context and fake_cuda_reset drop it.
 * A context retained before its first use (as a driver-API program, and the probe, do) has none:
 * its last release frees its memory (measured).
 */
void ctx_used(CUcontext ctx, int dev)
{
	if (!ctx)
		ctx = &g_primary[dev];
	if (ctx->primary && !g_primary_refs[ctx->dev])
		ctx->runtime_ref = true;
}

/* Free every allocation of ctx that goes with it (observer called for each, outside the lock). */
static void ctx_memory_free(CUcontext ctx)
{
	const unsigned kinds = K(DEVICE) | K(MANAGED) | K(HOST) | K(IPC);

	for (;;) {
		struct alloc *a = NULL;
		struct freed fr;

		lock();
		for (size_t i = 0; i < g_allocs.n && !a; i++) {
			struct alloc *x = (struct alloc *)g_allocs.v[i];

			if (x->ctx == ctx && (kinds & (1u << x->kind)))
				a = x;
		}
		if (a)
			do_free(a, &fr);
		unlock();
		if (!a)
			return;
		notify(&fr);
	}
}

/* ---- Control API ---------------------------------------------------------------------------- */

EXPORT int fake_cuda_set_device_count(int n)
{
	if (n < 1 || n > FAKE_CUDA_MAX_DEVICES)
		return -EINVAL;
	lock();
	g_ndevices = n;
	unlock();
	return 0;
}

EXPORT int fake_cuda_set_device_attr_dev(int dev, int attr, int value)
{
	if (dev < 0 || dev >= FAKE_CUDA_MAX_DEVICES || attr <= 0 || attr >= DEVICE_ATTRIBUTE_MAX)
		return -EINVAL;
	lock();
	g_devattr[dev][attr] = value;
	unlock();
	return 0;
}

EXPORT int fake_cuda_set_device_attr(int attr, int value)
{
	if (attr <= 0 || attr >= DEVICE_ATTRIBUTE_MAX)
		return -EINVAL;
	lock();
	for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++)
		g_devattr[d][attr] = value;
	unlock();
	return 0;
}

EXPORT void fake_cuda_set_no_context(bool on)
{
	atomic_store(&g_no_context, on);
}

EXPORT void fake_cuda_set_threads_have_context(bool on)
{
	atomic_store(&g_threads_have_context, on);
}

EXPORT void *fake_cuda_context(void)
{
	return &g_primary[0];
}

EXPORT void *fake_cuda_primary_context(int dev)
{
	return dev >= 0 && dev < FAKE_CUDA_MAX_DEVICES ? &g_primary[dev] : NULL;
}

EXPORT unsigned fake_cuda_primary_refs(int dev)
{
	unsigned n = 0;

	lock();
	if (dev >= 0 && dev < FAKE_CUDA_MAX_DEVICES)
		n = g_primary_refs[dev];
	unlock();
	return n;
}

EXPORT unsigned fake_cuda_ctx_sync_memops_set_count(void)
{
	unsigned n;

	lock();
	n = g_ctx_sync_sets;
	unlock();
	return n;
}

EXPORT unsigned fake_cuda_ctx_flags_of(void *ctx)
{
	unsigned f = 0;

	lock();
	if (ctx && ctx_valid(ctx))
		f = ((CUcontext)ctx)->flags | CTX_MAP_HOST;
	unlock();
	return f;
}

EXPORT unsigned fake_cuda_ctx_flags(void)
{
	return fake_cuda_ctx_flags_of(&g_primary[0]);
}

/* ---- Entry points --------------------------------------------------------------------------- */

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuDeviceGet, true);
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (ordinal < 0 || ordinal >= g_ndevices)
		rc = CUDA_ERROR_INVALID_DEVICE;
	else
		*device = ordinal;
	unlock();
	return rc;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
	ENTER(cuDeviceGetCount, true);
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	*count = g_ndevices;
	unlock();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuDeviceGetAttribute, true);
	if (!pi || attrib <= 0 || attrib >= DEVICE_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (dev < 0 || dev >= g_ndevices)
		rc = CUDA_ERROR_INVALID_DEVICE;
	else
		*pi = g_devattr[dev][attrib];
	unlock();
	return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuDevicePrimaryCtxRetain, true);
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (dev < 0 || dev >= g_ndevices) {
		rc = CUDA_ERROR_INVALID_DEVICE;
	} else {
		g_primary_refs[dev]++;
		*pctx = &g_primary[dev];
	}
	unlock();
	return rc;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuDevicePrimaryCtxGetState, true);
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (dev < 0 || dev >= g_ndevices) {
		rc = CUDA_ERROR_INVALID_DEVICE;
	} else {
		*flags = 0; /* cuDevicePrimaryCtxSetFlags is not simulated */
		*active = g_primary_refs[dev] > 0 || g_primary[dev].runtime_ref;
	}
	unlock();
	return rc;
}

static CUresult ctx_destroy(CUcontext ctx)
{
	bool primary;

	lock();
	if (!ctx || !ctx_valid(ctx)) {
		unlock();
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	primary = ctx->primary;
	if (!primary)
		ctx->live = false;
	else
		ctx->runtime_ref = false;
	unlock();
	if (!primary && t_touched && t_depth && t_stack[t_depth - 1] == ctx)
		t_depth--; /* destroying the current context pops it (this thread only) */
	ctx_memory_free(ctx);
	return CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuCtxDestroy)(CUcontext ctx)
{
	ENTER(cuCtxDestroy, true);
	return ctx_destroy(ctx);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuCtxDestroy_v2)(CUcontext ctx)
{
	ENTER(cuCtxDestroy_v2, true);
	return ctx_destroy(ctx);
}

static CUresult primary_reset(CUdevice dev)
{
	lock();
	if (dev < 0 || dev >= g_ndevices) {
		unlock();
		return CUDA_ERROR_INVALID_DEVICE;
	}
	g_primary[dev].runtime_ref = false;
	unlock();
	ctx_memory_free(&g_primary[dev]);
	return CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuDevicePrimaryCtxReset)(CUdevice dev)
{
	ENTER(cuDevicePrimaryCtxReset, true);
	return primary_reset(dev);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuDevicePrimaryCtxReset_v2)(CUdevice dev)
{
	ENTER(cuDevicePrimaryCtxReset_v2, true);
	return primary_reset(dev);
}

static CUresult primary_release(CUdevice dev)
{
	bool last;

	lock();
	if (dev < 0 || dev >= g_ndevices) {
		unlock();
		return CUDA_ERROR_INVALID_DEVICE;
	}
	if (!g_primary_refs[dev]) {
		unlock();
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	last = --g_primary_refs[dev] == 0 && !g_primary[dev].runtime_ref;
	unlock();
	if (last)
		ctx_memory_free(&g_primary[dev]);
	return CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuDevicePrimaryCtxRelease)(CUdevice dev)
{
	ENTER(cuDevicePrimaryCtxRelease, true);
	return primary_release(dev);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuDevicePrimaryCtxRelease_v2)(CUdevice dev)
{
	ENTER(cuDevicePrimaryCtxRelease_v2, true);
	return primary_release(dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CUcontext c = NULL;

	ENTER(cuCtxCreate_v2, true);
	if (!pctx || flags & ~CTX_FLAGS_VALID)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	if (dev < 0 || dev >= g_ndevices) {
		unlock();
		return CUDA_ERROR_INVALID_DEVICE;
	}
	for (int i = 0; i < MAX_CREATED_CTX && !c; i++)
		if (!g_created[i].live)
			c = &g_created[i];
	if (c)
		*c = (struct CUctx_st){ .dev = dev, .live = true, .flags = flags };
	unlock();
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	t_touch();
	if (t_depth == CTX_STACK)
		t_depth--; /* a full stack: replace the top rather than fail */
	t_stack[t_depth++] = c;
	*pctx = c;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	ENTER(cuCtxGetCurrent, true);
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = current_ctx();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
	bool ok;

	ENTER(cuCtxSetCurrent, true);
	lock();
	ok = !ctx || ctx_valid(ctx);
	unlock();
	if (!ok)
		return CUDA_ERROR_INVALID_CONTEXT;
	t_touch();
	if (!ctx) {
		if (t_depth)
			t_depth--;
	} else if (t_depth) {
		t_stack[t_depth - 1] = ctx;
	} else {
		t_stack[t_depth++] = ctx;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	bool ok;

	ENTER(cuCtxPushCurrent_v2, true);
	lock();
	ok = ctx && ctx_valid(ctx);
	unlock();
	if (!ok)
		return CUDA_ERROR_INVALID_CONTEXT;
	t_touch();
	if (t_depth == CTX_STACK)
		return CUDA_ERROR_INVALID_VALUE;
	t_stack[t_depth++] = ctx;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	ENTER(cuCtxPopCurrent_v2, true);
	t_touch();
	if (!t_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	t_depth--;
	if (pctx)
		*pctx = t_stack[t_depth];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
	CUcontext c;

	ENTER(cuCtxGetDevice, true);
	c = current_ctx();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = c->dev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
	CUcontext c;

	ENTER(cuCtxGetFlags, true);
	c = current_ctx();
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	lock();
	*flags = c->flags | CTX_MAP_HOST;
	unlock();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetFlags(unsigned int flags)
{
	CUcontext c;

	ENTER(cuCtxSetFlags, true);
	c = current_ctx();
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (flags & ~CTX_FLAGS_VALID)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	c->flags = flags;
	if (flags & CTX_SYNC_MEMOPS)
		g_ctx_sync_sets++;
	unlock();
	return CUDA_SUCCESS;
}
