/* SPDX-License-Identifier: MIT */
/* The preload's dlsym and dlvsym on aarch64: save the arguments, ask the route (dlsym.c) which
 * function answers, restore them and branch there, so the caller's return address is untouched. */
#include "arch/trampoline.h"

/* hint #34 is "bti c" (a no-op without BTI); x16 may branch to a "bti c" landing pad. The frame
 * record keeps unwinders and profilers walking through; x30 is restored before the branch, so the
 * function reached returns to our caller. */
/* clang-format off */
__asm__(".text\n\t"
	GDRP_ENTRY("dlsym")
	".cfi_startproc\n\t"
	"hint #34\n\t"
	"stp x29, x30, [sp, #-32]!\n\t"
	".cfi_def_cfa_offset 32\n\t"
	".cfi_offset 29, -32\n\t"
	".cfi_offset 30, -24\n\t"
	"mov x29, sp\n\t"
	"stp x0, x1, [sp, #16]\n\t"
	"bl gdrp_dlsym_route\n\t"
	"mov x16, x0\n\t"
	"ldp x0, x1, [sp, #16]\n\t"
	"ldp x29, x30, [sp], #32\n\t"
	".cfi_restore 29\n\t"
	".cfi_restore 30\n\t"
	".cfi_def_cfa_offset 0\n\t"
	"br x16\n\t"
	".cfi_endproc\n\t"
	GDRP_END("dlsym")
	GDRP_ENTRY("dlvsym")
	".cfi_startproc\n\t"
	"hint #34\n\t"
	"stp x29, x30, [sp, #-48]!\n\t"
	".cfi_def_cfa_offset 48\n\t"
	".cfi_offset 29, -48\n\t"
	".cfi_offset 30, -40\n\t"
	"mov x29, sp\n\t"
	"stp x0, x1, [sp, #16]\n\t"
	"str x2, [sp, #32]\n\t"
	"bl gdrp_dlvsym_route\n\t"
	"mov x16, x0\n\t"
	"ldp x0, x1, [sp, #16]\n\t"
	"ldr x2, [sp, #32]\n\t"
	"ldp x29, x30, [sp], #48\n\t"
	".cfi_restore 29\n\t"
	".cfi_restore 30\n\t"
	".cfi_def_cfa_offset 0\n\t"
	"br x16\n\t"
	".cfi_endproc\n\t"
	GDRP_END("dlvsym")
	".previous");
/* clang-format on */
