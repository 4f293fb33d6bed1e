/* SPDX-License-Identifier: MIT */
/*
 * The registrations 2026's stacks make, timed (issue 36), on the real CUDA driver over the fake
 * libibverbs of tests/preload (the GPU machines have no NIC): bench/run-gpu.sh dmabuf runs it
 * with LD_PRELOAD=libgdrcache-preload.so and without, side by side.
 *   nccl  NCCL's registration of a buffer (src/transport/net_ib): cuMemGetHandleForAddressRange
 *         (DMA_BUF_FD) of its pages, ibv_reg_dmabuf_mr(offset, iova = its address, a fresh fd),
 *         close(fd); ibv_dereg_mr after the transfer (a per-transfer engine's shape). NBUF buffers
 *         of 4 MiB in turn, ROUNDS rounds. Each step's median and mean ns.
 *   sub   NIXL's shape: K tensors, sub-ranges of one allocation, each registered once
 *         (ibv_reg_mr of its address, and again by dma-buf as above), then all released:
 *         the time for the K, and the real registrations the fake libibverbs made for them.
 * Every registration is checked: the MR is there, answers for the caller's offset and length,
 * the memory at its iova is still the buffer's (BUFFER_ID), and the NIC MR behind its keys is of
 * exactly its range. The fake libibverbs' own registration costs almost
 * nothing (a NIC's is tens of microseconds to milliseconds), so what the preload saves shows as
 * the real registrations it did not make; what it costs shows as its time.
 * Figures, not verdicts: not a test.
 *   free  (not timed) a cached dma-buf MR's memory freed and allocated again: the old dma-buf,
 *         still open, passes through; the new memory's is cached. Under the preload only.
 * Usage: bench_dmabuf nccl [ROUNDS] | sub [K] | free   (default 200 rounds, 1000 tensors); one a
 * process, so that GDRCACHE_STATS=1 tells each one's pins. Needs a GPU; exits 77 without one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hit_cuda.h"
#include "machine.h"

#define NBUF 16
#define BUFSZ (4u << 20)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_pd *pd;
static uint64_t (*fcount)(const char *);
static int (*fis_mr)(const struct ibv_mr *);
static int (*fmr_by_lkey)(uint32_t, uint64_t *, uint64_t *, int *);
static long bad;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void report(const char *what, double *v, int n)
{
	double sum = 0;

	for (int i = 0; i < n; i++)
		sum += v[i];
	qsort(v, (size_t)n, sizeof(*v), cmp);
	printf("  %-28s median %9.0f ns   mean %9.0f ns\n", what, v[n / 2], sum / n);
}

static bool shadow(const struct ibv_mr *mr)
{
	return mr && !fis_mr(mr);
}

/* One registration checked (outside the timed steps): the MR answers for the caller's offset and
 * length, the memory at iova is still the buffer (BUFFER_ID), and the NIC registration behind it
 * (found by its lkey in the fake libibverbs) is of exactly [iova, iova + len): remote access gets
 * keys bounded to the request. */
static void check(struct ibv_mr *mr, uint64_t offset, size_t len, hc_ptr iova, uint64_t id)
{
	uint64_t riova = 0, rlen = 0;
	int raccess = 0;

	if (!mr || mr->length != len || (uint64_t)(uintptr_t)mr->addr != offset ||
	    hc_buffer_id(iova) != id || fmr_by_lkey(mr->lkey, &riova, &rlen, &raccess) ||
	    riova != iova || rlen != len || raccess != ACCESS) {
		if (!bad++)
			printf("wrong: mr %p length %zu addr %p (want %zu, %#llx), buffer id %llu/%llu, "
			       "NIC MR %#llx+%llu\n",
			       (void *)mr, mr ? mr->length : 0, mr ? mr->addr : NULL, len,
			       (unsigned long long)offset, (unsigned long long)hc_buffer_id(iova),
			       (unsigned long long)id, (unsigned long long)riova,
			       (unsigned long long)rlen);
	}
}

static int export(hc_ptr base, size_t size)
{
	int fd = -1;

	return hc.cuMemGetHandleForAddressRange(&fd, base, size, HC_DMA_BUF_FD, 0) ? -1 : fd;
}

static void bench_nccl(int rounds)
{
	int n = rounds * NBUF, k = 0, shadows = 0;
	double *t[4], t0, t1, t2, t3, t4;
	hc_ptr buf[NBUF];
	uint64_t id[NBUF], reg0 = fcount("reg");

	for (int i = 0; i < 4; i++)
		t[i] = calloc((size_t)n, sizeof(double));
	for (int b = 0; b < NBUF; b++) {
		if (hc.cuMemAlloc(&buf[b], BUFSZ)) {
			printf("nccl: cuMemAlloc failed\n");
			exit(1);
		}
		id[b] = hc_buffer_id(buf[b]);
	}
	for (int r = 0; r < rounds; r++) {
		for (int b = 0; b < NBUF; b++, k++) {
			/* a tensor 1000 bytes into the buffer: its pages exported, as NCCL does */
			hc_ptr addr = buf[b] + 1000, base = addr & ~4095ull;
			size_t len = BUFSZ - 8192, size = (addr + len - base + 4095) & ~4095ull;
			struct ibv_mr *mr;
			int fd;

			t0 = now();
			fd = export(base, size);
			t1 = now();
			mr = ibv_reg_dmabuf_mr(pd, addr - base, len, addr, fd, ACCESS);
			t2 = now();
			close(fd);
			t3 = now();
			check(mr, addr - base, len, addr, id[b]);
			shadows += shadow(mr);
			t4 = now();
			if (mr)
				ibv_dereg_mr(mr);
			t[0][k] = t1 - t0;
			t[1][k] = t2 - t1;
			t[2][k] = t3 - t2;
			t[3][k] = now() - t4;
		}
	}
	printf("nccl: %d buffers of %u MiB x %d rounds: %d registrations, %d served by the cache, "
	       "%llu NIC registrations\n",
	       NBUF, BUFSZ >> 20, rounds, n, shadows,
	       (unsigned long long)(fcount("reg") - reg0));
	report("cuMemGetHandleForAddressRange", t[0], n);
	report("ibv_reg_dmabuf_mr", t[1], n);
	report("close(fd)", t[2], n);
	report("ibv_dereg_mr", t[3], n);
	for (int i = 0; i < 4; i++)
		free(t[i]);
	for (int b = 0; b < NBUF; b++)
		hc.cuMemFree(buf[b]);
}

static void bench_sub(int k, bool dmabuf)
{
	size_t total = 1ull << 30, each = total / (size_t)k & ~255ull;
	struct ibv_mr **mr = calloc((size_t)k, sizeof(*mr));
	uint64_t reg0, id;
	double t0, treg, tdereg = 0;
	int shadows = 0;
	hc_ptr a;

	if (hc.cuMemAlloc(&a, total)) {
		printf("sub: cuMemAlloc(1 GiB) failed\n");
		exit(1);
	}
	id = hc_buffer_id(a);
	reg0 = fcount("reg");
	t0 = now();
	for (int i = 0; i < k; i++) {
		hc_ptr addr = a + (size_t)i * each;

		if (dmabuf) {
			hc_ptr base = addr & ~4095ull;
			int fd = export(base, (addr + each - base + 4095) & ~4095ull);

			mr[i] = ibv_reg_dmabuf_mr(pd, addr - base, each, addr, fd, ACCESS);
			close(fd);
		} else {
			mr[i] = ibv_reg_mr(pd, (void *)(uintptr_t)addr, each, ACCESS);
		}
	}
	treg = now() - t0;
	for (int i = 0; i < k; i++) {
		hc_ptr addr = a + (size_t)i * each;

		shadows += shadow(mr[i]);
		check(mr[i], dmabuf ? addr - (addr & ~4095ull) : addr, each, addr, id);
	}
	printf("sub: %5d tensors of %7zu bytes in 1 GiB, %-17s %8.2f ms (%6.2f us each), "
	       "%d cached, %llu NIC registrations\n",
	       k, each, dmabuf ? "by dma-buf:" : "by ibv_reg_mr:", treg / 1e6, treg / 1e3 / k,
	       shadows, (unsigned long long)(fcount("reg") - reg0));
	t0 = now();
	for (int i = 0; i < k; i++)
		if (mr[i])
			ibv_dereg_mr(mr[i]);
	tdereg = now() - t0;
	printf("     released in %.2f ms\n", tdereg / 1e6);
	free(mr);
	hc.cuMemFree(a);
}

/* The real driver's side of the free: a dma-buf MR cached, its memory freed and allocated again
 * (at the same address, where the driver reuses it), the old dma-buf still open: registering it
 * must pass through (it holds the freed memory, not what the address now is), the new memory's
 * own dma-buf is served by the cache. Not timed. */
static void check_free(void)
{
	hc_ptr a = 0, b = 0;
	int fd, held, fd2;
	struct ibv_mr *m;

	if (hc.cuMemAlloc(&a, BUFSZ))
		exit(1);
	fd = export(a, 65536);
	held = export(a, 65536);
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, a, fd, ACCESS);
	close(fd);
	printf("free: a dma-buf MR of a buffer: %s\n", shadow(m) ? "cached" : "NOT cached");
	bad += !shadow(m);
	if (m)
		ibv_dereg_mr(m);
	hc.cuMemFree(a);
	if (hc.cuMemAlloc(&b, BUFSZ))
		exit(1);
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, a, held, ACCESS);
	printf("free: an open dma-buf of the freed buffer (address %s): %s\n",
	       b == a ? "reused" : "not reused", m && !shadow(m) ? "passed through" : "WRONG");
	bad += !m || shadow(m);
	if (m)
		ibv_dereg_mr(m);
	close(held);
	fd2 = export(b, 65536);
	m = ibv_reg_dmabuf_mr(pd, 0, 65536, b, fd2, ACCESS);
	close(fd2);
	printf("free: the new buffer's own dma-buf: %s\n", shadow(m) ? "cached" : "NOT cached");
	bad += !shadow(m);
	if (m)
		check(m, 0, 65536, b, hc_buffer_id(b)), ibv_dereg_mr(m);
	hc.cuMemFree(b);
}

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "nccl";
	int n = argc > 2 ? atoi(argv[2]) : 0;
	struct ibv_device **l;
	struct ibv_context *ctx;
	char why[256], cpu[128];

	setvbuf(stdout, NULL, _IOLBF, 0);
	*(void **)&fcount = dlsym(RTLD_DEFAULT, "fake_ibv_count");
	*(void **)&fis_mr = dlsym(RTLD_DEFAULT, "fake_ibv_is_mr");
	*(void **)&fmr_by_lkey = dlsym(RTLD_DEFAULT, "fake_ibv_mr_by_lkey");
	if (!fcount || !fis_mr || !fmr_by_lkey) {
		printf("bench_dmabuf: run over the fake libibverbs (LD_LIBRARY_PATH)\n");
		return 2;
	}
	if (hc_load(why, sizeof(why))) {
		printf("bench_dmabuf: %s: nothing to measure\n", why);
		return 77;
	}
	bench_cpu_model(cpu, sizeof(cpu));
	printf("machine: %s, CUDA %d, driver %s; CPU %s\n", hc.gpu, hc.cuda_version, hc.driver,
	       cpu);
	printf("preload: %s\n", dlsym(RTLD_DEFAULT, "gdr_private_dmabuf_range")
					? "libgdrcache-preload.so (LD_PRELOAD)"
					: "none: libibverbs (fake) directly");
	l = ibv_get_device_list(NULL);
	ctx = l && l[0] ? ibv_open_device(l[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		printf("bench_dmabuf: no device\n");
		return 1;
	}
	/* NCCL's probe of dma-buf support, as it makes it before its first registration */
	(void)ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
	if (!strcmp(what, "nccl")) {
		bench_nccl(n > 0 ? n : 200);
	} else if (!strcmp(what, "free")) {
		check_free();
	} else if (!strcmp(what, "sub")) {
		bench_sub(n > 0 ? n : 1000, false);
		bench_sub(n > 0 ? n : 1000, true);
	} else {
		printf("usage: bench_dmabuf nccl [ROUNDS] | sub [K] | free\n");
		return 2;
	}
	printf("checked: %ld registrations wrong\n", bad);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	return bad ? 1 : 0;
}
