/* SPDX-License-Identifier: MIT */
/*
 * The fake driver's exported free and allocation entry points on x86-64: a SIMULATION of the entry
 * bytes of NVIDIA's libcuda 580.159.04 (docs/FACTS.md, "libcuda's entry bytes"), so
 * that lib/intercept/patch.c meets in the unit tests what it meets on the H100:
 *
 *   55 48 89 e5 41 54 48 83 ec 08 81 3d <rel32> <imm32>
 *   push %rbp; mov %rsp,%rbp; push %r12; sub $8,%rsp; cmpl $imm32, fake_api_flag(%rip)
 *
 * then a call of fake_impl_<name> (fake_cuda_alloc.c and its siblings), argument registers untouched. With
 * FAKE_CUDA_BAD_ENTRY, cuMemFree_v2 begins with a RIP-relative load the patcher must refuse.
 */
#if defined(__x86_64__)
	.text

.macro FAKE_BODY name
	push	%rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	mov	%rsp, %rbp
	.cfi_def_cfa_register %rbp
	push	%r12
	.cfi_offset %r12, -24
	sub	$8, %rsp
	cmpl	$0x3a5c0001, fake_api_flag(%rip)
	call	fake_impl_\name
	add	$8, %rsp
	pop	%r12
	pop	%rbp
	.cfi_def_cfa %rsp, 8
	ret
.endm

/* One entry; with FAKE_CUDA_BAD_ENTRY, cuMemFree_v2's first instruction is RIP-relative: the
 * patcher must refuse it. */
.macro FAKE_ENTRY name
	.globl	\name
	.type	\name, @function
	.hidden	fake_impl_\name
	.p2align 4
\name:
	.cfi_startproc
#ifdef FAKE_CUDA_BAD_ENTRY
	.ifc	\name, cuMemFree_v2
	mov	fake_api_flag(%rip), %eax
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
#endif /* __x86_64__ */

	.section .note.GNU-stack, "", @progbits
