/* SPDX-License-Identifier: MIT */
/*
 * The library's code where the program does not expect it to run, and what it must not do there:
 *  - pthread_cancel: a thread cancelled inside gdr_reg (a log line's write under the cache's lock),
 *    inside a cuMemFree whose hook releases pins (a dma-buf's close under the caches' locks), in a
 *    log file's open (a FIFO with no reader yet), or in the first cache's creation (the driver's
 *    entries being patched) must leave no lock held: every other thread would wait for ever;
 *  - the statistics signal's handler: installed over the program's own, it keeps that handler's
 *    flags (without SA_RESTART, a blocking read the signal interrupts returns EINTR);
 *  - errno: an intercepted cuMemFree whose hook's release fails (the dma-buf's fd closed by the
 *    program) leaves the program's errno as it was;
 *  - the statistics pipe's descriptors closed by the program and their numbers reused: the signal
 *    writes nothing into the program's files, the library's thread ends; with only the read end's
 *    number reused, the signal raises no SIGPIPE;
 *  - exit() from a signal handler (a program's SIGINT handler) that interrupted a registration
 *    holding the cache's lock (while the signal's thread prints, too) or a fork (its handlers
 *    hold every cache's lock): the statistics at exit must not wait for those locks.
 * Each case runs this program again in a mode of its own (its own environment; the library reads it
 * once) under an alarm, so that a hang is a failure, never a hung suite.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda/cuda_abi.h"
#include "intercept/events.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "rerun_case.h"

#define MiB (1024ULL * 1024)

/* The fake's exported entry (the library patched it: its hook runs first). */
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);

/* Runs this program again in mode with the environment pairs (NULL-terminated; rerun.h); its stderr
 * in err. The test fails unless it exits 0 (a child killed by its alarm, 30 s, hung); 77 skips. */
static void child(const char *mode, char *err, size_t n, ...)
{
	va_list ap;
	int status, rc;

	va_start(ap, n);
	rc = gdr_rerun(mode, false, 30, err, n, &status, ap);
	va_end(ap);
	assert_int_equal(rc, 0);
	rc = gdr_rerun_exit(mode, err, status);
	if (rc)
		fail_msg("exit %d: %s", rc, err);
}

static void sleep_ms(long ms)
{
	nanosleep(&(struct timespec){ ms / 1000, ms % 1000 * 1000000 }, NULL);
}

static struct gdr_cache *dmabuf_cache(void)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE,
				    .backend = GDR_BACKEND_DMABUF,
				    .validate = GDR_VALIDATE_EVENTS };
	struct gdr_cache *c = NULL;

	if (gdr_cache_create(&a, &c))
		exit(1);
	return c;
}

/* A registration and its release on c, of a new buffer: the cache must still be usable. */
static int cache_usable(struct gdr_cache *c)
{
	struct gdr_region *r;
	uint64_t b = fake_cuda_alloc(MiB);

	if (gdr_reg(c, NULL, (void *)(uintptr_t)b, 4096, 0, &r) || gdr_dereg(r))
		return 1;
	return 0;
}

/* Joins t, which must have been cancelled (not returned). */
static int join_cancelled(pthread_t t)
{
	void *ret = NULL;

	if (pthread_join(t, &ret))
		return 1;
	return ret == PTHREAD_CANCELED ? 0 : 1;
}

/* ---- pthread_cancel inside gdr_reg: its error line is written under the cache's lock ------------ */

static struct gdr_cache *cc;

static void *reg_cancelled(void *arg)
{
	struct gdr_region *r;
	static char host[4096];

	(void)arg;
	pthread_cancel(pthread_self()); /* pending: acts at the next cancellation point */
	/* Host memory without a PD: refused, and said at error level (a write), under the lock. */
	if (gdr_reg(cc, NULL, host, sizeof(host), 0, &r) != -EINVAL)
		return NULL;
	pthread_testcancel();
	return NULL;
}

static int mode_cancel_reg(void)
{
	pthread_t t;

	cc = dmabuf_cache();
	if (cache_usable(cc))
		return 2;
	if (pthread_create(&t, NULL, reg_cancelled, NULL) || join_cancelled(t))
		return 3;
	if (cache_usable(cc)) /* the lock: held for ever by the cancelled thread on the old code */
		return 4;
	return gdr_cache_destroy(cc) ? 5 : 0;
}

static void test_cancel_inside_reg(void **state)
{
	char err[8192];
	(void)state;

	child("--cancel-reg", err, sizeof(err), "GDRCACHE_LOG", "error", NULL);
}

/* ---- pthread_cancel inside cuMemFree: its hook closes the freed buffer's dma-buf ---------------- */

static uint64_t freed;

static void *free_cancelled(void *arg)
{
	(void)arg;
	pthread_cancel(pthread_self());
	/* The hook releases the unreferenced pin of the buffer: close(2) of its dma-buf, with the
	 * list of caches and the cache locked. */
	if (cuMemFree_v2(freed) != GDR_CUDA_SUCCESS)
		return NULL;
	pthread_testcancel();
	return NULL;
}

static int mode_cancel_free(void)
{
	struct gdr_region *r;
	pthread_t t;

	cc = dmabuf_cache();
	freed = fake_cuda_alloc(MiB);
	if (gdr_reg(cc, NULL, (void *)(uintptr_t)freed, 4096, 0, &r) || gdr_dereg(r))
		return 2;
	if (fake_cuda_open_dmabufs() != 1)
		return 77; /* no dma-buf to close: nothing to prove */
	if (pthread_create(&t, NULL, free_cancelled, NULL) || join_cancelled(t))
		return 3;
	if (fake_cuda_open_dmabufs() != 0)
		return 4; /* the free released the pin before it returned */
	if (cache_usable(cc))
		return 5;
	return gdr_cache_destroy(cc) ? 6 : 0;
}

static void test_cancel_inside_free_hook(void **state)
{
	char err[8192];
	(void)state;

	child("--cancel-free", err, sizeof(err), "GDRCACHE_LOG", "error", NULL);
}

/* ---- errno across an intercepted cuMemFree whose hook's release fails ----------------------------- */

/* The program closed the cached dma-buf's fd by mistake (closing every fd of a range, say): the
 * hook's release then fails its close(2) with EBADF, and the program's errno must not show it. */
static int mode_errno_free(void)
{
	struct gdr_region *r;
	uint64_t b, off;
	int fd;

	cc = dmabuf_cache();
	b = fake_cuda_alloc(MiB);
	if (gdr_reg(cc, NULL, (void *)(uintptr_t)b, 4096, 0, &r))
		return 2;
	if (gdr_region_dmabuf(r, &fd, &off))
		return 77; /* no dma-buf: nothing to prove */
	if (gdr_dereg(r) || close(fd))
		return 3;
	errno = 4242;
	if (cuMemFree_v2(b) != GDR_CUDA_SUCCESS)
		return 4;
	if (errno != 4242) {
		fprintf(stderr, "errno %d (%s) after cuMemFree\n", errno, strerrorname_np(errno));
		return 5;
	}
	return gdr_cache_destroy(cc) ? 6 : 0;
}

static void test_errno_kept_by_free_hook(void **state)
{
	char err[8192];
	(void)state;

	child("--errno-free", err, sizeof(err), "GDRCACHE_LOG", "none", NULL);
}

/* ---- pthread_cancel in the log file's open (a FIFO: open blocks until a reader comes) ----------- */

static void *log_line(void *arg)
{
	(void)arg;
	gdr_set_log_level(99); /* the process's first line: the log file is opened */
	pthread_testcancel();
	return NULL;
}

static int mode_cancel_log_open(void)
{
	const char *fifo = getenv("GDRCACHE_LOG_FILE");
	int rd;
	pthread_t t;

	if (!fifo || mkfifo(fifo, 0600))
		return 77;
	gdr_set_log_level(GDR_LOG_ERROR); /* the configuration read, nothing logged yet */
	if (pthread_create(&t, NULL, log_line, NULL))
		return 2;
	sleep_ms(200); /* it waits in open(2) for a reader */
	pthread_cancel(t);
	sleep_ms(100); /* the old code: it is gone now, the log's lock held */
	rd = open(fifo, O_RDONLY | O_NONBLOCK);
	if (rd < 0 || join_cancelled(t))
		return 3;
	gdr_set_log_level(99); /* another line: must not wait for the cancelled thread's lock */
	close(rd);
	unlink(fifo);
	return 0;
}

static void test_cancel_in_log_open(void **state)
{
	static char dir[] = "/tmp/gdr_ctx_XXXXXX";
	char err[8192], fifo[256];
	(void)state;

	assert_non_null(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/log", dir);
	child("--cancel-log-open", err, sizeof(err), "GDRCACHE_LOG", "error", "GDRCACHE_LOG_FILE",
	      fifo, NULL);
	unlink(fifo);
	rmdir(dir);
}

/* ---- pthread_cancel in the process's first cache creation (the driver is loaded and patched) ---- */

static void *create_cancelled(void *arg)
{
	struct gdr_cache *c = NULL;

	(void)arg;
	pthread_cancel(pthread_self());
	if (!gdr_cache_create(NULL, &c))
		gdr_cache_destroy(c);
	pthread_testcancel();
	return NULL;
}

static int mode_cancel_create(void)
{
	pthread_t t;

	if (pthread_create(&t, NULL, create_cancelled, NULL) || join_cancelled(t))
		return 2;
	cc = dmabuf_cache();
	if (cache_usable(cc))
		return 3;
	return gdr_cache_destroy(cc) ? 4 : 0;
}

static void test_cancel_in_first_create(void **state)
{
	char err[8192];
	(void)state;

	child("--cancel-create", err, sizeof(err), "GDRCACHE_LOG", "error", NULL);
}

/* ---- pthread_cancel in a cache's creation and destruction (their info line, their statistics) --- */

static struct gdr_cache *made;
static int destroyed = 1;

static void *create_then_destroy_cancelled(void *arg)
{
	(void)arg;
	pthread_cancel(pthread_self());
	/* Made and returned whole, though its info line is a write; then destroyed whole, though
	 * its statistics are one. */
	if (gdr_cache_create(NULL, &made))
		return NULL;
	destroyed = gdr_cache_destroy(made);
	pthread_testcancel();
	return NULL;
}

static int mode_cancel_create_destroy(void)
{
	pthread_t t;

	if (pthread_create(&t, NULL, create_then_destroy_cancelled, NULL) || join_cancelled(t))
		return 2;
	if (!made) {
		fprintf(stderr, "the thread was cancelled inside gdr_cache_create\n");
		return 3;
	}
	if (destroyed) {
		fprintf(stderr, "the thread was cancelled inside gdr_cache_destroy (%d)\n",
			destroyed);
		return 4;
	}
	cc = dmabuf_cache(); /* and the library still serves */
	if (cache_usable(cc))
		return 5;
	return gdr_cache_destroy(cc) ? 6 : 0;
}

static void test_cancel_in_create_and_destroy(void **state)
{
	char err[16384];
	(void)state;

	child("--cancel-create-destroy", err, sizeof(err), "GDRCACHE_LOG", "info", "GDRCACHE_STATS",
	      "1", NULL);
}

/* ---- the statistics signal over the program's handler: its flags kept -------------------------- */

static volatile sig_atomic_t handled;
static int rd_eintr; /* 1: the blocked read returned EINTR; 2: something else */

static void on_usr2(int sig)
{
	(void)sig;
	handled = 1;
}

static void *blocked_reader(void *arg)
{
	int fd = *(int *)arg;
	char b;
	ssize_t n = read(fd, &b, 1); /* nobody writes: only a signal ends it */

	__atomic_store_n(&rd_eintr, n < 0 && errno == EINTR ? 1 : 2, __ATOMIC_RELEASE);
	return NULL;
}

static int mode_sig_restart(void)
{
	struct sigaction sa = { .sa_handler = on_usr2 }; /* no SA_RESTART: EINTR wanted */
	struct gdr_cache *c;
	int p[2], got = 0;
	pthread_t t;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL);
	c = dmabuf_cache(); /* installs the library's handler (GDRCACHE_STATS_SIGNAL) over it */
	if (pipe(p) || pthread_create(&t, NULL, blocked_reader, &p[0]))
		return 2;
	for (int i = 0; i < 200 && !(got = __atomic_load_n(&rd_eintr, __ATOMIC_ACQUIRE)); i++) {
		sleep_ms(50);
		pthread_kill(t, SIGUSR2);
	}
	if (!got) {
		fprintf(stderr, "the read was restarted after the signal (handler ran: %d)\n",
			(int)handled);
		return 3; /* the reader stays blocked: exit() ends it */
	}
	pthread_join(t, NULL);
	if (got != 1 || !handled)
		return 4;
	return gdr_cache_destroy(c) ? 5 : 0;
}

static void test_signal_keeps_program_flags(void **state)
{
	char err[8192];
	(void)state;

	child("--sig-restart", err, sizeof(err), "GDRCACHE_STATS", "file:/dev/null",
	      "GDRCACHE_STATS_SIGNAL", "USR2", NULL);
}

/* ---- the statistics pipe closed by the program, its numbers reused ------------------------------ */

/* The library's statistics pipe: the one pipe of which this process has both ends, at 3 or above
 * (the test's stderr is a pipe's write end; other pipes are single ends). The read end in fds[0],
 * the write end in fds[1]. */
static int find_stats_pipe(int fds[2])
{
	char link[64], path[64], line[128];
	struct {
		int fd, wr;
		char link[64];
	} ends[64];
	int n = 0, pairs = 0;

	for (int fd = 3; fd < 1024 && n < 64; fd++) {
		ssize_t len;
		FILE *f;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		len = readlink(path, link, sizeof(link) - 1);
		if (len <= 0)
			continue;
		link[len] = '\0';
		if (strncmp(link, "pipe:", 5))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
		f = fopen(path, "r");
		while (f && fgets(line, sizeof(line), f)) {
			unsigned long flags;

			if (sscanf(line, "flags: %lo", &flags) == 1) {
				ends[n].fd = fd;
				ends[n].wr = (flags & O_ACCMODE) == O_WRONLY;
				snprintf(ends[n].link, sizeof(ends[n].link), "%s", link);
				n++;
			}
		}
		if (f)
			fclose(f);
	}
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			if (!ends[i].wr && ends[j].wr && !strcmp(ends[i].link, ends[j].link)) {
				fds[0] = ends[i].fd;
				fds[1] = ends[j].fd;
				pairs++;
			}
	return pairs == 1 ? 0 : -1;
}

static int threads_now(void)
{
	int n = 0;
	FILE *f = fopen("/proc/self/status", "r");
	char line[128];

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &n) == 1)
			break;
	if (f)
		fclose(f);
	return n;
}

/* Whether the statistics thread ended (the process's threads fell below before), waiting up to ms. */
static bool thread_ended(int before, int ms)
{
	for (int waited = 0; threads_now() >= before && waited < ms; waited += 10)
		sleep_ms(10);
	return threads_now() < before;
}

/* Whether the signal wrote into the program's file fd (said on stderr). */
static bool wrote_into(int fd)
{
	struct stat st = { 0 };

	if (!fstat(fd, &st) && !st.st_size)
		return false;
	fprintf(stderr, "the signal wrote %lld bytes into the program's file\n",
		(long long)st.st_size);
	return true;
}

/* A pipe case's run: mode again with the statistics to /dev/null on SIGUSR2 and warnings on; its
 * stderr in err. Skipped under TSan: the program's close of the library's fd, or its dup2 onto it,
 * is the case, and TSan reports it, rightly. */
static void pipe_case(const char *mode, char *err, size_t n)
{
#ifdef __SANITIZE_THREAD__
	skip();
#endif
	child(mode, err, n, "GDRCACHE_STATS", "file:/dev/null", "GDRCACHE_STATS_SIGNAL", "USR2",
	      "GDRCACHE_LOG", "warn", NULL);
}

/* A program that closes every descriptor from 3 up (a daemon, a job launcher) and opens its own
 * files, which take the pipe's numbers: the signal must not write into the program's file, and the
 * library's thread must end, not spin reading the program's file. */
static int mode_pipe_reused(void)
{
	char name[] = "/tmp/gdr_ctx_pipe_XXXXXX";
	struct gdr_cache *c = dmabuf_cache(); /* the handler and its thread */
	int fds[2], f1, f2, before = threads_now();

	if (find_stats_pipe(fds))
		return 77;
	close(fds[0]);
	close(fds[1]);
	f1 = mkstemp(name); /* the lowest numbers: the pipe's */
	f2 = open(name, O_RDWR);
	unlink(name);
	if (f1 < 0 || f2 < 0)
		return 2;
	if (!((f1 == fds[0] && f2 == fds[1]) || (f1 == fds[1] && f2 == fds[0])))
		return 77; /* other numbers were free first: nothing to prove */
	for (int i = 0; i < 3; i++)
		raise(SIGUSR2); /* the handler runs on this thread, now */
	if (wrote_into(f1))
		return 3;
	if (!thread_ended(before, 10000)) {
		fprintf(stderr, "the statistics thread is still there (%d threads)\n",
			threads_now());
		return 4;
	}
	return gdr_cache_destroy(c) ? 5 : 0;
}

static void test_stats_pipe_closed_by_program(void **state)
{
	char err[8192];
	(void)state;

	pipe_case("--pipe-reused", err, sizeof(err));
	assert_non_null(strstr(err, "the program closed or replaced the library's pipe"));
}

/* Only the pipe's read end replaced (a shell's exec 3>file under the preload: dup2 onto the read
 * end's number): the library's thread ends, and the pipe then has no reader. The write end is still
 * the library's, and a signal must not write there: a write to a pipe without a reader raises
 * SIGPIPE, whose default kills the program. */
static int mode_pipe_read_replaced(void)
{
	char name[] = "/tmp/gdr_ctx_rpipe_XXXXXX";
	struct gdr_cache *c = dmabuf_cache(); /* the handler and its thread */
	int fds[2], f, before = threads_now();

	if (find_stats_pipe(fds))
		return 77;
	f = mkstemp(name);
	unlink(name);
	if (f < 0 || dup2(f, fds[0]) != fds[0])
		return 2;
	close(f);
	raise(SIGUSR2); /* wakes the thread, which finds its read end gone and ends */
	(void)thread_ended(before, 2000);
	for (int i = 0; i < 3; i++)
		raise(SIGUSR2); /* no reader: SIGPIPE, unless nothing is written */
	sleep_ms(50);
	if (wrote_into(fds[0]))
		return 3;
	return gdr_cache_destroy(c) ? 4 : 0;
}

static void test_stats_pipe_read_end_replaced(void **state)
{
	char err[8192];
	(void)state;

	pipe_case("--pipe-read-replaced", err, sizeof(err));
}

/* ---- exit() from a signal handler that interrupted a locked registration ------------------------ */

static void on_int_exit(int sig)
{
	(void)sig;
	exit(0); /* what many programs' SIGINT handlers do */
}

/* exit() on SIGINT, as many programs' handlers do (on_int_exit). */
static void exit_on_sigint(void)
{
	struct sigaction sa = { .sa_handler = on_int_exit };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
}

/* A miss whose driver call runs hook (under the cache's lock): it exits inside. */
static int exit_inside_miss(void (*hook)(const char *entry, void *arg))
{
	struct gdr_region *r;
	uint64_t b = fake_cuda_alloc(MiB);

	cc = dmabuf_cache();
	exit_on_sigint();
	fake_cuda_set_enter_hook(hook, NULL);
	gdr_reg(cc, NULL, (void *)(uintptr_t)b, 4096, 0, &r);
	return 2;
}

/* Runs mode with the statistics at exit (kv), and on signal too when given; its stderr in err.
 * exit() from a signal handler is what these cases are about: not a finding of TSan's. */
static void run_exit_case(const char *mode, const char *signal, char *err, size_t n)
{
	char tsan[1024];

	snprintf(tsan, sizeof(tsan), "%s report_signal_unsafe=0",
		 getenv("TSAN_OPTIONS") ? getenv("TSAN_OPTIONS") : "");
	child(mode, err, n, "GDRCACHE_STATS", "1", "GDRCACHE_STATS_FORMAT", "kv", "TSAN_OPTIONS",
	      tsan, signal ? "GDRCACHE_STATS_SIGNAL" : NULL, signal, NULL);
}

/* Inside the driver during a miss: under the cache's lock. */
static void raise_in_driver(const char *entry, void *arg)
{
	(void)arg;
	if (!strcmp(entry, "cuPointerGetAttributes"))
		raise(SIGINT);
}

static int mode_exit_in_handler(void)
{
	return exit_inside_miss(raise_in_driver);
}

static void test_exit_from_handler_inside_reg(void **state)
{
	char err[16384];
	(void)state;

	run_exit_case("--exit-in-handler", NULL, err, sizeof(err));
	assert_non_null(strstr(err, "why=\"at exit\""));
}

/* The same exit() while the statistics signal's thread prints: it holds the list of caches' lock and
 * waits for the cache lock the interrupted registration holds. The statistics at exit must not wait
 * for the list then (kill -USR2 before a job is killed: the advice of docs/configuration.md). */
static void signal_then_exit_in_driver(const char *entry, void *arg)
{
	(void)arg;
	if (strcmp(entry, "cuPointerGetAttributes"))
		return;
	raise(SIGUSR2); /* the thread wakes, takes the list's lock, waits for this cache's */
	sleep_ms(500);
	raise(SIGINT);
}

static int mode_exit_while_signal_prints(void)
{
	return exit_inside_miss(signal_then_exit_in_driver);
}

static void test_exit_from_handler_while_signal_prints(void **state)
{
	char err[16384];
	(void)state;

	run_exit_case("--exit-while-signal-prints", "USR2", err, sizeof(err));
}

/* The same exit() while fork() holds every cache's lock and the list's (their fork handlers): a
 * signal that arrives during a fork is handled there (the kernel restarts the fork after it). A
 * prepare handler registered before the library's runs after them: the signal comes there. */
static void raise_int_in_fork(void)
{
	raise(SIGINT);
}

static int mode_exit_in_fork(void)
{
	pthread_atfork(raise_int_in_fork, NULL, NULL);
	cc = dmabuf_cache(); /* the library's fork handlers, after the test's */
	if (cache_usable(cc))
		return 2;
	exit_on_sigint();
	fork(); /* exits inside */
	return 3;
}

static void test_exit_from_handler_inside_fork(void **state)
{
	char err[16384];
	(void)state;

	run_exit_case("--exit-in-fork", NULL, err, sizeof(err));
}

/* exit() from a handler of a signal that came while a free hook was publishing its event (issue 31
 * #8): the event's slot is reserved, never to be written (its writer is the thread that exits).
 * What runs at exit on that thread must not wait for it: the statistics at exit, and a program's
 * own clean-up (an atexit handler that releases and destroys its cache, as MPI_Finalize does).
 * Where: 0 after the slot is reserved, 1 after it is written, before it is published. */
static int publish_where;
static struct gdr_region *at_exit_r;

static void raise_int_in_publish(int where, uint64_t n)
{
	(void)n;
	if (where == publish_where)
		raise(SIGINT);
}

static void program_cleanup(void)
{
	struct gdr_region *r;
	uint64_t b = fake_cuda_alloc(MiB);

	gdr_events_push_hook = NULL;
	/* a last registration and the releases, then the cache goes */
	if (gdr_reg(cc, NULL, (void *)(uintptr_t)b, 4096, 0, &r) == 0)
		gdr_dereg(r);
	gdr_dereg(at_exit_r);
	gdr_cache_destroy(cc);
	fprintf(stderr, "program clean-up done\n");
}

static int exit_in_publish(int where, bool cleanup)
{
	uint64_t a = fake_cuda_alloc(MiB), h = fake_cuda_alloc(MiB);
	struct gdr_region *r;

	cc = dmabuf_cache();
	if (gdr_reg(cc, NULL, (void *)(uintptr_t)a, 4096, 0, &r) || gdr_dereg(r) ||
	    gdr_reg(cc, NULL, (void *)(uintptr_t)h, 4096, 0, &at_exit_r))
		return 2;
	if (cleanup)
		atexit(program_cleanup);
	exit_on_sigint();
	publish_where = where;
	gdr_events_push_hook = raise_int_in_publish;
	cuMemFree_v2(a); /* exits inside */
	return 3;
}

static int mode_exit_in_publish_0(void)
{
	return exit_in_publish(0, true);
}

static int mode_exit_in_publish_1(void)
{
	return exit_in_publish(1, true);
}

static int mode_exit_in_publish_stats(void)
{
	return exit_in_publish(0, false);
}

static void test_exit_from_handler_inside_publish(void **state)
{
	char err[16384];
	(void)state;

	/* the program's clean-up waited for ever on the old code; the cache's records then */
	for (int i = 0; i < 2; i++) {
		run_exit_case(i ? "--exit-in-publish-1" : "--exit-in-publish-0", NULL, err,
			      sizeof(err));
		assert_non_null(strstr(err, "program clean-up done"));
		assert_non_null(strstr(err, "why=destroy"));
		assert_non_null(strstr(err, "events_lost=1")); /* given up: everything dropped */
	}
	/* without one, the statistics at exit (which drain nothing) */
	run_exit_case("--exit-in-publish-stats", NULL, err, sizeof(err));
	assert_non_null(strstr(err, "why=\"at exit\""));
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cancel_inside_reg),
		cmocka_unit_test(test_cancel_inside_free_hook),
		cmocka_unit_test(test_errno_kept_by_free_hook),
		cmocka_unit_test(test_cancel_in_log_open),
		cmocka_unit_test(test_cancel_in_first_create),
		cmocka_unit_test(test_cancel_in_create_and_destroy),
		cmocka_unit_test(test_signal_keeps_program_flags),
		cmocka_unit_test(test_stats_pipe_closed_by_program),
		cmocka_unit_test(test_stats_pipe_read_end_replaced),
		cmocka_unit_test(test_exit_from_handler_inside_reg),
		cmocka_unit_test(test_exit_from_handler_while_signal_prints),
		cmocka_unit_test(test_exit_from_handler_inside_fork),
		cmocka_unit_test(test_exit_from_handler_inside_publish),
	};
	static const struct {
		const char *name;
		int (*fn)(void);
	} modes[] = {
		{ "--cancel-reg", mode_cancel_reg },
		{ "--cancel-free", mode_cancel_free },
		{ "--errno-free", mode_errno_free },
		{ "--cancel-log-open", mode_cancel_log_open },
		{ "--cancel-create", mode_cancel_create },
		{ "--cancel-create-destroy", mode_cancel_create_destroy },
		{ "--sig-restart", mode_sig_restart },
		{ "--pipe-reused", mode_pipe_reused },
		{ "--pipe-read-replaced", mode_pipe_read_replaced },
		{ "--exit-in-handler", mode_exit_in_handler },
		{ "--exit-while-signal-prints", mode_exit_while_signal_prints },
		{ "--exit-in-fork", mode_exit_in_fork },
		{ "--exit-in-publish-0", mode_exit_in_publish_0 },
		{ "--exit-in-publish-1", mode_exit_in_publish_1 },
		{ "--exit-in-publish-stats", mode_exit_in_publish_stats },
	};

	for (size_t i = 0; argc > 1 && i < sizeof(modes) / sizeof(modes[0]); i++)
		if (!strcmp(argv[1], modes[i].name))
			return modes[i].fn();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
