/* SPDX-License-Identifier: MIT */
/*
 * A program that links libgdrcache itself and registers GPU memory through verbs too, under the
 * preload: the library's error lines it asks for stay on. It makes the library log one error (a
 * cache asked with a reserved field set), registers GPU memory with ibv_reg_mr (the preload's
 * first GPU registration: it creates its cache), then makes the library log the same error
 * again. With the argument "chose" it sets the level itself first (gdr_set_log_level). It prints
 * nothing; preload_test.sh counts the error lines on stderr. Exit 0, or 77 without a device.
 */
#include <gdrcache.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);

static int bad_create(void)
{
	struct gdr_cache_attr a = { 0 };
	struct gdr_cache *c = NULL;

	a.reserved0 = 1;
	return gdr_cache_create(&a, &c);
}

int main(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint64_t g = 0;

	if (cuInit(0) || cuMemAlloc_v2(&g, 1 << 20))
		return 1;
	if (argc > 1 && !strcmp(argv[1], "chose"))
		gdr_set_log_level(GDR_LOG_WARN);
	if (bad_create() != -EINVAL)
		return 1;
	ctx = open_ctx();
	if (!ctx)
		return 77;
	pd = ibv_alloc_pd(ctx);
	mr = pd ? ibv_reg_mr(pd, (void *)(uintptr_t)g, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr)
		return 1;
	if (bad_create() != -EINVAL)
		return 1;
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return 0;
}
