/* SPDX-License-Identifier: MIT */
/* Configuration: one table of GDRCACHE_* environment variables, read once per process. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gdrcache/uapi.h"
#include "gdrcache_int.h"

int gdr_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || !*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
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

static struct gdr_config config = {
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

/* The table: every variable the library reads, its parser and where the value goes. */
static const struct {
	const char *name;
	int (*parse)(const char *s, void *out);
	void *field;
	const char *what;
} table[] = {
	{ "GDRCACHE_LOG", parse_log, &config.log_level, "none|error|warn|info|debug" },
	{ "GDRCACHE_MAX_BYTES", parse_nonzero_size, &config.max_bytes, "a size > 0" },
	{ "GDRCACHE_MAX_ENTRIES", parse_nonzero_size, &config.max_entries, "a count > 0" },
	{ "GDRCACHE_MAX_PIN_BYTES", parse_nonzero_size, &config.max_pin_bytes, "a size > 0" },
	{ "GDRCACHE_BACKEND", parse_backend, &config.backend, "auto|kmod|dmabuf|peermem" },
	{ "GDRCACHE_VALIDATE", parse_validate, &config.validate, "auto" },
	{ "GDRCACHE_STATS", parse_bool, &config.stats, "0|1" },
	{ "GDRCACHE_KMOD_DEV", parse_path, config.kmod_dev, "a path" },
	{ "GDRCACHE_LIBCUDA", parse_path, config.libcuda, "a file name" },
};

static void config_read(void)
{
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		const char *s = getenv(table[i].name);

		if (!s)
			continue;
		if (table[i].parse(s, table[i].field))
			gdr_warn("%s=\"%s\" is not %s: using the default", table[i].name, s,
				 table[i].what);
		if (table[i].field == &config.log_level)
			__atomic_store_n(&gdr_log_level, config.log_level, __ATOMIC_RELAXED);
	}
}

const struct gdr_config *gdr_config_get(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, config_read);
	return &config;
}
