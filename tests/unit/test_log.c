/* SPDX-License-Identifier: MIT */
/* Logs never flood (lib/log.c): a call site prints its first GDR_LOG_BURST lines, then one per
 * GDR_LOG_INTERVAL_S seconds carrying the count of those suppressed; other sites are not held
 * back by a noisy one; debug lines are not limited. stderr goes to a file and is counted. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "gdrcache_int.h"

static FILE *out;
static int saved_stderr = -1;

static void capture(void)
{
	fflush(stderr);
	out = tmpfile();
	assert_non_null(out);
	saved_stderr = dup(2);
	dup2(fileno(out), 2);
}

/* Stops capturing; the lines containing needle. */
static int captured(const char *needle)
{
	char line[1024];
	int n = 0;

	fflush(stderr);
	dup2(saved_stderr, 2);
	close(saved_stderr);
	rewind(out);
	while (fgets(line, sizeof(line), out))
		n += strstr(line, needle) != NULL;
	fclose(out);
	return n;
}

static void noisy(int i)
{
	gdr_err("noisy %d", i); /* one call site */
}

static void test_burst_then_quiet(void **state)
{
	(void)state;
	__atomic_store_n(&gdr_log_level, GDR_LOG_DEBUG, __ATOMIC_RELAXED);
	capture();
	for (int i = 0; i < 1000; i++)
		noisy(i);
	gdr_warn("quiet one"); /* another site: not held back */
	for (int i = 0; i < 50; i++)
		gdr_dbg("debug %d", i); /* debug: never limited */
	assert_int_equal(captured("noisy"), GDR_LOG_BURST);
	capture();
	gdr_warn("quiet one, again");
	assert_int_equal(captured("quiet one"), 1);
}

static void test_one_line_per_interval_with_the_count(void **state)
{
	struct timespec ts = { GDR_LOG_INTERVAL_S, 200000000 };

	(void)state;
	/* the site of test_burst_then_quiet has printed its burst */
	capture();
	noisy(1000);
	assert_int_equal(captured("noisy"), 0);
	nanosleep(&ts, NULL);
	capture();
	noisy(1001);
	noisy(1002);
	/* 990 from the burst test and one here suppressed since the last line printed */
	assert_int_equal(captured("991 more like this suppressed"), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_burst_then_quiet),
		cmocka_unit_test(test_one_line_per_interval_with_the_count),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
