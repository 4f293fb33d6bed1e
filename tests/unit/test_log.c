/* SPDX-License-Identifier: MIT */
/* Logs never flood (lib/common/log.c): a call site prints its first GDR_LOG_BURST lines, then one per
 * GDR_LOG_INTERVAL_S seconds carrying the count of those suppressed; other sites are not held
 * back by a noisy one; debug lines are not limited. stderr goes to a file and is counted.
 * GDRCACHE_LOG_FILE: lines go to the file (%p: the pid, a child of fork gets its own), appended;
 * one that cannot be opened is said once on stderr, where the lines then go. */
#include <errno.h>
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

static pid_t child_pid; /* the last child's */

/* A child (and its child of fork) that hangs is killed by its alarm, in seconds (times
 * GDR_TEST_WAIT_SCALE): a failure. */
#define CHILD_ALARM_S 30

/* Runs this program again as --child with GDRCACHE_LOG_FILE=file; its exit status (77: it cannot
 * exec itself) and its stderr in err; its pid in child_pid. */
static int child(const char *file, char *err, size_t n)
{
	unsigned alarm_s = CHILD_ALARM_S * (unsigned)gdr_deadline_scale();
	int p[2], status;
	ssize_t r, total = 0;
	pid_t pid;

	assert_int_equal(pipe(p), 0);
	pid = child_pid = fork();
	if (!pid) {
		alarm(alarm_s); /* kept across exec */
		dup2(p[1], 2);
		setenv("GDRCACHE_LOG_FILE", file, 1);
		setenv("GDRCACHE_LOG", "warn", 1);
		execl("/proc/self/exe", "test_log", "--child", (char *)NULL);
		_exit(77);
	}
	close(p[1]);
	while ((r = read(p[0], err + total, n - 1 - (size_t)total)) > 0)
		total += r;
	err[total] = '\0';
	close(p[0]);
	waitpid(pid, &status, 0);
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
		fail_msg("--child: hung (killed by its alarm after %u s); stderr: %s", alarm_s,
			 err);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77)
		skip();
	if (WEXITSTATUS(status)) /* a child of fork() that hung says so here */
		fail_msg("--child: exit %d; stderr: %s", WEXITSTATUS(status), err);
	return WEXITSTATUS(status);
}

/* Lines in file containing needle (-1: no file). */
static int lines_in(const char *file, const char *needle)
{
	char line[1024];
	FILE *f = fopen(file, "r");
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

static void test_log_file(void **state)
{
	char dir[] = "/tmp/gdr_log_XXXXXX", tmpl[64], name[96], err[4096], cmd[96];
	int pid, kid;
	FILE *f;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(tmpl, sizeof(tmpl), "%s/log.%%p", dir);
	assert_int_equal(child(tmpl, err, sizeof(err)), 0);
	assert_string_equal(err, ""); /* nothing on stderr */
	snprintf(cmd, sizeof(cmd), "ls %s | wc -l", dir);
	f = popen(cmd, "r");
	assert_int_equal(fscanf(f, "%d", &pid), 1);
	pclose(f);
	assert_int_equal(pid, 2); /* the process's file and its fork child's */
	/* The process's own file is named for its pid (not the smaller one: pids wrap). */
	pid = (int)child_pid;
	snprintf(name, sizeof(name), "%s/log.%d", dir, pid);
	assert_int_equal(lines_in(name, "] "), 2);
	assert_int_equal(lines_in(name, " error: to the file 1 (main:"), 1);
	assert_int_equal(lines_in(name, " error: to the file 2 (main:"), 1);
	/* The fork child's lines in the file of its own pid. */
	snprintf(cmd, sizeof(cmd), "ls %s | grep -vx 'log\\.%d'", dir, pid);
	f = popen(cmd, "r");
	assert_int_equal(fscanf(f, "log.%d", &kid), 1);
	pclose(f);
	snprintf(name, sizeof(name), "%s/log.%d", dir, kid);
	assert_int_equal(lines_in(name, " error: from the fork child ("), 1);
	assert_int_equal(lines_in(name, "] "), 1);

	/* Appended to: a fixed name, two runs, six lines (four of the parents, two of the children). */
	snprintf(name, sizeof(name), "%s/fixed.log", dir);
	assert_int_equal(child(name, err, sizeof(err)), 0);
	assert_int_equal(child(name, err, sizeof(err)), 0);
	assert_int_equal(lines_in(name, " error: "), 6);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

/* A file that cannot be opened: one warning on stderr, and the lines there. */
static void test_log_file_unopenable(void **state)
{
	char err[4096];
	const char *w;

	(void)state;
	assert_int_equal(child("/nonexistent/dir/log", err, sizeof(err)), 0);
	w = strstr(err, "GDRCACHE_LOG_FILE=/nonexistent/dir/log cannot be opened");
	assert_non_null(w);
	assert_null(strstr(w + 50, "cannot be opened")); /* once */
	assert_non_null(strstr(err, " error: to the file 1 ("));
	assert_non_null(strstr(err, " error: to the file 2 ("));
	assert_non_null(strstr(err, " error: from the fork child ("));
}

/* The time stamp of every line and statistics record (gdr_utc_format: no gmtime_r, which reads TZ)
 * is what gmtime_r and strftime give: the epoch, leap days, centuries (2100 is not a leap year,
 * 2000 is), before 1970, the far future, and 100,000 times at random. */
static void expect_same_as_gmtime(time_t sec, long nsec)
{
	struct timespec ts = { sec, nsec };
	char mine[64], want[64], cut[8];
	struct tm tm;

	assert_non_null(gmtime_r(&sec, &tm));
	strftime(want, sizeof(want), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(want + strlen(want), sizeof(want) - strlen(want), ".%03ldZ", nsec / 1000000);
	gdr_utc_format(mine, sizeof(mine), &ts);
	if (strcmp(mine, want))
		fail_msg("%lld.%09ld: %s, gmtime_r says %s", (long long)sec, nsec, mine, want);
	gdr_utc_format(cut, sizeof(cut), &ts); /* cut, still terminated */
	assert_int_equal(strlen(cut), sizeof(cut) - 1);
	assert_memory_equal(cut, want, sizeof(cut) - 1);
}

static void test_utc_stamp_is_gmtime(void **state)
{
	static const time_t fixed[] = {
		0,	    -1,		59,	    86399,	 86400,	     951782399, /* 2000-02-28T23:59:59 */
		951782400,  951868800,	4107542399, 4107542400,	 4102444800, /* 2100-01-01 */
		-86400,	    -2208988800, 253402300799, 1795807135, 68256000000,
	};
	uint64_t x = 0x9e3779b97f4a7c15ull;
	char now[32];
	(void)state;

	for (unsigned i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		expect_same_as_gmtime(fixed[i], 999999999);
	for (int i = 0; i < 100000; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		/* 2^36 s from 1000-01-01: years 1000 to 3177 (strftime pads no year to 4 digits) */
		expect_same_as_gmtime((time_t)(int64_t)(x % (1ull << 36)) - 30610224000ll,
				      (long)(x >> 40) % 1000000000);
	}
	gdr_utc_stamp(now, sizeof(now));
	assert_int_equal(strlen(now), 24);
	assert_int_equal(now[23], 'Z');
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_burst_then_quiet),
		cmocka_unit_test(test_one_line_per_interval_with_the_count),
		cmocka_unit_test(test_log_file),
		cmocka_unit_test(test_log_file_unopenable),
		cmocka_unit_test(test_utc_stamp_is_gmtime),
	};

	if (argc > 1 && !strcmp(argv[1], "--child")) {
		pid_t kid;
		int status;

		gdr_config_get(); /* reads GDRCACHE_LOG_FILE */
		gdr_err("to the file %d", 1);
		kid = fork();
		if (!kid) {
			/* its own alarm (fork clears the parent's): it holds the test's pipe open */
			alarm(CHILD_ALARM_S * (unsigned)gdr_deadline_scale());
			gdr_err("from the fork child");
			_exit(0);
		}
		waitpid(kid, &status, 0);
		if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
			fprintf(stderr, "the child of fork() hung (killed by its alarm) logging\n");
		gdr_err("to the file %d", 2);
		return WIFEXITED(status) && !WEXITSTATUS(status) ? 0 : 1;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
