/* SPDX-License-Identifier: MIT */
/*
 * gdr_rdma_demo: a verbs program that moves GPU buffers with RDMA WRITE and registers them around
 * every message: the naive pattern a registration cache exists for. Two ways of registering, plain
 * ibv_reg_mr / ibv_dereg_mr and gdr_reg / gdr_dereg, take turns in short bursts (a burst of one,
 * then a burst of the other, the order swapped every round), so that whatever else the machine does
 * falls on both alike; each burst's rate gives the median and spread printed for each way, and each
 * round's two bursts one paired ratio. The receiver verifies every payload, and every `-r` messages
 * a way frees its sending buffer and allocates a new one (at the same address, as CUDA does) to show
 * that the cache never sends from a stale registration.
 *
 * It prints how the cache proves its hits (free events, or a BUFFER_ID query on every hit, and why),
 * messages per second and registration cost both ways, where a message's time goes (clock_gettime
 * around each step), the payloads checked and the cache's statistics.
 *
 * Both ends are two RC queue pairs of one RDMA device connected to each other (on soft-RoCE in
 * the project's VM, both on rxe0). GPU memory comes from the CUDA driver API (dlopen of
 * libcuda.so.1): the real driver on a GPU machine, the project's fake one in the VM.
 *
 * Usage: gdr_rdma_demo [-d device] [-g gid_index] [-n messages] [-s size] [-r realloc_every]
 *                      [-b burst] [-e]
 *   -n  messages sent each way (default 2000)      -s  bytes per message (default 65536)
 *   -r  free and reallocate the sending buffer every this many messages of a way (0: never;
 *       default 100)
 *   -b  messages per burst (default: -n / 30, at least 1: about 30 rounds)
 *   -e  require free events: exit 3 if the cache validates hits otherwise, or if the interception
 *       missed one of the demo's cuMemFree calls
 * Exit status: 0 all payloads verified, 1 a payload was wrong, 2 setup or a transfer failed,
 * 3 -e and free events not in effect, 77 no device/GPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdbool.h>
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
static int gid_index = 1, messages = 2000, realloc_every = 100, burst;
static size_t size = 64 * 1024;

/* A completion that has not come after this long is a failure, not a wait. */
#define COMPLETION_DEADLINE_S 30.0

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
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16,
			 .max_recv_wr = 16,
			 .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};

	if (ibv_query_port(ctx, 1, &port))
		return -1;
	for (int i = 0; i < 2; i++)
		if (!(qp[i] = ibv_create_qp(pd, &init)))
			return -1;
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_INIT,
			.port_num = 1,
			.pkey_index = 0,
			.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		};

		if (ibv_modify_qp(qp[i], &a,
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
		if (ibv_modify_qp(qp[i], &a,
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
		if (ibv_modify_qp(qp[i], &a,
				  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					  IBV_QP_MAX_QP_RD_ATOMIC))
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

static int rdma_write(CUdeviceptr src, uint32_t lkey, CUdeviceptr dst, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = src, .length = (uint32_t)size, .lkey = lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = dst, .rkey = rkey },
	}, *bad;
	struct ibv_wc wc;
	double deadline = now() + COMPLETION_DEADLINE_S;
	unsigned spins = 0;
	int n;

	if (ibv_post_send(qp[0], &wr, &bad))
		return -1;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		if (++spins % 1024 == 0 && now() > deadline) {
			fprintf(stderr, "gdr_rdma_demo: no completion within %.0f s\n",
				COMPLETION_DEADLINE_S);
			return -1;
		}
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "gdr_rdma_demo: completion %s\n",
			n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
		return -1;
	}
	return 0;
}

/* The steps of one message, timed one by one. */
enum step { REALLOC, FILL, COPY_IN, REG, POST, DEREG, COPY_OUT, COMPARE, STEPS };
static const char *const step_names[STEPS] = {
	[REALLOC] = "  cuMemFree + cuMemAlloc (every -r)",
	[FILL] = "  fill the payload (host)",
	[COPY_IN] = "  cuMemcpyHtoD",
	[REG] = "  register both buffers",
	[POST] = "  post the WRITE, poll its completion",
	[DEREG] = "  deregister both buffers",
	[COPY_OUT] = "  cuMemcpyDtoH (receiver)",
	[COMPARE] = "  compare the payload",
};

/* One way of registering, with its own buffers. */
struct way {
	const char *name;
	struct gdr_cache *cache; /* NULL: ibv_reg_mr / ibv_dereg_mr */
	uint32_t salt;           /* makes its payloads differ from the other way's */
	CUdeviceptr src, dst;
	uint32_t *host, *check;
	int sent, wrong, reallocs, same_va;
	double step[STEPS]; /* seconds, summed over its messages */
	/* registration (REG + DEREG) of messages whose sending buffer is new (the first message and
	 * each after a reallocation: a miss for the cache), and how many */
	double reg_fresh;
	int fresh;
	double *rate; /* messages/s of each burst */
};

/* Send one message the way w does: 0, or -1 (a CUDA, verbs or cache call failed). */
static int message(struct way *w)
{
	struct gdr_region *rs = NULL, *rd = NULL;
	struct ibv_mr *ms = NULL, *md = NULL;
	uint32_t lkey, rkey, seed = (uint32_t)w->sent * 2654435761u ^ w->salt;
	double t[STEPS + 1];
	bool fresh = !w->sent;

	t[REALLOC] = now();
	if (w->sent && realloc_every && w->sent % realloc_every == 0) {
		CUdeviceptr old = w->src;

		if (cuMemFree(w->src) || cuMemAlloc(&w->src, size))
			return -1;
		w->reallocs++;
		w->same_va += w->src == old;
		fresh = true;
	}
	t[FILL] = now();
	for (size_t i = 0; i < size / 4; i++)
		w->host[i] = seed + (uint32_t)i;
	t[COPY_IN] = now();
	if (cuMemcpyHtoD(w->src, w->host, size))
		return -1;
	/* register around every message, as naive code does */
	t[REG] = now();
	if (w->cache) {
		if (gdr_reg(w->cache, pd, (void *)w->src, size, IBV_ACCESS_LOCAL_WRITE, &rs) ||
		    gdr_reg(w->cache, pd, (void *)w->dst, size,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &rd))
			return -1;
		gdr_region_keys(rs, &lkey, NULL);
		gdr_region_keys(rd, NULL, &rkey);
	} else {
		ms = ibv_reg_mr(pd, (void *)w->src, size, IBV_ACCESS_LOCAL_WRITE);
		md = ibv_reg_mr(pd, (void *)w->dst, size,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!ms || !md)
			return -1;
		lkey = ms->lkey;
		rkey = md->rkey;
	}
	t[POST] = now();
	if (rdma_write(w->src, lkey, w->dst, rkey))
		return -1;
	t[DEREG] = now();
	if (w->cache) {
		gdr_dereg(rs);
		gdr_dereg(rd);
	} else {
		ibv_dereg_mr(ms);
		ibv_dereg_mr(md);
	}
	/* the receiver verifies every payload */
	t[COPY_OUT] = now();
	if (cuMemcpyDtoH(w->check, w->dst, size))
		return -1;
	t[COMPARE] = now();
	w->wrong += memcmp(w->check, w->host, size) != 0;
	t[STEPS] = now();
	for (int s = 0; s < STEPS; s++)
		w->step[s] += t[s + 1] - t[s];
	if (fresh) {
		w->reg_fresh += t[POST] - t[REG] + t[COPY_OUT] - t[DEREG];
		w->fresh++;
	}
	w->sent++;
	return 0;
}

/* A burst of n messages; its rate goes to w->rate[round]. */
static int run_burst(struct way *w, int round, int n)
{
	double t0 = now();

	for (int i = 0; i < n; i++)
		if (message(w))
			return -1;
	w->rate[round] = n / (now() - t0);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Quantile q of n sorted values, interpolated between the two nearest. */
static double quantile(const double *v, int n, double q)
{
	double pos = q * (n - 1);
	int i = (int)pos;

	return i + 1 < n ? v[i] + (pos - i) * (v[i + 1] - v[i]) : v[n - 1];
}

struct spread {
	double min, q1, median, q3, max;
};

static struct spread spread_of(const double *values, int n)
{
	double *v = malloc(n * sizeof(*v));
	struct spread s;

	memcpy(v, values, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp_double);
	s = (struct spread){ v[0], quantile(v, n, 0.25), quantile(v, n, 0.5), quantile(v, n, 0.75),
			     v[n - 1] };
	free(v);
	return s;
}

static int way_init(struct way *w, const char *name, struct gdr_cache *cache, uint32_t salt,
		    int rounds)
{
	*w = (struct way){ .name = name, .cache = cache, .salt = salt };
	w->host = malloc(size);
	w->check = malloc(size);
	w->rate = calloc(rounds, sizeof(*w->rate));
	if (!w->host || !w->check || !w->rate || cuMemAlloc(&w->src, size) ||
	    cuMemAlloc(&w->dst, size))
		return -1;
	return 0;
}

static void way_fini(struct way *w)
{
	cuMemFree(w->src);
	cuMemFree(w->dst);
	free(w->host);
	free(w->check);
	free(w->rate);
}

/* What a clock_gettime pair costs here: it is inside every step's figure. */
static double clock_cost_us(void)
{
	double t0 = now(), t;

	for (int i = 0; i < 999; i++)
		now();
	t = now();
	return (t - t0) / 1000 * 1e6;
}

/* "lo-hi" into buf, each with prefix and prec decimals. */
static const char *range(char *buf, size_t len, const char *prefix, double lo, double hi, int prec)
{
	snprintf(buf, len, "%s%.*f-%s%.*f", prefix, prec, lo, prefix, prec, hi);
	return buf;
}

/* How the cache proves a hit; true for free events. Prints one line saying which, and why. */
static bool print_validation(struct gdr_cache *cache)
{
	struct gdr_cache_settings set;
	const char *why = "";
	int rc = gdr_mem_events_state(&why);

	memset(&set, 0, sizeof(set));
	if (gdr_cache_get_settings(cache, &set, sizeof(set))) {
		printf("  validation: unknown (gdr_cache_get_settings failed)\n");
		return false;
	}
	if (set.validate == GDR_VALIDATE_EVENTS) {
		printf("  validation: events (the cache learns of every free from the CUDA driver's "
		       "free entry\n    points and from gdrcache.ko; a hit makes no driver call)\n");
		return true;
	}
	printf("  validation: tag (a BUFFER_ID query to the CUDA driver on every hit)\n");
	if (rc)
		printf("    free events unavailable: %s\n", why);
	else
		printf("    free events are in effect, but this cache does not use them "
		       "(GDRCACHE_VALIDATE=tag?)\n");
	return false;
}

int main(int argc, char **argv)
{
	struct gdr_intercept_stats is0, is1;
	struct gdr_cache_stats s;
	struct gdr_cache *cache;
	uint64_t seen;
	struct way way[2];
	struct spread ra, rb, rr;
	bool events, need_events = false;
	int rounds, opt, rc = 0, frees;
	double *ratio, clock_us, reg[2], reg_fresh[2], reg_reused[2], total[2];
	char r0[32], r1[32];
	enum gdr_backend be;
	static const char *const names[] = { "auto", "kmod", "dmabuf", "peermem" };

	while ((opt = getopt(argc, argv, "d:g:n:s:r:b:e")) != -1) {
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
		case 'r':
			realloc_every = atoi(optarg);
			break;
		case 'b':
			burst = atoi(optarg);
			break;
		case 'e':
			need_events = true;
			break;
		default:
			return 2;
		}
	}
	if (messages < 1 || burst < 0 || realloc_every < 0 || size < 4 || size % 4 ||
	    size > UINT32_MAX) {
		fprintf(stderr, "gdr_rdma_demo: -n, -b, -r or -s out of range\n");
		return 2;
	}
	if (!burst)
		burst = messages / 30 > 0 ? messages / 30 : 1;
	if (burst > messages)
		burst = messages;
	rounds = (messages + burst - 1) / burst;
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
	ratio = calloc(rounds, sizeof(*ratio));
	if (!ratio || way_init(&way[0], "ibv_reg_mr", NULL, 0, rounds) ||
	    way_init(&way[1], "gdr_reg", cache, 0x5a5a5a5a, rounds)) {
		fprintf(stderr, "gdr_rdma_demo: out of host or GPU memory\n");
		return 2;
	}
	gdr_cache_backend(cache, &be);
	printf("gdr_rdma_demo: %s, %d messages of %zu bytes each way, RDMA WRITE; backend %s\n"
	       "  ibv_reg_mr and gdr_reg take turns: %d rounds of a burst of %d messages each way,\n"
	       "  the order swapped every round; each way frees and reallocates its sending buffer\n"
	       "  every %d messages\n",
	       ibv_get_device_name(ctx->device), messages, size, names[be], rounds, burst,
	       realloc_every);
	events = print_validation(cache);
	fflush(stdout);
	gdr_intercept_get_stats(&is0, sizeof(is0));
	for (int r = 0; r < rounds; r++) {
		int n = r == rounds - 1 ? messages - r * burst : burst;
		int first = r % 2;

		if (run_burst(&way[first], r, n) || run_burst(&way[1 - first], r, n)) {
			fprintf(stderr, "gdr_rdma_demo: the message loop failed (%s, message %d)\n",
				way[first].sent < way[1 - first].sent ? way[first].name
								      : way[1 - first].name,
				r * burst);
			return 2;
		}
		ratio[r] = way[1].rate[r] / way[0].rate[r];
	}
	gdr_intercept_get_stats(&is1, sizeof(is1));
	frees = way[0].reallocs + way[1].reallocs;
	clock_us = clock_cost_us();
	memset(&s, 0, sizeof(s));
	gdr_cache_get_stats_ex(cache, &s, sizeof(s));

	ra = spread_of(way[0].rate, rounds);
	rb = spread_of(way[1].rate, rounds);
	rr = spread_of(ratio, rounds);
	for (int i = 0; i < 2; i++) {
		struct way *w = &way[i];
		double regs = w->step[REG] + w->step[DEREG];

		reg[i] = regs / messages * 1e6;
		reg_fresh[i] = w->fresh ? w->reg_fresh / w->fresh * 1e6 : 0;
		reg_reused[i] = messages > w->fresh
					? (regs - w->reg_fresh) / (messages - w->fresh) * 1e6
					: 0;
		total[i] = 0;
		for (int st = 0; st < STEPS; st++)
			total[i] += w->step[st];
		total[i] = total[i] / messages * 1e6;
	}
	printf("  %-40s %14s %14s\n", "", way[0].name, way[1].name);
	printf("  %-40s %14.0f %14.0f\n", "messages/s: median of the bursts", ra.median, rb.median);
	printf("  %-40s %14s %14s\n", "            interquartile range",
	       range(r0, sizeof(r0), "", ra.q1, ra.q3, 0),
	       range(r1, sizeof(r1), "", rb.q1, rb.q3, 0));
	printf("  %-40s %14s %14s\n", "            min-max",
	       range(r0, sizeof(r0), "", ra.min, ra.max, 0),
	       range(r1, sizeof(r1), "", rb.min, rb.max, 0));
	printf("  registration of both buffers (register + deregister), us per message:\n");
	printf("  %-40s %14.2f %14.2f\n", "  mean", reg[0], reg[1]);
	printf("  %-40s %14.2f %14.2f\n", "  same buffers as the message before", reg_reused[0],
	       reg_reused[1]);
	printf("  %-40s %14.2f %14.2f\n", "  after a reallocation (and the first)", reg_fresh[0],
	       reg_fresh[1]);
	printf("  where a message's time goes, us per message (mean; every figure includes\n"
	       "  one clock_gettime, %.2f us here):\n",
	       clock_us);
	for (int st = 0; st < STEPS; st++)
		printf("  %-40s %14.2f %14.2f\n", step_names[st], way[0].step[st] / messages * 1e6,
		       way[1].step[st] / messages * 1e6);
	printf("  %-40s %14.2f %14.2f\n", "  all steps", total[0], total[1]);
	printf("  with the cache: x%.2f messages/s (median of %d paired rounds; IQR %s,\n"
	       "  min-max %s), registration x%.1f %s\n",
	       rr.median, rounds, range(r0, sizeof(r0), "x", rr.q1, rr.q3, 2),
	       range(r1, sizeof(r1), "x", rr.min, rr.max, 2),
	       reg[0] >= reg[1] ? reg[0] / reg[1] : reg[1] / reg[0],
	       reg[0] >= reg[1] ? "cheaper" : "dearer");
	printf("  payloads checked: %d (%d each way), %d bad\n", way[0].sent + way[1].sent,
	       messages, way[0].wrong + way[1].wrong);
	printf("  reallocations at the same address: %d of %d (ibv_reg_mr), %d of %d (gdr_reg)\n",
	       way[0].same_va, way[0].reallocs, way[1].same_va, way[1].reallocs);
	printf("  cache: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " stale (%" PRIu64
	       " seen by the kernel module), %" PRIu64 " free events applied, %" PRIu64
	       " BUFFER_ID queries, %" PRIu64 " pins\n",
	       s.hits, s.misses, s.stale, s.revoked, s.events, s.tag_checks, s.pins);
	seen = is1.frees[GDR_FREE_MEM_FREE] - is0.frees[GDR_FREE_MEM_FREE];
	printf("  free interception: saw %" PRIu64
	       " of the %d cuMemFree the demo made while sending"
	       " (%.1f us each in the library)\n",
	       seen, frees, seen ? (double)(is1.free_ns - is0.free_ns) / 1e3 / (double)seen : 0.0);
	if (need_events && (!events || seen < (uint64_t)frees)) {
		printf("gdr_rdma_demo: -e: free events are not in effect in this process (%s)\n",
		       events ? "a cuMemFree was not seen" : "hits validated by BUFFER_ID queries");
		rc = 3;
	}
	if (way[0].wrong || way[1].wrong)
		rc = 1;
	way_fini(&way[0]);
	way_fini(&way[1]);
	free(ratio);
	gdr_cache_destroy(cache);
	for (int i = 0; i < 2; i++)
		ibv_destroy_qp(qp[i]);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return rc;
}
