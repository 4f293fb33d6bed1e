/* SPDX-License-Identifier: MIT */
/*
 * A fake CUDA driver, libcuda.so.1, for libgdrcache's unit tests: a SIMULATION of NVIDIA's
 * libcuda, with the real entry points' names and C prototypes, behaving as the real driver was
 * measured to behave (docs/FACTS.md, and the probes listed here), plus a control API (fake_cuda.h).
 *
 * This file: the entry points' names, call counting and faults, the control API's switches and
 * reset, cuInit, the driver version, error names. The rest, each file with what it simulates
 * (fake_cuda_internal.h is what they share): fake_cuda_mem.c the memory model (VA arena,
 * chunks), fake_cuda_alloc.c allocations and the allocation and free entry points,
 * fake_cuda_vmm.c VMM reservations and mappings, fake_cuda_attr.c pointer attributes, dma-buf
 * export and inspection, fake_cuda_proc.c cuGetProcAddress, fake_cuda_ctx.c devices and contexts,
 * fake_cuda_pool.c stream-ordered pools, fake_cuda_ipc.c memory from another process, and
 * fake_entry_<arch>.S the entries libgdrcache patches (lib/intercept/entries.h).
 *
 * Measured on an H100, driver 580.159.04, CUDA 13.0 (probes run for this file and its siblings),
 * and simulated:
 *  - Threads: a new thread has no current context; pointer queries and SYNC_MEMOPS still work;
 *    cuCtxGetFlags, cuMemAlloc, cuMemGetHandleForAddressRange, cuMemGetAddressRange and
 *    DEVICE_POINTER return CUDA_ERROR_INVALID_CONTEXT.
 *  - Context flags read back as the set flags | CU_CTX_MAP_HOST (0x8).
 *  - Devices and contexts (what a context destroy, reset or release frees, several GPUs, measured
 *    on two H200s): fake_cuda_ctx.c. Memory imported from another process (legacy IPC, VMM
 *    shareable handles) and the VMM entry points: fake_cuda_ipc.c.
 *  - Device attributes: 0 and >= 148 (CU_DEVICE_ATTRIBUTE_MAX): INVALID_VALUE; a device >= the
 *    count: INVALID_DEVICE. cuGetErrorName of an unknown code: INVALID_VALUE, *str = NULL.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fake_cuda_internal.h"

int fake_api_flag;

/* ---- Entry points: names, counters, faults -------------------------------------------------- */
static const char *const entry_name[E_COUNT] = {
#define GDR_ENTRY(name, kind, route, fake, ...) FAKE_IF_##fake([E_##name] = #name,)
#include "../../lib/intercept/entries.h"
#define X(n) [E_##n] = #n,
	FAKE_OTHER_ENTRIES(X)
#undef X
};

struct fault {
	unsigned skip;
	unsigned n;
	CUresult result;
};

static _Atomic uint64_t g_calls[E_COUNT];
static atomic_uint g_faults_armed;  /* entries with n > 0 */
static atomic_bool g_initialized;
static int g_driver_version = FAKE_CUDA_DRIVER_VERSION;
static CUresult g_init_error;
static struct fault g_faults[E_COUNT];

/* Count the call, apply an armed fault, check cuInit. Returns true with *rc when the call must
 * return *rc at once. */
static void (*_Atomic g_enter_hook)(const char *entry, void *arg);
static void *_Atomic g_enter_hook_arg;

bool enter(enum entry e, bool need_init, CUresult *rc)
{
	void (*hook)(const char *, void *) = atomic_load(&g_enter_hook);

	if (hook)
		hook(entry_name[e], atomic_load(&g_enter_hook_arg));
	atomic_fetch_add_explicit(&g_calls[e], 1, memory_order_relaxed);
	if (atomic_load_explicit(&g_faults_armed, memory_order_acquire)) {
		bool fail = false;

		lock();
		struct fault *f = &g_faults[e];

		if (f->n) {
			if (f->skip) {
				f->skip--;
			} else {
				fail = true;
				*rc = f->result;
				if (--f->n == 0)
					atomic_fetch_sub(&g_faults_armed, 1);
			}
		}
		unlock();
		if (fail)
			return true;
	}
	if (need_init && !atomic_load(&g_initialized)) {
		*rc = CUDA_ERROR_NOT_INITIALIZED;
		return true;
	}
	return false;
}

/* An entry's index by its name or, for a _v2 entry, its base name; -1 if none. */
int entry_lookup(const char *name)
{
	if (!name)
		return -1;
	for (int e = 0; e < E_COUNT; e++)
		if (!strcmp(entry_name[e], name))
			return e;
	for (int e = 0; e < E_COUNT; e++) {
		size_t len = strlen(name);

		/* base name of a _v2 entry */
		if (!strncmp(entry_name[e], name, len) && !strcmp(entry_name[e] + len, "_v2") &&
		    e != E_cuGetProcAddress_v2)
			return e;
	}
	return -1;
}

EXPORT uint64_t fake_cuda_calls(const char *entry)
{
	int e = entry_lookup(entry);

	return e < 0 ? 0 : atomic_load(&g_calls[e]);
}

EXPORT uint64_t fake_cuda_calls_total(void)
{
	uint64_t t = 0;

	for (int e = 0; e < E_COUNT; e++)
		t += atomic_load(&g_calls[e]);
	return t;
}

EXPORT void fake_cuda_reset_counters(void)
{
	for (int e = 0; e < E_COUNT; e++)
		atomic_store(&g_calls[e], 0);
}

/* ---- Control API: switches and faults ------------------------------------------------------- */

EXPORT int fake_cuda_fail_after(const char *entry, unsigned skip, int curesult, unsigned n)
{
	int e = entry_lookup(entry);

	if (e < 0)
		return -EINVAL;
	lock();
	struct fault *f = &g_faults[e];

	if (f->n)
		atomic_fetch_sub(&g_faults_armed, 1);
	*f = (struct fault){ .skip = skip, .n = n, .result = curesult };
	if (n)
		atomic_fetch_add(&g_faults_armed, 1);
	unlock();
	return 0;
}

EXPORT int fake_cuda_fail_next(const char *entry, int curesult, unsigned n)
{
	return fake_cuda_fail_after(entry, 0, curesult, n);
}

EXPORT void fake_cuda_set_init_error(int curesult)
{
	lock();
	g_init_error = curesult;
	unlock();
}

EXPORT void fake_cuda_deinit(void)
{
	atomic_store(&g_initialized, false);
}

EXPORT bool fake_cuda_initialized(void)
{
	return atomic_load(&g_initialized);
}

EXPORT void fake_cuda_set_driver_version(int version)
{
	lock();
	g_driver_version = version;
	unlock();
}

EXPORT void fake_cuda_set_enter_hook(void (*cb)(const char *entry, void *arg), void *arg)
{
	atomic_store(&g_enter_hook_arg, arg);
	atomic_store(&g_enter_hook, cb);
}

EXPORT void fake_cuda_reset(void)
{
	lock();
	alloc_reset();
	mem_reset();
	vmm_reset();
	memset(g_faults, 0, sizeof(g_faults));
	atomic_store(&g_faults_armed, 0);
	proc_reset();
	pool_reset();
	ipc_reset();
	ctx_reset_state();
	g_init_error = CUDA_SUCCESS;
	g_driver_version = FAKE_CUDA_DRIVER_VERSION;
	dmabuf_reset();
	unlock();
	fake_cuda_reset_counters();
}

/* ---- Driver entry points -------------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
	CUresult rc;

	ENTER(cuInit, false);
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	rc = g_init_error;
	unlock();
	if (rc == CUDA_SUCCESS)
		atomic_store(&g_initialized, true);
	return rc;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
	ENTER(cuDriverGetVersion, false);
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	*version = g_driver_version;
	unlock();
	return CUDA_SUCCESS;
}

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} g_errors[] = {
	{ 0, "CUDA_SUCCESS", "no error" },
	{ 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ 3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ 4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ 201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ 500, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ 800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
	{ 801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ 999, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static CUresult error_lookup(CUresult error, const char **str, bool name)
{
	if (!str)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(g_errors) / sizeof(g_errors[0]); i++) {
		if (g_errors[i].code == error) {
			*str = name ? g_errors[i].name : g_errors[i].text;
			return CUDA_SUCCESS;
		}
	}
	*str = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **str)
{
	ENTER(cuGetErrorName, false);
	return error_lookup(error, str, true);
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **str)
{
	ENTER(cuGetErrorString, false);
	return error_lookup(error, str, false);
}
