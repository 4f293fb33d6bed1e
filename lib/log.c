/* SPDX-License-Identifier: MIT */
/* Logging: one macro with levels (gdrcache_int.h), written to stderr with function and line. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "gdrcache_int.h"

int gdr_log_level = GDR_LOG_WARN;

static const char *const level_names[] = { "none", "error", "warn", "info", "debug" };

void gdr_log_write(int level, const char *func, int line, const char *fmt, ...)
{
	int saved = errno;
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "gdrcache[%d] %s: %s (%s:%d)\n", (int)getpid(),
		level >= 0 && level <= GDR_LOG_DEBUG ? level_names[level] : "?", msg, func, line);
	errno = saved;
}
