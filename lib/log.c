/* SPDX-License-Identifier: MIT */
/*
 * Logging: one macro with levels (gdrcache_int.h), written to stderr as
 *   gdrcache[PID:TID] YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL: message (function:line)
 *
 * Lines never flood: each call site (function and line) prints its first GDR_LOG_BURST lines, then
 * at most one line per GDR_LOG_INTERVAL_S seconds, which says how many like it were suppressed
 * since the last one printed. Debug lines are not limited (asked for explicitly). A registration
 * refused thousands of times a second (pool memory the driver will not export, say) costs the
 * log a few lines a minute.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gdrcache_int.h"

int gdr_log_level = GDR_LOG_WARN;

static const char *const level_names[] = { "none", "error", "warn", "info", "debug" };

#define SITES 256 /* call sites tracked; past that, lines are not limited */

static struct site {
	const char *func;
	int line;
	uint32_t printed;    /* lines printed, up to GDR_LOG_BURST */
	uint64_t last_ns;    /* when the last one was printed */
	uint64_t suppressed; /* since then */
} sites[SITES];
static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether this line of func:line may be printed; *suppressed: how many were not, since the last. */
static bool site_allows(const char *func, int line, uint64_t *suppressed)
{
	size_t h = ((uintptr_t)func >> 4 ^ (size_t)line * 2654435761u) % SITES;
	uint64_t now = now_ns();
	bool ok = true;

	*suppressed = 0;
	pthread_mutex_lock(&sites_lock);
	for (size_t i = 0; i < SITES; i++) {
		struct site *s = &sites[(h + i) % SITES];

		if (!s->func) {
			s->func = func;
			s->line = line;
		} else if (s->func != func || s->line != line) {
			continue;
		}
		if (s->printed < GDR_LOG_BURST) {
			s->printed++;
		} else if (now - s->last_ns >= (uint64_t)GDR_LOG_INTERVAL_S * 1000000000u) {
			*suppressed = s->suppressed;
			s->suppressed = 0;
		} else {
			s->suppressed++;
			ok = false;
		}
		if (ok)
			s->last_ns = now;
		break;
	}
	pthread_mutex_unlock(&sites_lock);
	return ok;
}

void gdr_log_write(int level, const char *func, int line, const char *fmt, ...)
{
	const char *name = level >= 0 && level <= GDR_LOG_DEBUG ? level_names[level] : "?";
	int saved = errno;
	uint64_t suppressed = 0;
	char msg[512], more[64] = "", when[32];
	struct timespec ts;
	struct tm tm;
	va_list ap;

	if (level < GDR_LOG_DEBUG && !site_allows(func, line, &suppressed)) {
		errno = saved;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (suppressed)
		snprintf(more, sizeof(more), "; %llu more like this suppressed",
			 (unsigned long long)suppressed);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	fprintf(stderr, "gdrcache[%d:%ld] %s.%03ldZ %s: %s (%s:%d%s)\n", (int)getpid(),
		(long)syscall(SYS_gettid), when, ts.tv_nsec / 1000000, name, msg, func, line, more);
	errno = saved;
}
