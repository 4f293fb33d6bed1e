/* SPDX-License-Identifier: MIT */
/*
 * A verbs program as built before libibverbs versioned its symbols: no <infiniband/verbs.h>, linked
 * against an unversioned libibverbs.so.1 (stub_ibverbs.c), so its references carry no version. At
 * run time the dynamic linker gives such references the oldest node, IBVERBS_1.0: in libibverbs its
 * 1.0 compatibility layer, with the preload the preload's IBVERBS_1.0 forwarders.
 * preload_test.sh runs it over the fake libibverbs, with and without the preload.
 *
 * Usage: old_prog --expect cached|direct | --bind-only
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fake_cuda.h"

/* The 1.0-era prototypes, objects opaque. */
void **ibv_get_device_list(int *num);
void ibv_free_device_list(void **list);
void *ibv_open_device(void *device);
int ibv_close_device(void *ctx);
void *ibv_alloc_pd(void *ctx);
int ibv_dealloc_pd(void *pd);
void *ibv_reg_mr(void *pd, void *addr, size_t len, int access);
int ibv_dereg_mr(void *mr);
int cuInit(unsigned int flags);

static int failures;

#define CHECK(cond, what)                                                                          \
	do {                                                                                       \
		int ok_ = (cond);                                                                  \
		printf("%s - %s\n", ok_ ? "ok" : "not ok", what);                                  \
		failures += !ok_;                                                                  \
	} while (0)

int main(int argc, char **argv)
{
	uint64_t (*fcount)(const char *);
	int (*fis_mr)(const void *);
	unsigned (*flive)(const void *);
	void **list, *ctx, *pd, *mr, *mr2;
	void *buf;
	uint64_t reg0;
	int want_cached;

	if (argc > 1 && !strcmp(argv[1], "--bind-only"))
		return 0;
	if (argc < 3 || strcmp(argv[1], "--expect")) {
		fprintf(stderr, "usage: old_prog --expect cached|direct | --bind-only\n");
		return 2;
	}
	want_cached = !strcmp(argv[2], "cached");
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	*(void **)&flive = dlsym(RTLD_DEFAULT, "fake_ibv_live_mrs");
	if (!fcount || !fis_mr || !flive) {
		printf("old_prog: not running over the fake libibverbs\n");
		return 77;
	}
	if (cuInit(0)) {
		printf("not ok - the fake CUDA driver did not start\n");
		return 1;
	}
	list = ibv_get_device_list(NULL);
	ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	ibv_free_device_list(list);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	buf = (void *)(uintptr_t)fake_cuda_alloc(65536);
	if (!pd || !buf) {
		printf("not ok - setup\n");
		return 1;
	}
	reg0 = fcount("reg");
	mr = ibv_reg_mr(pd, buf, 4096, 1 /* IBV_ACCESS_LOCAL_WRITE */);
	mr2 = ibv_reg_mr(pd, buf, 4096, 1);
	CHECK(mr && mr2 && fcount("reg_1_0") == 2, "unversioned ibv_reg_mr reached ibv_reg_mr@IBVERBS_1.0");
	if (want_cached) {
		CHECK(!fis_mr(mr) && !fis_mr(mr2) && fcount("reg") == reg0 + 1,
		      "through the preload: shadow MRs, one real registration for both");
	} else {
		CHECK(fis_mr(mr) && fis_mr(mr2) && fcount("reg") == reg0 + 2,
		      "without the preload: libibverbs' own MRs, one registration each");
	}
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(mr2) == 0 && fcount("dereg_1_0") == 2 &&
	      fcount("dereg_bad") == 0, "unversioned ibv_dereg_mr: 0, through IBVERBS_1.0");
	CHECK(ibv_dealloc_pd(pd) == 0 && fcount("dealloc_pd_1_0") == 1 && flive(NULL) == 0,
	      "unversioned ibv_dealloc_pd: 0 (the cache released its MR first), nothing left");
	CHECK(ibv_close_device(ctx) == 0 && fcount("close_1_0") == 1,
	      "unversioned ibv_close_device: 0, through IBVERBS_1.0");
	fake_cuda_free((uintptr_t)buf);
	printf("old_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
