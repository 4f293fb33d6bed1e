/* SPDX-License-Identifier: MIT */
/*
 * For deep_prog.c: a plugin that links libibverbs and is dlopened with RTLD_DEEPBIND, so that its
 * own references bind to libibverbs ahead of the global scope, past the preload. Its ibv_reg_mr is
 * libibverbs' IBVERBS_1.1 function, which reaches ibv_reg_mr_iova2 through libibverbs' own PLT;
 * its ibv_dereg_mr is libibverbs' too.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int deep_lib_reg(struct ibv_pd *pd, void *buf, size_t len, struct ibv_mr **out);
EXPORT int deep_lib_dereg(struct ibv_mr *mr);

/* 0 and the MR in *out, or the registration's errno. */
int deep_lib_reg(struct ibv_pd *pd, void *buf, size_t len, struct ibv_mr **out)
{
	*out = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	return *out ? 0 : errno;
}

int deep_lib_dereg(struct ibv_mr *mr)
{
	return ibv_dereg_mr(mr);
}
