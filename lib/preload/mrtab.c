/* SPDX-License-Identifier: MIT */
/*
 * The MRs the preload handed out (shadow records, found again by pointer at ibv_dereg_mr and
 * ibv_rereg_mr) and the PDs the cache made MRs for (released before ibv_dealloc_pd and
 * ibv_close_device), behind one mutex that is never held across a call into the library or
 * libibverbs.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

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

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct rec_node *recs;
static struct pd_node *pds;
static bool oom;

struct gdrp_rec *gdrp_rec_new(void)
{
	struct rec_alloc *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	a->node.key = &a->rec;
	return &a->rec;
}

void gdrp_rec_free(struct gdrp_rec *r)
{
	free(r); /* the struct rec_alloc starts with it */
}

static struct rec_node *node_of(struct gdrp_rec *r)
{
	return &((struct rec_alloc *)r)->node;
}

int gdrp_rec_publish(struct gdrp_rec *r)
{
	struct rec_node *n = node_of(r);
	int rc = 0;

	pthread_mutex_lock(&lock);
	oom = false;
	HASH_ADD_PTR(recs, key, n);
	if (oom)
		rc = -ENOMEM;
	pthread_mutex_unlock(&lock);
	return rc;
}

struct gdrp_rec *gdrp_rec_take(struct ibv_mr *mr)
{
	struct gdrp_rec *key = (struct gdrp_rec *)mr;
	struct rec_node *n;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(recs, &key, n);
	if (n)
		HASH_DEL(recs, n);
	pthread_mutex_unlock(&lock);
	return n ? n->key : NULL;
}

bool gdrp_rec_is_ours(struct ibv_mr *mr)
{
	struct gdrp_rec *key = (struct gdrp_rec *)mr;
	struct rec_node *n;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(recs, &key, n);
	pthread_mutex_unlock(&lock);
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

	pthread_mutex_lock(&lock);
	HASH_ITER(hh, recs, n, t) {
		struct gdrp_rec *r = n->key;

		if (r->kind != GDRP_CACHED || r->mr.pd != pd)
			continue;
		if (k < max) {
			regions[k] = r->region;
			r->region = NULL;
			r->kind = GDRP_ORPHAN;
		}
		k++;
	}
	pthread_mutex_unlock(&lock);
	return k;
}

/* fork(): no other thread may hold the mutex while the child is made (the child re-creates it). */
static void prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void parent(void)
{
	pthread_mutex_unlock(&lock);
}

static void child(void)
{
	pthread_mutex_unlock(&lock); /* the forking thread, its owner, is the child's only thread */
}

void gdrp_mrtab_atfork(void)
{
	pthread_atfork(prepare, parent, child);
}
