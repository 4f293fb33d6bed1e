/* SPDX-License-Identifier: MIT */
/*
 * The API of 0.1 for the programs built against it (rdma-core's compat-1_0.c habit): their
 * references are bound to gdr_cache_create@GDRCACHE_0.1 and gdr_cache_get_stats@GDRCACHE_0.1,
 * which keep 0.1's meaning on top of the current code. What 0.2 changed there:
 *  - enum gdr_validate was TAG 0, EVENTS 1, AUTO 2 (now AUTO 0, TAG 1, EVENTS 2);
 *  - struct gdr_cache_attr had a log level (bit 1 << 5, where reserved0 is now): the level of the
 *    whole process, set once the attributes are accepted (now gdr_set_log_level);
 *  - gdr_cache_get_stats wrote the whole struct gdr_cache_stats (now it may grow: 0.1's size).
 * Every other function is the same in both. Programs that bind the newest versions: create.c.
 */
#include <string.h>

#include "cache/cache.h"
#include "cache/seams.h"

/* 0.1's numbers. */
enum { V01_VALIDATE_TAG = 0, V01_VALIDATE_EVENTS = 1, V01_VALIDATE_AUTO = 2 };
#define V01_ATTR_LOG_LEVEL (1u << 5)

/* 0.1's struct gdr_cache_attr: the same layout, log_level where reserved0 is. */
struct gdr_cache_attr_0_1 {
	uint64_t field_mask;
	uint64_t max_bytes;
	uint64_t max_entries;
	uint64_t max_pin_bytes;
	int32_t backend;
	int32_t validate;
	int32_t log_level;
	uint32_t reserved;
};
_Static_assert(sizeof(struct gdr_cache_attr_0_1) == sizeof(struct gdr_cache_attr) &&
		       offsetof(struct gdr_cache_attr_0_1, log_level) ==
			       offsetof(struct gdr_cache_attr, reserved0),
	       "struct gdr_cache_attr's layout is 0.1's");

static int validate_from_0_1(int32_t v)
{
	switch (v) {
	case V01_VALIDATE_TAG:
		return GDR_VALIDATE_TAG;
	case V01_VALIDATE_EVENTS:
		return GDR_VALIDATE_EVENTS;
	case V01_VALIDATE_AUTO:
		return GDR_VALIDATE_AUTO;
	default:
		return v; /* outside 0..2: refused by both, and logged as given */
	}
}

static uint64_t validate_to_0_1(uint64_t v)
{
	return v == GDR_VALIDATE_EVENTS ? V01_VALIDATE_EVENTS
	       : v == GDR_VALIDATE_TAG  ? V01_VALIDATE_TAG
					: V01_VALIDATE_AUTO;
}

GDR_SYMVER("gdr_cache_create@GDRCACHE_0.1")
int gdr_cache_create_0_1(const struct gdr_cache_attr_0_1 *attr, struct gdr_cache **cache);
int gdr_cache_create_0_1(const struct gdr_cache_attr_0_1 *attr, struct gdr_cache **cache)
{
	GDR_KEEP_ERRNO();
	struct gdr_cache_attr a;
	int rc;

	if (!attr || !cache)
		return gdr_cache_create_seams(NULL, NULL, cache);
	if (attr->field_mask & GDR_CACHE_ATTR_INTERCEPT) { /* unknown to 0.1: refused there */
		gdr_err("unknown attribute field bits %#llx",
			(unsigned long long)GDR_CACHE_ATTR_INTERCEPT);
		*cache = NULL;
		return -EINVAL;
	}
	a = (struct gdr_cache_attr){
		.field_mask = attr->field_mask & ~(uint64_t)V01_ATTR_LOG_LEVEL,
		.max_bytes = attr->max_bytes,
		.max_entries = attr->max_entries,
		.max_pin_bytes = attr->max_pin_bytes,
		.backend = attr->backend,
		.validate = validate_from_0_1(attr->validate),
		.intercept = attr->reserved, /* 0.1: reserved, must be 0 */
	};
	if (attr->field_mask & V01_ATTR_LOG_LEVEL) {
		/* 0.1 checked the level with the other attributes and set it before creating (the
		 * create's own lines obeyed it), whether or not the create then succeeded. */
		*cache = NULL;
		rc = gdr_cache_attr_check(&a);
		if (rc)
			return rc;
		if (attr->log_level < GDR_LOG_NONE || attr->log_level > GDR_LOG_DEBUG) {
			gdr_err("unknown log level %d", attr->log_level);
			return -EINVAL;
		}
		gdr_set_log_level(attr->log_level);
	}
	return gdr_cache_create_seams(&a, NULL, cache);
}

GDR_SYMVER("gdr_cache_get_stats@GDRCACHE_0.1")
int gdr_cache_get_stats_0_1(struct gdr_cache *c, struct gdr_cache_stats *stats);
int gdr_cache_get_stats_0_1(struct gdr_cache *c, struct gdr_cache_stats *stats)
{
	GDR_KEEP_ERRNO();
	struct gdr_cache_stats s;
	int rc = gdr_cache_stats_get(c, stats ? &s : NULL);

	if (rc)
		return rc;
	s.validate_mode = validate_to_0_1(s.validate_mode);
	memcpy(stats, &s, GDR_STATS_SIZE_0_1);
	return 0;
}
