/* SPDX-License-Identifier: MIT */
/*
 * Cache hits side by side, in one run, on the machine it runs on (it names it): libgdrcache in
 * events mode and in tag mode, the "check BUFFER_ID on every hit" baseline and UCX's ucs_rcache,
 * all pinning through the same callbacks (hit_sys.h); and, run under LD_PRELOAD over the fake
 * libibverbs (bench/run-gpu-preload.sh hits), ibv_reg_mr / ibv_dereg_mr of a PD through
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

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)
#define MAX_THREADS 64
#define HIT_LEN 4096
#define BUF_SIZE MiB

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- machine and output ------------------------------------------------------------------- */

static char cpu_model[128] = "?";
static long ncpu;
static FILE *csv;

static void machine(void)
{
	bench_cpu_model(cpu_model, sizeof(cpu_model));
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
}

/* One CSV row: the machine, then what was measured. */
static void row(const char *metric, const char *system, const char *trace, int threads,
		const char *buffers, double value, const char *unit)
{
	if (!csv)
		return;
	fprintf(csv, "\"%s\",%s,%d,%ld,%s,%s,%s,%d,%s,%.6g,%s\n", hc.gpu, hc.driver, hc.cuda_version,
		ncpu, metric, system, trace ? trace : "", threads, buffers ? buffers : "", value,
		unit);
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

/* ---- traces ------------------------------------------------------------------------------- */

enum { OP_ALLOC, OP_FREE, OP_REG };

struct op {
	uint32_t kind, slot;
	uint64_t a, b; /* ALLOC: size; REG: offset, length */
};

struct trace {
	const char *name;
	const char *what;
	struct op *ops;
	size_t n, cap;
	uint32_t nslots;
	struct sys_limits lim;
};

static uint64_t rng_state;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static double rndu(void)
{
	return (double)(rnd() >> 11) / 9007199254740992.0;
}

static void emit(struct trace *t, uint32_t kind, uint32_t slot, uint64_t a, uint64_t b)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 4096;
		t->ops = realloc(t->ops, t->cap * sizeof(*t->ops));
		if (!t->ops) {
			perror("realloc");
			exit(1);
		}
	}
	t->ops[t->n++] = (struct op){ kind, slot, a, b };
	if (slot + 1 > t->nslots)
		t->nslots = slot + 1;
}

/* A caching allocator (PyTorch-like) over the driver: tensors take a free cached block of their
 * size or a new one; freed tensors go back to the cache; empty_cache() every 20 steps, and the
 * cache past 256 MiB, free blocks to the driver. Every tensor is registered whole, half of them
 * also by a 64 KiB-aligned slice (a gradient bucket). */
static void gen_alloc_loop(struct trace *t, int steps)
{
	static const uint64_t pattern[] = { 64 * KiB, 256 * KiB, MiB, 2 * MiB, 4 * MiB, 8 * MiB,
					    MiB, 512 * KiB, 16 * MiB, 2 * MiB, 128 * KiB, 4 * MiB };
	enum { NP = sizeof(pattern) / sizeof(pattern[0]), MAXB = 4096 };
	struct { uint32_t slot; uint64_t size; int in_use; } blk[MAXB];
	uint32_t nb = 0, next_slot = 0;
	uint64_t cached = 0;

	t->name = "alloc-loop";
	t->what = "caching allocator: block reuse, empty_cache every 20 steps, realloc at same VA";
	t->lim = (struct sys_limits){ 512 * MiB, 4096 };
	for (int s = 0; s < steps; s++) {
		uint32_t live[NP + 1];
		int nlive = 0;

		for (int i = 0; i <= NP; i++) {
			uint64_t size;
			uint32_t b;

			if (i == NP) { /* one tensor of an odd size, one step in ten */
				if (rnd() % 10)
					continue;
				size = 64 * KiB * (1 + rnd() % 64);
			} else {
				size = pattern[i];
			}
			for (b = 0; b < nb; b++)
				if (!blk[b].in_use && blk[b].size == size)
					break;
			if (b == nb) {
				if (nb == MAXB)
					break;
				blk[nb] = (typeof(blk[0])){ next_slot++, size, 0 };
				emit(t, OP_ALLOC, blk[nb].slot, size, 0);
				cached += size;
				nb++;
			}
			blk[b].in_use = 1;
			live[nlive++] = b;
			emit(t, OP_REG, blk[b].slot, 0, size);
			if (rnd() & 1) {
				uint64_t off = (rnd() % (size / (64 * KiB))) * 64 * KiB;

				emit(t, OP_REG, blk[b].slot, off, size - off < MiB ? size - off : MiB);
			}
		}
		for (int i = 0; i < nlive; i++)
			blk[live[i]].in_use = 0;
		if ((s + 1) % 20 == 0 || cached > 256 * MiB) {
			uint32_t k = 0;

			for (uint32_t b = 0; b < nb; b++) {
				if (blk[b].in_use) {
					blk[k++] = blk[b];
					continue;
				}
				emit(t, OP_FREE, blk[b].slot, 0, 0);
				cached -= blk[b].size;
			}
			nb = k;
		}
	}
	for (uint32_t b = 0; b < nb; b++)
		emit(t, OP_FREE, blk[b].slot, 0, 0);
}

/* A 3-D halo exchange, N = 256 doubles a side, ghost width 4: faces 512 KiB, edges 32 KiB,
 * corners 512 B. Fields 0-1: one send and one receive buffer per neighbour; fields 2-3: one
 * packed send and one packed receive buffer, neighbours registered by offset. Every 50 iterations
 * field 1's receive buffers and field 3's packed buffers are freed and allocated again. */
static void gen_halo(struct trace *t, int iters)
{
	enum { F = 4, NB = 26 };
	uint64_t sz[NB], packed = 0, off[NB];
	uint32_t slot[F][2][NB];
	uint32_t next = 0;

	t->name = "halo";
	t->what = "MPI halo exchange: 4 fields x 26 neighbours x send/recv, packed and separate";
	t->lim = (struct sys_limits){ 512 * MiB, 4096 };
	for (int n = 0; n < NB; n++) {
		sz[n] = n < 6 ? 512 * KiB : n < 18 ? 32 * KiB : 512;
		off[n] = packed;
		packed += sz[n];
	}
	for (int f = 0; f < F; f++)
		for (int d = 0; d < 2; d++) {
			if (f < 2) {
				for (int n = 0; n < NB; n++) {
					slot[f][d][n] = next++;
					emit(t, OP_ALLOC, slot[f][d][n], sz[n], 0);
				}
			} else {
				slot[f][d][0] = next++;
				emit(t, OP_ALLOC, slot[f][d][0], packed, 0);
			}
		}
	for (int it = 0; it < iters; it++) {
		if (it && it % 50 == 0) {
			for (int n = 0; n < NB; n++) {
				emit(t, OP_FREE, slot[1][1][n], 0, 0);
				emit(t, OP_ALLOC, slot[1][1][n], sz[n], 0);
			}
			for (int d = 0; d < 2; d++) {
				emit(t, OP_FREE, slot[3][d][0], 0, 0);
				emit(t, OP_ALLOC, slot[3][d][0], packed, 0);
			}
		}
		for (int f = 0; f < F; f++)
			for (int d = 0; d < 2; d++)
				for (int n = 0; n < NB; n++) {
					if (f < 2)
						emit(t, OP_REG, slot[f][d][n], 0, sz[n]);
					else
						emit(t, OP_REG, slot[f][d][0], off[n], sz[n]);
				}
	}
	for (uint32_t s = 0; s < next; s++)
		emit(t, OP_FREE, s, 0, 0);
}

/* 48 live buffers of 64 KiB x 2^(0..9) (about 250 MiB live, 4 x the 64 MiB cache limit);
 * registrations of random 4 KiB-aligned sub-ranges, buffers picked with a skew (u^2); 8% of the
 * operations free a buffer and allocate another of a new size in its place. */
static void gen_churn(struct trace *t, int nops)
{
	enum { L = 48 };
	uint64_t size[L];

	t->name = "churn";
	t->what = "random sizes and sub-ranges, frees and new allocations, live set 4x the limit";
	t->lim = (struct sys_limits){ 64 * MiB, 1024 };
	for (int s = 0; s < L; s++) {
		size[s] = 64 * KiB << (rnd() % 10);
		emit(t, OP_ALLOC, s, size[s], 0);
	}
	for (int i = 0; i < nops; i++) {
		double u = rndu();
		uint32_t s = (uint32_t)(L * u * u);

		if (rnd() % 100 < 8) {
			emit(t, OP_FREE, s, 0, 0);
			size[s] = 64 * KiB << (rnd() % 10);
			emit(t, OP_ALLOC, s, size[s], 0);
		} else {
			uint64_t off = (rnd() % (size[s] / (4 * KiB))) * 4 * KiB;
			uint64_t len = 4 * KiB << (rnd() % 9);

			if (len > size[s] - off)
				len = size[s] - off;
			emit(t, OP_REG, s, off, len);
		}
	}
	for (uint32_t s = 0; s < L; s++)
		emit(t, OP_FREE, s, 0, 0);
}

/* 256 live allocations of 512 B to 64 MiB (log-uniform: small ones share pages, large ones are
 * their own chunks; about 1.4 GiB live, 5-6 x the 256 MiB limit); registrations whole (a third) or
 * of a random 4 KiB-aligned sub-range, allocations picked with a skew (u^2); 5% of the operations
 * free one and allocate another of a new size in its place. */
static void gen_size_mix(struct trace *t, int nops)
{
	enum { L = 256 };
	uint64_t size[L];

	t->name = "size-mix";
	t->what = "allocations of 512 B to 64 MiB, whole and sub-range registrations, frees";
	t->lim = (struct sys_limits){ 256 * MiB, 4096 };
	for (int s = 0; s < L; s++) {
		size[s] = (uint64_t)(512.0 * pow(2.0, 17.0 * rndu()));
		emit(t, OP_ALLOC, s, size[s], 0);
	}
	for (int i = 0; i < nops; i++) {
		double u = rndu();
		uint32_t s = (uint32_t)(L * u * u);

		if (rnd() % 100 < 5) {
			emit(t, OP_FREE, s, 0, 0);
			size[s] = (uint64_t)(512.0 * pow(2.0, 17.0 * rndu()));
			emit(t, OP_ALLOC, s, size[s], 0);
		} else if (rnd() % 3 == 0 || size[s] <= 4 * KiB) {
			emit(t, OP_REG, s, 0, size[s]);
		} else {
			uint64_t off = (rnd() % (size[s] / (4 * KiB))) * 4 * KiB;
			uint64_t len = 4 * KiB << (rnd() % 10);

			if (len > size[s] - off)
				len = size[s] - off;
			emit(t, OP_REG, s, off, len);
		}
	}
	for (uint32_t s = 0; s < L; s++)
		emit(t, OP_FREE, s, 0, 0);
}

/* PyTorch's caching allocator (CUDACachingAllocator, simplified): requests up to 1 MiB are carved
 * from 2 MiB segments, up to 10 MiB from 20 MiB segments, larger ones get a segment of their own
 * rounded up to 2 MiB; freed blocks go back to the pool (merged with free neighbours), and only
 * empty_cache() gives whole free segments back to the driver. A training loop over a 24-layer
 * model: each step's forward pass allocates every layer's activations (sizes scaled by the step's
 * sequence length, one of three) and registers each (a pipeline stage sending them, or saving them
 * for a remote backward), the backward pass frees them in reverse; empty_cache() every 25 steps.
 * About 4.4 GiB of activations a step: more than the old fixed default of 4 GiB. Limits: the
 * library's defaults (what a job gets); the others unbounded. */
struct pt_block { uint32_t seg; uint64_t off, size; int used; };
struct pt_alloc {
	struct trace *t;
	struct pt_block *b;
	uint32_t nb, cap, nseg;
	uint64_t *seg_size;
	uint32_t *seg_slot, next_slot;
	int *seg_live;
};

static uint32_t pt_malloc(struct pt_alloc *pa, uint64_t size)
{
	uint64_t seg_size;
	uint32_t best = UINT32_MAX;
	int small = size <= MiB;

	size = (size + 511) & ~511ULL; /* kMinBlockSize */
	for (uint32_t i = 0; i < pa->nb; i++) {
		struct pt_block *b = &pa->b[i];
		int bsmall = pa->seg_size[b->seg] == 2 * MiB;

		if (!b->used && b->size >= size && bsmall == small &&
		    (best == UINT32_MAX || b->size < pa->b[best].size))
			best = i;
	}
	if (best == UINT32_MAX) {
		seg_size = small ? 2 * MiB : size <= 10 * MiB ? 20 * MiB :
			(size + 2 * MiB - 1) & ~(2 * MiB - 1);
		if (pa->nseg % 64 == 0) {
			pa->seg_size = realloc(pa->seg_size, (pa->nseg + 64) * sizeof(*pa->seg_size));
			pa->seg_slot = realloc(pa->seg_slot, (pa->nseg + 64) * sizeof(*pa->seg_slot));
			pa->seg_live = realloc(pa->seg_live, (pa->nseg + 64) * sizeof(*pa->seg_live));
		}
		pa->seg_size[pa->nseg] = seg_size;
		pa->seg_slot[pa->nseg] = pa->next_slot++;
		pa->seg_live[pa->nseg] = 1;
		emit(pa->t, OP_ALLOC, pa->seg_slot[pa->nseg], seg_size, 0);
		if (pa->nb == pa->cap) {
			pa->cap = pa->cap ? 2 * pa->cap : 256;
			pa->b = realloc(pa->b, pa->cap * sizeof(*pa->b));
		}
		pa->b[pa->nb] = (struct pt_block){ pa->nseg, 0, seg_size, 0 };
		best = pa->nb++;
		pa->nseg++;
	}
	if (pa->b[best].size - size >= (small ? 512 : MiB)) { /* split off the rest */
		if (pa->nb == pa->cap) {
			pa->cap *= 2;
			pa->b = realloc(pa->b, pa->cap * sizeof(*pa->b));
		}
		pa->b[pa->nb++] = (struct pt_block){ pa->b[best].seg, pa->b[best].off + size,
						     pa->b[best].size - size, 0 };
		pa->b[best].size = size;
	}
	pa->b[best].used = 1;
	return best;
}

static void pt_free(struct pt_alloc *pa, uint32_t i)
{
	struct pt_block *b = &pa->b[i];

	b->used = 0;
	for (int merged = 1; merged;) { /* merge with free neighbours in its segment */
		merged = 0;
		for (uint32_t j = 0; j < pa->nb; j++) {
			struct pt_block *o = &pa->b[j];

			if (j == i || o->used || o->seg != b->seg || o->size == 0)
				continue;
			if (o->off + o->size == b->off || b->off + b->size == o->off) {
				if (o->off < b->off)
					b->off = o->off;
				b->size += o->size;
				o->size = 0;
				merged = 1;
			}
		}
	}
}

static void pt_empty_cache(struct pt_alloc *pa)
{
	uint32_t k = 0;

	for (uint32_t sg = 0; sg < pa->nseg; sg++) {
		int busy = 0, any = 0;

		if (!pa->seg_live[sg])
			continue;
		for (uint32_t i = 0; i < pa->nb; i++)
			if (pa->b[i].seg == sg && pa->b[i].size) {
				any = 1;
				busy |= pa->b[i].used;
			}
		if (!busy && any) {
			emit(pa->t, OP_FREE, pa->seg_slot[sg], 0, 0);
			pa->seg_live[sg] = 0;
			for (uint32_t i = 0; i < pa->nb; i++)
				if (pa->b[i].seg == sg)
					pa->b[i].size = 0;
		}
	}
	for (uint32_t i = 0; i < pa->nb; i++) /* compact */
		if (pa->b[i].size)
			pa->b[k++] = pa->b[i];
	pa->nb = k;
}

static void gen_pytorch(struct trace *t, int steps)
{
	/* Per layer: sizes in units of the step's activation size A (16 MiB x seq / 2048). */
	static const struct { uint32_t num, den; } layer[] = {
		{ 3, 1 }, { 2, 1 }, { 1, 1 }, { 4, 1 }, { 4, 1 }, { 1, 1 }, { 1, 256 }, { 1, 64 },
		{ 1, 1024 }, { 1, 8 },
	};
	enum { NL = sizeof(layer) / sizeof(layer[0]), LAYERS = 24 };
	static const uint64_t seqs[] = { 1536, 2048, 2560 };
	struct pt_alloc pa = { .t = t };
	uint32_t act[LAYERS * NL];

	t->name = "pytorch";
	t->what = "caching allocator: 24 layers of activations a step, registered, freed, empty_cache";
	t->lim = (struct sys_limits){ 0, 0 }; /* the library's defaults */
	for (int s = 0; s < steps; s++) {
		uint64_t A = 16 * MiB * seqs[rnd() % 3] / 2048;
		int n = 0;

		for (int l = 0; l < LAYERS; l++)
			for (int k = 0; k < NL; k++) {
				uint64_t size = A * layer[k].num / layer[k].den;
				uint32_t b = pt_malloc(&pa, size);

				act[n++] = b;
				emit(t, OP_REG, pa.seg_slot[pa.b[b].seg], pa.b[b].off, size);
			}
		while (n > 0)
			pt_free(&pa, act[--n]);
		if ((s + 1) % 25 == 0)
			pt_empty_cache(&pa);
	}
	for (uint32_t sg = 0; sg < pa.nseg; sg++)
		if (pa.seg_live[sg])
			emit(t, OP_FREE, pa.seg_slot[sg], 0, 0);
	free(pa.b);
	free(pa.seg_size);
	free(pa.seg_slot);
	free(pa.seg_live);
}

struct trace_result {
	uint64_t requests, misses, wrong, not_covered, failed, reallocs_same_va, frees;
	uint64_t peak_pinned;      /* bytes pinned at most, sampled after every registration */
	double us_per_req;
	char stats[512];
};

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

int main(int argc, char **argv)
{
	enum { NPAT = 5 };
	static const char *const pat_name[NPAT] = { "same", "rand128", "rand1024", "rand4096",
						    "mixed1024" };
	static const char *const tp_name[4] = { "own", "shared", "own-rand", "shared-rand" };
	int maxt = 16, reps = 3, quick = 0, counts[8], ncounts = 0, latency_only = 0, no_traces = 0,
	    miss_only = 0;
	int traces_only = 0;
	double secs = 0.25;
	const char *csv_path = NULL, *only = NULL;
	char why[256];
	uint64_t bufs[MAX_THREADS + 1];
	struct sys sys[SYS_COUNT];
	/* [system][threads index][own/shared/own-rand/shared-rand] */
	double tput[SYS_COUNT][8][4], lat[SYS_COUNT][NPAT], lat_best[SYS_COUNT][NPAT];
	double p50[SYS_COUNT][NPAT], p99[SYS_COUNT][NPAT], miss_us[SYS_COUNT];
	double miss_paired[SYS_COUNT];
	int miss_paired_n[SYS_COUNT];
	double q_us, q9_us, s_us, x_us;
	uint64_t errors[SYS_COUNT] = { 0 };
	uint64_t *rbuf, *rsize, *mbuf, *msize;
	struct bset pat_set[NPAT], own_sets[MAX_THREADS], shared_set;
	/* The hit runs cache ~5000 buffers: libgdrcache's limits are raised above that (its
	 * defaults depend on the GPU); the baseline and ucs_rcache are unbounded by default. */
	struct sys_limits big = { 1ULL << 40, 1u << 20 };

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			maxt = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			secs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
			csv_path = argv[++i];
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--miss-only"))
			miss_only = 1;
		else if (!strcmp(argv[i], "--latency-only"))
			latency_only = 1;
		else if (!strcmp(argv[i], "--no-traces"))
			no_traces = 1;
		else if (!strcmp(argv[i], "--traces-only"))
			traces_only = 1;
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else
			usage();
	}
	if (maxt < 1 || maxt > MAX_THREADS)
		maxt = 16;
	if (reps < 1 || reps > 15)
		reps = 3;
	if (hc_load(why, sizeof(why))) {
		printf("bench_hit: %s: nothing to measure\n", why);
		return 77;
	}
	machine();
	more_files();
	cycles_calibrate();
	timer_calibrate();
	if (csv_path) {
		csv = fopen(csv_path, "w");
		if (!csv) {
			perror(csv_path);
			return 1;
		}
		fprintf(csv, "gpu,driver,cuda,cpus,metric,system,trace,threads,buffers,value,unit\n");
	}
	for (int t = 1; t <= maxt && ncounts < 8; t *= 2)
		counts[ncounts++] = t;

	printf("# bench_hit: registration-cache hits side by side, one run\n");
	printf("# libgdrcache loaded: %s\n", getenv("BENCH_LOAD_MODE") ? getenv("BENCH_LOAD_MODE") :
	       getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "gdrcache") ?
	       "linked into the executable, and LD_PRELOADed" : "linked into the executable");
	printf("# machine: GPU 0 %s; NVIDIA driver %s; CUDA driver API %d; %ld CPUs (%s)\n", hc.gpu,
	       hc.driver, hc.cuda_version, ncpu, cpu_model);
	if (hc.fake)
		printf("# THE FAKE CUDA DRIVER ($GDRCACHE_LIBCUDA): a simulation, not a measurement\n");
	printf("# registrations of %llu KiB at the start of %llu MiB buffers (same), or at a random "
	       "4 KiB page of a random buffer of a set (rand*, mixed*); %.2f s per point, median of "
	       "%d; threads pinned to CPUs 0..n-1; cycle counter %.3f ns, timer %.0f cycles\n",
	       HIT_LEN / KiB, BUF_SIZE / MiB, secs, reps, ns_per_cycle, timer_cycles);

	if (traces_only)
		goto traces;
	for (int i = 0; i <= maxt; i++)
		if (hc.cuMemAlloc(&bufs[i], BUF_SIZE)) {
			printf("bench_hit: cuMemAlloc failed\n");
			return 1;
		}
	/* The random sets: NRAND 1 MiB buffers (rand<n> use the first n; thread i's own set is
	 * [i * OWN_SET, (i + 1) * OWN_SET); shared-rand the first SHARED_SET), and NMIXED buffers of
	 * 4 KiB to 4 MiB, log-uniform, allocated in random order (small ones share pages). */
	rbuf = calloc(NRAND, sizeof(*rbuf));
	rsize = calloc(NRAND, sizeof(*rsize));
	mbuf = calloc(NMIXED, sizeof(*mbuf));
	msize = calloc(NMIXED, sizeof(*msize));
	rng_state = 0x6a09e667f3bcc909ULL;
	for (int i = 0; i < NRAND; i++) {
		rsize[i] = BUF_SIZE;
		if (hc.cuMemAlloc(&rbuf[i], BUF_SIZE)) {
			printf("bench_hit: cuMemAlloc failed (random set)\n");
			return 1;
		}
	}
	for (int i = 0; i < NMIXED; i++) {
		msize[i] = 4 * KiB << (rnd() % 11);
		if (hc.cuMemAlloc(&mbuf[i], msize[i])) {
			printf("bench_hit: cuMemAlloc failed (mixed set)\n");
			return 1;
		}
	}
	set_of(&pat_set[1], rbuf, rsize, 128);
	set_of(&pat_set[2], rbuf, rsize, 1024);
	set_of(&pat_set[3], rbuf, rsize, NRAND);
	set_of(&pat_set[4], mbuf, msize, NMIXED);
	for (int i = 0; i < maxt; i++)
		set_of(&own_sets[i], rbuf + (size_t)(i % (NRAND / OWN_SET)) * OWN_SET, rsize, OWN_SET);
	set_of(&shared_set, rbuf, rsize, SHARED_SET);

	printf("\nsystems:\n");
	for (int k = 0; k < SYS_COUNT; k++) {
		if (left_out(only, sys_names[k])) {
			memset(&sys[k], 0, sizeof(sys[k]));
			snprintf(sys[k].why, sizeof(sys[k].why), "left out (--only %s)", only);
			continue;
		}
		sys_open(&sys[k], (enum sys_kind)k, k <= SYS_GDR_TAG ? &big : NULL);
		printf("  %-11s %s%s\n", sys_names[k], sys[k].available ? "" : "UNAVAILABLE: ",
		       sys[k].why);
	}

	/* Miss: the first registration of a new allocation, each system its own fresh ones, the
	 * systems taking turns (the first to touch fresh memory would pay for the others). */
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
					errors[k]++;
				}
			}
		for (int k = 0; k < SYS_COUNT; k++) {
			for (int i = 0; sys[k].available && i < NM; i++) {
				if (r[k][i])
					sys_put(&sys[k], r[k][i]);
				sys_freed(&sys[k], fresh[k][i], BUF_SIZE);
				hc.cuMemFree(fresh[k][i]);
			}
			miss_us[k] = sys[k].available ? median(v[k], n[k]) : 0;
		}
		/* Against tagcheck, allocation by allocation: the systems took turns on each, so the
		 * machine's drift (the export alone varies by microseconds) cancels in the pairs. */
		for (int k = 0; k < SYS_COUNT; k++) {
			int m = 0;

			for (int i = 0; i < NM && sys[k].available && sys[SYS_TAGCHECK].available; i++)
				if (r[k][i] && r[SYS_TAGCHECK][i])
					d[k][m++] = t_miss[k][i] - t_miss[SYS_TAGCHECK][i];
			miss_paired[k] = m ? median(d[k], m) : 0;
			miss_paired_n[k] = m;
		}
	}
	miss_parts(64, &q_us, &q9_us, &s_us, &x_us);
	if (miss_only)
		goto miss_report;

	/* Warm every buffer into every cache, each registered whole (ucs_rcache pins what is asked:
	 * a whole registration makes every later sub-range of the buffer a hit there too). */
	for (int k = 0; k < SYS_COUNT; k++) {
		void *r;

		for (int i = 0; sys[k].available && i <= maxt; i++) {
			if (sys_get(&sys[k], bufs[i], HIT_LEN, &r) == 0)
				sys_put(&sys[k], r);
			else
				errors[k]++;
		}
		for (int i = 0; sys[k].available && i < NRAND; i++) {
			if (sys_get(&sys[k], rbuf[i], rsize[i], &r) == 0)
				sys_put(&sys[k], r);
			else
				errors[k]++;
		}
		for (int i = 0; sys[k].available && i < NMIXED; i++) {
			if (sys_get(&sys[k], mbuf[i], msize[i], &r) == 0)
				sys_put(&sys[k], r);
			else
				errors[k]++;
		}
	}

	/* The systems take turns, run by run (each first in turn), so that a machine whose speed
	 * drifts (a VM's does, by up to 2x for seconds at a time) slows them alike. */
	for (int pi = 0, nrun = quick ? 3 : 7; pi < NPAT; pi++) {
		const struct bset *set = pi ? &pat_set[pi] : NULL;
		uint64_t batches = quick ? 256 : 4096;
		double v[SYS_COUNT][7];

		for (int k = 0; k < SYS_COUNT; k++) /* warm */
			if (sys[k].available)
				latency_run(&sys[k], bufs[1], set, batches / 4, &errors[k]);
		for (int r = 0; r < nrun; r++)
			for (int q = 0; q < SYS_COUNT; q++) {
				int k = (q + r) % SYS_COUNT;

				if (sys[k].available)
					v[k][r] = latency_run(&sys[k], bufs[1], set, batches,
							      &errors[k]);
			}
		for (int k = 0; k < SYS_COUNT; k++) {
			if (!sys[k].available)
				continue;
			lat[k][pi] = median(v[k], nrun); /* sorts */
			lat_best[k][pi] = v[k][0];
			latency_dist(&sys[k], bufs[1], set, quick ? 20000 : 200000, &p50[k][pi],
				     &p99[k][pi], &errors[k]);
		}
	}
	printf("\nlatency, one thread, ns per registration + release of a cached range: mean of a "
	       "timed loop (median of %d runs, the systems taking turns; best), and p50 / p99 of %d "
	       "hits timed one by one:\n", quick ? 3 : 7, quick ? 20000 : 200000);
	printf("  %-11s", "system");
	for (int pi = 0; pi < NPAT; pi++)
		printf(" %26s", pat_name[pi]);
	printf("\n");
	for (int k = 0; k < SYS_COUNT; k++) {
		if (!sys[k].available)
			continue;
		printf("  %-11s", sys_names[k]);
		for (int pi = 0; pi < NPAT; pi++) {
			char cell[64];

			snprintf(cell, sizeof(cell), "%.1f (%.1f) %.0f/%.0f", lat[k][pi],
				 lat_best[k][pi], p50[k][pi], p99[k][pi]);
			printf(" %26s", cell);
			row("hit_latency", sys_names[k], NULL, 1, pat_name[pi], lat[k][pi], "ns");
			row("hit_latency_best", sys_names[k], NULL, 1, pat_name[pi], lat_best[k][pi],
			    "ns");
			row("hit_latency_p50", sys_names[k], NULL, 1, pat_name[pi], p50[k][pi], "ns");
			row("hit_latency_p99", sys_names[k], NULL, 1, pat_name[pi], p99[k][pi], "ns");
		}
		printf("\n");
	}
	printf("  (cell: mean (best) p50/p99; p50/p99 less the timer's %.0f cycles)\n",
	       timer_cycles);
	for (int fl = 0; fl < 2; fl++) {
		static const char *const fl_name[2] = { "floor", "floor-1line" };

		printf("  %-11s", fl_name[fl]);
		for (int pi = 0; pi < NPAT; pi++) {
			char cell[64] = "-";
			double f, fb = 0;

			if (pi >= 1 && pi <= 3) { /* the random sets of 1 MiB buffers */
				f = floor_ns(&pat_set[pi], quick ? 3 : 7, fl, &fb);
				snprintf(cell, sizeof(cell), "%.1f (%.1f)", f, fb);
				row("hit_latency_floor", fl_name[fl], NULL, 1, pat_name[pi], f, "ns");
			}
			printf(" %26s", cell);
		}
		printf("\n");
	}
	printf("  (floor: the least a lock-free hit does, on the same buffers and addresses: a "
	       "hash of the 2 MiB granule, the 64-byte record its slot names, a thread's count up "
	       "and down; floor-1line: the same with the records in the hash's slots, one random "
	       "line a hit)\n");
	printf("  harness alone (a random address made and its set read, no registration): "
	       "%.1f ns (rand4096)\n", harness_ns(&pat_set[3]));
	if (latency_only)
		return 0;
miss_report:
	printf("\nmiss, first registration of a new %llu MiB allocation (median of %d, the systems "
	       "taking turns on each, each first in turn):\n",
	       BUF_SIZE / MiB, NM);
	for (int k = 0; k < SYS_COUNT; k++)
		if (sys[k].available) {
			printf("  %-11s %8.1f us", sys_names[k], miss_us[k]);
			if (sys[SYS_TAGCHECK].available && k != SYS_TAGCHECK) {
				printf("   (%+.1f us against tagcheck; median of %d paired "
				       "differences %+.2f us)",
				       miss_us[k] - miss_us[SYS_TAGCHECK], miss_paired_n[k],
				       miss_paired[k]);
				row("miss_vs_tagcheck", sys_names[k], NULL, 1, "paired",
				    miss_paired[k], "us");
			}
			printf("\n");
			row("miss", sys_names[k], NULL, 1, "new", miss_us[k], "us");
		}
	printf("  its parts, timed alone on fresh allocations: query %.2f us, first SYNC_MEMOPS "
	       "%.2f us, dma-buf export %.2f us (sum %.2f us); libgdrcache's query of 9 "
	       "attributes %.2f us (%+.2f us)\n",
	       q_us, s_us, x_us, q_us + s_us + x_us, q9_us, q9_us - q_us);
	row("miss_part", "driver", NULL, 1, "query9", q9_us, "us");
	for (int k = 0; k < SYS_COUNT; k++)
		if (sys[k].available)
			printf("  %-11s own work (miss less the parts): %.2f us\n", sys_names[k],
			       miss_us[k] - (q_us + s_us + x_us));
	row("miss_part", "driver", NULL, 1, "query", q_us, "us");
	row("miss_part", "driver", NULL, 1, "sync_memops", s_us, "us");
	row("miss_part", "driver", NULL, 1, "dmabuf_export", x_us, "us");
	if (miss_only)
		return 0;

	/* Throughput: thread counts outermost, systems interleaved, repeated. */
	for (int ti = 0; ti < ncounts; ti++)
		for (int m = 0; m < 4; m++) {
			double v[SYS_COUNT][16];
			const struct bset *sets = m == 2 ? own_sets : m == 3 ? &shared_set : NULL;

			for (int rep = 0; rep < reps; rep++)
				for (int k = 0; k < SYS_COUNT; k++)
					if (sys[k].available)
						v[k][rep] = throughput(&sys[k], counts[ti], m & 1,
								       bufs, sets, secs, &errors[k]);
			for (int k = 0; k < SYS_COUNT; k++)
				tput[k][ti][m] = sys[k].available ? median(v[k], reps) : 0;
		}
	for (int m = 0; m < 4; m++) {
		static const char *const what[4] = {
			"own buffer per thread", "one buffer shared by all threads",
			"each thread a random one of its own 128 buffers, random 4 KiB page",
			"all threads a random one of 2048 shared buffers, random 4 KiB page" };

		printf("\nhit throughput, %s, aggregate M hits/s (ns per hit per thread):\n", what[m]);
		printf("  %-8s", "threads");
		for (int k = 0; k < SYS_COUNT; k++)
			if (sys[k].available)
				printf(" %24s", sys_names[k]);
		printf("\n");
		for (int ti = 0; ti < ncounts; ti++) {
			printf("  %-8d", counts[ti]);
			for (int k = 0; k < SYS_COUNT; k++) {
				double r = tput[k][ti][m];

				if (!sys[k].available)
					continue;
				printf(" %12.2f (%7.1f ns)", r / 1e6, r > 0 ? counts[ti] / r * 1e9 : 0);
				row("hit_throughput", sys_names[k], NULL, counts[ti], tp_name[m],
				    r / 1e6, "Mops");
			}
			printf("\n");
		}
	}

	/* Ratios the issues' goals are stated in. */
	printf("\nratios (same run):\n");
	for (int k = SYS_GDR_EVENTS; k <= SYS_GDR_TAG; k++) {
		int last = ncounts - 1;

		if (!sys[k].available) {
			printf("  %-11s unavailable: %s\n", sys_names[k], sys[k].why);
			continue;
		}
		printf("  %-11s 1-thread hit, same buffer %.1f ns (goal <= 15 ns); random of 128 / "
		       "1024 / 4096 %.1f / %.1f / %.1f ns, mixed sizes %.1f ns (goal <= 20 ns)\n",
		       sys_names[k], lat[k][0], lat[k][1], lat[k][2], lat[k][3], lat[k][4]);
		printf("  %-11s %d threads: own random %.1f M hits/s (goal >= 300), shared random "
		       "%.1f M hits/s: own / shared = %.2f (goal <= 1.5)\n", sys_names[k],
		       counts[last], tput[k][last][2] / 1e6, tput[k][last][3] / 1e6,
		       tput[k][last][3] > 0 ? tput[k][last][2] / tput[k][last][3] : 0);
		if (sys[SYS_TAGCHECK].available)
			for (int m = 0; m < 4; m++) {
				double b = tput[SYS_TAGCHECK][last][m];
				double q = b > 0 ? tput[k][last][m] / b : 0;

				printf("  %-11s %d threads, %s: %.1f x tagcheck\n", sys_names[k],
				       counts[last], tp_name[m], q);
				row("ratio_vs_tagcheck", sys_names[k], NULL, counts[last], tp_name[m], q,
				    "x");
			}
		if (sys[SYS_UCS].available) {
			for (int m = 0; m < 4; m++) {
				printf("  %-11s vs ucs-rcache, %-11s (threads:ratio):", sys_names[k],
				       tp_name[m]);
				for (int ti = 0; ti < ncounts; ti++) {
					double b = tput[SYS_UCS][ti][m];
					double q = b > 0 ? tput[k][ti][m] / b : 0;

					printf(" %d:%.2fx", counts[ti], q);
					row("ratio_vs_ucs", sys_names[k], NULL, counts[ti], tp_name[m], q,
					    "x");
				}
				printf("\n");
			}
			if (lat[SYS_UCS][0] > 0)
				printf("  %-11s 1-thread latency vs ucs-rcache: %.2f x faster (same), "
				       "%.2f x (rand1024)\n", sys_names[k], lat[SYS_UCS][0] / lat[k][0],
				       lat[SYS_UCS][2] / lat[k][2]);
		}
	}
	/* Issue 16 item 4: the preload's hit within 2 x the library's, scaling with threads. */
	if (sys[SYS_PRELOAD].available && sys[SYS_GDR_EVENTS].available) {
		int last = ncounts - 1;

		printf("  %-11s 1-thread hit over gdr-events':", "preload");
		for (int pi = 0; pi < NPAT; pi++)
			printf(" %s %.2f x%s", pat_name[pi], lat[SYS_PRELOAD][pi] / lat[SYS_GDR_EVENTS][pi],
			       pi + 1 < NPAT ? "," : " (goal <= 2)\n");
		printf("  %-11s %d threads: own random %.1f M hits/s (%.2f x gdr-events'), shared "
		       "random %.1f M hits/s (%.2f x)\n", "preload", counts[last],
		       tput[SYS_PRELOAD][last][2] / 1e6,
		       tput[SYS_PRELOAD][last][2] / tput[SYS_GDR_EVENTS][last][2],
		       tput[SYS_PRELOAD][last][3] / 1e6,
		       tput[SYS_PRELOAD][last][3] / tput[SYS_GDR_EVENTS][last][3]);
	}
	for (int k = 0; k < SYS_COUNT; k++) {
		char d[512];

		if (!sys[k].available)
			continue;
		sys_describe(&sys[k], d, sizeof(d));
		printf("  %-11s after the hit runs: %s; failed registrations %" PRIu64 "\n",
		       sys_names[k], d, errors[k]);
		sys_close(&sys[k]);
	}
	for (int i = 0; i <= maxt; i++)
		hc.cuMemFree(bufs[i]);
	for (int i = 0; i < NRAND; i++)
		hc.cuMemFree(rbuf[i]);
	for (int i = 0; i < NMIXED; i++)
		hc.cuMemFree(mbuf[i]);

	/* Traces: the same operations for every system, each on a fresh cache. */
traces:
	if (!no_traces) {
		struct trace tr[5];

		memset(tr, 0, sizeof(tr));
		rng_state = 0x9e3779b97f4a7c15ULL;
		gen_alloc_loop(&tr[0], quick ? 40 : 300);
		rng_state = 0x2545f4914f6cdd1dULL;
		gen_halo(&tr[1], quick ? 20 : 200);
		rng_state = 0x5851f42d4c957f2dULL;
		gen_churn(&tr[2], quick ? 1000 : 12000);
		rng_state = 0x1f83d9abfb41bd6bULL;
		gen_size_mix(&tr[3], quick ? 2000 : 12000);
		rng_state = 0x5be0cd19137e2179ULL;
		gen_pytorch(&tr[4], quick ? 30 : 120);
		for (int i = 0; i < 5; i++) {
			if (tr[i].lim.max_bytes)
				printf("\ntrace %s: %s; cache limit %" PRIu64 " MiB, %" PRIu64
				       " entries\n", tr[i].name, tr[i].what,
				       (uint64_t)(tr[i].lim.max_bytes / MiB), tr[i].lim.max_entries);
			else
				printf("\ntrace %s: %s; libgdrcache's default limits (its info line "
				       "says what they resolve to), the others unbounded\n", tr[i].name,
				       tr[i].what);
			printf("  %-11s %9s %8s %9s %8s %6s %6s %8s %10s %9s\n", "system", "requests",
			       "misses", "hit rate", "us/req", "stale", "short", "failed",
			       "same-VA", "peak MiB");
			for (int k = 0; k < SYS_COUNT; k++) {
				struct trace_result r;

				if (left_out(only, sys_names[k]))
					continue;
				if (k == SYS_PRELOAD) /* hit_preload.c: gdr-events' cache */
					continue;
				if (run_trace(&tr[i], (enum sys_kind)k, &r)) {
					printf("  %-11s unavailable: %s\n", sys_names[k], r.stats);
					continue;
				}
				printf("  %-11s %9" PRIu64 " %8" PRIu64 " %8.2f%% %8.2f %6" PRIu64
				       " %6" PRIu64 " %8" PRIu64 " %10" PRIu64 " %9" PRIu64 "\n",
				       sys_names[k], r.requests, r.misses,
				       r.requests ? 100.0 * (1.0 - (double)r.misses / r.requests) : 0,
				       r.us_per_req, r.wrong, r.not_covered, r.failed,
				       r.reallocs_same_va, r.peak_pinned >> 20);
				row("trace_peak_pinned", sys_names[k], tr[i].name, 1, "",
				    (double)(r.peak_pinned >> 20), "MiB");
				printf("  %-11s   %s\n", "", r.stats);
				row("trace_hit_rate", sys_names[k], tr[i].name, 1, "",
				    r.requests ? 1.0 - (double)r.misses / r.requests : 0, "fraction");
				row("trace_requests", sys_names[k], tr[i].name, 1, "", r.requests, "count");
				row("trace_misses", sys_names[k], tr[i].name, 1, "", r.misses, "count");
				row("trace_us_per_request", sys_names[k], tr[i].name, 1, "", r.us_per_req,
				    "us");
				row("trace_stale_handed_out", sys_names[k], tr[i].name, 1, "", r.wrong,
				    "count");
				row("trace_not_covered", sys_names[k], tr[i].name, 1, "", r.not_covered,
				    "count");
				row("trace_failed", sys_names[k], tr[i].name, 1, "", r.failed, "count");
				row("trace_realloc_same_va", sys_names[k], tr[i].name, 1, "",
				    r.reallocs_same_va, "count");
			}
			free(tr[i].ops);
		}
		printf("\n(stale: registrations whose BUFFER_ID is not the address's current one, "
		       "checked outside the timed call; short: range not covering the request; "
		       "same-VA: allocations that came back at a VA registered before its free; "
		       "peak MiB: bytes pinned at most, against the limit)\n");
	}
	if (csv)
		fclose(csv);
	return 0;
}
