/* SPDX-License-Identifier: MIT */
/*
 * Edge cases of how libgdrcache meets the CUDA driver (the fake, GDRCACHE_LIBCUDA), one per
 * argv[1]; argv[2] is libgdrcache's path (argv[3]: a second copy of it, for "twice").
 *
 *   stubtaken  CUDA initialised first, then the page the one-byte patch's stub needs is taken by
 *              the program (in a large process libraries already sit there), then libgdrcache is
 *              dlopen'ed. Whatever mode it picks, no registration may describe a freed buffer.
 *   busy       CUDA initialised first, the one-byte form's stub pages taken, and 4 threads calling
 *              cuMemAlloc/cuMemFree through pointers taken before libgdrcache is dlopen'ed and
 *              patches the driver under them: the threads' calls go on, their frees are seen,
 *              events are in effect (the entries rewritten with the threads stopped), none stale.
 *   busy_norand the same without address space randomisation (re-executed with ADDR_NO_RANDOMIZE,
 *              as setarch -R and gdb run programs): the stub addresses lie past the top.
 *   twice      two copies of libgdrcache (two names) in one process, each with a cache: each serves
 *              only live buffers after frees and reuse of the VA.
 *   dlclose    libgdrcache dlopen'ed, used, dlclose'd: the driver's patched entries still work.
 *   deepbind   libgdrcache dlopen'ed with RTLD_DEEPBIND after CUDA: frees still seen (mode events).
 *   ringlost   more events than the ring holds between two looks of a cache, then the buffer behind
 *              a cached entry is replaced by frees and allocations the hooks do not see: the lost
 *              events must drop everything, so the next registration describes the live buffer.
 *   probelap   more events than the ring holds between the start-up probe's test free and its look
 *              (other threads' frees on a busy machine): the probe must still see its own free.
 * Exit 0 pass, 1 fail, 77 skip.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/personality.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gdrcache.h>

#include "deadline.h"

#include "cuda/cuda_abi.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

struct api {
	int (*create)(const struct gdr_cache_attr *, struct gdr_cache **);
	int (*destroy)(struct gdr_cache *);
	int (*reg)(struct gdr_cache *, struct ibv_pd *, void *, size_t, int, struct gdr_region **);
	int (*dereg)(struct gdr_region *);
	int (*buffer_id)(const struct gdr_region *, uint64_t *);
	int (*stats)(struct gdr_cache *, struct gdr_cache_stats *);
	int (*istats)(struct gdr_intercept_stats *, size_t);
};

static struct {
	void *h;
	gdr_CUresult (*alloc)(gdr_CUdeviceptr *, size_t);
	gdr_CUresult (*free_gpa)(gdr_CUdeviceptr);
	uint64_t (*buffer_id)(uint64_t va);
	uint64_t (*raw_alloc)(size_t);
	int (*raw_free)(uint64_t);
} cu;

static int fail(const char *what)
{
	fprintf(stderr, "FAIL: %s\n", what);
	return 1;
}

static int cuda_init(void)
{
	const char *path = getenv("GDRCACHE_LIBCUDA");
	gdr_cuGetProcAddress_v2_t gpa;
	gdr_CUresult (*init)(unsigned) = NULL;
	int st;

	if (!path)
		return fail("GDRCACHE_LIBCUDA is not set");
	cu.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!cu.h)
		return fail(dlerror());
	gpa = (gdr_cuGetProcAddress_v2_t)dlsym(cu.h, "cuGetProcAddress_v2");
	if (!gpa)
		return fail("no cuGetProcAddress_v2");
	gpa("cuInit", (void **)&init, 2000, 0, &st);
	gpa("cuMemAlloc", (void **)&cu.alloc, 3020, 0, &st);
	gpa("cuMemFree", (void **)&cu.free_gpa, 3020, 0, &st);
	cu.buffer_id = (uint64_t(*)(uint64_t))dlsym(cu.h, "fake_cuda_buffer_id");
	cu.raw_alloc = (uint64_t(*)(size_t))dlsym(cu.h, "fake_cuda_alloc");
	cu.raw_free = (int (*)(uint64_t))dlsym(cu.h, "fake_cuda_free");
	if (!init || !cu.alloc || !cu.free_gpa || !cu.buffer_id || !cu.raw_alloc || !cu.raw_free)
		return fail("the driver lacks an entry point");
	return init(0) ? fail("cuInit") : 0;
}

static int api_find(void *h, struct api *a)
{
#define F(field, name)                                                                             \
	do {                                                                                       \
		*(void **)&a->field = dlsym(h, name);                                              \
		if (!a->field)                                                                     \
			return fail("libgdrcache lacks " name);                                    \
	} while (0)
	F(create, "gdr_cache_create");
	F(destroy, "gdr_cache_destroy");
	F(reg, "gdr_reg");
	F(dereg, "gdr_dereg");
	F(buffer_id, "gdr_region_buffer_id");
	F(stats, "gdr_cache_get_stats");
	F(istats, "gdr_intercept_get_stats");
#undef F
	return 0;
}

static const char *mode_name(const struct api *a, struct gdr_cache *c)
{
	struct gdr_cache_stats st;
	struct gdr_intercept_stats is;

	a->stats(c, &st);
	a->istats(&is, sizeof(is));
	printf("  validation mode %s; interception %d (%s)\n",
	       st.validate_mode == GDR_VALIDATE_EVENTS ? "events" : "tag", is.state, is.reason);
	return st.validate_mode == GDR_VALIDATE_EVENTS ? "events" : "tag";
}

/* Register [va, va + 4096), check it describes the live buffer, release: 0, or 1 (stale). */
static int reg_check(const struct api *a, struct gdr_cache *c, uint64_t va, const char *what)
{
	struct gdr_region *r = NULL;
	uint64_t id = 0;
	int rc = a->reg(c, NULL, (void *)(uintptr_t)va, 4096, 0, &r);

	if (rc) {
		fprintf(stderr, "gdr_reg(%s): %d\n", what, rc);
		return 1;
	}
	a->buffer_id(r, &id);
	a->dereg(r);
	if (id != cu.buffer_id(va)) {
		fprintf(stderr,
			"STALE (%s): registration of buffer %" PRIu64 ", buffer there %" PRIu64
			"\n",
			what, id, cu.buffer_id(va));
		return 1;
	}
	return 0;
}

/* Free the buffer at va through the program's cuGetProcAddress pointer and allocate one of the same
 * size; the fake places it at the same VA. */
static uint64_t churn(uint64_t va, size_t size)
{
	gdr_CUdeviceptr p = 0;

	cu.free_gpa(va);
	cu.alloc(&p, size);
	return p;
}

/* The address the one-byte patch of fn needs for its stub: fn + 5 + the rel32 of bytes 1..4. */
static uintptr_t stub_dest(const void *fn)
{
	int32_t rel;

	memcpy(&rel, (const uint8_t *)fn + 1, 4);
	return (uintptr_t)fn + 5 + (intptr_t)rel;
}

static const char *const free_entries[] = {
	"cuMemFree_v2",
	"cuMemFreeAsync",
	"cuMemFreeAsync_ptsz",
	"cuMemFreeHost",
	"cuMemUnmap",
	"cuIpcCloseMemHandle",
	"cuCtxDestroy",
	"cuCtxDestroy_v2",
	"cuDevicePrimaryCtxReset",
	"cuDevicePrimaryCtxReset_v2",
	"cuDevicePrimaryCtxRelease",
	"cuDevicePrimaryCtxRelease_v2",
};

static int basic(const struct api *a, struct gdr_cache *c)
{
	uint64_t va = 0;
	int bad = 0;

	cu.alloc((gdr_CUdeviceptr *)&va, 4 << 20);
	for (int i = 0; i < 50 && va; i++) {
		bad |= reg_check(a, c, va, "before free");
		va = churn(va, 4 << 20);
		bad |= reg_check(a, c, va, "after free and reuse");
	}
	if (va)
		cu.free_gpa(va);
	return bad || !va;
}

/* Takes the pages the one-byte form's stubs of the driver's free entries need (where take, and
 * where they can be mapped): how many were taken; *past (may be NULL) gets how many lie past the
 * top of the address space. */
static int take_stub_pages(bool take, int *past)
{
	long page = sysconf(_SC_PAGESIZE);
	int taken = 0, n_past = 0;

	for (size_t i = 0; i < sizeof(free_entries) / sizeof(free_entries[0]); i++) {
		void *fn = dlsym(cu.h, free_entries[i]);
		uintptr_t d;

		if (!fn)
			continue;
		d = stub_dest(fn) & ~(uintptr_t)(page - 1);
		if (d >= 1ULL << 47)
			n_past++;
		else if (take && mmap((void *)d, page, PROT_READ,
				      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
				      0) == (void *)d)
			taken++;
	}
	if (past)
		*past = n_past;
	return taken;
}

static int m_stubtaken(const char *lib)
{
	struct gdr_cache *c = NULL;
	struct api a;
	void *h;
	int taken;

	if (cuda_init())
		return 1;
	taken = take_stub_pages(true, NULL);
	printf("  %d stub pages taken by the program\n", taken);
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h || api_find(h, &a))
		return fail("dlopen libgdrcache");
	if (a.create(NULL, &c))
		return fail("gdr_cache_create");
	mode_name(&a, c);
	if (basic(&a, c))
		return fail("stale or failed registrations");
	if (getenv("EDGE_EXPECT_EVENTS") && strcmp(mode_name(&a, c), "events"))
		return fail("the fast path (events) is not in effect");
	a.destroy(c);
	return 0;
}

/* ---- busy: threads in the driver while it is patched ---------------------------------------- */

#define BUSY_THREADS 4
#define BUSY_WAIT_MS 30000
static long busy_calls, busy_errors;
static int busy_stop;

static void *busy_thread(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&busy_stop, __ATOMIC_RELAXED)) {
		gdr_CUdeviceptr p = 0;

		if (cu.alloc(&p, 64 << 10) || cu.free_gpa(p))
			__atomic_add_fetch(&busy_errors, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&busy_calls, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* Waits until the threads made n more calls: 0, or 1 at the deadline. */
static int busy_more(long n)
{
	long want = __atomic_load_n(&busy_calls, __ATOMIC_RELAXED) + n;

	for (int64_t d = gdr_deadline_ms(BUSY_WAIT_MS);
	     __atomic_load_n(&busy_calls, __ATOMIC_RELAXED) < want;) {
		if (gdr_deadline_passed(d))
			return 1;
		usleep(1000);
	}
	return 0;
}

static int m_busy(const char *lib, bool take_stubs)
{
	pthread_t th[BUSY_THREADS];
	struct gdr_intercept_stats is;
	struct gdr_cache *c = NULL;
	uint64_t frees_before;
	struct api a;
	int taken, past = 0, rc = 0;
	void *h;

	if (cuda_init())
		return 1;
	taken = take_stub_pages(take_stubs, &past);
	printf("  %d stub pages taken by the program, %d past the top\n", taken, past);
	if (!take_stubs && !past) {
		fprintf(stderr, "SKIP: the driver was loaded where its stub addresses fit\n");
		return 77;
	}
	for (int i = 0; i < BUSY_THREADS; i++)
		if (pthread_create(&th[i], NULL, busy_thread, NULL))
			return fail("pthread_create");
	if (busy_more(1000)) {
		fprintf(stderr, "SKIP: the threads made too few calls before the patch\n");
		_exit(77); /* not joined: they keep calling */
	}
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h || api_find(h, &a))
		return fail("dlopen libgdrcache");
	if (a.create(NULL, &c)) /* patches the driver while the threads call it */
		return fail("gdr_cache_create");
	a.istats(&is, sizeof(is));
	frees_before = is.frees[GDR_FREE_MEM_FREE];
	if (busy_more(1000)) {
		fprintf(stderr, "FAIL: the threads stopped calling once the driver was patched\n");
		_exit(1); /* they may be stuck in a patched entry */
	}
	a.istats(&is, sizeof(is));
	printf("  entries: %u one-byte, %u with the threads stopped; threads stopped %u, moved "
	       "%u; frees seen by the hooks %" PRIu64 "\n",
	       is.entries_short, is.entries_stopped, is.threads_stopped, is.threads_moved,
	       is.frees[GDR_FREE_MEM_FREE] - frees_before);
	if (strcmp(mode_name(&a, c), "events")) {
		if (getenv("EDGE_SIGNALS_DEFERRED") &&
		    (strstr(is.reason, "not stopped") || strstr(is.reason, "out of time"))) {
			/* ThreadSanitizer runs a handler only when the thread next enters one of its
			 * interceptors: threads calling the fake driver's loop do not stop in time.
			 * The refusal is the right answer; events cannot be proven here. */
			printf("SKIP: the sanitizer defers signals: %s\n", is.reason);
			_exit(77);
		}
		rc = fail("the fast path (events) is not in effect");
	} else if (!is.entries_stopped)
		rc = fail("no entry was written with the threads stopped");
	else if (is.frees[GDR_FREE_MEM_FREE] - frees_before < 1000)
		rc = fail("the threads' frees were not seen");
	if (basic(&a, c))
		rc = fail("stale or failed registrations");
	__atomic_store_n(&busy_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < BUSY_THREADS; i++)
		if (gdr_join_until(th[i], gdr_deadline_ms(BUSY_WAIT_MS))) {
			fprintf(stderr, "FAIL: a calling thread did not stop\n");
			_exit(1);
		}
	if (busy_errors)
		rc = fail("the threads' calls failed");
	printf("  %ld calls by the threads, %ld failed\n", busy_calls, busy_errors);
	a.destroy(c);
	return rc;
}

/* Runs busy in this program re-executed without address space randomisation. */
static int m_busy_norand(char **argv)
{
	int p = personality(0xffffffff);

	if (p == -1)
		return fail("personality");
	if (!(p & ADDR_NO_RANDOMIZE)) {
		if (personality((unsigned long)p | ADDR_NO_RANDOMIZE) == -1) {
			fprintf(stderr, "SKIP: ADDR_NO_RANDOMIZE refused\n");
			return 77;
		}
		execv("/proc/self/exe", argv);
		return fail("re-exec");
	}
	return m_busy(argv[2], false);
}

static int m_twice(const char *lib, const char *lib2)
{
	struct gdr_cache *c1 = NULL, *c2 = NULL;
	struct api a1, a2;
	void *h1, *h2;
	uint64_t va = 0;
	int bad = 0;

	if (cuda_init())
		return 1;
	h1 = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	h2 = dlopen(lib2, RTLD_NOW | RTLD_LOCAL);
	if (!h1 || !h2 || h1 == h2)
		return fail("dlopen of the two copies");
	if (api_find(h1, &a1) || api_find(h2, &a2))
		return 1;
	if (a1.create(NULL, &c1) || a2.create(NULL, &c2))
		return fail("gdr_cache_create");
	printf(" copy 1:\n");
	mode_name(&a1, c1);
	printf(" copy 2:\n");
	mode_name(&a2, c2);
	cu.alloc((gdr_CUdeviceptr *)&va, 4 << 20);
	for (int i = 0; i < 50 && va; i++) {
		bad |= reg_check(&a1, c1, va, "copy 1");
		bad |= reg_check(&a2, c2, va, "copy 2");
		va = churn(va, 4 << 20);
	}
	a1.destroy(c1);
	a2.destroy(c2);
	return bad ? fail("stale registrations") : 0;
}

static int m_dlclose(const char *lib)
{
	struct gdr_cache *c = NULL;
	struct api a;
	gdr_CUdeviceptr p = 0;
	void *h;

	if (cuda_init())
		return 1;
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h || api_find(h, &a) || a.create(NULL, &c))
		return fail("dlopen / create");
	if (basic(&a, c))
		return fail("stale");
	a.destroy(c);
	dlclose(h);
	/* the entries still jump into libgdrcache: it must still be there */
	for (int i = 0; i < 10; i++) {
		if (cu.alloc(&p, 1 << 20) || cu.free_gpa(p))
			return fail("driver call after dlclose");
	}
	return 0;
}

static int m_deepbind(const char *lib)
{
	struct gdr_cache *c = NULL;
	struct api a;
	void *h;

	if (cuda_init())
		return 1;
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
	if (!h || api_find(h, &a) || a.create(NULL, &c))
		return fail("dlopen / create");
	if (strcmp(mode_name(&a, c), "events"))
		return fail("not events");
	if (basic(&a, c))
		return fail("stale");
	a.destroy(c);
	return 0;
}

static int m_ringlost(const char *lib)
{
	struct gdr_cache_stats st;
	struct gdr_cache *c = NULL;
	struct api a;
	static uint64_t many[5000]; /* not the heap: LeakSanitizer would count an early return */
	uint64_t va, va2;
	void *h;
	int n = (int)(sizeof(many) / sizeof(many[0]));

	if (cuda_init())
		return 1;
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h || api_find(h, &a) || a.create(NULL, &c))
		return fail("dlopen / create");
	if (strcmp(mode_name(&a, c), "events"))
		return 77;
	cu.alloc((gdr_CUdeviceptr *)&va, 4 << 20);
	if (reg_check(&a, c, va, "first"))
		return 1;
	/* more allocation events than the ring holds, no cache operation meanwhile */
	for (int i = 0; i < n; i++)
		if (cu.alloc((gdr_CUdeviceptr *)&many[i], 512))
			return fail("alloc");
	/* the buffer behind the entry replaced where no hook sees it */
	cu.raw_free(va);
	va2 = cu.raw_alloc(4 << 20);
	if (va2 != va)
		return 77;
	if (reg_check(&a, c, va, "after the ring overran"))
		return fail("a cache that lost events kept an entry");
	a.stats(c, &st);
	printf("  events_lost %" PRIu64 "\n", st.events_lost);
	if (!st.events_lost)
		return fail("events_lost not counted");
	for (int i = 0; i < n; i++)
		cu.free_gpa(many[i]);
	cu.free_gpa(va);
	a.destroy(c);
	return 0;
}

/* probelap: the driver's enter hook, on the probe's free, makes more events than the ring holds */
static uint64_t lap_many[5000];
static int lap_armed;

static void lap_enter(const char *entry, void *arg)
{
	(void)arg;
	if (strcmp(entry, "cuMemFree_v2") || !__atomic_exchange_n(&lap_armed, 0, __ATOMIC_ACQ_REL))
		return;
	for (size_t i = 0; i < sizeof(lap_many) / sizeof(lap_many[0]); i++)
		cu.alloc((gdr_CUdeviceptr *)&lap_many[i], 512);
}

static int m_probelap(const char *lib)
{
	void (*set_hook)(void (*)(const char *, void *), void *);
	struct gdr_cache *c = NULL;
	struct api a;
	void *h;
	int rc = 0;

	if (cuda_init())
		return 1;
	*(void **)&set_hook = dlsym(cu.h, "fake_cuda_set_enter_hook");
	if (!set_hook)
		return fail("the driver lacks fake_cuda_set_enter_hook");
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h || api_find(h, &a))
		return fail("dlopen libgdrcache");
	lap_armed = 1;
	set_hook(lap_enter, NULL);
	if (a.create(NULL, &c)) /* the probe runs here */
		return fail("gdr_cache_create");
	set_hook(NULL, NULL);
	if (lap_armed)
		return fail("the probe's free did not reach the driver");
	if (strcmp(mode_name(&a, c), "events"))
		rc = fail("events not in effect after a busy ring at the probe");
	else if (basic(&a, c))
		rc = fail("stale or failed registrations");
	for (size_t i = 0; i < sizeof(lap_many) / sizeof(lap_many[0]); i++)
		if (lap_many[i])
			cu.free_gpa(lap_many[i]);
	a.destroy(c);
	return rc;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc < 3)
		return fail("usage: edge_load MODE LIBGDRCACHE [COPY]");
	printf("%s:\n", argv[1]);
	if (!strcmp(argv[1], "busy"))
		return m_busy(argv[2], true);
	if (!strcmp(argv[1], "busy_norand"))
		return m_busy_norand(argv);
	if (!strcmp(argv[1], "stubtaken"))
		return m_stubtaken(argv[2]);
	if (!strcmp(argv[1], "twice"))
		return argc > 3 ? m_twice(argv[2], argv[3]) : 77;
	if (!strcmp(argv[1], "dlclose"))
		return m_dlclose(argv[2]);
	if (!strcmp(argv[1], "deepbind"))
		return m_deepbind(argv[2]);
	if (!strcmp(argv[1], "ringlost"))
		return m_ringlost(argv[2]);
	if (!strcmp(argv[1], "probelap"))
		return m_probelap(argv[2]);
	return fail("unknown mode");
}
