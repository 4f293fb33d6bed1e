/* SPDX-License-Identifier: MIT */
/*
 * bench_hit with libgdrcache loaded another way: bench_hit_so links libbench_hit_mw.so (the whole
 * benchmark in a shared library that links libgdrcache: how MPI or a UCX provider carries it);
 * bench_hit_dl (BENCH_DLOPEN) dlopens that library at run time, so libgdrcache arrives by dlopen,
 * as a plugin or a Python extension would bring it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int bench_hit_main(int argc, char **argv);

int main(int argc, char **argv)
{
#ifdef BENCH_DLOPEN
	void *h = dlopen("libbench_hit_mw.so", RTLD_NOW | RTLD_LOCAL);
	int (*run)(int, char **);

	if (!h) {
		fprintf(stderr, "bench_hit_dl: %s\n", dlerror());
		return 1;
	}
	*(void **)&run = dlsym(h, "bench_hit_main");
	if (!run)
		return 1;
	setenv("BENCH_LOAD_MODE", "dlopen'ed at run time (a library that links it, dlopen'ed)", 1);
	return run(argc, argv);
#else
	setenv("BENCH_LOAD_MODE", "linked into a shared library the executable links", 1);
	return bench_hit_main(argc, argv);
#endif
}
