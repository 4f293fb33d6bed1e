/* SPDX-License-Identifier: MIT */
/*
 * Patching a function's entry in place, so that every caller reaches a hook however it got the
 * function's address (a direct call, dlsym, cuGetProcAddress, a pointer taken before libgdrcache
 * was loaded). Used for the CUDA driver's free and allocation entry points (hooks.c).
 *
 * The first instructions of the target are decoded; only instructions the decoder fully knows
 * and can move (no PC-relative operand) are accepted, else the patch is refused with -ENOTSUP and
 * nothing is written. They are copied into a trampoline within branch reach of the target,
 * followed by a branch back; the entry is then replaced by a branch to the hook in one atomic
 * store. Architectures: x86-64 (arch/x86_64.c), aarch64 (arch/aarch64.c); elsewhere every
 * install returns -ENOTSUP.
 *
 * Threads running the target while it is patched (patch.c says more). aarch64 replaces one
 * instruction: a thread is before it or past it. x86-64 first tries the one-byte form: only the
 * first byte becomes E9 (jmp rel32), the four bytes after it, unchanged, are the jump's
 * displacement, and the stub to the hook is mapped at exactly the address they name; a thread
 * already past the first instruction runs on over bytes that did not change. When that address is
 * taken or out of reach, the five-byte jump is written instead, which a thread stopped inside the
 * moved instructions would resume in the middle of: it is written as it is where the caller says
 * no thread can be running the target (GDR_PATCH_QUIESCENT), else while every other thread is
 * stopped, any thread inside the moved instructions moved to their copy (stop_world.h); where
 * threads cannot all be stopped, the install is refused (-EBUSY).
 *
 * An entry another tool patched first (UCX's bistro, UCX_MEM_CUDA_HOOK_MODE=bistro: docs/FACTS.md,
 * "Two patchers") is chained where its jump is one instruction that covers the branch written
 * here: x86-64 `jmp rel32` (E9) or `movabs $imm64, %reg; jmp *%reg` (UCX's far form: the
 * movabs is one 10-byte instruction), aarch64 `B` or `LDR Xn, literal; BR Xn`. That instruction
 * is replaced by the branch to the hook, in one atomic store, and orig jumps to where the other
 * tool's jump went (its hook, which calls its own copy of the original): both hooks run, ours
 * first. An entry that jumps to itself (UCX's lock while it writes) is -EBUSY.
 */
#ifndef GDRCACHE_PATCH_H
#define GDRCACHE_PATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Make every call of target run hook instead; *orig receives a function that behaves as the
 * original target (call it from the hook). *orig is stored BEFORE the entry is patched (with
 * __atomic_store_n, release), since other threads may run the hook before this returns: a hook
 * reads it with __atomic_load_n(..., __ATOMIC_ACQUIRE). On failure *orig is left as it was.
 * Thread-safe; calls for the same target after the first succeed with the same *orig (and leave
 * the first hook in place). Patches are never undone.
 * Runs at install time only: reads /proc/self/maps, maps and protects pages; allocates nothing on
 * the heap, logs nothing. 0, or -errno with *why (static text; why may be NULL):
 *   -ENOTSUP  the entry holds an instruction the decoder does not know or cannot move (a jump
 *             other than those chained above: x86-64 `jmp rel8`, `jmp *(%rip)`), or the
 *             architecture has no patcher
 *   -ENOMEM   no trampoline memory within branch reach of target, or the table of patches is full
 *   -EACCES   the target's page could not be made writable (W^X policy)
 *   -EBUSY    the entry changed while it was being patched, or jumps to itself (another patcher
 *             in the process is writing it), or only a multi-instruction rewrite was possible,
 *             flags lack GDR_PATCH_QUIESCENT and the other threads could not all be stopped
 *             (or flags hold GDR_PATCH_NO_STOP)
 *   -EINVAL   target, hook or orig NULL, target not in mapped readable+executable memory, or
 *             the entry straddles what one atomic store can write (x86-64: [target, target + 5)
 *             in no aligned 16-byte block; aarch64: target not 4-byte aligned)
 *   other     -errno of opening or reading /proc/self/maps */
int gdr_patch_install(void *target, void *hook, void **orig, unsigned flags, const char **why);
/* flags */
#define GDR_PATCH_QUIESCENT                                                                        \
	1u                    /* no thread can be running target now (it was just loaded): an entry
				 of several instructions may be rewritten */
#define GDR_PATCH_NO_SHORT 2u /* x86-64: skip the one-byte form (tests of the five-byte one) */
#define GDR_PATCH_NO_STOP 4u  /* never stop the other threads: refuse instead (tests, benches) */

/* Whether fn is the entry of a function this process patched. Lock-free, async-signal-safe. */
bool gdr_patch_is_patched(const void *fn);
/* Whether fn's entry already begins with another tool's jump: 1 if its first instructions are a
 * jump (x86-64: `jmp rel32`, `jmp rel8`, `movabs $imm64, %reg; jmp *%reg`, `jmp *disp(%rip)`;
 * aarch64: `B`, `LDR Xn, literal; BR Xn`) whose destination lies outside the object that holds fn
 * (dladdr), or to fn itself (a patcher writing it now); 0 otherwise, for fn NULL, an entry this
 * process patched (our own patch is not foreign), or memory that is not mapped readable (read
 * only where /proc/self/maps says it is: never faults). *who (who may be NULL) is set where 1 is
 * returned: a static text naming the jump and its destination's object (or address), valid until
 * the next call. Thread-safe; install-time cost (reads /proc/self/maps, calls dladdr). */
int gdr_patch_foreign(const void *fn, const char **who);
/* Whether fn's entry was rewritten while the other threads were stopped. */
bool gdr_patch_stopped(const void *fn);
/* How many bytes of fn's entry were rewritten (x86-64: 1, the one-byte form, or 5; aarch64: 4);
 * 0 if fn is not patched. */
unsigned gdr_patch_bytes(const void *fn);

/* ---- Between patch.c and its architecture back ends (patch_<arch>.c); tests use it too ------ */

/* Trampoline memory one patch takes: the stub to the hook at the start, orig at GDR_PATCH_ORIG. */
#define GDR_PATCH_SLOT 64
#define GDR_PATCH_ORIG 16
/* Most bytes an entry's moved instructions may take. */
#define GDR_PATCH_MAX_MOVED 32

struct gdr_patch_arch {
	unsigned entry_len; /* bytes the branch written at the entry covers */
	uintptr_t reach;    /* farthest any byte of trampoline memory may be from the target */
	/* Length of the one instruction at code (avail bytes readable, never read beyond the
	 * instruction), if it is fully decoded and can run at another address; else -ENOTSUP and
	 * *why. */
	int (*insn_len)(const uint8_t *code, size_t avail, const char **why);
	/* 0 if one atomic store can write entry_len bytes at target, else -EINVAL. */
	int (*can_store)(const void *target);
	/* Fill the slot at slot (writable now, executed at that address later) for target whose
	 * first moved bytes, a copy of which is at code, move: a stub that jumps to hook at slot,
	 * orig (the moved instructions, then a branch to target + moved) at slot + GDR_PATCH_ORIG. */
	void (*emit)(uint8_t *slot, const void *target, const uint8_t *code, unsigned moved,
		     const void *hook);
	/* Replace the entry (made writable by the caller) with a branch to stub, in one atomic
	 * store, provided its first entry_len bytes still equal code: 0, or -EBUSY. */
	int (*store)(void *target, const uint8_t *code, const void *stub);
	/* Whether the branch written at the entry replaces exactly one instruction (no thread can
	 * be inside what moved, so GDR_PATCH_QUIESCENT is not needed). */
	bool entry_is_one_insn;
	/* The one-byte form (NULL where there is none). short_dest: where the stub must be for the
	 * entry at target whose bytes are code (0, or -ENOTSUP); short_stub: write the stub
	 * (GDR_PATCH_SHORT_STUB bytes) at `at`; short_store: replace the first byte, if it still
	 * is old, in one atomic store (0, or -EBUSY). */
	int (*short_dest)(uintptr_t target, const uint8_t *code, size_t avail, uintptr_t *dest);
	void (*short_stub)(uint8_t *at, const void *hook);
	int (*short_store)(void *target, uint8_t old);
};
#define GDR_PATCH_SHORT_STUB 14

/* The back end of this architecture, or NULL. */
const struct gdr_patch_arch *gdr_patch_arch(void);

#endif /* GDRCACHE_PATCH_H */
