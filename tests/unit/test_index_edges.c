/* SPDX-License-Identifier: MIT */
/* Tests of the lock-free hit path (reg.c) and the hash it reads (index.c): every hit serves
 * what was asked (pd, access, exact or wide, range inside the record), the hash holds exactly the
 * records of the indexed entries (one slot per record and granule, none of a retired record, its
 * counts right), many records of one granule, many pds and access modes of one allocation, and a
 * table that grows and is rebuilt while other threads hit. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache/cache.h"
#include "cache/index.h"
#include "intercept/events.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "fixture.h"

#define MiB (1024ULL * 1024)
#define LW 1 /* IBV_ACCESS_LOCAL_WRITE */
#define RW 2 /* IBV_ACCESS_REMOTE_WRITE */
#define RR 4 /* IBV_ACCESS_REMOTE_READ */

static struct gdr_cache *cache;

static int probe_ok(const char **why)
{
	*why = "";
	return 0;
}

static int setup(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				    .validate = GDR_VALIDATE_EVENTS };

	(void)state;
	fakes_reset();
	fake_seams.events_probe = probe_ok;
	cache = NULL;
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &cache), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fixture_end(&cache);
	return 0;
}

static struct gdr_cache_stats stats(void)
{
	return fixture_stats(cache);
}

static void free_evented(uint64_t a)
{
	gdr_events_push(a, 0);
	fake_cuda_free(a);
}

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
	return *x;
}

/* ---- white-box: the hash against the entries' records ------------------------------------------ */

static unsigned rec_level(const struct gdr_region *r)
{
	return gdr_hix_level(r->size);
}

static uint64_t runs_wrapped; /* keys seen with their slot past the table's end (check_index) */

/* How many slots of table h hold word w. */
static unsigned count_word(const struct gdr_hix *h, uint64_t w)
{
	unsigned n = 0;

	for (uint64_t j = 0; j < (1ULL << h->bits); j++)
		n += h->v[j] == w;
	return n;
}

/* Whether slot j lies in key's probe run (from its bucket, no empty slot before it). */
static bool in_run(const struct gdr_hix *h, uint64_t key, uint64_t j)
{
	uint64_t mask = (1ULL << h->bits) - 1;

	for (uint64_t i = gdr_hix_pos(key, h->bits);; i = (i + 1) & mask) {
		if (i == j)
			return true;
		if (h->v[i] == GDR_HIX_EMPTY)
			return false;
	}
}

/* The index's hash is exactly the indexed entries' records: each record's word for each granule it
 * touches appears once, in its key's probe run, with the overflow filter of every full bucket it
 * passed set; no other live slot; used, dead and lev_n right; the published table is the current
 * one. Under the cache's lock. */
static void check_index(void)
{
	const struct gdr_index *ix = &cache->index;
	const struct gdr_hix *h = ix->hix;
	uint64_t nslots = 1ULL << h->bits, live = 0, dead = 0, expect = 0;
	uint32_t lev[GDR_HIX_LEVELS] = { 0 };

	gdr_cache_lock(cache);
	assert_ptr_equal(__atomic_load_n(&cache->hix, __ATOMIC_ACQUIRE), h);
	for (uint64_t j = 0; j < nslots; j++) {
		live += h->v[j] != GDR_HIX_EMPTY && h->v[j] != GDR_HIX_TOMB;
		dead += h->v[j] == GDR_HIX_TOMB;
	}
	for (size_t i = 0; i < ix->n; i++) {
		const struct gdr_entry *e = ix->v[i];

		assert_int_equal(e->state, GDR_LIVE);
		for (struct gdr_region *r = e->regions; r; r = gdr_region_next(r)) {
			unsigned k = rec_level(r), sh = gdr_hix_shift(k);
			uint64_t g0 = r->start >> sh,
				 g1 = (r->start + (r->size ? r->size : 1) - 1) >> sh;

			assert_int_not_equal(r->magic, GDR_REGION_DEAD);
			/* the record lies in its entry's pin */
			assert_true(r->start >= e->pin.base &&
				    r->start + r->size <= e->pin.base + e->pin.len);
			lev[k]++;
			for (uint64_t g = g0; g <= g1; g++) {
				uint64_t key = gdr_hix_key(g << sh, k), fp = gdr_hix_fp(key);
				uint64_t s = g << sh > r->start ? g << sh : r->start;
				uint64_t en = r->start + r->size, ge = (g << sh) + (1ULL << sh);
				uint64_t w, found = UINT64_MAX;

				if (en > ge)
					en = ge;
				w = (uint64_t)(gdr_rec_slot(r) + 2) |
				    gdr_hix_part(s, k) << GDR_HIX_SLOT_BITS |
				    gdr_hix_part(en - 1, k) << (GDR_HIX_SLOT_BITS + 9) | fp;
				for (uint64_t j = 0; j < nslots; j++)
					if (h->v[j] == w)
						found = j;
				if (found == UINT64_MAX)
					print_message(
						"record %u [%#llx,+%#llx) lvl %u granule %#llx: "
						"no slot\n",
						gdr_rec_slot(r), (unsigned long long)r->start,
						(unsigned long long)r->size, k,
						(unsigned long long)g);
				assert_true(found != UINT64_MAX);
				assert_int_equal(count_word(h, w), 1);
				assert_true(in_run(h, key, found));
				runs_wrapped += found < gdr_hix_pos(key, h->bits);
				/* every full bucket from the key's to the slot's has fp's bit */
				for (uint64_t b = gdr_hix_pos(key, h->bits);
				     b != (found & ~(uint64_t)(GDR_HIX_BUCKET - 1));
				     b = (b + GDR_HIX_BUCKET) & (nslots - 1))
					assert_true(gdr_hix_overflowed(h, b, fp));
				expect++;
			}
		}
	}
	if (live != expect)
		print_message("hash: %llu live slots, %llu expected (used %u)\n",
			      (unsigned long long)live, (unsigned long long)expect, h->used);
	assert_int_equal(live, expect);
	assert_int_equal(h->used, live);
	assert_int_equal(h->dead, dead);
	assert_true((live + dead) * 2 <= nslots);
	for (unsigned k = 0; k < GDR_HIX_LEVELS; k++)
		assert_int_equal(ix->lev_n[k], lev[k]);
	gdr_cache_unlock_plain(cache);
}

/* r serves (pd, access, [a, a+len)) as the request asked it. */
static void assert_serves(const struct gdr_region *r, struct ibv_pd *pd, int access, uint64_t a,
			  uint64_t len)
{
	bool exact = pd && (access & (RW | RR)) && !(access & GDR_ACCESS_WIDE_MR);
	int racc = pd ? access & ~(GDR_ACCESS_WIDE_MR | GDR_REG_CACHED_ONLY) : 0;
	uint64_t base, rlen;
	struct ibv_mr *mr = NULL;

	assert_non_null(r);
	if (r->pd != pd || r->access != racc || !!r->exact != exact)
		print_message(
			"asked pd %p access %#x [%#llx,+%llu): got record %u pd %p access %#x "
			"exact %d [%#llx,+%llu)\n",
			(void *)pd, access, (unsigned long long)a, (unsigned long long)len,
			gdr_rec_slot(r), (void *)r->pd, r->access, r->exact,
			(unsigned long long)r->start, (unsigned long long)r->size);
	assert_ptr_equal(r->pd, pd);
	assert_int_equal(r->access, racc);
	assert_int_equal(!!r->exact, exact);
	assert_int_equal(gdr_region_range(r, &base, &rlen), 0);
	assert_true(base <= a && a + len <= base + rlen);
	if (exact)
		assert_true(r->start == a && r->size == len);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_true(!pd == !mr);
	if (pd) {
		assert_ptr_equal(mr->pd, pd);
		if (exact)
			assert_true((uint64_t)(uintptr_t)mr->addr == a && mr->length == len);
	}
}

static struct gdr_region *reg_acc(struct ibv_pd *pd, int access, uint64_t a, uint64_t len)
{
	struct gdr_region *r = NULL;

	assert_int_equal(gdr_reg(cache, pd, (void *)(uintptr_t)a, len, access, &r), 0);
	assert_serves(r, pd, access, a, len);
	return r;
}

/* ---- the tests ------------------------------------------------------------------------------- */

/* Many pds and access modes of one allocation, at sizes of every level: records sharing one key
 * and one range (the bucket's candidate is the same for all, the walk must find the right one),
 * exact records inside the shared ones, wide remote ones. After two rounds that make them,
 * every registration is a lock-free hit that serves exactly what was asked, and the hash holds
 * each record once. */
static void test_many_pds_and_modes(void **state)
{
	static const uint64_t sizes[] = { 512, 4096, 12288, 65536, 300 * 1024, MiB, 3 * MiB };
	enum { NS = sizeof(sizes) / sizeof(sizes[0]), ROUNDS = 4 };
	struct ibv_pd *pds[3] = { NULL, FAKE_PD, FAKE_PD2 };
	/* one exact mode: 2 pds x 2 ranges x 7 allocations = 28 exact records, under the
	 * GDR_EXACT_PER_ENTRY (32) that would replace an entry shared by the small ones */
	static const int acc[] = { LW, 0, LW | RR | GDR_ACCESS_WIDE_MR,
				   LW | RW | RR | GDR_ACCESS_WIDE_MR, LW | RR };
	enum { NA = sizeof(acc) / sizeof(acc[0]) };
	uint64_t va[NS], hits = 0, misses = 0, n = 0;

	(void)state;
	for (int i = 0; i < NS; i++)
		va[i] = fake_cuda_alloc(sizes[i]);
	for (int round = 0; round <= ROUNDS; round++) {
		/* round 1 makes again the records of entries merged as neighbours came */
		if (round == 2) {
			hits = stats().fast_hits;
			misses = stats().misses;
			check_index();
		}
		for (int i = 0; i < NS; i++)
			for (int p = 0; p < 3; p++)
				for (int q = 0; q < NA; q++) {
					/* two ranges: the first 512 bytes, and the last half */
					uint64_t a0 = va[i], l0 = 512;
					uint64_t a1 = va[i] + sizes[i] / 2,
						 l1 = sizes[i] - sizes[i] / 2;

					uint64_t f0 = stats().fast_hits, f1;

					assert_int_equal(gdr_dereg(reg_acc(pds[p], acc[q], a0, l0)),
							 0);
					f1 = stats().fast_hits;
					assert_int_equal(gdr_dereg(reg_acc(pds[p], acc[q], a1, l1)),
							 0);
					if (round > 1 &&
					    (f1 != f0 + 1 || stats().fast_hits != f1 + 1))
						print_message(
							"round %d size %llu pd %d access %#x: "
							"not lock-free: %d %d\n",
							round, (unsigned long long)sizes[i], p,
							acc[q], (int)(f1 - f0),
							(int)(stats().fast_hits - f1));
					n += round > 1 ? 2 : 0;
				}
	}
	assert_int_equal(stats().misses, misses);
	assert_int_equal(stats().fast_hits, hits + n);
	check_index();
	for (int i = 0; i < NS; i++)
		free_evented(va[i]);
	assert_int_equal(gdr_cache_flush(cache) >= 0, 1);
	check_index();
}

/* Many records in one granule at each level: small allocations packed (512 B: eight to a 4 KiB
 * granule at level 0; 9 KiB ones at level 1; 40 KiB ones, 600 KiB ones), requests at random
 * offsets and lengths inside each. Every one after the first round is a lock-free hit on its own
 * allocation's record; requests across two neighbours are never served by either record. */
static void test_dense_granules(void **state)
{
	static const uint64_t sizes[] = { 512, 1024, 9 * 1024, 40 * 1024, 600 * 1024 };
	enum { NS = sizeof(sizes) / sizeof(sizes[0]), PER = 40, HITS = 4000 };
	static uint64_t va[NS * PER], sz[NS * PER];
	uint64_t x = 0x1234567887654321ULL, hits, misses;

	(void)state;
	for (int i = 0; i < NS * PER; i++) {
		sz[i] = sizes[i / PER];
		va[i] = fake_cuda_alloc(sz[i]);
	}
	for (int round = 0; round < 3; round++)
		for (int i = 0; i < NS * PER; i++)
			assert_int_equal(gdr_dereg(reg_acc(NULL, 0, va[i], sz[i])), 0);
	check_index();
	hits = stats().fast_hits;
	misses = stats().misses;
	for (int k = 0; k < HITS; k++) {
		uint64_t i = xorshift(&x) % (NS * PER), off = xorshift(&x) % sz[i];
		uint64_t len = 1 + xorshift(&x) % (sz[i] - off);
		struct gdr_region *r = reg_acc(NULL, 0, va[i] + off, len);
		uint64_t id;

		assert_int_equal(gdr_region_buffer_id(r, &id), 0);
		assert_int_equal(id, fake_cuda_buffer_id(va[i]));
		assert_true(r->start == va[i] && r->size == sz[i]);
		assert_int_equal(gdr_dereg(r), 0);
	}
	assert_int_equal(stats().fast_hits, hits + HITS);
	assert_int_equal(stats().misses, misses);
	check_index();
	for (int i = 0; i < NS * PER; i++)
		free_evented(va[i]);
}

/* Records of an entry (white-box): how many. */
static unsigned entry_records(const struct gdr_entry *e)
{
	unsigned n = 0;

	for (const struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		n++;
	return n;
}

/* A request that begins in one allocation and ends in its neighbour (both cached, in one entry:
 * cuMemAlloc places small buffers side by side, and a range over several allocations is
 * registered, with a tag for each): the region covers it (its entry's pin), and asking again
 * takes the record the first request made. DEFECT: gdr_entry_take makes the record of the
 * allocation at a (entry_tag_at), whose range never serves a request that goes past that
 * allocation, so its search finds no record and makes one more every time: 1,000
 * registrations of one range leave 1,000 records in the entry and in the hash (records are
 * bounded by GDR_SLOT_MAX per cache: then every new registration fails with -ENOSPC). */
static void test_request_across_neighbours(void **state)
{
	enum { N = 1000 };
	uint64_t a = fake_cuda_alloc(4096), b = fake_cuda_alloc(4096);
	struct gdr_region *r;
	uint64_t base, len, slots, hits;
	unsigned before;

	(void)state;
	assert_int_equal(b, a + 4096);
	assert_int_equal(gdr_dereg(reg_acc(NULL, 0, a, 4096)), 0);
	assert_int_equal(gdr_dereg(reg_acc(NULL, 0, b, 4096)), 0);
	r = NULL;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 2048), 4096, 0, &r), 0);
	assert_int_equal(gdr_region_range(r, &base, &len), 0);
	assert_true(base <= a + 2048 && a + 2048 + 4096 <= base + len);
	before = entry_records(r->entry);
	assert_int_equal(gdr_dereg(r), 0);
	slots = cache->slot_next;
	hits = stats().hits + stats().fast_hits;
	for (int i = 0; i < N; i++) {
		r = NULL;
		assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 2048), 4096, 0, &r),
				 0);
		assert_int_equal(gdr_dereg(r), 0);
	}
	hits = stats().hits + stats().fast_hits - hits;
	gdr_cache_lock(cache);
	print_message("%d registrations of one range across two allocations: %llu new records, "
		      "%u records in the entry (%u before), %llu hits\n",
		      N, (unsigned long long)(cache->slot_next - slots),
		      entry_records(gdr_index_find(&cache->index, a)), before,
		      (unsigned long long)hits);
	gdr_cache_unlock_plain(cache);
	check_index();
	assert_true(cache->slot_next - slots <= 1);
	assert_true(entry_records(gdr_index_find(&cache->index, a)) <= before + 1);
	free_evented(a);
	free_evented(b);
}

/* The same within ONE allocation: a stream-ordered pool allocation over two of the pool's 32 MiB
 * physical chunks has a tag for each piece (gdr_entry_add_tags), and a request across the chunk
 * boundary goes past the piece at its start: the same record must serve it every time. */
static void test_request_across_pool_chunks(void **state)
{
	enum { N = 1000 };
	uint64_t p = fake_cuda_alloc_async(48 * MiB), x, slots;
	struct gdr_region *r;

	(void)state;
	assert_int_not_equal(p, 0);
	x = ((p + 32 * MiB) & ~(32 * MiB - 1)) - 8192; /* 8 KiB before a chunk boundary */
	assert_true(x > p && x + 16384 <= p + 48 * MiB);
	for (int i = 0; i < 2; i++) {
		r = NULL;
		assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)x, 16384, 0, &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
	}
	slots = cache->slot_next;
	for (int i = 0; i < N; i++) {
		r = NULL;
		assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)x, 16384, 0, &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
	}
	print_message("%d registrations across a pool chunk boundary: %llu new records\n", N,
		      (unsigned long long)(cache->slot_next - slots));
	check_index();
	assert_true(cache->slot_next - slots <= 1);
	gdr_events_push(p, 0);
	assert_int_equal(fake_cuda_free_async(p), 0);
}

/* Mode tag: a hit proves with the driver that the memory behind it is still what was pinned. An
 * exact (remote access) registration of a range over two neighbouring allocations, the second
 * freed and allocated again at the same VA (new BUFFER_ID, new physical memory: no event in mode
 * tag): the next registration of that range must not return the old pin. DEFECT: the exact record
 * keeps one tag, the allocation at its start (gdr_entry_take: tag = entry_tag_at(e, a)), and the
 * lock-free hit (reg_fast) checks only that tag, so the stale exact MR over the freed memory is
 * handed out; the same request under the lock (gdr_entry_check of every tag it overlaps) sees it.
 * The wide registration of the same range is checked for comparison (never a lock-free hit). */
static void test_tag_mode_exact_across_neighbours(void **state)
{
	struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				     .validate = GDR_VALIDATE_TAG };
	uint64_t a = fake_cuda_alloc(10 * MiB), b = fake_cuda_alloc(10 * MiB), b2;
	uint64_t x = b - 64 * 1024, len = 128 * 1024, gen, stale;
	struct gdr_region *r;
	bool cur;

	(void)state;
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = NULL;
	assert_int_equal(fake_cache_create(&at, &fake_backend_ops, &cache), 0);
	assert_int_equal(b, a + 10 * MiB); /* own chunks, fresh VA (a size no other test uses) */
	for (int i = 0; i < 2; i++) {      /* the second a lock-free hit */
		r = reg_acc(FAKE_PD, LW | RR, x, len);
		assert_true(fake_backend_pin_current(r, x, len));
		assert_int_equal(gdr_dereg(r), 0);
		r = reg_acc(FAKE_PD, LW | RR | GDR_ACCESS_WIDE_MR, x, len);
		assert_true(fake_backend_pin_current(r, x, len));
		assert_int_equal(gdr_dereg(r), 0);
	}
	gen = fake_cuda_phys_gen(b);
	assert_int_equal(fake_cuda_free(b), 0); /* mode tag: nobody reports it */
	b2 = fake_cuda_alloc(10 * MiB);
	assert_int_equal(b2, b);
	assert_int_not_equal(fake_cuda_phys_gen(b), gen);
	stale = stats().stale;
	r = reg_acc(FAKE_PD, LW | RR | GDR_ACCESS_WIDE_MR, x, len);
	assert_true(fake_backend_pin_current(r, x, len));
	assert_int_equal(gdr_dereg(r), 0);
	print_message("wide: stale %llu -> %llu\n", (unsigned long long)stale,
		      (unsigned long long)stats().stale);
	/* again, the exact record made (and hit) in the new entry first */
	for (int i = 0; i < 2; i++) {
		r = reg_acc(FAKE_PD, LW | RR, x, len);
		assert_true(fake_backend_pin_current(r, x, len));
		assert_int_equal(gdr_dereg(r), 0);
	}
	assert_int_equal(fake_cuda_free(b), 0);
	b2 = fake_cuda_alloc(10 * MiB);
	assert_int_equal(b2, b);
	stale = stats().stale;
	r = reg_acc(FAKE_PD, LW | RR, x, len);
	cur = fake_backend_pin_current(r, x, len);
	print_message("exact: stale %llu -> %llu, pin current: %d\n", (unsigned long long)stale,
		      (unsigned long long)stats().stale, cur);
	assert_int_equal(gdr_dereg(r), 0);
	assert_true(cur);
	assert_int_equal(fake_cuda_free(a), 0);
	assert_int_equal(fake_cuda_free(b), 0);
	assert_true(gdr_cache_flush(cache) >= 0);
}

/* The same in mode events: the free of the second allocation is reported, and the exact record
 * over both (a lock-free hit before) is not handed out again over the freed memory. */
static void test_events_mode_exact_across_neighbours(void **state)
{
	uint64_t a = fake_cuda_alloc(12 * MiB), b = fake_cuda_alloc(12 * MiB), b2;
	uint64_t x = b - 64 * 1024, len = 128 * 1024, hits;
	struct gdr_region *r;
	bool cur;

	(void)state;
	assert_int_equal(b, a + 12 * MiB); /* own chunks, fresh VA (a size no other test uses) */
	for (int i = 0; i < 2; i++) {
		r = reg_acc(FAKE_PD, LW | RR, x, len);
		assert_true(fake_backend_pin_current(r, x, len));
		assert_int_equal(gdr_dereg(r), 0);
	}
	hits = stats().fast_hits;
	assert_int_equal(gdr_dereg(reg_acc(FAKE_PD, LW | RR, x, len)), 0);
	assert_int_equal(stats().fast_hits, hits + 1);
	free_evented(b);
	b2 = fake_cuda_alloc(12 * MiB);
	assert_int_equal(b2, b);
	r = reg_acc(FAKE_PD, LW | RR, x, len);
	cur = fake_backend_pin_current(r, x, len);
	assert_int_equal(gdr_dereg(r), 0);
	assert_true(cur);
	free_evented(a);
	free_evented(b);
	assert_true(gdr_cache_flush(cache) >= 0);
}

/* The hash through many growths, rebuilds and tombstones: allocations made and freed in waves
 * (frees evented: entries dropped, records retired and their slots tombstoned, slots reused after
 * the reuse delay); after each wave the hash is exactly the indexed records, and every live
 * allocation's registration is a lock-free hit. */
static void test_growth_and_churn(void **state)
{
	enum { N = 3000, WAVES = 6 };
	static uint64_t va[N], sz[N];
	uint64_t x = 0xdeadbeefcafef00dULL;

	(void)state;
	for (int i = 0; i < N; i++) {
		sz[i] = 512ULL << (xorshift(&x) % 13); /* 512 B .. 2 MiB */
		va[i] = fake_cuda_alloc(sz[i]);
		assert_int_equal(gdr_dereg(reg_acc(NULL, 0, va[i], sz[i])), 0);
	}
	check_index();
	for (int w = 0; w < WAVES; w++) {
		uint64_t hits, misses;

		for (int i = w % 3; i < N; i += 3) {
			free_evented(va[i]);
			sz[i] = 512ULL << (xorshift(&x) % 13);
			va[i] = fake_cuda_alloc(sz[i]);
		}
		/* twice: records of entries merged by new neighbours are made again */
		for (int round = 0; round < 2; round++)
			for (int i = 0; i < N; i++) {
				struct ibv_pd *pd = i % 2 ? FAKE_PD : NULL;

				assert_int_equal(gdr_dereg(reg_acc(pd, pd ? LW : 0, va[i], sz[i])),
						 0);
			}
		check_index();
		hits = stats().fast_hits;
		misses = stats().misses;
		for (int i = 0; i < N; i++) {
			struct ibv_pd *pd = i % 2 ? FAKE_PD : NULL;
			struct gdr_region *r =
				reg_acc(pd, pd ? LW : 0, va[i] + sz[i] / 2, sz[i] / 2);

			assert_int_equal(r->buffer_id, fake_cuda_buffer_id(va[i]));
			assert_int_equal(gdr_dereg(r), 0);
		}
		assert_int_equal(stats().misses, misses);
		assert_int_equal(stats().fast_hits, hits + N);
	}
	print_message("keys whose probe run wrapped past the table's last slot: %llu\n",
		      (unsigned long long)runs_wrapped);
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
	assert_true(gdr_cache_flush(cache) >= 0);
	check_index();
}

/* Threads hitting fixed allocations, checking each hit, while the main thread grows the table
 * (thousands of new records), frees (tombstones) and flushes. */
enum { HT = 2, FIXED = 64 };
static uint64_t fixed_va[FIXED], fixed_sz[FIXED], fixed_id[FIXED];
static int stop_hitters; /* __atomic */

static void *hitter(void *arg)
{
	uint64_t x = 0x9e3779b97f4a7c15ULL + (uintptr_t)arg, bad = 0;

	while (!__atomic_load_n(&stop_hitters, __ATOMIC_RELAXED)) {
		uint64_t i = xorshift(&x) % FIXED, off = xorshift(&x) % fixed_sz[i];
		uint64_t len = 1 + xorshift(&x) % (fixed_sz[i] - off), base, l, id;
		struct gdr_region *r = NULL;

		if (gdr_reg(cache, NULL, (void *)(uintptr_t)(fixed_va[i] + off), len, 0, &r)) {
			bad++;
			continue;
		}
		if (gdr_region_range(r, &base, &l) || base > fixed_va[i] + off ||
		    fixed_va[i] + off + len > base + l || gdr_region_buffer_id(r, &id) ||
		    id != fixed_id[i])
			bad++;
		if (gdr_dereg(r))
			bad++;
	}
	return (void *)(uintptr_t)bad;
}

static void test_growth_while_hitting(void **state)
{
	enum { N = 4000 };
	static uint64_t va[N];
	pthread_t t[HT];
	uint64_t bad = 0;

	(void)state;
	for (int i = 0; i < FIXED; i++) {
		fixed_sz[i] = 512ULL << (i % 12);
		fixed_va[i] = fake_cuda_alloc(fixed_sz[i]);
		fixed_id[i] = fake_cuda_buffer_id(fixed_va[i]);
		assert_int_equal(gdr_dereg(reg_acc(NULL, 0, fixed_va[i], fixed_sz[i])), 0);
	}
	__atomic_store_n(&stop_hitters, 0, __ATOMIC_RELAXED);
	for (int i = 0; i < HT; i++)
		assert_int_equal(pthread_create(&t[i], NULL, hitter, (void *)(intptr_t)i), 0);
	for (int wave = 0; wave < 3; wave++) {
		for (int i = 0; i < N; i++) {
			va[i] = fake_cuda_alloc(4096ULL << (i % 6));
			assert_int_equal(gdr_dereg(reg_acc(NULL, 0, va[i], 4096)), 0);
		}
		for (int i = 0; i < N; i++)
			free_evented(va[i]);
		assert_true(gdr_cache_flush(cache) >= 0);
	}
	__atomic_store_n(&stop_hitters, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < HT; i++) {
		void *ret;

		pthread_join(t[i], &ret);
		bad += (uint64_t)(uintptr_t)ret;
	}
	assert_int_equal(bad, 0);
	check_index();
	for (int i = 0; i < FIXED; i++)
		free_evented(fixed_va[i]);
}

/* Requests at a cached address that are not served by any record: length 0, a length that wraps,
 * a length past the allocation's end (into a neighbour or the pin's tail), an address in the gap
 * after a small allocation inside the same pinned page. None may return a record that does not
 * cover it. */
static void test_requests_no_record_serves(void **state)
{
	uint64_t a = fake_cuda_alloc(1024), big = fake_cuda_alloc(3 * MiB);
	struct gdr_region *held, *r;
	int rc;

	(void)state;
	held = reg_acc(NULL, 0, a, 1024);
	assert_int_equal(gdr_dereg(reg_acc(NULL, 0, big, 3 * MiB)), 0);
	assert_int_equal(gdr_dereg(reg_acc(NULL, 0, a, 1024)), 0); /* memo */
	r = (void *)1;
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, 0, 0, &r), -EINVAL);
	assert_null(r);
	assert_int_equal(gdr_reg(cache, NULL, (void *)(uintptr_t)a, UINT64_MAX - a + 2, 0, &r),
			 -EINVAL);
	/* past the end of the small allocation: a gap (nothing allocated) */
	r = NULL;
	rc = gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 512), 1024, 0, &r);
	if (rc == 0) {
		assert_serves(r, NULL, 0, a + 512, 1024);
		assert_int_equal(gdr_dereg(r), 0);
	}
	rc = gdr_reg(cache, NULL, (void *)(uintptr_t)(a + 2048), 512, 0, &r);
	if (rc == 0) {
		assert_serves(r, NULL, 0, a + 2048, 512);
		assert_int_equal(gdr_dereg(r), 0);
	}
	/* past the end of the big one */
	rc = gdr_reg(cache, NULL, (void *)(uintptr_t)(big + 3 * MiB - 4096), 8192, 0, &r);
	if (rc == 0) {
		assert_serves(r, NULL, 0, big + 3 * MiB - 4096, 8192);
		assert_int_equal(gdr_dereg(r), 0);
	}
	/* cached-only requests never return a record that does not serve */
	rc = gdr_reg(cache, NULL, (void *)(uintptr_t)(big + 3 * MiB - 1), 2, GDR_REG_CACHED_ONLY,
		     &r);
	if (rc == 0) {
		assert_serves(r, NULL, 0, big + 3 * MiB - 1, 2);
		assert_int_equal(gdr_dereg(r), 0);
	}
	/* addresses near the top of the address space: no record, no crash */
	for (int i = 0; i < 4; i++) {
		static const uint64_t top[] = { (1ULL << 47) - 4096, (1ULL << 47),
						UINT64_MAX - 4095, UINT64_MAX };
		rc = gdr_reg(cache, NULL, (void *)(uintptr_t)top[i], 1, GDR_REG_CACHED_ONLY, &r);
		assert_true(rc == -ENOENT || (rc == -EINVAL && top[i] == UINT64_MAX));
	}
	assert_int_equal(gdr_dereg(held), 0);
	check_index();
	free_evented(a);
	free_evented(big);
}

/* Releasing a PD's records (tombstones in the hash, lev_n down) and making them again: the hash
 * stays exact, and hits of the other PD go on being served by their own records. */
static void test_pd_release_and_remake(void **state)
{
	enum { N = 200 };
	static uint64_t va[N];

	(void)state;
	for (int i = 0; i < N; i++)
		va[i] = fake_cuda_alloc(4096ULL << (i % 9));
	for (int round = 0; round < 4; round++) {
		for (int i = 0; i < N; i++) {
			assert_int_equal(gdr_dereg(reg_acc(FAKE_PD, LW, va[i], 4096)), 0);
			assert_int_equal(gdr_dereg(reg_acc(FAKE_PD2, LW, va[i], 4096)), 0);
			assert_int_equal(gdr_dereg(reg_acc(FAKE_PD2, LW | RR, va[i], 2048)), 0);
		}
		check_index();
		assert_int_equal(gdr_cache_release_pd(cache, round % 2 ? FAKE_PD : FAKE_PD2), 0);
		check_index();
	}
	for (int i = 0; i < N; i++)
		free_evented(va[i]);
	assert_true(gdr_cache_flush(cache) >= 0);
	check_index();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_many_pds_and_modes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dense_granules, setup, teardown),
		cmocka_unit_test_setup_teardown(test_request_across_neighbours, setup, teardown),
		cmocka_unit_test_setup_teardown(test_request_across_pool_chunks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tag_mode_exact_across_neighbours, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_events_mode_exact_across_neighbours, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_growth_and_churn, setup, teardown),
		cmocka_unit_test_setup_teardown(test_growth_while_hitting, setup, teardown),
		cmocka_unit_test_setup_teardown(test_requests_no_record_serves, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pd_release_and_remake, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
