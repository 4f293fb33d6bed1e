/* SPDX-License-Identifier: MIT */
/*
 * Cache hits side by side, in one run, on the machine it runs on (it names it): libgdrcache in
 * events mode and in tag mode, the "check BUFFER_ID on every hit" baseline and UCX's ucs_rcache,
 * all pinning through the same callbacks (hit_sys.h); and, run under LD_PRELOAD over the fake
 * libibverbs (bench/run-gpu.sh preload-hits), ibv_reg_mr / ibv_dereg_mr of a PD through
 * libgdrcache-preload.so (the preload column: not in the traces, its cache is gdr-events').
 *
 *   latency     one thread: ns per registration + release of a cached 4 KiB range: the same
 *               buffer again, and a random one of 128 / 1024 / 4096 cached 1 MiB buffers at a
 *               random 4 KiB offset, and of 1024 buffers of mixed sizes (4 KiB to 4 MiB); the mean
 *               of a timed loop, and p50 / p99 of every operation timed alone (cycle counter)
 *   throughput  1, 2, 4, 8, 16 threads, aggregate hits per second: each thread on its own buffer
 *               ("own") and all threads on one buffer ("shared"); each thread a random one of its
 *               own 128 buffers ("own-rand") and all threads a random one of 2048 shared
 *               ("shared-rand"); median of --reps runs
 *   miss        first registration of a new 1 MiB allocation (query, SYNC_MEMOPS, dma-buf export),
 *               192 a system, the systems taking turns on each allocation (each first in turn):
 *               the median, and the median of the differences with tagcheck allocation by
 *               allocation (drift cancels in pairs); its parts timed alone on fresh allocations:
 *               the query (tagcheck's 3 attributes, and the library's 9), the first SYNC_MEMOPS,
 *               the dma-buf export + close; what is left is the cache's own work
 *   traces      hit rate (registrations that did not pin) and stale registrations handed out
 *               (checked against the driver's BUFFER_ID, outside the timed call) on:
 *               alloc-loop  a caching allocator's training loop: blocks reused, released by
 *                           empty_cache every 20 steps, allocated again at the same VA
 *               halo        an MPI halo exchange: 4 fields x 26 neighbours, send and receive,
 *                           separate buffers and packed ones registered by offset; buffers
 *                           reallocated every 50 iterations (mesh adaptation)
 *               churn       random sizes and sub-ranges, skewed, frees and new allocations; the
 *                           live set is about 4 times the cache limit
 *               size-mix    allocations of 512 B to 64 MiB (log-uniform, small ones sharing
 *                           pages), registered whole or by a sub-range, skewed reuse, frees
 *               pytorch     a PyTorch caching allocator over a training loop: activations of
 *                           mixed sizes carved from 2 MiB / 20 MiB blocks and larger segments,
 *                           registered each step (forward and backward), empty_cache now and
 *                           then; limits from the library's defaults (what a job gets)
 *
 * Usage: bench_hit [--threads N] [--seconds S] [--reps R] [--csv FILE] [--quick]
 *                  [--latency-only | --miss-only] [--no-traces | --traces-only]
 *                  [--only SYSTEM[,SYSTEM...]]
 * Needs a GPU (exits 77 without one). $GDRCACHE_LIBCUDA selects another libcuda (the fake driver
 * of the tests: figures then are a SIMULATION, not measurements). Includes only the public header.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <gdrcache.h>

#include "hit_cuda.h"
#include "machine.h"
#include "hit_sys.h"
#include "hit_pattern.h"
#include "hit_report.h"

#define MAX_THREADS 64

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}


/* ---- buffer sets for random hits ----------------------------------------------------------- */

/* n buffers (a power of two): a hit picks one at random and a random 4 KiB page of it. */
struct bset {
	uint64_t *addr;
	uint32_t *pages;       /* its 4 KiB pages (at least 1) */
	uint32_t *len;         /* what a hit registers: 4 KiB, or the whole buffer if smaller */
	uint32_t n;
};

static inline uint64_t xs64(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* The address a random hit on buffer k of set registers: a page of it, from the high bits of v. */
static inline uint64_t rand_addr(const struct bset *set, uint64_t k, uint64_t v)
{
	return set->addr[k] + (((v >> 32) * set->pages[k]) >> 32) * 4096;
}

/* ---- cycle counter, for one operation timed alone ------------------------------------------ */

#if defined(__x86_64__)
static inline uint64_t cycles(void)
{
	uint32_t lo, hi;

	__asm__ __volatile__("lfence; rdtsc; lfence" : "=a"(lo), "=d"(hi)::"memory");
	return (uint64_t)hi << 32 | lo;
}
#elif defined(__aarch64__)
static inline uint64_t cycles(void)
{
	uint64_t v;

	__asm__ __volatile__("isb; mrs %0, cntvct_el0; isb" : "=r"(v)::"memory");
	return v;
}
#else
static inline uint64_t cycles(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#endif
static double ns_per_cycle = 1.0;

static void cycles_calibrate(void)
{
	double t0 = now(), t1;
	uint64_t c0 = cycles(), c1;

	do
		t1 = now();
	while (t1 - t0 < 0.05);
	c1 = cycles();
	ns_per_cycle = (t1 - t0) * 1e9 / (double)(c1 - c0);
}

/* ---- timed hit loops ---------------------------------------------------------------------- */

struct worker {
	pthread_t t;
	struct sys *s;
	uint64_t addr;
	const struct bset *set;   /* random hits on it (NULL: addr every time) */
	uint64_t seed;
	int cpu;
	uint64_t ops, errors;
	uint32_t *lat;            /* not NULL: every operation timed, in cycles */
};

static atomic_int go, stop;

#define BATCH 256
#define HIT_LOOP(cond, GET, PUT)                                                             \
	while (cond) {                                                                       \
		for (int i_ = 0; i_ < BATCH; i_++) {                                         \
			void *r_;                                                            \
			if (GET == 0)                                                        \
				PUT;                                                         \
			else                                                                 \
				errors++;                                                    \
		}                                                                            \
		ops += BATCH;                                                                \
	}

/* The same over random buffers of a set at random pages: the address is computed per hit. */
#define RAND_LOOP(cond, GET, PUT)                                                            \
	while (cond) {                                                                       \
		for (int i_ = 0; i_ < BATCH; i_++) {                                         \
			void *r_;                                                            \
			uint64_t x_ = xs64(&x), k_ = x_ & mask;                              \
			uint64_t addr = rand_addr(set, k_, x_);                              \
			size_t len = set->len[k_];                                           \
			if (GET == 0)                                                        \
				PUT;                                                         \
			else                                                                 \
				errors++;                                                    \
		}                                                                            \
		ops += BATCH;                                                                \
	}

/* Random hits, every one timed alone into w->lat (n of them). */
static void hit_run_timed(struct worker *w, uint64_t n)
{
	const struct bset *set = w->set;
	uint64_t x = w->seed, mask = set ? set->n - 1 : 0, errors = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t addr = w->addr, c0, c1;
		size_t len = HIT_LEN;
		void *r;

		if (set) {
			uint64_t v = xs64(&x), k = v & mask;

			addr = rand_addr(set, k, v);
			len = set->len[k];
		}
		c0 = cycles();
		if (sys_get(w->s, addr, len, &r) == 0)
			sys_put(w->s, r);
		else
			errors++;
		c1 = cycles();
		w->lat[i] = (uint32_t)(c1 - c0 < UINT32_MAX ? c1 - c0 : UINT32_MAX);
	}
	w->seed = x;
	w->errors = errors;
}

#define MORE (timed ? !atomic_load_explicit(&stop, memory_order_relaxed) : ops < limit * BATCH)

/* Random hits of w->set until stop (limit 0) or for limit batches. */
static void hit_run_rand(struct worker *w, uint64_t limit)
{
	void *p = w->s->p;
	const struct bset *set = w->set;
	uint64_t ops = 0, errors = 0, x = w->seed, mask = set->n - 1;
	int timed = limit == 0;

	switch (w->s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: {
		struct gdr_cache *c = gdrs_cache(p);

		RAND_LOOP(MORE, gdr_reg(c, NULL, (void *)(uintptr_t)addr, len, 0,
					(struct gdr_region **)&r_),
			  gdr_dereg(r_));
		break;
	}
	case SYS_TAGCHECK:
		RAND_LOOP(MORE, tc_get(p, addr, len, &r_), tc_put(p, r_));
		break;
	case SYS_UCS:
		RAND_LOOP(MORE, ucs_get(p, addr, len, &r_), ucs_put(p, r_));
		break;
	case SYS_PRELOAD:
		RAND_LOOP(MORE, pre_get(p, addr, len, &r_), pre_put(p, r_));
		break;
	default:
		break;
	}
	w->seed = x;
	w->ops = ops;
	w->errors = errors;
}

/* Runs hits on w->addr (or random ones of w->set) until stop (limit 0) or for limit batches. */
static void hit_run(struct worker *w, uint64_t limit)
{
	void *p = w->s->p;
	uint64_t addr = w->addr, ops = 0, errors = 0;
	int timed = limit == 0;

	if (w->set) {
		hit_run_rand(w, limit);
		return;
	}
	switch (w->s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: {
		struct gdr_cache *c = gdrs_cache(p);

		HIT_LOOP(MORE, gdr_reg(c, NULL, (void *)(uintptr_t)addr, HIT_LEN, 0,
				       (struct gdr_region **)&r_),
			 gdr_dereg(r_));
		break;
	}
	case SYS_TAGCHECK:
		HIT_LOOP(MORE, tc_get(p, addr, HIT_LEN, &r_), tc_put(p, r_));
		break;
	case SYS_UCS:
		HIT_LOOP(MORE, ucs_get(p, addr, HIT_LEN, &r_), ucs_put(p, r_));
		break;
	case SYS_PRELOAD:
		HIT_LOOP(MORE, pre_get(p, addr, HIT_LEN, &r_), pre_put(p, r_));
		break;
	default:
		break;
	}
#undef MORE
	w->ops = ops;
	w->errors = errors;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(w->cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	hc_thread();
	while (!atomic_load_explicit(&go, memory_order_acquire))
		;
	hit_run(w, 0);
	return NULL;
}

/* Aggregate hits/s of nthreads threads, each on bufs[i] or all on bufs[0]; with sets, thread i
 * on random buffers of sets[i] (own) or all on sets[0] (shared). */
static double throughput(struct sys *s, int nthreads, int shared, const uint64_t *bufs,
			 const struct bset *sets, double seconds, uint64_t *errors)
{
	struct worker w[MAX_THREADS];
	uint64_t total = 0;
	double t0, t1;

	atomic_store(&go, 0);
	atomic_store(&stop, 0);
	for (int i = 0; i < nthreads; i++) {
		w[i] = (struct worker){ .s = s, .addr = shared ? bufs[0] : bufs[i + 1],
					.set = sets ? &sets[shared ? 0 : i] : NULL,
					.seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1),
					.cpu = (int)(i % ncpu) };
		pthread_create(&w[i].t, NULL, worker_main, &w[i]);
	}
	usleep(20000); /* all started and spinning */
	t0 = now();
	atomic_store_explicit(&go, 1, memory_order_release);
	usleep((useconds_t)(seconds * 1e6));
	atomic_store(&stop, 1);
	for (int i = 0; i < nthreads; i++) {
		pthread_join(w[i].t, NULL);
		total += w[i].ops;
		*errors += w[i].errors;
	}
	t1 = now();
	return (double)total / (t1 - t0);
}

/* ns per hit (get + put) on the calling thread, in one timed run of batches (random ones of set if
 * not NULL). */
static double latency_run(struct sys *s, uint64_t addr, const struct bset *set, uint64_t batches,
			  uint64_t *errors)
{
	struct worker w = { .s = s, .addr = addr, .set = set, .seed = 0x2545f4914f6cdd1dULL };
	double t0 = now();

	hit_run(&w, batches);
	*errors += w.errors;
	return (now() - t0) / (double)w.ops * 1e9;
}

static double median(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double x = v[j];

			v[j] = v[j - 1];
			v[j - 1] = x;
		}
	return n ? v[n / 2] : 0;
}


static int run_trace(const struct trace *t, enum sys_kind kind, struct trace_result *res)
{
	struct sys s;
	uint64_t *ptr = calloc(t->nslots, sizeof(*ptr)), *size = calloc(t->nslots, sizeof(*size));
	uint64_t *born = calloc(t->nslots, sizeof(*born)); /* hit_clock at the allocation */
	uint8_t *reg = calloc(t->nslots, 1);
	uint64_t *freed = NULL, m0;
	size_t nfreed = 0, capfreed = 0;
	double tget = 0;
	int rc;

	memset(res, 0, sizeof(*res));
	rc = sys_open(&s, kind, &t->lim);
	if (rc) {
		snprintf(res->stats, sizeof(res->stats), "%s", s.why);
		free(ptr);
		free(size);
		free(born);
		free(reg);
		return rc;
	}
	m0 = sys_misses(&s);
	for (size_t i = 0; i < t->n; i++) {
		const struct op *o = &t->ops[i];

		switch (o->kind) {
		case OP_ALLOC:
			if (hc.cuMemAlloc(&ptr[o->slot], o->a)) {
				fprintf(stderr, "bench_hit: cuMemAlloc(%" PRIu64 ") failed\n", o->a);
				ptr[o->slot] = 0;
				break;
			}
			size[o->slot] = o->a;
			born[o->slot] = ++hit_clock;
			for (size_t k = 0; k < nfreed; k++)
				if (freed[k] == ptr[o->slot]) {
					res->reallocs_same_va++;
					freed[k] = freed[--nfreed];
					break;
				}
			break;
		case OP_FREE:
			if (!ptr[o->slot])
				break;
			sys_freed(&s, ptr[o->slot], size[o->slot]);
			hc.cuMemFree(ptr[o->slot]);
			res->frees++;
			if (reg[o->slot]) {
				if (nfreed == capfreed) {
					capfreed = capfreed ? 2 * capfreed : 1024;
					freed = realloc(freed, capfreed * sizeof(*freed));
				}
				if (freed)
					freed[nfreed++] = ptr[o->slot];
			}
			reg[o->slot] = 0;
			ptr[o->slot] = 0;
			break;
		case OP_REG: {
			uint64_t addr = ptr[o->slot] + o->a, id = 0, seq = 0, base = 0, len = 0, cur;
			void *r;
			double t0;

			if (!ptr[o->slot])
				break;
			res->requests++;
			t0 = now();
			rc = sys_get(&s, addr, o->b, &r);
			tget += now() - t0;
			if (rc) {
				res->failed++;
				break;
			}
			reg[o->slot] = 1;
			sys_reg_info(&s, r, &id, &seq, &base, &len);
			cur = hc_buffer_id(addr);
			if (!cur || (id ? id != cur : seq <= born[o->slot]))
				res->wrong++;
			if (addr < base || addr + o->b > base + len)
				res->not_covered++;
			sys_put(&s, r);
			cur = sys_pinned(&s);
			if (cur > res->peak_pinned)
				res->peak_pinned = cur;
			break;
		}
		}
	}
	res->misses = sys_misses(&s) - m0;
	res->us_per_req = res->requests ? tget / (double)res->requests * 1e6 : 0;
	sys_describe(&s, res->stats, sizeof(res->stats));
	sys_close(&s);
	for (uint32_t k = 0; k < t->nslots; k++)
		if (ptr[k])
			hc.cuMemFree(ptr[k]);
	free(freed);
	free(born);
	free(ptr);
	free(size);
	free(reg);
	return 0;
}

/* ---- main --------------------------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr, "usage: bench_hit [--threads N] [--seconds S] [--reps R] [--csv FILE] "
			"[--quick] [--latency-only] [--miss-only] [--no-traces] [--traces-only] "
			"[--only SYSTEM[,SYSTEM...]]\n");
	exit(2);
}

#ifdef BENCH_AS_LIBRARY
/* libbench_hit_mw.so: the benchmark inside a shared library that links libgdrcache, as middleware
 * carries it (bench_hit_load.c starts it, linked or dlopen'ed). */
#define main bench_hit_main
__attribute__((visibility("default"))) int bench_hit_main(int argc, char **argv);
#endif

/* ---- random sets, one-thread latency distribution, miss parts --------------------------------- */

#define NM 192              /* new allocations each system misses on */
#define NRAND 4096           /* 1 MiB buffers for the random patterns */
#define NMIXED 1024          /* mixed-size buffers */
#define OWN_SET 128          /* buffers per thread, own-rand */
#define SHARED_SET 2048      /* buffers shared by all threads, shared-rand */

static void set_of(struct bset *b, const uint64_t *addr, const uint64_t *size, uint32_t n)
{
	b->n = n;
	b->addr = malloc(n * sizeof(*b->addr));
	b->pages = malloc(n * sizeof(*b->pages));
	b->len = malloc(n * sizeof(*b->len));
	if (!b->addr || !b->pages || !b->len) {
		perror("malloc");
		exit(1);
	}
	for (uint32_t i = 0; i < n; i++) {
		b->addr[i] = addr[i];
		b->pages[i] = size[i] >= 4096 ? (uint32_t)(size[i] / 4096) : 1;
		b->len[i] = size[i] >= HIT_LEN ? HIT_LEN : (uint32_t)size[i];
	}
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static double timer_cycles; /* what cycles() around nothing reads (median) */

static void timer_calibrate(void)
{
	enum { N = 10001 };
	static uint32_t v[N];

	for (int i = 0; i < N; i++) {
		uint64_t c0 = cycles(), c1 = cycles();

		v[i] = (uint32_t)(c1 - c0);
	}
	qsort(v, N, sizeof(v[0]), cmp_u32);
	timer_cycles = v[N / 2];
}

/* p50 and p99 of n hits timed one by one, less the timer's own cost, in ns. */
static void latency_dist(struct sys *s, uint64_t addr, const struct bset *set, uint64_t n,
			 double *p50, double *p99, uint64_t *errors)
{
	uint32_t *lat = malloc(n * sizeof(*lat));
	struct worker w = { .s = s, .addr = addr, .set = set, .seed = 0x5851f42d4c957f2dULL,
			    .lat = lat };

	*p50 = *p99 = 0;
	if (!lat)
		return;
	hit_run_timed(&w, n / 4);
	hit_run_timed(&w, n);
	*errors += w.errors;
	qsort(lat, n, sizeof(lat[0]), cmp_u32);
	*p50 = (lat[n / 2] - timer_cycles) * ns_per_cycle;
	*p99 = (lat[n * 99 / 100] - timer_cycles) * ns_per_cycle;
	free(lat);
}

/* Raise the open-file limit: every pinned buffer holds a dma-buf fd in every system. */
static void more_files(void)
{
	struct rlimit rl;

	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* The parts of a miss, each timed alone on fresh 1 MiB allocations made beforehand, as the misses
 * measured are (median of n, us). */
static void miss_parts(int n, double *query, double *query9, double *sync, double *export)
{
	/* What libgdrcache asks of a new allocation in one call (lib/cuda/cuda.c): memory type,
	 * BUFFER_ID, IS_MANAGED, RANGE_START_ADDR, RANGE_SIZE, DEVICE_ORDINAL, MAPPING_BASE_ADDR,
	 * MAPPING_SIZE, MEMPOOL_HANDLE (cuda.h's numbers). */
	int attrs9[9] = { 2, 7, 8, 11, 12, 9, 19, 18, 17 };
	double vq[64], vq9[64], vs[64], ve[64];
	uint64_t p[64];
	int m = 0;

	if (n > 64)
		n = 64;
	for (int i = 0; i < n; i++)
		if (hc.cuMemAlloc(&p[i], BUF_SIZE))
			p[i] = 0;
	for (int i = 0; i < n; i++) {
		uint64_t base, len, id, w[9][2];
		void *data[9];
		unsigned one = 1;
		int fd = -1;
		double t0, t1, t2, t3, t4;

		if (!p[i])
			continue;
		for (int a = 0; a < 9; a++)
			data[a] = w[a];
		/* The two queries take turns at coming first (the first of a fresh allocation). */
		if (i & 1) {
			t0 = now();
			hc_query(p[i], &base, &len, &id);
			t1 = now();
			hc.cuPointerGetAttributes(9, attrs9, data, p[i]);
			t4 = now();
			vq9[m] = (t4 - t1) * 1e6;
		} else {
			t4 = now();
			hc.cuPointerGetAttributes(9, attrs9, data, p[i]);
			t0 = now();
			hc_query(p[i], &base, &len, &id);
			t1 = now();
			vq9[m] = (t0 - t4) * 1e6;
		}
		hc.cuPointerSetAttribute(&one, HC_ATTR_SYNC_MEMOPS, p[i]);
		t2 = now();
		hc.cuMemGetHandleForAddressRange(&fd, base, (len + 65535) & ~65535ULL,
						 HC_DMA_BUF_FD, 0);
		t3 = now();
		if (fd >= 0)
			close(fd); /* a miss keeps it open: not part of a miss */
		vq[m] = (t1 - t0) * 1e6;
		vs[m] = (t2 - t1) * 1e6;
		ve[m] = (t3 - t2) * 1e6;
		m++;
	}
	for (int i = 0; i < n; i++)
		if (p[i])
			hc.cuMemFree(p[i]);
	*query = median(vq, m);
	*query9 = median(vq9, m);
	*sync = median(vs, m);
	*export = median(ve, m);
}

/* ns per random address the harness makes and reads (no registration): what every random
 * pattern's figure includes besides the system. */
static double harness_ns(const struct bset *set)
{
	uint64_t x = 0x2545f4914f6cdd1dULL, mask = set->n - 1, n = 1 << 24;
	volatile uint64_t sink;
	uint64_t acc = 0;
	double t0 = now();

	for (uint64_t i = 0; i < n; i++) {
		uint64_t v = xs64(&x), k = v & mask;

		acc += rand_addr(set, k, v) + set->len[k];
	}
	sink = acc;
	(void)sink;
	return (now() - t0) / (double)n * 1e9;
}

/* Whether --only (a comma-separated list of systems, or NULL: all) leaves name out. */
static bool left_out(const char *only, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = only; p; p = strchr(p, ','), p = p ? p + 1 : NULL)
		if (!strncmp(p, name, n) && (p[n] == ',' || !p[n]))
			return false;
	return only != NULL;
}

/* The floor of a lock-free hit on this machine, for the random patterns: ns per hit (median of
 * reps runs; *best) of the least such a hit does on set's 1 MiB buffers at random pages (the
 * harness's addresses, included). No validity, no pd or access, no memo, no epoch: what any
 * cache's hit pays at least, so that a system's figure reads against it (the "physical
 * limit"). Two layouts:
 *  - two lines (one_line false): the 2 MiB granule hashed (Fibonacci) into an open-addressing
 *    table of 8-byte slots at most a quarter full, slot by slot until the one naming a record
 *    whose range holds the address, that 64-byte record read, a count of this thread's up and
 *    down (an array of its own). A random hit reads two random lines, as libgdrcache's does (its
 *    hash, then its record: index.h).
 *  - one line: the 64-byte records themselves are the table's slots (a record once for each
 *    granule it touches, at most a quarter full): a random hit reads one random line. What a
 *    cache whose records sit where their hash puts them would pay at least. */
struct floor_rec {
	uint64_t g, start, size, idx, pad[4];
};

/* floor_ns's timed loop, iters hits; inline with one_line a constant. */
static inline __attribute__((always_inline)) void
floor_loop(const struct bset *set, uint64_t iters, uint64_t *xp, uint64_t mask, uint32_t bits,
	   const struct floor_rec *rec, const struct floor_rec *slots, const uint64_t *tab,
	   uint64_t *cnt, bool one_line)
{
	uint64_t x = *xp;

	for (uint64_t i = 0; i < iters; i++) {
		uint64_t u = xs64(&x), k = u & mask, w = 0;
		uint64_t addr = rand_addr(set, k, u);
		uint64_t g = addr >> 21, j = g * 0x9e3779b97f4a7c15ULL >> (64 - bits);
		const struct floor_rec *q;

		for (;; j = (j + 1) & ((1ULL << bits) - 1)) {
			if (one_line) {
				q = &slots[j];
				if (__atomic_load_n(&q->g, __ATOMIC_ACQUIRE) == g &&
				    addr - q->start < q->size)
					break;
			} else {
				w = __atomic_load_n(&tab[j], __ATOMIC_ACQUIRE);
				q = &rec[(w & 0xfffff) - 1];
				if (w >> 20 == g && addr - q->start < q->size)
					break;
			}
		}
		k = one_line ? q->idx : (w & 0xfffff) - 1;
		__atomic_store_n(&cnt[k], cnt[k] + 1, __ATOMIC_RELAXED);
		__atomic_store_n(&cnt[k], cnt[k] - 1, __ATOMIC_RELEASE);
	}
	*xp = x;
}

static double floor_ns(const struct bset *set, int reps, bool one_line, double *best)
{
	uint32_t n = set->n, bits = 4;
	struct floor_rec *rec, *slots = NULL;
	uint64_t *tab = NULL, *cnt = calloc(n, sizeof(*cnt)), x = 0x2545f4914f6cdd1dULL;
	uint64_t mask = n - 1;
	double v[32], med;

	while ((1ULL << bits) < 4ULL * n)
		bits++;
	rec = aligned_alloc(64, n * sizeof(*rec));
	if (one_line)
		slots = aligned_alloc(64, sizeof(*slots) << bits);
	else
		tab = aligned_alloc(64, sizeof(*tab) << bits);
	if (!rec || !cnt || (one_line ? !slots : !tab)) {
		free(rec), free(tab), free(slots), free(cnt);
		return 0;
	}
	if (one_line)
		memset(slots, 0, sizeof(*slots) << bits);
	else
		memset(tab, 0, sizeof(*tab) << bits);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t s = set->addr[i], e = s + (uint64_t)set->pages[i] * 4096;

		rec[i] = (struct floor_rec){ .start = s, .size = e - s, .idx = i };
		for (uint64_t g = s >> 21; g <= (e - 1) >> 21; g++) {
			uint64_t j = g * 0x9e3779b97f4a7c15ULL >> (64 - bits);

			if (one_line) {
				while (slots[j].size)
					j = (j + 1) & ((1ULL << bits) - 1);
				slots[j] = rec[i];
				slots[j].g = g;
			} else {
				while (tab[j])
					j = (j + 1) & ((1ULL << bits) - 1);
				tab[j] = g << 20 | (i + 1);
			}
		}
	}
	if (reps > 32)
		reps = 32;
	for (int r = -1; r < reps; r++) { /* the first run warms */
		uint64_t iters = 1 << 22;
		double t0 = now();

		if (one_line) /* a loop each: the layout is not a branch in the timed loop */
			floor_loop(set, iters, &x, mask, bits, rec, slots, tab, cnt, true);
		else
			floor_loop(set, iters, &x, mask, bits, rec, slots, tab, cnt, false);
		if (r >= 0)
			v[r] = (now() - t0) / (double)iters * 1e9;
	}
	free(rec), free(tab), free(slots), free(cnt);
	med = median(v, reps); /* sorts */
	*best = v[0];
	return med;
}

struct opts {
	int maxt, reps, quick, latency_only, no_traces, miss_only, traces_only;
	double secs;
	const char *csv_path, *only;
};

static void parse(struct opts *o, int argc, char **argv)
{
	*o = (struct opts){ .maxt = 16, .reps = 3, .secs = 0.25 };
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			o->maxt = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			o->secs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			o->reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
			o->csv_path = argv[++i];
		else if (!strcmp(argv[i], "--quick"))
			o->quick = 1;
		else if (!strcmp(argv[i], "--miss-only"))
			o->miss_only = 1;
		else if (!strcmp(argv[i], "--latency-only"))
			o->latency_only = 1;
		else if (!strcmp(argv[i], "--no-traces"))
			o->no_traces = 1;
		else if (!strcmp(argv[i], "--traces-only"))
			o->traces_only = 1;
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			o->only = argv[++i];
		else
			usage();
	}
	if (o->maxt < 1 || o->maxt > MAX_THREADS)
		o->maxt = 16;
	if (o->reps < 1 || o->reps > 15)
		o->reps = 3;
}

/* The buffers of the hit runs: bufs[0..maxt] (same, own, shared); NRAND 1 MiB buffers (rand<n>
 * use the first n; thread i's own set is [i * OWN_SET, (i + 1) * OWN_SET); shared-rand the first
 * SHARED_SET), and NMIXED buffers of 4 KiB to 4 MiB, log-uniform, allocated in random order
 * (small ones share pages). */
struct bufs {
	uint64_t bufs[MAX_THREADS + 1];
	uint64_t *rbuf, *rsize, *mbuf, *msize;
	struct bset pat_set[NPAT], own_sets[MAX_THREADS], shared_set;
};

static int alloc_buffers(struct bufs *b, int maxt)
{
	for (int i = 0; i <= maxt; i++)
		if (hc.cuMemAlloc(&b->bufs[i], BUF_SIZE)) {
			printf("bench_hit: cuMemAlloc failed\n");
			return 1;
		}
	b->rbuf = calloc(NRAND, sizeof(*b->rbuf));
	b->rsize = calloc(NRAND, sizeof(*b->rsize));
	b->mbuf = calloc(NMIXED, sizeof(*b->mbuf));
	b->msize = calloc(NMIXED, sizeof(*b->msize));
	rng_state = 0x6a09e667f3bcc909ULL;
	for (int i = 0; i < NRAND; i++) {
		b->rsize[i] = BUF_SIZE;
		if (hc.cuMemAlloc(&b->rbuf[i], BUF_SIZE)) {
			printf("bench_hit: cuMemAlloc failed (random set)\n");
			return 1;
		}
	}
	for (int i = 0; i < NMIXED; i++) {
		b->msize[i] = 4 * KiB << (rnd() % 11);
		if (hc.cuMemAlloc(&b->mbuf[i], b->msize[i])) {
			printf("bench_hit: cuMemAlloc failed (mixed set)\n");
			return 1;
		}
	}
	set_of(&b->pat_set[1], b->rbuf, b->rsize, 128);
	set_of(&b->pat_set[2], b->rbuf, b->rsize, 1024);
	set_of(&b->pat_set[3], b->rbuf, b->rsize, NRAND);
	set_of(&b->pat_set[4], b->mbuf, b->msize, NMIXED);
	for (int i = 0; i < maxt; i++)
		set_of(&b->own_sets[i], b->rbuf + (size_t)(i % (NRAND / OWN_SET)) * OWN_SET,
		       b->rsize, OWN_SET);
	set_of(&b->shared_set, b->rbuf, b->rsize, SHARED_SET);
	return 0;
}

static void free_buffers(struct bufs *b, int maxt)
{
	for (int i = 0; i <= maxt; i++)
		hc.cuMemFree(b->bufs[i]);
	for (int i = 0; i < NRAND; i++)
		hc.cuMemFree(b->rbuf[i]);
	for (int i = 0; i < NMIXED; i++)
		hc.cuMemFree(b->mbuf[i]);
}

static void open_systems(struct sys *sys, const char *only)
{
	/* The hit runs cache ~5000 buffers: libgdrcache's limits are raised above that (its
	 * defaults depend on the GPU); the baseline and ucs_rcache are unbounded by default. */
	struct sys_limits big = { 1ULL << 40, 1u << 20 };

	printf("\nsystems:\n");
	for (int k = 0; k < SYS_COUNT; k++) {
		if (left_out(only, sys_names[k])) {
			memset(&sys[k], 0, sizeof(sys[k]));
			snprintf(sys[k].why, sizeof(sys[k].why), "left out (--only %s)", only);
			continue;
		}
		sys_open(&sys[k], (enum sys_kind)k, k <= SYS_GDR_TAG ? &big : NULL);
		report_system(sys_names[k], &sys[k]);
	}
}

/* Miss: the first registration of a new allocation, each system its own fresh ones, the
 * systems taking turns (the first to touch fresh memory would pay for the others). */
static void measure_miss(struct hit_results *R, struct sys *sys)
{
	static double v[SYS_COUNT][NM], d[SYS_COUNT][NM], t_miss[SYS_COUNT][NM];
	static uint64_t fresh[SYS_COUNT][NM];
	static void *r[SYS_COUNT][NM];
	int n[SYS_COUNT] = { 0 };

	for (int k = 0; k < SYS_COUNT; k++)
		for (int i = 0; sys[k].available && i < NM; i++)
			hc.cuMemAlloc(&fresh[k][i], BUF_SIZE);
	for (int i = 0; i < NM; i++)
		for (int q = 0; q < SYS_COUNT; q++) {
			int k = (q + i) % SYS_COUNT; /* each system first in turn */
			double t0 = now();

			if (!sys[k].available)
				continue;
			if (sys_get(&sys[k], fresh[k][i], HIT_LEN, &r[k][i]) == 0) {
				v[k][n[k]++] = (now() - t0) * 1e6;
				t_miss[k][i] = v[k][n[k] - 1];
			} else {
				r[k][i] = NULL;
				R->errors[k]++;
			}
		}
	for (int k = 0; k < SYS_COUNT; k++) {
		for (int i = 0; sys[k].available && i < NM; i++) {
			if (r[k][i])
				sys_put(&sys[k], r[k][i]);
			sys_freed(&sys[k], fresh[k][i], BUF_SIZE);
			hc.cuMemFree(fresh[k][i]);
		}
		R->miss_us[k] = sys[k].available ? median(v[k], n[k]) : 0;
	}
	/* Against tagcheck, allocation by allocation: the systems took turns on each, so the
	 * machine's drift (the export alone varies by microseconds) cancels in the pairs. */
	for (int k = 0; k < SYS_COUNT; k++) {
		int m = 0;

		for (int i = 0; i < NM && sys[k].available && sys[SYS_TAGCHECK].available; i++)
			if (r[k][i] && r[SYS_TAGCHECK][i])
				d[k][m++] = t_miss[k][i] - t_miss[SYS_TAGCHECK][i];
		R->miss_paired[k] = m ? median(d[k], m) : 0;
		R->miss_paired_n[k] = m;
	}
	miss_parts(64, &R->q_us, &R->q9_us, &R->s_us, &R->x_us);
}

/* Warm every buffer into every cache, each registered whole (ucs_rcache pins what is asked:
 * a whole registration makes every later sub-range of the buffer a hit there too). */
static void warm(struct hit_results *R, struct sys *sys, const struct bufs *b, int maxt)
{
	for (int k = 0; k < SYS_COUNT; k++) {
		void *r;

		for (int i = 0; sys[k].available && i <= maxt; i++) {
			if (sys_get(&sys[k], b->bufs[i], HIT_LEN, &r) == 0)
				sys_put(&sys[k], r);
			else
				R->errors[k]++;
		}
		for (int i = 0; sys[k].available && i < NRAND; i++) {
			if (sys_get(&sys[k], b->rbuf[i], b->rsize[i], &r) == 0)
				sys_put(&sys[k], r);
			else
				R->errors[k]++;
		}
		for (int i = 0; sys[k].available && i < NMIXED; i++) {
			if (sys_get(&sys[k], b->mbuf[i], b->msize[i], &r) == 0)
				sys_put(&sys[k], r);
			else
				R->errors[k]++;
		}
	}
}

/* The systems take turns, run by run (each first in turn), so that a machine whose speed
 * drifts (a VM's does, by up to 2x for seconds at a time) slows them alike. */
static void measure_latency(struct hit_results *R, struct sys *sys, const struct bufs *b, int quick)
{
	for (int pi = 0, nrun = quick ? 3 : 7; pi < NPAT; pi++) {
		const struct bset *set = pi ? &b->pat_set[pi] : NULL;
		uint64_t batches = quick ? 256 : 4096;
		double v[SYS_COUNT][7];

		for (int k = 0; k < SYS_COUNT; k++) /* warm */
			if (sys[k].available)
				latency_run(&sys[k], b->bufs[1], set, batches / 4, &R->errors[k]);
		for (int r = 0; r < nrun; r++)
			for (int q = 0; q < SYS_COUNT; q++) {
				int k = (q + r) % SYS_COUNT;

				if (sys[k].available)
					v[k][r] = latency_run(&sys[k], b->bufs[1], set, batches,
							      &R->errors[k]);
			}
		for (int k = 0; k < SYS_COUNT; k++) {
			if (!sys[k].available)
				continue;
			R->lat[k][pi] = median(v[k], nrun); /* sorts */
			R->lat_best[k][pi] = v[k][0];
			latency_dist(&sys[k], b->bufs[1], set, quick ? 20000 : 200000,
				     &R->p50[k][pi], &R->p99[k][pi], &R->errors[k]);
		}
	}
}

/* The floor rows on the random sets of 1 MiB buffers, then the harness alone. */
static void measure_floors(struct hit_results *R, const struct bufs *b, int quick)
{
	for (int fl = 0; fl < 2; fl++)
		for (int pi = 1; pi <= 3; pi++)
			R->floor[fl][pi] = floor_ns(&b->pat_set[pi], quick ? 3 : 7, fl,
						    &R->floor_best[fl][pi]);
	R->harness = harness_ns(&b->pat_set[3]);
}

/* Throughput: thread counts outermost, systems interleaved, repeated. */
static void measure_throughput(struct hit_results *R, struct sys *sys, const struct bufs *b,
			       const struct opts *o)
{
	for (int ti = 0; ti < R->ncounts; ti++)
		for (int m = 0; m < NTP; m++) {
			double v[SYS_COUNT][16];
			const struct bset *sets = NULL;

			if (m == 2)
				sets = b->own_sets;
			else if (m == 3)
				sets = &b->shared_set;

			for (int rep = 0; rep < o->reps; rep++)
				for (int k = 0; k < SYS_COUNT; k++)
					if (sys[k].available)
						v[k][rep] = throughput(&sys[k], R->counts[ti],
								       m & 1, b->bufs, sets,
								       o->secs, &R->errors[k]);
			for (int k = 0; k < SYS_COUNT; k++)
				R->tput[k][ti][m] = sys[k].available ? median(v[k], o->reps) : 0;
		}
}

/* Traces: the same operations for every system, each on a fresh cache. */
static void traces(const struct opts *o)
{
	struct trace tr[5];

	memset(tr, 0, sizeof(tr));
	rng_state = 0x9e3779b97f4a7c15ULL;
	gen_alloc_loop(&tr[0], o->quick ? 40 : 300);
	rng_state = 0x2545f4914f6cdd1dULL;
	gen_halo(&tr[1], o->quick ? 20 : 200);
	rng_state = 0x5851f42d4c957f2dULL;
	gen_churn(&tr[2], o->quick ? 1000 : 12000);
	rng_state = 0x1f83d9abfb41bd6bULL;
	gen_size_mix(&tr[3], o->quick ? 2000 : 12000);
	rng_state = 0x5be0cd19137e2179ULL;
	gen_pytorch(&tr[4], o->quick ? 30 : 120);
	for (int i = 0; i < 5; i++) {
		report_trace_head(&tr[i]);
		for (int k = 0; k < SYS_COUNT; k++) {
			struct trace_result r;

			if (left_out(o->only, sys_names[k]))
				continue;
			if (k == SYS_PRELOAD) /* hit_preload.c: gdr-events' cache */
				continue;
			if (run_trace(&tr[i], (enum sys_kind)k, &r)) {
				report_trace_unavailable((enum sys_kind)k, &r);
				continue;
			}
			report_trace_row(&tr[i], (enum sys_kind)k, &r);
		}
		free(tr[i].ops);
	}
	report_trace_note();
}

int main(int argc, char **argv)
{
	static struct hit_results res;
	struct hit_results *R = &res;
	struct opts o;
	char why[256];
	struct sys sys[SYS_COUNT];
	static struct bufs b;

	parse(&o, argc, argv);
	if (hc_load(why, sizeof(why))) {
		printf("bench_hit: %s: nothing to measure\n", why);
		return 77;
	}
	report_machine();
	more_files();
	cycles_calibrate();
	timer_calibrate();
	if (o.csv_path && report_csv_open(o.csv_path))
		return 1;
	for (int t = 1; t <= o.maxt && R->ncounts < 8; t *= 2)
		R->counts[R->ncounts++] = t;
	report_header(o.secs, o.reps, ns_per_cycle, timer_cycles);

	if (!o.traces_only) {
		if (alloc_buffers(&b, o.maxt))
			return 1;
		open_systems(sys, o.only);
		measure_miss(R, sys);
		if (!o.miss_only) {
			warm(R, sys, &b, o.maxt);
			measure_latency(R, sys, &b, o.quick);
			report_latency(R, sys, o.quick, timer_cycles);
			measure_floors(R, &b, o.quick);
			report_floors(R);
			if (o.latency_only)
				return 0;
		}
		report_miss(R, sys, NM);
		if (o.miss_only)
			return 0;
		measure_throughput(R, sys, &b, &o);
		report_throughput(R, sys);
		report_ratios(R, sys);
		for (int k = 0; k < SYS_COUNT; k++) {
			if (!sys[k].available)
				continue;
			report_after(sys_names[k], &sys[k], R->errors[k]);
			sys_close(&sys[k]);
		}
		free_buffers(&b, o.maxt);
	}
	if (!o.no_traces)
		traces(&o);
	report_csv_close();
	return 0;
}
