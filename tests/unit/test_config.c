/* SPDX-License-Identifier: MIT */
/* Configuration: the GDRCACHE_* environment is parsed once and strictly (a malformed value makes
 * gdr_cache_create fail with -EINVAL, an unknown GDRCACHE_* name is warned about), explicit
 * attributes override it; GDRCACHE_STATS=1 prints statistics. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "cache/cache.h"
#include "common/log.h" /* gdr_log_level */
#include "cuda/cuda.h"

static void test_parse_size(void **state)
{
	uint64_t v;

	(void)state;
	assert_int_equal(gdr_parse_size("4096", &v), 0);
	assert_int_equal(v, 4096);
	assert_int_equal(gdr_parse_size("64K", &v), 0);
	assert_int_equal(v, 65536);
	assert_int_equal(gdr_parse_size("2M", &v), 0);
	assert_int_equal(v, 2 << 20);
	assert_int_equal(gdr_parse_size("3GiB", &v), 0);
	assert_int_equal(v, 3ULL << 30);
	assert_int_equal(gdr_parse_size("0x10", &v), 0);
	assert_int_equal(v, 16);
	assert_int_equal(gdr_parse_size("010M", &v), 0); /* decimal, not octal */
	assert_int_equal(v, 10 << 20);
	assert_int_equal(gdr_parse_size("", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("-1", &v), -EINVAL);
	assert_int_equal(gdr_parse_size(" -1", &v), -EINVAL); /* was 2^64 - 1 */
	assert_int_equal(gdr_parse_size("+5", &v), -EINVAL);
	assert_int_equal(gdr_parse_size(" 5", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("1.5G", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("abc", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("12Q", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("99999999999T", &v), -EINVAL);
}

static void test_environment(void **state)
{
	const struct gdr_config *cfg = gdr_config_get(); /* main() set the environment first */
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_MAX_ENTRIES, .max_entries = 7 };
	struct gdr_cache_settings set;
	struct gdr_cache *c;

	(void)state;
	assert_int_equal(cfg->max_bytes, 3ULL << 20);
	assert_int_equal(cfg->max_entries, 100);
	assert_int_equal(cfg->max_pin_bytes, 256ULL << 20); /* unset: the default */
	assert_null(cfg->bad);
	assert_int_equal(cfg->backend, GDR_BACKEND_PEERMEM);
	assert_int_equal(cfg->log_level, GDR_LOG_ERROR);
	assert_int_equal(gdr_log_level, GDR_LOG_ERROR);
	/* An attribute overrides the environment for its cache only. */
	assert_int_equal(gdr_cache_create(&a, &c), 0);
	assert_int_equal(gdr_cache_get_settings(c, &set, sizeof(set)), 0);
	assert_int_equal(set.max_entries, 7);
	assert_int_equal(set.max_entries_from, GDR_SETTING_ATTR);
	assert_int_equal(set.max_bytes, 3ULL << 20);
	assert_int_equal(set.max_bytes_from, GDR_SETTING_ENV);
	assert_int_equal(set.max_pin_bytes_from, GDR_SETTING_DEFAULT);
	assert_int_equal(set.backend, GDR_BACKEND_PEERMEM);
	assert_int_equal(set.backend_from, GDR_SETTING_ENV);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

/* A child that hangs is killed by its alarm, in seconds (times GDR_TEST_WAIT_SCALE): a failure. */
#define CHILD_ALARM_S 30

static void test_stats_printed_at_exit(void **state)
{
	int p[2];
	char out[4096] = "";
	ssize_t n, total = 0;
	unsigned alarm_s = CHILD_ALARM_S * (unsigned)gdr_deadline_scale();
	pid_t pid;
	int status;

	(void)state;
	assert_int_equal(pipe(p), 0);
	pid = fork();
	if (!pid) {
		struct gdr_cache *c;

		alarm(alarm_s); /* kept across exec: a hang fails */
		dup2(p[1], 2);
		setenv("GDRCACHE_STATS", "1", 1);
		/* A fresh process image reads the environment anew. */
		execl("/proc/self/exe", "test_config", "--child", (char *)NULL);
		_exit(77); /* cannot exec itself (qemu-user without binfmt_misc): skipped */
		(void)c;
	}
	close(p[1]);
	while ((n = read(p[0], out + total, sizeof(out) - 1 - total)) > 0)
		total += n;
	close(p[0]);
	waitpid(pid, &status, 0);
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
		fail_msg("--child: hung (killed by its alarm after %u s); stderr: %s", alarm_s,
			 out);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
		skip();
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_non_null(strstr(out, "stats (at exit"));
	assert_non_null(strstr(out, "passthrough 0"));
}

/* Runs this program again with name=value in its environment and the given mode; its exit status
 * (77 where it cannot exec itself), and what it wrote to stderr in err (if not NULL). */
static int child(const char *mode, const char *name, const char *value, char *err, size_t n)
{
	unsigned alarm_s = CHILD_ALARM_S * (unsigned)gdr_deadline_scale();
	int p[2], status;
	ssize_t r, total = 0;
	pid_t pid;

	assert_int_equal(pipe(p), 0);
	pid = fork();
	if (!pid) {
		alarm(alarm_s); /* kept across exec: a hang fails */
		dup2(p[1], 2);
		setenv("GDRCACHE_LOG", "warn", 1); /* ctest sets error: warnings are what is checked */
		setenv(name, value, 1);
		execl("/proc/self/exe", "test_config", mode, name, (char *)NULL);
		_exit(77);
	}
	close(p[1]);
	while ((r = read(p[0], err ? err + total : (char[256]){ 0 },
			 err ? n - 1 - (size_t)total : 255)) > 0)
		total += err ? r : 0;
	if (err)
		err[total] = '\0';
	close(p[0]);
	waitpid(pid, &status, 0);
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
		fail_msg("%s %s=%s: hung (killed by its alarm after %u s); stderr: %s", mode, name,
			 value, alarm_s, err ? err : "");
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

/* Every malformed value: no cache, -EINVAL, a message naming the variable. */
static void test_malformed_refused(void **state)
{
	static const char *const bad[][2] = {
		{ "GDRCACHE_MAX_BYTES", "abc" },      { "GDRCACHE_MAX_BYTES", " -1" },
		{ "GDRCACHE_MAX_BYTES", "1.5G" },     { "GDRCACHE_MAX_BYTES", "0" },
		{ "GDRCACHE_MAX_ENTRIES", "lots" },   { "GDRCACHE_MAX_PIN_BYTES", "-4M" },
		{ "GDRCACHE_BACKEND", "dmabuff" },    { "GDRCACHE_VALIDATE", "event" },
		{ "GDRCACHE_LOG", "verbose" },        { "GDRCACHE_STATS", "maybe" },
	};
	char err[4096];
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = child("--refused", bad[i][0], bad[i][1], err, sizeof(err));

		if (rc == 77)
			skip();
		if (rc)
			fail_msg("%s=\"%s\" was not refused", bad[i][0], bad[i][1]);
		if (!strstr(err, bad[i][0]) || !strstr(err, "must be"))
			fail_msg("%s=\"%s\": no message naming it: %s", bad[i][0], bad[i][1], err);
	}
}

/* An unknown GDRCACHE_* name (a typo): warned about, the cache still made. */
static void test_unknown_name_warned(void **state)
{
	char err[4096];
	int rc;
	(void)state;

	rc = child("--typo", "GDRCACHE_MAX_BYTE", "1G", err, sizeof(err));
	if (rc == 77)
		skip();
	assert_int_equal(rc, 0);
	assert_non_null(strstr(err, "unknown variable GDRCACHE_MAX_BYTE "));
}

/* The statistics printed at gdr_cache_destroy count the lock-free hits (they were summed after
 * the per-thread counters were freed: 0). */
static void test_stats_at_destroy_count_hits(void **state)
{
	char err[8192];
	int rc;
	(void)state;

	rc = child("--destroy-stats", "GDRCACHE_STATS", "1", err, sizeof(err));
	if (rc == 77)
		skip();
	assert_int_equal(rc, 0);
	assert_non_null(strstr(err, "stats (destroy"));
	assert_non_null(strstr(err, " hits 2 misses 1 "));
	assert_non_null(strstr(err, "fast_hits 2 "));
}

/* The library's side of "every variable means the same in the library and the preload"
 * (tests/preload: config): GDRCACHE_STATS=off prints nothing, GDRCACHE_LOG=3 is info. */
static void test_same_meaning_as_preload(void **state)
{
	char err[8192];
	int rc;
	(void)state;

	rc = child("--destroy-stats", "GDRCACHE_STATS", "off", err, sizeof(err));
	if (rc == 77)
		skip();
	assert_int_equal(rc, 0);
	assert_null(strstr(err, "stats"));
	assert_int_equal(child("--log-level", "GDRCACHE_LOG", "3", NULL, 0), GDR_LOG_INFO);
	assert_int_equal(child("--log-level", "GDRCACHE_LOG", "info", NULL, 0), GDR_LOG_INFO);
}

/* The table: every row named, with a form, a default and a description; its one test switch marked
 * as such; each documented default (its last word, for a derived limit's fallback) the value the
 * variable has when unset, so that the header, docs/configuration.md and gdrcache(7), which copy or
 * are made from the table (tests/packaging), say what the library does. */
struct rows {
	char names[32][64];
	char fixed[32][300];
	unsigned n, tests, checked;
};

static void fixed_default(const char *name, const char *form, const char *value, const char *dflt,
			  bool set, void *arg)
{
	struct rows *r = arg;

	(void)form, (void)value, (void)set;
	assert_true(r->n < 32);
	snprintf(r->names[r->n], sizeof(r->names[0]), "%s", name);
	snprintf(r->fixed[r->n++], sizeof(r->fixed[0]), "%s", dflt);
}

static void documented_default(const struct gdr_config_var *var, const char *value, bool set,
			       void *arg)
{
	struct rows *r = arg;
	const char *last = strrchr(var->dflt, ' ') ? strrchr(var->dflt, ' ') + 1 : var->dflt;
	uint64_t a, b;

	(void)value, (void)set;
	assert_int_equal(strncmp(var->name, "GDRCACHE_", 9), 0);
	assert_true(var->form && *var->form && var->dflt && *var->dflt && var->desc && *var->desc);
	if (var->test) {
		r->tests++;
		assert_string_equal(var->name, "GDRCACHE_NO_MEMBARRIER");
		return;
	}
	for (unsigned i = 0; i < r->n; i++) {
		if (strcmp(r->names[i], var->name))
			continue;
		if (!*r->fixed[i] ? strcmp(var->dflt, "stderr") /* GDRCACHE_LOG_FILE: "" */
		    : !gdr_parse_size(last, &a) && !gdr_parse_size(r->fixed[i], &b) ? a != b
		    : strcasecmp(last, r->fixed[i]) != 0)
			fail_msg("%s: documented default \"%s\", unset it is \"%s\"", var->name,
				 var->dflt, r->fixed[i]);
		r->checked++;
		return;
	}
	fail_msg("%s: not a variable of gdr_config_each", var->name);
}

static void test_table(void **state)
{
	struct rows r = { .n = 0 };

	(void)state;
	gdr_config_each(fixed_default, &r);
	gdr_config_vars(documented_default, &r);
	assert_int_equal(r.checked, r.n);
	assert_int_equal(r.tests, 1);
	assert_true(r.n >= 13);
}

/* GDRCACHE_NO_MEMBARRIER, the test switch, is the table's: set to anything (even nothing, even 0)
 * it is on, as when thread.c read it with getenv; never malformed, never warned about as a typo. */
static void test_switch(void **state)
{
	char err[4096];
	int rc;
	(void)state;

	rc = child("--tests", "GDRCACHE_LOG_FILE", "", NULL, 0);
	if (rc == 77)
		skip();
	assert_int_equal(rc, 0); /* unset: off */
	assert_int_equal(child("--tests", "GDRCACHE_NO_MEMBARRIER", "1", err, sizeof(err)), 1);
	assert_null(strstr(err, "GDRCACHE_NO_MEMBARRIER"));
	assert_int_equal(child("--tests", "GDRCACHE_NO_MEMBARRIER", "", NULL, 0), 1);
	assert_int_equal(child("--tests", "GDRCACHE_NO_MEMBARRIER", "0", NULL, 0), 1);
}

/* The default limits from the GPUs (gdr_derive_limits): what each GPU can have pinned is the
 * smaller of its BAR1 and its memory, summed over the GPUs (not the smaller of the sums); the budget
 * half of that; a whole allocation's pin at most an eighth of the smallest GPU's. */
static void expect_limits(const struct gdr_cuda_devices *dev, uint64_t max_bytes,
			  uint64_t max_entries, uint64_t max_pin)
{
	struct gdr_config cfg = { 0 };
	struct gdr_cache_settings set = { 0 }; /* every *_from DEFAULT */

	cfg.max_bytes = 4ULL << 30; /* the fixed defaults */
	cfg.max_entries = 4096;
	cfg.max_pin_bytes = 256ULL << 20;
	gdr_derive_limits(&cfg, &set, dev);
	assert_int_equal(cfg.max_bytes, max_bytes);
	assert_int_equal(cfg.max_entries, max_entries);
	assert_int_equal(cfg.max_pin_bytes, max_pin);
}

static void test_limits_from_mixed_gpus(void **state)
{
	const uint64_t MiB = 1ULL << 20, GiB = 1ULL << 30, h100 = 81559 * MiB;
	struct gdr_cuda_devices none = { 0 }, one = { 0 }, two = { 0 }, mixed = { 0 }, t4 = { 0 };
	struct gdr_config cfg = { 0 };
	struct gdr_cache_settings set = { 0 };
	(void)state;

	expect_limits(&none, 4 * GiB, 4096, 256 * MiB); /* nothing known: the fixed defaults */
	gdr_cuda_devices_add(&one, 128 * GiB, h100);    /* an H100: memory is the smaller */
	assert_int_equal(one.ndev, 1);
	expect_limits(&one, h100 / 2, (h100 / 2) >> 20, h100 / 16);
	gdr_cuda_devices_add(&two, 128 * GiB, h100);
	gdr_cuda_devices_add(&two, 128 * GiB, h100);
	expect_limits(&two, h100, h100 >> 20, h100 / 8);
	/* An H100 and a 16 GB GPU with 256 MiB of BAR1: 80 GiB + 256 MiB pinnable, not
	 * min(128 GiB + 256 MiB, 96 GiB); a whole pin fits the small GPU's BAR1 eight times. */
	gdr_cuda_devices_add(&mixed, 128 * GiB, h100);
	gdr_cuda_devices_add(&mixed, 256 * MiB, 16 * GiB);
	assert_int_equal(mixed.pinnable, h100 + 256 * MiB);
	assert_int_equal(mixed.pinnable_min, 256 * MiB);
	assert_int_equal(mixed.ndev, 2);
	expect_limits(&mixed, (h100 + 256 * MiB) / 2, ((h100 + 256 * MiB) / 2) >> 20, 32 * MiB);
	/* One such GPU alone: the budget below the fixed default, and so is the whole pin. */
	gdr_cuda_devices_add(&t4, 256 * MiB, 16 * GiB);
	expect_limits(&t4, 128 * MiB, 4096, 32 * MiB);
	/* A device that told only one of the two counts by it. */
	gdr_cuda_devices_add(&t4, 0, 8 * GiB);
	assert_int_equal(t4.pinnable, 8 * GiB + 256 * MiB);
	assert_int_equal(t4.pinnable_min, 256 * MiB);
	/* Limits the program set are kept: only the pin's derived one moves. */
	cfg.max_bytes = 1 * GiB;
	cfg.max_entries = 100;
	cfg.max_pin_bytes = 256 * MiB;
	set.max_bytes_from = GDR_SETTING_ENV;
	set.max_entries_from = GDR_SETTING_ATTR;
	gdr_derive_limits(&cfg, &set, &mixed);
	assert_int_equal(cfg.max_bytes, 1 * GiB);
	assert_int_equal(cfg.max_entries, 100);
	assert_int_equal(cfg.max_pin_bytes, 32 * MiB);
	assert_int_equal(set.max_pin_bytes_from, GDR_SETTING_DEVICES);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_environment),
		cmocka_unit_test(test_stats_printed_at_exit),
		cmocka_unit_test(test_malformed_refused),
		cmocka_unit_test(test_unknown_name_warned),
		cmocka_unit_test(test_stats_at_destroy_count_hits),
		cmocka_unit_test(test_same_meaning_as_preload),
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_switch),
		cmocka_unit_test(test_limits_from_mixed_gpus),
	};

	if (argc > 1 && !strcmp(argv[1], "--child")) {
		struct gdr_cache *c;

		/* Leave the cache alive: its statistics must be printed at exit. */
		return gdr_cache_create(NULL, &c) ? 1 : 0;
	}
	if (argc > 2 && !strcmp(argv[1], "--refused")) {
		struct gdr_cache *c = NULL;
		int rc = gdr_cache_create(NULL, &c);

		return rc == -EINVAL && !c ? 0 : 1;
	}
	if (argc > 1 && !strcmp(argv[1], "--destroy-stats")) {
		struct gdr_cache *c;
		struct gdr_region *r;
		uint64_t a;

		setenv("GDRCACHE_BACKEND", "dmabuf", 1); /* main() chose peermem, which needs a PD */
		if (gdr_cache_create(NULL, &c))
			return 1;
		a = fake_cuda_alloc(1 << 20);
		for (int i = 0; i < 3; i++) { /* a miss, then two lock-free hits */
			if (gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r) || gdr_dereg(r))
				return 1;
		}
		return gdr_cache_destroy(c) ? 1 : 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--tests")) /* the test switch, as the exit status */
		return gdr_config_get()->bad ? 99 : gdr_config_tests()->no_membarrier;
	if (argc > 1 && !strcmp(argv[1], "--log-level")) /* the level parsed, as the exit status */
		return gdr_config_get()->bad ? 99 : gdr_config_get()->log_level;
	if (argc > 1 && !strcmp(argv[1], "--typo")) {
		struct gdr_cache *c;

		return gdr_cache_create(NULL, &c) || gdr_cache_destroy(c) ? 1 : 0;
	}
	setenv("GDRCACHE_MAX_BYTES", "3M", 1);
	setenv("GDRCACHE_MAX_ENTRIES", "100", 1);
	setenv("GDRCACHE_BACKEND", "peermem", 1);
	setenv("GDRCACHE_LOG", "error", 1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
