/* SPDX-License-Identifier: MIT */
/*
 * The CUDA driver entry points the library intercepts: the one list of them. Define GDR_ENTRY, then
 * include this file; each row expands once, in this order, and GDR_ENTRY is undefined at the end.
 * Who reads it: lib/intercept/hooks.c (the hooks, the patch targets, each route's entry points),
 * the fake driver (tests/fake: its assembly entries, fake_entry_<arch>.S, and its call counters),
 * tests/unit/test_patch.c (the fake's entries the patcher must accept), tests/gpu/probes/
 * entry_bytes.c (by relative path: it is built on GPU machines on its own) and
 * tests/unit/check_entries.sh (the fake driver exports exactly the SIM rows). Nothing in it may
 * need a declaration until a row is expanded: preprocessed assembly includes it too.
 *
 * GDR_ENTRY(name, kind, route, fake, params, args, a, b)
 *  name    the symbol libcuda exports (hooks patch its entry: the address that dlsym and
 *          cuGetProcAddress hand out)
 *  kind    FREE: frees the range [a, a + b) (b 0: the whole allocation at a); its events go out
 *            before the driver's call (hooks.c, "A free hook").
 *          CTX: destroys, resets or releases a context (a, b: 0, unused); every cached entry is
 *            asked of the driver again after the call (but after the library's own releases that
 *            are proven not the last: hooks.c, borrow_lock).
 *          ALLOC: allocates the range [a, a + b) on success (b 0: no range); relieves and retries
 *            once on CUDA_ERROR_OUT_OF_MEMORY. Not required: the free events do not rest on it.
 *          EXPORT: exports the range [a, a + b) as a handle (its first parameter: where it is
 *            written; its fourth: the handle type); a dma-buf made for the program is recorded
 *            with its range (intercept/dmabufs.c), so that the preload can serve a registration of
 *            its fd from the cache. Not required: without it dma-buf registrations pass through.
 *  route   the enum gdr_free_route (include/gdrcache.h) its calls count under in
 *          gdr_intercept_stats.frees[]; NONE for ALLOC and EXPORT (hooks.c checks every route
 *          has a row)
 *  fake    SIM: the fake driver SIMULATES it (an assembly entry copying libcuda's entry bytes);
 *          NOSIM: the fake driver does not export it (a real libcuda does)
 *  params  its C parameters (lib/cuda/cuda_abi.h's types), args: their names as passed on; a and
 *          b are expressions of them, read after the call (ALLOC) or before it.
 */
/* A table laid out by hand: */
/* clang-format off */
/*        name                          kind   route                     fake   params, args, a, b */
GDR_ENTRY(cuMemFree_v2,                 FREE,  GDR_FREE_MEM_FREE,        SIM,   (gdr_CUdeviceptr p),
	  (p), p, 0)
GDR_ENTRY(cuMemFree,                    FREE,  GDR_FREE_MEM_FREE,        NOSIM, (unsigned int p),
	  (p), p, 0)
GDR_ENTRY(cuMemFreeAsync,               FREE,  GDR_FREE_MEM_FREE_ASYNC,  SIM,
	  (gdr_CUdeviceptr p, void *s), (p, s), p, 0)
GDR_ENTRY(cuMemFreeAsync_ptsz,          FREE,  GDR_FREE_MEM_FREE_ASYNC,  SIM,
	  (gdr_CUdeviceptr p, void *s), (p, s), p, 0)
GDR_ENTRY(cuMemFreeHost,                FREE,  GDR_FREE_MEM_FREE_HOST,   SIM,   (void *p),
	  (p), (uintptr_t)p, 0)
GDR_ENTRY(cuMemUnmap,                   FREE,  GDR_FREE_MEM_UNMAP,       SIM,
	  (gdr_CUdeviceptr p, size_t n), (p, n), p, n ? n : 1)
GDR_ENTRY(cuIpcCloseMemHandle,          FREE,  GDR_FREE_IPC_CLOSE,       SIM,   (gdr_CUdeviceptr p),
	  (p), p, 0)
GDR_ENTRY(cuCtxDestroy,                 CTX,   GDR_FREE_CTX,             SIM,   (gdr_CUcontext c),
	  (c), 0, 0)
GDR_ENTRY(cuCtxDestroy_v2,              CTX,   GDR_FREE_CTX,             SIM,   (gdr_CUcontext c),
	  (c), 0, 0)
GDR_ENTRY(cuDevicePrimaryCtxReset,      CTX,   GDR_FREE_CTX,             SIM,   (gdr_CUdevice d),
	  (d), 0, 0)
GDR_ENTRY(cuDevicePrimaryCtxReset_v2,   CTX,   GDR_FREE_CTX,             SIM,   (gdr_CUdevice d),
	  (d), 0, 0)
GDR_ENTRY(cuDevicePrimaryCtxRelease,    CTX,   GDR_FREE_CTX,             SIM,   (gdr_CUdevice d),
	  (d), 0, 0)
GDR_ENTRY(cuDevicePrimaryCtxRelease_v2, CTX,   GDR_FREE_CTX,             SIM,   (gdr_CUdevice d),
	  (d), 0, 0)
GDR_ENTRY(cuMemAlloc_v2,                ALLOC, NONE,                     SIM,
	  (gdr_CUdeviceptr *p, size_t n), (p, n), *p, n)
GDR_ENTRY(cuMemAllocPitch_v2,           ALLOC, NONE,                     NOSIM,
	  (gdr_CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e),
	  (p, pitch, w, h, e), *p, *pitch * h)
GDR_ENTRY(cuMemAllocAsync,              ALLOC, NONE,                     SIM,
	  (gdr_CUdeviceptr *p, size_t n, void *s), (p, n, s), *p, n)
GDR_ENTRY(cuMemAllocAsync_ptsz,         ALLOC, NONE,                     SIM,
	  (gdr_CUdeviceptr *p, size_t n, void *s), (p, n, s), *p, n)
GDR_ENTRY(cuMemAllocFromPoolAsync,      ALLOC, NONE,                     SIM,
	  (gdr_CUdeviceptr *p, size_t n, void *pool, void *s), (p, n, pool, s), *p, n)
GDR_ENTRY(cuMemAllocFromPoolAsync_ptsz, ALLOC, NONE,                     NOSIM,
	  (gdr_CUdeviceptr *p, size_t n, void *pool, void *s), (p, n, pool, s), *p, n)
GDR_ENTRY(cuMemAllocManaged,            ALLOC, NONE,                     SIM,
	  (gdr_CUdeviceptr *p, size_t n, unsigned int f), (p, n, f), *p, n)
GDR_ENTRY(cuMemAllocHost_v2,            ALLOC, NONE,                     SIM,
	  (void **p, size_t n), (p, n), *p, n)
GDR_ENTRY(cuMemCreate,                  ALLOC, NONE,                     SIM,
	  (void *h, size_t n, const void *prop, unsigned long long f), (h, n, prop, f), 0, 0)
GDR_ENTRY(cuMemMap,                     ALLOC, NONE,                     SIM,
	  (gdr_CUdeviceptr p, size_t n, size_t off, unsigned long long h, unsigned long long f),
	  (p, n, off, h, f), p, n)
GDR_ENTRY(cuMemGetHandleForAddressRange, EXPORT, NONE,                    SIM,
	  (void *h, gdr_CUdeviceptr p, size_t n, int type, unsigned long long f),
	  (h, p, n, type, f), p, n)
/* clang-format on */
#undef GDR_ENTRY
