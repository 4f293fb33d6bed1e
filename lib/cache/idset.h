/* SPDX-License-Identifier: MIT */
/* A set of buffer ids with one byte each (idset.c): the allocations a cache gave SYNC_MEMOPS. */
#ifndef GDR_CACHE_IDSET_H
#define GDR_CACHE_IDSET_H

#include <stdint.h>

/* Open addressing with linear probing, one 8-byte word a slot (the id above its byte), at most 3/4
 * full: 11 to 21 bytes an id (uthash's items were 72). Id 0 is never kept, nor an id of 2^56 or
 * more (the set is a memo: such an id is only asked about again). Under the cache's lock. */
#define GDR_IDSET_ID_MAX ((1ULL << 56) - 1)
struct gdr_idset {
	uint64_t *w;  /* id << 8 | byte; 0: empty */
	uint32_t cap; /* a power of two, or 0 */
	uint32_t n;
	uint32_t hand; /* where the next id to forget at the bound is looked for */
};

/* Whether id is in the set: 1 and its byte in *val, or 0. */
int gdr_idset_get(const struct gdr_idset *s, uint64_t id, uint8_t *val);
/* Put id with val (or set its val), forgetting another id first if the set holds max of them:
 * the next one from a hand that goes round the table (the set is a memo, not a record). 0, or
 * -ENOMEM (id not put). An id the set does not keep (0, above GDR_IDSET_ID_MAX) is not put: 0. */
int gdr_idset_put(struct gdr_idset *s, uint64_t id, uint8_t val, uint32_t max);
void gdr_idset_del(struct gdr_idset *s, uint64_t id);
void gdr_idset_free(struct gdr_idset *s);

#endif /* GDR_CACHE_IDSET_H */
