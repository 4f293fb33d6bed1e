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
#include "common/ident.h"
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
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	case 't':
	case 'T':
		shift = 40;
		end++;
		break;
	default:
		break;
	}
	if (shift && *end == 'i') /* KiB, Mi: binary units are what K and M mean anyway */
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
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
static const char *const validate_names[] = {
	[GDR_VALIDATE_AUTO] = "auto",
	[GDR_VALIDATE_TAG] = "tag",
	[GDR_VALIDATE_EVENTS] = "events",
};
static const char *const log_names[] = { "none", "error", "warn", "info", "debug" };

static int parse_backend(const char *s, void *out)
{
	return parse_name(s, backend_names, 4, out);
}

static int parse_validate(const char *s, void *out)
{
	return parse_name(s, validate_names, 3, out);
}

static const char *const intercept_names[] = {
	[GDR_INTERCEPT_AUTO] = "auto",
	[GDR_INTERCEPT_OFF] = "off",
	[GDR_INTERCEPT_YIELD] = "yield",
};

static int parse_intercept(const char *s, void *out)
{
	return parse_name(s, intercept_names, 3, out);
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
	if (!strcmp(s, "1") || !strcasecmp(s, "yes") || !strcasecmp(s, "on") ||
	    !strcasecmp(s, "true"))
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
	static const struct {
		const char *name;
		int sig;
	} sigs[] = {
		{ "USR1", SIGUSR1 },
		{ "USR2", SIGUSR2 },
		{ "HUP", SIGHUP },
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

/* GDRCACHE_STATS_INTERVAL: whole seconds, digits only, at most a day; 0: none. */
static int parse_interval(const char *s, void *out)
{
	unsigned v = 0;

	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		v = v * 10 + (unsigned)(*s - '0');
		if (v > GDR_STATS_INTERVAL_MAX)
			return -EINVAL;
	}
	*(unsigned *)out = v;
	return 0;
}

/* A test switch: set (to anything, even nothing) means on. */
static int parse_set(const char *s, void *out)
{
	(void)s;
	*(bool *)out = true;
	return 0;
}

/* The fixed defaults: the configuration starts as a copy (config_read). The limits derived from
 * the GPUs (the table's "dflt") fall back to these where the GPUs say nothing. */
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
static const struct gdr_config_tests tests_defaults;
static struct gdr_config_tests tests;

/*
 * The table: every variable the library, the preload and the tools read, and the only place one is
 * named, defaulted and described: its parser, where the value goes, the form it takes, its default
 * as documented and what it sets, in one line. GDRCACHE_LOG_FILE and GDRCACHE_LOG first: a message
 * about another variable goes where and as they say. gdrcache(7)'s list is generated from it
 * (docs/man/mkman.py); the header's environment comment and docs/configuration.md's table are checked
 * against it (tests/packaging/check_config_docs.py).
 *
 * Rows marked .test are test switches: they select a code path for a test of it, are known (never
 * warned about as a typo) and shown by gdrcache_info when set, and are documented here only.
 */
static const struct row {
	const char *name;
	int (*parse)(const char *s, void *out);
	void *field;
	const char *form;
	const char *dflt;
	const char *desc;
	bool test;
} table[] = {
	{ .name = "GDRCACHE_LOG_FILE",
	  .parse = parse_path,
	  .field = output.log_file,
	  .form = "a path (%p: the process id, %h: the host name, %r: the MPI rank or norank); "
		  "appended to; empty: stderr",
	  .dflt = "stderr",
	  .desc = "append log lines to this file instead of stderr; %p is the process id" },
	{ .name = "GDRCACHE_LOG",
	  .parse = parse_log,
	  .field = &config.log_level,
	  .form = "none|error|warn|info|debug (or 0-4)",
	  .dflt = "warn",
	  .desc = "the lowest level logged: none, error, warn, info or debug (or 0-4)" },
	{ .name = "GDRCACHE_MAX_BYTES",
	  .parse = parse_nonzero_size,
	  .field = &config.max_bytes,
	  .form = "a size > 0: digits, then K, M, G or T (e.g. 4G)",
	  .dflt = "half of min(BAR1, memory) summed over the GPUs, else 4G",
	  .desc = "most bytes kept pinned by unreferenced entries" },
	{ .name = "GDRCACHE_MAX_ENTRIES",
	  .parse = parse_nonzero_size,
	  .field = &config.max_entries,
	  .form = "a count > 0 (digits)",
	  .dflt = "one per MiB of GDRCACHE_MAX_BYTES, at least 4096",
	  .desc = "most cached entries" },
	{ .name = "GDRCACHE_MAX_PIN_BYTES",
	  .parse = parse_nonzero_size,
	  .field = &config.max_pin_bytes,
	  .form = "a size > 0: digits, then K, M, G or T (e.g. 256M)",
	  .dflt = "the larger of an eighth of GDRCACHE_MAX_BYTES and 256M, at most an eighth of "
		  "the smallest GPU's min(BAR1, memory), else 256M",
	  .desc = "allocations up to this size may be pinned whole, larger ones in the requested "
		  "range" },
	{ .name = "GDRCACHE_BACKEND",
	  .parse = parse_backend,
	  .field = &config.backend,
	  .form = "auto|kmod|dmabuf|peermem",
	  .dflt = "auto",
	  .desc = "how ranges are pinned: auto, kmod, dmabuf or peermem" },
	{ .name = "GDRCACHE_VALIDATE",
	  .parse = parse_validate,
	  .field = &config.validate,
	  .form = "auto|tag|events",
	  .dflt = "auto",
	  .desc = "how a hit is proven: auto, tag or events" },
	{ .name = "GDRCACHE_INTERCEPT",
	  .parse = parse_intercept,
	  .field = &config.intercept,
	  .form = "auto|off|yield",
	  .dflt = "auto",
	  .desc = "patch libcuda's free entry points: auto; off (no free events, hits validated by "
		  "tag, no out-of-memory relief); yield (off where another tool patched one)" },
	{ .name = "GDRCACHE_STATS",
	  .parse = parse_stats,
	  .field = &config.stats,
	  .form = "0|1 (or no|yes, off|on, false|true), stderr, or file:PATH (%p: the process id, "
		  "%h: the host name, %r: the MPI rank or norank)",
	  .dflt = "0",
	  .desc = "write the statistics at destroy, at exit and on GDRCACHE_STATS_SIGNAL: 1 or "
		  "stderr, or appended to file:PATH" },
	{ .name = "GDRCACHE_STATS_FORMAT",
	  .parse = parse_format,
	  .field = &output.stats_format,
	  .form = "auto|text|kv|json (auto: text on stderr, json in a file)",
	  .dflt = "auto",
	  .desc = "how the statistics are written: auto (text on stderr, json in a file), text, kv "
		  "or json" },
	{ .name = "GDRCACHE_STATS_SIGNAL",
	  .parse = parse_signal,
	  .field = &output.stats_signal,
	  .form = "none|USR1|USR2|HUP|RTMIN+n (SIG prefix optional)",
	  .dflt = "none",
	  .desc = "also write the statistics on this signal: none, USR1, USR2, HUP or RTMIN+n" },
	{ .name = "GDRCACHE_STATS_INTERVAL",
	  .parse = parse_interval,
	  .field = &output.stats_interval,
	  .form = "whole seconds, 0-86400 (digits; 0: none)",
	  .dflt = "0",
	  .desc = "also write the statistics every this many seconds, from a thread of the "
		  "library (0: never)" },
	{ .name = "GDRCACHE_KMOD_DEV",
	  .parse = parse_path,
	  .field = config.kmod_dev,
	  .form = "a path",
	  .dflt = "/dev/gdrcache", /* "/dev/" GDRCACHE_DEVICE_NAME (test_config.c checks) */
	  .desc = "the kernel module's device" },
	{ .name = "GDRCACHE_LIBCUDA",
	  .parse = parse_path,
	  .field = config.libcuda,
	  .form = "a file name",
	  .dflt = "libcuda.so.1",
	  .desc = "the CUDA driver library to dlopen, for tests and debugging" },
	{ .name = "GDRCACHE_DISABLE",
	  .parse = parse_bool,
	  .field = &output.disable,
	  .form = "0|1 (or no|yes, off|on, false|true); the preload only",
	  .dflt = "0",
	  .desc = "1: the preload passes every call through untouched" },
	/* Test switches. */
	{ .name = "GDRCACHE_NO_MEMBARRIER",
	  .parse = parse_set,
	  .field = &tests.no_membarrier,
	  .form = "any value (set: on)",
	  .dflt = "unset",
	  .desc = "lookups take the locked increment, as where membarrier(2) is missing (the "
		  "stress tests of that flavour)",
	  .test = true },
};
#define NVARS (sizeof(table) / sizeof(table[0]))

static bool known(const char *name, size_t len)
{
	for (size_t i = 0; i < NVARS; i++)
		if (strlen(table[i].name) == len && !strncmp(table[i].name, name, len))
			return true;
	return false;
}

static void config_read(void)
{
	char names[512] = "";
	size_t used = 0;

	gdr_ident_init(); /* first: the lines about a malformed value carry host and rank */
	config = defaults;
	output = output_defaults;
	tests = tests_defaults;
	for (size_t i = 0; i < NVARS; i++) {
		const char *s = getenv(table[i].name);

		if (!s)
			continue;
		if (table[i].field == output.log_file && !*s)
			continue; /* empty: stderr */
		if (table[i].parse(s, table[i].field)) {
			gdr_err("%s=\"%s\" is malformed: it must be %s; no cache can be created until "
				"it is fixed",
				table[i].name, s, table[i].form);
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
		gdr_warn(
			"GDRCACHE_STATS_SIGNAL is set, GDRCACHE_STATS is not: no statistics are written "
			"on the signal (set GDRCACHE_STATS=1 or file:PATH)");
	if (output.stats_interval && !config.stats)
		gdr_warn("GDRCACHE_STATS_INTERVAL is set, GDRCACHE_STATS is not: no periodic "
			 "statistics are written (set GDRCACHE_STATS=1 or file:PATH)");
	for (size_t i = 0; i < NVARS; i++)
		if (!table[i].test)
			used += (size_t)snprintf(names + used,
						 used < sizeof(names) ? sizeof(names) - used : 0,
						 "%s%s", used ? ", " : "", table[i].name);
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

/* The value of table entry i in cfg, out and t, as text. */
static void format(size_t i, const struct gdr_config *cfg, const struct gdr_output *out,
		   const struct gdr_config_tests *t, char *buf, size_t n)
{
	const void *f = table[i].field;
	char sig[32];

	/* Fields are named by their place in the live copies: map them to cfg / out / t. */
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
	else if (f == &config.intercept)
		snprintf(buf, n, "%s", intercept_names[cfg->intercept]);
	else if (f == &config.stats)
		snprintf(buf, n, "%s%s",
			 !cfg->stats          ? "0"
			 : out->stats_file[0] ? "file:"
					      : "1",
			 cfg->stats ? out->stats_file : "");
	else if (f == &output.stats_format)
		snprintf(buf, n, "%s", format_names[out->stats_format]);
	else if (f == &output.stats_signal)
		snprintf(buf, n, "%s", signal_name(out->stats_signal, sig, sizeof(sig)));
	else if (f == &output.stats_interval)
		snprintf(buf, n, "%u", out->stats_interval);
	else if (f == output.log_file)
		snprintf(buf, n, "%s", out->log_file);
	else if (f == &output.disable)
		snprintf(buf, n, "%d", out->disable);
	else if (f == config.kmod_dev)
		snprintf(buf, n, "%s", cfg->kmod_dev);
	else if (f == config.libcuda)
		snprintf(buf, n, "%s", cfg->libcuda);
	else if (f == &tests.no_membarrier)
		snprintf(buf, n, "%s", t->no_membarrier ? "set" : "unset");
	else
		snprintf(buf, n, "?");
}

void gdr_config_vars(void (*fn)(const struct gdr_config_var *var, const char *value, bool set,
				void *arg),
		     void *arg)
{
	const struct gdr_config *cfg = gdr_config_get();
	char v[300];

	for (size_t i = 0; i < NVARS; i++) {
		const struct gdr_config_var var = {
			.name = table[i].name,
			.form = table[i].form,
			.dflt = table[i].dflt,
			.desc = table[i].desc,
			.test = table[i].test,
		};

		format(i, cfg, &output, &tests, v, sizeof(v));
		fn(&var, v, getenv(table[i].name) != NULL, arg);
	}
}

void gdr_config_each(void (*fn)(const char *name, const char *form, const char *value,
				const char *dflt, bool set, void *arg),
		     void *arg)
{
	const struct gdr_config *cfg = gdr_config_get();
	char v[300], d[300];

	for (size_t i = 0; i < NVARS; i++) {
		if (table[i].test)
			continue;
		format(i, cfg, &output, &tests, v, sizeof(v));
		format(i, &defaults, &output_defaults, &tests_defaults, d, sizeof(d));
		fn(table[i].name, table[i].form, v, d, getenv(table[i].name) != NULL, arg);
	}
}

static pthread_once_t once = PTHREAD_ONCE_INIT;

const struct gdr_config *gdr_config_get(void)
{
	pthread_once(&once, config_read);
	return &config;
}

const struct gdr_config_tests *gdr_config_tests(void)
{
	pthread_once(&once, config_read);
	return &tests;
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
	const struct gdr_ident *id = gdr_ident();
	size_t used = 0;
	int len;

	for (const char *p = tmpl; *p; p++) {
		if (p[0] == '%' && p[1] == 'p')
			len = snprintf(buf + used, n - used, "%d", (int)getpid());
		else if (p[0] == '%' && p[1] == 'h')
			len = snprintf(buf + used, n - used, "%s", id ? id->host : "unknown");
		else if (p[0] == '%' && p[1] == 'r' && id && id->rank >= 0)
			len = snprintf(buf + used, n - used, "%d", id->rank);
		else if (p[0] == '%' && p[1] == 'r')
			len = snprintf(buf + used, n - used, "norank");
		else if (p[0] == '%' && p[1] == '%')
			len = snprintf(buf + used, n - used, "%%");
		else
			len = snprintf(buf + used, n - used, "%c", *p);
		if (p[0] == '%' && (p[1] == 'p' || p[1] == 'h' || p[1] == 'r' || p[1] == '%'))
			p++;
		if (len < 0 || (size_t)len >= n - used)
			return -ENAMETOOLONG;
		used += (size_t)len;
	}
	if (!n)
		return -ENAMETOOLONG;
	buf[used] = '\0';
	return 0;
}
