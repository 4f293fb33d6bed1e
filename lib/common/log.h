/* SPDX-License-Identifier: MIT */
/* The one logger of the library and the preload (log.c): levels, rate limit per call site. */
#ifndef GDR_COMMON_LOG_H
#define GDR_COMMON_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "gdrcache.h"

extern int gdr_log_level; /* process-wide; read and written with __atomic (gdr_set_log_level) */
/* Per call site: the first GDR_LOG_BURST lines, then one per GDR_LOG_INTERVAL_S seconds (log.c). */
#define GDR_LOG_BURST 10
#define GDR_LOG_INTERVAL_S 5
/* The time now, UTC, as YYYY-MM-DDTHH:MM:SS.mmmZ (24 bytes with the NUL; cut to n), and the
 * same for a given time: computed here, reading neither the environment nor the locale (log.c). */
void gdr_utc_stamp(char *buf, size_t n);
void gdr_utc_format(char *buf, size_t n, const struct timespec *ts);
/* An errno's text, untranslated: strerror reads LANGUAGE from the environment (log.c). */
const char *gdr_strerror(int err);
/* Logging off, unless GDRCACHE_LOG is set or the program chose a level (gdr_set_log_level, before
 * or after): whether it was turned off. For the preload, whose calls end as they would without it
 * (gdr_private_log_quiet). */
bool gdr_log_quiet(void);
void gdr_log_write(int level, const char *func, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
#define gdr_log(level, ...)                                                                        \
	do {                                                                                       \
		if ((level) <= __atomic_load_n(&gdr_log_level, __ATOMIC_RELAXED))                  \
			gdr_log_write((level), __func__, __LINE__, __VA_ARGS__);                   \
	} while (0)
#define gdr_err(...) gdr_log(GDR_LOG_ERROR, __VA_ARGS__)
#define gdr_warn(...) gdr_log(GDR_LOG_WARN, __VA_ARGS__)
#define gdr_info(...) gdr_log(GDR_LOG_INFO, __VA_ARGS__)
#define gdr_dbg(...) gdr_log(GDR_LOG_DEBUG, __VA_ARGS__)
/* Log once per process (per call site). */
#define gdr_log_once(level, ...)                                                                   \
	do {                                                                                       \
		static int logged_;                                                                \
		if (!__atomic_exchange_n(&logged_, 1, __ATOMIC_RELAXED))                           \
			gdr_log(level, __VA_ARGS__);                                               \
	} while (0)

#endif /* GDR_COMMON_LOG_H */
