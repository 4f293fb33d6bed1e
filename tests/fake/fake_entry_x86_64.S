/* SPDX-License-Identifier: MIT */
/*
 * The fake driver's exported free and allocation entry points on x86-64: a SIMULATION of the entry
 * bytes of NVIDIA's libcuda 580.159.04 (FACTS.md, "first bytes of libcuda's API functions"), so
 * that lib/intercept/patch.c meets in the unit tests what it meets on the H100:
 *
 *   55 48 89 e5 41 54 48 83 ec 08 81 3d <rel32> <imm32>
 *   push %rbp; mov %rsp,%rbp; push %r12; sub $8,%rsp; cmpl $imm32, fake_api_flag(%rip)
 *
 * then a call of fake_impl_<name> (fake_cuda.c), argument registers untouched. With
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

.macro FAKE_ENTRY name
	.globl	\name
	.type	\name, @function
	.hidden	fake_impl_\name
	.p2align 4
\name:
	.cfi_startproc
	FAKE_BODY \name
	.cfi_endproc
	.size	\name, . - \name
.endm

/* An entry whose first instruction is RIP-relative: the patcher must refuse it. */
.macro FAKE_BAD_ENTRY name
	.globl	\name
	.type	\name, @function
	.hidden	fake_impl_\name
	.p2align 4
\name:
	.cfi_startproc
	mov	fake_api_flag(%rip), %eax
	FAKE_BODY \name
	.cfi_endproc
	.size	\name, . - \name
.endm

	.hidden	fake_api_flag

#ifdef FAKE_CUDA_BAD_ENTRY
	FAKE_BAD_ENTRY cuMemFree_v2
#else
	FAKE_ENTRY cuMemFree_v2
#endif
	FAKE_ENTRY cuMemFreeAsync
	FAKE_ENTRY cuMemFreeAsync_ptsz
	FAKE_ENTRY cuMemFreeHost
	FAKE_ENTRY cuMemUnmap
	FAKE_ENTRY cuIpcCloseMemHandle
	FAKE_ENTRY cuCtxDestroy
	FAKE_ENTRY cuCtxDestroy_v2
	FAKE_ENTRY cuDevicePrimaryCtxReset
	FAKE_ENTRY cuDevicePrimaryCtxReset_v2
	FAKE_ENTRY cuDevicePrimaryCtxRelease
	FAKE_ENTRY cuDevicePrimaryCtxRelease_v2
	FAKE_ENTRY cuMemAlloc_v2
	FAKE_ENTRY cuMemAllocAsync
	FAKE_ENTRY cuMemAllocAsync_ptsz
	FAKE_ENTRY cuMemAllocHost_v2
	FAKE_ENTRY cuMemAllocManaged
	FAKE_ENTRY cuMemAllocFromPoolAsync
	FAKE_ENTRY cuMemCreate
	FAKE_ENTRY cuMemMap
#endif /* __x86_64__ */

	.section .note.GNU-stack, "", @progbits
