/* SPDX-License-Identifier: MIT */
/*
 * The MRs the preload handed out (shadow records, found again by pointer at ibv_dereg_mr and
 * ibv_rereg_mr) and the PDs the cache made MRs for (released before ibv_dealloc_pd and
 * ibv_close_device, behind one mutex, off the hit path).
 *
 * A hit (ibv_reg_mr of cached GPU memory, then ibv_dereg_mr of what it returned) takes no lock and
 * writes no cache line another thread's hit writes (docs/FACTS.md, "Hit cost"); its part of the
 * records is inline in mrtab.h, the rest is here:
 *  - Where records live. Each is a GDRP_SLOT_SIZE slot of one arena: address space reserved at the
 *    first cached registration (PROT_NONE, MAP_NORESERVE: no memory yet), made readable and
 *    writable ARENA_CHUNK at a time as slots are needed, never unmapped. Records are recycled
 *    (a thread's free list, then a shared pool), never freed.
 *  - Whose pointer it is. A pointer inside [arena, arena + committed) at a slot boundary is one of
 *    ours: nothing else can be mapped inside our reservation, so libibverbs' MRs (its provider's
 *    malloc) are never there, and every other pointer goes to libibverbs unchanged. That is two
 *    loads of words written only when the arena grows and a compare: no table to publish in.
 *  - Whether it is live: each record's state word, changed only by atomic operations.
 *      FREE  -> LIVE   gdrp_rec_publish, a store-release once the record is filled;
 *      LIVE  -> TAKEN  the one ibv_dereg_mr / ibv_rereg_mr that wins a compare-and-swap (acquire:
 *                      it then reads what the publisher wrote); a second one fails;
 *      TAKEN -> LIVE   a re-registration done, or a wrapped MR libibverbs would not release;
 *      TAKEN -> FREE   gdrp_rec_free;
 *      LIVE  -> HELD -> LIVE  gdrp_orphan_pd, under orphan_lock, with a few stores in between (a
 *                      take that meets HELD waits for orphan_lock and tries again).
 *    A second ibv_dereg_mr of a shadow finds it FREE (or TAKEN, racing the first) and is refused,
 *    EINVAL, never handed to libibverbs (a real provider would destroy the cached MR by the
 *    shadow's handle). A thread reuses its free records oldest first, and gives the pool its
 *    oldest, so a record just released is the last to be handed out again; once it was, the
 *    pointer is that registration's, as a pointer malloc freed and handed out again would be.
 *  - Why no lookup reads freed memory: nothing is ever freed, and every slot below `committed`
 *    stays mapped. A record's plain fields are read only by the thread that won it (TAKEN or
 *    HELD), after its publisher wrote them and stored LIVE with release; a free record is on one
 *    thread's list or in the pool (under pool_lock), and only its holder writes it.
 *  - Memory. A thread keeps at most GDRP_REC_KEEP free records (a list of its own: no lock) and
 *    moves REC_BATCH at a time to and from the pool, which takes the records released on other
 *    threads (an MPI progress thread) and those of exited threads; new slots are carved only when
 *    both are empty. The arena holds at most the peak of live shadows plus about GDRP_REC_KEEP +
 *    REC_BATCH a thread: under churn it stops growing. When it is full (ARENA_MAX: 8 Mi records), registrations go to libibverbs.
 *  - fork(). prepare takes pool_lock, orphan_lock and the PDs' lock, so no record is HELD and the
 *    pool is whole when the child is made; both sides release them. The child inherits the arena:
 *    a shadow live in the parent is live in the child (its ibv_dereg_mr there only forgets it:
 *    interpose.c); one another thread was releasing or re-registering at that moment stays TAKEN
 *    and its ibv_dereg_mr in the child is refused (EINVAL); other threads' free lists are lost
 *    to the child (it registers nothing through the cache).
 * A program that never registers GPU memory never reserves the arena, and its ibv_dereg_mr pays
 * two loads and a compare.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mrtab.h"

#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (oom = true)
#include <uthash.h>

/* ---- Shadow records ---------------------------------------------------------------------------- */

#define ARENA_MAX ((size_t)1 << 30)   /* reserved: 8 Mi records; less where mmap refuses it */
#define ARENA_MIN ((size_t)1 << 24)   /* the least reservation tried */
#define ARENA_CHUNK ((size_t)1 << 20) /* made readable and writable at a time: 8192 records */
#define REC_BATCH 32                  /* moved between a thread and the pool at once */

char *gdrp_arena;
size_t gdrp_committed;
static size_t carved; /* atomic; bytes of the arena handed out as slots; written under pool_lock */
static size_t reserved; /* under pool_lock */

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* pool, arena growth */
static struct gdrp_slot *pool;
static pthread_mutex_t orphan_lock = PTHREAD_MUTEX_INITIALIZER; /* held while records are HELD */

/* A thread's free records, oldest first (reused first: a record just released is the last one its
 * thread hands out again). Armed: its exit hands them to the pool; direct: it has no destructor
 * (or is exiting), and what it releases goes to the pool at once. */
GDRP_TLS struct gdrp_slot *gdrp_kept, *gdrp_kept_last;
GDRP_TLS unsigned gdrp_nkept;
GDRP_TLS bool gdrp_kept_armed;
static GDRP_TLS bool direct;
static pthread_key_t rec_key;
static bool rec_key_ok;
static pthread_once_t rec_key_once = PTHREAD_ONCE_INIT;

static void pool_put(struct gdrp_slot *first, struct gdrp_slot *last)
{
	pthread_mutex_lock(&pool_lock);
	last->next = pool;
	pool = first;
	pthread_mutex_unlock(&pool_lock);
}

static void thread_exit(void *arg)
{
	(void)arg;
	gdrp_kept_armed = false;
	direct = true; /* records a later destructor releases go to the pool at once */
	if (!gdrp_kept)
		return;
	pool_put(gdrp_kept, gdrp_kept_last);
	gdrp_kept = gdrp_kept_last = NULL;
	gdrp_nkept = 0;
}

static void rec_key_make(void)
{
	rec_key_ok = !pthread_key_create(&rec_key, thread_exit);
}

/* The thread's first use of the records: arm its destructor (once). */
static void thread_arm(void)
{
	if (gdrp_kept_armed || direct)
		return;
	pthread_once(&rec_key_once, rec_key_make);
	if (rec_key_ok && !pthread_setspecific(rec_key, (void *)1))
		gdrp_kept_armed = true;
	else
		direct = true;
}

/* Under pool_lock: reserve the arena (the first time), map its next chunk. 0 or -ENOMEM. */
static int arena_grow(void)
{
	size_t c = __atomic_load_n(&gdrp_committed, __ATOMIC_RELAXED);
	char *a = __atomic_load_n(&gdrp_arena, __ATOMIC_RELAXED);

	for (size_t sz = ARENA_MAX; !a && sz >= ARENA_MIN; sz >>= 2) {
		void *p = mmap(NULL, sz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
			       0);

		if (p != MAP_FAILED) {
			a = p;
			reserved = sz;
			__atomic_store_n(&gdrp_arena, a, __ATOMIC_RELEASE);
		}
	}
	if (!a || c + ARENA_CHUNK > reserved ||
	    mprotect(a + c, ARENA_CHUNK, PROT_READ | PROT_WRITE))
		return -ENOMEM;
	__atomic_store_n(&gdrp_committed, c + ARENA_CHUNK, __ATOMIC_RELEASE);
	return 0;
}

static void kept_push_front(struct gdrp_slot *s)
{
	if (!gdrp_kept)
		gdrp_kept_last = s;
	s->next = gdrp_kept;
	gdrp_kept = s;
	gdrp_nkept++;
}

/* The thread's list is empty: up to REC_BATCH records from the pool, else new slots (one only for
 * a thread without a destructor, whose list would be lost at its exit). */
struct gdrp_slot *gdrp_rec_refill(void)
{
	int saved = errno; /* on the hit path, which touches none */
	unsigned want, n = 0;

	thread_arm();
	want = gdrp_kept_armed ? REC_BATCH : 1;
	pthread_mutex_lock(&pool_lock);
	while (pool && n < want) {
		struct gdrp_slot *s = pool;

		pool = s->next;
		kept_push_front(s);
		n++;
	}
	while (n < want) {
		size_t c = __atomic_load_n(&carved, __ATOMIC_RELAXED);

		if (c + GDRP_SLOT_SIZE > __atomic_load_n(&gdrp_committed, __ATOMIC_RELAXED) &&
		    arena_grow())
			break;
		__atomic_store_n(&carved, c + GDRP_SLOT_SIZE, __ATOMIC_RELEASE);
		kept_push_front((struct gdrp_slot *)(void *)(gdrp_arena + c));
		n++;
	}
	pthread_mutex_unlock(&pool_lock);
	errno = saved;
	return gdrp_kept;
}

void gdrp_rec_free_slow(struct gdrp_slot *s)
{
	int saved = errno; /* on the release's hit path, which touches none */
	struct gdrp_slot *first, *last;

	thread_arm();
	errno = saved;
	if (!gdrp_kept_armed) {
		s->next = NULL;
		pool_put(s, s);
		return;
	}
	gdrp_kept_append(s);
	if (gdrp_nkept <= GDRP_REC_KEEP)
		return;
	/* Records released here but made on other threads: the oldest REC_BATCH to the pool. */
	first = last = gdrp_kept;
	for (unsigned i = 1; i < REC_BATCH; i++)
		last = last->next;
	gdrp_kept = last->next;
	gdrp_nkept -= REC_BATCH;
	pool_put(first, last);
}

int gdrp_rec_take_held(struct gdrp_slot *s)
{
	uint32_t st;

	do {
		/* gdrp_orphan_pd holds orphan_lock while any record is HELD */
		pthread_mutex_lock(&orphan_lock);
		pthread_mutex_unlock(&orphan_lock);
		st = GDRP_REC_LIVE;
		if (__atomic_compare_exchange_n(&s->state, &st, GDRP_REC_TAKEN, false,
						__ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return 0;
	} while (st == GDRP_REC_HELD);
	return -EINVAL;
}

uint64_t gdrp_rec_count(void)
{
	return __atomic_load_n(&carved, __ATOMIC_RELAXED) / GDRP_SLOT_SIZE;
}

unsigned gdrp_orphan_pd(struct ibv_pd *pd, struct gdr_region **regions, unsigned max)
{
	size_t end = __atomic_load_n(&carved, __ATOMIC_ACQUIRE);
	char *a = __atomic_load_n(&gdrp_arena, __ATOMIC_ACQUIRE);
	unsigned k = 0;

	pthread_mutex_lock(&orphan_lock);
	for (size_t off = 0; off < end; off += GDRP_SLOT_SIZE) {
		struct gdrp_slot *s = (struct gdrp_slot *)(void *)(a + off);
		struct gdrp_rec *r = &s->rec;
		uint32_t st = GDRP_REC_LIVE;

		if (__atomic_load_n(&s->state, __ATOMIC_RELAXED) != GDRP_REC_LIVE ||
		    !__atomic_compare_exchange_n(&s->state, &st, GDRP_REC_HELD, false,
						 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			continue;
		if (r->kind == GDRP_CACHED && r->mr.pd == pd) {
			if (k < max) {
				regions[k] = r->region;
				r->region = NULL;
				r->kind = GDRP_ORPHAN;
			}
			k++;
		}
		__atomic_store_n(&s->state, GDRP_REC_LIVE, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&orphan_lock);
	return k;
}

/* ---- Protection domains -------------------------------------------------------------------------- */

struct pd_node {
	struct ibv_pd *key;
	struct ibv_context *ctx; /* read when the PD was valid: never read pd->context later */
	uint64_t notes;          /* gdrp_pd_note calls since it was added */
	UT_hash_handle hh;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* the PDs */
static struct pd_node *pds;
/* set by uthash under the lock */
static GDRP_TLS bool oom;

int gdrp_pd_note(struct ibv_pd *pd)
{
	struct pd_node *n;
	int rc = 0;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(pds, &pd, n);
	if (n) {
		/* Maybe a PD at the address of one being deallocated (gdrp_pd_forget), of
		 * another device. */
		n->ctx = pd->context;
		n->notes++;
	} else {
		n = malloc(sizeof(*n));
		if (n) {
			n->key = pd;
			n->ctx = pd->context;
			n->notes = 0;
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

bool gdrp_pd_known(struct ibv_pd *pd, uint64_t *notes)
{
	struct pd_node *n;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(pds, &pd, n);
	*notes = n ? n->notes : 0;
	pthread_mutex_unlock(&lock);
	return n != NULL;
}

void gdrp_pd_forget(struct ibv_pd *pd, const uint64_t *notes)
{
	struct pd_node *n;

	pthread_mutex_lock(&lock);
	HASH_FIND_PTR(pds, &pd, n);
	if (n && (!notes || n->notes == *notes))
		HASH_DEL(pds, n);
	else
		n = NULL;
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

/* ---- fork() -------------------------------------------------------------------------------------- */

/* No other thread may hold a mutex while the child is made (the child's one thread unlocks
 * them); with orphan_lock held no record is HELD. The hit path holds none of them. */
static void prepare(void)
{
	pthread_mutex_lock(&lock);
	pthread_mutex_lock(&pool_lock);
	pthread_mutex_lock(&orphan_lock);
}

static void unlock_all(void)
{
	pthread_mutex_unlock(&orphan_lock);
	pthread_mutex_unlock(&pool_lock);
	pthread_mutex_unlock(&lock);
}

void gdrp_mrtab_atfork(void)
{
	pthread_atfork(prepare, unlock_all, unlock_all);
}
