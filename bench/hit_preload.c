/* SPDX-License-Identifier: MIT */
/*
 * bench_hit's preload column: registrations as an unmodified verbs program makes them, ibv_reg_mr
 * and ibv_dereg_mr of a PD, served by libgdrcache-preload.so (its own cache: libgdrcache's
 * defaults and GDRCACHE_* environment, validation "auto"). The GPU machines have no NIC, so the
 * PD and the NIC registration a miss makes are the fake libibverbs' of tests/preload (free, where a
 * real one costs tens of microseconds). Available only where bench_hit runs with
 * LD_PRELOAD=libgdrcache-preload.so and LD_LIBRARY_PATH at the fake (bench/run-gpu.sh
 * preload-hits). Not in the traces: the preload's cache is the library's, so their hit rates are
 * gdr-events', and it says nothing of its misses or pins to the program.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hit_sys.h"

struct pre {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint64_t (*fake_count)(const char *what);
};

int pre_open(struct sys *s, const struct sys_limits *lim)
{
	struct ibv_device **l = NULL;
	struct pre *p;
	Dl_info info = { 0 };
	uint64_t (*count)(const char *);

	if (lim && (lim->max_bytes || lim->max_entries)) {
		snprintf(s->why, sizeof(s->why), "the preload's cache takes no limits but its "
			 "environment's");
		return -EINVAL;
	}
	*(void **)&count = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	if (!count) {
		snprintf(s->why, sizeof(s->why), "needs the fake libibverbs of tests/preload in "
			 "LD_LIBRARY_PATH (no NIC here: bench/run-gpu.sh preload-hits)");
		return -ENODEV;
	}
	/* (ibv_reg_mr) without a call: the function, not verbs.h's macro */
	if (!dladdr((void *)&ibv_reg_mr, &info) || !info.dli_fname ||
	    !strstr(info.dli_fname, "libgdrcache-preload")) {
		snprintf(s->why, sizeof(s->why), "needs LD_PRELOAD=libgdrcache-preload.so");
		return -ENODEV;
	}
	p = calloc(1, sizeof(*p));
	if (p)
		l = ibv_get_device_list(NULL);
	if (p && l && l[0])
		p->ctx = ibv_open_device(l[0]);
	if (l)
		ibv_free_device_list(l);
	if (p && p->ctx)
		p->pd = ibv_alloc_pd(p->ctx);
	if (!p || !p->pd) {
		if (p && p->ctx)
			ibv_close_device(p->ctx);
		free(p);
		snprintf(s->why, sizeof(s->why), "the fake libibverbs gave no PD");
		return -ENODEV;
	}
	p->fake_count = count;
	s->p = p;
	snprintf(s->why, sizeof(s->why), "ibv_reg_mr/ibv_dereg_mr through %s, over the fake "
		 "libibverbs", info.dli_fname);
	return 0;
}

int pre_get(void *p, uint64_t addr, size_t len, void **reg)
{
	struct ibv_mr *mr = ibv_reg_mr(((struct pre *)p)->pd, (void *)(uintptr_t)addr, len,
				       IBV_ACCESS_LOCAL_WRITE);

	*reg = mr;
	return mr ? 0 : -1;
}

void pre_put(void *p, void *reg)
{
	(void)p;
	ibv_dereg_mr(reg);
}

void pre_close(void *p)
{
	struct pre *q = p;

	ibv_dealloc_pd(q->pd);
	ibv_close_device(q->ctx);
	free(q);
}

void pre_describe(void *p, char *buf, size_t len)
{
	struct pre *q = p;

	/* what reached the fake libibverbs: the cache's own MRs (misses), nothing per hit */
	snprintf(buf, len, "registrations that reached libibverbs %" PRIu64 ", releases %" PRIu64,
		 q->fake_count("reg"), q->fake_count("dereg"));
}
