/* SPDX-License-Identifier: MIT */
/*
 * Registration cost with and without libgdrcache, on the machine it runs on (it names it).
 *
 *   hit      gdr_reg + gdr_dereg of a cached buffer, 1..N threads, each on its own buffer and all on
 *            one shared buffer; aggregate operations per second
 *   miss     gdr_reg of a buffer not in the cache (classification, SYNC_MEMOPS, pin), timed alone
 *   baselines, in the same run:
 *     pin-every-time   cuMemGetHandleForAddressRange(DMA_BUF_FD) + close for every registration:
 *                      what a program without a cache pays per message on the dma-buf path
 *                      (before the NIC registration, which is not measured: no NIC here)
 *     tag check alone  one cuPointerGetAttribute(BUFFER_ID): the floor of a tag-validated hit
 *
 * Usage: bench_reg [max_threads] [seconds per point]. Needs a GPU; exits 77 without one.
 * Includes only the public header; the CUDA driver is reached with dlopen.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gdrcache.h>

#include "machine.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDeviceGetName)(char *, int, int);
static CUresult (*cuDriverGetVersion)(int *);
static CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*cuCtxSetCurrent)(void *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
static CUresult (*cuMemGetHandleForAddressRange)(void *, CUdeviceptr, size_t, int,
						 unsigned long long);
static void *ctx;

#define BUF_SIZE (1ULL << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int load_cuda(char *gpu, int len, int *driver)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	int dev;

	if (!h)
		return -1;
#define SYM(n, s) (*(void **)&n = dlsym(h, s))
	if (!SYM(cuInit, "cuInit") || !SYM(cuDeviceGet, "cuDeviceGet") ||
	    !SYM(cuDeviceGetName, "cuDeviceGetName") ||
	    !SYM(cuDriverGetVersion, "cuDriverGetVersion") ||
	    !SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
	    !SYM(cuCtxSetCurrent, "cuCtxSetCurrent") || !SYM(cuMemAlloc, "cuMemAlloc_v2") ||
	    !SYM(cuMemFree, "cuMemFree_v2") || !SYM(cuPointerGetAttribute, "cuPointerGetAttribute") ||
	    !SYM(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange"))
		return -1;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
	    cuCtxSetCurrent(ctx))
		return -1;
	cuDeviceGetName(gpu, len, dev);
	cuDriverGetVersion(driver);
	return 0;
}

static void machine(char *out, size_t len)
{
	char host[64] = "?", cpu[128];

	gethostname(host, sizeof(host));
	bench_cpu_model(cpu, sizeof(cpu));
	snprintf(out, len, "%s, %s, %ld CPUs", host, cpu, sysconf(_SC_NPROCESSORS_ONLN));
}

enum mode { HIT_OWN, HIT_SHARED, TAG_ONLY, PIN_EVERY_TIME };

struct worker {
	pthread_t t;
	enum mode mode;
	struct gdr_cache *cache;
	CUdeviceptr buf;
	uint64_t ops;
};

static atomic_int go, stop;

static void *run(void *arg)
{
	struct worker *w = arg;
	uint64_t ops = 0;

	cuCtxSetCurrent(ctx);
	while (!atomic_load_explicit(&go, memory_order_acquire))
		;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		for (int i = 0; i < 64; i++) {
			if (w->mode == HIT_OWN || w->mode == HIT_SHARED) {
				struct gdr_region *r;

				if (gdr_reg(w->cache, NULL, (void *)w->buf, 4096, 0, &r) == 0)
					gdr_dereg(r);
			} else if (w->mode == TAG_ONLY) {
				unsigned long long id;

				cuPointerGetAttribute(&id, 7 /* BUFFER_ID */, w->buf);
			} else {
				int fd = -1;

				if (!cuMemGetHandleForAddressRange(&fd, w->buf, BUF_SIZE, 1, 0))
					close(fd);
			}
		}
		ops += 64;
	}
	w->ops = ops;
	return NULL;
}

static double measure(struct gdr_cache *c, enum mode mode, int nthreads, CUdeviceptr *bufs,
		      double seconds)
{
	struct worker w[64];
	uint64_t total = 0;
	double t0, t1;

	atomic_store(&go, 0);
	atomic_store(&stop, 0);
	for (int i = 0; i < nthreads; i++) {
		w[i] = (struct worker){ .mode = mode, .cache = c,
					.buf = mode == HIT_SHARED ? bufs[0] : bufs[i] };
		pthread_create(&w[i].t, NULL, run, &w[i]);
	}
	t0 = now();
	atomic_store_explicit(&go, 1, memory_order_release);
	usleep((useconds_t)(seconds * 1e6));
	atomic_store(&stop, 1);
	for (int i = 0; i < nthreads; i++) {
		pthread_join(w[i].t, NULL);
		total += w[i].ops;
	}
	t1 = now();
	return (double)total / (t1 - t0);
}

int main(int argc, char **argv)
{
	int maxt = argc > 1 ? atoi(argv[1]) : 16, driver = 0;
	double secs = argc > 2 ? atof(argv[2]) : 0.5;
	char gpu[128] = "?", mach[256];
	CUdeviceptr bufs[64];
	struct gdr_cache *c;
	enum gdr_backend be;
	static const char *const names[] = { "auto", "kmod", "dmabuf", "peermem" };

	if (maxt < 1 || maxt > 64)
		maxt = 16;
	if (load_cuda(gpu, sizeof(gpu), &driver)) {
		printf("bench_reg: no usable CUDA driver / GPU here: nothing to measure\n");
		return 77;
	}
	machine(mach, sizeof(mach));
	for (int i = 0; i < maxt; i++)
		cuMemAlloc(&bufs[i], BUF_SIZE);
	if (gdr_cache_create(NULL, &c)) {
		printf("bench_reg: gdr_cache_create failed\n");
		return 1;
	}
	gdr_cache_backend(c, &be);
	printf("# bench_reg: libgdrcache %#x, backend %s, validation by BUFFER_ID tag on every hit\n",
	       gdr_cache_version(), names[be]);
	printf("# machine: %s; GPU 0: %s; CUDA driver %d\n", mach, gpu, driver);
	printf("# %.2f s per point; buffers of %llu KiB, registrations of 4 KiB\n", secs,
	       BUF_SIZE >> 10);

	/* Miss path: classification, SYNC_MEMOPS (first time only), export. */
	{
		const int n = 200;
		double tmiss = 0, tfirst;
		struct gdr_region *r;
		CUdeviceptr fresh;
		double t0;

		cuMemAlloc(&fresh, BUF_SIZE);
		t0 = now();
		gdr_reg(c, NULL, (void *)fresh, 4096, 0, &r);
		tfirst = now() - t0;
		gdr_dereg(r);
		for (int i = 0; i < n; i++) {
			gdr_cache_flush(c);
			t0 = now();
			gdr_reg(c, NULL, (void *)fresh, 4096, 0, &r);
			tmiss += now() - t0;
			gdr_dereg(r);
		}
		cuMemFree(fresh);
		printf("\nmiss (first registration of an allocation, SYNC_MEMOPS included): %8.1f us\n",
		       tfirst * 1e6);
		printf("miss (allocation seen before: query + dma-buf export):             %8.1f us\n",
		       tmiss / n * 1e6);
	}
	for (int i = 0; i < maxt; i++) { /* warm: every buffer cached */
		struct gdr_region *r;

		gdr_reg(c, NULL, (void *)bufs[i], 4096, 0, &r);
		gdr_dereg(r);
	}

	printf("\n%-8s %22s %22s %22s %22s\n", "threads", "hit, own buffer", "hit, shared buffer",
	       "tag check alone", "pin every time");
	printf("%-8s %22s %22s %22s %22s\n", "", "Mops/s (ns/op/thread)", "Mops/s (ns/op/thread)",
	       "Mops/s (ns/op/thread)", "Mops/s (ns/op/thread)");
	for (int t = 1; t <= maxt; t *= 2) {
		enum mode modes[4] = { HIT_OWN, HIT_SHARED, TAG_ONLY, PIN_EVERY_TIME };

		printf("%-8d", t);
		for (int m = 0; m < 4; m++) {
			double r = measure(c, modes[m], t, bufs, secs);

			printf(" %10.3f (%8.0f ns)", r / 1e6, t / r * 1e9);
		}
		printf("\n");
	}
	{
		struct gdr_cache_stats s;

		gdr_cache_get_stats(c, &s);
		printf("\n# cache stats: hits %" PRIu64 " misses %" PRIu64 " stale %" PRIu64
		       " pins %" PRIu64 " tag_checks %" PRIu64 "\n",
		       s.hits, s.misses, s.stale, s.pins, s.tag_checks);
	}
	gdr_cache_destroy(c);
	for (int i = 0; i < maxt; i++)
		cuMemFree(bufs[i]);
	return 0;
}
