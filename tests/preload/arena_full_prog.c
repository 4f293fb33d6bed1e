/* SPDX-License-Identifier: MIT */
/*
 * The preload's record arena full. RLIMIT_AS, set just above what the process
 * has mapped (the fake CUDA driver's and the cache's own), makes the preload reserve a small arena
 * (mrtab.c: it tries 1 GiB, then a quarter at a time down to 16 MiB). Shadows are taken until one
 * registration is not a shadow: it must be libibverbs' own MR (passed through), never a failure;
 * every MR is then released exactly once (0, nothing unknown reaches libibverbs); and records
 * released make the next registration a shadow again.
 * Exit 0 pass, 1 fail, 77 not over the fakes (or the arena could not be made small).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuMemAlloc_v2(uint64_t *p, size_t size);

#define MAXMR (((size_t)1 << 30) / 128 + 16) /* more than the largest arena holds */

static long vm_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char l[256];
	long v = -1;

	while (f && fgets(l, sizeof(l), f))
		if (!strncmp(l, "VmSize:", 7))
			sscanf(l + 7, "%ld", &v);
	if (f)
		fclose(f);
	return v;
}

int main(void)
{
	uint64_t (*fcount)(const char *);
	int (*fis_mr)(const struct ibv_mr *);
	struct ibv_mr **mrs = calloc(MAXMR, sizeof(*mrs)), *m;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	size_t n = 0, bad = 0;
	uint64_t p = 0, bad0;
	struct rlimit rl;
	void *cuctx;
	long vm;
	int failures = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	if (!fcount || !fis_mr || !mrs) {
		printf("arena_full_prog: not running over the fake libibverbs\n");
		return 77;
	}
	if (cuInit(0) || cuDevicePrimaryCtxRetain(&cuctx, 0) || cuCtxSetCurrent(cuctx) ||
	    cuMemAlloc_v2(&p, 65536)) {
		printf("not ok - the fake CUDA driver did not start\n");
		return 1;
	}
	ctx = open_ctx();
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		return 1;
	/* the cache takes about 32 MiB of address space when it is made: leave it that and 40 MiB */
	vm = vm_kb();
	rl.rlim_cur = rl.rlim_max = (rlim_t)(vm + 72 * 1024) * 1024;
	if (vm < 0 || setrlimit(RLIMIT_AS, &rl)) {
		printf("arena_full_prog: no RLIMIT_AS\n");
		return 77;
	}
	bad0 = fcount("dereg_bad");
	while (n < MAXMR) {
		m = ibv_reg_mr(pd, (void *)(uintptr_t)p, 4096, IBV_ACCESS_LOCAL_WRITE);
		if (!m) {
			printf("not ok - registration %zu failed (errno %d): the arena full must pass "
			       "through\n",
			       n, errno);
			failures++;
			break;
		}
		mrs[n++] = m;
		if (fis_mr(m))
			break; /* the first one not a shadow */
	}
	if (n < 2 || !fis_mr(mrs[n - 1]) || n == MAXMR) {
		printf("arena_full_prog: %zu registrations, the arena never filled (or no cache)\n", n);
		return n < 2 ? 77 : 1;
	}
	printf("ok - %zu shadows filled the arena; the next GPU registration is libibverbs' own MR\n",
	       n - 1);
	m = ibv_reg_mr(pd, (void *)(uintptr_t)p + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!m || !fis_mr(m)) {
		printf("not ok - another registration while full: %p\n", (void *)m);
		failures++;
	}
	if (m && ibv_dereg_mr(m))
		bad++;
	for (size_t i = n; i-- > n - 100;) /* the last ones, then one again */
		if (ibv_dereg_mr(mrs[i]))
			bad++;
	mrs[n - 100] = ibv_reg_mr(pd, (void *)(uintptr_t)p, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!mrs[n - 100] || fis_mr(mrs[n - 100])) {
		printf("not ok - records released: the next registration is not a shadow\n");
		failures++;
	}
	for (size_t i = 0; i <= n - 100; i++)
		if (!mrs[i] || ibv_dereg_mr(mrs[i]))
			bad++;
	for (size_t i = 0; i < 100; i++)
		if (ibv_dereg_mr(mrs[i]) != EINVAL)
			bad++;
	if (bad || fcount("dereg_bad") != bad0) {
		printf("not ok - %zu releases went wrong, %llu unknown MRs reached libibverbs\n", bad,
		       (unsigned long long)(fcount("dereg_bad") - bad0));
		failures++;
	} else {
		printf("ok - every MR released once (0), a second release refused (EINVAL)\n");
	}
	printf("arena_full_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
