/* SPDX-License-Identifier: MIT */
/* NIC memory regions: the few libibverbs calls the library makes, behind a table tests replace. */
#include <errno.h>
#include <infiniband/verbs.h>

#include "common/log.h"
#include "nic/verbs.h"

static struct ibv_mr *real_reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				  int access)
{
	return ibv_reg_mr_iova(pd, addr, len, iova, access);
}

static struct ibv_mr *real_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					 uint64_t iova, int fd, int access)
{
	return ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access);
}

const struct gdr_verbs_ops gdr_verbs_libibverbs = {
	.reg_mr = real_reg_mr,
	.reg_dmabuf_mr = real_reg_dmabuf_mr,
	.dereg_mr = ibv_dereg_mr,
};

/* libibverbs returns NULL and sets errno; make that -errno, never 0. */
static int mr_result(struct ibv_mr *mr, struct ibv_mr **out)
{
	int err = errno;

	if (!mr)
		return err > 0 ? -err : -EIO;
	*out = mr;
	return 0;
}

int gdr_verbs_reg(const struct gdr_verbs_ops *v, struct ibv_pd *pd, void *addr, size_t len,
		  uint64_t iova, int access, struct ibv_mr **mr)
{
	errno = 0;
	return mr_result(v->reg_mr(pd, addr, len, iova, access), mr);
}

int gdr_verbs_reg_dmabuf(const struct gdr_verbs_ops *v, struct ibv_pd *pd, uint64_t offset,
			 size_t len, uint64_t iova, int fd, int access, struct ibv_mr **mr)
{
	errno = 0;
	return mr_result(v->reg_dmabuf_mr(pd, offset, len, iova, fd, access), mr);
}

int gdr_verbs_dereg(const struct gdr_verbs_ops *v, struct ibv_mr *mr)
{
	int rc = v->dereg_mr(mr);

	/* ibv_dereg_mr returns an errno value (positive) on failure. */
	if (rc)
		gdr_err("ibv_dereg_mr: %d", rc);
	return rc > 0 ? -rc : rc;
}

void gdr_mr_keys(const struct ibv_mr *mr, uint32_t *lkey, uint32_t *rkey)
{
	if (lkey)
		*lkey = mr->lkey;
	if (rkey)
		*rkey = mr->rkey;
}

void gdr_mr_range(const struct ibv_mr *mr, uint64_t *base, uint64_t *len)
{
	*base = (uintptr_t)mr->addr;
	*len = mr->length;
}
