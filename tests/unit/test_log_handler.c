/* SPDX-License-Identifier: MIT */
/* The program's log handler (gdr_set_log_handler, lib/common/log.c): it takes every line that
 * passes the level and the rate limit (the suppression count too), nothing reaches stderr or
 * GDRCACHE_LOG_FILE meanwhile, NULL gives the lines back to the default sink, a handler replaced
 * while threads log takes each line whole or not at all, and one set before any cache hears
 * gdr_cache_create's errors. */
#define _GNU_SOURCE /* pthread_timedjoin_np (deadline.h) */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/config.h"
#include "common/log.h"
#include "deadline.h"
#include "rerun_case.h"

/* What a handler was given: the first RECS calls in full, and how many calls. */
#define RECS 64
struct rec {
	int calls;
	int level[RECS];
	char msg[RECS][600];
};

static void record(void *arg, int level, const char *msg)
{
	struct rec *r = arg;

	if (r->calls < RECS) {
		r->level[r->calls] = level;
		snprintf(r->msg[r->calls], sizeof(r->msg[0]), "%s", msg);
	}
	r->calls++;
}

/* Calls whose message contains needle. */
static int seen(const struct rec *r, const char *needle)
{
	int n = 0;

	for (int i = 0; i < r->calls && i < RECS; i++)
		n += strstr(r->msg[i], needle) != NULL;
	return n;
}

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

/* Stops capturing; the lines containing needle. With each, if given, called on every line. */
static int captured_each(const char *needle, void (*each)(const char *line))
{
	char line[1024];
	int n = 0;

	fflush(stderr);
	dup2(saved_stderr, 2);
	close(saved_stderr);
	rewind(out);
	while (fgets(line, sizeof(line), out)) {
		n += strstr(line, needle) != NULL;
		if (each)
			each(line);
	}
	fclose(out);
	return n;
}

static int captured(const char *needle)
{
	return captured_each(needle, NULL);
}

static int reset(void **state)
{
	(void)state;
	gdr_set_log_handler(NULL, NULL);
	gdr_set_log_level(GDR_LOG_WARN);
	return 0;
}

static void test_lines_reach_handler(void **state)
{
	struct rec r = { 0 };

	(void)state;
	gdr_set_log_level(GDR_LOG_INFO);
	capture();
	assert_int_equal(gdr_set_log_handler(record, &r), 0);
	gdr_err("to the handler %d", 1);
	gdr_warn("to the handler %s", "two");
	gdr_info("to the handler 3");
	assert_int_equal(captured(""), 0); /* no line at all */
	assert_int_equal(r.calls, 3);
	/* the text alone: no prefix, no function and line, no newline */
	assert_string_equal(r.msg[0], "to the handler 1");
	assert_int_equal(r.level[0], GDR_LOG_ERROR);
	assert_string_equal(r.msg[1], "to the handler two");
	assert_int_equal(r.level[1], GDR_LOG_WARN);
	assert_string_equal(r.msg[2], "to the handler 3");
	assert_int_equal(r.level[2], GDR_LOG_INFO);
}

static void test_level_filter_applies(void **state)
{
	struct rec r = { 0 };

	(void)state;
	gdr_set_log_level(GDR_LOG_ERROR); /* first: setting the handler must not change it */
	assert_int_equal(gdr_set_log_handler(record, &r), 0);
	gdr_err("filtered error");
	gdr_warn("filtered warn");
	gdr_info("filtered info");
	gdr_dbg("filtered debug");
	assert_int_equal(r.calls, 1);
	assert_string_equal(r.msg[0], "filtered error");
	gdr_set_log_level(GDR_LOG_NONE);
	gdr_err("filtered error, none");
	assert_int_equal(r.calls, 1);
	gdr_set_log_level(GDR_LOG_DEBUG);
	gdr_dbg("filtered debug, on");
	assert_int_equal(r.calls, 2);
	assert_string_equal(r.msg[1], "filtered debug, on");
	assert_int_equal(r.level[1], GDR_LOG_DEBUG);
}

static void noisy(int i)
{
	gdr_err("noisy %d", i); /* one call site */
}

static void test_rate_limit_applies(void **state)
{
	struct timespec ts = { GDR_LOG_INTERVAL_S, 200000000 };
	struct rec r = { 0 };
	char note[64];

	(void)state;
	gdr_set_log_level(GDR_LOG_WARN);
	assert_int_equal(gdr_set_log_handler(record, &r), 0);
	for (int i = 0; i < 1000; i++)
		noisy(i);
	assert_int_equal(r.calls, GDR_LOG_BURST);
	assert_int_equal(seen(&r, "more like this suppressed"), 0);
	nanosleep(&ts, NULL);
	noisy(1000);
	noisy(1001); /* within the interval again: suppressed */
	assert_int_equal(r.calls, GDR_LOG_BURST + 1);
	snprintf(note, sizeof(note), "noisy 1000 (%d more like this suppressed)",
		 1000 - GDR_LOG_BURST);
	assert_string_equal(r.msg[GDR_LOG_BURST], note);
	assert_int_equal(r.level[GDR_LOG_BURST], GDR_LOG_ERROR);
}

static void test_null_restores_default(void **state)
{
	struct rec r = { 0 };

	(void)state;
	gdr_set_log_level(GDR_LOG_WARN);
	assert_int_equal(gdr_set_log_handler(record, &r), 0);
	capture();
	gdr_err("before the reset");
	assert_int_equal(gdr_set_log_handler(NULL, NULL), 0);
	gdr_err("after the reset");
	gdr_warn("after the reset, warn");
	assert_int_equal(captured("after the reset"), 2);
	assert_int_equal(r.calls, 1);
	assert_string_equal(r.msg[0], "before the reset");
	capture();
	gdr_err("the default format");
	assert_int_equal(captured(" error: the default format (test_null_restores_default:"), 1);
}

/* Four threads log debug lines (not limited) while a fifth replaces the handler in turn with A, B
 * and the default sink. Each line must reach exactly one, a handler only with its own argument.
 * They overlap by construction: the loggers go on (up to LINES_MAX lines) until the replacer has
 * made REPLACEMENTS, and it goes on until each logger has written LINES_MIN (or the deadline); after
 * each replacement it waits for a line to be logged, so that each handler in turn takes some. */
#define LOGGERS 4
#define LINES_MIN 2000
#define LINES_MAX 100000
#define REPLACEMENTS 20000

static struct counter {
	long calls; /* __atomic */
	long wrong; /* called with another's argument, or a line not ours */
} ca, cb;
static unsigned char got[LOGGERS][LINES_MAX]; /* __atomic: times each line was seen */
static int lines[LOGGERS];                    /* each logger's count, once it is done */
static int loggers_past_min;                  /* __atomic */
static int loggers_done;                      /* __atomic */
static long logged;                           /* __atomic: lines, all loggers */
static int replacer_done;                     /* __atomic */
static int64_t replace_deadline;
static long replacements;

static void count_line(const char *msg)
{
	const char *p = strstr(msg, "conc ");
	int t, i;

	if (p && sscanf(p, "conc %d %d", &t, &i) == 2 && t >= 0 && t < LOGGERS && i >= 0 &&
	    i < LINES_MAX)
		__atomic_add_fetch(&got[t][i], 1, __ATOMIC_RELAXED);
}

static void handler_a(void *arg, int level, const char *msg)
{
	__atomic_add_fetch(&ca.calls, 1, __ATOMIC_RELAXED);
	if (arg != &ca || level != GDR_LOG_DEBUG || strncmp(msg, "conc ", 5))
		__atomic_add_fetch(&ca.wrong, 1, __ATOMIC_RELAXED);
	count_line(msg);
}

static void handler_b(void *arg, int level, const char *msg)
{
	__atomic_add_fetch(&cb.calls, 1, __ATOMIC_RELAXED);
	if (arg != &cb || level != GDR_LOG_DEBUG || strncmp(msg, "conc ", 5))
		__atomic_add_fetch(&cb.wrong, 1, __ATOMIC_RELAXED);
	count_line(msg);
}

static void *logger(void *arg)
{
	int t = (int)(intptr_t)arg, i = 0;

	while (i < LINES_MAX) {
		gdr_dbg("conc %d %d", t, i);
		__atomic_add_fetch(&logged, 1, __ATOMIC_RELAXED);
		if (++i == LINES_MIN)
			__atomic_add_fetch(&loggers_past_min, 1, __ATOMIC_RELEASE);
		if (i >= LINES_MIN && __atomic_load_n(&replacer_done, __ATOMIC_ACQUIRE))
			break;
	}
	if (i < LINES_MIN) /* LINES_MAX below it: never */
		__atomic_add_fetch(&loggers_past_min, 1, __ATOMIC_RELEASE);
	lines[t] = i;
	__atomic_add_fetch(&loggers_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *replacer(void *arg)
{
	long k = 0;

	(void)arg;
	while ((k < REPLACEMENTS ||
		__atomic_load_n(&loggers_past_min, __ATOMIC_ACQUIRE) < LOGGERS) &&
	       !gdr_deadline_passed(replace_deadline)) {
		switch (k++ % 3) {
		case 0:
			gdr_set_log_handler(handler_a, &ca);
			break;
		case 1:
			gdr_set_log_handler(handler_b, &cb);
			break;
		default:
			gdr_set_log_handler(NULL, NULL);
		}
		for (long at = __atomic_load_n(&logged, __ATOMIC_RELAXED);
		     __atomic_load_n(&logged, __ATOMIC_RELAXED) == at &&
		     __atomic_load_n(&loggers_done, __ATOMIC_ACQUIRE) < LOGGERS &&
		     !gdr_deadline_passed(replace_deadline);)
			sched_yield();
	}
	replacements = k;
	__atomic_store_n(&replacer_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_concurrent_replacement(void **state)
{
	int64_t deadline = gdr_deadline_ms(60000);
	pthread_t threads[LOGGERS], rep;
	long on_stderr, total = 0, missing = 0, twice = 0;

	(void)state;
	gdr_set_log_level(GDR_LOG_DEBUG);
	replace_deadline = deadline;
	capture();
	assert_int_equal(pthread_create(&rep, NULL, replacer, NULL), 0);
	for (int t = 0; t < LOGGERS; t++)
		assert_int_equal(pthread_create(&threads[t], NULL, logger, (void *)(intptr_t)t), 0);
	/* the replacer stops at the deadline, the loggers at LINES_MAX after it: 30 s more */
	if (gdr_join_until(rep, deadline + 1000000000ll))
		fail_msg("the replacer still running after %lld s", gdr_deadline_s(60000));
	for (int t = 0; t < LOGGERS; t++)
		if (gdr_join_until(threads[t], gdr_deadline_ms(30000)))
			fail_msg("logger %d still running %lld s after the replacer ended", t,
				 gdr_deadline_s(30000));
	gdr_set_log_handler(NULL, NULL);
	on_stderr = captured_each(": conc ", count_line);
	for (int t = 0; t < LOGGERS; t++) {
		total += lines[t];
		for (int i = 0; i < LINES_MAX; i++) {
			missing += i < lines[t] && got[t][i] == 0;
			twice += got[t][i] > (i < lines[t]);
		}
	}
	print_message("%ld replacements; %ld lines: %ld to A, %ld to B, %ld to stderr\n",
		      replacements, total, ca.calls, cb.calls, on_stderr);
	assert_int_equal(ca.wrong, 0);
	assert_int_equal(cb.wrong, 0);
	assert_int_equal(missing, 0);
	assert_int_equal(twice, 0);
	assert_int_equal(ca.calls + cb.calls + on_stderr, total);
}

/* Runs this program again in mode (--create, --file: child_main) with the environment pairs
 * (NULL-terminated; rerun.h), killed after 60 s; its exit status (77: it cannot exec itself,
 * qemu-user: skipped) and its stderr in err, where it says what its handler heard if that was wrong
 * (else nothing: the parent expects it empty). */
static int child(const char *mode, char *err, size_t n, ...)
{
	va_list ap;
	int status, rc;

	va_start(ap, n);
	rc = gdr_rerun(mode, false, 60, err, n, &status, ap);
	va_end(ap);
	assert_int_equal(rc, 0);
	return gdr_rerun_exit(mode, err, status);
}

static void test_handler_before_any_cache(void **state)
{
	char err[4096];

	(void)state;
	if (child("--create", err, sizeof(err), "GDRCACHE_MAX_BYTES", "bogus", "GDRCACHE_LOG",
		  "error", (char *)NULL))
		fail_msg("--create: %s", err);
	assert_string_equal(err, ""); /* nothing on stderr */
}

/* GDRCACHE_LOG_FILE: nothing in the file while a handler is set, the lines there after NULL. */
static void test_log_file_untouched(void **state)
{
	char dir[] = "/tmp/gdr_logh_XXXXXX", file[64], err[4096], line[1024], cmd[96];
	int to_handler = 0, to_file = 0;
	FILE *f;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(file, sizeof(file), "%s/log", dir);
	if (child("--file", err, sizeof(err), "GDRCACHE_LOG_FILE", file, "GDRCACHE_LOG", "error",
		  (char *)NULL))
		fail_msg("--file: %s", err);
	assert_string_equal(err, "");
	f = fopen(file, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		to_handler += strstr(line, "to the handler") != NULL;
		to_file += strstr(line, " error: to the file (") != NULL;
	}
	fclose(f);
	assert_int_equal(to_handler, 0);
	assert_int_equal(to_file, 1);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

/* The child modes: 0 when the handler heard what it should (else what it heard, on stderr). */
static int child_main(const char *mode)
{
	static struct rec r;
	struct gdr_cache *c = NULL;
	int rc, bad = 0;

	if (gdr_set_log_handler(record, &r)) /* first: nothing has read the environment */
		return 2;
	if (!strcmp(mode, "--create")) {
		rc = gdr_cache_create(NULL, &c);
		bad = rc != -EINVAL || c;
		/* the malformed value (the environment's reading) and the refusal */
		bad |= seen(&r, "GDRCACHE_MAX_BYTES=\"bogus\" is malformed") != 1;
		bad |= seen(&r, "GDRCACHE_MAX_BYTES is malformed (see above): no cache") != 1;
		for (int i = 0; i < r.calls && i < RECS; i++)
			bad |= r.level[i] != GDR_LOG_ERROR;
	} else {
		(void)gdr_config_get(); /* GDRCACHE_LOG_FILE read: the default sink is the file */
		gdr_err("to the handler");
		gdr_set_log_handler(NULL, NULL);
		gdr_err("to the file");
		bad = r.calls != 1 || seen(&r, "to the handler") != 1;
	}
	if (bad) {
		fprintf(stderr, "%s: %d lines heard:", mode, r.calls);
		for (int i = 0; i < r.calls && i < RECS; i++)
			fprintf(stderr, " [%d] %s;", r.level[i], r.msg[i]);
		fprintf(stderr, "\n");
	}
	return bad;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_lines_reach_handler, reset),
		cmocka_unit_test_teardown(test_level_filter_applies, reset),
		cmocka_unit_test_teardown(test_rate_limit_applies, reset),
		cmocka_unit_test_teardown(test_null_restores_default, reset),
		cmocka_unit_test_teardown(test_concurrent_replacement, reset),
		cmocka_unit_test_teardown(test_handler_before_any_cache, reset),
		cmocka_unit_test_teardown(test_log_file_untouched, reset),
	};

	if (argc > 1 && (!strcmp(argv[1], "--create") || !strcmp(argv[1], "--file")))
		return child_main(argv[1]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
