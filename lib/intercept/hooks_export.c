/* SPDX-License-Identifier: MIT */
/*
 * Private entry points of the shared library for tests and diagnostics (GDRCACHE_PRIVATE in
 * libgdrcache.map: no compatibility promise): the free-event probe and a read-only view of the
 * event ring. The static library the unit tests link reaches events.h directly.
 */
#include <stddef.h>
#include <stdint.h>

#include "common/defs.h"
#include "intercept/dmabufs.h"
#include "intercept/events.h"
#include "intercept/hooks.h"

#define GDR_EXPORT __attribute__((visibility("default")))

/* gdr_events_probe() (events.h). */
GDR_EXPORT int gdr_private_events_probe(const char **why);
int gdr_private_events_probe(const char **why)
{
	return gdr_events_probe(why);
}

/* The event ring (events.h), read-only. */
GDR_EXPORT uint64_t gdr_private_events_head(void);
uint64_t gdr_private_events_head(void)
{
	return gdr_events_head();
}

/* Event seq: 0 with its range and kind (GDR_EV_FREE 0, GDR_EV_ALLOC 1), or -EAGAIN / -ERANGE. */
GDR_EXPORT int gdr_private_events_get(uint64_t seq, uint64_t *start, uint64_t *len, uint32_t *kind);
int gdr_private_events_get(uint64_t seq, uint64_t *start, uint64_t *len, uint32_t *kind)
{
	struct gdr_event ev;
	int rc = gdr_events_get(seq, &ev);

	if (!rc) {
		*start = ev.start, *len = ev.len;
		if (kind)
			*kind = ev.kind;
	}
	return rc;
}

/* Frees in flight now (events.h). */
GDR_EXPORT unsigned gdr_private_events_inflight(void);
unsigned gdr_private_events_inflight(void)
{
	return gdr_events_inflight_count();
}

/* gdr_dmabufs_lookup (dmabufs.h): what the preload serves a dma-buf registration by. */
GDR_EXPORT int gdr_private_dmabuf_range(int fd, uint64_t *va, uint64_t *size);
int gdr_private_dmabuf_range(int fd, uint64_t *va, uint64_t *size)
{
	return gdr_dmabufs_lookup(fd, va, size);
}
