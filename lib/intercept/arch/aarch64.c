/* SPDX-License-Identifier: MIT */
/*
 * The entry patcher's aarch64 back end: the first instruction is classified, moved into a
 * trampoline, and replaced by a direct `B` to a stub within +-128 MiB, in one 4-byte atomic store.
 *
 * Movable (not PC-relative, classified by their encoding groups): the hint space (NOP, BTI,
 * PACIASP/PACIBSP, ...), load/store pair (STP x29, x30, [sp, #-16]! ...), load/store register with
 * an immediate offset (pre-, post-index, unscaled, unsigned offset), add/sub immediate (MOV x29,
 * sp; SUB sp, sp, #n), logical shifted register (MOV xd, xm), move wide (MOVZ/MOVN/MOVK). Refused:
 * ADR/ADRP, B/BL, B.cond, CBZ/CBNZ, TBZ/TBNZ, LDR/LDRSW/PRFM (literal), and everything else.
 *
 * PACIASP moves correctly: it signs LR with SP as the modifier. orig is called by the hook, so
 * at the trampoline LR is the hook's return address and SP is the SP this invocation of the
 * original starts with; the AUTIASP before its RET sees the same LR and SP, as it would have had
 * the original been called directly. BTI c is a NOP outside guarded pages, and the trampoline page
 * is not guarded (no PROT_BTI), so orig may be reached by BLR. The way back is a direct B to
 * target + 4 (a BR would need a landing pad there on a BTI-guarded libcuda); the stub reaches
 * the hook through x16, which a BTI c landing pad accepts from BR.
 */
#if defined(__aarch64__)
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "intercept/patch.h"

#define INSN_LEN 4
#define B_REACH (1UL << 27) /* imm26 * 4 */

static int bad(const char **why, const char *reason)
{
	if (why)
		*why = reason;
	return -ENOTSUP;
}

static int insn_len(const uint8_t *code, size_t avail, const char **why)
{
	uint32_t insn;

	if (avail < INSN_LEN)
		return bad(why, "instruction runs past the readable bytes");
	memcpy(&insn, code, sizeof(insn));
	if ((insn & 0x1f000000) == 0x10000000)
		return bad(why, "ADR/ADRP");
	if ((insn & 0x7c000000) == 0x14000000)
		return bad(why, "B/BL (the entry may be patched already)");
	if ((insn & 0xff000000) == 0x54000000)
		return bad(why, "B.cond");
	if ((insn & 0x7e000000) == 0x34000000)
		return bad(why, "CBZ/CBNZ");
	if ((insn & 0x7e000000) == 0x36000000)
		return bad(why, "TBZ/TBNZ");
	if ((insn & 0x3b000000) == 0x18000000)
		return bad(why, "LDR/LDRSW/PRFM (literal)");
	if ((insn & 0xfffff01f) == 0xd503201f) /* hints: NOP, BTI, PACIASP, ... */
		return INSN_LEN;
	if ((insn & 0x3a000000) == 0x28000000) /* load/store pair, all addressing forms */
		return INSN_LEN;
	if ((insn & 0x3b000000) == 0x39000000) /* load/store register, unsigned offset */
		return INSN_LEN;
	if ((insn & 0x3b200000) == 0x38000000 && (insn & 0xc00) != 0x800) /* unscaled, pre, post */
		return INSN_LEN;
	if ((insn & 0x1f800000) == 0x11000000) /* add/sub immediate */
		return INSN_LEN;
	if ((insn & 0x1f000000) == 0x0a000000) /* logical, shifted register */
		return INSN_LEN;
	if ((insn & 0x1f800000) == 0x12800000) /* move wide immediate */
		return INSN_LEN;
	return bad(why, "instruction not classified as movable");
}

static int can_store(const void *target)
{
	return (uintptr_t)target & 3 ? -EINVAL : 0;
}

static uint32_t b_to(uintptr_t from, uintptr_t to)
{
	return 0x14000000 | ((uint32_t)((int64_t)(to - from) >> 2) & 0x03ffffff);
}

static void emit(uint8_t *slot, const void *target, const uint8_t *code, unsigned moved,
		 const void *hook)
{
	static const uint32_t stub[2] = {
		0x58000050, /* ldr x16, #8 */
		0xd61f0200, /* br x16 */
	};
	static const uint32_t brk = 0xd4200000; /* brk #0 */
	uint8_t *orig = slot + GDR_PATCH_ORIG;
	uint32_t back = b_to((uintptr_t)orig + moved, (uintptr_t)target + moved);

	for (unsigned i = 0; i < GDR_PATCH_SLOT; i += sizeof(brk))
		memcpy(slot + i, &brk, sizeof(brk));
	memcpy(slot, stub, sizeof(stub));
	memcpy(slot + sizeof(stub), &hook, sizeof(hook));
	memcpy(orig, code, moved);
	memcpy(orig + moved, &back, sizeof(back));
}

/*
 * One aligned 4-byte store, made only if the word still holds old (load/store exclusive). Inline
 * assembly: ThreadSanitizer's instrumented atomics write its shadow of the address, and its
 * shadow of a program's text is not writable.
 */
static bool cas4(uint32_t *p, uint32_t old, uint32_t new)
{
	uint32_t cur, fail;

	__asm__ volatile("1:	ldxr	%w0, %2\n"
			 "	cmp	%w0, %w3\n"
			 "	b.ne	2f\n"
			 "	stlxr	%w1, %w4, %2\n"
			 "	cbnz	%w1, 1b\n"
			 "	dmb	ish\n"
			 "2:"
			 : "=&r"(cur), "=&r"(fail), "+Q"(*p)
			 : "r"(old), "r"(new)
			 : "cc", "memory");
	return cur == old;
}

static int store(void *target, const uint8_t *code, const void *stub)
{
	uint32_t old;

	memcpy(&old, code, sizeof(old));
	return cas4(target, old, b_to((uintptr_t)target, (uintptr_t)stub)) ? 0 : -EBUSY;
}

static const struct gdr_patch_arch aarch64 = {
	.entry_len = INSN_LEN,
	.reach = B_REACH - (64UL << 10), /* less a margin for the slot and a 64 KiB page */
	.insn_len = insn_len,
	.can_store = can_store,
	.emit = emit,
	.store = store,
	.entry_is_one_insn = true,
};

const struct gdr_patch_arch *gdr_patch_arch(void)
{
	return &aarch64;
}
#endif /* __aarch64__ */
