/* SPDX-License-Identifier: MIT */
/*
 * Interception of the CUDA driver's free and allocation entry points (hooks.c): what it needs from
 * the rest of the library and offers it.
 */
#ifndef GDRCACHE_HOOKS_H
#define GDRCACHE_HOOKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_abi.h"

#define GDR_HIDDEN __attribute__((visibility("hidden")))

/* hooks.c */
/* Patch libcuda's free and allocation entry points (once, from gdr_cuda_load). fresh: libcuda was
 * loaded by this call's caller, so no thread can be inside it. The outcome is what
 * gdr_events_probe() starts from. */
GDR_HIDDEN void gdr_hooks_install(void *libcuda, bool fresh);
/* Set when a free's pin release was left for later (nested hook, or a thread holding a cache
 * lock): cache_unlock() and the outermost hook apply events while it is set. */
extern GDR_HIDDEN int gdr_hooks_release_pending;
/* One line of what the interception saw, for GDRCACHE_STATS. */
GDR_HIDDEN void gdr_hooks_stats_line(char *buf, size_t n);

/* cache.c, for the hooks */
/* Cache locks this thread holds (a hook must not wait for one then). */
extern GDR_HIDDEN __thread int gdr_cache_locks_held __attribute__((tls_model("initial-exec")));
/* Apply pending free events in every cache now, releasing unreferenced pins of freed memory.
 * Returns the number of pins released. Takes each cache's lock in turn. */
GDR_HIDDEN uint64_t gdr_caches_apply_events(void);
/* Release every unreferenced pin of every cache (out-of-memory relief). Returns how many. */
GDR_HIDDEN uint64_t gdr_caches_relieve(void);
/* Registrations that waited for a free in flight, summed over caches. */
GDR_HIDDEN uint64_t gdr_caches_reg_waits(void);

/* cuda.c */
/* libcuda's dlopen handle once gdr_cuda_load() succeeded, else NULL. */
GDR_HIDDEN void *gdr_cuda_libcuda_handle(void);
/* Make the device's primary context current on a thread that has none or another device's (an
 * opaque token for gdr_cuda_context_return; NULL with *err -ENXIO or -ENOMEM when it could not) /
 * undo it. */
GDR_HIDDEN void *gdr_cuda_context_borrow(int device, int *err);
GDR_HIDDEN void gdr_cuda_context_return(void *borrowed);
/* After a context was destroyed: forget which contexts have CU_CTX_SYNC_MEMOPS. */
GDR_HIDDEN void gdr_cuda_contexts_changed(void);
/* Whether the device's primary context is active: 1, 0, or -1 (cannot tell). */
GDR_HIDDEN int gdr_cuda_primary_active(gdr_CUdevice dev);

#endif /* GDRCACHE_HOOKS_H */
