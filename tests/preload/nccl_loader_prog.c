/* SPDX-License-Identifier: MIT */
/*
 * A loader written the way NCCL's is (src/misc/ibvsymbols.cc, dynamic-loading mode): dlopen of the
 * path in an environment variable (NCCL_IBVERBS_LIB), else libibverbs.so, else libibverbs.so.1,
 * then one lookup per row of preload/nccl_verbs.h. nccl_loader_test.sh runs it with the variable
 * naming libgdrcache-preload.so (no LD_PRELOAD) and, for the baseline, unset or naming libibverbs.
 *
 * Per row: a REQUIRED row resolves; an OPTIONAL one resolves exactly when it does in libibverbs
 * itself (dlopened again by its soname, the same object the library's dependency tree holds);
 * through the preload, the entry points it defines are its own (dladdr), every other one is
 * libibverbs' definition (the address dlvsym gives on libibverbs' handle); through libibverbs
 * all are libibverbs'. Then, over the fake libibverbs (--device), the verbs are used: a device
 * opened and queried, a PD, host memory registered (libibverbs' own MR either way), a GPU buffer of
 * the fake CUDA driver registered (through the preload: a shadow of the cache's MR; else
 * libibverbs' MR), each released, the PD and the device closed.
 *
 * Usage: nccl_loader_prog --expect preload|libibverbs [--env NAME] [--dlsym] [--device fake|none]
 *   --expect  what the loader's handle must be
 *   --env     the variable that names the library (default NCCL_IBVERBS_LIB; UCCL: UCCL_IBV_SO)
 *   --dlsym   look up with dlsym (the default version), as UCCL does, instead of NCCL's dlvsym
 *   --device  fake (default): use the verbs over the fake libibverbs; none: resolution only (the
 *             real libibverbs, no device here)
 * Exit: 0 every check passed, 1 one failed, 2 usage.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nccl_table.h"
#include "owner.h"

int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

struct row {
	const char *name, *version;
	int kind;
	void *got; /* through the loader's handle */
	void *ref; /* through libibverbs.so.1's */
};

#define ROW(name, version, kind) { #name, version, kind, NULL, NULL },
static struct row rows[] = { GDRP_NCCL_VERBS(ROW) };
#undef ROW

/* NCCL's rows among the preload's entry points (libgdrcache-preload.map; preload_binding checks
 * its exports): through the preload, these are its own. */
static const char *const preload_defines[] = {
	"ibv_reg_mr",   "ibv_reg_mr_iova2", "ibv_reg_dmabuf_mr",
	"ibv_dereg_mr", "ibv_dealloc_pd",   "ibv_close_device",
};

static bool use_dlsym, via_preload;

/* NCCL's table, as far as this test uses it. */
static struct nccl_table v;

/* The fake libibverbs' counters (FAKE_IBVERBS), found through the loader's handle. */
static uint64_t (*fcount)(const char *);
static int (*fis_mr)(const struct ibv_mr *);


static bool preload_defines_row(const char *name)
{
	for (size_t i = 0; i < sizeof(preload_defines) / sizeof(preload_defines[0]); i++)
		if (!strcmp(preload_defines[i], name))
			return true;
	return false;
}

static void *lookup(void *h, const struct row *r)
{
	return use_dlsym ? dlsym(h, r->name) : dlvsym(h, r->name, r->version);
}

/* NCCL's order: the variable's path, then both names. */
static void *nccl_dlopen(const char *env, const char **opened)
{
	const char *libs[] = { getenv(env), "libibverbs.so", "libibverbs.so.1" };

	for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
		void *h = libs[i] ? dlopen(libs[i], RTLD_NOW) : NULL;

		if (h) {
			*opened = libs[i];
			return h;
		}
	}
	return NULL;
}

static void check_row(struct row *r)
{
	const char *at = use_dlsym ? "" : "@", *ver = use_dlsym ? "" : r->version;
	bool ours = via_preload && preload_defines_row(r->name);

	if (!r->got) {
		CHECK(r->kind == OPTIONAL && !r->ref && !ours, "%s%s%s: absent%s", r->name, at, ver,
		      r->kind == REQUIRED ? " (required: NCCL's loader would fail)"
		      : ours              ? " though the preload defines it"
		      : r->ref            ? " though libibverbs has it"
					  : ", as in libibverbs");
		return;
	}
	if (ours)
		CHECK(r->ref && owner(r->got) == 'p',
		      "%s%s%s: the preload's own (libibverbs %s it)", r->name, at, ver,
		      r->ref ? "has" : "lacks");
	else
		CHECK(r->got == r->ref && owner(r->got) == 'v', "%s%s%s: libibverbs' (%p, %p)",
		      r->name, at, ver, r->got, r->ref);
}

static void setup_table(void)
{
	NCCL_TABLE_FILL(v, rows, got);
}

/* The verbs at work over the fake libibverbs and the fake CUDA driver. */
static void use_verbs(void *h)
{
	struct ibv_device **l;
	struct ibv_context *ctx;
	struct ibv_device_attr dattr;
	struct ibv_port_attr pattr;
	union ibv_gid gid;
	struct ibv_pd *pd;
	struct ibv_mr *hmr, *gmr, *gmr2;
	char *host = malloc(8192), *gpu;
	uint64_t g = 0, reg0, bad0;

	*(void **)&fcount = dlsym(h, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(h, "fake_ibv_is_mr");
	setup_table();
	if (!fcount || !fis_mr || !v.get_device_list || !v.open_device || !v.alloc_pd ||
	    !v.reg_mr || !v.reg_mr_iova2 || !v.dereg_mr || !v.query_device || !v.query_port ||
	    !v.query_gid || !v.get_device_name || !v.event_type_str || !host) {
		CHECK(0, "the verbs used below and the fake's counters, through the handle");
		free(host);
		return;
	}
	l = v.get_device_list(NULL);
	ctx = l && l[0] ? v.open_device(l[0]) : NULL;
	CHECK(ctx && !strcmp(v.get_device_name(l[0]), "fake0"), "a device listed and opened");
	v.free_device_list(l);
	if (!ctx) {
		free(host);
		return;
	}
	CHECK(v.query_device(ctx, &dattr) == 0 && dattr.phys_port_cnt == 1 &&
		      v.query_port(ctx, 1, &pattr) == 0 && pattr.state == IBV_PORT_ACTIVE &&
		      v.query_gid(ctx, 1, 0, &gid) == 0 && v.event_type_str(IBV_EVENT_PORT_ACTIVE),
	      "ibv_query_device, _port, _gid, ibv_event_type_str: the fake's answers");
	pd = v.alloc_pd(ctx);
	cuMemAlloc_v2(&g, 65536);
	gpu = (char *)(uintptr_t)g;
	CHECK(pd && gpu, "a PD, and a GPU buffer of the fake CUDA driver");
	if (!pd || !gpu) {
		free(host);
		return;
	}
	reg0 = fcount("reg");
	bad0 = fcount("dereg_bad");
	hmr = v.reg_mr(pd, host, 8192, IBV_ACCESS_LOCAL_WRITE);
	CHECK(hmr && fis_mr(hmr) && hmr->addr == host && hmr->length == 8192 && hmr->pd == pd &&
		      fcount("reg") == reg0 + 1,
	      "host memory: libibverbs' own MR, one registration");
	gmr = v.reg_mr(pd, gpu, 4096, IBV_ACCESS_LOCAL_WRITE);
	gmr2 = v.reg_mr_iova2(pd, gpu, 4096, (uintptr_t)gpu, IBV_ACCESS_LOCAL_WRITE);
	if (via_preload)
		CHECK(gmr && gmr2 && !fis_mr(gmr) && !fis_mr(gmr2) && gmr->lkey == gmr2->lkey &&
			      gmr->addr == gpu && fcount("reg") == reg0 + 2,
		      "GPU buffer, ibv_reg_mr and ibv_reg_mr_iova2: shadows of one cached MR");
	else
		CHECK(gmr && gmr2 && fis_mr(gmr) && fis_mr(gmr2) && fcount("reg") == reg0 + 3,
		      "GPU buffer, ibv_reg_mr and ibv_reg_mr_iova2: libibverbs' own MRs");
	CHECK(hmr && v.dereg_mr(hmr) == 0 && gmr && v.dereg_mr(gmr) == 0 && gmr2 &&
		      v.dereg_mr(gmr2) == 0 && fcount("dereg_bad") == bad0,
	      "every release returns 0; no shadow reached libibverbs' ibv_dereg_mr");
	CHECK(v.dealloc_pd(pd) == 0, "ibv_dealloc_pd: 0");
	CHECK(v.close_device(ctx) == 0, "ibv_close_device: 0");
	cuMemFree_v2(g);
	free(host);
}

static int usage(void)
{
	fprintf(stderr,
		"usage: nccl_loader_prog --expect preload|libibverbs [--env NAME] [--dlsym] "
		"[--device fake|none]\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *env = "NCCL_IBVERBS_LIB", *opened = NULL, *expect = NULL;
	bool device = true;
	struct link_map *lm = NULL;
	void *h, *ref;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--expect") && i + 1 < argc)
			expect = argv[++i];
		else if (!strcmp(argv[i], "--env") && i + 1 < argc)
			env = argv[++i];
		else if (!strcmp(argv[i], "--dlsym"))
			use_dlsym = true;
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = strcmp(argv[++i], "none") != 0;
		else
			return usage();
	}
	if (!expect || (strcmp(expect, "preload") && strcmp(expect, "libibverbs")))
		return usage();
	via_preload = !strcmp(expect, "preload");
	if (device && cuInit(0)) {
		printf("not ok - the fake CUDA driver did not start\n");
		return 1;
	}

	h = nccl_dlopen(env, &opened);
	ref = dlopen("libibverbs.so.1", RTLD_NOW);
	if (h)
		dlinfo(h, RTLD_DI_LINKMAP, &lm);
	CHECK(h && lm && strstr(lm->l_name, via_preload ? "libgdrcache-preload" : "libibverbs"),
	      "%s=%s: the loader opened %s (%s)", env, getenv(env) ? getenv(env) : "(unset)",
	      opened ? opened : "nothing", lm ? lm->l_name : dlerror());
	CHECK(ref != NULL, "libibverbs.so.1 opened for reference");
	if (!h || !ref)
		return 1;
	for (unsigned i = 0; i < R_N; i++) {
		rows[i].got = lookup(h, &rows[i]);
		rows[i].ref = lookup(ref, &rows[i]);
		check_row(&rows[i]);
	}
	if (device)
		use_verbs(h);
	dlclose(ref);
	dlclose(h);
	printf("nccl_loader_prog: %d failed\n", failures);
	return failures ? 1 : 0;
}
