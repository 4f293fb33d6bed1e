/* SPDX-License-Identifier: MIT */
/*
 * The library's private entry points for the preload (preload/) and diagnostics: exported
 * under GDRCACHE_PRIVATE (libgdrcache.map), no compatibility promise, built from the same tree.
 * They give the preload the library's one configuration parser, logger and statistics writer, so
 * that every GDRCACHE_* variable means the same in both.
 */
#ifndef GDRCACHE_PRIVATE_H
#define GDRCACHE_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/output.h"

/* What the preload reads of the configuration (config.c's table). */
struct gdr_private_config {
	int log_level;     /* GDRCACHE_LOG (enum gdr_log_level) */
	bool log_set;      /* GDRCACHE_LOG is set: the library may log on the preload's path */
	bool stats;        /* GDRCACHE_STATS asks for statistics (stderr or a file) */
	bool disable;      /* GDRCACHE_DISABLE: pass everything through */
	bool bad;          /* a variable is malformed (logged): no cache can be created */
	char libcuda[256]; /* GDRCACHE_LIBCUDA */
};
/* Fills the first size bytes of *cfg. 0, or -EINVAL. */
int gdr_private_config(struct gdr_private_config *cfg, size_t size);

/* One log line through the library's logger (format, rate limit, GDRCACHE_LOG_FILE); the caller
 * has checked the level. */
void gdr_private_log(int level, const char *func, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* The library's logging off for the preload's sake, unless GDRCACHE_LOG is set or the program
 * itself chose a level with gdr_set_log_level (which a later call still does): whether it was. */
bool gdr_private_log_quiet(void);

/* gdr_stats_emit (output.h). */
void gdr_private_stats_emit(const char *source, const char *why, const char *prefix,
			    const char *head, const struct gdr_stat *v, unsigned n);
/* fn(why) on every GDRCACHE_STATS_SIGNAL dump (the signal's handler is installed if it was not
 * yet). 0, or -ENOSPC. */
int gdr_private_stats_on_signal(void (*fn)(const char *why));

/* The GPU range [*va, *va + *size) the CUDA driver exported in this process as the dma-buf behind
 * fd, vouched for (lib/intercept/dmabufs.h, gdr_dmabufs_lookup): 0, or -ENOSYS, -EBADF, -ENOENT,
 * -ESTALE. */
int gdr_private_dmabuf_range(int fd, uint64_t *va, uint64_t *size);

#endif /* GDRCACHE_PRIVATE_H */
