/* SPDX-License-Identifier: MIT */
/* Dispatch of bench_hit's systems (hit_sys.h) and the two libgdrcache ones. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrcache.h>

#include "hit_sys.h"

const char *const sys_names[SYS_COUNT] = { "gdr-events", "gdr-tag", "tagcheck", "ucs-rcache",
					    "preload" };

struct gdrs {
	struct gdr_cache *c;
	struct gdr_cache_stats s0;
};

int gdrs_open(struct sys *s, int events, const struct sys_limits *lim)
{
	static const char *const be_names[] = { "auto", "kmod", "dmabuf", "peermem" };
	static const char *const modes[] = { [GDR_VALIDATE_AUTO] = "auto", [GDR_VALIDATE_TAG] = "tag",
					     [GDR_VALIDATE_EVENTS] = "events" };
	struct gdr_cache_attr a = { 0 };
	struct gdrs *g;
	enum gdr_backend be = GDR_BACKEND_AUTO;
	int rc;

	a.field_mask = GDR_CACHE_ATTR_VALIDATE;
	a.validate = events ? GDR_VALIDATE_EVENTS : GDR_VALIDATE_TAG;
	if (lim && lim->max_bytes) {
		a.field_mask |= GDR_CACHE_ATTR_MAX_BYTES;
		a.max_bytes = lim->max_bytes;
	}
	if (lim && lim->max_entries) {
		a.field_mask |= GDR_CACHE_ATTR_MAX_ENTRIES;
		a.max_entries = lim->max_entries;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	rc = gdr_cache_create(&a, &g->c);
	if (rc) {
		free(g);
		snprintf(s->why, sizeof(s->why), "gdr_cache_create(validate %s) = %d (%s)",
			 events ? "events" : "tag", rc, strerror(-rc));
		return rc;
	}
	gdr_cache_get_stats(g->c, &g->s0);
	gdr_cache_backend(g->c, &be);
	snprintf(s->why, sizeof(s->why), "libgdrcache %#x, backend %s, validate_mode %s",
		 gdr_cache_version(), be_names[be & 3],
		 g->s0.validate_mode < 3 ? modes[g->s0.validate_mode] : "?");
	s->p = g;
	return 0;
}

struct gdr_cache *gdrs_cache(void *p)
{
	return ((struct gdrs *)p)->c;
}

int gdrs_get(void *p, uint64_t addr, size_t len, void **reg)
{
	return gdr_reg(((struct gdrs *)p)->c, NULL, (void *)(uintptr_t)addr, len, 0,
		       (struct gdr_region **)reg);
}

void gdrs_put(void *p, void *reg)
{
	(void)p;
	gdr_dereg(reg);
}

void gdrs_close(void *p)
{
	struct gdrs *g = p;
	int rc = gdr_cache_destroy(g->c);

	if (rc)
		fprintf(stderr, "bench_hit: gdr_cache_destroy = %d\n", rc);
	else
		free(g);
}

void gdrs_info(void *p, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base, uint64_t *len)
{
	(void)p;
	*id = 0;
	*seq = 0;
	gdr_region_buffer_id(reg, id);
	gdr_region_range(reg, base, len);
}

uint64_t gdrs_misses(void *p)
{
	struct gdr_cache_stats s;

	gdr_cache_get_stats(((struct gdrs *)p)->c, &s);
	return s.misses;
}

uint64_t gdrs_pinned(void *p)
{
	struct gdr_cache_stats s;

	gdr_cache_get_stats(((struct gdrs *)p)->c, &s);
	return s.pinned_bytes;
}

void gdrs_describe(void *p, char *buf, size_t len)
{
	static const char *const modes[] = { [GDR_VALIDATE_AUTO] = "auto", [GDR_VALIDATE_TAG] = "tag",
					     [GDR_VALIDATE_EVENTS] = "events" };
	struct gdr_cache_stats s;

	gdr_cache_get_stats(((struct gdrs *)p)->c, &s);
	snprintf(buf, len,
		 "validate_mode %s, hits %" PRIu64 ", fast_hits %" PRIu64 ", misses %" PRIu64
		 ", stale %" PRIu64 ", events %" PRIu64 ", events_lost %" PRIu64
		 ", tag_checks %" PRIu64 ", evictions %" PRIu64 ", pins %" PRIu64
		 ", entries %" PRIu64,
		 s.validate_mode < 3 ? modes[s.validate_mode] : "?", s.hits, s.fast_hits, s.misses,
		 s.stale, s.events, s.events_lost, s.tag_checks, s.evictions, s.pins, s.entries);
}

int sys_open(struct sys *s, enum sys_kind kind, const struct sys_limits *lim)
{
	int rc;

	memset(s, 0, sizeof(*s));
	s->kind = kind;
	s->name = sys_names[kind];
	switch (kind) {
	case SYS_GDR_EVENTS: rc = gdrs_open(s, 1, lim); break;
	case SYS_GDR_TAG: rc = gdrs_open(s, 0, lim); break;
	case SYS_TAGCHECK: rc = tc_open(s, lim); break;
	case SYS_UCS: rc = ucs_open(s, lim); break;
	case SYS_PRELOAD: rc = pre_open(s, lim); break;
	default: rc = -EINVAL;
	}
	s->available = rc == 0;
	return rc;
}

void sys_close(struct sys *s)
{
	if (!s->available)
		return;
	switch (s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: gdrs_close(s->p); break;
	case SYS_TAGCHECK: tc_close(s->p); break;
	case SYS_UCS: ucs_close(s->p); break;
	case SYS_PRELOAD: pre_close(s->p); break;
	default: break;
	}
	s->available = 0;
}

int sys_get(struct sys *s, uint64_t addr, size_t len, void **reg)
{
	switch (s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: return gdrs_get(s->p, addr, len, reg);
	case SYS_TAGCHECK: return tc_get(s->p, addr, len, reg);
	case SYS_UCS: return ucs_get(s->p, addr, len, reg);
	case SYS_PRELOAD: return pre_get(s->p, addr, len, reg);
	default: return -EINVAL;
	}
}

void sys_put(struct sys *s, void *reg)
{
	switch (s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: gdrs_put(s->p, reg); break;
	case SYS_TAGCHECK: tc_put(s->p, reg); break;
	case SYS_UCS: ucs_put(s->p, reg); break;
	case SYS_PRELOAD: pre_put(s->p, reg); break;
	default: break;
	}
}

uint64_t hit_clock;

void sys_reg_info(struct sys *s, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base,
		  uint64_t *len)
{
	switch (s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: gdrs_info(s->p, reg, id, seq, base, len); break;
	case SYS_TAGCHECK: tc_info(s->p, reg, id, seq, base, len); break;
	case SYS_UCS: ucs_info(s->p, reg, id, seq, base, len); break;
	default: *id = *seq = *base = *len = 0; /* the preload tells nothing */
	}
}

void sys_freed(struct sys *s, uint64_t addr, size_t len)
{
	if (s->kind == SYS_UCS)
		ucs_freed(s->p, addr, len);
}

uint64_t sys_misses(struct sys *s)
{
	switch (s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: return gdrs_misses(s->p);
	case SYS_TAGCHECK: return tc_misses(s->p);
	case SYS_UCS: return ucs_misses(s->p);
	default: return 0;
	}
}

uint64_t sys_pinned(struct sys *s)
{
	switch (s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: return gdrs_pinned(s->p);
	case SYS_TAGCHECK: return tc_pinned(s->p);
	case SYS_UCS: return ucs_pinned(s->p);
	default: return 0;
	}
}

void sys_describe(struct sys *s, char *buf, size_t len)
{
	switch (s->kind) {
	case SYS_GDR_EVENTS:
	case SYS_GDR_TAG: gdrs_describe(s->p, buf, len); break;
	case SYS_TAGCHECK: tc_describe(s->p, buf, len); break;
	case SYS_UCS: ucs_describe(s->p, buf, len); break;
	case SYS_PRELOAD: pre_describe(s->p, buf, len); break;
	default: snprintf(buf, len, "?");
	}
}
