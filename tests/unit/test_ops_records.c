/* SPDX-License-Identifier: MIT */
/*
 * Who wrote a statistics record or a log line (lib/common/ident.c, lib/cache/stats.c, log.c): two
 * caches of one process have records told apart by cache_id; records carry schema, host, pid,
 * rank (from OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID, in that order; -1 without)
 * and the monotonic and wall-clock times; log lines carry host=, rank= and, made for a cache,
 * cache=; %h and %r in GDRCACHE_STATS=file: and GDRCACHE_LOG_FILE; GDRCACHE_STATS_INTERVAL=1
 * writes periodic records with the gauges and the interception's state as numbers. The
 * environment is read once: each case runs this program again with its own (rerun.h).
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
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "rerun_case.h"

static char dir[] = "/tmp/gdr_ops_XXXXXX";
static char host[80]; /* as the library writes it: uname's node name, odd characters '_' */

/* The rank variables, emptied (a value that is no number is skipped): the case sets its own. */
#define NO_RANKS "OMPI_COMM_WORLD_RANK", "", "PMIX_RANK", "", "PMI_RANK", "", "SLURM_PROCID", ""

/* Runs this program again in mode with the environment pairs (NULL-terminated), killed after
 * 120 s; its exit status (77: it cannot exec itself, qemu-user: skip) and its stderr in err. */
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

/* The text of dir/name (NUL-terminated, cut to n), or "" when there is none. */
static void slurp(const char *name, char *out, size_t n)
{
	char p[512];
	FILE *f;
	size_t got = 0;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	f = fopen(p, "r");
	if (f) {
		got = fread(out, 1, n - 1, f);
		fclose(f);
	}
	out[got] = '\0';
}

static char file_arg[512];

static const char *file_of(const char *name)
{
	snprintf(file_arg, sizeof(file_arg), "file:%s/%s", dir, name);
	return file_arg;
}

/* The next line of *p (advanced past it) in line; false at the end. */
static bool next_line(const char **p, char *line, size_t n)
{
	const char *nl;
	size_t len;

	if (!**p)
		return false;
	nl = strchr(*p, '\n');
	len = nl ? (size_t)(nl - *p) : strlen(*p);
	snprintf(line, n, "%.*s", (int)len, *p);
	*p += len + (nl ? 1 : 0);
	return true;
}

/* A JSON record's number at "key": (the json form's "key": N); false if it has none. */
static bool json_num(const char *rec, const char *key, long long *v)
{
	char k[96];
	const char *at;
	char *end;

	snprintf(k, sizeof(k), "\"%s\": ", key);
	at = strstr(rec, k);
	if (!at)
		return false;
	*v = strtoll(at + strlen(k), &end, 10);
	return end != at + strlen(k) && (*end == ',' || *end == '}');
}

/* A JSON record's string at "key" into out; false if it has none. */
static bool json_str(const char *rec, const char *key, char *out, size_t n)
{
	char k[96];
	const char *at, *q;

	snprintf(k, sizeof(k), "\"%s\": \"", key);
	at = strstr(rec, k);
	if (!at)
		return false;
	at += strlen(k);
	q = strchr(at, '"');
	if (!q)
		return false;
	snprintf(out, n, "%.*s", (int)(q - at), at);
	return true;
}

/* A kv record's number at " key=" (digits, or a minus and digits); false if it has none. */
static bool kv_num(const char *rec, const char *key, long long *v)
{
	char k[96];
	const char *at;
	char *end;

	snprintf(k, sizeof(k), " %s=", key);
	at = strstr(rec, k);
	if (!at)
		return false;
	*v = strtoll(at + strlen(k), &end, 10);
	return end != at + strlen(k) && (*end == ' ' || *end == '\0');
}

/* Every record's common fields: schema 2, this child's host, a pid, the rank wanted, the times. */
static void expect_who(const char *rec, long long rank)
{
	char h[96], when[64];
	long long v;

	if (!json_num(rec, "schema", &v) || v != 2)
		fail_msg("no schema 2: %s", rec);
	if (!json_str(rec, "host", h, sizeof(h)) || strcmp(h, host))
		fail_msg("host is not %s: %s", host, rec);
	if (!json_num(rec, "pid", &v) || v <= 0)
		fail_msg("no pid: %s", rec);
	if (!json_num(rec, "rank", &v) || v != rank)
		fail_msg("rank is not %lld: %s", rank, rec);
	if (!json_num(rec, "mono_ns", &v) || v <= 0)
		fail_msg("no mono_ns: %s", rec);
	if (!json_str(rec, "time", when, sizeof(when)) || strlen(when) != 24 || when[23] != 'Z')
		fail_msg("no wall-clock time: %s", rec);
}

/* Two caches in one process: each record says which, and they differ; host, pid, no rank. */
static void test_two_caches_told_apart(void **state)
{
	char err[4096], out[32768], line[8192];
	const char *p = out;
	long long ids[4], pid0 = 0, v;
	unsigned n = 0;
	(void)state;

	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS", file_of("two"),
			       "GDRCACHE_STATS_FORMAT", "json", NO_RANKS, NULL),
			 0);
	slurp("two", out, sizeof(out));
	while (next_line(&p, line, sizeof(line))) {
		if (!strstr(line, "\"source\": \"cache\""))
			continue;
		expect_who(line, -1);
		if (!json_num(line, "cache_id", &ids[n]) || ids[n] <= 0)
			fail_msg("no cache_id: %s", line);
		assert_true(json_num(line, "pid", &v));
		if (pid0 && v != pid0)
			fail_msg("two pids in one process's records: %s", out);
		pid0 = v;
		if (++n == 4)
			break;
	}
	if (n != 2)
		fail_msg("%u records of caches, not 2: %s", n, out);
	if (ids[0] == ids[1])
		fail_msg("the two caches' records both say cache_id %lld: %s", ids[0], out);
	/* kv: the same fields. */
	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS",
			       file_of("two.kv"), "GDRCACHE_STATS_FORMAT", "kv", NO_RANKS, NULL),
			 0);
	slurp("two.kv", out, sizeof(out));
	p = out;
	n = 0;
	while (next_line(&p, line, sizeof(line)) && n < 4) {
		char want[128];

		snprintf(want, sizeof(want), " schema=2 host=%s rank=-1 mono_ns=", host);
		if (!strstr(line, want) || !kv_num(line, "cache_id", &ids[n]))
			fail_msg("kv record without schema, host, rank, mono_ns or cache_id: %s",
				 line);
		n++;
	}
	assert_int_equal(n, 2);
	assert_true(ids[0] != ids[1]);
	/* text on stderr: the ids and the host after the colon, the rank where there is one. */
	assert_int_equal(child("--two-caches", err, sizeof(err), "GDRCACHE_STATS", "1", NO_RANKS,
			       "PMIX_RANK", "6", NULL),
			 0);
	for (int i = 1; i <= 2; i++) {
		char want[160];

		snprintf(want, sizeof(want), "validate events): cache_id %d host %s rank 6 hits 2 ",
			 i, host);
		if (!strstr(err, want))
			fail_msg("no text record \"%s\": %s", want, err);
	}
}

/* The rank: the first launcher variable that is a number, in the documented order; in records
 * and log lines (with host=); a line logged for a cache has cache=. */
static void test_rank_and_host(void **state)
{
	static const struct {
		const char *ompi, *pmix, *pmi, *slurm;
		long long rank;
	} cases[] = {
		{ "7", "", "", "", 7 },   { "", "", "", "12", 12 },
		{ "3", "", "", "9", 3 },  { "x", "", "", "5", 5 },
		{ "", "4", "8", "", 4 },  { "", "", "8", "1", 8 },
		{ "-1", "", "", "", -1 }, { "99999999999", "", "", "", -1 },
	};
	char err[8192], out[16384], want[160];
	long long v;
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char name[32];

		snprintf(name, sizeof(name), "rank.%zu", i);
		assert_int_equal(child("--one", err, sizeof(err), "GDRCACHE_STATS", file_of(name),
				       "GDRCACHE_STATS_FORMAT", "json", "OMPI_COMM_WORLD_RANK",
				       cases[i].ompi, "PMIX_RANK", cases[i].pmix, "PMI_RANK",
				       cases[i].pmi, "SLURM_PROCID", cases[i].slurm, "GDRCACHE_LOG",
				       "info", NULL),
				 0);
		slurp(name, out, sizeof(out));
		if (!json_num(out, "rank", &v) || v != cases[i].rank)
			fail_msg("case %zu: rank is not %lld: %s", i, cases[i].rank, out);
		expect_who(out, cases[i].rank);
		/* The info line at the first cache: host, and the rank where there is one. */
		if (cases[i].rank >= 0)
			snprintf(want, sizeof(want), " host=%s rank=%lld)\n", host, cases[i].rank);
		else
			snprintf(want, sizeof(want), " host=%s)\n", host);
		if (strncmp(err, "gdrcache[", 9) || !strstr(err, " info: ") || !strstr(err, want))
			fail_msg("case %zu: no info line ending \"%s\": %s", i, want, err);
		if (cases[i].rank < 0 && strstr(err, " rank="))
			fail_msg("case %zu: a rank in the log without one: %s", i, err);
	}
	/* A line logged while a cache's record is written (its file cannot be opened) names it. */
	assert_int_equal(child("--one", err, sizeof(err), "GDRCACHE_STATS",
			       "file:/nonexistent/dir/stats", "GDRCACHE_LOG", "warn", NO_RANKS,
			       "SLURM_PROCID", "2", NULL),
			 0);
	snprintf(want, sizeof(want), " host=%s rank=2 cache=", host);
	if (!strstr(err, "cannot be opened") || !strstr(err, want))
		fail_msg("the warning for a cache's record has no \"%s\": %s", want, err);
}

/* %h and %r in the names of the statistics and log files; %r is "norank" without a rank. */
static void test_path_host_rank(void **state)
{
	char err[4096], out[16384], name[256];
	(void)state;

	assert_int_equal(child("--one", err, sizeof(err), "GDRCACHE_STATS", file_of("s.%h.%r.%%"),
			       "GDRCACHE_LOG_FILE", "", NO_RANKS, "PMI_RANK", "4", NULL),
			 0);
	snprintf(name, sizeof(name), "s.%s.4.%%", host);
	slurp(name, out, sizeof(out));
	if (!strstr(out, "\"rank\": 4,"))
		fail_msg("no records in %s/%s: %s", dir, name, err);
	assert_int_equal(child("--one", err, sizeof(err), "GDRCACHE_STATS", file_of("n.%r"),
			       NO_RANKS, NULL),
			 0);
	slurp("n.norank", out, sizeof(out));
	assert_non_null(strstr(out, "\"rank\": -1,"));
	/* The log file: %h and %r too. */
	snprintf(name, sizeof(name), "%s/l.%%h.%%r", dir);
	assert_int_equal(child("--one", err, sizeof(err), "GDRCACHE_LOG_FILE", name, "GDRCACHE_LOG",
			       "info", NO_RANKS, "OMPI_COMM_WORLD_RANK", "5", NULL),
			 0);
	snprintf(name, sizeof(name), "l.%s.5", host);
	slurp(name, out, sizeof(out));
	if (strncmp(out, "gdrcache[", 9) || !strstr(out, " rank=5)"))
		fail_msg("no log lines in %s/%s: %s", dir, name, out);
}

/* GDRCACHE_STATS_INTERVAL=1: at least two periodic records within 10 s (the child waits for
 * them), later ones later on the monotonic clock, with the gauges and the interception's state
 * as numbers (its name the number's); kv likewise. */
static void test_interval_records(void **state)
{
	static const char *const names[] = { "in_effect", "off",      "yielded",
					     "no_driver", "unproven", "unknown" };
	char err[4096], out[65536], line[8192], name[64];
	const char *p = out;
	long long mono = 0, v, st;
	unsigned periodic = 0;
	(void)state;

	assert_int_equal(child("--interval", err, sizeof(err), "GDRCACHE_STATS",
			       file_of("interval"), "GDRCACHE_STATS_FORMAT", "json",
			       "GDRCACHE_STATS_INTERVAL", "1", NO_RANKS, "SLURM_PROCID", "3", NULL),
			 0);
	slurp("interval", out, sizeof(out));
	while (next_line(&p, line, sizeof(line))) {
		if (!strstr(line, "\"why\": \"interval\""))
			continue;
		periodic++;
		expect_who(line, 3);
		assert_true(json_num(line, "mono_ns", &v));
		if (v <= mono)
			fail_msg("periodic record %u not later than the one before: %s", periodic,
				 out);
		mono = v;
		if (!json_num(line, "pinned_bytes", &v) || !json_num(line, "entries", &v) ||
		    !json_num(line, "peak", &v) || !json_num(line, "hits", &v) || v != 2)
			fail_msg("a periodic record without its gauges and counters: %s", line);
		if (!json_num(line, "intercept_state", &st) || st < 0 || st > 5 ||
		    !json_str(line, "intercept_state_name", name, sizeof(name)) ||
		    strcmp(name, names[st]) || !json_num(line, "intercept_errno", &v))
			fail_msg("the interception's state is not a number and its name: %s", line);
		if (st != 5 && !json_num(line, "intercept_frees_mem_free", &v))
			fail_msg("the interception's counters are not numbers: %s", line);
	}
	if (periodic < 2)
		fail_msg("%u periodic records: %s (stderr %s)", periodic, out, err);
	/* kv */
	assert_int_equal(child("--interval", err, sizeof(err), "GDRCACHE_STATS",
			       file_of("interval.kv"), "GDRCACHE_STATS_FORMAT", "kv",
			       "GDRCACHE_STATS_INTERVAL", "1", NO_RANKS, NULL),
			 0);
	slurp("interval.kv", out, sizeof(out));
	p = out;
	periodic = 0;
	while (next_line(&p, line, sizeof(line))) {
		if (!strstr(line, " why=interval "))
			continue;
		periodic++;
		if (!kv_num(line, "intercept_state", &st) || !kv_num(line, "pinned_bytes", &v) ||
		    !kv_num(line, "entries", &v) || !kv_num(line, "mono_ns", &v) ||
		    !kv_num(line, "rank", &v) || v != -1 || !strstr(line, " intercept_state_name="))
			fail_msg("kv periodic record lacks a number: %s", line);
	}
	assert_true(periodic >= 2);
}

/* Malformed intervals are refused; one without GDRCACHE_STATS is said. */
static void test_interval_malformed(void **state)
{
	static const char *const bad[] = { "abc", "-1", "1.5", "86401", "", " 1", "1s" };
	char err[4096];
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (child("--refused", err, sizeof(err), "GDRCACHE_STATS_INTERVAL", bad[i], NULL))
			fail_msg("GDRCACHE_STATS_INTERVAL=\"%s\" was not refused", bad[i]);
		if (!strstr(err, "GDRCACHE_STATS_INTERVAL") || !strstr(err, "must be"))
			fail_msg("\"%s\": no message naming it: %s", bad[i], err);
	}
	assert_int_equal(child("--one", err, sizeof(err), "GDRCACHE_STATS_INTERVAL", "5",
			       "GDRCACHE_LOG", "warn", NULL),
			 0);
	assert_non_null(strstr(err, "GDRCACHE_STATS_INTERVAL is set, GDRCACHE_STATS is not"));
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

/* Waits (10 s at most) for two periodic records in GDRCACHE_STATS's file. */
static int child_interval(void)
{
	struct gdr_cache *c = busy_cache();
	int64_t deadline = gdr_deadline_ms(10000);
	const char *name = getenv("GDRCACHE_STATS") + 5;
	static char buf[65536];

	while (!gdr_deadline_passed(deadline)) {
		FILE *f = fopen(name, "r");
		size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
		const char *a;

		if (f)
			fclose(f);
		buf[n] = '\0';
		a = strstr(buf, "why\": \"interval\"");
		if (!a)
			a = strstr(buf, "why=interval");
		if (a && (strstr(a + 1, "why\": \"interval\"") || strstr(a + 1, "why=interval")))
			return gdr_cache_destroy(c) ? 5 : 0;
		nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
	}
	return 6;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_caches_told_apart),
		cmocka_unit_test(test_rank_and_host),
		cmocka_unit_test(test_path_host_rank),
		cmocka_unit_test(test_interval_records),
		cmocka_unit_test(test_interval_malformed),
	};
	struct utsname u;
	size_t k = 0;
	int rc;

	setenv("GDRCACHE_BACKEND", "dmabuf", 1);
	if (argc > 1 && !strcmp(argv[1], "--two-caches")) {
		struct gdr_cache *alive = busy_cache(); /* left alive: its record at exit */

		(void)alive;
		return gdr_cache_destroy(busy_cache()) ? 1 : 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--one"))
		return gdr_cache_destroy(busy_cache()) ? 1 : 0;
	if (argc > 1 && !strcmp(argv[1], "--interval"))
		return child_interval();
	if (argc > 1 && !strcmp(argv[1], "--refused")) {
		struct gdr_cache *c = NULL;

		setenv("GDRCACHE_LOG", "warn", 1);
		return gdr_cache_create(NULL, &c) == -EINVAL && !c ? 0 : 1;
	}
	if (uname(&u))
		return 1;
	for (const char *q = u.nodename; *q && k < 64; q++)
		host[k++] = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
					    (*q >= '0' && *q <= '9') || *q == '.' || *q == '-' ||
					    *q == '_'
				    ? *q
				    : '_';
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
