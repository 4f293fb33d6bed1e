/* SPDX-License-Identifier: MIT */
/*
 * What a test may replace in one cache, and nothing else may: its backend, the NIC's verbs,
 * gdrcache.ko's system calls and the proof that the free interception works. Given at create, kept
 * by the cache (no process-wide switch: two caches of one process may differ). NULL fields take the
 * real ones.
 */
#ifndef GDR_CACHE_SEAMS_H
#define GDR_CACHE_SEAMS_H

#include "gdrcache.h"

struct gdr_backend_ops;
struct gdr_verbs_ops;
struct gdr_kmod_sys;

struct gdr_cache_seams {
	const struct gdr_backend_ops *backend; /* the configured backend (GDRCACHE_BACKEND) */
	const struct gdr_verbs_ops *verbs;     /* libibverbs (nic/verbs.c) */
	const struct gdr_kmod_sys *kmod;       /* gdrcache.ko through libc (backend/kmod.c) */
	int (*events_probe)(const char **why); /* gdr_events_probe (intercept/hooks.c) */
};

/* gdr_cache_create with seams (NULL: none replaced). */
int gdr_cache_create_seams(const struct gdr_cache_attr *attr, const struct gdr_cache_seams *seams,
			   struct gdr_cache **cache);

#endif /* GDR_CACHE_SEAMS_H */
