/* SPDX-License-Identifier: MIT */
/* Configuration: one table of GDRCACHE_* environment variables, read once per process. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gdrcache/uapi.h"
#include "gdrcache_int.h"

/* A decimal (or 0x-prefixed hexadecimal) number, optionally with K/M/G/T (and i/B): nothing
 * else, no sign, no blank, and leading zeros do not make it octal. */
int gdr_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;
	int base = 10;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
		base = 16;
	errno = 0;
	v = strtoull(s, &end, base);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'B' || *end == 'b')
		end += (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ? 2 : 1;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_nonzero_size(const char *s, void *out)
{
	uint64_t v;

	if (gdr_parse_size(s, &v) || v == 0)
		return -EINVAL;
	*(uint64_t *)out = v;
	return 0;
}

static int parse_name(const char *s, const char *const *names, int n, int *out)
{
	for (int i = 0; i < n; i++) {
		if (names[i] && !strcasecmp(s, names[i])) {
			*out = i;
			return 0;
		}
	}
	return -EINVAL;
}

static const char *const backend_names[] = { "auto", "kmod", "dmabuf", "peermem" };
static const char *const validate_names[] = { "tag", "events", "auto" };
static const char *const log_names[] = { "none", "error", "warn", "info", "debug" };

static int parse_backend(const char *s, void *out)
{
	return parse_name(s, backend_names, 4, out);
}

static int parse_validate(const char *s, void *out)
{
	return parse_name(s, validate_names, 3, out);
}

static int parse_log(const char *s, void *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (*s && !*end && v >= GDR_LOG_NONE && v <= GDR_LOG_DEBUG) {
		*(int *)out = (int)v;
		return 0;
	}
	return parse_name(s, log_names, 5, out);
}

static int parse_bool(const char *s, void *out)
{
	if (!strcmp(s, "1") || !strcasecmp(s, "yes") || !strcasecmp(s, "on") || !strcasecmp(s, "true"))
		*(bool *)out = true;
	else if (!strcmp(s, "0") || !strcasecmp(s, "no") || !strcasecmp(s, "off") ||
		 !strcasecmp(s, "false"))
		*(bool *)out = false;
	else
		return -EINVAL;
	return 0;
}

static int parse_path(const char *s, void *out)
{
	if (!*s || strlen(s) >= 256)
		return -EINVAL;
	strcpy(out, s);
	return 0;
}

/* The defaults, once: the configuration starts as a copy (config_read) and gdrcache_info shows them. */
static const struct gdr_config defaults = {
	.max_bytes = 4ULL << 30,
	.max_entries = 4096,
	.max_pin_bytes = 256ULL << 20,
	.backend = GDR_BACKEND_AUTO,
	.validate = GDR_VALIDATE_AUTO,
	.log_level = GDR_LOG_WARN,
	.stats = false,
	.kmod_dev = "/dev/" GDRCACHE_DEVICE_NAME,
	.libcuda = "libcuda.so.1",
};
static struct gdr_config config;

/* The table: every variable the library reads, its parser and where the value goes. */
static const struct {
	const char *name;
	int (*parse)(const char *s, void *out);
	void *field;
	const char *what;
} table[] = {
	{ "GDRCACHE_LOG", parse_log, &config.log_level, "none|error|warn|info|debug" },
	{ "GDRCACHE_MAX_BYTES", parse_nonzero_size, &config.max_bytes,
	  "a size > 0: digits, then K, M, G or T (e.g. 4G)" },
	{ "GDRCACHE_MAX_ENTRIES", parse_nonzero_size, &config.max_entries, "a count > 0 (digits)" },
	{ "GDRCACHE_MAX_PIN_BYTES", parse_nonzero_size, &config.max_pin_bytes,
	  "a size > 0: digits, then K, M, G or T (e.g. 256M)" },
	{ "GDRCACHE_BACKEND", parse_backend, &config.backend, "auto|kmod|dmabuf|peermem" },
	{ "GDRCACHE_VALIDATE", parse_validate, &config.validate, "auto|tag|events" },
	{ "GDRCACHE_STATS", parse_bool, &config.stats, "0|1" },
	{ "GDRCACHE_KMOD_DEV", parse_path, config.kmod_dev, "a path" },
	{ "GDRCACHE_LIBCUDA", parse_path, config.libcuda, "a file name" },
};

/* GDRCACHE_* names read outside the table (the preload library's, test knobs). */
static const char *const other_names[] = {
	"GDRCACHE_DISABLE", "GDRCACHE_NO_MEMBARRIER",
};

static bool known(const char *name, size_t len)
{
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strlen(table[i].name) == len && !strncmp(table[i].name, name, len))
			return true;
	for (size_t i = 0; i < sizeof(other_names) / sizeof(other_names[0]); i++)
		if (strlen(other_names[i]) == len && !strncmp(other_names[i], name, len))
			return true;
	return false;
}

static void config_read(void)
{
	config = defaults;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		const char *s = getenv(table[i].name);

		if (!s)
			continue;
		if (table[i].parse(s, table[i].field)) {
			gdr_err("%s=\"%s\" is malformed: it must be %s; no cache can be created until "
				"it is fixed", table[i].name, s, table[i].what);
			if (!config.bad)
				config.bad = table[i].name;
		}
		if (table[i].field == &config.log_level)
			__atomic_store_n(&gdr_log_level, config.log_level, __ATOMIC_RELAXED);
	}
	for (char **e = environ; e && *e; e++) {
		const char *eq = strchr(*e, '=');

		if (!strncmp(*e, "GDRCACHE_", 9) && eq && !known(*e, (size_t)(eq - *e)))
			gdr_warn("unknown variable %.*s ignored (a typo? GDRCACHE_LOG, GDRCACHE_MAX_BYTES, "
				 "GDRCACHE_MAX_ENTRIES, GDRCACHE_MAX_PIN_BYTES, GDRCACHE_BACKEND, "
				 "GDRCACHE_VALIDATE, GDRCACHE_STATS, GDRCACHE_KMOD_DEV, GDRCACHE_LIBCUDA "
				 "are known)", (int)(eq - *e), *e);
	}
}

/* The value of table entry i in cfg, as text. */
static void format(size_t i, const struct gdr_config *cfg, char *buf, size_t n)
{
	const char *f = table[i].name;

	if (!strcmp(f, "GDRCACHE_LOG"))
		snprintf(buf, n, "%s", log_names[cfg->log_level]);
	else if (!strcmp(f, "GDRCACHE_MAX_BYTES"))
		snprintf(buf, n, "%" PRIu64, cfg->max_bytes);
	else if (!strcmp(f, "GDRCACHE_MAX_ENTRIES"))
		snprintf(buf, n, "%" PRIu64, cfg->max_entries);
	else if (!strcmp(f, "GDRCACHE_MAX_PIN_BYTES"))
		snprintf(buf, n, "%" PRIu64, cfg->max_pin_bytes);
	else if (!strcmp(f, "GDRCACHE_BACKEND"))
		snprintf(buf, n, "%s", backend_names[cfg->backend]);
	else if (!strcmp(f, "GDRCACHE_VALIDATE"))
		snprintf(buf, n, "%s", validate_names[cfg->validate]);
	else if (!strcmp(f, "GDRCACHE_STATS"))
		snprintf(buf, n, "%d", cfg->stats);
	else if (!strcmp(f, "GDRCACHE_KMOD_DEV"))
		snprintf(buf, n, "%s", cfg->kmod_dev);
	else
		snprintf(buf, n, "%s", cfg->libcuda);
}

void gdr_config_each(void (*fn)(const char *name, const char *form, const char *value,
				const char *dflt, bool set, void *arg), void *arg)
{
	const struct gdr_config *cfg = gdr_config_get();
	char v[300], d[300];

	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		format(i, cfg, v, sizeof(v));
		format(i, &defaults, d, sizeof(d));
		fn(table[i].name, table[i].what, v, d, getenv(table[i].name) != NULL, arg);
	}
}

const struct gdr_config *gdr_config_get(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, config_read);
	return &config;
}
