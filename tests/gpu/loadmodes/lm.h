/* SPDX-License-Identifier: MIT */
/*
 * The load-mode matrix's engine (lm_core.c): one code path for every way libgdrcache can be in a
 * process. It binds to the library however the caller loaded it, runs T threads that register
 * random ranges of a table of live buffers and check every registration's buffer id against the
 * driver's CU_POINTER_ATTRIBUTE_BUFFER_ID (a mismatch is a stale registration), while the same
 * threads free and reallocate those buffers through the allocator under test (same size, so the
 * driver hands the VA back); then the memory test; and prints one "LMROW key=value ..." line.
 *
 * Built three ways: into an executable linked with -lgdrcache (LM_DIRECT), into libmw.so, a
 * "middleware" library linked with -lgdrcache that the executable links (LM_DIRECT), and without
 * a link to the library (liblmdyn.so or an executable: bound to a dlopen handle or to a preloaded
 * copy). The Python worker (lm_torch.py) loads libmw.so or liblmdyn.so with ctypes and hands the
 * allocator in as callbacks into torch.
 *
 * Environment: LM_THREADS (8), LM_REGS (1000000: registrations per run; refusals of memory the
 * driver does not export, -EOPNOTSUPP, are not counted, up to 10 x LM_REGS attempts), LM_FREE_EVERY
 * (100: one operation in this many is a free + reallocation), LM_SLOTS (64 buffers), LM_SIZES
 * (their sizes in bytes, comma-separated, slot i taking size i mod n),
 * LM_MAX_SECONDS (60: the churn stops early, and says so), LM_MEM_FRACTION (0.95), LM_MEM_CHUNK_MIB
 * (1024).
 */
#ifndef LM_H
#define LM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The allocator under test. alloc and free return 0 on success. flush (may be NULL) returns memory
 * a caching allocator holds to the driver (torch.cuda.empty_cache). The callbacks are called from
 * the engine's threads, each with the primary context of GPU 0 current. */
struct lm_alloc_ops {
	int (*alloc)(uint64_t size, uint64_t *ptr);
	int (*free)(uint64_t ptr, uint64_t size);
	void (*flush)(void);
};

/* Bind to libgdrcache. 0, or -1 with the reason printed ("SKIP: ..." where the mode cannot run). */
int lm_bind_direct(void);            /* linked (LM_DIRECT builds only) */
int lm_bind_handle(void *handle);    /* a dlopen handle (ctypes: CDLL(...)._handle) */
int lm_bind_loaded(void);            /* the copy already in the process (LD_PRELOAD) */

/* Load the driver for the engine's own queries, make GPU 0's primary context current. 0 or -1. */
int lm_cuda_init(void);

/* The churn, in three steps so that a caller can count its allocator's frees around lm_churn_run
 * alone: fill the buffer table, run the threads, free the table. 0 or -1 (cannot run at all). */
int lm_churn_setup(const struct lm_alloc_ops *ops);
int lm_churn_run(const struct lm_alloc_ops *ops);
void lm_churn_teardown(const struct lm_alloc_ops *ops);

/* The memory test: a cache allowed 1 TiB of unreferenced pins; chunks covering LM_MEM_FRACTION of
 * free memory allocated, registered and released; all freed; cuMemGetInfo; the same allocated
 * again. 0 pass, 1 fail, -1 could not run. */
int lm_memtest(const struct lm_alloc_ops *ops);

/* Print the row (LMROW line) and the details. frees_made < 0: the engine's own count of frees.
 * Returns the exit status: 0, or 1 when a registration was stale or the memory test failed. */
int lm_report(const char *mode, const char *alloc, int64_t frees_made, const char *frees_src);

/* The engine's count of frees made in lm_churn_run. */
uint64_t lm_frees_made(void);

#ifdef __cplusplus
}
#endif

#endif
