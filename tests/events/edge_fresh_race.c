/* SPDX-License-Identifier: MIT */
/*
 * "libcuda was not loaded, so no thread can be inside it" is decided by a dlopen(RTLD_NOLOAD) and
 * acted on after a second dlopen and the patching (lib/cuda/cuda.c): between the two, another
 * thread of the program may load libcuda itself and call into it (an application thread calling
 * cudaMalloc while a progress thread creates the first cache). If the one-byte form cannot be used
 * (the address its stub needs is taken, as it is in a process with large libraries loaded), the
 * entry is then rewritten with the five-byte jump, which a thread stopped inside the entry's first
 * instructions resumes in the middle of.
 *
 * Made deterministic here:
 *  - this program's dlopen (it interposes libgdrcache's) runs the other thread's part exactly in
 *    that window: after libgdrcache's RTLD_NOLOAD check of the driver answered "not loaded";
 *  - the other thread loads the driver (the fake, GDRCACHE_LIBCUDA), takes the page the one-byte
 *    form of cuMemFree_v2 needs, and enters cuMemFree_v2 as a preempted thread would be found:
 *    enter_parked below executes its first instruction (push %rbp) and spins; a tracer process
 *    (ptrace, as a debugger or the scheduler would hold it) stops the thread there and sets its
 *    program counter to cuMemFree_v2 + 1: the thread is stopped INSIDE the entry, exactly as one
 *    preempted after its first instruction;
 *  - while libgdrcache patches the driver, the tracer lets the thread take any signal sent to it
 *    (a debugger passes SIGURG on), and lets it go when the patching is over.
 * Pass: the thread's call returns normally, and free events are in effect (the entry was patched
 * with the thread inside it, the thread moved out first). Fail: it crashes or does not return (the
 * entry's bytes after its first instruction were overwritten while it was between them), or
 * events are not in effect (the patch was refused: the old code's answer, the tag fallback).
 * Skip: the thread cannot be started or traced, or does not get to the entry within its deadline.
 *
 * argv[1]: libgdrcache's path. Exit 0 pass, 1 fail, 77 skip.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gdrcache.h>

#include "deadline.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#if defined(__x86_64__)
/* uint64_t enter_parked(void *entry_plus_1, uint64_t arg, volatile int *flag): as if the caller
 * had called entry(arg) and been preempted right after the entry's first instruction, push %rbp:
 * the return address is the caller's (a tail call), %rbp pushed, then *flag = 1 and wait for
 * *flag == 2, then go on at entry + 1. */
__asm__(".pushsection .text\n"
	".globl enter_parked\n"
	".type enter_parked, @function\n"
	"enter_parked:\n"
	"	mov %rdi, %r11\n"
	"	mov %rsi, %rdi\n"
	"	push %rbp\n"
	"	movl $1, (%rdx)\n"
	"1:	pause\n"
	"	cmpl $2, (%rdx)\n"
	"	jne 1b\n"
	"	jmp *%r11\n"
	".size enter_parked, . - enter_parked\n"
	".popsection\n");
uint64_t enter_parked(void *entry_plus_1, uint64_t arg, volatile int *flag);

static volatile int flag;
static void *fake_h, *entry;
static pthread_t other;
static pid_t other_tid, tracer;
static int triggered;
static uint64_t other_rc = 12345;
static int to_tracer[2], from_tracer[2];

/* The other thread's getting to the entry, and its return once let go: microseconds, waited for
 * tens of seconds (times GDR_TEST_WAIT_SCALE). */
#define WAIT_MS 30000

static void *other_thread(void *arg)
{
	(void)arg;
	__atomic_store_n(&other_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
	other_rc = enter_parked((uint8_t *)entry + 1, 0, &flag);
	return NULL;
}

static void tracer_says(char c)
{
	if (write(from_tracer[1], &c, 1) < 0)
		_exit(1);
}

/* Whether tid has SIGURG or SIGWINCH pending (the stop signal libgdrcache sends). */
static bool stop_signal_pending(pid_t pid, pid_t tid)
{
	char path[64], buf[4096], *p;
	unsigned long long pend;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, (int)tid);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	p = strstr(buf, "\nSigPnd:");
	if (!p)
		return false;
	pend = strtoull(p + 8, NULL, 16);
	return pend >> (SIGURG - 1) & 1 || pend >> (SIGWINCH - 1) & 1;
}

/* The tracer (a child process): stops the other thread, puts it at entry + 1, tells the parent
 * ('R', or 'S' when it cannot trace), then hands it the stop signal when one is pending, or lets
 * it go when the parent says the patching is over. */
static void trace_other(pid_t pid, pid_t tid)
{
	struct user_regs_struct regs;
	int64_t deadline = gdr_deadline_ms(WAIT_MS);
	int st;
	char c;

	if (ptrace(PTRACE_SEIZE, tid, 0, 0) || ptrace(PTRACE_INTERRUPT, tid, 0, 0) ||
	    waitpid(tid, &st, __WALL) != tid || !WIFSTOPPED(st) ||
	    ptrace(PTRACE_GETREGS, tid, 0, &regs)) {
		tracer_says('S');
		_exit(0);
	}
	regs.rip = regs.r11; /* entry + 1: push %rbp done, as enter_parked arranged */
	if (ptrace(PTRACE_SETREGS, tid, 0, &regs)) {
		tracer_says('S');
		_exit(0);
	}
	tracer_says('R');
	fcntl(to_tracer[0], F_SETFL, O_NONBLOCK);
	for (;;) {
		if (stop_signal_pending(pid, tid)) {
			/* resumed, it stops at once to deliver the signal (signal-delivery-stop),
			 * before any instruction of its own: hand the signal on */
			if (ptrace(PTRACE_CONT, tid, 0, 0) || waitpid(tid, &st, __WALL) != tid)
				_exit(1);
			if (WIFSTOPPED(st))
				ptrace(PTRACE_CONT, tid, 0, WSTOPSIG(st));
			tracer_says('G');
			_exit(0); /* detaches */
		}
		if (read(to_tracer[0], &c, 1) == 1 || gdr_deadline_passed(deadline)) {
			tracer_says('N'); /* no signal came: let it run where it is */
			_exit(0);
		}
		usleep(200);
	}
}

static void crashed(int sig)
{
	static const char m[] = "FAIL: the thread stopped inside cuMemFree_v2's first instructions "
				"crashed when it resumed: the entry was rewritten under it\n";
	(void)sig;
	if (write(2, m, sizeof(m) - 1) < 0)
		_exit(1);
	_exit(1);
}

/* The application thread's part, run in the window (see above). */
static void other_loads_cuda(void)
{
	void *(*real)(const char *, int) = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t dest;
	int32_t rel;

	fake_h = real(getenv("GDRCACHE_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
	entry = fake_h ? dlsym(fake_h, "cuMemFree_v2") : NULL;
	if (!entry) {
		fprintf(stderr, "FAIL: the fake driver\n");
		_exit(1);
	}
	/* a crowded address space: the one-byte form's stub address is taken */
	memcpy(&rel, (uint8_t *)entry + 1, 4);
	dest = ((uintptr_t)entry + 5 + (intptr_t)rel) & ~(uintptr_t)(page - 1);
	if (mmap((void *)dest, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
		 -1, 0) != (void *)dest) {
		fprintf(stderr, "SKIP: cannot take the stub page\n");
		_exit(77);
	}
	if (pthread_create(&other, NULL, other_thread, NULL)) {
		fprintf(stderr, "SKIP: cannot start the other thread\n");
		_exit(77);
	}
	for (int64_t deadline = gdr_deadline_ms(WAIT_MS);
	     __atomic_load_n(&flag, __ATOMIC_ACQUIRE) != 1;) {
		if (gdr_deadline_passed(deadline)) {
			fprintf(stderr,
				"SKIP: the other thread did not get to cuMemFree_v2's entry "
				"within %lld s\n",
				gdr_deadline_s(WAIT_MS));
			_exit(77);
		}
		sched_yield();
	}
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* Yama: the tracer is a child */
	if (pipe(to_tracer) || pipe(from_tracer)) {
		fprintf(stderr, "SKIP: pipe\n");
		_exit(77);
	}
	tracer = fork();
	if (tracer < 0) {
		fprintf(stderr, "SKIP: fork\n");
		_exit(77);
	}
	if (!tracer)
		trace_other(getppid(), __atomic_load_n(&other_tid, __ATOMIC_ACQUIRE));
	{
		char c = 0;

		if (read(from_tracer[0], &c, 1) != 1 || c != 'R') {
			fprintf(stderr, "SKIP: cannot stop the other thread with ptrace (%s)\n",
				c == 'S' ? "refused" : "tracer died");
			_exit(77);
		}
	}
}

/* libgdrcache's dlopen of the driver lands here (this executable comes first in the global scope). */
void *dlopen(const char *file, int mode)
{
	void *(*real)(const char *, int) = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
	const char *drv = getenv("GDRCACHE_LIBCUDA");
	void *h = real(file, mode);

	if (!triggered && file && drv && !strcmp(file, drv) && (mode & RTLD_NOLOAD) && !h) {
		triggered = 1;
		other_loads_cuda(); /* after the check said "not loaded" */
	}
	return h;
}

int main(int argc, char **argv)
{
	int (*create)(const struct gdr_cache_attr *, struct gdr_cache **);
	int (*destroy)(struct gdr_cache *);
	struct gdr_cache *c = NULL;
	void *g;

	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc < 2 || !getenv("GDRCACHE_LIBCUDA"))
		return fprintf(stderr, "usage: GDRCACHE_LIBCUDA=... edge_fresh_race LIBGDRCACHE\n"),
		       1;
	signal(SIGSEGV, crashed);
	signal(SIGILL, crashed);
	signal(SIGBUS, crashed);
	signal(SIGTRAP, crashed);
	g = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!g)
		return fprintf(stderr, "FAIL: %s\n", dlerror()), 1;
	create = (int (*)(const struct gdr_cache_attr *,
			  struct gdr_cache **))dlsym(g, "gdr_cache_create");
	destroy = (int (*)(struct gdr_cache *))dlsym(g, "gdr_cache_destroy");
	if (!create || !destroy)
		return fprintf(stderr, "FAIL: libgdrcache's API\n"), 1;
	if (create(NULL, &c)) /* loads the driver and patches it */
		return fprintf(stderr, "FAIL: gdr_cache_create\n"), 1;
	if (!triggered)
		return fprintf(stderr, "SKIP: libgdrcache's driver check was not seen\n"), 77;
	{
		const char *why = "?";
		int (*state)(const char **) = (int (*)(const char **))dlsym(g,
									    "gdr_mem_events_state");
		int st, events = state ? state(&why) : -ENOSYS;
		char t = 0;

		if (write(to_tracer[1], "x", 1) != 1 || read(from_tracer[0], &t, 1) != 1)
			return fprintf(stderr, "FAIL: the tracer\n"), 1;
		waitpid(tracer, &st, 0);
		printf("tracer: %s\n", t == 'G' ? "handed the stop signal on"
					      : "no signal came while the entry was patched");
		if (gdr_join_until(other, gdr_deadline_ms(WAIT_MS))) {
			fprintf(stderr,
				"FAIL: the thread stopped inside cuMemFree_v2's first instructions "
				"did not return within %lld s of resuming: the entry was rewritten "
				"under it\n",
				gdr_deadline_s(WAIT_MS));
			_exit(1); /* not exit(): that thread may hold what exit's handlers need */
		}
		if (events) {
			fprintf(stderr, "FAIL: free events not in effect (%d: %s)\n", events, why);
			return 1;
		}
		if (t == 'G') { /* the thread took the stop signal: it was moved out of the entry */
			int (*get)(struct gdr_intercept_stats *, size_t) =
				(int (*)(struct gdr_intercept_stats *, size_t))dlsym(
					g, "gdr_intercept_get_stats");
			struct gdr_intercept_stats is;

			if (!get || get(&is, sizeof(is)))
				return fprintf(stderr, "FAIL: gdr_intercept_get_stats\n"), 1;
			printf("entries stopped %u, threads stopped %u, moved %u\n",
			       is.entries_stopped, is.threads_stopped, is.threads_moved);
			if (is.threads_moved != 1 || !is.entries_stopped) {
				fprintf(stderr, "FAIL: the thread inside the entry was not moved\n");
				return 1;
			}
		}
	}
	printf("the thread stopped inside cuMemFree_v2 resumed and returned %llu\n",
	       (unsigned long long)other_rc);
	destroy(c);
	return 0;
}
#else
int main(void)
{
	return 77;
}
#endif
