/* SPDX-License-Identifier: MIT */
/*
 * The entry patcher's x86-64 back end: a decoder of the few position-independent instructions
 * function prologues begin with, the trampolines, and the 5-byte `jmp rel32` written at the entry
 * in one atomic store.
 *
 * Accepted (everything fully decoded; anything else, a prefix included, is -ENOTSUP):
 *   f3 0f 1e fa             endbr64
 *   50+r, 41 50+r           push r64
 *   90, [66] 0f 1f /0       nop, multi-byte nop (any operand but RIP-relative; it reads nothing)
 *   [REX] 89 8b 01 03 29 2b 31 33 39 3b 85 /r, mod=11
 *                           mov, add, sub, xor, cmp, test between registers (32 or 64 bits)
 *   [REX] 83 /0 /4 /5 ib, [REX] 81 /0 /4 /5 id, mod=11
 *                           add, and, sub of an immediate to a register (sub $8,%rsp: UCX #10868)
 *   [REX] b8+r id, REX.W b8+r iq
 *                           mov of an immediate to a register
 * RIP-relative operands, branches, calls and returns are refused by name; a jump at the entry may
 * be another patcher's (or ours, in another copy of the library).
 *
 * libcuda 580.159.04 (docs/FACTS.md, "libcuda's entry bytes"): 55 48 89 e5 41 54 48 83 ec 08 81 3d
 * ... moves push rbp; mov rbp,rsp; push r12 (6 bytes); the RIP-relative cmp after them is not
 * reached.
 */
#if defined(__x86_64__)
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "intercept/patch.h"

#define JMP_LEN 5

static int bad(const char **why, const char *reason)
{
	if (why)
		*why = reason;
	return -ENOTSUP;
}

/* A nop's ModRM operand from code[i] (the ModRM byte): the instruction's length, or -ENOTSUP. */
static int nop_operand(const uint8_t *code, size_t avail, unsigned i, const char **why)
{
	unsigned mod, rm, len;

	if (avail <= i)
		return bad(why, "instruction runs past the readable bytes");
	mod = code[i] >> 6;
	rm = code[i] & 7;
	if ((code[i] >> 3 & 7) != 0)
		return bad(why, "unknown 0f 1f form");
	len = i + 1;
	if (mod == 3)
		return len;
	if (mod == 0 && rm == 5)
		return bad(why, "RIP-relative operand");
	if (rm == 4) {
		if (avail <= len)
			return bad(why, "instruction runs past the readable bytes");
		if (mod == 0 && (code[len] & 7) == 5)
			len += 4; /* SIB without base: disp32 */
		len++;
	}
	len += mod == 1 ? 1 : mod == 2 ? 4 : 0;
	if (avail < len)
		return bad(why, "instruction runs past the readable bytes");
	return len;
}

static int insn_len(const uint8_t *code, size_t avail, const char **why)
{
	unsigned i = 0, op, reg;
	bool rexw = false;

	if (!avail)
		return bad(why, "no bytes to decode");
	if (code[0] == 0xf3) {
		if (avail >= 4 && code[1] == 0x0f && code[2] == 0x1e && code[3] == 0xfa)
			return 4;
		return bad(why, "prefix f3 (rep) not handled");
	}
	if (code[0] == 0x66) { /* only the operand-size nops */
		if (avail >= 2 && code[1] == 0x90)
			return 2;
		if (avail >= 3 && code[1] == 0x0f && code[2] == 0x1f)
			return nop_operand(code, avail, 3, why);
		return bad(why, "prefix 66 not handled");
	}
	if (code[0] >= 0x50 && code[0] <= 0x57)
		return 1;
	if (code[0] == 0x90)
		return 1;
	if ((code[0] & 0xf0) == 0x40) {
		if (avail < 2)
			return bad(why, "instruction runs past the readable bytes");
		if (code[0] == 0x41 && code[1] >= 0x50 && code[1] <= 0x57)
			return 2;
		rexw = code[0] & 8;
		i = 1;
	}
	op = code[i];
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
		if (avail < i + 2)
			return bad(why, "instruction runs past the readable bytes");
		if (code[i + 1] >> 6 != 3)
			return (code[i + 1] & 0xc7) == 0x05 ? bad(why, "RIP-relative operand")
							    : bad(why, "memory operand");
		return i + 2;
	case 0x81:
	case 0x83:
		if (avail < i + 2)
			return bad(why, "instruction runs past the readable bytes");
		reg = code[i + 1] >> 3 & 7;
		if (code[i + 1] >> 6 != 3)
			return (code[i + 1] & 0xc7) == 0x05 ? bad(why, "RIP-relative operand")
							    : bad(why, "memory operand");
		if (reg != 0 && reg != 4 && reg != 5)
			return bad(why, "immediate group form not handled");
		if (avail < i + (op == 0x83 ? 3 : 6))
			return bad(why, "instruction runs past the readable bytes");
		return i + (op == 0x83 ? 3 : 6);
	case 0xb8:
	case 0xb9:
	case 0xba:
	case 0xbb:
	case 0xbc:
	case 0xbd:
	case 0xbe:
	case 0xbf:
		if (avail < i + (rexw ? 9 : 5))
			return bad(why, "instruction runs past the readable bytes");
		return i + (rexw ? 9 : 5);
	case 0x0f:
		if (avail < i + 2)
			return bad(why, "instruction runs past the readable bytes");
		if (code[i + 1] == 0x1f)
			return nop_operand(code, avail, i + 2, why);
		if ((code[i + 1] & 0xf0) == 0x80)
			return bad(why, "conditional branch");
		return bad(why, "unknown opcode");
	case 0xe8:
		return bad(why, "call");
	case 0xe9:
	case 0xeb:
		return bad(why, "jump (the entry may be patched already)");
	case 0xff:
		return bad(why, "indirect call or jump, or memory operand");
	case 0xc2:
	case 0xc3:
		return bad(why, "return");
	default:
		if ((op & 0xf0) == 0x70 || op == 0xe3)
			return bad(why, "conditional branch");
		if (i)
			return bad(why, "unknown opcode after REX");
		return bad(why, "unknown opcode");
	}
}

static int can_store(const void *target)
{
	uintptr_t a = (uintptr_t)target;

	return (a & 7) + JMP_LEN <= 8 || (a & 15) + JMP_LEN <= 16 ? 0 : -EINVAL;
}

static void put_rel32(uint8_t *at, uintptr_t from, uintptr_t to)
{
	int32_t rel = (int32_t)(int64_t)(to - from);

	memcpy(at, &rel, sizeof(rel));
}

static void emit(uint8_t *slot, const void *target, const uint8_t *code, unsigned moved,
		 const void *hook)
{
	static const uint8_t jmp_abs[6] = { 0xff, 0x25, 0, 0, 0, 0 }; /* jmp *0(%rip) */
	uint8_t *orig = slot + GDR_PATCH_ORIG;
	uintptr_t back = (uintptr_t)target + moved;

	memset(slot, 0xcc, GDR_PATCH_SLOT); /* int3 around the code */
	memcpy(slot, jmp_abs, sizeof(jmp_abs));
	memcpy(slot + sizeof(jmp_abs), &hook, sizeof(hook));
	memcpy(orig, code, moved);
	orig[moved] = 0xe9;
	put_rel32(orig + moved + 1, (uintptr_t)orig + moved + JMP_LEN, back);
}

/*
 * The code words are read and swapped in inline assembly: ThreadSanitizer's instrumented atomics
 * write its shadow of the address, and its shadow of a program's text is not writable.
 */
static uint64_t load8(const uint64_t *p)
{
	uint64_t v;

	__asm__ volatile("movq %1, %0" : "=r"(v) : "m"(*p));
	return v;
}

/* lock cmpxchg: one atomic 8-byte store where the word still holds old. */
static bool cas8(uint64_t *p, uint64_t old, uint64_t new)
{
	bool ok;

	__asm__ volatile("lock cmpxchgq %3, %1"
			 : "=@ccz"(ok), "+m"(*p), "+a"(old)
			 : "r"(new)
			 : "memory");
	return ok;
}

/* lock cmpxchg16b (every x86-64 CPU CUDA runs on has it): one atomic 16-byte store. */
static bool cas16(uint64_t *p, uint64_t old[2], const uint64_t new[2])
{
	bool ok;

	__asm__ volatile("lock cmpxchg16b %1"
			 : "=@ccz"(ok), "+m"(*(unsigned __int128 *)p), "+a"(old[0]), "+d"(old[1])
			 : "b"(new[0]), "c"(new[1])
			 : "memory");
	return ok;
}

static int store(void *target, const uint8_t *code, const void *stub)
{
	uintptr_t a = (uintptr_t)target;
	uint8_t jmp[JMP_LEN] = { 0xe9 };

	put_rel32(jmp + 1, a + JMP_LEN, (uintptr_t)stub);
	if ((a & 7) + JMP_LEN <= 8) {
		uint64_t *w = (uint64_t *)(a & ~(uintptr_t)7), old, new;

		old = load8(w);
		if (memcmp((uint8_t *)&old + (a & 7), code, JMP_LEN))
			return -EBUSY;
		new = old;
		memcpy((uint8_t *)&new + (a & 7), jmp, JMP_LEN);
		return cas8(w, old, new) ? 0 : -EBUSY;
	}
	if ((a & 15) + JMP_LEN <= 16) {
		uint64_t *w = (uint64_t *)(a & ~(uintptr_t)15), old[2], new[2];

		old[0] = load8(&w[0]);
		old[1] = load8(&w[1]);
		if (memcmp((uint8_t *)old + (a & 15), code, JMP_LEN))
			return -EBUSY;
		memcpy(new, old, sizeof(new));
		memcpy((uint8_t *)new + (a & 15), jmp, JMP_LEN);
		return cas16(w, old, new) ? 0 : -EBUSY;
	}
	return -EINVAL;
}

/* ---- The one-byte form ---------------------------------------------------------------------------
 * Only the first byte is replaced, by E9; the next four, unchanged, are the jump's displacement,
 * so the stub must sit at exactly target + 5 + (int32)bytes[1..4] (libcuda 580: 48 89 e5 41,
 * +0x41e58948, about 1 GiB above the function). */

static int short_dest(uintptr_t target, const uint8_t *code, size_t avail, uintptr_t *dest)
{
	int32_t rel;

	if (avail < JMP_LEN)
		return -ENOTSUP;
	memcpy(&rel, code + 1, sizeof(rel));
	*dest = target + JMP_LEN + (uintptr_t)(intptr_t)rel;
	return 0;
}

static void short_stub(uint8_t *at, const void *hook)
{
	static const uint8_t jmp_abs[6] = { 0xff, 0x25, 0, 0, 0, 0 }; /* jmp *0(%rip) */

	memcpy(at, jmp_abs, sizeof(jmp_abs));
	memcpy(at + sizeof(jmp_abs), &hook, sizeof(hook));
}

/* lock cmpxchg of one byte (inline assembly: see load8). */
static int short_store(void *target, uint8_t old)
{
	uint8_t new = 0xe9;
	bool ok;

	__asm__ volatile("lock cmpxchgb %3, %1"
			 : "=@ccz"(ok), "+m"(*(uint8_t *)target), "+a"(old)
			 : "q"(new)
			 : "memory");
	return ok ? 0 : -EBUSY;
}

static const struct gdr_patch_arch x86_64 = {
	.entry_len = JMP_LEN,
	.reach = (1UL << 31) - (64UL << 10), /* rel32, less a margin for the slot and the page */
	.insn_len = insn_len,
	.can_store = can_store,
	.emit = emit,
	.store = store,
	.entry_is_one_insn = false,
	.short_dest = short_dest,
	.short_stub = short_stub,
	.short_store = short_store,
};

const struct gdr_patch_arch *gdr_patch_arch(void)
{
	return &x86_64;
}
#endif /* __x86_64__ */
