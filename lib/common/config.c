/* SPDX-License-Identifier: MIT */
/* Configuration: one table of GDRCACHE_* environment variables, read once per process. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gdrcache/uapi.h"
#include "common/config.h"
#include "common/log.h"
#include "common/output.h"

/* Where logs and statistics go (output.h): parsed with the rest, outside struct gdr_config. */
static const struct gdr_output output_defaults = { .stats_format = GDR_STATS_AUTO };
static struct gdr_output output;

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

/* GDRCACHE_STATS: a boolean (stderr), or file:PATH (%p: the pid). */
static int parse_stats(const char *s, void *out)
{
	if (!strncmp(s, "file:", 5)) {
		if (parse_path(s + 5, output.stats_file))
			return -EINVAL;
		*(bool *)out = true;
		return 0;
	}
	output.stats_file[0] = '\0';
	if (!strcasecmp(s, "stderr")) {
		*(bool *)out = true;
		return 0;
	}
	return parse_bool(s, out);
}

static const char *const format_names[] = { "auto", "text", "kv", "json" };

static int parse_format(const char *s, void *out)
{
	return parse_name(s, format_names, 4, out);
}

/* The signals a user may choose: USR1, USR2, HUP, RTMIN+n (SIG prefix optional, any case). 0: none. */
static int parse_signal(const char *s, void *out)
{
	static const struct { const char *name; int sig; } sigs[] = {
		{ "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { "HUP", SIGHUP },
	};
	char *end;
	long n;

	if (!strcasecmp(s, "none") || !strcmp(s, "0")) {
		*(int *)out = 0;
		return 0;
	}
	if (!strncasecmp(s, "SIG", 3))
		s += 3;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		if (!strcasecmp(s, sigs[i].name)) {
			*(int *)out = sigs[i].sig;
			return 0;
		}
	}
	if (strncasecmp(s, "RTMIN+", 6) || s[6] < '0' || s[6] > '9')
		return -EINVAL;
	n = strtol(s + 6, &end, 10);
	if (*end || n < 0 || n > SIGRTMAX - SIGRTMIN)
		return -EINVAL;
	*(int *)out = SIGRTMIN + (int)n;
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

/* The table: every variable the library, the preload and the tools read, its parser, where the
 * value goes and the form it takes. GDRCACHE_LOG_FILE and GDRCACHE_LOG first: a message about
 * another variable goes where and as they say. gdrcache(7) is generated from it and the README
 * lists the same names (docs/man/mkman.py, tests/packaging/check_man.sh). */
static const struct {
	const char *name;
	int (*parse)(const char *s, void *out);
	void *field;
	const char *what;
} table[] = {
	{ "GDRCACHE_LOG_FILE", parse_path, output.log_file,
	  "a path (%p: the process id); appended to; empty: stderr" },
	{ "GDRCACHE_LOG", parse_log, &config.log_level, "none|error|warn|info|debug (or 0-4)" },
	{ "GDRCACHE_MAX_BYTES", parse_nonzero_size, &config.max_bytes,
	  "a size > 0: digits, then K, M, G or T (e.g. 4G)" },
	{ "GDRCACHE_MAX_ENTRIES", parse_nonzero_size, &config.max_entries, "a count > 0 (digits)" },
	{ "GDRCACHE_MAX_PIN_BYTES", parse_nonzero_size, &config.max_pin_bytes,
	  "a size > 0: digits, then K, M, G or T (e.g. 256M)" },
	{ "GDRCACHE_BACKEND", parse_backend, &config.backend, "auto|kmod|dmabuf|peermem" },
	{ "GDRCACHE_VALIDATE", parse_validate, &config.validate, "auto|tag|events" },
	{ "GDRCACHE_STATS", parse_stats, &config.stats,
	  "0|1 (or no|yes, off|on, false|true), stderr, or file:PATH (%p: the process id)" },
	{ "GDRCACHE_STATS_FORMAT", parse_format, &output.stats_format,
	  "auto|text|kv|json (auto: text on stderr, json in a file)" },
	{ "GDRCACHE_STATS_SIGNAL", parse_signal, &output.stats_signal,
	  "none|USR1|USR2|HUP|RTMIN+n (SIG prefix optional)" },
	{ "GDRCACHE_KMOD_DEV", parse_path, config.kmod_dev, "a path" },
	{ "GDRCACHE_LIBCUDA", parse_path, config.libcuda, "a file name" },
	{ "GDRCACHE_DISABLE", parse_bool, &output.disable,
	  "0|1 (or no|yes, off|on, false|true); the preload only" },
};
#define NVARS (sizeof(table) / sizeof(table[0]))

/* GDRCACHE_* names read outside the table (test knobs). */
static const char *const other_names[] = {
	"GDRCACHE_NO_MEMBARRIER",
};

static bool known(const char *name, size_t len)
{
	for (size_t i = 0; i < NVARS; i++)
		if (strlen(table[i].name) == len && !strncmp(table[i].name, name, len))
			return true;
	for (size_t i = 0; i < sizeof(other_names) / sizeof(other_names[0]); i++)
		if (strlen(other_names[i]) == len && !strncmp(other_names[i], name, len))
			return true;
	return false;
}

static void config_read(void)
{
	char names[512] = "";
	size_t used = 0;

	config = defaults;
	output = output_defaults;
	for (size_t i = 0; i < NVARS; i++) {
		const char *s = getenv(table[i].name);

		if (!s)
			continue;
		if (table[i].field == output.log_file && !*s)
			continue; /* empty: stderr */
		if (table[i].parse(s, table[i].field)) {
			gdr_err("%s=\"%s\" is malformed: it must be %s; no cache can be created until "
				"it is fixed", table[i].name, s, table[i].what);
			if (!config.bad)
				config.bad = table[i].name;
		}
		if (table[i].field == output.log_file)
			__atomic_store_n(&output.log_file_ready, true, __ATOMIC_RELEASE);
		if (table[i].field == &config.log_level) {
			output.log_set = *s != '\0';
			__atomic_store_n(&gdr_log_level, config.log_level, __ATOMIC_RELAXED);
		}
	}
	if (output.stats_signal && !config.stats)
		gdr_warn("GDRCACHE_STATS_SIGNAL is set, GDRCACHE_STATS is not: no statistics are written "
			 "on the signal (set GDRCACHE_STATS=1 or file:PATH)");
	for (size_t i = 0; i < NVARS; i++)
		used += (size_t)snprintf(names + used, used < sizeof(names) ? sizeof(names) - used : 0,
					 "%s%s", i ? ", " : "", table[i].name);
	for (char **e = environ; e && *e; e++) {
		const char *eq = strchr(*e, '=');

		if (!strncmp(*e, "GDRCACHE_", 9) && eq && !known(*e, (size_t)(eq - *e)))
			gdr_warn("unknown variable %.*s ignored (a typo? %s are known)",
				 (int)(eq - *e), *e, names);
	}
}

static const char *signal_name(int sig, char *buf, size_t n)
{
	if (!sig)
		return "none";
	if (sig == SIGUSR1 || sig == SIGUSR2 || sig == SIGHUP)
		return sig == SIGUSR1 ? "USR1" : sig == SIGUSR2 ? "USR2" : "HUP";
	snprintf(buf, n, "RTMIN+%d", sig - SIGRTMIN);
	return buf;
}

/* The value of table entry i in cfg (and out), as text. */
static void format(size_t i, const struct gdr_config *cfg, const struct gdr_output *out, char *buf,
		   size_t n)
{
	const void *f = table[i].field;
	char sig[32];

	/* Fields are named by their place in the live copies: map them to cfg / out. */
	if (f == &config.log_level)
		snprintf(buf, n, "%s", log_names[cfg->log_level]);
	else if (f == &config.max_bytes)
		snprintf(buf, n, "%" PRIu64, cfg->max_bytes);
	else if (f == &config.max_entries)
		snprintf(buf, n, "%" PRIu64, cfg->max_entries);
	else if (f == &config.max_pin_bytes)
		snprintf(buf, n, "%" PRIu64, cfg->max_pin_bytes);
	else if (f == &config.backend)
		snprintf(buf, n, "%s", backend_names[cfg->backend]);
	else if (f == &config.validate)
		snprintf(buf, n, "%s", validate_names[cfg->validate]);
	else if (f == &config.stats)
		snprintf(buf, n, "%s%s", !cfg->stats ? "0" : out->stats_file[0] ? "file:" : "1",
			 cfg->stats ? out->stats_file : "");
	else if (f == &output.stats_format)
		snprintf(buf, n, "%s", format_names[out->stats_format]);
	else if (f == &output.stats_signal)
		snprintf(buf, n, "%s", signal_name(out->stats_signal, sig, sizeof(sig)));
	else if (f == output.log_file)
		snprintf(buf, n, "%s", out->log_file);
	else if (f == &output.disable)
		snprintf(buf, n, "%d", out->disable);
	else if (f == config.kmod_dev)
		snprintf(buf, n, "%s", cfg->kmod_dev);
	else
		snprintf(buf, n, "%s", cfg->libcuda);
}

void gdr_config_each(void (*fn)(const char *name, const char *form, const char *value,
				const char *dflt, bool set, void *arg), void *arg)
{
	const struct gdr_config *cfg = gdr_config_get();
	char v[300], d[300];

	for (size_t i = 0; i < NVARS; i++) {
		format(i, cfg, &output, v, sizeof(v));
		format(i, &defaults, &output_defaults, d, sizeof(d));
		fn(table[i].name, table[i].what, v, d, getenv(table[i].name) != NULL, arg);
	}
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

const struct gdr_config *gdr_config_get(void)
{
	pthread_once(&once, config_read);
	return &config;
}

const struct gdr_output *gdr_config_output(void)
{
	pthread_once(&once, config_read);
	return &output;
}

const char *gdr_config_log_file(void)
{
	return __atomic_load_n(&output.log_file_ready, __ATOMIC_ACQUIRE) ? output.log_file : NULL;
}

int gdr_path_expand(const char *tmpl, char *buf, size_t n)
{
	size_t used = 0;
	int len;

	for (const char *p = tmpl; *p; p++) {
		if (p[0] == '%' && (p[1] == 'p' || p[1] == '%')) {
			len = p[1] == 'p' ? snprintf(buf + used, n - used, "%d", (int)getpid())
					  : snprintf(buf + used, n - used, "%%");
			p++;
		} else {
			len = snprintf(buf + used, n - used, "%c", *p);
		}
		if (len < 0 || (size_t)len >= n - used)
			return -ENAMETOOLONG;
		used += (size_t)len;
	}
	if (!n)
		return -ENAMETOOLONG;
	buf[used] = '\0';
	return 0;
}
