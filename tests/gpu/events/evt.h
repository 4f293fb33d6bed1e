/* SPDX-License-Identifier: MIT */
/*
 * What the events-mode GPU programs share: the cache in the mode asked for ($GDR_TEST_VALIDATE:
 * events (default), tag or auto), and the differential test's property checked after every
 * gdr_reg: the region's buffer id is the driver's current BUFFER_ID of the address (asked of the
 * driver here, never of the library) and its range covers the request. C and C++ (nvcc).
 */
#ifndef GDR_TEST_EVT_H
#define GDR_TEST_EVT_H

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrcache.h>

/* cuPointerGetAttribute(BUFFER_ID) of the test's driver: 0 when the address has none. */
typedef uint64_t (*evt_buffer_id_fn)(uint64_t addr);

struct evt {
	struct gdr_cache *cache;
	evt_buffer_id_fn buffer_id;
	const char *mode;
	uint64_t regs, reg_failed, reallocs_same_va, wrong, short_range, held_across_free;
	uint64_t reg_refused; /* failures on memory the driver does not export (see refusable) */
	int refusable;        /* set by evt_churn: the buffer being registered may be refused */
};

/* Creates the cache; exits 77 when events mode is refused (the interception is not in place). */
static inline void evt_init(struct evt *e, evt_buffer_id_fn fn)
{
	struct gdr_cache_attr a;
	const char *m = getenv("GDR_TEST_VALIDATE");
	int rc;

	memset(e, 0, sizeof(*e));
	memset(&a, 0, sizeof(a));
	e->buffer_id = fn;
	e->mode = m && *m ? m : "events";
	a.field_mask = GDR_CACHE_ATTR_VALIDATE;
	a.validate = !strcmp(e->mode, "tag")    ? GDR_VALIDATE_TAG
		     : !strcmp(e->mode, "auto") ? GDR_VALIDATE_AUTO
						: GDR_VALIDATE_EVENTS;
	rc = gdr_cache_create(&a, &e->cache);
	if (rc == -EOPNOTSUPP) {
		printf("SKIP: gdr_cache_create(validate %s) = -EOPNOTSUPP: the library does not "
		       "see this process's CUDA frees\n", e->mode);
		exit(77);
	}
	if (rc) {
		printf("FAIL: gdr_cache_create(validate %s) = %d\n", e->mode, rc);
		exit(1);
	}
}

/* gdr_reg [addr, addr+len), check it, and either release it or hand it to *keep. */
static inline int evt_reg(struct evt *e, uint64_t addr, uint64_t len, struct gdr_region **keep)
{
	struct gdr_region *r;
	uint64_t id = 0, base = 0, rlen = 0, cur;
	int rc = gdr_reg(e->cache, NULL, (void *)(uintptr_t)addr, len, 0, &r);

	if (rc) {
		if (e->refusable)
			e->reg_refused++;
		else
			e->reg_failed++;
		if (e->reg_failed + e->reg_refused <= 5)
			printf("# gdr_reg(%#" PRIx64 ", %" PRIu64 ") = %d%s\n", addr, len, rc,
			       e->refusable ? " (refusable memory)" : "");
		return rc;
	}
	e->regs++;
	gdr_region_buffer_id(r, &id);
	gdr_region_range(r, &base, &rlen);
	cur = e->buffer_id(addr);
	if (!cur || id != cur) {
		e->wrong++;
		if (e->wrong <= 5)
			printf("# STALE: %#" PRIx64 " region id %" PRIu64 ", driver says %" PRIu64 "\n",
			       addr, id, cur);
	}
	if (addr < base || addr + len > base + rlen) {
		e->short_range++;
		if (e->short_range <= 5)
			printf("# SHORT: [%#" PRIx64 ", +%" PRIu64 ") not in [%#" PRIx64 ", +%" PRIu64
			       ")\n", addr, len, base, rlen);
	}
	if (keep)
		*keep = r;
	else
		gdr_dereg(r);
	return 0;
}

/* Prints the counts and the statistics; returns the exit status (0, or 1 on any wrong answer). */
static inline int evt_report(struct evt *e, const char *what)
{
	static const char *const modes[] = { [GDR_VALIDATE_AUTO] = "auto", [GDR_VALIDATE_TAG] = "tag",
					     [GDR_VALIDATE_EVENTS] = "events" };
	struct gdr_cache_stats s;

	gdr_cache_get_stats(e->cache, &s);
	printf("%s: mode asked %s: registrations %" PRIu64 ", reallocations at the same VA %" PRIu64
	       ", registrations held across the free %" PRIu64 ", stale entries caught %" PRIu64
	       " (stale %" PRIu64 " + free events %" PRIu64 " + revoked %" PRIu64 "), wrong %" PRIu64
	       ", short %" PRIu64 ", failed %" PRIu64 ", refused (pool memory) %" PRIu64 "\n",
	       what, e->mode, e->regs, e->reallocs_same_va, e->held_across_free,
	       s.stale + s.events + s.revoked, s.stale, s.events, s.revoked, e->wrong,
	       e->short_range, e->reg_failed, e->reg_refused);
	printf("%s: stats: validate_mode %s, hits %" PRIu64 ", fast_hits %" PRIu64 ", misses %" PRIu64
	       ", tag_checks %" PRIu64 ", events %" PRIu64 ", events_lost %" PRIu64
	       ", detached %" PRIu64 ", pins %" PRIu64 ", unpins %" PRIu64 "\n",
	       what, s.validate_mode < 3 ? modes[s.validate_mode] : "?", s.hits, s.fast_hits,
	       s.misses, s.tag_checks, s.events, s.events_lost, s.detached, s.pins, s.unpins);
	if (e->wrong || e->short_range || e->reg_failed) {
		printf("FAIL: %s\n", what);
		return 1;
	}
	printf("PASS: %s: wrong = 0\n", what);
	return 0;
}

static inline uint64_t evt_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* The allocator under test: kind k's allocation of size bytes (0 or nonzero), and its free. */
struct evt_alloc {
	int nkinds;
	const char *const *names;
	int (*alloc)(int kind, uint64_t size, uint64_t *ptr);
	int (*free)(int kind, uint64_t ptr, uint64_t size);
	uint64_t (*size)(int kind, uint64_t *rng); /* a size this kind allocates */
	/* Nonzero for kinds whose registration the driver may refuse: the default stream-ordered
	 * pool's memory is not GPUDirect RDMA capable (its dma-buf export fails on the H100). A
	 * refused registration is counted apart; it is no stale one. May be NULL. */
	int (*refusable)(int kind);
};

/* Random churn over 32 slots: register random sub-ranges of live buffers; free one and allocate
 * the same size of the same kind at once (the VA-reuse case), then register it; free; allocate;
 * keep some registrations held across their buffer's free. Counts go into e. */
static inline void evt_churn(struct evt *e, const struct evt_alloc *a, int steps, uint64_t seed)
{
	enum { K = 32, H = 8 };
	uint64_t ptr[K], size[K], regd[K], rng = seed | 1;
	int kind[K];
	struct gdr_region *held[H];
	uint64_t held_ptr[H];
	int nheld = 0;

	memset(ptr, 0, sizeof(ptr));
	memset(regd, 0, sizeof(regd));
	for (int i = 0; i < steps; i++) {
		int s = (int)(evt_rand(&rng) % K), op = (int)(evt_rand(&rng) % 100);

		e->refusable = ptr[s] && a->refusable && a->refusable(kind[s]);

		if (!ptr[s]) { /* allocate into an empty slot */
			kind[s] = (int)(evt_rand(&rng) % (uint64_t)a->nkinds);
			size[s] = a->size(kind[s], &rng);
			if (a->alloc(kind[s], size[s], &ptr[s]))
				ptr[s] = 0;
			regd[s] = 0;
			continue;
		}
		if (op < 45) { /* register a sub-range */
			uint64_t off = evt_rand(&rng) % size[s], len;

			off &= ~(uint64_t)511;
			len = 1 + evt_rand(&rng) % (size[s] - off);
			if (nheld < H && evt_rand(&rng) % 10 == 0) {
				if (!evt_reg(e, ptr[s] + off, len, &held[nheld]))
					held_ptr[nheld++] = ptr[s];
			} else {
				evt_reg(e, ptr[s] + off, len, NULL);
			}
			regd[s] = 1;
		} else if (op < 80) { /* free, allocate the same again, register it */
			uint64_t old = ptr[s];

			for (int h = 0; h < nheld; h++)
				if (held_ptr[h] == old)
					e->held_across_free++;
			a->free(kind[s], old, size[s]);
			if (a->alloc(kind[s], size[s], &ptr[s])) {
				ptr[s] = 0;
				continue;
			}
			if (regd[s] && ptr[s] == old)
				e->reallocs_same_va++;
			evt_reg(e, ptr[s], size[s], NULL);
			regd[s] = 1;
		} else if (op < 90) { /* free */
			a->free(kind[s], ptr[s], size[s]);
			ptr[s] = 0;
		} else if (nheld) { /* release a held registration */
			int h = (int)(evt_rand(&rng) % (uint64_t)nheld);

			gdr_dereg(held[h]);
			held[h] = held[--nheld];
			held_ptr[h] = held_ptr[nheld];
		}
	}
	while (nheld)
		gdr_dereg(held[--nheld]);
	for (int s = 0; s < K; s++)
		if (ptr[s])
			a->free(kind[s], ptr[s], size[s]);
}

#endif
