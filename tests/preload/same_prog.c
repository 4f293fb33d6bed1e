/* SPDX-License-Identifier: MIT */
/*
 * A verbs program whose every call on GPU and host memory ends the same with and without the
 * preload, including the ones that fail: it prints each call's outcome (result, errno) on stdout
 * and nothing else, and preload_test.sh runs it both ways and requires the same stdout AND the
 * same stderr (a program's stderr is its own: the preload and the library print nothing for these
 * calls unless GDRCACHE_LOG asks them to). Cases: registrations the NIC refuses (the cache's own
 * registration fails first), ibv_dealloc_pd with an MR still held (EBUSY), ibv_close_device with an
 * MR held, ibv_rereg_mr of a registration with flags 0 and against a provider without rereg (rxe,
 * siw: IBV_REREG_MR_ERR_CMD, EOPNOTSUPP).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "open_ctx.h"

int cuInit(unsigned int flags);
int cuMemAlloc_v2(uint64_t *p, size_t size);
int cuMemFree_v2(uint64_t p);

static void out(const char *what, long rc, int err)
{
	const char *e = strerrorname_np(err);

	printf("%s: %ld%s%s\n", what, rc, rc ? " " : "", rc ? (e ? e : "?") : "");
}

static void reg(const char *what, struct ibv_pd *pd, void *addr, size_t len, int access,
		struct ibv_mr **keep)
{
	struct ibv_mr *mr;

	errno = 0;
	mr = ibv_reg_mr(pd, addr, len, access);
	out(what, mr ? 0 : -1, errno);
	if (keep)
		*keep = mr;
	else if (mr)
		out("  its ibv_dereg_mr", ibv_dereg_mr(mr), 0);
}

static void rereg(const char *what, struct ibv_mr *mr, int flags, void *addr, size_t len,
		  int access)
{
	int rc;

	errno = 0;
	rc = ibv_rereg_mr(mr, flags, NULL, addr, len, access);
	out(what, rc, rc ? errno : 0);
}

int main(void)
{
	void (*set_rereg)(int);
	struct ibv_context *ctx, *ctx2;
	struct ibv_pd *pd, *pd2;
	struct ibv_mr *held, *g, *h;
	uint64_t d1 = 0, d2 = 0;
	char *gpu, *gpu2, *host = malloc(8192);
	const int lw = IBV_ACCESS_LOCAL_WRITE;

	setvbuf(stdout, NULL, _IOLBF, 0);
	*(void **)&set_rereg = dlsym(RTLD_DEFAULT, "fake_ibv_set_rereg");
	if (!set_rereg || cuInit(0) || cuMemAlloc_v2(&d1, 65536) || cuMemAlloc_v2(&d2, 65536) || !host) {
		printf("setup failed (the fake libibverbs and CUDA driver)\n");
		return 77;
	}
	gpu = (char *)(uintptr_t)d1;
	gpu2 = (char *)(uintptr_t)d2;
	ctx = open_ctx();
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		return 1;

	reg("gpu, local write", pd, gpu, 4096, lw, NULL);
	reg("gpu, remote write without local write", pd, gpu, 4096, IBV_ACCESS_REMOTE_WRITE, NULL);
	reg("gpu, atomic without local write", pd, gpu + 4096, 4096, IBV_ACCESS_REMOTE_ATOMIC, NULL);
	reg("host, remote write without local write", pd, host, 4096, IBV_ACCESS_REMOTE_WRITE, NULL);
	reg("gpu, length 0", pd, gpu, 0, lw, NULL);
	reg("host, local write", pd, host, 8192, lw, NULL);

	/* ibv_dealloc_pd with an MR held: EBUSY either way; released, it succeeds */
	pd2 = ibv_alloc_pd(ctx);
	reg("gpu on a second pd, held", pd2, gpu2, 4096, lw, &held);
	out("ibv_dealloc_pd with it held", ibv_dealloc_pd(pd2), 0);
	out("  its ibv_dereg_mr", held ? ibv_dereg_mr(held) : -1, 0);
	out("ibv_dealloc_pd after", ibv_dealloc_pd(pd2), 0);

	/* ibv_rereg_mr: what the provider answers */
	reg("gpu, held for rereg", pd, gpu, 4096, lw, &g);
	reg("host, held for rereg", pd, host, 4096, lw, &h);
	if (g && h) {
		rereg("rereg gpu, flags 0", g, 0, NULL, 0, 0);
		rereg("rereg host, flags 0", h, 0, NULL, 0, 0);
		rereg("rereg gpu, unknown flag", g, 0x100, NULL, 0, 0);
		rereg("rereg gpu, access without its flag", g, 0, NULL, 0, lw);
		rereg("rereg gpu, translation without a range", g, IBV_REREG_MR_CHANGE_TRANSLATION,
		      NULL, 0, 0);
		rereg("rereg gpu, access to remote write only", g, IBV_REREG_MR_CHANGE_ACCESS, NULL,
		      0, IBV_ACCESS_REMOTE_WRITE);
		rereg("rereg gpu, access", g, IBV_REREG_MR_CHANGE_ACCESS, NULL, 0,
		      lw | IBV_ACCESS_REMOTE_READ);
		set_rereg(0); /* from here on a provider without rereg, as rxe */
		rereg("no-rereg provider: rereg gpu, translation", g, IBV_REREG_MR_CHANGE_TRANSLATION,
		      gpu2, 4096, 0);
		rereg("no-rereg provider: rereg host, translation", h, IBV_REREG_MR_CHANGE_TRANSLATION,
		      host + 4096, 4096, 0);
		rereg("no-rereg provider: rereg gpu, access", g, IBV_REREG_MR_CHANGE_ACCESS, NULL, 0,
		      lw);
		rereg("no-rereg provider: rereg gpu, flags 0", g, 0, NULL, 0, 0);
		rereg("no-rereg provider: rereg gpu, unknown flag", g, 0x100, NULL, 0, 0);
		set_rereg(1);
		out("  gpu: its ibv_dereg_mr", ibv_dereg_mr(g), 0);
		out("  host: its ibv_dereg_mr", ibv_dereg_mr(h), 0);
	}

	/* ibv_close_device with an MR held on it: 0 either way */
	ctx2 = open_ctx();
	pd2 = ctx2 ? ibv_alloc_pd(ctx2) : NULL;
	reg("gpu on a second device, held", pd2, gpu2, 4096, lw, &held);
	out("ibv_close_device with it held", ibv_close_device(ctx2), 0);

	out("ibv_dealloc_pd", ibv_dealloc_pd(pd), 0);
	out("ibv_close_device", ibv_close_device(ctx), 0);
	cuMemFree_v2(d1);
	cuMemFree_v2(d2);
	free(host);
	return 0;
}
