/* SPDX-License-Identifier: MIT */
/*
 * Stopping every other thread for a moment (stop_world.h).
 *
 * The handshake. The run's state word goes PARKING -> STORING -> RELEASED (or PARKING -> ABORTED):
 *  - the runner installs the handler, then, pass after pass over /proc/self/task until a pass
 *    finds no thread it has not seen and no sleeper that woke, reads each new thread: one asleep
 *    in the kernel with its user program counter outside the region (/proc/self/task/T/syscall)
 *    is a sleeper, left alone; any other is queued the signal (one that blocks the signal and
 *    runs is read again until the park deadline, then the run is refused); then it waits until
 *    every thread signalled is parked or gone, and reads the sleepers again: one whose context
 *    switch counts or syscall line changed ran meanwhile, and is signalled (or, blocking the
 *    signal, read again);
 *  - a signalled thread's handler moves its program counter out of the region if it is inside it,
 *    counts itself parked, and waits on the state word (a futex) while it is PARKING or STORING;
 *    if it has waited hold_ms it tries PARKING -> ABORTED (a runner that died or hangs), so a
 *    parked thread never waits forever, and never leaves while the runner may be writing;
 *  - the runner moves PARKING -> STORING (refused if a thread aborted), runs fn, and stores
 *    RELEASED, waking every parked thread.
 * Parked threads are inside this handler with every signal blocked (sa_mask is full), so none of
 * the program's handlers runs on top of one. They may hold any lock (malloc's, the loader's): from
 * the first signal to the release, the runner makes system calls only (open, read, getdents64,
 * rt_tgsigqueueinfo, futex, nanosleep, clock_gettime, access) and fn.
 *
 * Sleepers are not signalled: a signal would end some of their waits early with EINTR (poll,
 * epoll_wait, nanosleep: SA_RESTART does not restart those), which a program may not expect, and
 * in a large process most threads sleep, so the stop costs little. They are read once more after
 * fn: one that ran between the last reading and then is counted (sleepers_ran). To have been
 * inside the region at the store it had to wake and call the function within those microseconds
 * (the same holds for a thread that blocks the signal: runtimes' helper threads, CUDA's own).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "intercept/stop_world.h"

#define MAX_THREADS 4096
#define MAX_SLEEPERS 256
#define POLL_NS 50000L

enum { ST_IDLE, ST_PARKING, ST_STORING, ST_RELEASED, ST_ABORTED };

static pthread_mutex_t stw_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned park_ms = 1000, hold_ms = 4000;

/* The current run (written by the runner before the first signal, read by handlers). */
static int state; /* futex word */
static unsigned generation;
/* The run's generation (high 32 bits) and how many threads parked in it (low): a handler counts
 * itself only into the run whose signal it got. */
static uint64_t park_word;
static int inside; /* handlers between entry and return, any run */
static int relocated;
static pid_t self_pid;
static struct gdr_stw_region region;

static struct gdr_stw_stats last;

/* The runner's tables (under stw_lock). */
static pid_t seen[MAX_THREADS];
static unsigned nseen;
static pid_t sent[MAX_THREADS];
static unsigned nsent;
static struct sleeper {
	pid_t tid;
	bool blocked; /* it blocks the signal */
	char state;
	unsigned long vol, nonvol;
	char syscall[192];
} sleepers[MAX_SLEEPERS];
static unsigned nsleep;
static char why_buf[160];

void gdr_stw_set_deadlines(unsigned park, unsigned hold)
{
	pthread_mutex_lock(&stw_lock);
	park_ms = park;
	hold_ms = hold > park ? hold : park + 1;
	pthread_mutex_unlock(&stw_lock);
}

struct gdr_stw_stats gdr_stw_last(void)
{
	struct gdr_stw_stats s;

	pthread_mutex_lock(&stw_lock);
	s = last;
	pthread_mutex_unlock(&stw_lock);
	return s;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nap(long ns)
{
	struct timespec ts = { 0, ns };

	nanosleep(&ts, NULL);
}

static void futex_wait(int *word, int val, long ns)
{
	struct timespec ts = { ns / 1000000000L, ns % 1000000000L };

	syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake_all(int *word)
{
	syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* ---- The program counter in a signal's context ------------------------------------------------ */

#if defined(__x86_64__)
#define HAVE_PC 1
static uintptr_t *pc_of(ucontext_t *uc)
{
	return (uintptr_t *)&uc->uc_mcontext.gregs[REG_RIP];
}
#elif defined(__aarch64__)
#define HAVE_PC 1
static uintptr_t *pc_of(ucontext_t *uc)
{
	return (uintptr_t *)&uc->uc_mcontext.pc;
}
#else
#define HAVE_PC 0
#endif

#if HAVE_PC
static void handler(int sig, siginfo_t *si, void *ucv)
{
	int saved = errno;
	uint64_t w, deadline;
	unsigned gen;

	(void)sig;
	/* Ours: queued by this process (SI_QUEUE, its pid). */
	if (si->si_code != SI_QUEUE || si->si_pid != self_pid)
		return;
	__atomic_add_fetch(&inside, 1, __ATOMIC_ACQ_REL);
	gen = (unsigned)si->si_value.sival_int;
	w = __atomic_load_n(&park_word, __ATOMIC_ACQUIRE);
	/* this run's signal, while it parks threads: a late one of a run that is over returns */
	if (w >> 32 == gen && __atomic_load_n(&state, __ATOMIC_ACQUIRE) == ST_PARKING) {
		uintptr_t *pc = pc_of(ucv);

		if (*pc > region.start && *pc < region.start + region.len) {
			*pc = region.moved_to + (*pc - region.start);
			__atomic_add_fetch(&relocated, 1, __ATOMIC_RELAXED);
		}
		deadline = now_ns() + (uint64_t)hold_ms * 1000000u;
		while (w >> 32 == gen &&
		       !__atomic_compare_exchange_n(&park_word, &w, w + 1, false, __ATOMIC_ACQ_REL,
						    __ATOMIC_ACQUIRE))
			;
		for (;;) {
			int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);

			if ((s != ST_PARKING && s != ST_STORING) ||
			    __atomic_load_n(&park_word, __ATOMIC_ACQUIRE) >> 32 != gen)
				break;
			if (s == ST_PARKING && now_ns() > deadline) {
				int want = ST_PARKING;

				__atomic_compare_exchange_n(&state, &want, ST_ABORTED, false,
							    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
				continue;
			}
			futex_wait(&state, s, 10000000L);
		}
	}
	__atomic_sub_fetch(&inside, 1, __ATOMIC_RELEASE);
	errno = saved;
}
#endif

/* ---- /proc, read with system calls only ----------------------------------------------------- */

/* "/proc/self/task/<tid>[/<name>]" into path (64 bytes), without stdio. */
static void task_path(char *path, pid_t tid, const char *name)
{
	static const char head[] = "/proc/self/task/";
	char digits[12];
	size_t n = 0, len = sizeof(head) - 1;

	memcpy(path, head, len);
	do
		digits[n++] = (char)('0' + tid % 10);
	while ((tid /= 10) && n < sizeof(digits));
	while (n)
		path[len++] = digits[--n];
	if (name) {
		path[len++] = '/';
		while (*name && len < 62)
			path[len++] = *name++;
	}
	path[len] = '\0';
}

/* Reads /proc/self/task/<tid>/<name> into buf (NUL-terminated): its length, or -errno. */
static int read_task(pid_t tid, const char *name, char *buf, size_t size)
{
	char path[64];
	ssize_t n, len = 0;
	int fd;

	task_path(path, tid, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (len < (ssize_t)size - 1 && (n = read(fd, buf + len, size - 1 - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = -errno;

			close(fd);
			return e;
		}
		len += n;
	}
	close(fd);
	buf[len] = '\0';
	return (int)len;
}

/* The number after "key:" in a status file, or 0. */
static unsigned long long status_field(const char *status, const char *key, int base)
{
	const char *p = strstr(status, key);

	return p ? strtoull(p + strlen(key), NULL, base) : 0;
}

static bool signal_blocked(const char *status, int sig)
{
	return status_field(status, "\nSigBlk:", 16) >> (sig - 1) & 1;
}

/* Snapshot of a thread: 0 if it sleeps outside the region, 1 if it is running (try
 * again), -errno if it is gone or unreadable, 2 if its program counter is inside the region. */
static int snapshot(pid_t tid, struct sleeper *m)
{
	char status[2048], stat[512], *p;
	int n;

	m->tid = tid;
	n = read_task(tid, "stat", stat, sizeof(stat));
	if (n < 0)
		return n;
	p = strrchr(stat, ')');
	m->state = p && p[1] == ' ' ? p[2] : '?';
	n = read_task(tid, "syscall", m->syscall, sizeof(m->syscall));
	if (n < 0)
		return n;
	if (!strncmp(m->syscall, "running", 7) || m->state == 'R')
		return 1;
	n = read_task(tid, "status", status, sizeof(status));
	if (n < 0)
		return n;
	m->vol = (unsigned long)status_field(status, "\nvoluntary_ctxt_switches:", 10);
	m->nonvol = (unsigned long)status_field(status, "\nnonvoluntary_ctxt_switches:", 10);
	p = strrchr(m->syscall, ' ');
	if (p) {
		uintptr_t pc = (uintptr_t)strtoull(p + 1, NULL, 16);

		if (pc > region.start && pc < region.start + region.len)
			return 2;
	}
	return 0;
}

static bool known(const pid_t *tab, unsigned n, pid_t tid)
{
	for (unsigned i = 0; i < n; i++)
		if (tab[i] == tid)
			return true;
	return false;
}

static bool task_alive(pid_t tid)
{
	char path[64];

	task_path(path, tid, NULL);
	return access(path, F_OK) == 0;
}

static int refuse(const char **why, const char *reason, int err)
{
	if (why)
		*why = reason;
	return err;
}

struct linux_dirent64_ {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* What to do with thread tid: 1 signal it; 0 leave it (it sleeps in the kernel outside the
 * region: recorded in sleepers[], re-read before and after fn); -ESRCH it is gone; else -errno
 * with *why (refuse the run). A sleeping thread is not signalled: the signal would end some of
 * its waits early with EINTR (poll, epoll_wait, nanosleep, whatever SA_RESTART says). One that
 * blocks the signal and runs may be leaving a handler (sigreturn restores its mask): read again
 * until the deadline. */
static int classify(pid_t tid, int sig, uint64_t deadline, const char **why)
{
	char status[2048];

	for (;;) {
		bool blocked;
		int rc;

		if (read_task(tid, "status", status, sizeof(status)) < 0)
			return -ESRCH;
		blocked = signal_blocked(status, sig);
		if (nsleep == MAX_SLEEPERS)
			return refuse(why, "too many sleeping threads", -E2BIG);
		rc = snapshot(tid, &sleepers[nsleep]);
		if (rc < 0)
			return -ESRCH;
		if (rc == 0) {
			sleepers[nsleep++].blocked = blocked;
			return 0;
		}
		if (!blocked)
			return 1; /* running, or stopped inside the region: its handler moves it */
		if (rc == 1 && now_ns() < deadline) {
			nap(POLL_NS);
			continue;
		}
		snprintf(why_buf, sizeof(why_buf), "thread %d blocks signal %d and %s", (int)tid,
			 sig, rc == 1 ? "keeps running" : "is inside the entry");
		return refuse(why, why_buf, -EBUSY);
	}
}

/* Queues this run's signal to tid: 0 (or 0 and nothing sent when it is gone), or -errno. */
static int send_stop(pid_t tid, int sig)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	si.si_signo = sig;
	si.si_code = SI_QUEUE;
	si.si_pid = self_pid;
	si.si_uid = getuid();
	si.si_value.sival_int = (int)generation;
	if (syscall(SYS_rt_tgsigqueueinfo, self_pid, tid, sig, &si))
		return errno == ESRCH ? 0 : -errno;
	sent[nsent++] = tid;
	return 0;
}

static bool same_sleep(const struct sleeper *a, const struct sleeper *b)
{
	return a->vol == b->vol && a->nonvol == b->nonvol && !strcmp(a->syscall, b->syscall);
}

/* Reads every sleeper again: one that ran since it was read is signalled (or, blocking the
 * signal, read again as classify does). The number that ran, or -errno with *why. */
static int recheck_sleepers(int sig, uint64_t deadline, const char **why)
{
	int ran = 0;

	for (unsigned i = 0; i < nsleep;) {
		struct sleeper now, was = sleepers[i];
		int rc = snapshot(was.tid, &now);

		if (rc == 0 && same_sleep(&now, &was)) {
			i++;
			continue;
		}
		sleepers[i] = sleepers[--nsleep]; /* out of the table; back in below if asleep */
		if (rc < 0)
			continue; /* gone */
		ran++;
		rc = was.blocked ? classify(was.tid, sig, deadline, why) : 1;
		if (rc == 1)
			rc = send_stop(was.tid, sig);
		if (rc < 0 && rc != -ESRCH)
			return rc;
	}
	return ran;
}

/* One pass over /proc/self/task: every thread not seen before is signalled or recorded as a
 * sleeper (classify). The number of new threads, or -errno with *why. */
static int round_once(int sig, pid_t me, uint64_t deadline, const char **why)
{
	char buf[4096];
	int fd, found = 0, rc;
	long n;

	fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return refuse(why, "cannot open /proc/self/task", -errno);
	while ((n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < n;) {
			struct linux_dirent64_ *d = (struct linux_dirent64_ *)(buf + off);
			pid_t tid = (pid_t)strtol(d->d_name, NULL, 10);

			off += d->d_reclen;
			if (tid <= 0 || tid == me || known(seen, nseen, tid))
				continue;
			if (nseen == MAX_THREADS || nsent == MAX_THREADS) {
				close(fd);
				return refuse(why, "more threads than the stop table holds",
					      -E2BIG);
			}
			seen[nseen++] = tid;
			found++;
			rc = classify(tid, sig, deadline, why);
			if (rc == -ESRCH || rc == 0)
				continue; /* gone, or asleep outside the region */
			if (rc < 0) {
				close(fd);
				return rc;
			}
			rc = send_stop(tid, sig);
			if (rc) {
				close(fd);
				return refuse(why, "cannot queue the stop signal", rc);
			}
		}
	}
	close(fd);
	if (n < 0)
		return refuse(why, "cannot read /proc/self/task", -errno);
	return found;
}

/* Waits until every thread signalled is parked or gone: 0, or -EBUSY at the deadline. */
static int wait_parked(uint64_t deadline, const char **why)
{
	uint64_t next_count = 0;

	for (;;) {
		int p = (int)(uint32_t)__atomic_load_n(&park_word, __ATOMIC_ACQUIRE);
		unsigned alive = 0;
		uint64_t t = now_ns();

		if (p >= (int)nsent)
			return 0;
		if (t >= next_count || t >= deadline) {
			/* a thread that exited before its handler ran never parks */
			for (unsigned i = 0; i < nsent; i++)
				alive += task_alive(sent[i]);
			if (p >= (int)alive)
				return 0;
			if (t >= deadline) {
				snprintf(why_buf, sizeof(why_buf),
					 "%u of %u threads did not stop within %u ms", alive - p,
					 alive, park_ms);
				return refuse(why, why_buf, -EBUSY);
			}
			next_count = t + 10000000u;
		}
		nap(POLL_NS);
	}
}

/* Whether a signal is free for the handshake: the program has no handler of its own for it. */
static bool signal_free(int sig, struct sigaction *old)
{
	if (sigaction(sig, NULL, old))
		return false;
	return !(old->sa_flags & SA_SIGINFO) &&
	       (old->sa_handler == SIG_DFL || old->sa_handler == SIG_IGN);
}

static void sync_cores(void)
{
#ifdef SYS_membarrier
	/* MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE (32), registered by its REGISTER command (64):
	 * every core running this process serialises its instruction stream. Where the kernel lacks
	 * it, returning from the handler (sigreturn) is the serialising event. */
	static int registered = -1;

	if (registered < 0)
		registered = syscall(SYS_membarrier, 64, 0, 0) == 0;
	if (registered)
		syscall(SYS_membarrier, 32, 0, 0);
#endif
}

int gdr_stw_run(const struct gdr_stw_region *r, int (*fn)(void *), void *arg, const char **why)
{
#if HAVE_PC
	static const int candidates[] = { SIGURG, SIGWINCH };
	struct sigaction old, sa;
	pid_t me = (pid_t)syscall(SYS_gettid);
	int sig = 0, rc = 0, found, ran, want;
	uint64_t t0, deadline;

	pthread_mutex_lock(&stw_lock);
	memset(&last, 0, sizeof(last));
	for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]) && !sig; i++)
		if (signal_free(candidates[i], &old))
			sig = candidates[i];
	if (!sig) {
		pthread_mutex_unlock(&stw_lock);
		return refuse(why,
			      "the program handles both SIGURG and SIGWINCH: no signal to stop "
			      "threads with",
			      -EBUSY);
	}
	/* a handler of an earlier run still returning reads region: wait for it */
	for (deadline = now_ns() + (uint64_t)hold_ms * 1000000u;
	     __atomic_load_n(&inside, __ATOMIC_ACQUIRE) && now_ns() < deadline;)
		nap(POLL_NS);
	self_pid = getpid();
	region = *r;
	nseen = nsent = nsleep = 0;
	__atomic_store_n(&relocated, 0, __ATOMIC_RELAXED);
	generation++;
	__atomic_store_n(&park_word, (uint64_t)generation << 32, __ATOMIC_RELEASE);
	__atomic_store_n(&state, ST_PARKING, __ATOMIC_RELEASE);

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = handler;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigfillset(&sa.sa_mask);
	if (sigaction(sig, &sa, NULL)) {
		rc = refuse(why, "cannot install the stop signal's handler", -errno);
		goto out_unlock;
	}
	t0 = now_ns();
	deadline = t0 + (uint64_t)park_ms * 1000000u;
	/* until a pass finds no new thread and no sleeper that woke: then every thread is parked,
	 * or asleep since it was last read (the store follows at once) */
	do {
		last.rounds++;
		found = round_once(sig, me, deadline, why);
		if (found < 0) {
			rc = found;
			goto release;
		}
		rc = wait_parked(deadline, why);
		if (rc)
			goto release;
		ran = recheck_sleepers(sig, deadline, why);
		if (ran < 0) {
			rc = ran;
			goto release;
		}
		if (ran)
			rc = wait_parked(deadline, why);
		if (rc)
			goto release;
		if ((found || ran) && now_ns() > deadline) {
			rc = refuse(why, "threads kept starting or waking for the whole deadline",
				    -EBUSY);
			goto release;
		}
	} while (found || ran);

	want = ST_PARKING;
	if (!__atomic_compare_exchange_n(&state, &want, ST_STORING, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		rc = refuse(why, "a stopped thread gave up waiting", -EBUSY);
		goto release;
	}
	rc = fn(arg);
	sync_cores();
	for (unsigned i = 0; i < nsleep; i++) {
		struct sleeper now;

		if (snapshot(sleepers[i].tid, &now) != 0 || !same_sleep(&now, &sleepers[i]))
			last.sleepers_ran++;
	}
release:
	want = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
	__atomic_store_n(&state, want == ST_STORING ? ST_RELEASED : ST_ABORTED, __ATOMIC_RELEASE);
	futex_wake_all(&state);
	last.ns = now_ns() - t0;
	last.threads = (unsigned)(uint32_t)__atomic_load_n(&park_word, __ATOMIC_ACQUIRE);
	last.sleepers = nsleep;
	last.relocated = (unsigned)__atomic_load_n(&relocated, __ATOMIC_ACQUIRE);
	last.sig = sig;
	/* A signal still pending after this finds the old disposition (ignored by default), or our
	 * handler, which returns at once for a run that is over. */
	for (deadline = now_ns() + (uint64_t)hold_ms * 1000000u;
	     __atomic_load_n(&inside, __ATOMIC_ACQUIRE) && now_ns() < deadline;)
		nap(POLL_NS);
	sigaction(sig, &old, NULL);
out_unlock:
	pthread_mutex_unlock(&stw_lock);
	return rc;
#else
	(void)r, (void)fn, (void)arg;
	return refuse(why, "no program counter to read on this architecture", -ENOTSUP);
#endif
}
