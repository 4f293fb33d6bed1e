/* SPDX-License-Identifier: MIT */
/*
 * naive_gpu_verbs: a plain verbs program, no libgdrcache in it, that moves GPU buffers with
 * SEND/RECV and registers both buffers with ibv_reg_mr / ibv_dereg_mr around every message: the
 * naive pattern a registration cache exists for. Run it as it is, then under
 *     LD_PRELOAD=libgdrcache-preload.so
 * and compare: the same payloads, verified at the receiver, at a higher message rate.
 *
 * The receiver checks every payload (length and every byte). Every `-r` messages the program
 * frees both buffers and allocates new ones, which CUDA places at the same addresses: a cache that
 * handed back the freed buffers' registrations would deliver from or into the old pages, and the
 * receiver would see it. `-S` does that on purpose (the send buffer's MR is kept across the
 * reallocation, the bug), to show that the check catches it. It prints messages per second and
 * the time spent in ibv_reg_mr + ibv_dereg_mr per message.
 *
 * Both ends are two RC queue pairs of one RDMA device connected to each other (in the project's VM,
 * both on soft-RoCE's rxe0). GPU memory comes from the CUDA driver API (dlopen of libcuda.so.1): the
 * real driver on a GPU machine, the project's fake one in the VM.
 *
 * Usage: naive_gpu_verbs [-d device] [-g gid_index] [-n messages] [-s size] [-r realloc_every] [-S]
 * Exit status: 0 every payload verified, 1 a payload was wrong, 2 setup or transfer failed,
 * 77 no RDMA device or no CUDA driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
static int stale_bug;
static size_t size = 64 * 1024;

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq[2];
static struct ibv_qp *qp[2]; /* qp[0] sends, qp[1] receives */
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
#undef SYM
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
		ibv_free_device_list(list);
		return -1;
	}
	ctx = ibv_open_device(d);
	ibv_free_device_list(list);
	if (!ctx || !(pd = ibv_alloc_pd(ctx)) || !(cq[0] = ibv_create_cq(ctx, 16, NULL, NULL, 0)) ||
	    !(cq[1] = ibv_create_cq(ctx, 16, NULL, NULL, 0)) ||
	    ibv_query_gid(ctx, 1, gid_index, &gid))
		return -2;
	return 0;
}

static int connect_qps(void)
{
	struct ibv_port_attr port;

	if (ibv_query_port(ctx, 1, &port))
		return -1;
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cq[i], .recv_cq = cq[i], .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};

		if (!(qp[i] = ibv_create_qp(pd, &init)))
			return -1;
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0,
					 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };

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

/* One completion on cq; its status and length. */
static int wait_wc(struct ibv_cq *c, struct ibv_wc *wc)
{
	int n;

	while ((n = ibv_poll_cq(c, 1, wc)) == 0)
		;
	if (n < 0 || wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "naive_gpu_verbs: completion: %s\n",
			n < 0 ? "poll failed" : ibv_wc_status_str(wc->status));
		return -1;
	}
	return 0;
}

/* Receiver posts a receive into dst, sender sends src, both wait. */
static int transfer(CUdeviceptr src, uint32_t lkey_src, CUdeviceptr dst, uint32_t lkey_dst,
		    uint32_t *received)
{
	struct ibv_sge rs = { .addr = dst, .length = (uint32_t)size, .lkey = lkey_dst };
	struct ibv_sge ss = { .addr = src, .length = (uint32_t)size, .lkey = lkey_src };
	struct ibv_recv_wr rwr = { .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_send_wr swr = { .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED }, *sbad;
	struct ibv_wc wc;

	if (ibv_post_recv(qp[1], &rwr, &rbad) || ibv_post_send(qp[0], &swr, &sbad))
		return -1;
	if (wait_wc(cq[0], &wc))
		return -1;
	if (wait_wc(cq[1], &wc))
		return -1;
	*received = wc.byte_len;
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	uint32_t *pattern, *check, received;
	int opt, rc, wrong = 0, same_va = 0, reallocs = 0;
	struct ibv_mr *kept = NULL;
	CUdeviceptr src, dst;
	double t0, t, tr, treg = 0;

	while ((opt = getopt(argc, argv, "d:g:n:s:r:S")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'g': gid_index = atoi(optarg); break;
		case 'n': messages = atoi(optarg); break;
		case 's': size = strtoull(optarg, NULL, 0); break;
		case 'r': realloc_every = atoi(optarg); break;
		case 'S': stale_bug = 1; break;
		default:
			fprintf(stderr, "usage: naive_gpu_verbs [-d device] [-g gid_index] "
				"[-n messages] [-s size] [-r realloc_every] [-S]\n");
			return 2;
		}
	}
	if (messages <= 0 || size < 4 || size > (1u << 30) || size % 4) {
		fprintf(stderr, "naive_gpu_verbs: bad -n or -s\n");
		return 2;
	}
	if (load_cuda()) {
		printf("naive_gpu_verbs: no CUDA driver or GPU: skipped\n");
		return 77;
	}
	rc = open_device();
	if (rc == -1) {
		printf("naive_gpu_verbs: no RDMA device %s: skipped\n", dev_name ? dev_name : "");
		return 77;
	}
	if (rc || connect_qps()) {
		fprintf(stderr, "naive_gpu_verbs: RDMA setup failed: %s\n", strerror(errno));
		return 2;
	}
	pattern = malloc(size);
	check = malloc(size);
	if (!pattern || !check || cuMemAlloc(&src, size) || cuMemAlloc(&dst, size)) {
		fprintf(stderr, "naive_gpu_verbs: allocation failed\n");
		return 2;
	}

	t0 = now();
	for (int m = 0; m < messages; m++) {
		struct ibv_mr *ms, *mr;

		if (m && realloc_every && m % realloc_every == 0) {
			CUdeviceptr old_src = src, old_dst = dst;

			/* both freed first: their memory goes back to the driver before reuse */
			cuMemFree(src);
			cuMemFree(dst);
			if (cuMemAlloc(&src, size) || cuMemAlloc(&dst, size)) {
				fprintf(stderr, "naive_gpu_verbs: reallocation failed\n");
				return 2;
			}
			reallocs++;
			same_va += src == old_src && dst == old_dst;
		}
		for (size_t i = 0; i < size / 4; i++)
			pattern[i] = (uint32_t)m * 2654435761u ^ (uint32_t)i;
		cuMemcpyHtoD(src, pattern, size);

		/* the naive pattern: register around every message */
		tr = now();
		mr = ibv_reg_mr(pd, (void *)(uintptr_t)dst, size, IBV_ACCESS_LOCAL_WRITE);
		if (stale_bug && kept)
			ms = kept; /* the bug: the send buffer's MR from before the reallocation */
		else
			ms = ibv_reg_mr(pd, (void *)(uintptr_t)src, size, IBV_ACCESS_LOCAL_WRITE);
		treg += now() - tr;
		if (!mr || !ms) {
			fprintf(stderr, "naive_gpu_verbs: ibv_reg_mr: %s\n", strerror(errno));
			return 2;
		}
		if (transfer(src, ms->lkey, dst, mr->lkey, &received))
			return 2;
		tr = now();
		if (ibv_dereg_mr(mr) || (!stale_bug && ibv_dereg_mr(ms))) {
			fprintf(stderr, "naive_gpu_verbs: ibv_dereg_mr failed\n");
			return 2;
		}
		treg += now() - tr;
		if (stale_bug)
			kept = ms;

		/* the receiver verifies every payload */
		cuMemcpyDtoH(check, dst, size);
		if (received != size || memcmp(check, pattern, size))
			wrong++;
	}
	t = now() - t0;

	printf("naive_gpu_verbs: %s, %d messages of %zu bytes, SEND/RECV, ibv_reg_mr/ibv_dereg_mr of "
	       "both buffers around every message%s\n", ibv_get_device_name(ctx->device), messages,
	       size, stale_bug ? " (-S: the send MR kept across reallocations)" : "");
	printf("naive_gpu_verbs: buffers reallocated %d times, %d at the same addresses\n", reallocs,
	       same_va);
	printf("naive_gpu_verbs: %.0f messages/s, %.2f us registering per message, %d payloads "
	       "wrong\n", messages / t, treg / messages * 1e6, wrong);

	if (stale_bug && kept)
		ibv_dereg_mr(kept);
	cuMemFree(src);
	cuMemFree(dst);
	free(pattern);
	free(check);
	for (int i = 0; i < 2; i++) {
		ibv_destroy_qp(qp[i]);
		ibv_destroy_cq(cq[i]);
	}
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return wrong ? 1 : 0;
}
