/* SPDX-License-Identifier: MIT */
/*
 * libgdrcache-preload.so, functionally: an ordinary verbs program built against today's
 * <infiniband/verbs.h> and libibverbs, run with the preload in LD_PRELOAD over the fake
 * libibverbs (fake_ibverbs.c, by LD_LIBRARY_PATH) and the fake CUDA driver (tests/fake).
 * preload_test.sh runs it. Each check prints "ok"/"not ok"; exit 0 only if all passed.
 *
 * Usage: test_preload [--disabled | --bind-only]
 *   --disabled   GDRCACHE_DISABLE=1 is set: every registration must reach libibverbs unchanged
 *   --bind-only  exit at once (the binding test loads it with LD_BIND_NOW against the real library)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "deadline.h"
#include "fake_cuda.h"
#include "check.h"
#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);

static uint64_t (*fcount)(const char *);
static unsigned (*flive)(const struct ibv_pd *);
static int (*fis_mr)(const struct ibv_mr *);
static int (*finfo)(const struct ibv_mr *, int *, uint64_t *);
static void (*fset_rereg)(int);

static bool disabled;

static struct ibv_context *ctx;
static struct ibv_pd *pd;

/* The fake driver's own entry points, as a CUDA program calls them: libgdrcache sees the frees. */
int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

static void *gpu_alloc(size_t size)
{
	uint64_t p = 0;

	cuInit(0);
	return cuMemAlloc_v2(&p, size) ? NULL : (void *)(uintptr_t)p;
}

static void gpu_free(void *p)
{
	cuMemFree_v2((uintptr_t)p);
}

/* Whether the program got its own shadow (cached) rather than libibverbs' MR. */
static bool cached(const struct ibv_mr *mr)
{
	return mr && !fis_mr(mr);
}

static void test_interposed(void)
{
	Dl_info info = { 0 };

	/* (ibv_reg_mr) without a call: the function, not verbs.h's macro */
	CHECK(dladdr((void *)&ibv_reg_mr, &info) && strstr(info.dli_fname, "libgdrcache-preload"),
	      "ibv_reg_mr resolves to %s", info.dli_fname ? info.dli_fname : "?");
}

static void test_cached(void)
{
	char *buf = gpu_alloc(65536);
	uint64_t reg0 = fcount("reg"), dereg0 = fcount("dereg");
	struct ibv_mr *a, *b, *c;

	a = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE); /* constant access: ibv_reg_mr@1.1 */
	CHECK(cached(a), "a GPU buffer gets a shadow MR");
	CHECK(a && a->addr == buf && a->length == 4096 && a->pd == pd && a->context == ctx,
	      "the shadow carries the caller's addr, length, pd and context");
	CHECK(fcount("reg") == reg0 + 1, "one real registration (%llu)",
	      (unsigned long long)(fcount("reg") - reg0));
	b = ibv_reg_mr(pd, buf + 8192, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cached(b) && b != a && b->lkey == a->lkey && b->rkey == a->rkey && b->addr == buf + 8192,
	      "another range of the allocation: its own shadow, the same cached MR's keys");
	CHECK(fcount("reg") == reg0 + 1, "no new registration for it");
	CHECK(ibv_dereg_mr(a) == 0 && ibv_dereg_mr(b) == 0, "ibv_dereg_mr of shadows returns 0");
	CHECK(fcount("dereg") == dereg0 && fcount("dereg_bad") == 0,
	      "the cached MR stays registered; no shadow reached libibverbs' ibv_dereg_mr");
	c = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cached(c) && fcount("reg") == reg0 + 1, "registering it again is a cache hit");
	ibv_dereg_mr(c);
	gpu_free(buf);
}

/* A shadow released twice: the second ibv_dereg_mr is refused as libibverbs refuses an MR it does
 * not know (EINVAL) and never reaches libibverbs (a real provider would release the cached MR by
 * the shadow's handle); the cached MR's reference is dropped once. */
static void test_double_dereg(void)
{
	char *buf = gpu_alloc(65536);
	uint64_t reg0 = fcount("reg"), dereg0, bad0 = fcount("dereg_bad"), rereg0;
	struct ibv_mr *a = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *b = ibv_reg_mr(pd, buf + 4096, 4096, IBV_ACCESS_LOCAL_WRITE), *c;
	int rc;

	CHECK(cached(a) && cached(b), "two shadows of one cached MR");
	dereg0 = fcount("dereg");
	CHECK(ibv_dereg_mr(a) == 0, "the first ibv_dereg_mr of a shadow: 0");
	CHECK(ibv_dereg_mr(a) == EINVAL, "the second: EINVAL");
	errno = 0;
	rereg0 = fcount("rereg");
	rc = ibv_rereg_mr(a, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL && fcount("rereg") == rereg0,
	      "ibv_rereg_mr of the released shadow: IBV_REREG_MR_ERR_INPUT, EINVAL (%d, %d)", rc,
	      errno);
	CHECK(fcount("dereg") == dereg0 && fcount("dereg_bad") == bad0,
	      "neither reached libibverbs (dereg %llu, dereg_bad %llu)",
	      (unsigned long long)(fcount("dereg") - dereg0),
	      (unsigned long long)(fcount("dereg_bad") - bad0));
	c = ibv_reg_mr(pd, buf + 8192, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cached(c) && c != a && ibv_dereg_mr(a) == EINVAL && ibv_dereg_mr(c) == 0,
	      "after another registration too: a record released is the last one reused");
	CHECK(ibv_dereg_mr(b) == 0 && ibv_dereg_mr(b) == EINVAL,
	      "the other shadow: released once, refused after");
	c = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cached(c) && fcount("reg") == reg0 + 1 && flive(pd) >= 1,
	      "the cached MR stays registered: the next registration is a hit");
	CHECK(ibv_dereg_mr(c) == 0 && fcount("dereg") == dereg0, "and released");
	gpu_free(buf);
}

/* A hit asks the driver nothing (issue 16 item 4): the cache is tried before the memory is
 * classified. In mode events (the fake's probe passes) a hit makes no CUDA call at all. */
static void test_hit_without_driver_call(void)
{
	char *buf = gpu_alloc(65536);
	struct ibv_mr *m = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint64_t calls0;
	int hits = 0;

	CHECK(cached(m), "a GPU buffer is cached");
	ibv_dereg_mr(m);
	calls0 = fake_cuda_calls_total();
	for (int i = 0; i < 100; i++) {
		m = ibv_reg_mr(pd, buf + (i % 8) * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
		hits += cached(m);
		ibv_dereg_mr(m);
	}
	CHECK(hits == 100, "100 registrations of it are hits (%d)", hits);
	CHECK(fake_cuda_calls_total() == calls0, "and they made no CUDA driver call (%llu; the old "
	      "preload asked cuPointerGetAttribute each time)",
	      (unsigned long long)(fake_cuda_calls_total() - calls0));
	gpu_free(buf);
	/* host memory is still passed through, after one classification */
	{
		char host[4096];
		struct ibv_mr *h = ibv_reg_mr(pd, host, sizeof(host), IBV_ACCESS_LOCAL_WRITE);

		CHECK(h && !cached(h), "host memory still goes to libibverbs untouched");
		if (h)
			ibv_dereg_mr(h);
	}
}

static void test_access_and_iova(void)
{
	char *buf = gpu_alloc(65536);
	volatile int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	uint64_t reg0 = fcount("reg"), dereg0;
	struct ibv_mr *a, *b, *c, *d;
	uint64_t iova = 0;
	int acc = 0;

	a = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	b = ibv_reg_mr(pd, buf, 4096, access); /* not a constant: ibv_reg_mr_iova2@1.8 */
	CHECK(cached(a) && cached(b) && a->lkey != b->lkey && fcount("reg") == reg0 + 2,
	      "entries per access flags (through ibv_reg_mr and ibv_reg_mr_iova2)");
	c = ibv_reg_mr_iova(pd, buf, 4096, (uintptr_t)buf,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* ibv_reg_mr_iova@1.7 */
	CHECK(cached(c) && c->lkey == b->lkey && fcount("reg") == reg0 + 2,
	      "ibv_reg_mr_iova with iova == addr is served from the cache");
	d = ibv_reg_mr_iova(pd, buf, 4096, 0x10000, access);
	CHECK(d && fis_mr(d) && finfo(d, &acc, &iova) == 0 && iova == 0x10000 && acc == access,
	      "iova != addr passes through unchanged");
	dereg0 = fcount("dereg");
	CHECK(ibv_dereg_mr(d) == 0 && fcount("dereg") == dereg0 + 1,
	      "its ibv_dereg_mr reaches libibverbs");
	ibv_dereg_mr(a);
	ibv_dereg_mr(b);
	ibv_dereg_mr(c);
	a = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(a && fis_mr(a), "IBV_ACCESS_ON_DEMAND passes through");
	ibv_dereg_mr(a);
	gpu_free(buf);
}

static void test_host(void)
{
	void *h = malloc(8192);
	uint64_t dereg0 = fcount("dereg");
	struct ibv_mr *mr = ibv_reg_mr(pd, h, 8192, IBV_ACCESS_LOCAL_WRITE);
	uint64_t iova = 0;
	int acc = 0;

	CHECK(mr && fis_mr(mr) && mr->addr == h && finfo(mr, &acc, &iova) == 0 &&
	      iova == (uintptr_t)h, "host memory: libibverbs' own MR, unchanged");
	CHECK(ibv_dereg_mr(mr) == 0 && fcount("dereg") == dereg0 + 1, "and its own ibv_dereg_mr");
	free(h);
}

static void test_stale(void)
{
	char *buf = gpu_alloc(65536), *again;
	uint64_t reg0 = fcount("reg");
	struct ibv_mr *a = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE), *b;
	uint32_t lkey = a ? a->lkey : 0;

	ibv_dereg_mr(a);
	gpu_free(buf);
	again = gpu_alloc(65536);
	CHECK(again == buf, "the fake driver hands the freed address out again (as CUDA does)");
	b = ibv_reg_mr(pd, again, 65536, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cached(b) && b->lkey != lkey && fcount("reg") == reg0 + 2,
	      "the new buffer at the same address gets a new MR, never the freed one's");
	ibv_dereg_mr(b);
	gpu_free(again);
}

static void test_dealloc_pd(void)
{
	char *buf = gpu_alloc(65536);
	struct ibv_pd *p = ibv_alloc_pd(ctx), *q;
	struct ibv_mr *mr = ibv_reg_mr(p, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint64_t reg0;

	CHECK(cached(mr) && ibv_dealloc_pd(p) == EBUSY,
	      "ibv_dealloc_pd while the program holds an MR on the PD: EBUSY, as without the cache");
	ibv_dereg_mr(mr);
	CHECK(flive(p) == 1, "released, the cached MR stays registered on the PD");
	CHECK(ibv_dealloc_pd(p) == 0 && flive(p) == 0,
	      "ibv_dealloc_pd succeeds: the cache released its MRs for the PD first");
	q = ibv_alloc_pd(ctx);
	reg0 = fcount("reg");
	mr = ibv_reg_mr(q, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(q == p, "a new PD at the freed one's address (the fake reuses it, as malloc may)");
	CHECK(cached(mr) && mr->pd == q && fcount("reg") == reg0 + 1,
	      "a new PD at the same address gets a new MR");
	ibv_dereg_mr(mr);
	CHECK(ibv_dealloc_pd(q) == 0, "and is deallocated");
	gpu_free(buf);
}

static void test_close_device(void)
{
	struct ibv_context *c = open_ctx();
	struct ibv_pd *p = c ? ibv_alloc_pd(c) : NULL;
	char *b1 = gpu_alloc(65536), *b2 = gpu_alloc(65536);
	struct ibv_mr *held = ibv_reg_mr(p, b1, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *idle = ibv_reg_mr(p, b2, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint64_t left0 = fcount("close_left"), dereg_bad0 = fcount("dereg_bad");

	CHECK(cached(held) && cached(idle), "two cached MRs on a second device");
	ibv_dereg_mr(idle);
	CHECK(ibv_close_device(c) == 0, "ibv_close_device with an MR still held returns 0");
	CHECK(fcount("close_left") == left0,
	      "no MR of the cache was left registered when the device closed");
	CHECK(ibv_dereg_mr(held) == 0 && fcount("dereg_bad") == dereg_bad0,
	      "the held MR's later ibv_dereg_mr returns 0 and touches nothing of the closed device");
	gpu_free(b1);
	gpu_free(b2);
}

static void test_rereg(void)
{
	char *g1 = gpu_alloc(65536), *g2 = gpu_alloc(65536);
	char *h = malloc(4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, g1, 4096, IBV_ACCESS_LOCAL_WRITE), *ref, *plain;
	uint64_t dereg0, rereg0;
	unsigned live0;
	int rc;

	ref = ibv_reg_mr(pd, g2, 4096, IBV_ACCESS_LOCAL_WRITE);
	rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, g2, 2048, 0);
	CHECK(rc == 0 && cached(mr) && mr->addr == g2 && mr->length == 2048 && mr->lkey == ref->lkey,
	      "ibv_rereg_mr of a shadow onto another GPU buffer: the same struct, the new keys");
	errno = 0;
	rc = ibv_rereg_mr(mr, 0x100, NULL, NULL, 0, 0);
	CHECK(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "unknown flags: ERR_INPUT, EINVAL");
	rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, h, 4096, 0);
	CHECK(rc == 0 && mr->addr == h && mr->length == 4096 && !fis_mr(mr),
	      "onto host memory: the program keeps its struct, now backed by a real MR");
	rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(rc == 0 && mr->addr == h, "changing only the access keeps the range");
	dereg0 = fcount("dereg");
	CHECK(ibv_dereg_mr(mr) == 0 && fcount("dereg") == dereg0 + 1 && fcount("dereg_bad") == 0,
	      "its ibv_dereg_mr deregisters that real MR");
	/* What the provider says goes: flags 0 is refused by the kernel; a provider without rereg
	 * (rxe, siw) refuses everything. The shadow stays as it was, no MR is left behind. */
	live0 = flive(NULL);
	errno = 0;
	rc = ibv_rereg_mr(ref, 0, NULL, NULL, 0, 0);
	CHECK(rc == IBV_REREG_MR_ERR_CMD && errno == EINVAL && flive(NULL) == live0,
	      "flags 0: IBV_REREG_MR_ERR_CMD, EINVAL, as the provider answers (%d, %d)", rc, errno);
	fset_rereg(0);
	errno = 0;
	rc = ibv_rereg_mr(ref, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, g1, 4096, 0);
	CHECK(rc == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP && cached(ref) && ref->addr == g2 &&
	      ref->length == 4096 && flive(NULL) == live0,
	      "a provider without rereg: refused as it refuses (ERR_CMD, EOPNOTSUPP), MR unchanged");
	fset_rereg(1);
	plain = ibv_reg_mr(pd, h, 4096, IBV_ACCESS_LOCAL_WRITE);
	rereg0 = fcount("rereg");
	rc = ibv_rereg_mr(plain, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rc == 0 && fcount("rereg") == rereg0 + 1, "ibv_rereg_mr of a real MR passes through");
	ibv_dereg_mr(plain);
	ibv_dereg_mr(ref);
	free(h);
	gpu_free(g1);
	gpu_free(g2);
}

static void test_dmabuf(void)
{
	uint64_t d0 = fcount("dmabuf"), dereg0;
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, 4096, 0x20000, 0, IBV_ACCESS_LOCAL_WRITE);

	CHECK(mr && fis_mr(mr) && fcount("dmabuf") == d0 + 1, "ibv_reg_dmabuf_mr passes through");
	dereg0 = fcount("dereg");
	CHECK(ibv_dereg_mr(mr) == 0 && fcount("dereg") == dereg0 + 1, "and so does its release");
}

static void test_compat_1_0(void)
{
	struct ibv_mr *(*reg_1_0)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_1_0)(struct ibv_mr *);
	char *buf = gpu_alloc(65536);
	uint64_t r0 = fcount("reg_1_0"), d0 = fcount("dereg_1_0");
	struct ibv_mr *mr;
	Dl_info info = { 0 };

	*(void **)&reg_1_0 = dlvsym(RTLD_DEFAULT, "ibv_reg_mr", "IBVERBS_1.0");
	*(void **)&dereg_1_0 = dlvsym(RTLD_DEFAULT, "ibv_dereg_mr", "IBVERBS_1.0");
	CHECK(reg_1_0 && dladdr((void *)reg_1_0, &info) &&
	      strstr(info.dli_fname, "libgdrcache-preload"), "ibv_reg_mr@IBVERBS_1.0 is the preload's");
	if (!reg_1_0 || !dereg_1_0)
		return;
	mr = reg_1_0(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cached(mr) && fcount("reg_1_0") == r0 + 1,
	      "it forwards to libibverbs' 1.0 function, whose 1.1 call comes back to the cache");
	CHECK(dereg_1_0(mr) == 0 && fcount("dereg_1_0") == d0 + 1 && fcount("dereg_bad") == 0,
	      "ibv_dereg_mr@IBVERBS_1.0 releases the shadow the same way");
	gpu_free(buf);
}

static void test_fork(void)
{
	char *buf = gpu_alloc(65536);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
	int status = -1;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct ibv_mr *m2;
		uint64_t d0;

		alarm(alarm_s); /* a hang is a failure */
		m2 = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
		CHECK(m2 && fis_mr(m2), "child of fork(): registrations pass through");
		d0 = fcount("dereg");
		CHECK(ibv_dereg_mr(m2) == 0 && fcount("dereg") == d0 + 1, "child: their release too");
		d0 = fcount("dereg");
		CHECK(ibv_dereg_mr(mr) == 0 && fcount("dereg") == d0 && fcount("dereg_bad") == 0,
		      "child: releasing an MR inherited from the parent's cache touches nothing");
		CHECK(ibv_dereg_mr(mr) == EINVAL && fcount("dereg") == d0 && fcount("dereg_bad") == 0,
		      "child: releasing it again is refused, EINVAL, and reaches nothing either");
		fflush(stdout);
		_exit(failures ? 1 : 0);
	}
	if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) &&
	    WTERMSIG(status) == SIGALRM)
		printf("# the child hung: killed by its alarm\n");
	CHECK(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the child passed (status %#x)", status);
	CHECK(cached(mr) && ibv_dereg_mr(mr) == 0, "parent: its MR is still its own to release");
	gpu_free(buf);
}

#define THREADS 4
#define ITERS 2000
static char *tbufs[THREADS];

static void *thread_main(void *arg)
{
	long t = (long)arg, bad = 0;

	for (int i = 0; i < ITERS; i++) {
		char *b = tbufs[(t + i) % THREADS];
		struct ibv_mr *mr = ibv_reg_mr(pd, b + 512 * (i % 8), 512, IBV_ACCESS_LOCAL_WRITE);

		bad += !cached(mr) || mr->addr != b + 512 * (i % 8);
		bad += ibv_dereg_mr(mr) != 0;
	}
	return (void *)bad;
}

static void test_threads(void)
{
	pthread_t th[THREADS];
	long bad = 0;
	void *r;

	for (int i = 0; i < THREADS; i++)
		tbufs[i] = gpu_alloc(65536);
	for (long i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, thread_main, (void *)i);
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], &r);
		bad += (long)r;
	}
	CHECK(bad == 0 && fcount("dereg_bad") == 0, "%d threads x %d shadow reg/dereg: %ld bad",
	      THREADS, ITERS, bad);
	for (int i = 0; i < THREADS; i++)
		gpu_free(tbufs[i]);
}

/* A successful registration or release through the cache leaves errno as the program had it,
 * hit or miss: the hit path saves none (nothing on it may touch errno). Among them a thread's first
 * registration (its counters, its shadow records), records refilled while many are held, and
 * records given back past what a thread keeps. */
static void *errno_thread(void *arg)
{
	struct ibv_mr *mr;
	long bad = 0;

	errno = EDOM;
	mr = ibv_reg_mr(pd, arg, 4096, IBV_ACCESS_LOCAL_WRITE);
	bad += !cached(mr) || errno != EDOM;
	bad += ibv_dereg_mr(mr) != 0 || errno != EDOM;
	return (void *)bad;
}

static void test_errno_kept(void)
{
	enum { N = 200 };
	char *buf = gpu_alloc(N * 4096), host[4096];
	struct ibv_mr *m[N], *h;
	pthread_t th;
	int bad_reg = 0, bad_dereg = 0;
	void *r = (void *)1;

	for (int i = 0; i < N; i++) {
		errno = EDOM; /* the first a miss, the rest hits */
		m[i] = ibv_reg_mr(pd, buf + i * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
		bad_reg += !cached(m[i]) || errno != EDOM;
	}
	for (int i = 0; i < N; i++) {
		errno = EDOM;
		bad_dereg += ibv_dereg_mr(m[i]) != 0 || errno != EDOM;
	}
	CHECK(bad_reg == 0 && bad_dereg == 0,
	      "%d cached registrations held, then released: errno kept (%d / %d changed or failed)",
	      N, bad_reg, bad_dereg);
	CHECK(pthread_create(&th, NULL, errno_thread, buf) == 0 && pthread_join(th, &r) == 0 &&
	      r == NULL, "a new thread's first registration and release keep errno");
	errno = EDOM;
	h = ibv_reg_mr(pd, host, sizeof(host), IBV_ACCESS_LOCAL_WRITE);
	CHECK(h && fis_mr(h) && errno == EDOM, "host memory, passed through: errno kept");
	if (h)
		ibv_dereg_mr(h);
	gpu_free(buf);
}

static void test_disabled(void)
{
	char *buf = gpu_alloc(65536);
	uint64_t d0 = fcount("dereg");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);

	CHECK(mr && fis_mr(mr) && mr->addr == buf, "GDRCACHE_DISABLE=1: a GPU buffer passes through");
	CHECK(ibv_dereg_mr(mr) == 0 && fcount("dereg") == d0 + 1, "and so does its release");
	gpu_free(buf);
}

int main(int argc, char **argv)
{
	void *cuctx;
	uint64_t left0;

	if (argc > 1 && !strcmp(argv[1], "--bind-only"))
		return 0;
	disabled = argc > 1 && !strcmp(argv[1], "--disabled");
	setvbuf(stdout, NULL, _IOLBF, 0);
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&flive = dlsym(RTLD_DEFAULT, "fake_ibv_live_mrs");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	*(void **)&finfo = dlsym(RTLD_DEFAULT, "fake_ibv_mr_info");
	*(void **)&fset_rereg = dlsym(RTLD_DEFAULT, "fake_ibv_set_rereg");
	if (!fcount || !flive || !fis_mr || !finfo || !fset_rereg) {
		printf("test_preload: not running over the fake libibverbs (LD_LIBRARY_PATH)\n");
		return 77;
	}
	if (cuInit(0) || cuDevicePrimaryCtxRetain(&cuctx, 0) || cuCtxSetCurrent(cuctx)) {
		printf("not ok - the fake CUDA driver did not start\n");
		return 1;
	}
	fake_cuda_set_threads_have_context(true);
	ctx = open_ctx();
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		printf("not ok - the fake device did not open\n");
		return 1;
	}
	test_interposed();
	if (disabled) {
		test_disabled();
	} else {
		test_cached();
		test_double_dereg();
		test_hit_without_driver_call();
		test_access_and_iova();
		test_host();
		test_stale();
		test_dealloc_pd();
		test_close_device();
		test_rereg();
		test_dmabuf();
		test_compat_1_0();
		test_threads();
		test_errno_kept();
		test_fork();
	}
	left0 = fcount("close_left");
	CHECK(ibv_dealloc_pd(pd) == 0, "the main PD deallocates while the cache held MRs on it");
	CHECK(ibv_close_device(ctx) == 0 && fcount("close_left") == left0, "the device closes clean");
	printf("%s: %d failed\n", argv[0], failures);
	return failures ? 1 : 0;
}
