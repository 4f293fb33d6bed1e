/* SPDX-License-Identifier: MIT */
/*
 * Checks of libgdrcache-preload.so's hit path and its edges, over the fake libibverbs
 * (LD_LIBRARY_PATH) and the fake CUDA driver; edges_test.sh's "prog" mode runs it (backends
 * peermem and dmabuf, validation modes auto and tag). Each check prints "ok"/"not ok"; exit 0
 * only if all passed, 77 not over the fakes.
 *  - access flags that change what the keys mean must not be served from a shared (wide) MR:
 *    IBV_ACCESS_ZERO_BASED (offsets from the start of the caller's range; through ibv_reg_mr and
 *    ibv_reg_mr_ex), and access bits the library reads as its own (GDR_ACCESS_WIDE_MR: bit 30)
 *    which a program can pass;
 *  - remote access is bounded to the range asked, also after ibv_rereg_mr changes the access;
 *    REMOTE_READ never gets a REMOTE_WRITE request's MR;
 *  - held shadows keep their MRs registered (more exact ranges than an entry keeps, many
 *    allocations);
 *  - a shadow held while its GPU buffer is freed and another allocated at the same address, one
 *    whose neighbour in the same 64 KiB page stays held, pool memory, another thread's last hit:
 *    the new registration never gets the old MR;
 *  - threads that exit with free records: their records are reused; threads made and gone by the
 *    thousand: the heap does not grow with them;
 *  - zero and wrapping lengths as libibverbs answers; ibv_reg_mr_ex's masks; ibv_rereg_mr onto
 *    host memory then two releases, and onto another PD then ibv_dealloc_pd of that PD;
 *  - a PD deallocated (at once, after EBUSY for a shadow or for a host MR held) and another at
 *    its address: the same range gets an MR of the new PD; a PD allocated at a deallocated one's
 *    address by another thread while ibv_dealloc_pd returns, and a device closed while another
 *    thread re-registers a shadow on it: no MR of the cache outlives its PD or device.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "deadline.h"
#include "fake_cuda.h"
#include "check.h"
#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

static uint64_t (*fcount)(const char *);
static unsigned (*flive)(const struct ibv_pd *);
static int (*fis_mr)(const struct ibv_mr *);
static int (*finfo)(const struct ibv_mr *, int *, uint64_t *);
static void (*fhooks)(void (*)(struct ibv_pd *), void (*)(struct ibv_mr *));

static struct ibv_context *ctx;
static struct ibv_pd *pd;

#define LW IBV_ACCESS_LOCAL_WRITE
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static char *gpu_alloc(size_t size)
{
	uint64_t p = 0;

	return cuMemAlloc_v2(&p, size) ? NULL : (char *)(uintptr_t)p;
}

static void gpu_free(void *p)
{
	cuMemFree_v2((uintptr_t)p);
}

static bool cached(const struct ibv_mr *mr)
{
	return mr && !fis_mr(mr);
}

/* Two registrations whose keys name different bytes at the same offsets must not share an MR:
 * IBV_ACCESS_ZERO_BASED addresses the MR by byte offset from the start of the caller's range, so
 * offset 0 of [buf, +4K) and offset 0 of [buf + 8K, +4K) are different bytes. Without the preload
 * each is an MR of its own; a shared whole-allocation MR makes offset 0 the allocation's start. */
static void test_zero_based(void)
{
	char *buf = gpu_alloc(65536);
	volatile int zb = LW | IBV_ACCESS_ZERO_BASED;
	struct ibv_mr *a = ibv_reg_mr(pd, buf, 4096, zb);
	struct ibv_mr *b = ibv_reg_mr(pd, buf + 8192, 4096, zb);

	CHECK(a && b, "ibv_reg_mr with IBV_ACCESS_ZERO_BASED succeeds (%p, %p)", (void *)a,
	      (void *)b);
	CHECK(a && b && a->lkey != b->lkey,
	      "two zero-based MRs of different ranges of one allocation have different lkeys "
	      "(%#x, %#x): offset 0 is a different byte in each",
	      a ? a->lkey : 0, b ? b->lkey : 0);
	if (b && fis_mr(b)) {
		int acc = 0;
		uint64_t iova = 0;

		CHECK(finfo(b, &acc, &iova) == 0 && acc == zb, "passed through with its access");
	}
	if (a)
		ibv_dereg_mr(a);
	if (b)
		ibv_dereg_mr(b);
	gpu_free(buf);
}

/* A program's access bits 29 and 30 are its own (bit 29 lies in rdma-core's optional range,
 * IBV_ACCESS_OPTIONAL_RANGE): the preload must not let the library read them as
 * GDR_REG_CACHED_ONLY or GDR_ACCESS_WIDE_MR. With remote access, bit 30 read as WIDE_MR hands the
 * peer an rkey reaching the whole allocation instead of the range registered. */
static void test_library_bits(void)
{
	char *buf = gpu_alloc(65536);
	volatile int wide = RW | (1 << 30);
	struct ibv_mr *a = ibv_reg_mr(pd, buf, 4096, wide);
	struct ibv_mr *b = ibv_reg_mr(pd, buf + 8192, 4096, wide);

	CHECK(a && b, "remote access | bit 30 registers (%p, %p)", (void *)a, (void *)b);
	CHECK(a && b && a->rkey != b->rkey,
	      "remote access with bit 30: each range its own rkey (%#x, %#x), never one reaching the "
	      "whole allocation",
	      a ? a->rkey : 0, b ? b->rkey : 0);
	if (a)
		ibv_dereg_mr(a);
	if (b)
		ibv_dereg_mr(b);
	gpu_free(buf);
}

/* Remote access: bounded to the range (two sub-ranges, two rkeys); local access shares one MR.
 * And a shadow re-registered to remote access gets keys bounded to its range too. */
static void test_remote_bounded(void)
{
	char *buf = gpu_alloc(1 << 20);
	volatile int rw = RW;
	struct ibv_mr *l1 = ibv_reg_mr(pd, buf, 4096, LW), *l2 = ibv_reg_mr(pd, buf + 65536, 4096, LW);
	struct ibv_mr *r1 = ibv_reg_mr(pd, buf, 4096, rw), *r2 = ibv_reg_mr(pd, buf + 65536, 4096, rw);
	struct ibv_mr *r3;
	int rc;

	CHECK(cached(l1) && cached(l2), "local access: two ranges cached");
	CHECK(cached(r1) && cached(r2) && r1->rkey != r2->rkey && r1->rkey != l1->rkey,
	      "remote access: each range its own rkey");
	rc = ibv_rereg_mr(l2, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, rw);
	CHECK(rc == 0 && l2->addr == buf + 65536 && l2->length == 4096 && l2->rkey == r2->rkey &&
		      l2->rkey != l1->rkey,
	      "a shadow re-registered to remote access: the rkey of exactly its range (%d)", rc);
	r3 = ibv_reg_mr(pd, buf + 4096, 4096, rw);
	CHECK(cached(r3) && r3->rkey != r1->rkey && r3->rkey != r2->rkey,
	      "another range, remote: another rkey");
	CHECK(ibv_dereg_mr(l1) == 0 && ibv_dereg_mr(l2) == 0 && ibv_dereg_mr(r1) == 0 &&
		      ibv_dereg_mr(r2) == 0 && ibv_dereg_mr(r3) == 0 && fcount("dereg_bad") == 0,
	      "all released");
	gpu_free(buf);
}

/* A shadow held while its buffer is freed and another is allocated at the same address. */
static void test_stale_held(void)
{
	char *buf = gpu_alloc(65536), *again;
	struct ibv_mr *a = ibv_reg_mr(pd, buf, 65536, LW), *b;
	uint32_t lkey = a ? a->lkey : 0;

	CHECK(cached(a), "cached");
	gpu_free(buf);
	again = gpu_alloc(65536);
	CHECK(again == buf, "the freed address is handed out again");
	b = ibv_reg_mr(pd, again, 65536, LW);
	CHECK(b && b->lkey != lkey,
	      "the new buffer never gets the held, freed one's MR (%#x vs %#x)", b ? b->lkey : 0,
	      lkey);
	if (b)
		ibv_dereg_mr(b);
	CHECK(ibv_dereg_mr(a) == 0 && ibv_dereg_mr(a) == EINVAL,
	      "the held shadow of the freed buffer: released once, then refused");
	gpu_free(again);
}

/* A wait for another thread, or for the fake's hook to run: microseconds, waited for tens of
 * seconds (times GDR_TEST_WAIT_SCALE). */
#define WAIT_MS 60000

/* sem_wait until the deadline (gdr_deadline_ms). Past it: "not ok - what", and the program ends
 * (a thread stuck in the library cannot be waited for, nor exit() run beside it). */
static void sem_wait_until(sem_t *sem, int64_t deadline, const char *what)
{
	struct timespec ts = gdr_deadline_realtime(deadline);

	while (sem_timedwait(sem, &ts)) {
		if (errno == EINTR)
			continue;
		printf("not ok - %s (not within %lld s)\n", what,
		       (long long)(WAIT_MS / 1000 * gdr_deadline_scale()));
		fflush(stdout);
		_exit(1);
	}
}

/* A thread whose last hit was the freed buffer. */
static char *sbuf;
static uint32_t seen_lkey;
static pthread_barrier_t sbar;

static void *stale_thread(void *arg)
{
	struct ibv_mr *m;

	(void)arg;
	for (int i = 0; i < 100; i++) {
		m = ibv_reg_mr(pd, sbuf + 4096, 4096, LW);
		if (m) {
			seen_lkey = m->lkey;
			ibv_dereg_mr(m);
		}
	}
	pthread_barrier_wait(&sbar); /* main frees and reallocates */
	pthread_barrier_wait(&sbar);
	m = ibv_reg_mr(pd, sbuf + 4096, 4096, LW);
	CHECK(m && m->lkey != seen_lkey,
	      "another thread, whose last hit was the freed buffer: a new MR (%#x vs %#x)",
	      m ? m->lkey : 0, seen_lkey);
	if (m)
		ibv_dereg_mr(m);
	return NULL;
}

static void test_stale_thread(void)
{
	pthread_t th;
	char *again;

	sbuf = gpu_alloc(65536);
	pthread_barrier_init(&sbar, NULL, 2);
	pthread_create(&th, NULL, stale_thread, NULL);
	pthread_barrier_wait(&sbar);
	gpu_free(sbuf);
	again = gpu_alloc(65536);
	CHECK(again == sbuf, "the freed address is handed out again");
	pthread_barrier_wait(&sbar);
	pthread_join(th, NULL);
	pthread_barrier_destroy(&sbar);
	gpu_free(again);
}

/* Threads that exit with free records: one at a time, each holding NLIVE shadows at once. An
 * exiting thread's records go back for the next: the shadows handed out over all the rounds are
 * bounded by what one thread holds and keeps (NLIVE + GDRP_REC_KEEP + a batch), not by the rounds
 * (a leak would make NLIVE or more new records a round). */
#define NLIVE 40
#define NROUNDS 50
static char *tbuf;
static struct ibv_mr *seen[4096];
static unsigned nseen;

static void *exit_thread(void *arg)
{
	struct ibv_mr *m[NLIVE];

	(void)arg;
	for (int i = 0; i < NLIVE; i++)
		m[i] = ibv_reg_mr(pd, tbuf + i * 4096, 4096, LW);
	for (int i = 0; i < NLIVE; i++) {
		bool known = false;

		if (!cached(m[i]))
			continue;
		for (unsigned j = 0; j < nseen && !known; j++)
			known = seen[j] == m[i];
		if (!known && nseen < 4096)
			seen[nseen++] = m[i];
	}
	for (int i = 0; i < NLIVE; i++)
		if (m[i])
			ibv_dereg_mr(m[i]);
	return NULL;
}

static void test_thread_exit(void)
{
	tbuf = gpu_alloc(NLIVE * 4096);
	for (long r = 0; r < NROUNDS; r++) {
		pthread_t th;

		pthread_create(&th, NULL, exit_thread, (void *)r);
		pthread_join(th, NULL);
	}
	CHECK(nseen > 0 && nseen <= NLIVE + 64 + 32,
	      "%d threads in turn, each exiting with its free records: later threads reuse them "
	      "(%u distinct shadows in all)",
	      NROUNDS, nseen);
	gpu_free(tbuf);
}

/* Lengths of 0 and ranges that wrap: as libibverbs answers them (the fake: 0 is EINVAL). */
static void test_lengths(void)
{
	char *buf = gpu_alloc(65536);
	struct ibv_mr *m;

	errno = 0;
	m = ibv_reg_mr(pd, buf, 0, LW);
	CHECK(!m && errno == EINVAL, "length 0: libibverbs' EINVAL (%d)", errno);
	m = ibv_reg_mr(pd, buf, SIZE_MAX - 100, LW);
	CHECK(m && fis_mr(m), "a wrapping range: libibverbs' answer, not a shadow");
	if (m)
		ibv_dereg_mr(m);
	m = ibv_reg_mr(pd, buf, 65536 + 4096, LW);
	CHECK(m != NULL, "a range past the allocation's end: registered (%s)",
	      m && fis_mr(m) ? "passed through" : "cached");
	if (m)
		ibv_dereg_mr(m);
	gpu_free(buf);
}

/* ibv_rereg_mr of a shadow onto another PD; that PD then deallocates once the shadow is gone. */
static void test_rereg_pd(void)
{
	char *buf = gpu_alloc(65536);
	struct ibv_pd *p2 = ibv_alloc_pd(ctx);
	struct ibv_mr *m = ibv_reg_mr(pd, buf, 4096, LW);
	int rc;

	CHECK(cached(m) && p2, "a shadow and a second PD");
	rc = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, p2, NULL, 0, 0);
	CHECK(rc == 0 && m->pd == p2 && m->context == ctx, "re-registered onto the second PD (%d)",
	      rc);
	CHECK(ibv_dealloc_pd(p2) == EBUSY, "the second PD is busy while the shadow is held");
	CHECK(ibv_dereg_mr(m) == 0, "released");
	CHECK(ibv_dealloc_pd(p2) == 0 && flive(p2) == 0,
	      "the second PD deallocates: the cache released its MRs on it");
	gpu_free(buf);
}

/* Remote rights are what was asked: REMOTE_READ only never gets the MR of a REMOTE_WRITE request of
 * the same range (keys per access). */
static void test_remote_rights(void)
{
	char *buf = gpu_alloc(65536);
	volatile int rd = LW | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *w = ibv_reg_mr(pd, buf, 4096, RW), *r = ibv_reg_mr(pd, buf, 4096, rd);

	CHECK(cached(w) && cached(r) && w->rkey != r->rkey,
	      "REMOTE_READ and REMOTE_WRITE of one range: two MRs (%#x, %#x)", w ? w->rkey : 0,
	      r ? r->rkey : 0);
	if (w)
		ibv_dereg_mr(w);
	if (r)
		ibv_dereg_mr(r);
	gpu_free(buf);
}

/* Held remote-access shadows of many ranges of one allocation (more than the exact MRs an entry
 * keeps, GDR_EXACT_PER_ENTRY), and held shadows of many allocations (more than
 * GDRCACHE_MAX_ENTRIES where the script sets it): every MR a shadow holds stays registered while
 * it is held (its keys are the program's): libibverbs has at least as many MRs live on the PD as
 * there are distinct keys among the held shadows. */
#define NEXACT 40
#define NALLOC 8
static unsigned distinct_keys(struct ibv_mr **m, int n, bool remote)
{
	unsigned d = 0;

	for (int i = 0; i < n; i++) {
		bool dup = false;

		for (int j = 0; j < i && !dup; j++)
			dup = m[j] && m[i] &&
			      (remote ? m[j]->rkey == m[i]->rkey : m[j]->lkey == m[i]->lkey);
		d += m[i] && !dup;
	}
	return d;
}

static void test_held_stay(void)
{
	char *buf = gpu_alloc(NEXACT * 4096), *g[NALLOC];
	struct ibv_mr *m[NEXACT], *l[NALLOC];
	unsigned live0 = flive(pd), dl;
	uint64_t bad0 = fcount("dereg_bad");
	int bad = 0;

	for (int i = 0; i < NEXACT; i++)
		m[i] = ibv_reg_mr(pd, buf + i * 4096, 4096, RW);
	CHECK(distinct_keys(m, NEXACT, true) == NEXACT,
	      "%d held remote shadows of distinct ranges: distinct rkeys", NEXACT);
	CHECK(flive(pd) >= live0 + NEXACT,
	      "every one's MR is still registered while held (%u live, at least %u expected)",
	      flive(pd), live0 + NEXACT);
	for (int i = 0; i < NALLOC; i++) {
		g[i] = gpu_alloc(65536);
		l[i] = ibv_reg_mr(pd, g[i], 4096, LW);
	}
	dl = distinct_keys(l, NALLOC, false);
	CHECK(flive(pd) >= live0 + NEXACT + dl,
	      "and held shadows of %d allocations (%u distinct lkeys): their MRs too (%u live)",
	      NALLOC, dl, flive(pd));
	for (int i = 0; i < NEXACT; i++)
		bad += !m[i] || ibv_dereg_mr(m[i]) != 0;
	for (int i = 0; i < NALLOC; i++) {
		bad += !l[i] || ibv_dereg_mr(l[i]) != 0;
		gpu_free(g[i]);
	}
	CHECK(bad == 0 && fcount("dereg_bad") == bad0, "all released once (%d bad)", bad);
	gpu_free(buf);
}

/* Two allocations sharing a 64 KiB page, both registered (the cache may serve both from one pin
 * and one MR); the first freed while the second's shadow is held, and a new buffer allocated at
 * its address: the new buffer's registration never gets the freed one's MR. */
static void test_shared_page_stale(void)
{
	char *pad = gpu_alloc(32768), *g0 = gpu_alloc(65536), *g1 = gpu_alloc(65536), *again;
	struct ibv_mr *m0 = ibv_reg_mr(pd, g0, 4096, LW), *m1 = ibv_reg_mr(pd, g1, 4096, LW), *n;
	uint32_t k0 = m0 ? m0->lkey : 0;

	printf("# g0 %p g1 %p: %s MR\n", (void *)g0, (void *)g1,
	       m0 && m1 && m0->lkey == m1->lkey ? "one" : "two");
	CHECK(cached(m0) && cached(m1), "two adjacent allocations cached");
	if (m0)
		ibv_dereg_mr(m0);
	gpu_free(g0);
	again = gpu_alloc(65536);
	n = ibv_reg_mr(pd, again, 4096, LW);
	CHECK(n && (again != g0 || n->lkey != k0),
	      "a new buffer at the freed one's address (%s), the neighbour's shadow held: a new MR "
	      "(%#x vs %#x)",
	      again == g0 ? "same" : "another", n ? n->lkey : 0, k0);
	if (n)
		ibv_dereg_mr(n);
	if (m1)
		ibv_dereg_mr(m1);
	gpu_free(again);
	gpu_free(g1);
	gpu_free(pad);
}

/* A shadow re-registered onto host memory (libibverbs' MR behind it): released once, then EINVAL,
 * and the second release never reaches libibverbs. */
static void test_wrapped_double(void)
{
	char *buf = gpu_alloc(65536), *h = malloc(8192);
	struct ibv_mr *m = ibv_reg_mr(pd, buf, 4096, LW);
	uint64_t d0, bad0 = fcount("dereg_bad");
	int rc;

	rc = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, h, 8192, 0);
	CHECK(rc == 0 && m->addr == h && !fis_mr(m), "a shadow re-registered onto host memory (%d)",
	      rc);
	d0 = fcount("dereg");
	CHECK(ibv_dereg_mr(m) == 0 && fcount("dereg") == d0 + 1, "released: libibverbs' MR with it");
	CHECK(ibv_dereg_mr(m) == EINVAL && fcount("dereg") == d0 + 1 && fcount("dereg_bad") == bad0,
	      "released again: EINVAL, nothing reaches libibverbs");
	free(h);
	gpu_free(buf);
}

/* Stream-ordered pool memory freed and allocated again at the same address. */
int cuMemAllocAsync(uint64_t *p, size_t size, void *stream);
int cuMemFreeAsync(uint64_t p, void *stream);
static void test_pool_stale(void)
{
	uint64_t p = 0, q = 0;
	struct ibv_mr *a, *b;
	uint32_t lkey;

	if (cuMemAllocAsync(&p, 65536, NULL)) {
		printf("ok - # skip: no pool memory\n");
		return;
	}
	a = ibv_reg_mr(pd, (void *)(uintptr_t)p, 65536, LW);
	lkey = a ? a->lkey : 0;
	if (a)
		ibv_dereg_mr(a);
	cuMemFreeAsync(p, NULL);
	cuMemAllocAsync(&q, 65536, NULL);
	b = ibv_reg_mr(pd, (void *)(uintptr_t)q, 65536, LW);
	CHECK(a && b && (q != p || fis_mr(a) || b->lkey != lkey),
	      "pool memory at the same address again (%s): never the freed one's MR",
	      q == p ? "same" : "another");
	if (b)
		ibv_dereg_mr(b);
	cuMemFreeAsync(q, NULL);
}

/* ibv_reg_mr_ex (IBVERBS_1.15, where the libibverbs has it): an address registration is served
 * like ibv_reg_mr; IOVA != addr, and unknown mask bits, pass through. */
struct edges_mr_init_attr {
	size_t length;
	int access;
	uint64_t comp_mask;
	uint64_t iova;
	void *addr;
	int fd;
	uint64_t fd_offset;
	void *dmah;
};
static void test_reg_mr_ex(void)
{
	struct ibv_mr *(*reg_ex)(struct ibv_pd *, struct edges_mr_init_attr *);
	char *buf = gpu_alloc(65536);
	struct edges_mr_init_attr a = { .length = 4096, .access = LW, .addr = buf };
	struct ibv_mr *m;

	*(void **)&reg_ex = dlvsym(RTLD_DEFAULT, "ibv_reg_mr_ex", "IBVERBS_1.15");
	if (!reg_ex) {
		printf("ok - # skip: no ibv_reg_mr_ex\n");
		gpu_free(buf);
		return;
	}
	a.comp_mask = 2; /* ADDR */
	m = reg_ex(pd, &a);
	CHECK(cached(m), "ibv_reg_mr_ex, ADDR: cached");
	if (m)
		ibv_dereg_mr(m);
	a.comp_mask = 3, a.iova = (uintptr_t)buf; /* ADDR | IOVA == addr */
	m = reg_ex(pd, &a);
	CHECK(cached(m), "ibv_reg_mr_ex, ADDR | IOVA == addr: cached");
	if (m)
		ibv_dereg_mr(m);
	a.iova = 0x10000;
	m = reg_ex(pd, &a);
	CHECK(m && fis_mr(m), "ibv_reg_mr_ex, IOVA != addr: passed through");
	if (m)
		ibv_dereg_mr(m);
	a.comp_mask = 2, a.access = LW | IBV_ACCESS_ZERO_BASED;
	m = reg_ex(pd, &a);
	a.addr = buf + 8192;
	{
		struct ibv_mr *n = reg_ex(pd, &a);

		CHECK(m && n && m->lkey != n->lkey,
		      "ibv_reg_mr_ex, ZERO_BASED: different ranges, different lkeys");
		if (n)
			ibv_dereg_mr(n);
	}
	if (m)
		ibv_dereg_mr(m);
	gpu_free(buf);
}

/* Threads that come and go, each registering and releasing one shadow: what the preload keeps
 * for a thread (its records, its counters) is reused once the thread is gone, so the heap does not
 * grow with the number of threads ever made (mallinfo2: bytes in use, after a warm-up). */
#define NCHURN 4000
static void *churn_thread(void *arg)
{
	struct ibv_mr *m = ibv_reg_mr(pd, arg, 4096, LW);

	if (m)
		ibv_dereg_mr(m);
	return m;
}

static void test_thread_churn(void)
{
	char *buf = gpu_alloc(65536);
	size_t before = 0, after;
	int shadows = 0;

	for (int i = 0; i < NCHURN + 100; i++) {
		pthread_t th;
		void *r = NULL;

		if (i == 100)
			before = mallinfo2().uordblks;
		pthread_create(&th, NULL, churn_thread, buf);
		pthread_join(th, &r);
		shadows += r != NULL;
	}
	after = mallinfo2().uordblks;
	CHECK(shadows == NCHURN + 100 && after < before + NCHURN * 16,
	      "%d threads made and gone, one shadow each: the heap grew by %zd bytes (%.1f a "
	      "thread)",
	      NCHURN, (ssize_t)(after - before), (double)(ssize_t)(after - before) / NCHURN);
	gpu_free(buf);
}

/* A PD deallocated and another allocated at its address (the fake hands a freed PD's address out
 * again at once, as malloc often does): the same GPU range registered with the new PD gets an MR
 * of that PD, never the cached MR of the old one. Deallocated at once; after EBUSY for a shadow
 * held; after EBUSY for a host MR held (libibverbs' own: the cache's MRs were released by then,
 * and the ones made after are released by the later ibv_dealloc_pd). */
static void test_pd_reuse(void)
{
	char *buf = gpu_alloc(65536), *host = malloc(4096);
	struct ibv_pd *p1 = ibv_alloc_pd(ctx), *p2;
	struct ibv_mr *m = p1 ? ibv_reg_mr(p1, buf, 4096, LW) : NULL, *h;

	CHECK(cached(m), "a shadow on a PD of its own");
	CHECK(m && ibv_dereg_mr(m) == 0 && ibv_dealloc_pd(p1) == 0 && flive(p1) == 0,
	      "released, the PD deallocates: the cache's MR on it deregistered");
	p2 = ibv_alloc_pd(ctx);
	CHECK(p2 == p1, "a new PD at the deallocated one's address");
	m = ibv_reg_mr(p2, buf, 4096, LW);
	CHECK(cached(m) && m->pd == p2 && flive(p2) == 1,
	      "the same range on the new PD: an MR of the new PD (%u live on it)", flive(p2));
	CHECK(ibv_dealloc_pd(p2) == EBUSY && flive(p2) == 1, "a shadow held: EBUSY, its MR stays");
	CHECK(m && ibv_dereg_mr(m) == 0 && ibv_dealloc_pd(p2) == 0 && flive(p2) == 0,
	      "released: the PD deallocates");

	p2 = ibv_alloc_pd(ctx);
	m = p2 ? ibv_reg_mr(p2, buf, 4096, LW) : NULL;
	h = p2 && host ? ibv_reg_mr(p2, host, 4096, LW) : NULL;
	CHECK(p2 == p1 && cached(m) && h && fis_mr(h), "again at that address: a shadow, a host MR");
	CHECK(m && ibv_dereg_mr(m) == 0 && ibv_dealloc_pd(p2) == EBUSY && flive(p2) == 1,
	      "the host MR held: EBUSY, only the cache's MR released");
	m = ibv_reg_mr(p2, buf, 4096, LW);
	CHECK(cached(m) && flive(p2) == 2 && ibv_dereg_mr(m) == 0,
	      "the GPU range again on the PD that stayed: a new MR of the cache");
	CHECK(h && ibv_dereg_mr(h) == 0 && ibv_dealloc_pd(p2) == 0 && flive(p2) == 0,
	      "the host MR released: the PD deallocates, the cache's later MR released with it");
	p2 = ibv_alloc_pd(ctx);
	m = p2 ? ibv_reg_mr(p2, buf, 4096, LW) : NULL;
	CHECK(p2 == p1 && cached(m) && flive(p2) == 1,
	      "and at that address once more: an MR of the new PD");
	CHECK(m && ibv_dereg_mr(m) == 0 && ibv_dealloc_pd(p2) == 0 && flive(p2) == 0,
	      "released, deallocated");
	free(host);
	gpu_free(buf);
}

/* Another thread allocates a PD at the address of one whose ibv_dealloc_pd has freed it but not
 * yet returned (the fake's after_dealloc hook runs the other thread then), and registers GPU memory
 * with it: that PD's cached MRs must still be released by its own ibv_dealloc_pd (same device),
 * and by ibv_close_device (another device). */
static struct ibv_context *reuse_ctx;
static struct ibv_pd *reuse_pd;
static char *reuse_buf;
static sem_t reuse_go, reuse_done;

static void *reuse_thread(void *arg)
{
	struct ibv_mr *m;

	(void)arg;
	sem_wait_until(
		&reuse_go, gdr_deadline_ms(WAIT_MS),
		"another thread: ibv_dealloc_pd reached libibverbs' (the fake's after_dealloc "
		"hook ran)");
	reuse_pd = ibv_alloc_pd(reuse_ctx);
	m = reuse_pd ? ibv_reg_mr(reuse_pd, reuse_buf, 4096, LW) : NULL;
	CHECK(cached(m) && flive(reuse_pd) == 1, "another thread: a shadow on the new PD");
	if (m)
		ibv_dereg_mr(m);
	sem_post(&reuse_done);
	return NULL;
}

static void reuse_hook(struct ibv_pd *freed)
{
	(void)freed;
	fhooks(NULL, NULL); /* once */
	sem_post(&reuse_go);
	sem_wait_until(
		&reuse_done, gdr_deadline_ms(WAIT_MS),
		"inside ibv_dealloc_pd: another thread's ibv_alloc_pd and ibv_reg_mr returned "
		"(a lock held across libibverbs' dealloc?)");
}

static void test_pd_reused_while_dealloc(void)
{
	struct ibv_context *other = open_ctx();

	reuse_buf = gpu_alloc(65536);
	sem_init(&reuse_go, 0, 0);
	sem_init(&reuse_done, 0, 0);
	for (int same = 1; same >= 0; same--) {
		struct ibv_pd *p1 = ibv_alloc_pd(ctx);
		struct ibv_mr *m = p1 ? ibv_reg_mr(p1, reuse_buf, 4096, LW) : NULL;
		uint64_t left0 = fcount("close_left");
		pthread_t th;
		int rc;

		CHECK(cached(m) && m && ibv_dereg_mr(m) == 0, "a cached MR on a PD");
		reuse_ctx = same ? ctx : other;
		reuse_pd = NULL;
		pthread_create(&th, NULL, reuse_thread, NULL);
		fhooks(reuse_hook, NULL);
		rc = ibv_dealloc_pd(p1);
		pthread_join(th, NULL);
		CHECK(rc == 0 && reuse_pd == p1,
		      "the PD deallocates (%d); another thread's new PD got its address", rc);
		if (same) {
			rc = reuse_pd ? ibv_dealloc_pd(reuse_pd) : -1;
			CHECK(rc == 0 && flive(p1) == 0,
			      "that PD deallocates, its cached MR released (%d, %u MRs left)", rc,
			      flive(p1));
		} else {
			rc = ibv_close_device(other);
			other = NULL;
			CHECK(rc == 0 && fcount("close_left") == left0,
			      "its device (another) closes with no MR of the cache on it (%llu left)",
			      (unsigned long long)(fcount("close_left") - left0));
		}
	}
	sem_destroy(&reuse_go);
	sem_destroy(&reuse_done);
	gpu_free(reuse_buf);
}

/* ibv_close_device while another thread's ibv_rereg_mr of a shadow on that device is inside
 * libibverbs (the fake's before_rereg hook holds it there until the device has closed, or for
 * 300 ms): no MR of the cache outlives the device, and a new PD at the closed one's address never
 * gets one of its MRs. */
static sem_t rr_in, rr_go;
static struct ibv_mr *rr_mr;
static int rr_rc;
static uint64_t rr_close0;

static void rr_hook(struct ibv_mr *mr)
{
	(void)mr;
	fhooks(NULL, NULL); /* once */
	sem_post(&rr_in);
	sem_wait(&rr_go);
}

static void *rr_thread(void *arg)
{
	volatile int rd = LW | IBV_ACCESS_REMOTE_READ;

	(void)arg;
	rr_rc = ibv_rereg_mr(rr_mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, rd);
	return NULL;
}

/* Lets the re-registration go once the device has closed, or after 300 ms. */
static void *rr_release(void *arg)
{
	struct timespec ts = { 0, 1000000 };

	(void)arg;
	for (int i = 0; i < 300 && fcount("close") == rr_close0; i++)
		nanosleep(&ts, NULL);
	sem_post(&rr_go);
	return NULL;
}

static void test_close_under_rereg(void)
{
	char *buf = gpu_alloc(65536);
	struct ibv_context *c = open_ctx(), *c3;
	struct ibv_pd *p = c ? ibv_alloc_pd(c) : NULL, *p3;
	uint64_t left0 = fcount("close_left");
	pthread_t th, rel;
	struct ibv_mr *m;
	int rc;

	rr_mr = p ? ibv_reg_mr(p, buf, 4096, LW) : NULL;
	CHECK(cached(rr_mr), "a shadow on a second device");
	if (!cached(rr_mr))
		return;
	sem_init(&rr_in, 0, 0);
	sem_init(&rr_go, 0, 0);
	fhooks(NULL, rr_hook);
	pthread_create(&th, NULL, rr_thread, NULL);
	/* the shadow is being re-registered */
	sem_wait_until(
		&rr_in, gdr_deadline_ms(WAIT_MS),
		"the shadow's ibv_rereg_mr reached libibverbs' (the fake's before_rereg hook ran)");
	rr_close0 = fcount("close");
	pthread_create(&rel, NULL, rr_release, NULL);
	rc = ibv_close_device(c);
	pthread_join(rel, NULL);
	pthread_join(th, NULL);
	sem_destroy(&rr_in);
	sem_destroy(&rr_go);
	CHECK(rc == 0 && fcount("close_left") == left0,
	      "the device closes with no MR of the cache on it (%llu left; the re-registration "
	      "returned %d)",
	      (unsigned long long)(fcount("close_left") - left0), rr_rc);
	CHECK(ibv_dereg_mr(rr_mr) == 0, "the shadow released after the close");
	c3 = open_ctx();
	p3 = c3 ? ibv_alloc_pd(c3) : NULL;
	m = p3 ? ibv_reg_mr(p3, buf, 4096, LW) : NULL;
	CHECK(p3 == p && cached(m) && flive(p3) == 1,
	      "a new device's PD at the closed one's address: the same range gets an MR of the new "
	      "PD (%u live on it)",
	      p3 ? flive(p3) : 0);
	if (m)
		ibv_dereg_mr(m);
	if (p3)
		ibv_dealloc_pd(p3);
	if (c3)
		ibv_close_device(c3);
	gpu_free(buf);
}

int main(int argc, char **argv)
{
	void *cuctx;

	(void)argc;
	setvbuf(stdout, NULL, _IOLBF, 0);
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&flive = dlsym(RTLD_DEFAULT, "fake_ibv_live_mrs");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	*(void **)&finfo = dlsym(RTLD_DEFAULT, "fake_ibv_mr_info");
	*(void **)&fhooks = dlsym(RTLD_DEFAULT, "fake_ibv_set_hooks");
	if (!fcount || !flive || !fis_mr || !finfo || !fhooks) {
		printf("edges_prog: not running over the fake libibverbs (LD_LIBRARY_PATH)\n");
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
	test_remote_bounded();
	test_zero_based();
	test_library_bits();
	test_stale_held();
	test_stale_thread();
	test_thread_exit();
	test_thread_churn();
	test_lengths();
	test_rereg_pd();
	test_remote_rights();
	test_held_stay();
	test_shared_page_stale();
	test_wrapped_double();
	test_pool_stale();
	test_reg_mr_ex();
	test_pd_reuse();
	test_pd_reused_while_dealloc();
	test_close_under_rereg();
	CHECK(ibv_dealloc_pd(pd) == 0, "the PD deallocates");
	CHECK(ibv_close_device(ctx) == 0, "the device closes");
	printf("%s: %d failed\n", argv[0], failures);
	return failures ? 1 : 0;
}
