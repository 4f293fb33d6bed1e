/* SPDX-License-Identifier: MIT */
/* Configuration: the GDRCACHE_* environment is parsed once, bad values fall back to defaults,
 * explicit attributes override it; GDRCACHE_STATS=1 prints statistics. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "fake_cuda.h"
#include "fakes.h"

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
	assert_int_equal(gdr_parse_size("", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("-1", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("12Q", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("99999999999T", &v), -EINVAL);
}

static void test_environment(void **state)
{
	const struct gdr_config *cfg = gdr_config_get(); /* main() set the environment first */
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_MAX_ENTRIES, .max_entries = 7 };
	struct gdr_cache *c;

	(void)state;
	assert_int_equal(cfg->max_bytes, 3ULL << 20);
	assert_int_equal(cfg->max_entries, 4096);        /* "lots" is refused: default */
	assert_int_equal(cfg->max_pin_bytes, 256ULL << 20); /* "0" is refused: default */
	assert_int_equal(cfg->backend, GDR_BACKEND_PEERMEM);
	assert_int_equal(cfg->log_level, GDR_LOG_ERROR);
	assert_int_equal(gdr_log_level, GDR_LOG_ERROR);
	/* An attribute overrides the environment for its cache only. */
	assert_int_equal(gdr_cache_create(&a, &c), 0);
	assert_int_equal(c->cfg.max_entries, 7);
	assert_int_equal(c->cfg.max_bytes, 3ULL << 20);
	assert_int_equal(c->backend->ops->id, GDR_BACKEND_PEERMEM);
	assert_int_equal(gdr_cache_destroy(c), 0);
}

static void test_stats_printed_at_exit(void **state)
{
	int p[2];
	char out[4096] = "";
	ssize_t n, total = 0;
	pid_t pid;
	int status;

	(void)state;
	assert_int_equal(pipe(p), 0);
	pid = fork();
	if (!pid) {
		struct gdr_cache *c;

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
	if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
		skip();
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_non_null(strstr(out, "stats (at exit"));
	assert_non_null(strstr(out, "passthrough 0"));
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_environment),
		cmocka_unit_test(test_stats_printed_at_exit),
	};

	if (argc > 1 && !strcmp(argv[1], "--child")) {
		struct gdr_cache *c;

		/* Leave the cache alive: its statistics must be printed at exit. */
		return gdr_cache_create(NULL, &c) ? 1 : 0;
	}
	setenv("GDRCACHE_MAX_BYTES", "3M", 1);
	setenv("GDRCACHE_MAX_ENTRIES", "lots", 1);
	setenv("GDRCACHE_MAX_PIN_BYTES", "0", 1);
	setenv("GDRCACHE_BACKEND", "peermem", 1);
	setenv("GDRCACHE_LOG", "error", 1);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
