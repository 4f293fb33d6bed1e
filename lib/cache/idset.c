/* SPDX-License-Identifier: MIT */
/* A set of buffer ids with one byte each (idset.h). Deletion shifts the run back (no tombstones),
 * so a lookup's probe ends at the first empty slot however many ids came and went. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "cache/idset.h"

static uint64_t id_of(uint64_t w)
{
	return w >> 8;
}

static uint32_t home(uint64_t id, uint32_t cap)
{
	return (uint32_t)((id * 0x9e3779b97f4a7c15ULL) >> 32) & (cap - 1);
}

static uint32_t find_pos(const uint64_t *w, uint32_t cap, uint64_t id)
{
	uint32_t i = home(id, cap);

	while (w[i] && id_of(w[i]) != id)
		i = (i + 1) & (cap - 1);
	return i;
}

static bool kept(uint64_t id)
{
	return id && id <= GDR_IDSET_ID_MAX;
}

int gdr_idset_get(const struct gdr_idset *s, uint64_t id, uint8_t *val)
{
	uint32_t i;

	if (!kept(id) || !s->cap)
		return 0;
	i = find_pos(s->w, s->cap, id);
	if (!s->w[i])
		return 0;
	*val = (uint8_t)s->w[i];
	return 1;
}

static void del_at(struct gdr_idset *s, uint32_t i)
{
	uint32_t mask = s->cap - 1;

	/* Move back every later id of the run that may sit at i (its home not in (i, j]). */
	for (uint32_t j = (i + 1) & mask; s->w[j]; j = (j + 1) & mask) {
		uint32_t h = home(id_of(s->w[j]), s->cap);

		if (((j - h) & mask) >= ((j - i) & mask)) {
			s->w[i] = s->w[j];
			i = j;
		}
	}
	s->w[i] = 0;
	s->n--;
}

void gdr_idset_del(struct gdr_idset *s, uint64_t id)
{
	uint32_t i;

	if (!kept(id) || !s->cap)
		return;
	i = find_pos(s->w, s->cap, id);
	if (s->w[i])
		del_at(s, i);
}

static int grow(struct gdr_idset *s)
{
	uint32_t cap = s->cap ? s->cap * 2 : 16;
	uint64_t *w;

	if (!cap)
		return -ENOMEM;
	w = calloc(cap, sizeof(*w));
	if (!w)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->cap; i++)
		if (s->w[i])
			w[find_pos(w, cap, id_of(s->w[i]))] = s->w[i];
	free(s->w);
	s->w = w;
	s->cap = cap;
	s->hand &= cap - 1;
	return 0;
}

int gdr_idset_put(struct gdr_idset *s, uint64_t id, uint8_t val, uint32_t max)
{
	uint32_t i;

	if (!kept(id))
		return 0;
	if (s->cap) {
		i = find_pos(s->w, s->cap, id);
		if (s->w[i]) {
			s->w[i] = id << 8 | val;
			return 0;
		}
	}
	if (max && s->n >= max) {
		while (!s->w[s->hand])
			s->hand = (s->hand + 1) & (s->cap - 1);
		del_at(s, s->hand);
	}
	if ((s->n + 1) * 4 > s->cap * 3 && grow(s))
		return -ENOMEM;
	i = find_pos(s->w, s->cap, id);
	s->w[i] = id << 8 | val;
	s->n++;
	return 0;
}

void gdr_idset_free(struct gdr_idset *s)
{
	free(s->w);
	*s = (struct gdr_idset){ 0 };
}
