/* SPDX-License-Identifier: MIT */
/*
 * bench_hit's traces: the operations (allocations, frees, registrations) of each access pattern,
 * generated from a seed, the same for every system (hit_pattern.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hit_pattern.h"

uint64_t rng_state;

uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static double rndu(void)
{
	return (double)(rnd() >> 11) / 9007199254740992.0;
}

static void emit(struct trace *t, uint32_t kind, uint32_t slot, uint64_t a, uint64_t b)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 4096;
		t->ops = realloc(t->ops, t->cap * sizeof(*t->ops));
		if (!t->ops) {
			perror("realloc");
			exit(1);
		}
	}
	t->ops[t->n++] = (struct op){ kind, slot, a, b };
	if (slot + 1 > t->nslots)
		t->nslots = slot + 1;
}

/* A caching allocator (PyTorch-like) over the driver: tensors take a free cached block of their
 * size or a new one; freed tensors go back to the cache; empty_cache() every 20 steps, and the
 * cache past 256 MiB, free blocks to the driver. Every tensor is registered whole, half of them
 * also by a 64 KiB-aligned slice (a gradient bucket). */
void gen_alloc_loop(struct trace *t, int steps)
{
	static const uint64_t pattern[] = { 64 * KiB, 256 * KiB, MiB,       2 * MiB,
					    4 * MiB,  8 * MiB,   MiB,       512 * KiB,
					    16 * MiB, 2 * MiB,   128 * KiB, 4 * MiB };
	enum { NP = sizeof(pattern) / sizeof(pattern[0]), MAXB = 4096 };
	struct {
		uint32_t slot;
		uint64_t size;
		int in_use;
	} blk[MAXB];
	uint32_t nb = 0, next_slot = 0;
	uint64_t cached = 0;

	t->name = "alloc-loop";
	t->what = "caching allocator: block reuse, empty_cache every 20 steps, realloc at same VA";
	t->lim = (struct sys_limits){ 512 * MiB, 4096 };
	for (int s = 0; s < steps; s++) {
		uint32_t live[NP + 1];
		int nlive = 0;

		for (int i = 0; i <= NP; i++) {
			uint64_t size;
			uint32_t b;

			if (i == NP) { /* one tensor of an odd size, one step in ten */
				if (rnd() % 10)
					continue;
				size = 64 * KiB * (1 + rnd() % 64);
			} else {
				size = pattern[i];
			}
			for (b = 0; b < nb; b++)
				if (!blk[b].in_use && blk[b].size == size)
					break;
			if (b == nb) {
				if (nb == MAXB)
					break;
				blk[nb] = (typeof(blk[0])){ next_slot++, size, 0 };
				emit(t, OP_ALLOC, blk[nb].slot, size, 0);
				cached += size;
				nb++;
			}
			blk[b].in_use = 1;
			live[nlive++] = b;
			emit(t, OP_REG, blk[b].slot, 0, size);
			if (rnd() & 1) {
				uint64_t off = (rnd() % (size / (64 * KiB))) * 64 * KiB;

				emit(t, OP_REG, blk[b].slot, off,
				     size - off < MiB ? size - off : MiB);
			}
		}
		for (int i = 0; i < nlive; i++)
			blk[live[i]].in_use = 0;
		if ((s + 1) % 20 == 0 || cached > 256 * MiB) {
			uint32_t k = 0;

			for (uint32_t b = 0; b < nb; b++) {
				if (blk[b].in_use) {
					blk[k++] = blk[b];
					continue;
				}
				emit(t, OP_FREE, blk[b].slot, 0, 0);
				cached -= blk[b].size;
			}
			nb = k;
		}
	}
	for (uint32_t b = 0; b < nb; b++)
		emit(t, OP_FREE, blk[b].slot, 0, 0);
}

/* A 3-D halo exchange, N = 256 doubles a side, ghost width 4: faces 512 KiB, edges 32 KiB,
 * corners 512 B. Fields 0-1: one send and one receive buffer per neighbour; fields 2-3: one
 * packed send and one packed receive buffer, neighbours registered by offset. Every 50 iterations
 * field 1's receive buffers and field 3's packed buffers are freed and allocated again. */
void gen_halo(struct trace *t, int iters)
{
	enum { F = 4, NB = 26 };
	uint64_t sz[NB], packed = 0, off[NB];
	uint32_t slot[F][2][NB];
	uint32_t next = 0;

	t->name = "halo";
	t->what = "MPI halo exchange: 4 fields x 26 neighbours x send/recv, packed and separate";
	t->lim = (struct sys_limits){ 512 * MiB, 4096 };
	for (int n = 0; n < NB; n++) {
		sz[n] = n < 6 ? 512 * KiB : n < 18 ? 32 * KiB : 512;
		off[n] = packed;
		packed += sz[n];
	}
	for (int f = 0; f < F; f++)
		for (int d = 0; d < 2; d++) {
			if (f < 2) {
				for (int n = 0; n < NB; n++) {
					slot[f][d][n] = next++;
					emit(t, OP_ALLOC, slot[f][d][n], sz[n], 0);
				}
			} else {
				slot[f][d][0] = next++;
				emit(t, OP_ALLOC, slot[f][d][0], packed, 0);
			}
		}
	for (int it = 0; it < iters; it++) {
		if (it && it % 50 == 0) {
			for (int n = 0; n < NB; n++) {
				emit(t, OP_FREE, slot[1][1][n], 0, 0);
				emit(t, OP_ALLOC, slot[1][1][n], sz[n], 0);
			}
			for (int d = 0; d < 2; d++) {
				emit(t, OP_FREE, slot[3][d][0], 0, 0);
				emit(t, OP_ALLOC, slot[3][d][0], packed, 0);
			}
		}
		for (int f = 0; f < F; f++)
			for (int d = 0; d < 2; d++)
				for (int n = 0; n < NB; n++) {
					if (f < 2)
						emit(t, OP_REG, slot[f][d][n], 0, sz[n]);
					else
						emit(t, OP_REG, slot[f][d][0], off[n], sz[n]);
				}
	}
	for (uint32_t s = 0; s < next; s++)
		emit(t, OP_FREE, s, 0, 0);
}

/* 48 live buffers of 64 KiB x 2^(0..9) (about 250 MiB live, 4 x the 64 MiB cache limit);
 * registrations of random 4 KiB-aligned sub-ranges, buffers picked with a skew (u^2); 8% of the
 * operations free a buffer and allocate another of a new size in its place. */
void gen_churn(struct trace *t, int nops)
{
	enum { L = 48 };
	uint64_t size[L];

	t->name = "churn";
	t->what = "random sizes and sub-ranges, frees and new allocations, live set 4x the limit";
	t->lim = (struct sys_limits){ 64 * MiB, 1024 };
	for (int s = 0; s < L; s++) {
		size[s] = 64 * KiB << (rnd() % 10);
		emit(t, OP_ALLOC, s, size[s], 0);
	}
	for (int i = 0; i < nops; i++) {
		double u = rndu();
		uint32_t s = (uint32_t)(L * u * u);

		if (rnd() % 100 < 8) {
			emit(t, OP_FREE, s, 0, 0);
			size[s] = 64 * KiB << (rnd() % 10);
			emit(t, OP_ALLOC, s, size[s], 0);
		} else {
			uint64_t off = (rnd() % (size[s] / (4 * KiB))) * 4 * KiB;
			uint64_t len = 4 * KiB << (rnd() % 9);

			if (len > size[s] - off)
				len = size[s] - off;
			emit(t, OP_REG, s, off, len);
		}
	}
	for (uint32_t s = 0; s < L; s++)
		emit(t, OP_FREE, s, 0, 0);
}

/* 256 live allocations of 512 B to 64 MiB (log-uniform: small ones share pages, large ones are
 * their own chunks; about 1.4 GiB live, 5-6 x the 256 MiB limit); registrations whole (a third) or
 * of a random 4 KiB-aligned sub-range, allocations picked with a skew (u^2); 5% of the operations
 * free one and allocate another of a new size in its place. */
void gen_size_mix(struct trace *t, int nops)
{
	enum { L = 256 };
	uint64_t size[L];

	t->name = "size-mix";
	t->what = "allocations of 512 B to 64 MiB, whole and sub-range registrations, frees";
	t->lim = (struct sys_limits){ 256 * MiB, 4096 };
	for (int s = 0; s < L; s++) {
		size[s] = (uint64_t)(512.0 * pow(2.0, 17.0 * rndu()));
		emit(t, OP_ALLOC, s, size[s], 0);
	}
	for (int i = 0; i < nops; i++) {
		double u = rndu();
		uint32_t s = (uint32_t)(L * u * u);

		if (rnd() % 100 < 5) {
			emit(t, OP_FREE, s, 0, 0);
			size[s] = (uint64_t)(512.0 * pow(2.0, 17.0 * rndu()));
			emit(t, OP_ALLOC, s, size[s], 0);
		} else if (rnd() % 3 == 0 || size[s] <= 4 * KiB) {
			emit(t, OP_REG, s, 0, size[s]);
		} else {
			uint64_t off = (rnd() % (size[s] / (4 * KiB))) * 4 * KiB;
			uint64_t len = 4 * KiB << (rnd() % 10);

			if (len > size[s] - off)
				len = size[s] - off;
			emit(t, OP_REG, s, off, len);
		}
	}
	for (uint32_t s = 0; s < L; s++)
		emit(t, OP_FREE, s, 0, 0);
}

/* PyTorch's caching allocator (CUDACachingAllocator, simplified): requests up to 1 MiB are carved
 * from 2 MiB segments, up to 10 MiB from 20 MiB segments, larger ones get a segment of their own
 * rounded up to 2 MiB; freed blocks go back to the pool (merged with free neighbours), and only
 * empty_cache() gives whole free segments back to the driver. A training loop over a 24-layer
 * model: each step's forward pass allocates every layer's activations (sizes scaled by the step's
 * sequence length, one of three) and registers each (a pipeline stage sending them, or saving them
 * for a remote backward), the backward pass frees them in reverse; empty_cache() every 25 steps.
 * About 4.4 GiB of activations a step: more than the old fixed default of 4 GiB. Limits: the
 * library's defaults (what a job gets); the others unbounded. */
struct pt_block {
	uint32_t seg;
	uint64_t off, size;
	int used;
};
struct pt_alloc {
	struct trace *t;
	struct pt_block *b;
	uint32_t nb, cap, nseg;
	uint64_t *seg_size;
	uint32_t *seg_slot, next_slot;
	int *seg_live;
};

static uint32_t pt_malloc(struct pt_alloc *pa, uint64_t size)
{
	uint64_t seg_size;
	uint32_t best = UINT32_MAX;
	int small = size <= MiB;

	size = (size + 511) & ~511ULL; /* kMinBlockSize */
	for (uint32_t i = 0; i < pa->nb; i++) {
		struct pt_block *b = &pa->b[i];
		int bsmall = pa->seg_size[b->seg] == 2 * MiB;

		if (!b->used && b->size >= size && bsmall == small &&
		    (best == UINT32_MAX || b->size < pa->b[best].size))
			best = i;
	}
	if (best == UINT32_MAX) {
		seg_size = small              ? 2 * MiB
			   : size <= 10 * MiB ? 20 * MiB
					      : (size + 2 * MiB - 1) & ~(2 * MiB - 1);
		if (pa->nseg % 64 == 0) {
			pa->seg_size =
				realloc(pa->seg_size, (pa->nseg + 64) * sizeof(*pa->seg_size));
			pa->seg_slot =
				realloc(pa->seg_slot, (pa->nseg + 64) * sizeof(*pa->seg_slot));
			pa->seg_live =
				realloc(pa->seg_live, (pa->nseg + 64) * sizeof(*pa->seg_live));
		}
		pa->seg_size[pa->nseg] = seg_size;
		pa->seg_slot[pa->nseg] = pa->next_slot++;
		pa->seg_live[pa->nseg] = 1;
		emit(pa->t, OP_ALLOC, pa->seg_slot[pa->nseg], seg_size, 0);
		if (pa->nb == pa->cap) {
			pa->cap = pa->cap ? 2 * pa->cap : 256;
			pa->b = realloc(pa->b, pa->cap * sizeof(*pa->b));
		}
		pa->b[pa->nb] = (struct pt_block){ pa->nseg, 0, seg_size, 0 };
		best = pa->nb++;
		pa->nseg++;
	}
	if (pa->b[best].size - size >= (small ? 512 : MiB)) { /* split off the rest */
		if (pa->nb == pa->cap) {
			pa->cap *= 2;
			pa->b = realloc(pa->b, pa->cap * sizeof(*pa->b));
		}
		pa->b[pa->nb++] = (struct pt_block){ pa->b[best].seg, pa->b[best].off + size,
						     pa->b[best].size - size, 0 };
		pa->b[best].size = size;
	}
	pa->b[best].used = 1;
	return best;
}

static void pt_free(struct pt_alloc *pa, uint32_t i)
{
	struct pt_block *b = &pa->b[i];

	b->used = 0;
	for (int merged = 1; merged;) { /* merge with free neighbours in its segment */
		merged = 0;
		for (uint32_t j = 0; j < pa->nb; j++) {
			struct pt_block *o = &pa->b[j];

			if (j == i || o->used || o->seg != b->seg || o->size == 0)
				continue;
			if (o->off + o->size == b->off || b->off + b->size == o->off) {
				if (o->off < b->off)
					b->off = o->off;
				b->size += o->size;
				o->size = 0;
				merged = 1;
			}
		}
	}
}

static void pt_empty_cache(struct pt_alloc *pa)
{
	uint32_t k = 0;

	for (uint32_t sg = 0; sg < pa->nseg; sg++) {
		int busy = 0, any = 0;

		if (!pa->seg_live[sg])
			continue;
		for (uint32_t i = 0; i < pa->nb; i++)
			if (pa->b[i].seg == sg && pa->b[i].size) {
				any = 1;
				busy |= pa->b[i].used;
			}
		if (!busy && any) {
			emit(pa->t, OP_FREE, pa->seg_slot[sg], 0, 0);
			pa->seg_live[sg] = 0;
			for (uint32_t i = 0; i < pa->nb; i++)
				if (pa->b[i].seg == sg)
					pa->b[i].size = 0;
		}
	}
	for (uint32_t i = 0; i < pa->nb; i++) /* compact */
		if (pa->b[i].size)
			pa->b[k++] = pa->b[i];
	pa->nb = k;
}

void gen_pytorch(struct trace *t, int steps)
{
	/* Per layer: sizes in units of the step's activation size A (16 MiB x seq / 2048). */
	static const struct {
		uint32_t num, den;
	} layer[] = {
		{ 3, 1 }, { 2, 1 },   { 1, 1 },  { 4, 1 },    { 4, 1 },
		{ 1, 1 }, { 1, 256 }, { 1, 64 }, { 1, 1024 }, { 1, 8 },
	};
	enum { NL = sizeof(layer) / sizeof(layer[0]), LAYERS = 24 };
	static const uint64_t seqs[] = { 1536, 2048, 2560 };
	struct pt_alloc pa = { .t = t };
	uint32_t act[LAYERS * NL];

	t->name = "pytorch";
	t->what =
		"caching allocator: 24 layers of activations a step, registered, freed, empty_cache";
	t->lim = (struct sys_limits){ 0, 0 }; /* the library's defaults */
	for (int s = 0; s < steps; s++) {
		uint64_t A = 16 * MiB * seqs[rnd() % 3] / 2048;
		int n = 0;

		for (int l = 0; l < LAYERS; l++)
			for (int k = 0; k < NL; k++) {
				uint64_t size = A * layer[k].num / layer[k].den;
				uint32_t b = pt_malloc(&pa, size);

				act[n++] = b;
				emit(t, OP_REG, pa.seg_slot[pa.b[b].seg], pa.b[b].off, size);
			}
		while (n > 0)
			pt_free(&pa, act[--n]);
		if ((s + 1) % 25 == 0)
			pt_empty_cache(&pa);
	}
	for (uint32_t sg = 0; sg < pa.nseg; sg++)
		if (pa.seg_live[sg])
			emit(t, OP_FREE, pa.seg_slot[sg], 0, 0);
	free(pa.b);
	free(pa.seg_size);
	free(pa.seg_slot);
	free(pa.seg_live);
}
