/* SPDX-License-Identifier: MIT */
/*
 * A program that never links libibverbs and loads it the way NCCL 2.30 does (its ibvsymbols.cc):
 * dlopen by name or by the path in NCCL_IBVERBS_LIB, then dlvsym(handle, name, "IBVERBS_1.1") for
 * most functions, ibv_reg_mr_iova2 at "IBVERBS_1.8", ibv_reg_dmabuf_mr at "IBVERBS_1.12"; and plain
 * dlsym as other plugins do. preload_test.sh runs it over the fake libibverbs, with the preload
 * (--expect cached: the registration functions it resolves are the preload's, GPU buffers get
 * shadow MRs from the cache), with it and GDRCACHE_DISABLE=1 (--expect disabled: the preload's
 * functions, libibverbs' MRs) and without it (--expect direct).
 *
 * Usage: dl_prog --expect cached|disabled|direct [--rdma-core 44|new] LIB...
 *   LIB       each name or path is dlopened in turn and everything is checked through its handle
 *   44 | new  whether libibverbs has today's nodes (ibv_reg_mr_ex@IBVERBS_1.15) or stops at 1.12
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "owner.h"

int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

static int want_cached, ours, rdma_core_new = 1; /* shadow MRs; the preload's functions */

/* rdma-core's struct ibv_mr_init_attr (Debian 12's headers lack it), up to addr. */
struct mr_init_attr {
	size_t length;
	int access;
	uint64_t comp_mask;
	uint64_t iova;
	void *addr;
	int fd;
	uint64_t fd_offset;
	void *dmah;
	void *buf;
};
#define MASK_ADDR (1u << 1)

/* NCCL's table (struct ncclIbvSymbols), as far as this test uses it. */
static struct {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
	int (*dereg_mr)(struct ibv_mr *);
	int (*rereg_mr)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
	/* plain dlsym */
	struct ibv_mr *(*reg_mr_dlsym)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr_dlsym)(struct ibv_mr *);
	/* IBVERBS_1.0 and today's nodes */
	struct ibv_mr *(*reg_mr_1_0)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_mr_ex)(struct ibv_pd *, struct mr_init_attr *);
} v;

static uint64_t (*fcount)(const char *);
static int (*fis_mr)(const struct ibv_mr *);


static bool resolve(void *h)
{
#define VSYM(field, name, version) (*(void **)&v.field = dlvsym(h, name, version))
#define SYM(field, name) (*(void **)&v.field = dlsym(h, name))
	VSYM(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
	VSYM(free_device_list, "ibv_free_device_list", "IBVERBS_1.1");
	VSYM(open_device, "ibv_open_device", "IBVERBS_1.1");
	VSYM(close_device, "ibv_close_device", "IBVERBS_1.1");
	VSYM(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
	VSYM(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
	VSYM(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
	VSYM(reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8");
	VSYM(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
	VSYM(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
	VSYM(rereg_mr, "ibv_rereg_mr", "IBVERBS_1.1");
	SYM(reg_mr_dlsym, "ibv_reg_mr");
	SYM(dereg_mr_dlsym, "ibv_dereg_mr");
	VSYM(reg_mr_1_0, "ibv_reg_mr", "IBVERBS_1.0");
	VSYM(reg_mr_ex, "ibv_reg_mr_ex", "IBVERBS_1.15");
	*(void **)&fcount = dlsym(h, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(h, "fake_ibv_is_mr");
#undef VSYM
#undef SYM
	return v.get_device_list && v.open_device && v.alloc_pd && v.reg_mr && v.dereg_mr &&
	       v.reg_mr_iova2 && v.reg_dmabuf_mr && v.reg_mr_dlsym && v.dereg_mr_dlsym &&
	       v.reg_mr_1_0 && fcount && fis_mr;
}

static void check_owners(const char *lib)
{
	char reg = ours ? 'p' : 'v';

	CHECK(owner((void *)v.reg_mr) == reg && owner((void *)v.reg_mr_iova2) == reg &&
	      owner((void *)v.reg_dmabuf_mr) == reg && owner((void *)v.dereg_mr) == reg &&
	      owner((void *)v.rereg_mr) == reg && owner((void *)v.dealloc_pd) == reg &&
	      owner((void *)v.close_device) == reg,
	      "%s: dlvsym at NCCL's versions gives %s registration functions", lib,
	      ours ? "the preload's" : "libibverbs' own");
	CHECK(owner((void *)v.reg_mr_dlsym) == reg && owner((void *)v.dereg_mr_dlsym) == reg &&
	      v.reg_mr_dlsym == v.reg_mr && v.dereg_mr_dlsym == v.dereg_mr,
	      "%s: dlsym gives the same (the default version, IBVERBS_1.1)", lib);
	CHECK(owner((void *)v.reg_mr_1_0) == reg && (void *)v.reg_mr_1_0 != (void *)v.reg_mr,
	      "%s: ibv_reg_mr@IBVERBS_1.0 is %s 1.0 function, not the 1.1 one", lib,
	      ours ? "the preload's" : "libibverbs'");
	CHECK(owner((void *)v.open_device) == 'v' && owner((void *)v.alloc_pd) == 'v' &&
	      owner((void *)v.get_device_list) == 'v',
	      "%s: functions the preload does not interpose stay libibverbs'", lib);
}

static void check_new_nodes(const char *lib, struct ibv_pd *pd, char *gpu)
{
	struct mr_init_attr a = { .length = 4096, .access = IBV_ACCESS_LOCAL_WRITE,
				  .comp_mask = MASK_ADDR, .addr = gpu };
	void *d, *dv;
	struct ibv_mr *mr;
	uint64_t reg0;

	dlerror();
	d = dlsym(RTLD_DEFAULT, "ibv_reg_mr_ex");
	dv = dlvsym(RTLD_DEFAULT, "ibv_reg_mr_ex", "IBVERBS_1.15");
	if (!rdma_core_new) {
		CHECK(!v.reg_mr_ex, "%s: rdma-core 44 has no ibv_reg_mr_ex@IBVERBS_1.15 in the handle",
		      lib);
		CHECK(!d && !dv && dlerror(), "%s: nor in the global scope (%p, %p): the preload's "
		      "stand-in is not handed out", lib, d, dv);
		return;
	}
	CHECK(owner((void *)v.reg_mr_ex) == (ours ? 'p' : 'v'),
	      "%s: ibv_reg_mr_ex@IBVERBS_1.15 is %s", lib, ours ? "the preload's" : "libibverbs'");
	/* without the preload libibverbs, dlopened RTLD_LOCAL, is not in the global scope */
	CHECK(!ours || (owner(d) == 'p' && owner(dv) == 'p'),
	      "%s: and so it is in the global scope", lib);
	if (!v.reg_mr_ex)
		return;
	reg0 = fcount("reg");
	mr = v.reg_mr_ex(pd, &a);
	CHECK(mr && mr->addr == gpu && mr->length == 4096 &&
	      (want_cached ? !fis_mr(mr) && fcount("reg") == reg0 : fis_mr(mr) != 0),
	      "%s: ibv_reg_mr_ex of a GPU buffer: %s", lib,
	      want_cached ? "a shadow of the cached MR (a hit)" : "libibverbs' MR");
	CHECK(mr && v.dereg_mr(mr) == 0, "%s: and its release", lib);
}

static void run(const char *lib)
{
	struct ibv_device **l;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *a, *b, *c, *hmr, *dmr;
	uint64_t g = 0, reg0, bad0;
	char *host = malloc(8192), *gpu;
	void *h = dlopen(lib, RTLD_NOW);

	if (!h || !resolve(h)) {
		CHECK(0, "%s: dlopen and dlvsym (%s)", lib, h ? "missing symbols" : dlerror());
		free(host);
		return;
	}
	check_owners(lib);
	l = v.get_device_list(NULL);
	ctx = l && l[0] ? v.open_device(l[0]) : NULL;
	v.free_device_list(l);
	pd = ctx ? v.alloc_pd(ctx) : NULL;
	cuMemAlloc_v2(&g, 65536);
	gpu = (char *)(uintptr_t)g;
	if (!pd || !gpu || !host) {
		CHECK(0, "%s: setup", lib);
		return;
	}
	reg0 = fcount("reg");
	bad0 = fcount("dereg_bad");
	a = v.reg_mr(pd, gpu, 4096, IBV_ACCESS_LOCAL_WRITE);
	b = v.reg_mr_dlsym(pd, gpu + 8192, 4096, IBV_ACCESS_LOCAL_WRITE);
	c = v.reg_mr_iova2(pd, gpu, 4096, (uintptr_t)gpu,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (want_cached) {
		CHECK(a && b && c && !fis_mr(a) && !fis_mr(b) && !fis_mr(c) &&
		      fcount("reg") == reg0 + 2 && a->lkey == b->lkey && a->lkey != c->lkey,
		      "%s: GPU buffers: shadow MRs, one cached MR per access (%llu registrations)",
		      lib, (unsigned long long)(fcount("reg") - reg0));
	} else {
		CHECK(a && b && c && fis_mr(a) && fis_mr(b) && fis_mr(c) && fcount("reg") == reg0 + 3,
		      "%s: GPU buffers: libibverbs' own MRs, one registration each", lib);
	}
	CHECK(a && a->addr == gpu && a->length == 4096 && a->pd == pd && c && c->addr == gpu,
	      "%s: the MRs carry the caller's addr, length and pd", lib);
	hmr = v.reg_mr(pd, host, 8192, IBV_ACCESS_LOCAL_WRITE);
	CHECK(hmr && fis_mr(hmr), "%s: host memory: libibverbs' own MR either way", lib);
	dmr = v.reg_dmabuf_mr(pd, 0, 4096, 0x20000, 0, IBV_ACCESS_LOCAL_WRITE);
	CHECK(dmr && fis_mr(dmr), "%s: ibv_reg_dmabuf_mr@IBVERBS_1.12: libibverbs' MR", lib);
	check_new_nodes(lib, pd, gpu);
	CHECK(v.dereg_mr(a) == 0 && v.dereg_mr_dlsym(b) == 0 && v.dereg_mr(c) == 0 &&
	      v.dereg_mr(hmr) == 0 && v.dereg_mr(dmr) == 0 && fcount("dereg_bad") == bad0,
	      "%s: every release returns 0; no shadow reached libibverbs' ibv_dereg_mr", lib);
	a = v.reg_mr_1_0(pd, gpu, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(a && (want_cached ? !fis_mr(a) : fis_mr(a) != 0) && v.dereg_mr(a) == 0,
	      "%s: ibv_reg_mr@IBVERBS_1.0, through libibverbs' 1.0 layer: %s", lib,
	      want_cached ? "cached as well" : "libibverbs' MR");
	CHECK(v.dealloc_pd(pd) == 0, "%s: ibv_dealloc_pd: 0 (the cache released its MRs first)", lib);
	CHECK(v.close_device(ctx) == 0, "%s: ibv_close_device: 0", lib);
	cuMemFree_v2(g);
	free(host);
	dlclose(h);
}

int main(int argc, char **argv)
{
	int i = 1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 4 || strcmp(argv[1], "--expect")) {
		fprintf(stderr, "usage: dl_prog --expect cached|disabled|direct [--rdma-core 44|new] "
			"LIB...\n");
		return 2;
	}
	want_cached = !strcmp(argv[2], "cached");
	ours = want_cached || !strcmp(argv[2], "disabled");
	i = 3;
	if (!strcmp(argv[i], "--rdma-core") && i + 2 < argc) {
		rdma_core_new = strcmp(argv[i + 1], "44") != 0;
		i += 2;
	}
	if (cuInit(0)) {
		printf("not ok - the fake CUDA driver did not start\n");
		return 1;
	}
	for (; i < argc; i++)
		run(argv[i]);
	printf("dl_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
