/* SPDX-License-Identifier: MIT */
/* A set of buffer ids with one byte each (idset.c): the allocations a cache gave SYNC_MEMOPS. */
#ifndef GDR_CACHE_IDSET_H
#define GDR_CACHE_IDSET_H

#include <stdint.h>

/* Open addressing with linear probing over two arrays, 9 bytes a slot, at most 3/4 full: about 16
 * bytes an id (uthash's items were 72). Id 0 is never kept. Under the cache's lock. */
struct gdr_idset {
	uint64_t *id; /* 0: empty */
	uint8_t *val;
	uint32_t cap; /* a power of two, or 0 */
	uint32_t n;
	uint32_t hand; /* where the next id to forget at the bound is looked for */
};

/* id's byte, or NULL where id is not in the set. */
uint8_t *gdr_idset_find(const struct gdr_idset *s, uint64_t id);
/* Put id with val (or set its val), forgetting another id first if the set holds max of them:
 * the next one from a hand that goes round the table (the set is a memo, not a record). 0, or
 * -ENOMEM (id not put). */
int gdr_idset_put(struct gdr_idset *s, uint64_t id, uint8_t val, uint32_t max);
void gdr_idset_del(struct gdr_idset *s, uint64_t id);
void gdr_idset_free(struct gdr_idset *s);

#endif /* GDR_CACHE_IDSET_H */
