/* SPDX-License-Identifier: MIT */
/* The lookup structure: cached entries, never overlapping, in an array sorted by base address,
 * changed under the cache lock; and its snapshots, immutable copies that the lock-free hit path
 * searches (published by cache.c, freed after a grace period: thread.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gdrcache_int.h"

size_t gdr_index_lower(const struct gdr_index *ix, uint64_t addr)
{
	size_t lo = 0, hi = ix->n;

	/* First entry whose end is above addr. Entries do not overlap, so ends are sorted too. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct gdr_entry *e = ix->v[mid];

		if (e->base + e->len <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct gdr_entry *gdr_index_find(const struct gdr_index *ix, uint64_t addr)
{
	size_t i = gdr_index_lower(ix, addr);

	if (i < ix->n && ix->v[i]->base <= addr)
		return ix->v[i];
	return NULL;
}

int gdr_index_insert(struct gdr_index *ix, struct gdr_entry *e)
{
	size_t i;

	if (ix->n == ix->cap) {
		size_t cap = ix->cap ? ix->cap * 2 : 64;
		struct gdr_entry **v = realloc(ix->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ix->v = v;
		ix->cap = cap;
	}
	i = gdr_index_lower(ix, e->base);
	memmove(&ix->v[i + 1], &ix->v[i], (ix->n - i) * sizeof(ix->v[0]));
	ix->v[i] = e;
	ix->n++;
	ix->dirty = true;
	return 0;
}

void gdr_index_remove(struct gdr_index *ix, struct gdr_entry *e)
{
	size_t i = gdr_index_lower(ix, e->base);

	if (i < ix->n && ix->v[i] == e) {
		memmove(&ix->v[i], &ix->v[i + 1], (ix->n - i - 1) * sizeof(ix->v[0]));
		ix->n--;
		ix->dirty = true;
	}
}

void gdr_index_free(struct gdr_index *ix)
{
	free(ix->v);
	memset(ix, 0, sizeof(*ix));
}

struct gdr_snap *gdr_snap_build(const struct gdr_index *ix)
{
	struct gdr_snap *s = malloc(sizeof(*s) + ix->n * sizeof(s->v[0]));

	if (!s)
		return NULL;
	s->n = ix->n;
	s->defer = NULL;
	for (size_t i = 0; i < ix->n; i++) {
		s->v[i].base = ix->v[i]->base;
		s->v[i].end = ix->v[i]->base + ix->v[i]->len;
		s->v[i].e = ix->v[i];
	}
	return s;
}
