/* SPDX-License-Identifier: MIT */
/*
 * In the VM: a program that gets its verbs the way NCCL does and moves data with them over rxe.
 * It loads the library as NCCL 2.30.7's src/misc/ibvsymbols.cc does (dlopen of NCCL_IBVERBS_LIB,
 * else libibverbs.so, else libibverbs.so.1, RTLD_NOW), resolves every row of preload/nccl_verbs.h
 * with dlvsym at its version node (a REQUIRED row that does not resolve is a failure, as NCCL
 * drops its IB transport then), and from there on calls only those pointers, plus verbs.h's inline
 * data path (ibv_post_send, ibv_post_recv, ibv_poll_cq go through the context's ops). It is not
 * linked with libibverbs: a call to any other verb would not link.
 *
 * Two RC QPs of one device (rxe0 in the VM) connected to each other over the GID index given;
 * buffers in "GPU" memory of the CUDA driver (the fake one in the VM, dlopen of libcuda.so.1) and
 * in host memory. Each message: the pattern written into the source, the destination cleared,
 * both registered (ibv_reg_mr and ibv_reg_mr_iova2, alternating), a SEND/RECV or an RDMA WRITE,
 * both deregistered, the destination read back and compared. The same buffers are registered
 * again for every message, so a registration cache behind the verbs serves them from the cache.
 * With NCCL_IBVERBS_LIB naming libgdrcache-preload.so, the registration verbs are the preload's
 * (dladdr says which object each one is from; tests/vm/cases/15-nccl-loader.sh compares).
 *
 * Usage: vm_nccl_loader [-d device] [-g gid_index] [-n messages] [-s size]
 * Prints one summary line: the library opened, messages, bytes, payloads wrong, and the object
 * each registration verb came from.
 * Exit: 0 every payload verified, 1 a payload was wrong, 2 loading, setup or a transfer failed
 * (a required verb missing included), 77 no library to load, no CUDA driver or no such device.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_table.h"

#define PROG "vm_nccl_loader"
#define WAIT_S 30 /* the deadline of one completion (TCG is slow, not that slow) */

struct row {
	const char *name, *version;
	int kind;
	void *fn;
};

#define ROW(name, version, kind) { #name, version, kind, NULL },
static struct row rows[] = { GDRP_NCCL_VERBS(ROW) };
#undef ROW

/* NCCL's table, as far as this program uses it. */
static struct nccl_table v;

static void fill_table(void)
{
	NCCL_TABLE_FILL(v, rows, fn);
}

#undef FN

typedef unsigned long long CUdeviceptr;
static struct {
	int (*init)(unsigned);
	int (*device_get)(int *, int);
	int (*primary_ctx_retain)(void **, int);
	int (*ctx_set_current)(void *);
	int (*mem_alloc)(CUdeviceptr *, size_t);
	int (*mem_free)(CUdeviceptr);
	int (*htod)(CUdeviceptr, const void *, size_t);
	int (*dtoh)(void *, CUdeviceptr, size_t);
} cu;

static const char *dev_name;
static int gid_index = 1, messages = 400;
static size_t size = 64 * 1024;

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq[2];
static struct ibv_qp *qp[2]; /* qp[0] sends and writes, qp[1] receives */
static union ibv_gid gid;

/* NCCL's order: the variable's path, then both names. */
static void *nccl_dlopen(const char **opened)
{
	const char *libs[] = { getenv("NCCL_IBVERBS_LIB"), "libibverbs.so", "libibverbs.so.1" };

	for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
		void *h = libs[i] ? dlopen(libs[i], RTLD_NOW) : NULL;

		if (h) {
			*opened = libs[i];
			return h;
		}
	}
	return NULL;
}

/* Every row at its node; -1 at the first REQUIRED row that does not resolve (named), where NCCL's
 * loader gives up too. */
static int resolve(void *h)
{
	for (unsigned i = 0; i < R_N; i++) {
		rows[i].fn = dlvsym(h, rows[i].name, rows[i].version);
		if (!rows[i].fn && rows[i].kind == REQUIRED) {
			fprintf(stderr,
				PROG ": %s@%s did not resolve: NCCL would drop its IB transport\n",
				rows[i].name, rows[i].version);
			return -1;
		}
	}
	return 0;
}

/* The file name of the object that defines fn ("absent" when it did not resolve). */
static const char *owner(const void *fn)
{
	Dl_info info = { 0 };
	const char *slash;

	if (!fn)
		return "absent";
	if (!dladdr(fn, &info) || !info.dli_fname)
		return "unknown";
	slash = strrchr(info.dli_fname, '/');
	return slash ? slash + 1 : info.dli_fname;
}

static int load_cuda(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	void *cuctx;
	int dev;

	if (!h)
		return -1;
#define SYM(f, n) (*(void **)&cu.f = dlsym(h, n))
	if (!SYM(init, "cuInit") || !SYM(device_get, "cuDeviceGet") ||
	    !SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain") ||
	    !SYM(ctx_set_current, "cuCtxSetCurrent") || !SYM(mem_alloc, "cuMemAlloc_v2") ||
	    !SYM(mem_free, "cuMemFree_v2") || !SYM(htod, "cuMemcpyHtoD_v2") ||
	    !SYM(dtoh, "cuMemcpyDtoH_v2"))
		return -1;
#undef SYM
	if (cu.init(0) || cu.device_get(&dev, 0) || cu.primary_ctx_retain(&cuctx, dev) ||
	    cu.ctx_set_current(cuctx))
		return -1;
	return 0;
}

/* -1: no such device (skip); -2: it would not open or answer. */
static int open_device(void)
{
	struct ibv_device **list = v.get_device_list(NULL);
	struct ibv_device *d = NULL;
	struct ibv_device_attr dattr;

	for (int i = 0; list && list[i]; i++)
		if (!dev_name || !strcmp(v.get_device_name(list[i]), dev_name)) {
			d = list[i];
			break;
		}
	if (!d) {
		if (list)
			v.free_device_list(list);
		return -1;
	}
	ctx = v.open_device(d);
	v.free_device_list(list);
	if (!ctx || v.query_device(ctx, &dattr) || dattr.phys_port_cnt < 1 ||
	    v.query_gid(ctx, 1, gid_index, &gid) || !(pd = v.alloc_pd(ctx)) ||
	    !(cq[0] = v.create_cq(ctx, 16, NULL, NULL, 0)) ||
	    !(cq[1] = v.create_cq(ctx, 16, NULL, NULL, 0)))
		return -2;
	return 0;
}

static int connect_qps(void)
{
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_port_attr port;
	struct ibv_qp_init_attr init_attr;
	struct ibv_qp_attr a;

	if (v.query_port(ctx, 1, &port) || port.state != IBV_PORT_ACTIVE) {
		fprintf(stderr, PROG ": port 1 is not active\n");
		return -1;
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cq[i],
			.recv_cq = cq[i],
			.qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 4,
				 .max_recv_wr = 4,
				 .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};

		if (!(qp[i] = v.create_qp(pd, &init)))
			return -1;
	}
	for (int i = 0; i < 2; i++) {
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT,
					  .port_num = 1,
					  .pkey_index = 0,
					  .qp_access_flags = access };
		if (v.modify_qp(qp[i], &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					IBV_QP_ACCESS_FLAGS))
			return -1;
		a = (struct ibv_qp_attr){
			.qp_state = IBV_QPS_RTR,
			.path_mtu = port.active_mtu,
			.dest_qp_num = qp[1 - i]->qp_num,
			.rq_psn = 0,
			.max_dest_rd_atomic = 1,
			.min_rnr_timer = 12,
			.ah_attr = { .is_global = 1,
				     .port_num = 1,
				     .grh = { .dgid = gid,
					      .sgid_index = (uint8_t)gid_index,
					      .hop_limit = 1 } },
		};
		if (v.modify_qp(qp[i], &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					IBV_QP_MIN_RNR_TIMER))
			return -1;
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS,
					  .timeout = 14,
					  .retry_cnt = 7,
					  .rnr_retry = 7,
					  .sq_psn = 0,
					  .max_rd_atomic = 1 };
		if (v.modify_qp(qp[i], &a,
				IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			return -1;
		if (v.query_qp(qp[i], &a, IBV_QP_STATE, &init_attr) || a.qp_state != IBV_QPS_RTS) {
			fprintf(stderr, PROG ": QP %d is not in RTS\n", i);
			return -1;
		}
	}
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One completion on c within WAIT_S seconds, successful and of the opcode expected. */
static int wait_wc(struct ibv_cq *c, enum ibv_wc_opcode opcode, struct ibv_wc *wc)
{
	double deadline = now() + WAIT_S;
	int n;

	while ((n = ibv_poll_cq(c, 1, wc)) == 0) {
		if (now() > deadline) {
			fprintf(stderr, PROG ": no completion within %d s\n", WAIT_S);
			return -1;
		}
	}
	if (n < 0 || wc->status != IBV_WC_SUCCESS || wc->opcode != opcode) {
		fprintf(stderr, PROG ": completion: %s (status %d, opcode %d, expected %d)\n",
			n < 0 ? "poll failed" : "failed", n < 0 ? -1 : (int)wc->status,
			n < 0 ? -1 : (int)wc->opcode, (int)opcode);
		return -1;
	}
	return 0;
}

/* One SEND/RECV or RDMA WRITE of size bytes from src to dst; *received: the bytes that arrived
 * (a RECV's byte_len; a WRITE's size once its completion says the responder acknowledged it). */
static int transfer(int write, void *src, const struct ibv_mr *ms, void *dst,
		    const struct ibv_mr *md, uint32_t *received)
{
	struct ibv_sge rs = { .addr = (uintptr_t)dst, .length = (uint32_t)size, .lkey = md->lkey };
	struct ibv_sge ss = { .addr = (uintptr_t)src, .length = (uint32_t)size, .lkey = ms->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_send_wr swr = { .sg_list = &ss,
				   .num_sge = 1,
				   .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED },
			   *sbad;
	struct ibv_wc wc;

	if (write) {
		swr.opcode = IBV_WR_RDMA_WRITE;
		swr.wr.rdma.remote_addr = (uintptr_t)dst;
		swr.wr.rdma.rkey = md->rkey;
	} else if (ibv_post_recv(qp[1], &rwr, &rbad)) {
		return -1;
	}
	if (ibv_post_send(qp[0], &swr, &sbad))
		return -1;
	if (wait_wc(cq[0], write ? IBV_WC_RDMA_WRITE : IBV_WC_SEND, &wc))
		return -1;
	*received = (uint32_t)size;
	if (!write) {
		if (wait_wc(cq[1], IBV_WC_RECV, &wc))
			return -1;
		*received = wc.byte_len;
	}
	return 0;
}

/* A buffer of either kind: GPU memory (the CUDA driver's) or host memory. */
struct buf {
	int gpu;
	void *p;
};

static int put(const struct buf *b, const void *from)
{
	if (b->gpu)
		return cu.htod((uintptr_t)b->p, from, size) ? -1 : 0;
	memcpy(b->p, from, size);
	return 0;
}

static int get(void *to, const struct buf *b)
{
	if (b->gpu)
		return cu.dtoh(to, (uintptr_t)b->p, size) ? -1 : 0;
	memcpy(to, b->p, size);
	return 0;
}

static struct ibv_mr *reg(int iova2, const struct buf *b, int access)
{
	if (iova2 && v.reg_mr_iova2)
		return v.reg_mr_iova2(pd, b->p, size, (uintptr_t)b->p, (unsigned int)access);
	return v.reg_mr(pd, b->p, size, access);
}

static int alloc_bufs(struct buf gpu[2], struct buf host[2])
{
	for (int i = 0; i < 2; i++) {
		CUdeviceptr g = 0;

		if (cu.mem_alloc(&g, size) || !g || posix_memalign(&host[i].p, 4096, size))
			return -1;
		gpu[i] = (struct buf){ .gpu = 1, .p = (void *)(uintptr_t)g };
		host[i].gpu = 0;
	}
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: " PROG " [-d device] [-g gid_index] [-n messages] [-s size]\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *opened = NULL;
	struct buf gpu[2], host[2];
	uint32_t *pattern, *check, *zero, received;
	unsigned long long bytes = 0;
	int opt, rc, wrong = 0, writes = 0, gpu_regs = 0, host_regs = 0, m;
	void *h;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((opt = getopt(argc, argv, "d:g:n:s:")) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'g':
			gid_index = atoi(optarg);
			break;
		case 'n':
			messages = atoi(optarg);
			break;
		case 's':
			size = strtoull(optarg, NULL, 0);
			break;
		default:
			return usage();
		}
	}
	if (optind != argc || messages <= 0 || gid_index < 0 || size < 4 || size > (1u << 30) ||
	    size % 4)
		return usage();

	h = nccl_dlopen(&opened);
	if (!h) {
		printf(PROG
		       ": skipped: neither NCCL_IBVERBS_LIB, libibverbs.so nor libibverbs.so.1 "
		       "opens (%s)\n",
		       dlerror());
		return 77;
	}
	if (resolve(h)) {
		fprintf(stderr, PROG ": %s: a required verb is missing\n", opened);
		return 2;
	}
	fill_table();
	if (load_cuda()) {
		printf(PROG ": skipped: no CUDA driver or GPU (libcuda.so.1)\n");
		return 77;
	}
	rc = open_device();
	if (rc == -1) {
		printf(PROG ": skipped: no RDMA device %s\n", dev_name ? dev_name : "at all");
		return 77;
	}
	if (rc || connect_qps()) {
		fprintf(stderr, PROG ": RDMA setup failed: %s\n", strerror(errno));
		return 2;
	}
	pattern = malloc(size);
	check = malloc(size);
	zero = calloc(1, size);
	if (!pattern || !check || !zero || alloc_bufs(gpu, host)) {
		fprintf(stderr, PROG ": allocation failed\n");
		return 2;
	}

	/* Message m: bit 0 the operation (SEND, WRITE), bit 1 the source's kind (GPU, host), bit 2
	 * the destination's, bit 3 which end ibv_reg_mr_iova2 registers (the other: ibv_reg_mr). */
	for (m = 0; m < messages; m++) {
		int write = m & 1, iova2_src = (m >> 3) & 1;
		const struct buf *src = (m & 2) ? &host[0] : &gpu[0];
		const struct buf *dst = (m & 4) ? &host[1] : &gpu[1];
		struct ibv_mr *ms, *md;

		for (size_t i = 0; i < size / 4; i++)
			pattern[i] = (uint32_t)(m + 1) * 2654435761u ^ (uint32_t)i;
		if (put(src, pattern) || put(dst, zero)) {
			fprintf(stderr, PROG ": copy to the buffers failed\n");
			break;
		}
		/* registered around every message: the pattern a cache exists for */
		ms = reg(iova2_src, src, IBV_ACCESS_LOCAL_WRITE);
		md = reg(!iova2_src, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!ms || !md) {
			fprintf(stderr, PROG ": registration of message %d failed: %s\n", m,
				strerror(errno));
			break;
		}
		gpu_regs += src->gpu + dst->gpu;
		host_regs += !src->gpu + !dst->gpu;
		if (transfer(write, src->p, ms, dst->p, md, &received)) {
			fprintf(stderr, PROG ": message %d (%s) failed\n", m,
				write ? "RDMA WRITE" : "SEND/RECV");
			break;
		}
		if (v.dereg_mr(ms) || v.dereg_mr(md)) {
			fprintf(stderr, PROG ": ibv_dereg_mr of message %d failed\n", m);
			break;
		}
		writes += write;
		bytes += received;
		/* the receiving end verifies every payload */
		if (get(check, dst) || received != size || memcmp(check, pattern, size))
			wrong++;
	}

	printf(PROG ": %s via %s, %s: %d messages (%d SEND/RECV, %d RDMA WRITE), %llu bytes, %d "
		    "payloads wrong; %d GPU and %d host registrations; ibv_reg_mr from %s, "
		    "ibv_reg_mr_iova2 from %s, ibv_reg_dmabuf_mr from %s, ibv_dereg_mr from %s\n",
	       getenv("NCCL_IBVERBS_LIB") ? "NCCL_IBVERBS_LIB" : "NCCL_IBVERBS_LIB unset", opened,
	       v.get_device_name(ctx->device), m, m - writes, writes, bytes, wrong, gpu_regs,
	       host_regs, owner(v.reg_mr), owner(v.reg_mr_iova2),
	       owner(rows[R_ibv_reg_dmabuf_mr].fn), owner(v.dereg_mr));

	for (int i = 0; i < 2; i++) {
		cu.mem_free((uintptr_t)gpu[i].p);
		free(host[i].p);
	}
	free(pattern);
	free(check);
	free(zero);
	for (int i = 0; i < 2; i++) {
		v.destroy_qp(qp[i]);
		v.destroy_cq(cq[i]);
	}
	v.dealloc_pd(pd);
	v.close_device(ctx);
	if (m < messages)
		return 2;
	return wrong ? 1 : 0;
}
