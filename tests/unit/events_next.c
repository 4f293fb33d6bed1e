/* SPDX-License-Identifier: MIT */
/* For test_events' RTLD_NEXT check: built as libgdr_test_next_a.so (GDR_NEXT_WHICH 'a') and
 * libgdr_test_next_b.so ('b'), linked in that order after libgdrcache.so. a's dlsym(RTLD_NEXT)
 * goes through libgdrcache's dlsym and must still find b's definition (the next after a). */
#define _GNU_SOURCE
#include <dlfcn.h>

int gdr_test_next_which(void);
int gdr_test_next_which(void)
{
	return GDR_NEXT_WHICH;
}

#if GDR_NEXT_WHICH == 'b'
/* referenced by test_events, so that b stays on its list of needed libraries */
int gdr_test_next_b_marker(void);
int gdr_test_next_b_marker(void)
{
	return 'b';
}
#else
int gdr_test_next_from_a(void);
int gdr_test_next_from_a(void)
{
	int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "gdr_test_next_which");

	return next ? next() : -1;
}
#endif
