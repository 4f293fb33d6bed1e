/* SPDX-License-Identifier: MIT */
/* NIC memory regions (verbs.c), through a table tests can replace. */
#ifndef GDR_NIC_VERBS_H
#define GDR_NIC_VERBS_H

#include <stdint.h>
#include <infiniband/verbs.h>

struct gdr_verbs_ops {
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				 int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
};
/* libibverbs itself: what a cache uses unless it was given another table (cache/seams.h). */
extern const struct gdr_verbs_ops gdr_verbs_libibverbs;
/* Wrappers returning 0 / -errno, through the table v. */
int gdr_verbs_reg(const struct gdr_verbs_ops *v, struct ibv_pd *pd, void *addr, size_t len,
		  uint64_t iova, int access, struct ibv_mr **mr);
int gdr_verbs_reg_dmabuf(const struct gdr_verbs_ops *v, struct ibv_pd *pd, uint64_t offset,
			 size_t len, uint64_t iova, int fd, int access, struct ibv_mr **mr);
int gdr_verbs_dereg(const struct gdr_verbs_ops *v, struct ibv_mr *mr);
void gdr_mr_keys(const struct ibv_mr *mr, uint32_t *lkey, uint32_t *rkey);
void gdr_mr_range(const struct ibv_mr *mr, uint64_t *base, uint64_t *len);

#endif /* GDR_NIC_VERBS_H */
