/* SPDX-License-Identifier: MIT */
/*
 * The load-mode matrix's C program: the allocator under test is the driver API (LM_ALLOC_DRIVER:
 * cuMemAlloc_v2 / cuMemFree_v2, called directly, linked -lcuda) or the CUDA runtime
 * (LM_ALLOC_RUNTIME: cudaMalloc / cudaFree, static or shared cudart by the link). How libgdrcache
 * is in the process is the build plus argv[1]:
 *   linked         built with the engine and -lgdrcache (ahead of -lcuda)
 *   mw             built against libmw.so only, which carries the engine and links -lgdrcache
 *   dlopen-after   dlopen(RTLD_NOW | RTLD_LOCAL) after CUDA is initialised and has allocated
 *   dlopen-before  dlopen before anything touches CUDA
 *   preload        LD_PRELOAD=libgdrcache.so.0 (the executable has no link to it)
 * $LM_GDR_LIB is the library's path for the dlopen modes. Usage: lm_<how>_<alloc> MODE LABEL.
 * Exit 0, 1 (stale registration, memory test failed), 77 (skip: the mode cannot be set up).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm.h"

#if defined(LM_ALLOC_DRIVER)
#include <cuda.h>

static int a_alloc(uint64_t size, uint64_t *ptr)
{
	CUdeviceptr p = 0;
	int rc = (int)cuMemAlloc(&p, size);

	*ptr = p;
	return rc;
}

static int a_free(uint64_t ptr, uint64_t size)
{
	(void)size;
	return (int)cuMemFree((CUdeviceptr)ptr);
}

/* CUDA initialised as a driver-API program does it, and one allocation made and freed. */
static int a_init(void)
{
	CUdevice dev;
	CUcontext ctx;
	uint64_t p;

	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
	    cuCtxSetCurrent(ctx))
		return -1;
	if (a_alloc(1 << 20, &p))
		return -1;
	return a_free(p, 1 << 20);
}
#elif defined(LM_ALLOC_RUNTIME)
#include <cuda_runtime_api.h>

static int a_alloc(uint64_t size, uint64_t *ptr)
{
	void *p = NULL;
	int rc = (int)cudaMalloc(&p, size);

	*ptr = (uint64_t)(uintptr_t)p;
	return rc;
}

static int a_free(uint64_t ptr, uint64_t size)
{
	(void)size;
	return (int)cudaFree((void *)(uintptr_t)ptr);
}

static int a_init(void)
{
	uint64_t p;

	if (cudaSetDevice(0) || cudaFree(0))
		return -1;
	if (a_alloc(1 << 20, &p))
		return -1;
	return a_free(p, 1 << 20);
}
#else
#error "LM_ALLOC_DRIVER or LM_ALLOC_RUNTIME"
#endif

static const struct lm_alloc_ops ops = { .alloc = a_alloc, .free = a_free, .flush = NULL };

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "?", *label = argc > 2 ? argv[2] : "?";
	const char *path = getenv("LM_GDR_LIB");
	int rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "dlopen-before") &&
	    lm_bind_handle(dlopen(path ? path : "libgdrcache.so.0", RTLD_NOW | RTLD_LOCAL)))
		return 77;
	if (a_init()) {
		printf("SKIP: CUDA initialisation failed\n");
		return 77;
	}
	if (lm_cuda_init())
		return 77;
	if (!strcmp(mode, "dlopen-after"))
		rc = lm_bind_handle(dlopen(path ? path : "libgdrcache.so.0", RTLD_NOW | RTLD_LOCAL));
	else if (!strcmp(mode, "preload"))
		rc = lm_bind_loaded();
	else if (!strcmp(mode, "linked") || !strcmp(mode, "mw"))
		rc = lm_bind_direct();
	else
		rc = !!strcmp(mode, "dlopen-before");
	if (rc) {
		printf("SKIP: mode %s could not be set up\n", mode);
		return 77;
	}
	if (lm_churn_setup(&ops))
		return 1;
	lm_churn_run(&ops);
	lm_churn_teardown(&ops);
	lm_memtest(&ops);
	return lm_report(mode, label, -1, "program");
}
