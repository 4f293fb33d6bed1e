/* SPDX-License-Identifier: MIT */
/*
 * dlsym and dlvsym for processes that get libgdrcache through this preload library. Under
 * LD_PRELOAD libgdrcache.so is loaded as this library's dependency, after libc in the global
 * lookup order, so its own dlsym (lib/hooks.c: how the CUDA driver's free functions are wrapped
 * for validation mode "events") is never the one programs bind. These definitions come first and
 * JUMP to libgdrcache's private entries (gdr_private_dlsym / _dlvsym), which are the same
 * trampolines: the next dlsym still sees the caller's return address, so RTLD_NEXT keeps its
 * meaning. The start-up probe then decides as in a linked program; where libcuda itself comes
 * before libgdrcache (a program linked with -lcuda), direct calls of the driver's free functions
 * bypass the forwarders, the probe says so, and the caches check tags. x86-64 only, as
 * libgdrcache's trampolines; elsewhere nothing is exported and tags are checked.
 */
#if defined(__x86_64__)
#ifdef __CET__
#define ENDBR "endbr64\n\t"
#else
#define ENDBR ""
#endif
__asm__(".text\n\t"
	".p2align 4\n\t"
	".globl gdr_preload_dlsym_234\n\t"
	".type gdr_preload_dlsym_234, @function\n\t"
	".globl gdr_preload_dlsym_225\n\t"
	".type gdr_preload_dlsym_225, @function\n"
	"gdr_preload_dlsym_234:\n"
	"gdr_preload_dlsym_225:\n\t"
	ENDBR
	"jmp gdr_private_dlsym@PLT\n\t"
	".size gdr_preload_dlsym_234, .-gdr_preload_dlsym_234\n\t"
	".size gdr_preload_dlsym_225, .-gdr_preload_dlsym_225\n\t"
	".symver gdr_preload_dlsym_234, dlsym@@GLIBC_2.34\n\t"
	".symver gdr_preload_dlsym_225, dlsym@GLIBC_2.2.5\n\t"
	".p2align 4\n\t"
	".globl gdr_preload_dlvsym_234\n\t"
	".type gdr_preload_dlvsym_234, @function\n\t"
	".globl gdr_preload_dlvsym_225\n\t"
	".type gdr_preload_dlvsym_225, @function\n"
	"gdr_preload_dlvsym_234:\n"
	"gdr_preload_dlvsym_225:\n\t"
	ENDBR
	"jmp gdr_private_dlvsym@PLT\n\t"
	".size gdr_preload_dlvsym_234, .-gdr_preload_dlvsym_234\n\t"
	".size gdr_preload_dlvsym_225, .-gdr_preload_dlvsym_225\n\t"
	".symver gdr_preload_dlvsym_234, dlvsym@@GLIBC_2.34\n\t"
	".symver gdr_preload_dlvsym_225, dlvsym@GLIBC_2.2.5\n\t"
	".previous");
#endif
