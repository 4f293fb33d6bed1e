/* SPDX-License-Identifier: MIT */
/*
 * A program that dlopens a plugin linking libibverbs with RTLD_DEEPBIND (deep_lib.c): the plugin's
 * verbs are libibverbs' own, with or without the preload, and what it registers must be what its
 * ibv_dereg_mr can release. libibverbs' ibv_reg_mr reaches ibv_reg_mr_iova2 through its PLT, which
 * the global scope binds to the preload: a shadow MR handed back there reaches libibverbs'
 * ibv_dereg_mr (EINVAL from the fake; a real provider destroys the cached MR by the shadow's
 * handle, then frees the shadow).
 *
 * Usage: deep_prog PLUGIN   (preload_test.sh deepbind, over the fake libibverbs)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

int main(int argc, char **argv)
{
	int (*reg)(struct ibv_pd *, void *, size_t, struct ibv_mr **);
	int (*dereg)(struct ibv_mr *);
	uint64_t (*fcount)(const char *);
	int (*fis_mr)(const struct ibv_mr *);
	struct ibv_context *ctx;
	struct ibv_mr *a = NULL, *b = NULL, *mine;
	struct ibv_pd *pd;
	uint64_t g = 0, bad0;
	void *h;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2) {
		fprintf(stderr, "usage: deep_prog PLUGIN\n");
		return 2;
	}
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	if (!fcount || !fis_mr || cuInit(0) || cuMemAlloc_v2(&g, 65536)) {
		printf("setup failed (the fake libibverbs and CUDA driver)\n");
		return 77;
	}
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
	*(void **)&reg = h ? dlsym(h, "deep_lib_reg") : NULL;
	*(void **)&dereg = h ? dlsym(h, "deep_lib_dereg") : NULL;
	ctx = open_ctx();
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!reg || !dereg || !pd) {
		printf("setup failed: %s\n", h ? "no device" : dlerror());
		return 1;
	}
	bad0 = fcount("dereg_bad");
	/* the program's own registration of the buffer first (cached under the preload): the
	 * plugin's must not be served from it */
	mine = ibv_reg_mr(pd, (void *)(uintptr_t)g, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mine != NULL, "the program registers the GPU buffer");
	CHECK(reg(pd, (void *)(uintptr_t)g, 4096, &a) == 0 &&
		      reg(pd, (void *)(uintptr_t)g + 8192, 4096, &b) == 0,
	      "the plugin (RTLD_DEEPBIND) registers two ranges of it");
	CHECK(a && b && fis_mr(a) && fis_mr(b),
	      "the plugin's MRs are libibverbs' own (its verbs are libibverbs')");
	CHECK(a && dereg(a) == 0 && b && dereg(b) == 0,
	      "the plugin's ibv_dereg_mr releases them: 0");
	CHECK(fcount("dereg_bad") == bad0, "no MR libibverbs does not know reached it (%llu)",
	      (unsigned long long)(fcount("dereg_bad") - bad0));
	CHECK(mine && ibv_dereg_mr(mine) == 0, "the program's own registration is released");
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "PD and device released");
	cuMemFree_v2(g);
	printf("deep_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
