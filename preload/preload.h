/* SPDX-License-Identifier: MIT */
/* libgdrcache-preload: what its files share (interpose.c, mrtab.c, classify.c, dlsym.c). */
#ifndef GDR_PRELOAD_H
#define GDR_PRELOAD_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

#include <gdrcache.h>

#include "common/private.h"

/* Logging: the library's logger (format, rate limit, GDRCACHE_LOG_FILE) and GDRCACHE_LOG as the
 * library parses it (lib/common/private.h); the preload's own level, since it may turn the
 * library's off on its path (interpose.c: cache_create). */
extern int gdrp_log_level;
#define gdrp_log(level, ...)                                                                       \
	do {                                                                                       \
		if ((level) <= gdrp_log_level)                                                     \
			gdr_private_log(level, __func__, __LINE__, __VA_ARGS__);                   \
	} while (0)
#define gdrp_err(...) gdrp_log(GDR_LOG_ERROR, __VA_ARGS__)
#define gdrp_warn(...) gdrp_log(GDR_LOG_WARN, __VA_ARGS__)
#define gdrp_info(...) gdrp_log(GDR_LOG_INFO, __VA_ARGS__)
#define gdrp_debug(...) gdrp_log(GDR_LOG_DEBUG, __VA_ARGS__)

/*
 * An MR handed to the program for a cached registration: a shadow of the cache's MR with the
 * caller's addr and length and the cached MR's context, pd, handle and keys. The program owns the
 * pointer until ibv_dereg_mr; the record behind it says what backs it.
 */
enum gdrp_kind {
	GDRP_CACHED = 0,  /* a reference on a cache registration (gdr_region) */
	GDRP_WRAPPED = 1, /* a real MR of libibverbs (a cached MR re-registered onto host memory) */
	GDRP_ORPHAN = 2,  /* its device was closed while the program held it: nothing behind it */
};

struct gdrp_rec {
	struct ibv_mr mr; /* what the program sees; first, so that &rec->mr == rec */
	enum gdrp_kind kind;
	struct gdr_region *region; /* GDRP_CACHED */
	struct ibv_mr *real;       /* GDRP_WRAPPED */
	int access;                /* for ibv_rereg_mr without IBV_REREG_MR_CHANGE_ACCESS */
	bool dmabuf;               /* GDRP_CACHED: by ibv_reg_dmabuf_mr (addr: the offset) */
};

/* mrtab.c: the records handed out (their hit path: mrtab.h) and the PDs the cache has MRs for. */
uint64_t gdrp_rec_count(void);       /* records made so far (each is kept for reuse) */
int gdrp_pd_note(struct ibv_pd *pd); /* 0 or -ENOMEM */
/* Whether pd was noted; *notes: how many times so far (gdrp_pd_forget). */
bool gdrp_pd_known(struct ibv_pd *pd, uint64_t *notes);
/* Forgets pd; with notes, unless it was noted again since gdrp_pd_known said *notes: a PD another
 * thread allocated at its address once it was deallocated, and registered with. */
void gdrp_pd_forget(struct ibv_pd *pd, const uint64_t *notes);
/* Fills up to max PDs of ctx; returns how many there are. */
unsigned gdrp_pds_of(struct ibv_context *ctx, struct ibv_pd **pds, unsigned max);
/* Turns pd's held cached records into orphans; fills up to max of their regions (which the caller
 * releases) and returns how many there were. */
unsigned gdrp_orphan_pd(struct ibv_pd *pd, struct gdr_region **regions, unsigned max);
void gdrp_mrtab_atfork(void);

/* interpose.c: the configuration (the library's parser), read once libc has an environment. */
extern struct gdr_private_config gdrp_cfg;

/* classify.c: whether the CUDA driver already loaded in this process calls addr device memory. */
bool gdrp_is_gpu(const void *addr);
/* Whether the program has loaded the CUDA driver (classify.c). */
bool gdrp_cuda_loaded(void);

/* interpose.c: what a dlsym / dlvsym lookup of name (version: NULL for dlsym) that found `found`
 * hands back: for libibverbs' own definition of an interposed entry point, the preload's interposer
 * of that definition; for the preload's definition of one this libibverbs lacks, what the lookup
 * finds without the preload; anything else as it is. */
void *gdrp_verbs_lookup(void *found, const char *name, const char *version);
/* The preload's one-time set-up (its constructor's): every interposer calls it first. */
void gdrp_setup(void);
/* An interposer exported under a versioned name. */
#define GDRP_SYMBOL(versioned) __attribute__((visibility("default"), symver(versioned)))

/* dlsym.c: the value of a loaded object's dynamic entry tag (0: none), an address (addr) made
 * absolute. */
struct link_map;
uintptr_t gdrp_dyn(const struct link_map *l, long tag, bool addr);

/* compat-1_0.c: the IBVERBS_1.0 interposers and libibverbs' 1.0 definitions (1.0-layout
 * objects), resolved by interpose.c's binding table. */
/* Nonzero while this thread is inside libibverbs' 1.0 ibv_reg_mr (interpose.c: own_reg_mr_iova2). */
extern __thread unsigned gdrp_in_1_0 __attribute__((tls_model("initial-exec")));
struct gdrp_real_1_0 {
	struct ibv_mr *(*reg_mr)(void *pd, void *addr, size_t len, int access);
	int (*dereg_mr)(void *mr);
	int (*dealloc_pd)(void *pd);
	int (*close_device)(void *ctx);
};
extern struct gdrp_real_1_0 gdrp_real_1_0;
struct ibv_mr *gdrp_reg_mr_1_0(void *pd, void *addr, size_t len, int access);
int gdrp_dereg_mr_1_0(void *mr);
int gdrp_dealloc_pd_1_0(void *pd);
int gdrp_close_device_1_0(void *ctx);

/* dlsym.c: libc's dlsym / dlvsym (or the next interposer's), bypassing the preload's. Called from
 * this library, RTLD_NEXT means "after the preload". */
void *gdrp_real_dlsym(void *h, const char *name);
void *gdrp_real_dlvsym(void *h, const char *name, const char *version);

#endif /* GDR_PRELOAD_H */
