/* SPDX-License-Identifier: MIT */
/*
 * Per-thread state of a cache, for a hit path that takes no lock and writes no cache line another
 * thread's hit writes (docs/FACTS.md, "Hit cost": a shared atomic on one hot entry caps the
 * process at ~12 M/s, a shared read lock at ~6.5 M/s).
 *
 *  - Hold counters. A registration is held through a signed 64-bit counter of the holding thread,
 *    indexed by the registration record's slot: gdr_reg adds one to its own thread's counter,
 *    gdr_dereg subtracts one from it where it is above zero, and otherwise (a release on a thread
 *    that holds none: an MPI progress thread) gives the hold back under the lock, in the cache's
 *    count of such releases for the slot (allocated with the first thread's counters of it).
 *    A record is held while the sum is above zero. Only the cache's writers (under its lock) ever
 *    sum, and only after a grace period that makes the sum final (below). A counter of a thread
 *    that only registers grows by one per registration and is reset only when its record is
 *    reused: 64 bits never wrap in the life of a process (2^63 steps, 292 years at one per ns).
 *  - Read-side epochs. A thread looking up the index without the lock makes its epoch odd for the
 *    duration. A writer that retires an entry marks it dying, then waits until every thread has
 *    been seen with an even epoch or a later one (gdr_thr_sync): any lookup that saw the entry
 *    alive has then finished taking its hold, and every later lookup sees it dying. Memory a lookup
 *    may still read (outgrown hash tables, retired entries and records) is freed only after such a
 *    grace period. The store of the epoch must be ordered before the lookup's loads: where the
 *    kernel offers membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) the writer issues it (every running
 *    thread of the process executes a full barrier) and a lookup needs only a compiler barrier,
 *    as in liburcu's membarrier flavour; elsewhere the lookup increments its epoch with a locked
 *    instruction (on a line only it writes).
 *
 * Thread records live until the cache is destroyed; a thread that exits leaves its record (and its
 * counters, which may hold references) to the next thread that comes to the cache. A thread finds
 * its record of a cache through a direct-mapped table of TLS_SLOTS in TLS (the hit path's one
 * compare) and, behind it, a hash of its own: any number of caches per thread, one record each.
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/thread.h"
#include "common/config.h"
#include "common/log.h"

/* This thread's records, by cache id (ids are never reused, pointers may be): slot id % TLS_SLOTS
 * of a direct-mapped table, then the thread's hash. Initial-exec: read on every hit, where the
 * general-dynamic model would call __tls_get_addr each time; 72 bytes fit the static TLS glibc
 * keeps for libraries loaded later with dlopen. Every record in `tls` is in `map` too. */
#define GDR_TLS __thread __attribute__((tls_model("initial-exec")))
GDR_TLS struct gdr_thr_tls gdr_thr_tls[GDR_THR_TLS_SLOTS];
#define tls gdr_thr_tls
#define TLS_SLOTS GDR_THR_TLS_SLOTS
struct thr_map {
	uint32_t cap, n; /* cap a power of two; n < cap * 3 / 4 */
	struct thr_map_item {
		uint64_t id; /* 0: empty */
		struct gdr_thr *t;
	} v[];
};
static GDR_TLS struct thr_map *tls_map;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
int gdr_thr_asym;
static pthread_key_t exit_key;
/* Caches alive, by id, so that a thread exiting touches only records of live caches. */
static pthread_mutex_t alive_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_id = 1;
static struct gdr_cache *alive;

static bool id_alive(uint64_t id) /* under alive_lock */
{
	for (struct gdr_cache *c = alive; c; c = c->next_alive)
		if (c->id == id)
			return true;
	return false;
}

static struct gdr_thr *map_find(const struct thr_map *m, uint64_t id)
{
	if (!m)
		return NULL;
	for (uint32_t i = (uint32_t)(id * 0x9e3779b97f4a7c15ULL >> 32) & (m->cap - 1);;
	     i = (i + 1) & (m->cap - 1)) {
		if (m->v[i].id == id)
			return m->v[i].t;
		if (!m->v[i].id)
			return NULL;
	}
}

static void map_put(struct thr_map *m, uint64_t id, struct gdr_thr *t)
{
	uint32_t i = (uint32_t)(id * 0x9e3779b97f4a7c15ULL >> 32) & (m->cap - 1);

	while (m->v[i].id)
		i = (i + 1) & (m->cap - 1);
	m->v[i].id = id;
	m->v[i].t = t;
	m->n++;
}

/* Add (id, t) to this thread's hash. Records of caches destroyed since are left out whenever it is
 * rebuilt, so it holds about the caches alive that this thread has used. 0 or -ENOMEM. */
static int map_add(uint64_t id, struct gdr_thr *t)
{
	struct thr_map *m = tls_map, *nm;
	uint32_t live = 0, cap;

	if (m && (m->n + 1) * 4 < m->cap * 3) {
		map_put(m, id, t);
		return 0;
	}
	pthread_mutex_lock(&alive_lock);
	for (uint32_t i = 0; m && i < m->cap; i++)
		live += m->v[i].id && id_alive(m->v[i].id);
	for (cap = 8; (live + 1) * 4 >= cap * 3 / 2; cap *= 2)
		;
	nm = calloc(1, sizeof(*nm) + cap * sizeof(nm->v[0]));
	if (!nm) {
		pthread_mutex_unlock(&alive_lock);
		return -ENOMEM;
	}
	nm->cap = cap;
	for (uint32_t i = 0; m && i < m->cap; i++)
		if (m->v[i].id && id_alive(m->v[i].id))
			map_put(nm, m->v[i].id, m->v[i].t);
	pthread_mutex_unlock(&alive_lock);
	for (unsigned i = 0; i < TLS_SLOTS; i++) {
		if (tls[i].t && !map_find(nm, tls[i].id)) {
			tls[i].id = 0;
			tls[i].t = NULL;
		}
	}
	map_put(nm, id, t);
	tls_map = nm;
	free(m);
	return 0;
}

static void thread_exit(void *arg)
{
	struct thr_map *m = tls_map;

	(void)arg;
	pthread_mutex_lock(&alive_lock);
	for (uint32_t i = 0; m && i < m->cap; i++)
		if (m->v[i].id && id_alive(m->v[i].id))
			__atomic_store_n(&m->v[i].t->dead, 1, __ATOMIC_RELEASE);
	for (unsigned i = 0; i < TLS_SLOTS; i++) {
		tls[i].t = NULL;
		tls[i].id = 0;
	}
	tls_map = NULL;
	pthread_mutex_unlock(&alive_lock);
	free(m);
}

static void key_init(void)
{
	pthread_key_create(&exit_key, thread_exit);
}

/* fork(): the child has one thread. Every cache's lock is taken around the fork so that the child
 * does not inherit one held by a thread it does not have, and the other threads' records are left
 * out of the child's grace periods (a thread caught inside a lookup would be waited for forever).
 * The statistics' list lock first: its holder (the signal thread) takes caches' locks under it. */
static void fork_prepare(void)
{
	/* Counted as held from here to the fork's end (gdr_stats_print, print_live): a signal that
	 * comes during the fork is handled with these locks held, and exit() there must not wait. */
	gdr_locks_held++;
	gdr_stats_fork_prepare();
	pthread_mutex_lock(&alive_lock);
	for (struct gdr_cache *c = alive; c; c = c->next_alive)
		pthread_mutex_lock(&c->lock);
}

static void fork_parent(void)
{
	for (struct gdr_cache *c = alive; c; c = c->next_alive)
		pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&alive_lock);
	gdr_stats_fork_done();
	gdr_locks_held--;
}

static long membarrier(int cmd);

static void fork_child(void)
{
	/* The child is a new mm: register it for membarrier too, or go without it (one thread, none
	 * inside a lookup now, so the switch is safe). */
	if (__atomic_load_n(&gdr_thr_asym, __ATOMIC_RELAXED) &&
	    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED))
		__atomic_store_n(&gdr_thr_asym, 0, __ATOMIC_RELAXED);
	for (struct gdr_cache *c = alive; c; c = c->next_alive) {
		for (struct gdr_thr *t = c->threads; t; t = t->next) {
			bool mine = map_find(tls_map, c->id) == t;

			t->epoch &= ~1ULL;
			if (!mine)
				/* Its counters still count: the holds it made are held. */
				t->dead = 1;
		}
		pthread_mutex_unlock(&c->lock);
	}
	pthread_mutex_unlock(&alive_lock);
	gdr_stats_fork_done();
	gdr_locks_held--;
}

static pthread_once_t asym_once = PTHREAD_ONCE_INIT;

static long membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

static void asym_init(void)
{
	long cmds = membarrier(MEMBARRIER_CMD_QUERY);

	if (gdr_config_tests()->no_membarrier) /* for tests of the other flavour */
		return;
	if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) ||
	    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)) {
		gdr_info(
			"membarrier(PRIVATE_EXPEDITED) unavailable: lookups use a locked increment");
		return;
	}
	__atomic_store_n(&gdr_thr_asym, 1, __ATOMIC_RELEASE);
}

static void atfork_init(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* The fork handlers, once: at the first cache, or when the statistics' signal thread starts. */
void gdr_thr_atfork_init(void)
{
	static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

	pthread_once(&fork_once, atfork_init);
}

void gdr_thr_cache_init(struct gdr_cache *c)
{
	pthread_once(&asym_once, asym_init);
	gdr_thr_atfork_init();
	pthread_mutex_lock(&alive_lock);
	c->id = next_id++;
	c->next_alive = alive;
	alive = c;
	pthread_mutex_unlock(&alive_lock);
}

void gdr_thr_foreach_cache(void (*fn)(struct gdr_cache *c, void *arg), void *arg)
{
	pthread_mutex_lock(&alive_lock);
	for (struct gdr_cache *c = alive; c; c = c->next_alive)
		fn(c, arg);
	pthread_mutex_unlock(&alive_lock);
}

void gdr_thr_cache_fini(struct gdr_cache *c)
{
	struct gdr_thr *t, *n;

	pthread_mutex_lock(&alive_lock);
	for (struct gdr_cache **p = &alive; *p; p = &(*p)->next_alive) {
		if (*p == c) {
			*p = c->next_alive;
			break;
		}
	}
	pthread_mutex_unlock(&alive_lock);
	for (t = c->threads; t; t = n) {
		n = t->next;
		for (unsigned i = 0; i < GDR_SLOT_CHUNKS; i++)
			free(t->chunk[i]);
		free(t);
	}
	c->threads = NULL;
	for (unsigned i = 0; i < GDR_SLOT_CHUNKS; i++) {
		free(c->released[i]);
		c->released[i] = NULL;
	}
}

/* A record for this thread: a dead thread's if there is one, else a new one. */
static struct gdr_thr *thr_attach(struct gdr_cache *c)
{
	struct gdr_thr *t;

	pthread_once(&key_once, key_init);
	for (t = __atomic_load_n(&c->threads, __ATOMIC_ACQUIRE); t; t = t->next) {
		int one = 1;

		if (__atomic_load_n(&t->dead, __ATOMIC_ACQUIRE) &&
		    __atomic_compare_exchange_n(&t->dead, &one, 0, false, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED))
			break;
	}
	if (!t) {
		if (posix_memalign((void **)&t, 64, sizeof(*t)))
			return NULL;
		memset(t, 0, sizeof(*t));
		t->next = __atomic_load_n(&c->threads, __ATOMIC_RELAXED);
		while (!__atomic_compare_exchange_n(&c->threads, &t->next, t, true,
						    __ATOMIC_RELEASE, __ATOMIC_RELAXED))
			;
	}
	if (map_add(c->id, t)) {
		__atomic_store_n(&t->dead, 1, __ATOMIC_RELEASE); /* for the next thread to take */
		return NULL;
	}
	/* The exit destructor runs only for threads whose key value is not NULL. */
	pthread_setspecific(exit_key, (void *)1);
	return t;
}

static struct gdr_thr *thr_lookup(struct gdr_cache *c, bool attach)
{
	unsigned i = c->id % TLS_SLOTS;
	struct gdr_thr *t;

	if (__builtin_expect(tls[i].id == c->id, 1))
		return tls[i].t;
	t = map_find(tls_map, c->id);
	if (!t && attach)
		t = thr_attach(c);
	if (t) {
		tls[i].id = c->id;
		tls[i].t = t;
	}
	return t;
}

struct gdr_thr *gdr_thr_get(struct gdr_cache *c)
{
	return thr_lookup(c, true);
}

struct gdr_thr *gdr_thr_find_slow(struct gdr_cache *c)
{
	return thr_lookup(c, false);
}

int64_t *gdr_thr_counter_alloc(struct gdr_cache *c, struct gdr_thr *t, uint32_t slot)
{
	int64_t **pc = &t->chunk[slot / GDR_SLOT_CHUNK], **pr = &c->released[slot / GDR_SLOT_CHUNK];
	int64_t *ch = __atomic_load_n(pc, __ATOMIC_ACQUIRE);

	if (!*pr && !(*pr = calloc(GDR_SLOT_CHUNK, sizeof(**pr))))
		return NULL;
	if (!ch) {
		ch = calloc(GDR_SLOT_CHUNK, sizeof(*ch));
		if (!ch)
			return NULL;
		__atomic_store_n(pc, ch, __ATOMIC_RELEASE); /* only its own thread installs it */
	}
	return &ch[slot % GDR_SLOT_CHUNK];
}

int64_t *gdr_thr_released(struct gdr_cache *c, uint32_t slot)
{
	int64_t *ch = c->released[slot / GDR_SLOT_CHUNK];

	return ch ? &ch[slot % GDR_SLOT_CHUNK] : NULL;
}

int64_t gdr_thr_sum(struct gdr_cache *c, uint32_t slot)
{
	uint64_t sum = 0; /* +n on one thread and -n on another: add modulo 2^64 */

	for (struct gdr_thr *t = __atomic_load_n(&c->threads, __ATOMIC_ACQUIRE); t; t = t->next) {
		int64_t *ch = __atomic_load_n(&t->chunk[slot / GDR_SLOT_CHUNK], __ATOMIC_ACQUIRE);

		if (ch)
			sum += (uint64_t)__atomic_load_n(&ch[slot % GDR_SLOT_CHUNK],
							 __ATOMIC_ACQUIRE);
	}
	return (int64_t)sum;
}

void gdr_thr_zero(struct gdr_cache *c, uint32_t slot)
{
	for (struct gdr_thr *t = __atomic_load_n(&c->threads, __ATOMIC_ACQUIRE); t; t = t->next) {
		int64_t *ch = __atomic_load_n(&t->chunk[slot / GDR_SLOT_CHUNK], __ATOMIC_ACQUIRE);

		if (ch)
			__atomic_store_n(&ch[slot % GDR_SLOT_CHUNK], 0, __ATOMIC_RELAXED);
	}
	if (c->released[slot / GDR_SLOT_CHUNK])
		c->released[slot / GDR_SLOT_CHUNK][slot % GDR_SLOT_CHUNK] = 0;
}

void gdr_thr_sync(struct gdr_cache *c)
{
	/* The caller's seq_cst store (an entry or record marked dying) is ordered before these
	 * seq_cst loads, as a lookup's epoch increment is before its load of the state: by the
	 * lookup's locked increment, or by the barrier membarrier makes every running thread
	 * execute now (a thread not running passes one when it is switched in). */
	if (__atomic_load_n(&gdr_thr_asym, __ATOMIC_ACQUIRE) &&
	    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
		gdr_log_once(GDR_LOG_ERROR, "membarrier failed after it was registered");
		abort(); /* cannot happen once registered; never run a grace period without it */
	}
	/* This thread's own section is not waited for: a grace period runs outside one, so if this
	 * thread's is open, a signal handler interrupted it and runs the library now (exit() from
	 * one, and the program's clean-up at exit); that section never ends (issue 31 #8's class). */
	struct gdr_thr *self = gdr_thr_find(c);

	for (struct gdr_thr *t = __atomic_load_n(&c->threads, __ATOMIC_ACQUIRE); t; t = t->next) {
		uint64_t e = __atomic_load_n(&t->epoch, __ATOMIC_SEQ_CST);

		if (!(e & 1) || t == self)
			continue;
		while (__atomic_load_n(&t->epoch, __ATOMIC_ACQUIRE) == e)
			sched_yield();
	}
}

void gdr_thr_totals(struct gdr_cache *c, uint64_t *fast_hits, uint64_t *tag_checks)
{
	*fast_hits = *tag_checks = 0;
	for (struct gdr_thr *t = __atomic_load_n(&c->threads, __ATOMIC_ACQUIRE); t; t = t->next) {
		*fast_hits += __atomic_load_n(&t->fast_hits, __ATOMIC_RELAXED);
		*tag_checks += __atomic_load_n(&t->tag_checks, __ATOMIC_RELAXED);
	}
}
