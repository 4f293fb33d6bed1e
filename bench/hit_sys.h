/* SPDX-License-Identifier: MIT */
/*
 * The registration caches bench_hit compares, behind one set of calls. Every one pins through the
 * same callbacks (hit_cuda.h: SYNC_MEMOPS + dma-buf export, closed at unpin), as libgdrcache's
 * dmabuf backend does, and registers without a PD (no NIC on the GPU machine).
 *
 *   gdr-events  libgdrcache, GDR_VALIDATE_EVENTS (no driver call on a hit)
 *   gdr-tag     libgdrcache, GDR_VALIDATE_TAG (BUFFER_ID query on every hit)
 *   tagcheck    the "check BUFFER_ID on every hit" baseline: a sorted array of whole-allocation
 *               pins searched without a lock + an atomic reference + cuPointerGetAttribute(BUFFER_ID)
 *   ucs-rcache  UCX's ucs_rcache (Debian's libucx), told of frees the way UCX's CUDA memory hooks
 *               tell it (a UCM_EVENT_MEM_TYPE_FREE event before each free)
 *   preload     ibv_reg_mr/ibv_dereg_mr of a PD through libgdrcache-preload.so (its own cache),
 *               where bench_hit runs under it over the fake libibverbs (hit_preload.c)
 */
#ifndef BENCH_HIT_SYS_H
#define BENCH_HIT_SYS_H

#include <stddef.h>
#include <stdint.h>

enum sys_kind { SYS_GDR_EVENTS, SYS_GDR_TAG, SYS_TAGCHECK, SYS_UCS, SYS_PRELOAD, SYS_COUNT };

struct sys_limits {
	uint64_t max_bytes;   /* 0: the system's default (unbounded for the baseline) */
	uint64_t max_entries;
};

struct sys {
	enum sys_kind kind;
	const char *name;
	void *p;
	int available;
	char why[256];         /* why not available, or what it is */
};

extern const char *const sys_names[SYS_COUNT];

/* 0, or -errno with s->why saying why the system can not run here. */
int sys_open(struct sys *s, enum sys_kind kind, const struct sys_limits *lim);
void sys_close(struct sys *s);
/* Register [addr, addr+len) and take a reference: 0 and *reg, or < 0. */
int sys_get(struct sys *s, uint64_t addr, size_t len, void **reg);
void sys_put(struct sys *s, void *reg);
/* What a held registration says of itself: the BUFFER_ID it stands for (0: the system keeps none),
 * the value of hit_clock when it was pinned (0: not known), the range it pinned. */
void sys_reg_info(struct sys *s, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base,
		  uint64_t *len);
/* bench_hit's allocation clock: advanced at every allocation a trace makes. */
extern uint64_t hit_clock;
/* Told before the driver frees [addr, addr+len) (only ucs-rcache listens: UCX's hooks would). */
void sys_freed(struct sys *s, uint64_t addr, size_t len);
/* Registrations that had to pin, so far. */
uint64_t sys_misses(struct sys *s);
/* Bytes pinned now (held or not). */
uint64_t sys_pinned(struct sys *s);
/* One line on the system's own counters. */
void sys_describe(struct sys *s, char *buf, size_t len);

/* Each system's calls, for the timed loops (direct calls, no table). */
int gdrs_open(struct sys *s, int events, const struct sys_limits *lim);
struct gdr_cache *gdrs_cache(void *p);
int gdrs_get(void *p, uint64_t addr, size_t len, void **reg);
void gdrs_put(void *p, void *reg);
void gdrs_close(void *p);
void gdrs_info(void *p, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base, uint64_t *len);
uint64_t gdrs_misses(void *p);
uint64_t gdrs_pinned(void *p);
void gdrs_describe(void *p, char *buf, size_t len);

int tc_open(struct sys *s, const struct sys_limits *lim);
int tc_get(void *p, uint64_t addr, size_t len, void **reg);
void tc_put(void *p, void *reg);
void tc_close(void *p);
void tc_info(void *p, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base, uint64_t *len);
uint64_t tc_misses(void *p);
uint64_t tc_pinned(void *p);
void tc_describe(void *p, char *buf, size_t len);

int ucs_open(struct sys *s, const struct sys_limits *lim);
int ucs_get(void *p, uint64_t addr, size_t len, void **reg);
void ucs_put(void *p, void *reg);
void ucs_close(void *p);
void ucs_info(void *p, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base, uint64_t *len);
void ucs_freed(void *p, uint64_t addr, size_t len);
uint64_t ucs_misses(void *p);
uint64_t ucs_pinned(void *p);
void ucs_describe(void *p, char *buf, size_t len);

int pre_open(struct sys *s, const struct sys_limits *lim);
int pre_get(void *p, uint64_t addr, size_t len, void **reg);
void pre_put(void *p, void *reg);
void pre_close(void *p);
void pre_describe(void *p, char *buf, size_t len);

#endif
