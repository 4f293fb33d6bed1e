/* SPDX-License-Identifier: MIT */
/* The entry patcher (lib/intercept/patch.c): assembly targets with libcuda's prologue are patched and reach
 * the hook by every route, orig behaves as the original, refused entries stay untouched, threads
 * calling a target while it is patched always get a right answer, the fake driver's entries are
 * patched as libcuda's would be, and the decoders accept exactly what they claim. Skips (77) on an
 * architecture without a patcher. Arguments: the fake libcuda.so.1 and its bad-entry build. */
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

#include "deadline.h"
#include "intercept/patch.h"
#include "intercept/stop_world.h"

#if !defined(__x86_64__) && !defined(__aarch64__)
int main(void)
{
	printf("no entry patcher on this architecture: skipped\n");
	return 77;
}
#else
typedef long (*fn6)(long, long, long, long, long, long);

/* What every target computes; each argument weighs differently, so a lost or swapped one shows. */
long patch_test_body(long a, long b, long c, long d, long e, long f);
__attribute__((noinline, used)) long patch_test_body(long a, long b, long c, long d, long e, long f)
{
	unsigned long r = (unsigned long)a * 3 + (unsigned long)b * 5 + (unsigned long)c * 7 +
			  (unsigned long)d * 11 + (unsigned long)e * 13 + (unsigned long)f * 17;

	return (long)(r >> 1); /* the hooks add HOOKED without overflowing */
}

int patch_test_flag; /* what the targets' RIP-relative instructions read */
int patch_test_data[16];

#define TARGETS(X)                                                                                 \
	X(t_basic)                                                                                 \
	X(t_cas16)                                                                                 \
	X(t_conc)                                                                                  \
	X(t_two_a) X(t_two_b) X(t_rip) X(t_rip2) X(t_call) X(t_jmp) X(t_unknown) X(t_straddle)     \
		X(t_adrp) X(t_b) X(t_ldr_lit) X(t_cbz) X(t_rip3) X(t_near) X(t_lc)
#define NLC                                                                                        \
	32 /* libcuda-style targets patched under calling threads, LC_SIZE bytes apart; t_lc
	    * holds 2 * NLC: a set for each form */
#define LC_SIZE 64
#define X(n) extern char n[];
TARGETS(X)
#undef X

#define ASM_FN(name) ".globl " #name "\n.hidden " #name "\n.type " #name ", %function\n"

#if defined(__x86_64__)
/* libcuda 580.159.04's entry (docs/FACTS.md, "libcuda's entry bytes"): push rbp; mov rbp,rsp;
 * push r12; sub rsp,8; cmp [rip]. */
#define LIBCUDA_BODY                                                                                    \
	"push %rbp\nmov %rsp, %rbp\npush %r12\nsub $8, %rsp\ncmpl $0x12345678, patch_test_flag(%rip)\n" \
	"call patch_test_body\nadd $8, %rsp\npop %r12\npop %rbp\nret\n"
#define LIBCUDA_TARGET(name, skip)                                                                 \
	ASM_FN(name)                                                                               \
	".p2align 4\n.if " #skip "\n.skip " #skip ", 0xcc\n.endif\n" #name ":\n" LIBCUDA_BODY      \
	".size " #name ", . - " #name "\n"
__asm__(".pushsection .text\n" LIBCUDA_TARGET(t_basic, 0)
		LIBCUDA_TARGET(t_cas16,
			       4) /* [entry, entry + 5) in one 16-byte block, not one 8-byte word */
	LIBCUDA_TARGET(t_two_a, 0) LIBCUDA_TARGET(t_two_b, 3)
		LIBCUDA_TARGET(t_straddle, 12) /* 5 bytes across a 16-byte boundary */
	/* One 7-byte instruction covers the jump: no thread can be inside what moves. (With
	 * libcuda's three-instruction prologue a thread stopped after the first one resumes inside
	 * the jump: 4 crashes in 40 patches with 8 threads calling on 2 cores; see patch.c.) */
	ASM_FN(t_conc) ".p2align 4\nt_conc:\n.byte 0x48, 0x81, 0xec, 0x88, 0, 0, 0\n"
		       "call patch_test_body\nadd $0x88, %rsp\nret\n.size t_conc, . - t_conc\n" ASM_FN(t_rip) ".p2align 4\nt_rip:\nmov patch_test_flag(%rip), %eax\nret\n" ASM_FN(t_rip2) ".p2align 4\nt_rip2:\npush %rbp\nmov patch_test_flag(%rip), %eax\npop %rbp\nret\n" ASM_FN(
			       t_call) ".p2align 4\nt_call:\ncall patch_test_body\nret\n" ASM_FN(t_jmp) ".p2align 4\nt_jmp:\njmp patch_test_body\n" ASM_FN(t_unknown) ".p2align 4\nt_unknown:\nud2\nnop\nnop\nnop\nret\n" ASM_FN(t_rip3) ".p2align 4\nt_rip3:\npush %rbp\nmov patch_test_flag(%rip), %eax\npop %rbp\nret\n"
	/* push rbp; mov $0,%eax: bytes 1-4 (b8 00 00 00) name t_near + 189, inside this program's
	 * text: the one-byte form's stub cannot go there */
	ASM_FN(t_near) ".p2align 4\nt_near:\npush %rbp\nmov $0, %eax\npop %rbp\n"
		       "call patch_test_body\nret\n.skip 200, 0xcc\n"
	/* 2 * NLC copies of libcuda's entry, LC_SIZE bytes apart */
	ASM_FN(t_lc) ".p2align 6\nt_lc:\n.rept 64\n.p2align 6\n" LIBCUDA_BODY ".endr\n"
	/* aarch64's cases do not exist here */
	ASM_FN(t_adrp) "t_adrp:\n" ASM_FN(t_b) "t_b:\n" ASM_FN(t_ldr_lit) "t_ldr_lit:\n" ASM_FN(
		t_cbz) "t_cbz:\nret\n"
		       ".popsection\n");
#elif defined(__aarch64__)
#define LIBCUDA_BODY                                                                               \
	"stp x29, x30, [sp, #-16]!\nmov x29, sp\nbl patch_test_body\nldp x29, x30, [sp], #16\nret\n"
#define LIBCUDA_TARGET(name)                                                                       \
	ASM_FN(name) ".p2align 4\n" #name ":\n" LIBCUDA_BODY ".size " #name ", . - " #name "\n"
__asm__(".pushsection .text\n" LIBCUDA_TARGET(t_basic) LIBCUDA_TARGET(t_cas16) LIBCUDA_TARGET(
	t_conc) LIBCUDA_TARGET(t_two_a) LIBCUDA_TARGET(t_two_b)
		ASM_FN(t_adrp) ".p2align 4\nt_adrp:\nadrp x16, patch_test_flag\nret\n" ASM_FN(t_b) ".p2align 4\nt_b:\nb patch_test_body\n" ASM_FN(t_ldr_lit) ".p2align 4\nt_ldr_lit:\nldr x0, 1f\nret\n1: .quad 0\n" ASM_FN(
			t_cbz) ".p2align 4\nt_cbz:\ncbz x0, 1f\n1: ret\n" ASM_FN(t_call) ".p2align 4\nt_call:\nbl patch_test_body\nret\n" ASM_FN(t_unknown) ".p2align 4\nt_unknown:\nmrs x0, tpidr_el0\nret\n" ASM_FN(t_lc) ".p2align 6\nt_lc:\n.rept 64\n.p2align 6\n" LIBCUDA_BODY
																											    ".endr\n"
	/* x86-64's cases do not exist here */
	ASM_FN(t_rip3) "t_rip3:\n" ASM_FN(t_near) "t_near:\nret\n" ASM_FN(t_rip) "t_rip:\n" ASM_FN(
		t_rip2) "t_rip2:\n" ASM_FN(t_jmp) "t_jmp:\n" ASM_FN(t_straddle) "t_straddle:\nret\n"
										".popsection\n");
#endif

#define A1 0x0101010101010101L
#define A2 (-0x0202020202020202L)
#define A3 0x0303030303030303L
#define A4 0x7fffffff00000004L
#define A5 (-5L)
#define A6 0x0606060606060606L
#define HOOKED 1000 /* what the hooks add to the result */

/* A hook for each target: counts, checks its arguments, calls orig. */
#define HOOK(n)                                                                                    \
	static fn6 n##_orig;                                                                       \
	static atomic_long n##_hits;                                                               \
	static long n##_hook(long a, long b, long c, long d, long e, long f)                       \
	{                                                                                          \
		fn6 o = __atomic_load_n(&n##_orig, __ATOMIC_ACQUIRE);                              \
		atomic_fetch_add(&n##_hits, 1);                                                    \
		return o(a, b, c, d, e, f) + HOOKED;                                               \
	}
HOOK(t_basic)
HOOK(t_cas16)
HOOK(t_two_a)
HOOK(t_two_b)

static long other_hook(long a, long b, long c, long d, long e, long f)
{
	/* unsigned: the cases pass addresses and large values (no signed overflow) */
	return (long)((unsigned long)a + (unsigned long)b + (unsigned long)c + (unsigned long)d +
		      (unsigned long)e + (unsigned long)f);
}

/* The protection of the mapping holding p, as /proc/self/maps writes it ("r-xp"). */
static void perms_of(const void *p, char out[5])
{
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long lo, hi;
	char perms[5], line[512];

	assert_non_null(f);
	strcpy(out, "none");
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && (uintptr_t)p >= lo &&
		    (uintptr_t)p < hi) {
			memcpy(out, perms, 5);
			break;
		}
	}
	fclose(f);
}

static long call6(fn6 f)
{
	return f(A1, A2, A3, A4, A5, A6);
}

#define EXPECTED patch_test_body(A1, A2, A3, A4, A5, A6)

/* Patch, hook, orig, a pointer taken before, a second install, the table. */
static void test_basic(void **state)
{
	volatile fn6 before = (fn6)(void *)t_basic; /* resolved before the patch */
	uint8_t old[16];
	char perms_before[5], perms_after[5];
	const char *why = NULL;
	void *orig2 = NULL;
	(void)state;

	memcpy(old, t_basic, sizeof(old));
	perms_of(t_basic, perms_before);
	assert_int_equal(call6(before), EXPECTED);
	assert_false(gdr_patch_is_patched(t_basic));

	assert_int_equal(gdr_patch_install(t_basic, (void *)t_basic_hook, (void **)&t_basic_orig, 0,
					   &why),
			 0);
	assert_non_null(t_basic_orig);
	assert_true(gdr_patch_is_patched(t_basic));
	assert_false(gdr_patch_is_patched(t_cas16));
	assert_false(gdr_patch_is_patched(NULL));

	/* A direct call, the pointer taken before, orig alone. */
	assert_int_equal(call6((fn6)(void *)t_basic), EXPECTED + HOOKED);
	assert_int_equal(atomic_load(&t_basic_hits), 1);
	assert_int_equal(call6(before), EXPECTED + HOOKED);
	assert_int_equal(atomic_load(&t_basic_hits), 2);
	assert_int_equal(call6(t_basic_orig), EXPECTED);
	assert_int_equal(atomic_load(&t_basic_hits), 2);

	/* The entry is a branch; the rest of the function is untouched. */
#if defined(__x86_64__)
	/* the one-byte form: only the first byte changed (its stub ~1 GiB above, at the address
	 * bytes 1-4 name, is free in this small process) */
	assert_int_equal((uint8_t)t_basic[0], 0xe9);
	assert_memory_equal(t_basic + 1, old + 1, sizeof(old) - 1);
#else
	uint32_t insn;

	memcpy(&insn, t_basic, 4);
	assert_int_equal(insn & 0xfc000000, 0x14000000);
	assert_memory_equal(t_basic + 4, old + 4, sizeof(old) - 4);
#endif
	/* The target's protection restored; the trampoline executable, not writable. */
	perms_of(t_basic, perms_after);
	assert_string_equal(perms_after, perms_before);
	perms_of(t_basic_orig, perms_after);
	assert_string_equal(perms_after, "r-xp");

	/* Again, even with another hook: the same orig, the first hook stays. */
	assert_int_equal(gdr_patch_install(t_basic, (void *)other_hook, &orig2, 0, &why), 0);
	assert_ptr_equal(orig2, t_basic_orig);
	assert_int_equal(call6((fn6)(void *)t_basic), EXPECTED + HOOKED);
	assert_int_equal(atomic_load(&t_basic_hits), 3);
}

/* An entry that one 8-byte store cannot write but one 16-byte compare-and-swap can (x86-64). */
static void test_cas16(void **state)
{
	const char *why = NULL;
	(void)state;

#if defined(__x86_64__)
	assert_int_equal((uintptr_t)t_cas16 & 15, 4);
#endif
	assert_int_equal(gdr_patch_install(t_cas16, (void *)t_cas16_hook, (void **)&t_cas16_orig,
					   GDR_PATCH_QUIESCENT | GDR_PATCH_NO_SHORT, &why),
			 0);
	assert_int_equal(call6((fn6)(void *)t_cas16), EXPECTED + HOOKED);
	assert_int_equal(call6(t_cas16_orig), EXPECTED);
	assert_int_equal(atomic_load(&t_cas16_hits), 1);
}

/* Two patches share a trampoline page; each keeps its own hook and orig. */
static void test_two(void **state)
{
	const char *why = NULL;
	long pg = sysconf(_SC_PAGESIZE);
	(void)state;

	assert_int_equal(gdr_patch_install(t_two_a, (void *)t_two_a_hook, (void **)&t_two_a_orig,
					   GDR_PATCH_QUIESCENT | GDR_PATCH_NO_SHORT, &why),
			 0);
	assert_int_equal(gdr_patch_install(t_two_b, (void *)t_two_b_hook, (void **)&t_two_b_orig,
					   GDR_PATCH_QUIESCENT | GDR_PATCH_NO_SHORT, &why),
			 0);
	assert_true(t_two_a_orig != t_two_b_orig);
	assert_int_equal((uintptr_t)t_two_a_orig / pg, (uintptr_t)t_two_b_orig / pg);
	assert_int_equal(call6((fn6)(void *)t_two_a), EXPECTED + HOOKED);
	assert_int_equal(call6((fn6)(void *)t_two_b), EXPECTED + HOOKED);
	assert_int_equal(call6((fn6)(void *)t_two_b), EXPECTED + HOOKED);
	assert_int_equal(atomic_load(&t_two_a_hits), 1);
	assert_int_equal(atomic_load(&t_two_b_hits), 2);
}

/* Refused: the error, a reason, and not one byte changed (flags: how it was asked). */
static void refused_flags(void *target, int err, unsigned flags)
{
	uint8_t old[16];
	const char *why = NULL;
	void *orig = (void *)&orig;

	memcpy(old, target, sizeof(old));
	assert_int_equal(gdr_patch_install(target, (void *)other_hook, &orig, flags, &why), err);
	assert_non_null(why);
	assert_memory_equal(target, old, sizeof(old));
	assert_ptr_equal(orig, (void *)&orig);
	assert_false(gdr_patch_is_patched(target));
}

/* The five-byte form's decoder refuses (the one-byte form moves the first instruction only). */
static void refused(void *target, int err)
{
	refused_flags(target, err, GDR_PATCH_QUIESCENT | GDR_PATCH_NO_SHORT);
}

static void test_refused(void **state)
{
	void *orig;
	const char *why;
	(void)state;

#if defined(__x86_64__)
	refused(t_rip, -ENOTSUP);  /* RIP-relative first instruction */
	refused(t_rip2, -ENOTSUP); /* RIP-relative second instruction */
	refused(t_call, -ENOTSUP);
	refused(t_unknown, -ENOTSUP); /* ud2 */
	refused(t_straddle, -EINVAL); /* [entry, entry + 5) across 16 bytes */
	assert_int_equal((uintptr_t)t_straddle & 15, 12);
#elif defined(__aarch64__)
	refused(t_adrp, -ENOTSUP);
	refused(t_ldr_lit, -ENOTSUP); /* an LDR literal not followed by BR of its register */
	refused(t_cbz, -ENOTSUP);
	refused(t_call, -ENOTSUP);    /* BL */
	refused(t_unknown, -ENOTSUP); /* MRS */
	assert_int_equal(gdr_patch_arch()->can_store(t_basic + 2), -EINVAL);
#endif
	/* Not code; NULL arguments. */
	refused(patch_test_data, -EINVAL);
	assert_int_equal(gdr_patch_install(NULL, (void *)other_hook, &orig, 0, &why), -EINVAL);
	assert_int_equal(gdr_patch_install(t_conc, NULL, &orig, 0, &why), -EINVAL);
	assert_int_equal(gdr_patch_install(t_conc, (void *)other_hook, NULL, 0, &why), -EINVAL);
	assert_int_equal(gdr_patch_install(NULL, NULL, NULL, 0, NULL), -EINVAL); /* why NULL */
}

/* An entry that is one jump (x86-64 jmp rel32, aarch64 B: another patcher's, or a thunk) is
 * chained without GDR_PATCH_QUIESCENT: the jump replaced by ours, orig an absolute jump to where
 * it went (tests/unit/test_two_patchers.c: UCX's forms). */
static void test_chain_jump(void **state)
{
#if defined(__x86_64__)
	void *target = t_jmp;
#else
	void *target = t_b;
#endif
	const char *why = NULL;
	fn6 o = NULL;
	(void)state;

	if (gdr_patch_install(target, (void *)other_hook, (void **)&o, 0, &why))
		fail_msg("a jump at the entry refused: %s", why);
	assert_true(gdr_patch_is_patched(target));
	assert_int_equal(call6((fn6)target), other_hook(A1, A2, A3, A4, A5, A6)); /* the hook */
	assert_int_equal(call6(o), EXPECTED);                 /* orig: the jump's destination */
	assert_int_equal(gdr_patch_foreign(target, &why), 0); /* ours, and to its own object */
}

/* The calling threads' progress, waited for: its deadline (times GDR_TEST_WAIT_SCALE), for what
 * takes milliseconds. Before any patch a thread that makes no calls is the machine's (skip);
 * after one, the patch's (fail). */
#define WAIT_MS 60000

/* Sleeps step at a time until *calls reaches want, or the deadline passes: whether it did. */
static bool calls_reach(atomic_long *calls, long want, const struct timespec *step,
			int64_t deadline)
{
	while (atomic_load(calls) < want) {
		if (gdr_deadline_passed(deadline))
			return atomic_load(calls) >= want;
		nanosleep(step, NULL);
	}
	return true;
}

/* Threads call a target in a tight loop while it is patched. */
#define CONC_THREADS 8
static fn6 conc_orig;
static atomic_bool conc_stop, conc_patched;
static atomic_long conc_calls, conc_after, conc_wrong, conc_missed;
static __thread bool conc_in_hook;

static long conc_hook(long a, long b, long c, long d, long e, long f)
{
	fn6 o = __atomic_load_n(&conc_orig, __ATOMIC_ACQUIRE);

	conc_in_hook = true;
	return o(a, b, c, d, e, f) + HOOKED;
}

static void *conc_thread(void *arg)
{
	fn6 volatile fp = (fn6)(void *)t_conc;
	long i = (long)(uintptr_t)arg << 32;

	while (!atomic_load_explicit(&conc_stop, memory_order_relaxed)) {
		bool after = atomic_load(&conc_patched);
		long r, want_r;

		conc_in_hook = false;
		r = fp(A1 + i, A2, A3, A4, A5, A6 - i);
		want_r = patch_test_body(A1 + i, A2, A3, A4, A5, A6 - i) +
			 (conc_in_hook ? HOOKED : 0);
		if (r != want_r)
			atomic_fetch_add(&conc_wrong, 1);
		if (after && !conc_in_hook)
			atomic_fetch_add(&conc_missed, 1);
		if (after)
			atomic_fetch_add_explicit(&conc_after, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&conc_calls, 1, memory_order_relaxed);
		i++;
	}
	return NULL;
}

static void test_concurrent(void **state)
{
	pthread_t th[CONC_THREADS];
	struct timespec ms = { 0, 1000000 };
	const char *why = NULL;
	long calls;
	(void)state;

	for (long i = 0; i < CONC_THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, conc_thread, (void *)(uintptr_t)i),
				 0);
	if (!calls_reach(&conc_calls, 10000, &ms, gdr_deadline_ms(WAIT_MS))) {
		atomic_store(&conc_stop, true);
		for (int i = 0; i < CONC_THREADS; i++)
			pthread_join(th[i], NULL);
		print_message("%d threads made %ld calls of an unpatched target in %lld s: too "
			      "slow a machine for the case\n",
			      CONC_THREADS, atomic_load(&conc_calls), gdr_deadline_s(WAIT_MS));
		skip();
	}
	assert_int_equal(gdr_patch_install(t_conc, (void *)conc_hook, (void **)&conc_orig, 0, &why),
			 0);
	atomic_store(&conc_patched, true);
	calls = atomic_load(&conc_calls);
	if (!calls_reach(&conc_calls, calls + 10000, &ms, gdr_deadline_ms(WAIT_MS))) {
		atomic_store(&conc_stop, true); /* not joined: they may be stuck in the target */
		fail_msg("the threads calling t_conc made %ld calls in %lld s once it was patched",
			 atomic_load(&conc_calls) - calls, gdr_deadline_s(WAIT_MS));
	}
	for (int i = 0; i < 20; i++)
		nanosleep(&ms, NULL);
	atomic_store(&conc_stop, true);
	for (int i = 0; i < CONC_THREADS; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&conc_wrong), 0);
	assert_int_equal(atomic_load(&conc_missed), 0);
	assert_true(atomic_load(&conc_after) > 0);
}

/* libcuda's three-instruction entry, patched while 8 threads call it, NLC times: every call right.
 * The five-byte form crashed here (a thread stopped after push rbp resumed inside the jump); the
 * one-byte form leaves every byte after the first as it was (x86-64); aarch64 moves one
 * instruction. Asked without GDR_PATCH_QUIESCENT, as for a libcuda already in use. */
static fn6 lc_orig[2 * NLC];
static atomic_int lc_cur = -1;
static atomic_bool lc_stop;
static atomic_long lc_calls, lc_wrong;

static __thread int lc_mine; /* the target this thread is calling */
static unsigned lc_moved;    /* threads moved out of an entry by the stopped form's patches */

static long lc_hook(long a, long b, long c, long d, long e, long f)
{
	fn6 o = __atomic_load_n(&lc_orig[lc_mine], __ATOMIC_ACQUIRE);

	conc_in_hook = true;
	return o(a, b, c, d, e, f) + HOOKED;
}

static void *lc_thread(void *arg)
{
	long k = (long)(uintptr_t)arg;

	while (!atomic_load_explicit(&lc_stop, memory_order_relaxed)) {
		int i = atomic_load(&lc_cur);
		fn6 fp = (fn6)(void *)(t_lc + (size_t)i * LC_SIZE);
		long r, want;

		lc_mine = i;
		conc_in_hook = false;
		r = fp(A1 + k, A2, A3, A4, A5, A6);
		want = patch_test_body(A1 + k, A2, A3, A4, A5, A6) + (conc_in_hook ? HOOKED : 0);
		if (r != want)
			atomic_fetch_add(&lc_wrong, 1);
		atomic_fetch_add_explicit(&lc_calls, 1, memory_order_relaxed);
		k++;
	}
	return NULL;
}

/* Patches targets first..first + NLC - 1 of t_lc (flags as given) under the calling threads. */
static void lc_run(int first, unsigned flags)
{
	pthread_t th[CONC_THREADS];
	struct timespec us = { 0, 100000 };
	const char *why = NULL;

	atomic_store(&lc_stop, false);
	atomic_store(&lc_calls, 0);
	atomic_store(&lc_wrong, 0);
	atomic_store(&lc_cur, first);
	for (long i = 0; i < CONC_THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, lc_thread, (void *)(uintptr_t)i), 0);
	for (int i = first; i < first + NLC; i++) {
		long calls;

		atomic_store(&lc_cur, i);
		calls = atomic_load(&lc_calls);
		if (!calls_reach(&lc_calls, calls + 2000, &us, gdr_deadline_ms(WAIT_MS))) {
			atomic_store(&lc_stop, true);
			if (i > first) /* not joined: they may be stuck in a patched target */
				fail_msg("the calling threads made %ld calls in %lld s after "
					 "target %d was patched",
					 atomic_load(&lc_calls) - calls, gdr_deadline_s(WAIT_MS),
					 i - 1);
			for (int k = 0; k < CONC_THREADS; k++)
				pthread_join(th[k], NULL);
			print_message("%d threads made %ld calls of an unpatched target in %lld s: "
				      "too slow a machine for the case\n",
				      CONC_THREADS, atomic_load(&lc_calls) - calls,
				      gdr_deadline_s(WAIT_MS));
			skip();
		}
		if (gdr_patch_install(t_lc + (size_t)i * LC_SIZE, (void *)lc_hook,
				      (void **)&lc_orig[i], flags, &why))
			fail_msg("patch %d refused: %s", i, why);
		if (gdr_patch_stopped(t_lc + (size_t)i * LC_SIZE))
			lc_moved += gdr_stw_last().relocated;
		calls = atomic_load(&lc_calls);
		if (!calls_reach(&lc_calls, calls + 2000, &us, gdr_deadline_ms(WAIT_MS))) {
			/* not joined: they may be stuck in the target */
			atomic_store(&lc_stop, true);
			fail_msg("the calling threads made %ld calls in %lld s once target %d was "
				 "patched",
				 atomic_load(&lc_calls) - calls, gdr_deadline_s(WAIT_MS), i);
		}
	}
	atomic_store(&lc_stop, true);
	for (int i = 0; i < CONC_THREADS; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&lc_wrong), 0);
}

static void test_concurrent_libcuda_entry(void **state)
{
	(void)state;
	lc_run(0, 0);
}

/* The same where the one-byte form cannot be used (its stub address taken, or past the top):
 * the five-byte form, written with the other threads stopped, any thread found inside the moved
 * instructions moved to their copy. Refused by the code before it (tag fallback); crashed when
 * written without stopping them (above). */
static void test_concurrent_libcuda_entry_stopped(void **state)
{
	(void)state;
	lc_moved = 0;
	lc_run(NLC, GDR_PATCH_NO_SHORT);
	for (int i = NLC; i < 2 * NLC; i++)
		assert_int_equal(gdr_patch_bytes(t_lc + (size_t)i * LC_SIZE),
				 gdr_patch_arch()->short_dest ? 5 : 4);
	print_message("%d patches with %d threads calling: %u threads moved out of an entry\n", NLC,
		      CONC_THREADS, lc_moved);
}

#if defined(__x86_64__)
/* The one-byte form moves the first instruction only: a RIP-relative second one stays where it
 * is. Where its stub's address is taken, the five-byte form is written only for a quiescent
 * target; otherwise the install is refused, nothing written. */
static void test_short_form(void **state)
{
	uint8_t old[16];
	const char *why = NULL;
	void *o3 = NULL, *on = NULL;
	(void)state;

	memcpy(old, t_rip3, sizeof(old));
	assert_int_equal(gdr_patch_install(t_rip3, (void *)other_hook, &o3, 0, &why), 0);
	assert_int_equal((uint8_t)t_rip3[0], 0xe9);
	assert_memory_equal(t_rip3 + 1, old + 1, sizeof(old) - 1);
	patch_test_flag = 42;
	assert_int_equal(((int (*)(void))o3)(), 42); /* orig: push rbp moved, the rest in place */

	refused_flags(t_near, -EBUSY, GDR_PATCH_NO_STOP);
	memcpy(old, t_near, sizeof(old));
	/* running: the five-byte form with the other threads stopped */
	assert_int_equal(gdr_patch_install(t_near, (void *)other_hook, &on, 0, &why), 0);
	assert_int_equal((uint8_t)t_near[0], 0xe9);
	assert_memory_not_equal(t_near + 1, old + 1, 4); /* the five-byte form */
	assert_true(gdr_patch_stopped(t_near));
	assert_int_equal(gdr_patch_bytes(t_near), 5);
	assert_int_equal(((fn6)on)(A1, A2, A3, A4, A5, A6), EXPECTED);
}

/* libcuda 580's entry where a process without address space randomisation loads it (setarch -R,
 * gdb): within 1 GiB of the top, so that the one-byte form's stub address, about 1 GiB above the
 * entry, is outside what a process can map. Refused for a running target, and saying why; the
 * five-byte form for a quiescent one. The entry is a page mapped near the top (whichever of a few
 * addresses is free); skipped where none is. */
static void test_short_form_outside(void **state)
{
	/* push rbp; mov rbp,rsp; push r12 (libcuda 580's first six bytes); pop r12; pop rbp;
	 * lea rax,[rdi+rsi]; ret */
	static const uint8_t body[] = { 0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x41,
					0x5c, 0x5d, 0x48, 0x8d, 0x04, 0x37, 0xc3 };
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t *p = MAP_FAILED;
	const char *why = NULL;
	void *orig = NULL;
	(void)state;

	/* target + 5 + 0x41e58948 at or above 2^47 from 0x7fffbf000000 on */
	for (uintptr_t at = 0x7fffbf000000; at < 0x7ffff0000000 && p == MAP_FAILED;
	     at += 0x1000000) {
		p = mmap((void *)at, page, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != MAP_FAILED && (uintptr_t)p != at) {
			munmap(p, page);
			p = MAP_FAILED;
		}
	}
	if (p == MAP_FAILED)
		skip();
	memcpy(p, body, sizeof(body));
	assert_int_equal(mprotect(p, page, PROT_READ | PROT_EXEC), 0);
	assert_true((uintptr_t)p + 5 + 0x41e58948 >= 1ULL << 47);

	refused_flags(p, -EBUSY, GDR_PATCH_NO_STOP);
	assert_int_equal(gdr_patch_install(p, (void *)other_hook, &orig, GDR_PATCH_NO_STOP, &why),
			 -EBUSY);
	assert_non_null(strstr(why, "past the top"));
	assert_true(strlen(why) + sizeof("cuMemAlloc_v2: ") <=
		    116); /* gdr_intercept_stats.reason */
	assert_null(strstr(why, "taken"));

	/* running (no GDR_PATCH_QUIESCENT): the five-byte form with the other threads stopped */
	assert_int_equal(gdr_patch_install(p, (void *)other_hook, &orig, 0, &why), 0);
	assert_int_equal(p[0], 0xe9);
	assert_true(gdr_patch_stopped(p));
	assert_int_equal(((fn6)(void *)p)(1, 2, 3, 4, 5, 6), 21);  /* the hook */
	assert_int_equal(((long (*)(long, long))orig)(40, 2), 42); /* the original */
}

/* Trampoline memory where the only free addresses within branch reach lie in the gap below the
 * stack: a library whose neighbours below are a driver's reservation of virtual addresses (the
 * fake CUDA driver's, in the VM) and above it other libraries up to the end of the mappings. The
 * room a stack grows into is left, the rest of that gap used (it was skipped whole, and every
 * entry of such a library refused). Skipped where the addresses it needs are taken. */
static void test_trampoline_below_stack(void **state)
{
	/* libcuda 580's first six bytes, then pop r12; pop rbp; lea rax,[rdi+rsi]; ret */
	static const uint8_t body[] = { 0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x41,
					0x5c, 0x5d, 0x48, 0x8d, 0x04, 0x37, 0xc3 };
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t reach = gdr_patch_arch()->reach, stack = 0, t, lo;
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	uint8_t *p, *below;
	const char *why = NULL;
	void *orig = NULL;
	(void)state;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "[stack]"))
			stack = (uintptr_t)strtoull(line, NULL, 16);
	fclose(f);
	if (!stack)
		skip();
	/* the gaps above the stack (around [vvar] and [vdso], up to the top) taken: only the gap
	 * below it stays free within reach */
	f = fopen("/proc/self/maps", "r");
	assert_non_null(f);
	for (uintptr_t prev = stack; fgets(line, sizeof(line), f);) {
		char *e;
		uintptr_t start = (uintptr_t)strtoull(line, &e, 16), end;

		end = (uintptr_t)strtoull(e + 1, NULL, 16);
		if (start < stack || start >= 1ULL << 47)
			continue;
		if (start > prev)
			mmap((void *)prev, start - prev, PROT_NONE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1,
			     0);
		prev = end;
		if (!strstr(line, "[vdso]"))
			continue;
		mmap((void *)prev, (1ULL << 47) - prev, PROT_NONE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	}
	fclose(f);
	/* the target 256 MiB below the stack, its whole reach below reserved */
	t = (stack - (256ULL << 20)) & ~(uintptr_t)(page - 1);
	lo = t - reach;
	p = mmap((void *)t, page, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p != (void *)t) {
		print_message("the address 256 MiB below the stack is taken\n");
		skip();
	}
	below = mmap((void *)lo, t - lo, PROT_NONE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	if (below != (void *)lo) {
		munmap(p, page);
		print_message("the reach below the target is not free\n");
		skip();
	}
	memcpy(p, body, sizeof(body));
	assert_int_equal(mprotect(p, page, PROT_READ | PROT_EXEC), 0);
	assert_int_equal(gdr_patch_install(p, (void *)other_hook, &orig,
					   GDR_PATCH_QUIESCENT | GDR_PATCH_NO_SHORT, &why),
			 0);
	assert_true((uintptr_t)orig > t &&
		    (uintptr_t)orig < stack);                     /* in the gap below the stack */
	assert_true((uintptr_t)orig < stack - (8ULL << 20));      /* not in its room */
	assert_int_equal(((fn6)(void *)p)(1, 2, 3, 4, 5, 6), 21); /* the hook */
}
#endif

/* The fake driver (tests/fake), whose entries begin as libcuda 580's: its cuMemFree_v2 patched,
 * reached through a pointer taken before, dlsym and cuGetProcAddress; every free and allocation
 * entry accepted; and the build whose cuMemFree_v2 begins with a RIP/PC-relative instruction
 * refused, untouched. The two libraries' paths come as arguments. */
static const char *fake_path, *badentry_path;
typedef int (*free_fn)(unsigned long long);
typedef int (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);
typedef uint64_t (*calls_fn)(const char *);
static free_fn fake_free_orig;
static atomic_long fake_free_hits;

static int fake_free_hook(unsigned long long p)
{
	free_fn o = __atomic_load_n(&fake_free_orig, __ATOMIC_ACQUIRE);

	atomic_fetch_add(&fake_free_hits, 1);
	return o(p);
}

/* The entries the fake simulates: lib/intercept/entries.h's SIM rows. */
#define SIM_ROW(name) #name,
#define NOSIM_ROW(name)
static const char *const fake_entries[] = {
#define GDR_ENTRY(name, kind, route, fake, ...) fake##_ROW(name)
#include "intercept/entries.h"
};

static void test_fake_driver(void **state)
{
	void *h, *fn = NULL, *o;
	free_fn before;
	gpa2_fn gpa2;
	calls_fn calls;
	const char *why = NULL;
	uint64_t n0;
	int r0, status;
	(void)state;

	if (!fake_path)
		skip();
	h = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL); /* never closed: it is patched */
	assert_non_null(h);
	before = (free_fn)dlsym(h, "cuMemFree_v2");
	gpa2 = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
	calls = (calls_fn)dlsym(h, "fake_cuda_calls");
	assert_true(before && gpa2 && calls);
	r0 = before(0x1000); /* not initialised: an error, the same every time */
	n0 = calls("cuMemFree_v2");

	assert_int_equal(gdr_patch_install((void *)before, (void *)fake_free_hook,
					   (void **)&fake_free_orig, 0, &why),
			 0);
	assert_int_equal(before(0x1000), r0);
	assert_int_equal(atomic_load(&fake_free_hits), 1);
	assert_int_equal(gpa2("cuMemFree", &fn, 12000, 0, &status), 0);
	assert_ptr_equal(fn, (void *)before);
	assert_int_equal(((free_fn)fn)(0x1000), r0);
	assert_int_equal(((free_fn)dlsym(h, "cuMemFree_v2"))(0x1000), r0);
	assert_int_equal(atomic_load(&fake_free_hits), 3);
	assert_int_equal(calls("cuMemFree_v2"), n0 + 3); /* orig reached the implementation */

	for (size_t i = 0; i < sizeof(fake_entries) / sizeof(fake_entries[0]); i++) {
		fn = dlsym(h, fake_entries[i]);
		assert_non_null(fn);
		if (gdr_patch_install(fn, (void *)other_hook, &o, GDR_PATCH_QUIESCENT, &why))
			fail_msg("%s refused: %s", fake_entries[i], why);
	}

	h = dlopen(badentry_path, RTLD_NOW | RTLD_LOCAL);
	assert_non_null(h);
	fn = dlsym(h, "cuMemFree_v2");
	assert_non_null(fn);
	refused(fn, -ENOTSUP);
	assert_int_equal(gdr_patch_install(dlsym(h, "cuMemFreeAsync"), (void *)other_hook, &o,
					   GDR_PATCH_QUIESCENT, &why),
			 0);
}

#if defined(__x86_64__)
/* ---- The decoder, one instruction at a time (read from an exactly sized heap copy: ASan sees
 * any read past the instruction) --------------------------------------------------------------- */
struct dcase {
	int len; /* expected length, or -ENOTSUP */
	unsigned n;
	uint8_t b[16];
};
#define OK(len, ...)                                                                               \
	{                                                                                          \
		len, sizeof((uint8_t[]){ __VA_ARGS__ }),                                           \
		{                                                                                  \
			__VA_ARGS__                                                                \
		}                                                                                  \
	}
#define NO(...)                                                                                    \
	{                                                                                          \
		-ENOTSUP, sizeof((uint8_t[]){ __VA_ARGS__ }),                                      \
		{                                                                                  \
			__VA_ARGS__                                                                \
		}                                                                                  \
	}

static const struct dcase dcases[] = {
	/* libcuda 580's entry, instruction by instruction */
	OK(1, 0x55),
	OK(3, 0x48, 0x89, 0xe5),
	OK(2, 0x41, 0x54),
	OK(4, 0x48, 0x83, 0xec, 0x08),
	NO(0x81, 0x3d, 1, 2, 3, 4, 5, 6, 7, 8),
	/* endbr64 */
	OK(4, 0xf3, 0x0f, 0x1e, 0xfa),
	NO(0xf3, 0x0f, 0x1e, 0xfb),
	NO(0xf3, 0x90),
	NO(0xf3, 0x0f, 0x1e),
	/* push */
	OK(1, 0x50),
	OK(1, 0x57),
	OK(2, 0x41, 0x50),
	OK(2, 0x41, 0x57),
	NO(0x48, 0x55),
	NO(0x40, 0x55),
	NO(0x41),
	NO(0x41, 0x58),
	NO(0xff, 0x35, 0, 0, 0, 0),
	/* register to register */
	OK(3, 0x48, 0x8b, 0xec),
	OK(3, 0x4c, 0x89, 0xe7),
	OK(3, 0x49, 0x89, 0xfc),
	OK(2, 0x89, 0xc0),
	OK(2, 0x8b, 0xf8),
	OK(2, 0x31, 0xc0),
	OK(3, 0x45, 0x31, 0xc0),
	OK(2, 0x33, 0xd2),
	OK(3, 0x48, 0x29, 0xc4),
	OK(3, 0x48, 0x01, 0xc4),
	OK(2, 0x85, 0xff),
	OK(3, 0x48, 0x39, 0xf7),
	OK(2, 0x2b, 0xc1),
	OK(2, 0x03, 0xc1),
	OK(2, 0x3b, 0xc1),
	NO(0x48, 0x89, 0x45, 0xf8),
	NO(0x48, 0x89, 0x04, 0x24),
	NO(0x48, 0x8b, 0x05, 1, 2, 3, 4),
	NO(0x8b, 0x05, 1, 2, 3, 4),
	NO(0x48, 0x8b),
	NO(0x89),
	/* immediate to register */
	OK(4, 0x48, 0x83, 0xc4, 0x08),
	OK(4, 0x48, 0x83, 0xe4, 0xf0),
	OK(3, 0x83, 0xe8, 0x01),
	OK(7, 0x48, 0x81, 0xec, 0x88, 0, 0, 0),
	OK(7, 0x48, 0x81, 0xc4, 0x88, 0, 0, 0),
	OK(6, 0x81, 0xe7, 0xff, 0, 0, 0),
	OK(4, 0x49, 0x83, 0xec, 0x08),
	NO(0x48, 0x83, 0xfc, 0x08) /* cmp */,
	NO(0x48, 0x83, 0xcc, 0x08) /* or */,
	NO(0x48, 0x83, 0xc8, 0x08),
	NO(0x48, 0x83, 0x6c, 0x24, 0x08, 0x01) /* memory */,
	NO(0x83, 0x3d, 1, 2, 3, 4, 5) /* cmp [rip] */,
	NO(0x48, 0x81, 0xec, 0x88, 0, 0),
	NO(0x48, 0x83, 0xec),
	OK(5, 0xb8, 1, 0, 0, 0),
	OK(5, 0xbf, 1, 0, 0, 0),
	OK(6, 0x41, 0xb8, 1, 0, 0, 0),
	OK(10, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8),
	NO(0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7),
	NO(0xb8, 1, 0, 0),
	NO(0x48, 0xc7, 0xc0, 1, 0, 0, 0),
	/* nops */
	OK(1, 0x90),
	OK(2, 0x66, 0x90),
	OK(3, 0x0f, 0x1f, 0x00),
	OK(4, 0x0f, 0x1f, 0x40, 0x00),
	OK(5, 0x0f, 0x1f, 0x44, 0x00, 0x00),
	OK(6, 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00),
	OK(7, 0x0f, 0x1f, 0x80, 0, 0, 0, 0),
	OK(8, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0),
	OK(9, 0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0),
	OK(3, 0x0f, 0x1f, 0xc0),
	OK(8, 0x0f, 0x1f, 0x04, 0x25, 0, 0, 0, 0),
	NO(0x0f, 0x1f, 0x05, 0, 0, 0, 0),
	NO(0x0f, 0x1f, 0x48, 0x00),
	NO(0x0f, 0x1f, 0x44, 0x00),
	NO(0x0f, 0x1f, 0x84, 0, 0, 0, 0),
	NO(0x0f, 0x1f, 0x04),
	NO(0x0f, 0x1f),
	NO(0x66, 0x0f, 0x1f),
	NO(0x66, 0x2e, 0x0f, 0x1f, 0x84),
	NO(0x41, 0x90) /* xchg %eax, %r8d */,
	/* branches, calls, returns */
	NO(0xe8, 0, 0, 0, 0),
	NO(0xe9, 0, 0, 0, 0),
	NO(0xeb, 0),
	NO(0xff, 0x25, 0, 0, 0, 0),
	NO(0xff, 0xd0),
	NO(0x41, 0xff, 0xe3),
	NO(0xc3),
	NO(0xc2, 0, 0),
	NO(0x74, 0),
	NO(0x7f, 0),
	NO(0x0f, 0x84, 0, 0, 0, 0),
	NO(0xe3, 0),
	NO(0xf2, 0xc3),
	/* other prefixes, unknown opcodes */
	NO(0xf0, 0x48, 0x01, 0xc4),
	NO(0x2e, 0x90),
	NO(0x3e, 0x90),
	NO(0x64, 0x90),
	NO(0x65, 0x90),
	NO(0x67, 0x90),
	NO(0xcc),
	NO(0x0f, 0x0b),
	NO(0xf4),
	NO(0x0f, 0x05),
	NO(0xc9),
	NO(0x8d, 0x05, 0, 0, 0, 0),
	NO(0x48, 0x8d, 0x64, 0x24, 0x08),
};

static int decode1(const uint8_t *b, unsigned n)
{
	uint8_t *copy = malloc(n);
	const char *why = NULL;
	int rc;

	assert_non_null(copy);
	memcpy(copy, b, n);
	rc = gdr_patch_arch()->insn_len(copy, n, &why);
	if (rc < 0)
		assert_non_null(why);
	free(copy);
	return rc;
}

static void test_decoder_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(dcases) / sizeof(dcases[0]); i++) {
		int rc = decode1(dcases[i].b, dcases[i].n);

		if (rc != dcases[i].len)
			fail_msg("case %zu (first byte %02x, %u bytes): %d, expected %d", i,
				 dcases[i].b[0], dcases[i].n, rc, dcases[i].len);
	}
}

/* Every opcode byte, alone and after REX prefixes, with ModRM c0 (add's register form): what is
 * accepted is exactly the set the decoder claims. Lengths here leave the REX byte out. */
static int claimed(int rex, unsigned op)
{
	bool w = rex >= 0 && (rex & 8);

	if (rex < 0 && ((op >= 0x50 && op <= 0x57) || op == 0x90))
		return 1;
	if (rex == 0x41 && op >= 0x50 && op <= 0x57)
		return 1;
	switch (op) {
	case 0x01:
	case 0x03:
	case 0x29:
	case 0x2b:
	case 0x31:
	case 0x33:
	case 0x39:
	case 0x3b:
	case 0x85:
	case 0x89:
	case 0x8b:
		return 2;
	case 0x83:
		return 3;
	case 0x81:
		return 6;
	}
	if (op >= 0xb8 && op <= 0xbf)
		return w ? 9 : 5;
	return -ENOTSUP;
}

static void test_decoder_sweep(void **state)
{
	static const int rexes[] = { -1, 0x40, 0x41, 0x44, 0x48, 0x49, 0x4c, 0x4d, 0x4f };
	(void)state;

	for (size_t r = 0; r < sizeof(rexes) / sizeof(rexes[0]); r++) {
		for (unsigned op = 0; op < 256; op++) {
			uint8_t b[16] = { 0 };
			unsigned k = 0;
			int want_len = claimed(rexes[r], op), rc;

			if (rexes[r] >= 0)
				b[k++] = rexes[r];
			b[k++] = op;
			b[k] = 0xc0;
			if (want_len > 0)
				want_len += k - 1;
			rc = decode1(b, sizeof(b));
			if (rc != want_len)
				fail_msg("rex %02x op %02x: %d, expected %d", rexes[r] & 0xff, op,
					 rc, want_len);
		}
	}
	/* The immediate groups, every ModRM: only add, and, sub of a register. */
	for (unsigned modrm = 0; modrm < 256; modrm++) {
		uint8_t b[16] = { 0x48, 0x83, modrm };
		unsigned reg = modrm >> 3 & 7;
		int want_len = modrm >> 6 == 3 && (reg == 0 || reg == 4 || reg == 5) ? 4 : -ENOTSUP;

		assert_int_equal(decode1(b, sizeof(b)), want_len);
		b[1] = 0x81;
		assert_int_equal(decode1(b, sizeof(b)), want_len < 0 ? want_len : 7);
	}
}
#endif /* __x86_64__ */

#if defined(__aarch64__)
static void test_decoder_table(void **state)
{
	static const struct {
		uint32_t insn;
		int len;
	} c[] = {
		{ 0xa9bf7bfd, 4 },        /* stp x29, x30, [sp, #-16]! */
		{ 0x910003fd, 4 },        /* mov x29, sp */
		{ 0xd503245f, 4 },        /* bti c */
		{ 0xd503233f, 4 },        /* paciasp */
		{ 0xd503201f, 4 },        /* nop */
		{ 0xd10083ff, 4 },        /* sub sp, sp, #0x20 */
		{ 0xf9000bf3, 4 },        /* str x19, [sp, #16] */
		{ 0xa90153f3, 4 },        /* stp x19, x20, [sp, #16] */
		{ 0xf81f0ffe, 4 },        /* str x30, [sp, #-16]! */
		{ 0xf9400020, 4 },        /* ldr x0, [x1] */
		{ 0xaa0103e0, 4 },        /* mov x0, x1 */
		{ 0xd2800020, 4 },        /* mov x0, #1 */
		{ 0x90000000, -ENOTSUP }, /* adrp */
		{ 0x10000000, -ENOTSUP }, /* adr */
		{ 0x14000000, -ENOTSUP }, /* b */
		{ 0x94000000, -ENOTSUP }, /* bl */
		{ 0x54000000, -ENOTSUP }, /* b.eq */
		{ 0xb4000000, -ENOTSUP }, /* cbz x0 */
		{ 0x35000000, -ENOTSUP }, /* cbnz w0 */
		{ 0x36000000, -ENOTSUP }, /* tbz */
		{ 0xb7000000, -ENOTSUP }, /* tbnz */
		{ 0x58000000, -ENOTSUP }, /* ldr x0, literal */
		{ 0x18000000, -ENOTSUP }, /* ldr w0, literal */
		{ 0x98000000, -ENOTSUP }, /* ldrsw literal */
		{ 0xd8000000, -ENOTSUP }, /* prfm literal */
		{ 0x9c000000, -ENOTSUP }, /* ldr q0, literal */
		{ 0xd61f0200, -ENOTSUP }, /* br x16 */
		{ 0xd65f03c0, -ENOTSUP }, /* ret */
		{ 0xd63f0000, -ENOTSUP }, /* blr x0 */
		{ 0xd4000001, -ENOTSUP }, /* svc #0 */
		{ 0xd53bd040, -ENOTSUP }, /* mrs x0, tpidr_el0 */
		{ 0x9b027c20, -ENOTSUP }, /* mul x0, x1, x2 */
	};
	(void)state;

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		uint8_t b[4];
		const char *why = NULL;

		memcpy(b, &c[i].insn, 4);
		if (gdr_patch_arch()->insn_len(b, 4, &why) != c[i].len)
			fail_msg("%08x: expected %d", c[i].insn, c[i].len);
	}
}
#endif /* __aarch64__ */

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
#if defined(__x86_64__)
		/* first: before any trampoline page exists */
		cmocka_unit_test(test_trampoline_below_stack),
#endif
		cmocka_unit_test(test_basic),
		cmocka_unit_test(test_cas16),
		cmocka_unit_test(test_two),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_chain_jump),
		cmocka_unit_test(test_concurrent),
		cmocka_unit_test(test_concurrent_libcuda_entry),
		cmocka_unit_test(test_concurrent_libcuda_entry_stopped),
		cmocka_unit_test(test_fake_driver),
		cmocka_unit_test(test_decoder_table),
#if defined(__x86_64__)
		cmocka_unit_test(test_short_form),
		cmocka_unit_test(test_short_form_outside),
		cmocka_unit_test(test_decoder_sweep),
#endif
	};

	if (!gdr_patch_arch()) {
		printf("no entry patcher on this architecture: skipped\n");
		return 77;
	}
	if (argc == 3) {
		fake_path = argv[1];
		badentry_path = argv[2];
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif /* __x86_64__ || __aarch64__ */
