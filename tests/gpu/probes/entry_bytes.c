/* SPDX-License-Identifier: MIT */
/*
 * Probe (GPU machine): the first 16 bytes of every libcuda entry point lib/intercept/hooks.c patches
 * (lib/intercept/entries.h, included by its path from here), as loaded, before anything patched
 * them, and whether cuGetProcAddress hands out that same address. Build, in this directory or
 * another: cc -O2 -o entry_bytes entry_bytes.c -ldl (the source tree's lib/ must be beside tests/).
 * Prints one line per function.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

typedef int (*gpa_t)(const char *, void **, int, unsigned long long, int *);

int main(void)
{
	/* lib/intercept/entries.h's rows, then cuMemRelease (not intercepted). */
	static const char *const names[] = {
#define GDR_ENTRY(name, ...) #name,
#include "../../../lib/intercept/entries.h"
		"cuMemRelease",
	};
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	gpa_t gpa;

	if (!h) {
		printf("no libcuda: %s\n", dlerror());
		return 77;
	}
	gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const unsigned char *p = dlsym(h, names[i]);

		printf("%-30s", names[i]);
		if (!p) {
			printf(" not exported\n");
			continue;
		}
		printf(" %p align16 %d:", (void *)p, (int)((unsigned long)p & 15));
		for (int k = 0; k < 16; k++)
			printf(" %02x", p[k]);
		printf("\n");
	}
	if (gpa) {
		static const struct { const char *n; int v; unsigned long long f; const char *exp; } q[] = {
			{ "cuMemFree", 3020, 0, "cuMemFree_v2" }, { "cuMemFree", 2000, 0, "cuMemFree" },
			{ "cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2" },
			{ "cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2" },
			{ "cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease" },
			{ "cuMemFreeAsync", 11020, 2, "cuMemFreeAsync_ptsz" },
			{ "cuMemAllocFromPoolAsync", 11020, 2, "cuMemAllocFromPoolAsync_ptsz" },
		};
		for (unsigned i = 0; i < sizeof(q) / sizeof(q[0]); i++) {
			void *fn = NULL;
			int st = 0;

			gpa(q[i].n, &fn, q[i].v, q[i].f, &st);
			printf("cuGetProcAddress(%s, %d, %llu) = %p: %s\n", q[i].n, q[i].v, q[i].f, fn,
			       fn == dlsym(h, q[i].exp) ? q[i].exp : "ANOTHER ADDRESS");
		}
	}
	return 0;
}
