/* SPDX-License-Identifier: MIT */
/*
 * A program built against today's rdma-core: linked against the fake libibverbs with its newer
 * nodes, so that it refers to ibv_reg_mr_ex@IBVERBS_1.15 and ibv_alloc_buf / ibv_reg_buf_mr /
 * ibv_free_buf@IBVERBS_1.17 (Debian 12's headers lack them: declared here under other C names).
 * With the preload (--expect cached), an address registration of GPU memory through ibv_reg_mr_ex
 * is served from the cache; everything else it can express (iova != addr, ODP, a dma-buf fd, a DMA
 * handle, a provider buffer, host memory) reaches libibverbs unchanged. Without it (--expect
 * direct) every one is libibverbs' MR. preload_test.sh also checks the bindings (LD_DEBUG).
 *
 * Usage: new_prog --expect cached|direct | --bind-only
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

/* rdma-core's struct ibv_mr_init_attr and enum ibv_mr_init_attr_mask (verbs.h, rdma-core 58+). */
struct mr_init_attr {
	size_t length;
	int access;
	uint64_t comp_mask;
	uint64_t iova;
	void *addr;
	int fd;
	uint64_t fd_offset;
	void *dmah;
	void *buf;
};
enum { M_IOVA = 1 << 0, M_ADDR = 1 << 1, M_FD = 1 << 2, M_FD_OFFSET = 1 << 3, M_DMAH = 1 << 4 };

struct ibv_mr *t_reg_mr_ex(struct ibv_pd *pd, struct mr_init_attr *a) __asm__("ibv_reg_mr_ex");
void *t_alloc_buf(struct ibv_pd *pd, size_t size, void **buf) __asm__("ibv_alloc_buf");
void t_free_buf(void *buf) __asm__("ibv_free_buf");
struct ibv_mr *t_reg_buf_mr(struct ibv_pd *pd, void *buf, void *addr, size_t len, int access)
	__asm__("ibv_reg_buf_mr");

static uint64_t (*fcount)(const char *);
static int (*fis_mr)(const struct ibv_mr *);
static int (*finfo)(const struct ibv_mr *, int *, uint64_t *);

static struct ibv_mr *reg_ex(struct ibv_pd *pd, uint64_t mask, void *addr, size_t len, int access,
			     uint64_t iova)
{
	struct mr_init_attr a = { .length = len, .access = access, .comp_mask = mask, .iova = iova,
				  .addr = addr, .fd = 0, .fd_offset = 0 };

	return t_reg_mr_ex(pd, &a);
}

int main(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *a, *b, *mr;
	uint64_t g = 0, reg0, iova = 0;
	int cached, acc = 0;
	char *gpu, *host;
	void *buf = NULL, *bufmem;

	if (argc > 1 && !strcmp(argv[1], "--bind-only"))
		return 0;
	if (argc < 3 || strcmp(argv[1], "--expect")) {
		fprintf(stderr, "usage: new_prog --expect cached|direct | --bind-only\n");
		return 2;
	}
	cached = !strcmp(argv[2], "cached");
	setvbuf(stdout, NULL, _IOLBF, 0);
	host = malloc(8192);
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	*(void **)&finfo = dlsym(RTLD_DEFAULT, "fake_ibv_mr_info");
	if (!fcount || !fis_mr || !finfo || cuInit(0) || cuMemAlloc_v2(&g, 65536) || !host) {
		printf("not ok - setup (the fake libibverbs and CUDA driver)\n");
		return 1;
	}
	gpu = (char *)(uintptr_t)g;
	ctx = open_ctx();
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		printf("not ok - the fake device did not open\n");
		return 1;
	}

	reg0 = fcount("reg");
	a = reg_ex(pd, M_ADDR, gpu, 4096, IBV_ACCESS_LOCAL_WRITE, 0);
	b = reg_ex(pd, M_ADDR | M_IOVA, gpu + 4096, 4096, IBV_ACCESS_LOCAL_WRITE,
		   (uintptr_t)gpu + 4096);
	if (cached)
		CHECK(a && b && !fis_mr(a) && !fis_mr(b) && a->lkey == b->lkey &&
		      fcount("reg") == reg0 + 1,
		      "ibv_reg_mr_ex of GPU memory (ADDR, ADDR|IOVA == addr): shadows of one cached MR");
	else
		CHECK(a && b && fis_mr(a) && fis_mr(b) && fcount("reg") == reg0 + 2,
		      "ibv_reg_mr_ex of GPU memory: libibverbs' own MRs");
	CHECK(a && a->addr == gpu && a->length == 4096 && a->pd == pd && b && b->addr == gpu + 4096,
	      "they carry the caller's addr, length and pd");
	CHECK(ibv_dereg_mr(a) == 0 && ibv_dereg_mr(b) == 0, "released with ibv_dereg_mr");

	mr = reg_ex(pd, M_ADDR | M_IOVA, gpu, 4096, IBV_ACCESS_LOCAL_WRITE, 0x10000);
	CHECK(mr && fis_mr(mr) && finfo(mr, &acc, &iova) == 0 && iova == 0x10000,
	      "iova != addr: libibverbs' MR, that iova");
	ibv_dereg_mr(mr);
	mr = reg_ex(pd, M_ADDR, gpu, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND, 0);
	CHECK(mr && fis_mr(mr), "IBV_ACCESS_ON_DEMAND: libibverbs' MR");
	ibv_dereg_mr(mr);
	mr = reg_ex(pd, M_ADDR, host, 8192, IBV_ACCESS_LOCAL_WRITE, 0);
	CHECK(mr && fis_mr(mr) && mr->addr == host, "host memory: libibverbs' MR, unchanged");
	ibv_dereg_mr(mr);
	{
		struct mr_init_attr fd = { .length = 4096, .access = IBV_ACCESS_LOCAL_WRITE,
					   .comp_mask = M_FD | M_FD_OFFSET | M_IOVA,
					   .iova = 0x30000, .fd = 0, .fd_offset = 0 };
		uint64_t d0 = fcount("dmabuf");

		mr = t_reg_mr_ex(pd, &fd);
		CHECK(mr && fis_mr(mr) && fcount("dmabuf") == d0 + 1,
		      "a dma-buf fd (FD | FD_OFFSET | IOVA): libibverbs' MR");
		ibv_dereg_mr(mr);
	}
	errno = 0;
	mr = reg_ex(pd, M_ADDR | M_DMAH, gpu, 4096, IBV_ACCESS_LOCAL_WRITE, 0);
	CHECK(!mr && errno == EOPNOTSUPP,
	      "a DMA handle reaches libibverbs, whose answer stands (here EOPNOTSUPP)");
	errno = 0;
	mr = reg_ex(pd, M_ADDR, gpu, 4096, IBV_ACCESS_REMOTE_WRITE, 0);
	CHECK(!mr && errno == EINVAL, "remote write without local write: EINVAL, as libibverbs says");

	bufmem = t_alloc_buf(pd, 8192, &buf);
	reg0 = fcount("reg_buf");
	mr = bufmem ? t_reg_buf_mr(pd, buf, bufmem, 8192, IBV_ACCESS_LOCAL_WRITE) : NULL;
	CHECK(mr && fis_mr(mr) && mr->addr == bufmem && fcount("reg_buf") == reg0 + 1,
	      "ibv_reg_buf_mr@IBVERBS_1.17 of a provider buffer: libibverbs' MR");
	CHECK(ibv_dereg_mr(mr) == 0 && fcount("dereg_bad") == 0,
	      "every release returns 0; no shadow reached libibverbs' ibv_dereg_mr");
	if (buf)
		t_free_buf(buf);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "PD and device released");
	cuMemFree_v2(g);
	free(host);
	printf("new_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
