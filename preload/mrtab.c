/* SPDX-License-Identifier: MIT */
/*
 * The MRs the preload handed out (shadow records, found again by pointer at ibv_dereg_mr and
 * ibv_rereg_mr) and the PDs the cache made MRs for (released before ibv_dealloc_pd and
 * ibv_close_device). The records are spread over 32 shards, each behind its own mutex, so that
 * threads registering at once do not queue on one lock (a hit costs a publish and a take); the
 * PDs are behind one more. No mutex is held across a call into the library or libibverbs.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "preload.h"

#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (oom = true)
#include <uthash.h>

struct rec_node {
	struct gdrp_rec *key;
	UT_hash_handle hh;
};

struct pd_node {
	struct ibv_pd *key;
	struct ibv_context *ctx; /* read when the PD was valid: never read pd->context later */
	UT_hash_handle hh;
};

/* The record and its hash node in one allocation: the node follows the record. */
struct rec_alloc {
	struct gdrp_rec rec;
	struct rec_node node;
};

/* 32: fork's prepare handler holds every shard's mutex and the PDs' at once, and
 * ThreadSanitizer's deadlock detector stops at 64 locks held by a thread. */
#define NSHARDS 32

static struct shard {
	pthread_mutex_t lock;
	struct rec_node *recs;
} __attribute__((aligned(64))) shards[NSHARDS];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* the PDs */
static struct pd_node *pds;
/* set by uthash under whichever lock the thread holds */
static __thread bool oom __attribute__((tls_model("initial-exec")));

static struct shard *shard_of(const void *rec)
{
	/* All the pointer's bits mixed into the top six: records of different threads' malloc
	 * arenas share their low bits (arenas are 64 MiB-aligned). */
	return &shards[((uint64_t)(uintptr_t)rec * 0x9e3779b97f4a7c15ULL) >> 59];
}

/* One node a shard that never leaves it: uthash frees a table when its last node goes and
 * allocates one with the next, which a hit would pay twice. Its key is the shard itself, never an
 * MR; walks skip it. */
static struct rec_node sentinels[NSHARDS];

__attribute__((constructor)) static void shards_init(void)
{
	for (unsigned i = 0; i < NSHARDS; i++) {
		pthread_mutex_init(&shards[i].lock, NULL);
		sentinels[i].key = (struct gdrp_rec *)(void *)&shards[i];
		HASH_ADD_PTR(shards[i].recs, key, &sentinels[i]);
	}
}

/* Records freed by this thread, kept for its next registrations (a hit then allocates nothing):
 * at most REC_KEEP a thread, the rest go back to malloc. */
#define REC_KEEP 64
struct rec_free {
	struct rec_free *next;
};
static __thread struct rec_free *rec_kept __attribute__((tls_model("initial-exec")));
static __thread unsigned rec_nkept __attribute__((tls_model("initial-exec")));
static pthread_key_t rec_key; /* its destructor frees an exiting thread's kept records */
static pthread_once_t rec_key_once = PTHREAD_ONCE_INIT;

static void rec_kept_free(void *arg)
{
	(void)arg;
	while (rec_kept) {
		struct rec_free *f = rec_kept;

		rec_kept = f->next;
		free(f);
	}
	rec_nkept = 0;
}

static void rec_key_make(void)
{
	if (pthread_key_create(&rec_key, rec_kept_free))
		rec_key = (pthread_key_t)-1;
}

struct gdrp_rec *gdrp_rec_new(void)
{
	struct rec_alloc *a = (struct rec_alloc *)rec_kept;

	if (a) {
		rec_kept = rec_kept->next;
		rec_nkept--;
		memset(a, 0, sizeof(*a));
	} else {
		a = calloc(1, sizeof(*a));
		if (!a)
			return NULL;
	}
	a->node.key = &a->rec;
	return &a->rec;
}

void gdrp_rec_free(struct gdrp_rec *r)
{
	struct rec_free *f = (struct rec_free *)r; /* the struct rec_alloc starts with it */

	if (rec_nkept >= REC_KEEP) {
		free(r);
		return;
	}
	if (!rec_nkept) { /* arm the thread's destructor (pthread_setspecific is idempotent) */
		pthread_once(&rec_key_once, rec_key_make);
		if (rec_key == (pthread_key_t)-1 || pthread_setspecific(rec_key, (void *)1)) {
			free(r);
			return;
		}
	}
	f->next = rec_kept;
	rec_kept = f;
	rec_nkept++;
}

static struct rec_node *node_of(struct gdrp_rec *r)
{
	return &((struct rec_alloc *)r)->node;
}

int gdrp_rec_publish(struct gdrp_rec *r)
{
	struct rec_node *n = node_of(r);
	struct shard *sh = shard_of(r);
	int rc = 0;

	pthread_mutex_lock(&sh->lock);
	oom = false;
	HASH_ADD_PTR(sh->recs, key, n);
	if (oom)
		rc = -ENOMEM;
	pthread_mutex_unlock(&sh->lock);
	return rc;
}

struct gdrp_rec *gdrp_rec_take(struct ibv_mr *mr)
{
	struct gdrp_rec *key = (struct gdrp_rec *)mr;
	struct shard *sh = shard_of(key);
	struct rec_node *n;

	pthread_mutex_lock(&sh->lock);
	HASH_FIND_PTR(sh->recs, &key, n);
	if (n)
		HASH_DEL(sh->recs, n);
	pthread_mutex_unlock(&sh->lock);
	return n ? n->key : NULL;
}

bool gdrp_rec_is_ours(struct ibv_mr *mr)
{
	struct gdrp_rec *key = (struct gdrp_rec *)mr;
	struct shard *sh = shard_of(key);
	struct rec_node *n;

	pthread_mutex_lock(&sh->lock);
	HASH_FIND_PTR(sh->recs, &key, n);
	pthread_mutex_unlock(&sh->lock);
	return n != NULL;
}

int gdrp_pd_note(struct ibv_pd *pd)
{
	struct pd_node *n;
	int rc = 0;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(pds, &pd, n);
	if (!n) {
		n = malloc(sizeof(*n));
		if (n) {
			n->key = pd;
			n->ctx = pd->context;
			oom = false;
			HASH_ADD_PTR(pds, key, n);
			if (oom) {
				free(n);
				n = NULL;
			}
		}
		rc = n ? 0 : -ENOMEM;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

bool gdrp_pd_known(struct ibv_pd *pd)
{
	struct pd_node *n;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(pds, &pd, n);
	pthread_mutex_unlock(&lock);
	return n != NULL;
}

void gdrp_pd_forget(struct ibv_pd *pd)
{
	struct pd_node *n;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(pds, &pd, n);
	if (n)
		HASH_DEL(pds, n);
	pthread_mutex_unlock(&lock);
	free(n);
}

unsigned gdrp_pds_of(struct ibv_context *ctx, struct ibv_pd **out, unsigned max)
{
	struct pd_node *n, *t;
	unsigned k = 0;

	pthread_mutex_lock(&lock);
	HASH_ITER(hh, pds, n, t) {
		if (n->ctx != ctx)
			continue;
		if (k < max)
			out[k] = n->key;
		k++;
	}
	pthread_mutex_unlock(&lock);
	return k;
}

unsigned gdrp_orphan_pd(struct ibv_pd *pd, struct gdr_region **regions, unsigned max)
{
	struct rec_node *n, *t;
	unsigned k = 0;

	for (unsigned i = 0; i < NSHARDS; i++) {
		pthread_mutex_lock(&shards[i].lock);
		HASH_ITER(hh, shards[i].recs, n, t) {
			struct gdrp_rec *r = n->key;

			if (n == &sentinels[i] || r->kind != GDRP_CACHED || r->mr.pd != pd)
				continue;
			if (k < max) {
				regions[k] = r->region;
				r->region = NULL;
				r->kind = GDRP_ORPHAN;
			}
			k++;
		}
		pthread_mutex_unlock(&shards[i].lock);
	}
	return k;
}

/* fork(): no other thread may hold a mutex while the child is made (the child re-creates it). */
static void prepare(void)
{
	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < NSHARDS; i++)
		pthread_mutex_lock(&shards[i].lock);
}

static void parent(void)
{
	for (unsigned i = NSHARDS; i-- > 0;)
		pthread_mutex_unlock(&shards[i].lock);
	pthread_mutex_unlock(&lock);
}

static void child(void)
{
	/* the forking thread, their owner, is the child's only thread */
	for (unsigned i = NSHARDS; i-- > 0;)
		pthread_mutex_unlock(&shards[i].lock);
	pthread_mutex_unlock(&lock);
}

void gdrp_mrtab_atfork(void)
{
	pthread_atfork(prepare, parent, child);
}
