/* SPDX-License-Identifier: MIT */
/*
 * For the RTLD_NEXT test (next_prog.c): built twice, as libgdrp_next_a.so (NEXT_NAME "a") and
 * libgdrp_next_b.so ("b"), each defining next_probe (version NEXT_1, next_lib.map) and a function
 * that asks dlsym / dlvsym for the NEXT definition of next_probe after its own object.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

EXPORT const char *next_probe(void);
const char *next_probe(void)
{
	return NEXT_NAME;
}

/* versioned 0: dlsym(RTLD_NEXT, ...); 1: dlvsym(RTLD_NEXT, ..., "NEXT_1"). */
EXPORT void *CAT(next_lookup_, NEXT_ID)(int versioned);
void *CAT(next_lookup_, NEXT_ID)(int versioned)
{
	/* volatile: not a tail call, which would make the lookup the caller's (glibc counts RTLD_NEXT
	 * from the return address) */
	void *volatile r = versioned ? dlvsym(RTLD_NEXT, "next_probe", "NEXT_1")
				     : dlsym(RTLD_NEXT, "next_probe");

	return r;
}
