/* SPDX-License-Identifier: MIT */
/*
 * Interception of the CUDA driver's free entry points (hooks.c, hooks_export.c): what the two files
 * share, and the few additions to cuda.c they use. See hooks.c for how it works.
 */
#ifndef GDRCACHE_HOOKS_H
#define GDRCACHE_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_abi.h"

#define GDR_HIDDEN __attribute__((visibility("hidden")))

/* hooks.c. Called from the dlsym / dlvsym trampolines of hooks_export.c with the caller's
 * arguments: the function the trampoline jumps to with the same arguments (and the caller's return
 * address): the next dlsym / dlvsym in the process, or a hooked lookup that wraps the answer. Never
 * NULL. Safe before constructors and before any sanitizer runtime is initialised. */
GDR_HIDDEN void *gdr_hooks_dlsym_route(void *handle, const char *name);
GDR_HIDDEN void *gdr_hooks_dlvsym_route(void *handle, const char *name, const char *version);
/* The next dlsym after libgdrcache (libc's when none): what a pass-through calls. */
GDR_HIDDEN void *gdr_hooks_real_dlsym(void *handle, const char *name);
/* What a cuGetProcAddress wrapper hands out for what the driver answered for sym. */
GDR_HIDDEN void *gdr_hooks_wrap_proc(const char *sym, int version, void *fn);
/* libcuda's own definition of an exported entry point (for the exported forwarders), or NULL. */
GDR_HIDDEN void *gdr_hooks_libcuda_sym(const char *name);

/* hooks_export.c defines this (shared library only; the static test library lacks it): the
 * forwarders libgdrcache exports under the driver's names, so that a lookup that finds one of
 * them does not wrap it a second time. NULL-terminated. */
extern GDR_HIDDEN void *const gdr_hooks_exported[] __attribute__((weak));

/* cuda.c additions. */
/* libcuda's dlopen handle once gdr_cuda_load() succeeded, else NULL. */
GDR_HIDDEN void *gdr_cuda_libcuda_handle(void);
/* Make the device's primary context current on a thread that has none (NULL when nothing was
 * borrowed; *err -ENXIO when a context was needed and none could be had) / undo it. */
GDR_HIDDEN gdr_CUcontext gdr_cuda_context_borrow(int device, int *err);
GDR_HIDDEN void gdr_cuda_context_return(gdr_CUcontext borrowed);

#endif /* GDRCACHE_HOOKS_H */
