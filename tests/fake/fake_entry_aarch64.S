/* SPDX-License-Identifier: MIT */
/*
 * The fake driver's exported free and allocation entry points on aarch64: a SIMULATION of a
 * libcuda entry as the compiler writes it (the x86-64 file copies libcuda 580.159.04's measured
 * entry bytes, FACTS.md; aarch64's were not measured), so that lib/intercept/patch.c meets in the unit tests
 * the frame-record prologue it will meet there:
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

.macro FAKE_ENTRY name
	.globl	\name
	.type	\name, %function
	.hidden	fake_impl_\name
	.p2align 4
\name:
	.cfi_startproc
	FAKE_BODY \name
	.cfi_endproc
	.size	\name, . - \name
.endm

/* An entry whose first instruction is PC-relative: the patcher must refuse it. */
.macro FAKE_BAD_ENTRY name
	.globl	\name
	.type	\name, %function
	.hidden	fake_impl_\name
	.p2align 4
\name:
	.cfi_startproc
	adrp	x16, fake_api_flag
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
#endif /* __aarch64__ */

	.section .note.GNU-stack, "", %progbits
