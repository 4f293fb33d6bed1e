/* SPDX-License-Identifier: MIT */
/* The preload's dlsym and dlvsym on x86-64: save the arguments, ask the route (dlsym.c) which
 * function answers, restore them and jump there, so the caller's return address is untouched. */
#include "arch/trampoline.h"

#ifdef __CET__
#define GDRP_ENDBR "endbr64\n\t"
#else
#define GDRP_ENDBR ""
#endif
/* On entry %rsp is 8 past a 16-byte boundary: two pushes and 8 bytes (dlsym), three pushes
 * (dlvsym) realign it for the call. */
/* clang-format off */
__asm__(".text\n\t"
	GDRP_ENTRY("dlsym")
	".cfi_startproc\n\t"
	GDRP_ENDBR
	"pushq %rdi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"pushq %rsi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"subq $8, %rsp\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"call gdrp_dlsym_route\n\t"
	"addq $8, %rsp\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rsi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rdi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"jmp *%rax\n\t"
	".cfi_endproc\n\t"
	GDRP_END("dlsym")
	GDRP_ENTRY("dlvsym")
	".cfi_startproc\n\t"
	GDRP_ENDBR
	"pushq %rdi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"pushq %rsi\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"pushq %rdx\n\t"
	".cfi_adjust_cfa_offset 8\n\t"
	"call gdrp_dlvsym_route\n\t"
	"popq %rdx\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rsi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"popq %rdi\n\t"
	".cfi_adjust_cfa_offset -8\n\t"
	"jmp *%rax\n\t"
	".cfi_endproc\n\t"
	GDRP_END("dlvsym")
	".previous");
/* clang-format on */
