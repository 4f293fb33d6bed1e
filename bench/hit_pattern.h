/* SPDX-License-Identifier: MIT */
/*
 * bench_hit's traces: a trace is the operations of one access pattern (allocations, frees and
 * registrations of slots), generated from rng_state; run_trace in bench_hit.c replays it.
 */
#ifndef HIT_PATTERN_H
#define HIT_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#include "hit_sys.h"

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)

enum { OP_ALLOC, OP_FREE, OP_REG };

struct op {
	uint32_t kind, slot;
	uint64_t a, b; /* ALLOC: size; REG: offset, length */
};

struct trace {
	const char *name;
	const char *what;
	struct op *ops;
	size_t n, cap;
	uint32_t nslots;
	struct sys_limits lim;
};

/* The generators' random state (xorshift64): set it before each generator for its trace. */
extern uint64_t rng_state;
uint64_t rnd(void);

void gen_alloc_loop(struct trace *t, int steps);
void gen_halo(struct trace *t, int iters);
void gen_churn(struct trace *t, int nops);
void gen_size_mix(struct trace *t, int nops);
void gen_pytorch(struct trace *t, int steps);

#endif
