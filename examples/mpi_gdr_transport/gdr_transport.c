/* SPDX-License-Identifier: MIT */
/* gdr_transport: see gdr_transport.h. */
#define _GNU_SOURCE
#include "gdr_transport.h"

#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrcache.h>

#define CU_POINTER_ATTRIBUTE_BUFFER_ID 7

struct gt_ctx {
	MPI_Comm comm;
	int rank, nranks, gid_index;
	struct ibv_context *ibctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp **qp;     /* per peer; NULL for this rank */
	struct gdr_cache *cache; /* NULL with GT_NO_CACHE */
	struct gdr_region *exposed;
	struct ibv_mr *exposed_mr; /* GT_NO_CACHE */
	int (*get_attr)(void *, int, unsigned long long); /* cuPointerGetAttribute, for the check */
	struct gt_stats st;
};

struct qp_addr {
	uint32_t qpn;
	uint32_t psn;
	uint8_t gid[16];
};

static int fail(const char *what)
{
	fprintf(stderr, "gdr_transport: %s: %s\n", what, strerror(errno));
	return -1;
}

/* The registration's buffer id against the driver's for the address now: a stale registration
 * (an MR of a freed allocation) is what a registration cache must never hand out. */
static void check_region(struct gt_ctx *ctx, struct gdr_region *r, const void *addr)
{
	unsigned long long now = 0;
	uint64_t id = 0;

	ctx->st.regs++;
	if (!ctx->get_attr || gdr_region_buffer_id(r, &id) || !id)
		return; /* host memory, or no driver */
	if (ctx->get_attr(&now, CU_POINTER_ATTRIBUTE_BUFFER_ID, (unsigned long long)(uintptr_t)addr) ||
	    now != id)
		ctx->st.stale++;
}

static int connect_qp(struct gt_ctx *ctx, struct ibv_qp *qp, const struct qp_addr *remote,
		      enum ibv_mtu mtu)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	};

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return fail("INIT");
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = remote->qpn,
		.rq_psn = remote->psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .sgid_index = (uint8_t)ctx->gid_index, .hop_limit = 64 } },
	};
	memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return fail("RTR");
	/* retry_cnt 6, not 7: soft-RoCE (rxe_comp.c) retries for ever at 7, so a writer would never
	 * learn that its peer died; 6 retries of 67 ms end in IBV_WC_RETRY_EXC_ERR. */
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 6,
				  .rnr_retry = 7, .sq_psn = ctx->rank * 1000u, .max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return fail("RTS");
	return 0;
}

struct gt_ctx *gt_open(MPI_Comm comm, const char *dev, int gid_index, unsigned flags)
{
	struct gt_ctx *ctx;
	struct ibv_device **list;
	struct ibv_port_attr port;
	struct qp_addr *mine, *theirs;
	union ibv_gid gid;
	void *cuda;
	int ok = 1, all;

	if (flags & ~GT_NO_CACHE) {
		fprintf(stderr, "gdr_transport: unknown flags %#x\n", flags);
		return NULL;
	}
	ctx = calloc(1, sizeof(*ctx));
	list = ibv_get_device_list(NULL);
	ctx->comm = comm;
	ctx->gid_index = gid_index;
	MPI_Comm_rank(comm, &ctx->rank);
	MPI_Comm_size(comm, &ctx->nranks);
	for (int i = 0; list && list[i] && !ctx->ibctx; i++)
		if (!dev || !strcmp(ibv_get_device_name(list[i]), dev))
			ctx->ibctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	ctx->qp = calloc((size_t)ctx->nranks, sizeof(*ctx->qp));
	mine = calloc((size_t)ctx->nranks, sizeof(*mine));
	theirs = calloc((size_t)ctx->nranks, sizeof(*theirs));
	if (!ctx->ibctx || !(ctx->pd = ibv_alloc_pd(ctx->ibctx)) ||
	    !(ctx->cq = ibv_create_cq(ctx->ibctx, 64, NULL, NULL, 0)) ||
	    ibv_query_port(ctx->ibctx, 1, &port) || ibv_query_gid(ctx->ibctx, 1, gid_index, &gid)) {
		fail(ctx->ibctx ? "device setup" : "no such RDMA device");
		ok = 0;
	} else if (!(flags & GT_NO_CACHE) && gdr_cache_create(NULL, &ctx->cache)) {
		fprintf(stderr, "gdr_transport: gdr_cache_create failed\n");
		ok = 0;
	}
	for (int p = 0; ok && p < ctx->nranks; p++) {
		struct ibv_qp_init_attr init = {
			.send_cq = ctx->cq, .recv_cq = ctx->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};

		if (p == ctx->rank)
			continue;
		if (!(ctx->qp[p] = ibv_create_qp(ctx->pd, &init))) {
			fail("ibv_create_qp");
			ok = 0;
			break;
		}
		mine[p].qpn = ctx->qp[p]->qp_num;
		mine[p].psn = ctx->rank * 1000u;
		memcpy(mine[p].gid, gid.raw, 16);
	}
	/* MPI carries the queue-pair addresses; every rank must agree that setup worked. */
	MPI_Alltoall(mine, sizeof(*mine), MPI_BYTE, theirs, sizeof(*theirs), MPI_BYTE, comm);
	for (int p = 0; ok && p < ctx->nranks; p++)
		if (p != ctx->rank && connect_qp(ctx, ctx->qp[p], &theirs[p], port.active_mtu))
			ok = 0;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
	free(mine);
	free(theirs);
	cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (cuda)
		*(void **)&ctx->get_attr = dlsym(cuda, "cuPointerGetAttribute");
	if (!all) {
		gt_close(ctx);
		return NULL;
	}
	return ctx;
}

int gt_expose(struct gt_ctx *ctx, void *buf, size_t len, struct gt_key *key)
{
	uint32_t rkey;
	int rc;

	if (!ctx->cache) {
		ctx->exposed_mr = ibv_reg_mr(ctx->pd, buf, len,
					     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!ctx->exposed_mr)
			return fail("ibv_reg_mr (expose)");
		ctx->st.regs++;
		*key = (struct gt_key){ .addr = (uint64_t)(uintptr_t)buf, .len = len,
					.rkey = ctx->exposed_mr->rkey };
		return 0;
	}
	rc = gdr_reg(ctx->cache, ctx->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		     &ctx->exposed);
	if (rc) {
		fprintf(stderr, "gdr_transport: gdr_reg (expose): %s\n", strerror(-rc));
		return -1;
	}
	check_region(ctx, ctx->exposed, buf);
	gdr_region_keys(ctx->exposed, NULL, &rkey);
	*key = (struct gt_key){ .addr = (uint64_t)(uintptr_t)buf, .len = len, .rkey = rkey };
	return 0;
}

int gt_unexpose(struct gt_ctx *ctx)
{
	int rc = ctx->exposed ? gdr_dereg(ctx->exposed) : 0;

	if (ctx->exposed_mr && ibv_dereg_mr(ctx->exposed_mr))
		rc = -1;
	ctx->exposed = NULL;
	ctx->exposed_mr = NULL;
	return rc;
}

int gt_write(struct gt_ctx *ctx, int peer, const void *src, size_t len, const struct gt_key *key,
	     uint64_t off)
{
	struct gdr_region *r = NULL;
	struct ibv_mr *mr = NULL;
	struct ibv_sge sge = { .addr = (uint64_t)(uintptr_t)src, .length = (uint32_t)len };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = key->addr + off, .rkey = key->rkey },
	}, *bad;
	struct ibv_wc wc;
	int n, rc;

	if (peer < 0 || peer >= ctx->nranks || !ctx->qp[peer] || off + len > key->len)
		return -1;
	/* Registered around every write, as naive code does: the cache makes it a lookup. */
	if (!ctx->cache) {
		mr = ibv_reg_mr(ctx->pd, (void *)src, len, IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			return fail("ibv_reg_mr");
		ctx->st.regs++;
		sge.lkey = mr->lkey;
	} else {
		rc = gdr_reg(ctx->cache, ctx->pd, (void *)src, len, IBV_ACCESS_LOCAL_WRITE, &r);
		if (rc) {
			fprintf(stderr, "gdr_transport: gdr_reg: %s\n", strerror(-rc));
			return -1;
		}
		check_region(ctx, r, src);
		gdr_region_keys(r, &sge.lkey, NULL);
	}
	rc = ibv_post_send(ctx->qp[peer], &wr, &bad);
	while (!rc && (n = ibv_poll_cq(ctx->cq, 1, &wc)) == 0)
		;
	if (!rc && (n < 0 || wc.status != IBV_WC_SUCCESS)) {
		fprintf(stderr, "gdr_transport: completion: %s\n",
			n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
		rc = -1;
	}
	if (r)
		gdr_dereg(r);
	if (mr && ibv_dereg_mr(mr))
		rc = -1;
	if (!rc) {
		ctx->st.writes++;
		ctx->st.bytes += len;
	}
	return rc ? -1 : 0;
}

void gt_get_stats(struct gt_ctx *ctx, struct gt_stats *s)
{
	struct gdr_cache_stats cs = { 0 };

	if (ctx->cache)
		gdr_cache_get_stats(ctx->cache, &cs);
	*s = ctx->st;
	s->hits = cs.hits;
	s->misses = cs.misses;
	s->cache_stale = cs.stale;
	s->events = cs.events;
	s->validate_mode = cs.validate_mode;
}

void gt_close(struct gt_ctx *ctx)
{
	if (!ctx)
		return;
	gt_unexpose(ctx);
	if (ctx->cache)
		gdr_cache_destroy(ctx->cache);
	for (int p = 0; ctx->qp && p < ctx->nranks; p++)
		if (ctx->qp[p])
			ibv_destroy_qp(ctx->qp[p]);
	if (ctx->cq)
		ibv_destroy_cq(ctx->cq);
	if (ctx->pd)
		ibv_dealloc_pd(ctx->pd);
	if (ctx->ibctx)
		ibv_close_device(ctx->ibctx);
	free(ctx->qp);
	free(ctx);
}
