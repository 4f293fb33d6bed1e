/* SPDX-License-Identifier: MIT */
/* The simulation of UCX's bistro patcher (ucm_bistro_sim.h says what it copies of UCX's). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ucm_bistro_sim.h"

#define CODE_AREA (16u << 10) /* UCX: 16 KiB, mapped once, never given back */

static pthread_mutex_t code_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *code_area;
static size_t code_used;

/* Executable memory anywhere (UCX: mmap(NULL), read+write+execute), 16-byte granules. */
static uint8_t *code_alloc(size_t n)
{
	uint8_t *p = NULL;

	n = (n + 15) & ~(size_t)15;
	pthread_mutex_lock(&code_lock);
	if (!code_area) {
		void *m = mmap(NULL, CODE_AREA, PROT_READ | PROT_WRITE | PROT_EXEC,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		code_area = m == MAP_FAILED ? NULL : m;
	}
	if (code_area && code_used + n <= CODE_AREA) {
		p = code_area + code_used;
		code_used += n;
	}
	pthread_mutex_unlock(&code_lock);
	return p;
}

static int fail(const char **why, const char *reason, int err)
{
	if (why)
		*why = reason;
	return err;
}

/* Plain byte copy into code (no sanitizer instrumentation: its shadow of text is not writable). */
__attribute__((no_sanitize("thread"), noinline)) static void code_copy(uint8_t *dst,
								       const uint8_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		((volatile uint8_t *)dst)[i] = src[i];
}

static int protect(void *addr, size_t len, int prot)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(page - 1);

	return mprotect((void *)a, (uintptr_t)addr + len - a, prot) ? -EACCES : 0;
}

static void grace(unsigned ms)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		sched_yield();
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < (long)ms);
}

#if defined(__x86_64__)
#define LOCK_LEN 2

/* xchg of 2 bytes (UCX: ucs_atomic_swap16); inline assembly, see code_copy. */
static void swap_lock(void *dst, const uint8_t *bytes)
{
	uint16_t v;

	memcpy(&v, bytes, sizeof(v));
	__asm__ volatile("xchgw %0, %1" : "+r"(v), "+m"(*(uint16_t *)dst) : : "memory");
}

/* UCX's ucm_bistro_relocate_one (x86-64): one instruction from *src to *dst, or -ENOTSUP. */
static int relocate_one(const uint8_t **src, uint8_t **dst, const uint8_t *dst_end,
			uintptr_t *src_end)
{
	const uint8_t *s = *src, *start = *src;
	uint8_t rex = 0, op = *s++, modrm, out[32];
	size_t n;

	if ((op & 0xf0) == 0x40) {
		rex = op;
		op = *s++;
	}
	if ((rex == 0 || rex == 0x41) && (op & 0xf0) == 0x50) {
		goto copy; /* push/pop r64 (UCX's mask takes both) */
	} else if (rex == 0x48 && (op == 0x81 || op == 0x83)) {
		modrm = *s++;
		if (modrm != 0xec)
			return -ENOTSUP;
		s += op == 0x83 ? 1 : 4; /* sub $imm, %rsp */
		goto copy;
	} else if (rex == 0x48 && op == 0x89) {
		modrm = *s++;
		if (modrm == 0xe5)
			goto copy; /* mov %rsp, %rbp */
		if (modrm >> 6 != 3 && (modrm & 7) == 4) {
			s++; /* SIB */
			if (modrm >> 6 == 1) {
				s += 1;
				goto copy;
			}
			if (modrm >> 6 == 2) {
				s += 4;
				goto copy;
			}
		}
		return -ENOTSUP;
	} else if (rex == 0 && (op & 0xf8) == 0xb8) {
		s += 4; /* mov $imm32, %r32 */
		goto copy;
	} else if (rex == 0 && op == 0x81) {
		int32_t disp;
		uint32_t imm;
		uint64_t addr;

		if (*s++ != 0x3d)
			return -ENOTSUP;
		/* cmpl $imm32, disp32(%rip) -> push %rax; movabs $addr, %rax; cmpl $imm32, (%rax);
		 * pop %rax */
		memcpy(&disp, s, 4);
		memcpy(&imm, s + 4, 4);
		s += 8;
		addr = (uintptr_t)s + (intptr_t)disp;
		out[0] = 0x50, out[1] = 0x48, out[2] = 0xb8;
		memcpy(out + 3, &addr, 8);
		out[11] = 0x81, out[12] = 0x38;
		memcpy(out + 13, &imm, 4);
		out[17] = 0x58;
		n = 18;
		goto emit;
	} else if (rex == 0 && op >= 0x70 && op <= 0x7f) {
		/* jcc rel8 -> jcc +2; jmp +14; jmp *0(%rip); .quad dest */
		uint64_t dest = (uintptr_t)(s + 1) + (int8_t)*s;

		s++;
		out[0] = op, out[1] = 0x02, out[2] = 0xeb, out[3] = 0x0e;
		out[4] = 0xff, out[5] = 0x25;
		memset(out + 6, 0, 4);
		memcpy(out + 10, &dest, 8);
		n = 18;
		if (dest < *src_end)
			*src_end = dest; /* not past the jump's target */
		goto emit;
	}
	return -ENOTSUP;
copy:
	n = (size_t)(s - start);
	memcpy(out, start, n);
emit:
	if (*dst + n > dst_end)
		return -ENOTSUP;
	memcpy(*dst, out, n);
	*dst += n;
	*src = s;
	return 0;
}

int ucm_sim_patch(void *fn, void *hook, void **orig, unsigned flags, unsigned grace_ms,
		  struct ucm_sim_restore *rp, const char **why)
{
	uint8_t patch[12];
	size_t len;
	intptr_t disp = (intptr_t)hook - ((intptr_t)fn + 5);

	if ((flags & UCM_SIM_FAR) || disp > INT32_MAX || disp < -(intptr_t)INT32_MAX) {
		patch[0] = 0x48, patch[1] = 0xb8; /* movabs $hook, %rax; jmp *%rax */
		memcpy(patch + 2, &hook, 8);
		patch[10] = 0xff, patch[11] = 0xe0;
		len = 12;
	} else {
		int32_t d = (int32_t)disp;

		patch[0] = 0xe9; /* jmp rel32 */
		memcpy(patch + 1, &d, 4);
		len = 5;
	}
	if (orig) {
		/* [jmp_addr][relocated code][jmp *jmp_addr(%rip)] */
		uint8_t *t = code_alloc(8 + 64 + 6), *dst, *end;
		const uint8_t *src = fn;
		uintptr_t src_end = UINTPTR_MAX, back;
		int32_t rel;

		if (!t)
			return fail(why, "no executable memory", -ENOMEM);
		dst = t + 8;
		end = t + 8 + 64;
		while ((uintptr_t)src < (uintptr_t)fn + len) {
			if (relocate_one(&src, &dst, end, &src_end) || (uintptr_t)src > src_end)
				return fail(why, "an instruction UCX's bistro cannot relocate",
					    -ENOTSUP);
		}
		back = (uintptr_t)src;
		memcpy(t, &back, 8);
		dst[0] = 0xff, dst[1] = 0x25;
		rel = (int32_t)((intptr_t)t - (intptr_t)(dst + 6));
		memcpy(dst + 2, &rel, 4);
		__builtin___clear_cache((char *)t, (char *)dst + 6);
		__atomic_store_n(orig, (void *)(t + 8), __ATOMIC_RELEASE);
	}
#elif defined(__aarch64__)
#define LOCK_LEN 4

/* One 4-byte atomic swap (UCX: ucs_atomic_swap32); inline assembly, see code_copy. */
static void swap_lock(void *dst, const uint8_t *bytes)
{
	uint32_t v, old, fail;

	memcpy(&v, bytes, sizeof(v));
	__asm__ volatile("1:	ldxr	%w0, %2\n"
			 "	stlxr	%w1, %w3, %2\n"
			 "	cbnz	%w1, 1b\n"
			 : "=&r"(old), "=&r"(fail), "+Q"(*(uint32_t *)dst)
			 : "r"(v)
			 : "memory");
	(void)old;
}

static uint32_t movw(unsigned reg, unsigned shift, uint64_t v, unsigned opc)
{
	return (uint32_t)opc << 23 | shift << 21 | (uint32_t)(v & 0xffff) << 5 | reg;
}

/* UCX's ucm_bistro_relocate_one (aarch64), with its record of the registers written. */
static int relocate_one(const uint8_t **src, uint8_t **dst, const uint8_t *dst_end,
			uint32_t *avail_regs)
{
	uintptr_t pc = (uintptr_t)*src;
	uint32_t insn, out[4];
	size_t n = 4;

	memcpy(&insn, *src, 4);
	out[0] = insn;
	if ((insn & 0xffc00000) == 0xa8800000 || (insn & 0xffc00000) == 0xa9800000 ||
	    (insn & 0xffc00000) == 0xa9000000) {
		*avail_regs &= ~(1u << (insn >> 5 & 31)); /* STP */
	} else if ((insn & 0x7fc0001f) == 0x6b00001f) {
		/* CMP */
	} else if ((insn & 0x7f800000) == 0x72800000 || (insn & 0x7fe0ffe0) == 0x2a0003e0 ||
		   (insn & 0x7ffffc00) == 0x11000000 || (insn & 0x7f800000) == 0x52800000 ||
		   (insn & 0xbfe00400) == 0xb8400400 || (insn & 0xbfc00000) == 0xb9400000) {
		*avail_regs &= ~(1u << (insn & 31)); /* MOVK, MOV, MOV sp, MOVZ, LDR imm */
	} else if ((insn & 0x9f000000) == 0x90000000) {
		uint64_t imm = (uint64_t)(insn >> 5 & 0x7ffff) << 2 | (insn >> 29 & 3);
		/* ADRP: movz/movk of the address (UCX adds imm << 12 to the unmasked PC: kept) */
		uint64_t page = pc + (uint64_t)((int64_t)(imm << 43) >> 31);
		unsigned reg = insn & 31;

		out[0] = movw(reg, 3, page >> 48, 0x1a5);
		out[1] = movw(reg, 2, page >> 32, 0x1e5);
		out[2] = movw(reg, 1, page >> 16, 0x1e5);
		out[3] = movw(reg, 0, page, 0x1e5);
		n = 16;
		*avail_regs &= ~(1u << reg);
	} else {
		return -ENOTSUP;
	}
	if (*dst + n > dst_end)
		return -ENOTSUP;
	memcpy(*dst, out, n);
	*dst += n;
	*src += 4;
	return 0;
}

int ucm_sim_patch(void *fn, void *hook, void **orig, unsigned flags, unsigned grace_ms,
		  struct ucm_sim_restore *rp, const char **why)
{
	static const uint32_t jmp15[2] = { 0x5800004f, 0xd61f01e0 }; /* ldr x15, #8; br x15 */
	uint8_t patch[16];
	size_t len = sizeof(patch);

	(void)flags;
	memcpy(patch, jmp15, 8);
	memcpy(patch + 8, &hook, 8);
	if (orig) {
		uint8_t *t = code_alloc(16 * 4 + 16 + 16), *dst, *end;
		const uint8_t *src = fn;
		uint32_t avail = 0xfe00; /* x9-x15 */
		uint64_t back;
		unsigned reg;
		uint32_t j[2];

		if (!t)
			return fail(why, "no executable memory", -ENOMEM);
		dst = t;
		end = t + 16 * 4 + 16;
		while ((uintptr_t)src < (uintptr_t)fn + len)
			if (relocate_one(&src, &dst, end, &avail))
				return fail(why, "an instruction UCX's bistro cannot relocate",
					    -ENOTSUP);
		if (!avail)
			return fail(why, "no scratch register left", -ENOTSUP);
		reg = (unsigned)__builtin_ctz(avail);
		j[0] = 0x58000040 | reg; /* ldr xN, #8 */
		j[1] = 0xd61f0000 | reg << 5;
		back = (uintptr_t)src;
		memcpy(dst, j, 8);
		memcpy(dst + 8, &back, 8);
		__builtin___clear_cache((char *)t, (char *)dst + 16);
		__atomic_store_n(orig, (void *)t, __ATOMIC_RELEASE);
	}
#endif
#if defined(__x86_64__) || defined(__aarch64__)
	if (rp) {
		rp->fn = fn;
		rp->len = len;
		memcpy(rp->saved, fn, len);
	}
	/* ucm_bistro_apply_patch_atomic */
	if (protect(fn, len, PROT_READ | PROT_WRITE | PROT_EXEC))
		return fail(why, "mprotect refused", -EACCES);
	{
#if defined(__x86_64__)
		static const uint8_t self[LOCK_LEN] = { 0xeb, 0xfe }; /* jmp . */
#else
		static const uint8_t self[LOCK_LEN] = { 0x00, 0x00, 0x00, 0x14 }; /* b . */
#endif
		swap_lock(fn, self);
		__builtin___clear_cache((char *)fn, (char *)fn + len);
		grace(grace_ms);
		code_copy((uint8_t *)fn + LOCK_LEN, patch + LOCK_LEN, len - LOCK_LEN);
		__builtin___clear_cache((char *)fn, (char *)fn + len);
		swap_lock(fn, patch);
	}
	__builtin___clear_cache((char *)fn, (char *)fn + len);
	return protect(fn, len, PROT_READ | PROT_EXEC) ? fail(why, "mprotect refused", -EACCES) : 0;
}

int ucm_sim_restore(struct ucm_sim_restore *rp)
{
	if (protect(rp->fn, rp->len, PROT_READ | PROT_WRITE | PROT_EXEC))
		return -EACCES;
	code_copy(rp->fn, rp->saved, rp->len); /* ucm_bistro_apply_patch: a plain memcpy */
	__builtin___clear_cache((char *)rp->fn, (char *)rp->fn + rp->len);
	return protect(rp->fn, rp->len, PROT_READ | PROT_EXEC);
}
#else
	int ucm_sim_patch(void *fn, void *hook, void **orig, unsigned flags, unsigned grace_ms,
			  struct ucm_sim_restore *rp, const char **why)
	{
		(void)fn, (void)hook, (void)orig, (void)flags, (void)grace_ms, (void)rp;
		return fail(why, "no bistro on this architecture", -ENOTSUP);
	}

	int ucm_sim_restore(struct ucm_sim_restore * rp)
	{
		(void)rp;
		return -ENOTSUP;
	}
#endif
