/* SPDX-License-Identifier: MIT */
/* The cache's index of entries and its lock-free hash of registration records (index.c). */
#ifndef GDR_CACHE_INDEX_H
#define GDR_CACHE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gdr_entry;
struct gdr_region;

/* index.c: the non-overlapping cached entries, sorted by base (under the lock), and a hash of the
 * registration records of those entries, which the lock-free hit path searches in O(1), changed in
 * place under the lock.
 *
 * The hash: a record [start, start+size) is put in level k (granule 2^(12+3k): 4 KiB, 32 KiB,
 * 256 KiB, 2 MiB, ... 512 GiB), the smallest whose granule is at least half its size, once for
 * every granule it touches (one to three). A slot is one 64-bit word: the record's slot number
 * (records live in one array per cache, record.c, so the number is its address), the part of the
 * granule it covers in 512ths (so that a lookup reads only a record that may hold the address,
 * where several records share a granule), and a fingerprint of the key (granule, level), never 0.
 * A lookup of an address probes, for each level that holds records (most populated first), its
 * key: open addressing, linear probing from the key's bucket of four slots, 8-byte slots, at most
 * half full. A slot is written whole (release) and never changes while it is there; removal
 * writes a tombstone. Since the slot gives the record's number, a hit loads the record and its
 * hold counter at once, not one after the other. A fingerprint may match another key's slot: a
 * reader trusts a record only after checking that it serves the request (its range lies in its
 * entry's), then checks its state, so a false match, a torn or a stale view can only make it
 * miss, and a miss takes the locked path. A record leaves the hash before it is retired, and
 * records are reused only after a grace period (record.c). Growing or compacting makes a new
 * table; the old one is freed after a grace period. */
#define GDR_HIX_LEVELS 10
#define GDR_HIX_EMPTY 0ULL
#define GDR_HIX_TOMB 1ULL
#define GDR_HIX_SLOT_BITS 20 /* the record's slot + 2 (0 and 1 are empty and tombstone) */
#define GDR_HIX_FP_SHIFT 38  /* the fingerprint: bits 38..63 */
struct gdr_hix {
	uint64_t order;        /* the levels holding records, most populated first: 4 bits
				  each from bit 0, their number in bits 60..63 (__atomic) */
	uint32_t bits;         /* 1 << bits slots */
	uint32_t used, dead;   /* live keys, tombstones (under the lock) */
	struct gdr_hix *defer; /* retired: freed after a grace period */
	uint64_t v[] __attribute__((aligned(64))); /* slots, eight to a cache line; then the
						      buckets' overflow filters */
};
struct gdr_index {
	struct gdr_entry **v;
	size_t n, cap;
	struct gdr_hix *hix;     /* never NULL once initialised */
	struct gdr_hix **pub;    /* where lookups read it: stored with release at every change */
	struct gdr_hix *retired; /* old tables a lookup may still read */
	uint32_t nretired;
	uint32_t lev_n[GDR_HIX_LEVELS]; /* records per level */
};
static inline unsigned gdr_hix_shift(unsigned k)
{
	return 12 + 3 * k;
}
static inline unsigned gdr_hix_level(uint64_t size)
{
	unsigned k = 0;

	while (k < GDR_HIX_LEVELS - 1 && size > (2ULL << gdr_hix_shift(k)))
		k++;
	return k;
}
/* The key of addr's granule at level k, hashed once for both its uses below, and *part, which
 * 512th of the granule addr lies in, from the same shift (a shift by a variable count costs a
 * lookup a register move too). The key: Fibonacci hashing of the granule, the level in the top
 * bits (a one-to-one map: the granule has at most 52 bits). The granules of one level step by
 * the golden ratio and spread evenly over the buckets. (A key that packed the level below the
 * granule, stepping by 16, piled neighbouring granules into a few buckets: 16 times the golden
 * ratio is close to 8/9.) */
static inline uint64_t gdr_hix_key_part(uint64_t addr, unsigned k, uint64_t *part)
{
	uint64_t g9 = addr >> (gdr_hix_shift(k) - 9);

	*part = g9 & 511;
	return ((g9 >> 9) ^ (uint64_t)k << 60) * 0x9e3779b97f4a7c15ULL;
}
/* The key alone. */
static inline uint64_t gdr_hix_key(uint64_t addr, unsigned k)
{
	uint64_t part;

	return gdr_hix_key_part(addr, k, &part);
}
/* The slots are in buckets of GDR_HIX_BUCKET (32 bytes: never across a cache line, the table
 * being 64-byte aligned): a key's probe run starts at the first slot of its bucket, so that a
 * lookup finds the key's slots in the bucket it reads first, without a branch (reg.c), but where
 * the bucket overflowed into the next. The bucket is the key's top bits. */
#define GDR_HIX_BUCKET 4
static inline uint64_t gdr_hix_pos(uint64_t key, uint32_t bits)
{
	return key >> (64 - bits) & ~(uint64_t)(GDR_HIX_BUCKET - 1);
}
/* After the slots, a byte per bucket: the keys whose probe run went past it (the bucket was full
 * of other keys or tombstones), eight bits of a filter of their fingerprints (gdr_hix_ovf_bit),
 * cleared only by a new table. A key whose bit is clear has all its slots in its home bucket: a
 * lookup that finds none of them covering the address takes the key for absent without a walk. */
static inline size_t gdr_hix_ovf_bytes(uint32_t bits)
{
	return (((1ULL << bits) / GDR_HIX_BUCKET + 7) & ~7ULL);
}
/* fp's bit in a bucket's filter: bits of the key apart from the bucket's and the forced one. */
static inline unsigned gdr_hix_ovf_bit(uint64_t fp)
{
	return (unsigned)(fp >> (GDR_HIX_FP_SHIFT + 1)) & 7;
}
/* The filter of the bucket at slot j (its first). */
static inline uint8_t *gdr_hix_ovf(const struct gdr_hix *h, uint64_t j)
{
	return (uint8_t *)&h->v[1ULL << h->bits] + j / GDR_HIX_BUCKET;
}
/* Whether a key of fingerprint fp may have left the bucket at slot j (its first). */
static inline bool gdr_hix_overflowed(const struct gdr_hix *h, uint64_t j, uint64_t fp)
{
	return __atomic_load_n(gdr_hix_ovf(h, j), __ATOMIC_RELAXED) >> gdr_hix_ovf_bit(fp) & 1;
}
/* A slot's fingerprint of key, in place (bits 38..63, never 0: empty and tombstone slots match no
 * key): bits 12..37 of the key, apart from the bucket's (a table has fewer than 2^26 slots), so
 * that the keys of one bucket differ. */
static inline uint64_t gdr_hix_fp(uint64_t key)
{
	return ((key >> 12 & ((1ULL << (64 - GDR_HIX_FP_SHIFT)) - 1)) | 1) << GDR_HIX_FP_SHIFT;
}
_Static_assert(GDR_HIX_SLOT_BITS + 3 <= 26, "a table's slots number fewer than 2^26");
/* A slot's word: its key's fingerprint (as gdr_hix_fp gives it), its record's slot number, and the
 * first and last 512th of the granule the record covers. */
static inline uint64_t gdr_hix_fp_of(uint64_t w)
{
	return w & ~((1ULL << GDR_HIX_FP_SHIFT) - 1);
}
static inline uint32_t gdr_hix_slot(uint64_t w)
{
	return (uint32_t)(w & ((1u << GDR_HIX_SLOT_BITS) - 1)) - 2;
}
static inline uint64_t gdr_hix_first(uint64_t w)
{
	return (w >> GDR_HIX_SLOT_BITS) & 511;
}
static inline uint64_t gdr_hix_last(uint64_t w)
{
	return (w >> (GDR_HIX_SLOT_BITS + 9)) & 511;
}
/* Which 512th of its level-k granule addr lies in (gdr_hix_key_part's *part). */
static inline uint64_t gdr_hix_part(uint64_t addr, unsigned k)
{
	uint64_t part;

	gdr_hix_key_part(addr, k, &part);
	return part;
}
/* The entry whose range holds addr, or NULL. Under the lock. */
struct gdr_entry *gdr_index_find(const struct gdr_index *ix, uint64_t addr);
/* Position of the first entry that ends after addr. */
size_t gdr_index_lower(const struct gdr_index *ix, uint64_t addr);
int gdr_index_init(struct gdr_index *ix, struct gdr_hix **pub);
int gdr_index_insert(struct gdr_index *ix, struct gdr_entry *e);
/* Take e out, and its records out of the hash. */
void gdr_index_remove(struct gdr_index *ix, struct gdr_entry *e);
/* A record of an indexed entry into the hash (out of memory: it is left out, and found by the
 * locked path only), and out of it. */
void gdr_index_add_record(struct gdr_index *ix, struct gdr_region *r);
void gdr_index_del_record(struct gdr_index *ix, struct gdr_region *r);
/* Free the retired tables: only after a grace period that began after they were retired. */
void gdr_index_reclaim(struct gdr_index *ix);
void gdr_index_free(struct gdr_index *ix);
/* Bytes the index uses now (sorted array and hash). */
size_t gdr_index_bytes(const struct gdr_index *ix);

#endif /* GDR_CACHE_INDEX_H */
