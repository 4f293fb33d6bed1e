/* SPDX-License-Identifier: MIT */
/* Validation: is a cached allocation still the one that was pinned? (validate.c) */
#ifndef GDR_VALIDATE_H
#define GDR_VALIDATE_H

#include <stdbool.h>
#include <stdint.h>

struct gdr_tag {
	uint64_t start, size; /* the CUDA allocation (or VMM mapping, or the physical chunk of a
				 stream-ordered pool allocation that holds the address asked for) */
	uint64_t alloc_start, alloc_size; /* the whole allocation as RANGE_* reports it */
	uint64_t buffer_id;
	uint8_t kind; /* enum gdr_mem_kind */
	int device;   /* CUDA ordinal */
};
struct gdr_validator_ops {
	const char *name;
	int mode; /* enum gdr_validate */
	/* The cache applies every free event before it hands an entry out (and gdrcache.ko's
	 * revocation page is read on every hit): a hit asks the driver nothing. Otherwise a hit calls
	 * check, and each call is a driver query (counted in tag_checks). */
	bool events;
	/* 0 = still valid, -ESTALE = freed or replaced, other -errno = could not tell (treated stale).
	 * Called with or without the cache's lock held. */
	int (*check)(const struct gdr_tag *tag);
};
extern const struct gdr_validator_ops gdr_validate_tag_ops;
extern const struct gdr_validator_ops gdr_validate_events_ops;
const struct gdr_validator_ops *gdr_validator_for(int mode);

#endif /* GDR_VALIDATE_H */
