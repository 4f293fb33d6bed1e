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
#include <sys/mman.h>
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
int cuMemGetHandleForAddressRange(void *handle, uint64_t dptr, size_t size, int type,
				  unsigned long long flags);

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

/* cuMemGetHandleForAddressRange(DMA_BUF_FD) of [va, va + size), as NCCL calls it: an fd or -1. */
static int export_dmabuf(const void *va, size_t size)
{
	int fd = -1;

	return cuMemGetHandleForAddressRange(&fd, (uintptr_t)va, size, 1, 0) ? -1 : fd;
}

/* Real registrations so far: every MR the fake makes, through ibv_reg_mr (the peermem backend's)
 * or ibv_reg_dmabuf_mr (the dmabuf backend's), is counted as "reg". */
static uint64_t real_regs(void)
{
	return fcount("reg");
}

/* A dma-buf exported before the library watched the driver's exports (main, before any
 * registration made the cache). */
static int early_fd = -1;
static char *early_buf;

#define DB_BUFS 4
#define DB_ROUNDS 5

/* NCCL's registration (src/transport/net_ib: ncclIbRegMrDmaBufInternal): the range's pages
 * exported, a fresh fd each time, registered with offset = addr - base, iova = addr, the fd
 * closed; released at the end. Served by the cache: one real registration an allocation, in the
 * first round; hits from the second round on, though every fd is new. */
static void test_dmabuf_nccl(void)
{
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	char *bufs[DB_BUFS];
	struct ibv_mr *mr[DB_ROUNDS][DB_BUFS] = { { NULL } }, *probe, *ref;
	uint64_t r0, round0 = 0;
	int bad_shape = 0, not_cached = 0, bad_keys = 0, deregs = 0;

	/* NCCL's probe of dma-buf support first: fd -1, nothing to vouch for, the provider answers */
	errno = 0;
	probe = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
	CHECK(!probe && errno == EBADF, "NCCL's dma-buf probe (fd -1) gets the provider's answer");
	for (int b = 0; b < DB_BUFS; b++)
		bufs[b] = gpu_alloc(1 << 20);
	r0 = real_regs();
	for (int round = 0; round < DB_ROUNDS; round++) {
		for (int b = 0; b < DB_BUFS; b++) {
			/* a buffer inside the allocation, as a tensor would be (remote access: its
			 * MR's keys are bounded to it, so each round registers the same range) */
			char *addr = bufs[b] + 12288 + 100;
			char *base = bufs[b] + 12288; /* page-aligned start of the exported pages */
			size_t size = 65536, len = 65536 - 100;
			int fd = export_dmabuf(base, size);
			struct ibv_mr *m;

			m = fd < 0 ? NULL
				   : ibv_reg_dmabuf_mr(pd, (uint64_t)(addr - base), len,
						       (uintptr_t)addr, fd, access);
			if (fd >= 0)
				close(fd);
			mr[round][b] = m;
			not_cached += !cached(m);
			bad_shape += !m || m->addr != (void *)(uintptr_t)(addr - base) ||
				     m->length != len || m->pd != pd || m->context != ctx;
			ref = cached(m) ? ibv_reg_mr(pd, addr, len, access) : NULL;
			bad_keys += !cached(ref) || ref->lkey != m->lkey || ref->rkey != m->rkey;
			if (ref)
				ibv_dereg_mr(ref);
		}
		if (round == 0)
			round0 = real_regs() - r0;
	}
	CHECK(not_cached == 0, "%d rounds x %d buffers of NCCL's sequence: every MR a shadow (%d not)",
	      DB_ROUNDS, DB_BUFS, not_cached);
	CHECK(bad_shape == 0, "each answers for the caller's offset (its addr), length, pd (%d bad)",
	      bad_shape);
	CHECK(bad_keys == 0, "each has the keys ibv_reg_mr of the same address gets (%d differ)",
	      bad_keys);
	CHECK(round0 <= DB_BUFS && real_regs() - r0 == round0,
	      "real registrations: %llu in round 1, none after (%llu in all)",
	      (unsigned long long)round0, (unsigned long long)(real_regs() - r0));
	for (int round = 0; round < DB_ROUNDS; round++)
		for (int b = 0; b < DB_BUFS; b++)
			deregs += mr[round][b] && ibv_dereg_mr(mr[round][b]) == 0;
	CHECK(deregs == DB_ROUNDS * DB_BUFS && fcount("dereg_bad") == 0,
	      "ibv_dereg_mr releases every one (%d of %d)", deregs, DB_ROUNDS * DB_BUFS);
	errno = 0;
	CHECK(ibv_rereg_mr(mr[0][0] = ibv_reg_dmabuf_mr(pd, 0, 4096, (uintptr_t)bufs[0] + 12288,
							  export_dmabuf(bufs[0] + 12288, 4096),
							  access),
			   IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, access) ==
		      IBV_REREG_MR_ERR_INPUT &&
		      errno == EOPNOTSUPP && cached(mr[0][0]),
	      "ibv_rereg_mr of a cached dma-buf MR: refused, EOPNOTSUPP, the MR unchanged");
	if (mr[0][0])
		ibv_dereg_mr(mr[0][0]);
	for (int b = 0; b < DB_BUFS; b++)
		gpu_free(bufs[b]);
}

/* An fd the library cannot vouch for passes through to libibverbs, counted, whatever iova says. */
static void test_dmabuf_unvouched(void)
{
	char *a = gpu_alloc(1 << 20), *b = gpu_alloc(1 << 20);
	uint64_t d0;
	struct ibv_mr *m;
	int fd, fd2, forged;

	/* a file that is no dma-buf, given the address of GPU memory as iova */
	forged = memfd_create("forged-dmabuf", MFD_CLOEXEC);
	CHECK(forged >= 0 && ftruncate(forged, 1 << 20) == 0, "a forged fd (memfd)");
	d0 = fcount("dmabuf");
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)a, forged, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && fis_mr(m) && fcount("dmabuf") == d0 + 1, "a forged fd passes through");
	if (m)
		ibv_dereg_mr(m);
	/* a dma-buf of a, registered as if it were b's */
	fd = export_dmabuf(a, 65536);
	d0 = fcount("dmabuf");
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)b, fd, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && fis_mr(m) && fcount("dmabuf") == d0 + 1,
	      "an fd of one range with another range's iova passes through");
	if (m)
		ibv_dereg_mr(m);
	m = ibv_reg_dmabuf_mr(pd, 65536, 4096, (uintptr_t)a + 65536, fd, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && fis_mr(m), "a request past the exported range passes through");
	if (m)
		ibv_dereg_mr(m);
	/* the fd number reused: first by b's dma-buf, then by a file that is no dma-buf */
	close(fd);
	fd2 = export_dmabuf(b, 65536);
	CHECK(fd2 == fd, "the fd number is reused by the next export (%d, %d)", fd, fd2);
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)a, fd2, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && fis_mr(m), "the reused number with the old range's iova passes through");
	if (m)
		ibv_dereg_mr(m);
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)b, fd2, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cached(m), "with its own range's iova it is served by the cache");
	if (m)
		ibv_dereg_mr(m);
	close(fd2);
	close(forged);
	fd = export_dmabuf(a, 65536); /* recorded, then closed: its number goes to a memfd */
	close(fd);
	forged = memfd_create("forged-dmabuf", MFD_CLOEXEC);
	CHECK(forged == fd, "a memfd takes a closed dma-buf's number (%d, %d)", fd, forged);
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)a, forged, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && fis_mr(m), "a closed dma-buf's number on another file passes through");
	if (m)
		ibv_dereg_mr(m);
	close(forged);
	/* exported before the library watched */
	m = early_fd < 0 ? NULL
			 : ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)early_buf, early_fd,
					     IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && fis_mr(m), "a dma-buf exported before the cache existed passes through");
	if (m)
		ibv_dereg_mr(m);
	gpu_free(a);
	gpu_free(b);
}

/* Freed memory is released inside its free, dma-buf MRs too; and a dma-buf of the freed memory,
 * still open, is not vouched for afterwards, even once the address holds new memory. */
static void test_dmabuf_free(void)
{
	char *a = gpu_alloc(1 << 20), *again;
	struct ibv_mr *m;
	uint64_t d0;
	unsigned live0;
	int fd = export_dmabuf(a, 65536), held = export_dmabuf(a, 65536);

	m = ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)a, fd, IBV_ACCESS_LOCAL_WRITE);
	close(fd);
	CHECK(cached(m) && ibv_dereg_mr(m) == 0, "a dma-buf MR, released: the cache keeps it");
	live0 = flive(pd);
	d0 = fcount("dereg");
	gpu_free(a);
	CHECK(flive(pd) < live0 && fcount("dereg") > d0,
	      "the free of its memory deregistered the cached MR before it returned (%u -> %u)",
	      live0, flive(pd));
	again = gpu_alloc(1 << 20);
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, (uintptr_t)a, held, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && fis_mr(m), "a dma-buf of freed memory passes through (the address is %s)",
	      again == a ? "reused" : "not reused");
	if (m)
		ibv_dereg_mr(m);
	close(held);
	gpu_free(again);
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
	early_buf = gpu_alloc(1 << 20);
	early_fd = early_buf ? export_dmabuf(early_buf, 65536) : -1;
	test_interposed();
	if (disabled) {
		test_disabled();
	} else {
		test_dmabuf_nccl(); /* first: its probe is what makes the cache */
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
		test_dmabuf_unvouched();
		test_dmabuf_free();
		test_compat_1_0();
		test_threads();
		test_errno_kept();
		test_fork();
	}
	if (early_fd >= 0)
		close(early_fd);
	gpu_free(early_buf);
	left0 = fcount("close_left");
	CHECK(ibv_dealloc_pd(pd) == 0, "the main PD deallocates while the cache held MRs on it");
	CHECK(ibv_close_device(ctx) == 0 && fcount("close_left") == left0, "the device closes clean");
	printf("%s: %d failed\n", argv[0], failures);
	return failures ? 1 : 0;
}
