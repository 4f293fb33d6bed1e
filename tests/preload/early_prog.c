/* SPDX-License-Identifier: MIT */
/*
 * A program whose verbs were resolved before the preload had run any code of its own: by a library
 * it links (early_lib.c), in that library's constructor, which runs before the preload's (glibc
 * runs a program's own libraries' constructors before those of LD_PRELOAD objects, which none of
 * them depends on; the earlier hook, DT_PREINIT_ARRAY, can not dlopen: libc would initialise with
 * no environment). The process's dlsym / dlvsym are already the preload's there, and must work
 * before its constructor: it resolves libibverbs' definitions on first use.
 *
 * What is not possible: verbs resolved past the process's dlsym (libc's own dlvsym taken from
 * libc.so.6's handle, a dlmopen namespace) are libibverbs' own, uncached (libibverbs' ibv_reg_mr
 * reaches its own ibv_reg_mr_iova2, not the preload's): preload/README.md.
 *
 * Usage: early_prog --expect cached|disabled|direct   (preload_test.sh, over the fake libibverbs)
 *   disabled: with the preload and GDRCACHE_DISABLE=1: the preload's functions, libibverbs' MRs
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "owner.h"

int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

struct verbs {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr)(struct ibv_mr *);
};

/* early_lib.c: what its constructor resolved through the process's dlvsym. */
int early_lib_verbs(struct verbs *early, void **handle);

static struct verbs early;
static void *early_handle;

/* Two registrations of one GPU buffer through v; whether they were cached. */
static void use(const char *what, struct verbs *v, int want_cached)
{
	uint64_t (*fcount)(const char *) =
		(uint64_t(*)(const char *))dlsym(early_handle, "fake_ibv_count");
	int (*fis_mr)(const struct ibv_mr *) =
		(int (*)(const struct ibv_mr *))dlsym(early_handle, "fake_ibv_is_mr");
	struct ibv_device **l = v->get_device_list(NULL);
	struct ibv_context *ctx = l && l[0] ? v->open_device(l[0]) : NULL;
	struct ibv_pd *pd;
	struct ibv_mr *a, *b;
	uint64_t g = 0, reg0;

	v->free_device_list(l);
	pd = ctx ? v->alloc_pd(ctx) : NULL;
	cuMemAlloc_v2(&g, 65536);
	if (!pd || !g || !fcount || !fis_mr) {
		CHECK(0, "%s: setup", what);
		return;
	}
	reg0 = fcount("reg");
	a = v->reg_mr(pd, (void *)(uintptr_t)g, 4096, IBV_ACCESS_LOCAL_WRITE);
	b = v->reg_mr(pd, (void *)(uintptr_t)g, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (want_cached)
		CHECK(a && b && !fis_mr(a) && !fis_mr(b) && fcount("reg") == reg0 + 1,
		      "%s: shadow MRs, one registration for both", what);
	else
		CHECK(a && b && fis_mr(a) && fis_mr(b) && fcount("reg") == reg0 + 2,
		      "%s: libibverbs' own MRs, one registration each", what);
	CHECK(v->dereg_mr(a) == 0 && v->dereg_mr(b) == 0 && fcount("dereg_bad") == 0,
	      "%s: released by the same route, no shadow reached libibverbs", what);
	CHECK(v->dealloc_pd(pd) == 0 && v->close_device(ctx) == 0, "%s: PD and device released",
	      what);
	cuMemFree_v2(g);
}

int main(int argc, char **argv)
{
	int want_cached = argc > 2 && !strcmp(argv[2], "cached");
	int ours = want_cached || (argc > 2 && !strcmp(argv[2], "disabled"));

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 3 || strcmp(argv[1], "--expect")) {
		fprintf(stderr, "usage: early_prog --expect cached|disabled|direct\n");
		return 2;
	}
	CHECK(early_lib_verbs(&early, &early_handle),
	      "libibverbs dlopened and resolved in a library's constructor");
	if (!early_handle || cuInit(0))
		return 1;
	CHECK(owner((void *)early.reg_mr) == (ours ? 'p' : 'v') &&
	      owner((void *)early.dereg_mr) == owner((void *)early.reg_mr) &&
	      owner((void *)early.open_device) == 'v',
	      "the process's dlvsym, before any constructor: %s registration functions",
	      ours ? "the preload's" : "libibverbs'");
	use("resolved early", &early, want_cached);
	printf("early_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
