/* SPDX-License-Identifier: MIT */
/*
 * The preload's hit against the library's, in one process (issue 16 item 4). Run with
 * LD_PRELOAD=libgdrcache-preload.so and LD_LIBRARY_PATH at the fake libibverbs (tests/preload:
 * the GPU machines have no NIC), on the real CUDA driver: bench/run-gpu.sh preload.
 *   preload   ibv_reg_mr + ibv_dereg_mr of a cached GPU buffer: the preload's interposers, its
 *             shadow MR, the cache's hit (GDR_REG_CACHED_ONLY: no driver call in mode events)
 *   library   gdr_reg + gdr_dereg of the same buffers, with the same PD, on a cache of its own
 * Each thread cycles over its own 64 buffers (a random 4 KiB offset; "rand64"), or registers the
 * start of its first again and again ("same": the library's hit is then its memo's), after a
 * warm-up that makes every one a hit in both; 1, 4 and 16 threads (or those named after the
 * count), thread i pinned to CPU i. The two paths take turns on each thread, in ROUNDS bursts
 * each (which goes first alternates), so that a machine whose speed drifts between runs (a VM's:
 * one-thread figures of one binary spread 45-131 ns over separate runs) slows both alike: per
 * path, the median ns per reg+dereg over the bursts of every thread, and hits per second in all;
 * and the median, over bursts, of the preload's burst over the library's burst next to it.
 * Figures, not verdicts: not a test.
 * Usage: bench_preload [ITERS [THREADS...]]   (reg+dereg a thread per path; THREADS at most
 * MAX_THREADS each)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdrcache.h"
#include "hit_cuda.h"
#include "machine.h"

#define NBUF 64
#define BUFSZ (1 << 20)
#define MAX_THREADS 64
#define ROUNDS 40

static struct ibv_pd *pd;
static struct gdr_cache *lib;
static int iters = 2000000;
static int same; /* the pattern: the same buffer and offset every time, else rand64 */

struct targ {
	int id;
	hc_ptr buf[NBUF];
	double ns[2][ROUNDS]; /* per burst: [0] preload, [1] library */
	int fails;            /* written once, at the end: no line another thread reads */
} __attribute__((aligned(64)));

static double now(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int one(struct targ *a, int mode, unsigned k, unsigned off)
{
	void *p = (void *)(uintptr_t)(a->buf[k] + off);

	if (mode == 0) {
		struct ibv_mr *mr = ibv_reg_mr(pd, p, 4096, IBV_ACCESS_LOCAL_WRITE);

		return mr ? ibv_dereg_mr(mr) : -1;
	} else {
		struct gdr_region *r;

		if (gdr_reg(lib, pd, p, 4096, IBV_ACCESS_LOCAL_WRITE, &r))
			return -1;
		return gdr_dereg(r);
	}
}

static void *run(void *arg)
{
	struct targ *a = arg;
	unsigned seed = 12345 + a->id, burst = (unsigned)(iters / ROUNDS);
	int fails = 0;
	cpu_set_t cpus;

	CPU_ZERO(&cpus); /* pinned, as bench_hit's threads are: thread i on CPU i */
	CPU_SET(a->id % CPU_SETSIZE, &cpus);
	pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus);
	hc_thread();
	for (int mode = 0; mode < 2; mode++)
		for (unsigned k = 0; k < NBUF; k++)
			fails += one(a, mode, k, 0) != 0; /* warm-up: each a miss once */
	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < 2; i++) {
			int mode = (r + i) & 1;
			double t0 = now(CLOCK_MONOTONIC);

			if (same)
				for (unsigned j = 0; j < burst; j++)
					fails += one(a, mode, 0, 0) != 0;
			else
				for (unsigned j = 0; j < burst; j++)
					fails += one(a, mode, rand_r(&seed) % NBUF,
						     (rand_r(&seed) % (BUFSZ / 4096)) * 4096) != 0;
			a->ns[mode][r] = (now(CLOCK_MONOTONIC) - t0) / burst;
		}
	}
	a->fails = fails;
	return NULL;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return (a > b) - (a < b);
}

/* The q-quantile of v[0..n) (sorted in place). */
static double quantile(double *v, int n, double q)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[(int)(q * (n - 1) + 0.5)];
}

int main(int argc, char **argv)
{
	static struct targ args[MAX_THREADS];
	int threads[16] = { 1, 4, 16 };
	unsigned nthreads = 3;
	struct ibv_device **l;
	struct ibv_context *ctx;
	char why[256], cpu[128];
	struct gdr_cache_attr attr = { .field_mask = GDR_CACHE_ATTR_BACKEND,
				       .backend = GDR_BACKEND_DMABUF };
	Dl_info info = { 0 };

	if (argc > 1)
		iters = atoi(argv[1]) < ROUNDS ? ROUNDS : atoi(argv[1]);
	if (argc > 2) {
		for (nthreads = 0; nthreads + 2 < (unsigned)argc && nthreads < 16; nthreads++) {
			threads[nthreads] = atoi(argv[nthreads + 2]);
			if (threads[nthreads] < 1 || threads[nthreads] > MAX_THREADS) {
				printf("bench_preload: threads must be 1 to %d\n", MAX_THREADS);
				return 2;
			}
		}
	}
	if (hc_load(why, sizeof(why))) {
		printf("bench_preload: %s\n", why);
		return 77;
	}
	l = ibv_get_device_list(NULL);
	ctx = l && l[0] ? ibv_open_device(l[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd || !dlsym(RTLD_DEFAULT, "fake_ibv_count")) {
		printf("bench_preload: needs the fake libibverbs (LD_LIBRARY_PATH)\n");
		return 77;
	}
	dladdr((void *)&ibv_reg_mr, &info);
	if (!info.dli_fname || !strstr(info.dli_fname, "libgdrcache-preload")) {
		printf("bench_preload: needs LD_PRELOAD=libgdrcache-preload.so\n");
		return 77;
	}
	if (gdr_cache_create(&attr, &lib)) {
		printf("bench_preload: gdr_cache_create failed\n");
		return 1;
	}
	bench_cpu_model(cpu, sizeof(cpu));
	printf("# bench_preload: %s, CUDA %d, driver %s; CPU %s; %d reg+dereg a thread, random of %d "
	       "1 MiB buffers of its own, random 4 KiB offset, every one a hit\n", hc.gpu,
	       hc.cuda_version, hc.driver, cpu, iters, NBUF);
	printf("# %d bursts of %d a path and thread, the paths taking turns\n", ROUNDS, iters / ROUNDS);
	printf("%-8s %-7s %8s %14s %16s %8s\n", "path", "pattern", "threads", "ns/reg+dereg",
	       "M hits/s (all)", "fails");
	for (unsigned pt = 0; pt < 2 * nthreads; pt++) {
		unsigned ti = pt % nthreads;
		const char *pat = (same = pt >= nthreads) ? "same" : "rand64";
		static double v[2][MAX_THREADS * ROUNDS], ratio[MAX_THREADS * ROUNDS];
		pthread_t th[MAX_THREADS];
		int n = threads[ti], fails = 0, m = n * ROUNDS;

		for (int i = 0; i < n; i++) {
			args[i].id = i;
			args[i].fails = 0;
			if (!args[i].buf[0])
				for (int k = 0; k < NBUF; k++)
					hc.cuMemAlloc(&args[i].buf[k], BUFSZ);
			pthread_create(&th[i], NULL, run, &args[i]);
		}
		for (int i = 0; i < n; i++) {
			pthread_join(th[i], NULL);
			fails += args[i].fails;
			for (int r = 0; r < ROUNDS; r++) {
				v[0][i * ROUNDS + r] = args[i].ns[0][r];
				v[1][i * ROUNDS + r] = args[i].ns[1][r];
				ratio[i * ROUNDS + r] = args[i].ns[0][r] / args[i].ns[1][r];
			}
		}
		for (int mode = 0; mode < 2; mode++) {
			double med = quantile(v[mode], m, 0.5);

			printf("%-8s %-7s %8d %14.1f %16.1f %8d\n", mode ? "library" : "preload", pat,
			       n, med, n * 1e3 / med, fails);
		}
		printf("%-8s %-7s %8d %14.2f   (p10 %.2f, p90 %.2f: the preload's burst over the "
		       "library's beside it)\n", "ratio", pat, n, quantile(ratio, m, 0.5),
		       quantile(ratio, m, 0.1), quantile(ratio, m, 0.9));
	}
	{
		struct gdr_cache_stats s;

		gdr_cache_get_stats(lib, &s);
		printf("# library cache: validation %s, %llu hits (%llu lock-free), %llu misses\n",
		       s.validate_mode == GDR_VALIDATE_EVENTS ? "events" : "tag",
		       (unsigned long long)s.hits, (unsigned long long)s.fast_hits,
		       (unsigned long long)s.misses);
	}
	return 0;
}
