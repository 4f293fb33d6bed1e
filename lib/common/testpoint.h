/* SPDX-License-Identifier: MIT */
/*
 * Test points: named instants inside the library where a test may stop a thread to force an
 * interleaving (a release caught just after it read its record's magic, say) on every CPU and
 * under qemu, where a hardware watchpoint may not fire. They exist only in the objects that
 * lib/CMakeLists.txt compiles a second time with GDR_TEST_POINTS for the tests
 * (gdrcache_internal_tp); in libgdrcache.so and everything shipped, GDR_TEST_POINT is nothing.
 */
#ifndef GDR_COMMON_TESTPOINT_H
#define GDR_COMMON_TESTPOINT_H

enum gdr_test_point {
	GDR_TP_DEREG_MAGIC,  /* gdr_dereg just read the record's magic (gdr_region_handed) */
	GDR_TP_DEREG_ESTATE, /* gdr_dereg just read the entry's state as the record mirrors it */
	GDR_TP_COUNT
};

#ifdef GDR_TEST_POINTS
/* The test's function, called in the thread that reaches a point (NULL: none); set with __atomic. */
extern void (*gdr_test_point_fn)(enum gdr_test_point tp);
#define GDR_TEST_POINT(tp)                                                                         \
	do {                                                                                       \
		void (*gdr_tp_fn_)(enum gdr_test_point) =                                          \
			__atomic_load_n(&gdr_test_point_fn, __ATOMIC_ACQUIRE);                     \
		if (gdr_tp_fn_)                                                                    \
			gdr_tp_fn_(tp);                                                            \
	} while (0)
#else
#define GDR_TEST_POINT(tp) ((void)0)
#endif

#endif /* GDR_COMMON_TESTPOINT_H */
