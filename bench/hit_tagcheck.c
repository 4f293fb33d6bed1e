/* SPDX-License-Identifier: MIT */
/*
 * The "check BUFFER_ID on every hit" baseline: the least a correct cache without free events must
 * do on a hit. Entries are whole allocations (one cuPointerGetAttributes on a miss gives range and
 * id), pinned 64 KiB-aligned through hit_cuda.h's callbacks, kept in an array sorted by allocation
 * base. A lookup takes no lock (binary search), takes an atomic reference and asks the driver for
 * the BUFFER_ID; a mismatch drops the entry and pins again. Inserts and evictions are not
 * thread-safe: they happen while one thread warms the cache or runs a trace, never during the
 * threaded hit runs (the array is then read-only). LRU eviction by a use stamp (single thread).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hit_cuda.h"
#include "hit_sys.h"

#define GRAN (64ULL << 10)

struct tc_entry {
	uint64_t base, len;          /* the allocation */
	uint64_t pin_base, pin_len;  /* 64 KiB-aligned pinned range */
	uint64_t id;
	uint64_t last_use;
	int fd;
	int detached;                /* out of the array, freed at its last put */
	_Atomic uint32_t ref;
};

struct tc {
	struct tc_entry **e;
	size_t n, cap;
	uint64_t clock, misses, stale, evictions, pinned_bytes;
	struct sys_limits lim;
	int lru;                     /* limits given (traces): keep use stamps */
};

int tc_open(struct sys *s, const struct sys_limits *lim)
{
	struct tc *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->lim.max_bytes = lim && lim->max_bytes ? lim->max_bytes : UINT64_MAX;
	t->lim.max_entries = lim && lim->max_entries ? lim->max_entries : UINT64_MAX;
	t->lru = lim && (lim->max_bytes || lim->max_entries);
	s->p = t;
	snprintf(s->why, sizeof(s->why),
		 "sorted array without lock + atomic reference + cuPointerGetAttribute(BUFFER_ID) "
		 "per hit");
	return 0;
}

static void tc_unpin(struct tc *t, struct tc_entry *e)
{
	hc_unpin(e->fd);
	t->pinned_bytes -= e->pin_len;
	free(e);
}

/* Index of the last entry with base <= addr, or -1. */
static long tc_find(const struct tc *t, uint64_t addr)
{
	long lo = 0, hi = (long)t->n - 1, r = -1;

	while (lo <= hi) {
		long mid = (lo + hi) / 2;

		if (t->e[mid]->base <= addr) {
			r = mid;
			lo = mid + 1;
		} else {
			hi = mid - 1;
		}
	}
	return r;
}

static void tc_remove(struct tc *t, long i)
{
	struct tc_entry *e = t->e[i];

	memmove(&t->e[i], &t->e[i + 1], (t->n - (size_t)i - 1) * sizeof(t->e[0]));
	t->n--;
	if (atomic_load(&e->ref) == 0)
		tc_unpin(t, e);
	else
		e->detached = 1;
}

static void tc_evict(struct tc *t)
{
	while (t->n > t->lim.max_entries || t->pinned_bytes > t->lim.max_bytes) {
		long victim = -1;

		for (size_t i = 0; i < t->n; i++)
			if (atomic_load(&t->e[i]->ref) == 0 &&
			    (victim < 0 || t->e[i]->last_use < t->e[victim]->last_use))
				victim = (long)i;
		if (victim < 0)
			return;
		t->evictions++;
		tc_remove(t, victim);
	}
}

int tc_get(void *p, uint64_t addr, size_t len, void **reg)
{
	struct tc *t = p;
	long i = tc_find(t, addr);
	struct tc_entry *e;
	uint64_t base, alen, id;

	if (i >= 0) {
		e = t->e[i];
		if (addr + len <= e->base + e->len) {
			atomic_fetch_add_explicit(&e->ref, 1, memory_order_acquire);
			if (hc_buffer_id(addr) == e->id) {
				if (t->lru) /* traces are single-threaded */
					e->last_use = ++t->clock;
				*reg = e;
				return 0;
			}
			atomic_fetch_sub_explicit(&e->ref, 1, memory_order_release);
			t->stale++;
			tc_remove(t, i);
		}
	}
	/* Miss: one query, drop what the new allocation overlaps (stale), pin, insert. */
	if (hc_query(addr, &base, &alen, &id) || addr + len > base + alen)
		return -EINVAL;
	for (long j = (long)t->n - 1; j >= 0; j--)
		if (t->e[j]->base < base + alen && base < t->e[j]->base + t->e[j]->len) {
			t->stale++;
			tc_remove(t, j);
		}
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->base = base;
	e->len = alen;
	e->id = id;
	e->pin_base = base & ~(GRAN - 1);
	e->pin_len = ((base + alen + GRAN - 1) & ~(GRAN - 1)) - e->pin_base;
	if (hc_pin(e->pin_base, e->pin_len, &e->fd)) {
		free(e);
		return -EIO;
	}
	t->misses++;
	t->pinned_bytes += e->pin_len;
	e->last_use = ++t->clock;
	atomic_store(&e->ref, 1);
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 64;
		struct tc_entry **ne = realloc(t->e, cap * sizeof(*ne));

		if (!ne) {
			tc_unpin(t, e);
			return -ENOMEM;
		}
		t->e = ne;
		t->cap = cap;
	}
	i = tc_find(t, base) + 1;
	memmove(&t->e[i + 1], &t->e[i], (t->n - (size_t)i) * sizeof(t->e[0]));
	t->e[i] = e;
	t->n++;
	tc_evict(t);
	*reg = e;
	return 0;
}

void tc_put(void *p, void *reg)
{
	struct tc_entry *e = reg;

	if (atomic_fetch_sub_explicit(&e->ref, 1, memory_order_release) == 1 && e->detached)
		tc_unpin(p, e);
}

void tc_info(void *p, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base, uint64_t *len)
{
	struct tc_entry *e = reg;

	(void)p;
	*id = e->id;
	*seq = 0;
	*base = e->pin_base;
	*len = e->pin_len;
}

uint64_t tc_misses(void *p)
{
	return ((struct tc *)p)->misses;
}

uint64_t tc_pinned(void *p)
{
	return ((struct tc *)p)->pinned_bytes;
}

void tc_describe(void *p, char *buf, size_t len)
{
	struct tc *t = p;

	snprintf(buf, len,
		 "misses %" PRIu64 ", stale %" PRIu64 ", evictions %" PRIu64 ", entries %zu", t->misses,
		 t->stale, t->evictions, t->n);
}

void tc_close(void *p)
{
	struct tc *t = p;

	for (size_t i = 0; i < t->n; i++)
		if (atomic_load(&t->e[i]->ref) == 0)
			tc_unpin(t, t->e[i]);
	free(t->e);
	free(t);
}
