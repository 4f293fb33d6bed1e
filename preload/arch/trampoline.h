/* SPDX-License-Identifier: MIT */
/* What the preload's per-architecture dlsym/dlvsym trampolines share (arch/<arch>.c). */
#ifndef GDRP_ARCH_TRAMPOLINE_H
#define GDRP_ARCH_TRAMPOLINE_H

/*
 * Two labels per entry: gdrp_dlsym_234 becomes dlsym@@GLIBC_2.34, gdrp_dlsym_compat the compat
 * dlsym@GLIBC_2.2.5 / @GLIBC_2.17 (GDRP_GLIBC_COMPAT, from CMake, as in the map). The labels
 * themselves stay local (the map's "local: *"). */
#define GDRP_STR_(x) #x
#define GDRP_STR(x) GDRP_STR_(x)
#define GDRP_ENTRY(name)                                                                           \
	".p2align 4\n\t"                                                                           \
	".globl gdrp_" name "_234\n\t"                                                             \
	".type gdrp_" name "_234, @function\n\t"                                                   \
	".globl gdrp_" name "_compat\n\t"                                                          \
	".type gdrp_" name "_compat, @function\n"                                                  \
	"gdrp_" name "_234:\n"                                                                     \
	"gdrp_" name "_compat:\n\t"
#define GDRP_END(name)                                                                             \
	".size gdrp_" name "_234, .-gdrp_" name "_234\n\t"                                         \
	".size gdrp_" name "_compat, .-gdrp_" name "_compat\n\t"                                   \
	".symver gdrp_" name "_234, " name "@@GLIBC_2.34\n\t"                                      \
	".symver gdrp_" name "_compat, " name "@" GDRP_STR(GDRP_GLIBC_COMPAT) "\n\t"

#endif /* GDRP_ARCH_TRAMPOLINE_H */
