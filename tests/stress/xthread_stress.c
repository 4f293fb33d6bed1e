/* SPDX-License-Identifier: MIT */
/*
 * Registrations released on another thread, the usual RDMA pattern (a progress thread completes
 * what the application posted), while a third thread retires records as fast as it can: thread A
 * registers, thread B releases what A hands it, thread C flushes the cache and releases a PD's MRs.
 * Every release must succeed, none may read a record or an entry after giving up the hold that
 * pinned it (ASan and TSan builds see such a read), and at the end nothing is pinned or
 * registered.
 * Usage: xthread_stress [seconds]   (default 1)
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "intercept/events.h"
#include "fake_cuda.h"
#include "fakes.h"

#define NBUF 512
#define QLEN 256

static struct gdr_cache *cache;
static uint64_t buf[NBUF];
static atomic_int stop, registrar_done, failures;
static atomic_ullong handed, released, flushes;

/* A ring from A to B, under a mutex (which orders nothing inside the cache). */
static struct gdr_region *q[QLEN];
static unsigned qhead, qlen;
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;

static int probe_ok(const char **why)
{
	(void)why;
	return 0;
}

static void fail(const char *what, int rc)
{
	fprintf(stderr, "xthread_stress: %s: %d\n", what, rc);
	atomic_fetch_add(&failures, 1);
}

static void *registrar(void *arg)
{
	unsigned seed = 1;

	(void)arg;
	while (!atomic_load(&stop)) {
		unsigned i = (unsigned)rand_r(&seed) % NBUF;
		struct ibv_pd *pd = rand_r(&seed) % 2 ? FAKE_PD : FAKE_PD2;
		struct gdr_region *r = NULL;
		int rc = gdr_reg(cache, pd, (void *)(uintptr_t)(buf[i] + 4096 * (rand_r(&seed) % 8)),
				 4096, 1 + rand_r(&seed) % 3, &r);

		if (rc) {
			fail("gdr_reg", rc);
			break;
		}
		pthread_mutex_lock(&qlock);
		while (qlen == QLEN && !atomic_load(&stop))
			pthread_cond_wait(&qcond, &qlock);
		if (qlen == QLEN) { /* stopping: release it here */
			pthread_mutex_unlock(&qlock);
			if ((rc = gdr_dereg(r)))
				fail("gdr_dereg (registrar)", rc);
			break;
		}
		q[(qhead + qlen++) % QLEN] = r;
		pthread_cond_broadcast(&qcond);
		pthread_mutex_unlock(&qlock);
		atomic_fetch_add(&handed, 1);
	}
	return NULL;
}

static void *releaser(void *arg)
{
	(void)arg;
	for (;;) {
		struct gdr_region *r;
		int rc;

		pthread_mutex_lock(&qlock);
		while (!qlen && !atomic_load(&registrar_done))
			pthread_cond_wait(&qcond, &qlock);
		if (!qlen) {
			pthread_mutex_unlock(&qlock);
			break;
		}
		r = q[qhead];
		qhead = (qhead + 1) % QLEN;
		qlen--;
		pthread_cond_broadcast(&qcond);
		pthread_mutex_unlock(&qlock);
		rc = gdr_dereg(r);
		if (rc)
			fail("gdr_dereg of a registration made on another thread", rc);
		atomic_fetch_add(&released, 1);
	}
	return NULL;
}

static void *retirer(void *arg)
{
	unsigned n = 0;

	(void)arg;
	while (!atomic_load(&stop)) {
		int rc = gdr_cache_flush(cache);

		if (rc < 0)
			fail("gdr_cache_flush", rc);
		if (++n % 8 == 0) {
			rc = gdr_cache_release_pd(cache, n % 16 ? FAKE_PD : FAKE_PD2);
			if (rc && rc != -EBUSY)
				fail("gdr_cache_release_pd", rc);
		}
		atomic_fetch_add(&flushes, 1);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 1.0;
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				    .validate = GDR_VALIDATE_EVENTS };
	struct timespec ts = { .tv_sec = (time_t)seconds,
			       .tv_nsec = (long)((seconds - (time_t)seconds) * 1e9) };
	pthread_t ta, tb, tc;
	int rc;

	fake_cuda_reset();
	fake_backend_reset();
	fake_verbs_install();
	fake_seams.events_probe = probe_ok;
	if ((rc = fake_cache_create(&a, &fake_backend_ops, &cache))) {
		fprintf(stderr, "xthread_stress: gdr_cache_create: %d\n", rc);
		return 1;
	}
	for (int i = 0; i < NBUF; i++)
		buf[i] = fake_cuda_alloc(512 * 1024);
	pthread_create(&ta, NULL, registrar, NULL);
	pthread_create(&tb, NULL, releaser, NULL);
	pthread_create(&tc, NULL, retirer, NULL);
	nanosleep(&ts, NULL);
	atomic_store(&stop, 1);
	pthread_mutex_lock(&qlock);
	pthread_cond_broadcast(&qcond);
	pthread_mutex_unlock(&qlock);
	pthread_join(ta, NULL);
	pthread_mutex_lock(&qlock);
	atomic_store(&registrar_done, 1);
	pthread_cond_broadcast(&qcond);
	pthread_mutex_unlock(&qlock);
	pthread_join(tb, NULL); /* releases whatever is left in the ring */
	pthread_join(tc, NULL);
	if (atomic_load(&handed) != atomic_load(&released))
		fail("registrations handed over but not released", (int)(atomic_load(&handed) -
								  atomic_load(&released)));
	if ((rc = gdr_cache_release_pd(cache, FAKE_PD)) || (rc = gdr_cache_release_pd(cache, FAKE_PD2)))
		fail("gdr_cache_release_pd at the end", rc);
	if ((rc = gdr_cache_destroy(cache)))
		fail("gdr_cache_destroy", rc);
	if (fake_be.outstanding || fake_verbs.outstanding)
		fail("pins or MRs left", (int)(fake_be.outstanding + fake_verbs.outstanding));
	for (int i = 0; i < NBUF; i++)
		fake_cuda_free(buf[i]);
	printf("xthread_stress: %llu registrations released on another thread, %llu flushes, "
	       "%d failures\n", (unsigned long long)atomic_load(&released),
	       (unsigned long long)atomic_load(&flushes), atomic_load(&failures));
	return atomic_load(&failures) ? 1 : 0;
}
