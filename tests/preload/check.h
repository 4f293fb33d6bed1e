/* SPDX-License-Identifier: MIT */
/* The preload's test programs: one "ok - " or "not ok - " line a check on stdout, failures counted
 * (from any thread). */
#ifndef GDR_TESTS_PRELOAD_CHECK_H
#define GDR_TESTS_PRELOAD_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (cond) {                                                                        \
			printf("ok - ");                                                           \
		} else {                                                                           \
			printf("not ok - %s:%d: %s: ", __func__, __LINE__, #cond);                 \
			__atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                        \
		}                                                                                  \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
	} while (0)

#endif /* GDR_TESTS_PRELOAD_CHECK_H */
