/* SPDX-License-Identifier: MIT */
/* The private entry points the preload uses (private.h): the shared library only. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/defs.h"
#include "common/log.h"
#include "common/output.h"
#include "common/private.h"

GDR_EXPORT int gdr_private_config(struct gdr_private_config *out, size_t size)
{
	const struct gdr_config *cfg = gdr_config_get();
	const struct gdr_output *o = gdr_config_output();
	struct gdr_private_config c = {
		.log_level = cfg->log_level,
		.log_set = o->log_set,
		.stats = cfg->stats,
		.disable = o->disable,
		.bad = cfg->bad != NULL,
	};

	if (!out)
		return -EINVAL;
	snprintf(c.libcuda, sizeof(c.libcuda), "%s", cfg->libcuda);
	memcpy(out, &c, size < sizeof(c) ? size : sizeof(c));
	return 0;
}

GDR_EXPORT void gdr_private_log(int level, const char *func, int line, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	gdr_log_vwrite(level, func, line, fmt, ap);
	va_end(ap);
}

GDR_EXPORT void gdr_private_stats_emit(const char *source, const char *why, const char *prefix,
				       const char *head, const struct gdr_stat *v, unsigned n)
{
	gdr_stats_emit(source, why, prefix, head, v, n);
}

GDR_EXPORT int gdr_private_stats_on_signal(void (*fn)(const char *why))
{
	int rc = gdr_stats_on_signal(fn);

	if (!rc && gdr_config_get()->stats)
		gdr_stats_signal_setup();
	return rc;
}

GDR_EXPORT bool gdr_private_log_quiet(void)
{
	return gdr_log_quiet();
}
