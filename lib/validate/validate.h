/* SPDX-License-Identifier: MIT */
/* Validation: is a cached allocation still the one that was pinned? (validate.c) */
#ifndef GDR_VALIDATE_H
#define GDR_VALIDATE_H

#include <stdint.h>

struct gdr_tag {
	uint64_t start, size;  /* the CUDA allocation (or VMM mapping, or the physical chunk of a
				  stream-ordered pool allocation that holds the address asked for) */
	uint64_t alloc_start, alloc_size; /* the whole allocation as RANGE_* reports it */
	uint64_t buffer_id;
	uint8_t kind;          /* enum gdr_mem_kind */
	int device;            /* CUDA ordinal */
};
struct gdr_cache;
struct gdr_validator_ops {
	const char *name;
	/* 0 = still valid, -ESTALE = freed or replaced, other -errno = could not tell (treated stale).
	 * Called with or without c->lock held: it must not touch the cache's state. */
	int (*check)(struct gdr_cache *c, const struct gdr_tag *tag);
};
extern const struct gdr_validator_ops gdr_validate_tag_ops;
extern const struct gdr_validator_ops gdr_validate_events_ops;
const struct gdr_validator_ops *gdr_validator_for(int mode);

#endif /* GDR_VALIDATE_H */
