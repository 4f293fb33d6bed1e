/* SPDX-License-Identifier: MIT */
/*
 * A SIMULATION of UCX's binary patcher (UCM "bistro", src/ucm/bistro/bistro_x86_64.c,
 * bistro_aarch64.c, bistro.c; used for CUDA by src/ucm/cuda/cudamem.c when
 * UCX_MEM_CUDA_HOOK_MODE=bistro), for the tests of two patchers in one process. It writes at an
 * entry what UCX writes and reaches the original as UCX does (facts only, no UCX code):
 *  - x86-64: `jmp rel32` (E9) where the hook is within +-2 GiB of the entry + 5, else (or with
 *    UCM_SIM_FAR, as UCX_MEM_BISTRO_FORCE_FAR_JUMP=y) `movabs $hook, %rax; jmp *%rax` (12 bytes);
 *  - aarch64: `ldr x15, #8; br x15; .quad hook` (16 bytes);
 *  - the original: the entry's first instructions, relocated by UCX's small decoder into a
 *    trampoline, then an absolute jump back past them. Refused (-ENOTSUP, nothing written) where
 *    the decoder does not know an instruction: x86-64 knows push/pop r64, sub $imm,%rsp,
 *    mov %rsp,%rbp and REX.W 89 with a SIB operand, mov $imm32,%r32, cmp $imm32,disp(%rip)
 *    (rewritten through %rax) and jcc rel8; aarch64 knows STP, CMP, MOV/MOVZ/MOVK, LDR
 *    immediate and ADRP (rewritten as MOVZ/MOVK), and needs one of x9-x15 left unwritten;
 *  - written under a lock: the first 2 (x86-64) or 4 (aarch64) bytes swapped atomically for a
 *    jump to itself, a grace time (UCX: 50 ms, UCX_MEM_BISTRO_GRACE_DURATION), the rest copied,
 *    the first bytes swapped in; the page left read+execute;
 *  - restoring writes the saved bytes back with a plain copy (UCX's library never restores its
 *    CUDA patches, it passes no restore point; only its gtest restores).
 * Trampolines come from one read+write+execute mapping, as UCX's ucm_bistro_allocate_code.
 */
#ifndef GDR_TEST_UCM_BISTRO_SIM_H
#define GDR_TEST_UCM_BISTRO_SIM_H

#include <stddef.h>
#include <stdint.h>

#define UCM_SIM_FAR 1u /* x86-64: the movabs form even where the hook is near */

struct ucm_sim_restore {
	void *fn;
	size_t len;
	uint8_t saved[16];
};

/* Patches fn to jump to hook, *orig the relocated original (stored before the entry is
 * written). grace_ms: the lock's grace time. rp, if not NULL, records what restoring needs.
 * 0, -ENOTSUP (an instruction UCX's decoder does not know: the entry may be patched already),
 * -ENOMEM, -EACCES; *why (may be NULL) says what. */
int ucm_sim_patch(void *fn, void *hook, void **orig, unsigned flags, unsigned grace_ms,
		  struct ucm_sim_restore *rp, const char **why);
/* Writes the saved bytes back (plain copy, as ucm_bistro_restore): 0 or -EACCES. */
int ucm_sim_restore(struct ucm_sim_restore *rp);

#endif
