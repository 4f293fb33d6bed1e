/* SPDX-License-Identifier: MIT */
/*
 * What libgdrcache.so exports for the free interception (hooks.c says how it works): dlsym and
 * dlvsym under glibc's version nodes, the same trampolines as gdr_private_dlsym / _dlvsym for
 * libgdrcache-preload.so, forwarders under the driver's own names, and gdr_private_events_* for
 * tests and the preload library. Built into the shared library only: the static library the unit
 * tests link has none of it, so an executable linked with it keeps libc's dlsym.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

#include "events.h"
#include "hooks.h"

#define GDR_EXPORT __attribute__((visibility("default")))

/* ---- dlsym / dlvsym ---------------------------------------------------------------------------- *
 * Save the arguments, ask the route where to go, restore them and jump: the callee sees the
 * caller's return address, whatever the compiler's options (a C pass-through is a tail call only
 * when the optimiser makes it one; ASan and -O0 builds do not). Labels are aliases of one entry:
 * gdr_hooks_dlsym_234 becomes dlsym@@GLIBC_2.34, gdr_hooks_dlsym_225 the compat dlsym@GLIBC_2.2.5
 * (what programs linked against glibc < 2.34, static cudart included, reference). */
#if defined(__x86_64__)
#ifdef __CET__
#define GDR_ENDBR "endbr64\n\t"
#else
#define GDR_ENDBR ""
#endif
__asm__(".text\n\t"
	".p2align 4\n\t"
	".globl gdr_private_dlsym\n\t"
	".type gdr_private_dlsym, @function\n\t"
	".globl gdr_hooks_dlsym_234\n\t"
	".type gdr_hooks_dlsym_234, @function\n\t"
	".globl gdr_hooks_dlsym_225\n\t"
	".type gdr_hooks_dlsym_225, @function\n"
	"gdr_private_dlsym:\n"
	"gdr_hooks_dlsym_234:\n"
	"gdr_hooks_dlsym_225:\n\t"
	".cfi_startproc\n\t"
	GDR_ENDBR
	"pushq %rdi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"pushq %rsi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"subq $8, %rsp\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"call gdr_hooks_dlsym_route\n\t"
	"addq $8, %rsp\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rsi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rdi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"jmp *%rax\n\t"
	".cfi_endproc\n\t"
	".size gdr_private_dlsym, .-gdr_private_dlsym\n\t"
	".size gdr_hooks_dlsym_234, .-gdr_hooks_dlsym_234\n\t"
	".size gdr_hooks_dlsym_225, .-gdr_hooks_dlsym_225\n\t"
	".symver gdr_hooks_dlsym_234, dlsym@@GLIBC_2.34\n\t"
	".symver gdr_hooks_dlsym_225, dlsym@GLIBC_2.2.5\n\t"

	".p2align 4\n\t"
	".globl gdr_private_dlvsym\n\t"
	".type gdr_private_dlvsym, @function\n\t"
	".globl gdr_hooks_dlvsym_234\n\t"
	".type gdr_hooks_dlvsym_234, @function\n\t"
	".globl gdr_hooks_dlvsym_225\n\t"
	".type gdr_hooks_dlvsym_225, @function\n"
	"gdr_private_dlvsym:\n"
	"gdr_hooks_dlvsym_234:\n"
	"gdr_hooks_dlvsym_225:\n\t"
	".cfi_startproc\n\t"
	GDR_ENDBR
	"pushq %rdi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"pushq %rsi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"pushq %rdx\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"call gdr_hooks_dlvsym_route\n\t"
	"popq %rdx\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rsi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rdi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"jmp *%rax\n\t"
	".cfi_endproc\n\t"
	".size gdr_private_dlvsym, .-gdr_private_dlvsym\n\t"
	".size gdr_hooks_dlvsym_234, .-gdr_hooks_dlvsym_234\n\t"
	".size gdr_hooks_dlvsym_225, .-gdr_hooks_dlvsym_225\n\t"
	".symver gdr_hooks_dlvsym_234, dlvsym@@GLIBC_2.34\n\t"
	".symver gdr_hooks_dlvsym_225, dlvsym@GLIBC_2.2.5\n\t"
	".text");
#else
/* No trampolines here yet (a few instructions per architecture): libgdrcache exports no dlsym, so
 * gdr_events_probe() fails and the caches check tags. The private entries still answer, without
 * the caller's return address (RTLD_NEXT through them is relative to libgdrcache). */
GDR_EXPORT void *gdr_private_dlsym(void *h, const char *name);
void *gdr_private_dlsym(void *h, const char *name)
{
	return ((void *(*)(void *, const char *))gdr_hooks_dlsym_route(h, name))(h, name);
}

GDR_EXPORT void *gdr_private_dlvsym(void *h, const char *name, const char *version);
void *gdr_private_dlvsym(void *h, const char *name, const char *version)
{
	return ((void *(*)(void *, const char *, const char *))gdr_hooks_dlvsym_route(h, name, version))(
		h, name, version);
}
#endif

/* ---- Forwarders under the driver's names ------------------------------------------------------- *
 * For a program linked with -lgdrcache ahead of -lcuda that calls these directly, and for
 * dlsym(RTLD_DEFAULT, ...) lookups that find them first. Each resolves libcuda's own definition
 * once (a handle lookup, which never finds these) and publishes the event before calling it. */

#define RESOLVE(name, type)                                                                        \
	static __typeof__(type) real_;                                                             \
	__typeof__(type) f_ = __atomic_load_n(&real_, __ATOMIC_ACQUIRE);                           \
	if (!f_) {                                                                                 \
		f_ = (__typeof__(type))gdr_hooks_libcuda_sym(name);                                \
		if (!f_)                                                                           \
			return GDR_CUDA_ERROR_NOT_INITIALIZED;                                     \
		__atomic_store_n(&real_, f_, __ATOMIC_RELEASE);                                    \
	}

/* Each forwarder is a hidden function, exported under the driver's name by an alias: this
 * library's own references (gdr_hooks_exported) then bind to it even where libcuda comes first in
 * the global scope and the exported name resolves to libcuda's. */
#define FORWARD1(name, t1, push_start, push_len)                                                   \
	static gdr_CUresult gdr_fwd_##name(t1 a)                                                   \
	{                                                                                          \
		gdr_events_push(push_start, push_len);                                             \
		RESOLVE(#name, gdr_CUresult (*)(t1))                                               \
		return f_(a);                                                                      \
	}                                                                                          \
	GDR_EXPORT gdr_CUresult name(t1 a) __attribute__((alias("gdr_fwd_" #name)));
#define FORWARD2(name, t1, t2, push_start, push_len)                                               \
	static gdr_CUresult gdr_fwd_##name(t1 a, t2 b)                                             \
	{                                                                                          \
		gdr_events_push(push_start, push_len);                                             \
		RESOLVE(#name, gdr_CUresult (*)(t1, t2))                                           \
		return f_(a, b);                                                                   \
	}                                                                                          \
	GDR_EXPORT gdr_CUresult name(t1 a, t2 b) __attribute__((alias("gdr_fwd_" #name)));

FORWARD1(cuMemFree_v2, gdr_CUdeviceptr, a, 0)
FORWARD1(cuMemFree, unsigned int, a, 0)
FORWARD2(cuMemFreeAsync, gdr_CUdeviceptr, void *, a, 0)
FORWARD2(cuMemFreeAsync_ptsz, gdr_CUdeviceptr, void *, a, 0)
FORWARD1(cuMemFreeHost, void *, (uintptr_t)a, 0)
FORWARD2(cuMemUnmap, gdr_CUdeviceptr, size_t, a, b)
FORWARD1(cuIpcCloseMemHandle, gdr_CUdeviceptr, a, 0)
FORWARD1(cuCtxDestroy, gdr_CUcontext, 0, GDR_EVENT_ALL_LEN)
FORWARD1(cuCtxDestroy_v2, gdr_CUcontext, 0, GDR_EVENT_ALL_LEN)
FORWARD1(cuDevicePrimaryCtxReset, gdr_CUdevice, 0, GDR_EVENT_ALL_LEN)
FORWARD1(cuDevicePrimaryCtxReset_v2, gdr_CUdevice, 0, GDR_EVENT_ALL_LEN)
FORWARD1(cuDevicePrimaryCtxRelease, gdr_CUdevice, 0, GDR_EVENT_ALL_LEN)
FORWARD1(cuDevicePrimaryCtxRelease_v2, gdr_CUdevice, 0, GDR_EVENT_ALL_LEN)

/* cuGetProcAddress (v1 ABI, as libcuda exports it under this name) and _v2: what they hand out is
 * wrapped as through the dlsym route. */
static gdr_CUresult gdr_fwd_cuGetProcAddress(const char *sym, void **pfn, int version,
					    uint64_t flags)
{
	RESOLVE("cuGetProcAddress", gdr_cuGetProcAddress_v1_t)
	gdr_CUresult rc = f_(sym, pfn, version, flags);

	if (rc == GDR_CUDA_SUCCESS && pfn && *pfn)
		*pfn = gdr_hooks_wrap_proc(sym, version, *pfn);
	return rc;
}

static gdr_CUresult gdr_fwd_cuGetProcAddress_v2(const char *sym, void **pfn, int version,
					       uint64_t flags, int *status)
{
	RESOLVE("cuGetProcAddress_v2", gdr_cuGetProcAddress_v2_t)
	gdr_CUresult rc = f_(sym, pfn, version, flags, status);

	if (rc == GDR_CUDA_SUCCESS && pfn && *pfn)
		*pfn = gdr_hooks_wrap_proc(sym, version, *pfn);
	return rc;
}

GDR_EXPORT gdr_CUresult cuGetProcAddress(const char *sym, void **pfn, int version, uint64_t flags)
	__attribute__((alias("gdr_fwd_cuGetProcAddress")));
GDR_EXPORT gdr_CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version,
					    uint64_t flags, int *status)
	__attribute__((alias("gdr_fwd_cuGetProcAddress_v2")));

void *const gdr_hooks_exported[] = {
	(void *)gdr_fwd_cuMemFree_v2, (void *)gdr_fwd_cuMemFree, (void *)gdr_fwd_cuMemFreeAsync,
	(void *)gdr_fwd_cuMemFreeAsync_ptsz, (void *)gdr_fwd_cuMemFreeHost,
	(void *)gdr_fwd_cuMemUnmap, (void *)gdr_fwd_cuIpcCloseMemHandle,
	(void *)gdr_fwd_cuCtxDestroy, (void *)gdr_fwd_cuCtxDestroy_v2,
	(void *)gdr_fwd_cuDevicePrimaryCtxReset, (void *)gdr_fwd_cuDevicePrimaryCtxReset_v2,
	(void *)gdr_fwd_cuDevicePrimaryCtxRelease, (void *)gdr_fwd_cuDevicePrimaryCtxRelease_v2,
	(void *)gdr_fwd_cuGetProcAddress, (void *)gdr_fwd_cuGetProcAddress_v2, NULL,
};

/* ---- Private entry points (GDRCACHE_PRIVATE: no compatibility promise) ------------------------- */

/* gdr_events_probe() (events.h) for the preload library and tests. */
GDR_EXPORT int gdr_private_events_probe(const char **why);
int gdr_private_events_probe(const char **why)
{
	return gdr_events_probe(why);
}

/* The event ring (events.h), read-only, for tests and diagnostics. */
GDR_EXPORT uint64_t gdr_private_events_head(void);
uint64_t gdr_private_events_head(void)
{
	return gdr_events_head();
}

GDR_EXPORT int gdr_private_events_get(uint64_t seq, uint64_t *start, uint64_t *len);
int gdr_private_events_get(uint64_t seq, uint64_t *start, uint64_t *len)
{
	struct gdr_event ev;
	int rc = gdr_events_get(seq, &ev);

	if (!rc)
		*start = ev.start, *len = ev.len;
	return rc;
}
