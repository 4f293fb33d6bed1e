/* SPDX-License-Identifier: MIT */
/*
 * IBVERBS_1.0: what programs linked against an old, unversioned libibverbs bind to. libibverbs'
 * 1.0 functions wrap 1.0-layout objects around the current ones and call the 1.1 functions through
 * its PLT, which reaches the preload's own (interpose.c): these forward, ibv_reg_mr marking its
 * call (gdrp_in_1_0) so that libibverbs' ibv_reg_mr_iova2 call under it is served as a registration.
 * interpose.c's binding table resolves gdrp_real_1_0 and names these as their stand-ins.
 */
#include <errno.h>
#include <stddef.h>

#include "preload.h"

struct gdrp_real_1_0 gdrp_real_1_0;

GDRP_SYMBOL("ibv_reg_mr@IBVERBS_1.0")
struct ibv_mr *gdrp_reg_mr_1_0(void *pd, void *addr, size_t len, int access)
{
	struct ibv_mr *mr;

	gdrp_setup();
	if (!gdrp_real_1_0.reg_mr) {
		errno = ENOSYS;
		return NULL;
	}
	/* its ibv_reg_mr_iova2 call is the program's registration: served by the preload */
	gdrp_in_1_0++;
	mr = gdrp_real_1_0.reg_mr(pd, addr, len, access);
	gdrp_in_1_0--;
	return mr;
}

GDRP_SYMBOL("ibv_dereg_mr@IBVERBS_1.0")
int gdrp_dereg_mr_1_0(void *mr)
{
	gdrp_setup();
	return gdrp_real_1_0.dereg_mr ? gdrp_real_1_0.dereg_mr(mr) : ENOSYS;
}

GDRP_SYMBOL("ibv_dealloc_pd@IBVERBS_1.0")
int gdrp_dealloc_pd_1_0(void *pd)
{
	gdrp_setup();
	return gdrp_real_1_0.dealloc_pd ? gdrp_real_1_0.dealloc_pd(pd) : ENOSYS;
}

GDRP_SYMBOL("ibv_close_device@IBVERBS_1.0")
int gdrp_close_device_1_0(void *ctx)
{
	gdrp_setup();
	return gdrp_real_1_0.close_device ? gdrp_real_1_0.close_device(ctx) : ENOSYS;
}
