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
 *    its first instruction (push %rbp) executed, its next one at cuMemFree_v2 + 1 (enter_parked
 *    below executes that first instruction itself and waits before jumping to entry + 1, which is
 *    exactly the state of a thread preempted there);
 *  - once libgdrcache has patched the driver, the thread goes on.
 * Pass: the thread's call returns normally (whatever form was used). Fail: it crashes, or does not
 * return (the entry's bytes after its first instruction were overwritten while it was between
 * them). Skip: the thread cannot be started, or does not get to the entry within its deadline.
 *
 * argv[1]: libgdrcache's path. Exit 0 pass, 1 fail, 77 skip.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
static int triggered;
static uint64_t other_rc = 12345;

/* The other thread's getting to the entry, and its return once let go: microseconds, waited for
 * tens of seconds (times GDR_TEST_WAIT_SCALE). */
#define WAIT_MS 30000

static void *other_thread(void *arg)
{
	(void)arg;
	other_rc = enter_parked((uint8_t *)entry + 1, 0, &flag);
	return NULL;
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
	__atomic_store_n(&flag, 2, __ATOMIC_RELEASE);
	if (gdr_join_until(other, gdr_deadline_ms(WAIT_MS))) {
		fprintf(stderr,
			"FAIL: the thread stopped inside cuMemFree_v2's first instructions "
			"did not return within %lld s of resuming: the entry was rewritten "
			"under it\n",
			gdr_deadline_s(WAIT_MS));
		_exit(1); /* not exit(): that thread may hold what exit's handlers need */
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
