/* SPDX-License-Identifier: MIT */
/*
 * Bounded waits for tests: a wait for something the machine may never deliver (a trap, a signal, a
 * thread reaching a point, a child) ends at a deadline, and the caller decides what that means
 * (skip: the machine cannot make the case; fail: the code under test did not get there).
 */
#ifndef GDR_TEST_DEADLINE_H
#define GDR_TEST_DEADLINE_H

#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* GDR_TEST_WAIT_SCALE (an integer, default 1) multiplies every deadline: for a machine that is
 * slower still than a loaded 2-core one under qemu-user or a sanitizer. */
static inline int64_t gdr_deadline_scale(void)
{
	static int64_t scale; /* __atomic: any thread may be first */
	int64_t k = __atomic_load_n(&scale, __ATOMIC_RELAXED);

	if (!k) {
		const char *s = getenv("GDR_TEST_WAIT_SCALE");
		long v = s ? strtol(s, NULL, 10) : 1;

		k = v > 0 && v < 1000 ? v : 1;
		__atomic_store_n(&scale, k, __ATOMIC_RELAXED);
	}
	return k;
}

static inline int64_t gdr_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The monotonic time ms milliseconds (scaled) from now. */
static inline int64_t gdr_deadline_ms(int64_t ms)
{
	return gdr_now_ns() + ms * gdr_deadline_scale() * 1000000;
}

static inline bool gdr_deadline_passed(int64_t deadline)
{
	return gdr_now_ns() >= deadline;
}

/* The deadline as a CLOCK_REALTIME time: what pthread_timedjoin_np, sem_timedwait and
 * pthread_cond_timedwait take (TSan intercepts these, not their clockid variants). */
static inline struct timespec gdr_deadline_realtime(int64_t deadline)
{
	struct timespec now;
	int64_t left = deadline - gdr_now_ns(), at;

	clock_gettime(CLOCK_REALTIME, &now);
	at = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec + (left > 0 ? left : 0);
	return (struct timespec){ at / 1000000000, at % 1000000000 };
}

/* A wait of ms (before GDR_TEST_WAIT_SCALE) in whole seconds, as scaled: for its messages. */
static inline long long gdr_deadline_s(int64_t ms)
{
	return (long long)(ms / 1000 * gdr_deadline_scale());
}

#ifdef _GNU_SOURCE
#include <pthread.h>
/* pthread_join until deadline (gdr_deadline_ms): 0, or ETIMEDOUT once it passed. */
static inline int gdr_join_until(pthread_t t, int64_t deadline)
{
	struct timespec ts = gdr_deadline_realtime(deadline);

	return pthread_timedjoin_np(t, NULL, &ts);
}
#endif

/* Spins (yielding) until *flag is nonzero (acquire) or the deadline passes: whether it came. */
static inline bool gdr_wait_flag(const int *flag, int64_t deadline)
{
	while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
		if (gdr_deadline_passed(deadline))
			return __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 0;
		sched_yield();
	}
	return true;
}

#endif /* GDR_TEST_DEADLINE_H */
