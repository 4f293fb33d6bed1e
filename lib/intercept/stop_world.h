/* SPDX-License-Identifier: MIT */
/*
 * Stopping every other thread of the process for a moment, so that bytes a thread may be running
 * can be rewritten (the entry patcher's five-byte form on x86-64, patch.c, when the one-byte form's
 * stub address is taken or out of reach: docs/FACTS.md, "Patching a running libcuda").
 *
 * Each other thread that is running (or stopped inside the bytes) is sent a signal whose handler
 * parks it; a thread whose interrupted program counter lies inside the bytes about to be rewritten
 * (past their first byte) is moved to the same offset in the copy of those instructions the
 * caller already wrote (the trampoline's orig, which runs them and jumps back past the rewritten
 * bytes). A thread asleep in the kernel outside the bytes is left asleep, and read again to see
 * that it did not run. When every thread is parked or asleep, fn runs; then all go on.
 *
 * The signal is SIGURG, or SIGWINCH where the program has a handler of its own for SIGURG: both are
 * ignored by default, so one that arrives after the handler is gone does nothing, and gdb passes
 * both on without stopping (info signals). Neither is used where the program handles both.
 * Queued with a generation number (rt_tgsigqueueinfo, SI_QUEUE from this process): the handler
 * acts only on the current run's, and a SIGURG from elsewhere (a socket's out-of-band data) does
 * nothing while the handler is installed (the program had no handler for it).
 *
 * What it cannot see (docs/FACTS.md says more): a thread that was inside the bytes when a signal
 * handler of the program's interrupted it, and is still in that handler (its saved program
 * counter is in the handler's frame, not ours); a sleeping thread that is woken during the
 * microseconds between its last reading and fn, and reaches the bytes then (counted:
 * gdr_stw_last().sleepers_ran).
 */
#ifndef GDRCACHE_STOP_WORLD_H
#define GDRCACHE_STOP_WORLD_H

#include <stdint.h>

/* Bytes about to be rewritten: [start, start + len); a thread whose pc is in (start, start + len)
 * is moved to moved_to + (pc - start) (the same instructions, copied there). */
struct gdr_stw_region {
	uintptr_t start;
	unsigned len;
	uintptr_t moved_to;
};

/* What the last run did (read after it returned, by the thread that ran it). */
struct gdr_stw_stats {
	unsigned threads;  /* other threads parked */
	unsigned sleepers; /* threads left asleep in the kernel outside the region, not signalled */
	unsigned sleepers_ran; /* of those, threads that ran while fn ran */
	unsigned relocated;    /* threads moved out of the region */
	unsigned rounds;       /* passes over /proc/self/task */
	int sig;               /* the signal used */
	uint64_t ns;           /* from the first signal to the release */
};

/* Runs fn(arg) while every other thread is stopped (region as above). fn's return value, or
 * -errno without fn run, *why set (static text, or a buffer valid until the next run):
 *   -EBUSY    a thread did not stop within the deadline, or runs with the signal blocked, or the
 *             program handles both signals
 *   -E2BIG    more threads than the table holds
 *   -ENOTSUP  no program counter to read on this architecture
 *   other     -errno of reading /proc/self/task, or of sending the signal
 * Serialised (one run at a time). Calls nothing that takes a lock another thread may hold while
 * any thread is parked: fn must not either (no heap, no stdio, no dynamic loader). */
int gdr_stw_run(const struct gdr_stw_region *region, int (*fn)(void *), void *arg,
		const char **why);

struct gdr_stw_stats gdr_stw_last(void);

/* The deadlines, milliseconds (tests shorten them): every thread must stop within park_ms; a
 * parked thread gives up after hold_ms (> park_ms) if the run never ends. */
void gdr_stw_set_deadlines(unsigned park_ms, unsigned hold_ms);

#endif /* GDRCACHE_STOP_WORLD_H */
