/* SPDX-License-Identifier: MIT */
/*
 * A process's life around the caches: fork() while other threads hold the library's locks (the
 * statistics thread printing on GDRCACHE_STATS_SIGNAL, a thread logging), the child then exiting or
 * destroying its cache; a thread that exits holding registrations; thousands of short-lived threads
 * (records reused, memory bounded); the logger never writing into a descriptor 2 that the program
 * reused for a socket, nor killing it with SIGPIPE when stderr's reader is gone; exit() while
 * threads register and caches come and go; a signal storm; a cache destroyed by the program's
 * destructor after the exit-time records. Cases that need their own environment run this program
 * again (it is read once); every child has an alarm, so a hang is a failure, never a hung suite.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#ifdef __SANITIZE_THREAD__
#define TSAN_BUILD 1
#else
#define TSAN_BUILD 0
#endif

#include "cache/cache.h"
#include "cache/thread.h"
#include "cuda/cuda_abi.h"
#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "rerun_case.h"

/* Runs this program again in mode (rerun.h; stderr a pipe, or with to_file a file the child may
 * read back), killed after 120 s: its exit status; its stderr in err. */
static int child_run(bool to_file, const char *mode, char *err, size_t n, va_list ap)
{
	int status;

	assert_int_equal(gdr_rerun(mode, to_file, 120, err, n, &status, ap), 0);
	return gdr_rerun_exit(mode, err, status);
}

/* child_run with stderr a pipe, the environment pairs NULL-terminated. */
static int child(const char *mode, char *err, size_t n, ...)
{
	va_list ap;
	int rc;

	va_start(ap, n);
	rc = child_run(false, mode, err, n, ap);
	va_end(ap);
	return rc;
}

/* The same with stderr a file the child can read back. */
static int child_file(const char *mode, char *err, size_t n, ...)
{
	va_list ap;
	int rc;

	va_start(ap, n);
	rc = child_run(true, mode, err, n, ap);
	va_end(ap);
	return rc;
}

/* A cache with a miss and two hits, nothing held (dmabuf backend: no PD needed). */
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

/* fork() up to n times while fn runs on another thread; each grandchild (alarm 30 s: a hang is for
 * ever; a few milliseconds of work, 1 s under ThreadSanitizer, whose exit sleeps 1 s, on a loaded
 * machine more) runs in_child and _exit()s with its result, or exit()s when exit_it (atexit
 * handlers included). Returns 1 at the first grandchild that hung (killed by the alarm), 0 if none
 * did; any other failure exits. */
static int forks_during(void *(*fn)(void *), int n, int (*in_child)(void), bool exit_it)
{
	static volatile int stop;
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
	pthread_t t;
	int hung = 0;

	__atomic_store_n(&stop, 0, __ATOMIC_RELEASE);
	if (pthread_create(&t, NULL, fn, (void *)&stop))
		exit(10);
	nanosleep(&(struct timespec){ 0, 20000000 }, NULL);
	for (int i = 0; i < n && !hung; i++) {
		int status;
		pid_t pid = fork();

		if (pid < 0)
			exit(10);
		if (!pid) {
			int rc;

			alarm(alarm_s);
			rc = in_child();
			if (exit_it)
				exit(rc);
			_exit(rc);
		}
		if (waitpid(pid, &status, 0) != pid)
			exit(10);
		if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
			hung = 1;
		else if (!WIFEXITED(status) || WEXITSTATUS(status))
			exit(11);
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	return hung;
}

/* ---- fork() while the statistics thread prints (GDRCACHE_STATS_SIGNAL) ------------------------ */

static struct gdr_cache *sig_cache;

/* Signals the process in a tight loop: the library's statistics thread prints almost all along. */
static void *signaller(void *arg)
{
	volatile int *stop = arg;

	while (!__atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
		kill(getpid(), SIGUSR2);
		sched_yield();
	}
	return NULL;
}

static int child_destroys(void)
{
	struct gdr_region *r;
	uint64_t a = fake_cuda_alloc(1 << 20);

	/* The child uses the cache it inherited, then destroys it. */
	if (gdr_reg(sig_cache, NULL, (void *)(uintptr_t)a, 4096, 0, &r) || gdr_dereg(r))
		return 2;
	return gdr_cache_destroy(sig_cache) ? 3 : 0;
}

static int child_nothing(void)
{
	return 0; /* then exit(): the library's statistics at exit */
}

static int mode_fork_signal(void)
{
	struct sigaction ign = { .sa_handler = SIG_IGN };
	int hung_destroy, hung_exit;

	sigemptyset(&ign.sa_mask);
	sigaction(SIGUSR2, &ign, NULL); /* the library's handler calls it after its own */
	sig_cache = busy_cache();
	hung_destroy = forks_during(signaller, 400, child_destroys, false);
	hung_exit = forks_during(signaller, 400, child_nothing, true);
	fprintf(stderr,
		"forks while the statistics thread prints: a child hung in "
		"gdr_cache_destroy: %s; in exit(): %s\n",
		hung_destroy ? "yes" : "no", hung_exit ? "yes" : "no");
	if (gdr_cache_destroy(sig_cache))
		return 4;
	return hung_destroy || hung_exit ? 5 : 0;
}

/* A child of fork() made while the statistics thread writes records (it holds the list of live
 * caches' lock for that) must still be able to destroy its cache and to exit. */
static void test_fork_during_stats_signal(void **state)
{
	char err[16384];
	int rc;
	(void)state;
	if (TSAN_BUILD)
		skip(); /* forks of a threaded process, hundreds: TSan does not support them */

	rc = child("--fork-signal", err, sizeof(err), "GDRCACHE_BACKEND", "dmabuf",
		   "GDRCACHE_STATS", "file:/dev/null", "GDRCACHE_STATS_SIGNAL", "USR2", NULL);
	if (rc)
		fail_msg("exit %d: %s", rc, err);
}

/* ---- fork() while another thread logs ---------------------------------------------------------- */

/* Logs (an error line, rate-limited after a few: the call site's state is looked up each time). */
static void *logger(void *arg)
{
	volatile int *stop = arg;

	while (!__atomic_load_n(stop, __ATOMIC_ACQUIRE))
		gdr_set_log_level(99);
	return NULL;
}

static int child_logs(void)
{
	/* One line from the child: must not wait for a lock the parent's other thread held. */
	return gdr_set_log_level(99) == -EINVAL ? 0 : 2;
}

static int mode_fork_log(void)
{
	int hung = forks_during(logger, 1000, child_logs, false);

	fprintf(stderr, "forks while another thread logs: a child hung logging: %s\n",
		hung ? "yes" : "no");
	return hung ? 5 : 0;
}

static void test_fork_while_logging(void **state)
{
	char err[65536];
	int rc;
	(void)state;
	if (TSAN_BUILD)
		skip(); /* forks of a threaded process, hundreds: TSan does not support them */

	rc = child("--fork-log", err, sizeof(err), "GDRCACHE_LOG", "error", NULL);
	if (rc)
		fail_msg("exit %d: %s", rc,
			 strstr(err, "forks while") ? strstr(err, "forks while") : err);
}

/* ---- descriptor 2 closed by the program and reused ---------------------------------------------- */

static int mode_fd2_socket(void)
{
	int sv[2], other;
	char buf[4096];
	ssize_t n;
	struct gdr_cache *c = busy_cache(); /* the library is up and has its configuration */

	/* The program closes stderr; its next socket gets descriptor 2. */
	close(2);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv))
		return 10;
	if (sv[0] != 2 && sv[1] != 2)
		return 77;
	other = sv[0] == 2 ? sv[1] : sv[0];
	/* Something the library logs at error (an unknown level, a NULL cache). */
	gdr_set_log_level(99);
	gdr_cache_destroy(NULL);
	if (gdr_cache_destroy(c))
		return 11;
	n = read(other, buf, sizeof(buf) - 1);
	if (n > 0) {
		buf[n] = '\0';
		/* stderr is gone: say it on stdout, which the test reads back through the pipe too. */
		dprintf(1, "the program's socket received %zd bytes from the library: %s", n, buf);
		return 5;
	}
	return 0;
}

/* A program that closed stderr and then opened a socket (which took descriptor 2) must not find the
 * library's log lines in its socket's byte stream. */
static void test_fd2_reused_by_socket(void **state)
{
	char err[8192];
	int rc;
	(void)state;

	rc = child("--fd2-socket", err, sizeof(err), "GDRCACHE_BACKEND", "dmabuf", "GDRCACHE_LOG",
		   "error", NULL);
	if (rc)
		fail_msg("exit %d", rc);
}

/* ---- threads ----------------------------------------------------------------------------------- */

static struct gdr_cache *tc;
static uint64_t tbuf;
static struct gdr_region *left_held;

static void *register_and_exit_holding(void *arg)
{
	(void)arg;
	if (gdr_reg(tc, NULL, (void *)(uintptr_t)tbuf, 4096, 0, &left_held))
		left_held = NULL;
	pthread_exit(NULL);
}

/* A thread that exits holding a registration: the hold stays counted (destroy refuses), and another
 * thread may release it (then destroy succeeds); threads after it reuse its record. */
static void test_thread_exits_holding(void **state)
{
	pthread_t t;
	struct gdr_region *r;
	(void)state;

	setenv("GDRCACHE_BACKEND", "dmabuf", 1);
	assert_int_equal(gdr_cache_create(NULL, &tc), 0);
	tbuf = fake_cuda_alloc(1 << 20);
	assert_int_equal(pthread_create(&t, NULL, register_and_exit_holding, NULL), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_non_null(left_held);
	assert_int_equal(gdr_cache_destroy(tc), -EBUSY); /* still held */
	/* Another thread (this one) registers the same buffer (a hit) and releases twice: its own
	 * hold and the dead thread's. */
	assert_int_equal(gdr_reg(tc, NULL, (void *)(uintptr_t)tbuf, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(tc), -EBUSY); /* the dead thread's hold still counts */
	assert_int_equal(gdr_dereg(left_held), 0);
	assert_int_equal(gdr_cache_destroy(tc), 0);
	fake_cuda_free(tbuf);
}

static void *register_once(void *arg)
{
	struct gdr_region *r;

	(void)arg;
	if (gdr_reg(tc, NULL, (void *)(uintptr_t)tbuf, 4096, 0, &r) || gdr_dereg(r))
		return (void *)1;
	return NULL;
}

static unsigned thread_records(struct gdr_cache *c)
{
	unsigned n = 0;

	for (struct gdr_thr *t = c->threads; t; t = t->next)
		n++;
	return n;
}

/* 4000 short-lived threads, 4 at a time, each registering once: records are reused, at most one
 * per thread alive at once (plus this one's). */
static void test_many_short_threads(void **state)
{
	struct gdr_region *r;
	(void)state;

	setenv("GDRCACHE_BACKEND", "dmabuf", 1);
	assert_int_equal(gdr_cache_create(NULL, &tc), 0);
	tbuf = fake_cuda_alloc(1 << 20);
	assert_int_equal(gdr_reg(tc, NULL, (void *)(uintptr_t)tbuf, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	for (int i = 0; i < 1000; i++) {
		pthread_t t[4];
		void *ret;

		for (int j = 0; j < 4; j++)
			assert_int_equal(pthread_create(&t[j], NULL, register_once, NULL), 0);
		for (int j = 0; j < 4; j++) {
			assert_int_equal(pthread_join(t[j], &ret), 0);
			assert_null(ret);
		}
	}
	assert_in_range(thread_records(tc), 1, 5);
	assert_int_equal(gdr_cache_destroy(tc), 0);
	fake_cuda_free(tbuf);
}

/* ---- exit() while other threads register; statistics signal storm over creates and destroys ----- */

static struct gdr_cache *busy_c;
static volatile int busy_stop;

/* Registers and releases in a loop on busy_c, a buffer of its own; now and then a miss. */
/* The fake's exported entry (the library patched it: its hook runs first). */
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);

static void *busy_worker(void *arg)
{
	uint64_t a = fake_cuda_alloc(1 << 20);

	(void)arg;
	for (unsigned i = 0; !__atomic_load_n(&busy_stop, __ATOMIC_ACQUIRE); i++) {
		struct gdr_region *r;

		if (!gdr_reg(busy_c, NULL, (void *)(uintptr_t)(a + (i % 16) * 65536), 4096, 0, &r))
			gdr_dereg(r);
		if (i % 64 == 63) { /* a new buffer at the same address: a stale entry, a miss */
			cuMemFree_v2(a); /* the driver's entry, whose free the library hears of */
			a = fake_cuda_alloc(1 << 20);
		}
	}
	return NULL;
}

/* Creates and destroys caches in a loop (each one registers once). */
static void *churner(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&busy_stop, __ATOMIC_ACQUIRE))
		if (gdr_cache_destroy(busy_cache()))
			exit(20);
	return NULL;
}

static int mode_exit_busy(void)
{
	pthread_t t[4];

	busy_c = busy_cache();
	for (int i = 0; i < 3; i++)
		if (pthread_create(&t[i], NULL, busy_worker, NULL))
			return 10;
	if (pthread_create(&t[3], NULL, churner, NULL))
		return 10;
	nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
	exit(0); /* the others still run: the statistics at exit must neither crash nor hang */
}

/* exit() while three threads register and one creates and destroys caches: exit status 0, the
 * statistics at exit written. */
static void test_exit_while_registering(void **state)
{
	static char err[1 << 20];
	int rc;
	(void)state;

	for (int i = 0; i < 5; i++) {
		rc = child("--exit-busy", err, sizeof(err), "GDRCACHE_BACKEND", "dmabuf",
			   "GDRCACHE_STATS", "1", "GDRCACHE_STATS_FORMAT", "text", NULL);
		if (rc)
			fail_msg("exit %d: %.2000s", rc, err);
		assert_non_null(strstr(err, " stats (at exit, backend "));
	}
}

static char storm_file[256];

static int mode_signal_storm(void)
{
	pthread_t t[4], s;
	static volatile int stop;
	struct sigaction ign = { .sa_handler = SIG_IGN };

	sigemptyset(&ign.sa_mask);
	sigaction(SIGUSR2, &ign, NULL);
	busy_c = busy_cache(); /* installs the handler */
	if (pthread_create(&s, NULL, signaller, (void *)&stop))
		return 10;
	for (int i = 0; i < 2; i++)
		if (pthread_create(&t[i], NULL, busy_worker, NULL))
			return 10;
	for (int i = 0; i < 300; i++) /* and this thread creates and destroys */
		if (gdr_cache_destroy(busy_cache()))
			return 11;
	__atomic_store_n(&busy_stop, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	pthread_join(s, NULL);
	return gdr_cache_destroy(busy_c) ? 12 : 0;
}

/* GDRCACHE_STATS_SIGNAL sent in a tight loop while threads register and caches come and go: no
 * crash, no hang, and the file holds whole JSON records, one a line. */
static void test_signal_storm(void **state)
{
	static char dir[] = "/tmp/gdr_plife_XXXXXX", err[65536];
	char line[8192];
	unsigned lines = 0, signal_lines = 0;
	FILE *f;
	int rc;
	(void)state;

	assert_non_null(mkdtemp(dir));
	snprintf(storm_file, sizeof(storm_file), "file:%s/storm", dir);
	rc = child("--signal-storm", err, sizeof(err), "GDRCACHE_BACKEND", "dmabuf",
		   "GDRCACHE_STATS", storm_file, "GDRCACHE_STATS_FORMAT", "json",
		   "GDRCACHE_STATS_SIGNAL", "USR2", NULL);
	if (rc)
		fail_msg("exit %d: %s", rc, err);
	f = fopen(storm_file + 5, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		size_t n = strlen(line);

		lines++;
		if (n < 3 || line[0] != '{' || line[n - 1] != '\n' || line[n - 2] != '}' ||
		    strncmp(line, "{\"source\": \"cache\", \"why\": \"", 28))
			fail_msg("record %u malformed: %s", lines, line);
		signal_lines += !!strstr(line, "\"why\": \"signal\"");
	}
	fclose(f);
	unlink(storm_file + 5);
	rmdir(dir);
	assert_true(lines >= 301); /* a destroy record each, and the signal's */
	assert_true(signal_lines > 0);
}

/* ---- fork() while other threads hit and miss: the child uses, destroys, exits, execs ------------ */

static int child_uses_busy(void)
{
	int rc;

	/* No CUDA call in the child (the driver is not usable after fork(), and the fake's lock may
	 * be held by a thread the child does not have): the cache's own state only. Threads of the
	 * parent caught between a registration and its release leave holds. */
	rc = gdr_cache_destroy(busy_c);
	return rc == 0 || rc == -EBUSY ? 0 : 3;
}

static int child_execs(void)
{
	execl("/bin/true", "true", (char *)NULL);
	return 0; /* no /bin/true: nothing to prove */
}

static void *busy_workers(void *arg)
{
	volatile int *stop = arg;
	pthread_t t[3];

	__atomic_store_n(&busy_stop, 0, __ATOMIC_RELEASE);
	for (int i = 0; i < 3; i++)
		if (pthread_create(&t[i], NULL, busy_worker, NULL))
			exit(10);
	while (!__atomic_load_n(stop, __ATOMIC_ACQUIRE))
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	__atomic_store_n(&busy_stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	return NULL;
}

static void test_fork_while_registering(void **state)
{
	(void)state;
	/* TSan's runtime (GCC 12's) does not lock its own allocator around fork(): a child forked
	 * while a worker frees hangs in free() on the lock that worker held (seen: gdr_cache_destroy
	 * -> gdr_thr_cache_fini -> free -> DenseSlabAlloc::Drain, 3 children in 9 loaded runs). The
	 * plain, ASan and qemu builds run it. */
	if (TSAN_BUILD)
		skip();

	setenv("GDRCACHE_BACKEND", "dmabuf", 1);
	assert_int_equal(gdr_cache_create(NULL, &busy_c), 0);
	assert_int_equal(forks_during(busy_workers, 100, child_uses_busy, true), 0);
	assert_int_equal(forks_during(busy_workers, 20, child_execs, false), 0);
	assert_int_equal(gdr_cache_destroy(busy_c), 0);
}

/* ---- a cache destroyed by the program's destructor, after the library's exit-time records -------- */

static struct gdr_cache *dtor_cache;
static struct gdr_region *dtor_held;

__attribute__((destructor)) static void program_dtor(void)
{
	if (!dtor_cache)
		return;
	if (gdr_dereg(dtor_held) || gdr_cache_destroy(dtor_cache))
		_exit(30);
	if (write(2, "destroyed in the destructor\n", 28) != 28)
		_exit(31);
}

static int mode_dtor_destroy(void)
{
	uint64_t a = fake_cuda_alloc(1 << 20);

	dtor_cache = busy_cache();
	/* Held over exit: the exit-time record counts it; the destructor releases it. */
	if (gdr_reg(dtor_cache, NULL, (void *)(uintptr_t)a, 4096, 0, &dtor_held))
		return 2;
	exit(0);
}

static void test_destroy_after_exit_records(void **state)
{
	char err[16384];
	const char *at_exit, *destroy;
	int rc;
	(void)state;

	rc = child("--dtor-destroy", err, sizeof(err), "GDRCACHE_BACKEND", "dmabuf",
		   "GDRCACHE_STATS", "1", "GDRCACHE_STATS_FORMAT", "kv", NULL);
	if (rc)
		fail_msg("exit %d: %s", rc, err);
	at_exit = strstr(err, "why=\"at exit\"");
	destroy = strstr(err, "why=destroy");
	assert_non_null(at_exit);
	assert_non_null(destroy);
	assert_true(at_exit < destroy);
	assert_non_null(strstr(destroy, "destroyed in the destructor\n"));
}

/* ---- stderr a pipe nobody reads any more --------------------------------------------------------- */

static int mode_epipe(void)
{
	int p[2];
	struct gdr_cache *c = busy_cache();

	signal(SIGPIPE, SIG_DFL); /* as a program has it */
	if (pipe(p))
		return 10;
	close(p[0]); /* the reader went away (`prog 2>&1 | head`, a log collector that died) */
	dup2(p[1], 2);
	close(p[1]);
	gdr_set_log_level(99); /* an error line */
	gdr_cache_destroy(NULL);
	return gdr_cache_destroy(c) ? 11 : 0;
}

/* The library's diagnostics must not kill the program with SIGPIPE when its stderr is a pipe whose
 * reader is gone: the line is lost, the program goes on. */
static void test_stderr_broken_pipe(void **state)
{
	char err[4096];
	int rc;
	(void)state;

	rc = child("--epipe", err, sizeof(err), "GDRCACHE_BACKEND", "dmabuf", "GDRCACHE_LOG",
		   "error", NULL);
	if (rc)
		fail_msg("exit %d", rc);
}

/* ---- The library's own threads and the program's environment -------------------------------- */

/* The statistics thread prints on the signal, and another thread logs, while the program's
 * environ points at memory that faults on any read: what a program that rebuilds its environment
 * meanwhile (bash before each command; setenv reallocating the array) exposes. The old code read
 * it there: gmtime_r's first call reads TZ, strerror reads LANGUAGE (bash under the preload died
 * of SIGSEGV in the statistics thread's getenv("TZ")). */
static void *log_one_line(void *arg)
{
	(void)arg;
	gdr_set_log_level(99); /* an error line: refused */
	return NULL;
}

/* Whether stderr (a file, child_file) holds needle yet. */
static bool stderr_has(const char *needle)
{
	static char text[65536];
	ssize_t n = pread(2, text, sizeof(text) - 1, 0);

	if (n < 0)
		return false;
	text[n] = '\0';
	return strstr(text, needle) != NULL;
}

static int mode_env_poisoned(void)
{
	extern char **environ;
	struct gdr_cache *c = busy_cache();
	char **saved = environ;
	void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pthread_t t;
	int waited = 0;

	if (page == MAP_FAILED)
		return 10;
	environ = page;
	raise(SIGUSR2);
	while (!stderr_has("\"why\": \"signal\"") && waited++ < 6000) /* 60 s */
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
	if (pthread_create(&t, NULL, log_one_line, NULL) || pthread_join(t, NULL))
		return 11;
	environ = saved;
	if (waited > 6000)
		return 12;
	return gdr_cache_destroy(c) ? 13 : 0;
}

static void test_library_threads_read_no_environment(void **state)
{
	static char err[65536];
	int rc;
	(void)state;

	/* The statistics file cannot be opened (its directory does not exist): the thread says why
	 * (errno's text) and writes the record to stderr. */
	rc = child_file("--env-poisoned", err, sizeof(err), "GDRCACHE_BACKEND", "dmabuf",
			"GDRCACHE_STATS", "file:/nonexistent-gdr-dir/stats",
			"GDRCACHE_STATS_SIGNAL", "USR2", "GDRCACHE_LOG", "warn", NULL);
	if (rc)
		fail_msg("exit %d: %s", rc, err);
	assert_non_null(strstr(err, "cannot be opened (No such file or directory)"));
	assert_non_null(strstr(err, "\"why\": \"signal\""));
	assert_non_null(strstr(err, "unknown log level 99"));
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fork_during_stats_signal),
		cmocka_unit_test(test_fork_while_logging),
		cmocka_unit_test(test_fd2_reused_by_socket),
		cmocka_unit_test(test_thread_exits_holding),
		cmocka_unit_test(test_many_short_threads),
		cmocka_unit_test(test_exit_while_registering),
		cmocka_unit_test(test_signal_storm),
		cmocka_unit_test(test_fork_while_registering),
		cmocka_unit_test(test_destroy_after_exit_records),
		cmocka_unit_test(test_stderr_broken_pipe),
		cmocka_unit_test(test_library_threads_read_no_environment),
	};

	if (argc > 1 && !strcmp(argv[1], "--fork-signal"))
		return mode_fork_signal();
	if (argc > 1 && !strcmp(argv[1], "--fork-log"))
		return mode_fork_log();
	if (argc > 1 && !strcmp(argv[1], "--fd2-socket"))
		return mode_fd2_socket();
	if (argc > 1 && !strcmp(argv[1], "--epipe"))
		return mode_epipe();
	if (argc > 1 && !strcmp(argv[1], "--dtor-destroy"))
		return mode_dtor_destroy();
	if (argc > 1 && !strcmp(argv[1], "--exit-busy"))
		return mode_exit_busy();
	if (argc > 1 && !strcmp(argv[1], "--env-poisoned"))
		return mode_env_poisoned();
	if (argc > 1 && !strcmp(argv[1], "--signal-storm"))
		return mode_signal_storm();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
