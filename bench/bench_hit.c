/* SPDX-License-Identifier: MIT */
/*
 * Cache hits side by side, in one run, on the machine it runs on (it names it): libgdrcache in
 * events mode and in tag mode, the "check BUFFER_ID on every hit" baseline and UCX's ucs_rcache,
 * all pinning through the same callbacks (hit_sys.h).
 *
 *   latency     one thread: ns per registration + release of a cached 4 KiB range
 *   throughput  1, 2, 4, 8, 16 threads, aggregate hits per second, each thread on its own buffer
 *               ("own") and all threads on one buffer ("shared"); median of --reps runs
 *   miss        first registration of a new 1 MiB allocation (query, SYNC_MEMOPS, dma-buf export)
 *   traces      hit rate (registrations that did not pin) and stale registrations handed out
 *               (checked against the driver's BUFFER_ID, outside the timed call) on:
 *               alloc-loop  a caching allocator's training loop: blocks reused, released by
 *                           empty_cache every 20 steps, allocated again at the same VA
 *               halo        an MPI halo exchange: 4 fields x 26 neighbours, send and receive,
 *                           separate buffers and packed ones registered by offset; buffers
 *                           reallocated every 50 iterations (mesh adaptation)
 *               churn       random sizes and sub-ranges, skewed, frees and new allocations; the
 *                           live set is about 4 times the cache limit
 *
 * Usage: bench_hit [--threads N] [--seconds S] [--reps R] [--csv FILE] [--quick]
 * Needs a GPU (exits 77 without one). $GDRCACHE_LIBCUDA selects another libcuda (the fake driver
 * of the tests: figures then are a SIMULATION, not measurements). Includes only the public header.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- timed hit loops ---------------------------------------------------------------------- */

struct worker {
	pthread_t t;
	struct sys *s;
	uint64_t addr;
	int cpu;
	uint64_t ops, errors;
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

/* Runs hits on w->addr until stop (limit 0) or for limit batches. */
static void hit_run(struct worker *w, uint64_t limit)
{
	void *p = w->s->p;
	uint64_t addr = w->addr, ops = 0, errors = 0;
	int timed = limit == 0;
#define MORE (timed ? !atomic_load_explicit(&stop, memory_order_relaxed) : ops < limit * BATCH)

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

/* Aggregate hits/s of nthreads threads, each on bufs[i] or all on bufs[0]. */
static double throughput(struct sys *s, int nthreads, int shared, const uint64_t *bufs,
			 double seconds, uint64_t *errors)
{
	struct worker w[MAX_THREADS];
	uint64_t total = 0;
	double t0, t1;

	atomic_store(&go, 0);
	atomic_store(&stop, 0);
	for (int i = 0; i < nthreads; i++) {
		w[i] = (struct worker){ .s = s, .addr = shared ? bufs[0] : bufs[i + 1],
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

/* ns per hit (get + put) on the calling thread: median of reps runs of n hits. */
static double latency(struct sys *s, uint64_t addr, int reps, uint64_t batches, double *best,
		      uint64_t *errors)
{
	double v[32];
	struct worker w = { .s = s, .addr = addr };

	if (reps > 32)
		reps = 32;
	hit_run(&w, batches / 4); /* warm */
	for (int r = 0; r < reps; r++) {
		double t0 = now();

		hit_run(&w, batches);
		v[r] = (now() - t0) / (double)w.ops * 1e9;
		*errors += w.errors;
	}
	for (int i = 1; i < reps; i++) /* sort */
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double x = v[j];

			v[j] = v[j - 1];
			v[j - 1] = x;
		}
	*best = v[0];
	return v[reps / 2];
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

struct trace_result {
	uint64_t requests, misses, wrong, not_covered, failed, reallocs_same_va, frees;
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
			"[--quick]\n");
	exit(2);
}

#ifdef BENCH_AS_LIBRARY
/* libbench_hit_mw.so: the benchmark inside a shared library that links libgdrcache, as middleware
 * carries it (bench_hit_load.c starts it, linked or dlopen'ed). */
#define main bench_hit_main
__attribute__((visibility("default"))) int bench_hit_main(int argc, char **argv);
#endif

int main(int argc, char **argv)
{
	int maxt = 16, reps = 3, quick = 0, counts[8], ncounts = 0;
	double secs = 0.25;
	const char *csv_path = NULL;
	char why[256];
	uint64_t bufs[MAX_THREADS + 1];
	struct sys sys[SYS_COUNT];
	/* [system][threads index][own/shared] */
	double tput[SYS_COUNT][8][2], lat[SYS_COUNT], lat_best[SYS_COUNT], miss_us[SYS_COUNT];
	uint64_t errors[SYS_COUNT] = { 0 };

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
	printf("# registrations of %llu KiB at the start of %llu MiB buffers; %.2f s per point, "
	       "median of %d; threads pinned to CPUs 0..n-1\n",
	       HIT_LEN / KiB, BUF_SIZE / MiB, secs, reps);

	for (int i = 0; i <= maxt; i++)
		if (hc.cuMemAlloc(&bufs[i], BUF_SIZE)) {
			printf("bench_hit: cuMemAlloc failed\n");
			return 1;
		}
	printf("\nsystems:\n");
	for (int k = 0; k < SYS_COUNT; k++) {
		sys_open(&sys[k], (enum sys_kind)k, NULL);
		printf("  %-11s %s%s\n", sys_names[k], sys[k].available ? "" : "UNAVAILABLE: ",
		       sys[k].why);
	}

	/* Miss: the first registration of a new allocation (each system its own fresh ones). */
	for (int k = 0; k < SYS_COUNT; k++) {
		enum { NM = 64 };
		double v[NM];
		uint64_t fresh[NM];
		void *r[NM];
		int n = 0;

		miss_us[k] = 0;
		if (!sys[k].available)
			continue;
		for (int i = 0; i < NM; i++)
			hc.cuMemAlloc(&fresh[i], BUF_SIZE);
		for (int i = 0; i < NM; i++) {
			double t0 = now();

			if (sys_get(&sys[k], fresh[i], HIT_LEN, &r[i]) == 0) {
				v[n++] = (now() - t0) * 1e6;
			} else {
				r[i] = NULL;
				errors[k]++;
			}
		}
		for (int i = 0; i < NM; i++) {
			if (r[i])
				sys_put(&sys[k], r[i]);
			sys_freed(&sys[k], fresh[i], BUF_SIZE);
			hc.cuMemFree(fresh[i]);
		}
		miss_us[k] = median(v, n);
	}

	/* Warm every buffer into every cache. */
	for (int k = 0; k < SYS_COUNT; k++)
		for (int i = 0; sys[k].available && i <= maxt; i++) {
			void *r;

			if (sys_get(&sys[k], bufs[i], HIT_LEN, &r) == 0)
				sys_put(&sys[k], r);
			else
				errors[k]++;
		}

	printf("\nlatency, one thread (ns per registration + release of a cached range; median, "
	       "best of %d):\n", quick ? 3 : 7);
	for (int k = 0; k < SYS_COUNT; k++) {
		if (!sys[k].available)
			continue;
		lat[k] = latency(&sys[k], bufs[1], quick ? 3 : 7, quick ? 256 : 4096, &lat_best[k],
				 &errors[k]);
		printf("  %-11s %8.1f ns   (best %.1f)\n", sys_names[k], lat[k], lat_best[k]);
		row("hit_latency", sys_names[k], NULL, 1, "own", lat[k], "ns");
		row("hit_latency_best", sys_names[k], NULL, 1, "own", lat_best[k], "ns");
	}
	printf("\nmiss, first registration of a new %llu MiB allocation (median of 64):\n",
	       BUF_SIZE / MiB);
	for (int k = 0; k < SYS_COUNT; k++)
		if (sys[k].available) {
			printf("  %-11s %8.1f us\n", sys_names[k], miss_us[k]);
			row("miss", sys_names[k], NULL, 1, "new", miss_us[k], "us");
		}

	/* Throughput: thread counts outermost, systems interleaved, repeated. */
	for (int ti = 0; ti < ncounts; ti++)
		for (int sh = 0; sh < 2; sh++) {
			double v[SYS_COUNT][16];

			for (int rep = 0; rep < reps; rep++)
				for (int k = 0; k < SYS_COUNT; k++)
					if (sys[k].available)
						v[k][rep] = throughput(&sys[k], counts[ti], sh, bufs,
								       secs, &errors[k]);
			for (int k = 0; k < SYS_COUNT; k++)
				tput[k][ti][sh] = sys[k].available ? median(v[k], reps) : 0;
		}
	for (int sh = 0; sh < 2; sh++) {
		printf("\nhit throughput, %s, aggregate M hits/s (ns per hit per thread):\n",
		       sh ? "one buffer shared by all threads" : "own buffer per thread");
		printf("  %-8s", "threads");
		for (int k = 0; k < SYS_COUNT; k++)
			if (sys[k].available)
				printf(" %24s", sys_names[k]);
		printf("\n");
		for (int ti = 0; ti < ncounts; ti++) {
			printf("  %-8d", counts[ti]);
			for (int k = 0; k < SYS_COUNT; k++) {
				double r = tput[k][ti][sh];

				if (!sys[k].available)
					continue;
				printf(" %12.2f (%7.1f ns)", r / 1e6, r > 0 ? counts[ti] / r * 1e9 : 0);
				row("hit_throughput", sys_names[k], NULL, counts[ti],
				    sh ? "shared" : "own", r / 1e6, "Mops");
			}
			printf("\n");
		}
	}

	/* Ratios the goals are stated in. */
	printf("\nratios (same run):\n");
	for (int k = SYS_GDR_EVENTS; k <= SYS_GDR_TAG; k++) {
		int last = ncounts - 1;

		if (!sys[k].available) {
			printf("  %-11s unavailable: %s\n", sys_names[k], sys[k].why);
			continue;
		}
		printf("  %-11s 1-thread hit %.1f ns (goal <= 25 ns)\n", sys_names[k], lat[k]);
		if (sys[SYS_TAGCHECK].available)
			for (int sh = 0; sh < 2; sh++) {
				double b = tput[SYS_TAGCHECK][last][sh];
				double q = b > 0 ? tput[k][last][sh] / b : 0;

				printf("  %-11s %d threads, %s: %.1f x tagcheck (goal >= %d x)\n",
				       sys_names[k], counts[last], sh ? "shared buffer" : "own buffers",
				       q, sh ? 10 : 50);
				row("ratio_vs_tagcheck", sys_names[k], NULL, counts[last],
				    sh ? "shared" : "own", q, "x");
			}
		if (sys[SYS_UCS].available) {
			for (int sh = 0; sh < 2; sh++) {
				printf("  %-11s vs ucs-rcache, %-6s (threads:ratio):", sys_names[k],
				       sh ? "shared" : "own");
				for (int ti = 0; ti < ncounts; ti++) {
					double b = tput[SYS_UCS][ti][sh];
					double q = b > 0 ? tput[k][ti][sh] / b : 0;

					printf(" %d:%.2fx", counts[ti], q);
					row("ratio_vs_ucs", sys_names[k], NULL, counts[ti],
					    sh ? "shared" : "own", q, "x");
				}
				printf("  (goal > 1 x at every count)\n");
			}
			if (lat[SYS_UCS] > 0)
				printf("  %-11s 1-thread latency vs ucs-rcache: %.2f x faster\n",
				       sys_names[k], lat[SYS_UCS] / lat[k]);
		}
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

	/* Traces: the same operations for every system, each on a fresh cache. */
	{
		struct trace tr[3];

		memset(tr, 0, sizeof(tr));
		rng_state = 0x9e3779b97f4a7c15ULL;
		gen_alloc_loop(&tr[0], quick ? 40 : 300);
		rng_state = 0x2545f4914f6cdd1dULL;
		gen_halo(&tr[1], quick ? 20 : 200);
		rng_state = 0x5851f42d4c957f2dULL;
		gen_churn(&tr[2], quick ? 1000 : 12000);
		for (int i = 0; i < 3; i++) {
			printf("\ntrace %s: %s; cache limit %" PRIu64 " MiB, %" PRIu64 " entries\n",
			       tr[i].name, tr[i].what, (uint64_t)(tr[i].lim.max_bytes / MiB),
			       tr[i].lim.max_entries);
			printf("  %-11s %9s %8s %9s %8s %6s %6s %8s %10s\n", "system", "requests",
			       "misses", "hit rate", "us/req", "stale", "short", "failed",
			       "same-VA");
			for (int k = 0; k < SYS_COUNT; k++) {
				struct trace_result r;

				if (run_trace(&tr[i], (enum sys_kind)k, &r)) {
					printf("  %-11s unavailable: %s\n", sys_names[k], r.stats);
					continue;
				}
				printf("  %-11s %9" PRIu64 " %8" PRIu64 " %8.2f%% %8.2f %6" PRIu64
				       " %6" PRIu64 " %8" PRIu64 " %10" PRIu64 "\n",
				       sys_names[k], r.requests, r.misses,
				       r.requests ? 100.0 * (1.0 - (double)r.misses / r.requests) : 0,
				       r.us_per_req, r.wrong, r.not_covered, r.failed,
				       r.reallocs_same_va);
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
		       "same-VA: allocations that came back at a VA registered before its free)\n");
	}
	if (csv)
		fclose(csv);
	return 0;
}
