/* SPDX-License-Identifier: MIT */
/*
 * Two patchers, one libcuda: UCX's bistro (SIMULATED by tests/support/ucm_bistro_sim.c, which
 * writes what UCX writes) and libgdrcache's entry patcher (lib/intercept/patch.c) on the same
 * entries, in either order, with threads calling the entry during the second patch. Patches are
 * for ever, so each order is a process of its own (argv[1]):
 *   patch      patch.c alone over assembly targets: UCX first (its near and far jumps), then ours
 *              (chained, both hooks run); ours first, then UCX's (refused, nothing written);
 *              UCX's lock (a jump to itself); UCX restoring over our chain; gdr_patch_foreign
 *   ucm-first  the fake libcuda's free entries patched by the simulation, then libgdrcache
 *              installs its hooks while threads free: every free later reaches both hooks and
 *              publishes libgdrcache's event
 *   gdr-first  libgdrcache first; the simulation's patch while threads free is refused, and
 *              every free still publishes the event
 *   ucm-yield  UCX first, then libgdrcache with GDRCACHE_INTERCEPT=yield: it patches nothing,
 *              says whose jump it found, and UCX's hook keeps every free
 * Skips (77) on an architecture without a patcher.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "gdrcache.h"
#include "cuda/cuda_abi.h"
#include "deadline.h"
#include "intercept/events.h"
#include "intercept/patch.h"
#include "ucm_bistro_sim.h"

#if !defined(__x86_64__) && !defined(__aarch64__)
int main(void)
{
	printf("no entry patcher on this architecture: skipped\n");
	return 77;
}
#else
typedef long (*fn2)(long, long);

long two_body(long a, long b);
__attribute__((noinline, used)) long two_body(long a, long b)
{
	return a * 3 + b * 5;
}
int two_flag; /* what the x86-64 targets' RIP-relative cmp reads */

#define ASM_FN(name) ".globl " #name "\n.hidden " #name "\n.type " #name ", %function\n"
#define TARGETS(X) X(t_near) X(t_far) X(t_ours) X(t_lock) X(t_rest) X(t_foreign)
#define X(n) extern char n[];
TARGETS(X)
#undef X
#if defined(__x86_64__)
/* libcuda 580.159.04's entry (docs/FACTS.md): what UCX relocates for both of its forms */
#define BODY(name)                                                                                 \
	ASM_FN(name)                                                                               \
	".p2align 4\n" #name ":\n"                                                                 \
	"push %rbp\nmov %rsp, %rbp\npush %r12\nsub $8, %rsp\ncmpl $0x12345678, two_flag(%rip)\n"   \
	"call two_body\nadd $8, %rsp\npop %r12\npop %rbp\nret\n"
#else
/* a frame-record prologue UCX's aarch64 decoder relocates whole (its 16 bytes: STP, MOV, STP,
 * MOV); the fake's (STP, MOV, BL) it cannot */
#define BODY(name)                                                                                 \
	ASM_FN(name)                                                                               \
	".p2align 4\n" #name ":\n"                                                                 \
	"stp x29, x30, [sp, #-32]!\nmov x29, sp\nstp x19, x20, [sp, #16]\nmov x19, x0\n"           \
	"mov x0, x19\nbl two_body\nldp x19, x20, [sp, #16]\nldp x29, x30, [sp], #32\nret\n"
#endif
__asm__(".pushsection .text\n" BODY(t_near) BODY(t_far) BODY(t_ours) BODY(t_lock) BODY(t_rest)
		BODY(t_foreign) ".popsection\n");

#define HOOKED 1000

/* UCX's hook (ucm_cuMemFree and the like: it dispatches its event, then calls the original
 * through the pointer the bistro filled) and ours, each counting. */
static fn2 ucm_orig, gdr_orig;
static atomic_long ucm_hits, gdr_hits;

static long ucm_hook(long a, long b)
{
	atomic_fetch_add(&ucm_hits, 1);
	return __atomic_load_n(&ucm_orig, __ATOMIC_ACQUIRE)(a, b) + HOOKED;
}

static long gdr_hook(long a, long b)
{
	atomic_fetch_add(&gdr_hits, 1);
	return __atomic_load_n(&gdr_orig, __ATOMIC_ACQUIRE)(a, b) + 2 * HOOKED;
}

static void hits_reset(void)
{
	atomic_store(&ucm_hits, 0);
	atomic_store(&gdr_hits, 0);
}

/* The hook where UCX would have it relative to the entry: within 2 GiB (libucm loaded near
 * libcuda: the near jump) or farther. A page near target holding `jmp *0(%rip); .quad hook`
 * (aarch64: ldr x16, #8; br x16), or NULL. */
static void *near_hook(const void *target, void *hook)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t base = ((uintptr_t)target & ~(uintptr_t)(page - 1));

	/* A file's mapping, as libucm's code is (the library chains only over a jump into a file's
	 * code: a jump into anonymous memory may be another libgdrcache's one-byte form). */
	char name[] = "/tmp/ucm_near_XXXXXX";
	int fd = mkstemp(name);

	if (fd < 0)
		return NULL;
	unlink(name);
	if (ftruncate(fd, (off_t)page)) {
		close(fd);
		return NULL;
	}
	for (uintptr_t off = 64 << 20; off < (1u << 30); off += 16 << 20) {
		uint8_t *p = mmap((void *)(base - off), page, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd, 0);

		if (p == MAP_FAILED)
			continue;
		if ((uintptr_t)p != base - off) {
			munmap(p, page);
			continue;
		}
#if defined(__x86_64__)
		static const uint8_t j[6] = { 0xff, 0x25, 0, 0, 0, 0 };
#else
		static const uint32_t j[2] = { 0x58000050, 0xd61f0200 };
#endif
		memcpy(p, j, sizeof(j));
		memcpy(p + sizeof(j), &hook, 8);
		close(fd); /* the mapping stays */
		if (mprotect(p, page, PROT_READ | PROT_EXEC))
			return NULL;
		__builtin___clear_cache((char *)p, (char *)p + 16);
		return p;
	}
	close(fd);
	return NULL;
}

#define CALL(t) ((fn2)(void *)(t))(20, 2)
#define PLAIN (20 * 3 + 2 * 5)

/* Threads calling a target, each result checked against what the hooks then say. */
#define THREADS 4
static void *volatile calling;
static atomic_bool stop;
static atomic_long calls, wrong;

static void *caller(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		long r = CALL(calling);

		if (r != PLAIN && r != PLAIN + HOOKED && r != PLAIN + 2 * HOOKED &&
		    r != PLAIN + 3 * HOOKED)
			atomic_fetch_add(&wrong, 1);
		atomic_fetch_add(&calls, 1);
	}
	return NULL;
}

static void callers_start(pthread_t *th, void *target)
{
	calling = target;
	atomic_store(&stop, false);
	for (int i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, caller, NULL), 0);
	while (atomic_load(&calls) < 1000)
		sched_yield();
}

static void callers_stop(pthread_t *th)
{
	long c = atomic_load(&calls);

	while (atomic_load(&calls) < c + 1000)
		sched_yield();
	atomic_store(&stop, true);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&wrong), 0);
}

/* UCX first (its near jump where the hook is within 2 GiB), ours over it while threads call:
 * both hooks run, ours first, and the original once. */
static void ucm_then_gdr(void *target, void *ucm_at, unsigned sim_flags, uint8_t first_byte)
{
	pthread_t th[THREADS];
	const char *why = NULL, *who = NULL;

	assert_int_equal(ucm_sim_patch(target, ucm_at, (void **)&ucm_orig, sim_flags, 5, NULL,
				       &why),
			 0);
#if defined(__x86_64__)
	assert_int_equal(((uint8_t *)target)[0], first_byte);
#else
	(void)first_byte;
#endif
	hits_reset();
	assert_int_equal(CALL(target), PLAIN + HOOKED);
	assert_int_equal(gdr_patch_foreign(target, &who), ucm_at == (void *)ucm_hook ? 0 : 1);
	callers_start(th, target);
	if (gdr_patch_install(target, (void *)gdr_hook, (void **)&gdr_orig, 0, &why))
		fail_msg("refused over UCX's patch: %s", why);
	callers_stop(th);
	hits_reset();
	assert_int_equal(CALL(target), PLAIN + 3 * HOOKED);
	assert_int_equal(atomic_load(&gdr_hits), 1);
	assert_int_equal(atomic_load(&ucm_hits), 1);
	assert_int_equal(gdr_patch_foreign(target, &who), 0); /* ours now, and it is not foreign */
}

#if defined(__x86_64__) /* aarch64's UCX writes its far form only */
static void test_ucm_near_then_gdr(void **state)
{
	void *at = near_hook(t_near, (void *)ucm_hook);
	(void)state;

	if (!at)
		skip();
	ucm_then_gdr(t_near, at, 0, 0xe9); /* UCX's jmp rel32 */
}
#endif

static void test_ucm_far_then_gdr(void **state)
{
	(void)state;
	ucm_then_gdr(t_far, (void *)ucm_hook, UCM_SIM_FAR, 0x48); /* movabs %rax; jmp *%rax */
}

/* Ours first; UCX's patch over it, while threads call: refused, not a byte written (its decoder
 * knows no E9 / B), our hook still runs. */
static void test_gdr_then_ucm(void **state)
{
	pthread_t th[THREADS];
	const char *why = NULL;
	uint8_t old[16];
	void *o = NULL;
	(void)state;

	assert_int_equal(gdr_patch_install(t_ours, (void *)gdr_hook, (void **)&gdr_orig, 0, &why),
			 0);
	memcpy(old, t_ours, sizeof(old));
	callers_start(th, t_ours);
	assert_int_equal(ucm_sim_patch(t_ours, (void *)ucm_hook, &o, UCM_SIM_FAR, 5, NULL, &why),
			 -ENOTSUP);
	assert_int_equal(ucm_sim_patch(t_ours, (void *)ucm_hook, &o, 0, 5, NULL, &why), -ENOTSUP);
	callers_stop(th);
	assert_null(o);
	assert_memory_equal(t_ours, old, sizeof(old));
	hits_reset();
	assert_int_equal(CALL(t_ours), PLAIN + 2 * HOOKED);
	assert_int_equal(atomic_load(&gdr_hits), 1);
	assert_int_equal(atomic_load(&ucm_hits), 0);
}

/* Inside UCX's grace time the entry jumps to itself: ours is refused (-EBUSY) and says so, and
 * gdr_patch_foreign sees it. */
static void test_ucm_lock(void **state)
{
#if defined(__x86_64__)
	static const uint8_t self[4] = { 0xeb, 0xfe, 0x89, 0xe5 };
#else
	static const uint8_t self[4] = { 0x00, 0x00, 0x00, 0x14 };
#endif
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t pg = (uintptr_t)t_lock & ~(uintptr_t)(page - 1);
	const char *why = NULL, *who = NULL;
	uint8_t old[4];
	void *o = NULL;
	(void)state;

	memcpy(old, t_lock, sizeof(old));
	assert_int_equal(mprotect((void *)pg, page, PROT_READ | PROT_WRITE | PROT_EXEC), 0);
	memcpy(t_lock, self, sizeof(self));
	assert_int_equal(gdr_patch_install(t_lock, (void *)gdr_hook, &o, GDR_PATCH_QUIESCENT, &why),
			 -EBUSY);
	assert_non_null(strstr(why, "itself"));
	assert_int_equal(gdr_patch_foreign(t_lock, &who), 1);
	assert_non_null(strstr(who, "itself"));
	memcpy(t_lock, old, sizeof(old));
	assert_int_equal(mprotect((void *)pg, page, PROT_READ | PROT_EXEC), 0);
	assert_int_equal(gdr_patch_foreign(t_lock, &who), 0);
}

/* UCX restoring its saved bytes over our chain (its library never does: no restore point for
 * CUDA; its gtest does for malloc hooks). Its restore is a plain copy, unsafe for threads calling
 * the entry whoever patched it, so none do here. Every call is right, orig (an absolute jump to
 * UCX's hook) still works, and our hook is gone with UCX's: the bytes we wrote are overwritten,
 * and a free through the entry would be lost. */
static void test_ucm_restore_over_chain(void **state)
{
	struct ucm_sim_restore rp;
	const char *why = NULL;
	(void)state;

	assert_int_equal(ucm_sim_patch(t_rest, (void *)ucm_hook, (void **)&ucm_orig, UCM_SIM_FAR, 5,
				       &rp, &why),
			 0);
	assert_int_equal(gdr_patch_install(t_rest, (void *)gdr_hook, (void **)&gdr_orig, 0, &why),
			 0);
	assert_int_equal(CALL(t_rest), PLAIN + 3 * HOOKED);
	assert_int_equal(ucm_sim_restore(&rp), 0);
	hits_reset();
	assert_int_equal(CALL(t_rest), PLAIN);
	assert_int_equal(atomic_load(&gdr_hits), 0);
	assert_true(gdr_patch_is_patched(t_rest));         /* the table does not know */
	assert_int_equal(gdr_orig(20, 2), PLAIN + HOOKED); /* orig still reaches UCX's hook */
}

/* gdr_patch_foreign: a fresh entry, UCX's far patch (its hook outside the object: in memory of
 * no object here), not our own patch, not mapped memory. */
static void test_foreign(void **state)
{
	const char *who = NULL;
	void *hook = near_hook(t_foreign, (void *)ucm_hook), *o;
	(void)state;

	if (!hook)
		skip();
	assert_int_equal(gdr_patch_foreign(t_foreign, &who), 0);
	assert_int_equal(gdr_patch_foreign(NULL, &who), 0);
	assert_int_equal(gdr_patch_foreign((void *)16, &who), 0); /* not mapped */
	assert_int_equal(ucm_sim_patch(t_foreign, hook, &o, UCM_SIM_FAR, 5, NULL, &who), 0);
	assert_int_equal(gdr_patch_foreign(t_foreign, &who), 1);
	assert_non_null(strstr(who, "UCX"));
	print_message("found: %s\n", who);
	assert_int_equal(gdr_patch_foreign(t_ours, &who), 0); /* ours (test_gdr_then_ucm) */
}

/* ---- libgdrcache's hooks over the fake libcuda ------------------------------------------------ */

gdr_CUresult cuInit(unsigned int flags);
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);

typedef gdr_CUresult (*free_fn)(gdr_CUdeviceptr);
static free_fn ucm_free_orig;
static atomic_long ucm_free_hits;

static gdr_CUresult ucm_free_hook(gdr_CUdeviceptr p)
{
	atomic_fetch_add(&ucm_free_hits, 1);
	return __atomic_load_n(&ucm_free_orig, __ATOMIC_ACQUIRE)(p);
}

static gdr_CUresult free_r0; /* what the fake answers for a VA it never allocated */
static atomic_long fcalls, fwrong;

static void *freer(void *arg)
{
	uint64_t va = 0x7000000000ull + ((uint64_t)(uintptr_t)arg << 32);

	while (!atomic_load(&stop)) {
		if (cuMemFree_v2(va++) != free_r0)
			atomic_fetch_add(&fwrong, 1);
		atomic_fetch_add(&fcalls, 1);
	}
	return NULL;
}

static struct gdr_intercept_stats istats(void)
{
	struct gdr_intercept_stats s;

	assert_int_equal(gdr_intercept_get_stats(&s, sizeof(s)), 0);
	return s;
}

/* Frees n VAs one by one: each must be a free event of libgdrcache's ring. */
static void frees_seen(unsigned n)
{
	uint64_t head = gdr_events_head(), va0 = 0x6100000000ull;
	long u0 = atomic_load(&ucm_free_hits);
	unsigned seen = 0;

	for (unsigned i = 0; i < n; i++)
		assert_int_equal(cuMemFree_v2(va0 + (uint64_t)i * 4096), free_r0);
	for (uint64_t s = head; s < gdr_events_head(); s++) {
		struct gdr_event ev;

		if (!gdr_events_get(s, &ev) && ev.kind == GDR_EV_FREE && ev.start >= va0 &&
		    ev.start < va0 + (uint64_t)n * 4096)
			seen++;
	}
	assert_int_equal(seen, n);
	print_message("%u frees: %u events, %ld calls of UCX's hook\n", n, seen,
		      atomic_load(&ucm_free_hits) - u0);
}

static void ucm_first(void **state)
{
	pthread_t th[THREADS];
	struct gdr_intercept_stats s;
	const char *why = NULL;
	long before;
	int rc;
	(void)state;

	assert_int_equal(cuInit(0), GDR_CUDA_SUCCESS);
	free_r0 = cuMemFree_v2(0x5000000000ull);
	rc = ucm_sim_patch((void *)cuMemFree_v2, (void *)ucm_free_hook, (void **)&ucm_free_orig, 0,
			   50, NULL, &why);
#if defined(__aarch64__)
	/* the fake's entry is STP, MOV, BL: UCX's decoder cannot relocate its BL */
	assert_int_equal(rc, -ENOTSUP);
	print_message("UCX's bistro refused the fake's aarch64 entry: %s\n", why);
#else
	assert_int_equal(rc, 0);
	assert_int_equal(*(uint8_t *)(void *)cuMemFree_v2, 0x48); /* far: the hook is in the exe */
	assert_int_equal(cuMemFree_v2(0x5000000000ull), free_r0);
	assert_int_equal(atomic_load(&ucm_free_hits), 1);
#endif
	atomic_store(&stop, false);
	for (long i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, freer, (void *)i), 0);
	while (atomic_load(&fcalls) < 1000)
		sched_yield();
	s = istats(); /* loads libcuda: libgdrcache patches its entries while the threads free */
	if (s.state)
		fail_msg("libgdrcache over UCX's patch: %d %s", s.state, s.reason);
	before = atomic_load(&fcalls);
	while (atomic_load(&fcalls) < before + 1000)
		sched_yield();
	atomic_store(&stop, true);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&fwrong), 0);
	assert_true(gdr_patch_is_patched((void *)cuMemFree_v2));
	before = atomic_load(&ucm_free_hits);
	frees_seen(100);
#if defined(__x86_64__)
	assert_int_equal(atomic_load(&ucm_free_hits), before + 100); /* both hooks, every free */
#endif
}

static void gdr_first(void **state)
{
	pthread_t th[THREADS];
	struct gdr_intercept_stats s;
	const char *why = NULL;
	uint8_t old[16];
	uint64_t f0, seen, made;
	long after;
	(void)state;

	assert_int_equal(cuInit(0), GDR_CUDA_SUCCESS);
	s = istats();
	if (s.state)
		fail_msg("libgdrcache alone: %d %s", s.state, s.reason);
	free_r0 = cuMemFree_v2(0x5000000000ull);
	memcpy(old, (void *)cuMemFree_v2, sizeof(old));
	atomic_store(&stop, false);
	for (long i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, freer, (void *)i), 0);
	while (atomic_load(&fcalls) < 1000)
		sched_yield();
	f0 = istats().frees[GDR_FREE_MEM_FREE];
	after = atomic_load(&fcalls);
	assert_int_equal(ucm_sim_patch((void *)cuMemFree_v2, (void *)ucm_free_hook,
				       (void **)&ucm_free_orig, 0, 50, NULL, &why),
			 -ENOTSUP);
	print_message("UCX's bistro over libgdrcache's patch: %s\n", why);
	while (atomic_load(&fcalls) < after + 1000)
		sched_yield();
	atomic_store(&stop, true);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&fwrong), 0);
	/* every free the threads made since f0 was read was seen (a call counts itself after the
	 * hook did: up to THREADS of them were counted by the hook before f0) */
	seen = istats().frees[GDR_FREE_MEM_FREE] - f0;
	made = (uint64_t)(atomic_load(&fcalls) - after);
	print_message("frees while UCX's patch was tried: %llu made, %llu seen\n",
		      (unsigned long long)made, (unsigned long long)seen);
	assert_true(seen + THREADS >= made);
	assert_memory_equal((void *)cuMemFree_v2, old, sizeof(old));
	assert_int_equal(atomic_load(&ucm_free_hits), 0);
	frees_seen(100);
}

/* GDRCACHE_INTERCEPT=yield (its ctest entry sets it): libgdrcache steps aside. */
static void ucm_yield(void **state)
{
	struct gdr_intercept_stats s;
	const char *why = NULL;
	uint8_t after_ucm[16];
	long before;
	(void)state;

	assert_string_equal(getenv("GDRCACHE_INTERCEPT"), "yield");
	assert_int_equal(cuInit(0), GDR_CUDA_SUCCESS);
	free_r0 = cuMemFree_v2(0x5000000000ull);
	if (ucm_sim_patch((void *)cuMemFree_v2, (void *)ucm_free_hook, (void **)&ucm_free_orig, 0,
			  50, NULL, &why))
		skip(); /* UCX's decoder cannot relocate this entry (the fake's aarch64 one) */
	memcpy(after_ucm, (void *)cuMemFree_v2, sizeof(after_ucm));
	s = istats(); /* loads libcuda: yield finds UCX's jump */
	print_message("yield: %d %s\n", s.state, s.reason);
	assert_int_equal(s.state, -EBUSY);
	assert_non_null(strstr(s.reason, "yield: cuMemFree_v2 already patched"));
	assert_int_equal(gdr_mem_events_state(&why), -EBUSY);
	assert_memory_equal((void *)cuMemFree_v2, after_ucm, sizeof(after_ucm)); /* untouched */
	assert_false(gdr_patch_is_patched((void *)cuMemFree_v2));
	before = atomic_load(&ucm_free_hits);
	for (int i = 0; i < 100; i++)
		assert_int_equal(cuMemFree_v2(0x6100000000ull + (uint64_t)i * 4096), free_r0);
	assert_int_equal(atomic_load(&ucm_free_hits), before + 100);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest patch[] = {
#if defined(__x86_64__)
		cmocka_unit_test(test_ucm_near_then_gdr),
#endif
		cmocka_unit_test(test_ucm_far_then_gdr),
		cmocka_unit_test(test_gdr_then_ucm),
		cmocka_unit_test(test_ucm_lock),
		cmocka_unit_test(test_ucm_restore_over_chain),
		cmocka_unit_test(test_foreign),
	};
	const struct CMUnitTest ucm[] = { cmocka_unit_test(ucm_first) };
	const struct CMUnitTest gdr[] = { cmocka_unit_test(gdr_first) };
	const struct CMUnitTest yield[] = { cmocka_unit_test(ucm_yield) };

	if (!gdr_patch_arch()) {
		printf("no entry patcher on this architecture: skipped\n");
		return 77;
	}
	if (argc == 2 && !strcmp(argv[1], "ucm-first"))
		return cmocka_run_group_tests(ucm, NULL, NULL);
	if (argc == 2 && !strcmp(argv[1], "gdr-first"))
		return cmocka_run_group_tests(gdr, NULL, NULL);
	if (argc == 2 && !strcmp(argv[1], "ucm-yield"))
		return cmocka_run_group_tests(yield, NULL, NULL);
	return cmocka_run_group_tests(patch, NULL, NULL);
}
#endif
