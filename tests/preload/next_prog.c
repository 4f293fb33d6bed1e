/* SPDX-License-Identifier: MIT */
/*
 * RTLD_NEXT through the preload's dlsym and dlvsym: they must hand the lookup on with the caller's
 * return address, or "next" would be counted from the preload. The program links
 * libgdrp_next_a.so then libgdrp_next_b.so, both defining next_probe; the global scope is then
 * program, [sanitizer runtime,] preload, ..., a, b. From a, the next next_probe is b's; from b
 * there is none; from the program, a's. A forwarder that called dlsym from the preload would answer a's
 * for all three. preload_test.sh runs it with the preload (--expect preload: dlsym and dlvsym are
 * the preload's) and without it (--expect libc), where the answers must be the same.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

void *next_lookup_a(int versioned);
void *next_lookup_b(int versioned);
const char *next_probe(void);

static const char *call(void *fn)
{
	return fn ? ((const char *(*)(void))fn)() : "none";
}

static const char *object_of(void *fn)
{
	Dl_info info = { 0 };

	return fn && dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "?";
}

int main(int argc, char **argv)
{
	int via_preload = argc > 2 && !strcmp(argv[2], "preload");
	const char *o1 = object_of((void *)dlsym), *o2 = object_of((void *)dlvsym);

	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(!!strstr(o1, "libgdrcache-preload") == via_preload &&
	      !!strstr(o2, "libgdrcache-preload") == via_preload, "dlsym is %s's, dlvsym %s's", o1, o2);
	CHECK(!strcmp(next_probe(), "a"), "the program binds next_probe to a (%s)", next_probe());
	for (int ver = 0; ver < 2; ver++) {
		const char *how = ver ? "dlvsym" : "dlsym";
		void *p = ver ? dlvsym(RTLD_NEXT, "next_probe", "NEXT_1") : dlsym(RTLD_NEXT, "next_probe");

		CHECK(!strcmp(call(p), "a"), "%s(RTLD_NEXT) from the program: a's (%s)", how, call(p));
		CHECK(!strcmp(call(next_lookup_a(ver)), "b"), "%s(RTLD_NEXT) from a: b's (%s)", how,
		      call(next_lookup_a(ver)));
		CHECK(!next_lookup_b(ver), "%s(RTLD_NEXT) from b: none (%s)", how,
		      call(next_lookup_b(ver)));
	}
	printf("next_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
