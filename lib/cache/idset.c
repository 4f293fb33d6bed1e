/* SPDX-License-Identifier: MIT */
/* A set of buffer ids with one byte each (idset.h). Deletion shifts the run back (no tombstones),
 * so a lookup's probe ends at the first empty slot however many ids came and went. */
#include <errno.h>
#include <stdlib.h>

#include "cache/idset.h"

static uint32_t home(uint64_t id, uint32_t cap)
{
	return (uint32_t)((id * 0x9e3779b97f4a7c15ULL) >> 32) & (cap - 1);
}

static uint32_t find_pos(const struct gdr_idset *s, uint64_t id)
{
	uint32_t i = home(id, s->cap);

	while (s->id[i] && s->id[i] != id)
		i = (i + 1) & (s->cap - 1);
	return i;
}

uint8_t *gdr_idset_find(const struct gdr_idset *s, uint64_t id)
{
	uint32_t i;

	if (!id || !s->cap)
		return NULL;
	i = find_pos(s, id);
	return s->id[i] ? &s->val[i] : NULL;
}

static void del_at(struct gdr_idset *s, uint32_t i)
{
	uint32_t mask = s->cap - 1;

	/* Move back every later id of the run that may sit at i (its home not in (i, j]). */
	for (uint32_t j = (i + 1) & mask; s->id[j]; j = (j + 1) & mask) {
		uint32_t h = home(s->id[j], s->cap);

		if (((j - h) & mask) >= ((j - i) & mask)) {
			s->id[i] = s->id[j];
			s->val[i] = s->val[j];
			i = j;
		}
	}
	s->id[i] = 0;
	s->val[i] = 0;
	s->n--;
}

void gdr_idset_del(struct gdr_idset *s, uint64_t id)
{
	uint32_t i;

	if (!id || !s->cap)
		return;
	i = find_pos(s, id);
	if (s->id[i])
		del_at(s, i);
}

static int grow(struct gdr_idset *s)
{
	uint32_t cap = s->cap ? s->cap * 2 : 16;
	struct gdr_idset t = { .cap = cap };

	if (!cap)
		return -ENOMEM;
	t.id = calloc(cap, sizeof(*t.id));
	t.val = calloc(cap, sizeof(*t.val));
	if (!t.id || !t.val) {
		free(t.id);
		free(t.val);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < s->cap; i++) {
		if (s->id[i]) {
			uint32_t j = find_pos(&t, s->id[i]);

			t.id[j] = s->id[i];
			t.val[j] = s->val[i];
			t.n++;
		}
	}
	t.hand = s->hand & (cap - 1);
	free(s->id);
	free(s->val);
	*s = t;
	return 0;
}

int gdr_idset_put(struct gdr_idset *s, uint64_t id, uint8_t val, uint32_t max)
{
	uint8_t *v = gdr_idset_find(s, id);
	uint32_t i;

	if (!id)
		return 0;
	if (v) {
		*v = val;
		return 0;
	}
	if (max && s->n >= max) {
		while (!s->id[s->hand])
			s->hand = (s->hand + 1) & (s->cap - 1);
		del_at(s, s->hand);
	}
	if ((s->n + 1) * 4 > s->cap * 3 && grow(s))
		return -ENOMEM;
	i = find_pos(s, id);
	s->id[i] = id;
	s->val[i] = val;
	s->n++;
	return 0;
}

void gdr_idset_free(struct gdr_idset *s)
{
	free(s->id);
	free(s->val);
	*s = (struct gdr_idset){ 0 };
}
