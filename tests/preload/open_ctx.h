/* SPDX-License-Identifier: MIT */
/* The preload's test programs: the first device of the libibverbs they run over, opened. */
#ifndef GDR_TESTS_PRELOAD_OPEN_CTX_H
#define GDR_TESTS_PRELOAD_OPEN_CTX_H

#include <infiniband/verbs.h>

/* A context of the first device listed, or NULL (no device, or it did not open). */
static inline struct ibv_context *open_ctx(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c = l && l[0] ? ibv_open_device(l[0]) : NULL;

	if (l)
		ibv_free_device_list(l);
	return c;
}

#endif /* GDR_TESTS_PRELOAD_OPEN_CTX_H */
