/* SPDX-License-Identifier: MIT */
/* Statistics: counters live in struct gdr_cache; this prints them (GDRCACHE_STATS=1, at exit too). */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gdrcache_int.h"
#include "hooks.h"

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gdr_cache *live;

void gdr_stats_pinned(struct gdr_cache *c, int64_t delta)
{
	c->st.pinned_bytes += (uint64_t)delta;
	if (c->st.pinned_bytes > c->st.pinned_bytes_peak)
		c->st.pinned_bytes_peak = c->st.pinned_bytes;
}

void gdr_stats_collect(struct gdr_cache *c, struct gdr_cache_stats *s)
{
	uint64_t fast, tags;

	*s = c->st;
	gdr_thr_totals(c, &fast, &tags);
	s->fast_hits = fast;
	s->hits += fast;
	s->tag_checks += tags;
}

void gdr_stats_print(struct gdr_cache *c, const char *why)
{
	struct gdr_cache_stats st, *s = &st;

	pthread_mutex_lock(&c->lock);
	gdr_stats_collect(c, s);
	pthread_mutex_unlock(&c->lock);

	fprintf(stderr,
		"gdrcache[%d] stats (%s, backend %s, validate %s): hits %" PRIu64 " misses %" PRIu64
		" stale %" PRIu64 " evictions %" PRIu64 " pins %" PRIu64 " unpins %" PRIu64
		" pinned_bytes %" PRIu64 " peak %" PRIu64 " entries %" PRIu64
		" passthrough %" PRIu64 " tag_checks %" PRIu64 " revoked %" PRIu64 " sync_memops %" PRIu64
		" sync_memops_ctx %" PRIu64 " sync_memops_unavailable %" PRIu64
		" fail_pin %" PRIu64 " fail_pin_retried %" PRIu64 " fail_mr %" PRIu64
		" fail_cuda %" PRIu64 " fail_input %" PRIu64 " refused_managed %" PRIu64
		" overlap_merged %" PRIu64 " detached %" PRIu64 " fast_hits %" PRIu64
		" events %" PRIu64 " events_lost %" PRIu64 "\n",
		(int)getpid(), why, c->backend->ops->name, c->validator->name, s->hits, s->misses,
		s->stale, s->evictions, s->pins, s->unpins, s->pinned_bytes, s->pinned_bytes_peak,
		s->entries, s->passthrough, s->tag_checks, s->revoked, s->sync_memops_set, s->sync_memops_ctx,
		s->sync_memops_unavailable, s->fail_pin, s->fail_pin_retried, s->fail_mr,
		s->fail_cuda, s->fail_input, s->refused_managed, s->overlap_merged, s->detached,
		s->fast_hits, s->events, s->events_lost);
	{
		char line[512];

		fprintf(stderr, "gdrcache[%d] remote-access MRs of exact ranges %" PRIu64
			", entries replaced for holding too many %" PRIu64 "\n", (int)getpid(),
			__atomic_load_n(&c->exact_mrs, __ATOMIC_RELAXED),
			__atomic_load_n(&c->exact_replaced, __ATOMIC_RELAXED));
		gdr_hooks_stats_line(line, sizeof(line));
		fprintf(stderr, "gdrcache[%d] interception: %s\n", (int)getpid(), line);
	}
}

static void print_live_at_exit(void)
{
	pthread_mutex_lock(&live_lock);
	for (struct gdr_cache *c = live; c; c = c->next_live)
		gdr_stats_print(c, "at exit");
	pthread_mutex_unlock(&live_lock);
}

void gdr_stats_track(struct gdr_cache *c)
{
	static bool registered;

	if (!c->cfg.stats)
		return;
	pthread_mutex_lock(&live_lock);
	if (!registered) {
		registered = true;
		atexit(print_live_at_exit);
	}
	c->next_live = live;
	live = c;
	pthread_mutex_unlock(&live_lock);
}

void gdr_stats_untrack(struct gdr_cache *c)
{
	if (!c->cfg.stats)
		return;
	pthread_mutex_lock(&live_lock);
	for (struct gdr_cache **p = &live; *p; p = &(*p)->next_live) {
		if (*p == c) {
			*p = c->next_live;
			break;
		}
	}
	pthread_mutex_unlock(&live_lock);
	gdr_stats_print(c, "destroy");
}
