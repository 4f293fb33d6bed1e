/* SPDX-License-Identifier: MIT */
/*
 * gdr_rdma_demo: a verbs program that moves GPU buffers with RDMA WRITE and registers them around
 * every message: the naive pattern a registration cache exists for. It runs the same loop twice,
 * registering with plain ibv_reg_mr / ibv_dereg_mr and then with gdr_reg / gdr_dereg, verifies
 * every payload at the receiver, and every `--realloc` messages frees the sending buffer and
 * allocates a new one (at the same address, as CUDA does) to show that the cache never sends from
 * a stale registration. It prints messages per second for both and the cache's statistics.
 *
 * Both ends are two RC queue pairs of one RDMA device connected to each other (on soft-RoCE in
 * the project's VM, both on rxe0). GPU memory comes from the CUDA driver API (dlopen of
 * libcuda.so.1): the real driver on a GPU machine, the project's fake one in the VM.
 *
 * Usage: gdr_rdma_demo [-d device] [-g gid_index] [-n messages] [-s size] [-r realloc_every]
 * Exit status: 0 all payloads verified, 1 a payload was wrong, 2 setup failed, 77 no device/GPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gdrcache.h>

typedef unsigned long long CUdeviceptr;
static int (*cuInit)(unsigned);
static int (*cuDeviceGet)(int *, int);
static int (*cuDevicePrimaryCtxRetain)(void **, int);
static int (*cuCtxSetCurrent)(void *);
static int (*cuMemAlloc)(CUdeviceptr *, size_t);
static int (*cuMemFree)(CUdeviceptr);
static int (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static int (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);

static const char *dev_name;
static int gid_index = 1, messages = 2000, realloc_every = 100;
static size_t size = 64 * 1024;

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp[2];
static union ibv_gid gid;

static int load_cuda(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	void *cuctx;
	int dev;

	if (!h)
		return -1;
#define SYM(f, n) (*(void **)&f = dlsym(h, n))
	if (!SYM(cuInit, "cuInit") || !SYM(cuDeviceGet, "cuDeviceGet") ||
	    !SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
	    !SYM(cuCtxSetCurrent, "cuCtxSetCurrent") || !SYM(cuMemAlloc, "cuMemAlloc_v2") ||
	    !SYM(cuMemFree, "cuMemFree_v2") || !SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2") ||
	    !SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2"))
		return -1;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&cuctx, dev) ||
	    cuCtxSetCurrent(cuctx))
		return -1;
	return 0;
}

static int open_device(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *d = NULL;

	for (int i = 0; list && list[i]; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name)) {
			d = list[i];
			break;
		}
	if (!d) {
		fprintf(stderr, "gdr_rdma_demo: no RDMA device %s\n", dev_name ? dev_name : "");
		return -1;
	}
	ctx = ibv_open_device(d);
	ibv_free_device_list(list);
	if (!ctx || !(pd = ibv_alloc_pd(ctx)) || !(cq = ibv_create_cq(ctx, 64, NULL, NULL, 0)) ||
	    ibv_query_gid(ctx, 1, gid_index, &gid))
		return -1;
	return 0;
}

static int connect_qps(void)
{
	struct ibv_port_attr port;
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	if (ibv_query_port(ctx, 1, &port))
		return -1;
	for (int i = 0; i < 2; i++)
		if (!(qp[i] = ibv_create_qp(pd, &init)))
			return -1;
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0,
			.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		};

		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
			return -1;
		a = (struct ibv_qp_attr){
			.qp_state = IBV_QPS_RTR, .path_mtu = port.active_mtu,
			.dest_qp_num = qp[1 - i]->qp_num, .rq_psn = 0, .max_dest_rd_atomic = 1,
			.min_rnr_timer = 12,
			.ah_attr = { .is_global = 1, .port_num = 1,
				     .grh = { .dgid = gid, .sgid_index = (uint8_t)gid_index,
					      .hop_limit = 1 } },
		};
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
			return -1;
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
					  .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1 };
		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			return -1;
	}
	return 0;
}

static int rdma_write(CUdeviceptr src, uint32_t lkey, CUdeviceptr dst, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = src, .length = (uint32_t)size, .lkey = lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = dst, .rkey = rkey },
	}, *bad;
	struct ibv_wc wc;
	int n;

	if (ibv_post_send(qp[0], &wr, &bad))
		return -1;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "gdr_rdma_demo: completion %s\n",
			n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
		return -1;
	}
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One run of the loop; cache NULL means plain ibv_reg_mr. Returns messages/s, or < 0 on error. */
static double run(struct gdr_cache *cache, int *wrong, int *same_va, double *reg_us)
{
	double treg = 0, tr;
	uint32_t *host = malloc(size), *check = malloc(size);
	CUdeviceptr src, dst;
	double t0, t;

	if (cuMemAlloc(&src, size) || cuMemAlloc(&dst, size))
		return -1;
	t0 = now();
	for (int m = 0; m < messages; m++) {
		struct gdr_region *rs = NULL, *rd = NULL;
		struct ibv_mr *ms = NULL, *md = NULL;
		uint32_t lkey, rkey;

		if (m && realloc_every && m % realloc_every == 0) {
			CUdeviceptr old = src;

			cuMemFree(src);
			if (cuMemAlloc(&src, size))
				return -1;
			*same_va += src == old;
		}
		for (size_t i = 0; i < size / 4; i++)
			host[i] = (uint32_t)m * 2654435761u + (uint32_t)i;
		cuMemcpyHtoD(src, host, size);

		/* register around every message, as naive code does */
		tr = now();
		if (cache) {
			if (gdr_reg(cache, pd, (void *)src, size, IBV_ACCESS_LOCAL_WRITE, &rs) ||
			    gdr_reg(cache, pd, (void *)dst, size,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &rd))
				return -1;
			gdr_region_keys(rs, &lkey, NULL);
			gdr_region_keys(rd, NULL, &rkey);
		} else {
			ms = ibv_reg_mr(pd, (void *)src, size, IBV_ACCESS_LOCAL_WRITE);
			md = ibv_reg_mr(pd, (void *)dst, size,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
			if (!ms || !md)
				return -1;
			lkey = ms->lkey;
			rkey = md->rkey;
		}
		treg += now() - tr;
		if (rdma_write(src, lkey, dst, rkey))
			return -1;
		tr = now();
		if (cache) {
			gdr_dereg(rs);
			gdr_dereg(rd);
		} else {
			ibv_dereg_mr(ms);
			ibv_dereg_mr(md);
		}
		treg += now() - tr;
		/* the receiver verifies every payload */
		cuMemcpyDtoH(check, dst, size);
		if (memcmp(check, host, size))
			++*wrong;
	}
	t = now() - t0;
	*reg_us = treg / messages * 1e6;
	cuMemFree(src);
	cuMemFree(dst);
	free(host);
	free(check);
	return messages / t;
}

int main(int argc, char **argv)
{
	struct gdr_cache *cache;
	struct gdr_cache_stats s;
	int wrong0 = 0, wrong1 = 0, va0 = 0, va1 = 0, opt;
	double plain, cached, reg_plain, reg_cached;
	enum gdr_backend be;
	static const char *const names[] = { "auto", "kmod", "dmabuf", "peermem" };

	while ((opt = getopt(argc, argv, "d:g:n:s:r:")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'g': gid_index = atoi(optarg); break;
		case 'n': messages = atoi(optarg); break;
		case 's': size = strtoull(optarg, NULL, 0); break;
		case 'r': realloc_every = atoi(optarg); break;
		default: return 2;
		}
	}
	if (load_cuda()) {
		printf("gdr_rdma_demo: no CUDA driver or GPU: skipped\n");
		return 77;
	}
	if (open_device() || connect_qps()) {
		fprintf(stderr, "gdr_rdma_demo: RDMA setup failed: %s\n", strerror(errno));
		return ctx ? 2 : 77;
	}
	if (gdr_cache_create(NULL, &cache)) {
		fprintf(stderr, "gdr_rdma_demo: gdr_cache_create failed\n");
		return 2;
	}
	gdr_cache_backend(cache, &be);
	printf("gdr_rdma_demo: %s, %d messages of %zu bytes, RDMA WRITE, buffer freed and "
	       "reallocated every %d messages; backend %s\n", ibv_get_device_name(ctx->device),
	       messages, size, realloc_every, names[be]);
	plain = run(NULL, &wrong0, &va0, &reg_plain);
	cached = run(cache, &wrong1, &va1, &reg_cached);
	if (plain < 0 || cached < 0) {
		fprintf(stderr, "gdr_rdma_demo: the message loop failed\n");
		return 2;
	}
	gdr_cache_get_stats(cache, &s);
	printf("  ibv_reg_mr around every message: %9.0f messages/s, %8.2f us registering per "
	       "message, %d payloads wrong\n", plain, reg_plain, wrong0);
	printf("  gdr_reg around every message:    %9.0f messages/s, %8.2f us registering per "
	       "message, %d payloads wrong\n", cached, reg_cached, wrong1);
	printf("  with the cache: x%.2f messages/s, registration x%.1f cheaper\n", cached / plain,
	       reg_plain / reg_cached);
	printf("  reallocations at the same address: %d of %d; cache: %" PRIu64 " hits, %" PRIu64
	       " misses, %" PRIu64 " stale (%" PRIu64 " seen by the kernel module), %" PRIu64
	       " pins\n", va1, realloc_every ? (messages - 1) / realloc_every : 0, s.hits, s.misses,
	       s.stale, s.revoked, s.pins);
	gdr_cache_destroy(cache);
	for (int i = 0; i < 2; i++)
		ibv_destroy_qp(qp[i]);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return wrong0 || wrong1 ? 1 : 0;
}
