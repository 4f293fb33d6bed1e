/* SPDX-License-Identifier: MIT */
/* The lookup structure: cached entries, never overlapping, in an array sorted by base address
 * (what the locked path searches and walks), and a hash of their registration records by granule
 * that the lock-free hit path searches in O(1), changed in place under the cache lock
 * (index.h says how a reader stays safe). Old hash tables are freed after a grace period
 * (thread.c), by record.c. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "cache/index.h"

#define HIX_MIN_BITS 6

size_t gdr_index_lower(const struct gdr_index *ix, uint64_t addr)
{
	size_t lo = 0, hi = ix->n;

	/* First entry whose end is above addr. Entries do not overlap, so ends are sorted too. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct gdr_entry *e = ix->v[mid];

		if (e->pin.base + e->pin.len <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct gdr_entry *gdr_index_find(const struct gdr_index *ix, uint64_t addr)
{
	size_t i = gdr_index_lower(ix, addr);

	if (i < ix->n && ix->v[i]->pin.base <= addr)
		return ix->v[i];
	return NULL;
}

/* ---- the hash of records ----------------------------------------------------------------------- */

static uint64_t granules(uint64_t start, uint64_t size, unsigned k, uint64_t *first)
{
	unsigned shift = gdr_hix_shift(k);

	*first = start >> shift;
	return ((start + (size ? size : 1) - 1) >> shift) - *first + 1;
}

static uint64_t record_keys(const struct gdr_region *r, unsigned *k, uint64_t *first)
{
	*k = gdr_hix_level(r->size);
	return granules(r->start, r->size, *k, first);
}

/* The word of r's slot for granule g of level k (key: that granule's). */
static uint64_t record_word(const struct gdr_region *r, unsigned k, uint64_t g, uint64_t key)
{
	unsigned shift = gdr_hix_shift(k);
	uint64_t gs = g << shift, ge = gs + (1ULL << shift), s = r->start, e = r->start + r->size;

	if (s < gs)
		s = gs;
	if (e > ge || e <= s)
		e = ge;
	return (uint64_t)(gdr_rec_slot(r) + 2) | gdr_hix_part(s, k) << GDR_HIX_SLOT_BITS |
	       gdr_hix_part(e - 1, k) << (GDR_HIX_SLOT_BITS + 9) | gdr_hix_fp(key);
}

static struct gdr_hix *hix_alloc(uint32_t bits)
{
	size_t size = sizeof(struct gdr_hix) + (sizeof(uint64_t) << bits) + gdr_hix_ovf_bytes(bits);
	struct gdr_hix *h;

	if (posix_memalign((void **)&h, 64, size))
		return NULL;
	memset(h, 0, size);
	h->bits = bits;
	return h;
}

/* Put key's word in a free slot (empty or tombstone), whole (release); the buckets it passes get
 * the key's bit in their overflow filter first. */
static void hix_put(struct gdr_hix *h, uint64_t key, uint64_t word)
{
	uint64_t mask = (1ULL << h->bits) - 1;
	uint8_t bit = 1u << gdr_hix_ovf_bit(word);

	for (uint64_t j = gdr_hix_pos(key, h->bits);; j = (j + 1) & mask) {
		uint64_t sw = h->v[j];
		uint8_t *f = gdr_hix_ovf(h, j);

		if (sw != GDR_HIX_EMPTY && sw != GDR_HIX_TOMB) {
			if (j % GDR_HIX_BUCKET == GDR_HIX_BUCKET - 1 && !(*f & bit))
				__atomic_store_n(f, *f | bit, __ATOMIC_RELEASE);
			continue;
		}
		h->dead -= sw == GDR_HIX_TOMB;
		__atomic_store_n(&h->v[j], word, __ATOMIC_RELEASE);
		h->used++;
		return;
	}
}

static void hix_put_record(struct gdr_hix *h, struct gdr_region *r)
{
	unsigned k;
	uint64_t g, n = record_keys(r, &k, &g);

	for (uint64_t i = 0; i < n; i++) {
		uint64_t key = gdr_hix_key((g + i) << gdr_hix_shift(k), k);

		hix_put(h, key, record_word(r, k, g + i, key));
	}
}

/* The levels holding records, most populated first, packed for the lookup. */
static uint64_t hix_order(const struct gdr_index *ix)
{
	unsigned lev[GDR_HIX_LEVELS], n = 0;
	uint64_t order = 0;

	for (unsigned k = 0; k < GDR_HIX_LEVELS; k++) {
		unsigned i;

		if (!ix->lev_n[k])
			continue;
		for (i = n; i > 0 && ix->lev_n[lev[i - 1]] < ix->lev_n[k]; i--)
			lev[i] = lev[i - 1];
		lev[i] = k;
		n++;
	}
	for (unsigned i = n; i > 0; i--)
		order = order << 4 | lev[i - 1];
	return order | (uint64_t)n << 60;
}

static void hix_publish(struct gdr_index *ix)
{
	uint64_t order = hix_order(ix);

	if (__atomic_load_n(&ix->hix->order, __ATOMIC_RELAXED) != order)
		__atomic_store_n(&ix->hix->order, order, __ATOMIC_RELEASE);
	if (ix->pub && __atomic_load_n(ix->pub, __ATOMIC_RELAXED) != ix->hix)
		__atomic_store_n(ix->pub, ix->hix, __ATOMIC_RELEASE);
}

/* Make room for `more` keys: a new table (grown, or without tombstones) when the table would be
 * more than half full; the old one is retired (the new one is published by the caller). 0 or
 * -ENOMEM. */
static int hix_reserve(struct gdr_index *ix, uint64_t more)
{
	struct gdr_hix *h = ix->hix, *nh;
	uint64_t want = (uint64_t)h->used + more;
	uint32_t bits = HIX_MIN_BITS;

	if ((h->used + h->dead + more) * 2 <= (1ULL << h->bits))
		return 0;
	while ((1ULL << bits) < 3 * want)
		bits++;
	nh = hix_alloc(bits);
	if (!nh)
		return -ENOMEM;
	for (size_t i = 0; i < ix->n; i++)
		for (struct gdr_region *r = ix->v[i]->regions; r; r = gdr_region_next(r))
			hix_put_record(nh, r);
	nh->order = h->order;
	ix->hix = nh;
	h->defer = ix->retired;
	ix->retired = h;
	ix->nretired++;
	return 0;
}

void gdr_index_add_record(struct gdr_index *ix, struct gdr_region *r)
{
	unsigned k;
	uint64_t g, n = record_keys(r, &k, &g);

	if (hix_reserve(ix, n))
		return; /* found by the locked path only */
	hix_put_record(ix->hix, r);
	ix->lev_n[k]++;
	hix_publish(ix);
}

void gdr_index_del_record(struct gdr_index *ix, struct gdr_region *r)
{
	struct gdr_hix *h = ix->hix;
	uint64_t mask = (1ULL << h->bits) - 1;
	unsigned k;
	uint64_t g, n = record_keys(r, &k, &g);
	bool found = false;

	for (uint64_t q = 0; q < n; q++) {
		uint64_t key = gdr_hix_key((g + q) << gdr_hix_shift(k), k);
		uint64_t word = record_word(r, k, g + q, key);

		for (uint64_t j = gdr_hix_pos(key, h->bits); h->v[j] != GDR_HIX_EMPTY;
		     j = (j + 1) & mask) {
			if (h->v[j] == word) {
				__atomic_store_n(&h->v[j], GDR_HIX_TOMB, __ATOMIC_RELEASE);
				h->used--;
				h->dead++;
				found = true;
				break;
			}
		}
	}
	if (found) {
		ix->lev_n[k]--;
		hix_publish(ix);
	}
}

int gdr_index_init(struct gdr_index *ix, struct gdr_hix **pub)
{
	memset(ix, 0, sizeof(*ix));
	ix->hix = hix_alloc(HIX_MIN_BITS);
	if (!ix->hix)
		return -ENOMEM;
	ix->pub = pub;
	hix_publish(ix);
	return 0;
}

int gdr_index_insert(struct gdr_index *ix, struct gdr_entry *e)
{
	size_t i;

	if (ix->n == ix->cap) {
		size_t cap =
			ix->cap ? ix->cap + ix->cap / 2 : 64; /* 1.5x: 8 to 12 bytes an entry */
		struct gdr_entry **v = realloc(ix->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ix->v = v;
		ix->cap = cap;
	}
	i = gdr_index_lower(ix, e->pin.base);
	memmove(&ix->v[i + 1], &ix->v[i], (ix->n - i) * sizeof(ix->v[0]));
	ix->v[i] = e;
	ix->n++;
	for (struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		gdr_index_add_record(ix, r);
	return 0;
}

void gdr_index_remove(struct gdr_index *ix, struct gdr_entry *e)
{
	size_t i = gdr_index_lower(ix, e->pin.base);

	if (i >= ix->n || ix->v[i] != e)
		return;
	memmove(&ix->v[i], &ix->v[i + 1], (ix->n - i - 1) * sizeof(ix->v[0]));
	ix->n--;
	for (struct gdr_region *r = e->regions; r; r = gdr_region_next(r))
		gdr_index_del_record(ix, r);
}

void gdr_index_reclaim(struct gdr_index *ix)
{
	struct gdr_hix *h;

	while ((h = ix->retired)) {
		ix->retired = h->defer;
		free(h);
	}
	ix->nretired = 0;
}

void gdr_index_free(struct gdr_index *ix)
{
	gdr_index_reclaim(ix);
	free(ix->hix);
	free(ix->v);
	memset(ix, 0, sizeof(*ix));
}

size_t gdr_index_bytes(const struct gdr_index *ix)
{
	return ix->cap * sizeof(ix->v[0]) + sizeof(*ix->hix) + (sizeof(uint64_t) << ix->hix->bits) +
	       gdr_hix_ovf_bytes(ix->hix->bits);
}
