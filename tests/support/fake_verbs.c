/* SPDX-License-Identifier: MIT */
/* SIMULATION of libibverbs' MR calls for unit tests: no NIC here. MRs are heap objects with
 * distinct keys; failures are injected with fake_verbs.fail_next_*; outstanding MRs are counted. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdlib.h>

#include "fake_cuda.h"
#include "fakes.h"

struct fake_verbs_state fake_verbs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_key = 0x100;

static struct ibv_mr *new_mr(struct ibv_pd *pd, void *addr, size_t len, bool dmabuf)
{
	struct ibv_mr *mr = NULL;

	pthread_mutex_lock(&lock);
	if (fake_verbs.fail_next_n) {
		fake_verbs.fail_next_n--;
		errno = fake_verbs.fail_next_errno;
		goto out;
	}
	mr = calloc(1, sizeof(*mr));
	mr->pd = pd;
	mr->addr = addr;
	mr->length = len;
	mr->lkey = next_key++;
	mr->rkey = next_key++;
	fake_verbs.outstanding++;
	if (dmabuf)
		fake_verbs.dmabuf_regs++;
	else
		fake_verbs.regs++;
out:
	pthread_mutex_unlock(&lock);
	return mr;
}

static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	(void)iova, (void)access;
	return new_mr(pd, addr, len, false);
}

static struct ibv_mr *f_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
				      int fd, int access)
{
	(void)offset, (void)fd, (void)access;
	if (fd < 0) {
		errno = EBADF;
		return NULL;
	}
	return new_mr(pd, (void *)(uintptr_t)iova, len, true);
}

static int f_dereg_mr(struct ibv_mr *mr)
{
	pthread_mutex_lock(&lock);
	fake_verbs.deregs++;
	fake_verbs.outstanding--;
	pthread_mutex_unlock(&lock);
	free(mr);
	return 0;
}

static const struct gdr_verbs_ops fake_ops = {
	.reg_mr = f_reg_mr,
	.reg_dmabuf_mr = f_reg_dmabuf_mr,
	.dereg_mr = f_dereg_mr,
};

struct gdr_cache_seams fake_seams;

int fake_cache_create(const struct gdr_cache_attr *attr, const struct gdr_backend_ops *ops,
		      struct gdr_cache **cache)
{
	struct gdr_cache_seams s = fake_seams;

	s.backend = ops;
	return gdr_cache_create_seams(attr, &s, cache);
}

void fake_verbs_install(void)
{
	fake_seams.verbs = &fake_ops;
}

void fakes_reset(void)
{
	fake_cuda_reset();
	fake_backend_reset();
	fake_verbs_install();
	fake_verbs = (struct fake_verbs_state){ 0 };
}
