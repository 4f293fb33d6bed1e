/* SPDX-License-Identifier: MIT */
/*
 * Validation: is a cached allocation still the one that was pinned? Mode "tag" asks the driver for
 * CU_POINTER_ATTRIBUTE_BUFFER_ID on every hit: ids are process-wide unique and never reused, so an
 * equal id proves the same allocation, and a freed (or freed and reallocated) buffer shows as
 * INVALID_VALUE or as a new id. Mode "events" trusts the free events the cache drains instead.
 * A check runs without the cache lock held (the hit path validates after taking its reference).
 */
#include <errno.h>

#include "cuda/cuda.h"
#include "validate/validate.h"
#include "gdrcache.h"

static int tag_check(const struct gdr_tag *tag)
{
	uint64_t id = 0;
	int rc;

	rc = gdr_cuda_buffer_id(tag->start, &id);
	if (rc)
		return rc;
	return id == tag->buffer_id ? 0 : -ESTALE;
}

const struct gdr_validator_ops gdr_validate_tag_ops = {
	.name = "tag",
	.mode = GDR_VALIDATE_TAG,
	.events = false,
	.check = tag_check,
};

/* Mode "events": the cache applies every free event (intercept/events.h) before it trusts an entry, and
 * gdrcache.ko's revocation page is read on every hit; nothing is left to ask the driver. */
static int events_check(const struct gdr_tag *tag)
{
	(void)tag;
	return 0;
}

const struct gdr_validator_ops gdr_validate_events_ops = {
	.name = "events",
	.mode = GDR_VALIDATE_EVENTS,
	.events = true,
	.check = events_check,
};

/* AUTO is resolved by gdr_cache_create into one of the two. */
const struct gdr_validator_ops *gdr_validator_for(int mode)
{
	switch (mode) {
	case GDR_VALIDATE_TAG:
	case GDR_VALIDATE_AUTO:
		return &gdr_validate_tag_ops;
	case GDR_VALIDATE_EVENTS:
		return &gdr_validate_events_ops;
	default:
		return NULL;
	}
}
