/* SPDX-License-Identifier: MIT */
/*
 * Statistics people can use (lib/cache/stats.c): GDRCACHE_STATS=file:PATH (%p the pid, appended to) in
 * GDRCACHE_STATS_FORMAT json or kv, at gdr_cache_destroy and at exit; a file that cannot be opened
 * falls back to stderr with one warning; GDRCACHE_STATS_SIGNAL installs a handler only when asked,
 * writes the records on the signal and calls the handler installed before it; malformed values
 * are refused. Each case runs this program again (a fresh environment: it is read once).
 */
#define _GNU_SOURCE
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

#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "rerun_case.h"

static char dir[] = "/tmp/gdr_stats_XXXXXX";

/* Runs this program again in mode with the environment pairs (NULL-terminated; rerun.h), killed
 * after 120 s; its exit status (77: it cannot exec itself, qemu-user) and its stderr in err. */
static int child(const char *mode, char *err, size_t n, ...)
{
	va_list ap;
	int status, rc;

	va_start(ap, n);
	rc = gdr_rerun(mode, false, 120, err, n, &status, ap);
	va_end(ap);
	assert_int_equal(rc, 0);
	return gdr_rerun_exit(mode, err, status);
}

/* The text of every file in dir named like name (%p replaced by *), concatenated; file count. */
static int slurp(const char *prefix, char *out, size_t n)
{
	char cmd[512];
	FILE *f;
	size_t got;
	int files = 0;

	snprintf(cmd, sizeof(cmd), "ls %s/%s* 2>/dev/null | wc -l", dir, prefix);
	f = popen(cmd, "r");
	assert_non_null(f);
	assert_int_equal(fscanf(f, "%d", &files), 1);
	pclose(f);
	snprintf(cmd, sizeof(cmd), "cat %s/%s* 2>/dev/null", dir, prefix);
	f = popen(cmd, "r");
	assert_non_null(f);
	got = fread(out, 1, n - 1, f);
	out[got] = '\0';
	pclose(f);
	return files;
}

static char path[256];

static const char *file_of(const char *name)
{
	snprintf(path, sizeof(path), "file:%s/%s", dir, name);
	return path;
}

/* json to a file named with %p: one record at destroy (with the hits), one at exit for the cache
 * left alive; nothing on stderr. */
static void test_file_json(void **state)
{
	char err[4096], out[16384];
	(void)state;

	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS",
			       file_of("json.%p"), "GDRCACHE_STATS_FORMAT", "json", NULL),
			 0);
	assert_string_equal(err, "");
	assert_int_equal(slurp("json.", out, sizeof(out)), 1); /* one file, its name the pid */
	assert_non_null(strstr(out, "{\"source\": \"cache\", \"why\": \"destroy\", \"pid\": "));
	assert_non_null(strstr(out, "\"hits\": 2, \"misses\": 1, "));
	assert_non_null(strstr(out, "\"why\": \"at exit\""));
	assert_non_null(strstr(out, "\"backend\": \"dmabuf\""));
	assert_non_null(strstr(out, "\"interception\": \"frees seen:"));
	/* JSON Lines: one object a line, two lines. */
	assert_int_equal(out[strlen(out) - 1], '\n');
	assert_null(strchr(strchr(strchr(out, '\n') + 1, '\n') + 1, '{'));
}

/* auto is json in a file; kv when asked; the file is appended to, not truncated. */
static void test_file_kv_appends(void **state)
{
	char err[4096], out[16384];
	(void)state;

	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS", file_of("kv"),
			       "GDRCACHE_STATS_FORMAT", "kv", NULL),
			 0);
	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS", file_of("kv"),
			       "GDRCACHE_STATS_FORMAT", "kv", NULL),
			 0);
	assert_string_equal(err, "");
	slurp("kv", out, sizeof(out));
	assert_non_null(strstr(out, "gdrcache_stats source=cache why=destroy pid="));
	assert_non_null(strstr(out, " backend=dmabuf validate="));
	assert_non_null(strstr(out, " hits=2 misses=1 "));
	assert_non_null(strstr(out, "why=\"at exit\""));
	/* Two runs of two records each. */
	assert_non_null(
		strstr(strstr(strstr(strstr(out, "gdrcache_stats") + 1, "gdrcache_stats") + 1,
			      "gdrcache_stats") +
			       1,
		       "gdrcache_stats"));
	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS", file_of("auto"),
			       NULL),
			 0);
	slurp("auto", out, sizeof(out));
	assert_non_null(strstr(out, "{\"source\": \"cache\""));
}

/* A file that cannot be opened: the records on stderr, one warning for both. */
static void test_file_unopenable(void **state)
{
	static const char said[] = "GDRCACHE_STATS=file:/nonexistent/dir/stats cannot be opened";
	char err[8192];
	const char *w;
	(void)state;

	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS",
			       "file:/nonexistent/dir/stats", "GDRCACHE_LOG", "warn", NULL),
			 0);
	w = strstr(err, said);
	assert_non_null(w);
	assert_null(strstr(w + sizeof(said) - 1, "cannot be opened")); /* once */
	assert_non_null(strstr(err, "\"why\": \"destroy\""));
	assert_non_null(strstr(err, "\"why\": \"at exit\""));
}

/* The signal: records written by the library's thread; the program's own handler, installed
 * before, still called once per signal; without the variable no handler is installed. */
static void test_signal(void **state)
{
	char err[4096], out[16384];
	(void)state;

	assert_int_equal(child("--signal", err, sizeof(err), "GDRCACHE_STATS", file_of("sig"),
			       "GDRCACHE_STATS_SIGNAL", "USR2", NULL),
			 0);
	slurp("sig", out, sizeof(out));
	assert_non_null(strstr(out, "\"why\": \"signal\""));
	assert_non_null(strstr(out, "\"hits\": 2,"));
	assert_int_equal(child("--no-signal", err, sizeof(err), "GDRCACHE_STATS", "1", NULL), 0);
	/* Without GDRCACHE_STATS the signal is not taken either, and that is said. */
	assert_int_equal(child("--no-signal", err, sizeof(err), "GDRCACHE_STATS_SIGNAL", "USR2",
			       "GDRCACHE_LOG", "warn", NULL),
			 0);
	assert_non_null(strstr(err, "GDRCACHE_STATS_SIGNAL is set, GDRCACHE_STATS is not"));
}

/* A child of fork() that exits, or destroys the cache it inherited, writes the parent's counts: its
 * records say it is a child (the parent's do not), so that records summed by pid are not counted
 * twice. */
static void test_fork_child_records(void **state)
{
	char err[4096], out[16384], *child_line, *parent_line;
	int rc;
	(void)state;

	rc = child("--fork", err, sizeof(err), "GDRCACHE_STATS", file_of("fork.%p"),
		   "GDRCACHE_STATS_FORMAT", "json", NULL);
	if (rc)
		fail_msg("--fork: exit %d: %s", rc, err);
	assert_string_equal(err, "");
	assert_int_equal(slurp("fork.", out, sizeof(out)), 2); /* the parent's file, the child's */
	child_line = strstr(out, "\"why\": \"destroy, child of fork\"");
	assert_non_null(child_line);
	assert_non_null(strstr(out, "\"why\": \"at exit, child of fork\""));
	parent_line = strstr(out, "\"why\": \"at exit\"");
	assert_non_null(parent_line);
	assert_non_null(strstr(out, "\"why\": \"destroy\""));
}

/* Malformed values: no cache, a message naming the variable. */
static void test_malformed(void **state)
{
	static const char *const bad[][2] = {
		{ "GDRCACHE_STATS", "file:" },
		{ "GDRCACHE_STATS", "files:/tmp/x" },
		{ "GDRCACHE_STATS_FORMAT", "xml" },
		{ "GDRCACHE_STATS_SIGNAL", "KILL" },
		{ "GDRCACHE_STATS_SIGNAL", "RTMIN+999" },
		{ "GDRCACHE_STATS_SIGNAL", "USR3" },
	};
	char err[4096];
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (child("--refused", err, sizeof(err), bad[i][0], bad[i][1], NULL))
			fail_msg("%s=\"%s\" was not refused", bad[i][0], bad[i][1]);
		if (!strstr(err, bad[i][0]) || !strstr(err, "must be"))
			fail_msg("%s=\"%s\": no message naming it: %s", bad[i][0], bad[i][1], err);
	}
}

/* ---- The child's side ------------------------------------------------------------------------ */

/* A cache with a miss and two hits (dmabuf backend: no PD needed). */
static struct gdr_cache *busy_cache(void)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	uint64_t a;

	if (gdr_cache_create(NULL, &c))
		exit(1);
	a = fake_cuda_alloc(1 << 20);
	for (int i = 0; i < 3; i++)
		if (gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r) || gdr_dereg(r))
			exit(1);
	return c;
}

static volatile sig_atomic_t prev_calls;

static void prev_handler(int sig)
{
	(void)sig;
	prev_calls++;
}

static int child_signal(bool asked)
{
	struct sigaction sa = { .sa_handler = prev_handler }, now;
	struct gdr_cache *c;
	char name[300], buf[8192];

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL); /* the program's own, before the library's */
	c = busy_cache();
	sigaction(SIGUSR2, NULL, &now);
	if (!asked) /* not asked: the program's handler stays in place */
		return now.sa_handler == prev_handler && !gdr_cache_destroy(c) ? 0 : 2;
	if (now.sa_handler == prev_handler)
		return 3;
	raise(SIGUSR2);
	/* The thread writes the record, and a sanitizer may deliver the signal late: wait for both
	 * (60 s at most: a bound for a hang, not a timing). */
	snprintf(name, sizeof(name), "%s", getenv("GDRCACHE_STATS") + 5);
	for (int i = 0; i < 6000; i++) {
		FILE *f = fopen(name, "r");
		size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

		if (f)
			fclose(f);
		buf[n] = '\0';
		if (strstr(buf, "\"why\": \"signal\"") && prev_calls)
			return prev_calls != 1 ? 4 : gdr_cache_destroy(c) ? 5 : 0;
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
	}
	return 6;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_file_json),       cmocka_unit_test(test_file_kv_appends),
		cmocka_unit_test(test_file_unopenable), cmocka_unit_test(test_signal),
		cmocka_unit_test(test_malformed),       cmocka_unit_test(test_fork_child_records),
	};
	int rc;

	setenv("GDRCACHE_BACKEND", "dmabuf", 1);
	if (argc > 1 && !strcmp(argv[1], "--two-caches")) {
		struct gdr_cache *alive;

		alive = busy_cache(); /* left alive: its record at exit */
		(void)alive;
		return gdr_cache_destroy(busy_cache()) ? 1 : 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--fork")) {
		/* Two caches; the child destroys one and exits with the other; so does the parent. */
		struct gdr_cache *kept = busy_cache(), *gone = busy_cache();
		unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
		int status;
		pid_t pid = fork();

		if (pid < 0)
			return 1;
		if (!pid) {
			alarm(alarm_s); /* a hang fails (it keeps stderr, the test's pipe, open) */
			exit(gdr_cache_destroy(gone) ? 2 : 0);
		}
		if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
			if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
				fprintf(stderr, "the child of fork() hung (killed by its alarm)\n");
			return 3;
		}
		(void)kept;
		return gdr_cache_destroy(gone) ? 4 : 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--signal"))
		return child_signal(true);
	if (argc > 1 && !strcmp(argv[1], "--no-signal"))
		return child_signal(false);
	if (argc > 1 && !strcmp(argv[1], "--refused")) {
		struct gdr_cache *c = NULL;

		setenv("GDRCACHE_LOG", "warn", 1);
		return gdr_cache_create(NULL, &c) == -EINVAL && !c ? 0 : 1;
	}
	if (!mkdtemp(dir))
		return 1;
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	{
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		if (system(cmd))
			rc = rc ? rc : 1;
	}
	return rc;
}
