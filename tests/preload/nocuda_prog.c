/* SPDX-License-Identifier: MIT */
/*
 * A verbs program that never loads the CUDA driver: N host-memory registrations and
 * deregistrations (argv[1], default 100). preload_test.sh's "nocuda" mode runs it under the preload
 * with LD_DEBUG=libs and counts the loader's searches for libcuda.so.1: the preload must not look
 * for a driver that was not loaded at every registration (each search is several failed openat).
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>

#include "open_ctx.h"

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 100;
	struct ibv_context *c = open_ctx();
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	char *buf = malloc(1 << 16);

	if (!pd || !buf) {
		printf("setup failed (the fake libibverbs)\n");
		return 77;
	}
	for (int i = 0; i < n; i++) {
		struct ibv_mr *mr = ibv_reg_mr(pd, buf + (i % 16) * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);

		if (!mr || ibv_dereg_mr(mr)) {
			printf("registration %d failed\n", i);
			return 1;
		}
	}
	printf("%d host registrations\n", n);
	ibv_dealloc_pd(pd);
	ibv_close_device(c);
	free(buf);
	return 0;
}
