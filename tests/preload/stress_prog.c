/* SPDX-License-Identifier: MIT */
/*
 * The preload's shadow records under threads, over the fake libibverbs (LD_LIBRARY_PATH) and the
 * fake CUDA driver; preload_test.sh's "stress" mode runs it with GDRCACHE_STATS=1 and checks the
 * preload's counters as well. While THREADS threads churn:
 *  - churn: each registers GPU buffers (cache hits: shadows) and host buffers (libibverbs' own
 *    MRs), keeps a few and hands half of them to the next thread to release: shadows and real MRs
 *    released on threads other than the ones that made them. Every release returns 0; each real
 *    MR's reaches libibverbs, no shadow's does (the fake counts an MR it does not know as
 *    dereg_bad);
 *  - races: two threads release the same shadow at once, ROUNDS times: one gets 0, the other
 *    EINVAL (the preload's statistics: released == cached, each reference dropped once);
 *  - ibv_close_device of a second device with shadows held (they become orphans, walked while the
 *    threads' releases go on), then their release (0);
 *  - fork() while the threads churn: the child releases a shadow inherited from the parent (0,
 *    nothing reaches libibverbs), again (EINVAL), releases an inherited real MR (libibverbs), and
 *    registers GPU memory (libibverbs' own MR: the child passes everything through).
 * Prints "max live shadows N", "threads N", "registrations N" for the script's bound on the
 * records the preload made (bounded by the shadows live at once, not by the registrations).
 * Exit 0 pass, 1 fail, 77 not over the fakes.
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
#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

#define THREADS 4
#define ITERS 20000
#define NBUF 16
#define BUFSZ (1 << 20)
#define QCAP 256
#define KEEP 8
#define ROUNDS 2000
#define FORKS 20
#define LW IBV_ACCESS_LOCAL_WRITE

static uint64_t (*fcount)(const char *);
static int (*fis_mr)(const struct ibv_mr *);

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static char *gbuf[NBUF];
static char *hbuf;
static int failures;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static long live, max_live, nhost, nregs;
static int stop; /* the churn goes on past ITERS until main is done (no thread has ended by a fork) */

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		pthread_mutex_lock(&out_lock);                                                     \
		printf("not ok - %s:%d: ", __func__, __LINE__);                                    \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		failures++;                                                                        \
		pthread_mutex_unlock(&out_lock);                                                   \
	} while (0)

/* A thread's inbox: MRs another thread made, for this one to release. */
static struct inbox {
	pthread_mutex_t lock;
	struct ibv_mr *q[QCAP];
	unsigned n;
} inbox[THREADS];

static struct ibv_mr *reg_gpu(unsigned *seed)
{
	char *p = gbuf[rand_r(seed) % NBUF] + (rand_r(seed) % (BUFSZ / 4096)) * 4096;
	struct ibv_mr *mr = ibv_reg_mr(pd, p, 4096, LW);
	long n;

	if (!mr || mr->addr != p) {
		FAIL("ibv_reg_mr of GPU memory: %p", (void *)mr);
		return NULL;
	}
	n = __atomic_add_fetch(&live, 1, __ATOMIC_RELAXED);
	for (long m = __atomic_load_n(&max_live, __ATOMIC_RELAXED); n > m;)
		if (__atomic_compare_exchange_n(&max_live, &m, n, false, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED))
			break;
	__atomic_add_fetch(&nregs, 1, __ATOMIC_RELAXED);
	return mr;
}

/* Release an MR of either kind: host MRs are the fake's (addr in hbuf). */
static void release(struct ibv_mr *mr)
{
	bool host = (char *)mr->addr >= hbuf && (char *)mr->addr < hbuf + BUFSZ;
	int rc;

	if (!host)
		__atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
	rc = ibv_dereg_mr(mr);
	if (rc)
		FAIL("ibv_dereg_mr of a%s MR %p on thread %d: %d", host ? " host" : " GPU", (void *)mr,
		     (int)gettid(), rc);
}

static void *churn(void *arg)
{
	long t = (long)arg;
	unsigned seed = 7 + (unsigned)t;
	struct ibv_mr *kept[KEEP] = { 0 };
	struct inbox *mine = &inbox[t], *next = &inbox[(t + 1) % THREADS];

	for (int i = 0; i < ITERS || !__atomic_load_n(&stop, __ATOMIC_RELAXED); i++) {
		struct ibv_mr *mr, *got[2];
		unsigned k = 0;

		if (rand_r(&seed) % 16 == 0) {
			char *p = hbuf + (rand_r(&seed) % (BUFSZ / 4096)) * 4096;

			mr = ibv_reg_mr(pd, p, 4096, LW);
			if (!mr || !fis_mr(mr)) {
				FAIL("host memory: not libibverbs' MR (%p)", (void *)mr);
				continue;
			}
			__atomic_add_fetch(&nhost, 1, __ATOMIC_RELAXED);
		} else {
			mr = reg_gpu(&seed);
			if (!mr)
				continue;
			if (i % 64 == 0 && fis_mr(mr))
				FAIL("GPU memory: libibverbs' MR, not a shadow");
		}
		if (rand_r(&seed) % 2) {
			pthread_mutex_lock(&next->lock);
			if (next->n < QCAP) {
				next->q[next->n++] = mr;
				mr = NULL;
			}
			pthread_mutex_unlock(&next->lock);
		}
		if (mr) {
			unsigned j = (unsigned)i % KEEP;

			if (kept[j])
				release(kept[j]);
			kept[j] = mr;
		}
		pthread_mutex_lock(&mine->lock);
		while (k < 2 && mine->n)
			got[k++] = mine->q[--mine->n];
		pthread_mutex_unlock(&mine->lock);
		while (k)
			release(got[--k]);
	}
	for (unsigned j = 0; j < KEEP; j++)
		if (kept[j])
			release(kept[j]);
	return NULL;
}

/* Two threads release the same shadow at once. */
static pthread_barrier_t race_bar;
static struct ibv_mr *race_mr;
static int race_rc[2];

static void *racer(void *arg)
{
	long id = (long)arg;

	for (int r = 0; r < ROUNDS; r++) {
		pthread_barrier_wait(&race_bar); /* race_mr is set */
		race_rc[id] = ibv_dereg_mr(race_mr);
		pthread_barrier_wait(&race_bar); /* both done */
	}
	return NULL;
}

static void races(void)
{
	unsigned seed = 99;
	pthread_t th[2];
	int bad = 0;

	pthread_barrier_init(&race_bar, NULL, 3);
	for (long i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, racer, (void *)i);
	for (int r = 0; r < ROUNDS; r++) {
		race_mr = reg_gpu(&seed);
		pthread_barrier_wait(&race_bar);
		pthread_barrier_wait(&race_bar);
		__atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
		if (!((race_rc[0] == 0 && race_rc[1] == EINVAL) ||
		      (race_rc[0] == EINVAL && race_rc[1] == 0)) &&
		    bad++ < 10)
			FAIL("round %d: MR %p released twice at once: %d and %d", r, (void *)race_mr,
			     race_rc[0], race_rc[1]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&race_bar);
	if (bad)
		FAIL("%d of %d concurrent double releases did not end one 0, one EINVAL", bad,
		     ROUNDS);
	else
		printf("ok - %d concurrent double releases: one 0, one EINVAL each\n", ROUNDS);
}

/* Shadows held on a second device as it closes: orphans, released later. */
static void close_device(void)
{
	struct ibv_context *c = open_ctx();
	struct ibv_pd *p = c ? ibv_alloc_pd(c) : NULL;
	struct ibv_mr *mrs[100];
	uint64_t left0 = fcount("close_left");
	int bad = 0;

	if (!p) {
		FAIL("a second device");
		return;
	}
	for (int i = 0; i < 100; i++) {
		mrs[i] = ibv_reg_mr(p, gbuf[i % NBUF] + i * 4096, 4096, LW);
		bad += !mrs[i] || fis_mr(mrs[i]);
	}
	if (ibv_close_device(c) || fcount("close_left") != left0)
		FAIL("ibv_close_device with shadows held");
	for (int i = 0; i < 100; i++)
		bad += mrs[i] && ibv_dereg_mr(mrs[i]) != 0;
	if (bad)
		FAIL("%d shadows on the closed device went wrong", bad);
	else
		printf("ok - ibv_close_device with 100 shadows held while threads churn; released\n");
}

/* fork() while the threads churn; the child reports by its exit status. */
static void forks(void)
{
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
	unsigned seed = 5;
	int bad = 0;

	for (int f = 0; f < FORKS; f++) {
		struct ibv_mr *m = reg_gpu(&seed), *h = ibv_reg_mr(pd, hbuf, 4096, LW);
		int status = -1;
		pid_t pid;

		if (!m || !h) {
			bad++;
			continue;
		}
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			uint64_t d0 = fcount("dereg"), bad0 = fcount("dereg_bad");
			struct ibv_mr *g;
			int code = 0;

			alarm(alarm_s); /* a hang (a lock a churning thread held) fails */
			if (ibv_dereg_mr(m) != 0)
				code |= 1; /* an inherited shadow: forgotten, 0 */
			if (ibv_dereg_mr(m) != EINVAL)
				code |= 2; /* again: refused */
			if (fcount("dereg") != d0)
				code |= 4; /* neither reached libibverbs */
			g = ibv_reg_mr(pd, gbuf[0], 4096, LW);
			if (!g || !fis_mr(g) || ibv_dereg_mr(g))
				code |= 8; /* the child's own: libibverbs' */
			if (ibv_dereg_mr(h) || fcount("dereg") != d0 + 2 || fcount("dereg_bad") != bad0)
				code |= 16; /* an inherited real MR: libibverbs releases it */
			_exit(code);
		}
		if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
		    WEXITSTATUS(status)) {
			FAIL("fork %d: child status %#x%s", f, status,
			     WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM
				     ? " (hung: killed by its alarm)"
				     : "");
			bad++;
		}
		release(m);
		release(h);
	}
	if (!bad)
		printf("ok - %d forks while threads churn: the children release, refuse and pass "
		       "through\n",
		       FORKS);
}

int main(int argc, char **argv)
{
	pthread_t th[THREADS];
	uint64_t d0, bad0;
	void *cuctx;

	(void)argc;
	(void)argv;
	setvbuf(stdout, NULL, _IOLBF, 0);
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	if (!fcount || !fis_mr) {
		printf("stress_prog: not running over the fake libibverbs (LD_LIBRARY_PATH)\n");
		return 77;
	}
	if (cuInit(0) || cuDevicePrimaryCtxRetain(&cuctx, 0) || cuCtxSetCurrent(cuctx)) {
		printf("not ok - the fake CUDA driver did not start\n");
		return 1;
	}
	fake_cuda_set_threads_have_context(true);
	for (int i = 0; i < NBUF; i++) {
		uint64_t p = 0;

		if (cuMemAlloc_v2(&p, BUFSZ))
			return 1;
		gbuf[i] = (char *)(uintptr_t)p;
	}
	hbuf = malloc(BUFSZ);
	ctx = open_ctx();
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd || !hbuf) {
		printf("not ok - the fake device did not open\n");
		return 1;
	}
	for (int i = 0; i < THREADS; i++)
		pthread_mutex_init(&inbox[i].lock, NULL);
	{ /* every buffer cached once, so that the churn is hits */
		struct ibv_mr *m[NBUF];

		for (int i = 0; i < NBUF; i++)
			m[i] = ibv_reg_mr(pd, gbuf[i], 4096, LW);
		for (int i = 0; i < NBUF; i++)
			if (m[i])
				ibv_dereg_mr(m[i]);
	}
	d0 = fcount("dereg");
	bad0 = fcount("dereg_bad");
	for (long i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, churn, (void *)i);
	races();
	close_device();
	forks();
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < THREADS; i++) /* what was handed over after its thread finished */
		while (inbox[i].n)
			release(inbox[i].q[--inbox[i].n]);
	if (fcount("dereg_bad") != bad0)
		FAIL("%llu MRs libibverbs did not know reached its ibv_dereg_mr (shadows)",
		     (unsigned long long)(fcount("dereg_bad") - bad0));
	/* the host MRs of the churn, those of the forks (each once in the parent, once in its
	 * child: the child's count is its own), and the second device's cached MRs */
	if (fcount("dereg") - d0 < (uint64_t)nhost + FORKS)
		FAIL("libibverbs released %llu MRs, fewer than the %ld host MRs released",
		     (unsigned long long)(fcount("dereg") - d0), nhost + FORKS);
	if (live)
		FAIL("%ld shadows unaccounted for", live);
	printf("max live shadows %ld\nthreads %d\nregistrations %ld\n", max_live, THREADS + 3,
	       nregs);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	for (int i = 0; i < NBUF; i++)
		cuMemFree_v2((uintptr_t)gbuf[i]);
	free(hbuf);
	printf("%s: %d failed\n", argv[0], failures);
	return failures ? 1 : 0;
}
