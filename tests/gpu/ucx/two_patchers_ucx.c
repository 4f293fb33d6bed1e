/* SPDX-License-Identifier: MIT */
/*
 * Two patchers of libcuda's free entry points in one process: real UCX UCM (its CUDA module,
 * UCX_MEM_CUDA_HOOK_MODE=bistro) and libgdrcache. Reports facts, asserts nothing.
 *
 *   two_patchers_ucx ucm-first|gdr-first|ucm-only|gdr-only [N]
 *
 * ucm-first: ucm_set_event_handler(MEM_TYPE_FREE|MEM_TYPE_ALLOC) (UCM loads libucm_cuda.so, which
 *            loads libcuda and bistro-patches cuMemFree_v2 & co.), then gdr_mem_events_state and a
 *            GDR_MONITOR_ALL monitor (libgdrcache patches the same entries).
 * gdr-first: the same two steps in the other order.
 * Then N cuMemAlloc_v2/cuMemFree_v2 (driver API, dlsym'd) and N cudaMalloc/cudaFree (libcudart,
 * dlopen'd), counting the free/alloc events each side delivered. Lines starting with "RESULT" and
 * "STEP" are for run.sh's table. Exit 0 when the loops ran (whatever the counts), 2 when CUDA could
 * not be used (no driver, no device), 3 on a usage error.
 *
 * Needs no CUDA header: the few driver/runtime types are declared here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ucm/api/ucm.h>
#include <gdrcache.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;

static CUresult (*p_cuInit)(unsigned);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree_v2)(CUdeviceptr);
static CUresult (*p_cuMemGetInfo_v2)(size_t *, size_t *);
static CUresult (*p_cuDriverGetVersion)(int *);

static int (*p_cudaSetDevice)(int);
static int (*p_cudaMalloc)(void **, size_t);
static int (*p_cudaFree)(void *);
static int (*p_cudaRuntimeGetVersion)(int *);

#define ALLOC_SIZE (1u << 20)

/* What the callbacks saw. expect: the address being freed / just allocated (0: none). */
static volatile uint64_t expect;
static uint64_t ucm_free, ucm_free_match, ucm_alloc, ucm_alloc_match;
static uint64_t gdr_free, gdr_free_match, gdr_alloc, gdr_alloc_match, gdr_ctx;

#define INC(x) __atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED)

static void ucm_cb(ucm_event_type_t type, ucm_event_t *ev, void *arg)
{
	uint64_t a = (uintptr_t)ev->mem_type.address;

	(void)arg;
	if (type == UCM_EVENT_MEM_TYPE_FREE) {
		INC(ucm_free);
		if (expect && a == expect)
			INC(ucm_free_match);
	} else if (type == UCM_EVENT_MEM_TYPE_ALLOC) {
		INC(ucm_alloc);
		if (expect && a == expect)
			INC(ucm_alloc_match);
	}
}

static void gdr_cb(void *arg, const struct gdr_mem_event *ev)
{
	(void)arg;
	switch (ev->kind) {
	case GDR_MEM_EVENT_FREE:
		INC(gdr_free);
		if (expect && ev->start == expect)
			INC(gdr_free_match);
		break;
	case GDR_MEM_EVENT_ALLOC:
		INC(gdr_alloc);
		if (expect && ev->start == expect)
			INC(gdr_alloc_match);
		break;
	default:
		INC(gdr_ctx);
		break;
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The first bytes of a loaded libcuda's entry: shows whose jump is there. */
static void dump_entries(const char *when)
{
	static const char *const names[] = {"cuMemFree_v2", "cuMemFree", "cuMemAlloc_v2",
					    "cuMemFreeAsync", "cuMemFreeHost", "cuMemUnmap"};
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	if (!h) {
		printf("ENTRY %-22s libcuda.so.1 not loaded yet\n", when);
		return;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const unsigned char *p = dlsym(h, names[i]);
		Dl_info di;
		char hex[3 * 16 + 1] = "";

		if (!p) {
			printf("ENTRY %-22s %-16s absent\n", when, names[i]);
			continue;
		}
		for (int k = 0; k < 16; k++)
			snprintf(hex + 3 * k, 4, "%02x ", p[k]);
		/* where a leading jmp rel32 lands, by file */
		if (p[0] == 0xe9) {
			int32_t d;
			const void *to;

			memcpy(&d, p + 1, 4);
			to = p + 5 + d;
			if (dladdr(to, &di) && di.dli_fname)
				printf("ENTRY %-22s %-16s %p: %s -> jmp %p (%s %s)\n", when, names[i],
				       (const void *)p, hex, to, di.dli_fname,
				       di.dli_sname ? di.dli_sname : "?");
			else
				printf("ENTRY %-22s %-16s %p: %s -> jmp %p (anonymous mapping)\n", when,
				       names[i], (const void *)p, hex, to);
		} else if (p[0] == 0x48 && p[1] == 0xb8 && p[10] == 0xff && p[11] == 0xe0) {
			const void *to;

			memcpy(&to, p + 2, 8);
			if (dladdr(to, &di) && di.dli_fname)
				printf("ENTRY %-22s %-16s %p: %s -> movabs/jmp *%%rax %p (%s %s)\n", when,
				       names[i], (const void *)p, hex, to, di.dli_fname,
				       di.dli_sname ? di.dli_sname : "?");
			else
				printf("ENTRY %-22s %-16s %p: %s -> movabs/jmp *%%rax %p (anonymous)\n",
				       when, names[i], (const void *)p, hex, to);
		} else {
			printf("ENTRY %-22s %-16s %p: %s\n", when, names[i], (const void *)p, hex);
		}
	}
	dlclose(h);
}

static int loaded(const char *lib)
{
	void *h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);

	if (h)
		dlclose(h);
	return h != NULL;
}

static void step_ucm(const char *tag)
{
	double t0 = now_s();
	ucs_status_t st;

	printf("UCM  ucm_global_opts: cuda_hook_modes=0x%" PRIx64 " (bit %d reloc, bit %d bistro) log_level=%d enable_events=%d "
	       "bistro_force_far_jump=%d\n",
	       (uint64_t)ucm_global_opts.cuda_hook_modes, (int)UCM_MMAP_HOOK_RELOC,
	       (int)UCM_MMAP_HOOK_BISTRO, (int)ucm_global_opts.log_level,
	       ucm_global_opts.enable_events, ucm_global_opts.bistro_force_far_jump);
	fflush(stdout);
	st = ucm_set_event_handler(UCM_EVENT_MEM_TYPE_FREE | UCM_EVENT_MEM_TYPE_ALLOC, 0, ucm_cb,
				   NULL);
	printf("STEP %s ucm_set_event_handler(MEM_TYPE_FREE|MEM_TYPE_ALLOC) = %d (%s) in %.3f s; "
	       "libucm_cuda.so loaded: %s; libcuda.so.1 loaded: %s\n",
	       tag, (int)st, ucs_status_string(st), now_s() - t0,
	       loaded("libucm_cuda.so.0") || loaded("libucm_cuda.so") ? "yes" : "NO",
	       loaded("libcuda.so.1") ? "yes" : "no");
	fflush(stdout);
	dump_entries("after-ucm");
	fflush(stdout);
}

static struct gdr_mem_monitor *mon;

static void step_gdr(const char *tag)
{
	double t0 = now_s();
	const char *why = NULL;
	struct gdr_intercept_stats is;
	int rc, mrc, src;

	rc = gdr_mem_events_state(&why);
	printf("STEP %s gdr_mem_events_state = %d (%s) why=\"%s\" in %.3f s\n", tag, rc,
	       rc ? strerror(-rc) : "ok", why ? why : "(null)", now_s() - t0);
	mrc = gdr_mem_monitor_create(GDR_MONITOR_ALL, gdr_cb, NULL, &mon);
	printf("STEP %s gdr_mem_monitor_create(GDR_MONITOR_ALL) = %d (%s)\n", tag, mrc,
	       mrc ? strerror(-mrc) : "ok");
	if (mrc)
		mon = NULL;
	memset(&is, 0, sizeof(is));
	src = gdr_intercept_get_stats(&is, sizeof(is));
	printf("STEP %s gdr_intercept_get_stats = %d state=%d reason=\"%s\"\n", tag, src, is.state,
	       is.reason);
	fflush(stdout);
	dump_entries("after-gdr");
	fflush(stdout);
}

static int use_gdr = 1; /* 0 (ucm-only): never call libgdrcache, whose calls install its patch */

static uint64_t stat_frees(void)
{
	struct gdr_intercept_stats is;

	if (!use_gdr)
		return (uint64_t)-1;

	memset(&is, 0, sizeof(is));
	if (gdr_intercept_get_stats(&is, sizeof(is)))
		return (uint64_t)-1;
	return is.frees[GDR_FREE_MEM_FREE];
}

static void reset(void)
{
	ucm_free = ucm_free_match = ucm_alloc = ucm_alloc_match = 0;
	gdr_free = gdr_free_match = gdr_alloc = gdr_alloc_match = gdr_ctx = 0;
}

static void result(const char *order, const char *api, int n, int ok, double secs,
		   uint64_t sf0, uint64_t sf1, long long leak_mib)
{
	printf("RESULT order=%s api=%s n=%d frees_ok=%d ucm_free=%" PRIu64 " ucm_free_match=%" PRIu64
	       " ucm_alloc_match=%" PRIu64 " gdr_free=%" PRIu64 " gdr_free_match=%" PRIu64
	       " gdr_alloc_match=%" PRIu64 " gdr_ctx=%" PRIu64 " gdr_stats_frees=%lld"
	       " leak_mib=%lld us_per_pair=%.1f\n",
	       order, api, n, ok, ucm_free, ucm_free_match, ucm_alloc_match, gdr_free,
	       gdr_free_match, gdr_alloc_match, gdr_ctx,
	       (sf0 == (uint64_t)-1 || sf1 == (uint64_t)-1) ? -1LL : (long long)(sf1 - sf0),
	       leak_mib, secs * 1e6 / (n ? n : 1));
	fflush(stdout);
}

static long long free_mib(void)
{
	size_t fr = 0, tot = 0;

	if (!p_cuMemGetInfo_v2 || p_cuMemGetInfo_v2(&fr, &tot))
		return -1;
	return (long long)(fr >> 20);
}

#define SYM(h, name)                                                                         \
	do {                                                                                 \
		*(void **)&p_##name = dlsym(h, #name);                                       \
		if (!p_##name) {                                                             \
			printf("FATAL dlsym(%s) failed\n", #name);                           \
			return -1;                                                           \
		}                                                                            \
	} while (0)

static int cuda_setup(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	CUcontext ctx;
	CUdevice dev;
	int v = 0, r;

	if (!h) {
		printf("FATAL dlopen(libcuda.so.1): %s\n", dlerror());
		return -1;
	}
	SYM(h, cuInit);
	SYM(h, cuDeviceGet);
	SYM(h, cuDevicePrimaryCtxRetain);
	SYM(h, cuCtxSetCurrent);
	SYM(h, cuMemAlloc_v2);
	SYM(h, cuMemFree_v2);
	*(void **)&p_cuMemGetInfo_v2 = dlsym(h, "cuMemGetInfo_v2"); /* optional: leak_mib -1 */
	*(void **)&p_cuDriverGetVersion = dlsym(h, "cuDriverGetVersion");
	if ((r = p_cuInit(0)) || (r = p_cuDeviceGet(&dev, 0)) ||
	    (r = p_cuDevicePrimaryCtxRetain(&ctx, dev)) || (r = p_cuCtxSetCurrent(ctx))) {
		printf("FATAL CUDA driver setup failed: CUresult %d\n", r);
		return -1;
	}
	if (p_cuDriverGetVersion)
		p_cuDriverGetVersion(&v);
	printf("CUDA driver API version %d\n", v);
	return 0;
}

static int run_driver(const char *order, int n)
{
	uint64_t sf0 = stat_frees(), sf1;
	long long m0 = free_mib(), m1;
	int ok = 0;
	double t0;

	reset();
	t0 = now_s();
	for (int i = 0; i < n; i++) {
		CUdeviceptr p = 0;
		CUresult r = p_cuMemAlloc_v2(&p, ALLOC_SIZE);

		if (r) {
			printf("cuMemAlloc_v2 #%d failed: %d\n", i, r);
			break;
		}
		expect = p;
		r = p_cuMemFree_v2(p);
		expect = 0;
		if (r)
			printf("cuMemFree_v2 #%d failed: %d\n", i, r);
		else
			ok++;
	}
	/* The alloc events came with expect still 0 (set after the alloc returned): match them
	 * loosely by count instead; ucm_alloc/gdr_alloc are in the totals below. */
	sf1 = stat_frees();
	m1 = free_mib();
	result(order, "driver", n, ok, now_s() - t0, sf0, sf1, (m0 < 0 || m1 < 0) ? -1 : m0 - m1);
	printf("     (alloc events during the loop: ucm_alloc=%" PRIu64 " gdr_alloc=%" PRIu64 ")\n",
	       ucm_alloc, gdr_alloc);
	return 0;
}

static void *open_cudart(void)
{
	static const char *const names[] = {"libcudart.so.13", "libcudart.so.12",
					    "libcudart.so.11.0", "libcudart.so"};
	const char *env = getenv("CUDART_LIB");
	void *h = NULL;

	if (env && (h = dlopen(env, RTLD_NOW | RTLD_GLOBAL)))
		return h;
	for (size_t i = 0; !h && i < sizeof(names) / sizeof(names[0]); i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
	return h;
}

static int run_runtime(const char *order, int n)
{
	void *h = open_cudart();
	uint64_t sf0, sf1;
	long long m0, m1;
	int ok = 0, r, v = 0;
	double t0;
	Dl_info di;

	if (!h) {
		printf("RESULT order=%s api=runtime skipped: libcudart not found (%s); set CUDART_LIB\n",
		       order, dlerror());
		return 0;
	}
	*(void **)&p_cudaSetDevice = dlsym(h, "cudaSetDevice");
	*(void **)&p_cudaMalloc = dlsym(h, "cudaMalloc");
	*(void **)&p_cudaFree = dlsym(h, "cudaFree");
	*(void **)&p_cudaRuntimeGetVersion = dlsym(h, "cudaRuntimeGetVersion");
	if (!p_cudaSetDevice || !p_cudaMalloc || !p_cudaFree) {
		printf("RESULT order=%s api=runtime skipped: cudart symbols missing\n", order);
		return 0;
	}
	if (p_cudaRuntimeGetVersion)
		p_cudaRuntimeGetVersion(&v);
	if (dladdr((void *)p_cudaMalloc, &di))
		printf("CUDA runtime %d from %s\n", v, di.dli_fname);
	if ((r = p_cudaSetDevice(0))) {
		printf("RESULT order=%s api=runtime skipped: cudaSetDevice = %d\n", order, r);
		return 0;
	}
	{ /* warm the runtime up (its first call makes its context state) outside the count */
		void *w = NULL;

		if (!p_cudaMalloc(&w, ALLOC_SIZE))
			p_cudaFree(w);
	}
	sf0 = stat_frees();
	m0 = free_mib();
	reset();
	t0 = now_s();
	for (int i = 0; i < n; i++) {
		void *p = NULL;

		r = p_cudaMalloc(&p, ALLOC_SIZE);
		if (r) {
			printf("cudaMalloc #%d failed: %d\n", i, r);
			break;
		}
		expect = (uintptr_t)p;
		r = p_cudaFree(p);
		expect = 0;
		if (r)
			printf("cudaFree #%d failed: %d\n", i, r);
		else
			ok++;
	}
	sf1 = stat_frees();
	m1 = free_mib();
	result(order, "runtime", n, ok, now_s() - t0, sf0, sf1,
	       (m0 < 0 || m1 < 0) ? -1 : m0 - m1);
	printf("     (alloc events during the loop: ucm_alloc=%" PRIu64 " gdr_alloc=%" PRIu64 ")\n",
	       ucm_alloc, gdr_alloc);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	int n = argc > 2 ? atoi(argv[2]) : 1000;
	const char *order = getenv("ORDER_TAG") ? getenv("ORDER_TAG") : mode;
	int do_ucm = 1, do_gdr = 1, ucm_first;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "ucm-first")) {
		ucm_first = 1;
	} else if (!strcmp(mode, "gdr-first")) {
		ucm_first = 0;
	} else if (!strcmp(mode, "ucm-only")) {
		ucm_first = 1, do_gdr = 0, use_gdr = 0;
	} else if (!strcmp(mode, "gdr-only")) {
		ucm_first = 0, do_ucm = 0;
	} else {
		fprintf(stderr, "usage: %s ucm-first|gdr-first|ucm-only|gdr-only [N]\n", argv[0]);
		return 3;
	}
	printf("MODE %s order=%s n=%d pid=%d libgdrcache version 0x%x\n", mode, order, n,
	       (int)getpid(), gdr_cache_version()); /* loads nothing */
	printf("ENV UCX_MEM_CUDA_HOOK_MODE=%s UCX_MEM_LOG_LEVEL=%s UCX_LOG_LEVEL=%s "
	       "UCX_MEM_BISTRO_FORCE_FAR_JUMP=%s GDRCACHE_INTERCEPT=%s GDRCACHE_LOG=%s\n",
	       getenv("UCX_MEM_CUDA_HOOK_MODE") ?: "-", getenv("UCX_MEM_LOG_LEVEL") ?: "-",
	       getenv("UCX_LOG_LEVEL") ?: "-", getenv("UCX_MEM_BISTRO_FORCE_FAR_JUMP") ?: "-",
	       getenv("GDRCACHE_INTERCEPT") ?: "-", getenv("GDRCACHE_LOG") ?: "-");
	dump_entries("start");

	if (ucm_first) {
		if (do_ucm)
			step_ucm("1-ucm");
		if (do_gdr)
			step_gdr(do_ucm ? "2-gdr" : "1-gdr");
	} else {
		if (do_gdr)
			step_gdr("1-gdr");
		if (do_ucm)
			step_ucm(do_gdr ? "2-ucm" : "1-ucm");
	}

	if (cuda_setup())
		return 2;
	dump_entries("before-loops");
	run_driver(order, n);
	run_runtime(order, n);
	dump_entries("end");

	if (mon)
		printf("END gdr_mem_monitor_destroy = %d, gdr_mem_monitor_violations = %" PRIu64 "\n",
		       gdr_mem_monitor_destroy(mon), gdr_mem_monitor_violations());
	if (do_ucm)
		ucm_unset_event_handler(UCM_EVENT_MEM_TYPE_FREE | UCM_EVENT_MEM_TYPE_ALLOC, ucm_cb,
					NULL);
	printf("END %s: clean exit\n", order);
	return 0;
}
