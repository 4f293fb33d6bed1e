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

#include "common/defs.h"

struct gdr_intercept_stats;

/* hooks.c */
/* Load the CUDA driver (cuda/cuda.h, gdr_cuda_load) with the interception as its watch: the hooks
 * are installed between libcuda's dlopen and cuInit, and the loader's own context borrows and
 * dma-buf exports are told apart from the application's. What every layer above calls instead of
 * gdr_cuda_load. 0, or -ENODEV. */
GDR_HIDDEN int gdr_driver_load(void);
/* Patch libcuda's free and allocation entry points (once, the watch's loaded: from the first
 * gdr_driver_load). fresh: libcuda was loaded by this call's caller, so no thread can be inside it.
 * The outcome is what gdr_events_probe() starts from. */
GDR_HIDDEN void gdr_hooks_install(void *libcuda, bool fresh);
/* The interception's mode (enum gdr_intercept) asked by a cache's attribute, before libcuda is
 * loaded: it overrides GDRCACHE_INTERCEPT. 0, or -EALREADY (another mode was decided: libcuda was
 * loaded). */
GDR_HIDDEN int gdr_hooks_ask(int mode);
/* The mode decided when libcuda was loaded (enum gdr_intercept), -1 before. */
GDR_HIDDEN int gdr_hooks_mode(void);
/* Whether the free interception works in this process, proven once by a free (of an address no
 * allocation holds: no context needed) through each path a program may use to reach the driver.
 * 0, or -errno with *why (static text). Needs gdr_driver_load() to have succeeded. Cached after the
 * first call. What a cache asks before it validates by events (a test may give a cache another:
 * cache/seams.h). */
GDR_HIDDEN int gdr_events_probe(const char **why);
/* The library's borrows of a primary context (cuda.c, context_borrow): _begin before it looks at
 * the context's state (and retains it), _looked after (whether it retained), in between under a
 * lock. _begin returns the borrow's token: what proves, at its release, that the application held
 * a reference throughout (hooks.c, borrow_lock). gdr_hooks_own_release(token) around the borrow's
 * release of its reference, then gdr_hooks_own_release(0): a release so proven not the last is no
 * free; any other is handled as the application's context release (and counted apart). */
GDR_HIDDEN uint64_t gdr_hooks_borrow_begin(void);
GDR_HIDDEN void gdr_hooks_borrow_looked(bool retained);
GDR_HIDDEN void gdr_hooks_own_release(uint64_t token);
/* Around the library's own dma-buf exports (cuda.c): not recorded as the program's (dmabufs.h). */
GDR_HIDDEN void gdr_hooks_own_export(bool on);
/* One line of what the interception saw, for GDRCACHE_STATS. */
GDR_HIDDEN void gdr_hooks_stats_line(char *buf, size_t n);

/* The interception's statistics (include/gdrcache.h, gdr_intercept_get_stats), all but reg_waits: the
 * caches' count, which the exported function (cache/apply.c) adds. errno is kept. */
GDR_HIDDEN void gdr_hooks_get_stats(struct gdr_intercept_stats *out);

#endif /* GDRCACHE_HOOKS_H */
