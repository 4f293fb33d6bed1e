/* SPDX-License-Identifier: MIT */
/*
 * The free-event ring (events.h). Producers are the hooks of the driver's free functions, on any
 * thread, possibly many at once: a producer reserves a number with one fetch-add on `head`, writes
 * its slot, then publishes the slot's sequence. Consumers (caches, under their own lock) read a slot
 * whose sequence is theirs, then check that no producer of a later lap has reserved it since.
 */
#include <errno.h>

#include "events.h"

struct slot {
	uint64_t seq;   /* number of the event stored + 1; 0: never written */
	uint64_t start, len;
};

static struct {
	uint64_t head __attribute__((aligned(64)));
	char pad[56];
	struct slot ring[GDR_EVENTS_RING] __attribute__((aligned(64)));
} ev;

void gdr_events_push(uint64_t start, uint64_t len)
{
	uint64_t n = __atomic_fetch_add(&ev.head, 1, __ATOMIC_ACQ_REL);
	struct slot *s = &ev.ring[n & (GDR_EVENTS_RING - 1)];

	/* Release stores: a consumer that reads any of them also sees `head` past n (see below). */
	__atomic_store_n(&s->start, start, __ATOMIC_RELEASE);
	__atomic_store_n(&s->len, len, __ATOMIC_RELEASE);
	__atomic_store_n(&s->seq, n + 1, __ATOMIC_RELEASE);
}

uint64_t gdr_events_head(void)
{
	return __atomic_load_n(&ev.head, __ATOMIC_ACQUIRE);
}

int gdr_events_get(uint64_t seq, struct gdr_event *out)
{
	struct slot *s = &ev.ring[seq & (GDR_EVENTS_RING - 1)];
	uint64_t q = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);

	if (q != seq + 1)
		return q > seq + 1 || gdr_events_head() - seq > GDR_EVENTS_RING ? -ERANGE : -EAGAIN;
	out->start = __atomic_load_n(&s->start, __ATOMIC_ACQUIRE);
	out->len = __atomic_load_n(&s->len, __ATOMIC_ACQUIRE);
	/* A producer of a later lap (number seq + RING or more) reserved before it wrote: if what
	 * was read is its, head shows it. */
	if (gdr_events_head() - seq > GDR_EVENTS_RING)
		return -ERANGE;
	return 0;
}

int (*gdr_events_prober)(const char **why) = gdr_events_probe;
