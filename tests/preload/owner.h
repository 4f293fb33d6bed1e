/* SPDX-License-Identifier: MIT */
/* The preload's test programs: which object defines a function they resolved. */
#ifndef GDR_TESTS_PRELOAD_OWNER_H
#define GDR_TESTS_PRELOAD_OWNER_H

#include <dlfcn.h>
#include <string.h>

/* 'p' the preload, 'v' libibverbs (the fake or the real one), '?' another object or none. */
static inline char owner(const void *fn)
{
	Dl_info info = { 0 };

	if (!fn || !dladdr(fn, &info) || !info.dli_fname)
		return '?';
	if (strstr(info.dli_fname, "libgdrcache-preload"))
		return 'p';
	return strstr(info.dli_fname, "libibverbs") ? 'v' : '?';
}

#endif /* GDR_TESTS_PRELOAD_OWNER_H */
