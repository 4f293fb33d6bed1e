/* SPDX-License-Identifier: MIT */
/*
 * The fake driver's exported free and allocation entry points on aarch64: a SIMULATION of a
 * libcuda entry as the compiler writes it (the x86-64 file copies libcuda 580.159.04's measured
 * entry bytes, docs/FACTS.md, "libcuda's entry bytes"; aarch64's were not measured), so that
 * lib/intercept/patch.c meets in the unit tests the frame-record prologue it will meet there:
 *
 *   stp x29, x30, [sp, #-16]!; mov x29, sp; bl fake_impl_<name>; ldp x29, x30, [sp], #16; ret
 *
 * argument registers untouched. With FAKE_CUDA_BAD_ENTRY, cuMemFree_v2 begins with an ADRP (PC-
 * relative) that the patcher must refuse.
 */
#if defined(__aarch64__)
	.text

.macro FAKE_BODY name
	stp	x29, x30, [sp, #-16]!
	.cfi_def_cfa_offset 16
	.cfi_offset x29, -16
	.cfi_offset x30, -8
	mov	x29, sp
	bl	fake_impl_\name
	ldp	x29, x30, [sp], #16
	.cfi_restore x30
	.cfi_restore x29
	.cfi_def_cfa_offset 0
	ret
.endm

/* One entry; with FAKE_CUDA_BAD_ENTRY, cuMemFree_v2's first instruction is PC-relative: the
 * patcher must refuse it. */
.macro FAKE_ENTRY name
	.globl	\name
	.type	\name, %function
	.hidden	fake_impl_\name
	.p2align 4
\name:
	.cfi_startproc
#ifdef FAKE_CUDA_BAD_ENTRY
	.ifc	\name, cuMemFree_v2
	adrp	x16, fake_api_flag
	.endif
#endif
	FAKE_BODY \name
	.cfi_endproc
	.size	\name, . - \name
.endm

	.hidden	fake_api_flag

/* lib/intercept/entries.h's rows the fake simulates (SIM), one FAKE_ENTRY each. */
#define GDR_ENTRY(name, kind, route, fake, ...) FAKE_IF_##fake(FAKE_ENTRY name)
#define FAKE_IF_SIM(...) __VA_ARGS__
#define FAKE_IF_NOSIM(...)
#include "../../lib/intercept/entries.h"
#endif /* __aarch64__ */

	.section .note.GNU-stack, "", %progbits
