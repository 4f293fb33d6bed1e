/* SPDX-License-Identifier: MIT */
/*
 * mem_monitor_rcache: the example rcache (rcache.h) at work. It allocates a few GPU buffers,
 * registers random ones through the rcache again and again (hits after the first), and every few
 * registrations frees a buffer and allocates another of the same size, which CUDA puts at the same
 * address: the rcache must learn of the free (libgdrcache's free events) and register the new buffer,
 * never hand out the old one's MR. Each registration's BUFFER_ID is checked against the driver's.
 *
 * With an RDMA device the rcache makes real MRs (-R picks the route: the pin's dma-buf, or
 * ibv_reg_mr on the GPU VA, which needs nvidia-peermem). Without one it runs pin only: pd NULL, the
 * pin from libgdrcache and a number of the rcache's for an MR, and says so.
 *
 * Usage: mem_monitor_rcache [-d device] [-R auto|dmabuf|va] [-n registrations] [-s size]
 *                           [-b buffers] [-r realloc_every]
 * Exit status: 0 every registration was of the live buffer, 1 one was stale, 2 setup failed,
 * 77 no GPU or no free events in this process.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrcache.h>

#include "rcache.h"

/* The CUDA driver, loaded at run time: the program builds without CUDA installed. */
typedef unsigned long long CUdeviceptr;
#define CU_POINTER_ATTRIBUTE_BUFFER_ID 7
static int (*cuInit)(unsigned);
static int (*cuDeviceGet)(int *, int);
static int (*cuDevicePrimaryCtxRetain)(void **, int);
static int (*cuCtxSetCurrent)(void *);
static int (*cuMemAlloc)(CUdeviceptr *, size_t);
static int (*cuMemFree)(CUdeviceptr);
static int (*cuPointerGetAttribute)(void *, int, CUdeviceptr);

static int load_cuda(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	void *ctx;
	int dev;

	if (!h)
		return -1;
#define SYM(f, n) (*(void **)&f = dlsym(h, n))
	if (!SYM(cuInit, "cuInit") || !SYM(cuDeviceGet, "cuDeviceGet") ||
	    !SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
	    !SYM(cuCtxSetCurrent, "cuCtxSetCurrent") || !SYM(cuMemAlloc, "cuMemAlloc_v2") ||
	    !SYM(cuMemFree, "cuMemFree_v2") || !SYM(cuPointerGetAttribute, "cuPointerGetAttribute"))
		return -1;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
	    cuCtxSetCurrent(ctx))
		return -1;
	return 0;
}

static uint64_t buffer_id(CUdeviceptr p)
{
	unsigned long long id = 0;

	return cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) ? 0 : id;
}

/* The first RDMA device (or the one named) and a PD on it; NULL where there is none. */
static struct ibv_pd *open_pd(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && list[i] && !ctx; i++)
		if (!name || !strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	return ctx ? ibv_alloc_pd(ctx) : NULL;
}

int main(int argc, char **argv)
{
	const char *dev_name = NULL, *why;
	enum rcache_mr_route route = RCACHE_MR_AUTO;
	long n = 20000, nbuf = 8, realloc_every = 50;
	size_t size = 1 << 20;
	CUdeviceptr buf[64];
	struct gdr_cache *cache;
	struct rcache *rc;
	struct rcache_stats st;
	struct ibv_pd *pd;
	long stale = 0, reused = 0, reallocs = 0;
	int opt, ret;

	while ((opt = getopt(argc, argv, "d:R:n:s:b:r:")) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'R':
			route = !strcmp(optarg, "dmabuf") ? RCACHE_MR_DMABUF
				: !strcmp(optarg, "va")   ? RCACHE_MR_VA
							  : RCACHE_MR_AUTO;
			break;
		case 'n':
			n = atol(optarg);
			break;
		case 's':
			size = strtoull(optarg, NULL, 0);
			break;
		case 'b':
			nbuf = atol(optarg);
			break;
		case 'r':
			realloc_every = atol(optarg);
			break;
		default:
			fprintf(stderr, "usage: see the top of main.c\n");
			return 2;
		}
	}
	if (nbuf < 1 || nbuf > 64 || realloc_every < 1 || !size) {
		fprintf(stderr, "-b takes 1..64 buffers, -r and -s more than 0\n");
		return 2;
	}
	if (load_cuda()) {
		printf("SKIP: no CUDA driver or GPU\n");
		return 77;
	}
	ret = gdr_mem_events_state(&why);
	if (ret) {
		/* Such a process would validate each hit by BUFFER_ID itself instead. */
		printf("SKIP: no free events in this process (%s): %s\n", strerror(-ret), why);
		return 77;
	}
	pd = open_pd(dev_name);
	if (pd)
		printf("RDMA device %s: the rcache makes MRs (route %s)\n",
		       ibv_get_device_name(pd->context->device),
		       route == RCACHE_MR_DMABUF ? "dma-buf"
		       : route == RCACHE_MR_VA   ? "GPU VA"
						 : "auto");
	else
		printf("no RDMA device: pin-only mode (pd NULL; an entry's MR id is the rcache's number)\n");

	ret = gdr_cache_create(NULL, &cache);
	if (ret == 0)
		ret = rcache_create(&(struct rcache_params){ .cache = cache, .route = route }, &rc);
	if (ret) {
		fprintf(stderr, "cache or rcache: %s\n", strerror(-ret));
		return 2;
	}
	for (long i = 0; i < nbuf; i++)
		if (cuMemAlloc(&buf[i], size)) {
			fprintf(stderr, "cuMemAlloc of %zu bytes failed\n", size);
			return 2;
		}

	srand(1);
	for (long i = 0; i < n; i++) {
		long k = rand() % nbuf;
		struct rcache_region *r;

		ret = rcache_get(rc, pd, (void *)(uintptr_t)buf[k], size,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, &r);
		if (ret) {
			fprintf(stderr, "rcache_get: %s\n", strerror(-ret));
			return 2;
		}
		if (r->buffer_id != buffer_id(buf[k])) {
			if (stale++ < 5)
				printf("STALE: buffer %ld at %#llx is BUFFER_ID %" PRIu64
				       ", the entry's %" PRIu64 "\n",
				       k, buf[k], buffer_id(buf[k]), r->buffer_id);
		}
		/* ... post RDMA work with r->mr here ... */
		rcache_put(r);

		if (i % realloc_every == realloc_every - 1) {
			CUdeviceptr old = buf[k];

			/* The rcache's callback drops the entry inside this free. */
			if (cuMemFree(buf[k]) || cuMemAlloc(&buf[k], size)) {
				fprintf(stderr, "free or reallocation failed\n");
				return 2;
			}
			reallocs++;
			reused += buf[k] == old;
		}
	}

	rcache_get_stats(rc, &st);
	printf("%ld registrations: %" PRIu64 " hits, %" PRIu64 " misses; %ld frees and "
	       "reallocations (%ld at the same address); %" PRIu64 " events, %" PRIu64
	       " entries invalidated, %" PRIu64 " deferred, %" PRIu64 " evicted, belt %" PRIu64
	       "; stale %ld\n",
	       n, st.hits, st.misses, reallocs, reused, st.events, st.invalidated, st.deferred,
	       st.evicted, st.belt, stale);
	for (long i = 0; i < nbuf; i++)
		cuMemFree(buf[i]);
	if (rcache_destroy(rc) || gdr_cache_destroy(cache))
		fprintf(stderr, "destroy failed\n");
	return stale ? 1 : 0;
}
